"""`--accelerate auto` for the hand-derived updates: the matmul precision chosen by measuring, as `accelerate_step`.

The hand-derived updates (`fused_ppo`, `fused_dqn`, `fused_sac`) are already the fast form of the step in fp32;
what the acceleration layer can add on top is a reduced internal precision for the matrix products (bf16 inside
fp32 matmuls on CPUs with AVX512-BF16/AMX, TF32 on CUDA), where they dominate (256-wide layers). On the first
call `AutoMatmulPrecision` computes the gradient of that batch in fp32 and with each candidate precision (same RNG
seed), rejects candidates whose gradient leaves the acceleration layer's tolerances (cosine, norm error:
`rlspeed.accel.search.TOLERANCES`), times the rest against fp32 in interleaved rounds, and keeps the fastest if it
is at least `MARGIN` faster, else fp32. `RLSPEED_ACCELERATE` forces a precision. The search leaves no trace: the
RNG is forked, and the gradient buffer is overwritten by the real step.
"""

from __future__ import annotations

import contextlib
import math
import time

import torch

from rlspeed.accel.search import MARGIN, SEED, TOLERANCES
from rlspeed.accel.strategy import ENV_VAR, normalise_request, precision_context, reduced_matmul_supported
from rlspeed.device import rules, synchronize
from rlspeed.errors import UserError

ROUNDS = 5
CALLS_PER_ROUND = 3
MATMUL_PRECISIONS = ("fp32", "bf16-matmul", "tf32")


class AutoMatmulPrecision:
    """Wraps a hand-derived update (an object with `gradient(...)`, `adam.grad` and `__call__(...)`)."""

    def __init__(self, update, device: torch.device, name: str):
        self.update, self.device, self.name = update, device, name
        self.adam = update.adam
        self.precision: str | None = None
        self.trials: list[dict] = []
        self.reason = ""
        request = normalise_request()  # RLSPEED_ACCELERATE, parsed as accelerate_step does
        if request.forced_by_env is not None:
            precision = request.precision
            if precision != "fp32" and not reduced_matmul_supported(device, precision):
                raise UserError(f"{ENV_VAR}={request.forced_by_env}: {precision} matmuls are not available on "
                                f"{device}.")
            self.precision, self.reason = precision, f"forced by {ENV_VAR}={request.forced_by_env}"
        self.report = self  # what Algorithm.acceleration_summary reads

    def summary(self) -> dict[str, str]:
        """The short form for summary.json (README.md): precision and compile of the update step."""
        return {"precision": self.precision or "fp32", "compile": "off"}

    def __str__(self) -> str:
        lines = [f"rlspeed acceleration for the hand-derived {self.name} update on {self.device}: "
                 f"{self.precision or 'not decided yet'} ({self.reason})"]
        for trial in self.trials:
            timing = f"{trial['ms']:.3f} ms" if trial.get("ms") is not None else "-"
            lines.append(f"  {trial['precision']:<12} {timing:>10}  grad cos {trial['cosine']:.5f}  "
                         f"norm err {trial['norm_err']:.1e}  {trial['result']}")
        return "\n".join(lines)

    def _context(self, precision: str) -> contextlib.AbstractContextManager:
        return precision_context(self.device, precision) if precision != "fp32" else contextlib.nullcontext()

    def __call__(self, *batch, **options):
        if self.precision is None:
            self._choose(batch, options)
        with self._context(self.precision):
            return self.update(*batch, **options)

    def _gradient(self, precision: str, batch, options) -> torch.Tensor:
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            torch.manual_seed(SEED)
            with self._context(precision):
                self.update.gradient(*batch, **options)
        return self.adam.grad.clone()

    def _choose(self, batch, options) -> None:
        candidates = [p for p in MATMUL_PRECISIONS[1:] if reduced_matmul_supported(self.device, p)]
        self.adam.check()
        reference = self._gradient("fp32", batch, options)
        self.trials = [{"precision": "fp32", "cosine": 1.0, "norm_err": 0.0, "result": "reference"}]
        passing = ["fp32"]
        for precision in candidates:
            gradient = self._gradient(precision, batch, options)
            norm, reference_norm = gradient.norm(), reference.norm()
            cosine = float(gradient @ reference / (norm * reference_norm + 1e-30))  # ok-sync: once, at the search
            norm_err = float((norm - reference_norm).abs() / (reference_norm + 1e-30))  # ok-sync: once
            tolerance = TOLERANCES[precision]
            ok = cosine >= tolerance.grad_cosine and norm_err <= tolerance.grad_norm_rel_err and math.isfinite(cosine)
            self.trials.append({"precision": precision, "cosine": cosine, "norm_err": norm_err,
                                "result": "ok" if ok else f"FAIL (needs cos >= {tolerance.grad_cosine}, "
                                                          f"norm err <= {tolerance.grad_norm_rel_err})"})
            if ok:
                passing.append(precision)
        times = self._time(passing, batch, options) if len(passing) > 1 else {"fp32": None}
        for trial in self.trials:
            trial["ms"] = None if times.get(trial["precision"]) is None else 1e3 * times[trial["precision"]]
        best = min(passing, key=lambda p: times[p] if times[p] is not None else math.inf)
        if best != "fp32" and times[best] * (1 + MARGIN) <= times["fp32"]:
            self.precision = best
            self.reason = f"measured {times['fp32'] / times[best]:.2f}x faster than fp32, gradients within tolerance"
        else:
            self.precision = "fp32"
            self.reason = ("no reduced matmul precision on this device" if not candidates else
                           f"no candidate both accurate and >= {MARGIN:.0%} faster")

    def _time(self, precisions: list[str], batch, options) -> dict[str, float]:
        best = {p: math.inf for p in precisions}
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            for precision in precisions:  # warm-up
                with self._context(precision):
                    self.update.gradient(*batch, **options)
            for _ in range(ROUNDS):
                for precision in precisions:
                    synchronize(self.device)
                    started = time.perf_counter()
                    with self._context(precision):
                        for _ in range(CALLS_PER_ROUND):
                            self.update.gradient(*batch, **options)
                    synchronize(self.device)
                    best[precision] = min(best[precision], (time.perf_counter() - started) / CALLS_PER_ROUND)
        return best


