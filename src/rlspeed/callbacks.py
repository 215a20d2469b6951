"""Callbacks for `learn`: Stable-Baselines3's names and meaning, called only where the loop already stops.

The points (docs/callbacks.md): `on_training_start`, `on_rollout_end` after every iteration (one rollout and its
update, or one off-policy collect-and-train step), `on_evaluation` after each of `learn`'s own evaluations (with a
target) and `on_training_end`. There is no per-env-step hook: one step of the loop steps N envs with one tensor op on
the device, and a Python call per step, reading anything, would force a host sync per step and break graph capture.
A callback gets the metrics row (`self.metrics`) only in iterations that ended a log interval, where the loop has
read it already; in other iterations `self.metrics` is None, so a callback adds no device reads of its own.
Returning False from `_on_rollout_end`, `_on_step` or `_on_evaluation` stops training at the end of that iteration.
"""

from __future__ import annotations

import inspect
import io
import math
import numbers
import os
import typing
import warnings
import weakref
import zipfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import gymnasium as gym
import numpy as np

import rlspeed
from rlspeed.errors import UserError, positive_whole, refuse_replay_saving, true_or_false
from rlspeed.files import given_path, local_path, unwritable, write_atomic
from rlspeed.logging import cut_short, format_return, print_beside_bars, tensorboard_tag

# (the model's and the envs' classes are named through the package, `rlspeed.algos.Algorithm`, which
# typing.get_type_hints imports as it resolves the annotation: an import of algos here would close a cycle, algos.base
# calling this module, and one of envs would load torch with the callbacks)
if typing.TYPE_CHECKING:
    import rlspeed.algos
    import rlspeed.envs.sb3_env


