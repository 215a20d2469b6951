"""`accelerate_step(loss_fn, optimizer)`: a whole update step (forward, loss, backward, optimizer step), accelerated.

Most of the time of RL training on an accelerator is the update, and an update is more than a module call: the
acceleration needs to own the backward pass and the optimizer step to apply a GradScaler (fp16), to compute only the
gradients the optimizer uses, and to use the optimizer's fused kernel. So the user hands over the loss:

    def critic_loss(obs, actions, rewards, next_obs, dones):
        ...
        return loss                      # or (loss, aux, ...) or {"loss": loss, ...}

    critic_step = accelerate_step(critic_loss, critic_optimizer, max_grad_norm=10.0)
    loss = critic_step(obs, actions, rewards, next_obs, dones)   # zero_grad, forward, backward, clip, step

What one call does, whatever strategy is chosen:
* zero the optimizer's gradients, run `loss_fn` (under autocast for bf16/fp16, compiled when chosen);
* backward into the optimizer's parameters only (`torch.autograd.backward(inputs=...)`): a loss that flows through
  other networks (SAC's actor loss through the critics) does not compute their weight gradients, which nothing
  would read;
* optionally clip the global gradient norm (after unscaling, for fp16), then step the optimizer(s);
* return what `loss_fn` returned, the loss detached, bf16/fp16 tensors as float32. Nothing is read back to the host.

fp16 runs with a GradScaler, which skips steps whose gradients are not finite. A skip is counted on the device (no
sync); every `GUARD_WINDOW` steps the count is read once, and if steps keep being skipped the step falls back to fp32
for good (with a warning and a note in the report).
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from numbers import Real
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_pre_hook

from rlspeed.accel import cache
from rlspeed.accel import module as module_policy  # (its SEARCH_COST_SHARE rule, shared by steps)
from rlspeed.accel.compile import CompileCounter, compile_function, graph_safe
from rlspeed.accel.grads import clip_grad_norm
from rlspeed.accel.graphs import StepGraphs, capture_blocker, make_capturable
from rlspeed.accel.inputs import InputConverter, floating_dtype, map_tensors, tensors_in, to_float32
from rlspeed.accel.introspect import (
    generators_in,
    named_generators,
    named_tensors_and_modules,
    own_generators,
    parameter_names,
    reachable_submodules,
)
from rlspeed.accel.recheck import Rechecks
from rlspeed.accel.report import AccelReport, Decision, Trial
from rlspeed.accel.search import run_search, store_choice
from rlspeed.accel.strategy import (
    EAGER_FP32,
    Request,
    Strategy,
    backward_precision,
    candidates,
    normalise_request,
    with_precision,
)
from rlspeed.device import describe, resolve_device
from rlspeed.errors import UserError, no_such_keyword

GUARD_WINDOW = 32  # fp16: steps between the (single) host reads of the skipped-step count
GUARD_MAX_SKIPS = 8  # more skipped steps than this in a window (after the first) -> fall back to fp32
GUARD_MAX_SKIPS_FIRST = 16  # the first window also calibrates the loss scale (it starts at 2**16 and halves)
FP16_PROBE_SCALE = 1024.0  # loss scale used when checking an fp16 candidate's gradients during the search
FUSED_OPTIMIZERS = (torch.optim.Adam, torch.optim.AdamW)
FUSED_DEVICES = ("cpu", "cuda")  # where torch ships fused Adam kernels (as rlspeed.nn.make_adam assumes)
# A tensor the loss function names (not a parameter) up to this size is copied before a search and put back if the
# search's runs changed it; a larger one (a replay buffer) is only watched (its version counter), and a change is
# reported.
NAMED_SNAPSHOT_BYTES = 16 << 20


def accelerate_step(loss_fn: Callable[..., Any], optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer],
                    *, params: Iterable[torch.Tensor] | None = None, max_grad_norm: float | None = None,
                    device: str | torch.device | None = "auto", precision: str = "auto",
                    compile: bool | str = "auto", graphs: bool | str = "auto", example_inputs: Any = None,
                    fused_optimizer: bool | str = "auto", name: str | None = None, **unknown: Any) -> AcceleratedStep:
    """Wrap a loss function and its optimizer(s) into one accelerated update step; see the module docstring.

    Args:
        loss_fn: called with the step's arguments; returns the scalar loss, a tuple whose first item is the loss,
            or a dict with a ``"loss"`` entry. It should be free of side effects other than autograd: the search
            runs it on one call's inputs, without stepping the optimizer, as many times as fit its timing budget
            (about a second: thousands of times for a small model); the buffers of the modules it calls, such as a
            train-mode BatchNorm's running statistics, are put back afterwards.
        optimizer: one optimizer or a sequence of them, all stepped on each call.
        params: the tensors to differentiate (default: every parameter of the optimizer(s) that requires grad).
        max_grad_norm: clip the global gradient norm of `params` to this before stepping (None: no clipping).
        device: where inputs go; ``auto`` means the device of the parameters.
        precision: ``auto`` (the fastest reduced precision that is measured faster and stays within tolerance,
            else fp32), ``fp32``, ``bf16-matmul`` (CPU) / ``tf32`` (CUDA): fp32 tensors with matmuls computed in
            bf16/TF32, ``bf16`` (autocast), ``fp16`` (autocast with a GradScaler and the NaN guard).
        compile: ``auto`` (torch.compile candidates on CUDA / NPU-with-torchair only), True, False or a backend.
        graphs: ``auto`` (on CUDA: the whole eager step captured and replayed as one CUDA graph, see
            `rlspeed.accel.graphs` for what is checked before each replay and what is not; a compiled strategy
            gets inductor's graphs instead), True (an error when the decision finds the step cannot be captured;
            a step found uncapturable later falls back to eager with a note, as with ``auto``) or False.
        example_inputs: a tuple of `loss_fn` arguments to decide now (otherwise the step runs fp32, uncompiled,
            with its whole-step CUDA graph on CUDA, until its calls have taken long enough to pay for the search, as
            `auto_accelerate`'s calls do).
        fused_optimizer: ``auto`` switches a torch.optim.Adam/AdamW to its fused kernel (same algorithm, one kernel
            for all parameters; not saved in its `state_dict()`) unless ``RLSPEED_ACCELERATE=off``, on a CPU only
            while torch runs one thread (`torch.get_num_threads()` at the first call: with more, the kernel splits
            every parameter over them at every step); True switches it wherever it can; False leaves it alone.
        name: a name for the report (default: the function's name).

    ``RLSPEED_ACCELERATE`` forces a strategy as for `auto_accelerate`.
    """
    if unknown:
        raise no_such_keyword("accelerate_step", next(iter(unknown)), accelerate_step, name_all=True)
    return AcceleratedStep(loss_fn, optimizer, params=params, max_grad_norm=max_grad_norm, device=device,
                           precision=precision, compile=compile, graphs=graphs, example_inputs=example_inputs,
                           fused_optimizer=fused_optimizer, name=name)


def step_candidates(request: Request, device: torch.device, optimizers: Sequence[torch.optim.Optimizer],
                    float_dtype: torch.dtype) -> tuple[list[Strategy], list[str], str | None]:
    """What an `AcceleratedStep` of `optimizers`, whose parameters are `float_dtype`, considers for `request` on
    `device`: its strategies (`rlspeed.accel.strategy.candidates`, simplest first), the notes on what was left out,
    and why the whole step cannot be captured as a CUDA graph (None: it can, or no graph is asked for there).
    `rlspeed profile` names the same strategies as those `--accelerate auto` would time.

    Whole-step CUDA graphs need a step that can be captured, known before the first call (the optimizers, a forced
    fp16): a step that cannot be keeps the compiled candidates, whose graphs then cover its forward and backward
    passes; with graphs=True it is refused.
    """
    blocker = (capture_blocker(optimizers, request.precision)
               if device.type == "cuda" and request.graphs in ("auto", "on") else None)
    if blocker is not None and request.graphs == "on" and request.forced_by_env is None:
        raise UserError(f"graphs=True, but this step cannot be captured as a CUDA graph: {blocker}.")
    strategies, notes = candidates(request, device, allow_fp16=True, whole_step_graphs=blocker is None,
                                   float_dtype=float_dtype)
    return strategies, notes, blocker


class AcceleratedStep:
    """A callable update step; made by `accelerate_step`. Call it with `loss_fn`'s arguments.

    Its arguments are `accelerate_step`'s, with the same meanings and defaults: `loss_fn`, `optimizer`, `params`,
    `max_grad_norm`, `device`, `precision`, `compile`, `graphs`, `example_inputs`, `fused_optimizer` and `name`; and
    `recheck` (the update steps of rlspeed's algorithms, `rlspeed.algos.update.select_update`): a reduced precision
    chosen by a search or the cache is checked against fp32 again as training goes on (`rlspeed.accel.recheck`),
    where a step of `accelerate_step`'s is checked once, by its search.
    """

    def __init__(self, loss_fn: Callable[..., Any],
                 optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer], *,
                 params: Iterable[torch.Tensor] | None = None, max_grad_norm: float | None = None,
                 device: str | torch.device | None = "auto", precision: str = "auto",
                 compile: bool | str = "auto", graphs: bool | str = "auto", example_inputs: Any = None,
                 fused_optimizer: bool | str = "auto", name: str | None = None, recheck: bool = False):
        if not callable(loss_fn):
            raise UserError("accelerate_step needs a loss function as its first argument.")
        self.loss_fn = loss_fn
        self.optimizers: list[torch.optim.Optimizer] = ([optimizer] if isinstance(optimizer, torch.optim.Optimizer) else
                           [] if isinstance(optimizer, nn.Module) or not hasattr(optimizer, "__iter__") else
                           list(optimizer))
        if not self.optimizers or not all(isinstance(o, torch.optim.Optimizer) for o in self.optimizers):
            raise UserError("accelerate_step needs a torch.optim.Optimizer (or a list of them) as its second "
                            "argument.")
        for optimizer in self.optimizers:
            if _needs_closure(optimizer):
                raise UserError(f"{type(optimizer).__name__} needs a closure at each step (it evaluates the loss "
                                "several times per step), which accelerate_step does not give: keep its own loop, "
                                "optimizer.step(closure), and accelerate the model with auto_accelerate.")
        self._given_params = list(params) if params is not None else None
        self.params: list[torch.Tensor] = self._trained_params()
        if not self.params:
            raise UserError("accelerate_step found no parameters that require grad in the optimizer.")
        if max_grad_norm is not None and (isinstance(max_grad_norm, bool) or not isinstance(max_grad_norm, Real)
                                          or not max_grad_norm > 0):  # (NaN too: it would turn every weight NaN)
            raise UserError(f"max_grad_norm must be a number > 0 or None, got {max_grad_norm!r}.")
        self.max_grad_norm: float | None = None if max_grad_norm is None else float(max_grad_norm)
        params_device = self.params[0].device
        self.device: torch.device
        if device is None or (isinstance(device, str) and device.strip().lower() == "auto"):
            self.device = params_device
        else:
            self.device = resolve_device(device)
            if self.device.type != params_device.type:
                raise UserError(f"accelerate_step was given device {self.device} but the optimizer's parameters "
                                f"are on {params_device}: move the model first (or use auto_accelerate on it).")
        self.request: Request = normalise_request(precision, compile, graphs)
        self.name: str = name or getattr(loss_fn, "__qualname__", None) or type(loss_fn).__name__
        self.converter = InputConverter(self.device, floating_dtype(self.params))
        self.counter = CompileCounter()
        self.report: AccelReport = AccelReport(f"step {self.name}", describe(self.device), self.request.to_dict(),
                                  notes=list(self.request.notes))
        self._candidates, notes, self._graph_blocker = step_candidates(self.request, self.device, self.optimizers,
                                                                       self.converter.float_dtype)
        for note in notes:
            self.report.note(note)
        self._fused_request = _fused_request(fused_optimizer)
        self.strategy: Strategy | None = None
        self._forward: Callable | None = None
        self.scaler: Any = None
        self._skips: torch.Tensor | None = None
        self._steps_in_window = 0
        self._windows = 0
        self.fell_back = False
        self._graphs: StepGraphs | None = None
        self._waiting = None  # (a `module_policy._Waiting` while the step runs its simplest candidate, unsearched)
        self._first_key: str | None = None  # (the cache key of the call that decided or started the wait)
        #: `recheck`: the schedule of the checks of a reduced precision chosen (None: checked once, by the search)
        self.rechecks: Rechecks | None = Rechecks() if recheck else None
        self._grad_norm: torch.Tensor | None = None  # (`grad_norm`: the last update's, on the device)
        if example_inputs is not None:
            args = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
            self.prepare(*args)

    # --- public -------------------------------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """One update: zero grads, loss, backward, (clip), optimizer step. Returns `loss_fn`'s output, detached."""
        self._follow_params()
        args, kwargs = self.converter(args, kwargs)
        if self._forward is None:
            self._prepare(args, kwargs, search_now=False)
        waiting = self._waiting
        if waiting is not None:
            # (the threshold is re-estimated only once the calls reach it, as for modules: nothing per call but a
            # comparison and the timing)
            if waiting.spent_s < waiting.threshold_s or not self._search_due(waiting):
                started = time.perf_counter()
                outputs = self._update(args, kwargs) if self._graphs is None else self._graphs(args, kwargs)
                waiting.spent_s += time.perf_counter() - started
                waiting.calls += 1
                return outputs
            self._search_after_waiting(args, kwargs)
        if self.rechecks is not None and self.rechecks.count():
            self._check_again(args, kwargs)
        if self._graphs is not None:
            return self._graphs(args, kwargs)
        return self._update(args, kwargs)

    @property
    def grad_norm(self) -> torch.Tensor | None:
        """The global gradient norm of the trained parameters at the last call, before clipping: a 0-d tensor on the
        step's device (reading its value waits for the step, as `.item()` on any device tensor does), or None without
        `max_grad_norm` or before a call. `max_grad_norm=math.inf` measures it without clipping. With fp16 it is the
        norm of the unscaled gradients, which is inf or NaN for a step the scaler skipped."""
        return None if self._grad_norm is None else self._grad_norm.detach().clone()

    def _trained_params(self) -> list[torch.Tensor]:
        """The parameters a call trains: `params` where given, else the optimizers' (their param groups as they are
        now), those that require grad."""
        chosen = (self._given_params if self._given_params is not None else
                  [p for o in self.optimizers for group in o.param_groups for p in group["params"]])
        return [p for p in _unique(chosen) if p.requires_grad]

    def _follow_params(self) -> None:
        """Train what the parameters are at this call: a layer frozen or unfrozen (`requires_grad_`), or a param group
        added to an optimizer (`add_param_group`), since the step was made. Whole-step graphs, captured with the
        earlier ones, are dropped (eager from then on, said in the report). Parameters converted to another floating
        dtype (`.double()`) are followed too (`_follow_dtype`)."""
        params = self._trained_params()
        if len(params) != len(self.params) or not all(a is b for a, b in zip(params, self.params)):
            self._follow_param_list(params)
        if floating_dtype(self.params) != self.converter.float_dtype:
            self._follow_dtype()

    def _follow_param_list(self, params: list[torch.Tensor]) -> None:
        if not params:
            raise UserError("accelerate_step: no parameter of the optimizer requires grad any more (all frozen): "
                            "unfreeze some, or skip the update.")
        kept = {id(p) for p in params}
        for p in self.params:  # (a parameter no longer trained keeps no gradient for the optimizer to step with)
            if id(p) not in kept:
                p.grad = None
        self.params = params
        if self._graphs is not None:
            self._graphs = None
            self.report.note("the parameters the step trains changed (frozen, unfrozen or added): its whole-step "
                             "CUDA graph was dropped, and it runs eagerly from here"
                             + (" until its search chooses (which captures anew)." if self._waiting is not None
                                else "."))

    def _follow_dtype(self) -> None:
        """The parameters were converted to another floating dtype since the step was made (`model.double()`, as the
        parameters stay the same objects): float64 inputs are kept or narrowed as for that dtype, as the plain loop
        takes them, and the strategy, decided for the old dtype, is decided anew from this call."""
        dtype, old = floating_dtype(self.params), self.converter.float_dtype
        self.converter = InputConverter(self.device, dtype)
        # (the candidates for that dtype: reduced precisions for float32 parameters only)
        self._candidates, notes, _ = step_candidates(self.request, self.device, self.optimizers, dtype)
        for note in notes:
            self.report.note(note)
        if self._forward is None:  # (nothing decided yet)
            return
        if self._waiting is not None:
            self.report.decisions.remove(self._waiting.decision)
            self._waiting = None
        self.strategy, self._forward, self._graphs, self.scaler, self._skips = None, None, None, None, None
        self.report.note(f"the parameters became {dtype} (they were {old}): the strategy is decided anew.")

    def _update(self, args: tuple, kwargs: dict) -> Any:
        """One eager update on converted arguments (also what a whole-step CUDA graph captures)."""
        for p in self.params:  # zero_grad(set_to_none=True), also for `params` outside the optimizers
            p.grad = None
        outputs = self._forward(*args, **kwargs)
        loss = _loss_of(outputs)
        if self.scaler is None:
            with backward_precision(self.device, self.strategy.precision):
                torch.autograd.backward(loss if loss.dtype == torch.float32 else loss.float(), inputs=self.params)
            if all(p.grad is None for p in self.params):
                raise UserError("The loss does not reach any parameter of the optimizer given to accelerate_step: "
                                "pass the optimizer of the networks the loss is computed from (or params=...).")
            if self.max_grad_norm is not None:
                self._grad_norm = clip_grad_norm(self.params, self.max_grad_norm)
            for optimizer in self.optimizers:
                optimizer.step()
        else:
            self._scaled_step(loss)
        return _detached(outputs)

    def prepare(self, *args: Any, **kwargs: Any) -> Strategy:
        """Decide the strategy now from example arguments (otherwise the calls do, once they pay for the search).
        Steps nothing."""
        self._follow_params()
        args, kwargs = self.converter(args, kwargs)
        return self._prepare(args, kwargs)

    @property
    def compilations(self) -> int:
        """Graphs torch.compile has compiled for this step so far."""
        return self.counter.compilations

    @property
    def graph_captures(self) -> int:
        """Whole-step CUDA graphs captured so far (0 when the step runs eagerly or compiled)."""
        return 0 if self._graphs is None else self._graphs.captures

    @property
    def graph_replays(self) -> int:
        """Calls that ran as a replay of a whole-step CUDA graph so far."""
        return 0 if self._graphs is None else self._graphs.replays

    def graphs_turned_off(self, why: str) -> None:
        """Called by the step's `StepGraphs` when it stops capturing for good: the strategy, the report and the
        summary say the step runs eagerly from now on."""
        eager = replace(self.strategy, graphs=False)
        self.strategy = eager
        self.report.note(f"{self.name}: {why}.")
        self.report.decisions.append(Decision("all calls", eager, "fallback", why))

    def skipped_steps(self) -> int:
        """fp16: optimizer steps the GradScaler skipped in the current guard window (reads the device once)."""
        return 0 if self._skips is None else int(self._skips.item())

    def __repr__(self) -> str:
        chosen = self.strategy.label if self.strategy else "undecided"
        return f"AcceleratedStep({self.name}, {chosen}, device={self.device})"

    # --- deciding -------------------------------------------------------------------------------------------------
    def _prepare(self, args: tuple, kwargs: dict, search_now: bool = True) -> Strategy:
        """Decide (forced, only candidate, cached, or searched now), or with `search_now` False and a search to
        run: start waiting (the simplest candidate, eager) until the calls have taken long enough to pay for the
        search (the rule of `auto_accelerate`'s calls, `SEARCH_COST_SHARE`), so that a short script is not slowed by
        it."""
        if self._waiting is not None:  # (`prepare` while waiting: search now)
            return self._search_after_waiting(args, kwargs)
        self._maybe_fuse_optimizers()
        if len(self._candidates) == 1:
            strategy = self._candidates[0]
            forced = self.request.forced_by_env
            self.report.decisions.append(Decision(
                "all calls", strategy, "forced" if forced else "only candidate",
                f"RLSPEED_ACCELERATE={forced}" if forced else "nothing else to try with these settings"))
        else:
            self._first_key = self._cache_key(args, kwargs)  # (a later process looks it up first)
            strategy = self._cached(self._first_key)
            if strategy is None and not search_now:
                # the simplest allowed candidate while waiting (fp32 unless a precision was asked for: then that
                # precision, with its GradScaler for fp16), uncompiled, with the whole-step CUDA graph where one can
                # be captured: what accelerate="off" runs on CUDA, which is several times faster than eager there
                simplest = replace(self._candidates[0], compile="off", graphs=self._step_graphs_possible())
                self._waiting = module_policy._Waiting(Decision("all calls", simplest, "waiting", ""))
                self.report.decisions.append(self._waiting.decision)
                self._search_due(self._waiting)  # (sets the reason)
                self._use(simplest)
                return simplest
            if strategy is None:
                strategy = self._search(args, kwargs)
        strategy = self._with_step_graphs(strategy)
        self._use(strategy)
        return strategy

    def _search_due(self, waiting) -> bool:
        compiled = sum(1 for c in self._candidates if c.compile != "off")
        return waiting.search_due(len(self._candidates) - compiled, compiled, what="the step's calls")

    def _search_after_waiting(self, args: tuple, kwargs: dict) -> Strategy:
        """Search on this call's inputs once waiting has paid for it, and use the choice from this call on."""
        waiting, self._waiting = self._waiting, None
        self.report.decisions.remove(waiting.decision)
        strategy = self._search(args, kwargs)
        decision = self.report.decisions[-1]
        if waiting.calls:
            decision.reason += (f" (searched after {waiting.calls} {waiting.decision.chosen.label} calls taking "
                                f"{waiting.spent_s:.2f} s, so that the search costs at most "
                                f"{module_policy.SEARCH_COST_SHARE:.0%} of their time)")
        if self._first_key is not None and self._first_key != self._cache_key(args, kwargs):
            # (a later process looks its first call's shapes up: a ragged last minibatch must not hide the choice)
            store_choice(self._first_key, decision, self.report, self.name)
        strategy = self._with_step_graphs(strategy)
        self._use(strategy)
        return strategy

    def _with_step_graphs(self, strategy: Strategy) -> Strategy:
        """`strategy` with the whole-step CUDA graph (`rlspeed.accel.graphs`) where it is asked for and possible.

        Not measured by the search: a graph replays the very kernels of the eager step, without their launch costs,
        so it is not slower on the GPU; what could make it wrong (a changed learning rate, a value read by name)
        is checked before every replay."""
        if strategy.compile != "off" or not self._step_graphs_possible(blocked_too=True):
            return strategy
        blocker = self._graph_blocker
        if blocker is not None:
            if self.request.graphs == "on" and self.request.forced_by_env is None:
                raise UserError(f"graphs=True, but this step cannot be captured as a CUDA graph: {blocker}.")
            self.report.note(f"no whole-step CUDA graph: {blocker}.")
            return strategy
        graphed = replace(strategy, graphs=True)
        if self.report.decisions:
            last = self.report.decisions[-1]
            self.report.decisions[-1] = replace(last, chosen=graphed, reason=last.reason + "; the whole step runs as "
                                                "a CUDA graph (captured after a few eager calls)")
        return graphed

    def _step_graphs_possible(self, blocked_too: bool = False) -> bool:
        """Whether whole-step CUDA graphs are asked for (graphs auto or on) on CUDA, and (unless `blocked_too`)
        nothing known blocks their capture."""
        return (self.request.graphs in ("auto", "on") and self.device.type == "cuda"
                and (blocked_too or self._graph_blocker is None))

    def _cache_key(self, args: tuple, kwargs: dict) -> str:
        return cache.make_key({"kind": "step", **self._structure_key(args, kwargs), "request": self.request.to_dict(),
                               **cache.environment_key(self.device)})

    def _cached(self, key: str) -> Strategy | None:
        """The choice a search made for this step before (on disk, under `key`), or None."""
        record = cache.load(key)
        if record is not None:
            try:
                strategy = Strategy.from_dict(record["chosen"])
                trials = [Trial.from_dict(t) for t in record.get("trials", [])]
                self.report.decisions.append(Decision("all calls", strategy, "cache", record.get("reason", ""),
                                                      trials))
                return strategy
            except (KeyError, TypeError, ValueError):
                pass
        return None

    def _search(self, args: tuple, kwargs: dict) -> Strategy:
        """Search the candidates on these inputs (the optimizer is not stepped), cache the choice and return it."""
        key = self._cache_key(args, kwargs)
        started = time.perf_counter()
        args, kwargs, buffers = self._dry_run_inputs(args, kwargs)
        try:
            strategy, trials, reason = run_search(self._candidates,
                                                  lambda s: self._probe_runner(s, args, kwargs, buffers),
                                                  self.params, self.device)
        finally:
            self._put_back(buffers, stacklevel=5)
        decision = Decision("all calls", strategy, "search", reason, trials, time.perf_counter() - started)
        self.report.decisions.append(decision)
        store_choice(key, decision, self.report, self.name)
        return strategy

    def _check_again(self, args: tuple, kwargs: dict) -> None:
        """The reduced precision chosen, checked against fp32 on this call's inputs as the search checks it
        (`Rechecks.check`; the chosen strategy's own forward, not compiled again): kept while it passes, else fp32
        eager (with its whole-step CUDA graph where one is possible) from this call on, said in the report and
        summary.json and cached, under the key of this call and of the call that decided, which a later run looks up
        first."""
        checked, forward = self.strategy, self._forward
        keys = (self._cache_key(args, kwargs), self._first_key)
        args, kwargs, buffers = self._dry_run_inputs(args, kwargs)
        try:
            decision = self.rechecks.check(
                checked, lambda s: self._probe_runner(s, args, kwargs, buffers, forward if s == checked else None),
                self.params, self.device, keys, parameter_names(self.loss_fn, self.params))
        finally:
            self._put_back(buffers, stacklevel=4)
        if decision is not None:
            self.report.decisions.append(decision)
            self._use(self._with_step_graphs(EAGER_FP32))

    def _dry_run_inputs(self, args: tuple, kwargs: dict) -> tuple[tuple, dict, _BufferSnapshot]:
        """For the runs of `loss_fn` that a search or a check makes beside the real calls: copies of the inputs (a
        loss function that changes an input in place, `obs -= obs.mean(0)`, changes the caller's tensor once, in the
        real call, as in the plain loop, not once per dry run) and a snapshot of what those runs may change, which
        `_put_back` restores."""
        named = [t for read in named_tensors_and_modules(self.loss_fn) if isinstance(t := read(), torch.Tensor)]
        named += [b for m in reachable_submodules(self.loss_fn) for b in m.buffers(recurse=False)]
        buffers = _BufferSnapshot([*named_generators(self.loss_fn), *generators_in((args, kwargs))], named)
        args, kwargs = map_tensors((args, kwargs), torch.Tensor.clone)
        return args, kwargs, buffers

    def _put_back(self, buffers: _BufferSnapshot, stacklevel: int) -> None:
        """Restore what the dry runs changed; a named tensor too large to copy that they changed is warned of (at the
        caller's line, `stacklevel` frames up) and noted in the report."""
        lost = buffers.restore()
        if lost:
            message = (f"{self.name} changed tensors it reads by name in place (shapes {', '.join(lost)}) while the "
                       "search ran it many times; too large to put back, they now differ from the plain loop's: keep "
                       "such updates outside the step.")
            warnings.warn(message, RuntimeWarning, stacklevel=stacklevel)
            self.report.note(message)

    def _structure_key(self, args: tuple, kwargs: dict) -> dict:
        code = getattr(self.loss_fn, "__code__", None)
        code_hash = cache.code_digest(code) if code is not None else type(self.loss_fn).__qualname__
        # The forward code of the modules loss_fn reaches by name (`reachable_modules`): a cached choice must not
        # outlive an edit of a model's forward. A module reached only deeper (`self.agent.critic`, or through a
        # helper function) is not hashed: after editing its forward, clear the cache (RLSPEED_CACHE_DIR).
        modules = reachable_submodules(self.loss_fn)
        return {"fn": f"{getattr(self.loss_fn, '__module__', '')}.{self.name}", "code": code_hash,
                "forward": cache.forward_digest(modules),
                "params": [[list(p.shape), str(p.dtype)] for p in self.params],
                "optimizers": [type(o).__name__ for o in self.optimizers],
                "inputs": [[list(t.shape), str(t.dtype)] for t in tensors_in((args, kwargs))],
                "clip": self.max_grad_norm}

    def _probe_runner(self, strategy: Strategy, args: tuple, kwargs: dict, buffers: _BufferSnapshot,
                      forward: Callable | None = None) -> Callable[[], tuple[object, float]]:
        """A run of `strategy` for the search or a check: zero grads, `loss_fn`, backward (`forward`: the strategy's
        forward already built, else built now)."""
        forward = forward or self._build_forward(strategy)
        scale = FP16_PROBE_SCALE if strategy.precision == "fp16" else 1.0
        params, device = self.params, self.device

        def unit() -> tuple[object, float]:
            for p in params:
                p.grad = None
            if not buffers.watched:  # the search's first run: fp32 eager, the reference
                with buffers.watch():
                    outputs = forward(*args, **kwargs)
            else:
                outputs = forward(*args, **kwargs)
            loss = _loss_of(outputs).float()
            with backward_precision(device, strategy.precision):
                torch.autograd.backward(loss * scale if scale != 1.0 else loss, inputs=params)
            return outputs, scale

        return unit

    def _build_forward(self, strategy: Strategy) -> Callable:
        fn = with_precision(self.loss_fn, self.device, strategy.precision)
        if strategy.compile != "off":
            fn = compile_function(fn, strategy, self.counter)
            if strategy.graphs:
                fn = graph_safe(fn)
        return module_policy.in_step(fn)  # (the accelerated modules it calls run as this strategy says)

    def _use(self, strategy: Strategy) -> None:
        self.strategy = strategy
        if self.rechecks is not None and self.report.decisions:  # (checked again where it is a measured reduction)
            self.rechecks.follow(self.report.decisions[-1], final=self._waiting is None)
        self._forward = self._build_forward(strategy)
        self._graphs = None
        if strategy.graphs and strategy.compile == "off":
            changed = make_capturable(self.optimizers, self.device)
            if changed:
                self.report.note(f"{', '.join(changed)} switched to capturable=True (its step can be replayed in "
                                 "a CUDA graph).")
            self._graphs = StepGraphs(self, self._update)
        if strategy.precision == "fp16":
            self.scaler = _grad_scaler(self.device)
            self._skips = torch.zeros((), device=self.device, dtype=torch.int32)
        else:
            self.scaler = None

    def _maybe_fuse_optimizers(self) -> None:
        if self._fused_request is False:
            return
        if self.request.forced_by_env is not None and self._candidates == [Strategy()]:
            return  # RLSPEED_ACCELERATE=off/fp32: leave everything as the user wrote it
        threads = torch.get_num_threads()
        for optimizer in self.optimizers:
            why_not = _fused_blocker(optimizer, self.device)
            if why_not is None and self._fused_request == "auto" and self.device.type == "cpu" and threads > 1:
                # (the fused CPU kernel splits every parameter of more than a cache line over the threads, one
                # thread-pool region per parameter and step; torch's default loop splits only tensors above its grain
                # size: for a small network, more synchronisations than the one kernel saves)
                self.report.note(f"{type(optimizer).__name__} left as is: torch runs {threads} threads, over which "
                                 "the fused CPU kernel would split every parameter at every step (fused_optimizer=True "
                                 "fuses it anyway; with one thread, auto does).")
                continue
            if why_not is None:
                _switch_to_fused(optimizer)
                self.report.note(f"{type(optimizer).__name__} switched to its fused kernel (same algorithm, one "
                                 "kernel for all parameters).")
            elif self._fused_request is True:
                self.report.note(f"{type(optimizer).__name__} left as is: {why_not}.")

    # --- fp16 -------------------------------------------------------------------------------------------------
    def _scaled_step(self, loss: torch.Tensor) -> None:
        scaler = self.scaler
        torch.autograd.backward(scaler.scale(loss.float()), inputs=self.params)
        if self.max_grad_norm is not None:
            for optimizer in self.optimizers:
                scaler.unscale_(optimizer)
            self._grad_norm = clip_grad_norm(self.params, self.max_grad_norm)
        scale_before = scaler._scale.clone()
        for optimizer in self.optimizers:
            scaler.step(optimizer)
        scaler.update()
        self._skips += (scaler._scale < scale_before).to(torch.int32)  # the scale only drops when a step was skipped
        self._steps_in_window += 1
        if self._steps_in_window >= GUARD_WINDOW:
            self._check_guard()

    def _check_guard(self) -> None:
        skipped = int(self._skips.item())  # the one host read per window
        limit = GUARD_MAX_SKIPS_FIRST if self._windows == 0 else GUARD_MAX_SKIPS
        self._skips.zero_()
        self._steps_in_window = 0
        self._windows += 1
        if skipped > limit:
            self._fall_back(f"fp16 produced non-finite gradients in {skipped} of the last {GUARD_WINDOW} steps")

    def _fall_back(self, why: str) -> None:
        fp32 = replace(self.strategy or Strategy(), precision="fp32")
        message = f"{why}: falling back to {fp32.label} for {self.name}."
        warnings.warn(message, RuntimeWarning, stacklevel=3)
        self.report.note(message)
        self.report.decisions.append(Decision("all calls", fp32, "fallback", why))
        self.fell_back = True
        self._use(fp32)


def _switch_to_fused(optimizer: torch.optim.Optimizer) -> None:
    """Switch an Adam/AdamW to its fused kernel, as a private setting of this process: its `state_dict()` keeps the
    user's own `foreach`/`fused` values (a checkpoint loaded into a plain script's optimizer leaves it as that script
    made it, not fused), and `load_state_dict` (a resume) switches it back to fused, with its step counts where the
    fused kernel keeps them (as torch loads them for a fused optimizer)."""
    originals = [(group.get("foreach"), group.get("fused")) for group in optimizer.param_groups]

    def fuse(opt: torch.optim.Optimizer) -> None:
        for group in opt.param_groups[:len(originals)]:
            group["foreach"], group["fused"] = False, True
            for p in group["params"]:
                step = opt.state.get(p, {}).get("step")
                if isinstance(step, torch.Tensor) and (step.device != p.device or step.dtype != torch.float32):
                    opt.state[p]["step"] = step.to(dtype=torch.float32, device=p.device)
        opt._step_supports_amp_scaling = True  # as torch.optim.Adam(fused=True) sets it

    def saved(opt: torch.optim.Optimizer, state_dict: dict) -> dict:
        for group, (foreach, fused) in zip(state_dict["param_groups"], originals):
            group["foreach"], group["fused"] = foreach, fused
        return state_dict

    fuse(optimizer)
    optimizer.register_state_dict_post_hook(saved)
    optimizer.register_load_state_dict_post_hook(fuse)


def _needs_closure(optimizer: torch.optim.Optimizer) -> bool:
    """Whether `optimizer.step` must be given a closure (torch.optim.LBFGS: `step(closure)`, no default)."""
    try:
        closure = inspect.signature(optimizer.step).parameters.get("closure")
    except (TypeError, ValueError):  # (a step without a signature to read: stepped as the others)
        return False
    return closure is not None and closure.default is inspect.Parameter.empty


def _fused_request(value: bool | str | None) -> bool | str:
    """`fused_optimizer` as True, False or "auto" (None: "auto", a setting left unset); anything else is refused in
    one sentence."""
    if isinstance(value, bool):
        return value
    if value is None:
        return "auto"
    text = str(value).strip().lower()
    mapping = {"auto": "auto", "true": True, "on": True, "false": False, "off": False}
    if text not in mapping:
        raise UserError(f"Unknown fused_optimizer setting {value!r}: use auto, True or False.")
    return mapping[text]


def _fused_blocker(optimizer: torch.optim.Optimizer, device: torch.device) -> str | None:
    """Why an optimizer cannot be switched to its fused kernel (None: it can)."""
    if type(optimizer) not in FUSED_OPTIMIZERS:
        return f"only {', '.join(c.__name__ for c in FUSED_OPTIMIZERS)} are switched"
    if device.type not in FUSED_DEVICES:
        return f"no fused kernel used on {device.type}"
    for group in optimizer.param_groups:
        if group.get("fused"):
            return "already fused"
        if group.get("differentiable") or group.get("capturable"):
            return "differentiable/capturable optimizers are left alone"
        for p in group["params"]:
            if p.is_sparse or not p.is_floating_point() or p.device.type != device.type:
                return "it holds parameters the fused kernel does not take"
    return None


def _grad_scaler(device: torch.device) -> Any:
    """torch.amp.GradScaler for the device (torch_npu also ships its own under torch.npu.amp)."""
    try:
        return torch.amp.GradScaler(device.type)
    except (RuntimeError, ValueError, TypeError):
        backend_amp = getattr(getattr(torch, device.type, None), "amp", None)
        if backend_amp is not None and hasattr(backend_amp, "GradScaler"):
            return backend_amp.GradScaler()
        raise


def _loss_of(outputs: Any) -> torch.Tensor:
    if isinstance(outputs, torch.Tensor):
        loss = outputs
    elif isinstance(outputs, (tuple, list)) and outputs and isinstance(outputs[0], torch.Tensor):
        loss = outputs[0]
    elif isinstance(outputs, dict) and isinstance(outputs.get("loss"), torch.Tensor):
        loss = outputs["loss"]
    else:
        raise UserError("The loss function must return a scalar loss tensor, a tuple whose first item is the loss, "
                        "or a dict with a 'loss' entry.")
    if loss.numel() != 1:
        raise UserError(f"The loss must be a scalar (one element), got shape {tuple(loss.shape)}: take .mean().")
    if not loss.requires_grad:
        raise UserError("The loss does not depend on any parameter that requires grad: compute it from the model's "
                        "outputs, outside torch.no_grad() and without .detach()." if torch.is_grad_enabled() else
                        "The update step was called inside torch.no_grad() (or torch.inference_mode()), where no "
                        "gradient can be taken: call it outside that block.")
    return loss


def _detached(outputs: Any) -> Any:
    return to_float32(map_tensors(outputs, torch.Tensor.detach))


def _unique(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    seen: set[int] = set()
    result = []
    for tensor in tensors:
        if id(tensor) not in seen:
            seen.add(id(tensor))
            result.append(tensor)
    return result


class _BufferSnapshot:
    """What a loss function may change besides autograd, saved before the search runs it and put back afterwards.

    The search runs `loss_fn` dozens of times; a train-mode BatchNorm inside it would update its running statistics
    (and num_batches_tracked) on each run. The buffers of every module it runs are found by a global forward pre-hook
    active during one call (`watch`), the first, fp32 eager, dry run: every module called inside `loss_fn` is covered
    however it is reached. The tensors it reaches by name (`named_tensors_and_modules`: a running normaliser in its
    closure or on `self`) and the buffers of the modules it names, which it may change outside a forward
    (`self.return_norm.update(returns)`), are put back where they changed; one larger than `NAMED_SNAPSHOT_BYTES`
    (a replay buffer the loss indexes) is not copied, and a change to it that its version counter shows is reported
    (`restore`). So are the states of the random generators `loss_fn` draws from
    (`torch.randn(..., generator=g)`): those given (the ones it names, and its arguments'), saved now, and those the
    modules it calls hold as attributes, saved before their first forward. Not covered: tensors reached otherwise
    (deeper attributes, helper functions), which `loss_fn` should not change.
    """

    def __init__(self, generators: Iterable[torch.Generator] = (), named: Iterable[torch.Tensor] = ()) -> None:
        self.saved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.generators: dict[int, tuple[torch.Generator, torch.Tensor]] = {}
        for generator in generators:
            self._save_generator(generator)
        self.named: dict[int, tuple[torch.Tensor, int, torch.Tensor | None]] = {}
        for tensor in named:
            # (parameters only the optimizer changes; an inference tensor cannot be changed outside inference_mode)
            if id(tensor) not in self.named and not tensor.requires_grad and not tensor.is_inference():
                small = tensor.numel() * tensor.element_size() <= NAMED_SNAPSHOT_BYTES
                self.named[id(tensor)] = (tensor, tensor._version, tensor.detach().clone() if small else None)
        self.watched = False
        self.thread = threading.get_ident()

    def _save_generator(self, generator: torch.Generator) -> None:
        if id(generator) not in self.generators:
            self.generators[id(generator)] = (generator, generator.get_state())

    def _see(self, module: nn.Module, args: Any) -> None:
        if threading.get_ident() != self.thread:  # the hook is global: leave other threads' modules alone
            return
        for buffer in module.buffers():  # recursive: a parent's pre-hook runs before its children change anything
            # (a named one copied before the search is put back from that copy: the loss function may have changed
            # it before this forward, `norm.update(x)` then `norm(x)`)
            named = self.named.get(id(buffer))
            if id(buffer) not in self.saved and (named is None or named[2] is None):
                self.saved[id(buffer)] = (buffer, buffer.detach().clone())
        for generator in own_generators(module.modules()):
            self._save_generator(generator)

    @contextlib.contextmanager
    def watch(self) -> Iterator[None]:
        self.watched = True
        handle = register_module_forward_pre_hook(self._see)
        try:
            yield
        finally:
            handle.remove()

    def restore(self) -> list[str]:
        """Put everything back; returns the shapes of the named tensors changed in place that were too large to
        copy (they now hold what the search's runs left)."""
        lost = []
        with torch.no_grad():
            for tensor, version, saved in self.named.values():
                # (compared by value where copied: kernels such as batch_norm's update running statistics without
                # counting a version; a tensor left as it was is not written, which would count one)
                if saved is not None:
                    if not torch.equal(tensor, saved):
                        tensor.copy_(saved)
                elif tensor._version != version and id(tensor) not in self.saved:
                    lost.append(str(tuple(tensor.shape)))
            for buffer, saved in self.saved.values():
                buffer.copy_(saved)
        for generator, state in self.generators.values():
            generator.set_state(state)
        return lost
