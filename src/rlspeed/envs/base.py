"""The batched env contract every rlspeed env and wrapper follows (docs/envs.md), and the observation spaces it
carries.

`reset(seed=None) -> (obs, info)` and `step(actions) -> (obs, reward, terminated, truncated, info)`, all torch
tensors on `env.device`: obs `[N, ...]` in their natural dtype (float32 vectors, uint8 images, bool grids, int64
indices of Discrete and MultiDiscrete observations, int8 MultiBinary ones; a dict of such tensors, one per key, for
Dict and Tuple spaces), reward float32 `[N]`, terminated/truncated bool `[N]`. Autoreset is SAME_STEP: a finished row
is already reset in the returned `obs`, and `info["final_obs"]` (same layout and dtypes as `obs`) holds, for every
row, the observation the action led to: the true last observation for finished rows, the same as `obs` for the
others. Bootstrapping a truncated episode reads it directly. Adapters that know on the host which rows finished
(Gymnasium's, SB3's, EnvPool's) also give `info["final_rows"]`, their indices as a numpy array (no device read): the
rows the env restarted, which a wrapper that ends episodes without a restart (Atari's lost life) leaves as they are.
Envs with action masks give `info["action_mask"]` for `obs`; the Gymnasium adapter also gives
`info["final_action_mask"]`, the mask at `final_obs` (so a truncated row's bootstrap respects it); where it is absent,
all actions count as allowed at a final observation.

Observations are stored in these dtypes (rollout and replay storage) and converted to float by the networks at their
input (`rlspeed.nn.make_encoder`), so an image costs one byte per pixel from the env to the first layer.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import numbers
import typing
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
import torch

from rlspeed.device import statistics_dtype
from rlspeed.env_options import tuple_paths, with_tuples
from rlspeed.errors import UserError

#: An observation batch: one tensor, or one tensor per key of a Dict (or Tuple) space.
Observation = torch.Tensor | dict[str, torch.Tensor]

#: Leaf spaces an observation may consist of (alone, or as the values of a Dict or Tuple).
_LEAF_SPACES = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)


def check_seed(seed, limit_bits: int = 32) -> int:
    """`seed` as an int; UserError unless it is a whole number below 2**`limit_bits`: a model's seed below 2**32,
    what Gymnasium's and numpy's seeding take; an evaluation's (a model's seed plus offsets) below 2**63 (a
    one-element tensor or a numpy integer counts as its value)."""
    if isinstance(seed, torch.Tensor) and seed.numel() == 1 and not seed.is_floating_point():
        seed = seed.item()  # ok-sync: a seed, once
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= int(seed) < 2**limit_bits:
        raise UserError(f"A seed is a whole number from 0 to 2**{limit_bits} - 1, not {seed!r}.")
    return int(seed)


def _leaf_dtype(space: gym.Space) -> torch.dtype:
    """The tensor dtype the env adapters give a leaf space's observations (see the module docstring)."""
    if isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)):
        return torch.int64
    if isinstance(space, gym.spaces.MultiBinary):
        return torch.int8
    dtype = np.dtype(space.dtype)
    if dtype == np.uint8:
        return torch.uint8
    if dtype == np.bool_:
        return torch.bool
    return torch.float32  # float Boxes of any width, and integer Boxes other than uint8


def _leaf_shape(space: gym.Space) -> tuple[int, ...]:
    if isinstance(space, gym.spaces.Discrete):
        return ()
    return tuple(int(d) for d in space.shape)


#: The attribute `check_observation_space` and `space_from_json` set on a Dict of an env's Dict whose keys are all
#: digits ("0", "1"), False: that Dict is not a Tuple's positions
_TUPLE_MARK = "rlspeed_tuple"


def tuple_positions(space: gym.Space) -> bool:
    """Whether `space` (as `check_observation_space` gives it) is a Tuple env's: a Dict whose keys are positions "0",
    "1", ... of the env's tuple observation (what `predict` takes a tuple for, and an export's sidecar names), and not
    an env's Dict of such keys (`_TUPLE_MARK` False; a file saved before it was recorded takes them for positions)."""
    return (isinstance(space, gym.spaces.Dict) and getattr(space, _TUPLE_MARK, True) is not False
            and all(key.isascii() and key.isdigit() for key in space.spaces))


def _dict_of_digits(space: gym.spaces.Dict) -> gym.spaces.Dict:
    """`space`, an env's Dict (not a Tuple's), marked as such where its keys are all digits (`tuple_positions`)."""
    if all(key.isascii() and key.isdigit() for key in space.spaces):
        setattr(space, _TUPLE_MARK, False)
    return space


def observation_layout(space: gym.Space) -> tuple | dict[str, tuple]:
    """(shape, torch dtype) of one observation of `space` as the env adapters give it; for a Dict space, a dict of
    those per key (the space must have passed `check_observation_space`)."""
    if isinstance(space, gym.spaces.Dict):
        return {key: (_leaf_shape(sub), _leaf_dtype(sub)) for key, sub in space.spaces.items()}
    return _leaf_shape(space), _leaf_dtype(space)


