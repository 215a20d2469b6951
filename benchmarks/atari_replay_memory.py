"""Replay memory for DQN on Atari: bytes per transition of rlspeed's two replay layouts and of Stable-Baselines3's
ReplayBuffer (its default, and `optimize_memory_usage=True`), and whether a 1,000,000-transition buffer fits in 8 GB.

Observations are the standard Atari preprocessing's uint8 frame stacks `[4, 84, 84]`, actions Discrete(18) (Atari's
full action set; the action field is 8 bytes whatever the number of actions), one env, as RL-Zoo's DQN Atari entry.
Every figure is the bytes of the arrays each buffer allocates, divided by its capacity:

- rlspeed `dense` (`ReplayBuffer`, `frame_dedup=false`): observation and next observation stored whole;
- rlspeed `frames` (`FrameStackReplayBuffer`, the default for Atari): each frame once, a reserve of 1/16 of the
  capacity for the first observations of restarted episodes, and 8 int32 frame indices per row;
- SB3 `ReplayBuffer` as its DQN makes it (`handle_timeout_termination=True`), and with `optimize_memory_usage=True`
  (next observations read from the following row; SB3 then needs `handle_timeout_termination=False`).

rlspeed's buffers are made for `--capacity` rows on the host and counted from their tensors; the 1M figure of each
rlspeed layout comes from the same constructor on PyTorch's `meta` device (shapes without memory), SB3's from its
per-transition bytes times 1M (its arrays grow linearly with the capacity). A second table times `sample(32)` of
the two rlspeed layouts on a filled buffer (alternating rounds: the frame layout gathers 8 frames per row by index).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from rlspeed.buffers import FrameStackReplayBuffer, ReplayBuffer  # noqa: E402

SPACE = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
ACTIONS = gym.spaces.Discrete(18)
MILLION = 1_000_000
LIMIT_BYTES = 8 * 10**9  # "fits in 8 GB"


def rlspeed_buffer(layout: str, capacity: int, storage_device: str | None = None) -> ReplayBuffer:
    kind = FrameStackReplayBuffer if layout == "frames" else ReplayBuffer
    return kind(capacity, 1, SPACE, (), torch.int64, "cpu", storage_device=storage_device)


def tensor_bytes(buffer: ReplayBuffer) -> int:
    """Bytes of every storage tensor the buffer allocated (the frame pool included)."""
    tensors = list(buffer.storage_tensors().values()) + ([buffer.frames] if hasattr(buffer, "frames") else [])
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors)


def rlspeed_row(layout: str, capacity: int) -> dict:
    buffer = rlspeed_buffer(layout, capacity)
    allocated = tensor_bytes(buffer)
    assert allocated == buffer.nbytes, (allocated, buffer.nbytes)  # the buffer's own figure is what it allocates
    million = rlspeed_buffer(layout, MILLION, storage_device="meta")
    del buffer
    return {"library": "rlspeed", "layout": layout, "capacity": capacity,
            "bytes_per_transition": allocated / capacity, "million_bytes": tensor_bytes(million)}


def sb3_row(optimize_memory_usage: bool, capacity: int) -> dict:
    from stable_baselines3.common.buffers import ReplayBuffer as SB3ReplayBuffer

    buffer = SB3ReplayBuffer(capacity, SPACE, ACTIONS, device="cpu", n_envs=1,
                             optimize_memory_usage=optimize_memory_usage,
                             handle_timeout_termination=not optimize_memory_usage)
    allocated = sum(value.nbytes for value in vars(buffer).values() if isinstance(value, np.ndarray))
    per_transition = allocated / capacity
    return {"library": "stable-baselines3", "layout": "optimize_memory_usage" if optimize_memory_usage else "default",
            "capacity": capacity, "bytes_per_transition": per_transition,
            "million_bytes": int(round(per_transition * MILLION))}


def filled(layout: str, capacity: int, seed: int = 0) -> ReplayBuffer:
    """A buffer filled with frame stacks of random frames, episodes of 100-1,000 steps."""
    rng = np.random.default_rng(seed)
    buffer = rlspeed_buffer(layout, capacity)
    frames = torch.as_tensor(rng.integers(0, 256, (capacity + 8, 84, 84), dtype=np.uint8))
    start, end = 0, int(rng.integers(100, 1000))
    for t in range(capacity):
        obs = torch.stack([frames[max(start, i)] for i in range(t - 3, t + 1)])[None]  # (the first frame repeated)
        next_obs = torch.cat((obs[:, 1:], frames[t + 1][None, None]), dim=1)
        done = t + 1 == end
        buffer.add(obs, torch.zeros(1, dtype=torch.int64), torch.zeros(1), next_obs, torch.tensor([done]),
                   torch.tensor([False]), reset_rows=np.array([0]) if done else np.array([], dtype=np.int64))
        if done:
            start, end = t + 1, t + 1 + int(rng.integers(100, 1000))
    return buffer


def sample_times(capacity: int, rounds: int, batches: int) -> dict[str, list[float]]:
    """Seconds per `sample(32)` of each layout, alternating rounds of `batches` samples."""
    buffers = {layout: filled(layout, capacity) for layout in ("dense", "frames")}
    generator = torch.Generator().manual_seed(0)
    for buffer in buffers.values():  # warm-up
        buffer.sample(32, generator=generator)

    def timed(buffer: ReplayBuffer):
        def run() -> float:
            start = time.perf_counter()
            for _ in range(batches):
                buffer.sample(32, generator=generator)
            return (time.perf_counter() - start) / batches
        return run

    return common.alternate({layout: timed(buffer) for layout, buffer in buffers.items()}, rounds)


def parse_args() -> argparse.Namespace:
    parser = common.script_arguments(__doc__)
    parser.add_argument("--capacity", type=int, default=10_000, help="rows of the buffers that are allocated")
    parser.add_argument("--sample-capacity", type=int, default=5_000, help="rows filled for the sampling times")
    parser.add_argument("--rounds", type=int, default=5, help="alternating sampling rounds")
    args = parser.parse_args()
    if args.quick:
        common.quick_settings(args, capacity=1_000, sample_capacity=500, rounds=1)
    return args


def main() -> None:
    args = parse_args()
    warnings.simplefilter("ignore")  # (SB3's note that its buffer would not fit in memory: the arrays stay lazy)
    args.threads = common.set_threads(args.threads)
    load_before = common.load_average()
    rows = [rlspeed_row("dense", args.capacity), rlspeed_row("frames", args.capacity),
            sb3_row(False, args.capacity), sb3_row(True, args.capacity)]
    times = sample_times(args.sample_capacity, args.rounds, 200)
    load_after = common.load_average()
    sb3_optimized = rows[3]["bytes_per_transition"]
    memory = common.markdown_table(
        ["buffer", "bytes per transition", "vs SB3 optimize_memory_usage", "1M transitions", "fits in 8 GB"],
        [[f"{row['library']} {row['layout']}", f"{row['bytes_per_transition']:,.0f}",
          common.fmt_ratio(row["bytes_per_transition"] / sb3_optimized), f"{row['million_bytes'] / 1e9:.2f} GB",
          "yes" if row["million_bytes"] <= LIMIT_BYTES else "no"] for row in rows])
    spreads = {layout: common.spread([1e6 * value for value in values]) for layout, values in times.items()}
    sampling = common.markdown_table(
        ["layout", "µs per sample(32) (median, range)", "vs dense"],
        [[layout, f"{common.fmt(spreads[layout]['median'], ',.1f')} ({common.fmt_range(spreads[layout], ',.1f')})",
          common.fmt_ratio(common.ratio(spreads[layout]["median"], spreads["dense"]["median"]))]
         for layout in ("dense", "frames")])
    lines = ["## DQN Atari replay memory (`benchmarks/atari_replay_memory.py`)", "",
             "Bytes per transition of the replay buffer for Atari's uint8 frame stacks `[4, 84, 84]` (one env, "
             "Discrete actions stored as int64), from the arrays each buffer allocates (the script's docstring says "
             f"how); rlspeed's and SB3's buffers made with {args.capacity:,} rows, the 1M column from the same "
             "constructors (rlspeed on the `meta` device) or per-transition bytes x 1M (SB3). GB = 10^9 bytes.", "",
             memory, "",
             "rlspeed's Atari default is the frame layout (`frame_dedup: true`; `report()` and `replay_summary()` "
             "name the layout and its bytes per transition). Its frame reserve (1/16 of the capacity) covers one "
             "restarted game per 64 transitions on average; if games restart more often, the oldest transitions are "
             "given up, never corrupted (the buffer says so).", "",
             f"Sampling time of a batch of 32 from a filled {args.sample_capacity:,}-row buffer on the host, "
             f"{args.rounds} alternating rounds of 200 samples, torch.set_num_threads({args.threads}); load average "
             f"(1, 5, 15 min) {load_before} before, {load_after} after:", "",
             sampling]
    machine = common.machine_description(("rlspeed", "torch", "gymnasium", "numpy", "stable-baselines3"))
    data = {"settings": {"observation": [4, 84, 84], "dtype": "uint8", "capacity": args.capacity,
                         "sample_capacity": args.sample_capacity, "rounds": args.rounds, "threads": args.threads,
                         "quick": args.quick},
            "load_before": load_before, "load_after": load_after, "bytes": rows,
            "sample_seconds": times, "sample_us_summary": spreads}
    common.publish("atari_replay_memory", lines, data, write=not args.no_write, machine=machine)


if __name__ == "__main__":
    main()
