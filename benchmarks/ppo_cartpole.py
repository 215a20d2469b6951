"""PPO on CartPole-v1: rlspeed against Stable-Baselines3, side by side in one process, seeds interleaved.

(a) Throughput: env steps per second of training at identical RL-Zoo hyperparameters (8 envs, n_steps 32, batch
    256, 20 epochs, gamma 0.98, gae_lambda 0.8, lr and clip linear from 1e-3 and 0.2, ent_coef 0, value loss
    weight SB3 0.5 (= rlspeed 1.0), [64, 64] tanh, separate actor and critic, orthogonal init) for a fixed budget
    without evaluation. Gymnasium envs for both (rlspeed env_backend="gymnasium", SB3 DummyVecEnv), plus rlspeed on
    its device-native torch CartPole.
(b) Time to target: training seconds until a deterministic 10-episode evaluation on a separate env reaches a mean
    return of 475, each library at its own best settings (rlspeed: its shipped CartPole preset, env backend auto;
    SB3: the RL-Zoo CartPole settings above), both evaluated every `eval_freq` env steps, evaluation time excluded
    from the training clock of both.

torch.set_num_threads(--threads, default 1) holds for every run of both libraries. Only `learn` is timed (model
and env construction are not). Usage: python benchmarks/ppo_cartpole.py [--quick] [--seeds N] [--skip-sb3] ...
"""

from __future__ import annotations

import argparse
import time

import common

import rlspeed
from rlspeed.presets import load_preset, split_run_settings

ENV_ID = "CartPole-v1"
TARGET_RETURN = 475.0
EVAL_EPISODES = 10
EVAL_SEED_OFFSET = 100_000  # the SB3 side's evaluation env is made with seed + this; each evaluation then reseeds it
# with the seed rlspeed's learn evaluates on at that step (common.sb3_target_callback): both sides' episodes have
# the same seeds (the same episodes where rlspeed's side runs Gymnasium's envs)

# RL-Zoo's PPO CartPole-v1 hyperparameters (rl-baselines3-zoo hyperparams/ppo.yml), in each library's names: SB3's
# default vf_coef 0.5 is rlspeed's 1.0 (rlspeed's PPO value loss is 0.5 * MSE).
ZOO_RLSPEED = dict(num_envs=8, num_steps=32, batch_size=256, n_epochs=20, gamma=0.98, gae_lambda=0.8,
                   learning_rate=1e-3, anneal_lr=True, clip_range=0.2, anneal_clip=True, ent_coef=0.0, vf_coef=1.0,
                   net_arch=(64, 64), activation="tanh")
ZOO_NUM_ENVS = 8


def linear(initial: float):
    """RL-Zoo's `lin_<value>` schedule: decays linearly from `initial` to 0 over training (SB3's progress_remaining)."""

    def schedule(progress_remaining: float) -> float:
        return progress_remaining * initial

    return schedule


def zoo_sb3_kwargs() -> dict:
    return dict(n_steps=32, batch_size=256, n_epochs=20, gamma=0.98, gae_lambda=0.8, learning_rate=linear(1e-3),
                clip_range=linear(0.2), ent_coef=0.0)  # MlpPolicy default: pi [64, 64], vf [64, 64], tanh, ortho init


# --- (a) throughput ----------------------------------------------------------------------------------------------
def rlspeed_throughput(seed: int, steps: int, backend: str, args) -> dict:
    model = rlspeed.PPO(ENV_ID, env_backend=backend, device=args.device, seed=seed, num_threads=args.threads,
                        **ZOO_RLSPEED)
    model.make_training_env()  # built outside the timed region, like SB3's env (built by make_vec_env)
    started = time.perf_counter()
    model.learn(steps, progress_bar=False)
    learn_wall_s = time.perf_counter() - started
    return common.rlspeed_throughput_record(model, learn_wall_s)


def sb3_throughput(seed: int, steps: int, args) -> dict:
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    env = make_vec_env(ENV_ID, n_envs=ZOO_NUM_ENVS, seed=seed)  # DummyVecEnv
    model = PPO("MlpPolicy", env, device="cpu", seed=seed, **zoo_sb3_kwargs())
    return common.sb3_throughput_record(model, env, steps, args.threads)


# --- (b) time to target ------------------------------------------------------------------------------------------
def rlspeed_time_to_target(seed: int, budget: int, eval_freq: int, args) -> dict:
    _run, hyperparameters = split_run_settings(load_preset("ppo", ENV_ID))
    model = rlspeed.PPO(ENV_ID, env_backend="auto", device=args.device, seed=seed, num_threads=args.threads,
                        **hyperparameters)
    model.learn(budget, target_return=TARGET_RETURN, eval_freq=eval_freq, eval_episodes=EVAL_EPISODES,
                progress_bar=False)
    return common.rlspeed_target_record(model)


def sb3_time_to_target(seed: int, budget: int, eval_freq: int, args) -> dict:
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    env = make_vec_env(ENV_ID, n_envs=ZOO_NUM_ENVS, seed=seed)
    eval_env = make_vec_env(ENV_ID, n_envs=EVAL_EPISODES, seed=seed + EVAL_SEED_OFFSET)  # one episode per env
    model = PPO("MlpPolicy", env, device="cpu", seed=seed, **zoo_sb3_kwargs())
    return common.sb3_time_to_target(model, env, eval_env, budget, eval_freq, seed, TARGET_RETURN,
                                     EVAL_EPISODES, args.threads)