_NUMPY_DTYPES: dict[torch.dtype, np.dtype] = {}  # (numpy_dtype's, found once per dtype)


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype of a torch dtype (for the host arrays the env adapters fill)."""
    found = _NUMPY_DTYPES.get(dtype)
    if found is None:  # (a dtype numpy has no match for, bfloat16, raises here every time)
        found = _NUMPY_DTYPES[dtype] = torch.empty((), dtype=dtype, device="cpu").numpy().dtype
    return found


def _describe(space: gym.Space) -> str:
    return type(space).__name__


def foreign_space_problem(space, env_id: str, what: str) -> str | None:
    """One sentence where `space` (an env's `what`, "observation" or "action" space), or a part of a Dict or Tuple of
    Gymnasium's, is no Gymnasium space; None where it is one. The gym package's spaces (research code written for the
    old gym API) are told apart: they look the same and have the same names, so an isinstance check of Gymnasium's
    refuses them with a message naming their own class ("a Box space ... convert it to Box")."""
    parts = [space]
    if isinstance(space, gym.spaces.Dict):
        parts += list(space.spaces.values())
    elif isinstance(space, gym.spaces.Tuple):
        parts += list(space.spaces)
    foreign = next((part for part in parts if not isinstance(part, gym.spaces.Space)), None)
    if foreign is None:
        return None
    kind = type(foreign)
    where = "" if foreign is space else f" inside its {type(space).__name__}"
    if kind.__module__.split(".")[0] == "gym":
        return (f"'{env_id}' has {what} space{where} of the old gym package ({kind.__module__}."
                f"{kind.__name__}), not of Gymnasium: build it with gymnasium.spaces (the same classes and "
                "arguments), or, where all its spaces are gym's, wrap the env in Shimmy's "
                "GymV26CompatibilityV0(env=env), which converts them (GymV21CompatibilityV0 for an env whose step "
                "returns (obs, reward, done, info)).")
    return (f"'{env_id}' has {what} space{where} of type {kind.__module__}.{kind.__name__}, which is no Gymnasium "
            "space: give the env spaces of gymnasium.spaces (Box, Discrete, MultiDiscrete, MultiBinary, Dict, "
            "Tuple).")


_WARNED_DROPPED: set[tuple[str, tuple[str, ...]]] = set()  # (env id, dropped keys) warned about in this process


def check_observation_space(space: gym.Space, env_id: str) -> gym.Space:
    """The observation space rlspeed trains on for an env's `space`, or UserError in one sentence naming the space and
    the fix.

    Box, Discrete, MultiDiscrete and MultiBinary spaces are taken as they are. A Dict is taken one level deep: its keys
    must be text and hold those spaces; a key holding anything else that cannot be encoded as numbers (MiniGrid's
    `mission` text, a Text, Graph or Sequence space) is dropped, with one warning naming the keys (once per env id and
    process). A Tuple becomes a Dict with keys "0", "1", ... A Dict or Tuple inside a Dict or Tuple, and Text, Graph
    or Sequence spaces alone, are refused, and so is a space that is no Gymnasium space (the old gym package's:
    `foreign_space_problem`).
    """
    problem = foreign_space_problem(space, env_id, "an observation")
    if problem:
        raise UserError(problem)
    if isinstance(space, _LEAF_SPACES):
        if isinstance(space, gym.spaces.Box) and space.shape is not None and 0 in space.shape:
            raise UserError(f"'{env_id}' has an empty Box observation space {space.shape}: nothing to learn from.")
        if isinstance(space, gym.spaces.Box) and space.shape == ():
            raise UserError(f"'{env_id}' has a scalar Box observation space (shape ()); give it one axis with "
                            "gymnasium.wrappers.ReshapeObservation(env, (1,)).")
        return space
    if isinstance(space, gym.spaces.Dict) and not all(isinstance(key, str) for key in space.spaces):
        # (saved models, config and exports name each part by its text key; the env's own observation would not
        # match them)
        keys = ", ".join(repr(key) for key in space.spaces if not isinstance(key, str))
        raise UserError(f"'{env_id}' has a Dict observation space with keys that are not text ({keys}); rlspeed "
                        "names each part of an observation by its key in saved models and exports: make them text "
                        "with a gymnasium.ObservationWrapper (its observation_space and observation() keyed "
                        "str(key)).")
    if isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
        items = (space.spaces.items() if isinstance(space, gym.spaces.Dict)
                 else ((str(i), sub) for i, sub in enumerate(space.spaces)))
        kept, dropped = {}, []
        for key, sub in items:
            if isinstance(sub, (gym.spaces.Dict, gym.spaces.Tuple)):
                raise UserError(f"'{env_id}' has a nested {_describe(sub)} space under the observation key '{key}'; "
                                "rlspeed encodes Dict and Tuple observations one level deep: flatten the inner keys "
                                "with a gymnasium.ObservationWrapper (e.g. gymnasium.wrappers.FlattenObservation "
                                "on that part).")
            if isinstance(sub, gym.spaces.Box) and sub.shape == ():  # (the key named; no Dict-wide reshape fits)
                raise UserError(f"'{env_id}' has a scalar Box (shape ()) under the observation key '{key}'; give it "
                                "one axis with a gymnasium.ObservationWrapper (that key's value reshaped to (1,), its "
                                "space Box(low, high, (1,))).")
            if isinstance(sub, _LEAF_SPACES):
                kept[str(key)] = check_observation_space(sub, env_id)
            else:
                dropped.append(f"'{key}' ({_describe(sub)})")
        if not kept:
            raise UserError(f"'{env_id}' has a {_describe(space)} observation space with no key rlspeed can encode "
                            f"({', '.join(dropped)}); encode the observation as Box, Discrete, MultiDiscrete or "
                            "MultiBinary with a gymnasium.ObservationWrapper.")
        if dropped and (env_id, tuple(dropped)) not in _WARNED_DROPPED:
            _WARNED_DROPPED.add((env_id, tuple(dropped)))
            warnings.warn(f"'{env_id}': the observation key{'s' if len(dropped) > 1 else ''} {', '.join(dropped)} "
                          "cannot be encoded as numbers and is left out of what the policy sees (encode it with a "
                          "gymnasium.ObservationWrapper to use it).", stacklevel=3)
        checked = gym.spaces.Dict(kept)
        return _dict_of_digits(checked) if isinstance(space, gym.spaces.Dict) else checked
    raise UserError(f"'{env_id}' has a {_describe(space)} observation space, which no rlspeed encoder handles; "
                    "convert it to Box, Discrete, MultiDiscrete, MultiBinary or a Dict of those with a "
                    "gymnasium.ObservationWrapper (for text: a tokenizer into a Box or MultiDiscrete).")


def map_obs(fn: Callable[[torch.Tensor], torch.Tensor], obs: Observation) -> Observation:
    """`fn` applied to an observation batch: to the tensor, or to each tensor of a dict."""
    if isinstance(obs, dict):
        return {key: fn(value) for key, value in obs.items()}
    return fn(obs)


def obs_batch_size(obs: Observation) -> int:
    """The leading (batch) size of an observation batch."""
    return next(iter(obs.values())).shape[0] if isinstance(obs, dict) else obs.shape[0]


# --- spaces as JSON (checkpoint metadata, export sidecars) ----------------------------------------------------
def mask_size(space: gym.Space) -> int | None:
    """Width of an action mask for this action space: n (Discrete), sum(nvec) (MultiDiscrete: the components' masks
    concatenated, as sb3-contrib's `MaskablePPO` lays them out); None for spaces that take no mask."""
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return int(space.nvec.sum())
    return None


def space_to_json(space: gym.Space) -> dict:
    """A space as a strict-JSON-ready dict (checkpoints, export sidecars): Discrete, Box (with its dtype; unbounded
    entries as null), MultiDiscrete, MultiBinary, and Dict or Tuple of those; UserError for other spaces."""
    if isinstance(space, gym.spaces.Discrete):
        data = {"type": "discrete", "n": int(space.n)}
        return {**data, "start": int(space.start)} if int(space.start) != 0 else data
    if isinstance(space, gym.spaces.Box):
        return {"type": "box", "shape": list(space.shape), "low": _bounds_to_json(space.low),
                "high": _bounds_to_json(space.high), "dtype": np.dtype(space.dtype).name}
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {"type": "multi_discrete", "nvec": space.nvec.tolist(), "start": space.start.tolist()}
    if isinstance(space, gym.spaces.MultiBinary):
        return {"type": "multi_binary", "n": np.asarray(space.n).tolist()}
    if isinstance(space, gym.spaces.Dict):
        data = {"type": "dict", "spaces": {str(key): space_to_json(sub) for key, sub in space.spaces.items()}}
        # (an env's Dict of keys "0", "1", ...: not a Tuple's positions, which such keys are taken for without it)
        return {**data, "tuple": False} if getattr(space, _TUPLE_MARK, None) is False else data
    if isinstance(space, gym.spaces.Tuple):
        return {"type": "tuple", "spaces": [space_to_json(sub) for sub in space.spaces]}
    raise UserError(f"Unsupported space {space}: rlspeed records Discrete, Box, MultiDiscrete, MultiBinary, Dict and "
                    "Tuple spaces.")


def space_from_json(data: dict) -> gym.Space:
    """The space `space_to_json` wrote (a Box with its dtype; float32 for checkpoints that did not record one)."""
    kind = data["type"]
    if kind == "discrete":
        return gym.spaces.Discrete(data["n"], start=data.get("start", 0))
    if kind == "multi_discrete":
        return gym.spaces.MultiDiscrete(np.array(data["nvec"], dtype=np.int64),
                                        start=np.array(data.get("start", 0), dtype=np.int64))
    if kind == "multi_binary":
        return gym.spaces.MultiBinary(data["n"])
    if kind == "dict":
        space = gym.spaces.Dict({key: space_from_json(sub) for key, sub in data["spaces"].items()})
        return _dict_of_digits(space) if data.get("tuple") is False else space
    if kind == "tuple":
        return gym.spaces.Tuple([space_from_json(sub) for sub in data["spaces"]])
    dtype = np.dtype(data.get("dtype", "float32"))
    shape = tuple(data["shape"])
    low, high = (np.broadcast_to(_bounds_from_json(data[key], unbounded, dtype), shape).copy()
                 for key, unbounded in (("low", -np.inf), ("high", np.inf)))
    return gym.spaces.Box(low, high, shape, dtype=dtype)


def _bounds_to_json(bounds: np.ndarray) -> list | float | int | None:
    """A Box bound as strict JSON: unbounded (infinite) entries as null; one value where every entry has it (an
    image's 0 and 255: not one per pixel). A float32 or float16 bound is written as the shortest decimal that reads
    back as the same value in its dtype (CartPole's 4.8, not 4.800000190734863)."""
    values = bounds.astype(object)
    if np.issubdtype(bounds.dtype, np.floating):
        if bounds.dtype.itemsize < 8:
            distinct, where = np.unique(bounds.reshape(-1), return_inverse=True)  # (an image's: one or two values)
            shortest = np.array([float(np.format_float_positional(value, unique=True)) for value in distinct],
                                dtype=object)
            values = shortest[where].reshape(bounds.shape)
        values[~np.isfinite(bounds)] = None
    flat = values.ravel().tolist()
    if flat and all(value == flat[0] for value in flat) and bounds.ndim > 0 and bounds.size > 1:
        return flat[0]
    return values.tolist()


def _bounds_from_json(values, unbounded: float, dtype: np.dtype) -> np.ndarray:
    """`_bounds_to_json`'s list (or one value for every entry) back as an array (null: `unbounded`; older files'
    infinities are read as they are); the Box broadcasts one value to its shape."""
    array = np.array(values, dtype=object)
    array[np.equal(array, None)] = unbounded
    return array.astype(dtype)


def recorded_env_kwargs(spec: EnvSpec) -> dict:
    """The env options a checkpoint records (`spec.env_kwargs`): those strict JSON gives back as they are (with
    their tuples: `tuple_paths`), with a warning naming the others (a loaded model then makes its env without them):
    one that is not JSON, or that JSON changes (a dict key that is not text comes back as text)."""
    kept = {}
    for key, value in spec.env_kwargs.items():
        try:
            back = with_tuples(json.loads(json.dumps(value, allow_nan=False)), tuple_paths(value))
            why = None if back == value else f"JSON gives it back as {back!r:.60}"
        except (TypeError, ValueError):
            why = "not JSON"
        if why is None:
            kept[key] = value
            continue
        text = repr(value)  # (a DataFrame's or an array's is many lines: its type says what it is)
        shown = f"{key}={text:.60}" if "\n" not in text else f"{key} (a {type(value).__name__})"
        warnings.warn(f"The env option {shown} cannot be saved in a checkpoint ({why}): a loaded model makes "
                      f"{spec.env_id} without it (give it again: load(path, env_kwargs={{{key!r}: ...}})).",
                      stacklevel=3)
    return kept


def space_text(space: gym.Space) -> str:
    """A space as one line for a message: Gymnasium's repr, whose per-component bounds NumPy wraps over lines
    (shown as literal '\\n' in the command line's one-line errors); a Box of more than 8 components with bounds per
    component says so instead of listing them (BipedalWalker's 24 observations). A Tuple env's space, kept as a Dict of
    its positions (`tuple_positions`), is the Tuple the env gave (an element no encoder takes, dropped, leaves its
    position out: the others are said with theirs)."""
    if tuple_positions(space):
        parts = sorted(space.spaces.items(), key=lambda item: int(item[0]))
        whole = [int(key) for key, _ in parts] == list(range(len(parts)))
        return "Tuple(" + ", ".join(space_text(sub) if whole else f"{key}: {space_text(sub)}"
                                    for key, sub in parts) + ")"
    if (isinstance(space, gym.spaces.Box) and space.low.size > 8
            and not (np.all(space.low == space.low.flat[0]) and np.all(space.high == space.high.flat[0]))):
        return f"Box({space.shape}, {space.dtype}, bounds per component)"
    return " ".join(str(space).split())


def registered_variant(env_id: str, env_kwargs: dict | None, time_limit: bool = True) -> str | None:
    """The other id Gymnasium registers as `gymnasium.make(env_id, **env_kwargs)`: the same entry point, kwargs (an
    option at its constructor's default is the same as none) and time limit (LunarLander-v3 with continuous=True is
    LunarLanderContinuous-v3, whose presets and reward threshold are then the task's; LunarLanderContinuous-v3 with
    continuous=False is LunarLander-v3), else None (no options, an id Gymnasium does not register, or a variant it
    has no id for: BipedalWalker-v3 with hardcore=True keeps a time limit of 1,600 steps where
    BipedalWalkerHardcore-v3 has 2,000, which `time_limit` False does not compare: it finds an id the options make but
    for the time limit, not one that differs from `env_id` in its time limit only, as CartPole-v0 from CartPole-v1)."""
    task = _registered_task(env_id, env_kwargs) if env_kwargs else None
    if task is None:
        return None
    spec, options, max_steps, own = task
    defaults = constructor_defaults(spec.entry_point)
    kwargs = {**own, **options}
    for other_id, other in gym.registry.items():
        try:  # (an option's value may not compare to a bool, as a NumPy array's does not)
            same = (other_id != spec.id and other.entry_point == spec.entry_point
                    and (other.max_episode_steps == max_steps
                         or not (time_limit or {**defaults, **(other.kwargs or {})} == own))
                    and {**defaults, **(other.kwargs or {})} == kwargs
                    and tuple(other.additional_wrappers or ()) == tuple(spec.additional_wrappers or ()))
        except (ValueError, TypeError):
            same = False
        if same:
            return other_id
    return None


def same_task(env_id: str, env_kwargs: dict | None) -> bool:
    """Whether `gymnasium.make(env_id, **env_kwargs)` makes `env_id`'s own task: each option at the value the id
    registers (or its constructor's default), `render_mode` aside (how the env is shown, not which task it is), and
    the id's time limit; False for an id Gymnasium does not register."""
    task = _registered_task(env_id, env_kwargs)
    if task is None:
        return False
    spec, options, max_steps, own = task
    if max_steps != spec.max_episode_steps:
        return False
    try:  # (an option's value may not compare to a bool, as a NumPy array's does not)
        return all(key in own and bool(own[key] == value) for key, value in options.items())
    except (ValueError, TypeError):
        return False


def _registered_task(env_id: str, env_kwargs: dict | None) -> tuple | None:
    """For `gymnasium.make(env_id, **env_kwargs)`: (the id's spec, the options less `gymnasium.make`'s own
    `max_episode_steps` and `render_mode` (how the env is shown, not which task it is), the time limit they make, the
    values the id registers over its constructor's defaults); None for an id Gymnasium does not register."""
    try:
        spec = gym.spec(env_id)
    except Exception:  # (not a registered id: a user's vector env, a module:EnvId not imported)
        return None
    options = dict(env_kwargs or {})
    max_steps = time_limit_option(options, spec.max_episode_steps)
    options.pop("max_episode_steps", None)
    options.pop("render_mode", None)
    return spec, options, max_steps, {**constructor_defaults(spec.entry_point), **(spec.kwargs or {})}


#: the `max_episode_steps` option with which `gymnasium.make` leaves the time limit out (Gymnasium's own value)
NO_TIME_LIMIT = -1


def time_limit_option(env_kwargs: dict, registered: int | None) -> int | None:
    """The time limit of an env made with the options `env_kwargs` (`gymnasium.make(env_id, **env_kwargs)`) whose
    id registers `registered`: `max_episode_steps` where given, none for `NO_TIME_LIMIT`, the registered one where it
    is left out or None (as `gymnasium.make` reads the option)."""
    limit = env_kwargs.get("max_episode_steps")
    if limit is None:
        return registered
    return None if limit == NO_TIME_LIMIT else limit


def constructor_parameters(entry_point) -> list[inspect.Parameter]:
    """The parameters of a registered env's constructor (`gym.spec(id).entry_point`); [] where it cannot be loaded
    or inspected (its package missing: Box2D's envs without box2d)."""
    try:
        creator = gym.envs.registration.load_env_creator(entry_point) if isinstance(entry_point, str) else entry_point
        return list(inspect.signature(creator).parameters.values())
    except Exception:
        return []


def constructor_defaults(entry_point) -> dict:
    """The keyword defaults of a registered env's constructor (`constructor_parameters`); {} where it has none or
    cannot be inspected."""
    return {p.name: p.default for p in constructor_parameters(entry_point) if p.default is not inspect.Parameter.empty}


@dataclass(frozen=True)
class EnvSpec:
    """What algorithms need to know about an env, independent of its backend.

    `env_id`: the env's id (what `make_env` makes it from again). `observation_space` is the space the networks and
    storage are built for (`check_observation_space`'s result); without one, a float32 Box of `observation_shape`
    (the native envs). `observation_shape` is the shape of one observation of a Box or MultiDiscrete/MultiBinary
    space, () for Discrete and Dict ones. `action_space`: one env's action space. `max_episode_steps`: the time
    limit (None: none); `reward_threshold`: the registered task's solved return (None: none). `env_kwargs`: the
    options the env was made with (`make_env(env_id, **env_kwargs)`, `PPO(env_id, env_kwargs=...)`), what
    evaluation, videos and a loaded model make the env with again.
    """

    env_id: str
    observation_shape: tuple[int, ...]
    action_space: gym.Space
    max_episode_steps: int | None
    reward_threshold: float | None
    observation_space: gym.Space | None = None
    #: the options the env was made with (`make_env(env_id, **env_kwargs)`, `PPO(env_id, env_kwargs=...)`): what
    #: evaluation, videos and a loaded model make the env with again
    env_kwargs: dict[str, typing.Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.observation_space is None:
            space = gym.spaces.Box(-np.inf, np.inf, tuple(self.observation_shape), np.float32)
            object.__setattr__(self, "observation_space", space)

    @classmethod
    def from_spaces(cls, env_id: str, observation_space: gym.Space, action_space: gym.Space,
                    max_episode_steps: int | None, reward_threshold: float | None) -> EnvSpec:
        """The spec of an env with these spaces (the observation space checked and normalised by
        `check_observation_space`: UserError for one no encoder handles)."""
        space = check_observation_space(observation_space, env_id)
        shape = () if isinstance(space, (gym.spaces.Dict, gym.spaces.Discrete)) else tuple(space.shape)
        return cls(env_id, shape, action_space, max_episode_steps, reward_threshold, space)

    def with_options(self, env_kwargs: dict[str, typing.Any] | None) -> EnvSpec:
        """This spec for the env made with the Gymnasium options `env_kwargs` (itself without any): the options
        recorded, the time limit a `max_episode_steps` option sets, and no reward threshold (the registered env's
        says nothing of a variant), unless the options make another registered id (`registered_variant`), whose
        threshold is the task's, or the id's own task (`same_task`: `render_mode`, options at their registered
        values), whose threshold stays."""
        if not env_kwargs:
            return self
        variant = registered_variant(self.env_id, env_kwargs)
        threshold = (gym.spec(variant).reward_threshold if variant
                     else self.reward_threshold if same_task(self.env_id, env_kwargs) else None)
        return dataclasses.replace(self, env_kwargs=dict(env_kwargs), reward_threshold=threshold,
                                   max_episode_steps=time_limit_option(env_kwargs, self.max_episode_steps))

    @functools.cached_property
    def observation_layout(self) -> tuple | dict[str, tuple]:
        """`observation_layout(self.observation_space)`, found once per spec (what `predict` checks each
        observation against)."""
        return observation_layout(self.observation_space)

    @property
    def discrete(self) -> bool:
        return isinstance(self.action_space, gym.spaces.Discrete)

    @property
    def float_vector_obs(self) -> bool:
        """Whether observations are one float tensor (the plain-MLP case, flattened as they are)."""
        space = self.observation_space
        return isinstance(space, gym.spaces.Box) and _leaf_dtype(space) == torch.float32

    @property
    def obs_dim(self) -> int:
        """Size of a flattened observation (what an MLP takes when the observations are float vectors)."""
        return int(torch.Size(self.observation_shape).numel())

    @property
    def action_dim(self) -> int:
        """Number of discrete actions, or the size of a Box action."""
        if self.discrete:
            return int(self.action_space.n)
        return int(torch.Size(self.action_space.shape).numel())


#: Stable-Baselines3 VecEnv members a batched env lacks (`BatchedEnv.__getattr__` says where the env adapted has them)
_SB3_VEC_ENV_MEMBERS = frozenset({"get_attr", "set_attr", "env_method", "envs", "step_async", "step_wait",
                                  "get_images", "env_is_wrapped", "set_options"})


#: what a batched env's `reset` returns: (obs, info)
ResetResult: typing.TypeAlias = tuple[torch.Tensor, dict[str, typing.Any]]
#: what a batched env's `step` returns: (obs, reward, terminated, truncated, info)
StepResult: typing.TypeAlias = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, typing.Any]]


class BatchedEnv:
    """Base class of batched envs: N copies of one task stepped together, tensors in and out on `device`."""

    spec: EnvSpec
    num_envs: int
    device: torch.device
    backend: str
    #: What this env has in place of a Stable-Baselines3 VecEnv's env objects (`__getattr__` says it), where it adapts
    #: none (no `vec_env` or `vector_env`)
    without_env_objects = "this one has no env objects of its own to reach"
    #: Whether a finite reward the env returned was past float32's range (about 3.4e38) and became infinite in the
    #: float32 rlspeed keeps rewards in (set by the adapters of float64 rewards: Gymnasium, SB3, EnvPool; cleared by
    #: the NaN guard, `clear_reward_flags`, as `rewards_nan` is)
    rewards_overflowed = False
    #: Whether a reward was NaN as the adapter received it (set by `float32_rewards`), and what such a NaN may have been
    #: where a vector env the adapter wraps stored the env's reward before it saw it (SB3's VecEnvs: a reward of None
    #: becomes NaN there), added to the NaN guard's refusal; "" where a NaN reward is the env's own
    rewards_nan = False
    nan_reward_cause = ""

    def reset(self, seed: int | None = None) -> tuple[torch.Tensor, dict[str, typing.Any]]:
        """Start new episodes in all N envs (reseeding them first when `seed` is given).

        Returns (obs, info): obs `[N, ...]` on `device` in the observation's dtype (module docstring), info a dict
        (empty for the built-in envs).
        """
        raise NotImplementedError

    def step(self, actions: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, typing.Any]]:
        """Step all N envs with one action per env (`[N]` for Discrete, `[N, *shape]` for Box).

        Returns (obs, reward, terminated, truncated, info), tensors on `device`: obs `[N, ...]` (in its dtype), reward
        float32 `[N]`, terminated and truncated bool `[N]`. Autoreset is SAME_STEP: finished rows of `obs` are already
        reset, and `info["final_obs"]` (laid out as `obs`) holds the observation each action led to, the true last one
        for finished rows.
        """
        raise NotImplementedError

    def close(self) -> None:
        """Release subprocesses or other resources (no-op by default)."""

    def disrupted(self, interrupted: bool = False) -> str | None:
        """Why this env cannot go on stepping as it is (subprocesses an interrupt left out of step with their pipes,
        or stopped), or None (by default: nothing to check). `interrupted`: a KeyboardInterrupt stopped its last use
        (subprocess envs then answer that the signal may have reached their workers too). A model's envs found so are
        made again on its next `learn` (`Algorithm.make_training_env`, which asks the innermost env:
        `env.unwrapped.disrupted(...)`)."""
        return None

    def state_dict(self) -> dict[str, torch.Tensor] | None:
        """Everything needed to continue exactly where the env is now, as tensors (native envs: physical state,
        step counters and random streams), or None when the backend cannot restore its episodes in progress
        (Gymnasium and Stable-Baselines3 envs: a resumed run starts them afresh)."""
        return None

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore what `state_dict` returned (same kind of env, same `num_envs`)."""
        raise NotImplementedError(f"{type(self).__name__} cannot restore its state.")

    @property
    def single_observation_space(self) -> gym.Space:
        return self.spec.observation_space

    @property
    def single_action_space(self) -> gym.Space:
        return self.spec.action_space

    @property
    def unwrapped(self) -> BatchedEnv:
        return self

    if not typing.TYPE_CHECKING:  # (else type checkers type a misspelt attribute as Any instead of reporting it)
        def __getattr__(self, name: str):
            # (only for names not found, here innermost: SB3's VecEnv members say where the env this one adapts has
            # them; the two spaces, which Gymnasium's vector envs and SB3's VecEnvs give with different meanings, say
            # the name that has one)
            if name in ("observation_space", "action_space"):
                raise AttributeError(f"an rlspeed env has no {name} (a Gymnasium vector env's is the batched space, a "
                                     f"Stable-Baselines3 VecEnv's one env's): env.single_{name} is one env's space, "
                                     "and env.num_envs the number of envs.")
            if name not in _SB3_VEC_ENV_MEMBERS:
                raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")
            own = object.__getattribute__(self, "__dict__")
            where = next((f"the {kind} this one adapts is env.unwrapped.{field} (a callback's "
                          f"self.training_env.unwrapped.{field})" for field, kind in
                          (("vec_env", "Stable-Baselines3 VecEnv"), ("vector_env", "Gymnasium vector env"))
                          if field in own), self.without_env_objects)
            raise AttributeError(f"{name} is Stable-Baselines3's VecEnv's; an rlspeed env is batched (tensors in and "
                                 f"out), and {where}.")

    def __enter__(self) -> BatchedEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EnvWrapper(BatchedEnv):
    """A batched env that forwards to an inner one; subclasses change obs, reward or info."""

    _training = True  # this wrapper's own flag behind `training`
    #: an env of the user's own wrapped in this class is counted (`counted`) under it, not around it: rlspeed's
    #: normalisation wrappers, whose changed rewards are not the episodes' returns
    counted_beneath = False

    def __init__(self, env: BatchedEnv):
        self.env = env
        self.spec = env.spec
        self.num_envs = env.num_envs
        self.device = env.device
        self.backend = env.backend

    def reset(self, seed: int | None = None) -> ResetResult:
        """Reset the inner env (unchanged here; subclasses add their own work)."""
        return self.env.reset(seed=seed)

    def step(self, actions: torch.Tensor) -> StepResult:
        """Step the inner env (unchanged here; subclasses change obs, reward or info)."""
        return self.env.step(actions)

    def close(self) -> None:
        """Close the inner env."""
        self.env.close()

    def state_dict(self) -> dict[str, torch.Tensor] | None:
        """The inner env's state plus this wrapper's own (`_own_state`, keys prefixed with the class name); None when
        the inner env's cannot be restored."""
        inner = self.env.state_dict()
        if inner is None:
            return None
        prefix = type(self).__name__ + "."
        return {**inner, **{prefix + key: value for key, value in self._own_state().items()}}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore the inner env's state, then this wrapper's own."""
        self.env.load_state_dict(state)
        prefix = type(self).__name__ + "."
        own = {key[len(prefix):]: value for key, value in state.items() if key.startswith(prefix)}
        if own:
            self._load_own_state(own)

    def _own_state(self) -> dict[str, torch.Tensor]:
        """This wrapper's running tensors that exact resume needs (none by default)."""
        return {}

    def _load_own_state(self, state: dict[str, torch.Tensor]) -> None:
        for key, value in state.items():
            getattr(self, key).copy_(value)

    @property
    def unwrapped(self) -> BatchedEnv:
        return self.env.unwrapped

    @property
    def training(self) -> bool:
        """Whether the statistics of the normalisation wrappers are updated (True until set otherwise).

        Setting it on a wrapper sets it on every wrapper inside too, so `env.training = False` on what `make_env`
        returns freezes both observation and reward statistics. Reading it gives False when this wrapper or any
        wrapper inside it is frozen.
        """
        inner = self.__dict__.get("env")
        return self._training and (inner.training if isinstance(inner, EnvWrapper) else True)

    @training.setter
    def training(self, value: bool) -> None:
        self._training = bool(value)
        inner = self.__dict__.get("env")  # (a subclass may set it before EnvWrapper.__init__ has run)
        if isinstance(inner, EnvWrapper):
            inner.training = value

    @property
    def state(self):
        """The innermost env's settable state (native envs), so `env.state = x` works through wrappers."""
        return self.env.state

    @state.setter
    def state(self, value) -> None:
        self.env.state = value

    def __getattr__(self, name: str) -> typing.Any:
        # Only called when normal lookup fails: expose the inner env's extras (e.g. `state`).
        if name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)


