"""Policy export: the exported graph (ONNX in onnxruntime, TorchScript, torch.export) gives `predict(obs,
deterministic=True)`'s actions for raw observations, with normalisation and action mapping inside; the sidecar
describes it; bad requests are one clear sentence."""

from __future__ import annotations

import importlib.util
import json
import logging
import re
import sys
import types
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import needs_torch_export

import rlspeed
from rlspeed.algos import ALGORITHMS, Algorithm
from rlspeed.envs import RunningMeanStd
from rlspeed.envs.base import EnvSpec
from rlspeed.envs.wrappers import normalizable, observation_statistics
from rlspeed.errors import UserError
from rlspeed.export import FORMATS, export, export_checkpoint, load_program, random_action_masks, random_observations
from rlspeed.nn import Encoder

BATCHES = (1, 17)
# torch deprecates TorchScript (trace, save, load) in favour of torch.export; the format is still exported on request;
# on a torch older than 2.10 every format but TorchScript is refused
pytestmark = [pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning"), needs_torch_export]


@pytest.fixture(scope="module", autouse=True)
def one_onnx_function_table():
    """The module's ONNX exports share torch's table of ONNX functions: `torch.onnx.export` builds it afresh at each
    call (torchlib's ~500 functions, each parsed from its source: over a second of every ONNX test), the same table
    for the same opset each time. Each export gets its own copy (rlspeed registers no functions of its own)."""
    try:
        from torch.onnx._internal.exporter._registration import ONNXRegistry
    except ImportError:  # (a torch without the dynamo exporter: its tests skip)
        ONNXRegistry = None
    build, tables = getattr(ONNXRegistry, "__dict__", {}).get("from_torchlib"), {}
    if not isinstance(build, classmethod):  # (another torch's exporter: each export builds its own table)
        yield
        return

    def from_torchlib(cls, *args, **kwargs):
        key = (cls, args, tuple(sorted(kwargs.items())))
        if key not in tables:
            tables[key] = build.__func__(cls, *args, **kwargs)
        table = cls.__new__(cls)
        table.__dict__.update(tables[key].__dict__)
        table.functions = {name: list(functions) for name, functions in tables[key].functions.items()}
        return table

    ONNXRegistry.from_torchlib = classmethod(from_torchlib)
    try:
        yield
    finally:
        ONNXRegistry.from_torchlib = build


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


@pytest.mark.parametrize(("activation", "format"), [("gelu", "onnx"), ("mish", "onnx"), ("leaky_relu", "torchscript"),
                                                   ("softplus", "exported_program")])
def test_every_activation_exports_as_predict_computes(activation, format, tmp_path):
    """The activations SB3 users bring (nn.GELU, nn.Mish, ...) export to each format, their outputs predict's (an
    ONNX file runs them in onnxruntime's kernels, not torch's)."""
    if format == "onnx":
        pytest.importorskip("onnxruntime")
        pytest.importorskip("onnxscript")
    model = rlspeed.SAC("Pendulum-v1", seed=0, device="cpu", net_arch=(16, 16), activation=activation)
    _randomise(model, seed=3)
    path = export(model, tmp_path / f"policy{FORMATS[format]}", format=format)
    _assert_same_actions(model, _runner(format, path), seed=1)


def _odd_bounds_pendulum():
    from gymnasium.envs.classic_control.pendulum import PendulumEnv

    return gym.wrappers.RescaleAction(PendulumEnv(), np.float32(-1.38), np.float32(0.82))


ODD_BOUNDS_ID = "RlspeedTestOddBoundsPendulum-v0"
gym.register(ODD_BOUNDS_ID, entry_point=_odd_bounds_pendulum, max_episode_steps=200)


@pytest.mark.parametrize("algo", ["sac", "td3"])
@pytest.mark.parametrize("format", list(FORMATS))
def test_exported_actions_stay_inside_bounds_the_rescaling_rounds_past(algo, format, tmp_path):
    """On a Box of [-1.38, 0.82] float32's center + half_range * 1 rounds past 0.82 (the model clamps, as the env's
    `action_space.contains` asks): the exported graph clamps too, so saturated actions are 0.82 exactly, not a step
    above it."""
    if format == "onnx":
        pytest.importorskip("onnxruntime")
        pytest.importorskip("onnxscript")
    model = ALGORITHMS[algo](ODD_BOUNDS_ID, seed=0, net_arch=(32, 32))
    _randomise(model, seed=3)
    path = export(model, tmp_path / f"policy{FORMATS[format]}", format=format)
    actions = _runner(format, path)(_observations(model, 256, seed=2))
    low, high = model.spec.action_space.low, model.spec.action_space.high
    assert np.all(actions >= low) and np.all(actions <= high) and np.any(actions == high)


def test_sidecar_and_onnx_metadata_describe_the_policy(tmp_path):
    pytest.importorskip("onnxscript")
    onnx = pytest.importorskip("onnx")
    model = rlspeed.SAC("Pendulum-v1", seed=0, net_arch=(16,))
    path = export(model, tmp_path / "sac.onnx", format="onnx")
    sidecar = json.loads((tmp_path / "sac.onnx.json").read_text())
    assert sidecar["algo"] == "sac" and sidecar["env_id"] == "Pendulum-v1" and sidecar["format"] == "onnx"
    assert sidecar["rlspeed_version"] == rlspeed.__version__
    assert sidecar["inputs"] == [{"name": "obs", "dtype": "float32", "shape": ["batch", 3], "observation_path": [],
                                  "description": "raw observations as the env returns them (not normalised)"}]
    assert [(o["name"], o["dtype"], o["shape"]) for o in sidecar["outputs"]] == [("actions", "float32", ["batch", 1])]
    assert sidecar["action_space"] == {"type": "box", "shape": [1], "low": [-2.0], "high": [2.0], "dtype": "float32"}
    # the space as checkpoints record it (rlspeed.envs.base.space_to_json): Gymnasium's env's bounds (they were null,
    # "unbounded", for the native envs)
    assert sidecar["observation_space"] == {"type": "box", "shape": [3], "low": [-1.0, -1.0, -8.0],
                                            "high": [1.0, 1.0, 8.0], "dtype": "float32"}
    assert sidecar["observation_normalization"] is None and sidecar["preprocessing"] is None
    proto = onnx.load(str(path))
    metadata = {prop.key: prop.value for prop in proto.metadata_props}
    assert metadata["algo"] == "sac" and metadata["rlspeed_version"] == rlspeed.__version__
    assert json.loads(metadata["action_space"]) == sidecar["action_space"]
    assert [i.name for i in proto.graph.input] == ["obs"] and [o.name for o in proto.graph.output] == ["actions"]
    # the graph's own shapes name the batch as the sidecar does (torch's exporter named it after its symbol, "s21",
    # which onnxruntime's get_inputs() showed a server)
    assert [[dim.dim_param or dim.dim_value for dim in value.type.tensor_type.shape.dim]
            for value in (*proto.graph.input, *proto.graph.output)] == [["batch", 3], ["batch", 1]]


def test_a_population_members_sidecar_records_its_seed():
    """A member's sidecar says which member it is: its seed (the sidecar had none, so the exports of a population's
    members could not be told apart); and which modules register its env (none for Gymnasium's own ids)."""
    from pathlib import Path

    from rlspeed.export import describe, export_module
    from rlspeed.population import Population

    member = Population(rlspeed.DQN, "CartPole-v1", seeds=[3, 4], net_arch=(16,), device="cpu").member_model(1)
    sidecar = describe(member, export_module(member), "onnx", Path("member.onnx"))
    assert sidecar["seed"] == 4 and sidecar["gym_packages"] == []


def test_the_sidecar_names_the_module_that_registers_rlspeeds_own_gymnasium_ids():
    """An env id rlspeed registers with Gymnasium (PendulumNoVel-v1, RecurrentPPO's task) needs `rlspeed.envs`
    imported before `gymnasium.make` works: the sidecar's `gym_packages` names it (it was empty, as for Gymnasium's
    own ids, and a deployment that made the env from the sidecar stopped at Gymnasium's NameNotFound)."""
    from pathlib import Path

    from rlspeed.export import describe, export_module

    model = rlspeed.RecurrentPPO("PendulumNoVel-v1", seed=0, num_envs=1, lstm_hidden_size=4, device="cpu")
    sidecar = describe(model, export_module(model), "onnx", Path("policy.onnx"))
    assert sidecar["gym_packages"] == ["rlspeed.envs"]


def test_a_mask_row_that_allows_no_action_gives_action_0_in_the_exported_policy():
    """A mask row allowing no action, which `predict` refuses, gives action 0 in the graph (which checks no
    values), as docs/export.md tells a deployment that must refuse such rows itself; the other rows are unchanged."""
    from rlspeed.export import export_module

    model = rlspeed.PPO("Taxi-v4", seed=0, num_envs=1, num_steps=16, batch_size=16, net_arch=(8,), device="cpu")
    policy = export_module(model).with_action_mask()
    favourites = model.predict(np.arange(500))[0]
    states = torch.tensor([int(np.flatnonzero(favourites != 0)[0]), 17, 328])  # (row 0's own favourite is not 0)
    mask = torch.zeros(3, 6, dtype=torch.bool)
    mask[1] = True  # row 1: every action allowed
    mask[2, 5] = True  # row 2: only action 5
    with pytest.raises(UserError, match="allows no action"):
        model.predict(states.numpy(), action_masks=mask.numpy())
    actions = policy(states, mask)
    assert actions[0] == 0 and actions[2] == 5 and actions[1] == model.predict(states[1:2].numpy())[0][0]


def test_an_onnx_graph_names_each_dynamic_dimension_as_the_export_declares_it(tmp_path):
    """Each dynamic dimension of the ONNX graph gets the name the export module's `dynamic_shapes()` gives it: every
    symbolic one was named `batch`, right only while the batch was the only one (a policy of one's own that also
    takes a history of any length read `[batch, 3]`, `[batch, 3]` -> `[batch, batch]`)."""
    pytest.importorskip("onnxscript")
    onnx = pytest.importorskip("onnx")
    from rlspeed.export import _save_onnx

    class History(torch.nn.Module):
        def forward(self, *inputs):
            obs, history = inputs
            return obs @ history.T

        def dynamic_shapes(self):
            return {"inputs": ({0: torch.export.Dim("batch", min=1)}, {0: torch.export.Dim("steps", min=1)})}

        def inputs(self):
            return [{"name": "obs"}, {"name": "history"}]

        def outputs(self):
            return [{"name": "scores"}]

    module = History()
    program = torch.export.export(module, (torch.zeros(2, 3), torch.zeros(4, 3)),
                                  dynamic_shapes=module.dynamic_shapes(), strict=False)
    _save_onnx(program, module, {"algo": "history"}, tmp_path / "history.onnx")
    proto = onnx.load(str(tmp_path / "history.onnx"))
    assert [[dim.dim_param or dim.dim_value for dim in value.type.tensor_type.shape.dim]
            for value in (*proto.graph.input, *proto.graph.output)] == [["batch", 3], ["steps", 3], ["batch", "steps"]]


def test_every_format_exports_with_warnings_as_errors(tmp_path):
    """`python -W error -m rlspeed export RUN --format torchscript` ended on torch's DeprecationWarning of
    torch.jit.trace, which the caller cannot change: the format asked for is a trace."""
    model = rlspeed.DQN("CartPole-v1", seed=0, net_arch=(16,))
    formats = {"torchscript": ".pt", "exported_program": ".pt2"}
    if importlib.util.find_spec("onnxscript") is not None and importlib.util.find_spec("onnx") is not None:
        formats["onnx"] = ".onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for format, suffix in formats.items():
            assert export(model, tmp_path / f"q{suffix}", format=format).exists()


def test_archives_carry_the_sidecar(tmp_path):
    model = rlspeed.DQN("CartPole-v1", seed=0, net_arch=(16,))
    extra = {"rlspeed.json": ""}
    torch.jit.load(str(export(model, tmp_path / "q.pt", format="torchscript")), _extra_files=extra)
    described = json.loads(extra["rlspeed.json"])
    assert described["algo"] == "dqn" and described["action_space"] == {"type": "discrete", "n": 2}
    assert described == json.loads((tmp_path / "q.pt.json").read_text())
    # CartPole's bounds, finite for position and angle, unbounded (null: JSON has no infinity) for the velocities
    low, high = (described["observation_space"][key] for key in ("low", "high"))
    assert low[1] is low[3] is high[1] is high[3] is None
    assert (low[0], low[2], high[0], high[2]) == pytest.approx((-4.8, -0.41888, 4.8, 0.41888), abs=1e-5)


def test_export_checkpoint_from_a_run_directory(tmp_path):
    # (normalize_obs: the statistics `_randomise` sets are the model's, kept by its checkpoint; off, a load drops them)
    model = rlspeed.TD3("Pendulum-v1", seed=0, net_arch=(16,), normalize_obs=True)
    _randomise(model, seed=3)
    model.save(tmp_path / "model.safetensors")
    path = export_checkpoint(tmp_path, "torchscript", algorithms=ALGORITHMS)
    assert path == tmp_path / "model.pt" and (tmp_path / "model.pt.json").is_file()
    _assert_same_actions(model, _runner("torchscript", path), seed=4)
    out = export_checkpoint(tmp_path / "model.safetensors", "exported_program", out=tmp_path / "sub" / "p.pt2",
                            algorithms=ALGORITHMS)
    _assert_same_actions(model, _runner("exported_program", out), seed=5)
    # an exported file given back to load (rlspeed eval) is named as one, with the file to give instead (it read "a
    # zip archive (a Stable-Baselines3 model ...)", or for ONNX "its contents are not safetensors: header too large")
    for exported, kind in ((path, "a TorchScript"), (out, "a torch.export")):
        with pytest.raises(rlspeed.UserError, match=f"is {kind} model that rlspeed export wrote .*give the model file"):
            rlspeed.load(exported)


def test_export_checkpoint_says_what_the_file_warns_once_at_the_callers_line(tmp_path):
    """A model file's warning (a format-1 file's unchecked integrity) reaches export_checkpoint's caller once, at the
    caller's line: it came twice where the export worked (once at export.py's line, the file read twice), and from
    export.py's line only where the load then failed (the load's own dropped)."""
    from safetensors.torch import save_file

    tensors, meta = rlspeed.checkpoint.load_checkpoint(rlspeed.DQN("CartPole-v1", seed=0, net_arch=(16,)).save(
        tmp_path / "new"))
    meta.pop("digest")

    def warned(config: dict, out: str) -> list[tuple[str, str]]:
        save_file(tensors, str(tmp_path / "old.safetensors"),
                  metadata={"rlspeed": json.dumps({**meta, "version": 1, "config": config})})
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            try:
                export_checkpoint(tmp_path / "old.safetensors", "torchscript", tmp_path / out, algorithms=ALGORITHMS)
            except UserError as error:
                assert "does not have (no_such_setting)" in str(error)
        return [(warning.filename, str(warning.message).split(":")[0]) for warning in said]

    said = [(__file__, f"'{tmp_path / 'old.safetensors'}' was written before checkpoints carried a digest")]
    assert warned(meta["config"], "q.pt") == said
    assert (tmp_path / "q.pt").is_file()
    assert warned({**meta["config"], "no_such_setting": 1}, "r.pt") == said  # (the load refuses the file)
    assert not (tmp_path / "r.pt").exists()


@pytest.mark.parametrize("out", [".", "/", "{tmp}"])
def test_export_to_a_directory_with_a_format_is_one_sentence(out, tmp_path, monkeypatch, capsys):
    """`rlspeed export RUN --format onnx --out .` (or "/"): a directory, refused as one; "." and "/" were a ValueError
    traceback (exit 1: no file name to name the sidecar after), another directory "exists: pass --overwrite"."""
    from rlspeed import cli

    monkeypatch.chdir(tmp_path)
    rlspeed.DQN("CartPole-v1", seed=0, net_arch=(16,)).save(tmp_path / "model.safetensors")
    out = out.format(tmp=tmp_path)
    for overwrite in ([], ["--overwrite"]):
        assert cli.main(["export", str(tmp_path), "--format", "onnx", "--out", out, *overwrite]) == 2
        err = capsys.readouterr().err
        assert f"'{out}' is a directory; give the file to write" in err and "Traceback" not in err
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model.safetensors"]


def test_model_export_method(tmp_path):
    model = rlspeed.DQN("CartPole-v1", seed=0, net_arch=(16,))
    _randomise(model, seed=6)
    path = model.export(tmp_path / "q.pt2", format="exported_program")
    _assert_same_actions(model, _runner("exported_program", path), seed=6)


def test_a_policy_trained_on_an_observation_vec_normalize_says_the_caller_normalises_first(tmp_path):
    """The statistics of an SB3 VecNormalize are not the model's: its graph, as its predict, takes the VecNormalize's
    normalised observations. The export said 'raw observations as the env returns them' and no normalisation;
    it warns, and the sidecar says the caller applies VecNormalize.normalize_obs first (also from a saved file)."""
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    def exported(model, norm_obs: bool, loaded: bool):
        if not loaded:
            return export(model, tmp_path / f"{norm_obs}.pt", format="torchscript")
        return export_checkpoint(tmp_path / f"{norm_obs}.safetensors", "torchscript",
                                 out=tmp_path / f"{norm_obs}-loaded.pt", algorithms=ALGORITHMS)

    for norm_obs in (True, False):
        model = rlspeed.PPO(VecNormalize(make_vec_env("Pendulum-v1", n_envs=2, seed=0), norm_obs=norm_obs),
                            device="cpu", seed=0, net_arch=(16,))
        model.save(tmp_path / f"{norm_obs}.safetensors")
        for loaded in (False, True):
            if norm_obs:
                with pytest.warns(UserWarning, match="takes observations that VecNormalize normalised"):
                    path = exported(model, norm_obs, loaded)
            else:
                path = exported(model, norm_obs, loaded)
            sidecar = json.loads(path.with_name(path.name + ".json").read_text())
            if norm_obs:
                assert sidecar["observation_normalization"]["in_graph"] is False
                assert "VecNormalize.normalize_obs" in sidecar["observation_normalization"]["by_caller_first"]
                assert "not raw ones" in sidecar["inputs"][0]["description"]
            else:
                assert sidecar["observation_normalization"] is None
                assert sidecar["inputs"][0]["description"].startswith("raw observations as the env returns them")


def test_torch_export_formats_on_a_torch_whose_programs_fail_are_one_sentence(tmp_path, monkeypatch):
    """On torch 2.9 exported programs of several inputs failed when called (NameError in a guard) and loaded with
    parameters that require grad; ONNX export failed on 2.6: both formats name the torch they need, TorchScript
    still exports."""
    model = rlspeed.DQN("CartPole-v1", seed=0, net_arch=(16,))
    monkeypatch.setattr(torch, "__version__", "2.9.1+cu128")
    for name in ("q.pt2", "q.onnx"):
        with pytest.raises(UserError, match=r"export needs torch 2\.10 or newer .*torchscript"):
            export(model, tmp_path / name)
    assert not (tmp_path / "q.pt2").exists() and export(model, tmp_path / "q.pt").is_file()


def test_bad_requests_are_one_sentence(tmp_path, monkeypatch):
    model = rlspeed.DQN("CartPole-v1", seed=0, net_arch=(16,))
    with pytest.raises(UserError, match="Unknown export format 'tflite': use one of onnx, torchscript"):
        export(model, tmp_path / "q.tflite", format="tflite")
    with pytest.raises(UserError, match="is a directory"):
        export(model, tmp_path, format="torchscript")
    # (loaders go by the suffix: a format that contradicts it is refused, and without format= it names the format)
    with pytest.raises(UserError, match=r"ends in \.pt, the suffix of torchscript files, not of onnx"):
        model.export(tmp_path / "q.pt", format="onnx")
    with pytest.raises(UserError, match=r"Cannot tell the export format from .*q'.*\.onnx, \.pt, \.pt2"):
        model.export(tmp_path / "q")
    # (an export over the model's own file replaced it with an ONNX model rlspeed cannot load)
    model.save(tmp_path / "model")
    saved = (tmp_path / "model.safetensors").read_bytes()
    with pytest.raises(UserError, match=r"ends in \.safetensors, the suffix of rlspeed's model files"):
        model.export(tmp_path / "model.safetensors", format="onnx")
    assert (tmp_path / "model.safetensors").read_bytes() == saved
    (tmp_path / "model.safetensors").unlink()  # (what follows checks that the refusals below write nothing)
    # (pathlib's TypeError; a string taken for True)
    with pytest.raises(UserError, match="export's path is a path \\(a str or pathlib.Path\\), not None"):
        model.export(None)
    with pytest.raises(UserError, match=r"export\(action_mask=...\) is True or False, got 'no'"):
        model.export(tmp_path / "q.pt", action_mask="no")
    assert not list(tmp_path.iterdir())
    program = model.export(tmp_path / "q.PT2")  # (the suffix's format: an exported program, whatever the case)
    assert json.loads(program.with_name("q.PT2.json").read_text())["format"] == "exported_program"
    with pytest.raises(UserError, match="without a model.safetensors"):
        export_checkpoint(tmp_path, "onnx", algorithms=ALGORITHMS)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("onnx", "onnxscript") else real_find_spec(name, *a))
    with pytest.raises(UserError, match=r"needs onnx and onnxscript: pip install \"rlspeed\[export\]\""):
        export(model, tmp_path / "q.onnx", format="onnx")
    assert not (tmp_path / "q.onnx").exists() and not (tmp_path / "q.onnx.json").exists()


