"""`rlspeed tune`: hyperparameter search with Optuna, K trials trained at once as one population.

The study lives in an Optuna storage (SQLite by default, which `optuna-dashboard sqlite:///FILE.db` opens). Each
batch asks the sampler for K trials (one storage write each: `_ask_batch`), trains them as one
`rlspeed.population.Population` (member k takes trial k's hyperparameters; every trial of the study the one seed
`seed`, so trials differ by their configuration alone: the same initial weights where shapes match, the same env and
sampling streams, common random numbers as RL-Zoo's tuner seeds every trial's envs with its one seed),
reports every evaluation to its trial (`trial.report`) and removes the members whose trial `should_prune()`, then
tells Optuna each trial's result. After
every batch the best trial so far is written as a preset YAML that `rlspeed train --preset FILE` reads; when the
study is done, the best trials and the starting configuration are trained again on the same new seeds (candidate
j's i-th run takes the i-th, as every other candidate's: `_CONFIRM_SEED_OFFSET`) and the best median is written instead
(one trial is one seed, so the best single trial is partly the configuration that suits that seed best).

Only hyperparameters that may differ across members are searched (those of the population class, `per_member_keys`):
the shape-changing ones (net_arch, num_envs, num_steps, batch_size, n_epochs, ...) stay fixed at the preset's values
(or `--set`'s) for the whole study, so every trial of a batch fits one batched model.

Objective (minimised): with a target return, the env steps (per member) to reach it in evaluation, confirmed as
`rlspeed train` confirms a target; a trial that does not reach it within the budget scores
`budget * (1 + max(target - final_eval, 0) / max(|target|, 1))`, which is above any reaching trial's and falls as its
final evaluation rises. Without a target: minus the final evaluation (deterministic; `eval_episodes` episodes, as
every evaluation of the trials: 10 by default).

Resume: the same command (same storage and study name) continues the study until `trials` trials have finished
(complete or pruned). Trials of a batch that was interrupted (Ctrl-C, SIGTERM, an error) are marked failed before the
command exits, and trials left running by a killed process are marked failed when the study is resumed (on a
database server's storage, which is not locked, only with `fail_running`: they may be another process's); failed
trials do not count toward `trials`, so they are redone. One process at a time may run a study.
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import functools
import hashlib
import itertools
import json
import math
import os
import re
import shlex
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import yaml

from rlspeed import yamlfile
from rlspeed.errors import UserError, positive_whole
from rlspeed.files import local_path, refuse_irregular_file, unwritable, write_atomic
from rlspeed.locks import let_go
from rlspeed.logging import cut_short, format_return, whole_iterations

#: The default search space of each algorithm with a population (`rlspeed.population.IMPLEMENTATIONS`): RL-Zoo's
#: (rl_zoo3's hyperparams_opt.py) restricted to hyperparameters that may differ across members of a population. Ranges
#: are those of the hyperparameter itself; `one_minus` samples 1 - value (on a log scale with `log`), as RL-Zoo samples
#: one_minus_gamma. gamma, gae_lambda and learning_rate are widened beyond RL-Zoo's (0.97-0.9999, 0.9-0.9999,
#: <= 2e-3) to hold the values of rlspeed's shipped presets.
DEFAULT_SPACES: dict[str, dict] = {
    "ppo": {
        "learning_rate": {"low": 1.0e-5, "high": 1.0e-2, "log": True},
        "gamma": {"low": 0.9, "high": 0.9999, "log": True, "one_minus": True},
        "gae_lambda": {"low": 0.8, "high": 0.9999, "log": True, "one_minus": True},
        "ent_coef": {"low": 1.0e-8, "high": 0.1, "log": True},
        "clip_range": {"choices": [0.1, 0.2, 0.3, 0.4]},
        "max_grad_norm": {"low": 0.3, "high": 2.0},
    },
    "a2c": {
        "learning_rate": {"low": 1.0e-5, "high": 1.0e-2, "log": True},
        "gamma": {"low": 0.9, "high": 0.9999, "log": True, "one_minus": True},
        "gae_lambda": {"low": 0.8, "high": 0.9999, "log": True, "one_minus": True},
        "ent_coef": {"low": 1.0e-8, "high": 0.1, "log": True},
        "max_grad_norm": {"low": 0.3, "high": 2.0},
    },
    "sac": {
        "learning_rate": {"low": 1.0e-5, "high": 1.0e-2, "log": True},
        "gamma": {"low": 0.9, "high": 0.9999, "log": True, "one_minus": True},
        "tau": {"low": 0.001, "high": 0.08, "log": True},
    },
    "td3": {
        "learning_rate": {"low": 1.0e-5, "high": 1.0e-2, "log": True},
        "gamma": {"low": 0.9, "high": 0.9999, "log": True, "one_minus": True},
        "tau": {"low": 0.001, "high": 0.08, "log": True},
        "action_noise_std": {"low": 0.0, "high": 0.5},
    },
    "dqn": {
        "learning_rate": {"low": 1.0e-5, "high": 1.0e-2, "log": True},
        "gamma": {"low": 0.9, "high": 0.9999, "log": True, "one_minus": True},
        "exploration_fraction": {"low": 0.0, "high": 0.5},  # (RL-Zoo's range)
        "exploration_final_eps": {"low": 0.0, "high": 0.2},
    },
}
DEFAULT_SPACES["ddpg"] = DEFAULT_SPACES["td3"]  # (RL-Zoo samples DDPG's as TD3's)
_SPEC_FIELDS = {"low", "high", "log", "one_minus", "choices"}
#: A number with an exponent but no dot, which YAML 1.1 reads as text (1e-5)
_EXPONENT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+")
#: A number written as text
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_STUDY_ATTR = "rlspeed"  # the study's user attribute that records what it was made for
#: the env steps between a trial's evaluations, without --eval-freq or a preset's, in a study whose record has no
#: "default_eval_freq" (an older rlspeed's): its populations' default then, which its trials' reports were made at
OLDER_STUDY_EVAL_FREQ = 10_000
#: the confirmation's run i of every candidate trains with seed `(seed + _CONFIRM_SEED_OFFSET + i) % 2**32`: seeds no
#: trial used, within the seeds a model takes (below 2**32) whatever the study's seed
_CONFIRM_SEED_OFFSET = 1_000_000


def per_member_keys(algo_cls: type) -> tuple[str, ...]:
    """The hyperparameters that may differ across members of `algo_cls`'s population (its class's `per_member`);
    UserError when the algorithm has no population yet."""
    from rlspeed.population import IMPLEMENTATIONS

    implementation = IMPLEMENTATIONS.get(algo_cls.__name__)
    if implementation is None:
        raise UserError(f"{algo_cls.__name__} has no population yet (populations cover "
                        f"{', '.join(sorted(IMPLEMENTATIONS))}), so it cannot be trained with --seeds or tuned.")
    return tuple(implementation.per_member)


# --- the search space ------------------------------------------------------------------------------------------
def load_search_space(path: str | Path | None, algo_cls: type, hyperparameters: dict,
                      fixed: tuple[str, ...] = ()) -> tuple[dict, list[str]]:
    """(search space, notes): the YAML file at `path` (the whole space: hyperparameter -> `{low, high[, log,
    one_minus]}`, `{choices: [...]}` or a fixed value), else the algorithm's `DEFAULT_SPACES` entry. The names in
    `fixed` (given with --set) leave the space; the default space keeps only per-member hyperparameters (a note names
    the others). Every end of a range is checked against `hyperparameters` (the fixed values trials start from).
    UserError for a bad file, a bad entry, or a file entry that cannot differ across members."""
    from rlspeed.algos.base import build_config

    member_keys = per_member_keys(algo_cls)
    notes: list[str] = []
    if path is None:
        space = dict(DEFAULT_SPACES.get(algo_cls.name, {}))
        dropped = [key for key in space if key not in member_keys]
        if dropped:
            notes.append(f"not searched (they cannot differ across members yet): {', '.join(dropped)}")
        space = {key: value for key, value in space.items() if key in member_keys}
        where = f"the default {algo_cls.name} search space"
    else:
        path = local_path(path)  # (`~` expanded, as the shell expands it on the command line)
        give = "a YAML file mapping hyperparameters to ranges (see docs/tune.md)"
        # (named as the search space, not as `--search-space` or `search_space=`: the file is what either caller gave)
        refuse_irregular_file(path, f"The search space file {path}", give)
        if not path.is_file():
            raise UserError(f"The search space file {path}: no such file; give {give}.")
        space = yamlfile.read_file(path)[1]
        if not isinstance(space, dict) or not space:
            raise UserError(f"{path} must map hyperparameter names to ranges ({{low, high}}, {{choices}}) or values.")
        space = {str(key): value for key, value in space.items()}
        where = str(path)
        known = {field.name for field in dataclasses.fields(algo_cls.config_cls)}
        for key in space:
            if key not in known:  # (a typo, or another library's short name: said as --set says it)
                from rlspeed.algos.base import _SHORT_NAMES

                named = _SHORT_NAMES.get(key.lower())
                close = ([named] if named in member_keys else []) or difflib.get_close_matches(key, sorted(member_keys),
                                                                                            n=3)
                hint = f"Did you mean {', '.join(close)}?" if close else f"Searchable: {', '.join(member_keys)}."
                raise UserError(f"{where}: unknown hyperparameter '{key}' for {algo_cls.__name__}. {hint}")
            if key not in member_keys:
                raise UserError(f"{where}: '{key}' cannot differ across the members of a population, so it cannot be "
                                f"searched; fix it with --set {key}=VALUE (searchable: {', '.join(member_keys)}).")
    overlap = [key for key in space if key in fixed]
    if overlap:
        notes.append(f"fixed by --set, not searched: {', '.join(overlap)}")
        space = {key: value for key, value in space.items() if key not in fixed}
    for key, spec in space.items():
        _check_spec(where, key, spec)
        for value in _extremes(spec):  # each end of a range must be a valid value of the hyperparameter
            try:
                build_config(algo_cls.config_cls, {**hyperparameters, key: value})
            except UserError as error:
                raise UserError(f"{where}: {key} = {value} is refused: {error}") from None
    if not any(isinstance(spec, dict) for spec in space.values()):
        pinned = f" (--set fixed {', '.join(overlap)})" if overlap else ""
        raise UserError(f"{where} leaves nothing to search{pinned}: give at least one range or list of choices"
                        + (" that --set does not fix." if overlap else "."))
    return space, notes


def _check_spec(where: str, key: str, spec) -> None:
    if isinstance(spec, bool) or not isinstance(spec, (int, float, str, dict)):
        raise UserError(f"{where}: {key} must be a value, {{low, high}} or {{choices: [...]}}, got {spec!r}.")
    if not isinstance(spec, dict):
        return
    unknown = sorted(set(spec) - _SPEC_FIELDS)
    if unknown:
        raise UserError(f"{where}: {key} has unknown field(s) {', '.join(unknown)} (use low, high, log, one_minus, or "
                        "choices).")
    if "choices" in spec:
        choices = spec["choices"]
        if set(spec) != {"choices"} or not isinstance(choices, list) or not choices:
            raise UserError(f"{where}: {key}: choices must be a non-empty list, alone.")
        choices[:] = [float(c) if isinstance(c, str) and _EXPONENT.fullmatch(c) else c for c in choices]
        numbers = [isinstance(c, (int, float)) and not isinstance(c, bool) for c in choices]
        quoted = [c for c in choices if isinstance(c, str) and _NUMBER.fullmatch(c.strip())]
        if any(numbers) and quoted:  # ("0.2" beside 0.1: trained as a number, written as text; null and auto are fine)
            raise UserError(f"{where}: {key}: choices hold numbers and quoted numbers "
                            f"({', '.join(map(repr, quoted))}); write every number unquoted.")
        return
    for bound in ("low", "high"):  # (YAML 1.1 reads 1e-5, an exponent without a dot, as text)
        if isinstance(spec.get(bound), str) and _EXPONENT.fullmatch(spec[bound]):
            spec[bound] = float(spec[bound])
    low, high = spec.get("low"), spec.get("high")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in (low, high)):
        raise UserError(f"{where}: {key} needs numbers low and high, got low={low!r}, high={high!r}.")
    if not low < high:
        raise UserError(f"{where}: {key}: low ({low}) must be below high ({high}).")
    for flag in ("log", "one_minus"):
        if not isinstance(spec.get(flag, False), bool):
            raise UserError(f"{where}: {key}: {flag} must be true or false.")
    if spec.get("one_minus") and high >= 1:
        raise UserError(f"{where}: {key}: with one_minus, high ({high}) must be below 1 (1 - value is sampled).")
    if spec.get("log") and not spec.get("one_minus") and low <= 0:
        raise UserError(f"{where}: {key}: a log range needs low > 0, got {low}.")


def _extremes(spec) -> list:
    if not isinstance(spec, dict):
        return [spec]
    if "choices" in spec:
        return list(spec["choices"])
    return [spec["low"], spec["high"]]


def sample(trial, space: dict) -> dict:
    """One trial's hyperparameters from `space` (Optuna names a `one_minus` parameter `one_minus_<key>`)."""
    values = {}
    for key, spec in space.items():
        if not isinstance(spec, dict):
            values[key] = spec
        elif "choices" in spec:
            values[key] = trial.suggest_categorical(key, spec["choices"])
        elif spec.get("one_minus"):
            values[key] = 1.0 - trial.suggest_float(f"one_minus_{key}", 1.0 - spec["high"], 1.0 - spec["low"],
                                                    log=bool(spec.get("log")))
        else:
            values[key] = trial.suggest_float(key, float(spec["low"]), float(spec["high"]), log=bool(spec.get("log")))
    return values


