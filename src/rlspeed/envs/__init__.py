"""Batched envs: `make_env` gives N envs of any Gymnasium id (or a device-native version) as tensors."""

from __future__ import annotations

import numbers
import re
import typing
import warnings

import gymnasium as gym
import numpy as np
import torch

from rlspeed.device import resolve_device
from rlspeed.env_options import typed_options
from rlspeed.envs import atari
from rlspeed.envs.acrobot import Acrobot
from rlspeed.envs.base import (
    BatchedEnv,
    EnvSpec,
    EnvWrapper,
    EpisodeStatistics,
    ResetResult,
    StepResult,
    check_seed,
    find_wrapper,
)
from rlspeed.envs.cartpole import CartPole
from rlspeed.envs.envpool_env import INSTALL as ENVPOOL_INSTALL
from rlspeed.envs.envpool_env import (
    EnvPoolEnv,
    envpool_installed,
    envpool_only,
    envpool_options,
    envpool_refusal,
    envpool_task,
)
from rlspeed.envs.gym_view import NativeGymEnv, register_native_envs
from rlspeed.envs.gymnasium_env import (
    REJECTED_VALUE_ERRORS,
    GymnasiumEnv,
    closed_after,
    gym_spec,
    refuse_filming_envs,
    rejected_options,
    single_env_id,
)
from rlspeed.envs.mountain_car import MountainCar
from rlspeed.envs.mountain_car_continuous import MountainCarContinuous
from rlspeed.envs.native import NativeEnv
from rlspeed.envs.packages import (
    PACKAGE_FAMILIES,
    dependency_advice,
    import_box2d,
    import_gym_packages,
    install_command,
    missing_dependency,
    register_family,
    route_mujoco_messages,
)
from rlspeed.envs.pendulum import Pendulum
from rlspeed.envs.registry import NATIVE_ENVS
from rlspeed.envs.sb3_env import SB3VecEnv, is_sb3_vec_env
from rlspeed.envs.wrappers import CLIP, NormalizeObservation, NormalizeReward, RunningMeanStd
from rlspeed.errors import EnvStepError, UnusedSettingWarning, UserError, first_line, in_words, true_or_false

BACKENDS = ("auto", "torch", "gymnasium", "gymnasium-async", "envpool")

register_native_envs()  # `gymnasium.make("rlspeed/CartPole-v1")` etc.


#: On a CPU, few native envs step slower than Gymnasium's: a native step is a fixed set of small tensor ops whatever
#: N is, a Gymnasium env a few microseconds of Python each, so the native env wins only from some N on, which
#: depends on the env and the machine. This is the N from which `auto` takes the native env on a CPU;
#: `benchmarks/env_backends.py` measures the crossover per env (its latest run is in benchmarks/README.md).
CPU_NATIVE_MIN_ENVS = 16


def import_env_module(env_id: str) -> str:
    """For an `env_id` written `module:EnvId` (as `gymnasium.make` takes it), import `module`, which registers the
    env, and return `EnvId`; any other id is returned as it is. UserError when the module cannot be imported."""
    if ":" not in env_id:
        return env_id
    module, name = env_id.split(":", 1)
    import_gym_packages([module], f"(named in '{env_id}')")
    return name


#: Ids of Atari games as ale-py registers them: ALE/Pong-v5, PongNoFrameskip-v4, Pong-ramDeterministic-v4, ...
_ATARI_ID = re.compile(r"^(ALE/.+|.+(NoFrameskip|Deterministic)-v\d+|[A-Z][A-Za-z]+-ram-v\d+)$")
_ATARI_GAMES = ("Pong", "Breakout", "SpaceInvaders", "Seaquest", "Qbert", "BeamRider", "Enduro", "MsPacman",
                "Asteroids", "Atlantis", "Freeway", "MontezumaRevenge", "Boxing", "Alien", "Amidar", "Assault",
                "Asterix", "BankHeist", "BattleZone", "Bowling", "Centipede", "DemonAttack", "DoubleDunk",
                "Frostbite", "Gopher", "Gravitar", "IceHockey", "Jamesbond", "Kangaroo", "Krull", "KungFuMaster",
                "Pitfall", "PrivateEye", "Riverraid", "RoadRunner", "Robotank", "Skiing", "Solaris", "StarGunner",
                "Tennis", "TimePilot", "Tutankham", "UpNDown", "Venture", "VideoPinball", "WizardOfWor", "Zaxxon")


def _looks_like_atari(env_id: str) -> bool:
    return bool(_ATARI_ID.match(env_id)) or bool(re.match(rf"^({'|'.join(_ATARI_GAMES)})-v\d+$", env_id))


