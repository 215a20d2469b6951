"""The `rlspeed` command: train (one run, or a population with --seeds), eval, export, profile, doctor, tune.

Errors the user can cause print one sentence and exit with code 2 (`--debug` shows the traceback).
"""

from __future__ import annotations

import argparse
import atexit
import codecs
import collections
import contextlib
import dataclasses
import difflib
import functools
import hashlib
import itertools
import json
import math
import os
import re
import secrets
import shlex
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import yaml

from rlspeed import yamlfile
from rlspeed._version import __version__
from rlspeed.env_options import as_keywords
from rlspeed.errors import (
    MAX_COUNT,
    Busy,
    CloseErrors,
    EnvStepError,
    OtherEnvOptionsWarning,
    PeerEnded,
    UserError,
    command_advice,
    infinite_advice,
    peer_algorithm_advice,
    refuse_replay_saving,
)
from rlspeed.files import (
    forget_ended_processes_folders,
    free_disk_bytes,
    local_path,
    process_folder_prefix,
    refuse_special_file,
    refuse_symlinks,
    remove_stale_temporaries,
    size_text,
    unwritable,
)
from rlspeed.files import write_text_atomic as _write_text
from rlspeed.lifetime import (
    LAUNCHER_PID_VARIABLE,
    STOPS,
    adopting_orphans,
    end_with_parent,
    first_to_say,
    handlers_set,
    peers_said,
    stop_ending_with_parent,
    stops_held,
    tell_launcher,
    wait_for_adopted,
)
from rlspeed.logging import cut_short as _cut_short
from rlspeed.logging import format_return as _score
from rlspeed.logging import print_beside_bars as _print_beside_bars
from rlspeed.logging import strict_json
from rlspeed.logging import whole_iterations as _whole_iterations

# Seeds go to torch, numpy and Gymnasium: numpy and Gymnasium refuse negative ones.
MAX_SEED = 2**32 - 1

#: episodes of each evaluation of a run, during training and the final one, without --eval-episodes (`learn`'s
#: eval_episodes default, and rlspeed eval's --episodes)
EVAL_EPISODES = 10

# What a run directory holds (`rlspeed train` writes these); a directory with any of them holds a run.
RUN_FILES = ("config.yaml", "summary.json", "metrics.csv", "model.safetensors", "checkpoint.safetensors",
             "model.replay.safetensors", "checkpoint.replay.safetensors",
             # (a replay file written before its checkpoint, moved into place after it: `checkpoint.staged_path`)
             "model.replay.next.safetensors", "checkpoint.replay.next.safetensors",
             "learning_curve.png", "learning_curves.png",
             "tensorboard", "videos", "wandb",
             "members")  # (`rlspeed.checkpoint.MEMBERS_DIR`: a population's member models)


class Terminated(KeyboardInterrupt):
    """SIGTERM (or another of `STOP_SIGNALS`) during training, raised like Ctrl-C's KeyboardInterrupt so that the same
    path saves the run; its argument names the signal."""

    @property
    def name(self) -> str:
        return str(self.args[0]) if self.args else "SIGTERM"


#: signals that stop a run as SIGTERM does (saved, exit code 143): `lifetime.STOPS` but Ctrl-C's, a scheduler's
#: (SIGTERM; SLURM's --signal sends SIGUSR1 or SIGUSR2 ahead of its deadline) and a closed terminal's (SIGHUP)
STOP_SIGNALS = tuple(signum for signum in STOPS if signum != signal.SIGINT)


def _signal_name(signum: int) -> str:
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


def _stop_of(signum: int) -> KeyboardInterrupt:
    """What the stop `signum` raises in a command: KeyboardInterrupt for Ctrl-C, `Terminated` for the others."""
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated(_signal_name(signum))


def _stop_said(stop: KeyboardInterrupt) -> tuple[int, str]:
    """The exit code and the name a command gives the stop `stop` raised (`_stop_of`'s): 143 and the signal's name
    for `Terminated`, 130 and "Ctrl-C" for Ctrl-C."""
    return (143, stop.name) if isinstance(stop, Terminated) else (130, "Ctrl-C")


def _quiet_closed_terminal(signum: int) -> None:
    """After SIGHUP the terminal may be gone, and every write to it fails (EIO): the run must still save. Standard
    output and error that cannot be written go to /dev/null from here on (a terminal still open, files and pipes
    stay)."""
    if signum != getattr(signal, "SIGHUP", None):
        return
    for fd in (1, 2):
        try:
            os.write(fd, b"")
            gone = False
        except OSError:
            gone = True
        if gone:
            try:
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, fd)
                os.close(null)
            except OSError:
                pass


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parsers of `parser`'s commands by name (none where it has no commands)."""
    return next((action.choices for action in parser._actions if isinstance(action, argparse._SubParsersAction)), {})


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are UserErrors: one sentence, exit code 2 (see `main`)."""

    def error(self, message: str):
        # argparse's "argument command: invalid choice: 'trian' (choose from ...)": the closest choice named first (its
        # choices quoted, or bare as Python 3.12.8 and later releases give them: "choose from train, tune")
        choice = re.match(r"^argument ([^:]+): invalid choice: '(.*)' \(choose from (.*)\)$", message)
        if choice:
            name, given, choices = choice.groups()
            names = re.findall(r"'([^']*)'", choices) or choices.split(", ")
            close = difflib.get_close_matches(given, names, n=1, cutoff=0.6)
            hint = f"did you mean '{close[0]}'? " if close else ""
            what = "command" if name == "command" else name
            message = f"unknown {what} '{given}': {hint}choose from {', '.join(repr(each) for each in names)}"
        # `rlspeed` alone: "the following arguments are required: command" names argparse's dest, not the commands
        commands = _commands(self)
        if commands and message == "the following arguments are required: command":
            *first, last = commands
            message = f"a command is required: {', '.join(first)} or {last}"
        # "argument --steps: must be positive" reads better as "--steps must be positive"
        message = re.sub(r"^argument ([^:]+): ", r"\1 ", message)
        raise UserError(f"{message} (see '{self.prog} --help').")


def _eval_episodes(args: argparse.Namespace) -> int:
    """Episodes of each of a run's evaluations, during training and the final one: `--eval-episodes` (on `--resume`,
    the run's config.yaml's where the flag is not given: `_resume_settings`), else `EVAL_EPISODES`."""
    return getattr(args, "eval_episodes", None) or EVAL_EPISODES


def _episodes(number: int) -> str:
    """'1 episode', '10 episodes'."""
    return f"{number} episode{'' if number == 1 else 's'}"


def _shell_path(path) -> str:
    """`path` as a command this CLI prints names it, quoted for a shell: one with a space (or a quote) pastes as one
    argument."""
    return shlex.quote(os.fspath(path))


def _eval_command(path, seed: int, episodes: int) -> str:
    """The `rlspeed eval` command that repeats a final evaluation of `episodes` episodes from `seed` (`--episodes`
    only where it is not rlspeed eval's default) of the model or run directory at `path`, quoted for a shell (a
    path with a space pastes as one argument)."""
    return (f"rlspeed eval {_shell_path(path)} --seed {seed}"
            + (f" --episodes {episodes}" if episodes != EVAL_EPISODES else ""))


def _whole(minimum: int, maximum: int | None = MAX_COUNT):
    """An argparse type: a whole number from `minimum` to `maximum` (None: no bound), also written 1e5 or 100_000."""

    def parse(text: str) -> int:
        try:
            number = float(text)
            if not number.is_integer():
                raise ValueError
            value = int(text) if text.strip().lstrip("+-").isdigit() else int(number)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"must be a whole number, got '{text}'") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {'positive' if minimum == 1 else f'>= {minimum}'}, "
                                             f"got {value}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum:,}, got '{text}'")
        return value

    parse.__name__ = "whole number"
    return parse


def _seed(text: str, limit: int = MAX_SEED) -> int:
    """An argparse type: a seed from 0 to `limit` (MAX_SEED)."""
    value = _whole(0, None)(text)
    if value > limit:
        raise argparse.ArgumentTypeError(f"must be at most {limit}, got {value}")
    return value


def _evaluation_seed(text: str) -> int:
    """An argparse type: an evaluation's seed, below 2**63 as `rlspeed.evaluate` takes it (a run's final evaluation
    may use a seed past MAX_SEED, and a user's own may too)."""
    return _seed(text, 2**63 - 1)


def _given(what: str):
    """An argparse type: text as given, refused where it is empty or blanks, as an unset shell variable gives it (an
    empty path was read as '.', an empty name or device as the option left out: both without a word)."""

    def parse(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"is empty (an unset variable?): give {what}, or leave the option out")
        return text

    parse.__name__ = what
    return parse


def _target_text(text: str) -> str:
    """An argparse type: a finite number or none/off/null, kept as text (`_target` reads it)."""
    try:
        _target(text, None)
    except UserError:
        raise argparse.ArgumentTypeError(f"must be a number or 'none', got '{text}'") from None
    return text


def _finite_values(key: str, value, flag: str = "--set") -> None:
    """UserError for NaN or infinity anywhere in a `--set` value (YAML's .nan/.inf, or unquoted inf, nan or 1e999,
    which `yamlfile.read_value` reads as floats), also inside its lists and dicts, naming where (`net_arch.pi[1]`)."""
    found = _nonfinite_at(value, key)
    if found is not None:
        where = f" ({found[0]} is {found[1]})" if found[0] != key else ""
        raise UserError(f"{flag} {key}={value}: values must be finite numbers{where}{infinite_advice(key)}.")


def _nonfinite_at(value, path: str, within: tuple = ()) -> tuple[str, float] | None:
    """(path, value) of the first NaN or infinity in `value` and the lists, tuples and dicts in it (`path`: how to name
    `value`, `name.key[index]` below it), else None. `within`: the lists and dicts that hold `value` (a YAML alias can
    make a list hold itself)."""
    if isinstance(value, (list, tuple, dict)):
        if any(value is outer for outer in within):
            return None
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for index, item in items:
            found = _nonfinite_at(item, f"{path}.{index}" if isinstance(value, dict) else f"{path}[{index}]",
                                  (*within, value))
            if found is not None:
                return found
        return None
    return (path, value) if isinstance(value, float) and not math.isfinite(value) else None


def _parse_set(pairs: list[str], flag: str = "--set") -> dict:
    """`key=value` pairs, values read as YAML scalars/lists (`lr=1e-3`, `net_arch=[64,64]`, `x=null`)."""
    out, written = {}, {}
    for pair in pairs:
        if "=" not in pair:
            key, colon, value = pair.partition(":")
            # (RL-Zoo's --env-kwargs and --hyperparams write key:value)
            zoo = f" (RL-Zoo's key:value is {flag} {key.strip()}={value.strip()} here)" if colon and key.strip() else ""
            raise UserError(f"{flag} expects key=value, got '{pair}'{zoo}.")
        key, value = pair.split("=", 1)
        key = key.strip()
        if not key:
            raise UserError(f"{flag} expects key=value, got '{pair}' (no key).")
        if key in written and written[key] != value.strip():  # (the text: a YAML alias may make a value recursive)
            raise UserError(f"{flag} gives {key} twice ({written[key]} and {value.strip()}): give it once.")
        written[key] = value.strip()
        if not value.strip():  # (YAML reads nothing as null: a forgotten value would be taken as None)
            raise UserError(f"{flag} {key}= is empty: give a value ({key}=VALUE), or leave {key} out for its "
                            "default.")
        try:
            out[key] = yamlfile.read_value(value, f"{flag} {key}={value.strip()}")
        except (yamlfile.InvalidYAML, ValueError, OverflowError):
            encoding, unread = sys.getfilesystemencoding(), ""
            if re.search("[\udc80-\udcff]", value):  # (os.fsdecode's surrogates: bytes the encoding cannot read)
                unread = (" (its bytes are not UTF-8 text)" if encoding == "utf-8" else
                          f" (its bytes are no text in the locale's encoding, {encoding}: run under a UTF-8 locale, "
                          "such as LC_ALL=C.UTF-8, or with PYTHONUTF8=1)")
            raise UserError(f"{flag} {key}: cannot read value '{value}'{unread}.") from None
        if re.search(r"(?:^|\s)#", value) and "#" not in repr(out[key]):  # (YAML read " #..." as a comment)
            raise UserError(f"{flag} {key}={value.strip()}: YAML reads ' #' and what follows as a comment, which "
                            f"would be dropped; quote a text ({key}='\"{value.strip()}\"') or leave the comment out.")
        _finite_values(key, out[key], flag)
    return out


#: What `--env-backend` takes, in train, eval and the commands that make a model (`rlspeed.envs.BACKENDS`, which this
#: module names without importing torch)
ENV_BACKENDS = ["auto", "torch", "gymnasium", "gymnasium-async", "envpool"]


# Constructor arguments, and config.yaml's settings, that have a flag of their own: `--set` cannot give them (they
# would arrive twice); config.yaml's names are those a user copies from a run's file (`threads`, `env_id`)
_FLAG_KEYS = {"seed": "--seed", "device": "--device", "num_threads": "--threads", "env_backend": "--env-backend",
              "accelerate": "--accelerate", "env": "the ENV_ID argument", "strategy": "--nproc (or torchrun)",
              "env_kwargs": "--env-kwargs KEY=VALUE", "nan_policy": "--nan-policy",
              "checkpoint_freq": "--checkpoint-freq", "save_replay_buffer": "--save-replay-buffer",
              "progress_bar": "--no-progress", "eval_episodes": "--eval-episodes N",
              "verbose": "--quiet (verbose=0; --no-progress: no bar alone)",
              "algo": "the ALGO argument", "env_id": "the ENV_ID argument", "threads": "--threads",
              "processes": "--nproc (or torchrun)", "video_every": "--video-every N",
              "gym_packages": "--gym-packages MODULE", "init_from": "--init-from MODEL|RUN_DIR", "preset": "--preset"}


#: the option of each command with --set that gives the length RL-Zoo names n_timesteps (in its files and its
#: --n-timesteps flag, which with --optimize is each trial's budget)
_LENGTH_OPTIONS = {"train": "--total-timesteps N (or --set total_timesteps=N)", "tune": "--budget N",
                   "profile": "--steps N"}


def _check_set_keys(overrides: dict, command: str = "train") -> None:
    for key in overrides:
        if key in _FLAG_KEYS:
            # (`_FLAG_KEYS` names rlspeed train's flags: a command without the flag says so, not "use --quiet")
            flag = re.match(r"--[\w-]+", _FLAG_KEYS[key])
            if command != "train" and flag and not any(flag[0] in action.option_strings
                                                       for action in _commands(build_parser())[command]._actions):
                raise UserError(f"--set {key}=... is not a hyperparameter, and rlspeed {command} has no option for "
                                f"it (rlspeed train's is {flag[0]}).")
            raise UserError(f"--set {key}=... is not a hyperparameter: use {_FLAG_KEYS[key]}.")
        if key == "n_timesteps":
            raise UserError(f"--set n_timesteps=... is RL-Zoo's name for the run's length: use "
                            f"{_LENGTH_OPTIONS.get(command, _LENGTH_OPTIONS['train'])}.")


def _target(arg: str | None, spec, name: str = "--target-return") -> float | None:
    """A target return as given (`name`: the flag or setting, for the error): a finite number, or none/off/null for
    no target; None given means the env's reward_threshold."""
    if arg is None:
        return spec.reward_threshold
    if arg.strip().lower() in ("none", "off", "null"):
        return None
    try:
        value = float(arg)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise UserError(f"{name} must be a number or 'none', got '{arg}'.")
    return value


#: where `--target-return` comes from when not given (train's and tune's help: `_target_and_eval_freq`'s rule)
_TARGET_DEFAULT = ("the preset's target_return, else the env's reward_threshold, which env options that change its "
                   "task leave out")

#: a run's budget where neither `--total-timesteps` nor the preset gives one
_DEFAULT_TOTAL_TIMESTEPS = 1_000_000


def _total_timesteps(run_settings: dict, flag: int | None = None) -> int:
    """A run's budget: `--total-timesteps` (`flag`), else the preset's total_timesteps, else
    `_DEFAULT_TOTAL_TIMESTEPS`."""
    return flag or run_settings.get("total_timesteps") or _DEFAULT_TOTAL_TIMESTEPS


def _target_and_eval_freq(args: argparse.Namespace, run_settings: dict, spec) -> tuple[float | None, int | None]:
    """A run's target return and evaluation frequency: each flag, else the preset's run setting, else the env's
    reward_threshold (`spec`'s: none for a variant made with env options, unless they make another registered id)
    and None (the algorithm's own frequency). A note on that target goes in `args.target_notes`, which
    `_say_preset` says after the preset's line."""
    from rlspeed.envs.base import same_task

    args.target_notes = []
    if args.target_return is not None:
        target = _target(args.target_return, spec)
    else:
        target = run_settings.get("target_return", spec.reward_threshold)
        # (a threshold `spec` keeps with options is that of the registered id they make, as is `env_variant`'s preset,
        # or the id's own where they keep its task: `same_task`)
        if (run_settings.get("target_return") is not None and not getattr(args, "env_variant", None)
                and (getattr(args, "env_kwargs", None) or getattr(args, "resume_env_kwargs", None))
                and not same_task(spec.env_id, getattr(spec, "env_kwargs", None))):
            args.target_notes = [f"rlspeed: note: the target {target:g} is the preset's for {args.env_id} as "
                                 "registered; with env options it may not fit: give --target-return R (or none)"]
        elif target is None and "target_return" not in run_settings and getattr(spec, "env_kwargs", None):
            args.target_notes = _dropped_threshold_notes(args.env_id, spec.env_kwargs,
                                                         getattr(args, "command", None) == "tune")
    eval_freq = args.eval_freq if args.eval_freq is not None else run_settings.get("eval_freq")
    return target, eval_freq


def _dropped_threshold_notes(env_id: str, env_kwargs: dict, tune: bool = False) -> list[str]:
    """The note where the env options leave a run without the target the env id registers (`EnvSpec.with_options`:
    its reward threshold says nothing of another task), so that no target is not taken for one ([] where the id
    registers none); for `tune` the target is the objective's, not where training stops."""
    import gymnasium as gym

    registered = getattr(gym.registry.get(env_id), "reward_threshold", None)
    if registered is None:
        return []
    return [f"rlspeed: note: no target: {registered:g} is {env_id}'s reward threshold without the env options "
            f"{as_keywords(env_kwargs)}, which make another task: " + (
                "trials score their final evaluation; give --target-return R to score the steps to reach it" if tune
                else "give --target-return R to stop at one")]


def _algorithm(name: str):
    from rlspeed.algos import ALGORITHMS

    key = name.lower()
    module, _, own = name.rpartition(":") if ":" in name else name.rpartition(".")
    peer = peer_algorithm_advice(own) if module else None  # (`sb3_contrib:MaskablePPO`: another library's class)
    if key not in ALGORITHMS and peer is not None:
        raise UserError(f"Unknown algorithm '{name}': {peer}.")
    if key not in ALGORITHMS and own.lower() in ALGORITHMS and module.split(".")[0] in ("rlspeed", "stable_baselines3"):
        raise UserError(f"Unknown algorithm '{name}': the command line names the algorithm alone: use {own.lower()}.")
    # (`module:MyPPO`, `module.MyPPO`: a class; not a file name, `ppo.yaml`)
    if key not in ALGORITHMS and module and own.isidentifier() and (":" in name or own[:1].isupper()):
        raise UserError(f"'{name}' names a Python class: the command line trains rlspeed's algorithms by name "
                        f"({', '.join(ALGORITHMS)}); a subclass of one trains from Python "
                        f"({own}(env_id, ...).learn(...), .save(...)), and rlspeed eval and rlspeed export take its "
                        f"file with --gym-packages {module} (docs/algorithms.md).")
    if key not in ALGORITHMS:
        advice = peer_algorithm_advice(key)
        if advice is not None:
            raise UserError(f"Unknown algorithm '{name}': {advice}.")
        close = difflib.get_close_matches(key, list(ALGORITHMS), n=2)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise UserError(f"Unknown algorithm '{name}': available are {', '.join(ALGORITHMS)}.{hint}")
    return ALGORITHMS[key]


def _import_env_modules(args: argparse.Namespace, env_attr: str) -> None:
    """Import `--gym-packages` and the module of a `module:EnvId` id (which register their envs); the id keeps
    only `EnvId`, and the modules are recorded in `args.gym_packages` (config.yaml keeps them for `rlspeed eval`)."""
    from rlspeed.envs import import_gym_packages

    packages = list(getattr(args, "gym_packages", None) or [])
    import_gym_packages(packages)
    env_id = getattr(args, env_attr)
    if env_id is not None and ":" in env_id:
        module, env_id = env_id.split(":", 1)
        import_gym_packages([module], why=f"(named in '{module}:{env_id}')")
        packages.append(module)
        setattr(args, env_attr, env_id)
    args.gym_packages = list(dict.fromkeys(packages))


#: what the command is doing before its work (training, tuning) begins, and what a stop there leaves, for the line
#: Ctrl-C or SIGTERM prints where it ends the command there (`_main`); empty once the work's own handling of a stop
#: takes over, or for a command that sets none (`_stage`)
_STAGE: dict[str, str] = {}
#: the stops this command's run took in to stop at the end of its iteration (`_stop_after_iteration`), or said in its
#: line (`_run_said_its_stop`: another rank's, one held as it ended): a later one that ends a torchrun worker is
#: torchrun's own signal as it shuts the workers down, of a run whose stop is said already
_TAKEN_IN: list[int] = []
#: whether this command's run has returned, its lines said and its files written, and the torchrun worker leaves
#: (`DistributedStrategy.leave`, where the ranks wait for rank 0's save and evaluation): a stop then is torchrun's
#: passing on of one whose line rank 0 says, as for `_TAKEN_IN`
_RUN_RETURNED: list[bool] = []
#: while one of these returns True, the first stop `_stop_after_iteration` takes in gets no line of its own: the run's
#: training is over and the stop cuts short what follows inside `learn` (a population's final evaluation), whose
#: "interrupted ... after training finished" line says it, as a solo run's one line does
_TRAINING_OVER: list[Callable[[], bool]] = []


def _stage(doing: str | None, left: str | None = None, run_dir: Path | None = None) -> None:
    """Record what the command is doing (`doing`, "building the envs and the model") and what a stop now leaves
    (`left`; by default that training had not begun, and with `run_dir`, the run directory made or chosen, that it is
    left as it was), for the line a Ctrl-C or SIGTERM that ends the command prints; None: the work has begun and says
    itself what a stop left."""
    _STAGE.clear()
    if doing is not None:
        _STAGE["said"] = f"while {doing}" + (f": {left}" if left is not None else ", before training began: nothing "
                                             + (f"was trained, and '{run_dir}' holds what it held before"
                                                if run_dir is not None else "was trained or written"))


def _signals_stop_cleanly(command):
    """`command` with SIGTERM (and the other `STOP_SIGNALS`) raising `Terminated` wherever no narrower block decides
    (training's `_stopping`, `_learn_and_save`'s block holding them): a signal while the run starts (its directory made,
    a replaced run moved aside, a tracker starting) ends as Ctrl-C does there, the run directory left as before."""

    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        with _sigterm_raises():
            return command(args)

    return run


def _confirmations_cut_short(members: list[dict], episodes: int) -> str:
    """How many of a population's confirming evaluations' episodes were cut short at the step limit, as `cut_short`
    says it ("" where none), of the confirmations whose count is known: an older checkpoint's are not (None in
    `confirmations_unfinished`), and count in neither total. Each confirmation counts the episodes it ran
    (`confirmations_episodes`: a resume may change --eval-episodes), `episodes` where a checkpoint did not record
    them."""
    cuts, total = 0, 0
    for member in members:
        ran = member.get("confirmations_episodes") or []
        for index, cut in enumerate(member.get("confirmations_unfinished", [])):
            if isinstance(cut, int) and cut >= 0:
                known = ran[index] if index < len(ran) else None
                cuts, total = cuts + cut, total + (known if isinstance(known, int) and known > 0 else episodes)
    return _cut_short(cuts, total)


@_signals_stop_cleanly
def cmd_train(args: argparse.Namespace) -> int:
    """`rlspeed train`: train ALGO on ENV_ID from its preset, `--set` overrides and flags; returns the exit code.

    Writes the run directory (config.yaml, metrics.csv, model.safetensors, summary.json, ...); under torchrun every rank
    trains and only rank 0 writes. With `--nproc N` it starts torchrun with N processes running this same command
    instead, and returns torchrun's exit code. Ctrl-C (SIGINT) or SIGTERM during training saves the model, a checkpoint
    and summary.json (`"interrupted": true`) and returns 130 or 143. With `--dry-run` it prints the config.yaml the
    run would write and returns 0, having trained and written nothing (what it says while building goes to stderr).
    """
    if args.dry_run and not hasattr(args, "dry_run_stdout"):
        _refuse_with_dry_run(args)
        args.dry_run_stdout = sys.stdout
        with contextlib.redirect_stdout(sys.stderr):
            return cmd_train(args)
    _stage("loading torch, the env's packages and the preset")
    _import_env_modules(args, "env_id")
    if args.out is not None:  # (one path for every file of the run: the checkpoints' writer expands "~" too)
        if not args.out.strip():
            raise UserError("--out is empty (an unset variable?): give the run directory, or leave --out out for a "
                            "new one under runs/.")
        try:
            args.out = str(Path(args.out).expanduser())
        except RuntimeError as error:  # ("~nosuchuser/x")
            raise UserError(f"--out '{args.out}': {str(error).rstrip('.')}.") from None
        try:
            args.out = str(_without_missing_steps_back(Path(args.out)))
            exists = Path(args.out).exists()
        except OSError as error:  # (a name longer than the filesystem takes, ...)
            raise UserError(f"--out '{args.out}': {error.strerror or error}.") from None
        if not exists and os.path.islink(args.out):
            raise UserError(f"--out '{args.out}' is a symlink to nothing (or a loop of them): remove it, or give "
                            "another directory.")
    # (flags that only act with another one: refused rather than ignored)
    for flag, given, needs in (("--max-restarts", bool(args.max_restarts) and args.nproc is None and args.seeds is None,
                                "--nproc N (torchrun restarts the group)"),
                               ("--wandb-project", args.wandb_project is not None and not args.track, "--track"),
                               ("--wandb-entity", args.wandb_entity is not None and not args.track, "--track")):
        if given:
            raise UserError(f"{flag} applies only with {needs}: add it, or drop {flag}.")
    if args.resume and args.out is None:
        # (the default directory is a new one on every command: a requeued job would start afresh each time, saying
        # only that there was no checkpoint yet)
        raise UserError("--resume continues the run in --out DIR: give --out (without it every command makes a new "
                        "directory under runs/, where there is nothing to resume).")
    if args.resume:
        _resume_settings(args)
    if args.video_every == 0:  # (no videos, also where the resumed run recorded some)
        args.video_every = None
    if args.save_replay_buffer:  # (refused before torchrun starts, with the library's rule)
        drop = ("resume with --no-save-replay-buffer (the run in --out saves its buffer)"
                if getattr(args, "save_replay_buffer_from_run", False)
                else "drop --save-replay-buffer")
        processes = max(args.nproc or 1, int(os.environ.get("WORLD_SIZE", "1")))
        refuse_replay_saving(processes, "--save-replay-buffer", "--nproc", f"{drop}, or train without --nproc")
    if args.seeds is None:
        _refuse_member_values_without_seeds(args)
        if args.nproc is not None:  # (the launcher writes no summary: each worker takes its own provenance)
            return _launch_torchrun(args)
    if not args.dry_run:
        from rlspeed.provenance import provenance

        args.provenance = provenance(getattr(args, "argv", None))  # (summary.json's; the command as it starts)
    if args.seeds is not None:
        return _train_population(args)
    from rlspeed.distributed import DistributedStrategy

    algo_cls, run_settings, hyper, _config = _settings(args)
    if args.save_replay_buffer and not hasattr(algo_cls, "replay_summary"):  # (off-policy algorithms keep a replay)
        raise UserError(f"--save-replay-buffer applies to off-policy algorithms (dqn, sac, td3, ddpg), not "
                        f"{algo_cls.name}: drop it.")
    total = _total_timesteps(run_settings, args.total_timesteps)
    if _under_torchrun():
        _stage("joining the other processes (torch.distributed)")
    strategy = DistributedStrategy(device=args.device)  # a no-op unless started by torchrun
    try:
        with _forked_children_apart("TORCHELASTIC_RUN_ID" in os.environ):
            code = _train(args, algo_cls, strategy, run_settings, hyper, total)
            _RUN_RETURNED.append(True)
            if strategy.enabled:  # (`leave` ends the process: `main` would not settle a run --overwrite moved aside)
                _settle_overwrites(succeeded=code == 0)
            # leave together (the other ranks wait while rank 0 saves and evaluates), see DistributedStrategy.leave
            return strategy.leave(code)
    finally:
        strategy.shutdown(wait=False)  # after an error; a no-op once the group is gone


def _children_kept_apart() -> bool:
    """Whether `_forked_children_apart` can keep env subprocesses out of their parent's process group here: they are
    forked (not spawned: macOS, Windows, forkserver) and the platform has the calls it needs."""
    import multiprocessing

    # (the start method set, else the platform's default, listed first; asking get_start_method() would fix it)
    method = multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]
    return hasattr(os, "register_at_fork") and hasattr(os, "setpgid") and method == "fork"


_CHILDREN_APART = False  # (read by `_leave_process_group` in each forked child)
_FORK_HOOK = []  # (registered once per process: os.register_at_fork has no undo)


def _leave_process_group() -> None:
    if _CHILDREN_APART:
        with contextlib.suppress(OSError):
            os.setpgid(0, 0)


@contextlib.contextmanager
def _forked_children_apart(apart: bool):
    """Within the block (where `apart`: a torchrun worker), processes forked from this one (subprocess envs) start a
    process group of their own. torchrun stops a worker by signalling its process group: the env processes would die
    of it mid-iteration, and the ranks, stopping wherever their envs failed, would wait for each other in different
    collectives until torchrun's deadline killed them. Apart, they live until the worker closes them at the end of its
    iteration (`_stopping`), or see their pipe close if it dies."""
    global _CHILDREN_APART
    if not apart or not _children_kept_apart():
        yield
        return
    if not _FORK_HOOK:
        os.register_at_fork(after_in_child=_leave_process_group)
        _FORK_HOOK.append(True)
    _CHILDREN_APART = True
    try:
        yield
    finally:
        _CHILDREN_APART = False


# --- `rlspeed train --seeds`: a population ---------------------------------------------------------------------
MAX_POPULATION = 1 << 20  # members one --seeds may give (a typo such as 0-4000000000 must not fill the memory)


def parse_seeds(text: str) -> list[int]:
    """`--seeds` text as a list of seeds: ranges LOW-HIGH (inclusive) and single seeds, comma-separated (`0-31`,
    `0,3,5`, `0-3,8`); UserError for an empty list or range, a seed given twice or one out of range."""
    if not text.strip():
        raise UserError("--seeds is empty: a population needs at least one member (e.g. --seeds 0-31).")
    seeds: list[int] = []
    for part in (piece.strip() for piece in text.split(",")):
        match = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+))?", part)
        if not part or match is None:
            raise UserError(f"--seeds {text}: '{part}' is not a seed or a LOW-HIGH range (write e.g. 0-31 or 0,3,5).")
        low = int(match[1])
        high = int(match[2]) if match[2] is not None else low
        if high < low:
            raise UserError(f"--seeds {text}: the range {part} is empty (write LOW-HIGH with LOW <= HIGH).")
        if high > MAX_SEED:
            raise UserError(f"--seeds {text}: seeds must be at most {MAX_SEED}.")
        if len(seeds) + high - low + 1 > MAX_POPULATION:
            raise UserError(f"--seeds {text}: a population holds at most {MAX_POPULATION:,} members.")
        seeds.extend(range(low, high + 1))
    counts = collections.Counter(seeds)
    repeated = sorted(seed for seed, count in counts.items() if count > 1)
    if repeated:
        raise UserError(f"--seeds {text}: seed(s) {', '.join(map(str, repeated[:5]))} given more than once; members "
                        "of a population need distinct seeds.")
    return seeds


