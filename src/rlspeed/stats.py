"""Robust aggregates of many runs (Agarwal et al. 2021, "Deep RL at the Edge of the Statistical Precipice"): median,
interquartile mean (IQM) and percentile-bootstrap 95% confidence intervals, computed as `rliable` computes them.

Scores are an array `[runs]` (one task) or `[runs, tasks]`. The IQM is `rliable.metrics.aggregate_iqm`: the mean of
the middle 50% of all scores (`scipy.stats.trim_mean(scores, 0.25, axis=None)`). The intervals follow
`rliable.library.get_interval_estimates(..., method="percentile")`: each bootstrap replicate resamples the runs
with replacement independently per task (stratified over tasks), and the interval is the 2.5th and 97.5th
percentiles of the statistic over the replicates (numpy's linear interpolation, as `arch` takes them). The resampling
draws the same indices as rliable's `StratifiedBootstrap` after `np.random.seed(seed)`, so with the same seed and
number of replicates the intervals are the same numbers.

`probability_of_improvement` and `performance_profile` are rliable's `metrics.probability_of_improvement` and
`library.create_performance_profile` (score distributions), their intervals drawn as rliable draws them (for two
arrays, `StratifiedIndependentBootstrap`: each replicate resamples the first array's runs, then the second's).

`median` here is the median of all scores. rliable's `aggregate_median` is the median over tasks of each task's
mean score, which for one task is the mean; pass `statistic=median` to rliable to compare the two.
"""

from __future__ import annotations

import typing
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from rlspeed.errors import UserError, positive_whole


def _as_scores(scores: npt.ArrayLike) -> np.ndarray:
    """Scores as a float64 array `[runs, tasks]`; UserError for an empty, ragged or non-finite array or more than 2
    dims."""
    try:
        array = np.asarray(scores, dtype=np.float64)
    except ValueError as error:
        if "sequence" not in str(error):  # (a value that is no number: a CSV file's blank or text cell, as a string)
            raise UserError(f"Scores must be numbers: {str(error).rstrip('.')}.") from None
        # (numpy's "setting an array element with a sequence": a task with fewer runs, a run dropped from one task)
        raise UserError("Scores must be a rectangular array [runs, tasks]: every task needs the same number of runs "
                        "(a run dropped from one task must be dropped from all, or given a score).") from None
    if array.ndim == 1:
        array = array[:, None]
    if array.ndim != 2 or array.size == 0:
        raise UserError(f"Scores must be a non-empty array [runs] or [runs, tasks], got shape {array.shape}.")
    if not np.isfinite(array).all():
        bad = array[~np.isfinite(array)]
        what = ", ".join(sorted({str(value) for value in bad.tolist()}))
        raise UserError(f"Scores must be finite, got {bad.size} that {'is' if bad.size == 1 else 'are'} not ({what}): "
                        "drop the runs that diverged before aggregating (rliable's IQM would trim an infinite score "
                        "away, and its interval would be NaN).")
    return array


def median(scores: npt.ArrayLike) -> float:
    """The median of all scores."""
    return float(np.median(_as_scores(scores)))


def _iqm_rows(rows: np.ndarray) -> np.ndarray:
    """The IQM of each row of `[reps, n]` -> `[reps]`."""
    flat = np.sort(rows, axis=1)
    cut = int(0.25 * flat.shape[1])
    return flat[:, cut:flat.shape[1] - cut].mean(axis=1)


def iqm(scores: npt.ArrayLike) -> float:
    """The interquartile mean: the mean of the scores left after cutting int(0.25 n) from each end of the sorted
    scores (`scipy.stats.trim_mean(scores, 0.25, axis=None)`, rliable's `aggregate_iqm`)."""
    return float(_iqm_rows(_as_scores(scores).reshape(1, -1))[0])


def _batched(statistic: Callable) -> Callable[[np.ndarray], np.ndarray]:
    """`statistic` over a batch of replicates `[reps, runs, tasks]` -> `[reps]` (vectorised for median and IQM)."""
    if statistic is median:
        return lambda batch: np.median(batch.reshape(batch.shape[0], -1), axis=1)
    if statistic is iqm:
        return lambda batch: _iqm_rows(batch.reshape(batch.shape[0], -1))
    return lambda batch: np.array([statistic(replicate) for replicate in batch])


