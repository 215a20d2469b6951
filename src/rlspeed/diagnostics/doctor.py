"""`rlspeed doctor`: check the device stack and what runs here, and say what to do about each problem.

It automates the checklist people go through by hand before training on a new machine: is the accelerator
visible (and if not, is it the driver, the toolkit environment or a CPU-only torch wheel), does a tensor land
on it, how fast are fp32 and bf16 matmuls there, does torch.compile work, which env families import, how many
threads training uses, and whether the optional packages are installed. Each check prints one line starting with
PASS, WARN or FAIL; a WARN or FAIL line ends with what to do. The exit code is 1 when anything failed.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from rlspeed import device as devices
from rlspeed.errors import UserError

PASS, WARN, FAIL = "PASS", "WARN", "FAIL"
NAME_WIDTH = 14
SKIP_COMPILE_ENV = "RLSPEED_DOCTOR_SKIP_COMPILE"
COMPILE_TIMEOUT_S = 120.0
MATMUL_SIZE = 1024
MATMUL_SECONDS = 0.3
ASCEND_ENV_VARS = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "ASCEND_OPP_PATH")
ASCEND_SET_ENV = "source /usr/local/Ascend/ascend-toolkit/set_env.sh"
# CUDA wheel tags on download.pytorch.org, oldest first; the newest one the driver supports is suggested.
CUDA_WHEEL_TAGS = ((11, 8), (12, 1), (12, 4), (12, 6), (12, 8), (12, 9), (13, 0))


@dataclass(frozen=True)
class Check:
    """The result of one check: a status (PASS, WARN or FAIL), what was checked, what was found, what to do."""

    status: str
    name: str
    detail: str
    advice: str = ""

    def line(self) -> str:
        """The check as one aligned output line."""
        text = f"{self.status:<4}  {self.name:<{NAME_WIDTH}}  {self.detail}"
        return f"{text} -> {self.advice}" if self.advice and self.status != PASS else text


def _first_line(error: BaseException | str, limit: int = 160) -> str:
    """An exception (or stderr) reduced to its first meaningful line, for one-line output."""
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    line = lines[0] if lines else text.strip()
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _version(package: str) -> str | None:
    """Installed version of a distribution, or None when it is not installed."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


# --- 1. Python and torch ------------------------------------------------------------------------------------


def check_python_torch() -> list[Check]:
    """Python version, and torch version and build (WARN below torch 2.6, which rlspeed needs)."""
    python = f"Python {platform.python_version()} ({sys.executable})"
    checks = [Check(PASS, "python", python) if sys.version_info >= (3, 10)
              else Check(WARN, "python", python, "rlspeed needs Python 3.10 or newer")]
    if torch.version.cuda:
        build = f"CUDA {torch.version.cuda} build"
    elif getattr(torch.version, "hip", None):
        build = f"ROCm {torch.version.hip} build"
    elif getattr(torch.version, "xpu", None):  # (Intel GPU wheels)
        build = f"XPU {torch.version.xpu} build"
    else:
        build = "no CUDA in this build"
    detail = f"torch {torch.__version__} ({build})"
    if devices.major_minor(torch.__version__) < (2, 6):
        checks.append(Check(WARN, "torch", detail, 'rlspeed needs torch 2.6 or newer: pip install -U "torch>=2.6"'))
    else:
        checks.append(Check(PASS, "torch", detail))
    return checks


# --- 2. Accelerators ----------------------------------------------------------------------------------------


def _device_names(kind: str) -> str:
    count = devices.device_count(kind)
    try:
        names = sorted({getattr(torch, kind).get_device_name(index) for index in range(count)})
    except Exception:
        names = []
    return f"{count} visible" + (f": {', '.join(names)}" if names else "")