def _top_level_split(text: str) -> list[str]:
    """`text` split at the commas outside brackets (`1e-3,2e-3` -> 2 parts, `[64,64]` -> 1 part)."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char in "[{(":
            depth += 1
        elif char in "]})":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    parts.append(text[start:])
    return parts


def _several_values(pair: str, member_keys: tuple[str, ...]) -> list | None:
    """The values of a `--set key=a,b,c` (split at top-level commas) or, for a key that may differ across members
    (all of them scalars), `key=[a, b, c]` (as the Python API's list): None where it gives one value."""
    key, equals, value = pair.partition("=")
    key = key.strip()
    if not equals:
        return None
    parts = _top_level_split(value)
    if len(parts) > 1 and not all(part.strip() for part in parts):  # (`lr=1e-3,`: not an empty value for the key)
        raise UserError(f"--set {pair.strip()} has an empty value between or after its commas: give one value, or "
                        f"one per member of a population ({key}=a,b with --seeds).")
    if len(parts) > 1:
        return [_parse_set([f"{key}={part.strip()}"])[key] for part in parts]
    if key in member_keys and value.strip().startswith("["):
        listed = _parse_set([pair])[key]
        if isinstance(listed, list):
            return listed
    return None


def _member_sets(args: argparse.Namespace, member_keys: tuple[str, ...]) -> dict[str, list]:
    """The per-member `--set key=a,b,c` (or `key=[a, b, c]`) values, one per member, taken out of `args.set` (which
    keeps the values for all members)."""
    per_member, shared = {}, []
    for pair in args.set or []:
        values = _several_values(pair, member_keys)
        if values is not None:
            per_member[pair.partition("=")[0].strip()] = values
        else:
            shared.append(pair)
    args.set = shared
    return per_member


def _refuse_member_values_without_seeds(args: argparse.Namespace) -> None:
    """A solo run's `--set learning_rate=1e-3,2e-3` (one value per member of a population): one sentence saying
    so, not that the list is no float."""
    from rlspeed.population import IMPLEMENTATIONS

    implementation = IMPLEMENTATIONS.get(_algorithm(args.algo).__name__)
    member_keys = tuple(implementation.per_member) if implementation is not None else ()
    for pair in args.set or []:
        key = pair.partition("=")[0].strip()
        values = _several_values(pair, member_keys) if key in member_keys else None
        if values is not None and len(values) == 1:  # (a list of one: the form of per-member values, for one member)
            raise UserError(f"--set {pair.strip()} gives a list of one value, the form of one value per member of a "
                            f"population: give {key}={pair.partition('=')[2].strip().strip('[]').strip()} without "
                            "brackets for this run.")
        if values is not None:
            raise UserError(f"--set {pair.strip()} gives {len(values)} values, one per member of a population: add "
                            f"--seeds with {len(values)} seeds (e.g. --seeds 0-{len(values) - 1}) to train them "
                            f"together, or give {key} one value.")


def _train_population(args: argparse.Namespace) -> int:
    """`rlspeed train ALGO ENV --seeds ...`: train the seeds as one population (`rlspeed.population`) and write the
    run directory: config.yaml, summary.json (per-member entries and aggregates) and learning_curves.png."""
    from rlspeed.algos.base import build_config
    from rlspeed.tune import per_member_keys

    _one_process_only("train --seeds", "a population trains all its members in one process; under torchrun every "
                      "process would train it into the same run directory")
    seeds = parse_seeds(args.seeds)
    say = _say_for(args)  # (its lines of what it is doing: none with --quiet)
    refused = [flag for flag, given in (("--nproc", args.nproc is not None),
                                        ("--video-every", args.video_every is not None), ("--track", args.track),
                                        ("--accelerate auto", args.accelerate != "off"),
                                        ("--nan-policy mask", args.nan_policy != "raise"),
                                        ("--max-restarts", bool(args.max_restarts)),
                                        ("--init-from", args.init_from is not None))
               if given]
    if any(item == "--seed" or item.startswith("--seed=") for item in getattr(args, "argv", [])):
        refused.insert(0, "--seed")
    if refused:
        # (videos: each member is a model of its own after training, which `rlspeed eval --video` films)
        film = (" (film a member after training: rlspeed eval OUT/members/seed_<S>.safetensors --video FILE.mp4)"
                if refused[0] == "--video-every" else "")
        raise UserError(f"{refused[0]} does not apply to a population (--seeds): drop it{film}.")
    algo_cls = _algorithm(args.algo)
    member_keys = per_member_keys(algo_cls)  # UserError when the algorithm has no population
    per_member = _member_sets(args, member_keys)
    args.member_keys = tuple(per_member)  # (for `_settings`' note on the preset values kept)
    resumed = getattr(args, "resume_hyperparameters", None)
    if isinstance(resumed, dict):  # (`--resume`: the run's per-member values, unless --set gives the key anew)
        given = set(per_member) | {pair.partition("=")[0].strip() for pair in args.set or []}
        args.resume_hyperparameters = {key: value for key, value in resumed.items()
                                       if not (key in member_keys and isinstance(value, list))}
        per_member.update({key: value for key, value in resumed.items() if key in member_keys
                           and isinstance(value, list) and len(value) == len(seeds) and key not in given})
    algo_cls, run_settings, hyper, _config = _settings(args)
    for key, values in per_member.items():
        _check_set_keys({key: None})
        build_config(algo_cls.config_cls, {**hyper, key: values[0]})  # (an unknown name is named as such first)
        if key not in member_keys:
            raise UserError(f"--set {key}: {key} cannot differ across the members of a population (it changes shapes "
                            f"or the training loop): give one value; per-member values are allowed for "
                            f"{', '.join(member_keys)}.")
        if len(values) != len(seeds):
            raise UserError(f"--set {key} gives {len(values)} per-member values but --seeds gives {len(seeds)} "
                            "members: give one value per member, or one for all.")
        for seed, value in zip(seeds, values):
            try:
                build_config(algo_cls.config_cls, {**hyper, key: value})
            except UserError as error:
                raise UserError(f"--set {key}, the value for seed {seed}: {error}") from None
    from rlspeed.device import resolve_device
    from rlspeed.envs import env_spec
    from rlspeed.population import IMPLEMENTATIONS, Population
    from rlspeed.population.base import CHECKPOINT_NAME, SEEDS_OPTION, planned_timesteps
    from rlspeed.population.offpolicy import OffPolicyPopulation
    from rlspeed.population.plot import plot_learning_curves

    total = _total_timesteps(run_settings, args.total_timesteps)
    target, eval_freq = _target_and_eval_freq(args, run_settings, env_spec(args.env_id, _env_kwargs(args)))
    device = resolve_device(args.device)
    # built before the run directory: a population that cannot train must not replace or leave behind a run
    options = {"env_backend": args.env_backend} if args.env_backend not in (None, "auto") else {}
    if args.save_replay_buffer:
        off_policy = [name for name, cls in IMPLEMENTATIONS.items() if issubclass(cls, OffPolicyPopulation)]
        if algo_cls.__name__ not in off_policy:
            raise UserError(f"--save-replay-buffer applies to off-policy populations ({', '.join(off_policy)}), not "
                            f"{algo_cls.__name__}: drop it.")
        options["save_replay_buffer"] = True
    env_kwargs = _env_kwargs(args)
    if env_kwargs:
        options["env_kwargs"] = env_kwargs
    _configure_threads(args)
    from rlspeed.checkpoint import encryption_settings

    # (a bad key, cipher or digest setting is refused now, not at the first checkpoint)
    args.encryption = encryption_settings()
    _stage("building the population's envs and models")
    # (the estimate after the first member counts the replay buffers for the budget; a long build shows a bar)
    with planned_timesteps(total, progress_bar=not args.no_progress, option=SEEDS_OPTION):
        population = Population(algo_cls, args.env_id, seeds=seeds, device=device, **options, **{**hyper, **per_member})
    population.check_fits(total)  # (a replay buffer is allocated when training starts, after the run directory)
    # a crash or a kill loses at most this many steps per member (by default 1/20 of the budget)
    checkpoint_freq = args.checkpoint_freq or max(total // 20, 1)
    config = {"algo": algo_cls.name, "env_id": args.env_id, "seeds": seeds, "device": str(device),
              "env_backend": population.env_backend, "total_timesteps": total,
              "target_return": target, "eval_freq": eval_freq, "eval_episodes": _eval_episodes(args),
              # (the interval asked for, which --resume keeps; None: 1/20 of the budget and one every
              # CHECKPOINT_INTERVAL_S, as a solo run's config says)
              "checkpoint_freq": args.checkpoint_freq,
              "save_replay_buffer": bool(args.save_replay_buffer), "gym_packages": args.gym_packages,
              "preset": args.preset_info, "env_kwargs": env_kwargs or None,
              # (a CPU's results depend on the thread count, as a solo run's: --resume keeps the run's)
              "threads": _torch_threads(), "hyperparameters": {**_plain(_config), **per_member}}
    if args.dry_run:
        with contextlib.closing(population):
            return _print_dry_run(args, config)
    created, parents = _made_here(args.out)
    run_dir = _prepare_run_dir(args, algo_cls.name, checked_before=False, seeds=seeds)
    _stage("starting the run", run_dir=run_dir)
    checkpoint = run_dir / CHECKPOINT_NAME
    resumed_from = None
    finishing = False  # (a checkpoint of the whole budget, of a run that did not finish: evaluated, not trained)
    if args.resume:
        if _same_population_run(run_dir, algo_cls.name, args.env_id, seeds, total, target):
            population.close()
            print("rlspeed: nothing left to train: the population run finished (its summary.json); --overwrite "
                  "trains it again", flush=True)
            _say_unapplied_settings(run_dir / "config.yaml", population, args, {**_plain(_config), **per_member},
                                    {"total_timesteps": total, "target_return": target})
            return 0
        if checkpoint.exists():
            _stage("loading the checkpoint", run_dir=run_dir)
            _fits(lambda: population.resume(checkpoint), checkpoint, "this population")
            _stage("starting the run", run_dir=run_dir)
            resumed_from = population.num_timesteps
            _refuse_budget_below_trained(run_dir, total, resumed_from, f"steps per member '{checkpoint}' has "
                                         "trained", "its final evaluation and member models")
            finishing = resumed_from >= total  # (a finished run was refused: `_prepare_run_dir`)
        else:
            say(f"rlspeed: --resume: no {checkpoint} yet, so training starts from scratch", flush=True)
    if resumed_from is not None:
        _say_changed_settings(run_dir / "config.yaml", config, resumed_from)
    _write_config(run_dir, config)
    _say_preset(args, say)
    if finishing:
        say(f"rlspeed: the checkpoint holds the whole budget ({resumed_from:,} steps per member): nothing left to "
            "train; evaluating the members and saving them", flush=True)
    else:
        say(f"rlspeed: training {len(seeds)} {algo_cls.__name__} members on {args.env_id} as one population "
            f"(device {device}), up to {total:,} steps each{_whole_iterations(total, population.steps_per_iteration)}"
            + (f", each stopping at eval return >= {target:g}" if target is not None else ""), flush=True)
    _warn_idle_accelerator(args, device)
    learn_kwargs = {"target_return": target, "eval_episodes": _eval_episodes(args)}
    if eval_freq is not None:
        learn_kwargs["eval_freq"] = eval_freq
    learn_kwargs.update(run_dir=run_dir, checkpoint_freq=checkpoint_freq,  # (and every minute: as a solo run's)
                        checkpoint_interval_s=CHECKPOINT_INTERVAL_S if args.checkpoint_freq is None else None)
    curves: dict[int, list] = {k: [] for k in range(len(seeds))}
    if resumed_from is not None:
        say(f"rlspeed: resumed from {checkpoint} at {resumed_from:,} steps per member", flush=True)
        for k, curve in enumerate((population.progress or {}).get("curves", [])):
            curves[k] = [list(point) for point in curve]
    started = time.perf_counter()

    def progress(steps: int, means: dict[int, float]) -> list[int]:
        """One line per evaluation (members still training), and each member's curve kept for an interruption."""
        for member, mean in means.items():
            curves[member].append([steps, mean])
        values = sorted(means.values())
        # (the warning of episodes cut at the step limit shows once: each line says it of its evaluation)
        cut = _cut_short(sum(population.last_unfinished or []), len(means) * _eval_episodes(args))
        say(f"rlspeed: {steps:,} steps per member, {len(means)} of {len(seeds)} members evaluated{cut}: median "
            f"{_score(statistics.median(values))}, range {_score(values[0])} to {_score(values[-1])} "
            f"({time.perf_counter() - started:.0f} s)", flush=True)
        return []

    if resumed_from is None:
        _forget_unsaved_attempt(run_dir)
    # From here to the end a stop waits (`held`) wherever no narrower block sets its handlers: once the training's
    # own handling of stops ends, the summary and the member models are written whole (as a single run's,
    # `_learn_and_save`); the plot of an interrupted run's evaluations is what a stop cuts short.
    owner = os.getpid()
    with stops_held(lambda signum: _signal_arrived(owner, signum)) as held:
        _stage(None)  # (the training's own handling of a stop says what it saved)
        signals: list[int] = []  # (bound before the block: a signal may come while it is entered)
        try:  # (a stop in the final evaluation, which learn runs, is said by the run's end alone)
            with (_training_over_when(lambda: population._evaluation_stop is not None),
                  _stopping(population.env_backend) as signals,
                  _left_clean_if_not_started(run_dir, created, not args.resume, parents)):
                if held:  # (one that came as the training's handlers were set: it stops the run as one before them)
                    raise _stop_of(held.pop(0))
                summary = (population.finish_resumed(target, _eval_episodes(args)) if finishing else
                           population.learn(total - (resumed_from or 0), on_eval=progress,  # (a line per evaluation)
                                            stop_requested=lambda: bool(signals), progress_bar=False, **learn_kwargs))
        except Exception as error:  # (as a single run's: summary.json says the run ended by an error, and which)
            if not _no_rows(run_dir / "metrics.csv") or checkpoint.exists():
                ended = {"algo": algo_cls.name, "env_id": args.env_id, "seeds": seeds,
                         "total_timesteps": population.num_timesteps, "preset": args.preset_info, "interrupted": False,
                         "stopped_by": "error", "error": _error_text(error), "provenance": _provenance(args, device)}
                with contextlib.suppress(UserError, OSError):  # (the error itself is what the command reports)
                    _write_summary(run_dir, ended)
            raise
        except KeyboardInterrupt as stop:
            terminated = isinstance(stop, Terminated) or bool(signals[:1]) and signals[0] != signal.SIGINT
            name = stop.name if isinstance(stop, Terminated) else _signal_name(signals[0]) if terminated else "Ctrl-C"
            code = 143 if terminated else 130
            if not (run_dir / "config.yaml").is_file():  # (stopped before its first step: the run was left clean)
                _stage("starting the run", run_dir=run_dir)
                print(f"rlspeed: interrupted ({name}) {_STAGE['said']}.", file=sys.stderr, flush=True)
                return code
            progress = getattr(population, "progress", None) or {}  # (the loop's, as its last checkpoint saved it)
            left = dict((int(k), v) for k, v in progress.get("left", []))

            def so_far(key: str, k: int):
                values = progress.get(key)
                return values[k] if isinstance(values, list) and len(values) == len(seeds) else None

            so_far_summary = getattr(population, "summary", None)
            if isinstance(so_far_summary, dict) and so_far_summary.get("interrupted"):
                # (the loop's own: a finished run's keys, null where nothing was measured yet)
                partial = {**so_far_summary, "preset": args.preset_info, "checkpoint_freq": checkpoint_freq,
                           "resumed_from": resumed_from, "checkpoint_encryption": args.encryption,
                           "stopped_by": "signal", "error": None, "close_error": None,
                           "provenance": _provenance(args, device)}
            else:  # (stopped before the training loop began)
                partial = {"algo": algo_cls.name, "env_id": args.env_id, "seeds": seeds, "interrupted": True,
                           "stopped_by": "signal", "error": None, "close_error": None,
                           "total_timesteps": population.num_timesteps, "preset": args.preset_info,
                           "provenance": _provenance(args, device),
                           "members": [{"seed": seed, "steps_to_target": so_far("steps_to_target", k),
                                        "time_to_target_s": so_far("time_to_target_s", k), "curve": curves[k],
                                        "confirmations": so_far("confirmations", k) or [],
                                        "confirmations_unfinished": so_far("confirmations_unfinished", k) or [],
                                        "confirmations_episodes": so_far("confirmations_episodes", k) or [],
                                        **left.get(k, {})}
                                       for k, seed in enumerate(seeds)]}
            # each member as a model of its own, as it stands (rlspeed eval / export take them), then the summary
            partial["member_models"] = (_save_member_models(population, partial, run_dir)
                                        if population.num_timesteps > 0 else {})
            _write_summary(run_dir, partial)
            _stage_run_saved(run_dir)
            if checkpoint.exists():
                from rlspeed.checkpoint import load_checkpoint

                steps = load_checkpoint(checkpoint, verify=False,
                                        allow_nonfinite=True)[1]["population"]["num_timesteps"]
                kept = f"--resume continues from {CHECKPOINT_NAME}, written at {steps:,} steps per member"
            else:
                kept = ("no checkpoint was written yet: --resume (or --overwrite) trains the run again from the "
                        "beginning")
            print(f"rlspeed: interrupted ({name}) after {population.num_timesteps:,} steps per member: summary.json "
                  f"holds each member's evaluations so far; {kept} ({run_dir})", file=sys.stderr, flush=True)
            if any(member.get("curve") for member in partial["members"]):
                # (the plot of the evaluations so far, last: the summary holds them, and a stop, one that waited too,
                # cuts it short)
                with contextlib.suppress(OSError, KeyboardInterrupt), _sigterm_raises(STOPS, held):
                    plot_learning_curves(partial, run_dir / "learning_curves.png")
            return code
        summary["preset"], summary["interrupted"] = args.preset_info, False  # (as a single run's summary says it)
        summary["stopped_by"] = _population_stopped_by(summary, total)
        summary["error"] = summary["close_error"] = None
        summary["checkpoint_encryption"] = args.encryption  # (what the checkpoints and member models were written with)
        summary["checkpoint_freq"], summary["resumed_from"] = checkpoint_freq, resumed_from
        summary["provenance"] = _provenance(args, device)
        # written before anything else can fail, its member_models null until they are: a run killed in between is
        # no finished one (`_ended_summary`: --resume finishes it)
        summary["member_models"] = None
        _write_summary(run_dir, summary)
        summary["member_models"] = _save_member_models(population, summary, run_dir)
        args.finished_summary = run_dir / "summary.json"  # (`_record_close_error`)
        try:  # (before the summary that ends the run: a kill before it leaves a run --resume finishes, plot included)
            plot_learning_curves(summary, run_dir / "learning_curves.png")
        except OSError as error:  # (the run is saved whole: the plot is the one thing missing)
            print(f"rlspeed: cannot write '{run_dir / 'learning_curves.png'}' ({error.strerror or error}); the run "
                  "is saved (summary.json and the member models hold its results).", file=sys.stderr, flush=True)
        _write_summary(run_dir, summary)
        _stage_run_saved(run_dir)
        if signals:  # (one that came as the last iteration ended: the training is saved, its final evaluation skipped)
            name = _signal_name(signals[0])
            skipped = summary["aggregate"]["final_eval"] is None
            # (the command that runs a member's skipped final evaluation: its seed is the member's final-evaluation seed
            # at the steps it trained, as the finished run seeds it, with the run's episodes)
            from rlspeed.evaluation import evaluation_seed
            from rlspeed.population.base import final_steps

            steps = population.num_timesteps
            first = next((int(seed) for seed in summary.get("member_models") or {}), None)
            saved, said = "summary.json and the member models are", ""
            if first is None:  # (every member diverged: no member file to name, and no final evaluation to run)
                saved, said = "summary.json is", "; every member diverged: none has a model or a final evaluation"
            elif skipped:
                member = f"{run_dir}/members/seed_{first}.safetensors"
                own = final_steps(summary["members"][seeds.index(first)], summary.get("stop", "each"), steps)
                said = (f", without the final evaluation (--resume runs it; "
                        f"{_eval_command(member, evaluation_seed(first, 'final', own), _eval_episodes(args))} runs "
                        f"seed {first}'s, and seed S's takes --seed rlspeed.evaluation.evaluation_seed(S, 'final', "
                        f"{steps}), or, for a member that left earlier, with the steps its member file records)")
            print(f"rlspeed: interrupted ({name}) after training finished: {saved} saved in {run_dir}{said}",
                  file=sys.stderr, flush=True)
            return _stop_said(_stop_of(signals[0]))[0]
        steps = summary["aggregate"]["steps_to_target"]
        final = summary["aggregate"]["final_eval"]
        if target is not None:
            cut = _confirmations_cut_short(summary["members"], _eval_episodes(args))
            line = f"{summary['reached']} of {len(seeds)} members reached {target:g}" + (
                f" (confirmations on fresh episodes{cut})" if cut else "")
            if steps is not None:
                line += (f"; steps to target: median {steps['median']:,.0f}, IQM {steps['iqm']:,.0f} "
                         f"{_interval(steps, lambda value: f'{value:,.0f}')}")
            say(f"rlspeed: {line}")
        evaluated = [member for member in summary["members"] if member["final_eval"] is not None]
        # (the aggregate leaves out a mean that is not finite: those members are named; with none finite there is none)
        not_finite = [str(member["seed"]) for member in evaluated
                      if not (isinstance(member["final_eval"]["mean"], (int, float))
                              and math.isfinite(member["final_eval"]["mean"]))]
        if evaluated:  # (the result: --quiet too)
            cut = _cut_short(sum(member["final_eval"].get("unfinished", 0) for member in evaluated),
                             sum(member["final_eval"]["episodes"] for member in evaluated))
            scores = (f"median {_score(final['median'])}, IQM {_score(final['iqm'])} {_interval(final, _score)}"
                      + (f"; seed {', '.join(not_finite)} left out (mean not finite)" if not_finite else "")
                      if final is not None else "no median or IQM: no member's mean return is finite")
            print(f"rlspeed: final evaluation (deterministic, {_episodes(_eval_episodes(args))} each{cut}): {scores}; "
                  f"training {summary['train_wall_s']:.2f} s")
        saved = summary["member_models"]
        if saved:
            from rlspeed.checkpoint import MEMBERS_DIR

            say(f"rlspeed: each member as a model of its own (rlspeed eval / export take them): "
                f"{run_dir / MEMBERS_DIR}/seed_<S>.safetensors, {len(saved)} of {len(seeds)} members")
        say(f"rlspeed: run directory {run_dir}")
        if summary["diverged"] == len(seeds):  # (nothing usable was trained: not a success)
            print("rlspeed: error: every member diverged (non-finite parameters or env values; summary.json's members "
                  "say at which step): lower learning_rate, clip gradients (max_grad_norm) or check the env's rewards.",
                  file=sys.stderr, flush=True)
            return 2
    # (read once the block has ended: a stop that comes later raises, `_main` saying it with the stage)
    return _said_as_it_ended(0, held, "summary.json and the member models, with the final evaluation,", run_dir)


def _refuse_budget_below_trained(run_dir: Path, total: int, trained: int, trained_by: str, ends: str) -> None:
    """UserError where a resumed run's budget `total` is below the `trained` steps its checkpoint holds (`trained_by`
    says whose), unless it is the run's own budget in its config.yaml (learn trains whole iterations, so a run
    passes its budget): `--total-timesteps TRAINED` ends the run there (`ends`: what it then gives)."""
    if trained > total and total != (_run_config(run_dir / "config.yaml") or {}).get("total_timesteps"):
        raise UserError(f"--resume: --total-timesteps {total:,} is below the {trained:,} {trained_by}: give "
                        f"--total-timesteps {trained} to end it there ({ends}), or more to train on.")


def _forget_unsaved_attempt(run_dir: Path) -> None:
    """Before a run starts afresh in its own directory: the metrics.csv rows and TensorBoard events of an attempt
    there killed before its first checkpoint, which are not this run's (its own would follow them)."""
    (run_dir / "metrics.csv").unlink(missing_ok=True)
    shutil.rmtree(run_dir / "tensorboard", ignore_errors=True)


def _save_member_models(population, summary: dict, run_dir: Path) -> dict[str, str]:
    """Each member that did not diverge as a solo model file `run_dir/members/seed_<S>.safetensors` (its parameters as
    it ended or left, `Population.member_model`, with the env steps it trained: a loaded member's learn counts on from
    them, as a solo run's model's does); returns {seed: path in the run directory} of those written."""
    import torch

    from rlspeed.checkpoint import MEMBERS_DIR
    from rlspeed.population.base import final_steps

    saved = {}
    for k, member in enumerate(summary["members"]):
        if member.get("diverged_at") is not None:
            continue
        name = f"{MEMBERS_DIR}/seed_{population.seeds[k]}.safetensors"
        (run_dir / MEMBERS_DIR).mkdir(parents=True, exist_ok=True)
        # (the file records the process's torch generator for a resume: the member's seed's, so that identical runs
        # write identical files)
        with torch.random.fork_rng():
            torch.manual_seed(population.seeds[k])
            model = population.member_model(k)
            # (the steps it trained, as its final evaluation's seed takes them)
            model.num_timesteps = final_steps(member, summary.get("stop", "each"), population.num_timesteps)
            model.save(run_dir / name)
        _say_stale_exports(print, run_dir / name, model.num_timesteps)
        saved[str(population.seeds[k])] = name
    return saved


def _count(number: int, noun: str) -> str:
    """'1 env', '4 envs'."""
    return f"{number:,} {noun}{'' if number == 1 else 's'}"


def _under_torchrun() -> bool:
    """Whether this process is one of several torchrun started (WORLD_SIZE above 1)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def _one_process_only(command: str, why: str) -> None:
    """UserError where this command was started under torchrun: `command` runs in one process."""
    if _under_torchrun():
        raise UserError(f"rlspeed {command} runs in one process ({why}): start it without torchrun.")


# --- `rlspeed tune` ----------------------------------------------------------------------------------------------
@_signals_stop_cleanly  # (SIGTERM as Ctrl-C: while torch loads too, which killed it without a word)
def cmd_tune(args: argparse.Namespace) -> int:
    """`rlspeed tune`: an Optuna study over per-member hyperparameters, `--population` trials trained at once as one
    population (`rlspeed.tune`), resumable from its storage; writes the best configuration as a preset YAML."""
    from rlspeed.tune import require_optuna

    _stage("loading torch, the env's packages and the preset", left="the study had not begun, nothing was tuned or "
           "written")

    _one_process_only("tune", "its trials train as one population; each process would run the study on its own")
    require_optuna()
    _import_env_modules(args, "env_id")
    from rlspeed.device import resolve_device
    from rlspeed.envs import env_spec
    from rlspeed.tune import refuse_others_file, tune

    algo_cls, run_settings, hyper, _config = _settings(args)
    target, eval_freq = _target_and_eval_freq(args, run_settings, env_spec(args.env_id, _env_kwargs(args)))
    train_timesteps = _total_timesteps(run_settings)
    # a search needs to rank configurations, not train one: a trial that has not reached the target in a third of a
    # training run's budget is not one it is after
    budget = args.budget or max(train_timesteps // 3, 1)
    env_name = args.env_id.replace("/", "_")
    study_name = args.study_name or f"{algo_cls.name}-{env_name}"
    out = args.out or f"tuned-{algo_cls.name}-{env_name}.yaml"
    if Path(out).is_dir():
        raise UserError(f"--out {out} is a directory; give the preset file to write.")
    refuse_others_file(out, study_name, args.storage)
    # (a place the preset cannot be written is said now, not after the search: its directories are made then, so the
    # nearest one that exists is tried, with a file of its own that leaves nothing behind)
    folder = next(folder for folder in Path(out).absolute().parents if folder.exists())
    reason = unwritable(folder)
    if reason is not None:
        raise UserError(f"--out {out}: nothing can be written in '{folder}' ({reason}); give --out a file in a "
                        "directory you can write to.")
    device = resolve_device(args.device)
    _configure_threads(args)
    _say_preset(args)
    command = shlex.join(["rlspeed", *getattr(args, "argv", [])])
    _stage("tuning", left="the study keeps the trials that finished (the same command goes on)")
    tune(algo_cls, args.env_id, trials=args.trials, population=args.population, storage=args.storage,
         study_name=study_name, hyperparameters=hyper, budget=budget, target_return=target, eval_freq=eval_freq,
         search_space=args.search_space, fixed=tuple(_parse_set(args.set or [])), confirm_seeds=args.confirm_seeds,
         out=out, total_timesteps=train_timesteps, seed=args.seed, device=device, command=command,
         progress_bar=not args.no_progress,
         env_kwargs=_parse_set(args.env_kwargs, "--env-kwargs") if args.env_kwargs else None,
         gym_packages=tuple(args.gym_packages or ()), eval_episodes=_eval_episodes(args),
         fail_running=args.fail_running)
    return 0


def _settings(args: argparse.Namespace) -> tuple[type, dict, dict, object]:
    """(algorithm class, run settings, hyperparameters, their validated config) from the preset of (ALGO, ENV_ID),
    `--set` and `--num-envs`: every value is checked here, before anything is built."""
    from rlspeed.algos.base import build_config, sb3_settings
    from rlspeed.presets import coerce_run_settings, load_preset, split_run_settings

    algo_cls = _algorithm(args.algo)
    source = getattr(args, "preset", "auto")
    preset_id, preset = _variant_preset(args, algo_cls.name, source)
    if preset is None:
        preset_id, preset = args.env_id, load_preset(algo_cls.name, args.env_id, source, _env_kwargs(args))
    args.env_variant = preset_id if preset_id != args.env_id else None
    args.preset_message = preset.message()
    # (`requested`: the --preset value as given, which a --resume naming the same preset is compared with)
    args.preset_info = {"source": preset.source, "origin": preset.origin, "not_honoured": preset.unsupported,
                        "requested": str(getattr(args, "preset", "auto"))}
    if preset.notes:  # (an RL-Zoo-format preset: how its entries were translated, and where rlspeed differs)
        args.preset_info.update(translation_notes=preset.notes, differs_from_sb3=preset.differences)
    run_settings, hyper = split_run_settings(preset)
    # (an evaluation frequency the user gave, in a preset file or --set, holds without a target, as --eval-freq does;
    # a shipped or RL-Zoo preset's serves its target only)
    args.eval_freq_given = preset.source == "file" and "eval_freq" in run_settings
    dropped_notes: dict[str, str] = {}  # (a preset's setting left out -> the note that says so)
    if hyper.get("normalize_obs") and preset.source != "file":
        # a shipped or RL-Zoo default meant for float vectors: images are scaled by the CNN encoder and indices
        # one-hot encoded instead (asked for with --set, the same is an error that says so)
        import gymnasium as gym

        from rlspeed.envs import env_spec
        from rlspeed.envs.wrappers import normalizable
        from rlspeed.nn import make_encoder

        # (the space the run's env options make: an option may turn float vectors into indices, or back)
        space = env_spec(args.env_id, _env_kwargs(args)).observation_space
        if not normalizable(space):
            hyper["normalize_obs"] = False
        elif (getattr(args, "seeds", None) is not None and not isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple))
              and make_encoder(space, hyper.get("encoder", "auto")) is not None):
            # (a population normalises float vectors that reach its networks without an encoder, and a Dict's float
            # keys, only)
            hyper["normalize_obs"] = False
            dropped_notes["normalize_obs"] = (f"rlspeed: note: the preset's normalize_obs is left out: a population "
                                              f"normalises float vector observations only, and {args.env_id}'s are "
                                              "not (a solo run normalises them)")
    resumed = getattr(args, "resume_hyperparameters", None)
    if resumed:  # (`--resume`: the run's own hyperparameters and run settings, `_resume_settings`)
        fields = {field.name for field in dataclasses.fields(algo_cls.config_cls)}
        dropped = sorted(set(resumed) - fields)
        if dropped:  # (a config.yaml of an older rlspeed: settings that are no longer hyperparameters)
            print(f"rlspeed: note: --resume ignores settings of the run's config.yaml that {algo_cls.__name__} no "
                  f"longer takes: {', '.join(dropped)}", file=sys.stderr)
        # the run's recorded values, and no preset's: a setting its config.yaml lacks (one an older rlspeed did not
        # have yet) takes the algorithm's default, which is what that rlspeed did, not the value today's preset has
        hyper = {key: value for key, value in resumed.items() if key in fields}
        if "cnn" in fields and "cnn" not in hyper:  # (except the CNN an older rlspeed built: `with_saved_cnn`)
            from rlspeed.algos.base import with_saved_cnn
            from rlspeed.envs import env_spec

            hyper = with_saved_cnn(hyper, fields, env_spec(args.env_id, _env_kwargs(args)).observation_space)
        if hyper.get("use_masking") is True and getattr(algo_cls.config_cls, "use_masking", None) is True:
            del hyper["use_masking"]  # (the default, which the run did not ask for: no word about masks it lacks)
        run_settings.update(getattr(args, "resume_run_settings", {}))
        if isinstance(getattr(args, "resume_preset", None), dict):
            args.preset_info, args.preset_message = args.resume_preset, None
    init_notes = (_networks_of_init_file(args, algo_cls, hyper)
                  if getattr(args, "init_from", None) and not _resumes_checkpoint(args) else [])
    overrides = sb3_settings(algo_cls.config_cls, _parse_set(args.set or []))  # (SB3's n_steps: over a preset's)
    _check_set_keys(overrides, getattr(args, "command", "train"))
    run_overrides, hyper_overrides = split_run_settings(overrides)
    for key in run_overrides:  # (a flag would win silently: the two say different things, or the same twice)
        flag = f"--{key.replace('_', '-')}"
        if getattr(args, key, None) is not None:
            raise UserError(f"{flag} and --set {key}={run_overrides[key]} both set {key}: give one of them.")
    run_settings.update(run_overrides)
    # (a resumed run's recorded frequency is its own: config.yaml records one without a target only where it
    # evaluated, and with a target the run evaluated at it, so it goes on evaluating without one)
    args.eval_freq_given = ((args.eval_freq_given and not resumed) or "eval_freq" in run_overrides
                            or bool(resumed and run_settings.get("eval_freq") is not None))
    hyper.update(hyper_overrides)
    if args.num_envs is not None:
        if "num_envs" in hyper_overrides and hyper_overrides["num_envs"] != args.num_envs:
            raise UserError(f"--num-envs {args.num_envs} and --set num_envs={hyper_overrides['num_envs']} disagree: "
                            "give one of them.")
        hyper["num_envs"] = args.num_envs
    # (the processes that will train it: --nproc's, or torchrun's in a worker)
    processes = max(getattr(args, "nproc", None) or 1, int(os.environ.get("WORLD_SIZE", "1")))
    _refuse_uneven_num_envs(args, algo_cls, hyper, hyper_overrides, processes)
    config = build_config(algo_cls.config_cls, hyper, processes)
    # (said when training starts, after the preset's line: a refusal before it stays one line)
    args.setting_notes = _annealed_override_notes(hyper_overrides, config, set(hyper) - set(hyper_overrides),
                                                  algo_cls.__name__)
    args.setting_notes += [note for name, note in dropped_notes.items() if not hyper_overrides.get(name)]
    args.setting_notes += [note for key, note in init_notes if key not in hyper_overrides]
    if getattr(args, "variant_note", None) and not resumed:
        args.setting_notes.append(args.variant_note)
    if args.env_variant and not resumed:
        options = as_keywords(_env_kwargs(args))
        args.setting_notes.append(f"rlspeed: note: {args.env_id} with {options} is {preset_id} as Gymnasium "
                                  f"registers it: the preset and reward threshold are {preset_id}'s")
    given = {**hyper_overrides, **({"num_envs": args.num_envs} if args.num_envs is not None else {}),
             **dict.fromkeys(getattr(args, "member_keys", ()))}  # (a population's per-member --set values)
    # (tune's search replaces the preset's values: no note on those kept)
    if ((hyper_overrides or getattr(args, "member_keys", ())) and not resumed and preset.source not in ("file", "none")
            and getattr(args, "command", None) != "tune"):
        args.setting_notes += _preset_values_kept(preset, algo_cls, given, hyper)
    return algo_cls, coerce_run_settings(run_settings), hyper, config


def _refuse_uneven_num_envs(args: argparse.Namespace, algo_cls: type, hyper: dict, given: dict,
                            processes: int) -> None:
    """`distributed.refuse_uneven_num_envs` for the run's num_envs (the preset's, `--set`'s or `--num-envs`'s, in
    `hyper`; `given`: `--set`'s values) over `processes`, advising the flag that gave it, before the settings' other
    rules: batch_size's advice, which is the rollout's, follows from num_envs (followed, it met this refusal). A value
    that is no whole number is left to the settings' own refusal."""
    from rlspeed.distributed import refuse_uneven_num_envs

    num_envs = hyper.get("num_envs", getattr(algo_cls.config_cls, "num_envs", None))
    if isinstance(num_envs, float) and num_envs.is_integer():  # (63.0, 1e2: the settings take it as that number)
        num_envs = int(num_envs)
    if isinstance(num_envs, int) and not isinstance(num_envs, bool):
        refuse_uneven_num_envs(num_envs, processes, "--nproc" if getattr(args, "nproc", None) else
                               "the number of processes",
                               "--set num_envs=" if "num_envs" in given and args.num_envs is None else "--num-envs ")


def _resumes_checkpoint(args: argparse.Namespace) -> bool:
    """Whether this command goes on from a checkpoint in --out: `--resume`, or a torchrun restart of the group
    (`--max-restarts`), which resumes as `--resume` does."""
    going_on = getattr(args, "resume", False) or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    return bool(going_on and args.out and (Path(args.out) / "checkpoint.safetensors").exists())


def _init_model_file(args: argparse.Namespace) -> Path:
    """`--init-from`'s model file (a run directory's model.safetensors), checked to exist."""
    from rlspeed.checkpoint import checkpoint_path, run_model

    path = run_model(args.init_from)
    path = path if path.is_file() else checkpoint_path(path)
    if not path.is_file():
        raise UserError(f"--init-from '{args.init_from}': no such model file (give a saved model or a run directory "
                        "holding a model.safetensors).")
    return path


def _networks_of_init_file(args: argparse.Namespace, algo_cls: type, hyper: dict) -> list[tuple[str, str]]:
    """With `--init-from FILE`: the settings that decide the networks (net_arch, activation, encoder, ...) set in
    `hyper` to the file's, whose weights the model takes; returns (key, note) for those that differ from the
    preset's (a `--set` of the key replaces the file's value, and the weights are then refused in one sentence)."""
    from rlspeed.algos.base import (
        algorithm_labels,
        build_config,
        holds_model_of,
        saved_networks,
    )
    from rlspeed.checkpoint import load_checkpoint, refuse_non_model

    path = _init_model_file(args)
    _, meta = load_checkpoint(path, device="cpu")
    refuse_non_model(path, meta, "load")
    if not holds_model_of(meta, algo_cls):
        held, ours = algorithm_labels(meta, algo_cls)
        raise UserError(f"--init-from '{path}' holds a model of {held}, not of {ours}: give a {algo_cls.name} model "
                        "(the networks it starts from).")
    notes = []
    before, given = _plain(build_config(algo_cls.config_cls, hyper)), _parse_set(args.set or [])
    networks = saved_networks(algo_cls, meta)
    saved = networks.settings
    for key, value in saved.items():
        value = list(value) if isinstance(value, tuple) else value  # (as config.yaml and _plain write it)
        if key not in given and before[key] != value:
            notes.append((key, f"rlspeed: note: --init-from: {key}={value}, as the networks of '{path}' (else "
                               f"{before[key]})"))
        hyper[key] = value
    # (a --set of one of them replaces the file's value later: it is taken where it builds the file's networks, as
    # set_parameters takes a model's)
    key = networks.mismatch(build_config(algo_cls.config_cls, {
        **hyper, **{key: value for key, value in given.items() if key in saved}}))
    if key is not None:
        value = _plain(build_config(algo_cls.config_cls, {key: saved[key]}))[key]
        raise UserError(f"--set {key}={given[key]} and --init-from '{path}' (networks with {key}={value}) "
                        f"disagree: drop --set {key}, whose networks could not take the file's weights.")
    args.init_from = str(path.resolve())
    return notes


def _say_preset(args: argparse.Namespace, say=print) -> None:
    """The preset's line (none for a resumed run: its config.yaml's), then the notes on how --set combined with it
    and on the run's target (`_target_and_eval_freq`)."""
    if getattr(args, "preset_message", None):
        say(args.preset_message)
    for note in [*getattr(args, "setting_notes", []), *getattr(args, "target_notes", [])]:
        say(note, file=sys.stderr)


def _annealed_override_notes(overrides: dict, config, from_preset: set, algo: str) -> list[str]:
    """`--set learning_rate=X` (or clip_range) that starts a decay the preset, the run or the algorithm's default asked
    for: RL-Zoo's constant `X` and `lin_X` are one value and a flag here, and the flag came from elsewhere."""
    return [f"rlspeed: note: --set {key}={overrides[key]} starts a linear decay to 0 ("
            + (f"{flag} is true in the preset or run" if flag in from_preset else f"{algo}'s default {flag}=true")
            + f"); add --set {flag}=false to hold it constant."
            for key, flag in (("learning_rate", "anneal_lr"), ("clip_range", "anneal_clip"))
            if key in overrides and flag not in overrides and getattr(config, flag, False) is True]


def _origin_name(origin: str) -> str:
    """A preset's origin without the notes it adds after a ';' (one inside parentheses stays: RL-Zoo's v4 entry for a
    MuJoCo v5 id is said in them)."""
    depth = 0
    for index, char in enumerate(origin):
        depth += (char == "(") - (char == ")")
        if char == ";" and depth == 0:
            return origin[:index]
    return origin


def _preset_values_kept(preset, algo_cls: type, overrides: dict, hyper: dict) -> list[str]:
    """With `--set` values over a shipped or RL-Zoo preset, the preset's hyperparameters that stay (as `hyper`, the
    values that train, has them): someone giving a peer's whole configuration with --set (CleanRL's, a paper's)
    would otherwise train with others unseen."""
    from rlspeed.presets import split_run_settings

    kept = {key: value for key, value in split_run_settings(preset)[1].items()
            if key not in overrides and hyper.get(key, value) == value}
    if not kept:
        return []
    values = ", ".join(f"{key}={value}" for key, value in kept.items())
    return [f"rlspeed: note: {_origin_name(preset.origin)} also sets {values} (--preset none: "
            f"{algo_cls.__name__}'s defaults and your --set values alone)."]


def _configure_threads(args: argparse.Namespace) -> int:
    """`configure_threads(--threads)` (a resumed run's own count where the flag is not given), with a note on stderr
    where the cores this process may use (its CPU affinity, a container's CPU quota) hold the count below it."""
    from rlspeed.device import configure_threads, processes_sharing_cores

    threads = args.threads
    used = configure_threads(threads)
    # (said once, by the first of several processes: each caps its own count alike)
    if threads is not None and used < threads and os.environ.get("RANK", "0") == "0":
        asked = (f"the run's {threads} threads (its config.yaml) are" if getattr(args, "threads_from_run", False)
                 else f"--threads {threads} is")
        processes = processes_sharing_cores()
        share = (f", shared by the {processes} processes on this machine" if processes > 1 else "")
        print(f"rlspeed: note: {asked} more than the {used} "
              f"core{'s' * (used != 1)} this process may use (its CPU affinity or container quota{share}): training "
              f"runs {used} thread{'s' * (used != 1)}{' in each' if processes > 1 else ''}.", file=sys.stderr)
    return used


def _model(args: argparse.Namespace, algo_cls: type, hyper: dict, strategy=None):
    """The algorithm built from the model flags train and profile share (`build_parser`'s `model` parent); the
    process's torch threads set from `--threads` first (the final evaluation and videos run outside `learn`)."""
    _configure_threads(args)
    return algo_cls(args.env_id, device=args.device, seed=args.seed, env_backend=args.env_backend,
                    accelerate=args.accelerate, num_threads=args.threads, strategy=strategy,
                    nan_policy=args.nan_policy, save_replay_buffer=getattr(args, "save_replay_buffer", False),
                    env_kwargs=_env_kwargs(args), **hyper)


def _variant_preset(args: argparse.Namespace, algo: str, source: str):
    """(id, preset) where the command's env options make another registered id (`registered_variant`:
    LunarLander-v3 with continuous=True is LunarLanderContinuous-v3) with a preset of its own from `source` (auto,
    rlspeed or zoo): that task's, not the one tuned for the id as registered (discrete actions); else (None, None),
    and the id's own preset applies (a variant without one of its own, as before)."""
    env_kwargs = _env_kwargs(args)
    if not env_kwargs or source not in ("auto", "rlspeed", "zoo"):
        return None, None
    import gymnasium as gym

    from rlspeed.envs import import_env_module
    from rlspeed.envs.base import registered_variant
    from rlspeed.presets import load_preset

    env_id = import_env_module(args.env_id)
    variant = registered_variant(env_id, env_kwargs)
    if variant is None:
        # (options that make another id but for its time limit, which the user did not set)
        near = None if "max_episode_steps" in env_kwargs else registered_variant(env_id, env_kwargs, False)
        limits = [gym.spec(name).max_episode_steps for name in (env_id, near)] if near else [None]
        if None not in limits:  # (said when training starts, after the preset's line)
            options = as_keywords(env_kwargs)
            args.variant_note = (f"rlspeed: note: {args.env_id} with {options} is {near} but for its time limit "
                                 f"({limits[0]:,} steps here, {limits[1]:,} there): {near}'s preset and reward "
                                 f"threshold do not apply; --env-kwargs max_episode_steps={limits[1]} (or {near}) "
                                 f"trains its task")
        return None, None
    try:
        preset = load_preset(algo, variant, source, env_kwargs)
    except UserError:  # (RL-Zoo has no entry for the variant, or one rlspeed cannot honour: the id's own, then)
        return None, None
    return (variant, preset) if preset.source in ("rlspeed", "zoo") else (None, None)


def _env_kwargs(args: argparse.Namespace) -> dict | None:
    """`--env-kwargs KEY=VALUE ...` as the model's `env_kwargs` (None without any; `--resume` takes the run's)."""
    given = getattr(args, "env_kwargs", None)
    if given:
        return _parse_set(given, "--env-kwargs")
    return getattr(args, "resume_env_kwargs", None) or None


def _fresh_run_dir(base: Path) -> Path:
    """Create and return `base`, or `base-1`, `base-2`, ... when it exists (never an existing directory)."""
    for number in range(10_000):
        candidate = base if number == 0 else base.with_name(f"{base.name}-{number}")
        try:
            candidate.mkdir(parents=True)
            return candidate
        except FileExistsError:
            continue
        except OSError as error:
            raise UserError(f"Cannot create the run directory '{candidate}': {error.strerror or error}.") from None
    raise UserError(f"Cannot find a free run directory name after '{base}-9999'; give --out DIR.")


def _default_run_dir(args: argparse.Namespace, algo: str, seeds: list[int] | None = None) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    contiguous = seeds is not None and seeds == list(range(seeds[0], seeds[0] + len(seeds)))
    seed = (args.seed if seeds is None else f"seeds{seeds[0]}-{seeds[-1]}" if contiguous
            else f"{len(seeds)}seeds{seeds[0]}-{seeds[-1]}")  # (0,3,5: "3seeds0-5", not a range it did not train)
    return Path(f"runs/{algo}-{args.env_id.replace('/', '_')}-{seed}-{stamp}")


def _prepare_run_dir(args: argparse.Namespace, algo: str, checked_before: bool,
                     seeds: list[int] | None = None, finished_enough=None) -> Path:
    """The run directory, created and writable. A directory that already holds a run is refused unless `--resume`
    (which continues it) or `--overwrite` (which deletes its run files first) is given; the default directory (named
    after `seeds` for a population) gets a numbered suffix instead. `checked_before`: under torchrun the `--nproc`
    launcher did these checks (the ranks would otherwise see each other's new files). `finished_enough(summary)`:
    whether a finished run (its summary.json's dict) already holds what this command asks for, so that `--resume`
    without a checkpoint has nothing left to train rather than a run to refuse."""
    if args.overwrite and args.resume:
        raise UserError("--overwrite starts the run in --out afresh and --resume continues it: give one of them.")
    if args.out is None:
        run_dir = _fresh_run_dir(_default_run_dir(args, algo, seeds))
        if not checked_before:
            _lock_run_dir(run_dir)
        return run_dir
    run_dir = Path(args.out)
    _check_out_makeable(run_dir)
    if not checked_before and run_dir.is_dir():
        _lock_run_dir(run_dir)  # (before the checks: a second process started at once sees the first's run)
        held = [name for name in RUN_FILES if (run_dir / name).exists()]
        if held and not _holds_rlspeed_run(run_dir):  # (a project's own config.yaml, videos/ or wandb/: not ours)
            raise UserError(f"'{run_dir}' holds {', '.join(held)}, which are not an rlspeed run's (no config.yaml, "
                            "metrics.csv, summary.json or model of rlspeed's): a run there would write over them; give "
                            "another --out (a new directory).")
        if args.resume:  # (what the resumed run reads as its own or adds files to: never through a link elsewhere)
            refuse_symlinks(run_dir, ("metrics.csv", "tensorboard", "videos")
                            + (("wandb",) if getattr(args, "track", False) else ()))
        # (a summary.json written on an interruption does not make the run finished: --resume may start it again)
        finished = [name for name in ("model.safetensors", "summary.json")
                    if name in held and (name != "summary.json" or _finished_summary(run_dir / name))]
        if held and args.overwrite:
            _move_run_aside(run_dir, held)
        elif held and not args.resume:
            raise UserError(f"'{run_dir}' already holds a run ({', '.join(held)}): give another --out, --resume to "
                            "continue it, or --overwrite to replace it.")
        # (a population's finished run, with a checkpoint or none, is `_same_population_run`'s to judge)
        elif (finished and not (run_dir / "checkpoint.safetensors").exists() and seeds is None
              and not (finished_enough is not None and "model.safetensors" in finished
                       and finished_enough(_ended_summary(run_dir / "summary.json") or {}))):
            raise UserError(f"--resume: '{run_dir}' holds a finished run ({', '.join(finished)}) but no "
                            "checkpoint.safetensors to continue from; give --overwrite to train it again from scratch.")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(f"Cannot create the run directory '{run_dir}': {error.strerror or error}.") from None
    if not checked_before:
        _lock_run_dir(run_dir)
    _check_writable(run_dir)  # fail now, not after training: an existing directory may not be writable
    return run_dir


#: The file in a run directory naming the torchrun job (its TORCHELASTIC_RUN_ID, then its token) whose rank 0 checked
#: and took the directory, under torchrun started by hand: a restart of that job goes on there
#: (`_prepare_workers_run_dir`)
TORCHRUN_JOB_FILE = ".rlspeed-torchrun-job"
#: The key in torchrun's store for the job (`_torchrun_job_store`) holding the token rank 0 drew as it took the run
#: directory: a job whose earlier attempts took nothing (refused, or ended before rank 0's check) finds none, and
#: another job reusing the --rdzv-id has a store of its own
_TORCHRUN_TOKEN_KEY = "rlspeed/run-dir-token"
#: The key in the same store holding a digest of the last refusal rank 0 made: a restart refused alike says it once
_TORCHRUN_REFUSAL_KEY = "rlspeed/run-dir-refusal"


def _prepare_workers_run_dir(args: argparse.Namespace, algo: str, strategy, finished_enough=None) -> Path:
    """`_prepare_run_dir` for a run of `strategy`'s processes. In one process, or under `rlspeed train --nproc` (whose
    launcher made the checks and holds the lock: `RUN_LOCKED_BY_LAUNCHER`), as it is. Under torchrun started by hand,
    rank 0 locks the directory and makes the checks as the launcher would, unless this attempt is a restart of the job
    that took it (TORCHELASTIC_RESTART_COUNT above 0 and its TORCHELASTIC_RUN_ID in `TORCHRUN_JOB_FILE`, written by
    the attempt that made the checks), which goes on there under the lock; the other ranks wait for its word (they
    would see each other's new files) and end with its refusal, the same sentence and exit code."""
    if not strategy.enabled:  # (one process: resolving --out first would fail in a working directory since removed)
        return _prepare_run_dir(args, algo, checked_before=False, finished_enough=finished_enough)
    if args.out is not None and os.environ.get(RUN_LOCKED_BY_LAUNCHER) == str(Path(args.out).resolve()):
        return _prepare_run_dir(args, algo, checked_before=True, finished_enough=finished_enough)
    refusal = None
    if strategy.is_main:
        from rlspeed.distributed import _torchrun_job_store

        try:  # (the store's client and calls too: an error there ends the others as well)
            store = _torchrun_job_store()
            try:
                run_dir = _take_run_dir_for_torchrun_job(args, algo, finished_enough, store)
            except UserError as error:
                refusal = f"{'busy' if isinstance(error, Busy) else 'refused'} {error}"
                if store is not None:  # (torchrun restarts a refused group --max-restarts times: each refused alike)
                    seen = hashlib.sha256(refusal.encode("utf-8", "surrogateescape")).hexdigest()
                    if store.check([_TORCHRUN_REFUSAL_KEY]) and store.get(_TORCHRUN_REFUSAL_KEY).decode() == seen:
                        refusal = f"again {refusal}"
                    store.set(_TORCHRUN_REFUSAL_KEY, seen)
            else:
                if store is not None:  # (a refusal of a later attempt, after this one's lines, is said anew)
                    store.delete_key(_TORCHRUN_REFUSAL_KEY)
        except Exception:
            strategy.broadcast_text("failed")  # (the others end too, not waiting in a collective: it says why)
            raise
    said = strategy.broadcast_text(refusal)
    if said == "failed":
        raise PeerEnded(f"Process {strategy.rank} of {strategy.world_size} stopped: process 0 failed to prepare the "
                        f"run directory '{args.out}' (its message is above).")
    if said is not None:
        how, sentence = said.removeprefix("again ").split(" ", 1)
        refused = (Busy if how == "busy" else UserError)(sentence)
        refused.said_before = said.startswith("again ")  # (by an earlier attempt of the job: `_main` says it once)
        raise refused
    return run_dir if strategy.is_main else _prepare_run_dir(args, algo, checked_before=True)


def _take_run_dir_for_torchrun_job(args: argparse.Namespace, algo: str, finished_enough, store) -> Path:
    """Rank 0's part of `_prepare_workers_run_dir` under torchrun started by hand: the run directory, locked, checked
    as a plain run's unless this attempt restarts the job named in its `TORCHRUN_JOB_FILE`, which then names this job.
    `store`: torchrun's store for the job (`distributed._torchrun_job_store`), None where it keeps none.
    (The lock comes first: what a killed `--overwrite` left there is settled before the restart is judged.)"""
    run_dir, job = Path(args.out), os.environ.get("TORCHELASTIC_RUN_ID", "")
    if run_dir.is_dir():
        _lock_run_dir(run_dir)
    try:
        named = (run_dir / TORCHRUN_JOB_FILE).read_text(encoding="utf-8").strip()
    except (OSError, ValueError):
        named = None
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if named == job and not restarts:  # (another job's of this --rdzv-id, 'none' by default: this one took nothing)
        (run_dir / TORCHRUN_JOB_FILE).unlink()  # (under the lock; its restart, were this attempt refused, is checked)
        named = None
    # (this job's mark: its id, and where torchrun keeps a store for the job, the token an earlier attempt drew)
    token = store.get(_TORCHRUN_TOKEN_KEY).decode() if store is not None and store.check([_TORCHRUN_TOKEN_KEY]) else ""
    restart = restarts > 0 and bool(job) and (store is None or bool(token)) and named == f"{job} {token}".strip()
    run_dir = _prepare_run_dir(args, algo, checked_before=restart, finished_enough=finished_enough)
    if restart:
        _lock_run_dir(run_dir)  # (where the directory was gone: made just now)
    else:
        token = "" if store is None else secrets.token_hex(8)
        _write_text(run_dir / TORCHRUN_JOB_FILE, f"{job} {token}".strip() + "\n")
        if store is not None:  # (after the file: a restart finding the token finds the file naming it)
            store.set(_TORCHRUN_TOKEN_KEY, token)
    return run_dir


def _check_out_makeable(run_dir: Path) -> None:
    """UserError where the run directory `run_dir` (`--out`) could not be made or written: a file in its place or in
    its parents', or a folder above it where nothing can be made (read-only, another user's). Makes nothing: `--dry-run`
    asks it too."""
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"--out '{run_dir}' is a file; the run directory must be a directory.")
    existing = next((folder for folder in (run_dir, *run_dir.parents) if folder.exists()), None)
    if existing is None:  # (a relative path in a working directory since removed: the mkdir's error says it)
        return
    if not existing.is_dir():
        raise UserError(f"Cannot create the run directory '{run_dir}': '{existing}' is a file.")
    if existing == run_dir:  # (there already: written to, not created)
        _check_writable(run_dir)
        return
    reason = unwritable(existing)
    if reason is not None:
        raise UserError(f"Cannot create the run directory '{run_dir}': {reason} (in '{existing}').")


def _holds_rlspeed_run(run_dir: Path) -> bool:
    """Whether `run_dir` holds a run rlspeed wrote (`rlspeed train`'s config.yaml, or a metrics.csv, summary.json,
    model or checkpoint of `learn(run_dir=...)`, known by their content): only then are its `RUN_FILES` a run's,
    which `--overwrite` may replace and `--resume` continue. A file of the same name that is not rlspeed's is the
    user's."""
    config = _run_config(run_dir / "config.yaml")
    if isinstance(config.get("algo"), str) and isinstance(config.get("env_id"), str):
        return True
    try:  # (rlspeed's columns: every row has the step count and the training clock)
        with open(run_dir / "metrics.csv", encoding="utf-8") as handle:
            if {"timesteps", "train_wall_s"} <= set(handle.readline().strip().split(",")):
                return True
    except (OSError, ValueError):
        pass
    if {"algo", "env_id"} <= set(_run_summary(run_dir / "summary.json") or {}):
        return True
    from rlspeed.checkpoint import written_by_rlspeed

    return any(written_by_rlspeed(run_dir / name) for name in ("model.safetensors", "checkpoint.safetensors"))


def _check_writable(run_dir: Path) -> None:
    """UserError unless a file can be made in `run_dir`."""
    reason = unwritable(run_dir)
    if reason is not None:
        raise UserError(f"Cannot write to the run directory '{run_dir}': {reason}.")


def _move_run_aside(run_dir: Path, held: list[str]) -> None:
    """`--overwrite`: move the run files `held` in `run_dir` and `rlspeed export RUN`'s files beside its model
    (recognised by their metadata: a user's own model.pt stays) into a hidden directory there, deleted when the
    command ends (`_settle_overwrites`), or moved back where it failed before the new run saved anything; one sentence
    where they cannot be moved."""
    from rlspeed.export import FORMATS

    _check_writable(run_dir)  # (first: a read-only directory loses nothing)
    names = list(held)
    for suffix in FORMATS.values():
        if _export_metadata(run_dir / f"model{suffix}.json") is not None:
            names += [name for name in (f"model{suffix}", f"model{suffix}.json") if (run_dir / name).exists()]
    moved: list[str] = []
    aside = None
    try:
        aside = Path(tempfile.mkdtemp(prefix=".rlspeed-overwritten-", dir=run_dir))
        for name in names:
            os.replace(run_dir / name, aside / name)
            moved.append(name)
    except OSError as error:
        for name in moved:  # (all or nothing)
            with contextlib.suppress(OSError):
                os.replace(aside / name, run_dir / name)
        if aside is not None:
            with contextlib.suppress(OSError):
                aside.rmdir()
        raise UserError(f"--overwrite cannot move the run in '{run_dir}' aside ({error.strerror or error}"
                        f"{f': {error.filename}' if error.filename else ''}); nothing was trained.") from None
    _overwritten()[run_dir] = aside


class _CommandState(threading.local):
    """What a command holds until it ends, per thread, as a command runs in one: commands that run in threads at once
    (a sweep's `main([...])` calls) each hold and settle their own."""

    def __init__(self):
        #: run directory -> its lock file's open handle (`_lock_run_dir`). A thread's lock is its own open file:
        #: another thread's command is refused the directory as another process is
        self.run_locks: dict[str, object] = {}
        #: `--overwrite`: run directory -> the hidden directory its replaced run was moved to; a command in another
        #: thread that ends first settles only its own, not a run still training in this one's directory
        self.overwritten: dict[Path, Path] = {}


_COMMAND = _CommandState()


def _overwritten() -> dict[Path, Path]:
    """This thread's command's `--overwrite` moves (`_CommandState.overwritten`)."""
    return _COMMAND.overwritten


def _settle_overwrites(succeeded: bool) -> None:
    """At the end of a command: delete the runs `--overwrite` moved aside, unless the command failed before the new run
    saved a model or a checkpoint (a wrong flag found late, a tracker that refused, an env that failed to start):
    then the new run's files go and the replaced run comes back, said in one line."""
    overwritten = _overwritten()
    while overwritten:
        run_dir, aside = overwritten.popitem()
        if succeeded or _saved_models(run_dir):
            _delete_aside(aside)
            continue
        try:
            _move_back(aside, run_dir)
        except OSError as error:
            print(f"rlspeed: --overwrite: the command failed before the new run saved a model or a checkpoint, and "
                  f"the run it replaced could not be moved back ({error.strerror or error}): it is in '{aside}'.",
                  file=sys.stderr)
            continue
        print(f"rlspeed: --overwrite: the command failed before the new run saved a model or a checkpoint, so "
              f"'{run_dir}' keeps the run it held.", file=sys.stderr)


def _move_back(aside: Path, run_dir: Path) -> None:
    """Put the run `--overwrite` moved into `aside` back in `run_dir`, in place of what the new run wrote there (its
    run files, and whatever has the name of one of the old run's); OSError where something cannot be moved."""
    items = list(aside.iterdir())
    for name in {*RUN_FILES, *(item.name for item in items)}:
        target = run_dir / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
    for item in items:
        os.replace(item, run_dir / item.name)
    aside.rmdir()
    # (the replacing run is undone: a restart of its torchrun job must not go on over the run put back)
    (run_dir / TORCHRUN_JOB_FILE).unlink(missing_ok=True)


def _saved_models(run_dir: Path) -> list[Path]:
    """The model files a run has saved in `run_dir`: its model, its checkpoint, a population's member models (which a
    population that ended before its first checkpoint has alone)."""
    try:
        return [path for path in (run_dir / "model.safetensors", run_dir / "checkpoint.safetensors",
                                  *(run_dir / "members").glob("*.safetensors")) if path.is_file()]
    except OSError:
        return []


#: the prefix a replaced run's folder is renamed to before it is deleted (`_delete_aside`)
_DELETING_PREFIX = ".rlspeed-deleting-"


def _delete_aside(aside: Path) -> None:
    """Delete the folder `aside` of a replaced run, renamed first out of `.rlspeed-overwritten-*`: a deletion cut short
    (Ctrl-C, a kill, a file that cannot be deleted) leaves a folder that `_settle_killed_overwrites` deletes, never
    one it would move back over the new run."""
    doomed = aside.with_name(_DELETING_PREFIX + aside.name.removeprefix(".rlspeed-overwritten-"))
    try:
        os.rename(aside, doomed)
    except OSError:
        doomed = aside
    shutil.rmtree(doomed, ignore_errors=True)


def _settle_killed_overwrites(run_dir: Path) -> None:
    """The `.rlspeed-overwritten-*` folder an `--overwrite` command left in `run_dir` when it was killed before its end
    (SIGKILL, the OOM killer, a power loss), settled as that command would have settled it (`_settle_overwrites`):
    deleted where the new run saved a model, a checkpoint or a population's member models after it was made, else its
    run moved back over the files of the same names the new run wrote (said in one line). Call it holding the
    directory's lock, before this command moves anything aside."""
    try:
        asides = [path for path in run_dir.glob(".rlspeed-overwritten-*")
                  if path.is_dir() and not path.is_symlink() and path not in _overwritten().values()]
        for doomed in run_dir.glob(f"{_DELETING_PREFIX}*"):  # (a deletion cut short)
            if doomed.is_dir() and not doomed.is_symlink():
                shutil.rmtree(doomed, ignore_errors=True)
    except OSError:
        return
    for aside in asides:
        try:
            made = aside.stat().st_mtime  # (its last entry moved in: the new run's files are newer)
            saved = any(path.stat().st_mtime >= made for path in _saved_models(run_dir))
            if saved:
                _delete_aside(aside)
                continue
            if len(asides) > 1:  # (which one the files came from is unknown: left as they are, and said)
                print(f"rlspeed: '{aside}' holds a run that a killed --overwrite command replaced in '{run_dir}', one "
                      f"of {len(asides)} such folders there: move back the one you want, or delete them.",
                      file=sys.stderr, flush=True)
                continue
            _move_back(aside, run_dir)
        except OSError as error:
            print(f"rlspeed: an --overwrite command killed in '{run_dir}' left the run it replaced in '{aside}', "
                  f"which cannot be settled ({error.strerror or error}): move it back or delete it.",
                  file=sys.stderr, flush=True)
            continue
        print(f"rlspeed: an --overwrite command was killed in '{run_dir}' before its new run saved a model or a "
              "checkpoint, so the directory keeps the run it held (moved back).", file=sys.stderr, flush=True)


#: Without --checkpoint-freq, a single run writes its checkpoint at least this often (seconds of training): a crash
#: loses at most about this much (`learn(checkpoint_interval_s=...)`, which also caps saving at 5% of the time)
CHECKPOINT_INTERVAL_S = 60.0

#: The lock file in a run directory: held (flock) by the process that trains there, released when it exits
RUN_LOCK = ".rlspeed.lock"
#: Set by `rlspeed train --nproc` for the workers it starts: the run directory the launcher holds the lock of
RUN_LOCKED_BY_LAUNCHER = "RLSPEED_RUN_LOCKED_BY_LAUNCHER"


def _run_locks() -> dict[str, object]:
    """This thread's command's locked run directories (`_CommandState.run_locks`)."""
    return _COMMAND.run_locks


def _lock_run_dir(run_dir: Path) -> None:
    """One training process per run directory: an exclusive lock on `run_dir/.rlspeed.lock`, held until the command
    ends (`main`) or the process exits (torchrun's workers run under the lock of the command that started them);
    UserError when another process holds it. (Without fcntl, on Windows, nothing is locked.)"""
    from rlspeed.locks import hold_lock

    if os.environ.get(RUN_LOCKED_BY_LAUNCHER) == str(run_dir.resolve()):  # (its launcher holds it)
        return
    locks = _run_locks()
    held_before = len(locks)
    hold_lock(run_dir / RUN_LOCK, locks, f"Another rlspeed process is training in '{run_dir}': wait for it to "
              "finish (or stop it), or give another --out.")
    if len(locks) > held_before:  # (taken now, not already held: no other process works here)
        _settle_killed_overwrites(run_dir)
    # (what a killed writer left between a temporary file's write and its rename: no other process writes here now)
    remove_stale_temporaries(run_dir, ("config.yaml", "summary.json", "metrics.csv", "learning_curve.png",
                                       "learning_curves.png"))


def _release_run_locks() -> None:
    """Release the run directories this thread's command locked (`_lock_run_dir`); another thread's command, still
    training, keeps its own."""
    locks = _run_locks()
    while locks:
        locks.popitem()[1].close()


def _provenance(args: argparse.Namespace, device) -> dict:
    """summary.json's `provenance` (`rlspeed.provenance.provenance`, taken as the command started) with the name of
    the accelerator the run trained on (None on a CPU)."""
    from rlspeed.provenance import accelerator_name, provenance

    recorded = getattr(args, "provenance", None) or provenance(getattr(args, "argv", None))
    return {**recorded, "accelerator": accelerator_name(device)}


def _write_summary(run_dir: Path, summary: dict) -> None:
    """`run_dir/summary.json`: strict JSON (no NaN), non-ASCII text as it is (the file is UTF-8, `write_atomic`)."""
    _write_text(run_dir / "summary.json", strict_json(summary, indent=2, ensure_ascii=False) + "\n")


def _write_config(run_dir: Path, config: dict) -> None:
    """`run_dir/config.yaml`, in the order the keys were given, non-ASCII text as it is."""
    _write_text(run_dir / "config.yaml", yamlfile.dump_run_file(config))


def _say_stale_exports(say, model_file: Path, num_timesteps: int) -> None:
    """A note naming each `rlspeed export` file beside `model_file` (its name with an export format's suffix) made
    from a model of other steps than the `num_timesteps` of the model just saved there, with the command that redoes
    it. The rule for every model file the CLI writes over (a finished, interrupted or resumed run's
    model.safetensors, a population's members/seed_<S>.safetensors): the exports beside it are not replaced, and a
    user deploying one would take it for the new policy."""
    from rlspeed.export import FORMATS

    source = model_file.parent if model_file.name == "model.safetensors" else model_file  # (as `rlspeed export RUN`)
    for format, suffix in FORMATS.items():
        export = model_file.with_suffix(suffix)
        metadata = _export_metadata(export.with_name(f"{export.name}.json"))
        if metadata is None or not export.exists():
            continue
        exported = metadata.get("num_timesteps")
        if exported != num_timesteps:
            steps = f"{exported:,} steps" if isinstance(exported, int) else "other steps"
            say(f"rlspeed: note: {export} is an export of the model at {steps}, not of this {model_file.name} at "
                f"{num_timesteps:,}: redo it with rlspeed export {_shell_path(source)} --format {format} --overwrite.",
                file=sys.stderr)


def _export_metadata(path: Path) -> dict | None:
    """The `.json` metadata `rlspeed export` writes beside an exported policy, read from `path`; None where `path` holds
    none (missing, unreadable, or another file)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and "format" in data and "algo" in data else None


def _ended_summary(path: Path) -> dict | None:
    """The summary.json at `path` of a run that ended, or None: none there, one an interruption wrote (`"interrupted":
    true`) or an error (`"error"`, `_write_ended_by_error`), or an unreadable one (the summary is written last, so a
    damaged one did not end a run)."""
    summary = _run_summary(path)
    if summary is None or summary.get("interrupted") is True or summary.get("error") is not None:
        return None
    # (a population's summary with member_models null: killed before its member models were written, which
    # --resume finishes)
    return None if summary.get("member_models", {}) is None else summary


def _run_summary(path: Path) -> dict | None:
    """A run directory's summary.json as a dict (None where there is none or it cannot be read as one)."""
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) else None


