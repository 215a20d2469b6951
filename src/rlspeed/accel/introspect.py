"""What a loss function reaches by name, found without running it (for `accelerate_step`'s cache key and graphs).

The function itself (a module), the object of a bound method or a callable object and its attributes (``self.x``),
its closure cells, the globals its code names, and the function and arguments of a `functools.partial`. For numbers,
also one level further into plain objects reached that way (``self.schedule.beta``, ``args.gamma``). Values reached
deeper (``self.config.sub.x``), computed on access (properties) or read by helper functions are not found.
"""

from __future__ import annotations

import functools
import numbers
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import nn


def made_as(module: nn.Module) -> type:
    """The class `module` was made as: `auto_accelerate` swaps in a subclass of it, whose `_rlspeed_base` names it."""
    return getattr(type(module), "_rlspeed_base", type(module))


def _unwrap(fn: Any) -> tuple[Any, list[Any]]:
    """(the function inside any `functools.partial` layers, the arguments those layers bind)."""
    bound: list[Any] = []
    while isinstance(fn, functools.partial):
        bound += [*fn.args, *fn.keywords.values()]
        fn = fn.func
    return fn, bound


def owner_and_function(fn: Any) -> tuple[Any, Any]:
    """(the object whose attributes `fn` reads as ``self``, or None; the function whose code runs)."""
    fn, _ = _unwrap(fn)
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


def _closure_values(func: Any) -> list[tuple[str, Any, Any]]:
    """(name, cell, value) of the closure cells that hold a value (an empty cell: a name assigned after the
    definition)."""
    code = getattr(func, "__code__", None)
    cells = []
    for name, cell in zip(code.co_freevars if code is not None else (), getattr(func, "__closure__", None) or ()):
        try:
            cells.append((name, cell, cell.cell_contents))
        except ValueError:
            pass
    return cells


def reachable_modules(fn: Any) -> list[nn.Module]:
    """The nn.Modules `fn` reaches by name (see the module docstring), each once."""
    owner, func = owner_and_function(fn)
    inner, bound = _unwrap(fn)
    found = [fn, inner, *bound]
    if owner is not None:
        found.append(owner)
        if not isinstance(owner, nn.Module):  # a module's own attributes are its submodules, covered by .modules()
            found.extend(getattr(owner, "__dict__", {}).values())
    found.extend(value for _, _, value in _closure_values(func))
    code, scope = getattr(func, "__code__", None), getattr(func, "__globals__", {})
    if code is not None:
        found.extend(scope[name] for name in code_names(code) if name in scope)
    unique: dict[int, nn.Module] = {}
    for value in found:
        if isinstance(value, nn.Module):
            unique.setdefault(id(value), value)
    return list(unique.values())


def reachable_submodules(fn: Any) -> list[nn.Module]:
    """Every module inside the modules `fn` reaches by name (`reachable_modules`), the roots included."""
    return [module for root in reachable_modules(fn) for module in root.modules()]


def parameter_names(fn: Any, params: list[torch.Tensor]) -> list[str | None]:
    """The name of each of `params` in the modules `fn` reaches by name: the attribute or variable that holds its
    module, then its name there (``policy.pi.weight``; a module `fn` is itself, or its object is: the parameter's name
    in it); None for one not found. For messages that say which parameter went wrong."""
    owner, func = owner_and_function(fn)
    roots: list[tuple[str, Any]] = [("", fn)]
    if owner is not None:
        roots += [("", owner)] if isinstance(owner, nn.Module) else list(getattr(owner, "__dict__", {}).items())
    roots += [(name, value) for name, _, value in _closure_values(func)]
    code = getattr(func, "__code__", None)
    if code is not None:
        scope = getattr(func, "__globals__", {})
        roots += [(name, scope[name]) for name in code_names(code) if name in scope]
    found: dict[int, str] = {}
    for prefix, root in roots:
        if isinstance(root, nn.Module):
            for name, parameter in root.named_parameters():
                found.setdefault(id(parameter), f"{prefix}.{name}" if prefix else name)
        elif isinstance(root, torch.Tensor) and prefix:  # (a parameter of its own: SAC's log_alpha)
            found.setdefault(id(root), prefix)
    return [found.get(id(p)) for p in params]


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Number) and not isinstance(value, torch.Tensor)


