"""Export a trained policy as one self-contained graph: ONNX, TorchScript or a torch.export program.

The graph is `predict(obs, deterministic=True)` with nothing left outside it: raw observations go in (a batch
`[B, *observation_shape]` in the observation's dtype: float32 vectors, uint8 images, which the graph scales, int64
indices; one input per key, in the space's key order, for Dict observations; B dynamic), the model's observation
normalisation and encoder run inside, and actions come out as the env takes them (Discrete: int64 indices `[B]`;
MultiDiscrete: int64 `[B, k]`; MultiBinary: float32 0/1 `[B, n]`; Box: float32 `[B, *shape]`, clipped to or rescaled
onto the Box exactly as the algorithm does). Exported policies that leave normalisation or action rescaling to the
caller disagree with Python; this module exists so that they cannot.

Extra inputs follow the observations: `action_mask` (bool `[B, n]`, on request: `export(..., action_mask=True)`) for
policies that take masks; for RecurrentPPO the actor LSTM's state `state_h`, `state_c` `[1, B, H]` and
`episode_start` bool `[B]`, with the next state as the outputs `next_state_h`, `next_state_c`.

A sidecar `FILE.json` beside the exported file (and, for ONNX, the model's `metadata_props`) names the inputs,
outputs, spaces, algorithm, env id (with the modules that register it, `gym_packages`), seed and rlspeed version.
Every format refuses an input of another dtype than the sidecar gives it.

Each policy family is a `PolicyExport` module. `export_module(model)` builds it: an algorithm that defines
`_export_module()` (the hook on `Algorithm`) gives its own, otherwise `default_export_module` picks one from the
networks the model has. New inputs are a subclass with more `extra_inputs()`, a `check_inputs` that says what the
model gives for them, and an `actions` that takes them.

Graphs are captured on the CPU (weights copied there), with `torch.export` for the exported program and ONNX (the
ONNX file is `torch.onnx.export(..., dynamo=True)` of that same program; it needs `onnx` and `onnxscript`) and
`torch.jit.trace` for TorchScript.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import io
import json
import logging
import os
import re
import tempfile
import typing
import warnings
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from torch import nn

import rlspeed
from rlspeed._version import __version__
from rlspeed.accel.introspect import made_as
from rlspeed.checkpoint import load_checkpoint, plain_file_mode, refuse_non_model, run_model
from rlspeed.device import float32_default, major_minor
from rlspeed.env_options import tuple_paths
from rlspeed.envs.base import (
    mask_size,
    obs_batch_size,
    observation_layout,
    recorded_env_kwargs,
    space_to_json,
    tuple_positions,
)
from rlspeed.envs.wrappers import DictRunningMeanStd, RunningMeanStd
from rlspeed.errors import UserError, in_words, true_or_false, warn_at_caller
from rlspeed.evaluation import gym_packages
from rlspeed.files import given_path, local_path, write_atomic
from rlspeed.nn import (
    ActorCritic,
    DeterministicActor,
    QNetwork,
    RecurrentActorCritic,
    SquashedGaussianActor,
    env_actions,
    masked_logits,
    reset_at_episode_starts,
)
from rlspeed.sde import SDESquashedGaussianActor

# (the model's class is named through the package, `rlspeed.algos.Algorithm`, which typing.get_type_hints imports
# as it resolves the annotation: an import of it here would close a cycle, algos.base calling this module)
if typing.TYPE_CHECKING:
    import rlspeed.algos

# format -> the file suffix `export_checkpoint` gives a file when no --out names one
FORMATS = {"onnx": ".onnx", "torchscript": ".pt", "exported_program": ".pt2"}
_SIDECAR_IN_ARCHIVE = "rlspeed.json"  # the sidecar's name inside TorchScript and torch.export archives
_EXPORT_PACKAGES = ("onnx", "onnxscript")


class FrozenStatistics(nn.Module):
    """`RunningMeanStd.normalize` with frozen statistics as float32 constants (the graph's input dtype) that give
    what the model computes in the statistics' float64: the mean as its float32 value plus the float32 remainder,
    subtracted one after the other (the mean rounded to float32 alone is off by up to 6e-8 of it, which a feature
    whose spread is far below its mean magnifies past export's 1e-5 check), and the spread `sqrt(var + 1e-8)`
    rounded once."""

    def __init__(self, stats: RunningMeanStd):
        super().__init__()
        mean = stats.mean.detach().cpu().double()
        high = mean.float()
        self.register_buffer("mean", high)
        self.register_buffer("mean_residual", (mean - high.double()).float())
        self.register_buffer("std", torch.sqrt(stats.var.detach().cpu().double() + 1e-8).float())

    def normalize(self, x: torch.Tensor, clip: float = 10.0) -> torch.Tensor:
        return (((x - self.mean) - self.mean_residual) / self.std).clamp(-clip, clip)


class FrozenDictStatistics(nn.Module):
    """`DictRunningMeanStd.normalize` with each float key's `FrozenStatistics`; the other keys pass through."""

    def __init__(self, stats: DictRunningMeanStd):
        super().__init__()
        self.stats = nn.ModuleDict({key: FrozenStatistics(rms) for key, rms in stats.stats.items()})

    def normalize(self, obs: dict[str, torch.Tensor], clip: float = 10.0) -> dict[str, torch.Tensor]:
        return {key: self.stats[key].normalize(value, clip) if key in self.stats else value
                for key, value in obs.items()}


def frozen_statistics(stats: nn.Module) -> nn.Module:
    """The model's observation statistics as the graph's constants, on the CPU (a copy: the model's may be tied to
    a training env or a process group)."""
    return FrozenDictStatistics(stats) if isinstance(stats, DictRunningMeanStd) else FrozenStatistics(stats)


class PolicyExport(nn.Module):
    """Raw observations -> actions, as `predict(obs, deterministic=True)` gives them; the base of every family.

    Holds CPU copies of what it needs (networks, normalisation statistics, action bounds) as submodules and buffers,
    so the exported graph carries them. A subclass writes `actions` (the policy on normalised observations, in
    their stored layout: its networks flatten or encode them, then any extra inputs: an action mask, a recurrent
    state) and says what it outputs in `outputs` and `action_mapping`.

    The graph's inputs are the observation inputs (one per Dict key, in key order), then `extra_inputs()`.

    `model`: the trained model it copies from; `observation_clip`: where the model normalises observations, the
    normalised values are clipped to [-`observation_clip`, `observation_clip`] (default: the model's
    `normalize_obs_clip`, as in training).
    """

    #: how the network's output becomes the env's action (written to the sidecar)
    action_mapping = ""
    #: whether the policy can take an action mask (`with_action_mask`)
    takes_action_mask = False

    def __init__(self, model: rlspeed.algos.Algorithm, observation_clip: float | None = None) -> None:
        super().__init__()
        self.observation_space = model.spec.observation_space
        self.observation_shape = tuple(model.spec.observation_shape)
        layout = observation_layout(self.observation_space)
        # the graph's observation inputs: (name, shape, dtype) each; Dict observations one per key, in key order
        self.observation_inputs = ([(key, shape, dtype) for key, (shape, dtype) in layout.items()]
                                   if isinstance(layout, dict) else [("obs", *layout)])
        self.keyed = isinstance(layout, dict)
        self.action_space = model.spec.action_space
        self.observation_clip = model._obs_clip if observation_clip is None else observation_clip
        self.action_mask = False  # whether the graph takes an `action_mask` input (`with_action_mask`)
        #: `_checked_input` scripted, while a TorchScript trace is made (`_checked`)
        self.input_check: Callable | None = None
        self.obs_rms: nn.Module | None = None
        if model.obs_rms is not None:  # float32 constants in the graph: its input's dtype, what runtimes compute in
            self.obs_rms = frozen_statistics(model.obs_rms)
        #: whether the policy takes observations a Stable-Baselines3 VecNormalize normalised (the model trained on
        #: one, whose statistics it does not hold): the caller normalises them before the graph, as for `predict`
        self.vec_normalized = bool(getattr(model, "trained_on_vec_normalize_obs", False))

    def with_action_mask(self, enabled: bool = True) -> PolicyExport:
        """Add (or drop) the `action_mask` input: bool `[B, n]` (MultiDiscrete: the components' flags
        concatenated), False for an action the policy must not choose, as `predict(action_masks=...)` takes it.
        UserError for a policy that takes no masks."""
        if enabled and not self.takes_action_mask:
            raise UserError(f"This policy (for {type(self.action_space).__name__} actions) takes no action masks: "
                            "export it without action_mask=True (CLI: without --action-mask); masks apply to Discrete "
                            "and MultiDiscrete actions of the algorithms whose predict takes action_masks.")
        self.action_mask = bool(enabled)
        return self

    def forward(self, *inputs: torch.Tensor):
        """Actions `[B, ...]` for raw observations `[B, *observation_shape]` (one tensor per key, in key order, for
        Dict observations), followed by the `extra_inputs()`."""
        inputs = tuple(self._checked(x, name, dtype, shape)
                       for x, (name, dtype, shape) in zip(inputs, self._input_layouts()))
        count = len(self.observation_inputs)
        observations, extra = inputs[:count], inputs[count:]
        obs = dict(zip((name for name, _, _ in self.observation_inputs), observations)) if self.keyed \
            else observations[0]
        if self.obs_rms is not None:
            obs = self.obs_rms.normalize(obs, clip=self.observation_clip)
        return self.actions(obs, *extra)

    def _checked(self, x: torch.Tensor, name: str, dtype: torch.dtype, shape: list) -> torch.Tensor:
        """Input `x`, refused unless its dtype is `dtype`, in every format, as ONNX refuses it (the graph's own
        conversions would take int32 for int64, uint8 for bool). The rule per format: torch.export keeps the aten
        dtype check, and checks the number of dimensions itself before its graph runs (in torch's words: its graph's
        shapes are fixed, so a check there would never run; `load_program`'s module checks them in these sentences
        first); a TorchScript trace keeps no Python check and drops the aten one, so the scripted `input_check`
        refuses there both another dtype and another number of dimensions than `shape`'s (`"batch"` where the batch
        is), each in one sentence, as ONNX's "Invalid rank" refuses it."""
        torch.ops.aten._assert_tensor_metadata(x, dtype=dtype)
        if self.input_check is None:
            return x
        return self.input_check(x, dtype, len(shape), _dtype_refusal(name, dtype), _shape_refusal(name, shape))

    def actions(self, obs, *extra: torch.Tensor):
        """The deterministic policy's env actions for normalised observations `[B, ...]` (a dict for Dict ones)."""
        raise NotImplementedError

    # --- what the exporters, the model check and the sidecar read ------------------------------------------------
    def extra_inputs(self) -> list[tuple[str, tuple[int, ...], torch.dtype, dict[int, str]]]:
        """Inputs after the observations: (name, shape without the batch, dtype, {dim: where the batch is}) each."""
        if self.action_mask:
            return [("action_mask", (mask_size(self.action_space),), torch.bool, {0: "batch"})]
        return []

    def _input_layouts(self) -> list[tuple[str, torch.dtype, list]]:
        """(name, dtype, shape with `"batch"` where the batch is) of each input, in order."""
        return ([(name, dtype, ["batch", *shape]) for name, shape, dtype in self.observation_inputs]
                + [(name, dtype, _with_batch(shape, batch_dims, "batch"))
                   for name, shape, dtype, batch_dims in self.extra_inputs()])

    def _input_shapes(self, batch: int):
        for _, shape, dtype in self.observation_inputs:
            yield (batch, *shape), dtype
        for _, shape, dtype, batch_dims in self.extra_inputs():
            yield tuple(_with_batch(shape, batch_dims, batch)), dtype

    def example_inputs(self, batch: int = 2) -> tuple[torch.Tensor, ...]:
        """Inputs to capture the graph with (a batch of 2: a batch of 1 would be specialised as a constant; masks
        allow every action): observations inside their space (Discrete and MultiDiscrete ones at their `start`, which
        a tracer's one-hot encoding must index), zeros for Boxes."""
        inputs = [torch.ones(shape, dtype=dtype) if dtype == torch.bool else torch.zeros(shape, dtype=dtype)
                  for shape, dtype in self._input_shapes(batch)]
        for index, (name, _, _) in enumerate(self.observation_inputs):
            space = self.observation_space[name] if self.keyed else self.observation_space
            if isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)):
                inputs[index] += torch.as_tensor(np.asarray(space.start), dtype=inputs[index].dtype)
        return tuple(inputs)

    def check_inputs(self, model, obs, generator: torch.Generator):
        """(graph inputs, expected outputs from the model itself) for raw observations `obs` (a batch): what
        `check_matches_model` compares. Masks are random with at least one allowed action per row."""
        masks = None
        if self.action_mask:
            masks = random_action_masks(self.action_space, obs_batch_size(obs), generator)
        expected = model.act(obs, deterministic=True, action_masks=masks)
        return (*self._observation_tensors(obs), *(() if masks is None else (masks,))), (expected,)

    def _observation_tensors(self, obs) -> tuple[torch.Tensor, ...]:
        return tuple(obs[name] for name, _, _ in self.observation_inputs) if self.keyed else (obs,)

    def dynamic_shapes(self) -> dict:
        """torch.export's dynamic dimensions of each input (the batch)."""
        batch = torch.export.Dim("batch", min=1)
        shapes = [{0: batch} for _ in self.observation_inputs]
        shapes += [{dim: batch for dim in batch_dims} for _, _, _, batch_dims in self.extra_inputs()]
        return {"inputs": tuple(shapes)}

    def inputs(self) -> list[dict]:
        """The graph's inputs, in order: name, dtype, shape (`"batch"` for the dynamic dimension), meaning."""
        normalised = "normalised inside the graph" if self.obs_rms is not None else "not normalised"
        if self.vec_normalized:
            normalised = f"{normalised} again" if self.obs_rms is not None else "not normalised again"
        items = []
        positions = tuple_positions(self.observation_space)
        for name, shape, dtype in self.observation_inputs:
            # (where in the env's observation the input is: obs[path[0]]; nothing for an observation of one part)
            path = ([int(name)] if positions else [name]) if self.keyed else []
            part = ("" if not self.keyed else f" (element {name} of the env's Tuple observation)" if positions
                    else f" (key {name!r})")
            what = (f"observations{part} as the Stable-Baselines3 VecNormalize the model trained on returns them "
                    "(VecNormalize.normalize_obs of the env's, with its saved statistics), not raw ones"
                    if self.vec_normalized else f"raw observations{part} as the env returns them")
            how = normalised if dtype == torch.float32 else "converted, scaled and encoded inside the graph"
            items.append({"name": name, "dtype": _dtype_name(dtype), "shape": ["batch", *shape],
                          "observation_path": path, "description": f"{what} ({how})"})
        for name, shape, dtype, batch_dims in self.extra_inputs():
            items.append({"name": name, "dtype": _dtype_name(dtype), "shape": _with_batch(shape, batch_dims, "batch"),
                          "description": _EXTRA_INPUTS[name]})
        return items

    def outputs(self) -> list[dict]:
        """The graph's outputs, in order (default: one action tensor for the model's action space)."""
        space = self.action_space
        if isinstance(space, gym.spaces.Discrete):
            return [{"name": "actions", "dtype": "int64", "shape": ["batch"],
                     "description": "action indices in [0, n)"}]
        if isinstance(space, gym.spaces.MultiDiscrete):
            return [{"name": "actions", "dtype": "int64", "shape": ["batch", *space.shape],
                     "description": "one action index per component, in [0, nvec[i])"}]
        if isinstance(space, gym.spaces.MultiBinary):
            return [{"name": "actions", "dtype": "float32", "shape": ["batch", *space.shape],
                     "description": "one 0.0/1.0 flag per bit"}]
        return [{"name": "actions", "dtype": "float32", "shape": ["batch", *space.shape],
                 "description": "actions in the env's units, within the action space's bounds"}]


