"""Choosing and describing devices, and the per-backend rules the rest of rlspeed follows.

`resolve_device("auto")` picks npu > cuda > xpu > mps > cpu. Everything else in the package asks this module
about a device (which integer dtype its kernels like, how to synchronise it, how much memory is free) instead of
branching on the device type itself.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import math
import numbers
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from rlspeed.errors import UserError

ACCELERATOR_ORDER = ("npu", "cuda", "xpu", "mps")


def major_minor(version: str) -> tuple[int, int]:
    """(major, minor) of a version text such as torch's "2.10.0+cu128"; (0, 0) where it has none."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def _npu_available() -> bool:
    """True when the torch_npu plugin imports and at least one Ascend device is visible."""
    if importlib.util.find_spec("torch_npu") is None:
        return False
    try:
        importlib.import_module("torch_npu")
        return bool(torch.npu.is_available() and torch.npu.device_count() > 0)  # type: ignore[attr-defined]
    except Exception:
        return False


def is_available(kind: str) -> bool:
    """Whether a device type (``"cpu"``, ``"cuda"``, ``"npu"``, ``"xpu"``, ``"mps"``) can be used here."""
    if kind == "cpu":
        return True
    if kind == "npu":
        return _npu_available()
    if kind == "cuda":
        return torch.cuda.is_available()
    if kind == "xpu":
        return hasattr(torch, "xpu") and torch.xpu.is_available()
    if kind == "mps":
        return hasattr(torch.backends, "mps") and torch.backends.mps.is_available()
    return False


def _current_index(kind: str) -> int:
    """The current device of an accelerator type (`torch.cuda.set_device(i)`'s, as a bare `"cuda"` means in PyTorch;
    0 where the backend cannot tell)."""
    try:
        return int(getattr(torch, kind).current_device())
    except Exception:  # (a backend without current_device, or one that fails to initialise)
        return 0


def device_count(kind: str) -> int:
    """Number of visible devices of a type (1 for cpu and mps)."""
    if not is_available(kind):
        return 0
    if kind in ("cpu", "mps"):
        return 1
    return int(getattr(torch, kind).device_count())


def resolve_device(spec: str | torch.device | None = "auto") -> torch.device:
    """Turn `spec`, ``auto|cpu|cuda[:i]|npu[:i]|xpu[:i]|mps`` (or a torch.device; None is ``auto``), into a usable
    torch.device, which it returns. ``auto`` is ``$RLSPEED_DEVICE`` where that is set, else the first accelerator
    available (NPU, CUDA, XPU, MPS, with its current index), else the CPU.

    Raises UserError with one sentence when the device is not there.
    """
    if isinstance(spec, torch.device):
        spec = str(spec)
    if spec is not None and not isinstance(spec, str):
        raise UserError(f"A device is a name (auto, cpu, cuda[:i], npu[:i], xpu[:i] or mps) or a torch.device, not "
                        f"{spec!r}.")
    spec = (spec or "auto").strip().lower()
    if spec == "auto":
        forced = os.environ.get("RLSPEED_DEVICE", "").strip().lower()
        if forced and forced != "auto":  # "auto" there means no preference (and must not recurse)
            try:
                return resolve_device(forced)
            except UserError as error:  # (its own advice, device='auto', is what chose it: say what to change)
                reason = re.split(r"; |: use ", str(error))[0].rstrip(".")
                raise UserError(f"RLSPEED_DEVICE={forced} names a device this machine cannot use ({reason}): unset "
                                "RLSPEED_DEVICE (or set it to auto), or give a device (--device cpu).") from None
        for kind in ACCELERATOR_ORDER:
            if is_available(kind):
                # (with its index, as its tensors report theirs: `mps` and `mps:0` are unequal devices in torch)
                return torch.device(kind, _current_index(kind))
        return torch.device("cpu")
    kind, _, index = spec.partition(":")
    if kind not in ("cpu",) + ACCELERATOR_ORDER:
        raise UserError(f"Unknown device '{spec}': use auto, cpu, cuda[:i], npu[:i], xpu[:i] or mps.")
    if index and not index.isdigit():  # (a malformed name is refused as such, whatever this machine has)
        raise UserError(f"Device index in '{spec}' must be a whole number, as in {kind}:0 or {kind}:1.")
    if not is_available(kind):
        raise UserError(f"Device '{spec}' is not available on this machine; run `rlspeed doctor` to see why, "
                        "or use device='auto' (--device auto on the command line).")
    if index:
        if int(index) >= device_count(kind):
            raise UserError(f"Device '{spec}' does not exist: {device_count(kind)} {kind} device(s) visible.")
        return torch.device(kind, int(index))
    if kind == "cpu":
        return torch.device(kind)
    return torch.device(kind, _current_index(kind))  # (a bare "cuda": the current device, as PyTorch reads it)