def check_npu() -> Check:
    """Ascend NPU: torch_npu importable, `npu-smi` on PATH, toolkit environment (set_env.sh) sourced."""
    if devices.is_available("npu"):
        return Check(PASS, "npu", _device_names("npu"))
    has_plugin = importlib.util.find_spec("torch_npu") is not None
    has_smi = shutil.which("npu-smi") is not None
    env_set = any(os.environ.get(name) for name in ASCEND_ENV_VARS) or "ascend" in os.environ.get(
        "LD_LIBRARY_PATH", "").lower()
    facts = [f"torch_npu {'installed' if has_plugin else 'not installed'}",
             f"npu-smi {'on PATH' if has_smi else 'not on PATH'}",
             f"Ascend toolkit env {'set' if env_set else 'not set'}"]
    if not (has_plugin or has_smi or env_set):
        return Check(PASS, "npu", "none (no Ascend software found)")
    detail = "not visible: " + ", ".join(facts)
    torch_minor = ".".join(map(str, devices.major_minor(torch.__version__)))
    install_plugin = f'pip install "torch-npu=={torch_minor}.*" (it must match torch {torch_minor})'
    if not has_plugin:
        return Check(WARN, "npu", detail, install_plugin)
    try:
        importlib.import_module("torch_npu")
    except Exception as error:
        advice = f"{ASCEND_SET_ENV}, then retry" if not env_set else install_plugin
        return Check(WARN, "npu", f"{detail}; import torch_npu failed: {_first_line(error, 100)}", advice)
    if not env_set:
        return Check(WARN, "npu", detail, f"{ASCEND_SET_ENV}, then check that `npu-smi info` lists the devices")
    if not has_smi:
        return Check(WARN, "npu", detail, "install the Ascend driver and firmware; `npu-smi info` must list devices")
    return Check(WARN, "npu", detail, "`npu-smi info` lists no usable device? check ASCEND_RT_VISIBLE_DEVICES and "
                 "that torch_npu matches the CANN toolkit version")


def _driver_cuda_version() -> tuple[int, int] | None:
    """The CUDA version the NVIDIA driver supports, read from `nvidia-smi`, or None."""
    try:
        out = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=15).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"CUDA Version:\s*(\d+)\.(\d+)", out)
    return (int(match.group(1)), int(match.group(2))) if match else None


def _cuda_wheel_command(driver: tuple[int, int] | None) -> str:
    """The pip command that installs a CUDA build of torch the driver can run."""
    command = "pip install --force-reinstall torch --index-url https://download.pytorch.org/whl/cu{}{}"
    if driver is None:
        return command.format(12, 6) + " (or the cuXXX tag of the CUDA Version that `nvidia-smi` shows)"
    supported = [tag for tag in CUDA_WHEEL_TAGS if tag <= driver]
    if not supported:
        return f"update the NVIDIA driver (it supports only CUDA {driver[0]}.{driver[1]}), then " + command.format(
            *CUDA_WHEEL_TAGS[0])
    return command.format(*supported[-1])


def check_cuda() -> Check:
    """CUDA: torch.cuda.is_available, whether torch was built with CUDA, `nvidia-smi` on PATH."""
    if devices.is_available("cuda"):
        return Check(PASS, "cuda", _device_names("cuda"))
    has_smi = shutil.which("nvidia-smi") is not None
    cuda_build = torch.version.cuda or getattr(torch.version, "hip", None)
    if not has_smi:
        return Check(PASS, "cuda", "none (nvidia-smi not on PATH: no NVIDIA driver)")
    if not cuda_build:
        driver = _driver_cuda_version()
        found = f"driver supports CUDA {driver[0]}.{driver[1]}" if driver else "nvidia-smi found"
        return Check(WARN, "cuda", f"not visible: {found}, but torch {torch.__version__} is a CPU-only wheel",
                     _cuda_wheel_command(driver))
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    if hidden is not None and not hidden.strip(","):
        return Check(WARN, "cuda", "not visible: CUDA_VISIBLE_DEVICES is empty", "unset CUDA_VISIBLE_DEVICES")
    return Check(WARN, "cuda", f"not visible: nvidia-smi found, torch built with CUDA {torch.version.cuda}",
                 "run `nvidia-smi`: if it lists GPUs, the driver is older than this CUDA build; update the driver or "
                 + _cuda_wheel_command(_driver_cuda_version()))


def check_xpu() -> Check:
    """Intel XPU: torch.xpu in this build and whether it sees a device."""
    if devices.is_available("xpu"):
        return Check(PASS, "xpu", _device_names("xpu"))
    tools = [tool for tool in ("xpu-smi", "sycl-ls") if shutil.which(tool)]
    if not tools:
        return Check(PASS, "xpu", "none (no Intel GPU tools found)")
    support = "torch.xpu sees no device" if hasattr(torch, "xpu") else "this torch has no torch.xpu"
    return Check(WARN, "xpu", f"not visible: {', '.join(tools)} found, but {support}",
                 "pip install --force-reinstall torch --index-url https://download.pytorch.org/whl/xpu")


