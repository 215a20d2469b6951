"""The batched env contract (docs/envs.md) for the torch-native and Gymnasium backends."""

from __future__ import annotations

import csv
import functools
import gc
import importlib.util
import inspect
import json
import math
import multiprocessing
import re
import sys
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import ScriptedEnv, needs_torch_export

import rlspeed
from rlspeed.envs import (
    NATIVE_ENVS,
    BatchedEnv,
    EnvSpec,
    EnvWrapper,
    NormalizeObservation,
    NormalizeReward,
    RunningMeanStd,
    env_spec,
)
from rlspeed.envs.cartpole import THETA_THRESHOLD, X_THRESHOLD

CASES = [("torch", "CartPole-v1"), ("gymnasium", "CartPole-v1"), ("gymnasium", "Pendulum-v1")]
CASE_IDS = [f"{backend}-{env_id}" for backend, env_id in CASES]


def random_actions(env: BatchedEnv, generator: torch.Generator) -> torch.Tensor:
    """Uniformly random actions for all rows, as the env expects them (int64 [N] or float32 [N, *shape])."""
    space = env.spec.action_space
    if isinstance(space, gym.spaces.Discrete):
        return torch.randint(int(space.n), (env.num_envs,), generator=generator)
    low = torch.as_tensor(space.low, dtype=torch.float32)
    high = torch.as_tensor(space.high, dtype=torch.float32)
    noise = torch.rand((env.num_envs, *space.shape), generator=generator)
    return low + (high - low) * noise


def balance_cartpole(obs: torch.Tensor) -> torch.Tensor:
    """A linear controller that keeps CartPole up for the full 500 steps from any reset state."""
    gains = torch.tensor([1.0, 1.0, 10.0, 1.0])
    return ((obs * gains).sum(-1) > 0).long()


def outside_cartpole_bounds(obs: torch.Tensor) -> torch.Tensor:
    return (obs[:, 0].abs() > X_THRESHOLD) | (obs[:, 2].abs() > THETA_THRESHOLD)


@pytest.mark.parametrize(("backend", "env_id"), CASES, ids=CASE_IDS)
def test_reset_and_step_follow_the_contract(backend, env_id):
    num_envs = 4
    env = rlspeed.make_env(env_id, num_envs=num_envs, device="cpu", seed=0, backend=backend)
    try:
        assert env.backend == backend
        assert env.num_envs == num_envs
        assert env.device == torch.device("cpu")
        obs_shape = (num_envs, *env.spec.observation_shape)
        reference = gym.make(env_id)
        assert env.spec.observation_shape == reference.observation_space.shape
        assert env.spec.action_space == reference.action_space
        assert env.spec.max_episode_steps == reference.spec.max_episode_steps
        reference.close()

        obs, info = env.reset()
        assert isinstance(obs, torch.Tensor) and isinstance(info, dict)
        assert obs.shape == obs_shape and obs.dtype == torch.float32 and obs.device == env.device

        generator = torch.Generator().manual_seed(0)
        for _ in range(30):
            obs, reward, terminated, truncated, info = env.step(random_actions(env, generator))
            assert obs.shape == obs_shape and obs.dtype == torch.float32 and obs.device == env.device
            assert reward.shape == (num_envs,) and reward.dtype == torch.float32 and reward.device == env.device
            for flag in (terminated, truncated, info["done"]):
                assert flag.shape == (num_envs,) and flag.dtype == torch.bool and flag.device == env.device
            assert torch.equal(info["done"], terminated | truncated)
            final_obs = info["final_obs"]
            assert final_obs.shape == obs_shape and final_obs.dtype == torch.float32
            assert torch.isfinite(obs).all() and torch.isfinite(reward).all()
    finally:
        env.close()


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_gymnasium_backend_matches_single_gymnasium_envs_with_same_step_autoreset(env_id):
    """Row i of the batched env is a Gymnasium env seeded with seed + i, reset in the same step it finishes."""
    num_envs, seed, steps = 3, 11, 230  # Pendulum truncates at 200, CartPole terminates under random actions
    env = rlspeed.make_env(env_id, num_envs=num_envs, device="cpu", seed=seed, backend="gymnasium")
    references = [gym.make(env_id) for _ in range(num_envs)]
    try:
        obs, _ = env.reset()
        expected = [ref.reset(seed=seed + row)[0] for row, ref in enumerate(references)]
        np.testing.assert_allclose(obs.numpy(), np.stack(expected), rtol=0, atol=1e-6)
        generator = torch.Generator().manual_seed(1)
        finished_rows = 0
        for _ in range(steps):
            actions = random_actions(env, generator)
            obs, reward, terminated, truncated, info = env.step(actions)
            for row, ref in enumerate(references):
                action = actions[row].item() if env.spec.discrete else actions[row].numpy()
                ref_obs, ref_reward, ref_terminated, ref_truncated, _ = ref.step(action)
                assert bool(terminated[row]) == ref_terminated and bool(truncated[row]) == ref_truncated
                assert reward[row].item() == pytest.approx(float(ref_reward), abs=1e-5)
                # final_obs is the true observation the action led to, finished or not.
                np.testing.assert_allclose(info["final_obs"][row].numpy(), ref_obs, rtol=0, atol=1e-6)
                if ref_terminated or ref_truncated:
                    finished_rows += 1
                    ref_obs, _ = ref.reset()
                    assert not torch.equal(obs[row], info["final_obs"][row])
                else:
                    assert torch.equal(obs[row], info["final_obs"][row])
                np.testing.assert_allclose(obs[row].numpy(), ref_obs, rtol=0, atol=1e-6)
        assert finished_rows >= num_envs  # the autoreset path was exercised in every row
    finally:
        env.close()
        for ref in references:
            ref.close()


def test_native_cartpole_autoreset_on_termination():
    env = rlspeed.make_env("CartPole-v1", num_envs=16, device="cpu", seed=3, backend="torch")
    obs, _ = env.reset()
    generator = torch.Generator().manual_seed(0)
    terminations = 0
    for _ in range(200):
        obs, reward, terminated, truncated, info = env.step(random_actions(env, generator))
        final_obs = info["final_obs"]
        assert torch.equal(reward, torch.ones_like(reward))
        assert not truncated.any()  # random play never lasts 500 steps
        # Finished rows: the true last obs broke a bound; the returned obs is a fresh reset state.
        assert outside_cartpole_bounds(final_obs[terminated]).all()
        assert (obs[terminated].abs() <= 0.05).all()
        # Unfinished rows: final_obs is obs, and within the bounds.
        assert torch.equal(final_obs[~terminated], obs[~terminated])
        assert not outside_cartpole_bounds(obs[~terminated]).any()
        terminations += int(terminated.sum())
    assert terminations > 16


def test_native_cartpole_truncates_at_500_steps():
    env = rlspeed.make_env("CartPole-v1", num_envs=8, device="cpu", seed=0, backend="torch")
    obs, _ = env.reset()
    for step in range(1, 501):
        obs, _, terminated, truncated, info = env.step(balance_cartpole(obs))
        assert not terminated.any()
        if step < 500:
            assert not truncated.any(), f"truncated early at step {step}"
    assert truncated.all()
    final_obs = info["final_obs"]
    assert not outside_cartpole_bounds(final_obs).any()
    assert (obs.abs() <= 0.05).all()  # already reset
    assert (final_obs != obs).any(dim=1).all()
    assert torch.equal(info["episode_length"], torch.full((8,), 500.0))
    assert torch.equal(info["episode_return"], torch.full((8,), 500.0))


def test_native_state_is_settable_through_make_env():
    """The env contract (docs/envs.md): native envs expose a settable `state`; make_env's result is what users hold."""
    env = rlspeed.make_env("CartPole-v1", num_envs=2, device="cpu", seed=0, backend="torch")
    env.reset()
    # Row 0 is about to fall (theta just under the threshold, rotating outwards); row 1 is upright and still.
    env.state = torch.tensor([[0.0, 0.0, THETA_THRESHOLD - 1e-3, 2.0], [0.0, 0.0, 0.0, 0.0]])
    _, _, terminated, _, info = env.step(torch.tensor([1, 1]))
    assert terminated.tolist() == [True, False]
    assert info["final_obs"][0, 2] > THETA_THRESHOLD


def test_episode_lengths_count_past_float32s_whole_numbers():
    """An episode's length counts every step past 2**24 (where a float32 count stops: 2**24 + 1 is 2**24 in
    float32)."""
    from rlspeed.envs.base import EpisodeStatistics, find_wrapper

    env = rlspeed.make_env("CartPole-v1", num_envs=2, device="cpu", seed=0, backend="torch")
    env.reset()
    statistics = find_wrapper(env, EpisodeStatistics)
    statistics._length.fill_(2**24)
    _, _, terminated, truncated, info = env.step(torch.tensor([0, 1]))
    assert not (terminated | truncated).any() and info["episode_length"].tolist() == [2**24 + 1] * 2


@pytest.mark.parametrize("backend", ["gymnasium", "torch"])
def test_pendulum_truncates_after_200_steps_and_never_terminates(backend):
    if backend == "torch" and "Pendulum-v1" not in NATIVE_ENVS:
        pytest.skip("no device-native Pendulum-v1")
    env = rlspeed.make_env("Pendulum-v1", num_envs=2, device="cpu", seed=0, backend=backend)
    env.reset()
    generator = torch.Generator().manual_seed(0)
    truncated_at = []
    for step in range(1, 401):
        obs, _, terminated, truncated, info = env.step(random_actions(env, generator))
        assert not terminated.any()
        if truncated.any():
            assert truncated.all()
            truncated_at.append(step)
            assert torch.equal(info["episode_length"], torch.full((2,), 200.0))
            assert (info["final_obs"] != obs).any(dim=1).all()
    assert truncated_at == [200, 400]


def rollout(env: BatchedEnv, steps: int, action_seed: int) -> list[torch.Tensor]:
    """Everything the env returned over `steps` random steps, flattened into a list of tensors."""
    obs, _ = env.reset()
    out = [obs]
    generator = torch.Generator().manual_seed(action_seed)
    for _ in range(steps):
        obs, reward, terminated, truncated, info = env.step(random_actions(env, generator))
        out += [obs, reward, terminated, truncated, info["final_obs"]]
    return out


@pytest.mark.parametrize(("backend", "env_id"), CASES, ids=CASE_IDS)
def test_same_seed_same_trajectory_different_seed_different(backend, env_id):
    def run(seed):
        env = rlspeed.make_env(env_id, num_envs=3, device="cpu", seed=seed, backend=backend)
        try:
            return rollout(env, 60, action_seed=0)
        finally:
            env.close()

    first, again, other = run(7), run(7), run(8)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(first[0], other[0])  # different initial states
    assert not all(torch.equal(a, b) for a, b in zip(first, other))


@pytest.mark.parametrize(("backend", "env_id"), CASES, ids=CASE_IDS)
def test_reset_with_explicit_seed_is_reproducible(backend, env_id):
    env = rlspeed.make_env(env_id, num_envs=3, device="cpu", backend=backend)
    try:
        first, _ = env.reset(seed=42)
        env.step(random_actions(env, torch.Generator().manual_seed(0)))
        again, _ = env.reset(seed=42)
        other, _ = env.reset(seed=43)
        assert torch.equal(first, again)
        assert not torch.equal(first, other)
        assert not torch.equal(first[0], first[1])  # rows are seeded differently
    finally:
        env.close()


@pytest.mark.parametrize(("backend", "env_id"), CASES, ids=CASE_IDS)
def test_episode_statistics_are_raw_returns_and_lengths(backend, env_id):
    num_envs = 4
    # Reward normalisation must not change the reported returns (they are the env's own).
    env = rlspeed.make_env(env_id, num_envs=num_envs, device="cpu", seed=0, backend=backend, normalize_reward=True)
    raw = rlspeed.make_env(env_id, num_envs=num_envs, device="cpu", seed=0, backend=backend)
    try:
        env.reset()
        raw.reset()
        generator = torch.Generator().manual_seed(0)
        returns = torch.zeros(num_envs, dtype=torch.float64)
        lengths = torch.zeros(num_envs)
        episodes = 0
        scaled_differs = False
        for _ in range(260):
            actions = random_actions(env, generator)
            _, reward, _, _, info = env.step(actions)
            _, raw_reward, _, _, raw_info = raw.step(actions)
            scaled_differs |= not torch.allclose(reward, raw_reward)
            returns += raw_reward.double()
            lengths += 1
            done = info["done"]
            torch.testing.assert_close(info["episode_return"][done].double(), returns[done], rtol=1e-5, atol=1e-3)
            assert torch.equal(info["episode_length"][done], lengths[done])
            assert torch.equal(raw_info["episode_return"][done], info["episode_return"][done])
            episodes += int(done.sum())
            returns[done] = 0.0
            lengths[done] = 0.0
        assert episodes >= num_envs
        assert scaled_differs
    finally:
        env.close()
        raw.close()


@pytest.mark.parametrize("backend", ["auto", "gymnasium"])
def test_unknown_env_id_suggests_the_close_name(backend):
    with pytest.raises(rlspeed.UserError, match="CartPole-v1"):
        rlspeed.make_env("CartPol-v1", backend=backend)


def test_normalisation_statistics_keep_a_large_offset_and_a_long_count():
    """SB3 keeps its statistics in float64; in float32 a mean offset by 1e6 stops following a spread of 1 (each
    step's share of the correction rounds away) and a count stops counting past 2**24 rows."""
    generator = torch.Generator().manual_seed(0)
    steps, num_envs = 2000, 8
    data = 1e6 + torch.randn(steps + 1, num_envs, 1, generator=generator, dtype=torch.float64)
    env = NormalizeObservation(ScriptedEnv(data.float(), torch.zeros(steps, num_envs)))
    actions = torch.zeros(num_envs, dtype=torch.long)
    env.reset()
    for _ in range(steps):
        normalized, *_ = env.step(actions)
    assert normalized.dtype == torch.float32  # the normalised data keep the observations' dtype
    mean, var, count = 0.0, 1.0, 1e-4  # SB3's RunningMeanStd in numpy float64, step by step
    for batch in data.float().double().numpy():
        delta, total = batch.mean() - mean, count + len(batch)
        mean, var = mean + delta * len(batch) / total, (
            var * count + batch.var() * len(batch) + delta**2 * count * len(batch) / total) / total
        count = total
    assert abs(env.obs_rms.mean.item() - mean) < 1e-3  # a thousandth of the spread (float32: half of it)
    assert abs(env.obs_rms.var.item() - var) < 1e-3 * var

    rms = RunningMeanStd()
    rms.load_state_dict({"mean": torch.zeros(()), "var": torch.ones(()), "count": torch.tensor(2.0**24)})
    rms.update(torch.zeros(1))
    assert rms.count.item() == 2.0**24 + 1


def test_normalize_observation_tracks_the_data_statistics():
    generator = torch.Generator().manual_seed(0)
    steps, num_envs = 100, 32
    mean, std = torch.tensor([3.0, -2.0, 0.0]), torch.tensor([0.5, 4.0, 1e-3])
    data = mean + std * torch.randn(steps + 1, num_envs, 3, generator=generator)
    env = NormalizeObservation(ScriptedEnv(data, torch.zeros(steps, num_envs)))
    actions = torch.zeros(num_envs, dtype=torch.long)
    env.reset()
    for _ in range(steps):
        normalized, _, _, _, info = env.step(actions)
        torch.testing.assert_close(info["final_obs"], normalized)
    seen = data.reshape(-1, 3).double()
    torch.testing.assert_close(env.obs_rms.mean.double(), seen.mean(0), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(env.obs_rms.var.double(), seen.var(0, unbiased=False), rtol=1e-3, atol=1e-6)
    torch.testing.assert_close(env.obs_rms.mean.float(), mean, rtol=0, atol=0.1)
    # Normalised observations of fresh data from the same distribution: mean ~0, std ~1 per feature.
    env.training = False
    frozen = env.obs_rms.mean.clone()
    fresh = mean + std * torch.randn(2, 4096, 3, generator=generator)
    out = NormalizeObservation(ScriptedEnv(fresh, torch.zeros(1, 4096)), obs_rms=env.obs_rms)
    out.training = False
    normalized, _ = out.reset()
    torch.testing.assert_close(normalized.mean(0), torch.zeros(3), rtol=0, atol=0.1)
    torch.testing.assert_close(normalized.std(0), torch.ones(3), rtol=0, atol=0.1)
    assert torch.equal(env.obs_rms.mean, frozen)



def test_normalised_observations_are_clipped_at_10_as_sb3s_vec_normalize():
    """SB3's VecNormalize clips normalised observations to [-10, 10] (`clip_obs`), and so does rlspeed, in a solo
    run's env, a population's (each member's rows) and an off-policy population's sampled batches: an observation far
    from the statistics seen so far reaches the networks 10 standard deviations out, not 10,000."""
    from rlspeed.population.normalize import MemberNormalize, MemberStatistics

    data = torch.tensor([[[1e4, -1e4, 0.5]]]).expand(2, 1, 3)  # ([T + 1, N, D]; statistics start at mean 0, var 1)
    expected = torch.tensor([[10.0, -10.0, 0.5]])
    solo = NormalizeObservation(ScriptedEnv(data, torch.zeros(1, 1)))
    solo.training = False
    torch.testing.assert_close(solo.reset()[0], expected)
    statistics = MemberStatistics.fresh(2, (3,), True, False, torch.device("cpu"))
    members = MemberNormalize(ScriptedEnv(data.expand(2, 2, 3), torch.zeros(1, 2)), 1, statistics)
    members.training = False
    torch.testing.assert_close(members.reset()[0], expected.expand(2, 3))
    torch.testing.assert_close(statistics.normalize_obs(data[:1].expand(2, 1, 3)), expected.expand(2, 1, 3))

def test_rlspeeds_normalisation_around_an_env_of_ones_own_counts_the_envs_own_returns(tmp_path):
    """NormalizeReward(MyEnv()) given to a model or to evaluate: the episodes were counted over the wrapper, so the
    returns in metrics.csv, a target_return and evaluate's were the normalised rewards' sums (Pendulum: -30 where
    the env's was -1765). They are counted under it, as make_env(..., normalize_reward=True) counts them."""
    from rlspeed.envs.pendulum import Pendulum

    def returns(env) -> list[str]:
        model = rlspeed.PPO(env, device="cpu", seed=0, num_steps=100, batch_size=100, n_epochs=1)
        run = tmp_path / str(len(list(tmp_path.iterdir())))
        model.learn(400, progress_bar=False, run_dir=run)
        with open(run / "metrics.csv") as file:
            logged = [row["episode_return"] for row in csv.DictReader(file) if row["episode_return"]]
        evaluated = rlspeed.evaluate(model, NormalizeReward(Pendulum(num_envs=2, device="cpu")), episodes=2,
                                     seed=5)["returns"]
        return logged + evaluated

    wrapped = NormalizeReward(NormalizeObservation(Pendulum(num_envs=2, device="cpu")))
    expected = returns(rlspeed.make_env("Pendulum-v1", num_envs=2, backend="torch", normalize_obs=True,
                                        normalize_reward=True))
    assert returns(wrapped) == expected and float(expected[0]) < -500
    assert wrapped.return_rms.count.item() == pytest.approx(400, abs=1e-3)  # (the wrapper's, as the model's)


def test_an_envs_reward_normalisation_discounting_with_another_gamma_than_the_models_is_said():
    """normalize_reward scales rewards by the std of the return at the algorithm's gamma; a make_env(...,
    normalize_reward=True) env passed in discounts with its own (0.99 by default), and a model with gamma 0.9 trained
    on rewards scaled another way than its own envs (a loaded model's learn) scale them, silently: it is said."""
    with pytest.warns(UserWarning, match=r"discounts its running return with gamma 0.99, and the model's gamma is "
                                         r"0.9: make the env with make_env\(..., normalize_reward=True, gamma=0.9\)"):
        rlspeed.PPO(rlspeed.make_env("Pendulum-v1", num_envs=2, normalize_reward=True), gamma=0.9, device="cpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rlspeed.SAC(rlspeed.make_env("Pendulum-v1", num_envs=2, normalize_reward=True, gamma=0.98), gamma=0.98,
                    device="cpu")
    assert not [warning for warning in caught if "gamma" in str(warning.message)]


def test_normalize_reward_scales_returns_to_unit_variance():
    """Scaled rewards do not depend on the reward scale, and their returns have about unit std."""
    steps, num_envs, gamma = 400, 64, 0.99
    noise = torch.randn(steps, num_envs, generator=torch.Generator().manual_seed(0))
    outputs = []
    for scale in (1.0, 1000.0):
        env = NormalizeReward(ScriptedEnv(torch.zeros(steps + 1, num_envs, 1), scale * noise), gamma=gamma)
        env.reset()
        scaled = torch.stack([env.step(torch.zeros(num_envs))[1] for _ in range(steps)])
        outputs.append(scaled)
    small, large = outputs
    torch.testing.assert_close(small[50:], large[50:], rtol=1e-3, atol=1e-4)
    # iid rewards of std s give discounted returns of std s / sqrt(1 - gamma^2); scaled rewards keep the ratio.
    expected_std = math.sqrt(1 - gamma**2)
    assert large[200:].std().item() == pytest.approx(expected_std, rel=0.3)
    assert torch.equal(torch.sign(large), torch.sign(noise))


def test_make_env_adapts_a_user_built_gymnasium_vector_env():
    vector_env = gym.make_vec("CartPole-v1", num_envs=3, vectorization_mode="sync",
                              vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
    env = rlspeed.make_env(vector_env, device="cpu")
    try:
        assert env.backend == "gymnasium" and env.num_envs == 3
        assert env.spec.env_id == "CartPole-v1" and env.spec.discrete
        assert env.spec.max_episode_steps == 500
        obs, _ = env.reset(seed=5)
        assert obs.shape == (3, 4) and obs.dtype == torch.float32
        generator = torch.Generator().manual_seed(0)
        episodes = 0
        for _ in range(100):
            obs, reward, terminated, truncated, info = env.step(random_actions(env, generator))
            assert reward.dtype == torch.float32 and terminated.dtype == torch.bool
            done = info["done"]
            assert torch.equal(obs[~done], info["final_obs"][~done])
            assert outside_cartpole_bounds(info["final_obs"][terminated]).all()
            episodes += int(done.sum())
        assert episodes > 0
    finally:
        env.close()


def test_make_env_rejects_a_vector_env_without_same_step_autoreset():
    vector_env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync",
                              vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP})
    try:
        with pytest.raises(rlspeed.UserError, match="SAME_STEP"):
            rlspeed.make_env(vector_env, device="cpu")
    finally:
        vector_env.close()


