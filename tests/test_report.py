"""`rlspeed report`: the seeds of many run directories (solo runs and populations) pooled per experiment into the
final-score table and the learning curves, with rlspeed.stats' IQM and bootstrap intervals; runs of other settings
never pooled, a seed never counted twice, an unfinished run refused, and bad input one sentence with exit code 2."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import cli_error

from rlspeed import cli
from rlspeed.report import collect_runs, final_scores, learning_curves
from rlspeed.stats import aggregate

SMALL = ["--set", "num_envs=8", "--set", "num_steps=16", "--set", "batch_size=64", "--set", "n_epochs=2",
         "--total-timesteps", "256", "--eval-freq", "128", "--target-return", "1000", "--eval-episodes", "2"]
HYPER = {"learning_rate": 0.001, "gamma": 0.99}


def fake_run(path, algo="ppo", env_id="CartPole-v1", seed=0, final=100.0, curve=((100, 10.0), (200, 20.0)),
             hyper=None, total=256, config_extra=None, **summary):
    """A finished solo run directory as `rlspeed train` writes it (config.yaml, metrics.csv, summary.json)."""
    path.mkdir(parents=True)
    config = {"algo": algo, "env_id": env_id, "seed": seed, "total_timesteps": total, "target_return": None,
              "env_kwargs": None, "hyperparameters": {**HYPER, **(hyper or {})}, **(config_extra or {})}
    (path / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    with open(path / "metrics.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["timesteps", "episode_return", "eval_mean"])
        for step, value in curve:
            writer.writerow([step - 50, 1.0, ""])
            writer.writerow([step, 1.0, value])
    (path / "summary.json").write_text(json.dumps({
        "algo": algo, "env_id": env_id, "seed": seed, "total_timesteps": total, "target_return": None,
        "steps_to_target": None, "final_eval": {"mean": final, "std": 0.0, "episodes": 10}, "interrupted": False,
        "error": None, **summary}), encoding="utf-8")
    return path


def fake_population(path, seeds, finals, curves, algo="ppo", env_id="CartPole-v1", diverged=None, **summary):
    path.mkdir(parents=True)
    config = {"algo": algo, "env_id": env_id, "seeds": list(seeds), "total_timesteps": 256, "target_return": None,
              "env_kwargs": None, "hyperparameters": dict(HYPER)}
    (path / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    diverged = diverged or {}
    members = [{"seed": seed, "hyperparameters": dict(HYPER), "steps_to_target": None,
                "final_eval": None if seed in diverged else {"mean": final, "episodes": 10},
                "curve": [list(point) for point in curve], **({"diverged_at": diverged[seed]} if seed in diverged
                                                               else {})}
               for seed, final, curve in zip(seeds, finals, curves)]
    (path / "summary.json").write_text(json.dumps({
        "algo": algo, "env_id": env_id, "population": len(seeds), "seeds": list(seeds), "target_return": None,
        "members": members, "interrupted": False, "error": None, **summary}), encoding="utf-8")
    return path


def docs_report_columns() -> dict[str, list[str]]:
    """The columns docs/cli.md gives for `rlspeed report`'s final_scores.csv and curves.csv, by file."""
    page = (Path(__file__).resolve().parent.parent / "docs" / "cli.md").read_text(encoding="utf-8")
    return {name: [column.strip() for column in re.sub(r"\s+", " ", columns).split(",")]
            for name, columns in re.findall(r"`(final_scores\.csv|curves\.csv)` \([^`]*`([^`]*)`", page)}


