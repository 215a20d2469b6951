"""Shared helpers for the benchmark scripts: machine description, interleaved runs, median/range, Markdown output.

Every script compares rlspeed with a reference library side by side, interleaving the runs seed by seed (in one
process, or in fresh processes: `worker_pairs`) so that a slow patch on the machine hits both, and reports medians
with min-max ranges.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import datetime
import gc
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import torch

from rlspeed.provenance import cpu_model, package_version

BENCHMARKS_DIR = Path(__file__).resolve().parent


def temporary_directory(prefix: str) -> str:
    """A new directory in the temp directory, removed as this process ends."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


#: the strategy cache of `acceleration_decided_at_once`'s searches in this process (made at its first use)
_DECISIONS: list[str] = []


@contextlib.contextmanager
def acceleration_decided_at_once() -> Iterator[None]:
    """Inside the block, `accelerate="auto"` searches at the second call of each kind it decides (update step,
    hand-derived update, rollout policy), where otherwise it runs fp32 until those calls have taken about 33 times
    what the search costs (`rlspeed.accel.module.SEARCH_COST_SHARE`; a PPO update on MinAtar, about 15 ms, searches
    after about 140,000 env steps), which a benchmark's warm-up or timed run does not reach: its `auto` side would
    time fp32, or a choice an earlier run left in the machine's cache. The choices go to a cache of this process's
    own (`RLSPEED_CACHE_DIR`, which stays set; removed as the process ends): a warm-up run inside the block makes
    them, on an early batch, and the runs after it take them from that cache. Their reason says so: "searched after 1
    fp32 calls ..., so that the search costs at most 100000% of their time"."""
    from rlspeed.accel import module

    if not _DECISIONS:
        _DECISIONS.append(temporary_directory("rlspeed-accel-bench-"))
    os.environ["RLSPEED_CACHE_DIR"] = _DECISIONS[0]
    saved = module.SEARCH_COST_SHARE
    module.SEARCH_COST_SHARE = 1000.0  # (a search is due once the calls have taken 1/1000 of its cost)
    try:
        yield
    finally:
        module.SEARCH_COST_SHARE = saved


# Stable-Baselines3's learn() makes a log folder, <temp dir>/SB3-<date and time>, at each call unless SB3_LOGDIR names
# one (its stdout logger writes nothing there): the benchmarks' share one, removed as the script ends (its worker
# processes inherit it)
if not os.environ.get("SB3_LOGDIR"):
    os.environ["SB3_LOGDIR"] = temporary_directory("rlspeed-bench-sb3-")
RESULTS_DIR = BENCHMARKS_DIR / "results"
README = BENCHMARKS_DIR / "README.md"

