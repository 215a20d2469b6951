"""RecurrentPPO on CartPoleNoVel-v1 (or PendulumNoVel-v1): rlspeed against sb3-contrib's RecurrentPPO, seeds
interleaved.

(a) Throughput: env steps per second of training at identical hyperparameters, RL-Zoo's ppo_lstm CartPoleNoVel-v1
    settings (rl_zoo3 2.9.2): 8 envs x 32 steps, batch 256 (the whole rollout), 20 epochs, gamma 0.98, gae_lambda
    0.8, lr and clip range linear from 1e-3 and 0.2, ent_coef 0, observation and reward normalisation, an LSTM of 64
    for the actor and another for the critic, then one ReLU layer of 64 each. Gymnasium envs for both (rlspeed
    env_backend="gymnasium", sb3-contrib DummyVecEnv + VecNormalize), plus rlspeed on its device-native env.
(b) Time to target: training seconds until a deterministic 10-episode evaluation on a separate env reaches a mean
    return of 475, both at the settings above (rlspeed's shipped preset is the same but for ortho_init, which it
    leaves at rlspeed's orthogonal initialisation), evaluated every `eval_freq` env steps, evaluation time excluded
    from the training clock of both.

`--env PendulumNoVel-v1`: part (a), and with `--learning` part (c) (the return after a fixed budget) in place of (b),
at RL-Zoo's ppo_lstm PendulumNoVel-v1 settings: 4 envs x 1024 steps, batch 128 (sb3-contrib's default, rlspeed's
too), 10 epochs, gamma 0.9, gae_lambda 0.95, lr 1e-3 and clip range 0.2 constant, ent_coef 0, gSDE resampled every 4
steps, ortho_init off, the same LSTMs and ReLU layers, VecNormalize. rlspeed takes `--preset zoo`'s translation of
that entry (`rlspeed.presets.zoo.translate`, which reads rl_zoo3's file); sb3-contrib the entry's values. It writes
its own section (`recurrent_ppo_pendulum`) and results/recurrent_ppo_pendulum.json.

`--env PendulumNoVel-v1 --learning`: (c) learning instead of (a). Each side trains `--budget` env steps (default
102,400 = 25 rollouts of 4 x 1,024) at the settings above, with a deterministic 10-episode evaluation on a separate
env (seeded apart, observations normalised with the training run's statistics, frozen; raw returns) at the first
rollout boundary at or past half the budget and at the end, for each seed; every (side, seed) run in a fresh process,
`--jobs` of them at once (sb3-contrib's first: they are the slow ones). It writes its own section
(`recurrent_ppo_pendulum_learning`) and results/recurrent_ppo_pendulum_learning.json.

Both libraries train on the same task: rlspeed's `CartPoleNoVel-v1` / `PendulumNoVel-v1` registration (RL-Zoo's
velocity masks), so rl_zoo3's envs are not imported. torch.set_num_threads(--threads, default 1) for every run. Only
`learn` is timed. Usage: python benchmarks/recurrent_ppo.py [--env ID] [--quick] [--seeds N] [--skip-sb3] ...
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import common

from rlspeed.algos.recurrent_ppo import RecurrentPPO  # importing rlspeed registers CartPoleNoVel-v1
from rlspeed.presets import load_preset, split_run_settings, zoo

ENV_ID = "CartPoleNoVel-v1"
PENDULUM_ID = "PendulumNoVel-v1"
TARGET_RETURN = 475.0
EVAL_EPISODES = 10
EVAL_SEED_OFFSET = 100_000  # the SB3 side's evaluation env is made with seed + this; each evaluation then reseeds it
# with the seed rlspeed's learn evaluates on at that step (common.sb3_target_callback): both sides' episodes have
# the same seeds (the same episodes where rlspeed's side runs Gymnasium's envs)
NUM_ENVS = 8
GAMMA = 0.98

# RL-Zoo's ppo_lstm CartPoleNoVel-v1 hyperparameters in rlspeed's names (vf_coef 1.0 is SB3's 0.5: rlspeed's value
# loss is 0.5 * MSE).
ZOO_RLSPEED = dict(num_envs=NUM_ENVS, num_steps=32, batch_size=256, n_epochs=20, gamma=GAMMA, gae_lambda=0.8,
                   learning_rate=1e-3, anneal_lr=True, clip_range=0.2, anneal_clip=True, ent_coef=0.0, vf_coef=1.0,
                   lstm_hidden_size=64, net_arch=(64,), activation="relu", normalize_obs=True, normalize_reward=True,
                   ortho_init=False)

# sb3-contrib's arguments for each env: RL-Zoo's ppo_lstm entry (rl_zoo3 2.9.2), its schedules as callables
SB3_POLICY_KWARGS = dict(ortho_init=False, lstm_hidden_size=64, enable_critic_lstm=True,
                         net_arch=dict(pi=[64], vf=[64]))
PENDULUM_SB3 = dict(n_steps=1024, batch_size=128, n_epochs=10, gamma=0.9, gae_lambda=0.95, learning_rate=1e-3,
                    clip_range=0.2, ent_coef=0.0, use_sde=True, sde_sample_freq=4)
NUM_ENVS_OF = {ENV_ID: NUM_ENVS, PENDULUM_ID: 4}
SECTION_OF = {ENV_ID: "recurrent_ppo", PENDULUM_ID: "recurrent_ppo_pendulum"}  # README markers and results JSON
LEARNING_SECTION = "recurrent_ppo_pendulum_learning"
LEARNING_BUDGET = (102_400, 8192)  # (default, --quick): 25 rollouts of 4 x 1,024 steps, and 2
LEARNING_SIDES = ("sb3", "rlspeed")  # (the order the runs start in: sb3-contrib's are the slow ones)


def rlspeed_hyperparameters(env_id: str) -> tuple[dict, str]:
    """rlspeed's hyperparameters for `env_id`'s throughput runs and where they come from: CartPoleNoVel-v1's as
    written above, PendulumNoVel-v1's `--preset zoo`'s translation of RL-Zoo's entry (refused unless complete)."""
    if env_id == ENV_ID:
        return dict(ZOO_RLSPEED), "RL-Zoo's values in rlspeed's names (ZOO_RLSPEED)"
    translation = zoo.translate("recurrent_ppo", env_id)
    if translation.status != "full":
        raise SystemExit(f"RL-Zoo's {env_id} entry does not translate completely: {translation.unsupported}")
    return dict(translation.hyperparameters), f"--preset zoo: {translation.source}"


