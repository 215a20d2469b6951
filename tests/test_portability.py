"""Windows and macOS: what the library and the command line use that those platforms lack (Unix-only `os` calls,
signals, float64 on Apple's MPS) degrades instead of failing. Simulated on Linux by removing what they lack."""

from __future__ import annotations

import errno
import importlib
import os
import signal
import sys
import tempfile

import pytest
import torch
from conftest import run_in_ascii_locale

from rlspeed import UserError, checkpoint, cli, files


def test_run_files_are_written_without_fchmod(tmp_path, monkeypatch):
    # os.fchmod is Unix-only before Python 3.13: on Windows every run file (config.yaml, summary.json) went through it
    monkeypatch.delattr(os, "fchmod")
    files.write_text_atomic(tmp_path / "summary.json", "{}")
    assert (tmp_path / "summary.json").read_text(encoding="utf-8") == "{}"
    assert not list(tmp_path.glob("*.tmp"))


def _windows_kill(calls):
    """os.kill as on Windows, where signal 0 is CTRL_C_EVENT: a Ctrl-C sent to the console's processes, or an error
    for an id that is no process group."""
    def kill(pid, signum):
        calls.append((pid, signum))
        raise OSError(errno.EINVAL, "The parameter is incorrect")

    return kill


def test_checkpoint_save_asks_no_process_with_a_signal_on_windows(tmp_path, monkeypatch):
    # a killed earlier writer's temporary file (another process id) beside the checkpoint: on Windows os.kill(pid, 0)
    # failed the save (or sent Ctrl-C to the console); the file is left there, the save goes on
    stale = tmp_path / ".model.safetensors.999999.abcdef.tmp"
    stale.write_bytes(b"partial")
    calls = []
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setattr(os, "kill", _windows_kill(calls))
    checkpoint.save_checkpoint(tmp_path / "model", {"w": torch.zeros(2)}, {})
    assert calls == []
    assert (tmp_path / "model.safetensors").is_file() and stale.exists()


def test_killed_commands_warnings_ask_no_process_with_a_signal_on_windows(tmp_path, monkeypatch):
    (tmp_path / f"{cli._WARNINGS_PREFIX}999999-abc").mkdir()
    calls = []
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setattr(os, "kill", _windows_kill(calls))
    cli._forget_killed_commands_warnings()
    assert calls == []


class _MPSLike(torch.Tensor):
    """A tensor that refuses float64 as one on Apple's MPS does (its `.cpu()` is a plain host tensor)."""

    def double(self):
        raise TypeError("Cannot convert a MPS Tensor to float64 dtype as the MPS framework doesn't support float64.")

    def cpu(self):
        return self.as_subclass(torch.Tensor).clone()


def test_population_evaluation_takes_no_float64_on_the_device(monkeypatch):
    # a population on MPS: evaluating it (every --seeds run's evaluations) computed the members' return stds in
    # float64 on the device, a TypeError there
    from rlspeed import PPO
    from rlspeed.population import Population, base

    played = base.first_episode_returns

    def on_mps(*args, **kwargs):
        returns, *rest = played(*args, **kwargs)
        return returns.as_subclass(_MPSLike), *rest

    monkeypatch.setattr(base, "first_episode_returns", on_mps)
    population = Population(PPO, "CartPole-v1", seeds=[0, 1], num_envs=2, num_steps=8, batch_size=16)
    means = population.evaluate(episodes=2)
    assert means.shape == (2,) and len(population.last_return_stds) == 2


def test_the_torchrun_wrapper_imports_without_sigkill(monkeypatch):
    # `rlspeed train --nproc N` runs `python -m rlspeed._torchrun`: on Windows (no SIGKILL) its import failed
    importlib.import_module("torch.distributed.run")  # (torch's own modules ask sys.platform)
    monkeypatch.delattr(signal, "SIGKILL")
    monkeypatch.delitem(sys.modules, "rlspeed._torchrun", raising=False)
    torchrun = importlib.import_module("rlspeed._torchrun")
    assert -int(signal.SIGTERM) in torchrun._ENDED_BY_TORCHRUN


def test_ctrl_c_of_an_nproc_run_on_windows_is_not_forwarded_to_torchrun(monkeypatch, tmp_path):
    # Windows: torchrun shares the launcher's console (no session of its own), so Ctrl-C reaches it directly, and
    # Popen.send_signal takes SIGTERM and the CTRL_* events only; forwarding SIGINT was a ValueError traceback
    import subprocess

    sent = []

    class Torchrun:
        def __init__(self, command, env, start_new_session, pass_fds=()):
            assert not pass_fds  # (Windows' Popen refuses them: "pass_fds not supported on Windows")

        def send_signal(self, signum):
            if signum != signal.SIGTERM:
                raise ValueError(f"Unsupported signal: {signum}")
            sent.append(signum)

        def wait(self):
            signal.getsignal(signal.SIGINT)(signal.SIGINT, None)  # (the console's Ctrl-C, while torchrun runs)
            return 1

    monkeypatch.setattr(subprocess, "Popen", Torchrun)
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "ppo", "CartPole-v1", "--nproc", "2", "--no-progress"]) == 130
    assert sent == []


