"""Export a trained policy as one self-contained graph: ONNX, TorchScript or a torch.export program.

The graph is `predict(obs, deterministic=True)` with nothing left outside it: raw observations go in (a batch
`[B, *observation_shape]` in the observation's dtype: float32 vectors, uint8 images, which the graph scales, int64
indices; one input per key, in the space's key order, for Dict observations; B dynamic), the model's observation
normalisation and encoder run inside, and actions come
out as the env takes them (Discrete: int64 indices `[B]`; Box: float32 `[B, A]`, clipped to or rescaled onto the
Box exactly as the algorithm does). Exported policies that leave normalisation or action rescaling to the caller
disagree with Python; this module exists so that they cannot.

A sidecar `FILE.json` beside the exported file (and, for ONNX, the model's `metadata_props`) names the inputs,
outputs, spaces, algorithm, env id and rlspeed version.

Each policy family is a `PolicyExport` module. `export_module(model)` builds it: an algorithm that defines
`_export_module()` (the hook on `Algorithm`) gives its own, otherwise `default_export_module` picks one from the
networks the model has. New inputs (an action mask, a recurrent state) are a subclass with more `inputs`, more
`example_inputs` and a `forward` that takes them.

Graphs are captured on the CPU (weights copied there), with `torch.export` for the exported program and ONNX (the
ONNX file is `torch.onnx.export(..., dynamo=True)` of that same program; it needs `onnx` and `onnxscript`) and
`torch.jit.trace` for TorchScript.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import logging
import os
import warnings
from collections.abc import Mapping
from pathlib import Path

import gymnasium as gym
import torch
from torch import nn

from rlspeed._version import __version__
from rlspeed.checkpoint import load_checkpoint
from rlspeed.envs.base import observation_layout, space_to_json
from rlspeed.envs.wrappers import observation_statistics
from rlspeed.errors import UserError
from rlspeed.nn import ActorCritic, DeterministicActor, QNetwork, RecurrentActorCritic, SquashedGaussianActor

# format -> the file suffix `export_checkpoint` gives a file when no --out names one
FORMATS = {"onnx": ".onnx", "torchscript": ".pt", "exported_program": ".pt2"}
_SIDECAR_IN_ARCHIVE = "rlspeed.json"  # the sidecar's name inside TorchScript and torch.export archives
_EXPORT_PACKAGES = ("onnx", "onnxscript")


class PolicyExport(nn.Module):
    """Raw observations -> actions, as `predict(obs, deterministic=True)` gives them; the base of every family.

    Holds CPU copies of what it needs (networks, normalisation statistics, action bounds) as submodules and buffers,
    so the exported graph carries them. A subclass writes `actions` (the policy on normalised observations, in
    their stored layout: its networks flatten or encode them) and says what it outputs in `outputs` and
    `action_mapping`.
    """

    #: how the network's output becomes the env's action (written to the sidecar)
    action_mapping = ""

    def __init__(self, model, observation_clip: float = 10.0):
        super().__init__()
        self.observation_space = model.spec.observation_space
        self.observation_shape = tuple(model.spec.observation_shape)
        layout = observation_layout(self.observation_space)
        # the graph's observation inputs: (name, shape, dtype) each; Dict observations one per key, in key order
        self.observation_inputs = ([(key, shape, dtype) for key, (shape, dtype) in layout.items()]
                                   if isinstance(layout, dict) else [("obs", *layout)])
        self.keyed = isinstance(layout, dict)
        self.action_space = model.spec.action_space
        self.observation_clip = observation_clip
        self.obs_rms: nn.Module | None = None
        if model.obs_rms is not None:  # a fresh copy: the model's may be tied to a training env or a process group
            self.obs_rms = observation_statistics(self.observation_space)
            self.obs_rms.load_state_dict({k: v.detach().cpu() for k, v in model.obs_rms.state_dict().items()})

    def forward(self, *observations: torch.Tensor) -> torch.Tensor:
        """Actions `[B]` or `[B, A]` for raw observations `[B, *observation_shape]` (one tensor per key, in key
        order, for Dict observations)."""
        obs = dict(zip((name for name, _, _ in self.observation_inputs), observations)) if self.keyed \
            else observations[0]
        if self.obs_rms is not None:
            obs = self.obs_rms.normalize(obs, clip=self.observation_clip)
        return self.actions(obs)

    def actions(self, obs) -> torch.Tensor:
        """The deterministic policy's env actions for normalised observations `[B, ...]` (a dict for Dict ones)."""
        raise NotImplementedError

    # --- what the exporters and the sidecar read ----------------------------------------------------------------
    def example_inputs(self, batch: int = 2) -> tuple[torch.Tensor, ...]:
        """Inputs to capture the graph with (a batch of 2: a batch of 1 would be specialised as a constant)."""
        return tuple(torch.zeros(batch, *shape, dtype=dtype) for _, shape, dtype in self.observation_inputs)

    def example_inputs_from(self, obs) -> tuple[torch.Tensor, ...]:
        """The graph's inputs for these observations (a subclass with more inputs adds their neutral values)."""
        return tuple(obs[name] for name, _, _ in self.observation_inputs) if self.keyed else (obs,)

    def dynamic_shapes(self) -> dict:
        """torch.export's dynamic dimensions of each input (the batch)."""
        batch = torch.export.Dim("batch", min=1)
        return {"observations": tuple({0: batch} for _ in self.observation_inputs)}

    def inputs(self) -> list[dict]:
        """The graph's inputs, in order: name, dtype, shape (`"batch"` for the dynamic dimension), meaning."""
        normalised = "normalised inside the graph" if self.obs_rms is not None else "not normalised"
        items = []
        for name, shape, dtype in self.observation_inputs:
            what = f"raw observations{f' (key {name!r})' if self.keyed else ''} as the env returns them"
            how = normalised if dtype == torch.float32 else "converted, scaled and encoded inside the graph"
            items.append({"name": name, "dtype": str(dtype).removeprefix("torch."), "shape": ["batch", *shape],
                          "description": f"{what} ({how})"})
        return items

    def outputs(self) -> list[dict]:
        """The graph's outputs, in order (default: one action tensor for the model's action space)."""
        import gymnasium as gym

        if isinstance(self.action_space, gym.spaces.Discrete):
            return [{"name": "actions", "dtype": "int64", "shape": ["batch"],
                     "description": "action indices in [0, n)"}]
        return [{"name": "actions", "dtype": "float32", "shape": ["batch", *self.action_space.shape],
                 "description": "actions in the env's units, within the action space's bounds"}]


