"""Batched envs: `make_env` gives N envs of any Gymnasium id (or a device-native version) as tensors."""

from __future__ import annotations

import gymnasium as gym
import torch

from rlspeed.device import resolve_device
from rlspeed.envs.acrobot import Acrobot
from rlspeed.envs.base import BatchedEnv, EnvSpec, EnvWrapper, EpisodeStatistics
from rlspeed.envs.cartpole import CartPole
from rlspeed.envs.gym_view import NativeGymEnv, register_native_envs
from rlspeed.envs.gymnasium_env import GymnasiumEnv, gym_spec
from rlspeed.envs.mountain_car import MountainCar
from rlspeed.envs.mountain_car_continuous import MountainCarContinuous
from rlspeed.envs.native import NativeEnv
from rlspeed.envs.pendulum import Pendulum
from rlspeed.envs.registry import NATIVE_ENVS
from rlspeed.envs.sb3_env import SB3VecEnv, is_sb3_vec_env
from rlspeed.envs.wrappers import NormalizeObservation, NormalizeReward, RunningMeanStd
from rlspeed.errors import UserError

BACKENDS = ("auto", "torch", "gymnasium", "gymnasium-async")

register_native_envs()  # `gymnasium.make("rlspeed/CartPole-v1")` etc.


#: On a CPU, few native envs step slower than Gymnasium's: a native step is a fixed set of small tensor ops whatever
#: N is, a Gymnasium env a few microseconds of Python each. `benchmarks/env_backends.py` on a 2-core Xeon, one
#: thread (latest run): the native env is faster from 8 envs (CartPole, MountainCar), 16 (Pendulum), 32 (Acrobot),
#: 64 (MountainCarContinuous); crossovers move by a factor of 2 between runs.
CPU_NATIVE_MIN_ENVS = 16


def resolve_backend(env_id: str, backend: str = "auto", num_envs: int | None = None,
                    device: str | torch.device | None = None) -> str:
    """Which backend `make_env` will use. `auto` picks the native env when one exists for the id, except on a
    CPU with fewer than `CPU_NATIVE_MIN_ENVS` envs (when `num_envs` and `device` are given), where Gymnasium's
    are faster."""
    if backend not in BACKENDS:
        raise UserError(f"Unknown env backend '{backend}': use one of {', '.join(BACKENDS)}.")
    if backend == "auto":
        few_on_cpu = (num_envs is not None and num_envs < CPU_NATIVE_MIN_ENVS and device is not None
                      and torch.device(device).type == "cpu")
        return "torch" if env_id in NATIVE_ENVS and not few_on_cpu else "gymnasium"
    if backend == "torch" and env_id not in NATIVE_ENVS:
        raise UserError(f"No device-native version of '{env_id}' exists (native: {', '.join(NATIVE_ENVS)}); "
                        "use --env-backend gymnasium.")
    return backend


def env_spec(env_id: str) -> EnvSpec:
    """The EnvSpec of an id without building N envs (validates the id)."""
    if env_id in NATIVE_ENVS:
        return NATIVE_ENVS[env_id].spec
    spec = gym_spec(env_id)
    env = gym.make(spec.id)
    try:
        return EnvSpec(env_id, tuple(env.observation_space.shape), env.action_space, spec.max_episode_steps,
                       spec.reward_threshold)
    finally:
        env.close()


#: The keywords a native env takes besides `num_envs`, `device` and `seed` (`NativeEnv.__init__`; no subclass adds
#: any). Native envs take no env options: every other keyword to `make_env` is a Gymnasium env option.
NATIVE_OPTIONS = ("state_dtype", "compile")


