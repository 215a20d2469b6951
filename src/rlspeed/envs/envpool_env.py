"""EnvPool backend: EnvPool's batched C++ envs (Atari, MuJoCo, classic control) under the batched env contract.

EnvPool (the `envpool` extra) resets a finished env on the NEXT step, ignoring that step's
action. The contract is SAME_STEP, so this adapter resets finished envs right after the step that finished them
(`reset(env_ids)`, which clears their done flag, so the next step steps them): the step's observations of finished
rows become `info["final_obs"]` and the reset ones take their place in `obs`.

Atari ids map to EnvPool's `<Game>-v5` task with the same preprocessing as `rlspeed.envs.atari` (no-op reset 30,
frame skip 4 with max-pooling, 84x84 grey, 4 stacked frames, the id's sticky-action probability, no fire on reset)
and full games; the training-only transforms (episodic life, reward clipping) are `AtariTraining`, as for the
Gymnasium backend, fed by `info["lives"]`. What still differs from the Gymnasium backend: EnvPool's own random
streams (the same seed gives other games and no-op counts) and its own resize code (pixels may differ by one level).

Other ids are EnvPool's env of the same name. Where that env is another task than Gymnasium's id, it is refused
(`OTHER_TASKS`, in `envpool_refusal`); where it has Gymnasium's spaces but other values, it is warned of once
(`OTHER_VALUES`).
"""

from __future__ import annotations

import functools
import importlib.util
import random
import re
import warnings

import gymnasium as gym
import numpy as np
import torch

from rlspeed.envs import atari
from rlspeed.envs.base import (
    BatchedEnv,
    EnvSpec,
    ResetResult,
    StepResult,
    constructor_parameters,
    numpy_dtype,
    observation_layout,
)
from rlspeed.envs.gymnasium_env import close_other_backend, float32_rewards
from rlspeed.envs.packages import gymnasium_family, install_command
from rlspeed.errors import UserError, warn_at_caller

#: What to install for the envpool backend (`install_command`: rlspeed's extra)
INSTALL = install_command("envpool")


def envpool_installed() -> bool:
    """Whether the envpool package can be imported."""
    return importlib.util.find_spec("envpool") is not None


def unwritable_at_import(error: BaseException) -> tuple[str, str] | None:
    """(what is wrong, what to do) where importing envpool failed writing a directory it makes as it loads
    (envpool 1.2 makes matplotlib's config directory /tmp/envpool-jumanji-matplotlib whatever TMPDIR says: a
    read-only /tmp, a container's), else None."""
    if not isinstance(error, OSError) or error.filename is None:
        return None
    where = str(error.filename)
    fix = ("set MPLCONFIGDIR (matplotlib's config directory, which envpool makes there otherwise) to a directory you "
           "can write to" if "matplotlib" in where else f"make '{where}' writable")
    return f"envpool cannot be imported: it writes '{where}' as it loads ({error.strerror or error})", fix


def import_envpool():
    """`import envpool`; UserError in one sentence where it fails writing as it loads (`unwritable_at_import`)."""
    try:
        import envpool
    except OSError as error:
        problem = unwritable_at_import(error)
        if problem is None:
            raise
        raise UserError(f"{problem[0]}: {problem[1]}.") from error
    return envpool


@functools.cache
def _all_envpool_ids() -> frozenset[str]:
    """EnvPool's task ids (`envpool.list_all_envs()`, fixed for the installed EnvPool): read once a process."""
    return frozenset(import_envpool().list_all_envs())


#: EnvPool's time limit for an env without one (C++'s INT_MAX): Blackjack, CliffWalking and its slippery version,
#: which Gymnasium registers without a time limit; `EnvPoolEnv` reports it as none (None), as Gymnasium does, so
#: an evaluation caps such episodes at `evaluation.UNLIMITED_EPISODE_STEPS` steps, not 2**31 - 1
ENVPOOL_NO_TIME_LIMIT = 2**31 - 1

#: ids EnvPool has under Gymnasium's name whose task is another one: what differs, named when the envpool backend is
#: refused for them (a model built from Gymnasium's env would train on another task, or not take its observations)
OTHER_TASKS = {
    "Blackjack-v1": "EnvPool's Blackjack-v1 gives its observations as Box(0, 31, (3,), int32), not as Gymnasium's "
                    "Tuple of three Discretes, and plays Sutton and Barto's rules (sab=True: a natural beats a "
                    "dealer's 21 of three or more cards), where Gymnasium's plays sab=False",
}