def test_the_refusal_of_a_next_step_vector_env_of_unregistered_envs_gives_a_way_that_makes_one():
    """A vector env built from an env class of the user's (a notebook's, no id registered) with Gymnasium's default
    NEXT_STEP autoreset was refused with only `gymnasium.make_vec(id, ...)` as the way, which takes a registered id;
    the refusal now also names the constructor's `autoreset_mode=`, and what it names is taken."""
    from gymnasium.envs.classic_control import CartPoleEnv

    vector_env = gym.vector.SyncVectorEnv([CartPoleEnv] * 2)
    try:
        with pytest.raises(rlspeed.UserError, match=r"gymnasium\.vector\.SyncVectorEnv\(env_fns, autoreset_mode="
                                                    r"gymnasium\.vector\.AutoresetMode\.SAME_STEP\)"):
            rlspeed.make_env(vector_env, device="cpu")
    finally:
        vector_env.close()
    fixed = gym.vector.SyncVectorEnv([CartPoleEnv] * 2, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    rlspeed.make_env(fixed, device="cpu").close()


@pytest.mark.parametrize("wrap", ["NormalizeObservation", "FlattenObservation"])
def test_a_next_step_vector_env_under_a_vector_observation_wrapper_is_told_to_wrap_each_env(wrap):
    """Gymnasium's vector observation wrappers refuse SAME_STEP autoreset, so the refusal of their NEXT_STEP vector
    env says to give the wrapper to each env (and, for NormalizeObservation, normalize_obs=True): remaking the vector
    env with SAME_STEP alone, under the same wrapper, ends in Gymnasium's own error."""
    vector_env = getattr(gym.wrappers.vector, wrap)(gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync"))
    try:
        each_env = rf"\({wrap}\) refuse: .*wrappers=\[gymnasium\.wrappers\.{wrap}\]\)"
        with pytest.raises(rlspeed.UserError, match=each_env) as refused:
            rlspeed.PPO(vector_env, device="cpu")
        assert ("normalize_obs=True" in str(refused.value)) == (wrap == "NormalizeObservation")
    finally:
        vector_env.close()


def test_auto_backend_takes_gymnasium_for_few_envs_on_a_cpu_and_native_otherwise():
    from rlspeed.envs import CPU_NATIVE_MIN_ENVS, resolve_backend

    few, many = CPU_NATIVE_MIN_ENVS - 1, CPU_NATIVE_MIN_ENVS
    assert resolve_backend("CartPole-v1", "auto", few, "cpu") == "gymnasium"
    assert resolve_backend("CartPole-v1", "auto", many, "cpu") == "torch"
    assert resolve_backend("CartPole-v1", "auto", few, "cuda") == "torch"  # accelerators: no host round trips
    assert resolve_backend("CartPole-v1", "torch", 1, "cpu") == "torch"  # an explicit choice is kept
    assert resolve_backend("LunarLander-v3", "auto", many, "cpu") == "gymnasium"  # no native version
    assert rlspeed.make_env("CartPole-v1", num_envs=2, device="cpu").backend == "gymnasium"
    # native-only options ask for the native env
    assert rlspeed.make_env("CartPole-v1", num_envs=2, device="cpu", state_dtype=torch.float64).backend == "torch"
    assert rlspeed.PPO("CartPole-v1", num_envs=2, device="cpu").env_backend == "gymnasium"


@pytest.mark.parametrize(("backend", "env_id"), CASES, ids=CASE_IDS)
def test_a_reset_with_its_own_seed_uses_up_make_envs_seed(backend, env_id):
    """After `reset(seed=1)`, a plain `reset()` continues seed 1's streams instead of restarting make_env's seed 0."""
    env = rlspeed.make_env(env_id, num_envs=3, device="cpu", seed=0, backend=backend)
    reference = rlspeed.make_env(env_id, num_envs=3, device="cpu", seed=1, backend=backend)
    try:
        assert torch.equal(env.reset(seed=1)[0], reference.reset()[0])
        assert torch.equal(env.reset()[0], reference.reset()[0])
    finally:
        env.close()
        reference.close()


def test_gymnasium_env_options_reach_the_env_and_make_auto_pick_gymnasium():
    for backend, num_envs in [("gymnasium", 1), ("auto", 32)]:  # 32 envs on a CPU: auto's native pick otherwise
        env = rlspeed.make_env("Pendulum-v1", num_envs=num_envs, device="cpu", backend=backend, g=0.0)
        assert env.backend == "gymnasium"
        assert env.unwrapped.vector_env.envs[0].unwrapped.g == 0.0
        env.close()
    # the native envs take exactly these keywords besides num_envs, device and seed
    from rlspeed.envs import NATIVE_OPTIONS, NativeEnv

    assert NATIVE_OPTIONS == tuple(inspect.signature(NativeEnv.__init__).parameters)[4:]


@pytest.mark.parametrize(("backend", "kwargs", "match"), [
    ("gymnasium", {"state_dtype": torch.float64}, "apply only to backend 'torch'"),
    ("gymnasium-async", {"compile": True}, "apply only to backend 'torch'"),
    ("torch", {"g": 0.0}, "takes no env options"),
    ("torch", {"seeed": 1}, "takes no env options"),
    ("auto", {"compile": True, "g": 0.0}, "native-env options .* and Gymnasium env options"),
    ("gymnasium", {"num_env": 8}, "rejected the options num_env"),
], ids=["state_dtype-gymnasium", "compile-async", "env-option-torch", "typo-torch", "both-kinds", "typo-gymnasium"])
def test_make_env_rejects_keywords_the_backend_does_not_take(backend, kwargs, match):
    with pytest.raises(rlspeed.UserError, match=match):
        rlspeed.make_env("Pendulum-v1", num_envs=2, device="cpu", backend=backend, **kwargs)


@pytest.mark.parametrize(("kwargs", "match"), [
    # (torch.zeros' TypeError; the others were taken silently: a string as True, a gamma outside [0, 1], a float seed)
    ({"state_dtype": "float64"}, "state_dtype is the torch dtype of the native env's state, torch.float32 or"),
    ({"state_dtype": torch.int32}, "state_dtype is the torch dtype"),
    ({"compile": "no"}, r"make_env\(compile=...\) is True or False, got 'no'"),
    ({"normalize_obs": "no"}, r"make_env\(normalize_obs=...\) is True or False, got 'no'"),
    ({"normalize_reward": None}, r"make_env\(normalize_reward=...\) is True or False, got None"),
    ({"evaluation": "yes"}, r"make_env\(evaluation=...\) is True or False"),
    ({"normalize_reward": True, "gamma": 1.5}, r"make_env's gamma .* must be a number in \[0, 1\], got 1.5"),
    ({"gamma": "0.99"}, r"make_env's gamma .* got '0.99'"),
    ({"seed": 1.5}, "A seed is a whole number from 0 to 2\\*\\*63 - 1, not 1.5"),
])
def test_make_env_refuses_values_of_the_wrong_kind_in_one_sentence(kwargs, match):
    with pytest.raises(rlspeed.UserError, match=match):
        rlspeed.make_env("CartPole-v1", num_envs=2, device="cpu", **kwargs)


@pytest.mark.parametrize("backend", ["torch", "gymnasium"])
def test_a_step_of_actions_that_are_no_tensor_of_one_row_per_env_is_one_sentence(backend):
    """A list or an array was an EnvStepError of the backend's AttributeError ('list' object has no attribute
    'device'); a tensor of another number of rows was stepped silently."""
    env = rlspeed.make_env("CartPole-v1", num_envs=2, device="cpu", backend=backend)
    env.reset(seed=0)
    try:
        for actions, got in (([0, 1], "a list"), (np.array([0, 1]), "a ndarray"),
                             (torch.zeros(3, dtype=torch.long), r"a tensor of shape \[3\]"),
                             (torch.tensor(1), r"a tensor of shape \[\]")):
            with pytest.raises(rlspeed.UserError, match=rf"^'CartPole-v1'.step takes the actions as a torch tensor "
                                                        rf"with one row per env \(2 rows\), got {got}: "):
                env.step(actions)
        assert env.step(torch.zeros(2, dtype=torch.long))[0].shape == (2, 4)
    finally:
        env.close()


@pytest.mark.parametrize(("env_id", "options", "expected"), [
    ("CartPole-v1", {"sutton_barto_reward": "maybe"},
     "Env 'CartPole-v1' takes the option sutton_barto_reward as true or false (bool), got 'maybe' (str)."),
    ("Pendulum-v1", {"g": "ten"}, "Env 'Pendulum-v1' takes the option g as a number (float), got 'ten' (str)."),
    ("Pendulum-v1", {"g": [9.8, 10.0]}, "Env 'Pendulum-v1' takes the option g as a number (float), got [9.8, 10.0]"),
    # (a number other than 0 and 1 for a bool, which rlspeed's own switches refuse: it was taken as true)
    ("CartPole-v1", {"sutton_barto_reward": 2},
     "Env 'CartPole-v1' takes the option sutton_barto_reward as true or false (bool), got 2 (int)."),
    ("CartPole-v1", {"sutton_barto_reward": 0.5},
     "Env 'CartPole-v1' takes the option sutton_barto_reward as true or false (bool), got 0.5 (float)."),
    # (true for a number, which rlspeed's own numbers refuse: Pendulum trained with gravity 1)
    ("Pendulum-v1", {"g": True}, "Env 'Pendulum-v1' takes the option g as a number (float), got True (bool)."),
])
def test_an_option_given_as_text_or_a_list_where_the_env_takes_a_bool_or_a_number_is_refused(env_id, options,
                                                                                              expected):
    """CartPole's sutton_barto_reward (annotated bool) given 'maybe' (YAML text of --env-kwargs) trained on Sutton and
    Barto's reward without a word ('maybe' is true); Pendulum's g (default 10.0, no annotation) given 'ten' failed in
    its first step, once training had begun (exit 1). Both are refused where the env is made, in one sentence."""
    for make in (lambda: rlspeed.make_env(env_id, num_envs=1, device="cpu", backend="gymnasium", env_kwargs=options),
                 lambda: env_spec(env_id, options)):
        with pytest.raises(rlspeed.UserError) as raised:
            make()
        assert str(raised.value).startswith(expected)
    for value in (True, 1, 0):  # (a bool where a bool goes, or 0 and 1, as rlspeed's own switches take them)
        rlspeed.make_env("CartPole-v1", num_envs=1, device="cpu", backend="gymnasium",
                         env_kwargs={"sutton_barto_reward": value}).close()


def test_env_options_are_held_to_the_rules_of_rlspeeds_own_settings():
    """An option an env declares an int (its annotation) given 2.5, or one it declares a number given true, is refused
    in one sentence as `--set n_epochs=2.5` and `--set learning_rate=true` are (both were passed to the env); whole
    numbers written as floats (1e3), ints for a float, and any number where the default is an int (MountainCar's
    goal_velocity=0) pass. A whole float for an int and 0 or 1 for a bool reach the env as an int and a bool, as
    rlspeed's own settings take them (2.0 reached the env as a float)."""
    from rlspeed.env_options import typed_options

    def creator(size: int = 8, scale: float = 1.0, velocity=0, flag: bool = False):
        """An env's entry point."""

    for options, expected in (({"size": 2.5}, "takes the option size as a whole number (int), got 2.5 (float)."),
                              ({"size": np.bool_(True)}, "takes the option size as a whole number (int), got "),
                              ({"scale": False}, "takes the option scale as a number (float), got False (bool)."),
                              ({"velocity": True}, "takes the option velocity as a number (float), got True (bool)."),
                              ({"max_episode_steps": 50.5},
                               "takes the option max_episode_steps as a whole number (int), got 50.5 (float).")):
        with pytest.raises(rlspeed.UserError, match=f"^Env 'Mine-v0' {re.escape(expected)}"):
            typed_options("Mine-v0", creator, options)
    typed = typed_options("Mine-v0", creator, {"size": 1e3, "scale": 2, "velocity": 0.05, "flag": 1,
                                               "max_episode_steps": 50.0})
    assert typed == {"size": 1000, "scale": 2, "velocity": 0.05, "flag": True, "max_episode_steps": 50}
    assert [type(value) for value in typed.values()] == [int, int, float, bool, int]
    assert typed_options("Mine-v0", creator, {"size": np.int64(4), "scale": np.float32(0.5)}) == {"size": 4,
                                                                                                  "scale": 0.5}


def test_a_bool_option_and_rlspeeds_own_switches_take_the_same_values():
    """One rule for true or false: an env's bool option given 1.0 was refused ("takes the option flag as true or
    false (bool), got 1.0") while a hyperparameter (normalize_advantage=1.0) took it, as did neither make_env's own
    switches; a number equal to 0 or 1 is one everywhere, any other number none."""
    from rlspeed.algos.base import coerce
    from rlspeed.env_options import typed_options
    from rlspeed.errors import true_or_false

    def creator(flag: bool = False):
        """An env's entry point."""

    for value, expected in ((1.0, True), (np.float64(0.0), False), (1, True), (False, False)):
        typed = typed_options("Mine-v0", creator, {"flag": value})["flag"]
        assert typed is expected and true_or_false("x", value) is expected
        assert coerce("normalize_advantage", value, bool) is expected
    for value in (0.5, 2, -1.0, float("nan")):
        with pytest.raises(rlspeed.UserError, match="true or false"):
            typed_options("Mine-v0", creator, {"flag": value})
        with pytest.raises(rlspeed.UserError, match="True or False"):
            true_or_false("x", value)
        with pytest.raises(rlspeed.UserError, match="not a valid bool"):
            coerce("normalize_advantage", value, bool)


def test_a_whole_number_past_int64_is_refused_not_given_to_the_env():
    """`--env-kwargs frame_skip=1e300` reached the env as a 301-digit int (and 10**400 failed with OverflowError, as
    did n_epochs=10**400): a whole number more than 2**63 - 1 in size, for an env's int option or an int
    hyperparameter, is refused in one sentence; int64's own largest still passes."""
    from rlspeed.algos.base import coerce
    from rlspeed.env_options import typed_options

    def creator(frame_skip: int = 5):
        """An env's entry point."""

    for value, shown in ((1e300, "1e+300"), (10**400, "a 401-digit number"), (-2.0**64, "-1.8446744073709552e+19")):
        with pytest.raises(rlspeed.UserError, match=rf"^Env 'Mine-v0' takes the option frame_skip as a whole "
                                                    rf"number \(int\) of at most 2\*\*63 - 1 .* in size, got "
                                                    rf"{re.escape(shown)}\.$"):
            typed_options("Mine-v0", creator, {"frame_skip": value})
        with pytest.raises(rlspeed.UserError, match=rf"^Hyperparameter 'n_epochs' takes a whole number of at most "
                                                    rf"2\*\*63 - 1 .* got {re.escape(shown)}\.$"):
            coerce("n_epochs", value, int)
    assert typed_options("Mine-v0", creator, {"frame_skip": 2**63 - 1}) == {"frame_skip": 2**63 - 1}
    assert coerce("n_epochs", 1e18, int) == 10**18


def test_a_whole_float_time_limit_is_the_envs_time_limit():
    """`--env-kwargs max_episode_steps=200.0` (or env_kwargs={"max_episode_steps": 200.0}) was refused in Gymnasium's
    words ("Expect the `max_episode_steps` to be an integer"), where rlspeed's own int settings take 200.0 as 200."""
    options = {"max_episode_steps": 40.0}
    assert env_spec("CartPole-v1", options).max_episode_steps == 40
    env = rlspeed.make_env("CartPole-v1", num_envs=1, device="cpu", backend="gymnasium", env_kwargs=options)
    try:
        assert env.spec.max_episode_steps == 40 and type(env.spec.env_kwargs["max_episode_steps"]) is int
    finally:
        env.close()


def test_a_misspelled_env_option_names_the_option_the_env_takes():
    """`--env-kwargs is_slipery=false` on FrozenLake-v1 got the env's TypeError alone; now the sentence names the
    constructor's option spelled nearly so, and nothing for a name close to none of them."""
    from rlspeed.envs.gymnasium_env import rejected_options

    misspelled = rejected_options("FrozenLake-v1", {"is_slipery": False},
                                  TypeError("FrozenLakeEnv.__init__() got an unexpected keyword argument 'is_slipery'"))
    assert str(misspelled).endswith("'is_slipery'; did you mean is_slippery?")
    unknown = rejected_options("FrozenLake-v1", {"colour": 1},
                               TypeError("FrozenLakeEnv.__init__() got an unexpected keyword argument 'colour'"))
    assert str(unknown).endswith("'colour'.") and "did you mean" not in str(unknown)


def test_an_unknown_env_id_suggests_only_ids_of_a_name_spelled_alike():
    """`MyLine-v0` (a user's env no package registered) was offered "Alien-v0, Skiing-v0, Pooyan-v0", ids sharing
    letters with it; a misspelled, miscased or outdated id still gets the registered ones of its name."""
    from rlspeed.envs.gymnasium_env import close_env_ids

    ids = ["CartPole-v0", "CartPole-v1", "Alien-v0", "ALE/Alien-v5", "Skiing-v0", "Pooyan-v0", "Tennis-v0",
           "FrozenLake-v1", "FrozenLake8x8-v1", "Freeway-v0", "ALE/Pong-v5"]
    assert close_env_ids("MyLine-v0", ids) == [] and close_env_ids("mymodule:Test-v0", ids) == []
    assert close_env_ids("CartPol-v1", ids) == ["CartPole-v1", "CartPole-v0"]
    assert close_env_ids("FrozenLake-v0", ids) == ["FrozenLake-v1", "FrozenLake8x8-v1"]
    assert close_env_ids("ALE/pong-v4", ids) == ["ALE/Pong-v5"]
    with pytest.raises(rlspeed.UserError) as raised:
        rlspeed.make_env("MyLine-v0", num_envs=1, device="cpu")
    assert "Did you mean" not in str(raised.value)


def test_an_option_value_the_env_cannot_use_is_named():
    """FrozenLake's map_name="9x9" raises KeyError in its constructor (an internal error, exit 1, before); a value
    the env takes but fails on later (Pendulum's g=None, in its first step) names the options it was made with."""
    from rlspeed.errors import EnvStepError

    with pytest.raises(rlspeed.UserError, match=r"Env 'FrozenLake-v1' rejected the options map_name: '9x9'"):
        rlspeed.make_env("FrozenLake-v1", num_envs=2, device="cpu", map_name="9x9")
    env = rlspeed.make_env("Pendulum-v1", num_envs=2, device="cpu", backend="gymnasium", g=None)
    env.reset(seed=0)
    with pytest.raises(EnvStepError, match=r"raised TypeError in step\(\).*made with the options g: check"):
        env.step(torch.zeros(2, 1))
    env.close()


def test_a_model_given_an_env_and_another_num_envs_is_refused():
    """The env passed in decides how many envs train: another num_envs (which the rollout and replay sizes would
    follow) is one sentence; the env's own number, or none, is taken."""
    env = rlspeed.make_env("CartPole-v1", num_envs=4, device="cpu")
    try:
        with pytest.raises(rlspeed.UserError, match="^num_envs=8 does not match the env passed in, which has 4 envs.$"):
            rlspeed.PPO(env, num_envs=8)
        assert rlspeed.PPO(env, num_envs=4).config.num_envs == rlspeed.DQN(env).config.num_envs == 4
    finally:
        env.close()


def test_make_env_rejects_env_options_for_a_built_vector_env():
    vector_env = gym.make_vec("Pendulum-v1", num_envs=2, vectorization_mode="sync",
                              vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
    try:
        with pytest.raises(rlspeed.UserError, match="already built"):
            rlspeed.make_env(vector_env, device="cpu", g=0.0)
    finally:
        vector_env.close()


@pytest.mark.parametrize("vector_class", [gym.vector.SyncVectorEnv, gym.vector.AsyncVectorEnv])
def test_a_directly_built_vector_env_takes_its_spec_from_its_envs(vector_class):
    """SyncVectorEnv/AsyncVectorEnv built by hand have no spec of their own; their envs' one names the task."""
    vector_env = vector_class([lambda: gym.make("CartPole-v1")] * 2,
                              autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    assert vector_env.spec is None
    env = rlspeed.make_env(vector_env, device="cpu")
    try:
        assert env.spec.env_id == "CartPole-v1"
        assert env.spec.max_episode_steps == 500 and env.spec.reward_threshold == 475.0
    finally:
        env.close()


def test_a_vector_env_made_without_the_env_checker_keeps_its_id():
    """gym.make_vec(..., disable_env_checker=True) makes the registered env, only unchecked: the model keeps its id,
    so evaluate() and a target rebuild it."""
    vector_env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync", disable_env_checker=True,
                              vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
    model = rlspeed.PPO(vector_env, device="cpu", num_steps=16, batch_size=32)
    try:
        assert model.env_id == "CartPole-v1" and model.spec.reward_threshold == 475.0
        assert model.evaluate(episodes=2)["episodes"] == 2
    finally:
        model.close()


def test_a_vector_env_of_unregistered_envs_keeps_a_placeholder_id():
    from gymnasium.envs.classic_control import CartPoleEnv

    vector_env = gym.vector.SyncVectorEnv([CartPoleEnv] * 2, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    env = rlspeed.make_env(vector_env, device="cpu")
    try:
        assert env.spec.env_id == "user-vector-env" and env.spec.max_episode_steps is None
    finally:
        env.close()


def test_make_env_names_what_it_accepts_for_other_kinds_of_env():
    single = gym.make("CartPole-v1")
    with pytest.raises(rlspeed.UserError, match=r"give its id \('CartPole-v1'\), or wrap it as Stable-Baselines3's "
                                                r"DummyVecEnv\(\[lambda: env\]\) or .*SyncVectorEnv\(\[lambda: env\]"):
        rlspeed.make_env(single, device="cpu")
    # (the model and load say the same, evaluate takes it as evaluate_policy does; an env without a registered id is
    # not given one)
    from gymnasium.envs.classic_control import CartPoleEnv

    with pytest.raises(rlspeed.UserError, match=r"not a single gymnasium.Env \(CartPoleEnv\): wrap it as "
                                                r"Stable-Baselines3's DummyVecEnv"):
        rlspeed.PPO(CartPoleEnv(), device="cpu")
    single.close()
    with pytest.raises(rlspeed.UserError, match="Gymnasium env id"):
        rlspeed.make_env(42, device="cpu")


def test_a_refused_env_is_said_by_the_function_the_user_called(tmp_path):
    """PPO(env), PPO.load(path, env=) and evaluate(model, env) name themselves in the sentence saying which envs they
    take, not the make_env they call (which the user never called)."""
    model = rlspeed.PPO("CartPole-v1", device="cpu")
    with pytest.raises(rlspeed.UserError, match=r"^PPO takes a Gymnasium env id \(str\).*not a single gymnasium.Env"):
        rlspeed.PPO(gym.make("CartPole-v1"), device="cpu")
    with pytest.raises(rlspeed.UserError, match=r"^evaluate takes a Gymnasium env id \(str\), a single gymnasium.Env, "
                                                r"an env rlspeed.make_env made, .*not a function"):
        rlspeed.evaluate(model, lambda: gym.make("CartPole-v1"))
    model.save(tmp_path / "model")
    with pytest.raises(rlspeed.UserError, match=r"^PPO.load takes a Gymnasium env id \(str\).*, not 42 \(an int\)\.$"):
        rlspeed.PPO.load(tmp_path / "model", env=42)


def _refused_as_a_single_env_to_wrap(env) -> None:
    """`PPO(env)` and SB3's `PPO("MlpPolicy", env)` refuse the single env `env` saying to wrap it in a vector env (not
    to give its id, whose env lacks what the user set up on this one)."""
    with pytest.raises(rlspeed.UserError, match=r"not a single gymnasium.Env \(\w+\): wrap it as ") as refused:
        rlspeed.PPO(env, device="cpu")
    assert "give its id" not in str(refused.value)
    with pytest.raises(rlspeed.UserError, match=r"so write PPO\(env, \.\.\.\)"):
        rlspeed.PPO("MlpPolicy", env, device="cpu")


def test_a_single_env_that_renders_is_not_answered_with_an_id_that_shows_nothing(tmp_path):
    """A single env made to be watched (render_mode="human") or filmed (RecordVideo around an rgb_array env) was
    answered "give its id ('CartPole-v1')": the id's env renders nothing, so the window or the videos were dropped
    without a word; the refusal says to wrap the env itself in a vector env."""
    pytest.importorskip("moviepy", reason="Gymnasium's RecordVideo needs moviepy")
    watched = gym.make("CartPole-v1", render_mode="human")
    filmed = gym.wrappers.RecordVideo(gym.make("CartPole-v1", render_mode="rgb_array"), str(tmp_path),
                                      disable_logger=True)
    for env in (watched, filmed):
        _refused_as_a_single_env_to_wrap(env)
    filmed.close()
    watched.close()


def test_a_wrapped_single_env_or_an_env_factory_is_not_answered_with_an_id_that_drops_its_wrappers():
    """A single env with wrappers or a time limit of its own is not the env its id makes: the refusal says to wrap it
    in a vector env, not to give the id (which would train on the unwrapped env); an env factory (SB3's habit) is told
    how to make the vector env of its envs."""
    wrapped = gym.wrappers.NormalizeObservation(gym.make("CartPole-v1"))
    limited = gym.make("CartPole-v1", max_episode_steps=20)
    for env in (wrapped, limited):
        _refused_as_a_single_env_to_wrap(env)
    with pytest.raises(rlspeed.UserError, match=r"so write PPO\('CartPole-v1', \.\.\.\)"):
        rlspeed.PPO("MlpPolicy", gym.make("CartPole-v1", disable_env_checker=True), device="cpu")
    with pytest.raises(rlspeed.UserError, match=r"not a function \(<lambda>\): give the vector env of the envs it "
                                                r"makes, gymnasium.vector.SyncVectorEnv\(\[function\] \* N"):
        rlspeed.PPO(lambda: gym.make("CartPole-v1"), device="cpu")


class FakeSB3VecEnv:
    """Stable-Baselines3's VecEnv interface, without SB3: 2 envs; env 0 ends (terminates) on every 2nd step, env 1
    is cut by a time limit on every 3rd; observations count the steps."""

    num_envs = 2
    observation_space = gym.spaces.Box(-100.0, 100.0, (3,))
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        self.t = [0, 0]
        self.seeded = None
        self.actions = None

    def seed(self, seed=None):
        self.seeded = seed

    def reset(self):
        self.t = [0, 0]
        return np.zeros((2, 3), dtype=np.float64)

    def step_async(self, actions):
        self.actions = actions

    def step_wait(self):
        obs, dones, infos = np.zeros((2, 3)), np.zeros(2, dtype=bool), [{}, {}]
        for i, period in enumerate((2, 3)):
            self.t[i] += 1
            if self.t[i] == period:
                dones[i] = True
                infos[i]["terminal_observation"] = np.full(3, float(self.t[i]))
                if i == 1:
                    infos[i]["TimeLimit.truncated"] = True
                self.t[i] = 0
            obs[i] = self.t[i]
        return obs, np.ones(2), dones, infos

    def get_attr(self, name, indices=None):
        raise AttributeError(name)

    def close(self):
        pass


def test_a_vec_env_with_sb3s_interface_works_without_stable_baselines3_installed(monkeypatch):
    """A VecEnv of another package with SB3's interface, where SB3 is not installed (the README's test install):
    looking for a reward-normalising VecNormalize imported SB3 and failed."""
    monkeypatch.setitem(sys.modules, "stable_baselines3", None)
    env = rlspeed.make_env(FakeSB3VecEnv(), device="cpu", seed=7)
    assert env.reset()[0].shape == (2, 3)


def test_a_stable_baselines3_vec_env_meets_the_contract():
    env = rlspeed.make_env(FakeSB3VecEnv(), device="cpu", seed=7)
    obs, _ = env.reset()
    assert env.unwrapped.vec_env.seeded == 7 and obs.dtype == torch.float32 and obs.shape == (2, 3)
    finals, flags = [], []
    for _ in range(6):
        obs, reward, terminated, truncated, info = env.step(torch.tensor([0, 1]))
        assert reward.dtype == torch.float32 and terminated.dtype == torch.bool and reward.shape == (2,)
        finals.append(info["final_obs"][:, 0].tolist())
        flags.append((terminated.tolist(), truncated.tolist()))
    assert env.unwrapped.vec_env.actions.dtype == np.int64
    # env 0 terminates at steps 2, 4, 6; env 1 is truncated (not terminated) at steps 3 and 6
    assert flags[1] == ([True, False], [False, False]) and flags[2] == ([False, False], [False, True])
    assert flags[5] == ([True, False], [False, True])
    assert finals[1][0] == 2.0 and finals[2][1] == 3.0 and obs[:, 0].tolist() == [0.0, 0.0]  # reset in place


def test_a_vec_env_whose_has_attr_raises_attribute_error_trains_unmasked():
    """SuperSuit's `concat_vec_envs_v1(..., base_class="stable_baselines3")` (PettingZoo agents as envs) inherits
    SB3's `has_attr`, which asks the vector env inside, and that has none: looking for `action_masks()` raised
    AttributeError out of the model's constructor, where SB3's PPO trains on it."""

    class Inner:  # (a vector env without has_attr, as SuperSuit's ConcatVecEnv)
        pass

    class Wrapped(FakeSB3VecEnv):
        venv = Inner()

        def has_attr(self, name):
            return self.venv.has_attr(name)

    model = rlspeed.PPO(Wrapped(), device="cpu", seed=0, num_steps=8, batch_size=16, n_epochs=1)
    model.learn(16, progress_bar=False)
    assert model.num_timesteps == 16


class _ParallelGame:
    """The shape of a PettingZoo parallel env: reset, step, and spaces per agent (methods)."""

    possible_agents = ["player_0", "player_1"]

    def reset(self, seed=None, options=None):
        return {agent: np.zeros(2, np.float32) for agent in self.possible_agents}, {}

    def step(self, actions):
        raise AssertionError("not stepped")

    def observation_space(self, agent):
        return gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def action_space(self, agent):
        return gym.spaces.Discrete(2)


class _TurnGame(_ParallelGame):
    """The shape of a PettingZoo AEC env: one agent acts at a time (`agent_iter`)."""

    def agent_iter(self):
        return iter(self.possible_agents)


@pytest.mark.parametrize("game, conversion", [(_ParallelGame(), False), (_TurnGame(), True)])
def test_a_pettingzoo_env_given_alone_names_supersuits_route_not_shimmys(game, conversion):
    """A PettingZoo env has an env's reset, step and spaces: given to a model as it is, it was told it was an env of
    the old gym API and to wrap it in Shimmy's GymV26CompatibilityV0, which cannot train agents. It names SuperSuit's
    vector env of one row per agent (docs/envs.md), an AEC env's conversion to a parallel one first."""
    for call in (lambda: rlspeed.PPO(game, device="cpu"), lambda: rlspeed.make_env(game)):
        with pytest.raises(rlspeed.UserError) as raised:
            call()
        message = str(raised.value)
        assert f"not a PettingZoo env ({type(game).__name__}): SuperSuit makes a parallel env a Stable-Baselines3 " \
               "VecEnv of one row per agent, supersuit.concat_vec_envs_v1(supersuit.pettingzoo_env_to_vec_env_v1(" \
               "env), 1, base_class=\"stable_baselines3\")" in message, message
        assert ("aec_to_parallel" in message) == conversion and "shimmy" not in message.lower()
        assert "\n" not in message and message.endswith(".")


def test_a_vec_env_that_cannot_be_seeded_runs_unseeded_with_one_warning():
    """SuperSuit's SB3 wrapper inherits SB3's seed(), which asks the vector env inside, and that has none: a model
    with seed= and every evaluation (EvalCallback seeds each) stopped with "raised AttributeError in reset()"."""
    from rlspeed.envs import sb3_env

    class Inner:  # (a vector env without seed, as SuperSuit's ConcatVecEnv)
        pass

    class Unseedable(FakeSB3VecEnv):
        venv = Inner()

        def seed(self, seed=None):
            return self.venv.seed(seed)

    sb3_env._WARNED_UNSEEDED.discard("Unseedable")
    with pytest.warns(UserWarning, match=r"This Unseedable cannot be seeded \(its seed\(\) raised AttributeError: "
                                         r"'Inner' object has no attribute 'seed'\)"):
        model = rlspeed.PPO(Unseedable(), device="cpu", seed=0, num_steps=8, batch_size=16, n_epochs=1)
        model.learn(16, progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # (said once)
        assert len(rlspeed.evaluate(model, Unseedable(), episodes=2, seed=3)["returns"]) == 2


def test_algorithms_train_on_a_stable_baselines3_vec_env():
    vec_env_util = pytest.importorskip("stable_baselines3.common.env_util")
    vec_env = vec_env_util.make_vec_env("CartPole-v1", n_envs=2, seed=0)
    try:
        model = rlspeed.PPO(vec_env, device="cpu", seed=0, num_steps=32, batch_size=64, n_epochs=1)
        assert model.env_id == "CartPole-v1" and model.spec.max_episode_steps == 500
        model.learn(128, progress_bar=False)
        assert model.num_timesteps == 128 and len(model.evaluate(episodes=2)["returns"]) == 2
    finally:
        vec_env.close()


def test_observations_outlive_a_copy_false_async_vector_env_buffer():
    """AsyncVectorEnv(copy=False) returns its shared-memory buffer, which the next step overwrites."""
    vector_env = gym.vector.AsyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2, copy=False,
                                           autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    env = rlspeed.make_env(vector_env, device="cpu", seed=0)
    try:
        kept = [env.reset()[0]]
        copies = [kept[0].clone()]
        for _ in range(3):
            obs, *_ = env.step(torch.ones(2, dtype=torch.long))
            kept.append(obs)
            copies.append(obs.clone())
        for obs, copy in zip(kept, copies):
            assert torch.equal(obs, copy)
        assert not torch.equal(copies[0], copies[-1])
    finally:
        env.close()


def test_setting_training_on_the_outer_wrapper_freezes_every_statistic():
    env = rlspeed.make_env("CartPole-v1", num_envs=16, device="cpu", seed=0, backend="torch", normalize_obs=True,
                           normalize_reward=True)
    actions = torch.zeros(16, dtype=torch.long)
    env.reset()
    env.step(actions)
    assert env.training and env.env.training
    env.training = False
    assert not env.training and not env.env.training
    counts = env.obs_rms.count.clone(), env.return_rms.count.clone()
    env.reset()
    env.step(actions)
    assert torch.equal(env.obs_rms.count, counts[0]) and torch.equal(env.return_rms.count, counts[1])
    env.env.training = True  # the inner wrapper alone: the outer one is still frozen, and reading says so
    assert env.env.training and not env.training
    env.training = True
    env.step(actions)
    assert env.obs_rms.count > counts[0] and env.return_rms.count > counts[1]
    assert rlspeed.make_env("CartPole-v1", device="cpu").training  # no normalisation: nothing to freeze


def test_make_env_takes_the_clips_of_its_normalisation_as_the_algorithms_name_them():
    """`make_env(..., normalize_obs=True, normalize_obs_clip=0.5)` was read as an option of the Gymnasium env
    ("CartPoleEnv.__init__() got an unexpected keyword argument"): the clips were reachable only by building the
    wrappers by hand. They bound the normalised values (the wrappers' clips, which a model given the env takes as its
    own); a bad clip is one sentence, and a clip without its normalisation is said to do nothing."""
    env = rlspeed.make_env("CartPole-v1", num_envs=4, device="cpu", seed=0, backend="torch", normalize_obs=True,
                           normalize_obs_clip=0.5, normalize_reward=True, normalize_reward_clip=0.1)
    obs, _ = env.reset()
    for _ in range(8):
        obs, reward, *_ = env.step(torch.zeros(4, dtype=torch.long))
    assert float(obs.abs().max()) == pytest.approx(0.5) and float(reward.abs().max()) == pytest.approx(0.1)
    assert (env.env.clip, env.clip) == (0.5, 0.1)  # (the wrappers' clips, which a model given the env takes)
    for bad in (0, math.inf, True):
        with pytest.raises(rlspeed.UserError, match="make_env's normalize_obs_clip must be a positive finite number"):
            rlspeed.make_env("CartPole-v1", normalize_obs=True, normalize_obs_clip=bad)
    with pytest.warns(rlspeed.errors.UnusedSettingWarning, match="normalize_reward_clip=3 has no effect"):
        rlspeed.make_env("CartPole-v1", normalize_reward_clip=3)


@pytest.mark.parametrize("variant", ["time limit", "reward wrapper"])
def test_a_vector_env_of_modified_envs_does_not_pass_for_the_registered_one(variant):
    """Evaluation and targets rebuild the env from its id: a variant of a registered env keeps no id, so they fail
    with a clear error instead of measuring another env."""
    def make():
        if variant == "time limit":
            return gym.make("CartPole-v1", max_episode_steps=20)
        return gym.wrappers.TransformReward(gym.make("CartPole-v1"), lambda reward: 0.0 * reward)

    vector_env = gym.vector.SyncVectorEnv([make] * 2, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    env = rlspeed.make_env(vector_env, device="cpu")
    assert env.spec.env_id == "user-vector-env" and env.spec.reward_threshold is None
    model = rlspeed.PPO(vector_env, device="cpu", num_steps=16, batch_size=32)
    with pytest.raises(rlspeed.UserError, match="is no id rlspeed can make an env of"):
        model.learn(64, target_return=1.0, progress_bar=False)


@pytest.mark.parametrize("wrap", ["gymnasium reward", "sb3 VecNormalize", "sb3 VecFrameStack", "sb3 VecMonitor"])
def test_a_wrapped_vector_env_is_not_evaluated_as_the_registered_one(wrap):
    """A wrapper around the vector env itself (Gymnasium's vector wrappers, Stable-Baselines3's VecEnvWrappers) makes
    it a variant: the model keeps no id, so `evaluate()` refuses in one sentence saying what to pass instead of
    measuring the unwrapped env; a recording wrapper (VecMonitor) keeps the id."""
    if wrap.startswith("sb3"):
        sb3 = pytest.importorskip("stable_baselines3.common.vec_env")
        from stable_baselines3.common.env_util import make_vec_env

        vector_env = getattr(sb3, wrap.split()[1])(make_vec_env("Pendulum-v1", n_envs=2),
                                                    **({"n_stack": 2} if wrap.endswith("FrameStack") else {}))
    else:
        same_step = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}
        vector_env = gym.wrappers.vector.TransformReward(
            gym.make_vec("Pendulum-v1", num_envs=2, vector_kwargs=same_step), lambda reward: 100 * reward)
    model = rlspeed.PPO(vector_env, device="cpu", num_steps=16, batch_size=32)
    if wrap.endswith("VecMonitor"):
        assert model.env_id == "Pendulum-v1"
        return
    assert model.env_id.startswith("user-")
    with pytest.raises(rlspeed.UserError, match=r"trained on a vector env you built, which has no id.*"
                                                 r"rlspeed.evaluate\(model, env, episodes=env.num_envs\)"):
        model.evaluate(episodes=2)
    assert rlspeed.evaluate(model, vector_env, episodes=2)["episodes"] == 2  # (the env itself, as it was built)
    # (its envs share other numbers of episodes, as SB3's evaluate_policy spreads them)
    assert rlspeed.evaluate(model, vector_env, episodes=3)["episodes"] == 3
    model.learn(64, progress_bar=False)  # (evaluate left the env it was given open)


def test_a_wrapper_may_set_training_before_initialising_its_base():
    class Early(EnvWrapper):
        def __init__(self, env):
            self.training = True  # before EnvWrapper.__init__: there is no inner env yet
            super().__init__(env)

    inner = rlspeed.make_env("CartPole-v1", num_envs=2, device="cpu", normalize_obs=True)
    inner.training = False
    wrapped = Early(inner)
    assert wrapped.training is False and inner.training is False  # the frozen inner env stays frozen


@needs_torch_export
def test_env_options_stay_with_the_model_for_evaluation_and_loading(tmp_path):
    """A model of an env made with options (`make_env(id, **options)` or `env_kwargs=`) evaluates, and reloads, on
    that env, not on the id's default one: here Pendulum-v1 with g=2.0, whose returns differ from the default g's."""
    settings = dict(seed=0, device="cpu", num_envs=2, num_steps=16, batch_size=32)
    env = rlspeed.make_env("Pendulum-v1", num_envs=2, device="cpu", seed=0, g=2.0)
    model = rlspeed.PPO(env, **settings)
    assert model.spec.env_kwargs == {"g": 2.0}
    given = rlspeed.PPO("Pendulum-v1", env_kwargs={"g": 2.0}, **settings)
    assert given.env_backend == "gymnasium" and given.spec.env_kwargs == {"g": 2.0}
    assert given.make_training_env().unwrapped.vector_env.envs[0].unwrapped.g == 2.0
    own = rlspeed.evaluate(model, episodes=2, seed=5)
    with_options = rlspeed.evaluate(model, rlspeed.make_env("Pendulum-v1", num_envs=2, device="cpu", g=2.0),
                                    episodes=2, seed=5)  # (an env make_env made is evaluated as it is)
    default = rlspeed.evaluate(model, rlspeed.make_env("Pendulum-v1", num_envs=2, device="cpu",
                                                       backend="gymnasium"), episodes=2, seed=5)
    assert own["returns"] == with_options["returns"] != default["returns"]
    model.save(tmp_path / "model")
    loaded = rlspeed.PPO.load(tmp_path / "model", device="cpu")
    assert loaded.spec.env_kwargs == {"g": 2.0}
    assert rlspeed.evaluate(loaded, episodes=2, seed=5)["returns"] == own["returns"]
    with pytest.warns(UserWarning, match="made with the options .* makes that env without them"):
        rlspeed.PPO.load(tmp_path / "model", device="cpu", env="Pendulum-v1")
    # a curriculum's next stage: load with other options (over the recorded ones); `load` refused them, saying that
    # the env was already built, where none was given
    harder = rlspeed.PPO.load(tmp_path / "model", device="cpu", env_kwargs={"g": 5.0})
    assert harder.spec.env_kwargs == {"g": 5.0}
    assert harder.make_training_env().unwrapped.vector_env.envs[0].unwrapped.g == 5.0
    with pytest.raises(rlspeed.UserError, match="an env already built has its own: make it with them"):
        rlspeed.PPO.load(tmp_path / "model", device="cpu", env=env, env_kwargs={"g": 5.0})
    sidecar = json.loads(Path(f"{model.export(tmp_path / 'policy.pt2')}.json").read_text())
    assert sidecar["env_kwargs"] == {"g": 2.0}
    with pytest.raises(rlspeed.UserError, match="env_kwargs with an env id; this env is already built"):
        rlspeed.PPO(env, env_kwargs={"g": 2.0}, **settings)
    with pytest.raises(rlspeed.UserError, match="env_backend='gymnasium'"):
        rlspeed.PPO("Pendulum-v1", env_kwargs={"g": 2.0}, env_backend="torch", **settings)
    with pytest.raises(rlspeed.UserError, match="rejected the options gg"):
        rlspeed.PPO("Pendulum-v1", env_kwargs={"gg": 2.0}, **settings)
    # a time limit set by the options is the variant's (evaluation ran the registered 200 steps), and the stock env's
    # reward threshold says nothing of a variant
    longer = rlspeed.PPO("Pendulum-v1", env_kwargs={"max_episode_steps": 300}, **settings)
    assert longer.spec.max_episode_steps == 300 and longer.spec.reward_threshold is None
    assert rlspeed.evaluate(longer, episodes=2, seed=0)["lengths"] == [300, 300]
    with pytest.raises(rlspeed.UserError, match="only Gymnasium's envs take: evaluate it with backend='gymnasium'"):
        rlspeed.evaluate(model, episodes=2, backend="torch")


def test_load_makes_the_env_it_is_given_by_id_on_the_backend_given(tmp_path):
    """`Algo.load(path, env=env_id or env_kwargs=..., env_backend=...)` (fine-tuning on a variant) makes that env on
    the backend asked for, and again on it after `close`; a backend that cannot take the options is refused."""
    path = rlspeed.PPO("Pendulum-v1", device="cpu", num_envs=2, num_steps=8, batch_size=16,
                       env_backend="gymnasium").save(tmp_path / "model")
    with rlspeed.PPO.load(path, device="cpu", env="Pendulum-v1", env_backend="torch") as native:
        assert native.env_backend == "torch" and native.make_training_env().unwrapped.backend == "torch"
    with rlspeed.PPO.load(path, device="cpu", env_kwargs={"g": 5.0}, env_backend="gymnasium-async") as harder:
        assert harder.env_backend == "gymnasium-async"
        assert isinstance(harder.make_training_env().unwrapped.vector_env, gym.vector.AsyncVectorEnv)
    with pytest.raises(rlspeed.UserError, match="env_kwargs are options of Gymnasium's env: use env_backend="):
        rlspeed.PPO.load(path, device="cpu", env_kwargs={"g": 5.0}, env_backend="torch")


def test_sb3_vec_normalize_returns_are_the_envs_own_and_eval_callback_syncs_its_statistics(tmp_path):
    """Stable-Baselines3's VecNormalize pattern: episode returns (metrics.csv, `evaluate`) are the env's own rewards',
    as SB3's Monitor records them, not the normalised ones the model trains on; an EvalCallback on a VecNormalize
    eval env evaluates with the training env's statistics (SB3's `sync_envs_normalization`)."""
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    from rlspeed.callbacks import EvalCallback

    train_env = VecNormalize(make_vec_env("Pendulum-v1", n_envs=2, seed=0))
    eval_env = VecNormalize(make_vec_env("Pendulum-v1", n_envs=1, seed=1), training=False, norm_reward=False)
    model = rlspeed.PPO(train_env, device="cpu", num_steps=128, batch_size=64, seed=0)
    model.learn(1024, callback=EvalCallback(eval_env, eval_freq=1024, n_eval_episodes=1, verbose=0),
                run_dir=tmp_path / "run", log_interval_s=0, progress_bar=False)
    assert np.allclose(eval_env.obs_rms.mean, train_env.obs_rms.mean) and not np.allclose(eval_env.obs_rms.mean, 0)
    with open(tmp_path / "run" / "metrics.csv") as f:
        logged = [float(row["episode_return"]) for row in csv.DictReader(f) if row["episode_return"]]
    monitored = [r for env in train_env.venv.envs for r in env.get_episode_rewards()]
    assert logged and min(logged) >= min(monitored) - 1e-3 and max(logged) <= max(monitored) + 1e-3
    assert min(logged) < -100  # (Pendulum's own scale; normalised returns are a few units)
    plain = make_vec_env("Pendulum-v1", n_envs=1, seed=1)  # (SB3 asserts at the first evaluation)
    with pytest.raises(rlspeed.UserError, match=r"eval_env needs VecNormalize too"):
        model.learn(256, callback=EvalCallback(plain, eval_freq=128, n_eval_episodes=1), progress_bar=False)
    scored = VecNormalize(make_vec_env("Pendulum-v1", n_envs=2, seed=2))  # norm_reward=True, as saved runs load
    result = rlspeed.evaluate(model, scored, episodes=2)
    assert np.allclose(sorted(result["returns"]), sorted(r for env in scored.venv.envs
                                                          for r in env.get_episode_rewards()), atol=1e-3)


def test_sb3_vec_normalize_statistics_are_checkpointed_and_an_env_from_the_id_is_refused(tmp_path):
    """A model training on a VecNormalize: CheckpointCallback(save_vecnormalize=True) writes its statistics beside
    each model as Stable-Baselines3 does (it wrote nothing); evaluating on an env made from the id (raw observations
    for a policy trained on normalised ones) is refused, by evaluate, learn's evaluations and EvalCallback alike."""
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    from rlspeed.callbacks import CheckpointCallback, EvalCallback

    train_env = VecNormalize(make_vec_env("Pendulum-v1", n_envs=2, seed=0))
    model = rlspeed.PPO(train_env, device="cpu", num_steps=64, batch_size=64, seed=0)
    checkpoints = CheckpointCallback(128, tmp_path, save_vecnormalize=True)
    model.learn(128, callback=checkpoints, progress_bar=False)
    statistics = tmp_path / "rl_model_vecnormalize_128_steps.pkl"
    assert statistics in checkpoints.saved
    loaded = VecNormalize.load(str(statistics), make_vec_env("Pendulum-v1", n_envs=1))
    assert np.allclose(loaded.obs_rms.mean, train_env.obs_rms.mean) and not np.allclose(loaded.obs_rms.mean, 0)
    refused = "trains on a Stable-Baselines3 VecNormalize that normalises its observations"
    with pytest.raises(rlspeed.UserError, match=refused):
        rlspeed.evaluate(model, "Pendulum-v1", episodes=2)
    with pytest.raises(rlspeed.UserError, match=refused):
        model.learn(128, callback=EvalCallback("Pendulum-v1", eval_freq=64, n_eval_episodes=1), progress_bar=False)
    assert model.num_timesteps == 128


def test_an_evaluation_env_that_normalises_its_observations_is_refused():
    """The model normalises observations with its own frozen statistics: an evaluation env made with
    normalize_obs=True (what "built as the training env was" suggested) normalised them a second time, with fresh
    statistics that the evaluation itself updated."""
    from rlspeed.callbacks import EvalCallback

    model = rlspeed.PPO("Pendulum-v1", device="cpu", num_steps=64, batch_size=64, seed=0, normalize_obs=True)
    model.learn(128, progress_bar=False)
    trained = model.num_timesteps
    env = rlspeed.make_env("Pendulum-v1", num_envs=2, normalize_obs=True)
    with pytest.raises(rlspeed.UserError, match=r"normalises its observations itself .* evaluate on an env made "
                                                r"without normalize_obs"):
        rlspeed.evaluate(model, env, episodes=2)
    with pytest.raises(rlspeed.UserError, match="normalises its observations itself"):
        model.learn(128, callback=EvalCallback(env, eval_freq=64, n_eval_episodes=2), progress_bar=False)
    assert model.num_timesteps == trained
    plain = rlspeed.make_env("Pendulum-v1", num_envs=2)
    assert rlspeed.evaluate(model, plain, episodes=2, seed=3)["mean"] == model.evaluate(episodes=2, seed=3)["mean"]


class _ScalarStepObs(gym.Env):
    """A float (4,) observation space whose step() returns a scalar (a typo an env author makes)."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        return np.zeros(4, np.float32), {}

    def step(self, action):
        return np.float32(1.0), 0.0, False, False, {}


def test_an_observation_of_another_shape_than_its_space_is_refused_not_broadcast():
    """An observation of another shape than the space's (a scalar, a shorter array) is one sentence: numpy would
    broadcast it into the batch row (Gymnasium's own vector env refuses it too)."""
    same_step = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}
    env = rlspeed.make_env(gym.vector.SyncVectorEnv([_ScalarStepObs] * 2, **same_step))
    env.reset(seed=0)
    with pytest.raises(rlspeed.UserError, match=r"observation of shape \(\) where its observation_space declares "
                                                r"\(4,\)"):
        env.step(torch.zeros(2, dtype=torch.int64))


def test_a_vector_env_that_does_not_say_how_it_autoresets_is_refused():
    """A hand-written gymnasium.vector.VectorEnv without metadata['autoreset_mode'] (Gymnasium then assumes
    NEXT_STEP: a finished row's next step is a reset, not a transition) is refused, saying what to set."""

    class MyVector(gym.vector.VectorEnv):
        def __init__(self):
            self.num_envs = 2
            self.single_observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
            self.single_action_space = gym.spaces.Discrete(2)
            self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, 2)
            self.action_space = gym.vector.utils.batch_space(self.single_action_space, 2)

    with pytest.raises(rlspeed.UserError, match=r"does not say how it resets finished envs.*"
                                                r"metadata\['autoreset_mode'\]"):
        rlspeed.PPO(MyVector(), device="cpu")


def test_a_vector_env_without_gymnasium_1s_single_spaces_is_refused_in_one_sentence():
    """A gymnasium.vector.VectorEnv subclass with only the older `observation_space` (one env's), as SuperSuit's
    `pettingzoo_env_to_vec_env_v1` and `concat_vec_envs_v1(..., base_class="gymnasium")` are: the autoreset refusal
    told the user to set metadata['autoreset_mode'], after which the constructor raised AttributeError."""

    class OlderVector(gym.vector.VectorEnv):
        metadata = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}

        def __init__(self):
            self.num_envs = 2
            self.observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
            self.action_space = gym.spaces.Discrete(2)

    with pytest.raises(rlspeed.UserError, match=r"^This vector env \(OlderVector\) has no single_observation_space: it "
                                                r"is not a Gymnasium 1.x vector env"):
        rlspeed.PPO(OlderVector(), device="cpu", batch_size=64)
    del OlderVector.metadata
    with pytest.raises(rlspeed.UserError, match=r"has no single_observation_space"):  # (before the autoreset advice)
        rlspeed.PPO(OlderVector(), device="cpu", batch_size=64)


class _HandWrittenSameStep(gym.vector.VectorEnv):
    """A vector env of one's own with SAME_STEP autoreset: 2 envs, obs [episode, t], every episode truncated after
    3 steps. `final` says what its step info gives for finished rows: "with mask" (Gymnasium's `final_obs` and
    `_final_obs`), "no mask" (`final_obs` only) or "none"."""

    metadata = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}

    def __init__(self, final: str):
        self.num_envs, self.final = 2, final
        self.single_observation_space = gym.spaces.Box(-1e3, 1e3, (2,), np.float32)
        self.single_action_space = gym.spaces.Discrete(2)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, 2)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, 2)
        self.state = np.zeros((2, 2), np.float32)

    def reset(self, seed=None, options=None):
        self.state[:] = 0.0
        return self.state.copy(), {}

    def step(self, actions):
        self.state[:, 1] += 1
        final_obs, truncated = self.state.copy(), self.state[:, 1] >= 3
        self.state[truncated] = [[self.state[0, 0] + 1, 0.0]]
        info = {} if self.final == "none" else {"final_obs": final_obs}
        if self.final == "with mask":
            info["_final_obs"] = truncated
        return self.state.copy(), np.ones(2, np.float32), np.zeros(2, bool), truncated, info


@pytest.mark.parametrize("final", ["with mask", "no mask"])
def test_a_hand_written_same_step_vector_env_bootstraps_from_its_final_obs(final):
    """A truncated episode's final_obs is the env's own last observation (what a truncated row bootstraps from),
    whether the vector env marks the finished rows in info['_final_obs'] (Gymnasium's) or gives only
    info['final_obs'], as the refusal of a vector env without autoreset_mode tells one to: not the next episode's
    first observation (a wrong bootstrap state, with nothing said)."""
    env = rlspeed.make_env(_HandWrittenSameStep(final), device="cpu")
    env.reset(seed=0)
    actions = torch.zeros(2, dtype=torch.int64)
    env.step(actions)
    env.step(actions)
    obs, _, _, truncated, info = env.step(actions)
    assert truncated.all()
    assert info["final_obs"].tolist() == [[0.0, 3.0], [0.0, 3.0]]  # episode 0's third step
    assert obs.tolist() == [[1.0, 0.0], [1.0, 0.0]]  # episode 1's first observation


def test_a_same_step_vector_env_that_ends_an_episode_without_final_obs_is_refused():
    """A SAME_STEP vector env that ends an episode without info['final_obs'] is one sentence naming it: its
    returned observation is the next episode's first, which a truncated episode would otherwise bootstrap from."""
    env = rlspeed.make_env(_HandWrittenSameStep("none"), device="cpu")
    env.reset(seed=0)
    actions = torch.zeros(2, dtype=torch.int64)
    env.step(actions)
    env.step(actions)
    with pytest.raises(rlspeed.UserError, match=r"ended an episode without info\['final_obs'\]"):
        env.step(actions)


class _Counter(BatchedEnv):
    """A batched env of a user's own: obs [t, 1, 1, 1], episodes of 5 steps; `breaks` names a contract break."""

    backend = "mine"

    def __init__(self, breaks: str = ""):
        self.num_envs, self.device, self.breaks = 2, torch.device("cpu"), breaks
        self.spec = EnvSpec("my-counter", (4,), gym.spaces.Discrete(2), max_episode_steps=8, reward_threshold=None)
        self.t = torch.zeros(2, dtype=torch.int64)
        self.buffers, self.steps = [torch.ones(2, 4) for _ in range(5)], 0
        self.never = torch.zeros(2, dtype=torch.bool)  # (a constant tensor returned every step: no break)

    def _obs(self):
        obs = (self.buffers[0] if self.breaks == "alias"
               else self.buffers[self.steps % 2] if self.breaks == "two in turn"
               else self.buffers[self.steps % 4] if self.breaks == "four in turn" else torch.ones(2, 4))
        obs[:, 0] = self.t.float()
        return (obs.double() if self.breaks == "float64" else obs.requires_grad_() if self.breaks == "requires grad"
                else obs)

    def reset(self, seed=None):
        self.t.zero_()
        return self._obs(), {}

    def step(self, actions):
        self.t += 1
        self.steps += 1
        final = self.buffers[1].copy_(self._obs()) if self.breaks == "final_obs in place" else self._obs().clone()
        terminated = self.t >= 5
        self.t[terminated] = 0
        reward = torch.ones(2, 1) if self.breaks == "reward [N,1]" else torch.ones(2)
        flags = terminated.float() if self.breaks == "float flags" else terminated
        info = {} if self.breaks == "no final_obs" else {"final_obs": final}
        return self._obs(), reward, flags, (torch.zeros_like(flags) if self.breaks else self.never), info


def test_a_batched_env_of_ones_own_trains_and_its_contract_breaks_are_named():
    """A model given a BatchedEnv of the user's own trains on it (the model adds the episode statistics), and each
    break of the contract on its first steps (a tensor written in place every step, shapes, dtypes, no final_obs) is
    one sentence naming it."""
    model = rlspeed.PPO(_Counter(), device="cpu", num_steps=16, batch_size=32, seed=0)
    model.learn(64, progress_bar=False)
    assert model.num_timesteps == 64
    as_text = _Counter()
    as_text.device = "cpu"  # (a device named as a string)
    result = rlspeed.evaluate(model, as_text, episodes=2)  # (evaluated as it trains: counted and checked)
    assert result["returns"] == [5.0, 5.0] and result["lengths"] == [5, 5]
    on_cpu0 = _Counter()
    on_cpu0.device = torch.device("cpu:0")  # (its tensors on "cpu": the same device)
    rlspeed.PPO(on_cpu0, device="cpu", num_steps=16, batch_size=32).learn(32, progress_bar=False)
    for breaks, message in [("alias", "wrote over observations it returned on an earlier step"),
                            # (DQN holds train_freq steps' tensors before storing them: these corrupted its replay)
                            ("two in turn", "wrote over observations it returned on an earlier step"),
                            ("final_obs in place", r"wrote over info\['final_obs'\] it returned on an earlier step"),
                            ("four in turn", "wrote over observations"),  # (DQN's train_freq 4 holds five steps')
                            ("reward [N,1]", r"rewards as torch.float32 \(2, 1\) on cpu, not torch.float32 \[2\]"),
                            ("float flags", "terminated as torch.float32"),
                            ("no final_obs", "no info\\['final_obs'\\]"),
                            ("float64", "as torch.float64, not torch.float32"),
                            # (an observation computed with autograd on: an error from inside the policy's kernels)
                            ("requires grad", "observations requiring grad: return them detached")]:
        with pytest.raises(rlspeed.UserError, match=f"_Counter \\(a batched env of your own\\) .*{message}"):
            rlspeed.DQN(_Counter(breaks), device="cpu", learning_starts=4, batch_size=4).learn(16, progress_bar=False)
    with pytest.raises(rlspeed.UserError, match="wrote over observations"):  # (n-step's window holds 5 steps')
        rlspeed.DQN(_Counter("four in turn"), device="cpu", learning_starts=4, batch_size=4, train_freq=1,
                    n_step=5).learn(16, progress_bar=False)


class _ClampsActions(_Counter):
    """_Counter writing into the actions it is given (as an env clamping them in place would), after noting them."""

    def __init__(self):
        super().__init__()
        self.given = []

    def step(self, actions):
        self.given.append(actions.clone())
        stepped = super().step(actions)
        actions.fill_(1)
        return stepped


@pytest.mark.parametrize("algo", ["PPO", "DQN"])
def test_an_env_writing_into_its_actions_leaves_the_stored_actions_as_taken(algo):
    """An env of the user's own that wrote into the action tensor it was given changed the actions the learner had
    stored for that step (PPO's rollout, DQN's replay: all 1 here), silently training on actions never taken. The env
    gets a copy: the stored actions are the ones it stepped with."""
    env = _ClampsActions()
    if algo == "PPO":
        model = rlspeed.PPO(env, device="cpu", num_steps=16, batch_size=32, seed=0)
        model.learn(32, progress_bar=False)
        stored = model.buffer.actions
    else:
        model = rlspeed.DQN(env, device="cpu", learning_starts=16, batch_size=4, train_freq=16, seed=0)
        model.learn(16, progress_bar=False)  # (one collection of 16 steps)
        stored = model.buffer.actions[:model.buffer.size]
    given = torch.stack(env.given).reshape(stored.shape)
    assert (given == 0).any() and torch.equal(stored, given)


class _WritesBack(_Counter):
    """_Counter returning fresh tensors, which from `write_at` steps on writes into the observation it returned on
    its first step (not returned again)."""

    def __init__(self, write_at: int | None = None):
        super().__init__()
        self.write_at, self.first = write_at, None

    def step(self, actions):
        stepped = super().step(actions)
        self.first = stepped[0] if self.first is None else self.first
        if self.write_at is not None and self.steps >= self.write_at:
            self.first[:, 1] = -1.0
        return stepped


def test_the_contract_check_of_a_long_collection_compares_each_held_tensor_a_few_times(monkeypatch):
    """The written-over check compared every tensor of every earlier step on each step of DQN's first collection
    (train_freq + n_step steps held): quadratic, 13 s at train_freq=1024 where the steps took 0.1 s. A tensor written
    over without being returned again is still found, within the collection."""
    import rlspeed.envs.base as base

    compared = []
    unchanged = base._unchanged
    monkeypatch.setattr(base, "_unchanged", lambda tensor, then: compared.append(1) or unchanged(tensor, then))
    steps = 256
    model = rlspeed.DQN(_WritesBack(), device="cpu", train_freq=steps, learning_starts=steps)
    model.learn(2 * steps, progress_bar=False)
    assert 0 < len(compared) < 20 * steps  # (every held tensor on every step: over 100,000 comparisons)
    with pytest.raises(rlspeed.UserError, match=r"_WritesBack \(a batched env of your own\) wrote over observations"):
        rlspeed.DQN(_WritesBack(write_at=100), device="cpu", train_freq=steps,
                    learning_starts=steps).learn(2 * steps, progress_bar=False)


class _Noisy(_Counter):
    """_Counter whose observations carry noise from its own generator, seeded by reset(seed) (else from entropy)."""

    def reset(self, seed=None):
        self.generator = torch.Generator().manual_seed(seed if seed is not None else int(np.random.SeedSequence()
                                                                                          .entropy) % 2**63)
        return super().reset(seed)

    def _obs(self):
        return super()._obs() + torch.randn(2, 4, generator=self.generator)


def test_a_models_seed_seeds_an_env_passed_in():
    """PPO(env, seed=0) left a batched env of the user's own and a Gymnasium vector env unseeded (two runs differed)
    while docs/algorithms.md says seed= seeds the envs; make_env's own seed is kept."""
    def weights(make_env):
        model = rlspeed.PPO(make_env(), device="cpu", num_steps=16, batch_size=32, seed=0)
        return torch.cat([p.detach().flatten() for p in model.learn(64, progress_bar=False).policy.parameters()])

    def cartpoles():
        return gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2,
                                        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)

    for make in (_Noisy, cartpoles):
        assert torch.equal(weights(make), weights(make))
    holder = _Counter()
    holder.env = "a variant"  # (an attribute of the user's own named `env`: not a wrapper to look inside)
    rlspeed.PPO(holder, device="cpu", num_steps=16, batch_size=32, seed=0).learn(32, progress_bar=False)
    own_seed = rlspeed.make_env("CartPole-v1", num_envs=2, seed=7)
    rlspeed.PPO(own_seed, device="cpu", num_steps=16, batch_size=32, seed=0)
    assert own_seed._pending_seed == 7


