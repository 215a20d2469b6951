"""Hindsight Experience Replay (`her=True`, `rlspeed.buffers.her`): which goals relabelled samples get, their rewards,
checkpoints, refusals, and learning on a goal-conditioned env of a published package (SB3's BitFlippingEnv)."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch

import rlspeed
from rlspeed.buffers.her import HerReplayBuffer
from rlspeed.errors import UserError
from rlspeed.population import Population

N_ENVS, CAPACITY = 2, 23  # (a capacity that is no multiple of the envs: rows of one env move across the wrap)
SPACE = gym.spaces.Dict({key: gym.spaces.Box(-1e6, 1e6, (2,)) for key in ("observation", "achieved_goal",
                                                                         "desired_goal")})


class NoReward(gym.Env):
    """Goal keys, but no compute_reward."""
    observation_space = SPACE
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return SPACE.sample(), {}

    def step(self, action):
        return SPACE.sample(), 0.0, False, False, {}


def _distance_reward(achieved, desired, infos):
    assert len(infos) == len(achieved) and all(info == {} for info in infos)
    return -(np.abs(achieved - desired).sum(-1) > 0).astype(np.float32)


def _filled(lengths: list[list[int]], steps: int | None = None) -> tuple[HerReplayBuffer, dict]:
    """A buffer of two envs whose episodes have `lengths` (per env, in order; the last may run on unfinished when
    `steps` is larger than its episodes) and whose achieved goal after step t of env e is (e, t): which row a goal came
    from can be read off it. Also returns, per (env, step), the (first, last) step of its episode."""
    buffer = HerReplayBuffer(CAPACITY, N_ENVS, SPACE, (), torch.int64, "cpu", compute_reward=_distance_reward,
                             goal_selection_strategy="future")
    ends = [np.cumsum(env) - 1 for env in lengths]
    steps = steps if steps is not None else max(int(sum(env)) for env in lengths)
    episode = {}
    for t in range(steps):
        done = torch.tensor([bool(np.any(ends[e] == t)) for e in range(N_ENVS)])
        for e in range(N_ENVS):
            first = max([int(end) + 1 for end in ends[e] if end < t], default=0)
            later = [int(end) for end in ends[e] if t <= end < steps]
            episode[e, t] = (first, later[0] if later else None)
        achieved = torch.tensor([[e, t] for e in range(N_ENVS)], dtype=torch.float32)
        obs = {"observation": achieved - 1, "achieved_goal": achieved - 1, "desired_goal": torch.full((2, 2), -7.0)}
        next_obs = {"observation": achieved, "achieved_goal": achieved, "desired_goal": torch.full((2, 2), -7.0)}
        buffer.add(obs, torch.zeros(N_ENVS, dtype=torch.int64), torch.full((N_ENVS,), -1.0), next_obs, done,
                   torch.zeros(N_ENVS, dtype=torch.bool))
    return buffer, episode


@pytest.mark.parametrize("strategy", ["future", "final", "episode"])
def test_relabelled_goals_come_from_the_same_episode_as_the_strategy_says(strategy):
    """Across episode ends, the storage's wrap-around and an episode still running: a relabelled row's goal is an
    achieved goal of its own env and episode, at its step or later (future), at the episode's last stored step
    (final; the latest step for a running episode) or anywhere in the part still stored (episode); its reward is
    compute_reward of its achieved goal and that goal; other rows stay as stored."""
    buffer, episode = _filled([[3, 5, 4, 9], [7, 2, 6, 5]], steps=20)
    buffer.strategy = strategy
    batch = buffer.sample(4000, generator=torch.Generator().manual_seed(0))
    achieved = batch["next_obs"]["achieved_goal"]
    env, step = achieved[:, 0].long(), achieved[:, 1].long()
    goal = batch["obs"]["desired_goal"]
    relabelled = goal[:, 0] != -7
    assert 0.75 < relabelled.float().mean() < 0.85  # (n_sampled_goal 4: 4 of 5)
    assert torch.equal(batch["next_obs"]["desired_goal"], goal)
    assert torch.equal(batch["rewards"][~relabelled], torch.full(((~relabelled).sum(),), -1.0))
    oldest = [max(0, -(-(20 * N_ENVS - CAPACITY - e) // N_ENVS)) for e in range(N_ENVS)]
    chosen = {"future": set(), "final": set(), "episode": set()}
    for i in torch.nonzero(relabelled).flatten().tolist():
        e, t = int(env[i]), int(step[i])
        first, last = episode[e, t]
        last = 19 if last is None else last  # (still running: the latest stored step)
        goal_env, goal_step = int(goal[i, 0]), int(goal[i, 1])
        assert goal_env == e
        low = {"future": t, "final": last, "episode": max(first, oldest[e])}[strategy]
        assert low <= goal_step <= last
        assert float(batch["rewards"][i]) == (0.0 if goal_step == t else -1.0)
        chosen[strategy].add((e, t, goal_step))
    if strategy != "final":  # (draws cover the range, not just its ends)
        assert any(t < g < episode[e, t][1] for e, t, g in chosen[strategy] if episode[e, t][1] is not None)


def test_future_goals_are_drawn_uniformly_from_the_rows_step_to_its_episodes_last_step():
    """`future`, as SB3's: a relabelled row at step t of an episode that ended at step `last` takes the achieved goal
    of each step t..last (both included) with probability 1 / (last - t + 1); the episode's last goal among them."""
    buffer, _ = _filled([[4], [4]])  # one finished episode of steps 0..3 per env
    batch = buffer.sample(20_000, generator=torch.Generator().manual_seed(0))
    step = batch["next_obs"]["achieved_goal"][:, 1].long()
    goal = batch["obs"]["desired_goal"]
    relabelled = goal[:, 0] != -7
    for t in range(4):
        goal_steps = goal[relabelled & (step == t), 1].long()
        shares = torch.bincount(goal_steps, minlength=4).float() / len(goal_steps)
        expected = torch.tensor([0.0 if g < t else 1 / (4 - t) for g in range(4)])
        torch.testing.assert_close(shares, expected, rtol=0, atol=0.05)