# --- report ------------------------------------------------------------------------------------------------------
THROUGHPUT_ROWS = {  # run name -> (library, env column)
    "rlspeed-gymnasium": ("rlspeed", "Gymnasium SyncVectorEnv (env_backend=\"gymnasium\")"),
    "rlspeed-torch": ("rlspeed", "native torch CartPole (env_backend=\"torch\")"),
    "sb3": ("Stable-Baselines3", "Gymnasium DummyVecEnv"),
}


def report(summary: dict, settings: dict) -> list[str]:
    """The README section's lines (without its heading and machine block)."""
    seeds, threads = settings["seeds"], settings["threads"]
    lines = []
    if settings["quick"]:
        lines += ["**Smoke run (`--quick`): settings far too small for the numbers to mean anything.**", ""]
    lines += [f"### (a) Throughput at identical hyperparameters ({settings['steps']:,} env steps, no evaluation)", "",
              f"RL-Zoo CartPole PPO settings for both, {seeds} seeds interleaved, torch.set_num_threads({threads}), "
              f"rlspeed on device `{settings['device']}`, SB3 on `cpu`. Env steps per second of `learn`.", ""]
    rows = []
    for name, stats in summary["throughput"].items():
        library, env = THROUGHPUT_ROWS[name]
        rows.append([library, env, common.fmt(stats["median"]), common.fmt_range(stats),
                     common.fmt_ratio(stats["ratio_to_sb3"])])
    lines += [common.markdown_table(["Library", "Envs (8)", "Steps/s median", f"Range ({seeds} seeds)",
                                     "rlspeed / SB3"], rows), ""]

    lines += [f"### (b) Time to mean eval return >= {TARGET_RETURN:g} (budget {settings['budget']:,} steps)", "",
              f"Each library at its own best settings; deterministic {EVAL_EPISODES}-episode evaluation on a separate "
              f"env every {settings['eval_freq']:,} env steps, evaluation time excluded from the training clock. "
              "Medians count a seed that missed the target as never reaching it (no median when most seeds miss); "
              "ranges are over the seeds that reached it.", ""]
    lines += [common.time_to_target_table(summary["time_to_target"], {
        "rlspeed": ("rlspeed", "shipped preset `ppo` / `CartPole-v1`"),
        "sb3": ("Stable-Baselines3", "RL-Zoo CartPole-v1")})]
    return lines


def parse_args() -> argparse.Namespace:
    run_settings, _ = split_run_settings(load_preset("ppo", ENV_ID))
    parser = common.peer_arguments(__doc__.split("\n\n")[0], peer="SB3", seeds=(5, 2), steps=(50_000, 4096),
                                   budget=(int(run_settings.get("total_timesteps", 100_000)), 20_000),
                                   eval_freq=int(run_settings.get("eval_freq", 1024)))
    return common.peer_defaults(parser.parse_args())


def main() -> None:
    args = parse_args()
    args.threads = common.set_threads(args.threads)
    seeds = list(range(args.seeds))
    settings = {"env_id": ENV_ID, "seeds": args.seeds, "steps": args.steps, "budget": args.budget,
                "eval_freq": args.eval_freq, "eval_episodes": EVAL_EPISODES, "target_return": TARGET_RETURN,
                "threads": args.threads, "device": args.device, "quick": args.quick, "skip_sb3": args.skip_sb3,
                "zoo_hyperparameters_rlspeed": ZOO_RLSPEED, "rlspeed_preset": load_preset("ppo", ENV_ID)}
    print(f"PPO {ENV_ID}: {args.seeds} seeds, torch.set_num_threads({args.threads}), rlspeed device {args.device}")

    throughput_runs = {
        "rlspeed-gymnasium": lambda seed, steps: rlspeed_throughput(seed, steps, "gymnasium", args),
        "sb3": lambda seed, steps: sb3_throughput(seed, steps, args),
        "rlspeed-torch": lambda seed, steps: rlspeed_throughput(seed, steps, "torch", args),
    }
    if args.skip_sb3:
        del throughput_runs["sb3"]
    print("warm-up (one short run of each, not recorded)", flush=True)
    for run in throughput_runs.values():
        run(0, 1024)

    print(f"(a) throughput, {args.steps:,} steps per run", flush=True)
    throughput = common.interleave(seeds, {name: (lambda seed, run=run: run(seed, args.steps))
                                           for name, run in throughput_runs.items()})

    print(f"(b) time to {TARGET_RETURN:g}, budget {args.budget:,} steps, eval every {args.eval_freq:,}", flush=True)
    target_runs = {"rlspeed": lambda seed: rlspeed_time_to_target(seed, args.budget, args.eval_freq, args)}
    if not args.skip_sb3:
        target_runs["sb3"] = lambda seed: sb3_time_to_target(seed, args.budget, args.eval_freq, args)
    to_target = common.interleave(seeds, target_runs)

    machine = common.machine_description()
    machine["torch_threads"] = args.threads
    summary = common.summarize(throughput, to_target, THROUGHPUT_ROWS)
    common.publish("ppo_cartpole", ["## PPO on CartPole-v1 (`benchmarks/ppo_cartpole.py`)", "",
                                    *report(summary, settings)],
                   {"settings": settings, "summary": summary, "throughput": throughput, "time_to_target": to_target},
                   not args.no_write, machine=machine)


if __name__ == "__main__":
    main()
