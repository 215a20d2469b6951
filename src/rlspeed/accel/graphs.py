"""Whole-step CUDA graphs for `accelerate_step`: forward, backward, clipping and the optimizer step, replayed as one.

An RL update is hundreds of small kernels (batch 256, [256, 256] MLPs); on a GPU each one's launch costs more than
its arithmetic. A CUDA graph records the kernels of one step once and replays them with a single launch. This is
the eager kernels themselves, captured: nothing is recompiled and the numbers are those of the eager step.

How a call runs (`StepGraphs.__call__`):

* the first `WARMUP_CALLS` calls with a given input signature (tensor shapes and dtypes, values of other arguments)
  run eagerly on a side stream: they are real updates, and they create the optimizer's state, cuBLAS workspaces and
  so on, which a capture must not do;
* the next call captures the step (`torch.cuda.graph`) on static copies of its inputs, then replays it: each later
  call copies its inputs into those buffers, replays, and returns a copy of the outputs;
* before each replay, the state the graph baked in is compared with what it was at capture: the optimizers'
  hyperparameters (a learning-rate change), their state objects (`load_state_dict`), the parameters' storage, the
  `training` flags of the modules the loss function reaches, and the int/float/bool values it reads by name (its
  closure, the globals it names, its object's attributes: `self.gamma`). A change recaptures; a state that keeps
  changing (a schedule that moves every step) turns graphs off for the step, with a note in the report;
* a step that cannot be captured (it reads a value back to the host, `.item()`, or branches on one) runs eagerly
  from then on, with the reason in the report. The last warm-up call runs under CUDA's synchronisation check
  (`torch.cuda.set_sync_debug_mode("warn")`), so that most such steps are recognised before a capture is tried; a
  capture that fails all the same leaves torch's CUDA random generator in capture mode, which is repaired.

What a graph cannot see: values the loss function reads deeper than by name (``self.config.gamma`` changed after
capture), and tensors it creates from host data on each call. Use graphs=False for such a step.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from rlspeed.accel.inputs import map_tensors, tensors_in
from rlspeed.accel.introspect import named_numbers, reachable_modules

if TYPE_CHECKING:
    from rlspeed.accel.step import AcceleratedStep

WARMUP_CALLS = 3  # eager calls per input signature before its capture
MAX_GRAPHS = 4  # input signatures kept captured at once (the oldest is dropped for a fifth)
MAX_STATE_CHANGES = 3  # recaptures for changed state before graphs are turned off for the step
_SCALARS = (bool, int, float, str, type(None))
SYNC_WARNING = "called a synchronizing CUDA operation"  # torch's warning in sync debug mode "warn"


def capture_blocker(step: AcceleratedStep) -> str | None:
    """Why `step` cannot be captured as a whole-step CUDA graph (None: it can)."""
    if step.device.type != "cuda":
        return f"whole-step graphs are CUDA graphs; the step runs on {step.device.type}"
    if step.strategy is not None and step.strategy.precision == "fp16":
        return "fp16's GradScaler reads the skipped-step decision on the host"
    for optimizer in step.optimizers:
        if "capturable" not in optimizer.defaults:
            return f"{type(optimizer).__name__} cannot step inside a CUDA graph (it has no capturable mode)"
        if any(group.get("differentiable") for group in optimizer.param_groups):
            return f"{type(optimizer).__name__} is differentiable"
    return None


def make_capturable(optimizers: list[torch.optim.Optimizer], device: torch.device) -> list[str]:
    """Switch the optimizers to their capturable mode (step counts on the device); names of those changed."""
    changed = []
    for optimizer in optimizers:
        if all(group.get("capturable") for group in optimizer.param_groups):
            continue
        for group in optimizer.param_groups:
            group["capturable"] = True
        # torch warns once when a capturable optimizer steps outside a capture: the warm-up calls do, on purpose
        optimizer._warned_capturable_if_run_uncaptured = True
        for state in optimizer.state.values():  # an optimizer that stepped already: its step counts move over
            step = state.get("step")
            if isinstance(step, torch.Tensor) and step.device != device:
                state["step"] = step.to(device=device, dtype=torch.float32)
        changed.append(type(optimizer).__name__)
    return changed


class _Captured:
    """One captured step: the graph, its static inputs and outputs, and the gradients it writes."""

    def __init__(self, graph: torch.cuda.CUDAGraph, inputs: list[torch.Tensor], outputs: Any,
                 grads: list[torch.Tensor | None]):
        self.graph, self.inputs, self.outputs, self.grads = graph, inputs, outputs, grads


class StepGraphs:
    """The whole-step CUDA graphs of one `AcceleratedStep` (see the module docstring)."""

    def __init__(self, step: AcceleratedStep, update: Callable[[tuple, dict], Any]):
        self.step = step
        self.update = update  # (args, kwargs) -> detached outputs: one eager update
        self.stream = torch.cuda.Stream(step.device)
        self.graphs: dict[tuple, _Captured] = {}
        self.warming: dict[tuple, int] = {}
        self.state: tuple | None = None
        self.state_changes = 0
        self.captures = 0
        self.replays = 0
        self.off: str | None = None  # why graphs were turned off for good
        self._modules = [m for root in reachable_modules(step.loss_fn) for m in root.modules()]
        self._values = named_numbers(step.loss_fn)

    # --- per call ---------------------------------------------------------------------------------------------
    def __call__(self, args: tuple, kwargs: dict) -> Any:
        signature = _signature((args, kwargs))
        if self.off is not None or signature is None:
            if signature is None and self.off is None:
                self._turn_off("an argument is neither a tensor nor an int/float/bool/str/None")
            return self.update(args, kwargs)
        state = self._state()
        if state != self.state:
            if self.graphs:  # what the captured graphs baked in has changed: capture again
                self.state_changes += 1
                self.graphs.clear()
                if self.state_changes > MAX_STATE_CHANGES:
                    self._turn_off(f"what the step reads changed {self.state_changes} times after capture (e.g. a "
                                   "learning rate set on every step)")
                    return self.update(args, kwargs)
            self.state = state
        captured = self.graphs.get(signature)
        if captured is None:
            warm = self.warming.get(signature, 0)
            if warm < WARMUP_CALLS:
                self.warming[signature] = warm + 1
                if warm + 1 < WARMUP_CALLS:
                    return self._on_side_stream(args, kwargs)
                outputs, synced = self._watching_syncs(args, kwargs)
                if synced:
                    self._turn_off(f"the step synchronises with the host ({synced}), e.g. .item() or a branch on a "
                                   "tensor's value, which a CUDA graph cannot replay")
                return outputs
            current = torch.cuda.current_stream(self.step.device)
            try:
                captured = self._capture(args, kwargs)
            except Exception as error:  # anything capture refuses: this step runs eagerly for good
                # torch.cuda.graph leaves its capture stream current when ending the capture fails
                torch.cuda.set_stream(current)
                _repair_generators()
                self._discard_failed_capture()
                cause = _first_cause(error)
                self._turn_off(f"capture failed ({type(cause).__name__}: {_first_line(cause)})")
                return self.update(args, kwargs)
            if len(self.graphs) >= MAX_GRAPHS:
                self.graphs.pop(next(iter(self.graphs)))
            self.graphs[signature] = captured
            self.state = self._state()  # capturing may switch lazily created state (first grads)
        return self._replay(captured, args, kwargs)

    # --- capture and replay --------------------------------------------------------------------------------------
    def _on_side_stream(self, args: tuple, kwargs: dict) -> Any:
        current = torch.cuda.current_stream(self.step.device)
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            outputs = self.update(args, kwargs)
        current.wait_stream(self.stream)
        return outputs

    def _watching_syncs(self, args: tuple, kwargs: dict) -> tuple[Any, str | None]:
        """A warm-up call under torch's synchronisation check: (outputs, the first sync warning or None).

        Other warnings raised during the call are passed on."""
        previous = torch.cuda.get_sync_debug_mode()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                outputs = self._on_side_stream(args, kwargs)
            finally:
                torch.cuda.set_sync_debug_mode(previous)
        synced, others = split_sync_warnings(caught)
        for warning in others:
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
        return outputs, synced

    def _capture(self, args: tuple, kwargs: dict) -> _Captured:
        static_args, static_kwargs = map_tensors((args, kwargs), torch.Tensor.clone)
        for p in self.step.params:
            p.grad = None  # the graph allocates its own gradient buffers and rewrites them on every replay
        graph = torch.cuda.CUDAGraph()
        self.stream.wait_stream(torch.cuda.current_stream(self.step.device))
        with torch.cuda.graph(graph, stream=self.stream, capture_error_mode="thread_local"):
            outputs = self.update(static_args, static_kwargs)
        self.captures += 1
        return _Captured(graph, tensors_in((static_args, static_kwargs)), outputs,
                         [p.grad for p in self.step.params])

    def _replay(self, captured: _Captured, args: tuple, kwargs: dict) -> Any:
        for static, given in zip(captured.inputs, tensors_in((args, kwargs))):
            static.copy_(given)
        captured.graph.replay()
        self.replays += 1
        for p, grad in zip(self.step.params, captured.grads):
            p.grad = grad  # the gradients of this step stay readable, as after an eager step
        return map_tensors(captured.outputs, torch.Tensor.clone)

    def _discard_failed_capture(self) -> None:
        for p in self.step.params:
            p.grad = None
        try:
            torch.cuda.synchronize(self.step.device)
        except RuntimeError:
            pass

    def _turn_off(self, why: str) -> None:
        self.off = why
        self.graphs.clear()
        self.step.report.note(f"whole-step CUDA graph off for {self.step.name}: {why}; the step runs eagerly.")

    # --- what a graph bakes in ---------------------------------------------------------------------------------
    def _state(self) -> tuple:
        optimizers = tuple((id(o.state), id(o.param_groups), len(o.state),
                            tuple(_hyperparameters(group) for group in o.param_groups)) for o in self.step.optimizers)
        return (optimizers, tuple(p.data_ptr() for p in self.step.params),
                tuple(m.training for m in self._modules), tuple(read() for read in self._values))


def split_sync_warnings(caught: list[warnings.WarningMessage]) -> tuple[str | None, list[warnings.WarningMessage]]:
    """(the first line of the first host-sync warning or None, the other warnings to pass on) of warnings recorded
    in sync debug mode "warn". torch's own note on switching that mode on ("does not yet detect all synchronizing
    operations") is neither."""
    synced, others = None, []
    for warning in caught:
        text = str(warning.message)
        if SYNC_WARNING in text:
            synced = synced or _first_line(warning.message)
        elif "Synchronization debug mode is a prototype" not in text:
            others.append(warning)
    return synced, others


