"""Data-parallel training under torchrun (gloo, 2 CPU processes): identical replicas, step accounting, restarts."""

import json
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlspeed.distributed import DistributedStrategy

HELPERS = Path(__file__).parent / "helpers"


def torchrun(*args: str, logs: Path, nproc: int = 2, max_restarts: int = 0) -> list[str]:
    """torchrun's command line, its log directory `logs` (a test's tmp_path: without one torchrun leaves a
    torchelastic_* directory in the temp directory at each launch)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            f"--max-restarts={max_restarts}", "--log-dir", str(logs), *args]


def clean_env() -> dict:
    env = dict(os.environ)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    env["OMP_NUM_THREADS"] = "1"
    env["RLSPEED_DEVICE"] = "cpu"  # these tests are about gloo on CPU processes (a one-GPU machine has no cuda:1)
    return env


def test_single_process_strategy_is_a_no_op(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    strategy = DistributedStrategy()
    assert not strategy.enabled and strategy.is_main
    assert strategy.split_envs(8) == 8
    assert strategy.seed_for_rank(5) == 5
    grad = torch.ones(3)
    param = torch.nn.Parameter(torch.zeros(3))
    param.grad = grad.clone()
    strategy.all_reduce_gradients([param])
    assert torch.equal(param.grad, grad)


def test_more_processes_than_gpus_is_a_clear_error(monkeypatch):
    from rlspeed import distributed
    from rlspeed.errors import UserError

    for key, value in (("WORLD_SIZE", "2"), ("RANK", "1"), ("LOCAL_RANK", "1")):
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(distributed, "resolve_device", lambda spec: torch.device(spec))
    monkeypatch.setattr(distributed, "device_count", lambda kind: 1)  # one GPU, two processes
    with pytest.raises(UserError, match=r"cuda:1.*1 cuda device\(s\).*--nproc.*--device cpu"):
        DistributedStrategy(device="cuda")


def test_ranks_hold_bitwise_identical_parameters_and_count_all_steps(tmp_path):
    result = subprocess.run(torchrun(str(HELPERS / "dist_worker.py"), str(tmp_path), logs=tmp_path / "logs"),
                            env=clean_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    rank0, rank1 = (load_file(str(tmp_path / f"rank{r}.safetensors")) for r in (0, 1))
    assert rank0.keys() == rank1.keys()
    for key in rank0:
        assert torch.equal(rank0[key], rank1[key]), f"{key} differs between ranks"
    info = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [i["local_envs"] for i in info] == [2, 2]  # num_envs=4 split over 2 ranks
    # total env steps = the sum over ranks: 3 iterations x 32 steps x (2 + 2) envs
    assert info[0]["num_timesteps"] == info[1]["num_timesteps"] == 3 * 32 * 4
    assert info[0]["words"] == info[1]["words"] == [None, "", "refusé: 'run\udcff'"]  # (`broadcast_text`)


def test_two_rank_ppo_solves_cartpole(tmp_path):
    out = tmp_path / "run"
    result = subprocess.run(torchrun("-m", "rlspeed", "train", "ppo", "CartPole-v1", "--no-progress",
                                     "--out", str(out), logs=tmp_path / "logs"), env=clean_env(),
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["distributed"]["world_size"] == 2
    assert summary["time_to_target_s"] is not None
    assert summary["final_eval"]["mean"] >= 400  # the target (475) was reached in training evaluation


def test_killed_rank_restarts_group_and_resumes_from_checkpoint(tmp_path):
    out = tmp_path / "run"
    command = torchrun("-m", "rlspeed", "train", "ppo", "CartPole-v1", "--no-progress", "--out", str(out),
                       "--target-return", "none", "--total-timesteps", "6144", "--checkpoint-freq", "1024",
                       "--eval-episodes", "1", logs=tmp_path / "logs", max_restarts=1)
    # Output goes to files, not pipes: a full pipe would block the workers while the test waits for a checkpoint.
    stdout_path, stderr_path = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with open(stdout_path, "w") as stdout_file, open(stderr_path, "w") as stderr_file:
        process = subprocess.Popen(command, env=clean_env(), stdout=stdout_file, stderr=stderr_file, text=True)
    checkpoint = out / "checkpoint.safetensors"
    deadline = time.time() + 240
    while not checkpoint.exists() and time.time() < deadline and process.poll() is None:
        time.sleep(0.2)
    assert checkpoint.exists(), "no checkpoint was written before the deadline"
    workers = subprocess.run(["pgrep", "-P", str(process.pid)], capture_output=True, text=True).stdout.split()
    assert workers, "torchrun has no worker processes"
    os.kill(int(workers[-1]), signal.SIGKILL)  # one rank dies mid-run
    process.wait(timeout=400)
    stdout, stderr = stdout_path.read_text(), stderr_path.read_text()
    assert process.returncode == 0, stderr[-3000:]
    assert "resumed from" in stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["distributed"]["restarts"] == summary["distributed"]["resumes"] == 1
    resumed = summary["distributed"]["resumed_from_timesteps"]
    assert resumed is not None and resumed >= 1024
    # the restarted group trained only what was left after the checkpoint
    assert resumed + summary["total_timesteps"] >= 6144
    assert summary["distributed"]["max_lost_timesteps"] == 1024


@pytest.mark.parametrize("bad", ["3"])
def test_num_envs_must_split_evenly(monkeypatch, bad):
    monkeypatch.setenv("WORLD_SIZE", "2")
    strategy = DistributedStrategy.__new__(DistributedStrategy)
    strategy.world_size, strategy.rank, strategy.local_rank = 2, 0, 0
    from rlspeed.errors import UserError

    with pytest.raises(UserError, match=r"multiple of the number of processes \(2\) so that every process steps as "
                                        r"many envs: use num_envs=2\.$"):  # (the command line's sentence)
        strategy.split_envs(int(bad))


def test_num_envs_that_does_not_split_is_refused_before_the_batch_size_it_makes(capsys, monkeypatch, tmp_path):
    """`--num-envs 63` with 2 processes was refused for its batch_size first ("252 or 504 would do"), and following
    that advice met the num_envs refusal: num_envs is checked first, with `--nproc` and under torchrun, and the
    advice that follows, for the rollout of the num_envs advised, holds."""
    from conftest import cli_error

    from rlspeed import cli

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    base = ["train", "ppo", "CartPole-v1", "--out", str(tmp_path / "run")]
    said = cli_error(capsys, [*base, "--num-envs", "63", "--nproc", "2"])
    assert "num_envs (63) must be a multiple of --nproc (2)" in said and "use --num-envs 62" in said
    said = cli_error(capsys, [*base, "--set", "num_envs=63", "--nproc", "2"])  # (it met batch_size's advice first)
    assert "num_envs (63) must be a multiple of --nproc (2)" in said and "use --set num_envs=62" in said
    # (two that disagree: that refusal, not advice to change the one that then still disagrees with the other)
    said = cli_error(capsys, [*base, "--num-envs", "63", "--set", "num_envs=64", "--nproc", "2"])
    assert said == "rlspeed: error: --num-envs 63 and --set num_envs=64 disagree: give one of them."
    said = cli_error(capsys, [*base, "--set", "num_envs=63.0", "--nproc", "2"])  # (a whole number too: as 63)
    assert "num_envs (63) must be a multiple of --nproc (2)" in said and "use --set num_envs=62" in said
    monkeypatch.setattr(cli, "_launch_torchrun", lambda args: cli._settings(args) and 0)  # (settings that hold)
    advice = re.search(r"--set batch_size=(\d+)", cli_error(capsys, [*base, "--num-envs", "62", "--nproc", "2"]))
    assert int(advice[1]) % 2 == 0  # (the rollout's size for 62 envs, which 2 processes share)
    assert cli.main([*base, "--num-envs", "62", "--nproc", "2", "--set", f"batch_size={advice[1]}"]) == 0
    monkeypatch.setenv("WORLD_SIZE", "2")  # (a worker of torchrun started by hand)
    said = cli_error(capsys, [*base, "--num-envs", "63"])
    assert "num_envs (63) must be a multiple of the number of processes (2)" in said and "--num-envs 62" in said
    # --set num_envs=63 too (it met the batch_size advice first)
    said = cli_error(capsys, [*base, "--set", "num_envs=63"])
    assert "num_envs (63) must be a multiple of the number of processes (2)" in said
    # the preset's num_envs (32) too, with the flag that changes it: it was caught only as the model split its envs
    # (another sentence, without advice), or, where it made a batch_size that does not split, by that one's advice
    monkeypatch.setenv("WORLD_SIZE", "3")
    for more in ([], ["--set", "num_steps=16"]):
        said = cli_error(capsys, [*base, *more])
        assert said == ("rlspeed: error: num_envs (32) must be a multiple of the number of processes (3) so that every "
                        "process steps as many envs: use --num-envs 30.")
    assert not (tmp_path / "run").exists()


def test_ppo_minibatch_must_split_evenly():
    """Each rank takes batch_size / world rows per minibatch from its share of the rollout: with an odd batch_size
    on 2 processes, 75-row shares would be cut into 37-row minibatches and a row dropped silently."""
    from rlspeed import PPO
    from rlspeed.errors import UserError

    with pytest.raises(UserError, match=r"batch_size \(75\) must be a multiple of the number of processes \(2\)"):
        PPO("CartPole-v1", device="cpu", strategy=TwinRanks(), num_envs=2, num_steps=75, batch_size=75)
    PPO("CartPole-v1", device="cpu", num_envs=2, num_steps=75, batch_size=75)  # one process: any divisor is fine


def test_ppo_batch_size_advice_with_several_processes_passes_every_rule(capsys, monkeypatch, tmp_path):
    """With 2 processes, batch_size=4 of a 6-step rollout was advised "batch_size=3 or 6" (the rollout's rule alone),
    and 3 then met the processes' rule, refused without advice: both refusals name sizes valid under both rules, from
    the model (its strategy's processes) and from `rlspeed train --nproc`, before any worker starts."""
    from conftest import cli_error

    from rlspeed import PPO, RecurrentPPO, cli
    from rlspeed.errors import UserError

    settings = dict(device="cpu", strategy=TwinRanks(), num_envs=2, num_steps=3)
    with pytest.raises(UserError, match=r"^batch_size \(4\) must divide num_envs \* num_steps \(6\) and be a multiple "
                                        r"of the number of processes \(2\).*: batch_size=2 or 6 would do\.$"):
        PPO("CartPole-v1", **settings, batch_size=4)
    with pytest.raises(UserError, match=r"^batch_size \(3\) must be a multiple of the number of processes \(2\).*: "
                                        r"batch_size=2 or 6 would do\.$"):
        PPO("CartPole-v1", **settings, batch_size=3)
    PPO("CartPole-v1", **settings, batch_size=2)
    # RecurrentPPO's sequences split over the processes too (32 of 64 is one sequence: advised for one process)
    with pytest.raises(UserError, match=r"^batch_size \(48\) must divide num_envs \* num_steps \(64\) into sequences "
                                        r".*: batch_size=64 would do\.$"):
        RecurrentPPO("CartPole-v1", **{**settings, "num_steps": 32}, batch_size=48)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(cli, "_launch_torchrun", lambda args: cli._settings(args) and 0)  # (settings that hold)
    said = cli_error(capsys, ["train", "ppo", "CartPole-v1", "--out", str(tmp_path / "run"), "--num-envs", "2",
                              "--set", "num_steps=3", "--set", "batch_size=4", "--nproc", "2"])
    assert "--set batch_size=2 or 6 would do" in said


def test_synced_statistics_stay_accurate_for_features_with_a_large_mean():
    """The distributed path of RunningMeanStd (moments summed over ranks, folded once per iteration) agrees with the
    single-process path where E[x^2] - E[x]^2 would cancel in float32 (mean 1000, std 0.1: it went negative)."""
    from rlspeed.envs import RunningMeanStd

    generator = torch.Generator().manual_seed(0)
    single, synced = RunningMeanStd((3,)), RunningMeanStd((3,))
    synced.reduce = lambda moments: moments  # one rank: the all-reduce is the identity
    for _ in range(2):  # the first flush matters: the running mean is still 0 there
        batch = 1000.0 + 0.1 * torch.randn(64, 3, generator=generator)
        single.update(batch)
        synced.update(batch)
        synced.update(batch)  # two steps per iteration, as a rollout folds several
        synced.flush()
        single.update(batch)
    torch.testing.assert_close(synced.mean, single.mean)
    torch.testing.assert_close(synced.var, single.var, rtol=1e-3, atol=1e-6)
    assert bool((synced.var > 0).all()) and bool(synced.normalize(single.mean).isfinite().all())


class TwinRanks(DistributedStrategy):
    """Rank 0 of 2 whose peer is its exact twin: an all-reduced sum is twice this rank's value (no process group)."""

    def __init__(self):
        self.world_size, self.rank, self.local_rank = 2, 0, 0
        self.device, self.backend = torch.device("cpu"), None

    def broadcast_module(self, module):
        pass

    def all_reduce_gradients(self, params):
        pass  # the twin's gradients are the same: their average is this rank's

    def all_reduce_sum(self, tensor):
        return tensor.mul_(2)

    def broadcast_flag(self, flag):
        return flag

    def max_over_ranks(self, value):
        return value

    def barrier(self):
        pass

    def shutdown(self, wait: bool = True):
        pass


def test_dqn_schedules_count_the_env_steps_of_every_rank():
    """With 2 ranks of 4 envs, num_timesteps grows by 2 x 4 x train_freq per iteration: the target network is copied
    every target_update_interval of those steps (it was never copied when the interval equals one iteration of
    all ranks), and epsilon follows the same count."""
    from rlspeed import DQN

    model = DQN("CartPole-v1", device="cpu", strategy=TwinRanks(), seed=0, num_envs=8, train_freq=16,
                target_update_interval=128, learning_starts=0, batch_size=32, net_arch=(16,),
                exploration_fraction=0.5, gradient_steps=1)
    initial = [p.detach().clone() for p in model.q_target.parameters()]
    model.learn(1024, progress_bar=False)
    assert model.num_timesteps == 1024
    assert any(not torch.equal(t, i) for t, i in zip(model.q_target.parameters(), initial))
    assert all(torch.equal(t, o) for t, o in zip(model.q_target.parameters(), model.q_network.parameters()))
    assert model.epsilon(model.num_timesteps) == pytest.approx(model.config.exploration_final_eps)
    # epsilon mid-schedule after one more iteration: that of all ranks' 2 x 4 x 16 steps, not this rank's 4 x 16
    model._learn_start, model._schedule_end = 0, 4096
    _, metrics = model._train_iteration()
    assert float(metrics["epsilon"]) == pytest.approx(model.epsilon(1024 + 2 * 4 * 16))
    assert float(metrics["epsilon"]) != pytest.approx(model.epsilon(1024 + 4 * 16))


def test_unseeded_ranks_draw_their_own_randomness():
    """Without a seed, every process would keep torch's fixed default seed and the ranks would explore alike."""
    from rlspeed import DQN

    draws = []
    for _ in range(2):
        torch.manual_seed(0)  # what every freshly started process has, in effect
        DQN("CartPole-v1", device="cpu", strategy=TwinRanks(), num_envs=2, net_arch=(8,))
        draws.append(torch.rand(3))
    assert not torch.equal(draws[0], draws[1])


def test_nproc_1_trains_under_its_launchers_run_directory_lock(tmp_path):
    """`rlspeed train --nproc 1` (one worker under torchrun, for --max-restarts) runs: the launcher holds the run
    directory's lock and its worker does not take it again (it refused itself: "another rlspeed process")."""
    result = subprocess.run([sys.executable, "-m", "rlspeed", "train", "ppo", "CartPole-v1", "--nproc", "1",
                             "--total-timesteps", "256", "--target-return", "none", "--no-progress", "--device", "cpu",
                             "--out", str(tmp_path / "run")], env=clean_env(), capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["total_timesteps"] >= 256


def _rank_pid(out: Path, rank: int) -> int:
    """The process id of the worker of rank `rank` training in `out` (Linux: read from its environment)."""
    for pid in subprocess.run(["pgrep", "-f", str(out)], capture_output=True, text=True).stdout.split():
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ and b"LOCAL_RANK" in b"".join(environ):
            return int(pid)
    raise AssertionError(f"no worker of rank {rank} found")


# (Ctrl-C to the group of a run without subprocess envs takes the same path as with them, where env processes are
# forked: `_stopping`; the run without them is stopped by "rank 1" and torchrun's SIGKILL below)
@pytest.mark.parametrize("target", ["group, subprocess envs", "rank 1"])
def test_ctrl_c_to_an_nproc_run_stops_every_rank_at_one_iteration_and_saves(tmp_path, target):
    """Ctrl-C (SIGINT to the launcher's process group) during `rlspeed train --nproc 2`, or SIGTERM to one worker: the
    launcher hands a signal it gets to torchrun and waits for it, every rank stops at the end of the iteration where
    a rank got it (none waits in a collective its peers left: with subprocess envs too, which torchrun's signal to a
    worker's process group does not stop mid-iteration), the run is saved as interrupted, one line says so (no rank's
    or torchrun's traceback), and no worker or env process outlives the launcher (which holds the run directory's
    lock until then)."""
    out = tmp_path / "run"
    stdout_path, stderr_path = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    backend = ["--env-backend", "gymnasium-async", "--num-envs", "4"] if "subprocess" in target else []
    with open(stdout_path, "w") as stdout_file, open(stderr_path, "w") as stderr_file:
        process = subprocess.Popen([sys.executable, "-m", "rlspeed", "train", "ppo", "CartPole-v1", "--nproc", "2",
                                    "--total-timesteps", "2000000", "--checkpoint-freq", "1024", "--target-return",
                                    "none", "--no-progress", "--device", "cpu", "--out", str(out), *backend],
                                   env=clean_env(), stdout=stdout_file, stderr=stderr_file, text=True,
                                   start_new_session=True)
    deadline = time.time() + 240
    while not (out / "checkpoint.safetensors").exists() and time.time() < deadline and process.poll() is None:
        time.sleep(0.2)
    assert (out / "checkpoint.safetensors").exists(), stderr_path.read_text()[-3000:]
    if target.startswith("group"):
        os.killpg(process.pid, signal.SIGINT)  # (a terminal's Ctrl-C)
        assert process.wait(timeout=120) == 130, stderr_path.read_text()[-3000:]
    else:  # a signal that reaches one worker only stops every rank too
        if sys.platform != "linux":
            pytest.skip("finds the rank's process through /proc")
        os.kill(_rank_pid(out, 1), signal.SIGTERM)
        process.wait(timeout=120)
    left = subprocess.run(["pgrep", "-f", str(out)], capture_output=True, text=True).stdout.split()
    assert not left  # (no worker outlives the launcher: their command lines name the run directory)
    stderr = stderr_path.read_text()
    # (rank 0 says it, where it got the signal; every rank's is saved as one run, on one line)
    assert stderr.count("stopping after this iteration") == (1 if target.startswith("group") else 0)
    assert stderr.count("rlspeed: interrupted") == 1
    assert "[rank" not in stderr and "Traceback" not in stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True and (out / "model.safetensors").exists()


def test_torchrun_killed_with_sigkill_leaves_no_worker_training_and_the_run_saved(tmp_path):
    """torchrun itself killed with SIGKILL (an out-of-memory killer, `kill -9`) left its workers training as orphans,
    and `rlspeed train --nproc` returned at once, silently, exit status 247. The workers now stop at their iteration's
    end and save (the kernel's SIGTERM as torchrun dies), the launcher waits for them, says so and exits 137, and no
    process of the run is left (Linux: `rlspeed.lifetime`)."""
    if sys.platform != "linux":
        pytest.skip("prctl and /proc: Linux only")
    out = tmp_path / "run"
    with open(tmp_path / "stderr.txt", "w") as stderr_file:
        process = subprocess.Popen([sys.executable, "-m", "rlspeed", "train", "ppo", "CartPole-v1", "--nproc", "2",
                                    "--total-timesteps", "2000000", "--checkpoint-freq", "1024", "--target-return",
                                    "none", "--no-progress", "--device", "cpu", "--out", str(out)],
                                   env=clean_env(), stdout=subprocess.DEVNULL, stderr=stderr_file, text=True)
    try:
        deadline = time.time() + 240
        while not (out / "checkpoint.safetensors").exists() and time.time() < deadline and process.poll() is None:
            time.sleep(0.2)
        assert (out / "checkpoint.safetensors").exists(), (tmp_path / "stderr.txt").read_text()[-3000:]
        torchrun = subprocess.run(["pgrep", "-f", f"rlspeed._torchrun .*{out}"], capture_output=True,
                                  text=True).stdout.split()
        assert len(torchrun) == 1
        os.kill(int(torchrun[0]), signal.SIGKILL)
        assert process.wait(timeout=120) == 137
        left = subprocess.run(["pgrep", "-f", str(out)], capture_output=True, text=True).stdout.split()
        assert not left  # (no worker trains on: their command lines name the run directory)
    finally:
        process.kill()
        for pid in subprocess.run(["pgrep", "-f", str(out)], capture_output=True, text=True).stdout.split():
            os.kill(int(pid), signal.SIGKILL)  # (a failed test leaves no trainer behind)
    stderr = (tmp_path / "stderr.txt").read_text()
    assert "rlspeed: torchrun ended by SIGKILL: waiting up to 30 s for the 2 process(es) it left" in stderr, stderr
    assert "Traceback" not in stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True and (out / "model.safetensors").exists()


def test_nproc_refuses_what_its_workers_would_before_starting_them(tmp_path, capsys, monkeypatch):
    """What the workers would refuse (`--accelerate auto`), and --nproc under torchrun, are one sentence from the
    launcher, exit 2, before any worker starts or any directory is made."""
    from conftest import cli_error

    monkeypatch.setenv("RLSPEED_DEVICE", "cpu")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(subprocess, "Popen", lambda command, **kwargs: pytest.fail(f"a process started: {command}"))
    base = ["train", "ppo", "CartPole-v1", "--nproc", "2", "--no-progress", "--out", str(tmp_path / "run")]
    assert cli_error(capsys, [*base, "--accelerate", "auto"]).count("--accelerate auto is not supported") == 1
    assert not (tmp_path / "run").exists()
    with monkeypatch.context() as nested:
        nested.setenv("WORLD_SIZE", "2")
        assert "under torchrun (WORLD_SIZE is set) leave --nproc out" in cli_error(capsys, base)
    # more CPU processes than cores: refused before num_envs's advice, which named a multiple of them
    many = str((os.cpu_count() or 1) * 32)
    assert f"--nproc {many} is more processes than the" in cli_error(capsys, [*base[:4], many, *base[5:]])
    assert not (tmp_path / "run").exists()
    if hasattr(os, "sched_setaffinity"):  # (a SLURM job of 1 CPU on a larger machine: its CPUs count)
        cores = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {min(cores)})
        try:
            pinned = cli_error(capsys, base)
        finally:
            os.sched_setaffinity(0, cores)
        assert "--nproc 2 is more processes than the 1 CPU core this command may run on" in pinned
        assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", [["tune", "ppo", "CartPole-v1"], ["profile", "ppo", "CartPole-v1"],
                                     ["train", "ppo", "CartPole-v1", "--seeds", "0-1"]])