def _windows_open(real):
    """os.open as on Windows, which opens no directory (PermissionError)."""
    def open_(path, flags, *args, **kwargs):
        if os.path.isdir(path):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path, flags, *args, **kwargs)

    return open_


def test_a_model_is_saved_where_directories_cannot_be_opened(tmp_path, monkeypatch):
    # the directory's fsync after the rename: on Windows os.open(directory) failed every save (the file written)
    from rlspeed import PPO

    model = PPO("CartPole-v1", num_envs=2, num_steps=8, batch_size=16)
    monkeypatch.setattr(os, "open", _windows_open(os.open))
    model.save(tmp_path / "model")
    monkeypatch.undo()
    assert PPO.load(tmp_path / "model").num_timesteps == 0


@pytest.fixture(scope="module")
def ascii_locale(tmp_path_factory):
    """The two scripts below run in one process of an ASCII locale without UTF-8 mode (LC_ALL=C, PYTHONUTF8=0; one
    interpreter start): (the directory of the paths script, {"paths": its output, "set": the set script's})."""
    where = tmp_path_factory.mktemp("ascii")
    paths = ("import rlspeed, rlspeed.presets\n"
             "model = rlspeed.PPO('CartPole-v1', num_envs=2, num_steps=8, batch_size=16, env_backend='torch')\n"
             f"where = {ascii(str(where / '运行 é'))}\n"
             "for call in (lambda: model.learn(16, run_dir=where), lambda: model.save(where + '/m'),\n"
             "             lambda: rlspeed.PPO.load(where + '/m'),\n"
             "             lambda: rlspeed.presets.load_preset('ppo', 'CartPole-v1', where),\n"
             "             lambda: rlspeed.CheckpointCallback(8, where),\n"
             "             lambda: rlspeed.EvalCallback(log_path=where)):\n"
             "    try:\n        call()\n"
             "    except rlspeed.UserError as error:\n        print('UserError', ascii(str(error)))\n")
    set_value = ("import os, sys; from rlspeed import cli; sys.stderr = sys.stdout\n"
                 "print(cli.main(['train', 'ppo', 'CartPole-v1', '--set',\n"
                 "                'gamma=' + os.fsdecode(b'\\xe4\\xb8\\xad')]))")
    said = run_in_ascii_locale(f"print('== paths')\n{paths}print('== set')\n{set_value}\n")
    _, paths_said, set_said = said.split("== ")
    return where, {"paths": paths_said.removeprefix("paths\n"), "set": set_said.removeprefix("set\n")}


def test_paths_the_locale_cannot_encode_are_one_sentence(ascii_locale):
    """Under an ASCII locale without UTF-8 mode (LC_ALL=C, PYTHONUTF8=0) a script's non-ASCII run_dir, save, load,
    preset or callback path cannot be a file name: a UserError that says how to run Python, where each was a
    UnicodeEncodeError traceback (learn's after the model was built, from deep in the run logger)."""
    where, said = ascii_locale
    lines = said["paths"].splitlines()
    assert len(lines) == 6 and all(line.startswith("UserError") and "PYTHONUTF8=1" in line for line in lines), lines
    assert os.listdir(where) == []


def test_a_set_value_whose_bytes_the_locale_cannot_read_says_how_to_run(ascii_locale):
    """`--set activation=中文` under LC_ALL=C without UTF-8 mode reaches Python as undecodable bytes: the refusal said
    only that the value could not be read; it says why, and how to run so that it can."""
    said = ascii_locale[1]["set"]
    assert "locale's encoding, ascii" in said and "LC_ALL=C.UTF-8" in said and said.splitlines()[-1] == "2"
    with pytest.raises(UserError, match="cannot read value .* not UTF-8 text"):  # (UTF-8 mode: bytes of another code)
        cli._parse_set(["gamma=" + os.fsdecode(b"\xff")])


def test_episode_returns_are_summed_in_float32_on_a_device_without_float64(monkeypatch):
    # NPUs and Intel's Arc GPUs have no float64, like MPS: the env's episode statistics follow the device's rule (they
    # asked for float64 everywhere but MPS)
    from rlspeed import device, make_env

    monkeypatch.setattr(device, "rules", lambda d: device.DeviceRules(torch.int32, False, False, float64=False))
    env = make_env("CartPole-v1", num_envs=2, device="cpu", seed=0, backend="torch")
    env.reset()
    returns = []
    for _ in range(60):
        _, _, _, _, info = env.step(torch.zeros(2, dtype=torch.long))
        returns.append(info["episode_return"])
    assert {r.dtype for r in returns} == {torch.float32}