def test_evaluating_a_model_of_an_env_of_ones_own_without_it_says_to_pass_it():
    """model.evaluate() of a model trained on a batched env of the user's own pointed to --env-backend gymnasium,
    which then said "Unknown env id"; learn(eval_freq=...) failed only after its first rollout."""
    model = rlspeed.PPO(_Counter(), device="cpu", num_steps=16, batch_size=32)
    with pytest.raises(rlspeed.UserError, match=r"trained on 'my-counter'.*"
                                                r"rlspeed.evaluate\(model, env"):
        model.evaluate(episodes=2)
    with pytest.raises(rlspeed.UserError, match=r"learn\(eval_freq=...\) evaluates on fresh envs.*EvalCallback"):
        model.learn(64, eval_freq=32, progress_bar=False)
    assert model.num_timesteps == 0
    assert rlspeed.evaluate(model, _Counter(), episodes=2)["lengths"] == [5, 5]


def test_an_env_of_ones_own_under_a_registered_id_is_warned_about():
    """A CartPole variant of the user's own named "CartPole-v1" was evaluated (and loaded) as the stock CartPole-v1
    without a word: evaluate() and targets make envs from the id."""
    borrowed = _Counter()
    borrowed.spec = EnvSpec("CartPole-v1", (4,), gym.spaces.Discrete(2), max_episode_steps=8, reward_threshold=None)
    with pytest.warns(UserWarning, match="names itself 'CartPole-v1', a registered env"):
        rlspeed.PPO(borrowed, device="cpu", num_steps=16, batch_size=32)
    import warnings

    from rlspeed.envs import GymnasiumEnv

    with warnings.catch_warnings():  # (rlspeed's own adapter made directly is the stock env: no word)
        warnings.simplefilter("error")
        rlspeed.PPO(GymnasiumEnv("CartPole-v1", num_envs=2), device="cpu", num_steps=16, batch_size=32)


