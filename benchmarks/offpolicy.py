"""Off-policy algorithms: rlspeed SAC on Pendulum-v1 and DQN on CartPole-v1 against Stable-Baselines3, side by side in
one process, seeds interleaved.

(a) Throughput: env steps per second of training at identical RL-Zoo hyperparameters for a fixed budget without
    evaluation. SAC Pendulum-v1: 1 env, batch 256, [256, 256] ReLU actor and critics, one gradient step per env step,
    learning rate 1e-3, learning_starts 100, automatic entropy tuning. DQN CartPole-v1: 1 env, batch 64,
    [256, 256], train_freq 256, gradient_steps 128, learning rate 2.3e-3, learning_starts 1000, target update every
    10 steps, epsilon 1 -> 0.04 over 16% of the run, plain (not double) DQN targets as SB3's DQN computes them.
    Gymnasium envs for both (rlspeed env_backend="gymnasium", SB3 DummyVecEnv), plus rlspeed on its device-native
    torch env, both in fp32 eager, and rlspeed with `accelerate="auto"` (the acceleration layer's measured choice of
    precision/compilation for the update step) on env_backend="auto", as the CLI runs it; it searches in the untimed
    warm-up run, at its second update (`common.acceleration_decided_at_once`: a run of this length would not reach
    its search, which waits for the updates to pay for it), into a cache of the script's own, and the timed runs (and
    (b)'s with --accelerate auto) take that choice (a first CLI run on a machine pays the search once).
(b) Time to target: training seconds until a deterministic 10-episode evaluation on a separate env reaches the target
    (SAC Pendulum-v1: -200; DQN CartPole-v1: 475), each library at its own best settings (rlspeed: its shipped preset,
    env backend auto; SB3: the RL-Zoo settings above), both evaluated every `eval_freq` env steps, evaluation time
    excluded from the training clock of both.

torch.set_num_threads(--threads, default 1) holds for every run of both libraries. Only `learn` is timed (model
and env construction are not). Usage: python benchmarks/offpolicy.py [--quick] [--seeds N] [--cases sac,dqn] ...
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field

import common

import rlspeed
from rlspeed.envs import resolve_backend
from rlspeed.presets import load_preset, split_run_settings

EVAL_EPISODES = 10
EVAL_SEED_OFFSET = 100_000  # the SB3 side's evaluation env is made with seed + this; each evaluation then reseeds it
# with the seed rlspeed's learn evaluates on at that step (common.sb3_target_callback): both sides' episodes have
# the same seeds (the same episodes where rlspeed's side runs Gymnasium's envs)


@dataclass
class Case:
    """One (algorithm, env) comparison: RL-Zoo hyperparameters in each library's names, budgets and target."""

    key: str
    algo: str
    env_id: str
    target_return: float
    zoo_rlspeed: dict
    zoo_sb3: dict
    zoo_description: str
    throughput_steps: int  # per throughput run (a)
    quick_throughput_steps: int
    quick_budget: int
    sb3_policy_kwargs: dict = field(default_factory=dict)


# RL-Zoo hyperparameters (rl-baselines3-zoo hyperparams/sac.yml and dqn.yml), SB3 defaults filled in.
CASES = {
    "sac": Case(
        key="sac", algo="sac", env_id="Pendulum-v1", target_return=-200.0,
        zoo_rlspeed=dict(num_envs=1, train_freq=1, gradient_steps=1, batch_size=256, learning_starts=100,
                         buffer_size=1_000_000, learning_rate=1e-3, tau=0.005, gamma=0.99, net_arch=(256, 256),
                         activation="relu"),
        zoo_sb3=dict(learning_rate=1e-3, buffer_size=1_000_000, learning_starts=100, batch_size=256, tau=0.005,
                     gamma=0.99, train_freq=1, gradient_steps=1, ent_coef="auto"),
        sb3_policy_kwargs=dict(net_arch=[256, 256]),
        zoo_description="RL-Zoo SAC Pendulum-v1 (lr 1e-3, batch 256, [256, 256], 1 gradient step per env step)",
        throughput_steps=3000, quick_throughput_steps=300, quick_budget=3000),
    "dqn": Case(
        key="dqn", algo="dqn", env_id="CartPole-v1", target_return=475.0,
        zoo_rlspeed=dict(num_envs=1, learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1000,
                         gamma=0.99, target_update_interval=10, train_freq=256, gradient_steps=128,
                         exploration_fraction=0.16, exploration_final_eps=0.04, net_arch=(256, 256), tau=1.0,
                         max_grad_norm=10.0, double_q=False),  # SB3's DQN: the same (non-double) target
        zoo_sb3=dict(learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1000, gamma=0.99,
                     target_update_interval=10, train_freq=256, gradient_steps=128, exploration_fraction=0.16,
                     exploration_final_eps=0.04),
        sb3_policy_kwargs=dict(net_arch=[256, 256]),
        zoo_description="RL-Zoo DQN CartPole-v1 (batch 64, [256, 256], train_freq 256, gradient_steps 128)",
        throughput_steps=20_000, quick_throughput_steps=2048, quick_budget=5000),
}


