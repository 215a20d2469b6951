"""Robust aggregates of many runs (Agarwal et al. 2021, "Deep RL at the Edge of the Statistical Precipice"): median,
interquartile mean (IQM) and percentile-bootstrap 95% confidence intervals, computed as `rliable` computes them.

Scores are an array `[runs]` (one task) or `[runs, tasks]`. The IQM is `rliable.metrics.aggregate_iqm`: the mean of
the middle 50% of all scores (`scipy.stats.trim_mean(scores, 0.25, axis=None)`). The intervals follow
`rliable.library.get_interval_estimates(..., method="percentile")`: each bootstrap replicate resamples the runs
with replacement independently per task (stratified over tasks), and the interval is the 2.5th and 97.5th
percentiles of the statistic over the replicates (numpy's linear interpolation, as `arch` takes them). The resampling
draws the same indices as rliable's `StratifiedBootstrap` after `np.random.seed(seed)`, so with the same seed and
number of replicates the intervals are the same numbers.

`median` here is the median of all scores. rliable's `aggregate_median` is the median over tasks of each task's
mean score, which for one task is the mean; pass `statistic=median` to rliable to compare the two.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rlspeed.errors import UserError


def _as_scores(scores) -> np.ndarray:
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


def median(scores) -> float:
    """The median of all scores."""
    return float(np.median(_as_scores(scores)))


def _iqm_rows(rows: np.ndarray) -> np.ndarray:
    """The IQM of each row of `[reps, n]` -> `[reps]`."""
    flat = np.sort(rows, axis=1)
    cut = int(0.25 * flat.shape[1])
    return flat[:, cut:flat.shape[1] - cut].mean(axis=1)


def iqm(scores) -> float:
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


def bootstrap_ci(scores, statistic: Callable = iqm, reps: int = 50_000, confidence: float = 0.95,
                 seed: int = 0) -> tuple[float, float]:
    """(low, high): the percentile-bootstrap `confidence` interval of `statistic` over runs, stratified over tasks,
    with rliable's resampling (see the module docstring). `scores`: an array `[runs]` or `[runs, tasks]`;
    `statistic` takes an array `[runs, tasks]`; `reps` bootstrap replicates drawn from `np.random.RandomState(seed)`
    (the same `seed` and `reps` give the same interval). UserError for empty or non-finite scores, a `confidence`
    outside (0, 1) or `reps` below 1."""
    array = _as_scores(scores)
    if not 0 < confidence < 1:
        raise UserError(f"confidence must be in (0, 1), got {confidence}.")
    if reps < 1:
        raise UserError(f"reps must be >= 1, got {reps}.")
    runs, tasks = array.shape
    # rliable's StratifiedBootstrap.update_indices: np.random.choice(runs, (runs, tasks)) per replicate, run indices
    # drawn independently for each task column; one call for all replicates draws the same numbers
    random_state = np.random.RandomState(seed)
    values = np.empty(reps)
    batched = _batched(statistic)
    chunk = max(1, (1 << 22) // array.size)  # replicates resampled at once (bounded memory)
    columns = np.arange(tasks)
    for start in range(0, reps, chunk):
        count = min(chunk, reps - start)
        indices = random_state.choice(runs, (count, runs, tasks), replace=True)
        values[start:start + count] = batched(array[indices, columns])
    alpha = 100 * (1 - confidence) / 2
    low, high = np.percentile(values, [alpha, 100 - alpha])
    return float(low), float(high)


def aggregate(scores, reps: int = 50_000, seed: int = 0) -> dict:
    """Median and IQM of `scores`, each with its 95% percentile-bootstrap interval, as summary.json stores them:
    ``{"runs", "median", "median_ci", "iqm", "iqm_ci"}`` (intervals as [low, high]; `reps` and `seed` as
    `bootstrap_ci`'s)."""
    array = _as_scores(scores)
    return {"runs": int(array.shape[0]), "median": median(array),
            "median_ci": list(bootstrap_ci(array, median, reps=reps, seed=seed)),
            "iqm": iqm(array), "iqm_ci": list(bootstrap_ci(array, iqm, reps=reps, seed=seed))}