README_INTRO = """# rlspeed benchmarks

Each script runs rlspeed and a reference library (Stable-Baselines3) side by side, interleaving the runs seed by
seed (seed 0 rlspeed, seed 0 reference, seed 1 rlspeed, ...) so that both see the same machine: in one process, or
(a2c_cartpole, atari_ppo, lunar_lander, mujoco_offpolicy) each run in a fresh process, the sides alternating
(population_offpolicy too: solo run and population in fresh processes, the order reversed every other pair).
It prints a Markdown table, writes raw per-seed results to `benchmarks/results/<name>.json` and rewrites its own
section of this file. The numbers in a section come from one run on one machine, described in that section;
compare the columns of one table with each other (as ratios), not with numbers from another machine.

How to run (from the repository root, with `pip install -e .[bench]`):

```
python benchmarks/ppo_cartpole.py            # full run (a few minutes per seed on one core)
python benchmarks/ppo_cartpole.py --quick --no-write  # smoke run: tiny settings, numbers mean nothing, printed
                                             # only (without --no-write it replaces the published section)
python benchmarks/ppo_cartpole.py --help     # --seeds, --steps, --budget, --threads, --skip-sb3, ...
bash benchmarks/cuda_check.sh                # on a CUDA machine: the GPU tests, accel_update_step.py on CUDA,
                                             # training runs with --accelerate auto, rlspeed profile, the suite
                                             # (QUICK=1: fewer; SB3=1: also SB3's SAC on the GPU beside rlspeed's)
```

`[bench]` installs Stable-Baselines3 only; the other scripts need their envs and peers too: `sb3-contrib`
(recurrent_ppo, action_spaces, predict_latency), `.[box2d,zoo]` (lunar_lander, learning_table), `minatar`
(cnn_encoder, replay_layouts, population_cnn), `.[atari,envpool]` (atari_ppo, atari_dqn, conv_layout's end-to-end
pairs, population_cnn on Atari ids), `.[mujoco]` (mujoco_offpolicy), `.[export]` (export_parity; its MinAtar and
MiniGrid cases are skipped without `minatar` and `minigrid`), `.[video]` (videos) and `.[mujoco]` with
`gymnasium-robotics` and `pettingzoo` (her_fetch).

`cuda_check.sh` installs the wheels it finds in `.whl/` first, for GPU machines without network access. For a
machine with Python 3.12 (add `stable-baselines3==2.9.2 cloudpickle` for `SB3=1`; SB3 needs nothing else beyond
torch and numpy):

```
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \\
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl gymnasium==1.4.0 farama-notifications==0.0.6
```
"""


def set_threads(num_threads: int) -> int:
    """Set torch's intra-op threads for the process (both libraries share them), also as the count rlspeed's models
    without a `num_threads` of their own train with (`rlspeed.device.configure_threads`: a model applies its count
    only while it is built and trains); returns the value in effect."""
    from rlspeed.device import configure_threads

    configure_threads(num_threads)
    return torch.get_num_threads()


def git_commit() -> str:
    """The checkout's commit (short hash), with a note when src/ or the benchmark scripts differ from it, so that a
    section names the code it measured; "unknown" outside a git checkout."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(BENCHMARKS_DIR), *args], capture_output=True, text=True,
                              check=True).stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD")
        root = git("rev-parse", "--show-toplevel")
        # (the README and results/ are what a run writes: not a change to the code measured)
        changed = git("-C", root, "status", "--porcelain", "--untracked-files=no", "--", "src", "benchmarks",
                      ":!benchmarks/README.md", ":!benchmarks/results")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{commit} with uncommitted changes" if changed else commit


def machine_description(packages: Iterable[str] = ("rlspeed", "torch", "gymnasium", "numpy",
                                                      "stable-baselines3")) -> dict:
    """What a reader needs to judge the numbers: CPU, cores, OS, Python, library versions, torch threads, and the
    commit measured."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu": cpu_model(),
        "logical_cores": os.cpu_count(),
        "usable_cores": usable,
        "os": platform.platform(),
        "python": platform.python_version(),
        "versions": {name: package_version(name) or "not installed" for name in packages},
        "torch_threads": torch.get_num_threads(),
        "cuda_available": torch.cuda.is_available(),
        "cuda_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "commit": git_commit(),
    }


def machine_block(machine: dict) -> str:
    """The machine description as a fenced block for the README."""
    versions = ", ".join(f"{name} {version}" for name, version in machine["versions"].items())
    lines = [
        f"CPU:      {machine['cpu']} ({machine['logical_cores']} logical cores, {machine['usable_cores']} usable)",
        f"OS:       {machine['os']}, Python {machine['python']}",
        f"Versions: {versions}",
        f"Threads:  torch.set_num_threads({machine['torch_threads']}) for every run",
        "CUDA:     " + ((machine.get("cuda_device") or "available") if machine["cuda_available"] else "not available"),
        f"Run:      {machine['command']} on {machine['date_utc']}",
    ]
    if machine.get("commit"):  # (results written before the commit was recorded have none)
        lines.append(f"Commit:   {machine['commit']}")
    return "```\n" + "\n".join(lines) + "\n```"