def test_a_report_pools_a_population_and_solo_runs_of_the_same_settings(tmp_path, capsys):
    """Seeds 0 and 1 as a population and seed 2 as a solo run, at the same settings, are one experiment of 3 runs:
    its final-score row is rlspeed.stats.aggregate of the three final evaluations, and the population alone gives
    what its summary.json's aggregate says, to the last digit."""
    population, solo = tmp_path / "pop", tmp_path / "solo"
    assert cli.main(["train", "ppo", "CartPole-v1", "--seeds", "0-1", *SMALL, "--env-backend", "torch", "--quiet",
                     "--out", str(population)]) == 0
    assert cli.main(["train", "ppo", "CartPole-v1", "--seed", "2", *SMALL, "--env-backend", "torch", "--quiet",
                     "--no-progress", "--out", str(solo)]) == 0
    capsys.readouterr()
    summary = json.loads((population / "summary.json").read_text(encoding="utf-8"))
    finals = [member["final_eval"]["mean"] for member in summary["members"]]
    finals.append(json.loads((solo / "summary.json").read_text(encoding="utf-8"))["final_eval"]["mean"])
    out = tmp_path / "report"
    assert cli.main(["report", str(population), str(solo), "--out", str(out), "--reps", "2000"]) == 0
    assert "| PPO | CartPole-v1 | 3 |" in capsys.readouterr().out
    with open(out / "final_scores.csv", newline="", encoding="utf-8") as handle:
        (row,) = list(csv.DictReader(handle))
    expected = aggregate(finals, reps=2000)
    assert (int(row["runs"]), float(row["iqm"]), float(row["iqm_ci_low"]), float(row["iqm_ci_high"])) == (
        3, pytest.approx(expected["iqm"]), pytest.approx(expected["iqm_ci"][0]), pytest.approx(expected["iqm_ci"][1]))
    with open(out / "curves.csv", newline="", encoding="utf-8") as handle:
        curve = list(csv.DictReader(handle))
    assert [(int(row["timesteps"]), int(row["runs"])) for row in curve] == [(128, 3), (256, 3)]
    # (the columns docs/cli.md lists: its curves.csv lacked algo, env_id, variant and normalized)
    documented = docs_report_columns()
    assert list(row) == documented["final_scores.csv"] and list(curve[0]) == documented["curves.csv"]
    assert (out / "curves.png").stat().st_size > 0
    table, _ = final_scores(collect_runs([population]))
    assert {key: table[0][key] for key in ("runs", "median", "median_ci", "iqm", "iqm_ci")} == \
        summary["aggregate"]["final_eval"]


def test_runs_of_other_hyperparameters_are_other_rows_named_by_what_differs(tmp_path):
    for seed in range(3):
        fake_run(tmp_path / "runs" / f"a{seed}", seed=seed, final=100.0 + seed)
        fake_run(tmp_path / "runs" / f"b{seed}", seed=seed, final=200.0 + seed, hyper={"learning_rate": 0.01})
    table, notes = final_scores(collect_runs([tmp_path / "runs"]), reps=100)
    assert [(row["variant"], row["runs"], row["iqm"]) for row in table] == [
        ("learning_rate=0.001", 3, 101.0), ("learning_rate=0.01", 3, 201.0)]
    assert notes == []
    summary = json.loads((tmp_path / "runs" / "a0" / "summary.json").read_text())
    summary["final_eval"]["episodes"] = 3  # (another --eval-episodes does not split an experiment: a note says so)
    (tmp_path / "runs" / "a0" / "summary.json").write_text(json.dumps(summary))
    table, notes = final_scores(collect_runs([tmp_path / "runs"]), reps=100)
    assert [row["runs"] for row in table] == [3, 3]
    assert notes == ["ppo on CartPole-v1 (learning_rate=0.001): final evaluations of 3 and 10 episodes pooled "
                     "(--eval-episodes differed)"]


def test_settings_that_had_no_effect_do_not_tell_experiments_apart(tmp_path):
    """Runs of use_sde=False whose sde_sample_freq differs (a gSDE option, warned as unused when the run was made:
    the preset's 4 against a --set of -1) are one experiment, labelled without it (they were two rows, told apart by
    sde_sample_freq); with use_sde on it counts."""
    sde = {"use_sde": False, "sde_sample_freq": 4}
    fake_run(tmp_path / "runs" / "a", algo="ppo", env_id="Pendulum-v1", seed=0, hyper=sde)
    fake_run(tmp_path / "runs" / "b", algo="ppo", env_id="Pendulum-v1", seed=1, hyper={**sde, "sde_sample_freq": -1})
    fake_run(tmp_path / "runs" / "c", algo="ppo", env_id="Pendulum-v1", seed=2, hyper={**sde, "learning_rate": 0.01})
    table, _ = final_scores(collect_runs([tmp_path / "runs"]), reps=100)
    assert [(row["variant"], row["runs"]) for row in table] == [("learning_rate=0.001", 2), ("learning_rate=0.01", 1)]
    fake_run(tmp_path / "sde" / "a", algo="ppo", env_id="Pendulum-v1", seed=0, hyper={"use_sde": True,
                                                                                       "sde_sample_freq": -1})
    fake_run(tmp_path / "sde" / "b", algo="ppo", env_id="Pendulum-v1", seed=1, hyper={"use_sde": True,
                                                                                       "sde_sample_freq": 4})
    table, _ = final_scores(collect_runs([tmp_path / "sde"]), reps=100)
    assert [row["variant"] for row in table] == ["sde_sample_freq=-1", "sde_sample_freq=4"]


