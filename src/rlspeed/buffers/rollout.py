"""Rollout storage for on-policy algorithms, preallocated on the device, and GAE in one vectorised pass."""

from __future__ import annotations

import functools
import math

import gymnasium as gym
import numpy as np
import torch

from rlspeed.buffers.replay import layout_nbytes, refuse_unless_fits
from rlspeed.device import statistics_dtype
from rlspeed.envs.base import Observation, observation_layout


def allocate_observations(space: gym.Space | tuple[int, ...], leading: tuple[int, ...],
                          device: torch.device | str,
                          image_format: torch.memory_format = torch.contiguous_format) -> Observation:
    """Zeroed storage for observations of `space` (an `EnvSpec.observation_space`; a shape tuple means float32
    vectors) with leading dimensions `leading`, on `device`: one tensor in the observation's dtype, or one per key of
    a Dict. `image_format=torch.channels_last`: a `[C, H, W]` observation is stored with its channels innermost (the
    same shape and bytes; rows gathered from it keep that layout), as `rlspeed.nn.image_storage_format` asks for."""
    layout = observation_layout(space) if isinstance(space, gym.Space) else (tuple(space), torch.float32)
    if isinstance(layout, dict):
        return {key: torch.zeros(*leading, *shape, dtype=dtype, device=device)
                for key, (shape, dtype) in layout.items()}
    shape, dtype = layout
    if image_format == torch.channels_last and len(shape) == 3:
        channels, height, width = shape
        return torch.zeros(*leading, height, width, channels, dtype=dtype, device=device).movedim(-1, -3)
    return torch.zeros(*leading, *shape, dtype=dtype, device=device)


def observation_nbytes(obs: Observation) -> int:
    """Bytes an observation storage `obs` (a tensor, or a dict of them) takes (all keys)."""
    tensors = obs.values() if isinstance(obs, dict) else (obs,)
    return sum(t.numel() * t.element_size() for t in tensors)

# Above this many elements in the [T, T, N] discount matrix, GAE falls back to the reverse scan (same result).
_MATRIX_GAE_MAX_ELEMENTS = 1 << 24


