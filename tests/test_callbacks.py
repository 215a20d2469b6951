"""Callbacks (rlspeed.callbacks): the points learn calls them at, stop semantics, EvalCallback's best model,
CheckpointCallback's files, the older plain-function form, and that callbacks add no host reads to the loop."""

from __future__ import annotations

import csv
import functools
import re
import types
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlspeed import DQN, PPO, RecurrentPPO, UserError
from rlspeed.callbacks import (
    BaseCallback,
    CallbackList,
    CheckpointCallback,
    EvalCallback,
    EveryNTimesteps,
    StopTrainingOnNoModelImprovement,
    StopTrainingOnRewardThreshold,
    VideoRecorderCallback,
    _Period,
    next_due,
    resumed_due,
)
from rlspeed.evaluation import evaluate
from rlspeed.logging import RunLogger

# Native CartPole, 16 envs x 32 steps: 512 env steps per iteration
STEPS_PER_ITERATION = 512


def _ppo(**kwargs) -> PPO:
    return PPO("CartPole-v1", seed=0, device="cpu", env_backend="torch", num_envs=16, num_steps=32, batch_size=256,
               **kwargs)


def _small_ppo() -> PPO:
    """A PPO of 128-step iterations (4 envs x 32 steps) and one small update each: a learn-level test of the loop's
    schedule in a fraction of a second."""
    return PPO("CartPole-v1", seed=0, device="cpu", env_backend="torch", num_envs=4, num_steps=32, batch_size=128,
               n_epochs=1, net_arch=(8,))


class Recorder(BaseCallback):
    """Records which hook ran, at which step, and whether it got a metrics row."""

    def __init__(self, stop_at_call: int | None = None, hook: str = "_on_rollout_end"):
        super().__init__()
        self.events: list[tuple] = []
        self.stop_at_call, self.hook = stop_at_call, hook

    def _on_training_start(self):
        self.events.append(("start", self.num_timesteps))

    def _on_rollout_start(self):
        self.events.append(("rollout_start", self.num_timesteps))

    def _on_rollout_end(self):
        self.events.append(("rollout_end", self.num_timesteps, self.metrics is not None))
        if self.hook == "_on_rollout_end" and self.n_calls == self.stop_at_call:
            return False
        return None

    def _on_step(self):
        return not (self.hook == "_on_step" and self.n_calls == self.stop_at_call)

    def _on_evaluation(self):
        self.events.append(("evaluation", self.num_timesteps, self.evaluation["episodes"]))

    def _on_training_end(self):
        self.events.append(("end", self.num_timesteps))


def test_hooks_run_in_order_and_get_the_row_only_at_log_points():
    model = _ppo()
    recorder = Recorder()
    # a log interval no iteration reaches: only the last iteration (the run's end) reads metrics
    model.learn(4 * STEPS_PER_ITERATION, callback=recorder, progress_bar=False, log_interval_s=1e9,
                target_return=1e9, eval_freq=2 * STEPS_PER_ITERATION, eval_episodes=2)
    steps = [STEPS_PER_ITERATION * i for i in range(1, 5)]
    assert recorder.events == [
        ("start", 0),
        ("rollout_start", 0), ("rollout_end", steps[0], False),
        ("rollout_start", steps[0]),
        ("evaluation", steps[1], 2), ("rollout_end", steps[1], True),  # an evaluation is a log point
        ("rollout_start", steps[1]), ("rollout_end", steps[2], False),
        ("rollout_start", steps[2]),
        ("evaluation", steps[3], 2), ("rollout_end", steps[3], True),
        ("end", steps[3]),
    ]
    assert recorder.n_calls == 4 and recorder.model is model


def test_every_iteration_gets_the_row_when_every_iteration_logs():
    recorder = Recorder()
    _ppo().learn(3 * STEPS_PER_ITERATION, callback=recorder, progress_bar=False, log_interval_s=0)
    rows = [event[2] for event in recorder.events if event[0] == "rollout_end"]
    assert rows == [True, True, True]


@pytest.mark.parametrize("hook", ["_on_rollout_end", "_on_step"])
def test_returning_false_stops_training_at_the_end_of_that_iteration(hook):
    model = _ppo()
    recorder = Recorder(stop_at_call=2, hook=hook)
    model.learn(20 * STEPS_PER_ITERATION, callback=recorder, progress_bar=False)
    assert model.num_timesteps == 2 * STEPS_PER_ITERATION
    assert recorder.events[-1] == ("end", 2 * STEPS_PER_ITERATION)  # training end still runs after a stop


@pytest.mark.parametrize("stop_at_call", [3, 4])  # (3: a stop between two checkpoints; 4: at a checkpoint's step)
def test_a_callback_stop_leaves_the_runs_checkpoint_where_training_stopped(tmp_path, stop_at_call):
    """As a run that spent its budget or reached its target: `resume` goes on from where the callback stopped it,
    not from the last periodic checkpoint, and the resumed run's metrics.csv goes on from there."""
    model = _ppo()
    model.learn(20 * STEPS_PER_ITERATION, callback=Recorder(stop_at_call=stop_at_call, hook="_on_step"),
                progress_bar=False, run_dir=tmp_path, checkpoint_freq=2 * STEPS_PER_ITERATION)
    assert model.num_timesteps == stop_at_call * STEPS_PER_ITERATION
    assert PPO.load(tmp_path / "checkpoint.safetensors", device="cpu").num_timesteps == model.num_timesteps
    resumed = _ppo()
    resumed.resume(tmp_path / "checkpoint.safetensors")
    resumed.learn(STEPS_PER_ITERATION, progress_bar=False, run_dir=tmp_path, checkpoint_freq=2 * STEPS_PER_ITERATION)
    with open(tmp_path / "metrics.csv") as file:
        steps = [int(row["timesteps"]) for row in csv.DictReader(file)]
    assert steps == sorted(set(steps)) and steps[-1] == (stop_at_call + 1) * STEPS_PER_ITERATION


def test_old_plain_callable_still_works_and_can_stop():
    seen = []

    def callback(local_vars: dict):
        seen.append(local_vars["self"].num_timesteps)
        return len(seen) < 3

    model = _ppo()
    model.learn(20 * STEPS_PER_ITERATION, callback=callback, progress_bar=False)
    assert seen == [STEPS_PER_ITERATION * i for i in (1, 2, 3)]
    assert model.num_timesteps == 3 * STEPS_PER_ITERATION


def test_stable_baselines3_callback_code_runs(tmp_path):
    """What a callback written for Stable-Baselines3 uses: `self.logger.record` (its values land in the next metrics
    row: metrics.csv, and `self.metrics` of later iterations), `_on_rollout_start`, and a plain function of
    `(locals, globals)`."""
    import csv

    class Logging(BaseCallback):
        starts = 0
        rows = []

        def _on_rollout_start(self):
            self.starts += 1

        def _on_step(self):
            self.rows.append(self.metrics)
            self.logger.record("custom/calls", self.n_calls)
            self.logger.record("custom/tensor", torch.tensor(0.5))
            return True

    seen = []
    callback = Logging()
    _ppo().learn(3 * STEPS_PER_ITERATION, callback=[callback, lambda _locals, _globals: seen.append(
        ("PPO" in _globals, _locals["self"].num_timesteps))], progress_bar=False, log_interval_s=0, run_dir=tmp_path)
    assert callback.starts == 3 and callback.rows[2]["custom/calls"] == 2  # (recorded in call 2, written in row 3)
    assert callback.metrics["custom/calls"] == 3  # (at training end: the last row as metrics.csv has it)
    rows = list(csv.DictReader((tmp_path / "metrics.csv").open()))
    # (each iteration's value in the next row; the last iteration's joins its own row when learn ends)
    assert [float(row["custom/calls"]) if row["custom/calls"] else None for row in rows] == [None, 1.0, 3.0]
    assert seen == [(True, STEPS_PER_ITERATION * i) for i in (1, 2, 3)]
    with pytest.warns(UserWarning, match="numbers only, so this str is left out"):
        callback.logger.record("custom/text", "abc")
    callback.logger.record("custom/text", "again")  # (warned once per key)
    assert "custom/text" not in callback.logger.values


def test_eval_callback_evaluates_on_a_vector_env_the_user_built():
    """For an env with no registered id (here a variant of one), evaluation runs on a vector env the user built, once
    per eval_freq, by default one episode per env, the env kept open between evaluations."""
    import gymnasium as gym

    def make():
        return gym.make("CartPole-v1", max_episode_steps=30)

    same_step = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}
    training, evaluation_env = (gym.vector.SyncVectorEnv([make] * 4, **same_step) for _ in range(2))
    evaluation = EvalCallback(evaluation_env, eval_freq=128, verbose=0)
    model = PPO(training, seed=0, device="cpu", num_steps=32, batch_size=64)
    assert model.env_id == "user-vector-env"
    model.learn(384, callback=evaluation, progress_bar=False)
    assert evaluation.evaluations_timesteps == [128, 256, 384]
    assert all(len(returns) == 4 and max(returns) <= 30 for returns in evaluation.evaluations_results)
    # (CartPole pays 1 per step: each episode's length is its return)
    assert evaluation.evaluations_length == [[int(r) for r in rs] for rs in evaluation.evaluations_results]


def test_callback_list_stops_when_any_member_stops_and_runs_all():
    first, second = Recorder(), Recorder(stop_at_call=1)
    model = _ppo()
    model.learn(10 * STEPS_PER_ITERATION, callback=[first, second], progress_bar=False)
    assert model.num_timesteps == STEPS_PER_ITERATION
    assert [e[0] for e in first.events] == ["start", "rollout_start", "rollout_end", "end"]


@pytest.mark.parametrize("callback, words", [
    (5, "callback must be"),
    ([None], "A list of callbacks holds None"),  # (an AttributeError of NoneType)
    (EvalCallback, r"callback=EvalCallback is the class: pass an instance"),  # (taken for a function)
    (lambda: True, "A function callback takes learn's locals"),  # (a TypeError at the first iteration)
])
def test_learn_refuses_a_callback_of_another_kind(callback, words):
    model = _ppo()
    with pytest.raises(UserError, match=words):
        model.learn(STEPS_PER_ITERATION, callback=callback, progress_bar=False)
    assert model.num_timesteps == 0


