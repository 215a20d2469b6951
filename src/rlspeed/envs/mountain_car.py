"""MountainCar-v0 as batched tensor ops: Gymnasium's constants, speed and position clips, the wall, the goal."""

from __future__ import annotations

import gymnasium as gym
import torch

from rlspeed.envs.base import EnvSpec
from rlspeed.envs.native import NativeEnv, observation_box

MIN_POSITION = -1.2
MAX_POSITION = 0.6
MAX_SPEED = 0.07
GOAL_POSITION = 0.5
GOAL_VELOCITY = 0.0
FORCE = 0.001
GRAVITY = 0.0025


class MountainCar(NativeEnv):
    """N MountainCar-v0 envs. State `[N, 2]` = (position, velocity), as gymnasium's `unwrapped.state`.

    Actions are integers `[N]` in {0, 1, 2} (push left, none, right). Reward is -1 per step; reaching the goal
    terminates; episodes are truncated at 200 steps.
    """

    state_size = 2
    spec = EnvSpec("MountainCar-v0", (2,), gym.spaces.Discrete(3), max_episode_steps=200, reward_threshold=-110.0,
                   observation_space=observation_box([MAX_POSITION, MAX_SPEED], low=[MIN_POSITION, -MAX_SPEED]))

    def sample_state(self, num: int) -> torch.Tensor:
        return self.uniform(num, [-0.6, 0.0], [-0.4, 0.0])

    def dynamics(self, state, actions):
        position, velocity = state.unbind(-1)
        push = (actions.reshape(-1) - 1).to(state.dtype)
        velocity = velocity + (push * FORCE + torch.cos(3 * position) * (-GRAVITY))
        velocity = velocity.clamp(-MAX_SPEED, MAX_SPEED)
        position = (position + velocity).clamp(MIN_POSITION, MAX_POSITION)
        # The left wall is inelastic.
        velocity = torch.where((position == MIN_POSITION) & (velocity < 0), 0.0, velocity)
        terminated = (position >= GOAL_POSITION) & (velocity >= GOAL_VELOCITY)
        reward = torch.full_like(position, -1.0)
        return torch.stack((position, velocity), dim=-1), reward, terminated