def next_due(timesteps: int, every: int) -> int:
    """The step count at which work done every `every` env steps (learn's evaluations and checkpoints, a
    population's, EvalCallback, CheckpointCallback, EveryNTimesteps, VideoRecorderCallback) is next due after the
    step count `timesteps`: the first multiple of `every` above it. The one rule of every such period: it acts at the
    end of the first iteration at or past each multiple of `every` of the model's step count (counted from 0, so a
    resumed run or a further learn call keeps the schedule one run would have had), once per multiple, and once
    where an iteration passed several; where the run it continues counted steps past a multiple without acting at it
    (a crash or an interrupt between its count and the action), at the end of the continued run's first iteration
    (`resumed_due` for learn's own, the callbacks' `_periods_from`)."""
    return (int(timesteps) // every + 1) * every


def resumed_due(saved: dict, name: str, every: int, timesteps: int) -> int:
    """`next_due` in a run resumed at the step count `timesteps` from a checkpoint whose learn loop `saved` holds
    `next_{name}` for the period `{name}_freq` ("eval", "checkpoint"): that step where the period is `every` and it
    is not later than `next_due` (one the interrupted run had not acted at yet is due at once; an older rlspeed's,
    which counted a period from the step it acted at, comes back to the multiples), else `next_due`."""
    due = next_due(timesteps, every)
    if saved.get(f"{name}_freq") == every and saved.get(f"next_{name}"):
        return min(int(saved[f"next_{name}"]), due)
    return due


class _Period:
    """An env-step period of a callback: `due(timesteps)` is True at the first call at or past each multiple of
    `every` (`next_due`; EveryNTimesteps, EvalCallback, CheckpointCallback and VideoRecorderCallback). `start` at
    each learn call: the same callback given to several calls goes on at the multiples of the model's step count,
    as one call would; given to a model whose count went back (another model), at the multiples after that count."""

    def __init__(self, every: int):
        self.every, self.next = int(every), None

    def start(self, timesteps: int) -> None:
        self.next = next_due(timesteps, self.every)

    def due(self, timesteps: int) -> bool:
        if self.next is None:
            self.start(timesteps)
        if timesteps < self.next:
            return False
        self.next = next_due(timesteps, self.every)
        return True


class CallbackRuns:
    """The step count each of learn's callbacks last ran at (its `on_rollout_end`), for the periods they start at
    training start (`BaseCallback._periods_from`). Its callbacks are those learn got, a `CallbackList`'s each (its
    own lists' too, in their order). The rule: each callback's action happens once per period. A callback counts as
    run at an iteration from the moment its `on_rollout_end` starts (a save it makes there, CheckpointCallback's,
    holds it as run, and the callbacks after it as not yet) unless it raises; so a run resumed from that save, or a
    further learn after a callback raised, does at once the actions owed by the callbacks that had not run at that
    iteration, and not again those of the callbacks before them.

    Checkpoints hold the counts as the learn loop's `callbacks_ran_at` (`at`, one per callback), beside
    `callbacks_at`, the count every callback had run at; a run whose callbacks are not as many as those counts (or
    an older rlspeed's checkpoint) takes `callbacks_at` for each."""

    def __init__(self, callbacks: BaseCallback, saved: dict, timesteps: int):
        listed = _listed(callbacks)
        # (their ids, not themselves: a copy of the model a callback takes, which holds this, holds no callback; learn
        # holds them while this is in use)
        self._index = {id(callback): index for index, callback in enumerate(listed)}
        every = min(int(saved.get("callbacks_at", timesteps)), timesteps)
        ran = saved.get("callbacks_ran_at")
        #: the step count each callback last ran at, in order (the list checkpoints save)
        self.at = ([min(int(step), timesteps) for step in ran]
                   if isinstance(ran, list) and len(ran) == len(listed) else [every] * len(listed))

    def ran_at(self, callback: BaseCallback) -> int:
        """The step count `callback` (or the one of learn's callbacks that runs it, its parent's) last ran at."""
        while callback is not None and id(callback) not in self._index:
            callback = callback.parent
        return min(self.at, default=0) if callback is None else self.at[self._index[id(callback)]]

    def start(self, callback: BaseCallback, timesteps: int) -> int | None:
        """`callback` runs at `timesteps`: counted as run there; the count it had before (for `failed`), or None
        where it is none of learn's callbacks (a child a callback runs)."""
        index = self._index.get(id(callback))
        if index is None:
            return None
        before, self.at[index] = self.at[index], timesteps
        return before

    def all_ran(self, timesteps: int) -> None:
        """learn's callbacks returned from the iteration at `timesteps`: every one ran there."""
        self.at[:] = [timesteps] * len(self.at)

    def failed(self, callback: BaseCallback, before: int | None) -> None:
        """`callback` raised: it did not run at this iteration (the count it had `before` it started)."""
        if before is not None:
            self.at[self._index[id(callback)]] = before


def _listed(callback: BaseCallback) -> list[BaseCallback]:
    """learn's `callback` as the callbacks whose `on_rollout_end` it runs, in order: a CallbackList's, each listed."""
    if not isinstance(callback, CallbackList):
        return [callback]
    return [listed for inner in callback.callbacks for listed in _listed(inner)]


#: every column the training loop writes to metrics.csv (docs/cli.md's table), also where a row lacks it (a DQN loss
#: before learning_starts, an evaluation's mean between evaluations): a callback's value never takes one of them over
LOOP_COLUMNS = frozenset({
    "timesteps", "train_wall_s", "sps", "episode_return", "success_rate", "eval_mean", "eval_success_rate",
    "eval_unfinished", "eval_confirm_mean", "eval_confirm_unfinished", "policy_loss", "value_loss", "entropy",
    "approx_kl", "clipfrac", "explained_variance", "loss", "q_values", "epsilon", "critic_loss", "actor_loss",
    "alpha", "learning_rate", "n_updates", "std"})


_PRINT = "print, or Python's logging module, writes text (rlspeed's logger holds a metrics row's numbers)"
#: Stable-Baselines3 Logger members rlspeed's logger lacks, with what to use instead
_SB3_LOGGER_MEMBERS = {
    "name_to_value": "the values recorded since the last metrics row are `logger.values`",
    "get_dir": "the run directory is the one given to learn(run_dir=...) (rlspeed train: --out)",
    "output_formats": "rlspeed writes metrics.csv and TensorBoard logs in the run directory (and W&B with --track)",
    "log": _PRINT, "info": _PRINT, "warn": _PRINT, "debug": _PRINT, "error": _PRINT}


_STEPS = "the iteration's steps (rewards, dones, actions, ...) are tensors in self.model.buffer"
#: Stable-Baselines3's per-step `self.locals` entries, which rlspeed's learn has no variable of, with what to use
SB3_LOCALS = {
    "infos": "rlspeed keeps no per-step infos: the metrics row of a log interval is self.metrics (episode_return, "
             "success_rate, ...), and " + _STEPS,
    **dict.fromkeys(("rewards", "actions", "values", "log_probs", "new_obs", "obs_tensor", "clipped_actions",
                     "buffer_actions", "replay_buffer"), "callbacks run once per iteration, and " + _STEPS),
    "dones": "callbacks run once per iteration: the episodes that ended in it are "
             "self.locals['metrics']['episode_count'] (every algorithm), and " + _STEPS,
    # (SB3's _on_rollout_end edits the rollout before its update, e.g. to add intrinsic rewards: here it is too late)
    "rollout_buffer": "callbacks run after each iteration's update, so the rollout in self.model.buffer is one that "
                      "update has used and a change to it reaches no update (Stable-Baselines3's _on_rollout_end "
                      "runs before its update): change rewards in the env (a Gymnasium wrapper)",
    "env": "the training env is self.training_env",
    "callback": "a callback is itself (self) and its parent, where one runs it (EvalCallback's callback_on_new_best, "
                "EveryNTimesteps' callback), is self.parent",
    # (SB3's collect_rollouts' and learn's other locals: counters and settings)
    **dict.fromkeys(("n_steps", "n_rollout_steps", "num_collected_steps"),
                    "callbacks run once per iteration, after its self.model.steps_per_iteration env steps (all envs); "
                    "self.num_timesteps counts the steps so far"),
    "num_collected_episodes": "callbacks run once per iteration: the episodes that ended in it are "
                              "self.locals['metrics']['episode_count'] (every algorithm)",
    "iteration": "self.n_calls counts the iterations this callback has seen",
    "log_interval": "metrics are read and logged every self.locals['log_interval_s'] seconds",
    "reset_num_timesteps": "a further learn call continues the step count (self.num_timesteps)",
    "continue_training": "a callback's False from _on_step or _on_rollout_end stops training",
    **dict.fromkeys(("learning_starts", "train_freq", "action_noise"),
                    "the model's settings are on self.model.config (self.model.config.learning_starts, ...)"),
    # (sb3-contrib's RecurrentPPO's rollout locals)
    **dict.fromkeys(("lstm_states", "episode_starts"),
                    "callbacks run once per iteration, and RecurrentPPO's rollout keeps the LSTM state each step "
                    "started from in self.model.buffer.states ([num_steps, 4, num_envs, lstm_hidden_size]: actor h, "
                    "c, critic h, c) and where episodes started in self.model.buffer.episode_starts"),
}


#: learn's variables that hold the callbacks themselves: left out of a callback's `self.locals`, which would otherwise
#: reach back to the callback that holds it, a reference cycle that kept the model, its buffers and envs alive after
#: `del model` until the garbage collector ran
_CALLBACK_VARIABLES = ("callback", "callbacks")


class LearnLocals(dict):
    """learn's local variables as a callback's `self.locals` gets them: a dict, where a missing key of
    Stable-Baselines3's (`SB3_LOCALS`) raises a KeyError saying what to use instead (`get` and `in` are a dict's).
    `LearnLocals.of(locals())` leaves out learn's own callback variables (a callback is `self`, not a local)."""

    __slots__ = ()

    @classmethod
    def of(cls, variables: dict[str, typing.Any], **given: typing.Any) -> LearnLocals:
        """The locals a callback gets from learn's `variables`: all but those that hold the callbacks, with `given`'s
        values in place of learn's own."""
        kept = cls((key, value) for key, value in variables.items() if key not in _CALLBACK_VARIABLES)
        kept.update(given)
        return kept

    def __missing__(self, key):
        advice = SB3_LOCALS.get(key) if isinstance(key, str) else None
        if advice is None:
            raise KeyError(key)
        raise KeyError(f"self.locals[{key!r}] is Stable-Baselines3's; {advice}.")


class MetricsRecorder:
    """`BaseCallback.logger`: Stable-Baselines3's `logger.record(key, value)` for a callback's own scalars. Recorded
    values go into the next metrics row the loop writes (metrics.csv, TensorBoard, `self.metrics` of later
    iterations; the last value of a key wins, or the mean of those `record_mean` got), at the next log interval, so
    recording adds no write of its own; those recorded in the last iteration join its row when `learn` ends (not
    those of `_on_training_end`: the files are closed by then). A tensor value is read (a host sync) when recorded.
    Numbers only: anything else (SB3's `Video`, `Figure`, text) is left out, with a warning once per key."""

    def __init__(self):
        self.values: dict[str, float] = {}
        self._warned: set[str] = set()
        self._given: set[str] = set()  # the columns `take` has returned
        self._counts: dict[str, int] = {}  # how many values `record_mean` has averaged per key since the last row

    def record(self, key: str, value: float | typing.SupportsFloat | np.generic | typing.Any,
               exclude: str | tuple[str, ...] | None = None) -> None:
        """Keep `value` (a number or a one-element tensor) for the next metrics row, as column `key`. `exclude` is
        taken and changes nothing: the value goes to metrics.csv and TensorBoard alike."""
        number = self._number(key, value)
        if number is not None:
            self.values[str(key)] = number
            self._counts[str(key)] = 1  # (a later `record_mean` averages from it)

    def record_mean(self, key: str, value: float | typing.SupportsFloat | np.generic | typing.Any,
                    exclude: str | tuple[str, ...] | None = None) -> None:
        """As `record`, but the next metrics row gets the mean of the values recorded for `key` since the last row
        (Stable-Baselines3's `record_mean`, whose mean runs over a dump interval); a `record` of the key starts the
        mean again from its value. None is skipped, as there."""
        number = None if value is None else self._number(key, value)
        if number is None:
            return
        key = str(key)
        count = self._counts.get(key, 0) if key in self.values else 0
        self.values[key] = number if count == 0 else self.values[key] + (number - self.values[key]) / (count + 1)
        self._counts[key] = count + 1

    def _number(self, key: str, value) -> float | None:
        """`value` as a float, or None, with a warning once per key, where it is no number."""
        try:
            return float(value.item() if hasattr(value, "item") else value)
        except (TypeError, ValueError, RuntimeError):
            if str(key) not in self._warned:
                self._warned.add(str(key))
                warnings.warn(f"logger.record('{key}', ...): rlspeed's metrics hold numbers only, so this "
                              f"{type(value).__name__} is left out.", stacklevel=3)
            return None

    def dump(self, step: int = 0) -> None:
        """Nothing: the loop writes recorded values with its next metrics row."""

    if not typing.TYPE_CHECKING:  # (else type checkers type a misspelt attribute as Any instead of reporting it)
        def __getattr__(self, name: str):
            # (only for names not found: Stable-Baselines3's Logger members say what rlspeed has instead)
            advice = _SB3_LOGGER_MEMBERS.get(name)
            if advice is None:
                raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")
            raise AttributeError(f"logger.{name} is Stable-Baselines3's; {advice}.")

    def take(self, columns: typing.Iterable[str] = ()) -> dict[str, float]:
        """The recorded values, cleared (the loop calls this when it writes a row); a key the loop writes
        (`LOOP_COLUMNS`, or one of the row's own `columns` that no callback gave), or one whose TensorBoard tag is
        such a column's (Stable-Baselines3's `train/std` is `std`'s), comes back as `custom/<key>`, with a warning
        once per key, so a callback's value never replaces the loop's, in metrics.csv or in a TensorBoard series."""
        values, self.values = self.values, {}
        self._counts.clear()
        loops = {column for column in columns if column not in self._given}
        tags = {tensorboard_tag(column): column for column in (*LOOP_COLUMNS, *loops)}
        clashes = {key: key if key in LOOP_COLUMNS or key in loops else tags.get(tensorboard_tag(key))
                   for key in values if key not in self._given}
        clashes = {key: column for key, column in clashes.items() if column is not None}
        for key, column in clashes.items():
            if key not in self._warned:
                self._warned.add(key)
                what = ("a column the training loop writes itself" if key == column else
                        f"the TensorBoard tag of the training loop's column '{column}'")
                warnings.warn(f"logger.record('{key}', ...): '{key}' is {what}, so this value goes to "
                              f"'custom/{key}'.", stacklevel=2)
        taken = {(f"custom/{key}" if key in clashes else key): value for key, value in values.items()}
        self._given.update(taken)  # (columns of its own: a later row that has them is no clash)
        return taken


class BaseCallback:
    """Base of the callbacks `learn(callback=...)` takes; subclasses override the underscore hooks.

    Set before each hook: `model` (the algorithm), `num_timesteps` (env steps so far, all envs), `n_calls`
    (iterations this callback has seen, counting on over further learn calls, as SB3's), `locals` (learn's local
    variables at that point; its tensors are on the device, and reading one syncs), `metrics` (the metrics row of a
    log interval that ended in this iteration, else None) and, in `_on_evaluation`, `evaluation` (learn's evaluation
    result: mean, std, episodes, returns). Under torch.distributed callbacks run on rank 0 only, and their decision
    to stop reaches every rank. A hook that returns False to stop training may first set `stop_reason` (a sentence):
    `model.result.stopped_by` names the callback and hook with it.

    `verbose` (every callback class takes it): 1 prints a line on stdout for each thing the callback does (an
    evaluation's result, a file saved, a video written, training stopped), 0 prints none; the default is 0, but
    `EvalCallback`'s is 1, as in Stable-Baselines3.
    """

    def __init__(self, verbose: int = 0):
        self.verbose = verbose
        self.model: rlspeed.algos.Algorithm = None  # type: ignore[assignment]  # (set by `init_callback` before any hook runs)
        self.num_timesteps: int = 0
        self.n_calls: int = 0
        self.locals: dict[str, typing.Any] = {}
        self.metrics: dict[str, typing.Any] | None = None
        self.evaluation: dict[str, typing.Any] | None = None
        #: why this callback stops training, where it says (set before a hook returns False; `model.result.stopped_by`
        #: has it after the callback's name)
        self.stop_reason: str | None = None
        self.parent = None

    @property
    def parent(self) -> BaseCallback | None:
        """The callback that runs this one as its child (EvalCallback's callback_on_new_best, EveryNTimesteps'
        callback), else None. Held by a weak reference (a parent holds its children: a strong link back would be a
        cycle holding the model until the garbage collector runs); a stand-in that has none is held as it is."""
        parent = getattr(self, "_parent", None)
        return parent() if isinstance(parent, weakref.ref) else parent

    @parent.setter
    def parent(self, parent: BaseCallback | None) -> None:
        try:
            self._parent = None if parent is None else weakref.ref(parent)
        except TypeError:  # (an object without weak references)
            self._parent = parent

    def __getstate__(self) -> dict[str, typing.Any]:
        """The callback's attributes with its parent itself in place of the weak reference, which does not pickle and
        which a deep copy would keep pointing at the original parent (a copied EvalCallback's child then read the
        original's best mean)."""
        state = dict(self.__dict__)
        if isinstance(state.get("_parent"), weakref.ref):
            state["_parent"] = state["_parent"]()
        return state

    def __setstate__(self, state: dict[str, typing.Any]) -> None:
        state = dict(state)
        parent = state.pop("_parent", None)
        self.__dict__.update(state)
        self.parent = parent

    @property
    def training_env(self) -> rlspeed.envs.BatchedEnv | None:
        """The model's training env (a `BatchedEnv`)."""
        return getattr(self.model, "_env", None)

    @property
    def globals(self) -> dict[str, typing.Any]:
        """Stable-Baselines3's `self.globals`: the module globals of the model's algorithm (what a function callback
        `fn(locals, globals)` gets); {} before `init_callback`."""
        return {} if self.model is None else vars(inspect.getmodule(type(self.model)))

    @property
    def logger(self) -> MetricsRecorder:
        """The model's recorder for a callback's own scalars (`logger.record(key, value)`, see `MetricsRecorder`)."""
        return self.model.recorder

    # --- what learn calls ---------------------------------------------------------------------------------------
    def init_callback(self, model: rlspeed.algos.Algorithm) -> None:
        """Attach to `model` (called by learn before training starts, at each learn call: a `stop_reason` of an
        earlier call's stop is cleared, so a stop in this call is not given that reason)."""
        self.model = model
        self.stop_reason = None
        self._init_callback()

    def on_training_start(self, locals_: dict[str, typing.Any]) -> None:
        """Called once before the first iteration."""
        self.locals = locals_
        self.num_timesteps = self.model.num_timesteps
        self._on_training_start()

    def on_rollout_start(self) -> None:
        """Called before every iteration collects its steps."""
        self.num_timesteps = self.model.num_timesteps
        self._on_rollout_start()

    def on_rollout_end(self, locals_: dict[str, typing.Any], metrics: dict[str, typing.Any] | None = None) -> bool:
        """Called after every iteration; False stops training. Runs `_on_rollout_end`, then `_on_step` (so a callback
        written for Stable-Baselines3's `_on_step` runs once per iteration, not per env step)."""
        self.n_calls += 1
        self.locals = locals_
        self.metrics = metrics
        self.num_timesteps = self.model.num_timesteps
        runs = getattr(self.model, "_callback_runs", None)  # (learn's: where each callback ran, `CallbackRuns`)
        before = runs.start(self, self.num_timesteps) if runs is not None else None
        try:
            keep_going = self._said_go_on(self._on_rollout_end(), "_on_rollout_end")
            return self._said_go_on(self._on_step(), "_on_step") and keep_going
        except BaseException:
            if runs is not None:
                runs.failed(self, before)
            raise

    def on_evaluation(self, evaluation: dict[str, typing.Any]) -> bool:
        """Called after each of learn's own evaluations (with a target); False stops training."""
        self.evaluation = evaluation
        self.num_timesteps = self.model.num_timesteps
        return self._said_go_on(self._on_evaluation(), "_on_evaluation")

    def on_training_end(self) -> None:
        """Called once when training ends (budget spent, target reached or a callback stopped it; not on an error:
        `on_training_error` then).
        Where a stop between log points (asked for by a callback or a signal) made learn write one more row after
        the last iteration's callbacks ran, `self.metrics` holds that row here, and where values those callbacks
        recorded joined the last row, that row with them (as metrics.csv has it)."""
        self.num_timesteps = self.model.num_timesteps
        self._on_training_end()

    def on_training_error(self, error: BaseException) -> None:
        """Called once when learn raises `error` (an exception, Ctrl-C: KeyboardInterrupt) after training started,
        before learn lets it go on."""
        self.num_timesteps = self.model.num_timesteps
        self._on_training_error(error)

    def set_final_metrics(self, metrics: dict[str, typing.Any]) -> None:
        """(learn) The row written after the last iteration's callbacks ran, for `on_training_end` (and a wrapped
        child's: EveryNTimesteps' callback)."""
        self.metrics = metrics
        child = getattr(self, "callback", None)
        if isinstance(child, BaseCallback):
            child.set_final_metrics(metrics)

    def _said_go_on(self, answer: bool | None, hook: str) -> bool:
        """Whether `hook`'s `answer` lets training go on (anything but False); where it stops training, and no
        callback stopped it before in this learn call, the model's `result.stopped_by` names this callback, the hook
        and its `stop_reason`."""
        if answer is not False:
            return True
        result = getattr(self.model, "result", None)
        if result is not None and result.stopped_by is None:
            why = f": {self.stop_reason}" if self.stop_reason else ""
            result.stopped_by = f"{self._stop_name(hook)} returned False{why}"
        return False

    def _periods_from(self) -> int:
        """The step count this callback's env-step periods start from (`_Period.start`, at training start): the
        model's, or, where learn continues a run that counted iterations this callback did not run at (a crash after
        its checkpoint, an interrupt, a callback before it that raised, a CheckpointCallback before it that saved
        the checkpoint), the step count it last ran at (`CallbackRuns`), so that an action that run owed is due at
        once, as learn's own evaluations and checkpoints are (`resumed_due`)."""
        runs = getattr(self.model, "_callback_runs", None)
        return self.num_timesteps if runs is None else min(runs.ran_at(self), self.num_timesteps)

    def _stop_name(self, hook: str) -> str:
        """How `result.stopped_by` names this callback's `hook`."""
        return f"{type(self).__name__}.{hook}"

    # --- what subclasses override -----------------------------------------------------------------------------
    def _init_callback(self) -> None:
        pass

    def _on_training_start(self) -> None:
        pass

    def _on_rollout_start(self) -> None:
        """Before each iteration collects its steps (Stable-Baselines3's hook)."""

    def _on_rollout_end(self) -> bool | None:
        """After each iteration; return False to stop."""
        return None

    def _on_step(self) -> bool:
        """Stable-Baselines3's hook, here once per iteration; return False to stop."""
        return True

    def _on_evaluation(self) -> bool | None:
        """After each of learn's evaluations (`self.evaluation`); return False to stop."""
        return None

    def _on_training_end(self) -> None:
        pass

    def _on_training_error(self, error: BaseException) -> None:
        pass

    def _child_event(self, callback: BaseCallback | None) -> bool:
        """Run `callback` (a child: callback_on_new_best, EveryNTimesteps' callback, ...) as an event of this one:
        its `_on_rollout_end` (where rlspeed's own callbacks, CheckpointCallback or EvalCallback, do their work, each
        by its own period of env steps), then its `_on_step` (Stable-Baselines3's hook); its False stops training."""
        if callback is None:
            return True
        callback.n_calls += 1
        callback.num_timesteps = self.num_timesteps
        callback.locals, callback.metrics = self.locals, self.metrics
        keep_going = callback._said_go_on(callback._on_rollout_end(), "_on_rollout_end")
        return callback._said_go_on(callback._on_step(), "_on_step") and keep_going


class CallbackList(BaseCallback):
    """Several callbacks called in order; training stops when any returns False (all still run at that point)."""

    def __init__(self, callbacks: Iterable[BaseCallback | Callable[..., bool | None]]):
        super().__init__()
        if isinstance(callbacks, (str, bytes)) or not isinstance(callbacks, Iterable):
            raise UserError(f"CallbackList takes a list of callbacks, got {type(callbacks).__name__}.")
        given = [as_callback(callback) for callback in callbacks]
        if None in given:
            raise UserError("A list of callbacks holds None: leave it out (learn(callback=None) is no callback).")
        self.callbacks: list[BaseCallback] = [callback for callback in given if callback is not None]

    def _init_callback(self) -> None:
        for callback in self.callbacks:
            # (a list in a child's place: its callbacks are the children of its parent, e.g. the EvalCallback
            # whose best mean reward StopTrainingOnRewardThreshold reads, as in Stable-Baselines3)
            if self.parent is not None:
                callback.parent = self.parent
            callback.init_callback(self.model)

    def on_training_start(self, locals_: dict[str, typing.Any]) -> None:
        super().on_training_start(locals_)
        for callback in self.callbacks:
            callback.on_training_start(locals_)

    def on_rollout_start(self) -> None:
        for callback in self.callbacks:
            callback.on_rollout_start()

    def on_rollout_end(self, locals_: dict[str, typing.Any], metrics: dict[str, typing.Any] | None = None) -> bool:
        self.n_calls += 1
        return all([callback.on_rollout_end(locals_, metrics) for callback in self.callbacks])

    def on_evaluation(self, evaluation: dict[str, typing.Any]) -> bool:
        return all([callback.on_evaluation(evaluation) for callback in self.callbacks])

    def _on_rollout_end(self) -> bool:
        # a child (EvalCallback(callback_after_eval=CallbackList([...])), EveryNTimesteps(n, CallbackList([...]))):
        # each of its callbacks runs as an event of it
        return all([self._child_event(callback) for callback in self.callbacks])

    def set_final_metrics(self, metrics: dict[str, typing.Any]) -> None:
        super().set_final_metrics(metrics)
        for callback in self.callbacks:
            callback.set_final_metrics(metrics)

    def on_training_end(self) -> None:
        for callback in self.callbacks:
            callback.on_training_end()

    def on_training_error(self, error: BaseException) -> None:
        # every child hears of it, also after one that failed (a later WandbCallback's run must not stay open); the
        # first failure is raised after them
        failure = None
        for callback in self.callbacks:
            try:
                callback.on_training_error(error)
            except Exception as raised:  # noqa: BLE001
                failure = failure or raised
        if failure is not None:
            raise failure


class FunctionCallback(BaseCallback):
    """A plain function called after every iteration (learn's older callback form): `fn(locals_dict)`, or
    Stable-Baselines3's `fn(locals_dict, globals_dict)` (given the loop's module globals); returning False stops
    training."""

    def __init__(self, fn: Callable[..., bool | None]):
        super().__init__()
        self.fn = fn
        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError):  # (no signature Python can read, a builtin's: called as the older form)
            signature = None

        def takes(*arguments) -> bool:
            try:
                signature.bind(*arguments)
            except TypeError:
                return False
            return True

        self._with_globals = signature is not None and takes({}, {})
        if signature is not None and not self._with_globals and not takes({}):
            raise UserError(f"A function callback takes learn's locals (fn(locals_) or Stable-Baselines3's "
                            f"fn(locals_, globals_)); {getattr(fn, '__name__', fn)!s} takes neither.")

    def _stop_name(self, hook: str) -> str:
        return f"the callback function {getattr(self.fn, '__qualname__', self.fn)!s}"

    def _on_rollout_end(self) -> bool | None:
        if self._with_globals:
            return self.fn(self.locals, self.globals)
        return self.fn(self.locals)


