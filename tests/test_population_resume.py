"""Population checkpoints: a population killed after a checkpoint and resumed ends bitwise as the uninterrupted run
(CPU, native envs), `rlspeed train --seeds ... --resume` finishes a killed run with the uninterrupted run's
summary.json, and a run directory of another run is refused in one sentence."""

from __future__ import annotations

import json
import shutil
import time
import types
from pathlib import Path

import pytest
import torch
from conftest import checkpoint_metadata, checkpoint_tensors, cli_error, first_ou_noise, needs_minatar

from rlspeed import A2C, PPO, cli
from rlspeed.errors import UserError
from rlspeed.population import Population

TOTAL = 1024
CHECKPOINT_FREQ = 384


class Killed(BaseException):  # (past `except Exception`: a kill runs no handler)
    """Stands for a kill -9 right after a checkpoint was written."""


def _settings(algo) -> dict:
    if algo is A2C:
        return dict(num_envs=4, num_steps=8, net_arch=(16, 16), learning_rate=[7e-4, 1e-3, 2e-3])
    return dict(num_envs=4, num_steps=32, batch_size=64, n_epochs=2, net_arch=(16, 16),
                learning_rate=[1e-3, 3e-4, 2e-3], normalize_obs=False, normalize_reward=False)


def _population(algo, env_id, **extra):
    return Population(algo, env_id, seeds=[3, 5, 8], env_backend="torch", **{**_settings(algo), **extra})


def _without_times(summary: dict) -> dict:
    """summary.json less what the clock measures (wall and CPU times, steps per second) and the command that wrote it
    (`provenance`: a --resume's command and start time are its own)."""
    timed = ("train_wall_s", "train_cpu_s", "sps", "time_to_target_s", "provenance")
    summary = {key: value for key, value in summary.items() if key not in timed}
    summary["members"] = [{key: value for key, value in member.items() if key not in timed}
                          for member in summary["members"]]
    summary["aggregate"] = {key: value for key, value in summary["aggregate"].items() if key != "time_to_target_s"}
    return summary


def _prune_member_1(steps, means):
    return [1] if steps >= 256 else []


#: the learn arguments of the bitwise resume tests: checkpoints, evaluations and member 1 pruned on the way
_LEARN = dict(eval_freq=256, on_eval=_prune_member_1, checkpoint_freq=CHECKPOINT_FREQ)


def _killed_after_first_checkpoint(tmp_path, make) -> tuple[dict, dict, Path, int]:
    """Train `make()` to TOTAL in tmp_path/a (its summary and final tensors), then `make()` again in tmp_path/b killed
    right after its first checkpoint (that checkpoint and its steps per member)."""
    uninterrupted = make()
    expected_summary = uninterrupted.learn(TOTAL, run_dir=tmp_path / "a", **_LEARN)
    expected = checkpoint_tensors(uninterrupted.save(tmp_path / "a" / "final"))

    def kill_after_checkpoint(steps, means):
        if (tmp_path / "b" / "checkpoint.safetensors").exists():
            raise Killed
        return _prune_member_1(steps, means)

    killed = make()
    with pytest.raises(Killed):
        killed.learn(TOTAL, run_dir=tmp_path / "b", **{**_LEARN, "on_eval": kill_after_checkpoint})
    checkpoint = tmp_path / "b" / "checkpoint.safetensors"
    saved_steps = checkpoint_metadata(checkpoint)["population"]["num_timesteps"]
    assert 0 < saved_steps < TOTAL
    return expected_summary, expected, checkpoint, saved_steps


def _assert_resumes_as_uninterrupted(tmp_path, make, checkpoint, saved_steps: int, expected: dict,
                                     expected_summary: dict) -> dict:
    """A `make()` resumed from `checkpoint` and trained on to TOTAL in tmp_path/b ends with every tensor and the
    summary (less times) of the uninterrupted run; returns its final tensors."""
    resumed = make()
    resumed.resume(checkpoint)
    assert resumed.num_timesteps == saved_steps
    summary = resumed.learn(TOTAL - saved_steps, run_dir=tmp_path / "b", **_LEARN)
    actual = checkpoint_tensors(resumed.save(tmp_path / "b" / "final"))
    assert set(actual) == set(expected)
    for name, value in expected.items():
        assert torch.equal(actual[name], value), name
    assert _without_times(summary) == _without_times(expected_summary)
    assert _metrics(tmp_path / "b") == _metrics(tmp_path / "a")  # (metrics.csv: no row lost or written twice)
    return actual


def test_a_resume_continues_a_metrics_csv_whose_eval_unfinished_sums_the_members(tmp_path):
    """A population's metrics.csv an earlier rlspeed began has one `eval_unfinished`, all members' cut episodes
    summed: a resume keeps its rows' values and writes each member's in `eval_unfinished/seed_S` from then on."""
    import csv

    population = _population(PPO, "CartPole-v1")
    population.learn(256, run_dir=tmp_path, eval_freq=128, checkpoint_freq=128)
    path = tmp_path / "metrics.csv"
    with open(path, newline="", encoding="utf-8") as handle:  # (written again as the earlier rlspeed wrote it)
        rows = list(csv.DictReader(handle))
    cut = [f"eval_unfinished/seed_{seed}" for seed in (3, 5, 8)]
    older = [{**{key: value for key, value in row.items() if key not in cut},
              "eval_unfinished": str(sum(int(row[key]) for key in cut)) if row[cut[0]] else ""} for row in rows]
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(older[0]))
        writer.writeheader()
        writer.writerows(older)
    resumed = _population(PPO, "CartPole-v1")
    resumed.resume(tmp_path / "checkpoint.safetensors")
    resumed.learn(128, run_dir=tmp_path, eval_freq=128)
    with open(path, newline="", encoding="utf-8") as handle:
        rows = [row for row in csv.DictReader(handle) if row["eval_mean/seed_3"]]
    assert [(row["eval_unfinished"], row[cut[0]]) for row in rows] == [("0", ""), ("", "0")], rows


def _metrics(run_dir: Path) -> list[dict]:
    """metrics.csv's rows less what the clock measures."""
    import csv

    with open(run_dir / "metrics.csv", encoding="utf-8") as file:
        return [{key: value for key, value in row.items() if key not in ("train_wall_s", "sps")}
                for row in csv.DictReader(file)]


def test_a_population_run_writes_each_members_evaluations_to_metrics_csv(tmp_path):
    """metrics.csv of a population: a row per evaluation with each member's mean in its seed's column (the
    summary's curves), the members training, and a row where training ended; TensorBoard groups the members' curves
    under one section. An untrained population refuses a directory holding another run's metrics.csv."""
    population = _population(PPO, "CartPole-v1")
    summary = population.learn(640, run_dir=tmp_path / "run", eval_freq=256, on_eval=_prune_member_1)
    rows = _metrics(tmp_path / "run")
    with open(tmp_path / "run" / "metrics.csv", encoding="utf-8") as file:
        header = file.readline().strip().split(",")
    assert header[:4] == ["timesteps", "train_wall_s", "sps", "members"]
    assert header[4:] == ["eval_mean/seed_3", "eval_mean/seed_5", "eval_mean/seed_8", "eval_unfinished/seed_3",
                          "eval_unfinished/seed_5", "eval_unfinished/seed_8"]
    assert [int(row["timesteps"]) for row in rows] == [256, 512, 640]
    # (CartPole's episodes end: 0 for each member evaluated, empty for the one pruned)
    assert [row["eval_unfinished/seed_5"] for row in rows] == ["0", "", ""], rows
    assert [row["eval_unfinished/seed_8"] for row in rows] == ["0", "0", "0"], rows
    assert [int(row["members"]) for row in rows] == [3, 2, 2]  # (member 1, seed 5, pruned at 256)
    for member in summary["members"]:
        column = [(int(row["timesteps"]), float(row[f"eval_mean/seed_{member['seed']}"])) for row in rows
                  if row[f"eval_mean/seed_{member['seed']}"]]
        assert column == [(steps, pytest.approx(mean)) for steps, mean in member["curve"]]
    assert not (tmp_path / "run" / "learning_curve.png").exists()  # (a population's plot is learning_curves.png)
    with pytest.raises(UserError, match="holds the metrics.csv of another run, which this population \\(untrained\\)"):
        _population(PPO, "CartPole-v1").learn(256, run_dir=tmp_path / "run")