def test_policy_without_an_exporter_names_it(tmp_path):
    stranger = types.SimpleNamespace(name="mine", policy=torch.nn.Linear(3, 1))
    with pytest.raises(UserError, match=r"policy \(Linear\) has no exporter"):
        export(stranger, tmp_path / "p.pt", format="torchscript")
    sac = rlspeed.SAC("Pendulum-v1", seed=0, net_arch=(16,))
    with pytest.raises(UserError, match=r"\(for Box actions\) takes no action masks: .*without --action-mask"):
        export(sac, tmp_path / "s.pt", format="torchscript", action_mask=True)
    assert not (tmp_path / "s.pt").exists()


def test_a_policy_the_exporter_does_not_match_is_refused(tmp_path):
    class MirroredTD3(rlspeed.TD3):
        def _policy_actions(self, obs, deterministic):
            return -super()._policy_actions(obs, deterministic)

    model = MirroredTD3("Pendulum-v1", seed=0, net_arch=(16,))
    _randomise(model, seed=7)
    with pytest.raises(UserError, match=r"does not give the model's actions.*`_export_module\(\)`"):
        export(model, tmp_path / "m.pt2", format="exported_program")
    assert not (tmp_path / "m.pt2").exists()


# --- every policy kind: CNN (uint8 images), Dict observations, MultiDiscrete/MultiBinary/matrix actions, action masks,
# the LSTM state -----------------------------------------------------------------------------------------------------
IMAGE = gym.spaces.Box(0, 255, (12, 12, 3), np.uint8)  # channels last: the small CNN, /255 inside the graph
DICT = gym.spaces.Dict({"image": gym.spaces.Box(0, 255, (7, 7, 3), np.uint8), "direction": gym.spaces.Discrete(4),
                        "vector": gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)})