class ContractCheck(EnvWrapper):
    """A batched env of the user's own (not one `make_env` made), checked against the contract of `BatchedEnv` on
    its first reset and its first `CHECKED_STEPS` steps: tensors on its device, observations `[N, ...]` (a Dict
    space's: a dict of its keys) in the observation space's dtype, float32 rewards `[N]`, bool `terminated` and
    `truncated` `[N]`, `info["final_obs"]` laid out as the observations, and no tensor of an earlier step written
    over (an env writing every step into one tensor, or a few in turn, would hand the learner its next observation as
    the previous one, and the off-policy algorithms keep several steps' tensors before storing them; a constant tensor
    returned again, never written, is fine). A break is one UserError naming it, instead of an error from deep inside
    training or, worse, training on wrong data. Later steps go through unchecked.

    `checked_steps` (at least `CHECKED_STEPS`) may be raised by the model before training: to the steps whose tensors
    it holds at once (an off-policy collection's)."""

    CHECKED_STEPS = 3

    def __init__(self, env: BatchedEnv):
        super().__init__(env)
        self.device = torch.device(env.device)  # (an env may name its device as a string)
        self._steps = 0
        self.checked_steps = self.CHECKED_STEPS
        # the tensors the checked steps returned, by storage address (held: a freed tensor's address may be reused),
        # each with a copy of what it held then
        self._held: dict[int, tuple[str, torch.Tensor, torch.Tensor]] = {}
        self._layout = observation_layout(env.spec.observation_space)

    def _refuse(self, what: str) -> None:
        raise UserError(f"{type(self.env).__name__} (a batched env of your own) {what}; the contract is "
                        "rlspeed.envs.base.BatchedEnv's (reset and step docstrings).")

    def _check_obs(self, obs, where: str) -> None:
        keyed = isinstance(self._layout, dict)
        if isinstance(obs, dict) != keyed:
            self._refuse(f"returned {where}'s observations as {type(obs).__name__}, not "
                         + ("a dict of its Dict observation space's keys" if keyed else "a torch.Tensor"))
        if keyed and set(obs) != set(self._layout):
            self._refuse(f"returned {where}'s observations with the keys {sorted(map(str, obs))}, not its Dict "
                         f"observation space's {sorted(self._layout)}")
        parts = obs.items() if keyed else [("", obs)]
        layouts = self._layout if keyed else {"": self._layout}
        for key, value in parts:
            shape, dtype = layouts.get(key, (None, None))
            name = f"{where}'s observations" + (f" [{key!r}]" if key else "")
            if not isinstance(value, torch.Tensor):
                self._refuse(f"returned {name} as {type(value).__name__}, not a torch.Tensor")
            if not _same_device(value.device, self.device):
                self._refuse(f"returned {name} on {value.device}, not on its device {self.device}")
            self._refuse_grad(value, name)
            if shape is not None and tuple(value.shape) != (self.num_envs, *shape):
                self._refuse(f"returned {name} of shape {tuple(value.shape)}, not {(self.num_envs, *shape)}")
            if dtype is not None and value.dtype != dtype:
                self._refuse(f"returned {name} as {value.dtype}, not {dtype} (the dtype the contract keeps its "
                             f"observation space's values in)")

    def _check_flags(self, value, name: str, dtype: torch.dtype) -> None:
        if (not isinstance(value, torch.Tensor) or tuple(value.shape) != (self.num_envs,) or value.dtype != dtype
                or not _same_device(value.device, self.device)):
            got = (f"{value.dtype} {tuple(value.shape)} on {value.device}" if isinstance(value, torch.Tensor)
                   else type(value).__name__)
            self._refuse(f"returned {name} as {got}, not {dtype} [{self.num_envs}] on {self.device}")
        self._refuse_grad(value, name)

    def _refuse_grad(self, value: torch.Tensor, name: str) -> None:
        """The refusal of tensors `name` where they require grad: an env returns them detached."""
        if value.requires_grad:
            self._refuse(f"returned {name} requiring grad: return them detached (compute them under torch.no_grad())")

    def reset(self, seed: int | None = None) -> ResetResult:
        """Reset the inner env; its first reset is checked."""
        obs, info = self.env.reset(seed=seed)
        if self._steps == 0:
            self._check_obs(obs, "reset()")
            self._held = {}
            self._hold({"observations": obs})
        return obs, info

    def step(self, actions: torch.Tensor) -> StepResult:
        """Step the inner env with a copy of `actions` (the learner stores its own: an env clamping or writing into
        the actions it is given in place changes only the copy); its first `checked_steps` steps are checked."""
        obs, reward, terminated, truncated, info = self.env.step(actions.clone())
        if self._steps < self.checked_steps:
            self._steps += 1
            self._check_obs(obs, "step()")
            self._check_flags(reward, "rewards", torch.float32)
            self._check_flags(terminated, "terminated", torch.bool)
            self._check_flags(truncated, "truncated", torch.bool)
            if "final_obs" not in info:
                self._refuse("gave no info['final_obs'] (each row's observation before any reset: for finished rows "
                             "their true last one)")
            self._check_obs(info["final_obs"], "step()'s info['final_obs']")
            final = info["final_obs"]
            returned = {"observations": obs, "rewards": reward, "terminated": terminated, "truncated": truncated}
            if final is not obs:  # (a step where no row finished may hand `obs` itself as final_obs)
                returned["info['final_obs']"] = final
            # an earlier step's tensor whose values changed was written over (a constant one returned again is not).
            # Each step compares the held tensors whose storage came back in it (an env writing into one tensor, or a
            # few in turn); steps 1, 2, 4, 8, ... and the last checked one compare them all (any other write: found
            # within twice the steps it took), so that the check's time grows with the steps held, not its square.
            last = self._steps == self.checked_steps
            every = last or (self._steps & (self._steps - 1)) == 0
            again = [self._held[address] for address in dict.fromkeys(
                tensor.data_ptr() for value in returned.values()
                for tensor in (value.values() if isinstance(value, dict) else (value,))) if address in self._held]
            written = [name for name, tensor, then in (self._held.values() if every else again)
                       if not _unchanged(tensor, then)]
            if written:
                self._refuse(f"wrote over {written[0]} it returned on an earlier step (in place): return fresh "
                             "tensors each step, since the learner keeps earlier steps' tensors")
            self._hold(returned)
            if last:
                self._held.clear()
        return obs, reward, terminated, truncated, info

    def _hold(self, returned: dict) -> None:
        """Keep the tensors of one step (name -> tensor, or a dict of them) with a copy of their values."""
        for name, value in returned.items():
            items = value.items() if isinstance(value, dict) else [("", value)]
            for key, tensor in items:
                if tensor.data_ptr() not in self._held:
                    label = f"{name} [{key!r}]" if key else name
                    self._held[tensor.data_ptr()] = (label, tensor, tensor.clone())


