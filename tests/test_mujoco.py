"""MuJoCo (Gymnasium v5 ids): the envs under the batched contract, SAC/TD3/PPO learning smoke runs, and the presets
picked by id. Skipped without mujoco."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("mujoco")

from rlspeed import PPO, SAC, TD3  # noqa: E402
from rlspeed.algos.base import build_config  # noqa: E402
from rlspeed.envs import make_env  # noqa: E402
from rlspeed.presets import load_preset, split_run_settings  # noqa: E402

MUJOCO_IDS = ["HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5"]


def test_hopper_is_float32_vectors_and_box_actions_with_final_obs_at_a_fall():
    env = make_env("Hopper-v5", num_envs=2, seed=0, backend="gymnasium", device="cpu")
    try:
        obs, _ = env.reset()
        assert obs.shape == (2, 11) and obs.dtype == torch.float32
        assert env.spec.action_space.shape == (3,) and env.spec.max_episode_steps == 1000
        generator = torch.Generator().manual_seed(0)
        for _ in range(300):  # random torques topple the hopper within a few dozen steps
            obs, reward, terminated, truncated, info = env.step(torch.rand((2, 3), generator=generator) * 2 - 1)
            if bool(terminated.any()):
                break
        row = int(terminated.nonzero()[0])
        assert not torch.equal(info["final_obs"][row], obs[row]) and bool(info["done"][row])
        assert float(info["episode_length"][row]) >= 1
    finally:
        env.close()


def test_making_a_mujoco_env_leaves_no_log_file_in_the_working_directory(tmp_path, monkeypatch):
    """MuJoCo appends its warnings (HalfCheetah-v5's deprecated compiler attribute, with MuJoCo 4) to MUJOCO_LOG.TXT
    in the working directory unless a handler takes them: rlspeed routes them to Python's warnings."""
    import mujoco

    monkeypatch.chdir(tmp_path)
    make_env("HalfCheetah-v5", num_envs=1, seed=0, backend="gymnasium", device="cpu").close()
    assert mujoco.get_mju_user_warning() is not None
    assert not (tmp_path / "MUJOCO_LOG.TXT").exists()


def test_a_mujoco_gl_that_fails_to_load_is_one_sentence(tmp_path):
    """MuJoCo loads the OpenGL platform MUJOCO_GL names when it is imported: a value it does not know, or osmesa
    without its library (set on a cluster for another program's videos), made rlspeed train end in a traceback."""
    env = {**os.environ, "MUJOCO_GL": "no-such-platform", "RLSPEED_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "rlspeed", "train", "sac", "Hopper-v5", "--total-timesteps", "600",
                           "--no-progress", "--out", str(tmp_path / "run")], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(
        "rlspeed: error: MuJoCo cannot be imported with MUJOCO_GL=no-such-platform (RuntimeError: ")
    assert "unset MUJOCO_GL" in done.stderr


def _finite(module: torch.nn.Module) -> bool:
    return all(bool(torch.isfinite(parameter).all()) for parameter in module.parameters())


@pytest.mark.parametrize("algo", [SAC, TD3, PPO], ids=lambda algo: algo.__name__)
def test_learning_smoke_on_hopper_keeps_weights_finite(algo):
    """A thousand or two steps with the preset's kind of settings, shrunk (off-policy: 768 gradient steps after 256
    random steps): training runs through falls (episodes end and envs reset; no episode reaches the time limit in this
    budget), and every weight stays finite."""
    if algo is PPO:
        model, steps = algo("Hopper-v5", num_envs=2, num_steps=256, batch_size=128, n_epochs=2, normalize_obs=True,
                            normalize_reward=True, seed=0, device="cpu", env_backend="gymnasium"), 2048
    else:
        model, steps = algo("Hopper-v5", net_arch=[64, 64], learning_starts=256, batch_size=64, seed=0, device="cpu",
                            env_backend="gymnasium"), 1024
    model.learn(steps, progress_bar=False)
    assert model.num_timesteps >= steps
    networks = [module for module in vars(model).values() if isinstance(module, torch.nn.Module)]
    assert networks and all(_finite(module) for module in networks)
    actions = model.predict(torch.zeros(11))[0]
    assert torch.as_tensor(actions).shape[-1] == 3 and bool(torch.isfinite(torch.as_tensor(actions)).all())


@pytest.mark.parametrize("algo", ["sac", "td3", "ppo"])
@pytest.mark.parametrize("env_id", MUJOCO_IDS)
def test_presets_are_picked_by_id_and_build(algo, env_id):
    preset = load_preset(algo, env_id)
    assert preset.source == "rlspeed", f"no {algo} preset for {env_id}"
    run, hyper = split_run_settings(preset)
    assert run["total_timesteps"] == 1_000_000
    config = build_config({"sac": SAC, "td3": TD3, "ppo": PPO}[algo].config_cls, hyper)
    if algo == "ppo":
        assert config.normalize_obs and config.normalize_reward
    else:
        assert config.learning_starts == 10_000


class _LoadsModel:
    """Gymnasium's MujocoEnv as MuJoCo's warning handler sees it: `fullpath`, the model file being loaded."""

    def __init__(self, fullpath):
        self.fullpath = str(fullpath)

    def load(self, text):
        from rlspeed.envs import packages

        packages._mujoco_warning(text)


def _shown_by_default(run) -> list[str]:
    """The warnings `run()` shows under Python's default filters and Gymnasium's own (it shows DeprecationWarnings
    raised in its modules)."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.resetwarnings()
        warnings.filterwarnings("default")
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")
        warnings.filterwarnings("once", category=DeprecationWarning, module=r"^gymnasium\.")
        run()
    return [str(warning.message) for warning in caught]


def test_a_deprecation_in_gymnasiums_own_model_file_is_not_shown_to_a_user_and_one_in_theirs_is(tmp_path, monkeypatch):
    """MuJoCo 4's notice of a deprecated compiler attribute in HalfCheetah-v5's model file, Gymnasium's, was a
    DeprecationWarning raised in Gymnasium's module, which Gymnasium's filter shows: every `rlspeed train sac
    HalfCheetah-v5` said it, with advice for the file's authors. It is hidden now, as a library's deprecations are
    (`-W default` shows it); the same notice about a model file of the user's (`xml_file=`) is shown."""
    import gymnasium

    from rlspeed.envs import packages

    monkeypatch.setattr(packages, "_mujoco_said", set())
    assert _shown_by_default(lambda: make_env("HalfCheetah-v5", num_envs=1, backend="gymnasium", device="cpu").close(
        )) == []
    monkeypatch.setattr(packages, "_mujoco_said", set())
    text = "compiler attribute 'settotalmass' is deprecated and will be removed in a future release"
    theirs = _LoadsModel(os.path.join(os.path.dirname(gymnasium.__file__), "envs", "mujoco", "assets", "x.xml"))
    with pytest.warns(DeprecationWarning, match="MuJoCo: compiler attribute") as asked:  # (-W default, pytest)
        theirs.load(text)
    assert asked[0].filename == theirs.fullpath
    monkeypatch.setattr(packages, "_mujoco_said", set())
    mine = _LoadsModel(tmp_path / "mine.xml")
    assert _shown_by_default(lambda: mine.load(text)) == [f"MuJoCo: {text} (in {tmp_path / 'mine.xml'})"]


class _BrokenMujoco:
    """A finder whose `mujoco` fails on import as MuJoCo 4's own __init__ does when mujoco and mujoco-core differ."""

    text = ("Version mismatch between 'mujoco' (4.0.1) and 'mujoco-core' (4.0.0). Please upgrade all packages "
            "together:\n  pip install --upgrade 'mujoco==4.0.1' 'mujoco-core==4.0.1'")

    def find_spec(self, name, path=None, target=None):
        import importlib.machinery

        return importlib.machinery.ModuleSpec(name, self) if name == "mujoco" else None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        raise ImportError(self.text)


def test_a_mujoco_install_that_fails_to_import_is_one_sentence_with_its_repair(monkeypatch):
    """With MUJOCO_GL unset, an ImportError of `import mujoco` (a partial upgrade's version mismatch, core bindings
    missing) ended `rlspeed train sac Hopper-v5` in a traceback: it is a UserError carrying MuJoCo's repair command,
    which `rlspeed doctor` gives as the fix (not the `pip install "rlspeed[mujoco]"` of a missing MuJoCo)."""
    from rlspeed.diagnostics.doctor import _env_family_problem
    from rlspeed.envs import packages
    from rlspeed.errors import UserError

    monkeypatch.delenv("MUJOCO_GL", raising=False)
    monkeypatch.setattr(packages, "_mujoco_routed", False)
    monkeypatch.delitem(sys.modules, "mujoco")
    monkeypatch.setattr(sys, "meta_path", [_BrokenMujoco(), *sys.meta_path])
    with pytest.raises(UserError, match="^MuJoCo is installed but cannot be imported") as raised:
        packages.route_mujoco_messages("Hopper-v5")
    assert "\n" not in str(raised.value) and "pip install --upgrade 'mujoco==4.0.1'" in str(raised.value)
    problem, fix = _env_family_problem(raised.value, "MuJoCo", 'pip install "rlspeed[mujoco]"')
    assert problem == "MuJoCo is installed but cannot be imported" and fix.endswith("'mujoco-core==4.0.1'")


class _MujocoWithoutItsModule(_BrokenMujoco):
    """A finder whose `mujoco` fails on import for want of a module it imports (glfw, pip-uninstalled)."""

    def exec_module(self, module):
        raise ModuleNotFoundError("No module named 'glfw'", name="glfw")


def test_a_module_mujoco_imports_missing_is_named_with_its_install_command(monkeypatch):
    """`import mujoco` failing for want of another module names that module and `pip install` it, in the sentence and
    as `rlspeed doctor`'s fix (which gave "No module named 'glfw'" as the fix, not a command)."""
    from rlspeed.diagnostics.doctor import _env_family_problem
    from rlspeed.envs import packages
    from rlspeed.errors import UserError

    monkeypatch.delenv("MUJOCO_GL", raising=False)
    monkeypatch.setattr(packages, "_mujoco_routed", False)
    monkeypatch.delitem(sys.modules, "mujoco")
    monkeypatch.setattr(sys, "meta_path", [_MujocoWithoutItsModule(), *sys.meta_path])
    with pytest.raises(UserError, match=r"^MuJoCo is installed but cannot be imported, so 'Hopper-v5' cannot be made: "
                                        r"the Python module 'glfw' it imports is not installed: pip install glfw$"
                       ) as raised:
        packages.route_mujoco_messages("Hopper-v5")
    assert _env_family_problem(raised.value, "MuJoCo", 'pip install "rlspeed[mujoco]"') == (
        "MuJoCo is installed, but the Python module 'glfw' is not installed", "pip install glfw")
    # installed, and failing to load (its own library missing): its import's error, not `pip install` again
    monkeypatch.setattr(packages, "module_installed", lambda module: True)
    broken = ImportError("libGL.so.1: cannot open shared object file", name="OpenGL.GL")
    assert str(packages.MujocoImportError("Hopper-v5", broken)) == (
        "MuJoCo is installed but cannot be imported, so 'Hopper-v5' cannot be made: libGL.so.1: cannot open shared "
        "object file")
