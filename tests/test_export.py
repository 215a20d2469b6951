"""Policy export: the exported graph (ONNX in onnxruntime, TorchScript, torch.export) gives `predict(obs,
deterministic=True)`'s actions for raw observations, with normalisation and action mapping inside; the sidecar
describes it; bad requests are one clear sentence."""

from __future__ import annotations

import importlib.util
import json
import types

import numpy as np
import pytest
import torch

import rlspeed
from rlspeed.algos import ALGORITHMS, Algorithm
from rlspeed.envs import RunningMeanStd
from rlspeed.errors import UserError
from rlspeed.export import FORMATS, export, export_checkpoint

BATCHES = (1, 17)
# torch deprecates TorchScript (trace, save, load) in favour of torch.export; the format is still exported on request
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")


def _randomise(model, seed: int) -> None:
    """Weights moved far from their small-output initialisation (so actions reach the Box bounds and tanh
    saturates) and random observation statistics (so normalisation matters)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model._modules().values():
            for param in [module] if isinstance(module, torch.Tensor) else module.parameters():
                param.add_(0.5 * torch.randn(param.shape, generator=generator).to(param.device))
        if model.obs_rms is None:
            model.obs_rms = RunningMeanStd(model.spec.observation_shape, device=model.device)
        model.obs_rms.mean.add_(torch.randn(model.obs_rms.mean.shape, generator=generator))
        model.obs_rms.var.mul_(torch.rand(model.obs_rms.var.shape, generator=generator) * 4 + 0.1)


def _build(algo: str, env_id: str) -> Algorithm:
    if algo == "ppo":  # trained briefly, observation statistics from the env
        model = rlspeed.PPO(env_id, seed=0, num_envs=4, num_steps=32, normalize_obs=True)
        model.learn(256, progress_bar=False)
        assert model.obs_rms is not None and float(model.obs_rms.count) > 100
    else:
        model = ALGORITHMS[algo](env_id, seed=0, net_arch=(32, 32))
    _randomise(model, seed=len(algo) + len(env_id))
    return model


CASES = [("ppo", "CartPole-v1"), ("ppo", "Pendulum-v1"), ("a2c", "CartPole-v1"), ("dqn", "CartPole-v1"),
         ("sac", "Pendulum-v1"), ("td3", "Pendulum-v1"), ("ddpg", "Pendulum-v1")]


@pytest.fixture(scope="module", params=CASES, ids=[f"{a}-{e}" for a, e in CASES])
def model(request):
    return _build(*request.param)


def _observations(model, batch: int, seed: int) -> np.ndarray:
    """Raw observations around the model's statistics, a few far out (normalisation clips them at 10 std)."""
    rng = np.random.default_rng(seed)
    mean = model.obs_rms.mean.cpu().numpy()
    std = np.sqrt(model.obs_rms.var.cpu().numpy())
    obs = mean + std * rng.normal(size=(batch, *model.spec.observation_shape)) * 3
    obs[::5] *= 20
    return obs.astype(np.float32)


def _runner(format: str, path):
    """A function raw observations (numpy) -> actions (numpy) running the exported file."""
    if format == "onnx":
        ort = pytest.importorskip("onnxruntime")
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return lambda obs: session.run(["actions"], {"obs": obs})[0]
    module = torch.jit.load(str(path)) if format == "torchscript" else torch.export.load(str(path)).module()
    return lambda obs: module(torch.from_numpy(obs)).numpy()


def _assert_same_actions(model, run, seed: int) -> None:
    for batch in BATCHES:
        obs = _observations(model, batch, seed + batch)
        expected, _ = model.predict(obs, deterministic=True)
        got = run(obs)
        assert got.shape == expected.shape
        if model.spec.discrete:
            assert got.dtype == np.int64
            np.testing.assert_array_equal(got, expected)
        else:
            assert got.dtype == np.float32
            np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("format", list(FORMATS))
def test_exported_policy_matches_predict(model, format, tmp_path):
    if format == "onnx":
        pytest.importorskip("onnxruntime")
        pytest.importorskip("onnxscript")
    path = export(model, tmp_path / f"policy{FORMATS[format]}", format=format)
    _assert_same_actions(model, _runner(format, path), seed=1)
    if not model.spec.discrete:  # the Box's bounds were reached: the clipping or rescaling is in the graph
        actions = _runner(format, path)(_observations(model, 64, seed=2))
        low, high = model.spec.action_space.low, model.spec.action_space.high
        assert np.all(actions >= low - 1e-5) and np.all(actions <= high + 1e-5)
        assert np.any(np.isclose(actions, high, atol=1e-3) | np.isclose(actions, low, atol=1e-3))