# --- the objective ---------------------------------------------------------------------------------------------
def objective(member: dict, target_return: float | None, budget: int) -> float:
    """A member's score (lower is better): steps to the target when reached; else `budget * (1 + gap) + 1` with
    `gap = max(target - final_eval, 0) / max(|target|, 1)`, `budget` the steps each member trained (the learn call's
    budget rounded up to whole iterations): above every member that reached it, even at the last step; without a
    target, minus the final evaluation."""
    final = float(member["final_eval"]["mean"])
    if target_return is None:
        return -final
    if member.get("steps_to_target") is not None:
        return float(member["steps_to_target"])
    gap = max(target_return - final, 0.0) / max(abs(target_return), 1.0)
    return float(budget) * (1.0 + gap) + 1.0


# --- the study -------------------------------------------------------------------------------------------------
def storage_url(storage: str) -> str:
    """An Optuna storage URL: a URL as given, or a plain file path as `sqlite:///PATH`."""
    return storage if "://" in storage else f"sqlite:///{storage}"


#: the password of a URL (`scheme://user:PASSWORD@host`), in a storage URL or a command line holding one
_URL_PASSWORD = re.compile(r"(?P<before>\b[A-Za-z][A-Za-z0-9+.-]*://[^:/@\s]*:)[^@\s]+(?=@)")


def without_password(text: str) -> str:
    """`text` (a storage URL, a command or a message holding one) with the password of each URL in it as `***`: what
    rlspeed prints, writes into a preset or puts in an error message (a database server's URL carries one)."""
    return _URL_PASSWORD.sub(r"\g<before>***", text)


def same_storage(first: str, second: str) -> bool:
    """Whether two storage URLs name one database: SQLite files by their resolved paths (`two.db`, `./two.db` and its
    absolute path are one), other URLs as written. A path is the command line's (a name the locale cannot read as
    its `\\udcXX` surrogates) or a preset's (`utf8_text`: UTF-8 bytes as their characters): both name the same file
    under any locale."""
    paths = [url[len("sqlite:///"):] if url.startswith("sqlite:///") else None for url in (first, second)]
    if paths[0] is not None and paths[1] is not None:
        return os.path.realpath(_path_bytes(paths[0])) == os.path.realpath(_path_bytes(paths[1]))
    return first == second


def _path_bytes(path: str) -> bytes:
    """The bytes of file name `path`: the locale's encoding's, or UTF-8's for a name it cannot hold (a preset's,
    read under an ASCII locale)."""
    try:
        return os.fsencode(path)
    except UnicodeEncodeError:
        return path.encode("utf-8", "surrogateescape")


#: what sets the number of a study's members at once, as a refusal names it (`check_members_fit`)
POPULATION_OPTION = ("--population; population= in Python", "--population {fits}",
                     "--set buffer_size={buffer}; hyperparameters= in Python")


@dataclass
class _Setup:
    """What every batch of a study trains with."""

    algo_cls: type
    env_id: str
    hyperparameters: dict  # the values every trial starts from
    space: dict
    budget: int
    target_return: float | None
    eval_freq: int | None
    seed: int
    device: object
    preset_timesteps: int  # the total_timesteps the preset file gets
    progress_bar: bool = True  # a bar over each batch's training (and the confirmation's), and long asks and builds
    env_kwargs: dict = dataclasses.field(default_factory=dict)  # the env's options, every trial's
    annealed: tuple[str, ...] = ()  # the settings whose schedules decay over a learn call's steps (the budget)
    eval_episodes: int = 10  # the episodes of every evaluation of a trial, the final one included
    at_once: int = 16  # the most members one population trains (--population), the confirmation's too
    #: where `eval_freq` is None, the interval the trials evaluate at if not their population's default (a study an
    #: older rlspeed made: its trials' interval, `OLDER_STUDY_EVAL_FREQ`); not written to the preset
    trial_eval_freq: int | None = None

    def population(self, seeds: list[int], per_member: dict):
        """The population of `seeds` (a batch of trials, a chunk of the confirmation), planned for `budget` steps:
        refused, naming --population, where its members would not fit in memory (`check_members_fit`)."""
        from rlspeed.population import Population
        from rlspeed.population.base import planned_timesteps, shared_seeds

        with planned_timesteps(self.budget, self.progress_bar, option=POPULATION_OPTION), shared_seeds():
            return Population(self.algo_cls, self.env_id, seeds=seeds, device=self.device,
                              env_kwargs=self.env_kwargs or None, **{**self.hyperparameters, **per_member})

    def learn(self, members, on_eval=None) -> dict:
        # (a pruned trial's value is its last report: a final evaluation would only repeat it, at another cost)
        kwargs = {"target_return": self.target_return, "stop": "each", "on_eval": on_eval,
                  "progress_bar": self.progress_bar, "eval_episodes": self.eval_episodes, "evaluate_pruned": False}
        eval_freq = self.trial_eval_freq if self.eval_freq is None else self.eval_freq
        if eval_freq is not None:
            kwargs["eval_freq"] = eval_freq
        return members.learn(self.budget, **kwargs)


