"""Property tests of the RL maths against textbook references written out plainly here, on random episode boundaries
(terminations, truncations, several envs, ends at a rollout's last step, episodes longer than a rollout), random
discounts and random network shapes: GAE, n-step replay returns (solo and a population's), the frame and HER replay
layouts, running statistics and reward normalisation (solo, across processes, per population member), the LSTM's
segmented sequences and the hand-derived gradients. Skipped where hypothesis is not installed (the `test` extra)."""

from __future__ import annotations

import os
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch

pytest.importorskip("hypothesis")
from conftest import ScriptedEnv, plain_and_fused  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_frame_replay import FrameStacker, ImageStream, buffers, fill, image_buffers  # noqa: E402

from rlspeed import A2C, DQN, PPO, SAC  # noqa: E402
from rlspeed.buffers import ReplayBuffer, gae  # noqa: E402
from rlspeed.buffers import rollout as rollout_module  # noqa: E402
from rlspeed.buffers.her import HerReplayBuffer  # noqa: E402
from rlspeed.envs.wrappers import NormalizeObservation, NormalizeReward, RunningMeanStd  # noqa: E402
from rlspeed.fused.a2c import FusedA2CUpdate  # noqa: E402
from rlspeed.fused.dqn import FusedDQNUpdate  # noqa: E402
from rlspeed.fused.ppo import FusedPPOUpdate  # noqa: E402
from rlspeed.fused.sac import FusedSACUpdate  # noqa: E402
from rlspeed.nn import RecurrentActorCritic, SequenceLayout  # noqa: E402
from rlspeed.population.normalize import MemberNormalize, MemberStatistics  # noqa: E402
from rlspeed.population.offpolicy import MemberReplay  # noqa: E402


def checked(max_examples: int):
    """Settings of a property test: no deadline (a loaded machine), and under CI (`CI` set) the same examples on
    every run, so that a landing is not decided by a newly drawn one (elsewhere each run draws new ones)."""
    return settings(max_examples=max_examples, deadline=None, suppress_health_check=list(HealthCheck),
                    derandomize=bool(os.environ.get("CI")))


DISCOUNTS = st.sampled_from([0.0, 0.5, 0.9, 0.99, 1.0]) | st.floats(0, 1)


@st.composite
def episode_ends(draw, steps: int, num_envs: int) -> tuple[np.ndarray, np.ndarray]:
    """(terminated, done) bool `[steps, num_envs]`: each step of each env goes on, terminates or is truncated."""
    kinds = np.array(draw(st.lists(st.sampled_from([0, 0, 0, 1, 2]), min_size=steps * num_envs,
                                   max_size=steps * num_envs))).reshape(steps, num_envs)
    return kinds == 1, kinds >= 1


@st.composite
def scripts(draw, max_envs: int = 3) -> tuple[torch.Tensor, ...]:
    """A `ScriptedEnv`'s tensors: observations offset and scaled at random, random episode ends."""
    steps, num_envs, dim = draw(st.integers(1, 10)), draw(st.integers(1, max_envs)), draw(st.integers(1, 3))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 10**6)))
    scale, offset = draw(st.sampled_from([1e-2, 1.0, 100.0])), draw(st.sampled_from([0.0, 5.0, -300.0]))
    observations = torch.randn(steps + 1, num_envs, dim, generator=generator) * scale + offset
    final = torch.randn(steps, num_envs, dim, generator=generator) * scale + offset
    rewards = torch.randn(steps, num_envs, generator=generator) * scale
    terminated, done = draw(episode_ends(steps, num_envs))
    return observations, rewards, torch.tensor(terminated), torch.tensor(done & ~terminated), final


# --- GAE -------------------------------------------------------------------------------------------------------

