"""Settings a user can get wrong before anything runs: sizes too large for the memory, said in one sentence before
anything is allocated, and the wording of refusals of malformed values."""

from __future__ import annotations

import re

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


@pytest.mark.parametrize("pair", ["learning_rate=1e-3,", "learning_rate=1e-3,,2e-3"])
def test_an_empty_value_among_commas_is_named_as_such_not_as_an_empty_value(pair, tmp_path, capsys):
    line = refusal([*TRAIN, "--out", str(tmp_path / "run"), "--set", pair], capsys)
    assert f"--set {pair} has an empty value between or after its commas" in line


def test_a_malformed_device_index_is_named_before_availability():
    with pytest.raises(UserError, match=r"Device index in 'cuda:x' must be a whole number"):
        resolve_device("cuda:x")


@pytest.fixture
def memory_of(monkeypatch):
    """Make the host's available memory (the replay buffer's source) `bytes` for the memory checks."""
    from rlspeed.buffers import replay

    def set_available(nbytes: int) -> None:
        monkeypatch.setattr(replay, "available_memory", lambda device, needed=None: (nbytes, replay.HOST))
    return set_available


@pytest.mark.parametrize("backend", ["torch", "gymnasium"])
def test_num_envs_whose_envs_cannot_fit_are_refused_before_any_env_is_made(backend, memory_of, monkeypatch, tmp_path,
                                                                      capsys):
    from rlspeed.algos import base, on_policy

    memory_of(2**28)
    monkeypatch.setattr(on_policy, "check_rollout_bytes", lambda *args, **kwargs: None)  # (the envs' own check)
    made = []
    monkeypatch.setattr(base, "make_env", lambda *args, **kwargs: made.append(kwargs) or pytest.fail("env made"))
    line = refusal([*TRAIN, "--out", str(tmp_path / "run"), "--num-envs", "4e6", "--env-backend", backend,
                    "--total-timesteps", "1000"], capsys)
    assert "num_envs 4,000,000 (--num-envs)" in line and "MiB" in line and "give at most --num-envs" in line
    assert not made
    per_env = int(re.search(r"at ([\d,]+) bytes per env", line)[1].replace(",", ""))
    advised = int(re.search(r"give at most --num-envs ([\d,]+)", line)[1].replace(",", ""))
    assert advised * per_env <= 0.8 * 2**28 < (advised + 1) * per_env  # (the most that fits in the same memory)


def test_a_rollout_of_num_envs_that_cannot_fit_is_refused_before_any_env_is_made(memory_of, monkeypatch, tmp_path,
                                                                                capsys):
    from rlspeed.algos import base

    memory_of(2**30)
    monkeypatch.setattr(base, "make_env", lambda *args, **kwargs: pytest.fail("env made"))
    line = refusal([*TRAIN, "--out", str(tmp_path / "run"), "--num-envs", "1e9", "--total-timesteps", "1000"], capsys)
    assert "x num_envs 1,000,000,000 steps needs" in line and "--num-envs" in line


def test_a_recurrent_rollout_whose_lstm_states_cannot_fit_is_refused_before_any_env_is_made(memory_of, monkeypatch):
    """RecurrentPPO's check before the envs (and a population's estimate of a member) sized a plain rollout, 63 bytes
    per step and env for CartPole, not the LSTM states it keeps (8 KiB with an LSTM of 256): its 64 envs were made
    before the rollout itself was refused."""
    from rlspeed import RecurrentPPO
    from rlspeed.algos import base

    memory_of(2**29)  # (410 MiB may go: the 4 MiB of a plain rollout fits, the 516 MiB with the states does not)
    monkeypatch.setattr(base, "make_env", lambda *args, **kwargs: pytest.fail("env made"))
    model = RecurrentPPO("CartPole-v1", device="cpu", num_envs=64, num_steps=1024, batch_size=16 * 1024)
    with pytest.raises(UserError, match=r"^A rollout of num_steps 1,024 x num_envs 64 steps needs about 51\d\.\d MiB"):
        model.learn(1000, progress_bar=False)


