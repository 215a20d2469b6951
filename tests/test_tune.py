"""`rlspeed tune`: a real Optuna study in SQLite that resumes after an interruption, pruned trials leave the
population, the best configuration is a preset `rlspeed train --preset FILE` reads, the objective orders trials as
documented, and bad input is one sentence with exit code 2."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
import yaml
from conftest import cli_error, read_only_directory

optuna = pytest.importorskip("optuna")

import rlspeed.tune  # noqa: E402
from rlspeed import PPO, UserError, cli  # noqa: E402
from rlspeed.population.ppo import PPOPopulation  # noqa: E402
from rlspeed.presets import load_preset_file  # noqa: E402
from rlspeed.tune import objective, tune  # noqa: E402

# a few hundred steps per trial: 8 envs x 16 steps per iteration, evaluated every 128 steps
FIXED = {"num_envs": 8, "num_steps": 16, "batch_size": 64, "n_epochs": 2}
SET = [item for key, value in FIXED.items() for item in ("--set", f"{key}={value}")]
SPACE = {"learning_rate": {"low": 1e-4, "high": 3e-3, "log": True}, "clip_range": {"choices": [0.1, 0.2, 0.3]}}


def _command(tmp_path, *extra: str) -> list[str]:
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(SPACE))
    return ["tune", "ppo", "CartPole-v1", "--population", "2", "--budget", "256", "--eval-freq", "128",
            "--target-return", "1000", "--storage", str(tmp_path / "study.db"), "--search-space", str(space),
            "--out", str(tmp_path / "best.yaml"), "--confirm-seeds", "2", *SET, *extra]


def _states(tmp_path) -> dict[int, str]:
    study = optuna.load_study(study_name="ppo-CartPole-v1", storage=f"sqlite:///{tmp_path / 'study.db'}")
    return {trial.number: trial.state.name for trial in study.get_trials(deepcopy=False)}


def test_study_resumes_after_an_interruption(tmp_path, monkeypatch, capsys):
    command = _command(tmp_path, "--trials", "4")
    calls = {"n": 0}
    original = PPOPopulation.train_iteration

    def interrupted(self):
        calls["n"] += 1
        if calls["n"] == 3:  # batch 1 is 2 iterations; Ctrl-C in batch 2's first
            raise KeyboardInterrupt
        return original(self)

    monkeypatch.setattr(PPOPopulation, "train_iteration", interrupted)
    assert cli.main(command) == 130
    finished = {"COMPLETE", "PRUNED"}  # (the pruner may stop a trial of a batch)
    states = _states(tmp_path)
    assert {states[0], states[1]} <= finished and (states[2], states[3]) == ("FAIL", "FAIL") and len(states) == 4
    assert (tmp_path / "best.yaml").is_file()  # the best of batch 1, written before the interruption
    edited = (tmp_path / "best.yaml").read_text().replace("num_envs: 8", "num_envs: 4")  # (a hand edit)
    (tmp_path / "best.yaml").write_text(edited)
    monkeypatch.setattr(PPOPopulation, "train_iteration", original)
    # a process killed outright leaves its trial RUNNING: the next run marks it failed
    optuna.load_study(study_name="ppo-CartPole-v1", storage=f"sqlite:///{tmp_path / 'study.db'}").ask()
    capsys.readouterr()
    assert cli.main(command) == 0
    printed = capsys.readouterr().out
    assert "2 of 4 trials finished" in printed
    assert (tmp_path / "best.yaml.edited").read_text() == edited  # the rewrite kept the edit aside
    states = _states(tmp_path)
    assert len(states) == 7 and {states[n] for n in (0, 1, 5, 6)} <= finished
    assert (states[2], states[3], states[4]) == ("FAIL", "FAIL", "FAIL")
    assert cli.main(command) == 0  # done: a rerun adds nothing, and says so
    assert len(_states(tmp_path)) == 7
    assert "4 trials finished, 4 asked for: none to train (a larger --trials adds more)" in capsys.readouterr().out


@pytest.mark.parametrize("stopped_at, call", [("ask", 1), ("ask", 2), ("tell", 2)])
def test_no_trial_of_a_stopped_batch_is_left_running(tmp_path, monkeypatch, capsys, stopped_at, call):
    """A stop between two of a batch's `study.ask()` calls left the trials asked RUNNING (the batch's list was not
    made yet), and a second Ctrl-C while the stopped batch's trials were marked failed left the rest RUNNING:
    optuna-dashboard showed them running until the next run. Every asked trial is marked failed; a stop before the
    first was asked says nothing of a batch ("its 0 trial(s) marked failed")."""
    monkeypatch.setattr(PPOPopulation, "train_iteration", lambda self: (_ for _ in ()).throw(KeyboardInterrupt))
    where, name = (optuna.study.Study, "ask") if stopped_at == "ask" else (rlspeed.tune, "_mark_failed")
    original = getattr(where, name)
    calls = []

    def stopped(self, *args, **kwargs):
        calls.append(stopped_at)
        if len(calls) == call:  # (a Ctrl-C as the trial is asked, or as the first stopped one is marked)
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    monkeypatch.setattr(where, name, stopped)
    assert cli.main(_command(tmp_path, "--trials", "2")) == 130
    states = _states(tmp_path)
    asked = {("ask", 1): 0, ("ask", 2): 1, ("tell", 2): 2}[stopped_at, call]
    assert len(states) == asked and set(states.values()) <= {"FAIL"}, states
    stderr = capsys.readouterr().err
    assert (f"its {len(states)} trial(s) marked failed" in stderr) == bool(states) and "its 0 trial" not in stderr


def test_written_preset_trains_with_preset_file(tmp_path, capsys):
    assert cli.main(_command(tmp_path, "--trials", "2", "--confirm-seeds", "4")) == 0
    study = optuna.load_study(study_name="ppo-CartPole-v1", storage=f"sqlite:///{tmp_path / 'study.db'}")
    # the completed trials (best first) and the starting configuration, each trained again on 4 new seeds; the
    # best median is written
    candidates = study.user_attrs["confirmation"]["candidates"]
    completed = sorted(study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)), key=lambda t: t.value)
    assert [c["trial"] for c in candidates] == [t.number for t in completed] + [None]
    assert all(len(c["objectives"]) == 4 for c in candidates)
    best = min(candidates, key=lambda c: (c["median"], c["trial"] is not None))["hyperparameters"]
    preset = load_preset_file(tmp_path / "best.yaml", "ppo", "CartPole-v1")
    assert preset["learning_rate"] == best["learning_rate"]  # (to the last digit: rounded, it trained otherwise)
    assert preset["clip_range"] == best["clip_range"]
    assert {key: preset[key] for key in FIXED} == FIXED
    # the shipped preset anneals its clip range over a learn call's steps: the preset trains over the trials' budget,
    # as its trial did (with the starting preset's 100,000 steps the clip range decayed 400 times slower)
    assert preset["anneal_clip"] and preset["total_timesteps"] == 256
    assert preset["eval_freq"] == 128 and preset["target_return"] == 1000
    assert "total_timesteps is the trials' budget" in (tmp_path / "best.yaml").read_text()
    run = tmp_path / "run"
    assert cli.main(["train", "ppo", "CartPole-v1", "--preset", str(tmp_path / "best.yaml"), "--target-return",
                     "none", "--total-timesteps", "128", "--no-progress", "--out", str(run)]) == 0
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["eval_freq"] == 128
    assert config["hyperparameters"]["learning_rate"] == pytest.approx(best["learning_rate"], rel=1e-5)
    assert config["hyperparameters"]["num_steps"] == 16
    # the file names the algorithm it was tuned for: another one is refused in one sentence, not on a key it lacks
    assert cli.main(["train", "a2c", "CartPole-v1", "--preset", str(tmp_path / "best.yaml"), "--total-timesteps",
                     "128", "--no-progress", "--out", str(tmp_path / "a2c")]) == 2
    assert "was tuned for ppo by rlspeed tune, not for a2c" in capsys.readouterr().err


class _PruneOdd(optuna.pruners.BasePruner):
    """Prunes odd-numbered trials at their first report; keeps what tune gives it, as `rlspeed.tune.BatchPruner`."""

    def __init__(self):
        self.reports: dict[int, list[int]] = {}  # trial number -> the steps it was reported at
        self.forgotten: set[int] = set()

    def prune(self, study, trial) -> bool:
        return trial.number % 2 == 1

    def record(self, number: int, step: int, value: float) -> None:
        self.reports.setdefault(number, []).append(step)

    def forget(self, numbers: set[int]) -> None:
        self.forgotten |= numbers


def _never_pruning(monkeypatch) -> _PruneOdd:
    """A pruner that records reports and prunes nothing, made the study's."""
    pruner = _PruneOdd()
    pruner.prune = lambda study, trial: False
    monkeypatch.setattr(rlspeed.tune, "_make_pruner", lambda **kwargs: pruner)
    return pruner


def test_pruned_trials_leave_the_population(tmp_path, monkeypatch):
    pruner = _PruneOdd()
    monkeypatch.setattr(rlspeed.tune, "_make_pruner", lambda **kwargs: pruner)
    evaluated = []  # the members of each evaluation
    original = PPOPopulation.evaluate

    def evaluate(self, seeds, episodes=10, members=None):
        evaluated.append(list(members))
        return original(self, seeds, episodes, members)

    monkeypatch.setattr(PPOPopulation, "evaluate", evaluate)
    said = []
    result = tune(PPO, "CartPole-v1", trials=4, population=4, storage=str(tmp_path / "study.db"),
                  study_name="prune", hyperparameters=dict(FIXED), budget=384, target_return=None, eval_freq=128,
                  search_space=None, confirm_seeds=0, out=tmp_path / "best.yaml", say=lambda *a, **k: said.extend(a))
    study = optuna.load_study(study_name="prune", storage=f"sqlite:///{tmp_path / 'study.db'}")
    trials = study.get_trials(deepcopy=False)
    assert [trial.state.name for trial in trials] == ["COMPLETE", "PRUNED", "COMPLETE", "PRUNED"]
    for trial in trials:  # a pruned member was evaluated once, then removed; the others to the end of the budget
        assert sorted(trial.intermediate_values) == ([128] if trial.number % 2 else [128, 256, 384])
        assert pruner.reports[trial.number] == sorted(trial.intermediate_values)  # the pruner saw every report
    assert pruner.forgotten == {1, 3}  # and dropped the pruned trials' reports
    # the batch's line says which trials were pruned and when, not only how many
    assert "2 pruned (trial 1 at 128, trial 3 at 128 steps)" in next(line for line in said if "batch 1/" in line)
    # the pruned members get no final evaluation (their value is their last report): it cost a batched evaluation
    assert evaluated[-1] == [0, 2]
    assert [trial.user_attrs["final_eval"] is None for trial in trials] == [False, True, False, True]
    assert result["best"]["number"] in (0, 2)
    # without a target, the objective is minus the final evaluation
    assert study.best_value == pytest.approx(-study.best_trial.user_attrs["final_eval"])
    # and the preset says so: without the key, train would stop at the env's reward threshold
    from rlspeed.presets import load_preset_file

    written = load_preset_file(tmp_path / "best.yaml", "ppo", "CartPole-v1")
    assert "target_return" in written and written["target_return"] is None