def check_mps() -> Check:
    """Apple MPS: only on macOS with Apple silicon."""
    if devices.is_available("mps"):
        return Check(PASS, "mps", "available (Apple GPU)")
    if sys.platform != "darwin":
        return Check(PASS, "mps", "none (macOS only)")
    if not torch.backends.mps.is_built():
        return Check(WARN, "mps", "not visible: this torch was built without MPS",
                     "pip install --force-reinstall torch")
    return Check(WARN, "mps", "not visible: torch has MPS but the machine does not offer it",
                 "MPS needs macOS 12.3+ on Apple silicon (arm64 Python, not Rosetta)")


#: The variables that hide an accelerator type's devices from a process (set to no device: a CPU run on purpose)
_VISIBLE_DEVICES = {"cuda": ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"), "npu": ("ASCEND_RT_VISIBLE_DEVICES",),
                    "xpu": ("ZE_AFFINITY_MASK",)}


def _hidden(kind: str) -> bool:
    """Whether the environment hides every device of `kind` (a visible-devices variable set to none: "" or a first
    entry of -1; device UUIDs and sub-devices are devices)."""
    for name in _VISIBLE_DEVICES.get(kind, ()):
        value = os.environ.get(name)
        if value is not None and (not value.strip(", ") or value.split(",")[0].strip().startswith("-")):
            return True
    return False


@functools.cache
def idle_accelerator() -> str | None:
    """Where `device="auto"` chose the CPU: the accelerator whose software is on this machine but unusable (the first
    of `rlspeed doctor`'s accelerator warnings, with its fix), as a clause for a warning; None where there is none,
    where `RLSPEED_DEVICE` chose the device, and for a type whose devices the environment hides (the CPU on purpose)."""
    if os.environ.get("RLSPEED_DEVICE", "").strip().lower() not in ("", "auto"):
        return None
    for check in check_accelerators():
        if check.status != PASS and not _hidden(check.name):
            return f"{check.name} {check.detail} (fix: {check.advice})"
    return None


def check_accelerators() -> list[Check]:
    """One line per accelerator family: visible, absent, or present-but-broken and why."""
    return [check_npu(), check_cuda(), check_xpu(), check_mps()]


# --- 3. The chosen device -----------------------------------------------------------------------------------


def check_device(spec: str = "auto") -> tuple[Check, torch.device | None]:
    """Resolve the device the user asked for and put a tensor on it. Returns the line and the device (or None)."""
    try:
        chosen = devices.resolve_device(spec)
    except UserError as error:
        kind = str(spec).strip().lower().partition(":")[0]
        if kind in devices.ACCELERATOR_ORDER and not devices.is_available(kind):
            detail = f"'{spec}' asked for, but no {kind} device is visible (the {kind} line above says why)"
            return Check(FAIL, "device", detail, "fix that, or use --device auto (or cpu)"), None
        return Check(FAIL, "device", str(error), "use --device auto (or cpu)"), None
    except Exception as error:
        return Check(FAIL, "device", f"'{spec}': {_first_line(error, 100)}", "try --device cpu"), None
    try:
        tensor = torch.ones(4, device=chosen) * 2
        total = float(tensor.sum().item())
    except Exception as error:
        return Check(FAIL, "device", f"{chosen}: creating a tensor failed: {_first_line(error, 100)}",
                     "see the accelerator lines above; --device cpu always works"), None
    if tensor.device.type != chosen.type or total != 8.0:
        return Check(FAIL, "device", f"asked for {chosen}, tensor landed on {tensor.device} (sum {total})",
                     "the device plugin is not initialised correctly; reinstall it to match torch"), None
    note = "; no accelerator visible, training runs on CPU" if spec == "auto" and chosen.type == "cpu" else ""
    return Check(PASS, "device", f"{devices.describe(chosen)}: tensor on {tensor.device}{note}"), chosen


# --- 4. Matmul throughput -----------------------------------------------------------------------------------


