"""Data-parallel PPO under torchrun: steps/s with 1 and 2 ranks on an env-bound task, and all-reduce time.

The task is PPO on Gymnasium's Acrobot-v1 (Python RK4 dynamics: the env, not the network, is the cost), with the
same total number of envs split over the ranks. Each configuration runs `--repeats` times, alternating 1 and 2
ranks. The gradient all-reduce (one flat buffer, gloo) is timed inside a 2-rank group on the PPO policy's
gradients.

    python benchmarks/distributed_ppo.py            # full run
    python benchmarks/distributed_ppo.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    fmt,
    fmt_range,
    markdown_table,
    publish,
    quick_settings,
    set_threads,
    spread,
)

ENV_ID = "Acrobot-v1"


def all_reduce_worker(repeats: int) -> None:
    """Run inside torchrun: time `all_reduce_gradients` on PPO's policy gradients; rank 0 prints JSON."""
    import torch

    from rlspeed import PPO
    from rlspeed.distributed import DistributedStrategy

    strategy = DistributedStrategy()
    model = PPO(ENV_ID, seed=0, strategy=strategy, num_envs=2 * strategy.world_size)
    params = list(model.policy.parameters())
    for p in params:
        p.grad = torch.randn_like(p)
    for _ in range(20):
        strategy.all_reduce_gradients(params)
    strategy.barrier()
    start = time.perf_counter()
    for _ in range(repeats):
        strategy.all_reduce_gradients(params)
    elapsed = (time.perf_counter() - start) / repeats
    if strategy.is_main:
        numel = sum(p.numel() for p in params)
        print(json.dumps({"all_reduce_s": elapsed, "parameters": numel, "backend": strategy.backend}))
    strategy.shutdown()


def torchrun(nproc: int, args: list[str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, check=True)


def train_sps(nproc: int, num_envs: int, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as out:
        torchrun(nproc, ["-m", "rlspeed", "train", "ppo", ENV_ID, "--env-backend", "gymnasium", "--no-progress",
                         "--target-return", "none", "--total-timesteps", str(steps), "--out", out,
                         "--set", f"num_envs={num_envs}", "--set", "num_steps=128", "--set", "batch_size=256",
                         "--set", "n_epochs=4"])
        summary = json.loads((Path(out) / "summary.json").read_text())
    return {"nproc": nproc, "sps": summary["sps"], "train_wall_s": summary["train_wall_s"],
            "total_timesteps": summary["total_timesteps"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=65536)
    parser.add_argument("--num-envs", type=int, default=16, help="total envs, split over the ranks")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--all-reduce-worker", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.all_reduce_worker is not None:
        all_reduce_worker(args.all_reduce_worker)
        return
    if args.quick:
        quick_settings(args, steps=8192, repeats=1)
    runs: list[dict] = []
    for repeat in range(args.repeats):
        for nproc in (1, 2):
            result = train_sps(nproc, args.num_envs, args.steps)
            runs.append(result)
            print(f"repeat {repeat} ranks {nproc}: {result['sps']:,.0f} steps/s", flush=True)
    reduce_run = torchrun(2, [str(Path(__file__).resolve()), "--all-reduce-worker", "200"])
    all_reduce = json.loads(reduce_run.stdout.strip().splitlines()[-1])
    one = spread([r["sps"] for r in runs if r["nproc"] == 1])
    two = spread([r["sps"] for r in runs if r["nproc"] == 2])
    scaling = two["median"] / one["median"] if one["median"] else None
    table = markdown_table(
        ["ranks", "envs per rank", "steps/s (median)", "range", "vs 1 rank"],
        [["1", str(args.num_envs), fmt(one["median"]), fmt_range(one), "1.00x"],
         ["2", str(args.num_envs // 2), fmt(two["median"]), fmt_range(two), f"{scaling:.2f}x" if scaling else "—"]])
    set_threads(1)  # what each rank runs with (torchrun sets OMP_NUM_THREADS=1; rlspeed sets 1 thread)
    publish("distributed_ppo", [
        f"### Data-parallel PPO (torchrun, gloo): {ENV_ID}, Gymnasium envs",
        "",
        f"PPO with {args.num_envs} envs in total, 128 steps per rollout, 4 epochs, {args.steps:,} steps per run, "
        f"{args.repeats} runs per configuration (alternating). One torch thread per rank.",
        "",
        table,
        "",
        f"Gradient all-reduce of the PPO policy ({all_reduce['parameters']:,} parameters, one flat buffer, "
        f"{all_reduce['backend']}, 2 ranks): {all_reduce['all_reduce_s'] * 1e6:,.0f} µs per update.",
    ], {"runs": runs, "all_reduce": all_reduce, "settings": vars(args)}, write=not args.no_write)


if __name__ == "__main__":
    main()
