"""Weights & Biases tracking (rlspeed.tracking), offline (WANDB_MODE=offline, no network): `rlspeed train --track`
writes a wandb run with the config, the metrics rows, the videos and summary.json; without wandb, one sentence."""

from __future__ import annotations

import importlib.util
import json
import struct
import sys
import types
from pathlib import Path

import pytest

from rlspeed import PPO, UserError, cli

pytest.importorskip("wandb", reason='--track needs wandb: pip install "rlspeed[track]"')


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """wandb offline, its files under tmp_path/wandb-dir (WANDB_DIR), quiet."""
    directory = tmp_path / "wandb-dir"
    directory.mkdir()
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(directory))
    monkeypatch.setenv("WANDB_SILENT", "true")
    for name in ("WANDB_PROJECT", "WANDB_ENTITY", "WANDB_RUN_ID", "WANDB_NAME", "WANDB_RUN_GROUP", "WANDB_TAGS"):
        monkeypatch.delenv(name, raising=False)
    import wandb

    wandb.teardown()  # wandb reads its settings once per process: the next run reads these
    yield directory
    wandb.teardown()


def read_offline_run(directory: Path) -> dict:
    """The records of the one offline run under `directory`: {"history": [rows], "summary": {...}, "config": {...},
    "exit_code": the code it finished with (None: not finished)}.

    A `.wandb` file is a LevelDB-style log (a 7-byte file header, then 32 KiB blocks of records with a 7-byte header
    each: crc, length, type full/first/middle/last) of wandb's protobuf `Record`s."""
    import wandb
    from wandb.proto import wandb_internal_pb2 as pb

    wandb.teardown()  # the wandb service writes the file in the background: stopping it flushes it
    (path,) = directory.glob("wandb/offline-run-*/run-*.wandb")
    data, position, block = path.read_bytes(), 7, 32768
    chunks, pending = [], b""
    while position + 7 <= len(data):
        if block - position % block < 7:  # a block's tail too short for a header is padding
            position += block - position % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[position:position + 7])
        if kind == 0:
            break
        chunk = data[position + 7:position + 7 + length]
        position += 7 + length
        if kind in (1, 4):
            chunks.append(pending + chunk)
            pending = b""
        else:
            pending += chunk
    run = {"history": [], "summary": {}, "config": {}, "exit_code": None}
    for raw in chunks:
        record = pb.Record.FromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            run["history"].append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                                   for item in record.history.item})
        elif kind == "summary":
            run["summary"].update({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                                   for item in record.summary.update})
        elif kind == "run":
            run["config"].update({item.key: json.loads(item.value_json) for item in record.run.config.update})
        elif kind == "exit":
            run["exit_code"] = record.exit.exit_code
    return run, path.parent


def test_train_track_writes_an_offline_run_with_config_metrics_video_and_summary(tmp_path, offline):
    run_dir = tmp_path / "run"
    videos = bool(importlib.util.find_spec("imageio_ffmpeg") and importlib.util.find_spec("pygame"))
    code = cli.main(["train", "ppo", "CartPole-v1", "--env-backend", "torch", "--num-envs", "16", "--set",
                     "num_steps=32", "--total-timesteps", "2048", "--eval-freq", "1024", "--target-return", "1e9",
                     "--no-progress", "--out", str(run_dir), "--track", "--wandb-project", "rlspeed-tests"]
                    + (["--video-every", "1024"] if videos else []))
    assert code == 0
    run, run_path = read_offline_run(offline)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert run["summary"]["final_eval.mean"] == pytest.approx(summary["final_eval"]["mean"])
    assert run["summary"]["total_timesteps"] == summary["total_timesteps"] == 2048
    # the run summary is summary.json's, not the last metrics row's values of the same names
    assert run["summary"]["sps"] == pytest.approx(summary["sps"])
    assert run["summary"]["train_wall_s"] == pytest.approx(summary["train_wall_s"])
    assert run["config"]["algo"] == "ppo" and run["config"]["env_id"] == "CartPole-v1"
    rows = [row for row in run["history"] if "timesteps" in row]
    assert rows and rows[-1]["timesteps"] == 2048
    # (named as TensorBoard's tags: W&B groups its panels by the section before the slash)
    assert {"rollout/episode_return", "train/policy_loss", "time/sps"} <= set().union(*rows)
    assert [row["eval/eval_mean"] for row in rows if "eval/eval_mean" in row]  # learn's evaluations reach the run
    if videos:  # (--video-every asked for videos: the run directory's reach the W&B run)
        assert list((run_dir / "videos").glob("*.mp4"))
        assert list((run_path / "files" / "media" / "videos").rglob("*.mp4"))


