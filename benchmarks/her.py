"""DQN with Hindsight Experience Replay on Stable-Baselines3's BitFlippingEnv: rlspeed (`her=True`) against
Stable-Baselines3 (`replay_buffer_class=HerReplayBuffer`) at identical hyperparameters, in one process.

Both train DQN on one `BitFlippingEnv(n_bits=N, continuous=False, max_steps=N)` (Dict observations of MultiBinary
bits; reward -1 until every bit matches the goal) for the same number of env steps, with relabelled goals (future
strategy, 4 sampled goals per real one), the same network (one hidden layer of 64 ReLU units), Adam at 1e-3, batch
64, gamma 0.95, a hard target update every 500 steps, epsilon from 1 to 0.05 over the first 10% of the run, one
gradient step per env step after 100 random steps, Huber loss, gradients clipped at 10; rlspeed without Double-Q and
with PyTorch's default initialisation and Adam epsilon, as SB3 has them. Runs alternate between the libraries, seed
by seed. Each trained model is then evaluated on a separate env: 20 deterministic episodes, success rate (the env's
`is_success`) and mean return. Steps per second are env steps over `learn`'s wall time (construction and evaluation
excluded). The same runs without HER (rlspeed only, by default) show what the relabelling is for.

Run from the repository root: `python benchmarks/her.py` (about 3 minutes on one core); `--quick` for a smoke run.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import gymnasium as gym

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

import rlspeed  # noqa: E402

EPISODES = 20


def _settings() -> dict:
    return {"learning_starts": 100, "buffer_size": 100_000, "batch_size": 64, "gamma": 0.95, "learning_rate": 1e-3,
            "target_update_interval": 500, "exploration_fraction": 0.1, "exploration_final_eps": 0.05,
            "train_freq": 1, "gradient_steps": 1, "max_grad_norm": 10.0}


def _bit_flipping(n_bits: int):
    from stable_baselines3.common.envs import BitFlippingEnv

    return BitFlippingEnv(n_bits=n_bits, continuous=False, max_steps=n_bits)


def _evaluate(predict, n_bits: int, seed: int) -> dict:
    """Deterministic episodes on a fresh env: success rate and mean return."""
    return common.goal_episodes(_bit_flipping(n_bits), predict, EPISODES, seed)


def run_rlspeed(n_bits: int, steps: int, seed: int, her: bool) -> dict:
    env = gym.vector.SyncVectorEnv([lambda: _bit_flipping(n_bits)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    model = rlspeed.DQN(env, seed=seed, her=her, net_arch=(64,), double_q=False, ortho_init=False, adam_eps=1e-8,
                        **_settings())
    started = time.perf_counter()
    model.learn(steps, progress_bar=False)
    wall = time.perf_counter() - started
    result = _evaluate(lambda obs: int(model.predict(obs, deterministic=True)[0]), n_bits, 10_000 + seed)
    return {"library": "rlspeed", "her": her, "steps": model.num_timesteps, "learn_wall_s": wall,
            "sps": model.num_timesteps / wall, **result}


def run_sb3(n_bits: int, steps: int, seed: int, her: bool) -> dict:
    from stable_baselines3 import DQN, HerReplayBuffer

    settings = _settings()
    her_options = ({"replay_buffer_class": HerReplayBuffer,
                    "replay_buffer_kwargs": {"n_sampled_goal": 4, "goal_selection_strategy": "future"}}
                   if her else {})
    model = DQN("MultiInputPolicy", _bit_flipping(n_bits), seed=seed, policy_kwargs={"net_arch": [64]},
                device="cpu", **settings, **her_options)
    started = time.perf_counter()
    model.learn(steps)
    wall = time.perf_counter() - started
    result = _evaluate(lambda obs: int(model.predict(obs, deterministic=True)[0]), n_bits, 10_000 + seed)
    return {"library": "stable-baselines3", "her": her, "steps": model.num_timesteps, "learn_wall_s": wall,
            "sps": model.num_timesteps / wall, **result}


def parse_args() -> argparse.Namespace:
    parser = common.script_arguments(__doc__)
    parser.add_argument("--bits", type=int, default=10, help="n_bits of the env (and its episode length)")
    parser.add_argument("--steps", type=int, default=4_000, help="env steps per run")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per library")
    parser.add_argument("--sb3-without-her", action="store_true", help="also run SB3 without HER")
    args = parser.parse_args()
    if args.quick:
        common.quick_settings(args, bits=4, steps=300, seeds=1)
    return args


def main() -> None:
    args = parse_args()
    warnings.simplefilter("ignore")
    args.threads = common.set_threads(args.threads)
    load_before = common.load_average()
    runners = {"rlspeed": lambda seed: run_rlspeed(args.bits, args.steps, seed, True),
               "stable-baselines3": lambda seed: run_sb3(args.bits, args.steps, seed, True),
               "rlspeed (no HER)": lambda seed: run_rlspeed(args.bits, args.steps, seed, False)}
    if args.sb3_without_her:
        runners["stable-baselines3 (no HER)"] = lambda seed: run_sb3(args.bits, args.steps, seed, False)
    results = common.interleave(range(args.seeds), runners)
    load_after = common.load_average()
    by_name = {name: [r for r in results if r["name"] == name] for name in runners}
    sps = {name: common.spread([r["sps"] for r in rows]) for name, rows in by_name.items()}
    rows = []
    for name, runs in by_name.items():
        rows.append([name, *common.goal_columns(runs),
                     f"{common.fmt(sps[name]['median'])} ({common.fmt_range(sps[name])})",
                     common.fmt_ratio(common.ratio(sps[name]["median"], sps["stable-baselines3"]["median"]))])
    table = common.markdown_table(["run", "success rate per seed", "mean return per seed", "env steps/s (median, "
                                   "range)", "steps/s vs SB3 with HER"], rows)
    lines = ["## DQN with Hindsight Experience Replay (`benchmarks/her.py`)", "",
             f"SB3's `BitFlippingEnv` with {args.bits} bits (one env), {args.steps:,} env steps per run, seeds "
             f"0-{args.seeds - 1}, identical hyperparameters (the script's docstring lists them), runs alternating "
             f"seed by seed, torch.set_num_threads({args.threads}); each model evaluated on a separate env, "
             f"{EPISODES} deterministic episodes. Load average (1, 5, 15 min) {load_before} before, {load_after} "
             "after.", "", table]
    machine = common.machine_description(("rlspeed", "torch", "gymnasium", "numpy", "stable-baselines3"))
    data = {"settings": {"bits": args.bits, "steps": args.steps, "seeds": args.seeds, "threads": args.threads,
                         "episodes": EPISODES, "quick": args.quick, **_settings()},
            "load_before": load_before, "load_after": load_after, "runs": results, "sps": sps}
    common.publish("her", lines, data, write=not args.no_write, machine=machine)


if __name__ == "__main__":
    main()
