"""torch.compile with a compilation counter, CUDA graph capture, and batch-size bucketing.

Every graph the backend compiles is counted (`CompileCounter`), so "no recompile storm" is something a test and a
user can check. Varying batch sizes are handled in one of two ways:

* bucketing (modules whose rows are independent, verified numerically during the search): the batch dimension is
  padded to the next power of two (the last real row repeated, so padded rows stay finite) and the outputs are
  sliced back; every batch size in a bucket reuses one static graph;
* otherwise dynamo's automatic dynamic shapes: the first batch size compiles a static graph, a second one compiles
  a graph with a symbolic batch dimension that serves every later size.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from rlspeed.accel.inputs import map_tensors, tensors_in
from rlspeed.accel.strategy import Strategy


class CompileCounter:
    """How many graphs the compile backend has compiled (first compilations and recompilations alike)."""

    def __init__(self) -> None:
        self.compilations = 0


def _backend_callable(name: str, graphs: bool) -> Callable:
    """The dynamo backend for a name; CUDA graphs are inductor's cudagraph trees (what mode="reduce-overhead" sets).

    Inductor runs with ``fallback_random``: random ops draw from the same generator as eager PyTorch, so a compiled
    policy samples exactly what the eager one would from the same seed (and the search can compare them).
    """
    if name == "inductor":
        from torch._inductor.compile_fx import compile_fx

        patches: dict[str, Any] = {"fallback_random": True}
        if graphs:
            patches["triton.cudagraphs"] = True
        return functools.partial(compile_fx, config_patches=patches)
    if name == "torchair":
        import torchair  # type: ignore[import-not-found]
        from torchair.configs.compiler_config import CompilerConfig  # type: ignore[import-not-found]

        return torchair.get_npu_backend(compiler_config=CompilerConfig())
    from torch._dynamo import lookup_backend

    return lookup_backend(name)


def compile_function(fn: Callable, strategy: Strategy, counter: CompileCounter) -> Callable:
    """`torch.compile(fn)` with the strategy's backend, counting every graph compiled into `counter`.

    Static shapes when the caller buckets the batch dimension; automatic dynamic shapes otherwise.
    """
    inner = _backend_callable(strategy.compile, strategy.graphs)

    def counting_backend(graph_module, example_inputs):
        counter.compilations += 1
        return inner(graph_module, example_inputs)

    return torch.compile(fn, backend=counting_backend, dynamic=False if strategy.bucket else None)


def graph_safe(fn: Callable) -> Callable:
    """For CUDA-graphed functions: mark a new step before each call and clone the outputs, which graph replays
    would otherwise overwrite (user code keeps outputs around, e.g. values appended to a list)."""

    def call(*args, **kwargs):
        torch.compiler.cudagraph_mark_step_begin()
        return map_tensors(fn(*args, **kwargs), torch.Tensor.clone)

    return call


def bucket_size(batch: int) -> int:
    """The next power of two at or above `batch` (the bucket a batch size falls in)."""
    return 1 << max(batch - 1, 0).bit_length()


def batch_size_of(args: tuple, kwargs: dict) -> int | None:
    """The leading dimension of the first tensor argument with at least two dimensions (None when there is none)."""
    for tensor in tensors_in((args, kwargs)):
        if tensor.dim() >= 2:
            return int(tensor.shape[0])
    return None


def pad_batch(args: tuple, kwargs: dict, batch: int, padded: int) -> tuple[tuple, dict]:
    """Pad every tensor argument whose leading dimension is `batch` to `padded` rows by repeating its last row."""
    if padded == batch:
        return args, kwargs

    def pad(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.dim() == 0 or tensor.shape[0] != batch:
            return tensor
        filler = tensor[-1:].expand(padded - batch, *tensor.shape[1:])
        return torch.cat((tensor, filler), dim=0)

    return map_tensors(args, pad), map_tensors(kwargs, pad)


def slice_batch(outputs: Any, batch: int, padded: int) -> Any:
    """Cut padded rows off every output tensor whose leading dimension is `padded`."""
    if padded == batch:
        return outputs
    return map_tensors(outputs, lambda t: t[:batch] if t.dim() > 0 and t.shape[0] == padded else t)


def bucketed(fn: Callable) -> Callable:
    """`fn` called on inputs padded to the batch bucket, with outputs sliced back to the real batch size."""

    def call(*args, **kwargs):
        batch = batch_size_of(args, kwargs)
        if not batch:  # no batch dimension, or an empty batch (obs[done] with nothing done): no last row to repeat
            return fn(*args, **kwargs)
        padded = bucket_size(batch)
        padded_args, padded_kwargs = pad_batch(args, kwargs, batch, padded)
        return slice_batch(fn(*padded_args, **padded_kwargs), batch, padded)

    return call
