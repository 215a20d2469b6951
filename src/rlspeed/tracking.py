"""Experiment tracking with Weights & Biases (`pip install "rlspeed[track]"`): the run's config, its metrics rows
(one per log interval, as metrics.csv has them), evaluation videos and summary.json.

wandb reads its own settings from the environment as usual: WANDB_PROJECT, WANDB_ENTITY, WANDB_NAME, WANDB_RUN_GROUP,
WANDB_TAGS, WANDB_MODE=offline (no network; `wandb sync` uploads later), WANDB_DIR. Without WANDB_DIR the wandb files
go into the run directory.
TensorBoard (metrics.csv's twin, when installed) is written either way.
"""

from __future__ import annotations

import importlib.util
import math
import os
from pathlib import Path

from rlspeed.callbacks import BaseCallback
from rlspeed.errors import CLOSE_ERRORS, UserError, first_line, warn_at_caller
from rlspeed.files import write_atomic

INSTALL = 'pip install "rlspeed[track]"'


def _flat(values: dict, prefix: str = "") -> dict:
    """Nested dicts as one level with dotted keys ({"final_eval": {"mean": 1}} -> {"final_eval.mean": 1})."""
    out = {}
    for key, value in values.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _wandb_fix(reason: str, otherwise: str = "run `wandb login`, or set WANDB_MODE=offline to log locally") -> str:
    """What to do about W&B's refusal `reason`: a bad project or entity name is the flag's (logging in changes
    nothing there)."""
    lowered = reason.lower()
    if "project" in lowered:
        return "give another --wandb-project (WandbTracker's project)"
    if "entity" in lowered:
        return "check --wandb-entity (WandbTracker's entity): a W&B user or team name"
    return otherwise


def _close_error_kept() -> bool:
    """Whether an env's close() error is kept in the open `CloseErrors` block, to be raised once the work is done."""
    kept = CLOSE_ERRORS.get()
    return kept is not None and bool(kept.errors)


class WandbTracker:
    """One Weights & Biases run: `log` metrics rows, `log_video` files, `finish` with the summary.

    `project` (default: WANDB_PROJECT, else "rlspeed"), `entity` (default: WANDB_ENTITY, else the account's),
    `name` (default: WANDB_NAME, else the run directory's name), `tags`: a list of W&B tags for the run,
    `config`: the run's resolved config. With `run_dir`,
    the W&B run's id is kept in `run_dir/wandb/run-id`, and a later tracker for the same directory (`--resume`, a
    restart) continues that W&B run instead of starting another (W&B keeps the steps it had: rows of steps a resume
    trains again after a crash are dropped by W&B, as its steps only increase).
    """

    def __init__(self, config: dict | None = None, run_dir: str | Path | None = None, project: str | None = None,
                 entity: str | None = None, name: str | None = None, tags: list[str] | None = None):
        if importlib.util.find_spec("wandb") is None:
            raise UserError(f"Tracking with Weights & Biases (--track) needs wandb, which is not installed: {INSTALL} "
                            "(or drop --track).")
        try:
            import wandb
        except Exception as error:  # noqa: BLE001 (an installed wandb whose import fails: a protobuf it does not fit)
            raise UserError(f"wandb is installed but cannot be imported ({type(error).__name__}: {first_line(error)}): "
                            f'pip install --force-reinstall "rlspeed[track]" (or drop --track).') from None

        self._wandb = wandb
        from rlspeed.tune import without_password

        # (read here at each run: wandb reads its environment once per process)
        directory = os.environ.get("WANDB_DIR") or (str(run_dir) if run_dir is not None else None)
        id_file = Path(run_dir) / "wandb" / "run-id" if run_dir is not None else None
        run_id = None
        # (never through a symlink, which a run directory from elsewhere may hold: the file it points at would be
        # sent to W&B as the run's id, or written over)
        if id_file is not None and id_file.is_symlink():
            warn_at_caller(f"'{id_file}' is a symlink, which rlspeed does not follow (a run directory from elsewhere "
                           "may point it at any file): this run starts a new W&B run rather than continue one.",
                           UserWarning)
        elif id_file is not None and id_file.is_file():
            run_id = id_file.read_text(encoding="utf-8").strip() or None
        from rlspeed.logging import flat_tags

        # (a continued run an earlier rlspeed began with metrics.csv's names keeps them: its curves stay whole)
        self._flat = run_id is not None and flat_tags(run_dir)
        # (wandb.init's name wins over WANDB_NAME, so the variable is read here)
        name = name or os.environ.get("WANDB_NAME") or (Path(run_dir).name if run_dir else None)
        try:
            self.run = wandb.init(project=project or os.environ.get("WANDB_PROJECT") or "rlspeed",
                                  entity=entity or None, name=name, config=config or {}, dir=directory, tags=tags,
                                  id=run_id, resume="allow" if run_id else None)
        except wandb.errors.Error as error:  # not logged in, no network, a bad entity: the fix is the user's
            reason = without_password(first_line(error))
            raise UserError(f"Weights & Biases refused the run ({reason}): {_wandb_fix(reason)}.") from None
        except ValueError as error:  # (wandb's settings check: WANDB_MODE= empty or misspelt, a bad WANDB_* value)
            # (pydantic's message quotes the value: a URL's password, WANDB_BASE_URL's, is not printed)
            reason = without_password(" ".join(str(error).strip().splitlines()[:3]).strip())
            fix = _wandb_fix(reason, "check the WANDB_* environment variables (WANDB_MODE is online, offline or "
                                     "disabled)")
            raise UserError(f"Weights & Biases refused its settings ({reason}): {fix}.") from None
        if id_file is not None and run_id is None:
            id_file.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(id_file, self.run.id + "\n")

    @property
    def run_path(self) -> Path:
        """The local directory of the wandb run (offline runs: where `wandb sync` finds it)."""
        return Path(self.run.dir).parent

    def log(self, row: dict) -> None:
        """One metrics row at env step `row["timesteps"]` (its finite numbers; NaN and text are left out), named as
        TensorBoard's tags are (`rlspeed.logging.tensorboard_tag`: `rollout/episode_return`), W&B's panel sections."""
        from rlspeed.logging import tensorboard_tag

        step = row.get("timesteps")
        values = {(key if self._flat else tensorboard_tag(key)): value for key, value in row.items()
                  if key != "timesteps" and isinstance(value, (int, float)) and not isinstance(value, bool)
                  and math.isfinite(value)}
        values["timesteps"] = step
        self.run.log(values, step=int(step) if step is not None else None)

    def log_video(self, path: str | Path, step: int) -> None:
        """An evaluation video file (mp4 or gif) at env step `step`."""
        fmt = Path(path).suffix.lstrip(".").lower()
        self.run.log({"eval/video": self._wandb.Video(str(path), format=fmt)}, step=int(step))

    def finish(self, summary: dict | None = None, exit_code: int = 0) -> None:
        """Record `summary` (summary.json's fields, nested ones as dotted keys) and close the run (once: later calls
        do nothing). A run finished as a success (`exit_code` 0) while an env's close() error is kept, to be raised
        once the work is saved (`rlspeed.errors.CloseErrors`: learn raises it after its callbacks' end, the CLI after
        its summary, and exits 1), ends as failed, exit code 1: as the command or the learn call ends."""
        if self.run is None:
            return
        if exit_code == 0 and _close_error_kept():
            exit_code = 1
        run, self.run = self.run, None
        try:
            if summary:
                run.log({}, commit=True)  # (the last row first: flushed at finish, it would overwrite the summary)
                run.summary.update({key: value for key, value in _flat(summary).items() if value is not None})
            run.finish(exit_code=exit_code)
        except Exception as error:  # noqa: BLE001 (the run's own files are written: W&B's failure is a warning)
            warn_at_caller(f"Weights & Biases could not finish its run ({type(error).__name__}: "
                           f"{first_line(error)}); rlspeed's own records of it (metrics.csv, summary.json) do not "
                           "depend on W&B.", RuntimeWarning)


