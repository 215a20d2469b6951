"""`rlspeed doctor`: one PASS/WARN/FAIL line per check, advice on problems, exit code 1 only when something failed."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlspeed import device as devices
from rlspeed.diagnostics import doctor
from rlspeed.errors import UserError


@pytest.fixture(autouse=True)
def _fast(monkeypatch):
    """Skip the compile check (seconds of inductor) and shorten the matmul timing."""
    monkeypatch.setenv(doctor.SKIP_COMPILE_ENV, "1")
    monkeypatch.setattr(doctor, "MATMUL_SECONDS", 0.02)


def _lines(text: str, name: str) -> list[str]:
    """Output lines of the check called `name` (the second column)."""
    return [line for line in text.splitlines() if line[6 : 6 + doctor.NAME_WIDTH].strip() == name]


def test_doctor_on_cpu_passes(capsys):
    """Every check passes or warns on a CPU, and the sample of the output docs/devices.md shows names checks doctor
    prints, in its order (nothing compared them: a renamed or reordered check left the sample behind)."""
    assert doctor.run_doctor(device="cpu") == 0
    out = capsys.readouterr().out
    printed = [line[6:6 + doctor.NAME_WIDTH].strip() for line in out.splitlines()[1:-1]]
    page = (Path(__file__).resolve().parents[1] / "docs" / "devices.md").read_text(encoding="utf-8")
    sample = page.split("```\nrlspeed doctor (", 1)[1].split("```", 1)[0]
    shown = [line[6:6 + doctor.NAME_WIDTH].strip() for line in sample.splitlines() if line[:4] in ("PASS", "WARN",
                                                                                                    "FAIL")]
    assert len(shown) > 5 and [name for name in printed if name in shown] == shown, (shown, printed)
    assert _lines(out, "torch")[0].startswith("PASS") and torch.__version__ in _lines(out, "torch")[0]
    device_line = _lines(out, "device")[0]
    assert device_line.startswith("PASS") and "tensor on cpu" in device_line
    assert _lines(out, "matmul fp32")[0].startswith("PASS") and "GFLOP/s" in _lines(out, "matmul fp32")[0]
    assert "skipped" in _lines(out, "torch.compile")[0]
    for line in out.splitlines()[1:-1]:
        assert line[:4] in ("PASS", "WARN"), line
    assert out.splitlines()[-1].endswith(" 0 failed")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_doctor_on_missing_cuda_fails_with_one_line(capsys):
    assert doctor.run_doctor(device="cuda") == 1
    captured = capsys.readouterr()
    device_line = _lines(captured.out, "device")[0]
    assert device_line.startswith("FAIL") and "cuda" in device_line and "->" in device_line
    assert "Traceback" not in captured.out + captured.err
    assert not _lines(captured.out, "matmul fp32")  # nothing to time without a device
    assert captured.out.splitlines()[-1].endswith(" 1 failed")


def test_cli_doctor_exits_zero_on_cpu(capsys):
    """`rlspeed doctor` prints its lines on stdout and exits 0 (`cli.main` in this process: `python -m rlspeed doctor`
    itself runs in test_cli.py's reader test)."""
    from rlspeed import cli

    assert cli.main(["doctor", "--device", "cpu"]) == 0
    captured = capsys.readouterr()
    assert "tensor on cpu" in captured.out
    assert captured.out.splitlines()[-1].endswith(" 0 failed")


def test_cli_doctor_json_is_the_only_output_on_stdout(capfd):
    """`rlspeed doctor --json | jq`: a CI job's preflight reads the checks from stdout (rlspeed doctor had only its
    aligned lines, and `--json` was refused with exit code 2); the lines go to stderr. (In this process: capfd holds
    what reaches file descriptors 1 and 2, a library's own writes included.)"""
    from rlspeed import cli

    assert cli.main(["doctor", "--device", "cpu", "--json"]) == 0
    result = capfd.readouterr()
    report = json.loads(result.out)
    statuses = {check["name"]: check["status"] for check in report["checks"]}
    assert statuses["device"] == "PASS" and statuses["torch"] == "PASS"
    assert set(report["checks"][0]) == {"status", "name", "detail", "advice"}
    assert report["failed"] == 0 and report["passed"] == list(statuses.values()).count("PASS")
    assert "tensor on cpu" in result.err and result.err.splitlines()[-1].endswith(" 0 failed")


@pytest.mark.skipif(bool(torch.version.cuda), reason="torch here has a CUDA build")
def test_cpu_wheel_beside_nvidia_driver_says_which_pip_command(monkeypatch):
    monkeypatch.setattr(doctor.shutil, "which", lambda tool: f"/usr/bin/{tool}" if tool == "nvidia-smi" else None)
    monkeypatch.setattr(doctor, "_driver_cuda_version", lambda: (12, 4))
    check = doctor.check_cuda()
    assert check.status == doctor.WARN
    assert "CPU-only" in check.detail
    assert check.advice.endswith("--index-url https://download.pytorch.org/whl/cu124")


@pytest.mark.skipif(importlib.util.find_spec("torch_npu") is not None, reason="torch_npu is installed")
def test_ascend_toolkit_without_torch_npu_warns(monkeypatch):
    monkeypatch.setenv("ASCEND_TOOLKIT_HOME", "/usr/local/Ascend/ascend-toolkit/latest")
    check = doctor.check_npu()
    assert check.status == doctor.WARN
    assert "torch_npu not installed" in check.detail and "torch-npu" in check.advice


def test_no_ascend_software_is_not_a_warning(monkeypatch):
    if importlib.util.find_spec("torch_npu") is not None:
        pytest.skip("torch_npu is installed")
    for name in doctor.ASCEND_ENV_VARS + ("LD_LIBRARY_PATH",):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(doctor.shutil, "which", lambda tool: None)
    assert doctor.check_npu().status == doctor.PASS


def test_more_threads_than_cores_warns(monkeypatch):
    monkeypatch.setattr(doctor, "usable_cores", lambda: 2)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setenv("RLSPEED_NUM_THREADS", "8")
    check = doctor.check_threads()
    assert check.status == doctor.WARN and "RLSPEED_NUM_THREADS=2" in check.advice
    monkeypatch.setenv("RLSPEED_NUM_THREADS", "2")
    assert doctor.check_threads().status == doctor.PASS


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity on this OS")
def test_training_threads_are_capped_at_the_cores_the_process_may_run_on(monkeypatch, tmp_path):
    """A SLURM job (or `taskset`, a container's cpuset) may use a few of the machine's cores: --threads and
    RLSPEED_NUM_THREADS were capped at os.cpu_count(), the whole machine's, so `--threads 8` on a 2-CPU allocation of
    a 64-core node ran 8 threads on 2 cores, which doctor's line (the affinity's cores) warned about."""
    from rlspeed import device

    monkeypatch.setattr(device, "CGROUP_ROOT", str(tmp_path))  # (no CPU quota: the affinity alone, on any machine)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setenv("RLSPEED_NUM_THREADS", "8")
    before = torch.get_num_threads()
    try:
        assert device.default_num_threads() == 2
        assert device.configure_threads(8) == 2 and torch.get_num_threads() == 2
        assert doctor.usable_cores() == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity on this OS")
def test_a_containers_cpu_quota_caps_the_usable_cores(monkeypatch, tmp_path, capsys):
    """`docker run --cpus=1` (a Kubernetes CPU limit) leaves the affinity mask at every core of the host: threads,
    doctor's count and the --nproc check took the host's cores, and `--nproc 64` passed in a 1-CPU container."""
    from rlspeed import cli, device

    def cgroup(name: str, files: dict[str, str]) -> None:  # (a fresh root each: the quota is read once per root)
        root = tmp_path / name
        for path, text in files.items():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(text)
        monkeypatch.setattr(device, "CGROUP_ROOT", str(root))

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    cgroup("v2-max", {"cpu.max": "max 100000\n"})  # (cgroup v2 without a quota)
    assert device.usable_cores() == 64
    cgroup("v2-1.5", {"cpu.max": "150000 100000\n"})  # (--cpus=1.5: two threads may run, each a share)
    assert device.usable_cores() == doctor.usable_cores() == 2
    cgroup("v1-none", {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"})  # (cgroup v1)
    assert device.usable_cores() == 64
    cgroup("v1-1", {"cpu/cpu.cfs_quota_us": "100000\n", "cpu/cpu.cfs_period_us": "100000\n"})
    assert device.usable_cores() == 1
    code = cli.main(["train", "ppo", "CartPole-v1", "--device", "cpu", "--nproc", "2", "--out", str(tmp_path / "run")])
    assert code == 2 and "--nproc 2 is more processes than the 1 CPU core" in capsys.readouterr().err


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity on this OS")
def test_a_cpu_quota_on_the_processs_own_cgroup_below_the_root_caps_the_usable_cores(monkeypatch, tmp_path):
    """`systemd-run -p CPUQuota=200%` or a batch job's cgroup puts the quota on the process's own cgroup, below the
    hierarchy's root, where the affinity mask still shows every core: only the root's cpu.max was read."""
    from rlspeed import device

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    for version, files in ((2, {"cpu.max": "max 100000\n", "user.slice/run-1.scope/cpu.max": "200000 100000\n"}),
                           (1, {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n",
                                "cpu/user.slice/run-1.scope/cpu.cfs_quota_us": "300000\n",
                                "cpu/user.slice/run-1.scope/cpu.cfs_period_us": "100000\n"})):
        root = tmp_path / f"v{version}"
        for path, text in files.items():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(text)
        (root / "cgroup").write_text("0::/user.slice/run-1.scope\n" if version == 2 else
                                     "3:cpu,cpuacct:/user.slice/run-1.scope\n0::/\n")
        monkeypatch.setattr(device, "CGROUP_ROOT", str(root))
        monkeypatch.setattr(device, "PROC_CGROUP", str(root / "cgroup"))
        assert device.usable_cores() == (2 if version == 2 else 3)


def test_threads_line_reports_what_training_uses(monkeypatch, tmp_path):
    """Training sets RLSPEED_NUM_THREADS or 1 thread (`device.configure_threads`), whatever torch's default is."""
    from rlspeed import device

    monkeypatch.setattr(device, "CGROUP_ROOT", str(tmp_path))  # (no CPU quota: 4 cores also in a CI container)
    monkeypatch.setattr(doctor, "usable_cores", lambda: 4)
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(4)), raising=False)  # (training's cap)
    monkeypatch.setattr(doctor.torch, "get_num_threads", lambda: 4)
    monkeypatch.delenv("RLSPEED_NUM_THREADS", raising=False)
    check = doctor.check_threads()
    assert check.status == doctor.PASS and "training uses 1 torch thread " in check.detail
    monkeypatch.setenv("RLSPEED_NUM_THREADS", "3")
    assert "training uses 3 torch threads" in doctor.check_threads().detail


def test_unreadable_thread_variable_fails(monkeypatch):
    monkeypatch.setenv("RLSPEED_NUM_THREADS", "many")
    check = doctor.check_threads()
    assert check.status == doctor.FAIL and "RLSPEED_NUM_THREADS" in check.detail and "->" in check.line()


@pytest.mark.parametrize("value", ["auto", "AUTO", " Auto "])
def test_rlspeed_device_auto_means_no_preference(value, monkeypatch, capsys):
    monkeypatch.delenv("RLSPEED_DEVICE", raising=False)
    expected = devices.resolve_device("auto")
    monkeypatch.setenv("RLSPEED_DEVICE", value)
    assert devices.resolve_device("auto") == expected
    check, chosen = doctor.check_device("auto")
    assert check.status == doctor.PASS and chosen == expected


@pytest.mark.parametrize("value", ["tpu", "cpu:3"])
def test_rlspeed_device_error_names_the_variable_and_a_fix_that_works(monkeypatch, value):
    """The error advised device='auto', which is what read RLSPEED_DEVICE and failed: the fix it names works."""
    monkeypatch.setenv("RLSPEED_DEVICE", value)
    with pytest.raises(UserError, match=f"RLSPEED_DEVICE={value} names a device") as error:
        devices.resolve_device("auto")
    assert "device='auto'" not in str(error.value) and "--device cpu" in str(error.value)
    assert devices.resolve_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize(("name", "module", "status"), [
    ("safetensors", "safetensors.torch", "FAIL"), ("pyyaml", "yaml", "FAIL"), ("tqdm", "tqdm", "FAIL"),
    ("matplotlib", "matplotlib.backends.backend_agg", "WARN")])
def test_a_dependency_that_cannot_be_imported_is_named_with_its_pip_line(monkeypatch, name, module, status):
    """Each of rlspeed's own dependencies is checked as a run imports it (doctor checked safetensors alone: a broken
    pyyaml, tqdm or matplotlib went unnoticed until training failed)."""
    monkeypatch.setitem(sys.modules, module, None)  # makes the import raise ImportError
    checks = {check.name: check for check in doctor.check_packages()}
    assert checks[name].status == getattr(doctor, status) and f'pip install "{name}>=' in checks[name].advice
    assert all(check.status == doctor.PASS for other, check in checks.items()
               if other != name and other in {"safetensors", "pyyaml", "tqdm", "matplotlib"})


def _compile_check_failing_with(monkeypatch, err: str):
    """doctor's compile check on the CPU where its child process fails with the traceback `err`."""
    monkeypatch.setattr(doctor, "_run_child", lambda args, timeout_s: (1, "", err))
    monkeypatch.delenv(doctor.SKIP_COMPILE_ENV, raising=False)
    return doctor.check_compile(torch.device("cpu"))


def test_a_compile_failing_for_a_missing_python_package_names_that_package(monkeypatch):
    """inductor failing to import tqdm was advised a C++ compiler (its traceback's paths say 'compile')."""
    err = ("Traceback ...\n  File \".../torch/_inductor/compile_fx.py\", line 1\n"
           "ModuleNotFoundError: No module named 'tqdm'\n")
    check = _compile_check_failing_with(monkeypatch, err)
    assert check.status == doctor.WARN and "pip install tqdm" in check.advice and "g++" not in check.advice


def test_a_compile_failing_to_write_its_cache_names_torchinductor_cache_dir(monkeypatch):
    """inductor failing on a read-only cache directory (a read-only HOME or /tmp, TORCHINDUCTOR_CACHE_DIR elsewhere)
    was advised a C++ compiler (its traceback's paths say 'compile')."""
    err = ("Traceback ...\n  File \".../torch/_inductor/codecache.py\", line 1, in write\n"
           "OSError: [Errno 30] Read-only file system: '/ro/inductor'\n")
    check = _compile_check_failing_with(monkeypatch, err)
    assert check.status == doctor.WARN and "TORCHINDUCTOR_CACHE_DIR" in check.advice and "g++" not in check.advice
    assert "/ro/inductor" in check.advice
    err = ("Traceback ...\n  File \".../torch/_inductor/compile_fx.py\", line 1\n"
           "FileNotFoundError: [Errno 2] No usable temporary directory found in ['/tmp', '/var/tmp', '/usr/tmp']\n")
    check = _compile_check_failing_with(monkeypatch, err)
    assert "set TMPDIR to a directory you can write to" in check.advice and "g++" not in check.advice


def test_env_families_one_line_each():
    checks = doctor.check_env_families()
    assert [check.name for check in checks] == ["env classic", "env box2d", "env mujoco", "env atari", "env envpool"]
    assert checks[0].status == doctor.PASS
    for check, module, extra in ((checks[1], "Box2D", "box2d"), (checks[3], "ale_py", "atari"),
                                 (checks[4], "envpool", "envpool")):
        if importlib.util.find_spec(module) is None:
            assert check.status == doctor.WARN and check.advice == f'pip install "rlspeed[{extra}]"', check
        else:
            assert check.status == doctor.PASS, check


def test_a_missing_envpool_is_a_warning_with_its_install_line(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "envpool" else real(name, *a))
    envpool = {check.name: check for check in doctor.check_env_families()}["env envpool"]
    assert envpool.status == doctor.WARN and envpool.advice == 'pip install "rlspeed[envpool]"'
    assert "envpool is not installed" in envpool.detail


def test_compile_crash_and_hang_are_warnings(monkeypatch):
    monkeypatch.delenv(doctor.SKIP_COMPILE_ENV)
    monkeypatch.setattr(doctor, "COMPILE_SCRIPT", "raise SystemExit('inductor exploded')")
    crashed = doctor.check_compile(torch.device("cpu"))
    assert crashed.status == doctor.WARN and "inductor exploded" in crashed.detail and "eager" in crashed.advice
    monkeypatch.setattr(doctor, "COMPILE_SCRIPT", "import time; time.sleep(60)")
    hung = doctor.check_compile(torch.device("cpu"), timeout_s=1)
    assert hung.status == doctor.WARN and "no answer within 1 s" in hung.detail


def test_compile_check_reads_the_child_answer(monkeypatch):
    monkeypatch.delenv(doctor.SKIP_COMPILE_ENV)
    answer = "print('{\"compile_s\": 2.5, \"max_abs_error\": 0.0}')"
    monkeypatch.setattr(doctor, "COMPILE_SCRIPT", answer)
    check = doctor.check_compile(torch.device("cpu"))
    assert check.status == doctor.PASS and "2.5 s" in check.detail
    monkeypatch.setattr(doctor, "COMPILE_SCRIPT", answer.replace("0.0", "0.5"))
    assert doctor.check_compile(torch.device("cpu")).status == doctor.WARN


def test_training_and_auto_accelerate_on_the_cpu_say_when_an_accelerator_is_installed_but_unusable(
        monkeypatch, tmp_path, capsys):
    """An Ascend machine without torch_npu (or an NVIDIA driver beside a CPU-only torch): `--device auto` trained on
    the CPU saying only "device cpu"; the run and auto_accelerate name what `rlspeed doctor` would warn of."""
    from torch import nn

    from rlspeed import auto_accelerate, cli
    from rlspeed.diagnostics import doctor

    warned = doctor.Check(doctor.WARN, "npu", "not visible: torch_npu not installed", "pip install torch-npu")
    monkeypatch.setattr(doctor, "check_accelerators", lambda: [warned])
    doctor.idle_accelerator.cache_clear()
    try:
        assert cli.main(["train", "ppo", "CartPole-v1", "--total-timesteps", "256", "--no-progress", "--target-return",
                         "none", "--out", str(tmp_path / "run")]) == 0
        assert ("warning: training on the CPU: npu not visible: torch_npu not installed (fix: pip install torch-npu)"
                in capsys.readouterr().err)
        with pytest.warns(UserWarning, match="auto_accelerate runs the model on the CPU: npu not visible"):
            auto_accelerate(nn.Linear(2, 2))
        assert cli.main(["train", "ppo", "CartPole-v1", "--total-timesteps", "256", "--no-progress", "--target-return",
                         "none", "--device", "cpu", "--out", str(tmp_path / "asked")]) == 0
        assert "training on the CPU" not in capsys.readouterr().err  # (the CPU asked for: nothing to say)
        for name, value in (("RLSPEED_DEVICE", "cpu"), ("ASCEND_RT_VISIBLE_DEVICES", ""),
                            ("ASCEND_RT_VISIBLE_DEVICES", "-1")):  # (the CPU chosen, or the NPUs hidden, on purpose)
            with monkeypatch.context() as env:
                env.setenv(name, value)
                doctor.idle_accelerator.cache_clear()
                assert doctor.idle_accelerator() is None, (name, value)
        monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "0,1")  # (devices named: by index, UUID or sub-device)
        for value in ("GPU-8932f937", "0.0"):
            monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", value)
            doctor.idle_accelerator.cache_clear()
            assert doctor.idle_accelerator() is not None, value
        monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "0,1")
        doctor.idle_accelerator.cache_clear()
        assert doctor.idle_accelerator() is not None
    finally:
        doctor.idle_accelerator.cache_clear()