def test_tune_and_profile_under_torchrun_are_refused_in_one_sentence(command, capsys, monkeypatch, tmp_path):
    """Under torchrun every rank ran its own study (one killed the other over the study's lock) or profiled a run of
    its own, printing and writing the same files twice, or trained a population into one run directory (the other
    ranks failed on its lock, exit 75, and torchrun printed its failure report): they run in one process."""
    command = [*command, "--out", str(tmp_path / "run")] if command[0] == "train" else command
    from conftest import cli_error

    monkeypatch.setenv("WORLD_SIZE", "2")
    assert "runs in one process" in cli_error(capsys, command) and "without torchrun" in cli_error(capsys, command)


def test_a_bad_input_the_workers_find_exits_2_without_torchruns_report_or_a_directory_left(tmp_path):
    """An env option the env refuses is found by the workers (they make the env): the launcher exited 1 under
    torchrun's ChildFailedError traceback and left a directory holding only its lock, which the rerun was refused
    for. Now exit code 2, the workers' one-line error, and no directory."""
    done = subprocess.run([sys.executable, "-m", "rlspeed", "train", "ppo", "CartPole-v1", "--nproc", "2",
                           "--no-progress", "--env-kwargs", "nope=1", "--out", str(tmp_path / "run")],
                          env=clean_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert "rejected the options nope" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("failing_rank", ["1", "0"])
def test_one_ranks_env_error_ends_an_nproc_run_in_its_sentence_and_one_line_per_peer(tmp_path, failing_rank):
    """One rank's env raising ended `rlspeed train --nproc 2` in ~100 lines: that rank's sentence, a misleading
    "SIGTERM: stopping after this iteration" from rank 0 (torchrun's stop for the failure), rank 0's gloo traceback
    ("Connection closed by peer") and torchrun's failure report. Now the env's sentence, one line from the peer
    naming the process that ended, exit code 1."""
    env = {**clean_env(), "FAILING_RANK": failing_rank,
           "PYTHONPATH": os.pathsep.join([str(HELPERS), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "rlspeed", "train", "ppo", "failing_rank_env:FailingRank-v0",
                           "--nproc", "2", "--env-backend", "gymnasium", "--no-progress", "--total-timesteps",
                           "20000", "--out", str(tmp_path / "run")], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 1, done.stderr[-3000:]
    assert done.stderr.count("raised RuntimeError in step(): sensor cable unplugged") == 1, done.stderr[-3000:]
    other = 1 - int(failing_rank)
    assert f"Process {other} of 2 stopped: process {failing_rank} ended with exit code 1" in done.stderr
    for noise in ("Traceback", "[rank", "stopping after this iteration", "ChildFailedError", "closing signal"):
        assert noise not in done.stderr, done.stderr[-3000:]


def test_a_refusal_every_nproc_worker_finds_is_printed_once_and_other_lines_stay(capsys, monkeypatch, tmp_path):
    """Under `rlspeed train --nproc 2` every worker printed the same refusal (RecurrentPPO's default batch_size, one
    sequence for two processes): the user read the sentence twice. A line another worker of the attempt printed
    (claimed in the launcher's folder) is left out, its exit code stays 2; another line, or the same one in a
    restarted attempt, is printed."""
    from conftest import cli_error

    from rlspeed import cli
    from rlspeed.lifetime import SAID_FOLDER_VARIABLE

    monkeypatch.setenv(SAID_FOLDER_VARIABLE, str(tmp_path))
    monkeypatch.setenv("WORLD_SIZE", "2")
    command = ["tune", "ppo", "CartPole-v1"]
    said = cli_error(capsys, command)  # (the first worker)
    assert cli.main(command) == 2 and capsys.readouterr().err == ""  # (the second: the same line, once)
    assert "runs in one process" in cli_error(capsys, ["profile", "ppo", "CartPole-v1"])  # (a line of its own)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert cli_error(capsys, command) == said


def test_a_refusal_every_worker_of_torchrun_started_by_hand_finds_is_printed_once(capsys, monkeypatch, tmp_path):
    """Under `torchrun --nproc-per-node 2 -m rlspeed train ...` (no rlspeed launcher, so no launcher's folder) every
    worker printed the same refusal: the workers of an attempt claim the line in the attempt's folder of torchrun's
    log directory (above each one's TORCHELASTIC_ERROR_FILE), so it is printed once; another line, or a folder that
    is not torchrun's, is printed."""
    from conftest import cli_error

    from rlspeed import cli
    from rlspeed.lifetime import SAID_FOLDER_VARIABLE

    monkeypatch.delenv(SAID_FOLDER_VARIABLE, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "run")
    attempt = tmp_path / "run_x" / "attempt_0"
    attempt.mkdir(parents=True)
    command = ["tune", "ppo", "CartPole-v1"]
    for rank in (0, 1):
        monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(attempt / str(rank) / "error.json"))
        if rank == 0:
            said = cli_error(capsys, command)
        else:
            assert cli.main(command) == 2 and capsys.readouterr().err == ""  # (the same line, once)
    assert "runs in one process" in cli_error(capsys, ["profile", "ppo", "CartPole-v1"])  # (a line of its own)
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "elsewhere" / "error.json"))
    assert cli_error(capsys, command) == said


