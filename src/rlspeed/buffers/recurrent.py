"""Rollout storage for recurrent policies: `RolloutBuffer` plus the LSTM state each step started from and where
episodes started, so that the update can re-run the LSTM over sequences (chunks of the env columns) from the state
stored at their first step."""

from __future__ import annotations

import math

import torch

from rlspeed.buffers.rollout import RolloutBuffer


class RecurrentRolloutBuffer(RolloutBuffer):
    """`RolloutBuffer` with, per step, the recurrent state the policy took as input and the episode-start flags.

    `states[t]` `[S, N, H]` is the state step t's action was computed from (already zero where an episode started),
    `next_states[t]` the state step t produced (what V of `next_obs[t]` continues from), `episode_starts[t]` whether
    `obs[t]` is the first observation of a whole episode (`episode_ends[t - 1]`, or the previous rollout's last
    ones: `dones` but where a wrapper ended only the learner's episode, Atari's lost life).
    """

    def __init__(self, num_steps: int, num_envs: int, observation, action_shape: tuple[int, ...],
                 action_dtype: torch.dtype, device: torch.device, state_shape: tuple[int, ...],
                 mask_size: int | None = None):
        super().__init__(num_steps, num_envs, observation, action_shape, action_dtype, device, mask_size,
                         extra_nbytes=self.state_step_bytes(math.prod(state_shape) // num_envs))
        self.states = torch.zeros(num_steps, *state_shape, device=device)
        self.next_states = torch.zeros(num_steps, *state_shape, device=device)
        self.episode_starts = torch.zeros(num_steps, num_envs, device=device, dtype=torch.bool)

    @staticmethod
    def state_step_bytes(state_numel: int) -> int:
        """Bytes stored per step and env besides a `RolloutBuffer`'s, for a state of `state_numel` floats per env: the
        state the step started from and the one it produced (float32 each) and the episode-start flag; counted in the
        memory check (with an LSTM of 256, 8 KiB per step and env, against some 60 bytes of CartPole's other fields)."""
        return 2 * 4 * state_numel + 1

    def add_state(self, step: int, state: torch.Tensor, next_state: torch.Tensor, episode_starts: torch.Tensor) -> None:
        """Record step `step`'s input state, output state and episode-start flags `[N]` (in place)."""
        self.states[step].copy_(state)
        self.next_states[step].copy_(next_state)
        self.episode_starts[step].copy_(episode_starts)
