"""The populations' Adam step: torch's fused kernel member by member against the flat formula over every member at
once, on the shipped presets' populations, the time of one step of each (what `FUSED_ADAM_MIN_PARAMS` in
rlspeed/population/offpolicy.py and `PPOPopulation._fused_adam` choose between).

    python benchmarks/member_adam.py [--steps 200] [--no-write]

Each case builds the population, fills the gradients with normal noise and times `--steps` steps of each path
alternately in 3 rounds (the median round), in one process, torch.set_num_threads(1). The parameters stay in cache
between steps here, unlike in training, where the forward and backward passes come between: the flat formula's
temporaries cost more there, so these figures favour it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

CASES = [  # (algorithm, env id, members, extra hyperparameters)
    ("sac", "Pendulum-v1", 16, {}),
    ("td3", "Pendulum-v1", 16, {}),
    ("dqn", "CartPole-v1", 16, {}),
    ("dqn", "MinAtar/Breakout-v1", 4, {"learning_starts": 1000}),
    ("ppo", "CartPole-v1", 32, {}),
    ("ppo", "MinAtar/Breakout-v1", 4, {"normalize_obs": False}),
]


def timed(step, steps: int) -> float:
    """Milliseconds per call of `step`, over `steps` calls after 5 untimed ones."""
    for _ in range(5):
        step()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - started) / steps * 1e3


def measure(algo: str, env_id: str, members: int, extra: dict, steps: int) -> list[dict]:
    """Per Adam of the population: parameters per member and the median ms per step of each path."""
    import torch

    import rlspeed
    from rlspeed.population import Population
    from rlspeed.presets import load_preset, split_run_settings

    _run, hyper = split_run_settings(dict(load_preset(algo, env_id)))
    population = Population(getattr(rlspeed, algo.upper()), env_id, seeds=range(members), **{**hyper, **extra})
    rows = []
    if algo == "ppo":
        grads = [torch.randn_like(p) for p in population.params]
        learning_rate = population.hyper["learning_rate"]

        def switch(fused: bool):
            population._fused_adam = fused
            return lambda: population._optimizer_step(grads, learning_rate)

        per_member = sum(p[0].numel() for p in population.params)
        rows.append(("_optimizer_step", per_member, switch))
    else:
        for name in population._adams:
            adam = getattr(population, name)
            adam.grad.normal_()
            adam._member_lrs = population.hyper["learning_rate"].tolist()

            def switch(fused: bool, adam=adam):
                adam.fused = fused
                return adam.step

            rows.append((name, adam.offsets[-1] // members, switch))
    results = []
    for name, per_member, switch in rows:
        rounds = {True: [], False: []}
        for _ in range(3):
            for fused in (False, True):
                rounds[fused].append(timed(switch(fused), steps))
        results.append({"algo": algo, "env_id": env_id, "members": members, "adam": name,
                        "params_per_member": per_member, "flat_ms": statistics.median(rounds[False]),
                        "fused_ms": statistics.median(rounds[True])})
        print(results[-1], flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    common.set_threads(1)
    load_before = common.uptime()
    results = [row for case in CASES for row in measure(*case, args.steps)]
    rows = [[r["algo"].upper(), r["env_id"], r["members"], f"`{r['adam']}`", f"{r['params_per_member']:,}",
             f"{r['flat_ms']:.3f}", f"{r['fused_ms']:.3f}", f"{r['flat_ms'] / r['fused_ms']:.2f}x"] for r in results]
    lines = [
        "## The populations' Adam step (`benchmarks/member_adam.py`)",
        "",
        "One Adam step of every member of a population at the shipped preset: the flat formula over all members' "
        "elements at once against torch's fused kernel called member by member (K calls). "
        f"{args.steps} steps per path, 3 alternating rounds, median round, torch.set_num_threads(1); parameters stay "
        "in cache between steps here (not so in training), which favours the flat formula. Load: before "
        f"`{load_before}`, after `{common.uptime()}`.",
        "",
        common.markdown_table(["Algorithm", "Env", "Members", "Adam", "Parameters per member", "Flat ms",
                               "Fused ms", "Flat / fused"], rows),
    ]
    common.publish("member_adam", lines, {"results": results, "steps": args.steps}, write=not args.no_write)


if __name__ == "__main__":
    main()
