"""The one place that decides which implementation of an algorithm's gradient update runs, and says why.

Every algorithm's update is an `UpdateStep`: `step(*batch) -> (loss, metrics)` (zero_grad, loss, backward,
all-reduce, clipping, optimizer step). Its reference is the autograd of the algorithm's `_loss`; SAC and TD3 take two
autograd steps per batch (`_critic_loss`, then `_actor_loss` through the updated critics: two `UpdateStep`s, chosen
by the same rules; SAC's hand-derived update does both). Alternatives must match the reference step by step
(tests/test_fused_*.py):

* ``hand-derived``: the gradient written out for rlspeed's default MLPs with Adam (A2C: RMSprop) on one flat buffer
  (`rlspeed.fused`), the fast form on CPUs where per-kernel overhead dominates (benchmarks/fused_updates.py);
* ``autograd+graphs``: the autograd step captured and replayed as one whole-step graph (`accelerate_step`) on
  devices with graphs (CUDA), where launching kernels one by one is the cost (benchmarks/cuda_check.sh);
* ``autograd``: the reference itself, fp32 eager, or as `accelerate_step` measured it with `--accelerate auto` (a
  reduced precision it chose checked against fp32 again as training goes on, `rlspeed.accel.recheck`, as the
  hand-derived updates' is).

`select_update` applies these rules in order and records the first that decided in `UpdateChoice`, which
`summary.json` (`update`) and `model.report()` show:

1. a subclass that overrides `_loss` (SAC: `_critic_loss` or `_actor_loss`; DQN: also `_update`, which feeds the
   loss its batch) trains with its own: autograd;
2. `fused_update=False`: autograd;
3. gSDE (`use_sde=true`: state-dependent noise the hand-derived gradients do not cover), a network the
   hand-derived update does not cover (say `activation=elu`), or an optimizer other than the plain torch.optim.Adam
   (A2C: RMSprop, or Adam) it steps (a subclass's `_make_optimizer`, or an optimizer put in place of the model's
   later: `Algorithm._follow_replaced_optimizers` makes the step again): autograd;
4. a device with whole-step graphs and an optimizer a capture can record (Adam, AdamW; not A2C's RMSprop, which
   goes on to the next rules): autograd+graphs;
5. `RLSPEED_ACCELERATE` forcing a strategy the hand-derived update cannot run (bf16 autocast, compile): autograd;
6. otherwise hand-derived (with `--accelerate auto`, in the matmul precision measured fastest within tolerance).
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from rlspeed.accel.graphs import optimizer_capture_blocker
from rlspeed.accel.introspect import parameter_names
from rlspeed.accel.step import AcceleratedStep
from rlspeed.accel.strategy import ENV_VAR, normalise_request
from rlspeed.device import rules
from rlspeed.fused import precision as fused_precision
from rlspeed.fused.flat import plain_optimizer_reason
from rlspeed.nn import clip_grad_norm, step_without_dynamo, steps_without_dynamo, zero_grad_without_dynamo

HAND_DERIVED, AUTOGRAD, GRAPHS = "hand-derived", "autograd", "autograd+graphs"


@dataclasses.dataclass(frozen=True)
class UpdateChoice:
    """Which update implementation runs (`HAND_DERIVED`, `AUTOGRAD` or `GRAPHS`) and the rule that chose it.

    implementation: one of those three names; reason: the rule, in words (as summary.json's `update` gives it);
    by_frozen_parameters: the rule that decided was frozen parameters (a model whose parameters are all trained again
    chooses anew).
    """

    implementation: str
    reason: str
    #: the rule that decided was frozen parameters (a model whose parameters are all trained again chooses anew)
    by_frozen_parameters: bool = False

    def as_dict(self) -> dict[str, str]:
        return {"implementation": self.implementation, "reason": self.reason}


class UpdateStep:
    """One gradient update behind one call: `step(*batch, **hints) -> (loss, metrics)`.

    `hints` are optional shortcuts an implementation may take (PPO's `normalized`, `with_stats`); others ignore them,
    so a caller never needs to know which implementation runs. `fn`: the implementation, called with the batch (and
    the hints where `accepts_hints`); `choice`: the `UpdateChoice` that picked it. `updates_targets`: the
    implementation also moves the target networks (the hand-derived SAC update does its Polyak step itself).
    `report`: the acceleration layer's report, when it chose anything (None otherwise); `hand_derived`: the bare
    hand-derived update object, for algorithm-specific fast paths (None for the other implementations);
    `optimizer`: the optimizer it was made for (the model makes the step again where another takes its place).
    """

    def __init__(self, fn: Callable[..., tuple[torch.Tensor, Any]], choice: UpdateChoice, *,
                 accepts_hints: bool = False, updates_targets: bool = False, report: Any = None,
                 hand_derived: Any = None, optimizer: torch.optim.Optimizer | None = None):
        self.fn, self.choice = fn, choice
        self.accepts_hints, self.updates_targets = accepts_hints, updates_targets
        self.report = report  # the acceleration layer's report, when it chose anything
        self.hand_derived = hand_derived  # the bare hand-derived update object, for algorithm-specific fast paths
        self.optimizer = optimizer  # the optimizer it was made for

    def __call__(self, *batch, **hints):
        return self.fn(*batch, **hints) if self.accepts_hints else self.fn(*batch)

    def precision_context(self, updates: int = 1):
        """The context the hand-derived update's next `updates` updates run in (its measured matmul precision, fp32
        while its search waits); None where the step's own call must come next (before its first, when its search is
        due, and when a check of its reduced precision against fp32 is due within those updates)."""
        return fused_precision.chosen_precision(self.fn, updates)

    def timed(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)`: the hand-derived update run outside this step's call (DQN's on prepared batches), its time
        counted towards the precision search's wait (`AutoMatmulPrecision.timed`) while that waits, and towards the
        next check of a reduced precision chosen after."""
        timed = getattr(self.fn, "timed", None)
        return fn(*args) if timed is None else timed(fn, *args)

    @property
    def imports_dynamo(self) -> bool:
        """Whether its calls import torch._dynamo: the acceleration layer's steps (compile, graph capture) do, and
        the fp32 eager autograd step where torch steps its optimizer otherwise than `step_without_dynamo` covers;
        the hand-derived update does not."""
        if self.choice.implementation == HAND_DERIVED:
            return False
        return not (isinstance(self.fn, _AutogradStep) and steps_without_dynamo(self.fn.optimizer))


