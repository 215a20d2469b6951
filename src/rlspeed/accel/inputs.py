"""Getting a call's inputs onto the device in the right dtypes, and walking nested inputs and outputs.

Numpy arrays, lists of numbers and tensors on another device become tensors on the accelerated device: float64 is
narrowed to the model's floating dtype (float32 for a float32 model, left alone for a float64 one; float32,
float16 and bfloat16 are kept), signed integers narrower than the device's preferred index dtype
(`rlspeed.device.rules`) widened to it, never narrowed (an int64 stays int64 where the device prefers int32: losses
such as `cross_entropy` and `one_hot` need int64, and a user's code must run as written), bool and uint8 unchanged.
Tensors already on the device only get the dtype rule.
Python scalars, strings and other objects pass through untouched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from rlspeed.device import rules

_SIGNED_INTS = (torch.int8, torch.int16, torch.int32, torch.int64)
_PASS_TYPES = (bool, int, float, str, bytes, type(None))


class InputConverter:
    """Moves and converts call arguments for one device. Cheap when nothing needs doing (the common case)."""

    def __init__(self, device: torch.device, float_dtype: torch.dtype = torch.float32):
        self.device = device
        self.index_dtype = rules(device).index_dtype
        # float64 inputs become the model's floating dtype; a float64 (.double()) model keeps them as they are,
        # since narrowing them would fail in its first matmul ("mat1 and mat2 must have the same dtype")
        self.float_dtype = float_dtype
        narrowed = {torch.float64} if float_dtype != torch.float64 else set()
        # dtypes a tensor on the right device still has to be converted from
        self.widened = {d for d in _SIGNED_INTS if d.itemsize < self.index_dtype.itemsize}
        self.convert_dtypes = {*narrowed, *self.widened}

    def _ready(self, value: Any) -> bool:
        if isinstance(value, torch.Tensor):
            return value.device == self.device and value.dtype not in self.convert_dtypes
        return isinstance(value, _PASS_TYPES)

    def __call__(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        ready = self._ready
        if all(ready(a) for a in args) and (not kwargs or all(ready(v) for v in kwargs.values())):
            return args, kwargs
        return (tuple(self.convert(a) for a in args), {k: self.convert(v) for k, v in kwargs.items()})

    def convert(self, value: Any) -> Any:
        """One argument (recursively through lists, tuples and dicts)."""
        if isinstance(value, torch.Tensor):
            return self._tensor(value)
        if isinstance(value, (np.ndarray, np.generic)):
            return self._array(np.asarray(value))
        if isinstance(value, (list, tuple)) and value:
            if _is_number_list(value):
                try:
                    return self._array(np.asarray(value))
                except ValueError:  # ragged: convert the items one by one
                    pass
            items = [self.convert(item) for item in value]
            if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
                return type(value)(*items)
            return type(value)(items)
        if isinstance(value, dict):
            return type(value)((key, self.convert(item)) for key, item in value.items())
        return value

    def _array(self, array: np.ndarray) -> Any:
        if array.dtype.kind not in "biuf":
            return array  # strings or objects: not ours to convert
        return self._tensor(torch.from_numpy(np.ascontiguousarray(array)))

    def _tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        dtype = tensor.dtype
        if dtype == torch.float64:
            dtype = self.float_dtype
        elif dtype in self.widened:
            dtype = self.index_dtype
        if tensor.device == self.device and dtype == tensor.dtype:
            return tensor
        # (a blocking copy, as the plain `.to(device)` the call stands in for: a caller may refill its pinned host
        # buffer as soon as the call returns, which an asynchronous copy could still be reading)
        return tensor.to(device=self.device, dtype=dtype)


def floating_dtype(tensors: Any) -> torch.dtype:
    """The dtype of the first floating-point tensor among `tensors` (a model's parameters), float32 if none."""
    return next((t.dtype for t in tensors if t.is_floating_point()), torch.float32)


def _is_number_list(value: list | tuple) -> bool:
    """A (nested) list of numbers, e.g. an observation written as ``[0.1, 0.2]``; tuples are left alone (they
    are more often shapes or groups of arguments than data)."""
    if not isinstance(value, list):
        return False
    first: Any = value
    while isinstance(first, list) and first:
        first = first[0]
    return isinstance(first, (int, float, np.number)) and not isinstance(first, bool)


def map_tensors(value: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """Apply `fn` to every tensor in a nested structure of tuples, lists and dicts; other leaves pass through."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, tuple):
        items = [map_tensors(item, fn) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    if isinstance(value, list):
        return [map_tensors(item, fn) for item in value]
    if isinstance(value, dict):
        return type(value)((key, map_tensors(item, fn)) for key, item in value.items())
    return value


def tensors_in(value: Any) -> list[torch.Tensor]:
    """Every tensor in a nested structure, in order."""
    found: list[torch.Tensor] = []
    map_tensors(value, found.append)
    return found


def opaque_leaf(value: Any) -> str | None:
    """The type name of the first leaf of a nested structure that is neither a tensor nor a plain Python value (a
    torch.distributions object, a dataclass...): tensors inside it are invisible to `tensors_in` and `to_float32`.
    None when every leaf is visible."""
    if isinstance(value, (torch.Tensor, *_PASS_TYPES)):
        return None
    if isinstance(value, (tuple, list, dict)):
        for item in value.values() if isinstance(value, dict) else value:
            found = opaque_leaf(item)
            if found is not None:
                return found
        return None
    return type(value).__name__


def to_float32(value: Any) -> Any:
    """bf16/fp16 tensors in an output structure cast back to float32 (what the un-accelerated model returns)."""
    if isinstance(value, torch.Tensor):  # the common single-tensor case without the recursion
        return value.float() if value.dtype in (torch.bfloat16, torch.float16) else value
    return map_tensors(value, lambda t: t.float() if t.dtype in (torch.bfloat16, torch.float16) else t)
