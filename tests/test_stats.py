"""rlspeed.stats: median, IQM and bootstrap intervals against hand-computed values, scipy, and rliable when it
imports (it needs arch, which does not import with pandas 3: then that test skips)."""

import numpy as np
import pytest

from rlspeed.errors import UserError
from rlspeed.stats import (
    aggregate,
    bootstrap_ci,
    iqm,
    iqm_curve,
    median,
    performance_profile,
    probability_of_improvement,
)


def test_iqm_is_the_mean_of_the_middle_half():
    # 8 scores: 2 cut from each end, mean of 3, 4, 5, 6
    assert iqm([8, 1, 7, 2, 6, 3, 5, 4]) == 4.5
    # an outlier does not move it
    assert iqm([1, 2, 3, 4, 5, 6, 7, 1e9]) == 4.5


def test_iqm_and_median_match_scipy_and_numpy():
    scipy_stats = pytest.importorskip("scipy.stats")
    scores = np.random.default_rng(0).normal(size=(13, 3))
    assert iqm(scores) == pytest.approx(scipy_stats.trim_mean(scores, 0.25, axis=None), abs=1e-12)
    assert median(scores) == pytest.approx(np.median(scores), abs=1e-12)


def test_bootstrap_interval_hand_values():
    # every resample of identical scores has the same statistic
    assert bootstrap_ci([3.0] * 5, reps=1000) == (3.0, 3.0)
    # two runs 0 and 1: a resample's mean is 0, 0.5 or 1 (p = 1/4, 1/2, 1/4); the 2.5th and 97.5th percentiles
    # of many replicates are 0 and 1
    low, high = bootstrap_ci([0.0, 1.0], statistic=lambda x: float(np.mean(x)), reps=4000)
    assert (low, high) == (0.0, 1.0)


def test_bootstrap_interval_is_stratified_over_tasks():
    # task 0 is constant; task 1 varies: resampling runs within each task keeps task 0's column constant
    scores = np.array([[5.0, 0.0], [5.0, 1.0], [5.0, 2.0], [5.0, 3.0]])
    seen = []
    bootstrap_ci(scores, statistic=lambda x: seen.append(x.copy()) or 0.0, reps=50)
    assert len(seen) == 50
    assert all((x[:, 0] == 5.0).all() and set(x[:, 1]) <= {0.0, 1.0, 2.0, 3.0} for x in seen)
    # each task's runs drawn on their own (rliable's): a run's two scores do not travel together as a row
    paired = np.array([[0.0, 10.0], [1.0, 11.0], [2.0, 12.0], [3.0, 13.0]])
    rows = []
    bootstrap_ci(paired, statistic=lambda x: rows.append(x.copy()) or 0.0, reps=50)
    assert any((x[:, 1] - x[:, 0] != 10.0).any() for x in rows)


def test_a_bootstrap_interval_is_of_the_statistic_asked_for():
    """The percentile interval of `statistic` over rliable's resamples, recomputed here replicate by replicate (an
    interval of another statistic, the IQM's for the median's, would be summary.json's median_ci)."""
    scores = np.random.default_rng(2).exponential(size=(9, 2))
    runs, tasks = scores.shape
    draws = np.random.RandomState(5).choice(runs, (400, runs, tasks), replace=True)
    values = [np.median(scores[draw, np.arange(tasks)]) for draw in draws]
    expected = np.percentile(values, [2.5, 97.5])
    assert bootstrap_ci(scores, median, reps=400, seed=5) == pytest.approx(tuple(expected), abs=1e-12)


def test_vectorised_statistics_equal_the_plain_ones():
    scores = np.random.default_rng(1).normal(size=(10, 2))
    for statistic in (median, iqm):
        fast = bootstrap_ci(scores, statistic, reps=300, seed=4)
        slow = bootstrap_ci(scores, lambda x, s=statistic: s(x), reps=300, seed=4)
        assert fast == pytest.approx(slow, abs=1e-12)


def test_aggregate_fields():
    result = aggregate(np.arange(32.0), reps=2000)
    assert result["runs"] == 32 and result["median"] == 15.5 and result["iqm"] == 15.5
    assert result["iqm_ci"][0] < 15.5 < result["iqm_ci"][1]


@pytest.mark.parametrize("bad", [[], [1.0, float("nan")], np.zeros((2, 2, 2))])
def test_bad_scores_are_one_sentence(bad):
    with pytest.raises(UserError):
        iqm(bad)


def test_non_finite_scores_are_named():
    """An infinite score (a diverging return) was refused as 'diverged (NaN)', which it is not: the sentence names
    the values it found."""
    with pytest.raises(UserError, match=r"got 2 that are not \(-inf, inf\)"):
        iqm([1.0, float("inf"), 2.0, float("-inf")])
    with pytest.raises(UserError, match=r"got 1 that is not \(nan\)"):
        iqm([1.0, float("nan")])