class _AutogradStep:
    """`autograd_step`'s update (a class, not a closure: a model holding it pickles, for multiprocessing)."""

    def __init__(self, loss_fn, optimizer, params, max_grad_norm, strategy):
        self.loss_fn, self.optimizer, self.params = loss_fn, optimizer, list(params)
        self.max_grad_norm, self.strategy = max_grad_norm, strategy

    def __call__(self, *batch):
        loss, metrics = self.loss_fn(*batch)
        zero_grad_without_dynamo(self.optimizer)
        loss.backward()
        self.strategy.all_reduce_gradients(self.params)  # no-op in a single process
        if self.max_grad_norm is not None:
            clip_grad_norm(self.params, self.max_grad_norm)
        step_without_dynamo(self.optimizer)
        return loss.detach(), metrics


class WeakBoundLoss:
    """An algorithm's own loss method, held without holding the algorithm.

    An algorithm keeps its update step, and the step its loss: holding the bound method would hold the algorithm
    in a reference cycle, which only the cyclic garbage collector frees (`del model` would keep its tensors and
    device memory until a full collection). It reads as the bound method (`__self__`, `__func__`) for
    `accelerate_step`'s introspection, and pickles as it.
    """

    def __init__(self, method: Callable[..., Any]):
        self._method = weakref.WeakMethod(method)

    def bound(self) -> Callable[..., Any]:
        method = self._method()
        if method is None:
            raise ReferenceError("This update step's model has been deleted.")
        return method

    @property
    def __self__(self) -> Any:
        return self.bound().__self__

    @property
    def __func__(self) -> Any:
        return self.bound().__func__

    def __call__(self, *args, **kwargs):
        return self.bound()(*args, **kwargs)

    def __reduce__(self):
        return WeakBoundLoss, (self.bound(),)


def autograd_step(loss_fn: Callable[..., tuple[torch.Tensor, Any]], optimizer: torch.optim.Optimizer,
                  params: Sequence[torch.Tensor], max_grad_norm: float | None, strategy) -> Callable:
    """The reference update in fp32 eager: zero_grad, `loss_fn(*batch)`, backward, all-reduce, clip, step (the
    optimizer's methods reached without importing torch._dynamo where nothing has: `step_without_dynamo`)."""
    return _AutogradStep(loss_fn, optimizer, params, max_grad_norm, strategy)


def loss_owner(algo, method: str = "_loss") -> type | None:
    """The class in `algo`'s hierarchy that defines `method` (the `_loss` that actually runs), or None."""
    return next((cls for cls in type(algo).__mro__ if method in vars(cls)), None)


