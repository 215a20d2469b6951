"""Acrobot-v1 as batched tensor ops: Gymnasium's book dynamics, one RK4 step of 0.2 s, angle wrap, speed bounds."""

from __future__ import annotations

import math

import gymnasium as gym
import torch

from rlspeed.envs.base import EnvSpec
from rlspeed.envs.native import NativeEnv, observation_box

DT = 0.2
LINK_LENGTH_1 = 1.0
LINK_MASS_1 = 1.0
LINK_MASS_2 = 1.0
LINK_COM_POS_1 = 0.5
LINK_COM_POS_2 = 0.5
LINK_MOI = 1.0
GRAVITY = 9.8
MAX_VEL_1 = 4 * math.pi
MAX_VEL_2 = 9 * math.pi


def dsdt(state: torch.Tensor, torque: torch.Tensor) -> torch.Tensor:
    """Time derivative of (theta1, theta2, dtheta1, dtheta2): the book dynamics, term for term as Gymnasium."""
    m1, m2, l1 = LINK_MASS_1, LINK_MASS_2, LINK_LENGTH_1
    lc1, lc2, i1, i2, g = LINK_COM_POS_1, LINK_COM_POS_2, LINK_MOI, LINK_MOI, GRAVITY
    theta1, theta2, dtheta1, dtheta2 = state.unbind(-1)
    # Written in Gymnasium's operation order so float64 results round the same way.
    d1 = m1 * lc1**2 + m2 * (l1**2 + lc2**2 + 2 * l1 * lc2 * torch.cos(theta2)) + i1 + i2
    d2 = m2 * (lc2**2 + l1 * lc2 * torch.cos(theta2)) + i2
    phi2 = m2 * lc2 * g * torch.cos(theta1 + theta2 - math.pi / 2.0)
    phi1 = (-m2 * l1 * lc2 * dtheta2**2 * torch.sin(theta2)
            - 2 * m2 * l1 * lc2 * dtheta2 * dtheta1 * torch.sin(theta2)
            + (m1 * lc1 + m2 * l1) * g * torch.cos(theta1 - math.pi / 2)
            + phi2)
    ddtheta2 = (torque + d2 / d1 * phi1 - m2 * l1 * lc2 * dtheta1**2 * torch.sin(theta2) - phi2) / (
        m2 * lc2**2 + i2 - d2**2 / d1)
    ddtheta1 = -(d2 * ddtheta2 + phi1) / d1
    return torch.stack((dtheta1, dtheta2, ddtheta1, ddtheta2), dim=-1)


def rk4_step(state: torch.Tensor, torque: torch.Tensor, dt: float) -> torch.Tensor:
    """One classic Runge-Kutta step, with Gymnasium's `rk4` grouping of the weighted sum."""
    dt2 = dt / 2.0
    k1 = dsdt(state, torque)
    k2 = dsdt(state + dt2 * k1, torque)
    k3 = dsdt(state + dt2 * k2, torque)
    k4 = dsdt(state + dt * k3, torque)
    return state + dt / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)


def wrap_angle(angle: torch.Tensor) -> torch.Tensor:
    """Gymnasium's `wrap(angle, -pi, pi)` without its loop: add or subtract 2*pi until inside [-pi, pi].

    One step can carry an angle to about 9*pi. Each of Gymnasium's subtractions of 2*pi is exact for
    |angle| < 64, so its result is the exact angle - k*2*pi in range, which `fmod` (also exact) reaches in one op.
    """
    period = 2 * math.pi
    angle = torch.fmod(angle, period)
    angle = torch.where(angle > math.pi, angle - period, angle)
    return torch.where(angle < -math.pi, angle + period, angle)


class Acrobot(NativeEnv):
    """N Acrobot-v1 envs. State `[N, 4]` = (theta1, theta2, dtheta1, dtheta2), as gymnasium's `unwrapped.state`.

    Actions are integers `[N]` in {0, 1, 2} (torque -1, 0, +1). Reward is -1 per step and 0 on the step that
    lifts the tip above the bar (which terminates); episodes are truncated at 500 steps.
    """

    state_size = 4
    spec = EnvSpec("Acrobot-v1", (6,), gym.spaces.Discrete(3), max_episode_steps=500, reward_threshold=-100.0,
                   observation_space=observation_box([1.0, 1.0, 1.0, 1.0, MAX_VEL_1, MAX_VEL_2]))

    def sample_state(self, num: int) -> torch.Tensor:
        # Gymnasium draws in float64 and stores float32.
        return self.uniform(num, -0.1, 0.1).to(torch.float32).to(self.state_dtype)

    def dynamics(self, state, actions):
        torque = (actions.reshape(-1) - 1).to(state.dtype)
        next_state = rk4_step(state, torque, DT)
        theta1, theta2, dtheta1, dtheta2 = next_state.unbind(-1)
        next_state = torch.stack((wrap_angle(theta1), wrap_angle(theta2),
                                  dtheta1.clamp(-MAX_VEL_1, MAX_VEL_1), dtheta2.clamp(-MAX_VEL_2, MAX_VEL_2)), dim=-1)
        theta1, theta2 = next_state[:, 0], next_state[:, 1]
        terminated = -torch.cos(theta1) - torch.cos(theta2 + theta1) > 1.0
        reward = torch.where(terminated, 0.0, -1.0).to(state.dtype)
        return next_state, reward, terminated

    def observe(self, state):
        theta1, theta2, dtheta1, dtheta2 = state.unbind(-1)
        return torch.stack((torch.cos(theta1), torch.sin(theta1), torch.cos(theta2), torch.sin(theta2),
                            dtheta1, dtheta2), dim=-1).to(torch.float32)