def test_async_envs_from_a_script_without_the_main_guard_under_spawn_say_so(tmp_path):
    """Under the spawn start method (macOS's and Windows' default) a script without `if __name__ == "__main__":`
    that trains on gymnasium-async envs ended in 'The env CartPole-v1 raised ConnectionResetError in make()',
    blaming the env; Python's own advice was cut to its first line in each child."""
    done = _spawned_script(tmp_path, "from rlspeed import PPO\n"
                                     "PPO('CartPole-v1', env_backend='gymnasium-async', num_envs=2, num_steps=16)"
                                     ".learn(32, progress_bar=False)\n")
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode != 0 and last.startswith("rlspeed.errors.UserError: The env subprocesses of backend "
                                                    "'gymnasium-async' could not start"), done.stderr[-2000:]
    assert 'under `if __name__ == "__main__":`' in last


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs the fork start method")
def test_async_envs_in_a_multiprocessing_pool_worker_say_why_they_cannot_start(tmp_path):
    """A seed sweep with multiprocessing.Pool whose workers train on gymnasium-async envs ended each in 'The env
    CartPole-v1 (gymnasium-async backend) raised AssertionError in make(): daemonic processes are not allowed to have
    children', blaming the env: a Pool's workers may start no processes. (Forked from a fresh Python: the test
    suite's own process may hold OpenMP threads of earlier tests, which a forked child hangs on.)"""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import multiprocessing
        import rlspeed

        def worker():
            try:
                rlspeed.PPO("CartPole-v1", env_backend="gymnasium-async", num_envs=2, num_steps=16,
                            batch_size=32).learn(32, progress_bar=False)
            except Exception as error:  # (what the sweep's worker would see, sent back as text)
                return f"{type(error).__name__}: {error}"
            return "trained"

        with multiprocessing.get_context("fork").Pool(1) as pool:
            print(pool.apply_async(worker).get(timeout=120))
        """)
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    said = done.stdout.strip()
    assert done.returncode == 0, done.stderr[-2000:]
    assert said.startswith("UserError: The env subprocesses of backend 'gymnasium-async' cannot start in a daemonic "
                           "process"), said
    assert "env_backend='gymnasium'" in said and "ProcessPoolExecutor" in said


def _spawned_script(tmp_path, code: str):
    """`code` run as a script whose Python starts subprocesses with `spawn` (as on macOS and Windows)."""
    import os
    import subprocess

    (tmp_path / "sc").mkdir()
    (tmp_path / "sc" / "sitecustomize.py").write_text(
        "import multiprocessing\nmultiprocessing.set_start_method('spawn', force=True)\n")
    (tmp_path / "script.py").write_text(code)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path / 'sc'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "RLSPEED_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "script.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)


def test_env_options_that_cannot_reach_spawned_subprocesses_say_so(tmp_path):
    """An option that does not pickle (a lock, an open file) for gymnasium-async envs under spawn was 'Env ...
    rejected the options log: cannot pickle ...' (the env rejected nothing) or an EnvStepError blaming the env."""
    done = _spawned_script(tmp_path, """import threading
import gymnasium as gym
from gymnasium.envs.classic_control import CartPoleEnv
from rlspeed import PPO


class LogCartPole(CartPoleEnv):
    def __init__(self, log=None, **kwargs):
        super().__init__(**kwargs)


gym.register("LogCartPole-v0", entry_point=LogCartPole, max_episode_steps=500)
if __name__ == "__main__":
    PPO("LogCartPole-v0", env_backend="gymnasium-async", num_envs=2, num_steps=16,
        env_kwargs={"log": threading.Lock()}).learn(32, progress_bar=False)
""")
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode != 0 and last.startswith("rlspeed.errors.UserError: The env options log cannot be sent "
                                                    "to the env subprocesses"), done.stderr[-2000:]