class WandbCallback(BaseCallback):
    """Log each metrics row (one per log interval, no extra device reads) to a W&B run.

    With `tracker` given (the CLI's), the caller finishes it; otherwise this callback starts a run at training start
    (`project`, `entity`, `run_dir`; the config is the model's hyperparameters) and finishes it at training end with
    what `model.result` measured (with `stopped_by` where a callback stopped training), or as failed (exit code 1,
    130 for Ctrl-C) where learn raises: also where it raises an env's close() error once training is done, after
    its callbacks' end (`on_training_end` runs, the run gets its summary and ends with exit code 1).
    """

    def __init__(self, tracker: WandbTracker | None = None, project: str | None = None, entity: str | None = None,
                 run_dir: str | Path | None = None):
        super().__init__()
        self.tracker = tracker
        self._own = tracker is None
        self._settings = {"project": project, "entity": entity, "run_dir": run_dir}
        self._logged: dict | None = None  # the last row logged

    def _on_training_start(self) -> None:
        if self.tracker is None:
            import dataclasses

            model = self.model
            config = {"algo": model.name, "env_id": model.env_id, "seed": model.seed, "device": str(model.device),
                      "env_backend": model.env_backend, "hyperparameters": dataclasses.asdict(model.config)}
            self.tracker = WandbTracker(config, **self._settings)

    def _on_rollout_end(self) -> bool:
        if self.metrics is not None:
            self.tracker.log(self.metrics)
            self._logged = self.metrics
        return True

    def _on_training_end(self) -> None:
        if self.metrics is not None and self.metrics is not self._logged:
            self.tracker.log(self.metrics)  # (the row written after a stop between log points)
        if self._own and self.tracker is not None:
            result = self.model.result
            self.tracker.finish({"total_timesteps": result.total_timesteps, "train_wall_s": result.train_wall_s,
                                 "sps": result.sps, "time_to_target_s": result.time_to_target_s,
                                 "steps_to_target": result.steps_to_target, "stopped_by": result.stopped_by})
            self.tracker = None

    def _on_training_error(self, error: BaseException) -> None:
        if self._own and self.tracker is not None:  # (the run it began fails with learn: a later one is another run)
            self.tracker.finish(exit_code=130 if isinstance(error, KeyboardInterrupt) else 1)
            self.tracker = None
