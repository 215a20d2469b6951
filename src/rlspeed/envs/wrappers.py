"""Observation and reward normalisation for batched envs, with running statistics kept on the device."""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import torch
from torch import nn

from rlspeed.device import statistics_dtype
from rlspeed.envs.base import BatchedEnv, EnvWrapper, ResetResult, StepResult, observation_layout
from rlspeed.errors import UserError

#: `(x - mean) / sqrt(var + EPSILON)`: the variance's floor in observation and reward normalisation (as SB3's)
EPSILON = 1e-8
#: the default clip of normalised observations and rewards, [-CLIP, CLIP] (SB3's clip_obs and clip_reward)
CLIP = 10.0


def fold_moments(mean: torch.Tensor, var: torch.Tensor, count: torch.Tensor, batch_count, batch_mean: torch.Tensor,
                 batch_var: torch.Tensor) -> None:
    """Parallel-variance merge of a batch's (count, mean, variance) into running (mean, var, count), in place.
    `count` may hold one count per leading index of `mean` (populations: counts `[K]` against moments `[K, ...]`)."""
    shape = count.shape + (1,) * (mean.dim() - count.dim())
    running = count.view(shape)
    delta = batch_mean - mean
    total = running + batch_count
    mean.add_(delta * (batch_count / total))
    m2 = var * running + batch_var * batch_count + delta.square() * (running * batch_count / total)
    var.copy_(m2 / total)
    count.copy_(total.view(count.shape))


def normalized(x: torch.Tensor, mean: torch.Tensor, var: torch.Tensor, clip: float) -> torch.Tensor:
    """`(x - mean) / sqrt(var + EPSILON)` clipped to [-clip, clip], in `x`'s dtype (float32 for integer `x`),
    computed in the statistics' dtype."""
    dtype = x.dtype if x.is_floating_point() else torch.float32
    return ((x - mean) / torch.sqrt(var + EPSILON)).clamp(-clip, clip).to(dtype)


def scaled_rewards(reward: torch.Tensor, var: torch.Tensor, clip: float) -> torch.Tensor:
    """`reward / sqrt(var + EPSILON)` (`var`: the variance of the discounted return) clipped to [-clip, clip], in
    `reward`'s dtype: reward normalisation's scaling."""
    return (reward / torch.sqrt(var + EPSILON)).clamp(-clip, clip).to(reward.dtype)


def advance_returns(returns: torch.Tensor, reward: torch.Tensor, gamma, ended: torch.Tensor,
                    fold: Callable[[torch.Tensor], None]) -> None:
    """One step of reward normalisation's running discounted returns, in place: `returns * gamma + reward`, folded
    into the return statistics by `fold`, then restarted from 0 on the rows whose episode `ended`."""
    returns.mul_(gamma).add_(reward)
    fold(returns)
    returns.mul_((~ended).to(torch.float32))


class RunningMeanStd(nn.Module):
    """Running mean and variance (parallel Welford update) as module buffers, so checkpoints carry them; kept in
    `statistics_dtype` (float64 where the device has it), on `device`. `shape`: one sample's shape (() for scalars);
    `epsilon`: the count the statistics start from, with mean 0 and variance 1 (as SB3's)."""

    def __init__(self, shape: tuple[int, ...] = (), epsilon: float = 1e-4, device: torch.device | str = "cpu"):
        super().__init__()
        dtype = statistics_dtype(device)
        self.register_buffer("mean", torch.zeros(shape, device=device, dtype=dtype))
        self.register_buffer("var", torch.ones(shape, device=device, dtype=dtype))
        self.register_buffer("count", torch.full((), epsilon, device=device, dtype=dtype))
        # Optional in-place sum over processes (set by DistributedStrategy). With it, `update` only accumulates
        # this rank's moments and `flush` (once per training iteration) folds the sum over all ranks into the
        # statistics: one collective per iteration instead of one per env step, identical statistics everywhere.
        self.reduce: Callable[[torch.Tensor], torch.Tensor] | None = None
        self._pending: torch.Tensor | None = None  # [count, sum..., sum of squares...] since the last flush

    @torch.no_grad()
    def update(self, batch: torch.Tensor) -> None:
        """Fold a batch `[B, *shape]` into the statistics (pure tensor ops: no host sync)."""
        batch = batch.to(self.mean.dtype)
        if self.reduce is None:
            self._fold(float(batch.shape[0]), batch.mean(0), batch.var(0, unbiased=False))
            return
        # Moments of x - mean (the running mean: the same on every rank, and fixed until the next flush). Raw sums
        # of x and x^2 would give var = E[x^2] - E[x]^2, which cancels catastrophically in float32 for features
        # whose mean is large against their spread (negative variances, NaN observations).
        # The sums are in the statistics' dtype, float64 where the device and its collectives have it: before the
        # first flush the running mean is still 0, and float32 could not hold both E[x^2] and the spread there.
        dtype = self.mean.dtype
        shifted = batch.reshape(batch.shape[0], -1) - self.mean.reshape(1, -1)
        moments = torch.cat((torch.full((1,), float(batch.shape[0]), device=batch.device, dtype=dtype),
                             shifted.sum(0), shifted.square().sum(0)))
        self._pending = moments if self._pending is None else self._pending + moments

    @torch.no_grad()
    def flush(self) -> None:
        """Distributed only: fold the moments every rank accumulated since the last flush (one all-reduce)."""
        if self.reduce is None or self._pending is None:
            return
        moments, self._pending = self.reduce(self._pending), None
        size = (moments.numel() - 1) // 2
        count, total, squares = moments[0], moments[1:1 + size], moments[1 + size:]
        shift = (total / count).view(self.mean.shape)  # the batch mean minus the running mean
        batch_var = ((squares / count).view(self.mean.shape) - shift.square()).clamp_(min=0.0)
        self._fold(count, self.mean + shift, batch_var)

    def _fold(self, batch_count, batch_mean: torch.Tensor, batch_var: torch.Tensor) -> None:
        """Parallel-variance merge of a batch's (count, mean, variance) into the running statistics."""
        fold_moments(self.mean, self.var, self.count, batch_count, batch_mean, batch_var)

    def normalize(self, x: torch.Tensor, clip: float = CLIP) -> torch.Tensor:
        """`normalized` by these statistics; the statistics are not updated."""
        return normalized(x, self.mean, self.var, clip)