def _normalized_vec_envs(training_env, eval_env):
    """(the training SB3 VecEnv, the eval SB3 VecEnv) where the model trains on an SB3 VecEnv with VecNormalize and
    the evaluation env is an SB3 VecEnv; else None."""
    from rlspeed.envs.sb3_env import vec_normalize_of

    if eval_env is None or isinstance(eval_env, str) or vec_normalize_of(training_env) is None:
        return None
    from stable_baselines3.common.vec_env import VecEnv

    return (training_env.vec_env, eval_env) if isinstance(eval_env, VecEnv) else None


def _check_normalization(training_env, eval_env) -> None:
    """UserError, before training, where the training VecEnv normalises observations (VecNormalize) and the SB3
    eval VecEnv does not: its policy would be evaluated on observations it never sees (SB3 asserts, mid-run)."""
    pair = _normalized_vec_envs(training_env, eval_env)
    if pair is not None:
        from stable_baselines3.common.vec_env import unwrap_vec_normalize

        if unwrap_vec_normalize(pair[1]) is None:
            raise UserError("EvalCallback's eval_env needs VecNormalize too, as the training VecEnv has it: wrap it as "
                            "VecNormalize(eval_env, training=False, norm_reward=False) (its statistics are the "
                            "training env's at each evaluation).")