def _finished_summary(path: Path) -> bool:
    """Whether `path` holds the summary.json of a run that ended (`_ended_summary`)."""
    return _ended_summary(path) is not None


def _without_missing_steps_back(path: Path) -> Path:
    """`path` less each 'X/..' whose X does not exist (`new/../run` is `run`): the directory the system reaches, which
    making the path with its parents (`mkdir(parents=True)`) would reach only after making X, left behind empty. An
    X that exists keeps its '..' (X may be a link elsewhere, whose '..' is not X's parent)."""
    kept: list[str] = []
    for part in path.parts:
        if part == ".." and kept and kept[-1] != ".." and not Path(*kept).exists():
            kept.pop()
        else:
            kept.append(part)
    return Path(*kept) if kept else Path(".")


def _made_here(out: str | None) -> tuple[bool, list[Path]]:
    """Asked before `_prepare_run_dir`: whether this command makes the run directory at `out` (None: the default, a new
    one under runs/), and the directories above it that it makes with it (`_missing_parents`): what a run that does not
    start removes again (`_left_clean_if_not_started`, `_remove_empty`)."""
    return out is None or not Path(out).exists(), _missing_parents(out)


def _missing_parents(out: str | None) -> list[Path]:
    """The directories above a run directory at `out` (None: the default, under runs/) that do not exist yet, deepest
    first: `_prepare_run_dir` makes them with it, and a run that does not start removes them with it (while empty)."""
    missing = []
    try:
        path = Path("runs/run" if out is None else out).absolute()
    except OSError:  # (a working directory since removed: `_check_out_makeable` says so)
        return missing
    for parent in path.parents:
        if parent.exists():
            break
        missing.append(parent)
    return missing


