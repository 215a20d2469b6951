"""Evaluations on Gymnasium's in-process envs with and without finished rows resting (`GymnasiumEnv.rest_rows`):
16 untrained PPO members x 10 episodes of CartPole-v1 (episode lengths vary) and Pendulum-v1 (all 200 steps), as
`rlspeed eval RUN_DIR` plays them: as one batch (`Population.evaluate`) and one member at a time
(`model.evaluate`), each with every row stepping until the last first episode ends and with finished rows resting.

    python benchmarks/evaluation_rows.py [--rounds 5] [--threads 1] [--no-write]

Reports this process's CPU time per evaluation (median of alternating rounds; the machine's load beside it: others
share the cores) and checks that every way plays the same episodes (returns and lengths); writes its section of
benchmarks/README.md and results/evaluation_rows.json (not with --no-write).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics

import common
import torch
from common import publish

from rlspeed import PPO
from rlspeed.envs import gymnasium_env
from rlspeed.population import _population_of_models

MEMBERS, EPISODES = 16, 10
#: the four ways an evaluation is played, in the table's order
WAYS = ("batch, every row", "batch, finished rows rest", "one at a time, every row",
        "one at a time, finished rows rest")


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the command line's default: 1)")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load = {"before": common.uptime()}
    results = {env_id: compare(env_id, args.rounds, args.threads) for env_id in ("CartPole-v1", "Pendulum-v1")}
    load["after"] = common.uptime()
    lines = [
        "## Evaluations with finished rows resting (`benchmarks/evaluation_rows.py`)",
        "",
        f"{MEMBERS} untrained PPO members x {EPISODES} episodes on Gymnasium's in-process envs, as `rlspeed eval "
        "RUN_DIR` plays them: as one batch (`Population.evaluate`) and one member at a time (`model.evaluate`), with "
        "every row stepping until the last first episode ends and with finished rows resting "
        f"(`GymnasiumEnv.rest_rows`); this process's CPU seconds, median (min-max) of {args.rounds} alternating "
        f"rounds, torch.set_num_threads({args.threads}); every way plays the same episodes (checked each round).",
        "",
        "| env (episode lengths) | " + " | ".join(WAYS) + " |",
        "|---|" + "---|" * len(WAYS),
    ]
    for env_id, result in results.items():
        lines.append(f"| {env_id} (mean {result['length_mean']:.1f}, max {result['length_max']}) | " + " | ".join(
            f"{statistics.median(result['cpu_s'][way]):.2f} ({min(result['cpu_s'][way]):.2f}-"
            f"{max(result['cpu_s'][way]):.2f})" for way in WAYS) + " |")
    lines += ["", f"Load (`uptime`): before: `{load['before']}`; after: `{load['after']}`."]
    publish("evaluation_rows", lines, {"results": results, "load": load, "settings": vars(args)},
            write=not args.no_write)


def compare(env_id: str, rounds: int, threads: int) -> dict:
    """The four ways' CPU times on `env_id` over `rounds` alternating rounds (printed too), with the episodes'
    lengths; AssertionError where a way played other episodes than every row one at a time."""
    resting_rows_env = gymnasium_env.resting_rows_env
    models = [PPO(env_id, seed=seed, device="cpu", num_envs=2, env_backend="gymnasium", verbose=0)
              for seed in range(MEMBERS)]
    seeds = [100 + seed for seed in range(MEMBERS)]
    population = _population_of_models(models, [model._state_tensors() for model in models])

    def batch():
        population.evaluate(seeds=seeds, episodes=EPISODES)
        played = population.last_episodes
        return [(played["returns"][k], played["lengths"][k]) for k in range(MEMBERS)]

    def alone():
        return [(result["returns"], result["lengths"])
                for result in (model.evaluate(episodes=EPISODES, seed=seed) for model, seed in zip(models, seeds))]

    ways = {f"{name}, {rows}": (play, rest) for name, play in (("batch", batch), ("one at a time", alone))
            for rows, rest in (("every row", False), ("finished rows rest", True))}
    times: dict[str, list[float]] = {way: [] for way in ways}
    played: dict[str, list] = {}
    for round_ in range(rounds):
        for way in (list(ways) if round_ % 2 == 0 else list(reversed(ways))):
            play, rest = ways[way]
            gymnasium_env.resting_rows_env = resting_rows_env if rest else (lambda env: None)
            start = cpu_s()
            played.setdefault(way, []).append(play())
            times[way].append(cpu_s() - start)
    gymnasium_env.resting_rows_env = resting_rows_env
    reference = played["one at a time, every row"][0]
    lengths = [length for _, each in reference for length in each]
    print(f"{env_id}: {MEMBERS} members x {EPISODES} episodes, lengths mean {statistics.mean(lengths):.1f} max "
          f"{max(lengths)}; load {os.getloadavg()[0]:.1f}; torch threads {threads}")
    for way in ways:
        same = all(result == reference for result in played[way])
        print(f"  {way:32s} CPU s median {statistics.median(times[way]):.2f} "
              f"({' '.join(f'{t:.2f}' for t in times[way])}); same episodes: {same}")
        assert same, f"{env_id}: '{way}' played other episodes than one at a time with every row stepping"
    return {"cpu_s": times, "length_mean": statistics.mean(lengths), "length_max": max(lengths)}


if __name__ == "__main__":
    main()