def _sync_normalization(training_env, eval_env) -> None:
    """As Stable-Baselines3's EvalCallback does before each evaluation: where the model trains on an SB3 VecEnv with
    VecNormalize and the evaluation env is an SB3 VecEnv too, its VecNormalize statistics become the training ones
    (`sync_envs_normalization`), so the policy is evaluated on the observations it trains on."""
    pair = _normalized_vec_envs(training_env, eval_env)
    if pair is not None:
        from stable_baselines3.common.vec_env import sync_envs_normalization

        sync_envs_normalization(*pair)


def as_callback(callback: CallbackLike) -> BaseCallback | None:
    """What `learn(callback=...)` accepts as one `BaseCallback`: None, a BaseCallback, a list of them, or a plain
    function of learn's locals; UserError for anything else."""
    if callback is None or isinstance(callback, BaseCallback):
        return callback
    if isinstance(callback, (list, tuple)):
        return CallbackList(callback)
    if isinstance(callback, type) and issubclass(callback, BaseCallback):  # (the class: callable, but no callback)
        raise UserError(f"callback={callback.__name__} is the class: pass an instance, {callback.__name__}(...).")
    _refuse_foreign(callback, "callback")
    if callable(callback):
        return FunctionCallback(callback)
    raise UserError(f"callback must be a BaseCallback, a list of them or a function, got {type(callback).__name__}.")


#: the packages whose callback classes rlspeed's learn cannot run (their hooks call their own model's members)
_FOREIGN_CALLBACK_PACKAGES = ("stable_baselines3", "sb3_contrib")


def _refuse_foreign(callback, name: str) -> None:
    """UserError where `callback` is a Stable-Baselines3 callback (one of its classes, or a class of yours derived from
    its BaseCallback): it names the rlspeed class to use, as a ported script's forgotten import would otherwise get
    "must be a BaseCallback, got CheckpointCallback" about a class of that very name."""
    cls = callback if isinstance(callback, type) else type(callback)
    foreign = next((base for base in cls.__mro__
                    if base.__module__.partition(".")[0] in _FOREIGN_CALLBACK_PACKAGES), None)
    if foreign is None:
        return
    if foreign is cls:
        advice = _SB3_CALLBACKS.get(cls.__name__)
        use = (f"rlspeed has none: {advice}" if advice is not None else
               f"use rlspeed's, from rlspeed.callbacks import {cls.__name__} (the same arguments)")
        raise UserError(f"{name}={cls.__name__} is Stable-Baselines3's ({cls.__module__}): {use}.")
    raise UserError(f"{name}={cls.__name__} derives from Stable-Baselines3's {foreign.__name__} "
                    f"({foreign.__module__}): derive it from rlspeed.callbacks.BaseCallback, which has its hooks "
                    f"and attributes (docs/callbacks.md).")


