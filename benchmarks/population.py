"""32 PPO CartPole-v1 agents (seeds 0-31, the shipped preset) trained in one process as a `rlspeed.Population`,
against solo runs of the same preset and Stable-Baselines3 at RL-Zoo's CartPole settings, all in this one script:

* how many members reach eval >= 475, and the population's training time until the last one has;
* one solo agent's median time to 475 (seeds 0-4, and over every solo seed run);
* steps to 475 over the members against as many solo runs (seeds 0 .. --solo-seeds - 1): medians and IQRs;
* 32 sequential SB3 runs, estimated as 32 x the mean time to 475 of a few SB3 seeds run between the solo runs
  (scaled, not run 32 times).

    python benchmarks/population.py [--members 32] [--solo-seeds 32] [--sb3-seeds 3] [--quick] [--no-write]

Times exclude evaluation (as `PPO.learn` and the SB3 callback of common.py do). torch.set_num_threads(1) for
every run. The machine's load (`uptime`) is recorded at each phase: other processes share the cores, so wall times
swing with their load; the training CPU time of this process (rlspeed runs; evaluations excluded) is reported
beside them, as the measure that others' load moves least.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
from common import publish  # noqa: E402

from rlspeed import PPO  # noqa: E402
from rlspeed.population import Population  # noqa: E402
from rlspeed.presets import load_preset, split_run_settings  # noqa: E402

ENV_ID = "CartPole-v1"
TARGET = 475.0
EVAL_EPISODES = 10
SB3_BUDGET = 100_000  # RL-Zoo's n_timesteps for PPO CartPole-v1


def solo_run(seed: int, total: int, eval_freq: int, hyper: dict) -> dict:
    model = PPO(ENV_ID, seed=seed, env_backend="torch", **hyper)
    evaluate, eval_cpu = model.evaluate, [0.0]

    def timed_evaluate(*args, **kwargs):  # (its CPU time is taken out, as the population's is)
        started = time.process_time()
        try:
            return evaluate(*args, **kwargs)
        finally:
            eval_cpu[0] += time.process_time() - started

    model.evaluate = timed_evaluate
    cpu_start = time.process_time()
    model.learn(total, target_return=TARGET, eval_freq=eval_freq, eval_episodes=EVAL_EPISODES, progress_bar=False)
    train_cpu_s = time.process_time() - cpu_start - eval_cpu[0]
    result = model.result
    return {"seed": seed, "time_to_target_s": result.time_to_target_s, "steps_to_target": result.steps_to_target,
            "train_wall_s": result.train_wall_s, "sps": result.sps, "train_cpu_s": train_cpu_s}


def sb3_run(seed: int, eval_freq: int) -> dict:
    from ppo_cartpole import EVAL_SEED_OFFSET, ZOO_NUM_ENVS, zoo_sb3_kwargs
    from stable_baselines3 import PPO as SB3PPO
    from stable_baselines3.common.env_util import make_vec_env

    env = make_vec_env(ENV_ID, n_envs=ZOO_NUM_ENVS, seed=seed)
    eval_env = make_vec_env(ENV_ID, n_envs=EVAL_EPISODES, seed=seed + EVAL_SEED_OFFSET)
    model = SB3PPO("MlpPolicy", env, device="cpu", seed=seed, **zoo_sb3_kwargs())
    record = common.sb3_time_to_target(model, env, eval_env, SB3_BUDGET, eval_freq, seed, TARGET,
                                       EVAL_EPISODES, threads=1)
    return {"seed": seed, **{key: record[key] for key in ("reached", "time_to_target_s", "steps_to_target",
                                                          "train_wall_s")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=32)
    parser.add_argument("--solo-seeds", type=int, default=32, help="solo runs of seeds 0 .. N-1 (at least 5)")
    parser.add_argument("--sb3-seeds", type=int, default=3, help="SB3 runs (seeds 0 .. N-1), between the solo runs")
    parser.add_argument("--quick", action="store_true", help="smoke run: 4 members, 5 solo seeds, 1 SB3 seed")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    if args.quick:
        common.quick_settings(args, members=4, solo_seeds=5, sb3_seeds=1)
    common.set_threads(1)
    run, hyper = split_run_settings(dict(load_preset("ppo", ENV_ID)))
    total, eval_freq = int(run["total_timesteps"]), int(run["eval_freq"])
    load = {"before": common.uptime()}

    population = Population(PPO, ENV_ID, seeds=range(args.members), **hyper)
    summary = population.learn(total, target_return=TARGET, eval_freq=eval_freq, eval_episodes=EVAL_EPISODES,
                               stop="each")
    print(f"population: {summary['reached']}/{args.members} reached, {summary['train_wall_s']:.1f} s", flush=True)
    load["after_population"] = common.uptime()

    solos, sb3 = [], []
    for seed in range(max(args.solo_seeds, 5)):
        solos.append(solo_run(seed, total, eval_freq, hyper))
        print(f"solo seed {seed}: {solos[-1]}", flush=True)
        if seed < args.sb3_seeds:  # (side by side with the solo runs, under the same load)
            sb3.append(sb3_run(seed, eval_freq))
            print(f"sb3 seed {seed}: {sb3[-1]}", flush=True)
    load["after"] = common.uptime()

    first_five = [s["time_to_target_s"] for s in solos[:5] if s["time_to_target_s"] is not None]
    solo_cpu_median = statistics.median(s["train_cpu_s"] for s in solos[:5])
    solo_median = statistics.median(first_five) if first_five else None
    all_times = [s["time_to_target_s"] for s in solos if s["time_to_target_s"] is not None]
    solo_median_all = statistics.median(all_times) if all_times else None
    solo_steps = [s["steps_to_target"] for s in solos if s["steps_to_target"] is not None]
    member_steps = [m["steps_to_target"] for m in summary["members"] if m["steps_to_target"] is not None]
    sb3_times = [s["time_to_target_s"] for s in sb3 if s["time_to_target_s"] is not None]
    sb3_sequential = args.members * statistics.mean(sb3_times) if sb3_times else None
    wall = summary["train_wall_s"]
    last = max(member_steps) if member_steps else None
    lines = [
        f"{args.members} PPO CartPole-v1 members (seeds 0-{args.members - 1}, shipped preset: {hyper['num_envs']} "
        f"envs x {hyper['num_steps']} steps each, eval every {eval_freq} steps per member, {EVAL_EPISODES} "
        "deterministic episodes, confirmed) trained as one `rlspeed.Population` (stop='each': a member that reached "
        "475 leaves the computation), against solo `PPO` runs of the same preset and Stable-Baselines3 PPO at "
        "RL-Zoo's CartPole settings, all in one script (`benchmarks/population.py`), torch.set_num_threads(1).",
        "",
        "| | value |",
        "|---|---|",
        f"| members reaching eval >= 475 | {summary['reached']} / {args.members} |",
        f"| population training time until the last member reached 475 (at {last:,} steps) | {wall:.1f} s |"
        if last else f"| population training time (budget ended) | {wall:.1f} s |",
        f"| population training CPU time (this process, evaluations excluded) | {summary['train_cpu_s']:.1f} s |",
        f"| solo median training CPU time to 475, seeds 0-4 / 0-{len(solos) - 1} | {solo_cpu_median:.2f} s / "
        f"{statistics.median(s['train_cpu_s'] for s in solos):.2f} s |",
        "| population CPU time / solo median CPU time (seeds 0-4) | "
        + common.fmt_ratio(common.ratio(summary["train_cpu_s"], solo_cpu_median)) + " |",
        f"| {len(solos)} solo runs one after another: sum of times to 475 / of training CPU times | "
        f"{sum(all_times):.1f} s / {sum(s['train_cpu_s'] for s in solos):.1f} s |",
        f"| solo median time to 475, seeds 0-4 ({len(first_five)} reached) | "
        + common.fmt(solo_median, ".2f") + " s |",
        f"| solo median time to 475, seeds 0-{len(solos) - 1} ({len(all_times)} reached) | "
        + common.fmt(solo_median_all, ".2f") + " s |",
        "| population time / solo median (seeds 0-4) | " + common.fmt_ratio(common.ratio(wall, solo_median)) + " |",
        f"| SB3 (RL-Zoo settings) time to 475, seeds 0-{len(sb3) - 1} | "
        + ", ".join(common.fmt(s["time_to_target_s"], ".2f") for s in sb3) + " s |",
        f"| {args.members} sequential SB3 runs, **scaled**: {args.members} x mean of those | "
        + common.fmt(sb3_sequential, ".1f") + " s |",
        "| scaled SB3 sequential / population | " + common.fmt_ratio(common.ratio(sb3_sequential, wall)) + " |",
        f"| population total env steps/s (all members) | {summary['sps']:,.0f} |",
        "| solo env steps/s (median) | " + f"{statistics.median(s['sps'] for s in solos):,.0f} |",
        f"| steps to 475, {len(member_steps)} members: median / IQR | {_median_iqr(member_steps)} |",
        f"| steps to 475, {len(solo_steps)} solo runs: median / IQR | {_median_iqr(solo_steps)} |",
        f"| final eval IQM [95% CI] | {summary['aggregate']['final_eval']['iqm']:.1f} "
        f"{[round(v, 1) for v in summary['aggregate']['final_eval']['iqm_ci']]} |",
        "",
        "Load (`uptime`): " + "; ".join(f"{phase}: `{value}`" for phase, value in load.items()) + ".",
    ]
    publish("population", lines, {"population": summary, "solo": solos,
                                  "sb3": sb3, "sb3_sequential_scaled_s": sb3_sequential, "uptime": load},
            write=not args.no_write)


def _median_iqr(values: list) -> str:
    if not values:
        return "none reached"
    if len(values) < 2:
        return f"{values[0]:,} / -"
    quartiles = statistics.quantiles(values, n=4)
    return f"{statistics.median(values):,.0f} / {quartiles[0]:,.0f}-{quartiles[2]:,.0f}"


if __name__ == "__main__":
    main()