#: ids whose EnvPool env has Gymnasium's spaces but gives other observations or rewards: what differs, warned of once
#: per id in a process when an `EnvPoolEnv` is made (the model trains, on EnvPool's version of the task)
OTHER_VALUES = {
    "Humanoid-v4": "EnvPool's Humanoid-v4 gives its 84 contact forces (cfrc_ext) as 0 at every step, where "
                   "Gymnasium's gives the simulated ones; Humanoid-v5 is the same on both",
    "HumanoidStandup-v4": "EnvPool's HumanoidStandup-v4 gives its 84 contact forces (cfrc_ext) as 0 at every step, "
                          "where Gymnasium's gives the simulated ones, so its rewards lack Gymnasium's impact cost "
                          "(0.5e-6 times the squared contact forces' sum, at most 10 a step); HumanoidStandup-v5 is "
                          "the same on both",
}
_WARNED_VALUES: set[str] = set()

#: what a neighbouring EnvPool version lacks beside the Gymnasium id, said where the id is refused and it is named
_NEIGHBOUR_NOTES = {"Taxi-v4": "the same task by default but without the action masks in info['action_mask'] that "
                               "Gymnasium's Taxi-v4 gives"}


def envpool_refusal(env_id: str) -> str | None:
    """The one sentence refusing `--env-backend envpool` for `env_id` (EnvPool installed), or None where EnvPool gives
    it: EnvPool lacks the id (naming the other versions of it EnvPool has, which the backend does not swap in), or
    has a task of that name that differs from Gymnasium's (`OTHER_TASKS`)."""
    if env_id in OTHER_TASKS:
        return f"{OTHER_TASKS[env_id]}; use --env-backend gymnasium."
    if envpool_task(env_id) is not None:
        return None
    name = env_id.rsplit("-v", 1)[0]
    others = sorted(task for task in _all_envpool_ids() if task.rsplit("-v", 1)[0] == name and task != env_id)
    versions = ""
    if others and not atari.is_atari(env_id):
        versions = (f"; it has {', '.join(others)}, {'another version' if len(others) == 1 else 'other versions'} "
                    f"of it, {_NEIGHBOUR_NOTES.get(env_id, 'not taken in its place')}")
    return (f"EnvPool has no env for '{env_id}' (`envpool.list_all_envs()` lists its ids{versions}); use "
            "--env-backend gymnasium.")


def envpool_only(env_id: str) -> str | None:
    """Where Gymnasium registers no `env_id` and EnvPool (installed) has it (Taxi-v3, LunarLander-v2, its dm_control
    and Atari `<Game>-v5` ids): the sentence saying that models take Gymnasium ids (their spec, evaluations, videos and
    resumed runs make the env again from the id), naming Gymnasium's versions of it with the backend that runs them
    (`gymnasium_versions`), and how a model trains on EnvPool's env in Python all the same; else None."""
    if env_id in gym.registry or not envpool_installed() or env_id not in _all_envpool_ids():
        return None
    return (f"'{env_id}' is EnvPool's id, which Gymnasium does not register, and rlspeed's models take Gymnasium ids "
            f"(they make the env again from its id to evaluate, film and resume a run): {gymnasium_versions(env_id)}; "
            f"in Python a model also trains on the env make_env('{env_id}', backend='envpool') makes, evaluated on "
            "another such env, rlspeed.evaluate(model, env).")


