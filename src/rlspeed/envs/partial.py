"""Partially observed tasks for recurrent policies: CartPole and Pendulum with their velocities hidden
(`CartPoleNoVel-v1`, `PendulumNoVel-v1`).

RL-Zoo registers `CartPoleNoVel-v1` (CartPole-v1 through its `MaskVelocityWrapper`: the cart and pole velocities,
observation components 1 and 3, multiplied by 0) and `PendulumNoVel-v1` (Pendulum-v1's angular velocity, component
2, multiplied by 0; Pendulum-v1's time limit of 200 steps). rlspeed ships the same tasks so that `rl_zoo3` is not a
dependency: `MaskVelocity` (a Gymnasium `ObservationWrapper`) registered under those ids when this module is imported
(by `rlspeed.envs`) unless something (rl_zoo3) registered the id already, and `CartPoleNoVel` and `PendulumNoVel`,
the device-native versions, in the native registry. Observations keep the env's shape, with zeros where the
velocities were.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from rlspeed.envs.base import EnvSpec
from rlspeed.envs.cartpole import CartPole
from rlspeed.envs.pendulum import Pendulum

#: Observation components that are velocities, per Gymnasium id (RL-Zoo's `MaskVelocityWrapper.velocity_indices`).
VELOCITY_INDICES = {"CartPole-v1": (1, 3), "Pendulum-v1": (2,)}


class MaskVelocity(gym.ObservationWrapper):
    """Zero the velocity components of each observation (RL-Zoo's `MaskVelocityWrapper`), keeping the space."""

    def __init__(self, env: gym.Env, env_id: str = "CartPole-v1"):
        super().__init__(env)
        if env_id not in VELOCITY_INDICES:
            raise ValueError(f"MaskVelocity knows the velocities of {', '.join(VELOCITY_INDICES)}, not {env_id}.")
        self.mask = np.ones(env.observation_space.shape, dtype=env.observation_space.dtype)
        self.mask[list(VELOCITY_INDICES[env_id])] = 0

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return observation * self.mask


def make_cartpole_no_vel(render_mode: str | None = None) -> gym.Env:
    """CartPole-v1's dynamics and spaces with the velocities hidden (the time limit comes from the registration)."""
    from gymnasium.envs.classic_control import CartPoleEnv

    return MaskVelocity(CartPoleEnv(render_mode=render_mode), "CartPole-v1")


def make_pendulum_no_vel(render_mode: str | None = None) -> gym.Env:
    """Pendulum-v1's dynamics and spaces with the angular velocity hidden (the time limit comes from the
    registration)."""
    from gymnasium.envs.classic_control import PendulumEnv

    return MaskVelocity(PendulumEnv(render_mode=render_mode), "Pendulum-v1")


class CartPoleNoVel(CartPole):
    """N CartPole-v1 envs on the device whose observations hide the velocities (`CartPoleNoVel-v1`).

    The state is CartPole's, `[N, 4]` = (x, x_dot, theta, theta_dot); observations are (x, 0, theta, 0).
    """

    spec = EnvSpec("CartPoleNoVel-v1", (4,), gym.spaces.Discrete(2), max_episode_steps=500, reward_threshold=475.0,
                   observation_space=CartPole.spec.observation_space)  # (the Gymnasium env's: MaskVelocity keeps it)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._mask = torch.tensor([1.0, 0.0, 1.0, 0.0], device=self.device)

    def observe(self, state: torch.Tensor) -> torch.Tensor:
        return state.to(torch.float32) * self._mask  # a new tensor: never the state itself


class PendulumNoVel(Pendulum):
    """N Pendulum-v1 envs on the device whose observations hide the angular velocity (`PendulumNoVel-v1`).

    The state is Pendulum's, `[N, 2]` = (theta, theta_dot); observations are (cos theta, sin theta, 0).
    """

    spec = EnvSpec("PendulumNoVel-v1", (3,), Pendulum.spec.action_space, max_episode_steps=200, reward_threshold=None,
                   observation_space=Pendulum.spec.observation_space)  # (the Gymnasium env's: MaskVelocity keeps it)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._mask = torch.tensor([1.0, 1.0, 0.0], device=self.device)

    def observe(self, state: torch.Tensor) -> torch.Tensor:
        return super().observe(state) * self._mask


def register_partial_envs() -> None:
    """Register `CartPoleNoVel-v1` and `PendulumNoVel-v1` with Gymnasium unless registered already (rl_zoo3 registers
    its own)."""
    if "CartPoleNoVel-v1" not in gym.registry:
        gym.register(id="CartPoleNoVel-v1", entry_point="rlspeed.envs.partial:make_cartpole_no_vel",
                     max_episode_steps=500, reward_threshold=475.0)
    if "PendulumNoVel-v1" not in gym.registry:
        gym.register(id="PendulumNoVel-v1", entry_point="rlspeed.envs.partial:make_pendulum_no_vel",
                     max_episode_steps=200)


register_partial_envs()  # on import of rlspeed.envs (its native registry imports this module)
