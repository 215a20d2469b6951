"""Observation and reward normalisation of a population's env: each member's rows by that member's own statistics.

A solo run with `normalize_obs` / `normalize_reward` wraps its N envs in `rlspeed.envs.wrappers.NormalizeObservation`
(inside) and `NormalizeReward` (outside). A population's env holds K blocks of N rows, one block per member;
`MemberNormalize` applies both to every block with that member's statistics, in the same order and with the same
formulas (`RunningMeanStd`'s parallel-variance merge of each step's N rows, the config's clips (one for the
population), epsilon 1e-8, each member's own gamma for the discounted return), so member k's statistics and normalised
data are its solo run's.

The statistics are `MemberStatistics`: `[K, ...]` tensors the population owns (cut down when members leave, saved in
its checkpoints); the wrapper updates them in place while `training`, and only reads them when frozen (evaluation).
Dict observations reach the wrapper packed into flat rows (`rlspeed.population.base.PackedObservations`): as a solo
run's `DictRunningMeanStd`, only their float keys are normalised (`MemberStatistics.float_keys`: their columns, side
by side in the statistics), and the other keys (images, indices) pass through as they are.
The running discounted returns are per env row, the wrapper's own state (`state_dict`: exact resume of native envs).
"""

from __future__ import annotations

import dataclasses

import torch

from rlspeed.device import statistics_dtype
from rlspeed.envs.base import BatchedEnv, EnvWrapper
from rlspeed.envs.wrappers import CLIP, advance_returns, fold_moments, normalized, scaled_rewards

_INITIAL_COUNT = 1e-4  # as `RunningMeanStd`