def _remove_empty(directories: Sequence[Path]) -> None:
    """Remove `directories` in order while each is empty: a run directory this command made, then the parents it made
    for it (`_missing_parents`, deepest first); the first that holds anything (or cannot be removed) stops it."""
    with contextlib.suppress(OSError):
        for directory in directories:
            directory.rmdir()


@contextlib.contextmanager
def _left_clean_if_not_started(run_dir: Path, created: bool, fresh: bool, parents: Sequence[Path] = ()):
    """On an error escaping the block (a replay buffer that does not fit, an env that fails at its first step, ...),
    where the run produced nothing (its directory holds config.yaml and at most TensorBoard's directory): the
    config.yaml and TensorBoard directory of a `fresh` run (not --resume) are removed, and the directory with them
    where this command `created` it and nothing else is in it, so that a rerun is not refused as "already holds a
    run", and then the `parents` it made for it (`_missing_parents`) that are empty. (Ctrl-C and SIGTERM are not
    errors: the run's interruption handling writes its summary.)"""
    try:
        yield
    except (Exception, KeyboardInterrupt) as error:  # (an interruption that escapes: the run had not started)
        held = [name for name in RUN_FILES if (run_dir / name).exists()]
        # (a fresh run's directory held no run files before it: what is there is this command's; the config, the
        # TensorBoard writer's directory, and a metrics.csv without a row (with its empty plot), made before the first
        # step, say nothing of a run that never trained)
        never_logged = {"metrics.csv", "learning_curve.png"} if _no_rows(run_dir / "metrics.csv") else set()
        if fresh and not set(held) - {"config.yaml", "tensorboard"} - never_logged:
            with contextlib.suppress(OSError):
                (run_dir / "config.yaml").unlink(missing_ok=True)
                for name in never_logged:
                    (run_dir / name).unlink(missing_ok=True)
                shutil.rmtree(run_dir / "tensorboard", ignore_errors=True)
                (run_dir / RUN_LOCK).unlink(missing_ok=True)  # (the command ends here: nothing trains there)
                (run_dir / TORCHRUN_JOB_FILE).unlink(missing_ok=True)  # (a restart finds nothing of its job: checked)
                if created and not any(run_dir.iterdir()):
                    _remove_empty([run_dir, *parents])
        elif (fresh and isinstance(error, UserError) and run_dir not in _overwritten()  # (which puts the old run back)
              and not {"checkpoint.safetensors", "model.safetensors"} & set(held)):
            # (what it wrote, its metrics, helps to see why it failed: kept, and the way to rerun there said)
            raise UserError(f"{str(error).rstrip('.')}. '{run_dir}' keeps what the run wrote ({', '.join(held)}): "
                            "give --overwrite to train there again.") from None
        elif "checkpoint.safetensors" in held and isinstance(error, Exception):
            # (what the crash did not lose, and how to go on from it; an interruption's handler says that itself)
            print(f"rlspeed: {run_dir / 'checkpoint.safetensors'} is kept: --resume --out {run_dir} continues from it "
                  "(once the cause is fixed)", file=sys.stderr, flush=True)
        raise


def _no_rows(path: Path) -> bool:
    """Whether the metrics file `path` is missing or holds no row (at most its header)."""
    try:
        with open(path, encoding="utf-8") as handle:
            return sum(1 for line in handle if line.strip()) <= 1
    except OSError:
        return True


def _default_in_children(owner: int, signum: int) -> None:
    """In a process forked from `owner` within a block that set a signal handler (a subprocess env's worker, which
    its vector env stops with SIGTERM when it closes): the signal's default action, not the parent's handling."""
    if os.getpid() != owner:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _signal_arrived(owner: int, signum: int) -> None:
    """What a handler of Ctrl-C, SIGTERM and the other `STOP_SIGNALS` in a process `owner` does first: in a forked
    child, the signal's default action (`_default_in_children`); after SIGHUP, output to a closed terminal dropped
    (`_quiet_closed_terminal`); and, the process stopping now, no more of the signal a torchrun worker gets when
    torchrun ends (`stop_ending_with_parent`)."""
    _default_in_children(owner, signum)
    _quiet_closed_terminal(signum)
    stop_ending_with_parent()


@contextlib.contextmanager
def _sigterm_raises(signums: tuple[int, ...] = STOP_SIGNALS, waiting: list[int] | None = None):
    """Within the block SIGTERM (and the other `STOP_SIGNALS`) raises `Terminated` (a KeyboardInterrupt), as Ctrl-C
    raises KeyboardInterrupt (`_stop_of`). Yields an empty list: no signal waits to be acted on later (as
    `_stop_after_iteration`'s list can hold one). `signums`: STOPS inside a block where stops wait (`stops_held`,
    whose SIGINT handler holds Ctrl-C too); `waiting`: that block's list, whose first stop, taken from it, raises as
    the block begins."""
    owner = os.getpid()

    def handler(signum, frame):
        _signal_arrived(owner, signum)
        raise _stop_of(signum)

    with handlers_set(handler, signums):
        if waiting:  # (checked once the handlers are set: one that comes after the check raises itself)
            raise _stop_of(waiting.pop(0))
        yield []


#: seconds after the first Ctrl-C or SIGTERM at which a run whose iteration has not ended says so once
#: (`_stop_after_iteration`): an env whose step or reset never returns keeps the iteration from ending
STILL_STOPPING_S = 30.0


@contextlib.contextmanager
def _stop_after_iteration():
    """Within the block the first Ctrl-C (SIGINT) or SIGTERM (or another of `STOP_SIGNALS`) is recorded in the list
    yielded, for the learn loop to stop at the end of its iteration (where its state is whole: it writes its checkpoint
    there); a second signal stops at once (KeyboardInterrupt or `Terminated`), except in a torchrun worker, which
    waits for its peers at the iteration's end whatever comes (torchrun's own deadline ends it). Where the block
    has not ended `STILL_STOPPING_S` after the first signal, a line says so, and that another stops now (from a
    thread: the main thread may be inside an env that never returns). A signal the process was started ignoring
    (SIGINT in a shell's background job) stays ignored."""
    received: list[int] = []
    reminder: list[threading.Timer] = []
    owner = os.getpid()
    # A torchrun worker gets a scheduler's signal and torchrun's own shutdown signal too (a worker stopping at once
    # would leave its peers waiting in collectives); torchrun kills workers that have not ended 30 s after its signal.
    under_torchrun = "TORCHELASTIC_RUN_ID" in os.environ

    def handler(signum, frame):
        _signal_arrived(owner, signum)
        if received and under_torchrun:
            return
        if received:
            raise _stop_of(signum)
        received.append(signum)
        _TAKEN_IN.append(signum)
        if any(over() for over in _TRAINING_OVER):
            return
        if under_torchrun and (os.environ.get("RANK", "0") != "0" or _peer_said_why()):
            return  # (each rank gets the signal: one says it; none where torchrun stops the run for a peer's end)
        print(f"rlspeed: {_signal_name(signum)}: stopping after this iteration "
              + ("(torchrun ends workers 30 s after its signal)" if under_torchrun else "(again to stop at once)"),
              file=sys.stderr, flush=True)
        if not under_torchrun:
            reminder.append(threading.Timer(STILL_STOPPING_S, _say_still_stopping, (signum,)))
            reminder[0].daemon = True
            reminder[0].start()

    try:
        with handlers_set(handler, STOPS):
            yield received
    finally:
        for timer in reminder:
            timer.cancel()


@contextlib.contextmanager
def _training_over_when(over: Callable[[], bool]):
    """Within the block `over()` says whether the run's training is over (`_TRAINING_OVER`)."""
    _TRAINING_OVER.append(over)
    try:
        yield
    finally:
        _TRAINING_OVER.remove(over)


def _say_still_stopping(signum: int) -> None:
    """The line of a run whose iteration has not ended `STILL_STOPPING_S` after the first stop signal `signum`."""
    name = _signal_name(signum)
    print(f"rlspeed: the iteration has not ended {STILL_STOPPING_S:g} s after {name} (an env whose step or reset "
          f"never returns would keep it going): {name} again stops it at once.",
          file=sys.stderr, flush=True)


def _peer_said_why() -> bool:
    """Under `rlspeed train --nproc`: whether another worker of this attempt has ended saying why (torchrun then
    stops the others with SIGTERM, which is no stop a user asked for)."""
    return any(rank != int(os.environ.get("RANK", "0")) for rank in peers_said())


def _stopping(backend: str):
    """How a run stops on Ctrl-C or SIGTERM: at the end of its iteration (`_stop_after_iteration`; under
    torch.distributed every rank at the iteration where any rank got the signal, which torchrun sends to each of its
    workers, so that no rank waits in a collective its peers left: `Algorithm.stop_requested`), or at once
    (`_sigterm_raises`) where the env steps in subprocesses, which a signal to the process group (a terminal's Ctrl-C,
    a scheduler's SIGTERM) stops at once: the iteration could not finish. A torchrun worker always stops at the end
    of its iteration: its env processes are apart from its process group, which torchrun signals
    (`_forked_children_apart`), and ranks stopping at once would stop in different collectives and wait in them for
    their peers until torchrun's deadline killed them."""
    if backend == "gymnasium-async" and not ("TORCHELASTIC_RUN_ID" in os.environ and _children_kept_apart()):
        return _sigterm_raises(STOPS)  # (Ctrl-C too: `_learn_and_save`'s block around it holds stops)
    return _stop_after_iteration()


def _same_population_run(run_dir: Path, algo: str, env_id: str, seeds: list[int], total: int,
                         target: float | None) -> bool:
    """UserError unless the run `run_dir/config.yaml` describes (where there is one) is a population of `algo` on
    `env_id` with `seeds`: --resume continues the same run only. True where that run finished with the budget and
    target given (a batch job's requeue that finds it finished) or trained at least the budget given, whatever the
    target (as a single run's `_trained_enough`): nothing left to train; a finished run asked for a larger budget
    (with another target, or the same one it did not reach) is refused (a population writes no checkpoint at its end
    to go on from). False, to resume, where there is no config.yaml, where the run has not finished (no
    summary.json), and where it finished so but a signal as training ended skipped the final evaluation: with a
    checkpoint, the run resumes from it and ends with that evaluation (training nothing where the checkpoint holds
    the whole budget); without one (a stop before the first checkpoint), it trains again from the beginning."""
    path = run_dir / "config.yaml"
    try:
        config = yamlfile.load_run_file(path.read_text(encoding="utf-8")) if path.exists() else None
    except (OSError, yaml.YAMLError) as error:
        raise UserError(f"--resume: cannot read '{path}' ({error}).") from None
    if not isinstance(config, dict):
        return False
    if "seeds" not in config:
        raise UserError(f"--resume: '{run_dir}' holds a single {config.get('algo')} run (seed {config.get('seed')}), "
                        "not a population: resume it without --seeds, or give another --out.")
    theirs = (config.get("algo"), config.get("env_id"), config.get("seeds"))
    if theirs != (algo, env_id, seeds):
        seed_text = ",".join(map(str, config.get("seeds") or []))
        pairs = (("algorithm", algo, theirs[0]), ("env", env_id, theirs[1]), ("seeds", seeds, theirs[2]))
        differ = " and ".join(what for what, mine, recorded in pairs if mine != recorded)
        raise UserError(f"--resume: '{run_dir}' holds a population of {theirs[0]} on {theirs[1]} with --seeds "
                        f"{seed_text}, not {algo} on {env_id} with these seeds: give the same {differ}, or another "
                        "--out.")
    summary = _ended_summary(run_dir / "summary.json")
    if summary is not None:
        if ((config.get("total_timesteps") == total and config.get("target_return") == target)
                or _trained_enough(summary, total, target)):
            from rlspeed.report import final_evaluation_skipped

            # (a stop as its last iteration ended skipped a member's final evaluation: resumed from its checkpoint,
            # or trained from the beginning where it has none, the run ends with it)
            return not any(final_evaluation_skipped(member) for member in summary.get("members") or [])
        raise _finished_population(run_dir)
    return False


def _finished_population(run_dir, seeds: str = "") -> UserError:
    """The refusal of `--resume` on a population run that finished (`seeds`: "seeds 0,1, " where they are said)."""
    return UserError(f"--resume: '{run_dir}' holds a finished population run ({seeds}its summary.json), which writes "
                     "no checkpoint at its end to train on from: give --overwrite to train it again, or another "
                     "--out.")