def rlspeed_class(case: Case):
    return {"sac": rlspeed.SAC, "dqn": rlspeed.DQN}[case.algo]


def sb3_class(case: Case):
    from stable_baselines3 import DQN, SAC

    return {"sac": SAC, "dqn": DQN}[case.algo]


def sb3_model(case: Case, env, seed: int, device: str):
    return sb3_class(case)("MlpPolicy", env, device=device, seed=seed, policy_kwargs=case.sb3_policy_kwargs,
                           **case.zoo_sb3)


# --- (a) throughput ----------------------------------------------------------------------------------------------
def rlspeed_throughput(case: Case, seed: int, steps: int, backend: str, args, accelerate: str = "off") -> dict:
    model = rlspeed_class(case)(case.env_id, env_backend=backend, device=args.device, seed=seed,
                                num_threads=args.threads, accelerate=accelerate, **case.zoo_rlspeed)
    model.make_training_env()  # built outside the timed region, like SB3's env (built by make_vec_env)
    started = time.perf_counter()
    model.learn(steps, progress_bar=False)
    learn_wall_s = time.perf_counter() - started
    return common.rlspeed_throughput_record(model, learn_wall_s, accelerate=model.acceleration_summary())


def sb3_throughput(case: Case, seed: int, steps: int, args) -> dict:
    from stable_baselines3.common.env_util import make_vec_env

    env = make_vec_env(case.env_id, n_envs=1, seed=seed)  # DummyVecEnv
    model = sb3_model(case, env, seed, args.sb3_device)
    return common.sb3_throughput_record(model, env, steps, args.threads)


# --- (b) time to target ------------------------------------------------------------------------------------------
def rlspeed_time_to_target(case: Case, seed: int, budget: int, eval_freq: int, args) -> dict:
    _run, hyperparameters = split_run_settings(load_preset(case.algo, case.env_id))
    model = rlspeed_class(case)(case.env_id, env_backend="auto", device=args.device, seed=seed,
                                num_threads=args.threads, accelerate=args.accelerate, **hyperparameters)
    model.learn(budget, target_return=case.target_return, eval_freq=eval_freq, eval_episodes=EVAL_EPISODES,
                progress_bar=False)
    return common.rlspeed_target_record(model)


def sb3_time_to_target(case: Case, seed: int, budget: int, eval_freq: int, args) -> dict:
    from stable_baselines3.common.env_util import make_vec_env

    env = make_vec_env(case.env_id, n_envs=1, seed=seed)
    eval_env = make_vec_env(case.env_id, n_envs=EVAL_EPISODES, seed=seed + EVAL_SEED_OFFSET)  # one episode per env
    model = sb3_model(case, env, seed, args.sb3_device)
    return common.sb3_time_to_target(model, env, eval_env, budget, eval_freq, seed,
                                     case.target_return, EVAL_EPISODES, args.threads)


# --- report ------------------------------------------------------------------------------------------------------
def throughput_rows(case: Case, device: str) -> dict[str, tuple[str, str]]:
    """Run name -> (library, env column)."""
    native = "Pendulum" if case.env_id.startswith("Pendulum") else "CartPole"
    auto = resolve_backend(case.env_id, "auto", case.zoo_rlspeed["num_envs"], device)
    return {"rlspeed-gymnasium": ("rlspeed", "Gymnasium SyncVectorEnv (env_backend=\"gymnasium\")"),
            "rlspeed-torch": ("rlspeed", f"native torch {native} (env_backend=\"torch\")"),
            "rlspeed-accelerate": ("rlspeed, accelerate=auto",
                                   f"env_backend=\"auto\" ({auto} here), as the CLI"),
            "sb3": ("Stable-Baselines3", "Gymnasium DummyVecEnv")}


