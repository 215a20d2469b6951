"""`rlspeed train ALGO ENV --seeds ...`: a population run writes summary.json with one entry per member and
learning_curves.png, takes per-member `--set` values, keeps a run it would overwrite, and answers bad input with one
sentence and exit code 2. Plus the IQM band the plot draws."""

from __future__ import annotations

import csv
import json
import math
import re
import shlex
import shutil
import sys
import warnings
from pathlib import Path

import pytest
import torch
from conftest import cli_error, endless_pendulum_id

from rlspeed import cli
from rlspeed.evaluation import evaluation_seed
from rlspeed.population.plot import iqm_band
from rlspeed.stats import aggregate, iqm

# a few hundred steps: 8 envs x 16 steps per iteration, evaluated every 128 steps against a target never reached
SMALL = ["--set", "num_envs=8", "--set", "num_steps=16", "--set", "batch_size=64", "--set", "n_epochs=2",
         "--total-timesteps", "256", "--eval-freq", "128", "--target-return", "1000"]


@pytest.mark.parametrize("backend", ["torch", "gymnasium"])
def test_a_members_final_evaluation_is_what_rlspeed_eval_gives_for_it(tmp_path, capsys, backend):
    """A member's final_eval mean equals `rlspeed eval MEMBER --seed S --json`'s, number for number (a script
    comparing the two finds them equal), whatever the env backend; its std too (it had none, a solo run's has)."""
    out = tmp_path / "run"
    assert cli.main(["train", "ppo", "CartPole-v1", "--seeds", "0,3", *SMALL, "--env-backend", backend,
                     "--out", str(out)]) == 0
    for member in json.loads((out / "summary.json").read_text())["members"]:
        final = member["final_eval"]
        capsys.readouterr()
        assert cli.main(["eval", str(out / "members" / f"seed_{member['seed']}.safetensors"), "--episodes",
                         str(final["episodes"]), "--seed", str(final["seed"]), "--json"]) == 0
        evaluated = json.loads(capsys.readouterr().out)
        assert evaluated["mean"] == final["mean"]
        assert evaluated["std"] == pytest.approx(final["std"], rel=1e-6, abs=1e-6)


def test_a_members_fractional_returns_are_what_rlspeed_eval_gives_for_it_digit_for_digit(tmp_path, capsys):
    """On an env of fractional returns (Pendulum), a member's final_eval mean and std, and its last curve point and
    metrics.csv cell (the same parameters: the run ends there), equal `rlspeed eval MEMBER --seed S --json`'s
    exactly: formed from the same float64 returns, not rounded to float32 (-1036.2916 for -1036.291655663401)."""
    out = tmp_path / "run"
    assert cli.main(["train", "ppo", "Pendulum-v1", "--seeds", "0,1", "--preset", "none", "--set", "num_envs=8",
                     "--set", "num_steps=16", "--set", "batch_size=64", "--set", "n_epochs=1", "--total-timesteps",
                     "128", "--eval-freq", "128", "--eval-episodes", "2", "--env-backend", "torch", "--out",
                     str(out)]) == 0
    with open(out / "metrics.csv", newline="") as f:
        cells = list(csv.DictReader(f))[-1]
    for member in json.loads((out / "summary.json").read_text())["members"]:
        final, (steps, last) = member["final_eval"], member["curve"][-1]
        path = str(out / "members" / f"seed_{member['seed']}.safetensors")
        for seed, mean, std in ((final["seed"], final["mean"], final["std"]),
                                (evaluation_seed(member["seed"], "learn", steps), last, None)):
            capsys.readouterr()
            assert cli.main(["eval", path, "--episodes", "2", "--seed", str(seed), "--json"]) == 0
            evaluated = json.loads(capsys.readouterr().out)
            assert evaluated["mean"] == mean and evaluated["mean"] != round(evaluated["mean"])
            assert std is None or evaluated["std"] == std
        assert float(cells[f"eval_mean/seed_{member['seed']}"]) == last


def test_a_population_plays_eval_episodes_in_every_evaluation_and_resume_keeps_it(tmp_path, capsys, monkeypatch):
    """`--eval-episodes N` with --seeds: the members' evaluations during training and their final ones play N
    episodes (summary.json's final_eval says N), config.yaml records it and a --resume without the flag keeps it."""
    from rlspeed.population.ppo import PPOPopulation

    played: list[int] = []  # (the episodes each evaluation of the members played)
    evaluate = PPOPopulation.evaluate

    def counting(self, seeds=None, episodes=10, members=None):
        played.append(episodes)
        return evaluate(self, seeds, episodes, members)

    monkeypatch.setattr(PPOPopulation, "evaluate", counting)
    out = tmp_path / "run"
    argv = ["train", "ppo", "CartPole-v1", "--seeds", "0,1", "--env-backend", "torch", *SMALL, "--checkpoint-freq",
            "128", "--out", str(out)]
    assert cli.main([*argv, "--eval-episodes", "2"]) == 0
    assert played == [2, 2, 2]  # (at 128 and 256 steps, then the final evaluation)
    assert [member["final_eval"]["episodes"] for member in json.loads((out / "summary.json").read_text())["members"]
            ] == [2, 2]
    assert "eval_episodes: 2\n" in (out / "config.yaml").read_text()
    assert "final evaluation (deterministic, 2 episodes each)" in capsys.readouterr().out
    # the same run killed after its checkpoint at 128 steps, then resumed without the flag: trained on (an evaluation
    # at 256 steps, then the final one), or ended there (`--total-timesteps 128`: the final evaluation alone)
    from rlspeed.population import base

    class Killed(BaseException):
        pass

    save = base.PopulationBase.save

    def killed_after_saving(self, path):
        save(self, path)
        raise Killed

    for budget, evaluations in ((256, [2, 2]), (128, [2])):
        monkeypatch.setattr(base.PopulationBase, "save", killed_after_saving)
        with pytest.raises(Killed):
            cli.main([*argv, "--overwrite", "--eval-episodes", "2"])
        monkeypatch.setattr(base.PopulationBase, "save", save)
        played.clear()
        capsys.readouterr()
        assert cli.main([*argv, "--resume", "--total-timesteps", str(budget)]) == 0  # (the last one given counts)
        assert played == evaluations
        assert "eval_episodes" not in capsys.readouterr().err
        assert [member["final_eval"]["episodes"]
                for member in json.loads((out / "summary.json").read_text())["members"]] == [2, 2]