def test_save_replay_buffer_with_nproc_is_refused_before_torchrun_starts(capsys, monkeypatch, tmp_path):
    """`--save-replay-buffer --nproc 2` trained and wrote process 0's replay buffer beside each checkpoint (the other
    process's transitions nowhere), and a --nproc resume ignored it with a warning (each process refilled its buffer
    from empty): now one sentence, exit code 2, before torchrun starts or a directory is made; a resume that takes
    the setting from its run says how to turn it off."""
    from conftest import cli_error

    from rlspeed import cli

    def launched(args):
        raise AssertionError("torchrun was started")

    monkeypatch.setattr(cli, "_launch_torchrun", launched)
    run = tmp_path / "run"
    line = cli_error(capsys, ["train", "dqn", "CartPole-v1", "--nproc", "2", "--save-replay-buffer", "--out", str(run)])
    assert "--save-replay-buffer applies to a run in one process" in line and "drop --save-replay-buffer" in line
    assert not run.exists()
    run.mkdir()
    (run / "config.yaml").write_text("algo: dqn\nenv_id: CartPole-v1\nseed: 0\nsave_replay_buffer: true\n")
    line = cli_error(capsys, ["train", "dqn", "CartPole-v1", "--nproc", "2", "--resume", "--out", str(run)])
    assert "resume with --no-save-replay-buffer" in line