def check_steps_held(env: BatchedEnv, steps: int) -> None:
    """Have the contract check of a batched env of the user's own (where `env` has one) cover `steps` steps whose
    tensors the model holds at once."""
    check = find_wrapper(env, ContractCheck)
    if check is not None:
        check.checked_steps = max(check.checked_steps, int(steps))


def _unchanged(tensor: torch.Tensor, then: torch.Tensor) -> bool:
    """Whether `tensor` holds the values `then` copied (NaN where NaN was: the NaN checks come after)."""
    if tensor.is_floating_point():
        return torch.allclose(tensor, then, rtol=0.0, atol=0.0, equal_nan=True)
    return torch.equal(tensor, then)


def _same_device(a: torch.device, b: torch.device) -> bool:
    """Whether two devices are one, a device without an index ("cuda") being the current one of its type."""
    if a.type != b.type:
        return False
    if a.index is None or b.index is None:
        module = getattr(torch, a.type, None)
        current = module.current_device() if a.type != "cpu" and hasattr(module, "current_device") else 0
        return (a.index if a.index is not None else current) == (b.index if b.index is not None else current)
    return a.index == b.index


def _moves_counter(env) -> list[int]:
    """The count of steps and resets (`EpisodeStatistics.moves`) of the env innermost in `env`, as a one-item list held
    by that env: shared by every model trained on it, also where each wraps it on its own (a Gymnasium or SB3 vector
    env given to several models); a copy of the env (a model deep-copied or pickled) holds a copy of it."""
    while isinstance(env, EnvWrapper) and isinstance(env.__dict__.get("env"), BatchedEnv):
        env = env.__dict__["env"]
    source = getattr(env, "__dict__", {}).get("vector_env") or getattr(env, "__dict__", {}).get("vec_env") or env
    held = getattr(source, "__dict__", None)
    if held is None:  # (an object without attributes of its own: counted by this wrapper alone)
        return [0]
    return held.setdefault("_rlspeed_moves", [0])


