"""Errors a user can cause (`UserError`: the CLI prints its message as one sentence and exits with code 2; `Busy`,
another process holding what the command needs: code 75), an env's own failure (`EnvStepError`: one sentence, exit
code 1) and the end of a distributed run's process whose peer ended (`PeerEnded`: one line, exit code 1). No torch
import here: the CLI handles them before it imports torch."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import numbers
import traceback
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path


class UserError(Exception):
    """A mistake in what the user asked for (bad env id, bad hyperparameter, missing device, bad checkpoint)."""

    def _render_traceback_(self) -> list[str]:
        """What IPython and Jupyter show instead of a traceback (their hook): the message, which says what to do,
        without the frames of rlspeed's internals; the error it was raised from, where there is one, below it."""
        lines = [f"{type(self).__name__}: {self}"]
        cause = self.__cause__
        if cause is not None:
            lines.append(f"(raised from {type(cause).__name__}: {cause})")
        return lines


class Busy(UserError):
    """Another process holds what the command needs (a run directory it trains in, a tune study it runs): nothing is
    wrong with the command, which may succeed once that process ends. The CLI prints its message as one sentence and
    exits with code 75 (EX_TEMPFAIL of sysexits.h: try again later), so that a batch script can tell it from a bad
    input (2)."""


class OtherEnvOptionsWarning(UserWarning):
    """A run resumed (`resume`) into a model whose env options differ from those the run was trained with: it goes
    on on the model's env (the command line's `--resume --env-kwargs` changes them on purpose and says so)."""


class UnusedSettingWarning(UserWarning):
    """A hyperparameter that changes nothing on the env it is given for (say `cnn_features_dim` without images):
    said when a model is made, not again when one is loaded or a population's member models are rebuilt."""


class EncoderWarning(UserWarning):
    """What the encoder an observation space gets costs or loses (images flattened into an MLP, a CNN of millions of
    linear weights): said when a model is made, not again when one is loaded or a population's member models are
    rebuilt."""


class WaitingEnvWarning(UserWarning):
    """Training's one note that its in-process Gymnasium envs mostly wait (a sleep, a socket, a simulator in another
    process), with the measured time of a step: subprocess envs (`gymnasium-async`) would wait side by side
    (`rlspeed.diagnostics.waiting`)."""


