"""Many runs as one result, for a paper: `rlspeed report RUN_DIR...` reads run directories (solo runs and populations),
pools the seeds of each experiment, and gives the final-score table and the learning curves as the interquartile mean
(IQM) with 95% percentile-bootstrap intervals, computed as rliable computes them (`rlspeed.stats`).

An experiment is an algorithm on an env with one set of settings: the resolved hyperparameters (a population member's
own values included), env options, budget and target that config.yaml records. Runs that differ in any of these are
never pooled; the experiments of one algorithm and env are then told apart by the settings that differ. Every seed
counts once: a seed found in two run directories of one experiment is refused, as is a run that did not finish.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from rlspeed import yamlfile
from rlspeed.errors import UserError
from rlspeed.files import local_path, write_text_atomic
from rlspeed.logging import agg_figure, format_return, save_figure
from rlspeed.stats import CURVE_REPS, aggregate, bootstrap_reps, iqm_curve

#: the files `write_report` writes into its folder (an existing one is replaced only with `overwrite=True`)
REPORT_FILES = ("final_scores.csv", "scores.csv", "curves.csv")
#: what an experiment is: config.yaml's settings that change what is learnt (the rest: how fast, where)
EXPERIMENT_SETTINGS = ("hyperparameters", "env_kwargs", "total_timesteps", "target_return", "init_from")


@dataclass
class SeedResult:
    """One seed's results: a solo run, or one member of a population. `algo`, `env_id`, `seed` and `run_dir` (the
    run directory it came from); `settings`, its experiment (config.yaml's `EXPERIMENT_SETTINGS`, the hyperparameters
    with the member's own values, less those that had no effect: `inert_settings`); `final`, the final evaluation's
    mean return over `episodes` episodes (None for a member that diverged, left out of the final scores); `curve`, its
    evaluations during training as (env steps, mean return); `diverged_at`, the env step a member diverged at (its
    curve counts up to there), else None; `steps_to_target`, summary.json's; `unfinished`, the final evaluation's
    episodes cut short at the step limit (counted with the return collected by then; 0 in summaries of an rlspeed
    that did not record them)."""

    algo: str
    env_id: str
    seed: int
    run_dir: Path
    settings: dict
    final: float | None
    episodes: int | None
    curve: list[tuple[int, float]] = field(default_factory=list)
    diverged_at: int | None = None
    steps_to_target: int | None = None
    unfinished: int = 0


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise UserError(f"'{path}' cannot be read as a run's summary.json ({getattr(error, 'strerror', None) or error})"
                        ": give rlspeed run directories.") from None
    if not isinstance(data, dict) or not {"algo", "env_id"} <= set(data):
        raise UserError(f"'{path}' is not an rlspeed run's summary.json (no algo and env_id): give rlspeed run "
                        "directories.")
    return data


def _read_config(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = yamlfile.load_run_file(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        raise UserError(f"'{path}' cannot be read ({getattr(error, 'strerror', None) or type(error).__name__}): "
                        "leave its run out, or restore the file.") from None
    return data if isinstance(data, dict) else {}


def _eval_curve(path: Path) -> list[tuple[int, float]]:
    """A solo run's evaluations from its metrics.csv: the rows with an `eval_mean` (none where it never evaluated)."""
    if not path.is_file():
        return []
    with open(path, newline="", encoding="utf-8", errors="replace") as handle:
        try:
            return [(int(float(row["timesteps"])), float(row["eval_mean"])) for row in csv.DictReader(handle)
                    if row.get("eval_mean") not in (None, "") and row.get("timesteps") not in (None, "")]
        except ValueError as error:
            raise UserError(f"'{path}' has a row that is not numbers ({error}): leave its run out, or restore the "
                            "file.") from None


def _run_dirs(paths) -> list[Path]:
    """The run directories (those holding a summary.json) at or under `paths`, each once, in order; hidden folders
    (an overwritten run moved aside) are not searched."""
    found: dict[Path, None] = {}
    for given in paths:
        path = local_path(given)
        if path.is_file() and path.name == "summary.json":
            path = path.parent
        if not path.is_dir():
            raise UserError(f"'{given}' is not a run directory or a folder of them: give the --out of rlspeed train "
                            "runs (or a folder holding them).")
        if (path / "summary.json").is_file():
            found[path.resolve()] = None
            continue
        under = sorted(summary.parent for summary in path.rglob("summary.json")
                       if not any(part.startswith(".") for part in summary.relative_to(path).parts))
        if not under:
            raise UserError(f"'{given}' holds no run (no summary.json in it or under it): give the --out of finished "
                            "rlspeed train runs.")
        found.update((run.resolve(), None) for run in under)
    return list(found)


def _unfinished(run_dir: Path, summary: dict) -> str | None:
    """Why the run in `run_dir` has no result to report, or None."""
    if summary.get("error"):
        error = summary["error"]
        what = error.get("message") if isinstance(error, dict) else error
        return f"ended by an error ({what})"
    if summary.get("interrupted"):
        return "was interrupted (summary.json says \"interrupted\": true): --resume it"
    if "members" not in summary and (summary.get("final_eval") or {}).get("mean") is None:
        return "has no final evaluation in its summary.json"
    return None


def final_evaluation_skipped(member: dict) -> bool:
    """Whether a population's summary.json entry `member` lacks the final evaluation of a member that did not diverge
    (a signal as training ended or during the final evaluation skips it: `rlspeed train ... --resume` runs it)."""
    return (member.get("final_eval") or {}).get("mean") is None and member.get("diverged_at") is None


def _load(run_dir: Path, own_env: tuple | None = None, envs: dict | None = None) -> list[SeedResult]:
    """The `SeedResult`s of the run in `run_dir`; `own_env` and `envs`: `_run_envs`', which say its env's spaces."""
    summary = _read_json(run_dir / "summary.json")
    why = _unfinished(run_dir, summary)
    if why is not None:
        raise UserError(f"The run '{run_dir}' {why}; leave it out of the report, or finish it first.")
    config = _read_config(run_dir / "config.yaml")
    settings = {key: config.get(key) for key in EXPERIMENT_SETTINGS if key in config}
    if settings.get("init_from") is None:  # (a run from scratch: an older rlspeed's config.yaml has no such key)
        settings.pop("init_from", None)
    settings.setdefault("target_return", summary.get("target_return"))
    hyperparameters = dict(settings.get("hyperparameters") or {})
    common = {"algo": str(summary["algo"]), "env_id": str(summary["env_id"]), "run_dir": run_dir}
    env = own_env or (envs or {}).get(_env_key(common["env_id"], config.get("env_kwargs")))
    if "members" not in summary:
        settings["hyperparameters"] = _effective(common["algo"], hyperparameters, env)
        final = summary["final_eval"]
        return [SeedResult(**common, seed=int(summary["seed"]), settings=settings, final=float(final["mean"]),
                           episodes=final.get("episodes"), curve=_eval_curve(run_dir / "metrics.csv"),
                           steps_to_target=summary.get("steps_to_target"),
                           unfinished=int(final.get("unfinished") or 0))]
    results = []
    for member in summary["members"]:
        final = member.get("final_eval") or {}
        if final_evaluation_skipped(member):
            raise UserError(f"The run '{run_dir}' has no final evaluation of seed {member.get('seed')} (a signal "
                            "as training ended or during the final evaluation skips it): run it with rlspeed train ... "
                            f"--resume --out {run_dir} (the run's command), or leave it out of the report.")
        own = {**settings, "hyperparameters": _effective(common["algo"], {**hyperparameters,
                                                                          **(member.get("hyperparameters") or {})},
                                                         env)}
        results.append(SeedResult(
            **common, seed=int(member["seed"]), settings=own,
            final=None if final.get("mean") is None else float(final["mean"]), episodes=final.get("episodes"),
            curve=[(int(step), value) for step, value in member.get("curve") or []],
            diverged_at=member.get("diverged_at"), steps_to_target=member.get("steps_to_target"),
            unfinished=int(final.get("unfinished") or 0)))
    return results


def _env_key(env_id: str, env_kwargs: dict | None) -> str:
    return json.dumps([env_id, env_kwargs or {}], sort_keys=True, default=str)


def _run_envs(run_dirs: list[Path]) -> tuple[dict[Path, tuple | None], dict[str, tuple]]:
    """`_run_env` of each run in `run_dirs` (each model file's header read once), and the first of each env id and
    options (`_env_key`): the spaces a model file records are its env's, so a run whose model file is gone or sealed
    (encrypted) is read as the others of its env are, not as an experiment of its own."""
    own = {run_dir: _run_env(run_dir) for run_dir in run_dirs}
    envs: dict[str, tuple] = {}
    for env in own.values():
        if env is not None:
            envs.setdefault(_env_key(env[0].env_id, env[0].env_kwargs), env)
    return own, envs


def _run_env(run_dir: Path):
    """The env spec of the run in `run_dir` as its model file's header records it (a population's: its first member's
    model), and whether its id tells an Atari game from others here (registered, ale-py's ids where it is installed);
    None where no model file says (an encrypted one, an rlspeed that did not record spaces)."""
    from rlspeed.checkpoint import MEMBERS_DIR, header_metadata
    from rlspeed.envs.base import EnvSpec, space_from_json

    files = [run_dir / "model.safetensors", *sorted((run_dir / MEMBERS_DIR).glob("seed_*.safetensors"))]
    meta = next((found for file in files if file.is_file() and (found := header_metadata(file)) is not None), None)
    try:
        spec = EnvSpec(str(meta["env_id"]), tuple(meta["observation_shape"]), space_from_json(meta["action_space"]),
                       None, None, space_from_json(meta["observation_space"]), dict(meta.get("env_kwargs") or {}))
    except (TypeError, KeyError, ValueError, AttributeError, UserError):  # (no model file, or one without spaces)
        return None
    import gymnasium as gym

    from rlspeed.envs.atari import atari_image_id

    return spec, spec.env_id in gym.registry or atari_image_id(spec.env_id)


def _effective(algo: str, hyperparameters: dict, env=None) -> dict:
    """`hyperparameters` (of an `algo` run) less those that changed nothing (`inert_settings`: sde_sample_freq
    without use_sde; with `env`, `_run_env`'s, also those its env makes idle: CNN options without images,
    episodic_life off Atari), which do not tell its experiment from another's; as they are where the algorithm is not
    one of rlspeed's or the values no longer make its config."""
    import warnings

    from rlspeed.algos import ALGORITHMS
    from rlspeed.algos.base import build_config, inert_settings

    if algo not in ALGORITHMS:
        return hyperparameters
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            config = build_config(ALGORITHMS[algo].config_cls, hyperparameters)
    except UserError:
        return hyperparameters
    inert = inert_settings(config, *env) if env is not None else inert_settings(config)
    return {key: value for key, value in hyperparameters.items() if key not in inert}


def collect_runs(paths: Iterable[str | os.PathLike[str]]) -> list[SeedResult]:
    """Every seed's results in the run directories at or under `paths` (run directories, or folders holding them):
    one `SeedResult` per solo run and per population member. UserError (one sentence) for a path that holds no run, a
    run that did not finish (interrupted, ended by an error) and a seed found twice in one experiment."""
    run_dirs = list(_run_dirs(paths))
    own, envs = _run_envs(run_dirs)
    results = [result for run_dir in run_dirs for result in _load(run_dir, own[run_dir], envs)]
    seen: dict[tuple, Path] = {}
    for result in results:
        key = (*_experiment(result), result.seed)
        if key in seen:
            raise UserError(f"Seed {result.seed} of {result.algo} on {result.env_id} is in two runs of the same "
                            f"settings, '{seen[key]}' and '{result.run_dir}': a seed counts once; leave one out.")
        seen[key] = result.run_dir
    return results


def _experiment(result: SeedResult) -> tuple[str, str, str]:
    return result.algo, result.env_id, json.dumps(result.settings, sort_keys=True, default=str)


def _flat(settings: dict) -> dict:
    """`settings` with the hyperparameters as keys of their own."""
    flat = {key: value for key, value in settings.items() if key != "hyperparameters"}
    flat.update(settings.get("hyperparameters") or {})
    return flat


def _experiments(results: list[SeedResult]) -> list[tuple[str, str, str, list[SeedResult]]]:
    """(algo, env_id, variant, seeds) per experiment, in the order first found; `variant` names the settings in which
    the experiments of one algorithm and env differ ("" where there is one)."""
    groups: dict[tuple, list[SeedResult]] = {}
    for result in results:
        groups.setdefault(_experiment(result), []).append(result)
    out = []
    for (algo, env_id, _), members in groups.items():
        siblings = [group[0].settings for (a, e, _), group in groups.items() if (a, e) == (algo, env_id)]
        flats = [_flat(settings) for settings in siblings]
        differing = sorted({key for flat in flats for key in flat
                            if any(other.get(key) != flat.get(key) for other in flats)})
        own = _flat(members[0].settings)
        variant = ", ".join(f"{key}={own.get(key)}" for key in differing)
        out.append((algo, env_id, variant, sorted(members, key=lambda result: result.seed)))
    return out


def _parse_normalize(normalize: dict[str, tuple[float, float]] | None) -> dict[str, tuple[float, float]]:
    """`normalize` as a dict; a UserError for an env's scores that are not finite with low below high (a higher
    return is a better one, and low and high become 0 and 1: the other way round, the better runs would score
    lower, and a row over several envs would mix the two directions)."""
    normalize = dict(normalize or {})
    for env_id, pair in normalize.items():
        try:
            low, high = (float(value) for value in pair)
        except (TypeError, ValueError):
            raise UserError(f"The normalisation of {env_id} (--normalize {env_id}=LOW:HIGH) needs two scores, LOW and "
                            f"HIGH (the returns that become 0 and 1), got {pair!r}.") from None
        normalize[env_id] = (low, high)
        if not (math.isfinite(low) and math.isfinite(high) and low < high):
            raise UserError(f"The normalisation of {env_id} (--normalize {env_id}=LOW:HIGH) needs finite scores, LOW "
                            f"below HIGH (the returns that become 0 and 1), got {low:g} and {high:g}.")
    return normalize


def _scale(env_id: str, normalize: dict[str, tuple[float, float]]):
    low, high = normalize.get(env_id, (0.0, 1.0))
    return lambda score: (score - low) / (high - low)


def final_scores(results: list[SeedResult], normalize: dict[str, tuple[float, float]] | None = None,
                 reps: int = 50_000, seed: int = 0) -> tuple[list[dict], list[str]]:
    """The final-score table of `results` (`collect_runs`'): one row per experiment (``{"algo", "env_id", "variant",
    "runs", "iqm", "iqm_ci", "median", "median_ci", "mean", "normalized"}``, `rlspeed.stats.aggregate` of its seeds'
    final evaluation means with `reps` replicates from `seed`, members that diverged left out). `normalize` maps env
    ids to (low, high): their scores are (score - low) / (high - low), and with two or more, a row per algorithm
    over those envs together (env_id "all normalized", the bootstrap stratified over envs as rliable's). Returns
    (rows, notes): a note says what was left out and why."""
    normalize = _parse_normalize(normalize)
    rows, notes, per_task = [], [], {}
    for algo, env_id, variant, members in _experiments(results):
        scale = _scale(env_id, normalize)
        named = f"{algo} on {env_id}{f' ({variant})' if variant else ''}"
        scores = [scale(result.final) for result in members if result.final is not None]
        left_out = len(members) - len(scores)
        if left_out:
            notes.append(f"{named}: {left_out} of {len(members)} "
                         "members diverged, left out of the final scores (their curves count up to the step they "
                         "diverged at)")
        episodes = sorted({result.episodes for result in members if result.final is not None} - {None})
        if len(episodes) > 1:
            notes.append(f"{named}: final evaluations of "
                         f"{' and '.join(map(str, episodes))} episodes pooled (--eval-episodes differed)")
        cut = sum(result.unfinished for result in members if result.final is not None)
        if cut:
            notes.append(f"{named}: {cut} of the final evaluations' "
                         f"{sum(result.episodes or 0 for result in members if result.final is not None)} episodes "
                         "were cut short at the step limit (they count with the return collected by then)")
        if not scores:
            continue
        row = {"algo": algo, "env_id": env_id, "variant": variant, **aggregate(scores, reps=reps, seed=seed),
               "mean": float(np.mean(scores)), "normalized": env_id in normalize}
        rows.append(row)
        if env_id in normalize:
            per_task.setdefault(algo, {}).setdefault(env_id, []).append(scores)
    if len(normalize) >= 2:
        for algo, tasks in per_task.items():
            counts = {env_id: [len(scores) for scores in experiments] for env_id, experiments in tasks.items()}
            if set(tasks) != set(normalize) or any(len(count) != 1 for count in counts.values()) or len(
                    {count[0] for count in counts.values()}) != 1:
                has = "; ".join(f"{env_id}: " + (" and ".join(_runs(count) for count in counts[env_id])
                                                  if env_id in counts else "none") for env_id in normalize)
                notes.append(f"{algo}: no row over all normalized envs: it needs one experiment on each of "
                             f"{', '.join(normalize)} with the same number of scored runs (it has {has})")
                continue
            matrix = np.array([tasks[env_id][0] for env_id in normalize]).T  # [runs, tasks]
            rows.append({"algo": algo, "env_id": "all normalized", "variant": "",
                         **aggregate(matrix, reps=reps, seed=seed), "mean": float(matrix.mean()), "normalized": True})
    return rows, notes


def _runs(count: int) -> str:
    return f"{count} run{'s' if count != 1 else ''}"


def learning_curves(results: list[SeedResult], normalize: dict[str, tuple[float, float]] | None = None,
                    reps: int = CURVE_REPS, seed: int = 0) -> list[dict]:
    """One curve per experiment of `results` that evaluated during training: ``{"algo", "env_id", "variant", "steps",
    "iqm", "ci_low", "ci_high", "runs", "normalized"}`` (`rlspeed.stats.iqm_curve` of its seeds' evaluation curves,
    `reps` replicates per step from `seed`: at every step where a seed evaluated, each seed's latest evaluation at or
    before it; a member that diverged counts up to that step; `runs` how many seeds counted at each step). `normalize`
    as `final_scores`'."""
    normalize = _parse_normalize(normalize)
    out = []
    for algo, env_id, variant, members in _experiments(results):
        scale = _scale(env_id, normalize)
        curves = [[(step, scale(value)) for step, value in result.curve] for result in members]
        if not any(curves):
            continue
        band = iqm_curve(curves, ends=[result.diverged_at for result in members], reps=reps, seed=seed)
        out.append({"algo": algo, "env_id": env_id, "variant": variant, **band, "normalized": env_id in normalize})
    return out


def _label(row: dict) -> str:
    return row["algo"].upper() + (f" ({row['variant']})" if row["variant"] else "")


def markdown_table(rows: list[dict]) -> str:
    """The final-score table's `rows` (`final_scores`') as Markdown: IQM and median with their 95% intervals, and the
    mean."""
    number = format_return
    lines = ["| algorithm | env | runs | IQM (95% CI) | median (95% CI) | mean |", "|---|---|---|---|---|---|"]
    for row in rows:
        env = row["env_id"] + (" (normalized)" if row["normalized"] and row["env_id"] != "all normalized" else "")
        lines.append(f"| {_label(row)} | {env} | {row['runs']} | {number(row['iqm'])} "
                     f"[{number(row['iqm_ci'][0])}, {number(row['iqm_ci'][1])}] | {number(row['median'])} "
                     f"[{number(row['median_ci'][0])}, {number(row['median_ci'][1])}] | {number(row['mean'])} |")
    return "\n".join(lines)


def _csv_text(header: list[str], rows) -> str:
    text = io.StringIO(newline="")
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return text.getvalue()


#: characters per line of an experiment's name in a plot's legend (a panel is 4.5 inches wide)
LEGEND_WIDTH = 48


def plot_curves(curves: list[dict], path: str | os.PathLike) -> Path | None:
    """Save the experiments' `curves` (`learning_curves`') as a picture at `path` (its format from the suffix: png,
    pdf, svg) and return the path: one panel per env, each experiment's IQM as a line with its 95% bootstrap band,
    against env steps (per run, a population's per member). None, with a warning, without matplotlib."""
    path = Path(path)
    envs = list(dict.fromkeys(curve["env_id"] for curve in curves))
    columns = min(len(envs), 3)
    rows = math.ceil(len(envs) / columns)
    fig = agg_figure(path, figsize=(4.5 * columns, 3.4 * rows))
    if fig is None:
        return None
    for index, env_id in enumerate(envs):
        ax = fig.add_subplot(rows, columns, index + 1)
        shown = [curve for curve in curves if curve["env_id"] == env_id]
        for colour, curve in zip(_colours(len(shown)), shown):
            runs = max(curve["runs"])
            # (wrapped to the panel: a legend wider than it is cut off, and matplotlib warns that it cannot lay out
            # the figure)
            label = textwrap.fill(f"{_label(curve)}, {_runs(runs)}", LEGEND_WIDTH, break_long_words=False)
            ax.fill_between(curve["steps"], curve["ci_low"], curve["ci_high"], color=colour, alpha=0.25, linewidth=0)
            ax.plot(curve["steps"], curve["iqm"], color=colour, linewidth=1.8, label=label,
                    marker="o" if len(curve["steps"]) == 1 else None)
        ax.set_title(env_id)
        ax.set_xlabel("env steps")
        ax.set_ylabel("normalized score (IQM)" if shown[0]["normalized"] else "evaluation return (IQM)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(textwrap.fill("IQM across runs with 95% bootstrap CI (deterministic evaluations)", 60 * columns),
                 fontsize="medium")  # (one panel's width holds about 60 of its characters)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path)
    return path


def _colours(count: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return [cmap(index % 10) for index in range(count)]


def write_report(paths: Iterable[str | os.PathLike[str]], out: str | os.PathLike | None,
                 normalize: dict[str, tuple[float, float]] | None = None,
                 reps: int = 50_000, image_format: str = "png", overwrite: bool = False) -> dict:
    """Write the report of the runs at or under `paths` into the folder `out`: final_scores.csv (`final_scores`, with
    `normalize` and `reps`), scores.csv (every seed's final score and run directory), curves.csv (`learning_curves`,
    a row per experiment and step) and curves.<image_format> (`plot_curves`); `out` None writes nothing. A folder
    that holds any of these is refused unless `overwrite`; a `normalize` env id that none of the runs trained on is
    refused, as are `reps` outside 1 to `rlspeed.stats.MAX_REPS` and an env's `normalize` scores that are not finite
    with low below high. Returns ``{"results", "final_scores", "curves", "notes", "files"}``."""
    reps, normalize = bootstrap_reps(reps, "--reps"), _parse_normalize(normalize)  # (before the runs are read)
    if out is not None:
        out = local_path(out)
        held = [name for name in (*REPORT_FILES, f"curves.{image_format}") if (out / name).exists()]
        if held and not overwrite:
            raise UserError(f"'{out}' already holds a report ({', '.join(held)}): give another --out, or "
                            "--overwrite.")
    results = collect_runs(paths)
    unknown = sorted(set(normalize or {}) - {result.env_id for result in results})
    if unknown:
        raise UserError(f"--normalize names {', '.join(unknown)}, which none of the runs trained on (they trained on "
                        f"{', '.join(sorted({result.env_id for result in results}))}).")
    table, notes = final_scores(results, normalize=normalize, reps=reps)
    curves = learning_curves(results, normalize=normalize)
    if out is None:
        return {"results": results, "final_scores": table, "curves": curves, "notes": notes, "files": []}
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(f"Cannot create the report folder '{out}' ({error.strerror or error}).") from None
    files = [out / "final_scores.csv", out / "scores.csv", out / "curves.csv"]
    write_text_atomic(files[0], _csv_text(
        ["algo", "env_id", "variant", "runs", "iqm", "iqm_ci_low", "iqm_ci_high", "median", "median_ci_low",
         "median_ci_high", "mean", "normalized"],
        ([row["algo"], row["env_id"], row["variant"], row["runs"], row["iqm"], *row["iqm_ci"], row["median"],
          *row["median_ci"], row["mean"], row["normalized"]] for row in table)))
    write_text_atomic(files[1], _csv_text(
        ["algo", "env_id", "variant", "seed", "final_eval_mean", "final_eval_episodes", "final_eval_unfinished",
         "steps_to_target", "diverged_at", "run_dir"],
        ([algo, env_id, variant, result.seed, "" if result.final is None else result.final,
          "" if result.episodes is None else result.episodes, "" if result.final is None else result.unfinished,
          "" if result.steps_to_target is None else result.steps_to_target,
          "" if result.diverged_at is None else result.diverged_at, str(result.run_dir)]
         for algo, env_id, variant, members in _experiments(results) for result in members)))
    write_text_atomic(files[2], _csv_text(
        ["algo", "env_id", "variant", "timesteps", "runs", "iqm", "iqm_ci_low", "iqm_ci_high", "normalized"],
        ([curve["algo"], curve["env_id"], curve["variant"], step, runs, centre, low, high, curve["normalized"]]
         for curve in curves for step, runs, centre, low, high in zip(curve["steps"], curve["runs"], curve["iqm"],
                                                                      curve["ci_low"], curve["ci_high"]))))
    if curves:
        picture = plot_curves(curves, out / f"curves.{image_format}")
        if picture is not None:
            files.append(picture)
    else:
        notes.append("no run evaluated during training (--eval-freq, or a target): no curves")
    return {"results": results, "final_scores": table, "curves": curves, "notes": notes, "files": files}