def report_case(case: Case, summary: dict, settings: dict) -> str:
    """One case's part of the README section: its throughput and time-to-target tables."""
    seeds, threads = settings["seeds"], settings["threads"]
    title = f"{case.algo.upper()} on {case.env_id}"
    lines = [f"### {title}: (a) throughput at identical hyperparameters ({settings['steps'][case.key]:,} env steps, "
             "no evaluation)", "",
             f"{case.zoo_description} for both, {seeds} seeds interleaved, torch.set_num_threads({threads}), rlspeed "
             f"on device `{settings['device']}` (fp32 eager, and with the acceleration layer's measured choice: "
             f"{settings['accelerated'].get(case.key, 'not run')}), SB3 on `{settings['sb3_device']}`. Env steps "
             "per second of `learn` (for the accelerate=auto runs `chosen_by` says how the choice was made: where "
             "the acceleration layer searches, it does so once, at the second update of the untimed warm-up run, and "
             "caches its choice, so the search is not in their time).", ""]
    rows = []
    labels = throughput_rows(case, settings["device"])
    for name, stats in summary["throughput"].items():
        library, env = labels[name]
        rows.append([library, env, common.fmt(stats["median"]), common.fmt_range(stats),
                     common.fmt_ratio(stats["ratio_to_sb3"])])
    lines += [common.markdown_table(["Library", "Envs (1)", "Steps/s median", f"Range ({seeds} seeds)",
                                     "rlspeed / SB3"], rows), ""]

    lines += [f"### {title}: (b) time to mean eval return >= {case.target_return:g} "
              f"(budget {settings['budget'][case.key]:,} steps)", "",
              "Each library at its own best settings; deterministic "
              f"{EVAL_EPISODES}-episode evaluation on a separate env every {settings['eval_freq'][case.key]:,} env "
              "steps, evaluation time excluded from the training clock. Medians count a seed that missed the target "
              "as never reaching it (no median when most seeds miss); ranges are over the seeds that reached it.", ""]
    lines += [common.time_to_target_table(summary["time_to_target"], {
        "rlspeed": ("rlspeed", f"shipped preset `{case.algo}` / `{case.env_id}`"),
        "sb3": ("Stable-Baselines3", f"RL-Zoo {case.env_id}")}), ""]
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--cases", default="sac,dqn", help="comma-separated: sac (Pendulum-v1), dqn (CartPole-v1)")
    parser.add_argument("--seeds", type=int, default=None, help="number of seeds (0..N-1); default 5, quick 2")
    parser.add_argument("--steps", type=int, default=None,
                        help="env steps per throughput run (a); default SAC 3000 / DQN 20000, quick 300 / 2048")
    parser.add_argument("--budget", type=int, default=None,
                        help="env step budget per time-to-target run (b); default rlspeed's preset total_timesteps "
                             "(RL-Zoo's: SAC 20000, DQN 50000), quick 3000 / 5000")
    parser.add_argument("--eval-freq", type=int, default=None,
                        help="evaluate every N env steps in (b), both libraries; default rlspeed's preset eval_freq")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads for every run")
    parser.add_argument("--device", default="cpu", help="rlspeed's device")
    parser.add_argument("--sb3-device", default="cpu", help="Stable-Baselines3's device")
    parser.add_argument("--accelerate", default="off", choices=["off", "auto"],
                        help="rlspeed's acceleration layer in (b) (the throughput table (a) shows both)")
    parser.add_argument("--no-accelerate-row", action="store_true",
                        help="leave the accelerate=auto row out of the throughput table (a)")
    parser.add_argument("--quick", action="store_true", help="tiny smoke-run settings")
    parser.add_argument("--skip-sb3", action="store_true", help="run rlspeed only")
    parser.add_argument("--no-write", action="store_true", help="print only; do not write the JSON or README")
    args = parser.parse_args()
    args.cases = [CASES[key.strip()] for key in args.cases.split(",") if key.strip()]
    args.seeds = args.seeds or (2 if args.quick else 5)
    return args


def case_settings(case: Case, args) -> tuple[int, int, int]:
    """(throughput steps, time-to-target budget, eval_freq) for a case."""
    run_settings, _ = split_run_settings(load_preset(case.algo, case.env_id))
    steps = args.steps or (case.quick_throughput_steps if args.quick else case.throughput_steps)
    budget = args.budget or (case.quick_budget if args.quick else int(run_settings.get("total_timesteps", 50_000)))
    eval_freq = args.eval_freq or int(run_settings.get("eval_freq", 1000))
    return steps, budget, eval_freq