def measure_matmul_gflops(device: torch.device, dtype: torch.dtype, size: int = MATMUL_SIZE,
                          seconds: float | None = None) -> float:
    """GFLOP/s of `size x size` matmuls on the device, timed for about `seconds` (MATMUL_SECONDS) after a warm-up."""
    seconds = MATMUL_SECONDS if seconds is None else seconds
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    a @ b  # warm-up: kernel selection, library initialisation
    devices.synchronize(device)
    start = time.perf_counter()
    a @ b
    devices.synchronize(device)
    one = max(time.perf_counter() - start, 1e-6)
    repeats = int(min(max(seconds / one, 1), 100_000))
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    devices.synchronize(device)
    elapsed = max(time.perf_counter() - start, 1e-9)
    return 2 * size**3 * repeats / elapsed / 1e9


def check_matmul(device: torch.device) -> list[Check]:
    """fp32 and bf16 matmul throughput on the device, and the bf16/fp32 ratio (bf16 failing is a WARN)."""
    try:
        fp32 = measure_matmul_gflops(device, torch.float32)
    except Exception as error:
        return [Check(FAIL, "matmul fp32", f"failed on {device}: {_first_line(error, 100)}",
                      "this device cannot run basic maths; use --device cpu and check the driver stack")]
    # (on the CPU with torch's process-wide thread count, which may differ from training's: the threads line)
    where = f"{device}, {torch.get_num_threads()} threads" if device.type == "cpu" else str(device)
    checks = [Check(PASS, "matmul fp32", f"{fp32:,.0f} GFLOP/s ({MATMUL_SIZE}x{MATMUL_SIZE} on {where})")]
    try:
        bf16 = measure_matmul_gflops(device, torch.bfloat16)
    except Exception as error:
        checks.append(Check(WARN, "matmul bf16", f"failed on {device}: {_first_line(error, 100)}",
                            "train in fp32 (the default); bf16 autocast will not work here"))
        return checks
    ratio = bf16 / fp32
    # (a large product's ratio: small networks are bound by per-operation overhead, where bf16 seldom helps;
    # --accelerate auto measures the update itself)
    verdict = ("bf16 may pay off for large matrices; --accelerate auto measures your update" if ratio > 1.2
               else "keep fp32")
    checks.append(Check(PASS, "matmul bf16", f"{bf16:,.0f} GFLOP/s, {ratio:.1f}x fp32 ({verdict})"))
    return checks


# --- 5. torch.compile ---------------------------------------------------------------------------------------

# Runs in a child process so that a hang or a crash inside the compiler cannot take doctor down with it.
COMPILE_SCRIPT = r"""
import json, sys, time
import torch
device = torch.device(sys.argv[1])
backend = "inductor"
if device.type == "npu":
    import torch_npu  # noqa: F401
    try:
        import torchair
    except ImportError:
        from torch_npu.dynamo import torchair
    backend = torchair.get_npu_backend()
fn = lambda x: torch.sin(x) * 2 + 1
x = torch.linspace(-3, 3, 4096, device=device)
compiled = torch.compile(fn, backend=backend)
start = time.perf_counter()
y = compiled(x).cpu()
compile_s = time.perf_counter() - start
error = (y - fn(x).cpu()).abs().max().item()
print(json.dumps({"compile_s": compile_s, "max_abs_error": error}))
"""


def _run_child(args: list[str], timeout_s: float) -> tuple[int | None, str, str]:
    """Run a command in its own process group; on timeout kill the whole group. Returns (rc or None, out, err)."""
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=hasattr(os, "killpg"))
    try:
        out, err = process.communicate(timeout=timeout_s)
        return process.returncode, out, err
    except subprocess.TimeoutExpired:
        # Inductor starts compile workers of its own: end them too, not only the child.
        if hasattr(os, "killpg"):
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        else:
            process.kill()
        out, err = process.communicate()
        return None, out, err


#: pip's names of modules whose distribution is named otherwise (for the advice on a module that is missing)
_PIP_NAMES = {"yaml": "pyyaml", "cv2": "opencv-python-headless", "PIL": "pillow", "sklearn": "scikit-learn"}