def test_a_trial_that_left_with_the_target_keeps_reporting_the_return_it_reached(tmp_path, monkeypatch):
    """A member that reached the target leaves the population (stop="each"); its trial goes on reporting that return
    at each later evaluation of the batch, so the pruner compares the slower trials with it too (the population's
    evaluation means are made up here: member 0 at 600 at its first evaluation, then gone, as a member that reached
    a target of 500 is)."""
    pruner = _never_pruning(monkeypatch)
    learn = rlspeed.tune._Setup.learn

    def reached_by_member_0(self, members, on_eval=None):
        def told(num_timesteps, means):
            means = {k: (600.0 if k == 0 else min(mean, 400.0)) for k, mean in means.items()
                     if k != 0 or num_timesteps <= 128}
            return on_eval(num_timesteps, means)
        return learn(self, members, told)

    monkeypatch.setattr(rlspeed.tune._Setup, "learn", reached_by_member_0)
    tune(PPO, "CartPole-v1", trials=2, population=2, storage=str(tmp_path / "study.db"), study_name="left",
         hyperparameters=dict(FIXED), budget=384, target_return=500.0, eval_freq=128, search_space=None,
         confirm_seeds=0, out=tmp_path / "best.yaml", say=lambda *a, **k: None)
    study = optuna.load_study(study_name="left", storage=f"sqlite:///{tmp_path / 'study.db'}")
    first = study.get_trials(deepcopy=False)[0]
    assert first.intermediate_values == {128: -600.0, 256: -600.0, 384: -600.0}
    assert pruner.reports[0] == pruner.reports[1] == [128, 256, 384]


def test_a_trial_whose_member_diverged_fails_and_its_reports_are_forgotten(tmp_path, monkeypatch):
    """A member dropped for non-finite parameters has no final evaluation: its trial is told FAIL (not a result, not
    the best), with the step it diverged at, the pruner forgets its reports, and a further trial takes its place
    (the study runs until `trials` trials finished; the population's summary is made up here: member 1 of the first
    batch diverged at 256 steps)."""
    pruner = _never_pruning(monkeypatch)
    learn = rlspeed.tune._Setup.learn

    def member_1_diverged(self, members, on_eval=None):
        summary = learn(self, members, on_eval)
        if len(summary["members"]) == 2:  # (the first batch's)
            summary["members"][1].update(final_eval=None, diverged_at=256)
        return summary

    monkeypatch.setattr(rlspeed.tune._Setup, "learn", member_1_diverged)
    result = tune(PPO, "CartPole-v1", trials=2, population=2, storage=str(tmp_path / "study.db"),
                  study_name="diverged", hyperparameters=dict(FIXED), budget=256, target_return=None, eval_freq=128,
                  search_space=None, confirm_seeds=0, out=tmp_path / "best.yaml", say=lambda *a, **k: None)
    study = optuna.load_study(study_name="diverged", storage=f"sqlite:///{tmp_path / 'study.db'}")
    trials = study.get_trials(deepcopy=False)
    assert [trial.state.name for trial in trials] == ["COMPLETE", "FAIL", "COMPLETE"]
    assert trials[1].user_attrs["diverged_at"] == 256 and pruner.forgotten == {1}
    assert result["finished"] == 2 and result["best"]["number"] != 1
    # docs/tune.md's Outputs name each attribute a trial holds (`diverged_at` was named nowhere)
    page = (Path(__file__).resolve().parent.parent / "docs" / "tune.md").read_text(encoding="utf-8")
    outputs = page[page.index("## Outputs"):]
    assert [name for trial in trials for name in trial.user_attrs if f"`{name}`" not in outputs] == []


def test_a_search_space_whose_trials_keep_diverging_stops_the_search(tmp_path, monkeypatch):
    """Diverged trials are redone, and a space where every trial diverged (SAC with learning_rate 1e3-1e6) sampled
    and failed batch after batch ("batch 73/1") until Ctrl-C: the search stops in one sentence after 8 in a row (the
    population's summaries are made up here)."""
    batches = []

    def every_member_diverges(self, members, on_eval=None):
        batches.append(len(members.seeds))
        assert len(batches) <= 4, "the search went on sampling diverging trials"
        return {"total_timesteps": 128,
                "members": [{"final_eval": None, "diverged_at": 64, "steps_to_target": None}] * len(members.seeds)}

    monkeypatch.setattr(rlspeed.tune._Setup, "learn", every_member_diverges)
    said = []
    with pytest.raises(UserError, match=r"^The last 8 trials diverged \(non-finite parameters\), none finished"):
        tune(PPO, "CartPole-v1", trials=2, population=2, storage=str(tmp_path / "study.db"), study_name="diverging",
             hyperparameters=dict(FIXED), budget=128, target_return=None, eval_freq=128, search_space=None,
             confirm_seeds=0, out=tmp_path / "best.yaml", say=lambda *a, **k: said.append(a[0]))
    study = optuna.load_study(study_name="diverging", storage=f"sqlite:///{tmp_path / 'study.db'}")
    assert [trial.state.name for trial in study.get_trials(deepcopy=False)] == ["FAIL"] * 8
    assert said[-1].startswith("rlspeed: batch 4/5: trials 6-7: 0 complete, 0 pruned, 2 failed")  # (not "4/1")


def test_objective_orders_reached_before_unreached():
    def member(steps, final):
        return {"steps_to_target": steps, "final_eval": {"mean": final}}

    scores = [objective(member(steps, final), 475.0, 10_000) for steps, final in
              [(2048, 480.0), (9216, 500.0), (None, 470.0), (None, 300.0), (None, 20.0)]]
    assert scores == sorted(scores)
    assert scores[1] < 10_000 < scores[2]
    # a member that reached the target at the last step is ahead of one whose final evaluation alone reached it
    assert objective(member(10_240, 480.0), 475.0, 10_240) < objective(member(None, 480.0), 475.0, 10_240)
    assert objective(member(None, -300.0), -200.0, 1000) > objective(member(None, -250.0), -200.0, 1000)
    assert objective(member(None, 321.0), None, 1000) == -321.0


def test_a_study_another_tool_made_is_refused(tmp_path, capsys):
    """An Optuna study of the same name made by another search (its own trials, direction maximize) was taken over:
    its trials counted as rlspeed's, the best of a maximising study was the worst trial, and confirmation crashed."""
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    foreign = optuna.create_study(study_name="ppo-CartPole-v1", storage=storage, direction="maximize")
    foreign.optimize(lambda trial: trial.suggest_float("x", 0, 1), n_trials=2)
    assert cli_error(capsys, _command(tmp_path, "--trials", "2")) == (
        f"rlspeed: error: Study 'ppo-CartPole-v1' in {tmp_path / 'study.db'} was not made by rlspeed tune (its trials "
        "and direction are another search's); give a new --study-name.")
    assert "rlspeed" not in optuna.load_study(study_name="ppo-CartPole-v1", storage=storage).user_attrs


def test_no_trial_is_pruned_at_its_last_evaluation(tmp_path, monkeypatch):
    """Pruning at the last evaluation saves nothing and threw away a finished trial's result."""
    class PruneAll(_PruneOdd):
        def prune(self, study, trial) -> bool:
            return True

    monkeypatch.setattr(rlspeed.tune, "_make_pruner", lambda **kwargs: PruneAll())
    tune(PPO, "CartPole-v1", trials=2, population=2, storage=str(tmp_path / "study.db"), study_name="last",
         hyperparameters=dict(FIXED), budget=128, target_return=None, eval_freq=128, search_space=None,
         confirm_seeds=0, out=tmp_path / "best.yaml", say=lambda *a, **k: None)
    study = optuna.load_study(study_name="last", storage=f"sqlite:///{tmp_path / 'study.db'}")
    assert [trial.state.name for trial in study.get_trials(deepcopy=False)] == ["COMPLETE", "COMPLETE"]


