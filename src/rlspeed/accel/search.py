"""The strategy search: dry-run each candidate on example inputs, check it against fp32 eager, time it, pick one.

For every candidate the search
1. runs one forward+backward from the same RNG seed and compares outputs and parameter gradients with the fp32
   eager reference (tolerances in `TOLERANCES`);
2. warms it up, then times it in interleaved rounds (candidate A, B, C, A, B, C, ...; `synchronize` around each
   round) and keeps the best round: on a shared machine the fastest round is the one least disturbed by others;
   its speed-up is the median of round-paired ratios, on a CPU the smaller of the wall-time and CPU-time ones;
3. picks the fastest candidate that passed, if it beats the simplest allowed candidate (normally eager fp32) by at
   least `MARGIN`; otherwise the simplest one. Small models therefore stay in eager fp32 and pay nothing.

The search leaves no trace in the caller's state: RNG streams are forked (the default ones, and the states of the
`torch.Generator` objects the caller hands in: those a model or loss function draws from), parameter gradients and
module buffers are restored afterwards.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from rlspeed.accel import cache
from rlspeed.accel.inputs import tensors_in
from rlspeed.accel.report import AccelReport, Decision, Trial
from rlspeed.accel.strategy import EAGER_FP32, Strategy
from rlspeed.device import synchronize

MARGIN = 0.10  # a candidate must be at least 10% faster than the simplest one to be chosen
SEED = 20240611  # every candidate's checked call starts from this RNG state, so sampling models compare equal
TIMING_BUDGET_S = 0.5  # wall time for the timed rounds of one search (all candidates together)
ROUNDS = 11
WARMUP_CALLS = 2
CONFIRM_BUDGET_FRACTION = 0.5  # the confirmation of a winner gets half the budget again
HARD_LIMIT_FACTOR = 4  # timed rounds stop after this many times the budget (a contended machine), keeping >= 2
COMPILE_ESTIMATE_S = 30.0  # what one compiled candidate is expected to cost (inductor on a GPU: tens of seconds)


@dataclass(frozen=True)
class Tolerance:
    """How close a candidate must stay to fp32 eager: relative output error, gradient cosine and norm error."""

    output_rel_err: float
    grad_cosine: float
    grad_norm_rel_err: float


TOLERANCES = {
    "fp32": Tolerance(1e-3, 0.9999, 1e-3),  # compiled fp32 only reorders floating-point sums
    "bf16": Tolerance(2e-2, 0.99, 5e-2),  # 8 mantissa bits: ~0.4% per rounding, accumulated in fp32
    "bf16-matmul": Tolerance(2e-2, 0.99, 5e-2),  # bf16 only inside matmuls, fp32 elsewhere
    "tf32": Tolerance(2e-2, 0.99, 5e-2),  # 10 mantissa bits inside matmuls
    "fp16": Tolerance(5e-3, 0.999, 1e-2),  # 11 mantissa bits, gradients scaled
}
# Outputs whose reference norm is below this (per element) are compared absolutely: a loss that is ~0 at the
# start (PPO's policy loss with normalised advantages) must not fail a relative test.
ABS_FLOOR = 1e-3
# Integer outputs (actions chosen by argmax or sampling) may flip where two choices are nearly tied: reduced
# precisions may change this fraction of them (at least one); fp32 candidates none.
DISCRETE_MISMATCH = 0.02


@dataclass
class Probe:
    """One checked call of a candidate: its float outputs and the gradients of the parameters (unscaled)."""

    outputs: list[torch.Tensor]
    grads: list[torch.Tensor | None]
    discrete: list[torch.Tensor]  # integer/bool outputs (sampled or argmax actions), compared by mismatches


# A runner does one unit of work (zero grads, forward, backward when training) and returns (outputs, grad scale).
Runner = Callable[[], tuple[object, float]]


@contextlib.contextmanager
def preserved_state(device: torch.device, params: Sequence[torch.Tensor],
                    buffers: Sequence[torch.Tensor] = (),
                    generators: Sequence[torch.Generator] = ()) -> Iterator[None]:
    """Fork the RNG streams (the default ones and `generators`) and put gradients and buffers back afterwards."""
    saved_grads = [p.grad for p in params]
    saved_buffers = [b.detach().clone() for b in buffers]
    saved_generators = [(g, g.get_state()) for g in generators]
    devices = [] if device.type == "cpu" else [device]
    try:
        rng = torch.random.fork_rng(devices=devices, device_type=device.type if device.type != "cpu" else "cuda")
    except Exception:  # a backend without RNG-state support in fork_rng: keep at least the CPU stream
        rng = torch.random.fork_rng(devices=[])
    with rng:
        try:
            yield
        finally:
            for p, grad in zip(params, saved_grads):
                p.grad = grad
            with torch.no_grad():
                for b, saved in zip(buffers, saved_buffers):
                    b.copy_(saved)
            for generator, state in saved_generators:
                generator.set_state(state)


def probe(runner: Runner, params: Sequence[torch.Tensor], device: torch.device) -> tuple[Probe, float]:
    """One checked call from the fixed seed. Returns the probe and the call's wall time (compilation included)."""
    torch.manual_seed(SEED)
    synchronize(device)
    started = time.perf_counter()
    outputs, scale = runner()
    synchronize(device)
    elapsed = time.perf_counter() - started
    tensors = tensors_in(outputs)
    floats = [t.detach().float().clone() for t in tensors if t.is_floating_point()]
    discrete = [t.detach().clone() for t in tensors if not t.is_floating_point() and not t.is_complex()]
    grads = [None if p.grad is None else (p.grad.detach().float() / scale) for p in params]
    return Probe(floats, grads, discrete), elapsed