class BatchPruner(Protocol):
    """What `rlspeed tune` needs of its pruner (an `optuna.pruners.BasePruner`): Optuna's `prune`, and the reports
    of the trials that train side by side, given as they arrive (`record`) and dropped for trials that ended pruned
    or failed (`forget`). `_make_pruner` makes the one rlspeed uses."""

    def prune(self, study, trial) -> bool: ...

    def record(self, number: int, step: int, value: float) -> None: ...

    def forget(self, numbers: set[int]) -> None: ...


def _make_pruner(warmup_steps: int, min_trials: int) -> BatchPruner:
    """A median pruner for trials that train side by side: a trial is pruned when its best report so far is worse
    than the median of the other trials' reports at the same step, counting the running trials of its batch (they
    evaluate at the same steps) as well as the completed trials of earlier batches; not before `warmup_steps`, and
    only with at least `min_trials` others to compare with. (Optuna's MedianPruner counts completed trials only, so
    it could not prune within the first batch, where nothing has completed.) The reports are kept in memory
    (`record`): asking the storage for every trial at every evaluation of every member costs more than training."""
    import statistics

    import optuna

    class BatchMedianPruner(optuna.pruners.BasePruner):
        def __init__(self):
            self.reports: dict[int, dict[int, float]] = {}  # step -> {trial number: value}

        def record(self, number: int, step: int, value: float) -> None:
            self.reports.setdefault(step, {})[number] = value

        def forget(self, numbers: set[int]) -> None:
            """Drop the reports of trials that ended pruned or failed: only completed trials count after their
            batch, as when a resumed study gives the pruner its completed trials' reports."""
            for values in self.reports.values():
                for number in numbers & values.keys():
                    del values[number]

        def prune(self, study, trial) -> bool:
            step = trial.last_step
            if step is None or step < warmup_steps:
                return False
            others = [value for number, value in self.reports.get(step, {}).items() if number != trial.number]
            if len(others) < min_trials:
                return False
            return min(trial.intermediate_values.values()) > statistics.median(others)

    return BatchMedianPruner()


_LOCKS: dict[str, object] = {}  # lock file -> its open handle, for the studies `tune` is running in this process


def _on_server(storage: str) -> bool:
    """Whether `storage` is a database server's URL (postgresql://, mysql://, ...), which `_lock_study` cannot lock."""
    return "://" in storage and not storage.startswith("sqlite:///")


def _lock_study(storage: str, study_name: str) -> None:
    """One process at a time per study: an exclusive lock on a file beside a file storage (`study.db.NAME.lock`),
    held until `tune` returns (`_gives_back_process_state`); UserError when another process holds it. (A storage
    URL of a database server is not locked here.)"""
    if _on_server(storage):
        return
    path = Path(storage.removeprefix("sqlite:///"))
    from rlspeed.locks import hold_lock

    lock_path = path.with_name(f"{path.name}.{study_name.replace('/', '_')}.lock")
    hold_lock(lock_path, _LOCKS, f"Another rlspeed tune is running the study '{study_name}' in "
              f"{storage_url(storage)}: wait for it to finish (or stop it), or give another --study-name.")


def _changed_setup(made_for: dict, record: dict) -> str:
    """The settings of a study's record `made_for` that `record` changes, each with the study's value (a hyperparameter
    the study did not fix: "unset"); rlspeed's preset for the pair is named, since an upgrade may have changed it."""
    def study_values(old: dict, new: dict) -> str:
        return ", ".join(f"{key} {old[key]!r}" if key in old else f"{key} unset"
                         for key in dict.fromkeys([*old, *new]) if old.get(key) != new.get(key))

    changed = []
    for key in dict.fromkeys([*record, *made_for]):
        old, new = made_for.get(key), record.get(key)
        if old == new or key == "default_eval_freq":  # (it follows budget and eval_freq, named instead)
            continue
        if key == "hyperparameters" and isinstance(old, dict) and isinstance(new, dict):
            changed.append(f"hyperparameters (the study's {study_values(old, new)}: rlspeed's preset for the pair may "
                           "have changed since; a --preset FILE holding them gives them back)")
        else:
            changed.append(f"{key} ({'unset' if old is None else repr(old)} in the study)")
    return ", ".join(changed)


#: pip's names of the database drivers SQLAlchemy imports by another name
_DRIVER_PACKAGES = {"MySQLdb": "mysqlclient", "psycopg2": "psycopg2-binary", "psycopg": "'psycopg[binary]'"}


def _older_default_eval(made_for: dict, record: dict) -> bool:
    """Whether the study of record `made_for` was made by an older rlspeed, whose trials without an eval_freq
    evaluated every `OLDER_STUDY_EVAL_FREQ` steps (its record has no "default_eval_freq"), and this one's `record` sets
    none either: its further trials evaluate as its earlier ones did, whose reports the pruner and objective compare."""
    return "default_eval_freq" in record and "default_eval_freq" not in made_for and made_for.get("eval_freq") is None


def _open_study(storage: str, study_name: str, seed: int, population: int, budget: int, record: dict):
    """The study `study_name` in `storage`, created or loaded (its completed trials' reports given to the pruner);
    UserError when it was made for another setup."""
    import optuna
    from optuna.trial import TrialState

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # rlspeed prints one line per batch instead
    url = storage_url(storage)
    if url.startswith("sqlite:///"):
        file = Path(url[len("sqlite:///"):]).expanduser()
        parent = file.parent
        if not parent.is_dir():
            raise UserError(f"--storage {storage}: the directory '{parent}' does not exist.")
        if not file.exists() and unwritable(parent) is not None:  # (SQLite said "unable to open database file")
            raise UserError(f"--storage {storage}: the study's file cannot be made in '{parent}' (read-only, or "
                            "another user's directory); give --storage a file in a directory you can write to.")
    try:
        rdb = optuna.storages.RDBStorage(url)
    except Exception as error:  # SQLAlchemy's errors for a bad URL or an unreadable file
        driver = getattr(error.__cause__, "name", None) if isinstance(error.__cause__, ImportError) else None
        if driver:  # (Optuna's "Failed to import DB access module ...: Please install appropriate one.")
            scheme = url.split("://")[0].split("+")[0]
            raise UserError(f"--storage {without_password(storage)}: the database driver it needs, the Python module "
                            f"{driver}, is not installed: pip install {_DRIVER_PACKAGES.get(driver, driver)}, or "
                            f"name an installed driver in the URL ({scheme}+DRIVER://...).") from None
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UserError(f"--storage {without_password(storage)}: cannot open it as an Optuna storage "
                        f"({without_password(first)[:200]}).") from None
    existing = {summary.study_name for summary in optuna.get_all_study_summaries(rdb)}
    previous = []
    if study_name in existing:
        study = optuna.load_study(study_name=study_name, storage=rdb)
        made_for = study.user_attrs.get(_STUDY_ATTR)
        if made_for is None and (study.get_trials(deepcopy=False)
                                 or study.direction != optuna.study.StudyDirection.MINIMIZE):
            raise UserError(f"Study '{study_name}' in {without_password(storage)} was not made by rlspeed tune (its "
                            "trials and direction are another search's); give a new --study-name.")
        made_as = made_for and (made_for.get("algo"), made_for.get("env_id"))
        if made_as and made_as != (record["algo"], record["env_id"]):  # (its other settings differ by consequence)
            raise UserError(f"Study '{study_name}' in {without_password(storage)} tunes {made_as[0]} on {made_as[1]}, "
                            f"not {record['algo']} on {record['env_id']}: give a new --study-name (its trials are "
                            "kept apart).")
        if made_for is not None and _older_default_eval(made_for, record):  # (compared as the older record)
            record = {key: value for key, value in record.items() if key != "default_eval_freq"}
        if made_for is not None and made_for != record:
            raise UserError(f"Study '{study_name}' in {without_password(storage)} was made with another "
                            f"{_changed_setup(made_for, record)}; resume it with the same command and those, or give "
                            "a new --study-name.")
        previous = study.get_trials(deepcopy=False)
    finished = sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in previous)
    sampler = _sampler(seed, finished, population)
    pruner = _make_pruner(warmup_steps=budget // 5, min_trials=4)
    for trial in previous:
        if trial.state == TrialState.COMPLETE:
            for step, value in trial.intermediate_values.items():
                pruner.record(trial.number, step, value)
    study = optuna.create_study(storage=rdb, study_name=study_name, direction="minimize", sampler=sampler,
                                pruner=pruner, load_if_exists=True)
    if study.user_attrs.get(_STUDY_ATTR) is None:
        study.set_user_attr(_STUDY_ATTR, record)
    return study


def _sampler(seed: int, done: int, population: int):
    """The TPE sampler of a study that holds `done` trials (counted one way or another): its seed moves on with the
    study, so that a resumed study, or its next batch, does not replay the draws made already; the first batch
    (`population` trials) is random."""
    import optuna

    return optuna.samplers.TPESampler(seed=seed + done, n_startup_trials=population, multivariate=True,
                                      constant_liar=True)


def _finished_trials(storage: str, study_name: str) -> int:
    """The finished (complete or pruned) trials of the study `study_name` in `storage`, read without making either
    (0 where the file or the study does not exist yet, or cannot be read: `_open_study` says why when it opens it)."""
    import optuna
    from optuna.trial import TrialState

    url = storage_url(storage)
    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).expanduser().is_file():
        return 0  # (opening it would make the file)
    try:
        study = optuna.load_study(study_name=study_name, storage=url)
        return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))
    except Exception:  # (no such study; a storage that cannot be opened, said when the study is opened)
        return 0