def test_save_replay_buffer_under_several_processes_is_refused_from_python(tmp_path):
    """`DQN(..., strategy=<2 processes>, save_replay_buffer=True)` from Python (torchrun running a user's script)
    trained and wrote process 0's replay buffer beside each checkpoint, which a resume ignored with a warning: the
    keyword, assigning `model.save_replay_buffer = True` later and a `CheckpointCallback(save_replay_buffer=True)`
    are refused in the CLI's sentence; one process still takes it."""
    from rlspeed import DQN
    from rlspeed.callbacks import CheckpointCallback
    from rlspeed.errors import UserError

    with pytest.raises(UserError, match=r"save_replay_buffer=True applies to a run in one process: under torchrun"):
        DQN("CartPole-v1", device="cpu", strategy=TwinRanks(), num_envs=2, net_arch=(8,), save_replay_buffer=True)
    model = DQN("CartPole-v1", device="cpu", strategy=TwinRanks(), num_envs=2, net_arch=(8,))
    with pytest.raises(UserError, match="applies to a run in one process"):
        model.save_replay_buffer = True
    assert model.save_replay_buffer == False  # noqa: E712  (a ReplayBufferSaving: compares as its bool)
    model.save_replay_buffer = False  # (turning it off is no question of processes)
    checkpoints = CheckpointCallback(save_freq=8, save_path=tmp_path / "saves", save_replay_buffer=True)
    with pytest.raises(UserError, match=r"CheckpointCallback\(save_replay_buffer=True\) applies to a run in one"):
        checkpoints.init_callback(model)  # (as learn starts: not at its first save, hours in)
    assert DQN("CartPole-v1", device="cpu", num_envs=2, net_arch=(8,), save_replay_buffer=True).save_replay_buffer


def test_checkpoint_callback_with_save_replay_buffer_saves_a_model_without_one(tmp_path):
    """`CheckpointCallback(save_replay_buffer=True)` on PPO (a Stable-Baselines3 script's, where it means nothing for
    a model without a replay buffer) saves the model, in one process and under several (where it was refused as if
    PPO had a replay buffer to save): the callback asks the model for replay saving only where it keeps one."""
    from rlspeed import PPO
    from rlspeed.callbacks import CheckpointCallback

    for strategy in (None, TwinRanks()):
        model = PPO("CartPole-v1", seed=0, device="cpu", num_envs=2, num_steps=8, batch_size=16, net_arch=(8,),
                    strategy=strategy)
        callback = CheckpointCallback(save_freq=16, save_path=tmp_path / str(bool(strategy)), save_replay_buffer=True)
        model.learn(32, callback=callback, progress_bar=False)
        assert [path.name for path in callback.saved] == ["rl_model_16_steps.safetensors",
                                                          "rl_model_32_steps.safetensors"]
        assert not model.save_replay_buffer


def test_a_collective_broken_by_a_peers_end_is_one_line_naming_it_and_other_errors_stay(monkeypatch, tmp_path):
    """A collective whose peer ended (gloo's "Connection closed by peer") raises PeerEnded naming the process that said
    why it ended (`tell_launcher`, in the launcher's folder), or saying that one ended where none did; a collective's
    other errors are not renamed."""
    import torch.distributed as dist

    from rlspeed.errors import PeerEnded
    from rlspeed.lifetime import SAID_FOLDER_VARIABLE, tell_launcher

    strategy = DistributedStrategy.__new__(DistributedStrategy)
    strategy.world_size, strategy.rank, strategy.local_rank, strategy.device = 3, 0, 0, torch.device("cpu")
    error = RuntimeError("[../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:22955")

    def broken(*args, **kwargs):
        raise error

    monkeypatch.setattr(dist, "all_reduce", broken)
    monkeypatch.setenv(SAID_FOLDER_VARIABLE, str(tmp_path))
    with pytest.raises(PeerEnded, match="another process of the run ended or stopped answering") as ended:
        strategy.all_reduce_sum(torch.zeros(2))
    assert ended.value.__cause__ is error
    monkeypatch.setenv("RANK", "2")
    tell_launcher(1)  # (rank 2 of this attempt said why it ends: exit code 1)
    (tmp_path / "999999").write_text("0 1 1 follows")  # (rank 1 ended because another did: not named)
    with pytest.raises(PeerEnded, match=r"^Process 0 of 3 stopped: process 2 ended with exit code 1 \(its message"):
        strategy.max_over_ranks(1)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # (a restarted attempt: the earlier attempt's end is old)
    parameter = torch.zeros(2, requires_grad=True)
    parameter.grad = torch.ones(2)
    with pytest.raises(PeerEnded, match="another process of the run ended"):
        strategy.all_reduce_gradients([parameter])
    error = RuntimeError("Tensors must be contiguous")
    with pytest.raises(RuntimeError, match="must be contiguous") as other:
        strategy.all_reduce_sum(torch.zeros(2))
    assert not isinstance(other.value, PeerEnded)


