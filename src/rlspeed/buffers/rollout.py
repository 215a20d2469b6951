"""Rollout storage for on-policy algorithms, preallocated on the device, and GAE in one vectorised pass."""

from __future__ import annotations

import torch

# Above this many elements in the [T, T, N] discount matrix, GAE falls back to the reverse scan (same result).
_MATRIX_GAE_MAX_ELEMENTS = 1 << 24


def gae(rewards: torch.Tensor, values: torch.Tensor, next_values: torch.Tensor, terminated: torch.Tensor,
        dones: torch.Tensor, gamma: float, gae_lambda: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over `[T, N]` tensors. Returns (advantages, returns).

    `next_values[t]` is V of the observation step t led to (`info["final_obs"]`), so a truncated episode is
    bootstrapped from its true last observation and a terminated one is not bootstrapped at all:

        delta_t = r_t + gamma * V(s'_t) * (1 - terminated_t) - V(s_t)
        A_t     = delta_t + gamma * lambda * (1 - done_t) * A_{t+1}

    The recursion is evaluated as one weighted sum, A = G @ delta with G[t, s] = prod_{k=t}^{s-1} c_k, built with
    one cumprod over a `[T, T, N]` tensor: a handful of kernels instead of T small steps.
    """
    not_terminated = 1.0 - terminated.to(rewards.dtype)
    deltas = rewards + gamma * next_values * not_terminated - values
    carry = gamma * gae_lambda * (1.0 - dones.to(rewards.dtype))  # c_t, [T, N]
    steps = rewards.shape[0]
    if steps * steps * rewards[0].numel() > _MATRIX_GAE_MAX_ELEMENTS:
        advantages = torch.empty_like(deltas)
        running = torch.zeros_like(deltas[0])
        for t in range(steps - 1, -1, -1):
            running = deltas[t] + carry[t] * running
            advantages[t] = running
        return advantages, advantages + values
    index = torch.arange(steps, device=rewards.device)
    # factors[t, k] = c_{k-1} for k > t, else 1; cumprod over k gives prod_{j=t}^{s-1} c_j at [t, s].
    shifted = torch.cat((torch.ones_like(carry[:1]), carry[:-1]), dim=0)  # shifted[k] = c_{k-1}
    after = (index.view(-1, 1) < index.view(1, -1)).view(steps, steps, *([1] * (carry.dim() - 1)))
    factors = torch.where(after, shifted.unsqueeze(0), torch.ones((), dtype=carry.dtype, device=carry.device))
    weights = torch.cumprod(factors, dim=1)
    # Only s >= t counts. The lower triangle is zero-filled after weighting, not multiplied by a 0/1 mask: 0 * an inf
    # delta is NaN, which would reach the advantages of the steps after it (the reverse scan never adds it to those).
    lower = after.transpose(0, 1)  # [t, s] with s < t
    advantages = weights.mul_(deltas.unsqueeze(0)).masked_fill_(lower, 0.0).sum(dim=1)
    return advantages, advantages + values


class RolloutBuffer:
    """Fixed-shape `[T, N, ...]` tensors for one rollout; written in place, one row of N envs per step."""

    def __init__(self, num_steps: int, num_envs: int, obs_shape: tuple[int, ...], action_shape: tuple[int, ...],
                 action_dtype: torch.dtype, device: torch.device):
        def zeros(*shape, dtype=torch.float32):
            return torch.zeros(num_steps, num_envs, *shape, device=device, dtype=dtype)

        self.num_steps, self.num_envs = num_steps, num_envs
        self.obs = zeros(*obs_shape)
        self.next_obs = zeros(*obs_shape)  # info["final_obs"]: what each action led to
        self.actions = zeros(*action_shape, dtype=action_dtype)
        self.log_probs = zeros()
        self.values = zeros()
        self.rewards = zeros()
        self.terminated = zeros(dtype=torch.bool)
        self.dones = zeros(dtype=torch.bool)

    def add(self, step: int, obs, next_obs, actions, log_probs, values, rewards, terminated, dones) -> None:
        """Copy one step of all N envs into row `step` (in place, no allocation).

        `next_obs` is `info["final_obs"]` (what each action led to), `dones` is `terminated | truncated`; the tensors
        are `[N, ...]` and are cast to the buffer's dtypes.
        """
        self.obs[step].copy_(obs)
        self.next_obs[step].copy_(next_obs)
        self.actions[step].copy_(actions)
        self.log_probs[step].copy_(log_probs)
        self.values[step].copy_(values)
        self.rewards[step].copy_(rewards)
        self.terminated[step].copy_(terminated)
        self.dones[step].copy_(dones)