def test_learn_goes_on_after_an_interrupt_left_subprocess_envs_waiting(monkeypatch):
    """Jupyter's stop button during `learn` on gymnasium-async envs, between a step's send and its answer: the next
    `learn` failed with "raised AlreadyPendingCallError in reset()" (the vector env still waited for the step)."""
    from rlspeed import PPO
    from rlspeed.envs.gymnasium_env import GymnasiumEnv

    model = PPO("CartPole-v1", seed=0, device="cpu", env_backend="gymnasium-async", num_envs=2, num_steps=16)
    receive, calls = GymnasiumEnv.step_receive, {"n": 0}

    def interrupted_once(self):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt  # (the step was sent; its answer is not read)
        return receive(self)

    monkeypatch.setattr(GymnasiumEnv, "step_receive", interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        model.learn(64, progress_bar=False)
    model.learn(64, progress_bar=False)
    assert model.num_timesteps >= 64


class _InterruptedPipe:
    """A worker's pipe (of an AsyncVectorEnv) whose next `method` call raises KeyboardInterrupt, as Jupyter's stop
    button does when it lands there: the workers before it were sent to (or read from), the rest not."""

    def __init__(self, pipe, method: str):
        self._pipe, self._method, self.fired = pipe, method, False

    def __getattr__(self, name: str):
        attribute = getattr(self._pipe, name)
        if name != self._method or self.fired:
            return attribute

        def interrupted(*args, **kwargs):
            self.fired = True
            raise KeyboardInterrupt
        return interrupted


def _async_model(num_steps: int = 16):
    from rlspeed import PPO

    model = PPO("CartPole-v1", seed=0, device="cpu", env_backend="gymnasium-async", num_envs=2, num_steps=num_steps,
                batch_size=32)
    model.learn(32, progress_bar=False)
    return model, model._env.unwrapped.vector_env.unwrapped


@pytest.mark.parametrize("method", ["send", "recv"])
def test_learn_goes_on_after_an_interrupt_left_subprocess_pipes_out_of_step(method):
    """A KeyboardInterrupt between one worker's pipe and the next (step_async sent worker 0 its action, not worker 1;
    or step_wait read worker 0's answer, not worker 1's): every further learn failed (stale answers, "too many values
    to unpack", a 10 s wait then "make the model's envs again") until model.close(). The envs are made again."""
    model, vector_env = _async_model()
    pipe = vector_env.parent_pipes[1] = _InterruptedPipe(vector_env.parent_pipes[1], method)
    with pytest.raises(KeyboardInterrupt):
        model.learn(64, progress_bar=False)
    assert pipe.fired
    before = model.num_timesteps
    model.learn(64, progress_bar=False)
    model.learn(64, progress_bar=False)
    assert model.num_timesteps >= before + 128
    assert model._env.unwrapped.vector_env.unwrapped is not vector_env and vector_env.closed
    model.close()


def test_learn_goes_on_after_a_signal_stopped_a_subprocess_worker():
    """SIGINT to the process group (Jupyter's stop button) stops the idle workers too: each reports the
    KeyboardInterrupt and exits, and the next learn failed with it ("re-raised from a worker"), then with
    'NoneType' object has no attribute 'send'."""
    import os
    import signal

    model, vector_env = _async_model()
    worker = vector_env.processes[1]
    os.kill(worker.pid, signal.SIGINT)
    worker.join(60)
    assert not worker.is_alive()
    before = model.num_timesteps
    model.learn(64, progress_bar=False)
    model.learn(64, progress_bar=False)
    assert model.num_timesteps >= before + 128
    model.close()


def test_an_interrupted_learn_makes_subprocess_envs_again(monkeypatch):
    """A KeyboardInterrupt that leaves learn may have reached the workers too and not yet stopped them (they report
    it a moment later, mid-way through the next learn): the next learn makes the envs again, whatever they look
    like; a model given the envs cannot, and says so."""
    from rlspeed import PPO

    model, vector_env = _async_model()
    update = PPO._update_rollout

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(PPO, "_update_rollout", interrupted)
    with pytest.raises(KeyboardInterrupt):
        model.learn(64, progress_bar=False)
    monkeypatch.setattr(PPO, "_update_rollout", update)
    assert not vector_env.closed
    before = model.num_timesteps
    model.learn(64, progress_bar=False)
    assert model.num_timesteps >= before + 64 and vector_env.closed
    model.learn(64, progress_bar=False)  # (a learn that ended normally keeps its envs)
    assert model._env.unwrapped.vector_env.unwrapped is not vector_env and not model._env.unwrapped.vector_env.closed
    kept = model._env
    model.learn(32, progress_bar=False)
    assert model._env is kept
    model.close()

    given = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="async",
                         vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
    model = PPO(given, seed=0, device="cpu", num_steps=16, batch_size=32)
    model.learn(32, progress_bar=False)
    monkeypatch.setattr(PPO, "_update_rollout", interrupted)
    with pytest.raises(KeyboardInterrupt):
        model.learn(64, progress_bar=False)
    monkeypatch.setattr(PPO, "_update_rollout", update)
    with pytest.raises(rlspeed.UserError, match="which was passed in, cannot go on"):
        model.learn(64, progress_bar=False)
    assert given.closed


class _ContractBreakingEnv(gym.Env):
    """A user's env (registered with disable_env_checker=True, past Gymnasium's checker) that breaks Gymnasium's
    contract in one way, `fault`; episodes of 3 steps."""

    observation_space = gym.spaces.Box(-1, 1, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, fault: str = ""):
        self.fault, self.t = fault, 0

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        if self.fault == "action_space_in_reset":  # (spaces set up again in reset, differently)
            self.action_space = gym.spaces.Discrete(3)
        obs = np.zeros(5 if self.fault == "reset_shape" else 4, np.float32)
        if self.fault == "reset_text":
            obs = np.array(["a", "b", "c", "d"])
        if self.fault == "reset_info_none":
            return obs, None
        return obs if self.fault == "reset_obs_only" else (obs, {})

    def step(self, action):
        self.t += 1
        if self.fault == "raises" and self.t == 2:
            raise ValueError("setting an array element with a sequence (the env's own)")
        obs, done = np.zeros(3 if self.fault == "obs_shape" else 4, np.float32), self.t >= 3
        reward = {"reward_shape": np.array([1.0]), "reward_str": "1.0x", "reward_number_str": "1.0",
                  "reward_none": None}.get(self.fault, 1.0)
        if self.t == 2 and self.fault.startswith("later_reward_"):  # (the first step's is 1.0)
            reward = {"later_reward_none": None, "later_reward_number_str": "1.0"}.get(self.fault, np.array("1.0"))
        terminated = {"terminated_array": np.array([done, done]), "terminated_str": str(done)}.get(self.fault, done)
        truncated = None if self.fault == "truncated_none" else False
        if self.fault == "obs_text":
            obs = np.array(["a", "b", "c", "d"])
        info = None if self.fault == "info_none" else {}
        return (obs, reward, done, info) if self.fault == "four" else (obs, reward, terminated, truncated, info)


gym.register("ContractBreaking-v0", entry_point=_ContractBreakingEnv, disable_env_checker=True, max_episode_steps=50)


_BREACHES = [
    ("reward_shape", "'ContractBreaking-v0'.step() returned a reward of shape (1,): a reward is one number per step"),
    ("reward_str", "'ContractBreaking-v0'.step() returned reward='1.0x' (str): a reward is one number per step"),
    ("terminated_array", "'ContractBreaking-v0'.step() returned terminated of shape (2,): terminated and truncated "
                         "are one bool each"),
    ("info_none", "'ContractBreaking-v0'.step() returned an info of type NoneType: info is a dict"),
    ("reset_info_none", "'ContractBreaking-v0'.reset() returned an info of type NoneType: info is a dict"),
    # (one process: "An env returned ...", from the check of each observation as it is stored)
    ("obs_shape", "returned an observation of shape (3,) where its observation_space declares (4,)"),
    ("obs_text", "'ContractBreaking-v0'.step() returned an observation of dtype <U1 where its observation_space "
                 "declares numbers"),
    ("reset_text", "'ContractBreaking-v0'.reset() returned an observation of dtype <U1 where its observation_space "
                   "declares numbers"),
    ("reset_obs_only", "'ContractBreaking-v0'.reset() returned a ndarray of shape (4,): Gymnasium's reset returns "
                       "(obs, info)"),
    ("four", "'ContractBreaking-v0'.step() returned 4 values: Gymnasium's step returns (obs, reward, terminated, "
             "truncated, info), and (obs, reward, done, info) is the old gym API's step; Shimmy's"),
    ("reset_shape", "'ContractBreaking-v0'.reset() returned an observation of shape (5,) where its observation_space "
                    "declares (4,)"),
]


def _numpy_stores_one_element_arrays_as_numbers() -> bool:
    """Whether numpy writes a one-element array into an element of another (numpy before 2.4 does, with a
    DeprecationWarning from 1.25 on; 2.4 raises "setting an array element with a sequence")."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            np.zeros(1)[0] = np.ones(1)
        except (ValueError, TypeError):
            return False
    return True


def _children_before() -> set:
    """multiprocessing's children alive as a test starts, once the collector has run: a model of an earlier test that
    only the collector frees (held by a reference cycle: a learn call's callbacks and their `locals`, the frames a
    first import keeps) ends its subprocess envs' workers when collected. A test's own workers are the children not
    among these."""
    gc.collect()
    return set(multiprocessing.active_children())


def _children_since(before: set) -> list:
    return [child for child in multiprocessing.active_children() if child not in before]


@pytest.mark.parametrize("fault, message", _BREACHES)
def test_an_env_breaking_gymnasiums_contract_is_told_what_it_returned(fault, message):
    """What an env of the user's own returns against Gymnasium's contract failed where rlspeed (or Gymnasium's
    TimeLimit, SyncVectorEnv) stores it: "The env 'X' raised ValueError in step(): setting an array element with a
    sequence" (EnvStepError, exit 1), naming neither the field nor what is expected. One sentence now (UserError)."""
    from rlspeed import PPO

    if fault == "reward_shape" and _numpy_stores_one_element_arrays_as_numbers():
        pytest.skip("numpy before 2.4 stores a reward of shape (1,) as its number: nothing fails, and the run trains "
                    "on the reward the env meant")
    model = PPO("ContractBreaking-v0", seed=0, device="cpu", env_backend="gymnasium", num_envs=2, num_steps=8,
                batch_size=16, env_kwargs={"fault": fault})
    with pytest.raises(rlspeed.UserError) as raised:
        model.learn(16, progress_bar=False)
    assert message in str(raised.value), str(raised.value)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("fault, message", [
    ("terminated_str", "'ContractBreaking-v0'.step() returned terminated='False' (str): terminated and truncated are "
                       "one bool each per step (True or False), and a string or None would be taken as its truth"),
    ("truncated_none", "'ContractBreaking-v0'.step() returned truncated=None (NoneType): terminated and truncated "
                       "are one bool each"),
    ("reward_number_str", "'ContractBreaking-v0'.step() returned reward='1.0' (str): a reward is one number per step"),
    ("reward_none", "'ContractBreaking-v0'.step() returned reward=None (NoneType): a reward is one number per step")])
@pytest.mark.parametrize("backend", ["gymnasium", "gymnasium-async"])
def test_flags_that_are_no_bools_are_refused_at_the_first_step(fault, message, backend):
    """A `terminated` of "False" (a string) was stored as True: every episode ended after one step and training went
    on without a word (Gymnasium's checker only warns); None was stored as False. A reward of "1.0" trained as 1.0,
    contrary to the docs, and a reward of None was stored as NaN, which the NaN guard refused as "a NaN or infinite
    observation or reward", leaving the user to look for a NaN the env never returned. One sentence now, at the first
    step, with subprocess envs too (where Gymnasium stacks them into arrays before rlspeed sees them)."""
    from rlspeed import PPO

    model = PPO("ContractBreaking-v0", seed=0, device="cpu", env_backend=backend, num_envs=2, num_steps=8,
                batch_size=16, env_kwargs={"fault": fault})
    try:
        with pytest.raises(rlspeed.UserError) as raised:
            model.learn(16, progress_bar=False)
    finally:
        model.close()
    assert message in str(raised.value), str(raised.value)
    assert "\n" not in str(raised.value)
    assert model.num_timesteps == 0


@pytest.mark.parametrize("fault, said", [("later_reward_none", "reward=None (NoneType)"),
                                         ("later_reward_number_str", "reward='1.0' (str)"),
                                         ("later_reward_text_array", "reward=array('1.0', dtype='<U3') (ndarray)")])
@pytest.mark.parametrize("backend", ["gymnasium", "gymnasium-async"])
def test_a_reward_that_is_no_number_after_the_first_step_is_named(fault, said, backend):
    """A reward of None at an env's second step was stored as NaN (in one process as in the parent of subprocess envs,
    where Gymnasium stacks rewards as float64), and the NaN guard stopped without naming the reward; "1.0" trained as
    1.0 without a word, and so did np.array("1.0") (a 0-d array of text, refused at the first step only). Every step's
    reward is checked now: one sentence naming the env, step() and the reward."""
    _refused_in_learn("ContractBreaking-v0", backend, {"fault": fault},
                      re.escape(f"'ContractBreaking-v0'.step() returned {said}: a reward is one number per step"))


class _DiscreteOut(gym.Env):
    """Discrete(4) observations, episodes of 2 steps, that break the space one way (`fault`): "step", 4 at the first
    step; "reset", 4 from the second reset on; "last_step_array", the last step's as a one-element array."""

    observation_space = gym.spaces.Discrete(4)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, fault: str):
        self.fault, self.resets, self.t = fault, 0, 0

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.resets, self.t = self.resets + 1, 0
        return (4 if self.fault == "reset" and self.resets > 1 else 0), {}

    def step(self, action):
        self.t += 1
        obs = {"step": 4, "last_step_array": np.array([1]) if self.t == 2 else 1}.get(self.fault, 1)
        return obs, 1.0, self.t >= 2, False, {}


gym.register("DiscreteOut-v0", entry_point=_DiscreteOut, disable_env_checker=True)


@pytest.mark.parametrize("fault, said", [
    ("step", "step() returned the observation value 4 outside its observation space Discrete(4)"),
    ("reset", "reset() returned the observation value 4 outside its observation space Discrete(4)"),
    ("last_step_array", "step() returned an observation of shape (1,) where its observation_space declares ()")])
def test_a_subprocess_envs_refused_observation_names_the_method(fault, said):
    """With gymnasium-async, an observation refused after the first reset (a Discrete value outside its space, a
    value of another shape as an episode's last) said "'X' returned ...", without the method that returned it (the
    in-process backend names it). Now step() or reset(): a finished env's observation is its reset's."""
    _refused_in_learn("DiscreteOut-v0", "gymnasium-async", {"fault": fault}, re.escape(f"'DiscreteOut-v0'.{said}"))


class _SharedBuffer(gym.Env):
    """MultiDiscrete([3]) observations written into one array that all instances share (a class attribute): the first
    env made ends its episodes at each step, the others return the value 5, outside the space, from step()."""

    observation_space = gym.spaces.MultiDiscrete([3])
    action_space = gym.spaces.Discrete(2)
    buffer = np.zeros(1, np.int64)
    made = 0

    def __init__(self):
        self.index, _SharedBuffer.made = _SharedBuffer.made, _SharedBuffer.made + 1

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.buffer[:] = 0
        return self.buffer, {}

    def step(self, action):
        self.buffer[:] = 1 if self.index == 0 else 5
        return self.buffer, 0.0, self.index == 0, False, {}


gym.register("SharedBuffer-v0", entry_point=_SharedBuffer, disable_env_checker=True)


def test_a_refused_observation_in_an_array_shared_with_a_reset_is_named_step():
    """An observation refused from step() was named reset() where it was the very array an earlier env's reset (in
    the same step of the batch) had returned: envs writing into one shared buffer. The call that returned it is
    named now, whatever object it is."""
    _SharedBuffer.made = 0
    env = rlspeed.make_env("SharedBuffer-v0", num_envs=2, device="cpu", backend="gymnasium")
    try:
        env.reset(seed=0)
        with pytest.raises(rlspeed.UserError, match=r"\.step\(\) returned the observation value 5 outside"):
            env.step(torch.zeros(2, dtype=torch.long))
    finally:
        env.close()


@pytest.mark.parametrize("vec_env, fault, said", [
    ("DummyVecEnv", "reward_none", "of env 1 returned reward=None (NoneType)"),
    ("DummyVecEnv", "reward_number_str", "of env 1 returned reward='1.0' (str)"),
    ("SubprocVecEnv", "reward_none", "of env 1 returned reward=None (NoneType)"),
    ("SubprocVecEnv", "reward_number_str", "of env 1 returned reward='1.0' (str)")])
def test_a_stable_baselines3_vec_envs_reward_that_is_no_number_is_one_sentence(vec_env, fault, said):
    """A user's DummyVecEnv or SubprocVecEnv whose env returned a reward of None was stored as NaN by SB3 and the NaN
    guard stopped without naming the reward; "1.0" trained as 1.0. The first step's rewards are checked now, as the
    Gymnasium backends check them: one sentence naming step(), the env's index in the VecEnv and the reward (a
    SubprocVecEnv's "1.0" too, which SB3 stacks with the other envs' numbers into text, every row's alike)."""
    sb3 = pytest.importorskip("stable_baselines3.common.vec_env")
    makers = [functools.partial(_ContractBreakingEnv), functools.partial(_ContractBreakingEnv, fault)]
    envs = (sb3.DummyVecEnv(makers) if vec_env == "DummyVecEnv"
            else sb3.SubprocVecEnv(makers, start_method="fork" if "fork" in multiprocessing.get_all_start_methods()
                                   else None))
    try:
        model = rlspeed.PPO(envs, device="cpu", seed=0, num_steps=8, batch_size=16)
        with pytest.raises(rlspeed.UserError,
                           match=re.escape(f"'user-sb3-vec-env'.step() {said}: a reward")):
            model.learn(16, progress_bar=False)
    finally:
        envs.close()


def test_a_stable_baselines3_vec_envs_reward_of_none_after_the_first_step_says_what_the_nan_may_be():
    """A DummyVecEnv stores its envs' rewards as float32 before rlspeed sees them: a reward of None after the first
    step (which is checked) arrives as NaN, and the NaN guard said only "returned a NaN or infinite observation or
    reward", sending the user to look for a NaN the env never returned. Its refusal now says that the VecEnv stores a
    reward of None as NaN."""
    sb3 = pytest.importorskip("stable_baselines3.common.vec_env")
    envs = sb3.DummyVecEnv([functools.partial(_ContractBreakingEnv, "later_reward_none")] * 2)
    try:
        model = rlspeed.PPO(envs, device="cpu", seed=0, num_steps=8, batch_size=16)
        with pytest.raises(rlspeed.UserError, match=r"in env 0 at its step \d+ .*\(a reward was NaN: a "
                           r"Stable-Baselines3 VecEnv stores an env's reward of None as NaN"):
            model.learn(16, progress_bar=False)
    finally:
        envs.close()


@pytest.mark.parametrize("reward, terminated, said", [
    (np.array("1.0"), False, r"returned reward=array\('1\.0', dtype='<U3'\) \(ndarray\): a reward is one number"),
    (1.0, np.array("False"), r"returned terminated=array\('False', dtype='<U5'\) \(ndarray\): terminated and "),
    *((number, flag, None) for number, flag in (
        (np.float32(1.5), np.bool_(True)), (np.int64(2), 0), (np.bool_(True), 1), (np.array(1.5), np.array(False)),
        (True, False)))])
def test_a_step_value_given_as_a_0d_array_of_text_is_refused_and_numbers_are_taken(reward, terminated, said):
    """A reward of np.array("1.0") (a 0-d array of text) trained as 1.0 and a terminated of np.array("False") ended
    every episode (numpy reads any non-empty string as True), where a str of the same text was refused. Refused alike
    now; numpy scalars, 0-d number arrays and bools are still taken as the numbers and flags they are."""
    from rlspeed.envs.gymnasium_env import step_values_problem

    problem = step_values_problem("'X'.step()", reward, terminated, False)
    if said is None:
        assert problem is None
    else:
        assert problem is not None and re.search(said, problem), problem


@pytest.mark.parametrize("reward, said", [(None, "reward=None (NoneType)"), (np.array([1.0]), "a reward of shape (1,)"),
                                          ({"r": 1.0}, "a reward of type dict")])
def test_every_refusal_of_a_reward_states_one_rule(reward, said):
    """The contract check (what an env returned, looked at where storing it failed) had its own wording of the reward
    rule ("a reward is one number per step." for a reward float() refuses) beside the step checks' ("... (a float)."):
    one rule, said alike by the step checks and the contract check."""
    from rlspeed.envs.gymnasium_env import contract_problem, step_values_problem

    rule = "a reward is one number per step (a float)"
    for problem in (contract_problem("X", "step", (np.zeros(2), reward, False, False, {}), None),
                    step_values_problem("'X'.step()", reward, False, False)):
        assert problem is not None and problem.startswith(f"'X'.step() returned {said}: {rule}"), problem


def _refused_in_learn(env_id: str, backend: str, env_kwargs: dict, match: str) -> None:
    """A small PPO on `env_id` (made with `env_kwargs`) whose learn raises a UserError matching `match`."""
    from rlspeed import PPO

    model = PPO(env_id, seed=0, device="cpu", env_backend=backend, num_envs=2, num_steps=8, batch_size=16,
                env_kwargs=env_kwargs)
    try:
        with pytest.raises(rlspeed.UserError, match=match):
            model.learn(16, progress_bar=False)
    finally:
        model.close()


class _MissingKey(gym.Env):
    """A Dict observation space of keys "a" and "b" whose observations lack "b" (from the first step: `at_step`)."""

    observation_space = gym.spaces.Dict({"a": gym.spaces.Box(-1, 1, (2,), np.float32),
                                         "b": gym.spaces.Box(-1, 1, (2,), np.float32)})
    action_space = gym.spaces.Discrete(2)

    def __init__(self, at_step: bool = False):
        self.at_step = at_step

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample() if self.at_step else {"a": np.zeros(2, np.float32)}, {}

    def step(self, action):
        return {"a": np.zeros(2, np.float32)}, 0.0, False, False, {}


gym.register("MissingKey-v0", entry_point=_MissingKey, disable_env_checker=True, max_episode_steps=5)


@pytest.mark.parametrize("backend", ["gymnasium", "gymnasium-async"])
@pytest.mark.parametrize("at_step", [False, True])
def test_a_dict_observation_without_a_key_of_its_space_is_one_sentence(backend, at_step):
    """A Dict observation lacking a key of its space failed in Gymnasium's batching (or rlspeed's) as the env's own
    error, "The env 'X' raised KeyError in reset(): 'b'" (EnvStepError, exit 1). One sentence naming the key now."""
    call = "step" if at_step else "reset"
    _refused_in_learn("MissingKey-v0", backend, {"at_step": at_step},
                      rf"'MissingKey-v0'\.{call}\(\) returned an observation without the key 'b' its observation_space "
                      r"declares \(its keys: 'a'\)")


@pytest.mark.parametrize("backend", ["gymnasium", "gymnasium-async"])
def test_an_action_space_changed_in_reset_is_one_sentence(backend):
    """An env that set its action_space again in reset (Discrete(3) after the constructor's Discrete(2)) trained on
    without a word: the model read the space as the env was made, so the third action was never taken (a Box of another
    shape would get actions of the old one). Now its first reset is refused in one sentence naming the space; in
    subprocess envs too (the parent reads the spaces of an env of its own, never reset)."""
    _refused_in_learn("ContractBreaking-v0", backend, {"fault": "action_space_in_reset"},
                      r"'ContractBreaking-v0'\.reset\(\) changed its action_space from Discrete\(2\) to Discrete\(3\): "
                      "rlspeed reads an env's spaces once")