def _box_tensors(model, *names: str) -> list[torch.Tensor]:
    return [getattr(model, name).detach().to("cpu", torch.float32).clone() for name in names]


def _cpu_copy(module: nn.Module) -> nn.Module:
    module = copy.deepcopy(module).to("cpu").eval()
    module.requires_grad_(False)
    return module


class ActorCriticExport(PolicyExport):
    """PPO and A2C (`ActorCritic`): the actor's logits argmax, or its Gaussian mean clipped to the Box."""

    def __init__(self, model):
        super().__init__(model)
        self.policy = _cpu_copy(model.policy)
        self.discrete = model.spec.discrete
        self.action_mapping = "argmax of the logits" if self.discrete else "Gaussian mean clipped to the Box"
        if not self.discrete:
            low, high = _box_tensors(model, "_action_low", "_action_high")
            self.register_buffer("action_low", low)
            self.register_buffer("action_high", high)

    def actions(self, obs) -> torch.Tensor:
        # the actor member only: no value head in the graph
        out = self.policy.body(self.policy.features(obs), members=slice(0, 1))[0]
        if self.discrete:
            return out.argmax(-1)
        return torch.maximum(torch.minimum(out, self.action_high), self.action_low)


class _RescaledExport(PolicyExport):
    """Off-policy actors whose actions lie in [-1, 1]: rescaled onto the Box as `OffPolicyAlgorithm._to_env` does."""

    action_mapping = "tanh output in [-1, 1] rescaled to the Box: center + half_range * a"

    def __init__(self, model):
        super().__init__(model)
        self.actor = _cpu_copy(model.actor)
        center, half_range = _box_tensors(model, "_action_center", "_action_half_range")
        self.register_buffer("action_center", center)
        self.register_buffer("action_half_range", half_range)

    def unit_actions(self, obs: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def actions(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.addcmul(self.action_center, self.action_half_range, self.unit_actions(obs))


class SquashedGaussianExport(_RescaledExport):
    """SAC: tanh of the Gaussian mean, rescaled onto the Box."""

    def unit_actions(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor.deterministic(obs)


class DeterministicActorExport(_RescaledExport):
    """TD3 and DDPG: the actor's tanh output, rescaled onto the Box."""

    def unit_actions(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor(obs)


class QNetworkExport(PolicyExport):
    """DQN: the greedy action, argmax of Q(s, .)."""

    action_mapping = "argmax of Q(s, .)"

    def __init__(self, model):
        super().__init__(model)
        self.q_network = _cpu_copy(model.q_network)

    def actions(self, obs: torch.Tensor) -> torch.Tensor:
        return self.q_network(obs).argmax(dim=1)


def default_export_module(model) -> PolicyExport:
    """The `PolicyExport` for a model's networks; UserError naming the part that has no exporter."""
    policy = getattr(model, "policy", None)
    if isinstance(policy, RecurrentActorCritic):
        raise UserError(f"{model.name.upper()}'s LSTM policy cannot be exported yet (its recurrent state as graph "
                        "inputs and outputs is not written); export a feed-forward model (ppo, a2c, dqn, sac, td3, "
                        "ddpg).")
    if isinstance(policy, ActorCritic):
        return ActorCriticExport(model)
    if isinstance(getattr(model, "q_network", None), QNetwork):
        return QNetworkExport(model)
    if isinstance(getattr(model, "actor", None), SquashedGaussianActor):
        return SquashedGaussianExport(model)
    if isinstance(getattr(model, "actor", None), DeterministicActor):
        return DeterministicActorExport(model)
    raise UserError(f"{type(model).__name__}'s policy ({type(policy).__name__}) has no exporter: rlspeed exports "
                    "ActorCritic, QNetwork, SquashedGaussianActor and DeterministicActor policies; give the algorithm "
                    "an `_export_module()` that returns a rlspeed.export.PolicyExport.")


def export_module(model) -> PolicyExport:
    """The model's own `_export_module()` where it has one, else `default_export_module(model)`; in eval mode,
    checked against the model's own actions (`check_matches_model`)."""
    hook = getattr(model, "_export_module", None)
    module = hook() if hook is not None else default_export_module(model)
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


def check_matches_model(model, module: PolicyExport, batch: int = 64) -> None:
    """UserError unless `module` gives the model's deterministic actions (`model.act`) on random observations:
    identical discrete actions, continuous ones within 1e-5. A model whose `_policy_actions` differs from what its
    networks suggest (a subclass) is caught here instead of exporting a policy that disagrees with Python.
    Models on the CPU only: another device's kernels round differently."""
    if model.device.type != "cpu":
        return
    generator = torch.Generator().manual_seed(0)
    obs = random_observations(module.observation_space, batch, generator)
    if module.obs_rms is not None and isinstance(obs, torch.Tensor):
        # observations at the model's scale, so normalisation does not clip them all
        obs = module.obs_rms.mean + obs * torch.sqrt(module.obs_rms.var)
    with torch.no_grad():
        expected, got = model.act(obs, deterministic=True), module(*module.example_inputs_from(obs))
    same = (torch.equal(got.long(), expected.long()) if got.dtype in (torch.int32, torch.int64)
            else got.shape == expected.shape and torch.allclose(got, expected, rtol=0, atol=1e-5))
    if not same:
        raise UserError(f"The exported graph for {type(model).__name__} ({type(module).__name__}) does not give the "
                        "model's actions: its policy differs from the one rlspeed knows how to export; give the "
                        "algorithm an `_export_module()` that returns a rlspeed.export.PolicyExport matching its "
                        "`_policy_actions`.")


def describe(model, module: PolicyExport, format: str, file: Path) -> dict:
    """The sidecar's content: what the exported file takes and gives, and where it came from."""
    return {"format": format, "file": file.name, "algo": model.name, "env_id": model.env_id,
            "rlspeed_version": __version__, "torch_version": torch.__version__,
            "num_timesteps": int(model.num_timesteps), "deterministic": True,
            "inputs": module.inputs(), "outputs": module.outputs(),
            "observation_space": space_to_json(module.observation_space),
            "action_space": space_to_json(module.action_space),
            "observation_normalization": (None if module.obs_rms is None else
                                          {"formula": "clip((obs - mean) / sqrt(var + 1e-8), -clip, clip)",
                                           "clip": module.observation_clip, "in_graph": True}),
            "action_mapping": module.action_mapping}


def _check_onnx_packages() -> None:
    missing = [name for name in _EXPORT_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise UserError(f"ONNX export needs {' and '.join(missing)}: pip install rlspeed[export]")


def _replace_atomically(write, path: Path) -> None:
    """Write through `write(temporary path)`, then rename: a failed export leaves no half-written file at `path`."""
    temporary = path.with_name(f".{path.stem}.tmp{path.suffix}")  # same suffix: torch.export.save warns otherwise
    try:
        write(temporary)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def export(model, path: str | Path, format: str = "onnx") -> Path:
    """Write `model`'s deterministic policy to `path` as `format` ("onnx", "torchscript" or "exported_program"),
    with a sidecar `path + ".json"`; returns the path.

    Load the result with `onnxruntime.InferenceSession(path)`, `torch.jit.load(path)` or
    `torch.export.load(path).module()`; each maps raw observations `[B, ...]` to the env's actions.
    """
    if format not in FORMATS:
        raise UserError(f"Unknown export format '{format}': use one of {', '.join(FORMATS)}.")
    if format == "onnx":
        _check_onnx_packages()
    path = Path(path)
    if path.is_dir():
        raise UserError(f"'{path}' is a directory; give the file to write, e.g. {path / ('policy' + FORMATS[format])}.")
    path.parent.mkdir(parents=True, exist_ok=True)
    module = export_module(model)
    sidecar = describe(model, module, format, path)
    text = json.dumps(sidecar, indent=2)
    example = module.example_inputs()
    with torch.no_grad():
        if format == "torchscript":
            traced = torch.jit.trace(module, example)
            _replace_atomically(lambda f: torch.jit.save(traced, str(f), _extra_files={_SIDECAR_IN_ARCHIVE: text}),
                                path)
        else:
            program = torch.export.export(module, example, dynamic_shapes=module.dynamic_shapes(), strict=False)
            if format == "exported_program":
                _replace_atomically(lambda f: _save_program(program, text, f), path)
            else:
                _replace_atomically(lambda f: _save_onnx(program, module, sidecar, f), path)
    path.with_name(path.name + ".json").write_text(text + "\n")
    return path


def _save_program(program, text: str, file: Path) -> None:
    with open(file, "wb") as stream:  # a stream: torch.export.save warns about a file name not ending in .pt2
        torch.export.save(program, stream, extra_files={_SIDECAR_IN_ARCHIVE: text})


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
    # metadata_props are strings: scalars as they are, structures as JSON
    onnx_program.model.metadata_props.update(
        {key: value if isinstance(value, str) else json.dumps(value) for key, value in sidecar.items()})
    onnx_program.save(file, external_data=False)


def export_checkpoint(checkpoint: str | Path, format: str = "onnx", out: str | Path | None = None, *,
                      algorithms: Mapping[str, type]) -> Path:
    """`rlspeed export`: load a model file or a run directory's `model.safetensors` on the CPU and export it.

    `algorithms` maps checkpoint algorithm names to classes (`rlspeed.algos.ALGORITHMS`; passed in, so that this
    module does not import the algorithms that call it). `out` defaults to the model file with the format's suffix
    (`model.onnx` beside `model.safetensors`). Returns the written path.
    """
    if format not in FORMATS:
        raise UserError(f"Unknown export format '{format}': use one of {', '.join(FORMATS)}.")
    path = Path(checkpoint)
    if path.is_dir():
        if not (path / "model.safetensors").is_file():
            raise UserError(f"'{path}' is a directory without a model.safetensors (a run directory gets one when "
                            "training finishes); give the model file.")
        path = path / "model.safetensors"
    _, meta = load_checkpoint(path)
    algo_cls = algorithms.get(meta.get("algo"))
    if algo_cls is None:
        raise UserError(f"'{path}' holds an unknown algorithm '{meta.get('algo')}'.")
    model = algo_cls.load(path, device="cpu")
    return export(model, out if out is not None else path.with_suffix(FORMATS[format]), format=format)