@pytest.mark.parametrize("extra, space, names", [
    ([], {"net_arch": {"choices": [[64], [64, 64]]}}, "net_arch"),
    ([], {"batch_size": {"choices": [64, 128]}}, "batch_size"),
    ([], {"lernrate": {"low": 1e-4, "high": 1e-3}},
     "unknown hyperparameter 'lernrate' for PPO. Did you mean learning_rate"),
    ([], {"lr": {"low": 1e-4, "high": 1e-3}}, "unknown hyperparameter 'lr' for PPO. Did you mean learning_rate"),
    (["--set", "gamma=0.9"], {"gamma": {"low": 0.9, "high": 0.99}},
     "leaves nothing to search (--set fixed gamma)"),
    ([], {"learning_rate": {"low": 1e-2, "high": 1e-4}}, "low"),
    ([], {"learning_rate": {"low": 0, "high": 1e-3, "log": True}}, "low > 0"),
    ([], {"learning_rate": {"min": 1e-4, "max": 1e-3}}, "unknown field"),
    ([], {"gamma": {"low": 0.9, "high": 1.5, "one_minus": True}}, "below 1"),
    ([], {"clip_range": {"choices": []}}, "choices"),
    ([], {"clip_range": {"choices": [0.1, "0.2"]}}, "choices hold numbers and quoted numbers"),
    ([], {"learning_rate": 1e-3}, "nothing to search"),
    ([], {"gamma": {"low": 0.9, "high": 1.2}}, "gamma"),
    (["--storage", "/no/such/dir/study.db"], None, "does not exist"),
])
def test_bad_tune_input_is_one_sentence(tmp_path, capsys, extra, space, names):
    command = _command(tmp_path, "--trials", "2", *extra)
    if space is not None:
        (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    assert names in cli_error(capsys, command)
    assert not (tmp_path / "best.yaml").exists()


def test_an_out_in_a_directory_that_cannot_be_written_is_said_before_the_search(tmp_path, capsys, monkeypatch):
    """`rlspeed tune` in a read-only working directory (its default --out tuned-ALGO-ENV.yaml) with the study stored
    elsewhere ran every trial and then said "Cannot write the preset"; a --out whose directories do not exist yet is
    tried at the nearest one that does (they are made when the preset is written)."""
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    read_only_directory(monkeypatch, read_only)
    command = _command(tmp_path, "--trials", "2")
    command[command.index("--out") + 1] = str(read_only / "presets" / "best.yaml")
    message = cli_error(capsys, command)
    assert message == (f"rlspeed: error: --out {read_only / 'presets' / 'best.yaml'}: nothing can be written in "
                       f"'{read_only}' (Read-only file system); give --out a file in a directory you can write to.")
    assert not (tmp_path / "study.db").exists()  # (no trial ran)


def test_a_storage_in_a_directory_that_cannot_be_written_is_said_so(tmp_path, capsys, monkeypatch):
    """`rlspeed tune` run where the working directory is read-only (its default --storage rlspeed-tune.db) said only
    SQLite's "unable to open database file"."""
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    read_only_directory(monkeypatch, read_only)
    message = cli_error(capsys, _command(tmp_path, "--trials", "2", "--storage", str(read_only / "study.db")))
    assert "cannot be made in" in message and "a directory you can write to" in message
    assert not (read_only / "study.db").exists()


def test_tune_refuses_what_it_cannot_do(tmp_path, capsys):
    assert "population" in cli_error(capsys, ["tune", "recurrent_ppo", "CartPole-v1", "--storage",
                                              str(tmp_path / "s.db")])
    missing = cli_error(capsys, _command(tmp_path, "--search-space", str(tmp_path / "missing.yaml")))
    assert "search space file" in missing and "missing.yaml: no such file" in missing
    # a study resumed with another budget would mix trials that are not comparable
    assert cli.main(_command(tmp_path, "--trials", "2")) == 0
    capsys.readouterr()
    message = cli_error(capsys, _command(tmp_path, "--trials", "2", "--budget", "384"))  # (the last --budget counts)
    assert "another budget" in message


def test_every_population_has_a_valid_default_search_space():
    """`rlspeed tune ALGO` without --search-space works for each algorithm with a population: its default space
    exists, holds only per-member hyperparameters, and every end of every range is a value the algorithm accepts."""
    from rlspeed.algos import ALGORITHMS
    from rlspeed.population import IMPLEMENTATIONS

    algorithms = {cls.__name__: cls for cls in ALGORITHMS.values()}
    assert {algorithms[name].name for name in IMPLEMENTATIONS} == set(rlspeed.tune.DEFAULT_SPACES)
    for name in IMPLEMENTATIONS:
        space, notes = rlspeed.tune.load_search_space(None, algorithms[name], {})
        assert space == rlspeed.tune.DEFAULT_SPACES[algorithms[name].name] and notes == []


def test_a_resumed_study_prunes_against_the_same_reports(tmp_path, monkeypatch):
    """The pruner compares with the completed trials of earlier batches, in the process that ran them and in one that
    resumes the study alike (a pruned trial's reports do not count in either)."""
    pruners = []

    def keep(**kwargs):
        pruners.append(make_pruner(warmup_steps=0, min_trials=1))  # prunes whatever trails the other trial
        return pruners[-1]

    make_pruner = rlspeed.tune._make_pruner
    monkeypatch.setattr(rlspeed.tune, "_make_pruner", keep)
    kwargs = dict(trials=4, population=2, storage=str(tmp_path / "study.db"), study_name="resume",
                  hyperparameters=dict(FIXED), budget=384, target_return=None, eval_freq=128, search_space=None,
                  confirm_seeds=0, out=tmp_path / "best.yaml", say=lambda *a, **k: None)
    tune(PPO, "CartPole-v1", **kwargs)
    study = optuna.load_study(study_name="resume", storage=f"sqlite:///{tmp_path / 'study.db'}")
    assert "PRUNED" in [trial.state.name for trial in study.get_trials(deepcopy=False)]
    tune(PPO, "CartPole-v1", **kwargs)  # the study is done: it only reopens it
    assert len(pruners) == 2 and pruners[0].reports
    assert pruners[1].reports == pruners[0].reports


def test_choices_of_none_or_auto_beside_numbers_are_a_search_space(tmp_path):
    """SAC's ent_coef may be None or "auto" beside numbers (a population takes them per member): only quoted numbers
    beside numbers are refused."""
    from rlspeed import SAC
    from rlspeed.tune import load_search_space

    path = tmp_path / "space.yaml"
    for choices in ("[null, 0.1]", "[auto, 0.1]"):
        path.write_text(f"ent_coef: {{choices: {choices}}}\n")
        assert load_search_space(path, SAC, {})[0]["ent_coef"]["choices"][1] == 0.1


def test_a_search_space_that_is_not_a_regular_file_is_refused_as_such_not_as_missing(tmp_path):
    """--search-space given a directory or a pipe says what it is (as --preset and checkpoints do; it said "no such
    file"), without reading it (a pipe's read waits for a writer)."""
    from rlspeed.tune import load_search_space

    fifo = tmp_path / "space.yaml"
    os.mkfifo(fifo)
    with pytest.raises(UserError, match=r"^The search space file .* is a device or a pipe, not a regular file: give"):
        load_search_space(fifo, PPO, {})
    with pytest.raises(UserError, match=r"^The search space file .* is a directory, not a regular file: give a YAML"):
        load_search_space(tmp_path, PPO, {})
    with pytest.raises(UserError, match=r"^The search space file .*: no such file; give a YAML file"):
        load_search_space(tmp_path / "missing.yaml", PPO, {})


def test_a_search_space_file_from_python_is_found_at_home_and_named_as_given(tmp_path, monkeypatch):
    """`tune(search_space="~/space.yaml")` was "no such file" where `rlspeed tune --search-space ~/space.yaml` (the
    shell expands it) read the file; and a missing file was named "--search-space" to a Python caller, who gave
    `search_space=`. The file is what both gave: `~` is expanded, and the sentence names the file."""
    from rlspeed.tune import load_search_space

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "space.yaml").write_text("gamma: {low: 0.9, high: 0.99}\n")
    assert load_search_space("~/space.yaml", PPO, {})[0] == {"gamma": {"low": 0.9, "high": 0.99}}
    with pytest.raises(UserError, match=rf"^The search space file {tmp_path}/gone\.yaml: no such file") as refused:
        load_search_space("~/gone.yaml", PPO, {})
    assert "--search-space" not in str(refused.value)


def test_a_batch_line_names_at_most_a_few_pruned_trials_and_counts_the_rest():
    """A batch of --population 2000 whose median pruner stopped a thousand trials printed one line naming each of
    them with its step: the line names the first few (`_PRUNED_NAMED`) and counts the others."""
    from rlspeed.tune import _pruned_when

    assert _pruned_when({}) == ""
    assert _pruned_when({4: 3072, 5: 1024}) == " (trial 4 at 3,072, trial 5 at 1,024 steps)"
    many = _pruned_when({number: 128 for number in range(1_000)})
    named = many.count("trial ")
    assert 2 <= named <= 10 and many.endswith(f"trial {named - 1} at 128 steps, and {1_000 - named:,} more)"), many


def test_a_search_space_at_an_unknown_users_home_is_one_sentence(tmp_path, capsys):
    """`rlspeed tune --search-space ~nosuchuser/space.yaml` (the shell leaves an unknown user's `~` as it is) ended in
    pathlib's RuntimeError "Could not determine home directory." and its traceback once `~` was expanded: one
    sentence naming the path, exit code 2."""
    line = cli_error(capsys, _command(tmp_path, "--search-space", "~rlspeed-no-such-user/space.yaml"))
    assert line == ("rlspeed: error: '~rlspeed-no-such-user/space.yaml': its '~' names a home directory this system "
                    "does not know: give the path in full."), line
    assert not (tmp_path / "study.db").exists()


def test_a_dqn_preset_trains_its_exploration_over_the_trials_budget(tmp_path):
    """DQN's epsilon decays over exploration_fraction of a learn call's steps: with the starting preset's budget the
    preset explored 500 times longer than its trial had."""
    from rlspeed import DQN

    tune(DQN, "CartPole-v1", trials=2, population=2, storage=str(tmp_path / "study.db"), study_name="dqn",
         hyperparameters={"learning_starts": 64, "num_envs": 2}, budget=256, target_return=400.0, eval_freq=128,
         search_space=None, confirm_seeds=0, out=tmp_path / "best.yaml", total_timesteps=100_000,
         say=lambda *a, **k: None)
    preset = load_preset_file(tmp_path / "best.yaml", "dqn", "CartPole-v1")
    assert preset["total_timesteps"] == 256
    assert "schedules (exploration_fraction)" in (tmp_path / "best.yaml").read_text()


def test_one_database_spelled_another_way_is_the_same_study(tmp_path, monkeypatch):
    """`--storage two.db`, `./two.db` and its absolute path name one database: its study's preset was refused as
    another study's."""
    from rlspeed.tune import same_storage

    monkeypatch.chdir(tmp_path)
    assert same_storage("sqlite:///two.db", f"sqlite:///{tmp_path / 'two.db'}")
    assert same_storage("sqlite:///two.db", "sqlite:///./two.db")
    assert not same_storage("sqlite:///two.db", "sqlite:///three.db")
    assert not same_storage("sqlite:///two.db", "postgresql://host/two.db")


def test_tune_does_not_replace_a_file_it_did_not_write(tmp_path, capsys):
    notes = tmp_path / "notes.yaml"
    notes.write_text("my notes\n")
    assert "is not a preset rlspeed tune wrote" in cli_error(capsys, _command(tmp_path, "--out", str(notes)))
    assert notes.read_text() == "my notes\n"
    # a file where a folder of --out's path should be: named as --out's, not as "Cannot read the preset"
    assert cli_error(capsys, _command(tmp_path, "--out", str(notes / "best.yaml"))) == (
        f"rlspeed: error: --out {notes / 'best.yaml'}: '{notes}' is a file, not a directory; give another --out.")


def test_a_second_process_on_a_running_study_and_another_studys_preset_are_refused(tmp_path, capsys):
    """While one process runs a study, another on the same storage and name is refused in one sentence (it marked
    the first one's running trials failed and crashed it); a preset another study wrote is not rewritten."""
    import subprocess
    import sys
    import time

    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from rlspeed.tune import _lock_study\n"
        f"_lock_study({str(tmp_path / 'study.db')!r}, 'ppo-CartPole-v1')\n"
        "print('locked', flush=True)\n"
        "time.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert cli.main(_command(tmp_path, "--trials", "2")) == 75
        assert "Another rlspeed tune is running the study 'ppo-CartPole-v1'" in capsys.readouterr().err
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    time.sleep(0.1)
    (tmp_path / "best.yaml").write_text("# Tuned by rlspeed tune (2026-12-02 10:00 UTC): study 'other' in "
                                        "sqlite:///elsewhere.db.\nCartPole-v1:\n  learning_rate: 0.001\n")
    assert cli.main(_command(tmp_path, "--trials", "2")) == 2
    assert "holds the preset of study 'other'" in capsys.readouterr().err


def test_a_search_space_written_with_exponents_reads_them_as_numbers(tmp_path):
    """`low: 1e-5` (text to YAML 1.1, which PyYAML reads) is the number 1e-5 in a search-space file."""
    from rlspeed.algos import PPO
    from rlspeed.tune import load_search_space

    path = tmp_path / "space.yaml"
    path.write_text("learning_rate: {low: 1e-5, high: 1e-2, log: true}\n")
    space, _ = load_search_space(path, PPO, {}, ())
    assert space["learning_rate"]["low"] == 1e-5 and space["learning_rate"]["high"] == 1e-2
    path.write_text("learning_rate: {low: 1e-5, high: 1e-2}\nlearning_rate: {low: 1e-4, high: 1e-3}\n")
    with pytest.raises(UserError, match="learning_rate twice"):  # (the second range silently replaced the first)
        load_search_space(path, PPO, {}, ())


