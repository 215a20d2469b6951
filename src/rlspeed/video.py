"""Videos of a policy: episodes (deterministic unless asked to sample) on one Gymnasium env made with
render_mode="rgb_array", an mp4 written with imageio and its ffmpeg, a GIF with Pillow (`pip install "rlspeed[video]"`:
imageio, its ffmpeg, Pillow, and pygame for the classic-control renderers; a GIF needs Pillow alone, which matplotlib
installs too).

A model trained on a native env is filmed on its Gymnasium view `rlspeed/<id>` (the same dynamics, drawn by
Gymnasium's renderer of that id); other models on `gymnasium.make(env_id)`. Recording is a host loop of
`model.predict` calls, one env, one frame per step: it is for looking at a policy, not part of training's device loop.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import importlib.util
import math
import numbers
import os
import tempfile
import typing
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np

import rlspeed
from rlspeed import evaluation
from rlspeed.envs.gymnasium_env import close_quietly, closed_after
from rlspeed.envs.packages import missing_dependency
from rlspeed.errors import UserError, positive_whole, true_or_false
from rlspeed.evaluation import _own_random_stream, check_evaluated_model, env_options
from rlspeed.files import given_path, move_into_place, process_running, refuse_special_file
from rlspeed.lifetime import resend_first_stop, stops_held

# (the model's class is named through the package, `rlspeed.algos.Algorithm`, which typing.get_type_hints imports
# as it resolves the annotation: an import of it here would close a cycle, algos.base calling this module)
if typing.TYPE_CHECKING:
    import rlspeed.algos

INSTALL = 'pip install "rlspeed[video]"'
#: what writing each format imports: the module, and the package that installs it
_WRITERS = {".mp4": (("imageio", "imageio"), ("imageio_ffmpeg", "imageio-ffmpeg")), ".gif": (("PIL", "Pillow"),)}
#: The formats written: mp4 (imageio's ffmpeg, H.264) and gif (Pillow, `_GifWriter`).
FORMATS = tuple(_WRITERS)


def _require_writer(path: Path) -> None:
    if path.suffix.lower() not in FORMATS:
        raise UserError(f"Cannot write a video to '{path}': give a file ending in {' or '.join(FORMATS)}.")
    missing = [package for module, package in _WRITERS[path.suffix.lower()]
               if importlib.util.find_spec(module) is None]
    if missing:
        raise UserError(f"Recording {path.suffix.lower()[1:]} videos needs {', '.join(missing)}, which "
                        f"{'is' if len(missing) == 1 else 'are'} not installed: {INSTALL}.")


@contextlib.contextmanager
def _headless_rendering() -> Iterator[None]:
    """Where no display exists (no window is possible), pygame's dummy video driver for the block: it draws the same
    frames without SDL's errors. And SDL_NO_SIGNAL_HANDLERS=1: SDL, started by pygame's renderer, otherwise takes
    SIGINT and SIGTERM wherever Python left them at their default (SIGTERM, outside training) and turns them into
    quit events no one reads, so a SIGTERM (a scheduler's, `timeout`'s) never stopped a video until a SIGKILL left its
    broken partial file. The variables are as they were afterwards (absent stays absent; a value the user set is kept
    throughout)."""
    added = {}
    if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY") or "SDL_VIDEODRIVER" in os.environ):
        added["SDL_VIDEODRIVER"] = "dummy"
    if "SDL_NO_SIGNAL_HANDLERS" not in os.environ:
        added["SDL_NO_SIGNAL_HANDLERS"] = "1"
    os.environ.update(added)
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


#: Gymnasium's warnings (the start of their text, after its colour code and "WARN: ") of an env made with a render
#: mode it lacks, or without render modes
_RENDER_MODE_WARNINGS = (r".*The environment is being initialised with render_mode=",
                         r".*The environment creator metadata doesn't include `render_modes`")


def _render_env(model_or_id, env_id: str | None = None, env_kwargs: dict | None = None,
                backend: str | None = None) -> gym.Env:
    """The single Gymnasium env a video of `model_or_id` (a model, or an env id) is filmed on, with rgb_array: made
    with the options the model's own env was made with (`spec.env_kwargs`, on its own id) and `env_kwargs` over them,
    as the evaluation on `backend` (default: the model's) plays it (a native env's view for 'torch')."""
    from rlspeed.envs import NATIVE_ENVS, _check_registered, atari, import_env_module
    from rlspeed.envs.gymnasium_env import USER_SB3_VEC_ENV, USER_VECTOR_ENV

    if isinstance(model_or_id, str):
        env_id, backend = model_or_id, "auto"
    else:
        # ('auto' is the model's own, as `evaluate`'s auto on the model's env takes the backend it trained with)
        backend = model_or_id.env_backend if backend in (None, "auto") else backend
        env_kwargs = env_options(model_or_id, env_id, env_kwargs)
        env_id = env_id or model_or_id.env_id
    if env_id in (USER_VECTOR_ENV, USER_SB3_VEC_ENV):
        raise UserError(f"This model trained on a vector env you built ('{env_id}'), which a video cannot make again "
                        "from an id: film a registered env with the same spaces, record_video(model, path, "
                        "env_id=ID) or VideoRecorderCallback(..., env_id=ID) (gymnasium.register gives an env of "
                        "yours an id).")
    if getattr(model_or_id, "trained_on_vec_normalize_obs", False):  # (as `evaluate` refuses an id for it)
        raise UserError(f"This model trains on a Stable-Baselines3 VecNormalize that normalises its observations, "
                        f"which the env a video makes from '{env_id}' does not (the policy would act on raw ones): "
                        "film it with SB3's VecVideoRecorder over a VecNormalize(training=False) holding the "
                        "statistics, or train with normalize_obs=True, whose statistics the model keeps.")
    env_kwargs = dict(env_kwargs or {})
    env_kwargs.pop("render_mode", None)  # (a video renders frames: its own render_mode replaces the run's)
    env_id = import_env_module(env_id)
    _check_registered(env_id)  # (ale-py's ids and the package families' register on first use)
    # an Atari game: the preprocessed env the model acts in (frame stacks), filmed in the game's own RGB frames
    atari_game = atari.preprocessed(env_id, env_kwargs)
    native = env_id in NATIVE_ENVS and backend in ("torch", "auto") and not env_kwargs
    make_id = f"rlspeed/{env_id}" if native else env_id
    if native:  # (in float32, as the native envs train and evaluate: the same states, so the same episodes)
        env_kwargs["state_dtype"] = "float32"
    render_mode = {"render_mode": "rgb_array"}
    if env_id == "GymV26Environment-v0":  # (Shimmy's adapter of a gym 0.26 env takes gym.make's options as make_kwargs)
        env_kwargs["make_kwargs"] = {**(env_kwargs.get("make_kwargs") or {}), **render_mode}
        render_mode = {}
    try:
        with warnings.catch_warnings():
            # (Gymnasium's warnings of a render mode the env lacks, which the check below says in one sentence; any
            # other warning, such as one of the env's own constructor, is the caller's to see)
            for said in _RENDER_MODE_WARNINGS:
                warnings.filterwarnings("ignore", message=said, category=UserWarning)
            env = (atari.make_atari_env(env_id, render_mode="rgb_array", **env_kwargs) if atari_game
                   else gym.make(make_id, **render_mode, **env_kwargs))
    except TypeError as error:
        if "argument 'render_mode'" not in str(error):
            raise UserError(f"'{env_id}' could not be made for a video: {error}.") from None
        raise UserError(f"'{env_id}' cannot render frames for a video: its constructor takes no render_mode (give "
                        "it render_mode=None and a render() that returns an RGB array).") from None
    except (ImportError, gym.error.DependencyNotInstalled) as error:
        # (the missing module's own extra: the env's package, MuJoCo's, or the video extra's pygame)
        raise UserError(f"Cannot render '{env_id}' for a video: {missing_dependency(error).rstrip('.')}.") from None
    except gym.error.Error as error:
        raise UserError(f"'{env_id}' cannot render frames for a video ({error}).") from None
    if "rgb_array" not in (env.metadata.get("render_modes") or []):
        close_quietly(env)
        raise UserError(f"'{env_id}' cannot render frames for a video (its render modes: "
                        f"{', '.join(env.metadata.get('render_modes') or []) or 'none'}): {_RGB_FRAMES}.")
    return env


#: what an env of the user's needs for videos, said where it lacks it
_RGB_FRAMES = ("list 'rgb_array' in its metadata['render_modes'] and, made with render_mode='rgb_array', return a "
               "frame from render(), a uint8 array (height, width, 3)")


@dataclass(frozen=True)
class _AtariGame:
    frame_skip: int
    max_steps: int
    fire: int | None  # FIRE's action index where the game waits for it (`atari.fire_action`)
    fire_steps: int  # steps FIRE is pressed for at a start and after a lost life (`atari.fire_steps`)


def _atari_game(env_id: str, env_kwargs: dict | None = None) -> _AtariGame | None:
    """How a video plays an Atari image id made with the options `env_kwargs` (None for other envs)."""
    from rlspeed.envs import atari

    if not atari.atari_image_id(env_id):
        return None
    return _AtariGame(atari.FRAME_SKIP, atari.max_episode_steps(env_id), atari.fire_action(env_id),
                      atari.fire_steps(env_id, env_kwargs))


@_headless_rendering()
def check_video_support(env_id: str, path: str | Path = "video.mp4", env_kwargs: dict | None = None) -> None:
    """UserError now, in one sentence, when a video of `env_id` (made with `env_kwargs`) to `path` could not be
    recorded (its writer, an mp4's imageio and ffmpeg or a GIF's Pillow, or the env's renderer missing, or an env
    without frames); `rlspeed train
    --video-every` checks before training."""
    _require_writer(Path(path))
    env = _render_env(env_id, env_kwargs=env_kwargs)
    with closed_after(env, env_id, before_work=True):
        env.reset(seed=0)
        frame = _rendered(env, env_id)
    if not isinstance(frame, np.ndarray) or frame.ndim != 3:
        got = (f"an array of shape {frame.shape} and dtype {frame.dtype}" if isinstance(frame, np.ndarray)
               else type(frame).__name__)
        raise UserError(f"'{env_id}' rendered no RGB frame (got {got}), so it cannot be recorded: {_RGB_FRAMES}.")


def check_video_path(path: str | Path, name: str) -> None:
    """UserError in one sentence, before any episode is filmed, where the video file `path` (in a directory that
    exists; `name`: the argument that gave it) cannot be written, with overwrite or without: its directory cannot be
    written (a read-only file system, a directory of another user: the encoder said so only after the episodes), or it
    is a directory (which the writer cannot replace), a device or a pipe (which the whole video, renamed over it,
    would replace). `record_video`'s rule, which `rlspeed eval --video` checks before evaluating."""
    from rlspeed.files import unwritable

    parent = Path(path).parent
    if unwritable(parent) is not None:
        raise UserError(f"Cannot write '{path}': the directory '{parent}' cannot be written here (read-only, or "
                        "another user's); give a file in a directory you can write to.")
    if Path(path).is_dir():
        raise UserError(f"{name} '{path}' is a directory: give the video file to write, ending in "
                        f"{' or '.join(FORMATS)} (e.g. '{Path(path) / 'episode.mp4'}').")
    refuse_special_file(path, name)