def _child_callback(name: str, callback: BaseCallback | None) -> BaseCallback | None:
    """EvalCallback's `name` (callback_on_new_best or callback_after_eval): None or a BaseCallback, which it runs
    with itself as the parent; UserError for anything else (a class, a number, a function: Stable-Baselines3's
    EvalCallback takes callbacks there too)."""
    if callback is None or isinstance(callback, BaseCallback):
        return callback
    if isinstance(callback, type) and issubclass(callback, BaseCallback):
        raise UserError(f"EvalCallback's {name}={callback.__name__} is the class: pass an instance, "
                        f"{callback.__name__}(...).")
    _refuse_foreign(callback, f"EvalCallback's {name}")
    raise UserError(f"EvalCallback's {name} is a callback (e.g. StopTrainingOnRewardThreshold(...) or "
                    f"StopTrainingOnNoModelImprovement(...)), not {callback!r}."[:300])


class EveryNTimesteps(BaseCallback):
    """Runs `callback` (its `_on_rollout_end`, then its `_on_step`) at the end of the first iteration after every
    `n_steps` env steps; a CheckpointCallback or EvalCallback inside it also keeps its own period (`save_freq=1`
    or `eval_freq=1`: at every trigger, as in Stable-Baselines3)."""

    def __init__(self, n_steps: int, callback: BaseCallback):
        super().__init__()
        self.n_steps = positive_whole("EveryNTimesteps's n_steps", n_steps)
        callback = as_callback(callback)
        if callback is None:
            raise UserError("EveryNTimesteps needs the callback to run (EveryNTimesteps(n_steps, callback)), not None.")
        self.callback = callback
        callback.parent = self
        self._period = _Period(self.n_steps)

    def _init_callback(self) -> None:
        self.callback.init_callback(self.model)

    def _on_training_start(self) -> None:
        self._period.start(self._periods_from())
        self.callback.on_training_start(self.locals)

    def _on_rollout_end(self) -> bool:
        if not self._period.due(self.num_timesteps):
            return True
        return self._child_event(self.callback)

    def _on_training_end(self) -> None:
        self.callback.on_training_end()

    def _on_training_error(self, error: BaseException) -> None:
        self.callback.on_training_error(error)


class StopTrainingOnRewardThreshold(BaseCallback):
    """Stop when an evaluation's mean return reaches `reward_threshold`.

    As `EvalCallback(callback_on_new_best=...)` (Stable-Baselines3's use) it reads the EvalCallback's best mean; as
    a plain callback it reads learn's own evaluations (those `learn(target_return=...)` or `learn(eval_freq=...)`
    runs)."""

    def __init__(self, reward_threshold: float, verbose: int = 0):
        super().__init__(verbose)
        if (isinstance(reward_threshold, bool) or not isinstance(reward_threshold, numbers.Real)
                or not math.isfinite(reward_threshold)):  # (NaN is never reached: training would never stop)
            raise UserError(f"StopTrainingOnRewardThreshold's reward_threshold is a finite number, got "
                            f"{reward_threshold!r}.")
        self.reward_threshold = float(reward_threshold)

    def _on_training_start(self) -> None:
        # Without an EvalCallback above it, only learn's own evaluations reach it, and learn evaluates only towards a
        # target or with an eval_freq (its `evaluating`): say so now instead of training the whole budget without
        # ever checking.
        if self.parent is not None and not hasattr(self.parent, "best_mean_reward"):
            raise UserError(f"StopTrainingOnRewardThreshold reads an EvalCallback's evaluations; it is inside a "
                            f"{type(self.parent).__name__}: pass it as EvalCallback(callback_on_new_best=...).")
        if self.parent is None and not self.locals.get("evaluating"):
            raise UserError("StopTrainingOnRewardThreshold alone needs evaluations, which learn runs only with a "
                            "target_return or an eval_freq: pass it as EvalCallback(callback_on_new_best=...), or "
                            "give learn a target_return or an eval_freq.")

    def _check(self, mean: float) -> bool:
        keep_going = not mean >= self.reward_threshold
        if not keep_going:
            self.stop_reason = (f"mean evaluation return {format_return(mean, decimals=2)} >= threshold "
                                f"{self.reward_threshold:g}")
            if self.verbose:
                print_beside_bars(f"rlspeed: stopping: {self.stop_reason}")
        return keep_going

    def _on_step(self) -> bool:
        if self.parent is None:  # a plain callback: see _on_evaluation
            return True
        return self._check(self.parent.best_mean_reward)

    def _on_evaluation(self) -> bool:
        return self._check(self.evaluation["mean"])


def _evaluations(name: str, value) -> int:
    """StopTrainingOnNoModelImprovement's `name`, a number of evaluations (a whole number >= 0); UserError naming it
    otherwise (None, a string, 2.5, a negative number, which would stop training at the first evaluation)."""
    count = positive_whole(f"StopTrainingOnNoModelImprovement's {name}", value, minimum=0)
    if count is None:
        raise UserError(f"StopTrainingOnNoModelImprovement's {name} must be a whole number >= 0, got None.")
    return count


class StopTrainingOnNoModelImprovement(BaseCallback):
    """Stop when `max_no_improvement_evals` evaluations in a row have not beaten the best mean return (counted after
    `min_evals` evaluations). Use it as `EvalCallback(callback_after_eval=...)`, as in Stable-Baselines3."""

    def __init__(self, max_no_improvement_evals: int, min_evals: int = 0, verbose: int = 0):
        super().__init__(verbose)
        self.max_no_improvement_evals = _evaluations("max_no_improvement_evals", max_no_improvement_evals)
        self.min_evals = _evaluations("min_evals", min_evals)
        self.last_best_mean_reward: float = -math.inf
        self.no_improvement_evals = 0

    def _on_training_start(self) -> None:
        # (an EvalCallback does not start its children: this runs only where it is alone, in a CallbackList learn
        # got, or in another callback, where no evaluation ever reaches it; said now, not after the first iteration)
        if self.parent is None or not hasattr(self.parent, "best_mean_reward"):
            where = "alone" if self.parent is None else f"inside a {type(self.parent).__name__}"
            raise UserError(f"StopTrainingOnNoModelImprovement counts an EvalCallback's evaluations and is {where}: "
                            "pass it as EvalCallback(callback_after_eval=...).")

    def _on_step(self) -> bool:
        if self.parent is None:
            raise UserError("StopTrainingOnNoModelImprovement must be an EvalCallback's callback_after_eval.")
        best = self.parent.best_mean_reward
        if self.n_calls > self.min_evals:
            self.no_improvement_evals = 0 if best > self.last_best_mean_reward else self.no_improvement_evals + 1
        self.last_best_mean_reward = best
        if self.no_improvement_evals > self.max_no_improvement_evals:
            self.stop_reason = f"no better evaluation in the last {self.no_improvement_evals} evaluations"
            if self.verbose:
                print_beside_bars(f"rlspeed: stopping: {self.stop_reason}")
            return False
        return True


