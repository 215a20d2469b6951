"""Run logging: progress bar, metrics.csv, TensorBoard (when installed) and the learning-curve plot."""

from __future__ import annotations

import contextlib
import csv
import functools
import importlib.util
import io
import json
import math
import os
import sys
import threading
import time
import typing
import warnings
from pathlib import Path

from rlspeed.errors import UserError
from rlspeed.files import refuse_symlinks, write_atomic

#: TensorBoard's section of each metrics.csv column (as Stable-Baselines3 groups its logger's keys); a column not
#: named here (a loss or other value of the update) is under train/, a key with a section of its own (a callback's
#: `self.logger.record("custom/x", ...)`) keeps it
TENSORBOARD_SECTIONS = {
    "train_wall_s": "time", "sps": "time", "members": "time",
    "episode_return": "rollout", "success_rate": "rollout", "epsilon": "rollout",
    "eval_mean": "eval", "eval_success_rate": "eval", "eval_confirm_mean": "eval", "eval_unfinished": "eval",
    "eval_confirm_unfinished": "eval",
}


def tensorboard_tag(key: str) -> str:
    """The TensorBoard tag of metrics.csv column `key`: `section/key` (`rollout/episode_return`, `train/value_loss`;
    `TENSORBOARD_SECTIONS`)."""
    return key if "/" in key else f"{TENSORBOARD_SECTIONS.get(key, 'train')}/{key}"


def flat_tags(run_dir: str | os.PathLike) -> bool:
    """Whether the run in `run_dir` began writing TensorBoard tags flat, as metrics.csv's column names (an rlspeed
    before the sections of `tensorboard_tag`): a continued run keeps writing them so, and its curves stay whole."""
    try:
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    except Exception:  # noqa: BLE001 (no tensorboard, or one that cannot be imported: no events to follow)
        return False
    files = sorted((Path(run_dir) / "tensorboard").glob("events.out.tfevents.*"))
    for path in files[:1]:  # (the run's first events: its first scalar's tag says how it named them)
        try:
            for event in EventFileLoader(str(path)).Load():
                for value in event.summary.value:
                    return "/" not in value.tag or value.tag.split("/")[0] not in {"time", "rollout", "eval", "train"}
        except Exception:  # noqa: BLE001 (an unreadable file: the sections, as for a new run)
            return False
    return False


def agg_figure(path: Path, **options):
    """A matplotlib Figure (`options`: its keywords) on an Agg canvas of its own, for the plot saved at `path`: no
    pyplot, so the user's matplotlib backend and figures are left alone. None, with a warning, where matplotlib
    cannot be imported (a broken install): the run is kept whole without that plot."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as error:
        warnings.warn(f"matplotlib cannot be imported ({error}): the run is kept without its plot '{path.name}'; "
                      "pip install matplotlib (rlspeed doctor checks it).", stacklevel=3)
        return None
    figure = Figure(**options)
    FigureCanvasAgg(figure)
    return figure


#: from this magnitude on a return is printed to six significant digits: a float32's (4.8e+21), not its noise digits
#: (4800000096196211245056.0)
LARGE_RETURN = 1e6


def format_return(value: float, decimals: int | None = None) -> str:
    """A return as printed: six significant digits from 1e6 on (`LARGE_RETURN`); below, `decimals` decimals where
    given, else one decimal from 10 on (500.0, -1634.6) and three significant digits below (0.92, -0.125), where
    rewards of order 1 would otherwise all read 0.9."""
    if math.isfinite(value) and abs(value) >= LARGE_RETURN:
        return f"{value:.6g}"
    if decimals is not None:
        return f"{value:.{decimals}f}"
    return f"{value:.1f}" if not math.isfinite(value) or abs(value) >= 10 else f"{value:.3g}"


def finite_or_none(value):
    """`value` with every NaN or infinite float (also inside dicts, lists and tuples) replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_or_none(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(item) for item in value]
    return value


def strict_json(value, **kwargs) -> str:
    """`value` as strict JSON (RFC 8259: no NaN or Infinity, which most parsers refuse): non-finite floats become
    null. `kwargs` go to `json.dumps`."""
    return json.dumps(finite_or_none(value), allow_nan=False, **kwargs)