VECTOR = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
SPACE_CASES = {
    "ppo-image-discrete": ("ppo", IMAGE, gym.spaces.Discrete(4)),
    # (the strided CNN, channels first: MiniGrid's RGBImgPartialObsWrapper(tile_size=4) made channels first)
    "dqn-image": ("dqn", gym.spaces.Box(0, 255, (3, 28, 28), np.uint8), gym.spaces.Discrete(3)),
    "sac-image": ("sac", IMAGE, gym.spaces.Box(-2.0, 2.0, (2,), np.float32)),
    "ppo-dict-multidiscrete": ("ppo", DICT, gym.spaces.MultiDiscrete([3, 4])),
    "td3-dict": ("td3", DICT, gym.spaces.Box(-1.0, 1.0, (2,), np.float32)),
    "a2c-multibinary": ("a2c", VECTOR, gym.spaces.MultiBinary(5)),
    "ppo-matrix-box": ("ppo", VECTOR, gym.spaces.Box(-1.0, 1.0, (2, 2), np.float32)),
    "recurrent-dict-multidiscrete": ("recurrent_ppo", DICT, gym.spaces.MultiDiscrete([3, 4])),
    "recurrent-vector-box": ("recurrent_ppo", VECTOR, gym.spaces.Box(-1.0, 1.0, (2,), np.float32)),
    # indices that start elsewhere than 0 (a graph traced on zeros would index outside the one-hot)
    "ppo-shifted-discrete-obs": ("ppo", gym.spaces.Discrete(6, start=3), gym.spaces.Discrete(3)),
    "dqn-shifted-multidiscrete-obs": ("dqn", gym.spaces.Dict({"cells": gym.spaces.MultiDiscrete([4, 3],
                                                                                                start=[-2, 5])}),
                                      gym.spaces.Discrete(2)),
}