def test_the_replay_state_round_trips_and_samples_the_same_goals():
    buffer, _ = _filled([[4, 6, 30], [5, 5, 30]], steps=17)
    tensors, meta = buffer.state_dict()
    other, _ = _filled([[1] * 40, [1] * 40], steps=1)
    assert other.load_state_dict(tensors, meta) is None
    one = buffer.sample(64, generator=torch.Generator().manual_seed(3))
    two = other.sample(64, generator=torch.Generator().manual_seed(3))
    for key in ("obs", "next_obs"):
        for part in one[key]:
            assert torch.equal(one[key][part], two[key][part])
    assert torch.equal(one["rewards"], two["rewards"])
    # a plain replay file has no episode bookkeeping: refused (the buffer then refills)
    plain = rlspeed.buffers.ReplayBuffer(CAPACITY, N_ENVS, SPACE, (), torch.int64, "cpu")
    assert "another replay layout" in other.load_state_dict(*plain.state_dict())


def _bit_flipping(n_bits: int, envs: int = 1, continuous: bool = False):
    from stable_baselines3.common.envs import BitFlippingEnv

    return gym.vector.SyncVectorEnv([lambda: BitFlippingEnv(n_bits=n_bits, continuous=continuous,
                                                            max_steps=n_bits)] * envs,
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


DQN_BITS = {"learning_starts": 100, "buffer_size": 20_000, "net_arch": (64,), "batch_size": 64, "gamma": 0.95,
            "exploration_fraction": 0.1, "exploration_final_eps": 0.05, "target_update_interval": 500,
            "learning_rate": 1e-3, "train_freq": 1}


def test_dqn_with_her_solves_bit_flipping_that_it_does_not_solve_without():
    """SB3's BitFlippingEnv with 10 bits: the reward is -1 until every bit matches the goal, which random
    exploration almost never finds in 10 steps; with relabelled goals DQN learns it (deterministic evaluation of 20
    episodes on a separate env)."""
    pytest.importorskip("stable_baselines3")
    from rlspeed.evaluation import evaluate

    results = {}
    # (seeds 0-3 with HER after 3,000 steps: 0.95, 1.0, 1.0 on an AMD EPYC, 0.9, 0.8, 1.0, 1.0 on an Intel Xeon with
    # AMX, whose float sums differ; without, 0.0 for 0 and 1)
    for her in (True, False):
        model = rlspeed.DQN(_bit_flipping(10), seed=1, her=her, **DQN_BITS)
        model.learn(3000, progress_bar=False)
        results[her] = evaluate(model, _bit_flipping(10, envs=20), episodes=20, seed=1)["success_rate"]
        if her:
            assert "Hindsight Experience Replay" in model.report()
    assert results[True] >= 0.75 and results[False] <= 0.1, results


def test_sac_with_her_trains_on_box_actions_and_a_stable_baselines3_vec_env(tmp_path):
    """The continuous bit-flipping env through SB3's DummyVecEnv (its compute_reward called with env_method), and
    a save and resume of the replay."""
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.envs import BitFlippingEnv
    from stable_baselines3.common.vec_env import DummyVecEnv

    def env():
        return DummyVecEnv([lambda: BitFlippingEnv(n_bits=4, continuous=True, max_steps=50)] * 2)

    options = {"her": True, "learning_starts": 16, "batch_size": 16, "net_arch": (16,), "buffer_size": 256,
               "save_replay_buffer": True, "num_envs": 2}
    model = rlspeed.SAC(env(), seed=0, **options)
    model.learn(64, progress_bar=False)
    assert model.buffer.layout == "her"
    model.save(tmp_path / "model")
    resumed = rlspeed.SAC(env(), seed=0, **options)
    resumed.resume(tmp_path / "model")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the envs start fresh episodes on resume, with a warning)
        resumed.learn(8, progress_bar=False)
    # the saved rows and their episodes, those still running ended by the envs' fresh start at the resume
    old, new = model.buffer.episode_ends[:64], resumed.buffer.episode_ends[:64]
    assert torch.equal(new[old >= 0], old[old >= 0])
    assert bool((old < 0).any()) and bool((new[old < 0] == model.buffer._step - 1).all())
    assert torch.equal(resumed.buffer.steps[:64], model.buffer.steps[:64])
    assert torch.equal(resumed.buffer.next_obs["achieved_goal"][:64], model.buffer.next_obs["achieved_goal"][:64])


