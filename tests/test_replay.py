"""Replay buffer: circular storage, uniform sampling, truncation bootstrapping and n-step returns against references."""

from __future__ import annotations

import math
import os
import weakref

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlspeed.buffers import ReplayBuffer


def make_buffer(capacity, num_envs, n_step=1, gamma=0.99, obs_dim=1):
    return ReplayBuffer(capacity, num_envs, (obs_dim,), (), torch.int64, "cpu", n_step=n_step, gamma=gamma)


def add_ids(buffer, ids, terminated=None, truncated=None):
    """Add one step whose obs, action and reward all carry the transition ids `ids` (one per env)."""
    ids = torch.as_tensor(ids, dtype=torch.float32)
    num_envs = ids.shape[0]
    terminated = torch.zeros(num_envs, dtype=torch.bool) if terminated is None else terminated
    truncated = torch.zeros(num_envs, dtype=torch.bool) if truncated is None else truncated
    buffer.add(ids.unsqueeze(1), ids.long(), ids, ids.unsqueeze(1) + 0.5, terminated, truncated)


@pytest.mark.parametrize(("capacity", "num_envs"), [(12, 3), (10, 3), (7, 7), (5, 2)])
def test_wraparound_keeps_the_latest_capacity_transitions(capacity, num_envs):
    buffer = make_buffer(capacity, num_envs)
    written = []
    for step in range(9):
        ids = [step * num_envs + env for env in range(num_envs)]
        add_ids(buffer, ids)
        written += ids
        assert len(buffer) == min(len(written), capacity)
    stored = sorted(buffer.obs[:, 0].long().tolist())
    assert stored == written[-capacity:]  # the oldest rows were overwritten first, none lost or duplicated
    # every field of a row belongs to the same transition
    assert torch.equal(buffer.actions.float(), buffer.obs[:, 0])
    assert torch.equal(buffer.rewards, buffer.obs[:, 0])
    assert torch.equal(buffer.next_obs[:, 0], buffer.obs[:, 0] + 0.5)


@pytest.mark.parametrize(("capacity", "num_envs", "steps", "n_step"),
                         [(50, 3, 4, 1), (10, 3, 2, 1), (7, 2, 5, 1), (20, 2, 3, 3)])
def test_extend_stores_what_step_by_step_adds_store(capacity, num_envs, steps, n_step):
    """`extend` (an iteration's steps stored together) fills the same rows as one `add` per step: on wrap-around,
    with more rows than the capacity (7 < 5 x 2) and with n-step returns."""
    generator = torch.Generator().manual_seed(0)
    by_step, together = make_buffer(capacity, num_envs, n_step), make_buffer(capacity, num_envs, n_step)
    for _ in range(5):
        transition = (torch.randn(steps, num_envs, 1, generator=generator),
                      torch.randint(0, 4, (steps, num_envs), generator=generator),
                      torch.randn(steps, num_envs, generator=generator),
                      torch.randn(steps, num_envs, 1, generator=generator),
                      torch.rand(steps, num_envs, generator=generator) < 0.2,
                      torch.rand(steps, num_envs, generator=generator) < 0.2)
        for t in range(steps):
            by_step.add(*(field[t] for field in transition))
        together.extend(*transition)
        assert (together.pos, len(together)) == (by_step.pos, len(by_step))
    for name in ("obs", "actions", "rewards", "next_obs", "terminated", "discounts"):
        assert torch.equal(getattr(together, name), getattr(by_step, name)), name


def test_sampling_is_uniform_over_stored_rows():
    capacity, num_envs = 50, 5
    buffer = make_buffer(capacity, num_envs)
    for step in range(4):  # 20 of 50 rows filled: samples must come from those only
        add_ids(buffer, [step * num_envs + env for env in range(num_envs)])
    generator = torch.Generator().manual_seed(0)
    draws = torch.cat([buffer.sample(1000, generator=generator)["obs"][:, 0] for _ in range(100)]).long()
    counts = torch.bincount(draws, minlength=20).double()
    assert draws.max() < 20 and counts.min() > 0
    # Pearson chi-square with 19 degrees of freedom: P(chi2 > 50) < 1e-4 for a uniform sampler
    expected = draws.numel() / 20
    chi_square = ((counts - expected) ** 2 / expected).sum().item()
    assert chi_square < 50, chi_square

    for step in range(4, 20):  # full and wrapped: every row equally likely
        add_ids(buffer, [step * num_envs + env for env in range(num_envs)])
    draws = torch.cat([buffer.sample(1000, generator=generator)["obs"][:, 0] for _ in range(100)]).long()
    rows = torch.bincount(draws - 50, minlength=50).double()  # ids 50..99 are the stored ones
    assert draws.min() >= 50 and rows.numel() == 50
    expected = draws.numel() / 50
    assert ((rows - expected) ** 2 / expected).sum().item() < 100  # 49 dof, P(> 100) < 1e-4