class EpisodeStatistics(EnvWrapper):
    """Adds `info["episode_return"]`, `info["episode_length"]` (valid where `info["done"]`) from raw rewards (the
    inner env's `info["raw_reward"]` where it gives them: SB3 VecEnvs under a reward-normalising VecNormalize).

    An inner env whose envs record their own returns under wrappers that change rewards (Gymnasium's
    `RecordEpisodeStatistics` under `NormalizeReward`) gives `info["recorded_rows"]` (bool `[N]`: the rows whose
    episode ended with a recorded return) and `info["recorded_returns"]` (`[N]`): those returns replace the sums of
    the changed rewards.

    An inner env that knows its whole episodes gives `info["episode_ends"]`, (ended: bool `[N]`, their returns:
    float32 `[N]`), on every step: SB3 VecEnvs whose envs are in SB3's `Monitor`, under wrappers that may end the
    learner's episode earlier or change its rewards (`make_atari_env`'s episodic life and clipped rewards). The
    episodes counted are then those (`info["done"]`), with those returns, as SB3 reports them; lengths are the
    steps taken here.

    Applied innermost by `make_env`, so returns are the env's own, before any reward normalisation. The numerics
    guard of the model training on it (`rlspeed.numerics.EnvValueGuard`, set as `numerics`) checks the env's values
    here, before anything else sees them. Everything stays on the device; nothing is read back to the host.
    """

    def __init__(self, env: BatchedEnv):
        super().__init__(env)
        self._moves = _moves_counter(env)
        # (returns summed in float64, as Gymnasium's and SB3's episode statistics sum Python floats: a float32 sum of
        # a thousand rewards is off in the fourth digit; float32 where the device has no float64)
        dtype = statistics_dtype(self.device)
        self._return = torch.zeros(self.num_envs, device=self.device, dtype=dtype)
        # (lengths counted in int64: a float32 count stops at 2**24 steps, an episode of a few hours at 1,000 steps/s)
        self._length = torch.zeros(self.num_envs, device=self.device, dtype=torch.int64)
        # (the totals' restart values, as 0-dim tensors: `torch.where` with them makes one fresh tensor in one kernel,
        # where an out-of-place `masked_fill` copies, then fills; benchmarks/env_special_cases.py measures the two)
        self._restart = (torch.zeros((), device=self.device, dtype=dtype),
                         torch.zeros((), device=self.device, dtype=torch.int64))
        self.numerics = None  # an EnvValueGuard, set by the model that trains on this env

    @property
    def moves(self) -> int:
        """Steps and resets of the env so far, by anyone (`_moves_counter`): a model whose learn ended at another count
        (another model trained on the same env in between) does not go on from the observation it kept."""
        return self._moves[0]

    def reset(self, seed: int | None = None) -> ResetResult:
        """Zero the running episode totals, then reset the inner env."""
        self._moves[0] += 1
        self._return = torch.zeros_like(self._return)
        self._length = torch.zeros_like(self._length)
        obs, info = self.env.reset(seed=seed)
        if self.numerics is not None:
            obs = _checked(self.numerics, obs)[0]
        return obs, info

    def _own_state(self) -> dict[str, torch.Tensor]:
        return {"_return": self._return, "_length": self._length}

    def step(self, actions: torch.Tensor) -> StepResult:
        """Step the inner env and add `info["done"]`, `info["episode_return"]` and `info["episode_length"]`.

        The totals (`[N]`; returns in `statistics_dtype`, float64 where the device has it; lengths int64) are the
        finished episodes' where `info["done"]` is True; elsewhere they are the current episode's running totals, which
        callers should ignore.
        """
        self._moves[0] += 1
        obs, reward, terminated, truncated, info = self.env.step(actions)
        if self.numerics is not None:
            obs, reward, info["final_obs"] = _checked(self.numerics, obs, reward, info["final_obs"], actions)
        done = terminated | truncated
        # Fresh tensors each step (no copies): the returned totals stay valid after later steps. An env that
        # normalises its rewards itself (SB3's VecNormalize) gives the original ones as `raw_reward`.
        episode_return, episode_length = self._return + info.get("raw_reward", reward), self._length + 1
        ends = info.pop("episode_ends", None)
        if ends is not None:  # (whole episodes the inner env knows: those, and their returns, count)
            done, ended_returns = ends
            episode_return = torch.where(done, ended_returns, episode_return)
        rows, recorded = info.pop("recorded_rows", None), info.pop("recorded_returns", None)
        if rows is not None and recorded is not None:  # (finished episodes a recorder under reward wrappers summed)
            episode_return = torch.where(rows & done, recorded.to(episode_return.dtype), episode_return)
        self._return = torch.where(done, self._restart[0], episode_return)
        self._length = torch.where(done, self._restart[1], episode_length)
        info["done"] = done
        info["episode_return"], info["episode_length"] = episode_return, episode_length
        return obs, reward, terminated, truncated, info