def use_fused(enabled: bool, supported: bool, accelerate: str, graphs_device: torch.device | None = None) -> bool:
    """Whether an algorithm takes its hand-derived update: `fused_update` on, a network it supports, and with
    `--accelerate auto` an `RLSPEED_ACCELERATE` it can honour (see `applies`).

    `graphs_device`: the device of an algorithm whose autograd update through `accelerate_step`, captured as a
    whole-step graph, was measured faster than its hand-derived update (launched kernel by kernel) where graphs
    exist (CUDA): with `--accelerate auto` there that path is taken instead (SAC and DQN; benchmarks/cuda_check.sh).
    """
    if (accelerate == "auto" and graphs_device is not None and rules(graphs_device).supports_graphs
            and normalise_request().graphs != "off"):
        return False
    return enabled and supported and (accelerate != "auto" or applies())


def for_accelerate(update, accelerate: str, device: torch.device, name: str):
    """The update as the algorithm calls it: wrapped in the measured matmul-precision choice for `--accelerate
    auto`, as it is otherwise."""
    return AutoMatmulPrecision(update, device, name) if accelerate == "auto" else update


def applies() -> bool:
    """Whether `--accelerate auto` may use a hand-derived update: yes unless `RLSPEED_ACCELERATE` forces a strategy
    it cannot run (bf16/fp16 autocast, compile, graphs), which then goes to `accelerate_step` with autograd."""
    request = normalise_request()
    return request.forced_by_env is None or (request.precision in MATMUL_PRECISIONS and request.compile == "off"
                                             and request.graphs == "off")


def chosen_precision(step) -> contextlib.AbstractContextManager | None:
    """The context that runs a hand-derived update as `step` runs it: `AutoMatmulPrecision`'s chosen matmul
    precision, or nothing for a bare update; None while the wrapper has not chosen yet (its first call does)."""
    if isinstance(step, AutoMatmulPrecision):
        return None if step.precision is None else step._context(step.precision)
    return contextlib.nullcontext()


def unwrap(step):
    """The hand-derived update inside an `AutoMatmulPrecision`, or `step` itself."""
    return step.update if isinstance(step, AutoMatmulPrecision) else step
