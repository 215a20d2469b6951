"""What a loss function reaches by name, found without running it (for `accelerate_step`'s cache key and graphs).

The function itself (a module), the object of a bound method or a callable object and its attributes (``self.x``),
its closure cells, and the globals its code names. Values reached only deeper (an attribute of an attribute, a
helper function's globals) are not found.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

import torch
from torch import nn


def owner_and_function(fn: Any) -> tuple[Any, Any]:
    """(the object whose attributes `fn` reads as ``self``, or None; the function whose code runs)."""
    owner = getattr(fn, "__self__", None)
    func = getattr(fn, "__func__", fn)
    if owner is None and not hasattr(func, "__code__") and not isinstance(fn, nn.Module):
        owner, func = fn, type(fn).__call__  # a callable object: its __call__, its attributes
    return owner, func


def code_names(code: Any) -> list[str]:
    """The global and attribute names a code object and the code nested in it (lambdas, comprehensions) use."""
    names = list(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names.extend(code_names(const))
    return names


def _closure_values(func: Any) -> list[tuple[Any, Any]]:
    """(cell, value) of the closure cells that hold a value (an empty cell: a name assigned after the definition)."""
    cells = []
    for cell in getattr(func, "__closure__", None) or ():
        try:
            cells.append((cell, cell.cell_contents))
        except ValueError:
            pass
    return cells


def reachable_modules(fn: Any) -> list[nn.Module]:
    """The nn.Modules `fn` reaches by name (see the module docstring), each once."""
    owner, func = owner_and_function(fn)
    found = [fn]
    if owner is not None:
        found.append(owner)
        if not isinstance(owner, nn.Module):  # a module's own attributes are its submodules, covered by .modules()
            found.extend(getattr(owner, "__dict__", {}).values())
    found.extend(value for _, value in _closure_values(func))
    code, scope = getattr(func, "__code__", None), getattr(func, "__globals__", {})
    if code is not None:
        found.extend(scope[name] for name in code_names(code) if name in scope)
    unique: dict[int, nn.Module] = {}
    for value in found:
        if isinstance(value, nn.Module):
            unique.setdefault(id(value), value)
    return list(unique.values())


def named_numbers(fn: Any) -> list[Callable[[], Any]]:
    """Readers of the numbers (int, float, bool) `fn` reads by name: closure cells, the globals its code names and
    its object's attributes (``self.gamma``), each read afresh on every call of the reader."""
    def is_number(value: Any) -> bool:
        return isinstance(value, numbers.Number) and not isinstance(value, torch.Tensor)

    owner, func = owner_and_function(fn)
    readers: list[Callable[[], Any]] = [lambda cell=cell: cell.cell_contents
                                        for cell, value in _closure_values(func) if is_number(value)]
    code = getattr(func, "__code__", None)
    names = sorted(set(code_names(code))) if code is not None else []
    scope = getattr(func, "__globals__", {})
    readers += [lambda name=name: scope.get(name) for name in names if is_number(scope.get(name))]
    attributes = getattr(owner, "__dict__", None) if owner is not None else None
    if attributes is not None:
        readers += [lambda name=name: attributes.get(name) for name in names if is_number(attributes.get(name))]
    return readers


__all__ = ["owner_and_function", "code_names", "reachable_modules", "named_numbers"]