def interleave(seeds: Sequence[int], runners: dict[str, Callable[[int], dict]]) -> list[dict]:
    """Run every runner for seed 0, then every runner for seed 1, ...; one result dict per (seed, runner).

    Each result gets `name` and `seed` added. A garbage collection before each run keeps one run's garbage out of
    the next one's clock.
    """
    results = []
    for seed in seeds:
        for name, run in runners.items():
            gc.collect()
            started = time.perf_counter()
            result = {"name": name, "seed": seed, **run(seed)}
            print(f"  seed {seed} {name}: {brief(result)} ({time.perf_counter() - started:.1f}s)", flush=True)
            results.append(result)
    return results


def alternate(runners: dict[str, Callable[[], float]], repeats: int) -> dict[str, list[float]]:
    """`repeats` rounds of every runner in turn (so that a slow patch of the machine hits them all); the values
    per runner."""
    results: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(repeats):
        for name, run in runners.items():
            results[name].append(run())
    return results


def best_seconds_per_call(call: Callable[[], object], repeats: int, calls: int, warmup: int = 3) -> float:
    """The fastest of `repeats` timings of `calls` calls of `call`, in seconds per call, after `warmup` untimed calls
    (the least disturbed measure of a kernel on a shared machine)."""
    for _ in range(warmup):
        call()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            call()
        best = min(best, (time.perf_counter() - started) / calls)
    return best


def steps_per_second(step: Callable, actions: Callable, num_envs: int, seconds: float, warmup: int) -> float:
    """Env steps per second of `step(actions())` (each call steps `num_envs` envs), over about `seconds`, after
    `warmup` untimed calls (compilation, if any, happens there)."""
    for _ in range(warmup):
        step(actions())
    start = time.perf_counter()
    step(actions())
    count = max(20, int(seconds / max(time.perf_counter() - start, 1e-7)))  # calls that fit the budget
    start = time.perf_counter()
    for _ in range(count):
        step(actions())
    return num_envs * count / (time.perf_counter() - start)


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, as "1.23, 4.56, 7.89" (a section reports them before and after)."""
    return ", ".join(f"{value:.2f}" for value in os.getloadavg())


def uptime() -> str:
    """The `uptime` line (time, users, load averages) that a section records at each phase of a run."""
    import subprocess

    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def add_publish_parser(sub, help_text: str) -> argparse.ArgumentParser:
    """The `publish` subcommand of the scripts whose learning runs are run first and tabled later (atari_ppo,
    atari_dqn, mujoco_offpolicy): the run directories and JSON files to table, a notes file, the commit to name;
    the script adds its own flags to the parser returned."""
    p = sub.add_parser("publish", help=help_text)
    p.add_argument("--rlspeed-runs", nargs="*", default=[], help="rlspeed run directories")
    p.add_argument("--sb3-runs", nargs="*", default=[], help="sb3-learn JSON files")
    p.add_argument("--notes", default="", help="a Markdown file appended to the section")
    p.add_argument("--commit", default="")
    p.add_argument("--no-write", action="store_true")
    return p


def script_arguments(description: str) -> argparse.ArgumentParser:
    """The command line every single-process script starts from: --threads, --quick (a smoke run) and --no-write;
    the script adds its own flags."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads for every run")
    parser.add_argument("--quick", action="store_true", help="tiny settings: a smoke run, numbers mean nothing")
    parser.add_argument("--no-write", action="store_true", help="print only; do not write the JSON or README")
    return parser


def quick_settings(args: argparse.Namespace, **values) -> None:
    """`--quick`'s small settings, for the options the command line did not give: an explicit `--repeats 3` with
    `--quick` keeps 3 (a smoke run of one option's full value)."""
    given = {arg.split("=", 1)[0] for arg in sys.argv[1:] if arg.startswith("--")}
    for name, value in values.items():
        if f"--{name.replace('_', '-')}" not in given:
            setattr(args, name, value)


