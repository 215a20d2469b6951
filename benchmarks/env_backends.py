"""Steps/s of `make_env` with the native torch backend against the Gymnasium backend at small N, on the CPU.

What `env_backend="auto"` chooses between (`rlspeed.envs.CPU_NATIVE_MIN_ENVS`): both as the algorithms get them
(episode statistics included), stepped with fixed actions so that only the env is timed. A native step is a fixed
number of small tensor ops whatever N is; Gymnasium's costs a few microseconds of Python per env. Repetitions
alternate between the backends.

`--suite atari-mujoco` measures what `auto` chooses between for Atari and MuJoCo ids instead: Gymnasium's envs in
this process, in subprocesses (`gymnasium-async`) and EnvPool's (the `atari` and `mujoco` extras and EnvPool), with
the env steps per CPU-second of this process (its threads: EnvPool's included, the subprocesses' not).

    python benchmarks/env_backends.py                       # full run
    python benchmarks/env_backends.py --suite atari-mujoco  # Atari and MuJoCo ids, three backends
    python benchmarks/env_backends.py --quick               # smoke run
"""

from __future__ import annotations

import sys
import time
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    alternate,
    fmt,
    load_average,
    machine_description,
    markdown_table,
    publish,
    quick_settings,
    set_threads,
    spread,
    steps_per_second,
    sweep_arguments,
)

from rlspeed.envs import CPU_NATIVE_MIN_ENVS, NATIVE_ENVS, make_env, resolve_backend  # noqa: E402

#: the ids and backends of `--suite atari-mujoco` (CartPole-v1 as the cheap env beside them)
ATARI_MUJOCO_ENVS = "BreakoutNoFrameskip-v4,HalfCheetah-v5,CartPole-v1"
ATARI_MUJOCO_BACKENDS = ("gymnasium", "gymnasium-async", "envpool")


def _zero_actions(env, num_envs: int) -> torch.Tensor:
    space = env.spec.action_space
    return (torch.zeros(num_envs, dtype=torch.int64) if env.spec.discrete
            else torch.zeros(num_envs, *space.shape))


def time_backend(env_id: str, num_envs: int, backend: str, seconds: float) -> float:
    """Env steps per second of `make_env(..., backend=backend).step` with fixed zero actions."""
    env = make_env(env_id, num_envs=num_envs, device="cpu", seed=0, backend=backend)
    env.reset()
    actions = _zero_actions(env, num_envs)
    try:
        return steps_per_second(env.step, lambda: actions, num_envs, seconds, warmup=50)
    finally:
        env.close()


def time_backend_cpu(env_id: str, num_envs: int, backend: str, seconds: float) -> tuple[float, float]:
    """(env steps per second, env steps per CPU-second of this process) of `make_env(..., backend=backend).step`
    with random actions (an Atari game's fixed action can end no episode), over about `seconds` after a warm-up."""
    env = make_env(env_id, num_envs=num_envs, device="cpu", seed=0, backend=backend)
    space = env.spec.action_space
    space.seed(0)
    draws = [torch.as_tensor(space.sample()) for _ in range(num_envs * 64)]
    actions = [torch.stack(draws[i:i + num_envs]) for i in range(0, len(draws), num_envs)]
    try:
        env.reset()
        for i in range(20):
            env.step(actions[i % len(actions)])
        calls, wall, cpu = 0, time.perf_counter(), time.process_time()
        while time.perf_counter() - wall < seconds or calls < 20:
            env.step(actions[calls % len(actions)])
            calls += 1
        return (num_envs * calls / (time.perf_counter() - wall),
                num_envs * calls / max(time.process_time() - cpu, 1e-9))
    finally:
        env.close()


def atari_mujoco(args) -> None:
    """`--suite atari-mujoco`: the three backends per id and N, and what `auto` picks."""
    threads = set_threads(1)
    sizes = [int(s) for s in args.sizes.split(",")]
    load_before = load_average()
    raw: list[dict] = []
    rows = []
    for env_id in args.envs.split(","):
        for num_envs in sizes:
            results = alternate({backend: partial(time_backend_cpu, env_id, num_envs, backend, args.seconds)
                                 for backend in ATARI_MUJOCO_BACKENDS}, args.repeats)
            raw.append({"env_id": env_id, "num_envs": num_envs,
                        "sps": {b: [wall for wall, _ in values] for b, values in results.items()},
                        "per_cpu_second": {b: [cpu for _, cpu in values] for b, values in results.items()}})
            cells = []
            for backend in ATARI_MUJOCO_BACKENDS:
                wall = spread([w for w, _ in results[backend]])["median"]
                cpu = spread([c for _, c in results[backend]])["median"]
                cells.append(f"{fmt(wall)} ({fmt(cpu)})")
            auto = resolve_backend(env_id, "auto", num_envs, "cpu")
            rows.append([env_id, f"{num_envs:,}", *cells, auto])
            print(" | ".join(rows[-1]), flush=True)
    table = markdown_table(["env", "N", *(f"{b} steps/s (per CPU-second)" for b in ATARI_MUJOCO_BACKENDS),
                            "auto picks"], rows)
    publish("env_backends_atari_mujoco", [
        "## Env backends for Atari and MuJoCo ids on a CPU (`benchmarks/env_backends.py --suite atari-mujoco`)",
        "",
        f"`make_env(..., backend=...)` as the algorithms get it (Atari: the standard preprocessing), random actions; "
        f"median of {args.repeats} alternating measurements of ~{args.seconds:g} s each; {threads} torch thread. In "
        "brackets, env steps per CPU-second of this process (all its threads, EnvPool's included; gymnasium-async's "
        "subprocesses are not counted there, so its figure is not comparable), which depends less on other load. "
        f"Load average (1, 5, 15 min): {load_before} before, {load_average()} after.",
        "",
        table,
    ], {"results": raw, "settings": vars(args)}, write=not args.no_write,
        machine=machine_description(("rlspeed", "torch", "gymnasium", "numpy", "ale-py", "mujoco", "envpool")))


def main() -> None:
    parser = sweep_arguments(__doc__, sizes="1,2,4,8,16,32,64", envs=",".join(NATIVE_ENVS), seconds=0.5)
    parser.add_argument("--suite", choices=("native", "atari-mujoco"), default="native")
    args = parser.parse_args()
    if args.suite == "atari-mujoco":
        quick_settings(args, envs=ATARI_MUJOCO_ENVS, sizes="1,8")  # (the suite's defaults, where not given)
        if args.quick:
            quick_settings(args, sizes="2", seconds=0.1, repeats=1, envs="CartPole-v1")
        atari_mujoco(args)
        return
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
