"""How long a fresh `rlspeed train` process takes, start to exit, and what of it is training.

    python benchmarks/cold_start.py [--rounds 3] [--total-timesteps 2048] [--threads 1] [--quick] [--no-write]

Cases, each run as `rlspeed train ALGO ENV_ID --total-timesteps N --threads T --out <new directory>` in a fresh
interpreter, the cases taking turns in `--rounds` rounds (so that a slow patch of the machine hits them all):
  - PPO CartPole-v1 and TD3 Pendulum-v1 at their shipped presets (the hand-derived update and the autograd one);
  - the floor under them: `import torch`, and `import torch, torch._dynamo` (what a process pays where something
    imports torch._dynamo: torch's optimizers do at their first use, rlspeed's training does not, docs/checkpoints.md).
Per case: the process's wall time (median and range over the rounds), the run's own training clock (summary.json's
`train_wall_s`: the rest is interpreter and imports, env and model set-up, the final evaluation, the plots), and
whether the process imported torch._dynamo.
"""

from __future__ import annotations

import itertools
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import common

#: run in the child: the rlspeed command line as `python -m rlspeed` runs it, then whether torch._dynamo was imported,
#: written to the file named by the first argument as the interpreter exits
CHILD = """
import atexit, runpy, sys
marker = sys.argv.pop(1)
atexit.register(lambda: open(marker, "w").write("torch._dynamo" in sys.modules and "yes" or "no"))
sys.argv[0] = "rlspeed"
runpy.run_module("rlspeed", run_name="__main__", alter_sys=True)
"""

TRAIN_CASES = {"ppo CartPole-v1": ("ppo", "CartPole-v1"), "td3 Pendulum-v1": ("td3", "Pendulum-v1")}
IMPORT_CASES = {"import torch": "import torch", "import torch, torch._dynamo": "import torch, torch._dynamo"}


def run_train(algo: str, env_id: str, steps: int, threads: int, root: Path, index: int) -> dict:
    """One fresh `rlspeed train` process: its wall time, training clock and whether it imported torch._dynamo."""
    out, marker = root / f"{algo}-{index}", root / f"{algo}-{index}.dynamo"
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", CHILD, str(marker), "train", algo, env_id, "--total-timesteps", str(steps),
                    "--threads", str(threads), "--out", str(out)], check=True, stdout=subprocess.DEVNULL)
    process_s = time.perf_counter() - started
    summary = json.loads((out / "summary.json").read_text())
    return {"process_s": process_s, "train_wall_s": summary["train_wall_s"], "dynamo": marker.read_text()}


def run_import(code: str) -> dict:
    """One fresh interpreter running `code`: its wall time."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return {"process_s": time.perf_counter() - started, "train_wall_s": None,
            "dynamo": "yes" if "_dynamo" in code else "no"}


def main() -> None:
    parser = common.script_arguments(__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="runs of every case, taking turns")
    parser.add_argument("--total-timesteps", type=int, default=2048, help="each training run's --total-timesteps")
    args = parser.parse_args()
    if args.quick:
        common.quick_settings(args, rounds=1, total_timesteps=256)
    root = Path(common.temporary_directory("rlspeed-cold-start-"))
    args.threads = common.set_threads(args.threads)  # (the count the children train with: the machine block names it)
    counter = itertools.count()
    runners = {name: (lambda code=code: run_import(code)) for name, code in IMPORT_CASES.items()}
    runners.update({name: (lambda algo=algo, env_id=env_id: run_train(algo, env_id, args.total_timesteps, args.threads,
                                                                       root, next(counter)))
                    for name, (algo, env_id) in TRAIN_CASES.items()})
    results: dict[str, list[dict]] = {name: [] for name in runners}
    for round_index in range(args.rounds):
        for name, run in runners.items():
            results[name].append(run())
            print(f"  round {round_index} {name}: {results[name][-1]['process_s']:.2f} s", flush=True)
    rows = []
    for name, runs in results.items():
        process = [run["process_s"] for run in runs]
        train = [run["train_wall_s"] for run in runs if run["train_wall_s"] is not None]
        rest = [run["process_s"] - run["train_wall_s"] for run in runs if run["train_wall_s"] is not None]
        rows.append([f"`{name}`" if name in IMPORT_CASES else f"`rlspeed train {name} --total-timesteps "
                     f"{args.total_timesteps}`", f"{statistics.median(process):.2f}",
                     f"{min(process):.2f} – {max(process):.2f}",
                     f"{statistics.median(train):.2f}" if train else "—",
                     f"{statistics.median(rest):.2f}" if rest else "—",
                     "/".join(sorted({run["dynamo"] for run in runs}))])
    lines = [
        "## Cold start of `rlspeed train` (`benchmarks/cold_start.py`)",
        "",
        f"Fresh processes, {args.rounds} rounds of every case in turn, `--threads {args.threads}`. Seconds: the whole "
        "process (median, range), the run's training clock (summary.json `train_wall_s`, median) and the rest "
        "(interpreter and imports, set-up, final evaluation, plots; median).",
        "",
        common.markdown_table(["Process", "s (median)", "s (range)", "training s", "rest s",
                               "imported torch._dynamo"], rows),
    ]
    common.publish("cold_start", lines, {"rounds": args.rounds, "total_timesteps": args.total_timesteps,
                                         "runs": results}, write=not args.no_write)


if __name__ == "__main__":
    main()
