"""Run logging: metrics.csv fills while a run goes on, and grows a column when a new metric appears."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import os
import sys

import pytest
from conftest import endless_pendulum_id, run_in_ascii_locale

from rlspeed import UserError
from rlspeed.logging import RunLogger


def read_rows(path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.plots
def test_metrics_csv_is_written_as_rows_are_logged(tmp_path):
    logger = RunLogger(tmp_path, tensorboard=False)
    logger.log({"timesteps": 100, "sps": 50.0})
    logger.log({"timesteps": 200, "sps": 60.0})
    # readable before close, as a killed run leaves it
    assert read_rows(tmp_path / "metrics.csv") == [{"timesteps": "100", "sps": "50.0"},
                                                   {"timesteps": "200", "sps": "60.0"}]
    logger.log({"timesteps": 300, "sps": 70.0, "eval_mean": -150.5})  # a new column: earlier rows keep it empty
    logger.log({"timesteps": 400, "sps": 80.0})
    expected = [{"timesteps": "100", "sps": "50.0", "eval_mean": ""},
                {"timesteps": "200", "sps": "60.0", "eval_mean": ""},
                {"timesteps": "300", "sps": "70.0", "eval_mean": "-150.5"},
                {"timesteps": "400", "sps": "80.0", "eval_mean": ""}]
    assert read_rows(tmp_path / "metrics.csv") == expected
    logger.close()
    assert read_rows(tmp_path / "metrics.csv") == expected
    assert (tmp_path / "learning_curve.png").exists()


class _Tracked(float):
    """A metric value whose survival a weak reference tells."""


def test_the_logger_keeps_no_row_that_metrics_csv_holds(tmp_path):
    """A row a second is 86,400 a day: rows written to metrics.csv are not also kept in memory (a days-long run grew
    by every row it logged), and a new column or an amended last row still rewrites the file whole."""
    import gc
    import weakref

    logger = RunLogger(tmp_path, tensorboard=False)
    alive = []
    for step in range(1, 201):
        value = _Tracked(step / 2)
        alive.append(weakref.ref(value))
        logger.log({"timesteps": step, "loss": value, **({"eval_mean": 1.5} if step == 150 else {})})
        del value
    logger.amend_last({"custom": 7}, 200)
    gc.collect()
    assert sum(ref() is not None for ref in alive) <= 1  # (the last row, which amend_last changes)
    logger.close()
    rows = read_rows(tmp_path / "metrics.csv")
    assert [float(row["loss"]) for row in rows] == [step / 2 for step in range(1, 201)]
    assert [row["eval_mean"] for row in rows].count("1.5") == 1 and rows[149]["eval_mean"] == "1.5"
    assert rows[-1]["custom"] == "7" and rows[-2]["custom"] == ""
    assert RunLogger(tmp_path, tensorboard=False, continue_from=200).rows[-1] == {"timesteps": 200, "loss": 100.0,
                                                                               "custom": 7}


def test_a_continued_run_keeps_the_rows_before_it(tmp_path):
    """resume / a restart / a further learn() into the same run directory continue metrics.csv: the rows up to
    the step it continues from stay, later ones (logged after the checkpoint it resumed from) go."""
    first = RunLogger(tmp_path, tensorboard=False)
    for step in (100, 200, 300):
        first.log({"timesteps": step, "sps": 50.0 + step, "phase": "a"})
    first.close()
    continued = RunLogger(tmp_path, tensorboard=False, continue_from=200)
    continued.log({"timesteps": 250, "sps": 9.5, "eval_mean": 1.0})
    continued.close()
    rows = read_rows(tmp_path / "metrics.csv")
    assert [r["timesteps"] for r in rows] == ["100", "200", "250"]
    assert rows[0] == {"timesteps": "100", "sps": "150.0", "phase": "a", "eval_mean": ""}



@pytest.mark.parametrize(("cut", "continue_from"), [("in_the_step", 200), ("after_the_step", 300)])
def test_a_continued_run_drops_a_last_line_a_crash_cut_short(tmp_path, cut, continue_from):
    """A power loss can leave metrics.csv's last row cut short (its appended line not yet on disk whole): a resumed run
    drops that line, and the rows it logs follow on lines of their own (a cut step such as '3' of '300' was kept as
    a row at step 3, a row cut after its step was kept without its clock, and the next row was appended to its
    line)."""
    first = RunLogger(tmp_path, tensorboard=False)
    for step in (100, 200, 300):
        first.log({"sps": 50.0 + step, "timesteps": step, "train_wall_s": step / 100})
    first.close()
    text = (tmp_path / "metrics.csv").read_text()
    end = text.rindex("300,") + (1 if cut == "in_the_step" else 4)
    (tmp_path / "metrics.csv").write_text(text[:end], newline="")
    continued = RunLogger(tmp_path, tensorboard=False, continue_from=continue_from)
    continued.log({"sps": 1.0, "timesteps": 356, "train_wall_s": 3.5})
    continued.log({"sps": 2.0, "timesteps": 512, "train_wall_s": 5.0})
    continued.close()
    with open(tmp_path / "metrics.csv", newline="") as handle:
        lines = list(csv.reader(handle))
    assert lines[0] == ["sps", "timesteps", "train_wall_s"]
    assert [line[1] for line in lines[1:]] == ["100", "200", "356", "512"]
    assert all(len(line) == 3 for line in lines)


def test_a_continued_run_drops_rows_whose_cells_do_not_match_the_header(tmp_path):
    """Rows of another width than the header (a cut line an older rlspeed appended to: more cells; a line cut short
    in the middle of the file: fewer) are damaged: a continued run drops them and writes the file whole again, every
    line as wide as the header."""
    (tmp_path / "metrics.csv").write_text("sps,timesteps,train_wall_s\n150.0,100,1.0\n250.0,2,350.0,200,2.0\n"
                                          "350.0,300\n450.0,400,4.0\n", newline="")
    continued = RunLogger(tmp_path, tensorboard=False, continue_from=400)
    continued.log({"sps": 1.0, "timesteps": 512, "train_wall_s": 5.0})
    continued.close()
    with open(tmp_path / "metrics.csv", newline="") as handle:
        lines = list(csv.reader(handle))
    assert lines == [["sps", "timesteps", "train_wall_s"], ["150.0", "100", "1.0"], ["450.0", "400", "4.0"],
                     ["1.0", "512", "5.0"]]


def test_a_run_directory_that_cannot_be_made_is_one_sentence(tmp_path):
    """`learn(run_dir=...)` where the directory cannot be made (a read-only working directory or file system, a file
    in the way) ended in mkdir's OSError traceback (a file in the way: said to hold another run's metrics.csv); a
    read-only directory that exists was one sentence already."""
    from rlspeed import PPO, UserError

    (tmp_path / "file").write_text("")
    run_dir = tmp_path / "file" / "run"
    with pytest.raises(UserError) as refused:
        PPO("CartPole-v1", num_envs=2, num_steps=16, batch_size=32).learn(64, progress_bar=False, run_dir=run_dir)
    assert str(refused.value) == (f"Cannot create the run directory '{run_dir}' (Not a directory); give run_dir a "
                                  "directory you can write to.")


def test_learn_twice_into_one_run_directory_keeps_both_parts(tmp_path):
    from rlspeed import PPO

    model = PPO("CartPole-v1", device="cpu", seed=0, num_envs=4, num_steps=32, batch_size=64)
    model.learn(256, progress_bar=False, run_dir=tmp_path, log_interval_s=0.0)
    model.learn(256, progress_bar=False, run_dir=tmp_path, log_interval_s=0.0)
    rows = read_rows(tmp_path / "metrics.csv")
    steps = [float(r["timesteps"]) for r in rows]
    assert min(steps) <= 256 < max(steps) and steps == sorted(steps)
    clock = [float(r["train_wall_s"]) for r in rows]  # (the second call's rows went back to 0)
    assert clock == sorted(clock) and clock[-1] > model._loop["train_wall_s"]  # (summary.json's: this call's)
    # a saved and loaded model continuing in the same directory goes on too (its rows went back to 0)
    loaded = PPO.load(model.save(tmp_path / "model"))
    loaded.learn(256, progress_bar=False, run_dir=tmp_path, log_interval_s=0.0)
    rows = read_rows(tmp_path / "metrics.csv")
    later = [float(r["train_wall_s"]) for r in rows][len(clock):]
    assert [float(r["train_wall_s"]) for r in rows][:len(clock)] == clock and later and min(later) > clock[-1]


@pytest.mark.plots
def test_the_plot_leaves_matplotlib_s_backend_alone_and_is_drawn_once(tmp_path, monkeypatch):
    """The plot a run saves at its end uses its own Agg canvas, and draws its figure once (savefig drew it twice after
    tight_layout, a third of the plot's time at every run's end)."""
    import matplotlib
    from matplotlib.figure import Figure

    draws = []
    draw = Figure.draw
    monkeypatch.setattr(Figure, "draw", lambda fig, renderer: draws.append(fig) or draw(fig, renderer))
    before = matplotlib.get_backend()
    matplotlib.use("svg")
    try:
        logger = RunLogger(tmp_path, tensorboard=False)
        logger.log({"timesteps": 1, "episode_return": 2.0})
        logger.close()
        assert matplotlib.get_backend() == "svg" and (tmp_path / "learning_curve.png").exists()
    finally:
        matplotlib.use(before)
    assert len(draws) == 1


def test_summary_json_is_strict_json():
    """NaN and infinity (a diverged run's evaluation) are written as null: most JSON parsers refuse NaN."""
    from rlspeed.logging import strict_json

    text = strict_json({"final_eval": {"mean": float("nan"), "std": float("inf"), "episodes": 10},
                        "returns": [1.0, float("-inf")], "sps": 3.5})
    assert json.loads(text, parse_constant=lambda name: pytest.fail(name)) == {
        "final_eval": {"mean": None, "std": None, "episodes": 10}, "returns": [1.0, None], "sps": 3.5}


UTF8_VALUE = {"preset": "预设/我的.yaml", "bytes": "run-\udcff"}
# Each part run under the ASCII locale, as a function of its directory (its lines start with its name).
ASCII_LOCALE_PARTS = {
    "files": ("import json, pathlib, yaml; from rlspeed.files import write_atomic; d = pathlib.Path(where); "
              f"value = {ascii(UTF8_VALUE)}; "
              "write_atomic(d / 'summary.json', json.dumps(value, ensure_ascii=False)); "
              "write_atomic(d / 'config.yaml', yaml.safe_dump(value, allow_unicode=True))"),
    "metrics": ("import pathlib; from rlspeed.logging import RunLogger; d = pathlib.Path(where); "
                "first = RunLogger(d, tensorboard=False); "
                "first.log({'timesteps': 1, '\\u5956\\u52b1/r\\u00e9compense': 1.5}); first.close(); "
                "later = RunLogger(d, tensorboard=False, continue_from=1); "
                "later.log({'timesteps': 2, '\\u5956\\u52b1/r\\u00e9compense': 2.5}); later.close()"),
    "tensorboard": ("import os, pathlib, warnings; from rlspeed.logging import RunLogger\n"
                    "d = pathlib.Path(os.fsdecode(os.fsencode(where) + '/\\u8fd0\\u884c'.encode()))\n"
                    "with warnings.catch_warnings(record=True) as caught:\n"
                    "    warnings.simplefilter('always'); RunLogger(d, tensorboard=True).close(plot=False)\n"
                    "print('tensorboard:', ascii([str(w.message) for w in caught]))"),
}


@pytest.fixture(scope="module")
def ascii_locale(tmp_path_factory):
    """ASCII_LOCALE_PARTS run in one process of an ASCII locale (one interpreter start): each part's directory and
    what it printed (a part that raised prints its traceback: the other parts still run)."""
    root = tmp_path_factory.mktemp("ascii")
    script = "import traceback\n"
    for name, part in ASCII_LOCALE_PARTS.items():
        (root / name).mkdir()
        script += (f"def {name}(where):\n" + "".join(f"    {line}\n" for line in part.splitlines())
                   + f"try:\n    {name}({ascii(str(root / name))})\n"
                   f"except BaseException:\n    print({name!r} + ' raised:', ascii(traceback.format_exc()))\n")
    said = run_in_ascii_locale(script).splitlines()
    return lambda name: (root / name, "\n".join(line for line in said if line.startswith(name)))


def test_run_files_are_utf8_whatever_the_locale_and_a_non_utf8_name_round_trips(ascii_locale):
    """config.yaml and summary.json are UTF-8 under an ASCII locale too (LC_ALL=C without Python's UTF-8 mode: a
    Chinese value was a UnicodeEncodeError there), and a file name that was not UTF-8 (a lone surrogate) comes back
    from the JSON as the same string."""
    import yaml

    where, said = ascii_locale("files")
    assert said == ""
    assert "预设/我的.yaml" in (where / "config.yaml").read_text(encoding="utf-8")
    assert json.loads((where / "summary.json").read_text(encoding="utf-8")) == UTF8_VALUE
    assert yaml.safe_load((where / "config.yaml").read_text(encoding="utf-8")) == UTF8_VALUE


def test_metrics_csv_with_a_non_ascii_column_is_read_and_appended_as_utf8_whatever_the_locale(ascii_locale):
    """A callback's `logger.record("custom/récompense", ...)`: under an ASCII locale the second learn (or a --resume)
    failed with UnicodeDecodeError reading metrics.csv back, and the rows it appended were in the locale's encoding."""
    where, said = ascii_locale("metrics")
    assert said == ""
    with open(where / "metrics.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["奖励/récompense"] for row in rows] == ["1.5", "2.5"]


def test_tensorboards_warning_under_an_ascii_locale_says_how_to_write_there(ascii_locale):
    """A run directory of a UTF-8 non-ASCII name under LC_ALL=C without UTF-8 mode: TensorBoard cannot write there,
    and the warning said the name was not UTF-8 (it is); it says how to run Python so that it can."""
    pytest.importorskip("tensorboard")
    _, said = ascii_locale("tensorboard")
    assert "TensorBoard cannot write" in said and "PYTHONUTF8=1" in said and "not UTF-8" not in said


@pytest.mark.skipif(os.name == "nt", reason="symlinks")
def test_a_continued_run_neither_reads_nor_writes_through_a_metrics_csv_symlink(tmp_path):
    """A run directory from elsewhere whose metrics.csv was a symlink to a file of the user's: `--resume` appended
    its rows to that file; later the link was replaced, but the file it pointed at was still read as the run's rows
    (and copied into the run's own metrics.csv). Now continuing there is refused in one sentence, and nothing is read
    or written through the link."""
    theirs = tmp_path / "theirs.csv"
    theirs.write_text("timesteps,loss\n1,0.5\n", encoding="utf-8")
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.csv").symlink_to(theirs)
    with pytest.raises(UserError, match=r"metrics.csv' is a symlink, which rlspeed neither reads nor writes through"):
        RunLogger(run, tensorboard=False, continue_from=1)
    assert theirs.read_text(encoding="utf-8") == "timesteps,loss\n1,0.5\n" and (run / "metrics.csv").is_symlink()


@pytest.mark.skipif(os.name == "nt", reason="symlinks")
@pytest.mark.parametrize("continue_from", [None, 1])
def test_tensorboard_events_are_never_written_through_a_symlinked_directory(tmp_path, continue_from):
    """A run directory from elsewhere whose tensorboard/ was a symlink to another directory (another run's events): the
    run's events files went into it. Now it is refused in one sentence before anything is written there."""
    pytest.importorskip("tensorboard")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    run = tmp_path / "run"
    run.mkdir()
    (run / "tensorboard").symlink_to(theirs, target_is_directory=True)
    with pytest.raises(UserError, match=r"tensorboard' is a symlink, which rlspeed neither reads nor writes through"):
        RunLogger(run, tensorboard=True, continue_from=continue_from)
    assert list(theirs.iterdir()) == []


def test_no_episode_is_an_empty_cell_and_a_diverged_loss_is_nan(tmp_path):
    """An interval in which no episode finished has no episode_return (empty); a loss that diverged is written as
    nan or inf, not an empty cell that looks like "no update in this row"."""
    logger = RunLogger(tmp_path, tensorboard=False)
    logger.log({"timesteps": 1, "episode_return": float("nan"), "loss": float("inf"), "policy_loss": float("nan")})
    logger.log({"timesteps": 2, "episode_return": 5.0, "loss": 0.5})
    logger.close()
    with open(tmp_path / "metrics.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert rows[0]["episode_return"] == "" and rows[0]["loss"] == "inf" and rows[0]["policy_loss"] == "nan"
    assert rows[1]["episode_return"] == "5.0" and rows[1]["policy_loss"] == ""
    continued = RunLogger(tmp_path, tensorboard=False, continue_from=2)
    assert continued.rows[1] == {"timesteps": 2, "episode_return": 5.0, "loss": 0.5}
    assert continued.rows[0]["loss"] == float("inf") and math.isnan(continued.rows[0]["policy_loss"])
    assert "episode_return" not in continued.rows[0]


@pytest.fixture
def recorded_bars(monkeypatch) -> list:
    """The progress bars learn makes, in order (each still holds its counts after learn closed it)."""
    from rlspeed.algos import base

    bars = []

    class Recording(base.ProgressBar):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            bars.append(self)

    monkeypatch.setattr(base, "ProgressBar", Recording)
    return bars


def test_the_progress_bar_counts_the_steps_learn_runs(recorded_bars):
    """learn runs whole iterations: a budget below one iteration (100 steps, 16 x 64 per iteration) trains one, and
    the bar's total is the 1,024 steps it trains, not the 100 asked for."""
    from rlspeed import PPO

    bars = recorded_bars
    model = PPO("CartPole-v1", device="cpu", env_backend="torch", num_envs=16, num_steps=64, batch_size=256)
    model.learn(100, progress_bar=True)
    assert model.num_timesteps == 1024 and bars[0].bar.total == 1024 and bars[0].bar.n == 1024
    model.learn(2000, progress_bar=True)  # (a second call: two more iterations, from where the first ended)
    assert model.num_timesteps == 3072 and bars[1].bar.total == 2048 and bars[1].bar.n == 2048


def test_an_interrupted_learns_progress_bar_shows_the_steps_it_trained(recorded_bars):
    """A notebook's stop button (KeyboardInterrupt) or an error in a callback ended learn with its bar at the last
    metrics row (up to a second before: 0 of 100k steps, drawn red, after 1,024 trained). Now the bar it leaves on
    screen counts every step the model trained."""
    from rlspeed import PPO
    from rlspeed.callbacks import BaseCallback

    class Stop(BaseCallback):
        def _on_step(self):
            if self.num_timesteps >= 2048:
                raise KeyboardInterrupt

    bars = recorded_bars
    model = PPO("CartPole-v1", device="cpu", env_backend="torch", num_envs=16, num_steps=64, batch_size=256)
    with pytest.raises(KeyboardInterrupt):
        model.learn(100_000, progress_bar=True, callback=Stop(), log_interval_s=1000)
    assert model.num_timesteps == 2048 and bars[0].bar.n == 2048


def test_a_resumed_runs_progress_bar_counts_the_whole_run(recorded_bars, tmp_path):
    """After resume(checkpoint) the bar (and a batch job's status lines) count the run from its start, as
    metrics.csv does: 1,024 steps of the interrupted run, then the 1,024 this call trains, out of 2,048."""
    from rlspeed import PPO

    bars = recorded_bars
    options = {"device": "cpu", "env_backend": "torch", "num_envs": 16, "num_steps": 64, "batch_size": 256}
    first = PPO("CartPole-v1", **options)
    first.learn(1024, progress_bar=False)
    path = first.save(tmp_path / "checkpoint")
    resumed = PPO("CartPole-v1", **options)
    resumed.resume(path)
    resumed.learn(1024, progress_bar=True)
    assert (bars[-1].bar.total, bars[-1].bar.n, bars[-1].bar.initial) == (2048, 2048, 1024)


def test_an_untrained_model_refuses_a_run_dir_with_another_runs_metrics(tmp_path):
    """learn(run_dir=DIR) on a fresh model where DIR holds metrics.csv: one sentence, the file kept (it was replaced
    by the new run's rows); the model that wrote it continues the file."""
    from rlspeed import PPO, UserError

    first = PPO("CartPole-v1", seed=0, num_envs=4, num_steps=32)
    first.learn(256, progress_bar=False, run_dir=tmp_path, log_interval_s=0.0)
    rows = (tmp_path / "metrics.csv").read_text()
    with pytest.raises(UserError, match="holds the metrics.csv of another run"):
        PPO("CartPole-v1", seed=1, num_envs=4, num_steps=32).learn(256, progress_bar=False, run_dir=tmp_path)
    assert (tmp_path / "metrics.csv").read_text() == rows
    first.learn(256, progress_bar=False, run_dir=tmp_path, log_interval_s=0.0)
    assert (tmp_path / "metrics.csv").read_text().startswith(rows)


def test_a_run_dir_a_learn_left_without_rows_takes_a_new_model(tmp_path):
    """A learn call that an error (a bug in the user's callback or env) or the stop button ended before its first
    metrics row left an empty metrics.csv, and running the cell again (a new model, the same run_dir) was refused as
    "the metrics.csv of another run". Now a file without rows is no run's: the new model trains there; a file with
    rows is still refused, a population's learn as a solo model's."""
    from rlspeed import PPO, UserError
    from rlspeed.population import Population

    def bug(_locals):
        raise ValueError("a bug in the callback")

    options = {"seed": 0, "num_envs": 4, "num_steps": 32, "batch_size": 64}
    with pytest.raises(ValueError, match="a bug in the callback"):
        # (no row by time: a first iteration slower than the default second, on a loaded machine, wrote one first)
        PPO("CartPole-v1", **options).learn(100_000, progress_bar=False, run_dir=tmp_path / "a", callback=bug,
                                            log_interval_s=3600)
    assert (tmp_path / "a" / "metrics.csv").read_text().strip() == ""  # (no header either: no row gave its keys)
    model = PPO("CartPole-v1", **options).learn(256, progress_bar=False, run_dir=tmp_path / "a", log_interval_s=0.0)
    assert model.num_timesteps == 256 and len((tmp_path / "a" / "metrics.csv").read_text().splitlines()) > 1
    with pytest.raises(UserError, match="holds the metrics.csv of another run"):
        PPO("CartPole-v1", **options).learn(256, progress_bar=False, run_dir=tmp_path / "a")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "metrics.csv").write_text("timesteps,train_wall_s\n")  # (a header, no row)
    population = Population(PPO, "CartPole-v1", seeds=[0, 1], num_envs=4, num_steps=32, batch_size=64)
    population.learn(128, progress_bar=False, run_dir=tmp_path / "b")
    with pytest.raises(UserError, match="holds the metrics.csv of another run"):
        Population(PPO, "CartPole-v1", seeds=[2], num_envs=4, num_steps=32, batch_size=64).learn(
            128, progress_bar=False, run_dir=tmp_path / "b")


def test_a_model_back_in_a_run_dir_it_left_is_told_its_rows_there_would_lack_the_steps_since(tmp_path):
    """A model (or population) that trained in run_dir a, then b, and returns to a was refused with "holds the
    metrics.csv of another run ... (trained in another run)", which its own run wrote: the refusal says whose rows
    they are, where they end, and where it trained since; the file is kept."""
    from rlspeed import PPO, UserError
    from rlspeed.population import Population

    model = PPO("CartPole-v1", seed=0, num_envs=4, num_steps=32, batch_size=64)
    model.learn(128, progress_bar=False, run_dir=tmp_path / "a", log_interval_s=0.0)
    model.learn(128, progress_bar=False, run_dir=tmp_path / "b", log_interval_s=0.0)
    rows = (tmp_path / "a" / "metrics.csv").read_text()
    with pytest.raises(UserError, match=r"^'.*a' holds the metrics.csv of this model's run up to step 128; it has "
                                        r"trained on to step 256 in '.*b' since, whose steps that file would lack: go "
                                        r"on in '.*b', or give another run_dir\.$"):
        model.learn(128, progress_bar=False, run_dir=tmp_path / "a")
    assert (tmp_path / "a" / "metrics.csv").read_text() == rows
    population = Population(PPO, "CartPole-v1", seeds=[0, 1], num_envs=4, num_steps=32, batch_size=64)
    population.learn(128, progress_bar=False, run_dir=tmp_path / "c")
    population.learn(128, progress_bar=False, run_dir=tmp_path / "d")
    with pytest.raises(UserError, match=r"holds the metrics.csv of this population's run up to step 128; it has "
                                        r"trained on to step 256 in '.*d' since"):
        population.learn(128, progress_bar=False, run_dir=tmp_path / "c")


def test_a_population_that_trained_without_a_run_dir_refuses_another_runs_metrics(tmp_path):
    """A population that trained without a run_dir appended its rows to another run's metrics.csv given later (its
    seeds' columns beside the other's), where a model refuses it; a population resumed from its run's checkpoint
    still continues that run's file."""
    from rlspeed import PPO, UserError
    from rlspeed.population import Population

    options = {"num_envs": 4, "num_steps": 32, "batch_size": 64}
    first = Population(PPO, "CartPole-v1", seeds=[0, 1], **options)
    first.learn(128, progress_bar=False, run_dir=tmp_path / "a")
    first.save(tmp_path / "a" / "checkpoint.safetensors")
    rows = (tmp_path / "a" / "metrics.csv").read_text()
    elsewhere = Population(PPO, "CartPole-v1", seeds=[5, 6], **options)
    elsewhere.learn(128, progress_bar=False)
    with pytest.raises(UserError, match=r"holds the metrics.csv of another run, which this population \(trained in "
                                        r"another run\)"):
        elsewhere.learn(128, progress_bar=False, run_dir=tmp_path / "a")
    assert (tmp_path / "a" / "metrics.csv").read_text() == rows
    resumed = Population(PPO, "CartPole-v1", seeds=[0, 1], **options)
    resumed.resume(tmp_path / "a" / "checkpoint.safetensors")
    resumed.learn(128, progress_bar=False, run_dir=tmp_path / "a")
    assert (tmp_path / "a" / "metrics.csv").read_text().startswith(rows)


def _tensorboard_writers() -> int:
    """TensorBoard's writer threads running (a model that trained into a run directory keeps one until its `close`
    or its collection: a test counting them collects earlier tests' models first)."""
    import threading

    return sum(type(thread).__module__.startswith("tensorboard.") for thread in threading.enumerate())


def test_a_learn_whose_env_cannot_reset_leaves_no_tensorboard_writer_running(tmp_path):
    """learn(run_dir=...) on an env whose reset raises (a notebook cell run again and again while its env is being
    fixed) left the run's TensorBoard writer open, one more background thread per call. Now the call closes it."""
    pytest.importorskip("tensorboard")
    import gc

    import gymnasium as gym

    from rlspeed import PPO
    from rlspeed.errors import EnvStepError

    class Broken(gym.Env):
        observation_space = gym.spaces.Box(-1, 1, (4,))
        action_space = gym.spaces.Discrete(2)

        def reset(self, seed=None, options=None):
            raise RuntimeError("reset is broken")

    if "BrokenReset-v0" not in gym.registry:
        gym.register("BrokenReset-v0", entry_point=Broken)
    gc.collect()  # (a model of an earlier test waiting for collection closes its writer now, not in the middle)
    before = _tensorboard_writers()
    for attempt in range(2):
        with pytest.raises(EnvStepError, match="reset is broken"):
            PPO("BrokenReset-v0", device="cpu", num_envs=2, num_steps=16, batch_size=32).learn(
                64, progress_bar=False, run_dir=tmp_path / str(attempt))
    assert _tensorboard_writers() == before


def test_a_trained_model_continues_only_its_own_run_directory(tmp_path):
    """A model that trained elsewhere (or without a run_dir) is refused a run_dir holding another run's
    metrics.csv, as an untrained one is; a model loaded from a run directory continues that run's file."""
    from rlspeed import PPO, UserError

    first = PPO("CartPole-v1", seed=0, num_envs=4, num_steps=32)
    first.learn(256, progress_bar=False, run_dir=tmp_path / "a", log_interval_s=0.0)
    first.save(tmp_path / "a" / "model.safetensors")
    rows = (tmp_path / "a" / "metrics.csv").read_text()
    other = PPO("CartPole-v1", seed=1, num_envs=4, num_steps=32)
    other.learn(128, progress_bar=False)
    with pytest.raises(UserError, match=r"another run, which this model \(trained in another run\)"):
        other.learn(256, progress_bar=False, run_dir=tmp_path / "a")
    other.learn(128, progress_bar=False, run_dir=tmp_path / "b")
    with pytest.raises(UserError, match="holds the metrics.csv of another run"):
        other.learn(128, progress_bar=False, run_dir=tmp_path / "a")
    assert (tmp_path / "a" / "metrics.csv").read_text() == rows
    loaded = PPO.load(tmp_path / "a" / "model.safetensors")
    loaded.learn(128, progress_bar=False, run_dir=tmp_path / "a", log_interval_s=0.0)
    assert (tmp_path / "a" / "metrics.csv").read_text().startswith(rows)


def test_a_short_learn_writes_at_least_fifty_rows_by_default(tmp_path):
    """The default log interval (one second) would leave a run of a second or two with a two-point curve: by default
    a call of 50 or more iterations also writes at least 50 rows; an explicit log_interval_s is the only rule."""
    from rlspeed import PPO

    small = {"num_envs": 4, "num_steps": 16, "batch_size": 64, "n_epochs": 1}  # 64 steps per iteration
    model = PPO("CartPole-v1", seed=0, **small)
    model.learn(64 * 60, progress_bar=False, run_dir=tmp_path / "default")
    assert len(read_rows(tmp_path / "default" / "metrics.csv")) >= 50
    model = PPO("CartPole-v1", seed=0, **small)
    model.learn(64 * 60, progress_bar=False, run_dir=tmp_path / "explicit", log_interval_s=1e9)
    assert len(read_rows(tmp_path / "explicit" / "metrics.csv")) == 1  # (the run's end)


def test_a_stop_between_log_points_still_writes_the_steps_since_the_last_row(tmp_path):
    """A callback (or a signal, through stop_requested) that stops training between two rows: metrics.csv ends at
    the step training stopped at, and the model's result counts those steps."""
    from rlspeed import PPO

    model = PPO("CartPole-v1", seed=0, num_envs=4, num_steps=32)
    calls = []
    model.learn(128 * 10, progress_bar=False, run_dir=tmp_path, log_interval_s=1e9,
                callback=lambda local: calls.append(1) or len(calls) < 3)
    rows = read_rows(tmp_path / "metrics.csv")
    assert model.num_timesteps == 3 * 128 == int(rows[-1]["timesteps"]) == model.result.total_timesteps
    assert rows[-1]["episode_return"] != ""  # (the iterations' metrics, not an empty row)


def test_an_interrupted_learn_leaves_its_result_and_loop_position(tmp_path):
    """KeyboardInterrupt inside learn (Ctrl-C in a notebook): the exception reaches the caller, and model.result
    still says how many steps were trained in how long (the next learn continues from there)."""
    from rlspeed import PPO

    model = PPO("CartPole-v1", seed=0, num_envs=4, num_steps=32)

    def interrupt(local):
        if model.num_timesteps >= 256:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        model.learn(128 * 10, progress_bar=False, callback=interrupt)
    assert model.result.total_timesteps == model.num_timesteps == 256
    assert model.result.train_wall_s > 0 and model.result.sps > 0
    assert model._loop["train_wall_s"] == pytest.approx(model.result.train_wall_s)


def test_a_ctrl_c_during_an_evaluation_keeps_the_metrics_row_of_the_steps_before_it(tmp_path, monkeypatch):
    """Ctrl-C while learn evaluates: the steps trained since the last row (in num_timesteps and the checkpoint) keep
    their row in metrics.csv, without the evaluation's columns (the first evaluation left an empty file)."""
    import csv

    from rlspeed import PPO

    model = PPO("CartPole-v1", device="cpu", seed=0, num_envs=4, num_steps=32, batch_size=64, n_epochs=1)

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(model, "evaluate", ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        model.learn(128 * 4, progress_bar=False, run_dir=tmp_path, eval_freq=256, log_interval_s=1e9)
    rows = list(csv.DictReader((tmp_path / "metrics.csv").open()))
    assert [int(row["timesteps"]) for row in rows] == [model.num_timesteps] == [256]
    assert not rows[0].get("eval_mean")


def test_eval_freq_without_a_target_evaluates_and_the_header_has_the_column_from_the_start(tmp_path):
    """learn(eval_freq=N) without a target: an evaluation every N steps (an evaluation curve), nothing stops; the
    evaluation columns are in metrics.csv's header from its first row, so a reader following the file sees one
    header."""
    from rlspeed import PPO

    model = PPO("CartPole-v1", seed=0, num_envs=4, num_steps=32)
    model.learn(128 * 6, progress_bar=False, run_dir=tmp_path, eval_freq=256, eval_episodes=2, log_interval_s=0.0)
    assert [steps for steps, _clock, _mean in model.result.evaluations] == [256, 512, 768]
    assert model.num_timesteps == 768 and model.result.steps_to_target is None
    lines = (tmp_path / "metrics.csv").read_text().splitlines()
    assert lines[0].split(",").count("eval_mean") == 1 and len(lines) == 7
    # a first row that has an evaluation: each column once
    model = PPO("CartPole-v1", seed=0, num_envs=4, num_steps=32)
    model.learn(128 * 2, progress_bar=False, run_dir=tmp_path / "first", target_return=1e9, eval_freq=128,
                eval_episodes=2, log_interval_s=0.0)
    header = (tmp_path / "first" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert len(header) == len(set(header)) and {"eval_mean", "eval_confirm_mean"} <= set(header)
    model = PPO("CartPole-v1", seed=0, num_envs=4, num_steps=32)
    model.learn(128 * 2, progress_bar=False)
    assert model.result.evaluations == []  # (no target, no eval_freq: no evaluations)


def test_declared_columns_keep_their_order_where_the_first_row_lacks_one(tmp_path):
    """A population's metrics.csv declares a column per member in seed order; a member that diverged before the first
    evaluation has no value in the first row, and its column came last (seed_0, seed_2, seed_3, seed_1): a script
    reading the members' columns by position read another member's curve."""
    columns = ("members", "eval_mean/seed_0", "eval_mean/seed_1", "eval_mean/seed_2", "eval_mean/seed_3")
    logger = RunLogger(tmp_path, columns=columns, plot=False)
    logger.log({"timesteps": 512, "train_wall_s": 0.1, "sps": 100.0, "members": 3, "eval_mean/seed_0": 47.9,
                "eval_mean/seed_2": 9.6, "eval_mean/seed_3": 45.0})
    logger.close()
    with open(tmp_path / "metrics.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle))
    assert rows[0] == ["timesteps", "train_wall_s", "sps", *columns]
    assert rows[1][3:] == ["3", "47.9", "", "9.6", "45.0"]


def test_the_progress_bar_writes_status_lines_where_stderr_is_not_a_terminal(monkeypatch, capsys):
    """Where stderr is not a terminal (nohup, a batch job) a status line is written every LINE_INTERVAL_S seconds
    (never a redrawn bar, which piles up as one line), and a last one at the end where it shows more; a short run
    writes none."""
    from rlspeed import logging as run_logging
    from rlspeed.logging import ProgressBar

    monkeypatch.setattr(run_logging, "_is_terminal", lambda stream: False)  # (also when run with pytest -s)
    monkeypatch.setattr(ProgressBar, "LINE_INTERVAL_S", 0.0)
    bar = ProgressBar(1000, desc="ppo CartPole-v1")
    assert bar.lines
    bar.update(100, sps=1000, ret=None)
    bar.update(150, sps=1234, ret=20.5)
    bar.update(750, sps=1500, ret=float("nan"))
    bar.close()
    lines = capsys.readouterr().err.splitlines()
    # (as the bar: no return before an episode ends, then the last one until others end: episodes of 100,000 steps
    # end in few rows, and their return showed in one line only)
    assert lines == ["ppo CartPole-v1: 100/1,000 steps (10%), sps 1000",
                     "ppo CartPole-v1: 250/1,000 steps (25%), sps 1234, ret 20.5",
                     "ppo CartPole-v1: 1,000/1,000 steps (100%), sps 1500, ret 20.5"]
    assert "\r" not in "".join(lines)
    monkeypatch.setattr(ProgressBar, "LINE_INTERVAL_S", 3600.0)
    quick = ProgressBar(1000, desc="quick")
    quick.update(1000, sps=10)
    quick.close()
    assert capsys.readouterr().err == "" and quick.bar.n == 1000


def test_a_progress_bar_leaves_no_thread_and_the_start_method_unset(monkeypatch):
    """learn's bar (shown by default) left tqdm's monitor thread running and made tqdm's multiprocessing lock, which
    fixes the process's start method: a notebook's later `multiprocessing.set_start_method("spawn")` raised "context
    has already been set". Now no thread and no multiprocessing lock, as in a process that tqdm never drew in."""
    import multiprocessing
    import threading

    from tqdm.std import TqdmDefaultWriteLock, tqdm

    from rlspeed.logging import ProgressBar

    # (a process where no tqdm bar was made yet: no lock, no monitor; a multiprocessing lock made is recorded)
    monkeypatch.delattr(TqdmDefaultWriteLock, "mp_lock", raising=False)
    monkeypatch.delattr(tqdm, "_lock", raising=False)
    monkeypatch.setattr(tqdm, "monitor", None)
    made = []
    monkeypatch.setattr(multiprocessing, "RLock", lambda *args, **kwargs: made.append(1) or threading.RLock())
    before = set(threading.enumerate())
    bar = ProgressBar(1000, desc="ppo CartPole-v1")
    bar.update(1000, sps=10)
    bar.close()
    started = set(threading.enumerate()) - before
    for thread in started:
        thread.exit()  # (tqdm's monitor, which the bar started)
    assert not started and not made


def test_a_drawn_bar_keeps_its_elapsed_time_moving_between_episodes(monkeypatch):
    """After its first finished episode an evaluation's bar was not redrawn until the next (tqdm waits for as many
    steps again as the last redraw took): an Atari game's minutes showed one frozen elapsed time, as if hung."""
    import io
    import time
    import types

    from rlspeed import logging as run_logging
    from rlspeed.logging import ProgressBar

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(run_logging, "_is_terminal", lambda stream: True)
    # (the bar's clock runs ahead of tqdm's: 0.5 s a step on it, while tqdm sees no time pass and redraws nothing)
    ahead = [0.0]
    monkeypatch.setattr(run_logging, "time", types.SimpleNamespace(time=lambda: time.time() + ahead[0],
                                                                    monotonic=time.monotonic))
    bar = ProgressBar(4, desc="evaluate X", unit="episode")
    bar.update(0)
    bar.update(1)  # (the first episode ends)
    drawn = terminal.getvalue().count("\r")
    for _ in range(12):  # (the next episode's steps, 6 s on the bar's clock: no episode finishes)
        ahead[0] += 0.5
        bar.update(0)
    assert terminal.getvalue().count("\r") - drawn >= 4
    bar.close()


@pytest.mark.parametrize("backend", ["torch", "gymnasium"])
def test_evaluate_shows_a_bar_over_the_episodes_it_finished(monkeypatch, capsys, backend):
    """A long evaluation (Atari games, many episodes; `rlspeed eval`, a run's final one) wrote nothing until its
    result; with progress_bar=True a bar counts the finished episodes (status lines where stderr is no terminal), and
    the result is the one without the bar."""
    from rlspeed import PPO
    from rlspeed import logging as run_logging
    from rlspeed.logging import ProgressBar

    monkeypatch.setattr(run_logging, "_is_terminal", lambda stream: False)
    monkeypatch.setattr(ProgressBar, "LINE_INTERVAL_S", 0.0)
    model = PPO("CartPole-v1", seed=0, device="cpu", env_backend=backend, num_envs=4, num_steps=16)
    quiet = model.evaluate(episodes=6, seed=3)
    assert capsys.readouterr().err == ""
    shown = model.evaluate(episodes=6, seed=3, progress_bar=True)
    assert shown == quiet
    lines = capsys.readouterr().err.splitlines()
    counts = [int(line.split(": ")[1].split("/")[0]) for line in lines]
    assert lines and all(line.startswith("evaluate CartPole-v1: ") and "/6 episodes" in line for line in lines)
    assert counts == sorted(counts) and counts[-1] == 6


def test_evaluates_bar_shows_the_steps_toward_its_limit_while_no_episode_ends(monkeypatch, capsys):
    """An env whose episodes never end (or end late, after 100,000 steps): the bar sat at 0/2 episodes until the
    evaluation's step limit, as if hung; it shows the steps run toward the limit."""
    from rlspeed import PPO, evaluation
    from rlspeed import logging as run_logging
    from rlspeed.logging import ProgressBar

    env_id = endless_pendulum_id()
    monkeypatch.setattr(run_logging, "_is_terminal", lambda stream: False)
    monkeypatch.setattr(ProgressBar, "LINE_INTERVAL_S", 0.0)
    monkeypatch.setattr(evaluation, "UNLIMITED_EPISODE_STEPS", 40)  # (10,000 steps: the same, slower)
    model = PPO(env_id, seed=0, device="cpu", num_envs=2, num_steps=16)
    with pytest.warns(UserWarning, match="2 of 2 episodes were still running after 40 steps"):
        model.evaluate(episodes=2, seed=0, progress_bar=True)
    lines = capsys.readouterr().err.splitlines()
    assert f"evaluate {env_id}: 0/2 episodes (0%), step 20/40" in lines
    assert lines[-1].endswith("step 40/40")


def test_evaluates_bar_ends_at_the_episodes_it_finished_on_device_native_envs(monkeypatch):
    """Device-native envs are checked for finished episodes every 64 steps only: Pendulum's episodes, all ending at
    step 200 (between two checks), left the bar at 0/4 above a result of 4 finished episodes."""
    from rlspeed import PPO, evaluation
    from rlspeed.logging import ProgressBar

    shown = []

    class Recording(ProgressBar):
        def close(self) -> None:
            shown.append(self.bar.n)
            super().close()

    monkeypatch.setattr(evaluation, "ProgressBar", Recording)
    model = PPO("Pendulum-v1", seed=0, device="cpu", env_backend="torch", num_envs=2, num_steps=128)
    result = model.evaluate(episodes=4, seed=1, progress_bar=True)
    assert result["lengths"] == [200] * 4 and result["unfinished"] == 0
    assert shown == [4]


def test_a_bar_of_fewer_than_a_thousand_counts_whole_numbers(monkeypatch, capsys):
    """The bar (a terminal's, or a notebook's without ipywidgets) showed an evaluation of 20 episodes as
    "8.00/20.0 [..., 79.8episode/s]" (tqdm's scaled units); below a thousand it now counts 8/20, and from a thousand
    on it still abbreviates (4.10k)."""
    from rlspeed import logging as run_logging
    from rlspeed.logging import ProgressBar

    monkeypatch.setattr(run_logging, "_is_terminal", lambda stream: True)  # (a redrawn bar on stderr)
    bar = ProgressBar(20, desc="evaluate CartPole-v1", unit="episode")
    bar.update(8)
    bar.bar.refresh()
    bar.update(12)
    bar.close()
    shown = capsys.readouterr().err
    assert " 8/20 [" in shown and " 20/20 [" in shown and "8.00" not in shown and "20.0" not in shown
    bar = ProgressBar(4096, desc="ppo CartPole-v1")
    bar.update(4096)
    bar.close()
    assert "4.10k/4.10k" in capsys.readouterr().err


def test_the_bar_on_an_80_column_terminal_shows_the_returns(monkeypatch, capsys):
    """tqdm cuts a line wider than the terminal at its end, where its layout put the postfix: at 80 columns the
    training bar read "... [00:00<00:00, 7.09kstep/s, sps=10250, ret=" and never showed a return or an evaluation.
    The postfix now comes before the times, which are what a narrow terminal loses."""
    from rlspeed import logging as run_logging
    from rlspeed.logging import ProgressBar

    monkeypatch.setattr(run_logging, "_is_terminal", lambda stream: True)  # (a redrawn bar on stderr)
    bar = ProgressBar(4096, desc="ppo CartPole-v1")
    bar.update(1024, sps=10250, ret=21.7, eval=58.1)
    line = bar.bar.format_meter(**{**bar.bar.format_dict, "ncols": 80})
    bar.close()
    capsys.readouterr()
    assert len(line) <= 80 and "1.02k/4.10k, sps=10250, ret=21.7, eval=58.1 [00:" in line
    wide = bar.bar.format_meter(**{**bar.bar.format_dict, "ncols": 200})
    assert "eval=58.1 [" in wide and wide.endswith("step/s]")  # (a wide terminal shows the times too)


def test_a_full_disk_while_logging_is_one_sentence_and_close_only_lets_go(tmp_path, capsys, monkeypatch):
    """A metrics.csv write that fails (a full disk) is one UserError naming the file and the reason, close() after it
    raises nothing, and the CLI exits 2."""
    import errno

    from rlspeed import UserError, cli
    from rlspeed.logging import RunLogger

    class FullDisk:
        def __init__(self, *args, **kwargs):
            pass

        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

        flush = close = lambda self: None

    logger = RunLogger(tmp_path / "run", tensorboard=False)
    logger.log({"timesteps": 1, "episode_return": 1.0})
    logger._csv = (FullDisk(), __import__("csv").DictWriter(FullDisk(), fieldnames=logger._fields))
    with pytest.raises(UserError, match=r"Cannot write .*metrics.csv.* \(No space left on device\)"):
        logger.log({"timesteps": 2, "episode_return": 2.0})
    logger.close()  # (nothing raised, no plot attempted)
    assert not (tmp_path / "run" / "learning_curve.png").exists()

    from rlspeed import logging as run_logging

    def full_disk_write(path, text):  # (metrics.csv is written whole, then renamed into place)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(run_logging, "write_atomic", full_disk_write)
    monkeypatch.chdir(tmp_path)
    code = cli.main(["train", "ppo", "CartPole-v1", "--total-timesteps", "4096", "--target-return", "none",
                     "--out", "cli", "--no-progress", "--set", "num_envs=4", "--set", "num_steps=64",
                     "--set", "batch_size=64"])
    err = capsys.readouterr().err
    assert code == 2 and "No space left on device" in err and "Traceback" not in err


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="needs tensorboard")
@pytest.mark.parametrize("when", ["start", "row", "row-bytes-name"])
def test_tensorboard_that_cannot_write_is_one_sentence_naming_its_files(tmp_path, capsys, monkeypatch, when):
    """TensorBoard writes its events in a thread of its own: on a full disk that thread printed a traceback, its error
    then reached training at the next row named as metrics.csv (the error names no file) or as `'b'/path''` (a bytes
    name: a directory gone or made read-only), and one at the last row was never said; at the start (its first event
    is written at once) it was a bare OSError. Each is one sentence naming TensorBoard's file."""
    import errno

    from tensorboard.compat.tensorflow_stub.io import gfile

    from rlspeed import UserError

    events = tmp_path / "run" / "tensorboard" / "events.out.tfevents.x"

    def full(self, path, content, mode):
        raise OSError(errno.ENOSPC, "No space left on device", *([os.fsencode(events)] if "name" in when else []))

    where = events if "name" in when else tmp_path / "run" / "tensorboard"
    if when == "start":
        monkeypatch.setattr(gfile.LocalFileSystem, "_write", full)
        with pytest.raises(UserError) as raised:
            RunLogger(tmp_path / "run", tensorboard=True)
        assert str(raised.value) == f"Cannot write '{where}' (No space left on device)."
    else:
        logger = RunLogger(tmp_path / "run", tensorboard=True)
        monkeypatch.setattr(gfile.LocalFileSystem, "_write", full)
        logger.log({"timesteps": 1, "episode_return": 1.0})
        with pytest.raises(UserError) as raised:
            logger.close()
        assert str(raised.value) == (f"Cannot write '{where}' (No space left on device): the run's metrics and plot "
                                     "are incomplete.")
    assert "Traceback" not in capsys.readouterr().err


def test_metrics_csv_is_replaced_whole_so_a_kill_in_its_rewrite_keeps_the_old_rows(tmp_path, monkeypatch):
    """A resume (or a new column) rewrites metrics.csv: it was truncated in place, so a kill between the open and the
    write left an empty file and the run's earlier rows were lost for good. It is written to a temporary file and
    renamed over the old one now."""
    from rlspeed import files

    logger = RunLogger(tmp_path, tensorboard=False)
    logger.log({"timesteps": 1, "episode_return": 1.0})
    logger.close()
    before = (tmp_path / "metrics.csv").read_text()

    class Killed(BaseException):
        pass

    class Stream:
        def __init__(self, fd, *args, **kwargs):
            self.fd = fd

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            os.close(self.fd)

        def fileno(self):
            return self.fd

        def write(self, text):
            raise Killed

    monkeypatch.setattr(files.os, "fdopen", Stream)
    logger = RunLogger(tmp_path, tensorboard=False)
    with pytest.raises(Killed):
        logger.amend_last({"new_column": 2.0}, 1)
    monkeypatch.undo()
    assert (tmp_path / "metrics.csv").read_text() == before
    assert not list(tmp_path.glob(".metrics.csv.*.tmp"))


def test_an_installed_tensorboard_that_cannot_be_imported_leaves_the_run_without_events(tmp_path, monkeypatch):
    """An installed but broken TensorBoard (doctor said PASS) ended `rlspeed train` with a traceback before training;
    the run goes on with metrics.csv, said in a warning, and doctor warns."""
    pytest.importorskip("tensorboard")
    import sys

    from rlspeed.diagnostics.doctor import WARN, check_packages

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # (its import raises ImportError)
    with pytest.warns(UserWarning, match="TensorBoard is installed but cannot be imported"):
        logger = RunLogger(tmp_path, tensorboard=True)
    logger.log({"timesteps": 100, "episode_return": 5.0})
    logger.close()
    assert (tmp_path / "metrics.csv").exists() and not (tmp_path / "tensorboard").exists()
    [line] = [check for check in check_packages() if check.name == "tensorboard"]
    assert line.status == WARN and "cannot be imported" in line.detail


def _two_rows_the_last_amended(run_dir, x: float) -> None:
    """Rows at steps 100 and 200 with custom/x 1.5, then the last row amended as the last iteration's callbacks
    recorded: custom/x `x`, and a new custom/y."""
    logger = RunLogger(run_dir, tensorboard=True)
    logger.log({"timesteps": 100, "episode_return": 5.0, "custom/x": 1.5})
    logger.log({"timesteps": 200, "episode_return": 6.0, "custom/x": 1.5})
    logger.amend_last({"custom/x": x, "custom/y": 2.0}, 200)
    logger.close()


def test_tensorboard_has_one_point_per_metric_and_step(tmp_path):
    """TensorBoard's events hold each metric once per row: a callback's value recorded after the last row was sent
    again at that step (two points), while metrics.csv kept one cell."""
    pytest.importorskip("tensorboard")
    import collections

    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    _two_rows_the_last_amended(tmp_path, 1.5)
    points = collections.Counter()
    for path in (tmp_path / "tensorboard").iterdir():
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                points[value.tag, event.step] += 1
    assert points[("custom/x", 200)] == 1 and points[("custom/y", 200)] == 1
    assert points[("rollout/episode_return", 100)] == 1
    assert max(points.values()) == 1


def test_a_value_the_last_row_changes_is_one_tensorboard_point_as_metrics_csv_has_it(tmp_path):
    """A callback's value recorded in the last iteration that differs from the one its last row already had (SB3's
    `self.logger.record("random_value", ...)` at every step): TensorBoard showed two points at that step, the row's
    and the new one, where metrics.csv kept the new one; now it shows the new one, and every other metric once."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _two_rows_the_last_amended(tmp_path, 2.5)
    shown = EventAccumulator(str(tmp_path / "tensorboard"))
    shown.Reload()
    points = {tag: [(point.step, point.value) for point in shown.Scalars(tag)] for tag in shown.Tags()["scalars"]}
    assert points == {"custom/x": [(100, 1.5), (200, 2.5)], "custom/y": [(200, 2.0)],
                      "rollout/episode_return": [(100, 5.0), (200, 6.0)]}
    assert float(list(csv.DictReader((tmp_path / "metrics.csv").open()))[-1]["custom/x"]) == 2.5


def test_tensorboard_groups_a_runs_metrics_by_section_with_metrics_csv_values(tmp_path):
    """A trained run's TensorBoard events hold metrics.csv's values, at its steps, under sections as
    Stable-Baselines3's are (rollout/, train/, time/, eval/), not one flat list of every tag."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    from rlspeed import PPO

    model = PPO("CartPole-v1", device="cpu", seed=0, num_envs=4, num_steps=32, batch_size=64)
    model.learn(1024, run_dir=tmp_path, eval_freq=512, eval_episodes=2, progress_bar=False)
    model.close()
    events = {}
    for path in (tmp_path / "tensorboard").iterdir():
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                events[value.tag, event.step] = value.simple_value if value.HasField("simple_value") else \
                    float(value.tensor.float_val[0])
    with open(tmp_path / "metrics.csv", encoding="utf-8") as file:
        rows = list(csv.DictReader(file))
    tags = {tag for tag, _ in events}
    assert {"rollout/episode_return", "train/policy_loss", "train/value_loss", "time/sps", "eval/eval_mean"} <= tags
    assert all("/" in tag for tag in tags)
    for row in rows:
        for column, tag in (("policy_loss", "train/policy_loss"), ("eval_mean", "eval/eval_mean")):
            if row[column]:
                assert events[tag, int(row["timesteps"])] == pytest.approx(float(row[column]), rel=1e-6)


@pytest.mark.parametrize("seeds", [None, "0-1"])
@pytest.mark.plots
def test_a_run_without_an_importable_matplotlib_is_saved_whole_without_its_plot(tmp_path, monkeypatch, capsys, seeds):
    """matplotlib that cannot be imported (a broken install) cost a finished run its model (the plot came first and
    raised): the run is saved, the plot left out with a warning naming the pip command, and the command succeeds."""
    import sys

    from rlspeed import cli

    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)  # (an import of it raises ImportError)
    out = tmp_path / "run"
    argv = ["train", "ppo", "CartPole-v1", "--total-timesteps", "512", "--no-progress", "--out", str(out)]
    with pytest.warns(UserWarning, match="matplotlib cannot be imported .*pip install matplotlib"):
        code = cli.main(argv + (["--seeds", seeds, "--target-return", "none"] if seeds else []))
    assert code == 0
    assert (out / "summary.json").is_file() and (out / "metrics.csv").is_file()
    if seeds:
        assert len(list((out / "members").glob("seed_*.safetensors"))) == 2
        assert not (out / "learning_curves.png").exists()
    else:
        assert (out / "model.safetensors").is_file() and not (out / "learning_curve.png").exists()


def test_a_continued_run_begun_with_flat_tensorboard_tags_keeps_them(tmp_path):
    """A run an earlier rlspeed began (TensorBoard tags as metrics.csv's names) and this one continues: its new
    events keep those names, so that each curve stays one curve (they split into `episode_return` up to the resume
    and `rollout/episode_return` after it); a new run takes the sections."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from torch.utils.tensorboard import SummaryWriter

    from rlspeed.logging import flat_tags

    old = SummaryWriter(str(tmp_path / "tensorboard"))  # (what an earlier rlspeed wrote)
    old.add_scalar("episode_return", 5.0, 100)
    old.close()
    (tmp_path / "metrics.csv").write_text("timesteps,train_wall_s,episode_return\n100,1.0,5.0\n", encoding="utf-8")
    assert flat_tags(tmp_path) and not flat_tags(tmp_path / "elsewhere")
    logger = RunLogger(tmp_path, tensorboard=True, continue_from=100)
    logger.log({"timesteps": 200, "train_wall_s": 2.0, "episode_return": 6.0})
    logger.close()
    tags = {value.tag for path in (tmp_path / "tensorboard").iterdir()
            for event in EventFileLoader(str(path)).Load() for value in event.summary.value}
    assert tags == {"episode_return", "train_wall_s"}


def test_checkpoints_are_not_training_time(tmp_path, monkeypatch):
    """train_wall_s and sps leave out the time spent writing checkpoints, as they leave out evaluations and callbacks
    (docs/cli.md): a periodic checkpoint's save counted in the next row's clock and lowered its steps/s."""
    import time
    import types

    from rlspeed import PPO
    from rlspeed.algos import base

    offset = [0.0]  # seconds the fake clock runs ahead of the real one: each save takes an hour on it
    monkeypatch.setattr(base, "time", types.SimpleNamespace(perf_counter=lambda: time.perf_counter() + offset[0]))
    model = PPO("CartPole-v1", device="cpu", seed=0, num_envs=4, num_steps=32, batch_size=64, n_epochs=1)
    save = model.save

    def slow_save(path, *args, **kwargs):
        offset[0] += 3600.0
        return save(path, *args, **kwargs)

    monkeypatch.setattr(model, "save", slow_save)
    model.learn(128 * 6, progress_bar=False, run_dir=tmp_path, checkpoint_freq=128, log_interval_s=0.0)
    assert offset[0] >= 5 * 3600.0  # (a checkpoint after each of the first rows: they fell within the run)
    rows = read_rows(tmp_path / "metrics.csv")
    assert len(rows) == 6 and float(rows[-1]["train_wall_s"]) < 3600.0
    assert all(float(row["sps"]) > 128 / 3600.0 for row in rows)
    assert model.result.train_wall_s < 3600.0 and model.result.sps > 128 * 6 / 3600.0


@pytest.mark.parametrize("where", ["evaluation", "callback", "rollout start"])
def test_an_interrupt_during_a_pause_of_the_clock_leaves_the_pause_out_of_the_training_time(tmp_path, monkeypatch,
                                                                                          where):
    """Ctrl-C during one of learn's evaluations (the long pause of the training clock) or a callback (after an
    iteration, or its on_rollout_start before the next): model.result and the loop position that a checkpoint and
    the command's summary.json take (`_loop`) counted the time spent in it as training time (an hour's evaluation:
    an hour of train_wall_s, and sps as low), the stretch before an evaluation twice. Now they end where the clock
    stopped, as a run that is not interrupted counts them."""
    import time
    import types

    from rlspeed import PPO
    from rlspeed.algos import base
    from rlspeed.callbacks import BaseCallback

    offset = [0.0]  # seconds the fake clock runs ahead of the real one: the pause takes an hour on it, then Ctrl-C
    monkeypatch.setattr(base, "time", types.SimpleNamespace(perf_counter=lambda: time.perf_counter() + offset[0]))
    model = PPO("CartPole-v1", device="cpu", seed=0, num_envs=4, num_steps=32, batch_size=64, n_epochs=1)

    def an_hour_then_ctrl_c(*args, **kwargs):
        if model.num_timesteps >= 256:
            offset[0] += 3600.0
            raise KeyboardInterrupt
        return True

    class CtrlCAtRolloutStart(BaseCallback):
        def _on_rollout_start(self) -> None:
            an_hour_then_ctrl_c()

    options = {"evaluation": {"target_return": 1e9, "eval_freq": 256},
               "callback": {"callback": an_hour_then_ctrl_c},
               "rollout start": {"callback": CtrlCAtRolloutStart()}}[where]
    if where == "evaluation":
        monkeypatch.setattr(model, "evaluate", an_hour_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        model.learn(128 * 4, progress_bar=False, log_interval_s=1e9, **options)  # (no row but those they make)
    assert offset[0] == 3600.0 and model.num_timesteps == 256
    assert model.result.train_wall_s < 3600.0 and model.result.sps > 256 / 3600.0
    assert model._loop["train_wall_s"] == pytest.approx(model.result.train_wall_s)


def test_metrics_rows_give_the_learning_rate_each_rows_last_update_took(tmp_path):
    """metrics.csv's learning_rate is the rate of the row's last update (SB3's train/learning_rate): with anneal_lr,
    the configured rate times the share of the run left before that update's rollout (docs/algorithms.md), falling
    row by row; without, the configured rate."""
    from rlspeed import PPO, SAC

    model = PPO("CartPole-v1", device="cpu", seed=0, num_envs=4, num_steps=32, batch_size=64, n_epochs=1,
                learning_rate=1e-3, anneal_lr=True)
    model.learn(128 * 4, progress_bar=False, run_dir=tmp_path / "ppo", log_interval_s=0.0)
    rates = [float(row["learning_rate"]) for row in read_rows(tmp_path / "ppo" / "metrics.csv")]
    assert rates == pytest.approx([1e-3 * (1 - k / 4) for k in range(4)])
    sac = SAC("Pendulum-v1", device="cpu", seed=0, learning_rate=7e-4, learning_starts=16, batch_size=16)
    sac.learn(48, progress_bar=False, run_dir=tmp_path / "sac", log_interval_s=0.0)
    rows = read_rows(tmp_path / "sac" / "metrics.csv")
    assert rows and all(float(row["learning_rate"]) == pytest.approx(7e-4) for row in rows)


BESIDE_THE_BAR = """
import warnings

from rlspeed import PPO
from rlspeed.callbacks import BaseCallback, EvalCallback


class Warns(BaseCallback):
    def _on_step(self):
        if self.num_timesteps >= 256 and not getattr(self, "said", False):
            self.said = True
            warnings.warn("a warning while training")
        return True


model = PPO("CartPole-v1", seed=0, device="cpu", env_backend="torch", num_envs=4, num_steps=32, batch_size=64)
model.learn(512, callback=[EvalCallback(eval_freq=128, n_eval_episodes=1, verbose=1), Warns()])
"""


@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal (pty)")
def test_lines_said_while_a_bar_is_drawn_in_a_terminal_start_lines_of_their_own():
    """In a terminal, a callback's line (EvalCallback's "rlspeed: eval at ...", verbose=1) and a warning shown while
    learn's bar was drawn were written at the end of the bar's line ("... 0.00/512 [00:00<?, ?step/s]rlspeed: eval
    at 128 steps"). Now the bar's line is cleared first and the bar drawn again below them, as tqdm's write does."""
    import fcntl
    import pty
    import struct
    import subprocess
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))  # (a bar needs the columns)
    try:
        child = subprocess.Popen([sys.executable, "-c", BESIDE_THE_BAR], stdin=subprocess.DEVNULL, stdout=follower,
                                 stderr=follower, env={**os.environ, "PYTHONWARNINGS": ""})
        os.close(follower)
        output = bytearray()
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # (EIO: the child closed its end)
                break
            if not chunk:
                break
            output += chunk
        assert child.wait(timeout=300) == 0, output.decode(errors="replace")
    finally:
        os.close(leader)
    segments = output.decode(errors="replace").replace("\r", "\n").split("\n")
    assert any(segment.startswith("ppo CartPole-v1: ") for segment in segments)  # (the bar was drawn)
    evals = [segment for segment in segments if "rlspeed: eval at" in segment]
    warned = [segment for segment in segments if "UserWarning: a warning while training" in segment]
    assert evals and warned
    assert all(segment.startswith("rlspeed: eval at") for segment in evals), evals
    assert all(segment.startswith("<string>:") for segment in warned), warned