def _fits(load, path: Path, what: str):
    """`load()` (a model load or resume); an error from tensors that do not fit the model is one sentence."""
    try:
        return load()
    except UserError as error:
        if str(path) in str(error):
            raise
        raise UserError(f"'{path}': {error}") from error  # the command line names the file it read
    except (RuntimeError, KeyError, ValueError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UserError(f"'{path}' does not fit {what} ({first[:300]}).") from error


def _refuse_missing_schedules(model, checkpoint: Path) -> None:
    """UserError in one sentence where `checkpoint` was saved by a model calling schedule functions (Python's
    `learning_rate=linear_schedule(1e-3)`), whose code a file does not keep and the command line cannot give: its
    learn would refuse, so the resume is refused before it writes anything in the run directory."""
    from rlspeed.algos.base import missing_schedules_words

    if model._schedules_missing:
        plural, given, again = missing_schedules_words(model._schedules_missing)
        raise UserError(f"'{checkpoint}' was saved by a model calling the schedule function{plural} {given} at "
                        f"every update, which a model file does not keep (it holds no code) and the command line "
                        f"cannot give: resume the run in Python ({type(model).__name__}(env, {again}).resume(path), "
                        "then its learn(..., run_dir=DIR) goes on in the run).")


def _train(args, algo_cls, strategy, run_settings: dict, hyper: dict, total: int) -> int:
    main = strategy.is_main
    if args.out is None and strategy.enabled:
        raise UserError("Under torchrun, give --out DIR so that every rank (and a restarted group) uses one run "
                        "directory; `rlspeed train --nproc N` does this for you.")
    from rlspeed.checkpoint import encryption_settings

    args.encryption = encryption_settings()  # a bad key or cipher setting is refused now, not at the first save
    # the model first: a command that cannot train (an env the algorithm cannot act in, ...) must fail before
    # --overwrite deletes the run it would replace, and must leave no empty run directory behind
    _stage("building the envs and the model")
    model = _model(args, algo_cls, hyper, strategy)
    created, parents = _made_here(args.out)
    target, eval_freq = _target_and_eval_freq(args, run_settings, model.spec)
    recorded_eval_freq = eval_freq  # (config.yaml's: a resumed run keeps its own, which its checkpoint follows)
    if target is None and args.eval_freq is None and not getattr(args, "eval_freq_given", False):
        eval_freq = None  # (a shipped preset's eval_freq serves its target: no evaluations; config.yaml says so)
        # (a resumed run's comes from its config.yaml; `--resume` in a directory without a run starts one afresh,
        # which records that none ran, as the same command without it does: else its resume evaluated at the preset's)
        recorded_eval_freq = recorded_eval_freq if "eval_freq" in getattr(args, "resume_run_settings", {}) else None
    if args.init_from is not None and not _resumes_checkpoint(args):
        try:  # (a resumed run's checkpoint holds its weights: the file it started from may be gone since)
            model.set_parameters(args.init_from)
        except UserError as error:
            model.close()
            raise UserError(f"--init-from: {error}") from None
    if args.dry_run:
        with contextlib.closing(model):
            return _print_dry_run(args, _solo_config(args, algo_cls, model, total, target, recorded_eval_freq))
    run_dir = _prepare_workers_run_dir(args, algo_cls.name, strategy,
                                       finished_enough=lambda ended: _trained_enough(ended, total, target))
    _stage("starting the run", run_dir=run_dir)
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    checkpoint_freq = args.checkpoint_freq
    if checkpoint_freq is None and (args.resume or int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) > 0):
        checkpoint_freq = max(total // 20, 1)  # restarts resume from here: at most this many steps are lost
    checkpoint = run_dir / "checkpoint.safetensors"
    resumed_from = None
    if main and not args.resume and restarts == 0 and checkpoint.exists():
        # A fresh run under torchrun in a reused --out: a restart before this run's first checkpoint must not resume
        # from the checkpoint of an earlier run.
        checkpoint.unlink()
    ended = _ended_summary(run_dir / "summary.json") if args.resume and not checkpoint.exists() else None
    if (ended is not None and restarts == 0 and (run_dir / "model.safetensors").exists()
            and _trained_enough(ended, total, target)):
        # (a finished run whose checkpoint was never written, as a run shorter than a timed checkpoint's interval
        # writes none: a requeue of its command finds it finished, as it does with one)
        if ended.get("final_eval") is not None:
            if main:
                _say_nothing_left(ended, target, checkpoint=False)
                _say_unapplied_settings(run_dir / "config.yaml", model, args,
                                        budget={"total_timesteps": total, "target_return": target})
            return 0
        # (a signal skipped its final evaluation: the model, which `save` writes whole as a checkpoint, is resumed
        # below, and nothing trains before the evaluation, as from a checkpoint of the whole budget)
        checkpoint = run_dir / "model.safetensors"
    if args.resume and restarts == 0 and not checkpoint.exists() and main:
        _say_for(args)(f"rlspeed: --resume: no {checkpoint} yet, so training starts from scratch (it is written "
                       "every --checkpoint-freq steps, by default 1/20 of the budget with --resume or "
                       "--max-restarts)", flush=True)
    if (args.resume or restarts > 0) and checkpoint.exists():
        _keep_run_seed(args, model, run_dir / "config.yaml")
        _stage("loading the checkpoint", run_dir=run_dir)
        model.make_training_env()
        try:
            with warnings.catch_warnings():  # (--env-kwargs with --resume changes the options: the run says so)
                warnings.simplefilter("ignore", OtherEnvOptionsWarning)
                _fits(lambda: model.resume(checkpoint), checkpoint, f"this {algo_cls.__name__} model (did --set "
                      "change its networks since the checkpoint was written?)")
        except UserError as error:
            from rlspeed.checkpoint import KeyNeeded

            # (a checkpoint only its key opens is whole: the key is the fix, and the model needs it as well)
            if not (run_dir / "model.safetensors").exists() or isinstance(error, KeyNeeded):
                raise
            raise UserError(f"{error} The run's model.safetensors is kept (rlspeed eval {_shell_path(run_dir)} "
                            "evaluates it); --overwrite starts the run afresh.") from None
        _refuse_missing_schedules(model, checkpoint)  # (before config.yaml: a refusal writes nothing in the run)
        resumed_from = model.num_timesteps
        restarts = max(restarts, model.restarts)
        _stage("starting the run", run_dir=run_dir)
    run_total = total  # the run's budget (config.yaml), of which a resumed run trains what is left
    if resumed_from is not None:
        total = max(total - resumed_from, 0)
    ended = _ended_summary(run_dir / "summary.json") if resumed_from is not None else None
    # (reached: as the checkpoint records it, or, for an rlspeed whose checkpoints did not, as the run's summary does)
    reached = resumed_from is not None and target is not None and (_reached_before(model, target) or (
        ended is not None and ended.get("steps_to_target") is not None and ended.get("target_return") == target))
    # (a finished run: left as it is, config.yaml too; one whose final evaluation a signal skipped or cut short, its
    # summary.json without final_eval, goes on below: nothing trains, and the model is evaluated, as it would have been)
    if (ended is not None and (total <= 0 or reached) and ended.get("final_eval") is not None
            and (run_dir / "model.safetensors").exists()):
        if main:
            _say_nothing_left(ended, target, reached)
            _say_unapplied_settings(run_dir / "config.yaml", model, args,
                                    budget={"total_timesteps": run_total, "target_return": target})
        return 0
    if resumed_from is not None:
        _refuse_budget_below_trained(run_dir, run_total, resumed_from, "steps the run has trained",
                                     "its final evaluation and model")
    config = _solo_config(args, algo_cls, model, run_total, target, recorded_eval_freq)
    if main and resumed_from is not None:
        _say_changed_settings(run_dir / "config.yaml", config, resumed_from)
    if main:
        _write_config(run_dir, config)
    if main and resumed_from is None:  # (a run starting afresh is a W&B run of its own, not an earlier attempt's)
        (run_dir / "wandb" / "run-id").unlink(missing_ok=True)
    tracker = None
    try:
        with _left_clean_if_not_started(run_dir, created, fresh=main and not args.resume and restarts == 0,
                                        parents=parents):
            _stage("starting the W&B run" if args.track else "starting the run", run_dir=run_dir)
            callbacks, tracker = _run_callbacks(args, config, run_dir) if main else ([], None)
            return _learn_and_save(args, algo_cls, strategy, model, run_dir, target, eval_freq, total, checkpoint,
                                   checkpoint_freq, restarts, resumed_from, callbacks, tracker)
    except Exception as error:
        if tracker is not None:  # (the W&B run ends as the command does: its exit code, summary.json's "error")
            ended = _run_summary(run_dir / "summary.json") if main else None
            code = 75 if isinstance(error, Busy) else 2 if isinstance(error, UserError) else 1
            tracker.finish(ended if ended and ended.get("error") else None, exit_code=code)
        raise
    finally:
        if tracker is not None:
            tracker.finish(exit_code=1)  # (a no-op when the run finished it with its summary)


def _solo_config(args, algo_cls, model, run_total: int, target, eval_freq) -> dict:
    """A single run's config.yaml: what it trains, with which settings and hyperparameters (a preset too)."""
    return {"algo": algo_cls.name, "env_id": args.env_id, "seed": args.seed, "device": str(model.device),
            "env_backend": model.env_backend, "total_timesteps": run_total, "target_return": target,
            "eval_freq": eval_freq, "eval_episodes": _eval_episodes(args), "accelerate": args.accelerate,
            "gym_packages": args.gym_packages, "preset": args.preset_info, "nan_policy": args.nan_policy,
            "env_kwargs": model.spec.env_kwargs or None,
            # (the checkpoint settings asked for, which --resume keeps; None: one every CHECKPOINT_INTERVAL_S)
            "checkpoint_freq": args.checkpoint_freq, "save_replay_buffer": bool(args.save_replay_buffer),
            "video_every": args.video_every,  # (the videos asked for, which --resume keeps filming)
            # (a CPU's results depend on the thread count: the order of its sums)
            "threads": _torch_threads(),
            # (so do the processes': each steps its share of the envs with a seed of its own, and the gradients are
            # averaged over them)
            "processes": model.strategy.world_size,
            # (the model file whose networks the run started from: --resume before a checkpoint starts from it again)
            "init_from": args.init_from, "hyperparameters": _plain(model.config)}


def _refuse_with_dry_run(args: argparse.Namespace) -> None:
    """UserError for a flag `--dry-run` cannot show: it builds the model of a new run in this process and trains
    nothing."""
    for flag, given, why in (("--resume", args.resume, "the run's config.yaml holds its settings"),
                             ("--nproc", args.nproc is not None, "it shows one process's settings: drop --nproc"),
                             ("--overwrite", args.overwrite, "a dry run writes nothing")):
        if given:
            raise UserError(f"--dry-run does not apply with {flag} ({why}): drop one of them.")
    if args.out is not None:  # (a run directory the run could not make: said now, as the run would say it)
        _check_out_makeable(Path(args.out))


def _print_dry_run(args: argparse.Namespace, config: dict) -> int:
    """`--dry-run`: the preset's line and notes (`_say_preset`) on stderr, the config.yaml the command would write on
    stdout (the notes of building the model went to stderr), and a line on stderr saying nothing was trained or
    written; returns 0."""
    def say(*values, file=None, flush: bool = False) -> None:  # (stdout holds the YAML alone; --quiet keeps notes)
        if file is not None or not getattr(args, "quiet", False):
            print(*values, file=sys.stderr, flush=flush)

    _say_preset(args, say)
    stdout = getattr(args, "dry_run_stdout", sys.stdout)
    stdout.write(yamlfile.dump_run_file(config))
    stdout.flush()
    kind = ("a population's, which --preset does not take" if "seeds" in config
            else "a preset file too: --preset FILE trains with them")
    print(f"rlspeed: dry run: the settings above are the config.yaml this command would write ({kind}); nothing was "
          "trained or written", file=sys.stderr, flush=True)
    return 0


def _trained_enough(ended: dict, total: int, target) -> bool:
    """Whether the finished run `ended` (its summary.json) trained the budget `total` or reached `target`."""
    steps = ended.get("total_timesteps")
    return (isinstance(steps, int) and steps >= total) or _summary_reached(ended, target)


def _summary_reached(ended: dict, target) -> bool:
    """Whether the finished run `ended` (its summary.json) reached `target`."""
    return target is not None and ended.get("steps_to_target") is not None and ended.get("target_return") == target


def _say_unapplied_settings(path: Path, model, args: argparse.Namespace, hyperparameters: dict | None = None,
                            budget: dict | None = None) -> None:
    """After a `--resume` that finds its run (solo `model` or population) finished: one line naming the
    hyperparameters (default: the model's), evaluation episodes, run settings and `budget` (the `total_timesteps` and
    `target_return` given) that differ from the run's config.yaml, which nothing applies (no step trains, the final
    evaluation is not run again), rather than leaving them unsaid."""
    before = _run_config(path)
    if not before:
        return
    old, new = before.get("hyperparameters") or {}, _plain(model.config) if hyperparameters is None else hyperparameters
    changed = {key: (old[key], new[key]) for key in new if key in old and old[key] != new[key]}
    given = {"eval_episodes": _eval_episodes(args), "checkpoint_freq": args.checkpoint_freq,
             "threads": args.threads, "env_backend": model.env_backend, "device": str(model.device),
             "processes": getattr(getattr(model, "strategy", None), "world_size", None)}
    changed.update({key: (before[key], value) for key, value in given.items()
                    if before.get(key) is not None and value is not None and before[key] != value})
    # (a None among `given` is a setting not given; a budget's None is a setting: no target, which --resume keeps
    # unless one is given)
    changed.update({key: (before[key], value) for key, value in (budget or {}).items()
                    if key in before and before[key] != value})
    if changed:
        print(f"rlspeed: note: nothing trains, so these settings go unused: "
              f"{', '.join(f'{key} {a} -> {b}' for key, (a, b) in changed.items())} (config.yaml keeps the run's)",
              file=sys.stderr, flush=True)


def _say_nothing_left(ended: dict, target, reached: bool | None = None, checkpoint: bool = True) -> None:
    """The line of a `--resume` that finds its run finished (`reached`: its target; None: as its summary says;
    `checkpoint`: whether one is there to train on from)."""
    reached = _summary_reached(ended, target) if reached is None else reached
    if not checkpoint:
        print("rlspeed: nothing left to train: the run finished (its summary.json); it has no checkpoint.safetensors "
              "to train on from, so --overwrite trains it again", flush=True)
        return
    print(f"rlspeed: nothing left to train: the run reached its target {target:g} (its summary.json); "
          "--target-return none or a higher target trains on" if reached else
          "rlspeed: nothing left to train: the run finished its budget (its summary.json); a larger "
          "--total-timesteps continues it", flush=True)


def _given_options(argv: list[str], command: str) -> set[str]:
    """The `dest` names of the options this command line gives (abbreviated ones included), found by parsing it
    again with every default of `command` suppressed."""
    parser = build_parser()
    for action in _commands(parser)[command]._actions:
        if action.option_strings:
            action.default = argparse.SUPPRESS
    return set(vars(parser.parse_args(argv)))


def _resume_settings(args: argparse.Namespace) -> None:
    """`--resume` continues a run with the settings it was started with: each flag not on this command line takes
    the value the run's config.yaml records (env backend, acceleration, NaN policy, a population's checkpoint
    interval), and without `--preset` (or with the one the run used) the recorded hyperparameters (a population's
    per-member values too) and run settings (budget, target, evaluation frequency) replace the preset's; `--set` and
    the flags given still override them (a change is named when the run resumes). Nothing happens without a
    config.yaml of this algorithm and env."""
    if args.out is None:
        return
    config = _run_config(Path(args.out) / "config.yaml")
    # (a config.yaml there that cannot be read is a damaged one; a directory without one may be a Python run's,
    # `learn(run_dir=...)`, which writes none: it resumes with the given settings, as before)
    if not config and (Path(args.out) / "config.yaml").exists():
        # (--overwrite replaces a directory's files only where something there is known as rlspeed's: a config.yaml
        # that cannot be read may be anyone's, so without such a file the advice is to move it aside)
        again = ("start the run again with --overwrite" if _holds_rlspeed_run(Path(args.out)) else
                 f"move or delete it to start the run again there (nothing else in '{args.out}' is known as "
                 "rlspeed's, so --overwrite would refuse the directory), or give another --out")
        raise UserError(f"--resume: '{Path(args.out) / 'config.yaml'}' is empty or damaged, so the settings "
                        f"the run in '{args.out}' was started with are unknown (the preset's would replace them "
                        f"silently): restore it, or {again}.")
    if not (isinstance(config.get("algo"), str) and isinstance(config.get("env_id"), str)):
        return  # (no run's config.yaml: `_prepare_run_dir` refuses a directory of someone else's files)
    if config.get("algo") != args.algo.lower() or config.get("env_id") != args.env_id:
        # (resumed, its config.yaml and metrics would be replaced by another run's)
        algo, env = config.get("algo"), config.get("env_id")
        held = (f"a population of {algo} on {env}" if isinstance(config.get("seeds"), list)
                else f"a {algo} {env} run")
        raise UserError(f"--resume: '{args.out}' holds {held}, not {args.algo.lower()} {args.env_id}: resume it with "
                        "its algorithm and env, or give another --out.")
    if isinstance(config.get("seeds"), list) and getattr(args, "seeds", None) is None:
        seeds = ",".join(str(seed) for seed in config["seeds"])
        if _finished_summary(Path(args.out) / "summary.json"):  # (resuming it as a population would be refused too)
            raise _finished_population(args.out, f"seeds {seeds}, ")
        raise UserError(f"'{args.out}' holds a population's run (seeds {seeds}): resume it as a population "
                        f"(rlspeed train {args.algo} {args.env_id} --seeds {seeds} --out {args.out} --resume).")
    if "seeds" not in config and getattr(args, "seeds", None) is not None:  # (as `_same_population_run` says)
        raise UserError(f"--resume: '{args.out}' holds a single {config.get('algo')} run (seed {config.get('seed')}), "
                        "not a population: resume it without --seeds, or give another --out.")
    given = _given_options(getattr(args, "argv", []), "train")
    several = args.nproc is not None or _under_torchrun()
    for key in ("env_backend", "accelerate", "nan_policy"):
        if key == "accelerate" and several:  # (`--accelerate auto` is for one process; not taken over silently)
            continue
        if key not in given and config.get(key) is not None:
            setattr(args, key, str(config[key]))
    if "env_kwargs" not in given and isinstance(config.get("env_kwargs"), dict):
        args.resume_env_kwargs = config["env_kwargs"]
    freq = config.get("checkpoint_freq")  # (the checkpoint interval the run was given)
    if "checkpoint_freq" not in given and isinstance(freq, int) and not isinstance(freq, bool) and freq >= 1:
        args.checkpoint_freq = freq
    episodes = config.get("eval_episodes")  # (the run's evaluations; a config.yaml without it: EVAL_EPISODES)
    if "eval_episodes" not in given and isinstance(episodes, int) and not isinstance(episodes, bool) and episodes >= 1:
        args.eval_episodes = episodes
    video_every = config.get("video_every")  # (a run that filmed goes on filming at its interval)
    if ("video_every" not in given and isinstance(video_every, int) and not isinstance(video_every, bool)
            and video_every >= 1):
        args.video_every = video_every
    if "init_from" in given and (Path(args.out) / "checkpoint.safetensors").exists():
        _refuse_other_init_file(args, config.get("init_from"))
    if "init_from" not in given and isinstance(config.get("init_from"), str):
        args.init_from = config["init_from"]
    if "save_replay_buffer" not in given and config.get("save_replay_buffer") is True:  # (else its replay file
        args.save_replay_buffer = True  # would stay at the rows of the first attempt)
        args.save_replay_buffer_from_run = True
    threads = config.get("threads")
    if "threads" not in given and isinstance(threads, int) and not isinstance(threads, bool) and threads >= 1:
        args.threads = threads  # (the thread count changes a CPU's sums: a resume keeps the run's)
        args.threads_from_run = True
    recorded = config.get("hyperparameters")
    # (--preset naming the preset the run already used changes nothing: the recorded values, --set's included, stay)
    requested = config["preset"].get("requested") if isinstance(config.get("preset"), dict) else None
    same_preset = requested is not None and str(args.preset) == requested
    if isinstance(recorded, dict) and ("preset" not in given or same_preset):
        args.resume_hyperparameters = recorded
        args.resume_preset = config.get("preset")
        # (a recorded None is kept: no target, or learn's own evaluation frequency, not the preset's)
        args.resume_run_settings = {key: config[key] for key in ("total_timesteps", "eval_freq", "target_return")
                                    if key in config and (config[key] is not None or key != "total_timesteps")}


def _refuse_other_init_file(args: argparse.Namespace, recorded) -> None:
    """UserError where `--resume --init-from FILE` names another file than the one the run's networks started from
    (config.yaml's `init_from`, `recorded`; None: from scratch): the run goes on from its checkpoint's weights, so
    config.yaml would record a start the run never had. The same file is config.yaml's path again."""
    named = local_path(args.init_from).resolve()
    if isinstance(recorded, str) and Path(recorded) in (named, named / "model.safetensors"):
        args.init_from = recorded  # (config.yaml's, resolved, stays)
        return
    started = f"from the networks of '{recorded}'" if isinstance(recorded, str) else "from scratch"
    raise UserError(f"--init-from applies where a run starts: the run in '{args.out}' started {started} and goes on "
                    "from its checkpoint; drop --init-from, or give another --out for a new run from that file.")


def _run_config(path: Path) -> dict:
    """A run directory's config.yaml as a dict ({} where there is none or it cannot be read)."""
    try:
        data = yamlfile.load_run_file(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def _keep_run_seed(args, model, path: Path) -> None:
    """A resumed run keeps the seed it was started with (its random state is in the checkpoint; the seed also names
    its evaluation episodes and the episodes fresh Gymnasium envs start): without --seed the run's is taken, and
    another --seed is refused."""
    seed = _run_config(path).get("seed")
    if seed is None or seed == args.seed:
        return
    if "seed" in _given_options(getattr(args, "argv", []), "train"):
        raise UserError(f"--resume continues the run with its own seed {seed} (its random state is in the "
                        f"checkpoint): drop --seed {args.seed}, or train a new run with it.")
    args.seed = model.seed = seed


#: config.yaml's settings of how a run trains (not what it learns) that a --resume may change, named when it does
RESUMED_RUN_SETTINGS = ("device", "env_backend", "accelerate", "nan_policy", "checkpoint_freq", "save_replay_buffer",
                        "threads", "processes", "video_every")


def _say_changed_settings(path: Path, config: dict, at_steps: int) -> None:
    """Before a resumed run rewrites its config.yaml: one line naming the hyperparameters, run settings (budget, target,
    evaluation frequency, `RESUMED_RUN_SETTINGS`) and env options that differ from the ones the run was started with
    (they apply from the resume on; the checkpoint's weights and state stay), and `config["changes"]` (written with
    it) keeps each resume's changes with the step it made them at, [{"at_steps", "settings": {key: [before, after]}}],
    the earlier ones included."""
    before = _run_config(path)
    if not before:
        return
    old, new = before.get("hyperparameters") or {}, config["hyperparameters"]
    changed = {key: [old[key], new[key]] for key in new if key in old and old[key] != new[key]}
    # (a config.yaml an rlspeed before --eval-episodes wrote: its run evaluated EVAL_EPISODES episodes)
    before = {"eval_episodes": EVAL_EPISODES, **before}
    changed.update({key: [before.get(key), config.get(key)]
                    for key in ("total_timesteps", "target_return", "eval_freq", "eval_episodes", "env_kwargs",
                                *RESUMED_RUN_SETTINGS)
                    if (key in before or key == "env_kwargs") and key in config and before.get(key) != config[key]})
    history = before.get("changes") if isinstance(before.get("changes"), list) else []
    if changed:
        history = [*history, {"at_steps": int(at_steps), "settings": changed}]
        print(f"rlspeed: --resume with other settings than the run started with: "
              f"{', '.join(f'{key} {a} -> {b}' for key, (a, b) in changed.items())} (they apply from here on; "
              "config.yaml now records them, and its changes list when)", file=sys.stderr, flush=True)
    if history:
        config["changes"] = history


def _run_callbacks(args, config: dict, run_dir: Path) -> tuple[list, object]:
    """The callbacks `--video-every` and `--track` ask for, and the W&B tracker (None without --track); both
    checked here, before training: a missing package is one sentence now, not after the run."""
    callbacks, tracker = [], None
    if args.video_every is not None:
        from rlspeed.video import check_video_support

        check_video_support(args.env_id, env_kwargs=config.get("env_kwargs"))
    if args.track:
        from rlspeed.tracking import WandbCallback, WandbTracker

        tracker = WandbTracker(config, run_dir=run_dir, project=args.wandb_project, entity=args.wandb_entity)
        callbacks.append(WandbCallback(tracker))
    if args.video_every is not None:
        from rlspeed.callbacks import VideoRecorderCallback

        callbacks.append(VideoRecorderCallback(args.video_every, run_dir / "videos", overwrite=True,  # (the run's own)
                                               on_video=tracker.log_video if tracker is not None else None))
    return callbacks, tracker


def _say_for(args: argparse.Namespace, main: bool = True):
    """How `train` prints what it is doing: `_print_beside_bars` on the first process (`main`), nothing on the
    others; under `--quiet`, only the lines that go to stderr (notes and warnings; errors are the command's own). The
    result line is printed with `_print_beside_bars` itself; `--quiet` turns the progress bar off as `--no-progress`
    does (`_main`)."""
    if not main:
        return lambda *values, **kwargs: None
    if not getattr(args, "quiet", False):
        return _print_beside_bars

    def say(*values, file=None, flush: bool = False) -> None:
        if file is not None and file is not sys.stdout:
            _print_beside_bars(*values, file=file, flush=flush)

    return say


def _replay_footprint(say, saved_in: Path | None):
    """A callback saying the replay buffer's footprint when training starts (the buffer is made by learn), and where
    checkpoints in the run directory `saved_in` hold it (--save-replay-buffer), whether its disk has room for them."""
    from rlspeed.callbacks import BaseCallback

    class ReplayFootprint(BaseCallback):
        def _on_training_start(self) -> None:
            buffer = getattr(self.model, "buffer", None)
            if buffer is not None:
                say(f"rlspeed: {buffer.describe()}", flush=True)
                if saved_in is not None:
                    _warn_replay_disk(buffer.nbytes, saved_in)

    return ReplayFootprint()


def _warn_replay_disk(buffer_bytes: int, run_dir: Path) -> None:
    """One line where the disk holding `run_dir` has no room for the replay files of checkpoints once the buffer of
    `buffer_bytes` is full: each is written beside the previous one, which stays until it is whole (2 buffers'
    bytes, more than the current checkpoint's file; a finished run's model.replay.safetensors, which a --resume keeps
    until the new end, is on disk already). Said at the start: the checkpoint that does not fit stops the run hours
    later (`rlspeed.checkpoint`'s check before each write)."""
    free = free_disk_bytes(run_dir)
    if free is None:  # (a file system that does not say: each write checks for itself)
        return
    replay = run_dir / "checkpoint.replay.safetensors"
    held = replay.stat().st_size if replay.is_file() else 0
    more = 2 * buffer_bytes - held
    if more > free:
        print(f"rlspeed: warning: --save-replay-buffer needs {size_text(more)} more disk once the replay buffer "
              f"is full (each checkpoint writes its {size_text(buffer_bytes)} replay file beside the previous one) "
              f"and the disk holding '{run_dir}' has {size_text(free)} free: the run stops at the first checkpoint "
              "that does not fit unless space is freed there (or buffer_size is smaller).", file=sys.stderr,
              flush=True)


def _warn_idle_accelerator(args: argparse.Namespace, device) -> None:
    """With `--device auto` (the default) on the CPU: one line where an accelerator's software is here but unusable
    (a missing torch_npu, a CPU-only torch beside an NVIDIA driver), as `rlspeed doctor` would say."""
    if device.type != "cpu" or str(getattr(args, "device", "auto")).lower() != "auto":
        return
    from rlspeed.diagnostics.doctor import idle_accelerator

    idle = idle_accelerator()
    if idle is not None:
        print(f"rlspeed: warning: training on the CPU: {idle}; `rlspeed doctor` checks the whole stack",
              file=sys.stderr, flush=True)


def _reached_before(model, target) -> bool:
    """Whether the resumed run's checkpoint records this target as reached (`LearnResult.reached`)."""
    loop = model._loop
    return target is not None and loop.get("steps_to_target") is not None and loop.get("target_return") == target


def _say_no_video(say, callbacks: list, steps: int) -> None:
    """A note where `--video-every` filmed nothing: the run ended (at its target, say) before the first video was
    due, which would otherwise pass unsaid (a video that could not be written has its own warning)."""
    from rlspeed.callbacks import VideoRecorderCallback

    for callback in callbacks:
        if (isinstance(callback, VideoRecorderCallback) and callback.first_due is not None
                and steps < callback.first_due):
            say(f"rlspeed: note: --video-every {callback.video_every} filmed no video: training ended at {steps:,} "
                f"steps, before the first was due at {callback.first_due:,}; a smaller --video-every films sooner.",
                file=sys.stderr)


def _learn_and_save(args, algo_cls, strategy, model, run_dir: Path, target, eval_freq, total: int, checkpoint: Path,
                    checkpoint_freq, restarts: int, resumed_from, callbacks: list, tracker) -> int:
    """`_train`'s second half: learn (with `callbacks`), then save the model, evaluate and write summary.json (also
    to the W&B `tracker`); returns the exit code."""
    main = strategy.is_main
    say = _say_for(args, main)
    if strategy.enabled:
        say(f"rlspeed: {strategy.world_size} processes ({strategy.backend}), "
            f"{_count(model.config.num_envs // strategy.world_size, 'env')} each")
    if resumed_from is not None:
        how = ("torchrun restarted the group" if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
               else "--resume")
        say(f"rlspeed: resumed from {checkpoint} at {resumed_from:,} steps ({how}; resume {restarts} of this run)")
    # (a checkpoint of the whole budget, or of this target reached: the run stopped after training, before its model
    # and summary were written; `_train` left a finished run as it is)
    reached = resumed_from is not None and _reached_before(model, target)
    trained = total <= 0 or reached
    if trained and reached:
        model.result.target_return = target
        model.result.steps_to_target = int(model._loop["steps_to_target"])
        model.result.time_to_target_s = float(model._loop["time_to_target_s"])
        model.result.target_confirmation = model._loop.get("target_confirmation")  # (None from an older rlspeed)
    _say_preset(args, say)
    say(f"rlspeed: run directory {run_dir}")  # (at the start too: a run stopped or watched is found there)
    if trained:
        # (the run's model file where no checkpoint was written: --resume resumes it, as a checkpoint)
        held = "the model file model.safetensors" if checkpoint.name == "model.safetensors" else "the checkpoint"
        why = "its run reached the target" if reached else f"{held} holds the whole budget"
        say(f"rlspeed: {why}: nothing left to train; saving the model and evaluating it", flush=True)
    else:
        say(f"rlspeed: training {algo_cls.__name__} on {args.env_id} ({model.env_backend} envs, "
            f"device {model.device}), up to {total:,} {'more ' if resumed_from is not None else ''}steps"
            f"{_whole_iterations(total, model.steps_per_iteration)}"
            + (f", after the {resumed_from:,} the run has trained" if resumed_from is not None else "")
            + (f", stopping at eval return >= {target:g}" if target is not None else ""), flush=True)
    if main:
        _warn_idle_accelerator(args, model.device)
    steps_before = model.num_timesteps
    if resumed_from is None and main:
        _forget_unsaved_attempt(run_dir)
    interrupted = None
    # The first Ctrl-C or SIGTERM stops at the end of the iteration, where the model's state is whole (the checkpoint
    # then resumes as the uninterrupted run; several processes stop together, at the iteration where any rank got
    # it); a second stops at once.
    if main and model.keeps_replay_buffer:  # (the replay buffer's footprint, said once it is made)
        callbacks = [*callbacks, _replay_footprint(say, run_dir if model.save_replay_buffer else None)]
    run = {"args": args, "algo": algo_cls.name, "model": model, "target": target, "strategy": strategy,
           "restarts": restarts, "resumed_from": resumed_from, "checkpoint_freq": checkpoint_freq,
           "tracker": tracker, "run_dir": run_dir}
    signals: list[int] = []
    # (a run a signal stopped gets its learning_curve.png last, after the files `_save_interrupted` writes: learn drew
    # it first, and on a loaded machine the plot outlasted a scheduler's grace period, whose kill left none of them)
    model._curve_on_stop = False
    # From here to the end a stop waits (`held`) wherever no narrower block sets its handlers: once the training's
    # own handling of stops ends, the model (a finished training's too) and summary.json are written whole; the final
    # evaluation, W&B's finish and the drawing of the learning curve are what a stop cuts short
    # (`_sigterm_raises(STOPS, held)`).
    owner = os.getpid()
    with stops_held(lambda signum: _signal_arrived(owner, signum)) as held:
        with contextlib.nullcontext(signals) if trained else _stopping(model.env_backend) as signals:
            if held:  # (one that came as the training's handlers were set: it stops the run as one before them)
                raise _stop_of(held[0])
            _stage(None)  # (the training's own handling of a stop says what it saved)
            model.stop_requested = lambda: bool(signals)  # (under torch.distributed: a signal to any rank stops all)
            try:
                if not trained:
                    model.learn(total, progress_bar=not args.no_progress, target_return=target, eval_freq=eval_freq,
                                eval_episodes=_eval_episodes(args), run_dir=run_dir, checkpoint_freq=checkpoint_freq,
                                # (without a step frequency asked for, a crash still loses at most about this much
                                # training: also beside --resume's 1/20 of the budget, hours of a slow env's steps)
                                checkpoint_interval_s=CHECKPOINT_INTERVAL_S if args.checkpoint_freq is None else None,
                                callback=callbacks or None)
            except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM (Terminated)
                interrupted = stop
            except Exception as error:
                if main:
                    _write_ended_by_error(run, run_dir, error)
                raise
        finished = (trained or model.num_timesteps - steps_before >= total
                    or model.result.steps_to_target is not None)
        if interrupted is None and (signals or model.result.stop_requested) and not finished:
            # (stopped at the end of an iteration, for a signal to this process or, under torchrun, to another rank)
            interrupted = _stop_of(signals[0]) if signals else Terminated("SIGTERM")
        if interrupted is not None:
            code = _save_interrupted(run, run_dir, interrupted, held)
            _stage_run_saved(run_dir)
            return code
        if not main:  # (the other ranks leave with rank 0's code, a stop's as it evaluates too: `leave`)
            return 0
        held[:0] = signals  # (one that came as the last iteration ended: the first the final evaluation meets)
        # (learn drew no learning_curve.png: there was none, or a signal's stop came as it ended)
        code = _save_finished(run, run_dir, held, callbacks, undrawn=trained or model.result.stop_requested)
        _stage_run_saved(run_dir)
    # (read once the block has ended: a stop that comes later raises, `_main` saying it with the stage)
    return _said_as_it_ended(code, held, "model.safetensors and summary.json, with the final evaluation,", run_dir)


def _stage_run_saved(run_dir: Path) -> None:
    """The stage of a run whose files are written, as its block where stops wait ends: a stop that comes later (as
    the command closes its envs and ends) says that the run is saved."""
    _stage("ending the command", left=f"the run is saved in '{run_dir}'")


def _said_as_it_ended(code: int, held: list[int], saved: str, run_dir: Path) -> int:
    """The exit code of a run that ended with `code`, `held` holding the stops that came after all a stop cuts short
    (the final evaluation, W&B's finish) and were not acted on: `code` where it is not 0 or none came; else the first
    stop's (130 or 143), said in one line that names `saved` (what the run wrote). Whenever a stop comes after training
    began, the command ends with the stop's exit code and one line saying what is saved: a script or a scheduler
    reads the same code whether the stop came early or late, and with `--track` or without it."""
    if code or not held:
        return code
    code, name = _stop_said(_stop_of(held[0]))
    print(f"rlspeed: interrupted ({name}) as the run ended: nothing was cut short; {saved} are saved in {run_dir}",
          file=sys.stderr, flush=True)
    _run_said_its_stop(held[0])
    return code


def _run_said_its_stop(signum: int) -> None:
    """Record that the run said its stop `signum` in its line (`_TAKEN_IN`, where no stop taken in during training is
    there already): torchrun's own signal, passing a stop on as the processes leave, is not said again, and the worker
    ends with the said stop's code (`_main`)."""
    if not _TAKEN_IN:
        _TAKEN_IN.append(signum)


def _save_finished(run: dict, run_dir: Path, held: list[int], callbacks: list, undrawn: bool) -> int:
    """`_learn_and_save`'s end after a finished training, in its block where stops wait (`held`, with any that came
    as the training ended): save the model, evaluate it (a stop, one that waits or one that comes meanwhile, skips
    the evaluation: the summary says so) and write summary.json (also to the W&B tracker); returns the exit code.
    learning_curve.png, where learn drew none (`undrawn`), is drawn after the model, or, where a stop skips the
    evaluation, last."""
    from rlspeed.evaluation import evaluation_seed

    args, model, target, tracker = run["args"], run["model"], run["target"], run["tracker"]
    resumed_from, say = run["resumed_from"], _say_for(args, True)
    # (a member of a population of the same seed and steps evaluates on the same episodes)
    eval_seed, episodes = evaluation_seed(args.seed, "final", model.num_timesteps), _eval_episodes(args)
    model.save(run_dir / "model.safetensors")
    if undrawn and not held:
        _draw_learning_curve(run_dir, model.num_timesteps)
        undrawn = False
    try:
        with _sigterm_raises(STOPS, held):  # (a scheduler's signal too: the summary is written, without the evaluation)
            final = model.evaluate(episodes=episodes, seed=eval_seed, progress_bar=not args.no_progress)
    except KeyboardInterrupt as stop:  # (training is done and saved: the summary says so, without the evaluation)
        code, name = _stop_said(stop)
        summary = _summary(run, None)
        _write_summary(run_dir, summary)
        say(_steps_line(summary, model.result, target, resumed_from))
        stopped = _finish_tracker(tracker, summary, held, run_dir, exit_code=code)  # (with the signal's exit code)
        print(f"rlspeed: interrupted ({name}) after training "
              f"finished: model.safetensors and summary.json are saved in {run_dir}, without the final evaluation "
              f"(--resume runs it; {_eval_command(run_dir, eval_seed, episodes)} evaluates the model)", file=sys.stderr,
              flush=True)
        _say_stale_exports(print, run_dir / "model.safetensors", model.num_timesteps)
        if undrawn and stopped is None:
            _draw_curve_last(run_dir, model.num_timesteps, held)
        return code
    except Exception as error:  # (an env's error in the final evaluation ends the run as one in training does)
        _write_ended_by_error(run, run_dir, error, in_training=False)
        raise
    result = model.result
    summary = _summary(run, {"mean": final["mean"], "std": final["std"], "episodes": final["episodes"],
                             "seed": eval_seed, "deterministic": True,
                             **{key: final[key] for key in ("success_rate",) if key in final},
                             **({"unfinished": final["unfinished"]} if final.get("unfinished") else {})})
    try:
        _write_summary(run_dir, summary)
        args.finished_summary = run_dir / "summary.json"  # (`_record_close_error`)
    except UserError as error:  # (a full disk: the trained model is saved, and its evaluation is not lost with it)
        then = ("--resume writes it, evaluating the model again, once there is room"
                if (run_dir / "checkpoint.safetensors").is_file()
                else f"{_eval_command(run_dir, eval_seed, episodes)} repeats the evaluation")
        raise UserError(f"{str(error).rstrip('.')}; the trained model is saved in {run_dir / 'model.safetensors'} "
                        f"(final evaluation {_score(final['mean'])} +/- {_score(final['std'])}), and {then}.") from None
    stopped = _finish_tracker(tracker, summary, held, run_dir)
    say(_steps_line(summary, result, target, resumed_from))
    numerics = summary["numerics"]
    if numerics.get("rollbacks"):  # (the warnings scrolled by: the closing lines say what the model holds)
        say(f"rlspeed: note: {numerics['rollbacks']} rollback(s) of non-finite updates (see summary.json's "
            f"numerics); the last one restored the weights of step {model._numerics.last_finite_timesteps:,}: "
            "lower learning_rate or clip gradients (max_grad_norm).", file=sys.stderr)
    if numerics.get("nonfinite_losses"):  # (the parameters stayed finite, so nothing rolled back: said again here)
        losses = ", ".join(f"{name} from {step:,} steps" for name, step in numerics["nonfinite_losses"].items())
        say(f"rlspeed: note: non-finite losses ({losses}; see summary.json's numerics): updates with such a loss "
            "train little or not at all; scale the rewards down (normalize_reward=True where the algorithm has it).",
            file=sys.stderr)
    if numerics.get("nonfinite_env_rows_masked"):  # (--nan-policy mask: how much of the data it replaced)
        # (the rows counted are each step's and each reset's: an env whose every observation is NaN has more than
        # the steps, which read as more than all of them)
        of = (f"this process's {summary['total_timesteps'] // model.strategy.world_size:,} steps (rank 0)"
              if model.strategy.enabled else f"{summary['total_timesteps']:,} steps")
        say(f"rlspeed: note: --nan-policy mask replaced {numerics['nonfinite_env_rows_masked']:,} env rows holding "
            f"NaN or infinite values by 0 (rows of {of} and of the envs' resets; the first: env "
            f"{numerics['first_nonfinite_env']} at its step {numerics['first_nonfinite_env_step']}).",
            file=sys.stderr)
    _say_no_video(say, callbacks, model.num_timesteps)
    _say_stale_exports(say, run_dir / "model.safetensors", model.num_timesteps)
    success = f", success rate {final['success_rate']:.0%}" if "success_rate" in final else ""
    cut = _cut_short(final.get("unfinished"), episodes)
    _print_beside_bars(f"rlspeed: final evaluation (deterministic, {_episodes(episodes)}{cut}, seed {eval_seed}): "
                       f"{_score(final['mean'])} +/- {_score(final['std'])}{success}")  # (the result: --quiet too)
    say(f"rlspeed: run directory {run_dir}")
    return 0 if stopped is None else _stop_said(stopped)[0]


def _steps_line(summary: dict, result, target, resumed_from) -> str:
    """The line that closes a run's training: its steps, training time and speed, and whether it reached `target`."""
    reached = ""
    if target is not None:
        confirmation = result.target_confirmation or {}
        cut = (f" (confirmed on fresh episodes{_cut_short(confirmation['unfinished'], confirmation['episodes'])})"
               if confirmation.get("unfinished") else "")
        reached = (f"; target {target:g} reached after {result.steps_to_target:,} steps in "
                   f"{result.time_to_target_s:.2f} s{cut}" if result.time_to_target_s is not None
                   else f"; target {target:g} not reached")
    steps = f"{summary['total_timesteps']:,} steps in {summary['train_wall_s']:.2f} s ({summary['sps']:,.0f} steps/s)"
    if resumed_from is not None:  # (what the run has trained in all, and the part of it this command trained)
        steps = f"the whole run: {steps}, {summary['total_timesteps'] - resumed_from:,} of them in this resume"
    return f"rlspeed: {steps}{reached}"


def _write_ended_by_error(run: dict, run_dir: Path, error: Exception, in_training: bool = True) -> None:
    """Where an error (an env's, a bad value found mid-run, a bug) ends a run that logged or checkpointed something:
    summary.json with `"error"` (its type and message), `"stopped_by": "error"` where it came `in_training` (not in
    the final evaluation, after training ended) and the steps trained so far, so that a script collecting
    runs tells it from one still running (which has none) or one that finished (`"error": null`); `--resume` continues
    from its checkpoint as after an interruption (`_ended_summary`). A run that wrote nothing yet is left to
    `_left_clean_if_not_started`, which removes what it made."""
    if _no_rows(run_dir / "metrics.csv") and not (run_dir / "checkpoint.safetensors").exists():
        return
    try:
        summary = _summary(run, None)
    except Exception:  # (the model as the error left it may not describe itself: the run's names still do)
        summary = {"algo": run["algo"], "env_id": run["args"].env_id, "seed": run["args"].seed, "final_eval": None,
                   "interrupted": False, "stopped_by": None}
    summary["error"] = _error_text(error)
    if in_training:
        summary["stopped_by"] = "error"
    with contextlib.suppress(UserError, OSError):  # (the error itself is what the command reports)
        _write_summary(run_dir, summary)


def _record_close_error(args: argparse.Namespace, closing: CloseErrors) -> None:
    """Where a command that finished a run (`args.finished_summary`, its summary.json) exits 1 for an env's close()
    error kept to its end (`CloseErrors`): that summary's `close_error` says it (the first one's type and message,
    and how many more followed, as the error the command shows counts them). `error` stays null: the run finished,
    model and final evaluation saved, so `--resume` has nothing to continue."""
    path = getattr(args, "finished_summary", None)
    summary = _run_summary(path) if closing.errors and path is not None else None
    if summary is None or "close_error" not in summary:
        return
    more = closing.others_note()
    summary["close_error"] = _error_text(closing.errors[0]) + (f" ({more})" if more else "")
    with contextlib.suppress(UserError, OSError):  # (the close() error itself is what the command reports)
        _write_summary(path.parent, summary)


def _error_text(error: Exception) -> str:
    """summary.json's `"error"` for a run `error` ended: its type and message, on one line."""
    return f"{type(error).__name__}: {_one_line(str(error))[:500] or '(no message)'}"


def _draw_learning_curve(run_dir: Path, steps: int) -> None:
    """`learning_curve.png` from metrics.csv's rows up to `steps`, as learn draws it, where learn did not: a run a
    signal stopped (drawn after its saved files, `Algorithm._curve_on_stop`), or one finished by --resume with nothing
    left to train (killed after its last checkpoint, before its learn ended)."""
    if not (run_dir / "metrics.csv").is_file():
        return
    from rlspeed.logging import RunLogger

    try:  # (the file is only read: nothing is logged, so nothing is written to it)
        RunLogger(run_dir, tensorboard=False, continue_from=steps).plot()
    except OSError as error:  # (the plot is a picture of metrics.csv, which holds the numbers)
        warnings.warn(f"learning_curve.png cannot be written in '{run_dir}' ({error.strerror or error}); "
                      "metrics.csv holds the run's metrics.", stacklevel=2)


def _summary(run: dict, final_eval: dict | None, interrupted: bool = False) -> dict:
    """summary.json's fields (docs/cli.md, "The run directory") for the run `_train` describes in `run`: its steps
    and training clock are the whole run's, from its start (before any resume) to now, as its target fields are."""
    args, model, strategy = run["args"], run["model"], run["strategy"]
    result = model.result
    total_timesteps = model.num_timesteps - int(model._loop.get("run_start", model.num_timesteps))
    train_wall_s = float(model._loop.get("train_wall_s", 0.0))
    sps = total_timesteps / train_wall_s if train_wall_s > 0 else 0.0
    summary = {"algo": run["algo"], "env_id": args.env_id, "seed": args.seed, "device": str(model.device),
               "env_backend": model.env_backend, "total_timesteps": total_timesteps,
               "train_wall_s": round(train_wall_s, 4), "sps": round(sps, 1), "target_return": run["target"],
               "time_to_target_s": None if result.time_to_target_s is None else round(result.time_to_target_s, 4),
               "steps_to_target": result.steps_to_target, "target_confirmation": result.target_confirmation,
               "final_eval": final_eval,
               "accelerate": model.acceleration_summary(), "update": model.update_summary(),
               "numerics": model.numerics_report(), "preset": args.preset_info,
               "checkpoint_encryption": getattr(args, "encryption", None), "interrupted": interrupted,
               "stopped_by": _stopped_by(result, interrupted), "error": None, "close_error": None,
               "provenance": _provenance(args, model.device)}
    if hasattr(model, "replay_summary"):  # off-policy: the replay buffer's layout and bytes per transition
        replay = model.replay_summary()
        if replay is None and run["resumed_from"] is not None and run.get("run_dir") is not None:
            # (a resume with nothing left to train makes no buffer: the run's, as its earlier summary.json says)
            replay = (_run_summary(Path(run["run_dir"]) / "summary.json") or {}).get("replay")
        summary["replay"] = replay
    if strategy.enabled or run["resumed_from"] is not None:
        summary["distributed"] = {"world_size": strategy.world_size, "backend": strategy.backend,
                                  # (torchrun's restarts of the group in this command; the run's resumes from
                                  # a checkpoint, by --resume or a restart, in every command so far)
                                  "restarts": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
                                  "resumes": run["restarts"], "resumed_from_timesteps": run["resumed_from"],
                                  "max_lost_timesteps": run["checkpoint_freq"] if run["resumed_from"] is not None
                                  else 0}
    return summary


def _population_stopped_by(summary: dict, total: int) -> str | None:
    """A finished population's summary.json `stopped_by` (a single run's field, `_stopped_by`): what ended training
    before its budget of `total` steps per member: "target" (every member reached it, as a single run's "target") or
    "members_left" (every member left the computation, reached, pruned or diverged: `reached`, `pruned`, `diverged`
    count them); None where it trained its whole budget. "signal" and "error" are those of the summaries written on
    a stop or an error."""
    if summary["reached"] == summary["population"]:
        return "target"
    return "members_left" if summary["total_timesteps"] < total else None


def _stopped_by(result, interrupted: bool) -> str | None:
    """summary.json's `stopped_by`: what ended training before its budget, "signal" (Ctrl-C or SIGTERM, `interrupted`),
    "target" (reached, `steps_to_target`) or a callback's `result.stopped_by`; None where it trained its whole budget
    ("error" is `_write_ended_by_error`'s)."""
    if interrupted:
        return "signal"
    if result.steps_to_target is not None:
        return "target"
    return result.stopped_by


def _save_interrupted(run: dict, run_dir: Path, stop: KeyboardInterrupt, held: list[int]) -> int:
    """After Ctrl-C or SIGTERM, in `_learn_and_save`'s block where stops wait (`held`: its list): save the model, a
    checkpoint (`--resume` continues from it) and summary.json (`"interrupted": true`, no final evaluation), then draw
    learning_curve.png; return 130 or 143."""
    code, name = _stop_said(stop)
    if not run["strategy"].is_main:
        return code
    trained = run["model"]._resume is None  # (else it stopped before training: the checkpoint it resumed from stays)
    if trained:
        run["model"].save(run_dir / "model.safetensors")
        run["model"].save(run_dir / "checkpoint.safetensors")
    training_env = getattr(run["model"], "_env", None)
    if training_env is not None:  # (now, not at exit: subprocess envs stopped mid-step are terminated quietly)
        training_env.close()
    summary = _summary(run, None, interrupted=True)
    steps = summary["total_timesteps"]
    _write_summary(run_dir, summary)
    stopped = _finish_tracker(run["tracker"], summary, held, run_dir, exit_code=code)
    saved = ("saved model.safetensors, checkpoint.safetensors (--resume continues from it) and summary.json"
             if trained else
             "before training resumed; kept checkpoint.safetensors, the one it resumed from (--resume continues from "
             "it), and saved summary.json")
    print(f"rlspeed: interrupted ({name}) after {steps:,} steps: {saved} in {run_dir}", file=sys.stderr, flush=True)
    _run_said_its_stop(signal.SIGTERM if isinstance(stop, Terminated) else signal.SIGINT)  # (another rank's too)
    if trained:  # (the model it saved: exports beside it of other steps are named)
        _say_stale_exports(print, run_dir / "model.safetensors", run["model"].num_timesteps)
    if stopped is None:  # (one that cut W&B short stops the rest: the curve too)
        _draw_curve_last(run_dir, run["model"].num_timesteps, held)
    return code


def _finish_tracker(tracker, summary: dict, held: list[int], run_dir: Path,
                    exit_code: int = 0) -> KeyboardInterrupt | None:
    """The W&B `tracker`'s finish (None: no tracker), last of `_learn_and_save`'s writes, in its block where stops
    wait (`held`): W&B's upload may be long, and without a network it waits as long as W&B does; a stop, one that
    waited included, cuts it short, the run's own files written. That stop is said in a line and returned (None where
    W&B finished)."""
    if tracker is None:
        return None
    try:
        with _sigterm_raises(STOPS, held):
            tracker.finish(summary, exit_code=exit_code)
    except KeyboardInterrupt as stop:
        print(f"rlspeed: interrupted ({_stop_said(stop)[1]}) as Weights & Biases "
              f"finished its run, which W&B may hold without its end; the run's files in {run_dir} are saved.",
              file=sys.stderr, flush=True)
        return stop
    return None


def _draw_curve_last(run_dir: Path, steps: int, held: list[int]) -> None:
    """learning_curve.png after a stop saved the run, last: the slow part, which another stop cuts short (one that
    came while the run was saved too, in `held`)."""
    with contextlib.suppress(KeyboardInterrupt), _sigterm_raises(STOPS, held):
        _draw_learning_curve(run_dir, steps)


def cmd_profile(args: argparse.Namespace) -> int:
    """`rlspeed profile`: train ALGO on ENV_ID (preset, `--set`, flags as for train) for a while under the profiler
    and print where the time goes, per phase of the loop and per operation, with advice; returns the exit code."""
    from rlspeed.diagnostics.profiler import planned_steps, profile_buffer_size, profile_run

    _one_process_only("profile", "each process would profile a run of its own, not the distributed one")
    _import_env_modules(args, "env_id")
    trace = Path(args.trace) if args.trace else None
    if trace is not None and (trace.is_dir() or not trace.parent.is_dir()):
        raise UserError(f"--trace {args.trace}: give a file in an existing directory.")
    if trace is not None:  # (torch's profiler writes the trace by a rename, which would replace /dev/null)
        refuse_special_file(trace, "--trace")
    if trace is not None and trace.is_file() and not _profiler_trace(trace):  # (a trace it wrote is its to rewrite)
        raise UserError(f"--trace {args.trace} exists and is not a trace the profiler wrote; give another --trace, or "
                        "move it away first.")
    if trace is not None:  # (a place it cannot be written to is said now, not after profiling)
        existed = trace.exists()
        try:
            trace.open("a").close()
        except OSError as error:
            raise UserError(f"--trace {args.trace}: cannot write there ({error.strerror}); give a file in a directory "
                            "you can write to.") from None
        if not existed:
            trace.unlink()
    algo_cls, _run_settings, hyper, config = _settings(args)
    buffer_size = profile_buffer_size(config, args.steps)
    if buffer_size is not None:  # (training's buffer, a million transitions in many presets, is not a profile's)
        print(f"rlspeed: replay buffer of {buffer_size:,} transitions, the env steps this profile runs (training's "
              f"{config.buffer_size:,} would cost memory, not time, in a run this short)", file=sys.stderr)
        hyper = {**hyper, "buffer_size": buffer_size}
    model = _model(args, algo_cls, hyper)
    try:  # (its envs closed, as train's are: a close() error is said after the report, `_main`)
        steps, warmup, profiled = planned_steps(model, args.steps)
        print(f"rlspeed: profiling {algo_cls.__name__} on {args.env_id} ({model.env_backend} envs, device "
              f"{model.device}): a warm-up of {warmup:,} env steps, an unprofiled run of {steps:,} (whole "
              f"iterations), then a profiled run of {profiled:,}", file=sys.stderr, flush=True)
        result = profile_run(model, steps=args.steps, trace=trace, say=lambda line: print(line, file=sys.stderr,
                                                                                         flush=True))
    finally:
        model.close()
    print(result, file=sys.stderr if args.json else sys.stdout)  # (--json: stdout holds the JSON alone)
    if trace is not None:
        if not trace.is_file():
            raise UserError(f"the profiler could not write the trace to {trace}.")
        print(f"rlspeed: trace written to {trace} (open it in https://ui.perfetto.dev or chrome://tracing)",
              file=sys.stderr)
    if args.json:
        print(strict_json(result.to_dict()))
    return 0


#: how long `rlspeed train --nproc` waits for the workers a torchrun killed with SIGKILL left (which stop when it
#: ends: `rlspeed.lifetime`) before it kills them, as torchrun itself waits for its workers after its signal
TORCHRUN_GRACE_S = 30.0


def _launch_torchrun(args: argparse.Namespace) -> int:
    """`rlspeed train --nproc N ...`: check what the workers would refuse (settings, num_envs, devices, the run
    directory) once, then start torchrun with N local processes running the same command."""
    import signal
    import subprocess

    if _under_torchrun():
        raise UserError("--nproc starts torchrun itself: under torchrun (WORLD_SIZE is set) leave --nproc out.")
    if args.accelerate == "auto":
        raise UserError("--accelerate auto is not supported with several processes yet; use --accelerate off "
                        "with --nproc.")
    from rlspeed.device import device_count, resolve_device, usable_cores

    device = resolve_device(args.device)
    cores = usable_cores()  # (a SLURM job's or a container's CPUs, not the whole machine's)
    if device.type == "cpu" and args.nproc > cores:  # (before num_envs's advice, which names a multiple of them)
        raise UserError(f"--nproc {args.nproc} is more processes than the {cores} CPU core{'s' * (cores != 1)} this "
                        "command may run on (on the CPU each process trains on a core of its own); start at most that "
                        "many.")
    _algo_cls, _run_settings, _hyper, _config = _settings(args)
    if device.type != "cpu" and args.nproc > device_count(device.type):
        raise UserError(f"--nproc {args.nproc} needs one {device.type} device per process, but "
                        f"{device_count(device.type)} are visible; start at most that many, or use --device cpu.")
    tempfile.gettempdir()  # (torchrun's launcher needs one: none writable is one sentence now, not its traceback)
    created, parents = _made_here(args.out)
    run_dir = _prepare_run_dir(args, _algo_cls.name, checked_before=False)
    _stage("starting torchrun", run_dir=run_dir)
    rest: list[str] = []
    skip = False
    for item in args.argv:  # drop --nproc N / --nproc=N / --max-restarts R from what each worker runs
        if skip:
            skip = False
            continue
        if item in ("--nproc", "--max-restarts"):
            skip = True
            continue
        if item.startswith(("--nproc=", "--max-restarts=")):
            continue
        rest.append(item)
    if args.out is None:
        rest += ["--out", str(run_dir)]
    torchrun = ["--standalone", f"--nproc_per_node={args.nproc}", f"--max-restarts={args.max_restarts}", "-m",
                "rlspeed", *rest]
    command = [sys.executable, "-m", "rlspeed._torchrun", *torchrun]  # (torch.distributed.run, quiet when stopped)
    _say_for(args)("rlspeed: " + shlex.join(["torch.distributed.run", *torchrun]), flush=True)
    # The workers train under this command's lock of the run directory (they must not take it again), so this
    # command lives as long as torchrun does: a Ctrl-C, SIGTERM or SIGHUP to it (or to its process group: torchrun
    # runs in a session of its own, so that it gets one signal, this one) goes to torchrun, which stops its workers
    # (SIGTERM, SIGKILL after its grace period) and exits; only then is the directory unlocked.
    # (OMP_NUM_THREADS: torchrun's default, set for it so that it does not print a banner about it; rlspeed sets its
    # own thread count in each worker)
    # torchrun holds the lock too (the same open file, inherited): a launcher killed with SIGKILL leaves torchrun and
    # its workers training, and the directory stays locked until they end, not open to a requeued command's run
    lock = _run_locks().get(str((run_dir / RUN_LOCK).resolve()))
    received: list[int] = []
    unsent: collections.deque[int] = collections.deque()  # (those of `received` not yet passed on)
    nth = itertools.count(1)  # (numbers the stops passed on)
    process: subprocess.Popen | None = None  # (torchrun, once started)

    def pass_on() -> None:
        # Each stop is passed on once, by whichever call takes it from `unsent` (the handler's, or the one after
        # torchrun started): popleft and next are single calls, inside which no handler runs. A third signal in
        # torchrun's own shutdown makes it give up its workers: two reach it, no more. (On Windows torchrun shares
        # this console, whose Ctrl-C reached it already, and Popen sends no SIGINT there.)
        while process is not None and unsent:
            try:
                signum = unsent.popleft()
            except IndexError:  # (taken meanwhile)
                return
            if next(nth) <= 2 and not (signum == signal.SIGINT and sys.platform == "win32"):
                process.send_signal(signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM)

    def forward(signum, _frame) -> None:
        _quiet_closed_terminal(signum)
        if not received:
            print(f"rlspeed: stopping the {args.nproc} processes (they save where they are)"
                  if args.nproc != 1 else "rlspeed: stopping the process (it saves where it is)", file=sys.stderr,
                  flush=True)
        received.append(signum)
        unsent.append(signum)
        pass_on()

    # (SIGHUP: a closed terminal or a dropped ssh session, which no longer reaches torchrun's own session; SIGUSR1 or
    # SIGUSR2: a scheduler's warning before its deadline. torchrun is sent SIGTERM for them: it dies of the others.)
    # Both from before torchrun starts: a stop that comes while it starts is passed to it once it has, and a torchrun
    # killed at once leaves no worker unwaited for (torchrun itself, in a session of its own with "-m rlspeed" in its
    # command line, is reaped by the end of the block). Around them, to the end of the wait for the workers a killed
    # torchrun left, a stop waits (`held`): once torchrun has ended none is passed on, and none may unlock the run
    # directory while they save in it; the run ends as torchrun did.
    with stops_held(_quiet_closed_terminal) as held:
        with adopting_orphans(("-m", "rlspeed")) as orphans, handlers_set(forward, STOPS):
            while held:  # (those that came before `forward` was set: passed on as the ones after it)
                forward(held.pop(0), None)
            process = subprocess.Popen(command, env={"OMP_NUM_THREADS": "1", **os.environ,
                                                     RUN_LOCKED_BY_LAUNCHER: str(run_dir.resolve())},
                                       start_new_session=True,
                                       # (Windows' Popen takes no pass_fds, and its lock is not a file lock)
                                       pass_fds=() if lock is None or sys.platform == "win32" else (lock.fileno(),))
            pass_on()  # (those that came while it started)
            code = process.wait()
        waiting = (f"waiting up to {TORCHRUN_GRACE_S:g} s for the {len(orphans)} process(es) it left to save where "
                   "they are")
        if code < 0 and not received:  # (torchrun ended by a signal of another's, SIGKILL: it did not stop its workers)
            name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
            print(f"rlspeed: torchrun ended by {name}" + (f": {waiting}" if orphans else "") + ".", file=sys.stderr,
                  flush=True)
            code = 128 - code  # (as a shell reports a process a signal ended)
        elif orphans:  # (torchrun ended by itself, or for a stop passed on, and left processes running)
            how = f"exit code {code}" if code >= 0 else f"signal {-code}"
            print(f"rlspeed: torchrun ended ({how}): {waiting}.", file=sys.stderr, flush=True)
        said: list[int] = []  # (the stop held since torchrun ended that was said: one, the first)

        def say_stop(running: list[int]) -> None:  # (as the wait goes on: the stop is passed on to nothing)
            if held and not said:
                said.append(held[0])
                print(f"rlspeed: {_signal_name(held[0])}: still waiting for the {len(running)} process(es) torchrun "
                      f"left (up to {TORCHRUN_GRACE_S:g} s after it ended: they save where they are; then they are "
                      "killed, the run keeping its last checkpoint).", file=sys.stderr, flush=True)

        left = wait_for_adopted(orphans, timeout_s=TORCHRUN_GRACE_S, meanwhile=say_stop)
        for pid in left:  # (as torchrun ends a worker that outlives its grace period)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if left:
            wait_for_adopted(left, timeout_s=5.0)
            print(f"rlspeed: killed the {len(left)} process(es) still running {TORCHRUN_GRACE_S:g} s after torchrun "
                  "ended: the run keeps its last checkpoint.", file=sys.stderr, flush=True)
        if code and created and {path.name for path in run_dir.iterdir()} <= {RUN_LOCK}:
            with contextlib.suppress(OSError):  # (the workers failed before writing anything: a rerun is not refused)
                (run_dir / RUN_LOCK).unlink(missing_ok=True)
                _remove_empty([run_dir, *parents])
        # (the stops held to here, its clean-up done, end the command; one from here on raises: `_main` says it with
        # the stage)
        _stage("ending the command", left=f"torchrun has ended, and '{run_dir}' holds what its processes wrote")
    if held and not received:  # (a stop that came once torchrun had ended: the command ends with it, said once)
        stopped, name = _stop_said(_stop_of(held[0]))
        if not said:
            ended = f"the run is saved in {run_dir}" if code == 0 else f"the command ends with torchrun's code, {code}"
            print(f"rlspeed: interrupted ({name}) as torchrun ended: nothing was cut short; {ended}", file=sys.stderr,
                  flush=True)
        code = code or stopped
    return _stop_said(_stop_of(received[0]))[0] if received else code


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def _plain(config) -> dict:
    import dataclasses

    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(config).items()}


@_signals_stop_cleanly  # (a SIGTERM while a --video is filmed: its partial file is removed, exit code 143)
def cmd_eval(args: argparse.Namespace) -> int:
    """`rlspeed eval`: load a checkpoint and print its deterministic evaluation (mean +/- std); returns 0.

    The env is `--env` or the one the model was trained on, with the backend the model was trained with unless
    `--env-backend` says otherwise (so `--seed` reproduces summary.json's `final_eval` with its recorded seed), made
    with the options its run recorded (on its own id) and `--env-kwargs` over them; the result line names them.
    `--json` prints the result as JSON on stdout and the human line on stderr. A population's run directory:
    every member's model and their aggregate (`_eval_population`).
    """
    from rlspeed.checkpoint import MEMBERS_DIR, run_model

    if args.video is None and "video_episodes" in _given_options(getattr(args, "argv", []), "eval"):
        raise UserError("--video-episodes applies only with --video FILE: add it, or drop --video-episodes.")
    if args.video is None and args.overwrite:
        raise UserError("--overwrite (replace an existing --video file) applies only with --video FILE: add it, or "
                        "drop --overwrite.")
    given = Path(args.checkpoint)
    members = _population_members(given)  # (a population's run directory: every member's model)
    # (a run directory, as `rlspeed train` prints it: its model; refused here, before any module is imported)
    path = None if members else run_model(given)
    # the run directory of a run's model (the directory, or a file in it) or of a population member's model
    run_dir = (given if given.is_dir() else given.parent.parent if given.parent.name == MEMBERS_DIR
               else given.parent if (given.parent / "config.yaml").is_file() else None)
    config_file = run_dir / "config.yaml" if run_dir is not None else None
    run_config: dict = {}
    if config_file is not None and config_file.is_file():  # the modules that registered the run's env
        try:
            run_config = yamlfile.load_run_file(config_file.read_text(encoding="utf-8")) or {}
            recorded = run_config.get("gym_packages") or []
        except (yaml.YAMLError, AttributeError, OSError):
            run_config, recorded = {}, []
        if isinstance(recorded, list) and recorded:
            _import_recorded(args, [str(module) for module in recorded], config_file, "its env")
    _import_env_modules(args, "env")
    if path is None:  # (a population's run directory)
        return _eval_population(args, given, members, run_config)
    model = _load_evaluated_model(args, path, run_config)
    env_id = _evaluated_env_id(args, model, path)
    env_kwargs = _parse_set(args.env_kwargs, "--env-kwargs") if args.env_kwargs else None
    from rlspeed.evaluation import env_options

    options = env_options(model, env_id, env_kwargs)  # (named in the result line)
    if args.video is not None:  # before evaluating: a missing package or renderer is one sentence now
        from rlspeed.video import check_video_path, check_video_support

        _check_parent_directory("--video", args.video)
        check_video_path(args.video, "--video")
        if not args.overwrite and (Path(args.video).exists() or Path(args.video).is_symlink()):
            raise UserError(f"--video '{args.video}' exists: pass --overwrite to replace it, or give another --video "
                            "FILE.")
        check_video_support(env_id, args.video, env_kwargs=options)
    seed_note = _eval_seed(args)
    deterministic = not args.stochastic
    result = _evaluated(args, model, env_id, env_kwargs, args.seed)
    success = f", success rate {result['success_rate']:.0%}" if "success_rate" in result else ""
    how = "deterministic" if deterministic else "stochastic"
    made_with = f" ({', '.join(f'{k}={v!r}' for k, v in options.items())})" if options else ""
    episodes = _episodes(args.episodes)
    print(f"rlspeed: {type(model).__name__} on {env_id}{made_with}, {how}, {episodes}"
          f"{_cut_short(result.get('unfinished'), result['episodes'])}{seed_note}: "
          f"{_score(result['mean'])} +/- {_score(result['std'])}{success}",
          file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(strict_json({**result, "seed": args.seed, "deterministic": deterministic}))
    if args.video is not None:
        from rlspeed.video import record_video

        # (on the backend evaluated on: with the same seed, the video's episodes are the evaluated ones)
        video = record_video(model, args.video, episodes=args.video_episodes, seed=args.seed, env_id=env_id,
                             deterministic=deterministic, env_kwargs=env_kwargs, overwrite=args.overwrite,
                             backend=args.env_backend if args.env_backend != "auto" else None)
        episodes = _episodes(video['episodes'])
        returns = "return" if video["episodes"] == 1 else "mean return"
        print(f"rlspeed: wrote {video['path']} ({episodes}, {video['frames']} frames, {returns} "
              f"{_score(video['mean'])}{_cut_short(video['unfinished'], video['episodes'])})",
              file=sys.stderr if args.json else sys.stdout)
    return 0


def _load_evaluated_model(args: argparse.Namespace, path: Path, run_config: dict):
    """The model `rlspeed eval` evaluates, loaded from `path` onto `--device` on the thread count its run recorded
    (`run_config`, its config.yaml): UserError in one sentence for a file that is no model, or one of a class of the
    user's own that cannot be built here."""
    from rlspeed.checkpoint import load_checkpoint, refuse_non_model

    _, meta = load_checkpoint(path)
    refuse_non_model(path, meta)
    _import_recorded_env_modules(args, meta, path)
    algo_cls = _command_algorithm(meta, path)
    from rlspeed.device import configure_threads, resolve_device

    # (as the run's final evaluation did: its threads, as config.yaml records them, else one or RLSPEED_NUM_THREADS;
    # a CPU's sums depend on the thread count, so `--seed` repeats summary.json's final_eval exactly)
    threads = run_config.get("threads") if isinstance(run_config, dict) else None
    configure_threads(threads if isinstance(threads, int) and threads >= 1
                      and not os.environ.get("RLSPEED_NUM_THREADS", "").strip() else None)
    device = resolve_device(args.device)  # (a bad --device is the flag's error, not the file's)
    from rlspeed.algos.base import _other_class

    other = _other_class(meta, algo_cls)  # (a subclass not imported: load builds rlspeed's class, with a warning)
    try:
        with warnings.catch_warnings(record=other is not None) as said, command_advice("rlspeed eval",
                                                                                         _advice("evaluate")):
            model = _fits(lambda: algo_cls.load(path, device=device), path, f"the {algo_cls.__name__} model its "
                          "metadata describes")
        for warning in said or ():  # (said where the load worked; where it failed, the error below says it)
            warnings.warn(warning.message, warning.category, stacklevel=1)
    except UserError as error:
        if other is None or f"was saved by {other}," not in str(error):  # (another failure: memory, a bad file)
            raise
        module, _, name = other.rpartition(".")
        if module == "__main__":
            raise UserError(f"'{path}' was saved by {name}, a class of the script that trained it, whose networks "
                            f"rlspeed eval cannot build: evaluate it in Python ({name}.load(path).evaluate()), or "
                            f"move {name} into a module and pass --gym-packages MODULE.") from None
        raise UserError(f"'{path}' was saved by {other}, whose networks rlspeed eval builds with its module "
                        f"imported: add --gym-packages {module} (importable from here: PYTHONPATH).") from None
    return model


def _evaluated_env_id(args: argparse.Namespace, model, path: Path, say: bool = True) -> str:
    """The env id `rlspeed eval` evaluates the model of `path` on: `--env`, else its own, whose module (an id
    `module:EnvId`) is imported when the env is made, which is said on stderr (`say`); UserError under --no-imports."""
    env_id = args.env or model.env_id
    if args.env is None and ":" in env_id and args.no_imports:
        raise UserError(f"'{path}' was trained on {env_id}, whose module {env_id.split(':', 1)[0]} --no-imports does "
                        "not import: give --env ENV_ID (and --gym-packages MODULE, a module you trust that registers "
                        "it).")
    if args.env is None and ":" in env_id and say:  # (importing runs a module's code: said, as config.yaml's are)
        print(f"rlspeed: importing {env_id.split(':', 1)[0]}, which the model's env id {env_id} names",
              file=sys.stderr, flush=True)
    return env_id


def _eval_seed(args: argparse.Namespace) -> str:
    """`--seed`, drawn where not given (and printed, so that `--seed` repeats the evaluation; episode i gets seed + i,
    below 2**31: EnvPool's limit), as the result line's note."""
    if args.seed is None:
        args.seed = secrets.randbelow(max(1, 2**31 - args.episodes))
        return f", seed {args.seed} (drawn: --seed {args.seed} repeats it)"
    return f", seed {args.seed}"


def _evaluated(args: argparse.Namespace, model, env_id: str, env_kwargs: dict | None, seed: int) -> dict:
    """`rlspeed eval`'s evaluation of `model` on `env_id` from `seed`: on the backend it was trained with unless
    `--env-backend` says otherwise (so a recorded seed repeats summary.json's `final_eval`)."""
    deterministic = not args.stochastic
    if args.env_backend is None:  # the backend it was trained with, when evaluating on its own env
        return model.evaluate(episodes=args.episodes, seed=seed, env_id=env_id, deterministic=deterministic,
                              env_kwargs=env_kwargs, progress_bar=not args.no_progress)
    from rlspeed.evaluation import evaluate

    return evaluate(model, env_id, episodes=args.episodes, seed=seed, backend=args.env_backend,
                    deterministic=deterministic, env_kwargs=env_kwargs, progress_bar=not args.no_progress)


def _population_members(given: Path) -> list[Path]:
    """The members' models of a population's run directory `given` (`members/seed_<S>.safetensors`, by seed); none
    for anything else (a file, a single run's directory)."""
    from rlspeed.checkpoint import MEMBERS_DIR, _member_models

    if not given.is_dir() or (given / "model.safetensors").is_file():
        return []
    return _member_models(given / MEMBERS_DIR)


def _member_eval_command(args: argparse.Namespace, path: Path, seed: int) -> str:
    """The `rlspeed eval` command that repeats the line `rlspeed eval RUN_DIR` prints for the member model `path`,
    evaluated from `seed`: its file and seed with the options given that change the episodes or the actions
    (`--episodes`, `--stochastic`, `--env`, `--env-kwargs`, `--env-backend`, `--device`) and those that say what is
    imported (`--gym-packages` with every module this command imported: those given, an `--env module:EnvId`'s and
    the run's recorded ones; `--no-imports`), quoted for a shell."""
    options = [*(["--stochastic"] if args.stochastic else []), *(["--env", args.env] if args.env else []),
               *(["--gym-packages", *args.gym_packages] if args.gym_packages else []),
               *(["--no-imports"] if args.no_imports else []),
               *(part for option in args.env_kwargs or [] for part in ("--env-kwargs", option)),
               *(["--env-backend", args.env_backend] if args.env_backend is not None else []),
               *(["--device", args.device] if args.device != "auto" else [])]
    return " ".join([_eval_command(path, seed, args.episodes), *map(shlex.quote, options)])


def _eval_population(args: argparse.Namespace, run_dir: Path, members: list[Path], run_config: dict) -> int:
    """`rlspeed eval RUN_DIR` of a population's run: each member's model (`members/`) evaluated on fresh episodes as
    `rlspeed eval MEMBER` evaluates one, member seed S's from `evaluation_seed(S, "members", --seed)` (so members of
    neighbouring seeds play unrelated episodes, and the command its line names repeats it: `_member_eval_command`), then
    the median and IQM of their means with 95% bootstrap intervals, as summary.json's `aggregate["final_eval"]`.
    `--json` prints the members' results and the aggregate on stdout. Returns 0."""
    from rlspeed.evaluation import env_options
    from rlspeed.stats import aggregate

    if args.video is not None:
        raise UserError(f"--video films one model: give one member's, e.g. rlspeed eval "
                        f"{_shell_path(members[0])} --video {_shell_path(args.video)}.")
    env_kwargs = _parse_set(args.env_kwargs, "--env-kwargs") if args.env_kwargs else None
    seed_note = _eval_seed(args)
    out = sys.stderr if args.json else sys.stdout
    results, names = [], set()
    for path, model, env_id, member_seed, seed, result in _member_evaluations(args, members, run_config, env_kwargs):
        options = env_options(model, env_id, env_kwargs)
        names.add((type(model).__name__, env_id, ", ".join(f"{k}={v!r}" for k, v in options.items())))
        success = f", success rate {result['success_rate']:.0%}" if "success_rate" in result else ""
        print(f"rlspeed: seed {member_seed}: {_score(result['mean'])} +/- {_score(result['std'])}"
              f"{_cut_short(result.get('unfinished'), result['episodes'])}{success} "
              f"({_member_eval_command(args, path, seed)} repeats it)", file=out, flush=True)
        results.append({"member_seed": member_seed, "model": str(path), **result, "seed": seed})
    # (a non-finite mean has no place in a median or IQM: left out and named; where none is finite, there is none)
    means = [entry["mean"] for entry in results if math.isfinite(entry["mean"])]
    final = aggregate(means) if means else None
    not_finite = [str(entry["member_seed"]) for entry in results if not math.isfinite(entry["mean"])]
    left_out = f"; seed {', '.join(not_finite)} left out (mean not finite)" if not_finite else ""
    recorded = run_config.get("seeds") if isinstance(run_config, dict) else None
    missing = ([seed for seed in recorded if seed not in {entry["member_seed"] for entry in results}]
               if isinstance(recorded, list) else [])
    without = (f"; {len(missing)} of {len(recorded)} members have no model (a member that diverged is not saved): "
               f"seed {', '.join(map(str, missing))}" if missing else "")
    # (the env and the options it was made with, as a single model's line names them)
    noun = "member" if len(results) == 1 else "members"
    what = " and ".join(sorted(f"{name} {noun} on {env_id}{f' ({options})' if options else ''}"
                               for name, env_id, options in names))
    how = "deterministic" if not args.stochastic else "stochastic"
    scores = (f"median {_score(final['median'])}, IQM {_score(final['iqm'])} {_interval(final, _score)}{left_out}"
              if final is not None else "no median or IQM: no member's mean return is finite")
    print(f"rlspeed: {len(results)} {what}, {how}, {_episodes(args.episodes)} each{seed_note}: {scores}{without}",
          file=out)
    if args.json:
        print(strict_json({"members": results, "aggregate": final, "seed": args.seed,
                           "deterministic": not args.stochastic, "episodes": args.episodes}))
    return 0


def _member_evaluations(args: argparse.Namespace, members: list[Path], run_config: dict, env_kwargs: dict | None):
    """(path, model, env id, member seed, evaluation seed, result) of each member model `members` of `rlspeed eval
    RUN_DIR`, in their order, each result as `_evaluated` gives it for the model alone (member seed S evaluated from
    `evaluation_seed(S, "members", --seed)`): as one batch (`_batched_evaluations`) where `_batches_members` says so
    (every model loaded first), else one model after another (each loaded as its turn comes)."""
    from rlspeed.evaluation import evaluation_seed

    def loaded(path: Path) -> tuple:
        model = _load_evaluated_model(args, path, run_config)
        env_id = _evaluated_env_id(args, model, path, say=path == members[0])
        member_seed = _member_seed(model, path)
        return model, env_id, member_seed, evaluation_seed(member_seed, "members", args.seed)

    batch: list[tuple] = []
    try:
        if _batches_members(args):
            for path in members:
                batch.append(loaded(path))
        models, seeds = [entry[0] for entry in batch], [entry[3] for entry in batch]
        results = _batched_evaluations(args, models, seeds) if batch else None
        for k, path in enumerate(members):
            model, env_id, member_seed, seed = batch[k] if batch else loaded(path)
            try:
                result = results[k] if results is not None else _evaluated(args, model, env_id, env_kwargs, seed)
            finally:
                model.close()
            yield path, model, env_id, member_seed, seed, result
    finally:
        for model, *_ in batch:
            model.close()


def _member_seed(model, path: Path) -> int:
    """The seed of the member whose model `model` was loaded from `path` (`members/seed_<S>.safetensors`)."""
    return model.seed if isinstance(model.seed, int) else int(path.stem.removeprefix("seed_"))


def _batches_members(args: argparse.Namespace) -> bool:
    """Whether `rlspeed eval RUN_DIR` evaluates the members as one population (`_batched_evaluations`), which plays
    the episodes each member's own evaluation plays: deterministic, on the members' own env, options and backend (no
    `--env`, `--env-kwargs`, `--env-backend`), without `--video`; `_batched_evaluations` then batches models loaded on
    the CPU (where the batched sums are the solo model's)."""
    return (not args.stochastic and args.env is None and not args.env_kwargs and args.env_backend is None
            and args.video is None)


def _batched_evaluations(args: argparse.Namespace, models: list, seeds: list[int]) -> list[dict] | None:
    """Each member model of `models` (loaded from the member files) evaluated from its seed of `seeds` as `_evaluated`
    evaluates it alone, all as one population (`rlspeed.population._population_of_models`, its batched `evaluate`,
    checked to hold each model's tensors as loaded: the files are not read again); None where they are not one
    population's members or not on the CPU (then each is evaluated alone, and a line on stderr says why). On every
    backend a population runs on, a batch is not slower than the members one at a time (`first_episode_returns`)."""
    from rlspeed.evaluation import _result
    from rlspeed.population import _population_of_models

    elsewhere = next((model.device for model in models if model.device.type != "cpu"), None)
    why = (f"The members are loaded on {elsewhere}; a batch is evaluated on the CPU (--device cpu)."
           if elsewhere is not None else None)
    if why is None:
        try:
            population = _population_of_models(models, [model._state_tensors() for model in models])
        except UserError as error:
            why = str(error)
    if why is not None:
        print(f"rlspeed: evaluating the members one at a time, not as one batch: {why}", file=sys.stderr, flush=True)
        return None
    if not args.no_progress:  # (a batch has no bar of its own, and its members' lines come when all are done)
        print(f"rlspeed: evaluating the {len(models)} members as one batch, {_episodes(args.episodes)} each ...",
              file=sys.stderr, flush=True)
    with population:
        population.evaluate(seeds=seeds, episodes=args.episodes)
    played = population.last_episodes
    return [_result(played["returns"][k], played["lengths"][k], population.last_unfinished[k],
                    None if played["successes"] is None else played["successes"][k], seed, True)
            for k, seed in enumerate(seeds)]


def _check_parent_directory(flag: str, given: str) -> None:
    """One sentence where the file `given` to `flag` cannot be made because its directory does not exist or is a
    file."""
    parent = Path(given).parent
    if parent.resolve().is_dir():
        return
    blocking = next((folder for folder in (parent, *parent.parents) if folder.resolve().exists()), None)
    what = (f"'{blocking}' is a file, not a directory" if blocking is not None and not blocking.resolve().is_dir()
            else f"'{parent}' does not exist; create it first")
    raise UserError(f"{flag} '{given}': {what} (give a file in an existing directory).")


def _profiler_trace(path: Path) -> bool:
    """Whether the file at `path` is a trace `rlspeed profile --trace` wrote (torch's Chrome trace: a JSON object that
    opens with its schemaVersion), or empty."""
    try:
        with path.open(encoding="utf-8", errors="replace") as stream:
            head = stream.read(256)
    except OSError:
        return False
    return not head.strip() or re.match(r'\s*\{\s*"schemaVersion"\s*:', head) is not None


def _command_algorithm(meta: dict, path) -> type:
    """The class `rlspeed eval` and `rlspeed export` load the model file of checkpoint metadata `meta` (at `path`)
    as: an algorithm of a user's own as its class where --gym-packages imported its module, else the rlspeed algorithm
    it derives from (`saved_algorithm`, with the command line's advice)."""
    from rlspeed.algos import Algorithm
    from rlspeed.algos.base import saved_algorithm

    return saved_algorithm(meta, Algorithm, path, import_advice="add --gym-packages {module} (importable from here: "
                                                                "PYTHONPATH)")


def _advice(verb: str) -> Callable[[str], str]:
    """What makes `rlspeed eval` (`verb` evaluate) or `rlspeed export` (export) build the user's class `saved`
    (`module.QualName`) that saved a model file: its module imported by --gym-packages, or for a script's own class
    Python."""
    call = {"evaluate": "evaluate()", "export": "export(out)"}[verb]

    def advice(saved: str) -> str:
        module, _, name = saved.rpartition(".")
        if module == "__main__":
            return (f"{verb} it in Python ({name}.load(path).{call}), or move {name} into a module and pass "
                    "--gym-packages MODULE")
        return f"add --gym-packages {module} (importable from here: PYTHONPATH) to {verb} it as {name}"

    return advice


def _import_recorded_env_modules(args: argparse.Namespace, meta: dict, path: Path) -> None:
    """`rlspeed eval` of a model file whose env id is not registered here (a file moved without its config.yaml,
    trained with `--gym-packages` or a `module:EnvId` id): import the modules it records (`gym_packages`), said as
    config.yaml's are; `--no-imports` says so and imports nothing."""
    import gymnasium as gym

    from rlspeed.envs import _check_registered

    env_id, recorded = meta.get("env_id"), meta.get("gym_packages")
    if (args.env is not None or not isinstance(recorded, list) or not recorded or not isinstance(env_id, str)
            or ":" in env_id):  # (a `module:EnvId` id: its module is imported below)
        return
    _check_registered(env_id)  # (ids rlspeed registers itself: MinAtar's, ale-py's, ...)
    if env_id in gym.registry:
        return
    _import_recorded(args, [str(module) for module in recorded], path, f"its env {env_id}")


def _import_recorded(args: argparse.Namespace, recorded: list[str], source: Path, env: str) -> None:
    """`rlspeed eval`'s import of the modules `source` (a run's config.yaml, a model file) records as registering
    `env` ("its env"): said first (importing runs a module's code: a file from elsewhere), and added to
    `args.gym_packages`; `--no-imports` says so and imports nothing."""
    if args.no_imports:
        print(f"rlspeed: --no-imports: not importing {', '.join(recorded)}, which {source} records (gym_packages)",
              file=sys.stderr, flush=True)
        return
    print(f"rlspeed: importing {', '.join(recorded)}, which {source} records (gym_packages: the modules that register "
          f"{env})", file=sys.stderr, flush=True)
    from rlspeed.envs import import_gym_packages

    import_gym_packages(recorded, why=f"(recorded in {source})")
    args.gym_packages = [*recorded, *(args.gym_packages or [])]


def cmd_export(args: argparse.Namespace) -> int:
    """`rlspeed export`: write a saved model's deterministic policy (ONNX, TorchScript or a torch.export program)
    with its FILE.json sidecar; returns 0."""
    from rlspeed.algos import ALGORITHMS
    from rlspeed.export import export_checkpoint

    if args.out is not None:
        _check_parent_directory("--out", args.out)
        refuse_special_file(args.out, "--out")
    from rlspeed.envs import import_gym_packages

    import_gym_packages(args.gym_packages, role="define the algorithm that saved the model")
    with command_advice("rlspeed export", _advice("export")):
        path = export_checkpoint(args.checkpoint, args.format, out=args.out, algorithms=ALGORITHMS,
                                 action_mask=args.action_mask, overwrite=args.overwrite,
                                 algorithm_of=_command_algorithm)
    print(f"rlspeed: wrote {path} and {path.name}.json beside it")
    return 0


def _normalization(pairs: list[str]) -> dict[str, tuple[float, float]]:
    """`--normalize ENV_ID=LOW:HIGH ...` as {env_id: (low, high)}."""
    normalize: dict[str, tuple[float, float]] = {}
    for pair in pairs:
        env_id, equals, scores = pair.partition("=")
        low, colon, high = scores.partition(":")
        try:
            if not (equals and colon and env_id.strip()):
                raise ValueError
            bounds = float(low), float(high)
        except ValueError:
            raise UserError(f"--normalize '{pair}' is not ENV_ID=LOW:HIGH (e.g. CartPole-v1=0:500, Acrobot-v1=-500:0): "
                            "the scores that become 0 and 1.") from None
        if env_id.strip() in normalize and normalize[env_id.strip()] != bounds:
            raise UserError(f"--normalize gives {env_id.strip()} twice, with different scores: give it once.")
        normalize[env_id.strip()] = bounds
    return normalize


def cmd_report(args: argparse.Namespace) -> int:
    """`rlspeed report`: pool the seeds of finished runs into the final-score table (printed as Markdown) and, with
    `--out`, write final_scores.csv, scores.csv, curves.csv and the curves' picture there; returns 0."""
    from rlspeed.report import markdown_table, write_report

    report = write_report(args.runs, args.out, normalize=_normalization(args.normalize), reps=args.reps,
                          image_format=args.format, overwrite=args.overwrite)
    seeds = len(report["results"])
    runs = len({result.run_dir for result in report["results"]})
    print(f"rlspeed: {seeds} seed{'s' if seeds != 1 else ''} from {runs} run director{'ies' if runs != 1 else 'y'}; "
          "final evaluations (deterministic), IQM and median with 95% percentile-bootstrap intervals:")
    print(markdown_table(report["final_scores"]))
    for note in report["notes"]:
        print(f"rlspeed: note: {note}", file=sys.stderr)
    if report["files"]:
        print(f"rlspeed: wrote {', '.join(path.name for path in report['files'])} in {args.out}")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    """`rlspeed doctor`: check the device stack and print what runs here; returns 1 if a check failed, else 0."""
    import torch

    shadow = _shadowing_torch()
    if shadow is not None:  # (one that imports: every check would crash on it, each "a doctor bug")
        raise UserError(_shadowed_torch_sentence(shadow))
    from rlspeed.diagnostics.doctor import run_doctor

    if args.device not in (None, "auto"):  # (a device that is not there is the doctor's to report; a typo is not)
        from rlspeed.device import ACCELERATOR_ORDER

        # (the accelerator names pass even where torch cannot parse them: `npu` without torch_npu is what the
        # doctor is there to explain)
        kinds = ("cpu", *ACCELERATOR_ORDER)
        if not re.fullmatch(rf"({'|'.join(kinds)})(:\d+)?", args.device.strip().lower()):
            try:
                torch.device(args.device)
            except (RuntimeError, ValueError):
                raise UserError(f"--device '{args.device}' is not a device name (auto, cpu, cuda, cuda:1, xpu, mps, "
                                "npu, ...).") from None
    return run_doctor(device=args.device, json_output=args.json)


#: `rlspeed --help`'s closing lines: a command of each kind to start from (tests parse each)
EXAMPLES = """examples:
  rlspeed train ppo CartPole-v1                  train until the preset's target
  rlspeed train sac Pendulum-v1 --seeds 0-7      8 seeds as one population
  rlspeed eval runs/ppo-CartPole-v1-0-TIME       evaluate the run's model
  rlspeed export runs/ppo-CartPole-v1-0-TIME     its policy as ONNX
  rlspeed report runs --out report               runs' final scores and curves
  rlspeed doctor                                 what runs on this machine
  rlspeed COMMAND --help                         that command's options"""

#: `--device`'s help: the names it takes, and what `auto` picks
DEVICE_HELP = "auto, cpu, cuda[:i], npu[:i], xpu or mps (default auto: the first accelerator there is, else cpu)"


def build_parser() -> argparse.ArgumentParser:
    """The `rlspeed` argument parser: subcommands train, eval, export, profile, report, doctor and tune, each setting
    `func` to its command.

    Every number is range-checked here; a bad argument raises UserError (one sentence, exit code 2 in `main`).
    `--debug` is accepted before or after the subcommand.
    """
    parser = _Parser(prog="rlspeed", description="Fast reinforcement learning in PyTorch.", epilog=EXAMPLES,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    parser.add_argument("-V", "--version", action="version", version=f"rlspeed {__version__}",
                        help="print rlspeed's version and exit")
    sub = parser.add_subparsers(dest="command", required=True)

    # what builds the model, shared by train and profile
    model = _Parser(add_help=False)
    model.add_argument("algo", metavar="ALGO", help="ppo, a2c, recurrent_ppo, dqn, sac, td3 or ddpg")
    model.add_argument("env_id", metavar="ENV_ID",
                       help="a Gymnasium id, e.g. CartPole-v1, or module:EnvId (the module registers it)")
    model.add_argument("--num-envs", type=_whole(1), default=None, metavar="N",
                       help="parallel envs (default: the preset's)")
    model.add_argument("--seed", type=_seed, default=0, metavar="N",
                       help="seed of the weights, envs and sampling (default 0)")
    model.add_argument("--device", default="auto", type=_given("a device"), help=DEVICE_HELP)
    # (the choices are in the help: listed in the usage line they made it wider than a terminal's 80 columns)
    model.add_argument("--env-backend", default="auto", metavar="BACKEND",
                       choices=ENV_BACKENDS,
                       help="what steps the envs: torch (rlspeed's native envs), gymnasium, gymnasium-async "
                            "(Gymnasium's, in subprocesses), envpool, or auto (the default): the native env where "
                            "there is one (Gymnasium's for few envs on a CPU), EnvPool for Atari ids where installed, "
                            "else Gymnasium's")
    model.add_argument("--accelerate", default="off", choices=["auto", "off"],
                       help="auto: measure precision, compilation and graph capture and keep what is faster and "
                            "accurate (default off)")
    model.add_argument("--threads", type=_whole(1), default=None, metavar="N",
                       help="torch CPU threads (default 1, or RLSPEED_NUM_THREADS)")
    model.add_argument("--set", action="append", metavar="KEY=VALUE",
                       help="override a hyperparameter, VALUE read as YAML, e.g. --set learning_rate=3e-4 "
                            "(repeatable)")
    model.add_argument("--env-kwargs", action="append", metavar="KEY=VALUE",
                       help="an option of the Gymnasium env, as in gymnasium.make(ENV_ID, KEY=VALUE), VALUE read as "
                            "YAML (repeatable); recorded with the run, so its evaluations and rlspeed eval make the "
                            "same env")
    model.add_argument("--preset", default="auto", type=_given("a preset"), metavar="auto|rlspeed|zoo|none|FILE",
                       help="hyperparameter source: auto (the default: rlspeed's preset for the pair, else RL-Zoo's "
                            "if rl_zoo3 is installed, else rlspeed's default), rlspeed, zoo (RL-Zoo's, translated), "
                            "none (the algorithm's own defaults) or a YAML file")
    model.add_argument("--nan-policy", default="raise", choices=["raise", "mask"],
                       help="a NaN or infinite observation or reward from the env: stop with an error naming it "
                            "(raise, the default), or zero it and count it (mask)")
    # (--gym-packages a --gym-packages b imports both: a list flag given again adds to it, as --set and --env-kwargs
    # add up)
    model.add_argument("--gym-packages", action="extend", nargs="+", default=[], metavar="MODULE",
                       help="modules to import first (they register the env ids they provide; repeatable)")
    model.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show full tracebacks on errors")

    train = sub.add_parser("train", parents=[model], help="train an agent (presets per algorithm and env)")
    train.add_argument("--total-timesteps", type=_whole(1), default=None, metavar="N",
                       help=f"env steps, e.g. 1e5 (default: the preset's, else {_DEFAULT_TOTAL_TIMESTEPS:,})")
    train.add_argument("--out", default=None, metavar="DIR",
                       help="run directory (default runs/<algo>-<env>-<seed>-<time>, with a numbered suffix if that "
                            "exists)")
    train.add_argument("--overwrite", action="store_true", help="replace the run already in --out")
    train.add_argument("--init-from", default=None, type=_given("a model file"), metavar="MODEL|RUN_DIR",
                       help="start from the networks (and normalisation statistics) of a saved model of this "
                            "algorithm, a fine-tune: its net_arch, activation and encoder apply; fresh optimiser, "
                            "steps counted from 0")
    train.add_argument("--dry-run", action="store_true",
                       help="print the settings the run would use (its config.yaml, a preset file) and exit: builds "
                            "the model, trains and writes nothing")
    train.add_argument("--target-return", type=_target_text, default=None, metavar="R|none",
                       help=f"stop when evaluation reaches it (default: {_TARGET_DEFAULT}; none: train the whole "
                            "budget)")
    train.add_argument("--eval-freq", type=_whole(1), default=None, metavar="N",
                       help="evaluate at the end of the first iteration at or past every multiple of N env steps "
                            "(default: the preset's, else a 40th of the budget and at least 2,048: with a target, or "
                            "with --seeds, target or not; a solo run without a target evaluates only at the end)")
    train.add_argument("--eval-episodes", type=_whole(1), default=None, metavar="N",
                       help=f"episodes of each evaluation, during training and the final one (default {EVAL_EPISODES})")
    train.add_argument("--checkpoint-freq", type=_whole(1), default=None, metavar="N",
                       help="write the checkpoint at the end of the first iteration at or past every multiple of N "
                            "env steps (default: a twentieth of the budget with --seeds, --resume or --max-restarts, "
                            "else once a minute of training)")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    train.add_argument("--quiet", action="store_true",
                       help="no progress bar or lines of what the run is doing: only notes, warnings and errors (on "
                            "stderr) and the final evaluation's line")
    train.add_argument("--nproc", type=_whole(1), default=None, metavar="N",
                       help="data-parallel processes on this machine (starts torchrun for you; default: this process "
                            "alone)")
    train.add_argument("--max-restarts", type=_whole(0), default=0, metavar="N",
                       help="with --nproc: restarts torchrun may do after a failure, each resuming from the checkpoint "
                            "(default 0)")
    train.add_argument("--resume", action="store_true",
                       help="continue the run in --out from its checkpoint.safetensors if present")
    train.add_argument("--save-replay-buffer", action=argparse.BooleanOptionalAction, default=False,
                       help="off-policy checkpoints also hold the replay buffer (exact resume; a second file; "
                            "default off); --resume keeps the run's choice unless --no-save-replay-buffer or this is "
                            "given")
    train.add_argument("--video-every", type=_whole(0), default=None, metavar="N",
                       help="record one deterministic evaluation episode at the end of the first iteration at or "
                            "past every multiple of N env steps into the run's videos/ "
                            '(pip install "rlspeed[video]"); --resume keeps the run\'s N, and 0 records none')
    train.add_argument("--track", action="store_true",
                       help='log config, metrics, videos and the summary to Weights & Biases (pip install '
                            '"rlspeed[track]"; WANDB_MODE=offline logs locally)')
    train.add_argument("--wandb-project", default=None, type=_given("a project name"), metavar="NAME",
                       help="with --track: the W&B project (default: WANDB_PROJECT, else rlspeed)")
    train.add_argument("--wandb-entity", default=None, type=_given("a team or user name"), metavar="NAME",
                       help="with --track: the W&B team or user (default: WANDB_ENTITY, else your account)")
    train.add_argument("--seeds", default=None, metavar="SEEDS",
                       help="train one member per seed as one population (e.g. 0-31 or 0,3,5); per-member values: "
                            "--set learning_rate=1e-3,2e-3,... (see Populations in the docs)")
    train.set_defaults(func=cmd_train)

    tun = sub.add_parser("tune", help="search hyperparameters with Optuna, a population of trials at a time")
    tun.add_argument("algo", metavar="ALGO", help="an algorithm with populations: ppo, a2c, sac, td3, ddpg or dqn")
    tun.add_argument("env_id", metavar="ENV_ID", help="a native or Gymnasium env id, e.g. CartPole-v1")
    tun.add_argument("--trials", type=_whole(1), default=64, metavar="N",
                     help="trials the study should hold when done (default 64)")
    tun.add_argument("--population", type=_whole(1), default=16, metavar="N",
                     help="trials trained at once as one population, and the most members the confirmation trains at "
                          "once (default 16)")
    tun.add_argument("--storage", default="rlspeed-tune.db", type=_given("a file or URL"), metavar="FILE|URL",
                     help="Optuna storage: a SQLite file or a URL such as sqlite:///PATH.db (default rlspeed-tune.db)")
    tun.add_argument("--study-name", default=None, type=_given("a name"), metavar="NAME",
                     help="the study's name (default ALGO-ENV_ID); the same name resumes the study")
    tun.add_argument("--search-space", default=None, type=_given("a YAML file"), metavar="FILE",
                     help="YAML: hyperparameter -> {low, high[, log, one_minus]} | {choices: [...]} | value "
                          "(default: RL-Zoo's space, per-member hyperparameters only)")
    tun.add_argument("--budget", type=_whole(1), default=None, metavar="N",
                     help="env steps per trial (default: a third of the preset's total_timesteps)")
    tun.add_argument("--confirm-seeds", type=_whole(0), default=16, metavar="N",
                     help="train the 4 best trials and the starting configuration again on N new seeds each and write "
                          "the best median (default 16; 0 = write the best trial unconfirmed)")
    tun.add_argument("--out", default=None, type=_given("the file to write"), metavar="FILE",
                     help="the best configuration as a preset YAML (default tuned-ALGO-ENV_ID.yaml)")
    tun.add_argument("--preset", default="auto", type=_given("a preset"), metavar="auto|rlspeed|zoo|none|FILE",
                     help="the fixed hyperparameters every trial starts from, as for train (default auto)")
    tun.add_argument("--set", action="append", metavar="KEY=VALUE",
                     help="fix a hyperparameter, which leaves the search; VALUE read as YAML (repeatable)")
    tun.add_argument("--env-kwargs", action="append", metavar="KEY=VALUE",
                     help="an option of the Gymnasium env for every trial, as in gymnasium.make(ENV_ID, KEY=VALUE), "
                          "VALUE read as YAML (repeatable)")
    tun.add_argument("--num-envs", type=_whole(1), default=None, metavar="N",
                     help="envs per trial (default: the preset's)")
    tun.add_argument("--target-return", type=_target_text, default=None, metavar="R|none",
                     help=f"the objective's target (default: {_TARGET_DEFAULT}; none: maximise the final "
                          "evaluation)")
    tun.add_argument("--eval-freq", type=_whole(1), default=None, metavar="N",
                     help="evaluate each trial at the end of the first iteration at or past every multiple of N env "
                          "steps, each a report to the pruner (default: the preset's, else a 40th of --budget and at "
                          "least 2,048)")
    tun.add_argument("--eval-episodes", type=_whole(1), default=None, metavar="N",
                     help=f"episodes of each evaluation of a trial, the final one included (default {EVAL_EPISODES})")
    tun.add_argument("--seed", type=_seed, default=0, metavar="N",
                     help="the sampler's seed and every trial's; the confirmation's run i of each candidate "
                          "trains with seed N + 1,000,000 + i, modulo 2**32 (default 0)")
    tun.add_argument("--device", default="auto", type=_given("a device"), help=DEVICE_HELP)
    tun.add_argument("--threads", type=_whole(1), default=None, metavar="N",
                     help="torch CPU threads (default 1, or RLSPEED_NUM_THREADS)")
    tun.add_argument("--no-progress", action="store_true",
                     help="no progress bars (over a batch of trials asked for, sampled, built and trained)")
    tun.add_argument("--fail-running", action="store_true",
                     help="mark the study's running trials failed before it goes on, on a database server's storage "
                          "too (a file storage's are a killed process's: they are marked anyway)")
    tun.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                     help="show full tracebacks on errors")
    tun.set_defaults(func=cmd_tune)

    ev = sub.add_parser("eval", help="evaluate a saved model (deterministic; --stochastic samples)")
    ev.add_argument("checkpoint", metavar="CHECKPOINT", help="a model file or a run directory (a population's: "
                    "every member, and their aggregate)")
    ev.add_argument("--env", default=None, type=_given("an env id"), metavar="ENV_ID",
                    help="env id (default: the one it was trained on, with the options its run recorded)")
    ev.add_argument("--env-kwargs", action="append", metavar="KEY=VALUE",
                    help="an option of the Gymnasium env, as in gymnasium.make(ENV_ID, KEY=VALUE), VALUE read as "
                         "YAML, over those the run recorded (repeatable)")
    ev.add_argument("--episodes", type=_whole(1), default=10, metavar="N", help="episodes to evaluate (default 10)")
    ev.add_argument("--seed", type=_evaluation_seed, default=None, metavar="N",
                    help="seed of the episodes (default: one drawn and printed, so that --seed repeats them)")
    ev.add_argument("--device", default="auto", type=_given("a device"), help=DEVICE_HELP)
    ev.add_argument("--env-backend", default=None, choices=ENV_BACKENDS, metavar="BACKEND",
                    help="what steps the env: torch, gymnasium, gymnasium-async, envpool or auto, as for train "
                         "(default: the backend the model was trained with, on its own env)")
    ev.add_argument("--gym-packages", action="extend", nargs="+", default=[], metavar="MODULE",
                    help="modules to import first (they register the env ids they provide; repeatable)")
    ev.add_argument("--no-imports", action="store_true",
                    help="import no module that the files name (config.yaml's gym_packages, a module:EnvId env id), "
                         "for files from others; --gym-packages are still imported")
    ev.add_argument("--stochastic", action="store_true",
                    help="sample the policy's actions (from a stream --seed seeds) instead of its deterministic ones, "
                         "in the evaluation and in --video")
    ev.add_argument("--json", action="store_true", help="print the result as JSON (the human line goes to stderr)")
    ev.add_argument("--no-progress", action="store_true", help="no progress bar over the episodes")
    ev.add_argument("--quiet", action="store_true",
                    help="no progress bar: only the result line (and notes, warnings and errors on stderr)")
    ev.add_argument("--video", default=None, type=_given("the video file"), metavar="FILE",
                    help='also record episodes into FILE (.mp4 or .gif; pip install "rlspeed[video]")')
    ev.add_argument("--video-episodes", type=_whole(1), default=1, metavar="N",
                    help="episodes in the --video file (default 1)")
    ev.add_argument("--overwrite", action="store_true", help="replace an existing --video file")
    ev.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                    help="show full tracebacks on errors")
    ev.set_defaults(func=cmd_eval)

    prof = sub.add_parser("profile", parents=[model], help="where the time of a training run goes, and what to change")
    prof.add_argument("--steps", type=_whole(1), default=None, metavar="N",
                      help="env steps of the unprofiled timed run, rounded "
                      "up to whole iterations (default: 10 iterations, at least 2,000); the profiled run records at "
                      "most 2,048 of them, off-policy at most 256 gradient steps' (at least one iteration): the "
                      "profiler keeps every operation in memory")
    prof.add_argument("--trace", default=None, type=_given("the trace file"), metavar="FILE",
                      help="also write a trace of the profiled run, for chrome://tracing or ui.perfetto.dev")
    prof.add_argument("--json", action="store_true",
                      help="print the result as JSON on stdout (the report goes to stderr)")
    prof.set_defaults(func=cmd_profile)

    exp = sub.add_parser("export", help="export a saved model's deterministic policy (ONNX, TorchScript, torch.export)")
    exp.add_argument("checkpoint", metavar="CHECKPOINT", help="a model file or a run directory")
    exp.add_argument("--format", default=None, choices=["onnx", "torchscript", "exported_program"],
                     help="the export format (default: the one --out's suffix names, .onnx, .pt or .pt2; onnx "
                          "without --out)")
    exp.add_argument("--out", default=None, type=_given("the export file"), metavar="FILE",
                     help="the export file (default: the model file with .onnx, .pt or .pt2)")
    exp.add_argument("--overwrite", action="store_true", help="replace an existing export file")
    exp.add_argument("--gym-packages", action="extend", nargs="+", default=[], metavar="MODULE",
                     help="modules to import first (the module of an algorithm of your own that saved the model, "
                          "which then exports as its class; repeatable)")
    exp.add_argument("--action-mask", action=argparse.BooleanOptionalAction, default=None,
                     help="add (or leave out) an action_mask input, bool [batch, actions] (default: when the model "
                          "trained with the env's action masks)")
    exp.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                     help="show full tracebacks on errors")
    exp.set_defaults(func=cmd_export)

    rep = sub.add_parser("report", help="pool the seeds of finished runs: final scores and learning curves, as IQM "
                                        "with bootstrap CIs")
    rep.add_argument("runs", nargs="+", metavar="RUN_DIR",
                     help="run directories (solo runs and populations), or folders holding them")
    rep.add_argument("--out", default=None, type=_given("the report folder"), metavar="DIR",
                     help="write final_scores.csv, scores.csv, curves.csv and curves.png into DIR (default: print "
                          "the table only)")
    rep.add_argument("--overwrite", action="store_true", help="replace the report files already in --out")
    rep.add_argument("--normalize", action="append", default=[], metavar="ENV_ID=LOW:HIGH",
                     help="score that env as (score - LOW) / (HIGH - LOW), e.g. Acrobot-v1=-500:0 (repeatable; with "
                          "two or more, a row per algorithm over those envs together)")
    rep.add_argument("--reps", type=_whole(1), default=50_000, metavar="N",  # (at most rlspeed.stats.MAX_REPS)
                     help="bootstrap replicates of the final scores' intervals (default 50000)")
    rep.add_argument("--format", default="png", choices=["png", "pdf", "svg"],
                     help="the curves' picture format (default png)")
    rep.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                     help="show full tracebacks on errors")
    rep.set_defaults(func=cmd_report)

    doctor = sub.add_parser("doctor", help="check the device stack and what runs here")
    doctor.add_argument("--device", default="auto",
                        help="the device to check: auto, cpu, cuda[:i], npu[:i], xpu or mps (default auto)")
    doctor.add_argument("--json", action="store_true",
                        help="print the checks as JSON on stdout (the lines go to stderr)")
    doctor.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show full tracebacks on errors")
    doctor.set_defaults(func=cmd_doctor)
    for line in sub._choices_actions:  # each command's --help opens with what it does, its line in `rlspeed --help`
        sub.choices[line.dest].description = line.help[0].upper() + line.help[1:] + "."
    return parser