def find_wrapper(env, kind: type):
    """The outermost wrapper of `kind` in a batched env's chain of rlspeed's wrappers, or None (a user's env may hold
    anything as `env`: only `EnvWrapper`s are looked inside)."""
    while env is not None:
        if isinstance(env, kind):
            return env
        env = env.__dict__.get("env") if isinstance(env, EnvWrapper) else None
    return None


def clear_reward_flags(env) -> None:
    """Forget what the adapter under `env` (its `unwrapped`) marked about its rewards (`rewards_overflowed`,
    `rewards_nan`), which stay set until a NaN guard clears them: where it starts counting, and at a read that found
    no non-finite value, so that its refusal names no cause of a value it did not count (an earlier model's masked
    steps on the same env). Anything but a batched env (None: no env) is left alone."""
    if isinstance(env, BatchedEnv):
        adapter = env.unwrapped
        adapter.rewards_overflowed = adapter.rewards_nan = False


def find_episode_statistics(env):
    """The `EpisodeStatistics` wrapper of a batched env (every env `make_env` builds has one), or None."""
    return find_wrapper(env, EpisodeStatistics)


def counted(env: BatchedEnv) -> BatchedEnv:
    """`env` as training and evaluation take it: as it is where it counts its episodes (every env `make_env`
    builds), else (a batched env of the user's own) checked against the contract and counted
    (`EpisodeStatistics(ContractCheck(env))`). rlspeed's normalisation wrappers the caller put around such an env
    (`NormalizeReward(MyEnv())`) stay outermost, as `make_env` puts them: the episodes are counted under them (their
    returns the env's own, not the normalised rewards' sums) and the values checked before they reach the
    statistics. Those wrappers then wrap the counted env (their `env` is set to it)."""
    if find_episode_statistics(env) is not None:
        return env
    lowest, inner = None, env
    while isinstance(inner, EnvWrapper) and type(inner).counted_beneath:
        lowest, inner = inner, inner.env
    checked = EpisodeStatistics(ContractCheck(inner))
    if lowest is None:
        return checked
    lowest.env = checked
    return env