def test_wandb_failing_to_finish_its_run_is_a_warning_not_the_commands_failure(tmp_path, offline, monkeypatch):
    """W&B raising as its run finishes (its service gone, a network error at upload) made a trained, saved run exit
    1 with a traceback (and, as a signal's handler finished it, lost the interrupted run's message): the command
    ends as its training did, with one warning."""
    import wandb

    def broken(self, *args, **kwargs):
        raise ConnectionError("wandb service went away")

    monkeypatch.setattr(wandb.sdk.wandb_run.Run, "finish", broken)
    run_dir = tmp_path / "run"
    with pytest.warns(RuntimeWarning, match=r"could not finish its run \(ConnectionError: wandb service went away"):
        code = cli.main(["train", "ppo", "CartPole-v1", "--env-backend", "torch", "--num-envs", "4", "--set",
                         "num_steps=16", "--set", "batch_size=64", "--total-timesteps", "128", "--no-progress", "--out",
                         str(run_dir), "--track"])
    assert code == 0
    assert json.loads((run_dir / "summary.json").read_text())["final_eval"] is not None


def test_wandb_callback_on_its_own_starts_and_finishes_a_run(tmp_path, offline):
    from rlspeed.tracking import WandbCallback

    model = PPO("CartPole-v1", seed=0, device="cpu", env_backend="torch", num_envs=16, num_steps=32)
    model.learn(1024, callback=WandbCallback(project="rlspeed-tests"), progress_bar=False, log_interval_s=0)
    run, _ = read_offline_run(offline)
    assert run["summary"]["total_timesteps"] == 1024
    assert [row["timesteps"] for row in run["history"]] == [512, 1024]  # one row per log interval
    assert run["config"]["algo"] == "ppo"


def test_values_recorded_in_the_last_iteration_reach_the_wandb_run_as_metrics_csv_has_them(tmp_path, offline):
    """A callback's `logger.record` in the last iteration joins the last row of metrics.csv when learn ends; the W&B
    run kept that row without them (an older value of the key, or none)."""
    import csv

    from rlspeed.callbacks import BaseCallback
    from rlspeed.tracking import WandbCallback

    class Count(BaseCallback):
        def _on_rollout_end(self):
            self.logger.record("custom/iterations", self.n_calls)

    model = PPO("CartPole-v1", seed=0, device="cpu", env_backend="torch", num_envs=4, num_steps=32, batch_size=128)
    model.learn(512, callback=[WandbCallback(project="rlspeed-tests"), Count()], progress_bar=False,
                log_interval_s=0, run_dir=tmp_path / "run")
    with open(tmp_path / "run" / "metrics.csv", newline="") as handle:
        last = list(csv.DictReader(handle))[-1]
    run, _ = read_offline_run(offline)
    assert float(last["custom/iterations"]) == 4
    assert [row["timesteps"] for row in run["history"]] == [128, 256, 384, 512]  # (its last row amended, not twice)
    assert run["history"][-1]["custom/iterations"] == 4


def test_a_wandb_callbacks_run_ends_as_failed_where_learn_raises(tmp_path, offline, monkeypatch):
    """A loop over seeds whose first learn raised: its W&B run was left open, and the next seed's WandbCallback logged
    into it (wandb.init returns the open run) and finished it as a success, under the first seed's config."""
    from rlspeed.tracking import WandbCallback

    def fails(local):
        raise RuntimeError("a bug in the user's callback")

    model = PPO("CartPole-v1", seed=0, device="cpu", env_backend="torch", num_envs=4, num_steps=32, batch_size=128)
    with pytest.raises(RuntimeError, match="a bug in the user's callback"):
        model.learn(512, callback=[WandbCallback(project="rlspeed-tests"), fails], progress_bar=False)
    failed, _ = read_offline_run(offline)
    assert failed["exit_code"] == 1 and failed["config"]["seed"] == 0
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "second"))
    (tmp_path / "second").mkdir()
    model = PPO("CartPole-v1", seed=1, device="cpu", env_backend="torch", num_envs=4, num_steps=32, batch_size=128)
    model.learn(512, callback=WandbCallback(project="rlspeed-tests"), progress_bar=False, log_interval_s=0)
    second, _ = read_offline_run(tmp_path / "second")
    assert second["exit_code"] == 0 and second["config"]["seed"] == 1
    assert [row["timesteps"] for row in second["history"]] == [128, 256, 384, 512]


