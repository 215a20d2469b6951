"""The `rlspeed` command end to end, in subprocesses: run directory contents, eval, clear one-line errors.

The runs are started together (each is mostly interpreter and torch start-up) and collected by the tests.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import gymnasium as gym
import pytest
import torch
import yaml
from conftest import cli_error, needs_torch_export

from rlspeed import PPO, UserError, cli, yamlfile
from rlspeed.algos import ALGORITHMS
from rlspeed.device import resolve_device

TIMEOUT_S = 300

# Every summary.json field and its type, as docs/cli.md documents them ("The run directory").
NUMBER = (int, float)
SUMMARY_FIELDS = {"algo": str, "env_id": str, "seed": int, "device": str, "env_backend": str,
                  "total_timesteps": int, "train_wall_s": NUMBER, "sps": NUMBER, "target_return": (NUMBER, None),
                  "time_to_target_s": (NUMBER, None), "steps_to_target": (int, None),
                  "target_confirmation": (dict, None), "final_eval": dict,
                  "accelerate": dict, "update": dict, "numerics": dict, "preset": dict,
                  "checkpoint_encryption": (dict, None), "interrupted": bool, "stopped_by": (str, None),
                  "error": (str, None), "close_error": (str, None),
                  "provenance": dict}


def _mismatch_algorithm() -> tuple[str, str] | None:
    """(algorithm, env id) where the algorithm does not support the env's action space, if any exists."""
    for name, cls in ALGORITHMS.items():
        if not cls.supports_discrete:
            return name, "CartPole-v1"
        if not cls.supports_continuous:
            return name, "Pendulum-v1"
    return None


ERROR_CASES = {
    "unknown-env": (["train", "ppo", "CartPol-v1"], "CartPole-v1"),
    "unknown-algo": (["train", "pp0", "CartPole-v1"], "ppo"),
    # (argparse's choices: "command invalid choice: 'trian'" before, the closest choice named now)
    "misspelled-command": (["trian", "ppo", "CartPole-v1"], "unknown command 'trian': did you mean 'train'?"),
    "misspelled-choice": (["train", "ppo", "CartPole-v1", "--env-backend", "gymnasium_async"],
                          "unknown --env-backend 'gymnasium_async': did you mean 'gymnasium-async'? choose from"),
    "unknown-hyperparameter": (["train", "ppo", "CartPole-v1", "--set", "gama=0.9"], "gamma"),
    "invalid-hyperparameter": (["train", "ppo", "CartPole-v1", "--set", "gamma=3"], "gamma"),
    "unavailable-device": (["train", "ppo", "CartPole-v1", "--device", "cuda"], "cuda"),
    "missing-checkpoint": (["eval", "no/such/model.safetensors"], "model.safetensors"),
    # `--set` run settings are checked and named; constructor arguments that have a flag of their own say which
    "set-total-timesteps-text": (["train", "ppo", "CartPole-v1", "--set", "total_timesteps=lots"], "total_timesteps"),
    "set-eval-freq-fraction": (["train", "ppo", "CartPole-v1", "--set", "eval_freq=0.5"], "eval_freq"),
    "set-target-return-text": (["train", "ppo", "CartPole-v1", "--set", "target_return=high"], "target_return"),
    # (--eval-episodes is a whole number >= 1; --set names the flag, as for the other run flags)
    "eval-episodes-zero": (["train", "ppo", "CartPole-v1", "--eval-episodes", "0"],
                           "--eval-episodes must be positive, got 0"),
    "eval-episodes-fraction": (["train", "ppo", "CartPole-v1", "--eval-episodes", "2.5"],
                               "--eval-episodes must be a whole number, got '2.5'"),
    "set-eval-episodes": (["train", "ppo", "CartPole-v1", "--set", "eval_episodes=3"], "use --eval-episodes N"),
    "set-seed": (["train", "ppo", "CartPole-v1", "--set", "seed=1"], "--seed"),
    "set-device": (["train", "ppo", "CartPole-v1", "--set", "device=cpu"], "--device"),
    "set-num-threads": (["train", "ppo", "CartPole-v1", "--set", "num_threads=2"], "--threads"),
    "set-env": (["train", "ppo", "CartPole-v1", "--set", "env=Pendulum-v1"], "ENV_ID"),
    # a directory (the working directory: empty) that is not a finished run directory
    "eval-directory-without-model": (["eval", "."], "model.safetensors"),
    # --out naming an existing file (this one: mkdir fails before anything is written)
    "out-is-a-file": (["train", "ppo", "CartPole-v1", "--out", str(Path(__file__).resolve())], "run directory"),
}
MISMATCH = _mismatch_algorithm()
# Without such an algorithm the case has no command and is skipped.
ERROR_CASES["action-space-mismatch"] = (["train", *MISMATCH] if MISMATCH else None, MISMATCH and MISMATCH[0].upper())