def test_settings_the_runs_env_made_idle_do_not_tell_experiments_apart(tmp_path):
    """CNN options on a run without images and episodic_life off Atari change nothing (warned as unused when the run
    was made): runs that differ in them are one experiment, the env's spaces read from the model file each run saved,
    or another run of its env saved (they were three rows, told apart by cnn_features_dim and episodic_life); on
    images cnn_features_dim counts, and where no run's model file is left they are kept."""
    import gymnasium as gym

    from rlspeed import PPO
    from rlspeed.envs.base import EnvSpec

    cartpole = PPO("CartPole-v1", num_envs=2, num_steps=16, batch_size=32, net_arch=(8,))
    images = PPO(EnvSpec.from_spaces("custom", gym.spaces.Box(0, 255, (20, 20, 3), np.uint8), gym.spaces.Discrete(3),
                                     20, None), net_arch=(8,), cnn_features_dim=16)
    for name, seed, hyper, model in [("a", 0, {}, cartpole), ("b", 1, {"cnn_features_dim": 256}, cartpole),
                                     ("c", 2, {"episodic_life": False}, cartpole),
                                     ("d", 0, {"cnn_features_dim": 16}, images),
                                     ("e", 1, {"cnn_features_dim": 32}, images)]:
        run = fake_run(tmp_path / "runs" / name, env_id=model.env_id, seed=seed,
                       hyper={"cnn_features_dim": 512, "episodic_life": True, **hyper})
        model.save(run / "model")
    table, _ = final_scores(collect_runs([tmp_path / "runs"]), reps=100)
    assert [(row["env_id"], row["variant"], row["runs"]) for row in table] == [
        ("CartPole-v1", "", 3), ("custom", "cnn_features_dim=16", 1), ("custom", "cnn_features_dim=32", 1)]
    # a run whose model file is gone is read as the others of its env (it was a row of its own, told apart by
    # 'cnn_features_dim=None' from identical runs); where no file says the env's spaces, the settings are kept
    (tmp_path / "runs" / "b" / "model.safetensors").unlink()
    table, _ = final_scores(collect_runs([tmp_path / "runs" / name for name in "abc"]), reps=100)
    assert [row["runs"] for row in table] == [3]
    for name in "ac":
        (tmp_path / "runs" / name / "model.safetensors").unlink()
    table, _ = final_scores(collect_runs([tmp_path / "runs" / name for name in "abc"]), reps=100)
    assert [row["runs"] for row in table] == [1, 1, 1]


def test_fine_tuned_runs_are_another_experiment_than_runs_from_scratch(tmp_path):
    """A run that started from a saved model's networks (`--init-from`, config.yaml's init_from) learnt something
    else than one of the same settings from scratch; a config.yaml of an rlspeed before the setting pools with a
    run from scratch of today's (init_from: null)."""
    fake_run(tmp_path / "runs" / "old", seed=0, final=100.0)
    fake_run(tmp_path / "runs" / "new", seed=1, final=102.0, config_extra={"init_from": None})
    fake_run(tmp_path / "runs" / "tuned", seed=2, final=300.0, config_extra={"init_from": "/models/a.safetensors"})
    table, _ = final_scores(collect_runs([tmp_path / "runs"]), reps=100)
    assert sorted((row["runs"], row["iqm"]) for row in table) == [(1, 300.0), (2, 101.0)]


def test_curves_of_runs_evaluated_at_other_steps_share_one_axis_of_env_steps(tmp_path):
    """Runs whose evaluations came at other steps (other eval_freq, other iteration sizes) count at each step with
    their latest evaluation at or before it; a step before a run's first evaluation does not count it."""
    fake_run(tmp_path / "a", seed=0, curve=((100, 10.0), (200, 20.0), (300, 30.0)))
    fake_run(tmp_path / "b", seed=1, curve=((150, 15.0), (300, 35.0)))
    (curve,) = learning_curves(collect_runs([tmp_path / "a", tmp_path / "b"]), reps=100)
    assert curve["steps"] == [100, 150, 200, 300]
    assert curve["runs"] == [1, 2, 2, 2]
    assert curve["iqm"] == pytest.approx([10.0, 12.5, 17.5, 32.5])


