"""What storing each image observation once costs per env step: DQN on MinAtar/Breakout-v1 (a 10x10x4 bool grid)
with its replay in the dense layout (observation and next observation stored whole) and in the shared one
(`SharedObservationReplayBuffer`: each observation once), the same seed, settings and samples (the two train the
same weights, tests/test_frame_replay.py), each run in a fresh process, the order reversed every other pair.

rlspeed picks the shared layout for images only where storing them twice would take 1 GiB or more
(`rlspeed.algos.off_policy._SHARED_OBSERVATIONS_BYTES`); this script forces each layout whatever the size. Measured:
process CPU time and wall time per env step of a learn call after a warm-up call (updates running in both), and
the bytes per transition each layout allocates.

Usage: python benchmarks/replay_layouts.py [--pairs N] [--steps N] [--threads N] [--quick] [--no-write]
"""

from __future__ import annotations

import json
import sys
import time
import warnings

import common

ENV_ID = "MinAtar/Breakout-v1"
# benchmarks/cnn_encoder.py's DQN settings (RL-Zoo's Atari DQN, scaled to MinAtar), its small CNN
SETTINGS = dict(buffer_size=100_000, learning_starts=1_000, train_freq=4, batch_size=32, target_update_interval=1_000,
                learning_rate=1e-4, exploration_fraction=0.1, exploration_final_eps=0.05, gamma=0.99,
                max_grad_norm=10.0, net_arch=(), encoder="cnn")
LAYOUTS = ("dense", "observations")


def worker(layout: str, steps: int, seed: int, threads: int) -> dict:
    """One run in this process: a warm-up learn call past learning_starts, then `steps` timed steps."""
    import minatar.gym

    from rlspeed import DQN
    from rlspeed.algos import off_policy

    warnings.simplefilter("ignore")
    minatar.gym.register_envs()
    common.set_threads(threads)
    off_policy._SHARED_OBSERVATIONS_BYTES = 0  # the shared layout for any size, where frame_dedup is on
    model = DQN(ENV_ID, seed=seed, device="cpu", env_backend="gymnasium", frame_dedup=layout == "observations",
                **SETTINGS)
    model.learn(2 * SETTINGS["learning_starts"], progress_bar=False)
    cpu, wall = time.process_time(), time.perf_counter()
    model.learn(steps, progress_bar=False)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    assert model.buffer.layout == layout, model.buffer.layout
    return {"layout": layout, "cpu_ms_per_step": 1e3 * cpu / steps, "wall_ms_per_step": 1e3 * wall / steps,
            "bytes_per_transition": model.buffer.bytes_per_transition}


def main() -> None:
    parser = common.script_arguments(__doc__)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8_000, help="timed env steps per run")
    parser.add_argument("--worker", nargs=2, metavar=("LAYOUT", "SEED"), help=argparse_hidden())
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker[0], args.steps, int(args.worker[1]), args.threads)))
        return
    if args.quick:
        args.pairs, args.steps = 1, 500
    args.threads = common.set_threads(args.threads)
    load_before = common.uptime()
    runs = []
    for pair in range(args.pairs):
        for layout in (LAYOUTS if pair % 2 == 0 else LAYOUTS[::-1]):
            result = common.run_child(__file__, "--worker", layout, str(pair), "--steps", str(args.steps),
                                      "--threads", str(args.threads), what=f"pair {pair} {layout}")
            result["pair"] = pair
            runs.append(result)
            print(f"  pair {pair} {layout}: {result['cpu_ms_per_step']:.3f} ms CPU, {result['wall_ms_per_step']:.3f} "
                  f"ms wall per step", flush=True)
    load_after = common.uptime()

    def by(layout: str, key: str) -> list[float]:
        return [r[key] for r in runs if r["layout"] == layout]

    def paired(key: str) -> list[float]:
        return [s / d for s, d in zip(by("observations", key), by("dense", key))]

    rows = [[layout, common.fmt(common.spread(by(layout, "cpu_ms_per_step"))["median"], ".3f"),
             common.fmt(common.spread(by(layout, "wall_ms_per_step"))["median"], ".3f"),
             f"{by(layout, 'bytes_per_transition')[0]:,.0f}"] for layout in LAYOUTS]
    cpu_ratios, wall_ratios = paired("cpu_ms_per_step"), paired("wall_ms_per_step")
    lines = ["## Replay layouts for images: stored twice or once (`benchmarks/replay_layouts.py`)", "",
             f"DQN on {ENV_ID} (10x10x4 bool), benchmarks/cnn_encoder.py's settings and CNN, one env, the same seed "
             f"per pair; {args.steps:,} timed env steps per run after a warm-up call of "
             f"{2 * SETTINGS['learning_starts']:,}; each run a fresh process, the order reversed every other pair; "
             f"torch.set_num_threads({args.threads}).", "",
             common.markdown_table(["replay layout", "CPU ms per env step (median)", "wall ms per env step (median)",
                                    "bytes per transition"], rows), "",
             f"Shared / dense per pair: CPU {', '.join(f'{r:.3f}' for r in cpu_ratios)}; wall "
             f"{', '.join(f'{r:.3f}' for r in wall_ratios)}. rlspeed stores images once only where storing them twice "
             "would take 1 GiB or more (DQN's default 1M-transition buffer of MinAtar grids: 0.8 GB, stored twice).",
             "", f"Load (`uptime`) before: `{load_before}`; after: `{load_after}`."]
    machine = common.machine_description(("rlspeed", "torch", "gymnasium", "numpy", "minatar"))
    common.publish("replay_layouts", lines, {"settings": {**SETTINGS, "net_arch": list(SETTINGS["net_arch"]),
                                                          "steps": args.steps, "pairs": args.pairs,
                                                          "threads": args.threads},
                                             "runs": runs}, not args.no_write, machine=machine)


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    sys.exit(main())