def _randomise_any(model, seed: int) -> None:
    """`_randomise` for any observation space: the heads' weights moved (the encoders' stay at their initialisation:
    moved CNN weights give features of thousands, whose float32 rounding no exporter reproduces to 1e-5), random
    statistics for the float parts (a Dict's float keys), none for images and indices."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model._modules().values():
            named = [("", module)] if isinstance(module, torch.Tensor) else module.named_parameters()
            for name, param in named:
                if "encoder" not in name:
                    param.add_(0.5 * torch.randn(param.shape, generator=generator))
        space = model.spec.observation_space
        if normalizable(space):
            model.obs_rms = observation_statistics(space)
            for stats in model.obs_rms.modules():
                if isinstance(stats, RunningMeanStd):
                    stats.mean.add_(torch.randn(stats.mean.shape, generator=generator))
                    stats.var.mul_(torch.rand(stats.var.shape, generator=generator) * 4 + 0.1)


def _space_model(case: str):
    algo, observation_space, action_space = SPACE_CASES[case]
    spec = EnvSpec.from_spaces("custom", observation_space, action_space, 20, None)
    model = ALGORITHMS[algo](spec, seed=0, net_arch=(16,), cnn_features_dim=16,
                             **({"lstm_hidden_size": 8} if algo == "recurrent_ppo" else {}))
    _randomise_any(model, seed=sum(map(ord, case)))
    return model


def _graph_runner(format: str, path):
    """A function (graph inputs as numpy, in the sidecar's order) -> outputs as a list of numpy arrays."""
    names = [item["name"] for item in json.loads(path.with_name(path.name + ".json").read_text())["inputs"]]
    if format == "onnx":
        ort = pytest.importorskip("onnxruntime")
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        assert [i.name for i in session.get_inputs()] == names
        return lambda *inputs: session.run(None, dict(zip(names, inputs)))
    module = torch.jit.load(str(path)) if format == "torchscript" else torch.export.load(str(path)).module()

    def run(*inputs):
        out = module(*(torch.from_numpy(np.ascontiguousarray(x)) for x in inputs))
        return [o.numpy() for o in (out if isinstance(out, tuple) else (out,))]
    return run


def _assert_equal_outputs(got: np.ndarray, expected: np.ndarray) -> None:
    assert got.shape == expected.shape and got.dtype == expected.dtype
    if np.issubdtype(expected.dtype, np.integer):
        np.testing.assert_array_equal(got, expected)
    else:
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)


def _numpy_observations(space, batch: int, generator: torch.Generator):
    obs = random_observations(space, batch, generator)
    return {k: v.numpy() for k, v in obs.items()} if isinstance(obs, dict) else obs.numpy()


@pytest.fixture(scope="module", params=list(SPACE_CASES))
def space_model(request):
    return request.param, _space_model(request.param)