_EXTRA_INPUTS = {
    "action_mask": "False for an action the policy must not choose (as predict(action_masks=...)); all True: no mask",
    "state_h": "the LSTM actor's hidden state h from the previous step's next_state_h (zeros at the first step)",
    "state_c": "the LSTM actor's cell state c from the previous step's next_state_c (zeros at the first step)",
    "episode_start": "True where this observation starts an episode: the state is zeroed there first",
}


def _checked_input(x: torch.Tensor, dtype: torch.dtype, ndim: int, dtype_message: str,
                   shape_message: str) -> torch.Tensor:
    """`x` where its dtype is `dtype` and it has `ndim` dimensions, else TypeError(`dtype_message`) or
    ValueError(`shape_message` and x's shape): scripted, the checks a TorchScript trace keeps."""
    if x.dtype != dtype:
        raise TypeError(dtype_message)
    if x.dim() != ndim:
        raise ValueError(shape_message + str(x.shape) + ".")
    return x


def _dtype_refusal(name: str, dtype: torch.dtype) -> str:
    """What a TorchScript policy says for input `name` of another dtype than its `dtype` (as ONNX and torch.export
    refuse it)."""
    dtype_name = _dtype_name(dtype)
    return (f"input '{name}' of this exported policy takes {dtype_name} tensors, as its sidecar's inputs say: "
            f"convert it (numpy: .astype(\"{dtype_name}\"); torch: .to(torch.{dtype_name})).")