def test_a_population_records_its_thread_count_and_a_resume_keeps_it(tmp_path, monkeypatch):
    """`--seeds ... --threads 3`: config.yaml records the count, as a solo run's does, so that --resume without
    --threads trains on it (the population's config.yaml recorded none, and a resume fell back to one thread)."""
    import torch

    from rlspeed import device

    monkeypatch.delenv("RLSPEED_NUM_THREADS", raising=False)
    monkeypatch.setattr(device, "usable_cores", lambda: 4)  # (3 threads also on a smaller machine)
    configured = []  # (the counts the commands set; the caller's own is given back when main returns)
    real = device.configure_threads
    monkeypatch.setattr(device, "configure_threads", lambda count=None: configured.append(real(count)) or
                        configured[-1])
    from rlspeed.population import base

    class Killed(BaseException):
        pass

    save = base.PopulationBase.save

    def killed_after_saving(self, path):  # (the run killed after its checkpoint at 128 steps)
        save(self, path)
        raise Killed

    argv = ["train", "ppo", "CartPole-v1", "--seeds", "0,1", "--env-backend", "torch", *SMALL, "--checkpoint-freq",
            "128", "--no-progress", "--out", str(tmp_path / "run")]
    try:
        monkeypatch.setattr(base.PopulationBase, "save", killed_after_saving)
        with pytest.raises(Killed):
            cli.main([*argv, "--threads", "3"])
        assert (tmp_path / "run" / "config.yaml").read_text().count("\nthreads: 3\n") == 1
        monkeypatch.setattr(base.PopulationBase, "save", save)
        assert cli.main([*argv, "--resume"]) == 0
        assert configured == [3, 3]
    finally:
        torch.set_num_threads(1)


def documented_summary() -> dict:
    """docs/population.md's summary.json sample of `rlspeed train --seeds`, parsed as strict JSON."""
    page = (Path(__file__).resolve().parent.parent / "docs" / "population.md").read_text(encoding="utf-8")
    sample = re.search(r"`summary.json` of `rlspeed train ppo CartPole-v1 --seeds.*?```json\n(.*?)```", page,
                       re.DOTALL)[1]
    return json.loads(sample, parse_constant=lambda constant: pytest.fail(constant))