def sb3_arguments(env_id: str) -> dict:
    """sb3-contrib RecurrentPPO's keyword arguments at RL-Zoo's settings for `env_id`."""
    from torch import nn

    policy_kwargs = dict(SB3_POLICY_KWARGS, activation_fn=nn.ReLU)
    if env_id == PENDULUM_ID:
        return dict(PENDULUM_SB3, policy_kwargs=policy_kwargs)
    return dict(n_steps=32, batch_size=256, n_epochs=20, gamma=GAMMA, gae_lambda=0.8, learning_rate=linear(1e-3),
                clip_range=linear(0.2), ent_coef=0.0, policy_kwargs=policy_kwargs)


def linear(initial: float):
    """RL-Zoo's `lin_<value>` schedule: decays linearly from `initial` to 0 over training."""

    def schedule(progress_remaining: float) -> float:
        return progress_remaining * initial

    return schedule


def sb3_model(seed: int, env_id: str = ENV_ID):
    """sb3-contrib's RecurrentPPO at the RL-Zoo settings, on DummyVecEnv + VecNormalize (RL-Zoo's `normalize`, with
    the entry's gamma as RL-Zoo passes it)."""
    from sb3_contrib import RecurrentPPO as ContribRecurrentPPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    arguments = sb3_arguments(env_id)
    env = VecNormalize(make_vec_env(env_id, n_envs=NUM_ENVS_OF[env_id], seed=seed), gamma=arguments["gamma"])
    model = ContribRecurrentPPO("MlpLstmPolicy", env, device="cpu", seed=seed, **arguments)
    return model, env


# --- (a) throughput ----------------------------------------------------------------------------------------------
def rlspeed_throughput(seed: int, steps: int, backend: str, args) -> dict:
    model = RecurrentPPO(args.env, env_backend=backend, device=args.device, seed=seed, num_threads=args.threads,
                         **args.hyperparameters)
    model.make_training_env()  # built outside the timed region, like SB3's env
    started = time.perf_counter()
    model.learn(steps, progress_bar=False)
    learn_wall_s = time.perf_counter() - started
    return common.rlspeed_throughput_record(model, learn_wall_s)