def first_line(error: BaseException) -> str:
    """The first line of `error`'s message ("" where it has none): what a one-sentence error quotes of another."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else ""


def raised_at(error: BaseException) -> str:
    """Where `error` was raised, for a sentence about an error without a message (a bare `assert` in an env's code):
    "at package/module/file.py:142 (assert x in y)", the last frame of its traceback (the file's last three path
    parts, and the line's source where it can be read); "" without a traceback."""
    frames = traceback.extract_tb(error.__traceback__) if error.__traceback__ is not None else []
    if not frames:
        return ""
    frame = frames[-1]
    source = f" ({frame.line.strip()[:120]})" if frame.line and frame.line.strip() else ""
    return f"at {'/'.join(Path(frame.filename).parts[-3:])}:{frame.lineno}{source}"


class EnvStepError(RuntimeError):
    """An env raised inside `reset`, `step` or `close`: the message names the env and the call; the env's own exception
    is chained (`__cause__`) with its traceback.

    `env_id` and `backend` name the env, `call` the call ("reset", "step", "close", or "make" while it was made),
    `error` the env's exception; `options`: the names of the env options it was made with, which the message asks to
    check (empty: none). A close() error raised after the work it followed (`CloseErrors.raise_first`) also holds
    the close() errors of the other envs in `others` (its message counts them) and, where the work returns one
    (`rlspeed.evaluate`'s scores), that work's `result`.
    """

    #: the close() errors of other envs that followed this one's (`CloseErrors.raise_first`)
    others: tuple[EnvStepError, ...] = ()
    #: what the work that this close() error followed returned, kept (`CloseErrors.raise_first`: evaluate's result)
    result: object = None

    def __init__(self, env_id: str, backend: str, call: str, error: BaseException,
                 options: Sequence[str] = ()) -> None:
        self.env_id, self.call, self.error = env_id, call, error
        detail = first_line(error)
        where = "" if detail else raised_at(error)  # (an error without a message: a bare `assert` in the env's code)
        # (`options`: the env options it was made with, which may hold the value it could not use)
        made_with = f" (it was made with the options {', '.join(options)}: check their values)" if options else ""
        super().__init__(f"The env '{env_id}' ({backend} backend) raised {type(error).__name__} in {call}()"
                         + (f" {where}" if where else "") + (f": {detail}" if detail else "") + made_with)


class CloseErrors:
    """`with CloseErrors() as closing:` an env's close() error (`close_envs`) is kept in `closing.errors`, not raised: a
    close() error must not lose the work done (a trained model, scores, a video), so the work goes on, and the caller
    raises them (`raise_first`) once its results are saved and shown, with the result it returns where it returns one;
    where the work fails instead, the caller drops them for that first error. Nested, the outermost keeps them: an
    inner one's `errors` stay empty (its `raise_first` raises nothing). `errors`: close() errors to hold from the start
    (`CloseErrors(errors).raise_first()` raises them as a block would, where none is open)."""

    def __init__(self, errors: Sequence[EnvStepError] = ()) -> None:
        self.errors: list[EnvStepError] = list(errors)
        self._token: contextvars.Token | None = None

    def __enter__(self) -> CloseErrors:
        if CLOSE_ERRORS.get() is None:
            self._token = CLOSE_ERRORS.set(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._token is not None:
            CLOSE_ERRORS.reset(self._token)
            self._token = None

    def others_note(self) -> str:
        """How many close() errors followed the first, and of which envs ("and 2 more close() errors of the env
        'X'"), as the first one's message (`raise_first`) and summary.json's `close_error` count them; "" for one."""
        others = self.errors[1:]
        if not others:
            return ""
        envs = list(dict.fromkeys(f"'{error.env_id}'" for error in others))
        return (f"and {len(others)} more close() error{'s' if len(others) > 1 else ''} of the "
                f"env{'s' if len(envs) > 1 else ''} {', '.join(envs)}")

    def raise_first(self, result: object = None, kept: str = "its result") -> None:
        """Raise the first kept close() error, if any (once the work is saved and shown): the others in its `others`,
        its message naming how many and whose; where the work returns `result` (not None), in its `result` too, its
        message saying that `kept` (what the result is: "the evaluation's result") is there."""
        if not self.errors:
            return
        first, others = self.errors[0], self.errors[1:]
        notes = []
        if others:
            notes.append(f"{self.others_note()}, in this error's `others`")
            first.others = tuple(others)
        if result is not None:
            notes.append(f"this error's `result` holds {kept}")
            first.result = result
        if notes:
            first.args = (f"{first.args[0]} ({'; '.join(notes)})",)
        raise first


#: Where a command, not a script, runs (`command_advice`): its name and, where one is given, the advice that makes it
#: build the user's class `module.QualName` that saved a model file, in the command's terms; None: a script's (Python's)
_COMMAND_ADVICE: contextvars.ContextVar[tuple[str, Callable[[str], str] | None] | None] = contextvars.ContextVar(
    "_COMMAND_ADVICE", default=None)


@contextlib.contextmanager
def command_advice(command: str, advice: Callable[[str], str] | None = None):
    """Within it, a sentence that gives advice gives it in the terms of `command` (`rlspeed eval`), a command line's
    (`in_words`), and `_warn_other_class` says `command` makes the model, with `advice(saved)` saying what makes it
    build the class `saved`: the form that fits a command line (`--gym-packages MODULE`), not Python's."""
    token = _COMMAND_ADVICE.set((command, advice))
    try:
        yield
    finally:
        _COMMAND_ADVICE.reset(token)


def in_words(cli: str, python: str) -> str:
    """`cli`, the advice in a command line's terms (`--env-backend gymnasium`), inside `command_advice` (the `rlspeed`
    command runs), else `python`, its terms in Python (`env_backend='gymnasium'`)."""
    return cli if _COMMAND_ADVICE.get() is not None else python


def running_command() -> tuple[str, Callable[[str], str] | None] | None:
    """The command `command_advice` says runs now and its advice for building a saved class (`rlspeed eval`, a
    function of `module.QualName`), or None in a script: what a sentence whose advice names more than a flag reads."""
    return _COMMAND_ADVICE.get()


#: the outermost open `CloseErrors` (None outside one), which `close_envs` keeps its errors in
CLOSE_ERRORS: contextvars.ContextVar[CloseErrors | None] = contextvars.ContextVar("rlspeed_close_errors", default=None)


def close_errors_last(kept: str) -> Callable[[Callable], Callable]:
    """A decorator for a function whose work returns a result (`rlspeed.evaluate`'s scores): it runs in a
    `CloseErrors` block, so that an env's close() error does not lose that work; once it has returned, the close()
    error is raised with the result in its `result` (`raise_first`; `kept` says what the result is). Inside an outer
    block (the CLI's command, `learn`), that block raises it instead, at its end."""

    def decorator(function: Callable) -> Callable:
        @functools.wraps(function)
        def kept_past_close_errors(*args, **kwargs):
            with CloseErrors() as closing:
                result = function(*args, **kwargs)
            closing.raise_first(result, kept)
            return result

        return kept_past_close_errors

    return decorator


class PeerEnded(RuntimeError):
    """A process of a torch.distributed run found a collective broken because another process ended or stopped
    answering (that process's own error is the cause to read): the CLI prints its message as one line, exit code 1;
    the collective's error is chained (`__cause__`)."""


#: Algorithms of sb3-contrib and RL-Zoo under their names (lower case, without "_" and "-"), each with what rlspeed
#: offers in their place: `peer_algorithm_advice` says it where such a name is asked for
_PEER_ALGORITHMS = {
    **dict.fromkeys(("maskableppo", "ppomask"),
                    "rlspeed's ppo masks actions as sb3-contrib's MaskablePPO does (use_masking, on by default: the "
                    "env's info['action_mask'] or action_masks() method): use ppo (rlspeed.PPO)"),
    **dict.fromkeys(("ppolstm", "recurrentppo"),
                    "sb3-contrib's RecurrentPPO (RL-Zoo's ppo_lstm) is recurrent_ppo (rlspeed.RecurrentPPO)"),
    "maskableevalcallback": "rlspeed's EvalCallback masks actions wherever the model trained with masks: use "
                            "rlspeed.EvalCallback",
    "qrdqn": "rlspeed has no QR-DQN (sb3-contrib's); dqn (with double_q, dueling and n_step) is the closest",
    "tqc": "rlspeed has no TQC (sb3-contrib's); sac (with n_critics) is the closest",
    "crossq": "rlspeed has no CrossQ (sb3-contrib's); sac is the closest",
    "trpo": "rlspeed has no TRPO (sb3-contrib's); ppo is the closest",
    "ars": "rlspeed has no ARS (sb3-contrib's gradient-free search); ppo and sac are its gradient-based choices",
    "herreplaybuffer": "rlspeed has no top-level HerReplayBuffer: Hindsight Experience Replay is a setting of its "
                       "DQN, SAC, TD3 and DDPG, her=True (with n_sampled_goal and goal_selection_strategy), e.g. "
                       "rlspeed.SAC(env, her=True), which then use rlspeed.buffers.HerReplayBuffer",
    **dict.fromkeys(("normalactionnoise", "ornsteinuhlenbeckactionnoise", "vectorizedactionnoise"),
                    "rlspeed's action noise is a setting: action_noise='normal' or 'ornstein-uhlenbeck' with "
                    "action_noise_std=sigma (TD3, DDPG)"),
}


def peer_algorithm_advice(name: str) -> str | None:
    """What rlspeed offers in place of sb3-contrib's or RL-Zoo's algorithm `name` (`MaskablePPO`, `ppo_lstm`,
    `qrdqn`, ...), or None for other names."""
    return _PEER_ALGORITHMS.get(name.lower().replace("_", "").replace("-", ""))


#: what to write for Stable-Baselines3's `set_random_seed`, the function and the model's method alike
SEED_ADVICE = ("give the seed when making or loading the model (Algo(env, seed=S), Algo.load(path, seed=S)): its "
               "weights, samples and envs draw from streams of their own, which a global seed does not reach")

#: Stable-Baselines3's helper functions and env wrappers under their names, each with rlspeed's way to do their work:
#: `from rlspeed import make_vec_env` (and `from rlspeed.evaluation import evaluate_policy`) says it (`sb3_name_advice`)
_SB3_NAMES = {
    "evaluate_policy": "rlspeed.evaluate(model, env, episodes=N) plays the episodes and returns a dict whose 'mean' "
                       "and 'std' are evaluate_policy's pair (its 'returns' and 'lengths' what return_episode_rewards "
                       "gives)",
    **dict.fromkeys(("make_vec_env", "DummyVecEnv", "SubprocVecEnv"),
                    "give the algorithm the env id and num_envs=N (PPO('CartPole-v1', num_envs=8); "
                    "env_backend='gymnasium-async' steps them in subprocesses), or rlspeed.make_env(env_id, "
                    "num_envs=N) for a batched env of tensors; a Stable-Baselines3 VecEnv you build also trains as it "
                    "is"),
    "set_random_seed": SEED_ADVICE,
    "VecNormalize": "normalize_obs=True and normalize_reward=True (with normalize_obs_clip and "
                    "normalize_reward_clip) keep the statistics on the device and in the model's checkpoint; a "
                    "Stable-Baselines3 VecEnv wrapped in VecNormalize also trains as it is",
    "Monitor": "rlspeed counts the episodes' returns and lengths itself (metrics.csv's episode_return, evaluate's "
               "returns and lengths), and keeps a Monitor of a Stable-Baselines3 VecEnv you give it",
}


def sb3_name_advice(name: str) -> str | None:
    """What rlspeed offers in place of Stable-Baselines3's helper or wrapper `name` (`evaluate_policy`,
    `make_vec_env`, `VecNormalize`, ...), a sentence without its full stop, or None for other names."""
    advice = _SB3_NAMES.get(name)
    return None if advice is None else f"rlspeed has no {name} (Stable-Baselines3's): {advice}"


def infinite_advice(key: str) -> str:
    """How to write here what an infinite `key` means in Stable-Baselines3, for the refusal of it (hyperparameters
    are finite numbers); '' for keys where infinity means nothing."""
    if key == "max_grad_norm":
        return "; no gradient clipping (Stable-Baselines3's inf) is a large value here, such as 1e9"
    return ""


#: the largest whole number an int setting or an env's int option takes: int64's largest, what an index, a step
#: counter or an env's C integer holds (1e300 taken as an int is a 301-digit number no env can use)
MAX_COUNT = 2**63 - 1


def refuse_past_int64(what: str, value) -> None:
    """UserError in one sentence where whole number `value` is more than `MAX_COUNT` in size; `what` begins it
    ("Hyperparameter 'n_epochs' takes a whole number", "Env 'X' takes the option frame_skip as ...")."""
    if abs(value) > MAX_COUNT:
        shown = repr(value) if len(repr(value)) <= 24 else f"a {len(str(abs(int(value))))}-digit number"
        raise UserError(f"{what} of at most 2**63 - 1 ({MAX_COUNT:.3g}) in size, got {shown}.")


def positive_whole(name: str, value, needed_by: str | None = None, minimum: int = 1):
    """`value` (None, or a whole number >= `minimum` and at most `MAX_COUNT`, e.g. 1e4) as an int; UserError naming
    `name` otherwise (a bool, a string, 2.5, NaN, infinity or 1e300), and for None where `needed_by` (what needs the
    value, "evaluate") is given."""
    if value is None:
        if needed_by is not None:
            raise UserError(f"{needed_by} needs {name}, a whole number >= {minimum}, not None.")
        return None
    if (isinstance(value, bool) or not isinstance(value, numbers.Real) or not float(value).is_integer()
            or value < minimum):
        raise UserError(f"{name} must be a whole number >= {minimum}, got {value!r}.")
    refuse_past_int64(f"{name} takes a whole number", value)
    return int(value)


def seconds(name: str, value) -> float | None:
    """`value` (None, or a number of seconds >= 0) as a float; UserError naming `name` otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value >= 0:
        raise UserError(f"{name} is a number of seconds, at least 0, got {value!r}.")
    return float(value)


def is_bool(value) -> bool:
    """Whether `value` is a bool, Python's or numpy's (told by its type's name: no numpy import here)."""
    return isinstance(value, bool) or (type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"))


def is_true_or_false(value) -> bool:
    """Whether `value` is one `true_or_false` takes: a bool, numpy's, or a number equal to 0 or 1 (1.0 too, as a
    YAML file or a computed setting gives it). The one rule for rlspeed's own switches, its hyperparameters' and the
    bool options of an env."""
    return is_bool(value) or (isinstance(value, numbers.Real) and value in (0, 1))


def true_or_false(name: str, value) -> bool:
    """`value` (True or False: a bool, numpy's, or a number equal to 0 or 1) as a bool; UserError naming `name`
    otherwise (a string, None, another number, a list), whose truth value would be taken silently: "False" is true,
    None false."""
    if is_true_or_false(value):
        return bool(value)
    raise UserError(f"{name} is True or False, got {value!r}"[:200] + ".")


def no_such_keyword(function: str, key: str, taken: Sequence[str] | Callable, name_all: bool = False) -> UserError:
    """The UserError for a keyword `key` that `function` ("learn", "auto_accelerate") does not take, one of those
    its `**keywords` caught (Python's own TypeError names neither the way nor the options): the close names among
    `taken`, its parameters (or the keyword-only ones of the function `taken`: its options), as "did you mean";
    with `name_all`, every one of them too."""
    import difflib

    if callable(taken):
        taken = [name for name, parameter in inspect.signature(taken).parameters.items()
                 if parameter.kind is inspect.Parameter.KEYWORD_ONLY]
    close = difflib.get_close_matches(key, sorted(taken), n=2)
    options = f" (its options: {', '.join(taken)})" if name_all else ""
    return UserError(f"{function} takes no '{key}'{options}"
                     + (f"; did you mean {', '.join(close)}?" if close else "."))


def refuse_replay_saving(processes: int, option: str = "save_replay_buffer=True", under: str = "torchrun",
                         remedy: str = "drop it, or train in one process") -> None:
    """The rule for saving the replay buffer with checkpoints (`save_replay_buffer`, `--save-replay-buffer`): a run
    in one process only. UserError where `processes` (the run's process count) is above 1: each process fills a
    replay buffer of its own, which no one checkpoint file holds. `option` names the setting, `under` what started
    the processes and `remedy` what to do, as the caller words them."""
    if processes > 1:
        raise UserError(f"{option} applies to a run in one process: under {under} each process fills a replay "
                        f"buffer of its own, a checkpoint would hold process 0's alone and a resume restores none: "
                        f"{remedy}.")


def warn_at_caller(sentence: str, category: type[Warning]) -> None:
    """A warning shown at the first frame outside rlspeed (the user's line that led to it)."""
    frame, level = inspect.currentframe(), 1
    while frame is not None and frame.f_globals.get("__name__", "").partition(".")[0] == "rlspeed":
        frame, level = frame.f_back, level + 1
    warnings.warn(sentence, category, stacklevel=level)
