"""CartPole-v1 as batched tensor ops: Gymnasium's constants, explicit Euler, termination, reward and time limit."""

from __future__ import annotations

import math

import gymnasium as gym
import torch

from rlspeed.envs.base import EnvSpec
from rlspeed.envs.native import NativeEnv, observation_box

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
    spec = EnvSpec("CartPole-v1", (4,), gym.spaces.Discrete(2), max_episode_steps=500, reward_threshold=475.0,
                   observation_space=observation_box([X_THRESHOLD * 2, math.inf, THETA_THRESHOLD * 2, math.inf]))

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Action -> force as a lookup table, and the termination bounds of (x, theta): device tensors built once.
        self._force = torch.tensor([-FORCE_MAG, FORCE_MAG], dtype=self.state_dtype, device=self.device)
        self._bounds = torch.tensor([X_THRESHOLD, THETA_THRESHOLD], dtype=self.state_dtype, device=self.device)

    def sample_state(self, num: int) -> torch.Tensor:
        return self.uniform(num, -0.05, 0.05)

    def dynamics(self, state, actions):
        # Gymnasium's equations in Gymnasium's order of float operations and without fused multiply-adds, so that
        # float64 states reproduce its episodes to the last bit; in-place kernels where they can be (at small N the
        # cost is per kernel, not per env).
        x_dot, theta, theta_dot = state[:, 1], state[:, 2], state[:, 3]
        force = self._force[actions.reshape(-1).long()]
        costheta = torch.cos(theta)
        sintheta = torch.sin(theta)
        # temp = (force + m_p l theta_dot^2 sin) / M
        temp = theta_dot.square().mul_(POLE_MASS_LENGTH).mul_(sintheta).add_(force).div_(TOTAL_MASS)
        # thetaacc = (g sin - cos temp) / (l (4/3 - m_p cos^2 / M))
        thetaacc = sintheta.mul_(GRAVITY).sub_(costheta * temp)
        thetaacc.div_(costheta.square().mul_(MASS_POLE).div_(TOTAL_MASS).neg_().add_(4.0 / 3.0).mul_(LENGTH))
        # xacc = temp - m_p l thetaacc cos / M
        xacc = temp.sub_((thetaacc * POLE_MASS_LENGTH).mul_(costheta).div_(TOTAL_MASS))
        # explicit Euler on (x, x_dot, theta, theta_dot)
        next_state = torch.stack((x_dot, xacc, theta_dot, thetaacc), dim=-1).mul_(TAU).add_(state)
        # terminated when |x| > 2.4 or |theta| > 12 degrees (Gymnasium: x < -2.4 or x > 2.4 or ...)
        terminated = (next_state[:, 0::2].abs() > self._bounds).any(-1)
        # Gymnasium pays 1.0 on every step, the terminating one included.
        reward = torch.ones_like(x_dot)
        return next_state, reward, terminated