@dataclass(frozen=True)
class DeviceRules:
    """What kernels on a backend support, so that device maths uses dtypes that run there."""

    index_dtype: torch.dtype  # dtype for integer actions / indices kept on the device
    supports_compile: bool
    supports_graphs: bool
    float64: bool = True  # float64 tensors and collectives (MPS has none; HCCL's all-reduce lacks it)
    #: CNN encoders keep their convolution weights and inputs in channels-last memory (oneDNN's native layout on
    #: the CPU): faster training steps on training-size minibatches of the Nature CNN, about even for small
    #: batches and small CNNs (re-measured by benchmarks/conv_layout.py). Same maths up to summation order. Off
    #: where it has not been measured (every device but the CPU).
    channels_last_convs: bool = False


@functools.cache  # called on hot paths (per env step); the answer depends on the device only
def rules(device: torch.device) -> DeviceRules:
    """Per-backend rules: those of `device`'s type. On NPU, AI Core kernels lack int64 maths: indices and discrete
    actions use int32 there (bool masks are converted to float before any arithmetic everywhere, e.g. in `gae`)."""
    if device.type == "npu":
        return DeviceRules(torch.int32, supports_compile=True, supports_graphs=False, float64=False)
    if device.type == "mps":
        return DeviceRules(torch.int64, supports_compile=False, supports_graphs=False, float64=False)
    if device.type == "cuda":
        return DeviceRules(torch.int64, supports_compile=True, supports_graphs=True)
    if device.type == "xpu":  # (Intel's Arc and integrated GPUs have no float64; Data Center GPUs do)
        return DeviceRules(torch.int64, supports_compile=True, supports_graphs=False, float64=_xpu_has_fp64(device))
    return DeviceRules(torch.int64, supports_compile=True, supports_graphs=False,
                       channels_last_convs=device.type == "cpu")


def statistics_dtype(device: torch.device | str) -> torch.dtype:
    """The dtype running statistics are kept in: float64 where the device has it (as SB3's `RunningMeanStd`), else
    float32. In float32 a mean stops moving for features offset by 1e5 or more against their spread, a count stops
    counting past 2**24 rows and a square of 2e19 overflows; the normalised data keep the observations' dtype."""
    return torch.float64 if rules(torch.device(device)).float64 else torch.float32


def _xpu_has_fp64(device: torch.device) -> bool:
    """Whether an Intel GPU computes in float64 (its properties' `has_fp64`; assumed not where torch cannot say)."""
    try:
        return bool(torch.xpu.get_device_properties(device).has_fp64)
    except Exception:
        return False


def synchronize(device: torch.device) -> None:
    """Wait for all queued work on the device (for timing, and before the host reads an asynchronous device-to-host
    copy; not in a loop that could stay on the device instead)."""
    if device.type == "cpu":
        return
    accelerator = getattr(torch, "accelerator", None)  # device-generic API (torch >= 2.6)
    if accelerator is not None and hasattr(accelerator, "synchronize"):
        current = accelerator.current_accelerator() if accelerator.is_available() else None
        if current is not None and current.type == device.type:
            accelerator.synchronize(device)
            return
    module = getattr(torch, device.type, None)
    if module is not None and hasattr(module, "synchronize"):
        module.synchronize()


def free_memory_bytes(device: torch.device) -> int | None:
    """Free memory on the device in bytes, or None when the backend cannot tell."""
    if device.type == "cpu":
        try:
            pages = os.sysconf("SC_AVPHYS_PAGES")
            return int(pages * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError, AttributeError):
            return None
    module = getattr(torch, device.type, None)
    if module is not None and hasattr(module, "mem_get_info"):
        try:
            free, _total = module.mem_get_info(device)
            return int(free)
        except Exception:
            return None
    if device.type == "mps":  # (no mem_get_info: what Metal recommends for the process, less what it holds)
        try:
            return max(int(torch.mps.recommended_max_memory()) - int(torch.mps.driver_allocated_memory()), 0)
        except Exception:
            return None
    return None


def describe(device: torch.device) -> str:
    """A short human-readable name for the device, e.g. ``cuda:0 (NVIDIA H200)``."""
    if device.type == "cpu":
        return f"cpu ({torch.get_num_threads()} threads)"
    module = getattr(torch, device.type, None)
    name = None
    if module is not None and hasattr(module, "get_device_name"):
        try:
            name = module.get_device_name(device.index or 0)
        except Exception:
            name = None
    return f"{device} ({name})" if name else str(device)


def autocast_device_type(device: torch.device) -> str:
    """The device_type string torch.amp.autocast expects for this device."""
    return device.type


#: the count `configure_threads` last set for the whole process (the command line's `--threads`), which training
#: without a `num_threads` of its own uses (`set_training_threads`); None until it is called
_process_threads: int | None = None