class _SeedDropping(gym.Env):
    """Draws its first observation from self.np_random; `passes`: whether reset passes its seed to super().reset
    ("own": it keeps a generator of its own, seeded with it)."""

    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, passes: str = "no"):
        self.passes = passes

    def reset(self, seed=None, options=None):
        super().reset(seed=seed if self.passes == "yes" else None)
        if self.passes == "own":
            self.rng = np.random.default_rng(seed)
        rng = self.rng if self.passes == "own" else self.np_random
        return rng.uniform(-1, 1, 2).astype(np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, False, {}


gym.register("SeedDropping-v0", entry_point=_SeedDropping, disable_env_checker=True, max_episode_steps=5)


@pytest.mark.parametrize("passes, backend", [("no", "gymnasium"), ("yes", "gymnasium"), ("own", "gymnasium"),
                                            ("no", "sb3"), ("yes", "sb3"), ("no", "gymnasium-async")])
def test_a_reset_that_drops_its_seed_is_warned_of(passes, backend):
    """An env whose reset called super().reset() without the seed drew from an np_random seeded anew each run: runs
    with the same seed differed, without a word. The first seeded reset rlspeed does anyway now reads the seed
    Gymnasium recorded and warns where it is another; an env that passes its seed on, or seeds a generator of its own,
    is not warned of. Subprocess envs' seeds are read in the parent, which warns once (each worker warned on its own
    stderr, out of reach of the caller's warning filters)."""
    from rlspeed.envs import gymnasium_env

    gymnasium_env._WARNED_UNSEEDED.ids.discard("SeedDropping-v0")
    if backend == "sb3":  # (a user's DummyVecEnv, whose seed() seeds env i with seed + i at its reset)
        sb3 = pytest.importorskip("stable_baselines3.common.vec_env")
        env = rlspeed.make_env(sb3.DummyVecEnv([functools.partial(_SeedDropping, passes)] * 2), device="cpu")
    else:
        env = rlspeed.make_env("SeedDropping-v0", num_envs=2, device="cpu", backend=backend, passes=passes)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            env.reset(seed=0)
            env.reset(seed=1)
    finally:
        env.close()
    said = [str(w.message) for w in caught if "did not seed the env's np_random" in str(w.message)]
    assert len(said) == (passes == "no"), said
    if said:
        name = "user-sb3-vec-env" if backend == "sb3" else "SeedDropping-v0"
        assert said[0].startswith(f"'{name}'.reset(seed=...) did not seed"), said


class _CloseRaising(gym.Env):
    """An env whose close() raises: always, or only once it has stepped (`after_steps`); its step raises too with
    `step_raises`. `closed`: the envs whose close() was called."""

    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)
    metadata = {"render_modes": ["rgb_array"]}
    closed: set = set()

    def __init__(self, after_steps: bool = False, step_raises: bool = False, render_mode=None):
        self.after_steps, self.stepped, self.step_raises = after_steps, False, step_raises
        self.render_mode = render_mode

    def render(self):
        return np.zeros((8, 8, 3), np.uint8)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.stepped = True
        if self.step_raises:
            raise ValueError("the simulator diverged")
        return np.zeros(2, np.float32), 0.0, False, False, {}

    def close(self):
        type(self).closed.add(id(self))
        if self.stepped or not self.after_steps:
            raise RuntimeError("the simulator's socket is gone")


gym.register("CloseRaising-v0", entry_point=_CloseRaising, disable_env_checker=True, max_episode_steps=5)


def test_an_env_whose_close_raises_is_named_before_training():
    """An env whose close() raised failed making the model with the env's raw traceback (rlspeed closes the env it
    makes to read the spaces; `rlspeed train` exited 1 with 35 lines). It is an EnvStepError naming the env and
    close() now (one line from the CLI), before any training."""
    from rlspeed import PPO
    from rlspeed.errors import EnvStepError

    with pytest.raises(EnvStepError, match=r"The env 'CloseRaising-v0' \(gymnasium backend\) raised RuntimeError in "
                                           r"close\(\): the simulator's socket is gone"):
        PPO("CloseRaising-v0", seed=0, device="cpu", env_backend="gymnasium", num_envs=2, num_steps=8, batch_size=16)


def test_envs_whose_close_raises_are_all_closed_and_named():
    """Gymnasium's SyncVectorEnv stops closing its envs at the first whose close() raises, and the raw error came
    out of rlspeed's env: the other envs stayed open. Every env is closed now, and the error names the env."""
    from rlspeed.errors import EnvStepError

    env = rlspeed.make_env("CloseRaising-v0", num_envs=3, device="cpu", backend="gymnasium",
                           env_kwargs={"after_steps": True})
    env.reset(seed=0)
    env.step(torch.zeros(3, dtype=torch.int64))
    _CloseRaising.closed = set()
    with pytest.raises(EnvStepError, match=r"'CloseRaising-v0' \(gymnasium backend\) raised RuntimeError in close"):
        env.close()
    assert _CloseRaising.closed == {id(each.unwrapped) for each in env.vector_env.unwrapped.envs}
    env.close()  # (closed: nothing raised again)


def test_an_async_env_whose_close_raises_is_named(capfd):
    """A gymnasium-async env whose close() raised in its worker was never heard of: the worker printed a traceback and
    `rlspeed train` exited 0; then only the workers' exit codes were named, under each worker's raw traceback. The
    workers close their envs when the parent asks now: the EnvStepError names the env's own error (kept, under the
    CLI, for the end of the command, as a sync env's), and no worker prints a traceback."""
    from rlspeed.errors import EnvStepError

    env = rlspeed.make_env("CloseRaising-v0", num_envs=2, device="cpu", backend="gymnasium-async",
                           env_kwargs={"after_steps": True})
    env.reset(seed=0)
    env.step(torch.zeros(2, dtype=torch.int64))
    capfd.readouterr()
    with pytest.raises(EnvStepError, match=r"'CloseRaising-v0' \(gymnasium-async backend\) raised RuntimeError in "
                                           r"close\(\): the simulator's socket is gone \(and 1 more close\(\) error"):
        env.close()
    assert "Traceback" not in capfd.readouterr().err
    env.close()  # (closed: nothing raised again)


def test_an_evaluation_that_fails_shows_the_envs_error_not_its_close_error():
    """An env whose step raised in an evaluation, and whose close() raised too, showed the close() error: the
    evaluation's own failure, the cause to fix, was hidden behind it. The step's error is the one raised now."""
    from rlspeed import PPO
    from rlspeed.errors import EnvStepError

    model = PPO("CloseRaising-v0", seed=0, device="cpu", env_backend="gymnasium", num_envs=2, num_steps=8,
                batch_size=16, env_kwargs={"after_steps": True})
    with pytest.raises(EnvStepError, match=r"raised ValueError in step\(\): the simulator diverged"):
        model.evaluate(episodes=2, env_kwargs={"after_steps": True, "step_raises": True})


class _TextObservations(_CloseRaising):
    observation_space = gym.spaces.Text(5)


def test_an_env_refused_as_made_shows_the_refusal_not_its_close_error():
    """An env refused as rlspeed looked at it (a Text observation space; envs that film themselves), whose close()
    raised too, showed the close() error, the refusal's sentence hidden behind it. The refusal is the one raised now,
    as where the work fails (`close_quietly`)."""
    from rlspeed.envs.gymnasium_env import GymnasiumEnv, refuse_filming_envs

    class RecordVideo(gym.Wrapper):  # (Gymnasium's filming wrapper's name: the env films itself)
        pass

    vector_env = gym.vector.SyncVectorEnv([_TextObservations], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    with pytest.raises(rlspeed.UserError, match="has a Text observation space"):
        GymnasiumEnv("CloseRaising-v0", vector_env=vector_env)
    with pytest.raises(rlspeed.UserError, match="film themselves with Gymnasium's RecordVideo"):
        refuse_filming_envs("CloseRaising-v0", RecordVideo(_CloseRaising()))


_CLOSE_LATE = ["--env-kwargs", "after_steps=true", "--no-progress", "--env-backend", "gymnasium"]


def _close_error_last(capsys) -> list[str]:
    """The output lines (stdout's, then stderr's) of a command that exited on a close() error, stderr's last line."""
    captured = capsys.readouterr()
    lines = [line for line in captured.out.splitlines() + captured.err.splitlines() if line.strip()]
    assert lines[-1].startswith("rlspeed: error: The env 'CloseRaising-v0' (gymnasium backend) raised RuntimeError "
                                "in close(): the simulator's socket is gone"), lines
    return lines


@pytest.mark.parametrize("seeds, saved", [((), "model.safetensors"), (("--seeds", "0-1"), "members")])
def test_a_training_run_whose_env_close_raises_keeps_its_model_and_fails_at_the_end(tmp_path, capsys, seeds, saved):
    """An env whose close() raised after stepping ended `rlspeed train` (a population too) at the first evaluation's
    close, exit 1: no model saved. The run goes on now, saves the model (the members), summary.json and prints its
    final evaluation; the close() error is its last line, exit code 1 (scripts notice), and summary.json's
    `close_error` (its `error` was null, as a finished run's)."""
    from rlspeed import cli

    run = tmp_path / "run"
    code = cli.main(["train", "ppo", "CloseRaising-v0", "--num-envs", "2", "--set", "num_steps=8", "--set",
                     "batch_size=16", "--total-timesteps", "32", "--eval-freq", "16", "--eval-episodes", "1",
                     "--target-return", "none", "--out", str(run), *seeds, *_CLOSE_LATE])
    lines = _close_error_last(capsys)
    assert code == 1
    assert {saved, "summary.json"} <= {path.name for path in run.iterdir()}
    assert any(line.startswith("rlspeed: final evaluation") for line in lines[:-1]), lines
    # (summary.json says it too, for a script collecting runs: `error` stays null, the run finished)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["error"] is None
    assert summary["close_error"].startswith("EnvStepError: The env 'CloseRaising-v0' (gymnasium backend) raised "
                                             "RuntimeError in close(): the simulator's socket is gone"), summary
    # (and how many more close() errors followed, as the error shown counts them: the first alone hid them)
    more = re.search(r"\(and (\d+) more close\(\) errors? of the env 'CloseRaising-v0'", lines[-1])
    assert more is not None, lines[-1]
    assert summary["close_error"].endswith(f"(and {more[1]} more close() error{'s' if more[1] != '1' else ''} of "
                                           "the env 'CloseRaising-v0')"), summary


def test_an_env_whose_close_raises_before_any_work_stops_the_cli_before_training(tmp_path, capsys):
    """A close() error of the env made to read the spaces still stops `rlspeed train` at once, before training
    (no run of the whole budget to hear of it at the end)."""
    from rlspeed import cli

    code = cli.main(["train", "ppo", "CloseRaising-v0", "--total-timesteps", "32", "--out", str(tmp_path / "run"),
                     "--no-progress", "--env-backend", "gymnasium"])
    lines = _close_error_last(capsys)
    assert code == 1 and not any("training" in line for line in lines), lines


@pytest.fixture(scope="module")
def _close_late_model(tmp_path_factory):
    from rlspeed import PPO

    path = tmp_path_factory.mktemp("close_late") / "model.safetensors"
    with PPO("CloseRaising-v0", seed=0, device="cpu", env_backend="gymnasium", num_envs=2, num_steps=8,
             batch_size=16, env_kwargs={"after_steps": True}) as model:
        model.save(path)
    return path


@pytest.mark.parametrize("video", [False, True])
def test_eval_whose_env_close_raises_prints_its_scores_and_video_first(_close_late_model, tmp_path, capsys, video):
    """`rlspeed eval` (and `eval --video`) of an env whose close() raised after stepping printed no scores and wrote
    no video, exit 1. The scores are printed and the video written now; the close() error follows, exit code 1."""
    from rlspeed import cli

    film = tmp_path / "film.gif"
    code = cli.main(["eval", str(_close_late_model), "--episodes", "1", "--seed", "0", *_CLOSE_LATE,
                     *(["--video", str(film)] if video else [])])
    lines = _close_error_last(capsys)
    assert code == 1
    assert "deterministic, 1 episode, seed 0" in "\n".join(lines[:-1]), lines
    assert film.is_file() == video


def test_profile_closes_its_envs_and_says_a_close_error_after_its_report(capsys, monkeypatch):
    """`rlspeed profile` never closed its model's envs: an env whose close() raised was never heard of (exit 0), and
    its subprocesses were left to the interpreter's exit. It closes them after the report now; the close() error
    follows the report, exit code 1. (The profiler's run is a short learn here: its reading back takes seconds.)"""
    from rlspeed import cli
    from rlspeed.diagnostics import profiler

    monkeypatch.setattr(profiler, "profile_run", lambda model, steps, trace, say: (
        model.learn(16, progress_bar=False), "the profile's report")[1])
    code = cli.main(["profile", "ppo", "CloseRaising-v0", "--num-envs", "2", "--set", "num_steps=8", "--set",
                     "batch_size=16", "--steps", "16", *_CLOSE_LATE[:2], "--env-backend", "gymnasium"])
    lines = _close_error_last(capsys)
    assert code == 1 and "the profile's report" in lines, lines


def test_tune_whose_env_close_raises_writes_its_preset_then_fails(tmp_path, capsys):
    """`rlspeed tune` of an env whose close() raised after stepping marked its trials failed, no preset written. The
    trials finish now and the best trial's preset is written; the close() error follows, exit code 1."""
    from rlspeed import cli

    best = tmp_path / "best.yaml"
    code = cli.main(["tune", "ppo", "CloseRaising-v0", "--population", "2", "--trials", "2", "--budget", "16",
                     "--eval-episodes", "1", "--confirm-seeds", "0", "--storage", str(tmp_path / "study.db"),
                     "--out", str(best), "--num-envs", "2", "--set", "num_steps=8", "--set", "batch_size=16",
                     *_CLOSE_LATE[:3]])
    _close_error_last(capsys)
    assert code == 1 and best.is_file()


@pytest.mark.parametrize("population", [False, True])
def test_learn_whose_env_close_raises_trains_its_budget_then_raises(tmp_path, population):
    """model.learn (a population's too) with periodic evaluations stopped at the first evaluation env's close()
    error, its budget untrained and no checkpoint written. It trains the whole budget now and raises the close()
    error at its end."""
    from rlspeed import PPO
    from rlspeed.errors import EnvStepError
    from rlspeed.population import Population

    settings = {"env_backend": "gymnasium", "num_envs": 2, "num_steps": 8, "batch_size": 16,
                "env_kwargs": {"after_steps": True}}
    model = (Population(PPO, "CloseRaising-v0", seeds=[0, 1], **settings) if population
             else PPO("CloseRaising-v0", seed=0, device="cpu", **settings))
    with pytest.raises(EnvStepError, match=r"raised RuntimeError in close\(\)"):
        model.learn(48, eval_freq=16, eval_episodes=1, run_dir=tmp_path / "run", checkpoint_freq=16,
                    progress_bar=False)
    assert model.num_timesteps == 48
    assert (tmp_path / "run" / "checkpoint.safetensors").is_file()


@pytest.mark.parametrize("through", ["rlspeed.evaluate", "model.evaluate"])
def test_evaluate_whose_env_close_raises_keeps_every_score_in_the_error(through):
    """rlspeed.evaluate (model.evaluate too) of an env whose close() raised after its episodes raised the close()
    error and lost every score (`rlspeed eval` printed them). The error comes after the episodes now, with the
    evaluation's result in its `result`, its sentence saying so and counting the other envs' close() errors."""
    from rlspeed import PPO
    from rlspeed.errors import EnvStepError

    model = PPO("CloseRaising-v0", seed=0, device="cpu", env_backend="gymnasium", num_envs=2, num_steps=8,
                batch_size=16, env_kwargs={"after_steps": True})
    with pytest.raises(EnvStepError, match=r"raised RuntimeError in close\(\): the simulator's socket is gone \(and 2 "
                                           r"more close\(\) errors of the env 'CloseRaising-v0', in this error's "
                                           r"`others`; this error's `result` holds the evaluation's result"
                       ) as caught:
        if through == "rlspeed.evaluate":
            rlspeed.evaluate(model, episodes=3, seed=0)
        else:
            model.evaluate(episodes=3, seed=0)
    result = caught.value.result
    assert result["episodes"] == 3 and result["lengths"] == [5, 5, 5] and result["seed"] == 0
    assert len(caught.value.others) == 2


def test_a_population_evaluate_whose_env_close_raises_keeps_the_means_in_the_error():
    """Population.evaluate of an env whose close() raised after its episodes lost the members' means as
    rlspeed.evaluate lost its scores: the error comes after the episodes now, the means in its `result`."""
    from rlspeed import PPO
    from rlspeed.errors import EnvStepError
    from rlspeed.population import Population

    population = Population(PPO, "CloseRaising-v0", seeds=[0, 1], env_backend="gymnasium", num_envs=2, num_steps=8,
                            batch_size=16, env_kwargs={"after_steps": True})
    with pytest.raises(EnvStepError, match=r"this error's `result` holds the members' mean returns") as caught:
        population.evaluate(episodes=2)
    assert caught.value.result.tolist() == [0.0, 0.0]


def test_envs_whose_close_raises_are_each_said_where_none_keeps_them():
    """A SyncVectorEnv of three envs whose close() raised was one error: the first env's, the other two dropped. The
    error counts the others now, each in its `others` (with its own traceback)."""
    from rlspeed.errors import EnvStepError

    env = rlspeed.make_env("CloseRaising-v0", num_envs=3, device="cpu", backend="gymnasium")
    with pytest.raises(EnvStepError, match=r"\(and 2 more close\(\) errors of the env 'CloseRaising-v0'") as caught:
        env.close()
    assert [type(other.__cause__).__name__ for other in caught.value.others] == ["RuntimeError"] * 2


def test_a_sync_vector_env_subclass_keeps_its_own_close_extras():
    """Closing a SyncVectorEnv closes each of its envs first (every close() error kept), and marked it closed: the
    close_extras of a user's subclass (releasing a resource its envs share) was never called. It is now."""
    from rlspeed.envs.gymnasium_env import close_envs

    released = []

    class SharedSimulator(gym.vector.SyncVectorEnv):
        def close_extras(self, **kwargs):
            super().close_extras(**kwargs)
            released.append(True)

    close_envs(SharedSimulator([lambda: gym.make("CartPole-v1")] * 2), "CartPole-v1")
    assert released == [True]


@pytest.mark.parametrize("vec_env, said", [
    ("DummyVecEnv", r"RuntimeError in close\(\): the simulator's socket"),
    ("SubprocVecEnv", r"ChildProcessError in close\(\): worker 0 \(and 1 more\)")],
    ids=["DummyVecEnv", "SubprocVecEnv"])
def test_a_stable_baselines3_vec_env_whose_close_raises_is_named_and_kept_as_a_gymnasium_envs(vec_env, said):
    """An SB3 VecEnv whose env's close() raised: a DummyVecEnv's raw error came out of rlspeed's env, never kept for
    the end of the work (the CLI's command, learn, evaluate); a SubprocVecEnv's worker printed its traceback and
    nothing was said. Each is an EnvStepError naming the env and close() now, kept as a Gymnasium env's is. A
    DummyVecEnv's close stopped at the first env that raised (the others stayed open, unnamed): every env is closed
    now, each error kept, and the VecEnv keeps its envs."""
    sb3 = pytest.importorskip("stable_baselines3.common.vec_env")
    from rlspeed.errors import CloseErrors

    envs = (sb3.DummyVecEnv([_CloseRaising] * 3) if vec_env == "DummyVecEnv"
            else sb3.SubprocVecEnv([_CloseRaising] * 2, start_method="fork" if "fork" in
                                   multiprocessing.get_all_start_methods() else None))
    env = rlspeed.make_env(sb3.VecNormalize(envs, norm_reward=False), device="cpu")  # (a wrapper's close passes on)
    _CloseRaising.closed = set()
    with CloseErrors() as closing:
        env.close()
    assert [error.call for error in closing.errors] == ["close"] * (3 if vec_env == "DummyVecEnv" else 1)
    assert re.search(r"'user-sb3-vec-env' \(sb3 backend\) raised " + said, str(closing.errors[0]))
    if vec_env == "DummyVecEnv":
        assert _CloseRaising.closed == {id(each.unwrapped) for each in envs.envs} and len(envs.envs) == 3


def test_a_stable_baselines3_subprocess_worker_that_an_envs_error_ended_is_named_and_closes_quietly():
    """An error in a SubprocVecEnv's env ends its worker (which prints the env's traceback): the step said only "raised
    EOFError in step()", and closing the VecEnv afterwards raised a second EnvStepError, "EOFError in close()", from
    SB3's close reading the dead worker's pipe. The step names the worker and its exit code now, and the close that
    follows ends the workers left without a word."""
    sb3 = pytest.importorskip("stable_baselines3.common.vec_env")
    from rlspeed.errors import CloseErrors, EnvStepError

    # (one worker: a forked worker holds its siblings' pipe ends open, so the parent would wait for a dead one's
    # answer for ever, as SB3 alone does; forkserver, SB3's default, forks none from the parent)
    envs = sb3.SubprocVecEnv([functools.partial(_ContractBreakingEnv, "raises")],  # (it raises at its step 2)
                             start_method="fork" if "fork" in multiprocessing.get_all_start_methods() else None)
    env = rlspeed.make_env(envs, device="cpu")
    actions = torch.zeros(1, dtype=torch.int64)
    env.reset(seed=0)
    env.step(actions)
    with pytest.raises(EnvStepError, match=r"'user-sb3-vec-env' \(sb3 backend\) raised ChildProcessError in "
                       r"step\(\): worker 0 exited with code 1; the worker printed the env's traceback above"):
        env.step(actions)
    with CloseErrors() as closing:
        env.close()
    assert closing.errors == [] and envs.closed and not any(process.is_alive() for process in envs.processes)


def test_a_stable_baselines3_subprocess_worker_killed_between_steps_is_named_and_closes_quietly():
    """A SubprocVecEnv worker killed between steps (the OOM killer, a signal): the next step's send to it raised an
    unnamed BrokenPipeError, and the close then a second error, EOFError from SB3's close. It names the worker and its
    exit code, and the close ends the rest quietly, as where the env's error ended it."""
    sb3 = pytest.importorskip("stable_baselines3.common.vec_env")
    from rlspeed.errors import CloseErrors, EnvStepError

    envs = sb3.SubprocVecEnv([_ContractBreakingEnv],
                             start_method="fork" if "fork" in multiprocessing.get_all_start_methods() else None)
    env = rlspeed.make_env(envs, device="cpu")
    actions = torch.zeros(1, dtype=torch.int64)
    env.reset(seed=0)
    envs.processes[0].kill()
    envs.processes[0].join()
    with pytest.raises(EnvStepError, match=r"worker 0 exited with code -9"):
        env.step(actions)
    with CloseErrors() as closing:
        env.close()
    assert closing.errors == [] and envs.closed


class _ClosesIntoFile(_ContractBreakingEnv):
    """A well-behaved env whose close() writes `path` (a file or a simulator it would release)."""

    def __init__(self, path):
        super().__init__()
        self.path = path

    def close(self):
        Path(self.path).write_text("closed")


def _worker_0_ended(second) -> tuple:
    """(SB3's SubprocVecEnv, the env `make_env` made of it) of two workers, the second's env made by `second`, whose
    worker 0 has ended: its env raised in the second step, which names it."""
    sb3 = pytest.importorskip("stable_baselines3.common.vec_env")
    from rlspeed.errors import EnvStepError

    # (worker 0 ends: a forked worker holds the pipe ends of the workers made before it, none of worker 0's)
    envs = sb3.SubprocVecEnv([functools.partial(_ContractBreakingEnv, "raises"), second],
                             start_method="fork" if "fork" in multiprocessing.get_all_start_methods() else None)
    env = rlspeed.make_env(envs, device="cpu")
    actions = torch.zeros(2, dtype=torch.int64)
    env.reset(seed=0)
    env.step(actions)
    with pytest.raises(EnvStepError, match="worker 0 exited with code 1"):
        env.step(actions)
    return envs, env


def test_the_workers_left_of_a_stable_baselines3_subprocess_vec_env_close_their_envs(tmp_path):
    """After one SubprocVecEnv worker ended (its env raised), the close terminated the others, so their envs' close()
    never ran (a file or a simulator process they held leaked): they are sent SB3's "close" and close their envs."""
    from rlspeed.errors import CloseErrors

    envs, env = _worker_0_ended(functools.partial(_ClosesIntoFile, tmp_path / "closed"))
    with CloseErrors() as closing:
        env.close()
    assert closing.errors == [] and envs.closed and not any(process.is_alive() for process in envs.processes)
    assert [process.exitcode for process in envs.processes] == [1, 0]  # (worker 1 ended by its close, not a signal)
    assert (tmp_path / "closed").read_text() == "closed"


class _AnswersLateAndLarge(_ContractBreakingEnv):
    """A well-behaved env whose second step answers a large info (8 MB: more than a pipe holds) once `begun` is set:
    as the close of its SubprocVecEnv has begun."""

    def __init__(self, begun):
        super().__init__()
        self.begun = begun

    def step(self, action):
        stepped = super().step(action)
        if self.t == 2:
            self.begun.wait(timeout=300)  # (set by the test as the close sends its command: generous, never reached)
            stepped = (*stepped[:4], {"large": np.zeros(2_000_000, np.float32)})
        return stepped


def test_a_stable_baselines3_worker_answering_late_and_large_is_closed_by_its_command():
    """After one SubprocVecEnv worker ended, a worker whose answer to the broken step came after the close began (a
    large one: its send waits for a reader) waited out the close's 30 s and was terminated, its env's close() never
    run: its answer is read as it comes, and it closes its env at once. The answer is given once the close has sent
    the worker its command, whatever the machine's load."""
    from rlspeed.errors import CloseErrors

    begun = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None).Event()
    envs, env = _worker_0_ended(functools.partial(_AnswersLateAndLarge, begun))
    remote = envs.remotes[1]
    send = remote.send

    def send_then_answer(message):  # (the close's command to worker 1: its step answers after it)
        send(message)
        if message[0] == "close":
            begun.set()

    remote.send = send_then_answer
    with CloseErrors() as closing:
        env.close()
    assert begun.is_set() and closing.errors == [] and envs.closed
    assert [process.exitcode for process in envs.processes] == [1, 0]  # (worker 1 ended by its close, not a signal)