@functools.lru_cache(maxsize=32)
def _triangles(steps: int, ndim: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(after, lower) for GAE's `[T, T, 1...]` discount matrix over `ndim`-dimensional `[T, ...]` rollouts:
    after[t, k] = k > t, lower[t, s] = s < t (made once per shape and device: they depend on nothing else)."""
    index = torch.arange(steps, device=device)
    after = (index.view(-1, 1) < index.view(1, -1)).view(steps, steps, *([1] * (ndim - 1)))
    return after, after.transpose(0, 1)


def gae(rewards: torch.Tensor, values: torch.Tensor, next_values: torch.Tensor, terminated: torch.Tensor,
        dones: torch.Tensor, gamma: float | torch.Tensor, gae_lambda: float | torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over `[T, N]` tensors (`rewards`; `values[t]`, V of the observation step t
    acted on; `terminated`, `dones` bool; `gamma` and `gae_lambda` numbers, or `[N]` tensors of one value per env
    column). Returns (advantages, returns).

    `next_values[t]` is V of the observation step t led to (`info["final_obs"]`), so a truncated episode is
    bootstrapped from its true last observation and a terminated one is not bootstrapped at all:

        delta_t = r_t + gamma * V(s'_t) * (1 - terminated_t) - V(s_t)
        A_t     = delta_t + gamma * lambda * (1 - done_t) * A_{t+1}

    The recursion is evaluated as one weighted sum, A = G @ delta with G[t, s] = prod_{k=t}^{s-1} c_k, built with
    one cumprod over a `[T, T, N]` tensor: a handful of kernels instead of T small steps.

    A terminated step's `next_values` is never read, whatever it holds: selected away, not multiplied by 0 (a NaN or
    inf there, V of a terminal observation a network overflows on or a bootstrap slot a diverged policy valued,
    would make the advantages NaN).
    """
    deltas = rewards.add(torch.where(terminated, 0.0, next_values.mul(gamma))).sub_(values)
    # c_t, [T, N], in the rewards' dtype (a Python gamma * lambda in torch.where would be rounded to float32 first)
    carry = (~dones).to(rewards.dtype).mul_(gamma * gae_lambda)
    steps = rewards.shape[0]
    if steps * steps * rewards[0].numel() > _MATRIX_GAE_MAX_ELEMENTS:
        advantages = torch.empty_like(deltas)
        running = torch.zeros_like(deltas[0])
        for t in range(steps - 1, -1, -1):
            running = deltas[t] + carry[t] * running
            advantages[t] = running
        return advantages, advantages + values
    after, lower = _triangles(steps, carry.dim(), carry.device)
    # factors[t, k] = c_{k-1} for k > t, else 1 (k = 0 never counts: row 0 of the rolled carry is unused); cumprod
    # over k gives prod_{j=t}^{s-1} c_j at [t, s].
    factors = torch.where(after, carry.roll(1, dims=0).unsqueeze(0), 1.0)
    weights = torch.cumprod(factors, dim=1)
    # Only s >= t counts. The lower triangle is zero-filled after weighting, not multiplied by a 0/1 mask: 0 * an inf
    # delta is NaN, which would reach the advantages of the steps after it (the reverse scan never adds it to those).
    advantages = weights.mul_(deltas.unsqueeze(0)).masked_fill_(lower, 0.0).sum(dim=1)
    return advantages, advantages + values


def rollout_step_bytes(observation, action_shape: tuple[int, ...], action_dtype: torch.dtype, device: torch.device,
                       mask_size: int | None = None, store_next_obs: bool = True, extra_nbytes: int = 0) -> int:
    """Bytes a `RolloutBuffer` stores per step and env: observations (twice with next_obs), actions, 4 float32
    fields, the episode returns and 3 bool fields, the masks and `extra_nbytes`."""
    layout = observation_layout(observation) if isinstance(observation, gym.Space) else (tuple(observation),
                                                                                         torch.float32)
    action_bytes = torch.empty((), dtype=action_dtype).element_size() * math.prod(action_shape)
    returns_bytes = torch.empty((), dtype=statistics_dtype(device)).element_size()
    return (layout_nbytes(layout) * (2 if store_next_obs else 1) + action_bytes + 4 * 4 + returns_bytes + 3
            + (mask_size or 0) + extra_nbytes)


def check_rollout_bytes(num_steps: int, num_envs: int, per_step: int, device: torch.device, members: int = 1) -> None:
    """UserError (`refuse_unless_fits`), naming the num_steps that fits (else the num_envs), when a rollout of
    `num_steps` steps of `num_envs` envs for each of `members` (a population's), `per_step` bytes per step and env
    row, needs more than the share of the device's available memory a replay buffer may take."""
    rows = num_envs * members
    solo = members == 1
    fewer, of_members = ("", "") if solo else (", or train fewer members at once", f" and {members} members")

    def advice(budget: int) -> str:
        # (the size that fits named, as the replay buffer's refusal names its: the steps per env at these envs, else
        # the envs that fit at these steps, else the envs that fit at one step each)
        steps = budget // (rows * per_step)
        envs, at_steps = budget // (members * per_step * num_steps), num_steps
        if steps < 1 and envs < 1:
            envs, at_steps = budget // (members * per_step), 1
        lower = "num_envs" if at_steps == num_steps else "num_steps and num_envs"
        each = "one step" if at_steps == 1 else f"{at_steps:,} steps"
        return (f"lower num_steps or num_envs{fewer}; with num_envs {num_envs:,}{of_members}, num_steps up to "
                f"{steps:,} fits (num_steps={steps}, on the command line --set num_steps={steps})" if steps >= 1 else
                f"lower {lower}{fewer}: {each} each of at most {envs:,} envs{'' if solo else ' per member'} fits "
                f"(num_envs={envs}, on the command line --num-envs {envs})" if envs >= 1 else
                "not even one step of one env fits: free memory or use smaller observations" if solo else
                "not even one step of one env per member fits: train fewer members at once, or free memory")

    what = "A rollout" if solo else f"The rollout of {members} members"
    refuse_unless_fits(num_steps * rows * per_step, device,
                       f"{what} of num_steps {num_steps:,} x num_envs {num_envs:,} steps", advice)


class RolloutBuffer:
    """Fixed-shape `[T, N, ...]` tensors for one rollout; written in place, one row of N envs per step.

    `num_steps` (T) steps of `num_envs` (N) envs, on `device`; actions of shape `action_shape` per env, stored as
    `action_dtype`.
    `observation` is the observation space (`EnvSpec.observation_space`): observations are stored in their own dtype
    (uint8 images as uint8, indices as int64), a dict of such tensors for Dict spaces; a shape tuple stores float32
    vectors of that shape. With `mask_size`, `action_masks` `[T, N, mask_size]` (bool) holds the action mask that was
    valid for each step's observation (the one its action was sampled under, and the one the loss applies again).

    `image_format`: the memory layout of channels-first image observations (`allocate_observations`).

    GAE bootstraps every step from V of the observation its action led to. `store_next_obs` keeps those observations
    (`next_obs`, `info["final_obs"]`; V of all of them in one pass after the rollout: the fewest kernels, for small
    vectors); without it, the algorithm writes V of the rows its env restarted (their last observations) into
    `final_values` during the rollout and marks them in `valued` (host bool `[T, N]`); the other rows' observation
    after the step is the next step's, whose value is taken: images are stored once, not twice. `extra_nbytes`:
    what a subclass stores per step and env besides, counted when checking that the rollout fits in memory.
    """

    def __init__(self, num_steps: int, num_envs: int, observation: gym.Space | tuple[int, ...],
                 action_shape: tuple[int, ...], action_dtype: torch.dtype, device: torch.device,
                 mask_size: int | None = None, store_next_obs: bool = True, extra_nbytes: int = 0,
                 image_format: torch.memory_format = torch.contiguous_format):
        def zeros(*shape, dtype=torch.float32):
            return torch.zeros(num_steps, num_envs, *shape, device=device, dtype=dtype)

        # (refused before anything is allocated: num_steps=1e9 failed inside the allocator, 1e30 inside torch)
        check_rollout_bytes(num_steps, num_envs, rollout_step_bytes(observation, action_shape, action_dtype, device,
                                                                    mask_size, store_next_obs, extra_nbytes), device)
        self.num_steps, self.num_envs = num_steps, num_envs
        self.obs = allocate_observations(observation, (num_steps, num_envs), device, image_format)
        # info["final_obs"], or the bootstrap values of finished rows (see the class docstring)
        self.next_obs = (allocate_observations(observation, (num_steps, num_envs), device, image_format)
                         if store_next_obs else None)
        self.final_values = None if store_next_obs else zeros()
        self.valued = None if store_next_obs else np.zeros((num_steps, num_envs), dtype=bool)
        self.actions = zeros(*action_shape, dtype=action_dtype)
        self.log_probs = zeros()
        self.values = zeros()
        self.rewards = zeros()
        self.terminated = zeros(dtype=torch.bool)
        self.dones = zeros(dtype=torch.bool)
        self.action_masks = zeros(mask_size, dtype=torch.bool) if mask_size is not None else None
        # the finished episodes' returns, for the learn loop's statistics: episode_ends[t] marks the rows whose
        # (whole) episode ended at step t, episode_returns[t] their returns (other rows: running totals, unread), in
        # float64 where the device has it, as the env sums them
        self.episode_ends = zeros(dtype=torch.bool)
        self.episode_returns = zeros(dtype=statistics_dtype(device))
        # Each step's row of every field, as views made once: `add` copies a step in one foreach call (for a few
        # envs, creating the row views and dispatching a copy per field cost more than the copies).
        self._rows = [self._fields_at(step) for step in range(num_steps)]

    def _fields_at(self, step: int) -> list[torch.Tensor]:
        """Row `step` of every field `add` writes, in its argument order (a Dict observation's keys in order)."""
        def parts(obs):
            return [] if obs is None else ([value[step] for value in obs.values()] if isinstance(obs, dict)
                                           else [obs[step]])

        fields = [*parts(self.obs), *parts(self.next_obs), self.actions[step], self.log_probs[step],
                  self.values[step], self.rewards[step], self.terminated[step], self.dones[step],
                  self.episode_ends[step], self.episode_returns[step]]
        return fields if self.action_masks is None else [*fields, self.action_masks[step]]

    def add(self, step: int, obs, next_obs, actions, log_probs, values, rewards, terminated, dones,
            episode_ends, episode_returns, action_masks: torch.Tensor | None = None) -> None:
        """Copy one step of all N envs into row `step` (in place, no allocation; one foreach copy).

        `next_obs` is `info["final_obs"]` (what each action led to; unused without `store_next_obs`), `dones` is
        `terminated | truncated`, `episode_ends`/`episode_returns` the env's `info["done"]`/`info["episode_return"]`
        (whole episodes, for statistics); the tensors are `[N, ...]` and are cast to the buffer's dtypes.
        """
        def parts(value, storage):
            return [] if storage is None else ([value[key] for key in storage] if isinstance(storage, dict)
                                               else [value])

        sources = [*parts(obs, self.obs), *parts(next_obs, self.next_obs), actions, log_probs, values, rewards,
                   terminated, dones, episode_ends, episode_returns]
        if self.action_masks is not None:
            sources.append(action_masks)
        torch._foreach_copy_(self._rows[step], sources)

    def episode_totals(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(sum of the returns of the episodes that ended in this rollout, their count), as device scalars."""
        return torch.where(self.episode_ends, self.episode_returns, 0.0).sum(), self.episode_ends.sum()

    def bytes_per_step(self) -> int:
        """Bytes one env step takes in this storage (observation, and next observation where kept, in their dtypes,
        and the rest), as `benchmarks/cnn_encoder.py` reports it."""
        fields = (self.actions, self.log_probs, self.values, self.rewards, self.terminated, self.dones,
                  self.episode_ends, self.episode_returns,
                  *(t for t in (self.action_masks, self.final_values) if t is not None))
        copies = 1 if self.next_obs is None else 2
        total = copies * observation_nbytes(self.obs) + sum(t.numel() * t.element_size() for t in fields)
        return total // (self.num_steps * self.num_envs)
