"""`--accelerate auto` for the hand-derived updates: the matmul precision chosen by `accelerate_step`'s own search.

The hand-derived updates (`rlspeed.fused.ppo`, `.dqn`, `.sac`) are already the fast form of the step in fp32; what
the acceleration layer can add on top is a reduced internal precision for the matrix products (bf16 inside fp32
matmuls on x86 CPUs with AMX, TF32 on CUDA), where they dominate (256-wide layers). Without a cached choice the
updates run in fp32 (the bare update) until they have taken long enough for the search to cost at most
`rlspeed.accel.module.SEARCH_COST_SHARE` of their time, the rule of `auto_accelerate`'s calls and `accelerate_step`'s
steps, so a short run pays nothing for it; then `AutoMatmulPrecision` hands that update's gradient computation to
`rlspeed.accel.search.run_search`, the search
`auto_accelerate` and `accelerate_step` use: fp32 and each reduced matmul precision compute the gradient of that
batch from the same RNG seed, candidates whose gradient of any parameter leaves the tolerances (`search.TOLERANCES`)
are rejected, the rest are timed against fp32 in interleaved rounds, and the fastest wins only if it is at least
`search.MARGIN` faster (confirmed on fresh rounds), else fp32; the choice is cached (`rlspeed.accel.cache`: the
update, its batch's shapes, the machine and software), so a later run on the same machine takes it without searching.
`RLSPEED_ACCELERATE` forces a precision. The search leaves no trace: the RNG is forked, and the gradient buffer is
overwritten by the real step.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from types import SimpleNamespace

import torch

from rlspeed.accel import cache
from rlspeed.accel import module as module_policy  # (its SEARCH_COST_SHARE rule and waiting state, shared)
from rlspeed.accel.recheck import Rechecks
from rlspeed.accel.report import AccelReport, Decision, Trial
from rlspeed.accel.search import run_search, store_choice
from rlspeed.accel.strategy import (
    EAGER_FP32,
    ENV_VAR,
    Strategy,
    normalise_request,
    precision_context,
    reduced_matmul_supported,
)
from rlspeed.device import describe
from rlspeed.errors import UserError

MATMUL_PRECISIONS = ("fp32", "bf16-matmul", "tf32")
TIMING_BUDGET_S = 0.1  # the timed rounds' budget: one gradient takes milliseconds, and this runs once per training


class AutoMatmulPrecision:
    """Wraps a hand-derived update (an object with `gradient(...)`, `adam.grad`, `adam.grad_views` (one view of
    `adam.grad` per parameter) and `__call__(...)`)."""

    def __init__(self, update, device: torch.device, name: str, parameter_names: Sequence[str | None] = ()):
        self.update, self.device, self.name = update, device, name
        self.parameter_names = list(parameter_names)  # (of `adam`'s parameters, for a failed check's reason)
        self.adam = update.adam
        self.precision: str | None = None
        self.trials: list[Trial] = []
        self.reason = ""
        request = normalise_request()  # RLSPEED_ACCELERATE, parsed as accelerate_step does
        self._report = AccelReport(f"the hand-derived {name} update", describe(device), request.to_dict())
        self._candidates = [Strategy(p) for p in matmul_candidates(device)]
        self._waiting: module_policy._Waiting | None = None  # (fp32 updates, timed, until a search pays for itself)
        self._first_key: str | None = None  # (the cache key of the first call's batch)
        #: a reduced precision chosen by a search or the cache, checked against fp32 again as training goes on
        self.rechecks = Rechecks()
        if request.forced_by_env is not None:
            precision = request.precision
            if precision != "fp32" and not reduced_matmul_supported(device, precision):
                raise UserError(f"{ENV_VAR}={request.forced_by_env}: {precision} matmuls are not available on "
                                f"{device}.")
            self._decided(Decision("all calls", Strategy(precision), "forced", f"{ENV_VAR}={request.forced_by_env}"))
        self.report = self  # what Algorithm.acceleration_summary reads

    def summary(self) -> dict[str, str]:
        """The short form for summary.json (README.md): precision and compile of the update step, how the
        precision was chosen (search, cache, forced, only candidate, waiting; "not yet" before the first update) and
        why, in words (`reason`)."""
        decisions = self._report.decisions
        return {"precision": self.precision or "fp32", "compile": "off",
                "chosen_by": decisions[-1].source if decisions else "not yet",
                "reason": decisions[-1].reason if decisions else ""}

    @property
    def forced(self) -> bool:
        """Whether RLSPEED_ACCELERATE forced the precision (nothing is measured)."""
        return any(decision.source == "forced" for decision in self._report.decisions)

    def __str__(self) -> str:
        return str(self._report)

    def _context(self, precision: str) -> contextlib.AbstractContextManager:
        return precision_context(self.device, precision) if precision != "fp32" else contextlib.nullcontext()

    def __call__(self, *batch, **options):
        if self.precision is None:
            waiting = self._waiting or self._start(batch, options)
            if waiting is not None:
                if not self.search_due():
                    return self.timed(self.update, *batch, **options)
                self._search(batch, options)
        if self.rechecks.count():
            self._check_again(batch, options)
        with self._context(self.precision):
            return self.update(*batch, **options)

    def _gradient_runner(self, batch, options):
        """`build` for the search and its checks: a strategy's runner computes the update's gradient of `batch`."""
        def build(strategy: Strategy):
            def gradient() -> tuple[None, float]:
                with self._context(strategy.precision):
                    self.update.gradient(*batch, **options)
                return None, 1.0

            return gradient

        return build

    def _check_again(self, batch, options) -> None:
        """The reduced precision checked against fp32 on this batch (`Rechecks.check`): kept while it passes, else
        fp32 from here on, said in the report and summary.json and cached, under the key of this batch and of the
        first call's, which a later run looks up first (as `_search` stores)."""
        self.adam.check()
        per_parameter = [SimpleNamespace(grad=view) for view in self.adam.grad_views]
        decision = self.rechecks.check(Strategy(self.precision), self._gradient_runner(batch, options),
                                       per_parameter, self.device, (self._cache_key(batch, options), self._first_key),
                                       self.parameter_names)
        if decision is not None:
            self._decided(decision)

    def timed(self, fn, *args, **kwargs):
        """`fn(*args, **kwargs)`: an fp32 run of the update while the search waits (`__call__`'s, or one the algorithm
        makes itself, DQN's on prepared batches), its time counted towards what the search must cost at most; just
        the call otherwise, counted towards the next check of a reduced precision chosen (`check_due`)."""
        waiting = self._waiting
        if waiting is None:
            self.rechecks.count()
            return fn(*args, **kwargs)
        started = time.perf_counter()
        result = fn(*args, **kwargs)
        waiting.spent_s += time.perf_counter() - started
        waiting.calls += 1
        return result

    def check_due(self, updates: int = 1) -> bool:
        """Whether one of the next `updates` updates checks the reduced precision chosen against fp32 again
        (`__call__` checks: an algorithm that runs the update itself, DQN on prepared batches, calls the wrapper for
        those updates instead)."""
        return self.rechecks.due(updates)

    def search_due(self) -> bool:
        """Whether the search waits no longer: the fp32 updates have taken long enough for it to cost at most
        `SEARCH_COST_SHARE` of their time (the rule of `auto_accelerate`'s calls and `accelerate_step`'s steps)."""
        waiting = self._waiting
        if waiting is None:
            return False
        return waiting.spent_s >= waiting.threshold_s and waiting.search_due(
            len(self._candidates), 0, "the update's calls", budget_s=TIMING_BUDGET_S)

    def _decided(self, decision: Decision) -> None:
        self.precision, self.reason, self.trials = decision.chosen.precision, decision.reason, decision.trials
        self._report.decisions.append(decision)
        self.rechecks.follow(decision)  # (a reduced precision measured here or cached; a forced one is not checked)

    def _start(self, batch, options) -> module_policy._Waiting | None:
        """At the first call: decide from the device (one candidate) or the cache, else start waiting in fp32 until
        the calls pay for a search (returned)."""
        if len(self._candidates) == 1:
            self._decided(Decision("all calls", EAGER_FP32, "only candidate",
                                   "no reduced matmul precision on this device"))
            return None
        self._first_key = self._cache_key(batch, options)
        record = cache.load(self._first_key)
        if record is not None:  # (a search of this update on this machine before: its choice)
            try:
                self._decided(Decision("all calls", Strategy.from_dict(record["chosen"]), "cache",
                                       record.get("reason", ""), [Trial.from_dict(t) for t in record["trials"]]))
                return None
            except (KeyError, TypeError, ValueError):
                pass
        waiting = self._waiting = module_policy._Waiting(Decision("all calls", EAGER_FP32, "waiting", ""))
        self._report.decisions.append(waiting.decision)
        waiting.search_due(len(self._candidates), 0, "the update's calls", budget_s=TIMING_BUDGET_S)  # (the reason)
        return waiting

    def _search(self, batch, options) -> None:
        waiting, self._waiting = self._waiting, None
        self._report.decisions.remove(waiting.decision)
        self.adam.check()
        build = self._gradient_runner(batch, options)
        # the search compares the `.grad` of what it is given, parameter by parameter: here the views of the update's
        # flat gradient buffer, one per parameter (the flat buffer as one vector would let a small parameter's
        # gradient, a value head's bias, go wrong behind the large ones)
        per_parameter = [SimpleNamespace(grad=view) for view in self.adam.grad_views]
        started = time.perf_counter()
        chosen, trials, reason = run_search(self._candidates, build, per_parameter, self.device,
                                            budget_s=TIMING_BUDGET_S)
        if waiting.calls:
            reason += (f" (searched after {waiting.calls} fp32 updates taking {waiting.spent_s:.2f} s, so that the "
                       f"search costs at most {module_policy.SEARCH_COST_SHARE:.0%} of their time)")
        decision = Decision("all calls", chosen, "search", reason, trials, time.perf_counter() - started)
        self._decided(decision)
        what = f"the hand-derived {self.name} update"
        store_choice(self._cache_key(batch, options), decision, self._report, what)
        if self._first_key is not None and self._first_key != self._cache_key(batch, options):
            store_choice(self._first_key, decision, self._report, what)  # (a later run looks its first call's up)

    def _cache_key(self, batch, options) -> str:
        """The search's cache key: the update (its class, its gradient's size), the batch's shapes and dtypes, the
        options, the machine and software (`cache.environment_key`)."""
        return cache.make_key({"kind": "hand-derived update", "update": type(self.update).__qualname__,
                               "name": self.name, "gradient": int(self.adam.grad.numel()),
                               "batch": [[list(t.shape), str(t.dtype)] if isinstance(t, torch.Tensor) else
                                         repr(t) if isinstance(t, (bool, int, float, str, type(None))) else
                                         type(t).__name__ for t in batch],
                               "options": {k: repr(v) for k, v in sorted(options.items())},
                               **cache.environment_key(self.device)})