@pytest.mark.parametrize("make, words", [
    (lambda: EveryNTimesteps(10, callback=None), "needs the callback to run"),
    (lambda: EveryNTimesteps(1.5, callback=CallbackList([])), "n_steps must be a whole number >= 1, got 1.5"),
    (lambda: EvalCallback("CartPole-v1", eval_freq="32"), "eval_freq must be a whole number >= 1, got '32'"),
    (lambda: EvalCallback("CartPole-v1", n_eval_episodes=0), "n_eval_episodes must be a whole number >= 1, got 0"),
    (lambda: CheckpointCallback(save_freq=32, save_path=None), "save_path is a directory's path"),
    (lambda: CheckpointCallback(32, "ckpt", keep_last=0), "keep_last must be a whole number >= 1, got 0"),
    # (a separator saved into a folder of its own under save_path; strings were taken as True)
    (lambda: CheckpointCallback(32, "ckpt", name_prefix="run/a"), "name_prefix is the start of each file's name, a "
                                                                  "str without a path separator.*got 'run/a'"),
    (lambda: CheckpointCallback(32, "ckpt", save_replay_buffer="no"), r"save_replay_buffer=...\) is True or False"),
    (lambda: CheckpointCallback(32, "ckpt", save_vecnormalize="yes"), r"save_vecnormalize=...\) is True or False"),
    # (a TypeError of '<' between str and int, pathlib's TypeError; 'no' was taken as True)
    (lambda: VideoRecorderCallback("32", "videos"), "video_every must be a whole number >= 1, got '32'"),
    (lambda: VideoRecorderCallback(1.5, "videos"), "video_every must be a whole number >= 1, got 1.5"),
    (lambda: VideoRecorderCallback(32, None), "video_folder is a path"),
    (lambda: VideoRecorderCallback(32, "videos", overwrite="no"), r"overwrite=...\) is True or False"),
    # (an AttributeError of the child's parent, a TypeError of pathlib, int()'s ValueError, iterating None)
    (lambda: EvalCallback("CartPole-v1", callback_on_new_best=3), "callback_on_new_best is a callback"),
    (lambda: EvalCallback("CartPole-v1", callback_after_eval=StopTrainingOnNoModelImprovement),
     r"callback_after_eval=StopTrainingOnNoModelImprovement is the class: pass an instance"),
    (lambda: EvalCallback("CartPole-v1", best_model_save_path=3), "best_model_save_path is a path"),
    (lambda: EvalCallback("CartPole-v1", log_path=b"logs"), "log_path is a path"),
    (lambda: StopTrainingOnNoModelImprovement("3"), "max_no_improvement_evals must be a whole number >= 0, got '3'"),
    # (a negative count stopped training at the first evaluation)
    (lambda: StopTrainingOnNoModelImprovement(-1), "max_no_improvement_evals must be a whole number >= 0, got -1"),
    (lambda: StopTrainingOnNoModelImprovement(3, min_evals=None), "min_evals must be a whole number >= 0, got None"),
    (lambda: CallbackList(None), "CallbackList takes a list of callbacks, got NoneType"),
    (lambda: CallbackList("callbacks"), "CallbackList takes a list of callbacks, got str"),
    # (what evaluate takes, by its rule: an AttributeError of num_envs was no sentence)
    # ("got a int" before)
    (lambda: EvalCallback(5), r"^EvalCallback takes a Gymnasium env id \(str\), a single gymnasium.Env, .*or a "
                              r"Stable-Baselines3 VecEnv, not 5 \(an int\)\.$"),
])
def test_callbacks_made_with_bad_values_are_one_sentence(make, words):
    with pytest.raises(UserError, match=words):
        make()


def test_an_eval_env_of_other_spaces_is_refused_before_training():
    """An EvalCallback's env object of other spaces than the model's (a single env, a Gymnasium or Stable-Baselines3
    vector env) is refused in evaluate's sentence before any step, not after eval_freq steps of training."""
    from stable_baselines3.common.env_util import make_vec_env

    same_step = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}
    model = _small_ppo()
    for env in (gym.make("Pendulum-v1"), make_vec_env("Pendulum-v1", n_envs=2),
                gym.make_vec("Pendulum-v1", num_envs=2, vectorization_mode="sync", vector_kwargs=same_step)):
        with pytest.raises(UserError, match=r"^Pendulum-v1 does not fit this model, trained on CartPole-v1: its "
                                            r"observations are .*; its actions are Box\(-2.0, 2.0"):
            model.learn(128, callback=EvalCallback(env, eval_freq=128), progress_bar=False)
        assert model.num_timesteps == 0
        env.close()


def test_step_counts_written_as_floats_are_taken_by_every_callback(tmp_path):
    """1e4 is a whole number of steps for every callback's interval, as for EvalCallback and CheckpointCallback:
    VideoRecorderCallback refused it ("must be at least 1 step, got 10000.0")."""
    assert VideoRecorderCallback(1e4, tmp_path / "videos").video_every == 10_000
    assert CheckpointCallback(1e4, tmp_path / "ckpt").save_freq == 10_000
    assert EvalCallback("CartPole-v1", eval_freq=1e4).eval_freq == 10_000


def test_a_callbacks_folder_that_cannot_be_made_is_one_sentence_at_learns_start(tmp_path):
    """A CheckpointCallback's save_path (an EvalCallback's log_path) with a file in its place was
    FileExistsError's traceback at learn's start; now one sentence naming the argument, before any step."""
    (tmp_path / "taken").write_text("a file")
    model = _ppo()
    logs = tmp_path / "taken" / "logs"
    for callback, name in ((CheckpointCallback(32, tmp_path / "taken"), "CheckpointCallback's save_path"),
                           (EvalCallback("CartPole-v1", log_path=logs), "EvalCallback's log_path")):
        with pytest.raises(UserError, match=f"{name} '.*' cannot be made a folder \\(a file is in its place"):
            model.learn(STEPS_PER_ITERATION, callback=callback, progress_bar=False)
    assert model.num_timesteps == 0


def test_eval_callback_evaluates_on_one_env_as_evaluate_takes_it():
    """Stable-Baselines3's EvalCallback(gym.make(...)) (its docs' example), a Monitor around it too, was refused while
    `rlspeed.evaluate(model, env)` took the env: now it evaluates on that env, options and all (here a lake without
    slips, where every deterministic episode is the same), running its n_eval_episodes (5 by default, as SB3's) in
    turn, the env left open."""
    from stable_baselines3.common.monitor import Monitor

    model = PPO("FrozenLake-v1", device="cpu", seed=0, num_envs=2, num_steps=32, batch_size=64)
    for env in (gym.make("FrozenLake-v1", is_slippery=False), Monitor(gym.make("FrozenLake-v1", is_slippery=False))):
        closed: list[bool] = []
        env.close = functools.partial(closed.append, True)  # (a closed FrozenLake still resets: close() tells)
        callback = EvalCallback(env, eval_freq=64, verbose=0)
        model.learn(64, callback=callback, progress_bar=False)
        assert len(callback.evaluations_length) == 1 and len(callback.evaluations_length[0]) == 5
        assert len(set(callback.evaluations_length[0])) == 1  # (no slips: the same episode each time)
        assert not closed  # (the caller's env stays open)


def test_eval_callback_saves_the_best_model_and_it_reproduces_its_score(tmp_path):
    model = _ppo()
    callback = EvalCallback(n_eval_episodes=3, eval_freq=2 * STEPS_PER_ITERATION,
                            best_model_save_path=tmp_path / "best", log_path=tmp_path / "logs", verbose=0)
    model.learn(8 * STEPS_PER_ITERATION, callback=callback, progress_bar=False, run_dir=tmp_path / "run",
                log_interval_s=0)
    assert callback.evaluations_timesteps == [STEPS_PER_ITERATION * i for i in (2, 4, 6, 8)]
    means = [float(np.mean(returns)) for returns in callback.evaluations_results]
    # each evaluation's mean reaches metrics.csv as Stable-Baselines3's eval/mean_reward (the row after it)
    rows = list(csv.DictReader((tmp_path / "run" / "metrics.csv").open()))
    logged_means = [float(row["eval/mean_reward"]) for row in rows if row["eval/mean_reward"]]
    assert logged_means == pytest.approx(means)
    assert callback.best_mean_reward == pytest.approx(max(means))
    best = PPO.load(tmp_path / "best" / "best_model.safetensors", device="cpu")
    again = evaluate(best, episodes=3, seed=callback.best_eval_seed, backend=best.env_backend)
    assert again["mean"] == pytest.approx(callback.best_mean_reward)
    logged = np.load(tmp_path / "logs" / "evaluations.npz")
    assert logged["timesteps"].tolist() == callback.evaluations_timesteps
    assert logged["results"].shape == (4, 3)
    assert logged["ep_lengths"].tolist() == logged["results"].astype(int).tolist()  # (CartPole: 1 per step)


def test_stop_on_reward_threshold_as_new_best_child_stops_at_the_first_evaluation():
    model = _ppo()
    stop = StopTrainingOnRewardThreshold(reward_threshold=1.0)  # any episode reaches it
    callback = EvalCallback(n_eval_episodes=2, eval_freq=STEPS_PER_ITERATION, callback_on_new_best=stop, verbose=0)
    model.learn(50 * STEPS_PER_ITERATION, callback=callback, progress_bar=False)
    assert model.num_timesteps == STEPS_PER_ITERATION
    assert callback.evaluations_timesteps == [STEPS_PER_ITERATION]


def test_stop_on_reward_threshold_lets_training_go_on_below_its_threshold():
    model = _ppo()
    stop = StopTrainingOnRewardThreshold(reward_threshold=1e9)  # no episode reaches it
    callback = EvalCallback(n_eval_episodes=2, eval_freq=STEPS_PER_ITERATION, callback_on_new_best=stop, verbose=0)
    model.learn(3 * STEPS_PER_ITERATION, callback=callback, progress_bar=False)
    assert model.num_timesteps == 3 * STEPS_PER_ITERATION and len(callback.evaluations_timesteps) == 3


def test_stop_on_reward_threshold_alone_reads_learns_own_evaluations():
    model = _ppo()
    model.learn(50 * STEPS_PER_ITERATION, callback=StopTrainingOnRewardThreshold(1.0), progress_bar=False,
                target_return=1e9, eval_freq=2 * STEPS_PER_ITERATION, eval_episodes=2)
    assert model.num_timesteps == 2 * STEPS_PER_ITERATION
    assert model.result.steps_to_target is None  # stopped by the callback, not by reaching the target


def test_stop_on_reward_threshold_alone_reads_the_evaluations_of_an_eval_freq_without_a_target():
    """learn evaluates with an eval_freq alone too (docs/callbacks.md); the callback was refused there ("learn runs
    evaluations only with a target_return"), so a threshold below any target could not stop such a run."""
    model = _ppo()
    model.learn(50 * STEPS_PER_ITERATION, callback=StopTrainingOnRewardThreshold(1.0), progress_bar=False,
                eval_freq=STEPS_PER_ITERATION, eval_episodes=2)
    assert model.num_timesteps == STEPS_PER_ITERATION  # (its first evaluation: any episode reaches 1.0)


def test_stop_on_no_model_improvement_counts_evaluations_without_a_new_best():
    parent = types.SimpleNamespace(best_mean_reward=-np.inf, num_timesteps=0, locals={}, metrics=None)
    stop = StopTrainingOnNoModelImprovement(max_no_improvement_evals=1, min_evals=0)
    stop.parent = parent
    decisions = []
    for best in (1.0, 2.0, 2.0, 2.0):  # new best, new best, no change, no change
        parent.best_mean_reward = best
        decisions.append((BaseCallback._child_event(parent, stop), stop.no_improvement_evals))
    # the second evaluation in a row without a new best is more than 1: stop
    assert decisions == [(True, 0), (True, 0), (True, 1), (False, 2)]
    # min_evals: the first evaluations never stop training, however little they improve
    parent.best_mean_reward, patient = -np.inf, StopTrainingOnNoModelImprovement(max_no_improvement_evals=0,
                                                                                   min_evals=3)
    patient.parent = parent
    kept = [BaseCallback._child_event(parent, patient) for _ in range(4)]  # (no new best after the first)
    assert kept == [True, True, True, False]