def check_compile(device: torch.device, timeout_s: float = COMPILE_TIMEOUT_S) -> Check:
    """Compile a tiny function on the device in a child process, run it, compare it to eager (failure is a WARN)."""
    name = "torch.compile"
    if os.environ.get(SKIP_COMPILE_ENV, "") not in ("", "0"):
        return Check(PASS, name, f"skipped ({SKIP_COMPILE_ENV} is set)")
    if device.type == "mps":
        return Check(WARN, name, "skipped on mps: rlspeed does not compile there", "nothing to do: training runs eager")
    eager_advice = "training still works eager (--accelerate off)"
    print(f"(compiling a small function on {device}, up to {timeout_s:.0f} s ...)", file=sys.stderr, flush=True)
    rc, out, err = _run_child([sys.executable, "-c", COMPILE_SCRIPT, str(device)], timeout_s)
    if rc is None:
        return Check(WARN, name, f"no answer within {timeout_s:.0f} s on {device} (compiler hung)", eager_advice)
    if rc != 0:
        lines = [line for line in err.strip().splitlines() if line.strip()]
        reason = _first_line(lines[-1] if lines else f"exit code {rc}", 110)
        missing = re.search(r"No module named '([\w.]+)'", err)
        # (permission denied, read-only file system, no space left, disk quota exceeded)
        unwritable = re.search(r"\[Errno (?:13|28|30|122)\] [^'\n]*: '([^'\n]+)'", err)
        if device.type == "npu" and "torchair" in err:
            advice = f"install torchair for this torch_npu to compile on NPU; {eager_advice}"
        elif missing:  # (a Python package inductor imports, not the C++ toolchain)
            top = missing.group(1).split(".")[0]
            install = ("reinstall torch (its own module is missing)" if top == "torch" else
                       f"pip install {_PIP_NAMES.get(top, top)}")
            advice = f"the compiler needs the Python module '{top}': {install}; {eager_advice}"
        elif "No usable temporary directory" in err:  # (Python's tempfile: /tmp and the others read-only)
            advice = f"no temporary directory can be written: set TMPDIR to a directory you can write to; " \
                     f"{eager_advice}"
        elif unwritable:  # (its cache, TORCHINDUCTOR_CACHE_DIR or /tmp/torchinductor_USER: not the C++ toolchain)
            advice = (f"inductor could not write its cache at {unwritable.group(1)}: set TORCHINDUCTOR_CACHE_DIR to a "
                      f"writable directory; {eager_advice}")
        elif re.search(r"c\+\+|cxx|compiler|gcc|Python\.h", err, re.IGNORECASE):
            advice = f"inductor needs a C++ compiler and Python headers (e.g. apt-get install g++ python3-dev); " \
                     f"{eager_advice}"
        else:
            advice = eager_advice
        return Check(WARN, name, f"failed on {device}: {reason}", advice)
    try:
        result = json.loads(out.strip().splitlines()[-1])
        compile_s, error = float(result["compile_s"]), float(result["max_abs_error"])
    except (ValueError, KeyError, IndexError, TypeError):
        return Check(WARN, name, f"unreadable answer from the compile check: {_first_line(out or '(none)', 80)}",
                     eager_advice)
    if not error <= 1e-4:
        return Check(WARN, name, f"compiled result differs from eager by {error:.2g} on {device}", eager_advice)
    return Check(PASS, name, f"works on {device}: compiled in {compile_s:.1f} s, matches eager (max error {error:.1g})")


# --- 6. Env families ----------------------------------------------------------------------------------------

# (family, env id, what it needs, status when it does not work, what to do)
ENV_FAMILIES = (
    ("classic", "CartPole-v1", "gymnasium", FAIL, 'pip install "gymnasium>=1.1"'),
    ("box2d", "LunarLander-v3", "Box2D", WARN, 'pip install "rlspeed[box2d]"'),
    ("mujoco", "HalfCheetah-v5", "MuJoCo", WARN, 'pip install "rlspeed[mujoco]"'),
    ("atari", "ALE/Pong-v5", "ale_py", WARN, 'pip install "rlspeed[atari]"'),
    ("envpool", "CartPole-v1", "envpool", WARN, 'pip install "rlspeed[envpool]"'),
)
#: families made through rlspeed's make_env (with the backend or preprocessing they need), not gymnasium.make
_MADE_BY_RLSPEED = {"atari": "gymnasium", "envpool": "envpool"}