def sweep_arguments(description: str, sizes: str, envs: str, seconds: float) -> argparse.ArgumentParser:
    """The command line of an env-stepping sweep (sizes x envs, alternating repeats), with these defaults."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default=sizes)
    parser.add_argument("--envs", default=envs)
    parser.add_argument("--seconds", type=float, default=seconds, help="time per measurement")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-write", action="store_true")
    return parser


def publish(name: str, lines: list[str], data: dict, write: bool = True, *, machine: dict | None = None,
            results_name: str | None = None) -> str:
    """A benchmark's README section: `lines`, then this machine's block (`machine`, or `machine_description()`).
    Printed; unless `write` is False also put between the `name` markers of benchmarks/README.md, with `data` (and
    the machine) in results/<results_name or name>.json."""
    machine = machine_description() if machine is None else machine
    section = "\n".join(lines).rstrip("\n") + "\n\nMachine:\n\n" + machine_block(machine)
    print()
    print(section)
    if write:
        path = write_json(results_name or name, {"machine": machine, **data})
        readme = update_readme(name, section)
        print(f"\nwrote {path} and {readme}")
    return section


def brief(result: dict) -> str:
    """A one-line progress note for a run result."""
    if "sps" in result and "reached" not in result:
        return f"{result['sps']:,.0f} steps/s"
    if result.get("reached"):
        return f"target at {result['steps_to_target']:,} steps, {result['time_to_target_s']:.2f}s"
    return f"target not reached in {result.get('steps', 0):,} steps"


def goal_episodes(env, predict: Callable, episodes: int, seed: int) -> dict:
    """`episodes` episodes of `predict(obs) -> action` on `env` (a Gymnasium env, closed after), reset with seeds
    `seed`, `seed + 1`, ...: the success rate (the env's success flag at each episode's end, read as rlspeed reads it:
    `success_key`'s `is_success`, else `success` as PointMaze and AntMaze give it) and the mean return. An episode
    whose last info gives neither flag stops the benchmark (it would count as a failure)."""
    from rlspeed.envs.gymnasium_env import SUCCESS_KEYS, success_flag, success_key  # (only goal benchmarks need it)

    successes, returns = [], []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        total, done, info = 0.0, False, {}
        while not done:
            obs, reward, terminated, truncated, info = env.step(predict(obs))
            total += float(reward)
            done = terminated or truncated
        if (key := success_key(info)) is None:
            raise SystemExit(f"{env.spec.id if env.spec else env}'s last step info in an episode gives no success flag "
                             f"(none of {', '.join(map(repr, SUCCESS_KEYS))}): its success rate cannot be read.")
        successes.append(success_flag(info[key], key))
        returns.append(total)
    env.close()
    return {"success_rate": statistics.fmean(successes), "mean_return": statistics.fmean(returns)}


def goal_columns(runs: Sequence[dict]) -> list[str]:
    """A table's success rate and mean return per seed, of runs that `goal_episodes` evaluated."""
    return [", ".join(f"{run['success_rate']:.0%}" for run in runs),
            ", ".join(f"{run['mean_return']:.1f}" for run in runs)]


def spread(values: Sequence[float | None]) -> dict:
    """Median and min-max of the values that exist; `None` entries (e.g. target not reached) count as never.

    The median treats a missing value as +inf, so a setting that fails on most seeds has no median; min and max
    are over the values that exist.
    """
    present = [float(v) for v in values if v is not None]
    padded = present + [math.inf] * (len(values) - len(present))
    median = statistics.median(padded) if padded else math.inf
    return {"median": None if math.isinf(median) else median,
            "min": min(present) if present else None,
            "max": max(present) if present else None,
            "count": len(present), "of": len(values)}


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def fmt(value: float | None, spec: str = ",.0f", missing: str = "—") -> str:
    return missing if value is None else format(value, spec)


def fmt_range(summary: dict, spec: str = ",.0f") -> str:
    if summary["min"] is None:
        return "—"
    return f"{format(summary['min'], spec)} – {format(summary['max'], spec)}"


def fmt_ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}x"


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def write_json(name: str, data: dict) -> Path:
    """Write `benchmarks/results/<name>.json` (raw per-seed results) and return its path."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def update_readme(name: str, section: str, readme: Path = README) -> Path:
    """Replace the text between `<!-- name:start -->` and `<!-- name:end -->` in the README (creating the README
    with the shared intro, or appending the section, when either is missing)."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    block = f"{start}\n{section.strip()}\n{end}"
    text = readme.read_text() if readme.exists() else README_INTRO
    if start in text and end in text and text.index(start) < text.index(end):
        before, rest = text.split(start, 1)
        after = rest.split(end, 1)[1]
        text = before + block + after
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    readme.write_text(text)
    return readme


