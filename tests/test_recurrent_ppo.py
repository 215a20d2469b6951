"""RecurrentPPO: the LSTM state is carried through the rollout and reset exactly at episode starts, the update's
sequence re-run reproduces the rollout, predict follows SB3's contract, checkpoints round-trip, bad options are one
sentence, and it learns CartPole with the velocities hidden; CartPoleNoVel-v1 is RL-Zoo's task."""

from __future__ import annotations

import dataclasses
import re

import gymnasium as gym
import numpy as np
import pytest
import torch

import rlspeed
from rlspeed.algos.recurrent_ppo import RecurrentPPO, RecurrentPPOConfig
from rlspeed.envs import NATIVE_ENVS, make_env
from rlspeed.envs.base import EnvWrapper
from rlspeed.errors import UserError
from rlspeed.nn import RecurrentActorCritic, SequenceLayout
from rlspeed.policy_kwargs import LSTM_LAYOUT_RULE
from rlspeed.presets import load_preset, split_run_settings

ENV_ID = "CartPoleNoVel-v1"
SMALL = dict(num_envs=4, num_steps=32, batch_size=64, n_epochs=2, lstm_hidden_size=16, net_arch=(16,))


def _small_model(**overrides) -> RecurrentPPO:
    return RecurrentPPO(ENV_ID, device="cpu", seed=0, **{"env_backend": "gymnasium", **SMALL, **overrides})


# --- the state through the rollout -------------------------------------------------------------------------------

def test_state_is_zero_after_a_done_and_carried_over_elsewhere():
    model = _small_model()
    inputs = []  # the state each rollout step's LSTM really took
    act_step = model.policy.act_step

    def recording(obs, state, deterministic=False, **masks):
        inputs.append(state.clone())
        return act_step(obs, state, deterministic, **masks)

    model.policy.act_step = recording
    model.learn(SMALL["num_envs"] * SMALL["num_steps"], progress_bar=False)
    buf = model.buffer
    assert torch.equal(torch.stack(inputs), buf.states)  # the buffer holds the states the LSTM took
    starts, dones = buf.episode_starts, buf.dones
    assert starts[0].all()  # learn() starts fresh episodes
    assert torch.equal(starts[1:], dones[:-1])
    assert dones.any() and (~starts[1:]).any(), "the rollout must hold both cases"
    for t in range(1, SMALL["num_steps"]):
        zero = buf.states[t][:, starts[t]]
        assert torch.equal(zero, torch.zeros_like(zero)), f"step {t}: an episode start must begin from zeros"
        carried = starts[t].logical_not()
        assert torch.equal(buf.states[t][:, carried], buf.next_states[t - 1][:, carried]), f"step {t}"
        assert buf.states[t][:, carried].abs().sum() > 0


def test_state_carries_across_rollouts_of_one_learn_call():
    model = _small_model(num_steps=8, batch_size=16)
    seen = []
    model.learn(8 * 4 * 3, progress_bar=False,
                callback=lambda local: seen.append({k: getattr(model.buffer, k).clone() for k in
                                                    ("states", "next_states", "dones", "episode_starts")}))
    assert len(seen) == 3
    for before, after in zip(seen, seen[1:]):
        assert torch.equal(after["episode_starts"][0], before["dones"][-1])
        carried = ~after["episode_starts"][0]
        assert carried.any()
        assert torch.equal(after["states"][0][:, carried], before["next_states"][-1][:, carried])
        assert not after["states"][0][:, ~carried].any()


def test_bootstrap_values_continue_from_the_state_each_step_produced():
    model = _small_model()
    recorded = []
    next_values_of = model._next_values
    model._next_values = lambda buf: recorded.append((next_values_of(buf), buf.values.clone())) or recorded[-1][0]
    model.learn(SMALL["num_envs"] * SMALL["num_steps"], progress_bar=False)
    buf = model.buffer
    (next_values, values), = recorded
    # for a row that did not finish, V(final_obs[t]) is V(obs[t + 1]) from the state step t + 1 started from
    same = ~buf.dones[:-1]
    assert same.any()
    torch.testing.assert_close(next_values[:-1][same], values[1:][same], rtol=1e-5, atol=1e-5)


# --- the update's sequences --------------------------------------------------------------------------------------

def test_segmented_lstm_matches_the_step_by_step_reference_and_its_gradients():
    torch.manual_seed(0)
    steps, batch, obs_dim = 12, 5, 3
    policy = RecurrentActorCritic(obs_dim, 2, True, lstm_hidden_size=8, hidden=(8,))
    obs = torch.randn(steps, batch, obs_dim)
    starts = torch.rand(steps, batch) < 0.25
    starts[:, 0] = False  # one column without any episode start
    starts[3, 1] = starts[4, 1] = starts[steps - 1, 2] = True  # a one-step segment and a last-step start
    state = torch.randn(4, batch, 8) * (~starts[0]).float().view(1, -1, 1)
    layout = SequenceLayout(starts, torch.device("cpu"))
    assert layout.num_segments == batch + int(starts[1:].sum())
    reference = policy.sequence_features(obs, state, starts)
    segmented = policy.sequence_features(obs, state, starts, layout)
    torch.testing.assert_close(segmented, reference, rtol=1e-5, atol=1e-6)
    for a, b in zip(torch.autograd.grad(reference.square().sum(), list(policy.parameters()), allow_unused=True),
                    torch.autograd.grad(segmented.square().sum(), list(policy.parameters()), allow_unused=True)):
        if a is not None:
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    # the state at an episode start really is forgotten: other inputs before it change nothing after it
    changed = obs.clone()
    changed[:3, 1] += 1.0
    after = policy.sequence_features(changed, state, starts, layout).view(2, steps, batch, -1)
    torch.testing.assert_close(after[:, 4:, 1], segmented.view(2, steps, batch, -1)[:, 4:, 1])


