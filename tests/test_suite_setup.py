"""The test suite's own setup (conftest.py): what a session leaves in the temp directory."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TESTS_CACHE_PREFIX, forget_killed_sessions_caches


@pytest.mark.skipif(sys.platform == "win32", reason="no process is known to be gone on Windows (files.process_running)")
def test_a_killed_sessions_cache_directory_is_removed_by_the_next_session(tmp_path):
    """A session's cache directory (XDG_CACHE_HOME: matplotlib's fonts, W&B's logs, SB3's log folder) is removed by
    an exit handler, which a killed session (`timeout`'s SIGTERM) never ran: the next session removes those of
    processes no longer running, and leaves a running session's alone."""
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    killed = tmp_path / f"{TESTS_CACHE_PREFIX}{int(ended.stdout)}-abc123"
    running = tmp_path / f"{TESTS_CACHE_PREFIX}{os.getppid()}-def456"
    for directory in (killed, running):
        (directory / "matplotlib").mkdir(parents=True)
        (directory / "matplotlib" / "fontlist.json").write_text("{}")
    forget_killed_sessions_caches(str(tmp_path))
    assert not killed.exists() and running.exists()


def test_a_passed_tests_tmp_path_is_removed_as_it_ends(pytestconfig):
    """The suite's tmp_path directories (run directories, checkpoints, replay files, videos: about 170 MB for five
    test files) are kept only for failed tests: pytest kept every test's for the last 3 sessions (2.4 GB on the CI
    machine)."""
    assert pytestconfig.getini("tmp_path_retention_policy") == "failed"
    # (the option came with pytest 7.3: under an older one it is an unknown option, and every tmp_path stays)
    tomllib = pytest.importorskip("tomllib")
    with open(Path(__file__).parents[1] / "pyproject.toml", "rb") as handle:
        test_extra = tomllib.load(handle)["project"]["optional-dependencies"]["test"]
    floor = next(requirement for requirement in test_extra if requirement.startswith("pytest>="))
    assert tuple(map(int, floor.removeprefix("pytest>=").split("."))) >= (7, 3)


def test_a_deprecated_call_in_rlspeeds_code_fails_its_test_and_a_tests_own_deprecation_does_not():
    """pyproject.toml's filterwarnings: a DeprecationWarning or FutureWarning attributed to a module of rlspeed (a
    library's deprecated function that rlspeed calls) is an error in the suite; one raised elsewhere (a test's own,
    a library's inside itself) is recorded as before."""
    import warnings

    import rlspeed.algos.base

    for category in (DeprecationWarning, PendingDeprecationWarning, FutureWarning):
        with pytest.raises(category, match="old_call is deprecated"):
            warnings.warn_explicit("old_call is deprecated", category, rlspeed.algos.base.__file__, 1,
                                   module="rlspeed.algos.base")
    with warnings.catch_warnings(record=True) as caught:
        warnings.warn("old_call is deprecated", DeprecationWarning, stacklevel=1)
    assert [str(warning.message) for warning in caught] == ["old_call is deprecated"]


def test_a_run_draws_no_plot_in_a_test_not_marked_plots(tmp_path):
    """A test that is not marked `plots` skips a run's end-of-run plots (matplotlib's drawing: most of a short
    training test's time), the population's included."""
    from rlspeed.logging import RunLogger
    from rlspeed.population.plot import plot_learning_curves

    logger = RunLogger(tmp_path, tensorboard=False)
    logger.log({"timesteps": 100, "episode_return": 1.0})
    logger.close()
    plot_learning_curves({"members": [{"curve": [[100, 1.0]]}]}, tmp_path / "learning_curves.png")
    assert (tmp_path / "metrics.csv").is_file() and not list(tmp_path.glob("*.png"))