def peer_arguments(description: str, *, peer: str, seeds: tuple[int, int], steps: tuple[int, int],
                   budget: tuple[int, int], eval_freq: int) -> argparse.ArgumentParser:
    """The flags every rlspeed-against-a-peer script shares (seeds, throughput steps, time-to-target budget, eval
    frequency, threads, device, --quick, --skip-sb3, --no-write); each pair is (default, --quick). A script adds its
    own flags, parses, then calls `peer_defaults`."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--seeds", type=int, default=None,
                        help=f"number of seeds (0..N-1); default {seeds[0]}, quick {seeds[1]}")
    parser.add_argument("--steps", type=int, default=None,
                        help=f"env steps per throughput run (a); default {steps[0]}, quick {steps[1]}")
    parser.add_argument("--budget", type=int, default=None,
                        help=f"env step budget per time-to-target run (b); default rlspeed's preset total_timesteps "
                             f"({budget[0]}), quick {budget[1]}")
    parser.add_argument("--eval-freq", type=int, default=None,
                        help=f"evaluate every N env steps in (b), both libraries; default {eval_freq}")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads for every run")
    parser.add_argument("--device", default="cpu", help=f"rlspeed's device ({peer} always runs on cpu)")
    parser.add_argument("--quick", action="store_true", help="tiny smoke-run settings")
    parser.add_argument("--skip-sb3", action="store_true", help="run rlspeed only")
    parser.add_argument("--no-write", action="store_true", help="print only; do not write the JSON or README")
    parser.set_defaults(_peer_defaults=(seeds, steps, budget, eval_freq))
    return parser


def peer_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """Fill the flags `peer_arguments` left unset with its defaults (or the --quick ones)."""
    seeds, steps, budget, eval_freq = args._peer_defaults
    pick = 1 if args.quick else 0
    args.seeds = args.seeds or seeds[pick]
    args.steps = args.steps or steps[pick]
    args.budget = args.budget or budget[pick]
    args.eval_freq = args.eval_freq or eval_freq
    return args


def rlspeed_throughput_record(model, learn_wall_s: float, **extra) -> dict:
    """What a throughput run (a) of an rlspeed model records: its env backend, device, steps/s and wall time.

    `sps` is steps over the wall time of the whole `learn` call, as `sb3_throughput_record` times SB3's: rlspeed's own
    training clock (`train_wall_s`, its `train_sps`) leaves out the start of `learn`, which SB3's count includes."""
    result = model.result
    return {"library": "rlspeed", "env_backend": model.env_backend, "device": str(model.device), **extra,
            "steps": result.total_timesteps, "train_wall_s": result.train_wall_s, "train_sps": result.sps,
            "sps": result.total_timesteps / learn_wall_s, "learn_wall_s": learn_wall_s,
            "threads": torch.get_num_threads()}


def sb3_throughput_record(model, env, steps: int, threads: int, library: str = "stable-baselines3") -> dict:
    """Time a Stable-Baselines3 (or sb3-contrib) model's `learn(steps)` with `threads` torch threads, close its env,
    and record it as `rlspeed_throughput_record` records rlspeed's runs."""
    set_threads(threads)
    started = time.perf_counter()
    model.learn(steps)
    learn_wall_s = time.perf_counter() - started
    env.close()
    return {"library": library, "env_backend": "gymnasium (DummyVecEnv)", "device": str(model.device),
            "steps": model.num_timesteps, "train_wall_s": learn_wall_s, "sps": model.num_timesteps / learn_wall_s,
            "learn_wall_s": learn_wall_s, "threads": torch.get_num_threads()}