def configure_threads(num_threads: int | None = None) -> int:
    """Set torch's intra-op threads for the whole process, deliberately: small RL models lose time to thread
    hand-offs. The command line calls it; from Python, models apply their count only while they train
    (`set_training_threads`), and those without a `num_threads` of their own then use the count set here.

    Default: ``RLSPEED_NUM_THREADS`` if set, else 1 thread, never more than the cores visible. RL-sized networks
    spend their time in per-kernel overhead, which more threads do not shorten; one thread also leaves the other
    cores to env subprocesses and data-parallel ranks. Returns the value set.
    """
    global _process_threads
    num_threads = default_num_threads() if num_threads is None else _within_cores(num_threads)
    torch.set_num_threads(num_threads)
    _process_threads = num_threads
    return num_threads


def check_num_threads(num_threads) -> int | None:
    """A model's `num_threads` as given: None (the default count, see `set_training_threads`) or a whole number of
    threads, at least 1; UserError in one sentence otherwise."""
    if num_threads is None:
        return None
    if isinstance(num_threads, bool) or not isinstance(num_threads, numbers.Integral) or num_threads < 1:
        raise UserError(f"num_threads is a whole number of torch threads, at least 1 (None: RLSPEED_NUM_THREADS, "
                        f"else 1), got {num_threads!r}.")
    return int(num_threads)


def set_training_threads(num_threads: int | None = None) -> int:
    """Set torch's intra-op threads for training and return the caller's count, which training gives back with
    `torch.set_num_threads(previous)` when it ends, also on error (`learn` does). `num_threads`: at most the cores
    visible; None: the count `configure_threads` set for the process, else `default_num_threads()`."""
    previous = torch.get_num_threads()
    count = _within_cores(num_threads) if num_threads is not None else (_process_threads or default_num_threads())
    if count != previous:
        torch.set_num_threads(count)
    return previous


@contextlib.contextmanager
def float32_default() -> Iterator[None]:
    """torch's default dtype float32 for the block, the caller's again after it (also on error): rlspeed's networks
    and the tensors it makes without a dtype are float32, also in a program that set `torch.set_default_dtype(
    torch.float64)` (whose float64 weights met float32 observations in the first forward pass)."""
    before = torch.get_default_dtype()
    if before == torch.float32:
        yield
        return
    torch.set_default_dtype(torch.float32)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


@contextlib.contextmanager
def training_threads(num_threads: int | None = None):
    """`set_training_threads` for the block, the caller's count given back after it. Work rlspeed does outside
    training on large tensors (a checkpoint's copies and checks) runs in one: on the caller's count (torch's default,
    every core) it started torch's OpenMP threads, on which a process forked afterwards (a sweep's
    multiprocessing.Pool worker) hangs at its first parallel operation."""
    previous = set_training_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def default_num_threads() -> int:
    """The thread count `configure_threads()` sets when none is given: ``RLSPEED_NUM_THREADS`` or 1, at least 1 and
    at most the cores visible. Raises UserError when the variable is not a whole number from 1 (0 or -2 was taken
    as 1 in silence)."""
    raw = os.environ.get("RLSPEED_NUM_THREADS", "").strip() or "1"
    try:
        num_threads = int(raw)
        if num_threads < 1:
            raise ValueError
    except ValueError:
        raise UserError(f"RLSPEED_NUM_THREADS must be a whole number of threads, at least 1, got '{raw}' (unset it "
                        "for one thread).") from None
    return _within_cores(num_threads)


def _within_cores(num_threads: int) -> int:
    return max(1, min(num_threads, cores_per_process()))


def local_processes() -> int:
    """How many processes a launcher started on this machine for the run (torchrun's ``LOCAL_WORLD_SIZE``; 1
    outside one, or where the variable is not a whole number)."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def processes_sharing_cores() -> int:
    """How many processes share this process's `usable_cores`: the launcher's processes on this machine
    (`local_processes`), or 1 where the launcher bound each to cores of its own (`bound_by_launcher`: `torchrun
    --numa-binding`: its cores already are its share)."""
    processes = local_processes()
    return 1 if processes == 1 or bound_by_launcher() else processes


def cores_per_process() -> int:
    """This process's share of `usable_cores` (divided among `processes_sharing_cores`), at least 1: torch's threads
    of several processes beyond the cores they share wait for each other's cores at every kernel."""
    return max(1, usable_cores() // processes_sharing_cores())


def bound_by_launcher() -> bool:
    """Whether this process may run on fewer cores than the process that started it (its CPU affinity a strict subset
    of its parent's: a launcher that gave each of its processes cores of their own); False where the OS keeps no
    affinity or the parent's cannot be read."""
    if not hasattr(os, "sched_getaffinity"):
        return False
    try:
        return os.sched_getaffinity(0) < os.sched_getaffinity(os.getppid())
    except OSError:
        return False


def usable_cores() -> int:
    """The cores this process may run on: its affinity mask where the OS has one (a SLURM job's or a container's
    CPUs, `taskset`; os.cpu_count() counts the whole machine's), else os.cpu_count(); at most its cgroup's CPU quota
    in whole cores, rounded up (`docker run --cpus=2`, a Kubernetes CPU limit: the affinity mask shows every core of
    the host there, so `--nproc 64` passed on a 64-core host where the container has 2)."""
    cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()) or 1
    quota = cgroup_cpu_quota()
    return max(1, min(cores, math.ceil(quota))) if quota is not None else cores