def _repair_generators() -> None:
    """Take torch's CUDA random generators out of capture mode after a failed capture.

    `CUDAGraph.capture_end` raises before it ends the generators' capture when the capture failed, and every later
    random op then fails ("Offset increment outside graph capture"). A generator's cloned state is a fresh,
    non-capturing copy of its seed and offset."""
    for generator in torch.cuda.default_generators:
        try:
            generator.graphsafe_set_state(generator.clone_state())
        except (AttributeError, RuntimeError):  # a torch without graph-safe generator states
            pass


def _first_cause(error: BaseException) -> BaseException:
    """The exception that started a chain (a failed capture's own error, not the one ending the capture raised)."""
    seen = {id(error)}
    while error.__context__ is not None and id(error.__context__) not in seen:
        error = error.__context__
        seen.add(id(error))
    return error


def _first_line(error: BaseException | Warning) -> str:
    text = str(error).strip()
    return (text.splitlines()[0] if text else "")[:160]


def _hyperparameters(group: dict) -> tuple:
    return tuple((key, _comparable(value)) for key, value in group.items() if key != "params")


def _comparable(value: Any) -> Any:
    if isinstance(value, torch.Tensor):  # a tensor hyperparameter (lr) is read by the graph from its memory
        return ("tensor", id(value), value.data_ptr())
    if isinstance(value, (tuple, list)):
        return tuple(_comparable(v) for v in value)
    return value if isinstance(value, _SCALARS) else ("object", id(value))


def _signature(tree: Any) -> tuple | None:
    """Shapes, dtypes and devices of the tensors in a call's arguments and the values of its other arguments, in
    order; None when an argument is something a graph cannot be keyed on."""
    parts: list[Any] = []

    def walk(value: Any) -> bool:
        if isinstance(value, torch.Tensor):
            parts.append((tuple(value.shape), value.dtype, value.device, value.requires_grad))
        elif isinstance(value, (tuple, list)):
            parts.append((type(value).__name__, len(value)))
            return all(walk(v) for v in value)
        elif isinstance(value, dict):
            parts.append(("dict", tuple(value)))
            return all(walk(v) for v in value.values())
        elif isinstance(value, _SCALARS):
            parts.append((type(value).__name__, value))
        else:
            return False
        return True

    return tuple(parts) if walk(tree) else None


__all__ = ["StepGraphs", "capture_blocker", "make_capturable", "WARMUP_CALLS", "MAX_GRAPHS"]