def make_env(env_id: str | gym.vector.VectorEnv, num_envs: int = 1, device: str | torch.device = "auto",
             seed: int | None = None, backend: str = "auto", normalize_obs: bool = False,
             normalize_reward: bool = False, gamma: float = 0.99, **kwargs) -> BatchedEnv:
    """Make `num_envs` copies of an env as one batched env on `device` (README.md, "Envs", has the contract).

    `env_id` may also be a Gymnasium vector env built by the user with SAME_STEP autoreset, or a Stable-Baselines3
    VecEnv (`SB3VecEnv`: its same-step resets and `terminal_observation` map onto the contract). `backend` is
    `auto` (the native torch env when one exists, unless fewer than 16 envs on a CPU; else Gymnasium), `torch`,
    `gymnasium` (in-process) or `gymnasium-async` (one subprocess per env). The returned env reports raw episode
    returns in `info["episode_return"]` where `info["done"]`, and is seeded by `seed` on its first `reset()`.

    Other keywords: `state_dtype=` and `compile=` are native-env options (`NativeEnv`) and make `auto` pick the
    native env; any other keyword is an option of the Gymnasium env (`gymnasium.make(env_id, **kwargs)`, e.g.
    `g=9.81` for Pendulum-v1) and makes `auto` pick Gymnasium, since native envs take no env options. Asking for
    both kinds at once, or for a kind the chosen backend does not take, is a UserError.
    """
    if num_envs < 1:
        raise UserError(f"num_envs must be at least 1, got {num_envs}.")
    device = resolve_device(device)
    if isinstance(env_id, gym.vector.VectorEnv) or is_sb3_vec_env(env_id):
        if kwargs:
            raise UserError(f"make_env(vector_env, ...) takes no env options ({', '.join(kwargs)}): the vector env "
                            "is already built, so pass them where you build it.")
        env: BatchedEnv = (GymnasiumEnv(vector_env=env_id, device=device) if isinstance(env_id, gym.vector.VectorEnv)
                           else SB3VecEnv(env_id, device=device))
    else:
        _check_env_id(env_id)
        native_kwargs = {name: value for name, value in kwargs.items() if name in NATIVE_OPTIONS}
        env_kwargs = {name: value for name, value in kwargs.items() if name not in NATIVE_OPTIONS}
        if native_kwargs and env_kwargs:
            raise UserError(f"make_env got native-env options ({', '.join(native_kwargs)}) and Gymnasium env "
                            f"options ({', '.join(env_kwargs)}): native envs take no env options, and Gymnasium "
                            "envs take no native options.")
        if backend == "auto" and env_kwargs:
            backend = "gymnasium"  # env options exist only for Gymnasium's envs
        # native-only options (compile=..., state_dtype=...) ask for the native env whatever the number of envs
        chosen = resolve_backend(env_id, backend, None if native_kwargs else num_envs, device)
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
            vectorization = "async" if chosen == "gymnasium-async" else "sync"
            env = GymnasiumEnv(env_id, num_envs=num_envs, device=device, vectorization=vectorization,
                               env_kwargs=env_kwargs)
    env = _SeedOnFirstReset(EpisodeStatistics(env), seed)
    if normalize_obs:
        env = NormalizeObservation(env)
    if normalize_reward:
        env = NormalizeReward(env, gamma=gamma)
    return env


def _check_env_id(env_id) -> None:
    """UserError unless `env_id` is a str, saying what `make_env` accepts instead of other kinds of envs."""
    if isinstance(env_id, str):
        return
    kind = type(env_id).__name__
    accepted = ("make_env takes a Gymnasium env id (str), a Gymnasium vector env made with "
                "autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP, or a Stable-Baselines3 VecEnv")
    if isinstance(env_id, gym.Env):
        raise UserError(f"{accepted}, not a single gymnasium.Env ({kind}): wrap it as "
                        "gymnasium.vector.SyncVectorEnv([lambda: env], "
                        "autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP).")
    raise UserError(f"{accepted}; got a {kind}.")


class _SeedOnFirstReset(EnvWrapper):
    """Applies the seed given to `make_env` on the first `reset()`, unless that reset passes a seed itself.

    Any reset uses up the pending seed: after `reset(seed=1)`, a plain `reset()` continues the streams of seed 1
    rather than restarting them from `make_env`'s seed.
    """

    def __init__(self, env: BatchedEnv, seed: int | None):
        super().__init__(env)
        self._pending_seed = seed

    def reset(self, seed: int | None = None):
        if seed is None:
            seed = self._pending_seed
        self._pending_seed = None
        return self.env.reset(seed=seed)


__all__ = ["BatchedEnv", "EnvSpec", "EnvWrapper", "GymnasiumEnv", "SB3VecEnv", "NativeEnv", "NativeGymEnv", "CartPole",
           "Pendulum", "Acrobot", "MountainCar", "MountainCarContinuous", "NormalizeObservation", "NormalizeReward",
           "RunningMeanStd", "NATIVE_ENVS", "CPU_NATIVE_MIN_ENVS", "make_env", "env_spec", "resolve_backend"]