def _check_registered(env_id: str) -> None:
    """Register ale-py's envs on the first Atari id (`atari.register_atari`) and the envs of a `PACKAGE_FAMILIES`
    family on its first id; UserError saying what to install for an unregistered id of a known family, or that an id
    registered with a vector_entry_point only needs an entry_point."""
    register_family(env_id)
    if env_id in gym.registry:
        if gym.registry[env_id].entry_point is None:  # (gymnasium.make's "entry_point is not specified", exit 1)
            raise UserError(f"'{env_id}' is registered with a vector_entry_point only, and rlspeed makes its envs one "
                            "by one with gymnasium.make (and batches them itself), which needs an entry_point: "
                            f"register '{env_id}' with entry_point= a single env's class too.")
        route_mujoco_messages(env_id)
        import_box2d(env_id)
        return
    if not _looks_like_atari(env_id):
        return
    if not atari.register_atari():
        raise UserError(f"'{env_id}' is an Atari id, and Atari envs need ale-py and OpenCV (its preprocessing): "
                        f"{ATARI_INSTALL}.")


def _envpool_for_auto(env_id: str) -> bool:
    """Whether `auto` takes EnvPool for `env_id`: for Atari image ids, when EnvPool is installed (its C++ threads
    step, preprocess and stack the frames of all envs, which the Gymnasium backend does env by env in Python).
    MuJoCo and classic control stay on the Gymnasium (or native) envs, which step as fast or faster for the few
    envs their presets use; docs/atari-mujoco.md has the measurements and says how to re-measure."""
    return atari.is_atari(env_id) and envpool_task(env_id) is not None


#: What to install for Atari envs (ale-py, and OpenCV for Gymnasium's AtariPreprocessing): the `atari` extra
ATARI_INSTALL = install_command("ale_py")


def _dependency_error(env_id: str, error: BaseException) -> UserError | None:
    advice = dependency_advice(error)
    if advice is None:
        return None
    reason, by_extra = advice
    # (a newer version of the id helps where the old one needs a retired package, mujoco-py; not where the newer
    # one needs the same missing package, one of rlspeed's extras)
    newer = "" if by_extra else _newer_version(env_id)
    return UserError(f"Cannot make '{env_id}': {reason.rstrip('.')}{newer}.")


def _newer_version(env_id: str) -> str:
    """'; NAME-vK is registered' when Gymnasium registers a newer version of `env_id` (a MuJoCo v2/v3 id, which needs
    the retired mujoco-py, has a v5 that runs on the mujoco package); else ''."""
    try:
        namespace, name, version = gym.envs.registration.parse_env_id(env_id)
        newest = gym.envs.registration.find_highest_version(namespace, name)
    except gym.error.Error:
        return ""
    if version is None or newest is None or newest <= version:
        return ""
    return f"; use {gym.envs.registration.get_env_id(namespace, name, newest)}, which Gymnasium registers"


def _make_error(env_id: str, backend: str, error: BaseException) -> Exception:
    """What making an env that raised becomes: a UserError naming the missing package to install, else an
    `EnvStepError` naming the env and its error (one line from the CLI, exit 1; the env's traceback chained)."""
    dependency = (_dependency_error(env_id, error)
                  if isinstance(error, (ImportError, gym.error.DependencyNotInstalled)) else None)
    if dependency is not None:
        return dependency
    if backend == "gymnasium-async" and _in_daemonic_process(error):
        return UserError("The env subprocesses of backend 'gymnasium-async' cannot start in a daemonic process (a "
                         "multiprocessing.Pool worker, whose processes may not have children): use "
                         "env_backend='gymnasium' (one process) or 'torch' there, or run the sweep's workers with "
                         "concurrent.futures.ProcessPoolExecutor, whose processes may.")
    if backend == "gymnasium-async" and _unguarded_spawn(error):
        return UserError(f"The env subprocesses of backend 'gymnasium-async' could not start ({type(error).__name__}: "
                         f"{first_line(error)}): with the 'spawn' start method (the "
                         "default on macOS and Windows) each one imports your script again, so its code must be "
                         "under `if __name__ == \"__main__\":`; or use env_backend='gymnasium' (one process). (An "
                         "env that crashed while being made breaks the pipe too: its own error is printed above.)")
    return EnvStepError(env_id, backend, "make", error)


def _in_daemonic_process(error: BaseException) -> bool:
    """Whether making async envs failed because this process is daemonic (multiprocessing refuses it children with an
    AssertionError): the env is not at fault, so the error does not name it."""
    import multiprocessing

    return isinstance(error, AssertionError) and bool(multiprocessing.current_process().daemon)


def _unguarded_spawn(error: BaseException) -> bool:
    """Whether making async envs failed as it does where subprocesses are spawned (not forked) from a script without
    the `__main__` guard: the child's RuntimeError about the bootstrapping phase, or the parent's broken pipe to the
    child that died of it."""
    import multiprocessing

    if multiprocessing.get_start_method() == "fork":  # (set by the async env already: no side effect here)
        return False
    if isinstance(error, RuntimeError) and "bootstrapping phase" in str(error):
        return True
    return isinstance(error, (ConnectionResetError, BrokenPipeError, EOFError))


