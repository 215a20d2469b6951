"""Property tests of the command line's argument and `--set` parsing: any input parses or is one UserError sentence.

Training itself is replaced by a stub: what is checked is everything `rlspeed train|eval|profile` does with its
arguments before a model is built (argparse, range checks, presets, `--set` values, run settings, config validation).
"""

from __future__ import annotations

import math
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlspeed import UserError, cli
from rlspeed.algos import ALGORITHMS

pytestmark = pytest.mark.faults

NUMBER_TEXT = st.one_of(
    st.integers(-10**20, 10**20).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["1e5", "5.12e2", "1e400", "-0", "0x10", "1_000", "nan", "inf", "-inf", "none", " 5", "", "-1",
                     "1.5", "2**8", "1e-3", "true"]),
    st.text(max_size=8),
)
YAML_TEXT = st.one_of(
    NUMBER_TEXT,
    st.sampled_from(["[64, 64]", "[]", "[[1]]", "{a: 1}", "null", "~", ".inf", ".nan", "-.inf", "yes", "2001-12-14",
                     "!!python/object:os.system", "&a [*a]", "[1, .nan]", "'1e5'", "[0.5]", "0", "{pi: [64, .nan]}",
                     "[[1, -.inf]]", "{a: {b: [.inf]}}", "&a [1, *a, .nan]"]),
)
KEYS = st.one_of(
    st.sampled_from(["learning_rate", "gamma", "batch_size", "num_steps", "num_envs", "net_arch", "buffer_size",
                     "total_timesteps", "eval_freq", "target_return", "n_epochs", "clip_range", "ent_coef", "seed",
                     "device", "env", "tau", "gae_lambda", "normalize_obs", "train_freq", "gradient_steps"]),
    st.text(max_size=6),
)
FLAGS = ["--num-envs", "--seed", "--threads", "--total-timesteps", "--eval-freq", "--checkpoint-freq", "--nproc",
         "--max-restarts", "--target-return"]
TRAIN_OPTIONS = st.lists(st.one_of(
    st.tuples(st.sampled_from(FLAGS), NUMBER_TEXT).map(list),
    st.tuples(st.just("--set"), st.builds(lambda key, value: f"{key}={value}", KEYS, YAML_TEXT)).map(list),
    st.tuples(st.just("--set"), st.text(max_size=8)).map(list),
    st.tuples(st.just("--env-backend"), st.sampled_from(["auto", "torch", "gymnasium", "jax", ""])).map(list),
    st.tuples(st.just("--device"), st.sampled_from(["cpu", "auto", "cuda:x", "", "npu:-1", "tpu"])).map(list),
    st.sampled_from([["--resume"], ["--overwrite"], ["--no-progress"], ["--bogus"], ["-x"]]),
), max_size=6).map(lambda groups: [item for group in groups for item in group])


def _outcome(argv: list[str], capsys) -> int:
    """Exit code of `cli.main(argv)` with training (and torchrun) stubbed out; asserts the one-sentence contract."""
    with mock.patch.object(cli, "_train", lambda *args: 0), mock.patch.object(cli, "_launch_torchrun",
                                                                                lambda args: 0):
        code = cli.main(argv)
    captured = capsys.readouterr()
    assert code in (0, 2), captured.err
    if code == 2:
        lines = captured.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("rlspeed: error:"), captured.err
    assert "Traceback" not in captured.out + captured.err
    return code


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(algo=st.sampled_from([*ALGORITHMS, "pp0"]),
       env_id=st.sampled_from(["CartPole-v1", "Pendulum-v1", "Nope-v0", "ALE/Pong-v5", "no_such_mod:X-v0"]),
       options=TRAIN_OPTIONS)
def test_any_train_command_line_parses_or_is_one_sentence(algo, env_id, options, capsys, tmp_path_factory):
    _outcome(["train", algo, env_id, *options], capsys)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(options=st.lists(st.tuples(st.sampled_from(["--episodes", "--seed"]), NUMBER_TEXT).map(list), max_size=3)
       .map(lambda groups: [item for group in groups for item in group]))
def test_any_eval_command_line_parses_or_is_one_sentence(options, capsys):
    assert _outcome(["eval", "no/such/model.safetensors", *options], capsys) == 2  # (the file does not exist)


@settings(max_examples=300, deadline=None)
@given(pairs=st.lists(st.one_of(st.builds(lambda key, value: f"{key}={value}", KEYS, YAML_TEXT), st.text(max_size=8)),
                      max_size=4))
def test_set_pairs_parse_to_finite_values_or_raise_user_error(pairs):
    try:
        values = cli._parse_set(pairs)
    except UserError:
        return
    for key, value in values.items():
        assert key and key == key.strip()
        assert all(math.isfinite(number) for number in _floats_in(value, []))


def _floats_in(value, within: list) -> list[float]:
    """The floats in `value` and every list and dict in it (each list or dict once: a YAML alias can make a list hold
    itself)."""
    if any(value is seen for seen in within):
        return []
    if isinstance(value, (list, dict)):
        within.append(value)
        return [number for item in (value.values() if isinstance(value, dict) else value)
                for number in _floats_in(item, within)]
    return [value] if isinstance(value, float) else []


@settings(max_examples=300, deadline=None)
@given(text=NUMBER_TEXT, minimum=st.sampled_from([0, 1]))
def test_whole_number_flags_give_whole_numbers_in_range(text, minimum):
    import argparse

    try:
        value = cli._whole(minimum)(text)
    except argparse.ArgumentTypeError:
        return
    assert isinstance(value, int) and value >= minimum
    # the number written, not a rounding of it (digits exactly; 1e5-style notation as the float it denotes)
    assert value == (int(text) if text.strip().lstrip("+-").isdigit() else float(text))
