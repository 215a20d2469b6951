"""Envs written for the old gym API (step: obs, reward, done, info with info["TimeLimit.truncated"]; reset: obs), the
gym package's spaces and registry, and Shimmy's adapters of them, reproduced with hand-written classes: neither gym
nor Shimmy needs to be installed."""

from __future__ import annotations

import importlib.util
import re
import sys
from importlib.util import find_spec

import gymnasium as gym
import numpy as np
import pytest

import rlspeed
from rlspeed.errors import EnvStepError


class OldApiCounter:
    """An env of the old gym API: float64 observations [position, time]; action 1 steps right, 0 left. Reaching
    position 3 ends the episode (reward 1); its time limit, `limit` steps, ends it with done=True and
    info["TimeLimit.truncated"]=True, as gym's TimeLimit said it."""

    def __init__(self, limit: int = 6):
        self.observation_space = gym.spaces.Box(-10.0, 10.0, (2,), np.float64)
        self.action_space = gym.spaces.Discrete(2)
        self.limit, self.position, self.t = limit, 0, 0

    def seed(self, seed=None):
        return [seed]

    def reset(self):
        self.position = self.t = 0
        return np.array([self.position, self.t], dtype=np.float64)

    def step(self, action):
        self.position += 1 if int(action) == 1 else -1
        self.t += 1
        obs = np.array([self.position, self.t], dtype=np.float64)
        if self.position >= 3:
            return obs, 1.0, True, {}
        if self.t >= self.limit:
            return obs, 0.0, True, {"TimeLimit.truncated": True}
        return obs, 0.0, False, {}

    def render(self, mode="human"):
        return np.zeros((4, 4, 3), np.uint8)

    def close(self):
        pass


class OldApiAdapter(gym.Env):
    """What Shimmy's `GymV26Environment-v0` / `GymV21Environment-v0` are to Gymnasium: an env that makes the old env
    its `env_id` option names and converts its API (done with TimeLimit.truncated becomes truncated)."""

    def __init__(self, env_id: str = "counter", limit: int = 6):
        assert env_id == "counter", env_id
        self.old = OldApiCounter(limit)
        self.observation_space, self.action_space = self.old.observation_space, self.old.action_space

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return self.old.reset(), {}

    def step(self, action):
        obs, reward, done, info = self.old.step(action)
        truncated = bool(info.pop("TimeLimit.truncated", False))
        return obs, reward, done and not truncated, truncated, info


gym.register("LegacyAdapter-v0", entry_point=OldApiAdapter, disable_env_checker=True)


def test_an_env_option_named_env_id_reaches_the_env(tmp_path):
    """Shimmy's documented route for an env registered with old gym, `GymV26Environment-v0` with its option
    `env_id`, failed as `PPO("GymV26Environment-v0", env_kwargs={"env_id": ...})` with Python's TypeError
    "make_env() got multiple values for argument 'env_id'" (the options were passed as make_env's keywords); an option
    named `env_id` now reaches the env, in training, evaluation and a loaded model, and `make_env` takes it after the
    id as `gymnasium.make` does."""
    model = rlspeed.PPO("LegacyAdapter-v0", env_kwargs={"env_id": "counter"}, seed=0, device="cpu",
                        env_backend="gymnasium", num_envs=2, num_steps=8, batch_size=16)
    model.learn(16, progress_bar=False)
    assert model.spec.env_kwargs == {"env_id": "counter"}
    assert model.evaluate(episodes=2)["episodes"] == 2
    model.save(tmp_path / "model.pt")
    loaded = rlspeed.PPO.load(tmp_path / "model.pt", device="cpu")
    loaded.learn(16, progress_bar=False)
    assert rlspeed.evaluate(loaded, "LegacyAdapter-v0", episodes=2, env_kwargs={"env_id": "counter"})["episodes"] == 2

    env = rlspeed.make_env("LegacyAdapter-v0", env_id="counter", num_envs=2, device="cpu")
    assert env.spec.env_kwargs == {"env_id": "counter"}
    env.close()
    env = rlspeed.make_env("LegacyAdapter-v0", env_kwargs={"env_id": "counter", "limit": 4}, device="cpu")
    assert env.spec.env_kwargs == {"env_id": "counter", "limit": 4}
    env.close()
    env = rlspeed.make_env(env_id="CartPole-v1", num_envs=2, device="cpu")  # (alone, env_id= is the id)
    assert env.spec.env_id == "CartPole-v1"
    env.close()
    with pytest.raises(rlspeed.UserError, match="both as a keyword and in env_kwargs"):
        rlspeed.make_env("LegacyAdapter-v0", env_id="counter", env_kwargs={"env_id": "counter"})