def _member_0_cut_short(monkeypatch) -> dict:
    """Every evaluation's first member (rows are blocks of `episodes` episodes, 2 unless the returned dict's
    "episodes" is changed, member by member) has its episodes cut short at the step limit, the others' end."""
    from rlspeed.population import base

    real = base.first_episode_returns
    block = {"episodes": 2}

    def member_0_never_finishes(*args, **kwargs):
        returns, finished, *rest = real(*args, **kwargs)
        finished.view(-1, block["episodes"])[0] = False
        return returns, finished, *rest

    monkeypatch.setattr(base, "first_episode_returns", member_0_never_finishes)
    return block


def test_each_members_episodes_cut_short_go_in_its_own_column_and_confirmations(tmp_path, monkeypatch):
    """Members whose evaluations are cut short at the step limit unequally: metrics.csv's `eval_unfinished/seed_S`
    and summary.json's `confirmations_unfinished` give each member its own count, not another member's."""
    import csv
    import warnings

    _member_0_cut_short(monkeypatch)
    population = _population(PPO, "CartPole-v1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the warnings of the cut episodes: tested elsewhere)
        summary = population.learn(128, target_return=-1000, eval_freq=128, eval_episodes=2, run_dir=tmp_path,
                                   progress_bar=False)
    assert [member["confirmations_unfinished"] for member in summary["members"]] == [[2], [0], [0]]
    with open(tmp_path / "metrics.csv", newline="", encoding="utf-8") as handle:
        rows = [row for row in csv.DictReader(handle) if row["eval_mean/seed_3"]]
    assert [tuple(row[f"eval_unfinished/seed_{seed}"] for seed in (3, 5, 8)) for row in rows] == [("2", "0", "0")], rows


def _confirmations_fall_short():
    """A small PPO population whose confirming evaluations score below any target (its members train on)."""
    from rlspeed.evaluation import evaluation_seed

    population = _population(PPO, "CartPole-v1")
    evaluate = population.evaluate

    def confirmations_fall_short(seeds, episodes, members):
        means = evaluate(seeds, episodes, members)
        confirming = seeds[0] == evaluation_seed(population.seeds[members[0]], "confirm", population.num_timesteps)
        return means - 1e6 if confirming else means

    population.evaluate = confirmations_fall_short
    return population


def test_a_resume_keeps_each_confirmations_episodes_cut_short(tmp_path, monkeypatch):
    """The confirmations made before a checkpoint keep their counts of episodes cut short, and of episodes run, through
    a resume with other eval_episodes (a confirmation that did not reach the target: its fresh episodes scored below
    it, so the members train on): the reached line's total counts the episodes each confirmation ran."""
    import warnings


    block = _member_0_cut_short(monkeypatch)
    learn = dict(target_return=-1000, eval_freq=128, eval_episodes=2, progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the warnings of the cut episodes: tested elsewhere)
        _confirmations_fall_short().learn(256, run_dir=tmp_path, checkpoint_freq=128, **learn)
        resumed = _confirmations_fall_short()
        resumed.resume(tmp_path / "checkpoint.safetensors")
        block["episodes"] = 3
        summary = resumed.learn(128, run_dir=tmp_path, **{**learn, "eval_episodes": 3})
    assert [member["confirmations_unfinished"] for member in summary["members"]] == [[2, 3], [0, 0], [0, 0]]
    assert [member["confirmations_episodes"] for member in summary["members"]] == [[2, 3]] * 3
    assert summary["reached"] == 0
    from rlspeed.cli import _confirmations_cut_short

    # (each confirmation's own episodes: the total was 6 confirmations x the last eval_episodes, 18)
    assert _confirmations_cut_short(summary["members"], 3) == ", 5 of 15 cut short at the step limit"


def test_a_checkpoint_keeps_the_populations_verbose_as_a_solo_models_file_does(tmp_path):
    """A population's verbose was not saved: a resume went on with the new population's default 1 (a bar) where the
    run had verbose=0. A population built without verbose takes the checkpoint's, as PPO.load takes its file's; one
    given it keeps its own, as load(path, verbose=...) does."""
    population = _population(PPO, "CartPole-v1", verbose=0)
    population.learn(64, progress_bar=False)
    path = population.save(tmp_path / "checkpoint.safetensors")
    resumed = _population(PPO, "CartPole-v1")
    resumed.resume(path)
    assert resumed.verbose == 0
    given = _population(PPO, "CartPole-v1", verbose=2)
    given.resume(path)
    assert given.verbose == 2


def test_a_resumed_loop_without_eval_freq_keeps_its_checkpoints_interval(tmp_path):
    """learn without eval_freq right after resume evaluates at the checkpoint's interval, as a resumed model does (the
    default for the steps left, a 40th of them and at least 2,048, would move or drop the run's evaluations)."""
    _population(PPO, "CartPole-v1").learn(256, eval_freq=128, eval_episodes=1, run_dir=tmp_path, checkpoint_freq=128,
                                          progress_bar=False)
    resumed = _population(PPO, "CartPole-v1")
    resumed.resume(tmp_path / "checkpoint.safetensors")
    assert resumed.num_timesteps == 128  # (the checkpoint of the first iteration)
    evaluated = []
    resumed.learn(384, eval_episodes=1, run_dir=tmp_path, progress_bar=False,
                  on_eval=lambda steps, means: evaluated.append(steps))
    assert evaluated == [256, 384, 512]


def test_confirmations_an_older_checkpoint_did_not_count_are_not_counted(tmp_path, monkeypatch, capsys):
    """A checkpoint of an earlier rlspeed records no count of its confirmations' episodes cut short: summary.json's
    `confirmations_unfinished` holds null for them (not -1), and the reached line counts only the known ones (it
    counted the unknown ones' episodes in its total)."""
    import warnings

    _member_0_cut_short(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the warnings of the cut episodes: tested elsewhere)
        _confirmations_fall_short().learn(256, target_return=-1000, eval_freq=128, eval_episodes=2, run_dir=tmp_path,
                                          checkpoint_freq=128, progress_bar=False)
        resumed = _confirmations_fall_short()
        resumed.resume(tmp_path / "checkpoint.safetensors")
        resumed.progress.pop("confirmations_unfinished")  # (as an earlier rlspeed's checkpoint holds it)
        summary = resumed.finish_resumed(target_return=-1000, eval_episodes=2)
    assert [member["confirmations_unfinished"] for member in summary["members"]] == [[None], [None], [None]]
    from rlspeed.cli import _confirmations_cut_short

    members = [{"confirmations_unfinished": [None, 2]}, {"confirmations_unfinished": [None, 0]}]
    assert _confirmations_cut_short(members, 2) == ", 2 of 4 cut short at the step limit"
    assert _confirmations_cut_short([{"confirmations_unfinished": [None, -1]}], 2) == ""


@pytest.mark.parametrize(("algo", "env_id", "extra"), [
    (PPO, "CartPole-v1", {}), (PPO, "Pendulum-v1", {}), (A2C, "CartPole-v1", {}),
    (PPO, "Pendulum-v1", {"normalize_obs": True, "normalize_reward": True}),
])
def test_a_resumed_population_is_bitwise_the_uninterrupted_one(tmp_path, algo, env_id, extra):
    """Train to TOTAL with checkpoints, evaluations and a member pruned on the way; train again and kill it right
    after its first checkpoint; resume a new population from that checkpoint and train on to TOTAL: every tensor
    (parameters, optimiser moments, generators, env states and observations, normalisation statistics) and the
    summary (curves, pruned, final evaluations) equal the uninterrupted run's."""
    expected_summary, expected, checkpoint, saved_steps = _killed_after_first_checkpoint(
        tmp_path, lambda: _population(algo, env_id, **extra))
    assert expected_summary["pruned"] == 1
    assert checkpoint_metadata(checkpoint)["population"]["alive"] == [0, 2]  # (member 1 was pruned before it)
    actual = _assert_resumes_as_uninterrupted(tmp_path, lambda: _population(algo, env_id, **extra), checkpoint,
                                              saved_steps, expected, expected_summary)
    assert any(name.startswith("env.") for name in actual) and "generator.0" in actual
    if extra:
        assert "state.norm.obs_var" in actual and "env.MemberNormalize._returns" in actual


def test_a_checkpoint_of_another_run_is_refused(tmp_path):
    population = Population(PPO, "CartPole-v1", seeds=[0, 1], num_envs=4, num_steps=16, net_arch=(8,))
    path = population.save(tmp_path / "population")
    for seeds, hyper, names in (([0, 2], {}, "same seeds"),
                                ([0, 1], {"net_arch": (16,)}, "net_arch"),
                                ([0, 1], {"learning_rate": [1e-3, 2e-3]}, "learning_rate")):
        other = Population(PPO, "CartPole-v1", seeds=seeds, **{"num_envs": 4, "num_steps": 16, "net_arch": (8,),
                                                               **hyper})
        with pytest.raises(UserError, match=names):
            other.resume(path)
    with pytest.raises(UserError, match="same algorithm"):
        Population(A2C, "CartPole-v1", seeds=[0, 1], num_envs=4, num_steps=16, net_arch=(8,)).resume(path)
    with pytest.raises(UserError, match=r"resume with env_backend='torch' \(rlspeed train's --env-backend torch\)\.$"):
        Population(PPO, "CartPole-v1", seeds=[0, 1], env_backend="gymnasium", num_envs=4, num_steps=16,
                   net_arch=(8,)).resume(path)
    solo = PPO("CartPole-v1", seed=0, num_envs=4, num_steps=16, net_arch=(8,)).save(tmp_path / "solo")
    with pytest.raises(UserError, match="single ppo run"):
        population.resume(solo)
    # and where one model's checkpoint belongs: what to load or resume instead
    with pytest.raises(UserError, match=r"checkpoint of a population .*members/seed_<S>\.safetensors"):
        PPO.load(path)
    with pytest.raises(UserError, match=r"checkpoint of a population .*--seeds 0,1 --resume"):
        PPO("CartPole-v1", seed=0, num_envs=4, num_steps=16, net_arch=(8,)).resume(path)


def test_finishing_or_checkpointing_what_cannot_be_is_one_sentence(tmp_path):
    """finish_resumed on a population that was not resumed (it would report an untrained population as the run's
    end), with an unknown stop, and learn's checkpoint_freq without a run_dir to write to, are refused."""
    options = dict(seeds=[0, 1], num_envs=4, num_steps=16, batch_size=64, net_arch=(8,))
    population = Population(PPO, "CartPole-v1", **options)
    with pytest.raises(UserError, match="finish_resumed ends a population resumed .*this one was not"):
        population.finish_resumed()
    with pytest.raises(UserError, match="checkpoint_freq=64 needs a run_dir"):
        population.learn(128, checkpoint_freq=64)
    path = population.save(tmp_path / "population")
    resumed = Population(PPO, "CartPole-v1", **options)
    resumed.resume(path)
    with pytest.raises(UserError, match="stop must be 'each' or 'all', got 'any'"):
        resumed.finish_resumed(stop="any")
    assert len(resumed.finish_resumed(eval_episodes=2)["members"]) == 2


def test_a_checkpoint_of_other_env_options_is_refused(tmp_path):
    """Pendulum with g=2 and Pendulum as registered have the same spaces, so the checkpoint's tensors fit either: a
    resume with other env_kwargs than the run's is refused (it would go on in another env); the same ones resume."""
    options = dict(seeds=[0, 1], env_backend="gymnasium", num_envs=2, num_steps=16, batch_size=32, net_arch=(8,))
    path = Population(PPO, "Pendulum-v1", env_kwargs={"g": 2.0}, **options).save(tmp_path / "population")
    for env_kwargs in (None, {"g": 3.0}):
        with pytest.raises(UserError, match=r"trained with the env options \{'g': 2\.0\}, this population has .*resume "
                                            "with the same env_kwargs"):
            Population(PPO, "Pendulum-v1", env_kwargs=env_kwargs, **options).resume(path)
    Population(PPO, "Pendulum-v1", env_kwargs={"g": 2.0}, **options).resume(path)


# CLI runs: 2 members, 8 envs x 16 steps per iteration, an evaluation every 128 steps against a target never reached,
# a checkpoint every 256 steps
CLI = ["--set", "num_envs=8", "--set", "num_steps=16", "--set", "batch_size=64", "--set", "n_epochs=2",
       "--set", "net_arch=[16,16]", "--total-timesteps", "768", "--eval-freq", "128", "--target-return", "1000",
       "--checkpoint-freq", "256", "--env-backend", "torch"]


# SAC: 2 members, 2 envs, updates from step 64 on batches of 32, the replay buffer saved with each checkpoint
CLI_SAC = ["--set", "num_envs=2", "--set", "learning_starts=64", "--set", "batch_size=32", "--set", "net_arch=[16,16]",
           "--set", "buffer_size=1000", "--total-timesteps", "768", "--eval-freq", "128", "--target-return", "1000",
           "--checkpoint-freq", "256", "--env-backend", "torch", "--save-replay-buffer"]


@pytest.mark.parametrize("argv, curve", [
    # (PPO: evaluations every 192 steps on 128-step iterations, at the first iteration end past each multiple)
    (["train", "ppo", "CartPole-v1", "--seeds", "0-1", "--set", "learning_rate=1e-3,2e-3", *CLI, "--eval-freq", "192"],
     [256, 384, 640, 768]),
    (["train", "sac", "Pendulum-v1", "--seeds", "0-1", "--set", "learning_rate=1e-3,2e-3", *CLI_SAC],
     [128, 256, 384, 512, 640, 768]),
    (["train", "ddpg", "Pendulum-v1", "--seeds", "0-1", "--set", "learning_rate=1e-3,2e-3", *CLI_SAC],
     [128, 256, 384, 512, 640, 768]),
], ids=["ppo", "sac", "ddpg"])
def test_cli_resume_finishes_a_killed_run_as_the_uninterrupted_run(tmp_path, monkeypatch, argv, curve):
    """A run that crashes (an exception) after its second checkpoint leaves checkpoint.safetensors; `--resume`, given
    no settings, continues it to the end with the run's own (config.yaml), and its summary.json has the uninterrupted
    run's fields and values (times aside), its evaluations at the multiples of its eval_freq too (a period counted
    from the step it acted at evaluated PPO's every 256 steps)."""
    from rlspeed.population import base

    assert cli.main([*argv, "--out", str(tmp_path / "a")]) == 0
    expected = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert expected["resumed_from"] is None and expected["checkpoint_freq"] == 256

    save = base.PopulationBase.save
    saves = []

    def crash_after_second_save(self, path):
        written = save(self, path)
        saves.append(self.num_timesteps)
        if len(saves) == 2:
            raise Killed
        return written

    monkeypatch.setattr(base.PopulationBase, "save", crash_after_second_save)
    out = tmp_path / "b"
    with pytest.raises(Killed):
        cli.main([*argv, "--out", str(out)])
    monkeypatch.setattr(base.PopulationBase, "save", save)
    assert saves == [256, 512]
    assert not (out / "summary.json").exists()
    # (resumed with the algorithm, env, seeds and directory alone: config.yaml gives the rest, per-member values too)
    assert cli.main([*argv[:5], "--out", str(out), "--resume"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from"] == 512
    assert set(summary) == set(expected)
    assert {**_without_times(summary), "resumed_from": None} == _without_times(expected)
    assert [step for step, _ in summary["members"][0]["curve"]] == curve


def test_resume_with_another_budget_says_so_and_trains_to_it(tmp_path, monkeypatch, capsys):
    """A population resumed with another --total-timesteps names the change, then trains to the new budget."""
    from rlspeed.population import base

    argv = ["train", "ppo", "CartPole-v1", "--seeds", "0-1", *CLI, "--out", str(tmp_path / "run")]
    save = base.PopulationBase.save

    def crash_after_first_save(self, path):
        save(self, path)
        raise Killed

    monkeypatch.setattr(base.PopulationBase, "save", crash_after_first_save)
    with pytest.raises(Killed):
        cli.main(argv)
    monkeypatch.setattr(base.PopulationBase, "save", save)
    capsys.readouterr()
    assert cli.main([*argv, "--resume", "--total-timesteps", "1024"]) == 0
    assert "other settings than the run started with: total_timesteps 768 -> 1024 " in capsys.readouterr().err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["resumed_from"] == 256 and summary["total_timesteps"] == 1024


def _sigterm_at_evaluation(monkeypatch, at: int):
    """PPO populations' learn sends this process SIGTERM at the evaluation at `at` steps per member; returns the real
    learn."""
    import os
    import signal

    from rlspeed.population import ppo

    learn = ppo.PPOPopulation.learn

    def terminated_learn(self, *args, on_eval, **kwargs):
        def terminate_at(steps, means):
            if steps == at:
                os.kill(os.getpid(), signal.SIGTERM)
            return on_eval(steps, means)
        return learn(self, *args, on_eval=terminate_at, **kwargs)

    monkeypatch.setattr(ppo.PPOPopulation, "learn", terminated_learn)
    return learn


@pytest.mark.plots
def test_sigterm_stops_after_the_iteration_with_a_checkpoint_that_resumes(tmp_path, capsys, monkeypatch):
    """SIGTERM at the second evaluation: the run finishes the iteration, writes its checkpoint there (not only the
    last periodic one) and summary.json, and exits 143; `--resume` goes on from that step to the uninterrupted end."""
    from rlspeed.population import ppo

    argv = ["train", "ppo", "CartPole-v1", "--seeds", "2,4", *CLI]
    assert cli.main([*argv, "--out", str(tmp_path / "a")]) == 0
    expected = json.loads((tmp_path / "a" / "summary.json").read_text())
    learn = _sigterm_at_evaluation(monkeypatch, 384)
    out = tmp_path / "b"
    capsys.readouterr()
    assert cli.main([*argv, "--out", str(out)]) == 143
    err = capsys.readouterr().err
    assert "stopping after this iteration" in err
    assert "--resume continues from checkpoint.safetensors, written at 384 steps per member" in err
    assert "once the cause is fixed" not in err  # (a stop asked for, not a crash: said once, by the line above)
    partial = json.loads((out / "summary.json").read_text())
    assert partial["interrupted"] is True
    # the finished summary's keys (it had 8 of them: no aggregate, population, sps, ...), null where not measured
    assert set(partial) == set(expected) and partial["aggregate"]["final_eval"] is None
    assert [set(member) for member in partial["members"]] == [set(member) for member in expected["members"]]
    assert all(member["final_eval"] is None for member in partial["members"])
    assert (out / "learning_curves.png").is_file()
    # each member's results so far, as the finished summary has them up to that step
    for member, whole in zip(partial["members"], expected["members"]):
        assert member["curve"] == [point for point in whole["curve"] if point[0] <= 384]
        assert member["steps_to_target"] is None and member["confirmations"] == []  # (a target of 1000)
    monkeypatch.setattr(ppo.PPOPopulation, "learn", learn)
    assert cli.main([*argv, "--out", str(out), "--resume"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from"] == 384
    assert {**_without_times(summary), "resumed_from": None} == _without_times(expected)


def test_an_interrupted_population_ends_at_the_steps_it_trained(tmp_path, capsys, monkeypatch):
    """A population stopped mid-run could not be ended where it stood (its final evaluation and member models without
    more training), which a single run can: `--resume --total-timesteps STEPS` was refused ("the whole budget: give a
    larger --total-timesteps"). It evaluates the members now; a budget below the steps trained is refused."""
    argv = ["train", "ppo", "CartPole-v1", "--seeds", "2,4", *CLI, "--out", str(tmp_path / "run")]
    _sigterm_at_evaluation(monkeypatch, 384)
    assert cli.main(argv) == 143
    monkeypatch.undo()
    partial = json.loads((tmp_path / "run" / "summary.json").read_text())
    capsys.readouterr()
    assert "below the 384 steps per member" in cli_error(capsys, [*argv, "--resume", "--total-timesteps", "256"])
    assert cli.main([*argv, "--resume", "--total-timesteps", "384"]) == 0
    assert "nothing left to train; evaluating the members" in capsys.readouterr().out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["interrupted"] is False and summary["resumed_from"] == 384 and summary["total_timesteps"] == 384
    assert all(member["final_eval"] is not None for member in summary["members"])
    assert [member["curve"] for member in summary["members"]] == [member["curve"] for member in partial["members"]]
    assert sorted(summary["member_models"]) == ["2", "4"]


#: the population run the refusal and requeue tests start from (`finished_run`)
FINISHED = ["train", "ppo", "CartPole-v1", "--seeds", "0-1", *CLI]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A finished run of FINISHED, trained once per module; tests copy it (`_copy_of`) before using it."""
    out = tmp_path_factory.mktemp("finished") / "run"
    assert cli.main([*FINISHED, "--out", str(out)]) == 0
    return out


def _copy_of(run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(run, tmp_path / "run"))


@pytest.mark.parametrize("argv, names", [
    (["train", "ppo", "CartPole-v1", "--seeds", "0-2", *CLI], "with --seeds 0,1, not ppo on CartPole-v1 with these"),
    (["train", "a2c", "CartPole-v1", "--seeds", "0-1", "--set", "num_envs=8"], "a population of ppo on CartPole-v1"),
    (["train", "ppo", "Acrobot-v1", "--seeds", "0-1", *CLI, "--set", "normalize_obs=false", "--set",
      "normalize_reward=false"], "a population of ppo on CartPole-v1"),
])
def test_resume_refuses_another_runs_directory(tmp_path, capsys, finished_run, argv, names):
    """Seeds, algorithm or env other than the run directory's: one sentence, exit code 2, the run left as it was."""
    out = _copy_of(finished_run, tmp_path)
    before = {str(path.relative_to(out)): path.read_bytes() for path in out.rglob("*") if path.is_file()}
    assert "checkpoint.safetensors" in before and "members/seed_1.safetensors" in before
    capsys.readouterr()
    message = cli_error(capsys, [*argv, "--out", str(out), "--resume"])
    assert names in message
    assert {str(path.relative_to(out)): path.read_bytes() for path in out.rglob("*") if path.is_file()} == before


def test_resume_refuses_a_single_runs_directory(tmp_path, capsys):
    out = tmp_path / "solo"
    assert cli.main(["train", "ppo", "CartPole-v1", "--set", "num_envs=8", "--set", "num_steps=16",
                     "--total-timesteps", "256", "--target-return", "none", "--checkpoint-freq", "128", "--out",
                     str(out)]) == 0
    capsys.readouterr()
    message = cli_error(capsys, ["train", "ppo", "CartPole-v1", "--seeds", "0-1", *CLI, "--out", str(out),
                                 "--resume"])
    assert "single ppo run" in message
    message = cli_error(capsys, ["train", "ppo", "CartPole-v1", "--seeds", "0-1", *CLI, "--save-replay-buffer",
                                 "--out", str(tmp_path / "ppo")])
    assert "--save-replay-buffer applies to off-policy populations" in message


def _offpolicy(algo, env_id, **extra):
    settings = dict(num_envs=2, learning_starts=64, batch_size=32, net_arch=(16, 16), buffer_size=400)
    if algo.__name__ == "SAC":
        settings.update(n_step=3, learning_rate=[1e-3, 3e-4, 2e-3])
    elif algo.__name__ == "TD3":  # (the Ornstein-Uhlenbeck noise and the policy delay's count carry over too)
        settings.update(action_noise="ornstein-uhlenbeck", learning_rate=[1e-3, 3e-4, 2e-3])
    else:
        settings.update(num_envs=4, train_freq=2, target_update_interval=128, exploration_fraction=[0.5, 0.3, 0.2])
    return Population(algo, env_id, seeds=[3, 5, 8], env_backend="torch", **settings, **extra)


def test_a_populations_checkpoint_apart_from_its_replay_file_resumes_with_an_empty_replay(tmp_path):
    """A copy of an older checkpoint names the replay file beside it, which a later save rewrote; a checkpoint copied
    to another directory has none beside it: each resumes with a warning and an empty replay buffer (not the later
    rows), and the checkpoint with its own file takes its rows."""
    from rlspeed import DQN

    population = _offpolicy(DQN, "CartPole-v1", save_replay_buffer=True)
    population.learn(128)
    older = population.save(tmp_path / "checkpoint")
    shutil.copy(older, tmp_path / "older.safetensors")
    (tmp_path / "elsewhere").mkdir()
    shutil.copy(older, tmp_path / "elsewhere" / "checkpoint.safetensors")
    population.learn(64)
    population.save(tmp_path / "checkpoint")
    for path, words in ((tmp_path / "older.safetensors", "checkpoint.replay.safetensors' does not belong to .*older"),
                        (tmp_path / "elsewhere" / "checkpoint.safetensors", "cannot be read")):
        resumed = _offpolicy(DQN, "CartPole-v1", save_replay_buffer=True)
        with pytest.warns(UserWarning, match=words + ".*the replay buffer starts empty"):
            resumed.resume(path)
        assert resumed.num_timesteps == 128
        resumed.learn(32)
        assert len(resumed.buffer) == 32  # (each member's rows collected since the resume only)
    resumed = _offpolicy(DQN, "CartPole-v1", save_replay_buffer=True)
    resumed.resume(tmp_path / "checkpoint.safetensors")
    assert len(resumed.buffer) == len(population.buffer)


def test_a_population_saved_before_any_step_resumes_without_warnings(tmp_path):
    """A DQN population saved before training, on Gymnasium envs, holds no transition and no episode in progress:
    its resume is the uninterrupted run, as a solo run's is, without the warning that its replay buffer starts empty
    (said before) or that its envs start afresh; one saved after a step still warns."""
    import warnings

    from rlspeed import DQN

    def population():
        return Population(DQN, "CartPole-v1", seeds=[3, 5], env_backend="gymnasium", num_envs=2, buffer_size=64,
                          learning_starts=4, batch_size=8, net_arch=(8,))

    path = population().save(tmp_path / "checkpoint")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        population().resume(path)
    trained = population()
    trained.learn(8)
    with pytest.warns(UserWarning) as said:
        population().resume(trained.save(tmp_path / "trained"))
    assert [any(words in str(warning.message) for warning in said)
            for words in ("holds no replay buffer", "continues from fresh episodes")] == [True, True]


def _with_contents(file, contents) -> None:
    """Rewrite the replay file `file` with `contents` as its record of what its rows hold (None: no record, as files
    written before it was recorded), its token kept."""
    from rlspeed.checkpoint import save_checkpoint

    tensors, meta = checkpoint_tensors(file), checkpoint_metadata(file)
    del meta["digest"]
    if contents is None:
        del meta["replay_buffer"]["contents"]
    else:
        meta["replay_buffer"]["contents"] = contents
    save_checkpoint(file, tensors, meta)


def test_a_populations_replay_file_records_raw_rows_and_one_recorded_normalised_resumes_empty(tmp_path):
    """A population's replay file says what its rows hold, as a solo run's does (the env's own observations and
    rewards); resumed from a file whose rows are recorded as normalised, the replay starts empty with a warning
    saying why, rather than training on them; a file written before the record (raw: populations normalised
    nothing) still fills it."""
    from rlspeed import DQN, load

    population = _offpolicy(DQN, "CartPole-v1", save_replay_buffer=True)
    population.learn(128)
    path = population.save(tmp_path / "checkpoint")
    replay = tmp_path / "checkpoint.replay.safetensors"
    assert checkpoint_metadata(replay)["replay_buffer"]["contents"] == {"observations": "raw", "rewards": "raw"}
    with pytest.raises(UserError, match=r"is a population's replay buffer .* give one member's model, "
                                        r"members/seed_<S>.safetensors"):
        load(replay)  # (not "the model file beside it": that is the population's checkpoint)
    _with_contents(replay, None)
    resumed = _offpolicy(DQN, "CartPole-v1", save_replay_buffer=True)
    resumed.resume(path)
    assert len(resumed.buffer) == len(population.buffer)
    _with_contents(replay, {"observations": "normalised", "rewards": "raw"})
    resumed = _offpolicy(DQN, "CartPole-v1", save_replay_buffer=True)
    with pytest.warns(UserWarning, match=r"checkpoint.replay.safetensors' cannot fill this population's replay "
                                         r"buffer: its rows hold observations 'normalised'.*the replay buffer starts "
                                         "empty"):
        resumed.resume(path)
    assert resumed.buffer is None
    resumed.learn(32)
    assert len(resumed.buffer) == 32


@pytest.mark.parametrize(("algo_name", "env_id", "extra"), [
    ("SAC", "Pendulum-v1", {"normalize_obs": True, "normalize_reward": True}), ("TD3", "Pendulum-v1", {}),
    ("DQN", "CartPole-v1", {})])
def test_a_resumed_offpolicy_population_is_bitwise_the_uninterrupted_one(tmp_path, algo_name, env_id, extra):
    """As for PPO, with the replay buffer saved beside each checkpoint (`save_replay_buffer=True`; the buffer wraps:
    400 rows per member, 1024 steps), so the resumed members sample the same transitions; DQN's epsilon schedule
    keeps the run's span; with normalize_obs and normalize_reward, each member's statistics (those of the member
    pruned on the way as it left) and the running returns carry over."""
    import rlspeed

    algo = getattr(rlspeed, algo_name)

    def make():
        return _offpolicy(algo, env_id, save_replay_buffer=True, **extra)

    expected_summary, expected, checkpoint, saved_steps = _killed_after_first_checkpoint(tmp_path, make)
    assert (tmp_path / "b" / "checkpoint.replay.safetensors").exists()
    _assert_resumes_as_uninterrupted(tmp_path, make, checkpoint, saved_steps, expected, expected_summary)
    replay = checkpoint_tensors(tmp_path / "b" / "final.replay.safetensors")
    for name, value in checkpoint_tensors(tmp_path / "a" / "final.replay.safetensors").items():
        assert torch.equal(replay[name], value), name
    if extra:  # (the statistics are in the checkpoint, the pruned member's among every member's as it left)
        assert {"state.norm.obs_mean", "state.norm.ret_var", "state.final_norm.obs_count"} <= set(expected)


def test_without_the_replay_buffer_a_resumed_population_says_its_replay_starts_empty(tmp_path):
    from rlspeed import SAC

    population = _offpolicy(SAC, "Pendulum-v1")
    population.learn(256, run_dir=tmp_path, checkpoint_freq=128)
    resumed = _offpolicy(SAC, "Pendulum-v1")
    with pytest.warns(UserWarning, match="replay buffer starts empty"):
        resumed.resume(tmp_path / "checkpoint.safetensors")
    assert resumed.num_timesteps == 128
    resumed.learn(128)
    assert resumed.num_timesteps == 256
    # the rows collected since the resume only: 64 steps of 2 envs, less the 2 steps n_step=3 still holds back
    assert len(resumed.buffer) == (64 - 2) * 2


def test_resume_of_a_finished_run_without_a_checkpoint_follows_the_one_rule(tmp_path, capsys, finished_run):
    """A finished population without checkpoint.safetensors (a run shorter than its checkpoint interval) is treated as
    one with it: the same budget has nothing left to train, another is refused in the population's sentence. It was
    refused both times with a single run's sentence ("holds a finished run (summary.json) but no checkpoint")."""
    out = _copy_of(finished_run, tmp_path)
    (out / "checkpoint.safetensors").unlink()
    argv = [*FINISHED, "--out", str(out), "--resume"]
    capsys.readouterr()
    assert cli.main(argv) == 0
    assert "nothing left to train: the population run finished" in capsys.readouterr().out
    assert "holds a finished population run (its summary.json)" in cli_error(capsys, [*argv, "--total-timesteps",
                                                                                     "1024"])


def test_resume_of_a_finished_run_has_nothing_to_train_and_finishes_one_killed_in_its_final_save(tmp_path, capsys,
                                                                                                     monkeypatch,
                                                                                                     finished_run):
    """A batch job's requeue (the same command with --resume) of a population that finished exits 0 with nothing
    left to train, as a single run's does: it was refused with exit 2, which a requeue script reads as a failure;
    so does a smaller budget, as a single run's (it was refused); a larger one is refused (a population writes no
    checkpoint at its end to train on from). One killed after its
    first summary but before its member models were written (its summary's member_models null) was refused too, for
    ever: --resume finishes it from its last checkpoint."""
    out = _copy_of(finished_run, tmp_path)
    argv = [*FINISHED, "--out", str(out)]
    summary = (out / "summary.json").read_bytes()
    capsys.readouterr()
    assert cli.main([*argv, "--resume"]) == 0
    said = capsys.readouterr()
    assert "nothing left to train: the population run finished" in said.out and "unused" not in said.err
    assert (out / "summary.json").read_bytes() == summary  # (the run as it was)
    config = (out / "config.yaml").read_bytes()
    # other settings given to the requeue go unused, and it says which (they went unsaid)
    assert cli.main([*argv, "--resume", "--set", "learning_rate=0.1,0.2", "--eval-episodes", "3"]) == 0
    err = capsys.readouterr().err
    assert "these settings go unused: learning_rate " in err and "-> [0.1, 0.2], eval_episodes " in err
    assert (out / "config.yaml").read_bytes() == config
    assert "holds a finished population run" in cli_error(capsys, [*argv, "--resume", "--total-timesteps", "1024"])
    # a budget it has trained (it was refused, where a single run's exits 0), whatever the target: nothing to train,
    # and the budget and target given go unused, which is said (a change to no target too: it went unsaid)
    assert cli.main([*argv, "--resume", "--total-timesteps", "512", "--target-return", "none"]) == 0
    said = capsys.readouterr()
    assert "nothing left to train: the population run finished" in said.out
    assert "these settings go unused: total_timesteps 768 -> 512, target_return 1000.0 -> None (config" in said.err
    assert (out / "summary.json").read_bytes() == summary and (out / "config.yaml").read_bytes() == config

    def killed(*args):
        raise Killed

    killed_run = tmp_path / "killed"
    argv = [*argv[:-1], str(killed_run)]
    monkeypatch.setattr(cli, "_save_member_models", killed)
    with pytest.raises(Killed):
        cli.main(argv)
    monkeypatch.undo()
    assert json.loads((killed_run / "summary.json").read_text())["member_models"] is None
    assert cli.main([*argv, "--resume"]) == 0
    summary = json.loads((killed_run / "summary.json").read_text())
    assert summary["resumed_from"] == 512 and sorted(summary["member_models"]) == ["0", "1"]
    assert (killed_run / "members" / "seed_1.safetensors").is_file()
    # killed so before any checkpoint was written: --resume trains it again from the start
    early = tmp_path / "early"
    argv = [*argv[:-1], str(early), "--checkpoint-freq", "100000"]
    monkeypatch.setattr(cli, "_save_member_models", killed)
    with pytest.raises(Killed):
        cli.main(argv)
    monkeypatch.undo()
    assert not (early / "checkpoint.safetensors").exists()
    assert cli.main([*argv, "--resume"]) == 0
    assert sorted(json.loads((early / "summary.json").read_text())["member_models"]) == ["0", "1"]


def _stopped_as_training_ended(finished_run, tmp_path) -> tuple[Path, dict]:
    """A copy of `finished_run` as a Ctrl-C as its last iteration ended leaves it (every final_eval null: what the
    stop writes, `_summary(evaluate=False)`), and the finished run's summary."""
    out = _copy_of(finished_run, tmp_path)
    finished = json.loads((out / "summary.json").read_text())
    stopped = {**finished, "aggregate": {**finished["aggregate"], "final_eval": None},
               "members": [{**member, "final_eval": None} for member in finished["members"]]}
    (out / "summary.json").write_text(json.dumps(stopped))
    return out, finished


def test_resume_runs_the_final_evaluation_a_stop_as_training_ended_skipped(tmp_path, capsys, finished_run):
    """A Ctrl-C as the last iteration ends saves the training and skips the final evaluation (its summary.json ends
    with every member's final_eval null). --resume said "nothing left to train" (exit 0) and left it so for ever, and
    rlspeed report refused the run: now --resume finishes it from its checkpoint, with the final evaluation the
    uninterrupted run has, and the report's refusal names --resume."""
    out, finished = _stopped_as_training_ended(finished_run, tmp_path)
    capsys.readouterr()
    assert "rlspeed train ... --resume --out" in cli_error(capsys, ["report", str(out), "--out", str(tmp_path / "r")])
    assert cli.main([*FINISHED, "--out", str(out), "--resume"]) == 0
    assert "nothing left to train: the population run finished" not in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert [m["final_eval"] for m in summary["members"]] == [m["final_eval"] for m in finished["members"]]
    assert summary["aggregate"]["final_eval"] == finished["aggregate"]["final_eval"]
    assert cli.main(["report", str(out), "--out", str(tmp_path / "r")]) == 0


def test_resume_runs_the_skipped_final_evaluation_of_a_run_without_a_checkpoint(tmp_path, capsys, finished_run):
    """A stop as the last iteration ends writes no checkpoint there (a run as long as one checkpoint interval has
    none): its Ctrl-C line and the report's refusal say --resume runs the skipped final evaluation, but --resume said
    "nothing left to train" (exit 0) and left the run without it; it now trains the run again from the beginning,
    as for a run interrupted before its first checkpoint, and ends with the uninterrupted run's final evaluation."""
    out, finished = _stopped_as_training_ended(finished_run, tmp_path)
    (out / "checkpoint.safetensors").unlink()
    capsys.readouterr()
    assert cli.main([*FINISHED, "--out", str(out), "--resume"]) == 0
    assert "training starts from scratch" in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert [m["final_eval"] for m in summary["members"]] == [m["final_eval"] for m in finished["members"]]


@pytest.mark.parametrize("algo_name, env_id", [("PPO", "CartPole-v1"), ("SAC", "Pendulum-v1"),
                                               # (the members' CNN encoders)
                                               pytest.param("PPO", "MinAtar/Breakout-v1", marks=needs_minatar)])
def test_gymnasium_envs_resume_from_fresh_episodes_with_a_warning(tmp_path, algo_name, env_id):
    """Gymnasium envs cannot restore their episodes: the resumed population says so and trains on from fresh
    episodes, with the checkpoint's networks and step count."""
    import rlspeed

    algo = getattr(rlspeed, algo_name)
    settings = (dict(num_envs=4, num_steps=32, batch_size=64, n_epochs=2, net_arch=(16,)) if algo_name == "PPO" else
                dict(num_envs=2, learning_starts=64, batch_size=32, net_arch=(16,), buffer_size=400,
                     save_replay_buffer=True))
    population = Population(algo, env_id, seeds=[1, 2], env_backend="gymnasium", **settings)
    population.learn(256, run_dir=tmp_path, checkpoint_freq=128)
    saved = checkpoint_tensors(tmp_path / "checkpoint.safetensors")
    assert not any(name.startswith("env.") for name in saved)
    resumed = Population(algo, env_id, seeds=[1, 2], env_backend="gymnasium", **settings)
    with pytest.warns(UserWarning, match="training continues from fresh episodes"):
        resumed.resume(tmp_path / "checkpoint.safetensors")
    assert resumed.num_timesteps == 128
    assert all(torch.equal(resumed.member_state(k)[name], value) for k in range(2)
               for name, value in _member_states(saved, algo_name, k, population).items())
    summary = resumed.learn(128, eval_freq=128, eval_episodes=2, on_eval=lambda steps, means: None)
    assert resumed.num_timesteps == 256
    assert [step for step, _ in summary["members"][0]["curve"]] == [256]


def _member_states(saved: dict, algo_name: str, k: int, population) -> dict:
    """Member k's first-layer weight (and a PPO member's first convolution, where it has a CNN encoder) as the
    checkpoint holds it, under `member_state`'s name."""
    if algo_name == "PPO":
        states = {"body.weights.0": saved["state.param.0"][k]}
        if population.encoder_params:  # (stacked after the MLP's weights and biases)
            states["encoder.cnn.0.weight"] = saved[f"state.param.{2 * len(population.weights)}"][k]
        return states
    return {"actor.net.0.weight": saved["state.actor_weights.0"][k].T}


@pytest.mark.parametrize(("backend", "continues"), [("torch", True), ("gymnasium", False)])
def test_a_resume_continues_td3s_ou_noise_only_with_its_episodes(tmp_path, backend, continues):
    """TD3's Ornstein-Uhlenbeck noise belongs to the episodes in progress: a resume that restores them (native envs)
    carries it on; one that starts fresh episodes (Gymnasium envs) starts it from 0, as the solo TD3 does."""
    import warnings

    from rlspeed import TD3

    settings = dict(num_envs=2, learning_starts=32, batch_size=32, net_arch=(16,), buffer_size=400,
                    action_noise="ornstein-uhlenbeck")
    population = Population(TD3, "Pendulum-v1", seeds=[1, 2], env_backend=backend, **settings)
    population.learn(128, run_dir=tmp_path, checkpoint_freq=64)
    saved = checkpoint_tensors(tmp_path / "checkpoint.safetensors")["state.algo.ou_noise"]
    assert saved.abs().sum() > 0

    resumed = Population(TD3, "Pendulum-v1", seeds=[1, 2], env_backend=backend, **settings)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the replay buffer's and the Gymnasium envs' warnings)
        resumed.resume(tmp_path / "checkpoint.safetensors")
    first = first_ou_noise(resumed, lambda: resumed.learn(8))
    assert torch.equal(first, saved if continues else torch.zeros_like(saved))


@pytest.mark.parametrize(("algo_name", "env_id"), [("PPO", "CartPole-v1"), ("DQN", "CartPole-v1")])
def test_a_population_saved_between_learn_calls_resumes_as_it_would_continue(tmp_path, algo_name, env_id):
    """`save` between two `learn` calls (the first stopped early, at its target), `resume` and the second `learn`:
    bitwise the population that went straight on to its second `learn` (which sets its schedules, PPO's annealed
    learning rate and DQN's epsilon, over that call as any new call does)."""
    import rlspeed

    algo = getattr(rlspeed, algo_name)
    build = ((lambda: Population(algo, env_id, seeds=[3, 5, 8], env_backend="torch", anneal_lr=True,
                                 **_settings(algo))) if algo_name == "PPO" else
             (lambda: _offpolicy(algo, env_id, save_replay_buffer=True)))
    continued = build()
    first = continued.learn(1024, target_return=1.0, stop="all", eval_freq=256, eval_episodes=2)
    assert first["reached"] == 3 and continued.num_timesteps == 256
    path = continued.save(tmp_path / "between")
    continued.learn(512)
    resumed = build()
    resumed.resume(path)
    resumed.learn(512)
    expected = checkpoint_tensors(continued.save(tmp_path / "a"))
    actual = checkpoint_tensors(resumed.save(tmp_path / "b"))
    for name, value in expected.items():
        assert torch.equal(actual[name], value), name


@pytest.mark.parametrize("algo_name", ["PPO", "SAC"])
def test_resume_refuses_a_population_that_has_trained(tmp_path, algo_name):
    """`resume` restores onto a newly built population: one that has trained (its replay buffer, its envs) is refused
    in one sentence, whether or not members left it."""
    import rlspeed

    algo = getattr(rlspeed, algo_name)
    build = (lambda: _population(algo, "CartPole-v1")) if algo_name == "PPO" else (lambda: _offpolicy(algo,
                                                                                                     "Pendulum-v1"))
    population = build()
    population.learn(128)
    path = population.save(tmp_path / "checkpoint")
    with pytest.raises(UserError, match="newly built population") as error:
        population.resume(path)
    assert "\n" not in str(error.value)
    build().resume(path)  # (a new one resumes)


def test_replay_rows_of_a_diverging_member_resume(tmp_path):
    """A member whose parameters (and so its actions) became non-finite before it is found and dropped: the checkpoint
    written meanwhile holds its non-finite replay rows, and the resume reads them back like its parameters (not a
    replay buffer refused as unreadable)."""
    import warnings

    from rlspeed import SAC

    settings = dict(num_envs=2, learning_starts=32, batch_size=32, net_arch=(16,), buffer_size=400,
                    learning_rate=[1e-3, 1e30], save_replay_buffer=True)
    population = Population(SAC, "Pendulum-v1", seeds=[1, 2], env_backend="torch", **settings)
    with pytest.warns(UserWarning, match="diverged"):
        population.learn(192, run_dir=tmp_path, checkpoint_freq=128)
    replay = checkpoint_tensors(tmp_path / "checkpoint.replay.safetensors")
    assert not replay["actions"].isfinite().all()
    resumed = Population(SAC, "Pendulum-v1", seeds=[1, 2], env_backend="torch", **settings)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resumed.resume(tmp_path / "checkpoint.safetensors")
    assert torch.equal(resumed.buffer.actions[:len(replay["actions"])].isnan(), replay["actions"].isnan())


def test_a_run_stopped_at_once_before_its_first_checkpoint_says_how_to_train_it_again(tmp_path, capsys, monkeypatch):
    """A second SIGTERM stops at once: before the first checkpoint there is nothing to resume, and the message says
    that --resume (or --overwrite) trains the run directory again (its interrupted summary.json does not make the run
    a finished one)."""
    import os
    import signal

    from rlspeed.population import ppo

    argv = ["train", "ppo", "CartPole-v1", "--seeds", "2,4", *CLI, "--out", str(tmp_path / "run")]
    learn = ppo.PPOPopulation.learn

    def twice_terminated_learn(self, *args, on_eval, **kwargs):
        def terminate_twice_at_128(steps, means):
            if steps == 128:
                os.kill(os.getpid(), signal.SIGTERM)
                os.kill(os.getpid(), signal.SIGTERM)
            return on_eval(steps, means)
        return learn(self, *args, on_eval=terminate_twice_at_128, **kwargs)

    monkeypatch.setattr(ppo.PPOPopulation, "learn", twice_terminated_learn)
    capsys.readouterr()
    assert cli.main(argv) == 143
    assert not (tmp_path / "run" / "checkpoint.safetensors").exists()
    assert "no checkpoint was written yet: --resume (or --overwrite) trains the run again" in capsys.readouterr().err
    monkeypatch.setattr(ppo.PPOPopulation, "learn", learn)
    assert cli.main([*argv, "--resume"]) == 0
    assert "checkpoint.safetensors yet, so training starts from scratch" in capsys.readouterr().out and not json.loads(
        (tmp_path / "run" / "summary.json").read_text()).get("interrupted")


def test_a_dqn_population_with_action_masks_resumes_its_replay_with_the_masks(tmp_path):
    """The replay rows' next-observation masks (Taxi-v4's `info["action_mask"]`) are saved beside the checkpoint and
    come back with the rows, so the targets' argmax after a resume still runs over the allowed actions only. (The
    pending n-step steps load with their masks too; a Gymnasium resume then drops them with the episodes it
    restarts.)"""
    from rlspeed import DQN

    settings = dict(num_envs=2, learning_starts=32, batch_size=16, net_arch=(16,), buffer_size=400, n_step=3,
                    save_replay_buffer=True)
    population = Population(DQN, "Taxi-v4", seeds=[1, 2], **settings)
    population.learn(128, run_dir=tmp_path, checkpoint_freq=64)
    saved = checkpoint_tensors(tmp_path / "checkpoint.replay.safetensors")
    assert saved["next_action_masks"].dtype == torch.bool and not saved["next_action_masks"].all()
    resumed = Population(DQN, "Taxi-v4", seeds=[1, 2], **settings)
    with pytest.warns(UserWarning, match="training continues from fresh episodes"):
        resumed.resume(tmp_path / "checkpoint.safetensors")
    buffer = resumed.buffer
    assert torch.equal(buffer.next_action_masks[:saved["next_action_masks"].shape[0]], saved["next_action_masks"])
    assert len(buffer._window) == 2 and all(len(entry) == 7 for entry in buffer._window)
    resumed.learn(64)
    assert resumed.num_timesteps == 128 and resumed._masking


def test_a_checkpoint_with_float32_normalisation_statistics_resumes(tmp_path):
    """Normalisation statistics are float64 where the device has it, float32 in older checkpoints and on devices
    without float64: such a checkpoint resumes (it was refused as a file that does not fit), its statistics taken in
    the population's dtype."""
    from rlspeed.checkpoint import load_checkpoint, save_checkpoint

    population = _population(PPO, "Pendulum-v1", normalize_obs=True, normalize_reward=True)
    population.learn(256)
    tensors, meta = load_checkpoint(population.save(tmp_path / "population"))
    assert tensors["state.norm.obs_var"].dtype == torch.float64
    older = {name: value.float() if ".norm." in name or "final_norm" in name else value
             for name, value in tensors.items()}
    for key in ("format", "version", "digest"):
        meta.pop(key, None)
    path = save_checkpoint(tmp_path / "older", older, meta)
    resumed = _population(PPO, "Pendulum-v1", normalize_obs=True, normalize_reward=True)
    resumed.resume(path)
    assert torch.equal(resumed._normalization.obs_var, tensors["state.norm.obs_var"].float().double())
    resumed.learn(128)


def test_a_resumed_populations_replay_buffer_is_read_mapped(tmp_path, monkeypatch):
    """As the solo resume (tests/test_checkpoint.py): the replay file is read as views of it mapped in memory and
    copied into the new buffer, not copied whole besides it first (its n-step window: copies of its own)."""
    from rlspeed import SAC, checkpoint

    _offpolicy(SAC, "Pendulum-v1", save_replay_buffer=True).learn(256, run_dir=tmp_path, checkpoint_freq=128)
    calls, load = [], checkpoint.load_checkpoint

    def spy(path, *args, **kwargs):
        calls.append((Path(path).name, kwargs.get("mapped", False)))
        return load(path, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "load_checkpoint", spy)
    resumed = _offpolicy(SAC, "Pendulum-v1", save_replay_buffer=True)
    resumed.resume(tmp_path / "checkpoint.safetensors")
    assert ("checkpoint.replay.safetensors", True) in calls
    assert len(resumed.buffer) > 0


def test_a_population_checkpoints_by_wall_time_too(tmp_path, monkeypatch):
    """`checkpoint_interval_s` writes a checkpoint once that long has passed since the last one (a slow env's 1/20 of
    the budget may be an hour: all lost to a crash); `rlspeed train --seeds` without --checkpoint-freq asks for one
    every CHECKPOINT_INTERVAL_S as a solo run does, and keeps doing so after --resume; without a run_dir it is one
    sentence."""
    from rlspeed.population import base

    saved_at = []
    monkeypatch.setattr(base.PopulationBase, "save", lambda self, path: saved_at.append(self.num_timesteps))
    # (the loop's clock counts this process's CPU time: a checkpoint's measured cost, which spaces the next one at 20
    # times it, is then the save's work, none here, not a moment a loaded machine took the process off its core)
    monkeypatch.setattr(base, "time", types.SimpleNamespace(perf_counter=time.process_time,
                                                            process_time=time.process_time))
    population = Population(PPO, "CartPole-v1", seeds=[0, 1], num_envs=4, num_steps=16, batch_size=64, net_arch=(8,))
    population.learn(64 * 4, run_dir=tmp_path, checkpoint_interval_s=0, progress_bar=False)
    assert saved_at == [64, 128, 192]  # (after every iteration but the last: none is due once training ends)
    with pytest.raises(UserError, match="checkpoint_interval_s=60 needs a run_dir"):
        population.learn(64, checkpoint_interval_s=60)

    asked = []
    learn = base.PopulationBase.learn
    monkeypatch.setattr(base.PopulationBase, "learn", lambda self, total, **kw: asked.append(
        (kw["checkpoint_freq"], kw["checkpoint_interval_s"])) or learn(self, total, **kw))
    argv = ["train", "ppo", "CartPole-v1", "--seeds", "0-1", "--total-timesteps", "128", "--set", "num_envs=4",
            "--set", "num_steps=16", "--set", "batch_size=64", "--set", "net_arch=[8]", "--eval-episodes", "1",
            "--target-return", "none", "--no-progress"]
    assert cli.main([*argv, "--out", str(tmp_path / "run")]) == 0
    assert cli.main([*argv, "--out", str(tmp_path / "run2"), "--checkpoint-freq", "64"]) == 0
    assert asked == [(6, cli.CHECKPOINT_INTERVAL_S), (64, None)]
