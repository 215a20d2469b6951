"""Run logging: metrics.csv fills while a run goes on, and grows a column when a new metric appears."""

from __future__ import annotations

import csv

from rlspeed.logging import RunLogger


def read_rows(path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


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
