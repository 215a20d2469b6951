"""Steps/s of `make_env` with the native torch backend against the Gymnasium backend at small N, on the CPU.

What `env_backend="auto"` chooses between (`rlspeed.envs.CPU_NATIVE_MIN_ENVS`): both as the algorithms get them
(episode statistics included), stepped with fixed actions so that only the env is timed. A native step is a fixed
number of small tensor ops whatever N is; Gymnasium's costs a few microseconds of Python per env. Repetitions
alternate between the backends.

    python benchmarks/env_backends.py            # full run
    python benchmarks/env_backends.py --quick    # smoke run
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

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

from rlspeed.envs import CPU_NATIVE_MIN_ENVS, NATIVE_ENVS, make_env  # noqa: E402


def time_backend(env_id: str, num_envs: int, backend: str, seconds: float) -> float:
    """Env steps per second of `make_env(..., backend=backend).step` with fixed zero actions."""
    env = make_env(env_id, num_envs=num_envs, device="cpu", seed=0, backend=backend)
    env.reset()
    space = env.spec.action_space
    actions = (torch.zeros(num_envs, dtype=torch.int64) if env.spec.discrete
               else torch.zeros(num_envs, *space.shape))
    try:
        return steps_per_second(env.step, lambda: actions, num_envs, seconds, warmup=50)
    finally:
        env.close()


def main() -> None:
    args = sweep_arguments(__doc__, sizes="1,2,4,8,16,32,64", envs=",".join(NATIVE_ENVS), seconds=0.5).parse_args()
    if args.quick:
        quick_settings(args, sizes="1,16", seconds=0.1, repeats=1, envs="CartPole-v1")
    threads = set_threads(1)
    sizes = [int(s) for s in args.sizes.split(",")]
    raw: list[dict] = []
    rows = []
    for env_id in args.envs.split(","):
        for num_envs in sizes:
            results = alternate({backend: partial(time_backend, env_id, num_envs, backend, args.seconds)
                                 for backend in ("torch", "gymnasium")}, args.repeats)
            native, gym = (spread(results[b])["median"] for b in ("torch", "gymnasium"))
            raw.append({"env_id": env_id, "num_envs": num_envs, "sps": results})
            auto = "torch" if num_envs >= CPU_NATIVE_MIN_ENVS else "gymnasium"
            rows.append([env_id, f"{num_envs:,}", fmt(native), fmt(gym), f"{native / gym:.2f}x", auto])
            print(" | ".join(rows[-1]), flush=True)
    table = markdown_table(["env", "N", "native (torch) steps/s", "Gymnasium steps/s", "native / Gymnasium",
                            "auto picks"], rows)
    publish("env_backends", [
        "## Env backends at small N on a CPU (`benchmarks/env_backends.py`)",
        "",
        f"`make_env(..., backend=...)` as the algorithms get it, fixed actions; median of {args.repeats} alternating "
        f"measurements of ~{args.seconds:g} s; {threads} torch thread. `auto` takes the native env on a CPU from "
        f"{CPU_NATIVE_MIN_ENVS} envs up.",
        "",
        table,
    ], {"results": raw, "settings": vars(args)}, write=not args.no_write)


if __name__ == "__main__":
    main()