def _shape_refusal(name: str, shape: list, rank: bool = True) -> str:
    """What a TorchScript policy says for input `name` of another number of dimensions than its `shape` (the
    tensor's shape follows), as ONNX refuses it ("Invalid rank"); `rank` False: of another size in a fixed
    dimension (the hint for a single observation left out)."""
    single = (": a single one is a batch of one, x[None] in numpy, x.unsqueeze(0) in torch"
              if rank and shape[0] == "batch" else "")
    dims = "[" + ", ".join(str(dim) for dim in shape) + "]"
    return f"input '{name}' of this exported policy takes shape {dims}, as its sidecar's inputs say{single}; got "


def _with_batch(shape: tuple[int, ...], batch_dims: dict[int, str], batch) -> list:
    """`shape` (without the batch) with `batch` inserted at each of the `batch_dims`."""
    full = list(shape)
    for dim in sorted(batch_dims):
        full.insert(dim, batch)
    return full


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def random_action_masks(space: gym.Space, batch: int, generator: torch.Generator) -> torch.Tensor:
    """Random bool masks `[batch, mask_size(space)]`, about half the actions allowed, at least one per row (per
    component for MultiDiscrete)."""
    masks = torch.rand(batch, mask_size(space), generator=generator) < 0.5
    multi = isinstance(space, gym.spaces.MultiDiscrete)
    sizes = [int(n) for n in space.nvec.reshape(-1)] if multi else [masks.shape[1]]
    parts = []
    for part in masks.split(sizes, dim=1):
        first = torch.randint(0, part.shape[1], (batch,), generator=generator)
        parts.append(part | torch.nn.functional.one_hot(first, part.shape[1]).bool())
    return torch.cat(parts, dim=1)


def _box_tensors(model, *names: str) -> list[torch.Tensor]:
    return [getattr(model, name).detach().to("cpu", torch.float32).clone() for name in names]


def _cpu_copy(module: nn.Module) -> nn.Module:
    module = copy.deepcopy(module).to("cpu").eval()
    module.requires_grad_(False)
    return module


_ACTION_MAPPINGS = {"categorical": "argmax of the logits (masked logits with an action_mask)",
                    "multi_categorical": "argmax of each component's logits (masked with an action_mask)",
                    "bernoulli": "1.0 where a bit's logit > 0, else 0.0",
                    "gaussian": "Gaussian mean clipped to the Box"}


class ActorCriticExport(PolicyExport):
    """PPO and A2C (`ActorCritic`, gSDE's `SDEActorCritic` too): the mode of the actor's distribution as
    `ActorCritic.mode` gives it (argmax of the logits, masked where an action mask is given; per component for
    MultiDiscrete; logit > 0 per bit for MultiBinary; the Gaussian mean clipped to the Box), in the action space's
    shape."""

    def __init__(self, model):
        super().__init__(model)
        self.policy = _cpu_copy(model.policy)
        #: the policy's class is a subclass's own with its own forward (a `_build_policy` override): the actor's
        #: output is its forward's first, not rlspeed's actor member
        self.own_forward = made_as(self.policy).forward is not ActorCritic.forward
        self.kind = self.policy.kind
        self.takes_action_mask = mask_size(self.action_space) is not None
        self.action_shape = tuple(self.action_space.shape or ())
        self.action_mapping = _ACTION_MAPPINGS[self.kind]
        if self.kind == "gaussian":
            low, high = _box_tensors(model, "_action_low", "_action_high")
            self.register_buffer("action_low", low)
            self.register_buffer("action_high", high)

    def actions(self, obs, action_mask: torch.Tensor | None = None) -> torch.Tensor:
        if self.own_forward:  # (a subclass's network: its forward, whatever it holds)
            out = self.policy(obs)[0]
        else:  # the actor member only: no value head in the graph
            out = self.policy.body(self.policy.features(obs), members=slice(0, 1))[0]
        return self.to_env(self.policy.mode(out, action_mask))

    def to_env(self, actions: torch.Tensor) -> torch.Tensor:
        """As `OnPolicyAlgorithm._to_env`: Gaussian actions clipped to the Box, flat actions in the space's shape."""
        bounds = (self.action_low, self.action_high) if self.kind == "gaussian" else ()
        return env_actions(actions, self.kind, self.action_shape, *bounds)