def test_tasks_with_different_numbers_of_runs_are_one_sentence():
    """Scores of 2 tasks whose second lost a run (a member that diverged there) were numpy's ValueError about an
    inhomogeneous shape, from every function."""
    ragged = [[0.5, 0.2], [0.7, 0.3], [0.9]]
    for call in (iqm, median, bootstrap_ci, aggregate):
        with pytest.raises(UserError, match="same number of runs"):
            call(ragged)


def test_a_score_that_is_no_number_is_named_not_called_a_ragged_array():
    """A blank cell of metrics.csv read as a string ('' for a member without an evaluation) is no number: the sentence
    says so, where it read as tasks with different numbers of runs."""
    for call in (iqm, aggregate):
        with pytest.raises(UserError, match="Scores must be numbers: could not convert string to float: ''") as raised:
            call([["47.9", ""], ["9.6", "45.0"]])
        assert "same number of runs" not in str(raised.value)


def test_matches_rliable_on_fixed_data():
    try:
        from rliable import library as rly
        from rliable import metrics
    except Exception as error:  # noqa: BLE001 - arch fails with a TypeError under pandas 3
        pytest.skip(f"rliable does not import here: {error}")
    scores = np.random.default_rng(2).normal(size=(16, 3))
    np.random.seed(7)  # rliable's StratifiedBootstrap resamples with numpy's global generator
    points, intervals = rly.get_interval_estimates({"x": scores}, lambda x: np.array([metrics.aggregate_iqm(x)]),
                                                   reps=2000)
    assert iqm(scores) == pytest.approx(points["x"][0], abs=1e-12)
    assert bootstrap_ci(scores, iqm, reps=2000, seed=7) == pytest.approx(tuple(intervals["x"][:, 0]), abs=1e-9)


def test_bootstrap_draws_what_rliables_replicate_loop_draws():
    """rliable's StratifiedBootstrap, written as its replicate loop (one `choice(runs, (runs, tasks))` per replicate
    from one RandomState, the statistic of each resample, percentiles of those): the batched implementation gives the
    same interval, chunk boundaries included. Runs where rliable itself does not import (this test needs no arch)."""
    scores = np.random.default_rng(3).normal(size=(9, 2)) * [1.0, 5.0] + [0.0, 10.0]
    reps = 2_000
    random_state = np.random.RandomState(11)
    columns = np.arange(scores.shape[1])
    values = [iqm(scores[random_state.choice(scores.shape[0], scores.shape, replace=True), columns])
              for _ in range(reps)]
    expected = np.percentile(values, [2.5, 97.5])
    np.testing.assert_allclose(bootstrap_ci(scores, iqm, reps=reps, seed=11), expected, rtol=0, atol=1e-12)


def _rliable():
    try:
        from rliable import library as rly
        from rliable import metrics
    except Exception as error:  # noqa: BLE001 - arch fails with a TypeError under pandas 3
        pytest.skip(f"rliable does not import here: {error}")
    return rly, metrics


@pytest.mark.parametrize("runs_y", [12, 7])
def test_probability_of_improvement_matches_rliable(runs_y):
    """The point estimate and the interval of rliable's probability of improvement, to the last digit, with runs of
    Y as many as X's (the draws batched) and fewer (drawn replicate by replicate)."""
    rly, metrics = _rliable()
    generator = np.random.default_rng(4)
    x = generator.normal(size=(12, 2)).round(1) + [0.3, 0.0]  # (rounded: ties, which count half)
    y = generator.normal(size=(runs_y, 2)).round(1)
    np.random.seed(5)  # rliable's StratifiedIndependentBootstrap resamples with numpy's global generator
    points, intervals = rly.get_interval_estimates({"xy": [x, y]}, lambda a, b: np.array(
        [metrics.probability_of_improvement(a, b)]), reps=500)
    result = probability_of_improvement(x, y, reps=500, seed=5)
    assert result["probability"] == pytest.approx(points["xy"][0], abs=1e-12)
    assert result["ci"] == pytest.approx(list(intervals["xy"][:, 0]), abs=1e-12)
    assert result["runs"] == [12, runs_y]


def test_performance_profile_matches_rliable():
    rly, _ = _rliable()
    scores = np.random.default_rng(6).normal(size=(10, 3))
    taus = np.linspace(-1.5, 1.5, 7)
    np.random.seed(8)
    points, intervals = rly.create_performance_profile({"x": scores}, taus, reps=400)
    result = performance_profile(scores, taus, reps=400, seed=8)
    np.testing.assert_allclose(result["fraction"], points["x"], rtol=0, atol=1e-12)
    np.testing.assert_allclose([result["ci_low"], result["ci_high"]], intervals["x"], rtol=0, atol=1e-12)
    assert result["thresholds"] == pytest.approx(list(taus))