def _is_plain_object(value: Any) -> bool:
    """An object whose attributes may hold settings (a schedule, an argparse Namespace, a config), not code,
    a module of code, a network or a tensor."""
    return (hasattr(value, "__dict__") and not isinstance(value, (type, types.ModuleType, types.FunctionType,
                                                                   types.MethodType, nn.Module, torch.Tensor)))


def _named_readers(fn: Any, keep: Callable[[Any], bool]) -> list[Callable[[], Any]]:
    """Readers of the values `fn` reads by name that `keep` accepts: closure cells, the globals its code names, its
    object's attributes (``self.gamma``), and the attributes with a name its code uses of plain objects found there
    or bound by a `functools.partial` (``self.schedule.beta``); each reader reads afresh on every call."""
    owner, func = owner_and_function(fn)
    _, bound = _unwrap(fn)
    code = getattr(func, "__code__", None)
    names = sorted(set(code_names(code))) if code is not None else []
    readers: list[Callable[[], Any]] = []
    holders: list[Any] = [value for value in bound if _is_plain_object(value)]  # whose attributes may be read

    def add_attributes(obj: Any) -> None:
        attributes = obj.__dict__
        readers.extend(lambda name=name: attributes.get(name) for name in names if keep(attributes.get(name)))

    for _, cell, value in _closure_values(func):
        if keep(value):
            readers.append(lambda cell=cell: cell.cell_contents)
        elif _is_plain_object(value):
            holders.append(value)
    scope = getattr(func, "__globals__", {})
    for name in names:
        value = scope.get(name)
        if keep(value):
            readers.append(lambda name=name: scope.get(name))
        elif _is_plain_object(value):
            holders.append(value)
    if owner is not None and hasattr(owner, "__dict__"):
        add_attributes(owner)
        holders += [value for name in names if _is_plain_object(value := owner.__dict__.get(name))]
    seen: set[int] = set()
    for holder in holders:
        if id(holder) not in seen and holder is not owner:
            seen.add(id(holder))
            add_attributes(holder)
    return readers


def named_numbers(fn: Any) -> list[Callable[[], Any]]:
    """Readers of the numbers (int, float, bool) `fn` reads by name (see `_named_readers`)."""
    return _named_readers(fn, _is_number)


def named_tensors_and_modules(fn: Any) -> list[Callable[[], Any]]:
    """Readers of the tensors and modules `fn` reads by name (see `_named_readers`): a graph captured with one must
    notice when the name is bound to another (``self.alpha = log_alpha.exp().detach()`` on every step)."""
    return _named_readers(fn, lambda value: isinstance(value, (torch.Tensor, nn.Module)))


def own_generators(modules: Any) -> list[torch.Generator]:
    """The `torch.Generator` objects `modules` hold as attributes (``self.gen``, a NoisyNet's noise source)."""
    return [value for module in modules for value in module.__dict__.values() if isinstance(value, torch.Generator)]


def generators_in(value: Any) -> list[torch.Generator]:
    """The `torch.Generator` objects in call arguments (nested in tuples, lists and dicts)."""
    if isinstance(value, torch.Generator):
        return [value]
    if isinstance(value, (tuple, list)):
        return [g for item in value for g in generators_in(item)]
    if isinstance(value, dict):
        return [g for item in value.values() for g in generators_in(item)]
    return []


def named_generators(fn: Any) -> list[torch.Generator]:
    """The `torch.Generator` objects `fn` draws from by name (see `_named_readers`), and those held by the modules
    it reaches (`reachable_submodules`): what a search running `fn` many times advances, and puts back."""
    found = [read() for read in _named_readers(fn, lambda value: isinstance(value, torch.Generator))]
    return [*found, *own_generators(reachable_submodules(fn))]


__all__ = ["owner_and_function", "code_names", "reachable_modules", "reachable_submodules", "named_numbers",
           "named_tensors_and_modules", "own_generators", "generators_in", "named_generators"]
