"""Settings a user can get wrong before anything runs: sizes too large for the memory, said in one sentence before
anything is allocated, and the wording of refusals of malformed values."""

from __future__ import annotations

import pytest

from rlspeed import UserError, cli
from rlspeed.device import resolve_device

TRAIN = ["train", "ppo", "CartPole-v1", "--no-progress", "--target-return", "none"]


def refusal(args: list[str], capsys) -> str:
    """The one line `rlspeed ARGS` refuses with (exit code 2)."""
    code = cli.main(args)
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("rlspeed: error:"), captured.err
    return lines[0]


def test_a_malformed_device_index_is_named_before_availability():
    with pytest.raises(UserError, match=r"Device index in 'cuda:x' must be a whole number"):
        resolve_device("cuda:x")