def rlspeed_target_record(model, **extra) -> dict:
    """What a time-to-target run (b) of an rlspeed model records: whether and when it reached the target, and its
    evaluations."""
    result = model.result
    return {"library": "rlspeed", "env_backend": model.env_backend, "device": str(model.device), **extra,
            "reached": result.time_to_target_s is not None, "time_to_target_s": result.time_to_target_s,
            "steps_to_target": result.steps_to_target, "steps": result.total_timesteps,
            "train_wall_s": result.train_wall_s, "evaluations": [list(e) for e in result.evaluations],
            "threads": torch.get_num_threads()}


def sb3_target_callback(eval_env, eval_freq: int, seed: int, target_return: float, episodes: int = 10):
    """An SB3 callback that evaluates like rlspeed's learn(target_return=...) and stops training at the target.

    When a rollout starts (SB3 calls this before every `train_freq` collection, after the previous gradient steps)
    and the step count has passed the next evaluation point, it pauses the clock, runs a deterministic
    `episodes`-episode evaluation on `eval_env` (reseeded with `rlspeed.evaluation.evaluation_seed(seed, "learn",
    steps)`, the env seed rlspeed's `learn` evaluates a run of `seed` on after as many steps), resumes
    the clock and asks SB3 to stop once the mean reaches the target. Training that runs out of budget gets a final
    evaluation, as in rlspeed.
    """
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.evaluation import evaluate_policy

    from rlspeed.evaluation import evaluation_seed

    class TimeToTarget(BaseCallback):
        def __init__(self):
            super().__init__()
            self.clock_start = 0.0
            self.eval_s = 0.0
            self.next_eval = eval_freq
            self.last_eval_steps = -1
            self.time_to_target_s: float | None = None
            self.steps_to_target: int | None = None
            self.evaluations: list[list] = []

        def start_clock(self) -> None:
            self.clock_start = time.perf_counter()

        def train_clock(self) -> float:
            return time.perf_counter() - self.clock_start - self.eval_s

        def _evaluate(self) -> None:
            paused = time.perf_counter()
            train_clock = paused - self.clock_start - self.eval_s
            steps = self.model.num_timesteps
            eval_env.seed(evaluation_seed(seed, "learn", steps))
            mean, _std = evaluate_policy(self.model, eval_env, n_eval_episodes=episodes, deterministic=True)
            self.eval_s += time.perf_counter() - paused
            self.last_eval_steps = steps
            self.evaluations.append([steps, train_clock, float(mean)])
            if mean >= target_return:
                self.time_to_target_s, self.steps_to_target = train_clock, steps

        def _on_rollout_start(self) -> None:
            if self.time_to_target_s is None and self.model.num_timesteps >= self.next_eval:
                self.next_eval = self.model.num_timesteps + eval_freq
                self._evaluate()

        def _on_step(self) -> bool:
            return self.time_to_target_s is None

        def _on_training_end(self) -> None:
            if self.time_to_target_s is None and self.model.num_timesteps != self.last_eval_steps:
                self._evaluate()

    return TimeToTarget()


def sb3_time_to_target(model, env, eval_env, budget: int, eval_freq: int, seed: int, target_return: float,
                       episodes: int, threads: int) -> dict:
    """Train an SB3 `model` (of the run seed `seed`) on `env` until `target_return` (see `sb3_target_callback`);
    closes both envs.

    Returns the same fields as the scripts' rlspeed time-to-target runs."""
    callback = sb3_target_callback(eval_env, eval_freq, seed, target_return, episodes)
    set_threads(threads)
    callback.start_clock()
    model.learn(budget, callback=callback)
    train_wall_s = callback.train_clock()
    env.close()
    eval_env.close()
    return {"library": "stable-baselines3", "env_backend": "gymnasium (DummyVecEnv)", "device": str(model.device),
            "reached": callback.time_to_target_s is not None, "time_to_target_s": callback.time_to_target_s,
            "steps_to_target": callback.steps_to_target, "steps": model.num_timesteps,
            "train_wall_s": train_wall_s, "evaluations": callback.evaluations, "threads": torch.get_num_threads()}


