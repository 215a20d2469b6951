"""32 PPO CartPole-v1 agents (seeds 0-31, the shipped preset) trained in one process as a `rlspeed.Population`,
against solo runs of the same preset: how many members reach eval >= 475, the population's wall time to the last
member reaching it, one solo agent's median time to 475 over a few seeds (run in this script), and total env steps/s.

    python benchmarks/population.py [--members 32] [--solo-seeds 0 1 2 3 4] [--no-write]

Times exclude evaluation (as `PPO.learn` does). The machine's load (`uptime`) before and after is recorded: other
processes share the cores, so the ratio of two measurements in this one run is what to read.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import publish  # noqa: E402

from rlspeed import PPO  # noqa: E402
from rlspeed.population import Population  # noqa: E402
from rlspeed.presets import load_preset, split_run_settings  # noqa: E402

TARGET = 475.0


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=32)
    parser.add_argument("--solo-seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    run, hyper = split_run_settings(dict(load_preset("ppo", "CartPole-v1")))
    total, eval_freq = int(run["total_timesteps"]), int(run["eval_freq"])
    load_before = uptime()
    solos = []
    for seed in args.solo_seeds:
        model = PPO("CartPole-v1", seed=seed, env_backend="torch", **hyper)
        model.learn(total, target_return=TARGET, eval_freq=eval_freq, progress_bar=False)
        result = model.result
        solos.append({"seed": seed, "time_to_target_s": result.time_to_target_s,
                      "steps_to_target": result.steps_to_target, "train_wall_s": result.train_wall_s,
                      "sps": result.sps})
        print(f"solo seed {seed}: {solos[-1]}", flush=True)
    population = Population(PPO, "CartPole-v1", seeds=range(args.members), **hyper)
    summary = population.learn(total, target_return=TARGET, eval_freq=eval_freq, stop="each")
    load_after = uptime()
    solo_times = [s["time_to_target_s"] for s in solos if s["time_to_target_s"] is not None]
    solo_median = statistics.median(solo_times) if solo_times else None
    solo_steps = [s["steps_to_target"] for s in solos if s["steps_to_target"] is not None]
    population_steps = [m["steps_to_target"] for m in summary["members"] if m["steps_to_target"] is not None]
    ratio = summary["train_wall_s"] / solo_median if solo_median else None
    lines = [
        f"{args.members} PPO CartPole-v1 members (seeds 0-{args.members - 1}, shipped preset: "
        f"{hyper['num_envs']} envs x {hyper['num_steps']} steps each, eval every {eval_freq} steps per member, "
        "10 deterministic episodes, confirmed) trained as one `rlspeed.Population` (stop='each': a member that "
        "reached 475 freezes), against solo `PPO` runs of the same preset in the same script.",
        "",
        "| | value |",
        "|---|---|",
        f"| members reaching eval >= 475 | {summary['reached']} / {args.members} |",
        f"| population wall time (training clock) until the last member reached it or the budget ended | "
        f"{summary['train_wall_s']:.1f} s |",
        f"| solo median time to 475 (seeds {', '.join(map(str, args.solo_seeds))}; {len(solo_times)} reached) | "
        + (f"{solo_median:.2f} s |" if solo_median else "not reached |"),
        "| population wall time / solo median time | " + (f"{ratio:.1f}x |" if ratio else "- |"),
        f"| population total env steps/s (all members) | {summary['sps']:,.0f} |",
        "| solo env steps/s (median) | " + f"{statistics.median(s['sps'] for s in solos):,.0f} |",
        f"| steps to 475, population: median / IQR | {_median_iqr(population_steps)} |",
        f"| steps to 475, solo runs: median / IQR | {_median_iqr(solo_steps)} |",
        f"| final eval IQM [95% CI] | {summary['aggregate']['final_eval']['iqm']:.1f} "
        f"{[round(v, 1) for v in summary['aggregate']['final_eval']['iqm_ci']]} |",
        "",
        f"Load (`uptime`) before: `{load_before}`; after: `{load_after}`.",
    ]
    publish("population", lines, {"solo": solos, "population": summary, "uptime_before": load_before,
                                  "uptime_after": load_after}, write=not args.no_write)


def _median_iqr(values: list) -> str:
    if not values:
        return "none reached"
    if len(values) < 2:
        return f"{values[0]:,} / -"
    quartiles = statistics.quantiles(values, n=4)
    return f"{statistics.median(values):,.0f} / {quartiles[0]:,.0f}-{quartiles[2]:,.0f}"


if __name__ == "__main__":
    main()