class EvalCallback(BaseCallback):
    """Evaluate the deterministic policy every `eval_freq` env steps on a separate env for `n_eval_episodes` episodes;
    keep the best model. `eval_env`: an env id (default the model's; fresh envs each time), or an env you built,
    any that `rlspeed.evaluate` takes (a separate instance from the training env, kept open and reset for each
    evaluation): a vector env (Gymnasium's or Stable-Baselines3's: its envs share the `n_eval_episodes` episodes as
    `rlspeed.evaluate` spreads them, by default one each), or a single `gymnasium.Env` (Stable-Baselines3's
    `gym.make(id)` or `Monitor(...)` of it, options and all: its episodes run in turn, by default 5).

    With `best_model_save_path`, each new best is saved there as `best_model.safetensors` (load it with the algorithm's
    `load`). `callback_on_new_best` runs on each new best, `callback_after_eval` after every evaluation; either
    returning False stops training. With `log_path`, `evaluations.npz` holds `timesteps`, `results` and `ep_lengths`
    (the episode returns and lengths per evaluation), and `successes` (per episode) where the env reports
    `info["is_success"]`, as SB3's, each evaluation's `seeds` and the `env` evaluated on; `last_success_rate` is the
    last evaluation's share of successes. A model that goes on from a step count (`resume`, a further `learn`) keeps
    that file's evaluations up to its step and their best mean, so `best_model.safetensors` is replaced only by a
    better evaluation (evaluations on another env, a curriculum's next stage, are refused: a log_path per stage). Each
    evaluation is seeded (`seed`, default `rlspeed.evaluation.evaluation_seed(model.seed, "callback", step count)`:
    models of neighbouring seeds evaluate on unrelated episodes), so `evaluate(seed=...)` of the
    saved best model gives its score again (`best_eval_seed`). Unlike Stable-Baselines3, `eval_freq` counts env steps
    of all envs, not calls. Stable-Baselines3's `warn` is taken and has nothing to do (an eval env whose spaces differ
    from the model's is refused in one sentence); `render=True` is refused (`VideoRecorderCallback` records the
    policy), and so is sb3-contrib's `use_masking` (MaskableEvalCallback's): it evaluates masked as the model acts
    (the model's `use_masking`).
    """

    def __init__(self, eval_env: str | gym.vector.VectorEnv | rlspeed.envs.sb3_env.VecEnvLike | gym.Env | None = None,
                 callback_on_new_best: BaseCallback | None = None, callback_after_eval: BaseCallback | None = None,
                 n_eval_episodes: int | None = None, eval_freq: int = 10_000,
                 log_path: str | Path | None = None, best_model_save_path: str | Path | None = None,
                 deterministic: bool = True, seed: int | None = None, verbose: int = 1, render: bool = False,
                 warn: bool = True, use_masking: bool | None = None):
        super().__init__(verbose)
        if use_masking is not None:  # (as evaluate refuses it)
            from rlspeed.evaluation import MASKING_ADVICE

            raise UserError(f"EvalCallback's 'use_masking' is sb3-contrib's MaskableEvalCallback's; EvalCallback "
                            f"{MASKING_ADVICE}.")
        if render:
            raise UserError("EvalCallback does not render episodes: add a VideoRecorderCallback (or rlspeed eval "
                            "--video FILE.mp4) to watch the policy.")
        from rlspeed.evaluation import as_evaluation_env

        size = getattr(eval_env, "num_envs", None)  # (a vector env's; a single env runs its episodes in turn)
        eval_env = as_evaluation_env(eval_env, "EvalCallback")  # (what evaluate takes, by its rule)
        if n_eval_episodes is None:  # (a vector env: its size; an env id or a single env: 5, as Stable-Baselines3's)
            n_eval_episodes = size if size is not None else 5
        eval_freq = positive_whole("EvalCallback's eval_freq", eval_freq)
        n_eval_episodes = positive_whole("EvalCallback's n_eval_episodes", n_eval_episodes)
        self.eval_env = eval_env
        self.callback_on_new_best = _child_callback("callback_on_new_best", callback_on_new_best)
        self.callback_after_eval = _child_callback("callback_after_eval", callback_after_eval)
        for child in (self.callback_on_new_best, self.callback_after_eval):
            if child is not None:
                child.parent = self
        self.n_eval_episodes = int(n_eval_episodes)
        self.eval_freq = int(eval_freq)
        self.log_path = given_path("EvalCallback's log_path", log_path) if log_path is not None else None
        self.best_model_save_path = (given_path("EvalCallback's best_model_save_path", best_model_save_path)
                                     if best_model_save_path is not None else None)
        self.deterministic = true_or_false("EvalCallback(deterministic=...)", deterministic)
        if isinstance(seed, bool):  # (Stable-Baselines3's ninth argument, render, given in seed's place)
            raise UserError(f"EvalCallback's seed is a whole number, not {seed} (Stable-Baselines3's ninth argument is "
                            "render, this one's is seed): give render=... by name.")
        from rlspeed.envs.base import check_seed

        self.seed = None if seed is None else check_seed(seed, limit_bits=63)  # (refused now, not at an evaluation)
        self.best_mean_reward: float = -math.inf
        self.last_mean_reward: float = -math.inf
        self.best_eval_seed: int | None = None
        self.evaluations_timesteps: list[int] = []
        self.evaluations_results: list[list[float]] = []
        self.evaluations_length: list[list[int]] = []
        self.evaluations_successes: list[list[bool]] = []  # (envs that report info["is_success"])
        # each evaluation's episodes cut short at the step limit (-1: not recorded, in SB3's or an older rlspeed's file)
        self.evaluations_unfinished: list[int] = []
        self._seeds: list[int] = []  # (each evaluation's seed, as evaluations.npz keeps them)
        self.last_success_rate: float | None = None
        self._period = _Period(self.eval_freq)

    def _init_callback(self) -> None:
        from rlspeed.envs.gymnasium_env import check_same_step

        if isinstance(self.eval_env, gym.vector.VectorEnv):  # (before training, not at the first evaluation)
            check_same_step(self.eval_env, "EvalCallback's eval_env must be")
        _check_normalization(self.training_env, self.eval_env)
        from rlspeed.envs.base import BatchedEnv
        from rlspeed.evaluation import check_evaluation_env, check_evaluation_spaces

        if self.eval_env is None or isinstance(self.eval_env, (str, BatchedEnv)):
            check_evaluation_env(self.model, self.eval_env if self.eval_env is not None else self.model.env_id)
        check_evaluation_spaces(self.model, self.eval_env)  # (an env object's, as its first evaluation would)
        for name, path in (("best_model_save_path", self.best_model_save_path), ("log_path", self.log_path)):
            if path is not None:
                _made_folder(f"EvalCallback's {name}", path)
        for child in (self.callback_on_new_best, self.callback_after_eval):
            if child is not None:
                child.init_callback(self.model)

    def _on_training_start(self) -> None:
        self._period.start(self._periods_from())
        if self.num_timesteps > 0 and not self.evaluations_timesteps:
            self._continue_log()
        # (its children start and end with it, as EveryNTimesteps' callback does; Stable-Baselines3 starts its
        # callback_after_eval)
        for child in (self.callback_on_new_best, self.callback_after_eval):
            if child is not None:
                child.on_training_start(self.locals)

    def _on_rollout_end(self) -> bool:
        if not self._period.due(self.num_timesteps):
            return True
        return self.evaluate_now()

    def _on_training_end(self) -> None:
        for child in (self.callback_on_new_best, self.callback_after_eval):
            if child is not None:
                child.on_training_end()

    def _on_training_error(self, error: BaseException) -> None:
        for child in (self.callback_on_new_best, self.callback_after_eval):
            if child is not None:
                child.on_training_error(error)

    def _continue_log(self) -> None:
        """A model that goes on from a step count (`resume`, a further `learn`) keeps the evaluations
        `log_path/evaluations.npz` holds up to that step, and its best mean return: an evaluation after a resume
        replaces `best_model.safetensors` only where it beats the best before it (a fresh callback would start from
        -inf and replace it at once), and the file keeps the earlier evaluations (Stable-Baselines3's starts anew)."""
        file = self.log_path / "evaluations.npz" if self.log_path is not None else None
        if file is None or not file.is_file():
            return
        try:
            with np.load(file) as saved:
                logged = {key: saved[key] for key in saved.files}
            timesteps, results, lengths = logged["timesteps"], logged["results"], logged["ep_lengths"]
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as error:  # (EOFError: an empty file;
            # BadZipFile: one cut short)
            raise UserError(f"EvalCallback's log_path holds '{file}', which cannot be read as the evaluations of an "
                            f"earlier run ({error}); move it away or give another log_path.") from None
        kept = timesteps <= self.num_timesteps
        if not kept.any():
            return
        if results.ndim != 2 or results.shape[1] != self.n_eval_episodes:
            raise UserError(f"EvalCallback's '{file}' holds evaluations of {results.shape[-1]} episodes each and "
                            f"this one runs {self.n_eval_episodes}: give n_eval_episodes={results.shape[-1]} to "
                            "continue them, or another log_path.")
        env, before = self._evaluated_env(), str(logged["env"]) if "env" in logged else None
        if env is not None and before is not None and env != before:  # (a curriculum's next stage: Algo.load with
            # other env options keeps the step count; its evaluations and best are of another env)
            raise UserError(f"EvalCallback's '{file}' holds evaluations on {before} and this run evaluates on {env}: "
                            "give this stage its own log_path (and best_model_save_path).")
        self.evaluations_timesteps = timesteps[kept].tolist()
        self.evaluations_results = results[kept].tolist()
        self.evaluations_length = lengths[kept].tolist()
        cut = logged.get("unfinished")
        self.evaluations_unfinished = (cut[kept].tolist() if cut is not None and len(cut) == len(timesteps)
                                       else [-1] * int(kept.sum()))
        if "successes" in logged and len(logged["successes"]) == len(timesteps):
            self.evaluations_successes = logged["successes"][kept].tolist()
        means = results[kept].mean(axis=1)
        best = int(np.argmax(means))
        self.best_mean_reward, self.last_mean_reward = float(means[best]), float(means[-1])
        seeds = logged.get("seeds")
        # (a file of rlspeed's; Stable-Baselines3's has none: -1, no seed known)
        self._seeds = seeds[kept].tolist() if seeds is not None and len(seeds) == len(timesteps) else [-1] * len(means)
        self.best_eval_seed = self._seeds[best] if self._seeds[best] >= 0 else None

    def _evaluated_env(self) -> str | None:
        """The env the evaluations run on, as evaluations.npz records it (`env`: its id and options), or None for a
        vector env the user built (nothing to name it by)."""
        from rlspeed.evaluation import env_options

        env_id = self.eval_env if self.eval_env is not None else self.model.env_id
        if not isinstance(env_id, str):
            return None
        options = env_options(self.model, env_id)
        return env_id + (f" ({', '.join(f'{key}={value!r}' for key, value in sorted(options.items()))})"
                         if options else "")

    def evaluate_now(self) -> bool:
        """Evaluate now (what every `eval_freq` steps does); False when a child callback stops training."""
        from rlspeed.evaluation import evaluate, evaluation_seed

        model = self.model
        seed = self.seed if self.seed is not None else evaluation_seed(model.seed, "callback", self.num_timesteps)
        env_id = self.eval_env if self.eval_env is not None else model.env_id
        _sync_normalization(self.training_env, self.eval_env)
        same_env = isinstance(env_id, str) and env_id == model.env_id and model.env_backend in ("torch", "gymnasium")
        result = evaluate(model, env_id, episodes=self.n_eval_episodes, seed=seed, deterministic=self.deterministic,
                          backend=model.env_backend if same_env else "auto")
        self.last_mean_reward = result["mean"]
        self.evaluations_timesteps.append(self.num_timesteps)
        self._seeds.append(seed)
        self.evaluations_results.append(result["returns"])
        self.evaluations_length.append(result["lengths"])
        self.evaluations_unfinished.append(result["unfinished"])
        # (as Stable-Baselines3's EvalCallback logs them: columns of the next metrics row, and of W&B's)
        self.logger.record("eval/mean_reward", result["mean"])
        self.logger.record("eval/mean_ep_length", float(np.mean(result["lengths"])))
        self.logger.record("eval/unfinished", result["unfinished"])  # (rlspeed's: SB3 has none)
        success = ""
        if "successes" in result:
            self.evaluations_successes.append(result["successes"])
            self.last_success_rate = result.get("success_rate")
            if self.last_success_rate is not None:
                success = f", success rate {self.last_success_rate:.0%}"
                self.logger.record("eval/success_rate", self.last_success_rate)
        if self.log_path is not None:
            extra = {"successes": np.array(self.evaluations_successes)} if self.evaluations_successes else {}
            env = self._evaluated_env()
            if env is not None:  # (what a continuing run checks it evaluates on)
                extra["env"] = np.array(env)
            archive = io.BytesIO()
            np.savez(archive, timesteps=np.array(self.evaluations_timesteps),
                     results=np.array(self.evaluations_results), ep_lengths=np.array(self.evaluations_length),
                     seeds=np.array(self._seeds), unfinished=np.array(self.evaluations_unfinished), **extra)
            # (whole or not at all: a run killed while writing it is resumed, and reads it back)
            write_atomic(self.log_path / "evaluations.npz", archive.getvalue())
        if self.verbose:
            mean, std = (format_return(result[key], decimals=2) for key in ("mean", "std"))
            # (the warning of episodes cut short shows once: this line says it of every evaluation)
            print_beside_bars(f"rlspeed: eval at {self.num_timesteps:,} steps: {mean} +/- {std}{success}"
                              f"{cut_short(result.get('unfinished'), result['episodes'])}")
        keep_going = True
        if result["mean"] > self.best_mean_reward:
            self.best_mean_reward = result["mean"]
            self.best_eval_seed = seed
            if self.best_model_save_path is not None:
                model.save(self.best_model_save_path / "best_model.safetensors")
            keep_going = self._child_event(self.callback_on_new_best)
        return self._child_event(self.callback_after_eval) and keep_going


