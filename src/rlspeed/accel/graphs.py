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
  hyperparameters (a learning-rate change), their state objects (`load_state_dict`, a cleared or replaced
  per-parameter state), the parameters' storage and `requires_grad`, the `training` flags of the modules the loss
  function reaches, and the numbers it reads by name (`introspect.named_numbers`: its closure, the globals it names,
  its object's attributes such as `self.gamma`, and one level further into plain objects such as
  `self.schedule.beta`), and the identity of the tensors and modules it reads by name (`self.alpha` rebound to a
  new tensor). After a change one more eager call runs (it creates whatever has to be created anew, such as
  Adam's moments after `state.clear()`, which a capture must not record), and the first call that changes nothing
  captures again; a state that changes again and again within a few hundred calls (a
  schedule that moves every step), or inputs whose signature keeps changing (a float argument that differs on each
  call), turn graphs off for the step, with a note in the report;
* a step that cannot be captured (it reads a value back to the host, `.item()`, or branches on one) runs eagerly
  from then on, with the reason in the report. The last warm-up call runs under CUDA's synchronisation check
  (`torch.cuda.set_sync_debug_mode("warn")`), so that most such steps are recognised before a capture is tried. A
  capture that fails all the same leaves torch's bookkeeping mid-capture: its memory pool is ended and released,
  and if the CUDA random generator was left in capture mode it is given a fresh state (the other steps' graphs,
  which hold the old one, are then captured again).

What a graph cannot see: values the loss function reads deeper than that (``self.config.sub.gamma``, a property
computed on access) or through helper functions, optimizer hooks (they run at capture only), and changes the loss
makes to Python state (they happen once, at capture). Use graphs=False for such a step.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

from rlspeed.accel.inputs import _PASS_TYPES, map_tensors, tensors_in
from rlspeed.accel.introspect import named_numbers, named_tensors_and_modules, reachable_submodules
from rlspeed.accel.search import _first_line

if TYPE_CHECKING:
    from rlspeed.accel.step import AcceleratedStep

WARMUP_CALLS = 3  # eager calls per input signature before its capture
MAX_GRAPHS = 4  # input signatures kept captured at once (the least recently replayed is dropped for a fifth)
MAX_STATE_CHANGES = 3  # state changes within STATE_CHANGE_WINDOW calls of each other before graphs turn off
STATE_CHANGE_WINDOW = 200
#: replays between two captures that drop a kept graph (one signature too many) below which they count as a cycle:
#: more than MAX_GRAPHS such in a row turn graphs off (a capture costs many eager steps)
MIN_REPLAYS_PER_CAPTURE = 32
MAX_SIGNATURES = 16  # distinct input signatures seen before graphs turn off (arguments that change on every call)
CAPTURABLE_OPTIMIZERS = (torch.optim.Adam, torch.optim.AdamW)  # whose step state make_capturable moves correctly
SYNC_WARNING = "called a synchronizing CUDA operation"  # torch's warning in sync debug mode "warn"


def capture_blocker(optimizers: Sequence[torch.optim.Optimizer], precision: str) -> str | None:
    """Why a step of `optimizers` (on CUDA) cannot be captured as a whole-step CUDA graph with `precision` (None: it
    can)."""
    if precision == "fp16":
        return "fp16's GradScaler reads the skipped-step decision on the host"
    return optimizer_capture_blocker(optimizers)


def optimizer_capture_blocker(optimizers: Sequence[torch.optim.Optimizer]) -> str | None:
    """Why a step of `optimizers` cannot be captured as a whole-step CUDA graph (None: it can)."""
    for optimizer in optimizers:
        if type(optimizer) not in CAPTURABLE_OPTIMIZERS:
            return (f"{type(optimizer).__name__} is not captured (whole-step graphs take "
                    f"{'/'.join(c.__name__ for c in CAPTURABLE_OPTIMIZERS)})")
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


#: captures under way in this process (any thread), and the graphs dropped meanwhile, destroyed once none is: CUDA
#: refuses to destroy a graph while a capture is under way, and the attempt invalidates that capture. A dropped model
#: keeps its graph until the garbage collector breaks its reference cycle, which can happen inside another step's
#: capture (the capture then failed and that step ran without graphs).
_CAPTURES_UNDER_WAY = [0]
_DROPPED_DURING_CAPTURE: list[torch.cuda.CUDAGraph] = []
_CAPTURES_LOCK = threading.Lock()


class _Captured:
    """One captured step: the graph, its static inputs and outputs, and the gradients it writes."""

    def __init__(self, graph: torch.cuda.CUDAGraph, inputs: list[torch.Tensor], outputs: Any,
                 grads: list[torch.Tensor | None], grad_norm: torch.Tensor | None = None):
        self.graph, self.inputs, self.outputs, self.grads = graph, inputs, outputs, grads
        self.grad_norm = grad_norm  # (the norm the clipping computes, rewritten by every replay)

    # (the lists bound as defaults: at interpreter exit the module's globals may already be gone)
    def __del__(self, _under_way: list = _CAPTURES_UNDER_WAY, _dropped: list = _DROPPED_DURING_CAPTURE) -> None:
        if _under_way[0]:  # (no lock: a collection can run this inside `_capturing` itself)
            _dropped.append(self.graph)


_LIVE: weakref.WeakSet[StepGraphs] = weakref.WeakSet()  # every StepGraphs, for `_repair_generators`

#: one side stream per (device, thread): cuBLAS caches a workspace (32 MiB, twice with cuBLASLt) for every stream it
#: runs on, for the life of the process, so a stream per StepGraphs pinned 64 MiB per model after the model was gone
_SIDE_STREAMS: dict[tuple[str, int], torch.cuda.Stream] = {}
_SIDE_STREAMS_LOCK = threading.Lock()


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    """The side stream that warm-ups and captures on `device` run on in this thread (made on first use)."""
    key = (str(device), threading.get_ident())
    with _SIDE_STREAMS_LOCK:
        stream = _SIDE_STREAMS.get(key)
        if stream is None:
            stream = _SIDE_STREAMS[key] = torch.cuda.Stream(device)
    return stream


class StepGraphs:
    """The whole-step CUDA graphs of one `AcceleratedStep` (see the module docstring)."""

    def __init__(self, step: AcceleratedStep, update: Callable[[tuple, dict], Any]):
        self.step = step
        self.update = update  # (args, kwargs) -> detached outputs: one eager update
        self.stream = _side_stream(step.device)
        self.graphs: dict[tuple, _Captured] = {}
        self.warming: dict[tuple, int] = {}
        self.state: tuple | None = None
        self.state_changes = 0
        self.calls = 0
        self.calls_at_change = 0
        self.captures = 0
        self.replays = 0
        self.evictions = 0  # captured graphs dropped for another signature's, few replays apart
        self.replays_at_eviction = 0
        self.off: str | None = None  # why graphs were turned off for good
        self._modules = reachable_submodules(step.loss_fn)
        self._values = named_numbers(step.loss_fn)
        self._objects = named_tensors_and_modules(step.loss_fn)
        _LIVE.add(self)

    # --- per call ---------------------------------------------------------------------------------------------
    def __call__(self, args: tuple, kwargs: dict) -> Any:
        if self.off is not None:
            return self.update(args, kwargs)
        signature = _signature((args, kwargs))
        if signature is None:
            self._turn_off("an argument is neither a tensor nor an int/float/bool/str/None")
            return self.update(args, kwargs)
        self.calls += 1
        state = self._state()
        if state != self.state:
            # Changes are counted once the first calls (which create the optimizer's state) are over: one that keeps
            # coming back (a learning rate set on every step, a tensor rebound on every call) turns graphs off,
            # whether or not a capture has happened yet; a rare one (a decay now and then) recaptures.
            if self.state is not None and self.calls > WARMUP_CALLS:
                recent = self.calls - self.calls_at_change < STATE_CHANGE_WINDOW
                self.state_changes = self.state_changes + 1 if recent else 1
                self.calls_at_change = self.calls
                if self.state_changes > MAX_STATE_CHANGES:
                    self._turn_off(f"what the step reads changed {self.state_changes} times within "
                                   f"{STATE_CHANGE_WINDOW} calls (e.g. a learning rate set on every step)")
                    return self.update(args, kwargs)
            self.graphs.clear()  # what captured graphs baked in has changed: capture again
            # After any change, one more eager (sync-checked) call before a capture: it creates whatever the change
            # left to be created lazily (Adam's moments after state.clear()), which a capture must not record. A
            # capture follows only a call that changed nothing.
            self.warming = {key: min(count, WARMUP_CALLS - 1) for key, count in self.warming.items()}
            self.state = state
        captured = self.graphs.pop(signature, None)  # (put back last: the dict runs least to most recently used)
        if captured is not None:
            self.graphs[signature] = captured
        else:
            if signature not in self.warming and len(self.warming) >= MAX_SIGNATURES:
                self._turn_off(f"more than {MAX_SIGNATURES} different input signatures (shapes, dtypes or values of "
                               "non-tensor arguments: a float argument that changes on every call?)")
                return self.update(args, kwargs)
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
            if (len(self.graphs) >= MAX_GRAPHS and self.evictions >= MAX_GRAPHS
                    and self.replays - self.replays_at_eviction < MIN_REPLAYS_PER_CAPTURE):
                # (more signatures in turn than graphs kept, five batch sizes in a cycle: every call would capture,
                # far slower than eager)
                self._turn_off(f"more than {MAX_GRAPHS} input signatures in use in turn (batch sizes, shapes): "
                               "each was captured again and again")
                return self.update(args, kwargs)
            current = torch.cuda.current_stream(self.step.device)
            pool = torch.cuda.graph_pool_handle()
            try:
                captured = self._capture(args, kwargs, pool)
            except Exception as error:  # anything capture refuses: this step runs eagerly for good
                # torch.cuda.graph leaves its capture stream current, the allocator routing into the capture's pool
                # and possibly the random generator in capture mode when ending the capture fails
                torch.cuda.set_stream(current)
                _end_pool(self.step.device, pool)
                _repair_generators(self.step.device)
                self._discard_failed_capture()
                self._turn_off(f"capture failed ({_first_line(_first_cause(error))})")
                return self.update(args, kwargs)
            if len(self.graphs) >= MAX_GRAPHS:  # (the least recently replayed goes)
                self.graphs.pop(next(iter(self.graphs)))
                # (counted while fewer than MIN_REPLAYS_PER_CAPTURE replays come between them: a rare fifth signature,
                # or signatures used in long stretches, each capture paid for by many replays, is no cycle)
                cycling = self.replays - self.replays_at_eviction < MIN_REPLAYS_PER_CAPTURE
                self.evictions = self.evictions + 1 if cycling else 1
                self.replays_at_eviction = self.replays
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

    def _capture(self, args: tuple, kwargs: dict, pool: Any) -> _Captured:
        static_args, static_kwargs = map_tensors((args, kwargs), torch.Tensor.clone)
        for p in self.step.params:
            p.grad = None  # the graph allocates its own gradient buffers and rewrites them on every replay
        graph = torch.cuda.CUDAGraph()
        self.stream.wait_stream(torch.cuda.current_stream(self.step.device))
        with _capturing(), torch.cuda.graph(graph, pool=pool, stream=self.stream, capture_error_mode="thread_local"):
            outputs = self.update(static_args, static_kwargs)
        self.captures += 1
        return _Captured(graph, tensors_in((static_args, static_kwargs)), outputs,
                         [p.grad for p in self.step.params], self.step._grad_norm)

    def _replay(self, captured: _Captured, args: tuple, kwargs: dict) -> Any:
        for static, given in zip(captured.inputs, tensors_in((args, kwargs))):
            static.copy_(given)
        captured.graph.replay()
        self.replays += 1
        for p, grad in zip(self.step.params, captured.grads):
            p.grad = grad  # the gradients of this step stay readable, as after an eager step
        self.step._grad_norm = captured.grad_norm  # (`grad_norm` reads a copy)
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
        self.warming.clear()
        self.step.graphs_turned_off(f"whole-step CUDA graph off: {why}; the step runs eagerly")

    # --- what a graph bakes in ---------------------------------------------------------------------------------
    def _state(self) -> tuple:
        optimizers = tuple((id(o.state), id(o.param_groups), tuple(map(id, o.state.values())),
                            tuple(_hyperparameters(group) for group in o.param_groups)) for o in self.step.optimizers)
        return (optimizers, tuple((p.data_ptr(), p.requires_grad) for p in self.step.params),
                tuple(m.training for m in self._modules), tuple(read() for read in self._values),
                tuple(_identity(read()) for read in self._objects))


@contextlib.contextmanager
def _capturing() -> Iterator[None]:
    """Around a capture: graphs dropped meanwhile are kept until no capture is under way (`_CAPTURES_UNDER_WAY`)."""
    with _CAPTURES_LOCK:
        _CAPTURES_UNDER_WAY[0] += 1
    try:
        yield
    finally:
        with _CAPTURES_LOCK:
            _CAPTURES_UNDER_WAY[0] -= 1
            dropped = [] if _CAPTURES_UNDER_WAY[0] else _DROPPED_DURING_CAPTURE[:]
            if dropped:
                _DROPPED_DURING_CAPTURE.clear()
        del dropped  # (destroyed here, outside any capture)


def split_sync_warnings(caught: list[warnings.WarningMessage]) -> tuple[str | None, list[warnings.WarningMessage]]:
    """(the first line of the first host-sync warning or None, the other warnings to pass on) of warnings recorded
    in sync debug mode "warn". torch's own note on switching that mode on ("does not yet detect all synchronizing
    operations") is neither."""
    synced, others = None, []
    for warning in caught:
        text = str(warning.message)
        if SYNC_WARNING in text:
            synced = synced or text.strip().splitlines()[0]
        elif "Synchronization debug mode is a prototype" not in text:
            others.append(warning)
    return synced, others


def _end_pool(device: torch.device, pool: Any) -> None:
    """After a failed capture: stop routing allocations into its memory pool and release the pool.

    `CUDAGraph.capture_end` raises before it does this itself, and the allocator would otherwise go on treating a
    capture as under way (no `empty_cache`, no freeing of cached blocks when memory runs short)."""
    index = _device_index(device)
    for name in ("_cuda_endAllocateToPool", "_cuda_releasePool"):
        try:
            getattr(torch._C, name)(index, pool)
        except (AttributeError, RuntimeError, TypeError):  # already ended, or a torch without these functions
            pass


def _repair_generators(device: torch.device) -> None:
    """Take torch's CUDA random generator out of capture mode if a failed capture left it there.

    `CUDAGraph.capture_end` raises before it ends the generator's capture when the capture failed, and every later
    random op then fails ("Offset increment outside graph capture"). Only then is the generator given a fresh state
    (a non-capturing copy of its seed and offset); the graphs already captured still hold the old state, so every
    other step's graphs are dropped and captured again (with the new one) on their next call."""
    try:
        torch.empty(1, device=device).normal_()
        return  # random numbers work: nothing to repair
    except RuntimeError:
        pass
    generator = torch.cuda.default_generators[_device_index(device)]
    try:
        generator.graphsafe_set_state(generator.clone_state())
    except (AttributeError, RuntimeError):  # a torch without graph-safe generator states
        return
    for graphs in list(_LIVE):
        graphs.graphs.clear()


def _identity(value: Any) -> Any:
    """What a graph bakes in of a tensor or module read by name: the object, and a tensor's storage."""
    if isinstance(value, torch.Tensor):
        return id(value), value.data_ptr()
    return id(value)


def _first_cause(error: BaseException) -> BaseException:
    """The exception that started a chain (a failed capture's own error, not the one ending the capture raised)."""
    seen = {id(error)}
    while error.__context__ is not None and id(error.__context__) not in seen:
        error = error.__context__
        seen.add(id(error))
    return error


def _device_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def _hyperparameters(group: dict) -> tuple:
    return tuple((key, _comparable(value)) for key, value in group.items() if key != "params")


def _comparable(value: Any) -> Any:
    if isinstance(value, torch.Tensor):  # a tensor hyperparameter (lr) is read by the graph from its memory
        return _identity(value)
    if isinstance(value, (tuple, list)):
        return tuple(_comparable(v) for v in value)
    return value if isinstance(value, _PASS_TYPES) else ("object", id(value))


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
        elif isinstance(value, _PASS_TYPES):
            parts.append((type(value).__name__, value))
        else:
            return False
        return True

    return tuple(parts) if walk(tree) else None


__all__ = ["StepGraphs", "capture_blocker", "make_capturable", "WARMUP_CALLS", "MAX_GRAPHS"]
