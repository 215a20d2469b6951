"""`auto_accelerate(model)`: the same module, on the best device, running the fastest strategy that stays accurate.

The module is accelerated in place, the way `Module.to` works: its class is swapped for a subclass of its own class
whose `forward` goes through the accelerator. Everything else is the original object, so `parameters()` are the
same Parameter objects (an optimizer made before keeps working), `state_dict()` keys are unchanged (plain modules
load its checkpoints and it loads theirs), `isinstance` still holds, attributes and methods are the user's own, and
methods that call `self(...)` (such as `act`) are accelerated too. `copy.deepcopy` and pickling work (a copy keeps
the decisions already made; compiled code is rebuilt lazily).

The strategy is decided per kind of call: the batch size's power-of-two bucket, whether gradients are enabled, and
train/eval mode.
A rollout step (a few rows, no_grad) and an update minibatch (hundreds of rows, with backward) can want different
precisions; each gets its own decision. A kind of call with a cached decision uses it from its first call. Otherwise
it runs eager fp32, timed, and is searched only once its calls have taken long enough that the search costs at most
`SEARCH_COST_SHARE` of that time (`search.expected_search_s`): the line never makes a script slower by more than
that share, a short script or a model too small to gain never pays for a search, and a long run of a large model
gets its speed-up after a short while. ``example_inputs=`` searches at once.

Inside an accelerated step's loss function (`accelerate_step`) the module runs its plain forward: the step's strategy
applies to the whole loss there.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import nn

from rlspeed.accel import cache
from rlspeed.accel.compile import (
    CompileCounter,
    batch_size_of,
    bucket_size,
    compile_function,
    graph_safe,
)
from rlspeed.accel.inputs import InputConverter, floating_dtype, map_tensors, opaque_leaf, tensors_in, to_float32
from rlspeed.accel.introspect import generators_in, made_as, own_generators
from rlspeed.accel.report import AccelReport, Decision, Trial
from rlspeed.accel.search import expected_search_s, run_search, store_choice
from rlspeed.accel.strategy import (
    EAGER_FP32,
    BackwardPrecisionHook,
    Request,
    Strategy,
    candidates,
    normalise_request,
    uses_matmul_precision,
)
from rlspeed.accel.strategy import with_precision as _with_precision
from rlspeed.device import describe, resolve_device
from rlspeed.errors import UserError, no_such_keyword

# A kind of call is searched once the time spent in its calls is at least the search's expected cost divided by this.
SEARCH_COST_SHARE = 0.03

#: Per thread: how deep it is in calls of accelerated steps' loss functions (`in_step`). An accelerated module called
#: there runs its plain forward: the step's strategy, checked against fp32 on the loss itself, is the one that applies
#: (a module's own check sees its outputs only, and a reduced precision it chose would run inside a step that chose
#: fp32, and inside the step search's fp32 reference).
_STEP_SCOPE = threading.local()
#: The report's note once the module is called inside a step's loss function: a module called only there has no
#: decision of its own, and its report says where its calls' choice is.
IN_STEP_NOTE = ("called inside an accelerated step's loss function: those calls run its plain forward, in what the "
                "step chose (the step's report); its own decisions are for its calls outside steps")

_CLASS_ATTRIBUTE = "_rlspeed_accelerated_class"  # where `_accelerated_class` keeps a class's accelerated subclass
_FAST_SCALARS = (bool, int, float)  # argument types the fast path of a call passes as they are (as the converter does)
_ALL_BUCKETS = (None, *(1 << i for i in range(48)))  # every signature batch bucket (for fixed plain strategies)


_Module = TypeVar("_Module", bound=nn.Module)


def auto_accelerate(model: _Module, *, device: str | torch.device | None = "auto", precision: str = "auto",
                    compile: bool | str = "auto", graphs: bool | str = "auto",
                    example_inputs: Any = None, **unknown: Any) -> _Module:
    """Accelerate a module in place and return it; use it exactly like before.

    Args:
        model: any Python ``nn.Module``.
        device: ``auto`` (the accelerator the model is on already, else npu > cuda > xpu > mps > cpu, the current
            device of that type: ``torch.cuda.set_device(LOCAL_RANK)``'s), a device string or a torch.device; the
            model moves there.
            Inputs given as numpy arrays, lists or tensors elsewhere are moved and converted (float64 to the
            model's floating dtype, so float32 unless the model is float64; narrower signed integers widened to
            the device's index dtype, int64 kept); outputs stay on the device.
        precision: ``auto`` (the fastest of the reduced precisions below that is measured faster and stays within
            tolerance, else fp32), ``fp32``, ``bf16-matmul`` (CPU: fp32 tensors, matmuls computed in bf16 by
            oneDNN), ``tf32`` (CUDA: the same with TF32) or ``bf16`` (autocast). fp16 needs a GradScaler, which
            needs an optimizer: use `accelerate_step` for it.
        compile: ``auto`` (torch.compile candidates on CUDA and on NPU with torchair; not on CPU, where inductor
            compiles for tens of seconds), True, False or a backend name.
        graphs: ``auto`` (CUDA graph capture of compiled candidates on CUDA), True or False.
        example_inputs: positional arguments of a representative call (a tensor or a tuple) to decide now;
            otherwise the first call of each kind decides.

    ``RLSPEED_ACCELERATE=off|fp32|bf16|compile|bf16+compile|...`` forces a strategy (no search).
    After the call, ``model.accel_report`` tells what was tried and chosen, ``model.accel_compilations`` how many
    graphs torch.compile has built.
    """
    if unknown:
        raise no_such_keyword("auto_accelerate", next(iter(unknown)), auto_accelerate, name_all=True)
    if isinstance(model, torch.jit.ScriptModule):
        raise UserError("auto_accelerate needs a Python nn.Module; a TorchScript module cannot be accelerated.")
    if not isinstance(model, nn.Module) and hasattr(model, "config_cls") and hasattr(model, "learn"):  # (a model)
        raise UserError(f"auto_accelerate takes a torch.nn.Module of your own training code, not an rlspeed model "
                        f"(a {type(model).__name__}), which accelerates its own steps: make it with "
                        f"accelerate='auto' ({type(model).__name__}(env_id, accelerate='auto'); the command line's "
                        "--accelerate auto).")
    if not isinstance(model, nn.Module):
        raise UserError(f"auto_accelerate expects a torch.nn.Module, got {type(model).__name__}.")
    original = getattr(model, "_orig_mod", None)  # a torch.compile()d module: accelerate what it wraps
    unwrapped = isinstance(original, nn.Module) and type(model).__name__ == "OptimizedModule"
    if unwrapped:
        model = original
    if type(model).forward is nn.Module.forward:  # (CleanRL's Agent: methods that call its submodules)
        raise UserError(f"{type(model).__name__} has no forward() for auto_accelerate to speed up: accelerate the "
                        "submodules its methods call (e.g. agent.actor = auto_accelerate(agent.actor)), or wrap the "
                        "update in accelerate_step.")
    target = _target_device(model, device)
    request = normalise_request(precision, compile, graphs)
    base = made_as(model)
    # (made before the model changes: a request the device refuses leaves the model as it was)
    accelerator = ModuleAccelerator(base, target, request, floating_dtype(model.parameters()))
    if unwrapped:
        _say_compile_replaced(accelerator)
    before = type(model), model.__dict__.get("_rlspeed_accelerator")
    model.to(target)  # in place: the Parameter objects stay the same
    model.__class__ = _accelerated_class(base)
    model.__dict__["_rlspeed_accelerator"] = accelerator
    if example_inputs is not None:
        args = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
        try:
            accelerator.prepare(model, args, {})
        except BaseException:  # (example inputs the model refuses: it stays callable as it was)
            model.__class__ = before[0]
            if before[1] is None:
                model.__dict__.pop("_rlspeed_accelerator", None)
            else:
                model.__dict__["_rlspeed_accelerator"] = before[1]
            raise
    return model


def _say_compile_replaced(accelerator: ModuleAccelerator) -> None:
    """`auto_accelerate` was given a torch.compile()d module and returns the module it wraps: the report says so, and
    a warning too where none of the candidates compiles (the user's compilation would be dropped unseen)."""
    compiles = any(s.compile != "off" for s in accelerator._candidates)
    message = ("auto_accelerate was given a torch.compile()d module: it returns the module inside, accelerated, "
               "whose compilation its own setting decides: "
               + ("its candidates include torch.compile" if compiles else
                  f"none of its candidates on {accelerator.device.type} compiles (see its notes), so the model runs "
                  "uncompiled; pass compile=True to time torch.compile among them"))
    accelerator.report.note(message + ".")
    if not compiles:
        warnings.warn(message + ".", stacklevel=3)


def _target_device(model: nn.Module, device) -> torch.device:
    """Where `auto_accelerate` places `model`: `device`, except that ``auto`` keeps a model already on an
    accelerator where it is (a script's `model.to("cuda:1")`, or each torchrun rank's device: moving it to device 0
    would part it from the tensors the script puts beside it)."""
    auto = device is None or (isinstance(device, str) and device.strip().lower() == "auto")
    # (RLSPEED_DEVICE naming another type or an index is the user's choice, which `resolve_device` takes; a bare
    # type the model is on already keeps its placement)
    forced = os.environ.get("RLSPEED_DEVICE", "").strip().lower()
    if auto:
        placed = next((t.device for t in (*model.parameters(), *model.buffers())), None)
        if placed is not None and placed.type != "cpu" and forced in ("", "auto", placed.type):
            return placed
    auto = auto and forced in ("", "auto")
    target = resolve_device(device)
    if auto and target.type == "cpu":  # (an accelerator's software here but unusable: said, not silently the CPU)
        from rlspeed.diagnostics.doctor import idle_accelerator

        idle = idle_accelerator()
        if idle is not None:
            warnings.warn(f"auto_accelerate runs the model on the CPU: {idle}; `rlspeed doctor` checks the whole "
                          "stack.", stacklevel=3)
    return target


class AcceleratedModule:
    """Mixin placed in front of the user's class by `auto_accelerate`; see the module docstring."""

    _rlspeed_base: type
    # torch.jit.script compiles every property of a module unless named here; these read the accelerator, which is
    # Python only. (Its forward is the user's: `inspect` unwraps the copy `_accelerated_class` makes to their source.)
    __jit_unused_properties__ = ["accel_report", "accel_strategy", "accel_compilations"]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the original `forward` through this module's accelerator (the strategy decided for this kind of call).

        The classes `auto_accelerate` builds override this with a copy carrying the user's signature and docstring.
        """
        return self.__dict__["_rlspeed_accelerator"](self, args, kwargs)

    @property
    def accel_report(self) -> AccelReport:
        """What was tried and chosen, per kind of call (`print` it)."""
        return self.__dict__["_rlspeed_accelerator"].report

    @property
    def accel_strategy(self) -> Strategy | None:
        """The strategy of the most recent decision (None before the first call)."""
        return self.__dict__["_rlspeed_accelerator"].report.chosen

    @property
    def accel_compilations(self) -> int:
        """Graphs torch.compile has compiled for this module so far (0 when nothing is compiled)."""
        return self.__dict__["_rlspeed_accelerator"].counter.compilations

    def _apply(self, fn, *args: Any, **kwargs: Any):
        """`nn.Module._apply` (what `.to()`, `.double()`, `.cuda()` ... run), then: parameters now on another device
        or of another floating dtype start a fresh accelerator there (the decisions and the input conversion were
        for the old ones)."""
        result = super()._apply(fn, *args, **kwargs)
        accelerator = self.__dict__.get("_rlspeed_accelerator")
        if accelerator is not None:
            first = next(self.parameters(), None)
            device = first.device if first is not None else accelerator.device
            dtype = floating_dtype(self.parameters())
            if device != accelerator.device or dtype != accelerator.converter.float_dtype:
                self.__dict__["_rlspeed_accelerator"] = ModuleAccelerator(type(self)._rlspeed_base, device,
                                                                          accelerator.request, dtype)
        return result

    def __reduce_ex__(self, protocol: int):
        # Rebuild through the original class, which pickle and deepcopy can find by name.
        return _restore, (type(self)._rlspeed_base,), self.__dict__.copy()


def _restore(base: type) -> nn.Module:
    return base.__new__(_accelerated_class(base))


def _accelerated_class(base: type) -> type:
    """The accelerated subclass of `base`, made once per class. It is kept on `base` itself (its own `__dict__`, not
    inherited), not in a module-level table: a table would keep every class a process ever accelerated alive, with
    all they hold (a notebook cell or a factory defining a new class per run); on the class, the two form a cycle
    the garbage collector frees with it."""
    cached = base.__dict__.get(_CLASS_ATTRIBUTE)
    if cached is None:

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            return self.__dict__["_rlspeed_accelerator"](self, args, kwargs)

        functools.update_wrapper(forward, base.forward)  # the user's signature and docstring, for inspect/help
        namespace = {"forward": forward, "_rlspeed_base": base, "__module__": base.__module__,
                     "__qualname__": base.__qualname__, "__doc__": base.__doc__}
        cached = type(base.__name__, (AcceleratedModule, base), namespace)
        setattr(base, _CLASS_ATTRIBUTE, cached)
    return cached


def _recording() -> bool:
    """Whether the current call is being recorded rather than run: `torch.jit.trace` (and the TorchScript ONNX
    exporter), or `torch.compile` / `torch.export` tracing the model. Such calls run the plain `forward`: what they
    record is the model itself, not this module's timing and search (which would break their graph)."""
    return torch._C._get_tracing_state() is not None or torch.compiler.is_compiling()


def unaccelerate(model: nn.Module) -> nn.Module:
    """Undo `auto_accelerate` in place (the original class back; parameters untouched) and return the model."""
    if isinstance(model, AcceleratedModule):
        model.__dict__.pop("_rlspeed_accelerator", None)
        model.__class__ = type(model)._rlspeed_base
    return model


class ModuleAccelerator:
    """Per-module state: the request, one decision per call signature, the built runners, compile counts."""

    def __init__(self, base: type, device: torch.device, request: Request, float_dtype: torch.dtype = torch.float32):
        self.base_forward: Callable = base.forward
        self.device = device
        self.request = request
        self.converter = InputConverter(device, float_dtype)
        self.counter = CompileCounter()
        self.report = AccelReport(f"module {base.__name__}", describe(device), request.to_dict(),
                                  notes=list(request.notes))
        self.strategies: dict[tuple, Strategy] = {}
        self.runners: dict[Strategy, Callable] = {}
        # signatures decided as eager fp32 (the fast path of __call__), each with its decision, which counts its calls
        self._plain: dict[tuple, Decision] = {}
        self._decisions: dict[tuple, Decision] = {}  # every decided signature's decision (its calls counted)
        self._waiting: dict[tuple, _Waiting] = {}  # signatures running eager fp32 until a search pays for itself
        self.searches = 0  # searches run (each times every candidate)
        self.called_in_step = False  # whether it was called inside an accelerated step's loss function (`IN_STEP_NOTE`)
        self._local = threading.local()  # (per thread: a nested call in one thread is no nested call in another)
        self._make_locks()
        self._candidates, notes = candidates(request, device, allow_fp16=False, float_dtype=float_dtype)
        compiled = sum(s.compile != "off" for s in self._candidates)
        self._candidate_counts = (len(self._candidates) - compiled, compiled)
        for note in notes:
            self.report.note(note)
        # With one candidate there is nothing to measure: one strategy for every call.
        fixed = self._candidates[0] if len(self._candidates) == 1 else None
        self._single = fixed
        self._single_decision: Decision | None = None
        if fixed is not None:
            forced = request.forced_by_env
            self._single_decision = Decision(
                "all calls", fixed, "forced" if forced else "only candidate",
                f"RLSPEED_ACCELERATE={forced}" if forced else "nothing else to try with these settings")
            self.report.decisions.append(self._single_decision)
        if fixed is not None and fixed.is_plain:
            self._plain.update(((bucket, grad, training), self._single_decision) for bucket in _ALL_BUCKETS
                               for grad in (False, True) for training in (False, True))

    @property
    def _depth(self) -> int:
        """How deep this thread is in accelerated calls of this module (a call inside one runs as is)."""
        return self._local.__dict__.get("depth", 0)  # (the thread's own dict: no AttributeError raised and caught)

    @_depth.setter
    def _depth(self, value: int) -> None:
        self._local.depth = value

    # pickling / deepcopy: decisions travel, compiled code and runners are rebuilt on demand
    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["runners"] = {}
        for name in ("_local", "_first_call_lock", "_search_lock"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("called_in_step", False)  # (pickled before it existed)
        self._local = threading.local()
        self._make_locks()

    def _make_locks(self) -> None:
        # Calls from several threads (a server's) decide each kind of call once: the first calls of a kind wait for
        # one cache lookup (`_first_call_lock`, held only for that and for building a runner), so that each sees the
        # cached choice a single-threaded first call would run; one thread at a time searches (`_search_lock`),
        # while calls from the others run eager fp32, as the kind's calls before its decision do, and do not wait.
        self._first_call_lock = threading.Lock()
        self._search_lock = threading.Lock()

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict) -> Any:
        # (the fast path's checks are what every call of a small model pays: each is the cheapest form of itself)
        if self._local.__dict__.get("depth"):  # a nested call (a method calling self() inside an accelerated call)
            return self.base_forward(module, *args, **kwargs)
        if _STEP_SCOPE.__dict__.get("depth"):  # a call inside an accelerated step's loss function
            if not self.called_in_step:
                self.called_in_step = True
                self.report.note(IN_STEP_NOTE)
            return self.base_forward(module, *args, **kwargs)
        if args:  # fast path: tensors already in place (policy(obs), critic(obs, action), lstm(x, (h, c)),
            # model(x, scale=2.0)), a plain or a waiting kind of call; the batch size is the first one of at least two
            # dimensions in argument order (`batch_size_of`); numbers and None pass as the converter passes them
            device, convert, size = self.device, self.converter.convert_dtypes, None
            for x in (args if not kwargs else (*args, *kwargs.values())):
                if type(x) is torch.Tensor:
                    if x.device != device or x.dtype in convert:
                        break
                    if size is None and x.ndim >= 2:
                        size = x.shape[0]
                elif type(x) is tuple:  # (a recurrent policy's state, (h, c), in place alike: no conversion either)
                    for t in x:
                        if type(t) is not torch.Tensor or t.device != device or t.dtype in convert:
                            break
                        if size is None and t.ndim >= 2:
                            size = t.shape[0]
                    else:
                        continue
                    break
                elif x is not None and type(x) not in _FAST_SCALARS:
                    break
            else:
                if size is not None and type(size) is not int:  # (torch.jit.trace: shapes are traced values)
                    return self.base_forward(module, *args, **kwargs)
                key = (1 << (size - 1).bit_length() if size is not None else None, torch.is_grad_enabled(),
                       module.training)
                decision = self._plain.get(key)
                if decision is not None:
                    decision.calls += 1
                    return self.base_forward(module, *args, **kwargs)
                waiting = self._waiting.get(key)
                if waiting is not None and waiting.spent_s < waiting.threshold_s:
                    return self._timed(waiting, module, args, kwargs)
        if _recording():  # (tracing, TorchScript ONNX export, torch.compile of this module: they record the model)
            return self.base_forward(module, *args, **kwargs)
        args, kwargs = self.converter(args, kwargs)
        strategy = self._single
        if strategy is not None:
            self._single_decision.calls += 1
        else:
            signature = self._signature(module, args, kwargs)
            strategy = self.strategies.get(signature)
            if strategy is None:
                waiting = self._waiting.get(signature)
                if waiting is None and batch_size_of(args, kwargs) != 0:
                    with self._first_call_lock:  # (another thread's first call of this kind may be deciding it)
                        strategy = self.strategies.get(signature)
                        waiting = self._waiting.get(signature)
                        if strategy is None and waiting is None:
                            strategy = self._known(module, args, kwargs, signature)
                            waiting = self._waiting.get(signature)
                if strategy is None:
                    # (the threshold is re-estimated only once the calls reach it, as on the fast path above: a
                    # call of several arguments or of a numpy array pays a comparison, not the estimate)
                    if waiting is None or waiting.spent_s < waiting.threshold_s or not self._search_due(waiting):
                        return self._timed(waiting, module, args, kwargs)
                    if not self._search_lock.acquire(blocking=False):  # another thread searches: eager fp32 meanwhile
                        return self.base_forward(module, *args, **kwargs)
                    try:  # (decided meanwhile by a search that just ended: not searched again)
                        strategy = self.strategies.get(signature) or self._search_signature(module, args, kwargs,
                                                                                            signature)
                    finally:
                        self._search_lock.release()
            decision = self._decisions.get(signature)
            if decision is not None:
                decision.calls += 1
        if strategy.is_plain:
            return self.base_forward(module, *args, **kwargs)
        runner = self._runner(module, strategy)
        self._depth += 1
        try:
            return runner(*args, **kwargs)
        finally:
            self._depth -= 1

    def _timed(self, waiting: _Waiting | None, module: nn.Module, args: tuple, kwargs: dict) -> Any:
        """An eager fp32 call of a kind not decided yet, its time added to what a search of that kind must earn."""
        if waiting is None or torch.compiler.is_compiling():  # (an empty batch, or compiled code: nothing to time)
            return self.base_forward(module, *args, **kwargs)
        started = time.perf_counter()
        outputs = self.base_forward(module, *args, **kwargs)
        waiting.spent_s += time.perf_counter() - started
        waiting.calls += 1
        waiting.decision.calls += 1
        return outputs

    def _search_due(self, waiting: _Waiting) -> bool:
        return waiting.search_due(*self._candidate_counts, what="calls like this")

    @staticmethod
    def _signature(module: nn.Module, args: tuple, kwargs: dict) -> tuple:
        # train/eval mode is part of it, as in the disk key: a choice checked with dropout or batch statistics on
        # is not reused for eval calls, which compute something else
        batch = batch_size_of(args, kwargs)
        return (bucket_size(batch) if batch is not None else None, torch.is_grad_enabled(), module.training)

    @staticmethod
    def _label(signature: tuple) -> str:
        batch, grad, training = signature
        label = f"batch<={batch}" if batch is not None else "unbatched"
        label += ", with grad" if grad else ", no_grad"
        return label + ("" if training else ", eval")

    def prepare(self, module: nn.Module, args: tuple, kwargs: dict) -> Strategy:
        """Decide the strategy for calls like this one now (forced, cached, or searched now) and remember it."""
        args, kwargs = self.converter(args, kwargs)
        if batch_size_of(args, kwargs) == 0:
            # An empty batch (model(obs[done]) with nothing done) has nothing to measure or to verify rows with, and
            # padding it is impossible: eager fp32 for this call, nothing decided.
            return EAGER_FP32
        if self._single is not None and self._single.is_plain:  # (decided when made: one plain candidate, nothing
            # to measure and no second decision)
            return self._single
        signature = self._signature(module, args, kwargs)
        with self._first_call_lock:
            strategy = self.strategies.get(signature) or (
                None if signature in self._waiting else self._known(module, args, kwargs, signature))
        if strategy is not None:
            return strategy
        with self._search_lock:
            return self.strategies.get(signature) or self._search_signature(module, args, kwargs, signature)

    def _known(self, module: nn.Module, args: tuple, kwargs: dict, signature: tuple) -> Strategy | None:
        """The cached strategy for a new kind of call; None when it has to be searched, and then the kind waits in
        eager fp32 (see the module docstring)."""
        record = cache.load(self._cache_key(module, args, kwargs, signature))
        if record is not None:
            try:
                strategy = Strategy.from_dict(record["chosen"])
                trials = [Trial.from_dict(t) for t in record.get("trials", [])]
                self._decide(signature, Decision(self._label(signature), strategy, "cache", record.get("reason", ""),
                                                 trials))
                return strategy
            except (KeyError, TypeError, ValueError):
                pass
        waiting = _Waiting(Decision(self._label(signature), EAGER_FP32, "waiting", ""))
        self._waiting[signature] = waiting
        self.report.decisions.append(waiting.decision)
        self._search_due(waiting)  # sets the first threshold
        return None

    def _cache_key(self, module: nn.Module, args: tuple, kwargs: dict, signature: tuple) -> str:
        return cache.make_key({"kind": "module", **self._structure_key(module, args, kwargs, signature),
                               "request": self.request.to_dict(), **cache.environment_key(self.device)})

    def _search_signature(self, module: nn.Module, args: tuple, kwargs: dict, signature: tuple) -> Strategy:
        """Search the strategy for a kind of call on these inputs, remember it and cache it."""
        label = self._label(signature)
        # (the kind stays waiting until it is decided: calls from other threads meanwhile run eager fp32, and do not
        # take it for a new kind of call)
        waiting = self._waiting.get(signature)
        started = time.perf_counter()
        try:
            strategy, decision = self._search(module, args, kwargs, label)
        finally:
            self._waiting.pop(signature, None)
        decision.search_s = time.perf_counter() - started
        self.searches += 1
        if waiting is not None:
            if waiting.calls:  # (not for example_inputs=, decided before any call)
                decision.reason += (f" (searched after {waiting.calls} fp32 calls taking {waiting.spent_s:.2f} s, "
                                    f"so that the search costs at most {SEARCH_COST_SHARE:.0%} of their time)")
            self.report.decisions.remove(waiting.decision)
            decision.calls = waiting.decision.calls  # (the kind's calls so far, which ran eager fp32)
        self._decide(signature, decision)
        store_choice(self._cache_key(module, args, kwargs, signature), decision, self.report, label, signature=label)
        return strategy

    def _decide(self, signature: tuple, decision: Decision) -> None:
        self.strategies[signature] = decision.chosen
        self._decisions[signature] = decision
        if decision.chosen.is_plain:
            self._plain[signature] = decision
        self.report.decisions.append(decision)

    def _structure_key(self, module: nn.Module, args: tuple, kwargs: dict, signature: tuple) -> dict:
        def spec(t: torch.Tensor) -> list:
            shape = list(t.shape)
            if shape and signature[0] is not None and shape[0] <= signature[0]:
                shape[0] = f"<={signature[0]}"
            return [shape, str(t.dtype)]

        return {"class": f"{type(module)._rlspeed_base.__module__}.{type(module)._rlspeed_base.__qualname__}",
                # the forward code of every module class in it: an edited forward must not reuse a choice whose
                # accuracy was checked against the old one
                "forward": cache.forward_digest(module.modules()),
                "repr": repr(module), "training": module.training,
                "params": [[name, list(p.shape), str(p.dtype), p.requires_grad]
                           for name, p in module.named_parameters()],
                "inputs": [spec(t) for t in tensors_in((args, kwargs))], "grad": signature[1]}

    def _search(self, module: nn.Module, args: tuple, kwargs: dict, label: str) -> tuple[Strategy, Decision]:
        params = [p for p in module.parameters()]
        buffers = [b for b in module.buffers()]
        grad = torch.is_grad_enabled() and any(p.requires_grad for p in params)
        trainable = [p for p in params if p.requires_grad]
        # The dry runs take detached inputs: an input attached to a graph (critic(cat(obs, actor(obs)))) would have
        # that graph freed by the first dry backward (the caller's own backward then fails) and its parameters and
        # leaf inputs would collect gradients nobody asked for. requires_grad is kept, so the outputs depend on the
        # inputs as in the real call; the backward below reaches this module's parameters only. They are copies: a
        # forward that changes its input in place (`x /= 255`) changes the caller's tensor once, in the real call, as
        # in the plain loop, not once per dry run.
        args, kwargs = map_tensors((args, kwargs), _detached_like)
        candidate_list = list(self._candidates)
        weights: dict[int, torch.Tensor] = {}
        unchecked = [True]  # the outputs' structure is checked on the search's first run (the fp32 reference)

        def build(strategy: Strategy) -> Callable[[], tuple[object, float]]:
            run = self._runner(module, strategy)

            def unit() -> tuple[object, float]:
                for p in params:
                    p.grad = None
                self._depth += 1
                try:
                    outputs = run(*args, **kwargs)
                finally:
                    self._depth -= 1
                if unchecked:
                    unchecked.clear()
                    _check_outputs_visible(outputs)
                if grad:
                    projection = _random_projection(outputs, weights)
                    if projection is not None:
                        torch.autograd.backward(projection, inputs=trainable)
                return outputs, 1.0

            return unit

        try:
            with contextlib.nullcontext() if grad else torch.no_grad():
                chosen, trials, reason = run_search(candidate_list, build, params, self.device, buffers,
                                                    generators=[*own_generators(module.modules()),
                                                                *generators_in((args, kwargs))])
        except _OpaqueOutputs as opaque:
            # The accuracy check would compare nothing (every candidate would pass) and a reduced precision would
            # leak out inside the object, where to_float32 does not reach: stay in eager fp32.
            reason = (f"the outputs ({opaque}) hide their tensors from the accuracy check and from the cast back to "
                      "float32: fp32 eager")
            self.report.note(f"{label}: {reason}.")
            return EAGER_FP32, Decision(label, EAGER_FP32, "search", reason)
        return chosen, Decision(label, chosen, "search", reason, trials)

    def _runner(self, module: nn.Module, strategy: Strategy) -> Callable:
        """The callable running `forward` under a strategy: autocast, compile, graphs, fp32 outputs."""
        runner = self.runners.get(strategy)
        if runner is not None:
            return runner
        with self._first_call_lock:  # (built once: two compiled copies would each compile)
            runner = self.runners.get(strategy)
            if runner is None:
                runner = self.runners[strategy] = self._build_runner(module, strategy)
        return runner

    def _build_runner(self, module: nn.Module, strategy: Strategy) -> Callable:
        base_forward = self.base_forward

        def forward(*args, **kwargs):
            return base_forward(module, *args, **kwargs)

        if strategy.is_plain:
            return forward

        fn = _with_precision(forward, self.device, strategy.precision)
        if uses_matmul_precision(self.device, strategy.precision):
            fn = _with_backward_hook(fn, BackwardPrecisionHook(self.device, strategy.precision))
        if strategy.compile != "off":
            fn = compile_function(fn, strategy, self.counter)
            if strategy.graphs:
                fn = graph_safe(fn)
        if strategy.autocast_dtype is not None:
            inner = fn

            def fn(*args, **kwargs):
                return to_float32(inner(*args, **kwargs))

        return fn


def in_step(fn: Callable) -> Callable:
    """`fn` (an accelerated step's loss function, as the step runs it) with the accelerated modules it calls running
    their plain forward (`_STEP_SCOPE`)."""

    @functools.wraps(fn)
    def step_scope(*args: Any, **kwargs: Any) -> Any:
        _STEP_SCOPE.depth = _STEP_SCOPE.__dict__.get("depth", 0) + 1
        try:
            return fn(*args, **kwargs)
        finally:
            _STEP_SCOPE.depth -= 1

    return step_scope


class _Waiting:
    """A kind of call running eager fp32 until its calls have taken `threshold_s` (then it is searched)."""

    __slots__ = ("decision", "spent_s", "calls", "threshold_s")

    def __init__(self, decision: Decision):
        self.decision, self.spent_s, self.calls, self.threshold_s = decision, 0.0, 0, 0.0

    def search_due(self, eager: int, compiled: int, what: str, budget_s: float | None = None) -> bool:
        """Whether the calls (`what`, for the reason) have taken long enough to pay for a search of `eager` and
        `compiled` candidates (with the timing budget `budget_s`, default the search's); otherwise the threshold is
        raised to what the search is now expected to cost (it grows with the time per call). The rule of module
        calls, of steps and of the hand-derived updates' matmul-precision search alike."""
        per_call = self.spent_s / self.calls if self.calls else 0.0
        self.threshold_s = expected_search_s(per_call, eager, compiled, budget_s) / SEARCH_COST_SHARE
        label = "fp32 eager" if self.decision.chosen == EAGER_FP32 else self.decision.chosen.label
        self.decision.reason = (f"{label} until {what} have taken {self.threshold_s:.3g} s, so that a search costs at "
                                f"most {SEARCH_COST_SHARE:.0%} of their time")
        return self.spent_s >= self.threshold_s


class _OpaqueOutputs(Exception):
    """Raised from the search's first run when the outputs hide their tensors from the accuracy check."""


def _check_outputs_visible(outputs: Any) -> None:
    leaf = opaque_leaf(outputs)
    if leaf is None and outputs is not None and not tensors_in(outputs):
        leaf = type(outputs).__name__  # e.g. a Python number computed from the model's tensors
    if leaf is not None:
        raise _OpaqueOutputs(leaf)


def _detached_like(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of an input cut from its graph (its own storage), requiring grad when the input did."""
    detached = tensor.detach().clone()
    return detached.requires_grad_() if tensor.requires_grad else detached


def _with_backward_hook(fn: Callable, hook: BackwardPrecisionHook) -> Callable:
    """Register `hook` on the outputs that will receive gradients, so their backward runs in the same precision."""

    def call(*args, **kwargs):
        hook.settle()
        outputs = fn(*args, **kwargs)
        if torch.is_grad_enabled():
            for tensor in tensors_in(outputs):
                if tensor.requires_grad:
                    tensor.register_hook(hook)
        return outputs

    return call


def _random_projection(outputs: Any, weights: dict[int, torch.Tensor]) -> torch.Tensor | None:
    """A scalar that depends on every float output through fixed random weights (a plain sum would have zero
    gradient through a softmax); the weights are drawn once per output position and reused by every candidate."""
    total = None
    for index, tensor in enumerate(t for t in tensors_in(outputs) if t.is_floating_point() and t.requires_grad):
        weight = weights.get(index)
        if weight is None or weight.shape != tensor.shape:
            generator = torch.Generator().manual_seed(1000 + index)
            weight = torch.randn(tensor.shape, generator=generator).to(tensor.device)
            weights[index] = weight
        term = (tensor.float() * weight).sum()
        total = term if total is None else total + term
    return total


__all__ = ["auto_accelerate", "unaccelerate", "AcceleratedModule", "ModuleAccelerator"]