def _interval(aggregate: dict, number: Callable[[float], str]) -> str:
    """A population aggregate's IQM interval as printed: "(95% CI low to high)", or, for one member, that there is
    none (a bootstrap over one run resamples that run alone: an interval of no width, which says nothing of the
    spread of runs)."""
    if aggregate["runs"] < 2:
        return "(one member: no interval)"
    low, high = aggregate["iqm_ci"]
    return f"(95% CI {number(low)} to {number(high)})"


def _shadowing_torch() -> Path | None:
    """A torch.py that `import torch` takes (or took) in place of the installed package (`python -m` puts the working
    directory first on the path), else None."""
    import importlib.util

    module = sys.modules.get("torch")
    origin = getattr(module, "__file__", None) if module is not None else None
    if module is None:
        try:
            found = importlib.util.find_spec("torch")
        except (ImportError, ValueError):
            found = None
        origin = found.origin if found is not None else None
    return Path(origin) if origin and Path(origin).name == "torch.py" else None


def _shadowed_torch_sentence(shadow: Path, error: BaseException | None = None) -> str:
    failure = "" if error is None else f" ({type(error).__name__}: {_first_line(error)})"
    return (f"torch cannot be imported{failure}: '{shadow}' hides the installed torch: rename it, or run rlspeed from "
            "another directory.")


