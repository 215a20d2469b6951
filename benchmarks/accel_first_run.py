"""Does the one added line (`model = auto_accelerate(model)`) ever make a script slower, first run included?

(a) The product description's PPO example, `examples/seed_ppo_cartpole.py`, run as written (one state per forward
    call, episodes of varying length) with a small `--total-steps`, each run in a fresh process, in rounds of:
      plain   the script with `--plain` (the line skipped);
      cold    with the line, the decision cache pointed at a new empty directory (a first run);
      warm    with the line, one cache directory shared by every warm run (filled by an untimed run first).
    Two clocks: the script's own time (`runpy` of the example after torch, gymnasium and rlspeed are imported, so
    that interpreter start-up, the same for all, is left out) and the whole process. Ratios are medians over the
    rounds of (with the line) / (plain of the same round).
(b) A model where the search does pay: a [512, 512, 512] ReLU MLP trained by Adam on batches of 256 rows (fresh
    process each, cold cache), plain against the line: the line's run keeps fp32 eager until the calls have taken
    long enough to pay for the search, then searches once and runs the winner (bf16-matmul on a CPU with AMX).
(c) `--steps-only`: the same question for `step = accelerate_step(loss_fn, optimizer)` in place of the loop's
    zero_grad / backward / step: a small [64, 64] tanh MLP regression trained by Adam for `--step-updates` updates
    (a short script), plain against the line with a cold cache, fresh processes, in alternating rounds. Its own
    README section (`accel_step_first_run`).

Usage: python benchmarks/accel_first_run.py [--rounds N] [--steps N] [--wide-updates N] [--skip-wide] [--quick]
       [--no-write]
       python benchmarks/accel_first_run.py --steps-only [--rounds N] [--step-updates N] [--no-write]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import runpy
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "seed_ppo_cartpole.py"
THREADS = "1"  # every child process: one torch thread, so that runs on a shared machine disturb each other less


# --- child processes -------------------------------------------------------------------------------------------
def child_example(steps: int, plain: bool) -> dict:
    import gymnasium  # noqa: F401  (imported before the clock starts, as the script's own imports then are)
    import torch  # noqa: F401

    import rlspeed  # noqa: F401

    sys.argv = [str(EXAMPLE), "--total-steps", str(steps), *(["--plain"] if plain else [])]
    output = io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(output):
        runpy.run_path(str(EXAMPLE), run_name="__main__")
    script_s = time.perf_counter() - started
    text = output.getvalue()
    return {"script_s": script_s, "waiting": text.count("(waiting)"), "searched": text.count("(search,"),
            "cached": text.count("(cache)"), "final": text.strip().splitlines()[-1]}


def child_wide(updates: int, plain: bool) -> dict:
    import torch
    from torch import nn

    from rlspeed import auto_accelerate

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512),
                          nn.ReLU(), nn.Linear(512, 8))
    if not plain:
        model = auto_accelerate(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    inputs, targets = torch.randn(256, 64), torch.randn(256, 8)
    started = time.perf_counter()
    for _ in range(updates):
        loss = (model(inputs) - targets).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    result = {"script_s": time.perf_counter() - started, "final_loss": float(loss)}
    if not plain:
        decision = model.accel_report.decisions[-1]
        result.update(chosen=decision.chosen.label, source=decision.source, reason=decision.reason,
                      search_s=decision.search_s)
    return result


def child_step(updates: int, plain: bool) -> dict:
    import torch
    from torch import nn

    from rlspeed import accelerate_step

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-4)
    inputs, targets = torch.randn(64, 8), torch.randn(64, 2)

    def loss_fn(x, y):
        return (model(x) - y).square().mean()

    step = None if plain else accelerate_step(loss_fn, optimizer)
    started = time.perf_counter()
    for _ in range(updates):
        if step is None:
            loss = loss_fn(inputs, targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        else:
            loss = step(inputs, targets)
    result = {"script_s": time.perf_counter() - started, "final_loss": float(loss)}
    if step is not None:
        decision = step.report.decisions[-1]
        result.update(chosen=decision.chosen.label, source=decision.source, reason=decision.reason,
                      search_s=decision.search_s)
    return result


def steps_only(args) -> None:
    """(c): rounds of plain / cold-cache runs of `child_step`, published as their own README section."""
    runs: dict[str, list[dict]] = {"plain": [], "cold": []}
    with tempfile.TemporaryDirectory() as root:
        for index in range(args.rounds):
            for variant in runs:
                result = run_child("step", args.step_updates, variant == "plain", os.path.join(root, f"c{index}"))
                runs[variant].append(result)
                print(f"  round {index} {variant}: script {result['script_s']:.2f} s {result.get('source', '')}",
                      flush=True)
    ratio = {clock: statistics.median(ratios(runs, "cold", clock)) for clock in ("script_s", "process_s")}
    medians = {variant: {clock: statistics.median(r[clock] for r in results) for clock in ("script_s", "process_s")}
               for variant, results in runs.items()}
    sources = sorted({r.get("source", "") for r in runs["cold"]})
    rows = [["plain (zero_grad, backward, step)", f"{medians['plain']['script_s']:.2f}", "1.00x",
             f"{medians['plain']['process_s']:.2f}", "1.00x", "—"],
            ["`accelerate_step`, cold cache (first run)", f"{medians['cold']['script_s']:.2f}",
             f"{ratio['script_s']:.3f}x", f"{medians['cold']['process_s']:.2f}", f"{ratio['process_s']:.3f}x",
             ", ".join(sources)]]
    last = runs["cold"][-1]
    lines = [
        "## accelerate_step on a first run (`benchmarks/accel_first_run.py --steps-only`)",
        "",
        f"A [64, 64] tanh MLP regression, batch 64, {args.step_updates} Adam updates (a short script), {args.rounds} "
        "rounds of plain / `accelerate_step` with a cold cache, each run a fresh process with one torch thread. "
        "Ratios: median over rounds of (with the line) / (plain of the same round); target <= 1.05x.",
        "",
        common.markdown_table(["Variant", "script s (median)", "script ratio", "process s (median)",
                               "process ratio", "decision at the end"], rows),
        "",
        f"The last run's decision: `{last.get('chosen')}` ({last.get('source')}): {last.get('reason')}.",
    ]
    machine = common.machine_description()
    machine["torch_threads"] = int(THREADS)
    common.publish("accel_step_first_run", lines, {"updates": args.step_updates, "rounds": args.rounds,
                                                   "runs": runs, "ratios": ratio, "medians": medians},
                   write=not args.no_write, machine=machine)


# --- the parent: rounds of fresh processes ---------------------------------------------------------------------
def run_child(kind: str, size: int, plain: bool, cache: str) -> dict:
    env = {**os.environ, "RLSPEED_CACHE_DIR": cache, "OMP_NUM_THREADS": THREADS, "RLSPEED_NUM_THREADS": THREADS}
    env.pop("RLSPEED_ACCELERATE", None)
    command = [sys.executable, __file__, "--child", kind, "--size", str(size), *(["--plain"] if plain else [])]
    started = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, check=False)
    process_s = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"child {command} failed:\n{done.stderr[-3000:]}")
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "process_s": process_s}


def ratios(runs: dict[str, list[dict]], variant: str, clock: str) -> list[float]:
    return [with_line[clock] / plain[clock] for with_line, plain in zip(runs[variant], runs["plain"])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="rounds of plain / cold / warm runs of the example")
    parser.add_argument("--steps", type=int, default=4096, help="the example's --total-steps")
    parser.add_argument("--wide-rounds", type=int, default=2)
    parser.add_argument("--wide-updates", type=int, default=9000, help="Adam updates of the wide model per run")
    parser.add_argument("--skip-wide", action="store_true")
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny settings, numbers mean nothing")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--steps-only", action="store_true", help="(c) only: accelerate_step on a first run")
    parser.add_argument("--step-updates", type=int, default=3000, help="(c): Adam updates per run")
    parser.add_argument("--child", choices=("example", "wide", "step"), help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--plain", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child = {"example": child_example, "wide": child_wide, "step": child_step}[args.child]
        print(json.dumps(child(args.size, args.plain)))
        return
    if args.steps_only:
        if args.quick:
            common.quick_settings(args, rounds=2, step_updates=300)
        steps_only(args)
        return
    if args.quick:
        common.quick_settings(args, rounds=2, steps=1024, wide_rounds=1, wide_updates=200)

    with tempfile.TemporaryDirectory() as root:
        warm_cache = os.path.join(root, "warm")
        run_child("example", args.steps, False, warm_cache)  # fills the warm cache with whatever a run decides
        runs: dict[str, list[dict]] = {"plain": [], "cold": [], "warm": []}
        for index in range(args.rounds):
            for variant in runs:
                cache = os.path.join(root, f"cold{index}") if variant == "cold" else warm_cache
                result = run_child("example", args.steps, variant == "plain", cache)
                runs[variant].append(result)
                print(f"  round {index} {variant}: script {result['script_s']:.2f} s, process "
                      f"{result['process_s']:.2f} s", flush=True)
        wide: dict[str, list[dict]] = {"plain": [], "cold": []}
        if not args.skip_wide:
            for index in range(args.wide_rounds):
                for variant in wide:
                    result = run_child("wide", args.wide_updates, variant == "plain",
                                       os.path.join(root, f"wide{index}"))
                    wide[variant].append(result)
                    print(f"  wide round {index} {variant}: {result['script_s']:.1f} s "
                          f"{result.get('chosen', '')}", flush=True)

    summary = {variant: {clock: statistics.median(ratios(runs, variant, clock)) for clock in ("script_s", "process_s")}
               for variant in ("cold", "warm")}
    medians = {variant: {clock: statistics.median(r[clock] for r in results) for clock in ("script_s", "process_s")}
               for variant, results in runs.items()}
    rows = []
    for variant, label in (("plain", "plain (`--plain`)"), ("cold", "with the line, cold cache (first run)"),
                           ("warm", "with the line, warm cache")):
        script_ratio = "1.00x" if variant == "plain" else f"{summary[variant]['script_s']:.3f}x"
        process_ratio = "1.00x" if variant == "plain" else f"{summary[variant]['process_s']:.3f}x"
        searched = "—" if variant == "plain" else str(sum(r["searched"] for r in runs[variant]))
        rows.append([label, f"{medians[variant]['script_s']:.2f}", script_ratio,
                     f"{medians[variant]['process_s']:.2f}", process_ratio, searched])
    lines = [
        "## auto_accelerate on a first run (`benchmarks/accel_first_run.py`)",
        "",
        f"### (a) The PPO example (`examples/seed_ppo_cartpole.py --total-steps {args.steps}`), fresh processes",
        "",
        f"{args.rounds} rounds of plain / cold / warm, each run a fresh process with one torch thread. Ratios: median "
        "over rounds of (run with the line) / (plain run of the same round); target <= 1.05x.",
        "",
        common.markdown_table(["Variant", "script s (median)", "script ratio", "process s (median)",
                               "process ratio", "searches run (all rounds)"], rows),
    ]
    if wide["plain"]:
        plain_s = statistics.median(r["script_s"] for r in wide["plain"])
        line_s = statistics.median(r["script_s"] for r in wide["cold"])
        last = wide["cold"][-1]
        lines += [
            "",
            f"### (b) A wide model a search can speed up: [512, 512, 512] ReLU MLP, batch 256, "
            f"{args.wide_updates} Adam updates",
            "",
            f"{args.wide_rounds} rounds, fresh processes, cold cache. Plain {plain_s:.1f} s, with the line "
            f"{line_s:.1f} s (median): {plain_s / line_s:.2f}x. The line's decision: `{last.get('chosen')}` "
            f"({last.get('source')}, search {last.get('search_s') or 0:.2f} s): {last.get('reason')}.",
        ]
    data = {"steps": args.steps, "rounds": args.rounds, "example": runs, "ratios": summary, "medians": medians,
            "wide": wide, "wide_updates": args.wide_updates}
    machine = common.machine_description()
    machine["torch_threads"] = int(THREADS)  # what the child processes ran with
    common.publish("accel_first_run", lines, data, write=not args.no_write, machine=machine)


if __name__ == "__main__":
    main()
