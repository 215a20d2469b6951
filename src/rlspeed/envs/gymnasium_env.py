"""Adapter from Gymnasium (any registered id, or a user's Gymnasium vector env) to the batched contract.

This is the only place where numpy meets torch for Gymnasium envs: actions go to the host once per step, and
observations, rewards and flags come back as one tensor each (one per key for Dict and Tuple observations), in the
observation's own dtype (`rlspeed.envs.base`): a uint8 image is copied to the device as uint8, never as float.
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import functools
import inspect
import math
import multiprocessing
import multiprocessing.connection
import numbers
import os
import pickle
import re
import sys
import time
import traceback
import types
import warnings
import weakref
from collections.abc import Callable, Collection, Sequence
from typing import NoReturn

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector.async_vector_env import AsyncState

from rlspeed.device import statistics_dtype
from rlspeed.env_options import has_list
from rlspeed.envs.base import (
    BatchedEnv,
    EnvSpec,
    Observation,
    ResetResult,
    StepResult,
    constructor_parameters,
    integer_range,
    mask_size,
    numpy_dtype,
    observation_layout,
)
from rlspeed.envs.packages import missing_dependency, register_family
from rlspeed.errors import CLOSE_ERRORS, CloseErrors, EnvStepError, UserError, warn_at_caller
from rlspeed.lifetime import stops_kept_while_forking

#: The env ids of a model trained on a vector env the user built, which rlspeed cannot rebuild from an id
USER_VECTOR_ENV, USER_SB3_VEC_ENV = "user-vector-env", "user-sb3-vec-env"


def gym_spec(env_id: str) -> gym.envs.registration.EnvSpec:
    """Gymnasium's registry entry for an id; UserError naming close ids when it does not exist (and saying what to
    pass instead for the id of a user's own vector env)."""
    if env_id in (USER_VECTOR_ENV, USER_SB3_VEC_ENV):
        raise UserError(f"'{env_id}' stands for the vector env this model was trained on, which you built and "
                        "rlspeed cannot rebuild from an id: pass an env built the same way where one is needed, e.g. "
                        "rlspeed.evaluate(model, env, episodes=env.num_envs) with a separate instance, or "
                        "Algorithm.load(path, env=env) to train on.")
    register_family(env_id)
    try:
        return gym.spec(env_id)
    except Exception:
        close = close_env_ids(env_id, gym.registry)
        ram = re.fullmatch(r"(ALE/[A-Za-z]+)-ram(-v\d+)", env_id)  # (ale-py 0.9+ registers no -ram v5 ids)
        if ram and ram.group(1) + ram.group(2) in gym.registry:
            raise UserError(f"Unknown env id '{env_id}': ale-py gives the RAM of {ram.group(1)}{ram.group(2)} with the "
                            f"env option obs_type=\"ram\" (make_env(..., obs_type=\"ram\"), env_kwargs={{\"obs_type\": "
                            "\"ram\"}, or --env-kwargs obs_type=ram).") from None
        old_gym = old_gym_registered(env_id)
        if old_gym:
            raise UserError(old_gym) from None
        hint = (f" Did you mean {', '.join(close)}?" if close else "") + (
            " If a package registers it, import that package first, or name it in the id (`MODULE:EnvId`; the CLI "
            "also takes `--gym-packages MODULE`); `python -c \"import gymnasium; print(list(gymnasium.registry))\"` "
            "lists the registered ids.")
        raise UserError(f"Unknown env id '{env_id}'.{hint}") from None


def _env_name(env_id: str) -> str:
    """The name part of an env id, without its namespace, version and case: "ALE/Pong-v5" -> "pong"."""
    return re.sub(r"-v\d+$", "", env_id.rpartition(":")[2].rpartition("/")[2]).lower()


def close_env_ids(env_id: str, ids: Collection[str]) -> list[str]:
    """Up to three of `ids` for an unknown `env_id`, closest first: those whose name part (`_env_name`) is spelled
    nearly as its own (a misspelling, another case, another version or namespace), none where no name is (an id of
    the user's own env that no package registered: letters shared with another name are no advice)."""
    name = _env_name(env_id)
    named_alike = [other for other in ids
                   if difflib.SequenceMatcher(None, name, _env_name(other)).ratio() >= 0.75]
    return difflib.get_close_matches(env_id, named_alike, n=3, cutoff=0.0)


def old_gym_registered(env_id: str) -> str | None:
    """One sentence where `env_id`, unknown to Gymnasium, is registered with the old gym package (which a script or its
    `module:EnvId` module imported, or Stable-Baselines3, which imports gym where it is installed: rlspeed never
    imports it), by other code than gym's own envs, naming Shimmy's id that makes it a Gymnasium env and the options
    it needs; else None."""
    old = sys.modules.get("gym")
    registry = getattr(getattr(old, "envs", None), "registry", None)
    specs = getattr(registry, "env_specs", registry)  # (gym below 0.26 keeps its specs in registry.env_specs)
    try:
        if not isinstance(specs, dict) or env_id not in specs:
            return None
        entry_point = getattr(specs[env_id], "entry_point", None)
    except Exception:  # noqa: BLE001 (a module named gym that is no gym: nothing to say)
        return None
    if isinstance(entry_point, str) and entry_point.startswith("gym.envs."):
        return None  # (gym's own envs, LunarLander-v2: Gymnasium has their successors, which the unknown id names)
    version = str(getattr(old, "__version__", ""))
    numbers = tuple(int(part) for part in re.findall(r"\d+", version)[:2])
    if numbers and numbers < (0, 26):  # (gym.make gives its envs in the old API, which Shimmy's V21 adapter converts)
        return (f"'{env_id}' is registered with the old gym package (gym {version}), not with Gymnasium: Shimmy's "
                f"GymV21Environment-v0 makes it a Gymnasium env, that id with env_kwargs={{'env_id': '{env_id}'}} "
                "(pip install shimmy; --env-kwargs env_id=... on the command line).")
    checker = int(np.__version__.split(".")[0]) >= 2  # (gym 0.26's env checker uses np.bool8, gone in numpy 2)
    make_kwargs = ", 'make_kwargs': {'disable_env_checker': True}" if checker else ""
    why = "; gym 0.26 checks envs with np.bool8, which numpy 2 lacks" if checker else ""
    return (f"'{env_id}' is registered with the old gym package (gym {version or '0.26'}), not with Gymnasium: "
            f"Shimmy's GymV26Environment-v0 makes it a Gymnasium env, that id with env_kwargs={{'env_id': "
            f"'{env_id}'{make_kwargs}}} (pip install shimmy{why}), and 'apply_api_compatibility': True in its "
            "make_kwargs for an env whose step returns (obs, reward, done, info).")


_NO_ROWS = np.empty(0, dtype=np.int64)  # info["final_rows"] of a step where no env finished


def _to_numpy_actions(actions: torch.Tensor, space: gym.Space) -> np.ndarray:
    # (a CPU tensor outside autograd is read in place: .detach().cpu() would be two more dispatches per step)
    array = (actions.numpy() if actions.device.type == "cpu" and not actions.requires_grad
             else actions.detach().cpu().numpy())
    if isinstance(space, gym.spaces.Discrete):
        return array.astype(np.int64).reshape(-1)
    if isinstance(space, gym.spaces.Box):
        array = array.astype(space.dtype).reshape((-1,) + space.shape)
        if space.dtype != np.float32:
            # clipped in the space's dtype: float32 actions clipped to float32 bounds can lie just outside float64
            # ones (the policies clip or clamp float32 actions to a float32 Box's bounds themselves)
            np.clip(array, space.low, space.high, out=array)
        return array
    if isinstance(space, (gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)):
        return array.astype(space.dtype).reshape((-1,) + space.shape)
    return array


# --- action masks ------------------------------------------------------------------------------------------------
def check_action_masks(masks, space: gym.Space, num: int, source: str, terminal: bool = False) -> np.ndarray:
    """A batch of action masks as a bool array `[num, mask_size(space)]`, or UserError in one sentence naming the
    mask and the fix: a mask of another shape, a space that takes no mask, or a row that allows no action (which
    would leave the policy nothing to choose: checked here, on the host, where the mask arrives). MultiDiscrete masks
    may also come as one flag sequence per component. `terminal`: the masks of episodes' last observations, where
    no choice is made: a row that allows no action (in some component) allows all instead."""
    width = mask_size(space)
    if width is None:
        raise UserError(f"The action mask from {source} is for a {type(space).__name__} action space; masks apply to "
                        "Discrete and MultiDiscrete actions only: " + ("leave action_masks out." if
                                                                       source.startswith("predict") else
                                                                       "drop the mask (use_masking=false)."))
    if isinstance(space, gym.spaces.MultiDiscrete) and isinstance(masks, (list, tuple)):
        masks = _joined_components(masks, space.nvec.reshape(-1), num)
    try:
        array = np.asarray(masks)
        if array.dtype == object:
            array = np.stack([np.asarray(row) for row in masks])
        # (flat, or rows split further, [1, N, n] or a MultiDiscrete's [N, k, m]: each row's flags stay together; a
        # transposed [n, N] holds as many flags, and its reshape would give each row other rows' flags)
        if array.size == num * width and (array.ndim <= 1 or num in np.cumprod((1, *array.shape))):
            array = array.reshape(num, -1)
    except (ValueError, TypeError) as error:
        raise UserError(f"The action mask from {source} cannot be read as an array ({error}); give one bool flag "
                        f"per action, shape [{num}, {width}].") from None
    if array.shape != (num, width):
        raise UserError(f"The action mask from {source} has shape {list(array.shape)}, but {space} needs "
                        f"[{num}, {width}] (one flag per action" + (
                            f", the components' masks concatenated, or one sequence per component of sizes "
                            f"{space.nvec.reshape(-1).tolist()}" if isinstance(space, gym.spaces.MultiDiscrete)
                            else "")
                        + ("): give one flag per action for each observation." if source.startswith("predict")
                           else "): fix the env's action_mask / action_masks()."))
    if array.dtype != bool:
        odd = ~((array == 0) | (array == 1))
        if odd.any():
            value = array[odd].flat[0]
            value = value.item() if isinstance(value, np.generic) else value
            raise UserError(f"The action mask from {source} holds {value!r}, where a mask holds only bools or 0 and 1 "
                            "(True or 1: allowed): " + ("give" if source.startswith("predict") else
                                                                   "make the env give")
                            + " 0 and 1 (an additive mask of 0 and -inf would read the other way round).")
    allowed = array.astype(bool)
    if isinstance(space, gym.spaces.MultiDiscrete):
        starts = np.concatenate(([0], np.cumsum(space.nvec.reshape(-1))[:-1]))
        empty = ~np.logical_or.reduceat(allowed, starts, axis=1).all(axis=1)
    else:
        empty = ~allowed.any(axis=1)
    if empty.any() and terminal:
        allowed[empty] = True
    elif empty.any():
        all_rows = np.flatnonzero(empty)
        rows = all_rows[:5].tolist()
        more = f" and {len(all_rows) - 5} more" if len(all_rows) > 5 else ""
        raise UserError(f"The action mask from {source} allows no action in row{'s' if len(rows) > 1 else ''} {rows}"
                        f"{more}"
                        + (" (in some component)" if isinstance(space, gym.spaces.MultiDiscrete) else "")
                        + ": every row needs at least one allowed action; " + (
                            "allow one for each observation." if source.startswith("predict") else
                            "fix the env's mask, or end the episode where no action is valid."))
    return allowed


def _joined_components(masks: list | tuple, nvec: np.ndarray, num: int) -> list | tuple | np.ndarray:
    """MultiDiscrete masks given as one flag sequence per component (sizes `nvec`), for one observation or for each
    of `num`, with each observation's components concatenated; other masks as they are."""
    def joined(row):
        if isinstance(row, (list, tuple)) and len(row) == len(nvec) and all(
                np.ndim(part) == 1 and len(part) == size for part, size in zip(row, nvec)):
            return np.concatenate([np.asarray(part, dtype=bool) for part in row])
        return None

    one = joined(masks) if num == 1 else None
    if one is not None:
        return one[None]
    rows = [joined(row) for row in masks] if len(masks) == num else []
    return np.stack(rows) if rows and all(row is not None for row in rows) else masks


def masks_missing(info: dict, env_id: str, call: str, none_rows: Collection[int] = ()) -> None:
    """UserError naming the envs that gave no `action_mask` (or None) in a vector env's merged `info` of a `call`
    ("reset", "step") where others gave one: Gymnasium's merging fills their rows with zeros, masks that allow no
    action. `none_rows`: the envs whose mask was None where the merging wrote it into another env's array (as
    False: `_NoneMasks`)."""
    values, given = info["action_mask"], info.get("_action_mask")
    # (numpy over the rows: this runs at every step of a masked env; the per-row look only for None values)
    missing = np.zeros(len(values), dtype=bool) if given is None else ~np.asarray(given, dtype=bool)
    if isinstance(values, np.ndarray) and values.dtype == object:
        missing |= np.fromiter((value is None for value in values), dtype=bool, count=len(values))
    if none_rows:
        missing[list(none_rows)] = True
    if missing.any():
        rows = np.flatnonzero(missing).tolist()
        raise UserError(f"{env_id} gave no info['action_mask'] on this {call} for env{'s' if len(rows) > 1 else ''} "
                        f"{rows[:5]}{f' and {len(rows) - 5} more' if len(rows) > 5 else ''}, though it gives masks: "
                        "give it on every step and reset, or pass use_masking=false.")


class _NoneMasks:
    """Gymnasium's info merging of a vector env (`_add_info`) with the envs whose top-level `info["action_mask"]` was
    None noted in `rows`: merged into the array another env's mask began, a None is a row of False, a mask that
    allows no action, where it is a missing mask (`masks_missing`). Installed on the vector env itself, in place of
    its method: Gymnasium calls it from its own reset and step. It holds the vector env weakly (a method of it as the
    function and a weak reference): held strongly from the env's own attribute, the cycle would leave an env dropped
    without `close` to the garbage collector, which closes subprocess envs' pipes before the env's own `close` runs
    (it then fails, "Bad file descriptor", and leaves its workers unreaped)."""

    def __init__(self, merge) -> None:
        self._function, self._env = merge, None
        if isinstance(merge, types.MethodType):
            self._function, self._env = merge.__func__, weakref.ref(merge.__self__)
        self.rows, self._depth = set(), 0

    def __call__(self, vector_infos: dict, env_info: dict, env_num: int) -> dict:
        if not self._depth and "action_mask" in env_info and env_info["action_mask"] is None:
            self.rows.add(env_num)
        self._depth += 1  # (nested infos, final_info's: a last observation's mask is no choice)
        try:
            if self._env is None:
                return self._function(vector_infos, env_info, env_num)
            return self._function(self._env(), vector_infos, env_info, env_num)
        finally:
            self._depth -= 1

    def __deepcopy__(self, memo: dict) -> _NoneMasks:
        """A copy for the copy of the vector env (made first where the env is being copied: the memo holds it)."""
        new = copy.copy(self)
        new.rows = set(self.rows)
        if self._env is not None:
            new._env = weakref.ref(copy.deepcopy(self._env(), memo))
        return new

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_env": None if self._env is None else self._env()}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if self._env is not None:
            self._env = weakref.ref(self._env)

    def taken(self) -> set[int]:
        """The rows noted since the last call, and none noted from now on."""
        rows, self.rows = self.rows, set()
        return rows

    def remove_from(self, env) -> None:
        """Give `env` its own merging again, where this one is in its place (its class's method: no bound method of
        the env kept on the env itself, the cycle this class avoids)."""
        if env.__dict__.get("_add_info") is not self:
            return
        del env._add_info
        if self._env is None:
            env._add_info = self._function
        elif getattr(type(env), "_add_info", None) is not self._function:  # (another method put there before)
            env._add_info = types.MethodType(self._function, env)


def final_action_masks(step_masks: torch.Tensor, final_masks: dict, space: gym.Space, source: str) -> torch.Tensor:
    """`info["final_action_mask"]`: the actions allowed at each row's `final_obs`: the step's masks (bool `[N, n]`)
    with each finished row's replaced by the mask its env gave with its last observation (`final_masks`: row ->
    mask, before the autoreset). A last observation that allows no action (a terminal state) allows all instead:
    its mask is not a choice the policy makes."""
    if not final_masks:
        return step_masks
    rows = list(final_masks)
    array = check_action_masks(list(final_masks.values()), space, len(rows), source, terminal=True)
    masks = step_masks.clone()
    masks[torch.as_tensor(rows, device=masks.device)] = torch.as_tensor(array, device=masks.device)
    return masks