def test_a_wandb_callbacks_run_ends_as_failed_where_learn_raises_a_close_error_after_training(offline):
    """An env's close() error during learn is raised once training is done, after the callbacks' end: the W&B run a
    WandbCallback began ended as a success (exit code 0) while learn raised (the CLI exits 1); it ends as failed, with
    its summary."""
    from rlspeed.callbacks import BaseCallback
    from rlspeed.envs.gymnasium_env import close_envs
    from rlspeed.errors import EnvStepError
    from rlspeed.tracking import WandbCallback

    def broken():
        raise OSError("device busy")

    class ClosesABrokenEnv(BaseCallback):
        def _on_rollout_end(self):
            close_envs(types.SimpleNamespace(close=broken), "Broken-v0")

    model = PPO("CartPole-v1", seed=0, device="cpu", env_backend="torch", num_envs=4, num_steps=32, batch_size=128)
    with pytest.raises(EnvStepError, match="device busy"):
        model.learn(128, callback=[WandbCallback(project="rlspeed-tests"), ClosesABrokenEnv()], progress_bar=False)
    run, _ = read_offline_run(offline)
    assert run["exit_code"] == 1 and run["summary"]["total_timesteps"] == 128


def test_a_signal_after_training_finishes_the_wandb_run_with_its_exit_code_and_the_summary(tmp_path, offline):
    """SIGTERM (or Ctrl-C) after training, before the final evaluation: summary.json was written and the command
    exited 143, while the W&B run ended with exit code 1 and none of summary.json's fields."""
    from test_cli import signalled_train

    done = signalled_train(tmp_path, "save", "SIGTERM", "--out", "run", "--track")
    assert done.returncode == 143 and "after training finished" in done.stderr, done.stderr
    run, _ = read_offline_run(offline)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert run["exit_code"] == 143 and run["summary"]["total_timesteps"] == summary["total_timesteps"] >= 128


def test_a_run_an_error_ends_finishes_its_wandb_run_as_the_command_ends(tmp_path, offline, train_crashing):
    """An env's error mid-run: the W&B run ended with exit code 1 and none of summary.json's fields, where
    summary.json holds the error; it now has them. (A UserError's run ends with the command's exit code 2.)"""
    done = train_crashing(300, "--track")
    assert done.returncode == 1, done.stderr
    run, _ = read_offline_run(offline)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert run["exit_code"] == 1 and run["summary"]["error"] == summary["error"] and "sensor cable" in summary["error"]


def test_a_tracker_for_the_same_run_directory_continues_its_wandb_run(tmp_path, offline):
    """`--resume --track` (or a restart) logs to the run's W&B run, not to a second one."""
    from rlspeed.tracking import WandbTracker

    first = WandbTracker({"algo": "ppo"}, run_dir=tmp_path / "run")
    run_id = first.run.id
    first.finish({"total_timesteps": 1})
    again = WandbTracker({"algo": "ppo"}, run_dir=tmp_path / "run")
    assert again.run.id == run_id
    again.finish()
    other = WandbTracker({"algo": "ppo"}, run_dir=tmp_path / "other")
    assert other.run.id != run_id
    other.finish()


@pytest.mark.skipif(sys.platform == "win32", reason="symlinks")
def test_a_run_id_symlink_in_a_run_directory_is_neither_read_nor_written_through(tmp_path, offline):
    """A run directory from elsewhere whose wandb/run-id was a symlink: `--resume --track` sent the first line of the
    file it pointed at to W&B as the run's id, or (a link to no file yet) made that file. Now the link is replaced by
    the run's own id file, and the file it pointed at is neither read nor made."""
    from rlspeed.tracking import WandbTracker

    secret, nowhere = tmp_path / "secret.txt", tmp_path / "made-elsewhere"
    secret.write_text("tokenvalue\n")
    for target in (secret, nowhere):
        run = tmp_path / f"run-{target.name}"
        (run / "wandb").mkdir(parents=True)
        (run / "wandb" / "run-id").symlink_to(target)
        with pytest.warns(UserWarning, match="is a symlink, which rlspeed does not follow .* starts a new W&B run"):
            tracker = WandbTracker({"algo": "ppo"}, run_dir=run)
        tracker.finish()
        assert tracker.run is None and not (run / "wandb" / "run-id").is_symlink()
        assert (run / "wandb" / "run-id").read_text().strip() not in ("", "tokenvalue")
    assert secret.read_text() == "tokenvalue\n" and not nowhere.exists()