def compare(candidate: Probe, reference: Probe, tolerance: Tolerance, trial: Trial,
            names: Sequence[str | None] = ()) -> None:
    """Fill the trial's error measures and `passed`/`error` from a probe against the reference probe. A gradient
    measure missed names the parameter that missed it by most (`names[i]` for the i-th, else its index) and its
    largest absolute difference from fp32."""
    if len(candidate.outputs) != len(reference.outputs):
        trial.error = "outputs differ in number from fp32 eager"
        return
    worst_out = 0.0
    for out, ref in zip(candidate.outputs, reference.outputs):
        if out.shape != ref.shape:
            trial.error = f"output shape {tuple(out.shape)} differs from fp32 eager {tuple(ref.shape)}"
            return
        if not bool(torch.isfinite(out).all()):
            trial.error = "non-finite output"
            return
        floor = ABS_FLOOR * math.sqrt(max(ref.numel(), 1))
        worst_out = max(worst_out, float((out - ref).norm()) / max(float(ref.norm()), floor))
    trial.output_rel_err = worst_out if reference.outputs else None  # (None: no float output to compare)
    for out, ref in zip(candidate.discrete, reference.discrete):
        mismatches = int((out != ref).sum()) if out.shape == ref.shape else ref.numel() + 1
        allowed = 0 if tolerance is TOLERANCES["fp32"] else max(1, int(DISCRETE_MISMATCH * ref.numel()))
        if mismatches > allowed:
            trial.error = f"{mismatches} of {ref.numel()} integer outputs (e.g. actions) differ from fp32 eager"
            return

    ref_norms = [0.0 if g is None else float(g.norm()) for g in reference.grads]
    largest = max(ref_norms, default=0.0)
    worst_cos, worst_norm = 1.0, 0.0
    worst_cos_at = worst_norm_at = None  # (the index of the parameter of each worst measure)
    for index, (grad, ref, ref_norm) in enumerate(zip(candidate.grads, reference.grads, ref_norms)):
        if ref is None and grad is None:
            continue
        if ref is None or grad is None:
            trial.error = "a parameter's gradient is missing compared with fp32 eager"
            return
        if not bool(torch.isfinite(grad).all()):
            trial.error = "non-finite gradient"
            return
        if ref_norm <= 1e-6 * largest or ref_norm == 0.0:
            continue  # a (near-)zero reference gradient has no direction to compare
        norm = float(grad.norm())
        cosine = float((grad.flatten() @ ref.flatten()) / max(norm * ref_norm, 1e-30))
        if cosine < worst_cos:
            worst_cos, worst_cos_at = cosine, index
        if abs(norm - ref_norm) / ref_norm > worst_norm:
            worst_norm, worst_norm_at = abs(norm - ref_norm) / ref_norm, index
    has_grads = any(g is not None for g in reference.grads)
    trial.grad_cosine = worst_cos if has_grads else None
    trial.grad_norm_rel_err = worst_norm if has_grads else None
    failures = []
    if worst_out > tolerance.output_rel_err:
        failures.append(f"output error {worst_out:.1e} > {tolerance.output_rel_err:g}")
    missed = []  # (a gradient measure missed, the index of the parameter that missed it by most)
    if has_grads and worst_cos < tolerance.grad_cosine:
        missed.append((f"gradient cosine {worst_cos:.4f} < {tolerance.grad_cosine:g}", worst_cos_at))
    if has_grads and worst_norm > tolerance.grad_norm_rel_err:
        missed.append((f"gradient norm error {worst_norm:.1e} > {tolerance.grad_norm_rel_err:g}", worst_norm_at))
    for position, (measure, index) in enumerate(missed):  # (each parameter described once, after its last measure)
        named_later = any(index == later for _, later in missed[position + 1:])
        failures.append(measure + ("" if named_later else
                                   _which_parameter(index, candidate.grads, reference.grads, names)))
    trial.passed = not failures
    trial.error = "; ".join(failures) or None


