"""MountainCarContinuous-v0 as batched tensor ops: Gymnasium's constants, clips, goal bonus and action cost.

Gymnasium stores this env's state as float32 after every step and, through numpy's promotion rules, does part
of the arithmetic in the action's float32; `dynamics` follows both so that a float64 state steps exactly as
Gymnasium's does.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from rlspeed.envs.base import EnvSpec
from rlspeed.envs.native import NativeEnv, observation_box

MIN_ACTION = -1.0
MAX_ACTION = 1.0
MIN_POSITION = -1.2
MAX_POSITION = 0.6
MAX_SPEED = 0.07
GOAL_POSITION = 0.45
GOAL_VELOCITY = 0.0
POWER = 0.0015
GRAVITY = 0.0025
GOAL_REWARD = 100.0


class MountainCarContinuous(NativeEnv):
    """N MountainCarContinuous-v0 envs. State `[N, 2]` = (position, velocity), as gymnasium's `unwrapped.state`.

    Actions are forces, float `[N, 1]` (or `[N]`), clipped to +-1 for the dynamics. Reward is 100 on reaching
    the goal (which terminates) minus 0.1 * action^2 of the unclipped action; episodes are truncated at 999 steps.
    """

    state_size = 2
    spec = EnvSpec("MountainCarContinuous-v0", (2,), gym.spaces.Box(MIN_ACTION, MAX_ACTION, (1,), np.float32),
                   max_episode_steps=999, reward_threshold=90.0,
                   observation_space=observation_box([MAX_POSITION, MAX_SPEED], low=[MIN_POSITION, -MAX_SPEED]))

    def sample_state(self, num: int) -> torch.Tensor:
        return self.uniform(num, [-0.6, 0.0], [-0.4, 0.0])

    def dynamics(self, state, actions):
        position, velocity = state.unbind(-1)
        action = actions.reshape(-1)
        force = action.clamp(MIN_ACTION, MAX_ACTION)
        slope = GRAVITY * torch.cos(3 * position)
        # Gymnasium computes `force * power - slope` in the action's dtype (float32 * Python float stays float32)
        # unless the action was clipped, when builtin min/max hand back the Python float bound.
        push = (force * POWER - slope.to(force.dtype)).to(state.dtype)
        clipped = (action < MIN_ACTION) | (action > MAX_ACTION)
        push = torch.where(clipped, force.to(state.dtype) * POWER - slope, push)
        velocity = (velocity + push).clamp(-MAX_SPEED, MAX_SPEED)
        position = (position + velocity).clamp(MIN_POSITION, MAX_POSITION)
        velocity = torch.where((position == MIN_POSITION) & (velocity < 0), 0.0, velocity)
        terminated = (position >= GOAL_POSITION) & (velocity >= GOAL_VELOCITY)
        reward = torch.where(terminated, GOAL_REWARD, 0.0).to(state.dtype) - action.to(state.dtype).square() * 0.1
        next_state = torch.stack((position, velocity), dim=-1).to(torch.float32).to(state.dtype)
        return next_state, reward, terminated