class _MasksRaising(_ContractBreakingEnv):
    """An env with action masks whose `action_masks()` raises at its second call (the first step's)."""

    calls = 0

    def action_masks(self):
        self.calls += 1
        if self.calls == 2:
            raise ValueError("the env's own")
        return np.ones(2, bool)


def test_a_stable_baselines3_worker_that_ended_asked_for_masks_is_named_and_closes_quietly():
    """A SubprocVecEnv worker that ended as it was asked for its env's action masks (`env_method("action_masks")`,
    after each step and reset): the step raised a bare "EOFError", and the close a second error. It names the worker
    and its exit code, as a step that ended one does, and the close that follows is quiet."""
    sb3 = pytest.importorskip("stable_baselines3.common.vec_env")
    from rlspeed.errors import CloseErrors, EnvStepError

    envs = sb3.SubprocVecEnv([_MasksRaising],
                             start_method="fork" if "fork" in multiprocessing.get_all_start_methods() else None)
    env = rlspeed.make_env(envs, device="cpu")
    assert env.has_action_masks
    env.reset(seed=0)
    with pytest.raises(EnvStepError, match=r"raised ChildProcessError in step\(\): worker 0 exited with code 1"):
        env.step(torch.zeros(1, dtype=torch.int64))
    with CloseErrors() as closing:
        env.close()
    assert closing.errors == [] and envs.closed


def test_a_stable_baselines3_worker_found_ended_by_asking_the_envs_closes_quietly_with_the_workers_left():
    """HER asks a SubprocVecEnv whether its envs have `compute_reward` (`vec_env_has_attr`, as learn starts) and calls
    it there (`env_method`): a worker killed before such a question raised a bare BrokenPipeError; it names the worker
    and its exit code, as a step does. The close that followed was SB3's own, which broke on the ended worker's pipe (a
    second error) and left the other workers running: it is the one after a step that found a worker ended, quiet,
    every worker ended."""
    sb3 = pytest.importorskip("stable_baselines3.common.vec_env")
    from rlspeed.envs.sb3_env import vec_env_has_attr
    from rlspeed.errors import CloseErrors

    envs = sb3.SubprocVecEnv([_ContractBreakingEnv, _ContractBreakingEnv],
                             start_method="fork" if "fork" in multiprocessing.get_all_start_methods() else None)
    env = rlspeed.make_env(envs, device="cpu")
    try:
        assert not vec_env_has_attr(envs, "compute_reward")
        envs.processes[0].kill()
        envs.processes[0].join()
        with pytest.raises(ChildProcessError, match="^worker 0 exited with code -9; "):
            vec_env_has_attr(envs, "compute_reward")
        with CloseErrors() as closing:
            env.close()
        assert closing.errors == [] and envs.closed
        assert [process.exitcode for process in envs.processes] == [-9, 0]  # (worker 1 ended by its close)
    finally:
        for process in envs.processes:
            process.kill()


class _IgnoresTermination(_ContractBreakingEnv):
    """An env whose worker ignores SIGTERM and whose close() never returns."""

    def __init__(self):
        super().__init__()
        import signal

        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # (made in its worker: the worker ignores it)

    def close(self):
        import threading

        threading.Event().wait()


def test_a_stable_baselines3_worker_that_ignores_sigterm_is_killed_by_the_close(monkeypatch):
    """After one SubprocVecEnv worker ended, the close terminated the workers that had not closed their envs in time
    and then waited for them without a bound: a worker whose env ignores SIGTERM hung the close for ever. It is killed
    a bounded while after."""
    import threading

    from rlspeed.envs import sb3_env
    from rlspeed.errors import CloseErrors

    monkeypatch.setattr(sb3_env, "WORKERS_CLOSE_WAIT_S", 0.1)
    monkeypatch.setattr(sb3_env, "WORKER_TERMINATE_WAIT_S", 0.1)
    envs, env = _worker_0_ended(_IgnoresTermination)
    closing = CloseErrors()

    def close():
        with closing:
            env.close()

    closer = threading.Thread(target=close, daemon=True)  # (a hung close fails the test, not the suite)
    closer.start()
    closer.join(timeout=120)
    try:
        assert not closer.is_alive(), "the close hung"
        assert closing.errors == [] and envs.closed
        assert [process.exitcode for process in envs.processes] == [1, -9]
    finally:
        for process in envs.processes:
            process.kill()


class _ResetWithoutSeed(gym.Env):
    """A reset written without Gymnasium's keyword arguments (`def reset(self)`), or with `seed` alone."""

    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, takes_seed: bool = False):
        self.takes_seed = takes_seed

    def reset(self, *args, **kwargs):
        allowed = {"seed"} if self.takes_seed else set()
        for name in [name for name in kwargs if name not in allowed]:  # (what Python says of such a signature)
            raise TypeError(f"_ResetWithoutSeed.reset() got an unexpected keyword argument '{name}'")
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, False, {}


gym.register("ResetWithoutSeed-v0", entry_point=_ResetWithoutSeed, disable_env_checker=True, max_episode_steps=5)


@pytest.mark.parametrize("takes_seed, missing", [(False, "seed"), (True, "options")])
@pytest.mark.parametrize("backend", ["gymnasium", "gymnasium-async"])
def test_a_reset_without_gymnasiums_arguments_is_one_sentence(backend, takes_seed, missing):
    """`def reset(self):` (returning Gymnasium's (obs, info)) failed as the env's own error, "The env raised
    TypeError in reset()" (EnvStepError, exit 1): a breach of Gymnasium's API the user fixes in the signature."""
    _refused_in_learn("ResetWithoutSeed-v0", backend, {"takes_seed": takes_seed},
                      rf"'ResetWithoutSeed-v0'.reset\(\) takes no {missing} argument: Gymnasium's reset is "
                      r"reset\(self, seed=None, options=None\)")


class _OwnBufferEnv(gym.Env):
    """Writes its observations (the step count, as a Box and a Dict) into one array of its own and returns it each
    time (Gymnasium's checker warns, "share an object"); episodes truncated after 3 steps."""

    action_space = gym.spaces.Discrete(2)

    def __init__(self, keyed: bool = False):
        self.keyed, self.buffer, self.t = keyed, np.zeros(2, np.float32), 0
        box = gym.spaces.Box(0, 10, (2,), np.float32)
        self.observation_space = gym.spaces.Dict({"x": box}) if keyed else box

    def _observation(self):
        self.buffer[:] = self.t
        return {"x": self.buffer} if self.keyed else self.buffer

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._observation(), {}

    def step(self, action):
        self.t += 1
        return self._observation(), 0.0, False, self.t >= 3, {}


gym.register("OwnBuffer-v0", entry_point=_OwnBufferEnv, disable_env_checker=True)


@pytest.mark.parametrize("keyed", [False, True], ids=["box", "dict"])
@pytest.mark.parametrize("backend", ["gymnasium", "gymnasium-async"])
def test_final_obs_is_the_last_observation_of_an_env_that_reuses_its_array(backend, keyed):
    """Gymnasium's subprocess worker keeps the array an env's last step returned as info["final_obs"] and resets the
    env before sending it: an env writing into one array of its own had final_obs equal to the next episode's first
    observation, and truncated episodes bootstrapped from it, without a word (subprocess envs only)."""
    env = rlspeed.make_env("OwnBuffer-v0", num_envs=2, backend=backend, seed=0, env_kwargs={"keyed": keyed})
    try:
        env.reset()
        for _ in range(3):
            obs, _, _, truncated, info = env.step(torch.zeros(2, dtype=torch.long))
    finally:
        env.close()
    final, obs = (info["final_obs"]["x"], obs["x"]) if keyed else (info["final_obs"], obs)
    assert truncated.all()
    assert (final == 3).all() and (obs == 0).all(), (final, obs)



@pytest.mark.parametrize("env_id", ["CartPole-v1", "OwnBuffer-v0"])  # (float vectors, and a Dict's keys)
def test_a_gymnasium_envs_observations_are_the_callers_to_keep(env_id):
    """Each step returns observations of its own, final ones included: a rollout keeps them, and the next step writes
    into new ones rather than over those it kept."""
    env = rlspeed.make_env(env_id, num_envs=2, backend="gymnasium", seed=0,
                           env_kwargs={"keyed": True} if env_id == "OwnBuffer-v0" else None)
    try:
        kept = [env.reset()[0]]
        for _ in range(20):  # (CartPole pushed one way ends its episodes within 20 steps)
            obs, _, _, _, info = env.step(torch.ones(2, dtype=torch.long))
            kept += [obs, info["final_obs"]]
        copies = [{key: value.clone() for key, value in obs.items()} if isinstance(obs, dict) else obs.clone()
                  for obs in kept]
        for _ in range(20):
            env.step(torch.zeros(2, dtype=torch.long))
    finally:
        env.close()
    for obs, copy in zip(kept, copies):
        assert all(torch.equal(obs[key], copy[key]) for key in obs) if isinstance(obs, dict) else torch.equal(obs, copy)

def test_a_contract_breach_is_told_under_a_time_limit_another_package_put_in_place(monkeypatch):
    """rl_zoo3 (rlspeed's `--preset zoo`) replaces Gymnasium's TimeLimit with a subclass of its own when imported: the
    old API's 4-value step then failed in that subclass's file, not Gymnasium's, and was taken for the env's own
    error (EnvStepError, exit 1)."""
    from rlspeed import PPO

    class PatchedTimeLimit(gym.wrappers.TimeLimit):  # (what rl_zoo3.gym_patches does, in a file of its own)
        def step(self, action):
            observation, reward, terminated, truncated, info = self.env.step(action)
            return observation, reward, terminated, truncated, info

    monkeypatch.setattr(gym.wrappers, "TimeLimit", PatchedTimeLimit)  # (what gymnasium.make wraps with)
    # (subprocess envs too: there the worker's traceback text is all there is, its last frame in the subclass's file;
    # the full CI run imports rl_zoo3 and showed it)
    for backend in ("gymnasium", "gymnasium-async"):
        model = PPO("ContractBreaking-v0", seed=0, device="cpu", env_backend=backend, num_envs=2, num_steps=8,
                    batch_size=16, env_kwargs={"fault": "four"})
        try:
            with pytest.raises(rlspeed.UserError, match=r"'ContractBreaking-v0'.step\(\) returned 4 values"):
                model.learn(16, progress_bar=False)
        finally:
            model.close()


def test_an_envs_own_error_in_step_is_not_taken_for_a_contract_breach():
    from rlspeed import PPO
    from rlspeed.errors import EnvStepError

    model = PPO("ContractBreaking-v0", seed=0, device="cpu", env_backend="gymnasium", num_envs=2, num_steps=8,
                batch_size=16, env_kwargs={"fault": "raises"})
    with pytest.raises(EnvStepError, match=r"raised ValueError in step\(\): setting an array element with a sequence "
                                           r"\(the env's own\)"):
        model.learn(16, progress_bar=False)


@pytest.mark.parametrize("fault, message", _BREACHES)
def test_a_contract_breach_in_subprocess_envs_is_the_same_sentence(fault, message, recwarn):
    """With gymnasium-async (AsyncVectorEnv: the env in worker processes), a breach failed in a worker or in
    Gymnasium's batching of the answers: Gymnasium's log of the worker's traceback (warnings), then "The env 'X'
    raised ValueError in step(): not enough values to unpack (expected 5, got 4)" (EnvStepError, exit 1), workers
    left running until the model was dropped (an array reward: a sentence of its own, naming the batched shape).
    Now the one-process backend's sentence (a fresh env probed in this process), nothing logged, workers ended."""
    from rlspeed import PPO

    before = _children_before()
    model = PPO("ContractBreaking-v0", seed=0, device="cpu", env_backend="gymnasium-async", num_envs=2, num_steps=8,
                batch_size=16, env_kwargs={"fault": fault})
    try:
        with pytest.raises(rlspeed.UserError) as raised:
            model.learn(16, progress_bar=False)
        assert message in str(raised.value), str(raised.value)
        assert "\n" not in str(raised.value)
        assert not _children_since(before)  # (the workers were ended with the error)
        assert not [str(w.message) for w in recwarn if "Worker" in str(w.message)]
        with pytest.raises(rlspeed.UserError, match=re.escape(message)):  # (envs made again: the same error)
            model.learn(16, progress_bar=False)
    finally:
        model.close()
    assert not _children_since(before)


@pytest.mark.parametrize("fault, message", [f for f in _BREACHES if f[0] in ("reset_text", "reset_shape")])
def test_a_contract_breach_is_told_under_numpy_before_1_25(monkeypatch, fault, message):
    """numpy before 1.25 (rlspeed's floor is 1.24) runs each of its functions in a frame of the file
    "<__array_function__ internals>": an observation Gymnasium's batching (np.stack) could not store was taken for
    the env's own error ("The env 'X' raised TypeError in reset(): Cannot cast array data from dtype('<U1')",
    EnvStepError). Emulated here with np.stack called through such a frame."""
    from rlspeed import PPO

    dispatch = {}
    exec(compile("def stack(*args, **kwargs):\n    return numpy_stack(*args, **kwargs)\n",  # noqa: S102
                 "<__array_function__ internals>", "exec"), {"numpy_stack": np.stack}, dispatch)
    monkeypatch.setattr(np, "stack", dispatch["stack"])
    model = PPO("ContractBreaking-v0", seed=0, device="cpu", env_backend="gymnasium", num_envs=2, num_steps=8,
                batch_size=16, env_kwargs={"fault": fault})
    with pytest.raises(rlspeed.UserError) as raised:
        model.learn(16, progress_bar=False)
    assert message in str(raised.value), str(raised.value)


def test_a_subprocess_envs_breach_is_told_from_a_worker_trace_of_numpy_before_1_25():
    """A worker's traceback under numpy before 1.25 ends in a frame of "<__array_function__ internals>" with no
    source line: Gymnasium's write of the answer into shared memory is where it failed, not the env."""
    from rlspeed.envs.gymnasium_env import _worker_raised_storing

    gym_dir = Path(gym.__file__).parent
    trace = (
        "Traceback (most recent call last):\n"
        f'  File "{gym_dir / "vector" / "async_vector_env.py"}", line 796, in _async_worker\n'
        "    write_to_shared_memory(\n"
        f'  File "{gym_dir / "vector" / "utils" / "shared_memory.py"}", line 248, in _write_base_to_shared_memory\n'
        "    np.copyto(\n"
        '  File "<__array_function__ internals>", line 200, in copyto\n'
        "ValueError: could not broadcast input array from shape (3,) into shape (4,)\n")
    assert _worker_raised_storing(trace)
    own = trace.replace(str(gym_dir / "vector" / "utils" / "shared_memory.py"), "/home/user/my_env.py")
    assert not _worker_raised_storing(own)  # (numpy raising in the env's own code: the env's error)


def test_an_envs_own_error_in_subprocess_envs_is_still_its_own(recwarn):
    """An env's own error in a worker is not taken for a breach (nothing probed breaks the contract): EnvStepError
    with the worker's traceback chained, shown once (Gymnasium's log of the same traceback, as warnings, showed it a
    second time, and a third with two workers failing alike); workers ended."""
    from rlspeed import PPO
    from rlspeed.envs.gymnasium_env import WorkerTraceback
    from rlspeed.errors import EnvStepError

    before = _children_before()
    model = PPO("ContractBreaking-v0", seed=0, device="cpu", env_backend="gymnasium-async", num_envs=2, num_steps=8,
                batch_size=16, env_kwargs={"fault": "raises"})
    try:
        with pytest.raises(EnvStepError, match=r"raised ValueError in step\(\): setting an array element with a "
                                               r"sequence \(the env's own\)") as raised:
            model.learn(16, progress_bar=False)
        assert "(gymnasium-async backend)" in str(raised.value)  # (it said "gymnasium backend")
        assert isinstance(raised.value.__cause__.__cause__, WorkerTraceback)
        assert "in step" in str(raised.value.__cause__.__cause__)
        assert not any("Traceback" in str(w.message) or "Worker" in str(w.message) for w in recwarn), \
            [str(w.message) for w in recwarn]
        assert not _children_since(before)
    finally:
        model.close()


def test_a_workers_traceback_other_than_the_chained_one_is_still_shown():
    """Of Gymnasium's log of its workers' errors, what the error raised again does not show stays: another worker's
    different traceback, with its header line."""
    from types import SimpleNamespace

    from rlspeed.envs.gymnasium_env import WorkerTraceback, _untold

    def trace(error):
        return f"Traceback (most recent call last):\n  File \"env.py\", line 1, in step\n{error}"

    log = ["Received the following error from Worker-0 - Shutting it down", trace("KeyError: 'a'"),
           "Received the following error from Worker-1 - Shutting it down", trace("ValueError: b"),
           "Raising the last exception back to the main process."]
    logged = [SimpleNamespace(message=f"\x1b[31mERROR: {line}\x1b[0m") for line in log]
    error = ValueError("b")
    assert _untold(logged, error) == logged  # (nothing chained: the log is all there is)
    error.__cause__ = WorkerTraceback(trace("ValueError: b"))
    assert _untold(logged, error) == logged[:2]


def test_subprocess_envs_passed_in_that_failed_are_not_blamed_on_an_interrupt():
    """Subprocess envs passed in, closed after their step failed, cannot be made again by the next learn: it said so
    as after an interrupt ("an interrupt inside a step, Ctrl-C or Jupyter's stop button, leaves them so"), which did
    not happen; it names the failed step only."""
    from rlspeed import PPO
    from rlspeed.errors import EnvStepError

    before = _children_before()
    given = gym.make_vec("ContractBreaking-v0", num_envs=2, vectorization_mode="async",
                         vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}, fault="raises")
    model = PPO(given, seed=0, device="cpu", num_steps=8, batch_size=16)
    with pytest.warns(UserWarning, match="Worker"), pytest.raises(EnvStepError):
        model.learn(16, progress_bar=False)
    with pytest.raises(rlspeed.UserError, match=r"cannot go on \(their step failed\), and learn") as again:
        model.learn(16, progress_bar=False)
    assert "interrupt" not in str(again.value)
    assert not _children_since(before)


@pytest.mark.parametrize("backend", ["gymnasium", "gymnasium-async"])
def test_a_contract_breach_exits_2_from_the_cli(tmp_path, capsys, backend):
    """The CLI's exit code for a UserError (2, one line), not an env's failure's (1); with subprocess envs, no lines
    of Gymnasium's log of its worker's error before it."""
    from rlspeed import cli

    before = _children_before()
    code = cli.main(["train", "ppo", "ContractBreaking-v0", "--env-backend", backend, "--total-timesteps", "64",
                     "--num-envs", "2", "--no-progress", "--out", str(tmp_path / "run"), "--env-kwargs", "fault=four"])
    err = capsys.readouterr().err
    assert code == 2 and "returned 4 values" in err, err
    assert "warning" not in err and err.count("rlspeed: error:") == 1, err
    assert not _children_since(before)


def _self_normalising_cartpole():
    from gymnasium.envs.classic_control import CartPoleEnv

    return gym.wrappers.NormalizeObservation(gym.wrappers.TimeLimit(CartPoleEnv(), 50))


gym.register("SelfNormalisingCartPole-v0", entry_point=_self_normalising_cartpole)


def _same_step_vector_env(wrappers=()):
    return gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync", wrappers=list(wrappers),
                        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})


@pytest.mark.parametrize("wrapper, option", [(gym.wrappers.NormalizeObservation, "normalize_obs"),
                                             (gym.wrappers.NormalizeReward, "normalize_reward")])
def test_gymnasium_normalisation_in_a_vector_env_and_the_same_option_is_warned_about(wrapper, option):
    """normalize_obs=True (normalize_reward=True) on a vector env whose envs normalise with Gymnasium's wrapper
    normalises twice: the model warns, as it does for SB3's VecNormalize; either alone is no double."""
    with pytest.warns(UserWarning, match=f"Gymnasium {wrapper.__name__} already normalises what {option}=True would "
                                         "normalise again"):
        rlspeed.PPO(_same_step_vector_env([wrapper]), device="cpu", num_steps=16, batch_size=32, **{option: True})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rlspeed.PPO(_same_step_vector_env(), device="cpu", num_steps=16, batch_size=32, **{option: True})
        rlspeed.PPO(_same_step_vector_env([wrapper]), device="cpu", num_steps=16, batch_size=32)
    assert not [w for w in caught if "normalise again" in str(w.message)]