def _which_parameter(index: int | None, grads: Sequence[torch.Tensor | None],
                     reference: Sequence[torch.Tensor | None], names: Sequence[str | None]) -> str:
    """' (parameter NAME, shape [..]: max abs difference D, fp32's largest |gradient| G)' for the `index`-th."""
    if index is None:
        return ""
    grad, ref = grads[index], reference[index]
    name = names[index] if index < len(names) and names[index] else f"#{index}"
    difference = float((grad - ref).abs().max()) if ref.numel() else 0.0
    largest = float(ref.abs().max()) if ref.numel() else 0.0
    return (f" (parameter {name}, shape {list(ref.shape)}: max abs difference {difference:.3g}, fp32's largest "
            f"|gradient| {largest:.3g})")


def time_runners(runners: dict[Strategy, Runner], device: torch.device, budget_s: float | None = None,
                 rounds: int | None = None,
                 cpu_seconds: dict[Strategy, list[float]] | None = None) -> dict[Strategy, list[float]]:
    """Seconds per call of each (warmed-up) runner in each of `rounds` interleaved rounds (a runner that falls
    behind by 2x stops early, so its list can be shorter; never the first, the reference every speed-up is measured
    against, whose one slow round would otherwise leave a ratio of a single pair of timings). `cpu_seconds`, when
    given, receives the same rounds measured in the process's CPU time, which time spent waiting for other processes
    does not inflate."""
    if not runners:
        return {}
    budget_s = TIMING_BUDGET_S if budget_s is None else budget_s
    rounds = ROUNDS if rounds is None else rounds
    per_call: dict[Strategy, float] = {}
    for strategy, runner in runners.items():  # one untimed-ish call to size the rounds
        synchronize(device)
        started = time.perf_counter()
        runner()
        synchronize(device)
        per_call[strategy] = max(time.perf_counter() - started, 1e-7)
    slice_s = budget_s / (rounds * len(runners))
    calls = {s: max(1, min(1000, int(slice_s / per_call[s]))) for s in runners}
    best = {s: math.inf for s in runners}
    per_round: dict[Strategy, list[float]] = {s: [] for s in runners}
    active = list(runners)
    reference = active[0]
    deadline = time.perf_counter() + HARD_LIMIT_FACTOR * budget_s
    for round_index in range(rounds):
        for strategy in active:
            runner, count = runners[strategy], calls[strategy]
            synchronize(device)
            started, started_cpu = time.perf_counter(), time.process_time()
            for _ in range(count):
                runner()
            synchronize(device)
            seconds = (time.perf_counter() - started) / count
            per_round[strategy].append(seconds)
            if cpu_seconds is not None:
                cpu_seconds.setdefault(strategy, []).append((time.process_time() - started_cpu) / count)
            best[strategy] = min(best[strategy], seconds)
        # A candidate at twice the leader's time cannot win by the margin: stop spending time on it.
        leader = min(best[s] for s in active)
        active = [s for s in active if s is reference or best[s] <= 2.0 * leader]
        if round_index >= 1 and time.perf_counter() > deadline:
            break  # a busy machine: keep what was measured rather than stall the caller
    return per_round


