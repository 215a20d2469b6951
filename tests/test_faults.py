"""Fault injection: bad flags, damaged checkpoints, a full disk, kills and signals, envs that fail, too little memory.

Each fault must end in one clear sentence (a UserError; exit code 2 from the command line) or in a run that keeps what
it had written, never in a traceback or in silently wrong results. Fast: `pytest -m faults`.
"""

from __future__ import annotations

import errno
import json
import math
import os
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
import weakref
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlspeed import PPO, UserError, checkpoint, cli
from rlspeed.buffers.replay import ReplayBuffer
from rlspeed.checkpoint import load_checkpoint, save_checkpoint, tensor_digest
from rlspeed.envs import EnvStepError, make_env

pytestmark = pytest.mark.faults

TINY = {"num_envs": 4, "num_steps": 32, "batch_size": 64, "n_epochs": 2}
TRAIN = ["train", "ppo", "CartPole-v1", "--no-progress", "--target-return", "none", "--set", "num_steps=32"]


def assert_one_line_error(code: int, captured, expected: str) -> None:
    assert code == 2, captured.err
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlspeed: error:"), captured.err
    assert expected in lines[0], lines[0]
    assert "Traceback" not in captured.err + captured.out


# --- bad flags ------------------------------------------------------------------------------------------------------

BAD_FLAGS = {
    "total-timesteps-0": (["--total-timesteps", "0"], "--total-timesteps must be positive"),
    "total-timesteps-negative": (["--total-timesteps", "-5"], "--total-timesteps must be positive"),
    "total-timesteps-fraction": (["--total-timesteps", "1.5"], "--total-timesteps must be a whole number"),
    "total-timesteps-text": (["--total-timesteps", "lots"], "--total-timesteps must be a whole number"),
    "total-timesteps-huge": (["--total-timesteps", "1e99"], "--total-timesteps must be at most 9,223,372,036,854,775"),
    "eval-freq-negative": (["--eval-freq", "-1"], "--eval-freq must be positive"),
    "eval-freq-0": (["--eval-freq", "0"], "--eval-freq must be positive"),
    "checkpoint-freq-negative": (["--checkpoint-freq", "-5"], "--checkpoint-freq must be positive"),
    "checkpoint-freq-0": (["--checkpoint-freq", "0"], "--checkpoint-freq must be positive"),
    "threads-0": (["--threads", "0"], "--threads must be positive"),
    "threads-negative": (["--threads", "-1"], "--threads must be positive"),
    "num-envs-0": (["--num-envs", "0"], "--num-envs must be positive"),
    "seed-negative": (["--seed", "-1"], "--seed must be >= 0"),
    "seed-too-big": (["--seed", str(2**64)], "--seed must be at most"),
    "nproc-0": (["--nproc", "0"], "--nproc must be positive"),
    "max-restarts-negative": (["--max-restarts", "-1"], "--max-restarts must be >= 0"),
    "target-return-nan": (["--target-return", "nan"], "--target-return must be a number or 'none'"),
    "target-return-inf": (["--target-return", "inf"], "--target-return must be a number or 'none'"),
    "set-learning-rate-inf": (["--set", "learning_rate=inf"], "finite"),
    "set-learning-rate-yaml-nan": (["--set", "learning_rate=.nan"], "finite"),
    "set-no-key": (["--set", "=3"], "no key"),
    "set-total-timesteps-0": (["--set", "total_timesteps=0"], "total_timesteps"),
    "unknown-flag": (["--bogus", "5"], "unrecognized arguments"),
    "bad-choice": (["--env-backend", "jax"], "--env-backend"),
}


@pytest.mark.parametrize("case", list(BAD_FLAGS))
def test_a_bad_train_flag_is_one_sentence_and_exit_2(case, capsys):
    args, expected = BAD_FLAGS[case]
    assert_one_line_error(cli.main([*TRAIN, *args]), capsys.readouterr(), expected)


@pytest.mark.parametrize("args, expected", [
    (["--episodes", "0"], "--episodes must be positive"),
    (["--episodes", "-3"], "--episodes must be positive"),
    (["--seed", "x"], "--seed must be a whole number"),
    (["--episodes", "1e99"], "--episodes must be at most 9,223,372,036,854,775,807, got '1e99'"),  # (no overflow)
])
def test_a_bad_eval_flag_is_one_sentence_and_exit_2(args, expected, capsys):
    assert_one_line_error(cli.main(["eval", "model.safetensors", *args]), capsys.readouterr(), expected)


def test_profile_steps_0_is_one_sentence(capsys):
    assert_one_line_error(cli.main(["profile", "ppo", "CartPole-v1", "--steps", "0"]), capsys.readouterr(),
                          "--steps must be positive")