def test_env_options_reach_every_trial_and_the_preset_names_them(tmp_path, capsys):
    """`--env-kwargs` makes every trial's env with the options (CartPole-v1 with Sutton and Barto's reward: 0 per step,
    -1 at the end, so no return is positive), the study records them and the preset says to give them to train."""
    command = [item for item in _command(tmp_path, "--trials", "2", "--confirm-seeds", "0", "--env-kwargs",
                                         "sutton_barto_reward=true") if item != "1000"]
    command[command.index("--target-return") + 1:command.index("--target-return") + 1] = ["none"]
    assert cli.main(command) == 0
    assert "reached the target" not in capsys.readouterr().out  # (there is none: no count of trials reaching it)
    study = optuna.load_study(study_name="ppo-CartPole-v1", storage=f"sqlite:///{tmp_path / 'study.db'}")
    assert study.user_attrs["rlspeed"]["env_kwargs"] == {"sutton_barto_reward": True}
    finals = [trial.user_attrs["final_eval"] for trial in study.get_trials(deepcopy=False)]
    assert len(finals) == 2 and all(value <= 0 for value in finals)
    assert "# Tuned on the env made with options: train with --env-kwargs sutton_barto_reward=true" in (
        tmp_path / "best.yaml").read_text()
    without = [item for item in command if item not in ("--env-kwargs", "sutton_barto_reward=true")]
    capsys.readouterr()
    assert cli.main(without) == 2  # (the study's options are named: the message named nothing)
    assert "was made with another env_kwargs" in capsys.readouterr().err


def test_eval_episodes_sets_every_evaluation_of_the_trials_and_the_study_records_it(tmp_path, capsys, monkeypatch):
    """`--eval-episodes N`, as for train: every evaluation of the trials, their final ones included, plays N episodes
    (10 before), and the study records N, so that resuming it with another number is refused as for its other
    settings."""
    from rlspeed.population.ppo import PPOPopulation

    played: list[int] = []
    evaluate = PPOPopulation.evaluate

    def counting(self, seeds=None, episodes=10, members=None):
        played.append(episodes)
        return evaluate(self, seeds, episodes, members)

    monkeypatch.setattr(PPOPopulation, "evaluate", counting)
    command = _command(tmp_path, "--trials", "2", "--confirm-seeds", "0")
    assert cli.main([*command, "--eval-episodes", "2"]) == 0
    assert played == [2, 2, 2]  # (at 128 and 256 steps, then the final evaluation)
    study = optuna.load_study(study_name="ppo-CartPole-v1", storage=f"sqlite:///{tmp_path / 'study.db'}")
    assert study.user_attrs["rlspeed"]["eval_episodes"] == 2
    capsys.readouterr()
    assert "was made with another eval_episodes" in cli_error(capsys, [*command, "--trials", "4"])


def test_a_study_made_with_another_preset_names_the_values_it_was_made_with(tmp_path, capsys):
    """A study an older rlspeed made, whose preset for the pair has changed since, is refused on the same command: the
    refusal names the study's values (it said "resume it with the same command", which the user had given)."""
    command = _command(tmp_path, "--confirm-seeds", "0")
    assert cli.main([*command, "--trials", "2"]) == 0
    study = optuna.load_study(study_name="ppo-CartPole-v1", storage=f"sqlite:///{tmp_path / 'study.db'}")
    made_for = study.user_attrs["rlspeed"]
    made_for["hyperparameters"] = {**made_for["hyperparameters"], "n_epochs": 4, "gamma": 0.98}
    del made_for["hyperparameters"]["batch_size"]
    study.set_user_attr("rlspeed", {**made_for, "eval_freq": 64})  # (as an older preset would have it)
    capsys.readouterr()
    message = cli_error(capsys, [*command, "--trials", "4"])
    assert all(part in message for part in ("n_epochs 4", "gamma 0.98", "batch_size unset",
                                            "eval_freq (64 in the study)", "--preset FILE"))


def test_a_study_of_another_algorithm_or_env_is_refused_naming_them(tmp_path, capsys):
    """`rlspeed tune dqn CartPole-v1 --study-name ppo-CartPole-v1` was refused with every hyperparameter the two
    setups differ in and advice to give the study's values back with --preset FILE: another algorithm's study is
    not one to resume; the refusal says whose study it is."""
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="ppo-CartPole-v1", storage=storage, direction="minimize")
    study.set_user_attr("rlspeed", {"algo": "dqn", "env_id": "Acrobot-v1", "budget": 1000, "target_return": None,
                                    "eval_freq": 500, "hyperparameters": {"learning_starts": 100}, "search_space": {}})
    message = cli_error(capsys, _command(tmp_path, "--trials", "2"))
    assert message == (f"rlspeed: error: Study 'ppo-CartPole-v1' in {tmp_path / 'study.db'} tunes dqn on Acrobot-v1, "
                       "not ppo on CartPole-v1: give a new --study-name (its trials are kept apart).")


@pytest.mark.parametrize("winner", ["worst trial", "starting"])
def test_the_last_line_names_the_configuration_written_by_its_confirmation_median(tmp_path, monkeypatch, winner):
    """After a confirmation the last line said "best trial N: <N's own one-seed result>" for the candidate chosen on
    the confirmation seeds, which need not be the study's best trial (the one optuna-dashboard shows), and without
    the median the choice was made on; where the starting configuration won, it named no train command."""
    def confirm(setup, study, top, seeds_each, say):
        worst = max(study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)), key=lambda t: t.value)
        won, lost = (123.0, 456.0) if winner == "worst trial" else (456.0, 123.0)
        return {"seeds": [7, 8, 9, 10], "candidates": [
            {"trial": worst.number, "hyperparameters": worst.user_attrs["hyperparameters"], "median": won},
            {"trial": None, "hyperparameters": rlspeed.tune._starting_values(setup), "median": lost}]}

    monkeypatch.setattr(rlspeed.tune, "_confirm", confirm)
    said = []
    result = tune(PPO, "CartPole-v1", trials=2, population=2, storage=str(tmp_path / "study.db"), study_name="last",
                  hyperparameters=dict(FIXED), budget=128, target_return=None, eval_freq=128, search_space=None,
                  confirm_seeds=2, out=tmp_path / "best.yaml", say=lambda *a, **k: said.append(a[0]))
    chosen = result["best"]["number"]
    if winner == "worst trial":
        assert said[-1].startswith(f"rlspeed: chosen: trial {chosen}, median objective 123 on 2 new seeds")
    else:
        assert chosen is None and "the starting configuration on the confirmation seeds (median objective 123" in \
            said[-1]
    assert said[-1].endswith(f"preset written to {tmp_path / 'best.yaml'} (rlspeed train ppo CartPole-v1 --preset "
                             f"{tmp_path / 'best.yaml'})")


def test_the_preset_names_its_study_when_the_storage_path_has_a_space():
    """A storage path with a space was not read back from a preset's first line, so another study's preset at --out
    was rewritten without a word."""
    from rlspeed.tune import PRESET_HEADER, preset_study

    first = f"{PRESET_HEADER} (2026-12-04 10:00 UTC): study '我的 研究' in sqlite:////tmp/调参 库.db.\n"
    assert preset_study(first + "CartPole-v1:\n  n_steps: 32\n") == ("我的 研究", "sqlite:////tmp/调参 库.db")


def test_the_commands_a_study_suggests_give_back_its_env_and_options(tmp_path):
    """The train command a study prints and the options its preset names are pasted into a shell: they dropped the
    module registering the env, were not quoted (a space split a value) and wrote text as \\u escapes (which
    --env-kwargs then took literally)."""
    import shlex

    from rlspeed.algos import PPO
    from rlspeed.tune import _env_kwargs_arguments, _train_command

    options = {"模式": "困难 模式", "size": 3, "flags": [1, 2]}
    command = _train_command(PPO, "中文/平衡杆-v0", tmp_path / "预设 文件.yaml", options, ("中文环境",), 3)
    args = cli.build_parser().parse_args(shlex.split(command)[1:])
    assert (args.env_id, args.preset, args.gym_packages) == ("中文/平衡杆-v0", str(tmp_path / "预设 文件.yaml"),
                                                             ["中文环境"])
    assert args.eval_episodes == 3  # (tune's --eval-episodes: the command dropped it, and trained evaluating 10)
    assert cli._parse_set(args.env_kwargs, "--env-kwargs") == options
    assert "\\u" not in shlex.join(_env_kwargs_arguments(options))


def test_a_preset_from_a_directory_whose_name_is_not_utf8_is_utf8():
    """The header of a study stored under a directory named in another encoding held the raw byte, and `rlspeed
    train --preset` (which reads UTF-8) refused the file tune had just written."""

    from rlspeed.tune import utf8_text

    storage = "sqlite:///" + os.fsdecode(b"/tmp/tu\xffne/s.db")
    assert utf8_text(storage) == "sqlite:////tmp/tu\\udcffne/s.db"
    assert utf8_text(storage).encode("utf-8") and utf8_text("调参 库") == "调参 库"


def test_tune_lets_go_of_the_study_and_optunas_verbosity_when_it_returns(tmp_path, monkeypatch):
    """A notebook or sweep driver calling tune in-process kept the study's lock until the process exited (another
    process was refused the study: "Another rlspeed tune is running") and Optuna's log level lowered for good."""
    import fcntl

    optuna.logging.set_verbosity(optuna.logging.INFO)
    lock = tmp_path / "study.db.ppo-CartPole-v1.lock"
    taken = []
    original = fcntl.flock

    def flock(handle, operation):  # (the lock file exists while tune holds it)
        taken.append(os.path.samefile(handle.fileno(), lock))
        return original(handle, operation)

    monkeypatch.setattr(fcntl, "flock", flock)
    assert cli.main(_command(tmp_path, "--trials", "2", "--confirm-seeds", "0")) == 0
    assert optuna.logging.get_verbosity() == optuna.logging.INFO
    assert taken == [True] and not rlspeed.tune._LOCKS
    # its file is removed as it lets go (one stayed beside the database for every study run)
    assert not list(tmp_path.glob("*.lock"))


def test_a_lock_file_removed_as_its_holder_lets_go_is_never_held_twice(tmp_path, monkeypatch):
    """tune removes its lock file as it lets go: a process that opened the file just before and locks it just after
    holds a file no longer at its path, so a third one, making the file anew, would lock it too. The second one
    finds the file gone and locks the one at the path."""
    import fcntl

    from rlspeed.errors import Busy
    from rlspeed.locks import hold_lock, let_go

    lock = tmp_path / "study.db.NAME.lock"
    first, second = {}, {}
    hold_lock(lock, first, "busy")
    original = fcntl.flock

    def flock(handle, operation):  # (the first lets go between the second's open and its lock)
        if first:
            let_go(next(iter(first)), first, remove=True)
        return original(handle, operation)

    monkeypatch.setattr(fcntl, "flock", flock)
    hold_lock(lock, second, "busy")
    ((key, handle),) = second.items()
    assert os.path.samefile(handle.fileno(), lock)  # (the file at the path, not the removed one)
    with pytest.raises(Busy):
        hold_lock(lock, {}, "busy")
    let_go(key, second, remove=True)
    assert not lock.exists()


