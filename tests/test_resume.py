"""Exact resume: a run killed after a checkpoint and resumed is bitwise the uninterrupted run (CPU, native envs)."""

from __future__ import annotations

import contextlib
import csv
import os
import random
import shutil
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import checkpoint_metadata, checkpoint_tensors

from rlspeed import A2C, DQN, PPO, SAC, TD3, RecurrentPPO
from rlspeed.algos.off_policy import REPLAY_SUFFIX
from rlspeed.envs.base import BatchedEnv, EnvSpec

TOTAL = 512
CHECKPOINT_FREQ = 192


class Killed(BaseException):  # (past `except Exception`: a kill runs no handler)
    """Stands for a kill -9 right after the checkpoint was written."""


ON_POLICY = (PPO, A2C, RecurrentPPO)


def _settings(algo):
    if algo is A2C:
        return dict(num_envs=4, num_steps=8, net_arch=(16, 16))
    if algo is RecurrentPPO:  # (the LSTM state each env carries, and where episodes start, carry over too)
        return dict(num_envs=4, num_steps=32, batch_size=64, n_epochs=2, net_arch=(16,), lstm_hidden_size=8)
    if algo is PPO:
        return dict(num_envs=4, num_steps=32, batch_size=64, n_epochs=2, net_arch=(16, 16), normalize_obs=True,
                    normalize_reward=True)
    if algo is SAC:
        return dict(num_envs=2, learning_starts=64, batch_size=32, net_arch=(16, 16), buffer_size=2000, n_step=3,
                    save_replay_buffer=True, normalize_obs=True, normalize_reward=True)
    if algo is TD3:  # (the Ornstein-Uhlenbeck noise and the policy delay's count carry over too)
        return dict(num_envs=2, learning_starts=64, batch_size=32, net_arch=(16, 16), buffer_size=2000,
                    action_noise="ornstein-uhlenbeck", save_replay_buffer=True)
    return dict(num_envs=4, learning_starts=64, batch_size=32, net_arch=(16, 16), buffer_size=2000, train_freq=2,
                target_update_interval=128, save_replay_buffer=True)


def _model(algo, env_id):
    return algo(env_id, seed=3, device="cpu", env_backend="torch", **_settings(algo))


@pytest.mark.parametrize(("algo", "env_id"), [(PPO, "Pendulum-v1"), (PPO, "CartPole-v1"), (SAC, "Pendulum-v1"),
                                              (TD3, "Pendulum-v1"), (DQN, "CartPole-v1"), (A2C, "CartPole-v1"),
                                              (RecurrentPPO, "CartPoleNoVel-v1")])
