"""The members' CNN encoders: one grouped call over all members (`torch.func.vmap`, a grouped convolution of K groups
per layer) against one call per member in the solo's memory layout, the two modes `MemberEncoder` chooses between
(`rlspeed.population.base.MemberEncoder.mode`: per member for the Nature and strided CNNs on a CPU, grouped
otherwise).

    python benchmarks/member_encoder.py [--rounds 3] [--no-write]

Each case stacks K encoders as a population does (channels-last convolutions where the device takes them, as
`rlspeed.nn.to_device` places a solo's) and times both modes on random observations of B rows per member: without
gradients (a rollout step of N envs) and forward plus backward to the parameters (an update's minibatch). Each mode
runs alternately in `--rounds` rounds, the median round reported, in one process, torch.set_num_threads(1).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

#: (image, members K, rows per member B, gradients): a rollout step (B = the preset's envs) and update minibatches
CASES = [
    ("atari", 4, 8, False), ("atari", 4, 32, True), ("atari", 4, 256, True), ("atari", 16, 32, True),
    ("minatar", 4, 8, False), ("minatar", 4, 32, True), ("minatar", 4, 256, True), ("minatar", 16, 256, True),
    ("grid28", 4, 8, False), ("grid28", 4, 32, True), ("grid28", 4, 256, True),
]
SPACES = {"atari": ((4, 84, 84), "uint8", "Nature CNN, Atari's 4 x 84 x 84 uint8 stacks"),
          "minatar": ((10, 10, 4), "bool", "small CNN, MinAtar's 10 x 10 x 4 bool grids"),
          "grid28": ((28, 28, 3), "uint8", "strided CNN, 28 x 28 x 3 uint8 (MiniGrid's RGB images, tile_size=4)")}


def measure(image: str, members: int, rows: int, grad: bool, rounds: int) -> dict:
    """Milliseconds per call of each mode (median of `rounds` alternating rounds) for one case."""
    import gymnasium as gym
    import numpy as np
    import torch

    from rlspeed.nn import CNNEncoder, to_device
    from rlspeed.population.base import MemberEncoder

    shape, dtype, _ = SPACES[image]
    space = gym.spaces.Box(0, 255 if dtype == "uint8" else 1, shape, dtype=np.dtype(dtype))
    encoders = [to_device(CNNEncoder(space), torch.device("cpu")) for _ in range(members)]
    generator = torch.Generator().manual_seed(0)
    obs = torch.randint(0, 256 if dtype == "uint8" else 2, (members, rows, *shape), generator=generator)
    obs = obs.to(torch.uint8 if dtype == "uint8" else torch.bool)
    modes = {mode: MemberEncoder(encoders, mode=mode) for mode in ("grouped", "per-member")}
    params = {mode: encoder.stack(encoders) for mode, encoder in modes.items()}
    calls = max(2, int(256 // (members * rows) ** 0.5)) if grad else 20

    def call(mode: str) -> None:
        with torch.set_grad_enabled(grad):
            features = modes[mode](params[mode], obs)
            if grad:
                torch.autograd.grad(features.sum(), params[mode])

    times: dict[str, list[float]] = {mode: [] for mode in modes}
    for mode in modes:
        call(mode)  # (untimed: first-call allocations)
    for _ in range(rounds):
        for mode in modes:
            started = time.perf_counter()
            for _ in range(calls):
                call(mode)
            times[mode].append((time.perf_counter() - started) / calls * 1e3)
    chosen = MemberEncoder(encoders).mode
    return {"image": image, "members": members, "rows": rows, "grad": grad, "chosen": chosen,
            **{f"{mode}_ms": statistics.median(values) for mode, values in times.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    common.set_threads(1)
    load_before = common.uptime()
    results = []
    for image, members, rows, grad in CASES:
        result = measure(image, members, rows, grad, args.rounds)
        results.append(result)
        print(f"{image} K={members} B={rows} grad={grad}: grouped {result['grouped_ms']:.2f} ms, per member "
              f"{result['per-member_ms']:.2f} ms (chosen: {result['chosen']})", flush=True)
    load_after = common.uptime()
    lines = [
        "## Members' CNN encoders: one grouped call or one call per member (`benchmarks/member_encoder.py`)",
        "",
        "K members' encoders on random observations of B rows each, without gradients (a rollout step) and forward "
        "plus backward to the parameters (an update's minibatch); median of "
        f"{args.rounds} alternating rounds, torch.set_num_threads(1), channels-last convolutions as on a CPU. "
        f"`MemberEncoder` chooses per member for the Nature CNN on a CPU, grouped otherwise. Load before: "
        f"`{load_before}`; after: `{load_after}`.",
        "",
        "| Encoder | K | B | Gradients | Grouped ms | Per member ms | Per member / grouped | Chosen |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(f"| {SPACES[r['image']][2]} | {r['members']} | {r['rows']} | {'yes' if r['grad'] else 'no'} | "
                     f"{r['grouped_ms']:.2f} | {r['per-member_ms']:.2f} | "
                     f"{r['per-member_ms'] / r['grouped_ms']:.2f} | {r['chosen']} |")
    common.publish("member_encoder", lines, {"results": results, "rounds": args.rounds,
                                             "load": [load_before, load_after]}, write=not args.no_write)


if __name__ == "__main__":
    main()