def test_her_asking_a_stable_baselines3_worker_that_was_killed_names_the_worker():
    """HER calls a SubprocVecEnv's compute_reward in worker 0 (`env_method`) as it samples; a worker killed between
    steps (the OOM killer) made that a bare BrokenPipeError: it names the worker and its exit code, as a step does."""
    pytest.importorskip("stable_baselines3")
    import multiprocessing
    import types

    from stable_baselines3.common.envs import BitFlippingEnv
    from stable_baselines3.common.vec_env import SubprocVecEnv

    from rlspeed.buffers.her import _compute_reward_method

    envs = SubprocVecEnv([lambda: BitFlippingEnv(n_bits=4, continuous=True)],
                         start_method="fork" if "fork" in multiprocessing.get_all_start_methods() else None)
    try:
        method, _ = _compute_reward_method(types.SimpleNamespace(vec_env=envs))
        goals = np.zeros((1, 4), np.float32)
        assert method(goals, goals, [{}]).tolist() == [0.0]
        envs.processes[0].kill()
        envs.processes[0].join()
        with pytest.raises(ChildProcessError, match="^worker 0 exited with code -9; "):
            method(goals, goals, [{}])
    finally:
        for remote in envs.remotes:
            remote.close()


def test_her_is_refused_where_it_cannot_run(tmp_path):
    with pytest.raises(UserError, match="her=True .* needs goal-conditioned observations.*not a Dict"):
        rlspeed.DQN("CartPole-v1", her=True)
    with pytest.raises(UserError, match="her relabels one-step transitions .* n_step is 3"):
        rlspeed.DQN("CartPole-v1", her=True, n_step=3)
    with pytest.raises(UserError, match="goal_selection_strategy must be one of future, final, episode"):
        rlspeed.DQN("CartPole-v1", goal_selection_strategy="last")
    with pytest.warns(rlspeed.errors.UnusedSettingWarning, match="n_sampled_goal=2 has no effect"):
        rlspeed.DQN("CartPole-v1", n_sampled_goal=2)
    with pytest.raises(UserError, match="Populations do not support Hindsight Experience Replay"):
        Population(rlspeed.DQN, "CartPole-v1", seeds=[0, 1], her=True)

    env = gym.vector.SyncVectorEnv([NoReward], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    model = rlspeed.DQN(env, her=True, learning_starts=4, batch_size=4)
    with pytest.raises(UserError, match="needs the env's compute_reward"):
        model.learn(8, progress_bar=False)


def test_a_compute_reward_that_fails_on_a_batch_is_named_as_such():
    """A compute_reward written for one goal (an `if` on the distance) works in the env's own steps and fails only
    on HER's batches: the error says that it was given a batch, and what it raised."""
    def one_goal_reward(achieved, desired, info):
        if np.linalg.norm(achieved - desired, axis=-1) < 0.1:
            return 0.0
        return -1.0

    buffer, _ = _filled([[4], [4]])
    buffer.compute_reward = rlspeed.buffers.her.reward_function(one_goal_reward, torch.device("cpu"))
    with pytest.raises(UserError, match=r"compute_reward failed on a batch of \d+ goals .* shape \(\d+, 2\).*"
                                        r"ValueError: The truth value of an array"):
        buffer.sample(64, generator=torch.Generator().manual_seed(0))


def test_goal_selection_strategy_is_taken_as_stable_baselines3_takes_it():
    """SB3 reads its GoalSelectionStrategy enum, and a name in any case: code written for it keeps its strategy."""
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.her.goal_selection_strategy import GoalSelectionStrategy

    for given, strategy in ((GoalSelectionStrategy.FINAL, "final"), ("Episode", "episode"), ("FUTURE", "future")):
        model = rlspeed.DQN(_bit_flipping(4), her=True, goal_selection_strategy=given)
        assert model.config.goal_selection_strategy == strategy
        buffer = HerReplayBuffer(CAPACITY, N_ENVS, SPACE, (), torch.int64, "cpu", compute_reward=_distance_reward,
                                 goal_selection_strategy=given)  # (the buffer made directly, as SB3's is)
        assert buffer.strategy == strategy


@pytest.mark.parametrize("n_sampled_goal", [-1, -2])
def test_a_her_buffer_of_a_negative_n_sampled_goal_is_refused(n_sampled_goal):
    """n / (n + 1) of the samples are relabelled: -1 would divide by zero, -2 relabel 200% of them."""
    with pytest.raises(UserError, match=f"n_sampled_goal must be >= 0, got {n_sampled_goal}"):
        HerReplayBuffer(CAPACITY, N_ENVS, SPACE, (), torch.int64, "cpu", compute_reward=_distance_reward,
                        n_sampled_goal=n_sampled_goal)


def test_her_behind_sb3s_vec_normalize_is_refused():
    """VecNormalize hands out normalised goals and rewards: compute_reward on them would relabel wrongly."""
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.envs import BitFlippingEnv
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    env = VecNormalize(DummyVecEnv([lambda: BitFlippingEnv(n_bits=4, continuous=True, max_steps=4)]), norm_obs=False)
    model = rlspeed.SAC(env, her=True, learning_starts=4, batch_size=4, net_arch=(8,))
    with pytest.raises(UserError, match="cannot run behind SB3's VecNormalize"):
        model.learn(8, progress_bar=False)


class Goal(gym.Env):
    """Float goals (normalisable) and a compute_reward."""
    observation_space = SPACE
    action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def reset(self, *, seed=None, options=None):
        return SPACE.sample(), {}

    def step(self, action):
        return SPACE.sample(), 0.0, False, False, {}

    def compute_reward(self, achieved, desired, infos):
        return _distance_reward(achieved, desired, infos)


def test_her_on_rlspeeds_observation_normalisation_relabels_raw_goals_and_normalises_each_batch():
    """make_env(..., normalize_obs=True) with her=True (RL-Zoo's FetchReach presets normalise; it was refused): the
    replay stores the env's own observations, relabels goals and computes rewards on them, then normalises the batch's
    observations and goals with the env's running statistics, the model's (SB3's VecNormalize does the same)."""
    vector_env = gym.vector.SyncVectorEnv([Goal], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    model = rlspeed.SAC(rlspeed.make_env(vector_env, normalize_obs=True), her=True, learning_starts=4,
                        batch_size=4, net_arch=(8,), buffer_size=64)
    model.learn(16, progress_bar=False)
    buffer, stats = model.buffer, model.obs_rms
    assert buffer.normalize is not None and stats is not None
    assert float(buffer.obs["desired_goal"][:16].abs().max()) > 1000  # (stored raw: SPACE spans 1e6)
    normalised = buffer.sample(256, generator=torch.Generator().manual_seed(0))
    buffer.normalize, normalize = None, buffer.normalize  # (the same draws, as stored and relabelled)
    raw_batch = buffer.sample(256, generator=torch.Generator().manual_seed(0))
    buffer.normalize = normalize
    assert torch.equal(raw_batch["rewards"], normalised["rewards"])  # (computed on the raw goals)
    assert bool((raw_batch["rewards"] == 0).any())  # (relabelled goals reached: compute_reward saw raw ones)
    for name in ("obs", "next_obs"):
        expected = stats.normalize(raw_batch[name])
        for key in ("observation", "achieved_goal", "desired_goal"):
            torch.testing.assert_close(normalised[name][key], expected[key])
    assert float(normalised["obs"]["desired_goal"].abs().max()) <= 10  # (normalised and clipped, relabelled too)



def test_her_with_normalize_reward_scales_each_batchs_relabelled_rewards():
    """SAC(env, her=True, normalize_reward=True) (RL-Zoo's FetchReach entry, `normalize: True`; it was refused): the
    env hands the replay its own rewards, and each batch's rewards, relabelled ones (compute_reward's) included, are
    scaled with the running return statistics, as SB3's HerReplayBuffer does."""
    vector_env = gym.vector.SyncVectorEnv([Goal], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    model = rlspeed.SAC(vector_env, her=True, normalize_reward=True, learning_starts=4, batch_size=4, net_arch=(8,),
                        buffer_size=64)
    model.learn(16, progress_bar=False)
    rows = model.buffer.sample(256, generator=torch.Generator().manual_seed(0))
    assert bool((rows["rewards"] == 0).any()) and bool((rows["rewards"] != 0).any())  # (relabelled: compute_reward's)
    scaled = model._prepare_normalised(dict(rows))["rewards"]
    expected = (rows["rewards"] / torch.sqrt(model.return_rms.var + 1e-8)).clamp(-10, 10).float()
    torch.testing.assert_close(scaled, expected)
    assert float(model.return_rms.var) != 1.0  # (updated from the env's rewards as they came)


def test_her_with_the_models_normalize_obs_stores_raw_goals_and_normalises_batches():
    """SAC(env, her=True, normalize_obs=True) on a vector env without normalisation (RL-Zoo's FetchReach entry via
    --preset zoo): the model's own normalisation hands the HER replay raw observations, which it normalises per
    batch with the model's statistics."""
    vector_env = gym.vector.SyncVectorEnv([Goal], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    model = rlspeed.SAC(vector_env, her=True, normalize_obs=True, learning_starts=4, batch_size=4, net_arch=(8,),
                        buffer_size=64)
    model.learn(16, progress_bar=False)
    assert model.obs_rms is not None and model.buffer.normalize is not None
    assert float(model.buffer.obs["desired_goal"][:16].abs().max()) > 1000  # (stored raw: SPACE spans 1e6)
    assert float(model.buffer.sample(64)["obs"]["desired_goal"].abs().max()) <= 10


def test_her_hands_the_env_back_normalising_when_learn_ends():
    """learn with her=True makes the normalising env hand out raw observations (`hand_out_raw`) and its policy act on
    them normalised; when learn ends the env normalises again: for its user, and for another model trained on it (a
    SAC without HER stored raw observations while its predict normalised them; it now trains on them normalised)."""
    vector_env = gym.vector.SyncVectorEnv([Goal], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    env = rlspeed.make_env(vector_env, normalize_obs=True)
    small = {"learning_starts": 4, "batch_size": 4, "net_arch": (8,), "buffer_size": 64}
    model = rlspeed.SAC(env, her=True, **small)
    acted = []
    explore = model._explore
    model._explore = lambda obs, *args: acted.append(obs) or explore(obs, *args)
    model.learn(16, progress_bar=False)
    assert acted and all(float(obs["desired_goal"].abs().max()) <= 10 for obs in acted)  # (the policy's: normalised)
    assert float(env.reset()[0]["desired_goal"].abs().max()) <= 10
    other = rlspeed.SAC(env, **small)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the goal env without HER)
        other.learn(16, progress_bar=False)
    # (the env's statistics turn the other model's normalize_obs on: it stores raw observations and trains on them
    # normalised, as it acts)
    assert other.config.normalize_obs and other.obs_rms is env.obs_rms
    rows = other.buffer.sample(16)
    torch.testing.assert_close(other._prepare_normalised(dict(rows))["obs"]["desired_goal"],
                               env.obs_rms.normalize(rows["obs"], env.clip)["desired_goal"])


def test_a_her_replay_of_another_number_of_envs_refills_and_reward_wrappers_are_refused(tmp_path):
    """The rows of env e at step t are t * N + e: a replay saved by N envs cannot be read by M (it crashed, or
    relabelled with goals of other episodes); a reward wrapper's rewards would be mixed with compute_reward's."""
    pytest.importorskip("stable_baselines3")
    options = {"her": True, "learning_starts": 8, "batch_size": 8, "net_arch": (8,), "buffer_size": 256,
               "save_replay_buffer": True}
    model = rlspeed.DQN(_bit_flipping(4, envs=2), seed=0, num_envs=2, **options)
    model.learn(32, progress_bar=False)
    model.save(tmp_path / "model")
    resumed = rlspeed.DQN(_bit_flipping(4, envs=1), seed=0, num_envs=1, **options)
    resumed.resume(tmp_path / "model")
    with pytest.warns(UserWarning, match="stored by 2 envs, and this model has 1"):
        resumed.learn(8, progress_bar=False)
    assert len(resumed.buffer) == 8
    normalised = gym.wrappers.vector.NormalizeReward(_bit_flipping(4))
    with pytest.raises(UserError, match="NormalizeReward changes the rewards"):
        rlspeed.DQN(normalised, her=True, learning_starts=4, batch_size=4).learn(8, progress_bar=False)


def test_a_goal_env_trained_without_her_is_told_of_her_once_and_no_other_run_is():
    """Off-policy training on a goal env (goal keys and compute_reward) with her off names her=True, at the learn
    that makes the replay (not again at a further learn); with her on, on a Dict env without compute_reward, and for
    PPO (HER relabels replayed transitions: on-policy algorithms have none) nothing is said."""
    pytest.importorskip("stable_baselines3")
    small = {"learning_starts": 8, "batch_size": 8, "net_arch": (8,), "buffer_size": 64}

    def notes(model, steps=16):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.learn(steps, progress_bar=False)
        return [str(w.message) for w in caught if "her=True" in str(w.message)]

    model = rlspeed.DQN(_bit_flipping(4), seed=0, **small)
    said = notes(model)
    assert len(said) == 1 and "--set her=true" in said[0] and "goal-conditioned" in said[0]
    assert notes(model) == []  # (the same replay goes on)
    assert notes(rlspeed.SAC(_bit_flipping(4, continuous=True), seed=0, **small)) != []
    assert notes(rlspeed.DQN(_bit_flipping(4), seed=0, her=True, **small)) == []
    assert notes(rlspeed.PPO(_bit_flipping(4), seed=0, num_steps=8, batch_size=8, net_arch=(8,))) == []

    env = gym.vector.SyncVectorEnv([NoReward], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    assert notes(rlspeed.DQN(env, seed=0, **small)) == []