def expected_search_s(per_call_s: float, eager: int, compiled: int = 0, budget_s: float | None = None) -> float:
    """Roughly what `run_search` costs for a call taking `per_call_s` with `eager` and `compiled` candidates: a
    checked call and the warm-up of each, the timed rounds (at least one call per candidate in each, cut short by
    the hard limit) and the confirmation of a winner, and the compilation of one compiled candidate. `budget_s`: the
    search's `budget_s` (default `TIMING_BUDGET_S`)."""
    candidates = eager + min(compiled, 1)  # only the eager winner's precision is compiled
    budget_s = TIMING_BUDGET_S if budget_s is None else budget_s

    def timed(budget_s: float, count: int) -> float:
        rounds = max(budget_s, ROUNDS * count * per_call_s)
        return min(rounds, max(HARD_LIMIT_FACTOR * budget_s, 2 * count * per_call_s))

    return (timed(budget_s, candidates) + timed(CONFIRM_BUDGET_FRACTION * budget_s, 2)
            + (1 + WARMUP_CALLS) * candidates * per_call_s + min(compiled, 1) * COMPILE_ESTIMATE_S)


def run_search(candidates: Sequence[Strategy], build: Callable[[Strategy], Runner], params: Sequence[torch.Tensor],
               device: torch.device, buffers: Sequence[torch.Tensor] = (),
               budget_s: float | None = None,
               generators: Sequence[torch.Generator] = ()) -> tuple[Strategy, list[Trial], str]:
    """Check and time every candidate; return (chosen strategy, trials, reason).

    `build(strategy)` returns a runner for the strategy; `params` are the tensors whose `.grad` is compared with
    the reference's; `buffers` and `generators` (the explicit RNGs the runs draw from) are put back afterwards, as
    the default RNG streams are; `budget_s` is the timed rounds' budget (default `TIMING_BUDGET_S`). The simplest
    candidate (`candidates[0]`) is the fallback; the fp32 eager reference is run even when it is not a candidate.
    Two stages, because compiling costs tens of seconds: eager candidates first; then compiled candidates only in
    the precision that won eagerly, timed against that winner and the simplest candidate.
    """
    budget_s = TIMING_BUDGET_S if budget_s is None else budget_s
    eager = [s for s in candidates if s.compile == "off"]
    compiled = [s for s in candidates if s.compile != "off"]
    trials: dict[Strategy, Trial] = {}
    with preserved_state(device, params, buffers, generators):
        reference_runner = build(EAGER_FP32)
        reference, _ = probe(reference_runner, params, device)

        def check(strategies: Sequence[Strategy]) -> dict[Strategy, Runner]:
            runners = {}
            for strategy in strategies:
                trial = trials[strategy] = Trial(strategy, reference=strategy == EAGER_FP32)
                try:
                    runner = reference_runner if trial.reference else build(strategy)
                    result, trial.first_call_s = probe(runner, params, device)
                    if trial.reference:
                        trial.passed = True
                    else:
                        compare(result, reference, TOLERANCES[strategy.precision], trial)
                    for _ in range(WARMUP_CALLS):
                        runner()
                except Exception as error:  # a candidate that cannot run is a finding, not a crash
                    trial.passed, trial.error = False, _first_line(error)
                    continue
                if trial.passed or strategy == candidates[0]:
                    runners[strategy] = runner
            return runners

        def timed(timed_runners: dict[Strategy, Runner], budget: float) -> dict[Strategy, tuple[float, float]]:
            """Each runner's best round (seconds per call) and round-paired speed-up over the simplest candidate (a
            median: a disturbance hits both sides of a pair, and the median drops outliers; NaN without it). On a
            CPU the speed-up is also measured in CPU time and the smaller of the two counts: other processes
            taking the cores inflate the wall time of whichever rounds they hit, not the CPU time."""
            cpu: dict[Strategy, list[float]] | None = {} if device.type == "cpu" else None
            timings = time_runners(timed_runners, device, budget, cpu_seconds=cpu)
            base, measured = timings.get(candidates[0]), {}
            for strategy, rounds in timings.items():
                speedup = math.nan
                if base:
                    speedup = statistics.median(b / c for b, c in zip(base, rounds))
                    pairs = [(b, c) for b, c in zip(cpu[candidates[0]], cpu[strategy]) if b > 0 and c > 0] \
                        if cpu is not None else []
                    if pairs:
                        speedup = min(speedup, statistics.median(b / c for b, c in pairs))
                measured[strategy] = (min(rounds), speedup)
            return measured

        def record(measured: dict[Strategy, tuple[float, float]]) -> None:
            for strategy, (seconds, speedup) in measured.items():
                trials[strategy].ms_per_call = seconds * 1e3
                if not math.isnan(speedup):
                    trials[strategy].speedup = speedup

        runners = check(eager)
        record(timed(runners, budget_s))
        if compiled:
            rivals: dict[Strategy, Runner] = {}
            if eager:
                winner, _ = choose(eager, list(trials.values()))
                compiled = [s for s in compiled if s.precision == winner.precision]
                for strategy in (candidates[0], winner):  # re-timed beside the compiled ones: same conditions
                    if strategy in runners:
                        rivals[strategy] = runners[strategy]
            compiled_runners = check(compiled)
            if compiled_runners:
                record(timed({**rivals, **compiled_runners}, budget_s))
            runners.update(compiled_runners)
        ordered = [trials[s] for s in candidates if s in trials]
        chosen, reason = choose(candidates, ordered)
        if chosen != candidates[0] and candidates[0] in runners:
            # Confirm on fresh rounds: on a shared machine one burst can fake a speed-up; two rarely agree.
            again = timed({candidates[0]: runners[candidates[0]], chosen: runners[chosen]},
                          CONFIRM_BUDGET_FRACTION * budget_s)[chosen][1]
            if again < 1 / (1 - MARGIN):
                reason = f"{chosen.label} not confirmed ({reason}, then {again:.2f}x on fresh rounds)"
                chosen = candidates[0]
            else:
                reason += f", confirmed at {again:.2f}x"
    return chosen, ordered, reason