_NO_SUCCESS: dict[tuple[int, torch.device], torch.Tensor] = {}  # (N, device) -> all-False flags, made once

#: the keys of an env's step info that say whether its episode reached its goal, the first present taken: SB3's (and
#: Gymnasium-Robotics' Fetch and Shadow Hand envs'), then Gymnasium-Robotics' PointMaze and AntMaze envs'
SUCCESS_KEYS = ("is_success", "success")


def success_key(info) -> str | None:
    """Which of `SUCCESS_KEYS` an env's step info (or a vector env's `final_info`) gives its success under, the first
    present; None where it gives neither. Every adapter reads an env's success through it, one rule for all."""
    return next((key for key in SUCCESS_KEYS if key in info), None)


def success_flag(value, key: str = "is_success") -> bool:
    """An env's success flag (`info[key]`) as a bool: a bool or a 0/1 number; anything else (a text, 0.7: `bool()` would
    count it a success) is one sentence naming the key."""
    array = np.asarray(value)
    if array.size != 1 or array.item() not in (True, False):
        raise UserError(f"An env's info[{key!r}] is {value!r}: it must be a bool (True where the episode reached its "
                        "goal), as Gymnasium's goal envs and Stable-Baselines3 read it"
                        + (" (rlspeed reads 'success' where an env gives no 'is_success')." if key != "is_success"
                           else "."))
    return bool(array.item())


def success_flags(successes: dict[int, bool], num_envs: int, device: torch.device) -> torch.Tensor:
    """`info["is_success"]`: bool `[N]`, True for the finished rows whose env's last info said it succeeded
    (`success_flag`; a goal env's convention, SB3's `success_rate`), False elsewhere (read only where `info["done"]`).
    A step where no row finished gets one shared all-False tensor (no copy to the device; callers never write into
    it)."""
    if not successes:
        key = (num_envs, torch.device(device))
        if key not in _NO_SUCCESS:
            _NO_SUCCESS[key] = torch.zeros(num_envs, dtype=torch.bool, device=device)
        return _NO_SUCCESS[key]
    flags = np.zeros(num_envs, dtype=bool)
    for row, success in successes.items():
        flags[row] = success
    return host_to(flags, device)


def check_vector_api(vector_env) -> None:
    """UserError where a `gymnasium.vector.VectorEnv` subclass lacks Gymnasium 1.x's vector API that rlspeed reads
    (`single_observation_space`, `single_action_space`): SuperSuit's `concat_vec_envs_v1(..., base_class="gymnasium")`
    is one, whose `observation_space` is one agent's and whose infos are a list of dicts."""
    missing = [name for name in ("single_observation_space", "single_action_space") if not hasattr(vector_env, name)]
    if missing:
        name = type(vector_env).__name__
        hint = (" (SuperSuit's concat_vec_envs_v1 gives one with base_class=\"stable_baselines3\")"
                if type(vector_env).__module__.startswith("supersuit") else "")
        raise UserError(f"This vector env ({name}) has no {missing[0]}: it is not a Gymnasium 1.x vector env, whose "
                        "single env's spaces and step infos rlspeed reads; give one that is, or a Stable-Baselines3 "
                        f"VecEnv{hint}.")


def autoreset_mode(vector_env):
    """How a Gymnasium vector env resets finished envs: the mode Gymnasium's SyncVectorEnv or AsyncVectorEnv (under
    any wrappers) was made with, else its metadata's "autoreset_mode" (None where it has none). Not the metadata
    first: Gymnasium before 1.4 writes the mode into the metadata dict of the env class it vectorises, which every
    vector env of that env shares, so a NEXT_STEP env read as SAME_STEP once a SAME_STEP one (rlspeed's own) was
    made after it."""
    inner = getattr(vector_env, "unwrapped", vector_env)
    mode = getattr(inner, "autoreset_mode", None)
    if isinstance(inner, (gym.vector.SyncVectorEnv, gym.vector.AsyncVectorEnv)) and mode is not None:
        return mode
    return (getattr(vector_env, "metadata", None) or {}).get("autoreset_mode")


def check_same_step(vector_env, who: str = "Pass a Gymnasium vector env") -> None:
    """UserError unless a Gymnasium vector env resets finished envs in the same step (`who`: the sentence's start)."""
    mode = autoreset_mode(vector_env)
    if mode is None:  # (Gymnasium takes a vector env that does not say for NEXT_STEP, its default)
        raise UserError(f"{who} made with autoreset_mode=AutoresetMode.SAME_STEP; this one ("
                        f"{type(vector_env).__name__}) does not say how it resets finished envs (its metadata has no "
                        "'autoreset_mode'): reset them within step() and give their last observation as "
                        "info['final_obs'], and set metadata['autoreset_mode'] = "
                        "gymnasium.vector.AutoresetMode.SAME_STEP.")
    if mode != gym.vector.AutoresetMode.SAME_STEP and _observation_wrappers(vector_env):
        # (the fix below alone would end in Gymnasium's own refusal of SAME_STEP by the wrapper)
        names = _observation_wrappers(vector_env)
        instead = (", or pass normalize_obs=True to the model in place of NormalizeObservation"
                   if "NormalizeObservation" in names else "")
        raise UserError(f"{who} made with autoreset_mode=AutoresetMode.SAME_STEP (this one uses {mode}), which "
                        f"Gymnasium's vector observation wrappers ({', '.join(names)}) refuse: make it with "
                        "vector_kwargs={'autoreset_mode': gymnasium.vector.AutoresetMode.SAME_STEP} and give the "
                        f"wrapper to each env instead, gymnasium.make_vec(id, n, vectorization_mode='sync', "
                        f"vector_kwargs=..., wrappers=[gymnasium.wrappers.{names[0]}]){instead}.")
    if mode != gym.vector.AutoresetMode.SAME_STEP:
        # (the constructor's form too: an env class of the caller's that no id names has no make_vec)
        raise UserError(f"{who} made with autoreset_mode=AutoresetMode.SAME_STEP (this one uses {mode}): "
                        "gymnasium.vector.SyncVectorEnv(env_fns, autoreset_mode=gymnasium.vector.AutoresetMode."
                        "SAME_STEP) (or AsyncVectorEnv), or from a registered id gymnasium.make_vec(id, n, "
                        "vectorization_mode='sync', vector_kwargs={'autoreset_mode': "
                        "gymnasium.vector.AutoresetMode.SAME_STEP}) (or 'async').")


def _observation_wrappers(vector_env) -> list[str]:
    """The class names of the Gymnasium vector observation wrappers (`gymnasium.wrappers.vector.NormalizeObservation`,
    `FlattenObservation`, ...: subclasses of `VectorObservationWrapper`, which take no SAME_STEP autoreset) around a
    vector env, outermost first."""
    names, env = [], vector_env
    while isinstance(env, gym.vector.VectorWrapper):
        if isinstance(env, gym.vector.VectorObservationWrapper):
            names.append(type(env).__name__)
        env = env.env
    return names


def add_success(adapter, out_info: dict, successes: dict) -> None:
    """`info["is_success"]` (`success_flags`) on an adapter's step info, on every step once one of its finished
    episodes has reported its success (`adapter.reports_success`; under either of `SUCCESS_KEYS`): rows whose env said
    nothing read False."""
    if successes:
        adapter.reports_success = True
    if adapter.reports_success:
        out_info["is_success"] = success_flags(successes, adapter.num_envs, adapter.device)


class _WarnedOnce:
    """Which envs a warning has been said of: once per registered id in a process, once per env for a user's own
    vector env (`USER_VECTOR_ENV`, `USER_SB3_VEC_ENV`: every one shares its placeholder id, so keyed by the env
    object, held weakly; one that takes no weak reference is warned of each time)."""

    def __init__(self):
        self.ids: set[str] = set()
        self.envs: weakref.WeakSet = weakref.WeakSet()

    def _entry(self, env_id: str, env) -> tuple:
        if env_id in (USER_VECTOR_ENV, USER_SB3_VEC_ENV) and env is not None:
            return self.envs, env
        return self.ids, env_id

    def said(self, env_id: str, env) -> bool:
        """Whether the warning was said of `env_id`'s `env`."""
        store, key = self._entry(env_id, env)
        with contextlib.suppress(TypeError):
            return key in store
        return False

    def mark(self, env_id: str, env) -> None:
        """Mark the warning said of `env_id`'s `env`."""
        store, key = self._entry(env_id, env)
        with contextlib.suppress(TypeError):
            store.add(key)

    def first(self, env_id: str, env) -> bool:
        """Whether the warning is to be said now (then marked said)."""
        if self.said(env_id, env):
            return False
        self.mark(env_id, env)
        return True


_WARNED_MASKS = _WarnedOnce()
_WARNED_STEP_MASKS = _WarnedOnce()  # (`warn_step_only_masks`)


def warn_unapplied_masks(spec: EnvSpec, adapter=None) -> None:
    """Warn once per env id (once per `adapter` of a user's vector env) that its action masks are not applied:
    rlspeed masks Discrete and MultiDiscrete actions only (sb3-contrib's MaskablePPO also MultiBinary ones), so
    training and evaluation choose among all actions."""
    if not _WARNED_MASKS.first(spec.env_id, adapter):
        return
    warnings.warn(f"{spec.env_id} gives action masks for its {type(spec.action_space).__name__} actions, which rlspeed "
                  "does not apply (it masks Discrete and MultiDiscrete actions): every action stays allowed.",
                  stacklevel=3)


def warn_step_only_masks(spec: EnvSpec, adapter=None) -> None:
    """Warn once per env id (once per `adapter` of a user's vector env) that the action masks its steps' infos give
    are not applied, its reset's info having none: rlspeed learns at reset that an env gives masks (the first
    observation's mask is needed too)."""
    if not _WARNED_STEP_MASKS.first(spec.env_id, adapter):
        return
    warnings.warn(f"{spec.env_id} gives info['action_mask'] on its steps but not at reset, which is where rlspeed "
                  "learns that an env gives masks: they are not applied (every action stays allowed); give the mask "
                  "in reset's info too.", stacklevel=2)


_WARNED_UNSEEDED = _WarnedOnce()  # (`warn_unseeded_reset`)


def recorded_seed(env) -> int | None:
    """The seed Gymnasium records for the Gymnasium env `env`'s `np_random` (its `_np_random_seed`, read without
    making a generator): None where it has none yet, -1 where it was set directly (`warn_unseeded_reset`)."""
    return getattr(getattr(env, "unwrapped", env), "_np_random_seed", None)


def warn_unseeded_reset(env_id: str, seen: int | None, seed: int, adapter=None) -> None:
    """Warn once per env id (once per `adapter` of a user's vector env) where a Gymnasium env has just returned from
    `reset(seed=seed)` with its `np_random` seeded otherwise, `seen` (`recorded_seed`, read in the env's process):
    from before (its reset does not pass the seed to `super().reset(seed=seed)`), so its draws differ from run to
    run. Read at a reset rlspeed does anyway: an env that keeps a generator of its own, none, or one it set itself
    (recorded as -1) is not told."""
    if seen is None or seen in (-1, seed) or not _WARNED_UNSEEDED.first(env_id, adapter):
        return
    warnings.warn(f"'{env_id}'.reset(seed=...) did not seed the env's np_random with the seed it was given (it is "
                  "seeded from elsewhere): pass the seed on, super().reset(seed=seed), or its random draws differ "
                  "from run to run and runs with the same seed are not reproducible.", UserWarning, stacklevel=3)


def _has_mask_method(env) -> bool:
    """Whether a Gymnasium env (through its wrappers) has sb3-contrib's `action_masks()` method."""
    try:
        return callable(env.get_wrapper_attr("action_masks"))
    except AttributeError:
        return False


# Keys gym.make_vec adds to a vector env's spec kwargs (and render_mode, which SB3's make_vec_env sets, and
# disable_env_checker, which only skips Gymnasium's checks), and wrappers that only record or show the episodes
# (statistics, videos, a window): none of them changes an observation, reward or time limit
_VECTOR_KEYS = ("num_envs", "vectorization_mode", "vector_kwargs", "wrappers", "render_mode", "disable_env_checker")
_RECORDING_WRAPPERS = ("Monitor", "RecordEpisodeStatistics", "RecordVideo", "HumanRendering")


def is_registered_env(spec) -> bool:
    """Whether `spec` describes its id's registered env as registered: the same kwargs and time limit, and no
    wrappers beyond recording ones. Only then does `make_env(spec.id)` rebuild the same env, as evaluation and a
    training target do; a user's variant (`max_episode_steps=20`, `g=0.0`, a reward wrapper) does not qualify."""
    try:
        registered = gym.spec(spec.id)
    except Exception:
        return False
    kwargs = dict(getattr(spec, "kwargs", None) or {})
    # (gym.make_vec's `wrappers=`: only recording wrapper classes keep the env as registered)
    # (a functools.partial names its class: partial(RecordVideo, video_folder=...), as RecordVideo needs its folder)
    if any(getattr(wrapper.func if isinstance(wrapper, functools.partial) else wrapper, "__name__", None)
           not in _RECORDING_WRAPPERS for wrapper in kwargs.get("wrappers") or ()):
        return False
    kwargs = {key: value for key, value in kwargs.items() if key not in _VECTOR_KEYS}
    wrappers = [w.name for w in getattr(spec, "additional_wrappers", ()) or ()]
    return (kwargs == dict(registered.kwargs or {}) and spec.max_episode_steps == registered.max_episode_steps
            and all(name in _RECORDING_WRAPPERS for name in wrappers))


def single_env_id(env) -> str | None:
    """The registered id that makes the single Gymnasium env `env` again, for a refusal's advice to give the id
    instead: only where `env` is that env unchanged (no wrapper, option or time limit of its own, which the id would
    drop) and renders nothing (a window the user watches, frames a RecordVideo films: the id's env shows none)."""
    spec = getattr(env, "spec", None)
    if (isinstance(getattr(spec, "id", None), str) and is_registered_env(spec)
            and getattr(env, "render_mode", None) is None):
        return spec.id
    return None


#: vector-level wrappers that only record or show (Gymnasium's vector RecordEpisodeStatistics, RecordVideo and
#: HumanRendering, SB3's VecMonitor and VecVideoRecorder)
_RECORDING_VECTOR_WRAPPERS = ("RecordEpisodeStatistics", "RecordVideo", "HumanRendering", "VecMonitor",
                              "VecVideoRecorder")


def vector_wrappers(vector_env) -> list[str]:
    """The class names of the wrappers around a user's vector env, outermost first: Gymnasium's `VectorWrapper`s
    (`.env`) and Stable-Baselines3's `VecEnvWrapper`s (`.venv`: VecNormalize, VecFrameStack, ...)."""
    names, inner = [], vector_env
    while True:
        if isinstance(inner, gym.vector.VectorWrapper):
            names.append(type(inner).__name__)
            inner = inner.env
        elif hasattr(inner, "venv") and inner is not inner.venv:  # (SB3's VecEnvWrapper)
            names.append(type(inner).__name__)
            inner = inner.venv
        else:
            return names


#: the entry point of ale-py's Atari games
ALE_ENTRY_POINT = "ale_py.env:AtariEnv"


def is_atari_image_spec(spec: gym.envs.registration.EnvSpec) -> bool:
    """Whether `spec` is an Atari game (ale-py's) with image observations (not its RAM): the envs `make_env` makes
    preprocessed, as frame stacks (`rlspeed.envs.atari`)."""
    return spec.entry_point == ALE_ENTRY_POINT and (spec.kwargs or {}).get("obs_type", "rgb") in ("rgb", "grayscale")


def registered_vector_env_id(vector_env) -> str | None:
    """The registered id a user's vector env is, where `make_env(id)` rebuilds the same env (as evaluation and a
    training target do): its envs' spec is the registered env's (`is_registered_env`) and no wrapper around the vector
    env changes what it gives (recording ones only); else None (the user's own env or a variant). An Atari game's
    raw frames are never its id's env: `make_env` makes that id's envs preprocessed (frame stacks)."""
    spec = _vector_env_spec(vector_env)
    if spec is None or not is_registered_env(spec) or is_atari_image_spec(spec):
        return None
    if any(name not in _RECORDING_VECTOR_WRAPPERS for name in vector_wrappers(vector_env)):
        return None
    return spec.id