def _made_folder(name: str, path: Path) -> None:
    """Make the folder `path` that the argument `name` gives (with its parents) at learn's start, or UserError in one
    sentence where it cannot be made or written (a file in its place, a read-only or another user's folder): said
    before training, not at its first save."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        why = ("a file is in its place or in its parents'" if isinstance(error, (FileExistsError, NotADirectoryError))
               else error.strerror or str(error))
        raise UserError(f"{name} '{path}' cannot be made a folder ({why}): give a folder you can write to.") from None
    why = unwritable(path)
    if why is not None:
        raise UserError(f"{name} '{path}' cannot be written ({why}): give a folder you can write to.")


class CheckpointCallback(BaseCallback):
    """Save the model every `save_freq` env steps to `save_path/{name_prefix}_{steps}_steps.safetensors`; with
    `save_replay_buffer`, off-policy models also write their replay buffer beside each file
    (`....replay.safetensors`). Unlike Stable-Baselines3, `save_freq` counts env steps of all envs, not calls;
    a save happens at the end of the first iteration that reaches the step. Each saved file holds the model's own
    observation and reward normalisation statistics; where the model trains on a Stable-Baselines3 VecEnv with a
    `VecNormalize`, `save_vecnormalize` also writes its statistics beside it, as Stable-Baselines3 does
    (`{name_prefix}_vecnormalize_{steps}_steps.pkl`, for `VecNormalize.load`).

    `keep_last`: keep only the newest `keep_last` saves (None, the default: every one). After each save, the files
    of older saves that this callback wrote are deleted, a save's replay buffer and VecNormalize statistics with its
    model; files it did not write (an earlier run's or process's in the folder) are never deleted. `saved` lists the
    model (and statistics) files kept, oldest first."""

    def __init__(self, save_freq: int, save_path: str | Path, name_prefix: str = "rl_model",
                 save_replay_buffer: bool = False, save_vecnormalize: bool = False, verbose: int = 0,
                 keep_last: int | None = None):
        super().__init__(verbose)
        self.save_freq = positive_whole("CheckpointCallback's save_freq", save_freq)
        if not isinstance(save_path, (str, os.PathLike)):
            raise UserError(f"CheckpointCallback's save_path is a directory's path (a str or pathlib.Path), not "
                            f"{save_path!r}.")
        self.save_path = local_path(save_path)
        # (the start of each file's name: a separator in it saved into a folder of its own under save_path)
        if not isinstance(name_prefix, str) or any(sep and sep in name_prefix for sep in (os.sep, os.altsep, "/")):
            raise UserError(f"CheckpointCallback's name_prefix is the start of each file's name, a str without a "
                            f"path separator (its folder is save_path), got {name_prefix!r}."[:200])
        self.name_prefix = name_prefix
        self.save_replay_buffer = true_or_false("CheckpointCallback(save_replay_buffer=...)", save_replay_buffer)
        self.save_vecnormalize = true_or_false("CheckpointCallback(save_vecnormalize=...)", save_vecnormalize)
        self.keep_last = positive_whole("CheckpointCallback's keep_last", keep_last)
        self.saved: list[Path] = []
        self._saves: list[list[Path]] = []  # the files of each save kept, a replay buffer's too, oldest first
        self._period = _Period(self.save_freq)

    def _init_callback(self) -> None:
        strategy = getattr(self.model, "strategy", None)  # (a population has none: one process)
        if self._saves_replay() and strategy is not None:  # (as learn starts, not at the first save)
            refuse_replay_saving(strategy.world_size, "CheckpointCallback(save_replay_buffer=True)")
        _made_folder("CheckpointCallback's save_path", self.save_path)

    def _saves_replay(self) -> bool:
        """Whether the saves write a replay buffer: `save_replay_buffer` given and the model keeps one (for one that
        keeps none, PPO, A2C, RecurrentPPO, the setting means nothing, as in Stable-Baselines3)."""
        return self.save_replay_buffer and getattr(self.model, "keeps_replay_buffer", False)

    def _on_training_start(self) -> None:
        self._period.start(self._periods_from())

    def _on_rollout_end(self) -> bool:
        if not self._period.due(self.num_timesteps):
            return True
        path = self.save_path / f"{self.name_prefix}_{self.num_timesteps}_steps.safetensors"
        before = bool(self.model.save_replay_buffer)
        self.model.save_replay_buffer = before or self._saves_replay()
        try:
            self.model.save(path)
            replay = None
            if self.model.save_replay_buffer:
                from rlspeed.checkpoint import replay_path

                replay = replay_path(path) if replay_path(path).is_file() else None
        finally:
            self.model.save_replay_buffer = before
        files = [path]
        from rlspeed.envs.sb3_env import vec_normalize_of

        vec_normalize = vec_normalize_of(self.training_env) if self.save_vecnormalize else None
        if vec_normalize is not None:
            statistics = self.save_path / f"{self.name_prefix}_vecnormalize_{self.num_timesteps}_steps.pkl"
            vec_normalize.save(str(statistics))
            files.append(statistics)
            if self.verbose:
                print_beside_bars(f"rlspeed: saved {statistics}")
        if self.verbose:
            print_beside_bars(f"rlspeed: saved {path}")
        self._keep(files, replay)
        return True

    def _keep(self, files: list[Path], replay: Path | None) -> None:
        """Record the files of the save just written (`replay`: its replay buffer's, not listed in `saved`), then
        delete those of saves older than the newest `keep_last` (a file of an older save that this one wrote again,
        of the same name, is this save's, and stays)."""
        written = files + ([replay] if replay is not None else [])
        self.saved += files
        for earlier in self._saves:
            earlier[:] = [file for file in earlier if file not in written]
        self._saves = [earlier for earlier in self._saves if earlier] + [written]
        if self.keep_last is None:
            return
        while len(self._saves) > self.keep_last:
            for file in self._saves.pop(0):
                self.saved = [kept for kept in self.saved if kept != file]
                try:
                    file.unlink(missing_ok=True)
                except OSError as error:  # (a directory made read-only since: the save itself was written)
                    warnings.warn(f"rlspeed: CheckpointCallback could not delete '{file}', older than the newest "
                                  f"keep_last={self.keep_last} saves ({error.strerror or error}); training goes on.",
                                  RuntimeWarning, stacklevel=2)
                    continue
                if self.verbose:
                    print_beside_bars(f"rlspeed: deleted {file}")


class VideoRecorderCallback(BaseCallback):
    """Record `episodes` deterministic evaluation episodes every `video_every` env steps into
    `video_folder/step-{steps:09d}.mp4` (`step-000020000.mp4`: zero-padded, so that the files sort by step; see
    `rlspeed.video.record_video`; needs `pip install rlspeed[video]`), at `fps` frames per second (None: the env's
    render_fps). A file already of that name (another run's in the folder) is kept: the video goes beside it, as
    `step-000020000-1.mp4`, with a warning; `overwrite=True` replaces it instead (a folder of the run's own, which
    a resumed run films again from its checkpoint on: `rlspeed train --video-every`). `on_video(path, steps)`,
    when given, receives each file (the W&B tracker uploads it). `env_id`: the registered env to film (default: the
    model's own; a model trained on a vector env you built, which cannot be made again, needs one with its spaces).
    `videos` lists the files written; `first_due` is the step count at which a `learn` call's first video is due (a
    run that ends before it films none: `rlspeed train --video-every` says so)."""

    def __init__(self, video_every: int, video_folder: str | Path, episodes: int = 1, fps: int | None = None,
                 on_video: Callable[[Path, int], None] | None = None, verbose: int = 0, overwrite: bool = False,
                 env_id: str | None = None):
        super().__init__(verbose)
        self.env_id = env_id
        # (a whole number as the other callbacks' step counts take it: 1e4 too)
        video_every = positive_whole("VideoRecorderCallback's video_every", video_every, "VideoRecorderCallback")
        # (checked here, not at the first video)
        if isinstance(episodes, bool) or not isinstance(episodes, numbers.Integral) or episodes < 1:
            raise UserError(f"VideoRecorderCallback needs at least one episode per video, got episodes={episodes!r}.")
        if fps is not None and (isinstance(fps, bool) or not isinstance(fps, numbers.Real) or not fps > 0):
            raise UserError(f"VideoRecorderCallback's fps must be a number above 0 (or None), got {fps!r}.")
        self.video_every = video_every
        self.video_folder = given_path("VideoRecorderCallback's video_folder", video_folder)
        self.episodes = episodes
        self.fps = fps
        self.on_video = on_video
        self.overwrite = true_or_false("VideoRecorderCallback(overwrite=...)", overwrite)
        self.videos: list[Path] = []
        self._period = _Period(self.video_every)
        self.first_due: int | None = None

    def _init_callback(self) -> None:
        from rlspeed.evaluation import env_options
        from rlspeed.video import check_video_support

        # (before training, not at the first video; on the env the videos film: made with the model's env options,
        # which an env that needs one of them cannot be made without)
        check_video_support(self.env_id or self.model.env_id, env_kwargs=env_options(self.model, self.env_id))
        _made_folder("VideoRecorderCallback's video_folder", self.video_folder)

    def _on_training_start(self) -> None:
        self._period.start(self._periods_from())
        self.first_due = self._period.next

    def _on_rollout_end(self) -> bool:
        if not self._period.due(self.num_timesteps):
            return True
        from rlspeed.video import VideoWriteError, record_video

        path = self.video_folder / f"step-{self.num_timesteps:09d}.mp4"  # (sorted by name, sorted by step)
        if not self.overwrite and (path.exists() or path.is_symlink()):  # (another run's: kept, not replaced)
            taken, copy = path, 1
            while path.exists() or path.is_symlink():
                path, copy = self.video_folder / f"step-{self.num_timesteps:09d}-{copy}.mp4", copy + 1
            warnings.warn(f"rlspeed: '{taken}' exists and is kept: this video is '{path.name}' beside it.",
                          RuntimeWarning, stacklevel=2)
        seed = (self.model.seed or 0) + 300_000 + self.num_timesteps
        try:
            with warnings.catch_warnings():  # (an episode cut at the step limit is still a video; others are said)
                warnings.filterwarnings("ignore", message="record_video: .* episodes were still running",
                                        category=UserWarning)
                filmed = record_video(self.model, path, episodes=self.episodes, seed=seed, fps=self.fps,
                                      overwrite=self.overwrite, env_id=self.env_id)
        except VideoWriteError as error:  # (a video is not worth the run: training goes on without it)
            warnings.warn(f"rlspeed: {error} Training goes on; the next video is due at {self._period.next:,} steps.",
                          RuntimeWarning, stacklevel=2)
            return True
        self.videos.append(path)
        if self.verbose:
            # (the warning of episodes cut at the step limit is left out: this line says it of each video)
            print_beside_bars(f"rlspeed: video {path}{cut_short(filmed['unfinished'], filmed['episodes'])}")
        if self.on_video is not None:
            self.on_video(path, self.num_timesteps)
        return True


__all__ = ["BaseCallback", "CallbackList", "FunctionCallback", "EveryNTimesteps", "EvalCallback", "CheckpointCallback",
           "StopTrainingOnRewardThreshold", "StopTrainingOnNoModelImprovement", "VideoRecorderCallback", "as_callback"]


#: Stable-Baselines3 callbacks rlspeed has no class of, with what to use instead (the module's `__getattr__`)
_SB3_CALLBACKS = {
    "ProgressBarCallback": "learn(progress_bar=True) shows the progress bar (the default)",
    "StopTrainingOnMaxEpisodes": "learn(total_timesteps=...) bounds a run in env steps, and a BaseCallback of your "
                                 "own whose _on_step returns False stops it after N episodes: in every algorithm, "
                                 "self.locals['metrics']['episode_count'] is the number that ended in the iteration "
                                 "(a tensor: reading it is a host sync each iteration), and Stable-Baselines3's "
                                 "max_episodes counts per env (max_episodes * self.training_env.num_envs in all)",
    "LogEveryNTimesteps": "learn(log_interval_s=...) sets how often (in seconds) metrics are logged, and "
                          "EveryNTimesteps(n, callback) calls a callback every n env steps",
    "ConvertCallback": "learn(callback=fn) takes a plain function fn(locals_) or fn(locals_, globals_) as it is",
    "MaskableEvalCallback": "sb3-contrib's MaskableEvalCallback is rlspeed.callbacks.EvalCallback, which masks as the "
                            "model does (its use_masking; the same arguments but use_masking)",
}


#: what `learn(callback=...)` takes: a callback, a list of them, a function `fn(locals_)` or `fn(locals_, globals_)`
#: (returning False stops training), or None
CallbackFunction: typing.TypeAlias = Callable[..., bool | None]
CallbackLike: typing.TypeAlias = BaseCallback | Sequence[BaseCallback | CallbackFunction] | CallbackFunction | None


def _missing_callback(name: str):
    # (only for names not found: Stable-Baselines3's callbacks rlspeed lacks say what to use instead; `from
    # rlspeed.callbacks import X` gets an ImportError of its own, as `from rlspeed import MaskablePPO` does)
    import sys

    advice = _SB3_CALLBACKS.get(name)
    if advice is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    raise rlspeed._advice_error(f"rlspeed has no {name} (Stable-Baselines3's): {advice}.", __name__,
                                sys._getframe(1))


if not typing.TYPE_CHECKING:  # (for type checkers only the names defined here exist: a misspelt one is an error)
    __getattr__ = _missing_callback