def gymnasium_versions(env_id: str) -> str:
    """The Gymnasium ids of EnvPool's id `env_id`'s env, in words, each with the backend that runs it ("Gymnasium has
    LunarLander-v3 (EnvPool runs it too: --env-backend envpool)"; `envpool_refusal`), or that there is none."""
    atari.register_atari()  # (ale-py's ids, for EnvPool's `<Game>-v5` of a game `_looks_like_atari` does not list)
    name = env_id.rsplit("-v", 1)[0].lower()  # (as `envpool_task` matches them: EnvPool's TicTacToe3d is ale-py's 3D)
    # (in order of their version numbers: Taxi-v10 after Taxi-v4)
    versions = sorted((other for other in gym.registry if other.removeprefix("ALE/").rsplit("-v", 1)[0].lower() == name
                       and gym.registry[other].entry_point),
                      key=lambda other: (gym.registry[other].version or 0, other))
    runs = [other for other in versions if envpool_refusal(other) is None]
    lacks = [other for other in versions if other not in runs]
    said = ([f"{', '.join(runs)} (EnvPool runs {'it' if len(runs) == 1 else 'them'} too: --env-backend envpool)"]
            if runs else []) + ([f"{', '.join(lacks)} (--env-backend gymnasium: EnvPool has no env for "
                                 f"{'it' if len(lacks) == 1 else 'them'})"] if lacks else [])
    if said:
        return "Gymnasium has " + " and ".join(said)
    if _robotics_port(env_id):  # (Gymnasium-Robotics registers its ids as its module is imported)
        return (f"Gymnasium registers no version of it, Gymnasium-Robotics registers {env_id} (pip install "
                f"gymnasium-robotics; name its module before the id: gymnasium_robotics:{env_id})")
    return "Gymnasium registers no version of it"


def _robotics_port(env_id: str) -> bool:
    """Whether EnvPool's `env_id` is its port of a Gymnasium-Robotics env (Fetch, Adroit, PointMaze, ...: its spec
    class is one of `GymnasiumRobotics...`)."""
    spec = getattr(getattr(import_envpool(), "registration", None), "registry", None)
    entry = getattr(spec, "specs", {}).get(env_id)
    return isinstance(entry, tuple) and len(entry) > 1 and str(entry[1]).startswith("GymnasiumRobotics")


def envpool_task(env_id: str) -> str | None:
    """EnvPool's task id for a Gymnasium id (Atari image ids as `<Game>-v5`; others by their own name), or None
    when EnvPool lacks it or is not installed."""
    if not envpool_installed():
        return None
    ids = _all_envpool_ids()
    if atari.atari_image_id(env_id):
        game = _atari_game(env_id)
        task = f"{game}-v5" if game else None
        if task is not None and task not in ids:  # (ale-py's TicTacToe3D is EnvPool's TicTacToe3d)
            task = next((other for other in ids if other.lower() == task.lower()), None)
        return task
    return env_id if env_id in ids else None


#: Gymnasium MuJoCo env options EnvPool's env of the same id takes under the same name and meaning (checked equal by
#: short fixed-action rollouts on both backends, tests/test_envpool.py); Gymnasium's `*_range` options are
#: EnvPool's `*_min` / `*_max` pair (`envpool_options`)
MUJOCO_OPTIONS = ("ctrl_cost_weight", "forward_reward_weight", "healthy_reward", "terminate_when_unhealthy",
                  "reset_noise_scale", "exclude_current_positions_from_observation", "contact_cost_weight")
MUJOCO_RANGES = ("healthy_z_range", "healthy_state_range", "healthy_angle_range", "contact_force_range")