def summarize(throughput: list[dict], to_target: list[dict], row_names: Iterable[str]) -> dict:
    """Medians/ranges per throughput row with ratios to SB3, and time-to-target per library with SB3/rlspeed."""
    summary: dict = {"throughput": {}, "time_to_target": {}}
    for name in row_names:
        runs = [r for r in throughput if r["name"] == name]
        if runs:
            summary["throughput"][name] = spread([r["sps"] for r in runs])
    sb3_sps = summary["throughput"].get("sb3", {}).get("median")
    for stats in summary["throughput"].values():
        stats["ratio_to_sb3"] = ratio(stats["median"], sb3_sps)
    for name in ("rlspeed", "sb3"):
        runs = [r for r in to_target if r["name"] == name]
        if runs:
            summary["time_to_target"][name] = {
                "env_backend": runs[0]["env_backend"],
                "time_to_target_s": spread([r["time_to_target_s"] for r in runs]),
                "steps_to_target": spread([r["steps_to_target"] for r in runs]),
            }
    if {"rlspeed", "sb3"} <= summary["time_to_target"].keys():
        summary["time_to_target"]["sb3_over_rlspeed"] = ratio(
            summary["time_to_target"]["sb3"]["time_to_target_s"]["median"],
            summary["time_to_target"]["rlspeed"]["time_to_target_s"]["median"])
    return summary


def time_to_target_table(time_to_target: dict, labels: dict[str, tuple[str, str]]) -> str:
    """The Markdown table of a `summarize(...)["time_to_target"]`: one row per library, SB3/rlspeed as ratio.

    `labels` maps "rlspeed" / "sb3" to (library name, settings description).
    """
    rows = []
    for name in ("rlspeed", "sb3"):
        if name not in time_to_target:
            continue
        stats = time_to_target[name]
        seconds, steps = stats["time_to_target_s"], stats["steps_to_target"]
        ratio = time_to_target.get("sb3_over_rlspeed") if name == "rlspeed" else 1.0
        if "sb3" not in time_to_target:
            ratio = None
        envs = f"auto → {stats['env_backend']}" if name == "rlspeed" else stats["env_backend"]
        rows.append([*labels[name], envs, f"{seconds['count']}/{seconds['of']}", fmt(seconds["median"], ".2f"),
                     fmt_range(seconds, ".2f"), fmt(steps["median"]), fmt_range(steps), fmt_ratio(ratio)])
    return markdown_table(["Library", "Settings", "Envs", "Reached", "Seconds median", "Seconds range",
                           "Steps median", "Steps range", "SB3 / rlspeed (time)"], rows)