class RecurrentActorCriticExport(ActorCriticExport):
    """RecurrentPPO (`RecurrentActorCritic`): one step of `predict(obs, state, episode_start)`. Inputs: the
    observations, the actor LSTM's state `state_h`, `state_c` `[1, B, H]` and `episode_start` bool `[B]` (the state
    is zeroed where it is set), then `action_mask` where enabled; outputs: actions, `next_state_h`, `next_state_c`
    (feed them back at the next step, as predict's returned state)."""

    def __init__(self, model):
        super().__init__(model)
        self.hidden_size = int(self.policy.hidden_size)
        self.action_mapping = f"LSTM actor one step, then {self.action_mapping}"

    def actions(self, obs, state_h: torch.Tensor, state_c: torch.Tensor, episode_start: torch.Tensor,
                action_mask: torch.Tensor | None = None):
        h, c = reset_at_episode_starts(state_h[0], episode_start), reset_at_episode_starts(state_c[0], episode_start)
        actions, h, c = self.policy.actor_step(obs, h, c, True, action_mask)
        return self.to_env(actions), h.unsqueeze(0), c.unsqueeze(0)

    def extra_inputs(self):
        state = (1, self.hidden_size)
        return [("state_h", state, torch.float32, {1: "batch"}), ("state_c", state, torch.float32, {1: "batch"}),
                ("episode_start", (), torch.bool, {0: "batch"}), *super().extra_inputs()]

    def check_inputs(self, model, obs, generator: torch.Generator):
        batch = obs_batch_size(obs)
        h, c = torch.randn(2, 1, batch, self.hidden_size, generator=generator)
        episode_start = torch.rand(batch, generator=generator) < 0.3
        masks = random_action_masks(self.action_space, batch, generator) if self.action_mask else None
        actions, (next_h, next_c) = model.act_with_state(obs, (h, c), episode_start, True, masks)
        inputs = (*self._observation_tensors(obs), h, c, episode_start, *(() if masks is None else (masks,)))
        return inputs, (actions, next_h, next_c)

    def outputs(self) -> list[dict]:
        state = {"dtype": "float32", "shape": [1, "batch", self.hidden_size]}
        return [*super().outputs(),
                {"name": "next_state_h", **state, "description": "the LSTM actor's h after this step: next state_h"},
                {"name": "next_state_c", **state, "description": "the LSTM actor's c after this step: next state_c"}]