def _first_line(error: BaseException) -> str:
    return _one_line(str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__)


def _torch_import_failure(error: ImportError | AttributeError) -> str | None:
    """The sentence for `import torch` itself failing in a command (a frame of torch's own modules in the traceback,
    torch not imported after it), else None: torch's libraries that a batch job's memory limit (`ulimit -v`) leaves no
    room to map, a torch.py in the working directory hiding the installed torch (`python -m` puts the directory
    first on the path; whatever it holds: one that imports fails later, on the names torch has and it lacks), a
    build that does not match the machine. Those were torch's traceback, also `rlspeed doctor`'s, which is there to
    say what is wrong here."""
    shadow = _shadowing_torch()
    if shadow is not None:
        return _shadowed_torch_sentence(shadow, error)
    if isinstance(error, AttributeError) or "torch" in sys.modules or not any(
            frame.f_globals.get("__name__", "").partition(".")[0] == "torch"
            for frame, _ in traceback.walk_tb(error.__traceback__)):
        return None
    reason = _first_line(error)
    if "failed to map segment" in reason or "Cannot allocate memory" in reason:
        limit = None
        with contextlib.suppress(ImportError, AttributeError, OSError, ValueError):
            import resource

            limit = resource.getrlimit(resource.RLIMIT_AS)[0]
            limit = None if limit == resource.RLIM_INFINITY or limit < 0 else limit
        advice = ("the process's memory limit leaves no room for torch's libraries: raise it"
                  + (f" (ulimit -v is {limit // 1024} here, in KiB)" if limit is not None else ""))
    else:
        advice = "check `python -c \"import torch\"` and reinstall the torch build for this machine"
    return f"torch cannot be imported ({type(error).__name__}: {reason}): {advice}."