def test_stop_on_no_model_improvement_stops_a_run():
    model = _ppo()
    stop = StopTrainingOnNoModelImprovement(max_no_improvement_evals=0, min_evals=0)
    callback = EvalCallback(n_eval_episodes=2, eval_freq=STEPS_PER_ITERATION, callback_after_eval=stop, verbose=0,
                            seed=7)
    model.learn(40 * STEPS_PER_ITERATION, callback=callback, progress_bar=False)
    # it stops at the first evaluation that is no better than the best so far
    means = [float(np.mean(r)) for r in callback.evaluations_results]
    assert len(means) >= 2 and means[-1] <= max(means[:-1])
    assert all(later > earlier for earlier, later in zip(means[:-1], means[1:-1]))
    assert model.num_timesteps == callback.evaluations_timesteps[-1] < 40 * STEPS_PER_ITERATION


def test_checkpoint_callback_writes_loadable_files_at_its_steps(tmp_path):
    model = _ppo()
    callback = CheckpointCallback(save_freq=1000, save_path=tmp_path, name_prefix="ppo")
    model.learn(8 * STEPS_PER_ITERATION, callback=callback, progress_bar=False)
    # every 1000 steps, at the end of the iteration that reaches it (iterations of 512 steps)
    expected = [1024, 2048, 3072, 4096]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"ppo_{s}_steps.safetensors" for s in expected)
    loaded = PPO.load(tmp_path / "ppo_2048_steps.safetensors", device="cpu")
    assert loaded.num_timesteps == 2048


def test_checkpoint_callback_saves_the_replay_buffer_when_asked(tmp_path):
    model = DQN("CartPole-v1", seed=0, device="cpu", num_envs=4, learning_starts=64, buffer_size=1000)
    callback = CheckpointCallback(save_freq=100, save_path=tmp_path, save_replay_buffer=True)
    model.learn(240, callback=callback, progress_bar=False)  # (iterations of 16 steps: saves at 112 and 208)
    assert len(callback.saved) == 2
    for path in callback.saved:
        assert path.is_file() and path.with_name(path.name.replace(".safetensors", ".replay.safetensors")).is_file()
    assert not model.save_replay_buffer  # the model's own setting is left as it was


def test_checkpoint_callback_keeps_the_newest_saves_it_wrote_with_their_replay_buffers(tmp_path):
    """With save_replay_buffer every save wrote a whole replay buffer and none was ever deleted: a long run filled the
    disk. keep_last=N deletes the older saves' model and replay files after each save, never the newest, never a file
    the callback did not write (an earlier run's of the same names, a file of the user's), and a kept pair loads."""
    (tmp_path / "rl_model_16_steps.safetensors").write_bytes(b"an earlier run's")
    (tmp_path / "rl_model_16_steps.replay.safetensors").write_bytes(b"an earlier run's")
    (tmp_path / "notes.txt").write_text("the user's")
    model = DQN("CartPole-v1", seed=0, device="cpu", num_envs=4, learning_starts=64, buffer_size=1000)
    callback = CheckpointCallback(save_freq=50, save_path=tmp_path, save_replay_buffer=True, keep_last=2)
    model.learn(240, callback=callback, progress_bar=False)  # (iterations of 16 steps: saves at 64, 112, 160, 208)
    kept = [f"rl_model_{steps}_steps" for steps in (160, 208)]
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(
        ["notes.txt", "rl_model_16_steps.replay.safetensors", "rl_model_16_steps.safetensors"]
        + [f"{name}{suffix}" for name in kept for suffix in (".safetensors", ".replay.safetensors")])
    assert callback.saved == [tmp_path / f"{name}.safetensors" for name in kept]
    fresh = DQN.load(callback.saved[-1], device="cpu")
    fresh.load_replay_buffer(tmp_path / f"{kept[-1]}.replay.safetensors")
    fresh.learn(64, progress_bar=False)
    assert len(fresh.buffer) == 208 + 64  # (the newest save's 208 transitions, and this learn's)
    # without keep_last, every save stays (Stable-Baselines3's behaviour)
    every = CheckpointCallback(save_freq=50, save_path=tmp_path / "all")
    model.learn(240, callback=every, progress_bar=False)  # (from 240 steps: one save per multiple of 50, 250 to 450)
    assert len(every.saved) == len(list((tmp_path / "all").iterdir())) == 5


def test_every_n_timesteps_runs_its_child_after_each_n_steps():
    child = Recorder()
    _ppo().learn(6 * STEPS_PER_ITERATION, callback=EveryNTimesteps(1500, child), progress_bar=False)
    # at the first iteration end past 1500 and 3000: 1536, 3072
    assert child.n_calls == 2


def test_a_callback_given_to_each_of_several_learn_calls_keeps_counting_steps(tmp_path):
    """A curriculum's loop of short learn calls with the same callbacks (as Stable-Baselines3's keep counting): their
    periods go on across the calls (each was restarted with its learn call: a period longer than one call never
    came); a callback given to another model starts counting again."""
    child = Recorder()
    every, checkpoints = EveryNTimesteps(2 * STEPS_PER_ITERATION - 1, child), CheckpointCallback(
        3 * STEPS_PER_ITERATION, tmp_path)
    model = _ppo()
    for _ in range(6):
        model.learn(STEPS_PER_ITERATION, callback=[every, checkpoints], progress_bar=False)
    assert child.n_calls == 3  # (at 1024, 2048 and 3072 steps)
    assert [path.name for path in checkpoints.saved] == ["rl_model_1536_steps.safetensors",
                                                         "rl_model_3072_steps.safetensors"]
    _ppo().learn(3 * STEPS_PER_ITERATION, callback=checkpoints, progress_bar=False)
    assert [path.name for path in checkpoints.saved[2:]] == ["rl_model_1536_steps.safetensors"]


def _acting_steps(every: int, iteration: int, iterations: int, start: int = 0) -> list[int]:
    """The iteration ends at which a callback's period of `every` env steps acts over `iterations` iterations of
    `iteration` steps from the step count `start`."""
    period = _Period(every)
    period.start(start)
    ends = (start + iteration * k for k in range(1, iterations + 1))
    return [end for end in ends if period.due(end)]


@pytest.mark.parametrize("every, iteration, iterations, expected", [
    (1024, 512, 8, [1024, 2048, 3072, 4096]),  # a whole number of iterations
    (768, 512, 12, [1024, 1536, 2560, 3072, 4096, 4608, 5632, 6144]),  # not: one action per multiple of 768
    (10_000, 8192, 10, [16384, 24576, 32768, 40960, 57344, 65536, 73728, 81920]),  # one per 10,000 steps
    (100, 512, 3, [512, 1024, 1536]),  # an iteration past several multiples acts once, not once per multiple
    (1500, 4096, 3, [4096, 8192, 12288]),
])
def test_a_period_acts_at_the_first_iteration_end_at_or_past_each_multiple(every, iteration, iterations, expected):
    """Periods were counted again from the step they acted at: eval_freq=768 on 512-step iterations acted every
    1,024 steps (6 evaluations in 6,144 steps, not 8) and 10,000 on 8,192-step iterations every 16,384 (a crash lost
    up to twice the checkpoint interval asked for)."""
    assert _acting_steps(every, iteration, iterations) == expected
    assert next_due(6144, 768) == 6912 and next_due(6143, 768) == 6144 and next_due(0, 768) == 768


def test_a_period_started_later_keeps_the_schedule_of_one_run():
    """A resumed run, or a further learn call, acts at the multiples one run would have (from step 0), not a period
    after its start; a run resumed from an older checkpoint whose next evaluation was counted from the step it acted
    at comes back to the multiples."""
    assert _acting_steps(768, 512, 4, start=3072) == [4096, 4608]
    saved = {"eval_freq": 768, "next_eval": 4096, "checkpoint_freq": 1000, "next_checkpoint": 4000}
    assert resumed_due(saved, "eval", 768, 3072) == 3840  # (an older rlspeed's, 768 after an evaluation at 3,328)
    assert resumed_due(saved, "checkpoint", 1000, 3500) == 4000
    assert resumed_due(saved, "checkpoint", 768, 3500) == 3840  # (another frequency: its own multiples)
    assert resumed_due({**saved, "next_eval": 3072}, "eval", 768, 3072) == 3072  # (one not made yet: due at once)


def test_a_video_that_failed_says_the_step_count_the_next_one_is_due_at(tmp_path, monkeypatch):
    """A video that could not be written says when the next is due: "in 1,000 steps" was the rule of a period
    counted from the step it acted at; it is due at the next multiple of video_every (2,000 after a failure at 1,024,
    976 steps later)."""
    import rlspeed.video

    def failing(*args, **kwargs):
        raise rlspeed.video.VideoWriteError("'x.mp4': No space left on device.")

    monkeypatch.setattr(rlspeed.video, "record_video", failing)
    callback = VideoRecorderCallback(1000, tmp_path)
    callback.model, callback.num_timesteps = types.SimpleNamespace(seed=0), 1024
    callback._period.start(512)
    with pytest.warns(RuntimeWarning, match=r"Training goes on; the next video is due at 2,000 steps\.$"):
        assert callback._on_rollout_end() is True
    assert callback.videos == []


def test_learns_and_the_callbacks_periods_act_once_per_multiple_of_their_frequency(tmp_path, monkeypatch):
    """learn's eval_freq and checkpoint_freq, CheckpointCallback and EveryNTimesteps (EvalCallback's period is
    theirs) with a period of 192 steps on 128-step iterations: 8 actions in 1,536 steps, at the first iteration end
    at or past each multiple (there were 6, every 256 steps)."""
    model = _small_ppo()
    # (the schedule, not what is drawn or evaluated: no learning curve, and an evaluation's result without episodes)
    monkeypatch.setattr(RunLogger, "plot", lambda self: None)
    monkeypatch.setattr(model, "evaluate", lambda **kwargs: {"mean": 0.0, "std": 0.0, "episodes": 1, "returns": [0.0]})
    saved_at = []  # (learn's own checkpoints: CheckpointCallback's saves are the model's `save` too)
    save = model.save
    monkeypatch.setattr(model, "save", lambda path, *args, **kwargs: (
        saved_at.append(model.num_timesteps) if Path(path).name == "checkpoint.safetensors" else None,
        save(path, *args, **kwargs)))
    child = Recorder()
    checkpoints = CheckpointCallback(192, tmp_path / "saves")
    model.learn(12 * 128, eval_freq=192, eval_episodes=1, checkpoint_freq=192, run_dir=tmp_path / "run",
                callback=[checkpoints, EveryNTimesteps(192, child)], progress_bar=False)
    expected = [256, 384, 640, 768, 1024, 1152, 1408, 1536]
    assert [steps for steps, _, _ in model.result.evaluations] == expected
    assert [path.name for path in checkpoints.saved] == [f"rl_model_{steps}_steps.safetensors" for steps in expected]
    assert child.n_calls == len(expected)
    assert saved_at == expected


def test_a_callbacks_total_timesteps_is_the_step_count_the_call_trains_to_as_sb3s():
    """A callback's `self.locals["total_timesteps"]` is Stable-Baselines3's, the step count the learn call trains to
    (the model's steps before it plus its budget), so a progress `num_timesteps / total_timesteps` ported from SB3
    stays within [0, 1] on a further call; it was the call's budget, and such a progress went past 1."""
    seen = []

    class Progress(BaseCallback):
        def _on_training_start(self):
            seen.append(self.locals["total_timesteps"])

        def _on_rollout_end(self):
            seen.append(self.locals["total_timesteps"])

    model = PPO("CartPole-v1", seed=0, device="cpu", env_backend="torch", num_envs=2, num_steps=8, batch_size=16,
                n_epochs=1)
    for _ in range(2):
        model.learn(16, callback=Progress(), progress_bar=False)
    assert seen == [16, 16, 32, 32]
    function_seen = []
    model.learn(16, callback=lambda local: function_seen.append(local["total_timesteps"]), progress_bar=False)
    assert function_seen == [48]