class _RescaledExport(PolicyExport):
    """Off-policy actors whose actions lie in [-1, 1]: rescaled onto the Box as `OffPolicyAlgorithm._to_env` does."""

    action_mapping = ("tanh output in [-1, 1] rescaled to the Box: center + half_range * a (clamped to [low, high] "
                      "where it could round past them)")

    def __init__(self, model):
        super().__init__(model)
        self.actor = _cpu_copy(model.actor)
        center, half_range = _box_tensors(model, "_action_center", "_action_half_range")
        self.register_buffer("action_center", center)
        self.register_buffer("action_half_range", half_range)
        # (the bounds where the rescaling can round past them, as `OffPolicyAlgorithm._to_env` clamps: else none)
        self.clamps = model._action_low is not None
        if self.clamps:
            low, high = _box_tensors(model, "_action_low", "_action_high")
            self.register_buffer("action_low", low)
            self.register_buffer("action_high", high)

    def unit_actions(self, obs: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def actions(self, obs: torch.Tensor) -> torch.Tensor:
        actions = torch.addcmul(self.action_center, self.action_half_range, self.unit_actions(obs))
        return torch.clamp(actions, self.action_low, self.action_high) if self.clamps else actions


class SquashedGaussianExport(_RescaledExport):
    """SAC: tanh of the Gaussian mean, rescaled onto the Box."""

    def unit_actions(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor.deterministic(obs)


class DeterministicActorExport(_RescaledExport):
    """TD3 and DDPG: the actor's tanh output, rescaled onto the Box."""

    def unit_actions(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor(obs)


class QNetworkExport(PolicyExport):
    """DQN: the greedy action, argmax of Q(s, .) (over the allowed actions with an action mask, where the model's
    `predict` takes masks)."""

    action_mapping = "argmax of Q(s, .) (masked Q-values with an action_mask)"

    def __init__(self, model):
        super().__init__(model)
        self.q_network = _cpu_copy(model.q_network)
        self.takes_action_mask = bool(getattr(model, "supports_action_masks", False))

    def actions(self, obs: torch.Tensor, action_mask: torch.Tensor | None = None) -> torch.Tensor:
        return masked_logits(self.q_network(obs), action_mask).argmax(dim=1)


def default_export_module(model) -> PolicyExport:
    """The `PolicyExport` for a model's networks; UserError naming the part that has no exporter."""
    policy = getattr(model, "policy", None)
    if isinstance(policy, RecurrentActorCritic):
        return RecurrentActorCriticExport(model)
    if isinstance(policy, ActorCritic):
        return ActorCriticExport(model)
    if isinstance(getattr(model, "q_network", None), QNetwork):
        return QNetworkExport(model)
    if isinstance(getattr(model, "actor", None), (SquashedGaussianActor, SDESquashedGaussianActor)):
        return SquashedGaussianExport(model)
    if isinstance(getattr(model, "actor", None), DeterministicActor):
        return DeterministicActorExport(model)
    raise UserError(f"{type(model).__name__}'s policy ({type(policy).__name__}) has no exporter: rlspeed exports "
                    "ActorCritic, RecurrentActorCritic, QNetwork, SquashedGaussianActor and DeterministicActor "
                    "policies; give the algorithm an `_export_module()` that returns a rlspeed.export.PolicyExport.")


def export_module(model, action_mask: bool | None = None) -> PolicyExport:
    """The model's own `_export_module()` where it has one, else `default_export_module(model)`; in eval mode, with
    the `action_mask` input when asked (None: when the model's last training run used the env's masks), checked
    against the model's own actions (`check_matches_model`)."""
    hook = getattr(model, "_export_module", None)
    module = hook() if hook is not None else default_export_module(model)
    if action_mask is None:
        action_mask = bool(getattr(model, "trained_with_action_masks", False)) and module.takes_action_mask
    module.with_action_mask(action_mask)
    module.eval()
    check_matches_model(model, module)
    return module


def random_observations(space: gym.Space, batch: int, generator: torch.Generator):
    """A batch of random observations of `space` as the env adapters give them (float vectors 3 * N(0, 1), images
    and indices uniform over their range); a dict for Dict spaces."""
    if isinstance(space, gym.spaces.Dict):
        return {key: random_observations(sub, batch, generator) for key, sub in space.spaces.items()}
    shape, dtype = observation_layout(space)
    if isinstance(space, gym.spaces.Discrete):
        return torch.randint(int(space.start), int(space.start) + int(space.n), (batch,), generator=generator)
    if isinstance(space, gym.spaces.MultiDiscrete):
        high = torch.as_tensor(space.nvec.astype("int64"))
        return (torch.rand(batch, *shape, generator=generator) * high).long() + torch.as_tensor(space.start)
    if dtype == torch.float32:
        return 3 * torch.randn(batch, *shape, generator=generator)
    high = 256 if dtype == torch.uint8 else 2
    return torch.randint(0, high, (batch, *shape), generator=generator).to(dtype)


def same_outputs(got: torch.Tensor, expected: torch.Tensor, atol: float = 1e-5) -> bool:
    """Identical integer (discrete) outputs, float ones of the same shape within `atol`."""
    if got.dtype in (torch.int32, torch.int64) or expected.dtype in (torch.int32, torch.int64):
        return got.shape == expected.shape and torch.equal(got.long(), expected.long())
    return got.shape == expected.shape and torch.allclose(got.float(), expected.float(), rtol=0, atol=atol)


def check_matches_model(model, module: PolicyExport, batch: int = 64, graph=None) -> None:
    """UserError unless `module` gives the model's deterministic actions (`model.act`, or `act_with_state` for a
    recurrent policy, with random masks where the graph takes them) on random observations: identical discrete
    actions, continuous ones and recurrent states within 1e-5. A model whose `_policy_actions` differs from what its
    networks suggest (a subclass) is caught here instead of exporting a policy that disagrees with Python.
    `graph`: the captured graph of `module` to check instead (a TorchScript trace keeps the one path its example
    inputs took through code that branches on values or on the batch size: the caller's own encoder's, say).
    Models on the CPU only: another device's kernels round differently."""
    if model.device.type != "cpu":
        return
    generator = torch.Generator().manual_seed(0)
    obs = random_observations(module.observation_space, batch, generator)
    if module.obs_rms is not None and isinstance(obs, torch.Tensor):
        # observations at the model's scale, so normalisation does not clip them all
        obs = module.obs_rms.mean + obs * module.obs_rms.std
    with torch.no_grad():
        inputs, expected = module.check_inputs(model, obs, generator)
        got = (module if graph is None else graph)(*inputs)
    got = got if isinstance(got, tuple) else (got,)
    if len(got) == len(expected) and all(same_outputs(g, e.cpu()) for g, e in zip(got, expected)):
        return
    if graph is not None:
        own = _own_modules(module)
        raise UserError(f"The TorchScript trace of {type(model).__name__}'s policy does not give the model's actions "
                        "on observations other than the example it was traced with: a trace keeps the one path the "
                        "example took through code that branches on values or on the batch size"
                        f"{f' (your {own})' if own else ''}; compute both branches and choose with torch.where, or "
                        f"export {_other_formats('exported_program', 'onnx')} (torch.export, which says where).")
    raise UserError(f"The exported graph for {type(model).__name__} ({type(module).__name__}) does not give the "
                    "model's actions: its policy differs from the one rlspeed knows how to export; give the "
                    "algorithm an `_export_module()` that returns a rlspeed.export.PolicyExport matching its "
                    "`_policy_actions`.")


def _own_modules(module: nn.Module) -> str:
    """The class names of the caller's own modules inside `module` (neither rlspeed's nor torch's), joined."""
    return ", ".join(sorted({type(part).__name__ for part in module.modules()
                             if not type(part).__module__.startswith(("rlspeed.", "torch."))}))


def _observation_normalization(module: PolicyExport) -> dict | None:
    """The sidecar's `observation_normalization`: the model's own, inside the graph, and (`vec_normalized`) the
    Stable-Baselines3 VecNormalize's, which the caller applies first with that VecNormalize's saved statistics."""
    described = None
    if module.obs_rms is not None:
        described = {"formula": "clip((obs - mean) / sqrt(var + 1e-8), -clip, clip)", "clip": module.observation_clip,
                     "in_graph": True}
    if module.vec_normalized:
        described = {**(described or {"in_graph": False}),
                     "by_caller_first": "Stable-Baselines3 VecNormalize.normalize_obs, with the statistics of the "
                                        "VecNormalize the model trained on (VecNormalize.save; the model's file does "
                                        "not hold them): clip((obs - obs_rms.mean) / sqrt(obs_rms.var + epsilon), "
                                        "-clip_obs, clip_obs)"}
    return described


def describe(model, module: PolicyExport, format: str, file: Path) -> dict:
    """The sidecar's content: what the exported file takes and gives, and where it came from."""
    options = recorded_env_kwargs(model.spec)  # (the env's options: the same env needs them)
    return {"format": format, "file": file.name, "algo": model.name, "env_id": model.env_id,
            # (the modules to import before gymnasium.make(env_id): a user's `module:EnvId`, MinAtar's minatar.gym)
            "gym_packages": _sidecar_gym_packages(model), "seed": model.seed,
            "env_kwargs": options, "env_kwargs_tuples": tuple_paths(options),  # (as a checkpoint records them)
            "rlspeed_version": __version__, "torch_version": torch.__version__,
            "num_timesteps": int(model.num_timesteps), "deterministic": True,
            "inputs": module.inputs(), "outputs": module.outputs(),
            "observation_space": space_to_json(module.observation_space),
            "action_space": space_to_json(module.action_space),
            "observation_normalization": _observation_normalization(module),
            # (the masking clause only where the graph takes an action_mask input)
            "action_mapping": (module.action_mapping if module.action_mask
                               else re.sub(r" \(masked [^)]*\)", "", module.action_mapping)),
            "preprocessing": _preprocessing(model.env_id, model.spec.env_kwargs)}


def _sidecar_gym_packages(model) -> list[str]:
    """The sidecar's `gym_packages`: the modules to import before `gymnasium.make(env_id)` works in a process that
    has not imported rlspeed; for an id rlspeed registers with Gymnasium (`CartPoleNoVel-v1`, `PendulumNoVel-v1`,
    `rlspeed/<id>`: an entry point of rlspeed's), `rlspeed.envs`, whose import registers them (a model file records
    none: loading it imports rlspeed)."""
    spec = gym.registry.get(model.env_id)
    entry = getattr(spec, "entry_point", None)
    if isinstance(entry, str) and entry.split(".", 1)[0] == "rlspeed":
        return ["rlspeed.envs"]
    return gym_packages(model)


def _preprocessing(env_id: str, env_kwargs: dict | None = None) -> dict | None:
    """What the env (made with the options `env_kwargs`) does to the game's frames before the policy sees them, where
    the policy needs it repeated outside rlspeed (an Atari game: `rlspeed.envs.atari`, with the steps FIRE is pressed
    for where the game waits for it); None for envs whose observations are the env's own."""
    from rlspeed.envs import atari

    if not atari.atari_image_id(env_id):
        return None
    return {"kind": "atari", "noop_max": atari.NOOP_MAX, "frame_skip": atari.FRAME_SKIP,
            "max_pool_last_two_frames": True, "grayscale": True, "screen_size": atari.SCREEN_SIZE,
            "frame_stack": atari.FRAME_STACK, "stack_axis": 0,
            "fire_action_on_start_and_after_life_loss": atari.fire_action(env_id),
            "fire_steps": atari.fire_steps(env_id, env_kwargs),
            "reference": "gymnasium.wrappers.AtariPreprocessing + FrameStackObservation (rlspeed.envs.atari)"}


#: The oldest torch whose torch.export makes programs that run as exported (tests/test_export.py passes on it): 2.9's
#: fail in guards of policies with several inputs (NameError) and load with parameters that require grad; ONNX export
#: of an ensemble's batched product failed on 2.6. TorchScript export works on every torch rlspeed takes.
EXPORT_MIN_TORCH = (2, 10)


def _check_torch(format: str) -> None:
    if format != "torchscript" and major_minor(torch.__version__) < EXPORT_MIN_TORCH:
        raise UserError(f"{format} export needs torch {'.'.join(map(str, EXPORT_MIN_TORCH))} or newer (this is torch "
                        f"{torch.__version__}, whose torch.export makes programs that fail): pip install -U "
                        f"\"torch>={'.'.join(map(str, EXPORT_MIN_TORCH))}\", or export torchscript (a .pt file).")


def _check_onnx_packages() -> None:
    missing = [name for name in _EXPORT_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise UserError(f"ONNX export needs {' and '.join(missing)}: pip install \"rlspeed[export]\".")


def _replace_atomically(write, path: Path) -> None:
    """Write through `write(temporary path)`, then rename: a failed export leaves no half-written file at `path`;
    a write the file system refuses (read-only, full) is one sentence."""
    # (a new file of its own, made exclusively: never one a symlink planted at a predictable name points at; two
    # exports to one path do not collide. Same suffix: torch.export.save warns otherwise)
    temporary = None
    try:
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=f".tmp{path.suffix}")
        os.close(fd)
        temporary = Path(name)
        write(temporary)
        plain_file_mode(temporary)  # (mkstemp's 0600: the policy is as readable as a file the user writes)
        os.replace(temporary, path)
    except OSError as error:
        raise _unwritable(path, error) from None
    finally:
        if temporary is not None:
            with contextlib.suppress(OSError):
                temporary.unlink(missing_ok=True)


def _save_torchscript(traced, sidecar_text: str, path: Path) -> None:
    # (through a file Python opens: torch.jit.save reports a file it cannot open or write as a RuntimeError)
    with open(path, "wb") as handle:
        torch.jit.save(traced, handle, _extra_files={_SIDECAR_IN_ARCHIVE: sidecar_text})


def _unwritable(path: Path, error: OSError) -> UserError:
    return UserError(f"Cannot write '{path}' ({error.strerror or error}): nothing was written there; export to a "
                     "writable place with free space (--out).")


def export_format(path: str | Path, format: str | None) -> str:
    """The export format for `path`: `format` when given (UserError when the path's suffix is another format's:
    loaders go by the suffix), else the one its suffix names (`FORMATS`: .onnx, .pt, .pt2; UserError for another);
    UserError for a .safetensors path, a model file's (an export written there replaced the model)."""
    suffix = Path(path).suffix.lower()
    by_suffix = {value: key for key, value in FORMATS.items()}
    if suffix == ".safetensors":  # (an export there would replace a model file, which rlspeed then cannot load)
        raise UserError(f"'{path}' ends in .safetensors, the suffix of rlspeed's model files: give the export a path "
                        f"ending in {', '.join(FORMATS.values())} ({', '.join(FORMATS)}).")
    if format is None:
        if suffix not in by_suffix:
            raise UserError(f"Cannot tell the export format from '{path}': give a path ending in "
                            f"{', '.join(FORMATS.values())} ({', '.join(FORMATS)}), or the format (format=, --format).")
        return by_suffix[suffix]
    if format not in FORMATS:
        raise UserError(f"Unknown export format '{format}': use one of {', '.join(FORMATS)}.")
    if suffix in by_suffix and by_suffix[suffix] != format:
        raise UserError(f"'{path}' ends in {suffix}, the suffix of {by_suffix[suffix]} files, not of {format} "
                        f"({FORMATS[format]}): change the path's suffix or the format.")
    return format


def export(model: rlspeed.algos.Algorithm, path: str | Path, format: str | None = None,
           action_mask: bool | None = None) -> Path:
    """Write `model`'s deterministic policy to `path` as `format` ("onnx", "torchscript" or "exported_program";
    None: the one the path's suffix names, `export_format`), with a sidecar `path + ".json"`; returns the path.

    Load the result with `onnxruntime.InferenceSession(path)`, `torch.jit.load(path)` or `load_program(path)`
    (`torch.export.load(path).module()` with the inputs checked first); each maps raw observations `[B, ...]` to
    the env's actions (RecurrentPPO: observations, state and episode starts to actions and the next state).
    `action_mask=True` adds the input `action_mask` (bool `[B, n]`; all True is no mask) for policies that take
    masks; None adds it when the model's last training run used the env's masks.
    """
    path = given_path("export's path", path)
    format = export_format(path, format)
    action_mask = None if action_mask is None else true_or_false("export(action_mask=...)", action_mask)
    _check_torch(format)
    if format == "onnx":
        _check_onnx_packages()
    if path.is_dir():
        raise UserError(f"'{path}' is a directory; give the file to write, e.g. {path / ('policy' + FORMATS[format])}.")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise _unwritable(path, error) from None
    # (the graph's inputs and constants float32 and on the CPU, the export's device, whatever the caller's default
    # dtype and device)
    with float32_default(), torch.device("cpu"):
        module = export_module(model, action_mask)
        if module.vec_normalized:
            warn_at_caller(f"{type(model).__name__} trained on a Stable-Baselines3 VecNormalize that normalises its "
                           "observations, whose statistics the model does not hold: the exported policy takes "
                           "observations that VecNormalize normalised (VecNormalize.normalize_obs with its saved "
                           "statistics), as model.predict does, not raw ones (the sidecar says so); "
                           "normalize_obs=True in its place keeps the statistics inside the graph.", UserWarning)
        sidecar = describe(model, module, format, path)
        text = json.dumps(sidecar, indent=2)
        example = module.example_inputs()
        with torch.no_grad():
            if format == "torchscript":
                with warnings.catch_warnings():
                    # (torch's deprecation of TorchScript (torch.jit.trace, trace_method, save), which a TorchScript
                    # export asked for by name is: not the caller's to change, and an error under `python -W error`
                    # or a test suite's error filter)
                    warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated",
                                            category=DeprecationWarning)
                    # (torch's guess that a Python value read from a tensor may not hold for other inputs: rlspeed's
                    # networks read constant shapes so, and the trace is checked against the model on other
                    # observations below, which decides)
                    warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
                    module.input_check = torch.jit.script(_checked_input)
                    try:
                        traced = torch.jit.trace(module, example)
                        check_matches_model(model, module, graph=traced)
                    except UserError:
                        raise
                    except Exception as error:  # noqa: BLE001 (whatever a trace of the caller's own code raises)
                        raise _uncapturable(model, module, format, error) from error
                    _replace_atomically(lambda f: _save_torchscript(traced, text, f), path)
            else:
                try:
                    program = torch.export.export(module, example, dynamic_shapes=module.dynamic_shapes(),
                                                  strict=False)
                except Exception as error:  # noqa: BLE001 (whatever torch.export raises for the caller's own code)
                    raise _uncapturable(model, module, format, error) from error
                if format == "exported_program":
                    _replace_atomically(lambda f: _save_program(program, text, f), path)
                else:
                    _replace_atomically(lambda f: _save_onnx(program, module, sidecar, f), path)
    sidecar_path = path.with_name(path.name + ".json")
    try:
        # (readable: non-ASCII as it is, UTF-8; the archives' copy stays ASCII)
        write_atomic(sidecar_path, json.dumps(sidecar, indent=2, ensure_ascii=False) + "\n")
    except OSError as error:
        raise _unwritable(sidecar_path, error) from None
    return path


class CheckedProgram(nn.Module):
    """An exported program's module (`torch.export.load(path).module()`) that checks its inputs first, as a
    TorchScript export does in its graph: `load_program` makes it.

    The program's own check runs before its graph and names no input: a missing batch axis is torch's "tuple index
    out of range", and it reads only the dimensions the graph names, so a trailing axis of size 1 (`[B, 3, 1]` for
    `[B, 3]`) runs as if it were not there. Here an input of another dtype, number of dimensions or fixed size than
    its sidecar's `inputs` give it is refused in one sentence naming the input and the shape it takes (`x[None]`
    for one observation), the TorchScript file's words.

    `program`: the module of the exported program; `inputs`: the sidecar's `inputs` (name, dtype, shape with
    `"batch"` where the batch is), in the graph's order."""

    def __init__(self, program: nn.Module, inputs: list[dict]) -> None:
        super().__init__()
        self.program = program
        #: each input's name, dtype and shape, with its refusals' sentences (made once, not per call)
        self.layouts = [(item["name"], dtype, item["shape"], _dtype_refusal(item["name"], dtype),
                         _shape_refusal(item["name"], item["shape"]))
                        for item in inputs for dtype in (getattr(torch, item["dtype"]),)]

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """The program's outputs for `inputs` (tensors, in the sidecar's order), each checked first."""
        if len(inputs) != len(self.layouts):
            names = ", ".join(layout[0] for layout in self.layouts)
            raise TypeError(f"this exported policy takes {len(self.layouts)} inputs ({names}), as its sidecar's "
                            f"inputs say; got {len(inputs)}.")
        for x, (name, dtype, shape, dtype_refusal, shape_refusal) in zip(inputs, self.layouts):
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"input '{name}' of this exported policy takes a torch tensor (torch.from_numpy(x) "
                                f"for a numpy array); got {type(x).__name__}.")
            _checked_input(x, dtype, len(shape), dtype_refusal, shape_refusal)
            if any(isinstance(size, int) and size != got for size, got in zip(shape, x.shape)):
                raise ValueError(_shape_refusal(name, shape, rank=False) + str(x.shape) + ".")
        return self.program(*inputs)


def load_program(path: str | Path) -> CheckedProgram:
    """The policy rlspeed exported to `path` as an exported program (`.pt2`), ready to call: a `CheckedProgram`,
    whose inputs are checked against the archive's sidecar before the program runs (one sentence naming the input:
    one observation without its batch axis, an extra axis, another dtype). `torch.export.load(path).module()` runs
    the same graph where rlspeed is not installed, with torch's own checks. UserError for a missing file or one that
    is not a `.pt2` rlspeed wrote."""
    path = given_path("load_program's path", path)
    if path.suffix.lower() != FORMATS["exported_program"]:  # (export_format's rule: export wrote policy.PT2 too)
        raise UserError(f"load_program loads an exported program (.pt2), not '{path}': load a TorchScript file (.pt) "
                        "with torch.jit.load(path), an ONNX one with onnxruntime.InferenceSession(path).")
    # (checked before torch reads it: torch.export.load logs its reader's traceback before raising)
    if not path.exists():
        raise UserError(f"'{path}' does not exist: export the policy there first (export(model, path)).")
    if not zipfile.is_zipfile(path):
        raise UserError(f"'{path}' is not an exported program torch can read (not a zip archive).")
    extra = {_SIDECAR_IN_ARCHIVE: ""}
    try:
        program = torch.export.load(path, extra_files=extra)
    except Exception as error:  # noqa: BLE001 (whatever torch's archive reader raises for a file that is not one)
        raise UserError(f"'{path}' is not an exported program torch can read ({error}).") from None
    if not extra[_SIDECAR_IN_ARCHIVE]:
        raise UserError(f"'{path}' holds no {_SIDECAR_IN_ARCHIVE}: not a policy rlspeed exported "
                        "(torch.export.load(path).module() runs it unchecked).")
    return CheckedProgram(program.module(), json.loads(extra[_SIDECAR_IN_ARCHIVE])["inputs"])


def _uncapturable(model, module: nn.Module, format: str, error: Exception) -> Exception:
    """What to raise where torch.export, or a TorchScript trace (made, or run on the check's other batch), failed on
    `module`: a UserError in one sentence where the policy holds networks of the caller's own (an encoder of a
    subclass's `_make_encoder`, a `_build_policy` network), whose code can fix the batch size or branch on values
    (torch's whole message, a TorchScript traceback ending in the error, stays the `__cause__`); torch's error as it
    is where every layer is rlspeed's or torch's (rlspeed's fault)."""
    own = _own_modules(module)
    if not own:
        return error
    lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [type(error).__name__]
    if format == "torchscript":  # (the interpreter's traceback first, the error last)
        said = re.sub(r"^\w+(Error|Exception): ", "", lines[-1])
        return UserError(f"A TorchScript trace of {type(model).__name__}'s policy fails (torch: {said.rstrip('.')}) "
                         f"in code that includes your {own}, which may fix the batch size or branch on values (the "
                         "trace is run on 64 observations besides its example): change that code, or export "
                         f"{_other_formats('exported_program', 'onnx')} (torch.export, which says where) instead of "
                         "torchscript.")
    first = re.split(r"(?<=[.!?])\s", lines[0])[0]  # (its first sentence: the rest points at torch's own logs)
    return UserError(f"torch.export cannot capture {type(model).__name__}'s policy as a graph for every batch size "
                     f"(torch: {first.rstrip('.')}), in code that includes your {own}, which may fix the "
                     f"batch size or branch on values (TORCH_LOGS=+dynamic shows where): change that code, or export "
                     f"{_other_formats('torchscript')} (a trace), instead of {format}.")


def _other_formats(*formats: str) -> str:
    """Export formats to use instead, as the caller names them: `--format exported_program or onnx` in the `rlspeed`
    command, `format='exported_program' or 'onnx'` in Python (`in_words`)."""
    return in_words("--format " + " or ".join(formats), "format=" + " or ".join(f"'{name}'" for name in formats))


def _save_program(program, text: str, file: Path) -> None:
    # The archive is made in memory, then written: torch's archive writer that meets a write error (a full disk)
    # writes again as it closes, and its C++ destructor then aborted the process (exit 134, no sentence); a policy's
    # program is small.
    archive = io.BytesIO()
    with warnings.catch_warnings():
        # (a stream: torch.export.save warns about a file name not ending in .pt2; tensors sharing storage, as an
        # LSTM's, make it warn about weights off the CPU, and an export's weights are on the CPU)
        warnings.filterwarnings("ignore", message="No complete tensor found in the group")
        torch.export.save(program, archive, extra_files={_SIDECAR_IN_ARCHIVE: text})
    with open(file, "wb") as stream:
        stream.write(archive.getbuffer())


def _save_onnx(program, module: PolicyExport, sidecar: dict, file: Path) -> None:
    # torch's ONNX op registry logs a warning for every torchvision op when torchvision is absent: noise here
    registry_log = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registry_log.level
    registry_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():  # torch's own deprecation of a pytree spec class it still uses
            warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
            onnx_program = torch.onnx.export(program, dynamo=True, verbose=False,
                                             input_names=[item["name"] for item in module.inputs()],
                                             output_names=[item["name"] for item in module.outputs()])
    finally:
        registry_log.setLevel(level)
    _name_dimensions(onnx_program.model, _dimension_names(program, module))
    # metadata_props are strings: scalars as they are, structures as JSON
    onnx_program.model.metadata_props.update(
        {key: value if isinstance(value, str) else json.dumps(value) for key, value in sidecar.items()})
    onnx_program.save(file, external_data=False)


def _dimension_names(program, module: PolicyExport) -> dict[str, str]:
    """The symbol torch.export gave each dynamic input dimension (`s21`) -> the name `module.dynamic_shapes()` gives
    that dimension (`batch`), read from the program's inputs."""
    shapes = {node.name: node.meta["val"].shape for node in program.graph.nodes if node.op == "placeholder"}
    names = {}
    for name, dims in zip(program.graph_signature.user_inputs, module.dynamic_shapes()["inputs"]):
        for index, dim in dims.items():
            size = shapes[name][index]
            if isinstance(size, torch.SymInt):
                names[str(size)] = dim.__name__
    return names


def _name_dimensions(model, names: dict[str, str]) -> None:
    """The ONNX graph's dynamic dimensions named as the sidecar names them (`names`: `_dimension_names`, `batch`), in
    place of the symbols torch's exporter gives them (`s21`), which a runtime shows for the inputs and outputs
    (onnxruntime's `get_inputs()`) and a server's dynamic-shape settings would have to name; each its own name where a
    policy has several."""
    from onnxscript import ir

    graph = model.graph
    for value in (*graph.inputs, *graph.outputs, *(output for node in graph for output in node.outputs)):
        if value.shape is not None and any(isinstance(dim, ir.SymbolicDim) and dim.value in names
                                           for dim in value.shape):
            value.shape = ir.Shape([names[dim.value] if isinstance(dim, ir.SymbolicDim) and dim.value in names
                                    else dim for dim in value.shape])


def export_checkpoint(checkpoint: str | Path, format: str | None = "onnx", out: str | Path | None = None, *,
                      algorithms: Mapping[str, type], action_mask: bool | None = None,
                      overwrite: bool = False, algorithm_of: Callable[[dict, Path], type] | None = None) -> Path:
    """`rlspeed export`: load a model file or a run directory's `model.safetensors` on the CPU and export it.

    `algorithms` maps checkpoint algorithm names to classes: pass `rlspeed.algos.ALGORITHMS` (this module does not
    import the algorithms that call it; from Python, `rlspeed.PPO.load(path).export(out)` does the same for one
    algorithm). `format` None: the one `out`'s suffix names (UserError for another suffix, as `export`), onnx
    without `out`. `out` defaults to the model file with the
    format's suffix (`model.onnx` beside `model.safetensors`);
    `action_mask` as `export` takes it. An existing file at the output path is refused unless `overwrite` (the model
    file itself always). `algorithm_of(meta, path)`, where given, is the class that loads the file of checkpoint
    metadata `meta` (`rlspeed export` gives `rlspeed eval`'s rule: a user's own class where its module is imported);
    else `algorithms`' entry for the algorithm it holds or derives from. What loading the file warns is said once,
    at the caller's line, also where the load then fails. Returns the written path.
    """
    if out is not None:  # (--out's suffix: the format it names, one that contradicts it or a model file's refused)
        format = export_format(out, format)
    elif format is None:
        format = "onnx"
    if format not in FORMATS:
        raise UserError(f"Unknown export format '{format}': use one of {', '.join(FORMATS)}.")
    path = run_model(checkpoint)
    with _LoadWarnings():  # (the file is read twice, its metadata first: what either says, said once)
        _, meta = load_checkpoint(path)
        refuse_non_model(path, meta)
        # (an algorithm of a user's own name, also one named as another rlspeed algorithm: the rlspeed algorithm it
        # derives from, whose load warns that it makes one)
        algo_cls = (algorithm_of(meta, path) if algorithm_of is not None
                    else algorithms.get(meta.get("derives_from")) or algorithms.get(meta.get("algo")))
        if algo_cls is None:
            raise UserError(f"'{path}' holds a model of {meta.get('class') or meta.get('algo')}, which is not one of "
                            "rlspeed's algorithms: export it in Python with its class imported "
                            "(rlspeed.load(path).export(out)).")
        target = local_path(out) if out is not None else path.with_suffix(FORMATS[format])
        if target.is_dir() or not target.name:  # (".", "/" or "" name no file: said before the sidecar's name)
            raise UserError(f"'{out}' is a directory; give the file to write, e.g. "
                            f"{target / ('policy' + FORMATS[format])}.")
        if target.exists() and target.resolve() == path.resolve():
            raise UserError(f"The export would replace the model it is made from ('{path}'): give another --out.")
        sidecar = target.with_name(target.name + ".json")
        for existing in (target, sidecar):  # (the sidecar is written too: a file of the user's there is theirs)
            if existing.exists() and not overwrite:
                raise UserError(f"'{existing}' exists: pass --overwrite to replace it, or give another --out.")
        model = algo_cls.load(path, device="cpu")
    return export(model, target, format=format, action_mask=action_mask)


class _LoadWarnings(warnings.catch_warnings):
    """The warnings said within (loading a model file), each once, shown at the caller's line outside rlspeed (the
    line that asked for the export, not rlspeed's), also where the load then fails: its error does not repeat them.
    (A class, not a generator: `warn_at_caller` finds the caller through rlspeed's frames only.)"""

    def __init__(self):
        super().__init__(record=True)

    def __enter__(self):
        self._said = super().__enter__()
        return self._said

    def __exit__(self, *exc_info):
        super().__exit__(*exc_info)
        for sentence, category in dict.fromkeys((str(warning.message), warning.category) for warning in self._said):
            warn_at_caller(sentence, category)