def check_again(strategy: Strategy, build: Callable[[Strategy], Runner], params: Sequence[torch.Tensor],
                device: torch.device, names: Sequence[str | None] = ()) -> Trial:
    """`strategy` checked against fp32 eager once more, on what `build`'s runners compute now (no timing): a trial
    whose `passed` says whether it still keeps the tolerances. A reduced precision that passed early in training
    may not later (a critic's small gradients next to its fitted outputs), which `run_search`'s one check cannot see.
    RNG streams and `.grad` are put back, as the search puts them; `names` name the parameters in its error."""
    trial = Trial(strategy)
    with preserved_state(device, params):
        reference, _ = probe(build(EAGER_FP32), params, device)
        try:
            result, trial.first_call_s = probe(build(strategy), params, device)
        except Exception as error:  # (a candidate that cannot run now fails its check)
            trial.passed, trial.error = False, _first_line(error)
            return trial
        compare(result, reference, TOLERANCES[strategy.precision], trial, names)
    return trial


def choose(candidates: Sequence[Strategy], trials: Sequence[Trial]) -> tuple[Strategy, str]:
    """The passing candidate with the largest speed-up over the simplest one, if that speed-up is at least
    1 / (1 - `MARGIN`) by the median of round-paired ratios and its best round also beats the simplest one's best
    (two measures that must agree); otherwise the simplest one."""
    by_strategy = {trial.strategy: trial for trial in trials}
    baseline = by_strategy.get(candidates[0])
    passing = [t for t in trials if t.passed and t.ms_per_call is not None]
    if baseline is None or baseline.ms_per_call is None:
        if not passing:
            return EAGER_FP32, f"no candidate ran ({baseline.error if baseline else 'none tried'}): fp32 eager"
        fastest = min(passing, key=lambda t: t.ms_per_call)
        return fastest.strategy, f"{candidates[0].label} failed ({baseline.error}); fastest that ran"
    rivals = [t for t in passing if t.strategy != baseline.strategy]
    if not rivals:
        return baseline.strategy, ("no other candidate passed the accuracy checks" if len(trials) > 1
                                   else "only candidate")

    def speedup(trial: Trial) -> float:
        return trial.speedup if trial.speedup is not None else baseline.ms_per_call / trial.ms_per_call

    needed = 1 / (1 - MARGIN)
    winners = [t for t in rivals if speedup(t) >= needed and t.ms_per_call < baseline.ms_per_call]
    if winners:
        fastest = max(speedup(t) for t in winners)
        # (of the winners within 5% of the fastest, the most precise: `rivals` keep the candidates' order, which is
        # the order of precision)
        best = next(t for t in winners if speedup(t) >= 0.95 * fastest)
        return best.strategy, f"{speedup(best):.2f}x faster than {baseline.strategy.label}"
    best = max(rivals, key=speedup)
    why = (f"needs >= {needed:.2f}x" if speedup(best) < needed
           else f"its best round, {best.ms_per_call:.3g} ms, is not faster than {baseline.ms_per_call:.3g} ms")
    return baseline.strategy, f"best alternative {best.strategy.label} {speedup(best):.2f}x ({why})"