@pytest.mark.parametrize("batch_size, length", [(64, 32), (16, 16)])
def test_the_update_reruns_the_rollout_exactly(batch_size, length):
    """Before any update the sequences re-run from the stored states give the rollout's own log-probs and values,
    whole columns (batch_size a multiple of num_steps) or chunks of gcd(num_steps, batch_size) steps; and the fused
    segment call's loss and gradients are the step-by-step autograd reference's on the same chunks."""
    model = _small_model(n_epochs=1, learning_rate=1e-12, batch_size=batch_size)
    rollout = SMALL["num_envs"] * SMALL["num_steps"]
    updates = []
    update = model._update_step
    model._update_step = lambda *batch, **hints: (updates.append(batch), update(*batch, **hints))[1]
    model.learn(rollout, progress_bar=False)
    assert len(updates) == rollout // batch_size
    for obs, state, starts, layout, actions, old_log_probs, old_values, *_ in updates:
        assert obs.shape[:2] == (length, batch_size // length)
        with torch.no_grad():
            for used in (layout, None):
                features = model.policy.sequence_features(obs, state, starts, used)
                log_probs, _, values = model.policy.evaluate(features, actions)
                torch.testing.assert_close(log_probs, old_log_probs, rtol=1e-4, atol=1e-5)
                torch.testing.assert_close(values, old_values, rtol=1e-4, atol=1e-5)
    batch, parameters = updates[0], list(model.policy.parameters())
    (fused, _), (reference, _) = (model._loss(*batch[:3], used, *batch[4:]) for used in (batch[3], None))
    torch.testing.assert_close(fused, reference, rtol=1e-5, atol=1e-6)
    for a, b in zip(torch.autograd.grad(reference, parameters, allow_unused=True),
                    torch.autograd.grad(fused, parameters, allow_unused=True)):
        if a is not None:
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("batch_size, length", [(64, 32), (8, 8)])
def test_each_epoch_takes_every_chunk_once_from_the_state_the_rollout_stored(batch_size, length):
    """sb3-contrib's users give batch_size in steps whatever n_steps is (RL-Zoo's PendulumNoVel-v1: n_steps 1024,
    batch_size 128): it was refused unless a multiple of num_steps. An epoch now makes rollout / batch_size gradient
    steps, each of batch_size steps: chunks of each env column, shuffled, each started from the LSTM state the
    rollout stored at its first step, with the episode starts inside it."""
    n_epochs, rollout = 2, SMALL["num_envs"] * SMALL["num_steps"]
    model = _small_model(n_epochs=n_epochs, batch_size=batch_size)
    updates = []
    update = model._update_step
    model._update_step = lambda *batch, **hints: (updates.append(batch), update(*batch, **hints))[1]
    model.learn(rollout, progress_bar=False)
    buf = model.buffer
    assert len(updates) == n_epochs * rollout // batch_size
    per_epoch = rollout // batch_size
    for epoch in range(n_epochs):
        taken = []
        for obs, state, starts, _, _, log_probs, *_ in updates[epoch * per_epoch:(epoch + 1) * per_epoch]:
            assert obs.shape[:2] == (length, batch_size // length)
            log_probs = log_probs.view(length, -1)
            for b in range(obs.shape[1]):
                (k, n), = [(k, n) for k in range(SMALL["num_steps"] // length) for n in range(SMALL["num_envs"])
                           if torch.equal(buf.log_probs[k * length:(k + 1) * length, n], log_probs[:, b])]
                taken.append((k, n))
                assert torch.equal(obs[:, b], buf.obs[k * length:(k + 1) * length, n])
                assert torch.equal(starts[:, b], buf.episode_starts[k * length:(k + 1) * length, n])
                assert torch.equal(state[:, b], buf.states[k * length][:, n])
        assert sorted(taken) == [(k, n) for k in range(SMALL["num_steps"] // length) for n in range(SMALL["num_envs"])]
    if length < SMALL["num_steps"]:  # (chunks that do not start a column start from a carried, non-zero state)
        assert any(state.abs().sum() > 0 for _, state, *_ in updates)


@pytest.mark.parametrize("batch_size, length", [(64, 32), (16, 16)])
def test_a_graph_captured_update_gets_fixed_shapes_and_no_layout(monkeypatch, batch_size, length):
    """Whole-step graphs (CUDA) need fixed shapes and no host sync: there the update runs the step-by-step LSTM, on
    whole columns or chunks (their indices made on the device)."""
    from rlspeed.algos import on_policy
    from rlspeed.algos.update import GRAPHS, UpdateChoice

    make_update_step = on_policy.OnPolicyAlgorithm._make_update_step

    def as_on_a_graph_device(self):
        update = make_update_step(self)
        update.choice = UpdateChoice(GRAPHS, "forced by the test")  # the step itself stays eager autograd here
        return update

    monkeypatch.setattr(on_policy.OnPolicyAlgorithm, "_make_update_step", as_on_a_graph_device)
    model = _small_model(n_epochs=2, batch_size=batch_size)
    update = model._update_step
    shapes = []
    taken = []  # each minibatch's rollout log-probs
    model._update_step = lambda *batch, **hints: (shapes.append((batch[0].shape, batch[3])), taken.append(batch[5]),
                                                  update(*batch))[2]
    rollout = SMALL["num_envs"] * SMALL["num_steps"]
    model.learn(2 * rollout, progress_bar=False)
    assert len(shapes) == 2 * 2 * rollout // batch_size  # rollouts x epochs x minibatches
    assert {shape for shape, _ in shapes} == {(length, batch_size // length, 4)}
    for epoch in (-2, -1):  # (the last rollout's, which the buffer holds: each step once per epoch)
        per_epoch = rollout // batch_size
        epoch_steps = torch.cat(taken[len(taken) + epoch * per_epoch:][:per_epoch])
        assert torch.equal(epoch_steps.sort().values, model.buffer.log_probs.flatten().sort().values)
    assert all(layout is None for _, layout in shapes)


# --- predict, evaluate, checkpoints -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trained():
    model = RecurrentPPO(ENV_ID, device="cpu", seed=0, env_backend="gymnasium", **SMALL)
    return model.learn(256, progress_bar=False)


def test_predict_follows_sb3(trained):
    hidden = SMALL["lstm_hidden_size"]
    obs = np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)
    actions, state = trained.predict(obs)
    assert isinstance(actions, np.ndarray) and actions.shape == (3,)
    assert isinstance(state, tuple) and [s.shape for s in state] == [(1, 3, hidden)] * 2
    assert all(isinstance(s, np.ndarray) and np.abs(s).sum() > 0 for s in state)
    # passing the state back continues it; episode_start=True forgets it, like a first call
    _, carried = trained.predict(obs, state=state, episode_start=np.zeros(3, dtype=bool))
    _, restarted = trained.predict(obs, state=state, episode_start=np.ones(3, dtype=bool))
    np.testing.assert_allclose(restarted[0], state[0], rtol=1e-6)
    assert not np.allclose(carried[0], state[0])
    _, mixed = trained.predict(obs, state=state, episode_start=np.array([True, False, True]))
    np.testing.assert_allclose(mixed[0][:, [0, 2]], state[0][:, [0, 2]], rtol=1e-6)
    np.testing.assert_allclose(mixed[0][:, 1], carried[0][:, 1], rtol=1e-6)
    single, single_state = trained.predict(obs[0])
    assert single.shape == () and single_state[0].shape == (1, 1, hidden)
    tensor_actions, tensor_state = trained.predict(torch.from_numpy(obs))
    assert isinstance(tensor_actions, torch.Tensor) and isinstance(tensor_state[0], torch.Tensor)
    np.testing.assert_array_equal(tensor_actions.numpy(), actions)


def test_predict_refuses_a_state_or_episode_start_of_another_shape(trained):
    """sb3-contrib's shape errors surface as torch's; a mis-shaped state was broadcast or cut (a one-env state reused
    for 3 observations, an `n_lstm_layers=2` state's second layer dropped): one sentence instead."""
    hidden = SMALL["lstm_hidden_size"]
    obs = np.zeros((3, 4), dtype=np.float32)
    one_env = trained.predict(obs[:1])[1]
    for state, match in [(one_env, r"h has shape \[1, 1, \d+\].*needs \[1, 3, \d+\]"),
                         ((np.zeros((2, 3, hidden)),) * 2, r"h has shape \[2, 3"),
                         ((np.zeros((1, 3, hidden + 1)),) * 2, "lstm_hidden_size"),
                         (np.zeros((1, 3, hidden)), "takes the \\(h, c\\) pair")]:
        with pytest.raises(UserError, match=match):
            trained.predict(obs, state=state)
    for starts in (np.ones(1, dtype=bool), np.ones(2, dtype=bool)):
        with pytest.raises(UserError, match=f"episode_start=...\\) has {starts.size} entries for 3 observations"):
            trained.predict(obs, episode_start=starts)
    with pytest.raises(UserError, match=r"takes one flag \(bool or 0/1\) per observation, got 'yes'"):
        trained.predict(obs, episode_start="yes")  # (torch's "can't convert np.ndarray of type numpy.str_")


def test_predict_refuses_a_state_of_no_numbers_and_episode_start_values_other_than_0_and_1(trained):
    """A state (None, None) was torch's "can't convert np.ndarray of type numpy.object_"; an episode_start of 0.5, 2,
    -1 or NaN reset the state by its truth value, without a word. 0/1 numbers and bools are flags as before."""
    obs = np.zeros((3, 4), dtype=np.float32)
    _, state = trained.predict(obs)
    with pytest.raises(UserError, match=r"takes the \(h, c\) pair .* of numbers; got \(NoneType, NoneType\)"):
        trained.predict(obs, state=(None, None))
    for starts in (np.full(3, 0.5), np.array([0, 2, 1]), np.array([0, -1, 0]), np.full(3, np.nan),
                   torch.tensor([0.0, 0.5, 1.0])):
        with pytest.raises(UserError, match=r"takes one flag \(bool or 0/1\) per observation, got \["):
            trained.predict(obs, state=state, episode_start=starts)
    fresh = trained.predict(obs)[0]
    for starts in (np.ones(3, dtype=bool), np.ones(3), [1, 1, 1], torch.ones(3)):
        assert trained.predict(obs, state=state, episode_start=starts)[0].tolist() == fresh.tolist()


def test_act_without_a_state_is_a_clear_error(trained):
    with pytest.raises(UserError, match="predict"):
        trained.act(torch.zeros(1, 4))


def test_evaluate_carries_the_state_and_resets_it_per_episode(trained):
    calls = []
    act_with_state = trained.act_with_state

    def recording(obs, state, episode_start, deterministic=True):
        actions, next_state = act_with_state(obs, state, episode_start, deterministic)
        calls.append((state, episode_start, next_state))
        return actions, next_state

    trained.act_with_state = recording
    try:
        evaluation = rlspeed.evaluate(trained, episodes=4, seed=1)
    finally:
        del trained.act_with_state
    assert calls[0][0] is None and calls[0][1] is None
    for (_, _, produced), (taken, episode_start, _) in zip(calls, calls[1:]):
        assert taken is produced  # the state returned by one step goes into the next
        assert episode_start.dtype == torch.bool and episode_start.shape == (4,)
    # every evaluation episode ended; each one that ended before the last step reset its row at the next step (and
    # no other row was reset): an episode of L steps ends at call L-1, its row flagged at call L
    lengths = [int(length) for length in evaluation["lengths"]]
    assert len(calls) == max(lengths)
    expected = {(length, row) for row, length in enumerate(lengths) if length < max(lengths)}
    assert {(t, row) for t, call in enumerate(calls[1:], 1) for row in call[1].nonzero().flatten().tolist()} == expected
    assert evaluation["unfinished"] == 0


class _LifeLoss(EnvWrapper):
    """Ends the learner's episode at every 5th step of a game, the game going on (`info["done"]` unset), as Atari's
    episodic life does at a lost life; keeps each step's (lost, done) rows."""

    def __init__(self, env):
        super().__init__(env)
        self.t = torch.zeros(env.num_envs, dtype=torch.long)
        self.history = []

    def reset(self, seed=None):
        self.t.zero_()
        return self.env.reset(seed=seed)

    def step(self, actions):
        obs, reward, terminated, truncated, info = self.env.step(actions)
        self.t = torch.where(info["done"], 0, self.t + 1)
        lost = (self.t % 5 == 0) & ~info["done"]
        self.history.append((lost, info["done"]))
        return obs, reward, terminated | lost, truncated, info


def test_a_lost_life_ends_the_learners_episode_but_not_the_lstm_memory_in_training_and_evaluation():
    """A wrapper that ends the learner's episode while the game goes on (Atari's lost life) cuts the bootstrap there
    (`dones`), but the LSTM state goes on: it is reset only where a whole game starts, in the rollout, in the update's
    sequences and in evaluation (whose envs play whole games), so the policy is evaluated as it was trained."""
    env = _LifeLoss(make_env(ENV_ID, num_envs=4, seed=0, device="cpu", backend="torch"))
    model = RecurrentPPO(env, device="cpu", seed=0, **SMALL)
    model.learn(SMALL["num_envs"] * SMALL["num_steps"], progress_bar=False)
    buf = model.buffer
    lost = buf.dones & ~buf.episode_ends
    assert lost[:-1].any() and buf.episode_ends[:-1].any(), "the rollout must hold both cases"
    assert torch.equal(buf.episode_starts[1:], buf.episode_ends[:-1])
    after_lost = buf.states[1:].transpose(1, 2)[lost[:-1]]  # [K, 4, H]
    assert after_lost.abs().sum(dim=(1, 2)).gt(0).all()  # the state the lost life ended in goes on
    calls = []
    act_with_state = model.act_with_state
    model.act_with_state = lambda obs, state, start, **kwargs: (calls.append(start), act_with_state(
        obs, state, start, **kwargs))[1]
    evaluation_env = _LifeLoss(make_env(ENV_ID, num_envs=2, seed=1, device="cpu", backend="torch"))
    rlspeed.evaluate(model, evaluation_env, episodes=4)
    lost_rows = [lost for lost, _ in evaluation_env.history]
    assert torch.stack(lost_rows).any()
    assert len(calls) == len(evaluation_env.history) > 1  # (the evaluation acted through the wrapped call: checked)
    for start, (_, done) in zip(calls[1:], evaluation_env.history):
        assert torch.equal(start.cpu(), done)  # reset where a game ended, not where a life was lost


def test_checkpoint_round_trip(trained, tmp_path):
    path = trained.save(tmp_path / "model.safetensors")
    loaded = RecurrentPPO.load(path, device="cpu")
    assert loaded.config == trained.config
    for (name, a), (_, b) in zip(trained.policy.state_dict().items(), loaded.policy.state_dict().items()):
        assert torch.equal(a, b), name
    assert any(name.startswith("lstm_actor") for name in loaded.policy.state_dict())
    obs = np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32)
    state = None
    for _ in range(3):
        expected, expected_state = trained.predict(obs, state=state)
        got, state = loaded.predict(obs, state=state)
        np.testing.assert_array_equal(got, expected)
        np.testing.assert_allclose(state[0], expected_state[0], rtol=1e-6)
    saved, restored = trained.optimizer.state_dict()["state"], loaded.optimizer.state_dict()["state"]
    assert saved.keys() == restored.keys() and len(saved) > 0
    loaded.learn(128, progress_bar=False)  # and it trains on


def _resumed_first_states(checkpoint, **settings) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """Resume a model built with `settings` from `checkpoint` and learn one rollout: (the state its first rollout
    step's LSTMs took, that step's episode starts, the warnings learn() gave)."""
    import warnings

    model = _small_model(**settings)
    model.resume(checkpoint)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.learn(model.config.num_envs * model.config.num_steps, progress_bar=False)
    return model.buffer.states[0], model.buffer.episode_starts[0], [str(w.message) for w in caught]


@pytest.fixture(scope="module")
def native_checkpoint(tmp_path_factory):
    """A checkpoint of a run on native envs, saved in the middle of its episodes (LSTM states not zero)."""
    run = tmp_path_factory.mktemp("recurrent-run")
    model = _small_model(env_backend="torch")
    model.learn(2 * SMALL["num_envs"] * SMALL["num_steps"], progress_bar=False, run_dir=run,
                checkpoint_freq=SMALL["num_envs"] * SMALL["num_steps"])
    assert model._state.abs().sum() > 0
    return run / "checkpoint.safetensors"


def test_a_resume_that_continues_the_episodes_continues_their_lstm_state(native_checkpoint):
    from rlspeed.checkpoint import load_checkpoint

    saved = load_checkpoint(native_checkpoint, device="cpu")[0]
    states, starts, said = _resumed_first_states(native_checkpoint, env_backend="torch")
    kept = ~saved["resume.algo.episode_start"]
    assert kept.any()
    assert torch.equal(starts, saved["resume.algo.episode_start"])
    assert torch.equal(states[:, kept], saved["resume.algo.lstm_state"][:, kept])
    assert not any("LSTM" in message for message in said)


def test_a_resume_with_other_num_envs_says_the_lstm_state_starts_from_zeros(native_checkpoint):
    states, starts, said = _resumed_first_states(native_checkpoint, env_backend="torch", num_envs=2, batch_size=32)
    assert starts.all() and not states.any()  # fresh episodes, from zeros
    lstm = [message for message in said if "LSTM state" in message]
    assert len(lstm) == 1, said
    assert "4 envs" in lstm[0] and "2" in lstm[0] and "zeros" in lstm[0] and "\n" not in lstm[0]


def test_a_resume_into_fresh_episodes_starts_their_lstm_state_from_zeros(native_checkpoint):
    """Gymnasium envs cannot restore the saved episodes: the saved LSTM state belongs to those, not to the new ones."""
    states, starts, said = _resumed_first_states(native_checkpoint, env_backend="gymnasium")
    assert any("fresh episodes" in message for message in said)
    assert starts.all() and not states.any()


# --- bad input ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("options, named", [
    ({"lstm_hidden_size": 0}, "lstm_hidden_size"),
    ({"buffer_size": 10_000}, "buffer_size"),
    ({"learning_starts": 100}, "learning_starts"),
    ({"train_freq": 4}, "train_freq"),
    ({"tau": 0.005}, "tau"),
    ({"num_steps": 32, "batch_size": 48}, "batch_size"),
    ({"num_steps": 32, "num_envs": 4, "batch_size": 4}, "batch_size"),
])
def test_bad_options_are_one_sentence_naming_the_option(options, named):
    with pytest.raises(UserError) as raised:
        RecurrentPPO(ENV_ID, device="cpu", **options)
    message = str(raised.value)
    assert named in message and "\n" not in message


def test_a_batch_size_cutting_too_short_sequences_names_the_sizes_that_would_do():
    with pytest.raises(UserError, match=r"^batch_size \(4\) cuts num_steps \(32\) into sequences of 4 steps .* at "
                                        r"least 8 steps to train its LSTM on: batch_size=8 would do\.$"):
        _small_model(batch_size=4)
    with pytest.raises(UserError, match=r"sequences of 4 steps .* batch_size=16 or 24 would do\.$"):
        _small_model(num_envs=10, num_steps=24, batch_size=20)


def test_a_batch_size_not_dividing_the_rollout_names_sizes_valid_for_the_sequences_too():
    """PPO's sentence named 2 and 4 for batch_size=3 with num_steps=32 (sizes that divide the rollout), which were
    then refused for sequences under 8 steps: one sentence now names sizes that pass both rules."""
    with pytest.raises(UserError, match=r"^batch_size \(3\) must divide num_envs \* num_steps \(64\) into sequences "
                                        r"of at least 8 steps for RecurrentPPO's update to train its LSTM on \(a "
                                        r"sequence is as long as the greatest common divisor of batch_size and "
                                        r"num_steps \(32\), here 1\): batch_size=8 would do\.$"):
        _small_model(num_envs=2, num_steps=32, batch_size=3)
    with pytest.raises(UserError, match=r"batch_size=16 or 24 would do\.$"):
        _small_model(num_envs=4, num_steps=24, batch_size=20)
    _small_model(num_envs=2, num_steps=32, batch_size=8)


@pytest.mark.parametrize("option", [{"n_lstm_layers": 2}, {"enable_critic_lstm": False}, {"shared_lstm": True},
                                    {"lstm_kwargs": {"dropout": 0.1}}, {"enable_critic_lstm": 1}, {"shared_lstm": 0},
                                    {"n_lstm_layers": True}, {"enable_critic_lstm": "false"}])
def test_sb3_contribs_lstm_layout_options_say_which_layout_this_is(option):
    """sb3-contrib's LSTM layout keywords (lstm_kwargs too) were 'Unknown hyperparameter' with the list of all the
    others: they now say which layout rlspeed's RecurrentPPO has. A keyword, RL-Zoo's translation and the policy_kwargs
    sentence refuse alike; enable_critic_lstm=1 (equal to True by Python's bool-int equality alone; sb3-contrib takes
    the text "false" as true) was taken by the translation ("has that too") and left out of the sentence."""
    from rlspeed.presets import zoo

    (name, value), = option.items()
    with pytest.raises(UserError, match=rf"'{name}' is not an option of RecurrentPPOConfig: .*one LSTM "
                                        r"layer \(torch.nn.LSTM's defaults\) for the actor and one for the "
                                        "critic") as raised:
        RecurrentPPO(ENV_ID, device="cpu", **option)
    assert "Valid:" not in str(raised.value)
    translation = zoo.translate_entry("recurrent_ppo", {"policy_kwargs": f"dict({name}={value!r})"}, "test")
    assert translation.unsupported == [f"policy_kwargs.{name}: {value!r}: {LSTM_LAYOUT_RULE}"]
    with pytest.raises(UserError, match=re.escape(f"; policy_kwargs.{name}={value!r}: {LSTM_LAYOUT_RULE}.")):
        RecurrentPPO(ENV_ID, device="cpu", policy_kwargs=option)


def test_sb3_contribs_lstm_layout_at_its_defaults_is_taken_on_every_path():
    """`--set n_lstm_layers=1` or `enable_critic_lstm=true` (sb3-contrib's defaults, which describe rlspeed's network)
    was refused 'remove it', while RL-Zoo's translation and the policy_kwargs sentence took them: every path takes
    them now, changing nothing and storing nothing (a saved config, a run's config.yaml, holds no such key)."""
    from rlspeed import cli
    from rlspeed.presets import zoo

    given = cli._parse_set(["n_lstm_layers=1", "enable_critic_lstm=true", "shared_lstm=false", "lstm_kwargs={}"])
    model = RecurrentPPO(ENV_ID, device="cpu", lstm_hidden_size=64, **given)
    assert dataclasses.asdict(model.config) == dataclasses.asdict(RecurrentPPOConfig(lstm_hidden_size=64))
    entry = {"policy_kwargs": f"dict({', '.join(f'{key}={value!r}' for key, value in given.items())})"}
    assert zoo.translate_entry("recurrent_ppo", entry, "test").unsupported == []
    # (and SB3's policy_kwargs of them: taken as the settings, as the keywords)
    assert RecurrentPPO(ENV_ID, device="cpu", policy_kwargs={**given, "lstm_hidden_size": 64}).config == model.config


def test_policy_kwargs_refusal_names_the_lstm_layouts_rlspeed_has_not():
    """sb3-contrib's policy_kwargs are refused with the keywords to write instead; RL-Zoo's Atari ppo_lstm dict
    (enable_critic_lstm=False) was translated to "here lstm_hidden_size=128" alone, which builds a critic LSTM the
    user's network has not, without a word. A layout option at rlspeed's value means the same and is left out."""
    with pytest.raises(UserError) as raised:
        RecurrentPPO(ENV_ID, device="cpu", policy_kwargs=dict(enable_critic_lstm=False, lstm_hidden_size=128))
    assert str(raised.value).endswith("here lstm_hidden_size=128; policy_kwargs.enable_critic_lstm=False: rlspeed's "
                                      "RecurrentPPO has one LSTM layer (torch.nn.LSTM's defaults) for the actor and "
                                      "one for the critic.")
    with pytest.raises(UserError) as raised:
        RecurrentPPO(ENV_ID, device="cpu", policy_kwargs=dict(n_lstm_layers=2, shared_lstm=True,
                                                              lstm_kwargs=dict(dropout=0.1)))
    # (the rule once, after every option it refuses: it was said once per option)
    assert str(raised.value).endswith("; policy_kwargs.n_lstm_layers=2, policy_kwargs.shared_lstm=True, "
                                      "policy_kwargs.lstm_kwargs={'dropout': 0.1}: rlspeed's RecurrentPPO has one "
                                      "LSTM layer (torch.nn.LSTM's defaults) for the actor and one for the critic.")
    # (RL-Zoo's CartPoleNoVel dict: rlspeed's layout, taken as lstm_hidden_size=64)
    taken = RecurrentPPO(ENV_ID, device="cpu", policy_kwargs=dict(lstm_hidden_size=64, enable_critic_lstm=True,
                                                                  n_lstm_layers=1, shared_lstm=False, lstm_kwargs={}))
    assert taken.config == RecurrentPPO(ENV_ID, device="cpu", lstm_hidden_size=64).config


def test_bad_option_from_the_command_line_exits_2(capsys, monkeypatch, tmp_path):
    from rlspeed import cli

    monkeypatch.chdir(tmp_path)
    code = cli.main(["train", "recurrent_ppo", ENV_ID, "--set", "lstm_hidden_size=0", "--no-progress"])
    captured = capsys.readouterr()
    assert code == 2
    assert "lstm_hidden_size" in captured.err and "Traceback" not in captured.err + captured.out


def test_sb3_contribs_lstm_options_on_another_algorithm_name_recurrent_ppo(capsys, monkeypatch, tmp_path):
    """`PPO(env, n_lstm_layers=1)` or `--set enable_critic_lstm=true` on ppo listed every PPO hyperparameter: the
    sentence now names the algorithm that takes them, as for any other algorithm's setting."""
    from conftest import cli_error

    for key, value in (("n_lstm_layers", 1), ("shared_lstm", False), ("lstm_kwargs", None)):
        with pytest.raises(UserError, match=rf"^Unknown hyperparameter '{key}' for PPO\. {key} is a setting of "
                                            r"RecurrentPPO; PPO has none\.$"):
            rlspeed.PPO("CartPole-v1", device="cpu", **{key: value})
    monkeypatch.chdir(tmp_path)
    said = cli_error(capsys, ["train", "ppo", "CartPole-v1", "--set", "enable_critic_lstm=true", "--no-progress"])
    assert said.endswith("enable_critic_lstm is a setting of RecurrentPPO; PPO has none.")


# --- the task ----------------------------------------------------------------------------------------------------

def test_cartpole_no_vel_hides_the_velocities_like_rl_zoo():
    gym_env = gym.make(ENV_ID)
    assert gym_env.spec.max_episode_steps == 500 and gym_env.spec.reward_threshold == 475.0
    obs, _ = gym_env.reset(seed=3)
    plain = gym.make("CartPole-v1")
    plain_obs, _ = plain.reset(seed=3)
    np.testing.assert_array_equal(obs, plain_obs * np.array([1, 0, 1, 0], dtype=np.float32))
    for action in [0, 1, 1, 0, 1]:
        obs = gym_env.step(action)[0]
        plain_obs = plain.step(action)[0]
        np.testing.assert_array_equal(obs, plain_obs * np.array([1, 0, 1, 0], dtype=np.float32))
        assert plain_obs[1] != 0 and plain_obs[3] != 0
    zoo = pytest.importorskip("rl_zoo3.wrappers")
    zoo_env = zoo.MaskVelocityWrapper(gym.make("CartPole-v1"))
    np.testing.assert_array_equal(zoo_env.reset(seed=5)[0], gym_env.reset(seed=5)[0])


def test_native_cartpole_no_vel_matches_the_gymnasium_one():
    native = NATIVE_ENVS[ENV_ID](num_envs=1, seed=0, state_dtype=torch.float64)
    gym_env = gym.make(ENV_ID)
    gym_env.reset(seed=0)
    native.reset()
    gym_env.unwrapped.state = native.state[0].numpy().copy()
    for action in [1, 0, 0, 1, 1, 1]:
        obs, reward, terminated, truncated, info = native.step(torch.tensor([action]))
        gym_obs, gym_reward, gym_terminated, _, _ = gym_env.step(action)
        np.testing.assert_allclose(obs[0].numpy(), gym_obs, rtol=1e-6, atol=1e-7)
        assert obs[0, 1] == 0 and obs[0, 3] == 0 and native.state[0, 1] != 0
        assert float(reward[0]) == gym_reward and bool(terminated[0]) == gym_terminated
    env = make_env(ENV_ID, num_envs=32, backend="torch", seed=0)
    assert env.backend == "torch" and env.spec.env_id == ENV_ID
    assert (env.reset()[0][:, 1::2] == 0).all()


def test_pendulum_no_vel_is_rl_zoos_task_without_rl_zoo():
    """RL-Zoo's tuned ppo_lstm entry for PendulumNoVel-v1 named an env only rl_zoo3 registered: rlspeed registers it
    (Pendulum-v1 with its angular velocity, observation component 2, zeroed; 200 steps) and has it native."""
    gym_env = gym.make("PendulumNoVel-v1")
    assert gym_env.spec.max_episode_steps == 200
    obs, _ = gym_env.reset(seed=0)
    state = gym_env.unwrapped.state
    assert obs[2] == 0 and state[1] != 0
    np.testing.assert_allclose(obs[:2], [np.cos(state[0]), np.sin(state[0])], rtol=1e-6)
    env = make_env("PendulumNoVel-v1", num_envs=4, backend="torch", seed=0)
    assert env.spec.max_episode_steps == 200 and (env.reset()[0][:, 2] == 0).all()
    assert (env.state[:, 1] != 0).any()


# --- learning -----------------------------------------------------------------------------------------------------

def test_learns_cartpole_without_velocities_on_a_small_budget():
    """A few seconds of training with the shipped preset: far above a random policy (~20) on the partial task."""
    _run, hyperparameters = split_run_settings(load_preset("recurrent_ppo", ENV_ID))
    model = RecurrentPPO(ENV_ID, device="cpu", seed=0, **hyperparameters)
    untrained = rlspeed.evaluate(model, episodes=10, seed=7)["mean"]
    model.learn(8192, progress_bar=False)
    trained = rlspeed.evaluate(model, episodes=10, seed=7)["mean"]
    assert untrained < 60, untrained
    assert trained >= 100, (untrained, trained)


def test_the_actor_step_equals_the_full_policy_on_the_actor_member():
    """predict's step runs the actor's head alone; its actions are those of the two-member policy's actor."""
    torch.manual_seed(0)
    policy = RecurrentPPO("CartPoleNoVel-v1", device="cpu", seed=0, lstm_hidden_size=8).policy
    obs, h, c = torch.randn(5, 4), torch.randn(5, 8), torch.randn(5, 8)
    actions, h1, c1 = policy.actor_step(obs, h, c, deterministic=True)
    h2, c2 = policy._cell(policy.lstm_actor, policy.encode(obs), h, c)
    expected, _, _ = policy.act(torch.stack((h2, torch.randn_like(h2))), deterministic=True)
    assert torch.equal(actions, expected) and torch.equal(h1, h2) and torch.equal(c1, c2)


def test_target_kl_ends_the_epochs_early_as_ppos_does():
    """RecurrentPPO's minibatches of env columns stop as PPO's do once one's approx_kl exceeds 1.5 * target_kl (the
    first, the rollout's own policy, never does)."""
    from test_ppo import _CountingStep

    calls = {}
    for target_kl in (None, 1e-9):
        model = RecurrentPPO("CartPole-v1", seed=0, num_envs=4, num_steps=32, batch_size=32, n_epochs=4,
                             target_kl=target_kl)
        model._update_step = _CountingStep(model._update_step)
        model.learn(128, progress_bar=False)
        calls[target_kl] = model._update_step.calls
    assert calls[None] == 16 and 2 <= calls[1e-9] < 16, calls


def test_an_untrained_model_saves_and_loads(tmp_path):
    """Saving before any learn (to keep the initial weights, say) writes a model that loads with the same weights."""
    model = RecurrentPPO("CartPole-v1", seed=0, num_envs=2, num_steps=16)
    loaded = RecurrentPPO.load(model.save(tmp_path / "untrained"))
    for name, value in model.policy.state_dict().items():
        assert torch.equal(loaded.policy.state_dict()[name], value), name


def test_a_rollout_whose_lstm_states_do_not_fit_in_memory_is_refused_before_allocating(monkeypatch):
    """The memory check counted a step's observations, actions and scalars (63 bytes for CartPoleNoVel) but not the
    two LSTM states the recurrent buffer keeps per step and env (8 KiB with an LSTM of 256): a rollout 130 times the
    size it checked went on to the allocator (an out-of-memory error, or the kernel's OOM killer on a host)."""
    from rlspeed.buffers import replay
    from rlspeed.buffers.recurrent import RecurrentRolloutBuffer

    # a fake 512 MiB: 410 MiB may go
    monkeypatch.setattr(replay, "available_memory", lambda device, needed=None: (2**29, replay.HOST))
    space, cpu = gym.make(ENV_ID).observation_space, torch.device("cpu")
    # 64 envs x 1,024 steps: 4 MiB without the states, 0.5 GiB with those of an LSTM of 256 (what learn() makes for
    # RecurrentPPO(num_envs=64, num_steps=1024, lstm_hidden_size=256))
    with pytest.raises(UserError, match=r"A rollout of num_steps 1,024 x num_envs 64 steps needs about 51\d\.\d MiB"):
        RecurrentRolloutBuffer(1024, 64, space, (), torch.int64, cpu, (4, 64, 256))
    # the same rollout with an LSTM of 16 (0.04 GiB) fits
    buffer = RecurrentRolloutBuffer(1024, 64, space, (), torch.int64, cpu, (4, 64, 16))
    assert buffer.states.shape == (1024, 4, 64, 16)


# --- gSDE ----------------------------------------------------------------------------------------------------------

def _sde_model(**overrides) -> RecurrentPPO:
    return RecurrentPPO("PendulumNoVel-v1", device="cpu", seed=0,
                        **{"env_backend": "gymnasium", **SMALL, "use_sde": True, "log_std_init": -1.0, **overrides})


def test_gsde_predicts_step_samples_the_rollouts_noise_on_the_actor_member():
    """predict's actor step with gSDE: the mean, or mean + latent @ E with env i's matrix for row i, as the rollout's
    two-member step gives for the same state."""
    policy = _sde_model().policy
    torch.manual_seed(0)
    obs, state = torch.randn(4, policy.lstm_actor.input_size), torch.randn(4, 4, 16)
    policy.resample(4)
    with torch.no_grad():
        features = policy.step(policy.encode(obs), state)[0]
        mean, _, latent = policy.forward_latent(features)
        for deterministic, expected in ((True, mean), (False, mean + policy.sde.noise(latent))):
            actions, h, c = policy.actor_step(obs, state[0], state[1], deterministic=deterministic)
            torch.testing.assert_close(actions, expected)
            torch.testing.assert_close(h, features[0])


@pytest.mark.parametrize("full_std, use_expln", [(True, False), (False, True)])
def test_gsde_log_prob_and_entropy_are_ppos_formulas_on_the_actors_lstm_mlp_output(full_std, use_expln):
    """sb3-contrib's RecurrentPPO with use_sde: the noise's latent is the actor's LSTM then MLP output (the input of
    the mean's layer); log-probabilities and entropy are gSDE's (SB3's formulas, float64 reference) on it; the
    rollout's actions are mean + latent @ E with each env's matrix."""
    from test_sde import reference_log_prob_entropy

    policy = _sde_model(full_std=full_std, use_expln=use_expln).policy
    assert policy.sde.log_std.shape == (16, 1)  # (net_arch (16,); PendulumNoVel's 1 action)
    with torch.no_grad():
        policy.sde.log_std.normal_()  # (values on both sides of 0: expln's two branches)
    generator = torch.Generator().manual_seed(0)
    steps, batch = 5, 3
    obs = torch.randn(steps, batch, 3, generator=generator)
    state = 0.1 * torch.randn(4, batch, 16, generator=generator)
    features = policy.sequence_features(obs, state, torch.zeros(steps, batch, dtype=torch.bool))
    mean, _, latent = policy.forward_latent(features)
    last = policy.body(features, with_hidden=True)[1][0]  # the actor's last hidden layer, after its LSTM
    torch.testing.assert_close(latent, last)
    actions = mean + 0.3 * torch.randn(mean.shape, generator=generator)
    log_prob, entropy, _ = policy.evaluate(features, actions)
    ref_log_prob, ref_entropy = reference_log_prob_entropy(actions.detach(), mean.detach(), latent.detach(),
                                                           policy.sde.log_std.detach(), use_expln)
    np.testing.assert_allclose(log_prob.detach().numpy(), ref_log_prob, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(entropy.detach().numpy(), ref_entropy, rtol=1e-5, atol=1e-5)
    policy.resample(batch)
    with torch.no_grad():
        sampled, log_probs, _, _ = policy.act_step(obs[0], state)
        features = policy.step(policy.encode(obs[0]), state)[0]
        mean, _, latent = policy.forward_latent(features)
        torch.testing.assert_close(sampled, mean + torch.bmm(latent.unsqueeze(1), policy.sde.exploration).squeeze(1))
        torch.testing.assert_close(log_probs, policy.evaluate(features, sampled)[0])


def test_gsde_resamples_at_the_rollout_start_and_every_sde_sample_freq_steps():
    """RL-Zoo's PendulumNoVel-v1 entry's sde_sample_freq=4: the matrices held for 4 steps, new at each rollout."""
    from test_sde import _exploration_per_step

    model = _sde_model(num_envs=2, num_steps=8, batch_size=16, n_epochs=1, sde_sample_freq=4)
    seen = _exploration_per_step(model, rollouts=2)
    assert len(seen) == 16
    for start in range(0, 16, 4):
        assert all(torch.equal(seen[start], matrix) for matrix in seen[start:start + 4])
        assert start == 0 or not torch.equal(seen[start - 1], seen[start])
    assert not torch.equal(seen[0][0], seen[0][1])  # one matrix per env


def test_gsde_update_reruns_the_rollouts_log_probs_and_a_checkpoint_keeps_sigma(tmp_path):
    """Before any update, the sequences re-run give the rollout's gSDE log-probs; save/load keeps log_std, the
    deterministic actions, and explores with the saved sigma (as PPO's gSDE)."""
    model = _sde_model(n_epochs=1, learning_rate=1e-12, use_expln=True)
    updates = []
    update = model._update_step
    model._update_step = lambda *batch, **hints: (updates.append(batch), update(*batch, **hints))[1]
    model.learn(SMALL["num_envs"] * SMALL["num_steps"], progress_bar=False)
    assert updates
    for obs, state, starts, layout, actions, old_log_probs, *_ in updates:
        with torch.no_grad():
            log_probs = model.policy.evaluate(model.policy.sequence_features(obs, state, starts, layout), actions)[0]
        torch.testing.assert_close(log_probs, old_log_probs, rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        model.policy.sde.log_std.fill_(1.0)  # sigma e, where log_std_init gives exp(-1)
    model.save(tmp_path / "model")
    loaded = RecurrentPPO.load(tmp_path / "model")
    assert loaded.config.use_sde and loaded.config.use_expln
    torch.testing.assert_close(loaded.policy.sde.log_std, model.policy.sde.log_std)
    assert 1.0 < loaded.policy.sde.exploration.std().item() < 2.6  # (expln(1) = 1.69, not 0.37; 16 draws)
    obs = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    np.testing.assert_array_equal(loaded.predict(obs, deterministic=True)[0], model.predict(obs, deterministic=True)[0])


def test_gsde_on_discrete_actions_is_one_sentence():
    with pytest.raises(UserError, match=r"^use_sde=true needs a Box action space .*: drop use_sde for recurrent_ppo"):
        _small_model(use_sde=True)