def _one_line(message: str) -> str:
    """`message` without terminal colour codes (Gymnasium colours its warnings) and with every other unprintable
    character escaped: a user's text echoed in it cannot break the line."""
    message = re.sub(r"\x1b\[[0-9;]*m", "", message)
    # (a file name's undecodable bytes are kept: the output prints them as those bytes, `_path_bytes_else_escaped`)
    return "".join(ch if ch.isprintable() or _undecodable_byte(ch) else ch.encode("unicode_escape").decode("ascii")
                   for ch in message)


def _undecodable_byte(char: str) -> bool:
    """Whether `char` stands for a byte of a file name that was not valid in the locale's encoding (os.fsdecode's
    surrogate escapes)."""
    return 0xDC80 <= ord(char) <= 0xDCFF


def main(argv: list[str] | None = None) -> int:
    """Run the `rlspeed` command on `argv` (default: `sys.argv[1:]`) and return the exit code.

    A `UserError` (a bad argument included) prints one line and returns 2 (with `--debug` its traceback, still exit
    code 2 as the `rlspeed` command; a caller passing `argv` gets it raised); an env that raises prints one line and
    returns 1 (as does a warning that `-W error` makes an error); Ctrl-C returns 130. As the `rlspeed` command
    (`argv` None), warnings print as one `rlspeed: warning: ...` line each (with `--debug`, as Python prints them).
    """
    console = argv is None  # (the `rlspeed` command; a caller passing argv keeps its own warning handling)
    argv = list(sys.argv[1:] if argv is None else argv)
    if console and "TORCHELASTIC_RUN_ID" in os.environ:  # (a torchrun worker: SIGTERM, so saved, if torchrun dies)
        end_with_parent()
    if console:  # (a path or env id the output's encoding cannot show, PYTHONIOENCODING=ascii: escaped, no traceback)
        codecs.register_error(_OUTPUT_ERRORS, _path_bytes_else_escaped)
        for stream in (sys.stdout, sys.stderr):
            if hasattr(stream, "reconfigure"):
                stream.reconfigure(errors=_OUTPUT_ERRORS)
        # (a closed stream, `>&-` or `2>&-`, is None in Python: its lines go nowhere, as Python's own do)
        sys.stdout, sys.stderr = (stream if isinstance(stream, _ReaderMayLeave) else _ReaderMayLeave(
            stream if stream is not None else open(os.devnull, "w", encoding="utf-8"), name)  # noqa: SIM115
            for stream, name in ((sys.stdout, "standard output"), (sys.stderr, "")))
    # (a caller in the same process keeps its torch thread count, and its later models their default one: the
    # command sets both for itself, `configure_threads`)
    threads_before = None if console or "torch" not in sys.modules else sys.modules["torch"].get_num_threads()
    device_module = sys.modules.get("rlspeed.device")
    process_threads_before = getattr(device_module, "_process_threads", None)
    with warnings.catch_warnings():
        if console and warnings.showwarning is _PYTHON_SHOWWARNING and "--debug" not in argv:
            warnings.showwarning = _show_warning
            _SHOWN_WARNINGS.clear()
        code = None
        try:
            with command_advice("rlspeed"):  # (advice in the command line's terms: `in_words`)
                code = _main(argv)
            if console:
                code = _flushed(code)
            return code
        except UserError:  # (raised only with --debug: the command prints its traceback, with the same exit code)
            if not console:
                raise
            traceback.print_exc()
            return 2
        except _ReaderLeft:  # (a command whose output is all it does, its reader gone: 128 + SIGPIPE, as Unix tools)
            code = 141
            return code
        except _OutputFailed as failed:  # (a command whose output is all it does, which could not be written)
            print(failed.sentence(), file=sys.stderr, flush=True)
            code = 1
            return code
        except SystemExit as leaving:  # (--help, --version: argparse exits; a caller passing argv gets the code)
            if console:
                flushed = _flushed(0, stop=True) if leaving.code in (None, 0) else 0  # (their output is all they do)
                if flushed:
                    raise SystemExit(flushed) from None
                raise
            code = leaving.code if isinstance(leaving.code, int) else 0 if leaving.code is None else 1
            return code
        finally:
            if code and "TORCHELASTIC_RUN_ID" in os.environ:  # (a torchrun worker that said why it ends)
                tell_launcher(code)  # (no torch import: a stop may have cut torch's own short)
            _forget_worker_warnings()
            _settle_overwrites(succeeded=code == 0)  # (under the run directory's lock)
            _release_run_locks()  # (the command is over: the next one in this process may train there)
            if not console:
                if threads_before is not None:
                    sys.modules["torch"].set_num_threads(threads_before)
                if "rlspeed.device" in sys.modules:
                    sys.modules["rlspeed.device"]._process_threads = process_threads_before


def _print_error(line: str) -> None:
    """Print the error line `line` to stderr, unless another process of the same `rlspeed train --nproc` run has
    printed it (`first_to_say`): every process finds a bad input alike, and the user saw its sentence once per
    process."""
    if first_to_say(line):
        print(line, file=sys.stderr)


_OUTPUT_ERRORS = "rlspeed-output"


def _forget_worker_warnings() -> None:
    """The command is over: the warnings its subprocess envs' workers and it marked are removed."""
    global _warnings_dir
    if _warnings_dir is not None:
        shutil.rmtree(_warnings_dir, ignore_errors=True)
        _warnings_dir = None


def _path_bytes_else_escaped(error: UnicodeError) -> tuple[str | bytes, int]:
    """The CLI's output error handler: the bytes of a file name that is not valid in the locale's encoding
    (os.fsdecode's surrogates: printed as the name is, so it can be copied back), backslash escapes for any other
    character the output's encoding cannot show (PYTHONIOENCODING=ascii), never an exception."""
    if isinstance(error, UnicodeEncodeError):
        part = error.object[error.start:error.end]
        if all(map(_undecodable_byte, part)):
            return bytes(ord(char) - 0xDC00 for char in part), error.end
    return codecs.backslashreplace_errors(error)


class _ReaderMayLeave:
    """An output stream of the `rlspeed` command whose reader may leave (`rlspeed train ... | head -1`, `| grep -m1`):
    from then on its lines go to os.devnull and the command goes on with the exit code it would have had (a training
    run is not stopped, nor its success turned into a BrokenPipeError traceback, by the program reading its log).
    A stream that cannot be written otherwise (a log on a full disk, an I/O error) goes to os.devnull too: standard
    output's failure is said once on stderr, and a command whose output is all it does stops (`_OutputFailed`)."""

    def __init__(self, stream, name: str = ""):
        self._stream = stream
        self._name = name  # ("standard output": its failure is said on stderr; stderr's cannot be said anywhere)
        #: raise `_ReaderLeft` once the reader has left (a command whose output is all it does: `main` sets it)
        self.stop_when_gone = False
        self._failure_said = False

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._reader_left()
        except BlockingIOError:  # (a non-blocking pipe that is full: the caller may write again)
            raise
        except OSError as error:  # (a full disk, an I/O error)
            self._cannot_write(error)
        return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._reader_left()
        except BlockingIOError:
            raise
        except OSError as error:
            self._cannot_write(error)

    def _to_devnull(self) -> None:
        """Point the stream's file descriptor at os.devnull: what is still buffered, and Python's flush at exit, then
        write nowhere instead of failing again."""
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, self._stream.fileno())
            finally:
                os.close(devnull)

    def _reader_left(self) -> None:
        """The stream to os.devnull; then `_ReaderLeft` where the command should stop."""
        self._to_devnull()
        if self.stop_when_gone:
            self.stop_when_gone = False  # (once: the command's own clean-up may still write)
            raise _ReaderLeft

    def _cannot_write(self, error: OSError) -> None:
        """A write that failed other than for a reader gone: the stream to os.devnull; then `_OutputFailed` where the
        command should stop (its output is lost: `main` says so), else, for standard output, a warning on stderr."""
        self._to_devnull()
        if self.stop_when_gone:
            self.stop_when_gone = False
            raise _OutputFailed(self._name, error)
        if self._name and not self._failure_said:
            self._failure_said = True
            print(f"rlspeed: warning: cannot write {self._name} ({error.strerror or error}): its lines go nowhere "
                  "from here on; the command goes on.", file=sys.stderr, flush=True)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


class _ReaderLeft(BaseException):  # noqa: N818 (a stop, like KeyboardInterrupt: past `except Exception`)
    """The reader of a command's output left, and the command's output is all it does (`_ReaderMayLeave`)."""


class _OutputFailed(BaseException):  # noqa: N818 (a stop, as `_ReaderLeft`)
    """A command's output could not be written (a full disk, an I/O error), and the output is all the command does
    (`_ReaderMayLeave`): its args are the stream's name and the OSError."""

    def sentence(self) -> str:
        name, error = self.args
        return f"rlspeed: error: cannot write {name} ({error.strerror or error}): the command's output is lost."


def _flushed(code: int, stop: bool = False) -> int:
    """`code`, once standard output's buffered lines are written (a failure at Python's exit was an "Exception
    ignored" traceback and exit code 120): 141 where its reader left, 1 where it could not be written, for a command
    whose output is all it does (`stop`: --help and --version, whose parse did not set it)."""
    stream = sys.stdout
    if not isinstance(stream, _ReaderMayLeave):
        return code
    if stop:
        stream.stop_when_gone = True
    try:
        stream.flush()
    except _ReaderLeft:
        return 141
    except _OutputFailed as failed:
        print(failed.sentence(), file=sys.stderr, flush=True)
        return 1
    return code


#: the warnings this command has shown (`_show_warning`: each once)
_SHOWN_WARNINGS: set[str] = set()

#: where the command and the workers of its subprocess envs mark the warnings shown, a file each, so that each is
#: shown once over them (`_workers_show_warnings`); None until subprocess envs are made
_warnings_dir: str | None = None
_in_worker = False  # (this process is a worker of the command's subprocess envs: `_show_warnings_in_worker`)

#: Python's own `warnings.showwarning` (the CLI shows warnings as its own lines only where it is still in place)
_PYTHON_SHOWWARNING = warnings.showwarning


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning as the CLI's other lines: `rlspeed: warning: ...`, without the source line (`--debug` keeps
    Python's form); Gymnasium's own (its logger's "WARN: ") as `rlspeed: warning: Gymnasium: ...`. Under torchrun,
    rank 0's only: every rank runs the same code on its share of the envs and would say it once each (`--debug`
    shows every rank's)."""
    if "TORCHELASTIC_RUN_ID" in os.environ and os.environ.get("RANK", "0") != "0":
        return
    if getattr(category, "told_by_the_error", False):  # (a subprocess env's log of its error: the error line says it)
        return
    text = _one_line(str(message)).removeprefix("rlspeed: ")
    if text.startswith("WARN: "):  # (Gymnasium's logger: its env checker's and wrappers' notes, named as theirs)
        text = "Gymnasium: " + text.removeprefix("WARN: ")
    if text in _SHOWN_WARNINGS:  # (once per command, as Python's default: the same env made three times said it thrice)
        return
    _SHOWN_WARNINGS.add(text)
    if not _first_among_processes(text):  # (a subprocess env's worker, or the command, said it already)
        return
    # (above a progress bar drawn on this terminal, not into its line; a worker of subprocess envs draws none, though
    # a forked one inherits the parent's record of its bars, and tqdm's lock would be a semaphore left behind there)
    (print if _in_worker else _print_beside_bars)(f"rlspeed: warning: {text}", file=file or sys.stderr, flush=True)


def _first_among_processes(text: str) -> bool:
    """Whether warning `text` is shown for the first time among the command's processes (always, where it has no
    subprocess envs): the first to mark it in `_warnings_dir` shows it."""
    if _warnings_dir is None:
        return True
    name = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    try:
        os.close(os.open(os.path.join(_warnings_dir, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    except OSError:  # (the directory is gone: shown, rather than lost)
        return True
    return True


#: the name of a command's warnings directory starts with this, then its process id and machine
#: (`process_folder_prefix`)
_WARNINGS_PREFIX = "rlspeed-warnings-"


def _forget_killed_commands_warnings() -> None:
    """Remove the warnings directories (`_workers_show_warnings`) of commands that were killed before they could
    (SIGKILL: their `main` never reached its end), found by their process ids no longer running."""
    forget_ended_processes_folders(_WARNINGS_PREFIX)


def _workers_show_warnings():
    """What each worker process of subprocess envs runs first (GymnasiumEnv asks `warnings.showwarning` for it,
    so only where this display is in place): there warnings are the command's one line too, and each is shown once
    over the command's processes. Without it each worker said each warning again, and a spawned worker (macOS, Python
    3.14's forkserver) as Python's multi-line warning."""
    global _warnings_dir
    if _warnings_dir is None:
        _forget_killed_commands_warnings()
        _warnings_dir = tempfile.mkdtemp(prefix=process_folder_prefix(_WARNINGS_PREFIX))
        # (also at the process's exit: a torchrun worker leaves with os._exit after the exit handlers, never reaching
        # the end of `main`, and left its directory behind at each --nproc run with subprocess envs)
        atexit.unregister(_forget_worker_warnings)
        atexit.register(_forget_worker_warnings)
        for text in _SHOWN_WARNINGS:  # (what the command said before: not again in a worker)
            _first_among_processes(text)
    return functools.partial(_show_warnings_in_worker, _warnings_dir)


def _show_warnings_in_worker(directory: str) -> None:
    global _warnings_dir, _in_worker
    _warnings_dir, _in_worker = directory, True
    warnings.showwarning = _show_warning


_show_warning.for_workers = _workers_show_warnings


#: CleanRL's flags for settings rlspeed has under another name (those with no one name: `CLEANRL_NAMES`)
_CLEANRL_FLAGS = {"update_epochs": "n_epochs", "train_frequency": "train_freq", "policy_noise": "target_policy_noise",
                  "noise_clip": "target_noise_clip", "norm_adv": "normalize_advantage", "clip_coef": "clip_range",
                  "target_network_frequency": "target_update_interval", "start_e": "exploration_initial_eps",
                  "end_e": "exploration_final_eps", "policy_frequency": "policy_delay",
                  "exploration_noise": "action_noise_std"}


#: W&B's settings `--track` takes from wandb's environment variables (no flag of their own), by the `--wandb-X` flag
#: a user may try
_WANDB_VARIABLES = {**dict.fromkeys(("group", "run_group"), "WANDB_RUN_GROUP"),
                    **dict.fromkeys(("name", "run_name"), "WANDB_NAME"), "tags": "WANDB_TAGS", "notes": "WANDB_NOTES",
                    "job_type": "WANDB_JOB_TYPE", "mode": "WANDB_MODE", "dir": "WANDB_DIR"}


def _pairs_after_flag(unknown: list[str], argv: list[str]) -> tuple[str, list[str]] | None:
    """(flag, its KEY=VALUE and the ones after it) where the first unrecognized argument is a KEY=VALUE that follows
    `--set KEY=VALUE` or `--env-kwargs KEY=VALUE` with only such pairs between (`--env-kwargs a=1 b=2`), else None."""
    if not unknown or unknown[0].startswith("-") or "=" not in unknown[0] or unknown[0] not in argv:
        return None
    at = argv.index(unknown[0])
    start = at
    while start > 0 and not argv[start - 1].startswith("-") and "=" in argv[start - 1]:
        start -= 1
    if start == at or start == 0 or argv[start - 1] not in ("--set", "--env-kwargs"):
        return None
    end = at
    while end < len(argv) and not argv[end].startswith("-") and "=" in argv[end]:
        end += 1
    return argv[start - 1], argv[start:end]


def _value_after_key(unknown: list[str], argv: list[str]) -> tuple[str, str] | None:
    """(flag, key) where the first unrecognized argument follows `--set KEY` or `--env-kwargs KEY` (a key without
    `=`: its value given as a word of its own), else None."""
    if not unknown or unknown[0].startswith("--"):
        return None
    # (any place of the word: the same word may be another option's value too, `--seed 3 --set n_epochs 3`)
    return next(((argv[at - 2], argv[at - 1]) for at, arg in enumerate(argv) if arg == unknown[0] and at >= 2
                 and argv[at - 2] in ("--set", "--env-kwargs") and "=" not in argv[at - 1]), None)


def _env_id_flag_hint(text: str, argv: list[str]) -> str:
    """`rlspeed train ppo --env-id=CartPole-v1` (CleanRL's flag with its id joined on, which argparse did not take as
    ENV_ID): the missing ENV_ID is said with the rule for CleanRL's flag, as `--env-id CartPole-v1` gets it."""
    if "ENV_ID" not in text or not any(arg.split("=")[0] == "--env-id" for arg in argv):
        return text
    from rlspeed.algos.base import CLEANRL_NAMES

    return f"{text.split(' (see ')[0]}; --env-id is CleanRL's argument: {CLEANRL_NAMES['env_id']}."


def _swallowed_hint(text: str, argv: list[str]) -> str:
    """`--gym-packages MODULE ALGO ENV_ID`: the option takes every word up to the next option, so argparse said the
    command's arguments, taken as modules, were missing; the error names the words it took and where to put it."""
    missing = re.match(r"^the following arguments are required: ([^(]+?) \(see", text)
    at = next((i for i, arg in enumerate(argv) if len(arg) > 3 and "--gym-packages".startswith(arg)), None)
    if missing is None or at is None:
        return text
    taken = list(itertools.takewhile(lambda arg: not arg.startswith("-"), argv[at + 1:]))
    if len(taken) < 2:
        return text
    return (f"the following arguments are required: {missing[1]}; --gym-packages took {' '.join(taken)} as modules (it "
            f"takes every word up to the next option): give {missing[1].replace(',', '')} before it"
            + text[missing.end(1):])


#: the flag of each command that takes the env steps to run, and the names other commands or tools give it
#: the names of a command's env steps to run, here (an option's dest: train's total_timesteps, profile's steps, tune's
#: budget) and in other tools
_BUDGET_NAMES = ("steps", "timesteps", "total_timesteps", "total_steps", "budget", "n_timesteps")


def _budget_flags(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Each command's option of the env steps to run (the one whose dest is one of `_BUDGET_NAMES`), by command."""
    return {name: action.option_strings[0] for name, sub in _commands(parser).items() for action in sub._actions
            if action.dest in _BUDGET_NAMES and action.option_strings}


def _unrecognized_hint(text: str, argv: list[str], command: str, parser: argparse.ArgumentParser) -> str:
    """An unrecognized `--num-steps 128` (a hyperparameter written as a flag, as CleanRL's scripts take them) or
    `--capture-video` (CleanRL's argument): the error names `--set num_steps=128`, or the setting that does it."""
    from rlspeed.algos import ALGORITHMS
    from rlspeed.algos.base import _SHORT_NAMES, CLEANRL_NAMES

    unknown = text.removeprefix("unrecognized arguments:").split(" (see ")[0].split()
    split = _value_after_key(unknown, argv)
    if split is not None:  # (`--set learning_rate 1e-3`: the key and its value as two words)
        flag, key = split
        return (f"unrecognized arguments: {' '.join(unknown)}; {flag} takes KEY=VALUE as one word: {flag} "
                f"{shlex.quote(f'{key}={unknown[0]}')}.")
    pairs = _pairs_after_flag(unknown, argv)
    if pairs is not None:  # (RL-Zoo's --env-kwargs and --hyperparams take several after one flag)
        flag, given = pairs
        return (f"unrecognized arguments: {' '.join(unknown)}; {flag} takes one KEY=VALUE each: "
                + " ".join(f"{flag} {shlex.quote(pair)}" for pair in given) + ".")
    flag = next((item for item in unknown if item.startswith("--")), None)
    if flag is None:
        return text
    budget_flags = _budget_flags(parser)
    if command not in budget_flags:
        return _close_option_hint(text, flag, command)
    name, _, value = flag[2:].partition("=")
    name = name.replace("-", "_")
    if not value:
        following = argv[argv.index(flag) + 1:argv.index(flag) + 2] if flag in argv else []
        is_value = following and (not following[0].startswith("-") or re.fullmatch(r"-[\d.]+(e[+-]?\d+)?",
                                                                                    following[0]))
        value = following[0] if is_value else "VALUE"
    # (the algorithm: the first word after the command that names one, options and their values before it or not)
    after = argv[argv.index(command) + 1:]
    algo_cls = next((ALGORITHMS[word.lower()] for word in after if word.lower() in ALGORITHMS), None)
    fields = [field.name for field in dataclasses.fields(algo_cls.config_cls)] if algo_cls is not None else []
    given = " ".join(unknown)
    variable = _WANDB_VARIABLES.get(name.removeprefix("wandb_")) if name.startswith("wandb_") else None
    if variable is not None and command == "train":
        return (f"unrecognized arguments: {given}; --track takes this W&B setting from its environment variable: "
                f"{variable}={shlex.quote(value)} rlspeed train ... --track (--wandb-project and --wandb-entity are "
                "flags).")
    # (--lr: learning_rate; CleanRL's names of rlspeed's settings; close names are not guessed at: --steps is no n_step)
    key = {**_SHORT_NAMES, **_CLEANRL_FLAGS}.get(name, name)
    if key in fields:
        return f"unrecognized arguments: {given}; hyperparameters are given with --set: --set {key}={value}."
    if name in _BUDGET_NAMES:  # (another command's, or another tool's, name of the env steps to run)
        return (f"unrecognized arguments: {given}; rlspeed {command}'s env steps are {budget_flags[command]} "
                f"{value} (" + ", ".join(f"rlspeed {other}'s {option}" for other, option in budget_flags.items()
                                        if other != command) + ").")
    if name in CLEANRL_NAMES:
        return (f"unrecognized arguments: {given}; {flag.split('=')[0]} is CleanRL's argument: {CLEANRL_NAMES[name]} "
                "(hyperparameters are given with --set KEY=VALUE).")
    if name == "trained_agent" and command == "train":
        return (f"unrecognized arguments: {given}; {flag.split('=')[0]} is RL-Zoo's: --init-from {value} starts from "
                "a saved model's networks.")
    return _close_option_hint(text, flag, command)


def _close_option_hint(text: str, flag: str, command: str | None) -> str:
    """A misspelled `--total-timestpes` (or `--jsn`; `rlspeed --verison`, `command` None): the error names the
    command's closest option, as an unknown command or choice names its closest one; `text` as it is where none is
    close."""
    parser = build_parser()
    commands = _commands(parser)
    if command is not None and command not in commands:
        return text
    options = [option for action in (commands[command] if command else parser)._actions
               for option in action.option_strings if option.startswith("--")]
    close = difflib.get_close_matches(flag.split("=")[0], options, n=1, cutoff=0.8)
    if not close:
        return text
    given, see = text.rstrip(".").rsplit(" (see ", 1) if " (see " in text else (text.rstrip("."), None)
    return f"{given}: did you mean {close[0]}?" + (f" (see {see}." if see else "")


#: eval's options that train, profile or tune would take for an abbreviation of their own: what does it there
_OTHER_COMMANDS_OPTIONS = {"--env": "; the env is ENV_ID (its options: --env-kwargs KEY=VALUE)",
                           "--video": "; train films with --video-every N"}


def _refuse_other_commands_option(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """UserError where an option of another command is given to a command with options it abbreviates: argparse took
    `rlspeed tune ... --env CartPole-v1` (eval's --env) for --env-kwargs and `rlspeed train ... --video F` for
    --video-every, and refused the value as theirs, naming an option the user did not give."""
    commands = _commands(parser)
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    if command not in commands:
        return
    own = {option for action in commands[command]._actions for option in action.option_strings}
    for item in argv[argv.index(command) + 1:]:
        if item == "--":  # (what follows is positional)
            return
        flag = item.split("=", 1)[0]
        if not flag.startswith("--") or flag in own or not any(option.startswith(flag) for option in own):
            continue
        other = next((name for name, sub in commands.items() if name != command
                      and any(flag in action.option_strings for action in sub._actions)), None)
        if other is not None:
            raise UserError(f"{flag} is an option of rlspeed {other}, not of rlspeed {command}"
                            f"{_OTHER_COMMANDS_OPTIONS.get(flag, '')} (see 'rlspeed {command} --help').")


def _main(argv: list[str]) -> int:
    _stage(None)  # (a caller's earlier command's is not this one's)
    _TAKEN_IN.clear()
    _RUN_RETURNED.clear()
    stdout = sys.stdout if isinstance(sys.stdout, _ReaderMayLeave) else None  # (the `rlspeed` command's, `main`)
    if stdout is not None:  # --help and --version write while parsing: their output is all they do
        stdout.stop_when_gone = True
    try:
        parser = build_parser()
        _refuse_other_commands_option(parser, argv)
        args = parser.parse_args(argv)
    except UserError as error:
        if stdout is not None:
            stdout.stop_when_gone = False
        text = _one_line(str(error))
        command = next((arg for arg in argv if not arg.startswith("-")), None)
        if text.startswith("unrecognized arguments") and command is not None:
            # (options after the command are checked by the top parser: point to the command's own help)
            text = text.replace("(see 'rlspeed --help')", f"(see 'rlspeed {command} --help')")
            text = _unrecognized_hint(text, argv, command, parser)
        elif text.startswith("the following arguments are required"):
            text = _env_id_flag_hint(_swallowed_hint(text, argv), argv)
        elif command is None and text.startswith("a command is required") and set(argv) - {"--debug"}:
            # (`rlspeed --verison`: the unknown option is named, and its closest one, not the missing command)
            unknown = [arg for arg in argv if arg != "--debug"]
            text = _close_option_hint(f"unrecognized arguments: {' '.join(unknown)} (see 'rlspeed --help').",
                                      unknown[0], None)
        if "--debug" in argv:  # (the traceback, with the same sentence)
            raise UserError(text) from error
        print(f"rlspeed: error: {text}", file=sys.stderr)
        return 2
    args.argv = argv  # what `--nproc` hands each torchrun worker (less its own options)
    if getattr(args, "quiet", False):  # (no bar nor status lines; `_say_for` leaves out the rest of them)
        args.no_progress = True
    if stdout is not None:
        # a command whose output is all it does stops when the reader of its output leaves (`rlspeed doctor | head`),
        # as Unix tools do; training, tuning, exporting and filming go on
        stdout.stop_when_gone = args.func in (cmd_doctor, cmd_profile) or (args.func is cmd_eval
                                                                            and args.video is None)
    try:
        # (an env's close() error after the work succeeded comes last, its results saved and printed; after a failure,
        # that failure is the one shown)
        with CloseErrors() as closing:
            code = int(args.func(args) or 0)
        if code == 0:
            _record_close_error(args, closing)
            closing.raise_first()
        return code
    except UserError as error:
        if getattr(args, "debug", False):
            raise
        if not getattr(error, "said_before", False):  # (a torchrun restart refused as before: said)
            _print_error(f"rlspeed: error: {_one_line(str(error))}")
        return 75 if isinstance(error, Busy) else 2  # (75: another process holds the run or study; again later)
    except EnvStepError as error:
        if getattr(args, "debug", False):
            raise
        _print_error(f"rlspeed: error: {_one_line(str(error))} (--debug shows the env's traceback).")
        return 1
    except Warning as error:  # (a warning raised as an error: `python -W error`, PYTHONWARNINGS=error)
        if getattr(args, "debug", False):
            raise
        text = _one_line(str(error)).removeprefix("rlspeed: ").rstrip(".")
        _print_error(f"rlspeed: error: {text} ({type(error).__name__}, an error by the warning filter, -W error or "
                     "PYTHONWARNINGS; --debug shows the traceback).")
        return 1
    except PeerEnded as error:  # (the process that ended has said why: this one's line only names it)
        if getattr(args, "debug", False):
            raise
        print(f"rlspeed: {_one_line(str(error))}", file=sys.stderr)
        tell_launcher(1, follows=True)  # (the run's exit code is the process's that ended first)
        return 1
    except (MemoryError, RuntimeError) as error:  # (torch's OutOfMemoryError is a RuntimeError)
        text = str(error)
        if getattr(args, "debug", False) or not (isinstance(error, MemoryError) or "allocate memory" in text
                                                  or "out of memory" in text.lower()):
            raise
        # (torch's allocator prefixes its source line, "[enforce fail at alloc_cpu.cpp:127] err == 0. ", which cut
        # the reason at its end, "(Cannot allocate memory)", to "(Cannot allocate")
        text = re.sub(r"^\[enforce fail at [^\]]*\]\s*(err == 0\.\s*)?", "", _one_line(text or type(error).__name__))
        text = text if len(text) <= 160 else text[:157] + "..."
        print(f"rlspeed: error: out of memory ({text}): use fewer envs, episodes or a smaller buffer (--device cpu "
              "when a device is full).", file=sys.stderr)
        return 2
    except (ImportError, AttributeError) as error:  # (AttributeError: a torch.py that imports, lacking torch's names)
        sentence = _torch_import_failure(error)
        if getattr(args, "debug", False) or sentence is None:
            raise
        print(f"rlspeed: error: {sentence}", file=sys.stderr)
        return 2
    except FileNotFoundError as error:
        # (Python's tempfile where /tmp, /var/tmp and the working directory are all read-only, and TMPDIR names none
        # that is writable: torch's own modules ask it for a directory as they load)
        if getattr(args, "debug", False) or not str(error.strerror).startswith("No usable temporary directory"):
            raise
        print(f"rlspeed: error: {_one_line(error.strerror).rstrip('.')}: set TMPDIR to a directory you can write to.",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:  # (Ctrl-C, or `Terminated` where a command turns SIGTERM into it)
        terminated = isinstance(stop, Terminated)
        code, name = _stop_said(stop)
        if _STAGE:  # (what it was doing, and what that leaves: before the work began, nothing of it)
            line = f"rlspeed: interrupted ({name}) {_STAGE['said']}."
        else:
            line = f"rlspeed: interrupted{f' ({stop.name})' if terminated else ''}"
        if (_TAKEN_IN or _RUN_RETURNED) and "TORCHELASTIC_RUN_ID" in os.environ:
            # (torchrun's signal as it shuts down a worker whose run stopped for one already, or one whose run has
            # returned and waits for rank 0's save: that stop's line is said, by rank 0, and this worker ends with the
            # first stop's code)
            code = _stop_said(_stop_of(_TAKEN_IN[0]))[0] if _TAKEN_IN else code
            if not _TAKEN_IN and os.environ.get("RANK", "0") == "0" and not os.environ.get(LAUNCHER_PID_VARIABLE):
                # (a stop as the processes leave, the run ended, under torchrun started by hand: no launcher says it;
                # its line is one process's at that moment, the stage's: "while ending the command: the run is saved")
                print(line, file=sys.stderr)
            return code
        if first_to_say(line):  # (torchrun signals each worker: those it stopped alike say it once)
            print(line, file=sys.stderr)
        return code


if __name__ == "__main__":
    raise SystemExit(main())