def _rendered(env: gym.Env, env_id: str):
    """`env.render()`, or UserError in one sentence where the env cannot render here (MuJoCo without an OpenGL
    platform on a machine without a display: MUJOCO_GL)."""
    try:
        return env.render()
    except Exception as error:  # noqa: BLE001 (a renderer's own exception types: mujoco.FatalError, ...)
        detail = str(error).strip().splitlines()[0] if str(error).strip() else ""
        # (GLFW, MuJoCo's default OpenGL platform, gives "The DISPLAY environment variable is missing" as a warning,
        # GLFWError: raised as an error under `python -W error`)
        mujoco = "mujoco" in type(error).__module__ or "MUJOCO_GL" in str(error) or "OpenGL" in str(error) \
            or "glGetError" in str(error) or type(error).__module__.partition(".")[0] == "glfw"
        hint = ("; on a machine without a display, set MUJOCO_GL=egl (or osmesa, with its library installed) before "
                "the command" if mujoco else "")
        raise UserError(f"'{env_id}' cannot render frames here ({type(error).__name__}: {detail[:160]}){hint}.") \
            from None


def _frame(env: gym.Env, env_id: str) -> np.ndarray:
    """The env's rendered frame as a video takes it: uint8 (float frames in [0, 1], as MinAtar draws them, scaled),
    enlarged by whole pixels where it is smaller than 160 on a side (MinAtar's 10 x 10), padded to even sides."""
    frame = np.asarray(_rendered(env, env_id))
    if frame.dtype != np.uint8:
        scale = 255.0 if frame.dtype.kind == "b" or (frame.dtype.kind == "f" and frame.size
                                                     and float(frame.max()) <= 1.0) else 1.0
        frame = np.clip(frame.astype(np.float64) * scale, 0, 255).round().astype(np.uint8)
    if frame.ndim == 3 and 0 < min(frame.shape[:2]) < 160:
        factor = -(-160 // min(frame.shape[:2]))
        frame = frame.repeat(factor, axis=0).repeat(factor, axis=1)
    return _even(frame)


def _even(frame: np.ndarray) -> np.ndarray:
    """`frame` padded to even height and width (H.264's yuv420p, which players expect, needs them)."""
    pad_h, pad_w = frame.shape[0] % 2, frame.shape[1] % 2
    return np.pad(frame, ((0, pad_h), (0, pad_w), (0, 0)), mode="edge") if pad_h or pad_w else frame


class VideoWriteError(UserError):
    """A video file that could not be written (a full disk, a quota, the encoder gone); the partial file is removed."""


class _WriteFailed(Exception):
    """The video writer's OSError (args[0]), told apart from one the env or the model raises."""


def _append(writer, frame, write: Callable[[], typing.ContextManager]) -> None:
    """Write `frame` whole (in a block of `write`, the recording's `_writes_whole`); the writer's OSError as
    `_WriteFailed`."""
    try:
        with write():
            writer.append_data(frame)
    except OSError as error:
        raise _WriteFailed(error) from None


@contextlib.contextmanager
def _writes_whole() -> Iterator[Callable[[], typing.ContextManager]]:
    """Within the block (a recording) a stop (Ctrl-C, SIGTERM: `lifetime.STOPS`) that comes inside a block of the
    function yielded (a frame's write) waits, and the first that came is raised again as that block ends, to the
    handler from before (Python's KeyboardInterrupt, the `rlspeed` command's `Terminated`), whether or not the write
    raised; one that comes elsewhere (an env's step) comes at once, as without the block. The handlers are set once
    a recording (`lifetime.stops_held`), not twice a frame. A frame reaches ffmpeg whole, so a stop leaves ffmpeg's
    input at a frame's end and it ends quietly; a stop inside the write left part of a frame, and ffmpeg, killed as
    it began its complaint ("[in#0/rawvideo @ 0x...] Packet corrupt"), left the line open under the command's last
    one."""
    writing = [False]

    @contextlib.contextmanager
    def write() -> Iterator[None]:
        writing[0] = True
        try:
            yield
        finally:
            writing[0] = False
            first = came[:1]
            came.clear()
            resend_first_stop(first)  # (a stop wins over an error of the write)

    with stops_held(waiting=lambda: writing[0]) as came:
        yield write


class _GifWriter:
    """A GIF written to `path` frame by frame as it is filmed, so that memory holds one frame: imageio's GIF writer
    (Pillow's) held every frame until it was closed, about 1 MB a CartPole frame, and a 10,000-step episode ran out of
    memory where an mp4 streams to disk. Each frame has a palette of its own (Pillow's adaptive palette, as Pillow's
    writer gives a colour frame) and shows `1000 / fps` ms; the GIF loops."""

    def __init__(self, path: Path, fps: float):
        self._file = open(path, "wb")  # noqa: SIM115 (closed by `close`, which the caller always calls)
        self._duration_ms = 1000 / fps
        self._started = False

    def _write(self, data: bytes) -> None:
        self._file.write(data)

    def append_data(self, frame: np.ndarray) -> None:
        from PIL import GifImagePlugin, Image

        image = Image.fromarray(np.ascontiguousarray(frame[..., :3])).convert("P", palette=Image.Palette.ADAPTIVE)
        if not self._started:  # (the screen's size and a global palette, the first frame's, and the loop)
            header, _ = GifImagePlugin.getheader(image, info={"loop": 0, "duration": self._duration_ms})
            self._write(b"".join(header))
            self._started = True
        self._write(b"".join(GifImagePlugin.getdata(image, duration=self._duration_ms, include_color_table=True)))

    def close(self) -> None:
        if self._file.closed:
            return
        try:
            if self._started:
                self._write(b";")  # (the GIF's trailer)
        finally:
            self._file.close()


def _complete_mp4(path: Path) -> bool:
    """Whether an MP4 file is whole: its top-level boxes fill the file exactly and one is the index (`moov`)."""
    try:
        size, offset, boxes = path.stat().st_size, 0, set()
        with open(path, "rb") as handle:
            while offset < size:
                handle.seek(offset)
                header = handle.read(16)
                if len(header) < 8:
                    return False
                length, kind = int.from_bytes(header[:4], "big"), header[4:8]
                if length == 1 and len(header) == 16:  # (a 64-bit size follows)
                    length = int.from_bytes(header[8:16], "big")
                elif length == 0:  # (to the end of the file)
                    length = size - offset
                if length < 8:
                    return False
                boxes.add(kind)
                offset += length
        return offset == size and b"moov" in boxes
    except OSError:
        return False


def _temporary_video(path: Path) -> Path:
    """A new empty file beside `path` for its video to be written to (`.NAME.PID.RANDOM.EXT`: the extension tells
    imageio and ffmpeg the format), after removing those that a recording of `path` killed before its end left (their
    process gone: `process_running`)."""
    for stale in path.parent.glob(f".{glob.escape(path.name)}.*{glob.escape(path.suffix)}"):
        pid = stale.name[len(path.name) + 2:].split(".")[0]
        if pid.isdigit() and int(pid) != os.getpid() and not process_running(int(pid)):
            stale.unlink(missing_ok=True)
    descriptor, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=path.suffix)
    os.close(descriptor)
    return Path(name)