def test_an_id_whose_envs_normalise_and_the_same_option_is_warned_about():
    """normalize_obs=True on a registered id whose entry point wraps its envs in Gymnasium's NormalizeObservation
    normalised twice without the warning a vector env passed in gets."""
    with pytest.warns(UserWarning, match="SelfNormalisingCartPole-v0's Gymnasium NormalizeObservation already "
                                         "normalises what normalize_obs=True would normalise again"):
        model = rlspeed.PPO("SelfNormalisingCartPole-v0", device="cpu", env_backend="gymnasium", num_envs=2,
                            num_steps=16, batch_size=32, normalize_obs=True)
        model.learn(32, progress_bar=False)


def test_envs_normalising_their_own_observations_say_the_statistics_are_not_the_models(monkeypatch):
    """Gymnasium's NormalizeObservation inside the envs (a registered id's entry point, or the envs of a vector env one
    built) keeps statistics each env starts afresh: evaluation, videos and a loaded model's env see observations
    scaled unlike in training, and the checkpoint holds none. The model says so, naming normalize_obs=True."""
    import rlspeed.envs.gymnasium_env as gymnasium_env

    monkeypatch.setattr(gymnasium_env, "_WARNED_STATISTICS", gymnasium_env._WarnedOnce())
    said = "observations pass through Gymnasium's NormalizeObservation, whose running statistics belong to each env"
    with pytest.warns(UserWarning, match=f"SelfNormalisingCartPole-v0's {said}.*normalize_obs=True in place"):
        model = rlspeed.PPO("SelfNormalisingCartPole-v0", device="cpu", env_backend="gymnasium", num_envs=2,
                            num_steps=16, batch_size=32)
        model.learn(32, progress_bar=False)
    with pytest.warns(UserWarning, match=f"this vector env's {said}"):
        rlspeed.PPO(_same_step_vector_env([gym.wrappers.NormalizeObservation]), device="cpu", num_steps=16,
                    batch_size=32)
    monkeypatch.setattr(gymnasium_env, "_WARNED_STATISTICS", gymnasium_env._WarnedOnce())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rlspeed.PPO(_same_step_vector_env([gym.wrappers.NormalizeReward]), device="cpu", num_steps=16, batch_size=32)
    assert not [w for w in caught if said in str(w.message)]


def test_each_vector_env_normalising_its_own_observations_is_warned_of_once():
    """Every vector env a user passes in shares one placeholder id: once one with NormalizeObservation had been
    warned of, no other vector env in the process was (a notebook's second env, or the next test's). Each env is
    warned of once."""
    said = "this vector env's observations pass through Gymnasium's NormalizeObservation"
    first, second = (_same_step_vector_env([gym.wrappers.NormalizeObservation]) for _ in range(2))
    for env in (first, second):
        with pytest.warns(UserWarning, match=said):
            rlspeed.PPO(env, device="cpu", num_steps=16, batch_size=32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rlspeed.PPO(second, device="cpu", num_steps=16, batch_size=32)
    assert not [w for w in caught if said in str(w.message)]
    first.close()
    second.close()


def test_an_id_whose_envs_normalise_their_rewards_says_the_returns_are_not_the_envs(monkeypatch):
    """An id registered as Gymnasium's docs teach, with NormalizeReward in its additional_wrappers: the episode
    returns in the metrics, evaluate's and a target's were sums of normalised rewards (an evaluation's from
    statistics started anew), without the warning a vector env passed in with the wrapper gets."""
    import rlspeed.envs.gymnasium_env as gymnasium_env

    monkeypatch.setattr(gymnasium_env, "_WARNED_STATISTICS", gymnasium_env._WarnedOnce())
    gym.register("RewardNormalisingCartPole-v0", entry_point="gymnasium.envs.classic_control:CartPoleEnv",
                 max_episode_steps=50, additional_wrappers=(gym.wrappers.NormalizeReward.wrapper_spec(),))
    said = ("RewardNormalisingCartPole-v0's rewards pass through Gymnasium's NormalizeReward, so every episode "
            "return reported .* sums normalised rewards.*normalize_reward=True in place of the wrapper")
    try:
        with pytest.warns(UserWarning, match=said):
            rlspeed.PPO("RewardNormalisingCartPole-v0", device="cpu", env_backend="gymnasium", num_envs=2,
                        num_steps=16, batch_size=32, normalize_reward=False).make_training_env()
    finally:
        del gym.registry["RewardNormalisingCartPole-v0"]


def test_an_id_registered_with_a_vector_entry_point_only_is_one_sentence_naming_entry_point():
    """`gymnasium.register(id, vector_entry_point=...)` without an entry_point: rlspeed makes envs with
    gymnasium.make, and the user got Gymnasium's own "registered but entry_point is not specified" (exit 1 from the
    CLI), which did not say that rlspeed needs an entry_point."""
    from rlspeed.envs import env_spec

    gym.register("VectorOnlyCartPole-v0", max_episode_steps=50,
                 vector_entry_point="gymnasium.envs.classic_control.cartpole:CartPoleVectorEnv")
    said = r"'VectorOnlyCartPole-v0' is registered with a vector_entry_point only.*register .* with entry_point="
    try:
        with pytest.raises(rlspeed.UserError, match=said):
            env_spec("VectorOnlyCartPole-v0")
        with pytest.raises(rlspeed.UserError, match=said):
            rlspeed.make_env("VectorOnlyCartPole-v0", num_envs=2, backend="gymnasium", device="cpu")
    finally:
        del gym.registry["VectorOnlyCartPole-v0"]


def _filmed_cartpole(video_folder):  # (an entry point that films each env it makes)
    env = gym.make("CartPole-v1", render_mode="rgb_array")
    return gym.wrappers.RecordVideo(env, video_folder=video_folder, disable_logger=True)


def test_an_id_whose_envs_film_themselves_is_one_sentence(tmp_path):
    """An id registered with Gymnasium's RecordVideo (in its additional_wrappers, or put on by its entry point): every
    env rlspeed made of it (2 training envs, 3 evaluation envs) wrote rl-video-episode-0.mp4, ... into the one folder,
    over each other's. It is refused in one sentence pointing to rlspeed's own videos, before any env is made."""
    folder = tmp_path / "videos"
    recording = gym.wrappers.RecordVideo.wrapper_spec(video_folder=str(folder), episode_trigger=None,
                                                      step_trigger=None, video_length=0, name_prefix="rl-video",
                                                      fps=None, disable_logger=True, gc_trigger=None)
    gym.register("FilmedCartPole-v0", entry_point="gymnasium.envs.classic_control:CartPoleEnv",
                 kwargs={"render_mode": "rgb_array"}, additional_wrappers=(recording,))
    gym.register("FilmingCartPole-v0", entry_point=_filmed_cartpole, kwargs={"video_folder": str(folder)})
    said = "FilmedCartPole-v0's envs film themselves with Gymnasium's RecordVideo.*rlspeed train --video-every"
    try:
        with pytest.raises(rlspeed.UserError, match=said):
            rlspeed.PPO("FilmedCartPole-v0", device="cpu", env_backend="gymnasium", num_envs=2)
        for backend in ("gymnasium", "gymnasium-async"):
            with pytest.raises(rlspeed.UserError, match=said):
                rlspeed.make_env("FilmedCartPole-v0", num_envs=2, backend=backend, device="cpu")
        assert not folder.exists()
        if importlib.util.find_spec("moviepy") is not None:  # (RecordVideo needs it to be made)
            with pytest.raises(rlspeed.UserError, match="FilmingCartPole-v0's envs film themselves"):
                rlspeed.make_env("FilmingCartPole-v0", num_envs=1, backend="gymnasium", device="cpu")
    finally:
        del gym.registry["FilmedCartPole-v0"], gym.registry["FilmingCartPole-v0"]


@pytest.mark.parametrize("backend", ["gymnasium", "gymnasium-async"])
def test_a_time_limit_among_an_ids_additional_wrappers_is_its_time_limit(backend):
    """`gymnasium.register(..., additional_wrappers=(TimeLimit.wrapper_spec(max_episode_steps=50),))`: the envs end
    their episodes at 50 steps, but the spec read the registration's max_episode_steps (None), so a target_return
    warned that the env had no time limit and evaluation ran episodes to 10,000 steps."""
    from rlspeed.envs import env_spec

    gym.register("WrappedLimitCartPole-v0", entry_point="gymnasium.envs.classic_control:CartPoleEnv",
                 additional_wrappers=(gym.wrappers.TimeLimit.wrapper_spec(max_episode_steps=50),))
    try:
        assert env_spec("WrappedLimitCartPole-v0").max_episode_steps == 50
        env = rlspeed.make_env("WrappedLimitCartPole-v0", num_envs=2, backend=backend, device="cpu")
        assert env.spec.max_episode_steps == 50
        env.close()
    finally:
        del gym.registry["WrappedLimitCartPole-v0"]


def test_a_box2d_env_is_made_under_python_w_error_for_deprecations(tmp_path):
    """Box2D's SWIG-made extension warns about its own types (DeprecationWarnings) as it is imported: raised as errors
    (`python -W error::DeprecationWarning`, a test suite's filter) they crashed the interpreter inside the import, a
    segmentation fault without a sentence, on the first LunarLander or BipedalWalker env rlspeed made."""
    pytest.importorskip("Box2D")
    import subprocess

    script = ("from rlspeed.envs import make_env\n"
              "make_env('LunarLander-v3', num_envs=1, device='cpu').close()\n"
              "print('made')\n")
    done = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", script], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert (done.returncode, done.stdout.strip()) == (0, "made"), done.stderr[-2000:]


@pytest.mark.parametrize("key, value", [("final_obs", math.nan), ("final_info", 1.0)])
def test_an_envs_own_info_key_that_gymnasiums_vector_envs_keep_is_one_sentence(key, value):
    """An env whose own info has `final_obs` or `final_info`, the keys Gymnasium's vector envs (a vector env you
    build, the gymnasium-async backend) keep for an episode's end: merged with theirs, every row read as an episode
    that ended with that value (NaN: "a NaN or infinite observation or reward", of an env whose observations and
    rewards are finite), or a traceback ("truth value of an array is ambiguous"). Now one sentence naming the key."""
    class OwnKey(gym.Env):
        observation_space, action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32), gym.spaces.Discrete(2)

        def reset(self, seed=None, options=None):
            super().reset(seed=seed)
            return np.zeros(2, np.float32), {}

        def step(self, action):
            return np.zeros(2, np.float32), 1.0, False, False, {key: value}

    # (a SyncVectorEnv under a vector wrapper is stepped as a whole, as an AsyncVectorEnv is: rlspeed steps a bare
    # one env by env)
    env = gym.wrappers.vector.RecordEpisodeStatistics(
        gym.vector.SyncVectorEnv([OwnKey] * 2, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP))
    model = rlspeed.PPO(env, seed=0, device="cpu", num_steps=16, batch_size=32)
    with pytest.raises(rlspeed.UserError, match=rf"gives info\['{key}'\] of its own.*rename that key"):
        model.learn(32, progress_bar=False)


class _ExtraKey(gym.Env):
    """A Dict observation with a key its observation_space lacks, on the calls `extra_at` names."""

    observation_space = gym.spaces.Dict({"a": gym.spaces.Box(-1.0, 1.0, (2,), np.float32)})
    action_space = gym.spaces.Discrete(2)

    def __init__(self, extra_at=("reset", "step")):
        self.extra_at = extra_at

    def _obs(self, call):
        return {"a": np.zeros(2, np.float32), **({"extra": np.ones(3, np.float32)} if call in self.extra_at else {})}

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return self._obs("reset"), {}

    def step(self, action):
        return self._obs("step"), 1.0, False, False, {}


@pytest.mark.parametrize("call, wrapped", [("reset", False), ("reset", True), ("step", False)])
def test_a_dict_observation_with_a_key_its_space_lacks_is_one_sentence_naming_it(call, wrapped):
    """A vector env's Dict observation with a key its observation_space lacks was taken silently: Gymnasium's batching
    reads the space's keys only, so the key was dropped. Now one sentence naming it, at the reset (an in-process
    vector env, bare or wrapped) or at the first step (one rlspeed steps env by env)."""
    from functools import partial

    venv = gym.vector.SyncVectorEnv([partial(_ExtraKey, (call,))] * 2,
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    env = rlspeed.make_env(gym.wrappers.vector.RecordEpisodeStatistics(venv) if wrapped else venv, device="cpu")
    try:
        with pytest.raises(rlspeed.UserError, match=rf"\.{call}\(\) returned an observation with the key 'extra', "
                                                    r"which its Dict observation_space lacks \(its keys: 'a'\)"):
            env.reset(seed=0)
            env.step(torch.zeros(2, dtype=torch.int64))
    finally:
        env.close()


@pytest.mark.parametrize("backend", ["torch", "gymnasium"])
def test_an_action_outside_a_discrete_space_given_to_an_envs_step_is_the_callers_mistake(backend):
    """Action 7 given to CartPole's step (Discrete(2)) was an EnvStepError, the env's failure (exit code 1), from the
    native env's IndexError or Gymnasium's 'np.int64(7) invalid'; a float action was stepped as its whole part. Both
    are one UserError naming the action space."""
    from rlspeed.envs import _outside_space

    env = rlspeed.make_env("CartPole-v1", num_envs=2, backend=backend, device="cpu")
    try:
        env.reset(seed=0)
        with pytest.raises(rlspeed.UserError, match=r"got the action 7, outside its action space Discrete\(2\)\.$"):
            env.step(torch.tensor([7, 0]))
        with pytest.raises(rlspeed.UserError, match=r"takes whole-number actions for its Discrete\(2\), got a "
                                                    r"torch\.float32 tensor"):
            env.step(torch.tensor([0.5, 1.0]))
        for dtype in (torch.bool, torch.float64, torch.complex64):  # (any dtype without whole numbers)
            with pytest.raises(rlspeed.UserError, match=rf"whole-number actions .*got a {dtype} tensor"):
                env.step(torch.tensor([0, 1], dtype=dtype))
        env.step(torch.tensor([0, 1], dtype=torch.int32))  # (any integer dtype is taken)
    finally:
        env.close()
    space = gym.spaces.MultiDiscrete([3, 2], start=[1, 0])
    assert _outside_space(torch.tensor([[1, 0], [3, 1]]), space) is None
    assert _outside_space(torch.tensor([[1, 0], [0, 1]]), space) == [0, 1]


class _TupleOptionEnv(gym.Env):
    """An env whose option must be a tuple, as highway-env's `config={"observation": {"observation_shape": (h, w)}}`
    (it writes `(stack,) + observation_shape`, which a list refuses); `sizes` stays a list."""

    def __init__(self, config=None, sizes=None):
        shape = (1,) + config["observation"]["shape"]
        assert isinstance(sizes, list), sizes
        self.observation_space = gym.spaces.Box(-1.0, 1.0, shape, np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(self.observation_space.shape, np.float32), {}

    def step(self, action):
        return np.zeros(self.observation_space.shape, np.float32), float(action), True, False, {}


def test_tuple_env_options_come_back_as_tuples_from_a_saved_model(tmp_path):
    """JSON writes tuples as lists: a saved model's env options are given back with the tuples (and lists) the env
    was made with, so a loaded model evaluates on an env that takes only tuples."""
    gym.register(id="rlspeed_test/TupleOption-v0", entry_point=_TupleOptionEnv, max_episode_steps=5)
    options = {"config": {"observation": {"shape": (2, 3)}, "pairs": [(1, 2), [3]]}, "sizes": [1, 2]}
    try:
        model = rlspeed.PPO("rlspeed_test/TupleOption-v0", env_kwargs=options, seed=0, device="cpu", num_envs=1,
                            num_steps=8, batch_size=8)
        model.save(tmp_path / "model")
        # (the file records the tuples' paths, keys and indices from the top, as every rlspeed has written them)
        _, meta = rlspeed.checkpoint.load_checkpoint(tmp_path / "model.safetensors")
        assert sorted(meta["env_kwargs_tuples"]) == [["config", "observation", "shape"], ["config", "pairs", 0]]
        loaded = rlspeed.PPO.load(tmp_path / "model", device="cpu")
        assert loaded.spec.env_kwargs == options
        assert isinstance(loaded.spec.env_kwargs["config"]["pairs"][0], tuple)
        assert isinstance(loaded.spec.env_kwargs["config"]["pairs"][1], list)
        assert loaded.evaluate(episodes=2, seed=0)["lengths"] == [1, 1]
        # a list where the env takes only a tuple: the env's TypeError, and how to write a tuple
        with pytest.raises(rlspeed.UserError, match=r"rejected the options config, sizes: can only concatenate tuple "
                                                    r"\(not \"list\"\) to tuple \(an option it takes as a tuple is "
                                                    r"written !!python/tuple \[a, b\] in --env-kwargs"):
            rlspeed.PPO("rlspeed_test/TupleOption-v0", env_kwargs={"config": {"observation": {"shape": [2, 3]}},
                                                                   "sizes": [1]}, device="cpu")
    finally:
        gym.registry.pop("rlspeed_test/TupleOption-v0", None)


def test_an_env_option_json_would_change_is_not_saved_changed(tmp_path):
    """A dict option keyed by numbers (`{3: (1, 2)}`) was saved as JSON writes it, its keys as text and the tuple
    under one lost: a loaded model made its env with `{"3": [1, 2]}`. It is named as one no checkpoint holds."""
    gym.register(id="rlspeed_test/KeyedOption-v0", entry_point=lambda table: gym.make("Pendulum-v1").unwrapped,
                 max_episode_steps=5)
    try:
        model = rlspeed.PPO("rlspeed_test/KeyedOption-v0", env_kwargs={"table": {3: (1, 2)}}, seed=0, device="cpu",
                            num_envs=1, num_steps=8, batch_size=8)
        with pytest.warns(UserWarning, match=r"The env option table=\{3: \(1, 2\)\} cannot be saved in a checkpoint "
                                             r"\(JSON gives it back as \{'3': \[1, 2\]\}\): a loaded model makes"):
            model.save(tmp_path / "model")
        assert rlspeed.PPO.load(tmp_path / "model", device="cpu", env_kwargs={"table": {3: (1, 2)}}).spec.env_kwargs \
            == {"table": {3: (1, 2)}}
    finally:
        gym.registry.pop("rlspeed_test/KeyedOption-v0", None)


def test_an_env_option_no_checkpoint_holds_is_named_on_one_line_with_how_to_give_it_again(tmp_path):
    """An option that is not JSON (a table of prices for gym-anytrading, a 2-D array here) is named by its type where
    its repr takes many lines (the warning printed the table's first columns over lines), with `load`'s remedy."""
    gym.register(id="rlspeed_test/TableOption-v0", entry_point=lambda table: gym.make("Pendulum-v1").unwrapped,
                 max_episode_steps=5)
    try:
        model = rlspeed.PPO("rlspeed_test/TableOption-v0", env_kwargs={"table": np.zeros((3, 4))}, seed=0,
                            device="cpu", num_envs=1, num_steps=8, batch_size=8)
        with pytest.warns(UserWarning) as record:
            model.save(tmp_path / "model")
        (message,) = [str(warning.message) for warning in record if "cannot be saved" in str(warning.message)]
        assert message == ("The env option table (a ndarray) cannot be saved in a checkpoint (not JSON): a loaded "
                           "model makes rlspeed_test/TableOption-v0 without it (give it again: load(path, "
                           "env_kwargs={'table': ...})).")
        loaded = rlspeed.PPO.load(tmp_path / "model", device="cpu", env_kwargs={"table": np.ones(2)})
        assert loaded.spec.env_kwargs["table"].tolist() == [1.0, 1.0]
    finally:
        gym.registry.pop("rlspeed_test/TableOption-v0", None)


def test_a_retired_mujoco_version_names_the_version_to_use():
    """HalfCheetah-v3 needs the retired mujoco-py: the one sentence names the v5 id Gymnasium registers, with no
    doubled full stop after Gymnasium's own message; an id with no newer version gets no such advice."""
    import gymnasium as gym

    from rlspeed.envs import _dependency_error
    reason = gym.error.DependencyNotInstalled("The mujoco v2 and v3 based environments have been moved (url).")
    message = str(_dependency_error("HalfCheetah-v3", reason))
    assert message.endswith("moved (url); use HalfCheetah-v5, which Gymnasium registers.")
    assert "use" not in str(_dependency_error("HalfCheetah-v5", reason)).split("(url)")[1]
    # (where rlspeed's extra installs what is missing, the newer version needs it too: no advice to use it)
    missing = ModuleNotFoundError("No module named 'mujoco'", name="mujoco")
    assert str(_dependency_error("HalfCheetah-v4", missing)) == ("Cannot make 'HalfCheetah-v4': the Python module "
                                                                 "'mujoco' is not installed: pip install "
                                                                 '"rlspeed[mujoco]".')


@pytest.mark.parametrize("backend", ["torch", "gymnasium"])
def test_an_envs_observation_space_names_single_observation_space(backend):
    """`env.observation_space` / `env.action_space` of an env `make_env` made: a bare "no attribute" before, though a
    Gymnasium vector env has them (batched) and a Stable-Baselines3 VecEnv too (one env's): one sentence naming the
    `single_` spaces rlspeed's envs have."""
    env = rlspeed.make_env("CartPole-v1", num_envs=2, backend=backend, device="cpu")
    try:
        for name in ("observation_space", "action_space"):
            with pytest.raises(AttributeError, match=rf"^an rlspeed env has no {name} .*env\.single_{name} is one "
                                                     r"env's space, and env\.num_envs the number of envs\.$"):
                getattr(env, name)
        assert env.single_observation_space.shape == (4,) and not hasattr(env, "observation_space")
    finally:
        env.close()


def test_the_workers_a_stable_baselines3_close_terminated_are_killed_after_one_bound_for_them_all(monkeypatch):
    """The close waited `WORKER_TERMINATE_WAIT_S` for each terminated worker in turn before killing it: 8 workers
    whose env ignores SIGTERM held it 8 times the bound (40 s). They are terminated together, and the bound is one."""
    import time

    from rlspeed.envs import sb3_env

    waited: list[float] = []

    class IgnoresTermination:  # (a live worker that has not closed its env in time, and ignores SIGTERM)
        sentinel, alive = None, True

        def is_alive(self):
            return self.alive

        def terminate(self):
            pass

        def join(self, timeout=None):
            if timeout is not None and self.alive:
                waited.append(timeout)
                time.sleep(timeout)

        def kill(self):
            self.alive = False

    class Remote:
        def send(self, command):
            pass

        def close(self):
            pass

    class Inner:
        processes = [IgnoresTermination() for _ in range(3)]
        remotes = [Remote() for _ in range(3)]

    for k, process in enumerate(Inner.processes):
        process.sentinel = k
    monkeypatch.setattr(sb3_env, "WORKERS_CLOSE_WAIT_S", 0.0)
    monkeypatch.setattr(sb3_env, "WORKER_TERMINATE_WAIT_S", 0.1)
    sb3_env._close_workers_left(Inner)
    assert Inner.closed and not any(process.alive for process in Inner.processes)
    assert sum(waited) <= 0.1, waited  # (the first waits the bound; those after it, what is left of it: nothing)