def test_a_diverged_member_is_left_out_of_the_final_scores_and_counts_in_the_curve_until_it_diverged(tmp_path):
    fake_population(tmp_path / "pop", [0, 1, 2], [10.0, 20.0, None],
                    [[(100, 1.0), (200, 2.0)], [(100, 3.0), (200, 4.0)], [(100, 500.0)]], diverged={2: 150})
    results = collect_runs([tmp_path / "pop"])
    table, notes = final_scores(results, reps=100)
    assert table[0]["runs"] == 2 and table[0]["iqm"] == 15.0
    assert notes and "1 of 3 members diverged" in notes[0]
    (curve,) = learning_curves(results, reps=100)
    assert curve["runs"] == [3, 2]
    assert curve["iqm"][1] == pytest.approx(3.0)


def test_final_evaluations_cut_short_at_the_step_limit_are_said_in_a_note_and_in_scores_csv(tmp_path):
    """A final evaluation whose episodes were still running at the step limit (summary.json's `unfinished`: an env
    without a time limit) scores the return collected by then: the report says so in a note and each seed's row of
    scores.csv says how many; a run whose summary has no `unfinished` (an older rlspeed's) counts none."""
    from rlspeed.report import write_report

    fake_run(tmp_path / "cut", seed=0, curve=(), final_eval={"mean": 5.0, "std": 0.0, "episodes": 10, "unfinished": 10})
    fake_run(tmp_path / "older", seed=1, curve=())  # (no curves: no plot to draw)
    report = write_report([tmp_path / "cut", tmp_path / "older"], tmp_path / "out", reps=100)
    assert any("10 of the final evaluations' 20 episodes were cut short at the step limit" in note
               for note in report["notes"]), report["notes"]
    with open(tmp_path / "out" / "scores.csv", newline="", encoding="utf-8") as handle:
        assert sorted(row["final_eval_unfinished"] for row in csv.DictReader(handle)) == ["0", "10"]


def test_normalized_scores_over_envs_are_one_row_per_algorithm_stratified_over_envs(tmp_path):
    cartpole = [100.0, 300.0, 500.0, 250.0]
    acrobot = [-500.0, -100.0, -250.0, -80.0]
    for seed, (a, b) in enumerate(zip(cartpole, acrobot)):
        fake_run(tmp_path / f"c{seed}", seed=seed, final=a)
        fake_run(tmp_path / f"a{seed}", env_id="Acrobot-v1", seed=seed, final=b)
    normalize = {"CartPole-v1": (0.0, 500.0), "Acrobot-v1": (-500.0, 0.0)}
    table, notes = final_scores(collect_runs([tmp_path]), normalize=normalize, reps=500)
    assert notes == []
    overall = table[-1]
    matrix = np.stack([np.array(cartpole) / 500.0, (np.array(acrobot) + 500.0) / 500.0], axis=1)
    expected = aggregate(matrix, reps=500)
    assert overall["env_id"] == "all normalized"
    assert (overall["iqm"], overall["iqm_ci"]) == (pytest.approx(expected["iqm"]), pytest.approx(expected["iqm_ci"]))
    fake_run(tmp_path / "a2c", algo="a2c", seed=0, final=50.0)  # (an algorithm without runs on Acrobot-v1)
    table, notes = final_scores(collect_runs([tmp_path]), normalize=normalize, reps=500)
    assert [row["algo"] for row in table if row["env_id"] == "all normalized"] == ["ppo"]
    assert notes == ["a2c: no row over all normalized envs: it needs one experiment on each of CartPole-v1, "
                     "Acrobot-v1 with the same number of scored runs (it has CartPole-v1: 1 run; Acrobot-v1: none)"]


