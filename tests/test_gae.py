"""GAE: the vectorised `rlspeed.buffers.gae` against a plain per-env backwards loop, on both of its code paths."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rlspeed
from rlspeed.buffers import gae
from rlspeed.buffers import rollout as rollout_module
from rlspeed.envs.base import EnvWrapper


def reference_gae(rewards, values, next_values, terminated, dones, gamma, gae_lambda):
    """Textbook GAE, one env at a time, backwards, in float64 numpy."""
    rewards, values, next_values = (np.asarray(x, dtype=np.float64) for x in (rewards, values, next_values))
    terminated, dones = np.asarray(terminated, dtype=bool), np.asarray(dones, dtype=bool)
    steps, num_envs = rewards.shape
    advantages = np.zeros((steps, num_envs))
    for env in range(num_envs):
        next_advantage = 0.0
        for t in reversed(range(steps)):
            bootstrap = 0.0 if terminated[t, env] else gamma * next_values[t, env]
            delta = rewards[t, env] + bootstrap - values[t, env]
            carry = 0.0 if dones[t, env] else gamma * gae_lambda * next_advantage
            next_advantage = delta + carry
            advantages[t, env] = next_advantage
    return advantages, advantages + values


def random_rollout(steps, num_envs, seed, dtype=torch.float64):
    """Random rewards/values; ~5% terminations and ~5% truncations (done, not terminated: they bootstrap)."""
    generator = torch.Generator().manual_seed(seed)
    rewards = torch.randn(steps, num_envs, generator=generator, dtype=dtype)
    values = torch.randn(steps, num_envs, generator=generator, dtype=dtype)
    next_values = torch.randn(steps, num_envs, generator=generator, dtype=dtype)
    draw = torch.rand(steps, num_envs, generator=generator)
    terminated = draw < 0.05
    truncated = (draw >= 0.05) & (draw < 0.10)
    return rewards, values, next_values, terminated, terminated | truncated


def assert_matches_reference(rollout, gamma, gae_lambda, atol):
    advantages, returns = gae(*rollout, gamma, gae_lambda)
    expected_advantages, expected_returns = reference_gae(*(x.numpy() for x in rollout), gamma, gae_lambda)
    assert advantages.shape == returns.shape == rollout[0].shape
    assert advantages.dtype == rollout[0].dtype
    np.testing.assert_allclose(advantages.numpy(), expected_advantages, rtol=0, atol=atol)
    np.testing.assert_allclose(returns.numpy(), expected_returns, rtol=0, atol=atol)


@pytest.mark.parametrize("path", ["matrix", "loop"])
@pytest.mark.parametrize(("steps", "num_envs"), [(1, 1), (2, 3), (17, 5), (128, 8)])
@pytest.mark.parametrize(("gamma", "gae_lambda"), [(0.99, 0.95), (0.9, 1.0), (1.0, 0.0)])
def test_gae_matches_reference_loop(monkeypatch, path, steps, num_envs, gamma, gae_lambda):
    # Force one code path: the [T, T, N] matrix everywhere, or the reverse scan everywhere.
    monkeypatch.setattr(rollout_module, "_MATRIX_GAE_MAX_ELEMENTS", 2**62 if path == "matrix" else 0)
    rollout = random_rollout(steps, num_envs, seed=steps * 1000 + num_envs)
    assert_matches_reference(rollout, gamma, gae_lambda, atol=1e-5)


def test_gae_float32_matches_reference():
    assert_matches_reference(random_rollout(256, 16, seed=1, dtype=torch.float32), 0.99, 0.95, atol=1e-4)


def test_gae_large_rollout_takes_the_fallback_path_and_matches(monkeypatch):
    steps, num_envs = 300, 200
    assert steps * steps * num_envs > 2**24 > 128 * 128 * 8
    rollout = random_rollout(steps, num_envs, seed=2)
    assert_matches_reference(rollout, 0.99, 0.95, atol=1e-5)  # default threshold: the reverse scan
    monkeypatch.setattr(rollout_module, "_MATRIX_GAE_MAX_ELEMENTS", 2**62)
    assert_matches_reference(rollout, 0.99, 0.95, atol=1e-5)  # the same rollout through the [T, T, N] matrix


@pytest.mark.parametrize("path", ["matrix", "loop"])
@pytest.mark.parametrize(("terminated_middle", "expected_advantages"), [
    # Truncated at t=1: bootstraps from V(final_obs)=4 but does not carry the t=2 advantage back.
    #   delta = [1 + .9*1 - .5, 2 + .9*4 - 1, 3 + .9*2 - 1.5] = [1.4, 4.6, 3.3]
    #   A2 = 3.3; A1 = 4.6 (done); A0 = 1.4 + .9*.8*4.6 = 4.712
    (False, [4.712, 4.6, 3.3]),
    # Terminated at t=1: no bootstrap either. delta1 = 2 - 1 = 1; A1 = 1; A0 = 1.4 + .72*1 = 2.12
    (True, [2.12, 1.0, 3.3]),
])
def test_gae_hand_computed_tiny_case(monkeypatch, path, terminated_middle, expected_advantages):
    monkeypatch.setattr(rollout_module, "_MATRIX_GAE_MAX_ELEMENTS", 2**62 if path == "matrix" else 0)
    rewards = torch.tensor([[1.0], [2.0], [3.0]])
    values = torch.tensor([[0.5], [1.0], [1.5]])
    next_values = torch.tensor([[1.0], [4.0], [2.0]])
    dones = torch.tensor([[False], [True], [False]])
    terminated = dones if terminated_middle else torch.zeros_like(dones)
    advantages, returns = gae(rewards, values, next_values, terminated, dones, gamma=0.9, gae_lambda=0.8)
    expected = torch.tensor(expected_advantages).unsqueeze(1)
    torch.testing.assert_close(advantages, expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(returns, expected + values, rtol=0, atol=1e-5)


@pytest.mark.parametrize("path", ["matrix", "loop"])
def test_an_inf_delta_does_not_reach_later_steps(monkeypatch, path):
    """An inf reward makes its own step's advantage inf; the steps after it (a later episode) stay finite."""
    monkeypatch.setattr(rollout_module, "_MATRIX_GAE_MAX_ELEMENTS", 2**62 if path == "matrix" else 0)
    steps = 6
    rewards = torch.ones(steps, 2)
    rewards[1, 0] = float("inf")
    values, next_values = torch.zeros(steps, 2), torch.zeros(steps, 2)
    dones = torch.zeros(steps, 2, dtype=torch.bool)
    dones[2, 0] = True  # env 0's first episode ends at t=2, a new one starts at t=3
    advantages, _ = gae(rewards, values, next_values, dones, dones, gamma=0.99, gae_lambda=0.95)
    assert torch.isinf(advantages[:2, 0]).all()
    finite = gae(torch.ones(steps, 2), values, next_values, dones, dones, gamma=0.99, gae_lambda=0.95)[0]
    torch.testing.assert_close(advantages[2:, 0], finite[2:, 0])
    torch.testing.assert_close(advantages[:, 1], finite[:, 1])


