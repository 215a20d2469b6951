"""The CNN encoders' convolutions in contiguous (NCHW) memory against channels-last (NHWC) memory, the layout
`rlspeed.nn.to_device` gives them where `DeviceRules.channels_last_convs` says so (CPU): time per call and the
largest difference in outputs and gradients.

Cases: rlspeed's `CNNEncoder` with a linear head of 6 outputs, on
- an Atari frame stack (4x84x84 uint8, Nature CNN, 512 features): a training step (forward and backward of the sum of
  outputs) on a minibatch of 256 (PPO's Atari preset) and of 32 (DQN's), and a rollout forward of 8 observations
  (8 envs) without gradients;
- MinAtar's grid (10x10x4 bool, channels last; the small CNN, 256 features): a training step on 256 and on 32.

Both layouts hold the same weights; the rounds alternate between them (`--rounds`, each the median of `--calls`
timed calls after 2 untimed ones), in one process, torch.set_num_threads(--threads, default 1).

Usage: python benchmarks/conv_layout.py [--rounds N] [--calls N] [--quick] [--no-write]
"""

from __future__ import annotations

import copy
import statistics
import time

import common
import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlspeed.nn import CNNEncoder

MINATAR = gym.spaces.Box(np.zeros((10, 10, 4), bool), np.ones((10, 10, 4), bool), dtype=bool)
CASES = [  # (name, space, features, batch, training)
    ("Atari 4x84x84 uint8, Nature CNN", gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), 512, 256, True),
    ("Atari 4x84x84 uint8, Nature CNN", gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), 512, 32, True),
    ("Atari 4x84x84 uint8, Nature CNN", gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), 512, 8, False),
    ("MinAtar 10x10x4 bool, small CNN", MINATAR, 256, 256, True),
    ("MinAtar 10x10x4 bool, small CNN", MINATAR, 256, 32, True),
]


def networks(space: gym.spaces.Box, features: int) -> tuple[nn.Module, nn.Module]:
    """(contiguous, channels-last) copies of one encoder with a linear head."""
    torch.manual_seed(0)
    encoder = CNNEncoder(space, features_dim=features)
    contiguous = nn.Sequential(encoder, nn.Linear(features, 6))
    channels_last = copy.deepcopy(contiguous)
    channels_last[0].use_channels_last()
    return contiguous, channels_last


def call(net: nn.Module, obs: torch.Tensor, training: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    if not training:
        with torch.no_grad():
            return net(obs), []
    net.zero_grad(set_to_none=True)
    out = net(obs)
    out.sum().backward()
    return out, [p.grad for p in net.parameters()]


def timed(net: nn.Module, obs: torch.Tensor, training: bool, calls: int) -> float:
    """Median milliseconds per call over `calls` calls."""
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        call(net, obs, training)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


def relative_difference(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(((x - y).abs().max() / x.abs().max().clamp_min(1e-12)).item() for x, y in zip(a, b))


def measure(space, features: int, batch: int, training: bool, rounds: int, calls: int) -> dict:
    contiguous, channels_last = networks(space, features)
    generator = torch.Generator().manual_seed(1)
    obs = torch.randint(0, 256 if space.dtype == np.uint8 else 2, (batch, *space.shape), generator=generator)
    obs = obs.to(torch.uint8 if space.dtype == np.uint8 else torch.bool)
    out_a, grads_a = call(contiguous, obs, training)
    out_b, grads_b = call(channels_last, obs, training)
    difference = relative_difference([out_a, *grads_a], [out_b, *grads_b])
    for net in (contiguous, channels_last):  # (untimed: first allocations)
        call(net, obs, training)
    times = common.alternate({"contiguous": lambda: timed(contiguous, obs, training, calls),
                              "channels_last": lambda: timed(channels_last, obs, training, calls)}, rounds)
    return {"times_ms": times, "max_relative_difference": difference,
            "ratio": statistics.median(times["contiguous"]) / statistics.median(times["channels_last"])}


def main() -> None:
    parser = common.script_arguments(__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=5)
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.calls = 1, 1
    args.threads = common.set_threads(args.threads)
    load_before = common.load_average()
    rows, records = [], []
    for name, space, features, batch, training in CASES:
        result = measure(space, features, batch, training, args.rounds, args.calls)
        what = "training step" if training else "rollout forward"
        record = {"case": name, "batch": batch, "what": what, **result}
        records.append(record)
        contiguous = statistics.median(result["times_ms"]["contiguous"])
        channels_last = statistics.median(result["times_ms"]["channels_last"])
        print(f"  {name}, {what}, batch {batch}: {contiguous:.2f} ms -> {channels_last:.2f} ms "
              f"({result['ratio']:.2f}x), max relative difference {result['max_relative_difference']:.1e}",
              flush=True)
        rows.append([name, what, str(batch), f"{contiguous:,.2f}", f"{channels_last:,.2f}",
                     common.fmt_ratio(result["ratio"]), f"{result['max_relative_difference']:.1e}"])
    load_after = common.load_average()
    table = common.markdown_table(
        ["encoder", "call", "batch", "contiguous ms", "channels-last ms", "speed-up", "max relative difference"],
        rows)
    lines = ["## CNN encoder memory layout (`benchmarks/conv_layout.py`)", "",
             f"rlspeed's CNN encoders with convolution weights and input in contiguous (NCHW) against channels-last "
             f"(NHWC) memory, the same weights, fp32, torch.set_num_threads({args.threads}); {args.rounds} "
             f"alternating rounds of the median of {args.calls} calls each, in one process. A training step is the "
             f"forward and backward pass of the encoder and a linear head. The last column is the largest difference "
             f"in outputs and gradients relative to each tensor's largest value. `rlspeed.nn.to_device` puts the "
             f"encoders in channels-last memory on the CPU (`DeviceRules.channels_last_convs`). Load average "
             f"(1, 5, 15 min): {load_before} before, {load_after} after.", "", table]
    data = {"settings": {"rounds": args.rounds, "calls": args.calls, "threads": args.threads, "quick": args.quick},
            "load_before": load_before, "load_after": load_after, "cases": records}
    common.publish("conv_layout", lines, data, not args.no_write)


if __name__ == "__main__":
    main()