@pytest.mark.parametrize("format", list(FORMATS))
def test_every_policy_kind_matches_predict(space_model, format, tmp_path):
    """CNN and Dict inputs in their own dtypes, MultiDiscrete/MultiBinary/matrix-shaped actions, random action masks
    where the policy takes them, and for RecurrentPPO the state carried by the graph's own outputs over steps with
    random episode starts: the graph gives `predict`'s actions (and state) at every step."""
    case, model = space_model
    if format == "onnx":
        pytest.importorskip("onnxruntime")
        pytest.importorskip("onnxscript")
    recurrent = model.name == "recurrent_ppo"
    space = model.spec.action_space
    masked = isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)) and model.supports_action_masks
    path = export(model, tmp_path / f"policy{FORMATS[format]}", format=format, action_mask=masked)
    run = _graph_runner(format, path)
    generator = torch.Generator().manual_seed(11)
    observation_space = model.spec.observation_space
    state, graph_state = None, None
    for step in range(4 if recurrent else len(BATCHES)):
        batch = 5 if recurrent else BATCHES[step]
        obs = _numpy_observations(observation_space, batch, generator)
        inputs = list(obs[key] for key in observation_space.spaces) if isinstance(obs, dict) else [obs]
        masks = random_action_masks(space, batch, generator).numpy() if masked else None
        if recurrent:
            episode_start = (torch.rand(batch, generator=generator) < (1.0 if step == 0 else 0.3)).numpy()
            expected, state = model.predict(obs, state=state, episode_start=episode_start, action_masks=masks)
            if graph_state is None:
                graph_state = [np.zeros_like(state[0]), np.zeros_like(state[1])]
            inputs += [*graph_state, episode_start]
        else:
            expected, _ = model.predict(obs, deterministic=True, action_masks=masks)
        got = run(*inputs, *([masks] if masked else []))
        _assert_equal_outputs(got[0], expected)
        if recurrent:
            graph_state = got[1:]
            _assert_equal_outputs(graph_state[0], state[0])
            _assert_equal_outputs(graph_state[1], state[1])
        if masked:  # no masked action chosen
            flags = masks.reshape(batch, -1)
            chosen = expected.reshape(batch, -1) + np.concatenate(([0], np.cumsum(space.nvec)[:-1])) \
                if isinstance(space, gym.spaces.MultiDiscrete) else expected.reshape(batch, 1)
            assert np.take_along_axis(flags, chosen, axis=1).all()
    # an input in another dtype (the same values) is refused by every format, as ONNX refuses it: TorchScript took
    # int32 for int64 and uint8 for bool, torch.export programs uint8 for bool, and ran
    refusal = {"onnx": "Unexpected input data type", "exported_program": "Tensor dtype mismatch",
               "torchscript": r"takes \w+ tensors, as its sidecar's inputs say: convert it"}[format]
    other = {"int64": np.int32, "bool": np.uint8, "uint8": np.int64, "float32": np.float64}
    given = [*inputs, *([masks] if masked else [])]
    for index, value in enumerate(given):
        with pytest.raises(Exception, match=refusal):  # noqa: PT011 (each runtime's own class)
            run(*given[:index], value.astype(other[value.dtype.name]), *given[index + 1:])
    # an input without its batch axis (one env's observation, as a Gymnasium env returns it) or with one axis more:
    # TorchScript failed deep in its graph ("Dimension out of range") or ran on it; refused in a sentence naming the
    # input's shape, as ONNX refuses it. An exported program refused the first in torch's words ("tuple index out of
    # range") and ran on a trailing axis of size 1: `load_program`'s module refuses both in TorchScript's sentence.
    rank = r"Invalid rank" if format == "onnx" else r"takes shape \[.*batch.*\], as its sidecar's inputs say"
    if format == "exported_program":
        checked = load_program(path)
        tensors = [torch.from_numpy(np.ascontiguousarray(value)) for value in given]
        outputs = [out if isinstance(out, tuple) else (out,)
                   for out in (checked(*tensors), torch.export.load(str(path)).module()(*tensors))]
        assert all(map(torch.equal, *outputs))
        with pytest.raises(TypeError, match=r"takes \d+ inputs \(.+\), as its sidecar's inputs say; got \d+\."):
            checked(*tensors[:-1])
        run = lambda *inputs: checked(*(torch.from_numpy(np.ascontiguousarray(x)) for x in inputs))  # noqa: E731
    for index, value in enumerate(given):
        unbatched = [value[0]] if value.ndim > 1 else []  # (the runners pass a scalar on as a batch of one)
        for wrong in unbatched + [value[..., None]]:
            with pytest.raises(Exception, match=rank):  # noqa: PT011 (each runtime's own class)
                run(*given[:index], wrong, *given[index + 1:])


def test_load_program_refuses_a_file_it_cannot_load_in_one_sentence(tmp_path, caplog):
    """One sentence and nothing else: torch's reader logged its traceback to stderr first. `.PT2` is the suffix
    export takes for the format (it was refused as not `.pt2`)."""
    caplog.set_level(logging.WARNING)
    with pytest.raises(UserError, match=r"loads an exported program \(\.pt2\), not .*torch\.jit\.load\(path\)"):
        load_program(tmp_path / "policy.pt")
    for name in ("policy.pt2", "policy.PT2"):
        with pytest.raises(UserError, match=r"does not exist: export the policy there first"):
            load_program(tmp_path / name)
    (tmp_path / "text.pt2").write_text("not an archive")
    with pytest.raises(UserError, match=r"is not an exported program torch can read"):
        load_program(tmp_path / "text.pt2")
    assert [record.getMessage() for record in caplog.records if record.name.startswith("torch")] == []


@pytest.mark.parametrize("kind", ["tuple", "dict"])
def test_the_sidecar_says_where_each_input_is_in_the_envs_observation(kind, tmp_path):
    """A Tuple observation's inputs are named "0", "1", ... in text order ("10" before "2"): each input's
    `observation_path` says which element of the env's tuple it takes (a Dict's: which key), so a program that reads
    only the sidecar feeds the graph from the env's observation and gets `predict`'s actions."""
    parts = [gym.spaces.Box(-1, 1, (2,)) if index % 2 else gym.spaces.Discrete(3) for index in range(11)]
    space = (gym.spaces.Tuple(parts) if kind == "tuple" else
             gym.spaces.Dict({f"part{index}": part for index, part in enumerate(parts)}))
    model = rlspeed.PPO(EnvSpec.from_spaces("custom", space, gym.spaces.Discrete(3), 20, None), seed=0,
                        net_arch=(8,))
    _randomise_any(model, seed=3)
    path = export(model, tmp_path / "policy.pt", format="torchscript")
    inputs = json.loads((tmp_path / "policy.pt.json").read_text())["inputs"]
    paths = [item["observation_path"] for item in inputs]
    if kind == "tuple":
        assert sorted(paths) == [[index] for index in range(11)] and paths[2] == [10]  # (text order: "10" after "1")
        assert all(f"(element {where} of the env's Tuple observation)" in item["description"]
                   for (where,), item in zip(paths, inputs))
    else:
        assert sorted(paths) == sorted([f"part{index}"] for index in range(11))
    obs = gym.vector.utils.batch_space(space, 5).sample()  # (a vector env's batch of the env's observations)
    graph = torch.jit.load(str(path))
    got = graph(*(torch.as_tensor(np.asarray(obs[where])) for (where,) in paths))
    np.testing.assert_array_equal(got.numpy(), model.predict(obs, deterministic=True)[0])


def test_rlspeed_export_of_an_algorithm_of_a_users_own(tmp_path):
    """`rlspeed export` of a file saved by a user's algorithm of its own name exports the rlspeed algorithm it derives
    from (the file records it), with the load's warning naming the class (it was "holds an unknown algorithm"); a file
    that records none is one sentence saying to export it in Python with its class imported."""
    from rlspeed import checkpoint

    model = rlspeed.PPO("CartPole-v1", seed=0, net_arch=(8,), normalize_obs=True)
    _randomise(model, seed=3)
    tensors, meta = checkpoint.load_checkpoint(model.save(tmp_path / "model"))
    mine = {**meta, "algo": "mine", "class": "their_module.Mine", "derives_from": "ppo"}
    checkpoint.save_checkpoint(tmp_path / "mine.safetensors", tensors, mine)
    with pytest.warns(UserWarning, match=r"saved by their_module.Mine, a subclass of rlspeed's ppo; PPO.load makes"):
        path = export_checkpoint(tmp_path / "mine.safetensors", "torchscript", algorithms=ALGORITHMS)
    _assert_same_actions(model, _runner("torchscript", path), seed=4)
    mine.pop("derives_from")
    checkpoint.save_checkpoint(tmp_path / "mine.safetensors", tensors, mine)
    with pytest.raises(UserError, match=r"holds a model of their_module.Mine, which is not one of rlspeed's "
                                        r"algorithms: export it in Python with its class imported \(rlspeed.load"):
        export_checkpoint(tmp_path / "mine.safetensors", "onnx", out=tmp_path / "other.onnx", algorithms=ALGORITHMS)