def matmul_candidates(device: torch.device) -> list[str]:
    """The precisions `--accelerate auto` times for a hand-derived update on `device`: fp32 first, then each reduced
    matmul precision the device computes (`reduced_matmul_supported`: bf16-matmul on x86 CPUs only with AMX)."""
    return [p for p in MATMUL_PRECISIONS if p == "fp32" or reduced_matmul_supported(device, p)]


def for_accelerate(update, accelerate: str, device: torch.device, name: str,
                   parameter_names: Sequence[str | None] = ()):
    """The update as the algorithm calls it: wrapped in the measured matmul-precision choice for `--accelerate
    auto` (`parameter_names`: those of `update.adam`'s parameters, named by a failed check), as it is otherwise."""
    return AutoMatmulPrecision(update, device, name, parameter_names) if accelerate == "auto" else update


def applies() -> bool:
    """Whether `--accelerate auto` may use a hand-derived update: yes unless `RLSPEED_ACCELERATE` forces a strategy
    it cannot run (bf16/fp16 autocast, compile, graphs), which then goes to `accelerate_step` with autograd."""
    request = normalise_request()
    return request.forced_by_env is None or (request.precision in MATMUL_PRECISIONS and request.compile == "off"
                                             and request.graphs == "off")


def chosen_precision(step, updates: int = 1) -> contextlib.AbstractContextManager | None:
    """The context that runs the next `updates` updates of a hand-derived update as `step` runs them:
    `AutoMatmulPrecision`'s chosen matmul precision (fp32 while its search waits for the updates to pay for it), or
    nothing for a bare update; None where the wrapper's own call must come next: before its first call, once its
    search is due (that call searches), and where a check of its reduced precision against fp32 is due within those
    updates (the call at which it is due checks)."""
    if isinstance(step, AutoMatmulPrecision):
        if step.precision is not None:
            return None if step.check_due(updates) else step._context(step.precision)
        return contextlib.nullcontext() if step._waiting is not None and not step.search_due() else None
    return contextlib.nullcontext()
