"""A user's env options (`env_kwargs`: values nested in dicts, lists and tuples) walked in one place: the tuples an env
may take only as tuples (highway-env's `observation_shape`) kept through the files that record the options as lists,
a checkpoint's JSON (`tuple_paths`, `with_tuples`) and config.yaml (`rlspeed.yamlfile`). No torch import here: the
CLI and the presets use it before they import torch (which `rlspeed.envs` does)."""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Callable, Mapping
from typing import Any

from rlspeed.errors import UserError, is_bool, is_true_or_false, refuse_past_int64


def rebuild(value: Any, sequence: Callable[[list, tuple, bool], Any], path: tuple = ()) -> Any:
    """`value` with each list and tuple in it, innermost first, replaced by `sequence(items, path, was_tuple)`: its
    items rebuilt so, the keys and indices that lead to it from the top, and whether it was a tuple."""
    if isinstance(value, dict):
        return {key: rebuild(item, sequence, (*path, key)) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        items = [rebuild(item, sequence, (*path, index)) for index, item in enumerate(value)]
        return sequence(items, path, isinstance(value, tuple))
    return value


def _sequences(value: Any) -> list[tuple[list, bool]]:
    """(path, was_tuple) of each list and tuple in `value`, innermost first."""
    found: list[tuple[list, bool]] = []
    rebuild(value, lambda items, path, was_tuple: found.append((list(path), was_tuple)))
    return found


def tuple_paths(value: Any) -> list[list]:
    """The paths (keys and indices) of the tuples in env options, which JSON writes as lists: a checkpoint records
    them beside the options (`env_kwargs_tuples`) so that `with_tuples` gives a loaded model the tuples its env was
    given."""
    return [path for path, was_tuple in _sequences(value) if was_tuple]


def with_tuples(value: Any, paths: list[list] | None) -> Any:
    """Options read from JSON with the lists at `paths` (`tuple_paths`) made tuples again."""
    wanted = {tuple(found) for found in paths or ()}
    return rebuild(value, lambda items, path, was_tuple: tuple(items) if was_tuple or path in wanted else items)


def has_list(value: Any) -> bool:
    """Whether env options hold a list, at any depth."""
    return any(not was_tuple for _, was_tuple in _sequences(value))


def as_keywords(options: Mapping[str, Any]) -> str:
    """`options` as the keyword arguments of a call that gives them (`key='value', size=3`): how messages show the
    options an env was made with."""
    return ", ".join(f"{key}={value!r}" for key, value in options.items())


#: the kinds of value an env's constructor parameter declares (its annotation, else its default's type) that an
#: option given as text, a list or a mapping cannot be: `sutton_barto_reward=maybe` trained CartPole on Sutton and
#: Barto's reward ('maybe' is true), `g=ten` failed in Pendulum's first step
_SCALARS = {bool: "true or false", int: "a whole number", float: "a number"}


def typed_options(env_id: str, creator: Callable, env_kwargs: dict) -> dict:
    """`env_kwargs` with each option that `creator` (the env's entry point) declares a bool or an int (by its
    annotation) given as that kind, as rlspeed's own settings take them: 0 or 1 for a bool as False or True, a whole
    number written as a float for an int (2.0, 1e3) as an int; so too gymnasium.make's `max_episode_steps`. UserError
    in one sentence for an option declared a bool, int or float (by its annotation, else by its default's type, an
    int default counting as a number) that is not one by those rules: text, a list or a mapping for any of them; for
    a bool, a number other than 0 and 1 (`true_or_false`'s rule: `sutton_barto_reward=2` or `0.5` was taken as true);
    for a number, true or false (`g=true` made Pendulum's gravity 1); for an int, a number that is not whole."""
    try:
        parameters = dict(inspect.signature(creator).parameters)
    except (TypeError, ValueError):  # (a creator without a signature Python can read: only gymnasium.make's own)
        parameters = {}
    parameters.setdefault("max_episode_steps", inspect.Parameter("max_episode_steps", inspect.Parameter.KEYWORD_ONLY,
                                                                 annotation=int))
    typed = dict(env_kwargs)
    for name, value in env_kwargs.items():
        parameter = parameters.get(name)
        if parameter is None or value is None:
            continue
        annotation = parameter.annotation
        wanted = next((kind for kind in _SCALARS if annotation in (kind, kind.__name__)), None)
        declared = wanted is not None
        if wanted is None and annotation is inspect.Parameter.empty and parameter.default is not None:
            # (`goal_velocity=0`: a default written as 0 is no promise of whole numbers)
            wanted = next((float if kind is int else kind for kind in _SCALARS if type(parameter.default) is kind),
                          None)
        if wanted is not None and not _of_kind(wanted, value):
            raise UserError(f"Env '{env_id}' takes the option {name} as {_SCALARS[wanted]} ({wanted.__name__}), got "
                            f"{value!r:.60} ({type(value).__name__}).")
        if declared and wanted is not float and isinstance(value, numbers.Real):  # (an annotation's kind, not a
            # default's: an unannotated `size=8` may take 2.5 in another version of the env)
            if wanted is int:
                refuse_past_int64(f"Env '{env_id}' takes the option {name} as a whole number (int)", value)
            typed[name] = wanted(value)
    return typed


def _of_kind(kind: type, value: Any) -> bool:
    """Whether `value` passes for a `kind` (bool, int or float) option: `typed_options`' rule."""
    if isinstance(value, (str, list, tuple, dict)):
        return False
    if kind is bool:
        return is_true_or_false(value)
    if is_bool(value):
        return False
    return (kind is float or not isinstance(value, numbers.Real) or isinstance(value, numbers.Integral)
            or float(value).is_integer())