@pytest.mark.plots
def test_seeds_write_summary_with_every_member_and_the_plot(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "ppo", "CartPole-v1", "--seeds", "0,3,5-6", "--set", "learning_rate=1e-3,2e-3,3e-3,4e-3",
            "--set", "gamma=[0.99, 0.98, 0.97, 0.96]", *SMALL, "--out", str(out)]  # (a list, as the Python API's)
    assert cli.main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    # the fields docs/population.md's sample shows, no more and no fewer (it named neither `population`, `seeds`,
    # `stop` nor `checkpoint_freq`), at every level a script comparing runs reads
    documented = documented_summary()
    assert set(summary) == set(documented)
    assert set(summary["members"][0]) == set(documented["members"][0])
    assert set(summary["members"][0]["final_eval"]) == set(documented["members"][0]["final_eval"])
    assert set(summary["aggregate"]) == set(documented["aggregate"])
    assert set(summary["aggregate"]["final_eval"]) == set(documented["aggregate"]["final_eval"])
    assert summary["population"] == 4 and summary["interrupted"] is False  # (a finished run, as a solo summary says)
    assert summary["stopped_by"] is None  # (its whole budget trained, no target reached)
    assert [member["seed"] for member in summary["members"]] == [0, 3, 5, 6]
    rates = [member["hyperparameters"]["learning_rate"] for member in summary["members"]]
    assert rates == pytest.approx([1e-3, 2e-3, 3e-3, 4e-3])
    assert [member["hyperparameters"]["gamma"] for member in summary["members"]] == [0.99, 0.98, 0.97, 0.96]
    for member in summary["members"]:
        assert [step for step, _ in member["curve"]] == [128, 256]
    assert summary["aggregate"]["final_eval"]["runs"] == 4
    # what a single run's summary says of the machinery, read the same way by scripts comparing runs: what ran, the
    # checkpoints' encryption, clocks to 0.1 ms and sps to 0.1
    assert summary["accelerate"] == {"precision": "fp32", "compile": "off"}
    assert "checkpoint_encryption" in summary and summary["checkpoint_encryption"] is None
    for key, digits in (("train_wall_s", 4), ("train_cpu_s", 4), ("sps", 1)):
        assert summary[key] > 0 and summary[key] == round(summary[key], digits), (key, summary[key])
    png = (out / "learning_curves.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    # each member as a model of its own, which `rlspeed eval` and `export` take (the directory itself: one sentence)
    assert summary["member_models"] == {str(seed): f"members/seed_{seed}.safetensors" for seed in (0, 3, 5, 6)}
    from rlspeed import PPO  # (a member's file holds the steps it trained: its learn counts on, as a solo model's)

    assert PPO.load(out / "members" / "seed_3.safetensors").num_timesteps == summary["total_timesteps"] == 256
    capsys.readouterr()
    assert cli.main(["eval", str(out / "members" / "seed_3.safetensors"), "--episodes", "2"]) == 0
    assert "PPO on CartPole-v1" in capsys.readouterr().out
    # the run directory: every member evaluated on fresh episodes (its seed's own, which `rlspeed eval MEMBER --seed`
    # repeats), and the aggregate summary.json gives (was refused, naming one member's model)
    assert cli.main(["eval", str(out), "--episodes", "2", "--seed", "7", "--json"]) == 0
    printed = capsys.readouterr()
    evaluated = json.loads(printed.out)
    assert [entry["member_seed"] for entry in evaluated["members"]] == [0, 3, 5, 6]
    assert [entry["seed"] for entry in evaluated["members"]] == [evaluation_seed(s, "members", 7) for s in (0, 3, 5, 6)]
    assert evaluated["aggregate"] == aggregate([entry["mean"] for entry in evaluated["members"]])
    assert evaluated["seed"] == 7 and evaluated["episodes"] == 2
    assert "4 PPO members on CartPole-v1, deterministic, 2 episodes each, seed 7: median " in printed.err
    member = evaluated["members"][1]
    assert cli.main(["eval", member["model"], "--episodes", "2", "--seed", str(member["seed"]), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["mean"] == member["mean"]
    assert cli_error(capsys, ["eval", str(out), "--video", str(tmp_path / "v.mp4")]).startswith(
        "rlspeed: error: --video films one model: give one member's, e.g. rlspeed eval ")
    # (its members/ folder named the file it lacked, model.safetensors, not one of the members' it holds)
    first = out / "members" / "seed_0.safetensors"
    assert cli_error(capsys, ["eval", str(out / "members")]).endswith(f"e.g. '{first}'.")
    config = (out / "config.yaml").read_text()
    assert "seeds:" in config
    # the run is kept unless --overwrite is given
    message = cli_error(capsys, argv)
    assert "already holds a run" in message
    assert cli.main([*argv, "--overwrite"]) == 0


def test_a_one_member_population_prints_no_interval_of_no_width(tmp_path, capsys):
    """`--seeds 5` printed "IQM 49.3 (95% CI 49.3 to 49.3)": a bootstrap over one run resamples it alone, an interval
    of no width that reads as certainty. The line says there is none; summary.json keeps rlspeed.stats' numbers."""
    out = tmp_path / "run"
    assert cli.main(["train", "ppo", "CartPole-v1", "--seeds", "5", *SMALL, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    final = json.loads((out / "summary.json").read_text())["aggregate"]["final_eval"]
    assert final["runs"] == 1 and final["iqm_ci"] == [final["iqm"], final["iqm"]]
    line = next(line for line in printed.splitlines() if line.startswith("rlspeed: final evaluation"))
    assert "(one member: no interval)" in line and "95% CI" not in line


@pytest.mark.parametrize("argv, names", [
    (["--seeds", ""], "at least one member"),
    (["--seeds", "5-3"], "empty"),
    (["--seeds", "0-3,2"], "more than once"),
    (["--seeds", "1,1"], "more than once"),
    (["--seeds", "0-4000000000"], "at most"),
    (["--seeds", "0-2", "--set", "learning_rate=1e-3,2e-3"], "2 per-member values"),
    (["--seeds", "0-2", "--set", "learning_rate=[1e-3, 2e-3]"], "2 per-member values"),
    (["--seeds", "0-1", "--set", "net_arch=[64,64],[32,32]"], "net_arch"),
    (["--seeds", "0-1", "--set", "batch_size=64,128"], "batch_size"),
    (["--seeds", "0-1", "--set", "learning_rate=1e-3,-1"], "learning_rate"),
    (["--seeds", "0-1", "--seed", "3"], "--seed"),
    (["--seeds", "0-1", "--set", "lr=1e-3,2e-3"], "Unknown hyperparameter 'lr'"),  # (not "cannot differ")
    # (populations have no acceleration layer nor env-numerics guard: these were ignored without a word)
    (["--seeds", "0-1", "--accelerate", "auto"], "--accelerate auto does not apply"),
    (["--seeds", "0-1", "--nan-policy", "mask"], "--nan-policy mask does not apply"),
])
def test_bad_population_input_is_one_sentence(capsys, tmp_path, argv, names):
    message = cli_error(capsys, ["train", "ppo", "CartPole-v1", *argv, "--out", str(tmp_path / "run")])
    assert names in message
    assert not (tmp_path / "run").exists()  # nothing written


@pytest.mark.parametrize("value", ["1e-3,2e-3", "[1e-3, 2e-3]"])
def test_per_member_values_without_seeds_say_to_add_seeds(capsys, tmp_path, value):
    """A solo run given one learning rate per member said the list 'is not a valid float'."""
    message = cli_error(capsys, ["train", "ppo", "CartPole-v1", "--set", f"learning_rate={value}", "--out",
                                 str(tmp_path / "run")])
    assert "gives 2 values, one per member of a population: add --seeds with 2 seeds (e.g. --seeds 0-1)" in message
    assert not (tmp_path / "run").exists()


def test_seeds_with_an_algorithm_without_population(capsys, tmp_path):
    message = cli_error(capsys, ["train", "recurrent_ppo", "CartPole-v1", "--seeds", "0-3", "--out",
                                 str(tmp_path / "run")])
    assert "RecurrentPPO" in message and "population" in message


def test_iqm_band_holds_a_finished_curve_at_its_last_value():
    # member 0 stopped at step 2 (target reached): it counts with 10 at steps 3 and 4
    curves = [[(1, 0.0), (2, 10.0)], [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0)], [(1, 2.0), (2, 3.0), (3, 5.0),
                                                                                 (4, 6.0)],
              [(1, 3.0), (2, 4.0), (3, 6.0), (4, 8.0)]]
    steps, centre, low, high = iqm_band(curves, reps=200)
    assert steps == [1, 2, 3, 4]
    assert centre[2] == pytest.approx(iqm([10.0, 3.0, 5.0, 6.0]))
    assert centre[3] == pytest.approx(iqm([10.0, 4.0, 6.0, 8.0]))
    assert all(lo <= c <= hi for lo, c, hi in zip(low, centre, high))


@pytest.mark.plots
def test_the_plot_legend_names_the_member_lines_and_leaves_the_curves_uncovered(tmp_path, monkeypatch):
    """A reader of learning_curves.png must see what the thin lines are and every point of the IQM: the legend named
    only the band, the IQM and the target, and sat in the lower right, over curves that end low (a population at 0
    below a target of 90, as SAC's first steps on MountainCarContinuous)."""
    from rlspeed.population import plot

    figures = []
    made = plot.agg_figure
    monkeypatch.setattr(plot, "agg_figure", lambda *args, **kw: figures.append(made(*args, **kw)) or figures[-1])
    members = [{"curve": [[2048, -0.01 * k], [3008, -0.001 * k]]} for k in range(1, 5)]
    summary = {"algo": "sac", "env_id": "MountainCarContinuous-v0", "target_return": 90.0, "members": members}
    assert plot.plot_learning_curves(summary, tmp_path / "curves.png").stat().st_size > 0
    ax = figures[0].axes[0]
    legend = ax.get_legend()
    assert "each member" in [text.get_text() for text in legend.get_texts()]
    box = legend.get_window_extent(figures[0].canvas.get_renderer())
    centre = next(line for line in ax.lines if line.get_linewidth() > 2)
    points = ax.transData.transform(list(zip(centre.get_xdata(), centre.get_ydata())))
    assert not any(box.contains(x, y) for x, y in points)


@pytest.mark.plots
def test_the_plots_iqm_leaves_a_member_out_from_the_step_it_diverged_at(tmp_path, monkeypatch):
    """A member that diverged after its first evaluations held its last finite evaluation in the IQM to the end of
    the plot, while summary.json's final-evaluation aggregate leaves it out: a policy with NaN weights drawn as one
    scoring 500. It counts before it diverged, as the others, and not from there on."""
    from rlspeed.population import plot

    figures = []
    made = plot.agg_figure
    monkeypatch.setattr(plot, "agg_figure", lambda *args, **kw: figures.append(made(*args, **kw)) or figures[-1])
    members = [{"curve": [[100, 10.0 * k], [200, 20.0 * k], [300, 30.0 * k]]} for k in range(1, 4)]
    members.append({"curve": [[100, 500.0]], "diverged_at": 150, "final_eval": None})
    summary = {"algo": "ppo", "env_id": "CartPole-v1", "target_return": None, "members": members}
    assert plot.plot_learning_curves(summary, tmp_path / "curves.png").stat().st_size > 0
    centre = next(line for line in figures[0].axes[0].lines if line.get_linewidth() > 2)
    assert list(centre.get_xdata()) == [100, 200, 300]
    assert list(centre.get_ydata()) == pytest.approx([iqm([10.0, 20.0, 30.0, 500.0]), iqm([20.0, 40.0, 60.0]),
                                                     iqm([30.0, 60.0, 90.0])])


def test_seeds_print_each_evaluation_and_ctrl_c_keeps_the_evaluations(tmp_path, capsys, monkeypatch):
    """A line per evaluation while it trains; Ctrl-C after the second evaluation exits 130 with summary.json holding
    each member's evaluations so far (`--resume` continues from the checkpoint: tests/test_population_resume.py)."""
    from rlspeed.population import ppo

    learn = ppo.PPOPopulation.learn

    def interrupted_learn(self, *args, on_eval, **kwargs):
        def stop_after_two(steps, means):
            on_eval(steps, means)
            if steps >= 256:
                raise KeyboardInterrupt
            return []
        return learn(self, *args, on_eval=stop_after_two, **kwargs)

    monkeypatch.setattr(ppo.PPOPopulation, "learn", interrupted_learn)
    out = tmp_path / "run"
    argv = ["train", "ppo", "CartPole-v1", "--seeds", "0-1", *SMALL, "--total-timesteps", "1024", "--out", str(out)]
    assert cli.main(argv) == 130
    captured = capsys.readouterr()
    assert "128 steps per member, 2 of 2 members evaluated" in captured.out
    summary = json.loads((out / "summary.json").read_text())
    # the median of two members is their mean (the line said the higher one)
    means = sorted(member["curve"][0][1] for member in summary["members"])
    assert f"median {sum(means) / 2:.1f}, range {means[0]:.1f} to {means[1]:.1f}" in captured.out
    assert "interrupted (Ctrl-C)" in captured.err
    assert summary["interrupted"] is True and summary["stopped_by"] == "signal"
    assert [[step for step, _ in member["curve"]] for member in summary["members"]] == [[128, 256], [128, 256]]
    # each member as a model of its own, as `rlspeed eval`'s pointer for a population checkpoint says
    assert summary["member_models"] == {str(seed): f"members/seed_{seed}.safetensors" for seed in (0, 1)}
    assert cli.main(["eval", str(out / "members" / "seed_1.safetensors"), "--episodes", "2", "--seed", "0"]) == 0


def test_tune_without_optuna_names_the_package(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)  # as on an install without the tune extra
    message = cli_error(capsys, ["tune", "ppo", "CartPole-v1", "--trials", "4"])
    assert "pip install optuna" in message


def test_a_single_run_resume_of_a_population_names_the_population_command(tmp_path, monkeypatch, capsys):
    """--resume without --seeds on a population's directory failed on its per-member values ("learning_rate got
    [0.001, 0.002], which is not a valid float"); for a finished population the command it then named was refused
    in turn ("holds a finished population run"): that is said at once."""
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "ppo", "CartPole-v1", "--no-progress", "--total-timesteps", "512", "--target-return",
                     "none", "--seeds", "0,1", "--set", "learning_rate=1e-3,2e-3", "--out", "pop"]) == 0
    capsys.readouterr()
    code = cli.main(["train", "ppo", "CartPole-v1", "--no-progress", "--out", "pop", "--resume"])
    assert code == 2
    assert "holds a finished population run (seeds 0,1, its summary.json)" in capsys.readouterr().err
    (tmp_path / "pop" / "summary.json").unlink()  # (as a population killed before its end leaves it)
    code = cli.main(["train", "ppo", "CartPole-v1", "--no-progress", "--out", "pop", "--resume"])
    assert code == 2
    assert "holds a population's run (seeds 0,1): resume it as a population" in capsys.readouterr().err


def _dict_cartpole(**kwargs):
    import gymnasium as gym
    import numpy as np

    space = gym.spaces.Dict({"position": gym.spaces.Box(-np.inf, np.inf, (2,), np.float32),
                             "velocity": gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)})
    return gym.wrappers.TransformObservation(gym.make("CartPole-v1", **kwargs),
                                             lambda o: {"position": o[:2], "velocity": o[2:]}, space)


def test_a_population_on_float_dict_observations_normalises_them_under_the_default_preset(tmp_path, capsys):
    """The shipped default PPO preset sets normalize_obs, which a solo run applies to a Dict's float keys: a
    population refused it for any encoder (so `--seeds` on such an env left it out with a note); it normalises each
    member's float keys as the solo run does now, and keeps the preset's value."""
    import gymnasium as gym

    if "DictCartPole-v0" not in gym.registry:
        gym.register("DictCartPole-v0", entry_point=_dict_cartpole, max_episode_steps=500)
    assert cli.main(["train", "ppo", "DictCartPole-v0", "--seeds", "0-1", *SMALL, "--no-progress", "--out",
                     str(tmp_path / "run")]) == 0
    assert "normalize_obs is left out" not in capsys.readouterr().err
    assert "normalize_obs: true" in (tmp_path / "run" / "config.yaml").read_text()


def test_a_population_on_an_env_variant_has_no_stock_target_as_a_solo_run(tmp_path, capsys):
    """An env made with options is a variant the registered reward_threshold says nothing of: a solo run has no
    target then, and a population stopped its members at the registered one (FrozenLake's 0.7, under a note calling
    it the preset's), so `--seeds` trained less than the same command without it."""
    command = ["train", "ppo", "FrozenLake-v1", "--env-kwargs", "is_slippery=false", *SMALL[:-2], "--no-progress"]
    assert cli.main([*command, "--seeds", "0-1", "--out", str(tmp_path / "population")]) == 0
    assert cli.main([*command, "--out", str(tmp_path / "solo")]) == 0
    assert "as registered" not in capsys.readouterr().err
    for run in ("population", "solo"):
        assert json.loads((tmp_path / run / "summary.json").read_text())["target_return"] is None, run


@pytest.mark.plots
def test_the_population_plot_of_an_env_id_the_font_cannot_draw_warns_nothing(tmp_path):
    """A Chinese env id in the plot's title drew boxes and printed one 'Glyph ... missing from font' warning per
    character after the run."""
    import warnings

    from rlspeed.population.plot import plot_learning_curves

    summary = {"algo": "ppo", "env_id": "中文/平衡杆-v0", "target_return": None,
               "members": [{"curve": [[0, 1.0], [100, 2.0]]}, {"curve": [[0, 1.5], [100, 2.5]]}]}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert plot_learning_curves(summary, tmp_path / "curves.png").stat().st_size > 0


@pytest.mark.plots
def test_the_population_plot_of_one_evaluation_shows_it(tmp_path, monkeypatch):
    """A run as long as its eval_freq (`--seeds 0-255 --total-timesteps 1024`) has one evaluation per member: each
    curve, and the IQM, were lines of no length, and learning_curves.png showed empty axes. They are dots now."""
    from rlspeed.population import plot

    figures = []
    made = plot.agg_figure
    monkeypatch.setattr(plot, "agg_figure", lambda *args, **kw: figures.append(made(*args, **kw)) or figures[-1])
    summary = {"algo": "ppo", "env_id": "CartPole-v1", "target_return": None,
               "members": [{"curve": [[1024, 40.0 + k]]} for k in range(8)]}
    assert plot.plot_learning_curves(summary, tmp_path / "curves.png").stat().st_size > 0
    lines = figures[0].axes[0].lines
    assert len(lines) == 9 and all(line.get_marker() not in (None, "None", "", " ") for line in lines)


@pytest.mark.plots
def test_a_population_killed_before_its_plot_is_finished_by_resume_with_the_plot(tmp_path, monkeypatch):
    """learning_curves.png was drawn after the summary.json that ends the run: a kill in between left a finished run
    without its plot, which --resume refused to touch ("holds a finished population run"). The plot comes first now,
    so the run the kill leaves is one --resume finishes."""
    import rlspeed.population.plot as plot

    class Killed(BaseException):  # (a SIGKILL: nothing after it runs)
        pass

    def killed(summary, path):
        raise Killed

    out = tmp_path / "run"
    argv = ["train", "ppo", "CartPole-v1", "--seeds", "0,1", *SMALL, "--checkpoint-freq", "128", "--out", str(out)]
    with monkeypatch.context() as patch:
        patch.setattr(plot, "plot_learning_curves", killed)
        with pytest.raises(Killed):
            cli.main(argv)
    assert json.loads((out / "summary.json").read_text())["member_models"] is None  # (no finished run)
    assert not (out / "learning_curves.png").exists()
    assert cli.main([*argv, "--resume"]) == 0
    assert (out / "learning_curves.png").read_bytes().startswith(b"\x89PNG")


def test_a_populations_final_line_says_how_many_episodes_were_cut_short(tmp_path, capsys, monkeypatch):
    """Members evaluated on an env whose episodes never end: the final line says how many of all the members'
    episodes were cut short at the step limit (it read as if they had ended), and so do each evaluation's line in
    training and its metrics.csv row's `eval_unfinished` (the warning shows once)."""
    import rlspeed.evaluation

    env_id = endless_pendulum_id()
    monkeypatch.setattr(rlspeed.evaluation, "UNLIMITED_EPISODE_STEPS", 30)  # (10,000 steps: the same, slower)
    argv = ["train", "ppo", env_id, "--seeds", "0-1", *SMALL[:8], "--total-timesteps",
            "128", "--eval-episodes", "2", "--eval-freq", "64", "--out", str(tmp_path / "run"), "--no-progress"]
    with pytest.warns(UserWarning, match="4 of 4 episodes were still running after 30 steps"):
        assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "final evaluation (deterministic, 2 episodes each, 4 of 4 cut short at the step limit)" in out
    lines = [line for line in out.splitlines() if "members evaluated" in line]
    assert lines and all("2 of 2 members evaluated, 4 of 4 cut short at the step limit: " in line
                         for line in lines), lines
    with open(tmp_path / "run" / "metrics.csv", newline="", encoding="utf-8") as handle:  # (and metrics.csv's rows)
        cuts = [(row["eval_unfinished/seed_0"], row["eval_unfinished/seed_1"]) for row in csv.DictReader(handle)
                if row["eval_mean/seed_0"]]
    assert cuts and set(cuts) == {("2", "2")}, cuts  # (each member's, as its eval_mean/seed_S)


def test_a_populations_confirmations_say_how_many_episodes_were_cut_short(tmp_path, capsys, monkeypatch):
    """Members whose evaluation reached the target are confirmed on fresh episodes; where those were cut short at the
    step limit, the reached line says how many, and so do the members' `confirmations_unfinished` in summary.json
    (beside `confirmations`)."""
    import rlspeed.evaluation

    monkeypatch.setattr(rlspeed.evaluation, "UNLIMITED_EPISODE_STEPS", 30)  # (10,000 steps: the same, slower)
    argv = ["train", "ppo", endless_pendulum_id(), "--seeds", "0-1", *SMALL[:8], "--total-timesteps", "128",
            "--eval-episodes", "2", "--eval-freq", "64", "--target-return", "-1000", "--out", str(tmp_path / "run"),
            "--no-progress"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the warnings of the cut episodes and of the target: tested elsewhere)
        assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "2 of 2 members reached -1000 (confirmations on fresh episodes, 4 of 4 cut short at the step limit)" in out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert [member["confirmations_unfinished"] for member in summary["members"]] == [[2], [2]]
    assert summary["stopped_by"] == "target"  # (both reached at step 64 of 128; the field was missing)


def test_a_population_whose_members_all_left_early_says_members_left():
    """summary.json's `stopped_by` of a population that trained fewer steps than its budget because every member left
    (pruned, diverged, or some reached and the rest left) is "members_left", not the "target" of all reaching it nor
    the null of a whole budget trained."""
    def summary(reached, trained):
        return {"population": 4, "reached": reached, "total_timesteps": trained}

    assert cli._population_stopped_by(summary(1, 64), 128) == "members_left"
    assert cli._population_stopped_by(summary(0, 127), 128) == "members_left"
    assert cli._population_stopped_by(summary(4, 64), 128) == "target"
    assert cli._population_stopped_by(summary(1, 128), 128) is None


def test_an_off_policy_population_under_a_zoo_preset_that_normalises_normalises(tmp_path, capsys, monkeypatch):
    """RL-Zoo's `normalize: True` for SAC is normalize_obs and normalize_reward, which off-policy populations left
    out (they refused them): `--preset zoo --seeds` trains with both, as the solo runs would."""
    from rlspeed.presets import zoo

    if zoo.zoo_version() is None:
        pytest.skip("rl_zoo3 is not installed")
    entries = zoo.zoo_entries
    monkeypatch.setattr(zoo, "zoo_entries", lambda algo: {**entries(algo), "Pendulum-v1": {
        "normalize": True, "n_timesteps": 64, "learning_starts": 16,
        "batch_size": 16, "policy_kwargs": "dict(net_arch=[8])"}})
    assert cli.main(["train", "sac", "Pendulum-v1", "--preset", "zoo", "--seeds", "0-1", "--target-return", "none",
                     "--eval-episodes", "1", "--no-progress", "--out", str(tmp_path / "run")]) == 0
    assert "left out" not in capsys.readouterr().err
    config = (tmp_path / "run" / "config.yaml").read_text()
    assert "normalize_obs: true" in config and "normalize_reward: true" in config


@pytest.fixture(scope="module")
def population_run(tmp_path_factory) -> Path:
    """A two-member population's run (seeds 0 and 3) of a few hundred steps on CartPole with an env option of its own
    (max_episode_steps=50), for `rlspeed eval RUN_DIR`."""
    from rlspeed.population import plot

    out = tmp_path_factory.mktemp("population") / "run"
    with pytest.MonkeyPatch.context() as patch:  # (no plot: as `_plots_only_where_asked`, which is per test)
        patch.setattr(plot, "plot_learning_curves", lambda summary, path: None)
        assert cli.main(["train", "ppo", "CartPole-v1", "--seeds", "0,3", *SMALL[:8], "--total-timesteps", "128",
                         "--eval-freq", "128", "--eval-episodes", "1", "--env-kwargs", "max_episode_steps=50",
                         "--no-progress", "--out", str(out)]) == 0
    return out


def test_eval_run_dir_names_the_env_options_and_each_members_command_repeats_its_line(population_run, capsys,
                                                                                       tmp_path, monkeypatch):
    """`rlspeed eval RUN_DIR`'s lines named no env option (the run's own, or --env-kwargs), and each member's hint was
    "--seed S repeats it with MEMBER", which without --stochastic, --episodes and --env-kwargs played other episodes:
    the hint is now the whole command, and running it gives the member's numbers, also where the modules this one
    imported (--gym-packages, an --env module:EnvId's) are not imported yet (the hint left them out: its --env was not
    registered)."""
    import gymnasium

    capsys.readouterr()
    assert cli.main(["eval", str(population_run), "--episodes", "2", "--seed", "7", "--no-progress"]) == 0
    assert "2 PPO members on CartPole-v1 (max_episode_steps=50), deterministic, 2 episodes each, seed 7: median " in \
        capsys.readouterr().out
    (tmp_path / "hint_envs.py").write_text("import gymnasium\n\ngymnasium.register('HintCartPole-v0', entry_point="
                                           "'gymnasium.envs.classic_control.cartpole:CartPoleEnv', "
                                           "max_episode_steps=20)\n")
    (tmp_path / "hint_extra.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))

    def forget_modules():  # (as a fresh process, which has imported neither module)
        gymnasium.registry.pop("HintCartPole-v0", None)
        for module in ("hint_envs", "hint_extra"):
            sys.modules.pop(module, None)

    try:
        for given in (["--stochastic", "--env-kwargs", "max_episode_steps=20"],
                      ["--env", "hint_envs:HintCartPole-v0", "--gym-packages", "hint_extra"]):
            assert cli.main(["eval", str(population_run), "--episodes", "3", "--seed", "7", *given, "--no-progress",
                             "--json"]) == 0
            printed = capsys.readouterr()
            if "--stochastic" in given:
                assert ("2 PPO members on CartPole-v1 (max_episode_steps=20), stochastic, 3 episodes each, seed 7: "
                        in printed.err)
            evaluated = json.loads(printed.out)["members"]
            commands = re.findall(r"^rlspeed: seed \d+: .* \((rlspeed eval .*) repeats it\)$", printed.err,
                                  re.MULTILINE)
            assert len(commands) == len(evaluated) == 2
            for command, member in zip(commands, evaluated):
                argv = shlex.split(command)
                assert argv[:3] == ["rlspeed", "eval", member["model"]]
                forget_modules()
                assert cli.main([*argv[1:], "--no-progress", "--json"]) == 0
                repeated = json.loads(capsys.readouterr().out)
                assert (repeated["mean"], repeated["std"], repeated["episodes"], repeated["seed"]) == (
                    member["mean"], member["std"], 3, member["seed"])
    finally:
        forget_modules()


def test_eval_run_dir_evaluates_the_members_as_one_batch_with_each_ones_own_numbers(population_run, capsys,
                                                                                    monkeypatch):
    """`rlspeed eval RUN_DIR` evaluated its members one model at a time (a 16-member run: 16 evaluations, most of its
    time): deterministic on the members' own env it plays them as one population, and prints what the one-at-a-time
    path prints, every line and --json entry (returns, lengths, seeds) alike. On Gymnasium's envs, which step row by
    row, too (each row's env steps until its first episode ends, not until the longest of all members' ends)."""
    from rlspeed.population import base

    batches = []
    played = base.PopulationBase._mean_returns

    def counted(self, seeds, *args, **kwargs):
        batches.append(len(seeds))
        return played(self, seeds, *args, **kwargs)

    monkeypatch.setattr(base.PopulationBase, "_mean_returns", counted)
    printed = {}
    for batched in (True, False):  # (the command's own choice first, then each member alone)
        if not batched:
            monkeypatch.setattr(cli, "_batches_members", lambda args: False)
        capsys.readouterr()
        assert cli.main(["eval", str(population_run), "--episodes", "3", "--seed", "7", "--no-progress", "--json"]) == 0
        printed[batched] = capsys.readouterr()
        assert batches == [2]  # (the two members in one evaluation, by the command's choice; none alone)
    assert printed[True].out == printed[False].out and printed[True].err == printed[False].err
    members = json.loads(printed[True].out)["members"]
    assert [len(member["lengths"]) for member in members] == [3, 3] and all(
        0 < length <= 50 for member in members for length in member["lengths"])
    # (with progress shown, the batch, which has no bar and whose members' lines come when all are done, says so)
    monkeypatch.undo()
    assert cli.main(["eval", str(population_run), "--episodes", "3", "--seed", "7"]) == 0
    assert "rlspeed: evaluating the 2 members as one batch, 3 episodes each ..." in capsys.readouterr().err


def test_eval_run_dir_batches_dict_observation_members_with_normalize_obs_and_plays_their_own_episodes(capsys,
                                                                                                       monkeypatch):
    """A Dict-observation population with normalize_obs: its member files name each key's statistics
    (`obs_rms.<key>.mean`, ...), which the batch restored as flat `obs_rms.mean` only, so `rlspeed eval RUN_DIR` fell
    back to one member at a time without a word. The batch holds each member's statistics and plays the episodes
    each member's own evaluation plays."""
    import argparse

    import gymnasium as gym

    from rlspeed import PPO
    from rlspeed.population import Population

    if "DictCartPole-v0" not in gym.registry:
        gym.register("DictCartPole-v0", entry_point=_dict_cartpole, max_episode_steps=500)
    population = Population(PPO, "DictCartPole-v0", seeds=[0, 3], num_envs=4, num_steps=16, batch_size=32,
                            n_epochs=1, normalize_obs=True, normalize_reward=True, verbose=0)
    population.learn(64)  # (statistics of their own, not fresh ones)
    models = [population.member_model(k) for k in range(2)]
    capsys.readouterr()
    results = cli._batched_evaluations(argparse.Namespace(no_progress=True, episodes=2), models, [5, 6])
    assert capsys.readouterr().err == ""
    assert [result["returns"] for result in results] == [model.evaluate(episodes=2, seed=seed)["returns"]
                                                         for model, seed in zip(models, (5, 6))]


def test_eval_run_dir_says_why_its_members_are_not_evaluated_as_one_batch(capsys):
    """Members that are not one population's (here two models of one seed) were evaluated one at a time without a
    word (the reason was swallowed, also under --debug): one line says so and why."""
    import argparse

    from rlspeed import PPO

    models = [PPO("CartPole-v1", seed=0, device="cpu", num_envs=2, env_backend="torch", verbose=0) for _ in range(2)]
    capsys.readouterr()
    assert cli._batched_evaluations(argparse.Namespace(no_progress=True, episodes=2), models, [5, 6]) is None
    assert capsys.readouterr().err == ("rlspeed: evaluating the members one at a time, not as one batch: Seed(s) 0 "
                                       "given more than once: members of a population need distinct seeds.\n")
    models[1].device = torch.device("cuda", 0)  # (as loaded with --device cuda: the batch is the CPU's)
    assert cli._batched_evaluations(argparse.Namespace(no_progress=True, episodes=2), models, [5, 6]) is None
    assert capsys.readouterr().err == ("rlspeed: evaluating the members one at a time, not as one batch: The members "
                                       "are loaded on cuda:0; a batch is evaluated on the CPU (--device cpu).\n")


def test_eval_run_dir_of_one_saved_member_names_it_and_the_member_without_a_model(population_run, capsys, tmp_path):
    """A run whose other member has no model (one that diverged is not saved) is evaluated on the one it has, which
    the last line called "1 PPO members"; the member without a model is named."""
    run = tmp_path / "run"
    shutil.copytree(population_run, run)
    (run / "members" / "seed_3.safetensors").unlink()
    capsys.readouterr()
    assert cli.main(["eval", str(run), "--episodes", "2", "--seed", "7", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "rlspeed: 1 PPO member on CartPole-v1 (max_episode_steps=50), deterministic, 2 episodes each" in out
    assert "(one member: no interval); 1 of 2 members have no model (a member that diverged is not saved): seed 3" \
        in out


def test_eval_run_dir_leaves_out_and_names_members_without_a_finite_mean(population_run, capsys, monkeypatch):
    """A member whose mean return is not finite was dropped from the aggregate without a word, and where no mean was
    finite `rlspeed eval RUN_DIR` ended in stats' "Scores must be a non-empty array" after the members' lines, without
    its --json: such members are named, and with none finite the line says there is no median or IQM (null in
    --json)."""
    means = {}

    def evaluated(args, model, env_id, env_kwargs, seed):
        return {"mean": means[model.seed], "std": 0.0, "episodes": args.episodes, "unfinished": 0}

    monkeypatch.setattr(cli, "_evaluated", evaluated)
    monkeypatch.setattr(cli, "_batches_members", lambda args: False)  # (each member through `_evaluated`)
    for finite in ([], [0]):
        means.update({0: 12.5 if finite else math.nan, 3: math.inf})
        capsys.readouterr()
        assert cli.main(["eval", str(population_run), "--seed", "7", "--no-progress", "--json"]) == 0
        printed = capsys.readouterr()
        result = json.loads(printed.out)
        line = printed.err.splitlines()[-1]
        if finite:
            assert result["aggregate"] == aggregate([12.5])
            assert line.endswith("(one member: no interval); seed 3 left out (mean not finite)")
        else:
            assert result["aggregate"] is None and [entry["mean"] for entry in result["members"]] == [None, None]
            assert line.endswith("seed 7: no median or IQM: no member's mean return is finite")


def test_a_populations_final_line_names_members_without_a_finite_mean(tmp_path, capsys, monkeypatch):
    """A member whose final mean return is not finite was left out of the final line's median and IQM without a word,
    and with none finite the run printed no final line at all (summary.json's aggregate null): named, or said."""
    from rlspeed.population import ppo

    evaluate = ppo.PPOPopulation.evaluate
    not_finite = []

    def evaluated(self, seeds=None, episodes=10, members=None, max_steps=None):
        means = evaluate(self, seeds, episodes, members, max_steps)
        return torch.tensor([math.nan if self.seeds[k] in not_finite else mean
                             for k, mean in zip(members, means.tolist())], dtype=torch.float64)

    monkeypatch.setattr(ppo.PPOPopulation, "evaluate", evaluated)
    for case in ([3], [0, 3]):
        not_finite[:] = case
        out = tmp_path / f"run{len(case)}"
        assert cli.main(["train", "ppo", "CartPole-v1", "--seeds", "0,3", *SMALL[:8], "--total-timesteps", "128",
                         "--eval-freq", "256", "--eval-episodes", "1", "--no-progress", "--out", str(out)]) == 0
        line = next(line for line in capsys.readouterr().out.splitlines() if "final evaluation" in line)
        summary = json.loads((out / "summary.json").read_text())
        if len(case) == 1:
            assert "(one member: no interval); seed 3 left out (mean not finite); training " in line
            assert summary["aggregate"]["final_eval"]["runs"] == 1
        else:
            assert "each): no median or IQM: no member's mean return is finite; training " in line
            assert summary["aggregate"]["final_eval"] is None


def test_a_population_stopped_as_training_ended_with_every_member_diverged_names_no_member_file(tmp_path, capsys,
                                                                                                 monkeypatch):
    """A stop as the last iteration ended, where every member diverged (none is saved): the line said the member
    models were saved and that `--resume` runs the final evaluation and `rlspeed eval RUN/members/seed_<S>.safetensors`
    evaluates a member, a file that does not exist and an evaluation there is none of. It says what there is."""
    import contextlib
    import signal

    from rlspeed.population import plot
    from rlspeed.population.base import PopulationBase

    monkeypatch.setattr(plot, "plot_learning_curves", lambda summary, path: None)  # (no plot: not what is tested)
    signals: list[int] = []
    monkeypatch.setattr(cli, "_stopping", contextlib.contextmanager(lambda backend: (yield signals)))
    loop = PopulationBase._learn_loop

    def diverged_then_stopped(self, progress, *args, **kwargs):
        loop(self, progress, *args, **kwargs)
        progress.left.update({k: {"diverged_at": self.num_timesteps} for k in range(self.size)})
        signals.append(signal.SIGTERM)  # (as the last iteration ended)

    monkeypatch.setattr(PopulationBase, "_learn_loop", diverged_then_stopped)
    run = tmp_path / "run"
    assert cli.main(["train", "ppo", "CartPole-v1", "--seeds", "0,1", "--set", "num_envs=2", "--set", "num_steps=8",
                     "--set", "batch_size=16", "--set", "n_epochs=1", "--total-timesteps", "16", "--target-return",
                     "none", "--no-progress", "--out", str(run)]) == 143
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"rlspeed: interrupted (SIGTERM) after training finished: summary.json is saved in {run}; every member "
        "diverged: none has a model or a final evaluation")
    assert not (run / "members").exists()


def test_a_stop_in_a_populations_final_evaluation_is_said_in_one_line(tmp_path, capsys, monkeypatch):
    """A Ctrl-C in a population's final evaluation (which its learn runs, after training) printed "stopping after this
    iteration (again to stop at once)", of an iteration there was none of, before the run's "interrupted ... after
    training finished" line: the one line is said, as a solo run says it."""
    import signal

    from rlspeed.population import plot
    from rlspeed.population.base import PopulationBase

    monkeypatch.setattr(plot, "plot_learning_curves", lambda summary, path: None)  # (no plot: not what is tested)
    mean_returns = PopulationBase._mean_returns

    def stopped_in_the_final_evaluation(self, *args, **kwargs):
        if self._evaluation_stop is not None:  # (the final evaluation: the handler as a Ctrl-C now runs it)
            signal.getsignal(signal.SIGINT)(signal.SIGINT, None)
        return mean_returns(self, *args, **kwargs)

    monkeypatch.setattr(PopulationBase, "_mean_returns", stopped_in_the_final_evaluation)
    run = tmp_path / "run"
    assert cli.main(["train", "ppo", "CartPole-v1", "--seeds", "0,1", "--set", "num_envs=2", "--set", "num_steps=8",
                     "--set", "batch_size=16", "--set", "n_epochs=1", "--total-timesteps", "16", "--target-return",
                     "none", "--no-progress", "--out", str(run)]) == 130
    err = capsys.readouterr().err
    assert "stopping after this iteration" not in err and err.count("Ctrl-C") == 1, err
    assert err.splitlines()[-1].startswith("rlspeed: interrupted (Ctrl-C) after training finished: summary.json and "
                                           "the member models are saved"), err