def test_metrics_rows_count_the_gradient_steps_so_far_and_give_the_gaussians_std(tmp_path):
    """metrics.csv's n_updates (SB3's train/n_updates) is the gradient steps taken so far, from the first update on
    (PPO: one per minibatch; A2C: one per rollout; off-policy: gradient_steps per iteration past learning_starts),
    going on over a save and load; std (SB3's train/std) is the PPO/A2C Gaussian's mean exp(log_std) after the
    row's last update, a column only for Box actions. Both are TensorBoard's train/n_updates and train/std."""
    from rlspeed import A2C, PPO, SAC
    from rlspeed.logging import tensorboard_tag

    assert (tensorboard_tag("n_updates"), tensorboard_tag("std")) == ("train/n_updates", "train/std")
    ppo = PPO("Pendulum-v1", device="cpu", seed=0, num_envs=4, num_steps=32, batch_size=32, n_epochs=3)
    ppo.learn(128 * 3, progress_bar=False, run_dir=tmp_path / "ppo", log_interval_s=0.0)
    rows = read_rows(tmp_path / "ppo" / "metrics.csv")
    assert [int(row["n_updates"]) for row in rows] == [12, 24, 36]  # (3 epochs of 4 minibatches per rollout)
    assert float(rows[-1]["std"]) == pytest.approx(float(ppo.policy.log_std.detach().exp().mean()), rel=1e-6)
    assert len({row["std"] for row in rows}) == 3  # (the policy's at each row: it moves with the updates)
    a2c = A2C("Pendulum-v1", device="cpu", seed=0, num_envs=4, num_steps=8)
    a2c.learn(32 * 3, progress_bar=False, run_dir=tmp_path / "a2c", log_interval_s=0.0)
    rows = read_rows(tmp_path / "a2c" / "metrics.csv")
    assert [int(row["n_updates"]) for row in rows] == [1, 2, 3]
    assert float(rows[-1]["std"]) == pytest.approx(float(a2c.policy.log_std.detach().exp().mean()), rel=1e-6)
    discrete = PPO("CartPole-v1", device="cpu", seed=0, num_envs=4, num_steps=32, batch_size=64, n_epochs=1)
    discrete.learn(128, progress_bar=False, run_dir=tmp_path / "discrete", log_interval_s=0.0)
    row, = read_rows(tmp_path / "discrete" / "metrics.csv")
    assert int(row["n_updates"]) == 2 and "std" not in row
    sac = SAC("Pendulum-v1", device="cpu", seed=0, learning_starts=16, batch_size=16, gradient_steps=2)
    sac.learn(48, progress_bar=False, run_dir=tmp_path / "sac", log_interval_s=0.0)
    rows = read_rows(tmp_path / "sac" / "metrics.csv")
    assert all(row["n_updates"] == "" for row in rows[:16]) and "std" not in rows[0]  # (none before learning_starts)
    assert [int(row["n_updates"]) for row in rows[16:]] == list(range(2, 2 * 32 + 1, 2))
    sac.save(tmp_path / "sac.safetensors")
    again = SAC.load(tmp_path / "sac.safetensors", device="cpu")
    again.learn(18, progress_bar=False, run_dir=tmp_path / "loaded", log_interval_s=0.0)  # (its buffer starts empty)
    assert [int(row["n_updates"]) for row in read_rows(tmp_path / "loaded" / "metrics.csv")] == [64] * 16 + [66, 68]