def textbook_gae(rewards, values, next_values, terminated, dones, gamma, gae_lambda):
    """A_t = sum over l >= 0 of (gamma lambda)^l delta_{t+l}, the sum stopping after the episode's last step, with
    delta_s = r_s + gamma V(s'_s) [not terminated] - V(s_s); gamma and lambda a number or one per env."""
    steps, num_envs = rewards.shape
    advantages = np.zeros((steps, num_envs))
    for env in range(num_envs):
        g = gamma[env] if np.ndim(gamma) else gamma
        lam = gae_lambda[env] if np.ndim(gae_lambda) else gae_lambda
        for t in range(steps):
            weight = 1.0
            for s in range(t, steps):
                bootstrap = 0.0 if terminated[s, env] else g * next_values[s, env]
                advantages[t, env] += weight * (rewards[s, env] + bootstrap - values[s, env])
                if dones[s, env]:
                    break
                weight *= g * lam
    return advantages


@st.composite
def gae_rollouts(draw):
    steps, num_envs = draw(st.integers(1, 12)), draw(st.integers(1, 4))
    numbers = st.floats(-10, 10, width=32)

    def array():
        return np.array(draw(st.lists(numbers, min_size=steps * num_envs, max_size=steps * num_envs))
                        ).reshape(steps, num_envs)

    terminated, dones = draw(episode_ends(steps, num_envs))
    if draw(st.booleans()):  # one gamma and lambda per env column (a population's members)
        gamma = np.array(draw(st.lists(DISCOUNTS, min_size=num_envs, max_size=num_envs)))
        gae_lambda = np.array(draw(st.lists(DISCOUNTS, min_size=num_envs, max_size=num_envs)))
    else:
        gamma, gae_lambda = draw(DISCOUNTS), draw(DISCOUNTS)
    return array(), array(), array(), terminated, dones, gamma, gae_lambda


@checked(80)
@given(gae_rollouts(), st.sampled_from(["matrix", "loop"]))
def test_gae_is_the_textbook_sum_of_discounted_deltas(rollout, path):
    """Both code paths, to float64 precision, with one gamma and lambda for all envs or one per env (a population's
    members)."""
    rewards, values, next_values, terminated, dones, gamma, gae_lambda = rollout
    as_tensor = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    limit = rollout_module._MATRIX_GAE_MAX_ELEMENTS
    rollout_module._MATRIX_GAE_MAX_ELEMENTS = 2**62 if path == "matrix" else 0
    try:
        advantages, returns = gae(as_tensor(rewards), as_tensor(values), as_tensor(next_values),
                                  torch.tensor(terminated), torch.tensor(dones),
                                  as_tensor(gamma) if np.ndim(gamma) else gamma,
                                  as_tensor(gae_lambda) if np.ndim(gae_lambda) else gae_lambda)
    finally:
        rollout_module._MATRIX_GAE_MAX_ELEMENTS = limit
    expected = textbook_gae(rewards, values, next_values, terminated, dones, gamma, gae_lambda)
    np.testing.assert_allclose(advantages.numpy(), expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(returns.numpy(), expected + values, rtol=1e-12, atol=1e-12)


# --- n-step replay -------------------------------------------------------------------------------------------------

@checked(60)
@given(st.integers(1, 4), st.integers(1, 5), st.integers(0, 12), st.integers(1, 30), DISCOUNTS, st.data())
def test_n_step_rows_are_the_textbook_returns_across_wraparound_and_restarts(num_envs, n_step, extra, steps, gamma,
                                                                             data):
    """Each stored row of step t: sum_k gamma^k r_{t+k} up to its episode's end or n steps, the next observation and
    terminated flag of its last step, gamma^m; in write order, the newest `capacity` kept; `restart_episodes` stores
    the steps still waiting as shorter transitions."""
    capacity = num_envs + extra
    terminated, dones = data.draw(episode_ends(steps, num_envs))
    restarts = set(data.draw(st.lists(st.integers(0, steps - 1), max_size=3)))
    generator = torch.Generator().manual_seed(data.draw(st.integers(0, 10**6)))
    rewards, next_obs = torch.randn(steps, num_envs, generator=generator), torch.randn(steps, num_envs, 1,
                                                                                     generator=generator)
    buffer = ReplayBuffer(capacity, num_envs, (1,), (), torch.int64, "cpu", n_step=n_step, gamma=gamma)
    expected, waiting = [], []  # rows in write order: (obs, return, next obs, terminated, discount); waiting steps

    def store(window):
        for env in range(num_envs):
            ret, m = 0.0, 0
            for k, s in enumerate(window):
                ret, m = ret + gamma**k * float(rewards[s, env]), k + 1
                if dones[s, env]:
                    break
            last = window[m - 1]
            expected.append((window[0] * num_envs + env, ret, float(next_obs[last, env, 0]),
                             float(terminated[last, env]), gamma**m))

    for t in range(steps):
        ids = torch.arange(num_envs, dtype=torch.float32) + t * num_envs
        buffer.add(ids.unsqueeze(1), ids.long(), rewards[t], next_obs[t], torch.tensor(terminated[t]),
                   torch.tensor(dones[t] & ~terminated[t]))
        waiting.append(t)
        if len(waiting) == n_step:
            store(waiting)
            waiting.pop(0)
        if t in restarts:
            buffer.restart_episodes()
            while waiting:
                store(waiting)
                waiting.pop(0)
    kept = min(len(expected), capacity)
    assert len(buffer) == kept
    for i, (obs, ret, last_obs, term, discount) in enumerate(expected[len(expected) - kept:]):
        row = (len(expected) - kept + i) % capacity
        assert float(buffer.obs[row, 0]) == obs and float(buffer.next_obs[row, 0]) == last_obs
        assert float(buffer.terminated[row]) == term
        assert float(buffer.rewards[row]) == pytest.approx(ret, rel=1e-5, abs=1e-5)
        assert float(buffer.discounts[row]) == pytest.approx(discount, rel=1e-5, abs=1e-7)


@checked(30)
@given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 4), st.integers(1, 6), st.integers(1, 25), st.booleans(),
       st.data())
