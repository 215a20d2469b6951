"""`rlspeed tune`: hyperparameter search with Optuna, K trials trained at once as one population.

The study lives in an Optuna storage (SQLite by default, which `optuna-dashboard sqlite:///FILE.db` opens). Each
batch asks the sampler for K trials (`study.ask()` K times), trains them as one `rlspeed.population.Population`
(member k takes trial k's hyperparameters and the seed `seed + trial.number`), reports every evaluation to its trial
(`trial.report`) and removes the members whose trial `should_prune()`, then tells Optuna each trial's result. After
every batch the best trial so far is written as a preset YAML that `rlspeed train --preset FILE` reads.

Only hyperparameters that may differ across members are searched (those of the population class, `per_member_keys`):
the shape-changing ones (net_arch, num_envs, num_steps, batch_size, n_epochs, ...) stay fixed at the preset's values
(or `--set`'s) for the whole study, so every trial of a batch fits one batched model.

Objective (minimised): with a target return, the env steps (per member) to reach it in evaluation, confirmed as
`rlspeed train` confirms a target; a trial that does not reach it within the budget scores
`budget * (1 + max(target - final_eval, 0) / max(|target|, 1))`, which is above any reaching trial's and falls as its
final evaluation rises. Without a target: minus the final evaluation (10 deterministic episodes).

Resume: the same command (same storage and study name) continues the study until `trials` trials have finished
(complete or pruned). Trials of a batch that was interrupted (Ctrl-C, SIGTERM, an error) are marked failed before the
command exits, and trials left running by a killed process are marked failed when the study is resumed; failed trials
do not count toward `trials`, so they are redone. One process at a time may run a study.
"""

from __future__ import annotations

import datetime
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from rlspeed.errors import UserError

#: The default search space per algorithm: RL-Zoo's (rl_zoo3's hyperparams_opt.py) restricted to hyperparameters
#: that may differ across members of a population. Ranges are those of the hyperparameter itself; `one_minus` samples
#: 1 - value (on a log scale with `log`), as RL-Zoo samples one_minus_gamma. gamma, gae_lambda and learning_rate are
#: widened beyond RL-Zoo's (0.97-0.9999, 0.9-0.9999, <= 2e-3) to hold the values of rlspeed's shipped presets.
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
    "ddpg": {
        "learning_rate": {"low": 1.0e-5, "high": 1.0e-2, "log": True},
        "gamma": {"low": 0.9, "high": 0.9999, "log": True, "one_minus": True},
        "tau": {"low": 0.001, "high": 0.08, "log": True},
    },
    "dqn": {
        "learning_rate": {"low": 1.0e-5, "high": 1.0e-2, "log": True},
        "gamma": {"low": 0.9, "high": 0.9999, "log": True, "one_minus": True},
        "exploration_fraction": {"low": 0.0, "high": 0.5},
        "exploration_final_eps": {"low": 0.0, "high": 0.2},
    },
}
_SPEC_FIELDS = {"low", "high", "log", "one_minus", "choices"}
_STUDY_ATTR = "rlspeed"  # the study's user attribute that records what it was made for


def per_member_keys(algo_cls: type) -> tuple[str, ...]:
    """The hyperparameters that may differ across members of `algo_cls`'s population (the class's `per_member`, else
    its module's `PER_MEMBER`); UserError when the algorithm has no population yet."""
    from rlspeed.population import IMPLEMENTATIONS

    implementation = IMPLEMENTATIONS.get(algo_cls.__name__)
    if implementation is None:
        raise UserError(f"{algo_cls.__name__} has no population yet (populations cover "
                        f"{', '.join(sorted(IMPLEMENTATIONS))}), so it cannot be trained with --seeds or tuned.")
    keys = (getattr(implementation, "per_member", None) or getattr(implementation, "PER_MEMBER", None)
            or getattr(sys.modules[implementation.__module__], "PER_MEMBER", ()))
    return tuple(keys)


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
        path = Path(path)
        if not path.is_file():
            raise UserError(f"--search-space {path}: no such file; give a YAML file mapping hyperparameters to "
                            "ranges (see docs/tune.md).")
        try:
            space = yaml.safe_load(path.read_text())
        except (yaml.YAMLError, UnicodeDecodeError) as error:
            raise UserError(f"{path} is not valid YAML: {str(error).splitlines()[0]}.") from None
        if not isinstance(space, dict) or not space:
            raise UserError(f"{path} must map hyperparameter names to ranges ({{low, high}}, {{choices}}) or values.")
        space = {str(key): value for key, value in space.items()}
        where = str(path)
        for key in space:
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
        raise UserError(f"{where} leaves nothing to search: give at least one range or list of choices.")
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
        return
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
    """A member's score (lower is better): steps to the target when reached; else `budget * (1 + gap)` with
    `gap = max(target - final_eval, 0) / max(|target|, 1)`; without a target, minus the final evaluation."""
    final = float(member["final_eval"]["mean"])
    if target_return is None:
        return -final
    if member.get("steps_to_target") is not None:
        return float(member["steps_to_target"])
    gap = max(target_return - final, 0.0) / max(abs(target_return), 1.0)
    return float(budget) * (1.0 + gap)