def test_a_file_an_older_rlspeed_wrote_after_training_leaves_n_updates_empty(tmp_path):
    """A model or checkpoint saved after training by an rlspeed that did not count gradient steps (no n_updates in
    its metadata) goes on with n_updates empty in its rows and left out of its saves: it counted from 0 there, 16
    updates at step 2,000 where thousands had been taken."""
    from rlspeed import A2C
    from rlspeed.checkpoint import load_checkpoint, save_checkpoint

    model = A2C("CartPole-v1", device="cpu", seed=0, num_envs=4, num_steps=8, env_backend="torch")
    model.learn(64, progress_bar=False)
    tensors, meta = load_checkpoint(model.save(tmp_path / "old.safetensors"))
    del meta["n_updates"], meta["digest"]  # (as an older rlspeed wrote it)
    save_checkpoint(tmp_path / "old.safetensors", tensors, meta)
    resumed = A2C("CartPole-v1", device="cpu", seed=0, num_envs=4, num_steps=8, env_backend="torch")
    resumed.resume(tmp_path / "old.safetensors")
    for name, again in (("loaded", A2C.load(tmp_path / "old.safetensors", device="cpu")), ("resumed", resumed)):
        again.learn(64, progress_bar=False, run_dir=tmp_path / name, log_interval_s=0.0, reset_num_timesteps=False)
        rows = read_rows(tmp_path / name / "metrics.csv")
        assert rows and all(row.get("n_updates", "") == "" for row in rows)
        assert "n_updates" not in load_checkpoint(again.save(tmp_path / "again.safetensors"))[1]