def resolve_backend(env_id: str, backend: str = "auto", num_envs: int | None = None,
                    device: str | torch.device | None = None) -> str:
    """Which backend `make_env` will use for `env_id` with `backend` (one of `BACKENDS`). `auto` picks the native
    env when one exists for the id, except on a CPU with fewer than `CPU_NATIVE_MIN_ENVS` envs (when `num_envs` and
    `device` are given), where Gymnasium's are faster; EnvPool for Atari ids when it is installed; else Gymnasium.
    `envpool` without EnvPool, or for an id it lacks, is a UserError naming what to do."""
    env_id = import_env_module(env_id)
    if backend not in BACKENDS:
        raise UserError(f"Unknown env backend '{backend}': use one of {', '.join(BACKENDS)}.")
    if backend == "envpool" and not envpool_installed():  # (named first: the id's own packages come with it)
        atari_too = _looks_like_atari(env_id) and not atari.register_atari()
        raise UserError(f"The envpool backend (--env-backend envpool) needs EnvPool: {ENVPOOL_INSTALL}"
                        + (f"; '{env_id}' also needs ale-py and OpenCV: {ATARI_INSTALL}" if atari_too else "") + ".")
    _check_registered(env_id)
    if backend == "auto":
        few_on_cpu = (num_envs is not None and num_envs < CPU_NATIVE_MIN_ENVS and device is not None
                      and torch.device(device).type == "cpu")
        if env_id in NATIVE_ENVS and not few_on_cpu:
            return "torch"
        return "envpool" if _envpool_for_auto(env_id) else "gymnasium"
    if backend == "envpool" and (refusal := envpool_refusal(env_id)) is not None:
        raise UserError(refusal)
    if backend == "torch" and env_id not in NATIVE_ENVS:
        raise UserError(f"No device-native version of '{env_id}' exists (native: {', '.join(NATIVE_ENVS)}); "
                        "use --env-backend gymnasium.")
    return backend


def env_spec(env_id: str, env_kwargs: dict | None = None) -> EnvSpec:
    """The EnvSpec of `env_id` without building N envs (validates the id; `module:EnvId` imports `module` first), made
    with the Gymnasium env options `env_kwargs` (recorded in the spec)."""
    env_id = import_env_module(env_id)
    env_kwargs = check_env_kwargs(env_kwargs)
    if env_id in NATIVE_ENVS and not env_kwargs:
        return NATIVE_ENVS[env_id].spec
    _check_registered(env_id)
    if (refusal := envpool_only(env_id)) is not None:  # (before gym_spec's 'Unknown env id')
        raise UserError(refusal)
    spec = gym_spec(env_id)
    refuse_filming_envs(env_id)
    env_kwargs = _typed_options(spec, env_kwargs)
    atari_game = atari.preprocessed(env_id, env_kwargs)
    if atari_game and (known := atari.known_spec(env_id, env_kwargs)) is not None:
        return atari.with_options(known, env_kwargs)
    try:
        env = atari.make_atari_env(spec.id, **env_kwargs) if atari_game else gym.make(spec.id, **env_kwargs)
    except UserError:
        raise
    except REJECTED_VALUE_ERRORS as error:
        if not env_kwargs:
            raise _make_error(env_id, "gymnasium", error) from error
        raise rejected_options(env_id, env_kwargs, error) from None
    except Exception as error:
        raise _make_error(env_id, "gymnasium", error) from error
    with closed_after(env, env_id, before_work=True):  # (an env whose close() raises: said here, before training)
        refuse_filming_envs(env_id, env)
        if atari_game:
            return atari.with_options(atari.atari_spec(env_id, env, env_kwargs), env_kwargs)
        # (the made env's time limit: a TimeLimit among the registration's additional_wrappers or put on by its entry
        # point sets it there, not in the registration)
        limit = env.spec.max_episode_steps if env.spec is not None else spec.max_episode_steps
        made = EnvSpec.from_spaces(env_id, env.observation_space, env.action_space, limit, spec.reward_threshold)
        return made.with_options(env_kwargs)