def _fail_stale(study) -> int:
    """Mark trials left RUNNING (by a process that was killed) as failed; return how many."""
    from optuna.trial import TrialState

    stale = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    direct = _direct_storage(study, stale)
    for trial in stale:
        _mark_failed(study, trial, direct)
    return len(stale)


def _mark_failed(study, trial, direct: _DirectStorage | None) -> None:
    """Mark the running `trial` (an `optuna.trial.Trial` or `FrozenTrial`) of `study` failed, in one storage
    transaction through `direct` (`_direct_storage(study, trials)` for the trials marked, this one among them; where it
    is None, `study.tell`, which first reads the trial in two more); a trial finished already is left as it is."""
    import optuna
    from optuna.trial import TrialState

    if direct is None:
        study.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)
        return
    # (an older Optuna, without UpdateFinishedTrialError, raised a RuntimeError: its base class)
    finished = getattr(optuna.exceptions, "UpdateFinishedTrialError", RuntimeError)
    try:
        direct.forget_cached_trials()
        direct.storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
    except finished:  # (told as a stop cut the marking short)
        pass


class _DirectStorage:
    """The storage calls that `study.ask`, `study.tell` and `Trial.set_user_attr` make, made by `tune` itself so that
    a batch takes fewer storage transactions (each an SQLite commit): `storage` (`create_new_trial`,
    `set_trial_state_values`, each after `forget_cached_trials`, as `study.ask` and `study.tell` do), the study's
    `study_id`, `user_attrs(pairs)`: the user attributes of several trials written in one transaction, and `report`
    with `write_reports`: the reports of an evaluation of all the members, in one transaction."""

    def __init__(self, storage, study_id: int, backend, attribute_model, scoped_session, study_thread_local):
        self.storage, self.study_id = storage, study_id
        self._backend, self._model, self._session = backend, attribute_model, scoped_session
        self._thread_local = study_thread_local
        self._reports: list[tuple[int, int, float]] = []  # (trial id, step, value) reported, not written yet

    def forget_cached_trials(self) -> None:
        """Drop the study's cached copy of its trials (which samplers read), as `study.ask` and `study.tell` do before
        they store a trial: a sampler called after the write reads the trials as stored."""
        self._thread_local.cached_all_trials = None

    def report(self, trial, value: float, step: int) -> None:
        """`trial.report(value, step)` for `trial.should_prune()` (which reads the trial's own copy of its reports),
        the storage write kept for `write_reports`; a step reported already is ignored, as Optuna ignores it."""
        reported = trial._cached_frozen_trial.intermediate_values
        if step not in reported:
            self._reports.append((trial._trial_id, step, float(value)))
            reported[step] = float(value)

    def write_reports(self) -> None:
        """Write the reports `report` kept, in one transaction."""
        reports, self._reports = self._reports, []
        with self._session(self._backend.scoped_session) as session:
            for trial_id, step, value in reports:
                self._backend._set_trial_intermediate_value_without_commit(session, trial_id, step, value)

    def user_attrs(self, pairs: list[tuple[int, dict]]) -> None:
        """Write each `(trial_id, {key: value})` of `pairs` as `Trial.set_user_attr` does, all in one transaction."""
        with self._session(self._backend.scoped_session) as session:
            for trial_id, attrs in pairs:
                for key, value in attrs.items():
                    self._backend._set_trial_attr_without_commit(session, self._model, trial_id, key, value)


#: the leading parameters each storage call `_DirectStorage` makes takes, as this Optuna names them
_DIRECT_CALLS = {"create_new_trial": ("study_id", "template_trial"),
                 "set_trial_state_values": ("trial_id", "state", "values"),
                 "_set_trial_attr_without_commit": ("session", "model_cls", "trial_id", "key", "value"),
                 "_set_trial_intermediate_value_without_commit": ("session", "trial_id", "step",
                                                                  "intermediate_value")}


def _direct_storage(study, trials: Sequence = ()) -> _DirectStorage | None:
    """The storage calls of `study` that `tune` makes itself (`_DirectStorage`) for `trials` (its `optuna.trial.Trial`s
    or `FrozenTrial`s the calls are made for), or None where this Optuna lacks one of the private names they use
    (`study._storage`, `_study_id`, the trials cache `_thread_local.cached_all_trials`, the SQL storage's
    single-transaction writes, the trials' `_trial_id` and a `Trial`'s `_cached_frozen_trial`) or names their
    parameters otherwise: then the public calls are made
    (`study.ask`, `study.tell`, `Trial.set_user_attr`, `Trial.report`), which store the same in more transactions.
    The one place the two paths are chosen."""
    import inspect

    import optuna

    for trial in trials:
        if getattr(trial, "_trial_id", None) is None or (isinstance(trial, optuna.trial.Trial)
                                                         and not hasattr(trial, "_cached_frozen_trial")):
            return None
    try:
        from optuna.storages._rdb import models
        from optuna.storages._rdb.storage import _create_scoped_session

        storage, study_id = study._storage, study._study_id
        backend = getattr(storage, "_backend", storage)  # (Optuna wraps an RDBStorage in a cache)
        thread_local = study._thread_local
        if (not isinstance(backend, optuna.storages.RDBStorage) or not isinstance(study_id, int)
                or not hasattr(thread_local, "cached_all_trials")):
            return None
        calls = {name: getattr(storage if name in ("create_new_trial", "set_trial_state_values") else backend, name)
                 for name in _DIRECT_CALLS}
        for name, leading in _DIRECT_CALLS.items():
            if tuple(inspect.signature(calls[name]).parameters)[:len(leading)] != leading:
                return None
        if tuple(inspect.signature(optuna.trial.Trial).parameters) != ("study", "trial_id"):
            return None
        return _DirectStorage(storage, study_id, backend, models.TrialUserAttributeModel, _create_scoped_session,
                              thread_local)
    except (AttributeError, ImportError, TypeError, ValueError):
        return None


def _gives_back_process_state(function: Callable) -> Callable:
    """`function` (`tune`), which leaves the process as it found it when it returns or raises: the study locks it
    took are let go and their files removed (another process may tune the study then) and Optuna's log verbosity,
    which it lowers, is put back (a notebook or a sweep driver that uses Optuna itself keeps its logs)."""
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        held = set(_LOCKS)
        optuna = sys.modules.get("optuna")
        verbosity = optuna.logging.get_verbosity() if optuna is not None else None
        try:
            return function(*args, **kwargs)
        finally:
            for key in set(_LOCKS) - held:  # (their files removed too: else one stays beside the database per study)
                let_go(key, _LOCKS, remove=True)
            optuna = sys.modules.get("optuna")
            if optuna is not None:  # (imported by the call: Optuna's default, INFO, is what the caller had)
                optuna.logging.set_verbosity(verbosity if verbosity is not None else optuna.logging.INFO)

    return wrapper


def require_optuna() -> None:
    """UserError naming the pip command where Optuna is not installed (`tune` and `rlspeed tune` need it)."""
    try:
        import optuna  # noqa: F401
    except ImportError:
        raise UserError('rlspeed tune needs Optuna: pip install optuna (or "rlspeed[tune]").') from None


def _storage_errors() -> tuple[type[BaseException], ...]:
    """The errors of an Optuna storage that cannot be written or read (SQLAlchemy's database errors, Optuna's wrapping
    of a failed commit), of the modules imported so far."""
    kinds = []
    optuna, sqlalchemy = sys.modules.get("optuna"), sys.modules.get("sqlalchemy")  # (None: made unimportable)
    if optuna is not None:
        kinds.append(optuna.exceptions.StorageInternalError)
    if sqlalchemy is not None:
        kinds.append(sqlalchemy.exc.DBAPIError)
    return tuple(kinds)


def _says_storage_errors(function: Callable) -> Callable:
    """`function` (`tune`), where the study's storage fails while the study runs (a full disk, "database or disk is
    full"; a database server gone) says so in one sentence: the trials it holds are kept, and the command run again
    goes on with the study."""
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except Exception as error:
            if not isinstance(error, _storage_errors()):
                raise
            cause = error.__cause__ if isinstance(error.__cause__, _storage_errors()) else error
            text = str(cause).strip().splitlines()
            reason = text[0] if text else type(cause).__name__
            raise UserError(f"The study's storage {without_password(storage_url(kwargs['storage']))} cannot be written "
                            f"({without_password(reason)}): the trials it holds are kept; run the same command again "
                            "once it can be written (a full disk: free some space) to go on with the study.") from None
    return wrapper


