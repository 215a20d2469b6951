"""Evaluation videos (rlspeed.video): files a reader opens with the right frame count and size, from the API,
`rlspeed eval --video` and `rlspeed train --video-every`; one clear sentence when something needed is missing."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
import yaml
from conftest import read_only_directory

from rlspeed import PPO, SAC, UserError, cli, video
from rlspeed.envs.gym_view import NativeGymEnv

pytest.importorskip("imageio", reason='videos need imageio: pip install "rlspeed[video]"')
pytest.importorskip("imageio_ffmpeg", reason='mp4 videos need imageio-ffmpeg: pip install "rlspeed[video]"')
pytest.importorskip("pygame", reason='classic-control frames need pygame: pip install "rlspeed[video]"')

import imageio.v2 as imageio  # noqa: E402


def _read(path) -> tuple[int, tuple[int, int]]:
    """(frames, (height, width)) of a video file, as a reader library sees it."""
    reader = imageio.get_reader(path)
    try:
        frames = [frame for frame in reader]
    finally:
        reader.close()
    return len(frames), frames[0].shape[:2]


def _cartpole() -> PPO:
    return PPO("CartPole-v1", seed=0, device="cpu", env_backend="torch", num_envs=16, num_steps=32)


def test_cartpole_video_has_one_frame_per_step_plus_the_first(tmp_path):
    model = _cartpole()
    model.learn(1024, progress_bar=False)
    result = video.record_video(model, tmp_path / "cartpole.mp4", episodes=2, seed=3)
    # CartPole pays 1 per step: the returns are the episodes' lengths
    assert result["frames"] == sum(int(r) for r in result["returns"]) + 2
    assert _read(tmp_path / "cartpole.mp4") == (result["frames"], (400, 600))


def test_pendulum_video_runs_to_the_time_limit(tmp_path):
    model = SAC("Pendulum-v1", seed=0, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (an episode that ends by itself is no warning, as `evaluate`'s cut one is)
        result = video.record_video(model, tmp_path / "pendulum.mp4", seed=0)
    assert result["frames"] == 201  # 200 steps (Pendulum's time limit) and the first frame
    assert _read(tmp_path / "pendulum.mp4") == (201, (500, 500))


def test_same_seed_gives_the_same_episode(tmp_path):
    model = _cartpole()
    first = video.record_video(model, tmp_path / "a.gif", seed=5, max_steps=30)
    second = video.record_video(model, tmp_path / "b.gif", seed=5, max_steps=30)
    assert first["returns"] == second["returns"] and first["frames"] == second["frames"] <= 31
    frames = [np.asarray(imageio.mimread(tmp_path / name)) for name in ("a.gif", "b.gif")]
    assert np.array_equal(*frames)


def test_a_gif_is_written_to_disk_frame_by_frame_and_reads_back_whole(tmp_path, monkeypatch):
    """imageio's GIF writer (Pillow's) held every frame in memory until the file was closed, about 1 MB a CartPole
    frame: `rlspeed eval --video x.gif` of a 10,000-step episode ran out of memory where an mp4 streams to disk. The
    GIF is on disk as it is filmed (the hidden file beside it holds most of the video before the last frame is drawn)
    and reads back with every frame."""
    sizes, frame = [], video._frame

    def filmed(env, env_id):  # (each frame is drawn after the previous one was given to the writer)
        sizes.extend(path.stat().st_size for path in tmp_path.glob(".many.gif.*"))
        return frame(env, env_id)

    monkeypatch.setattr(video, "_frame", filmed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the episode cut at max_steps: tested elsewhere)
        result = video.record_video(_cartpole(), tmp_path / "many.gif", seed=1, max_steps=12)
    assert _read(tmp_path / "many.gif")[0] == result["frames"] == len(sizes) == 13
    assert max(sizes) > (tmp_path / "many.gif").stat().st_size / 2, sizes



def test_a_gifs_frames_keep_their_own_colours_play_at_the_videos_speed_and_loop(tmp_path):
    """Each GIF frame has a palette of its own (a frame whose colours the first frame lacks shows them, not the first
    frame's nearest ones), shows for 1000 / fps ms, the GIF loops as Pillow's writer made it, and the file ends with
    the GIF trailer (a stricter reader refuses a file without it)."""
    from PIL import Image

    rows = np.arange(16, dtype=np.uint8)[:, None]
    frames = [np.full((16, 16, 3), (201, 17, 130), np.uint8),  # (no web-safe colour, and none of the next frames')
              np.stack([rows * 13 + 3, np.full_like(rows, 77), 250 - rows * 9], -1).repeat(16, 1),  # (16 colours)
              np.full((16, 16, 3), (12, 200, 99), np.uint8)]
    writer = video._GifWriter(tmp_path / "x.gif", fps=20)
    for frame in frames:
        writer.append_data(frame)
    writer.close()
    assert (tmp_path / "x.gif").read_bytes().endswith(b";")
    with Image.open(tmp_path / "x.gif") as image:
        assert image.n_frames == 3 and image.info["loop"] == 0
        for k, frame in enumerate(frames):
            image.seek(k)
            assert image.info["duration"] == 50
            assert np.array_equal(np.asarray(image.convert("RGB")), frame), k

def test_cli_eval_video(tmp_path, capsys):
    model = _cartpole()
    model.save(tmp_path / "model.safetensors")
    out = tmp_path / "eval.mp4"
    code = cli.main(["eval", str(tmp_path / "model.safetensors"), "--episodes", "2", "--seed", "1", "--video", str(out),
                     "--video-episodes", "1"])
    assert code == 0
    assert "wrote" in capsys.readouterr().out
    frames, size = _read(out)
    assert size == (400, 600) and frames >= 2


def test_cli_train_video_every_keeps_videos_in_the_run_directory(tmp_path):
    run = tmp_path / "run"
    argv = ["train", "ppo", "CartPole-v1", "--env-backend", "torch", "--num-envs", "16", "--set", "num_steps=32",
            "--set", "n_epochs=1", "--target-return", "none", "--no-progress", "--out", str(run), "--checkpoint-freq",
            "1024"]
    assert cli.main([*argv, "--total-timesteps", "2048", "--video-every", "1000"]) == 0
    # one video at the end of the first iteration (512 steps each) after every 1000 steps, named with the step
    # zero-padded (step-1024.mp4 sorted after step-10240.mp4)
    assert sorted(p.name for p in (run / "videos").iterdir()) == ["step-000001024.mp4", "step-000002048.mp4"]
    assert _read(run / "videos" / "step-000001024.mp4")[1] == (400, 600)
    # a --resume goes on filming at the run's interval, as it keeps its other settings (it filmed nothing)
    assert cli.main([*argv, "--total-timesteps", "3072", "--resume"]) == 0
    assert sorted(p.name for p in (run / "videos").iterdir())[-1] == "step-000003072.mp4"
    # (--video-every 0 stops it, as where this machine cannot record videos: the run's N would be taken again)
    assert cli.main([*argv, "--total-timesteps", "4096", "--resume", "--video-every", "0"]) == 0
    assert sorted(p.name for p in (run / "videos").iterdir())[-1] == "step-000003072.mp4"
    assert yaml.safe_load((run / "config.yaml").read_text())["video_every"] is None


def test_cli_train_says_where_video_every_filmed_nothing(tmp_path, capsys):
    """A run that ends before its first video was due (CartPole's preset reaches its target in about 6,000 steps,
    and the docs' example asked for a video every 20,000) says so, instead of a videos folder left empty unsaid."""
    run = tmp_path / "run"
    assert cli.main(["train", "ppo", "CartPole-v1", "--env-backend", "torch", "--num-envs", "16", "--set",
                     "num_steps=32", "--target-return", "none", "--no-progress", "--out", str(run),
                     "--total-timesteps", "512", "--video-every", "20000"]) == 0
    assert not any((run / "videos").iterdir())
    assert ("rlspeed: note: --video-every 20000 filmed no video: training ended at 512 steps, before the first was "
            "due at 20,000" in capsys.readouterr().err)


def _disk_fills_after(monkeypatch, frames: int) -> None:
    """imageio's writers fail as on a full disk once `frames` frames are written."""
    import errno

    real = imageio.get_writer

    class Filling:
        def __init__(self, *args, **kwargs):
            self.inner, self.written = real(*args, **kwargs), 0

        def append_data(self, frame):
            if self.written >= frames:
                raise OSError(errno.ENOSPC, "No space left on device")
            self.written += 1
            self.inner.append_data(frame)

        def close(self):
            self.inner.close()

    monkeypatch.setattr(imageio, "get_writer", Filling)


def test_a_full_disk_is_one_sentence_and_training_goes_on_without_its_video(tmp_path, monkeypatch, capsys):
    """A full disk while filming was an OSError traceback from the encoder (`rlspeed eval --video`), and stopped a
    `--video-every` training run; now: one sentence and no partial file, and training keeps going."""
    _disk_fills_after(monkeypatch, 3)
    with pytest.raises(video.VideoWriteError, match=r"x.mp4': No space left on device \(the partial file was removed"):
        video.record_video(_cartpole(), tmp_path / "x.mp4", seed=0)
    assert not (tmp_path / "x.mp4").exists()
    run = tmp_path / "run"
    with pytest.warns(RuntimeWarning, match=r"No space left on device \(the partial file was removed\)\. Training"):
        code = cli.main(["train", "ppo", "CartPole-v1", "--env-backend", "torch", "--num-envs", "16", "--set",
                         "num_steps=32", "--total-timesteps", "1024", "--target-return", "none", "--no-progress",
                         "--out", str(run), "--video-every", "512"])
    assert code == 0, capsys.readouterr().err
    assert (run / "model.safetensors").exists() and not list((run / "videos").iterdir())
    assert "filmed no video" not in capsys.readouterr().err  # (the videos were due: the warning said why none)


def test_a_directory_that_cannot_be_written_is_one_sentence_before_filming(tmp_path, monkeypatch, capsys):
    """`rlspeed eval --video v.gif` in a read-only directory evaluated, filmed, then ended in an OSError traceback
    (removing the partial GIF failed too: unlink says EROFS there); an .mp4 ended with ffmpeg's command line in the
    message. Now: one sentence before evaluating, from the API before filming."""
    model = _cartpole()
    model.save(tmp_path / "model.safetensors")
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    read_only_directory(monkeypatch, read_only)
    for name in ("v.gif", "v.mp4"):
        code = cli.main(["eval", str(tmp_path / "model.safetensors"), "--episodes", "1", "--no-progress", "--video",
                         str(read_only / name)])
        captured = capsys.readouterr()
        assert code == 2 and "cannot be written here" in captured.err and "Traceback" not in captured.err
        assert "deterministic" not in captured.out  # (refused before evaluating)
        with pytest.raises(UserError, match="cannot be written here"):
            video.record_video(model, read_only / name)
    assert not list(read_only.iterdir())


def test_missing_imageio_is_one_sentence_with_the_fix(tmp_path, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "imageio" else real(name, *a))
    with pytest.raises(UserError, match=r"rlspeed\[video\]"):
        video.record_video(_cartpole(), tmp_path / "x.mp4")
    code = cli.main(["train", "ppo", "CartPole-v1", "--total-timesteps", "512", "--out", str(tmp_path / "run"),
                     "--video-every", "256", "--no-progress"])
    assert code == 2 and "rlspeed[video]" in capsys.readouterr().err
    assert not (tmp_path / "run" / "model.safetensors").exists()  # refused before training


def test_a_gif_needs_pillow_not_imageio(tmp_path, monkeypatch):
    """A GIF is Pillow's to write (`_GifWriter`): without imageio (Pillow comes with matplotlib) it was refused as
    'Recording videos needs imageio'; now it is written, an mp4 still names imageio, and a GIF without Pillow names
    Pillow."""
    import sys

    from PIL import Image

    for hidden in ("imageio", "imageio.v2", "imageio_ffmpeg"):
        monkeypatch.setitem(sys.modules, hidden, None)  # (import raises ImportError, find_spec gives None)
    result = video.record_video(_cartpole(), tmp_path / "x.gif", seed=1, max_steps=5)
    with Image.open(tmp_path / "x.gif") as image:
        assert (image.n_frames, image.size) == (result["frames"], (600, 400)) and result["frames"] == 6
    with pytest.raises(UserError, match=r"^Recording mp4 videos needs imageio, imageio-ffmpeg, which are not "
                                        r"installed: pip install \"rlspeed\[video\]\"\.$"):
        video.record_video(_cartpole(), tmp_path / "x.mp4")
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(UserError, match=r"^Recording gif videos needs Pillow, which is not installed"):
        video.record_video(_cartpole(), tmp_path / "y.gif")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["x.gif"]


def test_missing_pygame_is_one_sentence_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setattr(NativeGymEnv, "metadata", {"render_modes": [], "render_fps": 30})
    with pytest.raises(UserError, match=r"rlspeed\[video\]"):
        video.record_video(_cartpole(), tmp_path / "x.mp4")


class _Blind(gym.Env):
    """An env without render modes."""

    observation_space = gym.spaces.Box(-1, 1, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)
    metadata = {"render_modes": []}

    def __init__(self, render_mode=None):
        self.render_mode = render_mode


class _NoRenderMode(gym.Env):
    """A hand-written env whose constructor takes no render_mode."""

    observation_space = gym.spaces.Box(-1, 1, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, size=6):
        self.size = size


def test_env_that_cannot_render_and_bad_file_names_are_refused(tmp_path):
    gym.register("rlspeed-test/Blind-v0", entry_point=_Blind, disable_env_checker=True)
    gym.register("rlspeed-test/NoRenderMode-v0", entry_point=_NoRenderMode, disable_env_checker=True)
    try:
        with pytest.raises(UserError, match="cannot render"):
            video.check_video_support("rlspeed-test/Blind-v0")
        with pytest.raises(UserError, match="its constructor takes no render_mode"):  # (a TypeError in gym.make)
            video.check_video_support("rlspeed-test/NoRenderMode-v0")
        with pytest.raises(UserError, match="could not be made for a video: .*unexpected keyword argument 'sise'"):
            video.check_video_support("rlspeed-test/Blind-v0", env_kwargs={"sise": 3})
        # (a run's own render_mode option gives way to the video's: it clashed and blamed the constructor)
        video.check_video_support("CartPole-v1", env_kwargs={"render_mode": "human"})
    finally:
        del gym.registry["rlspeed-test/Blind-v0"], gym.registry["rlspeed-test/NoRenderMode-v0"]
    with pytest.raises(UserError, match=r"\.mp4 or \.gif"):
        video.record_video(_cartpole(), tmp_path / "x.avi")
    with pytest.raises(UserError, match="does not exist"):
        video.record_video(_cartpole(), tmp_path / "missing" / "x.mp4")


@pytest.mark.parametrize("arguments, words", [
    # (pathlib's TypeError, a comparison of str and int, range()'s TypeError, imageio's division, a string taken for
    # True)
    (dict(path=None), r"record_video's path is a path \(a str or pathlib.Path\), not None"),
    (dict(episodes="2"), "record_video's episodes must be a whole number >= 1, got '2'"),
    (dict(episodes=1.5), "record_video's episodes must be a whole number >= 1, got 1.5"),
    (dict(max_steps=0), "record_video's max_steps must be a whole number >= 1, got 0"),
    (dict(fps="30"), "record_video's fps is a number of frames per second above 0"),
    (dict(seed=-1), "A seed is a whole number"),
    (dict(deterministic="no"), r"record_video\(deterministic=...\) is True or False, got 'no'"),
    (dict(overwrite="no"), r"record_video\(overwrite=...\) is True or False, got 'no'"),
    (dict(model="runs/ppo"), r"record_video takes a model, not a path \('runs/ppo'\): load it first"),
])
def test_record_video_refuses_bad_arguments_in_one_sentence(arguments, words, tmp_path):
    given = {"model": _cartpole(), "path": tmp_path / "v.gif", **arguments}
    with pytest.raises(UserError, match=words):
        video.record_video(**given)
    assert not list(tmp_path.iterdir())


def test_a_model_of_a_vector_env_one_built_is_filmed_on_an_id_given_not_said_unrenderable(tmp_path):
    """A model trained on a vector env of one's own has no id a video can make its env from: the refusal says so and
    how to film it (it said the env 'cannot render frames', as if its renderer were missing); with env_id given it
    films that env."""
    vector_env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync",
                              wrappers=[lambda env: gym.wrappers.TimeLimit(env, 30)],
                              vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
    model = PPO(vector_env, seed=0, device="cpu", num_steps=16, batch_size=32)
    assert model.env_id == "user-vector-env"
    with pytest.raises(UserError, match=r"trained on a vector env you built \('user-vector-env'\), which a video "
                                        r"cannot make again from an id: .*record_video\(model, path, env_id=ID\)"):
        video.record_video(model, tmp_path / "x.gif")
    assert not (tmp_path / "x.gif").exists()
    assert video.record_video(model, tmp_path / "x.gif", env_id="CartPole-v1", max_steps=5)["frames"] == 6


def test_a_model_of_an_observation_vec_normalize_is_not_filmed_on_raw_observations(tmp_path):
    """A model trained on an SB3 VecNormalize that normalises observations acts on normalised ones, whose statistics
    it does not hold: a video on an env made from an id showed it raw observations, silently (evaluate refuses an id
    for it); it is refused in one sentence. One whose VecNormalize normalised only rewards is filmed."""
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    for norm_obs in (True, False):
        model = PPO(VecNormalize(make_vec_env("Pendulum-v1", n_envs=2, seed=0), norm_obs=norm_obs), device="cpu",
                    seed=0, num_steps=16, batch_size=32)
        path = tmp_path / f"{norm_obs}.gif"
        if norm_obs:
            with pytest.raises(UserError, match="trains on a Stable-Baselines3 VecNormalize that normalises"):
                video.record_video(model, path, env_id="Pendulum-v1", max_steps=3)
            assert not path.exists()
        else:
            assert video.record_video(model, path, env_id="Pendulum-v1", max_steps=3)["frames"] == 4


@pytest.mark.skipif(importlib.util.find_spec("ale_py") is None, reason="Atari needs ale-py")
def test_an_atari_policy_is_filmed_in_the_games_frames_with_fire_to_start(tmp_path):
    """An Atari model acts on its preprocessed frame stacks while the video shows the game's RGB frames at the game's
    speed; a game that waits for FIRE gets it first, as evaluation gives it (a policy that never fires would film a
    ball never served). It failed: the raw env's (210, 160, 3) observations against the model's (4, 84, 84)."""
    model = PPO("BreakoutNoFrameskip-v4", seed=0, device="cpu", env_backend="gymnasium", num_envs=2, num_steps=16,
                batch_size=32)
    model.predict = lambda obs, **kwargs: (np.zeros((), dtype=np.int64), None)  # NOOP, always
    result = video.record_video(model, tmp_path / "breakout.gif", seed=0, max_steps=40)
    assert result["frames"] == 41 and result["size"] == (210, 160) and result["fps"] == 15
    # the ball was served and moves; without FIRE every frame is the same (the GIF writer keeps one of them)
    frames = imageio.mimread(tmp_path / "breakout.gif")
    assert len(frames) > 1 and not np.array_equal(frames[0], frames[-1])


@pytest.mark.parametrize("before", [None, "offscreen"], ids=["unset", "set"])
def test_a_headless_video_leaves_sdl_videodriver_as_it_was(tmp_path, monkeypatch, before):
    """Without a display, a video is drawn with pygame's dummy driver for the call only: SDL_VIDEODRIVER is as it was
    afterwards (unset stays unset), and a driver the user chose is used as it is."""
    for name in ("DISPLAY", "WAYLAND_DISPLAY", "SDL_VIDEODRIVER", "SDL_NO_SIGNAL_HANDLERS"):
        monkeypatch.delenv(name, raising=False)
    if before is not None:
        monkeypatch.setenv("SDL_VIDEODRIVER", before)
    render_env, seen = video._render_env, []

    def render_env_and_record(*args, **kwargs):
        seen.append((os.environ.get("SDL_VIDEODRIVER"), os.environ.get("SDL_NO_SIGNAL_HANDLERS")))
        return render_env(*args, **kwargs)

    monkeypatch.setattr(video, "_render_env", render_env_and_record)
    video.record_video(_cartpole(), tmp_path / "cartpole.gif", seed=0, max_steps=5)
    video.check_video_support("CartPole-v1", tmp_path / "cartpole.gif")
    assert seen == [(before or "dummy", "1")] * 2  # (SDL leaves SIGTERM to Python: see _headless_rendering)
    assert os.environ.get("SDL_VIDEODRIVER") == before and "SDL_NO_SIGNAL_HANDLERS" not in os.environ


def test_stochastic_video_repeats_with_its_seed_and_leaves_torch_generators_alone(tmp_path):
    model = _cartpole()
    before = torch.get_rng_state()
    # (mp4, not GIF: the returns are what is compared, and GIF's palette quantisation took 7x as long a video)
    runs = [video.record_video(model, tmp_path / f"{name}.mp4", episodes=3, seed=5, max_steps=60,
                               deterministic=False) for name in ("a", "b")]
    assert torch.equal(torch.get_rng_state(), before)  # (training after the video draws what it would have)
    assert runs[0]["returns"] == runs[1]["returns"]
    greedy = video.record_video(model, tmp_path / "c.mp4", episodes=3, seed=5, max_steps=60)
    assert greedy["returns"] != runs[0]["returns"]  # (it sampled: the untrained policy's samples differ from its mode)


def test_masked_policy_is_filmed_with_the_envs_masks(tmp_path):
    model = PPO("Taxi-v4", seed=0, num_envs=2, num_steps=16, batch_size=32)
    assert model.config.use_masking
    seen, predict = [], model.predict

    def recording(obs, *args, action_masks=None, **kwargs):
        action, state = predict(obs, *args, action_masks=action_masks, **kwargs)
        seen.append((action_masks, action))
        return action, state

    model.predict = recording
    video.record_video(model, tmp_path / "taxi.gif", seed=0, max_steps=20, deterministic=False)
    assert len(seen) == 20
    assert all(mask is not None and mask[int(action)] for mask, action in seen)


class _OnlySouth(gym.Wrapper):
    """Taxi whose action_masks() method (sb3-contrib's ActionMasker convention) allows moving south only, while its
    info["action_mask"] stays Taxi's own."""

    def action_masks(self):
        return np.array([True, False, False, False, False, False])


def test_a_masked_policy_is_filmed_with_the_envs_action_masks_method(tmp_path):
    gym.register("rlspeed-test/TaxiOnlySouth-v0", max_episode_steps=200,
                 entry_point=lambda **kwargs: _OnlySouth(gym.make("Taxi-v4", **kwargs)))
    try:
        model = PPO("rlspeed-test/TaxiOnlySouth-v0", seed=0, num_envs=2, num_steps=16, batch_size=32)
        model.learn(32, progress_bar=False)
        actions, predict = [], model.predict
        model.predict = lambda obs, **kwargs: actions.append(predict(obs, **kwargs)[0]) or (actions[-1], None)
        video.record_video(model, tmp_path / "taxi.gif", seed=0, max_steps=10, deterministic=False)
    finally:
        del gym.registry["rlspeed-test/TaxiOnlySouth-v0"]
    assert len(actions) == 10 and all(int(action) == 0 for action in actions)


def test_an_mp4_the_encoder_could_not_finish_is_no_video(tmp_path, monkeypatch):
    """ffmpeg that cannot write its trailer (a full disk) says so on stderr and exits non-zero, which imageio-ffmpeg
    does not check: a file without its index was reported written (exit 0). It is refused and removed now."""
    path = tmp_path / "whole.mp4"
    video.record_video(_cartpole(), path, seed=0)
    assert video._complete_mp4(path)
    data = path.read_bytes()
    index = data.index(b"moov") - 4
    (tmp_path / "cut.mp4").write_bytes(data[:index])  # (what a full disk leaves: the frames, no index)
    assert not video._complete_mp4(tmp_path / "cut.mp4")
    (tmp_path / "short.mp4").write_bytes(data[:-100])
    assert not video._complete_mp4(tmp_path / "short.mp4")
    real_writer = imageio.get_writer

    class Truncating:  # (the encoder's close "succeeds" and leaves the file without its index)
        def __init__(self, target, **options):
            self.target, self.inner = target, real_writer(target, **options)

        def append_data(self, frame):
            self.inner.append_data(frame)

        def close(self):
            self.inner.close()
            with open(self.target, "r+b") as handle:
                handle.truncate(handle.read().index(b"moov") - 4)

    monkeypatch.setattr(imageio, "get_writer", Truncating)
    with pytest.raises(video.VideoWriteError, match=r"the encoder could not finish the file .*partial file was"):
        video.record_video(_cartpole(), tmp_path / "x.mp4", seed=0)
    assert not (tmp_path / "x.mp4").exists()


def test_frames_an_env_draws_small_or_as_floats_are_filmed_as_uint8(tmp_path):
    """MinAtar draws 10 x 10 float frames: a 10-pixel video with a lossy-conversion warning per frame before."""
    class Small:
        def render(self):
            return np.full((10, 10, 3), 0.5)

    frame = video._frame(Small(), "Small-v0")
    assert frame.dtype == np.uint8 and frame.shape == (160, 160, 3) and int(frame[0, 0, 0]) == 128


def test_a_renderer_that_fails_is_one_sentence_with_the_mujoco_hint():
    class NoOpenGL:
        def render(self):
            raise RuntimeError("an OpenGL platform library has not been loaded into this process")

    with pytest.raises(UserError, match=r"'HalfCheetah-v5' cannot render frames here \(RuntimeError: an OpenGL .*"
                                        r"set MUJOCO_GL=egl"):
        video._rendered(NoOpenGL(), "HalfCheetah-v5")


def test_a_video_env_of_other_actions_and_a_callback_without_episodes_are_refused(tmp_path):
    """record_video on an env made with other options than the model's (Discrete LunarLander filmed on the continuous
    one) failed with an IndexError inside the policy; VideoRecorderCallback(episodes=0) was taken and stopped training
    at its first video."""
    pytest.importorskip("Box2D")
    from rlspeed.callbacks import VideoRecorderCallback

    model = PPO("LunarLander-v3", seed=0, device="cpu", num_envs=2, num_steps=16)
    with pytest.raises(UserError, match=r"'LunarLander-v3' gives actions other than this model trained on"):
        video.record_video(model, tmp_path / "x.gif", seed=1, env_kwargs={"continuous": True})
    with pytest.raises(UserError, match="at least one episode per video, got episodes=0"):
        VideoRecorderCallback(300, tmp_path, episodes=0)
    assert VideoRecorderCallback(300, tmp_path, episodes=np.int64(2), fps=np.int64(30)).episodes == 2


def test_an_episode_cut_at_max_steps_is_said_as_evaluate_says_it(tmp_path):
    """record_video(max_steps=...) ended an episode silently, where `evaluate` warns that it cut one; an episode
    that ends by itself (Pendulum's time limit) is no warning: test_pendulum_video_runs_to_the_time_limit."""
    model = _cartpole()
    with pytest.warns(UserWarning, match=r"record_video: 2 of 2 episodes were still running after 5 steps; .*pass "
                                         r"max_steps= to run longer") as caught:
        result = video.record_video(model, tmp_path / "cut.gif", episodes=2, seed=0, max_steps=5)
    assert result["frames"] == 12 and caught[0].filename == __file__  # (the caller's line, as evaluate's)


def test_a_gif_on_a_full_disk_is_one_sentence_without_tracebacks_after_it(tmp_path, monkeypatch):
    """Pillow writes a GIF's frames when the writer closes: on a full disk the one sentence was followed by two
    "Exception ignored in ... __del__" tracebacks, imageio's writers trying the frames again when collected."""
    import errno
    import gc
    import sys

    write = video._GifWriter._write

    def full_disk(self, data):
        write(self, b"GIF89a")  # (a start, then no space)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(video._GifWriter, "_write", full_disk)
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)  # (where `__del__`'s errors are printed)
    model = _cartpole()
    with pytest.raises(video.VideoWriteError, match=r"x.gif': No space left on device \(the partial file was removed"):
        video.record_video(model, tmp_path / "x.gif", seed=0, max_steps=20)
    gc.collect()  # (the writer, left with the exception's frames)
    assert [f"{hook.exc_type.__name__} in {hook.object}" for hook in unraisable] == []
    assert not (tmp_path / "x.gif").exists()


def test_an_existing_video_file_is_replaced_only_when_asked(tmp_path, capsys):
    """A video file that existed was overwritten without a word (`record_video`, `rlspeed eval --video`, and a
    `VideoRecorderCallback` folder holding another run's videos). Now the API and the CLI refuse it in one sentence
    that names the way out (overwrite=True, --overwrite), and the callback writes beside it with a warning."""
    from rlspeed.callbacks import VideoRecorderCallback

    model = _cartpole()
    mine = tmp_path / "mine.gif"
    mine.write_bytes(b"the user's own")
    with pytest.raises(UserError, match=r"mine.gif' exists: pass overwrite=True to replace it, or give another file"):
        video.record_video(model, mine, seed=0, max_steps=5)
    assert mine.read_bytes() == b"the user's own"
    model.save(tmp_path / "model.safetensors")
    command = ["eval", str(tmp_path / "model.safetensors"), "--episodes", "1", "--seed", "1", "--no-progress",
               "--video", str(mine)]
    assert cli.main(command) == 2
    err = capsys.readouterr().err
    assert "mine.gif' exists: pass --overwrite to replace it, or give another --video FILE." in err
    assert len(err.strip().splitlines()) == 1 and mine.read_bytes() == b"the user's own"
    assert cli.main(command + ["--overwrite"]) == 0
    assert imageio.mimread(mine) and "wrote" in capsys.readouterr().out
    assert cli.main(command[:-2] + ["--overwrite"]) == 2
    assert "--overwrite (replace an existing --video file) applies only with --video" in capsys.readouterr().err
    # the callback: another run's step-000000512.mp4 in the folder is kept; this run's video goes beside it
    folder = tmp_path / "videos"
    folder.mkdir()
    (folder / "step-000000512.mp4").write_bytes(b"another run's")
    callback = VideoRecorderCallback(512, folder)
    with pytest.warns(RuntimeWarning, match=r"step-000000512.mp4' exists and is kept: this video is "
                                            r"'step-000000512-1.mp4' beside it"):
        _cartpole().learn(512, callback=callback, progress_bar=False)
    assert (folder / "step-000000512.mp4").read_bytes() == b"another run's"
    assert callback.videos == [folder / "step-000000512-1.mp4"] and _read(callback.videos[0])[1] == (400, 600)
    # overwrite=True (rlspeed train's, in the run's own folder: a resumed run films those steps again) replaces it
    callback = VideoRecorderCallback(512, folder, overwrite=True)
    _cartpole().learn(512, callback=callback, progress_bar=False)
    assert callback.videos == [folder / "step-000000512.mp4"] and _read(callback.videos[0])[1] == (400, 600)


def test_a_directory_given_as_the_video_file_is_refused_before_filming(tmp_path, capsys):
    """`rlspeed eval --video DIR` said "exists: pass --overwrite to replace it"; with --overwrite it evaluated the
    episodes and then failed to write ("Is a directory"). Now a directory is refused first, --overwrite or not."""
    model = _cartpole()
    model.save(tmp_path / "model.safetensors")
    folder = tmp_path / "films.mp4"
    folder.mkdir()
    command = ["eval", str(tmp_path / "model.safetensors"), "--episodes", "1", "--no-progress", "--video", str(folder)]
    for overwrite in ([], ["--overwrite"]):
        assert cli.main(command + overwrite) == 2
        captured = capsys.readouterr()
        assert captured.err == (f"rlspeed: error: --video '{folder}' is a directory: give the video file to write, "
                                f"ending in .mp4 or .gif (e.g. '{folder / 'episode.mp4'}').\n")
        assert captured.out == ""  # (no episode evaluated)
    with pytest.raises(UserError, match=r"record_video's path '.*films.mp4' is a directory"):
        video.record_video(model, folder, seed=0, max_steps=5, overwrite=True)
    assert list(folder.iterdir()) == []


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes")
def test_a_pipe_given_as_the_video_file_is_refused_before_filming(tmp_path, capsys, monkeypatch):
    """docs/troubleshooting.md: a device or a pipe given as `--video` is refused, --overwrite or not (the video,
    written beside it and renamed over it, would replace it), before any episode is evaluated; and as
    `record_video`'s path, which filmed every episode before refusing it."""
    import stat

    model = _cartpole()
    model.save(tmp_path / "model.safetensors")
    pipe = tmp_path / "film.mp4"
    os.mkfifo(pipe)
    assert cli.main(["eval", str(tmp_path / "model.safetensors"), "--episodes", "1", "--no-progress", "--video",
                     str(pipe), "--overwrite"]) == 2
    captured = capsys.readouterr()
    assert captured.err == (f"rlspeed: error: --video '{pipe}' is a device or a pipe, which a file written there would "
                            "replace: give a path to a regular file.\n")
    assert captured.out == "" and stat.S_ISFIFO(os.lstat(pipe).st_mode)
    monkeypatch.setattr(video, "_render_env", lambda *args: pytest.fail("filmed before the path was refused"))
    with pytest.raises(UserError, match=r"^record_video's path '.*film\.mp4' is a device or a pipe, which a file "
                                        r"written there would replace: give a path to a regular file\.$"):
        video.record_video(model, pipe, seed=0, max_steps=5, overwrite=True)
    assert stat.S_ISFIFO(os.lstat(pipe).st_mode)


@pytest.mark.skipif(not hasattr(os, "symlink") or os.name == "nt", reason="symlinks")
def test_a_video_overwritten_in_a_run_folder_replaces_a_symlink_there_rather_than_writing_through_it(tmp_path):
    """`rlspeed train --resume` films again into the run's videos/ with overwrite (and keeps the run's --video-every
    from its config.yaml): a run directory from elsewhere holding `videos/step-000000512.mp4 -> ~/somefile` had that
    file truncated and written with the video. Now the link is replaced, and the file it pointed at stays as it was."""
    from rlspeed.callbacks import VideoRecorderCallback

    theirs = tmp_path / "precious.txt"
    theirs.write_text("the user's own")
    folder = tmp_path / "videos"
    folder.mkdir()
    (folder / "step-000000512.mp4").symlink_to(theirs)
    callback = VideoRecorderCallback(512, folder, overwrite=True)
    _cartpole().learn(512, callback=callback, progress_bar=False)
    assert theirs.read_text() == "the user's own"
    assert not (folder / "step-000000512.mp4").is_symlink() and _read(folder / "step-000000512.mp4")[1] == (400, 600)


def _interrupt_at_the_fifth_action(model, monkeypatch) -> None:
    """`model.predict` raises KeyboardInterrupt (a notebook's stop button) at its fifth call."""
    calls = []

    def interrupted(*args, **kwargs):
        calls.append(None)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return PPO.predict(model, *args, **kwargs)

    monkeypatch.setattr(model, "predict", interrupted)


@pytest.mark.parametrize("name", ["cut.mp4", "cut.gif"])
def test_a_video_cut_short_by_an_interrupt_leaves_no_file_and_can_be_made_again(tmp_path, monkeypatch, name):
    """A notebook's stop button (KeyboardInterrupt) during `record_video` left the half-made file behind (a broken
    mp4 when the interrupt landed in a frame's write, ffmpeg being killed), and running the same cell again was
    refused ("exists: pass overwrite=True"). Now an interrupted or failed recording leaves no file."""
    model = _cartpole()
    _interrupt_at_the_fifth_action(model, monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        video.record_video(model, tmp_path / name, seed=0, max_steps=20)
    assert not (tmp_path / name).exists()
    monkeypatch.undo()
    with pytest.warns(UserWarning, match="still running after 20 steps"):  # (the same call again: no refusal)
        video.record_video(model, tmp_path / name, seed=0, max_steps=20)
    assert _read(tmp_path / name)[1] == (400, 600)


@pytest.mark.parametrize("name", ["kill.mp4", "kill.gif"])
def test_a_video_takes_its_name_only_once_whole(tmp_path, monkeypatch, name):
    """A video was written at its final name frame by frame: a kill, a power loss or a crash mid-write (SIGKILL: no
    handler runs) left a cut file with that name, which a player or W&B took for the video. Now it is written to a
    hidden file beside it that is renamed once whole: while filming, nothing is at the name; the video then has a
    plain write's mode, and what a killed recording of that name left (its process gone) is removed."""
    import subprocess
    import sys

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = tmp_path / f".{name}.{int(gone.stdout)}.abcd1234{os.path.splitext(name)[1]}"
    left.write_bytes(b"what a killed recording left")
    model, path, seen = _cartpole(), tmp_path / name, []

    def watched(*args, **kwargs):
        seen.append((path.exists(), sorted(p.name for p in tmp_path.iterdir() if p != left)))
        return PPO.predict(model, *args, **kwargs)

    monkeypatch.setattr(model, "predict", watched)
    with pytest.warns(UserWarning, match="still running after 10 steps"):
        video.record_video(model, path, seed=0, max_steps=10)
    assert seen and not any(exists for exists, _ in seen)
    assert all(len(names) == 1 and names[0].startswith(f".{name}.{os.getpid()}.") for _, names in seen)
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask
    assert _read(path)[1] == (400, 600)


def test_a_video_overwritten_keeps_the_old_one_until_the_new_one_is_whole(tmp_path, monkeypatch):
    """overwrite=True (rlspeed train --resume films the run's videos again) truncated the old video as filming
    began: a failure or an interrupt then lost it with the new one. Now the old video stays until the new one
    takes its place."""
    model, path = _cartpole(), tmp_path / "step-000000512.mp4"
    with pytest.warns(UserWarning, match="still running after 10 steps"):
        video.record_video(model, path, seed=0, max_steps=10)
    before = path.read_bytes()
    _interrupt_at_the_fifth_action(model, monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        video.record_video(model, path, seed=1, max_steps=20, overwrite=True)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [path.name]


class _Sized(gym.Env):
    """An env whose constructor needs an option (`size`: its episodes' length, and its frames' side / 64)."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(self, size, render_mode=None):
        self.size, self.render_mode, self.t = size, render_mode, 0
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(2, np.float32), 1.0, self.t >= self.size, False, {}

    def render(self):
        return np.zeros((64 * self.size, 64 * self.size, 3), np.uint8)


class _GreyFrames(_Sized):
    """`_Sized` whose render() returns a grey float frame (height, width), no RGB one."""

    def render(self):
        return np.zeros((64, 64), np.float64)


@pytest.mark.parametrize("metadata, entry_point, said", [
    ({}, _Sized, r"\(its render modes: none\): list 'rgb_array' in its metadata\['render_modes'\] and"),
    (None, _GreyFrames, r"rendered no RGB frame \(got an array of shape \(64, 64\) and dtype float64\), so it "
                        r"cannot be recorded: list 'rgb_array'")])
def test_an_env_without_rgb_frames_is_told_what_a_video_needs(tmp_path, monkeypatch, metadata, entry_point, said):
    """`--video-every` on an env of the user's without render modes said only "its render modes: none", and one
    whose render() returned a grey float frame "got ndarray": neither said what the env needs. Both say it now."""
    monkeypatch.setitem(gym.registry, "rlspeed-test/Frames-v0",
                        gym.envs.registration.EnvSpec("rlspeed-test/Frames-v0", entry_point=entry_point,
                                                      disable_env_checker=True, max_episode_steps=2))
    if metadata is not None:
        monkeypatch.setattr(entry_point, "metadata", metadata)
    with pytest.raises(UserError, match=said) as raised:
        video.check_video_support("rlspeed-test/Frames-v0", tmp_path / "v.mp4", env_kwargs={"size": 1})
    assert "a uint8 array (height, width, 3)" in str(raised.value)


class _CloseRaisingFrames(_Sized):
    """`_Sized` whose close() raises once it has stepped."""

    def step(self, action):
        self.stepped = True
        return super().step(action)

    def close(self):
        if getattr(self, "stepped", False):
            raise RuntimeError("the simulator's socket is gone")


def test_a_video_of_an_env_whose_close_raises_is_kept_and_the_error_is_one_line(tmp_path, monkeypatch):
    """An env whose close() raised after filming failed record_video with the env's raw RuntimeError (a traceback
    from `rlspeed train --video-every`). The video is written, and the error names the env and close() in one line
    (an EnvStepError, as the other envs rlspeed closes say it)."""
    from rlspeed.errors import EnvStepError

    monkeypatch.setitem(gym.registry, "rlspeed-test/CloseRaisingFrames-v0",
                        gym.envs.registration.EnvSpec("rlspeed-test/CloseRaisingFrames-v0",
                                                      entry_point=_CloseRaisingFrames, disable_env_checker=True,
                                                      max_episode_steps=3, kwargs={"size": 1}))
    model = PPO("rlspeed-test/CloseRaisingFrames-v0", seed=0, device="cpu", env_backend="gymnasium", num_envs=1)
    with pytest.raises(EnvStepError, match=r"'rlspeed-test/CloseRaisingFrames-v0' \(gymnasium backend\) raised "
                                           r"RuntimeError in close\(\): the simulator's socket is gone"):
        video.record_video(model, tmp_path / "v.gif", seed=0)
    assert (tmp_path / "v.gif").stat().st_size > 0


class _CloseFails(gym.Wrapper):
    """An env whose close() raises (a simulator whose socket is gone)."""

    def close(self):
        super().close()
        raise RuntimeError("the simulator's socket is gone")


class _FramelessCloseFails(_Sized):
    """`_Sized` without the rgb_array render mode, whose close() raises."""

    metadata = {"render_modes": []}

    def close(self):
        raise RuntimeError("the simulator's socket is gone")


@pytest.mark.parametrize("refused, said", [
    ("no frames", r"^'rlspeed-test/Frameless-v0' cannot render frames for a video \(its render modes: none\)"),
    ("other spaces", r"^'CartPole-v1' gives observations and actions other than this model"),
    ("space check", r"^the space check's own refusal$"),
    ("no writer", r"^Cannot write a video to '.*v\.mp4': no ffmpeg here\.$")])
def test_a_refusal_before_filming_is_not_replaced_by_the_envs_close_error(tmp_path, monkeypatch, refused, said):
    """record_video closed its env unguarded where it refused to film (an env without RGB frames or of other spaces,
    a space check that failed, no video writer): an env whose close() raised replaced the refusal with its
    RuntimeError. The refusal is what the user sees now."""
    import rlspeed.evaluation

    model = _cartpole()
    frameless = "rlspeed-test/Frameless-v0"
    monkeypatch.setitem(gym.registry, frameless, gym.envs.registration.EnvSpec(
        frameless, entry_point=_FramelessCloseFails, disable_env_checker=True, kwargs={"size": 1}))
    made = gym.make("Pendulum-v1" if refused == "other spaces" else "CartPole-v1", render_mode="rgb_array")
    if refused != "no frames":
        monkeypatch.setattr(video, "_render_env", lambda *args: _CloseFails(made))
    if refused == "space check":
        def failing(*args):
            raise UserError("the space check's own refusal")

        monkeypatch.setattr(rlspeed.evaluation, "space_mismatch", failing)
    if refused == "no writer":
        def no_writer(*args, **kwargs):
            raise RuntimeError("no ffmpeg here")

        monkeypatch.setattr(imageio, "get_writer", no_writer)
    with pytest.raises(UserError, match=said):
        video.record_video(model, tmp_path / "v.mp4", seed=0, env_id=frameless if refused == "no frames" else None)
    assert not list(tmp_path.iterdir())


def test_sigterm_stops_rlspeed_eval_video_and_leaves_no_partial_file(tmp_path):
    """A SIGTERM (a scheduler's, `timeout`'s) while `rlspeed eval --video` films: SDL, started by pygame's renderer,
    took SIGTERM and dropped it, so the command filmed on until a SIGKILL, which left the broken partial video. Now it
    stops as Ctrl-C does: exit code 143, one line, no file."""
    import signal
    import subprocess
    import sys
    import time

    _cartpole().save(tmp_path / "model.safetensors")
    out = tmp_path / "eval.mp4"
    env = {key: value for key, value in os.environ.items() if key != "SDL_NO_SIGNAL_HANDLERS"}
    process = subprocess.Popen([sys.executable, "-m", "rlspeed", "eval", str(tmp_path / "model.safetensors"),
                                "--episodes", "1", "--video", str(out), "--video-episodes", "100000"], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120

        def filming() -> bool:  # (frames reached the file the video is written to before it takes its name)
            return any(path.stat().st_size for path in tmp_path.glob(".eval.mp4.*.mp4"))

        while not filming() and time.time() < deadline and process.poll() is None:
            time.sleep(0.2)
        assert filming(), process.stderr.read() if process.poll() is not None else "no video after 120 s"
        assert not out.exists()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 143
    finally:
        process.kill()
    # (ffmpeg, which shares the command's stderr, ends quietly: a stop comes between frames)
    assert process.stderr.read().strip().splitlines()[-1] == "rlspeed: interrupted (SIGTERM)"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model.safetensors"]


class _Stopped(Exception):
    """What `_stopped_inside_each_write`'s SIGTERM handler raises."""


@contextlib.contextmanager
def _stopped_inside_each_write():
    """A SIGTERM handler that raises `_Stopped` within the block (the one from before it back after), and a video
    writer that gets SIGTERM inside each frame's write, as imageio's write to ffmpeg's pipe does; its `written` lists
    the frames whose write ended."""
    import signal

    def stop(number, frame):
        raise _Stopped

    class Writer:
        def __init__(self):
            self.written = []

        def append_data(self, frame):
            signal.raise_signal(signal.SIGTERM)
            self.written.append(frame)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield Writer()
        assert signal.getsignal(signal.SIGTERM) is stop
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_stop_during_a_frames_write_comes_once_the_frame_is_written():
    """A Ctrl-C or SIGTERM inside a frame's write to ffmpeg left part of a frame in its input; ffmpeg, killed as it
    began to complain of it, left a line open, and `rlspeed eval --video`'s last line read "[in#0/rawvideo @ 0x...]
    rlspeed: interrupted (SIGTERM)". The stop comes once the frame is written now, as the handler raises it."""
    from rlspeed.video import _append, _writes_whole

    with _stopped_inside_each_write() as writer, _writes_whole() as write, pytest.raises(_Stopped):
        _append(writer, "frame", write)
    assert writer.written == ["frame"]


def test_in_a_recording_a_stop_waits_for_a_frames_write_only():
    """`record_video` sets its handlers once a recording (`_writes_whole`), not twice a frame: a stop inside a frame's
    write still comes once the frame is written, and one between writes (an env's step that never returns) still
    comes at once, to the handler from before the recording, which is back after it."""
    import signal

    from rlspeed.video import _append, _writes_whole

    stepped = []
    with _stopped_inside_each_write() as writer:
        with _writes_whole() as write:
            with pytest.raises(_Stopped):
                _append(writer, "frame", write)
            assert writer.written == ["frame"]
            with pytest.raises(_Stopped):  # (an env's step)
                signal.raise_signal(signal.SIGTERM)
                stepped.append("step")
            with pytest.raises(_Stopped):
                _append(writer, "frame", write)
    assert writer.written == ["frame", "frame"] and stepped == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the stop ends the process it comes to: filmed in a fork")
def test_a_stop_whose_handler_is_the_default_comes_once_the_frame_is_written_too():
    """A script (no `rlspeed` command's handlers) that films with `record_video` and gets SIGTERM from `timeout` or a
    scheduler: the signal's default action ended the process inside a frame's write, leaving part of a frame in
    ffmpeg's input. It ends the process as before, once the frame is written."""
    import signal

    from rlspeed.video import _append, _writes_whole

    reading, writing = os.pipe()
    child = os.fork()
    if child == 0:  # (nothing but the write and os._exit here: a fork of the test's process)
        try:
            os.close(reading)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)

            class Writer:
                def append_data(self, frame):
                    os.kill(os.getpid(), signal.SIGTERM)
                    os.write(writing, frame)

            with _writes_whole() as write:
                _append(Writer(), b"frame", write)
        finally:
            os._exit(3)
    os.close(writing)
    with os.fdopen(reading, "rb") as pipe:
        written = pipe.read()
    _, status = os.waitpid(child, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM
    assert written == b"frame"


def test_a_video_callback_checks_the_env_made_with_the_models_options(tmp_path, monkeypatch):
    """VideoRecorderCallback checked the env made from its bare id before training, so an env whose constructor
    needs an option the model was made with (`env_kwargs`, `--env-kwargs`) was refused ("missing 1 required
    positional argument"), though its videos, made with those options, film it."""
    from rlspeed.callbacks import VideoRecorderCallback

    monkeypatch.setitem(gym.registry, "rlspeed-test/Sized-v0",
                        gym.envs.registration.EnvSpec("rlspeed-test/Sized-v0", entry_point=_Sized,
                                                      disable_env_checker=True))
    model = PPO("rlspeed-test/Sized-v0", env_kwargs={"size": 3}, seed=0, device="cpu", num_envs=2, num_steps=8,
                batch_size=16)
    callback = VideoRecorderCallback(16, tmp_path / "videos")
    model.learn(16, callback=callback, progress_bar=False)
    model.close()
    assert [path.name for path in callback.videos] == ["step-000000016.mp4"]
    assert _read(callback.videos[0]) == (4, (192, 192))  # (3 steps and the first frame, at the option's size)


def test_envs_wrapped_in_record_video_keep_their_id(tmp_path):
    """A model trained on envs one films with Gymnasium's RecordVideo (or SB3's VecVideoRecorder) kept no id: it was
    'user-vector-env', so `evaluate(model)`, `record_video(model, path)` and `rlspeed eval` refused it, though these
    wrappers only record, as RecordEpisodeStatistics (which keeps the id) does. The user's videos are still written."""
    import functools

    pytest.importorskip("moviepy", reason="Gymnasium's RecordVideo needs moviepy")
    same_step = gym.vector.AutoresetMode.SAME_STEP

    def filmed():
        return gym.wrappers.RecordVideo(gym.make("CartPole-v1", render_mode="rgb_array"), str(tmp_path / "mine"),
                                        episode_trigger=lambda episode: episode == 0, disable_logger=True)

    vector_env = gym.vector.SyncVectorEnv([filmed], autoreset_mode=same_step)
    model = PPO(vector_env, seed=0, device="cpu", num_steps=32, batch_size=32)
    assert model.env_id == "CartPole-v1"
    model.learn(64, progress_bar=False)
    vector_env.close()
    assert [path.name for path in (tmp_path / "mine").iterdir()] == ["rl-video-episode-0.mp4"]
    assert model.evaluate(episodes=1, seed=0)["episodes"] == 1
    with pytest.warns(UserWarning, match="still running after 3 steps"):
        assert video.record_video(model, tmp_path / "x.gif", seed=0, max_steps=3)["frames"] == 4
    # (gym.make_vec's wrappers=, where RecordVideo comes as a partial with its folder; Gymnasium's vector RecordVideo)
    partial = functools.partial(gym.wrappers.RecordVideo, video_folder=str(tmp_path / "each"), disable_logger=True)
    made = gym.make_vec("CartPole-v1", 1, vectorization_mode="sync", render_mode="rgb_array", wrappers=[partial],
                        vector_kwargs={"autoreset_mode": same_step})
    assert PPO(made, seed=0, device="cpu", num_steps=32, batch_size=32).env_id == "CartPole-v1"
    made.close()
    with warnings.catch_warnings():  # (Gymnasium's: its videos of same-step envs lack the episodes' last frames)
        warnings.simplefilter("ignore", UserWarning)
        whole = gym.wrappers.vector.RecordVideo(
            gym.make_vec("CartPole-v1", 2, vectorization_mode="sync", render_mode="rgb_array",
                         vector_kwargs={"autoreset_mode": same_step}), str(tmp_path / "whole"))
    assert PPO(whole, seed=0, device="cpu", num_steps=32, batch_size=64).env_id == "CartPole-v1"
    whole.close()
    sb3 = pytest.importorskip("stable_baselines3.common.vec_env")
    recorder = sb3.VecVideoRecorder(sb3.DummyVecEnv([lambda: gym.make("CartPole-v1", render_mode="rgb_array")]),
                                    str(tmp_path / "sb3"), record_video_trigger=lambda step: step == 0)
    assert PPO(recorder, seed=0, device="cpu", num_steps=32, batch_size=32).env_id == "CartPole-v1"
    recorder.close()



def test_a_native_models_video_films_the_episodes_its_evaluation_of_the_seed_plays(tmp_path):
    """A model of a native env is filmed on its Gymnasium view: each episode was reset with seed + i, so only the
    first was an episode `evaluate` (and `rlspeed eval --seed S --video`) played with that seed (its episode i is row
    i of a native env seeded with S), and the view's float64 states were not the float32 ones evaluated. Episode i of
    the video is now the evaluation's episode i, as on Gymnasium's envs."""
    from rlspeed import make_env

    model = PPO("Pendulum-v1", seed=0, device="cpu", env_backend="torch", num_envs=4, num_steps=16, batch_size=64)
    with pytest.warns(UserWarning, match="still running after 5 steps"):  # (Pendulum's 5 first steps are enough)
        evaluated = model.evaluate(episodes=4, seed=21, max_steps=5)
    with pytest.warns(UserWarning, match="still running after 5 steps"):
        filmed = video.record_video(model, tmp_path / "x.mp4", episodes=4, seed=21, max_steps=5)
    assert filmed["returns"] == pytest.approx(evaluated["returns"], rel=1e-5)
    # (the view named as the env is a Gymnasium env like any other: evaluated on Gymnasium's vector env, seed + i)
    with pytest.warns(UserWarning, match="still running after 5 steps"):
        evaluated = model.evaluate(episodes=2, seed=21, max_steps=5, env_id="rlspeed/Pendulum-v1")
    with pytest.warns(UserWarning, match="still running after 5 steps"):
        filmed = video.record_video(model, tmp_path / "y.mp4", episodes=2, seed=21, max_steps=5,
                                    env_id="rlspeed/Pendulum-v1")
    assert filmed["returns"] == pytest.approx(evaluated["returns"], rel=1e-5)
    # (the view's row option: the first observation of each row of a native env of that seed)
    rows = make_env("CartPole-v1", num_envs=3, seed=21, backend="torch", device="cpu").reset()[0].numpy()
    view = gym.make("rlspeed/CartPole-v1", state_dtype="float32")
    assert np.array_equal(np.stack([view.reset(seed=21, options={"row": i})[0] for i in range(3)]), rows)
    view.close()


@pytest.mark.parametrize("trained_on, evaluated_on", [("gymnasium", "torch"), ("torch", "gymnasium")])
def test_cli_eval_video_films_the_episodes_evaluated_on_the_backend_asked(tmp_path, capsys, trained_on, evaluated_on):
    """`rlspeed eval --env-backend B --seed S --video` evaluated on B but filmed on the backend the model trained
    with, so the video's episodes (and the mean return its line gives) were other than the evaluated ones."""
    import json

    model = PPO("CartPole-v1", seed=0, device="cpu", env_backend=trained_on, num_envs=2, num_steps=16, batch_size=32)
    model.save(tmp_path / "model.safetensors")
    model.close()
    code = cli.main(["eval", str(tmp_path / "model.safetensors"), "--env-backend", evaluated_on, "--episodes", "2",
                     "--seed", "4", "--json", "--no-progress", "--video", str(tmp_path / "x.mp4"), "--video-episodes",
                     "2"])
    out, err = capsys.readouterr()
    assert code == 0
    evaluated = json.loads(out)["returns"]
    assert f", {2 + sum(int(r) for r in evaluated)} frames, mean return" in err  # (CartPole: a return is a length)
    with pytest.raises(UserError, match="backend='tensor' is not one of"):
        video.record_video(model, tmp_path / "y.mp4", backend="tensor")


def test_record_video_on_backend_auto_films_what_evaluate_on_auto_plays(tmp_path):
    """`record_video(model, path, seed=S, backend="auto")` of a model trained on Gymnasium's envs filmed the native
    env's view (its rows' episodes), while `evaluate` on "auto" (the model's own env) plays Gymnasium's: the filmed
    returns were not the evaluated ones. "auto" is the model's own backend, as for evaluate."""
    model = PPO("Pendulum-v1", seed=0, device="cpu", env_backend="gymnasium", num_envs=2, num_steps=16, batch_size=32)
    with pytest.warns(UserWarning, match="still running after 5 steps"):  # (Pendulum's 5 first steps are enough)
        evaluated = model.evaluate(episodes=2, seed=21, max_steps=5)
    with pytest.warns(UserWarning, match="still running after 5 steps"):
        filmed = video.record_video(model, tmp_path / "x.mp4", episodes=2, seed=21, max_steps=5, backend="auto")
    assert filmed["returns"] == pytest.approx(evaluated["returns"], rel=1e-5)


def test_a_video_callback_films_the_env_id_given_for_a_model_of_a_vector_env_one_built(tmp_path):
    """The refusal of a video of a model trained on a vector env of one's own says to film a registered env with its
    spaces (env_id=ID), which VideoRecorderCallback did not take: training with videos was refused before it began."""
    from rlspeed.callbacks import VideoRecorderCallback

    vector_env = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync",
                              wrappers=[lambda env: gym.wrappers.TimeLimit(env, 30)],
                              vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
    model = PPO(vector_env, seed=0, device="cpu", num_steps=16, batch_size=32)
    with pytest.raises(UserError, match=r"VideoRecorderCallback\(\.\.\., env_id=ID\)"):
        model.learn(32, callback=VideoRecorderCallback(32, tmp_path / "refused"), progress_bar=False)
    callback = VideoRecorderCallback(32, tmp_path / "videos", env_id="CartPole-v1")
    model.learn(32, callback=callback, progress_bar=False)
    vector_env.close()
    assert [path.name for path in callback.videos] == ["step-000000032.mp4"]


def test_a_population_refuses_video_every_saying_how_to_film_a_member(tmp_path, capsys):
    """`--video-every` with `--seeds` was refused with "drop it" alone: a member is filmed after training."""
    code = cli.main(["train", "ppo", "CartPole-v1", "--seeds", "0-1", "--video-every", "512", "--out",
                     str(tmp_path / "run"), "--no-progress"])
    assert code == 2
    assert "drop it (film a member after training: rlspeed eval OUT/members/seed_<S>.safetensors --video" in \
        capsys.readouterr().err


class _SaysItsOwn(_Sized):
    """`_Sized` whose filmed instance (render_mode rgb_array) warns as it is made and as it steps: warnings of the
    user's env."""

    def __init__(self, size, render_mode=None):
        super().__init__(size, render_mode)
        if render_mode == "rgb_array":
            warnings.warn("rlspeed-test: made for a video", UserWarning, stacklevel=2)

    def step(self, action):
        if self.render_mode == "rgb_array":
            warnings.warn("rlspeed-test: a filmed step", UserWarning, stacklevel=2)
        return super().step(action)


def test_a_videos_env_keeps_its_own_warnings_and_only_the_render_mode_notice_is_left_out(tmp_path, monkeypatch):
    """Filming ignored every UserWarning while the env was made (and VideoRecorderCallback while the whole video
    was recorded), so the user's env's own warnings vanished; only Gymnasium's notice of a render mode the env lacks
    (which the refusal says) and a video's episode cut at its step limit are left out."""
    from rlspeed.callbacks import VideoRecorderCallback

    monkeypatch.setitem(gym.registry, "rlspeed-test/Says-v0",
                        gym.envs.registration.EnvSpec("rlspeed-test/Says-v0", entry_point=_SaysItsOwn,
                                                      disable_env_checker=True, max_episode_steps=2))
    model = PPO("rlspeed-test/Says-v0", env_kwargs={"size": 3}, seed=0, device="cpu", num_envs=2, num_steps=8,
                batch_size=16)
    callback = VideoRecorderCallback(16, tmp_path / "videos")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.learn(16, callback=callback, progress_bar=False)
    model.close()
    said = [str(warning.message) for warning in caught]
    assert "rlspeed-test: made for a video" in said and "rlspeed-test: a filmed step" in said, said
    assert not [text for text in said if "still running" in text], said  # (the cut episode: still a video)
    assert [path.name for path in callback.videos] == ["step-000000016.mp4"]

    monkeypatch.setattr(_Sized, "metadata", {"render_modes": ["human"]})  # (Gymnasium's notice: the refusal says it)
    with warnings.catch_warnings(), pytest.raises(UserError, match="its render modes: human"):
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message="rlspeed-test: ")
        video.check_video_support("rlspeed-test/Says-v0", tmp_path / "v.mp4", env_kwargs={"size": 3})


class _GLFWError(UserWarning):
    """GLFW's warning class (glfw.GLFWError), as MuJoCo's default OpenGL platform gives its errors."""

    __module__ = "glfw"


class _NoDisplay(_Sized):
    """`_Sized` whose renderer fails as MuJoCo's does through GLFW on a machine without a display: GLFW's error given
    as a warning, then the renderer's own error."""

    def render(self):
        warnings.warn("(65550) b'X11: The DISPLAY environment variable is missing'", _GLFWError, stacklevel=2)
        raise RuntimeError("an OpenGL platform library has not been loaded into this process")


def test_a_renderer_whose_glfw_warning_is_raised_under_python_w_error_names_the_fix(tmp_path, monkeypatch):
    """Under `python -W error` GLFW's warning that no display exists was raised inside MuJoCo's context set-up: the
    sentence named it without the fix it gives MuJoCo's own error (MUJOCO_GL=egl)."""
    monkeypatch.setitem(gym.registry, "rlspeed-test/NoDisplay-v0",
                        gym.envs.registration.EnvSpec("rlspeed-test/NoDisplay-v0", entry_point=_NoDisplay,
                                                      disable_env_checker=True))
    for error in (True, False):
        with warnings.catch_warnings(), pytest.raises(UserError, match=r"cannot render frames here \(.*\); on a "
                                                                       r"machine without a display, set MUJOCO_GL=egl"):
            warnings.simplefilter("error" if error else "ignore")
            video.check_video_support("rlspeed-test/NoDisplay-v0", tmp_path / "v.mp4", env_kwargs={"size": 1})


class _WarnsEachFrame(_Sized):
    def render(self):
        warnings.warn("rlspeed-test: a frame drawn", UserWarning, stacklevel=2)
        return super().render()


def test_an_envs_warning_at_every_frame_is_shown_once_as_python_shows_it(tmp_path, monkeypatch):
    """Python shows a warning once per place it is raised from ("default"); a filter set around every frame's render
    would make it forget, and show the env's warning at every frame of a video."""
    monkeypatch.setitem(gym.registry, "rlspeed-test/EachFrame-v0",
                        gym.envs.registration.EnvSpec("rlspeed-test/EachFrame-v0", entry_point=_WarnsEachFrame,
                                                      disable_env_checker=True))
    model = PPO("rlspeed-test/EachFrame-v0", env_kwargs={"size": 6}, seed=0, device="cpu", num_envs=2, num_steps=8,
                batch_size=16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        assert video.record_video(model, tmp_path / "v.gif", episodes=2, seed=0)["frames"] == 14
    model.close()
    assert [str(warning.message) for warning in caught].count("rlspeed-test: a frame drawn") == 1


def test_cli_eval_videos_line_says_the_filmed_episodes_cut_short_at_the_step_limit(tmp_path, capsys, monkeypatch):
    """`rlspeed eval --video`'s "wrote" line says how many filmed episodes were still running at the step limit (they
    count with the return collected by then), as the evaluation's line says it of the evaluated ones."""
    from conftest import endless_pendulum_id

    import rlspeed.evaluation

    monkeypatch.setattr(rlspeed.evaluation, "UNLIMITED_EPISODE_STEPS", 5)  # (10,000 steps: the same, slower)
    model = PPO(endless_pendulum_id(), seed=0, device="cpu", num_envs=1, num_steps=8, batch_size=8)
    model.save(tmp_path / "model.safetensors")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = cli.main(["eval", str(tmp_path / "model.safetensors"), "--episodes", "1", "--seed", "1", "--no-progress",
                         "--video", str(tmp_path / "x.gif")])
    wrote = [line for line in capsys.readouterr().out.splitlines() if line.startswith("rlspeed: wrote")]
    assert code == 0 and len(wrote) == 1 and wrote[0].endswith(", 1 of 1 cut short at the step limit)"), wrote


def test_a_video_callbacks_line_says_the_filmed_episodes_cut_short_at_the_step_limit(tmp_path, capsys, monkeypatch):
    """VideoRecorderCallback leaves out the warning of filmed episodes cut at the step limit: its `verbose=1` line
    says how many were."""
    from conftest import endless_pendulum_id

    import rlspeed.evaluation
    from rlspeed.callbacks import VideoRecorderCallback

    monkeypatch.setattr(rlspeed.evaluation, "UNLIMITED_EPISODE_STEPS", 5)  # (10,000 steps: the same, slower)
    model = PPO(endless_pendulum_id(), seed=0, device="cpu", num_envs=1, num_steps=8, batch_size=8)
    model.learn(8, callback=VideoRecorderCallback(8, tmp_path, verbose=1), progress_bar=False)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("rlspeed: video")]
    assert len(lines) == 1 and lines[0].endswith(".mp4, 1 of 1 cut short at the step limit"), lines