def _put_in_place(temporary: Path, path: Path, overwrite: bool) -> None:
    """The whole video `temporary`, synced to disk, renamed to `path` (over a file there only with `overwrite`; a
    symlink there is replaced, never written through)."""
    try:
        with open(temporary, "rb+") as handle:
            os.fsync(handle.fileno())
        move_into_place(temporary, path, replace=overwrite)
    except FileExistsError:  # (made since the call began: a user's file is replaced only when asked)
        raise UserError(f"'{path}' exists: pass overwrite=True to replace it, or give another file.") from None
    except OSError as error:
        raise _WriteFailed(error) from None


@_headless_rendering()
def record_video(model: rlspeed.algos.Algorithm, path: str | Path, episodes: int = 1, seed: int | None = None,
                 env_id: str | None = None, fps: int | None = None, max_steps: int | None = None,
                 deterministic: bool = True, env_kwargs: dict[str, typing.Any] | None = None, overwrite: bool = False,
                 backend: str | None = None) -> dict[str, typing.Any]:
    """Record `episodes` episodes of `model`'s policy (deterministic; `deterministic=False` samples) into one video
    file (`.mp4` or `.gif`); a file already at `path` is refused unless `overwrite`; a directory, a device or a pipe
    at `path` is refused with `overwrite` too (`check_video_path`, before any episode is filmed).

    Episode i starts from `env.reset(seed=seed + i)` (a native env's view: the state row i of a native env seeded
    with `seed` starts from; unseeded when `seed` is None) and runs until it ends or
    reaches `max_steps` (default: the env's time limit, else 10,000), with a warning where that limit cut one short
    (as `evaluate` warns); every step is one frame, plus the first observation's. A stochastic policy's samples come
    from a random stream of the video's own seeded by `seed`, as `evaluate`'s do (torch's generators are left as they
    were). Where the env gives action masks (`info["action_mask"]`) and the model takes them, the policy is masked as
    in `evaluate`. `fps` defaults to the env's `render_fps`. `env_id` is the env to film (default: the id the model
    trained on; a model trained on a vector env you built needs one, as that env cannot be made again). `env_kwargs`
    replace options of the env (those recorded with the model, on its own id), as in `evaluate`. With the same
    `seed`, episode i is `evaluate`'s episode i (deterministic; not on EnvPool, which draws no frames) on the backend
    the model trained with (also for `backend='auto'`, as `evaluate` takes it), or on `backend` where given: 'torch'
    films the native env's view (`rlspeed/<id>`), 'gymnasium' Gymnasium's env (`rlspeed eval --env-backend` passes
    its own). Returns {"path", "episodes", "frames", "fps", "returns", "mean" (of the returns), "unfinished" (the
    episodes the step limit cut short, as `evaluate`'s), "size": (height, width)}. UserError when the writer (an mp4's
    imageio and ffmpeg, a GIF's Pillow) or the env's renderer is missing. The video is written to a hidden file
    beside `path` (`.NAME.PID.RANDOM.EXT`) that takes the name `path` once whole: a call that does not return
    (interrupted, killed, a full disk, or an error of the env or the model) leaves no file at `path`, and the file that
    `overwrite` replaces stays as it was.
    """
    check_evaluated_model(model, "record_video", "rlspeed eval PATH --video FILE.mp4")
    path = given_path("record_video's path", path)
    _require_writer(path)
    from rlspeed.envs import BACKENDS
    from rlspeed.envs.base import check_seed

    if backend is not None and backend not in BACKENDS:
        raise UserError(f"record_video's backend={backend!r} is not one of {', '.join(BACKENDS)}.")
    episodes = positive_whole("record_video's episodes", episodes, needed_by="record_video")
    max_steps = positive_whole("record_video's max_steps", max_steps)
    if fps is not None and (isinstance(fps, bool) or not isinstance(fps, numbers.Real) or not 0 < fps < math.inf):
        raise UserError(f"record_video's fps is a number of frames per second above 0 (None: the env's), got {fps!r}.")
    seed = None if seed is None else check_seed(seed, limit_bits=63)  # (evaluate's: episode i is its episode i)
    deterministic = true_or_false("record_video(deterministic=...)", deterministic)
    overwrite = true_or_false("record_video(overwrite=...)", overwrite)
    if not path.parent.is_dir():
        raise UserError(f"Cannot write '{path}': the directory '{path.parent}' does not exist.")
    check_video_path(path, "record_video's path")
    if not overwrite and (path.exists() or path.is_symlink()):  # (a user's file: replaced only when asked)
        raise UserError(f"'{path}' exists: pass overwrite=True to replace it, or give another file.")

    env = _render_env(model, env_id, env_kwargs, backend)
    from rlspeed.envs.base import EnvSpec, space_text
    from rlspeed.evaluation import space_mismatch

    try:  # (observations and actions of the kinds the model trained on, as `evaluate` checks them)
        given = EnvSpec.from_spaces(env_id or model.env_id, env.observation_space, env.action_space, None, None)
        wrong = space_mismatch(model.spec, given)
    except BaseException:
        close_quietly(env)
        raise
    if wrong:
        close_quietly(env)
        raise UserError(f"'{env_id or model.env_id}' gives {' and '.join(wrong)} other than this model trained on "
                        f"(observations {space_text(model.spec.observation_space)}, actions "
                        f"{space_text(model.spec.action_space)}): it cannot be filmed on that env.")
    game = _atari_game(env_id or model.env_id, env_options(model, env_id, env_kwargs))
    # (an Atari step is FRAME_SKIP of the game's 60 frames a second: the video plays at the game's speed)
    fps = fps or (60 // game.frame_skip if game else env.metadata.get("render_fps") or 30)
    limit = max_steps or (game.max_steps if game else None) or (
        env.spec.max_episode_steps if env.spec is not None else None) or evaluation.UNLIMITED_EPISODE_STEPS
    recurrent = hasattr(model, "act_with_state")
    from rlspeed.envs import NATIVE_ENVS
    from rlspeed.envs.gym_view import NativeGymEnv

    # (the native env's view in place of its id, where its evaluation runs natively; `rlspeed/<id>` named as the env
    # is a Gymnasium env like any other, evaluated on Gymnasium's vector envs)
    native_view = isinstance(env.unwrapped, NativeGymEnv) and (env_id or model.env_id) in NATIVE_ENVS
    discrete = isinstance(env.action_space, gym.spaces.Discrete)
    masking = getattr(model, "supports_action_masks", False) and getattr(model.config, "use_masking", False)
    try:
        mask_method = env.get_wrapper_attr("action_masks") if masking else None
    except AttributeError:
        mask_method = None
    mask_method = mask_method if callable(mask_method) else None
    returns, frames, size, cut = [], 0, None, 0
    # (filmed into a file of its own beside `path`, which takes the name once whole: a kill, a power loss or a full
    # disk leaves no cut video at `path`, and the file an overwrite replaces stays until then)
    temporary = _temporary_video(path)
    try:
        if path.suffix.lower() == ".gif":  # (Pillow's; imageio writes the mp4s, and a GIF does not need it)
            writer = _GifWriter(temporary, fps)
        else:
            import imageio.v2 as imageio

            writer = imageio.get_writer(temporary, fps=fps, macro_block_size=1)
    except Exception as error:  # imageio reports a missing or broken backend with its own exception types
        close_quietly(env)
        temporary.unlink(missing_ok=True)
        raise UserError(f"Cannot write a video to '{path}': {error}.") from None
    # (a stochastic policy samples from a stream of its own, seeded by `seed`; the caller's generators stay as they are)
    sampling = _own_random_stream(model, "cpu", seed, 1) if not deterministic else contextlib.nullcontext()
    # (the env closes quietly where filming failed, the first error being the one to show; an env whose close()
    # raises after filming is one line naming it, and the video is kept)
    with closed_after(env, env_id or model.env_id):
        try:
            with sampling, _writes_whole() as write:  # (a stop inside a frame's write comes once it is written)
                for episode in range(episodes):
                    # (episode i is the evaluation's episode i of the same seed: Gymnasium's vector env seeds its env i
                    # with seed + i; a native env's row i draws from seed's stream i, as the native view's row option)
                    obs, info = (env.reset(seed=seed, options={"row": episode}) if native_view and seed is not None
                                 else env.reset(seed=None if seed is None else seed + episode))
                    state, start, total = None, np.ones(1, dtype=bool), 0.0
                    # Atari games that wait for FIRE get it first, and after every lost life, as `evaluate` gives it
                    fire_left = game.fire_steps if game is not None and game.fire is not None else 0
                    lives = info.get("lives")
                    frame = _frame(env, env_id or model.env_id)
                    size = size or frame.shape[:2]
                    _append(writer, frame, write)
                    frames += 1
                    for _ in range(limit):
                        masks = None
                        if masking:  # (an `action_masks()` method, as sb3-contrib's ActionMasker gives, or the info's)
                            masks = mask_method() if mask_method is not None else info.get("action_mask")
                        if recurrent:
                            action, state = model.predict(obs, state=state, episode_start=start,
                                                          deterministic=deterministic, action_masks=masks)
                            start = np.zeros(1, dtype=bool)
                        else:
                            action, _ = model.predict(obs, deterministic=deterministic, action_masks=masks)
                        if fire_left > 0:
                            action = np.asarray(game.fire).reshape(np.shape(action))
                        if discrete:  # (a plain int: envs that look the action up in a table (Taxi) refuse a 0-d array)
                            action = int(action)
                        obs, reward, terminated, truncated, info = env.step(action)
                        lost = info.get("lives", lives) < lives if lives is not None else False
                        fire_left = (game.fire_steps if game is not None and game.fire is not None and lost
                                     else max(fire_left - 1, 0))
                        lives = info.get("lives", lives)
                        total += float(reward)
                        frame = _frame(env, env_id or model.env_id)
                        _append(writer, frame, write)
                        frames += 1
                        if terminated or truncated:
                            break
                    else:
                        cut += 1
                    returns.append(total)
            try:
                writer.close()  # (an encoder flushes its last frames here: this can fail for lack of space too)
            except OSError as error:
                raise _WriteFailed(error) from None
            if path.suffix.lower() == ".mp4" and not _complete_mp4(temporary):
                # (ffmpeg that failed to write its trailer, on a full disk, says so on stderr and exits non-zero, which
                # imageio-ffmpeg does not check: the file has no index, and no player opens it)
                raise _WriteFailed(OSError(errno.ENOSPC, "the encoder could not finish the file (a full disk?)"))
            _put_in_place(temporary, path, overwrite)
        except _WriteFailed as failed:  # (a full disk, a quota, ffmpeg gone: a partial video is no video)
            close_quietly(writer)
            temporary.unlink(missing_ok=True)
            error = failed.args[0]
            raise VideoWriteError(f"Cannot write a video to '{path}': {error.strerror or error} (the partial file "
                                  "was removed).") from None
        except BaseException:
            # (an interruption, Ctrl-C or a notebook's stop button, or an error of the env or the model: the episodes
            # were not filmed, and a file left at `path` would be a broken video (ffmpeg is killed when the interrupt
            # lands in a frame's write) that refuses the same call run again)
            close_quietly(writer)
            temporary.unlink(missing_ok=True)
            raise
    if cut:  # (as `evaluate` says it; stacklevel 3: past the _headless_rendering wrapper, the caller's line)
        warnings.warn(f"record_video: {cut} of {episodes} episodes were still running after {limit} steps; the video "
                      "ends them there and they count with the return collected so far (pass max_steps= to run "
                      "longer; on the command line, --env-kwargs max_episode_steps=N gives the env a time limit of N "
                      "steps).", stacklevel=3)
    return {"path": str(path), "episodes": episodes, "frames": frames, "returns": returns, "unfinished": cut,
            "size": tuple(int(v) for v in size), "fps": fps, "mean": math.fsum(returns) / len(returns)}
