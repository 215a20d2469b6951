"""Shared test setup: one torch thread (the suite runs on a few shared cores) and small helpers."""

from __future__ import annotations

import os

import pytest
import torch

# Small RL networks are fastest on one thread, and the test machine is shared: no oversubscription.
torch.set_num_threads(1)
os.environ.setdefault("RLSPEED_NUM_THREADS", "1")
os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture(autouse=True, scope="session")
def _run_outside_the_tree(tmp_path_factory):
    """The suite runs in a scratch working directory: files libraries drop into the working directory (MuJoCo's
    MUJOCO_LOG.TXT, a default runs/ directory) land there, not in the source tree."""
    previous = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("cwd"))
    yield
    os.chdir(previous)


@pytest.fixture
def isolated_accel(tmp_path, monkeypatch):
    """For acceleration tests: an own strategy cache, no forced strategy, a short timing budget."""
    from rlspeed.accel import search

    monkeypatch.setenv("RLSPEED_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("RLSPEED_ACCELERATE", raising=False)
    monkeypatch.setattr(search, "TIMING_BUDGET_S", 0.03)
    monkeypatch.setattr(search, "ROUNDS", 3)


def cli_error(capsys, argv: list[str]) -> str:
    """The one error line (`rlspeed: error: ...`) of an `rlspeed` command that must exit with code 2."""
    from rlspeed import cli

    assert cli.main(argv) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("rlspeed: error: ")
    return lines[0]


@pytest.fixture
def run_dir(tmp_path):
    """A fresh, not yet existing run directory under pytest's tmp_path."""
    return tmp_path / "run"


def plain_and_fused(algo, env_id: str, fused_type: type, **config):
    """Two models with the same initial weights: autograd's update (fused_update=False) and the hand-derived one."""
    models = []
    for fused in (False, True):
        torch.manual_seed(0)
        models.append(algo(env_id, device="cpu", seed=0, fused_update=fused, **config))
    plain, fused = models
    assert plain._update_step.hand_derived is None and plain.update_summary()["implementation"] == "autograd"
    assert isinstance(fused._update_step.hand_derived, fused_type)
    assert fused.update_summary()["implementation"] == "hand-derived"
    return plain, fused


def assert_gradient_matches_autograd(plain, fused, module_name: str, batch) -> None:
    """The hand-derived gradient of `fused` equals autograd's gradient of `plain._loss` (same weights)."""
    loss, _ = plain._loss(*batch)
    expected = torch.autograd.grad(loss, list(getattr(plain, module_name).parameters()))
    fused._update_step.hand_derived.gradient(*batch)
    for grad, param in zip(expected, getattr(fused, module_name).parameters()):
        torch.testing.assert_close(param.grad, grad, rtol=1e-5, atol=1e-7)