#: The most bootstrap replicates an interval takes (`reps` here, `rlspeed.report`'s and `rlspeed report --reps`):
#: the intervals' digits settle long before, and the time grows with the replicates
MAX_REPS = 10_000_000


def bootstrap_reps(reps: float, name: str = "reps") -> int:
    """`reps` (a whole number, 1e4 included) as an int from 1 to `MAX_REPS`; a UserError naming `name` otherwise."""
    reps = positive_whole(name, reps)
    if reps > MAX_REPS:
        raise UserError(f"{name} must be at most {MAX_REPS:,} (bootstrap replicates: the intervals' digits settle "
                        f"long before, and the time grows with them), got {reps:,}.")
    return reps


def _check_interval(confidence: float, reps: float) -> int:
    """`reps` as an int (`bootstrap_reps`); a UserError for a `confidence` outside (0, 1)."""
    if not 0 < confidence < 1:
        raise UserError(f"confidence must be in (0, 1), got {confidence}.")
    return bootstrap_reps(reps)


def _percentiles(values: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """The percentile interval of bootstrap `values` `[reps, ...]` at `confidence`: (low, high), each `[...]`."""
    alpha = 100 * (1 - confidence) / 2
    low, high = np.percentile(values, [alpha, 100 - alpha], axis=0)
    return low, high


def _replicates(array: np.ndarray, batched: Callable[[np.ndarray], np.ndarray], reps: int,
                seed: int, width: int = 1) -> np.ndarray:
    """`batched` (a statistic of `[count, runs, tasks]` -> `[count, ...]`) over `reps` stratified resamples of
    `array`, drawn as rliable's StratifiedBootstrap draws them from `np.random.RandomState(seed)`. `width`: the
    values `batched` makes per score of a replicate (a performance profile's thresholds), which bound the replicates
    resampled at once with the scores' count."""
    runs, tasks = array.shape
    # rliable's StratifiedBootstrap.update_indices: np.random.choice(runs, (runs, tasks)) per replicate, run indices
    # drawn independently for each task column; one call for all replicates draws the same numbers
    random_state = np.random.RandomState(seed)
    values = []
    chunk = max(1, (1 << 22) // (array.size * width))  # replicates resampled at once (bounded memory)
    columns = np.arange(tasks)
    for start in range(0, reps, chunk):
        count = min(chunk, reps - start)
        indices = random_state.choice(runs, (count, runs, tasks), replace=True)
        values.append(batched(array[indices, columns]))
    return np.concatenate(values)


def bootstrap_ci(scores: npt.ArrayLike, statistic: Callable[[np.ndarray], typing.SupportsFloat] = iqm,
                 reps: int = 50_000, confidence: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """(low, high): the percentile-bootstrap `confidence` interval of `statistic` over runs, stratified over tasks,
    with rliable's resampling (see the module docstring). `scores`: an array `[runs]` or `[runs, tasks]`;
    `statistic` takes an array `[runs, tasks]`; `reps` bootstrap replicates drawn from `np.random.RandomState(seed)`
    (the same `seed` and `reps` give the same interval). UserError for empty or non-finite scores, a `confidence`
    outside (0, 1) or `reps` not a whole number from 1 to `MAX_REPS`."""
    array = _as_scores(scores)
    reps = _check_interval(confidence, reps)
    low, high = _percentiles(_replicates(array, _batched(statistic), reps, seed), confidence)
    return float(low), float(high)


def aggregate(scores: npt.ArrayLike, reps: int = 50_000, seed: int = 0) -> dict[str, typing.Any]:
    """Median and IQM of `scores`, each with its 95% percentile-bootstrap interval, as summary.json stores them:
    ``{"runs", "median", "median_ci", "iqm", "iqm_ci"}`` (intervals as [low, high]; `reps` and `seed` as
    `bootstrap_ci`'s)."""
    array = _as_scores(scores)
    return {"runs": int(array.shape[0]), "median": median(array),
            "median_ci": list(bootstrap_ci(array, median, reps=reps, seed=seed)),
            "iqm": iqm(array), "iqm_ci": list(bootstrap_ci(array, iqm, reps=reps, seed=seed))}


def _improvement(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """P(X > Y) + P(X = Y) / 2 per batch row, averaged over tasks: `[count, runs_x, tasks]` and `[count, runs_y,
    tasks]` -> `[count]` (the Mann-Whitney U statistic over runs_x * runs_y, as rliable computes it per task)."""
    left, right = x[:, :, None, :], y[:, None, :, :]
    wins = (left > right).mean(axis=(1, 2)) + 0.5 * (left == right).mean(axis=(1, 2))  # [count, tasks]
    return wins.mean(axis=1)


def probability_of_improvement(scores_x: npt.ArrayLike, scores_y: npt.ArrayLike, reps: int = 50_000,
                               confidence: float = 0.95, seed: int = 0) -> dict[str, typing.Any]:
    """The probability that a run of X scores higher than a run of Y on the same task (ties count half), averaged
    over tasks, with its percentile-bootstrap `confidence` interval: ``{"probability", "ci", "runs"}`` (`ci` as
    [low, high], `runs` as [runs of X, runs of Y]). Agarwal et al.'s measure of whether X improves on Y (rliable's
    `metrics.probability_of_improvement`): above 0.5 X tends to score higher, and an interval whose low end is above
    0.5 says so with that confidence. `scores_x` `[runs_x]` or `[runs_x, tasks]`, `scores_y` the same tasks with any
    number of runs; each replicate resamples X's runs, then Y's, independently per task, from
    `np.random.RandomState(seed)`, as rliable's `StratifiedIndependentBootstrap` draws them (the same `seed` and
    `reps` give the same interval)."""
    x, y = _as_scores(scores_x), _as_scores(scores_y)
    if x.shape[1] != y.shape[1]:
        raise UserError(f"Both score arrays need the same tasks (columns): got {x.shape[1]} and {y.shape[1]}.")
    reps = _check_interval(confidence, reps)
    (runs_x, tasks), runs_y = x.shape, y.shape[0]
    random_state = np.random.RandomState(seed)
    columns = np.arange(tasks)
    values = []
    chunk = max(1, (1 << 22) // (runs_x * runs_y * tasks))  # replicates compared at once (bounded memory)
    for start in range(0, reps, chunk):
        count = min(chunk, reps - start)
        if runs_x == runs_y:  # (the draws alternate X, Y with one bound: one call draws the same numbers)
            both = random_state.choice(runs_x, (count, 2, runs_x, tasks), replace=True)
            index_x, index_y = both[:, 0], both[:, 1]
        else:
            draws = [(random_state.choice(runs_x, (runs_x, tasks), replace=True),
                      random_state.choice(runs_y, (runs_y, tasks), replace=True)) for _ in range(count)]
            index_x, index_y = np.stack([d[0] for d in draws]), np.stack([d[1] for d in draws])
        values.append(_improvement(x[index_x, columns], y[index_y, columns]))
    low, high = _percentiles(np.concatenate(values), confidence)
    return {"probability": float(_improvement(x[None], y[None])[0]), "ci": [float(low), float(high)],
            "runs": [int(runs_x), int(runs_y)]}


def performance_profile(scores: npt.ArrayLike, thresholds: npt.ArrayLike, reps: int = 50_000,
                        confidence: float = 0.95, seed: int = 0) -> dict[str, typing.Any]:
    """The fraction of runs (all runs of all tasks) that score above each threshold, with its percentile-bootstrap
    `confidence` band: ``{"thresholds", "fraction", "ci_low", "ci_high"}``, lists as long as `thresholds`. A
    performance profile (Agarwal et al.; rliable's `create_performance_profile` with score distributions): plot
    `fraction` against `thresholds` with the band between `ci_low` and `ci_high`; one profile above another at every
    threshold scores higher whatever the threshold. `thresholds`: numbers, in the scores' units (normalise several
    tasks first: docs/population.md); intervals resample the runs as `bootstrap_ci` does (same `seed` and `reps`,
    same numbers as rliable)."""
    array = _as_scores(scores)
    reps = _check_interval(confidence, reps)
    try:
        taus = np.asarray(thresholds, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise UserError(f"thresholds must be numbers, got {thresholds!r}.") from None
    if taus.size == 0 or not np.isfinite(taus).all():
        raise UserError(f"thresholds must be one or more finite numbers, got {thresholds!r}.")

    def fractions(batch: np.ndarray) -> np.ndarray:  # [count, runs, tasks] -> [count, thresholds]
        flat = batch.reshape(batch.shape[0], -1, 1)
        return (flat > taus).mean(axis=1)

    low, high = _percentiles(_replicates(array, fractions, reps, seed, width=taus.size), confidence)
    return {"thresholds": taus.tolist(), "fraction": fractions(array[None])[0].tolist(), "ci_low": low.tolist(),
            "ci_high": high.tolist()}


#: bootstrap replicates per step of `iqm_curve` (a band per evaluation step: fewer than a reported number's)
CURVE_REPS = 2_000


def iqm_curve(curves: typing.Sequence[typing.Sequence[tuple[float, float]]], ends: typing.Sequence | None = None,
              reps: int = CURVE_REPS, confidence: float = 0.95, seed: int = 0) -> dict[str, list]:
    """Learning curves of many runs as one: the IQM across runs at each step with its percentile-bootstrap
    `confidence` interval (rliable's `get_interval_estimates` at every step, the same numbers for the same `seed`
    and `reps`). `curves`: one sequence of `(steps, score)` pairs per run, steps rising. The steps are every step at
    which any run has a score; at each, a run counts with its latest finite score at or before it (so runs evaluated
    at other steps, or one that stopped early, count with their last evaluation; None is no score), a run with none
    yet does not count, nor, where `ends[i]` is given and not None, run i at and after step `ends[i]` (a run that
    diverged there). Returns ``{"steps", "iqm", "ci_low", "ci_high", "runs"}``, lists as long as the steps (`runs`:
    how many counted at each step; one run's interval has no width)."""
    reps = _check_interval(confidence, reps)
    ends = [None] * len(curves) if ends is None else list(ends)
    if len(ends) != len(curves):
        raise UserError(f"ends needs one entry per curve: got {len(ends)} for {len(curves)} curves.")
    try:
        pairs = [np.asarray([(float(step), np.nan if score is None else float(score)) for step, score in curve],
                            dtype=np.float64).reshape(-1, 2) for curve in curves]
    except (TypeError, ValueError):
        raise UserError("Each curve must be a sequence of (steps, score) pairs of numbers.") from None
    steps = np.unique(np.concatenate([pair[:, 0] for pair in pairs])) if pairs else np.empty(0)
    # latest[i, j]: run i's latest finite score at or before steps[j] (NaN: none yet, or past its end)
    latest = np.full((len(pairs), steps.size), np.nan)
    for row, (pair, end) in enumerate(zip(pairs, ends)):
        pair = pair[np.isfinite(pair[:, 1])]
        if pair.size == 0:
            continue
        if (np.diff(pair[:, 0]) < 0).any():
            raise UserError(f"Curve {row}'s steps must rise, got {pair[:, 0].tolist()}.")
        index = np.searchsorted(pair[:, 0], steps, side="right") - 1
        latest[row] = np.where(index >= 0, pair[np.maximum(index, 0), 1], np.nan)
        if end is not None:
            latest[row, steps >= end] = np.nan
    out: dict[str, list] = {"steps": [], "iqm": [], "ci_low": [], "ci_high": [], "runs": []}
    for column, step in enumerate(steps):
        values = latest[:, column][np.isfinite(latest[:, column])]
        if values.size == 0:
            continue
        low, high = bootstrap_ci(values, iqm, reps=reps, confidence=confidence, seed=seed)
        out["steps"].append(int(step) if float(step).is_integer() else float(step))
        out["iqm"].append(iqm(values))
        out["ci_low"].append(low)
        out["ci_high"].append(high)
        out["runs"].append(int(values.size))
    return out