def envpool_options(env_id: str, task: str, env_kwargs: dict) -> dict:
    """`env_kwargs`, Gymnasium env options of `env_id`, as the options of EnvPool's `task`: for MuJoCo ids those in
    `MUJOCO_OPTIONS` EnvPool's task has, and the `MUJOCO_RANGES` as its `*_min` / `*_max` keys where those give the
    range exactly (a range whose end EnvPool has no key for must leave that end infinite, Gymnasium's default); any
    other option is a UserError naming it and the backend that takes it."""
    if not env_kwargs:
        return {}
    use_gymnasium = "use --env-backend gymnasium (backend='gymnasium'), which passes them to gymnasium.make"
    if not gymnasium_family(env_id, "mujoco"):
        raise UserError(f"The envpool backend takes env options only for MuJoCo ids, not for '{env_id}' "
                        f"({', '.join(env_kwargs)}): {use_gymnasium}.")
    config = import_envpool().make_spec(task).config._asdict()
    # (the options Gymnasium's env declares: an option it lacks is refused here as gymnasium.make refuses it; none
    # where Gymnasium's env cannot be loaded, MuJoCo's Python package missing, and EnvPool's own check below decides)
    declared = [parameter.name for parameter in constructor_parameters(gym.spec(env_id).entry_point)]
    lacking = [name for name in env_kwargs if declared and name not in declared]
    if lacking:
        raise UserError(f"Gymnasium's {env_id} takes no env option {', '.join(lacking)}, so neither does the envpool "
                        "backend, which takes Gymnasium's options EnvPool's env has.")
    options, refused = {}, []
    for name, value in env_kwargs.items():
        if name in MUJOCO_OPTIONS and name in config:
            default = config[name]
            if isinstance(default, bool):
                if not isinstance(value, (bool, np.bool_)):
                    raise UserError(f"The env option {name} is true or false, got {value!r}.")
                options[name] = bool(value)
            elif isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise UserError(f"The env option {name} is a number, got {value!r}.")
            else:
                options[name] = float(value)
            continue
        base = name.removesuffix("_range")
        if name in MUJOCO_RANGES and (f"{base}_min" in config or f"{base}_max" in config):
            try:
                low, high = (float(end) for end in value)
            except (TypeError, ValueError):
                raise UserError(f"The env option {name} is a pair of numbers (low, high), got {value!r}.") from None
            for key, end, unbounded in ((f"{base}_min", low, -np.inf), (f"{base}_max", high, np.inf)):
                if key in config:
                    options[key] = end
                elif end != unbounded:
                    raise UserError(f"EnvPool's {task} bounds {base} only {'above' if key.endswith('min') else 'below'}"
                                    f" ({'_max' if key.endswith('min') else '_min'}), so {name}={tuple(value)!r} with"
                                    f" a finite {'low' if key.endswith('min') else 'high'} end is not its option; "
                                    f"{use_gymnasium}.")
            continue
        refused.append(name)
    if refused:
        taken = ", ".join(MUJOCO_OPTIONS + MUJOCO_RANGES)
        raise UserError(f"EnvPool's {task} does not take the env option{'s' if len(refused) > 1 else ''} "
                        f"{', '.join(refused)} as Gymnasium's does (it takes {taken} where the id has them); "
                        f"{use_gymnasium}.")
    return options


def check_envpool_seeds(seed: int, count: int) -> None:
    """UserError unless `count` EnvPool envs seeded `seed` (env i with `seed + i`) all get seeds EnvPool takes, C++
    ints below 2**31 (a larger seed stopped EnvPool on a bare AssertionError; env seeds past it wrapped round)."""
    if not 0 <= seed <= 2**31 - count:
        raise UserError(f"EnvPool seeds env i with seed + i, below 2**31: a seed of {seed} leaves room for "
                        f"{max(0, 2**31 - seed)} envs, not {count}; give a smaller seed, or another env backend "
                        "(gymnasium, or torch where the env has a native one).")


def _atari_game(env_id: str) -> str | None:
    """The game's CamelCase name in an Atari id: ALE/Breakout-v5, BreakoutNoFrameskip-v4, Breakout-v4 -> Breakout."""
    match = re.match(r"^(?:ALE/)?([A-Za-z0-9]+?)(?:NoFrameskip|Deterministic)?-v\d+$", env_id)
    return match.group(1) if match else None


def _float32(space: gym.Space) -> gym.Space:
    """EnvPool's float64 Boxes (MuJoCo) as the float32 ones the contract gives (and Gymnasium's MuJoCo actions)."""
    if isinstance(space, gym.spaces.Box) and np.issubdtype(space.dtype, np.floating) and space.dtype != np.float32:
        return gym.spaces.Box(space.low.astype(np.float32), space.high.astype(np.float32), space.shape, np.float32)
    return space


def _observation_bounds(space: gym.Space) -> gym.Space:
    """`space` unbounded where EnvPool bounds it by float32's smallest positive number below and its largest above
    (its Box2D envs' observations, LunarLander's and BipedalWalker's: every negative observation was outside the
    space the env reported, at every step)."""
    if not isinstance(space, gym.spaces.Box) or space.dtype != np.float32:
        return space
    low, high = space.low.copy(), space.high.copy()
    low[low == np.finfo(np.float32).tiny] = -np.inf
    high[high == np.finfo(np.float32).max] = np.inf
    return gym.spaces.Box(low, high, space.shape, np.float32)