def test_members_that_cannot_fit_are_refused_after_building_one(memory_of, monkeypatch, tmp_path, capsys):
    from rlspeed.population import base

    memory_of(2**26)
    built, check = [], base.check_members_fit
    monkeypatch.setattr(base, "check_members_fit",
                        lambda solo, size, device, *replay: (built.append(size), check(solo, size, device, *replay)))
    line = refusal([*TRAIN, "--out", str(tmp_path / "run"), "--seeds", "0-9999", "--total-timesteps", "1000"], capsys)
    assert "A population of 10,000 members (--seeds)" in line and "train at most" in line and "--seeds 0-" in line
    assert built == [10_000]  # (checked once, with the first member built)
    assert not (tmp_path / "run").exists()


def test_off_policy_members_whose_replay_buffers_cannot_fit_together_are_refused_after_building_one(
        memory_of, monkeypatch, tmp_path, capsys):
    """The estimate after the first member counted its networks and envs, not its replay buffer: members whose
    buffers did not fit together were all built before `check_fits` refused them. Now it counts the replay `learn`
    allocates for --total-timesteps, and names both ways out: fewer members, or the buffer_size that fits."""
    from rlspeed import SAC

    memory_of(2**30)  # (819 MiB may go: one member's 10,000,000 transitions of 40 bytes fit, four do not)
    built, made = [], SAC.__init__
    monkeypatch.setattr(SAC, "__init__",
                        lambda self, *args, **kwargs: (built.append(1), made(self, *args, **kwargs))[1])
    line = refusal(["train", "sac", "Pendulum-v1", "--seeds", "0-3", "--set", "buffer_size=1e7", "--total-timesteps",
                    "1e8", "--no-progress", "--out", str(tmp_path / "run")], capsys)
    assert "A population of 4 members (--seeds)" in line and "a replay buffer of 10,000,000 transitions" in line
    assert re.search(r"train at most 2 members at once \(for example --seeds 0-1\), or give buffer_size [\d,]+ or "
                     r"less \(--set buffer_size=\d+\)\.$", line), line
    assert len(built) == 1 and not (tmp_path / "run").exists()
    memory_of(2**28)  # (205 MiB may go: not even one member's replay fits)
    line = refusal(["train", "sac", "Pendulum-v1", "--seeds", "0", "--set", "buffer_size=1e7", "--total-timesteps",
                    "1e8", "--dry-run", "--out", str(tmp_path / "run")], capsys)
    assert line.startswith("rlspeed: error: A population of 1 member (--seeds) at "), line


def test_members_made_in_python_that_cannot_fit_are_told_the_keywords(memory_of, monkeypatch):
    """A `Population(...)` made in Python and refused for memory was told `--seeds 0-1` and `--set buffer_size=N`,
    command-line flags: it is told its keywords (`rlspeed train --seeds` the flags, above). Memory that fits is read
    once (it was read twice)."""
    import torch

    from rlspeed import SAC
    from rlspeed.buffers import replay
    from rlspeed.population import Population, base

    memory_of(2**30)  # (as above: 2 members' replays of 10,000,000 transitions fit, 4 do not)
    with base.planned_timesteps(10**8, progress_bar=False), pytest.raises(UserError) as refused:
        Population(SAC, "Pendulum-v1", seeds=[0, 1, 2, 3], buffer_size=10**7)
    assert re.search(r"^A population of 4 members \(one per seed of seeds\) at .* train at most 2 members at once "
                     r"\(for example seeds=range\(2\)\), or give buffer_size [\d,]+ or less \(buffer_size=\d+\)\.$",
                     str(refused.value)), refused.value
    solo, reads = SAC("Pendulum-v1", device="cpu"), []
    monkeypatch.setattr(replay, "available_memory",
                        lambda device, needed=None: (reads.append(needed), (2**40, replay.HOST))[1])
    base.check_members_fit(solo, 4, torch.device("cpu"), (10**7, 40, 0), base.SEEDS_KEYWORD)
    assert len(reads) == 1


def test_a_members_replay_refusal_counts_its_members_in_words(memory_of):
    """`check_member_replay_fits` of one member said 'The replay of 1 members'."""
    import torch

    from rlspeed.population.offpolicy import check_member_replay_fits

    memory_of(2**20)
    for size, members in ((1, "1 member"), (2, "2 members")):
        with pytest.raises(UserError, match=rf"^The replay of {members} \(1,000,000 transitions each, 40 bytes per "):
            check_member_replay_fits(10**6, size, 1, 40, torch.device("cpu"))