def _vector_env_spec(vector_env) -> gym.envs.registration.EnvSpec | None:
    """The spec of a user's vector env (Gymnasium's or Stable-Baselines3's): its own, else its first env's (None
    when neither has one).

    `gym.make_vec` sets the vector env's spec; a SyncVectorEnv or AsyncVectorEnv built directly (and an SB3 VecEnv)
    has none, but its envs made with `gym.make` do, with the id and time limit that evaluation and the target need.
    """
    spec = getattr(vector_env, "spec", None)
    if spec is not None:
        return spec
    specs = _env_specs(vector_env)
    return specs[0] if specs else None


#: Gymnasium's wrappers whose spec keeps a function among their arguments (`TransformReward(env, lambda r: ...)`,
#: `RecordVideo`'s triggers), which a subprocess env cannot send back where it is a lambda
_FUNCTION_ARGUMENTS = ("TransformObservation", "TransformReward", "TransformAction", "RecordVideo")


#: what the envs inside a subprocess vector env answered (`_worker_answer`), by that vector env: their wrappers' names
#: and their specs are asked of its workers once per vector env made (each ask is a round trip to every worker), as a
#: worker's wrappers stay as they were made and Gymnasium's wrappers keep the spec they first gave; an ask that raised
#: is kept too (a worker that raised has stopped: Gymnasium shuts it down, SB3's ends)
_WORKER_ANSWERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

#: the questions whose answers are kept (`_WORKER_ANSWERS`); others (a TimeLimit's `_max_episode_steps`, which
#: `set_attr` changes) are asked each time
_KEPT_ANSWERS = ("__str__", "spec")
_FAILED_ASK = ""  # (`_WORKER_ANSWERS`' key of an ask that raised: no attribute's name)


def _subprocess_env(vector_env):
    """The Gymnasium `AsyncVectorEnv` or Stable-Baselines3 `SubprocVecEnv` that `vector_env` is or wraps, else None."""
    inner = getattr(vector_env, "unwrapped", vector_env)
    if isinstance(inner, gym.vector.AsyncVectorEnv):
        return inner
    if hasattr(inner, "remotes") and callable(getattr(inner, "env_method", None)):  # (SB3's SubprocVecEnv)
        return inner
    return None


def _worker_answer(inner, name: str) -> list:
    """Each env's `str()` (`name` "__str__") or attribute `name`, inside subprocess vector env `inner`
    (`_subprocess_env`): `_KEPT_ANSWERS` asked of its workers once per vector env (`_WORKER_ANSWERS`). What an ask
    raises is raised, then and at every later ask without asking again (the workers that raised have stopped). A
    vector env that cannot key a `WeakKeyDictionary` (one whose class defines `__eq__` without `__hash__`, or has no
    `__weakref__` slot) is asked every time."""
    try:
        answers = _WORKER_ANSWERS.setdefault(inner, {})
    except TypeError:  # (unhashable, or not weakly referenceable)
        answers = {}
    failed = answers.get(_FAILED_ASK)
    if failed is not None:
        raise failed[1]
    if name not in answers:
        try:
            if name == "__str__":
                answer = (inner.call if isinstance(inner, gym.vector.AsyncVectorEnv) else inner.env_method)(name)
            else:
                answer = inner.get_attr(name)
        except (gym.error.ClosedEnvironmentError, gym.error.AlreadyPendingCallError):
            raise  # (refused before asking: nothing reached the workers)
        except Exception as error:
            answers[_FAILED_ASK] = (name, error)
            raise
        if name not in _KEPT_ANSWERS:
            return list(answer)
        answers[name] = list(answer)
    return list(answers[name])


def failed_worker_ask(vector_env) -> tuple[str, Exception] | None:
    """(the question, what it raised) where a question `_worker_answer` asked of `vector_env`'s subprocess envs (or
    those it wraps) raised, which stopped the workers that raised; else None."""
    inner = _subprocess_env(vector_env)
    try:
        return None if inner is None else _WORKER_ANSWERS.get(inner, {}).get(_FAILED_ASK)
    except TypeError:  # (`_worker_answer`'s vector envs that cannot be keys)
        return None


def refuse_failed_asks(vector_env) -> None:
    """UserError where a question asked of the subprocess envs of a user's vector env (`_worker_answer`) raised: the
    workers that raised have stopped (Gymnasium shuts them down, SB3's end), so the envs cannot step."""
    failed = failed_worker_ask(vector_env)
    if failed is None:
        return
    name, error = failed
    what = {"__str__": "its str(), which names its wrappers"}.get(name, f"its {name}")
    told = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    raise UserError(f"The env subprocesses of this vector env stopped when each env was asked for {what} ({told}), "
                    "and they cannot step now: make the envs answer it and pass a new vector env.") from None


def _subprocess_chains(vector_env) -> list[str] | None:
    """Each subprocess env's `str()` (`"<ClipReward<TimeLimit<...<CartPoleEnv<CartPole-v1>>>>"`: its wrappers'
    names) where `vector_env` is (or wraps) a Gymnasium `AsyncVectorEnv` or a Stable-Baselines3 `SubprocVecEnv`,
    else None; an empty list where they cannot answer."""
    inner = _subprocess_env(vector_env)
    if inner is None:
        return None
    try:
        return [str(text) for text in _worker_answer(inner, "__str__")]
    except Exception:  # (envs that cannot answer)
        return []


def _env_specs(vector_env) -> list[gym.envs.registration.EnvSpec] | None:
    """The specs of the envs inside a vector env (asked of the innermost one: Gymnasium's vector wrappers have no
    `get_attr`), None where they have none or cannot send them: subprocess envs whose wrappers keep a function
    (`_FUNCTION_ARGUMENTS`), or made with options that do not pickle, are not asked, as a lambda in a spec fails to
    pickle and Gymnasium then shuts every worker down."""
    chains = _subprocess_chains(vector_env)
    options = {key: value for key, value in (getattr(getattr(vector_env, "spec", None), "kwargs", None) or {}).items()
               if key not in _VECTOR_KEYS}  # (gym.make_vec's own: its wrappers stay in this process)
    if chains is not None and (not chains or _unpicklable_options(options)
                               or any(f"<{name}<" in chain for chain in chains for name in _FUNCTION_ARGUMENTS)):
        return None
    try:
        specs = (_worker_answer(_subprocess_env(vector_env), "spec") if chains is not None
                 else getattr(vector_env, "unwrapped", vector_env).get_attr("spec"))
    except Exception:  # a custom vector env without `get_attr`, or envs that fail to report one
        return None
    return list(specs) if specs and isinstance(specs[0], gym.envs.registration.EnvSpec) else None


# Gymnasium's wrappers that change rewards (vector and single-env ones share these names; rlspeed's NormalizeReward
# too, which logs the env's own returns but changes what evaluate would sum)
REWARD_WRAPPERS = ("NormalizeReward", "TransformReward", "VectorizeTransformReward", "ClipReward", "ScaleReward")


def _wrapper_layers(env) -> list[tuple[str, object | None]]:
    """(class name, wrapper) of every layer of a vector env and of the envs inside it (a `SyncVectorEnv`'s walked,
    an `AsyncVectorEnv`'s or SB3 `SubprocVecEnv`'s read from their `str()`, which names every wrapper: those come as
    (name, None)), outermost first."""
    layers, seen, later = [], set(), []
    while env is not None and not isinstance(env, str) and id(env) not in seen:
        seen.add(id(env))
        layers.append((type(env).__name__, env))
        inner = getattr(env, "env", None)
        envs = getattr(env, "envs", None)
        if inner is None and isinstance(envs, (list, tuple)) and envs:
            later = envs[1:]  # (envs made unlike each other: any one's wrappers count)
            inner = envs[0]
        elif inner is None:  # (subprocess envs: their wrappers' names; envs that cannot answer: nothing said)
            for text in _subprocess_chains(env) or ():
                layers.extend((name, None) for name in re.findall(r"<(\w+)", text))
        env = inner
    for other in later:
        layers.extend(_wrapper_layers(other))
    return layers


def refuse_filming_envs(env_id: str, env=None) -> None:
    """UserError where the envs of `env_id` film themselves with Gymnasium's RecordVideo: among its registration's
    additional_wrappers, or (`env`: one env or a vector env made of the id) put on by its entry point. Every env
    rlspeed makes of the id (each training env, each evaluation's) would write videos of the same names into one
    folder, over each other's. `env` is closed before the error."""
    names = ([name for name, _ in _wrapper_layers(env)] if env is not None
             else [wrapper.name for wrapper in gym.spec(env_id).additional_wrappers])
    if "RecordVideo" not in names:
        return
    if env is not None:
        close_quietly(env)
    raise UserError(f"{env_id}'s envs film themselves with Gymnasium's RecordVideo, and every env rlspeed makes of it "
                    "(each training env, each evaluation's) would write videos of the same names into one folder over "
                    "each other's: register the id without it and film evaluation episodes with rlspeed's own videos "
                    "(rlspeed train --video-every N, rlspeed eval RUN --video FILE.mp4; in Python "
                    "rlspeed.record_video(model, path) or rlspeed.callbacks.VideoRecorderCallback).")


def _counts_episodes(name: str, wrapper) -> bool:
    """Whether a layer (`_wrapper_layers`') is a wrapper whose episode returns are reported in place of the sums of
    the rewards over it: SB3's `Monitor`, or Gymnasium's `RecordEpisodeStatistics`, single-env or vector
    (`records_episodes`)."""
    recorders = (gym.wrappers.RecordEpisodeStatistics, gym.wrappers.vector.RecordEpisodeStatistics)
    return name == "Monitor" or (name == "RecordEpisodeStatistics"
                                 and (wrapper is None or isinstance(wrapper, recorders)))


def records_episodes(vector_env) -> bool:
    """Whether a Gymnasium vector env records its episodes' returns with Gymnasium's `RecordEpisodeStatistics`: its
    vector wrapper around it, or the single-env one around every env inside (a subprocess env's wrappers read from its
    `str()`), whose info at each episode's end gives the return summed at its layer (`info["episode"]["r"]`)."""
    if not isinstance(vector_env, gym.vector.VectorEnv):  # (SB3's VecEnvs: their Monitor's episodes are read)
        return False
    layer = vector_env
    while isinstance(layer, gym.vector.VectorWrapper):
        if isinstance(layer, gym.wrappers.vector.RecordEpisodeStatistics):
            return True
        layer = layer.env
    inner = getattr(vector_env, "unwrapped", vector_env)
    if isinstance(inner, gym.vector.SyncVectorEnv):
        chains = [_env_chain(env) for env in inner.envs]
        return bool(chains) and all(any(isinstance(layer, gym.wrappers.RecordEpisodeStatistics) for layer in chain)
                                    for chain in chains)
    chains = _subprocess_chains(inner)
    return bool(chains) and all("<RecordEpisodeStatistics<" in chain for chain in chains)


def _env_chain(env) -> list:
    """A single Gymnasium env and the envs its wrappers wrap, outermost first."""
    chain = [env]
    while isinstance(env, gym.Wrapper):
        env = env.env
        chain.append(env)
    return chain


def reward_wrappers(env, below_monitor: bool = False) -> list[str]:
    """The names of the reward-changing wrappers around a vector env and around the envs inside it
    (`REWARD_WRAPPERS`, and any Gymnasium `RewardWrapper` or `VectorRewardWrapper` of the caller's own, where the
    wrapper itself is at hand: not inside subprocess envs), outermost first, each once. `below_monitor`: only those
    inside each env's SB3 `Monitor` or Gymnasium `RecordEpisodeStatistics` (a vector env whose envs' recorded
    episodes are reported: the wrappers over them change no reported return)."""
    changers = []
    for name, wrapper in _wrapper_layers(env):
        if below_monitor and _counts_episodes(name, wrapper):
            changers = []  # (the layers so far were over this env's Monitor; each env's chain comes whole)
            continue
        changing = name in REWARD_WRAPPERS or isinstance(wrapper, (gym.RewardWrapper, gym.vector.VectorRewardWrapper))
        if changing and name not in changers:
            changers.append(name)
    return changers


def life_loss_wrappers(env, below_monitor: bool = False) -> list[str]:
    """The names of the wrappers around a vector env or the envs inside it that end an episode at each lost life
    (SB3's `EpisodicLifeEnv`, Gymnasium's `AtariPreprocessing(terminal_on_life_loss=True)`), each once; with
    `below_monitor`, only those inside each env's SB3 `Monitor` (whose episodes, whole games then, are counted)."""
    found = []
    for name, wrapper in _wrapper_layers(env):
        if below_monitor and name == "Monitor":
            found = []  # (the layers so far were over this env's Monitor)
            continue
        ending = name == "EpisodicLifeEnv" or (name == "AtariPreprocessing"
                                               and getattr(wrapper, "terminal_on_life_loss", False))
        if ending and name not in found:
            found.append(name)
    return found


def normalising_wrappers(env) -> tuple[bool, bool]:
    """Whether Gymnasium's running-statistics wrappers are around a vector env or the envs inside it:
    (`NormalizeObservation` there, `NormalizeReward` there)."""
    names = {name for name, _ in _wrapper_layers(env)}
    return "NormalizeObservation" in names, "NormalizeReward" in names


_WARNED_STATISTICS = _WarnedOnce()


def warn_env_statistics(vector_env, env_id: str, made: bool = False) -> None:
    """A warning (once per env id in a process; once per env for a user's vector env) where `env_id`'s envs normalise
    their observations with Gymnasium's NormalizeObservation: its statistics belong to each env, so a model neither
    saves them nor shows a new env (evaluation, a video, a loaded model's env) those it trained with. `made` (envs
    made from the id, whose registration is the task): one too where they normalise their rewards with
    NormalizeReward, whose sums every return reported would be (a vector env passed in is warned of any reward
    wrapper by the model)."""
    if _WARNED_STATISTICS.said(env_id, vector_env):
        return
    observations, rewards = normalising_wrappers(vector_env)
    if made and rewards and "NormalizeReward" in reward_wrappers(vector_env, records_episodes(vector_env)):
        _WARNED_STATISTICS.mark(env_id, vector_env)
        warn_at_caller(f"{env_id}'s rewards pass through Gymnasium's NormalizeReward, so every episode return "
                       "reported (the metrics, evaluate, a target_return) sums normalised rewards, not the env's own, "
                       "on a scale that changes as training goes on and starts from nothing in each env made anew "
                       "(evaluation's); normalize_reward=True in place of the wrapper normalises what the model learns "
                       "from while the returns stay the env's own.", UserWarning)
    if not observations:
        return
    _WARNED_STATISTICS.mark(env_id, vector_env)
    whose = "this vector env's" if env_id == USER_VECTOR_ENV else f"{env_id}'s"
    warn_at_caller(f"{whose} observations pass through Gymnasium's NormalizeObservation, whose running statistics "
                   "belong to each env: the model does not save them, and an env made anew (to evaluate, film, or "
                   "train a loaded model) starts its own from nothing, so the policy sees observations scaled unlike "
                   "in training; normalize_obs=True in place of the wrapper keeps the statistics in the model (saved, "
                   "and frozen for evaluation).", UserWarning)


def _time_limit_names() -> set[str]:
    """The class names of Gymnasium's TimeLimit and of its subclasses in this process: rl_zoo3, once imported, puts
    its PatchedTimeLimit in TimeLimit's place, so `gym.make` wraps envs in that."""
    base = next(cls for cls in reversed(gym.wrappers.TimeLimit.__mro__) if cls.__name__ == "TimeLimit")
    names, classes = set(), [base]
    while classes:
        cls = classes.pop()
        names.add(cls.__name__)
        classes.extend(cls.__subclasses__())
    return names