class _PruneNone(_PruneOdd):
    def prune(self, study, trial) -> bool:
        return False


def test_the_studys_confirmation_is_never_an_older_best_trials(tmp_path, monkeypatch):
    """The study's `confirmation` attribute measured the finalists of its time: a batch that completes better trials
    (here: two more finalists) clears it, and so does a confirmation that starts over; one interrupted left the older
    confirmation, of other trials, beside a preset it did not choose."""
    monkeypatch.setattr(rlspeed.tune, "_make_pruner", lambda **kwargs: _PruneNone())
    storage = tmp_path / "study.db"
    kwargs = dict(population=2, storage=str(storage), study_name="confirm", hyperparameters=dict(FIXED), budget=256,
                  target_return=None, eval_freq=128, search_space=None, confirm_seeds=1, confirm_top=4,
                  out=tmp_path / "best.yaml", say=lambda *a, **k: None)

    def confirmation():
        return optuna.load_study(study_name="confirm", storage=f"sqlite:///{storage}").user_attrs.get("confirmation")

    tune(PPO, "CartPole-v1", trials=2, **kwargs)
    assert {c["trial"] for c in confirmation()["candidates"]} == {0, 1, None}
    original = rlspeed.tune._Setup.learn
    calls = {"batches": 0}

    def learn(self, members, on_eval=None):
        if on_eval is None:  # the confirmation: Ctrl-C
            raise KeyboardInterrupt
        calls["batches"] += 1
        if calls["batches"] == 2:  # Ctrl-C in the second batch, after one that completed trials 2 and 3
            raise KeyboardInterrupt
        return original(self, members, on_eval)

    monkeypatch.setattr(rlspeed.tune._Setup, "learn", learn)
    with pytest.raises(KeyboardInterrupt):
        tune(PPO, "CartPole-v1", trials=6, **kwargs)
    assert confirmation() is None
    assert "Not confirmed yet" in (tmp_path / "best.yaml").read_text()
    # the same finalists on other seeds: the confirmation starts over, and an interrupted one leaves none
    monkeypatch.setattr(rlspeed.tune._Setup, "learn", original)
    tune(PPO, "CartPole-v1", trials=4, **kwargs)
    assert len(confirmation()["candidates"]) == 5
    monkeypatch.setattr(rlspeed.tune._Setup, "learn", learn)
    with pytest.raises(KeyboardInterrupt):
        tune(PPO, "CartPole-v1", trials=4, **{**kwargs, "confirm_seeds": 2})
    assert confirmation() is None


def test_every_hand_edit_of_the_preset_is_kept(tmp_path):
    """Each rewrite of a preset edited by hand keeps the edit under a name no earlier edit holds (a second edit
    replaced FILE.edited, the first one, which was lost) and says where."""
    command = _command(tmp_path, "--trials", "2", "--confirm-seeds", "0")
    assert cli.main(command) == 0
    preset = tmp_path / "best.yaml"
    edits = []
    for number in (4, 2):
        edits.append(preset.read_text().replace("num_envs: 8", f"num_envs: {number}"))
        preset.write_text(edits[-1])
        kept = tmp_path / ("best.yaml.edited" + (".1" if number == 2 else ""))
        with pytest.warns(UserWarning, match=f"the edited file is kept as {re.escape(str(kept))}\\."):
            assert cli.main(command) == 0  # (the study is done: the preset is written again)
    assert (tmp_path / "best.yaml.edited").read_text() == edits[0]
    assert (tmp_path / "best.yaml.edited.1").read_text() == edits[1]
    assert "num_envs: 8" in preset.read_text()


def test_tune_without_optuna_is_one_sentence_from_python_and_the_cli(monkeypatch, capsys):
    """`rlspeed.tune.tune` from Python raised a bare ModuleNotFoundError where the CLI named the pip command."""
    import sys

    monkeypatch.setitem(sys.modules, "optuna", None)
    monkeypatch.setitem(sys.modules, "optuna.trial", None)
    with pytest.raises(UserError, match=r"needs Optuna: pip install optuna \(or \"rlspeed\[tune\]\"\)"):
        tune(PPO, "CartPole-v1", trials=2, population=2, storage="unused.db", study_name="s", hyperparameters={},
             budget=256, target_return=None, eval_freq=None, out="unused.yaml")
    assert "needs Optuna: pip install optuna" in cli_error(capsys, ["tune", "ppo", "CartPole-v1"])


def test_the_preset_is_never_written_through_a_link_planted_beside_it(tmp_path):
    """The preset was written to `OUT.tmp` (a fixed name) opened as it stood: a symlink planted there by anyone who
    can write to the preset's directory made tune overwrite the file it points at (and left OUT a link to it)."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / "best.yaml.tmp").symlink_to(victim)
    assert cli.main(_command(tmp_path, "--trials", "2", "--confirm-seeds", "0")) == 0
    assert victim.read_text() == "precious\n"
    preset = tmp_path / "best.yaml"
    assert not preset.is_symlink() and load_preset_file(preset, "ppo", "CartPole-v1")


def test_a_storage_password_is_never_printed_or_written(tmp_path, capsys):
    """A database server's storage URL (`postgresql://user:PASSWORD@host/db`, Optuna's way to name one) was printed
    as given: in the error when it cannot be opened, the study line, and the preset's header and `# Command:` line,
    which are shared with the tuned hyperparameters."""
    url = "postgresql+psycopg2://tuner:hunter2@127.0.0.1:1/optuna"
    code = cli.main(["tune", "ppo", "CartPole-v1", "--storage", url, "--trials", "2", "--out",
                     str(tmp_path / "best.yaml")])
    said = capsys.readouterr()
    assert code == 2 and "--storage postgresql+psycopg2://tuner:***@127.0.0.1:1/optuna" in said.err
    assert "hunter2" not in said.out + said.err
    from rlspeed.tune import without_password

    command = f"rlspeed tune ppo CartPole-v1 --storage {url} --out best.yaml"
    assert without_password(command) == ("rlspeed tune ppo CartPole-v1 --storage "
                                          "postgresql+psycopg2://tuner:***@127.0.0.1:1/optuna --out best.yaml")
    # (a file path is no URL: an '@' or ':' in it stays)
    assert without_password("sqlite:////data/a:b@c.db") == "sqlite:////data/a:b@c.db"
    tune(PPO, "CartPole-v1", trials=2, population=2, storage=str(tmp_path / "study.db"), study_name="pw",
         hyperparameters=dict(FIXED), budget=256, target_return=None, eval_freq=128, search_space=None,
         confirm_seeds=0, out=tmp_path / "best.yaml", command=command, say=lambda *a, **k: None)
    preset = (tmp_path / "best.yaml").read_text()
    assert "hunter2" not in preset and "# Command: " + without_password(command) in preset



def test_a_preset_naming_its_storage_with_the_password_is_the_same_study_s(tmp_path, capsys):
    """A preset written before passwords were shown as *** names the storage URL with its password: the same study
    given again was refused as another study's, in an error that printed the password from the file."""
    url = "postgresql+psycopg2://tuner:hunter2@127.0.0.1:1/optuna"
    preset = tmp_path / "best.yaml"
    preset.write_text(f"# Tuned by rlspeed tune (2026-01-01 00:00 UTC): study 'pw' in {url}.\nppo:\n  gamma: 0.99\n")
    code = cli.main(["tune", "ppo", "CartPole-v1", "--storage", url, "--study-name", "pw", "--trials", "2", "--out",
                     str(preset)])
    err = capsys.readouterr().err
    # (the study's own error: no server there, or no driver for it)
    assert code == 2 and "--storage postgresql+psycopg2://tuner:***@127.0.0.1:1/optuna: " in err
    assert "hunter2" not in err


def test_a_server_storage_without_its_database_driver_names_the_package_to_install(tmp_path, monkeypatch, capsys):
    """A database server's URL whose driver is not installed was "cannot open it as an Optuna storage (Failed to import
    DB access module for the specified storage URL. Please install appropriate one.)", naming neither."""
    monkeypatch.setitem(sys.modules, "psycopg2", None)  # (not installed, whether it is here or not)
    code = cli.main(["tune", "ppo", "CartPole-v1", "--storage", "postgresql+psycopg2://tuner:hunter2@127.0.0.1:1/optuna",
                     "--trials", "2", "--out", str(tmp_path / "best.yaml")])
    err = capsys.readouterr().err
    assert code == 2 and err.endswith("the Python module psycopg2, is not installed: pip install psycopg2-binary, or "
                                      "name an installed driver in the URL (postgresql+DRIVER://...).\n"), err
    assert "hunter2" not in err and not (tmp_path / "best.yaml").exists()


def test_a_storage_that_fills_up_while_the_study_runs_is_one_sentence(tmp_path, monkeypatch, capsys):
    """A full disk under the study's SQLite file while trials report ("database or disk is full") was a traceback of
    Optuna's and SQLAlchemy's (exit code 1), the batch's handler failing again as it marked the trials failed. It is
    one sentence with exit code 2; the trials stay in the storage, and the same command goes on once there is room."""
    import sqlalchemy.exc
    from optuna.exceptions import StorageInternalError
    from optuna.storages import RDBStorage

    def full(*args, **kwargs):
        cause = sqlalchemy.exc.OperationalError("UPDATE trials", {}, Exception("database or disk is full"))
        raise StorageInternalError("An exception is raised during the commit.") from cause

    command = _command(tmp_path, "--trials", "2", "--confirm-seeds", "0")
    monkeypatch.setattr(RDBStorage, "set_trial_intermediate_value", full)  # (a trial's report)
    monkeypatch.setattr(RDBStorage, "set_trial_state_values", full)  # (and marking it failed)
    assert cli.main(command) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    assert captured.err.strip().splitlines()[-1] == (
        f"rlspeed: error: The study's storage sqlite:///{tmp_path / 'study.db'} cannot be written "
        "((builtins.Exception) database or disk is full): the trials it holds are kept; run the same command again "
        "once it can be written (a full disk: free some space) to go on with the study.")
    assert "left running in the storage (the next run marks them failed)" in captured.err
    monkeypatch.undo()
    assert cli.main(command) == 0
    assert set(_states(tmp_path).values()) <= {"FAIL", "COMPLETE", "PRUNED"}