def test_a_peer_ending_while_the_group_forms_is_one_line(monkeypatch):
    """A bad input one process found while another was still forming the process group (a loaded machine) ended that
    other in gloo's "Connection closed by peer" traceback, and the launcher with its exit code 1 instead of 2."""
    import torch.distributed as dist

    from rlspeed.errors import PeerEnded

    def broken(*args, **kwargs):
        raise RuntimeError("Gloo connectFullMesh failed with [../gloo/transport/tcp/pair.cc:553] Connection closed by "
                           "peer [127.0.0.1]:16618.")

    monkeypatch.setattr(dist, "init_process_group", broken)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(PeerEnded, match="^Process 0 of 2 stopped: another process of the run ended"):
        DistributedStrategy(device="cpu")
    refused = RuntimeError("The client socket has failed to connect to [10.0.0.9]:29500 (errno: 111 - Connection "
                           "refused).")

    def unreachable(*args, **kwargs):
        raise refused

    # (no peer ever reached: a wrong MASTER_ADDR, a launch without torchrun's rendezvous; its own error stays)
    monkeypatch.setattr(dist, "init_process_group", unreachable)
    with pytest.raises(RuntimeError) as raised:
        DistributedStrategy(device="cpu")
    assert raised.value is refused


def test_the_launcher_keeps_torchruns_report_unless_every_failed_worker_said_why():
    """`python -m rlspeed._torchrun` ends with the first failed worker's code where it said why (its file in the
    launcher's folder, or a code only a said ending has) and every other failed worker said why too or was ended by
    torchrun; a worker that crashed (killed, an uncaught exception) keeps torchrun's report."""
    from rlspeed._torchrun import _quiet_code

    class Failure:
        def __init__(self, pid, exitcode):
            self.pid, self.exitcode = pid, exitcode

    class ChildFailedError(Exception):
        def __init__(self, *failures):
            self.failures = dict(enumerate(failures))

        def get_first_failure(self):
            return 0, self.failures[0]

    said = {101: ("0", 1, 1, False), 102: ("0", 0, 1, False)}
    assert _quiet_code(ChildFailedError(Failure(101, 1), Failure(102, 1)), said) == 1
    # (a worker whose group broke because another ended gives way to that one, whichever torchrun saw first: a bad
    # input found by process 1 while process 0 still formed the group was exit code 1)
    followed = {101: ("0", 0, 1, True), 105: ("0", 1, 2, False)}
    assert _quiet_code(ChildFailedError(Failure(101, 1), Failure(105, 2)), followed) == 2
    assert _quiet_code(ChildFailedError(Failure(101, -6), Failure(102, -15)), said) == 1  # (aborted at teardown)
    assert _quiet_code(ChildFailedError(Failure(103, 2), Failure(102, 1)), said) == 2
    assert _quiet_code(ChildFailedError(Failure(103, -9), Failure(102, 1)), said) is None  # (killed: report stays)
    assert _quiet_code(ChildFailedError(Failure(101, 1), Failure(103, 1)), said) is None  # (a traceback: stays)
    assert _quiet_code(ChildFailedError(Failure(103, 1), Failure(104, -15)), {}) is None