def _envs_time_limit(vector_env, default: int | None) -> int | None:
    """The time limit of the envs inside a user's vector env (Gymnasium's or Stable-Baselines3's), else `default`
    (envs without a spec or TimeLimit). In-process envs give the soonest cut of each wrapper chain
    (`_in_process_time_limit`). Subprocess envs give their outermost TimeLimit's (or a subclass's:
    `_time_limit_names`), the only one their workers reach (`get_attr` and `call` each answer from the outermost
    wrapper that has the name), with a warning where an env has more than one (`_warn_nested_subprocess_limits`):
    Gymnasium's `AsyncVectorEnv` its TimeLimit's own `_max_episode_steps`, which its `set_attr` changes while the spec
    a TimeLimit gave once stays as it was; SB3's `SubprocVecEnv` its specs' first, as its `set_attr` sets the
    outermost wrapper's attribute, not a TimeLimit's. Other envs give their specs' (a TimeLimit wrapper or
    gym.make_vec's max_episode_steps sets it there, while make_vec's own spec keeps the registered one; None in a spec
    of envs made without one, gym.make_vec's max_episode_steps=-1); subprocess envs whose specs are not asked for
    (`_env_specs`) give their TimeLimit's, where each has one."""
    chains = _subprocess_chains(vector_env)
    inner = getattr(vector_env, "unwrapped", vector_env)
    if chains is None and getattr(inner, "envs", None):  # (Gymnasium's SyncVectorEnv, SB3's DummyVecEnv)
        limit = _in_process_time_limit(inner)
        if limit is not False:
            return limit
    limited = _time_limit_names()
    layers = [[name for name in re.findall(r"<(\w+)", chain) if name in limited] for chain in chains or ()]
    timed = bool(layers) and all(layers)
    specs = None if isinstance(inner, gym.vector.AsyncVectorEnv) and timed else _env_specs(vector_env)
    if specs is None and not timed:
        return default
    limit = (_limit(specs[0].max_episode_steps) if specs is not None
             else _limit(_worker_answer(_subprocess_env(vector_env), "_max_episode_steps")[0]))  # (an int)
    _warn_nested_subprocess_limits(layers, limit)
    return limit


def _warn_nested_subprocess_limits(layers: list[list[str]], limit: int | None) -> None:
    """The warning of subprocess envs with more than one TimeLimit each (`layers`: each env's, outermost first), whose
    inner limits no call to their workers reaches: `limit`, the outermost's, is taken for the envs' time limit, where
    an inner, sooner one ends their episodes (`TimeLimit(gym.make("CartPole-v1"), 1000)` ends them at 500)."""
    nested = next((names for names in layers if len(names) > 1), None)
    if nested is None:
        return
    warn_at_caller(f"This vector env's subprocess envs have {len(nested)} time limits each ({', '.join(nested)}), and "
                   f"only the outermost's ({limit} steps) can be read from their processes: it is taken for the envs' "
                   "time limit (evaluation's step cap, the model's spec and summary), where an inner, sooner one ends "
                   "their episodes: give each env one TimeLimit (gymnasium.make(id, max_episode_steps=N) sets it), or "
                   "build the vector env in this process (SyncVectorEnv, DummyVecEnv), whose soonest limit is read.",
                   UserWarning)


def _in_process_time_limit(inner) -> int | None | bool:
    """The time limit of the envs of an in-process vector env (`envs` at hand: Gymnasium's SyncVectorEnv, SB3's
    DummyVecEnv), as its first env's episodes are cut: the smallest among the TimeLimits (or subclasses:
    `_time_limit_names`) of its wrapper chain, as the soonest cut ends the episode whatever the others say (a
    spec gives the outermost's alone; `set_attr` sets the outermost's); None where they set no limit, False where an
    env has no TimeLimit."""
    limited = _time_limit_names()
    chains = [[_limit(layer._max_episode_steps) for layer in _env_chain(env) if type(layer).__name__ in limited]
              for env in getattr(inner, "envs", None) or []]
    if not chains or not all(chains):
        return False
    return min((limit for limit in chains[0] if limit is not None), default=None)


def _limit(steps) -> int | None:
    """A TimeLimit's or a spec's `steps` as `EnvSpec.max_episode_steps` holds them: the steps after which an episode
    is cut (a TimeLimit cuts at the first step count that reaches its limit), None where there is no limit."""
    finite = isinstance(steps, numbers.Real) and not isinstance(steps, bool) and math.isfinite(steps)
    return math.ceil(steps) if finite and steps > 0 else None


#: the most rewards `float32_rewards` checks in Python (more: in numpy)
_FEW_REWARDS = 32


def float32_rewards(rewards, env: BatchedEnv) -> np.ndarray:
    """`rewards` (one per env, as the envs returned them) as a new float32 array, as rlspeed keeps rewards; where a
    finite one is past float32's range (about 3.4e38), and so infinite there, sets `env.rewards_overflowed`, and where
    one is NaN `env.rewards_nan` (the NaN guard's refusal names them)."""
    # (an overflow: numpy's RuntimeWarning, as numpy gives it. An array, the adapters' case, is copied by `astype`,
    # the call for a known type; anything else goes through np.array's conversion. It runs on every env step:
    # benchmarks/env_special_cases.py measures this case and the 1-D one below against the general calls)
    stored = (rewards.astype(np.float32) if type(rewards) is np.ndarray
              else np.array(rewards, dtype=np.float32))
    # (checked on every step: in Python for a few rewards, where numpy's fixed cost per call is most of it, a batch
    # [N] read as it is; in numpy for many, where Python's cost per reward would be: EnvPool's thousands of envs)
    flat = stored if stored.ndim == 1 else stored.ravel()
    finite = (all(map(math.isfinite, flat.tolist())) if flat.size <= _FEW_REWARDS
              else bool(np.isfinite(flat).all()))
    if not finite:
        if np.isfinite(np.asarray(rewards, dtype=np.float64)[~np.isfinite(stored)]).any():
            env.rewards_overflowed = True
        if np.isnan(flat).any():
            env.rewards_nan = True
    return stored


def close_envs(env: gym.Env | gym.vector.VectorEnv, env_id: str, before_work: bool = False) -> None:
    """Close `env`, the env `env_id` (one env, or a SyncVectorEnv of them); an error the env's
    close() raises is an `EnvStepError` naming the env and close() (one line from the CLI, exit 1; the env's traceback
    chained), raised once every env of a SyncVectorEnv is closed (Gymnasium's stops at the first that raises), the
    first with the others (`CloseErrors.raise_first`); within a `CloseErrors` block (the CLI's command, `learn`,
    `evaluate`), each kept for its caller to raise once the work is done, unless the env did no work yet
    (`before_work`: one made to read its spaces, or to check its frames, raises at once: the run stops before
    training)."""
    errors = []
    inner = getattr(env, "unwrapped", env)
    # (a SyncVectorEnv whose close_extras is Gymnasium's, a loop over its envs: a subclass's runs as it is)
    if (isinstance(inner, gym.vector.SyncVectorEnv) and not inner.closed
            and type(inner).close_extras is gym.vector.SyncVectorEnv.close_extras):
        errors += _close_each(inner.envs)  # (Gymnasium's close stops at the first that raises)
        inner.closed = True  # (its envs closed: the wrappers' close below reaches none of them again)
    try:
        env.close()
    except Exception as error:  # noqa: BLE001 (said: `_close_failed`)
        errors.append(error)
    if errors:
        _close_failed(env_id, "gymnasium", errors, before_work)


def _close_each(envs: Sequence[gym.Env]) -> list[Exception]:
    """Close every env of `envs`, each even where one before raised; the errors their close() raised."""
    errors = []
    for each in envs:
        try:
            each.close()
        except Exception as error:  # noqa: BLE001 (each is said: `_close_failed`)
            errors.append(error)
    return errors


@contextlib.contextmanager
def closed_after(env: gym.Env | gym.vector.VectorEnv, env_id: str, before_work: bool = False):
    """Close `env` when the block ends: with `close_envs` where the block succeeded, quietly where it raised
    (`close_quietly`)."""
    try:
        yield env
    except BaseException:
        close_quietly(env)
        raise
    close_envs(env, env_id, before_work)


def close_quietly(closing) -> None:
    """Close `closing` (an env, a video writer) after the work failed or was refused: an error of its close() is
    dropped, the work's error being the one to show (envs and writers close with their own exception types)."""
    with contextlib.suppress(Exception):
        closing.close()


def _close_failed(env_id: str, backend: str, errors: Sequence[BaseException], before_work: bool = False) -> None:
    """The close() errors `errors` of the env `env_id` (`close_envs`'s rule, also for a gymnasium-async env's workers
    and the other backends' envs): each an `EnvStepError` naming the env and close(), kept within a `CloseErrors`
    block unless `before_work`, else raised, the first with the others (`CloseErrors.raise_first`)."""
    failures = []
    for error in errors:
        failure = EnvStepError(env_id, backend, "close", error)
        failure.__cause__ = error
        failures.append(failure)
    kept = None if before_work else CLOSE_ERRORS.get()
    if kept is not None:
        kept.errors.extend(failures)
    else:  # (none open, or no work yet: raised now, as a block raises what it kept)
        CloseErrors(failures).raise_first()


def close_other_backend(close: Callable[[], object], env_id: str, backend: str, inner=None,
                        envs: Sequence[gym.Env] = ()) -> None:
    """Call `close`, the close of an env of another backend (an SB3 VecEnv's, an EnvPool pool's), by `close_envs`'s
    rule: an error it raises is an `EnvStepError` naming the env `env_id` and close(), kept within a `CloseErrors`
    block, else raised. `inner`: the subprocess vector env inside (SB3's SubprocVecEnv), whose workers close their
    envs after the parent stops listening (`worker_exit_error`). `envs`: the env objects inside whose own close
    stops at the first that raises (SB3's DummyVecEnv), each closed first, every error kept (as `close_envs` does a
    SyncVectorEnv's); `close` must then reach none of them again."""
    errors = _close_each(envs)
    try:
        close()
    except Exception as error:  # noqa: BLE001 (said: `_close_failed`)
        errors.append(error)
    else:
        if inner is not None and (error := worker_exit_error(inner)) is not None:
            errors.append(error)
    if errors:
        _close_failed(env_id, backend, errors)


class _WorkerTraceback(Exception):  # noqa: N818 (not raised: the text of a traceback in another process)
    """The traceback of an error raised in a subprocess env's worker, as its text: the cause shown under it (as
    concurrent.futures shows a worker's)."""

    def __str__(self) -> str:
        return f"\n\"\"\"\n{self.args[0].rstrip()}\n\"\"\""


def _worker_traced(error: BaseException, trace: str) -> BaseException:
    """`error`, sent back from a subprocess env's worker, with the text of its traceback there as its cause."""
    error.__cause__ = _WorkerTraceback(trace)
    return error


def worker_exit_error(inner, wait_s: float = 0.0) -> BaseException | None:
    """An error for the workers of the subprocess vector env `inner` (Gymnasium's AsyncVectorEnv, SB3's
    SubprocVecEnv: its `processes`) that exited with an error, None where none did: an error its env raised that the
    worker does not send back (a Gymnasium worker answers "closed" before it closes its env; an SB3 worker answers
    nothing, in close() or in step()) ends the worker, its traceback on stderr, exit code 1, while the parent reads
    only a closed pipe (EOFError) or, closing, joins it and says nothing. `wait_s`: where no worker has exited yet,
    how long to wait for one to (the parent read the end of a worker's pipe, which ends as its process does)."""
    processes = list(inner.processes)
    if wait_s and all(process.exitcode is None for process in processes):
        ended = multiprocessing.connection.wait([process.sentinel for process in processes], timeout=wait_s)
        for process in processes:
            if process.sentinel in ended:  # (its files closed as it ends, before it can be reaped: join does)
                process.join(wait_s)
    failed = [(index, process.exitcode) for index, process in enumerate(processes)
              if process.exitcode not in (0, None)]
    if not failed:
        return None
    more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
    return ChildProcessError(f"worker {failed[0][0]}{more} exited with code {failed[0][1]}; the worker printed the "
                             "env's traceback above")


def host_tensor(array, device: torch.device, dtype=np.float32) -> torch.Tensor:
    """A tensor copy of a vector env's host array: a vector env made with copy=False (and SB3's SubprocVecEnv) may
    hand back its own buffer (for AsyncVectorEnv, shared memory) and overwrite it on the next step, while callers
    keep the returned tensors."""
    return torch.as_tensor(np.array(array, dtype=dtype), device=device)


def check_shape(observation, shape: tuple[int, ...], where: str = "", source: str = "An env") -> None:
    """UserError unless one env's `observation` has the `shape` its observation space declares: numpy would
    broadcast a scalar or a shorter array into the batch row, and training would go on with wrong observations.
    `source`: who returned it (`"'X'.reset()"`)."""
    if type(observation) is np.ndarray and observation.shape == shape:
        return  # (the common case, checked on every env's every step: without np.shape's dispatch)
    if np.shape(observation) != tuple(shape):
        raise UserError(f"{source} returned an observation{where} of shape {np.shape(observation)} where its "
                        f"observation_space declares {tuple(shape)}: make its reset() and step() return that shape, or "
                        "declare the shape they return.")


# what an env written for the old gym API (step: obs, reward, done, info; reset: obs) is wrapped in, in Gymnasium 1.x:
# Shimmy's adapter, which needs gym importable (any version: "shimmy[gym-v21]" pins gym below 0.26 and numpy below 2)
# and converts only gym's spaces; gymnasium.make("GymV21Environment-v0") finds it only after `import shimmy`
OLD_GYM_API = ("Shimmy's GymV21CompatibilityV0 adapts an env of the old gym API whose spaces are gym's: pip install "
               "shimmy gym, then shimmy.GymV21CompatibilityV0(env=YourEnv()) (an env with spaces of gymnasium.spaces "
               "returns Gymnasium's reset and step itself)")
_NOT_CALLED = object()  # (`contract_problem`: no value returned yet)


def _returned(value) -> str:
    """What an env call returned, in a few words: "4 values", "a ndarray of shape (4,)", "None"."""
    if value is None:
        return "None"
    if isinstance(value, tuple):
        return f"{len(value)} values"
    shape = f" of shape {np.shape(value)}" if isinstance(value, np.ndarray) else ""
    return f"a {type(value).__name__}{shape}"


#: what a reward is never (`step_values_problem`): stored as a float, None becomes NaN and a string its number
NOT_A_REWARD = (type(None), str, bytes)  # (numpy's str_ and bytes_ are subclasses)
#: the types of reward checked at every step after an env's first (`reward_problem`), one isinstance a step: those
#: that are never a reward, and arrays, whose 0-d text ones (np.array("1.0")) numpy stores as their number
CHECKED_EVERY_STEP = (*NOT_A_REWARD, np.ndarray)


def _is_text(value) -> bool:
    """Whether `value` is a string (Python's or numpy's, text or bytes) or a 0-d array of one, which numpy would read
    as a number ("1.0") or a truth value (any non-empty one is True)."""
    return isinstance(value, (str, bytes)) or (isinstance(value, np.ndarray) and value.dtype.kind in "US")


#: the rule every refusal of a reward states (`reward_problem`)
ONE_REWARD = "a reward is one number per step (a float)"


def reward_problem(name: str, reward) -> str | None:
    """One sentence where a step's `reward` (from `name`, "'X'.step()") is no single number: None or text
    (`NOT_A_REWARD`, or an array of text: `_is_text`), an array of another shape than (), or a value float() does not
    take; else None."""
    if reward is None or _is_text(reward):
        shown = reward.item() if isinstance(reward, np.generic) else reward  # (a vector env's stacked np.str_: '1.0')
        return f"{name} returned reward={shown!r} ({type(shown).__name__}): {ONE_REWARD}."
    if np.ndim(reward) != 0:
        return (f"{name} returned a reward of shape {np.shape(reward)}: {ONE_REWARD}; a one-element array's is "
                "array.item().")
    try:
        float(reward)
    except (TypeError, ValueError):
        return f"{name} returned a reward of type {type(reward).__name__}: {ONE_REWARD}."
    return None


def step_values_problem(name: str, reward, terminated, truncated) -> str | None:
    """One sentence where a step's reward, `terminated` or `truncated` (from `name`, "'X'.step()") is no single
    number or bool-like value, else None. A reward stored as a float reads a string as its number ("1.0") and None as
    NaN, which the NaN guard stops without saying where it came from; a flag given as a string or None would be stored
    as its truth value ("False" ends the episode, None never does), an array broadcast into the batch; numbers (0, 1,
    numpy bools) mean what they say."""
    problem = reward_problem(name, reward)
    if problem:
        return problem
    for field, flag in (("terminated", terminated), ("truncated", truncated)):
        if np.ndim(flag) != 0:
            return (f"{name} returned {field} of shape {np.shape(flag)}: terminated and truncated are one bool "
                    "each per step.")
        if flag is None or _is_text(flag):
            return (f"{name} returned {field}={flag!r} ({type(flag).__name__}): terminated and truncated are one bool "
                    "each per step (True or False), and a string or None would be taken as its truth value.")
    return None


def spaces_changed_problem(env_id: str, env: gym.Env, made: tuple[gym.Space, gym.Space]) -> str | None:
    """One sentence where `env`'s observation_space or action_space is no longer the one it had when it was made
    (`made`: both, in that order), else None: asked after its first reset, as the model reads them once, before."""
    for name, made_space in zip(("observation_space", "action_space"), made):
        now = getattr(env, name)
        if now != made_space:
            return (f"'{env_id}'.reset() changed its {name} from {made_space} to {now}: rlspeed reads an env's spaces "
                    "once, when it is made; set them in __init__ and keep them.")
    return None


