"""CartPole-v1 as batched tensor ops: Gymnasium's constants, explicit Euler, termination, reward and time limit."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch

from rlspeed.envs.base import EnvSpec
from rlspeed.envs.native import NativeEnv

GRAVITY = 9.8
MASS_CART = 1.0
MASS_POLE = 0.1
TOTAL_MASS = MASS_CART + MASS_POLE
LENGTH = 0.5  # half the pole's length
POLE_MASS_LENGTH = MASS_POLE * LENGTH
FORCE_MAG = 10.0
TAU = 0.02
THETA_THRESHOLD = 12 * 2 * math.pi / 360
X_THRESHOLD = 2.4


class CartPole(NativeEnv):
    """N CartPole-v1 envs. State `[N, 4]` = (x, x_dot, theta, theta_dot), as gymnasium's `unwrapped.state`."""

    state_size = 4
    spec = EnvSpec("CartPole-v1", (4,), gym.spaces.Discrete(2), max_episode_steps=500, reward_threshold=475.0)
    observation_high = np.array([X_THRESHOLD * 2, np.finfo(np.float32).max, THETA_THRESHOLD * 2,
                                 np.finfo(np.float32).max], dtype=np.float32)

    def sample_state(self, num: int) -> torch.Tensor:
        return self.uniform(num, -0.05, 0.05)

    def dynamics(self, state, actions):
        x, x_dot, theta, theta_dot = state.unbind(-1)
        force = torch.where(actions.reshape(-1) == 1, FORCE_MAG, -FORCE_MAG).to(state.dtype)
        costheta = torch.cos(theta)
        sintheta = torch.sin(theta)
        temp = (force + POLE_MASS_LENGTH * theta_dot.square() * sintheta) / TOTAL_MASS
        thetaacc = (GRAVITY * sintheta - costheta * temp) / (
            LENGTH * (4.0 / 3.0 - MASS_POLE * costheta.square() / TOTAL_MASS))
        xacc = temp - POLE_MASS_LENGTH * thetaacc * costheta / TOTAL_MASS
        next_state = torch.stack((x + TAU * x_dot, x_dot + TAU * xacc,
                                  theta + TAU * theta_dot, theta_dot + TAU * thetaacc), dim=-1)
        new_x, new_theta = next_state[:, 0], next_state[:, 2]
        terminated = (new_x < -X_THRESHOLD) | (new_x > X_THRESHOLD) | (new_theta < -THETA_THRESHOLD) | (
            new_theta > THETA_THRESHOLD)
        # Gymnasium pays 1.0 on every step, the terminating one included.
        reward = torch.ones_like(new_x)
        return next_state, reward, terminated