#: where Linux mounts the cgroup hierarchies (a test points it elsewhere; `rlspeed.buffers.replay` reads the memory
#: limit there)
CGROUP_ROOT = "/sys/fs/cgroup"
#: which cgroup this process is in, per hierarchy (a test points it elsewhere)
PROC_CGROUP = "/proc/self/cgroup"


def cgroup_directories(root: str, controller: str | None) -> list[str]:
    """The directories of this process's cgroup under `root` and of each cgroup above it, its own first, that exist
    here: cgroup v2's (`controller` None; the "0::/path" line of /proc/self/cgroup) or v1's hierarchy of
    `controller` ("cpu", "memory": `root/controller/path`). A limit set on any of them holds for this process (a
    SLURM job's or a systemd slice's memory.max sits on a cgroup below the root; in a container the process's own
    cgroup is the root it sees, and a path from the host's view that does not exist there is skipped)."""
    base = os.path.join(root, controller) if controller else root
    path = "/"
    try:
        with open(PROC_CGROUP) as handle:
            for line in handle:
                _, controllers, found = line.rstrip("\n").split(":", 2)
                if (controllers == "" if controller is None else controller in controllers.split(",")):
                    path = found
                    break
    except (OSError, ValueError):
        pass
    parts = [part for part in path.split("/") if part and part not in (".", "..")]
    directories = [os.path.join(base, *parts[:depth]) for depth in range(len(parts), 0, -1)]
    return [directory for directory in directories if os.path.isdir(directory)] + [base]


def cgroup_cpu_quota() -> float | None:
    """The CPU time this process's cgroup may use, in cores (quota / period), or None without a quota: the smallest
    over its cgroup and those above it (`cgroup_directories`) of cgroup v2's cpu.max ("max 100000" or "200000
    100000"), else v1's cpu.cfs_quota_us (-1 without one) / cpu.cfs_period_us.
    Read once per process and root (a thread count is looked up on every evaluation and checkpoint; the files took
    tens of microseconds each time)."""
    return _cgroup_cpu_quota(CGROUP_ROOT, PROC_CGROUP)


@functools.lru_cache(maxsize=8)
def _cgroup_cpu_quota(root: str, _proc_cgroup: str) -> float | None:
    quotas = [quota for directory in cgroup_directories(root, None) if (quota := _v2_quota(directory)) is not None]
    if not quotas:
        quotas = [quota for directory in cgroup_directories(root, "cpu") if (quota := _v1_quota(directory)) is not None]
    return min(quotas) if quotas else None


def _v2_quota(directory: str) -> float | None:
    try:
        with open(os.path.join(directory, "cpu.max")) as handle:
            quota, _, period = handle.read().strip().partition(" ")
        return int(quota) / int(period or 100_000) if quota != "max" and int(quota) > 0 else None
    except (OSError, ValueError, ZeroDivisionError):
        return None


def _v1_quota(directory: str) -> float | None:
    try:
        with open(os.path.join(directory, "cpu.cfs_quota_us")) as handle:
            quota = int(handle.read().strip())
        with open(os.path.join(directory, "cpu.cfs_period_us")) as handle:
            period = int(handle.read().strip())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def flush_denormal_enabled() -> bool:
    """Whether the CPU currently flushes denormal floats to zero (torch has a setter but no getter). Measured on the
    CPU by name, also where the caller made another device torch's default (`torch.set_default_device("cuda")`),
    whose arithmetic the setting does not reach."""
    return bool((torch.tensor([1e-39], dtype=torch.float32, device="cpu") * 1.0)[0] == 0)  # ok-sync: CPU scalar


def set_flush_denormal(enabled: bool) -> bool:
    """Treat denormal floats (|x| < 1.2e-38) as zero on the CPU, or not; returns the previous setting.

    Training drives some activations, gradients and Adam moments into the denormal range, where x86 arithmetic
    takes a slow path, many times slower per operation (docs/benchmarks.md records the profiling run that measured
    what it cost a trained DQN's update).
    Values that small change no result that matters (the next normal float is 1.2e-38). `learn` turns it on for
    its duration and restores the previous setting.
    """
    before = flush_denormal_enabled()
    torch.set_flush_denormal(enabled)
    return before