class Runs:
    """`python -m rlspeed ...` processes started at once, each collected once when a test asks for it."""

    def __init__(self, cwd: Path):
        self.cwd = cwd
        self.env = {**os.environ, "RLSPEED_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
        self.env.pop("RLSPEED_DEVICE", None)
        self.started: dict[str, subprocess.Popen] = {}
        self.finished: dict[str, subprocess.CompletedProcess] = {}

    def start(self, name: str, args: list[str]) -> None:
        self.started[name] = subprocess.Popen([sys.executable, "-m", "rlspeed", *args], cwd=self.cwd, env=self.env,
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def result(self, name: str) -> subprocess.CompletedProcess:
        if name not in self.finished:
            process = self.started[name]
            try:
                stdout, stderr = process.communicate(timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                stdout, stderr = process.communicate()
            self.finished[name] = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
        return self.finished[name]

    def close(self) -> None:
        for process in self.started.values():
            if process.poll() is None:
                process.kill()
                process.communicate()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("cli")
    runs = Runs(cwd)
    runs.start("train", ["train", "ppo", "CartPole-v1", "--total-timesteps", "1024", "--target-return", "none",
                         "--out", str(cwd / "plain"), "--no-progress"])
    runs.start("train-target", ["train", "ppo", "CartPole-v1", "--total-timesteps", "20480", "--target-return", "15",
                                "--eval-freq", "1024", "--out", str(cwd / "target"), "--no-progress"])
    runs.start("unknown-env", ERROR_CASES["unknown-env"][0])
    yield runs
    runs.close()


def assert_succeeded(completed: subprocess.CompletedProcess) -> None:
    assert completed.returncode == 0, f"exit {completed.returncode}\n{completed.stdout}\n{completed.stderr}"


def assert_type(value, expected) -> None:
    options = expected if isinstance(expected, tuple) else (expected,)
    flat = []
    for option in options:
        flat.extend(option if isinstance(option, tuple) else (option,))
    if value is None:
        assert None in flat
    elif bool in flat:
        assert isinstance(value, bool)
    else:
        assert isinstance(value, tuple(t for t in flat if t is not None)) and not isinstance(value, bool)


def test_the_docs_summary_sample_has_every_field():
    """docs/cli.md's summary.json sample is strict JSON with every field a run writes, each of its type (it lacked
    `provenance`, which a run has written since)."""
    page = (Path(__file__).resolve().parent.parent / "docs" / "cli.md").read_text(encoding="utf-8")
    sample = re.search(r"`summary.json` from the Quick start's run[^`]*```json\n(.*?)```", page, re.DOTALL)[1]
    summary = json.loads(sample, parse_constant=lambda c: pytest.fail(c))
    assert set(summary) == set(SUMMARY_FIELDS)
    for field, expected in SUMMARY_FIELDS.items():
        assert_type(summary[field], expected)


@pytest.mark.plots
def test_train_writes_the_run_directory(runs):
    assert_succeeded(runs.result("train"))
    run_dir = runs.cwd / "plain"
    # strict JSON: no NaN or Infinity
    summary = json.loads((run_dir / "summary.json").read_text(), parse_constant=lambda c: pytest.fail(c))
    assert set(summary) == set(SUMMARY_FIELDS)
    assert summary["interrupted"] is False and summary["stopped_by"] is None  # (its whole budget trained)
    for field, expected in SUMMARY_FIELDS.items():
        assert_type(summary[field], expected)
    assert summary["algo"] == "ppo" and summary["env_id"] == "CartPole-v1" and summary["seed"] == 0
    assert summary["device"] == str(resolve_device("auto"))  # (cuda:0, npu:0, xpu:0, mps:0 or cpu)
    assert summary["env_backend"] in ("torch", "gymnasium")
    assert summary["total_timesteps"] == 1024
    assert summary["train_wall_s"] > 0 and summary["sps"] > 0
    assert summary["target_return"] is None
    assert summary["time_to_target_s"] is None and summary["steps_to_target"] is None
    final_eval = summary["final_eval"]
    # (the policy's mode named, as `rlspeed eval --json` names it)
    assert set(final_eval) == {"mean", "std", "episodes", "seed", "deterministic"} and final_eval["episodes"] == 10
    assert final_eval["deterministic"] is True
    assert_type(final_eval["mean"], NUMBER)
    assert_type(final_eval["std"], NUMBER)
    assert 0 < final_eval["mean"] <= 500
    assert set(summary["accelerate"]) == {"precision", "compile"}
    assert all(isinstance(v, str) for v in summary["accelerate"].values())

    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["algo"] == "ppo" and config["env_id"] == "CartPole-v1"

    with open(run_dir / "metrics.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) >= 1 and "timesteps" in rows[0]
    assert int(float(rows[-1]["timesteps"])) == 1024

    assert (run_dir / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    model = PPO.load(run_dir / "model.safetensors", device="cpu")
    assert model.env_id == "CartPole-v1" and model.num_timesteps == 1024


def test_eval_a_saved_model(runs, capsys):
    assert_succeeded(runs.result("train"))
    model_path = runs.cwd / "plain" / "model.safetensors"
    # `rlspeed eval` in this process (`python -m rlspeed` itself is covered by the runs above).
    code = cli.main(["eval", str(model_path), "--episodes", "3", "--seed", "5", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result = json.loads(captured.out)  # stdout holds the JSON only; the human line went to stderr
    assert "deterministic, 3 episodes" in captured.err
    assert result["episodes"] == 3 and len(result["returns"]) == 3
    assert result["mean"] == pytest.approx(sum(result["returns"]) / 3)
    assert all(1 <= r <= 500 for r in result["returns"])
    # the JSON alone tells a sampled evaluation from the deterministic one (it did not say)
    assert result["deterministic"] is True
    assert cli.main(["eval", str(model_path), "--episodes", "1", "--stochastic", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["deterministic"] is False
    # (rlspeed.evaluate's result has the JSON's shape: it lacked "deterministic")
    from rlspeed.evaluation import evaluate

    result = evaluate(PPO.load(model_path, device="cpu"), episodes=1, seed=printed["seed"], deterministic=False)
    assert result == printed


def test_eval_takes_every_env_backend_train_takes(tmp_path, capsys):
    """`rlspeed eval --env-backend gymnasium-async` was refused ("unknown --env-backend") though `rlspeed train` takes
    it and `rlspeed.evaluate(model, backend="gymnasium-async")` runs: eval takes what train takes, and its episodes
    of a seed are those of Gymnasium's envs stepped in this process."""
    from rlspeed.envs import BACKENDS

    with PPO("CartPole-v1", seed=0, device="cpu", env_backend="gymnasium", num_envs=2, num_steps=16,
             batch_size=32) as model:
        model.save(tmp_path / "model.safetensors")
        in_process = model.evaluate(episodes=2, seed=4)["returns"]
    code = cli.main(["eval", str(tmp_path / "model.safetensors"), "--env-backend", "gymnasium-async", "--episodes",
                     "2", "--seed", "4", "--json", "--no-progress"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert json.loads(captured.out)["returns"] == in_process
    assert cli.ENV_BACKENDS == list(BACKENDS)  # (the CLI's list, written without importing torch)


def test_train_stops_at_a_reached_target(runs):
    assert_succeeded(runs.result("train-target"))
    summary = json.loads((runs.cwd / "target" / "summary.json").read_text())
    assert summary["target_return"] == 15
    assert_type(summary["time_to_target_s"], NUMBER)
    assert_type(summary["steps_to_target"], int)
    assert 0 < summary["time_to_target_s"] <= summary["train_wall_s"]
    assert 0 < summary["steps_to_target"] == summary["total_timesteps"] < 20480  # stopped early
    assert summary["stopped_by"] == "target"


def assert_one_line_error(code: int, stdout: str, stderr: str, expected: str) -> None:
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("rlspeed: error:")
    assert expected in lines[0]
    assert "Traceback" not in stderr + stdout


def test_user_error_from_the_command_line(runs):
    """One error through a real `python -m rlspeed` process: exit status, stderr, nothing else."""
    completed = runs.result("unknown-env")
    assert_one_line_error(completed.returncode, completed.stdout, completed.stderr, ERROR_CASES["unknown-env"][1])


# The other error cases run `rlspeed.cli.main` in this process: the same code path, without paying a
# torch start-up per case.
@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_user_errors_exit_2_with_one_line(case, capsys, monkeypatch, tmp_path):
    args, expected = ERROR_CASES[case]
    if case == "unavailable-device" and torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    if args is None:
        pytest.skip("every algorithm supports both action spaces")
    monkeypatch.chdir(tmp_path)
    code = cli.main([*args, "--no-progress"] if args[0] == "train" else args)
    captured = capsys.readouterr()
    assert_one_line_error(code, captured.out, captured.err, expected)


@pytest.mark.parametrize("choices", ["'train', 'tune', 'eval'", "train, tune, eval"])
def test_a_misspelled_choice_is_named_whichever_way_python_quotes_the_choices(choices):
    """Python 3.12.8 and later releases give argparse's choices bare ("choose from train, tune, eval"), earlier ones
    quoted: the closest choice was named only where they were quoted."""
    parser = cli._Parser(prog="rlspeed")
    with pytest.raises(UserError) as raised:
        parser.error(f"argument command: invalid choice: 'trian' (choose from {choices})")
    assert str(raised.value) == ("unknown command 'trian': did you mean 'train'? choose from 'train', 'tune', 'eval' "
                                 "(see 'rlspeed --help').")


def test_rlspeed_alone_names_the_commands(capsys):
    """`rlspeed` without a command names the commands it takes (it said "the following arguments are required:
    command", argparse's name for the missing argument)."""
    assert cli_error(capsys, []) == ("rlspeed: error: a command is required: train, tune, eval, profile, export, "
                                     "report or doctor (see 'rlspeed --help').")


def test_eval_a_run_directory(runs, capsys):
    """`rlspeed eval RUN_DIR` (the directory `train` prints) evaluates RUN_DIR/model.safetensors."""
    assert_succeeded(runs.result("train"))
    code = cli.main(["eval", str(runs.cwd / "plain"), "--episodes", "2", "--seed", "5", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert json.loads(captured.out.strip().splitlines()[-1])["episodes"] == 2


def test_set_run_settings_accept_float_notation(capsys, monkeypatch, tmp_path):
    """`--set total_timesteps=5.12e2` (a string to YAML) and `eval_freq=2.56e2` reach training as ints."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RLSPEED_NUM_THREADS", "1")
    code = cli.main(["train", "ppo", "CartPole-v1", "--set", "total_timesteps=5.12e2", "--set", "eval_freq=2.56e2",
                     "--set", "target_return=1e4", "--out", "run", "--no-progress"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    config = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert config["total_timesteps"] == 512 and isinstance(config["total_timesteps"], int)
    assert config["eval_freq"] == 256 and isinstance(config["eval_freq"], int)
    assert config["target_return"] == 10000.0
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["total_timesteps"] == 512


def test_main_in_process_leaves_the_callers_threads_and_returns_codes_for_help(capsys, monkeypatch, tmp_path):
    """`cli.main([...])` from a script set torch's thread count to the command's (1) for the rest of the process,
    and made later models without num_threads train with it; `main(["--help"])` raised SystemExit instead of
    returning the exit code its docstring promises."""
    from rlspeed import device

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RLSPEED_NUM_THREADS", "1")
    before = torch.get_num_threads()
    process_before = device._process_threads
    torch.set_num_threads(2)
    try:
        assert cli.main(["train", "ppo", "CartPole-v1", "--total-timesteps", "256", "--out", "run",
                         "--no-progress"]) == 0
        assert torch.get_num_threads() == 2 and device._process_threads == process_before
    finally:
        torch.set_num_threads(before)
    assert cli.main(["--help"]) == 0 and cli.main(["train", "--help"]) == 0 and cli.main(["--version"]) == 0
    assert "usage: rlspeed" in capsys.readouterr().out


def test_run_files_write_chinese_as_it_is(capsys, monkeypatch, tmp_path):
    """A preset in a Chinese directory: config.yaml and summary.json name it as written (they held `\\u9884\\u8bbe`
    escapes: the right value, unreadable to the person who wrote it), and `rlspeed eval` reads the run back."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RLSPEED_NUM_THREADS", "1")
    (tmp_path / "预设").mkdir()
    (tmp_path / "预设" / "我的.yaml").write_text("CartPole-v1:\n  n_steps: 32\n", encoding="utf-8")
    argv = ["train", "ppo", "CartPole-v1", "--preset", "预设/我的.yaml", "--out", "运行", "--no-progress"]
    assert cli.main([*argv, "--total-timesteps", "256"]) == 0, capsys.readouterr().err
    for name in ("config.yaml", "summary.json"):
        assert "预设/我的.yaml (CartPole-v1 entry)" in (tmp_path / "运行" / name).read_text(encoding="utf-8")
    config = yaml.safe_load((tmp_path / "运行" / "config.yaml").read_text(encoding="utf-8"))
    assert config["preset"]["requested"] == "预设/我的.yaml"
    capsys.readouterr()
    assert cli.main(["eval", "运行", "--episodes", "1", "--json"]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["episodes"] == 1


@pytest.mark.parametrize(("argv", "expected"), [
    (["train", "ppo", "CartPole-v1", "--num-steps", "128"], "are given with --set: --set num_steps=128"),
    (["profile", "dqn", "CartPole-v1", "--learning-starts=64"], "--set learning_starts=64."),
    (["train", "--device", "cpu", "ppo", "CartPole-v1", "--update-epochs", "4"], "--set n_epochs=4."),
    (["train", "ppo", "CartPole-v1", "--vf-coef", "-1"], "--set vf_coef=-1."),
    (["train", "td3", "Pendulum-v1", "--policy-noise", "0.2"], "--set target_policy_noise=0.2."),
    (["train", "ppo", "CartPole-v1", "--clip-coef", "0.1"], "given with --set: --set clip_range=0.1."),
    (["train", "sac", "Pendulum-v1", "--steps", "1000"], "--steps 1000; rlspeed train's env steps are "
                                                          "--total-timesteps 1000 (rlspeed tune's --budget"),
    (["train", "ppo", "CartPole-v1", "--capture-video"], "--video-every N"),
    (["train", "ppo", "CartPole-v1", "--track", "--wandb-group", "sweep-7"], "variable: WANDB_RUN_GROUP=sweep-7 "),
    (["train", "ppo", "CartPole-v1", "--track", "--wandb-name=lr3e-4"], "variable: WANDB_NAME=lr3e-4 rlspeed train"),
    (["train", "ppo", "CartPole-v1", "--track", "--wandb-notes", "a b"], "variable: WANDB_NOTES='a b' rlspeed train"),
    (["train", "ppo", "CartPole-v1", "--set", "num_minibatches=4"], "batch_size = num_envs * num_steps / num_minib"),
    (["train", "sac", "Pendulum-v1", "--set", "q_lr=1e-3"], "one learning_rate trains the actor, the critics"),
    (["train", "td3", "Pendulum-v1", "--set", "policy_frequency=2"], "updates per actor update are policy_delay"),
    (["train", "ppo", "CartPole-v1", "--trained-agent", "runs/x"], "is RL-Zoo's: --init-from runs/x starts from"),
    # (CleanRL's run arguments: `--env-id` gave a bare "unrecognized arguments: --env-id", as argparse took the id)
    (["train", "ppo", "--env-id", "CartPole-v1"], "the env is the command's second word, rlspeed train ALGO ENV_ID"),
    (["train", "ppo", "--env-id=CartPole-v1"], "ENV_ID; --env-id is CleanRL's argument: the env is the command's"),
    (["train", "ppo", "CartPole-v1", "--cuda"], "the device is --device"),
    (["train", "ppo", "CartPole-v1", "--exp-name", "x"], "a run's directory is --out DIR"),
    (["train", "ppo", "CartPole-v1", "--save-model"], "every run saves its model, RUN_DIR/model.safetensors"),
])
def test_cleanrl_arguments_and_hyperparameter_flags_name_the_setting_to_use(argv, expected, capsys):
    """CleanRL's script arguments (as flags or --set keys) and hyperparameters written as flags are one sentence
    naming what rlspeed takes instead (not a bare "unrecognized arguments", a list of valid names or a wrong guess)."""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert expected in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("extra", [[], ["--set", "anneal_lr=false"]])
def test_a_set_learning_rate_under_an_annealing_preset_says_it_still_decays(extra, capsys, monkeypatch, tmp_path):
    """RL-Zoo's `learning_rate: 0.001` is constant, its `lin_0.001` a decay; here `--set learning_rate=X` is the start
    and the preset's anneal_lr stays: the run says so and how to hold it (which then runs constant, without a note)."""
    monkeypatch.chdir(tmp_path)
    code = cli.main(["train", "ppo", "CartPole-v1", "--set", "learning_rate=0.001", *extra, "--total-timesteps", "256",
                     "--target-return", "none", "--out", "run", "--no-progress"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    config = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert config["hyperparameters"]["learning_rate"] == 0.001
    assert config["hyperparameters"]["anneal_lr"] is (not extra)
    assert ("starts a linear decay to 0 (PPO's default anneal_lr=true)" in captured.err) is (not extra)
    assert ("--set anneal_lr=false to hold it constant" in captured.err) is (not extra)


@pytest.mark.parametrize("flag", ["--set", "--env-kwargs"])
def test_a_key_given_twice_with_two_values_is_refused(flag, capsys, monkeypatch, tmp_path):
    """`--set lr=1e-3 --set lr=3e-4` (a typo'd command line, or a copied one edited) is one sentence naming both
    values, before anything is made; the same value twice is the same command."""
    monkeypatch.chdir(tmp_path)
    code = cli.main(["train", "ppo", "Pendulum-v1", flag, "g=9.0", flag, "g=2.0", "--out", "run", "--no-progress"])
    captured = capsys.readouterr()
    assert code == 2
    assert "g twice (9.0 and 2.0)" in captured.err and len(captured.err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()
    assert cli._parse_set(["g=2.0", "g=2.0"], flag) == {"g": 2.0}  # the same value twice is the same command


@pytest.mark.parametrize("argv, hint", [
    (["train", "ppo", "Pendulum-v1", "--env-kwargs", "g=2.0", "m=1.5", "--seed", "3"],
     "unrecognized arguments: m=1.5; --env-kwargs takes one KEY=VALUE each: --env-kwargs g=2.0 --env-kwargs m=1.5."),
    (["train", "ppo", "Pendulum-v1", "--set", "n_epochs=4", "batch_size=32", "ent_coef=0.01"],
     "--set takes one KEY=VALUE each: --set n_epochs=4 --set batch_size=32 --set ent_coef=0.01."),
    (["eval", "run", "--env-kwargs", "g=2.0", "l=2"], "--env-kwargs g=2.0 --env-kwargs l=2."),
    (["train", "ppo", "Pendulum-v1", "--env-kwargs", "g:2.0"],
     "--env-kwargs expects key=value, got 'g:2.0' (RL-Zoo's key:value is --env-kwargs g=2.0 here)."),
])
def test_rl_zoo_style_env_kwargs_name_the_command_line_that_works(argv, hint, capsys):
    """RL-Zoo's `--env-kwargs a:1 b:2` (several pairs after one flag, written key:value) was "unrecognized arguments:
    b=2 (see 'rlspeed train --help')", or "expects key=value, got 'a:1'": the error writes the command line out."""
    assert cli_error(capsys, argv).endswith(hint)


@pytest.mark.parametrize("value, match", [("010", "octal number 8"), ("{a: 1, a: 2}", "a twice")])
def test_a_set_value_yaml_would_read_as_another_value_is_refused(value, match):
    """`--set num_steps=010` was 8 (YAML 1.1 octal); a mapping with one key twice kept the last value."""
    with pytest.raises(UserError, match=match):
        cli._parse_set([f"num_steps={value}"])


def test_a_number_with_an_exponent_inside_a_set_value_is_a_number():
    """YAML 1.1 reads `1e-3` (an exponent, no dot) as text: `--set` and `--env-kwargs` read it as the number at any
    depth of a value's lists and dicts (an env option {lr: 1e-3} reached the env as the text '1e-3')."""
    assert cli._parse_set(["opts={lr: 1e-3, sizes: [[1e5]]}", "lr=1e-3", "names=[a1e5, '1e5x']"], "--env-kwargs") == {
        "opts": {"lr": 0.001, "sizes": [[100000.0]]}, "lr": 0.001, "names": ["a1e5", "1e5x"]}
    cycle = cli._parse_set(["cycle=&a [1e2, *a]"])["cycle"]  # (a YAML alias's list that holds itself is kept)
    assert cycle[0] == 100.0 and cycle[1][1] is cycle[1]


def test_a_quoted_number_or_infinity_in_a_set_value_stays_text():
    """A quoted `"1e3"`, `'inf'` or `"nan"` is text the user meant, at any depth of a `--set` or `--env-kwargs` value
    (an env's name option `--env-kwargs 'name="1e3"'` reached the env as the number 1000.0, and a quoted "nan" was
    refused as not finite); unquoted, they are numbers (and infinity and NaN refused)."""
    assert cli._parse_set(['name="1e3"', "names=['2e5', 3e5]", 'opts={label: "nan", mode: "inf", lr: 1e-3}',
                           "plain=!!str 1e3"], "--env-kwargs") == {
        "name": "1e3", "names": ["2e5", 300000.0], "opts": {"label": "nan", "mode": "inf", "lr": 0.001},
        "plain": "1e3"}
    for pair, where in [("x=inf", ""), ("x=[1, -Infinity]", " (x[1] is -inf)"), ("x={a: NaN}", " (x.a is nan)"),
                        ("x=!!python/tuple [1, 1e999]", " (x[1] is inf)")]:
        with pytest.raises(UserError, match=rf": values must be finite numbers{re.escape(where)}\.$"):
            cli._parse_set([pair], "--env-kwargs")


@pytest.mark.parametrize("value", ["four", "2.5", "0", "-2"])  # (0 and -2 ran on one thread without a word)
def test_unreadable_thread_variable_is_a_one_line_error(value, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RLSPEED_NUM_THREADS", value)
    code = cli.main(["train", "ppo", "CartPole-v1", "--no-progress"])
    captured = capsys.readouterr()
    assert_one_line_error(code, captured.out, captured.err, "RLSPEED_NUM_THREADS")


def test_debug_after_the_subcommand_shows_the_traceback(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match="CartPole-v1"):
        cli.main(["train", "ppo", "CartPol-v1", "--debug"])


def test_debug_before_the_subcommand_shows_the_traceback(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match="CartPole-v1"):
        cli.main(["--debug", "train", "ppo", "CartPol-v1"])


def test_debug_keeps_the_sentence_of_an_unknown_option(monkeypatch, tmp_path):
    """With --debug an unknown option's sentence pointed to 'rlspeed --help' where without it names the command's
    own help and the closest option: the traceback carries the same sentence."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match="did you mean --eval-episodes") as raised:
        cli.main(["train", "ppo", "CartPole-v1", "--eval-episods", "3", "--debug"])
    assert "(see 'rlspeed train --help')" in str(raised.value)


def test_debug_keeps_the_commands_exit_code_2(tmp_path, monkeypatch, capsys):
    """As the `rlspeed` command, --debug adds the traceback and keeps exit code 2 (a raised error would exit 1)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["rlspeed", "train", "ppo", "CartPol-v1", "--debug"])
    streams = sys.stdout, sys.stderr
    try:
        code = cli.main()  # (argv None: the command's own handling, as `python -m rlspeed` runs it)
    finally:
        sys.stdout, sys.stderr = streams  # (the command wraps the process's streams)
    assert code == 2
    stderr = capsys.readouterr().err
    assert "Traceback" in stderr and "Unknown env id 'CartPol-v1'" in stderr


def test_nproc_runs_the_given_command_under_torchrun(monkeypatch, tmp_path):
    """`main([... "--nproc", "2"])` hands torchrun the arguments it was given (not the host process's argv), less
    `--nproc` and `--max-restarts`, with a fixed `--out` so that every worker writes one run directory."""
    import subprocess as subprocess_module

    calls = []

    class Torchrun:  # (what the launcher starts and waits for)
        def __init__(self, command, env, start_new_session, pass_fds):
            calls.append((command, env))
            assert start_new_session  # (a Ctrl-C reaches torchrun once: from the launcher)

        def wait(self):
            return 0

    monkeypatch.setattr(subprocess_module, "Popen", Torchrun)
    monkeypatch.setattr(sys, "argv", ["pytest", "-x", "tests"])
    monkeypatch.chdir(tmp_path)
    code = cli.main(["train", "ppo", "CartPole-v1", "--nproc", "2", "--max-restarts=1", "--seed", "3",
                     "--no-progress"])
    assert code == 0 and len(calls) == 1
    command, env = calls[0]
    assert command[:6] == [sys.executable, "-m", "rlspeed._torchrun", "--standalone", "--nproc_per_node=2",
                           "--max-restarts=1"]
    worker = command[command.index("rlspeed") + 1:]
    assert worker[:5] == ["train", "ppo", "CartPole-v1", "--seed", "3"]
    assert "--nproc" not in worker and "-x" not in worker and not any(a.startswith("--max-restarts") for a in worker)
    assert worker[worker.index("--out") + 1].startswith("runs/ppo-CartPole-v1-3-")
    # (the workers train under the launcher's lock of that directory)
    assert env[cli.RUN_LOCKED_BY_LAUNCHER] == str((tmp_path / worker[worker.index("--out") + 1]).resolve())


def test_nproc_workers_that_fail_before_writing_leave_no_directory_they_made(monkeypatch, tmp_path):
    """Workers that fail before writing anything (torchrun's exit code 1) leave no run directory a rerun must
    --overwrite, nor the empty directories the launcher made above it (it removed the run directory alone, where a
    run without --nproc removes those too); a directory that was there before stays."""
    import subprocess as subprocess_module

    class Torchrun:  # (workers that failed at once)
        def __init__(self, command, env, start_new_session, pass_fds):
            pass

        def wait(self):
            return 1

    monkeypatch.setattr(subprocess_module, "Popen", Torchrun)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine").mkdir()
    assert cli.main(["train", "ppo", "CartPole-v1", "--nproc", "2", "--no-progress", "--out", "mine/deep/er/run"]) == 1
    assert [path.name for path in tmp_path.iterdir()] == ["mine"] and not any((tmp_path / "mine").iterdir())


@pytest.mark.parametrize("out", [["--out", "run"], []])
def test_train_in_a_working_directory_since_removed_is_one_sentence(monkeypatch, tmp_path, capsys, out):
    """A working directory removed under the command (a test's tmp dir, `rm -rf` from another shell) made `rlspeed
    train` end in a traceback (os.getcwd's FileNotFoundError, from the run's provenance and the directories noted above
    the run directory) before the run directory's check could say it cannot be made there."""
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    assert cli.main(["train", "ppo", "CartPole-v1", "--total-timesteps", "1000", "--no-progress", *out]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlspeed: error: Cannot create the run directory") and "Traceback" not in err, err


def test_a_fresh_run_in_a_reused_out_dir_drops_the_old_checkpoint_and_resume_uses_it(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    out.mkdir()
    PPO("CartPole-v1", device="cpu", seed=0, num_envs=4, num_steps=32).learn(256, progress_bar=False).save(
        out / "checkpoint.safetensors")
    args = ["train", "ppo", "CartPole-v1", "--out", str(out), "--total-timesteps", "512", "--target-return", "none",
            "--no-progress", "--set", "num_steps=32"]
    saved = (out / "checkpoint.safetensors").read_bytes()
    assert cli.main([*args, "--resume"]) == 0
    entry = json.loads((out / "summary.json").read_text())["distributed"]
    assert entry["resumed_from_timesteps"] == 256
    assert (entry["restarts"], entry["resumes"]) == (0, 1)  # (a resume asked for is no restart of torchrun's)
    (out / "checkpoint.safetensors").write_bytes(saved)
    assert cli.main(args) == 2  # not resuming: the run there is not overwritten without --overwrite
    assert (out / "checkpoint.safetensors").read_bytes() == saved
    assert cli.main([*args, "--overwrite"]) == 0
    assert "distributed" not in json.loads((out / "summary.json").read_text())
    # Under torchrun the launcher checked the directory (the workers skip that) and a fresh run's workers find the
    # old checkpoint: they delete it, so that a restart before this run's first checkpoint cannot resume from it.
    (out / "checkpoint.safetensors").write_bytes(saved)
    monkeypatch.setattr(cli, "_prepare_run_dir", lambda args, algo, checked_before, **_: out)
    assert cli.main(args) == 0
    assert not (out / "checkpoint.safetensors").exists()


def test_a_run_directory_named_with_a_tilde_or_left_empty_or_without_its_config_is_no_silent_split(monkeypatch,
                                                                                                    tmp_path, capsys):
    """Hostile paths: `--out '~/runs/a'` (quoted, from a config file) wrote config.yaml, metrics.csv and summary.json
    into ./~/runs/a and the model and checkpoint into $HOME/runs/a, over another run there; `--out ""` (an unset
    variable) meant the current directory; `--resume` of a run whose config.yaml is torn swapped in the preset's
    hyperparameters and budget without a word; over-long names and dangling symlinks were tracebacks or a wrong
    reason. One directory; one-sentence refusals (exit 2)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    args = ["train", "ppo", "CartPole-v1", "--total-timesteps", "256", "--target-return", "none", "--no-progress",
            "--set", "num_steps=32", "--checkpoint-freq", "128"]
    assert cli.main([*args, "--out", "~/runs/a"]) == 0
    home_run = tmp_path / "home" / "runs" / "a"
    assert {"config.yaml", "metrics.csv", "summary.json", "model.safetensors"} <= {p.name for p in home_run.iterdir()}
    assert not (tmp_path / "~").exists()
    assert cli.main([*args, "--out", "~/runs/a"]) == 2  # (the run there is not replaced without --overwrite)
    assert "already holds a run" in capsys.readouterr().err
    assert cli.main([*args, "--out", ""]) == 2
    assert "--out is empty" in capsys.readouterr().err
    assert cli.main([*args, "--out", "x" * 300]) == 2  # (a name longer than the filesystem takes: a traceback)
    assert "File name too long" in capsys.readouterr().err
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")  # ("Cannot create ...: File exists")
    assert cli.main([*args, "--out", "dangling"]) == 2
    assert "is a symlink to nothing" in capsys.readouterr().err
    (home_run / "config.yaml").write_text("")
    assert cli.main([*args, "--out", str(home_run), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "config.yaml' is empty or damaged" in err and "start the run again with --overwrite" in err


def test_the_advice_for_a_damaged_config_of_a_run_with_nothing_else_works(tmp_path, capsys):
    """--resume of a run whose config.yaml is damaged advised --overwrite, which then refused the directory where
    nothing else there was known as rlspeed's (a config.yaml that cannot be read may be anyone's): the advice is to
    move it aside, and that works; where the run's other files are there, --overwrite is advised and works."""
    out = tmp_path / "run"
    args = ["train", "ppo", "CartPole-v1", "--total-timesteps", "256", "--target-return", "none", "--no-progress",
            "--set", "num_steps=32", "--out", str(out)]
    assert cli.main(args) == 0
    for path in out.iterdir():
        if path.name != "config.yaml":
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    (out / "config.yaml").write_text((out / "config.yaml").read_text() + "hyperparameters: [\n")
    assert cli.main([*args, "--resume"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "config.yaml' is empty or damaged" in err and "start the run again with --overwrite" not in err
    assert "move or delete it to start the run again there" in err and "--overwrite would refuse" in err
    assert cli.main([*args, "--overwrite"]) == 2  # (as the message says: the file may be anyone's, it is kept)
    assert "which are not an rlspeed run's" in capsys.readouterr().err and (out / "config.yaml").exists()
    (out / "config.yaml").rename(tmp_path / "config.yaml.damaged")  # (the advice, followed)
    assert cli.main(args) == 0 and (out / "model.safetensors").is_file()


def test_overwrite_that_cannot_move_the_old_run_aside_is_one_sentence_and_moves_nothing(tmp_path, monkeypatch):
    """A run file that cannot be deleted (another owner's, a read-only mount) was a PermissionError traceback after
    half the run was gone; the run is moved aside all or nothing."""
    run = tmp_path / "run"
    (run / "tensorboard").mkdir(parents=True)
    (run / "metrics.csv").write_text("timesteps\n")
    replace = os.replace

    def refuse_the_second(source, target):
        if Path(source).name == "metrics.csv":
            raise PermissionError(13, "Permission denied", str(source))
        replace(source, target)

    monkeypatch.setattr(os, "replace", refuse_the_second)
    with pytest.raises(UserError, match=r"--overwrite cannot move the run in .* aside .*Permission denied.*nothing "
                                        r"was trained"):
        cli._move_run_aside(run, ["tensorboard", "metrics.csv"])
    assert (run / "tensorboard").is_dir() and (run / "metrics.csv").is_file() and not cli._overwritten()
    assert sorted(p.name for p in run.iterdir()) == ["metrics.csv", "tensorboard"]


def test_a_command_that_cannot_train_leaves_the_run_it_would_overwrite(runs, tmp_path, monkeypatch):
    """--overwrite deletes the old run only once the new one can start (a typo must not cost a finished run), and a
    failed command leaves no empty run directory."""
    import shutil

    monkeypatch.chdir(tmp_path)
    assert_succeeded(runs.result("train"))
    shutil.copytree(runs.cwd / "plain", tmp_path / "kept")
    before = sorted(path.name for path in (tmp_path / "kept").iterdir())
    assert cli.main(["train", "sac", "CartPole-v1", "--out", "kept", "--overwrite", "--no-progress"]) == 2
    assert sorted(path.name for path in (tmp_path / "kept").iterdir()) == before
    assert cli.main(["train", "sac", "CartPole-v1", "--no-progress"]) == 2
    assert not (tmp_path / "runs").exists()
    assert cli.main(["train", "ppo", "CartPole-v1", "--out", "kept", "--overwrite", "--resume"]) == 2


def test_a_run_that_fails_before_training_leaves_nothing_a_rerun_must_overwrite(tmp_path, monkeypatch, capsys):
    """An error once the run directory exists but before anything is trained (here the replay buffer, allocated when
    training starts, does not fit in a fake 1 MiB of memory, where its envs do): exit 2, its config.yaml (and
    TensorBoard's directory, which the logger makes before the first step where tensorboard is installed: made here as
    it would be) removed and the directory it created too, with the empty directories it made above it (runs/ for
    the default: they were left behind); a directory that existed before is kept; then the same command with a buffer
    that fits trains, in the directory `--out made/../new` names, making no made/ on the way (it was left empty)."""
    from rlspeed import logging as run_logging
    from rlspeed.buffers import replay

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(replay, "available_memory", lambda device, needed=None: (2**20, replay.HOST))
    made = run_logging.RunLogger.__init__

    def with_tensorboard(self, run_dir, *args, **kwargs):
        (Path(run_dir) / "tensorboard").mkdir(parents=True, exist_ok=True)
        (Path(run_dir) / "tensorboard" / "events.out.tfevents.0").write_bytes(b"header")
        made(self, run_dir, *args, **kwargs)

    monkeypatch.setattr(run_logging.RunLogger, "__init__", with_tensorboard)
    argv = ["train", "dqn", "CartPole-v1", "--total-timesteps", "200", "--set", "learning_starts=100", "--no-progress"]
    assert cli.main([*argv, "--out", "new"]) == 2
    assert "replay buffer" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("the user's")
    assert cli.main([*argv, "--out", "mine"]) == 2
    assert sorted(path.name for path in (tmp_path / "mine").iterdir()) == ["notes.txt"]
    # the directories made above it go too (they were left empty), up to one that existed
    assert cli.main([*argv, "--out", "mine/deep/er/new"]) == 2 and cli.main(argv) == 2
    assert sorted(path.name for path in tmp_path.iterdir()) == ["mine"]  # (no runs/ either)
    assert sorted(path.name for path in (tmp_path / "mine").iterdir()) == ["notes.txt"]
    # (not "already holds a run"; `made/../new` is `new`, and made/ was made on the way and left empty)
    assert cli.main([*argv, "--out", "made/../new", "--set", "buffer_size=100"]) == 0
    assert sorted(path.name for path in tmp_path.iterdir()) == ["mine", "new"]


def test_integer_hyperparameters_take_float_notation(monkeypatch, tmp_path):
    from rlspeed import DQN

    assert DQN("CartPole-v1", device="cpu", buffer_size="1e4").config.buffer_size == 10_000
    with pytest.raises(UserError, match="buffer_size"):
        DQN("CartPole-v1", device="cpu", buffer_size="1.5e0")


def test_resume_without_a_checkpoint_says_so_and_writes_checkpoints(monkeypatch, tmp_path, capsys):
    """The requeue pattern: always pass --resume; the first run has nothing to resume and starts from scratch, writing
    the checkpoints a later --resume needs."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    assert cli.main(["train", "ppo", "CartPole-v1", "--out", str(out), "--resume", "--total-timesteps", "512",
                     "--target-return", "none", "--no-progress", "--set", "num_steps=32"]) == 0
    assert "--resume: no" in capsys.readouterr().out
    assert (out / "checkpoint.safetensors").exists()


@pytest.mark.skipif(os.name == "nt", reason="symlinks")
def test_resume_refuses_a_run_directory_whose_metrics_or_folders_are_symlinks(tmp_path, capsys):
    """A run directory from elsewhere (copied, unpacked, shared) whose tensorboard/ or videos/ was a symlink: --resume
    wrote its TensorBoard events and videos into the directory the link pointed at (another run's, whose videos of the
    same steps it replaced), and read a metrics.csv link's file as the run's rows. Now --resume says so in one sentence
    (exit 2) before anything is read or written through it."""
    out = tmp_path / "run"
    assert cli.main([*TINY_TRAIN, "--out", str(out), "--checkpoint-freq", "32"]) == 0
    capsys.readouterr()
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "step-000000096.mp4").write_bytes(b"another run's video")
    (theirs / "metrics.csv").write_text("timesteps,train_wall_s\n1,0.1\n", encoding="utf-8")
    for name, target in [("tensorboard", theirs), ("videos", theirs), ("metrics.csv", theirs / "metrics.csv")]:
        aside = out / f"{name}.aside"
        if (out / name).exists():
            (out / name).rename(aside)
        (out / name).symlink_to(target)
        before = {path.name: path.read_bytes() for path in theirs.iterdir()}
        config = (out / "config.yaml").read_bytes()
        assert cli.main([*TINY_TRAIN[:4], "128", *TINY_TRAIN[5:], "--out", str(out), "--resume",
                         "--video-every", "32"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"rlspeed: error: '{out / name}' is a symlink, which rlspeed neither reads nor writes through "
                       "(a run directory from elsewhere may point it at any file or directory): put what it points at "
                       "in its place, or remove it, and run again."]
        assert {path.name: path.read_bytes() for path in theirs.iterdir()} == before
        assert (out / "config.yaml").read_bytes() == config
        (out / name).unlink()
        if aside.exists():
            aside.rename(out / name)


def test_a_second_run_into_the_same_out_is_refused_and_keeps_the_first(runs, capsys):
    """A finished run directory (even for another algorithm) is never overwritten without --overwrite."""
    assert_succeeded(runs.result("train"))
    run_dir = runs.cwd / "plain"
    before = {path.name: path.read_bytes() for path in run_dir.iterdir() if path.is_file()}
    code = cli.main(["train", "dqn", "CartPole-v1", "--total-timesteps", "256", "--out", str(run_dir), "--no-progress"])
    captured = capsys.readouterr()
    assert_one_line_error(code, captured.out, captured.err, "already holds a run")
    assert "--overwrite" in captured.err and "--resume" in captured.err
    assert {path.name: path.read_bytes() for path in run_dir.iterdir() if path.is_file()} == before


def test_the_default_run_directory_gets_a_numbered_suffix_when_it_exists(tmp_path):
    base = tmp_path / "runs" / "ppo-CartPole-v1-0-20260101-000000"
    assert cli._fresh_run_dir(base) == base
    assert cli._fresh_run_dir(base) == base.with_name(base.name + "-1")
    assert cli._fresh_run_dir(base) == base.with_name(base.name + "-2")


def test_eval_of_a_run_reproduces_its_final_evaluation(runs, capsys):
    """`rlspeed eval RUN --seed S` (S: summary.json's final_eval seed) uses the run's env backend and gives its
    final_eval."""
    assert_succeeded(runs.result("train"))
    summary = json.loads((runs.cwd / "plain" / "summary.json").read_text())
    final = summary["final_eval"]
    code = cli.main(["eval", str(runs.cwd / "plain"), "--seed", str(final["seed"]), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result = json.loads(captured.out)
    assert (result["mean"], result["std"]) == (final["mean"], final["std"])


def test_eval_hints_paste_into_a_shell_for_a_run_directory_with_a_space(tmp_path):
    """The `rlspeed eval RUN --seed S` a stopped or unsaved run's message names was not quoted: a run directory with a
    space gave a command whose path split in two (a population member's line was quoted, and stays quoted once)."""
    import shlex

    run_dir = tmp_path / "my runs" / "it's"
    assert shlex.split(cli._eval_command(run_dir, 7, cli.EVAL_EPISODES)) == [
        "rlspeed", "eval", str(run_dir), "--seed", "7"]
    args = cli.build_parser().parse_args(["eval", str(run_dir), "--episodes", "3", "--env-kwargs", "a=b c"])
    assert shlex.split(cli._member_eval_command(args, run_dir / "members" / "seed_1.safetensors", 5)) == [
        "rlspeed", "eval", str(run_dir / "members" / "seed_1.safetensors"), "--seed", "5", "--episodes", "3",
        "--env-kwargs", "a=b c"]


def test_total_timesteps_takes_float_notation(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    code = cli.main(["train", "ppo", "CartPole-v1", "--total-timesteps", "5.12e2", "--target-return", "none",
                     "--out", "run", "--no-progress", "--num-envs", "4", "--set", "num_steps=32",
                     "--set", "batch_size=64"])
    assert code == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["total_timesteps"] == 512


@pytest.mark.parametrize("argv, line, total", [
    (["ppo", "CartPole-v1", "--total-timesteps", "200", "--num-envs", "4", "--set", "num_steps=32",
      "--set", "batch_size=64"], "up to 200 steps (256: whole iterations of 128)", 256),
    (["dqn", "CartPole-v1", "--total-timesteps", "302", "--num-envs", "1", "--set", "train_freq=4",
      "--set", "learning_starts=100"], "up to 302 steps (304: whole iterations of 4)", 304),
], ids=["rollouts", "collections"])
def test_a_budget_that_is_not_whole_iterations_says_what_it_trains(capsys, monkeypatch, tmp_path, argv, line, total):
    """learn trains whole iterations (a rollout of num_envs x num_steps; off-policy, a collection of train_freq
    steps of every env): the start line says where the run ends."""
    monkeypatch.chdir(tmp_path)
    code = cli.main(["train", *argv, "--target-return", "none", "--out", "run", "--no-progress"])
    said = capsys.readouterr()
    assert code == 0, said.err
    assert line in said.out + said.err
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["total_timesteps"] == total


def test_a_population_budget_that_is_not_whole_iterations_says_what_each_member_trains(capsys, monkeypatch, tmp_path):
    """As a solo run's start line: the members train whole rollouts too (before, 'up to 200 steps each', then
    '256 steps per member')."""
    monkeypatch.chdir(tmp_path)
    code = cli.main(["train", "ppo", "CartPole-v1", "--seeds", "0-1", "--total-timesteps", "200", "--num-envs", "4",
                     "--set", "num_steps=32", "--set", "batch_size=64", "--env-backend", "torch", "--target-return",
                     "none", "--eval-episodes", "1", "--out", "pop", "--no-progress"])
    said = capsys.readouterr()
    assert code == 0, said.err
    assert "up to 200 steps each (256: whole iterations of 128)" in said.out + said.err
    assert "256 steps per member" in said.out + said.err


def test_an_env_registered_by_a_module_trains_and_evaluates(capsys, monkeypatch, tmp_path):
    """`module:EnvId` and `--gym-packages MODULE` import the module that registers the env (as RL-Zoo does), and the
    run directory remembers it for `rlspeed eval`."""
    module = tmp_path / "my_rl_envs.py"
    module.write_text("import gymnasium\n"
                      "gymnasium.register('MyCartPole-v0', "
                      "entry_point='gymnasium.envs.classic_control.cartpole:CartPoleEnv', max_episode_steps=50)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    code = cli.main(["train", "ppo", "my_rl_envs:MyCartPole-v0", "--total-timesteps", "256", "--num-envs", "4",
                     "--target-return", "none", "--out", "run", "--no-progress", "--set", "num_steps=32",
                     "--set", "batch_size=64"])
    assert code == 0, capsys.readouterr().err
    capsys.readouterr()
    config = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert config["env_id"] == "MyCartPole-v0" and config["gym_packages"] == ["my_rl_envs"]
    assert cli.main(["eval", "run", "--episodes", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["episodes"] == 2
    # as in a fresh process (nothing registered yet), for the model file in the run directory too
    import sys

    import gymnasium

    for path in ("run", "run/model.safetensors"):
        monkeypatch.delitem(gymnasium.registry, "MyCartPole-v0", raising=False)
        monkeypatch.delitem(sys.modules, "my_rl_envs", raising=False)
        assert cli.main(["eval", path, "--episodes", "2", "--json"]) == 0
        said = capsys.readouterr()
        assert json.loads(said.out)["episodes"] == 2 and "importing my_rl_envs" in said.err
    # (the Python API takes the same id, also where learn evaluates for a target)
    from rlspeed import PPO

    model = PPO("my_rl_envs:MyCartPole-v0", num_envs=4, num_steps=32, batch_size=64, device="cpu")
    model.learn(256, target_return=1e9, eval_freq=128, eval_episodes=2, progress_bar=False)
    assert len(model.result.evaluations) == 2
    # (its model file names the module in its env id: rlspeed eval imports it, and says so, as for config.yaml's)
    model.save(tmp_path / "api_model")
    capsys.readouterr()
    assert cli.main(["eval", "api_model.safetensors", "--episodes", "2", "--json"]) == 0
    assert "importing my_rl_envs, which the model's env id my_rl_envs:MyCartPole-v0 names" in capsys.readouterr().err
    # (evaluated from a directory where the module is not found: the sentence says where the name came from and where
    # Python looks, not '--gym-packages', which the user never gave)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    monkeypatch.setattr(sys, "path", [entry for entry in sys.path if entry not in (str(tmp_path), "")])
    monkeypatch.delitem(sys.modules, "my_rl_envs", raising=False)
    assert cli.main(["eval", "../run", "--episodes", "2"]) == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert "Cannot import the module 'my_rl_envs' (recorded in ../run/config.yaml)" in error, error
    assert "PYTHONPATH" in error and "--gym-packages" not in error


def test_eval_no_imports_runs_no_module_that_a_run_directory_or_model_names(capsys, monkeypatch, tmp_path):
    """A run directory from elsewhere, evaluated from inside it, ran the code of a module it shipped (config.yaml's
    gym_packages, or a model's `module:EnvId` id, found in the current directory) with no way to refuse it.
    `--no-imports` imports neither: the recorded modules are said and skipped, and a `module:EnvId` model needs
    --env."""
    import sys

    import gymnasium

    from rlspeed import PPO

    (tmp_path / "shipped.py").write_text("import pathlib\npathlib.Path('RAN').write_text('x')\n"
                                         "import gymnasium\ngymnasium.register('Shipped-v0', "
                                         "entry_point='gymnasium.envs.classic_control.cartpole:CartPoleEnv')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    model = PPO("shipped:Shipped-v0", num_envs=4, num_steps=32, batch_size=64, device="cpu")
    model.save(tmp_path / "run" / "model")
    model.save(tmp_path / "loose")
    (tmp_path / "run" / "config.yaml").write_text("algo: ppo\nenv_id: CartPole-v1\ngym_packages: [shipped]\n")
    for given in (["run", "--env", "CartPole-v1"], ["loose.safetensors", "--env", "CartPole-v1"]):
        (tmp_path / "RAN").unlink(missing_ok=True)
        monkeypatch.delitem(sys.modules, "shipped", raising=False)
        capsys.readouterr()
        assert cli.main(["eval", *given, "--episodes", "1", "--no-progress", "--no-imports"]) == 0
        assert not (tmp_path / "RAN").exists()
        said = "not importing shipped, which run/config.yaml records" in capsys.readouterr().err
        assert said == (given[0] == "run")
    assert cli.main(["eval", "loose.safetensors", "--episodes", "1", "--no-imports"]) == 2
    assert ("was trained on shipped:Shipped-v0, whose module shipped --no-imports does not import: give --env "
            "ENV_ID") in capsys.readouterr().err
    assert not (tmp_path / "RAN").exists()
    gymnasium.registry.pop("Shipped-v0")  # (as in a fresh process: without --no-imports, imported as before)
    assert cli.main(["eval", "run", "--env", "CartPole-v1", "--episodes", "1", "--no-progress"]) == 0
    assert (tmp_path / "RAN").exists()
    gymnasium.registry.pop("Shipped-v0")


def test_a_nan_final_evaluation_is_null_in_summary_json(monkeypatch, tmp_path, capsys):
    from rlspeed.algos.base import Algorithm

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(Algorithm, "evaluate", lambda self, **kwargs: {"mean": float("nan"), "std": float("nan"),
                                                                       "episodes": 10})
    assert cli.main(["train", "ppo", "CartPole-v1", "--total-timesteps", "128", "--num-envs", "4", "--set",
                     "num_steps=32", "--set", "batch_size=64", "--target-return", "none", "--out", "run",
                     "--no-progress"]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text(), parse_constant=lambda c: pytest.fail(c))
    assert summary["final_eval"]["mean"] is None and summary["final_eval"]["std"] is None


def test_preset_source_is_said_and_recorded(tmp_path, monkeypatch, capsys):
    """--preset: rlspeed's own preset silently; a user's file (and RL-Zoo's, when installed) with a line naming it;
    summary.json and config.yaml record which source gave the hyperparameters."""
    monkeypatch.chdir(tmp_path)
    preset = tmp_path / "mine.yaml"
    preset.write_text("CartPole-v1:\n  num_envs: 4\n  num_steps: 16\n  batch_size: 64\n")
    code = cli.main(["train", "ppo", "CartPole-v1", "--preset", str(preset), "--total-timesteps", "512",
                     "--target-return", "none", "--no-progress", "--out", "mine"])
    assert code == 0
    assert "mine.yaml" in capsys.readouterr().out
    summary = json.loads((tmp_path / "mine" / "summary.json").read_text())
    assert summary["preset"]["source"] == "file"
    assert yaml.safe_load((tmp_path / "mine" / "config.yaml").read_text())["hyperparameters"]["num_steps"] == 16
    code = cli.main(["train", "ppo", "CartPole-v1", "--total-timesteps", "512", "--target-return", "none",
                     "--no-progress", "--out", "own"])
    assert code == 0 and "rlspeed: using rlspeed's preset for ppo CartPole-v1.\n" in capsys.readouterr().out
    assert json.loads((tmp_path / "own" / "summary.json").read_text())["preset"]["source"] == "rlspeed"


def test_preset_zoo_for_a_pair_rlspeed_lacks(tmp_path, monkeypatch, capsys):
    pytest.importorskip("rl_zoo3")
    monkeypatch.chdir(tmp_path)
    code = cli.main(["train", "a2c", "Acrobot-v1", "--total-timesteps", "512", "--target-return", "none",
                     "--no-progress", "--out", "zoo"])
    assert code == 0
    assert "using RL-Zoo's preset for a2c Acrobot-v1" in capsys.readouterr().out
    preset = json.loads((tmp_path / "zoo" / "summary.json").read_text())["preset"]
    assert preset["source"] == "zoo"
    # each of its fields is one docs/cli.md's `preset` entry names (it named none of them: a script grouping runs by
    # preset source had only the sample to go by)
    page = (Path(__file__).resolve().parent.parent / "docs" / "cli.md").read_text(encoding="utf-8")
    entry = re.search(r"^- `preset` holds .*?(?=^- )", page, re.DOTALL | re.MULTILINE)[0]
    assert [key for key in preset if f"`{key}`" not in entry] == []
    assert {"translation_notes", "differs_from_sb3"} <= set(preset)


def test_summary_has_the_numerics_report_and_nan_policy_reaches_the_model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = cli.main(["train", "ppo", "CartPole-v1", "--total-timesteps", "512", "--target-return", "none",
                     "--no-progress", "--nan-policy", "mask", "--out", "run"])
    assert code == 0
    numerics = json.loads((tmp_path / "run" / "summary.json").read_text())["numerics"]
    assert numerics["nan_policy"] == "mask" and numerics["rollbacks"] == 0


NAN_ENV_MODULE = """
import math
import gymnasium as gym


class NanRewards(gym.Wrapper):
    # (Gymnasium before 1.4 reads an entry point's metadata from its class, where a Wrapper's is a property)
    metadata = {"render_modes": []}

    def __init__(self):
        super().__init__(gym.make("CartPole-v1"))
        self.steps = 0

    def step(self, action):
        self.steps += 1
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, math.nan if self.steps % 7 == 0 else reward, terminated, truncated, info


gym.register("NanRewards-v0", entry_point=NanRewards, max_episode_steps=100)


class HugeObservations(gym.ObservationWrapper):
    # (CartPole's observations times 1e39: past float32's range, infinite in every row; `metadata`: as above)
    metadata = {"render_modes": []}

    def __init__(self):
        super().__init__(gym.make("CartPole-v1", disable_env_checker=True))

    def observation(self, observation):
        return (observation.astype("float64") + 1.0) * 1e39


gym.register("HugeObservations-v0", entry_point=HugeObservations, max_episode_steps=100, disable_env_checker=True)
"""


def test_masked_non_finite_env_rows_are_counted_in_the_closing_lines(tmp_path, monkeypatch, capsys):
    """--nan-policy mask keeps training through NaN rewards: how many rows it replaced is said at the end, not only
    in summary.json."""
    (tmp_path / "nan_rewards_env.py").write_text(NAN_ENV_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "ppo", "NanRewards-v0", "--gym-packages", "nan_rewards_env", "--num-envs", "2",
                     "--set", "num_steps=32", "--set", "batch_size=64", "--total-timesteps", "256",
                     "--target-return", "none", "--no-progress", "--nan-policy", "mask", "--out", "run"]) == 0
    masked = json.loads((tmp_path / "run" / "summary.json").read_text())["numerics"]["nonfinite_env_rows_masked"]
    assert masked > 0
    assert (f"--nan-policy mask replaced {masked:,} env rows holding NaN or infinite values by 0 (rows of 256 steps "
            "and of the envs' resets;") in capsys.readouterr().err


def test_masked_rows_of_an_env_whose_every_observation_is_infinite_are_not_said_to_exceed_the_steps(tmp_path,
                                                                                                    monkeypatch,
                                                                                                    capsys):
    """Observations past float32's range (1e39) are infinite in every row, resets included: the closing note said
    "replaced 258 env rows of 256", more rows than all there were; the rows counted are the steps' and the resets'."""
    (tmp_path / "nan_rewards_env.py").write_text(NAN_ENV_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "ppo", "HugeObservations-v0", "--gym-packages", "nan_rewards_env", "--num-envs", "2",
                     "--set", "num_steps=32", "--set", "batch_size=64", "--total-timesteps", "256",
                     "--target-return", "none", "--no-progress", "--nan-policy", "mask", "--out", "run",
                     "--eval-episodes", "1"]) == 0
    masked = json.loads((tmp_path / "run" / "summary.json").read_text())["numerics"]["nonfinite_env_rows_masked"]
    err = capsys.readouterr().err
    assert masked == 256 + 2 and f"{masked:,} env rows of 256" not in err  # (every step's rows, and the 2 resets)
    assert f"replaced {masked:,} env rows holding NaN or infinite values by 0 (rows of 256 steps and of the envs' " \
           "resets; the first: env 0 at its step 0)" in err


@needs_torch_export
@pytest.mark.parametrize("fmt", ["torchscript", "exported_program"])
def test_export_command_writes_the_policy_and_its_sidecar(fmt, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "ppo", "CartPole-v1", "--total-timesteps", "512", "--target-return", "none",
                     "--no-progress", "--out", "run"]) == 0
    out = tmp_path / f"policy.{fmt}"
    assert cli.main(["export", "run", "--format", fmt, "--out", str(out)]) == 0
    assert out.exists() and json.loads(Path(f"{out}.json").read_text())["algo"] == "ppo"
    assert cli.main(["export", "run", "--format", "bogus"]) == 2
    # (without --format, --out's suffix names it; a --format that contradicts the suffix is refused)
    named = tmp_path / "named.pt2"
    assert cli.main(["export", "run", "--out", str(named)]) == 0
    assert json.loads(Path(f"{named}.json").read_text())["format"] == "exported_program"
    assert cli.main(["export", "run", "--format", "torchscript", "--out", str(tmp_path / "wrong.pt2")]) == 2
    # an existing file is replaced only with --overwrite; the model file never
    capsys.readouterr()
    assert cli.main(["export", "run", "--out", str(named)]) == 2
    assert "exists: pass --overwrite" in capsys.readouterr().err
    assert cli.main(["export", "run", "--out", str(named), "--overwrite"]) == 0
    model_bytes = (tmp_path / "run" / "model.safetensors").read_bytes()
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    for out in ("run/model.safetensors", str(notes)):
        assert cli.main(["export", "run", "--out", out]) == 2
    assert (tmp_path / "run" / "model.safetensors").read_bytes() == model_bytes and notes.read_text() == "mine"
    # a file of the user's where the sidecar goes is theirs too
    (tmp_path / "fresh.pt2.json").write_text('{"mine": true}')
    assert cli.main(["export", "run", "--out", str(tmp_path / "fresh.pt2")]) == 2
    assert (tmp_path / "fresh.pt2.json").read_text() == '{"mine": true}' and not (tmp_path / "fresh.pt2").exists()


@needs_torch_export
def test_export_command_adds_the_action_mask_input_of_a_masked_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "ppo", "Taxi-v4", "--total-timesteps", "256", "--num-envs", "2", "--set",
                     "num_steps=64", "--set", "batch_size=64", "--target-return", "none", "--no-progress",
                     "--out", "run"]) == 0
    # (the run trained with Taxi's masks: the checkpoint says so, and the export takes them unless told not to)
    for index, (flag, expected) in enumerate((([], True), (["--no-action-mask"], False), (["--action-mask"], True))):
        out = tmp_path / f"policy{index}.pt2"
        assert cli.main(["export", "run", "--format", "exported_program", "--out", str(out), *flag]) == 0
        sidecar = json.loads(Path(f"{out}.json").read_text())
        assert ("action_mask" in json.dumps(sidecar["inputs"])) == expected, sidecar["inputs"]


def _cartpole_or_index(discrete: bool = False, **kwargs):
    """CartPole, whose observations become one index (Discrete(2): whether the cart is right of the centre) where
    its option `discrete` says so (as a course's env options switch tabular and vector observations)."""

    env = gym.make("CartPole-v1", **kwargs)
    if not discrete:
        return env
    return gym.wrappers.TransformObservation(env, lambda o: int(o[0] > 0), gym.spaces.Discrete(2))


def test_the_default_preset_fits_the_observations_the_env_options_make(tmp_path, monkeypatch, capsys):
    """The shipped default PPO preset's normalize_obs is left out for index observations; it was decided on the env
    as registered, without --env-kwargs: an option that makes the observations Discrete failed with "drop
    normalize_obs", a setting the user never gave."""

    monkeypatch.chdir(tmp_path)
    if "BoxOrIndex-v0" not in gym.registry:
        gym.register("BoxOrIndex-v0", entry_point=_cartpole_or_index, max_episode_steps=500)
    assert cli.main(["train", "ppo", "BoxOrIndex-v0", "--env-kwargs", "discrete=true", "--total-timesteps", "64",
                     "--num-envs", "2", "--set", "num_steps=32", "--set", "batch_size=64", "--no-progress",
                     "--out", "run"]) == 0, capsys.readouterr().err
    config = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert config["hyperparameters"]["normalize_obs"] is False and config["env_kwargs"] == {"discrete": True}


def _endless_env():
    """An env whose episodes never end and which has no time limit (as CliffWalking-v1 under a policy that loops)."""

    class Endless(gym.Env):
        observation_space, action_space = gym.spaces.Discrete(2), gym.spaces.Discrete(2)

        def reset(self, seed=None, options=None):
            super().reset(seed=seed)
            return 0, {}

        def step(self, action):
            return int(action), -1.0, False, False, {}

    return Endless()


def test_eval_of_episodes_without_end_advises_what_the_command_line_takes(tmp_path, capsys, monkeypatch):
    """Episodes still running at evaluate's step limit count with a warning, whose advice (`max_steps=`) `rlspeed
    eval` has no flag for; the command-line advice it gives now works: the episodes end at the limit it sets."""
    import warnings

    import rlspeed
    import rlspeed.evaluation

    if "Endless-v0" not in gym.registry:
        gym.register("Endless-v0", entry_point=_endless_env)
    monkeypatch.setattr(rlspeed.evaluation, "UNLIMITED_EPISODE_STEPS", 50)  # (10,000 steps: the same, slower)
    rlspeed.DQN("Endless-v0", device="cpu", seed=0).save(tmp_path / "model")
    argv = ["eval", str(tmp_path / "model.safetensors"), "--episodes", "1", "--seed", "0", "--json"]
    with pytest.warns(UserWarning, match="1 of 1 episodes were still running after 50 steps") as caught:
        assert cli.main(argv) == 0
    warning = str(caught[0].message)
    advice = re.search(r"(--env-kwargs) (\w+)=N\b", warning)
    assert advice is not None, warning
    assert "max_steps" not in warning and "env_kwargs=" not in warning  # (Python's ways, which the CLI has not)
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cli.main([*argv, advice.group(1), f"{advice.group(2)}=7"]) == 0
    assert json.loads(capsys.readouterr().out)["lengths"] == [7]


def test_evaluations_of_episodes_without_end_say_so_in_the_result_line_and_summary(tmp_path, monkeypatch, capsys):
    """A run on an env whose episodes never end: the final evaluation's line and `rlspeed eval`'s say how many
    episodes were cut short at the step limit, and summary.json's final_eval counts them (`unfinished`); they read
    as if the episodes had ended, the warning long scrolled by."""

    import rlspeed.evaluation

    if "Endless-v0" not in gym.registry:
        gym.register("Endless-v0", entry_point=_endless_env)
    monkeypatch.setattr(rlspeed.evaluation, "UNLIMITED_EPISODE_STEPS", 30)  # (10,000 steps: the same, slower)
    monkeypatch.chdir(tmp_path)
    with pytest.warns(UserWarning, match="2 of 2 episodes were still running after 30 steps"):
        assert cli.main(["train", "ppo", "Endless-v0", "--total-timesteps", "64", "--set", "num_envs=2", "--set",
                         "num_steps=32", "--set", "batch_size=64", "--eval-episodes", "2", "--no-progress", "--out",
                         "run"]) == 0
    assert "2 episodes, 2 of 2 cut short at the step limit, seed" in capsys.readouterr().out
    final = json.loads((tmp_path / "run" / "summary.json").read_text())["final_eval"]
    assert (final["mean"], final["unfinished"]) == (-30.0, 2)
    with pytest.warns(UserWarning, match="1 of 1 episodes were still running"):
        assert cli.main(["eval", "run", "--episodes", "1", "--seed", "0"]) == 0
    assert "1 episode, 1 of 1 cut short at the step limit, seed 0: -30" in capsys.readouterr().out


def test_the_confirmation_of_a_reached_target_says_how_many_episodes_were_cut_short(tmp_path, monkeypatch, capsys):
    """The evaluation that reached the target is confirmed on fresh episodes; where those were cut short at the step
    limit, the steps line says so, summary.json's `target_confirmation` counts them, and so does metrics.csv's
    `eval_confirm_unfinished` (the confirming mean alone read as if the episodes had ended)."""
    import warnings

    import rlspeed.evaluation

    if "Endless-v0" not in gym.registry:
        gym.register("Endless-v0", entry_point=_endless_env)
    monkeypatch.setattr(rlspeed.evaluation, "UNLIMITED_EPISODE_STEPS", 30)  # (10,000 steps: the same, slower)
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the warnings of the cut episodes: tested elsewhere)
        assert cli.main(["train", "ppo", "Endless-v0", "--total-timesteps", "64", "--set", "num_envs=2", "--set",
                         "num_steps=16", "--set", "batch_size=32", "--eval-episodes", "2", "--eval-freq", "32",
                         "--target-return", "-1000", "--no-progress", "--out", "run", "--resume"]) == 0
    out = capsys.readouterr().out
    assert "target -1000 reached after 32 steps in" in out and (
        " s (confirmed on fresh episodes, 2 of 2 cut short at the step limit)\n") in out, out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["target_confirmation"] == {"mean": -30.0, "episodes": 2, "unfinished": 2}
    with open(tmp_path / "run" / "metrics.csv", newline="", encoding="utf-8") as handle:
        rows = [row for row in csv.DictReader(handle) if row["eval_confirm_mean"]]
    assert [(row["eval_confirm_mean"], row["eval_confirm_unfinished"]) for row in rows] == [("-30.0", "2")], rows
    # killed after the checkpoint of the target reached, before the model and summary.json: --resume writes them,
    # the confirmation as the checkpoint recorded it
    (tmp_path / "run" / "summary.json").unlink()
    (tmp_path / "run" / "model.safetensors").unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert cli.main(["train", "ppo", "Endless-v0", "--total-timesteps", "64", "--eval-episodes", "2",
                         "--target-return", "-1000", "--no-progress", "--out", "run", "--resume"]) == 0
    assert " s (confirmed on fresh episodes, 2 of 2 cut short at the step limit)\n" in capsys.readouterr().out
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["target_confirmation"] == {
        "mean": -30.0, "episodes": 2, "unfinished": 2}


def test_a_bad_encryption_setting_is_refused_before_training(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RLSPEED_CHECKPOINT_KEY", "not a key")
    code = cli.main(["train", "ppo", "CartPole-v1", "--total-timesteps", "512", "--no-progress", "--out", "run"])
    assert code == 2 and "RLSPEED_CHECKPOINT_KEY" in capsys.readouterr().err
    assert not (tmp_path / "run" / "metrics.csv").exists()  # nothing trained


# --- what a new user met (each failed before its fix) ----------------------------------------------------------
def _rlspeed(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    """`rlspeed ARGV` in a fresh process (the console's own handling of signals and warnings)."""
    return subprocess.run([sys.executable, "-m", "rlspeed", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONWARNINGS": ""})


def test_a_torch_that_cannot_be_imported_is_one_sentence_saying_why(tmp_path, monkeypatch):
    """A torch.py in the working directory (`python -m` puts it first on the path), or torch's libraries that a batch
    job's `ulimit -v` leaves no room to map: `rlspeed doctor` and every command were torch's traceback."""
    (tmp_path / "torch.py").write_text("import torch.nn as nn\n")  # (a user's script of that name)
    done = _rlspeed("doctor", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == (
        "rlspeed: error: torch cannot be imported (ModuleNotFoundError: No module named 'torch.nn'; 'torch' is not a "
        f"package): '{tmp_path / 'torch.py'}' hides the installed torch: rename it, or run rlspeed from another "
        "directory.")
    # (the memory limit's reason, as the dynamic loader gives it, raised in torch's __init__)
    code = compile("raise ImportError('libtorch_cpu.so: failed to map segment from shared object')", "torch", "exec")
    try:
        exec(code, {"__name__": "torch"})
    except ImportError as error:
        failed = error
    monkeypatch.delitem(sys.modules, "torch")
    sentence = cli._torch_import_failure(failed)
    assert sentence.startswith("torch cannot be imported (ImportError: libtorch_cpu.so: failed to map segment from "
                               "shared object): the process's memory limit leaves no room for torch's libraries")
    monkeypatch.undo()
    assert cli._torch_import_failure(failed) is None  # (torch imported: a failure of something else)


@pytest.mark.parametrize("script", ["import torch\nprint(torch.cuda.is_available())\n", "x = 1\n"])
def test_a_torch_py_that_imports_or_fails_otherwise_is_named_too(tmp_path, script):
    """A user's torch.py is most often a script that imports torch and uses it (an AttributeError as it imports
    itself), or one that imports cleanly and lacks torch's names: both were tracebacks (train: `torch.Tensor` missing
    in rlspeed's own modules), and doctor printed a crash of every check as "a doctor bug"."""
    (tmp_path / "torch.py").write_text(script)
    for command in (["doctor"], ["train", "ppo", "CartPole-v1", "--total-timesteps", "64", "--out", "run"]):
        done = _rlspeed(*command, cwd=tmp_path)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("rlspeed: error: torch cannot be imported")
        assert lines[0].endswith(f"'{tmp_path / 'torch.py'}' hides the installed torch: rename it, or run rlspeed "
                                 "from another directory.")


def test_a_warning_made_an_error_by_python_w_error_is_one_line_without_a_traceback(tmp_path):
    """`python -W error -m rlspeed train ...` (a CI job that lets no warning pass): rlspeed's warning about a setting
    raised as an exception with a 20-line traceback; now it is one `rlspeed: error:` line naming the warning, exit
    code 1, and nothing is left in --out."""
    done = subprocess.run([sys.executable, "-W", "error", "-m", "rlspeed", "train", "ppo", "CartPole-v1", "--num-envs",
                           "2", "--total-timesteps", "64", "--no-progress", "--out", "run"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.splitlines() == [
        "rlspeed: error: batch_size 256 is larger than a rollout (num_envs 2 x num_steps 8 = 16 steps): every update "
        "uses the whole rollout as one minibatch; set batch_size to 16 or less, or raise num_envs x num_steps to 256 "
        "(UnusedSettingWarning, an error by the warning filter, -W error or PYTHONWARNINGS; --debug shows the "
        "traceback)."]
    assert not (tmp_path / "run").exists()


_WARNING_ENV = """
import warnings

import gymnasium as gym
from gymnasium.envs.classic_control import CartPoleEnv


class WarningEnv(CartPoleEnv):
    def __init__(self, **options):
        super().__init__(**options)
        warnings.warn("WarningEnv made: a warning\\nof two lines", UserWarning)
        self.stepped = False

    def step(self, action):
        if not self.stepped:
            self.stepped = True
            warnings.warn("WarningEnv stepped", RuntimeWarning)
        return super().step(action)


gym.register("WarningEnv-v0", entry_point="warning_env:WarningEnv", max_episode_steps=100)
"""


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_subprocess_envs_warnings_are_the_commands_lines_each_said_once(tmp_path, start_method):
    """An env that warns, in subprocess envs (gymnasium-async): each worker said each warning again (a line per env),
    and a spawned worker (macOS; Python 3.14's forkserver) as Python's multi-line warning with its source line. Now
    each is one `rlspeed: warning:` line, once over the command's processes."""
    import multiprocessing

    if start_method not in multiprocessing.get_all_start_methods():
        pytest.skip(f"no {start_method} here")
    (tmp_path / "warning_env.py").write_text(_WARNING_ENV)
    command = ("import multiprocessing, sys\n"
               f"multiprocessing.set_start_method({start_method!r})\n"
               "from rlspeed.cli import main\n"
               "sys.argv[1:] = ['train', 'ppo', 'warning_env:WarningEnv-v0', '--env-backend', 'gymnasium-async',\n"
               "                '--num-envs', '2', '--set', 'num_steps=16', '--set', 'batch_size=32',\n"
               "                '--total-timesteps', '32', '--target-return', 'none', '--no-progress',\n"
               "                '--eval-episodes', '1', '--out', 'run']\n"
               "raise SystemExit(main())\n")
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    temp = tmp_path / "tmp"  # (the command's own temp directory: other rlspeed commands on the machine keep theirs)
    temp.mkdir()
    done = subprocess.run([sys.executable, "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": path, "PYTHONWARNINGS": "", "TMPDIR": str(temp)})
    assert done.returncode == 0, done.stderr
    output = (done.stdout + done.stderr).splitlines()
    said = [line for line in output if any(text in line for text in ("WarningEnv made", "of two", "Env stepped"))]
    assert said == ["rlspeed: warning: WarningEnv made: a warning\\nof two lines",
                    "rlspeed: warning: WarningEnv stepped"], output
    assert not any("warnings.warn" in line or "leaked" in line for line in output), output
    assert not list(temp.glob("rlspeed-warnings-*"))  # (removed at the end)


def test_the_warnings_folder_of_a_killed_command_is_removed_by_the_next_one():
    """A command killed with SIGKILL never reached the end that removes its folder of shown warnings (subprocess
    envs), and each such kill left one in the temp directory for good; the next command that makes one removes those
    of commands no longer running, and keeps a running one's."""
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    killed = Path(tempfile.mkdtemp(prefix=f"rlspeed-warnings-{int(ended.stdout)}-"))
    running = Path(tempfile.mkdtemp(prefix=f"rlspeed-warnings-{os.getppid()}-"))
    (killed / "0123").touch()
    try:
        cli._workers_show_warnings()
        assert not killed.exists() and running.exists()
    finally:
        cli._forget_worker_warnings()
        shutil.rmtree(killed, ignore_errors=True)
        shutil.rmtree(running, ignore_errors=True)


def test_an_envs_own_error_in_subprocess_envs_is_one_line_without_gymnasiums_log(tmp_path):
    """An env that raises in a gymnasium-async worker: four `rlspeed: warning: ERROR: ...` lines of Gymnasium's log
    (one the worker's whole traceback with its line breaks escaped, over a thousand characters) came before the error
    line, which already says that --debug shows the env's traceback; now the error line alone."""
    (tmp_path / "raising_env.py").write_text(
        "import gymnasium as gym\nfrom gymnasium.envs.classic_control import CartPoleEnv\n\n\n"
        "class RaisingEnv(CartPoleEnv):\n    def step(self, action):\n        raise ValueError('broken env')\n\n\n"
        "gym.register('RaisingEnv-v0', entry_point='raising_env:RaisingEnv', max_episode_steps=100)\n")
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-m", "rlspeed", "train", "ppo", "raising_env:RaisingEnv-v0",
                           "--env-backend", "gymnasium-async", "--num-envs", "2", "--preset", "none", "--set",
                           "num_steps=8", "--set", "batch_size=16", "--target-return", "none", "--no-progress", "--out",
                           "run"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": path, "PYTHONWARNINGS": ""})
    assert done.returncode == 1
    assert "warning" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines()[-1] == ("rlspeed: error: The env 'RaisingEnv-v0' (gymnasium-async backend) raised "
                                            "ValueError in step(): broken env (--debug shows the env's traceback).")


def _reader_leaves_after_one_line(argv: list[str], cwd) -> tuple[str, str, int]:
    """`rlspeed ARGV | head -1` in a fresh process: (the line read, its stderr, its exit code)."""
    process = subprocess.Popen([sys.executable, "-m", "rlspeed", *argv], cwd=cwd, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    first = process.stdout.readline()
    process.stdout.close()  # (the reader leaves after one line)
    stderr = process.stderr.read()
    return first, stderr, process.wait(timeout=300)


def test_a_log_reader_that_leaves_neither_stops_the_run_nor_fails_it(tmp_path):
    """`rlspeed train ... | head -1`: the first write after the reader left raised BrokenPipeError, a traceback and
    exit code 1 after a run that had trained and saved (or in the middle of one)."""
    first, stderr, code = _reader_leaves_after_one_line(["train", "ppo", "CartPole-v1", "--total-timesteps", "300",
                                                         "--num-envs", "2", "--out", "run"], tmp_path)
    assert code == 0, stderr
    assert first.startswith("rlspeed: ") and "Traceback" not in stderr and "BrokenPipe" not in stderr
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["total_timesteps"] >= 300


def test_the_console_streams_tell_what_the_real_ones_do(tmp_path):
    """The wrapper the command puts on stdout and stderr (for a reader that leaves) lost its forwarding of the
    stream's attributes: isatty() was missing, so a terminal got status lines instead of a progress bar, and
    fileno() and encoding failed for anything that reads them."""
    from rlspeed.cli import _ReaderMayLeave
    from rlspeed.logging import _is_terminal

    with open(tmp_path / "log", "w", encoding="utf-8") as file:
        wrapped = _ReaderMayLeave(file)
        assert wrapped.fileno() == file.fileno() and wrapped.encoding == "utf-8" and not _is_terminal(wrapped)
    if hasattr(os, "openpty"):
        leader, follower = os.openpty()
        with os.fdopen(follower, "w") as terminal:
            assert _is_terminal(_ReaderMayLeave(terminal))
        os.close(leader)


def test_a_command_whose_output_is_all_it_does_stops_when_its_reader_leaves(tmp_path):
    """`rlspeed doctor | head -2`: the doctor went on measuring for half a minute after the reader had left, its
    lines going nowhere. It stops at the next line, with exit code 141 (128 + SIGPIPE) as Unix tools do."""
    first, stderr, code = _reader_leaves_after_one_line(["doctor"], tmp_path)
    assert code == 141, stderr
    assert first.startswith("rlspeed doctor") and "Traceback" not in stderr and "BrokenPipe" not in stderr


@pytest.mark.skipif(sys.platform == "win32", reason="closes a file descriptor before exec")
@pytest.mark.parametrize("closed", [1, 2])
def test_a_closed_output_stream_changes_neither_the_exit_code_nor_the_other_streams_output(tmp_path, closed):
    """`rlspeed ... >&-` or `2>&-` (a cron job, a daemon's closed stream): the wrapper of the missing stream failed on
    its first write and at exit (AttributeError, exit code 120), and `eval --json 2>&-` printed no JSON."""
    run = tmp_path / "run"
    model = PPO("CartPole-v1", device="cpu", seed=0, num_envs=2, num_steps=16, batch_size=32)
    model.learn(32, progress_bar=False).save(run / "model.safetensors")
    for argv, code in ((["eval", str(run), "--episodes", "1", "--json"], 0), (["train", "ppo", "CartPole-v1", "--set",
                                                                               "nope=1"], 2)):
        done = subprocess.run([sys.executable, "-m", "rlspeed", *argv], capture_output=True, text=True, timeout=300,
                              preexec_fn=lambda: os.close(closed))
        assert done.returncode == code, done.stderr
        output = done.stderr if closed == 1 else done.stdout
        assert "Traceback" not in output and "Exception ignored" not in output
        if closed == 2 and argv[0] == "eval":
            assert json.loads(done.stdout)["episodes"] == 1


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (a device whose writes fail: ENOSPC)")
def test_an_output_that_cannot_be_written_is_one_sentence_and_a_lost_result_a_failure(tmp_path):
    """`rlspeed ... > LOG` on a full disk: `rlspeed train` stopped before training with a Python traceback (exit code
    120), and `rlspeed eval --json` and `--version`, whose output was lost, printed "Exception ignored" tracebacks and
    exited 120. A run goes on (its lines going nowhere, said once on stderr) and keeps its exit code; a command whose
    output is all it does fails with one sentence and exit code 1, as Unix tools do on a write error."""
    run = tmp_path / "run"
    model = PPO("CartPole-v1", device="cpu", seed=0, num_envs=2, num_steps=16, batch_size=32)
    model.learn(32, progress_bar=False).save(run / "model.safetensors")
    environment = {**os.environ, "PYTHONUNBUFFERED": ""}  # (stdout to a file is buffered, as it is by default)
    for argv, code in ((["eval", str(run), "--episodes", "1", "--seed", "0", "--json"], 1), (["--version"], 1),
                       (["train", "ppo", "CartPole-v1", "--total-timesteps", "64", "--num-envs", "2", "--set",
                         "num_steps=16", "--target-return", "none", "--eval-episodes", "1", "--out",
                         str(tmp_path / "trained")], 0)):
        with open("/dev/full", "w") as full:
            done = subprocess.run([sys.executable, "-m", "rlspeed", *argv], stdout=full, stderr=subprocess.PIPE,
                                  text=True, timeout=300, env=environment)
        assert done.returncode == code, done.stderr
        assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
        said = [line for line in done.stderr.splitlines() if "standard output" in line]
        assert len(said) == 1 and "No space left on device" in said[0], done.stderr
        assert said[0].startswith("rlspeed: error: " if code else "rlspeed: warning: ")
    assert json.loads((tmp_path / "trained" / "summary.json").read_text())["total_timesteps"] >= 64


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (a device whose writes fail: ENOSPC)")
@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["eval", "--help"]])
def test_help_and_version_that_cannot_be_written_fail_unbuffered_too(argv):
    """Under PYTHONUNBUFFERED=1 (or python -u, as many containers run), `rlspeed --version > LOG` on a full disk
    failed inside the parse, before the command had said its output is all it does: it printed "the command goes on"
    and exited 0 with its output lost."""
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "rlspeed", *argv], stdout=full, stderr=subprocess.PIPE, text=True,
                              timeout=300, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert done.returncode == 1, done.stderr
    said = [line for line in done.stderr.splitlines() if "standard output" in line]
    assert len(said) == 1 and said[0].startswith("rlspeed: error: cannot write standard output"), done.stderr


@pytest.fixture(scope="module")
def async_run_in_a_gbk_directory(tmp_path_factory) -> tuple[bytes, subprocess.CompletedProcess]:
    """One `python -m rlspeed train` in subprocess envs whose --out is not UTF-8 (two tests read its result): the
    --out (bytes) and the finished process."""
    out = os.fsencode(tmp_path_factory.mktemp("cli")) + b"/gbk_\xce\xd2/run"
    done = subprocess.run([os.fsencode(sys.executable), b"-m", b"rlspeed", b"train", b"ppo", b"CartPole-v1",
                           b"--total-timesteps", b"256", b"--env-backend", b"gymnasium-async", b"--num-envs", b"2",
                           b"--eval-episodes", b"1", b"--no-progress", b"--out", out], capture_output=True,
                          timeout=300, env={**os.environ, "PYTHONWARNINGS": ""})
    return out, done


def test_a_run_directory_whose_name_is_not_utf8_is_printed_as_its_bytes(async_run_in_a_gbk_directory):
    """A directory named in another encoding (a GBK zip unpacked here) was printed as backslash escapes, a path that
    cannot be copied back into the shell."""
    out, done = async_run_in_a_gbk_directory
    assert done.returncode == 0, done.stderr
    assert b"rlspeed: run directory " + out + b"\n" in done.stdout


def test_subprocess_envs_close_without_a_traceback(async_run_in_a_gbk_directory):
    """The env workers stop on their vector env's SIGTERM as they should, not through the CLI's SIGTERM handler."""
    _, done = async_run_in_a_gbk_directory
    assert done.returncode == 0, done.stderr
    assert b"Traceback" not in done.stderr and b"Terminated" not in done.stderr


def test_warnings_are_one_rlspeed_line_and_a_diverged_run_says_how_to_rerun(tmp_path):
    # (two rollbacks' warnings, then the error of a run whose every update was non-finite)
    done = _rlspeed("train", "dqn", "CartPole-v1", "--total-timesteps", "1024", "--set", "learning_rate=1e30",
                    "--no-progress", "--out", "run", cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert any(line.startswith("rlspeed: warning: non-finite parameters") for line in lines), done.stderr
    assert "RuntimeWarning" not in done.stderr and "model.learn(" not in done.stderr  # (no source line)
    assert "give --overwrite to train there again" in lines[-1]


def test_resume_without_seed_keeps_the_runs_own_seed(tmp_path, monkeypatch, capsys):
    """A run started with --seed 7 and resumed without --seed goes on with seed 7: config.yaml and summary.json keep
    it, and the final evaluation's episodes are seed 7's (not the default seed 0's). The resumed run names the export
    beside it, of the model it replaced (`_say_stale_exports`). Its lines say which steps they count: the steps left
    (it said "up to 4,096 steps", then "8,192 steps ... over the whole run" for a run resumed from 4,096 to 8,192)."""
    monkeypatch.chdir(tmp_path)
    argv = ["train", "ppo", "CartPole-v1", "--target-return", "none", "--checkpoint-freq", "200", "--no-progress",
            "--set", "num_steps=16", "--out", "run"]
    assert cli.main([*argv, "--total-timesteps", "400", "--seed", "7"]) == 0
    before = json.loads((tmp_path / "run" / "summary.json").read_text())["total_timesteps"]
    (tmp_path / "run" / "model.onnx").write_text("")  # (export's files, as `rlspeed export run` leaves them)
    (tmp_path / "run" / "model.onnx.json").write_text(json.dumps({"format": "onnx", "algo": "PPO",
                                                                  "num_timesteps": 400}))
    capsys.readouterr()
    assert cli.main([*argv, "--total-timesteps", "800", "--resume"]) == 0
    said = capsys.readouterr()
    assert "run/model.onnx is an export of the model at 400 steps, not of this model.safetensors at" in said.err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert re.search(rf"up to {800 - before:,} more steps.*, after the {before:,} the run has trained", said.out)
    assert (f"the whole run: {summary['total_timesteps']:,} steps in " in said.out
            and f"steps/s), {summary['total_timesteps'] - before:,} of them in this resume" in said.out), said.out
    assert summary["total_timesteps"] >= 800
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["seed"] == summary["seed"] == 7
    from rlspeed.evaluation import evaluation_seed

    assert summary["final_eval"]["seed"] == evaluation_seed(7, "final", summary["total_timesteps"])


def test_resume_continues_from_the_end_of_a_finished_run_and_says_what_changed(tmp_path, monkeypatch, capsys):
    from rlspeed.checkpoint import load_checkpoint

    monkeypatch.chdir(tmp_path)
    argv = ["train", "ppo", "CartPole-v1", "--target-return", "none", "--checkpoint-freq", "400", "--no-progress",
            "--set", "num_steps=16", "--out", "run"]
    assert cli.main([*argv, "--total-timesteps", "1000"]) == 0
    steps = json.loads((tmp_path / "run" / "summary.json").read_text())["total_timesteps"]
    assert load_checkpoint(tmp_path / "run" / "checkpoint.safetensors")[1]["num_timesteps"] == steps  # (the end)
    config = (tmp_path / "run" / "config.yaml").read_text()
    capsys.readouterr()
    assert cli.main([*argv, "--total-timesteps", "500", "--resume"]) == 0  # (nothing left to train)
    assert (tmp_path / "run" / "config.yaml").read_text() == config  # (the run's budget stays recorded)
    assert cli.main([*argv, "--total-timesteps", "1200", "--resume", "--seed", "5"]) == 2  # (its random state)
    assert "continues the run with its own seed 0" in capsys.readouterr().err
    assert cli.main([*argv, "--total-timesteps", "1200", "--resume", "--set", "ent_coef=0.05"]) == 0
    out = capsys.readouterr()
    assert f"resumed from run/checkpoint.safetensors at {steps:,} steps" in out.out
    assert "other settings than the run started with: ent_coef " in out.err and "-> 0.05" in out.err


@pytest.mark.plots
def test_a_run_killed_before_its_plot_is_finished_by_resume_with_the_plot(tmp_path, monkeypatch):
    """A run killed after its last checkpoint (the whole budget) and before learn drew learning_curve.png: --resume,
    with nothing left to train, saved and evaluated it, and the finished run had no plot for good."""
    monkeypatch.chdir(tmp_path)
    argv = ["train", "ppo", "CartPole-v1", "--target-return", "none", "--checkpoint-freq", "256", "--no-progress",
            "--set", "num_steps=16", "--num-envs", "4", "--out", "run", "--total-timesteps", "512"]
    assert cli.main(argv) == 0
    plot = (tmp_path / "run" / "learning_curve.png").read_bytes()
    for name in ("learning_curve.png", "summary.json", "model.safetensors"):  # (what the kill left unwritten)
        (tmp_path / "run" / name).unlink()
    assert cli.main([*argv, "--resume"]) == 0
    redrawn = (tmp_path / "run" / "learning_curve.png").read_bytes()
    assert redrawn.startswith(b"\x89PNG") and len(redrawn) > len(plot) // 2


def test_a_resumed_runs_summary_describes_the_whole_run(tmp_path, monkeypatch):
    """summary.json after --resume: total_timesteps, train_wall_s and sps are the whole run's (from its start), as
    its target fields and an uninterrupted run's summary are; `distributed` says where the resume took over."""
    monkeypatch.chdir(tmp_path)
    argv = ["train", "ppo", "CartPole-v1", "--target-return", "none", "--checkpoint-freq", "256", "--no-progress",
            "--set", "num_steps=16", "--num-envs", "4", "--out", "run"]
    assert cli.main([*argv, "--total-timesteps", "512"]) == 0
    first = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert cli.main([*argv, "--total-timesteps", "1024", "--resume"]) == 0
    whole = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert first["total_timesteps"] == 512 and whole["total_timesteps"] == 1024
    assert whole["train_wall_s"] > first["train_wall_s"]
    assert whole["sps"] == pytest.approx(whole["total_timesteps"] / whole["train_wall_s"], rel=1e-3)
    assert whole["distributed"]["resumed_from_timesteps"] == 512
    # (docs/checkpoints.md names each of the entry's fields: it named neither world_size, backend nor
    # resumed_from_timesteps)
    page = (Path(__file__).resolve().parent.parent / "docs" / "checkpoints.md").read_text(encoding="utf-8")
    entry = re.search(r"`summary.json`'s `distributed` entry .*?\n\n", page, re.DOTALL)[0]
    assert [key for key in whole["distributed"] if f"`{key}`" not in entry] == []


def test_ctrl_c_before_a_resumed_run_trains_keeps_its_checkpoint(tmp_path, monkeypatch):
    """Ctrl-C while a resumed run is still starting (its envs, before the first iteration): the checkpoint it resumed
    from is kept as it was, and summary.json describes the run as that checkpoint left it."""
    from rlspeed.algos.on_policy import OnPolicyAlgorithm

    monkeypatch.chdir(tmp_path)
    argv = ["train", "ppo", "CartPole-v1", "--target-return", "none", "--checkpoint-freq", "256", "--no-progress",
            "--set", "num_steps=16", "--num-envs", "4", "--out", "run"]
    assert cli.main([*argv, "--total-timesteps", "512"]) == 0
    checkpoint = (tmp_path / "run" / "checkpoint.safetensors").read_bytes()
    finished = json.loads((tmp_path / "run" / "summary.json").read_text())

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(OnPolicyAlgorithm, "_start", interrupted)
    assert cli.main([*argv, "--total-timesteps", "1024", "--resume"]) == 130
    assert (tmp_path / "run" / "checkpoint.safetensors").read_bytes() == checkpoint
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["stopped_by"] == "signal"
    assert (summary["total_timesteps"], summary["train_wall_s"]) == (512, finished["train_wall_s"])


def test_eval_freq_without_a_target_gives_an_evaluation_curve(tmp_path, monkeypatch):
    """`--target-return none --eval-freq N` evaluates every N steps (metrics.csv's eval_mean); without --eval-freq a
    run without a target does not evaluate (a preset's eval_freq serves its target)."""
    monkeypatch.chdir(tmp_path)
    argv = ["train", "ppo", "CartPole-v1", "--target-return", "none", "--no-progress", "--set", "num_steps=16",
            "--num-envs", "4", "--total-timesteps", "512"]
    assert cli.main([*argv, "--eval-freq", "256", "--out", "evaluated"]) == 0
    with open(tmp_path / "evaluated" / "metrics.csv", newline="") as handle:
        means = [row["eval_mean"] for row in csv.DictReader(handle) if row["eval_mean"]]
    assert len(means) == 2
    assert cli.main([*argv, "--out", "plain"]) == 0
    assert "eval_mean" not in (tmp_path / "plain" / "metrics.csv").read_text().splitlines()[0]


def test_eval_episodes_sets_every_evaluation_of_a_run_and_resume_keeps_it(tmp_path, monkeypatch, capsys):
    """`--eval-episodes N` (RL-Zoo's flag; every evaluation played 10 episodes, minutes on long-episode envs):
    the evaluations during training and the final one (summary.json's final_eval) play N episodes; config.yaml
    records N, a --resume without the flag keeps it and one with another N names the change."""
    from rlspeed.algos.base import Algorithm

    monkeypatch.chdir(tmp_path)
    played: list[int] = []  # (the episodes of each evaluation, as the returns it gave count them)
    evaluate = Algorithm.evaluate

    def counting(self, *args, **kwargs):
        result = evaluate(self, *args, **kwargs)
        played.append(len(result["returns"]))
        return result

    monkeypatch.setattr(Algorithm, "evaluate", counting)
    start = ["train", "ppo", "CartPole-v1", "--env-backend", "torch", "--target-return", "none", "--eval-freq", "256",
             "--checkpoint-freq", "256", "--num-envs", "4", "--set", "num_steps=16", "--no-progress", "--out", "run"]
    assert cli.main([*start, "--total-timesteps", "512", "--eval-episodes", "3"]) == 0
    assert played == [3, 3, 3]  # (at 256 and 512 steps, then the final evaluation)
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["final_eval"]["episodes"] == 3
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["eval_episodes"] == 3
    from rlspeed.evaluation import evaluation_seed

    seed = evaluation_seed(0, "final", 512)  # (the run's seed 0 after its 512 steps)
    assert f"final evaluation (deterministic, 3 episodes, seed {seed})" in capsys.readouterr().out
    played.clear()
    assert cli.main([*start, "--total-timesteps", "768", "--resume"]) == 0
    assert played == [3, 3]  # (at 768 steps, then the final evaluation)
    assert "eval_episodes" not in capsys.readouterr().err
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["eval_episodes"] == 3
    played.clear()
    assert cli.main([*start, "--total-timesteps", "1024", "--resume", "--eval-episodes", "2"]) == 0
    assert played == [2, 2]
    assert "eval_episodes 3 -> 2" in capsys.readouterr().err
    config = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert config["eval_episodes"] == 2 and config["changes"][-1]["settings"]["eval_episodes"] == [3, 2]
    # a run whose config.yaml an rlspeed before --eval-episodes wrote evaluated 10 episodes: a change is named as one
    del config["eval_episodes"]
    (tmp_path / "run" / "config.yaml").write_text(yaml.safe_dump(config))
    assert cli.main([*start, "--total-timesteps", "1280", "--resume", "--eval-episodes", "2"]) == 0
    assert "eval_episodes 10 -> 2" in capsys.readouterr().err


def test_resume_keeps_the_runs_own_settings_for_flags_not_given(tmp_path, monkeypatch, capsys):
    """`--resume` with only the new budget continues with what the run was started with (a preset file's
    hyperparameters, the env backend, no target), not the shipped preset's defaults; --set still changes one."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.yaml").write_text("num_envs: 4\nnum_steps: 32\nlearning_rate: 0.001\n")
    start = ["train", "ppo", "CartPole-v1", "--out", "run", "--no-progress"]
    assert cli.main([*start, "--preset", "mine.yaml", "--env-backend", "gymnasium", "--target-return", "none",
                     "--checkpoint-freq", "256", "--total-timesteps", "512"]) == 0
    before = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    capsys.readouterr()
    assert cli.main([*start, "--resume", "--total-timesteps", "768"]) == 0
    out = capsys.readouterr()
    after = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    # only the budget changed (the run's evaluation frequency, None, is kept, not the shipped preset's)
    assert "other settings than the run started with: total_timesteps 512 -> 768 (" in out.err
    assert "stopping at eval return" not in out.out
    assert after["hyperparameters"] == before["hyperparameters"] and after["env_backend"] == "gymnasium"
    assert after["total_timesteps"] == 768 and after["target_return"] is None and after["preset"] == before["preset"]
    assert after["eval_freq"] == before["eval_freq"] is None
    assert cli.main([*start, "--resume", "--total-timesteps", "1024", "--set", "learning_rate=0.002"]) == 0
    assert "learning_rate 0.001 -> 0.002" in capsys.readouterr().err
    # --set of a run setting, and an abbreviated flag, still override what the run recorded
    assert cli.main([*start, "--resume", "--set", "total_timesteps=1280", "--env-back", "torch"]) == 0
    after = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert after["total_timesteps"] == 1280 and after["env_backend"] == "torch"
    # how the run trains, changed, is named too and listed in config.yaml's changes (it was applied silently)
    capsys.readouterr()
    assert cli.main([*start, "--resume", "--total-timesteps", "1536", "--checkpoint-freq", "512",
                     "--nan-policy", "mask"]) == 0
    err = capsys.readouterr().err
    assert "checkpoint_freq 256 -> 512" in err and "nan_policy raise -> mask" in err
    after = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert after["changes"][-1]["settings"]["checkpoint_freq"] == [256, 512]


def test_resume_of_a_finished_run_without_a_checkpoint_has_nothing_left_to_train(tmp_path, monkeypatch, capsys):
    """A run shorter than a timed checkpoint's interval finishes without checkpoint.safetensors: the same command with
    --resume (a batch job's requeue) was refused, exit 2, where a finished run's requeue exits 0; a larger budget,
    which needs a checkpoint to train on from, is still refused."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli, "CHECKPOINT_INTERVAL_S", 3600.0)  # (shorter than the interval, however slow the machine)
    argv = ["train", "ppo", "CartPole-v1", "--out", "run", "--no-progress", "--target-return", "none",
            "--num-envs", "4", "--set", "num_steps=16", "--total-timesteps", "256"]
    assert cli.main(argv) == 0
    assert not (tmp_path / "run" / "checkpoint.safetensors").exists()
    before = {name: (tmp_path / "run" / name).read_bytes() for name in ("config.yaml", "summary.json")}
    capsys.readouterr()
    assert cli.main([*argv, "--resume"]) == 0
    assert "nothing left to train" in capsys.readouterr().out
    assert {name: (tmp_path / "run" / name).read_bytes() for name in before} == before
    error = cli_error(capsys, [*argv[:-1], "512", "--resume"])
    assert "holds a finished run" in error and "no checkpoint.safetensors" in error


def test_resume_of_a_finished_run_names_the_settings_it_leaves_unused(tmp_path, monkeypatch, capsys):
    """--resume of a finished run with other hyperparameters, evaluation episodes or a smaller budget said only
    "nothing left to train" (exit 0): the --set value, --eval-episodes and --total-timesteps given went unused without
    a word."""
    monkeypatch.chdir(tmp_path)
    argv = ["train", "ppo", "CartPole-v1", "--out", "run", "--no-progress", "--target-return", "none",
            "--num-envs", "4", "--set", "num_steps=16", "--total-timesteps", "256", "--checkpoint-freq", "128"]
    assert cli.main(argv) == 0
    config = (tmp_path / "run" / "config.yaml").read_text()
    capsys.readouterr()
    assert cli.main([*argv, "--resume"]) == 0  # (a requeue of its own command: nothing to name)
    out = capsys.readouterr()
    assert "nothing left to train" in out.out and "unused" not in out.err
    assert cli.main([*argv, "--resume", "--set", "n_epochs=3", "--eval-episodes", "2", "--checkpoint-freq", "64"]) == 0
    err = capsys.readouterr().err
    assert "these settings go unused: n_epochs " in err
    assert "-> 3, eval_episodes 10 -> 2, checkpoint_freq 128 -> 64 (config.yaml keeps the run's)" in err
    assert (tmp_path / "run" / "config.yaml").read_text() == config
    # a smaller budget, with nothing left to train too, went unnamed
    assert cli.main([*argv, "--resume", "--total-timesteps", "128"]) == 0
    assert "these settings go unused: total_timesteps 256 -> 128 (config.yaml keeps the run's)" in \
        capsys.readouterr().err
    # a target given to a run that had none went unnamed (None was taken for a setting not given)
    assert cli.main([*argv, "--resume", "--target-return", "100"]) == 0
    assert "these settings go unused: target_return None -> 100.0 (config.yaml keeps the run's)" in \
        capsys.readouterr().err
    # a smaller budget, with nothing left to train too, went unnamed, as a target where the run had none did
    assert cli.main([*argv, "--resume", "--total-timesteps", "128", "--target-return", "500"]) == 0
    assert "these settings go unused: total_timesteps 256 -> 128, target_return None -> 500.0 (config.yaml keeps the " \
           "run's)" in capsys.readouterr().err
    # a run of 2 processes (--nproc 2: its config.yaml's processes) requeued in one: named too (it went unsaid)
    (tmp_path / "run" / "config.yaml").write_text(config.replace("processes: 1\n", "processes: 2\n"))
    assert cli.main([*argv, "--resume"]) == 0
    assert "these settings go unused: processes 2 -> 1 (config.yaml keeps the run's)" in capsys.readouterr().err


def test_resume_with_a_budget_below_the_steps_trained_is_refused(tmp_path, monkeypatch, capsys):
    """A resumed budget below the steps already trained said config.yaml recorded it (it did not), wrote a finished
    summary, and a later plain --resume trained on to the old budget: refused, naming the budget that ends the run."""
    monkeypatch.chdir(tmp_path)
    start = ["train", "ppo", "CartPole-v1", "--out", "run", "--no-progress", "--target-return", "none",
             "--num-envs", "4", "--checkpoint-freq", "128", "--total-timesteps", "4096"]

    def stop_at_256(self, *args, **kwargs):  # (a stop at 256 steps, as a signal's: the checkpoint is written there)
        self.stop_requested = lambda: self.num_timesteps >= 256
        return learn(self, *args, **kwargs)

    from rlspeed.algos.base import Algorithm

    learn = Algorithm.learn
    monkeypatch.setattr(Algorithm, "learn", stop_at_256)
    assert cli.main(start) == 143
    monkeypatch.setattr(Algorithm, "learn", learn)
    trained = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    capsys.readouterr()
    error = cli_error(capsys, [*start[:-2], "--resume", "--total-timesteps", "100"])
    assert "--total-timesteps 100 is below the" in error and "steps the run has trained" in error
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text()) == trained


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Acrobot-v1"])  # (a shipped preset, and rlspeed's default)
def test_resume_naming_the_preset_the_run_used_keeps_the_runs_values(tmp_path, monkeypatch, capsys, env_id):
    """`--resume --preset rlspeed` on a run started with that preset and --set values went back to the preset's
    (num_steps, normalize_obs, the target), as if the run had been started without them."""
    monkeypatch.chdir(tmp_path)
    start = ["train", "ppo", env_id, "--out", "run", "--no-progress", "--preset", "rlspeed"]
    assert cli.main([*start, "--set", "num_steps=16", "--set", "normalize_obs=true", "--num-envs", "2",
                     "--target-return", "none", "--total-timesteps", "64", "--checkpoint-freq", "32"]) == 0
    before = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert cli.main([*start, "--resume", "--total-timesteps", "128"]) == 0
    after = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert after["hyperparameters"] == before["hyperparameters"] and after["target_return"] is None
    assert after["hyperparameters"]["num_steps"] == 16 and after["hyperparameters"]["normalize_obs"] is True


def test_a_population_checkpoint_resumed_without_seeds_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = ["train", "ppo", "CartPole-v1", "--total-timesteps", "512", "--no-progress", "--out", "run"]
    assert cli.main([*argv, "--seeds", "0-1", "--target-return", "none"]) == 0
    (tmp_path / "run" / "summary.json").unlink()  # (unfinished, as a population stopped before its end leaves it)
    assert cli.main([*argv, "--resume"]) == 2
    assert ("'run' holds a population's run (seeds 0,1): resume it as a population (rlspeed train ppo CartPole-v1 "
            "--seeds 0,1 --out run --resume)") in capsys.readouterr().err


def test_overwrite_removes_exports_of_the_replaced_model_and_export_refuses_a_missing_directory(tmp_path,
                                                                                               monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = ["train", "ppo", "CartPole-v1", "--total-timesteps", "256", "--no-progress", "--out", "run"]
    assert cli.main([*argv, "--checkpoint-freq", "256"]) == 0
    assert cli.main(["export", "run", "--format", "torchscript"]) == 0
    assert (tmp_path / "run" / "model.pt").exists() and (tmp_path / "run" / "model.pt.json").exists()
    assert cli.main([*argv, "--overwrite"]) == 0
    assert not (tmp_path / "run" / "model.pt").exists() and not (tmp_path / "run" / "model.pt.json").exists()
    assert cli.main(["export", "run", "--format", "torchscript", "--out", "missing/model.pt"]) == 2
    assert not (tmp_path / "missing").exists()
    # an --out whose suffix names no format, without --format: refused as model.export refuses it (not ONNX in it)
    with pytest.raises(UserError, match=r"Cannot tell the export format from 'policy.bin'.*--format"):
        cli.main(["--debug", "export", "run", "--out", "policy.bin"])
    assert not (tmp_path / "policy.bin").exists()
    (tmp_path / "a file").write_text("")  # (its parent a file: "does not exist" was wrong)
    with pytest.raises(UserError, match="'a file' is a file, not a directory"):
        cli.main(["--debug", "export", "run", "--format", "torchscript", "--out", "a file/model.pt"])
    with pytest.raises(UserError, match="'a file' is a file, not a directory"):
        cli.main(["--debug", "eval", "run", "--video", "a file/v.gif"])
    (tmp_path / "mine").mkdir()  # (a user's own model.pt, without export's metadata: not a run's, and kept)
    (tmp_path / "mine" / "model.pt").write_text("the user's")
    assert cli.main([*argv[:-1], "mine"]) == 0
    assert cli.main([*argv[:-1], "mine", "--overwrite"]) == 0
    assert (tmp_path / "mine" / "model.pt").read_text() == "the user's"


def test_the_commands_a_message_names_quote_a_path_with_a_space(tmp_path, capsys):
    """A command a note or refusal names pastes as it is: a run directory with a space gave
    'rlspeed export /my runs/a --format ...' and 'rlspeed eval /my runs/a/members/seed_0.safetensors --video v.mp4',
    which split the path in a shell."""
    run = tmp_path / "my runs"
    run.mkdir()
    (run / "model.pt").write_text("")
    (run / "model.pt.json").write_text(json.dumps({"format": "torchscript", "algo": "PPO", "num_timesteps": 256}))
    cli._say_stale_exports(print, run / "model.safetensors", 512)
    assert f"redo it with rlspeed export '{run}' --format torchscript --overwrite." in capsys.readouterr().err
    member = run / "members" / "seed_0.safetensors"
    with pytest.raises(UserError) as raised:
        cli._eval_population(argparse.Namespace(video="my video.mp4"), run, [member], {})
    assert str(raised.value).endswith(f"e.g. rlspeed eval '{member}' --video 'my video.mp4'.")


def test_a_resumed_runs_note_names_each_export_of_a_model_of_other_steps(tmp_path, capsys):
    """--resume replaces the model, not the exports beside it (deployed, one is the older policy, unsaid): the note
    names each export `rlspeed export` made of a model of other steps, with the command that redoes it, and no other
    file (the resumed run's own note: test_resume_without_seed_keeps_the_runs_own_seed)."""
    for name, steps in (("model.pt", 256), ("model.onnx", 512), ("model.pt2", None)):
        (tmp_path / name).write_text("")
        (tmp_path / f"{name}.json").write_text(json.dumps({"format": "?", "algo": "PPO", "num_timesteps": steps}))
    (tmp_path / "model.pt2").unlink()  # (its metadata left without it: no export there)
    cli._say_stale_exports(print, tmp_path / "model.safetensors", 512)
    assert capsys.readouterr().err.splitlines() == [
        f"rlspeed: note: {tmp_path / 'model.pt'} is an export of the model at 256 steps, not of this "
        f"model.safetensors at 512: redo it with rlspeed export {tmp_path} --format torchscript --overwrite."]
    (tmp_path / "model.pt2").write_text("")  # (an export whose metadata holds no step count: of other steps)
    (tmp_path / "model.onnx.json").write_text("{}")  # (a user's own file, not export's metadata: not named)
    cli._say_stale_exports(print, tmp_path / "model.safetensors", 1_024)
    assert [line.split(" is an export of the model at ")[1].split(":")[0] for line in
            capsys.readouterr().err.splitlines()] == ["256 steps, not of this model.safetensors at 1,024",
                                                       "other steps, not of this model.safetensors at 1,024"]


def test_an_interrupted_run_and_a_populations_members_name_their_exports_of_other_steps(tmp_path, capsys, monkeypatch):
    """The stale-export note came only with a finished run's closing lines: Ctrl-C or SIGTERM saved
    model.safetensors over a model exported beside it, and a population wrote members/seed_<S>.safetensors over
    one `rlspeed export` had exported, without a word. Every model file the CLI writes names its exports of other
    steps."""
    from rlspeed.distributed import single_process

    class Model:
        _resume, _env = None, None

        def __init__(self, steps):
            self.num_timesteps = steps

        def save(self, path):
            Path(path).write_text("")

    def exported(path, steps):
        path.write_text("")
        path.with_name(f"{path.name}.json").write_text(json.dumps({"format": "onnx", "algo": "PPO",
                                                                   "num_timesteps": steps}))

    exported(tmp_path / "model.onnx", 256)
    monkeypatch.setattr(cli, "_summary", lambda run, final, interrupted: {"total_timesteps": 768})
    monkeypatch.setattr(cli, "_write_summary", lambda run_dir, summary: None)
    monkeypatch.setattr(cli, "_draw_learning_curve", lambda run_dir, steps: None)
    run = {"strategy": single_process(), "model": Model(768), "tracker": None}
    assert cli._save_interrupted(run, tmp_path, KeyboardInterrupt(), []) == 130
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"rlspeed: note: {tmp_path / 'model.onnx'} is an export of the model at 256 steps, not of this "
        f"model.safetensors at 768: redo it with rlspeed export {tmp_path} --format onnx --overwrite.")
    run["model"]._resume = {"path": "checkpoint.safetensors"}  # (stopped before training resumed: nothing saved)
    (tmp_path / "model.safetensors").unlink()
    assert cli._save_interrupted(run, tmp_path, KeyboardInterrupt(), []) == 130
    assert "before training resumed; kept checkpoint.safetensors" in capsys.readouterr().err.splitlines()[-1]
    assert not (tmp_path / "model.safetensors").exists()

    class Population:
        seeds, num_timesteps = [3, 4], 512

        def member_model(self, k):
            return Model(0)

    (tmp_path / "members").mkdir()
    exported(tmp_path / "members" / "seed_3.onnx", 512)  # (of these steps: no note)
    exported(tmp_path / "members" / "seed_4.onnx", 256)
    cli._save_member_models(Population(), {"members": [{}, {}]}, tmp_path)
    assert capsys.readouterr().err.splitlines() == [
        f"rlspeed: note: {tmp_path / 'members' / 'seed_4.onnx'} is an export of the model at 256 steps, not of "
        f"this seed_4.safetensors at 512: redo it with rlspeed export {tmp_path / 'members' / 'seed_4.safetensors'} "
        f"--format onnx --overwrite."]


def test_a_run_interrupted_in_its_final_evaluation_names_its_exports_of_other_steps(tmp_path, capsys, monkeypatch):
    """A Ctrl-C during the final evaluation (training done, model.safetensors saved over a model exported beside it)
    ends the run with its "after training finished" line, and the note naming the export of other steps follows, as
    after a finished run."""
    from rlspeed.algos.base import Algorithm

    run = tmp_path / "run"
    run.mkdir()
    (run / "model.onnx").write_text("")
    (run / "model.onnx.json").write_text(json.dumps({"format": "onnx", "algo": "PPO", "num_timesteps": 256}))

    def interrupted(model, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(Algorithm, "evaluate", interrupted)
    assert cli.main(["train", "ppo", "CartPole-v1", "--total-timesteps", "32", "--num-envs", "2", "--set",
                     "num_steps=16", "--set", "batch_size=32", "--target-return", "none", "--no-progress", "--device",
                     "cpu", "--out", str(run)]) == 130
    lines = capsys.readouterr().err.splitlines()
    assert lines[-2].startswith("rlspeed: interrupted (Ctrl-C) after training finished: model.safetensors and ")
    assert lines[-1] == (f"rlspeed: note: {run / 'model.onnx'} is an export of the model at 256 steps, not of this "
                         f"model.safetensors at 32: redo it with rlspeed export {run} --format onnx --overwrite.")


@pytest.mark.parametrize("name, where", [("SIGINT", "training's end"), ("SIGTERM", "training's end"),
                                         ("SIGINT", "after a first stop"), ("SIGTERM", "summary")])
def test_a_stop_between_the_training_and_its_save_waits_for_the_save(tmp_path, capsys, monkeypatch, name, where):
    """A Ctrl-C or SIGTERM that came as the training's handling of stops ended (its handlers put back), before the
    final save held the stops, raised out of the command ("interrupted (SIGTERM)", exit 143): a finished training
    was not saved, and a second stop lost an interrupted run's save likewise; one while the summary of a run stopped
    in its final evaluation was written left none. Stops wait from there on: the finished training is saved, its
    summary saying the evaluation was skipped, and an interrupted one is saved as interrupted."""
    import signal

    from rlspeed.algos.base import Algorithm

    stopping, write_summary = cli._stopping, cli._write_summary

    @contextlib.contextmanager
    def stop_as_it_ends(backend):
        with stopping(backend) as signals:
            if where == "after a first stop":  # (a first Ctrl-C, recorded: the run stops after its iteration)
                signals.append(signal.SIGINT)
            yield signals
        if where != "summary":
            signal.raise_signal(getattr(signal, name))  # (to the handler then set)

    def stopped_while_written(run_dir, summary):
        signal.raise_signal(getattr(signal, name))
        write_summary(run_dir, summary)

    def interrupted(model, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_stopping", stop_as_it_ends)
    if where == "summary":
        monkeypatch.setattr(Algorithm, "evaluate", interrupted)
        monkeypatch.setattr(cli, "_write_summary", stopped_while_written)
    run = tmp_path / "run"
    code = cli.main(["train", "ppo", "CartPole-v1", "--total-timesteps", "64", "--num-envs", "2", "--set",
                     "num_steps=16", "--set", "batch_size=32", "--target-return", "none", "--no-progress", "--device",
                     "cpu", "--out", str(run)])
    stderr = capsys.readouterr().err
    summary = json.loads((run / "summary.json").read_text())
    assert PPO.load(run / "model.safetensors").num_timesteps == summary["total_timesteps"]
    if where == "after a first stop":
        assert code == 130 and summary["interrupted"] and summary["total_timesteps"] == 32, stderr
        assert "rlspeed: interrupted (Ctrl-C) after 32 steps: saved model.safetensors, checkpoint" in stderr
        return
    stop = "Ctrl-C" if where == "summary" else name.replace("SIGINT", "Ctrl-C")
    assert code == (130 if stop == "Ctrl-C" else 143), stderr
    assert f"rlspeed: interrupted ({stop}) after training finished: model.safetensors and summary.json are saved" in (
        stderr)
    assert summary["final_eval"] is None and summary["total_timesteps"] == 64


@pytest.mark.parametrize("where", ["finished", "interrupted", "final evaluation"])
def test_a_stop_cuts_the_wandb_finish_short_and_says_the_run_is_saved(tmp_path, capsys, monkeypatch, where):
    """W&B's finish of the run (its upload: without a network as long as W&B waits) is cut short by a Ctrl-C, the
    run's own files written. After a stop (in training or in the final evaluation) it was in the block where stops
    wait: a Ctrl-C there did nothing, and the command hung as long as W&B did; in a finished run the stop ended the
    command as 'rlspeed: interrupted', without the final evaluation's line, as if nothing was saved."""
    import signal

    from rlspeed.algos.base import Algorithm

    class Tracker:  # (W&B's finish, into which a Ctrl-C comes)
        finished: list[int] = []

        def finish(self, summary=None, exit_code=0):
            if summary is not None:  # (not the command's closing call, which does nothing after the run's)
                signal.raise_signal(signal.SIGINT)
                self.finished.append(exit_code)

    stopping = cli._stopping

    @contextlib.contextmanager
    def first_stop_recorded(backend):
        with stopping(backend) as signals:
            signals.append(signal.SIGTERM)  # (a first stop: the run stops after its iteration)
            yield signals

    def interrupted(model, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_run_callbacks", lambda args, config, run_dir: ([], Tracker()))
    if where == "interrupted":
        monkeypatch.setattr(cli, "_stopping", first_stop_recorded)
    if where == "final evaluation":
        monkeypatch.setattr(Algorithm, "evaluate", interrupted)
    run = tmp_path / "run"
    code = cli.main(["train", "ppo", "CartPole-v1", "--total-timesteps", "64", "--num-envs", "2", "--set",
                     "num_steps=16", "--set", "batch_size=32", "--target-return", "none", "--no-progress", "--device",
                     "cpu", "--eval-episodes", "2", "--out", str(run)])
    out, err = capsys.readouterr()
    assert Tracker.finished == [], err  # (cut short by the Ctrl-C)
    assert f"rlspeed: interrupted (Ctrl-C) as Weights & Biases finished its run, which W&B may hold without its end; " \
           f"the run's files in {run} are saved." in err
    summary = json.loads((run / "summary.json").read_text())
    assert PPO.load(run / "model.safetensors").num_timesteps == summary["total_timesteps"]
    if where == "interrupted":
        assert code == 143 and summary["interrupted"], err
        assert "rlspeed: interrupted (SIGTERM) after 32 steps: saved model.safetensors, checkpoint" in err
        assert not (run / "learning_curve.png").exists()  # (a stop that cut W&B short stops the rest)
    else:
        assert code == 130, err
    if where == "finished":  # (the run's result is said)
        assert summary["final_eval"] is not None and "rlspeed: final evaluation (deterministic" in out + err


@pytest.mark.parametrize("track, where", [(False, "summary"), (True, "closing lines"), (False, "command's end")])
def test_a_stop_as_a_finished_run_ends_ends_the_command_with_its_code_and_one_line(tmp_path, capsys, monkeypatch,
                                                                                     track, where):
    """A Ctrl-C once the final evaluation had run (while summary.json was written, or as the closing lines were
    printed) was dropped without a word, exit 0, but with --track ended the command with 130 (it cut W&B's finish
    short): the exit code of one stop depended on --track. A stop after training began ends the command with its code
    (130 for Ctrl-C) and one line, the run saved whole; one as the command ends after the run's block said only
    'rlspeed: interrupted'."""
    import signal

    from rlspeed.distributed import DistributedStrategy

    class Tracker:  # (W&B's finish: done before the stop)
        finished: list[int] = []

        def finish(self, summary=None, exit_code=0):
            if summary is not None:
                self.finished.append(exit_code)

    write_summary, print_beside_bars, leave = cli._write_summary, cli._print_beside_bars, DistributedStrategy.leave

    def stopped_while_written(run_dir, summary):
        write_summary(run_dir, summary)
        signal.raise_signal(signal.SIGINT)

    def stopped_as_printed(line, *args, **kwargs):
        if line.startswith("rlspeed: final evaluation"):  # (its result's line)
            signal.raise_signal(signal.SIGINT)
        print_beside_bars(line, *args, **kwargs)

    def stopped_as_it_leaves(strategy, code=0):
        signal.raise_signal(signal.SIGINT)
        return leave(strategy, code)

    if track:
        monkeypatch.setattr(cli, "_run_callbacks", lambda args, config, run_dir: ([], Tracker()))
    monkeypatch.setattr(*{"summary": (cli, "_write_summary", stopped_while_written),
                          "closing lines": (cli, "_print_beside_bars", stopped_as_printed),
                          "command's end": (DistributedStrategy, "leave", stopped_as_it_leaves)}[where])
    run = tmp_path / "run"
    code = cli.main(["train", "ppo", "CartPole-v1", "--total-timesteps", "64", "--num-envs", "2", "--set",
                     "num_steps=16", "--set", "batch_size=32", "--target-return", "none", "--no-progress", "--device",
                     "cpu", "--eval-episodes", "2", "--out", str(run)])
    out, err = capsys.readouterr()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_eval"] is not None and not summary["interrupted"], err  # (saved whole)
    assert Tracker.finished == ([0] if track else []), err  # (finished before the stop: with the run's own code)
    assert code == 130, err
    said = [line for line in err.splitlines() if "interrupted" in line]
    if where == "command's end":
        assert said == [f"rlspeed: interrupted (Ctrl-C) while ending the command: the run is saved in '{run}'."]
    else:
        assert said == ["rlspeed: interrupted (Ctrl-C) as the run ended: nothing was cut short; model.safetensors "
                        f"and summary.json, with the final evaluation, are saved in {run}"]


#: a tiny `rlspeed train --seeds` command line of two members, trained in two iterations (its --out to add)
TINY_POPULATION = ["train", "ppo", "CartPole-v1", "--seeds", "0-1", "--total-timesteps", "64", "--num-envs", "2",
                   "--set", "num_steps=16", "--set", "batch_size=32", "--target-return", "none", "--no-progress",
                   "--device", "cpu", "--env-backend", "torch"]


@pytest.mark.parametrize("first", [None, "SIGINT"])
def test_a_stop_between_a_populations_training_and_its_save_waits_for_the_save(tmp_path, capsys, monkeypatch, first):
    """A SIGTERM that came after a population's training's handling of stops ended, before the save held the stops
    (here as the summary is put together), raised out of the command ("rlspeed: interrupted (SIGTERM)", exit 143):
    a finished population's summary.json and member models were not written, and a second stop lost an interrupted
    one's save likewise. Stops wait from there on: the finished population is saved whole (a stop after its final
    evaluation ends the command with its code and one line, as a single run's), and an interrupted one is saved as
    interrupted."""
    import signal

    stopping, provenance = cli._stopping, cli._provenance

    @contextlib.contextmanager
    def first_stop(backend):
        with stopping(backend) as signals:
            if first is not None:  # (a first Ctrl-C, recorded: the population stops after its iteration)
                signals.append(getattr(signal, first))
            yield signals

    def stopped_meanwhile(*args, **kwargs):  # (after the training's stop handling ended, before the save)
        signal.raise_signal(signal.SIGTERM)
        return provenance(*args, **kwargs)

    monkeypatch.setattr(cli, "_stopping", first_stop)
    monkeypatch.setattr(cli, "_provenance", stopped_meanwhile)
    run = tmp_path / "population"
    code = cli.main([*TINY_POPULATION, "--out", str(run)])
    stderr = capsys.readouterr().err
    summary = json.loads((run / "summary.json").read_text())
    assert sorted(summary["member_models"]) == ["0", "1"], stderr
    assert all((run / "members" / f"seed_{seed}.safetensors").is_file() for seed in (0, 1))
    if first is not None:
        assert code == 130 and summary["interrupted"] and summary["total_timesteps"] == 32, stderr
        assert "rlspeed: interrupted (Ctrl-C) after 32 steps per member: summary.json holds" in stderr
        return
    # (its code and one line, as a single run's: the run is saved whole)
    assert code == 143 and not summary["interrupted"] and summary["total_timesteps"] == 64, stderr
    assert summary["aggregate"]["final_eval"] is not None
    assert [line for line in stderr.splitlines() if "interrupted" in line] == [
        "rlspeed: interrupted (SIGTERM) as the run ended: nothing was cut short; summary.json and the member models, "
        f"with the final evaluation, are saved in {run}"]


@pytest.mark.parametrize("seeds", [["--seeds", "0-1"], []])
def test_a_run_stopped_as_its_training_starts_is_left_as_it_was(tmp_path, capsys, monkeypatch, seeds):
    """A SIGTERM that came as a population's training set its stop handlers (or a Ctrl-C before its first step, as
    subprocess envs start) ended in 'rlspeed: error: Cannot write .../summary.json: No such file or directory.', exit
    2: the run, which had not begun, was left clean (its directory removed), and the interrupted run's save then
    wrote into it. It ends as a stop before training does: one line, exit 143, nothing left behind. (A single run's
    said only 'rlspeed: interrupted (SIGTERM)': its stage was cleared before the stops were held.)"""
    import signal

    stopping = cli._stopping

    @contextlib.contextmanager
    def stopped_first(backend):
        signal.raise_signal(signal.SIGTERM)  # (it waits: the stops are held from before the training's handlers)
        with stopping(backend) as signals:
            yield signals

    monkeypatch.setattr(cli, "_stopping", stopped_first)
    run = tmp_path / "population"
    argv = [arg for arg in TINY_POPULATION if arg not in ("--seeds", "0-1")] + seeds
    code = cli.main([*argv, "--out", str(run)])
    stderr = capsys.readouterr().err
    assert code == 143 and not run.exists(), stderr
    assert stderr.splitlines()[-1] == (f"rlspeed: interrupted (SIGTERM) while starting the run, before training began: "
                                       f"nothing was trained, and '{run}' holds what it held before."), stderr


@pytest.mark.skipif(sys.platform == "win32", reason="file locks are fcntl's")
def test_the_run_directory_is_locked_while_it_trains(tmp_path, monkeypatch):
    """Another process is refused the directory while a run trains there (tested from outside elsewhere): here, that
    the command itself holds the lock during training, not only checks it."""
    import fcntl

    learn_and_save, held = cli._learn_and_save, []

    def probing(args, algo_cls, strategy, model, run_dir, *rest, **kwargs):
        with open(run_dir / cli.RUN_LOCK) as probe:  # (another open file: its lock conflicts with the command's)
            try:
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held.append(False)
            except BlockingIOError:
                held.append(True)
        return learn_and_save(args, algo_cls, strategy, model, run_dir, *rest, **kwargs)

    monkeypatch.setattr(cli, "_learn_and_save", probing)
    assert cli.main(["train", "ppo", "CartPole-v1", "--total-timesteps", "256", "--no-progress", "--out",
                     str(tmp_path / "run")]) == 0
    assert held == [True]


#: a tiny `rlspeed train` command line (its --out to add)
TINY_TRAIN = ["train", "ppo", "CartPole-v1", "--total-timesteps", "64", "--set", "num_steps=16", "--set",
              "batch_size=32", "--target-return", "none", "--no-progress"]


@contextlib.contextmanager
def _training_in_another_thread(monkeypatch, argv: list[str]):
    """`cli.main(argv)` in a thread of its own (a sweep's), held in its training (its run directory locked) while the
    block runs; yields the list its exit code lands in once the block ends and the thread finishes."""
    learn_and_save, training, finish = cli._learn_and_save, threading.Event(), threading.Event()

    def held_in_the_sweep_thread(*args, **kwargs):
        if threading.current_thread().name == "sweep":
            training.set()
            finish.wait(120)
        return learn_and_save(*args, **kwargs)

    monkeypatch.setattr(cli, "_learn_and_save", held_in_the_sweep_thread)
    codes: list[int] = []
    sweep = threading.Thread(target=lambda: codes.append(cli.main(argv)), name="sweep")
    sweep.start()
    try:
        while sweep.is_alive() and not training.wait(0.1):
            pass
        assert training.is_set(), codes  # (its command trains, holding its directory)
        yield codes
    finally:
        finish.set()
        sweep.join(120)


@pytest.mark.skipif(sys.platform == "win32", reason="file locks are fcntl's")
def test_commands_in_threads_at_once_each_keep_their_run_directory_locked(tmp_path, monkeypatch):
    """A sweep calling `cli.main([...])` in two threads: the first command to end released the second's run directory
    lock too, while that one still trained there (another process could then train into it); and a second command
    into a directory this process held went ahead. Each command holds its own directory until it ends."""
    from rlspeed.errors import Busy
    from rlspeed.locks import hold_lock

    argv = [*TINY_TRAIN, "--out"]
    with _training_in_another_thread(monkeypatch, [*argv, str(tmp_path / "b")]) as codes:
        assert cli.main([*argv, str(tmp_path / "a")]) == 0  # (ends while the other thread's command trains)
        with pytest.raises(Busy):  # (as another process would be)
            hold_lock(tmp_path / "b" / cli.RUN_LOCK, {}, "busy")
        assert cli.main([*argv, str(tmp_path / "b"), "--overwrite"]) == 75
    assert codes == [0]
    hold_lock(tmp_path / "b" / cli.RUN_LOCK, held := {}, "busy")  # (released at its end)
    held.popitem()[1].close()


@pytest.mark.skipif(sys.platform == "win32", reason="file locks are fcntl's")
def test_a_command_in_another_thread_leaves_an_overwriting_run_alone(tmp_path, monkeypatch, capsys):
    """A sweep calling `cli.main([...])` in two threads: a command that failed in one thread settled the other
    thread's --overwrite too, moving the replaced run back into the directory where that command was still training
    (and one that succeeded deleted it before the new run had saved anything). Each command settles its own."""
    argv = [*TINY_TRAIN, "--out", str(tmp_path / "b")]
    assert cli.main(argv) == 0  # (the run --overwrite replaces)
    with _training_in_another_thread(monkeypatch, [*argv, "--overwrite"]) as codes:
        capsys.readouterr()
        assert cli.main(["train", "ppo", "CartPole-v1", "--set", "nope=1", "--out", str(tmp_path / "a")]) == 2
        assert "--overwrite" not in capsys.readouterr().err
        assert list((tmp_path / "b").glob(".rlspeed-overwritten-*"))  # (still aside while the new run trains)
    assert codes == [0]
    assert not list((tmp_path / "b").glob(".rlspeed-overwritten-*"))  # (deleted at its command's end)


def test_overwrite_keeps_a_new_run_that_saved_a_checkpoint_before_it_failed(tmp_path, monkeypatch, capsys):
    """A new run that wrote its checkpoint and then failed keeps it (--resume continues it); the replaced run is gone
    for good then, not brought back over it."""
    monkeypatch.chdir(tmp_path)
    argv = ["train", "ppo", "CartPole-v1", "--total-timesteps", "256", "--no-progress", "--out", "run"]
    assert cli.main(argv) == 0

    def fail_after_a_checkpoint(args, algo_cls, strategy, model, run_dir, *rest, **kwargs):
        model.save(run_dir / "checkpoint.safetensors")
        raise UserError("the env returned a NaN observation.")

    monkeypatch.setattr(cli, "_learn_and_save", fail_after_a_checkpoint)
    assert cli.main([*argv, "--overwrite", "--seed", "1"]) == 2
    assert (tmp_path / "run" / "checkpoint.safetensors").is_file()
    assert not (tmp_path / "run" / "model.safetensors").exists()  # (the replaced run's model)
    assert not [p for p in (tmp_path / "run").iterdir() if p.name.startswith(".rlspeed-overwritten")]


@pytest.mark.parametrize("new_run_saved", [True, False])
def test_an_overwrite_killed_mid_run_is_settled_by_the_next_command_there(tmp_path, monkeypatch, capsys,
                                                                          new_run_saved):
    """An --overwrite command killed (SIGKILL, the OOM killer) before its end left the run it replaced in a hidden
    `.rlspeed-overwritten-*` folder for ever: the next command in the directory settles it as the killed one would
    have, deleting it where the new run saved a checkpoint, else moving the replaced run back."""
    monkeypatch.chdir(tmp_path)
    argv = ["train", "ppo", "CartPole-v1", "--total-timesteps", "256", "--no-progress", "--target-return", "none"]
    assert cli.main([*argv, "--out", "run"]) == 0
    old_model = (tmp_path / "run" / "model.safetensors").read_bytes()
    # the state the kill left: the old run moved aside, then what the new run wrote until it was killed
    aside = tmp_path / "run" / ".rlspeed-overwritten-k1ll3d"
    aside.mkdir()
    for name in cli.RUN_FILES:
        if (tmp_path / "run" / name).exists():
            os.replace(tmp_path / "run" / name, aside / name)
    os.utime(aside, (time.time() - 60, time.time() - 60))
    assert cli.main([*argv, "--out", "new", "--seed", "1", "--checkpoint-freq", "128"]) == 0
    written = ["config.yaml", "metrics.csv"] + (["checkpoint.safetensors"] if new_run_saved else [])
    written += ["tensorboard"] if (tmp_path / "new" / "tensorboard").exists() else []  # (with tensorboard installed)
    for name in written:
        copy = shutil.copytree if name == "tensorboard" else shutil.copy
        copy(tmp_path / "new" / name, tmp_path / "run" / name)
    capsys.readouterr()
    code = cli.main([*argv, "--out", "run", "--seed", "1", "--resume", "--total-timesteps", "512"])
    out, err = capsys.readouterr()
    assert not aside.exists()
    if new_run_saved:  # (the new run goes on: the replaced one was to be deleted)
        assert code == 0 and "resumed from" in out
        assert (tmp_path / "run" / "model.safetensors").read_bytes() != old_model
    else:  # (the replaced run is back, whole: a finished run without a checkpoint, which --resume refuses)
        assert "keeps the run it held (moved back)" in err
        assert code == 2 and "holds a finished run" in err
        assert (tmp_path / "run" / "model.safetensors").read_bytes() == old_model
        assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["seed"] == 0


def test_a_replaced_run_whose_deletion_was_cut_short_is_never_moved_back_over_the_new_run(tmp_path, monkeypatch):
    """An --overwrite command whose new run finished deletes the run it replaced at its end; a Ctrl-C (or a kill, or a
    file that cannot be deleted) during that deletion left the replaced run's remaining files in its hidden folder,
    which the deletion had just changed: the next command in the directory took the folder for one older than the
    new run's model and moved the old files back over the finished run."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    aside = run_dir / ".rlspeed-overwritten-cut"
    aside.mkdir()
    for name in ("config.yaml", "model.safetensors"):
        (aside / name).write_text(f"old {name}")
    (run_dir / "model.safetensors").write_text("new model")
    an_hour_ago = time.time() - 3600
    os.utime(aside, (an_hour_ago, an_hour_ago))  # (filled when the command started, before its run saved)
    real_rmtree = shutil.rmtree

    def cut_short(path, *args, **kwargs):  # (the first file deleted, then Ctrl-C)
        first = sorted(Path(path).iterdir())[0]
        first.unlink()
        raise KeyboardInterrupt

    monkeypatch.setitem(cli._overwritten(), run_dir, aside)
    monkeypatch.setattr(cli.shutil, "rmtree", cut_short)
    with pytest.raises(KeyboardInterrupt):
        cli._settle_overwrites(succeeded=True)
    monkeypatch.setattr(cli.shutil, "rmtree", real_rmtree)
    cli._settle_killed_overwrites(run_dir)  # (the next command to lock the directory)
    assert (run_dir / "model.safetensors").read_text() == "new model"
    assert sorted(path.name for path in run_dir.iterdir()) == ["model.safetensors"]


def test_a_population_killed_after_saving_its_member_models_keeps_them(tmp_path):
    """A population run by --overwrite without a checkpoint (--checkpoint-freq above its budget) saves its member
    models and summary.json only: killed after writing them, before its end, the next command took it for a run that
    saved nothing and moved the replaced run back over its member models."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    aside = run_dir / ".rlspeed-overwritten-pop"
    (aside / "members").mkdir(parents=True)
    for name in ("summary.json", "members/seed_0.safetensors"):
        (aside / name).write_text(f"old {name}")
    an_hour_ago = time.time() - 3600
    os.utime(aside, (an_hour_ago, an_hour_ago))
    (run_dir / "members").mkdir()
    for name in ("summary.json", "members/seed_0.safetensors"):
        (run_dir / name).write_text(f"new {name}")
    cli._settle_killed_overwrites(run_dir)
    assert not aside.exists()
    assert (run_dir / "members" / "seed_0.safetensors").read_text() == "new members/seed_0.safetensors"
    assert (run_dir / "summary.json").read_text() == "new summary.json"


def test_a_population_failing_after_saving_its_member_models_keeps_them(tmp_path, monkeypatch):
    """--overwrite of a population that ended before its first checkpoint (its target reached at the first
    evaluation) and failed after saving its member models (summary.json on a full disk): the replaced run was moved
    back, deleting the member models, as if the new run had saved nothing."""
    run_dir = tmp_path / "run"
    aside = run_dir / ".rlspeed-overwritten-pop"
    (aside / "members").mkdir(parents=True)
    (aside / "members" / "seed_0.safetensors").write_text("old")
    (run_dir / "members").mkdir()
    (run_dir / "members" / "seed_0.safetensors").write_text("new")
    monkeypatch.setitem(cli._overwritten(), run_dir, aside)
    cli._settle_overwrites(succeeded=False)
    assert not aside.exists() and (run_dir / "members" / "seed_0.safetensors").read_text() == "new"


def test_replaced_runs_left_by_several_killed_overwrites_are_said(tmp_path, capsys):
    """Several `.rlspeed-overwritten-*` folders (killed --overwrite commands, an older rlspeed's among them) whose new
    run saved nothing: which one the directory held is unknown, so they stay, and were left without a word."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    asides = [run_dir / f".rlspeed-overwritten-{n}" for n in (1, 2)]
    for aside in asides:
        aside.mkdir()
        (aside / "model.safetensors").write_text(aside.name)
    cli._settle_killed_overwrites(run_dir)
    err = capsys.readouterr().err
    assert all(aside.is_dir() for aside in asides) and not (run_dir / "model.safetensors").exists()
    for aside in asides:
        assert f"'{aside}' holds a run that a killed --overwrite command replaced" in err


@pytest.mark.plots
def test_overwrite_keeps_the_run_when_the_new_one_fails_before_saving_anything(tmp_path, monkeypatch, capsys):
    """--overwrite deleted the run first; a failure found after that (W&B refusing the run, an env failing to start)
    left the directory with neither run."""
    monkeypatch.chdir(tmp_path)
    argv = ["train", "ppo", "CartPole-v1", "--total-timesteps", "256", "--no-progress", "--out", "run"]
    assert cli.main(argv) == 0
    before = (tmp_path / "run" / "model.safetensors").read_bytes()

    def refuse(*args, **kwargs):
        raise UserError("a check after the run directory was prepared failed.")

    with monkeypatch.context() as patch:
        patch.setattr(cli, "_write_config", refuse)
        assert cli.main([*argv, "--overwrite", "--seed", "1"]) == 2
    assert "keeps the run it held" in capsys.readouterr().err
    assert (tmp_path / "run" / "model.safetensors").read_bytes() == before

    def fail_after_logging(args, algo_cls, strategy, model, run_dir, *rest):  # (a NaN from the env, mid-run)
        (run_dir / "metrics.csv").write_text("timesteps\n128\n")
        raise UserError("the env returned a NaN observation.")

    with monkeypatch.context() as patch:
        patch.setattr(cli, "_learn_and_save", fail_after_logging)
        assert cli.main([*argv, "--overwrite", "--seed", "1"]) == 2
    err = capsys.readouterr().err  # (not also "keeps what the run wrote": the old run, not the new one, is kept)
    assert "keeps the run it held" in err and "keeps what the run wrote" not in err
    assert (tmp_path / "run" / "model.safetensors").read_bytes() == before
    tensorboard = ["tensorboard"] if importlib.util.find_spec("tensorboard") is not None else []
    assert sorted(p.name for p in (tmp_path / "run").iterdir() if not p.name.startswith(".")) == [
        "config.yaml", "learning_curve.png", "metrics.csv", "model.safetensors", "summary.json", *tensorboard]
    assert cli.main([*argv, "--overwrite", "--seed", "1"]) == 0  # (a run that trains replaces it, nothing left aside)
    assert (tmp_path / "run" / "model.safetensors").read_bytes() != before
    assert not [p for p in (tmp_path / "run").iterdir() if p.name.startswith(".rlspeed-overwritten")]


@pytest.mark.parametrize("flag", [["--max-restarts", "2"], ["--wandb-project", "p"], ["--wandb-entity", "e"]])
def test_flags_that_need_another_flag_are_refused_not_ignored(tmp_path, monkeypatch, capsys, flag):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "ppo", "CartPole-v1", "--total-timesteps", "256", "--no-progress", *flag]) == 2
    assert f"{flag[0]} applies only with" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("argv, flag", [
    (["train", "ppo", "CartPole-v1", "--track"], "--device"), (["train", "ppo", "CartPole-v1"], "--preset"),
    (["train", "ppo", "CartPole-v1", "--track"], "--wandb-project"),
    (["train", "ppo", "CartPole-v1", "--track"], "--wandb-entity"), (["profile", "ppo", "CartPole-v1"], "--trace"),
    (["tune", "ppo", "CartPole-v1"], "--storage"), (["tune", "ppo", "CartPole-v1"], "--study-name"),
    (["tune", "ppo", "CartPole-v1"], "--search-space"), (["tune", "ppo", "CartPole-v1"], "--out"),
    (["eval", "run"], "--env"), (["eval", "run"], "--device"), (["eval", "run"], "--video"),
    (["export", "run"], "--out"),
])
@pytest.mark.parametrize("empty", ["", " "])
def test_an_empty_option_value_is_refused_not_read_as_the_option_left_out(argv, flag, empty, tmp_path, monkeypatch,
                                                                           capsys):
    """`--env "$ENV"` with ENV unset: eval evaluated on the model's own env, tune wrote its default --out and study,
    --storage '' kept the study in memory, --device '' was auto, --trace '' wrote no trace (all exit 0), and
    --video '' was "'' exists", --preset '' "'.' is a directory": each is the flag's one sentence now."""
    monkeypatch.chdir(tmp_path)
    for command in ("cmd_train", "cmd_tune", "cmd_eval", "cmd_profile", "cmd_export"):  # (a parser's refusal: no run)
        monkeypatch.setattr(cli, command, lambda args: 0)
    error = cli_error(capsys, [*argv, flag, empty])
    assert f"{flag} is empty (an unset variable?): give " in error and "leave the option out" in error
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("argv, flag, meant", [
    (["tune", "ppo", "CartPole-v1", "--env", "CartPole-v1"], "--env", "the env is ENV_ID"),
    (["train", "ppo", "CartPole-v1", "--env=Pendulum-v1"], "--env", "the env is ENV_ID"),
    (["profile", "ppo", "CartPole-v1", "--env", "Pendulum-v1"], "--env", "the env is ENV_ID"),
    (["train", "ppo", "CartPole-v1", "--video", "ppo.mp4"], "--video", "train films with --video-every N"),
])
def test_another_commands_option_is_named_as_such_not_as_the_option_it_abbreviates(argv, flag, meant, monkeypatch,
                                                                                    capsys):
    """eval's --env given to tune was "--env-kwargs expects key=value, got 'CartPole-v1'" (argparse read it as an
    abbreviation of --env-kwargs), and --video given to train "--video-every must be a whole number": an error about
    an option the command line does not hold."""
    for command in ("cmd_train", "cmd_tune", "cmd_profile"):  # (a parser's refusal: nothing runs)
        monkeypatch.setattr(cli, command, lambda args: 0)
    error = cli_error(capsys, argv)
    assert f"{flag} is an option of rlspeed eval, not of rlspeed {argv[0]}; {meant}" in error
    assert "--env-kwargs expects" not in error and "--video-every must" not in error
    # (an abbreviation of the command's own option is still taken as that option)
    assert cli.main(["train", "ppo", "CartPole-v1", "--env-back", "torch", "--video-ev", "0"]) == 0


def test_eval_without_a_seed_prints_the_one_it_drew_which_repeats_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "ppo", "CartPole-v1", "--total-timesteps", "256", "--no-progress", "--out", "run"]) == 0
    capsys.readouterr()
    assert cli.main(["eval", "run", "--episodes", "3", "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert cli.main(["eval", "run", "--episodes", "3", "--json", "--seed", str(first["seed"])]) == 0
    assert json.loads(capsys.readouterr().out)["returns"] == first["returns"]
    assert cli.main(["eval", "run", "--video", "missing/v.gif"]) == 2  # (before evaluating)
    assert cli.main(["doctor", "--device", "foo"]) == 2


def test_warnings_lose_terminal_colour_codes_and_unknown_ids_say_how_to_register(capsys):
    """Gymnasium colours its warnings: the CLI's warning line shows the text, not escape codes, named as Gymnasium's
    (its "WARN: " read as rlspeed's own); an unknown id with
    a close registered one still says how to register one's own env."""
    import io

    out = io.StringIO()
    cli._show_warning("\x1b[33mWARN: The obs returned by the step() method is not within the observation space.\x1b[0m",
                      UserWarning, "env.py", 1, file=out)
    assert out.getvalue() == ("rlspeed: warning: Gymnasium: The obs returned by the step() method is not within the "
                              "observation space.\n")  # (its env checker's: a newcomer read it as rlspeed's own)
    assert cli.main(["train", "ppo", "CartPole-v9", "--total-timesteps", "64"]) == 2
    err = capsys.readouterr().err
    assert "Did you mean CartPole-v1" in err and "`MODULE:EnvId`" in err


def test_a_warning_while_the_progress_bar_runs_in_a_terminal_is_a_line_of_its_own(monkeypatch):
    """A warning during training (approx_kl far too high, ...) is drawn above the progress bar on a terminal: the bar's
    line is cleared first and drawn again below it, so the warning does not start in the middle of the bar's line."""
    import io

    from rlspeed.logging import ProgressBar

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(cli, "_SHOWN_WARNINGS", set())
    bar = ProgressBar(4096, desc="ppo CartPole-v1")
    assert not bar.lines  # (a terminal: the bar is drawn)
    bar.update(1024, sps=5000, ret=20.5)
    cli._show_warning("PPO: approx_kl averaged 2.12", UserWarning, "ppo.py", 1)
    bar.update(1024, sps=5000, ret=30.5)
    bar.close()
    before, _, after = terminal.getvalue().partition("rlspeed: warning: PPO: approx_kl averaged 2.12\n")
    assert before.rstrip(" ").endswith("\r") and "ppo CartPole-v1" in before  # (the bar's line cleared)
    assert "2.05k/4.10k" in after  # (the bar goes on below the warning)


def test_printed_returns_keep_three_significant_digits_below_ten():
    """Rewards of order 1 (a 0.92 success rate) are not all printed as 0.9; large returns keep one decimal."""
    assert [cli._score(v) for v in (0.92, -0.125, 0.0, 500.0, -1634.61, float("nan"))] == \
        ["0.92", "-0.125", "0", "500.0", "-1634.6", "nan"]


def test_huge_returns_print_a_float32s_digits_not_its_noise():
    """A return of 1e20 rewards summed in float32 reads 4.8e+21, not 4800000096196211245056.0; ordinary ones keep their
    format (999999.9 below 1e6)."""
    huge = 4800000096196211245056.0  # (float32(4.8e21))
    assert [cli._score(v) for v in (huge, -1e20, 1234567.8, 999999.9, float("inf"))] == \
        ["4.8e+21", "-1e+20", "1.23457e+06", "999999.9", "inf"]


def test_the_command_answers_help_without_torch_and_ctrl_c_while_torch_loads_is_interrupted(tmp_path):
    """`rlspeed --help` (and the import of the command) does not load torch, so it answers at once; Ctrl-C while torch
    loads (the first second or two of every run) ends as any Ctrl-C does: "rlspeed: interrupted (Ctrl-C) while
    loading torch, ...", exit code 130, no traceback (the command's module imported torch before its Ctrl-C handling
    began)."""
    script = (
        "import sys\n"
        "from rlspeed.cli import main\n"
        "assert 'torch' not in sys.modules, 'importing the command loaded torch'\n"
        "class Interrupt:\n"  # Ctrl-C the moment torch starts to load
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch':\n"
        "            raise KeyboardInterrupt\n"
        "sys.meta_path.insert(0, Interrupt())\n"
        "raise SystemExit(main(['train', 'ppo', 'CartPole-v1', '--total-timesteps', '256', '--out', 'run']))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "rlspeed: interrupted (Ctrl-C) while loading torch, the env's packages and the preset, before training began: "
        "nothing was trained or written.") and "Traceback" not in done.stderr
    helped = subprocess.run([sys.executable, "-c", "import sys\nfrom rlspeed.cli import main\n"
                             "assert main(['--help']) == 0\n"
                             "print('torch loaded:', 'torch' in sys.modules)"],
                            capture_output=True, text=True, timeout=TIMEOUT_S)
    assert "usage: rlspeed" in helped.stdout and helped.stdout.splitlines()[-1] == "torch loaded: False"


def test_every_option_of_every_command_says_what_it_does():
    """`rlspeed COMMAND --help` describes each argument (an option without help text shows only its name)."""
    import argparse

    commands = next(action for action in cli.build_parser()._actions
                    if isinstance(action, argparse._SubParsersAction)).choices
    silent = {f"{name} {action.option_strings[0] if action.option_strings else action.dest}"
              for name, parser in commands.items() for action in parser._actions if not action.help}
    assert not silent, f"options without help text: {sorted(silent)}"


def test_the_flags_named_for_model_arguments_are_train_options():
    """A model argument given where a hyperparameter goes is refused with the flag that takes it, from two tables (the
    Python API's MODEL_ARGUMENTS, the CLI's --set check): both name the same flag, and rlspeed train has it."""
    import argparse

    from rlspeed.algos.base import MODEL_ARGUMENTS

    train = next(action for action in cli.build_parser()._actions
                 if isinstance(action, argparse._SubParsersAction)).choices["train"]
    options = {option for action in train._actions for option in action.option_strings}
    for key, usage in MODEL_ARGUMENTS.items():
        assert usage.split()[0] == cli._FLAG_KEYS[key].split()[0] and usage.split()[0] in options, key
    assert {flag.split()[0] for flag in cli._FLAG_KEYS.values() if flag.startswith("--")} <= options


def test_every_default_evaluation_length_is_the_clis():
    """The episodes of an evaluation where the user names none are the same in the CLI (`--eval-episodes`, `rlspeed
    eval --episodes`) and in each Python entry point that evaluates (model and population `evaluate`, `learn`'s and
    `train_until`'s evaluations, `rlspeed.evaluate`, tune): a run's score is comparable whichever way it was made.
    The Python signatures keep the literal a reader sees in `help()`; this checks they agree with cli.EVAL_EPISODES."""
    import dataclasses
    import inspect

    from rlspeed import evaluation, tune
    from rlspeed.algos.base import Algorithm
    from rlspeed.population.base import PopulationBase
    from rlspeed.population.offpolicy import OffPolicyPopulation
    from rlspeed.population.ppo import PPOPopulation

    defaults = {
        "rlspeed.evaluate episodes": inspect.signature(evaluation.evaluate).parameters["episodes"].default,
        "Algorithm.evaluate episodes": inspect.signature(Algorithm.evaluate).parameters["episodes"].default,
        "Algorithm.learn eval_episodes": inspect.signature(Algorithm.learn).parameters["eval_episodes"].default,
        "tune's _Setup eval_episodes": next(field.default for field in dataclasses.fields(tune._Setup)
                                            if field.name == "eval_episodes"),
    }
    for cls in (PopulationBase, PPOPopulation, OffPolicyPopulation):
        defaults[f"{cls.__name__}.evaluate episodes"] = inspect.signature(cls.evaluate).parameters["episodes"].default
    for name, function in [*inspect.getmembers(PopulationBase, inspect.isfunction),
                           *inspect.getmembers(tune, inspect.isfunction)]:
        parameter = inspect.signature(function).parameters.get("eval_episodes")
        if parameter is not None and parameter.default is not inspect.Parameter.empty:
            defaults[f"{name} eval_episodes"] = parameter.default
    assert len(defaults) >= 9, defaults  # (the entry points are still found where this test looks)
    assert {name: value for name, value in defaults.items() if value != cli.EVAL_EPISODES} == {}

def test_every_commands_help_fits_80_columns_and_states_its_defaults(monkeypatch):
    """`rlspeed COMMAND --help` in an 80-column terminal has no line wider than it (train's usage line listed the env
    backends, 83 columns), and an option with a default value says it (--device auto, --nan-policy raise, tune's
    --trials 64 were not stated as defaults)."""
    import argparse

    monkeypatch.setenv("COLUMNS", "80")
    parser = cli.build_parser()
    commands = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction)).choices
    wide = [f"{name}: {line}" for name, command in [("rlspeed", parser), *commands.items()]
            for line in command.format_help().splitlines() if len(line) > 80]
    assert not wide, f"help lines wider than 80 columns: {wide}"
    unstated = [f"{name} {action.option_strings[0]}" for name, command in commands.items()
                for action in command._actions if action.option_strings and action.nargs != 0
                and action.default not in (None, [], argparse.SUPPRESS)
                and not ("default" in action.help and str(action.default) in action.help)]
    assert not unstated, f"options whose help does not state their default: {unstated}"


def test_the_examples_of_rlspeed_help_are_command_lines_it_takes(capsys):
    """`rlspeed --help` closes with example commands: each parses (the run directory's TIME stands for a run's own)."""
    assert cli.main(["--help"]) == 0
    shown = capsys.readouterr().out.split("examples:\n", 1)[1].splitlines()
    examples = [line.split("   ")[0].split()[1:] for line in shown if "COMMAND" not in line]
    assert len(examples) >= 4 and {argv[0] for argv in examples} >= {"train", "eval", "export"}
    for argv in examples:
        cli.build_parser().parse_args(argv)


@pytest.mark.parametrize("command", [["train", "ppo", "MyEnv-v0"], ["profile", "ppo", "MyEnv-v0"], ["eval", "run"]])
def test_gym_packages_given_twice_imports_both(command):
    """`--gym-packages a --gym-packages b c` imports a, b and c, as `--set` and `--env-kwargs` add up (it kept b and c
    alone, and the env a registers was then an unknown id); a flag of one value given twice keeps the last one."""
    parser = cli.build_parser()
    args = parser.parse_args([*command, "--gym-packages", "a", "--gym-packages", "b", "c",
                              "--seed", "1", "--seed", "2"])
    assert args.gym_packages == ["a", "b", "c"] and args.seed == 2
    assert parser.parse_args(command).gym_packages == []  # (the default list is not the one the first parse filled)


def test_replay_buffer_files_are_part_of_the_run(tmp_path, monkeypatch, capsys):
    """--save-replay-buffer writes the replay beside the checkpoint and the model; a replay file given to eval is
    named as such; --overwrite removes the replays with the rest of the run; an on-policy run refuses the flag."""
    monkeypatch.chdir(tmp_path)
    argv = ["train", "dqn", "CartPole-v1", "--total-timesteps", "400", "--no-progress", "--out", "run",
            "--set", "learning_starts=100", "--checkpoint-freq", "200", "--target-return", "none"]
    assert cli.main([*argv, "--save-replay-buffer"]) == 0
    replays = [tmp_path / "run" / name for name in ("model.replay.safetensors", "checkpoint.replay.safetensors")]
    assert all(path.exists() for path in replays)
    capsys.readouterr()
    assert cli.main(["eval", "run/model.replay.safetensors"]) == 2
    assert "is a replay buffer" in capsys.readouterr().err
    assert cli.main([*argv, "--overwrite"]) == 0
    assert not any(path.exists() for path in replays)
    assert cli.main(["train", "ppo", "CartPole-v1", "--save-replay-buffer", "--out", "ppo"]) == 2
    assert "--save-replay-buffer applies to off-policy algorithms" in capsys.readouterr().err
    assert not (tmp_path / "ppo").exists()


def test_doctor_explains_an_accelerator_torch_cannot_name_here(capsys, monkeypatch):
    """`rlspeed doctor --device npu` without torch_npu (or xpu/mps where torch lacks them) is the doctor's to
    explain, with a FAIL line and exit code 1, not refused as a typo; a name no torch knows still is (exit 2)."""
    import rlspeed.diagnostics.doctor as doctor

    for check in ("check_matmul", "check_compile", "check_env_families", "check_packages"):  # (the device line only)
        monkeypatch.setattr(doctor, check, lambda *a: [])
    if not hasattr(torch, "npu"):  # (this machine: no torch_npu)
        assert cli.main(["doctor", "--device", "npu:0"]) == 1
        assert "FAIL  device" in capsys.readouterr().out
    assert cli.main(["doctor", "--device", "gpu0"]) == 2


def test_flags_that_conflict_or_act_only_with_another_are_refused(tmp_path, monkeypatch, capsys):
    """An option that would be ignored or silently overridden is one sentence, exit code 2, before anything runs;
    a misplaced option points to its command's help, a short name to the hyperparameter."""
    monkeypatch.chdir(tmp_path)
    for argv, says in ((["train", "ppo", "CartPole-v1", "--num-envs", "8", "--set", "num_envs=4"], "disagree"),
                       (["eval", "run", "--video-episodes", "3"], "applies only with --video"),
                       (["train", "ppo", "CartPole-v1", "--set", "lr=0.001"], "Did you mean learning_rate?")):
        assert cli.main(argv) == 2
        assert says in capsys.readouterr().err
    assert cli.main(["train", "ppo", "CartPole-v1", "--lr", "1e-3"]) == 2
    assert "--set learning_rate=1e-3" in capsys.readouterr().err
    assert cli.main(["train", "ppo", "CartPole-v1", "--no-such-flag", "1"]) == 2
    assert "(see 'rlspeed train --help')" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("argv, hint", [
    (["train", "ppo", "CartPole-v1", "--total-timestpes", "256"],
     "--total-timestpes 256: did you mean --total-timesteps?"),
    (["train", "ppo", "CartPole-v1", "--eval_freq=512"], "--eval_freq=512: did you mean --eval-freq?"),
    (["tune", "ppo", "CartPole-v1", "--trails", "8"], "--trails 8: did you mean --trials?"),
    (["eval", "run", "--epsiodes", "3"], "--epsiodes 3: did you mean --episodes?"),
    (["doctor", "--jsn"], "--jsn: did you mean --json?"),
])
def test_a_misspelled_option_names_the_closest_one(argv, hint, capsys):
    """A typo'd option is one sentence naming the command's option it is closest to, as an unknown command or choice
    names the closest one (it was "unrecognized arguments: --total-timestpes 256" alone); a name close to none is not
    guessed at."""
    assert cli_error(capsys, argv).endswith(f"{hint} (see 'rlspeed {argv[0]} --help').")
    assert "did you mean" not in cli_error(capsys, ["eval", "run", "--colour"])
    # (before any command: it was "a command is required", the typo unnamed)
    assert cli_error(capsys, ["--verison"]).endswith("--verison: did you mean --version? (see 'rlspeed --help').")


@pytest.mark.parametrize("argv, hint", [
    (["train", "ppo", "CartPole-v1", "--steps", "3000"], "--steps 3000; rlspeed train's env steps are "
     "--total-timesteps 3000 (rlspeed tune's --budget, rlspeed profile's --steps)."),
    (["tune", "ppo", "CartPole-v1", "--total-timesteps", "512"], "--total-timesteps 512; rlspeed tune's env steps are "
     "--budget 512 (rlspeed train's --total-timesteps, rlspeed profile's --steps)."),
    (["profile", "ppo", "CartPole-v1", "--timesteps=512"], "--timesteps=512; rlspeed profile's env steps are "
     "--steps 512 (rlspeed train's --total-timesteps, rlspeed tune's --budget)."),
])
def test_another_commands_name_of_the_env_steps_names_this_ones(argv, hint, capsys):
    """The commands name their env steps differently (train's --total-timesteps, profile's --steps, tune's --budget):
    `rlspeed train ppo ENV --steps 3000`, a newcomer's first try, was refused naming no option."""
    assert cli_error(capsys, argv) == f"rlspeed: error: unrecognized arguments: {hint}"


def test_an_env_module_in_the_current_directory_is_found(tmp_path, monkeypatch, capsys):
    """`rlspeed train ppo myenvs:Line-v0` finds `myenvs.py` in the current directory, as `python -m` would (the
    console script does not put the directory on sys.path: `-I` runs the module the same way)."""
    (tmp_path / "myenvs.py").write_text(
        "import gymnasium as gym\n"
        "gym.register('RlspeedHereLine-v0', entry_point='gymnasium.envs.classic_control:CartPoleEnv',\n"
        "             max_episode_steps=50)\n")
    done = subprocess.run([sys.executable, "-I", "-m", "rlspeed", "train", "ppo", "myenvs:RlspeedHereLine-v0",
                           "--total-timesteps", "256", "--no-progress", "--out", "run", "--target-return", "none"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "run" / "model.safetensors").is_file()
    monkeypatch.chdir(tmp_path)  # (a module missing there: in this process, its error as the command's)
    assert "(named in 'nosuchmod:Foo-v0')" in cli_error(capsys, ["train", "ppo", "nosuchmod:Foo-v0"])


def test_a_run_that_rolled_back_says_so_in_its_closing_lines(tmp_path, monkeypatch, capsys):
    """A run whose updates went non-finite once and were rolled back ends (exit 0, its steps done) with a note naming
    the rollbacks and the step whose weights the model holds, beside the warnings that scrolled by; a run whose every
    update was rolled back ends with exit 2 (it ended with exit 0 and its starting weights); a population whose
    members all diverged ends with exit 2."""
    from rlspeed.numerics import NumericsGuard

    monkeypatch.chdir(tmp_path)
    argv = ["train", "ppo", "CartPole-v1", "--total-timesteps", "2048", "--no-progress", "--target-return", "none",
            "--checkpoint-freq", "256", "--env-backend", "torch"]  # (a check before every checkpoint)
    reads = []
    after_read = NumericsGuard.after_read

    def third_check_not_finite(self, values, *args):
        reads.append(values[0])
        return after_read(self, [0.0, *values[1:]] if len(reads) == 3 else values, *args)

    monkeypatch.setattr(NumericsGuard, "after_read", third_check_not_finite)
    assert cli.main([*argv, "--out", "run"]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["numerics"]["rollbacks"] == 1 and 0 < summary["numerics"]["rolled_back_timesteps"] <= 256
    assert re.search(r"note: 1 rollback\(s\) .*restored the weights of step \d", capsys.readouterr().err)
    monkeypatch.setattr(NumericsGuard, "after_read", after_read)
    assert cli.main([*argv, "--out", "diverged", "--set", "learning_rate=1e30", "--set", "max_grad_norm=1e30"]) == 2
    assert "Every update of this training was NaN or infinite and rolled back" in capsys.readouterr().err
    # a population whose every member diverged trained nothing usable: exit 2 with one sentence, not 0
    code = cli.main(["train", "ppo", "CartPole-v1", "--seeds", "0-1", "--total-timesteps", "1024", "--out", "pop",
                     "--set", "learning_rate=1e30", "--set", "max_grad_norm=1e30", "--target-return", "none",
                     "--env-backend", "torch"])
    assert code == 2 and json.loads((tmp_path / "pop" / "summary.json").read_text())["diverged"] == 2
    assert "error: every member diverged" in capsys.readouterr().err


def test_env_kwargs_reach_the_env_the_run_evaluates_on_and_rlspeed_eval(tmp_path, monkeypatch, capsys):
    """`--env-kwargs` makes the training env with the options; config.yaml and the checkpoint record them, so the
    final evaluation, `rlspeed eval` and `--resume` use the same env (Pendulum-v1 with g=2.0 scores otherwise than
    with its default g)."""
    import rlspeed

    monkeypatch.chdir(tmp_path)
    argv = ["train", "ppo", "Pendulum-v1", "--env-kwargs", "g=2.0", "--target-return", "none", "--no-progress",
            "--set", "num_envs=2", "--set", "num_steps=16", "--set", "batch_size=32", "--out", "run"]
    assert cli.main([*argv, "--total-timesteps", "64", "--checkpoint-freq", "32"]) == 0
    config = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert config["env_kwargs"] == {"g": 2.0} and config["env_backend"] == "gymnasium"
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    model = rlspeed.PPO.load(tmp_path / "run" / "model.safetensors", device="cpu")
    seed = summary["final_eval"]["seed"]
    again = rlspeed.evaluate(model, rlspeed.make_env("Pendulum-v1", num_envs=10, device="cpu", g=2.0), episodes=10,
                             seed=seed)
    assert summary["final_eval"]["mean"] == pytest.approx(again["mean"])
    capsys.readouterr()
    assert cli.main(["eval", "run", "--seed", str(seed), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["mean"] == pytest.approx(again["mean"])
    assert "on Pendulum-v1 (g=2.0)," in captured.err  # (the recorded options named)
    # --env-kwargs over the recorded options: a variant of the training env (here a shorter episode, g kept)
    assert cli.main(["eval", "run", "--seed", str(seed), "--json", "--episodes", "2", "--env-kwargs",
                     "max_episode_steps=5"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["lengths"] == [5, 5] and "(g=2.0, max_episode_steps=5)" in captured.err
    assert cli.main(["train", "ppo", "Pendulum-v1", "--out", "run", "--resume", "--total-timesteps", "128",
                     "--no-progress"]) == 0
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["env_kwargs"] == {"g": 2.0}
    capsys.readouterr()
    assert cli.main(["train", "ppo", "Pendulum-v1", "--out", "run", "--resume", "--total-timesteps", "192",
                     "--no-progress", "--env-kwargs", "g=3.0"]) == 0  # (another option is named, as --set is)
    assert "env_kwargs {'g': 2.0} -> {'g': 3.0}" in capsys.readouterr().err
    changes = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["changes"]  # (each resume's, kept)
    assert [change["settings"]["total_timesteps"] for change in changes] == [[64, 128], [128, 192]]
    assert changes[-1]["settings"]["env_kwargs"] == [{"g": 2.0}, {"g": 3.0}] and changes[-1]["at_steps"] >= 128
    assert cli.main([*argv[:-2], "--seeds", "0-1", "--total-timesteps", "64", "--set", "use_sde=false", "--out",
                     "population"]) == 0
    config = yaml.safe_load((tmp_path / "population" / "config.yaml").read_text())
    assert config["env_kwargs"] == {"g": 2.0} and config["env_backend"] == "gymnasium"
    member = rlspeed.PPO.load(tmp_path / "population" / "members" / "seed_1.safetensors", device="cpu")
    assert member.spec.env_kwargs == {"g": 2.0}
    assert cli.main([*argv[:-2], "--env-kwargs", "gg=1", "--out", "typo"]) == 2
    assert "rejected the options g, gg" in capsys.readouterr().err
    # a value the env refuses (a ValueError, not a TypeError) is the user's input too: one sentence, exit 2
    assert cli.main(["train", "ppo", "Pendulum-v1", "--env-kwargs", "max_episode_steps=0", "--out", "zero",
                     "--no-progress"]) == 2
    error = capsys.readouterr().err
    assert "rejected the options max_episode_steps" in error and "raised from the environment creator" not in error


def test_a_second_process_training_in_the_same_out_is_refused(tmp_path, monkeypatch, capsys):
    """Two `rlspeed train` in one --out both ran to exit 0, one run's files lost and metrics.csv interleaved: the run
    directory's lock (held while a process trains there) refuses the second in one sentence, whatever its flags."""
    fcntl = pytest.importorskip("fcntl", reason="run directories are locked where fcntl is (not on Windows)")

    monkeypatch.chdir(tmp_path)
    argv = ["train", "ppo", "CartPole-v1", "--total-timesteps", "256", "--target-return", "none", "--no-progress"]
    (tmp_path / "run").mkdir()
    with open(tmp_path / "run" / cli.RUN_LOCK, "w") as held:  # (another process's lock: another open file)
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        for extra in ([], ["--overwrite"], ["--resume"], ["--seeds", "0-1"]):
            assert cli.main([*argv, "--out", "run", *extra]) == 75  # (EX_TEMPFAIL: again later, not a bad input)
            assert "Another rlspeed process is training in 'run'" in capsys.readouterr().err
    assert sorted(path.name for path in (tmp_path / "run").iterdir()) == [cli.RUN_LOCK]
    assert cli.main([*argv, "--out", "run"]) == 0  # (released: the run goes ahead)


def test_resuming_from_a_damaged_checkpoint_names_the_model_that_is_kept(tmp_path, monkeypatch, capsys):
    """A checkpoint damaged from outside (writes are atomic) cannot be resumed: the one sentence also says the run's
    model.safetensors is kept and how to evaluate it or start afresh."""
    monkeypatch.chdir(tmp_path)
    argv = ["train", "ppo", "CartPole-v1", "--total-timesteps", "512", "--target-return", "none", "--out", "my run",
            "--no-progress", "--checkpoint-freq", "256"]
    assert cli.main(argv) == 0
    checkpoint = tmp_path / "my run" / "checkpoint.safetensors"
    checkpoint.write_bytes(checkpoint.read_bytes()[:1000])
    capsys.readouterr()
    assert cli.main([*argv[:4], "1024", *argv[5:], "--resume"]) == 2
    error = capsys.readouterr().err
    assert "checkpoint.safetensors" in error
    assert "model.safetensors is kept (rlspeed eval 'my run' evaluates it)" in error  # (quoted: pasted as one path)
    assert len(error.strip().splitlines()) == 1


def test_resuming_an_encrypted_run_without_its_key_asks_for_the_key_not_an_overwrite(tmp_path, monkeypatch, capsys):
    """A whole encrypted checkpoint read without its key: the sentence asks for the key, and does not advise
    --overwrite (which would discard the run) nor `rlspeed eval` (which needs the key as well)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run").mkdir()
    monkeypatch.setenv("RLSPEED_CHECKPOINT_KEY", "00" * 16)
    model = PPO("CartPole-v1", device="cpu", seed=0, num_envs=4, num_steps=32, batch_size=64)
    for name in ("checkpoint.safetensors", "model.safetensors"):
        model.save(tmp_path / "run" / name)
    argv = ["train", "ppo", "CartPole-v1", "--total-timesteps", "256", "--target-return", "none", "--out", "run",
            "--no-progress", "--resume", "--set", "num_steps=32"]
    for key in (None, "11" * 16):  # (no key, another key)
        if key is None:
            monkeypatch.delenv("RLSPEED_CHECKPOINT_KEY")
        else:
            monkeypatch.setenv("RLSPEED_CHECKPOINT_KEY", key)
        assert cli.main(argv) == 2
        error = capsys.readouterr().err
        assert error.startswith("rlspeed: error: 'run/checkpoint.safetensors' ") and "key" in error
        assert "--overwrite" not in error and "rlspeed eval" not in error and len(error.strip().splitlines()) == 1


def test_a_run_records_its_thread_count_and_a_resume_keeps_it(tmp_path, monkeypatch, capsys):
    """A CPU's results depend on the thread count (the order of its sums): config.yaml records it and --resume
    without --threads takes it, so that the resumed run computes as the uninterrupted one."""
    import torch

    from rlspeed import device

    if device.usable_cores() < 2:  # (not os.cpu_count(): a container's CPU quota or a SLURM job's CPUs cap --threads)
        pytest.skip("needs 2 cores")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RLSPEED_NUM_THREADS", raising=False)
    argv = ["train", "ppo", "CartPole-v1", "--target-return", "none", "--out", "run", "--no-progress",
            "--checkpoint-freq", "32", "--num-envs", "2", "--env-backend", "torch", "--set", "num_steps=16", "--set",
            "batch_size=32", "--eval-episodes", "1"]
    configured = []  # (the count the command trains with; the caller's own is given back when main returns)
    real = device.configure_threads
    monkeypatch.setattr(device, "configure_threads", lambda count=None: configured.append(real(count)) or
                        configured[-1])
    try:
        assert cli.main([*argv, "--total-timesteps", "64", "--threads", "2"]) == 0
        assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["threads"] == 2
        torch.set_num_threads(1)
        assert cli.main([*argv, "--total-timesteps", "128", "--resume"]) == 0
        assert configured[-1] == 2 and torch.get_num_threads() == 1
        assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["threads"] == 2
    finally:
        torch.set_num_threads(1)


@pytest.mark.parametrize("under_torchrun", [False, True])
def test_a_second_signal_stops_at_once_except_in_a_torchrun_worker(under_torchrun, monkeypatch):
    """One process: the first SIGTERM is recorded (stop at the iteration's end), a second stops at once. A torchrun
    worker gets a scheduler's signal and torchrun's own: it keeps to the iteration's end, where its peers stop too."""
    import os
    import signal

    if under_torchrun:
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")
    else:
        monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    with cli._stop_after_iteration() as received:
        os.kill(os.getpid(), signal.SIGTERM)
        assert received == [signal.SIGTERM]
        if under_torchrun:
            os.kill(os.getpid(), signal.SIGTERM)
            assert received == [signal.SIGTERM]
        else:
            with pytest.raises(cli.Terminated):
                os.kill(os.getpid(), signal.SIGTERM)


def test_a_stop_waiting_on_an_iteration_that_does_not_end_says_so_once(monkeypatch, capsys):
    """An env whose step never returned kept the iteration going after the first Ctrl-C or SIGTERM, and the run said
    nothing more than "stopping after this iteration": it looked stuck. Where the iteration has not ended a while
    after the signal, one line now says so and that another signal stops at once; an iteration that ends in time
    says nothing more."""
    import os
    import signal

    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.setattr(cli, "STILL_STOPPING_S", 0.2)
    still = "the iteration has not ended 0.2 s after SIGTERM"
    err, deadline = "", time.monotonic() + 60
    with cli._stop_after_iteration() as received:
        os.kill(os.getpid(), signal.SIGTERM)
        assert received == [signal.SIGTERM]
        while still not in err and time.monotonic() < deadline:  # (an env that hangs)
            time.sleep(0.05)
            err += capsys.readouterr().err
        time.sleep(0.3)  # (no second line)
    err += capsys.readouterr().err
    assert err.count("stopping after this iteration") == 1 and err.count(still) == 1, err
    assert "SIGTERM again stops it at once" in err
    # an iteration that ends before the line is due (60 s: however slowly a loaded machine runs the block) cancels it
    monkeypatch.setattr(cli, "STILL_STOPPING_S", 60.0)
    earlier = set(threading.enumerate())
    with cli._stop_after_iteration():
        os.kill(os.getpid(), signal.SIGTERM)
        reminders = [thread for thread in set(threading.enumerate()) - earlier if isinstance(thread, threading.Timer)]
    assert reminders and all(reminder.finished.is_set() for reminder in reminders)  # (cancelled)
    for reminder in reminders:
        reminder.join(60)
    assert "has not ended" not in capsys.readouterr().err


def test_version_flag_prints_the_package_version(capsys):
    import rlspeed

    for flag in ("--version", "-V"):
        assert cli.main([flag]) == 0  # (a caller passing argv gets the exit code, as for any command)
        assert capsys.readouterr().out.strip() == f"rlspeed {rlspeed.__version__}"


@pytest.mark.parametrize("flag, setting", [(["--total-timesteps", "3072"], "total_timesteps=1024"),
                                           (["--eval-freq", "1024"], "eval_freq=256"),
                                           (["--target-return", "300"], "target_return=50")])
def test_a_run_setting_given_as_flag_and_set_is_refused(flag, setting, tmp_path, monkeypatch, capsys):
    """The flag won silently (--set total_timesteps=1024 --total-timesteps 3072 ran 3,072), as --num-envs against
    --set num_envs does not."""
    monkeypatch.chdir(tmp_path)
    code = cli.main(["train", "ppo", "CartPole-v1", "--no-progress", "--set", setting, *flag, "--out", "run"])
    captured = capsys.readouterr()
    assert_one_line_error(code, captured.out, captured.err, f"both set {setting.split('=')[0]}: give one of them")
    assert not (tmp_path / "run").exists()


def test_an_off_policy_run_says_its_replay_buffers_footprint_when_training_starts(capsys, monkeypatch, tmp_path):
    """A memory-constrained user saw the replay buffer's size only in summary.json, after the run."""
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "dqn", "CartPole-v1", "--total-timesteps", "256", "--target-return", "none",
                     "--set", "buffer_size=1000", "--set", "learning_starts=64", "--no-progress", "--out", "run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    footprint = [line for line in lines if line.startswith("rlspeed: replay buffer: 1,000 transitions")]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())["replay"]
    assert len(footprint) == 1 and f"{summary['bytes_per_transition']} bytes per transition" in footprint[0]


def test_resume_keeps_the_runs_checkpoint_interval_and_replay_saving(tmp_path, monkeypatch):
    """`--checkpoint-freq` and `--save-replay-buffer` were not recorded: a `--resume` without them wrote no replay
    file (the first attempt's rows stayed beside later checkpoints, and the next resume started an empty buffer) and
    checkpointed at another interval."""
    from rlspeed.checkpoint import load_checkpoint

    monkeypatch.chdir(tmp_path)
    argv = ["train", "dqn", "CartPole-v1", "--target-return", "none", "--no-progress", "--out", "run", "--set",
            "learning_starts=64", "--set", "batch_size=16"]
    assert cli.main([*argv, "--total-timesteps", "256", "--checkpoint-freq", "128", "--save-replay-buffer"]) == 0
    assert cli.main([*argv, "--total-timesteps", "512", "--resume"]) == 0
    config = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert config["checkpoint_freq"] == 128 and config["save_replay_buffer"] is True
    replay = load_checkpoint(tmp_path / "run" / "model.replay.safetensors")[1]["replay_buffer"]
    assert replay["size"] == 512  # (the first attempt's rows and the resumed run's)
    # --no-save-replay-buffer turns it off from there on (recorded, so that the next resume keeps that)
    (tmp_path / "run" / "model.replay.safetensors").unlink()
    assert cli.main([*argv, "--total-timesteps", "768", "--resume", "--no-save-replay-buffer"]) == 0
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["save_replay_buffer"] is False
    assert not (tmp_path / "run" / "model.replay.safetensors").exists()


def test_temporary_files_a_killed_write_left_are_removed_when_the_run_directory_is_next_used(tmp_path, monkeypatch):
    """config.yaml, summary.json and metrics.csv are written to a temporary file and renamed: a kill in between left
    `.summary.json.XXXX.tmp` in the run directory for ever; the next command that locks the directory removes them."""
    monkeypatch.chdir(tmp_path)
    argv = ["train", "ppo", "CartPole-v1", "--total-timesteps", "128", "--num-envs", "4", "--set", "num_steps=32",
            "--set", "batch_size=64", "--target-return", "none", "--out", "run", "--no-progress"]
    assert cli.main(argv) == 0
    left = [tmp_path / "run" / f".{name}.k1ll3d00.tmp" for name in ("config.yaml", "summary.json", "metrics.csv")]
    for path in left:
        path.write_text("half")
    assert cli.main([*argv, "--overwrite"]) == 0
    assert not any(path.exists() for path in left)


def test_a_value_whose_yaml_comment_would_be_dropped_is_refused():
    """`--env-kwargs mode=实验 #3` trained with mode='实验' (YAML reads ' #...' as a comment), without a word."""
    with pytest.raises(UserError, match="as a comment"):
        cli._parse_set(["mode=实验 #3"], "--env-kwargs")
    assert cli._parse_set(['mode="实验 #3"', "tag=abc#d", 'names=[a, "b #c"]']) == {
        "mode": "实验 #3", "tag": "abc#d", "names": ["a", "b #c"]}


# (signals a function of the CLI's module at its start, then runs it: a signal that comes at that point of the command)
SIGNAL_AT = """
import os, signal, sys
from rlspeed import cli
from rlspeed.device import resolve_device
from rlspeed.algos.base import Algorithm
where, name = sys.argv.pop(1), sys.argv.pop(1)
from rlspeed.population.base import PopulationBase
attribute = where.split(":")[0]
owner = {"save": Algorithm, "learn": Algorithm, "_learn_loop": PopulationBase}.get(attribute, cli)
original = getattr(owner, attribute)
def signalled(*args, **kwargs):
    if not where.endswith(":after"):
        os.kill(os.getpid(), getattr(signal, name))
    result = original(*args, **kwargs)
    if where.endswith(":after"):
        os.kill(os.getpid(), getattr(signal, name))
    return result
setattr(owner, attribute, signalled)
raise SystemExit(cli.main())
"""


def signalled_train(tmp_path, where: str, name: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SIGNAL_AT, where, name, "train", "ppo", "CartPole-v1",
                           "--total-timesteps", "128", "--num-envs", "4", "--target-return", "none", "--no-progress",
                           *argv], cwd=tmp_path, capture_output=True, text=True, timeout=300)


# (one command per signal: the start's cleanup is one handler for all of them, so each signal takes one of the two
# directories, a new one and an --overwrite of a finished run)
@pytest.mark.parametrize("name, code, out", [("SIGTERM", 143, "old"), ("SIGHUP", 143, "run"), ("SIGINT", 130, "old")])
def test_a_signal_while_a_run_starts_leaves_no_half_made_run_behind(tmp_path, name, code, out):
    """SIGTERM or SIGHUP after config.yaml was written and before training began (a tracker starting) killed the
    process silently: the directory kept a lone config.yaml, which the next run there was refused for, and with
    --overwrite the replaced run stayed hidden in '.rlspeed-overwritten-*'. Now the start ends as Ctrl-C does."""
    if out == "old":
        model = PPO("CartPole-v1", device="cpu", seed=0, num_envs=2, num_steps=16, batch_size=32)
        model.learn(32, progress_bar=False).save(tmp_path / "old" / "model.safetensors")
        (tmp_path / "old" / "config.yaml").write_text("algo: ppo\n")
    done = signalled_train(tmp_path, "_run_callbacks", name, "--out", out, *(["--overwrite"] if out == "old" else []))
    assert done.returncode == code and "Traceback" not in done.stderr, done.stderr
    if out == "run":
        assert done.stderr.strip().splitlines()[-1].startswith("rlspeed: interrupted")
        assert not (tmp_path / "run").exists()  # (made by this command, and nothing trained there)
    else:
        assert sorted(path.name for path in (tmp_path / "old").iterdir()) == ["config.yaml", "model.safetensors"]
        assert (tmp_path / "old" / "config.yaml").read_text() == "algo: ppo\n"  # (the replaced run is back)


@pytest.mark.parametrize("command, where, stop", [
    ("train", "_model", "Ctrl-C"), ("train", "_run_callbacks", "SIGTERM"), ("train --resume", "resume", "SIGTERM"),
    ("train --seeds", "Population", "Ctrl-C"), ("tune", "_settings", "SIGTERM"), ("tune", "tune", "Ctrl-C")])
def test_a_stop_before_the_work_begins_says_what_the_command_was_doing_and_what_is_left(tmp_path, monkeypatch, capsys,
                                                                                       command, where, stop):
    """Ctrl-C or SIGTERM before training (or tuning) began printed only "rlspeed: interrupted": not what the command
    was doing (torch loading, the envs being built, a checkpoint loading) nor that nothing was trained. The line now
    says both, and the exit code is the signal's."""
    import rlspeed.population
    import rlspeed.tune

    monkeypatch.chdir(tmp_path)
    if command == "train --resume":  # (a run with a checkpoint to resume)
        assert cli.main(["train", "ppo", "CartPole-v1", "--total-timesteps", "64", "--num-envs", "2", "--set",
                         "num_steps=16", "--set", "batch_size=32", "--checkpoint-freq", "32", "--target-return",
                         "none", "--no-progress", "--out", "run"]) == 0
        (tmp_path / "run" / "summary.json").unlink()  # (as a killed run leaves it)
    owner = {"resume": PPO, "Population": rlspeed.population, "tune": rlspeed.tune}.get(where, cli)

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt if stop == "Ctrl-C" else cli.Terminated(stop)

    monkeypatch.setattr(owner, where, stopped)
    argv = {"train": ["train", "ppo", "CartPole-v1", "--out", "run", "--total-timesteps", "64"],
            "train --resume": ["train", "ppo", "CartPole-v1", "--out", "run", "--resume", "--total-timesteps", "128"],
            "train --seeds": ["train", "ppo", "CartPole-v1", "--out", "run", "--seeds", "0-1"],
            "tune": ["tune", "ppo", "CartPole-v1", "--storage", str(tmp_path / "study.db"), "--trials", "2"]}[command]
    capsys.readouterr()
    assert cli.main(argv) == (130 if stop == "Ctrl-C" else 143)
    line = capsys.readouterr().err.strip().splitlines()[-1]
    doing = {"_model": "building the envs and the model", "_run_callbacks": "starting the run",
             "resume": "loading the checkpoint", "Population": "building the population's envs and models",
             "_settings": "loading torch, the env's packages and the preset", "tune": "tuning"}[where]
    left = {"train": "before training began: nothing was trained or written",
            "train --seeds": "before training began: nothing was trained or written",
            "train --resume": "before training began: nothing was trained, and 'run' holds what it held before",
            "tune": ("the study had not begun, nothing was tuned or written" if where == "_settings" else
                     "the study keeps the trials that finished (the same command goes on)")}[command]
    if where == "_run_callbacks":
        left = "before training began: nothing was trained, and 'run' holds what it held before"
    assert line == f"rlspeed: interrupted ({stop}) while {doing}{':' if command == 'tune' else ','} {left}."
    assert (tmp_path / "run").exists() == (command == "train --resume")


def test_sigterm_while_tune_loads_ends_as_ctrl_c_does(tmp_path):
    """SIGTERM to `rlspeed tune` while torch and the preset loaded (its first seconds) killed it without a word (its
    SIGTERM handling began with the study); it ends as Ctrl-C does, with 143 and a line saying where it was."""
    done = subprocess.run([sys.executable, "-c", SIGNAL_AT, "_settings", "SIGTERM", "tune", "ppo", "CartPole-v1",
                           "--storage", str(tmp_path / "study.db")], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 143, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "rlspeed: interrupted (SIGTERM) while loading torch, the env's packages and the preset: the study had not "
        "begun, nothing was tuned or written.")


def test_a_signal_while_the_finished_training_is_saved_waits_for_the_save(tmp_path):
    """SIGTERM while a finished run wrote its model (before its final evaluation) killed it: no model, no summary,
    the training lost. The save finishes, then the signal skips the evaluation as it does during it."""
    done = signalled_train(tmp_path, "save", "SIGTERM", "--out", "run")
    assert done.returncode == 143 and "interrupted (SIGTERM) after training finished" in done.stderr, done.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["total_timesteps"] >= 128 and summary["final_eval"] is None
    assert PPO.load(tmp_path / "run" / "model.safetensors").num_timesteps == summary["total_timesteps"]


# (the stop after the last iteration is one handler for both signals: each takes one of a run and a population)
@pytest.mark.parametrize("name, code, out", [("SIGINT", 130, "run"), ("SIGTERM", 143, "population")])
def test_a_signal_as_the_last_iteration_ends_skips_the_final_evaluation(tmp_path, name, code, out):
    """A Ctrl-C or SIGTERM that came after the last iteration, before the model was saved, was said ('stopping after
    this iteration') and then ignored: the final evaluation ran and the run exited 0. The finished training is
    saved, the evaluation skipped, and the exit code is the signal's."""
    if out == "run":
        done = signalled_train(tmp_path, "learn:after", name, "--out", "run")
        assert done.returncode == code and "after training finished" in done.stderr, done.stderr
        summary = json.loads((tmp_path / "run" / "summary.json").read_text())
        assert summary["total_timesteps"] >= 128 and summary["final_eval"] is None
        # (the line closing the training is said, as after an uninterrupted run)
        assert f"rlspeed: {summary['total_timesteps']:,} steps in " in done.stdout, done.stdout
        assert PPO.load(tmp_path / "run" / "model.safetensors").num_timesteps == summary["total_timesteps"]
        return
    # a population likewise (it said nothing at all, and evaluated every member)
    # (seeds that are no member indices: the line took seed k's index from the seed)
    done = signalled_train(tmp_path, "_learn_loop:after", name, "--out", "population", "--seeds", "3-4")
    assert done.returncode == code and "without the final evaluation" in done.stderr, done.stderr
    summary = json.loads((tmp_path / "population" / "summary.json").read_text())
    assert summary["total_timesteps"] >= 128 and summary["aggregate"]["final_eval"] is None
    assert all(member["final_eval"] is None for member in summary["members"])
    # (the line names the command that runs a member's skipped final evaluation, seeded as the finished run seeds it)
    from rlspeed.evaluation import evaluation_seed

    steps = summary["total_timesteps"]
    assert (f"rlspeed eval population/members/seed_3.safetensors --seed {evaluation_seed(3, 'final', steps)} runs "
            f"seed 3's, and seed S's takes --seed rlspeed.evaluation.evaluation_seed(S, 'final', {steps})"
            ) in done.stderr, done.stderr
    assert sorted(path.name for path in (tmp_path / "population" / "members").iterdir()) == [
        "seed_3.safetensors", "seed_4.safetensors"]


def test_eval_with_a_bad_device_blames_the_flag_not_the_model_file(tmp_path, capsys):
    """`rlspeed eval RUN --device foo` said "'RUN/model.safetensors': Unknown device 'foo'", as if the file were at
    fault."""
    model = PPO("CartPole-v1", device="cpu", seed=0, num_envs=2, num_steps=16, batch_size=32)
    path = model.save(tmp_path / "run" / "model.safetensors")
    code = cli.main(["eval", str(path.parent), "--device", "foo"])
    captured = capsys.readouterr()
    assert_one_line_error(code, captured.out, captured.err, "Unknown device 'foo'")
    assert "model.safetensors" not in captured.err


def test_an_eval_freq_from_set_or_a_preset_file_evaluates_without_a_target(tmp_path, monkeypatch, capsys):
    """`--set eval_freq=512 --target-return none` (or a preset file with eval_freq, such as a run's config.yaml) ran no
    evaluation, while config.yaml recorded eval_freq 512 and `--eval-freq 512` evaluated: the flag alone counted. A
    shipped preset's eval_freq serves its target, and config.yaml now records that none ran."""
    monkeypatch.chdir(tmp_path)
    base = ["train", "ppo", "CartPole-v1", "--target-return", "none", "--total-timesteps", "1024", "--no-progress"]

    def evaluations(out: str) -> tuple[list[str], object]:
        rows = list(csv.DictReader(open(tmp_path / out / "metrics.csv")))
        steps = [row["timesteps"] for row in rows if row.get("eval_mean")]
        return steps, yaml.safe_load((tmp_path / out / "config.yaml").read_text())["eval_freq"]

    assert cli.main([*base, "--set", "eval_freq=512", "--out", "set"]) == 0
    assert evaluations("set") == (["512", "1024"], 512)
    assert cli.main([*base, "--out", "shipped"]) == 0
    assert evaluations("shipped") == ([], None)
    preset = yaml.safe_load((tmp_path / "set" / "config.yaml").read_text())
    (tmp_path / "preset.yaml").write_text(yaml.safe_dump({**preset, "eval_freq": 256}))
    assert cli.main([*base, "--preset", "preset.yaml", "--out", "file"]) == 0
    assert evaluations("file") == (["256", "512", "768", "1024"], 256)
    # (a resumed run keeps its recorded frequency: it said "eval_freq 512 -> None" and recorded null)
    assert cli.main([*base[:-3], "--total-timesteps", "2048", "--no-progress", "--checkpoint-freq", "512", "--out",
                     "set", "--overwrite", "--set", "eval_freq=512"]) == 0
    capsys.readouterr()
    assert cli.main(["train", "ppo", "CartPole-v1", "--total-timesteps", "3072", "--no-progress", "--out", "set",
                     "--resume"]) == 0
    assert "eval_freq" not in capsys.readouterr().out
    assert evaluations("set") == (["512", "1024", "1536", "2048", "2560", "3072"], 512)
    # a run that evaluated for its target, resumed without one, goes on evaluating at its recorded frequency (it
    # stopped, while config.yaml said eval_freq 512)
    assert cli.main([*base[:3], "--total-timesteps", "1024", "--eval-freq", "512", "--checkpoint-freq", "512",
                     "--no-progress", "--out", "target"]) == 0
    assert cli.main([*base[:5], "--total-timesteps", "2048", "--no-progress", "--out", "target", "--resume"]) == 0
    assert evaluations("target") == (["512", "1024", "1536", "2048"], 512)

@pytest.mark.parametrize("extra", [[], ["--seeds", "0-1"]])
def test_resume_without_out_is_refused_rather_than_starting_afresh_in_a_new_directory(tmp_path, monkeypatch, capsys,
                                                                                      extra):
    """A requeued job's `rlspeed train ... --resume` without --out made a new runs/<algo>-<env>-<seed>-<time> every
    time and trained from scratch there ("no checkpoint yet"), exit code 0: nothing could ever be resumed."""
    monkeypatch.chdir(tmp_path)
    argv = ["train", "ppo", "CartPole-v1", "--total-timesteps", "256", "--target-return", "none", "--no-progress",
            "--resume", *extra]
    assert "--resume continues the run in --out DIR: give --out" in cli_error(capsys, argv)
    assert not (tmp_path / "runs").exists()


def test_resume_in_a_directory_without_a_run_evaluates_as_the_command_without_it(tmp_path, monkeypatch):
    """A requeued job passes --resume always (it starts afresh where there is no checkpoint yet): without a target,
    that first attempt recorded the shipped preset's eval_freq in config.yaml, though it ran no evaluation, and every
    resume of it then evaluated at that frequency, which the run without --resume never does."""
    monkeypatch.chdir(tmp_path)
    argv = ["train", "ppo", "CartPole-v1", "--target-return", "none", "--no-progress", "--out", "run", "--resume",
            "--set", "num_steps=32"]

    def evaluations() -> tuple[list[str], object]:
        rows = list(csv.DictReader(open(tmp_path / "run" / "metrics.csv", encoding="utf-8")))
        return ([row["timesteps"] for row in rows if row.get("eval_mean")],
                yaml.safe_load((tmp_path / "run" / "config.yaml").read_text(encoding="utf-8"))["eval_freq"])

    assert cli.main([*argv, "--total-timesteps", "1024"]) == 0
    assert evaluations() == ([], None)
    assert cli.main([*argv, "--total-timesteps", "4096"]) == 0
    assert evaluations() == ([], None)


def test_eval_repeats_the_final_evaluation_of_a_run_on_several_threads_exactly(tmp_path, monkeypatch, capsys):
    """`rlspeed eval RUN --seed S` evaluated on one thread whatever the run used: for a `--threads 2` run the returns
    differed from summary.json's final_eval in their last digits (a CPU's sums depend on the thread count). It takes
    the run's recorded threads now."""
    from rlspeed import device

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RLSPEED_NUM_THREADS", raising=False)
    # (past learning_starts 200: a trained policy; the sums that differ are the evaluation's, not the training's;
    # 50 updates on two threads, which take the time, and 2 episodes are enough for the sums to differ)
    assert cli.main(["train", "sac", "Pendulum-v1", "--threads", "2", "--total-timesteps", "250", "--target-return",
                     "none", "--eval-episodes", "2", "--no-progress", "--out", "run"]) == 0
    final = json.loads((tmp_path / "run" / "summary.json").read_text())["final_eval"]
    recorded = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["threads"]
    capsys.readouterr()
    configure, counts = device.configure_threads, []

    def counted(threads=None):
        counts.append(configure(threads))
        return counts[-1]

    monkeypatch.setattr(device, "configure_threads", counted)
    assert cli.main(["eval", "run", "--seed", str(final["seed"]), "--episodes", "2", "--json", "--no-progress"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["mean"], result["std"], result["episodes"]) == (final["mean"], final["std"], 2)
    # (a machine whose sums do not depend on the thread count tells the evaluation's threads only by its count)
    assert counts == [recorded] and recorded == min(2, device.cores_per_process())


def test_run_options_given_to_set_name_their_flags(capsys):
    """--set nan_policy=mask, env_kwargs, checkpoint_freq or save_replay_buffer said "Unknown hyperparameter" and
    listed thirty names, none of them the flag that takes it; so did config.yaml's own names of the settings with a
    flag (`--set threads=4`, copied from a run's file, where docs/cli.md says --threads gives it)."""
    for key, flag in (("nan_policy=mask", "--nan-policy"), ("checkpoint_freq=100", "--checkpoint-freq"),
                      ("save_replay_buffer=true", "--save-replay-buffer"), ("threads=4", "--threads"),
                      ("env_id=Acrobot-v1", "the ENV_ID argument"), ("algo=ppo", "the ALGO argument"),
                      ("video_every=1000", "--video-every N"), ("processes=2", "--nproc (or torchrun)"),
                      ("gym_packages=[x]", "--gym-packages MODULE"), ("init_from=run", "--init-from MODEL|RUN_DIR"),
                      ("preset=zoo", "--preset")):
        error = cli_error(capsys, ["train", "dqn", "CartPole-v1", "--set", key])
        assert error.endswith(f"is not a hyperparameter: use {flag}.")
    # (RL-Zoo's name for the run's length: "Unknown hyperparameter" with thirty names, none of them the flag)
    assert "use --total-timesteps N" in cli_error(capsys, ["train", "ppo", "CartPole-v1", "--set", "n_timesteps=1e4"])
    # (tune's length is each trial's --budget, profile's its --steps: neither takes --total-timesteps)
    for command, option in (("tune", "--budget N"), ("profile", "--steps N")):
        error = cli_error(capsys, [command, "ppo", "CartPole-v1", "--set", "n_timesteps=1e4"])
        assert error.endswith(f"RL-Zoo's name for the run's length: use {option}.")
    # (tune and profile were told to use train's flags they lack: --set verbose=0 named --quiet)
    for command, key, said in (("tune", "verbose=0", "rlspeed tune has no option for it (rlspeed train's is --quiet)"),
                               ("profile", "video_every=2", "rlspeed profile has no option for it (rlspeed train's "
                                                            "is --video-every)"),
                               ("tune", "threads=2", "use --threads"), ("profile", "gym_packages=[x]", "use --gym")):
        assert said in cli_error(capsys, [command, "ppo", "CartPole-v1", "--set", key])


def test_eval_takes_the_seed_of_a_final_evaluation_past_the_training_seeds_limit(tmp_path, capsys):
    """A run with seed 2**32 - 1 is evaluated at the end with seed 2**32 - 1 + 1,000,000, which `rlspeed eval --seed`
    refused (at most 2**32 - 1), although the interrupted-run message suggests that very command."""
    PPO("CartPole-v1", device="cpu", seed=0, num_envs=2, num_steps=16, batch_size=32).save(
        tmp_path / "run" / "model.safetensors")
    assert cli.main(["eval", str(tmp_path / "run"), "--seed", str(2**32 - 1 + 1_000_000), "--episodes", "1",
                     "--no-progress"]) == 0


def test_the_command_shows_each_warning_once(tmp_path):
    """Gymnasium's "CartPole-v0 is out of date" came three times in one run (the env is made for its spec, for
    training and for the evaluation; rlspeed's own warning filters reset Python's once-per-place memory)."""
    done = _rlspeed("train", "ppo", "CartPole-v0", "--env-backend", "gymnasium", "--total-timesteps", "300",
                    "--num-envs", "2", "--eval-episodes", "1", "--no-progress", "--out", "run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("out of date") == 1


def test_a_directory_of_the_user_s_own_files_is_no_run_to_overwrite_or_resume(tmp_path, monkeypatch):
    """A project's own config.yaml, videos/ or wandb/ share names with a run's files, but only rlspeed's (known by
    content) are a run: --overwrite deleted them and --resume replaced them before. Another run's directory is
    refused to --resume of another algorithm or env, checkpoint or not (its config.yaml and metrics were replaced)."""
    monkeypatch.chdir(tmp_path)
    project = tmp_path / "proj"
    (project / "videos").mkdir(parents=True)
    (project / "config.yaml").write_text("name: my-app\nport: 8080\n")
    (project / "videos" / "holiday.mp4").write_text("mine")
    argv = ["train", "ppo", "CartPole-v1", "--total-timesteps", "256", "--no-progress", "--target-return", "none"]
    for flags in ([], ["--overwrite"], ["--resume"]):
        with pytest.raises(UserError, match=r"'proj' holds config.yaml, videos, which are not an rlspeed run's"):
            cli.main(["--debug", *argv, "--out", "proj", *flags])
    assert (project / "config.yaml").read_text() == "name: my-app\nport: 8080\n"
    assert (project / "videos" / "holiday.mp4").read_text() == "mine"
    # an rlspeed run (even one that stopped before its first checkpoint: config.yaml only) is one
    assert cli.main([*argv, "--out", "run"]) == 0
    (tmp_path / "run" / "model.safetensors").unlink()
    (tmp_path / "run" / "summary.json").unlink()
    with pytest.raises(UserError, match=r"--resume: 'run' holds a ppo CartPole-v1 run, not a2c Pendulum-v1"):
        cli.main(["--debug", "train", "a2c", "Pendulum-v1", "--total-timesteps", "256", "--no-progress",
                  "--out", "run", "--resume"])
    assert "algo: ppo" in (tmp_path / "run" / "config.yaml").read_text()
    assert cli.main([*argv, "--out", "run", "--overwrite"]) == 0
    # a short learn(run_dir=...) run leaves metrics.csv (and its plot) only: a run too
    for name in ("config.yaml", "summary.json", "model.safetensors"):
        (tmp_path / "run" / name).unlink()
    assert cli.main([*argv, "--out", "run", "--overwrite"]) == 0


def test_resume_with_nothing_left_to_train_keeps_the_replay_entry_of_summary_json(tmp_path, monkeypatch):
    """An off-policy run interrupted at its checkpoint, resumed with --total-timesteps at the steps it trained (nothing
    left to train: the model saved, evaluated, the summary written): summary.json's `replay` described the run's
    buffer before the resume and was null after it (no learn call made a buffer)."""
    from rlspeed.algos.off_policy import OffPolicyAlgorithm

    monkeypatch.chdir(tmp_path)
    argv = ["train", "dqn", "CartPole-v1", "--target-return", "none", "--no-progress", "--num-envs", "4", "--set",
            "train_freq=16", "--set", "learning_starts=64", "--set", "buffer_size=4096", "--out", "run"]
    train_iteration = OffPolicyAlgorithm._train_iteration

    def interrupted_at_256(self, *args, **kwargs):
        if self.num_timesteps >= 256:
            raise KeyboardInterrupt
        return train_iteration(self, *args, **kwargs)

    monkeypatch.setattr(OffPolicyAlgorithm, "_train_iteration", interrupted_at_256)
    assert cli.main([*argv, "--total-timesteps", "2048"]) == 130
    monkeypatch.setattr(OffPolicyAlgorithm, "_train_iteration", train_iteration)
    before = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert before["interrupted"] is True and before["total_timesteps"] == 256
    assert before["replay"]["capacity"] == 4096
    assert cli.main([*argv, "--total-timesteps", "256", "--resume"]) == 0
    after = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert after["interrupted"] is False and after["final_eval"]["episodes"] == 10
    assert after["replay"] == before["replay"]


@pytest.mark.parametrize("seeds", [(), ("--seeds", "0-1")], ids=["single", "population"])
def test_a_run_an_error_ends_says_so_in_its_summary_and_resumes(tmp_path, seeds, train_crashing):
    """A run an env's error ended (exit 1) left no summary.json: a script collecting runs could not tell it from one
    still running. Now its summary.json holds `"error"` (and a finished run's `"error": null`), and --resume goes on
    from its checkpoint. A population's env error was a 20-line traceback; now it is the single run's one line."""
    def train(crash_at: int, *more: str) -> subprocess.CompletedProcess:
        return train_crashing(crash_at, *seeds, *more)

    done = train(300)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines()[-1] == ("rlspeed: error: The env 'CrashingEnv-v0' (gymnasium backend) raised "
                                            "RuntimeError in step(): sensor cable unplugged (--debug shows the env's "
                                            "traceback).")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["error"] == ("EnvStepError: The env 'CrashingEnv-v0' (gymnasium backend) raised RuntimeError in "
                                "step(): sensor cable unplugged")
    assert summary["interrupted"] is False and 0 < summary["total_timesteps"] < 512
    if not seeds:  # (a single run's field: a population's summary has none)
        assert summary["stopped_by"] == "error"
    done = train(1_000_000, "--resume")
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["error"] is None and summary["total_timesteps"] >= 512


def test_a_run_an_error_ends_in_its_final_evaluation_says_so_in_its_summary(tmp_path, train_crashing):
    """An env's error in the final evaluation, after training and its model were saved, left no summary.json (a
    script collecting runs took it for one still running); now its summary holds `"error"`, and --resume evaluates
    it again."""
    train = train_crashing
    done = train(700)  # (the process's env steps: 512 in training, then the final evaluation's)
    assert done.returncode == 1 and "sensor cable unplugged" in done.stderr, done.stderr
    assert (tmp_path / "run" / "model.safetensors").exists()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["error"].startswith("EnvStepError: ") and summary["final_eval"] is None
    assert summary["total_timesteps"] == 512 and summary["stopped_by"] is None  # (its training was done)
    done = train(1_000_000, "--resume")
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["error"] is None and summary["final_eval"]["episodes"] == 10


def test_threads_of_several_processes_on_one_machine_share_its_cores(monkeypatch, capsys):
    """`--nproc 2 --threads 2` on 2 cores ran 2 threads in each process, 4 on 2 cores, and trained ten times slower
    than with 1 thread each: each process's count is capped at its share of the cores (torchrun's LOCAL_WORLD_SIZE),
    with the note said once, by the first process."""
    from rlspeed import device

    monkeypatch.setattr(device, "usable_cores", lambda: 2)
    monkeypatch.setattr(device, "bound_by_launcher", lambda: False)  # (pytest started by `taskset` would be)
    monkeypatch.setattr(device, "_process_threads", device._process_threads)  # (restored after the test)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    before = torch.get_num_threads()
    try:
        for rank, said in (("0", True), ("1", False)):
            monkeypatch.setenv("RANK", rank)
            assert cli._configure_threads(argparse.Namespace(threads=2)) == 1 == torch.get_num_threads()
            err = capsys.readouterr().err
            assert ("--threads 2 is more than the 1 core this process may use (its CPU affinity or container quota, "
                    "shared by the 2 processes on this machine): training runs 1 thread in each." in err) is said
        assert device.set_training_threads(2) == 1 and torch.get_num_threads() == 1  # (a model's num_threads alike)
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
        assert cli._configure_threads(argparse.Namespace(threads=2)) == 2
        assert capsys.readouterr().err == ""
    finally:
        torch.set_num_threads(before)


def test_a_process_the_launcher_bound_to_cores_of_its_own_keeps_them(monkeypatch):
    """`torchrun --numa-binding=exclusive --nproc-per-node 8` gives each process cores of its own (16 of its parent's
    128 here): those are its share, not a further eighth of them (2 threads where 16 were asked). Processes that share
    their launcher's cores divide them."""
    from rlspeed import device

    monkeypatch.setattr(device, "cgroup_cpu_quota", lambda: None)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    parent = os.getppid()
    own = set(range(16, 32))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(128)) if pid == parent else own, raising=False)
    assert device.cores_per_process() == 16 and device._within_cores(16) == 16
    own = set(range(128))  # (not bound: the launcher's 128 cores, shared by its 8 processes)
    assert device.cores_per_process() == 16 and device._within_cores(32) == 16


def test_threads_beyond_the_usable_cores_are_capped_with_a_note(tmp_path, monkeypatch, capsys):
    """`--threads 8` where the process may use 2 cores (a SLURM allocation, `taskset`, `docker --cpus=2`) runs 2
    threads, as config.yaml records; it used to say nothing of it. Asking for no more than the cores: no note."""
    import yaml

    from rlspeed import device

    monkeypatch.setattr(device, "usable_cores", lambda: 2)
    before = torch.get_num_threads()
    try:
        argv = ["train", "ppo", "CartPole-v1", "--num-envs", "2", "--total-timesteps", "32", "--no-progress",
                "--eval-episodes", "1", "--set", "batch_size=16"]
        assert cli.main([*argv, "--threads", "8", "--out", str(tmp_path / "capped")]) == 0
        assert ("rlspeed: note: --threads 8 is more than the 2 cores this process may use (its CPU affinity or "
                "container quota): training runs 2 threads.") in capsys.readouterr().err
        assert yaml.safe_load((tmp_path / "capped" / "config.yaml").read_text())["threads"] == 2
        assert cli.main([*argv, "--threads", "2", "--checkpoint-freq", "16", "--out", str(tmp_path / "fits")]) == 0
        assert "--threads" not in capsys.readouterr().err
        # (a resume keeps the run's count, where the flag is not given: the note names where the count came from)
        monkeypatch.setattr(device, "usable_cores", lambda: 1)
        resume = [arg if arg != "32" else "64" for arg in argv]
        assert cli.main([*resume, "--resume", "--out", str(tmp_path / "fits")]) == 0
        assert ("rlspeed: note: the run's 2 threads (its config.yaml) are more than the 1 core this process may use "
                "(its CPU affinity or container quota): training runs 1 thread.") in capsys.readouterr().err
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("algo, env_id, backend, settings, target", [
    ("ppo", "CartPole-v1", "torch", ["num_envs=4", "num_steps=16", "batch_size=32", "n_epochs=2"],
     ["--target-return", "25", "--eval-freq", "64", "--total-timesteps", "1024"]),
    ("sac", "Pendulum-v1", "gymnasium", ["learning_starts=32", "batch_size=16", "net_arch=[16,16]"],
     ["--target-return", "none", "--total-timesteps", "128"])])
def test_a_command_line_run_is_the_same_run_from_python_with_its_config_yaml(algo, env_id, backend, settings, target,
                                                                             tmp_path, monkeypatch):
    """What getting-started.md promises a researcher rerunning a run in Python: the algorithm built with config.yaml's
    seed, env backend, thread count and hyperparameters, trained for its budget, ends with the command line's weights
    bit for bit, and evaluating it from summary.json's final_eval seed gives that evaluation."""
    import warnings

    import rlspeed

    monkeypatch.chdir(tmp_path)
    argv = ["train", algo, env_id, "--seed", "3", "--env-backend", backend, *target, "--eval-episodes", "2",
            "--no-progress", "--out", "run"]
    for item in settings:
        argv += ["--set", item]
    assert cli.main(argv) == 0
    config = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text(encoding="utf-8"))
    summary = json.loads((tmp_path / "run" / "summary.json").read_text(encoding="utf-8"))
    algo_cls = ALGORITHMS[algo]
    with warnings.catch_warnings():  # (use_masking=True, recorded as every run's setting, has no masks to apply here)
        warnings.simplefilter("ignore", rlspeed.errors.UnusedSettingWarning)
        model = algo_cls(env_id, seed=config["seed"], env_backend=config["env_backend"], device=config["device"],
                         num_threads=config["threads"], **config["hyperparameters"])
        model.learn(config["total_timesteps"], target_return=config["target_return"], eval_freq=config["eval_freq"],
                    eval_episodes=config["eval_episodes"], progress_bar=False)
    assert model.num_timesteps == summary["total_timesteps"]
    saved = algo_cls.load(tmp_path / "run" / "model.safetensors", device="cpu")
    for (name, ours), (_, theirs) in zip(model.policy.state_dict().items(), saved.policy.state_dict().items(),
                                         strict=True):
        assert torch.equal(ours, theirs), name
    final = summary["final_eval"]
    assert rlspeed.evaluate(model, env_id, episodes=final["episodes"], seed=final["seed"])["mean"] == final["mean"]


@pytest.mark.parametrize("seeds", [None, "0-1"])
def test_quiet_train_and_eval_print_their_result_line_and_what_goes_to_stderr_only(tmp_path, monkeypatch, capsys,
                                                                                     seeds):
    """`--quiet`: no progress bar or status lines and none of the lines of what the run is doing (the run directory,
    what trains, a population's line per evaluation), only the final evaluation's line on stdout; a note (on stderr)
    is still printed. `rlspeed eval --quiet` prints its result line without the progress bar."""
    from rlspeed import device
    from rlspeed import logging as run_logging
    from rlspeed.logging import ProgressBar

    monkeypatch.setattr(run_logging, "_is_terminal", lambda stream: False)  # (status lines, also under pytest -s)
    monkeypatch.setattr(ProgressBar, "LINE_INTERVAL_S", 0.0)  # (a status line at every update)
    # (the note of a --threads beyond the cores, training one thread: several would contend for CI's 2 cores)
    monkeypatch.setattr(device, "usable_cores", lambda: 1)
    out = tmp_path / "run"
    argv = ["train", "ppo", "CartPole-v1", "--total-timesteps", "512", "--set", "num_envs=4", "--set", "num_steps=32",
            "--set", "batch_size=64", "--eval-freq", "256", "--threads", "100000", "--out", str(out)]
    argv += ["--seeds", seeds, "--target-return", "none"] if seeds else []
    assert cli.main(argv) == 0
    loud = capsys.readouterr()
    assert len(loud.out.splitlines()) > 1 and "run directory" in loud.out
    assert "steps (" in loud.err if seeds is None else "members evaluated" in loud.out
    shutil.rmtree(out)
    assert cli.main([*argv, "--quiet"]) == 0
    captured = capsys.readouterr()
    line, = captured.out.splitlines()
    assert line.startswith("rlspeed: final evaluation (deterministic")
    assert "--threads 100000 is more than the" in captured.err  # (a note: still said)
    assert "steps (" not in captured.err and "episodes (" not in captured.err  # (no status lines)
    if seeds is None:
        assert cli.main(["eval", str(out), "--seed", "1", "--quiet"]) == 0
        captured = capsys.readouterr()
        line, = captured.out.splitlines()
        assert line.startswith("rlspeed: PPO on CartPole-v1, deterministic, 10 episodes, seed 1: ")
        assert captured.err == ""


def test_a_folder_another_machine_made_in_a_shared_temp_directory_is_kept(tmp_path, monkeypatch):
    """TMPDIR on storage several machines share (a cluster's job array): a command's warnings folder, made by a
    process whose id runs on another machine only, is that process's, not a killed one's; this machine's killed
    command's folder is removed as before."""
    made = {}
    for machine in ("other-node", socket.gethostname()):
        script = (f"import os, socket; socket.gethostname = lambda: {machine!r}\n"
                  "from rlspeed import cli\n"
                  "cli._workers_show_warnings()\n"
                  "print(cli._warnings_dir, flush=True)\n"
                  "os._exit(0)\n")  # (as a kill: no exit handler removes it)
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "TMPDIR": str(tmp_path)})
        made[machine] = Path(done.stdout.strip())
        assert made[machine].is_dir(), done.stderr
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    try:
        cli._workers_show_warnings()
        assert made["other-node"].is_dir() and not made[socket.gethostname()].exists()
    finally:
        cli._forget_worker_warnings()


def test_the_run_directory_stays_locked_while_torchrun_outlives_a_killed_nproc_launcher(monkeypatch, tmp_path):
    """`rlspeed train --nproc` killed with SIGKILL (its lock gone with it) leaves torchrun and the workers training:
    they hold the run directory's lock too, so a requeued command there is refused (exit code 75) until they end
    rather than training beside them."""
    import subprocess as subprocess_module

    start, seen = subprocess_module.Popen, {}
    take_lock = ("import sys\nfrom rlspeed.errors import Busy\nfrom rlspeed.locks import hold_lock\n"
                 "try:\n    hold_lock(sys.argv[1], {}, 'busy')\nexcept Busy:\n    print('busy')\nelse:\n"
                 "    print('free')\n")

    def torchrun(command, **kwargs):  # (a torchrun that runs until the launcher is gone and the lock tried)
        process = start([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
                        stdout=subprocess_module.PIPE, text=True, **kwargs)
        try:
            assert process.stdout.readline().strip() == "up"
            cli._release_run_locks()  # (the launcher's own handle gone, as with its SIGKILL)
            other = start([sys.executable, "-c", take_lock, str(tmp_path / "run" / cli.RUN_LOCK)],
                          stdout=subprocess_module.PIPE, text=True)  # (another command's try, as a requeue's)
            seen["lock"] = other.communicate(timeout=60)[0].strip()
        finally:
            process.kill()
        return process

    monkeypatch.setattr(subprocess_module, "Popen", torchrun)
    cli.main(["train", "ppo", "CartPole-v1", "--nproc", "1", "--out", str(tmp_path / "run"), "--no-progress"])
    assert seen["lock"] == "busy"


def test_dry_run_prints_the_config_the_run_writes_and_writes_nothing(capsys, monkeypatch, tmp_path):
    """`--dry-run` shows the settings a command would train with (its config.yaml, exactly: a preset file too) on
    stdout, trains nothing and makes no directory; the same command without it writes that config.yaml."""
    monkeypatch.chdir(tmp_path)
    argv = ["train", "ppo", "CartPole-v1", "--total-timesteps", "256", "--set", "learning_rate=1e-3",
            "--target-return", "none", "--no-progress", "--out", "run"]
    assert cli.main([*argv, "--dry-run"]) == 0
    captured = capsys.readouterr()
    assert "nothing was trained or written" in captured.err and "rlspeed:" not in captured.out
    assert list(tmp_path.iterdir()) == []  # (no run directory, no runs/)
    shown = yaml.safe_load(captured.out)
    assert shown["hyperparameters"]["learning_rate"] == 1e-3 and shown["total_timesteps"] == 256
    assert cli.main(argv) == 0
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text()) == shown
    capsys.readouterr()
    # (the file shown is a preset: a dry run from it shows the same hyperparameters and run settings)
    (tmp_path / "shown.yaml").write_text(captured.out)
    assert cli.main(["train", "ppo", "CartPole-v1", "--preset", "shown.yaml", "--dry-run"]) == 0
    again = yaml.safe_load(capsys.readouterr().out)
    assert again["hyperparameters"] == shown["hyperparameters"] and again["total_timesteps"] == 256


def test_dry_run_of_a_population_shows_its_per_member_values(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "ppo", "CartPole-v1", "--seeds", "0-2", "--set", "learning_rate=1e-3,2e-3,3e-3",
                     "--dry-run"]) == 0
    captured = capsys.readouterr()
    shown = yaml.safe_load(captured.out)
    assert shown["seeds"] == [0, 1, 2] and shown["hyperparameters"]["learning_rate"] == [1e-3, 2e-3, 3e-3]
    assert "which --preset does not take" in captured.err and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flag", [["--resume", "--out", "run"], ["--nproc", "2"], ["--overwrite"]])
def test_dry_run_with_a_flag_it_cannot_show_is_refused(flag, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    error = cli_error(capsys, ["train", "ppo", "CartPole-v1", "--dry-run", *flag])
    assert error.startswith(f"rlspeed: error: --dry-run does not apply with {flag[0]}")
    assert list(tmp_path.iterdir()) == []


def test_dry_run_refuses_an_out_the_run_could_not_make(capsys, monkeypatch, tmp_path):
    """`--dry-run --out DIR` said the settings were fine where the run itself refused DIR at once (a file in its
    parents' place, a folder above it where nothing can be made): the dry run says it too, making nothing."""
    monkeypatch.chdir(tmp_path)
    Path("taken").write_text("a file")
    error = cli_error(capsys, ["train", "ppo", "CartPole-v1", "--dry-run", "--out", "taken/run"])
    assert error == "rlspeed: error: Cannot create the run directory 'taken/run': 'taken' is a file."
    # (a read-only folder, which root, running the tests here, could write to anyway)
    monkeypatch.setattr(cli, "unwritable", lambda folder: "Permission denied" if Path(folder).name == "ro" else None)
    Path("ro").mkdir()
    error = cli_error(capsys, ["train", "ppo", "CartPole-v1", "--dry-run", "--out", "ro/run/a"])
    assert error == "rlspeed: error: Cannot create the run directory 'ro/run/a': Permission denied (in 'ro')."
    assert sorted(path.name for path in tmp_path.iterdir()) == ["ro", "taken"]


def test_init_from_starts_a_new_run_from_a_saved_models_networks(capsys, monkeypatch, tmp_path):
    """`--init-from RUN_DIR` (RL-Zoo's --trained-agent): the new run's model starts from the file's networks, whose
    shape (net_arch) it takes over the preset's, with its own hyperparameters, steps from 0 and its own run
    directory; config.yaml records the file. A --set that changes the networks, another algorithm's file or a file
    for other spaces is one sentence."""
    monkeypatch.chdir(tmp_path)
    common = ["--target-return", "none", "--no-progress", "--quiet"]
    assert cli.main(["train", "ppo", "CartPole-v1", "--set", "net_arch=[16,16]", "--total-timesteps", "2048",
                     "--out", "first", *common]) == 0
    # (a learning rate too small to move the weights: the fine-tuned model acts as the file's)
    assert cli.main(["train", "ppo", "CartPole-v1", "--init-from", "first", "--set", "learning_rate=1e-12",
                     "--total-timesteps", "256", "--out", "second", *common]) == 0
    assert "net_arch=[16, 16], as the networks of" in capsys.readouterr().err
    config = yaml.safe_load((tmp_path / "second" / "config.yaml").read_text())
    assert config["init_from"] == str((tmp_path / "first" / "model.safetensors").resolve())
    assert config["hyperparameters"]["net_arch"] == [16, 16]
    first = PPO.load(tmp_path / "first" / "model.safetensors", device="cpu")
    second = PPO.load(tmp_path / "second" / "model.safetensors", device="cpu")
    observations = torch.randn(256, 4)
    assert torch.equal(first.predict(observations, deterministic=True)[0],
                       second.predict(observations, deterministic=True)[0])
    assert second.num_timesteps == 256
    for argv, error in ((["ppo", "CartPole-v1", "--set", "net_arch=[64,64]"], "--set net_arch=[64, 64] and "),
                        (["dqn", "CartPole-v1"], "holds a model of ppo, not of dqn"),
                        (["ppo", "Acrobot-v1"], "whose observations and actions differ"),
                        (["ppo", "CartPole-v1", "--seeds", "0-1"], "--init-from does not apply to a population")):
        assert error in cli_error(capsys, ["train", *argv, "--init-from", "first", "--dry-run"])


def test_set_parameters_takes_a_files_networks_and_nothing_else(tmp_path):
    """`model.set_parameters(path)` (Stable-Baselines3's name): the networks (a DQN's target network too) of a model
    of the same algorithm and shape; the model's own hyperparameters, optimiser and step count stay."""
    from rlspeed import DQN

    source = DQN("CartPole-v1", seed=0, num_envs=2, learning_starts=64, net_arch=[32, 32])
    source.learn(512, progress_bar=False)
    source.save(tmp_path / "dqn")
    model = DQN("CartPole-v1", seed=1, num_envs=2, learning_starts=64, net_arch=[32, 32], learning_rate=1e-5)
    model.set_parameters(tmp_path / "dqn.safetensors")
    for name in ("q_network", "q_target"):
        theirs, ours = getattr(source, name).state_dict(), getattr(model, name).state_dict()
        assert all(torch.equal(theirs[key], ours[key]) for key in theirs)
    assert model.num_timesteps == 0 and model.config.learning_rate == 1e-5
    with pytest.raises(UserError, match=r"net_arch=\[32, 32\], this model's have net_arch=\[64, 64\]"):
        DQN("CartPole-v1", net_arch=[64, 64]).set_parameters(tmp_path / "dqn.safetensors")
    # (SB3's set_parameters(path, False), exact_match=False, skipped the digest check silently as verify)
    with pytest.raises(UserError, match=r"^set_parameters takes the path alone, not False \(exact_match\) after it "
                                        r"\(Stable-Baselines3's arguments after the path are exact_match and device\): "
                                        r"here the file's networks"):
        model.set_parameters(tmp_path / "dqn.safetensors", False)
    # (SB3's third, device, was left unnamed)
    with pytest.raises(UserError, match=r"^set_parameters takes the path alone, not True \(exact_match\), 'cpu' "
                                        r"\(device\) after it"):
        model.set_parameters(tmp_path / "dqn.safetensors", True, "cpu")
    with pytest.raises(UserError, match=r"^set_parameters takes the path and verify= alone, not exact_match=False "
                                        r"\(Stable-Baselines3's exact_match, not taken here\)"):
        model.set_parameters(tmp_path / "dqn.safetensors", exact_match=False)  # (by name: a TypeError before)
    # (a misspelt verify was told about exact_match and device)
    with pytest.raises(UserError, match=r"^set_parameters takes no 'verfy'; did you mean verify\?$"):
        model.set_parameters(tmp_path / "dqn.safetensors", verfy=False)


def test_set_parameters_refuses_weights_trained_on_another_observation_scale(tmp_path):
    """Weights trained on normalised observations compute something else on raw ones: a model without the file's
    normalize_obs is refused, naming it (a model with it takes the file's statistics too)."""
    source = PPO("Pendulum-v1", seed=0, num_envs=2, num_steps=64, normalize_obs=True)
    source.learn(256, progress_bar=False)
    source.save(tmp_path / "ppo")
    with pytest.raises(UserError, match="normalize_obs=True, this model's have normalize_obs=False"):
        PPO("Pendulum-v1", num_envs=2, num_steps=64).set_parameters(tmp_path / "ppo.safetensors")
    model = PPO("Pendulum-v1", num_envs=2, num_steps=64, normalize_obs=True)
    model.set_parameters(tmp_path / "ppo.safetensors")
    assert torch.equal(model.obs_rms.mean, source.obs_rms.mean) and torch.equal(model.obs_rms.var, source.obs_rms.var)


def test_resume_with_another_init_from_than_the_run_started_from_is_refused(capsys, monkeypatch, tmp_path):
    """`--resume --init-from FILE` of a run with a checkpoint: the run goes on from its checkpoint's weights, so a
    file other than the one config.yaml records (or any, for a run started from scratch) is one sentence (exit 2),
    where config.yaml recorded the file as the run's start, silently; the same file as the run started from is
    taken."""
    monkeypatch.chdir(tmp_path)
    common = ["--target-return", "none", "--no-progress", "--quiet", "--checkpoint-freq", "256"]
    assert cli.main(["train", "ppo", "CartPole-v1", "--total-timesteps", "512", "--out", "first", *common]) == 0
    for out, start in (("scratch", []), ("warm", ["--init-from", "first"])):
        assert cli.main(["train", "ppo", "CartPole-v1", "--total-timesteps", "512", "--out", out, *start,
                         *common]) == 0
        for name in ("model.safetensors", "summary.json"):  # (as a killed run leaves it: a checkpoint)
            (tmp_path / out / name).unlink()
    error = cli_error(capsys, ["train", "ppo", "CartPole-v1", "--total-timesteps", "768", "--out", "scratch",
                               "--resume", "--init-from", "first", *common])
    assert error.startswith("rlspeed: error: --init-from applies where a run starts: the run in 'scratch' started "
                            "from scratch")
    assert yaml.safe_load((tmp_path / "scratch" / "config.yaml").read_text())["init_from"] is None
    assert cli.main(["train", "ppo", "CartPole-v1", "--total-timesteps", "768", "--out", "warm", "--resume",
                     "--init-from", "first", *common]) == 0
    assert yaml.safe_load((tmp_path / "warm" / "config.yaml").read_text())["init_from"] == str(
        (tmp_path / "first" / "model.safetensors").resolve())


def test_a_torchrun_restart_goes_on_from_the_checkpoint_without_the_init_from_file(monkeypatch, tmp_path):
    """A restart of the group (`--max-restarts`: TORCHELASTIC_RESTART_COUNT > 0, no --resume) resumes from the
    run's checkpoint, as --resume does: the --init-from file the run started from is not needed again (it may be
    gone), so it is neither read nor applied."""
    (tmp_path / "checkpoint.safetensors").write_bytes(b"")
    args = argparse.Namespace(resume=False, out=str(tmp_path))
    assert not cli._resumes_checkpoint(args)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert cli._resumes_checkpoint(args)
    assert not cli._resumes_checkpoint(argparse.Namespace(resume=False, out=str(tmp_path / "other")))


TUPLE_OPTION_ENV_MODULE = """
import gymnasium as gym


def make(shape=(4,)):
    # (its option `shape` must be a tuple, as highway-env's observation_shape: `(1,) + shape` refuses a list)
    return gym.wrappers.ReshapeObservation(gym.make("CartPole-v1"), (1,) + shape)


gym.register("TupleOption-v0", entry_point=make)
"""


def test_env_options_take_tuples_and_the_run_records_them_as_tuples(tmp_path, monkeypatch):
    """`--env-kwargs 'shape=!!python/tuple [2, 2]'` gives the env a tuple (YAML's lists are lists), and config.yaml
    writes it as one, so the run's evaluation, `rlspeed eval` and `--resume` make the same env."""
    (tmp_path / "tuple_option_env.py").write_text(TUPLE_OPTION_ENV_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    settings = ["--set", "num_steps=8", "--set", "batch_size=8", "--total-timesteps", "8", "--eval-episodes", "1"]
    assert cli.main(["train", "ppo", "tuple_option_env:TupleOption-v0", "--env-kwargs", "shape=!!python/tuple [2, 2]",
                     "--num-envs", "1", *settings, "--no-progress", "--out", "run"]) == 0
    assert "shape: !!python/tuple [2, 2]" in (tmp_path / "run" / "config.yaml").read_text()
    assert yamlfile.load_run_file((tmp_path / "run" / "config.yaml").read_text())["env_kwargs"] == {"shape": (2, 2)}
    assert cli.main(["eval", "run", "--episodes", "1", "--no-progress"]) == 0


def test_resume_runs_also_checkpoint_by_wall_time_unless_a_step_frequency_is_asked_for(tmp_path, monkeypatch):
    """With --resume a run checkpointed every 1/20 of its budget only: for an env of 5 ms a step (180 steps/s), a
    budget of 10M steps is 500,000 steps, 46 minutes, between checkpoints, all lost by a preemption. The wall-time
    bound of a run without --resume applies too; --checkpoint-freq N alone is what the user asked for."""
    from rlspeed import PPO

    monkeypatch.chdir(tmp_path)
    asked = []
    learn = PPO.learn
    monkeypatch.setattr(PPO, "learn", lambda self, *a, **kw: asked.append((kw.get("checkpoint_freq"),
                                                                            kw.get("checkpoint_interval_s")))
                        or learn(self, *a, **kw))
    argv = ["train", "ppo", "CartPole-v1", "--total-timesteps", "128", "--num-envs", "4", "--set", "num_steps=32",
            "--set", "batch_size=64", "--target-return", "none", "--no-progress"]
    assert cli.main([*argv, "--out", "a", "--resume"]) == 0
    assert asked[-1] == (6, cli.CHECKPOINT_INTERVAL_S)  # (1/20 of the budget and the wall-time bound)
    assert cli.main([*argv, "--out", "b", "--checkpoint-freq", "64"]) == 0
    assert asked[-1] == (64, None)


def test_env_options_that_keep_the_task_keep_its_target_and_others_say_none_is_set(capsys):
    """`--env-kwargs render_mode=rgb_array` (or an option at its registered value) left CartPole-v1 without its
    475 target, training the whole budget; options that make another task left a run without one in silence, where
    the same command without them named the target it stops at."""
    from rlspeed.envs import env_spec

    def target(env_id, env_kwargs):
        args = argparse.Namespace(target_return=None, eval_freq=None, env_id=env_id, env_kwargs=["x"])
        found = cli._target_and_eval_freq(args, {}, env_spec(env_id, env_kwargs))[0]
        cli._say_preset(args)  # (which says the notes, after the preset's line)
        return found

    assert target("CartPole-v1", {"render_mode": "rgb_array", "max_episode_steps": 500}) == 475
    assert target("FrozenLake-v1", {"is_slippery": True}) == 0.7
    assert capsys.readouterr().err == ""
    assert target("FrozenLake-v1", {"is_slippery": False}) is None
    assert capsys.readouterr().err == (
        "rlspeed: note: no target: 0.7 is FrozenLake-v1's reward threshold without the env options is_slippery=False, "
        "which make another task: give --target-return R to stop at one\n")


def test_advice_inside_the_rlspeed_command_is_in_the_command_lines_terms(capsys):
    """A CLI user was told Python's way first (`env_backend='gymnasium'`, export `format='exported_program'`) where the
    command has a flag for it; inside `command_advice` (the `rlspeed` command) the sentence names the flag, and
    Python's caller still reads Python's."""
    from rlspeed.envs import backend_for_options
    from rlspeed.errors import command_advice
    from rlspeed.export import _other_formats

    with pytest.raises(UserError, match=r"use env_backend='gymnasium' \(or 'gymnasium-async'"):
        backend_for_options({"render_mode": "rgb_array"}, "torch")
    assert _other_formats("exported_program", "onnx") == "format='exported_program' or 'onnx'"
    with command_advice("rlspeed"):
        assert _other_formats("exported_program", "onnx") == "--format exported_program or onnx"
    error = cli_error(capsys, ["train", "ppo", "Acrobot-v1", "--env-kwargs", "render_mode=rgb_array", "--env-backend",
                               "torch", "--dry-run"])
    assert error == ("rlspeed: error: --env-kwargs are options of Gymnasium's env: use --env-backend gymnasium (or "
                     "gymnasium-async), not torch.")


def test_a_dry_run_names_rlspeeds_own_preset_on_stderr_before_the_notes_on_its_target(capsys):
    """With rlspeed's own preset for the pair no line said which preset a run used (RL-Zoo's and the default one each
    had one), a dry run said none of them, and the target's note came before the preset's line where one was said."""
    assert cli.main(["train", "ppo", "CartPole-v1", "--env-kwargs", "sutton_barto_reward=true", "--dry-run"]) == 0
    captured = capsys.readouterr()
    assert yaml.safe_load(captured.out)["preset"]["source"] == "rlspeed"  # (stdout: the YAML alone)
    lines = captured.err.splitlines()
    assert lines[0] == "rlspeed: using rlspeed's preset for ppo CartPole-v1."
    assert lines[1].startswith("rlspeed: note: no target: 475 is CartPole-v1's reward threshold") and len(lines) == 3


def test_a_typo_in_a_dry_runs_preset_file_is_one_short_sentence(tmp_path, capsys):
    """The docs' way to a preset file (`--dry-run > my.yaml`, edited) with a misspelled key was refused with what the
    file's use would have left out first ("not taken from it: seed 0, env_backend torch (flags)"), the mistake last."""
    assert cli.main(["train", "ppo", "CartPole-v1", "--dry-run", "--total-timesteps", "2048"]) == 0
    text = capsys.readouterr().out
    (tmp_path / "my.yaml").write_text(text.replace("learning_rate:", "learnin_rate:"))
    error = cli_error(capsys, ["train", "ppo", "CartPole-v1", "--preset", str(tmp_path / "my.yaml"), "--dry-run"])
    assert error == (f"rlspeed: error: {tmp_path / 'my.yaml'}, a run's config.yaml (CartPole-v1): Unknown "
                     "hyperparameter 'learnin_rate' for PPO. Did you mean learning_rate?")


def test_train_help_names_the_budget_a_run_without_one_trains(capsys):
    """`rlspeed train --help` said the budget defaults to "the preset's"; on an env without a preset (Blackjack-v1)
    the run trained 1,000,000 steps, which nothing said before it began."""
    assert cli.main(["train", "--help"]) == 0
    said = re.search(r"--total-timesteps N env steps, e\.g\. 1e5 \(default: the preset's, else ([\d,]+)\)",
                     " ".join(capsys.readouterr().out.split()))
    assert said is not None
    assert cli.main(["train", "ppo", "Blackjack-v1", "--dry-run"]) == 0
    config = yaml.safe_load(capsys.readouterr().out)
    assert config["preset"]["source"] == "rlspeed-default"
    assert config["total_timesteps"] == int(said[1].replace(",", ""))


def test_a_mujoco_v5_id_on_rl_zoos_v4_entry_is_not_told_another_envs_change(capsys):
    """`rlspeed train ppo Swimmer-v5` said it took RL-Zoo's Swimmer-v4 entry because v5 "revises the env (Ant's
    observations differ)": the reason named Ant as if it were Swimmer's change."""
    pytest.importorskip("rl_zoo3")
    pytest.importorskip("mujoco")
    assert cli.main(["train", "ppo", "Swimmer-v5", "--dry-run", "--total-timesteps", "2048"]) == 0
    origin = yaml.safe_load(capsys.readouterr().out)["preset"]["origin"]
    assert "its Swimmer-v4 entry" in origin and "(Ant's" not in origin
    assert "Ant-v5's observations differ from Ant-v4's, for one" in origin


def test_a_command_line_whose_words_an_option_took_names_the_option_and_the_fix(capsys):
    """`rlspeed train --gym-packages myenvs ppo MyLine-v0` was refused as 'the following arguments are required: ALGO,
    ENV_ID', which the command gave (--gym-packages took them as modules); `--set learning_rate 1e-3` as
    'unrecognized arguments: 1e-3'. Neither named the fix."""
    assert cli_error(capsys, ["train", "--gym-packages", "mymod", "ppo", "MyLine-v0"]) == (
        "rlspeed: error: the following arguments are required: ALGO, ENV_ID; --gym-packages took mymod ppo MyLine-v0 "
        "as modules (it takes every word up to the next option): give ALGO ENV_ID before it (see 'rlspeed train "
        "--help').")
    assert cli_error(capsys, ["train", "ppo", "--gym-packages", "mymod"]) == (
        "rlspeed: error: the following arguments are required: ENV_ID (see 'rlspeed train --help').")
    assert cli_error(capsys, ["train", "ppo", "CartPole-v1", "--set", "learning_rate", "1e-3"]) == (
        "rlspeed: error: unrecognized arguments: 1e-3; --set takes KEY=VALUE as one word: --set learning_rate=1e-3.")
    assert cli_error(capsys, ["train", "ppo", "CartPole-v1", "--seed", "3", "--set", "n_epochs", "3"]) == (
        "rlspeed: error: unrecognized arguments: 3; --set takes KEY=VALUE as one word: --set n_epochs=3.")


def test_a_presets_target_is_noted_only_for_env_options_that_change_the_task(capsys):
    """`--env-kwargs render_mode=rgb_array` (or Pendulum's g at its registered 10.0) kept the id's task, yet the
    preset's target -200 was said "may not fit" with env options; options that change the task still say so."""
    from rlspeed.envs import env_spec

    def notes(env_kwargs):
        args = argparse.Namespace(target_return=None, eval_freq=None, env_id="Pendulum-v1", env_kwargs=["x"])
        assert cli._target_and_eval_freq(args, {"target_return": -200}, env_spec("Pendulum-v1", env_kwargs))[0] == -200
        return args.target_notes

    assert notes({"render_mode": "rgb_array"}) == [] and notes({"g": 10.0}) == []
    assert notes({"g": 5.0}) == ["rlspeed: note: the target -200 is the preset's for Pendulum-v1 as registered; with "
                                 "env options it may not fit: give --target-return R (or none)"]


def test_tunes_target_note_and_help_say_what_the_target_does_in_tune(capsys):
    """`rlspeed tune` with env options that drop the id's threshold said "give --target-return R to stop at one", but
    a tune target ranks trials by the steps to reach it; its --target-return help left out what train's says of env
    options that change the task. Both commands' help now give the same default."""
    from rlspeed.envs import env_spec

    args = argparse.Namespace(target_return=None, eval_freq=None, env_id="FrozenLake-v1", env_kwargs=["x"],
                              command="tune")
    assert cli._target_and_eval_freq(args, {}, env_spec("FrozenLake-v1", {"is_slippery": False}))[0] is None
    assert args.target_notes == [
        "rlspeed: note: no target: 0.7 is FrozenLake-v1's reward threshold without the env options is_slippery=False, "
        "which make another task: trials score their final evaluation; give --target-return R to score the steps to "
        "reach it"]
    defaults = []
    for command in ("train", "tune"):
        assert cli.main([command, "--help"]) == 0
        said = " ".join(capsys.readouterr().out.split())
        defaults.append(re.search(r"--target-return R\|none .*? \(default: (.*?); none:", said)[1])
    assert defaults[0] == defaults[1] and "env options that change its task leave out" in defaults[0]


def test_tune_says_the_notes_on_its_settings_after_the_presets_line(tmp_path, monkeypatch, capsys):
    """`rlspeed tune` said the preset's line and the target's notes by hand, without the notes on how --set combined
    with the preset (`--set learning_rate=X` starting a decay to 0) that train says: one rule (`_say_preset`) now."""
    pytest.importorskip("optuna")
    import rlspeed.tune

    monkeypatch.setattr(rlspeed.tune, "tune", lambda *args, **kwargs: None)
    assert cli.main(["tune", "ppo", "CartPole-v1", "--set", "learning_rate=1e-3", "--storage",
                     str(tmp_path / "study.db"), "--out", str(tmp_path / "tuned.yaml")]) == 0
    captured = capsys.readouterr()
    assert captured.out == "rlspeed: using rlspeed's preset for ppo CartPole-v1.\n"
    # (the preset's values the search keeps or replaces are not said: no "keeps the preset's" note)
    assert captured.err == ("rlspeed: note: --set learning_rate=0.001 starts a linear decay to 0 (PPO's default "
                            "anneal_lr=true); add --set anneal_lr=false to hold it constant.\n")