def test_a_populations_replay_rows_are_each_members_solo_rows(members, num_envs, n_step, capacity_steps, steps, masked,
                                                              data):
    """`MemberReplay` (all members in one storage, each its own gamma) holds, bit for bit, what each member's solo
    `ReplayBuffer` holds: n-step returns cut at terminations and truncations, discounts, masks, wrap-around, and the
    steps waiting for their n-step return when the envs restart (a resume, envs made again after an interrupt: the
    population dropped them, the solo buffer stores them)."""
    gammas = torch.tensor(data.draw(st.lists(DISCOUNTS, min_size=members, max_size=members)), dtype=torch.float32)
    rows = members * num_envs
    terminated, dones = data.draw(episode_ends(steps, rows))
    restarts = set(data.draw(st.lists(st.integers(0, steps - 1), max_size=2)))
    generator = torch.Generator().manual_seed(data.draw(st.integers(0, 10**6)))
    mask_size = 3 if masked else None
    population = MemberReplay(capacity_steps, members, num_envs, 2, 1, gammas, n_step, torch.device("cpu"),
                              mask_size=mask_size)
    solos = [ReplayBuffer(capacity_steps * num_envs, num_envs, (2,), (1,), torch.float32, "cpu", n_step=n_step,
                          gamma=float(gamma), mask_size=mask_size) for gamma in gammas]
    for t in range(steps):
        obs, next_obs = torch.randn(rows, 2, generator=generator), torch.randn(rows, 2, generator=generator)
        actions, rewards = torch.randn(rows, 1, generator=generator), torch.randn(rows, generator=generator)
        masks = torch.rand(rows, 3, generator=generator) < 0.5 if masked else None
        step = (obs, actions, rewards, next_obs, torch.tensor(terminated[t]), torch.tensor(dones[t] & ~terminated[t]),
                masks)
        population.add(*step)
        for k, solo in enumerate(solos):
            solo.add(*(None if value is None else value[k * num_envs:(k + 1) * num_envs] for value in step))
        if t in restarts:
            for buffer in (population, *solos):
                buffer.restart_episodes()
    for k, solo in enumerate(solos):
        assert len(population) == len(solo)
        index = torch.zeros(members, len(solo), dtype=torch.long)
        index[k] = torch.arange(len(solo))
        got = population.sample(index)
        for key, want in solo.gather(torch.arange(len(solo))).items():
            assert torch.equal(got[key][k].reshape(want.shape), want), key