@_gives_back_process_state
@_says_storage_errors
def tune(algo_cls: type, env_id: str, *, trials: int, population: int, storage: str, study_name: str,
         hyperparameters: dict, budget: int, target_return: float | None, eval_freq: int | None,
         search_space: str | Path | None = None, fixed: tuple[str, ...] = (), confirm_seeds: int = 16,
         confirm_top: int = 4, out: str | Path, total_timesteps: int | None = None, seed: int = 0, device="cpu",
         command: str | None = None, say: Callable[..., None] = print, progress_bar: bool = True,
         env_kwargs: dict | None = None, gym_packages: tuple[str, ...] = (), eval_episodes: int = 10,
         fail_running: bool = False) -> dict:
    """Run (or continue) the study until `trials` trials have finished, `population` at a time; then confirm the
    `confirm_top` best trials and the starting configuration on `confirm_seeds` new seeds each (`population` members at
    a time) and write the one with the best median objective as a preset YAML at `out` (`confirm_seeds=0`: the best
    trial, unconfirmed). A `population` whose members would not fit in memory together is refused (UserError, naming the
    number that fits) before the study is opened. Returns `{"finished", "best": {...} or None, "out", "wall_s"}`;
    where it raises (Ctrl-C, an error), the study keeps its finished trials and `out` the preset of the best trial so
    far (written after every batch), as with the command: the same call goes on with the study.
    `progress_bar`: a bar over each population while it trains (and over asking for and building its trials, where
    that takes long: `LongLoopBar`). `env_kwargs`: the env's options, for every trial (recorded with the study;
    the preset file names them, since `rlspeed train` needs them given again). `gym_packages`: the modules that register
    the env (for the `rlspeed train` command the last line suggests). `eval_episodes`: the episodes of every evaluation
    of the trials (and of the confirmation), the final ones included (recorded with the study where it is not 10).
    Trials left running in the study are marked failed first where the storage is a file (its lock says no other process
    runs them); on a database server's storage, which is not locked, only with `fail_running`.

    `hyperparameters`: the values (the preset's and --set's) every trial starts from; the search space
    (`search_space` file or the algorithm's default, less the names in `fixed`) is sampled on top. `budget`: env
    steps per member. `total_timesteps`: the training budget the preset file gets when there is a target (training
    stops at the target anyway; default `budget`); without a target, or where the configuration anneals its learning
    rate, clip range or exploration (`anneal_lr`, `anneal_clip`, DQN's `exploration_fraction`: schedules over a learn
    call's steps, which in the trials were `budget`), the preset gets `budget`. See the module docstring for the
    objective, pruning and resume.

    `algo_cls`: the algorithm (`rlspeed.PPO`, ...); `env_id`: the env, as for `rlspeed tune`; `storage` and
    `study_name`: the Optuna storage URL (or SQLite file) and the study in it; `target_return`: the mean evaluation
    return the objective counts steps to (None: the objective is minus the final evaluation) and `eval_freq` the env
    steps between evaluations (None: the algorithm's default); `seed`: the sampler's seed and every trial's (the
    confirmation's runs take new seeds from it: `_CONFIRM_SEED_OFFSET`); `device`: where the members train;
    `command`: the command line the preset file records in its header (None: no such line); `say`: where the progress
    lines go (`print`)."""
    require_optuna()
    eval_episodes = positive_whole("eval_episodes", eval_episodes, needed_by="tune")  # (before the study records)
    from optuna.trial import TrialState

    from rlspeed.algos.base import default_eval_freq
    from rlspeed.population import Population
    from rlspeed.population.base import LongLoopBar, planned_timesteps

    space, notes = load_search_space(search_space, algo_cls, hyperparameters, tuple(fixed))
    for note in notes:
        say(f"rlspeed: {note}")
    # a setup the population refuses (gSDE, Atari games, an encoder SAC or TD3 members lack, ...), or a --population
    # whose members would not fit in memory together, fails here, before the study records any trial: one member,
    # checked as one of the largest population the run builds (a batch of the trials left, or a chunk of the
    # confirmation's)
    env_kwargs = dict(env_kwargs or {})
    left = trials - _finished_trials(storage, study_name)
    largest = min(population, max(left, (confirm_top + 1) * confirm_seeds))
    with planned_timesteps(budget, progress_bar, members=largest, option=POPULATION_OPTION):
        probe = Population(algo_cls, env_id, seeds=[seed], device=device, env_kwargs=env_kwargs or None,
                           **hyperparameters)
    # (schedules decay over a learn call's steps: a preset that anneals trains as its trial did over the budget)
    annealed = [key for key in ("anneal_lr", "anneal_clip", "exploration_fraction")
                if getattr(probe.config, key, False)]
    preset_timesteps = (int(total_timesteps or budget) if target_return is not None and not annealed
                        else int(budget))
    setup = _Setup(algo_cls, env_id, hyperparameters, space, int(budget), target_return, eval_freq, seed, device,
                   preset_timesteps, progress_bar, env_kwargs, tuple(annealed), eval_episodes, population)
    record = {"algo": algo_cls.name, "env_id": env_id, "budget": int(budget), "target_return": target_return,
              "eval_freq": eval_freq, "hyperparameters": _plain(hyperparameters), "search_space": _plain(space)}
    if env_kwargs:  # (a study made without options records none: it resumes as before)
        record["env_kwargs"] = env_kwargs
    if eval_episodes != 10:  # (likewise: a study made with the default records none)
        record["eval_episodes"] = eval_episodes
    if eval_freq is None:  # (the interval the trials evaluate at; an older rlspeed's study records none)
        record["default_eval_freq"] = default_eval_freq(budget)
    _lock_study(storage, study_name)  # (before marking "stale" trials failed: they may be another process's)
    study = _open_study(storage, study_name, seed, population, budget, record)
    if _older_default_eval(study.user_attrs.get(_STUDY_ATTR) or {}, record):
        setup.trial_eval_freq = OLDER_STUDY_EVAL_FREQ
        say(f"rlspeed: study '{study_name}' was made by an older rlspeed: its trials evaluate every "
            f"{OLDER_STUDY_EVAL_FREQ:,} steps, as its earlier trials did (--eval-freq N sets another interval in a "
            "new study)")
    if fail_running or not _on_server(storage):
        stale = _fail_stale(study)
        if stale:
            say(f"rlspeed: {stale} trial(s) left running by an earlier process marked failed (they are redone)")
    else:  # (they may be another process's, running the study now: marked failed, its tell and report would fail)
        running = len(study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))
        say("rlspeed: a database server's study is not locked: run one rlspeed tune per study at a time"
            + (f"; {running} trial(s) of the study are running, left as they are (another process's, or a killed "
               "one's: --fail-running marks them failed, to be redone)" if running else ""))
    counted = (TrialState.COMPLETE, TrialState.PRUNED)
    finished = sum(t.state in counted for t in study.get_trials(deepcopy=False))
    started = time.perf_counter()
    batches = math.ceil(max(trials - finished, 0) / population)
    # (a study that holds the trials asked for already trains none: said so, not as "6 of 1 trials finished")
    progress = (f"{finished} of {trials} trials finished; {batches} batch(es) of up to {population} to go"
                if finished < trials else f"{finished} trials finished, {trials} asked for: none to train (a larger "
                "--trials adds more)")
    # (a trial trains whole iterations, as `learn` does: a budget between two says what each trial trains)
    say(f"rlspeed: study '{study_name}' in {without_password(storage_url(storage))}: {progress}, {budget:,} steps "
        f"per trial{whole_iterations(budget, probe.steps_per_iteration)}"
        + (f", objective: steps to eval return >= {target_return:g}" if target_return is not None
           else ", objective: final evaluation"), flush=True)
    context = {"out": out, "command": command, "storage": storage, "study_name": study_name,
               "train": _train_command(algo_cls, env_id, out, env_kwargs, gym_packages, eval_episodes)}
    batch = 0
    diverged = 0  # trials diverged since the last batch that finished one
    while finished < trials:
        batch += 1
        size = min(population, trials - finished)
        asked: list = []  # the batch's trials, each with its hyperparameters
        told: set[int] = set()
        batch_started = time.perf_counter()
        try:
            with LongLoopBar(size, "asking Optuna for trials", "trial", progress_bar) as asking:
                _ask_batch(study, setup, size, asked, asking.step)
            counts = _run_batch(setup, study, asked, told)
        except BaseException:  # Ctrl-C, SIGTERM or an error: the batch's trials are failed, not left running
            if asked:  # (none where it stopped before the first was asked: nothing to say)
                marked = _fail_unfinished(study, asked, told)
                say(f"rlspeed: batch {batch} stopped; its {len(asked)} trial(s) {marked} (rerun the command to redo "
                    "them)", file=sys.stderr, flush=True)
            raise
        finished += counts["complete"] + counts["pruned"]
        diverged = 0 if counts["complete"] + counts["pruned"] else diverged + counts["failed"]
        batches = batch + math.ceil(max(trials - finished, 0) / population)  # (diverged trials are redone)
        _forget_outdated_confirmation(study)
        best = _best_trial(study)
        if best is not None:
            _write_preset(setup, study, best, None, context)
        say(f"rlspeed: batch {batch}/{batches}: trials {asked[0][0].number}-{asked[-1][0].number}: "
            f"{counts['complete']} complete"
            + (f" ({counts['reached']} reached the target)" if target_return is not None else "")
            + f", {counts['pruned']} pruned" + _pruned_when(counts["pruned_at"])
            + (f", {counts['failed']} failed" if counts["failed"] else "")
            + f" in {time.perf_counter() - batch_started:.1f} s; {_best_line(best, target_return)}", flush=True)
        if diverged >= _DIVERGED_IN_A_ROW:  # (redone, they would be sampled from the same space again and again)
            raise UserError(f"The last {diverged} trials diverged (non-finite parameters), none finished since: the "
                            "search space holds configurations that do not train: narrow it with --search-space (a "
                            "lower learning_rate high, say) or fix values with --set, under a new --study-name (this "
                            f"study keeps its {finished} finished trial(s)).")
    best = _best_trial(study)
    if best is None:
        say("rlspeed: no trial completed, so no preset was written")
        return {"finished": finished, "best": None, "out": str(out), "wall_s": time.perf_counter() - started}
    confirmation = None
    if confirm_seeds > 0:
        confirmation = _confirm(setup, study, confirm_top, confirm_seeds, say)
        chosen = min(confirmation["candidates"], key=lambda c: (c["median"], c["trial"] is not None))
        best = (_describe(study.trials[chosen["trial"]]) if chosen["trial"] is not None
                else {"number": None, "hyperparameters": _starting_values(setup)})
    _write_preset(setup, study, best, confirmation, context)
    say(f"rlspeed: {_chosen_line(best, confirmation, target_return)}; preset written to {out} ({context['train']})")
    return {"finished": finished, "best": best, "out": str(out), "wall_s": time.perf_counter() - started,
            "confirmation": confirmation}