@pytest.mark.filterwarnings("ignore:.*Overriding environment")
def test_shimmys_ids_import_shimmy(tmp_path, monkeypatch):
    """Gymnasium registers `GymV26Environment-v0` with a stand-in that raises ImportError until `import shimmy`: a
    model of that id said "Cannot make 'GymV26Environment-v0': To use the gym compatibility environments, run `pip
    install "shimmy[gym-v21]"`" with Shimmy installed (an install that would move numpy below 2). rlspeed imports
    Shimmy for its ids now, as it imports MiniGrid for MiniGrid's, and says what to install where it is missing."""
    from gymnasium.envs import _raise_shimmy_error

    monkeypatch.setitem(gym.registry, "GymV26Environment-v0",
                        gym.envs.registration.EnvSpec("GymV26Environment-v0", entry_point=_raise_shimmy_error))
    monkeypatch.delitem(sys.modules, "shimmy", raising=False)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None if name == "shimmy" else find_spec(name))
    with pytest.raises(rlspeed.UserError, match=r"needs Shimmy and gym: pip install shimmy gym\.$"):
        rlspeed.PPO("GymV26Environment-v0", env_kwargs={"env_id": "counter"}, device="cpu")
    monkeypatch.undo()

    # a Shimmy of its own: a package that registers the id on import, as Shimmy does
    (tmp_path / "shimmy").mkdir()
    (tmp_path / "shimmy" / "__init__.py").write_text(
        "import gymnasium\n"
        "gymnasium.register('GymV26Environment-v0', entry_point='test_legacy_gym:OldApiAdapter')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "shimmy", raising=False)
    monkeypatch.setitem(gym.registry, "GymV26Environment-v0",
                        gym.envs.registration.EnvSpec("GymV26Environment-v0", entry_point=_raise_shimmy_error))
    model = rlspeed.PPO("GymV26Environment-v0", env_kwargs={"env_id": "counter"}, seed=0, device="cpu",
                        env_backend="gymnasium", num_envs=2, num_steps=8, batch_size=16)
    model.learn(16, progress_bar=False)
    assert sys.modules["shimmy"].__file__.startswith(str(tmp_path))
    model.close()


def _gym_package_space(space: gym.spaces.Space):
    """A space of the old gym package, without gym: a class of the same name from module gym.spaces (what gym's
    spaces are to Gymnasium: no gymnasium.spaces.Space), holding Gymnasium's space for its attributes."""
    kind = type(type(space).__name__, (), {"__module__": f"gym.spaces.{type(space).__name__.lower()}",
                                           "__getattr__": lambda self, name: getattr(space, name)})
    return kind()


class NewApiOldSpaces(gym.Env):
    """An env of Gymnasium's API whose spaces are the gym package's (`which`: "observation", "action", or "key", a
    gym Box inside Gymnasium's Dict)."""

    def __init__(self, which: str = "observation"):
        box, discrete = gym.spaces.Box(-1.0, 1.0, (2,), np.float64), gym.spaces.Discrete(2)
        self.observation_space = _gym_package_space(box) if which == "observation" else box
        if which == "key":
            self.observation_space = gym.spaces.Dict({"position": box})
            self.observation_space.spaces["position"] = _gym_package_space(box)
        self.action_space = _gym_package_space(discrete) if which == "action" else discrete

    def reset(self, seed=None, options=None):
        return np.zeros(2), {}

    def step(self, action):
        return np.zeros(2), 0.0, False, False, {}


gym.register("NewApiOldSpaces-v0", entry_point=NewApiOldSpaces, disable_env_checker=True)


@pytest.mark.parametrize("which, message", [
    ("observation", "has an observation space of the old gym package (gym.spaces.box.Box), not of Gymnasium"),
    ("action", "has an action space of the old gym package (gym.spaces.discrete.Discrete), not of Gymnasium"),
    ("key", "has an observation space inside its Dict of the old gym package (gym.spaces.box.Box)")])
def test_spaces_of_the_gym_package_are_named(which, message):
    """An env whose spaces are the old gym package's (gym.spaces.Box: no Gymnasium space) was refused with messages
    contradicting themselves: "has a Box observation space, which no rlspeed encoder handles; convert it to Box,
    ...", "has a Discrete action space; rlspeed supports Discrete, ...". One sentence now names gym's space and the
    fix, for an id and for a Stable-Baselines3 VecEnv alike."""
    with pytest.raises(rlspeed.UserError) as raised:
        rlspeed.PPO("NewApiOldSpaces-v0", env_kwargs={"which": which}, device="cpu")
    assert message in str(raised.value) and "gymnasium.spaces" in str(raised.value)
    assert "GymV26CompatibilityV0" in str(raised.value) and "\n" not in str(raised.value)
    DummyVecEnv = pytest.importorskip("stable_baselines3.common.vec_env").DummyVecEnv
    with pytest.raises(rlspeed.UserError, match=re.escape(message)):
        rlspeed.PPO(DummyVecEnv([lambda: NewApiOldSpaces(which)]), device="cpu")


@pytest.mark.parametrize("version, adapter", [("0.26.2", "GymV26Environment-v0"), ("0.21.0", "GymV21Environment-v0")])
def test_an_id_of_the_old_gym_registry_names_shimmys_adapter(version, adapter, monkeypatch):
    """An id research code registers with old gym (`gym.register(...)` on import, `module:EnvId`) was "Unknown env
    id ... If a package registers it, import that package first": the package was imported, into gym's registry. One
    sentence now says so and names Shimmy's id that makes it a Gymnasium env, with its options."""
    import types

    gym_module = types.ModuleType("gym")
    gym_module.__version__ = version
    specs = {"LegacyCounter-v0": types.SimpleNamespace(entry_point="research.envs:Counter"),
             "LunarLander-v2": types.SimpleNamespace(entry_point="gym.envs.box2d.lunar_lander:LunarLander")}
    # (gym 0.26 keeps a dict as gym.envs.registry; gym 0.21 an EnvRegistry whose env_specs is the dict)
    registry = specs if version.startswith("0.26") else types.SimpleNamespace(env_specs=specs)
    gym_module.envs = types.SimpleNamespace(registry=registry)
    monkeypatch.setitem(sys.modules, "gym", gym_module)
    with pytest.raises(rlspeed.UserError) as raised:
        rlspeed.PPO("LegacyCounter-v0", device="cpu")
    message = str(raised.value)
    assert message.startswith(f"'LegacyCounter-v0' is registered with the old gym package (gym {version}), not with "
                              f"Gymnasium: Shimmy's {adapter} makes it a Gymnasium env"), message
    assert "'env_id': 'LegacyCounter-v0'" in message and "\n" not in message
    assert ("apply_api_compatibility" in message) == version.startswith("0.26")
    # gym's own envs (which Stable-Baselines3 registers by importing gym): Gymnasium's successor is the advice (EnvPool,
    # where installed, has LunarLander-v2 too, and the sentence says so: `envpool_only`)
    with pytest.raises(rlspeed.UserError, match=r"Unknown env id 'LunarLander-v2'\. Did you mean LunarLander-v3|"
                                                r"'LunarLander-v2' is EnvPool's id.*: Gymnasium has LunarLander-v3"):
        rlspeed.PPO("LunarLander-v2", device="cpu")


class OldApiCounterOfGymSpaces(OldApiCounter):
    """`OldApiCounter` with the gym package's spaces, as an env written for old gym has them."""

    def __init__(self):
        super().__init__()
        self.observation_space = _gym_package_space(self.observation_space)
        self.action_space = _gym_package_space(self.action_space)


class Gym26Counter(OldApiCounterOfGymSpaces):
    """An env of gym 0.26's API (reset(seed=...)), with gym's spaces."""

    def reset(self, seed=None, options=None):
        return super().reset(), {}


@pytest.mark.parametrize("env, advice", [
    (OldApiCounterOfGymSpaces(), "wrap it as shimmy.GymV21CompatibilityV0(env=env) (pip install shimmy gym), then as "
                                 "Stable-Baselines3's DummyVecEnv([lambda: adapted])"),
    (Gym26Counter(), "wrap it as shimmy.GymV26CompatibilityV0(env=env)"),
    (OldApiCounter(), "its spaces are Gymnasium's already, so make it a gymnasium.Env whose reset returns "
                      "(obs, info)")])
def test_a_single_env_of_the_old_gym_api_names_its_adapter(env, advice):
    """A single env of the old gym API (or the gym package's) passed to a model was refused with "...; got a
    OldApiCounter.", naming no way to train on it. One sentence now names Shimmy's adapter for its API (or, where
    its spaces are Gymnasium's, which Shimmy does not convert, what to change)."""
    for call in (lambda: rlspeed.PPO(env, device="cpu"), lambda: rlspeed.DQN(env, device="cpu"),
                 lambda: rlspeed.make_env(env)):
        with pytest.raises(rlspeed.UserError) as raised:
            call()
        message = str(raised.value)
        assert f"not a single env ({type(env).__name__}) of the gym package or the old gym API: {advice}" in message
        assert "\n" not in message and message.endswith(".")


class OldApiGymnasiumEnv(OldApiCounter, gym.Env):
    """An env moved to Gymnasium by `import gymnasium as gym` alone: a gymnasium.Env whose reset and step are still the
    old API's (`reset_ok`: its reset already Gymnasium's, its step not)."""

    reset_ok = False

    def reset(self, seed=None, options=None):
        return (OldApiCounter.reset(self), {}) if self.reset_ok else OldApiCounter.reset(self)


class OldStepGymnasiumEnv(OldApiGymnasiumEnv):
    reset_ok = True


@pytest.mark.parametrize("env_class, message", [
    (OldApiGymnasiumEnv, "'user-sb3-vec-env'.reset() returned a ndarray of shape (2,): Gymnasium's reset returns "
                         "(obs, info)"),
    (OldStepGymnasiumEnv, "'user-sb3-vec-env'.step() returned 4 values: Gymnasium's step returns (obs, reward, "
                          "terminated, truncated, info), and (obs, reward, done, info) is the old gym API's step")])
@pytest.mark.parametrize("monitored", [False, True])
def test_an_old_api_env_in_a_dummy_vec_env_is_named(env_class, message, monitored):
    """An env of the old gym API in Stable-Baselines3's DummyVecEnv (or make_vec_env, whose Monitor unpacks steps
    itself) failed with SB3's own errors: "raised TypeError in reset(): reset() got an unexpected keyword argument
    'seed'", "raised ValueError in step(): not enough values to unpack (expected 5, got 4)". One sentence now says what
    the env returned and names Shimmy's adapter, as for Gymnasium's vector envs; an error inside the env stays its
    own."""
    vec_env = pytest.importorskip("stable_baselines3.common.vec_env")
    if monitored:
        from stable_baselines3.common.env_util import make_vec_env

        env = make_vec_env(env_class, n_envs=2)
    else:
        env = vec_env.DummyVecEnv([env_class] * 2)
    model = rlspeed.PPO(env, seed=0, device="cpu", num_steps=8, batch_size=16)
    with pytest.raises(rlspeed.UserError) as raised:
        model.learn(16, progress_bar=False)
    assert str(raised.value).startswith(message) and "shimmy.GymV21CompatibilityV0(env=YourEnv())" in str(raised.value)
    assert "\n" not in str(raised.value)


def test_an_error_inside_an_env_of_a_dummy_vec_env_stays_its_own():
    """The env's own error, raised inside its step, is not taken for SB3's unpacking of what it returned."""
    vec_env = pytest.importorskip("stable_baselines3.common.vec_env")

    class Failing(OldStepGymnasiumEnv):
        def step(self, action):
            raise ValueError("not enough values to unpack (expected 5, got 4)")

    model = rlspeed.PPO(vec_env.DummyVecEnv([Failing]), seed=0, device="cpu", num_steps=8, batch_size=8)
    with pytest.raises(EnvStepError, match="raised ValueError in step"):
        model.learn(8, progress_bar=False)


class Gym26Adapter(OldApiAdapter):
    """What Shimmy's `GymV26Environment-v0` is to Gymnasium: its constructor takes no render_mode; gym.make's options,
    render_mode among them, go in `make_kwargs`."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, env_id: str = "counter", make_kwargs: dict | None = None):
        super().__init__(env_id)
        self.render_mode = (make_kwargs or {}).get("render_mode")

    def render(self):
        return self.old.render(mode=self.render_mode) if self.render_mode == "rgb_array" else None


def test_a_video_of_shimmys_gym26_adapter_asks_for_frames_in_make_kwargs(monkeypatch):
    """A video of a model trained on `GymV26Environment-v0` (a gym 0.26 env through Shimmy) was refused: "its
    constructor takes no render_mode (give it render_mode=None and a render() that returns an RGB array)": Shimmy's
    adapter takes gym.make's render_mode in make_kwargs, where the video's env now asks for frames."""
    from rlspeed.video import _render_env

    monkeypatch.setitem(gym.registry, "GymV26Environment-v0",
                        gym.envs.registration.EnvSpec("GymV26Environment-v0", entry_point=Gym26Adapter,
                                                      disable_env_checker=True))
    model = rlspeed.PPO("GymV26Environment-v0", env_kwargs={"env_id": "counter", "make_kwargs": {"render_mode": None}},
                        seed=0, device="cpu", env_backend="gymnasium", num_envs=2, num_steps=8, batch_size=16)
    env = _render_env(model)
    env.reset(seed=0)
    assert env.render().shape == (4, 4, 3)
    assert model.spec.env_kwargs["make_kwargs"] == {"render_mode": None}  # (the model's own options stay as given)
    env.close()
    model.close()
