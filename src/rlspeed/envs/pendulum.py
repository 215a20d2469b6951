"""Pendulum-v1 as batched tensor ops: Gymnasium's constants, semi-implicit Euler on the unwrapped angle, cost."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch

from rlspeed.envs.base import EnvSpec
from rlspeed.envs.native import NativeEnv, observation_box

MAX_SPEED = 8.0
MAX_TORQUE = 2.0
DT = 0.05
GRAVITY = 10.0
MASS = 1.0
LENGTH = 1.0


def angle_normalize(angle: torch.Tensor) -> torch.Tensor:
    """Angle mapped into [-pi, pi), with the same floor-modulo Gymnasium uses."""
    return torch.remainder(angle + math.pi, 2 * math.pi) - math.pi


class Pendulum(NativeEnv):
    """N Pendulum-v1 envs. State `[N, 2]` = (theta, theta_dot), theta unwrapped, as gymnasium's `unwrapped.state`.

    Actions are torques, float `[N, 1]` (or `[N]`), clipped to +-2. Reward is minus the cost of the state the
    action was applied in. There is no termination; episodes are truncated at 200 steps.
    """

    state_size = 2
    spec = EnvSpec("Pendulum-v1", (3,), gym.spaces.Box(-MAX_TORQUE, MAX_TORQUE, (1,), np.float32),
                   max_episode_steps=200, reward_threshold=None,
                   observation_space=observation_box([1.0, 1.0, MAX_SPEED]))

    def sample_state(self, num: int) -> torch.Tensor:
        return self.uniform(num, [-math.pi, -1.0], [math.pi, 1.0])

    def dynamics(self, state, actions):
        theta, theta_dot = state.unbind(-1)
        # Torque terms stay in the action's dtype before meeting the float64 state, as in Gymnasium: numpy keeps
        # float32 * Python float in float32, so float64-state parity needs the same rounding.
        torque = actions.reshape(-1).clamp(-MAX_TORQUE, MAX_TORQUE)
        costs = angle_normalize(theta).square() + 0.1 * theta_dot.square() + (0.001 * torque.square()).to(state.dtype)
        torque_acc = (3.0 / (MASS * LENGTH**2) * torque).to(state.dtype)
        new_theta_dot = theta_dot + (3 * GRAVITY / (2 * LENGTH) * torch.sin(theta) + torque_acc) * DT
        new_theta_dot = new_theta_dot.clamp(-MAX_SPEED, MAX_SPEED)
        new_theta = theta + new_theta_dot * DT
        next_state = torch.stack((new_theta, new_theta_dot), dim=-1)
        terminated = torch.zeros_like(new_theta, dtype=torch.bool)
        return next_state, -costs, terminated

    def observe(self, state):
        theta, theta_dot = state.unbind(-1)
        return torch.stack((torch.cos(theta), torch.sin(theta), theta_dot), dim=-1).to(torch.float32)
