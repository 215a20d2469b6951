"""16 SAC Pendulum-v1 agents (seeds 0-15, the shipped preset's per-agent settings) trained in one process as a
`rlspeed.Population`, against solo `SAC` runs of the same preset on the same env backend: total env steps/s of the
population over one solo run's, every member reaching eval >= -200 (stop='each'), and the cost of one population
update.

    python benchmarks/population_offpolicy.py [--members 16] [--pairs 3] [--throughput-steps 3000] [--no-write]
    python benchmarks/population_offpolicy.py --env-backend gymnasium --members 4 --throughput-steps 2000 \
        --solo-seeds 0 1 2 3 --scaling

rlspeed's native Pendulum (`--env-backend torch`, the default) writes the section `population_offpolicy`;
Gymnasium's envs (the population's: one synchronous vector env of members x envs) `population_offpolicy_gym`.

Throughput: each pair runs one solo run (seed i) and the population, each in a fresh process, one after the other,
the order reversed every other pair (so a slow patch of the shared machine hits both); both train a fixed number of
env steps per agent without evaluation, and the ratio of their steps/s is taken within each pair. Time to target:
one population run to -200 (evaluation every 500 steps per member, 10 deterministic episodes, confirmed; time
excludes evaluation, as `SAC.learn` does) and solo runs of a few seeds to -200. The machine's load (`uptime`)
before and after is recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import publish, run_child, set_threads, uptime  # noqa: E402

TARGET = -200.0
ENV_ID = "Pendulum-v1"


def _preset() -> tuple[dict, dict]:
    from rlspeed.presets import load_preset, split_run_settings

    return split_run_settings(dict(load_preset("sac", ENV_ID)))


def worker(args: argparse.Namespace) -> dict:
    """One measurement in this process (called with --worker): a solo run or the population."""
    import torch

    from rlspeed import SAC
    from rlspeed.population import Population

    os.environ["RLSPEED_NUM_THREADS"] = str(args.threads)  # (each model builds and trains with it)
    set_threads(args.threads)
    run, hyper = _preset()
    cpu_start = time.process_time()
    if args.worker == "solo":
        model = SAC(ENV_ID, seed=args.seed, env_backend=args.env_backend, **hyper)
        if args.target:
            model.learn(int(run["total_timesteps"]), target_return=TARGET, eval_freq=int(run["eval_freq"]),
                        progress_bar=False)
        else:
            model.learn(args.throughput_steps, progress_bar=False)
        result = model.result
        process_cpu_s = time.process_time() - cpu_start
        # one update (2 per iteration in this preset), timed on its own after the run
        batch = model.buffer.sample(hyper["batch_size"])
        for _ in range(5):
            model._update(batch)
        cpu, count = time.process_time(), 40
        for _ in range(count):
            model._update(batch)
        return {"side": "solo", "seed": args.seed, "sps": result.sps, "train_wall_s": result.train_wall_s,
                "process_cpu_s": process_cpu_s, "update_cpu_ms": (time.process_time() - cpu) / count * 1e3,
                "time_to_target_s": result.time_to_target_s, "steps_to_target": result.steps_to_target,
                "update": model.update_summary()}
    population = Population(SAC, ENV_ID, seeds=range(args.members), env_backend=args.env_backend, **hyper)
    if args.target:
        summary = population.learn(int(run["total_timesteps"]), target_return=TARGET,
                                   eval_freq=int(run["eval_freq"]), stop="each")
        return {"side": "population", "summary": summary}
    summary = population.learn(args.throughput_steps)
    process_cpu_s = time.process_time() - cpu_start
    # one update of all members (2 of them per iteration in this preset), timed on its own after the run
    cfg, batch_size = population.config, population.config.batch_size
    index = torch.randint(0, len(population.buffer), (args.members, batch_size))
    batch = population.buffer.sample(index)
    for _ in range(5):
        population._update(batch)
    start, cpu, count = time.perf_counter(), time.process_time(), 40
    for _ in range(count):
        population._update(batch)
    update_ms = (time.perf_counter() - start) / count * 1e3
    update_cpu_ms = (time.process_time() - cpu) / count * 1e3
    return {"side": "population", "members": args.members, "sps": summary["sps"], "process_cpu_s": process_cpu_s,
            "update_cpu_ms": update_cpu_ms,
            "train_wall_s": summary["train_wall_s"], "update_ms": update_ms, "gradient_steps": cfg.gradient_steps,
            "update": population.update_path}


def _run_worker(*flags: str) -> dict:
    return run_child(__file__, *flags, what=" ".join(flags[:4]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=16)
    parser.add_argument("--env-backend", choices=("torch", "gymnasium"), default="torch",
                        help="both sides' envs: rlspeed's native Pendulum or Gymnasium's")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--throughput-steps", type=int, default=3000)
    parser.add_argument("--solo-seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads of every run, both sides (rlspeed's default: 1)")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--skip-target", action="store_true", help="throughput pairs only")
    parser.add_argument("--scaling", type=int, nargs="*", default=[1, 4, 16, 32],
                        help="population sizes whose update cost is measured (fresh process each, short runs)")
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
              str(args.threads), "--env-backend", args.env_backend]
    load_before = uptime()
    pairs = []
    for i in range(args.pairs):
        # (the order is reversed every other pair: a machine that slows or speeds up during a pair hits both sides)
        sides = ("solo", "population") if i % 2 == 0 else ("population", "solo")
        runs = {side: _run_worker("--worker", side, *(("--seed", str(i)) if side == "solo" else ()), *common)
                for side in sides}
        solo, population = runs["solo"], runs["population"]
        # process CPU time per env step (construction and the isolated update timing excluded from neither side's
        # learn: the solo process's CPU time is its whole run, the population's up to the end of learn)
        cpu_ratio = (solo["process_cpu_s"] / args.throughput_steps) / (population["process_cpu_s"]
                                                                         / (args.throughput_steps * args.members))
        pairs.append({"solo": solo, "population": population, "ratio": population["sps"] / solo["sps"],
                      "cpu_ratio": cpu_ratio})
        print(f"pair {i}: solo {solo['sps']:,.0f} sps, population {population['sps']:,.0f} sps "
              f"({pairs[-1]['ratio']:.2f}x), update {population['update_ms']:.1f} ms", flush=True)
    target_population, target_solos = None, []
    if not args.skip_target:
        target_population = _run_worker("--worker", "population", "--target", *common)["summary"]
        print(f"population to {TARGET}: {target_population['reached']}/{args.members} reached, "
              f"{target_population['train_wall_s']:.1f} s", flush=True)
        for seed in args.solo_seeds:
            target_solos.append(_run_worker("--worker", "solo", "--seed", str(seed), "--target", *common))
            print(f"solo seed {seed} to {TARGET}: {target_solos[-1]['time_to_target_s']} s", flush=True)
    scaling = []
    for members in args.scaling:
        flags = ["--members", str(members), "--throughput-steps", "600", "--threads", str(args.threads),
                 "--env-backend", args.env_backend]
        scaling.append(_run_worker("--worker", "population", *flags))
        print(f"{members} members: update {scaling[-1]['update_cpu_ms']:.2f} ms CPU", flush=True)
    load_after = uptime()
    ratios = [p["ratio"] for p in pairs]
    cpu_ratios = [p["cpu_ratio"] for p in pairs]
    update_ms = statistics.median(p["population"]["update_ms"] for p in pairs)
    update_cpu_ms = statistics.median(p["population"]["update_cpu_ms"] for p in pairs)
    per_iteration = hyper["num_envs"] * hyper["train_freq"]
    gymnasium = args.env_backend == "gymnasium"
    envs = (f"Gymnasium's envs (`env_backend=\"gymnasium\"`; the population's are one synchronous vector env of "
            f"{args.members} x {hyper['num_envs']} envs)" if gymnasium else "rlspeed's native envs")
    lines = [
        f"## SAC populations against solo runs on {'Gymnasium' if gymnasium else 'native'} envs "
        f"(`benchmarks/population_offpolicy.py{' --env-backend gymnasium' if gymnasium else ''}`)", "",
        f"{args.members} SAC {ENV_ID} members (seeds 0-{args.members - 1}) on {envs}, at the shipped preset's "
        f"per-agent settings ({hyper['num_envs']} envs, {hyper['gradient_steps']} gradient steps of batches of "
        f"{hyper['batch_size']} per env step of all envs, net_arch {hyper['net_arch']}, {hyper['n_step']}-step "
        "returns) trained as one `rlspeed.Population`, against solo `SAC` runs of the same preset on the same envs, "
        f"torch.set_num_threads({args.threads}) on both sides. Throughput: "
        f"{args.throughput_steps:,} env steps per agent without evaluation, solo and population alternating in fresh "
        f"processes, {args.pairs} pairs.",
        "",
        "| | value |",
        "|---|---|",
        f"| population total env steps/s / solo env steps/s, per pair | "
        f"{', '.join(f'{r:.2f}x' for r in ratios)} (median {statistics.median(ratios):.2f}x; target >= 6x) |",
        f"| the same from process CPU time per env step (construction included on both sides) | "
        f"{', '.join(f'{r:.2f}x' for r in cpu_ratios)} (median {statistics.median(cpu_ratios):.2f}x) |",
        f"| solo env steps/s (median) | {statistics.median(p['solo']['sps'] for p in pairs):,.0f} |",
        f"| population total env steps/s (median) | {statistics.median(p['population']['sps'] for p in pairs):,.0f} |",
        f"| one update of all {args.members} members (median over pairs) | {update_ms:.1f} ms wall, "
        f"{update_cpu_ms:.1f} ms process CPU "
        f"({hyper['gradient_steps']} per {per_iteration} env steps per member) |",
        f"| population update implementation | {pairs[0]['population']['update']} |",
        f"| solo update implementation | {pairs[0]['solo']['update']['implementation']} |",
    ]
    if target_population is not None:
        steps = [m["steps_to_target"] for m in target_population["members"] if m["steps_to_target"] is not None]
        solo_times = [s["time_to_target_s"] for s in target_solos if s["time_to_target_s"] is not None]
        lines += [
            f"| members reaching eval >= {TARGET:.0f} (stop='each') | {target_population['reached']} / "
            f"{args.members} |",
            f"| population wall time (training clock) to the last member reaching it | "
            f"{target_population['train_wall_s']:.1f} s |",
            f"| population total env steps/s in that run | {target_population['sps']:,.0f} |",
            "| steps to target, members: median (min-max) | "
            + (f"{statistics.median(steps):,.0f} ({min(steps):,}-{max(steps):,}) |" if steps else "none |"),
            f"| solo time to target, seeds {', '.join(map(str, args.solo_seeds))} | "
            + ", ".join(f"{t:.1f} s" if t is not None else "not reached" for t in
                        (s["time_to_target_s"] for s in target_solos)) + " |",
            f"| population wall time / ({args.members} x solo median time) | "
            + (f"{target_population['train_wall_s'] / (args.members * statistics.median(solo_times)):.2f} |"
               if solo_times else "- |"),
        ]
    if scaling:
        solo_update = statistics.median(p["solo"]["update_cpu_ms"] for p in pairs)
        lines += [
            "",
            "Cost of one update by population size (process CPU time of 40 updates on one batch after a 600-step run, "
            "fresh process each), against one solo run's update (median over the pairs above: "
            f"{solo_update:.2f} ms):",
            "",
            "| members | update, ms CPU | per member, ms | solo update / per-member cost |",
            "|---|---|---|---|",
            *(f"| {run['members']} | {run['update_cpu_ms']:.2f} | {run['update_cpu_ms'] / run['members']:.3f} | "
              f"{solo_update / (run['update_cpu_ms'] / run['members']):.2f}x |" for run in scaling),
        ]
    lines += ["", f"Load (`uptime`) before: `{load_before}`; after: `{load_after}`."]
    publish("population_offpolicy_gym" if gymnasium else "population_offpolicy", lines,
            {"pairs": pairs, "target_population": target_population, "target_solos": target_solos, "scaling": scaling,
             "uptime_before": load_before, "uptime_after": load_after}, write=not args.no_write)


if __name__ == "__main__":
    main()