def _drop_stats_prefix(module, state_dict, prefix, local_metadata) -> None:
    inner = f"{prefix}stats."
    for name in [name for name in state_dict if name.startswith(inner)]:
        state_dict[prefix + name[len(inner):]] = state_dict.pop(name)


def _add_stats_prefix(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                      error_msgs) -> None:
    for name in list(state_dict):
        if name.startswith(prefix) and name[len(prefix):].split(".", 1)[0] in module.stats:
            state_dict[f"{prefix}stats.{name[len(prefix):]}"] = state_dict.pop(name)


class DictRunningMeanStd(nn.Module):
    """`RunningMeanStd` per float key of Dict observations; the other keys (images, indices) pass through unchanged.

    Its state dict holds `<key>.mean`, `<key>.var` and `<key>.count` per normalised key.
    """

    def __init__(self, shapes: dict[str, tuple[int, ...]], device: torch.device | str = "cpu"):
        super().__init__()
        self.stats = nn.ModuleDict({key: RunningMeanStd(shape, device=device) for key, shape in shapes.items()})

        # the state dict names `<key>.<stat>` (not `stats.<key>.<stat>`), also inside a parent module's state dict
        self.register_state_dict_post_hook(_drop_stats_prefix)
        self.register_load_state_dict_pre_hook(_add_stats_prefix)

    @property
    def reduce(self):
        return None

    @reduce.setter
    def reduce(self, value) -> None:
        for rms in self.stats.values():
            rms.reduce = value

    def update(self, obs: dict[str, torch.Tensor]) -> None:
        """Fold the float keys of a batch into their statistics."""
        for key, rms in self.stats.items():
            rms.update(obs[key])

    def flush(self) -> None:
        for rms in self.stats.values():
            rms.flush()

    def normalize(self, obs: dict[str, torch.Tensor], clip: float = CLIP) -> dict[str, torch.Tensor]:
        """The float keys normalised (`RunningMeanStd.normalize`), the others as they are."""
        return {key: self.stats[key].normalize(value, clip) if key in self.stats else value
                for key, value in obs.items()}


def normalizable(space: gym.Space) -> bool:
    """Whether observation normalisation has anything to normalise in `space` (an `EnvSpec.observation_space`): float
    vectors, or a Dict with a float key. A preset's `normalize_obs: true` meant for vectors does not apply otherwise."""
    layout = observation_layout(space)
    parts = layout.values() if isinstance(layout, dict) else (layout,)
    return any(dtype == torch.float32 for _, dtype in parts)


def observation_statistics(space: gym.Space, device: torch.device | str = "cpu") -> nn.Module:
    """The running statistics observation normalisation keeps for `space` (an `EnvSpec.observation_space`): a
    `RunningMeanStd` for float vectors, a `DictRunningMeanStd` over the float keys of a Dict; UserError for
    observations with nothing to normalise (images are scaled by the CNN encoder, indices are one-hot encoded)."""
    layout = observation_layout(space)
    if not isinstance(layout, dict):
        shape, dtype = layout
        if dtype != torch.float32:
            raise UserError(f"normalize_obs applies to float vector observations, and these are {dtype} "
                            f"{type(space).__name__} observations (images are scaled to [0, 1] by the CNN encoder, "
                            "indices one-hot encoded): drop normalize_obs.")
        return RunningMeanStd(shape, device=device)
    floats = {key: shape for key, (shape, dtype) in layout.items() if dtype == torch.float32}
    if not floats:
        raise UserError("normalize_obs applies to float vector observations, and this Dict observation has no float "
                        f"key (keys: {', '.join(layout)}): drop normalize_obs.")
    return DictRunningMeanStd(floats, device=device)