def backend_for_options(env_kwargs: dict, backend: str, env_id: str | None = None) -> str:
    """The env backend of a model or population whose env takes the options `env_kwargs`: Gymnasium's (what `auto`
    becomes; options are Gymnasium's env's, as `make_env` decides), or EnvPool's (which takes some of a MuJoCo id's,
    `envpool_options`, which checks them up front given the Gymnasium id `env_id`); UserError for another backend."""
    if env_kwargs and backend == "envpool" and env_id is not None and (task := envpool_task(env_id)) is not None:
        envpool_options(env_id, task, env_kwargs)
    if not env_kwargs or backend in ("gymnasium", "gymnasium-async", "envpool"):
        return backend
    if backend == "auto":
        return "gymnasium"
    raise UserError(in_words(f"--env-kwargs are options of Gymnasium's env: use --env-backend gymnasium (or "
                             f"gymnasium-async), not {backend}.",
                             f"env_kwargs are options of Gymnasium's env: use env_backend='gymnasium' (or "
                             f"'gymnasium-async'; --env-backend gymnasium on the command line), not '{backend}'."))


def _typed_options(spec: gym.envs.registration.EnvSpec, env_kwargs: dict) -> dict:
    """`env_kwargs` with the options the env's entry point declares a bool or an int given as one (2.0 as 2), and
    UserError for one given as text, a list or a mapping where it takes a bool or a number
    (`rlspeed.env_options.typed_options`)."""
    if not env_kwargs or spec.entry_point is None:
        return env_kwargs
    try:
        creator = (gym.envs.registration.load_env_creator(spec.entry_point) if isinstance(spec.entry_point, str)
                   else spec.entry_point)
    except Exception:  # (an entry point that does not load: gymnasium.make says so, as without options)  # noqa: BLE001
        return env_kwargs
    return typed_options(spec.id, creator, env_kwargs)


def check_env_kwargs(env_kwargs: object) -> dict[str, typing.Any]:
    """`env_kwargs` as a dict of Gymnasium env options keyed by name ({} for None); UserError for anything else."""
    if env_kwargs is None:
        return {}
    if not isinstance(env_kwargs, dict) or not all(isinstance(key, str) for key in env_kwargs):
        raise UserError(f"env_kwargs is a dict of the env's options by name (gymnasium.make(env_id, **env_kwargs)), "
                        f"got {env_kwargs!r:.80}.")
    return dict(env_kwargs)


#: The keywords a native env takes besides `num_envs`, `device` and `seed` (`NativeEnv.__init__`; no subclass adds
#: any). Native envs take no env options: every other keyword to `make_env` is a Gymnasium env option.
NATIVE_OPTIONS = ("state_dtype", "compile")