def test_members_whose_replay_fits_as_check_fits_counts_it_are_not_refused_after_building_one(memory_of, tmp_path,
                                                                                               capsys):
    """The estimate after the first member counted FrozenLake's Discrete observations at 8 bytes (int64, as the env
    gives them), where the members store them as float32 (4): 32 bytes per transition for check_fits' 24, so members
    whose replays fit were refused after the first was built. It counts them as `check_fits` does."""
    rows, per_row = 10_000_000, 24  # (each member's replay: observation and next as float32, action, 12 bytes more)
    memory_of(int(4 * rows * 28 / 0.8))  # (room for 4 members' replays at 28 bytes per transition)
    assert cli.main(["train", "dqn", "FrozenLake-v1", "--seeds", "0-3", "--num-envs", "1", "--set",
                     f"buffer_size={rows}", "--total-timesteps", str(rows), "--dry-run", "--out",
                     str(tmp_path / "run")]) == 0
    capsys.readouterr()
    memory_of(int(4 * rows * (per_row - 1) / 0.8))  # (then not: refused once the first member is built)
    line = refusal(["train", "dqn", "FrozenLake-v1", "--seeds", "0-3", "--num-envs", "1", "--set",
                    f"buffer_size={rows}", "--total-timesteps", str(rows), "--dry-run", "--out",
                    str(tmp_path / "run")], capsys)
    assert "A population of 4 members (--seeds)" in line and f"a replay buffer of {rows:,} transitions" in line


def test_a_long_population_build_says_how_far_it_is(monkeypatch, capsys):
    """--seeds 0-100000 built CartPole's members for some 7 minutes without a word: a build whose second member says
    the rest would take longer than BUILD_PROGRESS_S counts them (a bar; where stderr is no terminal, as here, status
    lines, the first at once); `planned_timesteps(..., progress_bar=False)` (--no-progress) keeps it quiet."""
    from rlspeed import PPO
    from rlspeed.population import Population, base

    monkeypatch.setattr(base, "BUILD_PROGRESS_S", 0.0)  # (any build is long)
    Population(PPO, "CartPole-v1", seeds=range(4), num_envs=1).close()
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "building members: 2/4 members (50%)" and lines[-1] == "building members: 4/4 members (100%)"
    with base.planned_timesteps(1000, progress_bar=False):
        Population(PPO, "CartPole-v1", seeds=range(4), num_envs=1).close()
    assert "building members" not in capsys.readouterr().err


def test_networks_whose_weights_cannot_fit_are_refused_before_they_are_built(memory_of, tmp_path, capsys):
    """net_arch [100000, 100000] raised torch's allocator error (from the CLI: advice to use fewer envs), and DQN's
    net_arch [1e9] allocated for minutes; the layers are named in one sentence, before anything is built."""
    import rlspeed

    memory_of(2**30)
    line = refusal([*TRAIN, "--out", str(tmp_path / "run"), "--set", "net_arch=[20000, 20000]"], capsys)
    assert "net_arch [20000, 20000] (the weights of two of its networks) needs about 3.0 GiB" in line
    assert "give smaller layers (net_arch=[64, 64] is usual)." in line and not (tmp_path / "run").exists()
    with pytest.raises(UserError, match=r"^net_arch \[64, 64\] with lstm_hidden_size 20,000 \(the weights"):
        rlspeed.RecurrentPPO("CartPole-v1", device="cpu", lstm_hidden_size=20_000)
    assert rlspeed.DQN("CartPole-v1", device="cpu", net_arch=[256, 256]).config.net_arch == (256, 256)


def test_n_epochs_beyond_its_bound_is_one_sentence(tmp_path, capsys):
    line = refusal([*TRAIN, "--out", str(tmp_path / "run"), "--set", "n_epochs=1e9"], capsys)
    assert "n_epochs must be at most 10,000" in line and "got 1,000,000,000" in line
    assert not (tmp_path / "run").exists()


def test_report_reps_beyond_its_bound_is_one_sentence(tmp_path, capsys):
    code = cli.main(["report", str(tmp_path), "--reps", "1e12"])
    err = capsys.readouterr().err
    assert code == 2 and "--reps must be at most 10,000,000 " in err and "got 1,000,000,000,000." in err, err