@pytest.mark.parametrize("made", ["during the search", "as it is written"])
def test_a_preset_another_study_wrote_during_the_search_is_not_replaced(tmp_path, monkeypatch, capsys, made):
    """Two studies started at once with the same --out (a job array on the tuned-ALGO-ENV.yaml default) both found
    no file there: the one that writes second is refused in one sentence, the first one's preset stays, and the
    study keeps its trials (the same command with another --out writes its preset)."""
    other = ("# Tuned by rlspeed tune (2026-12-02 10:00 UTC): study 'other' in sqlite:///elsewhere.db.\n"
             "CartPole-v1:\n  learning_rate: 0.001\n")
    name = "_run_batch" if made == "during the search" else "write_atomic"
    original = getattr(rlspeed.tune, name)

    def another_study_writes_first(*args, **kwargs):
        if not (tmp_path / "best.yaml").exists():
            (tmp_path / "best.yaml").write_text(other)
        return original(*args, **kwargs)

    monkeypatch.setattr(rlspeed.tune, name, another_study_writes_first)
    assert cli.main(_command(tmp_path, "--trials", "2", "--confirm-seeds", "0")) == 2
    assert re.search(r"holds the preset of study 'other'.*the study keeps its trials", capsys.readouterr().err)
    assert (tmp_path / "best.yaml").read_text() == other
    assert [path.name for path in tmp_path.iterdir() if path.name.startswith(".")] == []  # (no temporary file)
    assert set(_states(tmp_path).values()) <= {"COMPLETE", "PRUNED"}
    monkeypatch.setattr(rlspeed.tune, name, original)
    assert cli.main(_command(tmp_path, "--trials", "2", "--confirm-seeds", "0", "--out", str(tmp_path / "b.yaml"))) == 0
    assert (tmp_path / "b.yaml").is_file() and (tmp_path / "best.yaml").read_text() == other


def test_a_presets_paths_the_locale_could_not_read_are_written_as_their_utf8_characters(tmp_path):
    """Under LC_ALL=C without UTF-8 mode a path's UTF-8 bytes reach Python as surrogates, and the preset's header
    wrote `tun\\udcc3\\udca9` for `tuné`; the same study run under a UTF-8 locale then took its own preset for another
    study's and refused to write it. The header names it `tuné`, the study accepts its preset under either locale,
    and a byte that is no UTF-8 is still an escape."""
    from conftest import run_in_ascii_locale

    from rlspeed.tune import PRESET_HEADER, refuse_others_file, utf8_text

    as_read_under_c = b"sqlite:////tmp/tun\xc3\xa9 \xff/s.db".decode("ascii", "surrogateescape")
    assert utf8_text(as_read_under_c) == "sqlite:////tmp/tuné \\udcff/s.db"
    out = tmp_path / "best.yaml"
    out.write_text(f"{PRESET_HEADER} (2026-12-06 10:00 UTC): study 'étude' in sqlite:///{tmp_path}/tuné/s.db.\n",
                   encoding="utf-8")
    refuse_others_file(out, "étude", f"sqlite:///{tmp_path}/tuné/s.db")  # (a UTF-8 locale's command line)
    script = (  # (the same study as the command line gives it under LC_ALL=C: no refusal)
        "import os\n"
        "from rlspeed.tune import refuse_others_file\n"
        f"out = os.fsdecode({bytes(out)!r})\n"
        f"storage = os.fsdecode(b'sqlite:///' + {bytes(tmp_path)!r} + b'/tun\\xc3\\xa9/s.db')\n"
        "refuse_others_file(out, os.fsdecode(b'\\xc3\\xa9tude'), storage)\n"
        "try:\n"
        "    refuse_others_file(out, os.fsdecode(b'\\xc3\\xa9tude'), storage.replace('s.db', 'other.db'))\n"
        "except Exception as error:\n"
        "    print(type(error).__name__)\n")
    assert run_in_ascii_locale(script).split() == ["UserError"]


def test_the_confirmation_trains_at_most_population_members_at_once(tmp_path, monkeypatch):
    """The confirmation trained its candidates' seeds as one population (5 x --confirm-seeds members, 80 by
    default) whatever --population bounded memory and CPU to; in chunks of --population, each member scores as it
    did among all of them (members are independent)."""
    import rlspeed.population

    made, seeded = [], []
    original = rlspeed.population.Population

    def counted(algo_cls, env_id, seeds, **kwargs):
        made.append(len(seeds))
        seeded.extend(seeds)
        return original(algo_cls, env_id, seeds, **kwargs)

    monkeypatch.setattr(rlspeed.population, "Population", counted)
    confirmations = {}
    for population in (2, 4):  # (2 trials: one batch, the same trials either way)
        made.clear()
        result = tune(PPO, "CartPole-v1", trials=2, population=population, storage=str(tmp_path / f"{population}.db"),
                      study_name="chunks", hyperparameters=dict(FIXED), budget=256, target_return=60, eval_freq=128,
                      search_space=None, confirm_seeds=3, confirm_top=1, out=tmp_path / f"{population}.yaml",
                      say=lambda *a, **k: None, progress_bar=False)
        # (the probe, the batch, then the confirmation's 2 candidates x 3 seeds)
        assert made == ([1, 2, 2, 2, 2] if population == 2 else [1, 2, 4, 2])
        # every trial trains on the study's seed, and every candidate on the same confirmation seeds: configurations
        # are compared on common seeds (trial n took seed + n, candidate j seeds no other candidate used)
        assert seeded[:3] == [0, 0, 0] and seeded[3:] == [1_000_000, 1_000_001, 1_000_002] * 2, seeded
        seeded.clear()
        confirmations[population] = result["confirmation"]
    assert confirmations[2] == confirmations[4]


def test_the_confirmation_of_a_study_of_the_largest_seed_trains_on_seeds_a_model_takes(monkeypatch):
    """--seed is any seed below 2**32, which every trial now trains with: the confirmation's seeds (seed + 1,000,000
    + i) passed 2**32 for the largest ones, and a study failed after all its trials, when its confirmation built its
    first population ('A seed is a whole number from 0 to 2**32 - 1'). They wrap below 2**32, still new seeds, the
    same ones for every candidate."""
    import optuna

    class Built(Exception):
        pass

    built = []

    def built_only(self, members):  # (the populations built are what is checked, not their training)
        built.append(members.seeds)
        raise Built

    monkeypatch.setattr(rlspeed.tune._Setup, "learn", built_only)
    largest = 2**32 - 1
    setup = rlspeed.tune._Setup(PPO, "CartPole-v1", dict(FIXED), SPACE, 256, None, 128, largest, "cpu", 256,
                                at_once=4)
    study = optuna.create_study(direction="minimize")
    study.add_trial(optuna.trial.create_trial(value=1.0, params={}, distributions={},
                                              user_attrs={"seed": largest, "hyperparameters": {
                                                  "learning_rate": 1e-3, "clip_range": 0.2}}))
    with pytest.raises(Built):
        rlspeed.tune._confirm(setup, study, top=1, seeds_each=2, say=lambda *a, **k: None)
    assert built == [[999_999, 1_000_000, 999_999, 1_000_000]], built  # (2 candidates x 2 seeds)


def test_a_database_servers_running_trials_are_failed_only_when_asked(tmp_path, monkeypatch, capsys):
    """A database server's storage is not locked, so its running trials may be another rlspeed tune's, running the
    study now: marked failed at start-up, that process's report and tell failed. They are kept, and said, unless
    --fail-running asks."""
    # (no server here: the file stands in)
    monkeypatch.setattr(rlspeed.tune, "_on_server", lambda storage: True)
    quick = ("--confirm-seeds", "0", "--budget", "128")
    assert cli.main(_command(tmp_path, "--trials", "2", *quick)) == 0
    study = optuna.load_study(study_name="ppo-CartPole-v1", storage=f"sqlite:///{tmp_path / 'study.db'}")
    other = study.ask()  # (another process's trial, training)
    capsys.readouterr()
    assert cli.main(_command(tmp_path, "--trials", "4", *quick)) == 0
    assert _states(tmp_path)[other.number] == "RUNNING"
    assert ("1 trial(s) of the study are running, left as they are (another process's, or a killed one's: "
            "--fail-running marks them failed") in capsys.readouterr().out
    assert cli.main(_command(tmp_path, "--trials", "4", *quick, "--fail-running")) == 0
    assert _states(tmp_path)[other.number] == "FAIL"
    assert "1 trial(s) left running by an earlier process marked failed" in capsys.readouterr().out


def test_a_trials_final_evaluation_says_how_many_episodes_were_cut_short(tmp_path, capsys, monkeypatch):
    """On an env whose episodes never end, the best trial's final evaluation (its batch line, the last line and the
    preset's header) says how many of its episodes were still running at the step limit, counted with the return
    collected by then (the warning of them shows once)."""
    import warnings

    from conftest import endless_pendulum_id

    import rlspeed.evaluation

    monkeypatch.setattr(rlspeed.evaluation, "UNLIMITED_EPISODE_STEPS", 5)  # (10,000 steps: the same, slower)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = cli.main(["tune", "ppo", endless_pendulum_id(), "--population", "1", "--trials", "1", "--budget", "8",
                         "--eval-episodes", "2", "--confirm-seeds", "0", "--storage", str(tmp_path / "study.db"),
                         "--out", str(tmp_path / "best.yaml"), "--no-progress", "--set", "num_envs=1", "--set",
                         "num_steps=8", "--set", "batch_size=8"])
    lines = [line for line in capsys.readouterr().out.splitlines() if "best trial 0: final eval" in line]
    assert code == 0 and len(lines) == 2, lines
    assert all(re.search(r"final eval -?[\d.]+, 2 of 2 cut short at the step limit \(", line) for line in lines), lines
    assert re.search(r"final evaluation -?[\d.]+, 2 of 2 cut short at the step limit;",
                     (tmp_path / "best.yaml").read_text(encoding="utf-8"))


def test_a_study_an_older_rlspeed_made_without_an_eval_freq_goes_on_at_its_trials_interval(tmp_path, monkeypatch):
    """Without --eval-freq or a preset's, an older rlspeed's trials evaluated every 10,000 steps (its populations'
    default then) and its study recorded no interval; a resumed study's further trials evaluated at this rlspeed's
    default (a 40th of the budget, at least 2,048), so their reports and steps to the target were measured on another
    grid than the earlier trials' they are ranked and pruned against. They evaluate as the earlier trials did; a new
    study records its interval and keeps the default."""
    given: list = []
    learn = PPOPopulation.learn

    def spying(self, total_timesteps, **kwargs):
        given.append(kwargs.get("eval_freq"))
        return learn(self, total_timesteps, **kwargs)

    monkeypatch.setattr(PPOPopulation, "learn", spying)
    said: list[str] = []
    kwargs = dict(population=1, storage=str(tmp_path / "study.db"), study_name="older",
                  hyperparameters=dict(FIXED), budget=128, target_return=None, eval_freq=None, search_space=None,
                  confirm_seeds=0, eval_episodes=1, out=tmp_path / "best.yaml", say=lambda *a, **k: said.append(a[0]))
    tune(PPO, "CartPole-v1", trials=1, **kwargs)
    assert given == [None]  # (the population's default)
    study = optuna.load_study(study_name="older", storage=f"sqlite:///{tmp_path / 'study.db'}")
    older = {key: value for key, value in study.user_attrs["rlspeed"].items() if key != "default_eval_freq"}
    study.set_user_attr("rlspeed", older)  # (as an older rlspeed recorded it)
    tune(PPO, "CartPole-v1", trials=2, **kwargs)
    assert given == [None, 10_000]
    assert any("made by an older rlspeed: its trials evaluate every 10,000 steps" in line for line in said)