def _env_family_problem(error: BaseException, needs: str, advice: str) -> tuple[str, str]:
    """(what is wrong, what to do) for an env family whose env could not be made. A missing module other than the
    family's own (imageio for MuJoCo's rendering, say) is named, with its own install command."""
    from rlspeed.envs.packages import (
        MUJOCO_GL_ADVICE,
        MujocoGLError,
        MujocoImportError,
        import_cause,
        missing_dependency,
    )

    if isinstance(error, MujocoGLError):  # installed: the OpenGL platform MUJOCO_GL names does not load
        return f"MuJoCo cannot be imported with MUJOCO_GL={error.platform}", MUJOCO_GL_ADVICE
    if isinstance(error, MujocoImportError) and not error.missing:  # installed, and broken: MuJoCo's own message
        # names the repair
        return "MuJoCo is installed but cannot be imported", error.detail
    if isinstance(error, MujocoImportError):  # (a module it imports is missing: named below, with its install)
        error = error.error
    if needs == "envpool":  # (installed: it could not write a directory it makes as it loads, a read-only /tmp's)
        from rlspeed.envs.envpool_env import unwritable_at_import

        unwritable = unwritable_at_import(error.__cause__ if isinstance(error, UserError) else error)
        if unwritable is not None:
            return unwritable
    error = import_cause(error)  # (Gymnasium's DependencyNotInstalled: the import that failed names the module)
    if isinstance(error, ImportError) and error.name:
        module = error.name.split(".")[0]
        if module.lower() != needs.lower():  # the family is installed; something it imports is not
            detail = (missing_dependency(error, beside_installed=True)
                      or f"the Python module '{module}' is not installed")
            said, _, fix = detail.partition(": ")  # (what is wrong, then the install command or the import's error)
            return f"{needs} is installed, but {said}", fix
        return f"{needs} is not installed", advice
    if type(error).__name__ == "DependencyNotInstalled":
        # gymnasium's own message names a pip command of its own; ours replaces it
        return f"{needs} is not installed", advice
    return _first_line(error, 90), advice


def check_env_families() -> list[Check]:
    """Make and reset one env of each family (classic control, Box2D, MuJoCo, Atari, EnvPool); each is one line."""
    checks = []
    for family, env_id, needs, status_if_broken, advice in ENV_FAMILIES:
        name = f"env {family}"
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                import gymnasium

                if family in _MADE_BY_RLSPEED:
                    if family == "envpool" and importlib.util.find_spec("envpool") is None:
                        raise ModuleNotFoundError("No module named 'envpool'", name="envpool")
                    from rlspeed.envs import make_env

                    env = make_env(env_id, num_envs=1, device="cpu", backend=_MADE_BY_RLSPEED[family])
                else:
                    from rlspeed.envs.packages import route_mujoco_messages

                    route_mujoco_messages(env_id)  # (not MUJOCO_LOG.TXT in the working directory)
                    env = gymnasium.make(env_id)
                try:
                    env.reset(seed=0)
                finally:
                    env.close()
        except Exception as error:
            reason, fix = _env_family_problem(error, needs, advice)
            checks.append(Check(status_if_broken, name, f"{env_id} unavailable: {reason}", fix))
            continue
        version = (f"envpool {importlib.metadata.version('envpool')}" if family == "envpool"
                   else f"gymnasium {gymnasium.__version__}")
        checks.append(Check(PASS, name, f"{env_id} works ({version})"))
    return checks


#: MuJoCo's off-screen OpenGL platforms (MUJOCO_GL) for a machine without a display: each needs PyOpenGL and a library
MUJOCO_HEADLESS_GL = (("egl", ("libEGL.so.1", "libEGL.so")), ("osmesa", ("libOSMesa.so.8", "libOSMesa.so.6",
                                                                         "libOSMesa.so")))


def _loadable(names: tuple[str, ...]) -> bool:
    import ctypes

    for name in names:
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            continue
    return False


def headless_gl_platforms() -> list[str]:
    """The MUJOCO_GL platforms of `MUJOCO_HEADLESS_GL` that can load here (PyOpenGL importable, the library found by
    the dynamic loader), without importing MuJoCo or rendering: milliseconds."""
    from rlspeed.envs.packages import module_installed

    if not module_installed("OpenGL"):
        return []
    return [platform for platform, libraries in MUJOCO_HEADLESS_GL if _loadable(libraries)]


