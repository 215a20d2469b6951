"""The single-env Gymnasium view of native envs (`rlspeed/<id>`): Gymnasium's checker and its dynamics."""

import importlib.util
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import rlspeed  # noqa: F401  (registers the rlspeed/ ids)
from rlspeed.envs import NATIVE_ENVS


@pytest.mark.parametrize("env_id", sorted(NATIVE_ENVS))
def test_registered_view_passes_gymnasiums_env_checker(env_id):
    env = gym.make(f"rlspeed/{env_id}")
    original = gym.make(env_id)
    assert env.observation_space == original.observation_space
    assert env.action_space == original.action_space
    assert env.spec.max_episode_steps == original.spec.max_episode_steps
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_env(env.unwrapped, skip_render_check=True)


@pytest.mark.parametrize("env_id", sorted(NATIVE_ENVS))
def test_view_follows_gymnasium_from_the_same_state(env_id):
    view, reference = gym.make(f"rlspeed/{env_id}"), gym.make(env_id)
    view.reset(seed=0)
    reference.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(50):
        state = np.asarray(reference.unwrapped.state, dtype=np.float64)
        view.unwrapped.state = state
        action = reference.action_space.sample()
        obs, reward, terminated, _, _ = view.step(action)
        ref_obs, ref_reward, ref_terminated, _, _ = reference.step(action)
        np.testing.assert_allclose(obs, ref_obs, rtol=1e-5, atol=1e-5)
        assert reward == pytest.approx(ref_reward, abs=1e-6)
        assert terminated == ref_terminated
        if terminated:
            reference.reset(seed=int(rng.integers(1000)))


def test_time_limit_truncates_like_the_original():
    env = gym.make("rlspeed/Pendulum-v1")
    env.reset(seed=1)
    steps, truncated = 0, False
    while not truncated:
        _, _, terminated, truncated, _ = env.step(np.zeros(1, dtype=np.float32))
        steps += 1
        assert not terminated
    assert steps == 200


@pytest.mark.filterwarnings("ignore:.*not in the possible render_modes")  # (without pygame: none)
@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_render_modes_as_gymnasium_code_passes_them(env_id):
    """gym.make(id, render_mode=...) as Gymnasium code writes it: None works; a drawing mode draws the native state
    with Gymnasium's own renderer (pygame), or says that pygame is needed."""
    env = gym.make(f"rlspeed/{env_id}", render_mode=None)
    env.reset(seed=0)
    assert env.render() is None
    env.close()
    with pytest.raises(gym.error.Error, match="not one of .*human, rgb_array"):  # not a pygame hint
        gym.make(f"rlspeed/{env_id}", render_mode="ansi")
    if importlib.util.find_spec("pygame") is None:
        with pytest.raises(gym.error.DependencyNotInstalled, match="pygame"):
            gym.make(f"rlspeed/{env_id}", render_mode="rgb_array")
        return
    view, original = gym.make(f"rlspeed/{env_id}", render_mode="rgb_array"), gym.make(env_id, render_mode="rgb_array")
    view.reset(seed=0)
    original.reset(seed=0)
    original.unwrapped.state = view.unwrapped.state
    assert np.array_equal(view.render(), original.render())
    # after a step, the same frame: Pendulum's shows the torque applied, clipped to 2 (an arrow the view did not draw)
    action = view.action_space.sample() if env_id == "CartPole-v1" else np.array([3.0], dtype=np.float32)
    view.step(action)
    original.step(action)
    original.unwrapped.state = view.unwrapped.state
    assert np.array_equal(view.render(), original.render())
    view.close()
    original.close()