def run_child(script: str, *flags: str, what: str = "run") -> dict:
    """Run `script *flags` in a fresh Python process and return the JSON dict it prints on its last line of stdout;
    a failed process raises RuntimeError naming `what`, with the end of its stderr."""
    import subprocess

    done = subprocess.run([sys.executable, script, *flags], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed (exit code {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- fresh-process pairs (atari_ppo.py, mujoco_offpolicy.py) ---------------------------------------------------------
def window_sps(marks: Sequence[tuple[float, int]], warmup_steps: int) -> dict:
    """Steps/s between the first `(time, steps)` mark at or past `warmup_steps` and the last mark."""
    start = next(m for m in marks if m[1] >= warmup_steps)
    end = marks[-1]
    return {"window_steps": end[1] - start[1], "window_s": end[0] - start[0],
            "sps": (end[1] - start[1]) / (end[0] - start[0])}


def worker_pairs(script: str, sides: Sequence[str], pairs: int, worker_args: Sequence[str]) -> dict:
    """Run `script worker --side SIDE *worker_args --seed PAIR` in a fresh process for every side of every pair, the
    order reversed every other pair; each worker prints its result as JSON on its last line. Returns the runs (with
    `pair`) and the load averages before and after."""
    runs = []
    before = Path("/proc/loadavg").read_text().split()[:3]
    for pair in range(pairs):
        for side in (sides if pair % 2 == 0 else list(reversed(sides))):
            result = run_child(script, "worker", "--side", side, *worker_args, "--seed", str(pair),
                               what=f"pair {pair} {side}")
            result["pair"] = pair
            print(f"  pair {pair} {side}: {result['sps']:.1f} steps/s", flush=True)
            runs.append(result)
    return {"runs": runs, "loadavg_before": before, "loadavg_after": Path("/proc/loadavg").read_text().split()[:3]}


def rlspeed_run_record(directory: str) -> dict:
    """The fields of an `rlspeed train --out DIRECTORY` run's summary.json that the learning tables show."""
    summary = json.loads((Path(directory) / "summary.json").read_text())
    return {"library": "rlspeed", "run_dir": directory, **{key: summary.get(key) for key in (
        "algo", "env_id", "seed", "env_backend", "total_timesteps", "train_wall_s", "sps", "final_eval",
        "accelerate", "update")}}


def pair_throughput(data: dict, side: str, reference: str = "sb3") -> dict:
    """One side of `worker_pairs` data: its steps/s spread, its ratio to `reference` in each pair that ran both,
    and the median of those ratios (None when no pair ran both)."""
    by_pair: dict[int, dict[str, dict]] = {}
    for run in data["runs"]:
        by_pair.setdefault(run["pair"], {})[run["side"]] = run
    values = [pair[side]["sps"] for pair in by_pair.values() if side in pair]
    ratios = [pair[side]["sps"] / pair[reference]["sps"] for pair in by_pair.values()
              if side in pair and reference in pair]
    return {"sps": spread(values), "ratio_to_sb3_per_pair": ratios,
            "ratio_to_sb3_median": statistics.median(ratios) if ratios else None}


def pairs_load(data: dict) -> str:
    """The load averages `worker_pairs` recorded, as a phrase (two sessions of pairs merged into one file name the
    pairs each covered)."""
    if "loadavg_after_pairs_0_2" in data:  # a quieter machine for the later pairs
        first = f"{' '.join(data['loadavg_before'])} before and {' '.join(data['loadavg_after_pairs_0_2'])} after"
        later = f"{' '.join(data['loadavg_before_pairs_3_4'])} before and {' '.join(data['loadavg_after'])} after"
        return f"load average {first} pairs 0-2; {later} pairs 3-4"
    return f"load average {' '.join(data['loadavg_before'])} before, {' '.join(data['loadavg_after'])} after"


def learning_records(rlspeed_runs: Iterable[str], sb3_runs: Iterable[str]) -> list[dict]:
    """The learning runs a section shows: rlspeed run directories (`rlspeed_run_record`), then SB3 result JSONs."""
    return ([rlspeed_run_record(d) for d in rlspeed_runs]
            + [json.loads(Path(f).read_text()) for f in sb3_runs])


def section_notes(notes: str, commit: str) -> list[str]:
    """The lines that end a section: a Markdown notes file's text and the commit measured, each when given."""
    lines = []
    if notes:
        lines += ["", Path(notes).read_text().strip()]
    if commit:
        lines += ["", f"Commit: `{commit}`."]
    return lines


def default_pairs_json(name: str) -> str:
    """Where `throughput` writes its pairs and `publish` reads them unless told: <temp dir>/rlspeed-bench-<name>."""
    import tempfile

    return str(Path(tempfile.gettempdir()) / f"rlspeed-bench-{name}")
