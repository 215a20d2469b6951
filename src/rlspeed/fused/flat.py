"""Parameters, gradients and Adam moments in flat buffers: clipping and Adam as a few kernels for any network.

`torch.optim.Adam` and `clip_grad_norm_` loop over parameter tensors (or group them, in Python, for their foreach
and fused kernels); for RL-sized networks that per-tensor work costs as much as the maths. `FlatAdam` makes a
module's parameters views of one flat buffer (and their `.grad` views of another), so the global gradient norm,
the all-reduce and the whole Adam step each act on one tensor. Used by the hand-derived updates
(`rlspeed.fused.ppo`, `fused_dqn`, `fused_sac`).

The optimizer stays the user-visible `torch.optim.Adam` over the original parameters, so checkpoints are the same
as with autograd: its per-parameter state tensors are views of the flat moments, and a state loaded into it later
(resume, `load`) is copied back into the flat buffers before the next step.
"""

from __future__ import annotations

import copy
import itertools
import operator
import weakref
from collections.abc import Sequence

import torch
from torch import nn

from rlspeed.activations import HAND_DERIVED_ACTIVATIONS
from rlspeed.nn import ACTIVATIONS

#: the options of each optimizer the flat steps implement that they do not (`plain_optimizer_reason`)
_UNSUPPORTED_OPTIONS = {torch.optim.Adam: ("amsgrad", "maximize", "decoupled_weight_decay"),
                        torch.optim.RMSprop: ("momentum", "centered", "weight_decay", "maximize")}


def plain_optimizer_reason(optimizer: torch.optim.Optimizer, kinds: tuple[type, ...],
                           params: Sequence[torch.Tensor]) -> str | None:
    """Why the flat steps (`FlatAdam`, `FlatRMSprop`) cannot stand in for `optimizer`, or None when they can: it must
    be one of `kinds` exactly (a subclass may step differently), with one param group holding exactly `params` (the
    flat steps step every one) and none of the options they leave out."""
    kind = type(optimizer)
    if kind not in kinds:
        return (f"the optimizer is {kind.__name__}, not {' or '.join(k.__module__ + '.' + k.__name__ for k in kinds)}"
                " (what the hand-derived update steps)")
    if len(optimizer.param_groups) != 1:
        return f"the optimizer has {len(optimizer.param_groups)} param groups (the hand-derived update steps one)"
    group = optimizer.param_groups[0]
    held, wanted = {id(p) for p in group["params"]}, {id(p) for p in params}
    if held != wanted:
        return (f"the optimizer steps {len(held & wanted)} of the model's {len(wanted)} parameter tensors (the "
                "hand-derived update steps every one)")
    options = [name for name in _UNSUPPORTED_OPTIONS.get(kind, ()) if group.get(name)]
    if options:
        return f"the optimizer's {', '.join(options)} (the hand-derived update steps plain {kind.__name__})"
    return None


def uncovered_parameters_reason(network: nn.Module, covered: Sequence[torch.Tensor], name: str) -> str | None:
    """Why the hand-derived update cannot train `network` (named `name` in the reason) where it holds parameters
    besides the `covered` ones it computes gradients for (a layer a subclass's `_build_policy` or `_setup` added):
    their gradients, and what the loss does with them, are outside it. None where it holds no others."""
    ids = {id(p) for p in covered}
    extra = [param_name for param_name, p in network.named_parameters() if id(p) not in ids]
    if not extra:
        return None
    more = f" and {len(extra) - 2} more" if len(extra) > 2 else ""
    return (f"the {name} holds parameters the hand-derived update does not train ({', '.join(extra[:2])}{more}: it "
            "covers rlspeed's own layers)")


def hold_in(flat: torch.Tensor, params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor] | None = None) -> None:
    """Make each of `params` a view of its chunk of `flat` (laid out in their order) again where it is not one,
    carrying its values over (and its `.grad` as the view of `grads`, where given): after a deepcopy, which clones a
    Parameter's data, the copy's parameters no longer live in the copied flat buffer."""
    chunks = flat.split([p.numel() for p in params])
    with torch.no_grad():
        for index, (p, chunk) in enumerate(zip(params, chunks)):
            if p.data_ptr() != chunk.data_ptr():
                chunk.copy_(p.detach().reshape(-1))
                p.data = chunk.view_as(p)
                if grads is not None:
                    p.grad = grads[index]


def copy_attributes(obj, memo: dict):
    """A deepcopy of `obj` attribute by attribute (registered in `memo` first), for a `__deepcopy__` that then
    re-points what the copy holds (`hold_in`). The copy is made without `obj`'s `__setstate__` (which `copy.copy`
    calls with the original's attributes: FlatAdam's would register its hook on the original's optimizer, one more
    left there at every copy)."""
    new = type(obj).__new__(type(obj))
    memo[id(obj)] = new
    for name, value in vars(obj).items():
        setattr(new, name, copy.deepcopy(value, memo))
    return new