def test_an_intel_gpu_build_of_torch_is_named_as_such(monkeypatch):
    """An XPU wheel of torch was reported as "no CUDA in this build", which reads as a broken install."""
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    monkeypatch.setattr(torch.version, "xpu", "20250201", raising=False)
    (_, torch_check) = doctor.check_python_torch()
    assert "XPU 20250201 build" in torch_check.detail


@pytest.mark.skipif(importlib.util.find_spec("mujoco") is None, reason="mujoco is not installed")
def test_a_mujoco_gl_that_fails_to_load_is_named_with_its_fix_not_an_install_line():
    """MuJoCo loads the OpenGL platform MUJOCO_GL names on import; where it does not load, MuJoCo is installed, and
    the advice was 'pip install "rlspeed[mujoco]"'."""
    script = ("from rlspeed.diagnostics import doctor\n"
              "check = {c.name: c for c in doctor.check_env_families()}['env mujoco']\n"
              "print(check.status, check.detail, '|', check.advice, sep='\\n')")
    env = {**os.environ, "MUJOCO_GL": "no-such-platform"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    status, detail, _, advice = done.stdout.strip().splitlines()[-4:]
    assert status == doctor.WARN and "MuJoCo cannot be imported with MUJOCO_GL=no-such-platform" in detail
    assert advice.startswith("unset MUJOCO_GL") and "pip install" not in advice


def test_doctor_says_what_mujoco_videos_need_on_a_machine_without_a_display(monkeypatch):
    """On a headless Linux machine doctor passed everything, then `eval --video` of a MuJoCo env failed in glfw (no
    display) until MUJOCO_GL=egl was set: a WARN now says what to set, from the platforms whose library loads."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "mujoco" else real(name, *a))
    monkeypatch.setattr(sys, "platform", "linux")
    for variable in ("DISPLAY", "WAYLAND_DISPLAY", "MUJOCO_GL"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(doctor, "headless_gl_platforms", lambda: ["osmesa"])
    (check,) = doctor.check_mujoco_rendering()
    assert check.status == doctor.WARN and "no display" in check.detail and check.advice == "export MUJOCO_GL=osmesa"
    monkeypatch.setenv("MUJOCO_GL", "egl")  # (set, and its library missing)
    (check,) = doctor.check_mujoco_rendering()
    assert check.status == doctor.WARN and check.advice == "export MUJOCO_GL=osmesa"
    monkeypatch.setenv("MUJOCO_GL", "osmesa")
    assert [check.status for check in doctor.check_mujoco_rendering()] == [doctor.PASS]
    monkeypatch.setenv("MUJOCO_GL", "OSMESA")  # (MuJoCo takes it; Gymnasium's renderer looks the name up as written)
    (check,) = doctor.check_mujoco_rendering()
    assert check.status == doctor.WARN and "'OSMESA'" in check.detail and check.advice == "export MUJOCO_GL=osmesa"
    monkeypatch.delenv("MUJOCO_GL")
    monkeypatch.setenv("DISPLAY", ":0")  # (glfw renders on the display)
    assert [check.status for check in doctor.check_mujoco_rendering()] == [doctor.PASS]
    monkeypatch.delenv("DISPLAY")
    monkeypatch.setattr(doctor, "headless_gl_platforms", lambda: [])
    (check,) = doctor.check_mujoco_rendering()
    assert check.status == doctor.WARN and "export MUJOCO_GL=egl" in check.advice and "libegl1" in check.advice
    # PyOpenGL advised only where missing, as pip names it (`import OpenGL`: "pip install OpenGL" installs nothing)
    found = {"mujoco": True, "OpenGL": True}
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: (object() if found[name] else None) if name in found else real(name, *a))
    (check,) = doctor.check_mujoco_rendering()
    assert check.advice == "install EGL (apt-get install libegl1), then export MUJOCO_GL=egl"
    found["OpenGL"] = False
    (check,) = doctor.check_mujoco_rendering()
    assert check.advice == ("install EGL and PyOpenGL (apt-get install libegl1; pip install PyOpenGL), then export "
                            "MUJOCO_GL=egl")


def test_a_module_an_env_family_imports_that_fails_to_load_is_said_in_one_clause(monkeypatch):
    """A module MuJoCo imports, installed, whose own library is missing: doctor said "MuJoCo is installed, but the
    Python module 'OpenGL' is installed but cannot be imported"; missing, it advised `pip install OpenGL`, which is
    not PyOpenGL's name."""
    from rlspeed.envs import packages

    monkeypatch.setattr(packages, "module_installed", lambda module: True)
    broken = ImportError("libGL.so.1: cannot open shared object file: No such file or directory", name="OpenGL.GL")
    assert doctor._env_family_problem(broken, "MuJoCo", 'pip install "rlspeed[mujoco]"') == (
        "MuJoCo is installed, but the Python module 'OpenGL', installed too, cannot be imported",
        "libGL.so.1: cannot open shared object file: No such file or directory")
    # (the clause is missing_dependency's own, asked for after another package's "is installed, but")
    assert packages.missing_dependency(broken) == ("the Python module 'OpenGL' is installed but cannot be imported: "
                                                   "libGL.so.1: cannot open shared object file: No such file or "
                                                   "directory")
    monkeypatch.setattr(packages, "module_installed", lambda module: False)
    missing = ModuleNotFoundError("No module named 'OpenGL'", name="OpenGL")
    assert doctor._env_family_problem(missing, "MuJoCo", 'pip install "rlspeed[mujoco]"') == (
        "MuJoCo is installed, but the Python module 'OpenGL' is not installed", "pip install PyOpenGL")