@dataclasses.dataclass
class MemberStatistics:
    """Running means, variances and counts per member: observations `[K, *observation_shape]`, discounted returns
    `[K]` (`None` where that normalisation is off), as a solo run's `obs_rms` and `return_rms` hold them.

    `float_keys`: for Dict observations packed into flat rows, the float keys the observation statistics cover, as
    `(key, shape, first column, end column)` of the packed row, in the row's order; the statistics are `[K, F]`, the
    keys' flattened columns side by side (one count per member: every key folds the same rows). None: the
    observations are one float tensor, all of it normalised."""

    obs_mean: torch.Tensor | None
    obs_var: torch.Tensor | None
    obs_count: torch.Tensor | None
    ret_mean: torch.Tensor | None
    ret_var: torch.Tensor | None
    ret_count: torch.Tensor | None
    float_keys: tuple[tuple[str, tuple[int, ...], int, int], ...] | None = None

    @classmethod
    def fresh(cls, size: int, observation_shape: tuple[int, ...], observations: bool, rewards: bool,
              device: torch.device, float_keys: tuple | None = None) -> MemberStatistics:
        """Statistics before any data (mean 0, variance 1, count 1e-4, in `statistics_dtype`, as `RunningMeanStd`
        starts); with `float_keys` (packed Dict rows), statistics of those keys' columns only."""
        dtype = statistics_dtype(device)
        if float_keys is not None:
            observation_shape = (sum(end - start for _key, _shape, start, end in float_keys),)

        def moments(shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            return (torch.zeros(shape, device=device, dtype=dtype), torch.ones(shape, device=device, dtype=dtype),
                    torch.full((size,), _INITIAL_COUNT, device=device, dtype=dtype))

        obs = moments((size, *observation_shape)) if observations else (None, None, None)
        ret = moments((size,)) if rewards else (None, None, None)
        return cls(*obs, *ret, float_keys=float_keys if observations else None)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The statistics that exist, by field name."""
        return {name: value for name in _TENSORS if (value := getattr(self, name)) is not None}

    def rows(self, index: torch.Tensor) -> MemberStatistics:
        """New tensors holding the members at `index` (positions along K)."""
        return MemberStatistics(**{name: None if getattr(self, name) is None else getattr(self, name)[index].clone()
                                   for name in _TENSORS}, float_keys=self.float_keys)

    def observed(self, obs: torch.Tensor) -> torch.Tensor:
        """The part of observations `[..., row]` the statistics cover: all of it, or the float keys' columns of
        packed Dict rows (`float_keys`)."""
        if self.float_keys is None:
            return obs
        return torch.cat([obs[..., start:end] for _key, _shape, start, end in self.float_keys], dim=-1)

    def store(self, index: torch.Tensor, rows: MemberStatistics) -> None:
        """Write `rows` (one per entry of `index`) into these statistics at `index`."""
        for name, value in rows.tensors().items():
            getattr(self, name)[index] = value

    def normalize_obs(self, obs: torch.Tensor, clip: float = CLIP) -> torch.Tensor:
        """Observations `[K, B, ...]` (member k's in row k), each member's normalised by its statistics (`normalized`,
        clipped to [-`clip`, `clip`]), in `obs`'s dtype; the statistics are not updated."""
        shape = (-1,) + (1,) * (obs.dim() - self.obs_mean.dim())
        scaled = normalized(self.observed(obs), self.obs_mean.view(shape + self.obs_mean.shape[1:]),
                            self.obs_var.view(shape + self.obs_var.shape[1:]), clip)
        if self.float_keys is None:
            return scaled
        out, offset = obs.clone(), 0
        for _key, _shape, start, end in self.float_keys:
            out[..., start:end] = scaled[..., offset:offset + end - start]
            offset += end - start
        return out

    def scale_rewards(self, reward: torch.Tensor, clip: float = CLIP) -> torch.Tensor:
        """Rewards `[K, ...]` (member k's in row k), each member's scaled by the running variance of its discounted
        return (`scaled_rewards`, clipped to [-`clip`, `clip`]), in `reward`'s dtype; the statistics are not
        updated."""
        return scaled_rewards(reward, self.ret_var.view((-1,) + (1,) * (reward.dim() - 1)), clip)

    def solo_state(self, row: int) -> dict[str, torch.Tensor]:
        """Member `row`'s statistics named as a solo model's checkpoint names them (`obs_rms.mean`, ...; with
        `float_keys`, `obs_rms.<key>.mean`, ... per key in the key's shape, as `DictRunningMeanStd` names them)."""
        state = {}
        for prefix, short in (("obs_rms", "obs"), ("return_rms", "ret")):
            if getattr(self, f"{short}_mean") is not None:
                for field in ("mean", "var", "count"):
                    state[f"{prefix}.{field}"] = getattr(self, f"{short}_{field}")[row].clone()
        if self.float_keys is not None and self.obs_mean is not None:
            offset = 0
            for key, shape, start, end in self.float_keys:
                for field in ("mean", "var"):
                    state[f"obs_rms.{key}.{field}"] = state[f"obs_rms.{field}"][offset:offset + end - start].reshape(
                        shape)
                state[f"obs_rms.{key}.count"] = state["obs_rms.count"].clone()
                offset += end - start
            for field in ("mean", "var", "count"):
                del state[f"obs_rms.{field}"]
        return state

    def set_solo_state(self, row: int, state: dict[str, torch.Tensor]) -> None:
        """Write into member `row` the statistics `state` names as `solo_state` names them (a solo model's checkpoint
        tensors: `obs_rms.mean`, ...; with `float_keys`, `obs_rms.<key>.mean`, ... per key), each in these statistics'
        dtype: `solo_state`'s inverse. KeyError naming a statistic `state` lacks, ValueError for one of another
        shape."""
        wanted = self.solo_state(row)
        for name, like in wanted.items():
            if name not in state:
                raise KeyError(name)
            if tuple(state[name].shape) != tuple(like.shape):
                raise ValueError(f"'{name}' is {tuple(state[name].shape)}, these statistics' {tuple(like.shape)}")
        for prefix, short in (("obs_rms", "obs"), ("return_rms", "ret")):
            if getattr(self, f"{short}_mean") is None:
                continue
            for field in ("mean", "var", "count"):
                held = getattr(self, f"{short}_{field}")
                if short == "obs" and self.float_keys is not None:
                    # (one count per member, every key's alike: the first key's)
                    parts = [state[f"obs_rms.{key}.{field}"].flatten() for key, *_ in self.float_keys]
                    saved = parts[0].reshape(()) if field == "count" else torch.cat(parts)
                else:
                    saved = state[f"{prefix}.{field}"]
                held[row] = saved.to(held.device, held.dtype)


#: the statistics' tensor fields, `MemberStatistics.tensors`'s names
_TENSORS = ("obs_mean", "obs_var", "obs_count", "ret_mean", "ret_var", "ret_count")


def _fold(mean: torch.Tensor, var: torch.Tensor, count: torch.Tensor, batch: torch.Tensor) -> None:
    """Merge each member's batch `[K, N, ...]` into its running (mean, var, count) in place: `fold_moments` of the
    batch's count, mean and (biased) variance, member by member in one set of kernels."""
    fold_moments(mean, var, count, float(batch.shape[1]), batch.mean(1), batch.var(1, unbiased=False))


class MemberNormalize(EnvWrapper):
    """`NormalizeObservation` then `NormalizeReward` of a population env whose rows are K blocks of
    `rows_per_member`, block k by member k's `statistics` (see the module docstring). `gamma` `[K]`: each member's
    discount for the running return; `obs_clip`, `reward_clip`: the clips of normalised observations and rewards.
    Set `training = False` to freeze the statistics (evaluation envs).

    `hand_out_raw = True` keeps updating the statistics but hands out the env's own observations and rewards, as the
    solo wrappers' flag: the off-policy populations' training env, whose replay stores the env's own rows and
    normalises each sampled batch (`MemberStatistics.normalize_obs`, `scale_rewards`).
    """

    hand_out_raw = False

    def __init__(self, env: BatchedEnv, rows_per_member: int, statistics: MemberStatistics,
                 gamma: torch.Tensor | None = None, obs_clip: float = CLIP, reward_clip: float = CLIP):
        super().__init__(env)
        self.rows_per_member = rows_per_member
        self.obs_clip, self.reward_clip = obs_clip, reward_clip
        self.statistics = statistics
        self.members = env.num_envs // rows_per_member
        self._gamma = None if gamma is None else gamma.repeat_interleave(rows_per_member)
        self._returns = torch.zeros(env.num_envs, device=env.device, dtype=torch.float32)

    def _own_state(self) -> dict[str, torch.Tensor]:
        return {"_returns": self._returns}

    def _blocks(self, x: torch.Tensor) -> torch.Tensor:
        """Rows `[K * N, ...]` as member blocks `[K, N, ...]` (a view where the rows are contiguous)."""
        return x.reshape(self.members, self.rows_per_member, *x.shape[1:])

    def _normalize_obs(self, obs: torch.Tensor) -> torch.Tensor:
        return self.statistics.normalize_obs(self._blocks(obs), self.obs_clip).reshape(obs.shape)

    def _update_obs(self, obs: torch.Tensor) -> None:
        if self.statistics.obs_mean is not None and self._training:
            stats = self.statistics
            _fold(stats.obs_mean, stats.obs_var, stats.obs_count,
                  self._blocks(stats.observed(obs).to(stats.obs_mean.dtype)))

    def reset(self, seed=None):
        """Zero the running returns, reset the inner env, fold the first observations in (while `training`) and
        return them normalised (as they are with `hand_out_raw`)."""
        self._returns.zero_()
        obs, info = self.env.reset(seed=seed)
        if self.statistics.obs_mean is None:
            return obs, info
        self._update_obs(obs)
        return (obs if self.hand_out_raw else self._normalize_obs(obs)), info

    @torch.no_grad()
    def step(self, actions: torch.Tensor):
        """Step the inner env; observations (and `info["final_obs"]`) normalised after folding `obs` in, rewards
        divided by the running std of each member's discounted return after updating it, as the solo wrappers do
        (with `hand_out_raw`, the statistics updated and the env's own observations and rewards handed out)."""
        obs, reward, terminated, truncated, info = self.env.step(actions)
        stats = self.statistics
        if stats.obs_mean is not None:
            self._update_obs(obs)
            if not self.hand_out_raw:
                normalized = self._normalize_obs(obs)
                final = info["final_obs"]
                info["final_obs"] = normalized if final is obs else self._normalize_obs(final)
                obs = normalized
        if stats.ret_var is not None:
            if self._training:
                advance_returns(self._returns, reward, self._gamma, terminated | truncated,
                                lambda returns: _fold(stats.ret_mean, stats.ret_var, stats.ret_count,
                                                      self._blocks(returns).to(stats.ret_mean.dtype)))
            if not self.hand_out_raw:
                reward = stats.scale_rewards(self._blocks(reward), self.reward_clip).reshape(reward.shape)
        return obs, reward, terminated, truncated, info