def make_env(env_id: str | gym.vector.VectorEnv | None = None, /, num_envs: int = 1,
             device: str | torch.device = "auto", seed: int | None = None, backend: str = "auto",
             normalize_obs: bool = False, normalize_reward: bool = False, gamma: float = 0.99, evaluation: bool = False,
             env_kwargs: dict[str, typing.Any] | None = None, episodic_life: bool = True, clip_rewards: bool = True,
             normalize_obs_clip: float = CLIP, normalize_reward_clip: float = CLIP, **kwargs: typing.Any) -> BatchedEnv:
    """Make `num_envs` copies of an env as one batched env on `device` (docs/envs.md, "The batched env contract").

    `env_id` may also be a Gymnasium vector env built by the user with SAME_STEP autoreset, or a Stable-Baselines3
    VecEnv (`SB3VecEnv`: its same-step resets and `terminal_observation` map onto the contract). `backend` is
    `auto` (the native torch env when one exists, unless fewer than 16 envs on a CPU; EnvPool for Atari ids when
    it is installed; else Gymnasium), `torch`, `gymnasium` (in-process), `gymnasium-async` (one subprocess
    per env) or `envpool` (`EnvPoolEnv`). The returned env reports raw episode returns in `info["episode_return"]`
    where `info["done"]`, and is seeded by `seed` on its first `reset()`. `normalize_obs` / `normalize_reward` wrap
    it in rlspeed's running normalisation of observations / rewards (the latter by the running std of returns
    discounted by `gamma`, as SB3's VecNormalize); `normalize_obs_clip` / `normalize_reward_clip` bound the normalised
    values to [-clip, clip] (10 by default, SB3's `clip_obs` / `clip_reward`; a model given the env takes them as
    its own clips where it leaves its at 10).

    Atari ids get the standard preprocessing (`rlspeed.envs.atari`: uint8 `[N, 4, 84, 84]` frame stacks) and, for
    training, a lost life ends the learner's episode (`episodic_life`) and rewards are clipped to their sign
    (`clip_rewards`): False leaves out either (RL-Zoo's `terminal_on_life_loss: False` and `clip_reward: False`);
    `evaluation=True` builds the evaluation variant without those two (full games, raw rewards). Other envs are the
    same either way, and ignore the two.

    Other keywords: `state_dtype=` and `compile=` are native-env options (`NativeEnv`) and make `auto` pick the
    native env; any other keyword is an option of the Gymnasium env (`gymnasium.make(env_id, **kwargs)`, e.g.
    `g=9.81` for Pendulum-v1) and makes `auto` pick Gymnasium, since native envs take no env options. Asking for
    both kinds at once, or for a kind the chosen backend does not take, is a UserError. The id is given first: a
    keyword `env_id=` after it is the env's option (Shimmy's `make_env("GymV26Environment-v0", env_id="CartPole-v1")`,
    as `gymnasium.make` takes it), and alone it is the id. `env_kwargs` gives Gymnasium env options as a dict,
    whatever their names (an env may take `seed` or `device`, which as keywords are `make_env`'s own); models and
    evaluation pass their recorded options there.
    """
    if env_id is None and "env_id" in kwargs:  # (make_env(env_id="CartPole-v1"): the id by name)
        env_id = kwargs.pop("env_id")
    if isinstance(num_envs, bool) or not isinstance(num_envs, numbers.Integral) or num_envs < 1:
        raise UserError(f"num_envs is a whole number of envs, at least 1, got {num_envs!r}.")
    num_envs = int(num_envs)
    device = resolve_device(device)
    seed = None if seed is None else check_seed(seed, limit_bits=63)  # (an evaluation's: a model's seed plus offsets)
    normalize_obs = true_or_false("make_env(normalize_obs=...)", normalize_obs)
    normalize_reward = true_or_false("make_env(normalize_reward=...)", normalize_reward)
    evaluation = true_or_false("make_env(evaluation=...)", evaluation)
    episodic_life = true_or_false("make_env(episodic_life=...)", episodic_life)
    clip_rewards = true_or_false("make_env(clip_rewards=...)", clip_rewards)
    clips = {}
    for name, value, flag in (("normalize_obs_clip", normalize_obs_clip, normalize_obs),
                              ("normalize_reward_clip", normalize_reward_clip, normalize_reward)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value < float("inf"):
            raise UserError(f"make_env's {name} must be a positive finite number (normalised values are clipped to "
                            f"[-{name}, {name}]), got {value!r}.")
        if value != CLIP and not flag:
            flag_name = name.removesuffix("_clip")
            warnings.warn(f"make_env's {name}={value:g} has no effect: it clips the values {flag_name} normalises, and "
                          f"{flag_name} is off.", UnusedSettingWarning, stacklevel=2)
        clips[name] = float(value)
    if isinstance(gamma, bool) or not isinstance(gamma, numbers.Real) or not 0 <= gamma <= 1:
        raise UserError(f"make_env's gamma (the discount of the returns normalize_reward scales by) must be a number "
                        f"in [0, 1], got {gamma!r}.")
    atari_game = False
    options = check_env_kwargs(env_kwargs)
    both = sorted(set(options) & set(kwargs))
    if both:
        raise UserError(f"make_env got the env option {both[0]} both as a keyword and in env_kwargs: give it once.")
    if isinstance(env_id, gym.vector.VectorEnv) or is_sb3_vec_env(env_id):
        kwargs = {**kwargs, **options}
        if num_envs not in (1, env_id.num_envs):  # (1: the default, whatever the vector env's size)
            raise UserError(f"make_env got a vector env of {env_id.num_envs} envs and num_envs={num_envs}: a vector "
                            "env is used as it is built (leave num_envs out, or build it with that many envs).")
        if kwargs:
            raise UserError(f"make_env(vector_env, ...) takes no env options ({', '.join(kwargs)}): the vector env "
                            "is already built, so pass them where you build it.")
        env: BatchedEnv = (GymnasiumEnv(vector_env=env_id, device=device) if isinstance(env_id, gym.vector.VectorEnv)
                           else SB3VecEnv(env_id, device=device))
    else:
        _check_env_id(env_id)
        env_id = import_env_module(env_id)
        _check_registered(env_id)
        native_kwargs = {name: value for name, value in kwargs.items() if name in NATIVE_OPTIONS}
        env_kwargs = {**{name: value for name, value in kwargs.items() if name not in NATIVE_OPTIONS}, **options}
        if native_kwargs and env_kwargs:
            raise UserError(f"make_env got native-env options ({', '.join(native_kwargs)}) and Gymnasium env "
                            f"options ({', '.join(env_kwargs)}): native envs take no env options, and Gymnasium "
                            "envs take no native options.")
        if backend == "auto" and env_kwargs:
            backend = "gymnasium"  # env options exist only for Gymnasium's envs
        # native-only options (compile=..., state_dtype=...) ask for the native env whatever the number of envs
        chosen = resolve_backend(env_id, backend, None if native_kwargs else num_envs, device)
        atari_game = atari.preprocessed(env_id, env_kwargs)
        if chosen == "torch":
            if env_kwargs:
                raise UserError(f"The native env '{env_id}' takes no env options ({', '.join(env_kwargs)}); its "
                                f"options are {', '.join(NATIVE_OPTIONS)}. Use backend='gymnasium' to pass env options "
                                "to gymnasium.make.")
            env = NATIVE_ENVS[env_id](num_envs=num_envs, device=device, seed=seed, **native_kwargs)
        else:
            if native_kwargs:
                raise UserError(f"The native-env options ({', '.join(native_kwargs)}) apply only to backend "
                                f"'torch', not to '{chosen}'.")
            if chosen == "envpool":  # (options of MuJoCo ids EnvPool takes alike; others refused: `envpool_options`)
                if env_kwargs:
                    env_kwargs = _typed_options(gym_spec(env_id), env_kwargs)
                env = EnvPoolEnv(env_id, num_envs=num_envs, device=device, seed=seed, env_kwargs=env_kwargs)
            else:
                vectorization = "async" if chosen == "gymnasium-async" else "sync"
                kind = atari.AtariGymnasiumEnv if atari_game else GymnasiumEnv
                env_kwargs = _typed_options(gym_spec(env_id), env_kwargs)
                try:
                    env = kind(env_id, num_envs=num_envs, device=device, vectorization=vectorization,
                               env_kwargs=env_kwargs)
                except UserError:
                    raise
                except Exception as error:
                    raise _make_error(env_id, chosen, error) from error
    env = EpisodeStatistics(env)
    if atari_game and not evaluation:
        # outside EpisodeStatistics: reported episodes stay whole games, raw scores
        env = atari.AtariTraining(env, episodic_life, clip_rewards)
    return normalised(SeedOnFirstReset(env, seed), normalize_obs, normalize_reward, gamma,
                      clips["normalize_obs_clip"], clips["normalize_reward_clip"])


def normalised(env: BatchedEnv, normalize_obs: bool, normalize_reward: bool, gamma: float = 0.99,
               obs_clip: float = CLIP, reward_clip: float = CLIP) -> BatchedEnv:
    """`env` with the running-statistics normalisation asked for that it lacks (`NormalizeObservation`, then
    `NormalizeReward` outermost, as `make_env` builds them, clipping at `obs_clip` and `reward_clip`); a
    normalisation it has already is kept, not doubled."""
    if normalize_obs and getattr(env, "obs_rms", None) is None:
        env = NormalizeObservation(env, clip=obs_clip)
    if normalize_reward and getattr(env, "return_rms", None) is None:
        env = NormalizeReward(env, gamma=gamma, clip=reward_clip)
    return env


def remakeable(env_id: str) -> bool:
    """Whether `make_env` can make envs of `env_id` (a registered Gymnasium id, once its module is imported for a
    `module:EnvId` id and its family's or Atari's envs registered, or a native env's), judged from the registry alone
    without making one: not the id of an env a user built and passed in. A package the id needs and lacks is the
    UserError saying what to install, not False."""
    try:
        env_id = import_env_module(env_id)
    except UserError:  # (a `team:counter-v0` id of an env one built: no module to import, nothing to make)
        return False
    _check_registered(env_id)
    return env_id in gym.registry or env_id in NATIVE_ENVS


def seeded(env: BatchedEnv, seed: int | None) -> BatchedEnv:
    """`env` (passed to a model with `seed=`) seeded by `seed` on its next reset, unless `make_env` gave it a seed: its
    `SeedOnFirstReset` takes the seed, or one is added outermost (a batched env of the user's own)."""
    inner = find_wrapper(env, SeedOnFirstReset)
    if inner is None:
        return SeedOnFirstReset(env, seed)
    inner.seed_unless_given(seed)
    return env


def _check_env_id(env_id, caller: str = "make_env", also: str = "") -> None:
    """UserError unless `env_id` is a str, saying what `caller` (the function or class the user called: `PPO`, not the
    `make_env` it calls) accepts instead of other kinds of envs: an id, a vector env, and what `caller` takes `also`
    (", a single gymnasium.Env")."""
    if isinstance(env_id, str):
        return
    kind = type(env_id).__name__
    accepted = (f"{caller} takes a Gymnasium env id (str){also}, a Gymnasium vector env made with "
                "autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP, or a Stable-Baselines3 VecEnv")
    if isinstance(env_id, BatchedEnv):
        raise UserError(f"{accepted}; this env ({kind}) is a batched env already (one make_env made, or your own "
                        "BatchedEnv): give it to the algorithm as it is (Algo(env)).")
    if isinstance(env_id, gym.Env):
        registered = single_env_id(env_id)  # (its id only where the id makes this env, rendering nothing)
        by_id = f"give its id ('{registered}'), or " if isinstance(registered, str) else ""
        raise UserError(f"{accepted}, not a single gymnasium.Env ({kind}): {by_id}wrap it as Stable-Baselines3's "
                        "DummyVecEnv([lambda: env]) or gymnasium.vector.SyncVectorEnv([lambda: env], "
                        "autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP).")
    if _multi_agent(env_id):  # (reset, step and spaces too, but one per agent: SuperSuit's route, not Shimmy's)
        convert = (", an AEC env first made a parallel one by pettingzoo.utils.aec_to_parallel(env)"
                   if callable(getattr(env_id, "agent_iter", None)) else "")
        raise UserError(f"{accepted}, not a PettingZoo env ({kind}): SuperSuit makes a parallel env a "
                        "Stable-Baselines3 VecEnv of one row per agent, supersuit.concat_vec_envs_v1("
                        f"supersuit.pettingzoo_env_to_vec_env_v1(env), 1, base_class=\"stable_baselines3\"){convert} "
                        "(docs/envs.md, PettingZoo).")
    if _env_like(env_id):  # (reset, step and spaces, no gymnasium.Env: the gym package's, or the old gym API's)
        raise UserError(f"{accepted}, not a single env ({kind}) of the gym package or the old gym API: "
                        f"{_old_env_adapter(env_id)}.")
    if callable(env_id):  # (an env factory, as SB3's make_vec_env and Gymnasium's vector envs take)
        what = "class" if isinstance(env_id, type) else "function"
        raise UserError(f"{accepted}, not a {what} ({getattr(env_id, '__name__', kind)}): give the vector env of the "
                        f"envs it makes, gymnasium.vector.SyncVectorEnv([{what}] * N, "
                        "autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP).")
    shown = repr(env_id) if len(repr(env_id)) <= 60 else f"{repr(env_id)[:57]}..."
    raise UserError(f"{accepted}, not {shown} ({'an' if kind[:1].lower() in 'aeiou' else 'a'} {kind}).")



def _env_like(env) -> bool:
    """Whether `env` (no gymnasium.Env) has an env's methods and spaces: an env of the gym package or written for the
    old gym API, which Shimmy adapts."""
    return (not isinstance(env, type) and callable(getattr(env, "reset", None)) and callable(getattr(env, "step", None))
            and hasattr(env, "observation_space") and hasattr(env, "action_space"))


def _multi_agent(env) -> bool:
    """Whether `env` is a PettingZoo env (parallel or AEC, or a wrapper of one): its agents' names in
    `possible_agents`, or a class of PettingZoo's among its bases."""
    return (not isinstance(env, type) and (hasattr(env, "possible_agents") or any(
        klass.__module__.split(".")[0] == "pettingzoo" for klass in type(env).__mro__)))


def _old_env_adapter(env) -> str:
    """How to adapt a single env of the gym package or the old gym API (`_env_like`) into a vector env rlspeed takes:
    Shimmy's adapter by its reset's signature (a `seed` parameter: gym 0.26's API; else the old one, as
    Stable-Baselines3 decides), which converts only gym's spaces."""
    import inspect

    try:
        new_api = "seed" in inspect.signature(env.reset).parameters
    except (TypeError, ValueError):
        new_api = False
    adapter = "GymV26CompatibilityV0" if new_api else "GymV21CompatibilityV0"
    spaces = (env.observation_space, env.action_space)
    if any(isinstance(space, gym.spaces.Space) for space in spaces):  # (Shimmy converts gym's spaces, no others)
        return ("its spaces are Gymnasium's already, so make it a gymnasium.Env whose reset returns (obs, info) and "
                "step (obs, reward, terminated, truncated, info) (Shimmy's GymV21CompatibilityV0 adapts only envs "
                "whose spaces are gym's), then wrap it as Stable-Baselines3's DummyVecEnv([lambda: env])")
    return (f"wrap it as shimmy.{adapter}(env=env) (pip install shimmy gym), then as Stable-Baselines3's "
            f"DummyVecEnv([lambda: adapted]) or gymnasium.vector.SyncVectorEnv([lambda: adapted], "
            "autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP)")


def _backend_name(env: BatchedEnv) -> str:
    """`env`'s backend as users name it (`GymnasiumEnv.backend_name`: gymnasium-async for subprocess envs)."""
    return getattr(env.unwrapped, "backend_name", env.backend)

#: Python's TypeError for a `reset` without Gymnasium's keyword arguments (`def reset(self):`)
_RESET_WITHOUT = re.compile(r"reset\(\) got an unexpected keyword argument '(seed|options)'")


#: the tensor dtypes that hold no whole numbers (floating point, complex, bool), which a Discrete or MultiDiscrete
#: action space's step refuses (a set: looked up on every step)
_NOT_WHOLE_DTYPES = frozenset(dtype for dtype in vars(torch).values() if isinstance(dtype, torch.dtype) and (
    dtype.is_floating_point or dtype.is_complex or dtype == torch.bool))


class NamesEnvErrors(EnvWrapper):
    """Turns an exception raised from inside the env's `reset` or `step` into an `EnvStepError` naming the env, the
    call and the options it was made with (one line from the CLI, exit 1; the env's traceback chained). rlspeed's own
    `UserError`s (a broken contract, a bad mask) pass as they are, and so does a reset that does not take Gymnasium's
    `seed` or `options` as a UserError: the env's signature breaks Gymnasium's API, which the user can fix."""

    def reset(self, seed: int | None = None) -> ResetResult:
        try:
            return self.env.reset(seed=seed)
        except (UserError, EnvStepError):
            raise
        except Exception as error:
            missing = _RESET_WITHOUT.search(str(error)) if isinstance(error, TypeError) else None
            if missing:
                raise UserError(f"'{self.spec.env_id}'.reset() takes no {missing[1]} argument: Gymnasium's reset is "
                                "reset(self, seed=None, options=None), calling super().reset(seed=seed) (which seeds "
                                "self.np_random).") from error
            raise EnvStepError(self.spec.env_id, _backend_name(self), "reset", error,
                               self.spec.env_kwargs or ()) from error

    def step(self, actions: torch.Tensor) -> StepResult:
        # (a list or an array reached the backend's `.device` or `.numpy()`, an AttributeError named as the env's; a
        # tensor of another number of rows was stepped silently, a native env broadcasting or a Gymnasium one
        # dropping rows)
        if not isinstance(actions, torch.Tensor) or actions.ndim == 0 or actions.shape[0] != self.num_envs:
            got = (f"a tensor of shape {list(actions.shape)}" if isinstance(actions, torch.Tensor)
                   else f"a {type(actions).__name__}")
            raise UserError(f"'{self.spec.env_id}'.step takes the actions as a torch tensor with one row per env "
                            f"({self.num_envs} rows), got {got}: e.g. torch.as_tensor(actions, device=env.device).")
        space = self.spec.action_space
        whole = isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete))
        if whole and actions.dtype in _NOT_WHOLE_DTYPES:
            raise UserError(f"'{self.spec.env_id}'.step takes whole-number actions for its {space}, got a "
                            f"{actions.dtype} tensor: e.g. actions.long().")
        try:
            return self.env.step(actions)
        except (UserError, EnvStepError):
            raise
        except Exception as error:
            outside = _outside_space(actions, space) if whole else None  # (looked at only once the env raised)
            if outside is not None:
                raise UserError(f"'{self.spec.env_id}'.step got the action {outside}, outside its action space "
                                f"{space}.") from error
            raise EnvStepError(self.spec.env_id, _backend_name(self), "step", error,
                               self.spec.env_kwargs or ()) from error