def none_ran(trials: Sequence[Trial]) -> bool:
    """Whether a search measured nothing: every candidate failed to run (or the rest failed the accuracy checks),
    so its fp32 fallback says nothing about the model and is not worth caching."""
    return bool(trials) and all(trial.ms_per_call is None for trial in trials)


def store_choice(key: str, decision: Decision, report: AccelReport, what: str, **extra: object) -> None:
    """Cache a search's choice under `key`, unless nothing was measured (`none_ran`: a function that fails when
    repeated, say): then its fp32 fallback holds for this process only, with a note in `report`, so that it is
    searched again once the cause is gone."""
    if none_ran(decision.trials):
        report.note(f"{what}: every candidate failed to run ({decision.reason}); fp32 eager for now, not cached.")
    elif not cache.store(key, {"chosen": decision.chosen.to_dict(), "reason": decision.reason,
                               "trials": [t.to_dict() for t in decision.trials], **extra}):
        if cache.cache_dir():
            report.note(f"{what}: the choice could not be written to {cache.cache_dir()}, so the next run searches "
                        "again (RLSPEED_CACHE_DIR names a writable directory, or off).")
        elif cache.no_home():
            report.note(f"{what}: the choice is not cached: this user has no home directory (HOME unset, no passwd "
                        "entry), so the next run searches again (RLSPEED_CACHE_DIR names a writable directory, or "
                        "off).")


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    message = text[0] if text else ""
    return f"{type(error).__name__}: {message}"[:200]