def check_mujoco_rendering() -> list[Check]:
    """Whether MuJoCo envs can render frames (videos: `eval --video`, `train --video-every`) with the MUJOCO_GL set:
    its default, glfw, needs a display, which a headless Linux machine lacks; egl and osmesa need their libraries. A
    WARN saying what to set; no line without MuJoCo (the env line says to install it)."""
    from rlspeed.envs.packages import install_command, module_installed

    if not module_installed("mujoco"):
        return []
    name = "render mujoco"
    written = os.environ.get("MUJOCO_GL", "")
    gl = written.strip().lower()
    if written != gl and gl in ("glfw", "egl", "osmesa"):  # (MuJoCo reads it in any case, Gymnasium's renderer as
        # written: `eval --video` would fail there)
        return [Check(WARN, name, f"MUJOCO_GL={written!r}: Gymnasium's MuJoCo renderer takes the name as written, "
                      f"so videos of MuJoCo envs will fail", f"export MUJOCO_GL={gl}")]
    available = headless_gl_platforms()
    opengl = module_installed("OpenGL")  # (PyOpenGL: installed with MuJoCo, unless removed)
    fix = (f"export MUJOCO_GL={available[0]}" if available else
           f"install EGL{'' if opengl else ' and PyOpenGL'} (apt-get install libegl1"
           f"{'' if opengl else '; ' + install_command('OpenGL')}), then export MUJOCO_GL=egl")
    if gl in ("egl", "osmesa"):
        if gl in available:
            return [Check(PASS, name, f"MUJOCO_GL={gl}: its library loads (videos render off-screen)")]
        return [Check(WARN, name, f"MUJOCO_GL={gl}, whose library (or PyOpenGL) is not found: videos of MuJoCo envs "
                      "will fail", fix)]
    if gl not in ("", "glfw"):
        return [Check(WARN, name, f"MUJOCO_GL={gl} is none of MuJoCo's platforms (glfw, egl, osmesa)", fix)]
    headless = sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
    if not headless:
        return [Check(PASS, name, f"MUJOCO_GL {'=glfw' if gl else 'unset'}: glfw renders with the display")]
    return [Check(WARN, name, f"no display and MUJOCO_GL {'=glfw' if gl else 'unset'}: videos of MuJoCo envs "
                  "(eval --video, --video-every) will fail", fix)]


# --- 7. Threads ---------------------------------------------------------------------------------------------


def usable_cores() -> int:
    """Cores this process may run on (the affinity mask in containers), falling back to os.cpu_count()."""
    return devices.usable_cores()


def check_threads() -> Check:
    """The torch threads training uses (`devices.default_num_threads`: RLSPEED_NUM_THREADS or 1) against the cores
    this process can use (WARN when oversubscribed, FAIL when RLSPEED_NUM_THREADS is unreadable)."""
    cores = usable_cores()
    settings = [f"{var}={os.environ[var]}" for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "RLSPEED_NUM_THREADS")
                if var in os.environ]
    facts = f"{cores} usable cores (os.cpu_count()={os.cpu_count()}); torch's own default {torch.get_num_threads()}"
    if settings:
        facts += "; " + ", ".join(settings)
    try:
        threads = devices.default_num_threads()
    except UserError as error:
        return Check(FAIL, "threads", f"{error} ({facts})",
                     "set RLSPEED_NUM_THREADS to a whole number from 1, or unset it")
    detail = f"training uses {threads} torch thread{'s' if threads != 1 else ''} (--threads N to change); {facts}"
    # (training caps the count at the usable cores: a larger RLSPEED_NUM_THREADS is said, not oversubscribed)
    asked = int(os.environ.get("RLSPEED_NUM_THREADS", "").strip() or threads)
    if max(threads, asked) > cores:
        return Check(WARN, "threads", detail, f"more threads than usable cores: set RLSPEED_NUM_THREADS={cores} (or "
                     f"train --threads {cores})")
    return Check(PASS, "threads", detail)


# --- 8. Optional packages -----------------------------------------------------------------------------------


#: rlspeed's own dependencies besides torch and gymnasium (pyproject.toml): (distribution, module, what needs it,
#: status when it cannot be imported)
DEPENDENCIES = (
    ("safetensors", "safetensors.torch", "checkpoints", FAIL),
    ("pyyaml", "yaml", "configs and presets", FAIL),
    ("tqdm", "tqdm", "progress bars", FAIL),
    ("matplotlib", "matplotlib.backends.backend_agg", "learning-curve plots", WARN),
)


def _requirement(name: str) -> str:
    """rlspeed's requirement of distribution `name` as its installed metadata (pyproject.toml) states it
    ("pyyaml>=6"), else the name alone."""
    try:
        listed = importlib.metadata.requires("rlspeed") or []
    except importlib.metadata.PackageNotFoundError:
        listed = []
    pattern = re.compile(rf"{re.escape(name)}\b", re.IGNORECASE)
    return next((item.split(";")[0].strip() for item in listed if pattern.match(item) and ";" not in item), name)