def test_batches_drawn_together_are_uniform_and_independent():
    capacity, num_envs = 30, 3
    buffer = make_buffer(capacity, num_envs)
    for step in range(10):
        add_ids(buffer, [step * num_envs + env for env in range(num_envs)])
    generator = torch.Generator().manual_seed(1)
    batches = buffer.sample_batches(400, 25, generator=generator)
    assert len(batches) == 400
    for batch in batches[:3]:
        assert batch["obs"].shape == (25, 1) and batch["actions"].shape == (25,)
        assert torch.equal(batch["rewards"], batch["obs"][:, 0])  # each row is one transition
        assert torch.equal(batch["next_obs"], batch["obs"] + 0.5)
    draws = torch.stack([b["obs"][:, 0] for b in batches]).long()  # [400, 25]
    counts = torch.bincount(draws.flatten(), minlength=30).double()
    expected = draws.numel() / 30
    assert ((counts - expected) ** 2 / expected).sum().item() < 70  # 29 dof, P(> 70) < 1e-4
    # independence: the batches are not copies of one another (400 equal batches of 25 from 30 rows: impossible)
    assert len({tuple(row) for row in draws.tolist()}) == 400


def test_sample_fields_shapes_and_device():
    buffer = ReplayBuffer(100, 4, (3,), (2,), torch.float32, "cpu")
    obs = torch.randn(4, 3)
    buffer.add(obs, torch.rand(4, 2), torch.ones(4), obs + 1, torch.zeros(4, dtype=torch.bool),
               torch.zeros(4, dtype=torch.bool))
    batch = buffer.sample(16)
    assert batch["obs"].shape == batch["next_obs"].shape == (16, 3)
    assert batch["actions"].shape == (16, 2)
    for key in ("rewards", "terminated", "discounts"):
        assert batch[key].shape == (16,) and batch[key].dtype == torch.float32
    assert torch.allclose(batch["discounts"], torch.full((16,), 0.99))


def test_truncated_rows_bootstrap_from_final_obs_terminated_rows_do_not():
    buffer = make_buffer(10, 3)
    obs = torch.tensor([[1.0], [2.0], [3.0]])
    final_obs = torch.tensor([[10.0], [20.0], [30.0]])  # the true last observations (not the reset ones)
    terminated = torch.tensor([True, False, False])
    truncated = torch.tensor([False, True, False])
    buffer.add(obs, torch.zeros(3, dtype=torch.int64), torch.ones(3), final_obs, terminated, truncated)
    assert torch.equal(buffer.next_obs[:3], final_obs)
    assert buffer.terminated[:3].tolist() == [1.0, 0.0, 0.0]  # truncated row 1 keeps its bootstrap
    # the TD target's bootstrap weight: discounts * (1 - terminated)
    assert (buffer.discounts[:3] * (1 - buffer.terminated[:3])).tolist() == pytest.approx([0.0, 0.99, 0.99])


def reference_n_step(rewards, next_obs, terminated, dones, n, gamma):
    """Plain per-env loop: the n-step transition starting at every step t that has n steps after it."""
    steps, num_envs = rewards.shape
    out = []
    for t in range(steps - n + 1):
        for env in range(num_envs):
            ret, m = 0.0, 0
            for k in range(n):
                ret += gamma**k * rewards[t + k, env]
                m = k + 1
                if dones[t + k, env]:
                    break
            last = t + m - 1
            out.append((ret, next_obs[last, env, 0], float(terminated[last, env]), gamma**m))
    return out


