"""The learning table: does `rlspeed train ALGO ENV` reach the env's threshold with the settings it picks by itself?

For each (algorithm, env) pair in classic control and Box2D that RL-Zoo covers for PPO, A2C, DQN, SAC, TD3 and DDPG,
the script runs the CLI as a user would (`rlspeed train ALGO ENV --target-return T --seed S --total-timesteps B
--threads 1`, preset `auto`: rlspeed's own preset for the pair, else RL-Zoo's translated, else rlspeed's default;
summary.json says which) and records per seed the steps and training seconds to the threshold, the final evaluation
(deterministic, 10 episodes, on a separate env: summary.json's `final_eval`) and whether the threshold was reached,
beside the score RL-Zoo publishes for the pair.

Threshold: Gymnasium's `reward_threshold`, or RL-Zoo's published score for the pair where Gymnasium has none
(Pendulum-v1). Budget: the preset's `total_timesteps` (RL-Zoo's `n_timesteps` for a translated entry) times
--budget-scale, except pairs too slow for a 2-core CPU, which run at the fixed budget in `FIXED_BUDGETS` and are
reported as such. A run that finishes is not rerun while its command and preset are unchanged (the table can be
built in parts: `--pairs classic`, then `--pairs box2d`, then all with every run reused).

Usage: python benchmarks/learning_table.py [--pairs classic|box2d|bipedal|all|ALGO:ENV,...] [--seeds 0-2]
       [--budget-scale 1.0] [--jobs 2] [--set KEY=VALUE ...] [--tag NAME] [--no-write]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import common
import gymnasium as gym

from rlspeed.algos import ALGORITHMS
from rlspeed.algos.base import build_config
from rlspeed.cli import parse_seeds
from rlspeed.presets import load_preset, split_run_settings
from rlspeed.yamlfile import load_run_file

RUNS_DIR = Path("runs/learning_table")

# RL-Zoo's published scores (benchmark.md of DLR-RM/rl-baselines3-zoo at commit
# 22e3ff2450fd92033f7f032915e1f64894a09584, 2026-04-23): mean_reward over its evaluation episodes (deterministic,
# one trained agent), and the n_timesteps it trained for. Its LunarLander rows are for the -v2 ids; the v3 ids used
# here fixed bugs of v2 without changing the task.
ZOO_COMMIT = "22e3ff2450fd92033f7f032915e1f64894a09584"
ZOO_SCORES = {  # in the order the pairs run (cheap ones first)
    ("ppo", "CartPole-v1"): (500.000, "100k"),
    ("dqn", "CartPole-v1"): (500.000, "50k"),
    ("a2c", "CartPole-v1"): (500.000, "500k"),
    ("ppo", "Acrobot-v1"): (-73.506, "1M"),
    ("dqn", "Acrobot-v1"): (-76.639, "100k"),
    ("a2c", "Acrobot-v1"): (-83.353, "500k"),
    ("sac", "Pendulum-v1"): (-156.995, "20k"),
    ("td3", "Pendulum-v1"): (-151.855, "20k"),
    ("ddpg", "Pendulum-v1"): (-152.099, "20k"),
    ("ppo", "Pendulum-v1"): (-172.225, "100k"),
    ("a2c", "Pendulum-v1"): (-162.965, "1M"),
    ("ppo", "MountainCar-v0"): (-110.423, "1M"),
    ("dqn", "MountainCar-v0"): (-100.849, "120k"),
    ("a2c", "MountainCar-v0"): (-111.263, "1M"),
    ("ppo", "MountainCarContinuous-v0"): (88.343, "20k"),
    ("a2c", "MountainCarContinuous-v0"): (91.166, "100k"),
    ("sac", "MountainCarContinuous-v0"): (94.679, "50k"),
    ("td3", "MountainCarContinuous-v0"): (93.483, "300k"),
    ("ddpg", "MountainCarContinuous-v0"): (93.512, "300k"),
    ("ppo", "LunarLander-v3"): (242.119, "1M"),
    ("dqn", "LunarLander-v3"): (154.382, "100k"),
    ("sac", "LunarLanderContinuous-v3"): (260.390, "500k"),
    ("td3", "LunarLanderContinuous-v3"): (207.451, "300k"),
    ("a2c", "LunarLander-v3"): (155.751, "200k"),
    ("ppo", "LunarLanderContinuous-v3"): (270.863, "1M"),
    ("a2c", "LunarLanderContinuous-v3"): (84.225, "5M"),
    ("ddpg", "LunarLanderContinuous-v3"): (230.217, "300k"),
    ("ppo", "BipedalWalker-v3"): (287.939, "5M"),
    ("a2c", "BipedalWalker-v3"): (299.754, "5M"),
    ("sac", "BipedalWalker-v3"): (297.668, "500k"),
    ("td3", "BipedalWalker-v3"): (305.990, "1M"),
    ("ddpg", "BipedalWalker-v3"): (197.486, "1M"),
}

CLASSIC = ("CartPole-v1", "Acrobot-v1", "MountainCar-v0", "MountainCarContinuous-v0", "Pendulum-v1")
BOX2D = ("LunarLander-v3", "LunarLanderContinuous-v3")
BIPEDAL = ("BipedalWalker-v3",)
# The pairs RL-Zoo 2.9.2's hyperparams/*.yml cover among these envs, in the order they run.
PAIRS = tuple(ZOO_SCORES)
# Pairs whose preset budget does not fit one session on a 2-core CPU shared by several jobs (one env with a
# [400, 300] or [256, 256] network and one gradient step per env step runs at 40-150 env steps/s there, PPO/A2C on
# 16 envs at 1,000-3,000): a fixed budget in env steps instead, stated in the table. rlspeed's own presets are sized
# for this CPU and keep their budget.
FIXED_BUDGETS = {
    ("ppo", "MountainCarContinuous-v0"): 100_000,
    ("a2c", "MountainCarContinuous-v0"): 100_000,
    ("td3", "MountainCarContinuous-v0"): 5_000,
    ("ddpg", "MountainCarContinuous-v0"): 5_000,
    ("ppo", "LunarLander-v3"): 600_000,
    ("dqn", "LunarLander-v3"): 60_000,
    ("sac", "LunarLanderContinuous-v3"): 20_000,
    ("td3", "LunarLanderContinuous-v3"): 20_000,
    ("ddpg", "LunarLanderContinuous-v3"): 20_000,
    ("a2c", "LunarLanderContinuous-v3"): 200_000,
    ("ppo", "BipedalWalker-v3"): 300_000,
    ("a2c", "BipedalWalker-v3"): 300_000,
    ("sac", "BipedalWalker-v3"): 20_000,  # (RL-Zoo's 500k-1M steps at their [400, 300] networks: hours per seed)
    ("td3", "BipedalWalker-v3"): 20_000,
    ("ddpg", "BipedalWalker-v3"): 20_000,
}


@dataclass
class Pair:
    """One (algorithm, env) row: its threshold and where it comes from, its preset and budget."""

    algo: str
    env_id: str
    target: float
    target_source: str
    settings: str  # the preset `auto` (or --preset) picks, in words
    settings_source: str  # Preset.source
    budget: int
    budget_note: str
    zoo_score: float | None
    zoo_timesteps: str | None


def threshold(algo: str, env_id: str) -> tuple[float, str]:
    """Gymnasium's reward_threshold for the env, else RL-Zoo's published score for the pair."""
    registered = gym.spec(env_id).reward_threshold
    if registered is not None:
        return float(registered), "Gymnasium"
    return ZOO_SCORES[(algo, env_id)][0], "RL-Zoo score"


def make_pair(algo: str, env_id: str, budget_scale: float, source: str = "auto") -> Pair:
    target, target_source = threshold(algo, env_id)
    preset = load_preset(algo, env_id, source)
    preset_budget = int(float(preset.get("total_timesteps", 1_000_000)))
    fixed = None if preset.source == "rlspeed" else FIXED_BUDGETS.get((algo, env_id))  # rlspeed's fit this CPU
    if fixed is not None and fixed < preset_budget:
        budget = int(fixed * budget_scale)
        note = f"fixed {budget:,} (preset {preset_budget:,}: cut to fit the session)"
    else:
        budget = int(preset_budget * budget_scale)
        note = f"{budget:,}"
    zoo = ZOO_SCORES.get((algo, env_id))
    return Pair(algo, env_id, target, target_source, preset.origin, preset.source, budget, note,
                zoo[0] if zoo else None, zoo[1] if zoo else None)


def select_pairs(spec: str) -> list[tuple[str, str]]:
    groups = {"classic": CLASSIC, "box2d": BOX2D, "bipedal": BIPEDAL,
              "all": CLASSIC + BOX2D}  # BipedalWalker only when asked for: hours per seed on this CPU
    chosen: list[tuple[str, str]] = []
    for item in spec.split(","):
        item = item.strip()
        if item in groups:
            chosen += [pair for pair in PAIRS if pair[1] in groups[item]]
        elif ":" in item:
            algo, env_id = item.split(":", 1)
            if (algo, env_id) not in PAIRS:
                raise SystemExit(f"learning_table: {item} is not an RL-Zoo classic-control/Box2D pair; pick from "
                                 + ", ".join(f"{a}:{e}" for a, e in PAIRS))
            chosen.append((algo, env_id))
        else:
            raise SystemExit(f"learning_table: --pairs takes classic, box2d, bipedal, all or ALGO:ENV, not {item!r}")
    return list(dict.fromkeys(chosen))


def run_one(pair: Pair, seed: int, overrides: list[str], tag: str, max_wall_s: float | None,
            reuse_only: bool = False, preset: str = "auto") -> dict | None:
    """Run (or reuse) `rlspeed train` for one seed; the per-seed record from its summary.json (None: not run, with
    `reuse_only`)."""
    name = f"{pair.algo}-{pair.env_id.replace('/', '_')}-{seed}" + (f"-{tag}" if tag else "")
    out = RUNS_DIR / name
    command = [str(Path(sys.executable).parent / "rlspeed"), "train", pair.algo, pair.env_id,
               "--target-return", f"{pair.target:g}", "--seed", str(seed), "--out", str(out),
               "--total-timesteps", str(pair.budget), "--threads", "1", "--no-progress", "--overwrite"]
    if preset != "auto":
        command += ["--preset", preset]
    for item in overrides:
        command += ["--set", item]
    shown = "rlspeed " + " ".join(command[1:])
    record_file = out / "learning_table_command.json"
    summary_file = out / "summary.json"
    if summary_file.exists() and record_file.exists():
        previous = json.loads(record_file.read_text())
        summary = json.loads(summary_file.read_text())
        if (previous.get("command") == shown and summary.get("preset", {}).get("origin") == pair.settings
                and _ran_with_the_preset(out, pair, preset, overrides)
                # (an interrupted run is a result only where this script stopped it: --max-wall)
                and (not summary.get("interrupted") or previous.get("process_wall_s") is not None)):
            print(f"  reused {name}", flush=True)
            return record(pair, seed, summary, previous.get("process_wall_s"), shown, reused=True,
                          load=previous.get("load_average_1min"))
    if reuse_only:
        return None
    out.mkdir(parents=True, exist_ok=True)
    summary_file.unlink(missing_ok=True)
    # written first: a run that completes after this script was stopped is still reused
    load = os.getloadavg()[0]
    record_file.write_text(json.dumps({"command": shown, "process_wall_s": None, "load_average_1min": load}) + "\n")
    started = time.perf_counter()
    with open(out / "stdout.log", "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ,
                                                                                      "OMP_NUM_THREADS": "1"})
        try:
            process.wait(timeout=max_wall_s)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGTERM)  # the CLI saves the run with "interrupted": true
            process.wait()
    wall = time.perf_counter() - started
    if not summary_file.exists():
        raise RuntimeError(f"{shown} wrote no summary.json (exit {process.returncode}); see {out / 'stdout.log'}")
    summary = json.loads(summary_file.read_text())
    record_file.write_text(json.dumps({"command": shown, "process_wall_s": wall, "load_average_1min": load}) + "\n")
    result = record(pair, seed, summary, wall, shown, reused=False, load=load)
    print(f"  {name}: {common.brief(result)}, final eval {result['final_eval_mean']}, {wall:.0f}s", flush=True)
    return result


def _ran_with_the_preset(out: Path, pair: Pair, preset: str, overrides: list[str]) -> bool:
    """Whether the stored run in `out` trained with the whole configuration the preset gives today (every
    hyperparameter, defaults included, against its config.yaml): a preset edited since (a key changed, added or
    removed), a translation that now honours another key or a changed default makes the stored run stale. Keys
    set with --set are compared through the command line instead."""
    config = out / "config.yaml"
    if not config.exists():
        return False
    used = load_run_file(config.read_text()).get("hyperparameters") or {}
    _, given = split_run_settings(dict(load_preset(pair.algo, pair.env_id, preset)))
    expected = dataclasses.asdict(build_config(ALGORITHMS[pair.algo].config_cls, given))
    overridden = {item.split("=", 1)[0] for item in overrides}

    def plain(value):  # (YAML and the preset may spell a value as -2 or -2.0, [64, 64] or (64, 64))
        if isinstance(value, (list, tuple)):
            return [plain(item) for item in value]
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value

    defaults = dataclasses.asdict(ALGORITHMS[pair.algo].config_cls())
    # (a field the run's rlspeed did not have yet counts as its default, the behaviour before it existed)
    return all(key in overridden or plain(value) == plain(used.get(key, defaults[key]))
               for key, value in expected.items())


def record(pair: Pair, seed: int, summary: dict, wall: float | None, command: str, reused: bool,
           load: float | None = None) -> dict:
    """One seed's row of results/learning_table.json (from the run's summary.json)."""
    final = summary.get("final_eval") or {}
    return {"algo": pair.algo, "env_id": pair.env_id, "seed": seed, "command": command,
            "reached": summary["steps_to_target"] is not None, "steps_to_target": summary["steps_to_target"],
            "time_to_target_s": summary["time_to_target_s"], "steps": summary["total_timesteps"],
            "train_wall_s": summary["train_wall_s"], "sps": summary["sps"],
            "process_wall_s": None if wall is None else round(wall, 1),
            "final_eval_mean": final.get("mean"), "final_eval_std": final.get("std"),
            "interrupted": summary.get("interrupted", False), "env_backend": summary.get("env_backend"),
            "preset": summary.get("preset"), "reused": reused, "load_average_1min_at_start": load}


def row(pair: Pair, runs: list[dict]) -> list[str]:
    """The pair's line of the README table."""
    steps = common.spread([r["steps_to_target"] for r in runs])
    seconds = common.spread([r["time_to_target_s"] for r in runs])
    finals = common.spread([r["final_eval_mean"] for r in runs])
    settings = {"rlspeed": "rlspeed", "zoo": "RL-Zoo", "rlspeed-default": "rlspeed default"}.get(
        pair.settings_source, pair.settings_source)
    zoo = "—" if pair.zoo_score is None else f"{pair.zoo_score:g} ({pair.zoo_timesteps})"
    if not runs:
        return [pair.algo.upper(), pair.env_id, settings, pair.budget_note, f"{pair.target:g} ({pair.target_source})",
                "not run (time)", "—", "—", "—", zoo]
    return [pair.algo.upper(), pair.env_id, settings, pair.budget_note,
            f"{pair.target:g} ({pair.target_source})", f"{steps['count']}/{len(runs)}",
            common.fmt(steps["median"]), common.fmt(seconds["median"], ".1f"), common.fmt(finals["median"], ".1f"),
            zoo]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", default="all", help="classic, box2d, bipedal, all, or ALGO:ENV,... (default all)")
    parser.add_argument("--seeds", default="0-2", help="e.g. 0-2 or 0,3,5 (default 0-2)")
    parser.add_argument("--budget-scale", type=float, default=1.0, help="multiplies every pair's budget")
    parser.add_argument("--jobs", type=int, default=2, help="training processes at once (each with 1 thread)")
    parser.add_argument("--max-wall", type=float, default=None,
                        help="seconds after which a run is stopped (SIGTERM; reported as interrupted)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="hyperparameter override passed to every run (a sweep; use with --tag and --no-write)")
    parser.add_argument("--preset", default="auto", help="preset source passed to every run (a sweep; default auto)")
    parser.add_argument("--tag", default="", help="suffix of the run directories (keeps sweep runs apart)")
    parser.add_argument("--reuse-only", action="store_true",
                        help="start no run: build the table from the finished runs (pairs without one say so)")
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    args = parser.parse_args()

    common.set_threads(1)  # the machine block reports the runs' setting (each run is its own process, --threads 1)
    seeds = parse_seeds(args.seeds)
    pairs = [make_pair(algo, env_id, args.budget_scale, args.preset) for algo, env_id in select_pairs(args.pairs)]
    tasks = [(pair, seed) for pair in pairs for seed in seeds]
    print(f"learning_table: {len(pairs)} pairs x {len(seeds)} seeds, {args.jobs} at a time", flush=True)
    load_before = os.getloadavg()
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = [result for result in pool.map(
            lambda task: run_one(*task, args.set, args.tag, args.max_wall, args.reuse_only,
                                        args.preset), tasks) if result]

    load_after = os.getloadavg()
    loads = sorted(r["load_average_1min_at_start"] for r in results if r["load_average_1min_at_start"] is not None)
    by_pair = {(p.algo, p.env_id): [r for r in results if (r["algo"], r["env_id"]) == (p.algo, p.env_id)]
               for p in pairs}
    headers = ["algo", "env", "settings", "budget (env steps)", "threshold", "seeds reached",
               "median steps to threshold", "median s to threshold", "final eval (median)", "RL-Zoo score"]
    table = common.markdown_table(headers, [row(p, by_pair[(p.algo, p.env_id)]) for p in pairs])
    lines = [
        "## Learning table: classic control and Box2D, the settings `rlspeed train` picks by itself",
        "",
        "`python benchmarks/learning_table.py`: every (algorithm, env) pair RL-Zoo covers among CartPole, Acrobot, "
        "MountainCar, MountainCarContinuous, Pendulum, LunarLander and LunarLanderContinuous, run as a user runs it: "
        "`rlspeed train ALGO ENV --target-return T --seed S --total-timesteps BUDGET --threads 1` with the preset "
        "`auto` picks (*settings*: rlspeed's own preset for the pair, else RL-Zoo's translated, gSDE included, else "
        "rlspeed's default), one or two runs at a time. Training stops at the first evaluation "
        "(deterministic, 10 episodes, separate env; confirmed on fresh episode seeds) that reaches the *threshold*: "
        "Gymnasium's reward_threshold, or RL-Zoo's published score for the pair where Gymnasium has none (Pendulum). "
        "Steps and seconds to the threshold count training only (evaluation excluded); a median counts a seed that "
        "never reached it as infinite (— when half or more missed). *Final eval*: summary.json's final evaluation "
        "(deterministic, 10 episodes, seed + 1,000,000) of the saved model. *Budget*: the preset's total_timesteps, "
        "or a fixed budget where that does not fit a 2-core CPU. *RL-Zoo score*: its benchmark.md (commit "
        f"{ZOO_COMMIT[:10]}; one agent, LunarLander rows for the -v2 ids) with its training budget. Evaluations come "
        "every eval_freq env steps (the preset's, else max(2,048, budget / 40)), so steps to threshold lie on that "
        "grid and a larger budget evaluates less often. Runs are made in parts (e.g. `--pairs classic`, then one "
        "`--pairs ALGO:ENV` at a time) and the table assembled from them with `--reuse-only`.",
        "",
        f"Seeds: {args.seeds}; *seeds reached* counts the seeds that ran for the pair (fewer where time ran out)"
        + (f", budget scale {args.budget_scale}" if args.budget_scale != 1 else "") + ".",
        "",
        "The 2 cores were shared with other jobs: the 1-minute load average when a run started was "
        + (f"{loads[0]:.1f}-{loads[-1]:.1f} (median {statistics.median(loads):.1f}; recorded for {len(loads)} of "
           f"{len(results)} runs)" if loads else "not recorded")
        + ", so seconds here are longer than on an idle machine; compare steps between rows, seconds within a row.",
        "",
        table,
    ]
    missed = [f"{p.algo.upper()} {p.env_id} ({sum(r['reached'] for r in by_pair[(p.algo, p.env_id)])}/"
              f"{len(by_pair[(p.algo, p.env_id)])})" for p in pairs
              if by_pair[(p.algo, p.env_id)] and not all(r["reached"] for r in by_pair[(p.algo, p.env_id)])]
    lines += ["", "Pairs where some seed missed the threshold within its budget: "
              + (", ".join(missed) if missed else "none") + "."]
    common.publish("learning_table", lines, {"seeds": seeds, "budget_scale": args.budget_scale,
                                             "zoo_commit": ZOO_COMMIT,
                                             "load_average_1_5_15": {"before": load_before, "after": load_after},
                                             "pairs": [vars(p) for p in pairs], "runs": results},
                   write=not args.no_write)


if __name__ == "__main__":
    main()