def _outside_space(actions: torch.Tensor, space: gym.spaces.Discrete | gym.spaces.MultiDiscrete):
    """The first row of `actions` (whole numbers, one row per env) outside the Discrete or MultiDiscrete `space`, as a
    Python value, or None where every row is inside it."""
    rows = actions.detach().cpu().numpy()
    low = np.asarray(space.start)
    high = low + (space.n if isinstance(space, gym.spaces.Discrete) else space.nvec) - 1
    rows = rows.reshape(len(rows), *np.shape(low))
    bad = ((rows < low) | (rows > high)).reshape(len(rows), -1).any(axis=1)
    return rows[np.flatnonzero(bad)[0]].tolist() if bad.any() else None


class SeedOnFirstReset(NamesEnvErrors):
    """Applies the seed given to `make_env` on the first `reset()`, unless that reset passes a seed itself.

    Any reset uses up the pending seed: after `reset(seed=1)`, a plain `reset()` continues the streams of seed 1
    rather than restarting them from `make_env`'s seed.
    """

    def __init__(self, env: BatchedEnv, seed: int | None):
        super().__init__(env)
        self._pending_seed = seed
        self._seed_given = seed is not None

    def seed_unless_given(self, seed: int | None) -> None:
        """Take `seed` for the next reset where `make_env` was given none (a model's `seed=` for an env passed in)."""
        if not self._seed_given:
            self._pending_seed = seed

    def reset(self, seed: int | None = None) -> ResetResult:
        if seed is None:
            seed = self._pending_seed
        self._pending_seed = None
        return super().reset(seed=seed)


__all__ = ["BatchedEnv", "EnvSpec", "EnvWrapper", "GymnasiumEnv", "SB3VecEnv", "NativeEnv", "NativeGymEnv",
           "CartPole", "Pendulum", "Acrobot", "MountainCar", "MountainCarContinuous", "NormalizeObservation",
           "NormalizeReward", "RunningMeanStd", "EnvPoolEnv", "NATIVE_ENVS", "CPU_NATIVE_MIN_ENVS", "make_env",
           "NamesEnvErrors", "SeedOnFirstReset", "env_spec", "resolve_backend", "import_env_module",
           "import_gym_packages", "check_env_kwargs", "backend_for_options", "missing_dependency", "EnvStepError",
           "PACKAGE_FAMILIES", "register_family"]