# --- the study -------------------------------------------------------------------------------------------------
def storage_url(storage: str) -> str:
    """An Optuna storage URL: a URL as given, or a plain file path as `sqlite:///PATH`."""
    return storage if "://" in storage else f"sqlite:///{storage}"


def _open_study(storage: str, study_name: str, seed: int, population: int, budget: int, record: dict):
    """The study `study_name` in `storage`, created or loaded; UserError when it was made for another setup."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # rlspeed prints one line per batch instead
    url = storage_url(storage)
    if url.startswith("sqlite:///"):
        parent = Path(url[len("sqlite:///"):]).expanduser().parent
        if not parent.is_dir():
            raise UserError(f"--storage {storage}: the directory '{parent}' does not exist.")
    try:
        rdb = optuna.storages.RDBStorage(url)
    except Exception as error:  # SQLAlchemy's errors for a bad URL or an unreadable file
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UserError(f"--storage {storage}: cannot open it as an Optuna storage ({first[:200]}).") from None
    existing = {summary.study_name for summary in optuna.get_all_study_summaries(rdb)}
    finished = 0
    if study_name in existing:
        study = optuna.load_study(study_name=study_name, storage=rdb)
        made_for = study.user_attrs.get(_STUDY_ATTR)
        if made_for is not None and made_for != record:
            changed = [key for key in record if made_for.get(key) != record[key]]
            raise UserError(f"Study '{study_name}' in {storage} was made with another {', '.join(changed)}; resume it "
                            "with the same command, or give a new --study-name.")
        finished = sum(t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
                       for t in study.get_trials(deepcopy=False))
    # the sampler's seed moves on with the study, so a resumed study does not replay the draws it already made
    sampler = optuna.samplers.TPESampler(seed=seed + finished, n_startup_trials=population, multivariate=True,
                                         constant_liar=True)
    pruner = optuna.pruners.MedianPruner(n_startup_trials=min(population, 5), n_warmup_steps=budget // 3)
    study = optuna.create_study(storage=rdb, study_name=study_name, direction="minimize", sampler=sampler,
                                pruner=pruner, load_if_exists=True)
    if study.user_attrs.get(_STUDY_ATTR) is None:
        study.set_user_attr(_STUDY_ATTR, record)
    return study


def _fail_stale(study) -> int:
    """Mark trials left RUNNING (by a process that was killed) as failed; return how many."""
    from optuna.trial import TrialState

    stale = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    for trial in stale:
        study.tell(trial.number, state=TrialState.FAIL)
    return len(stale)


def tune(algo_cls: type, env_id: str, *, trials: int, population: int, storage: str, study_name: str,
         hyperparameters: dict, budget: int, target_return: float | None, eval_freq: int | None,
         search_space: str | Path | None = None, fixed: tuple[str, ...] = (), out: str | Path, seed: int = 0,
         device="cpu", command: str | None = None, say: Callable[..., None] = print) -> dict:
    """Run (or continue) the study until `trials` trials have finished, `population` at a time, and write the best
    configuration as a preset YAML at `out`; returns `{"finished", "best": {...} or None, "out", "wall_s"}`.

    `hyperparameters`: the values (the preset's and --set's) every trial starts from; the search space
    (`search_space` file or the algorithm's default, less the names in `fixed`) is sampled on top. `budget`: env
    steps per member. See the module docstring for the objective, pruning and resume."""
    from optuna.trial import TrialState

    from rlspeed.population import Population

    space, notes = load_search_space(search_space, algo_cls, hyperparameters, tuple(fixed))
    for note in notes:
        say(f"rlspeed: {note}")
    # a setup the population refuses (an env without a native implementation, normalisation, ...) fails here, before
    # the study records any trial
    Population(algo_cls, env_id, seeds=[seed], device=device, **hyperparameters)
    record = {"algo": algo_cls.name, "env_id": env_id, "budget": int(budget), "target_return": target_return,
              "eval_freq": eval_freq, "hyperparameters": _plain(hyperparameters), "search_space": _plain(space)}
    study = _open_study(storage, study_name, seed, population, budget, record)
    stale = _fail_stale(study)
    if stale:
        say(f"rlspeed: {stale} trial(s) left running by an earlier process marked failed (they are redone)")
    counted = (TrialState.COMPLETE, TrialState.PRUNED)
    finished = sum(t.state in counted for t in study.get_trials(deepcopy=False))
    started = time.perf_counter()
    batches = math.ceil(max(trials - finished, 0) / population)
    say(f"rlspeed: study '{study_name}' in {storage_url(storage)}: {finished} of {trials} trials finished; "
        f"{batches} batch(es) of up to {population} to go, {budget:,} steps per trial"
        + (f", objective: steps to eval return >= {target_return:g}" if target_return is not None
           else ", objective: final evaluation"), flush=True)
    batch = 0
    while finished < trials:
        batch += 1
        size = min(population, trials - finished)
        asked = [study.ask() for _ in range(size)]
        told: set[int] = set()
        batch_started = time.perf_counter()
        try:
            counts = _run_batch(asked, told, space, algo_cls, env_id, hyperparameters, budget, target_return,
                                eval_freq, seed, device, study)
        except BaseException:  # Ctrl-C, SIGTERM or an error: the batch's trials are failed, not left running
            for trial in asked:
                if trial.number not in told:
                    study.tell(trial, state=TrialState.FAIL)
            say(f"rlspeed: batch {batch} stopped; its {size} trial(s) marked failed (rerun the command to redo them)",
                file=sys.stderr, flush=True)
            raise
        finished += counts["complete"] + counts["pruned"]
        best = _write_best(study, out, env_id, budget, target_return, eval_freq, hyperparameters, command,
                           storage, study_name)
        say(f"rlspeed: batch {batch}/{batches}: trials {asked[0].number}-{asked[-1].number}: "
            f"{counts['complete']} complete ({counts['reached']} reached the target), {counts['pruned']} pruned"
            + (f", {counts['failed']} failed" if counts["failed"] else "")
            + f" in {time.perf_counter() - batch_started:.1f} s; {_best_line(best, target_return)}", flush=True)
    best = _write_best(study, out, env_id, budget, target_return, eval_freq, hyperparameters, command, storage,
                       study_name)
    wall = time.perf_counter() - started
    if best is None:
        say("rlspeed: no trial completed, so no preset was written")
    else:
        say(f"rlspeed: {_best_line(best, target_return)}; preset written to {out} "
            f"(rlspeed train {algo_cls.name} {env_id} --preset {out})")
    return {"finished": finished, "best": best, "out": str(out), "wall_s": wall}


def _run_batch(asked: list, told: set[int], space: dict, algo_cls: type, env_id: str, hyperparameters: dict,
               budget: int, target_return: float | None, eval_freq: int | None, seed: int, device, study) -> dict:
    """Train the asked trials as one population, report and prune through Optuna, tell the results (adding each told
    trial's number to `told`).

    Every evaluation is reported to its trial (minus the mean return: lower is better, as the objective). A member
    that reached the target leaves the population; its trial goes on reporting the return it reached at each later
    evaluation of the batch, so Optuna's median pruner compares a slow trial with the fast ones too (a trial that
    stopped with the target does not vanish from later steps)."""
    from optuna.trial import TrialState

    from rlspeed.population import Population

    sampled = [sample(trial, space) for trial in asked]
    per_member = {key: [values[key] for values in sampled] for key in space}
    seeds = [seed + trial.number for trial in asked]
    for trial, member_seed, values in zip(asked, seeds, sampled):
        trial.set_user_attr("seed", member_seed)
        trial.set_user_attr("hyperparameters", values)
    members = Population(algo_cls, env_id, seeds=seeds, device=device, **{**hyperparameters, **per_member})

    last: dict[int, float] = {}  # member -> its last evaluated mean

    def on_eval(num_timesteps: int, means: dict[int, float]) -> list[int]:
        for k, mean in last.items():
            if k not in means and target_return is not None and mean >= target_return:  # left with the target
                asked[k].report(-mean, int(num_timesteps))
        pruned = []
        for k, mean in means.items():
            if not math.isfinite(mean):
                continue
            last[k] = float(mean)
            asked[k].report(-float(mean), int(num_timesteps))
            reached = target_return is not None and mean >= target_return
            if not reached and asked[k].should_prune():
                pruned.append(k)
        return pruned

    learn_kwargs = {"target_return": target_return, "stop": "each", "on_eval": on_eval}
    if eval_freq is not None:
        learn_kwargs["eval_freq"] = eval_freq
    summary = members.learn(budget, **learn_kwargs)
    counts = {"complete": 0, "pruned": 0, "failed": 0, "reached": 0}
    for trial, member in zip(asked, summary["members"]):
        final = member.get("final_eval") or {}
        trial.set_user_attr("steps_to_target", member.get("steps_to_target"))
        trial.set_user_attr("final_eval", final.get("mean"))
        if member.get("pruned_at") is not None:
            study.tell(trial, state=TrialState.PRUNED)
            counts["pruned"] += 1
        elif final.get("mean") is None or not math.isfinite(float(final["mean"])):
            trial.set_user_attr("diverged_at", member.get("diverged_at"))
            study.tell(trial, state=TrialState.FAIL)  # a member that diverged (non-finite parameters)
            counts["failed"] += 1
        else:
            study.tell(trial, objective(member, target_return, budget))
            counts["complete"] += 1
            counts["reached"] += member.get("steps_to_target") is not None
        told.add(trial.number)
    return counts


def _best_line(best: dict | None, target_return: float | None) -> str:
    if best is None:
        return "no trial completed yet"
    what = (f"{best['steps_to_target']:,} steps to {target_return:g}" if best.get("steps_to_target") is not None
            else f"final eval {best['final_eval']:.1f}")
    values = ", ".join(f"{key} {value:.3g}" if isinstance(value, float) else f"{key} {value}"
                       for key, value in best["hyperparameters"].items())
    return f"best trial {best['number']}: {what} ({values})"


def _write_best(study, out, env_id: str, budget: int, target_return: float | None, eval_freq: int | None,
                hyperparameters: dict, command: str | None, storage: str, study_name: str) -> dict | None:
    """Write the best completed trial as a preset YAML (`{env_id: {run settings, fixed and tuned hyperparameters}}`)
    at `out`; return its description, or None when no trial has completed."""
    try:
        trial = study.best_trial
    except ValueError:  # no completed trial yet
        return None
    tuned = dict(trial.user_attrs.get("hyperparameters", {}))
    entry = {"total_timesteps": int(budget)}
    if eval_freq is not None:
        entry["eval_freq"] = int(eval_freq)
    if target_return is not None:
        entry["target_return"] = target_return
    entry.update(_plain(hyperparameters))
    entry.update({key: _rounded(value) for key, value in tuned.items()})
    best = {"number": trial.number, "value": trial.value, "seed": trial.user_attrs.get("seed"),
            "steps_to_target": trial.user_attrs.get("steps_to_target"),
            "final_eval": trial.user_attrs.get("final_eval"), "hyperparameters": tuned}
    result = (f"reached {target_return:g} after {best['steps_to_target']:,} steps"
              if best["steps_to_target"] is not None else f"final evaluation {best['final_eval']:.1f}")
    header = [f"# Tuned by rlspeed tune ({datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC): study "
              f"'{study_name}' in {storage_url(storage)}.",
              f"# Best of {len(study.get_trials(deepcopy=False))} trials: trial {trial.number} (seed {best['seed']}) "
              f"{result}; objective {trial.value:g} (lower is better).",
              "# Each trial ran on one seed: check it on others (rlspeed train ... --preset FILE --seeds 100-104)."]
    if command:
        header.insert(1, f"# Command: {command}")
    text = "\n".join(header) + "\n" + yaml.safe_dump({env_id: entry}, sort_keys=False)
    out = Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        temporary = out.with_name(out.name + ".tmp")
        temporary.write_text(text)
        temporary.replace(out)
    except OSError as error:
        raise UserError(f"Cannot write the preset '{out}': {error.strerror or error}.") from None
    return best


def _rounded(value):
    """A float to 6 significant digits (a preset is read by people; the sampler's last digits carry nothing)."""
    return float(f"{value:.6g}") if isinstance(value, float) else value


def _plain(values: dict) -> dict:
    """`values` with tuples as lists (YAML and JSON keep them the same way)."""
    return {key: list(value) if isinstance(value, tuple) else value for key, value in values.items()}