def whole_iterations(total: int, per_iteration: int) -> str:
    """A start line's " (N: whole iterations of M)" where a budget of `total` env steps is not whole iterations of
    `per_iteration` (`learn` trains whole iterations, so it ends at N), else nothing."""
    whole = -(-int(total) // per_iteration) * per_iteration
    return f" ({whole:,}: whole iterations of {per_iteration:,})" if whole != total else ""


def cut_short(unfinished: int | None, episodes: int) -> str:
    """', N of M cut short at the step limit' where `unfinished` of an evaluation's `episodes` were still running at
    its step limit (they count with the return collected so far: a continuing env's episodes never end)."""
    return f", {unfinished} of {episodes} cut short at the step limit" if unfinished else ""


def bar_evaluation(row: dict, episodes: int) -> float | str | None:
    """The progress bar's `eval` of metrics row `row`: its `eval_mean`, followed by ` (K/M cut)` where K of the
    evaluation's `episodes` were cut short at the step limit (None where the row has no evaluation)."""
    mean, unfinished = row.get("eval_mean"), row.get("eval_unfinished")
    if mean is None or not unfinished:
        return mean
    return f"{format_return(mean, decimals=1)} ({unfinished}/{episodes} cut)"


#: metrics whose NaN means "nothing to measure", written as an empty cell: no episode finished in the row's interval,
#: or (explained_variance) returns that did not vary
NO_DATA_METRICS = ("episode_return", "success_rate", "explained_variance")


def _csv_row(row: dict) -> dict:
    """A metrics row as written to metrics.csv: a metric with nothing to measure (`NO_DATA_METRICS`) is an empty cell
    (read back as missing); any other non-finite value, a diverged loss, is written as nan, inf or -inf."""
    return {key: "" if key in NO_DATA_METRICS and isinstance(value, float) and math.isnan(value) else value
            for key, value in row.items()}


#: rlspeed's bars drawn in place now (a terminal's, a notebook's), whose line a warning or a callback's line shown
#: meanwhile would be written onto
_DRAWN_BARS: set[int] = set()
_DRAWN_LOCK = threading.Lock()


def _show_warning_beside_bars(message, category, filename, lineno, file=None, line=None) -> None:
    """Python's display of a warning, on lines of its own above a drawn bar (the bar's line cleared first and drawn
    again after, as tqdm's `write` does), not glued to the end of the bar's line."""
    with _tqdm_class().external_write_mode(file=file if file is not None else sys.stderr):
        warnings._showwarning_orig(message, category, filename, lineno, file, line)


def _drawing(key: int, drawn: bool) -> None:
    """Record bar `key` as drawn (or no longer): while any is, warnings show beside bars, where Python's own display
    of warnings is in place (a display of the caller's or of the `rlspeed` command, which draws its lines beside the
    bars itself, is left alone; one shown through catch_warnings(record=True) is recorded as before)."""
    original = getattr(warnings, "_showwarning_orig", None)
    with _DRAWN_LOCK:
        if drawn:
            if not _DRAWN_BARS and original is not None and warnings.showwarning is original:
                warnings.showwarning = _show_warning_beside_bars
            _DRAWN_BARS.add(key)
        elif key in _DRAWN_BARS:
            _DRAWN_BARS.discard(key)
            if not _DRAWN_BARS and warnings.showwarning is _show_warning_beside_bars:
                warnings.showwarning = original


def print_beside_bars(*values, file=None, flush: bool = False) -> None:
    """`print` for a line said while training runs (a callback's, the command line's): in a terminal where a bar is
    drawn, on a line of its own above the bar (tqdm's `write`), not at the end of the bar's line. Elsewhere (a
    notebook's output, a file) as `print` writes it (and without touching tqdm, whose `write` makes its
    multiprocessing lock: that would fix the start method of a caller of `rlspeed.cli.main(argv)`)."""
    stream = file if file is not None else sys.stdout
    if _DRAWN_BARS and _is_terminal(stream):
        _tqdm_class().write(" ".join(map(str, values)), file=stream)
    else:
        print(*values, file=stream)
    if flush:
        stream.flush()


def metrics_line(name: str, row: dict) -> str:
    """A metrics row as `verbose=2` prints it: `name`, then `key=value` for each, the step count first (floats to 4
    significant digits)."""
    return f"{name} " + " ".join(f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}"
                                 for key, value in {"timesteps": row["timesteps"], **row}.items())


@functools.cache
def _tqdm_class(auto: bool = False) -> type:
    """tqdm's bar class (`auto`: tqdm.auto's, widgets in a notebook), made to leave the caller's process as it found
    it: no monitor thread (tqdm starts one with its first bar and leaves it running; `ProgressBar.update` redraws its
    bar itself), and tqdm's thread lock alone in place of its default lock, whose multiprocessing half fixes the
    process's start method as it is made (the caller's later `multiprocessing.set_start_method("spawn")` then raises
    "context has already been set"). Bars of this process still take turns with the caller's tqdm bars; worker
    processes' bars sharing tqdm's multiprocessing lock do not wait for these."""
    if auto:
        from tqdm.auto import tqdm
    else:
        from tqdm.std import tqdm
    from tqdm.std import TqdmDefaultWriteLock

    class Bar(tqdm):
        monitor_interval = 0
        _lock = TqdmDefaultWriteLock.th_lock or threading.RLock()

    return Bar


