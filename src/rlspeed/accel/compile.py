"""torch.compile with a compilation counter and CUDA graph capture; the batch size of a call.

Every graph the backend compiles is counted (`CompileCounter`), so "no recompile storm" is something a test and a
user can check. Varying batch sizes are left to dynamo's automatic dynamic shapes: the first batch size compiles a
static graph, a second one a graph with a symbolic batch dimension that serves every later size. (Padding batches
to power-of-two buckets instead compiled more graphs and ran slower: benchmarks/README.md, "What each mechanism
of `rlspeed.accel` buys".)
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
    """`torch.compile(fn)` with the strategy's backend (automatic dynamic shapes), counting every graph compiled
    into `counter`."""
    inner = _backend_callable(strategy.compile, strategy.graphs)

    def counting_backend(graph_module, example_inputs):
        counter.compilations += 1
        return inner(graph_module, example_inputs)

    return torch.compile(fn, backend=counting_backend)


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
    for value in (*args, *kwargs.values()) if kwargs else args:  # (flat arguments, the common case: no walk)
        if type(value) is torch.Tensor:
            if value.dim() >= 2:
                return int(value.shape[0])
        elif not isinstance(value, (bool, int, float, str, type(None))):
            break  # a nested structure or a tensor subclass: the general walk below
    else:
        return None
    for tensor in tensors_in((args, kwargs)):
        if tensor.dim() >= 2:
            return int(tensor.shape[0])
    return None
