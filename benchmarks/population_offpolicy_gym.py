"""4 SAC Pendulum-v1 agents on Gymnasium's envs (`env_backend="gymnasium"`, the shipped preset's per-agent settings)
trained in one process as a `rlspeed.Population`, against solo `SAC` runs of the same preset on Gymnasium's envs:
total env steps/s of the population over one solo run's, and every member reaching eval >= -200 (stop='each').

    python benchmarks/population_offpolicy_gym.py [--members 4] [--pairs 3] [--throughput-steps 2000] [--no-write]

Throughput: each pair runs one solo run (seed i) and the population, each in a fresh process, one after the other
(alternating, so a slow patch of the shared machine hits both); both train a fixed number of env steps per agent
without evaluation, and the ratio of their steps/s is taken within each pair. Time to target: one population run to
-200 (evaluation every 500 steps per member, 10 deterministic episodes, confirmed; time excludes evaluation) and solo
runs of the same seeds to -200. The machine's load (`uptime`) before and after is recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import publish, set_threads, uptime  # noqa: E402

TARGET = -200.0
ENV_ID = "Pendulum-v1"
BACKEND = "gymnasium"


def _preset() -> tuple[dict, dict]:
    from rlspeed.presets import load_preset, split_run_settings

    return split_run_settings(dict(load_preset("sac", ENV_ID)))


def worker(args: argparse.Namespace) -> dict:
    """One measurement in this process (called with --worker): a solo run or the population."""
    from rlspeed import SAC
    from rlspeed.population import Population

    os.environ["RLSPEED_NUM_THREADS"] = str(args.threads)  # (each model sets its threads from it when built)
    set_threads(args.threads)
    run, hyper = _preset()
    if args.worker == "solo":
        model = SAC(ENV_ID, seed=args.seed, env_backend=BACKEND, **hyper)
        if args.target:
            model.learn(int(run["total_timesteps"]), target_return=TARGET, eval_freq=int(run["eval_freq"]),
                        progress_bar=False)
        else:
            model.learn(args.throughput_steps, progress_bar=False)
        result = model.result
        return {"side": "solo", "seed": args.seed, "env_backend": model.env_backend, "sps": result.sps,
                "train_wall_s": result.train_wall_s, "time_to_target_s": result.time_to_target_s,
                "steps_to_target": result.steps_to_target, "update": model.update_summary()["implementation"]}
    population = Population(SAC, ENV_ID, seeds=range(args.members), env_backend=BACKEND, **hyper)
    if args.target:
        summary = population.learn(int(run["total_timesteps"]), target_return=TARGET,
                                   eval_freq=int(run["eval_freq"]), stop="each")
        return {"side": "population", "summary": summary}
    summary = population.learn(args.throughput_steps)
    return {"side": "population", "members": args.members, "env_backend": population.env_backend,
            "sps": summary["sps"], "train_wall_s": summary["train_wall_s"], "update": population.update_path}


def _run_worker(*flags: str) -> dict:
    out = subprocess.run([sys.executable, __file__, *flags], capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=4)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--throughput-steps", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads of every run, both sides (rlspeed's default: 1)")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--skip-target", action="store_true", help="throughput pairs only")
    parser.add_argument("--skip-solo-target", action="store_true", help="no solo runs to the target")
    parser.add_argument("--worker", choices=("solo", "population"), help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--target", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    set_threads(args.threads)  # (for the machine block: the workers set their own)
    run, hyper = _preset()
    common = ["--members", str(args.members), "--throughput-steps", str(args.throughput_steps), "--threads",
              str(args.threads)]
    load_before = uptime()
    pairs = []
    for i in range(args.pairs):
        solo = _run_worker("--worker", "solo", "--seed", str(i), *common)
        population = _run_worker("--worker", "population", *common)
        pairs.append({"solo": solo, "population": population, "ratio": population["sps"] / solo["sps"]})
        print(f"pair {i}: solo {solo['sps']:,.0f} sps, population {population['sps']:,.0f} sps "
              f"({pairs[-1]['ratio']:.2f}x)", flush=True)
    load_middle = uptime()
    target_population, target_solos = None, []
    if not args.skip_target:
        target_population = _run_worker("--worker", "population", "--target", *common)["summary"]
        print(f"population to {TARGET}: {target_population['reached']}/{args.members} reached, "
              f"{target_population['train_wall_s']:.1f} s", flush=True)
        for seed in ([] if args.skip_solo_target else range(args.members)):
            target_solos.append(_run_worker("--worker", "solo", "--seed", str(seed), "--target", *common))
            print(f"solo seed {seed} to {TARGET}: {target_solos[-1]['time_to_target_s']} s, "
                  f"{target_solos[-1]['steps_to_target']} steps", flush=True)
    load_after = uptime()
    ratios = [p["ratio"] for p in pairs]
    lines = [
        f"{args.members} SAC {ENV_ID} members (seeds 0-{args.members - 1}) on Gymnasium's envs "
        f"(`env_backend=\"{BACKEND}\"`, one synchronous vector env of {args.members} x {hyper['num_envs']} envs) at "
        f"the shipped preset's per-agent settings ({hyper['num_envs']} envs, {hyper['gradient_steps']} gradient steps "
        f"of batches of {hyper['batch_size']} per env step of all envs, net_arch {hyper['net_arch']}), trained as one "
        f"`rlspeed.Population`, against solo `SAC` runs of the same preset on Gymnasium's envs, "
        f"torch.set_num_threads({args.threads}) on both sides. Throughput: {args.throughput_steps:,} env steps per "
        f"agent without evaluation, solo and population alternating in fresh processes, {args.pairs} pairs.",
        "",
        "| | value |",
        "|---|---|",
        f"| population total env steps/s / solo env steps/s, per pair | "
        f"{', '.join(f'{r:.2f}x' for r in ratios)} (median {statistics.median(ratios):.2f}x) |",
        f"| solo env steps/s (median) | {statistics.median(p['solo']['sps'] for p in pairs):,.0f} |",
        f"| population total env steps/s (median) | {statistics.median(p['population']['sps'] for p in pairs):,.0f} |",
        f"| update implementation: population, solo | {pairs[0]['population']['update']}, "
        f"{pairs[0]['solo']['update']} |",
    ]
    if target_population is not None:
        members = target_population["members"]
        lines += [
            f"| members reaching eval >= {TARGET:.0f} (stop='each') | {target_population['reached']} / "
            f"{args.members} |",
            "| members' steps to target (seeds 0, 1, ...) | "
            + ", ".join(f"{m['steps_to_target']:,}" if m["steps_to_target"] is not None else "not reached"
                        for m in members) + " |",
            f"| population wall time (training clock) to the last member reaching it | "
            f"{target_population['train_wall_s']:.1f} s |",
        ]
        if target_solos:
            times = [s["time_to_target_s"] for s in target_solos]
            lines += [
                "| solo steps to target (same seeds) | "
                + ", ".join(f"{s['steps_to_target']:,}" if s["steps_to_target"] is not None else "not reached"
                            for s in target_solos) + " |",
                "| solo time to target (same seeds) | "
                + ", ".join(f"{t:.1f} s" if t is not None else "not reached" for t in times) + " |",
            ]
            if all(t is not None for t in times):
                lines.append(f"| population wall time / sum of the solo times | "
                             f"{target_population['train_wall_s'] / sum(times):.2f} |")
    lines += ["", f"Load (`uptime`) before: `{load_before}`; after the pairs: `{load_middle}`; after: `{load_after}`."]
    publish("population_offpolicy_gym", lines,
            {"pairs": pairs, "target_population": target_population, "target_solos": target_solos,
             "uptime_before": load_before, "uptime_middle": load_middle, "uptime_after": load_after},
            write=not args.no_write)


if __name__ == "__main__":
    main()