class ProgressBar:
    """A tqdm bar over env steps (or another `unit`: evaluation episodes) showing steps/s and the recent episode
    return. Where stderr is not a terminal (a log file, a batch job's output), a bar redrawn in place would pile up as
    one endless line: there it writes a status line every `LINE_INTERVAL_S` seconds instead, and a last one at the end
    of a run that wrote any (unless the last one already shows the end)."""

    #: seconds between status lines where stderr is not a terminal
    LINE_INTERVAL_S = 30.0
    #: the longest a drawn bar goes without a redraw while `update` is called (its elapsed time moves on)
    REDRAW_S = 1.0

    def __init__(self, total: int, enabled: bool = True, desc: str = "train", initial: int = 0, unit: str = "step"):
        # (a notebook's stderr is no terminal either, but tqdm.auto draws its bars as widgets there)
        self.lines = enabled and not _is_terminal(sys.stderr) and "ipykernel" not in sys.modules
        # (in line mode the bar still counts, drawn nowhere)
        self._null = open(os.devnull, "w") if self.lines else None
        # (imported here, not with rlspeed: tqdm.auto picks its bar on import, and in a notebook without ipywidgets
        # it falls back to the console bar with a TqdmWarning; there, the console bar without the warning)
        tqdm = _tqdm_class(auto=importlib.util.find_spec("ipywidgets") is not None)
        # (counts of thousands as 4.10k; below, whole numbers: 8/20 episodes, not tqdm's scaled 8.00/20.0; the
        # postfix, the returns, before the times: a line wider than the terminal is cut at its end, and at 80
        # columns tqdm's layout cut the returns off)
        counts = "{n}/{total}" if total < 1000 else "{n_fmt}/{total_fmt}"
        # (no tqdm at all where no bar shows, progress_bar=False)
        self.bar = tqdm(total=total, initial=initial, unit=unit, unit_scale=True, desc=desc,
                        dynamic_ncols=True, leave=True, file=self._null,
                        bar_format="{l_bar}{bar}| " + counts + "{postfix} [{elapsed}<{remaining}, {rate_fmt}]"
                        ) if enabled else _Count(total, initial)
        self.desc, self.unit = desc, unit
        self._shown: dict = {}
        self._last_line = time.monotonic()
        self._wrote_line = False
        self._lined = initial  # the step count the last status line showed
        self._redrawn = 0.0  # (time.time() of the last redraw `update` asked for)
        if enabled and not self.lines:
            _drawing(id(self), True)

    def update(self, steps: int, **postfix) -> None:
        """Advance the bar by `steps` env steps and show `postfix` (floats as `format_return` with one decimal). A value
        of None or NaN (no episode ended since the last update, no evaluation at this one) keeps the key's last value,
        left out until it has one."""
        given = {k: (format_return(v, decimals=1) if isinstance(v, float) else v) for k, v in postfix.items()
                 if v is not None and not (isinstance(v, float) and math.isnan(v))}
        # (episodes of 100,000 steps end in a few of the rows: their return showed for one row, then was gone)
        shown = {k: given.get(k, self._shown.get(k)) for k in postfix if k in given or k in self._shown}
        if shown:
            self.bar.set_postfix(shown, refresh=False)
            self._shown = shown
        self.bar.update(steps)
        if self.lines:
            if time.monotonic() - self._last_line >= self.LINE_INTERVAL_S:
                self._line()
        elif not self.bar.disable and time.time() - max(self.bar.last_print_t, self._redrawn) >= self.REDRAW_S:
            # (tqdm skips redraws until as many more steps as the last ones took come: with none between episodes,
            # its elapsed time stood still, as if hung)
            self.bar.refresh()
            self._redrawn = time.time()

    def status_line(self) -> None:
        """Write a status line now where stderr is no terminal (a long task's first word, before
        `LINE_INTERVAL_S` has passed); nothing where the bar is drawn."""
        if self.lines:
            self._line()

    def _line(self) -> None:
        total = self.bar.total or 0
        share = f" ({100 * self.bar.n / total:.0f}%)" if total else ""
        details = "".join(f", {key} {value}" for key, value in self._shown.items())
        print(f"{self.desc}: {self.bar.n:,}/{total:,} {self.unit}s{share}{details}", file=sys.stderr, flush=True)
        self._last_line, self._wrote_line, self._lined = time.monotonic(), True, self.bar.n

    def close(self) -> None:
        """Finish the bar (it stays on screen; in line mode, a last line where any was written)."""
        if self.lines and self._wrote_line and self.bar.n != self._lined:
            self._line()
        _drawing(id(self), False)
        self.bar.close()
        if self._null is not None:
            self._null.close()
            self._null = None


class _Count:
    """A hidden bar's counts (`ProgressBar.bar` where no bar shows): tqdm's attributes and methods that
    `ProgressBar` and its callers use, without tqdm."""

    disable = True
    last_print_t = 0.0

    def __init__(self, total: int, initial: int = 0):
        self.total, self.n = total, initial

    def update(self, steps: int) -> None:
        self.n += steps

    def set_postfix(self, *args, **kwargs) -> None:
        pass

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        pass


