"""Files a run directory holds that are rewritten whole (config.yaml, summary.json, metrics.csv, the plots): written
to a temporary file of their own and renamed over the old one, so that a reader (a torchrun worker reading
config.yaml, a person's `tail`) never sees one half written, and a kill leaves the old one whole. No torch import
here: the CLI writes them before it imports torch."""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import socket
import stat
import sys
import tempfile
from pathlib import Path

from rlspeed.errors import UserError


def local_path(path: str | os.PathLike) -> Path:
    """`path` as a Path, `~` expanded. UserError where its `~` names no home directory this system knows
    (`~nosuchuser/x`: pathlib's RuntimeError), and where this Python's file-name encoding (the locale's without UTF-8
    mode: ASCII under LC_ALL=C with PYTHONUTF8=0) cannot hold its characters, which every use of it would be a
    UnicodeEncodeError of."""
    try:
        path = Path(path).expanduser()
    except RuntimeError:  # ("Could not determine home directory.")
        raise UserError(f"'{path}': its '~' names a home directory this system does not know: give the path in "
                        "full.") from None
    try:
        os.fsencode(path)
    except UnicodeEncodeError:
        raise UserError(f"'{path}' has characters that this Python's file-name encoding "
                        f"({sys.getfilesystemencoding()}, the locale's) cannot hold: run Python in UTF-8 mode "
                        "(PYTHONUTF8=1, or python -X utf8) or under a UTF-8 locale (LC_ALL=C.UTF-8).") from None
    return path


def given_path(name: str, value) -> Path:
    """`value`, the path argument `name` names ("export's path"), as `local_path` gives it; UserError naming `name`
    for anything but a str or os.PathLike (None, a number), which pathlib refuses with a bare TypeError."""
    if not isinstance(value, (str, os.PathLike)):
        raise UserError(f"{name} is a path (a str or pathlib.Path), not {value!r}."[:200])
    return local_path(value)


def _process_umask() -> int:
    mask = os.umask(0o022)  # (read once, at import: setting it back and forth is not thread-safe later)
    os.umask(mask)
    return mask


_UMASK = _process_umask()


def process_running(pid: int) -> bool:
    """Whether the process `pid` may still run: False only where it is known to be gone. Always True on Windows, where
    `os.kill(pid, 0)` does not ask (signal 0 is CTRL_C_EVENT there: it sends Ctrl-C to the console's processes, the
    asking one among them, or fails)."""
    if sys.platform == "win32":
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # (PermissionError: another user's process runs)
        return True
    return True


def _machine() -> str:
    """This machine, as the names of `process_folder_prefix` give it: 8 hex digits of a hash of its host name."""
    return hashlib.sha256(socket.gethostname().encode("utf-8", "surrogateescape")).hexdigest()[:8]


def process_folder_prefix(prefix: str) -> str:
    """How the name of a folder this process makes in the temp directory begins: `prefix`, its process id, `@` and
    this machine (`_machine`), and a dash. The machine, since the temp directory may be one that several machines
    share (TMPDIR on a cluster's shared storage): another machine's process ids are not this one's to judge."""
    return f"{prefix}{os.getpid()}@{_machine()}-"


