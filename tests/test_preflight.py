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


def test_a_list_of_one_value_is_named_as_one_value(tmp_path, capsys):
    line = refusal([*TRAIN, "--out", str(tmp_path / "run"), "--set", "vf_coef=[0.1]"], capsys)
    assert "1 values" not in line and "1 seeds" not in line
    assert "give vf_coef=0.1 without brackets" in line


@pytest.mark.parametrize("pair", ["learning_rate=", "learning_rate= "])
def test_an_empty_set_value_is_said_to_be_empty(pair, tmp_path, capsys):
    line = refusal([*TRAIN, "--out", str(tmp_path / "run"), "--set", pair], capsys)
    assert "--set learning_rate= is empty" in line and "None" not in line


def test_a_malformed_device_index_is_named_before_availability():
    with pytest.raises(UserError, match=r"Device index in 'cuda:x' must be a whole number"):
        resolve_device("cuda:x")