def _quiet_tensorboard_threads() -> None:
    """An OSError ending a TensorBoard writer thread (a full disk, a directory gone) is not printed: it reaches the
    training thread at the next write or flush, as one sentence (`RunLogger._writing`). Every other thread's error
    goes to the hook as before."""
    previous = threading.excepthook
    if getattr(previous, "quiets_tensorboard", False):
        return

    def hook(args) -> None:
        if not (isinstance(args.exc_value, OSError) and type(args.thread).__module__.startswith("tensorboard.")):
            previous(args)

    hook.quiets_tensorboard = True
    threading.excepthook = hook


def _identity(directory: Path | str | None) -> tuple[int, int] | None:
    """The directory's (or file's) device and inode (None where it is gone, or for None): another directory at its
    path has others."""
    if directory is None:
        return None
    try:
        status = os.stat(directory)
    except OSError:
        return None
    return status.st_dev, status.st_ino


def _named(path) -> str:
    """An OSError's file name as text (TensorBoard's are bytes, shown as `b'...'` otherwise)."""
    return os.fsdecode(path) if isinstance(path, bytes) else str(path)


def holds_metrics(run_dir: str | os.PathLike) -> bool:
    """Whether `run_dir/metrics.csv` holds a run's metrics: a row under its header. The empty file a learn call leaves
    when an error or an interrupt (a notebook's stop button) stopped it before its first row holds none, and another
    run may start there (the cell run again). A file that cannot be read counts as holding some."""
    path = Path(run_dir) / "metrics.csv"
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            handle.readline()  # (the header)
            return bool(handle.readline().strip())
    except (FileNotFoundError, NotADirectoryError):  # (no file, or no directory: a file where one would be made)
        return False
    except (OSError, UnicodeDecodeError):
        return True


def refuse_other_metrics(run_dir: str | os.PathLike, who: str, steps: int, current: Path | None,
                         left_at: int | None) -> typing.NoReturn:
    """The UserError where `run_dir` holds a metrics.csv that `who` ("model", "population"), at `steps` env steps,
    does not continue: its own run's, whose rows end at step `left_at` where it left for `current` (rows that went on
    from there would lack the steps it trained in `current`), or another run's, which it would replace."""
    if left_at is not None and current is not None:
        raise UserError(f"'{run_dir}' holds the metrics.csv of this {who}'s run up to step {left_at:,}; it has trained "
                        f"on to step {steps:,} in '{current}' since, whose steps that file would lack: go on in "
                        f"'{current}', or give another run_dir.")
    which = "untrained" if not steps else "trained in another run"
    raise UserError(f"'{run_dir}' holds the metrics.csv of another run, which this {who} ({which}) would replace: give "
                    "another run_dir, or delete the file first.")