def _checked(numerics, obs: Observation, reward=None, final_obs: Observation | None = None, actions=None):
    """`numerics.check` of one step (or a reset) for any observation layout: (obs, reward, final_obs), with non-finite
    values replaced under the `mask` policy. Integer and bool observations cannot be non-finite: a dict's float keys
    are checked (as one tensor of their flattened rows), other observations go through unchanged."""
    if not isinstance(obs, dict):
        checked, reward, checked_final = numerics.check(obs, reward, final_obs, actions)
        return checked, reward, (checked if final_obs is obs or checked_final is None else checked_final)
    floats = [key for key, value in obs.items() if value.is_floating_point()]
    if not floats:  # (rewards and actions are still checked)
        return obs, numerics.check(next(iter(obs.values())), reward, None, actions)[1], final_obs
    same = final_obs is obs
    rows = torch.cat([obs[key].flatten(1) for key in floats], 1) if len(floats) > 1 else obs[floats[0]].flatten(1)
    final_rows = None
    if final_obs is not None and not same:
        final_rows = (torch.cat([final_obs[key].flatten(1) for key in floats], 1) if len(floats) > 1
                      else final_obs[floats[0]].flatten(1))
    checked, reward, _ = numerics.check(rows, reward, final_rows, actions)
    if checked is rows:  # the `raise` policy: nothing replaced
        return obs, reward, final_obs

    def zeroed(values: dict | None) -> dict | None:
        if values is None:
            return None
        return {key: torch.nan_to_num(value, nan=0.0, posinf=0.0, neginf=0.0) if key in floats else value
                for key, value in values.items()}

    obs_out = zeroed(obs)
    return obs_out, reward, (obs_out if same else zeroed(final_obs))


def integer_range(space: gym.spaces.Discrete | gym.spaces.MultiDiscrete) -> tuple[np.ndarray, np.ndarray]:
    """[low, high) of a Discrete or MultiDiscrete space's values (per component), int64: the one rule for which
    values such a space has (the Gymnasium adapter's observations, predict's, a loaded replay buffer's)."""
    if isinstance(space, gym.spaces.Discrete):
        return np.int64(space.start), np.int64(space.start + space.n)
    start = np.asarray(getattr(space, "start", 0), dtype=np.int64)
    return start, start + np.asarray(space.nvec, dtype=np.int64)