class SubprocessEnv(gym.Wrapper):
    """What each subprocess env is wrapped in, in its own process:

    - its first step's reward, `terminated` and `truncated` are checked (`step_values_problem`): Gymnasium's
      AsyncVectorEnv stacks them into arrays in the parent, where a string or None is already a number or a truth
      value ("False" ends every episode). UserError there. Every later step's reward is checked too (one isinstance,
      `CHECKED_EVERY_STEP`: a reward of None was NaN there, which the NaN guard stopped without naming the reward,
      and "1.0" its number); its flags go through unchecked.
    - an episode's last observation is a copy: Gymnasium's worker keeps the object the env returned as
      `info["final_obs"]` and sends it after resetting the env, so an env that writes its observations into one array
      of its own (Gymnasium's checker warns: "share an object") sent the next episode's first observation as the last
      one, and truncated episodes bootstrapped from it (the in-process backend copies each observation as it comes).
    - its first reset keeps the spaces it was made with (`spaces_changed_problem`): the parent read them from an env
      of its own, made and never reset, so an `action_space` set anew in reset was not seen there.
    - it tells the parent the seed its env's np_random records (`recorded_seed`), which warns once where a seeded
      reset did not seed it (`warn_unseeded_reset`: a warning in the worker would be said once per worker, out of
      the parent's reach).
    - it closes when the parent asks (`close_for_parent`), which then hears the error of its close().
    """

    def __init__(self, env: gym.Env, env_id: str):
        super().__init__(env)
        self._env_id, self._checked, self._closed = env_id, False, False
        self._made_spaces: tuple | None = (env.observation_space, env.action_space)

    def close_for_parent(self) -> tuple[BaseException, str] | None:
        """Close the env now, asked by the parent (`GymnasiumEnv.close`, through the worker's `call`, before
        Gymnasium's close): Gymnasium's worker closes its env only after it answered "closed", when no one listens
        (the error's traceback went to stderr, the parent heard an exit code). The error its close() raised, with its
        traceback's text, for the parent to name (the error itself where it pickles back, else a ChildProcessError
        of its type and message); None where it closed. The worker's own close then does nothing."""
        if self._closed:
            return None
        self._closed = True
        try:
            self.env.close()
        except Exception as error:  # noqa: BLE001 (sent to the parent, which names it: `_close_failed`)
            trace = traceback.format_exc()
            try:
                pickle.loads(pickle.dumps(error))  # noqa: S301 (this process's own object)
            except Exception:  # noqa: BLE001 (an error that does not pickle back: its type and message)
                error = ChildProcessError(f"{type(error).__name__}: {error}")
            return error, trace
        return None

    def recorded_seed(self) -> int | None:
        """The seed the env's np_random records (`recorded_seed`), asked by the parent after a seeded reset."""
        return recorded_seed(self.env)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.env.close()

    def reset(self, **kwargs):
        reset = self.env.reset(**kwargs)
        if self._made_spaces is not None:
            made, self._made_spaces = self._made_spaces, None
            problem = spaces_changed_problem(self._env_id, self.env, made)
            if problem:
                raise UserError(problem)
        return reset

    def step(self, action):
        stepped = self.env.step(action)
        if not isinstance(stepped, tuple) or len(stepped) != 5:  # (other breaches: found where they are stored)
            return stepped
        if not self._checked:
            self._checked = True
            problem = step_values_problem(f"'{self._env_id}'.step()", *stepped[1:4])
            if problem:
                raise UserError(problem)
        elif isinstance(stepped[1], CHECKED_EVERY_STEP):
            problem = reward_problem(f"'{self._env_id}'.step()", stepped[1])
            if problem:
                raise UserError(problem)
        if stepped[2] or stepped[3]:  # (the worker resets the env next; once an episode: a copy of any size is cheap)
            return (copy.deepcopy(stepped[0]), *stepped[1:])
        return stepped


def contract_problem(env_id: str, call: str, returned, obs_shape: tuple[int, ...] | None) -> str | None:
    """One sentence saying what breaks Gymnasium's contract in what `env_id`'s `call` ("reset" or "step")
    returned, or None where nothing is found. Only asked after storing the value raised (the step loop stays as it
    is): numpy's and Python's own messages ("setting an array element with a sequence", "not enough values to
    unpack") name neither the env nor the field. `obs_shape`: the declared shape of a float vector observation
    (None: not checked here)."""
    if returned is _NOT_CALLED:
        return None
    name = f"'{env_id}'.{call}()"
    if call == "reset":
        if not isinstance(returned, tuple) or len(returned) != 2:
            return (f"{name} returned {_returned(returned)}: Gymnasium's reset returns (obs, info), an observation "
                    f"and a dict, and only obs is the old gym API's reset; {OLD_GYM_API}.")
        observation, info = returned
    else:
        if not isinstance(returned, tuple) or len(returned) != 5:
            old = (f", and (obs, reward, done, info) is the old gym API's step; {OLD_GYM_API}"
                   if isinstance(returned, tuple) and len(returned) == 4 else "")
            return (f"{name} returned {_returned(returned)}: Gymnasium's step returns (obs, reward, terminated, "
                    f"truncated, info){old}.")
        observation, reward, terminated, truncated, info = returned
        problem = step_values_problem(name, reward, terminated, truncated)
        if problem:
            return problem
    if not isinstance(info, dict):
        return (f"{name} returned an info of type {type(info).__name__}: info is a dict (an empty one where there is "
                "nothing to report).")
    if obs_shape is None:
        return None
    try:
        dtype = np.asarray(observation).dtype
    except (ValueError, TypeError):  # (lists of unequal lengths)
        return (f"{name} returned an observation that is no array ({_returned(observation)}): make its reset() and "
                f"step() return an array of shape {tuple(obs_shape)}, as its observation_space declares.")
    if np.shape(observation) != tuple(obs_shape):
        try:
            check_shape(observation, obs_shape, source=name)
        except UserError as error:
            return str(error)
    if dtype.kind not in "biuf":  # (text, objects: not numbers)
        return (f"{name} returned an observation of dtype {dtype} where its observation_space declares numbers "
                "(float32): make its reset() and step() return a numeric array.")
    return None


_GYMNASIUM_DIR = os.path.dirname(gym.__file__) + os.sep
_GYMNASIUM_ENVS_DIR = os.path.join(_GYMNASIUM_DIR, "envs") + os.sep
_NUMPY_DIR = os.path.dirname(np.__file__) + os.sep
#: the file name of the frame numpy before 1.25 put around each of its functions (np.copyto, np.stack, ...): numpy's
#: own, as its directory's frames are
_NUMPY_DISPATCH_FILE = "<__array_function__ internals>"


def _in_numpy(filename: str) -> bool:
    """Whether a frame of `filename` is numpy's own code (its directory, or its dispatch frames before 1.25)."""
    return filename.startswith(_NUMPY_DIR) or filename == _NUMPY_DISPATCH_FILE


def _raised_storing(error: BaseException) -> bool:
    """Whether `error` was raised where what an env returned is unpacked or stored: in this module's own code, or in
    a wrapper's or vector env's method (Gymnasium's TimeLimit unpacks every step, and so does a TimeLimit another
    package put in its place, as rl_zoo3 does; SyncVectorEnv.reset batches with numpy) or elsewhere in Gymnasium
    outside its envs; not inside the env (nor a built-in one)."""
    frame, tb = None, error.__traceback__
    while tb is not None:  # (the innermost frame outside numpy)
        if not _in_numpy(tb.tb_frame.f_code.co_filename):
            frame = tb.tb_frame
        tb = tb.tb_next
    if frame is None:
        return False
    filename = frame.f_code.co_filename
    owner = frame.f_locals.get("self")
    return (filename == __file__ or isinstance(owner, (gym.Wrapper, gym.vector.VectorEnv))
            or (filename.startswith(_GYMNASIUM_DIR) and not filename.startswith(_GYMNASIUM_ENVS_DIR)))


def probe_contract(env_id: str, call: str, env: gym.Env, obs_shape: tuple[int, ...] | None, action=None,
                   host: HostObservations | None = None) -> str | None:
    """`contract_problem` for what `env` (without Gymnasium's wrappers, which unpack it themselves) returns from
    one more `call`, after storing its last answer raised inside Gymnasium's code; None where that call raises too
    or returns what the contract asks for. The run fails anyway: the env's state no longer matters. `host`: as
    `probe_made_env`'s."""
    try:
        inner = env.unwrapped
        returned = inner.reset() if call == "reset" else inner.step(action)
    except Exception:  # noqa: BLE001 (the env's own failure: the first error is the one to show)
        return None
    return _answer_problem(env_id, call, returned, obs_shape, host)


#: what `probe_made_env` gives a fresh env to show its breach: at most this many steps and seconds
PROBE_STEPS, PROBE_SECONDS = 1000, 2.0


def probe_made_env(env_id: str, call: str, env_fn, obs_shape: tuple[int, ...] | None,
                   host: HostObservations | None = None) -> str | None:
    """`contract_problem` for a fresh env made with `env_fn` in this process (a subprocess env's constructor: its
    worker, which failed, has closed its env), after a subprocess env's `call` ("reset" or "step") failed where
    Gymnasium stores what it returned: its reset, then (for "step") random actions, episode after episode, until an
    answer breaks the contract, it raises (the env's own failure: None, the first error is the one to show) or
    `PROBE_STEPS` / `PROBE_SECONDS` pass (None). Without Gymnasium's wrappers, which unpack answers themselves, as
    `probe_contract`. `host`: where the observations are not float vectors, their layout, checked as the one-process
    backend checks it (`HostObservations.write`)."""
    try:
        env = env_fn()
    except Exception:  # noqa: BLE001 (the env cannot be made here: nothing to show)
        return None
    try:
        inner, deadline = env.unwrapped, time.monotonic() + PROBE_SECONDS
        for step in range(PROBE_STEPS + 1):
            returned = inner.reset() if step == 0 else inner.step(inner.action_space.sample())
            problem = _answer_problem(env_id, "reset" if step == 0 else "step", returned, obs_shape, host)
            if problem or call == "reset" or time.monotonic() > deadline:
                return problem
            if step and (returned[2] or returned[3]):  # (a finished episode: the worker resets it within the step)
                problem = _answer_problem(env_id, "reset", inner.reset(), obs_shape, host)
                if problem:
                    return problem
        return None
    except Exception:  # noqa: BLE001 (the env's own failure)
        return None
    finally:
        close_quietly(env)  # (the probe's close: nothing to report)


def _answer_problem(env_id: str, call: str, returned, obs_shape, host: HostObservations | None) -> str | None:
    """`contract_problem`, and for observations that are not float vectors, `host`'s check of their shape."""
    problem = contract_problem(env_id, call, returned, obs_shape)
    if problem or host is None or obs_shape is not None or returned is _NOT_CALLED:
        return problem
    try:
        host.write(host.empty(1), 0, returned[0])
    except UserError as error:
        return str(error).replace(f"{host.source} returned", f"'{env_id}'.{call}() returned", 1)
    except (ValueError, TypeError, KeyError, IndexError):  # (not read as its layout: nothing more to say)
        pass
    return None


class WorkerLogWarning(UserWarning):
    """A line of Gymnasium's log of a subprocess env's own error (its worker's traceback among them), given before
    the error is raised again in this process."""

    #: the error that follows says it, its traceback chained (`WorkerTraceback`): the `rlspeed` command, whose error
    #: is one sentence (`--debug` shows the traceback), leaves these lines out
    told_by_the_error = True


class WorkerTraceback(Exception):
    """A subprocess env's traceback, as its worker wrote it (tracebacks do not cross processes): chained as the
    cause of the error Gymnasium raises again in this process, so that `--debug` (and Python) show where in the
    env it was raised."""

    def __init__(self, trace: str):
        super().__init__(trace)
        self.trace = trace

    def __str__(self) -> str:
        return "\n" + self.trace.rstrip()


#: a frame of a traceback's text: its file and the source line shown under it ("" where none is: the next frame's
#: line, or the error's, is no source line of it)
_TRACE_FRAME = re.compile(r'^\s*File "([^"]+)", line \d+, in [^\n]*(?:\n(?!\s*File ")\s*([^\n]*))?', re.MULTILINE)
#: a wrapper's line unpacking its inner env's answer (Gymnasium's convention, kept by other packages' wrappers:
#: rl_zoo3 replaces Gymnasium's TimeLimit with a subclass of its own file when it is imported)
_UNPACKS_INNER_ENV = re.compile(r"=\s*self\.env\.(step|reset)\(")


def _worker_raised_storing(trace: str) -> bool:
    """`_raised_storing` for a subprocess env's error, from its worker's traceback text: whether its innermost frame
    outside numpy is in Gymnasium outside its envs, or a wrapper's line unpacking its inner env's answer (the worker
    or a wrapper unpacking or writing what the env returned)."""
    frames = [(name, line) for name, line in _TRACE_FRAME.findall(trace) if not _in_numpy(name)]
    if not frames:
        return False
    name, line = frames[-1]
    return (name.startswith(_GYMNASIUM_DIR) and not name.startswith(_GYMNASIUM_ENVS_DIR)
            or _UNPACKS_INNER_ENV.search(line) is not None)


def _logged_trace(text: str) -> str:
    """The traceback in a message of Gymnasium's log: from its "Traceback" on, without the colour code that closes
    it."""
    return text[text.index("Traceback"):].removesuffix("\x1b[0m").rstrip()


def _worker_error(logged: list) -> tuple[int | None, str | None]:
    """(worker index, traceback) of the error Gymnasium raised again from a subprocess env's worker (the last it
    reported), from the messages its `_raise_if_errors` logs; (None, None) where they say none."""
    index = trace = None
    for message in logged:
        text = str(message.message)
        found = re.search(r"Received the following error from Worker-(\d+)", text)
        if found:
            index, trace = int(found.group(1)), None
        elif "Traceback (most recent call last)" in text and index is not None:
            trace = _logged_trace(text)
    return (index, trace) if trace is not None else (None, None)


def _untold(logged: list, error: Exception | None) -> list:
    """The messages of Gymnasium's log of its workers' errors (`logged`) that `error`, raised again from them, does not
    tell: all where no worker's traceback is chained to it; else those of workers whose traceback differs from the
    chained one (shown with it, a traceback is shown once: Gymnasium's line that it raises it again goes too)."""
    cause = getattr(error, "__cause__", None)
    if not isinstance(cause, WorkerTraceback):
        return logged
    kept, header = [], None
    for message in logged:
        text = str(message.message)
        if re.search(r"Received the following error from Worker-\d+", text):
            header = message
        elif "Traceback (most recent call last)" in text:
            if _logged_trace(text) != cause.trace:
                kept += [shown for shown in (header, message) if shown is not None]
            header = None
        elif "Raising the last exception back to the main process" not in text:
            kept.append(message)
    return kept


def _hold_worker_errors(vector_env: gym.vector.AsyncVectorEnv, held: list) -> None:
    """Make `vector_env` (subprocess envs rlspeed made) report its workers' errors in a step or reset without
    Gymnasium's log of them (its `_raise_if_errors`, only ever called with all answers in hand, and only past its
    first line when one failed: a successful step costs what it did): the log is put in `held`, with the error
    raised, for `GymnasiumEnv._subprocess_failure` to show where the error is the env's own (a breach of the contract
    is one sentence instead). The worker's traceback becomes the error's cause (`WorkerTraceback`)."""
    method = getattr(type(vector_env), "_raise_if_errors", None)
    if method is None:  # (a Gymnasium without it: its log stays)
        return
    ref = weakref.ref(vector_env)  # (no cycle: the env is closed when it is dropped, as Gymnasium's own)

    def raise_if_errors(successes) -> None:
        if all(successes):
            return
        env = ref()  # (alive: it is the one calling)
        if env._state not in (AsyncState.WAITING_STEP, AsyncState.WAITING_RESET):
            return method(env, successes)  # (a call or attribute: Gymnasium's log, as it was)
        with warnings.catch_warnings(record=True) as logged:
            warnings.simplefilter("always")
            try:
                method(env, successes)
            except Exception as error:
                trace = _worker_error(logged)[1]
                if trace is not None and error.__cause__ is None:
                    error.__cause__ = WorkerTraceback(trace)
                held[:] = [error, list(logged)]
                raise

    vector_env._raise_if_errors = raise_if_errors