class EnvPoolEnv(BatchedEnv):
    """`num_envs` EnvPool envs of one task, stepped together (EnvPool's sync mode), SAME_STEP autoreset.

    `env_id`: the Gymnasium id of a task EnvPool has (UserError otherwise, or where EnvPool's is another task:
    `envpool_refusal`); `num_threads`: EnvPool's, the threads that step the envs (0: EnvPool's default).
    `seed` seeds the pool when it is made (EnvPool seeds env i with `seed + i`, below 2**31: `check_envpool_seeds`);
    `reset(seed=s)` with another seed makes the pool afresh with `s`, since EnvPool cannot reseed a pool. Atari ids
    add `info["lives"]`. `env_kwargs`: Gymnasium env options of a MuJoCo id, those EnvPool's env takes with the same
    meaning (`envpool_options`; any other is a UserError), recorded in `spec.env_kwargs`.
    """

    backend = "envpool"

    def __init__(self, env_id: str, num_envs: int = 1, device: torch.device | str = "cpu", seed: int | None = None,
                 num_threads: int = 0, env_kwargs: dict | None = None):
        if not envpool_installed():
            raise UserError(f"The envpool backend needs EnvPool: {INSTALL}.")
        refusal = envpool_refusal(env_id)
        if refusal is not None:
            raise UserError(refusal)
        task = envpool_task(env_id)
        env_kwargs = dict(env_kwargs or {})
        options = envpool_options(env_id, task, env_kwargs)  # (refused before the warning below)
        if env_id in OTHER_VALUES and env_id not in _WARNED_VALUES:
            _WARNED_VALUES.add(env_id)
            # (one env for both uses: `rlspeed train` and `rlspeed eval` make it alike, so the sentence names both)
            warn_at_caller(f"{OTHER_VALUES[env_id]}: a model trained there learns from, and one evaluated there is "
                           "scored on, other values than --env-backend gymnasium (env_backend='gymnasium') gives.",
                           UserWarning)
        self.env_id, self.task, self.num_envs, self.device = env_id, task, num_envs, torch.device(device)
        self.num_threads = num_threads
        self.atari = atari.is_atari(env_id)
        self._options: dict = {}
        max_steps = None
        if self.atari:
            registered = gym.spec(env_id).kwargs or {}
            max_steps = atari.max_episode_steps(env_id)
            self._options = {"episodic_life": False, "reward_clip": False, "use_fire_reset": False,
                             "noop_max": atari.NOOP_MAX, "frame_skip": atari.FRAME_SKIP, "stack_num": atari.FRAME_STACK,
                             "img_height": atari.SCREEN_SIZE, "img_width": atari.SCREEN_SIZE, "gray_scale": True,
                             "repeat_action_probability": float(registered.get("repeat_action_probability", 0.0)),
                             "full_action_space": bool(registered.get("full_action_space", False)),
                             "max_episode_steps": max_steps}
        self._options.update(options)  # (every pool made, `reset(seed)`'s too)
        self._seed = seed if seed is not None else random.randrange(2**31)
        self.pool = self._make_pool(self._seed)
        if max_steps is None:
            max_steps = int(self.pool.spec.config.max_episode_steps)
            max_steps = None if max_steps == ENVPOOL_NO_TIME_LIMIT else max_steps
        registered_spec = gym.registry.get(env_id)
        threshold = registered_spec.reward_threshold if registered_spec is not None else None
        if isinstance(self.pool.observation_space, (gym.spaces.Dict, gym.spaces.Tuple)):
            self.pool.close()  # (EnvPool's MiniGrid ids: a dict of arrays, its mission as bytes)
            raise UserError(f"EnvPool's '{env_id}' gives {type(self.pool.observation_space).__name__} observations, "
                            "which the envpool backend does not take; use --env-backend gymnasium (or auto).")
        self.spec = EnvSpec.from_spaces(env_id, _observation_bounds(_float32(self.pool.observation_space)),
                                        _float32(self.pool.action_space), max_steps,
                                        threshold).with_options(env_kwargs)
        # (the contract's dtypes: float32 vectors, int64 indices where EnvPool gives int32, uint8 images)
        self._obs_dtype = numpy_dtype(observation_layout(self.spec.observation_space)[1])
        self._action_dtype = (np.int32 if isinstance(self.spec.action_space, gym.spaces.Discrete)
                              else np.asarray(self.pool.action_space.sample()).dtype)

    def _make_pool(self, seed: int):
        check_envpool_seeds(seed, self.num_envs)
        envpool = import_envpool()
        with warnings.catch_warnings():
            # EnvPool builds float32 Boxes from float64 bounds, and Gymnasium warns about the cast on every make
            warnings.filterwarnings("ignore", message=".*precision lowered by casting", category=UserWarning)
            pool = envpool.make(self.task, env_type="gymnasium", num_envs=self.num_envs, batch_size=self.num_envs,
                                num_threads=self.num_threads, seed=int(seed), **self._options)
            pool.observation_space, pool.action_space  # noqa: B018 (built once, here, under the filter)
        return pool

    def _in_order(self, values: tuple, env_ids: np.ndarray) -> tuple:
        """Rows sorted by env id (EnvPool gives each batch's rows in the order the envs finished)."""
        if np.array_equal(env_ids, np.arange(len(env_ids))):
            return values
        order = np.argsort(env_ids)
        return tuple(value[order] for value in values)

    def _obs(self, obs: np.ndarray) -> np.ndarray:
        return obs.astype(self._obs_dtype) if self._obs_dtype is not None and obs.dtype != self._obs_dtype else obs

    def _lives(self, info: dict) -> np.ndarray:
        return np.asarray(info["lives"], dtype=np.int32)

    def reset(self, seed: int | None = None) -> ResetResult:
        """Reset every env (a `seed` makes the pool afresh with it, so the same seed gives the same episodes, as
        Gymnasium's reset does); Atari ids put lives in info."""
        if seed is not None:
            self.pool.close()
            self._seed = seed
            self.pool = self._make_pool(seed)
        obs, info = self.pool.reset()
        if self.atari:
            obs, lives = self._in_order((obs, self._lives(info)), info["env_id"])
            return torch.as_tensor(obs, device=self.device), {"lives": torch.as_tensor(lives, device=self.device)}
        (obs,) = self._in_order((obs,), info["env_id"])
        return torch.as_tensor(self._obs(obs), device=self.device), {}

    def step(self, actions: torch.Tensor) -> StepResult:
        """Step every env; finished ones are reset in the same step (module docstring)."""
        actions_np = actions.detach().cpu().numpy().astype(self._action_dtype, copy=False)
        if isinstance(self.spec.action_space, gym.spaces.Discrete):
            actions_np = actions_np.reshape(-1)
        obs, reward, terminated, truncated, info = self.pool.step(actions_np)
        lives = self._lives(info) if self.atari else None
        values = (obs, reward, terminated, truncated) + ((lives,) if self.atari else ())
        values = self._in_order(values, info["env_id"])
        obs, reward, terminated, truncated = values[:4]
        obs = self._obs(obs)
        finished = np.flatnonzero(terminated | truncated)
        final = obs
        if len(finished):
            reset_obs, reset_info = self.pool.reset(finished.astype(np.int32))
            order = np.argsort(reset_info["env_id"])  # rows of `finished`, which is sorted
            obs = obs.copy()
            obs[finished] = self._obs(reset_obs)[order]
            if self.atari:
                values = values[:4] + (values[4].copy(),)
                values[4][finished] = self._lives(reset_info)[order]
        obs_t = torch.as_tensor(obs, device=self.device)
        info_out = {"final_obs": obs_t if final is obs else torch.as_tensor(final, device=self.device),
                    "final_rows": finished.astype(np.int64)}  # the finished rows, on the host (envs/base.py)
        if self.atari:
            info_out["lives"] = torch.as_tensor(values[4], device=self.device)
        return (obs_t, torch.as_tensor(float32_rewards(reward, self), device=self.device),
                torch.as_tensor(np.asarray(terminated, dtype=bool), device=self.device),
                torch.as_tensor(np.asarray(truncated, dtype=bool), device=self.device), info_out)

    def close(self) -> None:
        """Close the pool (its threads); an error its close() raises is an `EnvStepError` naming the env, kept or
        raised as `close_envs` says (`close_other_backend`)."""
        close_other_backend(self.pool.close, self.spec.env_id, self.backend)


__all__ = ["EnvPoolEnv", "check_envpool_seeds", "envpool_installed", "envpool_only", "envpool_options",
           "envpool_refusal", "envpool_task", "gymnasium_versions", "INSTALL"]
