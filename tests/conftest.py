"""Shared test setup: one torch thread (the suite runs on a few shared cores) and small helpers."""

from __future__ import annotations

import os

import pytest
import torch

# Small RL networks are fastest on one thread, and the test machine is shared: no oversubscription.
torch.set_num_threads(1)
os.environ.setdefault("RLSPEED_NUM_THREADS", "1")
os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture
def run_dir(tmp_path):
    """A fresh, not yet existing run directory under pytest's tmp_path."""
    return tmp_path / "run"