def test_a_resumed_run_is_bitwise_the_uninterrupted_run(tmp_path, algo, env_id):
    """Train to TOTAL with checkpoints; train again and kill it right after its first checkpoint; resume a fresh
    model from that checkpoint and train on to TOTAL: every tensor of the final state (weights, optimiser moments,
    normalisation statistics, env states and random streams, generators, replay buffer) equals the uninterrupted
    run's, with torch.equal."""
    uninterrupted = _model(algo, env_id)
    uninterrupted.learn(TOTAL, progress_bar=False, run_dir=tmp_path / "a", checkpoint_freq=CHECKPOINT_FREQ)
    expected = uninterrupted.save(tmp_path / "a" / "final")

    def kill_after_checkpoint(local):
        if (tmp_path / "b" / "checkpoint.safetensors").exists():
            raise Killed

    killed = _model(algo, env_id)
    with pytest.raises(Killed):
        killed.learn(TOTAL, progress_bar=False, run_dir=tmp_path / "b", checkpoint_freq=CHECKPOINT_FREQ,
                     callback=kill_after_checkpoint)
    checkpoint = tmp_path / "b" / "checkpoint.safetensors"
    assert 0 < checkpoint_metadata(checkpoint)["num_timesteps"] < TOTAL
    # the process dies: anything left in the global generators must not matter
    torch.manual_seed(12345), np.random.seed(54321), random.seed(999)

    resumed = _model(algo, env_id)
    resumed.resume(checkpoint)
    resumed.learn(TOTAL - resumed.num_timesteps, progress_bar=False, run_dir=tmp_path / "b",
                  checkpoint_freq=CHECKPOINT_FREQ)
    assert resumed.num_timesteps == uninterrupted.num_timesteps == TOTAL
    assert resumed.restarts == 1
    # metrics.csv goes on where the checkpoint left it: steps and the training clock both increase row by row
    with open(tmp_path / "b" / "metrics.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    for key in ("timesteps", "train_wall_s"):
        values = [float(row[key]) for row in rows]
        assert values == sorted(values) and len(set(values)) == len(values), (key, values)
    got = resumed.save(tmp_path / "b" / "final")

    want_tensors, got_tensors = checkpoint_tensors(expected), checkpoint_tensors(got)
    assert want_tensors.keys() == got_tensors.keys()
    assert any(name.startswith("resume.env.") for name in want_tensors)  # the native env's state is in there
    different = [name for name in want_tensors if not torch.equal(want_tensors[name], got_tensors[name])]
    assert different == []
    want_meta, got_meta = checkpoint_metadata(expected)["resume"], checkpoint_metadata(got)["resume"]
    assert got_meta["rng"] == want_meta["rng"]
    assert got_meta["loop"]["next_checkpoint"] == want_meta["loop"]["next_checkpoint"]
    if algo not in ON_POLICY:  # the replay buffers, saved beside the checkpoints, hold the same transitions
        want_replay = checkpoint_tensors(expected.with_name("final" + REPLAY_SUFFIX))
        got_replay = checkpoint_tensors(got.with_name("final" + REPLAY_SUFFIX))
        assert want_replay.keys() == got_replay.keys()
        assert all(torch.equal(want_replay[name], got_replay[name]) for name in want_replay)


def test_steps_to_target_counts_from_the_start_of_the_run_and_restarts_count_resumes(tmp_path):
    """A target reached after a resume is reported in steps since the run's start, not since the resume; each
    resume of the run counts once more."""
    settings = dict(seed=0, device="cpu", env_backend="torch", num_envs=4, num_steps=32, batch_size=64, n_epochs=2,
                    net_arch=(16,))
    first = PPO("CartPole-v1", **settings)
    first.learn(512, progress_bar=False, run_dir=tmp_path, checkpoint_freq=256)
    second = PPO("CartPole-v1", **settings)
    second.resume(tmp_path / "checkpoint.safetensors")
    resumed_at = second.num_timesteps
    assert resumed_at == 512 and second.restarts == 1
    second.learn(256, progress_bar=False, run_dir=tmp_path, checkpoint_freq=128, target_return=-1.0, eval_freq=128)
    assert second.result.steps_to_target == resumed_at + 128  # evaluated at 640 steps of the run
    # the rest of the result counts the same run (its steps and clocks were this call's, the target's the run's)
    result = second.result
    assert result.total_timesteps == second.num_timesteps == 640
    assert result.evaluations[0][:2] == (640, result.time_to_target_s)
    assert result.train_wall_s >= result.time_to_target_s > first.result.train_wall_s
    assert result.sps == pytest.approx(result.total_timesteps / result.train_wall_s)
    third = PPO("CartPole-v1", **settings)
    third.resume(tmp_path / "checkpoint.safetensors")
    assert third.restarts == 2


def test_resuming_gymnasium_envs_says_what_cannot_be_restored(tmp_path):
    settings = dict(seed=0, device="cpu", env_backend="gymnasium", num_envs=2, num_steps=16, batch_size=32,
                    n_epochs=1, net_arch=(8,))
    PPO("CartPole-v1", **settings).learn(64, progress_bar=False, run_dir=tmp_path, checkpoint_freq=32)
    resumed = PPO("CartPole-v1", **settings)
    resumed.resume(tmp_path / "checkpoint.safetensors")
    with pytest.warns(UserWarning, match="cannot restore their episodes in progress"):
        resumed.learn(32, progress_bar=False)


@pytest.mark.parametrize("algo", [PPO, DQN])
def test_a_resume_from_a_model_saved_before_training_is_the_uninterrupted_run_without_a_warning(algo, tmp_path):
    """A model saved before any step (its file holds no optimiser state: `"optimizers": {}`) resumes into the run a
    new model trains: bitwise on Gymnasium envs too, with no episode in progress or transition to lose, so no warning
    says the run differs (it said the episodes and the replay buffer start afresh, "not identical")."""
    import warnings

    settings = dict(seed=0, device="cpu", env_backend="gymnasium", num_envs=2, net_arch=(8,),
                    **({"num_steps": 16, "batch_size": 32, "n_epochs": 1} if algo is PPO else
                       {"learning_starts": 16, "batch_size": 8}))
    path = algo("CartPole-v1", **settings).save(tmp_path / "fresh")
    meta = checkpoint_metadata(path)
    assert meta["optimizers"] == {} and meta["num_timesteps"] == 0
    uninterrupted, resumed = algo("CartPole-v1", **settings), algo("CartPole-v1", **settings)
    resumed.resume(path)
    uninterrupted.learn(64, progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resumed.learn(64, progress_bar=False)
    assert all(torch.equal(a, b) for a, b in zip(uninterrupted.policy.parameters(), resumed.policy.parameters()))
    assert resumed.num_timesteps == uninterrupted.num_timesteps == 64


def test_resuming_into_a_model_of_other_env_options_says_so(tmp_path):
    """`resume` continues a run after a restart: a model made without the run's env options (or with others) went on
    training on another env without a word; the same options resume in silence."""
    import warnings

    settings = dict(seed=0, device="cpu", env_backend="gymnasium", num_envs=2, batch_size=32, learning_starts=32,
                    net_arch=(8,))
    SAC("Pendulum-v1", env_kwargs={"g": 6.0}, **settings).learn(64, progress_bar=False, run_dir=tmp_path,
                                                               checkpoint_freq=32)
    with pytest.warns(UserWarning, match=r"made with the options \{'g': 6.0\} and this model's env has \{\}"):
        SAC("Pendulum-v1", **settings).resume(tmp_path / "checkpoint.safetensors")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        SAC("Pendulum-v1", env_kwargs={"g": 6.0}, **settings).resume(tmp_path / "checkpoint.safetensors")


@pytest.mark.parametrize("num_envs", [2, 3])
def test_steps_waiting_for_their_n_step_return_are_not_joined_to_the_fresh_episodes_of_a_resume(tmp_path, num_envs):
    """A checkpoint of Gymnasium envs holds the replay buffer's steps still waiting for their n-step return; the
    resumed run's envs start fresh episodes, to which those steps were joined (an impossible transition per env and
    pending step), or with other num_envs crashed in torch.stack. They are stored as shorter returns, their episodes
    truncated at the checkpoint, and the new episodes' steps wait for their own."""
    settings = dict(seed=0, device="cpu", env_backend="gymnasium", learning_starts=16, batch_size=8, n_step=3,
                    buffer_size=500, net_arch=(8,), save_replay_buffer=True)
    DQN("CartPole-v1", num_envs=2, **settings).learn(101, progress_bar=False, run_dir=tmp_path, checkpoint_freq=50)
    assert checkpoint_metadata(tmp_path / "checkpoint.safetensors")["num_timesteps"] % 2 == 0
    resumed = DQN("CartPole-v1", num_envs=num_envs, **settings)
    resumed.resume(tmp_path / "checkpoint.safetensors")
    loaded_rows = []
    load_replay = resumed._load_replay

    def _load_replay(resume):
        loaded = load_replay(resume)  # (the rows stored, and those of the steps still waiting: 2 steps of 2 envs)
        loaded_rows.append((resumed.buffer.size, sum(step[2].shape[0] for step in resumed.buffer._window)))
        return loaded

    resumed._load_replay = _load_replay
    with pytest.warns(UserWarning, match="cannot restore their episodes in progress"):
        resumed.learn(4 * num_envs, progress_bar=False)
    (stored, waiting), = loaded_rows
    assert stored > 0 and stored + waiting == resumed.buffer.size - 2 * num_envs
    assert waiting == (4 if num_envs == 2 else 0)  # (with other num_envs: stored while loading)
    # four steps of fresh episodes: the first n - 1 = 2 only fill the n-step window, the next 2 store a row per env
    assert len(resumed.buffer._window) == 2 and resumed.buffer._window[0][2].shape[0] == num_envs


def test_a_checkpoint_without_resume_state_still_resumes_and_loads(tmp_path):
    """Checkpoints written before they carried the resume state (no `resume` metadata, no `resume.*` tensors) load
    and resume as before: fresh episodes, the saved weights."""
    from rlspeed.checkpoint import load_checkpoint, save_checkpoint

    settings = dict(seed=0, device="cpu", env_backend="torch", num_envs=2, num_steps=16, batch_size=32, n_epochs=1,
                    net_arch=(8,))
    model = PPO("CartPole-v1", **settings).learn(64, progress_bar=False)
    tensors, meta = load_checkpoint(model.save(tmp_path / "new"))
    old_tensors = {name: value for name, value in tensors.items() if not name.startswith("resume.")}
    old_meta = {key: value for key, value in meta.items() if key not in ("resume", "digest", "format", "version")}
    old = save_checkpoint(tmp_path / "old", old_tensors, old_meta)
    loaded = PPO.load(old, device="cpu")
    assert torch.equal(loaded.policy.state_dict()["body.weights.0"], model.policy.state_dict()["body.weights.0"])
    resumed = PPO("CartPole-v1", **settings)
    resumed.resume(old)
    assert resumed.restarts == 1
    with pytest.warns(UserWarning, match="fresh episodes"):
        resumed.learn(32, progress_bar=False)


def test_learn_after_load_says_that_the_replay_buffer_saved_beside_the_model_is_not_read(tmp_path):
    """`Algo.load` builds a new model: its learn starts an empty replay buffer (waiting learning_starts
    transitions), though the file beside it holds the run's: the first learn says so and names `resume`, once; a
    resume reads it and says nothing."""
    import warnings

    model = DQN("CartPole-v1", seed=0, learning_starts=64, batch_size=16, save_replay_buffer=True)
    model.learn(128, progress_bar=False)
    path = model.save(tmp_path / "model")
    loaded = DQN.load(path)
    with pytest.warns(UserWarning, match="model.replay.safetensors' beside the loaded model holds its run's replay "
                                         "buffer, which load does not read") as caught:
        loaded.learn(64, progress_bar=False)
    assert all(w.filename == __file__ for w in caught if "replay buffer" in str(w.message))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*beside the loaded model")
        loaded.learn(64, progress_bar=False)  # (said once)
        resumed = DQN("CartPole-v1", seed=0, learning_starts=64, batch_size=16, save_replay_buffer=True)
        resumed.resume(path)
        resumed.learn(64, progress_bar=False)
    assert resumed.buffer.size > loaded.buffer.size  # (the saved rows too)


@pytest.mark.parametrize("kill", ["before the checkpoint", "after the checkpoint"])
def test_a_kill_between_a_replay_file_and_its_checkpoint_leaves_a_whole_pair(tmp_path, monkeypatch, kill):
    """The replay file was written under its final name before the checkpoint: a kill in between left the previous
    checkpoint with a replay of another token (refilled from empty). It is staged now: before the checkpoint's write
    the previous pair stays whole; after it, resume takes the staged file as the new checkpoint's."""
    import warnings

    from rlspeed import checkpoint as checkpoint_module

    settings = dict(seed=0, device="cpu", env_backend="torch", learning_starts=16, batch_size=8, buffer_size=500,
                    net_arch=(8,), save_replay_buffer=True)
    model = DQN("CartPole-v1", **settings)
    model.learn(64, progress_bar=False)
    first = model.save(tmp_path / "checkpoint")
    rows = model.buffer.size
    model.learn(64, progress_bar=False)
    if kill == "before the checkpoint":
        write = checkpoint_module.save_checkpoint

        def killed(path, *args, **kwargs):
            if "replay" in os.path.basename(path):  # (the replay's is written before the model's file)
                return write(path, *args, **kwargs)
            raise KeyboardInterrupt

        monkeypatch.setattr(checkpoint_module, "save_checkpoint", killed)
    else:
        monkeypatch.setattr(checkpoint_module, "commit_staged", lambda file: None)
    with contextlib.suppress(KeyboardInterrupt):
        model.save(tmp_path / "checkpoint")
    monkeypatch.undo()
    assert checkpoint_module.staged_path(tmp_path / "checkpoint.replay.safetensors").is_file()
    resumed = DQN("CartPole-v1", **settings)
    resumed.resume(first)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*refills from empty")
        resumed.learn(8, progress_bar=False)
    expected = rows if kill == "before the checkpoint" else model.buffer.size
    assert resumed.buffer.size == expected + 8


def test_a_kill_before_the_first_replay_file_was_moved_into_place_resumes_with_it(tmp_path, monkeypatch):
    """The first checkpoint of a run written, its replay file still under its staged name (a kill before
    `commit_staged`; no earlier replay file beside it): the resume moves the staged file into place and takes its
    rows, rather than refilling the buffer from empty."""
    import warnings

    from rlspeed import checkpoint as checkpoint_module

    settings = dict(seed=0, device="cpu", env_backend="torch", learning_starts=16, batch_size=8, buffer_size=500,
                    net_arch=(8,), save_replay_buffer=True)
    model = DQN("CartPole-v1", **settings)
    model.learn(64, progress_bar=False)
    monkeypatch.setattr(checkpoint_module, "commit_staged", lambda file: None)
    model.save(tmp_path / "checkpoint")
    monkeypatch.undo()
    replay = tmp_path / "checkpoint.replay.safetensors"
    assert not replay.exists() and checkpoint_module.staged_path(replay).is_file()
    resumed = DQN("CartPole-v1", **settings)
    resumed.resume(tmp_path / "checkpoint.safetensors")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*refills from empty")
        resumed.learn(8, progress_bar=False)
    assert resumed.buffer.size == model.buffer.size + 8
    assert replay.is_file() and not checkpoint_module.staged_path(replay).exists()


def test_a_copy_of_an_older_checkpoint_does_not_take_the_replay_buffer_a_later_save_wrote(tmp_path):
    """A checkpoint copied aside names the replay file beside it (`checkpoint.replay.safetensors`), which the next
    save rewrites: resumed from the copy, the model says that file belongs to a later save and refills its buffer
    from empty, rather than taking the later rows (the file's token is not the copy's)."""
    settings = dict(seed=0, device="cpu", env_backend="torch", learning_starts=16, batch_size=8, buffer_size=500,
                    net_arch=(8,), save_replay_buffer=True)
    model = DQN("CartPole-v1", **settings)
    model.learn(64, progress_bar=False)
    shutil.copy(model.save(tmp_path / "checkpoint"), tmp_path / "older.safetensors")
    model.learn(64, progress_bar=False)
    model.save(tmp_path / "checkpoint")
    resumed = DQN("CartPole-v1", **settings)
    resumed.resume(tmp_path / "older.safetensors")
    with pytest.warns(UserWarning, match="checkpoint.replay.safetensors' does not belong to .*older.safetensors' "
                                         r"\(a later save wrote it\); the replay buffer refills from empty"):
        resumed.learn(8, progress_bar=False)
    assert resumed.buffer.size == 8
    again = DQN("CartPole-v1", **settings)  # (the later checkpoint takes its own)
    again.resume(tmp_path / "checkpoint.safetensors")
    again.learn(8, progress_bar=False)
    assert again.buffer.size == model.buffer.size + 8


def test_a_resume_whose_replay_file_records_normalised_rows_refills_the_buffer_from_empty(tmp_path):
    """A replay file beside a checkpoint whose rows are recorded as normalised (the buffer holds the env's own, which
    rows normalised with the statistics of their time cannot be turned back into) is not loaded on resume: the model
    says why and refills its buffer from empty."""
    from rlspeed.checkpoint import save_checkpoint

    settings = dict(seed=0, device="cpu", env_backend="torch", learning_starts=16, batch_size=8, buffer_size=500,
                    net_arch=(8,), save_replay_buffer=True)
    model = DQN("CartPole-v1", **settings)
    model.learn(64, progress_bar=False)
    path = model.save(tmp_path / "checkpoint")
    replay = tmp_path / "checkpoint.replay.safetensors"
    tensors, meta = checkpoint_tensors(replay), checkpoint_metadata(replay)
    del meta["digest"]
    meta["replay_buffer"]["contents"] = {"observations": "raw", "rewards": "normalised"}
    save_checkpoint(replay, tensors, meta)
    resumed = DQN("CartPole-v1", **settings)
    resumed.resume(path)
    with pytest.warns(UserWarning, match=r"checkpoint.replay.safetensors' cannot fill this model's replay buffer: its "
                                         r"rows hold rewards 'normalised'.*; it refills from empty"):
        resumed.learn(8, progress_bar=False)
    assert resumed.buffer.size == 8


@pytest.mark.parametrize("saved", [False, True])
def test_a_resume_from_a_checkpoint_without_its_replay_buffer_says_the_buffer_refills(tmp_path, saved):
    """A single off-policy run resumed from a checkpoint saved without its replay buffer refilled it from empty, and
    waited learning_starts steps for updates, without a word (a population's resume says it): it warns now."""
    import warnings

    options = {"env_backend": "torch", "learning_starts": 32, "seed": 0, "save_replay_buffer": saved}
    DQN("CartPole-v1", **options).learn(128, progress_bar=False, run_dir=tmp_path, checkpoint_freq=64)
    resumed = DQN("CartPole-v1", **options)
    resumed.resume(tmp_path / "checkpoint.safetensors")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed.learn(64, progress_bar=False)
    said = [str(warning.message) for warning in caught if "holds no replay buffer" in str(warning.message)]
    assert len(said) == (0 if saved else 1)
    assert saved or "refills from empty and updates wait for learning_starts" in said[0]


class _Maze(BatchedEnv):
    """A batched env of a user's own: a 3x3 grid walked to its far corner (6 steps at most), a Dict observation (the
    cell's index and the steps taken), the moves off the grid masked, and `state_dict` restoring its episodes."""

    backend = "mine"

    def __init__(self):
        self.num_envs, self.device = 2, torch.device("cpu")
        space = gym.spaces.Dict({"cell": gym.spaces.Discrete(9), "steps": gym.spaces.Box(0, 6, (1,), np.float32)})
        self.spec = EnvSpec("my-maze", (), gym.spaces.Discrete(4), 6, None, space)
        self.cell, self.t = torch.zeros(2, dtype=torch.int64), torch.zeros(2, dtype=torch.int64)

    def _out(self):
        row, col = self.cell // 3, self.cell % 3
        mask = torch.stack([col > 0, row < 2, col < 2, row > 0], -1)  # (left, down, right, up)
        return {"cell": self.cell.clone(), "steps": self.t[:, None].float()}, mask

    def reset(self, seed=None):
        self.cell, self.t = torch.zeros_like(self.cell), torch.zeros_like(self.t)
        obs, mask = self._out()
        return obs, {"action_mask": mask}

    def step(self, actions):
        row = (self.cell // 3 + (actions == 1).long() - (actions == 3).long()).clamp(0, 2)
        col = (self.cell % 3 + (actions == 2).long() - (actions == 0).long()).clamp(0, 2)
        self.cell, self.t = row * 3 + col, self.t + 1
        final, _ = self._out()
        terminated = self.cell == 8
        truncated = (self.t >= 6) & ~terminated
        done = terminated | truncated
        self.cell, self.t = torch.where(done, 0, self.cell), torch.where(done, 0, self.t)
        obs, mask = self._out()
        return obs, terminated.float(), terminated, truncated, {"final_obs": final, "action_mask": mask}

    def state_dict(self):
        return {"cell": self.cell.clone(), "t": self.t.clone()}

    def load_state_dict(self, state):
        self.cell, self.t = state["cell"].clone(), state["t"].clone()


@pytest.mark.parametrize("algo", [PPO, DQN])
def test_a_batched_env_of_ones_own_with_a_dict_observation_and_masks_resumes_its_episodes(tmp_path, algo):
    """A checkpoint of a run on a user's env with a Dict observation kept no env state (only a single tensor
    observation was saved), so the resume warned that 'mine envs cannot restore their episodes in progress' though
    the env has `state_dict`, and started fresh episodes; a restored run also lost its first step's action masks.
    Now the observation's keys and the masks are saved with the env's state: the resumed run is the uninterrupted
    one."""
    settings = dict(seed=3, device="cpu", net_arch=(8,),
                    **({"num_steps": 8, "batch_size": 16, "n_epochs": 1} if algo is PPO else
                       {"learning_starts": 16, "batch_size": 8, "train_freq": 2, "buffer_size": 1000,
                        "save_replay_buffer": True}))
    uninterrupted = algo(_Maze(), **settings)
    uninterrupted.learn(64, progress_bar=False, run_dir=tmp_path / "a", checkpoint_freq=32)

    def kill_after_checkpoint(local):
        if (tmp_path / "b" / "checkpoint.safetensors").exists():
            raise Killed

    with pytest.raises(Killed):
        algo(_Maze(), **settings).learn(64, progress_bar=False, run_dir=tmp_path / "b", checkpoint_freq=32,
                                        callback=kill_after_checkpoint)
    resumed = algo(_Maze(), **settings)
    resumed.resume(tmp_path / "b" / "checkpoint.safetensors")
    assert 0 < resumed.num_timesteps < 64
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resumed.learn(64 - resumed.num_timesteps, progress_bar=False, run_dir=tmp_path / "b", checkpoint_freq=32)
    assert resumed._masking  # (the masks reached the restored first step: without them it trained unmasked)
    assert all(torch.equal(a, b) for a, b in zip(uninterrupted.policy.parameters(), resumed.policy.parameters()))
    assert resumed._env.state_dict().keys() == uninterrupted._env.state_dict().keys()
    assert all(torch.equal(uninterrupted._env.state_dict()[key], value)
               for key, value in resumed._env.state_dict().items())