def test_a_study_resumed_with_another_eval_freq_is_refused_naming_only_the_settings_given(tmp_path):
    """A study made without --eval-freq records the interval its trials evaluate at; resumed with --eval-freq, the
    refusal names eval_freq, not the record's internal default_eval_freq."""
    made_for = {"algo": "ppo", "env_id": "CartPole-v1", "budget": 256, "target_return": None, "eval_freq": None,
                "default_eval_freq": 2048, "hyperparameters": {}, "search_space": {}}
    record = {**{key: value for key, value in made_for.items() if key != "default_eval_freq"}, "eval_freq": 128}
    assert rlspeed.tune._changed_setup(made_for, record) == "eval_freq (unset in the study)"


def test_a_population_whose_members_cannot_fit_is_refused_before_any_trial_is_asked(tmp_path, monkeypatch, capsys):
    """`rlspeed tune --population 200000` asked Optuna for every trial (a storage write each, minutes without a word)
    before the population's members were checked against memory, and the refusal then named --seeds. One member is
    now built and checked as one of the largest population the run would build, before the study is touched."""
    from rlspeed.buffers import replay

    monkeypatch.setattr(replay, "available_memory", lambda device, needed=None: (2**26, replay.HOST))  # (64 MiB)
    monkeypatch.setattr(optuna.study.Study, "ask", lambda *args, **kwargs: pytest.fail("a trial was asked for"))
    line = cli_error(capsys, _command(tmp_path, "--trials", "100000", "--population", "100000"))
    assert "A population of 100,000 members (--population; population= in Python)" in line
    assert re.search(r"train at most [\d,]+ members at once \(for example --population \d+\)", line), line
    with pytest.raises(UserError, match=r"A population of 1,000 members \(--population; population= in Python\)"):
        tune(PPO, "CartPole-v1", trials=1000, population=5000, storage=str(tmp_path / "study.db"), study_name="big",
             hyperparameters=dict(FIXED), budget=256, target_return=None, eval_freq=128, search_space=None,
             confirm_seeds=0, out=tmp_path / "best.yaml", say=lambda *a, **k: None)
    assert not (tmp_path / "study.db").exists()  # (no study, no trial)


def test_asking_for_a_large_population_of_trials_says_how_far_it_is(tmp_path, monkeypatch, capsys):
    """`rlspeed tune --population 2000` asked Optuna for its trials and sampled them (storage writes each: 10 minutes
    and more) without a word after its first line. Where the second trial says the rest would take longer than
    BUILD_PROGRESS_S, the loop is counted (status lines here, stderr being no terminal)."""
    from rlspeed.population import base

    monkeypatch.setattr(base, "BUILD_PROGRESS_S", 0.0)  # (any loop is long)
    monkeypatch.setattr(rlspeed.tune._Setup, "population", lambda *args: pytest.fail("stop before the training"))
    with pytest.raises(pytest.fail.Exception, match="stop before the training"):
        tune(PPO, "CartPole-v1", trials=4, population=4, storage="sqlite:///:memory:", study_name="asked",
             hyperparameters=dict(FIXED), budget=256, target_return=None, eval_freq=128, search_space=None,
             confirm_seeds=0, out=tmp_path / "best.yaml", say=lambda *a, **k: None)
    lines = capsys.readouterr().err.splitlines()
    counted = ["asking Optuna for trials: 2/4 trials (50%)", "asking Optuna for trials: 4/4 trials (100%)"]
    assert [line for line in lines if line in counted] == counted, lines


def _asked_study(storage: str):
    """A study in SQLite with 2 completed trials of `SPACE` (TPE models from 2 on: `population` 2), and its setup."""
    record = {"algo": "ppo", "env_id": "CartPole-v1"}
    study = rlspeed.tune._open_study(storage, "s", 0, 2, 256, record)
    for value in (1.0, 2.0):
        trial = study.ask()
        rlspeed.tune.sample(trial, SPACE)
        study.tell(trial, value)
    setup = rlspeed.tune._Setup(PPO, "CartPole-v1", dict(FIXED), SPACE, 256, None, 128, 10, "cpu", 256, at_once=2)
    return study, setup


def test_a_batch_is_stored_with_one_storage_write_per_trial(tmp_path):
    """Asking for a batch wrote to the storage at each `study.ask()`, each sampled value and each user attribute (9
    SQLite commits a PPO trial, and every ask read all running trials: ~900 trials took 200 s). Each trial is stored
    once, with its parameters, seed and hyperparameters, as optuna-dashboard and a resumed study read them; a trial a
    user enqueued is asked with its values."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    study, setup = _asked_study(str(tmp_path / "study.db"))  # (a file: read again as optuna-dashboard reads it)
    written, commits = [], []  # (a transaction that only read commits too: not counted)

    def statement(connection, cursor, sql, *args) -> None:
        written.append(sql.lstrip().split()[0].upper() in ("INSERT", "UPDATE", "DELETE"))

    def commit(connection) -> None:
        commits.append(any(written))
        written.clear()

    hooks = (("before_cursor_execute", statement), ("commit", commit))
    for name, hook in hooks:
        event.listen(Engine, name, hook)
    try:
        asked = []
        rlspeed.tune._ask_batch(study, setup, 4, asked, lambda: None)
    finally:
        for name, hook in hooks:
            event.remove(Engine, name, hook)
    assert sum(commits) == 4
    stored = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 'study.db'}").trials
    assert [t.number for t, _ in asked] == [2, 3, 4, 5] and [t.state.name for t in stored[2:]] == ["RUNNING"] * 4
    for (_, values), frozen in zip(asked, stored[2:]):
        assert frozen.user_attrs == {"seed": 10, "hyperparameters": values} == {  # (the study's seed: every trial's)
            "seed": 10, "hyperparameters": frozen.params}
        assert set(frozen.distributions) == set(SPACE)
        assert frozen.datetime_start is not None and frozen.datetime_complete is None  # (optuna-dashboard's start)
    study.enqueue_trial({"clip_range": 0.3, "learning_rate": 1e-3})
    asked = []
    rlspeed.tune._ask_batch(study, setup, 2, asked, lambda: None)
    assert [t.number for t, _ in asked] == [6, 7] and asked[0][1] == {"learning_rate": 1e-3, "clip_range": 0.3}
    assert study.trials[7].user_attrs["seed"] == 10


def test_the_constant_liar_spreads_a_batch(monkeypatch):
    """The trials of a batch are drawn one after another with the batch's earlier trials counted as running (TPE's
    `constant_liar`): the draws differ from those of the same sampler without it after the first."""
    draws = {}
    sampler = optuna.samplers.TPESampler
    for liar in (True, False):
        monkeypatch.setattr(optuna.samplers, "TPESampler",
                            lambda **kwargs: sampler(**{**kwargs, "constant_liar": liar}))  # noqa: B023
        study, setup = _asked_study("sqlite:///:memory:")
        asked = []
        rlspeed.tune._ask_batch(study, setup, 4, asked, lambda: None)
        draws[liar] = [values["learning_rate"] for _, values in asked]
    assert draws[True][0] == draws[False][0] and draws[True][1:] != draws[False][1:]


def test_a_resumed_study_checks_memory_for_the_trials_it_has_left(tmp_path, monkeypatch):
    """The memory check before the study checked one of `min(--population, --trials)` members: a resumed study
    with 1 trial left of 4 was refused a --population that its last batch (1 trial) would never build."""
    from rlspeed.population import base

    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.db'}", study_name="s")
    for value in (1.0, 2.0, 3.0):
        study.add_trial(optuna.trial.create_trial(value=value))
    planned = []

    def checked(budget, progress_bar=True, *, members=None, option=None):
        planned.append(members)
        raise RuntimeError("checked")

    monkeypatch.setattr(base, "planned_timesteps", checked)
    for trials, members in ((4, 1), (103, 100)):
        with pytest.raises(RuntimeError, match="checked"):
            tune(PPO, "CartPole-v1", trials=trials, population=1000, storage=str(tmp_path / "study.db"),
                 study_name="s", hyperparameters=dict(FIXED), budget=256, target_return=None, eval_freq=128,
                 search_space=None, confirm_seeds=0, out=tmp_path / "best.yaml", say=lambda *a, **k: None)
        assert planned.pop() == members


def test_a_stopped_batch_is_marked_failed_in_one_transaction_per_trial():
    """Marking a stopped batch's trials failed (`study.tell`) took three storage transactions per trial, two of them
    reading the trial: 7-12 s for 300-450 trials in SQLite. One each now; a trial told already is left as it is."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    study, setup = _asked_study("sqlite:///:memory:")
    asked = []
    rlspeed.tune._ask_batch(study, setup, 4, asked, lambda: None)
    study.tell(asked[0][0], 5.0)
    commits = []

    def commit(connection) -> None:
        commits.append(1)

    event.listen(Engine, "commit", commit)
    try:
        assert rlspeed.tune._fail_unfinished(study, asked, {asked[1][0].number}) == "marked failed"
    finally:
        event.remove(Engine, "commit", commit)
    assert len(commits) == 3  # (the trials not in `told`, the one told to Optuna among them)
    assert [t.state.name for t in study.trials[2:]] == ["COMPLETE", "RUNNING", "FAIL", "FAIL"]


def test_a_search_space_cannot_sample_what_changes_a_members_memory(tmp_path):
    """The memory check before the study (and each batch's) sizes members from the fixed values: a search space
    naming a hyperparameter that changes shapes or buffers (buffer_size, net_arch, num_envs) is refused, naming
    --set, so no trial can sample a member larger than the ones checked."""
    from rlspeed import SAC

    for algo, key, spec in ((SAC, "buffer_size", {"low": 1000, "high": 10**8}),
                            (PPO, "net_arch", {"choices": [[64, 64], [4096, 4096]]}),
                            (PPO, "num_envs", {"choices": [8, 1024]})):
        path = tmp_path / f"{key}.yaml"
        path.write_text(yaml.safe_dump({"learning_rate": {"low": 1e-4, "high": 1e-3}, key: spec}))
        with pytest.raises(UserError, match=rf"'{key}' cannot differ across the members .* --set {key}=VALUE"):
            rlspeed.tune.load_search_space(path, algo, {})


def _writes_counted():
    """A list and the SQLAlchemy hooks that append to it, for each commit, whether it wrote (a read commits too)."""
    written, commits = [], []

    def statement(connection, cursor, sql, *args) -> None:
        written.append(sql.lstrip().split()[0].upper() in ("INSERT", "UPDATE", "DELETE"))

    def commit(connection) -> None:
        commits.append(any(written))
        written.clear()

    return commits, (("before_cursor_execute", statement), ("commit", commit))