def sb3_throughput(seed: int, steps: int, args) -> dict:
    model, env = sb3_model(seed, args.env)
    return common.sb3_throughput_record(model, env, steps, args.threads, library="sb3-contrib")


# --- (b) time to target ------------------------------------------------------------------------------------------
def rlspeed_time_to_target(seed: int, budget: int, eval_freq: int, args) -> dict:
    _run, hyperparameters = split_run_settings(load_preset("recurrent_ppo", ENV_ID))
    model = RecurrentPPO(ENV_ID, env_backend="auto", device=args.device, seed=seed, num_threads=args.threads,
                         **hyperparameters)
    model.learn(budget, target_return=TARGET_RETURN, eval_freq=eval_freq, eval_episodes=EVAL_EPISODES,
                progress_bar=False)
    return common.rlspeed_target_record(model)


def sb3_time_to_target(seed: int, budget: int, eval_freq: int, args) -> dict:
    """sb3-contrib's part (b) run: time to TARGET_RETURN on CartPoleNoVel-v1, evaluated as `rlspeed_time_to_target`
    evaluates."""
    model, env = sb3_model(seed)
    result = common.sb3_time_to_target(model, env, sb3_eval_env(env, seed, ENV_ID), budget, eval_freq,
                                       seed, TARGET_RETURN, EVAL_EPISODES, args.threads)
    return {**result, "library": "sb3-contrib"}


def sb3_eval_env(env, seed: int, env_id: str):
    """sb3-contrib's evaluation env beside training env `env`: EVAL_EPISODES envs seeded apart, which normalise
    observations with `env`'s current statistics (shared, not updated) and report raw returns, as rlspeed's
    evaluation does."""
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    eval_env = VecNormalize(make_vec_env(env_id, n_envs=EVAL_EPISODES, seed=seed + EVAL_SEED_OFFSET), training=False,
                            norm_reward=False, gamma=env.gamma)
    eval_env.obs_rms = env.obs_rms
    return eval_env


