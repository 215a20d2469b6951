"""Env packages that register their ids with Gymnasium when imported: `--gym-packages` modules, and the families of
ids whose package rlspeed imports by itself on the first id (`PACKAGE_FAMILIES`); MuJoCo's messages routed to
Python's warnings (`route_mujoco_messages`); Box2D imported without its import warnings (`import_box2d`); what to
install for a missing optional module (`install_command`: rlspeed's extra that has it)."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
import warnings
from pathlib import Path
from typing import NoReturn

import gymnasium as gym

from rlspeed.errors import UserError

#: The extra of rlspeed that installs each optional module (by its top-level name) an env family, a backend or a video
#: needs: a missing one is advised as `install_command` gives it, the same command from train, eval, videos and doctor.
EXTRAS = {"mujoco": "mujoco", "Box2D": "box2d", "ale_py": "atari", "cv2": "atari", "envpool": "envpool",
          "imageio": "video", "imageio_ffmpeg": "video", "pygame": "video"}

#: Gymnasium's extras that one of rlspeed's installs (its DependencyNotInstalled messages name Gymnasium's)
_GYMNASIUM_EXTRAS = {"mujoco": "mujoco", "box2d": "box2d", "classic-control": "video"}


#: The pip distributions of modules named otherwise (`import OpenGL` is PyOpenGL, which MuJoCo's off-screen rendering
#: needs; the others are common dependencies of users' env modules, which `missing_dependency` names)
_DISTRIBUTIONS = {"OpenGL": "PyOpenGL", "sklearn": "scikit-learn", "skimage": "scikit-image", "yaml": "PyYAML",
                  "PIL": "Pillow", "dateutil": "python-dateutil", "bs4": "beautifulsoup4", "attr": "attrs"}


def install_command(module: str) -> str:
    """What to run where the Python module `module` (any dotted name; its top-level package counts) is missing:
    `pip install "rlspeed[EXTRA]"` for a module of one of rlspeed's extras (`EXTRAS`), else `pip install` its
    distribution (the module's name, or `_DISTRIBUTIONS`'s where pip names it otherwise: PyOpenGL for OpenGL)."""
    top = module.split(".")[0]
    return f'pip install "rlspeed[{EXTRAS[top]}]"' if top in EXTRAS else f"pip install {_DISTRIBUTIONS.get(top, top)}"


def missing_dependency(error: BaseException, beside_installed: bool = False) -> str | None:
    """For an error from making an env whose Python dependency is missing: 'the Python module X is not installed:
    pip install ...' naming what is missing (an ImportError's module, with `install_command`'s advice: rlspeed's extra
    that installs it), or Gymnasium's DependencyNotInstalled message with its `gymnasium[X]` advice given as rlspeed's
    extra of that name; 'the Python module X is installed but cannot be imported: ...' with its import's error where
    X is there but fails to load (`module_installed`'s rule), or, with `beside_installed` (the sentence follows another
    package's 'is installed, but'), 'the Python module X, installed too, cannot be imported: ...'; else None."""
    advice = dependency_advice(error, beside_installed)
    return None if advice is None else advice[0]


def dependency_advice(error: BaseException, beside_installed: bool = False) -> tuple[str, bool] | None:
    """`missing_dependency`'s sentence for `error` (its `beside_installed` too), and whether it advises one of
    rlspeed's extras (`EXTRAS`, or the extra that stands for Gymnasium's in a DependencyNotInstalled message): where
    it does, a newer version of the env's id needs the same package. None for an error that is not a missing
    dependency."""
    error = import_cause(error)
    if isinstance(error, ImportError) and error.name:
        top = error.name.split(".")[0]
        if _fails_to_load(error):
            said = " ".join(line.strip() for line in str(error).strip().splitlines())[:200] or type(error).__name__
            installed_too = ", installed too," if beside_installed else " is installed but"
            return f"the Python module '{top}'{installed_too} cannot be imported: {said}", False
        return f"the Python module '{top}' is not installed: {install_command(top)}", top in EXTRAS
    if isinstance(error, (ImportError, gym.error.DependencyNotInstalled)):
        said = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        by_extra = any(found.group(1) in _GYMNASIUM_EXTRAS for found in _GYMNASIUM_ADVICE.finditer(said))
        return _GYMNASIUM_ADVICE.sub(lambda found: f'pip install "rlspeed[{_GYMNASIUM_EXTRAS[found.group(1)]}]"'
                                     if found.group(1) in _GYMNASIUM_EXTRAS else found.group(0), said), by_extra
    return None


#: Gymnasium's advice in its DependencyNotInstalled messages: its extra (group 1)
_GYMNASIUM_ADVICE = re.compile(r'pip install "?gymnasium\[([\w-]+)\]"?')


def import_cause(error: BaseException) -> BaseException:
    """The error that names a missing module: for Gymnasium's DependencyNotInstalled raised from an ImportError that
    names its module, that ImportError (the import that failed); else `error` itself. The one unwrapping, for
    `missing_dependency` and doctor's env families."""
    if isinstance(error, gym.error.DependencyNotInstalled) and isinstance(error.__cause__, ImportError) \
            and error.__cause__.name:
        return error.__cause__
    return error


def _fails_to_load(error: ImportError) -> bool:
    """Whether the module `error` names (by its top-level package) is there but fails to load, a shared library of its
    own missing, say: installing it again changes nothing, and its import's own error says what is wrong."""
    top = (error.name or "").split(".")[0]
    return bool(top) and not (isinstance(error, ModuleNotFoundError) and error.name == top) and module_installed(top)


def module_installed(module: str) -> bool:
    """Whether the top-level module `module` can be found on the path, without importing it (one that is there may
    still fail to load: `missing_dependency` says so). The one rule of "installed" for the optional modules rlspeed
    advises on (env families, MuJoCo's OpenGL)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # (a module in sys.modules without a spec)
        return module in sys.modules


_REGISTERED_BY_CALL: set[str] = set()  # modules whose register_envs() import_gym_packages has called


def import_gym_packages(modules: list[str], why: str = "(--gym-packages)", role: str = "register the env") -> None:
    """Import each module of `modules` (dotted names), which registers its envs with Gymnasium (RL-Zoo's
    `--gym-packages`), and call its `register_envs()` where it has one and registers nothing on import
    (`minatar.gym`); UserError naming the module that cannot be imported, with `why` (where the name came from) after
    it and `role` (what it is imported for: `rlspeed export`'s, the algorithm that saved the model)."""
    for module in modules:
        if not module or not all(part.isidentifier() for part in module.split(".")):
            raise UserError(f"'{module}' {why} is not a Python module name.")
        try:
            imported = _import_here_too(module)
        except Exception as error:
            # (a module that imports MuJoCo, Gymnasium-Robotics: its error would be PyOpenGL's, naming no platform;
            # only an error raised in MuJoCo's or PyOpenGL's code: a module's own error is its own under any MUJOCO_GL)
            if _raised_in(error, ("mujoco", "OpenGL")) and (platform_error := mujoco_gl_error()) is not None:
                raise platform_error from error
            _import_failed(module, why, role, error)
        register = getattr(imported, "register_envs", None)
        if callable(register) and module not in _REGISTERED_BY_CALL:
            _REGISTERED_BY_CALL.add(module)
            try:
                with warnings.catch_warnings():  # ids the user's code registered already: the same entry points
                    warnings.filterwarnings("ignore", message=".*Overriding environment")
                    register()
            except TypeError:  # a register_envs with parameters is not this convention
                pass


def _raised_in(error: BaseException, packages: tuple[str, ...]) -> bool:
    """Whether `error`'s traceback passes through the code of one of `packages` (top-level module names)."""
    trace = error.__traceback__
    while trace is not None:
        if str(trace.tb_frame.f_globals.get("__name__", "")).partition(".")[0] in packages:
            return True
        trace = trace.tb_next
    return False


def _import_failed(module: str, why: str, role: str, error: Exception) -> NoReturn:
    """UserError for `module`'s failed import (`import_gym_packages`'s `why` and `role` in its sentence): a package it
    imports that is missing (or fails to load) is named with what to install (`missing_dependency`)."""
    if isinstance(error, ImportError) and (error.name or module).split(".")[0] != module.split(".")[0] \
            and (missing := missing_dependency(error)) is not None:
        # (a package the module imports, not the module: Gymnasium-Robotics without PettingZoo)
        raise UserError(f"Cannot import the module '{module}' {why}, which should {role}: {missing}.") from None
    if isinstance(error, ImportError):
        # a module not found: where Python looked (a run evaluated from another directory misses its env's file)
        where = (" (modules are found on PYTHONPATH and in the current directory)"
                 if isinstance(error, ModuleNotFoundError) and error.name == module.split(".")[0] else "")
        raise UserError(f"Cannot import the module '{module}' {why}, which should {role}: {error}{where}.") from None
    # (the module's own code failed: named, its traceback under --debug)
    detail = str(error).strip().splitlines()
    raise UserError(f"The module '{module}' {why} raised {type(error).__name__} on import"
                    f"{': ' + detail[0] if detail else ''} (--debug shows its traceback).") from error


def _import_here_too(module: str):
    """`importlib.import_module(module)`, also finding a module in the current directory (`myenvs.py`), as `python
    -m` would: the `rlspeed` command does not put the current directory on `sys.path` (appended, so that it never
    shadows an installed package)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        top = module.split(".")[0]
        here = Path.cwd()
        if error.name != top or not ((here / f"{top}.py").is_file() or (here / top / "__init__.py").is_file()) \
                or str(here) in sys.path or "" in sys.path:
            raise
        sys.path.append(str(here))
        return importlib.import_module(module)


#: Env families whose package registers them when imported (`import_gym_packages`), by id prefix: (family, module
#: to import, what to pip install).
PACKAGE_FAMILIES = {"MinAtar/": ("MinAtar", "minatar.gym", "minatar"),
                    "MiniGrid-": ("MiniGrid", "minigrid", "minigrid"), "BabyAI-": ("BabyAI", "minigrid", "minigrid")}


#: Shimmy's adapters of envs of the old gym package. Gymnasium registers these ids itself with a stand-in entry point
#: that raises ImportError ("pip install shimmy[gym-v21]", whose gym pins numpy below 2) until `import shimmy`
#: registers Shimmy's own, also where Shimmy is installed.
SHIMMY_GYM_IDS = ("GymV21Environment-v0", "GymV26Environment-v0")


def _register_shimmy(env_id: str) -> None:
    """For one of `SHIMMY_GYM_IDS` registered with Gymnasium's stand-in (or not at all): import Shimmy, which registers
    it; UserError with the pip command when Shimmy is not installed."""
    spec = gym.registry.get(env_id)
    if spec is not None and getattr(spec.entry_point, "__name__", None) != "_raise_shimmy_error":
        return  # (Shimmy's own, or one the user registered)
    if importlib.util.find_spec("shimmy") is None:
        raise UserError(f"'{env_id}' is Shimmy's adapter of envs written for the old gym package, and needs Shimmy and "
                        "gym: pip install shimmy gym.")
    import_gym_packages(["shimmy"], "(which registers Shimmy's adapters of gym envs)")


def register_family(env_id: str) -> None:
    """For an unregistered `env_id` of a family in `PACKAGE_FAMILIES`: import its package, which registers it (as
    `--gym-packages` would); UserError with the pip command when the package is not installed. Shimmy's ids
    (`SHIMMY_GYM_IDS`) import Shimmy the same way."""
    if env_id in SHIMMY_GYM_IDS:
        _register_shimmy(env_id)
        return
    if env_id in gym.registry or (found := _package_family(env_id)) is None:
        return
    family, module, package = found
    if importlib.util.find_spec(module.split(".")[0]) is None:
        raise UserError(f"'{env_id}' is a {family} id, and {family} envs need {package}: pip install {package}.")
    import_gym_packages([module], f"(which registers the {family} envs)")


def _package_family(env_id: str) -> tuple[str, str, str] | None:
    """(family, module, package) of the `PACKAGE_FAMILIES` entry whose prefix `env_id` starts with; None if none."""
    return next((found for prefix, found in PACKAGE_FAMILIES.items() if env_id.startswith(prefix)), None)


def registering_modules(env_id: str) -> list[str]:
    """The modules to import (calling a `register_envs()` where one has it, as `import_gym_packages` does) before
    `gymnasium.make(env_id)` works in another process: what a model file and an export's sidecar record as
    `gym_packages`. The module of a `module:EnvId` id; a family's package (`PACKAGE_FAMILIES`: `minatar.gym`); else
    the module of the id's registered entry point (importing it imports the package that registers it); none for
    Gymnasium's and rlspeed's own ids, an unregistered id, or a class of a script (`__main__`), which no import
    gives."""
    if ":" in env_id:
        return [env_id.split(":", 1)[0]]
    if (found := _package_family(env_id)) is not None:
        return [found[1]]
    spec = gym.registry.get(env_id)
    entry = getattr(spec, "entry_point", None)
    # (a class's or function's module; an object's, a functools.partial's, names its class's module)
    module = (entry.split(":", 1)[0] if isinstance(entry, str)
              else getattr(entry, "__module__", None) if hasattr(entry, "__qualname__") else None)
    if not isinstance(module, str) or module.split(".")[0] in ("gymnasium", "rlspeed", "__main__", "builtins"):
        return []
    return [module]


_mujoco_routed = False
#: what to do where MuJoCo cannot be imported with the MUJOCO_GL set
MUJOCO_GL_ADVICE = ("unset MUJOCO_GL (training renders nothing), or set it to egl (or osmesa where its library, "
                    "OSMesa, is installed) for videos on a machine without a display")


class MujocoGLError(UserError):
    """`import mujoco` failed with MUJOCO_GL set: MuJoCo loads the OpenGL platform it names on import."""

    def __init__(self, platform: str, error: BaseException):
        detail = str(error).strip().splitlines()[0][:160] if str(error).strip() else ""
        self.platform = platform
        super().__init__(f"MuJoCo cannot be imported with MUJOCO_GL={platform} ({type(error).__name__}: {detail}): "
                         f"MuJoCo loads that OpenGL platform on import; {MUJOCO_GL_ADVICE}.")


def mujoco_gl_error() -> MujocoGLError | None:
    """MujocoGLError where MUJOCO_GL is set and MuJoCo, installed and not imported yet, cannot be imported with it (a
    module that imports MuJoCo, such as Gymnasium-Robotics, then fails on PyOpenGL's error, which names no platform);
    else None."""
    platform = os.environ.get("MUJOCO_GL")
    if not platform or "mujoco" in sys.modules or not module_installed("mujoco"):
        return None
    try:
        import mujoco  # noqa: F401
    except Exception as error:  # noqa: BLE001 (PyOpenGL's AttributeError, MuJoCo's RuntimeError, ImportError)
        return MujocoGLError(platform, error)
    return None


class MujocoImportError(UserError):
    """`import mujoco` failed with MUJOCO_GL unset: a broken install, whose ImportError (`error`) names the repair
    (`detail`; a module MuJoCo imports that is installed but fails to load is one), or a module MuJoCo imports is
    missing (`missing`, its name: installing it is the repair)."""

    def __init__(self, env_id: str, error: ImportError):
        self.error = error
        module = (error.name or "").split(".")[0]
        self.missing = module if module not in ("", "mujoco") and not _fails_to_load(error) else None
        self.detail = install_command(self.missing) if self.missing else (
            " ".join(line.strip() for line in str(error).strip().splitlines()) or type(error).__name__)
        reason = f"the Python module '{self.missing}' it imports is not installed: " if self.missing else ""
        super().__init__(f"MuJoCo is installed but cannot be imported, so '{env_id}' cannot be made: {reason}"
                         f"{self.detail}")


def gymnasium_family(env_id: str, family: str) -> bool:
    """Whether `env_id` is registered as one of Gymnasium's own envs of `family` ("mujoco", "box2d"): its entry point
    a module of `gymnasium.envs.<family>`."""
    spec = gym.registry.get(env_id)
    entry = spec.entry_point if spec is not None and isinstance(spec.entry_point, str) else ""
    return entry.startswith(f"gymnasium.envs.{family}")


def route_mujoco_messages(env_id: str) -> None:
    """For an id of Gymnasium's MuJoCo envs: route MuJoCo's warnings (model compiler notices, simulation
    instabilities) to Python's `warnings`, each message once per process, unless the user set MuJoCo's handler: a
    deprecation in a model file of Gymnasium's is a DeprecationWarning of that file (module `mujoco`: hidden unless
    warnings are asked for, `-W default`), one in another model a FutureWarning (shown), others RuntimeWarnings.
    Without a handler MuJoCo prints them and appends them to MUJOCO_LOG.TXT in the working directory, a file the user
    did not ask for (HalfCheetah-v5 writes one on every make with MuJoCo 4)."""
    global _mujoco_routed
    if _mujoco_routed or not gymnasium_family(env_id, "mujoco") or importlib.util.find_spec("mujoco") is None:
        return
    try:
        import mujoco
    except Exception as error:  # noqa: BLE001 (PyOpenGL's AttributeError, MuJoCo's RuntimeError, ImportError)
        platform = os.environ.get("MUJOCO_GL")
        if platform:
            raise MujocoGLError(platform, error) from None
        if not isinstance(error, ImportError):
            raise
        # (MuJoCo's own ImportErrors name the repair: its core bindings missing, or mujoco and mujoco-core of
        # different versions after a partial upgrade)
        raise MujocoImportError(env_id, error) from None

    _mujoco_routed = True
    if mujoco.get_mju_user_warning() is None:
        mujoco.set_mju_user_warning(_mujoco_warning)


#: Box2D's SWIG-made extension warns about its own types as it is imported (DeprecationWarnings)
_BOX2D_IMPORT_WARNINGS = r"builtin type (SwigPyPacked|SwigPyObject|swigvarlink) has no __module__ attribute"


def import_box2d(env_id: str) -> None:
    """For an id of Gymnasium's Box2D envs (LunarLander, BipedalWalker, CarRacing): import Box2D now, with its import
    warnings ignored. Raised as errors (`python -W error`, a test suite's filter of DeprecationWarnings) they crash
    the interpreter inside the extension's import: a segmentation fault, no sentence."""
    if "Box2D" in sys.modules or not gymnasium_family(env_id, "box2d") or importlib.util.find_spec("Box2D") is None:
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_BOX2D_IMPORT_WARNINGS, category=DeprecationWarning)
        try:
            import Box2D  # noqa: F401
        except ImportError:  # (a broken install: Gymnasium's make says it)
            pass


_mujoco_said: set[str] = set()


def _mujoco_warning(text: str) -> None:
    # MuJoCo calls this from its C code, where an exception must not escape (it aborts the process): a warning
    # filter that turns warnings into errors gets the text on stderr instead
    key = re.sub(r"Time = [^.]*\.?", "", text)  # (instability messages carry the simulation time)
    if key in _mujoco_said:  # (once per process: each env made would say it again)
        return
    _mujoco_said.add(key)
    try:
        if "deprecated" not in text:
            warnings.warn(f"MuJoCo: {text}", RuntimeWarning, stacklevel=2)
        elif (model := _model_file_loading()) is not None and _inside(model, Path(gym.__file__).parent):
            # (a model file of Gymnasium's own, HalfCheetah-v5's with MuJoCo 4: Gymnasium's to change, not the user's;
            # a DeprecationWarning of the file, hidden as Python hides a library's unless warnings are asked for)
            warnings.warn_explicit(f"MuJoCo: {text}", DeprecationWarning, str(model), 0, module="mujoco")
        else:  # (the user's model, or one not known: for the user to change, shown)
            warnings.warn(f"MuJoCo: {text}" + (f" (in {model})" if model is not None else ""), FutureWarning,
                          stacklevel=2)
    except Exception:
        sys.stderr.write(f"MuJoCo: {text}\n")


def _model_file_loading() -> Path | None:
    """The model file MuJoCo is loading from a Gymnasium MuJoCo env (its `fullpath`) while it calls
    `_mujoco_warning`, else None."""
    frame = sys._getframe(2)  # (the Python code that called into MuJoCo)
    for _ in range(4):
        if frame is None:
            break
        path = getattr(frame.f_locals.get("self"), "fullpath", None)
        if isinstance(path, str):
            return Path(path)
        frame = frame.f_back
    return None


def _inside(path: Path, folder: Path) -> bool:
    try:
        return path.resolve().is_relative_to(folder.resolve())
    except (OSError, RuntimeError):
        return False