def _told_batch(storage: str) -> tuple:
    """Ask 4 trials of `_asked_study`, report to 3 of them and tell them (`_tell_batch`): complete, pruned (its last
    report 2 steps after its first), diverged (failed), complete with episodes cut short. Returns the study, each trial
    with the attributes it was told, `told` and the storage writes telling took."""
    from optuna.trial import TrialState

    study, setup = _asked_study(storage)
    asked = []
    rlspeed.tune._ask_batch(study, setup, 4, asked, lambda: None)
    trials = [trial for trial, _ in asked]
    for step, values in ((128, (-10.0, -5.0, -7.0)), (256, (-20.0, -6.0, None))):
        for trial, value in zip(trials, values):
            if value is not None:
                trial.report(value, step)
    results = [(trials[0], None, -20.0, {"steps_to_target": None, "final_eval": 20.0}),
               (trials[1], TrialState.PRUNED, None, {"steps_to_target": None, "final_eval": 6.0}),
               (trials[2], TrialState.FAIL, None, {"steps_to_target": None, "final_eval": None, "diverged_at": 300}),
               (trials[3], None, -9.0, {"steps_to_target": None, "final_eval": 9.0, "final_eval_unfinished": [1, 10]})]
    told = set()
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    commits, hooks = _writes_counted()
    for name, hook in hooks:
        event.listen(Engine, name, hook)
    try:
        rlspeed.tune._tell_batch(study, results, told)
    finally:
        for name, hook in hooks:
            event.remove(Engine, name, hook)
    return study, [(trial, attrs) for trial, _, _, attrs in results], told, sum(commits)


def test_a_batch_is_told_in_one_write_per_trial_and_one_for_all_their_attributes(tmp_path):
    """Telling a batch wrote each trial's 2-4 user attributes in a transaction each, then `study.tell` (two reads
    and a write): 300 trials ~34 s on a loaded machine. The attributes of the batch are one write now, each trial's
    state and value one more; the study holds what `set_user_attr` and `study.tell` stored (a pruned trial's value
    is its last report), as optuna-dashboard and a resumed study read it."""
    _, told_as, told, writes = _told_batch(str(tmp_path / "study.db"))
    assert writes == 1 + 4
    stored = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 'study.db'}").trials[2:]
    assert told == {t.number for t in stored}
    assert [(t.state.name, t.values) for t in stored] == [("COMPLETE", [-20.0]), ("PRUNED", [-6.0]), ("FAIL", None),
                                                          ("COMPLETE", [-9.0])]
    assert [t.intermediate_values for t in stored[:2]] == [{128: -10.0, 256: -20.0}, {128: -5.0, 256: -6.0}]
    for (_, attrs), frozen in zip(told_as, stored):
        assert frozen.user_attrs == {"seed": 10, "hyperparameters": frozen.params, **attrs}
        assert frozen.duration is not None  # (optuna-dashboard's: a start and an end stored)


@pytest.mark.parametrize("changed", ["create_new_trial", "_set_trial_attr_without_commit"])
def test_an_optuna_whose_private_names_differ_is_called_through_its_public_ones(monkeypatch, changed):
    """Asking, telling and marking failed call Optuna's storage through private names (`_direct_storage`); an Optuna
    whose private calls take other parameters (or lacks them) would have stopped tune with a TypeError or
    AttributeError. The public calls (`study.ask`, `study.tell`, `Trial.set_user_attr`) are made then, and store
    the same."""
    from optuna.storages import RDBStorage
    from optuna.storages._cached_storage import _CachedStorage

    owner = _CachedStorage if changed == "create_new_trial" else RDBStorage
    original = getattr(owner, changed)

    def renamed(self, *args, template=None):  # (its parameters named otherwise: Optuna's own calls pass them in order)
        return original(self, *args) if template is None else original(self, *args, template)

    monkeypatch.setattr(owner, changed, renamed)
    study, told_as, told, writes = _told_batch("sqlite:///:memory:")
    stored = study.trials[2:]
    assert told == {t.number for t in stored} and writes > 1 + 4  # (the public calls: more transactions)
    assert [(t.state.name, t.values) for t in stored] == [("COMPLETE", [-20.0]), ("PRUNED", [-6.0]), ("FAIL", None),
                                                          ("COMPLETE", [-9.0])]
    for (_, attrs), frozen in zip(told_as, stored):
        assert frozen.user_attrs == {"seed": 10, "hyperparameters": frozen.params, **attrs}
    asked = []
    rlspeed.tune._ask_batch(study, rlspeed.tune._Setup(PPO, "CartPole-v1", dict(FIXED), SPACE, 256, None, 128, 10,
                                                       "cpu", 256, at_once=2), 2, asked, lambda: None)
    rlspeed.tune._fail_unfinished(study, asked, set())
    assert [t.state.name for t in study.trials[6:]] == ["FAIL", "FAIL"]


def test_trials_without_the_private_names_take_the_public_calls():
    """Whether the storage calls are made through private names is chosen in one place (`_direct_storage`), the
    trials they are made for included: a trial without `_trial_id` (or a `Trial` without its cached copy, which
    reporting updates) takes the public calls."""
    study = rlspeed.tune._open_study("sqlite:///:memory:", "s", 0, 2, 256, {"algo": "ppo", "env_id": "CartPole-v1"})
    trials = [study.ask(), study.ask()]
    assert rlspeed.tune._direct_storage(study, [*trials, study.trials[0]]) is not None
    del trials[1]._cached_frozen_trial
    assert rlspeed.tune._direct_storage(study, trials) is None
    frozen = study.trials[0]
    frozen._trial_id = None
    assert rlspeed.tune._direct_storage(study, [frozen]) is None


def _trained_batch() -> tuple:
    """A batch of 4 trials of `_asked_study` run through `_run_batch` by a stand-in for training: 3 evaluations,
    member k's mean return -10 k, pruned as the study's pruner (any step, 2 others) says. Returns the study, the
    members pruned at each evaluation and the storage writes the batch took."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    study, setup = _asked_study("sqlite:///:memory:")
    study.pruner = rlspeed.tune._make_pruner(warmup_steps=0, min_trials=2)
    asked = []
    rlspeed.tune._ask_batch(study, setup, 4, asked, lambda: None)
    pruned_by_step = []

    def learn(members, on_eval):
        pruned_at, left = {}, set(members)
        for step in (64, 128, 192):
            pruned = on_eval(step, {k: -10.0 * k - step / 64 for k in sorted(left)})
            pruned_by_step.append(pruned)
            left -= set(pruned)
            pruned_at.update(dict.fromkeys(pruned, step))
        return {"members": [{"pruned_at": pruned_at.get(k), "final_eval": {"mean": -10.0 * k},
                             "steps_to_target": None} for k in members], "total_timesteps": 256}

    setup.population, setup.learn = (lambda seeds, per_member: list(range(len(seeds)))), learn
    commits, hooks = _writes_counted()
    for name, hook in hooks:
        event.listen(Engine, name, hook)
    try:
        rlspeed.tune._run_batch(setup, study, asked, set())
    finally:
        for name, hook in hooks:
            event.remove(Engine, name, hook)
    return study, pruned_by_step, sum(commits)


def test_each_evaluation_of_a_batch_is_reported_in_one_storage_write(monkeypatch):
    """Every evaluation of every trial was its own storage write (`Trial.report`: an SQLite commit each;
    benchmarks/tune_storage.py measures the cost). An evaluation of the batch is one write now;
    the study holds the same reports, and the same trials are pruned, as through `Trial.report`."""
    study, pruned, writes = _trained_batch()
    assert writes == 3 + 1 + 4  # (an evaluation each; telling: the attributes, then each trial)
    monkeypatch.setattr(rlspeed.tune, "_direct_storage", lambda study, trials=(): None)
    public, public_pruned, public_writes = _trained_batch()
    assert pruned == public_pruned and [2, 3] in pruned and public_writes > writes
    assert ([(t.state, t.values, t.intermediate_values) for t in study.trials]
            == [(t.state, t.values, t.intermediate_values) for t in public.trials])


def test_a_sampler_reads_the_trials_a_batch_stored_as_after_optunas_own_ask_and_tell():
    """Optuna's samplers read a study's trials through a cache that `study.ask` and `study.tell` drop before they
    store a trial; the batch's own storage calls (`_direct_storage`) kept it, so a sampler reading after them saw the
    batch's trials as they were (not asked yet, or still running)."""
    study, setup = _asked_study("sqlite:///:memory:")

    def sampler_reads() -> list[str]:
        return [t.state.name for t in study._get_trials(deepcopy=False, use_cache=True)[2:]]

    assert sampler_reads() == []
    asked = []
    rlspeed.tune._ask_batch(study, setup, 2, asked, lambda: None)
    assert sampler_reads() == ["RUNNING", "RUNNING"]
    rlspeed.tune._tell_batch(study, [(asked[0][0], None, -1.0, {})], set())
    assert sampler_reads() == ["COMPLETE", "RUNNING"]
    assert rlspeed.tune._fail_stale(study) == 1 and sampler_reads() == ["COMPLETE", "FAIL"]


def test_marking_trials_failed_chooses_optunas_calls_once_for_all_of_them(monkeypatch):
    """`_fail_stale` and `_fail_unfinished` chose between Optuna's private and public calls (`_direct_storage`,
    checking the private calls' signatures) once per trial marked; once for all of them now, each still marked."""
    study, _ = _asked_study("sqlite:///:memory:")
    asked = [(study.ask(), {}) for _ in range(4)]
    choices = []
    direct_storage = rlspeed.tune._direct_storage
    monkeypatch.setattr(rlspeed.tune, "_direct_storage", lambda *args: choices.append(1) or direct_storage(*args))
    assert rlspeed.tune._fail_unfinished(study, asked[:2], set()) == "marked failed" and len(choices) == 1
    assert rlspeed.tune._fail_stale(study) == 2 and len(choices) == 2
    assert [t.state.name for t in study.trials[2:]] == ["FAIL"] * 4


def test_the_study_line_says_the_whole_iterations_a_budget_between_two_trains(tmp_path, capsys):
    """A trial trains whole iterations, as `rlspeed train` does: `--budget 200` with 128 steps per iteration trains
    256 steps per trial. The study's first line said "200 steps per trial" alone (`rlspeed tune ppo Acrobot-v1
    --budget 10` trained 4,096 per trial, said 10); it now says what each trial trains, as train's start line does."""
    argv = _command(tmp_path, "--budget", "200", "--trials", "1", "--population", "1", "--confirm-seeds", "0")
    assert cli.main([*argv, "--no-progress"]) == 0
    assert "200 steps per trial (256: whole iterations of 128)" in capsys.readouterr().out


def test_the_confirmation_seeds_are_said_as_tune_draws_them():
    """`rlspeed tune --help` and docs/tune.md say the confirmation's seeds as `_confirm` draws them: the offset
    `_CONFIRM_SEED_OFFSET` and the wrap below 2**32 (the help left the wrap out, wrong for a --seed near 2**32)."""
    offset = rlspeed.tune._CONFIRM_SEED_OFFSET
    seed_help = next(action.help for action in cli._commands(cli.build_parser())["tune"]._actions
                     if "--seed" in action.option_strings)
    docs = (Path(__file__).parents[1] / "docs" / "tune.md").read_text(encoding="utf-8")
    assert f"seed N + {offset:,} + i, modulo 2**32" in seed_help
    assert f"`S + {offset} + i`, modulo `2**32`" in docs