class _NoteSkippedParameters:
    """An optimizer step pre-hook that tells its `FlatAdam` (held weakly) when the optimizer's own step leaves some
    of its parameters out (their `.grad` is None): their step counts then fall behind the others'."""

    def __init__(self, flat: FlatAdam):
        self._flat = weakref.ref(flat)

    def __call__(self, optimizer, args, kwargs) -> None:
        flat = self._flat()
        if flat is not None and not flat.uneven_steps:
            missing = sum(p.grad is None for p in flat.params)
            flat.uneven_steps = 0 < missing < len(flat.params)


class FlatAdam:
    """Adam over `params` (the parameters `optimizer` holds, in its order) on flat buffers.

    After construction, `params[i].data` and `params[i].grad` are views of `self.flat` and `self.grad`; a gradient
    written into `self.grad` (or `grad_views[i]`) is what `step()` uses. The learning rate, betas, eps and weight
    decay are read from the optimizer's first param group on every step, so schedules that set `group["lr"]` work.
    `max_grad_norm`: each step first clips the global gradient norm to it (None: no clipping); `strategy`: a
    `DistributedStrategy` over whose processes the gradient is averaged first (None, or a single process: none).

    `uneven_steps`: whether the parameters' step counts may differ (a step of the optimizer itself that left a
    parameter without a gradient out, a loaded state with unequal counts, one parameter's state reset). Each step
    then runs per parameter, with each one's own count in its bias correction, as `torch.optim.Adam` steps them;
    while False (the usual case) a step is one kernel over the whole buffer with the first parameter's count.
    """

    def __init__(self, params: Sequence[nn.Parameter], optimizer: torch.optim.Optimizer, *,
                 max_grad_norm: float | None = None, strategy=None):
        self.params = list(params)
        grouped = [p for group in optimizer.param_groups for p in group["params"]]
        if len(optimizer.param_groups) != 1 or {id(p) for p in grouped} != {id(p) for p in self.params}:
            raise ValueError("FlatAdam needs an optimizer with one param group holding exactly these parameters.")
        group = optimizer.param_groups[0]
        if group.get("amsgrad") or group.get("maximize") or group.get("decoupled_weight_decay"):
            raise ValueError("FlatAdam implements plain Adam: no amsgrad, maximize or decoupled weight decay.")
        self.optimizer, self.max_grad_norm, self.strategy = optimizer, max_grad_norm, strategy
        device = self.params[0].device
        sizes = [p.numel() for p in self.params]
        with torch.no_grad():
            self.flat = torch.cat([p.detach().reshape(-1) for p in self.params])
        self.grad = torch.zeros_like(self.flat)
        self.exp_avg = torch.zeros_like(self.flat)
        self.exp_avg_sq = torch.zeros_like(self.flat)
        # One step count per parameter, as torch's Adam keeps them, each parameter's state "step" a view of its own:
        # a step the optimizer itself takes (`model.optimizer.step()` in a subclass's update or a callback) advances
        # each once, and the next step here goes on from there. `step_count` is the first: the others' too while
        # `uneven_steps` is False.
        self._step_counts = torch.zeros(len(self.params), dtype=torch.float32, device=device)
        self._step_views = list(self._step_counts.unbind())
        self.step_count = self._step_views[0]
        self._bounds = [(end - size, end) for size, end in zip(sizes, itertools.accumulate(sizes))]
        self.uneven_steps = False

        def views(buffer: torch.Tensor) -> list[torch.Tensor]:
            return [chunk.view_as(p) for chunk, p in zip(buffer.split(sizes), self.params)]

        self.param_views, self.grad_views = views(self.flat), views(self.grad)
        self._exp_avg_views, self._exp_avg_sq_views = views(self.exp_avg), views(self.exp_avg_sq)
        for p, view, grad in zip(self.params, self.param_views, self.grad_views):
            p.data = view
            p.grad = grad
        self._fused_adam = getattr(torch, "_fused_adam_", None) if device.type in ("cpu", "cuda") else None
        self._adopt_optimizer_state()
        self._watch_optimizer()

    def _watch_optimizer(self) -> None:
        """Register the hook that notices the optimizer's own steps leaving a parameter out (a copied or unpickled
        optimizer holds no hooks: torch drops them)."""
        self._hook = self.optimizer.register_step_pre_hook(_NoteSkippedParameters(self))

    def __deepcopy__(self, memo: dict) -> FlatAdam:
        """A copy whose parameters live in its own flat buffer again: a Parameter's deepcopy clones its data, so the
        copied model's parameters (`copy.deepcopy(model)`, a frozen snapshot) would no longer be views of the copied
        buffer, and its next update would refuse them."""
        hook, self._hook = self._hook, None
        try:
            new = copy_attributes(self, memo)
        finally:
            self._hook = hook
        hold_in(new.flat, new.params, new.grad_views)
        new._watch_optimizer()
        return new

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_hook": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if "_step_views" not in state:  # (one an older rlspeed pickled: its counts moved together)
            self._step_views = [self.step_count, *self._step_counts[1:].unbind()]
            self._bounds = [(end - view.numel(), end) for view, end in
                            zip(self.param_views, itertools.accumulate(view.numel() for view in self.param_views))]
            self.uneven_steps = False
            self._state = None  # (adopted again before the next step)
        self._watch_optimizer()

    def release(self) -> None:
        """Hand the parameters back to the optimizer's own `step` (an update that stops using this one): each
        parameter's step count becomes a tensor of its own, no longer a view of the counts this class advances."""
        self._hook.remove()
        for p in self.params:
            state = self.optimizer.state[p]
            state["step"] = state["step"].clone()

    def _state_views(self) -> dict[str, list[torch.Tensor]]:
        """The optimizer's per-parameter state entries besides `step`, each with its views of the flat buffers."""
        return {"exp_avg": self._exp_avg_views, "exp_avg_sq": self._exp_avg_sq_views}

    def _adopt_optimizer_state(self) -> None:
        """Copy whatever state the optimizer holds into the flat buffers, each parameter's own (its step count and
        moments; a parameter without state starts from zero, as the optimizer starts it), then point its state at
        views of them."""
        state, views = self.optimizer.state, self._state_views()
        with torch.no_grad():
            for index, p in enumerate(self.params):
                loaded = state.get(p)
                complete = loaded and "step" in loaded and all(key in loaded for key in views)
                for key, key_views in views.items():
                    if complete:
                        key_views[index].copy_(loaded[key])
                    else:
                        key_views[index].zero_()
                # (on the buffer's device: as_tensor alone makes it on the caller's default device)
                self._step_views[index].copy_(torch.as_tensor(loaded["step"] if complete else 0.0,
                                                              dtype=torch.float32, device=self.step_count.device))
            self.uneven_steps = bool(self._step_counts.ne(self.step_count).any())
        for index, p in enumerate(self.params):
            state[p] = {"step": self._step_views[index],
                        **{key: key_views[index] for key, key_views in views.items()}}
        self._state, self._entries = state, list(state.values())
        self._own_entries = [state[p] for p in self.params]
        self._state_key, self._key_views = next(iter(views.items()))

    def _state_replaced(self) -> bool:
        """Whether some parameter's optimizer state is no longer the views of the flat buffers (a state loaded, or
        one parameter's reset: `optimizer.state[p] = {}`). Read without hashing a parameter (a Python call each):
        the state's entries, in the dict's order, are those `_adopt_optimizer_state` left."""
        state = self.optimizer.state
        if state is not self._state or len(state) != len(self._entries):
            return True
        own = self._own_entries
        return (any(map(operator.is_not, state.values(), self._entries))
                or any(map(operator.is_not, map(dict.get, own, itertools.repeat("step")), self._step_views))
                or any(map(operator.is_not, map(dict.get, own, itertools.repeat(self._state_key)), self._key_views)))

    def count_step(self) -> None:
        """Advance every parameter's step count by one (a step of the flat buffers)."""
        self._step_counts.add_(1)

    def check(self) -> None:
        """Before an update: re-adopt the optimizer state if it was replaced (load_state_dict); parameters whose
        data was replaced on their device (`p.data = pretrained`, `vector_to_parameters`) go back into the flat
        buffer with their new values (`hold_in`), and the update trains those; fail if one was moved to another
        device or given another shape."""
        if self._state_replaced():
            self._adopt_optimizer_state()
        if any(p.data_ptr() != view.data_ptr() for p, view in zip(self.params, self.param_views)):
            if any(p.device != self.flat.device or p.shape != view.shape
                   for p, view in zip(self.params, self.param_views)):
                raise RuntimeError("The parameters were moved to another device or given another shape after "
                                   "their flat buffer was built; build the model again on its device instead.")
            hold_in(self.flat, self.params, self.grad_views)

    def _reduce_and_clip(self, as_grad_scale: bool = False, grad: torch.Tensor | None = None) -> torch.Tensor | None:
        """Average the gradient (or the part of it `grad`) over the processes (several processes), then clip its
        global norm with clip_grad_norm_'s factor min(1, max / (norm + 1e-6)): applied to the gradient, or with
        `as_grad_scale` returned as its inverse, a grad scale >= 1 for a fused kernel to divide by (None when nothing
        clips)."""
        strategy, grad = self.strategy, self.grad if grad is None else grad
        if strategy is not None and strategy.enabled:
            strategy.all_reduce_sum(grad)
            grad.div_(strategy.world_size)
        if self.max_grad_norm is None:
            return None
        norm = torch.linalg.vector_norm(grad).add_(1e-6)
        if as_grad_scale:
            return norm.div_(self.max_grad_norm).clamp_(min=1.0)
        grad.mul_(torch.reciprocal(norm).mul_(self.max_grad_norm).clamp_(max=1.0))
        return None

    def step(self, parts: Sequence[slice] | None = None, advance: bool = True) -> None:
        """All-reduce (several processes), clip the global gradient norm, then one Adam step.

        `parts`: only the elements in these slices of the flat buffers (default: all). One Adam step taken in
        pieces, each computed from the parameters the one before changed (SAC's critics, then its actor), passes
        `advance=False` after the first piece: the step count moves once per step, as torch's Adam moves each
        parameter's. Clipping covers the whole gradient only: pieces take none (`max_grad_norm` None). With
        `uneven_steps`, each parameter's elements take their own step count.
        """
        if parts is not None and self.max_grad_norm is not None:
            raise ValueError("A step in parts cannot clip the global gradient norm.")
        group = self.optimizer.param_groups[0]
        lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
        weight_decay = group.get("weight_decay", 0.0)
        if advance:
            self.count_step()
        for part in [None] if parts is None else parts:
            if part is None and not self.uneven_steps:  # (the whole buffers, as they are: no views to make)
                flats, grads, exp_avgs, exp_avg_sqs = [self.flat], [self.grad], [self.exp_avg], [self.exp_avg_sq]
                steps = [self.step_count]
                grad_scale = self._reduce_and_clip(as_grad_scale=self._fused_adam is not None)
            else:
                part = slice(None) if part is None else part
                grad_scale = self._reduce_and_clip(as_grad_scale=self._fused_adam is not None, grad=self.grad[part])
                pieces = self._per_parameter(part) if self.uneven_steps else [(part, self.step_count)]
                flats, grads, exp_avgs, exp_avg_sqs = ([buffer[piece] for piece, _ in pieces] for buffer in
                                                       (self.flat, self.grad, self.exp_avg, self.exp_avg_sq))
                steps = [step for _, step in pieces]
            if self._fused_adam is not None:
                self._fused_adam(flats, grads, exp_avgs, exp_avg_sqs, [], steps, amsgrad=False, lr=lr,
                                 beta1=beta1, beta2=beta2, weight_decay=weight_decay, eps=eps, maximize=False,
                                 grad_scale=grad_scale, found_inf=None)
                continue
            for flat, grad, exp_avg, exp_avg_sq, step in zip(flats, grads, exp_avgs, exp_avg_sqs, steps):
                grad = grad if not weight_decay else grad.add(flat, alpha=weight_decay)
                exp_avg.lerp_(grad, 1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                bias1 = 1 - torch.pow(beta1, step)
                bias2_sqrt = (1 - torch.pow(beta2, step)).sqrt()
                denom = (exp_avg_sq.sqrt() / bias2_sqrt).add_(eps)
                flat.addcdiv_(exp_avg, denom * (bias1 / lr), value=-1.0)

    def _per_parameter(self, part: slice) -> list[tuple[slice, torch.Tensor]]:
        """`part` of the flat buffers cut at the parameters' bounds, each piece with its parameter's step count."""
        start, stop, _ = part.indices(self.flat.numel())
        return [(slice(max(start, begin), min(stop, end)), step)
                for (begin, end), step in zip(self._bounds, self._step_views) if max(start, begin) < min(stop, end)]


def activation_backward(grad: torch.Tensor, output: torch.Tensor, tanh: bool) -> torch.Tensor:
    """d/d(pre-activation) from d/d(output) and the activation's output, in place in `grad`: autograd's own fused
    kernels (no new buffer: for [256, 256]-wide layers, fresh buffers cost page faults as much as the maths)."""
    if tanh:
        return torch.ops.aten.tanh_backward.grad_input(grad, output, grad_input=grad)  # grad * (1 - output^2)
    return torch.ops.aten.threshold_backward.grad_input(grad, output, 0.0, grad_input=grad)  # grad where output > 0


_ADD_RELU_ = torch.ops.aten._add_relu_  # relu(z + bias) in place, one pass (CPU kernel)


def tanh_(z: torch.Tensor) -> torch.Tensor:
    """tanh in place. On a CPU in float32 as 2 sigmoid(2z) - 1, the same function to within 2.4e-7 (absolute;
    tests/test_flat.py checks it over the whole float range): torch's CPU tanh kernel costs several times its sigmoid
    kernel plus the three scaling passes, and the hidden layers' tanh is the hand-derived updates' largest cost after
    the matrix products (benchmarks/thin_products.py re-measures the two). Elsewhere (other dtypes, accelerators)
    torch's own tanh."""
    if z.device.type != "cpu" or z.dtype != torch.float32:
        return z.tanh_()
    return z.mul_(2.0).sigmoid_().mul_(2.0).sub_(1.0)


def _activate_(z: torch.Tensor, tanh: bool) -> torch.Tensor:
    return tanh_(z) if tanh else z.relu_()


class Workspace:
    """Output buffers that one hand-derived update reuses on every call, by name.

    An update allocates the same activations and gradients each time; for [256, 256]-wide layers on a CPU a fresh
    buffer of hundreds of KiB comes from the C allocator as memory the kernel has to map page by page, which costs
    about as much as the matrix product that fills it. `get` hands back the buffer kept under `key`, made anew only
    when the shape, dtype or device changes. Buffers are overwritten by the next call that asks for the same key:
    whoever keeps a result beyond one update must copy it.
    """

    def __init__(self) -> None:
        self._buffers: dict[object, torch.Tensor] = {}

    def get(self, key: object, shape: Sequence[int], like: torch.Tensor) -> torch.Tensor:
        """The buffer under `key`, with `shape` and the dtype and device of `like` (contents undefined)."""
        buffer = self._buffers.get(key)
        if buffer is None or buffer.shape != tuple(shape) or buffer.dtype != like.dtype or buffer.device != like.device:
            buffer = self._buffers[key] = torch.empty(tuple(shape), dtype=like.dtype, device=like.device)
        return buffer


def _out(workspace: Workspace | None, key: object, shape: Sequence[int], like: torch.Tensor,
         needed: bool = False) -> torch.Tensor | None:
    """The workspace's buffer under `key`; without a workspace None (the op allocates), or a new tensor if `needed`."""
    if workspace is None:
        return torch.empty(tuple(shape), dtype=like.dtype, device=like.device) if needed else None
    return workspace.get(key, shape, like)


#: the activation layers whose derivative `activation_backward` writes out (`HAND_DERIVED_ACTIVATIONS`' classes)
DERIVED_ACTIVATIONS = tuple(ACTIVATIONS[name] for name in HAND_DERIVED_ACTIVATIONS)
#: the activation layers' classes -> their names in `ACTIVATIONS`
_ACTIVATION_NAMES = {cls: name for name, cls in ACTIVATIONS.items()}


def activation_reason(layer: nn.Module | None) -> str | None:
    """Why the hand-derived updates do not cover a network whose hidden layers are followed by `layer`, or None
    (tanh or ReLU). Every other activation of `rlspeed.nn.ACTIVATIONS` trains with autograd, which says so."""
    if type(layer) in DERIVED_ACTIVATIONS:
        return None
    return (f"activation={_ACTIVATION_NAMES.get(type(layer), type(layer).__name__)} (the hand-derived update covers "
            f"{' and '.join(HAND_DERIVED_ACTIVATIONS)})")


# --- forward passes that keep their activations, and the backward passes written out ------------------------------
def sequential_linears(network: nn.Module) -> tuple[list[nn.Linear], bool] | None:
    """(linear layers, tanh?) of a Sequential `Linear, act, Linear, act, ..., Linear` with one kind of activation
    (ReLU or tanh); None for anything else."""
    if not isinstance(network, nn.Sequential):
        return None
    layers = list(network)
    linears, activations = layers[0::2], layers[1::2]
    if not linears or not all(type(layer) is nn.Linear for layer in linears):
        return None
    if len(activations) != len(linears) - 1 or len({type(a) for a in activations}) > 1:
        return None
    if activations and type(activations[0]) not in DERIVED_ACTIVATIONS:
        return None
    return linears, bool(activations) and type(activations[0]) is nn.Tanh


# --- matrix products ------------------------------------------------------------------------------------------------
# Under the bf16-matmul precision (oneDNN's fp32_precision="bf16": fp32 tensors, products computed in bf16, AMX
# where the CPU has it) wide products run several times faster than in fp32, but every call pays a fixed oneDNN
# overhead larger than a thin product's whole fp32 time (a 4-wide input layer, a 1-wide Q head). Products below
# these sizes therefore run in fp32 even inside a bf16-matmul region. oneDNN's batched product also copies
# transposed or sliced operands that its plain product reads in place, so wide ensembles run one product per member
# under that precision. benchmarks/fused_updates.py and benchmarks/accel_update_step.py measure the effect.
# (torch.backends.mkldnn.matmul and its fp32_precision came with torch 2.9: before it, no bf16-matmul region exists)
_MKLDNN_MATMUL = getattr(torch.backends.mkldnn, "matmul", None)
REDUCED_MIN_DIM = 64  # every dimension at least this ...
REDUCED_MIN_MACS = 1 << 22  # ... and at least this many multiply-adds (~4M: 256x256x64) for a reduced precision
PER_MEMBER_MIN_WIDTH = 128  # ensembles with a layer this wide run one product per member


# A CPU product whose output has only 2-4 columns is several times slower written row-major than column-major
# (MKL's fp32 GEMM), so such outputs are made column-major: a transposed view of a [cols, rows] buffer. One column
# is a matrix-vector product (no gain), wider outputs gain nothing or lose (benchmarks/fused_updates.py).
COLUMN_MAJOR_COLS = (2, 4)  # output columns, inclusive
COLUMN_MAJOR_MIN_ROWS = 64


def reduced_matmuls() -> bool:
    """Whether a bf16-matmul region is active (read once per pass, not per product: reading the setting is not free)."""
    return _MKLDNN_MATMUL is not None and _MKLDNN_MATMUL.fp32_precision == "bf16"


def column_major(rows: int, cols: int, device: torch.device) -> bool:
    """Whether a `[rows, cols]` product output is faster written column-major (see `COLUMN_MAJOR_COLS`)."""
    low, high = COLUMN_MAJOR_COLS
    return device.type == "cpu" and low <= cols <= high and rows >= COLUMN_MAJOR_MIN_ROWS


def _product(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None, bias: torch.Tensor | None = None,
             reduced: bool = False):
    """`bias + a @ b` (or `a @ b`) into `out` (a new column-major buffer where that is faster, for `out=None`);
    in a bf16-matmul region (`reduced`) in fp32 all the same when the product is too small to gain from it (see
    above)."""
    if out is None and column_major(a.shape[0], b.shape[1], a.device):
        out = torch.empty((b.shape[1], a.shape[0]), dtype=a.dtype, device=a.device).t()
    thin = reduced and (min(*a.shape, b.shape[1]) < REDUCED_MIN_DIM or a.numel() * b.shape[1] < REDUCED_MIN_MACS)
    if thin:
        _MKLDNN_MATMUL.fp32_precision = "ieee"
    try:
        return torch.mm(a, b, out=out) if bias is None else torch.addmm(bias, a, b, out=out)
    finally:
        if thin:
            _MKLDNN_MATMUL.fp32_precision = "bf16"


# MKL's batched product (`bmm`, an ensemble's layer on a CPU) runs far below its arithmetic where one side has one to
# four columns: a 1-wide value or Q head costs about as much as a 64-wide hidden layer. Such products take forms that
# are faster at every ensemble shape benchmarks/thin_products.py measures (2-64 members, 10-256 rows, 64-256 wide):
# one output column as a multiply and a sum over the inner dimension, one inner column (the outer product of a
# 1-wide head's gradient) as a broadcast multiply, a weight gradient of 1-4 columns as the product of its transpose,
# and 2-4 output columns written column-major (from `COLUMN_MAJOR_MIN_ROWS` rows, as for the plain products above).
THIN_COLUMNS = 4


def _ensemble_product(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None, bias: torch.Tensor | None = None,
                      workspace: Workspace | None = None, key: object = None) -> torch.Tensor:
    """`bias + a @ b` (or `a @ b`) of `[K, B, n] @ [K, n, m]` into `out` (None: a new tensor); on a CPU one output
    or inner column in the faster form above (a multiply into the workspace's buffer under (`key`, "thin") and a
    sum, or a broadcast multiply)."""
    if a.device.type == "cpu" and (b.shape[2] == 1 or b.shape[1] == 1):
        if b.shape[2] == 1:
            scratch = torch.mul(a, b.transpose(1, 2), out=_out(workspace, (key, "thin"), a.shape, a, needed=True))
            out = torch.sum(scratch, 2, keepdim=True, out=out)
        else:
            out = torch.mul(a, b, out=out)
        return out if bias is None else out.add_(bias)
    return torch.bmm(a, b, out=out) if bias is None else torch.baddbmm(bias, a, b, out=out)


def _ensemble_out(workspace: Workspace | None, key: object, shape: Sequence[int], like: torch.Tensor,
                  needed: bool = False) -> torch.Tensor | None:
    """The output `[K, B, m]` of an ensemble product, as `_out`, column-major (the transpose of a `[K, m, B]` buffer)
    where `column_major` says each member's output is written faster that way (above)."""
    members, rows, cols = shape
    if column_major(rows, cols, like.device):
        if workspace is None:
            return torch.empty((members, cols, rows), dtype=like.dtype, device=like.device).transpose(1, 2)
        return workspace.get(key, (members, cols, rows), like).transpose(1, 2)
    return _out(workspace, key, shape, like, needed)


def _product_out(workspace: Workspace | None, key: object, rows: int, cols: int,
                 like: torch.Tensor) -> torch.Tensor | None:
    """The output of a `[rows, cols]` product: the workspace's buffer under `key`, column-major (the transpose of a
    `[cols, rows]` buffer) where `column_major` says so; None without a workspace (`_product` allocates)."""
    if workspace is None:
        return None
    if column_major(rows, cols, like.device):
        return workspace.get(key, (cols, rows), like).t()
    return workspace.get(key, (rows, cols), like)


def _per_member(weights, reduced: bool) -> bool:
    """Whether an ensemble runs one product per member: wide layers in a bf16-matmul region (in fp32 one batched
    product is as fast and costs fewer calls)."""
    widest = max(max(w.shape[1:]) for w in weights)
    return reduced and weights[0].device.type == "cpu" and widest >= PER_MEMBER_MIN_WIDTH


def _forward(x: torch.Tensor, weights, biases, tanh: bool, workspace: Workspace | None, tag: str,
             ensemble: bool) -> list[torch.Tensor]:
    """The input of every layer, then the output; `ensemble`: weights `[K, in, out]` on `[K, B, in]` (one product
    per member for wide layers, else `baddbmm`), else weights `[out, in]` and `addmm` on `[B, in]`. With a
    `workspace`, the outputs are its buffers under (`tag`, "forward", layer)."""
    outputs = [x]
    last = len(weights) - 1
    reduced = reduced_matmuls()
    per_member = ensemble and _per_member(weights, reduced)
    # ReLU layers on a CPU: the product without its bias, then bias and ReLU in one pass (`_add_relu_`), instead
    # of the bias copied into the output, the product added to it, and the ReLU pass.
    add_relu = not tanh and x.device.type == "cpu"
    for layer, (weight, bias) in enumerate(zip(weights, biases)):
        inputs = outputs[-1]
        fold_bias = layer != last and add_relu
        if ensemble:
            shape = (*x.shape[:2], weight.shape[2])
            out = _ensemble_out(workspace, (tag, "forward", layer), shape, x, needed=per_member)
            if per_member:
                for k in range(weight.shape[0]):
                    _product(inputs[k], weight[k], out[k], None if fold_bias else bias[k], reduced)
                z = out
            else:
                z = _ensemble_product(inputs, weight, out, None if fold_bias else bias, workspace,
                                      (tag, "forward", layer))
        else:
            out = _product_out(workspace, (tag, "forward", layer), x.shape[0], weight.shape[0], x)
            z = _product(inputs, weight.t(), out, None if fold_bias else bias, reduced)
        if layer != last:
            z = _ADD_RELU_(z, bias) if fold_bias else _activate_(z, tanh)
        outputs.append(z)
    return outputs


def linear_forward(x: torch.Tensor, weights, biases, tanh: bool, workspace: Workspace | None = None,
                   tag: str = "linear") -> list[torch.Tensor]:
    """An MLP of `nn.Linear` layers (weights `[out, in]`) on `[B, in]`: the input of every layer, then the output
    (with a `workspace`, its buffers under (`tag`, "forward", layer)). A layer output that `column_major` calls
    narrow (2-4 columns, e.g. a policy head, on a CPU) comes as a column-major view, not contiguous."""
    return _forward(x, weights, biases, tanh, workspace, tag, ensemble=False)


def linear_backward(grad: torch.Tensor, outputs: list[torch.Tensor], weights, weight_grads, bias_grads,
                    tanh: bool, workspace: Workspace | None = None, tag: str = "linear") -> None:
    """Backward of `linear_forward` from d/d(output), writing dW = g^T x and db = sum g into the given views
    (with a `workspace`, the gradients between layers are its buffers under (`tag`, "backward", layer))."""
    reduced = reduced_matmuls()
    for layer in range(len(weights) - 1, -1, -1):
        inputs = outputs[layer]
        weight_grad = weight_grads[layer]  # [out, in]
        if column_major(*weight_grad.shape, weight_grad.device):  # a narrow input (the observations): via dW^T
            weight_grad_t = _out(workspace, (tag, "weight grad", layer), weight_grad.shape[::-1], weight_grad, True)
            weight_grad.copy_(_product(inputs.t(), grad, weight_grad_t, reduced=reduced).t())
        else:
            _product(grad.t(), inputs, weight_grad, reduced=reduced)
        torch.sum(grad, dim=0, out=bias_grads[layer])
        if layer:
            out = _out(workspace, (tag, "backward", layer), inputs.shape, inputs)
            grad = activation_backward(_product(grad, weights[layer], out, reduced=reduced), inputs, tanh)


def ensemble_forward(x: torch.Tensor, weights, biases, tanh: bool, workspace: Workspace | None = None,
                     tag: str = "ensemble") -> list[torch.Tensor]:
    """An `EnsembleMLP` (weights `[K, in, out]`) on `[K, B, in]`: the input of every layer, then the output
    (with a `workspace`, its buffers under (`tag`, "forward", layer))."""
    return _forward(x, weights, biases, tanh, workspace, tag, ensemble=True)


def ensemble_backward(grad: torch.Tensor, outputs: list[torch.Tensor], weights, weight_grads, bias_grads,
                      tanh: bool, workspace: Workspace | None = None, tag: str = "ensemble") -> None:
    """Backward of `ensemble_forward` from d/d(output) `[K, B, out]`: the weight and bias gradients, written into
    `weight_grads` and `bias_grads`. With a `workspace`, the gradients between layers are its buffers under (`tag`,
    "backward", layer)."""
    reduced = reduced_matmuls()
    per_member = _per_member(weights, reduced)
    for layer in range(len(weights) - 1, -1, -1):
        inputs = outputs[layer]
        if per_member:
            for k in range(weights[0].shape[0]):
                _product(inputs[k].t(), grad[k], weight_grads[layer][k], reduced=reduced)
        elif grad.shape[2] <= THIN_COLUMNS and grad.device.type == "cpu":  # via dW^T = g^T x (see THIN_COLUMNS)
            transposed = _out(workspace, (tag, "weight grad", layer), (grad.shape[0], grad.shape[2], inputs.shape[2]),
                              inputs, needed=True)
            weight_grads[layer].copy_(torch.bmm(grad.transpose(1, 2), inputs, out=transposed).transpose(1, 2))
        else:
            torch.bmm(inputs.transpose(1, 2), grad, out=weight_grads[layer])
        torch.sum(grad, dim=1, keepdim=True, out=bias_grads[layer])
        if layer:
            out = _out(workspace, (tag, "backward", layer), inputs.shape, inputs, needed=per_member)
            grad = _ensemble_layer_input_grad(grad, weights[layer], inputs, tanh, out, per_member, reduced)


def ensemble_input_grad(grad: torch.Tensor, outputs: list[torch.Tensor], weights, tanh: bool,
                        columns: slice = slice(None), workspace: Workspace | None = None,
                        tag: str = "input grad") -> torch.Tensor:
    """d/d(input) `[K, B, in]` of `ensemble_forward` from d/d(output) `[K, B, out]`, the weights held constant (no
    weight gradients): a loss that reaches the inputs only (SAC's actor loss through its critics). `columns`: only
    those columns of d/d(input) (e.g. the action inputs of a critic). With a `workspace`, the gradients between
    layers are its buffers under (`tag`, layer)."""
    reduced = reduced_matmuls()
    per_member = _per_member(weights, reduced)
    for layer in range(len(weights) - 1, 0, -1):
        inputs = outputs[layer]
        out = _out(workspace, (tag, layer), inputs.shape, inputs, needed=per_member)
        grad = _ensemble_layer_input_grad(grad, weights[layer], inputs, tanh, out, per_member, reduced)
    first = weights[0][:, columns]
    if per_member:
        return torch.stack([_product(grad[k], first[k].t(), None, reduced=reduced) for k in range(first.shape[0])])
    return _ensemble_product(grad, first.transpose(1, 2), None, workspace=workspace, key=(tag, 0))


def _ensemble_layer_input_grad(grad: torch.Tensor, weight: torch.Tensor, inputs: torch.Tensor, tanh: bool,
                               out: torch.Tensor | None, per_member: bool, reduced: bool) -> torch.Tensor:
    """d/d(pre-activation) of a hidden layer whose output `inputs` feeds `weight` `[K, in, out]`, from d/d(output)
    of that product, `grad` `[K, B, out]` (in `out` where given)."""
    if per_member:
        for k in range(weight.shape[0]):
            _product(grad[k], weight[k].t(), out[k], reduced=reduced)
    else:
        out = _ensemble_product(grad, weight.transpose(1, 2), out)
    return activation_backward(out, inputs, tanh)


def ensemble_rows_input_grad(grad: torch.Tensor, outputs: list[torch.Tensor], member: int,
                             weights_t: list[torch.Tensor], tanh: bool, index: torch.Tensor,
                             workspace: Workspace | None = None, tag: str = "rows") -> torch.Tensor:
    """d/d(input) of one member of `ensemble_forward` at some of its rows, the weights held constant.

    `grad` is d/d(output) `[n, out]` at the rows `index` (`[n]`) of member `member` of the pass whose `outputs`
    are given; `weights_t` are that member's weights transposed, `[out, in]` per layer (the first may keep only
    some input columns: then only those columns of d/d(input) are computed). Returns d/d(input) `[n, in]`. Where
    a loss reaches each row through one member only (a minimum over an ensemble), this does a fraction of
    `ensemble_backward`'s products. With a `workspace`, the gathered activations and the gradients between layers
    are its buffers under (`tag`, layer, ...), sized for all of the member's rows (the number of rows chosen may
    change from call to call).
    """
    reduced = reduced_matmuls()
    rows = index.shape[0]
    for layer in range(len(weights_t) - 1, 0, -1):
        inputs = outputs[layer][member]  # [B, in]
        if workspace is None:
            grad_out = torch.empty((rows, inputs.shape[1]), dtype=inputs.dtype, device=inputs.device)
            gathered = torch.empty_like(grad_out)
        else:
            grad_out = workspace.get((tag, layer, "grad"), inputs.shape, inputs)[:rows]
            gathered = workspace.get((tag, layer, "inputs"), inputs.shape, inputs)[:rows]
        grad = _product(grad, weights_t[layer], grad_out, reduced=reduced)
        grad = activation_backward(grad, torch.index_select(inputs, 0, index, out=gathered), tanh)
    return _product(grad, weights_t[0], None, reduced=reduced)