def test_rlspeed_export_gym_packages_imports_a_users_algorithm_which_then_exports_as_its_class(tmp_path, capsys,
                                                                                                monkeypatch):
    """`rlspeed export --gym-packages MODULE`, as `rlspeed eval`'s: the module of the user's algorithm that saved the
    file is imported and the model is built as its class; without it, the rlspeed algorithm it derives from, with a
    warning advising the option (export had no such option and said to export in Python)."""
    from rlspeed import cli

    (tmp_path / "fu_own_algorithm.py").write_text("import rlspeed\n\n\nclass Mine(rlspeed.PPO):\n"
                                                  "    name = 'fu_mine'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        mine = importlib.import_module("fu_own_algorithm").Mine
        path = mine("CartPole-v1", seed=0, net_arch=(8,)).save(tmp_path / "mine")
        sys.modules.pop("fu_own_algorithm")  # (a fresh process: the module not imported)
        with pytest.warns(UserWarning, match=r"rlspeed export makes it a PPO, .*: add --gym-packages "
                                             r"fu_own_algorithm \(importable from here: PYTHONPATH\) to export it as "
                                             r"Mine\.$"):
            assert cli.main(["export", str(path), "--out", str(tmp_path / "ppo.pt")]) == 0
        assert json.loads((tmp_path / "ppo.pt.json").read_text())["algo"] == "ppo"
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert cli.main(["export", str(path), "--out", str(tmp_path / "mine.pt"), "--gym-packages",
                             "fu_own_algorithm"]) == 0
        assert json.loads((tmp_path / "mine.pt.json").read_text())["algo"] == "fu_mine"
        capsys.readouterr()
        # (a module not found: named as the algorithm's, what export imports it for; it said "should register the env")
        assert cli.main(["export", str(path), "--gym-packages", "fu_no_such_module"]) == 2
        assert ("Cannot import the module 'fu_no_such_module' (--gym-packages), which should define the algorithm that "
                "saved the model: No module named" in capsys.readouterr().err)
    finally:
        sys.modules.pop("fu_own_algorithm", None)


_OWN_CLASSES = {  # a user's PPO that rlspeed's cannot build: a setting of its own, an encoder of its own
    "settings": ("import dataclasses\n\nimport rlspeed\nfrom rlspeed.algos.ppo import PPOConfig\n\n\n"
                 "@dataclasses.dataclass\nclass MineConfig(PPOConfig):\n    aux_weight: float = 0.5\n\n\n"
                 "class Mine(rlspeed.PPO):\n    config_cls = MineConfig\n",
                 {"aux_weight": 0.25}, r"settings rlspeed's PPO does not have \(aux_weight\)"),
    "networks": ("from torch import nn\n\nimport rlspeed\nfrom rlspeed.nn import Encoder\n\n\nclass Wide(Encoder):\n"
                 "    kind = 'wide'\n\n    def __init__(self):\n        super().__init__()\n"
                 "        self.features_dim = 12\n        self.net = nn.Linear(4, 12)\n\n"
                 "    def forward(self, x):\n        return self.net(x)\n\n\nclass Mine(rlspeed.PPO):\n"
                 "    def _make_encoder(self, network):\n        return Wide()\n",
                 {}, r"networks rlspeed's PPO does not build \(the checkpoint's 'policy\.\S+' has shape .+\)"),
}


@pytest.mark.parametrize("own", list(_OWN_CLASSES))
def test_rlspeed_export_of_a_users_class_rlspeed_cannot_build_names_the_option_that_builds_it(own, tmp_path, capsys,
                                                                                             monkeypatch, recwarn):
    """A file saved by a user's algorithm with a setting or an encoder of its own, exported without its module
    imported: rlspeed's PPO cannot load it, and the one line says the command's remedy (--gym-packages MODULE), not
    Python's ("load it with Mine.load"), which a command-line user cannot follow; the load's warning that rlspeed
    export makes it a PPO is not printed before it (the export makes nothing)."""
    from rlspeed import cli

    source, settings, cannot = _OWN_CLASSES[own]
    module = f"fu_own_{own}"
    (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        mine = importlib.import_module(module).Mine
        path = mine("CartPole-v1", seed=0, net_arch=(8,), **settings).save(tmp_path / "mine")
        sys.modules.pop(module)  # (a fresh process: the module not imported)
        assert cli.main(["export", str(path), "--out", str(tmp_path / "mine.pt")]) == 2
        err = capsys.readouterr().err
        assert re.fullmatch(rf"rlspeed: error: '{re.escape(str(path))}' was saved by {module}\.Mine, whose {cannot}: "
                            rf"add --gym-packages {module} \(importable from here: PYTHONPATH\) to export it as "
                            r"Mine\.\n", err), err
        assert not (tmp_path / "mine.pt").exists()
        assert not [str(warning.message) for warning in recwarn if "makes it a PPO" in str(warning.message)]
    finally:
        sys.modules.pop(module, None)


def test_the_sidecar_says_which_env_options_were_tuples(tmp_path):
    """JSON writes the tuples among the env's options as lists (an env may take one only as a tuple, as highway-env's
    observation_shape): the sidecar lists their paths (`env_kwargs_tuples`), as checkpoints do, so a program that
    makes the env from the sidecar can give it the options it trained with."""
    from rlspeed.env_options import with_tuples

    options = {"observation_shape": (84, 84), "levels": [1, (2, 3)], "name": "a"}
    spec = EnvSpec("custom", (3,), gym.spaces.Discrete(2), 20, None, gym.spaces.Box(-1, 1, (3,)), options)
    export(rlspeed.PPO(spec, seed=0, net_arch=(8,)), tmp_path / "policy.pt", format="torchscript")
    sidecar = json.loads((tmp_path / "policy.pt.json").read_text())
    assert sidecar["env_kwargs"] == {"observation_shape": [84, 84], "levels": [1, [2, 3]], "name": "a"}
    assert sidecar["env_kwargs_tuples"] == [["observation_shape"], ["levels", 1]]
    assert with_tuples(sidecar["env_kwargs"], sidecar["env_kwargs_tuples"]) == options


def test_an_envs_dict_of_digit_keys_is_no_tuple(tmp_path):
    """An env's Dict whose keys are digits ("0", "1") is a Dict, not a Tuple's positions (which a Tuple's Dict has
    for keys): the sidecar's `observation_path` holds the key as text, as the env's observation is keyed, and its
    description says key, also for the model saved and loaded again (its file says "tuple": false); the sidecar and
    predict of a Tuple env's are as they were."""
    parts = {"0": gym.spaces.Box(-1, 1, (2,)), "1": gym.spaces.Discrete(3)}
    model = rlspeed.PPO(EnvSpec.from_spaces("custom", gym.spaces.Dict(parts), gym.spaces.Discrete(3), 20, None),
                        seed=0, net_arch=(8,))
    loaded = rlspeed.load(model.save(tmp_path / "model"), device="cpu")
    for index, which in enumerate((model, loaded)):
        export(which, tmp_path / f"{index}.pt", format="torchscript")
        sidecar = json.loads((tmp_path / f"{index}.pt.json").read_text())
        assert [item["observation_path"] for item in sidecar["inputs"]] == [["0"], ["1"]]
        assert "(key '0')" in sidecar["inputs"][0]["description"] and sidecar["observation_space"]["tuple"] is False
        with pytest.raises(UserError, match=r"This model takes Dict observations \(keys 0, 1\)"):
            which.predict((np.zeros(2, np.float32), 1))
    tuple_model = rlspeed.PPO(EnvSpec.from_spaces("custom", gym.spaces.Tuple(list(parts.values())),
                                                  gym.spaces.Discrete(3), 20, None), seed=0, net_arch=(8,))
    export(tuple_model, tmp_path / "tuple.pt", format="torchscript")
    sidecar = json.loads((tmp_path / "tuple.pt.json").read_text())
    assert [item["observation_path"] for item in sidecar["inputs"]] == [[0], [1]]
    assert "tuple" not in sidecar["observation_space"]
    tuple_model.predict((np.zeros(2, np.float32), 1))


def test_action_mask_input_changes_the_actions_as_predict_does(tmp_path):
    model = _space_model("ppo-image-discrete")
    with torch.no_grad():  # a large last layer: the unmasked favourite dominates
        model.policy.body.weights[-1].mul_(50.0)
    path = export(model, tmp_path / "p.pt2", format="exported_program", action_mask=True)
    run = _graph_runner("exported_program", path)
    obs = _numpy_observations(model.spec.observation_space, 64, torch.Generator().manual_seed(3))
    free, _ = model.predict(obs)
    np.testing.assert_array_equal(run(obs, np.ones((64, 4), bool))[0], free)  # all True: no mask
    masks = np.ones((64, 4), bool)
    masks[np.arange(64), free] = False  # forbid each row's favourite
    masked = run(obs, masks)[0]
    np.testing.assert_array_equal(masked, model.predict(obs, action_masks=masks)[0])
    assert np.all(masked != free)
    sidecar = json.loads((tmp_path / "p.pt2.json").read_text())
    assert [i["name"] for i in sidecar["inputs"]] == ["obs", "action_mask"]
    assert sidecar["inputs"][1]["dtype"] == "bool" and sidecar["inputs"][1]["shape"] == ["batch", 4]
    assert sidecar["inputs"][0]["dtype"] == "uint8"
    # without asking, a model that did not train with masks exports without the input
    plain = export(model, tmp_path / "q.pt2", format="exported_program")
    assert [i["name"] for i in json.loads((tmp_path / "q.pt2.json").read_text())["inputs"]] == ["obs"]
    np.testing.assert_array_equal(_graph_runner("exported_program", plain)(obs)[0], free)


@pytest.mark.parametrize("format", list(FORMATS))
def test_recurrent_policy_follows_predict_over_a_cartpole_episode(format, tmp_path):
    """RecurrentPPO on CartPole with observation normalisation: one env episode driven by predict's actions; the
    graph, fed its own next state and the episode starts, gives the same action and state at every step."""
    if format == "onnx":
        pytest.importorskip("onnxruntime")
        pytest.importorskip("onnxscript")
    model = rlspeed.RecurrentPPO("CartPole-v1", seed=0, lstm_hidden_size=16, net_arch=(16,))
    _randomise(model, seed=12)
    path = export(model, tmp_path / f"lstm{FORMATS[format]}", format=format)
    sidecar = json.loads(path.with_name(path.name + ".json").read_text())
    assert [i["name"] for i in sidecar["inputs"]] == ["obs", "state_h", "state_c", "episode_start"]
    assert [o["name"] for o in sidecar["outputs"]] == ["actions", "next_state_h", "next_state_c"]
    run = _graph_runner(format, path)
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=0)
    state, episode_start, done, steps = None, np.ones(1, bool), False, 0
    graph_state = [np.zeros((1, 1, 16), np.float32)] * 2
    while not done and steps < 200:
        action, state = model.predict(obs[None], state=state, episode_start=episode_start)
        got, *graph_state = run(obs[None], *graph_state, episode_start)
        np.testing.assert_array_equal(got, action)
        np.testing.assert_allclose(graph_state[0], state[0], rtol=0, atol=1e-5)
        np.testing.assert_allclose(graph_state[1], state[1], rtol=0, atol=1e-5)
        obs, _, terminated, truncated, _ = env.step(int(action[0]))
        done, episode_start, steps = terminated or truncated, np.zeros(1, bool), steps + 1
    assert steps > 5


def test_a_model_trained_with_masks_exports_the_mask_input_by_default(tmp_path):
    model = rlspeed.PPO("Taxi-v4", seed=0, num_envs=2, num_steps=16, batch_size=32)
    model.learn(32, progress_bar=False)  # Taxi's info["action_mask"]: the rollouts used masks
    path = export(model, tmp_path / "taxi.pt", format="torchscript")
    assert [i["name"] for i in json.loads((tmp_path / "taxi.pt.json").read_text())["inputs"]] == ["obs", "action_mask"]
    states = np.arange(0, 500, 25)
    masks = np.stack([gym.make("Taxi-v4").unwrapped.action_mask(int(s)) for s in states]).astype(bool)
    np.testing.assert_array_equal(_graph_runner("torchscript", path)(states, masks)[0],
                                  model.predict(states, action_masks=masks)[0])
    path = export(model, tmp_path / "plain.pt", format="torchscript", action_mask=False)
    np.testing.assert_array_equal(_graph_runner("torchscript", path)(states)[0], model.predict(states)[0])


@pytest.mark.skipif(importlib.util.find_spec("ale_py") is None, reason="Atari needs ale-py")
def test_an_atari_policys_sidecar_says_how_its_frames_are_made(tmp_path):
    """An exported Atari policy takes preprocessed frame stacks: the sidecar says how they are made (and that
    Breakout needs FIRE to serve), which "raw observations as the env returns them" left out."""
    model = rlspeed.PPO("BreakoutNoFrameskip-v4", seed=0, device="cpu", env_backend="gymnasium", num_envs=2,
                        num_steps=16, batch_size=32)
    model.export(tmp_path / "breakout.pt2")
    sidecar = json.loads((tmp_path / "breakout.pt2.json").read_text())
    assert sidecar["preprocessing"]["kind"] == "atari" and sidecar["preprocessing"]["frame_stack"] == 4
    assert sidecar["preprocessing"]["frame_skip"] == 4 and sidecar["preprocessing"]["screen_size"] == 84
    assert sidecar["preprocessing"]["fire_action_on_start_and_after_life_loss"] == 1
    assert sidecar["preprocessing"]["fire_steps"] == 1  # (two under sticky actions, as rlspeed's evaluation presses)
    from rlspeed.export import _preprocessing

    assert _preprocessing("ALE/Breakout-v5", {})["fire_steps"] == 2


@pytest.mark.parametrize("format", ["torchscript", "exported_program"])
def test_an_export_the_file_system_refuses_is_one_sentence_and_writes_nothing(format, tmp_path, monkeypatch):
    """A destination the file system refuses (full, read-only, not a directory) is one sentence, and no file (not
    even the temporary one) is left."""
    import errno
    import os

    from rlspeed import export as export_module

    model = rlspeed.DQN("CartPole-v1", seed=0, net_arch=(16,))
    real_replace = os.replace

    def full(source, target):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(export_module.os, "replace", full)
    path = tmp_path / f"policy{FORMATS[format]}"
    with pytest.raises(UserError, match=r"Cannot write .*policy.* \(No space left on device\): nothing was written"):
        export(model, path, format=format)
    monkeypatch.setattr(export_module.os, "replace", real_replace)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    (tmp_path / "a-file").write_text("")  # a write the file system refuses (torch.jit.save raised a RuntimeError)
    with pytest.raises(UserError, match=r"Cannot write .*a-file.*nothing was written"):
        export(model, tmp_path / "a-file" / f"policy{FORMATS[format]}", format=format)


@needs_torch_export
@pytest.mark.skipif(sys.platform == "win32", reason="a file-size limit (RLIMIT_FSIZE) is POSIX")
def test_an_exported_program_the_disk_cannot_hold_is_one_sentence_not_an_abort(tmp_path):
    """A full disk while a .pt2 was written: torch's archive writer wrote again as it closed and its destructor aborted
    the process (exit code 134, a C++ backtrace, no sentence). A file-size limit makes the same short write."""
    import subprocess

    code = ("import resource, signal\nimport rlspeed\nfrom rlspeed.errors import UserError\n"
            "model = rlspeed.DQN('CartPole-v1', seed=0, net_arch=(16,))\n"
            "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"  # (the write fails with EFBIG, as a full disk's would)
            "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))\n"
            "try:\n    model.export('policy.pt2')\nexcept UserError as error:\n    print(error)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("Cannot write 'policy.pt2' (File too large): nothing was written there")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_an_export_never_writes_through_a_link_planted_beside_its_file(tmp_path):
    """The export was written to `.NAME.PID.tmp.SUFFIX` (a name anyone could foresee) opened as it stood: a symlink
    planted there by anyone who can write to the directory made the export overwrite the file it points at, and the
    rename then left the policy a link to that file. The exported file is as readable as the user's other files."""
    import os

    from rlspeed.files import _UMASK

    model = rlspeed.DQN("CartPole-v1", seed=0, net_arch=(16,))
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / f".policy.{os.getpid()}.tmp.pt").symlink_to(victim)
    path = export(model, tmp_path / "policy.pt", format="torchscript")
    assert victim.read_bytes() == b"precious\n" and not path.is_symlink()
    obs = np.random.default_rng(5).normal(size=(8, 4)).astype(np.float32)
    np.testing.assert_array_equal(_runner("torchscript", path)(obs), model.predict(obs, deterministic=True)[0])
    assert path.stat().st_mode & 0o777 == 0o666 & ~_UMASK


@pytest.mark.parametrize("format", list(FORMATS))
def test_normalisation_of_features_with_a_large_mean_against_their_spread_matches_predict(format, tmp_path):
    """Trained MuJoCo statistics (PPO on Humanoid-v5 with RL-Zoo's preset) hold features whose spread is a ten
    thousandth of their mean; the model normalises in float64, so a graph that subtracted the mean rounded to float32
    disagreed with predict by more than 1e-5 and export refused it."""
    if format == "onnx":
        pytest.importorskip("onnxruntime")
        pytest.importorskip("onnxscript")
    model = rlspeed.PPO("Pendulum-v1", seed=0, num_envs=2, num_steps=16, normalize_obs=True, net_arch=(64, 64))
    model.learn(32, progress_bar=False)
    _randomise(model, seed=7)
    with torch.no_grad():
        model.obs_rms.mean.copy_(torch.tensor([1.2056820298125925, -30.123456789, 0.7123456789], dtype=torch.float64))
        model.obs_rms.var.copy_(torch.tensor([1.2e-7, 3e-6, 1e-4], dtype=torch.float64))
    path = export(model, tmp_path / f"policy{FORMATS[format]}", format=format)
    _assert_same_actions(model, _runner(format, path), seed=7)


class _Branchy(Encoder):
    """An encoder of the caller's own whose forward takes a Python branch on the batch's values."""

    kind = "branchy encoder"

    def __init__(self):
        super().__init__()
        self.features_dim = 8
        self.linear = torch.nn.Linear(4, 8)

    def forward(self, obs):
        features = self.linear(obs.float())
        if obs.abs().sum() > 0:  # (zeros, the example a graph is captured with, take the other branch)
            features = -features
        return torch.tanh(features)


class _BatchFixed(_Branchy):
    """An encoder of the caller's own that reads the batch size as a Python int: a trace keeps the example's."""

    kind = "batch-fixed encoder"

    def forward(self, obs):
        return torch.tanh(self.linear(obs.float())) * torch.ones(int(obs.shape[0]), 1)


@pytest.mark.parametrize("format, encoder", [("torchscript", _Branchy), ("exported_program", _Branchy),
                                             ("torchscript", _BatchFixed)])
def test_an_encoder_of_ones_own_that_a_graph_cannot_follow_is_one_sentence_and_no_file(tmp_path, format, encoder):
    """A TorchScript trace of an encoder that branches on values kept the example's branch: the file gave other
    actions than predict (1 of 64 agreed), silently. torch.export refuses such code with torch's multi-paragraph
    error. A trace of one that fixes the batch size fails when the export runs it on its check batch: torch's
    RuntimeError came out with the TorchScript interpreter's traceback (dozens of lines, no word of rlspeed's; the
    CLI's user saw it all). Each is one sentence naming the encoder and what to do (torch's whole error its cause,
    which --debug shows), and nothing is written."""
    class OwnEncoderPPO(rlspeed.PPO):
        def _make_encoder(self, network):
            return encoder()

    model = OwnEncoderPPO("CartPole-v1", device="cpu", seed=0, num_envs=2, num_steps=16, batch_size=32)
    path = tmp_path / f"policy{FORMATS[format]}"
    with pytest.raises(UserError, match=encoder.__name__) as error:
        model.export(path, format=format)
    assert "\n" not in str(error.value)
    if encoder is _BatchFixed:
        assert "(torch: The size of tensor a (64) must match the size of tensor b" in str(error.value)
    assert not path.exists() and not path.with_name(path.name + ".json").exists()


def test_a_torchscript_export_of_rlspeeds_own_networks_warns_of_nothing(tmp_path):
    """torch's tracer warned six times that 'the trace might not generalize' for every PPO (a shape read in rlspeed's
    ensemble layers): noise, now that the trace is checked against the model on other observations."""
    model = rlspeed.PPO("CartPole-v1", device="cpu", seed=0, num_envs=2, num_steps=16, batch_size=32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.export(tmp_path / "policy.pt")
    assert [str(item.message) for item in caught if item.category is torch.jit.TracerWarning] == []


class _SplitActorCritic(rlspeed.nn.ActorCritic):
    """An actor and a critic of different widths (SB3's net_arch=dict(pi=[32], vf=[64, 64])), rlspeed's ensemble
    body left out."""

    def __init__(self, obs_dim, action_space):
        super().__init__(obs_dim, 0, False, (1,), action_space=action_space)
        del self.body
        self.pi = rlspeed.nn.mlp(obs_dim, (32,), self.action_dim)
        self.vf = rlspeed.nn.mlp(obs_dim, (64, 64), 1)

    def forward(self, obs):
        features = self.features(obs)
        return self.pi(features), self.vf(features).squeeze(-1)


@pytest.mark.parametrize("format", ["torchscript", "exported_program"])
def test_a_policy_network_of_ones_own_exports_through_its_forward(tmp_path, format):
    """A `_build_policy` returning a subclass of ActorCritic with its own forward: the export reached into rlspeed's
    ensemble body (an AttributeError where the subclass has none; a refusal where its forward changes the actor's
    output). It runs the policy's forward, and gives predict's actions."""
    class SplitPPO(rlspeed.PPO):
        def _build_policy(self):
            return _SplitActorCritic(self.spec.obs_dim, self.spec.action_space)

    model = SplitPPO("Pendulum-v1", device="cpu", seed=0, num_envs=2, num_steps=16, batch_size=32)
    path = model.export(tmp_path / f"policy{FORMATS[format]}", format=format)
    graph = torch.jit.load(path) if format == "torchscript" else torch.export.load(path).module()
    obs = np.random.default_rng(0).normal(size=(17, 3)).astype(np.float32)
    np.testing.assert_allclose(graph(torch.from_numpy(obs)).numpy(), model.predict(obs)[0], atol=1e-5)