def select_update(algo, *, loss_fn: Callable, optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor],
                  max_grad_norm: float | None, name: str, reference_cls: type | None = None,
                  reference_methods: Sequence[str] = ("_loss",), hand_derived: Callable[[], Any] | None = None,
                  unsupported: str | None = None, updates_targets: bool = False,
                  optimizers: tuple[type, ...] = (torch.optim.Adam,)) -> UpdateStep:
    """The update step `algo` trains with (the rules are in this module's docstring).

    `loss_fn(*batch) -> (loss, metrics)`: the reference loss, which the autograd implementations differentiate;
    `optimizer` steps `params`, the trained tensors; `max_grad_norm`: the global gradient norm they are clipped to
    (None: no clipping); `name`: the update's name in the acceleration reports.
    `reference_cls`: the class whose loss methods (`reference_methods`, default `_loss`) the hand-derived update
    implements; `hand_derived`: builds it (None: the algorithm has none); `unsupported`: why this model's networks
    are outside what it covers (None: covered); `updates_targets`: the hand-derived update also does the target
    networks' Polyak step; `optimizers`: the optimizer classes the hand-derived update steps (`optimizer` must be
    one of them exactly, plainly configured).
    """
    device, accelerate, strategy = algo.device, algo.accelerate, algo.strategy
    if getattr(loss_fn, "__self__", None) is algo:
        loss_fn = WeakBoundLoss(loss_fn)
    # whole-step graphs do not all-reduce gradients: several processes keep the eager steps
    graphs = (rules(device).supports_graphs and normalise_request().graphs != "off" and not strategy.enabled)
    # (an optimizer a capture cannot record, A2C's RMSprop: no graph, so the hand-derived update where there is one)
    blocker = optimizer_capture_blocker([optimizer]) if graphs else None
    graphs = graphs and blocker is None
    not_graphed = f"; no whole-step CUDA graph: {blocker}" if blocker else ""
    by_frozen = 0
    if hand_derived is None:
        reason = f"{type(algo).__name__} has no hand-derived update"
    elif reference_cls is not None and (overridden := [
            (owner, method) for method in reference_methods
            if (owner := loss_owner(algo, method)) is not reference_cls]):
        owner, method = overridden[0]
        reason = (f"{owner.__name__}.{method} overrides {reference_cls.__name__}.{method} (the hand-derived update "
                  "implements rlspeed's)")
    elif not algo.config.fused_update:
        reason = "fused_update=false"
    elif getattr(algo.config, "use_sde", False):
        reason = "use_sde=true (gSDE; the hand-derived updates cover state-independent Gaussian noise only)"
    elif by_frozen := sum(not p.requires_grad for p in params):
        reason = (f"{by_frozen} frozen parameter tensor(s) (requires_grad=False: the hand-derived update steps every "
                  "parameter)")
    elif unsupported is not None:
        reason = unsupported
    elif (optimizer_reason := plain_optimizer_reason(optimizer, optimizers, params)) is not None:
        reason = optimizer_reason
    elif graphs:
        reason = f"whole-step graphs on {device.type}"
    elif accelerate == "auto" and not fused_precision.applies():
        reason = f"{ENV_VAR} forces a strategy the hand-derived update cannot run"
    else:
        update = hand_derived()
        step = fused_precision.for_accelerate(update, accelerate, device, name,
                                              parameter_names(loss_fn, update.adam.params))
        how = f"forced by {ENV_VAR}" if getattr(step, "forced", False) else "measured by --accelerate auto"
        reason = "default on this device" + (f" (matmul precision {how})" if accelerate == "auto" else "") + not_graphed
        return UpdateStep(step, UpdateChoice(HAND_DERIVED, reason), accepts_hints=True,
                          updates_targets=updates_targets, report=getattr(step, "report", None), hand_derived=update,
                          optimizer=optimizer)
    reason += not_graphed
    if graphs or accelerate == "auto":
        # On a graphs device without --accelerate auto: the fp32 eager step, captured (no precision or compile search).
        # `accelerate_step`'s step, whose reduced precision chosen is checked against fp32 again as training goes on
        # (`recheck`), as the hand-derived updates' is
        options = {} if accelerate == "auto" else {"precision": "fp32", "compile": False}
        step = AcceleratedStep(loss_fn, optimizer, params=list(params), max_grad_norm=max_grad_norm, device=device,
                               name=name, recheck=True, **options)
        return UpdateStep(step, UpdateChoice(GRAPHS if graphs else AUTOGRAD, reason, bool(by_frozen)),
                          report=step.report, optimizer=optimizer)
    return UpdateStep(autograd_step(loss_fn, optimizer, params, max_grad_norm, strategy),
                      UpdateChoice(AUTOGRAD, reason, bool(by_frozen)), optimizer=optimizer)