def check_packages() -> list[Check]:
    """rlspeed's dependencies (`DEPENDENCIES`: FAIL where training needs one, WARN for the plots), tensorboard
    (WARN), stable_baselines3 (information only)."""
    checks = []
    for name, module, used_for, status in DEPENDENCIES:
        try:  # (what a run imports: installed is not enough)
            importlib.import_module(module)
            checks.append(Check(PASS, name, f"{_version(name)} ({used_for})"))
        except Exception as error:  # noqa: BLE001 (whatever its import raises)
            checks.append(Check(status, name, f"cannot import: {_first_line(error, 90)}",
                                f'{used_for} need it: pip install "{_requirement(name)}"'))
    tensorboard = _version("tensorboard") if importlib.util.find_spec("tensorboard") else None
    if tensorboard:
        try:  # (what a run imports: installed is not enough)
            importlib.import_module("torch.utils.tensorboard")
            checks.append(Check(PASS, "tensorboard", f"{tensorboard} (run logs)"))
        except Exception as error:  # noqa: BLE001 (whatever its import raises)
            checks.append(Check(WARN, "tensorboard", f"{tensorboard} cannot be imported: {_first_line(error, 90)}",
                                "runs will have no TensorBoard events: pip install --force-reinstall "
                                '"rlspeed[tensorboard]"'))
    else:
        checks.append(Check(WARN, "tensorboard", "not installed: runs will have no TensorBoard events",
                            'pip install "rlspeed[tensorboard]"'))
    sb3 = _version("stable_baselines3") if importlib.util.find_spec("stable_baselines3") else None
    checks.append(Check(PASS, "sb3", f"{sb3} (for benchmarks)" if sb3
                        else 'not installed (only benchmarks compare against it: pip install "rlspeed[bench]")'))
    return checks


# --- Runner -------------------------------------------------------------------------------------------------


def _guarded(name: str, check: Callable[[], Check | Iterable[Check]]) -> list[Check]:
    """Run one check; a bug inside a check becomes a WARN line instead of ending doctor."""
    try:
        result = check()
    except Exception as error:
        return [Check(WARN, name, f"the check itself crashed: {_first_line(error, 100)}",
                      "a doctor bug, not necessarily your setup; please report it")]
    return [result] if isinstance(result, Check) else list(result)


def run_doctor(device: str = "auto", json_output: bool = False) -> int:
    """Run every check, print one line each and a summary; return 1 if any check failed, else 0. `json_output`: the
    lines go to stderr, and stdout gets only the result as one JSON object (`rlspeed doctor --json`: rlspeed's
    version, the platform, each check's status, name, detail and advice, and the counts)."""
    version = _version("rlspeed") or "unknown version"
    stream = sys.stderr if json_output else sys.stdout  # (read at the call: the CLI's wrapped streams)
    print(f"rlspeed doctor (rlspeed {version}, {platform.system()} {platform.machine()})", file=stream, flush=True)
    results: list[Check] = []

    def report(checks: list[Check]) -> None:
        for check in checks:
            print(check.line(), file=stream, flush=True)
        results.extend(checks)

    report(_guarded("python", check_python_torch))
    report(_guarded("accelerators", check_accelerators))
    device_line, chosen = check_device(device)
    report([device_line])
    if chosen is not None:  # without a device there is nothing to time or compile on
        report(_guarded("matmul", lambda: check_matmul(chosen)))
        report(_guarded("torch.compile", lambda: check_compile(chosen)))
    report(_guarded("envs", check_env_families))
    report(_guarded("render mujoco", check_mujoco_rendering))
    report(_guarded("threads", check_threads))
    report(_guarded("packages", check_packages))

    counts = {status: sum(check.status == status for check in results) for status in (PASS, WARN, FAIL)}
    print(f"{counts[PASS]} passed, {counts[WARN]} warnings, {counts[FAIL]} failed", file=stream, flush=True)
    if json_output:
        print(json.dumps({"rlspeed": version, "system": platform.system(), "machine": platform.machine(),
                          "checks": [{"status": check.status, "name": check.name, "detail": check.detail,
                                      "advice": check.advice} for check in results],
                          "passed": counts[PASS], "warnings": counts[WARN], "failed": counts[FAIL]},
                         ensure_ascii=False), flush=True)
    return 1 if counts[FAIL] else 0