def test_the_launcher_keeps_the_log_loglevel_asks_for_and_leaves_no_folder_and_its_workers_run_exit_handlers(tmp_path):
    """One `python -m rlspeed._torchrun` (`rlspeed train --nproc`) of 2 workers that leave at once, for three promises
    (one launch, not three):

    - it turns torchrun's own log off, which repeats what the workers say; it also turned off the log LOGLEVEL=INFO
      asks torchrun for (its rendezvous, its restarts), which is how torchrun is debugged;
    - it gives torchrun a log directory of its own, removed as it ends: torchrun made a torchelastic_* directory in
      the temp directory at each launch and never removed it (hundreds of them after a CI day). A launcher killed
      with SIGKILL (an out-of-memory kill, a scheduler's hard stop) could not remove its folder of workers' notes and
      torchrun's logs: the next launcher removes the folders of launchers that no longer run, and leaves those of
      running ones;
    - a worker leaves with `os._exit` (`DistributedStrategy.leave`, after the work is written): the interpreter's
      exit handlers, which remove the temporary directories libraries made (W&B makes two as it is imported), run
      first; each `rlspeed train --nproc 2 --track` left W&B's tmp*wandb-media and tmp*wandb-artifacts behind."""
    script, temp = tmp_path / "worker.py", tmp_path / "temp"
    script.write_text("import tempfile\n"
                      "from rlspeed.distributed import DistributedStrategy\n"
                      "LIBRARY_TMP = tempfile.TemporaryDirectory('-library-media')  # (as wandb's at import)\n"
                      "print('worker ran', flush=True)\n"
                      "DistributedStrategy(device='cpu').leave(0)\n")
    temp.mkdir()
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                           check=True, timeout=60)
    killed, running = temp / f"rlspeed-workers-{ended.stdout.strip()}-abc", temp / f"rlspeed-workers-{os.getpid()}-d"
    (killed / "torchelastic").mkdir(parents=True)
    running.mkdir()
    done = subprocess.run([sys.executable, "-m", "rlspeed._torchrun", "--standalone", "--nproc_per_node=2",
                           str(script)], env={**clean_env(), "TMPDIR": str(temp), "LOGLEVEL": "INFO"},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("worker ran") == 2
    assert "Rendezvous complete" in done.stderr, done.stderr[-3000:]
    # (neither the killed launcher's folder nor this one's, nor the library's directory the workers' handlers remove)
    assert sorted(path.name for path in temp.iterdir()) == [running.name]


def test_recurrent_ppo_minibatch_sequences_must_split_evenly():
    """RecurrentPPO's minibatches are batch_size / L sequences of L = gcd(num_steps, batch_size) steps, shared among
    the ranks: one sequence per minibatch on 2 ranks gave each rank one sequence, minibatches of twice batch_size and
    half the updates, without a word."""
    from rlspeed import RecurrentPPO
    from rlspeed.errors import UserError

    small = dict(device="cpu", env_backend="gymnasium", num_envs=4, num_steps=8, lstm_hidden_size=8)
    with pytest.raises(UserError, match=r"batch_size \(8\) holds 1 sequence of 8 steps \(the greatest common divisor "
                                        r"of batch_size and num_steps \(8\)\), which must be a multiple of the number "
                                        r"of processes \(2\).*batch_size=16 would do"):
        RecurrentPPO("CartPoleNoVel-v1", strategy=TwinRanks(), batch_size=8, **small)
    RecurrentPPO("CartPoleNoVel-v1", batch_size=8, **small)  # one process: any number of sequences is fine
    for num_steps, batch_size, shapes_seen in ((8, 16, [(8, 1)] * 2), (24, 16, [(8, 1)] * 6)):
        options = {**small, "num_steps": num_steps}
        model = RecurrentPPO("CartPoleNoVel-v1", strategy=TwinRanks(), batch_size=batch_size, n_epochs=1, **options)
        shapes = []
        update = model._update_step
        model._update_step = (lambda *batch, shapes=shapes, update=update, **hints:
                              (shapes.append(batch[0].shape[:2]), update(*batch, **hints))[1])
        model.learn(4 * num_steps, progress_bar=False)
        # each rank's 2 envs make minibatches of 1 sequence, 2 sequences of batch_size steps across the ranks: whole
        # columns of 8 steps, or chunks of gcd(24, 16) = 8 steps, 3 per column
        assert shapes == shapes_seen
    # a minibatch of the whole rollout splits whatever the number of sequences
    RecurrentPPO("CartPoleNoVel-v1", strategy=TwinRanks(), batch_size=32, **small)
    # the size named is one the processes can share: batch_size=16 was named for chunks of 8 of num_steps 16, and it
    # makes whole columns, 1 sequence, refused again
    options = {**small, "num_steps": 16}
    with pytest.raises(UserError, match=r"holds 1 sequence of 8 steps .*\(batch_size=(\d+) would do\)\.$") as refused:
        RecurrentPPO("CartPoleNoVel-v1", strategy=TwinRanks(), batch_size=8, **options)
    named = int(re.search(r"batch_size=(\d+) would do", str(refused.value)).group(1))
    RecurrentPPO("CartPoleNoVel-v1", strategy=TwinRanks(), batch_size=named, **options)


@pytest.mark.filterwarnings("ignore:Resuming from .* gymnasium-async envs cannot restore:UserWarning")
def test_config_yaml_records_the_process_count_and_a_resume_under_another_names_it(tmp_path, capsys, monkeypatch):
    """The number of processes changes a run's results (each steps its share of the envs with a seed of its own), and
    a checkpoint resumes under another number: config.yaml recorded the thread count but not the process count, and
    a 2-process run resumed in one process said nothing of it (summary.json then said world_size 1). Now config.yaml
    records `processes`, and a resume under another count names the change and lists it in config.yaml's changes.

    The 2-process run steps subprocess envs: each worker's warnings directory (shared with its env processes) is
    removed as the worker leaves (with os._exit, never reaching the end of its command), as is torchrun's log
    directory; each such run left them in the temp directory."""
    out, temp = tmp_path / "run", tmp_path / "temp"
    temp.mkdir()
    from rlspeed import cli

    base = ["train", "ppo", "CartPole-v1", "--no-progress", "--target-return", "none", "--env-backend",
            "gymnasium-async", "--num-envs", "4", "--set", "num_steps=16", "--set", "batch_size=32", "--set",
            "n_epochs=1", "--eval-episodes", "1", "--checkpoint-freq", "64", "--out", str(out)]
    first = subprocess.run([sys.executable, "-m", "rlspeed", *base, "--nproc", "2", "--total-timesteps", "128"],
                           env={**clean_env(), "TMPDIR": str(temp)}, capture_output=True, text=True, timeout=240)
    assert first.returncode == 0, first.stderr[-3000:]
    assert sorted(path.name for path in temp.iterdir() if not path.name.startswith("torchinductor_")) == []
    assert yaml_config(out)["processes"] == 2
    monkeypatch.setenv("RLSPEED_DEVICE", "cpu")  # (where the 2-process run trained)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    code = cli.main([*base, "--total-timesteps", "192", "--resume"])  # (in this one process)
    resumed = capsys.readouterr()
    assert code == 0, resumed.err[-3000:]
    assert "processes 2 -> 1" in resumed.err
    config = yaml_config(out)
    assert config["processes"] == 1 and config["changes"][-1]["settings"]["processes"] == [2, 1]


def yaml_config(run_dir: Path) -> dict:
    import yaml

    return yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8"))


def test_an_off_policy_resume_under_torch_distributed_says_its_replay_buffer_refills_from_empty():
    """Each process's replay buffer starts empty on a resume under torch.distributed (no file restores them): said, as
    a single process's resume from a checkpoint without a replay buffer says it; it went unsaid (a SAC --nproc 2
    --resume waited learning_starts steps for no stated reason)."""
    from rlspeed import SAC

    model = SAC("Pendulum-v1", device="cpu", strategy=TwinRanks(), num_envs=2)
    resume = {"path": "run/checkpoint.safetensors", "meta": {"replay_buffer": None}}
    with pytest.warns(UserWarning, match=r"under torch.distributed the replay buffer is not restored .* refills from "
                                         "empty and updates wait for learning_starts"):
        assert model._load_replay(resume) is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (a model saved before it trained: nothing to refill, nothing said)
        assert model._load_replay({**resume, "untrained": True}) is False


def test_a_model_or_population_without_a_strategy_under_torchrun_is_told_once_on_rank_0(monkeypatch):
    """A user's script under `torchrun --nproc-per-node 2` that built `PPO(...)` without `strategy=` trained the same
    run in each process on its own, without a word: rank 0 warns once, naming `strategy=` and docs/distributed.md
    (a population: that it trains in one process); the other ranks, a single process and a model given a strategy
    of several processes (the CLI's under torchrun) say nothing."""
    from rlspeed import PPO, distributed
    from rlspeed.population import Population

    def tiny():
        return PPO("CartPole-v1", device="cpu", seed=0, num_envs=2, num_steps=8, batch_size=16, net_arch=(8,))

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(distributed, "_TOLD_ALONE", False, raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (a strategy of several processes, as the CLI's under torchrun: no word)
        PPO("CartPole-v1", device="cpu", seed=0, num_envs=2, num_steps=8, batch_size=16, net_arch=(8,),
            strategy=TwinRanks()).learn(32, progress_bar=False)
    with pytest.warns(UserWarning, match=r"one of 2 processes torchrun started, and PPO without a strategy trains in "
                                         r"each of them on its own .*strategy=rlspeed.distributed.DistributedStrategy"
                                         r"\(\) .*docs/distributed.md"):
        tiny().learn(16, progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tiny().learn(16, progress_bar=False)  # (once per process)
        monkeypatch.setattr(distributed, "_TOLD_ALONE", False, raising=False)
        monkeypatch.setenv("RANK", "1")
        tiny().learn(16, progress_bar=False)  # (rank 0's word only)
        monkeypatch.setattr(distributed, "_TOLD_ALONE", False, raising=False)
        monkeypatch.setenv("WORLD_SIZE", "1")
        tiny().learn(16, progress_bar=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    population = Population(PPO, "CartPole-v1", seeds=[0, 1], device="cpu", num_envs=2, num_steps=8, batch_size=16,
                            net_arch=(8,))
    with pytest.warns(UserWarning, match="a population trains in each of them on its own .* start this script "
                                         "without torchrun"):
        population.learn(16, progress_bar=False)


_REPLAY_RUN = {"device": "cpu", "env_backend": "torch", "seed": 0, "num_envs": 4, "learning_starts": 16,
               "buffer_size": 1000, "net_arch": (8,), "train_freq": 4}


def _replay_resume_warnings(path: Path, **settings) -> list[str]:
    """The warnings of a one-process DQN (`_REPLAY_RUN`, 4 envs) resumed from the checkpoint `path` and trained on."""
    from rlspeed import DQN

    model = DQN("CartPole-v1", save_replay_buffer=True, **{**_REPLAY_RUN, **settings})
    model.resume(path)
    with warnings.catch_warnings(record=True) as said:  # (also the envs' own: rank 0's 2 envs' episodes, not 4)
        warnings.simplefilter("always")
        model.learn(16, progress_bar=False)
    return [str(warning.message) for warning in said]


@pytest.mark.parametrize("recorded", [True, False])
def test_a_single_process_resume_says_a_replay_buffer_of_process_0s_envs_alone_is_restored(tmp_path, recorded):
    """An older rlspeed took save_replay_buffer under torch.distributed: process 0 saved its own envs' transitions
    alone (its 2 of the run's 4 envs). A resume in one process restored them as the run's buffer without a word: now
    a warning names the envs that filled it and the transitions restored; the processes the file records say which
    (a file without the count names both causes: it may also be a one-process run's with other num_envs)."""
    from rlspeed import DQN
    from rlspeed.checkpoint import load_checkpoint, save_checkpoint

    old = DQN("CartPole-v1", strategy=TwinRanks(), **_REPLAY_RUN)
    old._checkpoint_replay = True  # (as an older rlspeed took save_replay_buffer=True here)
    old.learn(64, run_dir=tmp_path, checkpoint_freq=64, progress_bar=False)
    if not recorded:  # (a file of an rlspeed that did not record the count)
        tensors, meta = load_checkpoint(tmp_path / "checkpoint.replay.safetensors")
        assert meta["replay_buffer"].pop("processes") == 2
        save_checkpoint(tmp_path / "checkpoint.replay.safetensors", tensors, meta)
    said = _replay_resume_warnings(tmp_path / "checkpoint.safetensors")
    cause = (r"process 0's envs of a run in 2 processes filled it, so their 32 transitions are restored, not the "
             r"whole run's\." if recorded else
             r"its 32 transitions are restored, the whole run's where it ran with other num_envs in one process, "
             r"process 0's envs' alone where it ran in several processes")
    assert any(re.search(r"its replay buffer was filled by 2 envs and this run steps 4: " + cause, message)
               for message in said), said


def test_a_resume_with_other_num_envs_restores_a_one_process_runs_whole_replay_buffer_without_a_word(tmp_path):
    """A one-process run's replay buffer resumed with other num_envs was said to be process 0's envs' alone, 'not
    the whole run's': its file records the one process that filled it, so the whole buffer is restored in silence."""
    from rlspeed import DQN

    DQN("CartPole-v1", save_replay_buffer=True, **{**_REPLAY_RUN, "num_envs": 2}).learn(
        64, run_dir=tmp_path, checkpoint_freq=64, progress_bar=False)
    said = _replay_resume_warnings(tmp_path / "checkpoint.safetensors")
    assert not [message for message in said if "replay buffer" in message], said


class RankOf2(TwinRanks):
    """Rank `rank` of 2 for the run directory's decision: the others read rank 0's `word` (`broadcast_text`)."""

    def __init__(self, rank: int = 0, word: str | None = None):
        super().__init__()
        self.rank, self.word = rank, word

    def broadcast_text(self, text):
        return text if self.rank == 0 else self.word


def a_run_in(out: Path) -> None:
    """What a run's first attempt left in `out`: its config.yaml and a checkpoint."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text("algo: ppo\nenv_id: CartPole-v1\n", encoding="utf-8")
    (out / "checkpoint.safetensors").write_bytes(b"trained")


def test_torchrun_by_hand_refuses_a_run_in_out_on_every_rank_and_a_restart_of_its_own_job_goes_on(tmp_path,
                                                                                                     monkeypatch):
    """`torchrun --nproc-per-node 2 -m rlspeed train ... --out DIR` (no `--nproc` launcher) wrote over the run in DIR,
    exit 0, and locked nothing: its workers left the checks to the launcher. Now rank 0 locks DIR and refuses a run
    there as a plain run does, and the other ranks end with its sentence (its exit code: Busy's too); a restart of
    the job that took DIR (TORCHELASTIC_RESTART_COUNT above 0, its TORCHELASTIC_RUN_ID) goes on there, while another
    job is refused, a restart or not; an --overwrite undone (it failed before saving) leaves its restart checked."""
    import argparse

    from rlspeed import cli
    from rlspeed.errors import Busy, UserError
    from rlspeed.locks import hold_lock

    monkeypatch.delenv(cli.RUN_LOCKED_BY_LAUNCHER, raising=False)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-a")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    out = tmp_path / "run"
    args = argparse.Namespace(out=str(out), resume=False, overwrite=False, track=False)

    def attempt(job: str, restart: int, **flags) -> Path:
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", job)
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", str(restart))
        try:
            return cli._prepare_workers_run_dir(argparse.Namespace(**{**vars(args), **flags}), "ppo", RankOf2())
        finally:
            cli._release_run_locks()  # (the attempt's processes end)

    a_run_in(out)
    refused = "' already holds a run .*--overwrite to replace it"
    with pytest.raises(UserError, match=refused):  # (it trained over the run: model changed, exit 0)
        attempt("job-a", 0)
    for word in ("refused 'run' already holds a run", "busy Another rlspeed process is training in 'run'"):
        with pytest.raises(Busy if word.startswith("busy") else UserError, match=word.split(" ", 1)[1]) as said:
            cli._prepare_workers_run_dir(args, "ppo", RankOf2(rank=1, word=word))
        assert not isinstance(said.value, Busy) or word.startswith("busy")
    # a new job in a new directory: taken (locked while it trains) and named
    fresh = tmp_path / "fresh"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-a")
    assert cli._prepare_workers_run_dir(argparse.Namespace(**{**vars(args), "out": str(fresh)}), "ppo",
                                        RankOf2()) == fresh
    with pytest.raises(Busy):
        hold_lock(fresh / cli.RUN_LOCK, {}, "held")
    cli._release_run_locks()
    a_run_in(fresh)  # (what its first attempt trained before a process failed)
    args.out = str(fresh)
    assert attempt("job-a", 1) == fresh  # (torchrun's restart of that job: resumes there)
    with pytest.raises(UserError, match=refused):
        attempt("job-b", 1)  # (another job's restart)
    with pytest.raises(UserError, match=refused):
        attempt("job-a", 0)  # (another job of the same --rdzv-id)
    # an --overwrite that failed before saving puts the run back: its restart is checked again, not trained over it
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    assert cli._prepare_workers_run_dir(argparse.Namespace(**{**vars(args), "overwrite": True}), "ppo",
                                        RankOf2()) == fresh
    cli._settle_overwrites(succeeded=False)
    cli._release_run_locks()
    assert (fresh / "checkpoint.safetensors").read_bytes() == b"trained"
    with pytest.raises(UserError, match=refused):
        attempt("job-a", 1)


def test_an_overwrite_under_torchrun_by_hand_is_settled_before_the_worker_leaves(tmp_path, monkeypatch, capsys):
    """A worker leaves with os._exit (`DistributedStrategy.leave`), never reaching the end of `main`, where a run that
    --overwrite moved aside is deleted: rank 0 settles it before it leaves."""
    from rlspeed import cli, distributed

    out = tmp_path / "run"
    a_run_in(out)
    left = []

    class Leaving(RankOf2):
        def leave(self, code: int = 0) -> int:
            left.append(sorted(path.name for path in out.iterdir() if path.name.startswith(".rlspeed-overwritten")))
            return code

    def train(args, algo_cls, strategy, *rest) -> int:
        run_dir = cli._prepare_workers_run_dir(args, algo_cls.name, strategy)
        (run_dir / "model.safetensors").write_bytes(b"new")
        return 0

    monkeypatch.setattr(distributed, "DistributedStrategy", lambda **kwargs: Leaving())
    monkeypatch.setattr(cli, "_train", train)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-a")
    monkeypatch.delenv(cli.RUN_LOCKED_BY_LAUNCHER, raising=False)
    assert cli.main(["train", "ppo", "CartPole-v1", "--device", "cpu", "--overwrite", "--out", str(out)]) == 0
    assert left == [[]]
    assert not (out / "checkpoint.safetensors").exists()


def test_a_restart_of_a_refused_torchrun_job_reusing_a_finished_jobs_id_is_refused_too(tmp_path, monkeypatch):
    """A second `torchrun --rdzv-id ID --max-restarts N ... --out DIR` (the id of the job that trained DIR; torchrun's
    default id, 'none', is every such job's) was refused at its first attempt, then went on at its restart, which
    found its id in DIR's job file: it trained the run in DIR on, without --resume, exit 0."""
    import argparse

    from rlspeed import cli
    from rlspeed.errors import UserError

    monkeypatch.delenv(cli.RUN_LOCKED_BY_LAUNCHER, raising=False)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    out = tmp_path / "run"
    a_run_in(out)
    (out / cli.TORCHRUN_JOB_FILE).write_text("none\n", encoding="utf-8")  # (the finished job's)
    args = argparse.Namespace(out=str(out), resume=False, overwrite=False, track=False)
    for restart in (0, 1):
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", str(restart))
        try:
            with pytest.raises(UserError, match="' already holds a run .*--overwrite to replace it"):
                cli._prepare_workers_run_dir(args, "ppo", RankOf2())
        finally:
            cli._release_run_locks()


def test_a_restart_of_a_job_reusing_a_finished_jobs_id_whose_first_attempt_died_before_the_check_is_checked(
        tmp_path, monkeypatch):
    """A second torchrun with the id of the job that trained DIR (`--rdzv-id`, or torchrun's default 'none') whose first
    attempt died before rank 0 checked DIR (a process killed while torch loads) went on at its restart, which found its
    id in DIR's job file: it trained the finished run on, without --resume. Where torchrun keeps a store for the job
    (its agent's), the job file also names a token rank 0 drew into it: only a restart of the job that took DIR finds
    it."""
    import argparse

    import torch.distributed as dist

    from rlspeed import cli, distributed
    from rlspeed.errors import UserError

    monkeypatch.delenv(cli.RUN_LOCKED_BY_LAUNCHER, raising=False)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    store = [dist.HashStore()]  # (the first job's)
    monkeypatch.setattr(distributed, "_torchrun_job_store", lambda: store[0])
    out = tmp_path / "run"
    args = argparse.Namespace(out=str(out), resume=False, overwrite=False, track=False)

    def attempt(restart: int) -> Path:
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", str(restart))
        try:
            return cli._prepare_workers_run_dir(args, "ppo", RankOf2())
        finally:
            cli._release_run_locks()

    assert attempt(0) == out
    a_run_in(out)  # (what it trained before a process failed)
    assert attempt(1) == out  # (its restart goes on)
    store[0] = dist.HashStore()  # (the second job: its first attempt ended before rank 0's check)
    with pytest.raises(UserError, match="' already holds a run .*--overwrite to replace it"):
        attempt(1)


def test_every_rank_takes_rank_0s_number_for_its_tensorboard_log_run(tmp_path):
    """Under several processes each rank numbered its `tensorboard_log` run by listing the folder: a rank listing it
    after rank 0 had made `PPO_1` took `PPO_2` (its callbacks' `run_dir` another run's). Every rank takes rank 0's."""
    from rlspeed import PPO

    model = PPO("CartPole-v1", device="cpu", num_envs=2, num_steps=8, batch_size=16, tensorboard_log=tmp_path)
    (tmp_path / "PPO_1").mkdir()  # (rank 0's, made before rank 1 looks)
    model.strategy = RankOf2(rank=1, word=str(tmp_path / "PPO_1"))
    assert model._tensorboard_run(None, None, new_run=True) == (tmp_path / "PPO_1", "PPO")


@pytest.mark.parametrize("rank", ["0", "1"])
def test_a_stop_as_the_processes_leave_under_torchrun_by_hand_is_one_line_on_rank_0(tmp_path, monkeypatch, capsys,
                                                                                     rank):
    """A Ctrl-C that came once the run had ended, saved, while the ranks left together (`DistributedStrategy.leave`),
    ended rank 0 of torchrun started by hand with exit code 130 and no word (the `--nproc` launcher says the stop
    itself): rank 0 says it in one line, the one a single process says at that moment (it said another sentence,
    "as the processes left, after the run had ended"); the other ranks stay quiet."""
    from rlspeed import cli, distributed
    from rlspeed.lifetime import LAUNCHER_PID_VARIABLE

    class Leaving(RankOf2):
        def leave(self, code: int = 0) -> int:
            raise KeyboardInterrupt

    def train(args, algo_cls, strategy, *rest) -> int:
        cli._stage_run_saved(Path(args.out))  # (as a run's end does, its files written)
        return 0

    monkeypatch.setattr(distributed, "DistributedStrategy", lambda **kwargs: Leaving(rank=int(rank)))
    monkeypatch.setattr(cli, "_train", train)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-a")
    monkeypatch.delenv(LAUNCHER_PID_VARIABLE, raising=False)
    assert cli.main(["train", "ppo", "CartPole-v1", "--device", "cpu", "--out", str(tmp_path / "run")]) == 130
    said = capsys.readouterr().err.splitlines()
    assert said == ([f"rlspeed: interrupted (Ctrl-C) while ending the command: the run is saved in "
                     f"'{tmp_path / 'run'}'."] if rank == "0" else [])


@pytest.mark.parametrize("rank", [0, 1])
def test_torchruns_restarts_of_a_refused_group_say_the_refusal_once(tmp_path, monkeypatch, capsys, rank):
    """`torchrun --max-restarts 2 ... -m rlspeed train ... --out DIR` over a run in DIR printed the same refusal at
    each of its three attempts (about 10 s apart). An attempt refused as an earlier attempt of its job was (its store
    remembers) ends with the same exit code without saying it again; another refusal is said."""
    import torch.distributed as dist

    from rlspeed import cli, distributed
    from rlspeed.locks import hold_lock, let_go

    store = dist.HashStore()  # (the job's, kept across its restarts)
    monkeypatch.setattr(distributed, "_torchrun_job_store", lambda: store)
    monkeypatch.setattr(distributed, "DistributedStrategy", lambda **kwargs: RankOf2(rank, word))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-a")
    monkeypatch.delenv(cli.RUN_LOCKED_BY_LAUNCHER, raising=False)
    out = tmp_path / "run"
    a_run_in(out)
    command = ["train", "ppo", "CartPole-v1", "--device", "cpu", "--no-progress", "--out", str(out)]
    refused = f"'{out}' already holds a run"

    def attempt(restart: int) -> tuple[int, str]:
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", str(restart))
        monkeypatch.setenv("RANK", str(rank))
        code = cli.main(command)
        return code, capsys.readouterr().err

    word = None if rank == 0 else f"refused {refused}"  # (what rank 0 tells the others)
    code, said = attempt(0)
    assert code == 2 and refused in said
    word = None if rank == 0 else f"again refused {refused}"
    for restart in (1, 2):
        assert attempt(restart) == (2, "")
    if rank == 0:  # (another refusal: said; Busy's exit code stays)
        held: dict = {}
        hold_lock(out / cli.RUN_LOCK, held, "held")  # (another process's lock: flock's are per open file)
        try:
            code, said = attempt(3)
        finally:
            let_go(next(iter(held)), held)
        assert code == 75 and "Another rlspeed process is training in" in said



@pytest.mark.parametrize("stopped", ["as it ended", "by another rank"])
def test_a_stop_rank_0_said_is_not_said_again_as_torchrun_passes_it_on(tmp_path, monkeypatch, capsys, stopped):
    """A SIGTERM to torchrun started by hand as rank 0 wrote a finished run ('as the run ended'), or to another rank,
    which stopped rank 0 at its iteration's end ('after N steps'): rank 0 said it, then torchrun's own signal, passing
    it on while the processes left, was said again in a second line ('as the processes left'), and the command ended
    with that signal's code (130 for torchrun's SIGINT) rather than the stop it had said (143). One line, and the
    stop said gives the exit code."""
    import signal

    from rlspeed import cli, distributed
    from rlspeed.lifetime import LAUNCHER_PID_VARIABLE

    class Leaving(RankOf2):
        def leave(self, code: int = 0) -> int:
            raise KeyboardInterrupt  # (torchrun's SIGINT to its workers as it shuts them down)

    class Model:
        _resume, _env, num_timesteps = {"path": "checkpoint.safetensors"}, None, 768  # (nothing to save)

    def train(args, algo_cls, strategy, *rest) -> int:
        if stopped == "as it ended":  # (its final evaluation cut short by the SIGTERM it held)
            return cli._said_as_it_ended(0, [signal.SIGTERM], "the run's files", Path(args.out))
        run = {"strategy": strategy, "model": Model(), "tracker": None}
        return cli._save_interrupted(run, Path(args.out), cli.Terminated("SIGTERM"), [])  # (for another rank's stop)

    monkeypatch.setattr(distributed, "DistributedStrategy", lambda **kwargs: Leaving(rank=0))
    monkeypatch.setattr(cli, "_train", train)
    monkeypatch.setattr(cli, "_summary", lambda run, final, interrupted: {"total_timesteps": 768})
    monkeypatch.setattr(cli, "_write_summary", lambda run_dir, summary: None)
    monkeypatch.setattr(cli, "_draw_curve_last", lambda run_dir, steps, held: None)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-a")
    monkeypatch.delenv(LAUNCHER_PID_VARIABLE, raising=False)
    out = tmp_path / "run"
    assert cli.main(["train", "ppo", "CartPole-v1", "--device", "cpu", "--out", str(out)]) == 143
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 1 and said[0].startswith(
        "rlspeed: interrupted (SIGTERM) as the run ended: nothing" if stopped == "as it ended" else
        "rlspeed: interrupted (SIGTERM) after 768 steps: before training resumed"), said


def test_rank_0_failing_to_reach_torchruns_store_for_the_job_ends_the_other_ranks_too(tmp_path, monkeypatch):
    """Rank 0 of torchrun started by hand connects to torchrun's store for the job (the run directory's token, the
    refusal said once) before it checks the run directory: an error there (the store's client timing out) ended rank
    0 alone, the other ranks waiting for its word in a collective until its timeout. Rank 0 tells them it failed, as
    for an error in the check itself."""
    import argparse

    from rlspeed import cli, distributed

    told: list = []

    class Telling(RankOf2):
        def broadcast_text(self, text):
            told.append(text)
            return text

    def unreachable():
        raise RuntimeError("The client socket has timed out while trying to connect")

    monkeypatch.delenv(cli.RUN_LOCKED_BY_LAUNCHER, raising=False)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-a")
    monkeypatch.setattr(distributed, "_torchrun_job_store", unreachable)
    args = argparse.Namespace(out=str(tmp_path / "run"), resume=False, overwrite=False, track=False)
    with pytest.raises(RuntimeError, match="timed out"):
        cli._prepare_workers_run_dir(args, "ppo", Telling())
    assert told == ["failed"]


def test_a_refusal_after_an_attempt_that_took_the_run_directory_is_said_again(tmp_path, monkeypatch):
    """torchrun by hand with --max-restarts: an attempt refused as Busy (another process held DIR), a restart that took
    DIR and trained (its lines after the refusal), then a restart Busy again: the last one ended with exit code 75 and
    no word, its refusal taken for the first one's, said already. A refusal is said once only where the attempts
    before it were refused alike."""
    import argparse

    import torch.distributed as dist

    from rlspeed import cli, distributed
    from rlspeed.errors import Busy
    from rlspeed.locks import hold_lock, let_go

    store = dist.HashStore()  # (the job's, kept across its restarts)
    monkeypatch.setattr(distributed, "_torchrun_job_store", lambda: store)
    monkeypatch.delenv(cli.RUN_LOCKED_BY_LAUNCHER, raising=False)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-a")
    out = tmp_path / "run"
    out.mkdir()
    args = argparse.Namespace(out=str(out), resume=False, overwrite=False, track=False)

    def attempt(restart: int, busy: bool):
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", str(restart))
        held: dict = {}
        if busy:
            hold_lock(out / cli.RUN_LOCK, held, "held")  # (another process's lock: flock's are per open file)
        try:
            return cli._prepare_workers_run_dir(args, "ppo", RankOf2())
        except Busy as refused:
            return getattr(refused, "said_before", False)
        finally:
            cli._release_run_locks()
            for lock in list(held):
                let_go(lock, held)

    assert attempt(0, busy=True) is False  # (said)
    assert attempt(1, busy=True) is True  # (refused alike: said once)
    assert attempt(2, busy=False) == out  # (took DIR and trained)
    assert attempt(3, busy=True) is False  # (said again)


@pytest.mark.parametrize("rank", [0, 1])
def test_every_rank_leaves_with_rank_0s_code(monkeypatch, rank):
    """A Ctrl-C reaching every worker while rank 0 evaluated the finished run ended rank 0 with 130 and the others
    with 0 (their run had returned before its stops were read): every rank now leaves with rank 0's code, the one its
    line says (`DistributedStrategy.leave`, agreed as the ranks meet to leave). Rank 0's peer here returned 130 while
    this rank returns 0, or the other way round; the collective sums what each rank puts in."""
    from rlspeed import distributed
    from rlspeed.lifetime import SAID_FOLDER_VARIABLE

    def all_reduce(tensor, op=None):  # (the peer's share: rank 0's 130 where this is rank 1, else rank 1's nothing)
        tensor.add_(130.0 if rank == 1 else 0.0)

    exits = []
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(distributed.dist, "all_reduce", all_reduce)
    monkeypatch.setattr(distributed.dist, "barrier", lambda: None)
    monkeypatch.setattr(distributed.dist, "destroy_process_group", lambda: None)
    monkeypatch.setattr(distributed.atexit, "_run_exitfuncs", lambda: None)
    monkeypatch.setattr(distributed.os, "_exit", exits.append)
    monkeypatch.delenv(SAID_FOLDER_VARIABLE, raising=False)
    RankOf2(rank=rank).leave(130 if rank == 0 else 0)
    assert exits == [130]