def test_num_envs_that_nproc_does_not_divide_is_refused_before_torchrun(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(subprocess, "Popen", lambda command, **kwargs: calls.append(command))
    code = cli.main([*TRAIN, "--num-envs", "3", "--nproc", "2"])
    assert_one_line_error(code, capsys.readouterr(), "num_envs (3) must be a multiple of --nproc (2)")
    assert calls == []  # torchrun never started


def test_batch_size_larger_than_the_rollout_is_said(capsys):
    """(a warning: the CLI prints it as `rlspeed: warning: ...`, the Python API warns where the model is made)"""
    from rlspeed.errors import UnusedSettingWarning

    with pytest.warns(UnusedSettingWarning, match=r"batch_size 100,000 is larger than a rollout \(num_envs 8 x "
                                                  r"num_steps 32 = 256 steps\)"):
        code = cli.main([*TRAIN, "--total-timesteps", "256", "--num-envs", "8", "--set", "batch_size=100000",
                         "--out", "big-batch"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "num_envs=" not in captured.err  # (--num-envs is no preset value kept)


# --- run directories ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("code", "busy"), [("EWOULDBLOCK", True), ("ENOSYS", False), ("ENOLCK", False)])
def test_only_a_held_lock_means_another_process_is_training(tmp_path, monkeypatch, code, busy):
    """A lock another process holds (EWOULDBLOCK) refuses the run; a filesystem without locks (Lustre without flock:
    ENOSYS, NFS without a lock daemon: ENOLCK) warns that nothing guards the directory and goes on."""
    import errno
    import fcntl

    from rlspeed.locks import hold_lock

    def flock(handle, operation):
        raise OSError(getattr(errno, code), os.strerror(getattr(errno, code)))

    monkeypatch.setattr(fcntl, "flock", flock)
    held = {}
    if busy:
        with pytest.raises(UserError, match="another process"):
            hold_lock(tmp_path / "lock", held, "another process holds it")
    else:
        with pytest.warns(UserWarning, match="the filesystem has no file locks"):
            hold_lock(tmp_path / "lock", held, "another process holds it")
    assert held == {}


def test_an_unwritable_out_directory_is_one_sentence(tmp_path, capsys):
    out = tmp_path / "locked"
    out.mkdir()
    if os.geteuid() != 0:
        out.chmod(0o555)
    elif subprocess.run(["chattr", "+i", str(out)], capture_output=True).returncode != 0:
        pytest.skip("running as root without chattr: cannot make a directory unwritable")
    try:
        code = cli.main([*TRAIN, "--total-timesteps", "256", "--out", str(out)])
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(out)], check=True)
        out.chmod(0o755)
    assert_one_line_error(code, capsys.readouterr(), "Cannot write to the run directory")


def test_out_under_a_regular_file_is_one_sentence(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    code = cli.main([*TRAIN, "--total-timesteps", "256", "--out", str(tmp_path / "file" / "run")])
    assert_one_line_error(code, capsys.readouterr(), "Cannot create the run directory")


# --- checkpoints ----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A small trained PPO model saved to a file; tests damage copies of its bytes."""
    path = tmp_path_factory.mktemp("ckpt") / "model.safetensors"
    PPO("CartPole-v1", seed=0, device="cpu", **TINY).learn(256, progress_bar=False).save(path)
    return path


def _parts(path: Path) -> tuple[int, dict, bytes]:
    data = path.read_bytes()
    header_len = int.from_bytes(data[:8], "little")
    return header_len, json.loads(data[8:8 + header_len]), data


def _resave(path: Path, target: Path, edit) -> Path:
    """`path`'s tensors and metadata after `edit(tensors, metadata)`, written with a fresh (valid) digest."""
    tensors, meta = load_checkpoint(path)
    edit(tensors, meta)
    for key in ("format", "version", "digest"):
        meta.pop(key, None)
    return save_checkpoint(target, tensors, meta)


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_flipped_bytes_in_tensor_data_fail_the_digest(saved, tmp_path, where):
    header_len, _, data = _parts(saved)
    start = 8 + header_len
    offset = {"first": start, "middle": (start + len(data)) // 2, "last": len(data) - 4}[where]
    damaged = bytearray(data)
    for i in range(offset, offset + 4):
        damaged[i] ^= 0xFF
    target = tmp_path / "flipped.safetensors"
    target.write_bytes(bytes(damaged))
    with pytest.raises(UserError, match=r"flipped\.safetensors' does not match its SHA256 digest"):
        load_checkpoint(target)
    with pytest.raises(UserError, match="does not match"):
        PPO.load(target, device="cpu")
    tensors, _ = load_checkpoint(target, verify=False)  # the override: the bytes are loaded as they are
    assert tensors


def test_edited_metadata_fails_the_digest(saved, tmp_path):
    header_len, header, data = _parts(saved)
    meta = json.loads(header["__metadata__"]["rlspeed"])
    meta["config"]["gamma"] = 0.5
    header["__metadata__"]["rlspeed"] = json.dumps(meta)
    encoded = json.dumps(header).encode()
    target = tmp_path / "edited.safetensors"
    target.write_bytes(len(encoded).to_bytes(8, "little") + encoded + data[8 + header_len:])
    with pytest.raises(UserError, match="does not match its SHA256 digest"):
        load_checkpoint(target)


@pytest.mark.parametrize("keep", [0, 7, 8, 100, "half-header", "half-data", "all-but-one"])
def test_truncated_checkpoint_is_a_user_error_naming_the_file(saved, tmp_path, keep):
    header_len, _, data = _parts(saved)
    size = {"half-header": 8 + header_len // 2, "half-data": (8 + header_len + len(data)) // 2,
            "all-but-one": len(data) - 1}.get(keep, keep)
    target = tmp_path / "truncated.safetensors"
    target.write_bytes(data[:size])
    with pytest.raises(UserError, match="truncated.safetensors"):
        load_checkpoint(target)


def test_removed_digest_is_refused_unless_verify_is_off(saved, tmp_path):
    header_len, header, data = _parts(saved)
    meta = json.loads(header["__metadata__"]["rlspeed"])
    del meta["digest"]
    header["__metadata__"]["rlspeed"] = json.dumps(meta)
    encoded = json.dumps(header).encode()
    target = tmp_path / "nodigest.safetensors"
    target.write_bytes(len(encoded).to_bytes(8, "little") + encoded + data[8 + header_len:])
    with pytest.raises(UserError, match="carries no digest"):
        load_checkpoint(target)
    assert load_checkpoint(target, verify=False)[1]["algo"] == "ppo"


STRUCTURE_FAULTS = {
    "box-without-low": lambda t, m: m.update(action_space={"type": "box", "shape": [1], "high": [1.0]}),
    "unknown-space-type": lambda t, m: m.update(action_space={"type": "dict"}),
    "discrete-without-n": lambda t, m: m.update(action_space={"type": "discrete"}),
    "config-is-a-list": lambda t, m: m.update(config=[1, 2]),
    "no-env-id": lambda t, m: m.pop("env_id"),
    "observation-shape-text": lambda t, m: m.update(observation_shape="4"),
    "num-timesteps-text": lambda t, m: m.update(num_timesteps="many"),
    "optimizer-groups-not-a-list": lambda t, m: m.update(optimizers={"policy": 3}),
    "env-kwargs-a-list": lambda t, m: m.update(env_kwargs=[1, 2]),
    "observation-space-text": lambda t, m: m.update(observation_space="zz"),
    "observation-space-box-without-shape": lambda t, m: m.update(observation_space={"type": "box"}),
    "observation-shape-huge": lambda t, m: m.update(observation_shape=[10**9, 10**9]),
    "observation-space-box-huge": lambda t, m: m.update(observation_space={"type": "box", "shape": [100000, 100000],
                                                                           "low": None, "high": None}),
}


@pytest.mark.parametrize("case", list(STRUCTURE_FAULTS))
def test_valid_json_metadata_of_the_wrong_structure_is_a_user_error(saved, tmp_path, case, capsys):
    target = _resave(saved, tmp_path / f"{case}.safetensors", STRUCTURE_FAULTS[case])
    with pytest.raises(UserError, match=f"'{target}' is not a usable model checkpoint"):
        PPO.load(target, device="cpu")
    assert_one_line_error(cli.main(["eval", str(target), "--episodes", "1"]), capsys.readouterr(),
                          "is not a usable model checkpoint")
    assert_one_line_error(cli.main(["export", str(target), "--out", str(tmp_path / "policy.pt"),
                                    "--format", "torchscript"]), capsys.readouterr(),
                          "is not a usable model checkpoint")


def test_resume_state_of_another_shape_is_refused_or_set_aside(saved, tmp_path):
    """Optimizer moments of another shape than their parameter's failed inside the first update (a size mismatch in
    Adam's step); saved observations of another shape failed in the first forward pass. The moments are refused in
    one sentence naming the tensor; the observations are set aside (fresh episodes, said in a warning)."""
    def moment(tensors, meta):
        name = next(k for k in tensors if k.startswith("optim.") and k.endswith(".exp_avg"))
        tensors[name] = torch.zeros(3, 3)

    target = _resave(saved, tmp_path / "moment.safetensors", moment)
    with pytest.raises(UserError, match=r"The checkpoint's 'optim\.\w+\.\d+\.exp_avg' has shape \(3, 3\)"):
        PPO("CartPole-v1", seed=0, device="cpu", **TINY).resume(target)

    native = PPO("CartPole-v1", seed=0, device="cpu", env_backend="torch", **TINY).learn(128, progress_bar=False)
    path = native.save(tmp_path / "native")
    assert load_checkpoint(path)[0]["resume.obs"].shape == (4, 4)  # (native envs save their observations)
    target = _resave(path, tmp_path / "obs.safetensors", lambda tensors, meta: tensors.update(
        {"resume.obs": torch.zeros(1)}))
    model = PPO("CartPole-v1", seed=0, device="cpu", env_backend="torch", **TINY)
    model.resume(target)
    with pytest.warns(UserWarning, match=r"the checkpoint's observations have shape \(1,\), these envs' \(4, 4\)"):
        model.learn(64, progress_bar=False)


def test_nan_in_a_bias_is_refused_unless_allowed(saved, tmp_path, capsys):
    def poison(tensors, meta):
        name = next(k for k in tensors if "bias" in k and not k.startswith("optim."))
        tensors[name].view(-1)[0] = math.nan

    target = _resave(saved, tmp_path / "nan.safetensors", poison)
    with pytest.raises(UserError, match="holds NaN or infinite values"):
        load_checkpoint(target)
    assert_one_line_error(cli.main(["eval", str(target), "--episodes", "1"]), capsys.readouterr(),
                          "holds NaN or infinite values")
    tensors, _ = load_checkpoint(target, allow_nonfinite=True)
    assert any(torch.isnan(t).any() for t in tensors.values() if t.is_floating_point())


@pytest.mark.parametrize("fault", ["missing", "mis-shaped"])
def test_a_missing_or_mis_shaped_tensor_is_one_sentence_from_eval(saved, tmp_path, fault, capsys):
    def edit(tensors, meta):
        name = next(k for k in tensors if "weight" in k and not k.startswith("optim."))
        if fault == "missing":
            del tensors[name]
        else:
            tensors[name] = torch.zeros(3, 5)

    target = _resave(saved, tmp_path / f"{fault}.safetensors", edit)
    assert_one_line_error(cli.main(["eval", str(target), "--episodes", "1"]), capsys.readouterr(), str(target))


def test_resume_with_a_changed_net_arch_is_one_sentence(tmp_path, capsys):
    out = tmp_path / "run"
    base = [*TRAIN, "--out", str(out), "--num-envs", "4", "--set", "batch_size=64", "--total-timesteps", "512",
            "--checkpoint-freq", "128"]
    assert cli.main(base) == 0
    capsys.readouterr()
    code = cli.main([*base, "--resume", "--total-timesteps", "1024", "--set", "net_arch=[16]"])
    assert_one_line_error(code, capsys.readouterr(), "holds networks built with net_arch=(64, 64), this model has "
                                                     "net_arch=(16,)")


def test_sm3_digest_detects_tampering(tmp_path):
    tensors = {"w": torch.arange(6.0).reshape(2, 3)}
    path = save_checkpoint(tmp_path / "sm3", tensors, {"note": "x"}, digest="sm3")
    loaded, meta = load_checkpoint(path)
    assert meta["digest"]["algorithm"] == "sm3" and torch.equal(loaded["w"], tensors["w"])
    assert meta["digest"]["value"] == tensor_digest(tensors, meta, "sm3") != tensor_digest(tensors, meta, "sha256")
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(UserError, match="SM3 digest"):
        load_checkpoint(path)


def test_a_checkpoint_without_digest_from_format_1_loads_with_a_warning(tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "old.safetensors"
    save_file({"w": torch.ones(2)}, str(path), metadata={"rlspeed": json.dumps({"format": "rlspeed-checkpoint",
                                                                                "version": 1})})
    with pytest.warns(UserWarning, match="before checkpoints carried a digest"):
        tensors, _ = load_checkpoint(path)
    assert torch.equal(tensors["w"], torch.ones(2))


def test_stale_temporary_files_of_dead_writers_are_removed(tmp_path):
    """The next write of a checkpoint removes what killed writes of it left; a load removes nothing (on storage that
    machines share, a writer on another machine has a process id unknown here), nor does a write remove files whose
    name save_checkpoint does not make, or another checkpoint's (`a[bc]` is no glob pattern for `ab`)."""
    path = save_checkpoint(tmp_path / "model", {"w": torch.ones(2)}, {})
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".model.safetensors.{dead.pid}.abc123.tmp"
    stale.write_bytes(b"half a checkpoint")
    alive = tmp_path / f".model.safetensors.{os.getppid()}.def456.tmp"  # a running writer's file is kept
    alive.write_bytes(b"being written")
    notes = tmp_path / ".model.safetensors.notes.tmp"  # a user's
    notes.write_text("mine")
    load_checkpoint(path)
    assert stale.exists() and alive.exists()
    save_checkpoint(path, {"w": torch.zeros(2)}, {})
    assert not stale.exists() and alive.exists() and notes.exists()
    other = tmp_path / f".ab.safetensors.{dead.pid}.abc123.tmp"
    other.write_bytes(b"another checkpoint's")
    save_checkpoint(tmp_path / "a[bc]", {"w": torch.zeros(2)}, {})
    assert other.exists()
    # a killed writer with this process's id (a container's process often has the id of the one before it): its
    # file, older than this process, is stale too; one written since it started may be its own (another thread's)
    own = tmp_path / f".model.safetensors.{os.getpid()}.ghi789.tmp"
    writing = tmp_path / f".model.safetensors.{os.getpid()}.jkl012.tmp"
    own.write_bytes(b"half a checkpoint")
    writing.write_bytes(b"being written")
    before = checkpoint._STARTED - 60
    os.utime(own, (before, before))
    save_checkpoint(path, {"w": torch.zeros(2)}, {})
    assert not own.exists() and writing.exists()


def test_a_failure_closing_the_logs_does_not_hide_the_error_that_stopped_training(tmp_path, monkeypatch):
    """A checkpoint write that failed (a full disk) was replaced by the logger's own failure in learn's cleanup,
    which named metrics.csv for a plot that could not be written: the first error is raised, the second warned."""
    from rlspeed.logging import RunLogger

    model = PPO("CartPole-v1", device="cpu", num_envs=2, num_steps=16, env_backend="torch")

    def full(*args, **kwargs):
        raise UserError("Cannot write the checkpoint (No space left on device)")

    def plot(self):
        raise OSError(28, "No space left on device", str(self.run_dir / "learning_curve.png"))

    monkeypatch.setattr(model, "save", full)
    monkeypatch.setattr(RunLogger, "plot", plot)
    with pytest.raises(UserError, match="Cannot write the checkpoint"), pytest.warns(
            UserWarning, match=r"learning_curve.png.*after the error below"):
        model.learn(64, progress_bar=False, run_dir=tmp_path / "run", checkpoint_freq=32)


FULL_DISK = textwrap.dedent("""
    import resource, signal, sys, torch
    from rlspeed.checkpoint import save_checkpoint
    from rlspeed.errors import UserError
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), int(sys.argv[2])))
    try:
        save_checkpoint(sys.argv[1], {"w": torch.ones(100_000)}, {"run": "second"})
    except UserError as error:
        print(error)
        sys.exit(2)
""")


def test_a_full_disk_is_a_user_error_and_keeps_the_old_checkpoint(tmp_path):
    path = save_checkpoint(tmp_path / "model", {"w": torch.zeros(10)}, {"run": "first"})
    before = path.read_bytes()
    completed = subprocess.run([sys.executable, "-c", FULL_DISK, str(path), "65536"], capture_output=True, text=True,
                               timeout=120)
    assert completed.returncode == 2, completed.stderr
    assert "Cannot write the checkpoint" in completed.stdout and "unchanged" in completed.stdout
    assert "Traceback" not in completed.stderr
    assert path.read_bytes() == before
    assert load_checkpoint(path)[1]["run"] == "first"
    assert list(tmp_path.glob("*.tmp")) + list(tmp_path.glob(".*.tmp")) == []


def _full_disk_for(monkeypatch, name: str) -> None:
    """Writes that would put a file named `name` in place fail as on a full disk (the rename of its temporary file)."""
    replace = os.replace

    def full(source, target, *args, **kwargs):
        if Path(target).name == name:
            raise OSError(errno.ENOSPC, "No space left on device")
        return replace(source, target, *args, **kwargs)

    monkeypatch.setattr(checkpoint.os, "replace", full)


def _replay_saver(kind: str, run: Path):
    """A model (`solo`) or population of DQN with `save_replay_buffer`, trained with checkpoints in `run`."""
    from rlspeed import DQN
    from rlspeed.population import Population

    settings = dict(learning_starts=32, batch_size=16, buffer_size=400, net_arch=(8,), save_replay_buffer=True)
    model = (DQN("CartPole-v1", seed=0, device="cpu", **settings) if kind == "solo"
             else Population(DQN, "CartPole-v1", seeds=[0, 1], device="cpu", **settings))
    model.learn(128, run_dir=run, checkpoint_freq=64)
    return model


@pytest.mark.parametrize("kind", ["solo", "population"])
def test_a_checkpoint_the_disk_cannot_hold_leaves_no_staged_replay_buffer(tmp_path, monkeypatch, kind):
    """The replay buffer is written (to its staged name) before its checkpoint: where the checkpoint then did not fit,
    the staged file, a whole buffer's size that pairs with no checkpoint, stayed on the full disk. The previous
    checkpoint and its replay buffer stay as they were."""
    run = tmp_path / "run"
    model = _replay_saver(kind, run)
    before = {path.name: path.read_bytes() for path in run.glob("*.safetensors")}
    assert sorted(before) == ["checkpoint.replay.safetensors", "checkpoint.safetensors"]
    _full_disk_for(monkeypatch, "checkpoint.safetensors")
    with pytest.raises(UserError, match=r"Cannot write the checkpoint .*checkpoint.safetensors' \(No space left on "
                                        r"device\); an earlier checkpoint there is unchanged"):
        model.save(run / "checkpoint.safetensors")
    assert {path.name: path.read_bytes() for path in run.glob("*.safetensors")} == before
    assert [path.name for path in run.iterdir() if path.name.startswith(".") and path.suffix == ".tmp"] == []


def test_a_replay_buffer_the_disk_cannot_hold_is_named_as_the_file_it_is_written_for(tmp_path, monkeypatch):
    """The replay buffer's failed write named its staged file (`checkpoint.replay.next.safetensors`) and said that no
    earlier file of that name existed, as if nothing had been kept: it names the replay buffer's file, kept as it was
    with its checkpoint."""
    run = tmp_path / "run"
    model = _replay_saver("solo", run)
    before = {path.name: path.read_bytes() for path in run.glob("*.safetensors")}
    _full_disk_for(monkeypatch, "checkpoint.replay.next.safetensors")
    with pytest.raises(UserError) as raised:
        model.save(run / "checkpoint.safetensors")
    assert str(raised.value) == (f"Cannot write the checkpoint '{run / 'checkpoint.replay.safetensors'}' (No space "
                                 "left on device); an earlier checkpoint there is unchanged.")
    assert {path.name: path.read_bytes() for path in run.glob("*.safetensors")} == before


def test_a_replay_buffer_the_disk_has_no_room_for_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    """Each checkpoint's replay buffer is written beside the previous one, which stays until the new one is whole: on
    a disk without room for it the write ran until the disk was full (a full 1,000,000-transition Atari buffer is
    7.6 GB; other writers, metrics.csv, failed meanwhile) before it was refused. Now the free space is checked first:
    one sentence naming the bytes needed (the file's exact size) and free, nothing written, the previous pair kept."""
    import re
    import shutil
    import types

    run = tmp_path / "run"
    model = _replay_saver("solo", run)
    before = {path.name: path.read_bytes() for path in run.iterdir() if path.is_file()}
    free = len(before["checkpoint.replay.safetensors"]) - 1
    monkeypatch.setattr(shutil, "disk_usage", lambda directory: types.SimpleNamespace(total=2**40, free=free))
    opened = []
    mkstemp = checkpoint.tempfile.mkstemp
    monkeypatch.setattr(checkpoint.tempfile, "mkstemp", lambda *args, **kwargs: opened.append(kwargs) or mkstemp(
        *args, **kwargs))
    with pytest.raises(UserError) as raised:
        model.save(run / "checkpoint.safetensors")
    replay = re.escape(str(run / "checkpoint.replay.safetensors"))
    assert re.fullmatch(rf"Cannot write the checkpoint '{replay}': it needs {free + 1:,} bytes \(7\.4 KiB\) and the "
                        rf"disk holding it has {free:,} bytes \(7\.4 KiB\) free; an earlier checkpoint there is "
                        r"unchanged\.", str(raised.value))
    assert opened == [] and {path.name: path.read_bytes() for path in run.iterdir() if path.is_file()} == before


def test_save_replay_buffer_says_at_the_start_when_the_disk_cannot_hold_its_checkpoints(tmp_path, monkeypatch, capsys):
    """--save-replay-buffer's checkpoints grow with the buffer, and each is written beside the previous one: a disk
    with room for the first checkpoints but not for two full buffers' files stopped the run hours in, at the first
    that did not fit. It is said when training starts, with the bytes needed and free; a disk with room says nothing."""
    import shutil
    import types

    free = 1_500_000  # (the 20,000-transition buffer is 1,040,000 bytes: two files need 2,080,000)
    monkeypatch.setattr(shutil, "disk_usage", lambda directory: types.SimpleNamespace(total=2**40, free=free))
    argv = ["train", "dqn", "CartPole-v1", "--total-timesteps", "256", "--set", "learning_starts=64", "--set",
            "buffer_size=20000", "--save-replay-buffer", "--target-return", "none", "--no-progress", "--quiet"]
    assert cli.main([*argv, "--out", str(tmp_path / "short")]) == 0  # (256 transitions fit: the run goes on)
    said = [line for line in capsys.readouterr().err.splitlines() if "--save-replay-buffer needs" in line]
    assert said == [f"rlspeed: warning: --save-replay-buffer needs 2.0 MiB more disk once the replay buffer is full "
                    f"(each checkpoint writes its 1.0 MiB replay file beside the previous one) and the disk holding "
                    f"'{tmp_path / 'short'}' has 1.4 MiB free: the run stops at the first checkpoint that does not fit "
                    "unless space is freed there (or buffer_size is smaller)."]
    free = 2_100_000
    assert cli.main([*argv, "--out", str(tmp_path / "room")]) == 0
    assert "--save-replay-buffer needs" not in capsys.readouterr().err


@pytest.mark.parametrize("total", [0, 2**40], ids=["no-total", "total"])
def test_a_disk_that_says_nothing_free_does_not_refuse_checkpoints(tmp_path, monkeypatch, capsys, total):
    """Some FUSE file systems report 0 bytes free (and 0 in total) while writes succeed: the free-space check refused
    every checkpoint's replay buffer there, and the CLI warned that the run would stop. Nothing free is read as "not
    known" (a disk that is really full fails the write itself, which then has nothing left to fill)."""
    import shutil
    import types

    monkeypatch.setattr(shutil, "disk_usage", lambda directory: types.SimpleNamespace(total=total, used=0, free=0))
    run = tmp_path / "run"
    model = _replay_saver("solo", run)
    model.save(run / "checkpoint.safetensors")
    assert (run / "checkpoint.replay.safetensors").stat().st_size > 0
    argv = ["train", "dqn", "CartPole-v1", "--total-timesteps", "128", "--set", "learning_starts=64", "--set",
            "buffer_size=20000", "--save-replay-buffer", "--target-return", "none", "--no-progress", "--quiet"]
    assert cli.main([*argv, "--out", str(tmp_path / "cli")]) == 0
    assert "--save-replay-buffer needs" not in capsys.readouterr().err


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_run_directory_gone_while_training_stops_the_run_rather_than_make_it_anew(tmp_path, how):
    """The run directory deleted, moved aside or unmounted during training (a lazy unmount, a network share gone): the
    next checkpoint's save made the directory anew at its path (under the mount point, on the local disk) and the run
    wrote its checkpoint, model and summary there, beside neither its config nor its metrics, and ended as if nothing
    had happened. It stops with one sentence, and nothing is written at that path."""
    import shutil

    run = tmp_path / "run"
    model = PPO("CartPole-v1", seed=0, device="cpu", env_backend="torch", **TINY)

    def away(local) -> bool:
        if model.num_timesteps >= 256 and run.exists() and not (tmp_path / "moved").exists():
            shutil.move(run, tmp_path / "moved")
            if how == "replaced":  # (another directory at its path: the empty mount point under an unmounted share)
                run.mkdir()
        return True

    with pytest.raises(UserError, match=r"The run directory '.*run' is gone or another is in its place"):
        model.learn(4096, progress_bar=False, run_dir=run, checkpoint_freq=128, callback=away)
    assert (tmp_path / "moved" / "checkpoint.safetensors").is_file()
    if how == "replaced":
        assert list(run.iterdir()) == []
    else:
        assert not run.exists()


def _summary_json_does_not_fit(monkeypatch) -> None:
    """A full disk for summary.json only (the model and checkpoints are written)."""
    from rlspeed import files

    write = files.write_atomic

    def full(path, text):
        if path.name == "summary.json":
            raise OSError(errno.ENOSPC, "No space left on device")
        write(path, text)

    monkeypatch.setattr(files, "write_atomic", full)


def _final_seed(run) -> int:
    """The seed of the final evaluation of the seed-0 run in `run` (`evaluation_seed`, at the model's steps)."""
    from rlspeed.evaluation import evaluation_seed

    return evaluation_seed(0, "final", PPO.load(run / "model.safetensors").num_timesteps)


@pytest.mark.parametrize("checkpoints", [False, True])
def test_a_summary_the_disk_cannot_hold_says_the_model_is_saved_and_its_evaluation(tmp_path, monkeypatch, capsys,
                                                                                     checkpoints):
    """summary.json that did not fit on the disk at the end of a run was "Cannot write 'run/summary.json': No space
    left on device." and no more: the final evaluation just made was lost, and nothing said that the trained model
    was saved, nor how to get its summary (a run without a checkpoint cannot be finished by --resume)."""
    import re

    _summary_json_does_not_fit(monkeypatch)
    run = tmp_path / "run"
    code = cli.main([*TRAIN, "--total-timesteps", "256", "--out", str(run), "--set", "num_envs=4", "--set",
                     "batch_size=64", *(["--checkpoint-freq", "128"] if checkpoints else [])])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and (run / "model.safetensors").is_file() and not (run / "summary.json").exists()
    then = ("--resume writes it, evaluating the model again, once there is room" if checkpoints
            else f"rlspeed eval {run} --seed {_final_seed(run)} repeats the evaluation")
    assert re.fullmatch(re.escape(f"rlspeed: error: Cannot write '{run / 'summary.json'}': No space left on device; "
                                  f"the trained model is saved in {run / 'model.safetensors'} (final evaluation ")
                        + r"[-0-9.]+ \+/- [-0-9.]+" + re.escape(f"), and {then}."), error), error


def test_the_evaluation_a_full_disk_lost_is_repeated_with_the_runs_eval_episodes(tmp_path, monkeypatch, capsys):
    """With `--eval-episodes 3`, the `rlspeed eval` command the full disk's error gives plays the final evaluation's
    3 episodes (`--episodes 3`: without it, rlspeed eval's 10 gave another result) and repeats its mean."""
    import re

    _summary_json_does_not_fit(monkeypatch)
    run = tmp_path / "run"
    code = cli.main([*TRAIN, "--total-timesteps", "256", "--out", str(run), "--set", "num_envs=4", "--set",
                     "batch_size=64", "--eval-episodes", "3"])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2, error
    found = re.search(r"\(final evaluation ([-0-9.]+) \+/- [-0-9.]+\), and (rlspeed eval .*) repeats the evaluation\.$",
                      error)
    assert found and found[2] == f"rlspeed eval {run} --seed {_final_seed(run)} --episodes 3", error
    assert cli.main([*found[2].split()[1:], "--json"]) == 0
    assert cli._score(json.loads(capsys.readouterr().out)["mean"]) == found[1]


CUT_PLOT = textwrap.dedent("""
    import resource, signal, sys
    from pathlib import Path
    from rlspeed.logging import RunLogger
    from rlspeed.population.plot import plot_learning_curves
    def draw(run, plot, points):
        if plot == "run":
            logger = RunLogger(run, tensorboard=False)
            for step in range(1, points + 1):
                logger.log({"timesteps": step * 100, "episode_return": float(step % 7), "eval_mean": float(step)})
            logger.plot()
        else:
            curve = [[step * 100, float(step % 7)] for step in range(1, points + 1)]
            plot_learning_curves({"algo": "ppo", "env_id": "CartPole-v1", "members": [{"curve": curve}] * 2},
                                 run / "learning_curves.png")
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG, cut short
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    for plot in sys.argv[2:]:
        run = Path(sys.argv[1]) / plot
        run.mkdir()
        draw(run, plot, 3)
        size = sum(path.stat().st_size for path in run.glob("learning_curve*.png"))
        resource.setrlimit(resource.RLIMIT_FSIZE, (size // 2, hard))
        try:
            draw(run, plot, 300)
            print(plot, "written whole")
        except OSError as error:
            print(plot, error.filename)
        resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
""")


@pytest.fixture(scope="module")
def cut_plots(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """The folder of CUT_PLOT's run and population, each of which drew its plot whole and then again past a file size
    limit of half that; what each write cut short said (the file its error named), by kind (one process for both)."""
    root = tmp_path_factory.mktemp("cut-plots")
    completed = subprocess.run([sys.executable, "-c", CUT_PLOT, str(root), "run", "population"], capture_output=True,
                               text=True, timeout=120, env={**os.environ, "MPLBACKEND": "Agg"})
    assert completed.returncode == 0, completed.stderr
    return root, dict(line.split(" ", 1) for line in completed.stdout.splitlines())


@pytest.mark.parametrize("plot", ["run", "population"])
def test_a_plot_write_cut_short_keeps_the_previous_plot_whole(cut_plots, plot):
    """A kill (or a full disk) while learning_curve.png / learning_curves.png is written left a truncated image,
    which a resumed run that had nothing left to train kept: the plot is written whole or not at all."""
    from PIL import Image

    root, said = cut_plots
    (path,) = (root / plot).glob("learning_curve*.png")
    assert said[plot] == str(path)  # (the error names the plot, not a temporary file)
    with Image.open(path) as image:
        image.load()  # (a truncated PNG raises here)
    assert list((root / plot).glob(".*.tmp")) == []


# --- kills and signals ----------------------------------------------------------------------------------------------

def _sigint_default() -> None:
    """In the child before it starts: Ctrl-C's default action, which Python turns into KeyboardInterrupt (a shell
    starts background jobs, such as a test run with `&`, with SIGINT ignored, and children inherit that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_training(out: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "RLSPEED_NUM_THREADS": "1", "MPLBACKEND": "Agg", "PYTHONUNBUFFERED": "1"}
    env.pop("RLSPEED_DEVICE", None)
    return subprocess.Popen([sys.executable, "-m", "rlspeed", *TRAIN, "--total-timesteps", "1e8", "--out", str(out),
                             "--device", "cpu", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, preexec_fn=_sigint_default)


def _wait_for(condition, process: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            raise AssertionError(f"exited early with {process.returncode}: {process.communicate()}")
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError("timed out")
        time.sleep(0.1)


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 143)])
def test_a_signal_during_training_saves_the_model_and_summary(tmp_path, sig, code):
    """Ctrl-C, a scheduler's SIGTERM (or SLURM's --signal warning, SIGUSR1/SIGUSR2, which take SIGTERM's handler:
    test_a_signal_the_process_was_started_ignoring_stays_ignored) and a closed terminal's SIGHUP stop at the end of
    the iteration with the model, a checkpoint and the summary saved, naming the signal."""
    out = tmp_path / "run"
    process = _start_training(out, "--num-envs", "8")  # (iterations of 256 steps)
    try:
        _wait_for(lambda: (out / "metrics.csv").exists(), process)  # the loop runs: it logged a row
        process.send_signal(sig)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == code, stderr
    assert "Traceback" not in stderr and "interrupted" in stderr
    assert f"interrupted ({'Ctrl-C' if sig == signal.SIGINT else signal.Signals(sig).name})" in stderr
    summary = json.loads((out / "summary.json").read_text(), parse_constant=lambda c: pytest.fail(c))
    assert summary["interrupted"] is True and summary["final_eval"] is None and summary["total_timesteps"] > 0
    model = PPO.load(out / "model.safetensors", device="cpu")
    assert model.num_timesteps == summary["total_timesteps"]
    assert load_checkpoint(out / "checkpoint.safetensors")[1]["num_timesteps"] == model.num_timesteps


def test_a_path_the_output_encoding_cannot_show_is_escaped_not_a_traceback(tmp_path):
    """A batch job's ASCII-only output (PYTHONIOENCODING=ascii) and a run directory named in another script: the
    lines show the path escaped (r\\xe9sult), and the run finishes with exit code 0."""
    out = tmp_path / "r\u00e9sult"
    env = {**os.environ, "PYTHONIOENCODING": "ascii", "RLSPEED_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "rlspeed", *TRAIN, "--total-timesteps", "256", "--num-envs", "8",
                             "--eval-episodes", "1", "--out", str(out)], capture_output=True, env=env, timeout=120)
    stdout = result.stdout.decode("ascii")
    assert result.returncode == 0, result.stderr.decode("ascii", "replace")
    assert "r\\xe9sult" in stdout and (out / "summary.json").exists()


def test_a_run_stopped_after_training_is_finished_by_resume(tmp_path, monkeypatch, capsys):
    """A run whose last checkpoint holds its whole budget but whose model could not be written (a full disk, a signal
    in the final save) is finished by --resume: nothing left to train, so it saves the model, evaluates it and writes
    the summary (it said "nothing left to train" and exited 0 without them)."""
    from rlspeed.algos.base import Algorithm

    save = Algorithm.save

    def disk_full_at_the_model(self, path, *args, **kwargs):
        if Path(path).name == "model.safetensors":
            raise UserError(f"Cannot write the checkpoint '{path}' (No space left on device).")
        return save(self, path, *args, **kwargs)

    for name, run in (("budget", ["--total-timesteps", "512"]),
                      ("target", ["--total-timesteps", "100000", "--target-return", "5", "--eval-freq", "256"])):
        argv = [*TRAIN, *run, "--checkpoint-freq", "256", "--out", str(tmp_path / name)]
        monkeypatch.setattr(Algorithm, "save", disk_full_at_the_model)
        assert cli.main(argv) == 2
        monkeypatch.setattr(Algorithm, "save", save)
        assert not (tmp_path / name / "model.safetensors").exists()
        capsys.readouterr()
        assert cli.main([*argv, "--resume"]) == 0
        out = capsys.readouterr().out
        assert "nothing left to train; saving the model and evaluating it" in out and "final evaluation" in out
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        assert summary["final_eval"]["episodes"] == 10 and summary["total_timesteps"] >= 512
        assert PPO.load(tmp_path / name / "model.safetensors").num_timesteps == summary["total_timesteps"]
        if name == "target":  # (reached before the stop: reported as the uninterrupted run would, not trained on)
            assert summary["steps_to_target"] == summary["total_timesteps"] < 100000
        # and once finished, --resume changes nothing
        written = (tmp_path / name / "summary.json").read_text()
        assert cli.main([*argv, "--resume"]) == 0 and "nothing left to train: the run " in capsys.readouterr().out
        assert (tmp_path / name / "summary.json").read_text() == written


def test_a_run_killed_in_its_final_save_keeps_its_model_s_replay_buffer_when_resume_finishes_it(tmp_path, capsys):
    """With --save-replay-buffer, a kill in the final save after the model's replay file was written to its staged
    name (model.replay.next.safetensors) and before the model was: --resume, with nothing left to train, saved the
    model without a replay buffer (an uninterrupted run has model.replay.safetensors beside it) and left the staged
    file, the buffer's size on disk, for ever."""
    from rlspeed.checkpoint import load_checkpoint

    run = tmp_path / "run"
    argv = ["train", "dqn", "CartPole-v1", "--no-progress", "--target-return", "none", "--total-timesteps", "256",
            "--checkpoint-freq", "128", "--save-replay-buffer", "--set", "learning_starts=64", "--set",
            "batch_size=16", "--out", str(run)]
    assert cli.main(argv) == 0
    # what the kill left: the staged replay file of the model, no model, no summary
    (run / "model.replay.safetensors").rename(run / "model.replay.next.safetensors")
    (run / "model.safetensors").unlink()
    (run / "summary.json").unlink()
    capsys.readouterr()
    assert cli.main([*argv, "--resume"]) == 0
    assert "nothing left to train; saving the model" in capsys.readouterr().out
    assert not (run / "model.replay.next.safetensors").exists()
    model = load_checkpoint(run / "model.safetensors")[1]["resume"]["replay_buffer"]
    replay = load_checkpoint(run / "model.replay.safetensors")[1]["replay_buffer"]
    saved = load_checkpoint(run / "checkpoint.replay.safetensors")[1]["replay_buffer"]
    assert model["token"] == replay["token"]
    assert {k: v for k, v in replay.items() if k != "token"} == {k: v for k, v in saved.items() if k != "token"}
    assert replay["size"] == 256


def test_resume_of_a_finished_run_whose_checkpoint_does_not_record_the_target_leaves_it_as_it_is(tmp_path, capsys):
    """A run of an older rlspeed that reached its target: its checkpoint does not say so (its summary.json does), and
    --resume trained on past the target, replacing the model and the summary's steps to target."""
    from rlspeed.checkpoint import load_checkpoint, save_checkpoint

    argv = [*TRAIN, "--total-timesteps", "100000", "--target-return", "5", "--eval-freq", "256", "--checkpoint-freq",
            "256", "--out", str(tmp_path / "run")]
    assert cli.main(argv) == 0
    checkpoint = tmp_path / "run" / "checkpoint.safetensors"
    tensors, meta = load_checkpoint(checkpoint)
    meta["resume"]["loop"] = {key: value for key, value in meta["resume"]["loop"].items()
                              if key not in ("steps_to_target", "time_to_target_s", "target_return")}
    save_checkpoint(checkpoint, tensors, meta)  # (as an rlspeed before the loop recorded them wrote it)
    written = {name: (tmp_path / "run" / name).read_bytes() for name in ("summary.json", "model.safetensors")}
    capsys.readouterr()
    assert cli.main([*argv, "--resume"]) == 0
    assert "nothing left to train: the run reached its target 5" in capsys.readouterr().out
    assert {name: (tmp_path / "run" / name).read_bytes() for name in written} == written


def test_resume_takes_the_algorithms_default_for_a_setting_an_older_config_yaml_lacks(tmp_path, capsys):
    """A run of an older rlspeed records no value for a setting added since; --resume filled it from today's preset
    (PPO Pendulum-v1's has gSDE: a run without it was refused, "holds networks built with use_sde=False"), where the
    older rlspeed ran the algorithm's default."""
    import yaml

    assert cli.main(["train", "ppo", "Pendulum-v1", "--set", "use_sde=false", "--set", "num_envs=2", "--set",
                     "num_steps=64", "--set", "batch_size=64", "--total-timesteps", "256", "--checkpoint-freq", "128",
                     "--target-return", "none", "--no-progress", "--out", str(tmp_path / "run")]) == 0
    config_file = tmp_path / "run" / "config.yaml"
    config = yaml.safe_load(config_file.read_text())
    for key in ("use_sde", "sde_sample_freq", "full_std", "use_expln", "log_std_init"):
        del config["hyperparameters"][key]  # (as a config.yaml of an rlspeed before gSDE)
    config_file.write_text(yaml.safe_dump(config, sort_keys=False))
    capsys.readouterr()
    assert cli.main(["train", "ppo", "Pendulum-v1", "--resume", "--total-timesteps", "512", "--no-progress", "--out",
                     str(tmp_path / "run")]) == 0, capsys.readouterr().err
    assert "has no effect" not in capsys.readouterr().err  # (no preset value of sde_sample_freq came back)
    assert yaml.safe_load(config_file.read_text())["hyperparameters"]["use_sde"] is False


def test_a_signal_the_process_was_started_ignoring_stays_ignored():
    """`nohup rlspeed train ...` ignores SIGHUP: a closed terminal must not stop the run, whichever way it stops on
    the others (at the iteration's end, or at once with subprocess envs, or in the final evaluation)."""
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        for stopping in (cli._stop_after_iteration, cli._sigterm_raises):
            with stopping():
                assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
                assert signal.getsignal(signal.SIGUSR1) not in (signal.SIG_IGN, signal.SIG_DFL)
                # (SLURM's warning signals stop a run as SIGTERM does, named as themselves)
                assert signal.getsignal(signal.SIGUSR1) is signal.getsignal(signal.SIGTERM)
                assert signal.getsignal(signal.SIGUSR2) is signal.getsignal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGHUP, previous)
    assert cli._signal_name(signal.SIGUSR1) == "SIGUSR1"


def test_kill_9_during_checkpointing_leaves_a_loadable_checkpoint(tmp_path):
    out = tmp_path / "run"
    process = _start_training(out, "--checkpoint-freq", "64", "--num-envs", "2")
    checkpoint = out / "checkpoint.safetensors"
    try:
        _wait_for(checkpoint.exists, process)
        time.sleep(1.0)  # many more checkpoint writes: the kill lands at any point of one
        process.kill()
        process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == -signal.SIGKILL
    model = PPO.load(checkpoint, device="cpu")
    assert model.num_timesteps >= 64
    # a write cut short leaves its temporary file (where the kill landed in one): the next write of the checkpoint
    # removes it (a load deletes nothing: test_stale_temporary_files_of_dead_writers_are_removed)
    model.save(checkpoint)
    assert list(out.glob(f".{checkpoint.name}.*.tmp")) == []


# --- envs -----------------------------------------------------------------------------------------------------------

class _RaisesAtStep5(gym.Env):
    """CartPole-like spaces; step 5 of any episode raises."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (4,))
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.observation_space.sample() * 0, {}

    def step(self, action):
        self.t += 1
        if self.t == 5:
            raise ValueError("sensor disconnected")
        return self.observation_space.sample() * 0, 1.0, False, False, {}


class _NeedsImageio(gym.Env):
    def __init__(self):
        raise ModuleNotFoundError("No module named 'imageio'", name="imageio")


class _BrokenModule(gym.Env):
    def __init__(self):  # (numpy is installed: as an extension whose shared library is missing fails to load)
        raise ImportError("libGL.so.1: cannot open shared object file: No such file or directory", name="numpy")


class _RaisesWhenMade(gym.Env):
    def __init__(self):
        raise RuntimeError("cannot open the simulator")


gym.register("FaultyRaises-v0", entry_point=_RaisesAtStep5, max_episode_steps=100)
gym.register("FaultyNeedsImageio-v0", entry_point=_NeedsImageio, max_episode_steps=100)
gym.register("FaultyBrokenModule-v0", entry_point=_BrokenModule, max_episode_steps=100)
gym.register("FaultyRaisesWhenMade-v0", entry_point=_RaisesWhenMade, max_episode_steps=100)


def test_an_env_that_raises_mid_episode_is_named():
    model = PPO("FaultyRaises-v0", device="cpu", seed=0, **TINY)
    with pytest.raises(EnvStepError, match=r"The env 'FaultyRaises-v0' \(gymnasium backend\) raised ValueError in "
                                           r"step\(\): sensor disconnected") as info:
        model.learn(256, progress_bar=False)
    assert isinstance(info.value.__cause__, ValueError)  # the env's own traceback is kept


def test_an_env_that_raises_is_one_line_from_the_command_line(capsys, tmp_path):
    out = tmp_path / "r"
    code = cli.main(["train", "ppo", "FaultyRaises-v0", "--no-progress", "--total-timesteps", "256", "--num-envs", "4",
                     "--target-return", "none", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 1
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "FaultyRaises-v0" in lines[0] and "sensor disconnected" in lines[0]
    # it failed before its first metrics row: the run directory it made is gone, so the same command can run again
    # (it kept config.yaml, an empty metrics.csv and plot: "already holds a run")
    assert not out.exists()


def test_an_env_that_raises_when_made_is_named_in_one_line(capsys, tmp_path):
    with pytest.raises(EnvStepError, match=r"'FaultyRaisesWhenMade-v0' \(gymnasium backend\) raised RuntimeError in "
                                           r"make\(\): cannot open the simulator") as info:
        make_env("FaultyRaisesWhenMade-v0", num_envs=2, device="cpu", backend="gymnasium")
    assert isinstance(info.value.__cause__, RuntimeError)
    out = tmp_path / "run"
    code = cli.main(["train", "ppo", "FaultyRaisesWhenMade-v0", "--no-progress", "--out", str(out)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and "cannot open the simulator" in lines[0] and not out.exists()


def test_a_missing_env_dependency_says_what_to_install(capsys):
    with pytest.raises(UserError, match=r"'imageio' is not installed: pip install \"rlspeed\[video\]\"\.$"):
        make_env("FaultyNeedsImageio-v0", num_envs=2, device="cpu")
    code = cli.main(["train", "ppo", "FaultyNeedsImageio-v0", "--no-progress"])
    assert_one_line_error(code, capsys.readouterr(), 'pip install "rlspeed[video]"')


def test_an_installed_module_that_fails_to_load_is_not_said_to_be_missing():
    """A module that is installed but fails to import (a shared library of its own missing) was 'not installed:
    pip install ...', which changes nothing; its import's error is what to fix."""
    with pytest.raises(UserError, match=r"'numpy' is installed but cannot be imported: libGL\.so\.1: cannot open") \
            as info:
        make_env("FaultyBrokenModule-v0", num_envs=2, device="cpu")
    assert "pip install" not in str(info.value)


def test_doctor_names_the_missing_module_of_an_installed_family(monkeypatch):
    from rlspeed.diagnostics import doctor

    monkeypatch.setattr(doctor, "ENV_FAMILIES", (("mujoco", "FaultyNeedsImageio-v0", "MuJoCo", doctor.WARN,
                                                  'pip install "rlspeed[mujoco]"'),))
    (check,) = doctor.check_env_families()
    assert "MuJoCo is installed, but the Python module 'imageio' is not installed" in check.detail
    assert check.advice == 'pip install "rlspeed[video]"'


@pytest.mark.filterwarnings("ignore:.*Hopper-v4 is out of date:DeprecationWarning")
@pytest.mark.parametrize(("module", "env_id", "extra"), [("mujoco", "Hopper-v5", "mujoco"),
                                                        ("Box2D", "LunarLander-v3", "box2d")])
def test_a_missing_extra_is_one_command_from_train_eval_video_and_doctor(module, env_id, extra, monkeypatch):
    """A MuJoCo id without mujoco: `rlspeed train` said pip install "gymnasium[mujoco]", `eval` passed Gymnasium's
    own wording on, a video said pip install "rlspeed[video]", doctor pip install "rlspeed[mujoco]". Each says the
    extra's one command now (the module made missing whether it is installed or not)."""
    from rlspeed import video
    from rlspeed.diagnostics import doctor
    from rlspeed.envs import env_spec
    from rlspeed.envs.gymnasium_env import GymnasiumEnv

    monkeypatch.setitem(sys.modules, module, None)
    family = f"gymnasium.envs.{extra}"  # (imported already: its envs would be made with the module it holds)
    for name in [name for name in sys.modules if name == family or name.startswith(family + ".")]:
        monkeypatch.delitem(sys.modules, name)
    command = f'pip install "rlspeed[{extra}]".'
    for make in (lambda: make_env(env_id, num_envs=1, device="cpu", backend="gymnasium"),  # train
                 lambda: GymnasiumEnv(env_id, num_envs=1, device="cpu"),  # eval's env
                 lambda: video._render_env(env_id)):  # eval --video
        with pytest.raises(UserError) as raised:
            make()
        assert str(raised.value).endswith(f"the Python module '{module}' is not installed: {command}"), raised.value
    if module == "mujoco":  # (a v4 id: v5 needs the same package, so it is not named as the way out)
        with pytest.raises(UserError, match=r"rlspeed\[mujoco\]\"\.$"):
            env_spec("Hopper-v4")  # (what train reads first)
    monkeypatch.setattr(doctor, "ENV_FAMILIES", ((extra, env_id, module, doctor.WARN, command[:-1]),))
    (check,) = doctor.check_env_families()
    assert check.detail.endswith(f"{module} is not installed") and check.advice == command[:-1]


@pytest.mark.parametrize("env_id", ["ALE/Pong-v5", "PongNoFrameskip-v4", "Breakout-v5"])
def test_an_atari_id_says_install_ale_py(env_id, capsys, monkeypatch):
    import importlib.util

    import gymnasium as gym

    from rlspeed.envs import atari

    # (as without ale-py, also where it is installed: its ids unregistered, the module not found)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None if name == "ale_py" else find_spec(
        name, *args))
    monkeypatch.setattr(atari, "_registered", False)
    for registered in [key for key in gym.registry if key.startswith("ALE/") or "NoFrameskip" in key
                       or key.split("-v")[0] in ("Breakout", "Pong")]:
        monkeypatch.delitem(gym.registry, registered)
    assert_one_line_error(cli.main(["train", "dqn", env_id]), capsys.readouterr(), 'pip install "rlspeed[atari]"')


def test_an_unimportable_env_module_is_one_sentence(capsys):
    assert_one_line_error(cli.main(["train", "ppo", "no_such_module:CartPole-v1"]), capsys.readouterr(),
                          "Cannot import the module 'no_such_module'")
    assert_one_line_error(cli.main(["train", "ppo", "CartPole-v1", "--gym-packages", "no_such_module"]),
                          capsys.readouterr(), "Cannot import the module 'no_such_module'")


def test_an_env_modules_missing_dependency_is_named_with_what_to_install(tmp_path, monkeypatch, capsys):
    """A module that imports a package which is not installed (Gymnasium-Robotics without PettingZoo) said "Cannot
    import the module 'gymnasium_robotics' ...: No module named 'pettingzoo'", which reads as the module itself
    missing: the sentence names the missing package and its pip command, through the env id and --gym-packages alike;
    a package that is there but fails to load is said so, with its import's error."""
    (tmp_path / "needs_absent_envs.py").write_text("import rlspeed_test_absent_package\n")
    (tmp_path / "needs_broken_envs.py").write_text("import rlspeed_test_broken_package\n")
    broken = tmp_path / "rlspeed_test_broken_package"
    broken.mkdir()
    (broken / "__init__.py").write_text("from rlspeed_test_broken_package import _c\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for args, why in ((["needs_absent_envs:CartPole-v1"], "(named in 'needs_absent_envs:CartPole-v1')"),
                      (["CartPole-v1", "--gym-packages", "needs_absent_envs"], "(--gym-packages)")):
        assert_one_line_error(cli.main(["train", "ppo", *args]), capsys.readouterr(),
                              f"Cannot import the module 'needs_absent_envs' {why}, which should register the env: the "
                              "Python module 'rlspeed_test_absent_package' is not installed: pip install "
                              "rlspeed_test_absent_package.")
    assert_one_line_error(cli.main(["train", "ppo", "needs_broken_envs:CartPole-v1"]), capsys.readouterr(),
                          "the Python module 'rlspeed_test_broken_package' is installed but cannot be imported: cannot "
                          "import name '_c'")


def test_an_env_module_that_raises_on_import_is_one_sentence(tmp_path, monkeypatch, capsys):
    """A module of the user's that raises as it is imported (a bug, a missing file it reads) printed its traceback and
    exit code 1, through the env id (`module:EnvId`) and --gym-packages alike."""
    (tmp_path / "broken_envs_module.py").write_text("raise RuntimeError('no config.json beside me')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    expected = ("The module 'broken_envs_module' {} raised RuntimeError on import: no config.json beside me (--debug "
                "shows its traceback).")
    for args, why in ((["broken_envs_module:CartPole-v1"], "(named in 'broken_envs_module:CartPole-v1')"),
                      (["CartPole-v1", "--gym-packages", "broken_envs_module"], "(--gym-packages)")):
        monkeypatch.delitem(sys.modules, "broken_envs_module", raising=False)
        assert_one_line_error(cli.main(["train", "ppo", *args]), capsys.readouterr(), expected.format(why))


def test_an_env_module_that_imports_mujoco_under_a_mujoco_gl_it_cannot_load_says_what_to_set(tmp_path, monkeypatch,
                                                                                               capsys):
    """`MUJOCO_GL=osmesa rlspeed eval RUN --video ...` of a Gymnasium-Robotics run (osmesa's library missing) said
    "The module 'gymnasium_robotics' ... raised AttributeError on import: 'NoneType' object has no attribute
    'glGetError'", PyOpenGL's words, where Gymnasium's own MuJoCo ids say which MUJOCO_GL to set; a module that imports
    MuJoCo is told so too. (A stand-in `mujoco` that fails as MuJoCo does under a platform whose library is missing.)"""
    (tmp_path / "mujoco").mkdir()
    (tmp_path / "mujoco" / "__init__.py").write_text("raise AttributeError(\"'NoneType' object has no attribute "
                                                     "'glGetError'\")\n")
    (tmp_path / "robot_envs_module.py").write_text("import mujoco\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "mujoco", raising=False)
    monkeypatch.setenv("MUJOCO_GL", "osmesa")
    assert_one_line_error(cli.main(["train", "sac", "robot_envs_module:FetchReach-v4"]), capsys.readouterr(),
                          "MuJoCo cannot be imported with MUJOCO_GL=osmesa (AttributeError: 'NoneType' object has no "
                          "attribute 'glGetError'): MuJoCo loads that OpenGL platform on import; unset MUJOCO_GL")
    # a module's own error, not MuJoCo's, is its own under that MUJOCO_GL too (it was said as MUJOCO_GL's)
    (tmp_path / "robot_envs_module.py").write_text("import a_module_not_installed_anywhere\n")
    monkeypatch.delitem(sys.modules, "robot_envs_module", raising=False)
    assert_one_line_error(cli.main(["train", "sac", "robot_envs_module:FetchReach-v4"]), capsys.readouterr(),
                          "Cannot import the module 'robot_envs_module' (named in 'robot_envs_module:FetchReach-v4'), "
                          "which should")
    (tmp_path / "robot_envs_module.py").write_text("import mujoco\n")
    monkeypatch.delenv("MUJOCO_GL")  # (unset, the module's own error is said as it was)
    monkeypatch.delitem(sys.modules, "robot_envs_module", raising=False)
    assert_one_line_error(cli.main(["train", "sac", "robot_envs_module:FetchReach-v4"]), capsys.readouterr(),
                          "The module 'robot_envs_module' (named in 'robot_envs_module:FetchReach-v4') raised "
                          "AttributeError on import")


def test_an_env_that_fails_a_bare_assert_while_made_is_named_with_where_it_failed(tmp_path, monkeypatch):
    """gymnasium-robotics 1.4.2 with NumPy 2.4 fails an `assert` without a message while making any Fetch env: rlspeed
    said only "The env 'FetchReach-v4' (gymnasium backend) raised AssertionError in make()", which leaves the user
    nothing to search for; the sentence names the file, line and source of the assert. (The env's module is a file of
    its own: pytest gives the asserts of test modules messages.)"""
    (tmp_path / "bare_assert_envs.py").write_text("def make():\n    assert 1 + 1 == 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(gym.registry, "BareAssert-v0",
                        gym.envs.registration.EnvSpec("BareAssert-v0", entry_point="bare_assert_envs:make"))
    with pytest.raises(EnvStepError, match=r"raised AssertionError in make\(\) at \S*/bare_assert_envs\.py:2 "
                                           r"\(assert 1 \+ 1 == 3\)$"):
        make_env("BareAssert-v0", backend="gymnasium", device="cpu")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes")
def test_a_device_or_a_pipe_is_never_replaced_by_a_written_file(tmp_path, capsys):
    """Files are written beside their path and renamed over it: `rlspeed profile --trace /dev/null` (torch's profiler
    renames too) run as root replaced the /dev/null device with a regular file, for every process of the machine."""
    from rlspeed.files import move_into_place

    pipe = tmp_path / "trace.json"
    os.mkfifo(pipe)
    for command in (["export", str(tmp_path / "model.safetensors"), "--out", str(pipe), "--overwrite"],
                    ["profile", "ppo", "CartPole-v1", "--trace", str(pipe)]):
        flag = command[-2] if command[0] == "profile" else "--out"
        assert_one_line_error(cli.main(command), capsys.readouterr(),
                              f"{flag} '{pipe}' is a device or a pipe, which a file written there would replace")
    temporary = tmp_path / "written"
    temporary.write_text("a video")
    with pytest.raises(UserError, match=r"trace.json' is a device or a pipe"):
        move_into_place(temporary, pipe)
    assert stat.S_ISFIFO(os.lstat(pipe).st_mode) and temporary.read_text() == "a video"


# --- memory ---------------------------------------------------------------------------------------------------------

def test_a_replay_buffer_too_big_for_memory_is_refused_with_what_fits(monkeypatch):
    from rlspeed.buffers import replay

    budget = 64 * 2**20  # a fake 64 MiB of available host memory
    monkeypatch.setattr(replay, "available_memory", lambda device, needed=None: (budget, replay.HOST))
    shape = (40, 60, 3)  # the image env of the report: 57.6 kB per transition as float32 observations
    with pytest.raises(UserError, match=r"largest replay buffer that fits is ([\d,]+) transitions") as info:
        ReplayBuffer(500_000, 4, shape, (), torch.int64, "cpu")
    fits = int(info.value.args[0].split("fits is ")[1].split(" ")[0].replace(",", ""))
    buffer = ReplayBuffer(fits, 4, shape, (), torch.int64, "cpu")
    assert 0 < buffer.nbytes <= 0.8 * budget and fits % 4 == 0
    with pytest.raises(UserError, match="needs"):
        ReplayBuffer(fits + 4, 4, shape, (), torch.int64, "cpu")


def test_the_frame_layouts_largest_buffer_that_fits_is_accepted(monkeypatch):
    """For Atari frame stacks the size said to fit was refused again (bytes per row at the asked capacity left out
    the pool's frames beyond one per row)."""
    from rlspeed.buffers import replay

    budget = 64 * 2**20
    monkeypatch.setattr(replay, "available_memory", lambda device, needed=None: (budget, replay.HOST))
    frames = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    with pytest.raises(UserError, match=r"largest replay buffer that fits is ([\d,]+) transitions") as info:
        replay.FrameStackReplayBuffer(1_000_000, 8, frames, (), torch.int64, "cpu", n_step=3)
    fits = int(info.value.args[0].split("fits is ")[1].split(" ")[0].replace(",", ""))
    buffer = replay.FrameStackReplayBuffer(fits, 8, frames, (), torch.int64, "cpu", n_step=3)
    assert 0.75 * budget < buffer.nbytes <= 0.8 * budget
    with pytest.raises(UserError, match="needs"):
        replay.FrameStackReplayBuffer(fits + 8, 8, frames, (), torch.int64, "cpu", n_step=3)


def test_no_usable_temporary_directory_is_one_sentence_naming_tmpdir(monkeypatch, tmp_path, capsys):
    """Where /tmp, /var/tmp and the working directory are read-only (a container's read-only root) and TMPDIR names
    no writable directory, torch's modules fail loading with Python's tempfile error: that was a traceback."""

    def no_temporary_directory(*args, **kwargs):
        raise FileNotFoundError(errno.ENOENT, "No usable temporary directory found in ['/tmp', '/var/tmp', '/usr/tmp']")

    monkeypatch.setattr(cli, "_model", no_temporary_directory)
    code = cli.main(["train", "ppo", "CartPole-v1", "--total-timesteps", "200", "--no-progress", "--out",
                     str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == ("rlspeed: error: No usable temporary directory found in ['/tmp', "
                                            "'/var/tmp', '/usr/tmp']: set TMPDIR to a directory you can write to.")
    # --nproc: said before torchrun starts (its launcher's mkdtemp was a traceback) and before the run directory
    monkeypatch.setattr(tempfile, "gettempdir", no_temporary_directory)
    monkeypatch.setattr(subprocess, "Popen", lambda *args, **kwargs: pytest.fail("torchrun was started"))
    code = cli.main(["train", "ppo", "CartPole-v1", "--total-timesteps", "200", "--no-progress", "--nproc", "1",
                     "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "set TMPDIR to a directory you can write to" in err and not (tmp_path / "run").exists()


def test_an_allocation_torch_refuses_is_one_line_that_keeps_its_reason(monkeypatch, tmp_path, capsys):
    """torch's allocator message begins with its source line ("[enforce fail at alloc_cpu.cpp:127] err == 0."), and
    the line cut it at 160 characters, mid-reason: "... Error code 12 (Cannot allocate): use fewer envs"."""
    from rlspeed.buffers import replay

    def refused(self, layout):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 1500001600 bytes. Error code 12 (Cannot allocate memory)")

    monkeypatch.setattr(replay.ReplayBuffer, "_allocate_observations", refused)
    code = cli.main(["train", "dqn", "CartPole-v1", "--total-timesteps", "200", "--no-progress", "--out",
                     str(tmp_path / "run")])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and last == (
        "rlspeed: error: out of memory (DefaultCPUAllocator: can't allocate memory: you tried to allocate 1500001600 "
        "bytes. Error code 12 (Cannot allocate memory)): use fewer envs, episodes or a smaller buffer (--device cpu "
        "when a device is full)."), last


def test_host_memory_is_read_from_the_system():
    from rlspeed.buffers.replay import available_memory

    available = available_memory(torch.device("cpu"))[0]
    assert available is None or available > 0


@pytest.mark.parametrize("version", [1, 2])
def test_host_memory_is_no_more_than_a_containers_memory_limit_leaves(monkeypatch, tmp_path, version):
    """A container's memory limit (cgroup v1 or v2) was not read: a buffer sized against the host's MemAvailable was
    accepted, then the container was OOM-killed while zero-filling it."""
    from rlspeed.buffers import replay

    files = ({"memory.max": "1073741824", "memory.current": "536870912", "memory.stat": "inactive_file 134217728\n"}
             if version == 2 else
             {"memory/memory.limit_in_bytes": "1073741824", "memory/memory.usage_in_bytes": "536870912",
              "memory/memory.stat": "cache 1\ntotal_inactive_file 134217728\n"})
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.setattr(replay, "CGROUP_ROOT", str(tmp_path))
    monkeypatch.setattr(replay, "_HOST_BUFFERS", weakref.WeakSet())  # (no other test's buffer still alive counted)
    assert replay.available_memory(torch.device("cpu"))[0] == 2**30 - (2**29 - 2**27)  # (page cache reclaimable)
    (tmp_path / next(iter(files))).write_text("max" if version == 2 else str(2**63 - 4096))  # no limit
    assert replay.available_memory(torch.device("cpu"))[0] > 2**30 - (2**29 - 2**27)


@pytest.mark.parametrize("version", [1, 2])
def test_a_memory_limit_on_the_processs_own_cgroup_below_the_root_is_read(monkeypatch, tmp_path, version):
    """A SLURM job's memory limit (`--mem`) or a systemd slice's sits on the process's own cgroup, below the
    hierarchy's root: only the root's files were read, so a replay buffer was sized against the whole node's memory
    and the job was OOM-killed. The least that any cgroup from the process's own up to the root leaves counts."""
    from rlspeed import device
    from rlspeed.buffers import replay

    job = "system.slice/slurmstepd.scope/job_7/step_0"
    base = tmp_path if version == 2 else tmp_path / "memory"
    names = (("memory.max", "memory.current") if version == 2 else
             ("memory.limit_in_bytes", "memory.usage_in_bytes"))
    for directory, limit, usage in ((base, "max" if version == 2 else str(2**63 - 4096), "0"),
                                    (base / "system.slice/slurmstepd.scope/job_7", str(2**30), str(2**28)),
                                    (base / job, "max" if version == 2 else str(2**63 - 4096), str(2**27))):
        directory.mkdir(parents=True, exist_ok=True)
        (directory / names[0]).write_text(limit)
        (directory / names[1]).write_text(usage)
    (tmp_path / "cgroup").write_text(f"0::/{job}\n" if version == 2 else f"4:memory:/{job}\n1:cpu,cpuacct:/\n")
    monkeypatch.setattr(replay, "CGROUP_ROOT", str(tmp_path))
    monkeypatch.setattr(device, "PROC_CGROUP", str(tmp_path / "cgroup"))
    assert replay._cgroup_available_bytes() == 2**30 - 2**28  # (the job's limit, two levels above the step)
    # a path the process's view names that does not exist here (a container's own root): the root alone
    (tmp_path / "cgroup").write_text("0::/elsewhere/job\n4:memory:/elsewhere/job\n")
    assert replay._cgroup_available_bytes() is None


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads Linux's /proc/self/status")
def test_a_replay_buffer_past_the_processs_ulimit_is_refused_with_what_fits(monkeypatch):
    """Under `ulimit -v` (RLIMIT_AS) the buffer was sized against the machine's free memory: its allocation failed
    with torch's "DefaultCPUAllocator: can't allocate memory" instead of the sentence naming the size that fits."""
    import gc
    import resource

    from rlspeed.buffers import replay

    gc.collect()  # (the check collects garbage before it refuses: the address space left is measured after that)
    with open("/proc/self/status") as handle:
        size = next(int(line.split()[1]) * 1024 for line in handle if line.startswith("VmSize:"))
    real = resource.getrlimit
    monkeypatch.setattr(resource, "getrlimit", lambda which: (size + 64 * 2**20, resource.RLIM_INFINITY)
                        if which == resource.RLIMIT_AS else real(which))  # (64 MiB of address space left)
    assert replay.available_memory(torch.device("cpu"))[0] <= 64 * 2**20
    with pytest.raises(UserError, match=r"ulimit \(-v or -d\).*largest replay buffer that fits is") as info:
        ReplayBuffer(100_000, 1, (40, 60, 3), (), torch.int64, "cpu")  # (2.1 GiB)
    fits = int(info.value.args[0].split("fits is ")[1].split(" ")[0].replace(",", ""))
    assert 0 < fits * (2 * 40 * 60 * 3 * 4 + 20) <= 0.8 * 64 * 2**20  # (float32 observations twice, 20 bytes more)


@pytest.mark.parametrize("limit", ["ulimit", "cgroup", "device"])
def test_a_rollout_past_the_processs_own_memory_limit_names_that_limit(monkeypatch, limit):
    """Every memory check follows one rule (`refuse_unless_fits`), which names the limit that leaves the memory: the
    rollout's refusal (as the envs', the population's and the sampled batch's) said "available host memory" where
    `ulimit -v` or the container's cgroup limit was what left 1 MiB (and the device's "available memory of cuda:0"
    in the members' replay's wording only)."""
    from rlspeed.buffers import replay, rollout

    monkeypatch.setattr(replay, "_rlimit_available_bytes", lambda: 2**20 if limit == "ulimit" else None)
    monkeypatch.setattr(replay, "_cgroup_available_bytes", lambda: 2**20 if limit == "cgroup" else None)
    monkeypatch.setattr(replay, "_unwritten_host_bytes", lambda: 0)
    monkeypatch.setattr(replay, "free_memory_bytes", lambda device: 2**20 if device.type == "cuda" else 2**40)
    named = {"ulimit": r"that this process's ulimit \(-v or -d\) leaves",
             "cgroup": r"that this process's memory cgroup \(a container's or job's memory limit\) leaves",
             "device": "free on cuda:0"}[limit]
    device = torch.device("cuda:0" if limit == "device" else "cpu")  # (nothing is allocated: no GPU needed)
    with pytest.raises(UserError, match=rf"^A rollout of num_steps 1,000 x num_envs 4 steps needs about 3\.8 MiB, "
                                        rf"more than the 0\.8 MiB it may take \(80% of the 1\.0 MiB {named}\); "
                                        r"lower num_steps or num_envs; with num_envs 4, num_steps up to 209 fits"):
        rollout.check_rollout_bytes(1_000, 4, 1_000, device)
    rollout.check_rollout_bytes(209, 4, 1_000, device)


def test_a_memory_refusal_names_the_limit_of_the_measurement_it_refused_by(monkeypatch):
    """The limit named came from a second reading: a process whose ulimit left 1 MiB at the check and more by the
    time the words were chosen (it shrank between) was told "of available host memory". One measurement gives the
    bytes and the limit that set them (`available_memory`)."""
    import weakref

    from rlspeed.buffers import replay, rollout

    readings = iter([2**20])  # (the ulimit's first reading; later ones leave 1 TiB)
    monkeypatch.setattr(replay, "_rlimit_available_bytes", lambda: next(readings, 2**40))
    monkeypatch.setattr(replay, "_cgroup_available_bytes", lambda: None)
    monkeypatch.setattr(replay, "_unwritten_host_bytes", lambda: 0)
    monkeypatch.setattr(replay, "_HOST_BUFFERS", weakref.WeakSet())  # (no collection and second measurement)
    with pytest.raises(UserError, match=r"\(80% of the 1\.0 MiB that this process's ulimit \(-v or -d\) leaves\)"):
        rollout.check_rollout_bytes(1_000, 4, 1_000, torch.device("cpu"))


def test_a_memory_refusal_under_a_mebibyte_says_its_sizes_as_they_are(monkeypatch):
    """Sizes were said in MiB to one decimal below 1 GiB: with 16 KiB left (a nearly spent ulimit or cgroup), the
    refusal said "more than the 0.0 MiB it may take (80% of the 0.0 MiB ...)". Small sizes are said in KiB or bytes
    (`size_text`, also the CLI's disk warning's, which had its own copy, and the checkpoint's disk refusal's, which
    had another wording)."""
    from rlspeed.buffers import replay, rollout
    from rlspeed.files import size_text

    monkeypatch.setattr(replay, "available_memory", lambda device, needed=None: (2**14, replay.HOST))
    with pytest.raises(UserError, match=r"^A rollout of num_steps 10 x num_envs 4 steps needs about 39\.1 KiB, more "
                                        r"than the 12\.8 KiB it may take \(80% of the 16\.0 KiB of available host "
                                        r"memory\); lower num_steps or num_envs; with num_envs 4, num_steps up to 3 "
                                        r"fits"):
        rollout.check_rollout_bytes(10, 4, 1_000, torch.device("cpu"))
    assert [size_text(count) for count in (0, 1023, 2**17, 3 * 2**30)] == [
        "0 bytes", "1,023 bytes", "0.1 MiB", "3.0 GiB"]
    # (where a byte decides, as for a disk one byte short of a checkpoint: the whole count, then the same words)
    assert [size_text(count, exact=True) for count in (1023, 2**17, 3 * 2**30)] == [
        "1,023 bytes", "131,072 bytes (0.1 MiB)", "3,221,225,472 bytes (3.0 GiB)"]


def test_models_and_runs_take_sm3_digests_from_save_or_the_environment(monkeypatch, tmp_path, capsys):
    """SM3 was reachable through the low-level save_checkpoint only (`model.save(path, digest="sm3")` was called
    "Stable-Baselines3's keywords"): `save` takes digest=, and `RLSPEED_CHECKPOINT_DIGEST=sm3` gives a run's files
    theirs; an unknown name is refused before training."""
    from rlspeed import PPO

    model = PPO("CartPole-v1", seed=0, num_envs=2, num_steps=16, batch_size=32)
    assert load_checkpoint(model.save(tmp_path / "model", digest="sm3"))[1]["digest"]["algorithm"] == "sm3"
    from rlspeed import DQN

    dqn = DQN("CartPole-v1", seed=0, learning_starts=16, batch_size=8, save_replay_buffer=True)
    dqn.learn(32, progress_bar=False)
    dqn.save(tmp_path / "dqn", digest="sm3")  # (the replay buffer's file beside it takes the digest too)
    assert load_checkpoint(tmp_path / "dqn.replay.safetensors")[1]["digest"]["algorithm"] == "sm3"
    with pytest.raises(UserError, match="digest_name: not a keyword of save"):
        model.save(tmp_path / "model", digest_name="sm3")
    monkeypatch.setenv("RLSPEED_CHECKPOINT_DIGEST", "sm3")
    assert cli.main([*TRAIN, "--total-timesteps", "64", "--checkpoint-freq", "32", "--out", str(tmp_path / "run")]) == 0
    for name in ("model.safetensors", "checkpoint.safetensors"):
        assert load_checkpoint(tmp_path / "run" / name)[1]["digest"]["algorithm"] == "sm3", name
    monkeypatch.setenv("RLSPEED_CHECKPOINT_DIGEST", "md5")
    capsys.readouterr()
    assert cli.main([*TRAIN, "--total-timesteps", "64", "--out", str(tmp_path / "md5")]) == 2
    assert "Unknown checkpoint digest 'RLSPEED_CHECKPOINT_DIGEST=md5'" in capsys.readouterr().err
    assert cli.main([*TRAIN, "--seeds", "0,1", "--total-timesteps", "64", "--out", str(tmp_path / "md5")]) == 2
    assert "Unknown checkpoint digest 'RLSPEED_CHECKPOINT_DIGEST=md5'" in capsys.readouterr().err
    assert not (tmp_path / "md5").exists()  # (refused before training, a population too)


def test_sm3_from_gmssl_equals_openssl_s(monkeypatch, tmp_path):
    """Where OpenSSL has no SM3, the gmssl package gives the same digest (checkpoints stay loadable either way)."""
    import hashlib

    pytest.importorskip("gmssl")
    tensors = {"w": torch.arange(12.0), "b": torch.ones(3, dtype=torch.bfloat16)}
    try:
        expected = tensor_digest(tensors, {"x": 1}, "sm3")
    except UserError:
        pytest.skip("OpenSSL here has no SM3 to compare with")
    real_new = hashlib.new
    monkeypatch.setattr(hashlib, "new", lambda name, *a, **k: (_ for _ in ()).throw(ValueError(name))
                        if name == "sm3" else real_new(name, *a, **k))
    assert tensor_digest(tensors, {"x": 1}, "sm3") == expected


def _sigterm_at(monkeypatch, steps: int) -> None:
    """PPO.learn, patched: SIGTERM to this process once the model has trained `steps` env steps (a callback)."""
    learn = PPO.learn

    def signalled_learn(self, *args, callback=None, **kwargs):
        def signal_at(_locals):
            if self.num_timesteps == steps:
                os.kill(os.getpid(), signal.SIGTERM)
        return learn(self, *args, callback=[signal_at, *(callback or [])], **kwargs)

    monkeypatch.setattr(PPO, "learn", signalled_learn)


def test_sigterm_stops_a_run_at_the_end_of_its_iteration_and_the_resume_is_the_uninterrupted_run(tmp_path, monkeypatch,
                                                                                                   capsys):
    """The first SIGTERM (or Ctrl-C) lets the iteration finish, so the checkpoint written then holds a whole state:
    `--resume` ends with the uninterrupted run's weights, bit for bit (native envs, one process). Saving in the
    middle of an update kept part of it, and the resumed run differed."""
    from safetensors.torch import load_file

    argv = ["train", "ppo", "CartPole-v1", "--target-return", "none", "--no-progress", "--env-backend", "torch",
            "--set", "num_envs=4", "--set", "num_steps=32", "--set", "batch_size=64", "--total-timesteps", "1024",
            "--checkpoint-freq", "256"]
    assert cli.main([*argv, "--out", str(tmp_path / "a")]) == 0
    learn = PPO.learn
    _sigterm_at(monkeypatch, 384)
    assert cli.main([*argv, "--out", str(tmp_path / "b")]) == 143
    assert "stopping after this iteration" in capsys.readouterr().err
    assert load_checkpoint(tmp_path / "b" / "checkpoint.safetensors")[1]["num_timesteps"] == 384
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["interrupted"] is True
    monkeypatch.setattr(PPO, "learn", learn)
    assert cli.main([*argv, "--out", str(tmp_path / "b"), "--resume"]) == 0
    want, got = (load_file(tmp_path / run / "model.safetensors") for run in ("a", "b"))
    assert want.keys() == got.keys() and all(torch.equal(want[key], got[key]) for key in want)


def test_a_second_sigterm_while_learn_closes_its_logs_keeps_the_runs_clock_in_summary_and_checkpoint(tmp_path,
                                                                                                      monkeypatch):
    """A scheduler's SIGTERM comes twice (SLURM signals every process of the job, and a batch script's trap passes it
    on): the second one, while learn drew its learning curve after the first one's iteration, cut learn's bookkeeping
    short, and summary.json and the checkpoint held the training clock of the previous checkpoint (0.0 s and sps 0
    before the first one) while metrics.csv went on to the step where it stopped. (The curve is drawn after the save
    now: the second signal comes while learn closes its logs.)"""
    import csv

    from rlspeed.logging import RunLogger

    argv = ["train", "ppo", "CartPole-v1", "--target-return", "none", "--no-progress", "--env-backend", "torch",
            "--set", "num_envs=4", "--set", "num_steps=32", "--set", "batch_size=64", "--total-timesteps", "4096",
            "--checkpoint-freq", "1024", "--out", str(tmp_path / "run")]
    learn, close = PPO.learn, RunLogger.close

    def terminated_learn(self, *args, callback=None, **kwargs):
        def terminate_at_384(_locals):
            if self.num_timesteps == 384:
                os.kill(os.getpid(), signal.SIGTERM)
        return learn(self, *args, callback=[terminate_at_384, *(callback or [])], **kwargs)

    def close_terminated_again(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # (the second signal, while learn closes its logs)
        return close(self, *args, **kwargs)

    monkeypatch.setattr(PPO, "learn", terminated_learn)
    monkeypatch.setattr(RunLogger, "close", close_terminated_again)
    assert cli.main(argv) == 143
    rows = list(csv.DictReader(open(tmp_path / "run" / "metrics.csv", encoding="utf-8")))
    clock = round(float(rows[-1]["train_wall_s"]), 4)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["total_timesteps"] == int(rows[-1]["timesteps"]) == 384
    assert summary["train_wall_s"] == clock > 0 and summary["sps"] > 0
    loop = load_checkpoint(tmp_path / "run" / "checkpoint.safetensors")[1]["resume"]["loop"]
    assert round(loop["train_wall_s"], 4) == clock


def test_resume_runs_the_final_evaluation_a_signal_at_the_runs_end_skipped(tmp_path, monkeypatch, capsys):
    """A SIGTERM as the last iteration ended saves the model and a summary.json without final_eval (exit 143); the
    batch job's requeue, the same command with --resume, said "nothing left to train" and exited 0, so the run never got
    its final evaluation: the resume evaluates the model, as the uninterrupted run did, and writes it into the
    summary."""
    run = tmp_path / "run"
    argv = ["train", "ppo", "CartPole-v1", "--target-return", "none", "--no-progress", "--env-backend", "torch",
            "--set", "num_envs=4", "--set", "num_steps=32", "--set", "batch_size=64", "--total-timesteps", "256",
            "--checkpoint-freq", "128", "--eval-episodes", "2", "--out", str(run)]
    learn = PPO.learn
    _sigterm_at(monkeypatch, 256)
    assert cli.main(argv) == 143
    monkeypatch.setattr(PPO, "learn", learn)
    assert json.loads((run / "summary.json").read_text())["final_eval"] is None
    capsys.readouterr()
    assert cli.main([*argv, "--resume"]) == 0
    assert "final evaluation (deterministic, 2 episodes" in capsys.readouterr().out
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_eval"]["episodes"] == 2 and summary["total_timesteps"] == 256
    assert cli.main([*argv, "--resume"]) == 0 and "nothing left to train" in capsys.readouterr().out
    # without a checkpoint (a run shorter than a timed checkpoint's interval writes none), the model file is resumed:
    # --resume said "nothing left to train" and named `rlspeed eval`, which cannot fill summary.json
    (run / "checkpoint.safetensors").unlink()
    evaluated = summary["final_eval"]
    summary["final_eval"] = None
    (run / "summary.json").write_text(json.dumps(summary))
    assert cli.main([*argv, "--resume"]) == 0
    out = capsys.readouterr().out
    assert f"resumed from {run / 'model.safetensors'} at 256 steps" in out
    assert "the model file model.safetensors holds the whole budget: nothing left to train" in out  # (not "the
    # checkpoint", which this run has none of)
    assert json.loads((run / "summary.json").read_text())["final_eval"] == evaluated


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
@pytest.mark.parametrize("at", [384, 512])
@pytest.mark.plots
def test_a_run_a_signal_stopped_is_saved_before_its_learning_curve_is_drawn(tmp_path, monkeypatch, sig, code, at):
    """A run niced on a loaded machine was still drawing learning_curve.png minutes after a SIGTERM (matplotlib's
    import alone is seconds of CPU time), and learn drew it before the model, the checkpoint and summary.json were
    saved: the kill that follows a scheduler's grace period left a directory with none of them, and no exit code
    143. The run is saved first, the curve drawn last (once, also for a signal in the last iteration)."""
    from rlspeed.logging import RunLogger

    run = tmp_path / "run"
    argv = ["train", "ppo", "CartPole-v1", "--target-return", "none", "--no-progress", "--env-backend", "torch",
            "--set", "num_envs=4", "--set", "num_steps=32", "--set", "batch_size=64", "--total-timesteps", "512",
            "--out", str(run)]
    learn, plot = PPO.learn, RunLogger.plot
    held_when_drawn = []  # (the run directory's files each time the curve is drawn: what a kill then would leave)

    def signalled_learn(self, *args, callback=None, **kwargs):
        def signal_at(_locals):
            if self.num_timesteps == at:
                os.kill(os.getpid(), sig)
        return learn(self, *args, callback=[signal_at, *(callback or [])], **kwargs)

    def slow_plot(self):
        held_when_drawn.append({path.name for path in self.run_dir.iterdir()})
        return plot(self)

    monkeypatch.setattr(PPO, "learn", signalled_learn)
    monkeypatch.setattr(RunLogger, "plot", slow_plot)
    assert cli.main(argv) == code
    assert len(held_when_drawn) == 1 and {"model.safetensors", "summary.json"} <= held_when_drawn[0]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["total_timesteps"] == at and summary["final_eval"] is None
    if at < 512:  # (stopped mid-run: its checkpoint too; at the end, training finished and only the evaluation is cut)
        assert summary["interrupted"] is True and "checkpoint.safetensors" in held_when_drawn[0]
    assert (run / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class _CrashesOnceAtItsStep200(gym.Env):
    """CartPole-like spaces; the 200th step of the first env made raises (a simulator that crashes mid-run)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (4,))
    action_space = gym.spaces.Discrete(2)
    crash = True

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = getattr(self, "t", 0)
        return np.zeros(4, np.float32), {}

    def step(self, action):
        self.t += 1
        if self.t == 200 and _CrashesOnceAtItsStep200.crash:
            _CrashesOnceAtItsStep200.crash = False
            raise RuntimeError("simulator crashed")
        return np.zeros(4, np.float32), 1.0, self.t % 50 == 0, False, {}


def test_a_crash_keeps_the_timed_checkpoint_and_resume_goes_on_from_it(tmp_path, monkeypatch, capsys):
    """Without --checkpoint-freq a single run still writes its checkpoint every CHECKPOINT_INTERVAL_S seconds (here
    0: every iteration, as saving's 5% cap allows), so an env that crashes mid-run loses at most that much: the
    checkpoint stays and --resume finishes the run (it lost everything: no checkpoint was written)."""
    gym.register("rlspeed-test/CrashesOnce-v0", entry_point=_CrashesOnceAtItsStep200, max_episode_steps=100)
    monkeypatch.setattr(cli, "CHECKPOINT_INTERVAL_S", 0.0)
    monkeypatch.chdir(tmp_path)
    argv = ["train", "ppo", "rlspeed-test/CrashesOnce-v0", "--no-progress", "--total-timesteps", "1024",
            "--num-envs", "2", "--set", "num_steps=32", "--set", "batch_size=64", "--target-return", "none",
            "--out", "run"]
    try:
        assert cli.main(argv) == 1
        err = capsys.readouterr().err
        assert "simulator crashed" in err and "--resume --out run continues from it" in err
        saved = load_checkpoint(tmp_path / "run" / "checkpoint.safetensors")[1]["num_timesteps"]
        assert 0 < saved < 400  # (the crash came at the first env's step 200: 400 steps of both envs)
        assert cli.main([*argv, "--resume"]) == 0
        assert json.loads((tmp_path / "run" / "summary.json").read_text())["distributed"]["resumed_from_timesteps"] \
            == saved
        # the run's end has a checkpoint too: never older than the model a finished run saves
        final = load_checkpoint(tmp_path / "run" / "model.safetensors")[1]["num_timesteps"]
        assert load_checkpoint(tmp_path / "run" / "checkpoint.safetensors")[1]["num_timesteps"] == final >= 1024
    finally:
        del gym.registry["rlspeed-test/CrashesOnce-v0"]


def test_a_signal_to_the_process_group_of_a_run_with_subprocess_envs_still_saves_it(tmp_path):
    """A terminal's Ctrl-C or a scheduler's SIGTERM reaches every process of the group: the env subprocesses stop at
    once, so a run on them stops at once too and saves (finishing the iteration stepped dead workers: "The env ...
    raised ConnectionResetError", exit 1, nothing saved)."""
    out = tmp_path / "run"
    env = {**os.environ, "RLSPEED_NUM_THREADS": "1", "MPLBACKEND": "Agg", "PYTHONUNBUFFERED": "1"}
    env.pop("RLSPEED_DEVICE", None)
    process = subprocess.Popen([sys.executable, "-m", "rlspeed", "train", "ppo", "CartPole-v1", "--env-backend",
                                "gymnasium-async", "--num-envs", "2", "--set", "num_steps=1024", "--set",
                                "n_epochs=1", "--target-return", "none", "--total-timesteps", "1e8", "--no-progress",
                                "--device", "cpu", "--out", str(out)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                               start_new_session=True)  # (its own process group, as a terminal's job)
    try:
        _wait_for(lambda: (out / "metrics.csv").exists(), process)
        os.killpg(process.pid, signal.SIGTERM)
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 143, stderr[-2000:]
    assert "interrupted (SIGTERM)" in stderr and "ConnectionResetError" not in stderr
    assert json.loads((out / "summary.json").read_text())["interrupted"] is True
    assert (out / "checkpoint.safetensors").exists() and (out / "model.safetensors").exists()


def test_symlinks_planted_in_a_run_directory_are_not_written_through(tmp_path):
    """A run directory received from someone else may hold symlinks: the lock file was opened for writing through
    one (truncating what it pointed at), and config.yaml's fixed temporary name was written through one."""
    out = tmp_path / "run"
    out.mkdir()
    victims = {name: tmp_path / f"victim_{name}" for name in (".rlspeed.lock", ".config.yaml.tmp")}
    for name, victim in victims.items():
        victim.write_text("keep me")
        (out / name).symlink_to(victim)
    with pytest.warns(UserWarning, match="rlspeed.lock' is a symlink: it is not followed"):
        assert cli.main([*TRAIN, "--total-timesteps", "64", "--out", str(out)]) == 0
    assert all(victim.read_text() == "keep me" for victim in victims.values())


@pytest.mark.faults
@pytest.mark.parametrize("failing", ["_start", "_follow_learning_rate"])
def test_an_error_before_training_begins_closes_the_runs_logs(tmp_path, monkeypatch, failing):
    """An error raised as learn sets up (in `_start`, or right after it, before the first iteration) closes the
    run's logger, TensorBoard writer included: each such call left a writer's thread running and its file open."""
    from rlspeed.logging import RunLogger

    closed = []
    close = RunLogger.close
    monkeypatch.setattr(RunLogger, "close", lambda self, *a, **k: (closed.append(self), close(self, *a, **k))[1])
    model = PPO("CartPole-v1", num_envs=2, num_steps=16, batch_size=32, seed=0)

    def fail(*args, **kwargs):
        raise RuntimeError("set-up failed")

    monkeypatch.setattr(model, failing, fail)
    with pytest.raises(RuntimeError, match="set-up failed"):
        model.learn(64, progress_bar=False, run_dir=tmp_path / "run")
    assert len(closed) == 1


@pytest.mark.parametrize(("module", "command"), [("sklearn.linear_model", "pip install scikit-learn"),
                                                 ("yaml", "pip install PyYAML"), ("PIL.Image", "pip install Pillow"),
                                                 ("skimage", "pip install scikit-image"),
                                                 ("OpenGL.GL", "pip install PyOpenGL"),
                                                 ("cv2", 'pip install "rlspeed[atari]"'),
                                                 ("pettingzoo", "pip install pettingzoo")])
def test_a_missing_module_is_advised_the_distribution_pip_installs_it_from(module, command):
    """An env module's missing dependency is named with the pip command that installs it: the distribution's name
    where pip names it otherwise than the import (`pip install sklearn` installs a deprecated stub, `pip install yaml`
    and `pip install PIL` nothing), rlspeed's extra for the modules an extra installs."""
    from rlspeed.envs.packages import install_command

    assert install_command(module) == command
