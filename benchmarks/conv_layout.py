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

End to end (`--ppo-pairs N`, default 3; 0 skips it): PPO on BreakoutNoFrameskip-v4 at rlspeed's Atari preset,
Gymnasium envs, steady-state steps/s as `atari_ppo.py throughput` measures them (its `worker`), with the rule on
(`DeviceRules.channels_last_convs`, the CPU default) and patched off, each run in a fresh process, the order
reversed every other pair.

Usage: python benchmarks/conv_layout.py [--rounds N] [--calls N] [--ppo-pairs N] [--quick] [--no-write]
"""

from __future__ import annotations

import copy
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

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


# a fresh process: atari_ppo's steady-state worker, with the channels-last rule patched off when asked
_PPO_CHILD = """
import dataclasses, json, sys
sys.path.insert(0, sys.argv[1])
import rlspeed.device, rlspeed.nn
if sys.argv[2] == "off":
    real = rlspeed.device.rules
    rlspeed.nn.rules = lambda device: dataclasses.replace(real(device), channels_last_convs=False)
import atari_ppo
print(json.dumps({"sps": atari_ppo.worker("rlspeed-gym", 2, 1, int(sys.argv[3]), 0)["sps"]}))
"""


def ppo_breakout(pairs: int, threads: int) -> dict[str, list[float]]:
    """Steady-state steps/s of PPO Breakout with channels-last convolutions on and off, alternating fresh
    processes."""
    here = str(Path(__file__).resolve().parent)
    runs: dict[str, list[float]] = {"on": [], "off": []}
    for pair in range(pairs):
        for mode in ("on", "off") if pair % 2 == 0 else ("off", "on"):
            done = subprocess.run([sys.executable, "-c", _PPO_CHILD, here, mode, str(threads)], capture_output=True,
                                  text=True, check=True)
            runs[mode].append(json.loads(done.stdout.strip().splitlines()[-1])["sps"])
            print(f"  PPO Breakout pair {pair}, channels-last {mode}: {runs[mode][-1]:,.0f} steps/s", flush=True)
    return runs


def main() -> None:
    parser = common.script_arguments(__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--ppo-pairs", type=int, default=3, help="end-to-end PPO Breakout pairs (0: skip)")
    args = parser.parse_args()
    if args.quick:
        common.quick_settings(args, rounds=1, calls=1, ppo_pairs=min(args.ppo_pairs, 1))
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
    ppo = ppo_breakout(args.ppo_pairs, args.threads) if args.ppo_pairs else None
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
    if ppo:
        ratios = [on / off for on, off in zip(ppo["on"], ppo["off"])]
        lines += ["", f"End to end: PPO on BreakoutNoFrameskip-v4 (rlspeed's Atari preset, 8 Gymnasium envs), "
                  f"steady-state steps/s as `atari_ppo.py throughput` measures them, channels-last on (the CPU "
                  f"rule) and patched off, {args.ppo_pairs} pairs of fresh processes, order reversed every other "
                  f"pair: on {', '.join(f'{v:,.0f}' for v in ppo['on'])}; off "
                  f"{', '.join(f'{v:,.0f}' for v in ppo['off'])}; on / off per pair "
                  f"{', '.join(f'{r:.2f}x' for r in ratios)} (median {statistics.median(ratios):.2f}x)."]
    data = {"settings": {"rounds": args.rounds, "calls": args.calls, "threads": args.threads, "quick": args.quick,
                         "ppo_pairs": args.ppo_pairs},
            "load_before": load_before, "load_after": load_after, "cases": records, "ppo_breakout": ppo}
    common.publish("conv_layout", lines, data, not args.no_write)


if __name__ == "__main__":
    main()
