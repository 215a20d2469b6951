"""Random-policy steps/s of rlspeed's device-native envs against Gymnasium's vector envs, side by side.

For each env and N in (1, 64, 4096, 65536): rlspeed's native env stepped eagerly and with its transition fused by
torch.compile (compile=True), Gymnasium's SyncVectorEnv (what most users and Stable-Baselines3 run), and for
CartPole Gymnasium's numpy-vectorised CartPoleVectorEnv. Actions are drawn at random on the env's side each step
(torch.randint/rand for rlspeed, numpy for Gymnasium). Repetitions alternate between the implementations.

    python benchmarks/native_envs.py            # full run
    python benchmarks/native_envs.py --quick    # smoke run
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    alternate,
    fmt,
    markdown_table,
    publish,
    quick_settings,
    set_threads,
    spread,
    steps_per_second,
    sweep_arguments,
)

from rlspeed.envs import NATIVE_ENVS  # noqa: E402

ENV_IDS = ("CartPole-v1", "Pendulum-v1", "Acrobot-v1", "MountainCar-v0", "MountainCarContinuous-v0")


def time_native(env_id: str, num_envs: int, compile: bool, seconds: float) -> float:
    env = NATIVE_ENVS[env_id](num_envs=num_envs, seed=0, compile=compile)
    env.reset()
    space = env.spec.action_space
    discrete = isinstance(space, gym.spaces.Discrete)
    low, high = (None, None) if discrete else (float(space.low[0]), float(space.high[0]))

    def actions():
        if discrete:
            return torch.randint(0, int(space.n), (num_envs,))
        return torch.rand(num_envs, 1) * (high - low) + low

    return steps_per_second(env.step, actions, num_envs, seconds, warmup=10 if compile else 3)


def time_gymnasium(env_id: str, num_envs: int, mode: str, seconds: float) -> float:
    kwargs = {"vectorization_mode": mode}
    if mode == "sync":
        kwargs["vector_kwargs"] = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}
    env = gym.make_vec(env_id, num_envs=num_envs, **kwargs)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    space = env.single_action_space
    discrete = isinstance(space, gym.spaces.Discrete)

    def actions():
        if discrete:
            return rng.integers(0, int(space.n), num_envs)
        return rng.uniform(space.low[0], space.high[0], (num_envs, 1)).astype(np.float32)

    try:
        return steps_per_second(env.step, actions, num_envs, seconds, warmup=3)
    finally:
        env.close()


def main() -> None:
    parser = sweep_arguments(__doc__, sizes="1,64,4096,65536", envs=",".join(ENV_IDS), seconds=1.0)
    parser.add_argument("--sync-max", type=int, default=4096, help="largest N for SyncVectorEnv (slow beyond)")
    args = parser.parse_args()
    if args.quick:
        quick_settings(args, sizes="1,4096", seconds=0.2, repeats=1, envs="CartPole-v1,Pendulum-v1")
    threads = set_threads(1)
    sizes = [int(s) for s in args.sizes.split(",")]
    env_ids = args.envs.split(",")
    raw: list[dict] = []
    rows = []
    for env_id in env_ids:
        for num_envs in sizes:
            runners = {"native eager": partial(time_native, env_id, num_envs, False, args.seconds),
                       "native compiled": partial(time_native, env_id, num_envs, True, args.seconds)}
            if num_envs <= args.sync_max:
                runners["gymnasium sync"] = partial(time_gymnasium, env_id, num_envs, "sync", args.seconds)
            if env_id == "CartPole-v1":
                runners["gymnasium numpy-vector"] = partial(time_gymnasium, env_id, num_envs, "vector_entry_point",
                                                            args.seconds)
            results = alternate(runners, args.repeats)
            medians = {name: spread(values)["median"] for name, values in results.items()}
            raw.append({"env_id": env_id, "num_envs": num_envs, "sps": results})
            best_native = max(medians["native eager"], medians["native compiled"])
            sync = medians.get("gymnasium sync")
            vector = medians.get("gymnasium numpy-vector")
            rows.append([env_id, f"{num_envs:,}", fmt(medians["native eager"]), fmt(medians["native compiled"]),
                         fmt(sync), fmt(vector),
                         f"{best_native / sync:.1f}x" if sync else "—",
                         f"{best_native / vector:.2f}x" if vector else "—"])
            print(" | ".join(rows[-1]), flush=True)
    table = markdown_table(["env", "N", "native eager", "native compiled", "SyncVectorEnv", "numpy CartPoleVectorEnv",
                            "best native / Sync", "best native / numpy"], rows)
    publish("native_envs", [
        "### Device-native envs: random-policy steps/s (CPU)",
        "",
        f"Median of {args.repeats} alternating measurements of ~{args.seconds:g} s each; {threads} torch thread. "
        "'native compiled' fuses the transition with torch.compile (compile time excluded: it is paid once). "
        f"SyncVectorEnv is measured up to N = {args.sync_max:,}.",
        "",
        table,
    ], {"results": raw, "settings": vars(args)}, write=not args.no_write)


if __name__ == "__main__":
    main()