# --- the frame and HER replay layouts ------------------------------------------------------------------------------

@checked(25)
@given(st.sampled_from(["frames", "images"]), st.integers(1, 4), st.integers(0, 40), st.integers(1, 4),
       st.sampled_from(["reset", "zeros"]), st.sampled_from([0.0, 0.05, 0.3, 0.6]), st.integers(0, 1000),
       st.lists(st.tuples(st.integers(1, 12), st.sampled_from(["go on", "restart", "checkpoint", "rows untold"])),
                min_size=1, max_size=5))
def test_observations_stored_once_rebuild_the_dense_rows(layout, num_envs, extra, n_step, padding, end_rate, seed,
                                                         plan):
    """The frame-stack and shared-observation layouts give back the dense layout's rows after any mix of stretches
    of steps, envs restarted outside the steps (whose waiting n-step steps these layouts drop), checkpoint round trips
    and steps without the restarted rows; where the frame reserve ran out, the rows they still hold."""
    capacity = num_envs + extra
    if layout == "frames":
        dense, lean = buffers(capacity, num_envs, n_step, mask_size=4)
        env = FrameStacker(num_envs, seed=seed, padding=padding, end_rate=end_rate)
        new = lambda: buffers(capacity, num_envs, n_step, mask_size=4)[1]  # noqa: E731
    else:
        dense, lean = image_buffers(capacity, num_envs, n_step=n_step, mask_size=4)
        env = ImageStream(num_envs, seed=seed, end_rate=end_rate)
        new = lambda: image_buffers(capacity, num_envs, n_step=n_step, mask_size=4)[1]  # noqa: E731
    generator = torch.Generator().manual_seed(seed)
    for steps, then in plan:
        fill(dense, lean, env, steps, give_rows=then != "rows untold", generator=generator)
        if then == "restart":
            env.stacks = np.stack([env._first() for _ in range(num_envs)])
            dense._window.clear()
            lean.restart_episodes()
        elif then == "checkpoint":
            tensors, meta = lean.state_dict()
            lean = new()
            assert lean.load_state_dict(tensors, meta) is None
        assert lean.pos == dense.pos and len(lean) <= len(dense)
        index = (torch.arange(len(lean)) + lean.pos - len(lean)) % capacity
        want, got = dense.gather(index), lean.gather(index)
        assert all(torch.equal(want[key], got[key]) for key in want)


def _goal_reward(achieved, desired, infos):
    return -(np.abs(achieved - desired).sum(-1) > 0).astype(np.float32)


@checked(30)
@given(st.integers(1, 3), st.integers(0, 20), st.integers(1, 30), st.sampled_from(["future", "final", "episode"]),
       st.data())