def test_probability_of_improvement_hand_values():
    """Every run of X above every run of Y: 1, and so is every resample; the same scores: one half (ties count
    half); one tie among four pairs: 3.5 / 4."""
    better = probability_of_improvement([5.0, 6.0, 7.0], [1.0, 2.0], reps=200)
    assert better["probability"] == 1.0 and better["ci"] == [1.0, 1.0]
    worse = probability_of_improvement([1.0, 2.0], [5.0, 6.0, 7.0], reps=200)
    assert worse["probability"] == 0.0 and worse["ci"] == [0.0, 0.0]
    assert probability_of_improvement([3.0, 1.0, 2.0], [1.0, 2.0, 3.0], reps=50)["probability"] == 0.5
    assert probability_of_improvement([2.0, 3.0], [2.0, 1.0], reps=50)["probability"] == pytest.approx(3.5 / 4)


def test_performance_profile_hand_values():
    profile = performance_profile(np.arange(1.0, 9.0), [0.0, 4.0, 8.0], reps=300)
    assert profile["fraction"] == [1.0, 0.5, 0.0]  # above each threshold, strictly (rliable's `scores > tau`)
    assert profile["ci_low"][0] == profile["ci_high"][0] == 1.0  # (every resample is above 0)
    assert profile["ci_low"][2] == profile["ci_high"][2] == 0.0
    assert 0.0 < profile["ci_low"][1] < 0.5 < profile["ci_high"][1] < 1.0


def test_comparison_inputs_are_one_sentence():
    with pytest.raises(UserError, match="same tasks .columns.: got 2 and 3"):
        probability_of_improvement(np.zeros((4, 2)), np.zeros((4, 3)))
    with pytest.raises(UserError, match="Scores must be finite"):
        probability_of_improvement([1.0, float("nan")], [1.0, 2.0])
    with pytest.raises(UserError, match="confidence must be in"):
        performance_profile([1.0, 2.0], [1.0], confidence=1.5)
    with pytest.raises(UserError, match=r"reps must be a whole number >= 1, got 2\.5"):  # (a TypeError from range)
        bootstrap_ci([1.0, 2.0], reps=2.5)
    for bad in ([], [float("inf")], "high", [[1.0], [2.0, 3.0]]):
        with pytest.raises(UserError, match="thresholds must be"):
            performance_profile([1.0, 2.0], bad)


def test_a_performance_profile_of_many_thresholds_takes_little_memory():
    """A smooth profile's many thresholds: each replicate's comparisons of every score with every threshold were made
    for all replicates of a chunk sized by the scores alone (32 runs and 501 thresholds took 1 GB at the default
    50,000 replicates); chunks are sized by both, and the interval stays the same numbers."""
    import tracemalloc

    scores = np.random.default_rng(0).normal(size=(32, 1))
    thresholds = np.linspace(-3.0, 3.0, 501)
    tracemalloc.start()
    try:
        profile = performance_profile(scores, thresholds, reps=3000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 40 * 2**20, f"{peak / 2**20:.0f} MiB"  # (most of it the replicates: reps x thresholds floats)
    few = performance_profile(scores, thresholds[::100], reps=3000)
    assert few["ci_low"] == profile["ci_low"][::100] and few["ci_high"] == profile["ci_high"][::100]


def test_iqm_curve_is_rliables_interval_estimate_at_each_step():
    """Learning curves with per-step intervals: at each step, rliable's get_interval_estimates of the runs' scores
    there, the same numbers for the same seed."""
    rly, metrics = _rliable()
    scores = np.random.default_rng(4).normal(size=(9, 5)) * 10 + np.arange(5) * 20  # [runs, steps]
    curves = [[(1000 * (step + 1), scores[run, step]) for step in range(5)] for run in range(9)]
    band = iqm_curve(curves, reps=500, seed=3)
    for step in range(5):
        np.random.seed(3)  # (rliable draws from numpy's global generator; iqm_curve draws each step's from seed 3)
        point, interval = rly.get_interval_estimates({"x": scores[:, step:step + 1]},
                                                     lambda x: np.array([metrics.aggregate_iqm(x)]), reps=500)
        assert band["iqm"][step] == pytest.approx(point["x"][0])
        assert (band["ci_low"][step], band["ci_high"][step]) == pytest.approx(tuple(interval["x"][:, 0]))
    assert band["iqm"][0] == pytest.approx(iqm(scores[:, 0]))


def test_iqm_curve_counts_each_run_with_its_latest_score_until_its_end():
    """Runs evaluated at other steps share one axis: each counts with its latest finite score at or before a step
    (None is no score), not before its first, and not at or after its end (the step it diverged at)."""
    band = iqm_curve([[(100, 1.0), (300, 3.0)], [(200, 2.0), (400, None)], [(100, 9.0), (200, 8.0)]],
                     ends=[None, None, 300], reps=100)
    assert band["steps"] == [100, 200, 300, 400]
    assert band["runs"] == [2, 3, 2, 2]
    assert band["iqm"] == pytest.approx([5.0, iqm([1.0, 2.0, 8.0]), 2.5, 2.5])
    assert all(low <= centre <= high for low, centre, high in zip(band["ci_low"], band["iqm"], band["ci_high"]))
    with pytest.raises(UserError, match="ends needs one entry per curve"):
        iqm_curve([[(1, 1.0)]], ends=[None, None])