class HostObservations:
    """Host observation batches of an env (numpy arrays; dicts or tuples of them for Dict and Tuple spaces) as
    fresh host arrays in the contract's dtypes, keyed as `EnvSpec.observation_space` (`check_observation_space`:
    Tuple positions become keys "0", "1", ...; keys it dropped, such as a text mission, are left out). `source`: who
    returns the observations, as its refusals name it ("'X'", the env id; `named` adds the method)."""

    def __init__(self, space: gym.Space, source: str = "An env"):
        self.source = source
        self.layout = observation_layout(space)
        self.keyed = isinstance(self.layout, dict)
        # (shape, numpy dtype) of the whole observation or by key, for `empty` and `batch` (which run on every step)
        self._numpy_layout = ({key: (shape, numpy_dtype(dtype)) for key, (shape, dtype) in self.layout.items()}
                              if self.keyed else (self.layout[0], numpy_dtype(self.layout[1])))
        # the Discrete and MultiDiscrete parts' value ranges [low, high), by key (None: the whole observation)
        parts = ({key: _subspace(space, key) for key in self.layout} if self.keyed else {None: space})
        self.ranges = {key: (part, *integer_range(part)) for key, part in parts.items()
                       if isinstance(part, (gym.spaces.Discrete, gym.spaces.MultiDiscrete))}
        # the shape of an observation that `write` stores as it is, with no other check (an array whose shape is its
        # space's, of a space with no parts and no value ranges: a Box's); None where each goes through the checks
        self._plain_shape = None if self.keyed or self.ranges else tuple(self.layout[0])

    @staticmethod
    def part(value, key: str):
        """The part `key` of a keyed observation or batch `value` (a layout key of `layout`): a Dict's entry, or a
        Tuple's position ("0", "1", ...); KeyError, IndexError or ValueError where `value` has no such part."""
        return value[int(key)] if isinstance(value, (tuple, list)) else value[key]

    def _missing_part(self, observation, key: str) -> str:
        """The refusal of an observation without the part `key` of its space: a Dict's key ("key 'b'"), or a Tuple's
        position ("part 1"; the space is keyed "0", "1", ... by then, so the observation tells which it is)."""
        if isinstance(observation, (tuple, list)) and key.isdigit():
            part, held = f"part {key}", f"{len(observation)} part{'s' if len(observation) != 1 else ''}"
        else:
            part = f"key {key!r}"
            held = (f"its keys: {', '.join(map(repr, observation)) or 'none'}" if isinstance(observation, dict)
                    else _returned(observation))
        return (f"{self.source} returned an observation without the {part} its observation_space declares ({held}): "
                "return every part of the space.")

    def batch(self, value) -> np.ndarray | dict[str, np.ndarray]:
        """A copy of a batch `[N, ...]` in the contract's dtypes (a vector env may reuse its own buffers); UserError
        where a Discrete or MultiDiscrete part holds a value its space does not have (its one-hot encoding would set
        another part's slot, or index past the last)."""
        if not self.keyed:
            batch = np.array(value, dtype=self._numpy_layout[1])
        else:
            batch = {key: np.array(self.part(value, key), dtype=dtype)
                     for key, (_, dtype) in self._numpy_layout.items()}
        for key in self.ranges:
            self._check_values(batch if key is None else batch[key], key)
        return batch

    def _check_values(self, part, key: str | None) -> None:
        """UserError where the Discrete or MultiDiscrete `part` (one observation's, or a batch's) holds a value its
        space does not have."""
        space, low, high = self.ranges[key]
        if isinstance(space, gym.spaces.Discrete) and np.ndim(part) == 0 and low <= part < high:
            return  # (one env's Discrete value, the common case: no array made)
        outside = (np.asarray(part) < low) | (np.asarray(part) >= high)
        if outside.any():
            bad = np.asarray(part)[outside].flat[0]
            where = "" if key is None else f" (key {key!r})"
            raise UserError(f"{self.source} returned the observation value {bad}{where} outside its observation space "
                            f"{space}: make the env keep to its space, or declare the values it returns.")

    def empty(self, num: int) -> np.ndarray | dict[str, np.ndarray]:
        """Uninitialised host storage for `num` observations."""
        if not self.keyed:
            shape, dtype = self._numpy_layout
            return np.empty((num, *shape), dtype=dtype)
        return {key: np.empty((num, *shape), dtype=dtype) for key, (shape, dtype) in self._numpy_layout.items()}

    def write(self, target, row: int, observation) -> None:
        """Put one env's observation into row `row` of `target` (from `empty`); UserError for one of another shape
        than its space's (numpy would broadcast it into the row)."""
        if type(observation) is np.ndarray and observation.shape == self._plain_shape:
            # (every env's every step of a Box space: `check_shape`'s own first case, without its call;
            # benchmarks/env_special_cases.py measures it against the path below)
            target[row] = observation
            return
        if not self.keyed:
            check_shape(observation, self.layout[0], source=self.source)
            if self.ranges:
                self._check_values(observation, None)
            target[row] = observation
            return
        for key, (shape, _) in self.layout.items():
            try:
                part = self.part(observation, key)
            except (KeyError, IndexError, ValueError):  # (a tuple for a Dict space: int('a') raises ValueError)
                raise UserError(self._missing_part(observation, key)) from None
            check_shape(part, shape, f" (key {key!r})", self.source)
            if key in self.ranges:
                self._check_values(part, key)
            target[key][row] = part

    def copy_rows(self, target, source, rows) -> None:
        """target[rows] = source[rows], per key."""
        if not self.keyed:
            target[rows] = source[rows]
            return
        for key in self.layout:
            target[key][rows] = source[key][rows]

    def copy(self, value):
        return {key: array.copy() for key, array in value.items()} if self.keyed else value.copy()

    def raise_named(self, error: UserError, call: str) -> NoReturn:
        """Raise `error`, where it is a refusal of an observation by `write` or `batch`, as one naming the method
        `call` that returned it ("'X'.step() returned ..."); any other error as it is."""
        said = str(error)
        if not said.startswith(f"{self.source} returned"):
            raise error
        raise UserError(said.replace(f"{self.source} returned", f"{self.source}.{call}() returned", 1)) from None


def _subspace(space: gym.Space, key: str) -> gym.Space | None:
    """The part of a Dict or Tuple `space` that `check_observation_space` keys `key`, where it is one level down."""
    try:
        return space[int(key)] if isinstance(space, gym.spaces.Tuple) else space[key]
    except (KeyError, IndexError, ValueError, TypeError):
        return None


def host_to(array, device: torch.device) -> torch.Tensor:
    """`torch.as_tensor(array, device=device)`; a numpy array bound for the CPU goes through `torch.from_numpy`,
    which shares its memory as `as_tensor` does, at a fraction of its per-call cost (paid several times per step)."""
    if type(array) is np.ndarray and device.type == "cpu":
        return torch.from_numpy(array)
    return torch.as_tensor(array, device=device)


def to_device(obs, device: torch.device) -> Observation:
    """Host observation arrays (one, or a dict of them) as tensors on `device`, in their dtypes."""
    if isinstance(obs, dict):
        return {key: host_to(array, device) for key, array in obs.items()}
    return host_to(obs, device)


def obs_and_final(obs, finished_rows: np.ndarray, device: torch.device, final_row,
                  host: HostObservations | None = None) -> tuple[Observation, Observation]:
    """(obs, final_obs) tensors of a step: final_obs is `obs` with each finished row replaced by `final_row(row)`
    (the true last observation; the returned obs holds the next episode's first), the same tensors when none
    finished. `host` is needed for Dict observations (`obs` a dict of arrays)."""
    obs_t = to_device(obs, device)
    if len(finished_rows) == 0:
        return obs_t, obs_t
    if host is None:
        final = obs.copy()
        for row in finished_rows:
            final[row] = final_row(row)
    else:
        final = host.copy(obs)
        for row in finished_rows:
            host.write(final, row, final_row(row))
    return obs_t, to_device(final, device)



#: What an env's constructor raises for an option it does not take or a value it cannot use (FrozenLake's
#: `map_name="9x9"`: a KeyError): made with the user's options, such an error is theirs (`rejected_options`)
REJECTED_VALUE_ERRORS = (TypeError, ValueError, KeyError, IndexError, AssertionError)


def rejected_options(env_id: str, env_kwargs: dict, error: BaseException) -> UserError:
    """The UserError for an env that raised one of `REJECTED_VALUE_ERRORS` when made with the user's options: their
    names and the env's own message (without Gymnasium's note on where it was raised)."""
    message = str(error).split(" was raised from the environment creator")[0].rstrip(".")
    hint = (" (an option it takes as a tuple is written !!python/tuple [a, b] in --env-kwargs, whose [a, b] is a list;"
            " a tuple in Python)" if "tuple" in message and has_list(env_kwargs) else "")
    unexpected = re.search(r"unexpected keyword argument '(\w+)'", message)
    meant = _option_named_like(env_id, unexpected.group(1)) if unexpected else None
    hint += f"; did you mean {meant}?" if meant else ""
    return UserError(f"Env '{env_id}' rejected the options {', '.join(env_kwargs)}: {message}{hint}"
                     f"{'' if meant else '.'}")


def _option_named_like(env_id: str, name: str) -> str | None:
    """The option of the env's constructor whose name is close to `name` (a misspelling: `is_slipery` for
    FrozenLake's `is_slippery`); None where none is, or the constructor cannot be inspected."""
    try:
        entry_point = gym.spec(env_id).entry_point
    except Exception:  # noqa: BLE001 (an id Gymnasium no longer finds: nothing to add to the env's own message)
        return None
    keywords = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    names = [p.name for p in constructor_parameters(entry_point) if p.kind in keywords]
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.8)
    return close[0] if close else None


def _unpicklable_options(env_kwargs: dict) -> list[str]:
    """The names of the env options that do not pickle (a lock, an open file, a local function)."""
    names = []
    for name, value in env_kwargs.items():
        try:
            pickle.dumps(value)
        except Exception:  # noqa: BLE001 (whatever pickling raises: it does not pickle)
            names.append(name)
    return names


def _worker_warnings() -> dict:
    """AsyncVectorEnv's options for workers that show warnings as the process making them does, where its display
    of warnings says how (`for_workers`: the `rlspeed` command's one line, each warning once over its processes);
    none elsewhere (Python's display, in each worker)."""
    spread = getattr(warnings.showwarning, "for_workers", None)
    if spread is None or not hasattr(gym.vector.async_vector_env, "_async_worker"):
        return {}
    return {"worker": functools.partial(_subprocess_env_worker, spread())}


def _subprocess_env_worker(setup, *args) -> None:
    """Gymnasium's worker of a subprocess env, after `setup` (`_worker_warnings`)."""
    setup()
    gym.vector.async_vector_env._async_worker(*args)


#: seconds `GymnasiumEnv` waits for the answer of subprocess envs an interrupt left pending before it gives up
PENDING_ANSWER_TIMEOUT_S = 10.0