def forget_ended_processes_folders(prefix: str) -> None:
    """Remove the folders named `<prefix><pid>@<machine>-...` (`process_folder_prefix`; an older rlspeed's
    `<prefix><pid>-...`) in the temp directory whose process `pid` (not this one) on this machine is known to be
    gone: what a command killed with SIGKILL (its exit handlers never ran) left there. Others' (another machine's,
    another user's process, any on Windows: `process_running`) are left alone, as are links and files."""
    for path in Path(tempfile.gettempdir()).glob(f"{glob.escape(prefix)}*-*"):
        pid, _, machine = path.name[len(prefix):].partition("-")[0].partition("@")
        if not pid.isdigit() or int(pid) == os.getpid() or not path.is_dir() or path.is_symlink():
            continue
        if machine and machine != _machine():
            continue
        if not process_running(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _temporaries(path: Path) -> list[Path]:
    """The temporary files `write_text_atomic` makes for `path` (`.NAME.XXXXXXXX.tmp` beside it)."""
    return list(path.parent.glob(f".{glob.escape(path.name)}.*.tmp"))


def size_text(count: float, exact: bool = False) -> str:
    """Bytes in words, never a size shown as 0.0 that is not nothing: '2.1 GiB' from 1 GiB, '3.5 MiB' from 0.1 MiB,
    '12.8 KiB' from 1 KiB, else '512 bytes'. `exact` (where a byte more or less decides, as a disk one byte short):
    the whole count first, its size in words after it from 1 KiB on ('1,040,001 bytes (1.0 MiB)')."""
    if exact:
        return f"{count:,} bytes" + (f" ({size_text(count)})" if count >= 2**10 else "")
    if count >= 2**30:
        return f"{count / 2**30:,.1f} GiB"
    if count >= 2**20 / 10:
        return f"{count / 2**20:,.1f} MiB"
    return f"{count / 2**10:,.1f} KiB" if count >= 2**10 else f"{count:,.0f} bytes"


def free_disk_bytes(directory: str | os.PathLike) -> int | None:
    """The bytes free to this user on the disk holding `directory`, or None where the file system does not say: it
    refuses (OSError), or it reports no total or nothing free, as some FUSE file systems do while writes succeed (a
    disk that is really full fails the write itself, which then has nothing left to fill)."""
    try:
        usage = shutil.disk_usage(directory)
    except OSError:
        return None
    return usage.free if usage.total > 0 and usage.free > 0 else None


def unwritable(directory: str | os.PathLike) -> str | None:
    """Why no file can be made in `directory` (the OS's reason), or None where one can: found by making a temporary
    file there, which leaves nothing behind. A real write, not `os.access`, which a read-only file system, NFS
    root-squash or ACLs can make answer wrongly."""
    try:
        with tempfile.TemporaryFile(dir=directory):
            return None
    except OSError as error:
        return error.strerror or str(error)


def refuse_symlinks(directory: Path, names: tuple[str, ...]) -> None:
    """UserError where one of the entries `names` of a run directory that a run reads or adds files to (metrics.csv,
    tensorboard/, videos/) is a symlink: a run directory from elsewhere (copied, unpacked, shared) may point one at any
    file or directory, which the run would read as its own or write into."""
    for name in names:
        if (directory / name).is_symlink():
            raise UserError(f"'{directory / name}' is a symlink, which rlspeed neither reads nor writes through (a run "
                            "directory from elsewhere may point it at any file or directory): put what it points at in "
                            "its place, or remove it, and run again.")


def write_atomic(path: Path, text: str | bytes, replace: bool = True) -> None:
    """Write `path` whole or not at all: a new temporary file of its own (never one a symlink in the directory points
    at), with a plain write's mode, synced to disk, renamed over `path`. OSError where it cannot be written; with
    `replace=False`, FileExistsError where `path` exists (made by another process since the caller looked).

    Text is written as UTF-8 whatever the locale (so a reader passing encoding="utf-8" reads it back on any
    machine); a lone surrogate (a file name that was not UTF-8) is written as its `\\udcXX` escape, which a JSON
    reader turns back into the same character. Bytes (a plot's PNG) are written as they are."""
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    temporary = Path(name)
    try:
        with (os.fdopen(fd, "wb") if isinstance(text, bytes) else
              os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace", newline="")) as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())  # (on disk before the rename: a power loss leaves the old file, not an empty one)
        move_into_place(temporary, path, replace)
        temporary = None
    finally:  # (also on Ctrl-C: no temporary file left behind)
        if temporary is not None:
            temporary.unlink(missing_ok=True)


def refuse_special_file(path: str | Path, name: str | None = None) -> None:
    """UserError in one sentence where `path` is a device, a pipe or a socket (`name`: the option that gave it, else
    the path alone): a file written there by a rename replaces it (`/dev/null` made a regular file, where the user may
    write to /dev)."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:  # (nothing there, or nothing this process may look at: the write says so)
        return
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        raise UserError(f"{name + ' ' if name else ''}'{path}' is a device or a pipe, which a file written there "
                        "would replace: give a path to a regular file.")


def refuse_irregular_file(path: str | Path, what: str, give: str) -> None:
    """UserError in one sentence where `path` (followed through links) is a directory, a device, a pipe or a socket:
    what a file is read from must be a regular file (a pipe's read waits for a writer, /dev/zero's never ends).
    `what` names the path in the sentence (e.g. "--preset x.yaml"), `give` what to give instead. Nothing there, or
    nothing this process may look at: the caller's read says so."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "a device or a pipe"
        raise UserError(f"{what} is {kind}, not a regular file: give {give}.")


def move_into_place(temporary: Path, path: Path, replace: bool = True) -> None:
    """Give the whole file `temporary` (beside `path`, already synced) the name `path` in one step, with a plain
    write's mode: renamed over `path` (a symlink there is replaced, never written through), or with `replace=False`
    only where `path` does not exist (FileExistsError, `temporary` kept: made by another process meanwhile)."""
    refuse_special_file(path)
    if os.name != "nt":  # (mkstemp's files are 0600; Windows' have no such mode bits)
        os.chmod(temporary, 0o666 & ~_UMASK)
    if replace:
        temporary.replace(path)
    else:
        _create_from(temporary, path)


def _create_from(temporary: Path, path: Path) -> None:
    """Give the written file `temporary` the name `path`, which must not exist (FileExistsError), and remove the
    temporary name: a hard link (which, unlike a rename, fails where `path` exists); where the file system has none,
    an exclusive empty file at `path`, then the rename over it."""
    try:
        os.link(temporary, path)
    except FileExistsError:
        raise
    except OSError:  # (no hard links here: FAT, some network file systems)
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0), 0o600))
        temporary.replace(path)
        return
    temporary.unlink()


def write_text_atomic(path: Path, text: str) -> None:
    """`write_atomic`, with a UserError naming the file where it cannot be written."""
    try:
        write_atomic(path, text)
    except OSError as error:
        raise UserError(f"Cannot write '{path}': {error.strerror or error}.") from None


def remove_stale_temporaries(directory: Path, names: tuple[str, ...]) -> None:
    """Remove the temporary files `write_text_atomic` left for `directory/NAME` where a kill came between their
    write and their rename: call it holding the directory's lock (no other writer then)."""
    for name in names:
        for temporary in _temporaries(directory / name):
            temporary.unlink(missing_ok=True)