@pytest.mark.parametrize(("n_step", "num_envs"), [(1, 2), (3, 4), (5, 1)])
def test_n_step_returns_match_a_plain_loop(n_step, num_envs):
    gamma, steps = 0.9, 40
    generator = torch.Generator().manual_seed(n_step * 10 + num_envs)
    rewards = torch.randn(steps, num_envs, generator=generator)
    draw = torch.rand(steps, num_envs, generator=generator)
    terminated = draw < 0.1
    truncated = (draw >= 0.1) & (draw < 0.2)
    next_obs = torch.randn(steps, num_envs, 1, generator=generator)
    buffer = make_buffer(10_000, num_envs, n_step=n_step, gamma=gamma)
    for t in range(steps):
        ids = torch.full((num_envs,), float(t))
        buffer.add(ids.unsqueeze(1), ids.long(), rewards[t], next_obs[t], terminated[t], truncated[t])
    expected = reference_n_step(rewards.numpy(), next_obs.numpy(), terminated.numpy(),
                                (terminated | truncated).numpy(), n_step, gamma)
    assert len(buffer) == len(expected)
    rows = len(expected)
    np.testing.assert_allclose(buffer.rewards[:rows].numpy(), [e[0] for e in expected], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(buffer.next_obs[:rows, 0].numpy(), [e[1] for e in expected])
    np.testing.assert_allclose(buffer.terminated[:rows].numpy(), [e[2] for e in expected])
    np.testing.assert_allclose(buffer.discounts[:rows].numpy(), [e[3] for e in expected], rtol=1e-6)
    # the stored observation is the one n-step windows start from
    assert buffer.obs[:rows, 0].tolist() == [float(t) for t in range(steps - n_step + 1) for _ in range(num_envs)]


def test_memory_footprint_is_reported():
    buffer = ReplayBuffer(1000, 2, (3,), (1,), torch.float32, "cpu")
    assert buffer.nbytes == 1000 * (4 * (2 * 3 + 3) + 4)
    assert "1,000 transitions" in buffer.describe()
    assert math.isclose(buffer.nbytes / 2**20, float(buffer.describe().split(",")[1].split()[0]), abs_tol=0.05)


def test_dqn_stores_the_mask_of_the_final_observation_for_episodes_that_ended():
    """Taxi-v4 truncates every 200 steps and gives `info["action_mask"]`: the mask stored for a truncated row is the
    one at its final observation (the Gymnasium adapter's `info["final_action_mask"]`), not the next episode's first
    nor all actions, and the masked Double-DQN target maximises over those actions."""
    import gymnasium as gym

    import rlspeed

    model = rlspeed.DQN("Taxi-v4", seed=0, num_envs=2, learning_starts=100, train_freq=4, buffer_size=1024,
                        env_backend="gymnasium", net_arch=(16,))
    model.learn(880, progress_bar=False)  # 440 steps per env: each env reached the 200-step limit at least once
    buffer, size = model.buffer, model.buffer.size
    reference = gym.make("Taxi-v4").unwrapped
    expected = torch.as_tensor(np.stack([reference.action_mask(int(s)) for s in buffer.next_obs[:size]]).astype(bool))
    assert torch.equal(buffer.next_action_masks[:size], expected)
    # truncated rows: the next row of the same env does not start from their next observation, and they bootstrap
    ended = torch.cat((buffer.obs[2:size] != buffer.next_obs[:size - 2], torch.zeros(2, dtype=torch.bool)))
    truncated = torch.nonzero(ended & (buffer.terminated[:size] == 0)).flatten()
    assert len(truncated) >= 2 and not bool(expected[truncated].all(1).all())  # some forbid an action there
    batch = buffer.gather(truncated)
    fields = ("obs", "actions", "rewards", "next_obs", "terminated", "discounts", "next_action_masks")
    with torch.no_grad():
        loss, _ = model._loss(*(batch[key] for key in fields))
        best = model.q_network(batch["next_obs"]).masked_fill(~expected[truncated], -torch.inf).argmax(1)
        target = batch["rewards"] + 0.99 * model.q_target(batch["next_obs"]).gather(1, best[:, None])[:, 0]
        taken = model.q_network(batch["obs"]).gather(1, batch["actions"].long()[:, None])[:, 0]
    torch.testing.assert_close(loss, torch.nn.functional.smooth_l1_loss(taken, target))


def test_a_saved_replay_takes_the_loading_models_discount_or_says_why_it_cannot():
    """One-step rows discount by the loading buffer's gamma (a resume with another gamma trained on the saved
    run's gamma for ever: 1-step discounts are written once); n-step rows summed with another gamma or n, and rows of
    another shape or a float field into integer storage, are refused with the reason."""
    saved = make_buffer(10, 2, gamma=0.99)
    for step in range(7):  # (wrapped: pos 4)
        add_ids(saved, [2 * step, 2 * step + 1])
    loaded = make_buffer(10, 2, gamma=0.5)
    assert loaded.load_state_dict(*saved.state_dict()) is None
    assert torch.equal(loaded.obs, saved.obs) and bool((loaded.discounts == 0.5).all())
    add_ids(loaded, [100, 101])
    assert bool((loaded.discounts == 0.5).all())
    assert "holds 1-step transitions, and this model takes 3-step" in make_buffer(10, 2, n_step=3).load_state_dict(
        *saved.state_dict())
    assert "its obs rows have shape (1,), and this model's (3,)" in make_buffer(10, 2, obs_dim=3).load_state_dict(
        *saved.state_dict())
    continuous = ReplayBuffer(10, 2, (1,), (), torch.float32, "cpu")
    add_ids(continuous, [0.5, 1.5])
    assert "its actions holds torch.float32 values, and this model stores torch.int64" in make_buffer(
        10, 2).load_state_dict(*continuous.state_dict())
    three = make_buffer(10, 2, n_step=3, gamma=0.99)
    for step in range(5):
        add_ids(three, [2 * step, 2 * step + 1])
    assert "summed with gamma 0.99, and this model's gamma is 0.5" in make_buffer(10, 2, n_step=3, gamma=0.5
                                                                                 ).load_state_dict(*three.state_dict())


@pytest.mark.parametrize(("capacity", "steps"), [(20, 3), (20, 7), (6, 7), (4, 2)])
def test_a_saved_replay_fills_a_buffer_of_another_capacity_with_its_newest_transitions_oldest_first(capacity, steps):
    """A buffer of 10 rows (wrapped after 5 steps of 2 envs, or not) loaded into one of another capacity: the newest
    transitions that fit, in the order they were stored, from row 0 on; the next add follows them."""
    saved = make_buffer(10, 2)
    for step in range(steps):
        add_ids(saved, [2 * step, 2 * step + 1])
    written = list(range(2 * steps))[-10:]
    loaded = make_buffer(capacity, 2)
    assert loaded.load_state_dict(*saved.state_dict()) is None
    kept = written[-capacity:]
    assert len(loaded) == len(kept) and loaded.obs[:len(kept), 0].long().tolist() == kept
    assert loaded.actions[:len(kept)].tolist() == kept and loaded.next_obs[:len(kept), 0].tolist() == [
        k + 0.5 for k in kept]
    add_ids(loaded, [100, 101])
    assert sorted(loaded.obs[:len(loaded), 0].long().tolist()) == sorted((kept + [100, 101])[-capacity:])


def test_save_replay_buffer_and_load_replay_buffer_carry_transitions_to_another_model(tmp_path):
    """Stable-Baselines3's `model.save_replay_buffer(path)` / `model.load_replay_buffer(path)`: another model takes
    the transitions (loaded before its first learn, or given as `model.buffer = ...`), and they count towards its
    `learning_starts`, so it updates in a learn too short to collect them; `save_replay_buffer` stays the checkpoint
    flag as a truth value. Files without a buffer, on-policy models and other shapes are refused in one sentence."""
    from rlspeed import DQN, PPO, SAC
    from rlspeed.errors import UserError

    options = {"learning_starts": 300, "buffer_size": 400, "env_backend": "gymnasium"}
    source = DQN("CartPole-v1", seed=0, **options)
    assert not source.save_replay_buffer and source.save_replay_buffer == False  # noqa: E712 (the flag's value)
    source.save_replay_buffer = True
    assert source.save_replay_buffer and DQN("CartPole-v1", save_replay_buffer=True).save_replay_buffer
    source.save_replay_buffer = False
    with pytest.raises(UserError, match="no replay buffer to save yet: learn makes it"):
        source.save_replay_buffer(tmp_path / "early")
    source.learn(500, progress_bar=False)
    path = source.save_replay_buffer(tmp_path / "replay")
    assert path == tmp_path / "replay.safetensors" and not source.save_replay_buffer

    def trains(model) -> bool:
        before = [p.clone() for p in model.q_network.parameters()]
        model.learn(32, progress_bar=False)
        return any(not torch.equal(a, b) for a, b in zip(before, model.q_network.parameters()))

    loaded = DQN("CartPole-v1", seed=1, **options)
    loaded.load_replay_buffer(path)
    assert trains(loaded)
    kept = torch.ones(400, dtype=torch.bool)
    kept[100:132] = False  # (as stored, but for the rows its own 32 steps wrote from the write position on, 500 % 400)
    assert torch.equal(loaded.buffer.obs[kept], source.buffer.obs[kept])
    assert not torch.equal(loaded.buffer.obs[~kept], source.buffer.obs[~kept])
    given = DQN("CartPole-v1", seed=1, **options)
    given.buffer = source.buffer
    assert trains(given) and given.buffer is not source.buffer
    copied = DQN("CartPole-v1", seed=1, **options)
    copied.load_replay_buffer(source.buffer)  # (its rows as they are now: later adds to it stay its own)
    rows = source.buffer.obs.clone()
    source.learn(40, progress_bar=False)
    copied.learn(8, progress_bar=False)
    assert torch.equal(copied.buffer.obs[:100], rows[:100]) and torch.equal(copied.buffer.obs[108:], rows[108:])
    assert not torch.equal(source.buffer.obs[108:140], rows[108:140])
    with pytest.warns(UserWarning, match="no gradient update will run"):
        assert not trains(DQN("CartPole-v1", seed=1, **options))
    source.save(tmp_path / "model")
    for model, argument, message in [
            (DQN("CartPole-v1"), tmp_path / "model", "holds no replay buffer"),
            (PPO("CartPole-v1"), path, "PPO keeps no replay buffer"),
            (DQN("CartPole-v1"), 3, "reads a file .* or takes an rlspeed.buffers.ReplayBuffer, not int")]:
        with pytest.raises(UserError, match=message):
            model.load_replay_buffer(argument)
    pendulum = SAC("Pendulum-v1", learning_starts=0, env_backend="gymnasium")
    pendulum.load_replay_buffer(path)
    with pytest.raises(UserError, match=r"replay.safetensors' cannot fill this model's replay buffer: its obs rows "
                                        r"have shape \(4,\), and this model's \(3,\)"):
        pendulum.learn(8, progress_bar=False)


def test_restart_episodes_stores_the_steps_waiting_for_their_n_step_return_as_shorter_ones():
    """A demonstration added by hand and ended by `restart_episodes()`: its last n - 1 steps, which carry the
    terminal reward, were dropped (5 steps, 3 stored); they are stored as the m-step transitions an episode
    truncated there gives (rewards summed to its end, no bootstrap past a terminal step; else from the last next
    observation, discounted gamma^m)."""
    buffer = make_buffer(20, 1, n_step=3, gamma=0.5)
    rewards = [1.0, 2.0, 4.0, 8.0, 16.0]
    for t, reward in enumerate(rewards):
        buffer.add(torch.tensor([[float(t)]]), torch.tensor([0]), torch.tensor([reward]), torch.tensor([[t + 0.5]]),
                   torch.tensor([t == 4]), torch.tensor([False]))
    assert len(buffer) == 3
    buffer.restart_episodes()
    assert len(buffer) == 5 and buffer.obs[:5, 0].tolist() == [0, 1, 2, 3, 4]
    assert buffer.rewards[:5].tolist() == [1 + 1 + 1, 2 + 2 + 2, 4 + 4 + 4, 8 + 8, 16]
    assert buffer.terminated[:5].tolist() == [0, 0, 1, 1, 1] and buffer.next_obs[:5, 0].tolist() == [2.5, 3.5, 4.5,
                                                                                                     4.5, 4.5]
    unfinished = make_buffer(20, 1, n_step=3, gamma=0.5)  # (no episode end: bootstraps from the last step's next
    for t in range(2):  # observation, over the steps it has)
        unfinished.add(torch.tensor([[float(t)]]), torch.tensor([0]), torch.tensor([1.0]), torch.tensor([[t + 0.5]]),
                       torch.tensor([False]), torch.tensor([False]))
    unfinished.restart_episodes()
    assert unfinished.rewards[:2].tolist() == [1.5, 1.0] and unfinished.discounts[:2].tolist() == [0.25, 0.5]
    assert unfinished.terminated[:2].tolist() == [0, 0] and unfinished.next_obs[:2, 0].tolist() == [1.5, 1.5]


def test_load_replay_buffer_refuses_values_the_spaces_do_not_have_and_keeps_refusing_until_they_fit():
    """Demonstrations holding NaN or infinite values, whose actions a Discrete space does not have (they failed in the
    update's indexing, or a device assert) or whose states a Discrete observation space does not have, Box actions in
    the env's units, and SB3's truncate_last_traj=False are refused in one sentence; a buffer a learn refuses (another
    n_step) is refused again by the next learn, which trained without it."""
    from rlspeed import DQN, SAC
    from rlspeed.errors import UserError

    bad = make_buffer(10, 1, obs_dim=4)
    for action in (0, 5):
        bad.add(torch.zeros(1, 4), torch.tensor([action]), torch.ones(1), torch.zeros(1, 4), torch.tensor([False]),
                torch.tensor([False]))
    with pytest.raises(UserError, match=r"its actions hold values outside CartPole-v1's Discrete\(2\) actions 0..1"):
        DQN("CartPole-v1", device="cpu").load_replay_buffer(bad)
    with pytest.raises(UserError, match=r"truncate_last_traj=False\) would continue the saved episodes"):
        DQN("CartPole-v1", device="cpu").load_replay_buffer(bad, truncate_last_traj=False)
    box = ReplayBuffer(10, 1, (3,), (1,), torch.float32, "cpu")
    box.add(torch.zeros(1, 3), torch.full((1, 1), 2.0), torch.ones(1), torch.zeros(1, 3), torch.tensor([False]),
            torch.tensor([False]))
    with pytest.raises(UserError, match=r"its actions reach 2: the buffer holds actions in the policy's scale"):
        SAC("Pendulum-v1", device="cpu").load_replay_buffer(box)
    nan = make_buffer(10, 1, obs_dim=4)  # (loaded, they ended the first learn in DivergedError, blaming the lr)
    nan.add(torch.tensor([[0.0, float("nan"), 0.0, 0.0]]), torch.tensor([1]), torch.ones(1), torch.zeros(1, 4),
            torch.tensor([False]), torch.tensor([False]))
    with pytest.raises(UserError, match=r"cannot fill this model's replay buffer: its obs hold NaN or infinite values"):
        DQN("CartPole-v1", device="cpu").load_replay_buffer(nan)
    box.rewards[0] = float("inf")
    with pytest.raises(UserError, match=r"its rewards hold NaN or infinite values"):
        SAC("Pendulum-v1", device="cpu").load_replay_buffer(box)
    # (FrozenLake8x8's states in FrozenLake's 16: the update's one-hot encoding failed on them)
    states = ReplayBuffer(10, 1, gym.spaces.Discrete(64), (), torch.int64, "cpu")
    states.add(torch.tensor([8]), torch.tensor([0]), torch.ones(1), torch.tensor([29]), torch.tensor([False]),
               torch.tensor([False]))
    with pytest.raises(UserError, match=r"its next_obs hold values outside FrozenLake-v1's observation space "
                                        r"Discrete\(16\)"):
        DQN("FrozenLake-v1", device="cpu").load_replay_buffer(states)
    three = make_buffer(10, 1, n_step=3, obs_dim=4)
    model = DQN("CartPole-v1", device="cpu", learning_starts=0, batch_size=4)
    model.buffer = three
    for _ in range(2):
        with pytest.raises(UserError, match="the ReplayBuffer given cannot fill .* holds 3-step transitions"):
            model.learn(8, progress_bar=False)


def test_a_resume_with_another_gamma_trains_on_it(tmp_path):
    import warnings

    from rlspeed import DQN

    options = {"seed": 0, "learning_starts": 0, "buffer_size": 200, "batch_size": 32, "save_replay_buffer": True,
               "net_arch": (16,)}
    model = DQN("CartPole-v1", gamma=0.99, **options)
    model.learn(300, progress_bar=False)
    path = model.save(tmp_path / "model")
    resumed = DQN("CartPole-v1", gamma=0.5, **options)
    resumed.resume(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        resumed.learn(10, progress_bar=False)
    assert len(resumed.buffer) == 200 and resumed.buffer.discounts.unique().tolist() == [0.5]
    n_step = DQN("CartPole-v1", gamma=0.99, n_step=3, **options)
    n_step.resume(path)
    with pytest.warns(UserWarning, match="holds 1-step transitions, and this model takes 3-step ones; it refills"):
        n_step.learn(10, progress_bar=False)
    assert len(n_step.buffer) == 10


def test_add_says_what_it_takes_for_numpy_arrays_and_for_another_number_of_rows():
    """NumPy arrays (or SB3's argument order) were an AttributeError about a str's type; K rows for a buffer of N
    envs were stored, and with n_step > 1 every row took env 0's next observation."""
    from rlspeed.errors import UserError

    buffer = make_buffer(10, 1, n_step=2)
    zeros = np.zeros((1, 1), dtype=np.float32)
    with pytest.raises(UserError, match=r"takes torch tensors .* \(not NumPy arrays"):
        buffer.add(zeros, np.zeros(1, dtype=np.int64), np.zeros(1, np.float32), zeros, np.zeros(1, bool),
                   np.zeros(1, bool))
    with pytest.raises(UserError, match=r"one step of all 1 envs .* got \(3,\) and \(3,\)"):
        add_ids(buffer, [1, 2, 3])
    assert len(buffer) == 0



def test_optimize_memory_usage_is_refused_saying_which_observations_are_stored_once():
    """The refusal said rlspeed stored "large images once per transition by itself": a MinAtar buffer of 1,000,000
    (800 MB twice) stays dense at 820 bytes per transition, where SB3's optimize_memory_usage takes 420."""
    from rlspeed import DQN
    from rlspeed.errors import UserError

    with pytest.raises(UserError, match=r"where storing them twice would take 1 GiB or more.*vector observations are "
                                        r"stored whole \(model.report\(\) says which\)"):
        DQN("CartPole-v1", device="cpu", optimize_memory_usage=True)


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads the resident set size from /proc")
def test_a_large_host_buffer_takes_memory_as_it_fills_not_its_capacity_up_front():
    def resident_mib():
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    before = resident_mib()
    buffer = ReplayBuffer(400_000, 2, (128,), (), torch.int64, "cpu")  # 2 x 400,000 x 128 float32: 391 MiB of obs
    assert buffer.nbytes > 390 * 2**20
    buffer.add(torch.ones(2, 128), torch.ones(2, dtype=torch.int64), torch.ones(2), torch.ones(2, 128),
               torch.zeros(2, dtype=torch.bool), torch.zeros(2, dtype=torch.bool))
    assert resident_mib() - before < 100  # (Stable-Baselines3's numpy buffers grow the same way)
    assert buffer.obs[:2].eq(1).all() and not buffer.obs[2:].any() and not buffer.rewards[2:].any()


def test_loaded_transitions_end_the_uniform_warm_up_as_they_start_the_updates():
    """Demonstrations loaded before the first learn count towards `learning_starts` for the uniform random actions
    too, not only for the updates: with as many loaded as learning_starts, the run's own steps follow the policy (they
    were uniform for learning_starts steps while the updates already ran on them)."""
    from rlspeed import DQN, SAC

    demos = make_buffer(100, 1, obs_dim=4)
    for _ in range(100):
        add_ids(demos, [0])
    dqn = DQN("CartPole-v1", seed=0, learning_starts=100, train_freq=40, batch_size=8, net_arch=(8,),
              exploration_initial_eps=0.0, exploration_final_eps=0.0, env_backend="gymnasium")
    with torch.no_grad():  # (greedy: always action 1)
        dqn.q_network.body[2].weight.zero_()
        dqn.q_network.body[2].bias.copy_(torch.tensor([0.0, 1.0]))
    dqn.load_replay_buffer(demos)
    dqn.learn(40, progress_bar=False)
    assert len(dqn.buffer) == 140 and dqn.buffer.actions[100:140].tolist() == [1] * 40
    box = ReplayBuffer(100, 1, (3,), (1,), torch.float32, "cpu")
    for _ in range(100):
        box.add(torch.zeros(1, 3), torch.zeros(1, 1), torch.ones(1), torch.zeros(1, 3), torch.tensor([False]),
                torch.tensor([False]))
    sac = SAC("Pendulum-v1", seed=0, learning_starts=100, train_freq=40, batch_size=8, net_arch=(8,),
              env_backend="gymnasium")
    with torch.no_grad():  # (the policy's actions: tanh(0.5), give or take e^-20)
        sac.actor.net[2].weight.zero_()
        sac.actor.net[2].bias.copy_(torch.tensor([0.5, -20.0]))
    sac.load_replay_buffer(box)
    sac.learn(40, progress_bar=False)
    assert torch.allclose(sac.buffer.actions[100:140], torch.full((40, 1), math.tanh(0.5)), atol=0.02)


def test_steps_a_populations_host_replay_has_yet_to_fill_count_as_taken_for_the_next_buffer(monkeypatch):
    """A population's replay on the host is committed as it fills, as a solo buffer's: a solo buffer made beside it
    (a sweep's next model) counts the steps it has yet to write, and not those it has written."""
    from rlspeed import UserError
    from rlspeed.buffers import replay
    from rlspeed.population.offpolicy import MemberReplay

    monkeypatch.setattr(replay, "_cgroup_available_bytes", lambda: 100 * 2**20)  # (a container's 100 MiB left)
    monkeypatch.setattr(replay, "_HOST_BUFFERS", weakref.WeakSet())  # (no other test's buffer still alive counted)
    # (4 members x 1,875 steps of 1 env, 8,016 bytes per row: 57 MiB, below 80% of 100 MiB alone, as the solo buffer)
    members = MemberReplay(1_875, 4, 1, 1_000, 1, torch.full((4,), 0.99), 1, torch.device("cpu"))
    with pytest.raises(UserError, match="largest replay buffer that fits"):
        ReplayBuffer(7_500, 1, (1_000,), (), torch.int64, "cpu")
    members.written = 1_500  # (4/5 of its steps written: what it takes is in the container's usage from then on)
    assert ReplayBuffer(7_500, 1, (1_000,), (), torch.int64, "cpu").capacity == 7_500


def test_rows_a_host_buffer_has_yet_to_fill_count_as_taken_for_the_next_buffer(monkeypatch):
    """Host buffers commit memory as they fill, so the memory check of a second buffer counts what the first has yet
    to fill: two buffers that each fit alone were both accepted, to fill the memory together later. The buffer of a
    model no longer referenced (kept by a reference cycle until a collection, as a sweep's earlier models) does not
    count."""
    import gc

    from rlspeed import UserError
    from rlspeed.buffers import replay

    monkeypatch.setattr(replay, "_cgroup_available_bytes", lambda: 100 * 2**20)  # (a container's 100 MiB left)
    monkeypatch.setattr(replay, "_HOST_BUFFERS", weakref.WeakSet())  # (no other test's buffer still alive counted)

    def buffer():  # (2 x 1,000 float32 per row: 57 MiB at 7,500 rows, below 80% of 100 MiB alone)
        return ReplayBuffer(7_500, 1, (1_000,), (), torch.int64, "cpu")

    first = buffer()
    with pytest.raises(UserError, match="largest replay buffer that fits"):
        buffer()
    first.cycle = first  # (garbage only a collection frees)
    del first
    assert buffer().capacity == 7_500
    gc.collect()


def test_load_replay_buffer_refuses_returns_of_another_n_step_or_gamma_as_it_is_given():
    """A ReplayBuffer of 1-step demonstrations given to a model of n_step 3 (SAC Pendulum's preset) was taken and
    refused only at the next learn, which makes the model's buffer; the n_step and gamma are known at once: refused
    there, naming the ReplayBuffer to fill or the model to make."""
    from rlspeed import DQN
    from rlspeed.errors import UserError

    one = make_buffer(10, 1, obs_dim=4)
    with pytest.raises(UserError, match=r"holds 1-step transitions, and this model takes 3-step ones with gamma 0\.9 "
                                        r"\(a ReplayBuffer you fill: ReplayBuffer\(\.\.\., n_step=3, gamma=0\.9\); "
                                        r"or make the model with n_step=1\)"):
        DQN("CartPole-v1", device="cpu", n_step=3, gamma=0.9).load_replay_buffer(one)
    three = make_buffer(10, 1, n_step=3, gamma=0.5, obs_dim=4)
    with pytest.raises(UserError, match=r"holds 3-step transitions summed with gamma 0\.5, and this model takes "
                                        r"3-step ones with gamma 0\.9 .* make the model with n_step=3, gamma=0\.5\)"):
        DQN("CartPole-v1", device="cpu", n_step=3, gamma=0.9).load_replay_buffer(three)
    DQN("CartPole-v1", device="cpu", n_step=3, gamma=0.5).load_replay_buffer(three)  # (the same returns: taken)
    DQN("CartPole-v1", device="cpu", gamma=0.5).load_replay_buffer(make_buffer(10, 1, gamma=0.9, obs_dim=4))  # (1-step)


@pytest.mark.parametrize("n_step", [1, 3])
def test_masks_are_given_to_add_exactly_when_the_buffer_keeps_them(n_step):
    """A buffer made with `mask_size` stores each transition's next action masks: a step added without them, or with
    masks to a buffer that keeps none, is a ValueError (a row without its masks would sample whatever row was there
    before), for `add` and `extend` alike; with them, the sampled masks are the ones given."""
    ids = torch.arange(2, dtype=torch.float32)
    step = (ids.unsqueeze(1), ids.long(), ids, ids.unsqueeze(1), torch.zeros(2, dtype=torch.bool),
            torch.zeros(2, dtype=torch.bool))
    masks = torch.tensor([[True, False, True], [False, True, True]])
    masked = ReplayBuffer(10, 2, (1,), (), torch.int64, "cpu", n_step=n_step, mask_size=3)
    plain = make_buffer(10, 2, n_step=n_step)
    for buffer, given in ((masked, None), (plain, masks)):
        with pytest.raises(ValueError, match="next_action_masks must be given exactly when the buffer was made with "
                                             "mask_size"):
            buffer.add(*step, next_action_masks=given)
        with pytest.raises(ValueError, match="next_action_masks must be given exactly"):
            buffer.extend(*(part.unsqueeze(0) for part in step), next_action_masks=given
                          if given is None else given.unsqueeze(0))
    for _ in range(n_step):
        masked.add(*step, next_action_masks=masks)
    assert torch.equal(masked.gather(torch.arange(2))["next_action_masks"], masks)


def test_a_buffer_too_large_for_the_accelerator_says_its_size_in_readable_units(monkeypatch):
    """A buffer that does not fit in the accelerator's free memory is kept on the host with a warning that gave both
    sizes in GiB to two places, "0.00 GiB" for megabytes; it gives them as `files.size_text` does now."""
    from rlspeed.buffers import replay

    free = {"cuda": 3 * 2**20, "cpu": 2**34}
    monkeypatch.setattr(replay, "available_memory", lambda device, needed=None: (free[device.type], replay.HOST))
    with pytest.warns(UserWarning, match=r"^Replay buffer of 5\.0 MiB does not fit in cuda's free memory \(3\.0 MiB\): "
                                         r"keeping it in pinned host memory\.$"):
        buffer = ReplayBuffer(100_000, 1, (4,), (), torch.int64, device="cuda")
    assert buffer.storage_device == torch.device("cpu")