class GymnasiumEnv(BatchedEnv):
    """N Gymnasium envs in a Sync or Async (subprocess) vector env with SAME_STEP autoreset.

    Either `env_id`, a registered Gymnasium id made `num_envs` times (`env_kwargs`: options for its constructor),
    with `vectorization` "sync" (one process) or "async" (one subprocess per env); or `vector_env`, a Gymnasium
    vector env of your own with SAME_STEP autoreset, whose envs are taken as they are (`env_id`, where given, names
    it; `env_kwargs` are then only recorded as its options). `from_id`: `vector_env`'s envs were made from
    `env_id`'s registration (an ALE id's, by `AtariGymnasiumEnv`), whose wrappers are warned about as the envs of an
    id made here are.
    """

    backend = "gymnasium"

    def __init__(self, env_id: str | None = None, num_envs: int = 1, device: torch.device | str = "cpu",
                 vectorization: str = "sync", vector_env: gym.vector.VectorEnv | None = None,
                 env_kwargs: dict | None = None, from_id: bool = False):
        self.device = torch.device(device)
        made = vector_env is None
        if vector_env is None:
            if env_id is None:
                raise ValueError("GymnasiumEnv needs env_id or vector_env")
            spec = gym_spec(env_id)
            refuse_filming_envs(env_id)
            if vectorization not in ("sync", "async"):
                raise UserError(f"Unknown vectorization '{vectorization}': use sync or async.")
            # copy=False: every observation is copied here anyway (`_obs`, `step`)
            vector_kwargs = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP, "copy": False}
            wrappers = None
            if vectorization == "async":
                vector_kwargs.update(_worker_warnings())
                wrappers = [functools.partial(SubprocessEnv, env_id=env_id)]
            # (a Ctrl-C or SIGTERM while the workers are forked is not lost; the workers made go)
            with (stops_kept_while_forking(lambda: vector_env is not None and vector_env.close(terminate=True))
                  if vectorization == "async" else contextlib.nullcontext()):
                try:
                    try:
                        vector_env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode=vectorization,
                                                  vector_kwargs=vector_kwargs, wrappers=wrappers, **(env_kwargs or {}))
                    except ValueError as error:
                        # subprocess envs whose observation space has a part without shared memory (MiniGrid's mission
                        # text): their observations travel through the pipes instead
                        if vectorization != "async" or "shared_memory" not in str(error):
                            raise
                        vector_env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode=vectorization,
                                                  vector_kwargs={**vector_kwargs, "shared_memory": False},
                                                  wrappers=wrappers, **(env_kwargs or {}))
                except gym.error.DependencyNotInstalled as error:
                    raise UserError(f"Cannot make '{env_id}': {missing_dependency(error).rstrip('.')}.") from None
                except (*REJECTED_VALUE_ERRORS, pickle.PicklingError) as error:
                    if not env_kwargs:
                        raise
                    spawned = vectorization == "async" and multiprocessing.get_start_method() != "fork"
                    unsent = _unpicklable_options(env_kwargs) if spawned else []
                    if unsent:  # (the subprocesses get the options pickled: spawn and forkserver, not fork)
                        raise UserError(f"The env options {', '.join(unsent)} cannot be sent to the env subprocesses "
                                        f"of backend 'gymnasium-async' (they are pickled where processes are spawned, "
                                        f"as on macOS and Windows): give options that pickle, or use "
                                        f"env_backend='gymnasium' (one process).") from None
                    # most likely an option the env's constructor does not take (a typo, or a native-env option), or a
                    # value it refuses
                    raise rejected_options(env_id, env_kwargs, error) from None
            # (the envs' time limit: a TimeLimit among the registration's additional_wrappers sets theirs alone)
            max_steps, threshold = _envs_time_limit(vector_env, spec.max_episode_steps), spec.reward_threshold
        else:
            check_vector_api(vector_env)
            check_same_step(vector_env)
            spec = _vector_env_spec(vector_env)
            max_steps = _envs_time_limit(vector_env, getattr(spec, "max_episode_steps", None))
            # the id only when make_env(id) gives the same env back (evaluation and targets rebuild it from the id):
            # not where set_attr("_max_episode_steps", N) gave the envs another time limit than their spec's
            registered = registered_vector_env_id(vector_env) is not None and max_steps == spec.max_episode_steps
            refuse_failed_asks(vector_env)
            env_id = env_id or (spec.id if registered else USER_VECTOR_ENV)
            threshold = getattr(spec, "reward_threshold", None) if registered else None
        inner = vector_env.unwrapped
        if isinstance(getattr(inner, "env_fns", None), types.GeneratorType):
            # Gymnasium 1.1 to 1.3's make_vec gives SyncVectorEnv its env constructors as a generator, which it keeps,
            # used up, as env_fns: a deep copy of the model (copy.deepcopy) failed on it ("cannot pickle 'generator'
            # object"). What is left of it: nothing.
            inner.env_fns = list(inner.env_fns)
        self.vector_env = vector_env
        self.num_envs = vector_env.num_envs
        if made or from_id:  # (a vector env passed in is the caller's, its files theirs to name)
            refuse_filming_envs(env_id, vector_env)
        warn_env_statistics(vector_env, env_id, made or from_id)
        # the envs' own RecordEpisodeStatistics under wrappers that change rewards (CleanRL's NormalizeReward over
        # it): the returns it recorded are the episodes' (`recorded_returns`, read where it reports an end); other
        # envs' steps make no recorded-returns tensors (benchmarks/env_special_cases.py measures what that saves)
        self._records_returns = records_episodes(vector_env) and bool(reward_wrappers(vector_env))
        self._recorded: dict[int, float] = {}  # (this step's: finished row -> its recorded return)
        # (the error a subprocess env's step or reset raised, and Gymnasium's log of it: `_subprocess_failure`)
        self._worker_errors: list = []
        if made and isinstance(vector_env, gym.vector.AsyncVectorEnv):  # (not a user's: their log stays theirs)
            _hold_worker_errors(vector_env, self._worker_errors)
        #: its workers' envs are in `SubprocessEnv`, which closes them when asked (`close_for_parent`) and tells the
        #: seeds they record (`recorded_seed`)
        self._subprocess_wrapped = made and isinstance(inner, gym.vector.AsyncVectorEnv)
        try:
            spec = EnvSpec.from_spaces(env_id, vector_env.single_observation_space, vector_env.single_action_space,
                                       max_steps, threshold)
            self.spec = spec.with_options(env_kwargs)  # (options made it: recorded, with their time limit)
        except UserError:
            close_quietly(vector_env)
            raise
        self._host = HostObservations(self.spec.observation_space, f"'{env_id}'")
        # float vector observations: the plain path (one float32 array; every other layout goes through `_host`)
        self._float_vector = self.spec.float_vector_obs
        # A SyncVectorEnv with SAME_STEP autoreset is stepped env by env here, as it would step them, without its
        # per-step info merging and batching (for CartPole those cost more than the physics).
        same_step = autoreset_mode(vector_env) == gym.vector.AutoresetMode.SAME_STEP
        self._sync_envs = list(vector_env.envs) if type(vector_env) is gym.vector.SyncVectorEnv and same_step else None
        self._first_step = True
        # rows `step` leaves unstepped (`rest_rows`), None: every row steps; and the host observations the last
        # in-process step returned (a resting row's stay as they were)
        self._resting: np.ndarray | None = None
        self._last_obs = None
        # each in-process env's spaces as it was made, for the first reset to compare (`_check_spaces_kept`)
        self._made_spaces = ([(env.observation_space, env.action_space) for env in inner.envs]
                             if isinstance(inner, gym.vector.SyncVectorEnv) else None)
        # Action masks: info["action_mask"] (Gymnasium's Taxi) or an `action_masks()` method (sb3-contrib's
        # convention); found at reset, then read every step (after autoreset: the new episode's first mask).
        self._mask_width = mask_size(self.spec.action_space)
        self._mask_method = False
        if self._mask_width is None and isinstance(vector_env, gym.vector.SyncVectorEnv) \
                and _has_mask_method(vector_env.envs[0]):
            warn_unapplied_masks(self.spec, self)
        if self._mask_width is not None:
            if self._sync_envs is not None or isinstance(vector_env, gym.vector.SyncVectorEnv):
                self._mask_method = _has_mask_method(vector_env.envs[0])
            else:
                # Asking the subprocesses (`get_attr`) for a method they lack makes their workers fail and shut down:
                # ask a probe env built from the same constructor instead (once, in this process).
                env_fns = getattr(vector_env, "env_fns", None)
                if env_fns:
                    probe = env_fns[0]()
                    try:
                        self._mask_method = _has_mask_method(probe)
                    finally:
                        probe.close()
        self.has_action_masks = self._mask_method  # (also True once a reset's info shows "action_mask")
        # (`_NoneMasks`: where masks come in infos that Gymnasium merges; taken out again after a reset that showed
        # no masks, so that an env without them pays no call per env per step for it)
        self._none_masks, self._merging_env = None, inner
        if self._mask_width is not None and not self._mask_method and callable(getattr(inner, "_add_info", None)):
            merge = inner._add_info  # (one made on this vector env before: kept)
            self._none_masks = inner._add_info = merge if isinstance(merge, _NoneMasks) else _NoneMasks(merge)
        self._step_masks_checked = False  # (`_check_step_masks` on the first step outside the SyncVectorEnv loop)
        self.reports_success = False  # (True once a finished episode's info has a success flag: success_key)
        # set where a call to the vector env raised (a KeyboardInterrupt say) part-way: `disrupted`
        self._interrupted_call: str | None = None
        self._failed: str | None = None  # (why subprocess envs were closed after a failed step or reset)

    @property
    def backend_name(self) -> str:
        """The backend as `make_env` and the CLI name it: "gymnasium-async" for subprocess envs (`backend` is
        "gymnasium" for both)."""
        inner = getattr(self.vector_env, "unwrapped", self.vector_env)
        return "gymnasium-async" if isinstance(inner, gym.vector.AsyncVectorEnv) else self.backend

    def _masks(self, info_masks, source: str) -> torch.Tensor | None:
        """The step's action masks as bool `[N, n]` on the device, None when the env gives none."""
        if self._mask_method:
            try:
                info_masks, source = self.vector_env.call("action_masks"), f"{self.spec.env_id}'s action_masks()"
            except BaseException:
                self._interrupted_call = "call"
                raise
        if info_masks is None:
            return None
        return torch.as_tensor(check_action_masks(info_masks, self.spec.action_space, self.num_envs, source),
                               device=self.device)

    def reset(self, seed: int | None = None) -> ResetResult:
        """Reset the vector env (Gymnasium seeds env i with `seed + i`); returns (obs, info).

        info holds `action_mask` (bool `[N, n]`) where the env gives masks; the rest of Gymnasium's reset info is
        dropped.
        """
        self._finish_pending()
        self._resting, self._last_obs = None, None  # (rows rest after a step of these episodes: `rest_rows`)
        if self._none_masks is not None:
            self._none_masks.taken()  # (none noted by a call that failed before they were read)
        try:
            obs, reset_info = self.vector_env.reset(seed=seed)
        except BaseException as error:
            self._interrupted_call = "reset"
            if isinstance(error, Exception):
                self._subprocess_failure("reset", error)
            envs = getattr(getattr(self.vector_env, "unwrapped", None), "envs", None)  # (SyncVectorEnv's)
            if isinstance(error, Exception) and not isinstance(error, UserError) and envs and _raised_storing(error):
                shape, host = (self.spec.observation_shape, None) if self._float_vector else (None, self._host)
                problem = next(filter(None, (probe_contract(self.spec.env_id, "reset", env, shape, host=host)
                                             for env in envs)), None)
                if problem:
                    raise UserError(problem) from error
            raise
        # (an in-process SyncVectorEnv keeps each env's reset observation: Gymnasium's `_env_obs`)
        for observation in getattr(self.vector_env.unwrapped, "_env_obs", None) or ():
            self._check_keys(observation, "reset")
        if self._made_spaces is not None:
            made_spaces, self._made_spaces = self._made_spaces, None
            self._check_spaces_kept(made_spaces)
        if seed is not None:  # (in-process envs, and the subprocess envs rlspeed made: `SubprocessEnv` answers)
            envs = getattr(self.vector_env.unwrapped, "envs", None) or ()
            seen = ([recorded_seed(env) for env in envs] if envs else
                    self.vector_env.unwrapped.call("recorded_seed") if self._subprocess_wrapped else ())
            for index, each_seen in enumerate(seen):
                each = seed + index if isinstance(seed, int) else seed[index]  # (as Gymnasium seeds env i)
                if each is not None:
                    warn_unseeded_reset(self.spec.env_id, each_seen, each, self)
        info = {}
        if self._mask_width is None and "action_mask" in reset_info:
            warn_unapplied_masks(self.spec, self)
        if self._mask_width is not None and ("action_mask" in reset_info or self._mask_method):
            self.has_action_masks = True
            if not self._mask_method:
                masks_missing(reset_info, self.spec.env_id, "reset", self._none_rows())
            info["action_mask"] = self._masks(reset_info.get("action_mask"),
                                              f"{self.spec.env_id}'s info['action_mask']")
        elif self._none_masks is not None:
            self._none_masks.remove_from(self._merging_env)
            self._none_masks = None
        if self._float_vector:
            return host_tensor(obs, self.device), info
        try:
            return to_device(self._host.batch(obs), self.device), info
        except UserError as error:
            self._host.raise_named(error, "reset")

    def _none_rows(self) -> set[int]:
        """The envs whose mask was None in the infos the vector env merged since the last call (`_NoneMasks`)."""
        return self._none_masks.taken() if self._none_masks is not None else set()

    def _env_mask(self, env: gym.Env, info: dict):
        """One env's mask for its current observation: its `action_masks()` or its step's `info["action_mask"]`."""
        return env.get_wrapper_attr("action_masks")() if self._mask_method else info.get("action_mask")

    def _check_step_masks(self, info: dict) -> None:
        """Warn (once per env id) where a step's info has "action_mask" but the reset's had none: rlspeed learns at
        reset that an env gives masks, so these are not applied."""
        if self._mask_width is not None and not self.has_action_masks and "action_mask" in info:
            warn_step_only_masks(self.spec, self)

    def _check_flags(self, stepped: tuple) -> None:
        """UserError where one env's first step returned a reward that is no number or a `terminated` or `truncated`
        that is no bool (`step_values_problem`: a string or None would be taken as a number or a truth value on every
        later step)."""
        problem = step_values_problem(f"'{self.spec.env_id}'.step()", *stepped[1:4])
        if problem:
            raise UserError(problem)

    def _check_reward(self, reward) -> None:
        """UserError where a step's reward after an env's first is None or text (`reward_problem`)."""
        problem = reward_problem(f"'{self.spec.env_id}'.step()", reward)
        if problem:
            raise UserError(problem)

    def _check_keys(self, observation, call: str = "step") -> None:
        """UserError where one env's `call` (its first step, a reset) returned a Dict observation with a key its
        observation_space lacks (Gymnasium's batching reads the space's keys only: the key would be dropped
        silently)."""
        space = self.vector_env.single_observation_space
        if isinstance(space, gym.spaces.Dict) and isinstance(observation, dict):
            extra = [key for key in observation if key not in space.spaces]
            if extra:
                keys = f"key{'s' * (len(extra) > 1)} {', '.join(map(repr, extra))}"
                raise UserError(f"'{self.spec.env_id}'.{call}() returned an observation with the {keys}, which its "
                                f"Dict observation_space lacks (its keys: {', '.join(map(repr, space.spaces))}): add "
                                "it to the space, or leave it out of the observation.")

    def _check_spaces_kept(self, made_spaces: list[tuple[gym.Space, gym.Space]]) -> None:
        """UserError where an in-process env's first reset changed the observation_space or action_space it had when
        it was made (`made_spaces`: each env's): the model reads them once, before, so a Discrete(3) action space set
        in reset after the Discrete(2) of the constructor would never see its third action, and a Box of another
        shape would get actions of the old one."""
        for env, spaces in zip(self.vector_env.unwrapped.envs, made_spaces):
            problem = spaces_changed_problem(self.spec.env_id, env, spaces)
            if problem:
                raise UserError(problem)

    def _step_sync(self, actions: np.ndarray):
        """SyncVectorEnv.step's SAME_STEP loop: (obs, reward, terminated, truncated, final obs or None, masks or
        None); a row's mask is the one valid for its returned observation (after autoreset, the reset's)."""
        stepped = reset_returned = _NOT_CALLED  # (what the envs returned: read if storing it raised)
        i, writing = None, "step"  # (which call returned the observation being written: named if it is refused)
        first, self._first_step = self._first_step, False  # (each env's first step: its flags' types are checked)
        try:
            n = self.num_envs
            reward = np.empty(n, dtype=np.float64)  # (as the envs return them: `float32_rewards` below)
            terminated = np.empty(n, dtype=bool)
            truncated = np.empty(n, dtype=bool)
            final = None
            masks = [None] * n if self.has_action_masks and not self._mask_method else None
            final_masks: dict[int, object] = {}  # finished row -> the mask its env gave with the last observation
            self._final_masks = final_masks
            successes: dict[int, bool] = {}  # finished row -> its last step's success flag (success_key)
            self._successes = successes
            recorded: dict[int, float] = {}  # finished row -> the return its RecordEpisodeStatistics recorded
            self._recorded = recorded
            host = self._host
            obs = host.empty(n)  # fresh: callers keep the tensors
            resting = self._resting
            for i, env in enumerate(self._sync_envs):
                if resting is not None and resting[i]:  # (not stepped: no reward, no episode end)
                    reward[i], terminated[i], truncated[i] = 0.0, False, False
                    continue
                stepped, writing = env.step(actions[i]), "step"
                observation, reward[i], terminated[i], truncated[i], info = stepped
                if first:
                    self._check_flags(stepped)
                    self._check_step_masks(info)
                    self._check_keys(observation)
                elif isinstance(stepped[1], CHECKED_EVERY_STEP):  # (every step's reward: None was NaN, "1.0" 1.0)
                    self._check_reward(stepped[1])
                if terminated[i] or truncated[i]:
                    if final is None:
                        final = host.empty(n)
                    host.write(final, i, observation)
                    if masks is not None or self._mask_method:
                        final_masks[i] = self._env_mask(env, info)
                    if (key := success_key(info)) is not None:
                        successes[i] = success_flag(info[key], key)
                    if self._records_returns and isinstance(info.get("episode"), dict):
                        recorded[i] = float(info["episode"]["r"])
                    reset_returned, writing = env.reset(), "reset"
                    observation, info = reset_returned
                host.write(obs, i, observation)
                if masks is not None:
                    masks[i] = info.get("action_mask")
            if resting is not None:
                host.copy_rows(obs, self._last_obs, resting)
            self._last_obs = obs
            if final is not None:
                host.copy_rows(final, obs, ~(terminated | truncated))
            return obs, float32_rewards(reward, self), terminated, truncated, final, masks
        except UserError as error:
            self._host.raise_named(error, writing)
        except Exception as error:
            if not _raised_storing(error):
                raise
            shape, env_id = (self.spec.observation_shape if self._float_vector else None), self.spec.env_id
            host = None if self._float_vector else self._host
            problem = (_answer_problem(env_id, "step", stepped, shape, host)
                       or _answer_problem(env_id, "reset", reset_returned, shape, host)
                       or (i is not None and probe_contract(env_id, "step", self._sync_envs[i], shape, actions[i],
                                                            host)))
            if not problem:
                raise
            raise UserError(problem) from error

    def step(self, actions: torch.Tensor) -> StepResult:
        """Step the Gymnasium envs (actions go to the host once) and return the batched contract's tensors.

        `info` holds `final_obs`, `final_rows` (the finished rows, a host array) and, where the env gives masks,
        `action_mask` (bool `[N, n]`, for the returned observations: after an autoreset, the new episode's) and
        `final_action_mask` (for `final_obs`; not for subprocess envs masked through `action_masks()`);
        Gymnasium's own info is dropped. A SyncVectorEnv with SAME_STEP autoreset is stepped env by env here
        (`_step_sync`), skipping its per-step info merging.
        """
        if self._sync_envs is not None:
            obs_np, reward, terminated, truncated, final_np, masks = self._step_sync(
                _to_numpy_actions(actions, self.spec.action_space))
            obs_t = to_device(obs_np, self.device)
            final_t = obs_t if final_np is None else to_device(final_np, self.device)
            rows = _NO_ROWS if final_np is None else np.flatnonzero(terminated | truncated)
            out_info = {"final_obs": final_t, "final_rows": rows}
            if self.has_action_masks:
                source = f"{self.spec.env_id}'s info['action_mask']"
                if masks is not None and any(mask is None for mask in masks):
                    raise UserError(f"{self.spec.env_id} gave info['action_mask'] at reset but not on every step: "
                                    "give it on every step and reset, or pass use_masking=false.")
                out_info["action_mask"] = self._masks(masks, source)
                out_info["final_action_mask"] = final_action_masks(out_info["action_mask"], self._final_masks,
                                                                   self.spec.action_space, source)
            add_success(self, out_info, self._successes)
            if self._records_returns:
                self._add_recorded(out_info, self._recorded)
            return (obs_t, host_to(reward, self.device), host_to(terminated, self.device),
                    host_to(truncated, self.device), out_info)
        self.step_send(actions)
        return self.step_receive()

    def rest_rows(self, rows: torch.Tensor | np.ndarray | None) -> None:
        """Leave the rows `rows` (bool `[N]`; None: none) unstepped by the following steps, until the next reset:
        their envs are not called (nor their random streams drawn from), their observations stay as the last step
        returned them, with reward 0 and no episode end. For an evaluation's rows whose first episode has ended
        (`resting_finished_rows`): in-process envs stepped row by row only, without action masks."""
        if self._sync_envs is None or self.has_action_masks:
            raise ValueError("rest_rows: only an in-process SyncVectorEnv without action masks leaves rows unstepped")
        if rows is None:
            self._resting = None
            return
        if self._last_obs is None:
            raise ValueError("rest_rows: rows rest after a step, which gives the observations they keep")
        self._resting = (rows.cpu().numpy() if isinstance(rows, torch.Tensor) else np.asarray(rows)).astype(bool)

    @property
    def splits_steps(self) -> bool:
        """Whether `step_send` returns before the envs have stepped (subprocess envs, `AsyncVectorEnv`), so that
        several such envs step at once (`rlspeed.population.base.MemberEnvs`)."""
        return self._sync_envs is None and isinstance(self.vector_env, gym.vector.AsyncVectorEnv)

    def step_send(self, actions: torch.Tensor) -> None:
        """The first half of `step` (not for in-process SyncVectorEnvs, which `step` steps env by env): the actions
        go to the envs (subprocesses: without waiting for them); `step_receive` returns what `step` would."""
        np_actions = _to_numpy_actions(actions, self.spec.action_space)
        if self.splits_steps:
            self._finish_pending()
            try:  # (free unless it raises: an interrupt part-way leaves some envs sent to, others not)
                self.vector_env.step_async(np_actions)
            except BaseException:
                self._interrupted_call = "step"
                raise
            self._sent = None
        else:
            try:
                self._sent = self.vector_env.step(np_actions)
            except Exception as error:
                self._subprocess_failure("step", error)  # (a user's AsyncVectorEnv inside wrappers)
                raise

    def step_receive(self) -> StepResult:
        """The second half of `step` (after `step_send`): the step's tensors and info, as `step` returns them."""
        sent, self._sent = self._sent, None
        try:
            obs, reward, terminated, truncated, info = self.vector_env.step_wait() if sent is None else sent
        except BaseException as error:
            self._interrupted_call = "step"
            if isinstance(error, Exception):
                self._subprocess_failure("step", error)
            raise
        reward, terminated, truncated = (float32_rewards(reward, self), np.asarray(terminated, dtype=bool),
                                         np.asarray(truncated, dtype=bool))
        for field, value in (("rewards", reward), ("terminated", terminated), ("truncated", truncated)):
            if value.shape != (self.num_envs,):  # (an env's reward of shape (1,) batches to [N, 1], not [N])
                self._subprocess_failure("step")  # (subprocess envs: one env's answer named, as with one process)
                raise UserError(f"'{self.spec.env_id}' (its vector env) returned {field} of shape {value.shape} for "
                                f"{self.num_envs} envs: each env's step returns one number (a reward) and one bool "
                                "(terminated, truncated), not an array.")
        finished = self._finished_rows(info, terminated | truncated)
        try:
            # a copy, as in `host_tensor`: the vector env may reuse its buffer
            obs_np = np.array(obs, dtype=np.float32) if self._float_vector else self._host.batch(obs)
        except UserError as error:
            self._host.raise_named(error, self._refused_call(obs, finished))
        try:
            obs_t, final_t = obs_and_final(obs_np, finished, self.device, lambda row: info["final_obs"][row],
                                           None if self._float_vector else self._host)
        except UserError as error:  # (an episode's last observation: its step's)
            self._host.raise_named(error, "step")
        out_info = {"final_obs": final_t, "final_rows": np.asarray(finished, dtype=np.int64)}
        final_info = info.get("final_info", {})  # (the finished envs' last infos, before their reset)
        if not isinstance(final_info, dict):  # (an env's own info key: the vector env merged it as an array)
            self._reserved_info_key("final_info")
        if not self._step_masks_checked:
            self._check_step_masks(info)
            self._step_masks_checked = True
        if self.has_action_masks:
            source = f"{self.spec.env_id}'s info['action_mask']"
            if not self._mask_method and "action_mask" not in info:
                raise UserError(f"{self.spec.env_id} gave info['action_mask'] at reset but not on this step: give it "
                                "on every step and reset, or pass use_masking=false.")
            if not self._mask_method:
                masks_missing(info, self.spec.env_id, "step", self._none_rows())
            out_info["action_mask"] = self._masks(info.get("action_mask"), source)
            if not len(finished):
                out_info["final_action_mask"] = out_info["action_mask"]
            elif not self._mask_method and "action_mask" in final_info:  # (the envs' masks before their reset)
                out_info["final_action_mask"] = final_action_masks(
                    out_info["action_mask"], {int(row): final_info["action_mask"][row] for row in finished},
                    self.spec.action_space, source)
        # (what finished envs report: looked up only on a step where one finished)
        successes = {}
        if len(finished) and (key := success_key(final_info)) is not None:
            reported = np.asarray(final_info.get(f"_{key}", ()), dtype=bool)
            successes = {int(row): success_flag(final_info[key][row], key) for row in finished
                         if not reported.size or reported[row]}
        add_success(self, out_info, successes)
        if self._records_returns:
            self._add_recorded(out_info, self._recorded_returns(info, final_info, finished))
        return (obs_t, host_to(reward, self.device), host_to(terminated, self.device), host_to(truncated, self.device),
                out_info)

    def _refused_call(self, obs, finished: np.ndarray) -> str:
        """Which call returned the observation of a step's batch `obs` that `self._host.batch` refused: "reset" where
        the rows that did not finish pass (a finished row's observation is its reset's), else "step"."""
        kept = np.setdiff1d(np.arange(self.num_envs), finished)
        if self._host.keyed:
            rows = {key: np.asarray(self._host.part(obs, key))[kept] for key in self._host.layout}
        else:
            rows = np.asarray(obs)[kept]
        try:
            self._host.batch(rows)
        except UserError:
            return "step"
        return "reset"

    def _recorded_returns(self, info: dict, final_info: dict, finished: np.ndarray) -> dict[int, float]:
        """The finished rows whose episode's return a RecordEpisodeStatistics recorded -> that return: each env's in its
        last info (`final_info`), the vector one's in the step's own `info`."""
        if not len(finished):
            return {}
        recording = next((where for where in (final_info, info)
                          if isinstance(where.get("episode"), dict) and "r" in where["episode"]), None)
        if recording is None:
            return {}
        returns = recording["episode"]["r"]
        recorded = np.asarray(recording.get("_episode", np.ones(self.num_envs, dtype=bool)), dtype=bool)
        return {int(row): float(returns[row]) for row in finished if recorded[row]}

    def _add_recorded(self, out_info: dict, recorded: dict[int, float]) -> None:
        """Called on every step where the envs record their returns (`_records_returns`, decided when the adapter is
        made; a population's envs join their infos key by key): `out_info["recorded_rows"]`, the finished rows whose
        env's RecordEpisodeStatistics reported their episode's end (bool `[N]`), and `out_info["recorded_returns"]`,
        those returns (`[N]`), for `EpisodeStatistics`."""
        rows = np.zeros(self.num_envs, dtype=bool)
        returns = np.zeros(self.num_envs, dtype=np.float64)
        rows[list(recorded)], returns[list(recorded)] = True, list(recorded.values())
        out_info["recorded_rows"] = torch.as_tensor(rows, device=self.device)
        out_info["recorded_returns"] = torch.as_tensor(returns, device=self.device, dtype=statistics_dtype(self.device))

    def _finished_rows(self, info: dict, done: np.ndarray) -> np.ndarray:
        """The rows whose episode ended in this step (host int64 indices), whose true last observation is
        `info["final_obs"][row]`. Gymnasium's vector envs mark them in `info["_final_obs"]`; a vector env of one's own
        that gives `final_obs` without that mask has them where `terminated | truncated`. A finished row without
        `final_obs` is refused: its returned observation is the next episode's first, and a truncated episode
        bootstrapped from it would learn from the wrong state."""
        if "_final_obs" in info:
            rows = np.flatnonzero(np.asarray(info["_final_obs"], dtype=bool))
            if not done[rows].all():  # (an env's own info key, merged by the vector env as its last observations)
                self._reserved_info_key("final_obs")
            return rows
        if not done.any():
            return _NO_ROWS
        if "final_obs" not in info:
            raise UserError(f"'{self.spec.env_id}' (its vector env) ended an episode without info['final_obs']: a "
                            "vector env with SAME_STEP autoreset gives each finished env's last observation there "
                            "(and info['_final_obs'], a bool mask of those envs), as Gymnasium's do.")
        return np.flatnonzero(done)

    def _reserved_info_key(self, key: str) -> None:
        """UserError for an env whose own info has `key`, which Gymnasium's vector envs keep for an episode's last
        observation or info (SAME_STEP autoreset): merged with theirs, every env's value read as an episode's end
        (its NaN as a non-finite observation)."""
        self._subprocess_failure("step")  # (subprocess envs: ended first, as for another break of the contract)
        raise UserError(f"'{self.spec.env_id}' gives info['{key}'] of its own, a key Gymnasium's vector envs (here "
                        f"{type(getattr(self.vector_env, 'unwrapped', self.vector_env)).__name__}) keep for the "
                        "last observation and info of an episode that ended: rename that key in the env's info.")

    def _subprocess_failure(self, call: str, error: Exception | None = None) -> None:
        """After subprocess envs (Gymnasium's AsyncVectorEnv) failed in a `call` ("step" or "reset"; `error`: what
        it raised, None where its answer broke the contract without an error): UserError in one sentence where a
        fresh env made from their constructor (`probe_made_env`) shows what breaks Gymnasium's contract in what the
        env returns, as the one-process backend says it; else Gymnasium's log of a worker's own error, less what the
        error shows (`_untold`). Either way the subprocesses are ended first (their workers that failed have stopped; a
        run cannot go on with them: `disrupted` says so). Nothing for other vector envs."""
        inner = getattr(self.vector_env, "unwrapped", self.vector_env)
        if not isinstance(inner, gym.vector.AsyncVectorEnv) or inner.closed:
            return
        held, self._worker_errors[:] = list(self._worker_errors), []
        if isinstance(error, UserError):  # (told as it is; a worker's own (`SubprocessEnv`) ended its process)
            if held and held[0] is error:
                self.close()
                self._failed = f"their {call} failed"
            return
        worker, logged = None, []
        if held and held[0] is error:
            logged = held[1]
            worker, trace = _worker_error(logged)
            storing = trace is not None and _worker_raised_storing(trace)
        else:
            storing = error is None or _raised_storing(error)
        problem = None
        env_fns = getattr(inner, "env_fns", None) or ()
        if storing and env_fns:
            shape = self.spec.observation_shape if self._float_vector else None
            problem = probe_made_env(self.spec.env_id, call, env_fns[worker if worker is not None and worker < len(
                env_fns) else 0], shape, None if self._float_vector else self._host)
        if problem is None:
            for message in _untold(logged, error):  # (Gymnasium's log of its workers' errors, held back by
                # `_hold_worker_errors`)
                warnings.warn_explicit(WorkerLogWarning(str(message.message)), WorkerLogWarning, message.filename,
                                       message.lineno)
        self.close()
        self._failed = f"their {call} failed"
        if problem is not None:
            raise UserError(problem) from error

    def _finish_pending(self) -> None:
        """A KeyboardInterrupt between a subprocess env's step (or reset) and its answer (Jupyter's stop button during
        `learn`) leaves Gymnasium's AsyncVectorEnv waiting: its next step or reset raised AlreadyPendingCallError,
        so no further `learn` could run. The answer is collected here and dropped (the envs went on one step); where
        it does not come (the interrupt came while it was being read), one sentence says to make the env again."""
        inner = getattr(self.vector_env, "unwrapped", self.vector_env)
        state = getattr(inner, "_state", AsyncState.DEFAULT)
        if not isinstance(inner, gym.vector.AsyncVectorEnv) or state == AsyncState.DEFAULT:
            return
        waits = {AsyncState.WAITING_STEP: inner.step_wait, AsyncState.WAITING_RESET: inner.reset_wait,
                 AsyncState.WAITING_CALL: inner.call_wait}
        try:
            waits[state](timeout=PENDING_ANSWER_TIMEOUT_S)
        except Exception as error:  # noqa: BLE001 (a timeout or a broken pipe: the envs cannot go on)
            raise UserError(f"{self.spec.env_id}'s env subprocesses were interrupted in the middle of a "
                            f"{state.value} and do not answer ({type(error).__name__}): their episodes cannot go "
                            "on; make the model's envs again (a new model, or load it from its checkpoint).") from None

    def disrupted(self, interrupted: bool = False) -> str | None:
        """Why these subprocess envs (Gymnasium's AsyncVectorEnv) cannot go on as they are, or None where they are
        idle and whole (and for every other vector env). A KeyboardInterrupt inside a step (Jupyter's stop button
        signals the whole process group, the workers too) can leave some workers sent to or read from and others
        not, a call waiting for its answer, or workers stopped: their pipes are then out of step, and every further
        step fails. `interrupted` (a KeyboardInterrupt stopped their last use): not idle either, since a worker the
        signal reached may not have stopped or reported it yet. `Algorithm.make_training_env` makes such envs
        again, as it does envs closed after a failed step or reset (`_subprocess_failure`)."""
        if self._failed is not None:
            return self._failed
        inner = getattr(self.vector_env, "unwrapped", self.vector_env)
        if not isinstance(inner, gym.vector.AsyncVectorEnv) or inner.closed:
            return None
        if self._interrupted_call is not None:
            return f"a {self._interrupted_call} was interrupted part-way"
        if inner._state != AsyncState.DEFAULT:
            return f"a {inner._state.value} is waiting for its answer"
        stopped = [index for index, (pipe, process) in enumerate(zip(inner.parent_pipes, inner.processes))
                   if pipe is None or pipe.closed or not process.is_alive()]
        if stopped:
            return f"worker{'s' if len(stopped) > 1 else ''} {', '.join(map(str, stopped))} stopped"
        try:  # (an answer nobody asked for: a worker that stopped on a signal reports it before it exits)
            unread = [index for index, pipe in enumerate(inner.parent_pipes) if pipe.poll()]
        except (OSError, EOFError, ValueError):
            return "a worker's pipe is broken"
        if unread:
            return f"worker {unread[0]} sent an answer no call asked for"
        if interrupted:
            return "a KeyboardInterrupt stopped their last use and may have reached the workers too"
        return None

    def close(self) -> None:
        """Close the vector env (for async, its worker subprocesses too). Subprocesses left with a step pending,
        interrupted part-way or stopped already (a run stopped at once by a signal, which may have stopped them too;
        `disrupted`) are terminated without a word to them: a stopped worker's pipe raises, and Gymnasium would try
        again, with a traceback, at exit."""
        inner = getattr(self.vector_env, "unwrapped", self.vector_env)
        asynchronous = isinstance(inner, gym.vector.AsyncVectorEnv) and not inner.closed

        def terminate() -> None:
            inner._state = AsyncState.DEFAULT  # (Gymnasium's own flag of the pending call: nothing to wait for)
            self.vector_env.close(terminate=True)

        if asynchronous and self.disrupted() is not None:
            terminate()
            return
        try:
            if asynchronous:
                closed = inner.call("close_for_parent") if getattr(self, "_subprocess_wrapped", False) else ()
                self.vector_env.close()
                errors = [_worker_traced(*answer) for answer in closed if answer is not None]
                if not errors and (error := worker_exit_error(inner)) is not None:
                    errors = [error]
                if errors:
                    _close_failed(self.spec.env_id, "gymnasium-async", errors)
            else:
                close_envs(self.vector_env, self.spec.env_id)
        except (OSError, EOFError):  # (a worker a signal stopped while it was asked to close: the rest are ended)
            if not asynchronous or inner.closed:
                raise
            terminate()


def resting_rows_env(env) -> GymnasiumEnv | None:
    """The env in which an evaluation on `env` (wrappers, `.env`, around one env) leaves its rows whose first episode
    has ended unstepped (`GymnasiumEnv.rest_rows`): the innermost env, where it is a Gymnasium env stepped row by row in
    this process (`_step_sync`) without action masks; else None, and every row steps until the last first episode ends
    (native and EnvPool envs step all rows in one call, subprocess envs at once; an Atari game's lives, action masks
    and the wrappers of other envs are left as they were). The rows' envs are their own (their own random streams,
    their own `RecordEpisodeStatistics`), so a row's first episode is the same whether the others step or not."""
    while hasattr(env, "env"):
        env = env.env
    if type(env) is not GymnasiumEnv or env._sync_envs is None or env.has_action_masks:
        return None
    return env


@contextlib.contextmanager
def resting_finished_rows(env):
    """An evaluation's loop on `env` (reset already): yields the env whose `rest_rows` the loop gives its finished
    rows (`resting_rows_env`; None where every row steps), and steps every row again when it ends (an env the caller
    passed is left stepping all its rows)."""
    resting = resting_rows_env(env)
    try:
        yield resting
    finally:
        if resting is not None:
            resting.rest_rows(None)