def _fail_unfinished(study, asked: list, told: set[int]) -> str:
    """Mark the trials `asked` that were not `told` failed (a stopped batch's), and say so: "marked failed", or where
    the storage failed (a full disk), that they are left running. A Ctrl-C or SIGTERM while marking (the second of an
    impatient user, the first having stopped the batch) does not leave the others running: marking goes on, up to
    `_MARKING_STOPS` times (then they are left to the next run, which marks them)."""
    left = "left running in the storage (the next run marks them failed)"
    for _ in range(_MARKING_STOPS + 1):
        try:
            direct = _direct_storage(study, [trial for trial, _ in asked])
            for trial, _ in asked:
                if trial.number not in told:  # (one a stop cut short is either marked or not: marked, or skipped)
                    _mark_failed(study, trial, direct)
            return "marked failed"
        except KeyboardInterrupt:
            continue
        except _storage_errors():  # (the error that stopped the batch is said; this one is not)
            return left
    return left


#: the trials diverged in a row (batches that finished none) after which `tune` stops rather than sample again
_DIVERGED_IN_A_ROW = 8

#: the stops (Ctrl-C, SIGTERM) that `_fail_unfinished` rides out while it marks a stopped batch's trials
_MARKING_STOPS = 3


def _ask_batch(study, setup: _Setup, size: int, asked: list, step: Callable[[], None]) -> None:
    """Ask the study's sampler for `size` trials, appending each (its `optuna.trial.Trial`, its hyperparameters) to
    `asked` as it is stored (a stop between two leaves those stored in `asked`, for the caller to mark failed); `step`
    after each.

    The sampler (`_sampler`) draws in a study of its own in memory that holds the study's finished trials and the
    batch's trials drawn so far (which `constant_liar` counts as running, as in the study itself); each trial is then
    stored with its parameters, seed and hyperparameters at once, one storage write (`study.ask()`, each `suggest_*`
    and each `set_user_attr` are a write apiece, an SQLite commit each, and every `ask` reads all running trials).
    The storage holds what `study.ask()` would have stored: optuna-dashboard shows the trials and a resumed study
    samples from them. Where `_direct_storage` finds none of the calls it makes, each trial is asked with `study.ask()`
    (drawn by the study's own sampler, the same TPE sampler)."""
    import optuna
    from optuna.trial import TrialState, create_trial

    trials = study.get_trials(deepcopy=False)
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    # (a sampler of its own, a multivariate TPE sampler serving one study, seeded by the trials the study holds: a
    # batch whose trials all failed is not drawn again)
    drafts = optuna.create_study(direction="minimize", sampler=_sampler(setup.seed, len(trials), setup.at_once))
    drafts.add_trials(finished)
    waiting = sum(t.state == TrialState.WAITING for t in trials)
    direct = _direct_storage(study)
    for index in range(size):
        # (trials a user enqueued, `study.enqueue_trial`, are asked as Optuna asks, their values kept)
        if index < waiting or direct is None:
            trial = study.ask()
            values = sample(trial, setup.space)
            trial.set_user_attr("seed", setup.seed)
            trial.set_user_attr("hyperparameters", values)
            drafts.add_trial(create_trial(state=TrialState.RUNNING, params=trial.params,
                                          distributions=trial.distributions))
        else:
            draft = drafts.ask()
            values = sample(draft, setup.space)
            stored = create_trial(state=TrialState.RUNNING, params=draft.params, distributions=draft.distributions,
                                  user_attrs={"seed": setup.seed, "hyperparameters": values})
            # (Optuna's `add_trial` returns no trial to report to: the storage call it makes is made here)
            direct.forget_cached_trials()
            trial = optuna.trial.Trial(study, direct.storage.create_new_trial(direct.study_id, template_trial=stored))
        asked.append((trial, values))
        step()


def _run_batch(setup: _Setup, study, asked: list, told: set[int]) -> dict:
    """Train the asked trials as one population, report and prune through Optuna, tell the results (adding each told
    trial's number to `told`).

    Every evaluation is reported to its trial (minus the mean return: lower is better, as the objective). A member
    that reached the target leaves the population; its trial goes on reporting the return it reached at each later
    evaluation of the batch, so the pruner compares a slow trial with the fast ones too (a trial that stopped with
    the target does not vanish from later steps)."""
    from optuna.trial import TrialState

    target_return = setup.target_return
    seeds = [setup.seed] * len(asked)  # (every trial on the study's one seed: configurations compared, not seeds)
    per_member = {key: [values[key] for _, values in asked] for key in setup.space}
    asked = [trial for trial, _ in asked]
    members = setup.population(seeds, per_member)
    pruner: BatchPruner = study.pruner
    last: dict[int, float] = {}  # member -> its last evaluated mean
    direct = _direct_storage(study, asked)

    def report(k: int, mean: float, step: int) -> None:
        if direct is None:
            asked[k].report(-mean, step)
        else:  # (written with the evaluation's other reports, `write_reports`)
            direct.report(asked[k], -mean, step)
        pruner.record(asked[k].number, step, -mean)

    def on_eval(num_timesteps: int, means: dict[int, float]) -> list[int]:
        pruned = evaluated(int(num_timesteps), means)
        if direct is not None:  # (a stopped evaluation's trials are marked failed: their reports are not written)
            direct.write_reports()
        return pruned

    def evaluated(step: int, means: dict[int, float]) -> list[int]:
        for k, mean in last.items():
            if k not in means and target_return is not None and mean >= target_return:  # left with the target
                report(k, mean, step)
        pruned = []
        for k, mean in means.items():
            if not math.isfinite(mean):
                continue
            last[k] = float(mean)
            report(k, float(mean), step)
            reached = target_return is not None and mean >= target_return
            # (not at the last evaluation: nothing is left to save, and the trial's result would be lost)
            if not reached and step < setup.budget and asked[k].should_prune():
                pruned.append(k)
        return pruned

    summary = setup.learn(members, on_eval)
    counts = {"complete": 0, "pruned": 0, "failed": 0, "reached": 0, "pruned_at": {}}
    results = []  # (trial, state, value, user attributes) of each trial, as `_tell_batch` takes them
    for trial, member in zip(asked, summary["members"]):
        final = member.get("final_eval") or {}
        attrs = {"steps_to_target": member.get("steps_to_target"), "final_eval": final.get("mean")}
        if final.get("unfinished"):  # (episodes still running at the step limit, counted with their return so far)
            attrs["final_eval_unfinished"] = [final["unfinished"], final["episodes"]]
        if member.get("pruned_at") is not None:
            results.append((trial, TrialState.PRUNED, None, attrs))
            counts["pruned"] += 1
            counts["pruned_at"][trial.number] = int(member["pruned_at"])
        elif final.get("mean") is None or not math.isfinite(float(final["mean"])):
            attrs["diverged_at"] = member.get("diverged_at")
            results.append((trial, TrialState.FAIL, None, attrs))  # a member that diverged (non-finite parameters)
            counts["failed"] += 1
        else:
            results.append((trial, None, objective(member, target_return, max(setup.budget,
                                                                             summary["total_timesteps"])), attrs))
            counts["complete"] += 1
            counts["reached"] += member.get("steps_to_target") is not None
    _tell_batch(study, results, told)
    pruner.forget({trial.number for trial, state, _, _ in results if state is not None})  # (pruned or failed)
    return counts


