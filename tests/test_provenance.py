"""summary.json's `provenance`: the command, the versions, the machine and the git commits a run needs recorded to be
repeated and described (a solo run's and a population's)."""

from __future__ import annotations

import csv
import io
import json
import shutil
import subprocess

import gymnasium
import numpy
import pytest
import torch

import rlspeed
from rlspeed import cli
from rlspeed.provenance import git_state

SMALL = ["--set", "num_envs=8", "--set", "num_steps=16", "--set", "batch_size=64", "--set", "n_epochs=2",
         "--total-timesteps", "128", "--target-return", "none", "--eval-episodes", "1", "--quiet"]


@pytest.mark.parametrize("seeds", [["--seed", "3", "--no-progress"], ["--seeds", "0-1"]])
def test_a_runs_summary_records_its_command_versions_and_machine(tmp_path, capsys, seeds):
    out = tmp_path / "run"
    argv = ["train", "ppo", "CartPole-v1", *seeds, *SMALL, "--out", str(out)]
    assert cli.main(argv) == 0
    provenance = json.loads((out / "summary.json").read_text(encoding="utf-8"))["provenance"]
    assert provenance["command"] == "rlspeed " + " ".join(argv)
    assert provenance["versions"] == {"rlspeed": rlspeed.__version__, "torch": torch.__version__,
                                      "gymnasium": gymnasium.__version__, "numpy": numpy.__version__,
                                      "torch_cuda": torch.version.cuda}
    assert provenance["accelerator"] is None  # (trained on the CPU)
    assert provenance["cpu"] and provenance["platform"] and provenance["python"]
    assert set(provenance) >= {"started_utc", "rlspeed_git", "working_directory_git"}


def _git(path, *args):
    return subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_a_git_state_is_the_commit_of_a_tracked_file_and_none_for_an_untracked_one(tmp_path):
    """rlspeed's source in a project's repository that ignores it (a virtual environment there) is no checkout of
    rlspeed: its commit would be the project's."""
    _git(tmp_path, "init", "-q")
    (tmp_path / "tracked.py").write_text("x = 1\n")
    (tmp_path / "untracked.py").write_text("y = 1\n")
    _git(tmp_path, "add", "tracked.py")
    assert git_state(tmp_path) is None  # (no commit yet)
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    head = _git(tmp_path, "rev-parse", "HEAD")
    assert git_state(tmp_path, tracked=tmp_path / "tracked.py") == {"commit": head, "dirty": False}
    assert git_state(tmp_path, tracked=tmp_path / "untracked.py") is None
    (tmp_path / "tracked.py").write_text("x = 2\n")
    assert git_state(tmp_path) == {"commit": head, "dirty": True}
    assert git_state(tmp_path.parent / "no such folder") is None
    # (a repository's config may name a program for git status to run, core.fsmonitor: reading its state runs none)
    marker = tmp_path.parent / "fsmonitor-ran"
    _git(tmp_path, "config", "core.fsmonitor", f"touch {marker}; false")
    assert git_state(tmp_path) == {"commit": head, "dirty": True} and not marker.exists()


def test_the_same_command_and_seed_trains_the_same_run(tmp_path, capsys):
    """What docs/cli.md promises a paper's reader on a CPU: the command summary.json records, run again, gives the
    same metrics (the clock's columns aside), the same final evaluation and the same config.yaml."""
    runs = []
    for name in ("first", "again"):
        out = tmp_path / name
        assert cli.main(["train", "ppo", "CartPole-v1", "--seed", "3", *SMALL, "--eval-freq", "64", "--no-progress",
                         "--env-backend", "torch", "--out", str(out)]) == 0
        rows = [{key: value for key, value in row.items() if key not in ("train_wall_s", "sps")}
                for row in csv.DictReader(io.StringIO((out / "metrics.csv").read_text(encoding="utf-8")))]
        summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
        runs.append((rows, summary["final_eval"], (out / "config.yaml").read_text(encoding="utf-8")))
    assert runs[0][0] and any(row.get("eval_mean") for row in runs[0][0])
    assert runs[0] == runs[1]