@pytest.mark.parametrize("path", ["matrix", "loop"])
def test_float64_rollouts_get_float64_advantages(monkeypatch, path):
    """gamma * lambda is applied in the rollout's dtype: 0.5 * 0.9 was rounded to float32 (0.44999998807907104)."""
    monkeypatch.setattr(rollout_module, "_MATRIX_GAE_MAX_ELEMENTS", 2**62 if path == "matrix" else 0)
    rollout = random_rollout(9, 3, seed=3)
    advantages, returns = gae(*rollout, 0.5, 0.9)
    expected_advantages, expected_returns = reference_gae(*(x.numpy() for x in rollout), 0.5, 0.9)
    np.testing.assert_allclose(advantages.numpy(), expected_advantages, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(returns.numpy(), expected_returns, rtol=1e-12, atol=1e-12)


class _Chunked(EnvWrapper):
    """Truncates row 0's learning episode every 4th step without its env restarting it (its next observation goes
    on in the same episode, and is not among the env's `final_rows`)."""

    steps = cuts = 0

    def step(self, actions):
        obs, reward, terminated, truncated, info = self.env.step(actions)
        self.steps += 1
        cut = torch.zeros_like(truncated)
        cut[0] = self.steps % 4 == 0
        cut &= ~(terminated | truncated)
        self.cuts += int(cut.sum())
        return obs, reward, terminated, truncated | cut, info


@pytest.mark.parametrize("algo", ["PPO", "A2C"])
@pytest.mark.parametrize(("env_id", "chunked"), [
    ("CartPole-v1", False),  # float vectors: the rollout stores the next observations, valued after it
    ("FrozenLake-v1", False),  # encoded (index) observations: the restarted rows' last ones are valued during it
    ("CartPole-v1", True),
    # (rows a wrapper truncated without a restart: their next observation is the next step's, whose value is taken;
    # they read an unwritten bootstrap slot, 0 in the first rollout)
    ("FrozenLake-v1", True),
])
def test_a_rollouts_advantages_bootstrap_truncations_from_their_last_observation(algo, env_id, chunked):
    """What a learn() rollout hands the update is GAE over what the env returned: a truncated episode (a 3-step time
    limit, or a wrapper's cut) is bootstrapped from V of its true last observation (`info["final_obs"]`, not the
    next episode's first), a terminated one not at all."""
    env = rlspeed.make_env(env_id, num_envs=2, device="cpu", seed=0, backend="gymnasium",
                           env_kwargs={"max_episode_steps": 5 if chunked else 3})
    if chunked:
        env = _Chunked(env)
    model = getattr(rlspeed, algo)(env, device="cpu", seed=0, num_steps=12, gamma=0.9, gae_lambda=0.8,
                                   **({"batch_size": 24} if algo == "PPO" else {}))
    steps = []
    inner_step = env.step

    def recorded(actions):
        result = inner_step(actions)
        steps.append((result[1].clone(), result[2].clone(), result[3].clone(), result[4]["final_obs"].clone()))
        return result

    env.step = recorded
    handed = {}

    def capture(buf, advantages, returns):  # (before any update: the policy that valued the rollout)
        with torch.no_grad():
            final_values = torch.stack([model.policy.value(final) for *_, final in steps])
        handed.update(advantages=advantages.clone(), values=buf.values.clone(), final_values=final_values)
        return {}

    model._update_rollout = capture
    model._start(env, 24)
    model._learn_start, model._schedule_end = 0, 24
    model._train_iteration()
    rewards, terminated, truncated = (torch.stack([step[i] for step in steps]) for i in range(3))
    assert (truncated & ~terminated).any()
    assert not chunked or env.cuts > 0
    expected, _ = reference_gae(rewards.numpy(), handed["values"].numpy(), handed["final_values"].numpy(),
                                terminated.numpy(), (terminated | truncated).numpy(), 0.9, 0.8)
    np.testing.assert_allclose(handed["advantages"].numpy(), expected, rtol=0, atol=1e-5)


class _LostLife(EnvWrapper):
    """Ends row 0's learning episode on every step without its env restarting it, as Atari's lost life does
    (`AtariTraining`): terminated, not among the env's `final_rows`, so no bootstrap value is written for it."""

    def step(self, actions):
        obs, reward, terminated, truncated, info = self.env.step(actions)
        lost = torch.zeros_like(terminated)
        lost[0] = True
        return obs, reward, terminated | (lost & ~(terminated | truncated)), truncated, info


@pytest.mark.parametrize("path", ["matrix", "loop"])
def test_a_terminated_step_never_reads_its_bootstrap_value(monkeypatch, path):
    """A terminated step does not bootstrap, whatever V(final_obs) holds: a NaN or inf there leaves every advantage
    as with 0 (multiplied by 0 it made them all NaN)."""
    monkeypatch.setattr(rollout_module, "_MATRIX_GAE_MAX_ELEMENTS", 2**62 if path == "matrix" else 0)
    rewards, values, next_values, terminated, dones = random_rollout(12, 3, seed=5, dtype=torch.float32)
    assert terminated.any()
    expected = gae(rewards, values, next_values.masked_fill(terminated, 0.0), terminated, dones, 0.9, 0.8)
    for bad in (float("nan"), float("inf")):
        got = gae(rewards, values, next_values.masked_fill(terminated, bad), terminated, dones, 0.9, 0.8)
        for actual, wanted in zip(got, expected):
            torch.testing.assert_close(actual, wanted, rtol=0, atol=0)


def test_lost_lives_after_a_diverged_rollout_train_on():
    """Rows a wrapper terminates without their env restarting them (Atari's lost lives) have no bootstrap value
    written for their step: the slot keeps what an earlier rollout left there, NaN where a diverged policy valued
    it (the numerics guard rolls the policy back, not the rollout storage). That NaN, times 0, made every advantage
    NaN, each later update was rolled back, and the run ended in DivergedError. The slot is not read (such a row
    bootstraps from the next step's value) and GAE selects a terminated step's bootstrap away: with either, no
    update is rolled back."""
    env = _LostLife(rlspeed.make_env("FrozenLake-v1", num_envs=2, device="cpu", seed=0, backend="gymnasium"))
    model = rlspeed.PPO(env, device="cpu", seed=0, num_steps=8, batch_size=16, n_epochs=1)
    model.learn(16, progress_bar=False)
    assert model.buffer.next_obs is None  # (Discrete observations: finished rows' values written during the rollout)
    model.buffer.final_values.fill_(float("nan"))  # (a rollout valued by a diverged policy)
    model.learn(16, progress_bar=False)
    assert model.numerics_report()["rollbacks"] == 0  # (finite weights alone: a rollback restores them too)
    assert all(bool(p.isfinite().all()) for p in model.policy.parameters())


def test_advantages_and_returns_are_sb3s_which_adds_gamma_v_final_obs_to_a_truncated_steps_reward():
    """Stable-Baselines3's rollouts bootstrap a truncation by adding gamma * V(terminal_observation) to that step's
    reward and then cut the episode there; rlspeed keeps the env's reward and bootstraps in GAE from V(final_obs).
    The advantages and returns are the same (a porter's numbers carry over; `model.buffer.rewards` are the env's)."""
    pytest.importorskip("stable_baselines3")
    import gymnasium as gym
    from stable_baselines3.common.buffers import RolloutBuffer as SB3RolloutBuffer

    steps, num_envs, gamma, gae_lambda = 16, 3, 0.9, 0.8
    rewards, values, next_values, terminated, dones = random_rollout(steps, num_envs, seed=7, dtype=torch.float32)
    truncated = dones & ~terminated
    assert truncated.any() and terminated.any()
    # a rollout of one policy: a step that did not end its episode leads to the next step's observation
    after = torch.randn(num_envs, generator=torch.Generator().manual_seed(8))  # V(the observation after the rollout)
    following = torch.cat((values[1:], after.unsqueeze(0)))
    next_values = torch.where(dones, next_values, following)
    advantages, returns = gae(rewards, values, next_values, terminated, dones, gamma, gae_lambda)

    sb3 = SB3RolloutBuffer(steps, gym.spaces.Box(-1, 1, (1,)), gym.spaces.Discrete(2), device="cpu", gamma=gamma,
                           gae_lambda=gae_lambda, n_envs=num_envs)
    starts = torch.cat((torch.ones(1, num_envs, dtype=torch.bool), dones[:-1]))  # (SB3's episode_starts)
    for t in range(steps):
        bootstrapped = rewards[t] + gamma * torch.where(truncated[t], next_values[t], 0.0)  # (SB3's rollout loop)
        sb3.add(np.zeros((num_envs, 1)), np.zeros((num_envs, 1)), bootstrapped.numpy(), starts[t].numpy(),
                values[t].clone(), torch.zeros(num_envs))
    sb3.compute_returns_and_advantage(last_values=after, dones=dones[-1].numpy())
    np.testing.assert_allclose(advantages.numpy(), sb3.advantages, rtol=0, atol=1e-5)
    np.testing.assert_allclose(returns.numpy(), sb3.returns, rtol=0, atol=1e-5)