def test_sidecar_and_onnx_metadata_describe_the_policy(tmp_path):
    pytest.importorskip("onnxscript")
    onnx = pytest.importorskip("onnx")
    model = rlspeed.SAC("Pendulum-v1", seed=0, net_arch=(16,))
    path = export(model, tmp_path / "sac.onnx", format="onnx")
    sidecar = json.loads((tmp_path / "sac.onnx.json").read_text())
    assert sidecar["algo"] == "sac" and sidecar["env_id"] == "Pendulum-v1" and sidecar["format"] == "onnx"
    assert sidecar["rlspeed_version"] == rlspeed.__version__
    assert sidecar["inputs"] == [{"name": "obs", "dtype": "float32", "shape": ["batch", 3],
                                  "description": "raw observations as the env returns them (not normalised)"}]
    assert [(o["name"], o["dtype"], o["shape"]) for o in sidecar["outputs"]] == [("actions", "float32", ["batch", 1])]
    assert sidecar["action_space"] == {"type": "box", "shape": [1], "low": [-2.0], "high": [2.0], "dtype": "float32"}
    # the space as checkpoints record it (rlspeed.envs.base.space_to_json): unbounded entries as null
    assert sidecar["observation_space"] == {"type": "box", "shape": [3], "low": [None] * 3, "high": [None] * 3,
                                            "dtype": "float32"}
    assert sidecar["observation_normalization"] is None
    proto = onnx.load(str(path))
    metadata = {prop.key: prop.value for prop in proto.metadata_props}
    assert metadata["algo"] == "sac" and metadata["rlspeed_version"] == rlspeed.__version__
    assert json.loads(metadata["action_space"]) == sidecar["action_space"]
    assert [i.name for i in proto.graph.input] == ["obs"] and [o.name for o in proto.graph.output] == ["actions"]


def test_archives_carry_the_sidecar(tmp_path):
    model = rlspeed.DQN("CartPole-v1", seed=0, net_arch=(16,))
    extra = {"rlspeed.json": ""}
    torch.jit.load(str(export(model, tmp_path / "q.pt", format="torchscript")), _extra_files=extra)
    described = json.loads(extra["rlspeed.json"])
    assert described["algo"] == "dqn" and described["action_space"] == {"type": "discrete", "n": 2}
    assert described == json.loads((tmp_path / "q.pt.json").read_text())


def test_export_checkpoint_from_a_run_directory(tmp_path):
    model = rlspeed.TD3("Pendulum-v1", seed=0, net_arch=(16,))
    _randomise(model, seed=3)
    model.save(tmp_path / "model.safetensors")
    path = export_checkpoint(tmp_path, "torchscript", algorithms=ALGORITHMS)
    assert path == tmp_path / "model.pt" and (tmp_path / "model.pt.json").is_file()
    _assert_same_actions(model, _runner("torchscript", path), seed=4)
    out = export_checkpoint(tmp_path / "model.safetensors", "exported_program", out=tmp_path / "sub" / "p.pt2",
                            algorithms=ALGORITHMS)
    _assert_same_actions(model, _runner("exported_program", out), seed=5)


def test_model_export_method(tmp_path):
    if not hasattr(Algorithm, "export"):
        pytest.skip("Algorithm.export is not added yet")
    model = rlspeed.DQN("CartPole-v1", seed=0, net_arch=(16,))
    _randomise(model, seed=6)
    path = model.export(tmp_path / "q.pt2", format="exported_program")
    _assert_same_actions(model, _runner("exported_program", path), seed=6)


def test_bad_requests_are_one_sentence(tmp_path, monkeypatch):
    model = rlspeed.DQN("CartPole-v1", seed=0, net_arch=(16,))
    with pytest.raises(UserError, match="Unknown export format 'tflite': use one of onnx, torchscript"):
        export(model, tmp_path / "q.tflite", format="tflite")
    with pytest.raises(UserError, match="is a directory"):
        export(model, tmp_path, format="torchscript")
    with pytest.raises(UserError, match="without a model.safetensors"):
        export_checkpoint(tmp_path, "onnx", algorithms=ALGORITHMS)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "onnxscript" else real_find_spec(name, *a))
    with pytest.raises(UserError, match=r"needs onnxscript: pip install rlspeed\[export\]"):
        export(model, tmp_path / "q.onnx", format="onnx")
    assert not (tmp_path / "q.onnx").exists() and not (tmp_path / "q.onnx.json").exists()


def test_policy_without_an_exporter_names_it(tmp_path):
    stranger = types.SimpleNamespace(name="mine", policy=torch.nn.Linear(3, 1))
    with pytest.raises(UserError, match=r"policy \(Linear\) has no exporter"):
        export(stranger, tmp_path / "p.pt", format="torchscript")
    if "recurrent_ppo" in ALGORITHMS:
        recurrent = ALGORITHMS["recurrent_ppo"]("CartPole-v1", seed=0)
        with pytest.raises(UserError, match="LSTM policy cannot be exported yet"):
            export(recurrent, tmp_path / "r.pt", format="torchscript")


def test_a_policy_the_exporter_does_not_match_is_refused(tmp_path):
    class MirroredTD3(rlspeed.TD3):
        def _policy_actions(self, obs, deterministic):
            return -super()._policy_actions(obs, deterministic)

    model = MirroredTD3("Pendulum-v1", seed=0, net_arch=(16,))
    _randomise(model, seed=7)
    with pytest.raises(UserError, match=r"does not give the model's actions.*`_export_module\(\)`"):
        export(model, tmp_path / "m.pt2", format="exported_program")
    assert not (tmp_path / "m.pt2").exists()