def run_case(case: Case, seeds: list[int], settings: dict, args) -> dict:
    """Throughput (a) and time to target (b) of one case, seeds interleaved; returns the raw runs and a summary."""
    steps, budget, eval_freq = case_settings(case, args)
    settings["steps"][case.key], settings["budget"][case.key], settings["eval_freq"][case.key] = (
        steps, budget, eval_freq)
    settings["cases"][case.key] = {"env_id": case.env_id, "target_return": case.target_return,
                                   "zoo_hyperparameters_rlspeed": case.zoo_rlspeed,
                                   "zoo_hyperparameters_sb3": case.zoo_sb3,
                                   "rlspeed_preset": load_preset(case.algo, case.env_id)}
    print(f"{case.algo.upper()} {case.env_id}: {len(seeds)} seeds, torch.set_num_threads({args.threads}), "
          f"rlspeed device {args.device}, SB3 device {args.sb3_device}", flush=True)
    throughput_runs = {
        "rlspeed-gymnasium": lambda seed, n: rlspeed_throughput(case, seed, n, "gymnasium", args),
        "sb3": lambda seed, n: sb3_throughput(case, seed, n, args),
        "rlspeed-torch": lambda seed, n: rlspeed_throughput(case, seed, n, "torch", args),
        "rlspeed-accelerate": lambda seed, n: rlspeed_throughput(case, seed, n, "auto", args, "auto"),
    }
    if args.skip_sb3:
        del throughput_runs["sb3"]
    if args.no_accelerate_row:
        del throughput_runs["rlspeed-accelerate"]
    warm_up_steps = case.zoo_rlspeed["learning_starts"] + 256
    print(f"warm-up (one short run of each, {warm_up_steps} steps, not recorded)", flush=True)
    warm_up(throughput_runs, warm_up_steps)

    print(f"(a) throughput, {steps:,} steps per run", flush=True)
    throughput = common.interleave(seeds, {name: (lambda seed, run=run: run(seed, steps))
                                           for name, run in throughput_runs.items()})

    print(f"(b) time to {case.target_return:g}, budget {budget:,} steps, eval every {eval_freq:,}", flush=True)
    target_runs = {"rlspeed": lambda seed: rlspeed_time_to_target(case, seed, budget, eval_freq, args)}
    if not args.skip_sb3:
        target_runs["sb3"] = lambda seed: sb3_time_to_target(case, seed, budget, eval_freq, args)
    to_target = common.interleave(seeds, target_runs)
    accelerated = {json.dumps(r["accelerate"], sort_keys=True) for r in throughput
                   if r["name"] == "rlspeed-accelerate"}
    if accelerated:
        settings["accelerated"][case.key] = " / ".join(sorted(accelerated))
    return {"summary": common.summarize(throughput, to_target, throughput_rows(case, args.device)),
            "throughput": throughput, "time_to_target": to_target}


def warm_up(runs: dict, steps: int) -> None:
    """One untimed run of `steps` of each side (seed 0); the accelerate=auto side searches in it, at its second update,
    and caches its choice for the runs after it."""
    with common.acceleration_decided_at_once():
        for run in runs.values():
            run(0, steps)


def main() -> None:
    args = parse_args()
    args.threads = common.set_threads(args.threads)
    seeds = list(range(args.seeds))
    settings: dict = {"seeds": args.seeds, "threads": args.threads, "device": args.device,
                      "sb3_device": args.sb3_device, "quick": args.quick,
                      "accelerate": args.accelerate, "skip_sb3": args.skip_sb3, "eval_episodes": EVAL_EPISODES,
                      "steps": {}, "budget": {}, "eval_freq": {}, "cases": {}, "accelerated": {}}
    results: dict = {}
    sections = []
    if args.quick:
        sections += ["**Smoke run (`--quick`): settings far too small for the numbers to mean anything.**", ""]
    for case in args.cases:
        results[case.key] = run_case(case, seeds, settings, args)
        sections.append(report_case(case, results[case.key]["summary"], settings))

    machine = common.machine_description()
    machine["torch_threads"] = args.threads
    common.publish("offpolicy", ["## Off-policy: SAC on Pendulum-v1, DQN on CartPole-v1 (`benchmarks/offpolicy.py`)",
                                 "", *sections], {"settings": settings, "results": results}, not args.no_write,
                   machine=machine)


if __name__ == "__main__":
    main()