@pytest.mark.parametrize("case, expected", [
    ("missing", "is not a run directory or a folder of them"),
    ("empty", "holds no run (no summary.json in it or under it)"),
    ("interrupted", "was interrupted"),
    ("error", "ended by an error (boom)"),
    ("twice", "Seed 0 of ppo on CartPole-v1 is in two runs of the same settings"),
    ("normalize", "is not ENV_ID=LOW:HIGH"),
    ("normalize-unknown", "--normalize names Pendulum-v1, which none of the runs trained on"),
    ("normalize-equal", "needs finite scores, LOW below HIGH (the returns that become 0 and 1), got 5 and 5"),
    ("normalize-reversed", "needs finite scores, LOW below HIGH (the returns that become 0 and 1), got 500 and 0"),
    ("held", "already holds a report (final_scores.csv)"),
])
def test_bad_input_is_one_sentence_and_exit_code_2(tmp_path, capsys, case, expected):
    runs = tmp_path / "runs"
    fake_run(runs / "a", seed=0)
    argv = ["report", str(runs)]
    if case == "missing":
        argv = ["report", str(tmp_path / "nothing")]
    elif case == "empty":
        (tmp_path / "empty").mkdir()
        argv = ["report", str(tmp_path / "empty")]
    elif case in ("interrupted", "error"):
        summary = json.loads((runs / "a" / "summary.json").read_text())
        summary.update({"interrupted": True} if case == "interrupted" else {"error": {"type": "X", "message": "boom"}})
        (runs / "a" / "summary.json").write_text(json.dumps(summary))
    elif case == "twice":
        fake_run(runs / "b", seed=0)
    elif case == "normalize":
        argv += ["--normalize", "CartPole-v1=0"]
    elif case == "normalize-unknown":
        argv += ["--normalize", "Pendulum-v1=-1600:0"]
    elif case == "normalize-equal":
        argv += ["--normalize", "CartPole-v1=5:5"]
    elif case == "normalize-reversed":  # (accepted: the better runs scored lower)
        argv += ["--normalize", "CartPole-v1=500:0"]
    elif case == "held":
        (tmp_path / "out").mkdir()
        (tmp_path / "out" / "final_scores.csv").write_text("mine")
        argv += ["--out", str(tmp_path / "out")]
    assert expected in cli_error(capsys, argv)
    if case == "held":
        assert (tmp_path / "out" / "final_scores.csv").read_text() == "mine"


def test_write_report_from_python_refuses_what_rlspeed_report_refuses_before_reading_the_runs(tmp_path):
    """`rlspeed.report.write_report` takes `reps` and `normalize` by the rules of `rlspeed report --reps` and
    `--normalize` (reps=1e12 from Python ran for days; the CLI alone bounded it), before it reads a run."""
    from rlspeed.errors import UserError
    from rlspeed.report import write_report
    from rlspeed.stats import MAX_REPS

    for reps in (MAX_REPS + 1, 0, 2.5):
        with pytest.raises(UserError, match="--reps must be"):
            write_report([tmp_path / "nothing"], None, reps=reps)
    with pytest.raises(UserError, match="LOW below HIGH"):
        write_report([tmp_path / "nothing"], None, normalize={"CartPole-v1": (500.0, 0.0)})
    for pair in (5.0, (1.0,), ("low", 2.0)):  # (a TypeError or ValueError from unpacking, before)
        with pytest.raises(UserError, match="needs two scores, LOW and HIGH"):
            write_report([tmp_path / "nothing"], None, normalize={"CartPole-v1": pair})


def test_a_plot_of_experiments_named_by_many_settings_is_written_without_matplotlibs_layout_warning(tmp_path):
    """Runs that differ in many hyperparameters name their experiments with all of them: the plot's legend was one
    line wider than its panel, and matplotlib warned "Tight layout not applied" to a user who could do nothing
    about it (`rlspeed report` said it as its warning). The labels are wrapped to the panel; the plot is written."""
    import warnings

    from rlspeed.report import plot_curves

    many = {"clip_range": 0.3, "ent_coef": 3.74481e-07, "gae_lambda": 0.999634, "gamma": 0.973828,
            "max_grad_norm": 0.887289, "num_envs": 32, "num_steps": 8, "vf_coef": 0.5}
    for index in range(3):
        fake_run(tmp_path / "runs" / f"r{index}", hyper={key: value * (index + 1) for key, value in many.items()})
    curves = learning_curves(collect_runs([tmp_path / "runs"]), reps=100)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert plot_curves(curves, tmp_path / "curves.png").stat().st_size > 0