class _Counter:
    """Counts calls of the tensor methods that read a tensor back to the host."""

    METHODS = ("item", "cpu", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__")

    def __init__(self, monkeypatch):
        self.count = 0
        for name in self.METHODS:
            original = getattr(torch.Tensor, name)

            def counted(tensor, *args, _original=original, **kwargs):
                self.count += 1
                return _original(tensor, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, counted)


@pytest.mark.parametrize("log_interval_s", [0.0, 1e9])
def test_callbacks_add_no_host_reads_to_the_loop(monkeypatch, tmp_path, log_interval_s):
    reads = {}
    for name, callback in (("none", None), ("no-op", BaseCallback()),
                           ("stock", CallbackList([BaseCallback(), CheckpointCallback(10**9, tmp_path),
                                                   EvalCallback(eval_freq=10**9, verbose=0)]))):
        model = _ppo()
        with monkeypatch.context() as patch:
            counter = _Counter(patch)
            model.learn(6 * STEPS_PER_ITERATION, callback=callback, progress_bar=False, log_interval_s=log_interval_s)
        reads[name] = counter.count
    assert reads["none"] > 0  # the counter sees the loop's own once-per-log-interval read
    assert reads["no-op"] == reads["none"] and reads["stock"] == reads["none"], reads


def test_stop_on_reward_threshold_where_no_evaluation_reaches_it_is_refused_at_the_start():
    """Alone without a target or an eval_freq (learn runs no evaluations then) or under a callback that is not an
    EvalCallback it would never stop anything: one sentence before training instead of a silent full budget."""
    from rlspeed.callbacks import EveryNTimesteps, StopTrainingOnRewardThreshold

    model = PPO("CartPole-v1", device="cpu", seed=0, num_envs=4, num_steps=32, batch_size=64)
    with pytest.raises(UserError, match="needs evaluations"):
        model.learn(256, progress_bar=False, callback=StopTrainingOnRewardThreshold(10))
    with pytest.raises(UserError, match="inside a EveryNTimesteps"):
        model.learn(256, progress_bar=False, callback=EveryNTimesteps(64, StopTrainingOnRewardThreshold(10)))
    assert model.num_timesteps == 0
    with pytest.raises(UserError, match="reward_threshold is a finite number, got nan"):  # (never reached)
        StopTrainingOnRewardThreshold(float("nan"))


@pytest.mark.parametrize("where, words", [("alone", "is alone"), ("every", "is inside a EveryNTimesteps")])
def test_stop_on_no_model_improvement_outside_an_eval_callback_is_refused_at_the_start(where, words):
    """No evaluation ever reaches it there: one sentence before the first iteration (not after it, nor a bare
    AttributeError mid-run)."""
    stop = StopTrainingOnNoModelImprovement(3)
    model = PPO("CartPole-v1", device="cpu", seed=0, num_envs=4, num_steps=32, batch_size=64)
    with pytest.raises(UserError, match=f"{words}: pass it as EvalCallback\\(callback_after_eval=...\\)"):
        model.learn(256, progress_bar=False, callback=stop if where == "alone" else EveryNTimesteps(64, stop))
    assert model.num_timesteps == 0


def test_a_callback_that_refuses_at_the_start_leaves_the_process_float_settings_alone():
    """learn flushes denormal floats while it trains and must restore the setting however it ends (a callback
    raising before the first iteration left it on, which broke the next user of denormal floats)."""
    import torch

    from rlspeed.callbacks import StopTrainingOnRewardThreshold

    tiny = torch.tensor(1e-40, dtype=torch.float32)
    assert tiny * 1 != 0  # denormals are kept here
    model = PPO("CartPole-v1", device="cpu", seed=0, num_envs=4, num_steps=32, batch_size=64)
    with pytest.raises(UserError, match="needs evaluations"):  # (refused in learn, after it set its float settings)
        model.learn(256, progress_bar=False, callback=StopTrainingOnRewardThreshold(10))
    assert tiny * 1 != 0


def test_stock_callbacks_inside_every_n_timesteps_and_eval_callback_slots_do_their_work(tmp_path):
    """Stable-Baselines3's patterns: EveryNTimesteps(n, CheckpointCallback(1, ...)) saves at each trigger, and a
    CheckpointCallback as EvalCallback's callback_on_new_best saves each new best (both did nothing: only the
    child's `_on_step` ran, and these callbacks work in `_on_rollout_end`)."""
    from rlspeed.callbacks import CheckpointCallback, EvalCallback, EveryNTimesteps

    every = CheckpointCallback(save_freq=1, save_path=tmp_path / "every")
    on_best = CheckpointCallback(save_freq=1, save_path=tmp_path / "best")
    evaluator = EvalCallback(n_eval_episodes=2, eval_freq=512, callback_on_new_best=on_best)
    model = PPO("CartPole-v1", seed=0, num_envs=4, num_steps=32)
    model.learn(1536, callback=[EveryNTimesteps(700, every), evaluator], progress_bar=False)
    assert len(every.saved) == 2 and all(path.is_file() for path in every.saved)  # (at 768 and 1408 steps)
    assert on_best.saved and len(on_best.saved) <= len(evaluator.evaluations_timesteps)


def test_a_callback_list_as_a_child_runs_each_of_its_callbacks():
    """SB3's `EvalCallback(callback_after_eval=CallbackList([...]))` and `EveryNTimesteps(n, CallbackList([...]))`:
    the list's callbacks run at each event as children of the list's parent, and one returning False stops
    training."""
    after_eval, every, stopper = Recorder(), Recorder(), Recorder(stop_at_call=2, hook="_on_step")
    evaluator = EvalCallback(n_eval_episodes=1, eval_freq=STEPS_PER_ITERATION, callback_after_eval=CallbackList(
        [after_eval]))
    _ppo().learn(4 * STEPS_PER_ITERATION, progress_bar=False,
                 callback=[evaluator, EveryNTimesteps(STEPS_PER_ITERATION, CallbackList([every]))])
    assert after_eval.n_calls == len(evaluator.evaluations_timesteps) == 4 and every.n_calls == 4
    assert [event[1] for event in every.events if event[0] == "rollout_end"] == [
        n * STEPS_PER_ITERATION for n in range(1, 5)]
    model = _ppo()
    model.learn(6 * STEPS_PER_ITERATION, progress_bar=False,
                callback=EveryNTimesteps(STEPS_PER_ITERATION, CallbackList([Recorder(), stopper])))
    assert stopper.n_calls == 2 and model.num_timesteps == 2 * STEPS_PER_ITERATION
    # the list's callbacks are its parent's children: StopTrainingOnRewardThreshold reads the EvalCallback's best
    model = _ppo()
    evaluator = EvalCallback(n_eval_episodes=1, eval_freq=STEPS_PER_ITERATION, verbose=0, callback_on_new_best=(
        CallbackList([StopTrainingOnRewardThreshold(reward_threshold=-1e9)])))
    model.learn(6 * STEPS_PER_ITERATION, progress_bar=False, callback=evaluator)
    assert model.num_timesteps == STEPS_PER_ITERATION  # (stopped at the first evaluation)


def test_an_eval_callbacks_children_start_and_end_with_it():
    """A callback_after_eval (callback_on_new_best) of one's own that sets itself up in `_on_training_start`, as
    Stable-Baselines3 calls it there, and `_on_training_end`, as EveryNTimesteps' callback gets it: both run once,
    around its evaluations (they never ran, so its setup was silently skipped); inside a CallbackList too."""
    after_eval, on_new_best, listed = Recorder(), Recorder(), Recorder()
    evaluator = EvalCallback(n_eval_episodes=1, eval_freq=STEPS_PER_ITERATION, verbose=0,
                             callback_after_eval=after_eval, callback_on_new_best=CallbackList([on_new_best, listed]))
    _ppo().learn(2 * STEPS_PER_ITERATION, progress_bar=False, callback=evaluator)
    for child in (after_eval, on_new_best, listed):
        kinds = [event[0] for event in child.events]
        assert kinds[0] == "start" and kinds[-1] == "end", kinds
        assert kinds.count("start") == kinds.count("end") == 1
    assert after_eval.n_calls == 2  # (and each evaluation still runs it once)


def test_eval_callback_refuses_a_next_step_vector_env_before_training():
    """Gymnasium's default vector env (NEXT_STEP autoreset) as eval_env: one sentence naming EvalCallback and the
    fix, before any step is trained (it came at the first evaluation)."""
    import gymnasium as gym

    from rlspeed.callbacks import EvalCallback

    envs = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    model = PPO("CartPole-v1", seed=0, num_envs=4, num_steps=32)
    with pytest.raises(UserError, match="EvalCallback's eval_env must be made with autoreset_mode"):
        model.learn(1024, callback=EvalCallback(envs, eval_freq=512), progress_bar=False)
    assert model.num_timesteps == 0
    envs.close()


def test_eval_callbacks_seed_is_checked_when_it_is_made():
    """Stable-Baselines3's positional EvalCallback(env, None, None, 5, 1000, None, None, True, False) gives its ninth
    argument, render, as this one's seed: False was taken as a seed and refused only at the first evaluation, after
    training (a negative seed likewise). Both are refused when the callback is made, the first naming render."""
    from rlspeed.callbacks import EvalCallback

    with pytest.raises(UserError, match=r"EvalCallback's seed is a whole number, not False \(Stable-Baselines3's "
                                        r"ninth argument is render, this one's is seed\): give render=\.\.\. by name"):
        EvalCallback("CartPole-v1", None, None, 5, 1000, None, None, True, False)
    with pytest.raises(UserError, match="A seed is a whole number from 0 to 2\\*\\*63 - 1, not -5"):
        EvalCallback("CartPole-v1", seed=-5)
    assert EvalCallback("CartPole-v1", seed=7).seed == 7


@pytest.mark.parametrize("use", ["EvalCallback", "evaluate"])
def test_a_next_step_vector_env_is_refused_after_a_same_step_one_of_its_env_was_made(use):
    """Gymnasium 1.1 to 1.3 (rlspeed's floor is 1.1) write a vector env's autoreset mode into the metadata dict of
    the env class it vectorises, which all of that env's vector envs share: once the model made its own SAME_STEP
    envs of CartPole, the user's NEXT_STEP one said SAME_STEP too, was taken, and its episodes were counted as if
    finished envs reset within the step. Emulated here on any Gymnasium by writing that metadata as they do."""
    from rlspeed.callbacks import EvalCallback

    envs = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    model = PPO("CartPole-v1", seed=0, num_envs=2, num_steps=32, batch_size=64, env_backend="gymnasium")
    envs.metadata["autoreset_mode"] = gym.vector.AutoresetMode.SAME_STEP  # (what Gymnasium 1.1 to 1.3 left there)
    with pytest.raises(UserError, match=r"made with autoreset_mode=AutoresetMode\.SAME_STEP \(this one uses "
                                        r"AutoresetMode\.NEXT_STEP\)"):
        if use == "EvalCallback":
            model.learn(1024, callback=EvalCallback(envs, eval_freq=512), progress_bar=False)
        else:
            evaluate(model, envs, episodes=2)
    assert model.num_timesteps == 0
    envs.close()
    model.close()


def test_stable_baselines3_callback_examples_run_as_written(tmp_path):
    """SB3's documented keyword sets are taken (`warn`, `render=False`, `save_vecnormalize`); the checkpoint of a run
    with observation normalisation holds its statistics; `render=True` is refused in one sentence."""
    model = _ppo(normalize_obs=True)
    checkpoints = CheckpointCallback(save_freq=STEPS_PER_ITERATION, save_path=tmp_path / "logs",
                                     name_prefix="rl_model", save_replay_buffer=True, save_vecnormalize=True)
    evaluation = EvalCallback(n_eval_episodes=2, eval_freq=STEPS_PER_ITERATION, log_path=tmp_path / "logs",
                              deterministic=True, render=False, warn=True, verbose=0)
    model.learn(STEPS_PER_ITERATION, callback=[checkpoints, evaluation], progress_bar=False)
    saved = PPO.load(checkpoints.saved[0], device="cpu")
    assert torch.equal(saved.obs_rms.mean, model.obs_rms.mean) and evaluation.evaluations_timesteps
    with pytest.raises(UserError, match="EvalCallback does not render episodes: add a VideoRecorderCallback"):
        EvalCallback(render=True)


class _Clobber(BaseCallback):
    """Records -1 under `key` at every step."""

    def __init__(self, key: str):
        super().__init__()
        self.key = key

    def _on_step(self):
        self.logger.record(self.key, -1.0)
        return True


def test_a_recorded_value_named_as_a_loop_column_does_not_replace_it(tmp_path):
    """`logger.record("timesteps", ...)` replaced the loop's own step count in metrics.csv (and a loss column likewise):
    such a key goes to `custom/<key>`, with a warning once."""
    with pytest.warns(UserWarning, match="'timesteps' is a column the training loop writes itself"):
        _ppo().learn(3 * STEPS_PER_ITERATION, callback=_Clobber("timesteps"), progress_bar=False, log_interval_s=0,
                     run_dir=tmp_path)
    rows = list(csv.DictReader((tmp_path / "metrics.csv").open()))
    assert [int(float(row["timesteps"])) for row in rows] == [STEPS_PER_ITERATION * i for i in (1, 2, 3)]
    assert [row["custom/timesteps"] for row in rows][1:] == ["-1.0", "-1.0"]


def test_a_recorded_key_tensorboard_would_draw_in_a_loop_columns_series_goes_to_custom():
    """Stable-Baselines3's `logger.record("train/std", ...)` is a column of its own in metrics.csv, but its TensorBoard
    tag is that of the loop's `std` column: its points were drawn in the loop's series, two at each step, without a
    word. Such a key goes to `custom/<key>` (with a warning once), as a key named as a loop column does; a key of a
    section of its own, or a new name under train/, keeps its name."""
    from rlspeed.callbacks import MetricsRecorder
    from rlspeed.logging import tensorboard_tag

    recorder = MetricsRecorder()
    for key in ("train/std", "train/n_updates", "time/sps", "rollout/episode_return", "std", "train/aux", "custom/x"):
        recorder.record(key, -1.0)
    row = {"timesteps": 256, "std": 0.9, "n_updates": 40, "sps": 1000.0, "episode_return": 20.0}
    with pytest.warns(UserWarning, match="'train/std' is the TensorBoard tag of the training loop's column 'std', "
                                         "so this value goes to 'custom/train/std'"):
        row.update(recorder.take(row))
    tags = [tensorboard_tag(key) for key in row if key != "timesteps"]
    assert sorted(tags) == sorted(set(tags))  # (one series per value)
    assert {key: value for key, value in row.items() if value == -1.0} == dict.fromkeys(
        ("custom/train/std", "custom/train/n_updates", "custom/time/sps", "custom/rollout/episode_return",
         "custom/std", "train/aux", "custom/x"), -1.0)
    assert row["std"] == 0.9 and row["sps"] == 1000.0


def test_record_mean_logs_the_mean_of_the_values_recorded_since_the_last_row():
    """Stable-Baselines3's `logger.record_mean(key, value)`: the row gets the mean of the values recorded for `key`
    since the last row (it had the last value alone); the next row's mean starts afresh, and so does it from the value
    a `record` of the key gives."""
    from rlspeed.callbacks import MetricsRecorder

    recorder = MetricsRecorder()
    for value in (1.0, 2.0, torch.tensor(6.0)):
        recorder.record_mean("custom/loss", value)
    assert recorder.take() == {"custom/loss": 3.0}
    recorder.record_mean("custom/loss", 10.0)
    assert recorder.take() == {"custom/loss": 10.0}
    recorder.record_mean("custom/loss", 4.0)
    recorder.record("custom/loss", 1.0)
    recorder.record_mean("custom/loss", 3.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        recorder.record_mean("custom/loss", None)  # (skipped without a warning, as Stable-Baselines3's)
    assert recorder.take() == {"custom/loss": 2.0}


def test_a_loop_column_missing_from_some_rows_is_not_taken_over_by_a_callback(tmp_path):
    """A key the loop writes on some rows only (eval_mean between evaluations, DQN's loss before learning_starts)
    was the callback's column from its first row on: its values replaced the loop's, without a warning."""
    with pytest.warns(UserWarning, match="'eval_mean' is a column the training loop writes itself"):
        _ppo().learn(4 * STEPS_PER_ITERATION, callback=_Clobber("eval_mean"), progress_bar=False, log_interval_s=0,
                     eval_freq=2 * STEPS_PER_ITERATION, eval_episodes=2, run_dir=tmp_path)
    rows = list(csv.DictReader((tmp_path / "metrics.csv").open()))
    evaluations = [float(row["eval_mean"]) for row in rows if row["eval_mean"]]
    assert len(evaluations) == 2 and all(mean > 0 for mean in evaluations)  # (CartPole's returns: the loop's own)
    assert {row["custom/eval_mean"] for row in rows[1:]} == {"-1.0"}


def test_every_column_the_loop_writes_is_one_a_callback_cannot_take_over(tmp_path):
    """`LOOP_COLUMNS` (the names a callback's value is renamed from) holds every metrics.csv column of every
    algorithm's loop, evaluations included (the on-policy ones with Box actions: their std)."""
    from rlspeed.algos import ALGORITHMS
    from rlspeed.callbacks import LOOP_COLUMNS

    for name, algo in ALGORITHMS.items():
        env_id = "CartPole-v1" if algo.name == "dqn" else "Pendulum-v1"
        options = (dict(learning_starts=16, batch_size=16, train_freq=16) if algo.keeps_replay_buffer
                   else dict(num_envs=2, num_steps=32, **({} if algo.name == "a2c" else {"batch_size": 64})))
        run_dir = tmp_path / name
        algo(env_id, device="cpu", seed=0, net_arch=(16,), **options).learn(
            128, progress_bar=False, log_interval_s=0, target_return=1e9, eval_freq=64, eval_episodes=1,
            run_dir=run_dir)
        header = next(csv.reader((run_dir / "metrics.csv").open()))
        assert set(header) <= LOOP_COLUMNS, (name, set(header) - LOOP_COLUMNS)


def test_a_callback_overriding_the_public_hooks_keeps_working():
    """A callback written for Stable-Baselines3 that overrides the public `on_training_end(self)` (not the
    underscore hook) still runs, also after a stop between log points."""
    ended = []

    class Public(BaseCallback):
        def on_training_end(self):
            ended.append(self.model.num_timesteps)

        def _on_step(self):
            return self.n_calls < 2

    model = _ppo()
    model.learn(4 * STEPS_PER_ITERATION, callback=Public(), progress_bar=False, log_interval_s=1e9)
    assert ended == [2 * STEPS_PER_ITERATION]


def test_a_wrapped_callback_gets_the_row_written_after_a_stop():
    """EveryNTimesteps' callback, like a direct one, holds at training end the row learn wrote after a stop between
    log points (W&B logs it from there)."""
    seen = []

    class AtEnd(BaseCallback):
        def _on_training_end(self):
            seen.append(None if self.metrics is None else self.metrics["timesteps"])

    model = _ppo()
    calls = []
    model.learn(4 * STEPS_PER_ITERATION, progress_bar=False, log_interval_s=1e9,
                callback=[EveryNTimesteps(1, AtEnd()), lambda local: calls.append(1) or len(calls) < 2])
    assert seen == [2 * STEPS_PER_ITERATION]


@pytest.mark.parametrize("member, advice", [("name_to_value", "logger.values"), ("get_dir", "run_dir"),
                                            ("info", "print")])
def test_stable_baselines3_logger_members_say_what_to_use_instead(member, advice):
    from rlspeed.callbacks import MetricsRecorder

    with pytest.raises(AttributeError, match=f"logger.{member} is Stable-Baselines3's; .*{advice}"):
        getattr(MetricsRecorder(), member)
    assert not hasattr(MetricsRecorder(), "no_such_member")


def test_stable_baselines3_callbacks_rlspeed_lacks_say_what_to_use_instead():
    """`from rlspeed.callbacks import ProgressBarCallback` (or StopTrainingOnMaxEpisodes, ...): an ImportError naming
    rlspeed's way, not a bare "cannot import name"; hasattr and getattr with a default keep their AttributeError."""
    import rlspeed.callbacks

    with pytest.raises(ImportError, match=r"rlspeed has no ProgressBarCallback \(Stable-Baselines3's\): "
                                          r"learn\(progress_bar=True\)"):
        from rlspeed.callbacks import ProgressBarCallback  # noqa: F401
    with pytest.raises(ImportError, match="rlspeed has no StopTrainingOnMaxEpisodes .*BaseCallback of your own"):
        from rlspeed.callbacks import StopTrainingOnMaxEpisodes  # noqa: F401
    with pytest.raises(AttributeError, match=r"LogEveryNTimesteps .*learn\(log_interval_s=\.\.\.\)"):
        rlspeed.callbacks.LogEveryNTimesteps  # noqa: B018
    assert not hasattr(rlspeed.callbacks, "ConvertCallback") and not hasattr(rlspeed.callbacks, "NoSuchCallback")


def test_the_result_names_the_callback_that_stopped_training_and_why():
    """A run a callback stopped says so in `model.result.stopped_by` (which callback, hook and, for the stock ones,
    why); it said nothing: a run that trained 2 of 8 iterations looked like any other. A further learn starts
    without it, and without a callback's earlier `stop_reason` (as Stable-Baselines3's learn starts afresh)."""

    class Stopper(BaseCallback):
        def _on_step(self):
            return self.n_calls < 2

    class SaysWhyOnce(BaseCallback):
        def _on_step(self):
            if self.n_calls == 1:
                self.stop_reason = "the first call's reason"
            return False

    model = _ppo()
    model.learn(8 * STEPS_PER_ITERATION, callback=[Recorder(), Stopper()], progress_bar=False)
    assert (model.num_timesteps, model.result.stopped_by) == (2 * STEPS_PER_ITERATION,
                                                              "Stopper._on_step returned False")
    # (a callback's reason is its stop's: a later learn call's stop by the same callback, which gives none, was
    # reported with the earlier call's reason)
    says_why = SaysWhyOnce()
    model.learn(8 * STEPS_PER_ITERATION, callback=says_why, progress_bar=False)
    assert model.result.stopped_by == "SaysWhyOnce._on_step returned False: the first call's reason"
    model.learn(8 * STEPS_PER_ITERATION, callback=says_why, progress_bar=False)
    assert (says_why.stop_reason, model.result.stopped_by) == (None, "SaysWhyOnce._on_step returned False")
    model.learn(STEPS_PER_ITERATION, progress_bar=False)
    assert model.result.stopped_by is None
    threshold = StopTrainingOnRewardThreshold(reward_threshold=0)
    model.learn(8 * STEPS_PER_ITERATION, progress_bar=False,
                callback=EvalCallback(eval_freq=1, n_eval_episodes=2, verbose=0, callback_on_new_best=threshold))
    assert model.num_timesteps == 6 * STEPS_PER_ITERATION
    assert re.fullmatch(r"StopTrainingOnRewardThreshold._on_step returned False: mean evaluation return "
                        r"[0-9.]+ >= threshold 0", model.result.stopped_by)
    model.learn(8 * STEPS_PER_ITERATION, callback=lambda local: False, progress_bar=False)
    assert model.result.stopped_by == ("the callback function test_the_result_names_the_callback_that_stopped_training"
                                       "_and_why.<locals>.<lambda> returned False")


def test_a_stable_baselines3_callback_given_to_learn_names_rlspeeds(tmp_path):
    """A ported script that still imports its callbacks from Stable-Baselines3 (or derives its own from SB3's
    BaseCallback) is told which rlspeed class to use, before training; it read "callback must be a BaseCallback, ...,
    got CheckpointCallback", about a class of the very name it had given."""
    sb3 = pytest.importorskip("stable_baselines3.common.callbacks")

    class Mine(sb3.BaseCallback):
        def _on_step(self):
            return True

    model = _ppo()
    with pytest.raises(UserError, match=r"^callback=CheckpointCallback is Stable-Baselines3's "
                                        r"\(stable_baselines3.common.callbacks\): use rlspeed's, from "
                                        r"rlspeed.callbacks import CheckpointCallback"):
        model.learn(STEPS_PER_ITERATION, callback=sb3.CheckpointCallback(64, str(tmp_path)), progress_bar=False)
    with pytest.raises(UserError, match=r"^callback=ProgressBarCallback is Stable-Baselines3's .*rlspeed has none: "
                                        r"learn\(progress_bar=True\)"):
        model.learn(STEPS_PER_ITERATION, callback=[sb3.ProgressBarCallback()], progress_bar=False)
    with pytest.raises(UserError, match=r"^callback=Mine derives from Stable-Baselines3's BaseCallback "
                                        r".*rlspeed.callbacks.BaseCallback"):
        model.learn(STEPS_PER_ITERATION, callback=Mine(), progress_bar=False)
    with pytest.raises(UserError, match=r"^EvalCallback's callback_on_new_best=StopTrainingOnRewardThreshold is "
                                        r"Stable-Baselines3's .*from rlspeed.callbacks import "
                                        r"StopTrainingOnRewardThreshold"):
        EvalCallback(callback_on_new_best=sb3.StopTrainingOnRewardThreshold(100))
    assert model.num_timesteps == 0


def test_sb3_contribs_maskable_eval_callback_names_rlspeeds_eval_callback():
    """A ported MaskablePPO script's MaskableEvalCallback (given to learn, or imported from rlspeed.callbacks) is told
    to use rlspeed's EvalCallback, which masks as the model does; the refusal said "from rlspeed.callbacks import
    MaskableEvalCallback", which rlspeed does not have: the advised import failed in turn."""
    maskable = pytest.importorskip("sb3_contrib.common.maskable.callbacks")

    model = _ppo()
    with pytest.raises(UserError, match=r"^callback=MaskableEvalCallback is .*rlspeed has none: .*is "
                                        r"rlspeed.callbacks.EvalCallback, which masks as the model does"):
        model.learn(STEPS_PER_ITERATION, callback=maskable.MaskableEvalCallback(gym.make("CartPole-v1")),
                    progress_bar=False)
    with pytest.raises(ImportError, match=r"rlspeed has no MaskableEvalCallback .*rlspeed.callbacks.EvalCallback"):
        from rlspeed.callbacks import MaskableEvalCallback  # noqa: F401


def test_eval_callback_given_sb3_contribs_use_masking_says_it_masks_as_the_model_does():
    """MaskableEvalCallback's arguments ported to EvalCallback (as learn's refusal of it advises) with its use_masking
    were a TypeError ('unexpected keyword argument'); now one sentence, as evaluate's refusal of it."""
    with pytest.raises(UserError, match=r"^EvalCallback's 'use_masking' is sb3-contrib's MaskableEvalCallback's; "
                                        r"EvalCallback masks as the model does .*load\(path, use_masking=False\)"):
        EvalCallback("CartPole-v1", use_masking=False)


@pytest.mark.parametrize("algo", ["PPO", "DQN"])
def test_the_advice_for_stop_training_on_max_episodes_works_in_every_algorithm(algo):
    """What the ImportError of StopTrainingOnMaxEpisodes (and self.locals['dones']'s KeyError) says to read exists
    on- and off-policy (it named PPO's rollout buffer only, which a DQN's replay buffer lacks), and a callback
    written from it stops where Stable-Baselines3's would: after max_episodes per env."""
    import rlspeed.callbacks

    with pytest.raises(ImportError) as refusal:
        from rlspeed.callbacks import StopTrainingOnMaxEpisodes  # noqa: F401
    assert "self.locals['metrics']['episode_count']" in str(refusal.value)
    assert "self.locals['metrics']['episode_count']" in rlspeed.callbacks.SB3_LOCALS["dones"]

    class MaxEpisodes(BaseCallback):
        def __init__(self, max_episodes):
            super().__init__()
            self.max_episodes, self.n_episodes = max_episodes, 0

        def _on_step(self):
            self.n_episodes += int(self.locals["metrics"]["episode_count"])
            return self.n_episodes < self.max_episodes * self.training_env.num_envs

    model = (_ppo() if algo == "PPO" else
             DQN("CartPole-v1", seed=0, device="cpu", env_backend="torch", num_envs=4, learning_starts=64))
    callback = MaxEpisodes(3)
    model.learn(100 * model.steps_per_iteration, callback=callback, progress_bar=False)
    assert callback.n_episodes >= 3 * model.config.num_envs
    assert model.num_timesteps < 100 * model.steps_per_iteration  # (CartPole's first episodes are short)


def test_stable_baselines3_counters_in_locals_say_what_to_read():
    """SB3's collect_rollouts and learn counters and settings a callback reads (`self.locals["n_steps"]`,
    `["num_collected_episodes"]`, ...): a KeyError naming rlspeed's (it was a bare KeyError('n_steps')), and every
    name the advice gives to read in learn's locals is one learn has."""
    from rlspeed.callbacks import LearnLocals

    advice = {"n_steps": r"steps_per_iteration env steps", "num_collected_steps": r"self.num_timesteps",
              "num_collected_episodes": r"\['episode_count'\]", "iteration": "self.n_calls",
              "log_interval": r"self.locals\['log_interval_s'\]",
              "learning_starts": "self.model.config.learning_starts", "continue_training": "False"}
    for key, words in advice.items():
        with pytest.raises(KeyError, match=rf"self.locals\['{key}'\] is Stable-Baselines3's; .*{words}"):
            LearnLocals()[key]  # noqa: B018
    seen = {}
    _ppo().learn(STEPS_PER_ITERATION, progress_bar=False,
                 callback=lambda local: seen.update(local=set(local), name=local["tb_log_name"]))
    assert {"metrics", "log_interval_s", "run_dir"} <= seen["local"]
    assert seen["name"] == "PPO"  # (SB3's learn's: the run's name, by default the algorithm's; it was None here)


def test_stable_baselines3_locals_and_vec_env_methods_say_what_works():
    """`self.locals["infos"]` / `["rewards"]` (SB3's per-step locals) and `self.training_env.get_attr(...)` /
    `env_method(...)` (SB3's VecEnv's): errors naming what rlspeed has instead; `get`, `in` and hasattr as before."""
    import rlspeed
    from rlspeed.callbacks import LearnLocals

    seen = {}

    class SB3Style(BaseCallback):
        def _on_step(self):
            for key in ("infos", "rewards"):
                with pytest.raises(KeyError, match=rf"self.locals\['{key}'\] is Stable-Baselines3's; .*model.buffer"):
                    self.locals[key]  # noqa: B018
            # (SB3's _on_rollout_end edits the rollout before the update: here a change to it would do nothing)
            with pytest.raises(KeyError, match=r"'rollout_buffer'\] is Stable-Baselines3's; callbacks run after each "
                                               r"iteration's update, .* reaches no update"):
                self.locals["rollout_buffer"]  # noqa: B018
            with pytest.raises(KeyError, match="^'no_such_local'$"):
                self.locals["no_such_local"]  # noqa: B018
            seen["get"], seen["in"] = self.locals.get("infos"), "infos" in self.locals
            seen["self"] = self.locals["self"] is self.model
            for member in ("get_attr", "set_attr", "env_method", "set_options"):
                # (a curriculum's way to change the native env: its constants cannot change; Gymnasium's can)
                with pytest.raises(AttributeError, match=rf"^{member} is Stable-Baselines3's VecEnv's; .*batched.*"
                                   r"native env's dynamics are constants.*env_backend='gymnasium'.*"
                                   r"load\(path, env_kwargs=...\)"):
                    getattr(self.training_env, member)
            seen["hasattr"] = hasattr(self.training_env, "get_attr") or hasattr(self.training_env, "no_such")
            return False

    _ppo().learn(4 * STEPS_PER_ITERATION, callback=SB3Style(), progress_bar=False)
    assert seen == {"get": None, "in": False, "self": True, "hasattr": False}
    assert isinstance(LearnLocals(a=1), dict)
    env = rlspeed.make_env("CartPole-v1", num_envs=2, backend="gymnasium", device="cpu")
    with pytest.raises(AttributeError, match=r"the Gymnasium vector env this one adapts is env.unwrapped.vector_env"):
        env.get_attr("spec")
    env.close()


def test_a_model_trained_with_callbacks_is_freed_by_del_without_the_garbage_collector():
    """`self.locals` held learn's `callback`/`callbacks` variables, so each callback reached itself through the dict
    it holds: a cycle that kept the model, its buffers and envs alive after `del model` until a gc run. A callback
    inside another (EvalCallback's child) and a plain function: freed at `del`; `self.locals["callback"]` says why it
    is not there."""
    import gc
    import weakref

    class Child(BaseCallback):
        def _on_step(self):
            with pytest.raises(KeyError, match=r"'callback'\] is Stable-Baselines3's; a callback is itself \(self\)"):
                self.locals["callback"]  # noqa: B018

    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for make in (lambda: [Child(), EveryNTimesteps(1, Child())], lambda: lambda locals_: None):
            model = PPO("CartPole-v1", seed=0, device="cpu", num_envs=2, num_steps=8, batch_size=16, n_epochs=1)
            model.learn(32, callback=make(), progress_bar=False)
            held = weakref.ref(model)
            del model
            assert held() is None
    finally:
        if was_enabled:
            gc.enable()


def test_a_callback_inside_another_follows_its_parent_through_a_copy_and_a_pickle():
    """A child's parent is held by a weak reference (no cycle): a pickled callback with a child raised "cannot
    pickle 'weakref.ReferenceType' object" (it pickled before), and a deep copy's child still named the original
    parent, whose evaluations (an EvalCallback's best mean) it then read."""
    import copy
    import pickle

    parent = EveryNTimesteps(100, StopTrainingOnRewardThreshold(1.0))
    for copied in (copy.deepcopy(parent), pickle.loads(pickle.dumps(parent))):
        assert copied.callback.parent is copied
    assert parent.callback.parent is parent


def test_a_module_imported_apart_keeps_no_frame_of_its_caller(tmp_path, monkeypatch):
    """torch._dynamo, imported when a process makes its first optimizer (inside the first learn), runs torch.fx's
    `wrap`, whose frame holds itself: every frame below the import, learn's with the model, stayed alive until a gc
    run. Imported on a thread of its own, a module that holds its own frame keeps no frame of the caller."""
    import gc
    import sys
    import weakref

    from rlspeed.algos.base import _import_apart

    (tmp_path / "rlspeed_test_holds_its_frame.py").write_text("import inspect\n_frame = inspect.currentframe()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "rlspeed_test_holds_its_frame", raising=False)

    class Owner:
        def load(self):
            _import_apart("rlspeed_test_holds_its_frame")

    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        owner = Owner()
        owner.load()
        held = weakref.ref(owner)
        del owner
        assert held() is None
        assert "rlspeed_test_holds_its_frame" in sys.modules
        with pytest.raises(ModuleNotFoundError):  # (an import's error reaches the caller)
            _import_apart("rlspeed_test_no_such_module")
    finally:
        sys.modules.pop("rlspeed_test_holds_its_frame", None)
        if was_enabled:
            gc.enable()


def test_sb3_contribs_recurrent_locals_name_where_recurrent_ppo_keeps_them():
    """sb3-contrib's RecurrentPPO callbacks read `self.locals["lstm_states"]` / `["episode_starts"]`: a KeyError
    naming the buffer's fields, which hold them (a bare KeyError said nothing)."""
    from rlspeed.callbacks import LearnLocals

    model = RecurrentPPO("CartPoleNoVel-v1", seed=0, device="cpu", num_envs=2, num_steps=4, batch_size=8,
                         lstm_hidden_size=4, n_epochs=1)
    model.learn(8, progress_bar=False)
    for key, field in (("lstm_states", "states"), ("episode_starts", "episode_starts")):
        with pytest.raises(KeyError, match=rf"self.locals\['{key}'\] is Stable-Baselines3's; .*"
                                           rf"self.model.buffer.{field}\b"):
            LearnLocals()[key]
        assert isinstance(getattr(model.buffer, field), torch.Tensor)
    assert model.buffer.states.shape == (4, 4, 2, 4)


def test_wrapped_callbacks_hear_of_an_error_that_ends_training():
    """`on_training_error` (a WandbCallback finishing its run as failed) reached the callbacks given to learn, not
    those held by EveryNTimesteps or EvalCallback: a child's W&B run stayed open."""

    class Heard(BaseCallback):
        errors: list = []

        def _on_training_error(self, error):
            Heard.errors.append(str(error))

    def fails(local):
        if local["self"].num_timesteps >= 256:
            raise RuntimeError("a bug in the user's callback")

    model = PPO("CartPole-v1", seed=0, device="cpu", env_backend="torch", num_envs=4, num_steps=32, batch_size=128)
    wrappers = [EveryNTimesteps(128, Heard()), EvalCallback(callback_after_eval=Heard(), eval_freq=128,
                                                            n_eval_episodes=1)]
    with pytest.raises(RuntimeError, match="a bug"):
        model.learn(1024, callback=[*wrappers, fails], progress_bar=False)
    assert Heard.errors == ["a bug in the user's callback"] * 2


class HeardEndings(BaseCallback):
    """Records how training ended for it: "end", or the type name of the error `on_training_error` got."""

    def __init__(self):
        super().__init__()
        self.events = []

    def _on_training_error(self, error):
        self.events.append(type(error).__name__)

    def _on_training_end(self):
        self.events.append("end")


def test_callbacks_hear_of_a_training_whose_every_update_was_rolled_back():
    """learn raises DivergedError at its end where every update was non-finite and rolled back; callbacks heard
    neither on_training_end nor on_training_error then, so a WandbCallback's own W&B run stayed open for the next
    learn to join."""
    from rlspeed.numerics import DivergedError

    heard = HeardEndings()
    model = PPO("CartPole-v1", seed=0, device="cpu", env_backend="torch", num_envs=4, num_steps=32, batch_size=128,
                learning_rate=1e30, max_grad_norm=1e30)
    with pytest.warns(RuntimeWarning, match="non-finite"), pytest.raises(DivergedError, match="Every update"):
        model.learn(512, callback=heard, progress_bar=False)
    assert heard.events == ["DivergedError"]


def test_callbacks_hear_of_an_error_writing_the_last_logs_at_a_normal_end(tmp_path, monkeypatch):
    """Training done, learn raised where its logs' last write failed (a full disk as metrics.csv's plot was written):
    callbacks heard neither on_training_end nor on_training_error, so a WandbCallback's run stayed open."""
    from rlspeed.logging import RunLogger

    def plot(self):
        raise OSError(28, "No space left on device", str(self.run_dir / "learning_curve.png"))

    monkeypatch.setattr(RunLogger, "plot", plot)
    heard = HeardEndings()
    model = PPO("CartPole-v1", seed=0, device="cpu", env_backend="torch", num_envs=2, num_steps=16)
    with pytest.raises(UserError, match="learning_curve.png"):
        model.learn(64, callback=heard, progress_bar=False, run_dir=tmp_path / "run")
    assert heard.events == ["UserError"]


def test_every_callback_hears_of_the_error_after_one_that_failed_to():
    """A callback whose own `_on_training_error` raised stopped the list there: a WandbCallback after it never
    finished its run."""

    class Broken(BaseCallback):
        def _on_training_error(self, error):
            raise ValueError("the callback's own bug")

    class Heard(BaseCallback):
        errors: list = []

        def _on_training_error(self, error):
            Heard.errors.append(str(error))

    def fails(local):
        raise RuntimeError("training failed")

    model = PPO("CartPole-v1", seed=0, device="cpu", env_backend="torch", num_envs=4, num_steps=32, batch_size=128)
    with pytest.raises(RuntimeError, match="training failed"):  # (the error that ended training, not the callback's)
        model.learn(256, callback=[Broken(), Heard(), fails], progress_bar=False)
    assert Heard.errors == ["training failed"]


def test_eval_callback_continuing_a_run_keeps_its_evaluations_and_best(tmp_path):
    """A model that goes on from a step count (a resume, a further learn) with an EvalCallback on the same log_path
    keeps the evaluations logged up to that step and their best mean: best_model.safetensors is replaced only by a
    better evaluation (a fresh callback started from -inf and replaced it at the first one), and evaluations.npz
    keeps the earlier rows (those after the step, which the run trains again, are dropped)."""
    model = _ppo()
    model.learn(2 * STEPS_PER_ITERATION, progress_bar=False)
    logs, best = tmp_path / "logs", tmp_path / "best"
    logs.mkdir()
    best.mkdir()
    (best / "best_model.safetensors").write_bytes(b"the earlier best")
    earlier = [STEPS_PER_ITERATION, 2 * STEPS_PER_ITERATION, 3 * STEPS_PER_ITERATION]  # (the last one: after the step)
    np.savez(logs / "evaluations.npz", timesteps=np.array(earlier),
             results=np.array([[5.0, 7.0], [1e6, 1e6], [1e7] * 2]),
             ep_lengths=np.array([[5, 7], [500, 500], [500, 500]]), seeds=np.array([11, 12, 13]))
    callback = EvalCallback(n_eval_episodes=2, eval_freq=STEPS_PER_ITERATION, log_path=logs,
                            best_model_save_path=best, verbose=0)
    model.learn(2 * STEPS_PER_ITERATION, callback=callback, progress_bar=False)
    assert callback.best_mean_reward == 1e6 and callback.best_eval_seed == 12
    assert (best / "best_model.safetensors").read_bytes() == b"the earlier best"
    logged = np.load(logs / "evaluations.npz")
    assert logged["timesteps"].tolist() == earlier[:2] + [3 * STEPS_PER_ITERATION, 4 * STEPS_PER_ITERATION]
    assert logged["results"][:2].tolist() == [[5.0, 7.0], [1e6, 1e6]] and logged["seeds"][:2].tolist() == [11, 12]
    from rlspeed.evaluation import evaluation_seed  # (the new ones: seeded as the docs say, not seed + offset + steps)

    assert logged["seeds"][2:].tolist() == [evaluation_seed(0, "callback", steps) for steps in logged["timesteps"][2:]]
    # another number of episodes cannot continue those rows: refused before training, the file as it was
    with pytest.raises(UserError, match="n_eval_episodes=2 to continue"):
        model.learn(STEPS_PER_ITERATION, callback=EvalCallback(n_eval_episodes=3, log_path=logs), progress_bar=False)
    assert np.load(logs / "evaluations.npz")["timesteps"].tolist() == logged["timesteps"].tolist()


@pytest.mark.parametrize("cut", [0, 100])
def test_eval_callback_continuing_from_a_damaged_evaluations_file_says_so_in_one_sentence(tmp_path, cut):
    """An empty or cut-short evaluations.npz (a run killed while writing it, by an rlspeed that wrote it in place) is
    one sentence naming the file when a continuing run reads it back, not numpy's traceback."""
    model = _ppo()
    model.learn(STEPS_PER_ITERATION, progress_bar=False)
    whole = tmp_path / "whole.npz"
    np.savez(whole, timesteps=np.array([256]), results=np.array([[1.0, 2.0]]), ep_lengths=np.array([[3, 4]]))
    (tmp_path / "evaluations.npz").write_bytes(whole.read_bytes()[:cut])
    with pytest.raises(UserError, match=r"^EvalCallback's log_path holds '.*evaluations.npz', which cannot be read"):
        model.learn(STEPS_PER_ITERATION, progress_bar=False,
                    callback=EvalCallback(n_eval_episodes=2, eval_freq=STEPS_PER_ITERATION, log_path=tmp_path))


def test_eval_callback_writes_evaluations_whole_or_not_at_all(tmp_path, monkeypatch):
    """evaluations.npz is read back by a run that continues: a write interrupted (a kill, Ctrl-C) keeps the earlier
    file whole rather than a cut archive."""
    import rlspeed.files

    callback = EvalCallback(n_eval_episodes=2, eval_freq=STEPS_PER_ITERATION, log_path=tmp_path, verbose=0)
    _ppo().learn(STEPS_PER_ITERATION, progress_bar=False, callback=callback)
    before = (tmp_path / "evaluations.npz").read_bytes()

    def interrupted(_fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(rlspeed.files.os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        callback.evaluate_now()
    assert (tmp_path / "evaluations.npz").read_bytes() == before
    assert sorted(path.name for path in tmp_path.iterdir()) == ["evaluations.npz"]


def test_eval_callback_of_a_curriculums_next_stage_does_not_continue_the_last_stages_evaluations(tmp_path):
    """A curriculum's next stage (`Algo.load(path, env_kwargs=...)`, as docs/callbacks.md shows) keeps the step count:
    an EvalCallback on the same log_path took over the easier stage's evaluations and best mean, so the harder
    stage's best model was never saved unless it beat the easier env's score, and the file mixed two envs. The file
    records the env it evaluated; another one is refused before training."""
    settings = dict(seed=0, device="cpu", env_backend="gymnasium", num_envs=2, num_steps=16, batch_size=32,
                    n_epochs=1, net_arch=(8,))
    model = PPO("Pendulum-v1", env_kwargs={"g": 2.0}, **settings)
    model.learn(64, callback=EvalCallback(n_eval_episodes=1, eval_freq=32, log_path=tmp_path, verbose=0),
                progress_bar=False)
    assert str(np.load(tmp_path / "evaluations.npz")["env"]) == "Pendulum-v1 (g=2.0)"
    model.save(tmp_path / "stage1.safetensors")
    harder = PPO.load(tmp_path / "stage1.safetensors", env_kwargs={"g": 6.0}, device="cpu")
    with pytest.raises(UserError, match=r"evaluations on Pendulum-v1 \(g=2.0\) and this run evaluates on "
                                        r"Pendulum-v1 \(g=6.0\): give this stage its own log_path"):
        harder.learn(64, callback=EvalCallback(n_eval_episodes=1, eval_freq=32, log_path=tmp_path, verbose=0),
                     progress_bar=False)
    # the same env goes on with the stage's own evaluations
    again = PPO.load(tmp_path / "stage1.safetensors", env_kwargs={"g": 2.0}, device="cpu")
    callback = EvalCallback(n_eval_episodes=1, eval_freq=32, log_path=tmp_path, verbose=0)
    again.learn(32, callback=callback, progress_bar=False)
    assert callback.evaluations_timesteps[:2] == [32, 64] and len(callback.evaluations_timesteps) == 3


def test_eval_callbacks_line_says_every_evaluation_whose_episodes_were_cut_short(monkeypatch, capsys):
    """On an env whose episodes never end, the warning of episodes cut at the step limit shows once (Python shows a
    warning once), so each of EvalCallback's lines says how many of its episodes were cut short."""
    import warnings

    from conftest import endless_pendulum_id

    import rlspeed.evaluation

    monkeypatch.setattr(rlspeed.evaluation, "UNLIMITED_EPISODE_STEPS", 5)  # (10,000 steps: the same, slower)
    model = PPO(endless_pendulum_id(), device="cpu", seed=0, num_envs=1, num_steps=8, batch_size=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.learn(16, callback=EvalCallback(eval_freq=8, n_eval_episodes=2), progress_bar=False)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("rlspeed: eval at")]
    assert len(lines) == 2 and all(line.endswith(", 2 of 2 cut short at the step limit") for line in lines), lines


def test_eval_callback_records_how_many_of_each_evaluations_episodes_were_cut_short(monkeypatch, tmp_path):
    """Without `verbose`, EvalCallback still says which evaluations counted episodes cut at the step limit (the
    warning shows once): `eval/unfinished` in the metrics row and `unfinished` in evaluations.npz, which a further
    learn reads back (-1 for evaluations a file without it holds: Stable-Baselines3's or an older rlspeed's)."""
    import csv
    import warnings

    from conftest import endless_pendulum_id

    import rlspeed.evaluation

    monkeypatch.setattr(rlspeed.evaluation, "UNLIMITED_EPISODE_STEPS", 5)  # (10,000 steps: the same, slower)
    model = PPO(endless_pendulum_id(), device="cpu", seed=0, num_envs=1, num_steps=8, batch_size=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.learn(16, callback=EvalCallback(eval_freq=8, n_eval_episodes=2, log_path=tmp_path, verbose=0),
                    progress_bar=False, run_dir=tmp_path / "run")
        with np.load(tmp_path / "evaluations.npz") as saved:
            assert saved["unfinished"].tolist() == [2, 2]
            older = {key: saved[key] for key in saved.files if key != "unfinished"}
        with open(tmp_path / "run" / "metrics.csv", newline="", encoding="utf-8") as handle:
            cut = [float(row["eval/unfinished"]) for row in csv.DictReader(handle) if row["eval/mean_reward"]]
        assert cut and set(cut) == {2.0}, cut
        np.savez(tmp_path / "evaluations.npz", **older)
        again = EvalCallback(eval_freq=8, n_eval_episodes=2, log_path=tmp_path, verbose=0)
        model.learn(8, callback=again, progress_bar=False)
    assert again.evaluations_unfinished == [-1, -1, 2]



def test_a_run_resumed_after_ctrl_c_in_an_evaluation_makes_that_evaluation_and_its_callbacks_at_once(tmp_path,
                                                                                                   monkeypatch):
    """Ctrl-C during learn's evaluation at 256 steps, the run saved as the CLI saves an interrupted one: resumed, the
    evaluation and the callbacks' period that iteration owed act at the first iteration's end (384), as learn's
    `resumed_due` and the callbacks' `callbacks_at` make them. The evaluation was skipped (its next step was moved on
    before it ran) and so was the callbacks' action (their periods started after the resumed step count)."""
    first = _small_ppo()
    owed = Recorder()

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(first, "evaluate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        first.learn(1024, eval_freq=256, eval_episodes=1, callback=EveryNTimesteps(256, owed), progress_bar=False)
    assert first.num_timesteps == 256 and owed.n_calls == 0
    first.save(tmp_path / "checkpoint.safetensors")
    resumed = _small_ppo()
    resumed.resume(tmp_path / "checkpoint.safetensors")
    child = Recorder()
    resumed.learn(256, eval_freq=256, eval_episodes=1, callback=EveryNTimesteps(256, child), progress_bar=False)
    assert [steps for steps, _, _ in resumed.result.evaluations] == [384, 512]
    assert [event[1] for event in child.events if event[0] == "rollout_end"] == [384, 512]


def test_a_run_resumed_after_a_crash_in_its_callbacks_runs_their_owed_action_at_once(tmp_path):
    """A crash in the callbacks of the iteration ending at 256 steps, after learn's checkpoint there: resumed from
    that checkpoint, a period of the callbacks due at 256 acts at the first iteration's end (384), where it acted at
    512 (the action skipped); learn's own evaluation at 256 was made before the checkpoint and is not made again."""

    class Crash(BaseCallback):
        def _on_step(self):
            if self.num_timesteps == 256:
                raise RuntimeError("crash")
            return True

    first = _small_ppo()
    with pytest.raises(RuntimeError, match="crash"):
        first.learn(1024, eval_freq=256, eval_episodes=1, checkpoint_freq=128, run_dir=tmp_path,
                    callback=[Crash(), EveryNTimesteps(256, Recorder())], progress_bar=False)
    resumed = _small_ppo()
    resumed.resume(tmp_path / "checkpoint.safetensors")
    assert resumed.num_timesteps == 256
    child = Recorder()
    resumed.learn(256, eval_freq=256, eval_episodes=1, run_dir=tmp_path, callback=EveryNTimesteps(256, child),
                  progress_bar=False)
    assert [event[1] for event in child.events if event[0] == "rollout_end"] == [384, 512]
    assert [steps for steps, _, _ in resumed.result.evaluations] == [512]


def _ran_at(recorder: Recorder) -> list[int]:
    return [event[1] for event in recorder.events if event[0] == "rollout_end"]


def test_a_run_resumed_from_a_checkpoint_callbacks_save_acts_once_per_period_for_each_callback(tmp_path):
    """A CheckpointCallback in the middle of a callback list saves at 256 steps: the callbacks before it had run at
    that iteration, those after it had not. Resumed from its file, those after it act at once (384), those before it
    (and it) at their next period (512): each callback's action once per period. Every callback was taken as run
    (those after it skipped the action of 256)."""
    first = _small_ppo()
    first.learn(256, callback=[EveryNTimesteps(256, Recorder()), CheckpointCallback(256, tmp_path),
                               EveryNTimesteps(256, Recorder())], progress_bar=False)
    resumed = _small_ppo()
    resumed.resume(tmp_path / "rl_model_256_steps.safetensors")
    before, after, saves = Recorder(), Recorder(), CheckpointCallback(256, tmp_path / "resumed")
    resumed.learn(256, callback=[EveryNTimesteps(256, before), saves, EveryNTimesteps(256, after)],
                  progress_bar=False)
    assert (_ran_at(before), _ran_at(after)) == ([512], [384, 512])
    assert [path.name for path in saves.saved] == ["rl_model_512_steps.safetensors"]


def test_a_run_resumed_with_more_callbacks_than_its_checkpoint_counts_takes_the_count_every_one_ran_at(tmp_path):
    """A checkpoint holds one count per callback of the run that saved it (`callbacks_ran_at`); resumed with another
    list (a callback added), those counts fit no callback, so each takes the count every one had run at
    (`callbacks_at`, the iteration before the save): the actions of the save's iteration are made at once, none
    skipped."""
    first = _small_ppo()
    first.learn(256, callback=CheckpointCallback(256, tmp_path), progress_bar=False)
    resumed = _small_ppo()
    resumed.resume(tmp_path / "rl_model_256_steps.safetensors")
    before, after = Recorder(), Recorder()
    resumed.learn(256, callback=[EveryNTimesteps(256, before), CheckpointCallback(256, tmp_path / "resumed"),
                                 EveryNTimesteps(256, after)], progress_bar=False)
    assert _ran_at(before) == _ran_at(after) == [384, 512]


def test_a_further_learn_after_a_callback_raised_mid_list_acts_once_per_period_for_each_callback():
    """A callback raises at 256 steps in the middle of a list: the callbacks before it had run at that iteration,
    those after it had not. A further learn with the same list makes the actions owed by those after it at once (384)
    and those before it at their next period (512); it made theirs again at 384 too (twice in one period)."""

    class CrashOnce(BaseCallback):
        def _on_step(self):
            if self.num_timesteps == 256 and self.n_calls == 2:
                raise RuntimeError("crash")
            return True

    model = _small_ppo()
    before, after = Recorder(), Recorder()
    callbacks = [EveryNTimesteps(256, before), CrashOnce(), EveryNTimesteps(256, after)]
    with pytest.raises(RuntimeError, match="crash"):
        model.learn(1024, callback=callbacks, progress_bar=False)
    assert (model.num_timesteps, _ran_at(before), _ran_at(after)) == (256, [256], [])
    model.learn(256, callback=callbacks, progress_bar=False)
    assert (_ran_at(before), _ran_at(after)) == ([256, 512], [384, 512])


def test_a_further_learn_after_ctrl_c_in_an_evaluation_makes_that_evaluation_at_once(monkeypatch):
    """Ctrl-C during learn's evaluation at 256 steps (a notebook's stop button), then a further learn of the same
    model: the evaluation that call owed is made at the first iteration's end (384), as a resumed run makes it and as
    the callbacks' owed action is; it was skipped (made at 512), the further call's schedule starting anew."""
    model = _small_ppo()
    evaluate = model.evaluate

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(model, "evaluate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        model.learn(1024, eval_freq=256, eval_episodes=1, progress_bar=False)
    assert model.num_timesteps == 256
    monkeypatch.setattr(model, "evaluate", evaluate)
    child = Recorder()
    model.learn(256, eval_freq=256, eval_episodes=1, callback=EveryNTimesteps(256, child), progress_bar=False)
    assert [steps for steps, _, _ in model.result.evaluations] == [384, 512]
    assert [event[1] for event in child.events if event[0] == "rollout_end"] == [384, 512]
