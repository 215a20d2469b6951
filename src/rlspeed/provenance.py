"""What a run needs recorded to be repeated and described in a paper's appendix: the command, the versions of the
software that ran it, the machine, and the git commits of rlspeed's source and of the working directory
(summary.json's `provenance`). No torch import at module level (benchmarks' scripts import `cpu_model`)."""

from __future__ import annotations

import datetime
import functools
import importlib.metadata
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

#: the packages whose versions a run records (those that change what trains or how it is measured)
PACKAGES = ("rlspeed", "torch", "gymnasium", "numpy")


@functools.cache
def package_version(package: str) -> str | None:
    """The installed version of `package`, or None where it is not installed (read once per process: each run's
    provenance asks, and the metadata is parsed at each read; the code a process runs is what it imported)."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else whatever `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def git_state(path: str | os.PathLike, tracked: str | os.PathLike | None = None) -> dict | None:
    """``{"commit", "dirty"}`` of the git work tree holding `path` (dirty: tracked files changed since the commit),
    or None outside one, without git, or where `tracked` is given and that file is not tracked there (rlspeed's
    files in a site-packages that a project's repository ignores are no checkout of rlspeed)."""
    def git(*args: str) -> str:
        # (no program a repository's own config names runs: `status` would start its core.fsmonitor command, and a
        # directory of someone else's files may hold a .git whose config names one)
        return subprocess.run(["git", "-c", "core.fsmonitor=false", "-C", str(path), *args], capture_output=True,
                              text=True, check=True, timeout=10, stdin=subprocess.DEVNULL).stdout.strip()

    try:
        if tracked is not None:
            git("ls-files", "--error-unmatch", str(tracked))
        # (the commit and the changed files in one git process: "# branch.oid COMMIT" or "(initial)", then a line per
        # changed tracked file)
        lines = git("status", "--porcelain=v2", "--branch", "--untracked-files=no").splitlines()
    except (OSError, subprocess.SubprocessError):
        return None
    commit = next((line.split()[2] for line in lines if line.startswith("# branch.oid ")), "(initial)")
    if commit == "(initial)":  # (a repository without a commit yet)
        return None
    return {"commit": commit, "dirty": any(not line.startswith("#") for line in lines)}


def accelerator_name(device) -> str | None:
    """The name of the accelerator the torch `device` is (``NVIDIA H100 80GB HBM3``), or None for a CPU."""
    if device is None or getattr(device, "type", "cpu") == "cpu":
        return None
    import torch

    try:
        return str(getattr(torch, device.type).get_device_name(device.index or 0))
    except Exception:  # noqa: BLE001 (a backend without device names, mps; one its driver cannot name)
        return str(device)


def provenance(argv: list[str] | None = None) -> dict:
    """summary.json's `provenance`, as the command starts: ``{"command", "started_utc", "versions", "python",
    "platform", "cpu", "rlspeed_git", "working_directory_git"}`` (the CLI adds `accelerator`, `accelerator_name`'s).
    `argv`: the command's arguments after `rlspeed` (default: this process's). `versions` names rlspeed's, torch's (and
    the CUDA its build targets), Gymnasium's and numpy's; a git entry is ``{"commit", "dirty"}`` of rlspeed's source
    checkout and of the working directory's repository, None outside one."""
    import torch

    import rlspeed

    argv = list(sys.argv[1:] if argv is None else argv)
    source = Path(rlspeed.__file__).resolve()
    versions = {name: package_version(name) for name in PACKAGES}
    versions.update(rlspeed=rlspeed.__version__, torch=torch.__version__, torch_cuda=torch.version.cuda)
    return {"command": shlex.join(["rlspeed", *argv]),
            "started_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "versions": versions, "python": platform.python_version(), "platform": platform.platform(),
            "cpu": cpu_model(), "rlspeed_git": git_state(source.parent, tracked=source),
            "working_directory_git": git_state(os.curdir)}