def _tell_batch(study, results: list, told: set[int]) -> None:
    """Store each `(trial, state, value, user attributes)` of `results` as `trial.set_user_attr` for each attribute
    and then `study.tell(trial, value, state=state)` store it, adding each trial's number to `told` once it is told.

    Through `_direct_storage`, the attributes of all the trials are written in one storage transaction, the trials
    read in one more, and each trial's state and values in one (`study.tell` reads the trial first, and each
    attribute is a transaction of its own); the state, values and sampler call are `study.tell`'s: a pruned trial's
    value is its last intermediate value (where it is a number), a value that is not a number fails the trial."""
    import optuna
    from optuna.trial import TrialState

    direct = _direct_storage(study, [trial for trial, *_ in results])
    if direct is None:
        for trial, state, value, attrs in results:
            for key, attr in attrs.items():
                trial.set_user_attr(key, attr)
            study.tell(trial, value, state=state)
            told.add(trial.number)
        return
    direct.user_attrs([(trial._trial_id, attrs) for trial, _, _, attrs in results])
    frozen = {t.number: t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
    filtered = getattr(optuna.pruners, "_filter_study", lambda study, trial: study)  # (as `study.tell` calls it)
    for trial, state, value, _ in results:
        stored = frozen.get(trial.number)
        feasible = value is not None and isinstance(value, (int, float)) and not math.isnan(value)
        if stored is None or (state is None and not feasible):  # (told meanwhile, or not a number: as Optuna says)
            study.tell(trial, value, state=state)
            told.add(trial.number)
            continue
        values = [float(value)] if state is None else None
        if state == TrialState.PRUNED and stored.last_step is not None:
            last = stored.intermediate_values[stored.last_step]
            values = None if math.isnan(last) else [float(last)]
        state = TrialState.COMPLETE if state is None else state
        direct.forget_cached_trials()
        try:
            filtered(study, stored).sampler.after_trial(study, stored, state, values)
        finally:
            direct.storage.set_trial_state_values(trial._trial_id, state, values)
        told.add(trial.number)


#: the most pruned trials a batch's line names one by one (`_pruned_when`); the others it counts
_PRUNED_NAMED = 8


def _pruned_when(pruned_at: dict[int, int]) -> str:
    """' (trial 4 at 3,072, trial 5 at 1,024 steps)': which trials of a batch were pruned, and at which step (a
    pruned trial leaves its population there); past `_PRUNED_NAMED` of them, the rest counted (', and 90 more')."""
    if not pruned_at:
        return ""
    each = [f"trial {number} at {step:,}" for number, step in list(pruned_at.items())[:_PRUNED_NAMED]]
    more = len(pruned_at) - len(each)
    return f" ({', '.join(each)} steps" + (f", and {more:,} more" if more else "") + ")"


def _starting_values(setup: _Setup) -> dict:
    """The searched hyperparameters' values in the starting configuration (the preset's, else the defaults)."""
    from rlspeed.algos.base import build_config

    config = build_config(setup.algo_cls.config_cls, setup.hyperparameters)
    return {key: getattr(config, key) for key in setup.space}


def _confirm(setup: _Setup, study, top: int, seeds_each: int, say) -> dict:
    """Train the `top` best trials' configurations and the starting one on `seeds_each` new seeds each, as
    populations of at most `setup.at_once` members (`--population`, what bounds memory and CPU); returns (and stores
    as the study's `confirmation` attribute) each candidate's objectives and median.

    One trial is one seed, so the best of many trials is partly the configuration luckiest on it; the confirmation
    measures the candidates again on seeds no trial used, every candidate on the same ones (its i-th run on the i-th,
    `_CONFIRM_SEED_OFFSET`: paired comparisons, as the trials' on their one seed), and picks by median."""
    import statistics

    candidates = [{"trial": t.number, "hyperparameters": dict(t.user_attrs.get("hyperparameters", {}))}
                  for t in _finalists(study, top)]
    candidates.append({"trial": None, "hyperparameters": _starting_values(setup)})
    seeds = [(setup.seed + _CONFIRM_SEED_OFFSET + i) % 2**32 for _ in candidates for i in range(seeds_each)]
    stored = study.user_attrs.get("confirmation")
    if stored is not None and [c["trial"] for c in stored["candidates"]] == [c["trial"] for c in candidates] \
            and stored.get("seeds") == seeds:
        return stored  # the same candidates on the same seeds: measured already
    if stored is not None:  # (an interrupted confirmation leaves none, not the older one of other candidates)
        study.set_user_attr("confirmation", None)
    started = time.perf_counter()
    per_member = {key: [c["hyperparameters"][key] for c in candidates for _ in range(seeds_each)]
                  for key in setup.space}
    # (members are independent, so each scores in a chunk as it would among all: a member that does not reach the
    # target keeps its chunk training to the end of the budget, the steps it is scored with)
    scored: list[tuple[dict, int]] = []  # (member entry, the steps its population trained), in seed order
    for start in range(0, len(seeds), setup.at_once):
        chunk = slice(start, start + setup.at_once)
        with setup.population(seeds[chunk], {key: values[chunk] for key, values in per_member.items()}) as members:
            summary = setup.learn(members)
        scored += [(member, max(setup.budget, summary["total_timesteps"])) for member in summary["members"]]
    for index, candidate in enumerate(candidates):
        members = scored[index * seeds_each:(index + 1) * seeds_each]
        scores = [objective(m, setup.target_return, trained) if m.get("final_eval") else math.inf
                  for m, trained in members]
        candidate["objectives"] = scores
        candidate["median"] = statistics.median(scores)
        candidate["steps_to_target"] = [m.get("steps_to_target") for m, _ in members]
    confirmation = {"seeds": seeds, "candidates": candidates}
    study.set_user_attr("confirmation", confirmation)
    say(f"rlspeed: confirmation on {seeds_each} new seeds each ({time.perf_counter() - started:.1f} s): "
        + "; ".join(f"{'trial ' + str(c['trial']) if c['trial'] is not None else 'starting configuration'} median "
                    f"{c['median']:,.0f}" for c in candidates), flush=True)
    return confirmation


def _finalists(study, top: int) -> list:
    """The `top` best completed trials, best first: the trials a confirmation measures (beside the starting
    configuration)."""
    from optuna.trial import TrialState

    completed = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    return sorted(completed, key=lambda t: t.value)[:top]


def _forget_outdated_confirmation(study) -> None:
    """Clear the study's `confirmation` attribute when the trials it measured are no longer the best ones (a batch
    completed a better trial): it describes the preset of an earlier best, and the preset now written is not
    confirmed."""
    stored = study.user_attrs.get("confirmation")
    if stored is None:
        return
    measured = [c["trial"] for c in stored["candidates"] if c["trial"] is not None]
    if [t.number for t in _finalists(study, len(measured))] != measured:
        study.set_user_attr("confirmation", None)


def _best_trial(study) -> dict | None:
    """The best completed trial so far (by its own objective), described; None when none has completed."""
    try:
        trial = study.best_trial
    except ValueError:  # no completed trial yet
        return None
    return _describe(trial)


def _describe(trial) -> dict:
    return {"number": trial.number, "value": trial.value, "seed": trial.user_attrs.get("seed"),
            "steps_to_target": trial.user_attrs.get("steps_to_target"),
            "final_eval": trial.user_attrs.get("final_eval"),
            "final_eval_unfinished": trial.user_attrs.get("final_eval_unfinished"),
            "hyperparameters": dict(trial.user_attrs.get("hyperparameters", {}))}


def _best_line(best: dict | None, target_return: float | None) -> str:
    if best is None:
        return "no trial completed yet"
    values = _values_line(best["hyperparameters"])
    return f"best trial {best['number']}: {_trial_result(best, target_return)} ({values})"


def _trial_result(best: dict, target_return: float | None) -> str:
    return (f"{best['steps_to_target']:,} steps to {target_return:g}" if best.get("steps_to_target") is not None
            else f"final eval {format_return(best['final_eval'])}{_cut(best)}")


def _cut(best: dict) -> str:
    """', K of M cut short at the step limit' where the trial's final evaluation cut K of its M episodes there."""
    return cut_short(*best.get("final_eval_unfinished") or (0, 0))


def _values_line(values: dict) -> str:
    return ", ".join(f"{key} {value:.4g}" if isinstance(value, float) else f"{key} {value}"
                     for key, value in values.items())


def _chosen_line(best: dict, confirmation: dict | None, target_return: float | None) -> str:
    """What the study's last line says of the configuration written: the best trial, unconfirmed; else the candidate
    chosen, by its median on the confirmation seeds (what the choice was made on: a trial's own result is one seed's,
    and the study's best trial, which optuna-dashboard shows, need not be the one chosen)."""
    if confirmation is None:
        return _best_line(best, target_return)
    medians = {c["trial"]: c["median"] for c in confirmation["candidates"]}
    each = len(confirmation["seeds"]) // len(confirmation["candidates"])
    measured = f"median objective {medians[best['number']]:,.0f} on {each} new seeds"
    values = _values_line(best["hyperparameters"])
    if best["number"] is None:
        trial, median = min(((t, m) for t, m in medians.items() if t is not None), key=lambda item: item[1])
        return (f"no trial beat the starting configuration on the confirmation seeds ({measured}, lower is better; "
                f"the best trial there, {trial}: {median:,.0f}), so it is what is written ({values})")
    return (f"chosen: trial {best['number']}, {measured} (lower is better); in its trial "
            f"{_trial_result(best, target_return)} ({values})")


#: How the first line of a preset `rlspeed tune` writes begins (the CLI rewrites such a file, and no other, at --out)
PRESET_HEADER = "# Tuned by rlspeed tune"
#: How its line naming the algorithm begins (`rlspeed train` with another algorithm refuses the file)
PRESET_ALGORITHM = "# For: rlspeed train "


def _write_preset(setup: _Setup, study, best: dict, confirmation: dict | None, context: dict) -> None:
    """Write `best` (a trial, or the starting configuration when its number is None) as a preset YAML: `{env_id:
    {run settings, fixed and tuned hyperparameters}}`, with comments saying how it was found and measured."""
    from optuna.trial import TrialState

    entry = {"total_timesteps": setup.preset_timesteps}
    if setup.eval_freq is not None:
        entry["eval_freq"] = int(setup.eval_freq)
    # (null when the study had no target: without the key, train would stop at the env's reward threshold)
    entry["target_return"] = setup.target_return
    entry.update(_plain(setup.hyperparameters))
    entry.update(best["hyperparameters"])  # (the values the trial trained with, to the last digit)
    header = [f"{PRESET_HEADER} ({datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC): study "
              f"'{context['study_name']}' in {without_password(storage_url(context['storage']))}."]
    header.append(f"{PRESET_ALGORITHM}{setup.algo_cls.name} (its hyperparameters are {setup.algo_cls.__name__}'s)")
    if setup.target_return is not None and setup.annealed:
        header.append(f"# total_timesteps is the trials' budget: schedules ({', '.join(setup.annealed)}) decay over "
                      "it, as they did in the trials")
    if setup.env_kwargs:  # (a preset holds hyperparameters only: the options are given to rlspeed train again)
        options = shlex.join(_env_kwargs_arguments(setup.env_kwargs))
        header.append(f"# Tuned on the env made with options: train with {options}")
    if context["command"]:
        header.append(f"# Command: {without_password(context['command'])}")
    if best["number"] is not None:
        result = (f"reached {setup.target_return:g} after {best['steps_to_target']:,} steps"
                  if best["steps_to_target"] is not None
                  else f"final evaluation {format_return(best['final_eval'])}{_cut(best)}")
        finished = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
        header.append(f"# Trial {best['number']} of {len(finished)} finished (seed {best['seed']}) "
                      f"{result}; objective {best['value']:g} (lower is better).")
    if confirmation is None:
        header.append("# Not confirmed yet: one trial is one seed (check it: rlspeed train ... --preset FILE "
                      "--seeds 100-109).")
    else:
        what = "trial " + str(best["number"]) if best["number"] is not None else "the starting configuration"
        each = len(confirmation["seeds"]) // len(confirmation["candidates"])
        medians = "; ".join(f"{'trial ' + str(c['trial']) if c['trial'] is not None else 'starting'} {c['median']:g}"
                            for c in confirmation["candidates"])
        header.append(f"# Chosen: {what}. Median objective on {each} new seeds each: {medians}.")
    body = yaml.safe_dump({setup.env_id: entry}, sort_keys=False)
    header.append(f"{_DIGEST_PREFIX}{_body_digest(body)}")
    text = "\n".join(header) + "\n" + body
    out = Path(context["out"])
    # (checked again as it is written: another study, started at the same time with the same --out, may have
    # written it since the search began)
    refuse_others_file(out, context["study_name"], context["storage"], searched=True)
    try:
        # (UTF-8 whatever the locale, as presets are read: `utf8_text`)
        if out.is_file() and not _as_written(out.read_text(encoding="utf-8", errors="surrogateescape")):
            # (a preset this study wrote before, edited since: the edit is kept beside the new file)
            kept = _keep_edited(out)
            warnings.warn(f"{out} was edited since rlspeed tune wrote it: the edited file is kept as {kept}.",
                          stacklevel=2)
        out.parent.mkdir(parents=True, exist_ok=True)
        # (a temporary file of its own, never one a link planted at a predictable name points at; a new file only
        # where there was none, so that another study's, made since the check, stays)
        write_atomic(out, utf8_text(text), replace=out.exists())
    except FileExistsError:
        refuse_others_file(out, context["study_name"], context["storage"], searched=True)
        raise UserError(f"Cannot write the preset '{out}': another process made it meanwhile; give another "
                        f"--out{_TRIALS_KEPT}.") from None
    except OSError as error:
        raise UserError(f"Cannot write the preset '{out}': {error.strerror or error}.") from None


def _keep_edited(out: Path) -> Path:
    """Copy the edited preset `out` to the first of `OUT.edited`, `OUT.edited.1`, `OUT.edited.2`, ... that does not
    exist (an earlier edit kept there stays), or to none where one of them holds the same bytes already (a rewrite
    that failed after keeping it); returns where the edit is."""
    edited = out.read_bytes()
    for number in itertools.count():
        kept = out.with_name(out.name + ".edited" + (f".{number}" if number else ""))
        try:
            with open(kept, "xb") as file:  # (exclusive: never over a file that exists)
                try:
                    file.write(edited)
                except OSError:  # (a full disk: not a partial copy that the next rewrite would keep beside)
                    kept.unlink(missing_ok=True)
                    raise
            return kept
        except FileExistsError:
            if kept.is_file() and kept.read_bytes() == edited:
                return kept


def utf8_text(text: str) -> str:
    """`text` as a preset file holds it (UTF-8, as `rlspeed train --preset` reads it): a name's bytes that the locale
    could not read (its `\\udcXX` surrogates: non-ASCII under LC_ALL=C without UTF-8 mode) as the characters they are
    in UTF-8, and bytes that are no UTF-8 (a name in another encoding) as their `\\udcXX` escapes."""
    try:  # (the surrogates back to their bytes, and the bytes that are UTF-8 to their characters)
        text = text.encode("utf-8", "surrogateescape").decode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # (a surrogate no file name's byte makes: escaped as it is)
        pass
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _env_kwargs_arguments(env_kwargs: dict) -> list[str]:
    """`--env-kwargs KEY=VALUE` arguments that give `env_kwargs` again (values as JSON, which --env-kwargs' YAML
    reads back as the same value; text as it is, not as \\u escapes)."""
    return [part for key, value in env_kwargs.items()
            for part in ("--env-kwargs", f"{key}={json.dumps(value, ensure_ascii=False)}")]


def _train_command(algo_cls: type, env_id: str, out: str | Path, env_kwargs: dict | None,
                   gym_packages: tuple[str, ...], eval_episodes: int = 10) -> str:
    """The `rlspeed train` command that trains with the preset a study writes, quoted for a POSIX shell (with the
    modules registering the env, the episodes of the trials' evaluations and the env's options, which a preset does
    not hold)."""
    arguments = ["rlspeed", "train", algo_cls.name, env_id, "--preset", str(out)]
    if gym_packages:
        arguments += ["--gym-packages", *gym_packages]
    if eval_episodes != 10:  # (the trials' evaluations, which the preset's target was reached under)
        arguments += ["--eval-episodes", str(eval_episodes)]
    return shlex.join(arguments + _env_kwargs_arguments(env_kwargs or {}))


_DIGEST_PREFIX = "# Content digest (edits are kept aside on a rewrite): "


def preset_algorithm(text: str) -> str | None:
    """The algorithm (CLI name) a preset `rlspeed tune` wrote was tuned for (its `PRESET_ALGORITHM` line), or None."""
    return next((line[len(PRESET_ALGORITHM):].split()[0] for line in text.splitlines()
                 if line.startswith(PRESET_ALGORITHM) and line[len(PRESET_ALGORITHM):].strip()), None)


#: what a refusal to write the preset after the search adds
_TRIALS_KEPT = " (the study keeps its trials: the same command with another --out writes its preset)"


def refuse_others_file(out: str | Path, study_name: str, storage: str, searched: bool = False) -> None:
    """UserError where `out` holds a file this study may not write over: one that is not a preset rlspeed tune wrote,
    or a preset of another study (a preset this study wrote is its own to rewrite). `searched`: the study has trials
    by now, which the sentence says it keeps."""
    out = Path(out)
    kept = _TRIALS_KEPT if searched else ""
    try:
        text = out.read_text(encoding="utf-8", errors="surrogateescape")
    except (FileNotFoundError, IsADirectoryError):
        return
    except NotADirectoryError:  # (a file where a folder of the path should be: no preset can be written there)
        blocking = next(folder for folder in out.parents if folder.exists())
        raise UserError(f"--out {out}: '{blocking}' is a file, not a directory; give another --out{kept}.") from None
    except OSError as error:
        raise UserError(f"Cannot read the preset '{out}': {error.strerror or error}.") from None
    if not text.startswith(PRESET_HEADER):
        raise UserError(f"--out {out} exists and is not a preset rlspeed tune wrote; give another --out, or move it "
                        f"away first{kept}.")
    written_by = preset_study(text)
    shown = without_password(storage_url(storage))  # (as the preset names it)
    # (an older rlspeed's preset names the storage with its password)
    written_in = without_password(written_by[1]) if written_by is not None else None
    if written_by is not None and (written_by[0] != utf8_text(study_name)
                                   or not same_storage(written_in, utf8_text(shown))):
        raise UserError(f"--out {out} holds the preset of study '{written_by[0]}' in {written_in}, not of "
                        f"'{study_name}' in {shown}: give another --out{kept}.")


def preset_study(text: str) -> tuple[str, str] | None:
    """(study name, storage URL) a preset file says it was written for (its first line), or None."""
    match = re.match(rf"{re.escape(PRESET_HEADER)} \([^)]*\): study '(.*)' in (.+)\.\s*$",
                     text.splitlines()[0] if text else "")
    return (match.group(1), match.group(2)) if match else None


def _body_digest(body: str) -> str:
    """SHA-256 of a preset's YAML lines (its comments left out)."""
    lines = [line for line in body.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def _as_written(text: str) -> bool:
    """Whether a preset file's YAML is what rlspeed tune wrote there (its digest line matches); a file without the
    line (an older rlspeed's) counts as edited."""
    recorded = next((line[len(_DIGEST_PREFIX):].strip() for line in text.splitlines()
                     if line.startswith(_DIGEST_PREFIX)), None)
    return recorded is not None and recorded == _body_digest(text)


def _plain(values: dict) -> dict:
    """`values` with tuples as lists (YAML and JSON keep them the same way)."""
    return {key: list(value) if isinstance(value, tuple) else value for key, value in values.items()}