class NormalizeObservation(EnvWrapper):
    """Normalises observations (and `info["final_obs"]`) by running statistics updated on every step.

    Only float vectors are normalised: for Dict observations, the float keys (images and indices pass through); other
    observations are refused (`observation_statistics`). Set `training = False` to freeze the statistics (for
    evaluation; set on an outer wrapper, it reaches this one too). `obs_rms` is the statistics module (default: new
    statistics for the env's observation space). Normalised values are clipped to [-`clip`, `clip`].

    `hand_out_raw = True` keeps updating the statistics but hands out the env's own observations: the off-policy
    algorithms set it while `learn` runs (`normalize_obs`, or Hindsight Experience Replay on this wrapper) and set it
    back when it returns or raises; their replay stores the env's own observations and normalises each batch (after
    relabelling, for HER), as SB3's VecNormalize does.
    """

    counted_beneath = True
    hand_out_raw = False

    def __init__(self, env: BatchedEnv, clip: float = CLIP, obs_rms: nn.Module | None = None):
        super().__init__(env)
        self.obs_rms = obs_rms or observation_statistics(env.spec.observation_space, device=env.device)
        self.clip = clip

    def reset(self, seed: int | None = None) -> ResetResult:
        """Reset the inner env and return normalised obs (folded into the statistics first while `training`)."""
        obs, info = self.env.reset(seed=seed)
        if self._training:  # this wrapper's own flag: `training` also looks inside
            self.obs_rms.update(obs)
        return (obs if self.hand_out_raw else self.obs_rms.normalize(obs, self.clip)), info

    def step(self, actions: torch.Tensor) -> StepResult:
        """Step the inner env, then normalise `obs` and `info["final_obs"]` with the running statistics.

        While `training`, the statistics are first updated with the returned `obs` (not with `final_obs`).
        """
        obs, reward, terminated, truncated, info = self.env.step(actions)
        if self._training:
            self.obs_rms.update(obs)
        if self.hand_out_raw:
            return obs, reward, terminated, truncated, info
        normalized = self.obs_rms.normalize(obs, self.clip)
        # a step where no env finished hands `obs` itself as final_obs: normalise it once
        final = info["final_obs"]
        info["final_obs"] = normalized if final is obs else self.obs_rms.normalize(final, self.clip)
        return normalized, reward, terminated, truncated, info


class NormalizeReward(EnvWrapper):
    """Scales rewards by the running standard deviation of the discounted return (as SB3's VecNormalize).

    `gamma`: the discount of that return (the algorithm's); scaled rewards are clipped to [-`clip`, `clip`].

    `hand_out_raw = True` keeps updating the statistics but hands out the env's own rewards: the off-policy
    algorithms set it while `learn` runs (`normalize_reward`) and set it back when it returns or raises; their replay
    stores the env's own rewards and scales each batch's with `scale` (after relabelling, for HER), as SB3's
    VecNormalize does.
    """

    counted_beneath = True
    hand_out_raw = False

    def __init__(self, env: BatchedEnv, gamma: float = 0.99, clip: float = CLIP):
        super().__init__(env)
        self.return_rms = RunningMeanStd((), device=env.device)
        self.gamma = gamma
        self.clip = clip
        self._returns = torch.zeros(env.num_envs, device=env.device, dtype=torch.float32)

    def _own_state(self) -> dict[str, torch.Tensor]:
        return {"_returns": self._returns}

    def reset(self, seed: int | None = None) -> ResetResult:
        """Zero the running discounted returns, then reset the inner env (observations unchanged)."""
        self._returns.zero_()
        return self.env.reset(seed=seed)

    def step(self, actions: torch.Tensor) -> StepResult:
        """Step the inner env and divide the reward by the running std of the discounted return, clipped.

        While `training`, each env's discounted return and its statistics are updated first; a return restarts from 0
        after its episode ends. Observations and info pass through unchanged.
        """
        obs, reward, terminated, truncated, info = self.env.step(actions)
        if self._training:
            advance_returns(self._returns, reward, self.gamma, terminated | truncated, self.return_rms.update)
        return obs, reward if self.hand_out_raw else self.scale(reward), terminated, truncated, info

    def scale(self, reward: torch.Tensor) -> torch.Tensor:
        """`scaled_rewards` by the running variance of the discounted return; the statistics are not updated."""
        return scaled_rewards(reward, self.return_rms.var, self.clip)
