"""The sweep behind rlspeed's A2C presets for MountainCar-v0 and Pendulum-v1 (src/rlspeed/presets/a2c.yaml).

Each candidate is a preset source plus `--set` overrides; each run is the CLI as the learning table runs it
(`rlspeed train a2c ENV --preset P --set ... --target-return T --seed S --total-timesteps 1000000 --threads 1`,
stopping at the first evaluation that reaches T and is confirmed on fresh episode seeds), one run at a time.
Targets are the learning table's (Gymnasium's reward_threshold, else RL-Zoo's score), budgets RL-Zoo's 1M steps.
Results (command, reached, steps to target, final evaluation per run) go to results/a2c_preset_sweep.json; a run that
finished is reused while its command is unchanged.

Usage: python benchmarks/a2c_preset_sweep.py --candidates NAME[,NAME...] --seeds 0-2 [--list]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import common

from rlspeed.cli import parse_seeds

RUNS_DIR = Path("runs/a2c_preset_sweep")
BUDGET = 1_000_000
TARGETS = {"MountainCar-v0": -110.0, "Pendulum-v1": -162.965}  # as benchmarks/learning_table.py picks them

# name: (env id, preset source, --set overrides). `zoo`: RL-Zoo's entry, translated; `rlspeed`: a2c.yaml's entry,
# whose only change in this sweep is gamma, so every Pendulum candidate sets gamma and means the same run before and
# after the change.
PRESET_BASES = {
    "zoo": "RL-Zoo's a2c.yml entry for the env (rl_zoo3 2.9.2), translated by rlspeed.presets.zoo",
    "rlspeed": "a2c.yaml's Pendulum-v1 entry (RL-Zoo's gSDE entry with lin_1e-3), gamma as set",
}
CANDIDATES: dict[str, tuple[str, str, list[str]]] = {
    "mc-zoo": ("MountainCar-v0", "zoo", []),
    "mc-anneal": ("MountainCar-v0", "zoo", ["anneal_lr=true"]),
    "mc-steps16": ("MountainCar-v0", "zoo", ["num_steps=16", "gae_lambda=0.98"]),
    "mc-steps16-anneal": ("MountainCar-v0", "zoo", ["num_steps=16", "gae_lambda=0.98", "anneal_lr=true"]),
    "mc-lr1e-3-anneal": ("MountainCar-v0", "zoo", ["learning_rate=1e-3", "anneal_lr=true"]),
    "mc-ent01": ("MountainCar-v0", "zoo", ["ent_coef=0.01"]),
    "mc-gamma0995": ("MountainCar-v0", "zoo", ["gamma=0.995"]),
    "mc-normadv": ("MountainCar-v0", "zoo", ["normalize_advantage=true"]),
    "mc-ent01-steps16": ("MountainCar-v0", "zoo", ["ent_coef=0.01", "num_steps=16", "gae_lambda=0.98"]),
    "pend-lr1e-3": ("Pendulum-v1", "rlspeed", ["gamma=0.9"]),  # the entry before this sweep
    "pend-steps16": ("Pendulum-v1", "rlspeed", ["gamma=0.9", "num_steps=16"]),
    "pend-sde4": ("Pendulum-v1", "rlspeed", ["gamma=0.9", "sde_sample_freq=4"]),
    "pend-lr2e-3": ("Pendulum-v1", "rlspeed", ["gamma=0.9", "learning_rate=2e-3"]),
    "pend-gamma095": ("Pendulum-v1", "rlspeed", ["gamma=0.95"]),  # the shipped entry
}


def command_for(name: str, seed: int) -> tuple[list[str], Path]:
    env_id, preset, overrides = CANDIDATES[name]
    out = RUNS_DIR / f"{name}-{seed}"
    command = [str(Path(sys.executable).parent / "rlspeed"), "train", "a2c", env_id, "--preset", preset,
               "--target-return", f"{TARGETS[env_id]:g}", "--seed", str(seed), "--total-timesteps", str(BUDGET),
               "--threads", "1", "--no-progress", "--out", str(out), "--overwrite"]
    for item in overrides:
        command += ["--set", item]
    return command, out


def finished(name: str, seed: int) -> dict | None:
    """The record of a finished run whose command is the candidate's current one, else None."""
    command, out = command_for(name, seed)
    shown = "rlspeed " + " ".join(command[1:])
    try:
        stored = json.loads((out / "sweep_command.json").read_text())
        summary = json.loads((out / "summary.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    if stored.get("command") != shown:
        return None
    final = summary.get("final_eval") or {}
    env_id, preset, overrides = CANDIDATES[name]
    return {"candidate": name, "env_id": env_id, "preset": preset, "overrides": overrides, "seed": seed,
            "command": shown, "target": TARGETS[env_id], "reached": summary["steps_to_target"] is not None,
            "steps_to_target": summary["steps_to_target"], "steps": summary["total_timesteps"],
            "train_wall_s": summary["train_wall_s"], "final_eval_mean": final.get("mean"),
            "final_eval_std": final.get("std"), "load_average_1min_at_start": stored.get("load_average_1min")}


def run(name: str, seed: int) -> dict:
    """Run (or reuse) one seed of one candidate."""
    record = finished(name, seed)
    if record is not None:
        return record
    command, out = command_for(name, seed)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").unlink(missing_ok=True)
    load = os.getloadavg()[0]
    started = time.perf_counter()
    with open(out / "stdout.log", "w") as log:
        code = subprocess.call(command, stdout=log, stderr=subprocess.STDOUT,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
    if code != 0 or not (out / "summary.json").exists():
        raise RuntimeError(f"{' '.join(command)} failed (exit {code}); see {out / 'stdout.log'}")
    (out / "sweep_command.json").write_text(json.dumps({"command": "rlspeed " + " ".join(command[1:]),
                                                        "load_average_1min": load,
                                                        "process_wall_s": time.perf_counter() - started}) + "\n")
    return finished(name, seed)


def write_results() -> None:
    """results/a2c_preset_sweep.json: every finished run of every candidate, with per-candidate counts. The runs
    already in the file stay unless a run here replaces them (runs/ is not committed: a checkout has only some runs,
    or none) or their candidate's command has changed since."""
    path = common.RESULTS_DIR / "a2c_preset_sweep.json"
    stored = json.loads(path.read_text())["runs"] if path.exists() else []
    found = {(name, seed): record for name in CANDIDATES for seed in range(100)
             if (record := finished(name, seed))}
    for record in stored:
        key = (record["candidate"], record["seed"])
        if key not in found and key[0] in CANDIDATES and record["command"] == (
                "rlspeed " + " ".join(command_for(*key)[0][1:])):
            found[key] = record
    runs = [found[key] for key in sorted(found, key=lambda key: (list(CANDIDATES).index(key[0]), key[1]))]
    counts = {name: f"{sum(r['reached'] for r in runs if r['candidate'] == name)}/"
                    f"{sum(r['candidate'] == name for r in runs)}" for name in CANDIDATES
              if any(r["candidate"] == name for r in runs)}
    common.write_json("a2c_preset_sweep", {
        "machine": common.machine_description(), "budget": BUDGET, "targets": TARGETS, "preset_bases": PRESET_BASES,
        "candidates": {name: list(spec) for name, spec in CANDIDATES.items()}, "reached_counts": counts, "runs": runs})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--candidates", default="", help="comma-separated names (see --list)")
    parser.add_argument("--seeds", default="0-2", help="e.g. 0-2 or 0,3,5")
    parser.add_argument("--list", action="store_true", help="print the candidates and stop")
    args = parser.parse_args()
    if args.list or not args.candidates:
        for name, (env_id, preset, overrides) in CANDIDATES.items():
            print(f"{name}: {env_id} --preset {preset} {' '.join('--set ' + o for o in overrides)}")
        return
    common.set_threads(1)
    names = [name.strip() for name in args.candidates.split(",")]
    unknown = [name for name in names if name not in CANDIDATES]
    if unknown:
        raise SystemExit(f"a2c_preset_sweep: unknown candidate(s) {', '.join(unknown)}; see --list")
    for name in names:
        for seed in parse_seeds(args.seeds):
            record = run(name, seed)
            print(f"{name} seed {seed}: reached {record['reached']} at {record['steps_to_target']}, "
                  f"final eval {record['final_eval_mean']:.1f}, {record['train_wall_s']:.0f}s", flush=True)
            write_results()


if __name__ == "__main__":
    main()