def _utf8_name(path: Path) -> bool:
    """Whether a path's name is valid UTF-8 (a directory unpacked from a GBK zip may not be: os.fsdecode's
    surrogates)."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _why_not_utf8(path: Path) -> str:
    """Why `path` (not `_utf8_name`) is no UTF-8 text, said of it: its name's bytes are other than UTF-8, or they are
    UTF-8 that this Python's file-name encoding (the locale's without UTF-8 mode: ASCII under LC_ALL=C) cannot read."""
    try:
        os.fsencode(path).decode("utf-8")
    except UnicodeDecodeError:
        return "whose name is not UTF-8"
    return (f"whose name this Python's file-name encoding ({sys.getfilesystemencoding()}, the locale's) cannot hold "
            "(PYTHONUTF8=1, or a UTF-8 locale such as LC_ALL=C.UTF-8, lets it write there)")


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # (a closed or replaced stream)
        return False


class KeptWriter:
    """A model's TensorBoard writer between its `learn` calls: the next call into the same run directory that goes on
    from the step its events reached writes on into the same events file. Without it each call made a file of its
    own (a loop of `learn(..., reset_num_timesteps=False)`: 50 calls, 50 files), and TensorBoard, which reads a
    directory's files in the order of their names, read a file made in the same second as its 10th successor after
    it, and dropped the points written between (its restart, `purge_step`, applied out of order). Closed by `close`
    (the model's `close`), or when the model is garbage-collected; a copy of a model keeps none."""

    def __init__(self) -> None:
        self._writer = None
        # (the tensorboard directory, its identity and that of the events file, the step the events reached, and
        # whether their tags are flat: `flat_tags`)
        self._where: tuple | None = None

    def take(self, directory: Path, step: int | None) -> tuple | None:
        """(writer, flat) of the writer kept for `directory` whose events end at `step`, handed over to the caller
        (who closes it, or gives it back with `keep`); else None, and any other writer kept is closed."""
        writer, where = self._writer, self._where
        self._writer = self._where = None
        if writer is None:
            return None
        if step is not None and where[:4] == (directory, _identity(directory), _identity(_events_file(writer)), step):
            return writer, where[4]
        with contextlib.suppress(OSError):  # (its events were flushed as the last learn call ended)
            writer.close()
        return None

    def keep(self, writer, directory: Path, step: int, flat: bool) -> None:
        """Hold `writer` (flushed), whose events in `directory` end at `step`, for the next `take`."""
        self.close()
        self._writer = writer
        self._where = (directory, _identity(directory), _identity(_events_file(writer)), step, flat)

    def close(self) -> None:
        """Close the writer kept, if any (its events file is complete); closing twice is a no-op."""
        self.take(Path(), None)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # (also at interpreter exit, where modules may be gone)
            self.close()

    def __deepcopy__(self, memo: dict) -> KeptWriter:
        return KeptWriter()  # (one events file has one writer: a copy of the model opens its own)

    def __getstate__(self) -> dict:
        return {"_writer": None, "_where": None}


def _events_file(writer) -> str | None:
    """The path of the events file a torch SummaryWriter writes (None where its internals differ)."""
    file_writer = getattr(writer, "file_writer", None)
    return getattr(getattr(file_writer, "event_writer", None), "_file_name", None)


#: an events file's name: events.out.tfevents.<the second it was made>.<host>.<process id>.<the process's writer count>
_EVENTS = "events.out.tfevents."


def _events_second(name: str) -> int | None:
    """The second in which the events file `name` was made, as its name gives it (None for another name)."""
    second = name[len(_EVENTS):].partition(".")[0] if name.startswith(_EVENTS) else ""
    return int(second) if second.isdigit() else None


def _summary_writer(summary_writer: type, directory: Path, purge_step: int):
    """A `summary_writer` (torch's SummaryWriter) on a new events file in `directory` whose name sorts after those of
    the events files there. TensorBoard reads a directory's events files in the order of their names (its live reader
    goes on only to names after the one it read; a restart's purge drops the points read before it): a file made in
    the same second as an earlier one could sort before it (a process's 10th writer before its 9th, another process's
    id before this one's), and a continued run then showed the points its restart dropped, or none of its own. Such a
    file is removed and made again in the next second."""
    earlier = [path.name for path in directory.glob(f"{_EVENTS}*")] if directory.is_dir() else []
    writer = summary_writer(str(directory), purge_step=purge_step)
    made = _events_file(writer)
    if made is None or not earlier or Path(made).name > max(earlier):
        return writer
    second = _events_second(Path(made).name)
    if second is None or max(_events_second(name) or 0 for name in earlier) != second:
        return writer  # (a later second than this one's: a clock set back, or files of a machine ahead; no wait helps)
    writer.close()
    os.remove(made)
    while int(time.time()) <= second:
        time.sleep(max(0.0, second + 1 - time.time()))
    return summary_writer(str(directory), purge_step=purge_step)


class RunLogger:
    """Writes one row per log interval to `metrics.csv` (and TensorBoard), and plots the curve at the end.

    Each row reaches the file as it is logged (flushed), so the file can be read during a run and a killed run
    keeps what it logged. A row with a new key adds a column: the file is then rewritten with the wider header.
    `continue_from`: a run that continues (resume, a restart, a further `learn`) keeps the rows already in
    `metrics.csv` up to that env step (and its TensorBoard events), instead of starting the file afresh.
    `columns`: keys that later rows will bring (evaluations), in the header from the first row on, so that a reader
    following the file as it grows sees one header. `plot`: save `learning_curve.png` at `close`. `kept`: the model's
    `KeptWriter`, whose writer this logger writes on with where it continues that writer's events, and to which
    `close(keep_writer=True)` gives its writer back.
    """

    def __init__(self, run_dir: str | os.PathLike, tensorboard: bool = True, continue_from: int | None = None,
                 columns: tuple[str, ...] = (), plot: bool = True, kept: KeptWriter | None = None):
        self.run_dir = Path(run_dir)
        self._plot = plot  # (learning_curve.png at close; a population plots its members itself)
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as error:  # (a read-only file system, another user's directory, a file in the way)
            raise UserError(f"Cannot create the run directory '{self.run_dir}' ({error.strerror or error}); give "
                            "run_dir a directory you can write to.") from None
        self._identity = _identity(self.run_dir)  # (`_check_directory`)
        self.last_row: dict | None = None  # the last row logged (or, continuing, the last one kept)
        # Rows are not kept in memory once metrics.csv holds them (a row a second is 86,400 a day): `_held` is None
        # where metrics.csv holds every row under `_fields` (new rows are appended to it), else the rows its next
        # write writes (a continued run's kept rows, where some were dropped).
        self._held: list[dict] | None = []
        self._fields: list[str] = []
        self._columns = tuple(columns)
        if continue_from is not None:
            refuse_symlinks(self.run_dir, ("metrics.csv",))
            self._read_rows(continue_from)
        self._csv = None  # the open metrics.csv and its DictWriter, once a row is logged
        self._writer = None
        self._flat = False  # (tags as metrics.csv's columns: a run an earlier rlspeed began, `flat_tags`)
        self._failed = False  # a write failed (`_writing`)
        self._kept = kept
        if tensorboard and importlib.util.find_spec("tensorboard") is not None:
            refuse_symlinks(self.run_dir, ("tensorboard",))
        taken = kept.take(self.run_dir / "tensorboard", continue_from) if kept is not None and tensorboard else None
        if taken is not None:
            self._writer, self._flat = taken
        elif tensorboard and importlib.util.find_spec("tensorboard") is not None:
            if _utf8_name(self.run_dir):
                try:
                    from torch.utils.tensorboard import SummaryWriter
                except Exception as error:  # noqa: BLE001 (an installed tensorboard that cannot be imported: any error)
                    warnings.warn(f"TensorBoard is installed but cannot be imported ({type(error).__name__}: "
                                  f"{str(error).splitlines()[0] if str(error) else ''}): this run has no TensorBoard "
                                  "events (metrics.csv has its metrics); `rlspeed doctor` checks it.", stacklevel=2)
                else:
                    # (a continued run's events after its checkpoint's step are dropped, as its metrics.csv rows are:
                    # its writer marks a session start there, and TensorBoard's Python reader takes only a second
                    # start in a directory for a restart, so a new run's writer marks its own, at step 0)
                    self._flat = continue_from is not None and flat_tags(self.run_dir)
                    _quiet_tensorboard_threads()
                    try:  # (its first events are written at once: a full disk is said here)
                        with self._tensorboard_errors():
                            self._writer = _summary_writer(
                                SummaryWriter, self.run_dir / "tensorboard",
                                purge_step=0 if continue_from is None else continue_from + 1)
                            self._writer.flush()
                    except OSError as error:
                        reason = error.strerror or error
                        raise UserError(f"Cannot write '{_named(error.filename)}' ({reason}).") from None
            else:  # (TensorBoard encodes its file names as UTF-8, and failed on a directory named otherwise)
                warnings.warn(f"TensorBoard cannot write under '{self.run_dir}', {_why_not_utf8(self.run_dir)}: this "
                              "run has no TensorBoard events (metrics.csv has its metrics).", stacklevel=2)

    def _read_rows(self, up_to: int) -> None:
        """The rows of an existing metrics.csv at env steps <= `up_to` (numbers parsed back), in its columns. A last
        line without its line end (a power loss cut the file there) and a row whose cells do not match the header are
        damaged: dropped, and the file is then written whole again (an appended row would join the cut line)."""
        path = self.run_dir / "metrics.csv"
        if not path.is_file():
            return
        with open(path, newline="", encoding="utf-8", errors="replace") as handle:
            text = handle.read()
        whole = text[:text.rfind("\n") + 1]  # (complete lines only)
        dropped = whole != text
        # (a first reading keeps no row: a further learn() keeps every row, and appends to the file rather than write
        # it all again; only where some are dropped are the others held, for the next write)
        for keep in (False, True):
            reader = csv.DictReader(io.StringIO(whole, newline=""))
            self._fields = list(reader.fieldnames or [])
            for row in reader:
                if None in row or None in row.values():  # (more cells than the header, or fewer)
                    dropped = True
                    continue
                parsed = _parsed_row(row)
                if isinstance(parsed.get("timesteps"), (int, float)) and parsed["timesteps"] <= up_to:
                    self.last_row = parsed
                    if keep:
                        self._held.append(parsed)
                else:
                    dropped = True
            if self._fields and not dropped:
                self._held = None
                return

    @property
    def rows(self) -> list[dict]:
        """Every row of the run so far (numbers parsed back), read from metrics.csv where it holds them."""
        return list(self._each_row())

    def _each_row(self):
        """`rows`, one at a time (a days-long run's file is not held whole)."""
        if self._held is not None:
            yield from self._held
            return
        with open(self.run_dir / "metrics.csv", newline="", encoding="utf-8", errors="replace") as handle:
            yield from (_parsed_row(row) for row in csv.DictReader(handle))

    def log(self, row: dict) -> None:
        """Record one metrics row and send its numeric values to TensorBoard at step `row["timesteps"]`.

        The row is appended to `metrics.csv` at once; a new key becomes a new column (the file is rewritten).
        """
        self._check_directory()
        self.last_row = dict(row)
        keys = list(dict.fromkeys((*row, *self._columns)))
        # the declared columns keep their declared order among themselves, also where the first row lacks some (a
        # population's member that left before the first evaluation: its column came last, out of seed order)
        for slot, key in zip([i for i, key in enumerate(keys) if key in self._columns], self._columns):
            keys[slot] = key
        new_fields = [key for key in keys if key not in self._fields]
        self._fields.extend(new_fields)
        with self._writing():
            if new_fields or (self._csv is None and self._held is not None):
                self._rewrite_csv(new=self.last_row)
            else:
                if self._csv is None:
                    handle = open(self.run_dir / "metrics.csv", "a", newline="", encoding="utf-8")
                    self._csv = (handle, csv.DictWriter(handle, fieldnames=self._fields))
                handle, writer = self._csv
                writer.writerow(_csv_row(row))
                handle.flush()
            self._send_scalars(row, int(row["timesteps"]))

    def _check_directory(self, closing: bool = False) -> None:
        """A run writes only into the directory it started in (the same device and inode): UserError where it is gone
        or another is in its place (deleted, moved, its filesystem unmounted under the run), whose files would
        otherwise go on into a directory made anew at its path (on the local disk, under a mount point)."""
        if _identity(self.run_dir) == self._identity:
            return
        self._failed = True
        then = ("the run's metrics and plot are incomplete" if closing
                else "training stopped there, and nothing more is written at that path")
        raise UserError(f"The run directory '{self.run_dir}' is gone or another is in its place (deleted, moved, or "
                        f"its filesystem unmounted while the run trained): {then}.")

    @contextlib.contextmanager
    def _writing(self, closing: bool = False):
        """A write to the run directory that fails (a full disk, a directory made read-only) is one sentence, and
        `close` then only lets go of the files."""
        try:
            yield
        except OSError as error:
            self._failed = True
            where = _named(getattr(error, "filename", None) or self.run_dir / "metrics.csv")
            then = ("the run's metrics and plot are incomplete" if closing
                    else "training stopped there (its last checkpoint, if it wrote one, is kept)")
            raise UserError(f"Cannot write '{where}' ({error.strerror or error}): {then}.") from None

    def _send_scalars(self, values: dict, step: int) -> None:
        """`values`' finite numbers (but the step count) to TensorBoard at `step`, where it is installed."""
        if self._writer is None:
            return
        with self._tensorboard_errors():
            for key, value in values.items():
                if key != "timesteps" and isinstance(value, (int, float)) and math.isfinite(float(value)):
                    self._writer.add_scalar(key if self._flat else tensorboard_tag(key), value, step)

    @contextlib.contextmanager
    def _tensorboard_errors(self):
        """TensorBoard's writer thread that could not write (a full disk) raises its error here, at the next write or
        the flush: one without a file name (a failed flush) is TensorBoard's directory's, not metrics.csv's."""
        try:
            yield
        except OSError as error:
            if not error.filename:
                error.filename = str(self.run_dir / "tensorboard")
            raise

    def amend_last(self, values: dict, timesteps: int) -> None:
        """Add `values` to the last row logged (metrics.csv rewritten, TensorBoard at that row's step, one point per
        metric there: a value that replaces one the row had replaces its point); where none was logged yet, a new row
        at step `timesteps` (the model's step count)."""
        if self.last_row is None:
            self.log({"timesteps": timesteps, **values})
            return
        last = self.last_row
        # (TensorBoard gets only what is new to the row: a value it has already at that step would be a second
        # point there; where a value it has changes, the row's points are dropped and the whole row sent again:
        # TensorBoard drops a run's points from a step on for every series together, a session start event, never
        # for one series (its per-series purge is for event files older than version 2, which torch does not
        # write), so the row's other points go and come back, and TensorBoard's Python reader logs "Purging" for
        # them; only a changed value does this, not a new one)
        changed = {key: value for key, value in values.items() if key not in last or last[key] != value}
        replaced = any(key in last for key in changed)
        last.update(values)
        self._fields.extend(key for key in values if key not in self._fields)
        with self._writing():
            self._rewrite_csv(last=last)
            step = int(last["timesteps"])
            if replaced and self._writer is not None:
                self._drop_points_from(step)
            self._send_scalars(last if replaced else changed, step)

    def _drop_points_from(self, step: int) -> None:
        """Have TensorBoard's readers drop this run's points at `step` and after: a session start event at `step` (as a
        restarted run's writer writes at its purge_step), which TensorBoard's Python reader and its data server both
        take as the end of the points from that step on."""
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog

        with self._tensorboard_errors():
            self._writer.file_writer.add_event(Event(step=step, session_log=SessionLog(status=SessionLog.START)))

    def _rewrite_csv(self, new: dict | None = None, last: dict | None = None) -> None:
        """(Re)write `metrics.csv` with every row so far under the current columns, and keep it open to append: the
        rows it holds (as written), or the held ones, then `new`; `last` replaces the last row."""
        if self._csv is not None:
            self._csv[0].close()
        text = io.StringIO(newline="")  # (written whole, then renamed over the old file: a kill keeps the old rows)
        writer = csv.DictWriter(text, fieldnames=self._fields)
        writer.writeheader()
        with contextlib.ExitStack() as stack:
            if self._held is None:
                handle = stack.enter_context(open(self.run_dir / "metrics.csv", newline="", encoding="utf-8",
                                                  errors="replace"))
                rows = csv.DictReader(handle)  # (its cells as written)
            else:
                rows = map(_csv_row, self._held)
            previous = None
            for row in rows:
                if previous is not None:
                    writer.writerow(previous)
                previous = row
        if previous is not None:
            writer.writerow(previous if last is None else _csv_row(last))
        if new is not None:
            writer.writerow(_csv_row(new))
        write_atomic(self.run_dir / "metrics.csv", text.getvalue())
        self._held = None
        # (kept open to append rows)
        handle = open(self.run_dir / "metrics.csv", "a", newline="", encoding="utf-8")  # noqa: SIM115
        self._csv = (handle, csv.DictWriter(handle, fieldnames=self._fields))

    def close(self, plot: bool = True, keep_writer: bool = False) -> None:
        """Finish `metrics.csv` (every logged row, columns in first-seen order), close TensorBoard (or, with
        `keep_writer`, flush it and give it to the `KeptWriter` it came with, where a row was logged), save the plot
        (unless `plot` is False: the caller draws it later); after a failed write, only close the files."""
        if not self._failed:
            try:
                self._check_directory(closing=True)
            except UserError:
                self._let_go()
                raise
        if self._failed:
            self._let_go()
            return
        with self._writing(closing=True):
            if self._csv is None:
                self._rewrite_csv()  # a header-only file when nothing was logged
            self._csv[0].close()
            if self._writer is not None:
                with self._tensorboard_errors():
                    self._writer.flush()  # (raises what the writer thread could not write; close says nothing)
                    if keep_writer and self._kept is not None and self.last_row is not None:
                        self._kept.keep(self._writer, self.run_dir / "tensorboard", int(self.last_row["timesteps"]),
                                        self._flat)
                    else:
                        self._writer.close()
            if self._plot and plot:
                self.plot()

    def _let_go(self) -> None:
        """Close metrics.csv and TensorBoard's writer, writing nothing more (after a failed write)."""
        for handle in (self._csv[0] if self._csv is not None else None, self._writer):
            if handle is not None:
                with contextlib.suppress(OSError):
                    handle.close()

    def plot(self) -> None:
        """Save `learning_curve.png`: training episode return and evaluation mean against env steps."""
        path = self.run_dir / "learning_curve.png"
        fig = agg_figure(path, figsize=(6, 4))
        if fig is None:
            return
        ax = fig.add_subplot()
        curves: dict[str, list] = {"episode_return": [], "eval_mean": []}
        steps = 0
        for row in self._each_row():
            steps = max(steps, row.get("timesteps", 0) if isinstance(row.get("timesteps"), int) else 0)
            for key, points in curves.items():
                if isinstance(row.get(key), (int, float)) and not math.isnan(row[key]):
                    points.append((row["timesteps"], row[key]))
        for key, label in (("episode_return", "training episodes"), ("eval_mean", "evaluation (deterministic)")):
            points = curves[key]
            if points:
                ax.plot(*zip(*points), marker="o" if key == "eval_mean" else None, label=label)
        ax.set_xlabel("env steps")
        ax.set_ylabel("episode return")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend()
        else:  # (a continuing task's episodes never end, nor do a run's too short to finish one: not a blank plot)
            if steps:
                ax.set_xlim(0, steps)
            ax.text(0.5, 0.5, f"no training episode ended in {steps:,} steps", transform=ax.transAxes,
                    ha="center", va="center")
        fig.tight_layout()
        save_figure(fig, path)


def save_figure(fig, path: Path) -> None:
    """Save the matplotlib Figure `fig` at `path` (its format from the suffix) whole or not at all (`write_atomic`:
    a kill while it is written leaves the previous plot, not a truncated image that a finished run would keep). An
    OSError names `path`, not its temporary file (the message names the plot, not metrics.csv). A figure laid out by
    `tight_layout` is drawn once: the layout engine that call leaves in place only makes savefig draw it twice."""
    import matplotlib
    from matplotlib.layout_engine import PlaceHolderLayoutEngine

    if isinstance(fig.get_layout_engine(), PlaceHolderLayoutEngine):  # (the layout is done: no engine; the rc
        # settings would put theirs in place of None)
        with matplotlib.rc_context({"figure.autolayout": False, "figure.constrained_layout.use": False}):
            fig.set_layout_engine(None)
    image = io.BytesIO()
    fig.savefig(image, format=path.suffix[1:] or None, dpi=100)
    try:
        write_atomic(path, image.getvalue())
    except OSError as error:
        error.filename = str(path)
        raise


def _parsed_row(row: dict) -> dict:
    """A metrics.csv row as read by csv.DictReader, its numbers parsed back and its empty cells left out."""
    return {key: _parse(value) for key, value in row.items() if value != ""}


def _parse(text: str):
    """A metrics.csv cell as the number it was written from (int, float), else the text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text