def test_her_goals_come_from_the_rows_own_stored_episode(num_envs, extra, steps, strategy, data):
    """Random episode ends, restarts and capacities: a relabelled goal is an achieved goal still stored, of the same
    env and episode (future: at the row's step or later; final: the episode's last step stored so far), with
    compute_reward's reward; the other rows are as stored."""
    space = gym.spaces.Dict({key: gym.spaces.Box(-1e6, 1e6, (2,))
                             for key in ("observation", "achieved_goal", "desired_goal")})
    capacity = num_envs + extra
    buffer = HerReplayBuffer(capacity, num_envs, space, (), torch.int64, "cpu", compute_reward=_goal_reward,
                             goal_selection_strategy=strategy)
    terminated, dones = data.draw(episode_ends(steps, num_envs))
    restarts = set(data.draw(st.lists(st.integers(0, steps - 1), max_size=2)))
    episode, running = {}, [0] * num_envs  # (env, step) -> the step its episode started at
    for t in range(steps):
        for env in range(num_envs):
            episode[env, t] = running[env]
        achieved = torch.tensor([[env, t] for env in range(num_envs)], dtype=torch.float32)
        goals = torch.full((num_envs, 2), -7.0)
        buffer.add({"observation": achieved - 1, "achieved_goal": achieved - 1, "desired_goal": goals},
                   torch.zeros(num_envs, dtype=torch.int64), torch.full((num_envs,), -1.0),
                   {"observation": achieved, "achieved_goal": achieved, "desired_goal": goals},
                   torch.tensor(terminated[t]), torch.tensor(dones[t] & ~terminated[t]))
        running = [t + 1 if dones[t, env] or t in restarts else running[env] for env in range(num_envs)]
        if t in restarts:
            buffer.restart_episodes()
    stored = {(k % num_envs, k // num_envs) for k in range(max(0, steps * num_envs - capacity), steps * num_envs)}
    batch = buffer.sample(300, generator=torch.Generator().manual_seed(0))
    goal = batch["obs"]["desired_goal"]
    assert torch.equal(batch["next_obs"]["desired_goal"], goal)
    for (env, t), (goal_env, goal_step), reward in zip(batch["next_obs"]["achieved_goal"].long().tolist(),
                                                        goal.long().tolist(), batch["rewards"].tolist()):
        assert (env, t) in stored
        if goal_env == -7:
            assert reward == -1.0
            continue
        assert goal_env == env and (env, goal_step) in stored and episode[env, goal_step] == episode[env, t]
        last = max(s for (e, s) in stored if e == env and episode[e, s] == episode[env, t])
        if strategy == "future":
            assert t <= goal_step <= last
        elif strategy == "final":
            assert goal_step == last
        assert reward == (0.0 if goal_step == t else -1.0)


# --- running statistics and normalisation --------------------------------------------------------------------------

def pooled_moments(rows: np.ndarray, count: float = 1e-4) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance of all `rows` pooled with the statistics' starting point (`count` pseudo-rows of mean 0 and
    variance 1), two-pass in float64."""
    total = count + len(rows)
    mean = rows.sum(0) / total
    return mean, (count * (1.0 + mean**2) + ((rows - mean) ** 2).sum(0)) / total


@checked(60)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=6), st.integers(1, 3), st.sampled_from([0.0, 5.0, -1e3]),
       st.sampled_from([1e-3, 1.0, 1e3]), st.integers(1, 3), st.integers(0, 10**6))
def test_running_statistics_are_the_pooled_moments_in_one_process_and_across_processes(sizes, dim, offset, scale,
                                                                                        ranks, seed):
    """`RunningMeanStd` folded batch by batch equals the pooled moments of every row; so does each process's copy in
    the distributed path (each process's own rows, moments summed over processes at every other flush)."""
    rng = np.random.default_rng(seed)
    batches = [rng.normal(offset, scale, (size, dim)).astype(np.float32) for size in sizes]
    single = RunningMeanStd((dim,))
    processes = [RunningMeanStd((dim,)) for _ in range(ranks)]
    summed = []
    for rms in processes:
        rms.reduce = lambda moments: summed[-1]
    rows = []
    for i, batch in enumerate(batches):
        single.update(torch.tensor(batch))
        for rank, rms in enumerate(processes):
            mine = batch + np.float32(rank)
            rows.append(mine)
            rms.update(torch.tensor(mine))
        if i % 2 or i == len(batches) - 1:
            summed.append(sum(rms._pending for rms in processes))
            for rms in processes:
                rms.flush()
    for rms, data in ((single, np.concatenate(batches)), *((rms, np.concatenate(rows)) for rms in processes)):
        mean, var = pooled_moments(data.astype(np.float64))
        np.testing.assert_allclose(rms.mean.numpy(), mean, rtol=1e-9, atol=1e-9 * (scale + ranks))
        np.testing.assert_allclose(rms.var.numpy(), var, rtol=1e-6)
        assert float(rms.count) == pytest.approx(1e-4 + len(data), rel=1e-12)


@checked(60)
@given(scripts(), st.sampled_from([0.0, 0.5, 0.99, 1.0]))
def test_reward_normalisation_divides_by_the_std_of_the_discounted_returns_so_far(script, gamma):
    """Stable-Baselines3's VecNormalize: each env's return G <- gamma G + r is folded into the statistics, the reward
    divided by sqrt(var + 1e-8) and clipped to 10, and G restarts from 0 after a termination or a truncation."""
    observations, rewards, terminated, truncated, final = script
    env = NormalizeReward(ScriptedEnv(*script), gamma=gamma)
    env.reset()
    returns, seen = np.zeros(rewards.shape[1]), []
    for t in range(rewards.shape[0]):
        _, scaled, *_ = env.step(None)
        returns = gamma * returns + rewards[t].double().numpy()
        seen.extend(returns)
        _, var = pooled_moments(np.array(seen))
        expected = np.clip(rewards[t].double().numpy() / np.sqrt(var + 1e-8), -10, 10)
        np.testing.assert_allclose(scaled.double().numpy(), expected, rtol=2e-5, atol=1e-6)
        returns[(terminated[t] | truncated[t]).numpy()] = 0.0


@checked(20)
@given(scripts(max_envs=2), st.integers(1, 3), st.sampled_from([(True, True), (True, False), (False, True)]),
       st.data())
def test_population_normalisation_is_each_members_solo_normalisation(script, members, which, data):
    """`MemberNormalize` over K blocks of rows gives each block what `NormalizeObservation` then `NormalizeReward`
    with that member's gamma give its solo env (observations, final observations, rewards), episode ends included."""
    observations, rewards, terminated, truncated, final = script
    normalize_obs, normalize_reward = which
    num_envs = rewards.shape[1]
    gammas = data.draw(st.lists(st.sampled_from([0.0, 0.9, 0.99, 1.0]), min_size=members, max_size=members))

    def member_script(k):  # each member's env sees data of its own scale
        observations_k, rewards_k, final_k = (x * (k + 1) + k for x in (observations, rewards, final))
        return observations_k, rewards_k, terminated, truncated, final_k

    solo_steps = []
    for k in range(members):
        env = ScriptedEnv(*member_script(k))
        env = NormalizeObservation(env) if normalize_obs else env
        env = NormalizeReward(env, gamma=gammas[k]) if normalize_reward else env
        first, _ = env.reset()
        outputs = [(first, None, None)]
        for _ in range(rewards.shape[0]):
            obs, reward, _, _, info = env.step(None)
            outputs.append((obs, reward, info["final_obs"]))
        solo_steps.append(outputs)
    scripts_ = [member_script(k) for k in range(members)]
    joined = ScriptedEnv(*(torch.cat([s[i] for s in scripts_], dim=1) for i in range(5)))
    statistics = MemberStatistics.fresh(members, (observations.shape[2],), normalize_obs, normalize_reward,
                                        torch.device("cpu"))
    env = MemberNormalize(joined, num_envs, statistics, torch.tensor(gammas) if normalize_reward else None)
    first, _ = env.reset()
    assert torch.equal(first, torch.cat([steps[0][0] for steps in solo_steps]))
    for t in range(1, rewards.shape[0] + 1):
        obs, reward, _, _, info = env.step(None)
        for got, i in ((obs, 0), (reward, 1), (info["final_obs"], 2)):
            torch.testing.assert_close(got, torch.cat([steps[t][i] for steps in solo_steps]), rtol=1e-6, atol=1e-6)


# --- recurrent sequences -------------------------------------------------------------------------------------------

@checked(20)
@given(st.integers(1, 9), st.integers(1, 5), st.integers(1, 4), st.integers(1, 6), st.data())
def test_segmented_lstm_runs_equal_the_step_by_step_reference(steps, columns, obs_dim, hidden, data):
    """Any pattern of episode starts (one-step segments, a start at the last step, columns without any): the fused
    per-segment LSTM calls give the step-by-step loop's features."""
    starts = torch.tensor(data.draw(st.lists(st.booleans(), min_size=steps * columns,
                                             max_size=steps * columns))).view(steps, columns)
    torch.manual_seed(data.draw(st.integers(0, 1000)))
    policy = RecurrentActorCritic(obs_dim, 2, True, lstm_hidden_size=hidden, hidden=(4,))
    obs = torch.randn(steps, columns, obs_dim)
    state = torch.randn(4, columns, hidden) * (~starts[0]).float().view(1, -1, 1)  # (stored: reset at starts)
    layout = SequenceLayout(starts, torch.device("cpu"))
    assert layout.num_segments == columns + int(starts[1:].sum())
    torch.testing.assert_close(policy.sequence_features(obs, state, starts, layout),
                               policy.sequence_features(obs, state, starts), rtol=1e-5, atol=1e-6)


# --- hand-derived gradients ----------------------------------------------------------------------------------------

NET_ARCH = st.lists(st.integers(1, 24), min_size=1, max_size=3).map(tuple)
ACTIVATION = st.sampled_from(["tanh", "relu"])


def _pair(algo, env_id, fused_type, **config):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return plain_and_fused(algo, env_id, fused_type, env_backend="torch", **config)


def _assert_gradient_is_autograds(plain, fused, module_name, batch):
    loss, _ = plain._loss(*batch)
    expected = torch.autograd.grad(loss, list(getattr(plain, module_name).parameters()))
    fused._update_step.hand_derived.gradient(*batch)
    for (name, param), grad in zip(getattr(fused, module_name).named_parameters(), expected):
        # (float32 rounding is relative to the tensor's largest entries: an entry near 0 beside entries of 30, from
        # tanh's 1 - y**2 near |y| = 1, differs by ~1e-6 between two orders of the same products)
        scale = max(1.0, grad.abs().max().item())
        torch.testing.assert_close(param.grad, grad, rtol=1e-4, atol=1e-6 * scale, msg=name)


def _observations_and_actions(model, batch, generator):
    obs = 3 * torch.randn(batch, model.spec.obs_dim, generator=generator)
    if model.spec.discrete:
        return obs, torch.randint(0, model.spec.action_dim, (batch,), generator=generator)
    return obs, 2 * torch.randn(batch, model.spec.action_dim, generator=generator)


@checked(10)
@given(st.sampled_from(["CartPole-v1", "Acrobot-v1", "Pendulum-v1", "MountainCarContinuous-v0"]), NET_ARCH,
       ACTIVATION, st.integers(1, 70), st.floats(0, 0.1), st.floats(0.1, 2), st.sampled_from([None, 0.1, 1.0]),
       st.booleans(), st.floats(0.05, 0.5), st.floats(-2, 1), st.integers(0, 1000))
def test_ppo_hand_derived_gradient_is_autograds_for_any_network(env_id, net_arch, activation, batch, ent_coef, vf_coef,
                                                                clip_range_vf, normalize_advantage, clip_range,
                                                                log_std_init, seed):
    plain, fused = _pair(PPO, env_id, FusedPPOUpdate, net_arch=net_arch, activation=activation, ent_coef=ent_coef,
                         vf_coef=vf_coef, clip_range_vf=clip_range_vf, normalize_advantage=normalize_advantage,
                         log_std_init=log_std_init)
    generator = torch.Generator().manual_seed(seed)
    obs, actions = _observations_and_actions(plain, batch, generator)
    with torch.no_grad():
        log_probs, _, values = plain.policy.evaluate(obs, actions)
    noise = lambda scale: scale * torch.randn(batch, generator=generator)  # noqa: E731
    _assert_gradient_is_autograds(plain, fused, "policy", (obs, actions, log_probs + noise(0.5), values + noise(1.0),
                                                           noise(1.0), values + noise(2.0), torch.tensor(clip_range)))


@checked(15)
@given(st.sampled_from(["CartPole-v1", "Acrobot-v1", "Pendulum-v1", "MountainCarContinuous-v0"]), NET_ARCH,
       ACTIVATION, st.integers(1, 70), st.floats(0, 0.1), st.floats(0.1, 2), st.booleans(), st.integers(0, 1000))
def test_a2c_hand_derived_gradient_is_autograds_for_any_network(env_id, net_arch, activation, batch, ent_coef, vf_coef,
                                                                normalize_advantage, seed):
    plain, fused = _pair(A2C, env_id, FusedA2CUpdate, net_arch=net_arch, activation=activation, ent_coef=ent_coef,
                         vf_coef=vf_coef, normalize_advantage=normalize_advantage)
    generator = torch.Generator().manual_seed(seed)
    obs, actions = _observations_and_actions(plain, batch, generator)
    _assert_gradient_is_autograds(plain, fused, "policy", (obs, actions, torch.randn(batch, generator=generator),
                                                           3 * torch.randn(batch, generator=generator)))


@checked(15)
@given(st.sampled_from(["CartPole-v1", "Acrobot-v1", "MountainCar-v0"]), NET_ARCH, ACTIVATION, st.integers(1, 70),
       st.booleans(), st.sampled_from(["huber", "mse"]), st.integers(0, 1000))
def test_dqn_hand_derived_gradient_is_autograds_for_any_network(env_id, net_arch, activation, batch, double_q, td_loss,
                                                                seed):
    plain, fused = _pair(DQN, env_id, FusedDQNUpdate, net_arch=net_arch, activation=activation, double_q=double_q,
                         td_loss=td_loss)
    with torch.no_grad():  # a target network apart from the online one
        for model in (plain, fused):
            for param in model.q_target.parameters():
                param.mul_(0.5)
    generator = torch.Generator().manual_seed(seed)
    obs, actions = _observations_and_actions(plain, batch, generator)
    _assert_gradient_is_autograds(plain, fused, "q_network", (
        obs, actions, 3 * torch.randn(batch, generator=generator), torch.randn_like(obs),
        (torch.rand(batch, generator=generator) < 0.3).float(),
        0.99 ** torch.randint(1, 4, (batch,), generator=generator).float()))


@checked(10)
@given(NET_ARCH, ACTIVATION, st.integers(1, 4).map(lambda k: 16 * k), st.sampled_from(["auto", 0.1, 0.0]),
       st.integers(1, 4), st.floats(0.001, 1.0), st.sampled_from([{}, {"target_entropy": -3.0}]), st.integers(0, 1000))
def test_sac_hand_derived_step_is_autograds_for_any_network(net_arch, activation, batch, ent_coef, n_critics, tau,
                                                            target_entropy, seed):
    """Critics, actor, temperature and Polyak step; batches of a multiple of 16 rows (the noise is then drawn alike,
    see tests/test_fused_sac.py)."""
    plain, fused = _pair(SAC, "Pendulum-v1", FusedSACUpdate, learning_rate=1e-3, net_arch=net_arch,
                         activation=activation, ent_coef=ent_coef, n_critics=n_critics, tau=tau, **target_entropy)
    fused._update_step.hand_derived.metrics_every = 1
    generator = torch.Generator().manual_seed(seed)
    batch = {"obs": torch.randn(batch, 3, generator=generator),
             "actions": torch.rand(batch, 1, generator=generator) * 2 - 1,
             "rewards": 3 * torch.randn(batch, generator=generator),
             "next_obs": torch.randn(batch, 3, generator=generator),
             "terminated": (torch.rand(batch, generator=generator) < 0.1).float(),
             "discounts": 0.99 ** torch.randint(1, 4, (batch,), generator=generator).float()}
    torch.manual_seed(seed)
    expected = plain._update(batch)
    torch.manual_seed(seed)
    got = fused._update(batch)
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-4, atol=1e-5, msg=key)
    for modules in ((plain._params, fused._params), (list(plain.critic_target.parameters()),
                                                      list(fused.critic_target.parameters()))):
        for want, have in zip(*modules):
            torch.testing.assert_close(have, want, rtol=1e-4, atol=1e-5)