def test_a_learn_that_fails_as_it_sets_up_closes_its_bar(monkeypatch):
    """An error in learn after its bar was drawn and before training (the numerics guard's first snapshot here)
    closed nothing: the bar stayed registered as drawn, and with it the display of warnings beside bars, for the
    rest of the process."""
    import rlspeed.logging
    from rlspeed import PPO

    model = PPO("CartPole-v1", num_envs=2, num_steps=8, batch_size=16, n_epochs=1, seed=0)

    def failing(*args, **kwargs):
        raise RuntimeError("snapshot failed")

    monkeypatch.setattr(rlspeed.logging, "_is_terminal", lambda stream: True)  # (a bar drawn in place)
    monkeypatch.setattr(type(model._numerics), "snapshot", failing)
    with pytest.raises(RuntimeError, match="snapshot failed"):
        model.learn(64, progress_bar=True)
    assert not rlspeed.logging._DRAWN_BARS


def _scalars(directory, tag: str) -> list[tuple[int, float]]:
    """(step, value) of TensorBoard's scalar `tag` in `directory` as TensorBoard reads them back (its files in name
    order, restarts' purges applied)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(directory))
    accumulator.Reload()
    return [(event.step, event.value) for event in accumulator.Scalars(tag)]


def test_further_learn_calls_of_a_model_write_on_one_tensorboard_events_file(tmp_path):
    """`model.learn(..., reset_num_timesteps=False)` in a loop made one events file per call (50 calls, 50 files,
    each with a writer thread while it wrote), and TensorBoard, reading them in the order of their names, read the
    10th file of a second after the 11th and dropped the points between. Further calls of one model write on its
    events file, whose points come back in order; `close` (or the model's collection) closes it, and a call after
    that starts another file."""
    pytest.importorskip("tensorboard")
    import gc

    from rlspeed import PPO

    gc.collect()  # (a model of an earlier test waiting for collection closes its writer now, not in the middle)
    threads = _tensorboard_writers()
    model = PPO("CartPole-v1", device="cpu", num_envs=4, num_steps=32, batch_size=64, seed=0)
    for _ in range(2):
        model.learn(128, reset_num_timesteps=False, progress_bar=False, run_dir=tmp_path)
    assert len(list((tmp_path / "tensorboard").iterdir())) == 1
    assert [step for step, _ in _scalars(tmp_path / "tensorboard", "time/sps")] == [128, 256]
    assert _tensorboard_writers() == threads + 1
    model.close()
    assert _tensorboard_writers() == threads  # (its writer closed)
    model.learn(128, progress_bar=False, run_dir=tmp_path)
    assert len(list((tmp_path / "tensorboard").iterdir())) == 2
    assert _tensorboard_writers() == threads + 1
    del model
    gc.collect()
    assert _tensorboard_writers() == threads
    assert [step for step, _ in _scalars(tmp_path / "tensorboard", "time/sps")] == [128, 256, 384]


def test_a_kept_tensorboard_writer_serves_only_a_run_that_goes_on_from_its_last_step(tmp_path):
    """A logger goes on in the kept writer's events file only where its run continues from the step those events
    reached: a run rewound to an earlier step (a resume from an older checkpoint) starts a file whose restart drops
    the later points, as a new writer's always did."""
    pytest.importorskip("tensorboard")
    from rlspeed.logging import KeptWriter

    kept = KeptWriter()
    first = RunLogger(tmp_path, tensorboard=True, kept=kept)
    for step in (100, 200):
        first.log({"timesteps": step, "episode_return": step / 100})
    first.close(plot=False, keep_writer=True)
    going_on = RunLogger(tmp_path, tensorboard=True, continue_from=200, kept=kept)
    going_on.log({"timesteps": 300, "episode_return": 3.0})
    going_on.close(plot=False, keep_writer=True)
    assert len(list((tmp_path / "tensorboard").iterdir())) == 1
    rewound = RunLogger(tmp_path, tensorboard=True, continue_from=100, kept=kept)
    rewound.log({"timesteps": 200, "episode_return": 20.0})
    rewound.close(plot=False)  # (not kept: the next logger makes a writer of its own)
    assert len(list((tmp_path / "tensorboard").iterdir())) == 2
    assert _scalars(tmp_path / "tensorboard", "rollout/episode_return") == [(100, 1.0), (200, 20.0)]
    kept.close()


def test_values_recorded_before_a_learn_calls_first_row_are_at_the_models_step(tmp_path):
    """Values a callback recorded in a call that stopped before its first row (an error in its first iteration) are a
    row of their own at the model's step count: the row had no `timesteps` (an empty cell, dropped when the run
    continued) and TensorBoard drew it at step 0, before the model's earlier training."""
    from rlspeed import PPO
    from rlspeed.callbacks import BaseCallback

    class RecordThenFail(BaseCallback):
        def _on_training_start(self) -> None:
            self.logger.record("custom/stage", 2.0)

        def _on_rollout_start(self) -> None:
            raise RuntimeError("the stage's env is not ready")

    model = PPO("CartPole-v1", device="cpu", num_envs=4, num_steps=32, batch_size=64, seed=0)
    model.learn(128, progress_bar=False)  # (trained before, without a run directory)
    with pytest.raises(RuntimeError, match="not ready"):
        model.learn(128, progress_bar=False, run_dir=tmp_path, callback=RecordThenFail())
    assert read_rows(tmp_path / "metrics.csv") == [{"timesteps": "128", "custom/stage": "2.0"}]
    if importlib.util.find_spec("tensorboard") is not None:
        assert _scalars(tmp_path / "tensorboard", "custom/stage") == [(128, 2.0)]


@pytest.mark.parametrize("longer_count", [False, True])
def test_tensorboards_server_drops_a_killed_runs_points_after_the_checkpoint_it_resumed_from(tmp_path, longer_count):
    """A run killed after its last checkpoint left points past it; the resumed run's writer marks its restart there
    (a session start), and TensorBoard's server (its Python reader, `--load_fast=false`, and where its data server
    is not installed) takes only a second session start for a restart: the run's first writer wrote none, so it
    showed both points at those steps, the killed run's and the resumed run's (metrics.csv has one). Every writer
    marks its start. TensorBoard reads the files in the order of their names (the second each was made, then the
    host, the process and the process's count of writers): a resumed run's file made in the killed run's second with
    a count of more digits (the process's 10th writer after its 9th: `longer_count`) was read first, and the killed
    run's start, read second, dropped every point before it ([100, 200, 300])."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
    from tensorboard.summary.writer import event_file_writer

    killed = RunLogger(tmp_path, tensorboard=True)
    for step in (100, 200, 300):
        killed.log({"timesteps": step, "episode_return": float(step)})
    killed.close(plot=False)
    if longer_count:  # (the process's writers so far: the next one's count has one digit more)
        count = next((tmp_path / "tensorboard").iterdir()).name.rpartition(".")[2]
        while event_file_writer._global_uid.get() < 10 ** len(count) - 1:
            pass
    resumed = RunLogger(tmp_path, tensorboard=True, continue_from=100)  # (its checkpoint: step 100)
    resumed.log({"timesteps": 200, "episode_return": -200.0})
    resumed.close(plot=False)
    assert len(list((tmp_path / "tensorboard").iterdir())) == 2
    server = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0})
    server.Reload()
    assert [event.step for event in server.Tensors("rollout/episode_return")] == [100, 200]


@pytest.mark.plots
def test_the_plot_of_a_run_in_which_no_episode_ended_says_so(tmp_path, monkeypatch):
    """A continuing task's training ends no episode: learning_curve.png said nothing (empty axes from 0 to 1); it
    says that no episode ended in the run's steps, over those steps."""
    from rlspeed import logging as run_logging

    figures = []
    monkeypatch.setattr(run_logging, "save_figure", lambda fig, path: figures.append(fig))
    logger = RunLogger(tmp_path, tensorboard=False)
    logger.log({"timesteps": 2048, "sps": 50.0, "episode_return": float("nan")})
    logger.log({"timesteps": 4096, "sps": 60.0, "episode_return": float("nan")})
    logger.close()
    (ax,) = figures[0].axes
    assert [text.get_text() for text in ax.texts] == ["no training episode ended in 4,096 steps"]
    assert ax.get_xlim() == (0, 4096)