def test_wandbs_environment_variables_name_group_and_tag_the_run(tmp_path, offline, monkeypatch):
    """WANDB_NAME (a job script's name for its run) was replaced by the run directory's name."""
    from rlspeed.tracking import WandbTracker

    monkeypatch.setenv("WANDB_NAME", "cartpole-lr3e-4")
    monkeypatch.setenv("WANDB_RUN_GROUP", "sweep-7")
    monkeypatch.setenv("WANDB_TAGS", "ppo,baseline")
    tracker = WandbTracker({"algo": "ppo"}, run_dir=tmp_path / "run")
    assert (tracker.run.name, tracker.run.group, set(tracker.run.tags)) == ("cartpole-lr3e-4", "sweep-7",
                                                                            {"ppo", "baseline"})
    tracker.finish()
    monkeypatch.delenv("WANDB_NAME")
    tracker = WandbTracker({"algo": "ppo"}, run_dir=tmp_path / "other")
    assert tracker.run.name == "other"  # (without WANDB_NAME: the run directory's name)
    tracker.finish()


def test_the_row_after_a_stop_between_log_points_reaches_the_wandb_run(tmp_path, offline):
    """A callback (or Ctrl-C) that stops training between two rows: the closing row metrics.csv gets reaches W&B too,
    and the run's summary names the callback that stopped it."""
    from rlspeed.tracking import WandbCallback

    model = PPO("CartPole-v1", seed=0, device="cpu", env_backend="torch", num_envs=4, num_steps=32)
    calls = []
    model.learn(128 * 10, callback=[WandbCallback(project="rlspeed-tests"), lambda local: calls.append(1)
                                    or len(calls) < 3], progress_bar=False, log_interval_s=1e9)
    run, _ = read_offline_run(offline)
    assert [row["timesteps"] for row in run["history"]] == [3 * 128]
    # (the run's summary says what stopped it, as model.result does)
    assert run["summary"]["stopped_by"] == model.result.stopped_by
    assert model.result.stopped_by.startswith("the callback function test_the_row_after_a_stop_between_log_points")


def test_track_without_wandb_is_one_sentence_before_training(tmp_path, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    code = cli.main(["train", "ppo", "CartPole-v1", "--total-timesteps", "512", "--out", str(tmp_path / "run"),
                     "--track", "--no-progress"])
    assert code == 2
    assert 'pip install "rlspeed[track]"' in capsys.readouterr().err
    assert not (tmp_path / "run" / "model.safetensors").exists()
    with pytest.raises(UserError, match="needs wandb, which is not installed"):
        from rlspeed.tracking import WandbTracker

        WandbTracker({})


def test_a_wandb_that_cannot_be_imported_is_one_sentence_before_training(tmp_path, monkeypatch, capsys):
    """An installed wandb whose import fails (a protobuf it does not fit) was a traceback and exit code 1."""
    broken = tmp_path / "site" / "wandb"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise TypeError('Descriptors cannot be created directly.')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "wandb", raising=False)
    code = cli.main(["train", "ppo", "CartPole-v1", "--total-timesteps", "512", "--out", str(tmp_path / "run"),
                     "--track", "--no-progress"])
    assert code == 2
    err = capsys.readouterr().err
    assert "wandb is installed but cannot be imported (TypeError: Descriptors cannot be created directly.)" in err
    assert "Traceback" not in err and not (tmp_path / "run" / "model.safetensors").exists()


def test_a_wandb_setting_wandb_refuses_is_one_sentence(offline, tmp_path, monkeypatch, capsys):
    """WANDB_MODE= (an empty variable) was a pydantic ValidationError traceback from wandb.init."""
    monkeypatch.setenv("WANDB_MODE", "")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "ppo", "CartPole-v1", "--total-timesteps", "256", "--no-progress", "--track",
                     "--out", "run"]) == 2
    assert "Weights & Biases refused its settings" in capsys.readouterr().err


def test_a_wandb_setting_wandb_refuses_is_said_without_a_urls_password(offline, monkeypatch):
    """wandb's settings check quotes the value it refuses: WANDB_BASE_URL's password was printed in the sentence."""
    from rlspeed.tracking import WandbTracker

    monkeypatch.setenv("WANDB_BASE_URL", "https://user:hunter2@bad host")
    with pytest.raises(UserError, match="Weights & Biases refused its settings") as raised:
        WandbTracker({})
    assert "hunter2" not in str(raised.value) and "user:***@bad host" in str(raised.value)


def test_a_project_name_wandb_refuses_names_the_flag_not_the_login(offline, tmp_path, monkeypatch, capsys):
    """`--wandb-project a/b` under WANDB_MODE=offline said to run `wandb login` or set WANDB_MODE=offline."""
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "ppo", "CartPole-v1", "--total-timesteps", "256", "--no-progress", "--track",
                     "--wandb-project", "a/b", "--out", "run"]) == 2
    err = capsys.readouterr().err
    assert "Invalid project name 'a/b'" in err and "give another --wandb-project" in err and "login" not in err