# --- (c) learning (PendulumNoVel-v1) -----------------------------------------------------------------------------
def rlspeed_learning(seed: int, budget: int, args) -> dict:
    """rlspeed trains `budget` steps at args.hyperparameters, evaluated at half the budget and at the end."""
    model = RecurrentPPO(args.env, env_backend="auto", device=args.device, seed=seed, num_threads=args.threads,
                         **args.hyperparameters)
    model.learn(budget, eval_freq=budget // 2, eval_episodes=EVAL_EPISODES, progress_bar=False)
    result = model.result
    return {"library": "rlspeed", "env_backend": model.env_backend, "device": str(model.device),
            "steps": result.total_timesteps, "train_wall_s": result.train_wall_s,
            "evaluations": [list(e) for e in result.evaluations], "threads": args.threads}


def sb3_learning(seed: int, budget: int, args) -> dict:
    """sb3-contrib trains `budget` steps at RL-Zoo's settings, evaluated as `rlspeed_learning` evaluates."""
    model, env = sb3_model(seed, args.env)
    result = common.sb3_time_to_target(model, env, sb3_eval_env(env, seed, args.env), budget, budget // 2,
                                       seed, math.inf, EVAL_EPISODES, args.threads)
    kept = ("env_backend", "device", "steps", "train_wall_s", "evaluations", "threads")
    return {"library": "sb3-contrib", **{key: result[key] for key in kept}}


def learning_runs(seeds: list[int], args) -> list[dict]:
    """Every (side, seed) learning run in a fresh process (this script with --learning-run), `args.jobs` at once,
    sb3-contrib's first; each result gets `name`, `seed` and the load average as it ended."""
    sides = [side for side in LEARNING_SIDES if not (side == "sb3" and args.skip_sb3)]
    flags = ["--env", args.env, "--budget", str(args.budget), "--threads", str(args.threads), "--device", args.device]

    def run(job: tuple[str, int]) -> dict:
        side, seed = job
        started = time.perf_counter()
        result = common.run_child(__file__, *flags, "--learning-run", side, str(seed), what=f"{side} seed {seed}")
        result = {"name": side, "seed": seed, **result, "load_average_after": common.load_average()}
        evaluations = ", ".join(f"{steps:,}: {mean:.1f}" for steps, _clock, mean in result["evaluations"])
        print(f"  {side} seed {seed}: {evaluations} ({time.perf_counter() - started:.0f}s)", flush=True)
        print(json.dumps(result), flush=True)  # (a record kept in the log should a later run fail)
        return result

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        return list(pool.map(run, [(side, seed) for side in sides for seed in seeds]))


def learning_summary(runs: list[dict]) -> dict:
    """Per side: the evaluation steps, the mean over seeds of each evaluation's return and of the training seconds;
    and, per evaluation, the seeds on which rlspeed's return is above sb3-contrib's."""
    summary: dict = {}
    for side in LEARNING_SIDES:
        mine = [run for run in runs if run["name"] == side]
        if mine:
            steps = [e[0] for e in mine[0]["evaluations"]]
            summary[side] = {"steps": steps, "mean": [statistics.fmean(run["evaluations"][i][2] for run in mine)
                                                      for i in range(len(steps))],
                             "train_wall_s_mean": statistics.fmean(run["train_wall_s"] for run in mine)}
    if set(LEARNING_SIDES) <= summary.keys():
        by_seed = {(run["name"], run["seed"]): run for run in runs}
        seeds = sorted({run["seed"] for run in runs})
        summary["rlspeed_ahead_seeds"] = [
            [seed for seed in seeds if by_seed["rlspeed", seed]["evaluations"][i][2]
             > by_seed["sb3", seed]["evaluations"][i][2]] for i in range(len(summary["rlspeed"]["steps"]))]
    return summary


def learning_report(runs: list[dict], summary: dict, settings: dict) -> list[str]:
    """The learning section's lines (without its heading and machine block)."""
    seeds = sorted({run["seed"] for run in runs})
    sides = [side for side in ("rlspeed", "sb3") if side in summary]
    steps = summary[sides[0]]["steps"]
    lines = []
    if settings["quick"]:
        lines += ["**Smoke run (`--quick`): settings far too small for the numbers to mean anything.**", ""]
    lines += [f"### (c) Learning: evaluation return after {steps[0]:,} and {steps[-1]:,} env steps", "",
              f"RL-Zoo ppo_lstm {settings['env_id']} settings for both, as in (a) (rlspeed `--preset zoo`'s "
              "translation, sb3-contrib the entry's values): one training run of "
              f"{settings['budget']:,} env steps per seed and library, evaluated (deterministic, {EVAL_EPISODES} "
              "episodes on a separate env seeded apart, observations normalised with the run's statistics, frozen; "
              f"raw returns) at the first rollout boundary at or past half the budget ({steps[0]:,} steps) and at "
              "the end. Mean evaluation return, higher is better (a Pendulum episode's best is about -150). rlspeed "
              f"env_backend `{settings['rlspeed_env_backend']}` on `{settings['device']}`; "
              f"torch.set_num_threads({settings['threads']}) for both; each run in a fresh process, "
              f"{settings['jobs']} at once.", ""]
    by_seed = {(run["name"], run["seed"]): run for run in runs}
    names = {"rlspeed": "rlspeed", "sb3": "sb3-contrib"}
    headers = ["Seed", *[f"{names[side]} @ {step:,}" for step in steps for side in sides],
               *[f"{names[side]} train s" for side in sides]]
    rows = [[str(seed), *[common.fmt(by_seed[side, seed]["evaluations"][i][2], ".1f") for i in range(len(steps))
                          for side in sides],
             *[common.fmt(by_seed[side, seed]["train_wall_s"]) for side in sides]] for seed in seeds]
    rows.append([f"mean of {len(seeds)}", *[common.fmt(summary[side]["mean"][i], ".1f") for i in range(len(steps))
                                            for side in sides],
                 *[common.fmt(summary[side]["train_wall_s_mean"]) for side in sides]])
    lines += [common.markdown_table(headers, rows), ""]
    if "rlspeed_ahead_seeds" in summary:
        said = []
        for i, step in enumerate(steps):
            ours, theirs = summary["rlspeed"]["mean"][i], summary["sb3"]["mean"][i]
            said.append(f"after {step:,} steps rlspeed's mean return is {ours:.1f}, sb3-contrib's {theirs:.1f} "
                        f"(rlspeed {'ahead' if ours > theirs else 'behind' if ours < theirs else 'level'} on the "
                        f"mean by {abs(ours - theirs):.1f}, ahead on "
                        f"{len(summary['rlspeed_ahead_seeds'][i])} of {len(seeds)} seeds)")
        lines += [f"In words: {'; '.join(said)}. {len(seeds)} seeds a side are weak evidence about learning: read "
                  "this as whether the two learn alike at this budget, not as which learns better.", ""]
    lines += [f"Load (`uptime`) before the runs: `{settings['uptime_before']}`; after: `{settings['uptime_after']}` "
              "(each run's record in the results JSON has the load average as it ended). The cores are shared, so "
              "the train seconds are no throughput measurement: (a) is."]
    return lines


def learning_worker(args) -> None:
    """--learning-run SIDE SEED: one learning run, its record printed as JSON on the last line of stdout."""
    side, seed = args.learning_run[0], int(args.learning_run[1])
    run = {"rlspeed": rlspeed_learning, "sb3": sb3_learning}[side]
    print(json.dumps(run(seed, args.budget, args)), flush=True)


def learning_main(args) -> None:
    """(c): the learning runs, then their section and results JSON."""
    settings = {"env_id": args.env, "seeds": args.seeds, "budget": args.budget, "threads": args.threads,
                "device": args.device, "quick": args.quick, "skip_sb3": args.skip_sb3, "jobs": args.jobs,
                "eval_episodes": EVAL_EPISODES, "eval_seed_offset": EVAL_SEED_OFFSET,
                "zoo_hyperparameters_rlspeed": args.hyperparameters,
                "rlspeed_hyperparameters_from": args.hyperparameters_from, "sb3_arguments": sb3_recorded(args.env),
                "uptime_before": common.uptime()}
    print(f"RecurrentPPO {args.env} learning: {args.seeds} seeds, budget {args.budget:,}, {args.jobs} runs at once, "
          f"torch.set_num_threads({args.threads})", flush=True)
    runs = learning_runs(list(range(args.seeds)), args)
    settings["uptime_after"] = common.uptime()
    settings["rlspeed_env_backend"] = next((run["env_backend"] for run in runs if run["name"] == "rlspeed"), None)
    machine = common.machine_description(("rlspeed", "torch", "gymnasium", "numpy", "stable-baselines3",
                                          "sb3-contrib"))
    machine["torch_threads"] = args.threads
    learning_publish(runs, settings, machine, not args.no_write)


def learning_publish(runs: list[dict], settings: dict, machine: dict, write: bool) -> None:
    """The learning section and results JSON of `runs` (also from a results JSON again: --learning-from)."""
    summary = learning_summary(runs)
    env_id = settings["env_id"]
    heading = f"## RecurrentPPO learning on {env_id} (`benchmarks/recurrent_ppo.py --env {env_id} --learning`)"
    common.publish(LEARNING_SECTION, [heading, "", *learning_report(runs, summary, settings)],
                   {"settings": settings, "summary": summary, "runs": runs}, write, machine=machine)


# --- report ------------------------------------------------------------------------------------------------------
THROUGHPUT_ROWS = {  # run name -> (library, env column)
    "rlspeed-gymnasium": ("rlspeed", "Gymnasium SyncVectorEnv (env_backend=\"gymnasium\")"),
    "rlspeed-torch": ("rlspeed", "native torch {env} (env_backend=\"torch\")"),
    "sb3": ("sb3-contrib", "Gymnasium DummyVecEnv"),
}


def report(summary: dict, settings: dict) -> list[str]:
    """The README section's lines (without its heading and machine block)."""
    seeds, threads, env_id = settings["seeds"], settings["threads"], settings["env_id"]
    lines = []
    if settings["quick"]:
        lines += ["**Smoke run (`--quick`): settings far too small for the numbers to mean anything.**", ""]
    lines += [f"### (a) Throughput at identical hyperparameters ({settings['steps']:,} env steps, no evaluation)", "",
              f"RL-Zoo ppo_lstm {env_id} settings for both, {seeds} seeds interleaved, "
              f"torch.set_num_threads({threads}), rlspeed on device `{settings['device']}`, sb3-contrib on `cpu`. "
              "Env steps per second of `learn`.", ""]
    if env_id == PENDULUM_ID:
        lines += ["rlspeed takes `--preset zoo`'s translation of RL-Zoo's entry (`rlspeed.presets.zoo.translate`), "
                  "sb3-contrib the entry's values with VecNormalize (gamma 0.9): 4 envs x 1,024 steps, sequence-chunk "
                  "minibatches of 128 steps, 10 epochs, gSDE resampled every 4 steps, ortho_init off, an LSTM of 64 "
                  "for each of actor and critic then one ReLU layer of 64; lr 1e-3 and clip range 0.2 constant. "
                  "Time to target is not run for this env: `--learning` measures the return after a fixed budget "
                  "instead (its own section).", ""]
    rows = []
    for name, stats in summary["throughput"].items():
        library, env = THROUGHPUT_ROWS[name]
        rows.append([library, env.format(env=env_id.split("-")[0]), common.fmt(stats["median"]),
                     common.fmt_range(stats), common.fmt_ratio(stats["ratio_to_sb3"])])
    lines += [common.markdown_table(["Library", f"Envs ({NUM_ENVS_OF[env_id]})", "Steps/s median",
                                     f"Range ({seeds} seeds)", "rlspeed / sb3-contrib"], rows), ""]
    load = [f"Load (`uptime`) before the runs: `{settings['uptime_before']}`; after: `{settings['uptime_after']}` (a "
            "load above the machine's usable cores means other jobs shared them; the seeds are interleaved, so compare "
            "the ratios)."]
    if settings["skip_target"]:  # (part (b) not run)
        return lines + load
    lines += [f"### (b) Time to mean eval return >= {TARGET_RETURN:g} (budget {settings['budget']:,} steps)", "",
              f"Both at the RL-Zoo settings above (rlspeed: its shipped preset `recurrent_ppo` / `{ENV_ID}`, the same "
              "values but RL-Zoo's ortho_init=False: the preset keeps orthogonal initialisation); deterministic "
              f"{EVAL_EPISODES}-episode evaluation on a separate env every "
              f"{settings['eval_freq']:,} env steps, evaluation time excluded from the training clock. Medians count "
              "a seed that missed the target as never reaching it (no median when most seeds miss); ranges are over "
              "the seeds that reached it. The last column is sb3-contrib / rlspeed.", ""]
    lines += [common.time_to_target_table(summary["time_to_target"], {
        "rlspeed": ("rlspeed", f"shipped preset `recurrent_ppo` / `{ENV_ID}`"),
        "sb3": ("sb3-contrib", f"RL-Zoo ppo_lstm {ENV_ID}")}), ""]
    return lines + load


def parse_args() -> argparse.Namespace:
    run_settings, _ = split_run_settings(load_preset("recurrent_ppo", ENV_ID))
    parser = common.peer_arguments(__doc__.split("\n\n")[0], peer="sb3-contrib", seeds=(3, 1),
                                   steps=(16_384, 2048),
                                   budget=(int(run_settings.get("total_timesteps", 100_000)), 8192),
                                   eval_freq=int(run_settings.get("eval_freq", 4096)))
    parser.add_argument("--env", default=ENV_ID, choices=sorted(SECTION_OF),
                        help=f"the task; {PENDULUM_ID} runs part (a) only and writes its own section")
    parser.add_argument("--skip-target", action="store_true", help="run the throughput part (a) only")
    parser.add_argument("--learning", action="store_true",
                        help=f"{PENDULUM_ID} only: run the learning part (c) instead of (a); --budget steps per run, "
                             f"default {LEARNING_BUDGET[0]}, quick {LEARNING_BUDGET[1]}")
    parser.add_argument("--jobs", type=int, default=2, help="learning runs (c) at once, each its own process")
    parser.add_argument("--learning-run", nargs=2, metavar=("SIDE", "SEED"), help=argparse.SUPPRESS)
    parser.add_argument("--learning-from", metavar="JSON",
                        help="write (c)'s section again from a results JSON that --learning wrote (no runs)")
    args = parser.parse_args()
    if (args.learning or args.learning_run) and args.env != PENDULUM_ID:
        parser.error(f"--learning is {PENDULUM_ID}'s: add --env {PENDULUM_ID}")
    if args.jobs < 1:
        parser.error(f"--jobs takes a count of 1 or more, got {args.jobs}")
    if (args.learning or args.learning_run) and args.budget is None:
        args.budget = LEARNING_BUDGET[1 if args.quick else 0]
    return common.peer_defaults(args)


def sb3_recorded(env_id: str) -> dict:
    """sb3_arguments(env_id) as the results JSON records them (lin_ schedules left out)."""
    return {**{key: value for key, value in sb3_arguments(env_id).items()
               if not callable(value) and key != "policy_kwargs"},
            "policy_kwargs": {**SB3_POLICY_KWARGS, "activation_fn": "ReLU"}}


def main() -> None:
    args = parse_args()
    args.threads = common.set_threads(args.threads)
    seeds = list(range(args.seeds))
    args.hyperparameters, source = rlspeed_hyperparameters(args.env)
    args.hyperparameters_from = source
    if args.learning_run:
        return learning_worker(args)
    if args.learning_from:  # (the section again from a learning run's results JSON: its text, not its numbers, new)
        data = json.loads(Path(args.learning_from).read_text())
        return learning_publish(data["runs"], data["settings"], data["machine"], not args.no_write)
    if args.learning:
        return learning_main(args)
    args.skip_target = args.skip_target or args.env != ENV_ID  # (b) is CartPoleNoVel-v1's only
    settings = {"env_id": args.env, "seeds": args.seeds, "steps": args.steps, "threads": args.threads,
                "device": args.device, "quick": args.quick, "skip_sb3": args.skip_sb3,
                "skip_target": args.skip_target, "zoo_hyperparameters_rlspeed": args.hyperparameters,
                "rlspeed_hyperparameters_from": source,
                "sb3_arguments": sb3_recorded(args.env),
                "uptime_before": common.uptime()}
    if not args.skip_target:
        settings.update(budget=args.budget, eval_freq=args.eval_freq, eval_episodes=EVAL_EPISODES,
                        target_return=TARGET_RETURN, rlspeed_preset=load_preset("recurrent_ppo", ENV_ID))
    print(f"RecurrentPPO {args.env}: {args.seeds} seeds, torch.set_num_threads({args.threads}), "
          f"rlspeed device {args.device}")
    throughput_runs = {
        "rlspeed-gymnasium": lambda seed, steps: rlspeed_throughput(seed, steps, "gymnasium", args),
        "sb3": lambda seed, steps: sb3_throughput(seed, steps, args),
        "rlspeed-torch": lambda seed, steps: rlspeed_throughput(seed, steps, "torch", args),
    }
    if args.skip_sb3:
        del throughput_runs["sb3"]
    print("warm-up (one short run of each, not recorded)", flush=True)
    for run in throughput_runs.values():
        run(0, 512)
    print(f"(a) throughput, {args.steps:,} steps per run", flush=True)
    throughput = common.interleave(seeds, {name: (lambda seed, run=run: run(seed, args.steps))
                                           for name, run in throughput_runs.items()})
    to_target = []
    if not args.skip_target:
        print(f"(b) time to {TARGET_RETURN:g}, budget {args.budget:,} steps, eval every {args.eval_freq:,}", flush=True)
        target_runs = {"rlspeed": lambda seed: rlspeed_time_to_target(seed, args.budget, args.eval_freq, args)}
        if not args.skip_sb3:
            target_runs["sb3"] = lambda seed: sb3_time_to_target(seed, args.budget, args.eval_freq, args)
        to_target = common.interleave(seeds, target_runs)
    settings["uptime_after"] = common.uptime()
    machine = common.machine_description(("rlspeed", "torch", "gymnasium", "numpy", "stable-baselines3",
                                          "sb3-contrib"))
    machine["torch_threads"] = args.threads
    summary = common.summarize(throughput, to_target, THROUGHPUT_ROWS)
    command = "benchmarks/recurrent_ppo.py" + ("" if args.env == ENV_ID else f" --env {args.env}")
    heading = f"## RecurrentPPO on {args.env} (`{command}`)"
    common.publish(SECTION_OF[args.env], [heading, "", *report(summary, settings)],
                   {"settings": settings, "summary": summary, "throughput": throughput, "time_to_target": to_target},
                   not args.no_write, machine=machine)


if __name__ == "__main__":
    main()
