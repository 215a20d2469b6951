"""SAC, TD3, DDPG and DQN populations: K independent off-policy agents trained in one process as one batched model.

Every parameter, Adam moment, replay row and env row has the members stacked along a leading dimension `K`: each
layer of the K actors is one batched matmul, the K members' twin critics are one ensemble of `K x n_critics`
networks, the envs are one env of `K x N` rows (`PopulationBase._make_env`), the replay buffer stores `[steps, K, N]`
rows (Atari frame stacks: each member in its own solo frame buffer, `MemberFrameReplay`, storing each frame once), and
one update call takes a gradient step for every member. Member `k` is a solo
`SAC(env_id, seed=seeds[k], ...)` (or TD3, DDPG, DQN):

* its initial weights are the solo model's (K solo models are built and their parameters stacked);
* its env rows are the solo run's envs: on a native env (`env_backend="torch"`, the default where the id has one)
  they draw the solo run's env streams (`NativeEnv.seed_row_blocks`); on Gymnasium's (`env_backend="gymnasium"`, the
  default for ids without a native env) member k's env i is reset with seed `seeds[k] + i`, as a solo run's is; on
  EnvPool's (`env_backend="envpool"`, the default for Atari games where it is installed) member k has its own pool
  made with seed `seeds[k]`, as a solo run's (`MemberEnvs`);
* every random draw of the solo run (uniform actions before `learning_starts`, exploration noise or epsilon-greedy's
  draws, replay indices, the policy's and the target smoothing's noise in the update) comes from member k's own
  `torch.Generator`, started from the state the solo run's global generator has when its training starts, in the
  solo run's order and shapes, so they are the solo run's draws;
* with `normalize_obs` / `normalize_reward`, its own running statistics (`rlspeed.population.normalize`), updated
  from its env rows as the solo run's wrappers update theirs; the env hands out its own observations and rewards,
  which the replay stores, and the member acts on observations normalised by its statistics and updates on batches
  normalised (and rewards scaled) by them at sampling time, as the solo run's `VecNormalize`-like replay does;
* per-member hyperparameters that do not change shapes (`PER_MEMBER_SAC`, `PER_MEMBER_TD3`, `PER_MEMBER_DQN`) are
  tensors `[K]` (or host values where the solo run uses host floats: DQN's epsilon schedule); Adam and DQN's
  gradient clipping are per member (TD3's actor steps only every `policy_delay`).

SAC's gradient is written out by hand for all members at once (as `rlspeed.fused.sac` writes one model's: actors as
one ensemble of K, critics as one of K x n_critics), Adam and the Polyak step run on flat buffers; TD3, DDPG and DQN
take autograd of the members' summed losses (they share no parameter). These are not the solo run's kernels, so
member k's weights equal the solo run's to float tolerance, not bitwise (tests/test_population_offpolicy.py checks
the first updates to 1e-5). Two things hold only where they hold for the solo run too: once the replay buffer wraps,
it overwrites the solo buffer's rows only when `buffer_size` is a multiple of `num_envs`; and SAC's policy noise is
one draw of `2 x batch_size` rows per update, as the solo's hand-derived update draws it (its autograd reference
draws `batch_size` rows twice: the same numbers on a CPU when `batch_size` is a multiple of 16), row-major as the
solo's draws are (`SACPopulation._solo_noise`).

A member that reaches its target (`stop="each"`), that `on_eval` prunes, or whose parameters become non-finite
leaves the computation: its parameters, moments, replay rows, env rows and observations are dropped from the stacks
(`PopulationBase._env_rows`: the others' envs continue exactly, Gymnasium's env objects mid-episode).

Covered now: SAC, TD3 and DDPG with rlspeed's default MLP networks on envs with Box actions, DQN with a plain or
dueling MLP on envs with Discrete actions (and their action masks, `use_masking`), on float-vector observations,
one-hot Discrete ones, flattened bool or integer vectors and Dict or Tuple observations of those (the solo's encoder
without parameters, `_inputs`), and for DQN also images through each member's own CNN and Dict or Tuple observations
through its own multi-input encoder, as `rlspeed.population.ppo` says: the native envs
(`rlspeed.envs.registry.NATIVE_ENVS`) and any registered Gymnasium env (one synchronous vector env, or with
`env_backend="gymnasium-async"` one subprocess vector env per member: `MemberEnvs`), on one device, behind
`Population(...)`, `rlspeed train --seeds [--env-backend gymnasium]` and `rlspeed tune`.

Checkpoints (`save`, `resume`, `learn(run_dir=..., checkpoint_freq=...)`, see `PopulationBase`) hold the stacked
networks and targets, every row of the members that left (`member_state` returns them), the flat Adams' moments and
steps, the per-member hyperparameter tensors, the normalisation statistics, the schedules' span and TD3's noise
process and update count; with `save_replay_buffer=True` the replay buffer goes beside each checkpoint
(`<name>.replay.safetensors`, its rows recorded as the env's own: `contents`), else a resumed replay starts empty.
"""

from __future__ import annotations

import math
import secrets
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F

from rlspeed.algos.base import progress_remaining
from rlspeed.algos.dqn import TD_LOSSES, collection_epsilons
from rlspeed.algos.off_policy import (
    RAW_CONTENTS,
    OffPolicyAlgorithm,
    OffPolicyConfig,
    allowed_uniform,
    clamped,
    next_masks,
    no_update_reason,
)
from rlspeed.buffers.replay import (
    FrameStackReplayBuffer,
    check_masks_given,
    count_unwritten_host_storage,
    frame_stacks,
    refuse_unless_fits,
    storage_zeros,
    window_entry,
)
from rlspeed.checkpoint import beside, load_paired, replay_path, save_checkpoint, staged_path
from rlspeed.device import check_num_threads, float32_default, rules, training_threads
from rlspeed.envs import atari
from rlspeed.envs.base import observation_layout
from rlspeed.errors import UserError, positive_whole
from rlspeed.fused.flat import Workspace, activation_reason, ensemble_backward, ensemble_forward, ensemble_input_grad
from rlspeed.nn import (
    ACTIVATIONS,
    LOG_2,
    LOG_2PI,
    LOG_STD_MAX,
    LOG_STD_MIN,
    dueling_q_values,
    ensemble_linear,
    masked_logits,
)
from rlspeed.population.base import (
    MemberEncoder,
    PopulationBase,
    config_tensors,
    fused_adam_members,
    has_parameters,
    member_features,
    member_grad_norms,
    packed_width,
    planned_total_timesteps,
    saved_like,
    stack_leaf,
)

#: SAC hyperparameters a member may set for itself (none changes a tensor's shape or the loop)
PER_MEMBER_SAC = ("learning_rate", "gamma", "tau", "ent_coef", "ent_coef_init", "target_entropy")
#: TD3 hyperparameters a member may set for itself
PER_MEMBER_TD3 = ("learning_rate", "gamma", "tau", "target_policy_noise", "target_noise_clip", "action_noise_std",
                  "ou_theta", "ou_dt")
#: DQN hyperparameters a member may set for itself
PER_MEMBER_DQN = ("learning_rate", "gamma", "tau", "max_grad_norm", "exploration_fraction", "exploration_initial_eps",
                  "exploration_final_eps")
#: Hyperparameters that change shapes or the loop's structure: one value for the whole population
SHARED_ONLY_OFFPOLICY = ("net_arch", "num_envs", "train_freq", "gradient_steps", "batch_size", "learning_starts",
                         "anneal_lr", "adam_eps", "ortho_init", "buffer_size", "n_step", "activation", "encoder",
                         "cnn_features_dim", "cnn", "normalize_images", "n_critics", "fused_update", "policy_delay",
                         "action_noise", "target_update_interval", "double_q", "dueling", "use_masking",
                         "normalize_obs", "normalize_reward", "normalize_obs_clip", "normalize_reward_clip")
_ADAM_BETAS = (0.9, 0.999)  # as `rlspeed.nn.make_adam` (epsilon: the config's adam_eps)
_SAMPLE_ROWS = 2**16  # as `rlspeed.algos.off_policy`: replay rows gathered at once for several gradient steps


def _stack_linears(modules: Sequence[torch.nn.Module], trainable: bool = True
                   ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(weights `[K, in, out]`, biases `[K, 1, out]`) per layer of the `nn.Linear` layers of K solo MLPs (one module
    per member), as `OffPolicyPopulation._mlp` takes them; `trainable=False` for target networks."""
    linears = [[m for m in module if isinstance(m, torch.nn.Linear)] for module in modules]
    layers = range(len(linears[0]))
    weights = [stack_leaf([member[i].weight.T for member in linears]).requires_grad_(trainable) for i in layers]
    biases = [stack_leaf([member[i].bias.unsqueeze(0) for member in linears]).requires_grad_(trainable) for i in layers]
    return weights, biases


def _linear_state(prefix: str, weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor]
                  ) -> dict[str, torch.Tensor]:
    """One member's rows of stacked `nn.Linear` layers (`_stack_linears`' layout) named as the solo
    `nn.Sequential` at `prefix` names them (`{prefix}.0.weight`, `{prefix}.2.bias`, ...: activations between the
    layers)."""
    state = {}
    for layer, (weight, bias) in enumerate(zip(weights, biases)):
        state[f"{prefix}.{2 * layer}.weight"] = weight.detach().T.clone()
        state[f"{prefix}.{2 * layer}.bias"] = bias[0].detach().clone()
    return state


#: Parameters per member from which `_FlatMemberAdam` steps each member through torch's fused Adam kernel (K calls)
#: rather than the flat formula over every member at once (a few kernels, each a full pass over all members'
#: elements): below it the K calls cost more than the passes save. benchmarks/member_adam.py measures both paths on
#: the shipped presets' populations, on both sides of this value.
FUSED_ADAM_MIN_PARAMS = 4_000


class _FlatMemberAdam:
    """Adam over parameters `[K, ...]` with per-member learning rates (`rlspeed.nn.make_adam`'s betas and eps; the
    same maths as torch's fused Adam) on one flat buffer: the parameters become views of `flat` (and their gradients
    views of `grad`), so a step is a few kernels for all parameters of all members. Every member steps on every
    update of this Adam (a member that stops leaves the buffer), so the step count and bias corrections are shared;
    each element's learning rate is its member's (`learning_rates`, looked up once per layout). Where torch has the
    fused kernel (CPU, CUDA) and a member has `FUSED_ADAM_MIN_PARAMS` parameters or more, each member's
    views step through it instead (`fused`; tests/test_population_offpolicy_gym.py checks the two agree)."""

    def __init__(self, params: Sequence[torch.Tensor], learning_rate: torch.Tensor, eps: float,
                 exp_avg: Sequence[torch.Tensor] | None = None, exp_avg_sq: Sequence[torch.Tensor] | None = None,
                 steps: int = 0):
        size, device = params[0].shape[0], params[0].device
        sizes = [p.numel() for p in params]
        with torch.no_grad():
            self.flat = torch.cat([p.detach().reshape(-1) for p in params])
            self.exp_avg = (torch.cat([m.reshape(-1) for m in exp_avg]) if exp_avg is not None
                            else torch.zeros_like(self.flat))
            self.exp_avg_sq = (torch.cat([v.reshape(-1) for v in exp_avg_sq]) if exp_avg_sq is not None
                               else torch.zeros_like(self.flat))
        self.grad = torch.zeros_like(self.flat)
        self.steps, self.eps = steps, eps
        #: the learning rates' factor for the next steps (`anneal_lr`: the progress remaining, as a solo run's)
        self.lr_scale = 1.0
        members = torch.arange(size, device=device)
        self.member_of = torch.cat([members.repeat_interleave(n // size) for n in sizes])
        self.learning_rates = torch.index_select(learning_rate, 0, self.member_of)
        self.offsets = [0]
        for n in sizes:
            self.offsets.append(self.offsets[-1] + n)

        def views(buffer: torch.Tensor) -> list[torch.Tensor]:
            return [chunk.view_as(p) for chunk, p in zip(buffer.split(sizes), params)]

        self.param_views = views(self.flat)
        for p, view in zip(params, self.param_views):
            p.data = view
        self.grad_views = views(self.grad)
        self.exp_avg_views, self.exp_avg_sq_views = views(self.exp_avg), views(self.exp_avg_sq)
        #: whether steps run torch's fused kernel member by member (see the class docstring)
        self.fused = device.type in ("cpu", "cuda") and sum(sizes) // size >= FUSED_ADAM_MIN_PARAMS
        self._member_lrs = learning_rate.tolist() if self.fused else None  # ok-sync: once per layout
        self._step_count = torch.zeros((), device=device)
        #: each member's (params, grads, exp_avgs, exp_avg_sqs) views per `parts` of a fused step (`_fused_step`)
        self._part_views: dict[tuple, list[tuple]] = {}

    @torch.no_grad()
    def step(self, parts: Sequence[slice] | None = None, advance: bool = True) -> None:
        """One Adam step of every member from the gradients in `grad`; `parts`: only the elements in these slices of
        the flat buffers (a step taken in pieces passes `advance=False` after the first: see
        `rlspeed.fused.flat.FlatAdam.step`)."""
        beta1, beta2 = _ADAM_BETAS
        if advance:
            self.steps += 1
        if self.fused:
            self._fused_step(parts)
            return
        for part in [slice(None)] if parts is None else parts:
            grad, exp_avg, exp_avg_sq = self.grad[part], self.exp_avg[part], self.exp_avg_sq[part]
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            denom = exp_avg_sq.sqrt().div_(math.sqrt(1 - beta2 ** self.steps)).add_(self.eps)
            self.flat[part].addcdiv_(exp_avg * self.learning_rates[part], denom,
                                     value=-self.lr_scale / (1 - beta1 ** self.steps))

    def _fused_step(self, parts: Sequence[slice] | None) -> None:
        """`step` through torch's fused kernel, one call per member on its views of the parameters in `parts` (slices
        at parameter boundaries); the kernel reads the step count from one tensor, as `torch.optim.Adam` advances its
        own before the kernel."""
        key = None if parts is None else tuple((part.start, part.stop) for part in parts)
        members = self._part_views.get(key)
        if members is None:  # (made once per `parts`: views of the flat buffers, which live as long as this Adam)
            total = self.offsets[-1]

            def inside(i: int) -> bool:
                return any((part.start or 0) <= self.offsets[i] and self.offsets[i + 1] <= (
                    total if part.stop is None else part.stop) for part in parts)

            indices = [i for i in range(len(self.param_views)) if parts is None or inside(i)]
            members = self._part_views[key] = [
                tuple([views[i][k] for i in indices] for views in (self.param_views, self.grad_views,
                                                                   self.exp_avg_views, self.exp_avg_sq_views))
                for k in range(len(self._member_lrs))]
        self._step_count.fill_(self.steps)
        fused_adam_members(members, [rate * self.lr_scale for rate in self._member_lrs], self._step_count, self.eps,
                           _ADAM_BETAS)

    def step_on(self, losses: torch.Tensor, params: Sequence[torch.Tensor]) -> None:
        """One step on the gradient of the members' `losses` (summed: they share no parameter) w.r.t. `params`,
        the parameters this Adam holds, in its order."""
        grads = torch.autograd.grad(losses.sum(), params)
        with torch.no_grad():
            torch.cat([g.reshape(-1) for g in grads], out=self.grad)
        self.step()


def check_member_replay_fits(rows: int, size: int, num_envs: int, row_bytes: float, device: torch.device,
                             fixed_bytes: int = 0) -> None:
    """UserError (`refuse_unless_fits`), with the largest buffer_size that fits, when `size` members' replay of `rows`
    transitions each (`row_bytes` each, plus `fixed_bytes` per member whatever its size) needs more than the share of
    the device's available memory a replay buffer may take (the share the solo `ReplayBuffer` takes; where a solo
    buffer on an accelerator would move to host memory, the population's stays on its device): the allocation would
    fail later, or the process be killed."""
    def advice(budget: int) -> str:
        fits = max(int((budget / size - fixed_bytes) // row_bytes), 0) // num_envs * num_envs
        return (f"the largest buffer_size that fits is {fits:,} (--set buffer_size={fits}), or train fewer members "
                "at once" if fits >= num_envs else "not even one step of every member's envs fits: train fewer "
                "members at once, or free memory")

    members = f"{size} member{'' if size == 1 else 's'}"
    refuse_unless_fits(int(size * (rows * row_bytes + fixed_bytes)), device,
                       f"The replay of {members} ({rows:,} transitions each, {row_bytes:,.0f} bytes per transition)",
                       advice)


def member_replay_steps(timesteps: int, num_envs: int, buffer_size: int) -> int:
    """Stored steps a members' replay needs to hold `timesteps` env steps per member (`num_envs` rows a step, one
    step more for the last collection), at most buffer_size's."""
    return min(-(-timesteps // num_envs) + 1, max(buffer_size // num_envs, 1))


class MemberReplay:
    """The members' replay buffers as one: storage `[steps, K, N, ...]`, so that member k's row `r` is the solo
    buffer's row `r` (step `r // N`, env `r % N`), with n-step returns under each member's gamma computed as
    `rlspeed.buffers.ReplayBuffer` computes them. Once `capacity_steps` steps are stored, the oldest step is
    overwritten, as the solo buffer overwrites its oldest rows (the same rows when `buffer_size` is a multiple of
    `num_envs`). With `mask_size`, each row also keeps the actions allowed at its next observation
    (`next_action_masks`, bool), as the solo buffer made with `mask_size` does. Observations are stored flat in
    `obs_dtype` (images: their own uint8 or bool, as the solo buffer keeps them). Frame-stacked Atari observations
    take `MemberFrameReplay` instead (each frame stored once, as the solo's)."""

    layout = "dense"

    def __init__(self, capacity_steps: int, size: int, num_envs: int, obs_dim: int, action_dim: int,
                 gammas: torch.Tensor, n_step: int, device: torch.device, mask_size: int | None = None,
                 obs_dtype: torch.dtype = torch.float32):
        self.size, self.num_envs, self.n_step, self.device = size, num_envs, n_step, device
        self.written = 0  # steps written so far (each holds K x N rows)
        #: bytes one row takes (observation, next observation, action, reward, terminated flag, discount, mask)
        self.row_bytes = self.bytes_per_row(obs_dim, action_dim, mask_size, obs_dtype)
        self._check_fits(capacity_steps)

        def zeros(*shape, dtype=torch.float32):
            return storage_zeros((capacity_steps, size, num_envs, *shape), dtype, device)

        self.obs, self.next_obs = zeros(obs_dim, dtype=obs_dtype), zeros(obs_dim, dtype=obs_dtype)
        self.actions, self.rewards = zeros(action_dim), zeros()
        self.terminated, self.discounts = zeros(), zeros()
        self.next_action_masks = zeros(mask_size, dtype=torch.bool) if mask_size else None
        self._committed_as_written()
        self._window: list[tuple[torch.Tensor, ...]] = []
        self._set_gammas(gammas)

    def _committed_as_written(self) -> None:
        """The storage was just made by `storage_zeros`: on the host its pages are committed as steps are written, so
        the steps not written yet count as taken in later memory checks (a solo buffer's, another population's)."""
        self._lazy_host = self.device.type == "cpu"
        if self._lazy_host:
            count_unwritten_host_storage(self)

    def unwritten_bytes(self) -> int:
        """Bytes of host storage the members have yet to write (0 on a device, and once `keep` copied the storage)."""
        return max(self.capacity_steps - self.written, 0) * self.step_bytes if self._lazy_host else 0

    @property
    def fields(self) -> tuple[str, ...]:
        """The storage tensors' names (`next_action_masks` only where the rows keep masks)."""
        return self.FIELDS + (("next_action_masks",) if self.next_action_masks is not None else ())

    FIELDS = ("obs", "next_obs", "actions", "rewards", "terminated", "discounts")

    def _set_gammas(self, gammas: torch.Tensor) -> None:
        # gamma**m per member, computed as the solo buffer computes it (a Python float to a float32 power)
        values = [float(g) for g in gammas.tolist()]
        steps = torch.arange(self.n_step, dtype=torch.float32, device=self.device)
        self._powers = torch.stack([g ** steps for g in values]).T.repeat_interleave(self.num_envs, dim=1)  # [n, KN]
        self._discount_table = torch.stack([g ** (steps + 1) for g in values]).repeat_interleave(self.num_envs, 0)
        self._gammas = torch.tensor(values, device=self.device)  # float32, as the solo's fill_(gamma)

    @property
    def capacity_steps(self) -> int:
        return self.obs.shape[0]

    @property
    def step_bytes(self) -> int:
        """Bytes one stored step of every member's envs takes (the members kept now)."""
        return self.size * self.num_envs * self.row_bytes

    @staticmethod
    def bytes_per_row(obs_dim: int, action_dim: int, mask_size: int | None, obs_dtype: torch.dtype) -> int:
        """Bytes one stored row takes (observation, next observation, action, reward, terminated flag, discount,
        mask)."""
        item = torch.empty((), dtype=obs_dtype).element_size()
        return 2 * obs_dim * item + 4 * action_dim + 12 + (mask_size or 0)

    def _check_fits(self, capacity_steps: int) -> None:
        check_member_replay_fits(capacity_steps * self.num_envs, self.size, self.num_envs, self.row_bytes, self.device)

    def grow(self, capacity_steps: int) -> None:
        """Room for `capacity_steps` stored steps (the stored rows are kept; a buffer that has wrapped keeps its
        size, as the solo buffer would have had that size from the start)."""
        if capacity_steps <= self.capacity_steps or self.written > self.capacity_steps:
            return
        self._check_fits(capacity_steps)
        grown = {}
        for name in self.fields:
            old = getattr(self, name)
            grown[name] = storage_zeros((capacity_steps, *old.shape[1:]), old.dtype, self.device)
            grown[name][:self.written] = old[:self.written]
        # every field at once (one call: an interrupt, a notebook's stop, lands before or after it, never between two
        # fields of different sizes, which every later learn would fail on)
        self.__dict__.update(grown)
        self._committed_as_written()

    def keep(self, index: torch.Tensor) -> None:
        """Keep only the members at `index`."""
        for name in self.fields:
            setattr(self, name, getattr(self, name)[:, index])
        rows = (index.unsqueeze(1) * self.num_envs + torch.arange(self.num_envs, device=self.device)).flatten()
        self._window = [tuple(value[rows] for value in entry) for entry in self._window]
        self._powers = self._powers[:, rows]
        self._discount_table = self._discount_table[rows]
        self._gammas = self._gammas[index]
        self.size = int(index.numel())
        self._lazy_host = False  # (the copies wrote every step)

    def add(self, obs, actions, rewards, next_obs, terminated, truncated, next_action_masks=None,
            reset_rows=None) -> None:
        """One step of every member's envs (rows `[K * N, ...]`, member-major), as `ReplayBuffer.add` stores it;
        `next_action_masks` (bool `[K * N, n]`) exactly when the buffer keeps masks; `reset_rows` (the env's
        restarted rows) matters to the frame layout only (`MemberFrameReplay`)."""
        check_masks_given(next_action_masks, self.next_action_masks)
        if self.n_step == 1:  # (the discount is each row's gamma: column 0 of the table, gamma ** 1)
            self._write(obs, actions, rewards, next_obs, terminated.to(torch.float32), self._discount_table[:, 0],
                        next_action_masks)
            return
        self._window.append(window_entry(obs, actions, rewards, next_obs, terminated, truncated, next_action_masks))
        if len(self._window) == self.n_step:
            self._write_oldest()

    def _write_oldest(self) -> None:
        """Store the oldest pending step as the transition over the pending steps after it (all n, or fewer where
        `restart_episodes` flushes them: the solo buffer's `_n_step_transition`), and drop it from the window."""
        window = self._window
        rewards = torch.stack([w[2] for w in window])
        next_obs = torch.stack([w[3] for w in window])
        terminated = torch.stack([w[4] for w in window])
        done = torch.stack([w[5] for w in window])
        alive = torch.cumprod(torch.cat((torch.ones_like(done[:1]), 1.0 - done[:-1])), dim=0)
        returns = (self._powers[:len(window)] * alive * rewards).sum(0)
        last = (alive.sum(0) - 1).long()
        columns = torch.arange(last.shape[0], device=self.device)
        discounts = self._discount_table[columns, last]
        masks = None  # (the mask at the observation the transition bootstraps from)
        if self.next_action_masks is not None:
            masks = torch.stack([w[6] for w in window])[last, columns]
        self._write(window[0][0], window[0][1], returns, next_obs[last, columns], terminated[last, columns],
                    discounts, masks)
        window.pop(0)

    def _write(self, obs, actions, rewards, next_obs, terminated, discounts, next_action_masks=None) -> None:
        shape = (self.size, self.num_envs)
        row = self.written % self.capacity_steps
        self.obs[row] = obs.view(*shape, -1)
        self.next_obs[row] = next_obs.view(*shape, -1)
        self.actions[row] = actions.reshape(*shape, -1)
        self.rewards[row] = rewards.view(shape)
        self.terminated[row] = terminated.view(shape)
        self.discounts[row] = discounts.view(shape)
        if next_action_masks is not None:
            self.next_action_masks[row] = next_action_masks.view(*shape, -1)
        self.written += 1

    def __len__(self) -> int:
        """Stored rows per member (the solo buffer's `size`)."""
        return min(self.written, self.capacity_steps) * self.num_envs

    def sizes(self) -> list[int]:
        """Stored rows of each member (all the same here)."""
        return [len(self)] * self.size

    def restart_episodes(self) -> None:
        """Every row starts a new episode (the envs were made afresh): the steps still waiting for their n-step
        return are stored now, each over the steps after it, bootstrapping from the last one's next observation, as
        the solo dense buffer stores them (`ReplayBuffer.restart_episodes`)."""
        while self._window:
            self._write_oldest()

    def summary(self) -> dict:
        """The layout and footprint as JSON values (summary.json's `replay`), per member and for all members."""
        return {"layout": self.layout, "capacity": self.capacity_steps * self.num_envs,
                "bytes_per_transition": self.row_bytes, "members": self.size,
                "nbytes": self.capacity_steps * self.step_bytes, "storage_device": str(self.device)}

    def state(self) -> tuple[dict[str, torch.Tensor], dict]:
        """What a checkpoint keeps: the stored rows, the pending n-step steps, and the counts."""
        stored = min(self.written, self.capacity_steps)
        tensors = {name: getattr(self, name)[:stored] for name in self.fields}
        tensors.update({f"window.{i}.{j}": value for i, entry in enumerate(self._window)
                        for j, value in enumerate(entry)})
        return tensors, {"layout": self.layout, "capacity_steps": self.capacity_steps, "written": self.written,
                         "window": len(self._window), "masks": self.next_action_masks is not None}

    def load_state(self, tensors: dict[str, torch.Tensor], meta: dict) -> None:
        """Restore what `state` returned (KeyError or RuntimeError where it does not fit this buffer)."""
        for name in self.fields:
            getattr(self, name)[:tensors[name].shape[0]] = tensors[name]
        entries = 7 if self.next_action_masks is not None else 6
        # (copies: the tensors given may be views of the file, `load_checkpoint(mapped=True)`)
        self._window = [tuple(tensors[f"window.{i}.{j}"].clone() for j in range(entries))
                        for i in range(int(meta["window"]))]
        self.written = int(meta["written"])

    def sample(self, index: torch.Tensor) -> dict[str, torch.Tensor]:
        """The rows `index` `[K, M]` (solo row numbers, one row of draws per member) as `[K, M, ...]` tensors."""
        size, envs = self.size, self.num_envs
        member = torch.arange(size, device=self.device).unsqueeze(1)
        flat = (((index // envs) * size + member) * envs + index % envs).flatten()

        def gather(storage: torch.Tensor) -> torch.Tensor:
            rows = torch.index_select(storage.view(-1, *storage.shape[3:]), 0, flat)
            return rows.view(*index.shape, *storage.shape[3:])

        return {name: gather(getattr(self, name)) for name in self.fields}


class MemberFrameReplay:
    """The members' replay buffers where observations are frame stacks (preprocessed Atari games): one solo
    `FrameStackReplayBuffer` per member, made as the solo run makes its buffer (`buffer_size` transitions, the member's
    gamma, n-step and masks), so each frame is stored once and member k's buffer holds, gives up and rebuilds exactly
    the solo buffer's rows. `MemberReplay`'s interface: `add` takes every member's rows at once, `sample` gathers each
    member's draws from its own buffer (one gather per member and field) and returns `[K, M, ...]` tensors with
    observations flattened, as `MemberReplay` stores them."""

    layout = "frames"

    def __init__(self, capacity: int, size: int, num_envs: int, observation, action_shape: tuple[int, ...],
                 action_dtype: torch.dtype, gammas: torch.Tensor, n_step: int, device: torch.device,
                 mask_size: int | None = None):
        self.capacity, self.num_envs, self.device = int(capacity), num_envs, device
        action_bytes = torch.empty((), dtype=action_dtype).element_size() * int(torch.Size(action_shape).numel())
        self.check_fits(self.capacity, size, num_envs, observation, action_bytes, n_step, mask_size, device)
        self.buffers = [FrameStackReplayBuffer(self.capacity, num_envs, observation, action_shape, action_dtype,
                                               device, n_step=n_step, gamma=float(gamma), storage_device=device,
                                               mask_size=mask_size)
                        for gamma in gammas.tolist()]  # (a float32 gamma, as the solo's buffer computes with it)
        #: bytes one transition takes on average (the frame pool's share included), as the solo buffer reports it
        self.row_bytes = self.buffers[0].nbytes / self.capacity

    @staticmethod
    def check_fits(capacity: int, size: int, num_envs: int, observation, action_bytes: int, n_step: int,
                   mask_size: int | None, device: torch.device) -> None:
        """`check_member_replay_fits` for `size` members' buffers of `capacity` transitions (made with these
        arguments): their frame pools' bytes per transition and fixed bytes."""
        row_bytes, fixed = FrameStackReplayBuffer.planned_terms(num_envs, observation, action_bytes, n_step, mask_size)
        check_member_replay_fits(capacity, size, num_envs, row_bytes, device, fixed_bytes=fixed)

    @property
    def size(self) -> int:
        """Members kept."""
        return len(self.buffers)

    def grow(self, capacity_steps: int) -> None:
        """Nothing: each member's buffer holds `buffer_size` transitions from the start, as the solo's."""

    def keep(self, index: torch.Tensor) -> None:
        """Keep only the members at `index`."""
        self.buffers = [self.buffers[i] for i in index.tolist()]

    def _rows(self, value: torch.Tensor | None, k: int) -> torch.Tensor | None:
        return None if value is None else value[k * self.num_envs:(k + 1) * self.num_envs]

    def add(self, obs, actions, rewards, next_obs, terminated, truncated, next_action_masks=None,
            reset_rows=None) -> None:
        """One step of every member's envs (rows `[K * N, ...]`, member-major) into each member's buffer;
        `reset_rows`: the env's `info["final_rows"]` (host indices of the rows it restarted), or None."""
        for k, buffer in enumerate(self.buffers):
            mine = None
            if reset_rows is not None:
                rows = np.asarray(reset_rows) - k * self.num_envs
                mine = rows[(rows >= 0) & (rows < self.num_envs)]
            buffer.add(*(self._rows(value, k) for value in (obs, actions, rewards, next_obs, terminated, truncated,
                                                            next_action_masks)), reset_rows=mine)

    def __len__(self) -> int:
        """Stored rows of the member that holds the fewest (they differ only where a pool gave up rows)."""
        return min(len(buffer) for buffer in self.buffers)

    def sizes(self) -> list[int]:
        """Stored rows of each member (its solo buffer's `size`)."""
        return [len(buffer) for buffer in self.buffers]

    def restart_episodes(self) -> None:
        """Every row starts a new episode (the envs were made afresh)."""
        for buffer in self.buffers:
            buffer.restart_episodes()

    def summary(self) -> dict:
        """The layout and footprint as JSON values (summary.json's `replay`), per member and for all members."""
        first = self.buffers[0].summary() if self.buffers else {}
        return {"layout": self.layout, "capacity": self.capacity, "bytes_per_transition": round(self.row_bytes, 1),
                "members": self.size, "nbytes": sum(b.nbytes for b in self.buffers), "storage_device": str(self.device),
                "frames_per_stack": first.get("frames_per_stack"), "evicted": [b.evicted for b in self.buffers]}

    def state(self) -> tuple[dict[str, torch.Tensor], dict]:
        """What a checkpoint keeps: each member's `FrameStackReplayBuffer.state_dict`."""
        tensors, metas = {}, []
        for k, buffer in enumerate(self.buffers):
            own, meta = buffer.state_dict()
            tensors.update({f"member.{k}.{name}": value for name, value in own.items()})
            metas.append(meta)
        return tensors, {"layout": self.layout, "capacity": self.capacity, "members": metas,
                         "masks": bool(self.buffers) and self.buffers[0].next_action_masks is not None}

    def load_state(self, tensors: dict[str, torch.Tensor], meta: dict) -> None:
        """Restore what `state` returned (KeyError or RuntimeError where it does not fit this buffer)."""
        if len(meta["members"]) != self.size:
            raise KeyError("another number of members")
        for k, (buffer, own) in enumerate(zip(self.buffers, meta["members"])):
            prefix = f"member.{k}."
            reason = buffer.load_state_dict({name[len(prefix):]: value for name, value in tensors.items()
                                             if name.startswith(prefix)}, own)
            if reason is not None:
                raise RuntimeError(reason)

    def sample(self, index: torch.Tensor) -> dict[str, torch.Tensor]:
        """The rows `index` `[K, M]` (solo row numbers: member k's below its `sizes()[k]`) as `[K, M, ...]` tensors,
        each member's from its own buffer as its solo buffer's `sample_batches` maps and gathers them."""
        batches = []
        for buffer, draws in zip(self.buffers, index):
            start = 0 if buffer.size == buffer.capacity else (buffer.pos - buffer.size) % buffer.capacity
            batches.append(buffer.gather((draws + start) % buffer.capacity if start else draws))
        out = {name: torch.stack([batch[name] for batch in batches]) for name in batches[0]}
        for name in ("obs", "next_obs", "actions"):  # (flat rows; Discrete actions `[K, M, 1]`, as `MemberReplay`'s)
            out[name] = out[name].reshape(*index.shape, -1)
        return out


class OffPolicyPopulation(PopulationBase):
    """What the SAC, TD3, DDPG and DQN populations share: members, env rows, replay, the collect-then-update loop,
    evaluation, `learn` and its summary. Subclasses provide the networks (`_build`), exploration (`_explore`), the
    deterministic policy (`_deterministic`) and one gradient step for all members (`_update`).

    `member_overrides`: a list of K dicts of hyperparameters for single members (as a list of K values would set
    them); `save_replay_buffer=True`: checkpoints write the replay buffer beside them
    (`<name>.replay.safetensors`), else a resumed population's replay buffer starts empty. `members`: solo models of
    the algorithm (one per seed of `seeds`, each made with that seed, as loaded from member files) that the members
    start as, their parameters and normalisation statistics, in place of new ones; their settings are the
    population's (give no hyperparameters)."""

    #: the flat Adams (attribute names) a checkpoint holds
    _adams: tuple[str, ...] = ("_adam",)
    #: `normalize_obs`, `normalize_reward`: the replay stores the env's own observations and rewards and normalises
    #: each sampled batch by each member's statistics at sampling time (`_normalized_rows`), as a solo run's does
    _hands_out_raw = True
    keeps_replay_buffer = True  # (`MemberReplay`: `save_replay_buffer` writes it beside each checkpoint)
    #: whether the members may have encoders with parameters (each member's own CNN or multi-input encoder:
    #: `MemberEncoder`); encoders without parameters (one-hot Discrete observations, flattened bool or integer
    #: vectors, Dict or Tuple observations of those: `member_features`) every off-policy population takes
    member_encoders = False
    #: whether `_explore`, `_deterministic` and `_update` take stored observations and encode them themselves (DQN);
    #: else they take the networks' inputs, which the loop computes (`_inputs`)
    encodes_inside = False

    def __init__(self, algo_cls: type, env_id: str, seeds: Sequence[int], *,
                 member_overrides: Sequence[dict[str, Any] | None] | None = None,
                 device: str | torch.device = "cpu", env_backend: str = "auto", save_replay_buffer: bool = False,
                 members: Sequence[Any] | None = None, **hyperparameters: Any) -> None:
        # float32 batched networks, also under a caller's float64 default dtype; built on the members' threads, as
        # a solo model is (stacking their weights on the caller's count started torch's OpenMP threads, and a
        # process forked after that, a sweep's Pool worker, hung at its first parallel operation)
        # (and trainable ones, also inside a caller's torch.inference_mode(), and built on the CPU, also where the
        # caller made another device torch's default, as a solo model's)
        threads = check_num_threads(hyperparameters.get("num_threads"))
        with float32_default(), training_threads(threads), torch.inference_mode(False), torch.device("cpu"):
            solos = self._solo_members(algo_cls, env_id, seeds, member_overrides, device, env_backend, hyperparameters,
                                       members)
            encoder = getattr(solos[0].policy, "encoder", None)
            # (as PPO populations: float vectors only, and the float keys of Dict observations)
            if encoder is not None and self.config.normalize_obs and self._packed is None:
                raise UserError(f"normalize_obs applies to float vector observations, and {env_id}'s go through a "
                                f"{encoder.kind}: drop normalize_obs.")
            if has_parameters(encoder) and not self.member_encoders:
                raise UserError(f"{algo_cls.__name__} populations cover encoders without parameters so far (float, "
                                f"one-hot Discrete, MultiBinary or integer vectors, and Dict or Tuple observations of "
                                f"those); {env_id} needs a {encoder.kind} (DQN, PPO and A2C members have their own).")
            #: the members' observation encoder where it has no parameters (one-hot, flatten), else None
            self._encoder = None if has_parameters(encoder) else encoder
            #: each member's own encoder where it has parameters (DQN's CNN: `_build` makes it), else None
            self._member_encoder: MemberEncoder | None = None
            self.spec = solos[0].spec
            self.discrete = self.spec.discrete
            self.action_dim = self.spec.action_dim
            #: a stored observation's length (Dict observations: the packed row's, `PackedObservations`)
            self.obs_dim = packed_width(self._packed) if self._packed is not None else self.spec.obs_dim
            self._action_tail = () if self.discrete else (self.action_dim,)  # an action's shape as the env takes it
            if not self.discrete:
                self._action_center, self._action_half_range = solos[0]._action_center, solos[0]._action_half_range
                self._action_low, self._action_high = solos[0]._action_low, solos[0]._action_high
            self._index_dtype = rules(self.device).index_dtype
            self.activation = ACTIVATIONS[self.config.activation]()
            self.hyper = config_tensors(solos, ("learning_rate", "gamma", "tau"), self.device)
            #: which update trains the members (summary.json's `update`): "hand-derived" or "autograd", and why
            self.update_path, self.update_reason = "autograd", "populations have a hand-derived update for SAC only"
            self._build(solos)
            del solos
            self._start_normalization()
            #: original indices of the members still in the computation; every stacked tensor follows this order
            self.alive = list(range(self.size))
            self.num_timesteps = 0  # env steps per member
            self._env = None
            self.buffer: MemberReplay | None = None
            #: members that left: their rows (`_member_rows`) as they left, for evaluation and `member_state`
            self._left: dict[int, dict[str, list[torch.Tensor]]] = {}
            self.save_replay_buffer = save_replay_buffer

    # --- what an algorithm provides --------------------------------------------------------------------------
    def _build(self, solos: list) -> None:
        raise NotImplementedError

    def _explore(self, obs: torch.Tensor, timesteps: int) -> torch.Tensor:
        """Exploration actions `[K, N, ...]` (policy space: indices, or values in [-1, 1]) for observations
        `[K, N, obs_dim]`; `timesteps`: the env step count per member at this step. A population that applies action
        masks (`supports_action_masks`) also takes the masks valid for `obs` (bool `[K, N, n]`) when the run applies
        them."""
        raise NotImplementedError

    def _before_collect(self, before: int) -> None:
        """At the start of an iteration (`before`: env steps per member so far); DQN draws its exploration here."""

    def _after_iteration(self, before: int) -> None:
        """After an iteration's gradient steps (DQN's target update)."""

    def _deterministic(self, obs: torch.Tensor, actor: dict[str, list[torch.Tensor]]) -> torch.Tensor:
        """The deterministic policy's actions in [-1, 1] `[K, B, A]` under the given actor parameters (`actor`: the
        `_actor_lists` by name, as `_actor_of` gives them; DQN's: indices `[K, B]`, among the allowed actions where
        it also takes masks `[K, B, n]`)."""
        raise NotImplementedError

    def _update(self, batch: dict[str, torch.Tensor]) -> None:
        """One gradient step of every member on its batch (`[K, B, ...]` tensors)."""
        raise NotImplementedError

    #: attributes holding lists of member-stacked tensors (parameters keep requiring gradients when members leave)
    _member_lists: tuple[str, ...] = ()
    #: attributes holding one member-stacked tensor
    _member_tensors: tuple[str, ...] = ()
    #: the actor's weight and bias lists (attribute names), for evaluation of members that left
    _actor_lists = ("actor_weights", "actor_biases")

    def _stack_critics(self, solos: list) -> None:
        """The solo runs' twin critics and their targets stacked: `critic_weights` `[K, C, in, out]`, ...
        (`target_*` take no gradient)."""
        layers = range(len(solos[0].critic.body.weights))
        self.critic_weights = [stack_leaf([s.critic.body.weights[i] for s in solos]) for i in layers]
        self.critic_biases = [stack_leaf([s.critic.body.biases[i] for s in solos]) for i in layers]
        self.target_weights = [stack_leaf([s.critic_target.body.weights[i] for s in solos]).requires_grad_(False)
                               for i in layers]
        self.target_biases = [stack_leaf([s.critic_target.body.biases[i] for s in solos]).requires_grad_(False)
                              for i in layers]

    @staticmethod
    def _critic_state(rows: dict[str, list[torch.Tensor]]) -> dict[str, torch.Tensor]:
        """One member's rows (`_member_rows`) of the stacked critics and their targets, named as a solo checkpoint
        names them (`critic.body.weights.0`, `critic_target.body.biases.1`, ...)."""
        state = {}
        for prefix, weights, biases in (("critic", "critic_weights", "critic_biases"),
                                        ("critic_target", "target_weights", "target_biases")):
            for layer, (weight, bias) in enumerate(zip(rows[weights], rows[biases])):
                state[f"{prefix}.body.weights.{layer}"] = weight.detach().clone()
                state[f"{prefix}.body.biases.{layer}"] = bias.detach().clone()
        return state

    def _kept_adam(self, adam: _FlatMemberAdam, params: list[torch.Tensor], index: torch.Tensor) -> _FlatMemberAdam:
        """A flat Adam over `params` (the stacks after `remove` kept the members at `index`) with those members'
        moments from `adam`."""
        kept = _FlatMemberAdam(params, self.hyper["learning_rate"], adam.eps, [m[index] for m in adam.exp_avg_views],
                               [v[index] for v in adam.exp_avg_sq_views], adam.steps)
        kept.lr_scale = adam.lr_scale  # (the annealed learning rates' factor goes on as it was)
        return kept

    # --- batched MLPs ------------------------------------------------------------------------------------------
    #: True only while `evaluate` acts (not `_evaluate_during_learn`): `_mlp` multiplies as each member's solo
    #: `nn.Linear` does (`_in_solo_layout` weights), so a member's evaluation is `rlspeed eval`'s of its saved model,
    #: digit for digit; elsewhere (training, `learn`'s evaluations) one batched product per layer
    _as_solo = False

    def _mlp(self, x: torch.Tensor, weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor]) -> torch.Tensor:
        """One MLP per leading index: `x` `[M, B, in]`, weights `[M, in, out]`, biases `[M, 1, out]`."""
        last = len(weights) - 1
        for layer, (weight, bias) in enumerate(zip(weights, biases)):
            if self._as_solo:  # (member by member: a batched product of small matrices rounds otherwise)
                x = torch.stack([torch.addmm(b[0], member, w) for member, w, b in zip(x, weight, bias)])
            else:
                x = ensemble_linear(x, weight, bias)
            if layer < last:
                x = self.activation(x)
        return x

    def _critics(self, obs: torch.Tensor, actions: torch.Tensor, weights, biases, members: slice | None = None):
        """Q-values `[K, C, B]` of every member's critics (`weights` `[K, C, in, out]`); `members` picks critics."""
        if members is not None:
            weights, biases = [w[:, members] for w in weights], [b[:, members] for b in biases]
        size, critics = weights[0].shape[0], weights[0].shape[1]
        x = torch.cat((obs, actions), dim=-1)
        x = x.unsqueeze(1).expand(-1, critics, -1, -1).reshape(size * critics, x.shape[1], -1)
        out = self._mlp(x, [w.flatten(0, 1) for w in weights], [b.flatten(0, 1) for b in biases])
        return out.view(size, critics, -1)

    def _random_actions(self, num: int, masks: torch.Tensor | None = None) -> torch.Tensor:
        """Uniform policy-space actions `[K, num, ...]`, member k's from its generator (as `_random_actions` draws);
        with action masks (bool `[K, num, n]`), uniform over each row's allowed actions."""
        if masks is not None:
            return torch.stack([allowed_uniform(torch.rand(masks.shape[1:], device=self.device, generator=g), mask)
                                for g, mask in zip(self.generators, masks)]).to(self._index_dtype)
        if self.discrete:
            return torch.stack([torch.randint(0, self.action_dim, (num,), device=self.device, generator=g,
                                              dtype=self._index_dtype) for g in self.generators])
        return torch.stack([torch.rand((num, self.action_dim), device=self.device, generator=g) * 2 - 1
                            for g in self.generators])

    def _to_env(self, actions: torch.Tensor) -> torch.Tensor:
        """Policy-space actions as the env takes them: indices as they are, Box values rescaled to the bounds."""
        if self.discrete:
            return actions
        return clamped(torch.addcmul(self._action_center, self._action_half_range, actions), self._action_low,
                       self._action_high)

    # --- the loop ----------------------------------------------------------------------------------------------
    def _start(self, total_timesteps: int, schedule_start: int | None = None) -> None:
        cfg = self.config
        capacity = self._replay_capacity(total_timesteps)
        # schedules (DQN's epsilon) run over this learn call, from `schedule_start` where given (0: the whole step
        # count's, SB3's reset_num_timesteps=False), as `Algorithm.learn` sets them; right after `resume`, over the
        # resumed run's (to this call's end where that is later)
        resumed, self._resumed_schedule = getattr(self, "_resumed_schedule", None), None
        self._learn_start = self.num_timesteps if schedule_start is None else schedule_start
        self._schedule_end = self.num_timesteps + total_timesteps
        if resumed is not None:
            self._learn_start, self._schedule_end = int(resumed[0]), max(int(resumed[1]), self._schedule_end)
        if self.alive and self._env is None:  # (the first learn, or a resume whose envs could not be restored)
            self._start_env()
            # per-episode state (pending n-step steps, TD3's noise process) belongs to the episodes the fresh envs
            # replace: every row starts a new episode
            if self.buffer is not None:
                self.buffer.restart_episodes()
            self._on_dones(torch.ones(len(self.alive) * cfg.num_envs, dtype=torch.bool, device=self.device))
        if self.buffer is None:
            if not self.alive:
                return
            self._buffer_start = self.num_timesteps
            self.buffer = self._new_replay(capacity, self._masking)
            # (as a solo run's learn: a warning where no member will update, the population's loop taking whole
            # iterations of train_freq steps of every env)
            iterations = -(-total_timesteps // (cfg.train_freq * cfg.num_envs))
            reason = no_update_reason(cfg, iterations * cfg.train_freq * cfg.num_envs, iterations * cfg.train_freq,
                                      True)
            if reason is not None:
                warnings.warn(reason, stacklevel=4)
        else:
            self.buffer.grow(capacity)

    @property
    def _frame_replay(self) -> bool:
        """Whether the replay stores each frame once (`MemberFrameReplay`, `stores_frames`)."""
        return self.stores_frames(self.env_id, self.config, self.spec.observation_space)

    @staticmethod
    def stores_frames(env_id: str, config: OffPolicyConfig, observation_space: gym.Space) -> bool:
        """Whether members of `config` on `env_id` store each frame once (`MemberFrameReplay`): frame-stacked Atari
        games, as the solo run's buffer does (`frame_dedup`, on by default)."""
        return bool(atari.is_atari(env_id) and config.frame_dedup and frame_stacks(observation_space))

    @staticmethod
    def _frame_action_bytes(device: torch.device, discrete: bool, action_dim: int) -> int:
        """Bytes of one action in `MemberFrameReplay` (as `_new_replay` makes it): an index in the device's index
        dtype for discrete actions, else `action_dim` float32s."""
        return rules(device).index_dtype.itemsize if discrete else 4 * action_dim

    def _new_replay(self, capacity_steps: int, masks: bool) -> MemberReplay | MemberFrameReplay:
        """An empty replay for the members kept: `MemberFrameReplay` of `buffer_size` transitions each where frames are
        stored once, else `MemberReplay` of `capacity_steps` steps; with the actions' masks where `masks`."""
        cfg, mask_size = self.config, self.action_dim if masks else None
        if self._frame_replay:
            return MemberFrameReplay(cfg.buffer_size, len(self.alive), cfg.num_envs, self.spec.observation_space,
                                     self._action_tail, self._index_dtype if self.discrete else torch.float32,
                                     self.hyper["gamma"], cfg.n_step, self.device, mask_size=mask_size)
        return MemberReplay(capacity_steps, len(self.alive), cfg.num_envs, self.obs_dim,
                            1 if self.discrete else self.action_dim, self.hyper["gamma"], cfg.n_step, self.device,
                            mask_size=mask_size, obs_dtype=self._replay_obs_dtype())

    def _replay_capacity(self, total_timesteps: int) -> int:
        """Stored steps the replay needs for `total_timesteps` more env steps per member (at most buffer_size's)."""
        return member_replay_steps(self.num_timesteps + total_timesteps, self.config.num_envs, self.config.buffer_size)

    def _planned_replay(self, solo) -> tuple[int, float, int]:
        """Each member's replay for the planned steps (`planned_timesteps`; none without a plan), from the first member
        `solo`, before the population's own attributes exist: `MemberFrameReplay`'s bytes where frames are stored once
        (per transition, and its frame pool's reserve whatever its size: `MemberFrameReplay.check_fits`), else
        `MemberReplay.bytes_per_row` at most as `check_fits` counts them (Dict observations packed into float32 rows;
        others as float32, or in their own dtype where it is narrower: images a member's CNN takes are stored so, other
        narrow ones as float32), without action masks (the env says whether it gives them later)."""
        total = planned_total_timesteps()
        if total is None:
            return 0, 0, 0
        cfg, space, discrete = solo.config, solo.spec.observation_space, solo.spec.discrete
        if self.stores_frames(self.env_id, cfg, space):
            row_bytes, fixed = FrameStackReplayBuffer.planned_terms(
                cfg.num_envs, space, self._frame_action_bytes(self.device, discrete, solo.spec.action_dim), cfg.n_step)
            return cfg.buffer_size, row_bytes, fixed
        rows = member_replay_steps(total, cfg.num_envs, cfg.buffer_size) * cfg.num_envs
        layout = observation_layout(space)
        obs_dim, obs_dtype = ((packed_width(layout), torch.float32) if isinstance(layout, dict) else
                              (solo.spec.obs_dim, min(layout[1], torch.float32, key=lambda dtype: dtype.itemsize)))
        return rows, MemberReplay.bytes_per_row(obs_dim, 1 if discrete else solo.spec.action_dim, None, obs_dtype), 0

    def _summary(self, *args, **kwargs) -> dict:
        """`PopulationBase._summary` plus the replay's layout and footprint (`replay`, as a solo run's summary)."""
        return {**super()._summary(*args, **kwargs), "replay": self.replay_summary()}

    def replay_summary(self) -> dict | None:
        """The replay's layout (`dense`, or `frames`: each frame stored once), transitions and bytes per transition
        per member, and its bytes for all members kept (summary.json's `replay`); None before `learn` made it."""
        return None if self.buffer is None else self.buffer.summary()

    def check_fits(self, total_timesteps: int) -> None:
        """UserError (`check_member_replay_fits`) where the replay `learn(total_timesteps)` would allocate does not
        fit in memory (see `PopulationBase.check_fits`). Counts action masks wherever the actions are discrete and
        `use_masking` is on (at most the rows' action count in bytes: the env says whether it gives masks only when
        it starts)."""
        cfg = self.config
        masks = self.action_dim if self.discrete and getattr(cfg, "use_masking", False) else None
        if self._frame_replay:  # (each member's buffer holds buffer_size transitions, as the solo's)
            MemberFrameReplay.check_fits(cfg.buffer_size, len(self.alive), cfg.num_envs, self.spec.observation_space,
                                         self._frame_action_bytes(self.device, self.discrete, self.action_dim),
                                         cfg.n_step, masks, self.device)
            return
        row_bytes = MemberReplay.bytes_per_row(self.obs_dim, 1 if self.discrete else self.action_dim, masks,
                                               self._replay_obs_dtype())
        check_member_replay_fits(self._replay_capacity(total_timesteps) * cfg.num_envs, len(self.alive),
                                 cfg.num_envs, row_bytes, self.device)

    def train_iteration(self) -> int:
        """`train_freq` steps of every member's envs into the replay buffer, then `gradient_steps` updates of every
        member (once past `learning_starts`), as `OffPolicyAlgorithm._train_iteration`; returns env steps per
        member."""
        cfg, env, buffer = self.config, self._env, self.buffer
        alive, envs, before = len(self.alive), cfg.num_envs, self.num_timesteps
        if not alive:
            raise UserError("Every member has left the population (reached, pruned or diverged): nothing to train.")
        self._before_collect(before)
        masking = self._masking
        with torch.no_grad():
            for step in range(cfg.train_freq):
                timesteps = self.num_timesteps + step * envs
                obs = self._obs
                # (where the run applies action masks: those valid for `obs`, as the solo run passes them)
                masks = self._action_mask.view(alive, envs, -1) if masking else None
                if timesteps < cfg.learning_starts:
                    actions = self._random_actions(envs, masks)
                elif masking:
                    actions = self._explore(self._inputs(self._acting_obs(obs, alive, envs)), timesteps, masks)
                else:
                    actions = self._explore(self._inputs(self._acting_obs(obs, alive, envs)), timesteps)
                actions = actions.reshape(alive * envs, *self._action_tail)
                next_obs, rewards, terminated, truncated, info = env.step(self._to_env(actions))
                following = None  # (the masks at each row's next observation)
                if masking:
                    following = next_masks(info, terminated | truncated)
                    self._action_mask = info["action_mask"]
                buffer.add(obs, actions, rewards, info["final_obs"], terminated, truncated, following,
                           reset_rows=info.get("final_rows"))
                self._on_dones(info["done"])  # (whole episodes' ends, as the solo run restarts its noise)
                self._obs = next_obs
        steps = cfg.train_freq * envs
        if self.num_timesteps + steps - self._buffer_start > cfg.learning_starts and len(buffer):
            if cfg.anneal_lr:  # (the progress after this collection, as `OffPolicyAlgorithm._train_iteration`)
                scale = self._progress_remaining(self.num_timesteps + steps)
                for name in self._adams:
                    getattr(self, name).lr_scale = scale
            self._gradient_steps(steps)
        self._after_iteration(before)
        self.num_timesteps += steps
        return steps

    def _acting_obs(self, obs: torch.Tensor, alive: int, envs: int) -> torch.Tensor:
        """The training env's observations `[K * N, ...]` as the members act on them, `[K, N, ...]`: normalised by
        each member's statistics with `normalize_obs` (the env hands out its own), as a solo run's `_normalised_obs`."""
        obs = obs.view(alive, envs, -1)
        stats = self._normalization
        return (obs if stats is None or stats.obs_mean is None
                else stats.normalize_obs(obs, self.config.normalize_obs_clip))

    def _normalized_rows(self, rows: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Sampled replay rows `[K, B, ...]` (the env's own) with observations normalised (`normalize_obs`) and
        rewards scaled (`normalize_reward`) by each member's statistics now, as a solo run's `_prepare_normalised`."""
        stats = self._normalization
        if stats is None:
            return rows
        if stats.obs_mean is not None:
            clip = self.config.normalize_obs_clip
            rows = {**rows, "obs": stats.normalize_obs(rows["obs"], clip),
                    "next_obs": stats.normalize_obs(rows["next_obs"], clip)}
        if stats.ret_var is not None:
            rows = {**rows, "rewards": stats.scale_rewards(rows["rewards"], self.config.normalize_reward_clip)}
        return rows

    def _replay_obs_dtype(self) -> torch.dtype:
        """How the replay stores observations: images (members with their own CNN) in the env's dtype, everything
        else as float32 (one-hot indices included)."""
        if self._member_encoder is None or self._packed is not None:  # (Dict observations: packed float32 rows)
            return torch.float32
        return observation_layout(self.spec.observation_space)[1]  # (the images' dtype, as the env adapters give it)

    def _inputs(self, obs: torch.Tensor) -> torch.Tensor:
        """What `_explore`, `_deterministic` and `_update` take for stored observations `[K, B, ...]`: the networks'
        input (`_features` of the members' encoder without parameters), or the observations themselves where there
        is no encoder or the algorithm encodes them itself (`encodes_inside`)."""
        return obs if self.encodes_inside or self._encoder is None else self._features(obs)

    def _features(self, obs: torch.Tensor, encoder: Sequence[torch.Tensor] | None = None) -> torch.Tensor:
        """The networks' input `[K, B, features]` from observations `[K, B, ...]` (stored flat): `member_features`,
        or each member's own encoder by the stacked encoder parameters `encoder`."""
        obs = self.member_observations(obs, unflatten=self._member_encoder is not None)
        if self._member_encoder is None:
            return member_features(self._encoder, obs)
        return self._member_encoder(encoder, obs)

    def _progress_remaining(self, timesteps: int) -> float:
        """1 at the start of this learn call's schedule, 0 at its end, at `timesteps` (`Algorithm._progress_remaining`,
        the solo runs')."""
        return progress_remaining(timesteps, self._learn_start, self._schedule_end)

    def _on_dones(self, dones: torch.Tensor) -> None:
        """Finished rows `[K * N]` (TD3's Ornstein-Uhlenbeck noise restarts there)."""

    def _gradient_steps(self, steps: int) -> None:
        cfg, buffer = self.config, self.buffer
        gradient_steps = steps if cfg.gradient_steps == -1 else cfg.gradient_steps
        batch_size = cfg.batch_size
        chunk = max(1, min(gradient_steps, _SAMPLE_ROWS // batch_size))
        stored = buffer.sizes()
        for first in range(0, gradient_steps, chunk):
            count = min(chunk, gradient_steps - first)
            index = torch.stack([torch.randint(0, rows, (count * batch_size,), device=self.device, generator=g)
                                 for rows, g in zip(stored, self.generators)])
            rows = self._normalized_rows(buffer.sample(index))
            rows["obs"], rows["next_obs"] = self._inputs(rows["obs"]), self._inputs(rows["next_obs"])
            for i in range(count):
                self._update({key: value[:, i * batch_size:(i + 1) * batch_size] for key, value in rows.items()})

    # --- checkpoints (see `PopulationBase.save`) ----------------------------------------------------------------
    def _state(self) -> tuple[dict[str, torch.Tensor], dict]:
        tensors = {f"{name}.{i}": t.detach() for name in self._member_lists for i, t in enumerate(getattr(self, name))}
        tensors.update({name: getattr(self, name).detach() for name in self._member_tensors})
        tensors.update({f"hyper.{key}": value for key, value in self.hyper.items()})
        tensors.update(self._statistics_state())
        # the schedules' span is the learn call's in progress (`progress` set): a save between learn calls has none,
        # as the next learn call sets its own
        in_learn = self.progress is not None and hasattr(self, "_schedule_end")
        values = {"adam_steps": {}, "left": sorted(self._left),
                  "schedule": [self._learn_start, self._schedule_end] if in_learn else None,
                  "buffer_start": getattr(self, "_buffer_start", None)}
        if self.alive:  # (once every member left, the Adams keep stale rows)
            for name in self._adams:
                adam = getattr(self, name)
                tensors[f"{name}.exp_avg"], tensors[f"{name}.exp_avg_sq"] = adam.exp_avg, adam.exp_avg_sq
                values["adam_steps"][name] = adam.steps
        for k, lists in self._left.items():
            tensors.update({f"left.{k}.{name}.{i}": t for name, ts in lists.items() for i, t in enumerate(ts)})
        own_tensors, values["algo"] = self._algorithm_state()
        tensors.update({f"algo.{key}": value for key, value in own_tensors.items()})
        return tensors, values

    def _load_state(self, tensors: dict[str, torch.Tensor], values: dict) -> None:
        def copy(name: str, target: torch.Tensor) -> None:
            target.copy_(saved_like(tensors, name, target))

        with torch.no_grad():  # (in place: parameters and targets are views of the flat buffers)
            for name in self._member_lists:
                for i, t in enumerate(getattr(self, name)):
                    copy(f"{name}.{i}", t.detach())
            for name in self._member_tensors:
                copy(name, getattr(self, name).detach())
            for key, value in self.hyper.items():
                copy(f"hyper.{key}", value)
            if self.alive:
                for name in self._adams:
                    adam = getattr(self, name)
                    copy(f"{name}.exp_avg", adam.exp_avg)
                    copy(f"{name}.exp_avg_sq", adam.exp_avg_sq)
                    adam.steps = int(values["adam_steps"][name])
        self._load_statistics(tensors)
        self._left = {int(k): {name: [tensors[f"left.{k}.{name}.{i}"].clone() for i in range(count)]
                               for name, count in self._row_counts().items() if f"left.{k}.{name}.0" in tensors}
                      for k in values["left"]}
        self._resumed_schedule = values.get("schedule")
        self._resumed_buffer_start = values.get("buffer_start")
        self._load_algorithm_state({key[5:]: value for key, value in tensors.items() if key.startswith("algo.")},
                                   values.get("algo") or {})

    def _algorithm_state(self) -> tuple[dict[str, torch.Tensor], dict]:
        """An algorithm's own running state for a checkpoint (tensors, JSON); none by default."""
        return {}, {}

    def _load_algorithm_state(self, tensors: dict[str, torch.Tensor], values: dict) -> None:
        """Restore what `_algorithm_state` returned."""

    def _save_replay(self, path: Path) -> dict | None:
        """With `save_replay_buffer`: the replay buffer's stored rows, write count and pending n-step steps in
        `<checkpoint>.replay.safetensors`, staged as a solo run's (`OffPolicyAlgorithm._save_replay`)."""
        buffer = self.buffer
        if not self.save_replay_buffer or buffer is None or not self.alive:
            return None
        tensors, meta = buffer.state()
        token = secrets.token_hex(16)
        file = replay_path(path)
        save_checkpoint(staged_path(file), tensors, {"replay_buffer": {**meta, "token": token, "contents": RAW_CONTENTS,
                                                                       "alive": list(self.alive)}})
        return {"file": file.name, "token": token}

    def _load_replay(self, path: Path, saved: dict | None) -> None:
        if not self.alive:
            return
        empty = ("the replay buffer starts empty and updates wait for learning_starts new transitions: training is "
                 "not identical to the uninterrupted run")
        if not isinstance(saved, dict):  # (said, unless saved before any step: the empty buffer is then the
            if self.num_timesteps:  # uninterrupted run's, as a solo run's resume says nothing)
                warnings.warn(f"Resuming from '{path}': it holds no replay buffer (save_replay_buffer=True, or "
                              f"--save-replay-buffer, saves one with each checkpoint), so {empty}.", stacklevel=3)
            return
        file = beside(path, saved.get("file"))
        try:
            if file is None:  # (an edited file's)
                raise UserError(f"it names {str(saved.get('file'))!r}, no file beside it")
            # (non-finite rows are a diverging member's, as its parameters are: dropped when the loop finds it)
            # (read mapped: copied into the new buffer, no copy of the whole file besides it, `_load_replay`'s)
            tensors, meta = load_paired(file, saved.get("token"), device=self.device, allow_nonfinite=True,
                                        mapped=True)
        except UserError as error:
            warnings.warn(f"The replay buffer saved with '{path}' cannot be read ({error}); {empty}.", stacklevel=3)
            return
        info = meta.get("replay_buffer") or {}
        if info.get("token") != saved.get("token") or info.get("alive") != self.alive:
            warnings.warn(f"'{file}' does not belong to '{path}' (a later save wrote it); {empty}.", stacklevel=3)
            return
        # (a file without `contents` was written before it was recorded, by a population that normalised nothing: raw)
        problem = OffPolicyAlgorithm._replay_contents_problem(info["contents"], []) if "contents" in info else None
        if problem is not None:
            warnings.warn(f"'{file}' cannot fill this population's replay buffer: {problem}; {empty}.", stacklevel=3)
            return
        masks = info.get("masks", "next_action_masks" in tensors)  # (a run that applied the env's action masks)
        if info.get("layout", "dense") != ("frames" if self._frame_replay else "dense"):
            warnings.warn(f"'{file}' holds another replay layout than this population's; {empty}.", stacklevel=3)
            return
        try:
            buffer = self._new_replay(int(info.get("capacity_steps", 1)), masks)
        except UserError as error:  # (it does not fit in memory now)
            warnings.warn(f"'{file}' cannot be loaded ({error}); {empty}.", stacklevel=3)
            return
        try:
            buffer.load_state(tensors, info)
        except (KeyError, RuntimeError) as error:
            warnings.warn(f"'{file}' cannot fill this population's replay buffer ({error}); {empty}.", stacklevel=3)
            return
        self.buffer = buffer
        self._buffer_start = int(self._resumed_buffer_start)

    # --- members leaving ---------------------------------------------------------------------------------------
    def remove(self, members: Sequence[int]) -> None:
        """Take members (original indices) out of the computation: their rows of every stacked tensor (parameters,
        targets, Adam moments and steps, hyperparameters, generators, replay rows, env rows and observations) are cut
        out, and their parameters kept as they are now for `member_state` and the final evaluation. Members already
        out are ignored."""
        members = {int(m) for m in members} & set(self.alive)
        if not members:
            return
        for member in members:
            self._left[member] = {name: [row.clone() for row in rows]
                                  for name, rows in self._member_rows(member).items()}
        keep_positions = [i for i, member in enumerate(self.alive) if member not in members]
        index = torch.tensor(keep_positions, dtype=torch.long, device=self.device)
        with torch.no_grad():
            for name in self._member_lists:
                setattr(self, name, [t.detach()[index].clone().requires_grad_(t.requires_grad)
                                     for t in getattr(self, name)])
            for name in self._member_tensors:
                t = getattr(self, name)
                setattr(self, name, t.detach()[index].clone().requires_grad_(t.requires_grad))
            self.hyper = {key: value[index] for key, value in self.hyper.items()}
        self._after_remove(index)
        if self.buffer is not None:
            self.buffer.keep(index)
        self._keep_rows(index)
        self._keep_statistics(keep_positions)
        self._keep_members(keep_positions)

    def _keep_rows(self, index: torch.Tensor) -> None:
        """Per-row state of the members kept (TD3's noise process)."""

    def _after_remove(self, index: torch.Tensor) -> None:
        """After the stacks kept the members at `index` (SAC rebuilds its flat Adam)."""

    def _finite_members(self) -> torch.Tensor:
        """Whether each member still in the computation has all-finite parameters (device flags)."""
        params = [t for name in self._member_lists for t in getattr(self, name)]
        params += [getattr(self, name) for name in self._member_tensors]
        return torch.stack([p.detach().flatten(1).isfinite().all(1) for p in params]).all(0)

    # --- what `PopulationBase.learn` asks of a population ---------------------------------------------------------
    def _check_start_fits(self, total_timesteps: int) -> None:
        """The first learn (no replay yet): the members' replay is refused, in `check_fits`' sentence (the CLI's),
        before the envs are built; a later learn's growth is checked as it grows."""
        if self.buffer is None and self.alive:
            self.check_fits(total_timesteps)

    def _begin(self, total_timesteps: int, schedule_start: int) -> None:
        self._start(total_timesteps, schedule_start)

    # --- evaluation and the learn loop -------------------------------------------------------------------------
    def _actor_of(self, members: Sequence[int]) -> dict[str, list[torch.Tensor]]:
        """The actor weight lists of `members` (original indices), stacked in that order."""
        parts = []
        for member in members:
            if member in self._left:
                parts.append(self._left[member])
            else:
                position = self.alive.index(member)
                parts.append({name: [t[position].detach() for t in getattr(self, name)]
                              for name in self._actor_lists})
        return {name: [torch.stack([p[name][i] for p in parts]) for i in range(len(parts[0][name]))]
                for name in self._actor_lists}

    @staticmethod
    def _in_solo_layout(actor: dict[str, list[torch.Tensor]]) -> dict[str, list[torch.Tensor]]:
        """`actor` (`_actor_of`'s) with its MLP weights `[M, in, out]` laid out as the solo's `nn.Linear` weights
        (each member's `[out, in]` contiguous, seen transposed): `_mlp`'s products over them (`_as_solo`) are the
        solo's `F.linear` calls, where the row-major stack rounds differently in float32's last bit (returns then
        differ from `rlspeed eval`'s in the 8th digit)."""
        return {name: [w.transpose(-1, -2).contiguous().transpose(-1, -2) if name.endswith("_weights") else w
                       for w in tensors] for name, tensors in actor.items()}

    def evaluate(self, seeds: Sequence[int] | None = None, episodes: int = 10, members: Sequence[int] | None = None,
                 max_steps: int | None = None) -> torch.Tensor:
        """Mean return over `episodes` deterministic episodes `[len(members)]` (host tensor) of `members` (original
        indices; default: those in the computation, as PPO's), member i's on an env seeded `seeds[i]` as
        `rlspeed.evaluate` seeds one (default seeds: `_evaluation_seeds`); members that left with the parameters they
        left with. The members act as their solo models do: `rlspeed eval`'s actions, digit for digit."""
        return self._evaluate(seeds, episodes, members, max_steps, as_solo=True)

    def _evaluate_during_learn(self, seeds: Sequence[int], episodes: int, members: Sequence[int]) -> torch.Tensor:
        """`evaluate`'s episodes, seeds and step limit for `learn`'s evaluations during training (curves,
        confirmations, `on_eval`), the members acting through the batched networks (one product per layer for all
        of them, as in training) instead of their solo models' layout: a mean may differ from the saved member's
        `rlspeed eval` in float32's last bit. The final evaluation is `evaluate`'s."""
        return self._evaluate(seeds, episodes, members, None, as_solo=False)

    def _evaluate(self, seeds: Sequence[int] | None, episodes: int, members: Sequence[int] | None,
                  max_steps: int | None, as_solo: bool) -> torch.Tensor:
        """`evaluate`'s means, the members acting as their solo models (`as_solo`) or through the batched networks."""
        episodes = positive_whole("episodes", episodes, needed_by="evaluate")
        members = list(self.alive) if members is None else list(members)
        self._check_members(members)
        seeds = self._evaluation_seeds(seeds, members)
        actor = self._in_solo_layout(self._actor_of(members)) if as_solo else self._actor_of(members)
        count = len(members)

        def policy(obs: torch.Tensor, masks: torch.Tensor | None = None) -> torch.Tensor:
            # (masks: given where the members apply the env's action masks, `_mean_returns`; rows: each member's
            # episodes of the wave it plays)
            rows = obs.shape[0] // count
            member_masks = () if masks is None else (masks.view(count, rows, -1),)
            self._as_solo = as_solo
            try:
                actions = self._deterministic(self._inputs(obs.view(count, rows, -1)), actor, *member_masks)
            finally:
                self._as_solo = False
            return self._to_env(actions.reshape(count * rows, *self._action_tail))

        return self._mean_returns(seeds, episodes, policy, members, max_steps)

    def _row_counts(self) -> dict[str, int]:
        """How many tensors each of a member's row groups holds (`_member_lists`' lengths; 1 per member tensor)."""
        return {**{name: len(getattr(self, name)) for name in self._member_lists},
                **dict.fromkeys(self._member_tensors, 1)}

    def _member_rows(self, k: int) -> dict[str, list[torch.Tensor]]:
        """Member k's (original index) rows of every stacked tensor, by list name (a member tensor is a list of
        one): views of the current stacks while it trains, the rows it left with after it left."""
        if k in self._left:
            rows = self._left[k]
            if len(rows) < len(self._row_counts()):
                raise UserError(f"Member {k} left the population before a checkpoint that kept only its actor "
                                "(written by an older rlspeed); its other parameters are not stored.")
            return rows
        if k not in self.alive:
            raise UserError(f"Member {k} is not in this population of {self.size} (members are 0-{self.size - 1}).")
        position = self.alive.index(k)
        return {**{name: [t[position].detach() for t in getattr(self, name)] for name in self._member_lists},
                **{name: [getattr(self, name)[position].detach()] for name in self._member_tensors}}


class SACPopulation(OffPolicyPopulation):
    """K independent SAC members trained as one batched model (see the module docstring).

    >>> from rlspeed import SAC
    >>> from rlspeed.population import Population
    >>> population = Population(SAC, "Pendulum-v1", seeds=range(16), learning_rate=[1e-3] * 8 + [3e-4] * 8)
    >>> summary = population.learn(20_000, target_return=-200, eval_freq=500)

    `seeds`: one per member (distinct). Hyperparameters: one value for all members, or, for those in
    `PER_MEMBER_SAC`, a list of K values (`ent_coef`: a float fixes a member's temperature, None tunes it).
    `member_overrides`: a list of K dicts of hyperparameters for single members (same rules).
    """

    algo_name = "sac"
    per_member = PER_MEMBER_SAC
    _member_lists = ("actor_weights", "actor_biases", "critic_weights", "critic_biases", "target_weights",
                     "target_biases")
    _member_tensors = ("log_alpha", "autotune", "target_entropy")

    @property
    def algo_cls(self) -> type:  # (imported late: rlspeed.algos imports much)
        from rlspeed.algos.sac import SAC

        return SAC

    def _build(self, solos: list) -> None:
        self.actor_weights, self.actor_biases = _stack_linears([s.actor.net for s in solos])
        self._stack_critics(solos)
        self.log_alpha = stack_leaf([s.log_alpha for s in solos])  # [K, 1]
        self.autotune = torch.tensor([[float(s.autotune)] for s in solos], device=self.device)
        self.target_entropy = torch.tensor([[s.target_entropy] for s in solos], device=self.device)
        self._adam = _FlatMemberAdam(self._params(), self.hyper["learning_rate"], self.config.adam_eps)
        self._flat_targets()
        # the hand-derived gradient (as `rlspeed.fused.sac`) where the networks are ReLU or tanh MLPs with hidden
        # layers and fused_update is on, else autograd of the summed losses
        uncovered = (activation_reason(self.activation) if len(self.actor_weights) > 1
                     else "networks without hidden layers")  # (whose activation, whichever is named, never runs)
        self._hand_derived = self.config.fused_update and not uncovered
        self._tanh = type(self.activation) is torch.nn.Tanh
        self._workspace = Workspace()
        if self._hand_derived:
            self.update_path, self.update_reason = "hand-derived", "default (an MLP with ReLU or tanh)"
        else:
            self.update_reason = "fused_update=False" if not self.config.fused_update else uncovered

    def _params(self) -> list[torch.Tensor]:
        return [*self.actor_weights, *self.actor_biases, *self.critic_weights, *self.critic_biases, self.log_alpha]

    def _flat_targets(self) -> None:
        """The target critics as views of one buffer laid out as the critics' part of the flat parameters (the
        Polyak step is one lerp), and each of its elements' tau."""
        targets = [*self.target_weights, *self.target_biases]
        layers = len(self.actor_weights)
        start, end = self._adam.offsets[2 * layers], self._adam.offsets[2 * layers + len(targets)]
        self._critic_flat = self._adam.flat[start:end]
        # the Adam step's parts: the critics', then (after the actor's gradient through them) the actor's and alpha's
        self._critic_parts, self._actor_parts = [slice(start, end)], [slice(0, start), slice(end, None)]
        with torch.no_grad():
            self._target_flat = torch.cat([t.reshape(-1) for t in targets])
        for t, chunk in zip(targets, self._target_flat.split([t.numel() for t in targets])):
            t.data = chunk.view_as(t)
        self._target_tau = self.hyper["tau"][self._adam.member_of[start:end]]

    def _after_remove(self, index: torch.Tensor) -> None:
        if index.numel() == 0:  # (no member left to train)
            return
        self._adam = self._kept_adam(self._adam, self._params(), index)
        self._flat_targets()

    def _actor(self, obs: torch.Tensor, weights=None, biases=None) -> tuple[torch.Tensor, torch.Tensor]:
        out = self._mlp(obs, weights or self.actor_weights, biases or self.actor_biases)
        mean, log_std = out.chunk(2, dim=-1)
        return mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)

    def _explore(self, obs: torch.Tensor, timesteps: int) -> torch.Tensor:
        mean, log_std = self._actor(obs)
        return torch.addcmul(mean, log_std.exp(), self._solo_noise(*mean.shape[1:])).tanh_()

    def _deterministic(self, obs: torch.Tensor, actor: dict[str, list[torch.Tensor]]) -> torch.Tensor:
        return torch.tanh(self._actor(obs, actor["actor_weights"], actor["actor_biases"])[0])

    def _update(self, batch: dict[str, torch.Tensor]) -> None:
        """SAC's update of every member (`SAC._critic_loss`, the critics' part of the per-member Adam step, then
        `SAC._actor_loss` through the updated critics and the actor's and temperature's part), the members' losses
        summed, gradients hand-derived or by autograd; then the Polyak step. The policy's noise for (next_obs, obs)
        is one draw of `2B` rows per member, as the solo's hand-derived update draws it."""
        adam = self._adam

        def critic_step() -> None:
            adam.step(self._critic_parts)

        if self._hand_derived:
            self._gradient(batch, between=critic_step)
        else:
            self._autograd_gradient(batch, between=critic_step)
        adam.step(self._actor_parts, advance=False)
        with torch.no_grad():
            self._target_flat.lerp_(self._critic_flat, self._target_tau)

    def _solo_noise(self, rows: int, dims: int) -> torch.Tensor:
        """Standard normal noise `[K, rows, dims]`, member k's from its generator, drawn as the solo run draws it
        (row-major, whatever the layout of its actor's output)."""
        return torch.stack([torch.randn(rows, dims, device=self.device, generator=g) for g in self.generators])

    @torch.no_grad()
    def _gradient(self, batch: dict[str, torch.Tensor], between=None) -> None:
        """The members' gradients written out, as `rlspeed.fused.sac.FusedSACUpdate.gradient` writes one model's:
        the actors on [next_obs; obs] as one ensemble of K, the critics on (obs, a) as one ensemble of K x C (their
        weight gradients), then `between()` (the critics' step), the critics as they are then on (obs, a~) (dJ/da~,
        the weights held constant), then the actor's chain. Writes them into the flat Adam's gradient buffer."""
        obs, actions, rewards = batch["obs"], batch["actions"], batch["rewards"]
        next_obs, terminated, discounts = batch["next_obs"], batch["terminated"], batch["discounts"]
        grads, ws, tanh = self._adam.grad_views, self._workspace, self._tanh
        layers = len(self.actor_weights)
        actor_weight_grads, actor_bias_grads = grads[:layers], grads[layers:2 * layers]
        critic_layers = len(self.critic_weights)
        critic_grads = grads[2 * layers:2 * layers + 2 * critic_layers]
        critic_weight_grads = [g.flatten(0, 1) for g in critic_grads[:critic_layers]]
        critic_bias_grads = [g.flatten(0, 1) for g in critic_grads[critic_layers:]]
        size, rows = obs.shape[0], obs.shape[1]
        critics = self.critic_weights[0].shape[1]
        alpha = self.log_alpha.detach().exp().unsqueeze(-1)  # [K, 1, 1]
        actor_weights = [w.detach() for w in self.actor_weights]
        actor_biases = [b.detach() for b in self.actor_biases]

        # Actors on [next_obs; obs]: a' and a~ with their log-probabilities.
        actor_out = ensemble_forward(torch.cat((next_obs, obs), dim=1), actor_weights, actor_biases, tanh, ws, "actor")
        mean, raw_log_std = actor_out[-1].chunk(2, dim=-1)
        log_std = raw_log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)
        std = log_std.exp()
        noise = self._solo_noise(*mean.shape[1:])
        u = torch.addcmul(mean, std, noise)
        squashed = torch.tanh(u)
        log_pi = (F.softplus(u.mul(-2.0)).add_(u).mul_(2.0).sub_(log_std).addcmul_(noise, noise, value=-0.5)
                  .sum(-1).sub_(self.action_dim * (2 * LOG_2 + 0.5 * LOG_2PI)))  # [K, 2B]
        next_actions, pi_actions = squashed[:, :rows], squashed[:, rows:]
        next_log_pi, pi_log_pi = log_pi[:, :rows], log_pi[:, rows:]

        def critic_rows(x: torch.Tensor) -> torch.Tensor:  # [K, R, in] -> [K * C, R, in]
            return x.unsqueeze(1).expand(-1, critics, -1, -1).reshape(size * critics, x.shape[1], -1)

        # Soft Bellman target from the target critics.
        next_q = ensemble_forward(critic_rows(torch.cat((next_obs, next_actions), -1)),
                                  [w.flatten(0, 1) for w in self.target_weights],
                                  [b.flatten(0, 1) for b in self.target_biases], tanh, ws, "target")[-1]
        next_q = next_q.view(size, critics, rows).amin(1).sub_(alpha[:, 0] * next_log_pi)
        target_q = torch.addcmul(rewards, discounts * torch.rsub(terminated, 1.0), next_q)  # [K, B]

        # Critics on (obs, a): their weight gradients, then (`between`) their step. (The weights below are views of
        # the flat parameters: after the step they are the updated ones.)
        critic_weights = [w.detach().flatten(0, 1) for w in self.critic_weights]
        critic_biases = [b.detach().flatten(0, 1) for b in self.critic_biases]
        critic_out = ensemble_forward(critic_rows(torch.cat((obs, actions), -1)), critic_weights, critic_biases, tanh,
                                      ws, "critic")
        td_error = critic_out[-1].view(size, critics, rows) - target_q.unsqueeze(1)
        ensemble_backward(td_error.mul(1.0 / rows).view(size * critics, rows, 1), critic_out, critic_weights,
                          critic_weight_grads, critic_bias_grads, tanh, workspace=ws, tag="critic")
        if between is not None:
            between()

        # Critics on (obs, a~): -1/B through the minimum critic (shared on ties), the weights held constant.
        pi_out = ensemble_forward(critic_rows(torch.cat((obs, pi_actions), -1)), critic_weights, critic_biases, tanh,
                                  ws, "critic pi")
        q_pi_all = pi_out[-1].view(size, critics, rows)
        q_pi = q_pi_all.amin(1, keepdim=True)
        at_min = (q_pi_all == q_pi).to(q_pi_all.dtype)
        grad_pi_q = at_min.div_(at_min.sum(1, keepdim=True).mul_(-rows)).view(size * critics, rows, 1)
        grad_in = ensemble_input_grad(grad_pi_q, pi_out, critic_weights, tanh, slice(obs.shape[-1], None), ws,
                                      "critic pi")
        grad_pi_actions = grad_in.view(size, critics, rows, -1).sum(1)  # dJ/da~ [K, B, A]

        # Actor chain (the obs half only; a' of the target carries no gradient).
        a, eps, sd = pi_actions, noise[:, rows:], std[:, rows:]
        alpha_over_batch = alpha.mul(1.0 / rows)
        grad_u = torch.addcmul(grad_pi_actions.addcmul(grad_pi_actions, a.square(), value=-1.0), a,
                               alpha_over_batch, value=2.0)
        grad_log_std = torch.addcmul(alpha_over_batch.neg().expand_as(a), grad_u, sd * eps)
        grad_log_std = grad_log_std * (log_std[:, rows:] == raw_log_std[:, rows:])
        ensemble_backward(torch.cat((grad_u, grad_log_std), dim=-1), [o[:, rows:] for o in actor_out], actor_weights,
                          actor_weight_grads, actor_bias_grads, tanh, workspace=ws, tag="actor")
        # Temperature: dJ/dlog_alpha = -mean(log pi + target_entropy), members that learn it only.
        torch.mean(pi_log_pi + self.target_entropy, dim=1, keepdim=True, out=grads[-1]).mul_(self.autotune.neg())

    def _autograd_gradient(self, batch: dict[str, torch.Tensor], between=None) -> None:
        """The reference: autograd of every member's `SAC._critic_loss`, summed (the members share no parameter),
        written into the flat Adam's gradient buffer; `between()` (the critics' step); then of every member's
        `SAC._actor_loss` through the critics as they are then."""
        obs, actions, rewards = batch["obs"], batch["actions"], batch["rewards"]
        next_obs, terminated, discounts = batch["next_obs"], batch["terminated"], batch["discounts"]
        rows, adam = obs.shape[1], self._adam
        alpha = self.log_alpha.detach().exp()  # [K, 1]
        noise = self._solo_noise(2 * rows, self.action_dim)  # (for [next_obs; obs], as the hand-derived update)
        layers, critic_layers = len(self.actor_weights), len(self.critic_weights)

        def sample(x: torch.Tensor, eps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            mean, log_std = self._actor(x)
            u = mean + log_std.exp() * eps
            log_pi = (-0.5 * eps.square() - log_std - 0.5 * LOG_2PI - 2 * (LOG_2 - u - F.softplus(-2 * u))).sum(-1)
            return torch.tanh(u), log_pi

        def write(grads: Sequence[torch.Tensor], views: Sequence[torch.Tensor]) -> None:
            with torch.no_grad():
                for grad, view in zip(grads, views):
                    view.copy_(grad)

        with torch.no_grad():
            next_actions, next_log_pi = sample(next_obs, noise[:, :rows])
            next_q = self._critics(next_obs, next_actions, self.target_weights, self.target_biases).amin(1)
            target_q = rewards + discounts * (1 - terminated) * (next_q - alpha * next_log_pi)
        critic_params = [*self.critic_weights, *self.critic_biases]
        with torch.enable_grad():
            q_values = self._critics(obs, actions, self.critic_weights, self.critic_biases)
            critic_loss = 0.5 * (q_values - target_q.unsqueeze(1)).square().mean(-1).sum(-1)
            write(torch.autograd.grad(critic_loss.sum(), critic_params),
                  adam.grad_views[2 * layers:2 * layers + 2 * critic_layers])
        if between is not None:
            between()
        actor_params = [*self.actor_weights, *self.actor_biases, self.log_alpha]
        with torch.enable_grad():
            pi_actions, pi_log_pi = sample(obs, noise[:, rows:])
            q_pi = self._critics(obs, pi_actions, [w.detach() for w in self.critic_weights],
                                 [b.detach() for b in self.critic_biases]).amin(1)
            actor_loss = (alpha * pi_log_pi - q_pi).mean(-1)
            alpha_loss = -(self.log_alpha * (pi_log_pi.detach() + self.target_entropy)).mean(-1) * self.autotune[:, 0]
            write(torch.autograd.grad((actor_loss + alpha_loss).sum(), actor_params),
                  [*adam.grad_views[:2 * layers], adam.grad_views[-1]])

    def member_state(self, k: int) -> dict[str, torch.Tensor]:
        """Member k's parameters, named as a solo SAC's checkpoint names them (`actor.net.0.weight`,
        `critic.body.weights.0`, `critic_target.body.biases.1`, and `log_alpha` where the member learns its
        temperature)."""
        rows = self._member_rows(k)
        state = {**_linear_state("actor.net", rows["actor_weights"], rows["actor_biases"]), **self._critic_state(rows)}
        if bool(rows["autotune"][0]):
            state["log_alpha"] = rows["log_alpha"][0].clone()
        return state


class TD3Population(OffPolicyPopulation):
    """K independent TD3 members trained as one batched model (see the module docstring).

    >>> from rlspeed import TD3
    >>> from rlspeed.population import Population
    >>> population = Population(TD3, "Pendulum-v1", seeds=range(16), learning_rate=[1e-3] * 8 + [3e-4] * 8)

    Hyperparameters: one value for all members, or, for those in `PER_MEMBER_TD3`, a list of K values.
    """

    algo_name = "td3"
    per_member = PER_MEMBER_TD3
    _member_lists = ("actor_weights", "actor_biases", "critic_weights", "critic_biases", "actor_target_weights",
                     "actor_target_biases", "target_weights", "target_biases")

    @property
    def algo_cls(self) -> type:
        from rlspeed.algos.td3 import TD3

        return TD3

    def _build(self, solos: list) -> None:
        self.actor_weights, self.actor_biases = _stack_linears([s.actor.net for s in solos])
        self.actor_target_weights, self.actor_target_biases = _stack_linears([s.actor_target.net for s in solos],
                                                                             trainable=False)
        self._stack_critics(solos)
        self.hyper.update(config_tensors(solos, ("target_policy_noise", "target_noise_clip", "action_noise_std",
                                                 "ou_theta", "ou_dt"), self.device))
        self._actor_adam = _FlatMemberAdam(self._actor_params(), self.hyper["learning_rate"], self.config.adam_eps)
        self._critic_adam = _FlatMemberAdam(self._critic_params(), self.hyper["learning_rate"], self.config.adam_eps)
        self._critic_updates = 0
        self._ou_noise: torch.Tensor | None = None
        # which members draw target-smoothing noise (host-side: the solo run draws none when its noise is 0), and the
        # same as a mask of the members in the computation `[K, 1, 1]` (cut in `_after_remove`)
        self._smoothing = {k: s.config.target_policy_noise > 0 for k, s in enumerate(solos)}
        self._smoothing_mask = torch.tensor([self._smoothing[k] for k in range(len(solos))],
                                            device=self.device).view(-1, 1, 1)

    _adams = ("_actor_adam", "_critic_adam")

    def _algorithm_state(self) -> tuple[dict[str, torch.Tensor], dict]:
        tensors = {} if self._ou_noise is None else {"ou_noise": self._ou_noise}
        return tensors, {"critic_updates": self._critic_updates}

    def _load_algorithm_state(self, tensors: dict[str, torch.Tensor], values: dict) -> None:
        self._critic_updates = int(values["critic_updates"])
        self._ou_noise = tensors["ou_noise"].clone() if "ou_noise" in tensors else None

    def _after_remove(self, index: torch.Tensor) -> None:
        self._smoothing_mask = self._smoothing_mask[index]
        if index.numel() == 0:  # (no member left to train)
            return
        self._actor_adam = self._kept_adam(self._actor_adam, self._actor_params(), index)
        self._critic_adam = self._kept_adam(self._critic_adam, self._critic_params(), index)

    def _actor_params(self) -> list[torch.Tensor]:
        return [*self.actor_weights, *self.actor_biases]

    def _critic_params(self) -> list[torch.Tensor]:
        return [*self.critic_weights, *self.critic_biases]

    def _actor(self, obs: torch.Tensor, weights=None, biases=None) -> torch.Tensor:
        return torch.tanh(self._mlp(obs, weights or self.actor_weights, biases or self.actor_biases))

    def _deterministic(self, obs: torch.Tensor, actor: dict[str, list[torch.Tensor]]) -> torch.Tensor:
        return self._actor(obs, actor["actor_weights"], actor["actor_biases"])

    def _member_noise(self, shape: Sequence[int], draws: torch.Tensor) -> torch.Tensor:
        """Standard normal noise `[K, *shape]`, drawn from member k's generator only where `draws[k]` is set (the
        solo run draws none when its noise scale is 0); zeros elsewhere."""
        return torch.stack([torch.randn(shape, device=self.device, generator=g) if draw
                            else torch.zeros(shape, device=self.device)
                            for g, draw in zip(self.generators, draws)])

    def _explore(self, obs: torch.Tensor, timesteps: int) -> torch.Tensor:
        cfg = self.config
        actions = self._actor(obs)
        if cfg.action_noise == "normal":
            std = self.hyper["action_noise_std"].view(-1, 1, 1)
            actions = actions + std * self._member_noise(actions.shape[1:], [True] * len(self.generators))
        elif cfg.action_noise == "ornstein-uhlenbeck":
            if self._ou_noise is None:
                self._ou_noise = torch.zeros_like(actions)
            theta, dt = self.hyper["ou_theta"].view(-1, 1, 1), self.hyper["ou_dt"].view(-1, 1, 1)
            std = self.hyper["action_noise_std"].view(-1, 1, 1)
            noise = self._member_noise(actions.shape[1:], [True] * len(self.generators))
            self._ou_noise += -theta * dt * self._ou_noise + std * dt.sqrt() * noise
            actions = actions + self._ou_noise
        return actions.clamp(-1.0, 1.0)

    def _on_dones(self, dones: torch.Tensor) -> None:
        if self._ou_noise is not None:
            self._ou_noise.masked_fill_(dones.view(*self._ou_noise.shape[:2], 1), 0.0)

    def _keep_rows(self, index: torch.Tensor) -> None:
        if self._ou_noise is not None:
            self._ou_noise = self._ou_noise[index]

    def _update(self, batch: dict[str, torch.Tensor]) -> None:
        """`TD3._critic_loss` of every member, summed, and its per-member Adam step; every `policy_delay` steps then
        the actor's loss through the first (updated) critic, its Adam step, and the Polyak step of both targets."""
        obs, actions, rewards = batch["obs"], batch["actions"], batch["rewards"]
        next_obs, terminated, discounts = batch["next_obs"], batch["terminated"], batch["discounts"]
        hyper = self.hyper
        self._critic_updates += 1
        actor_step = self._critic_updates % self.config.policy_delay == 0
        with torch.no_grad():
            next_actions = self._actor(next_obs, self.actor_target_weights, self.actor_target_biases)
            draws = [self._smoothing[member] for member in self.alive]
            if any(draws):
                clip = hyper["target_noise_clip"].view(-1, 1, 1)
                noise = self._member_noise(next_actions.shape[1:], draws)
                noise = torch.maximum(torch.minimum(noise * hyper["target_policy_noise"].view(-1, 1, 1), clip), -clip)
                smoothed = (next_actions + noise).clamp(-1.0, 1.0)
                next_actions = smoothed if all(draws) else torch.where(self._smoothing_mask, smoothed, next_actions)
            next_q = self._critics(next_obs, next_actions, self.target_weights, self.target_biases).amin(1)
            target_q = rewards + discounts * (1 - terminated) * next_q
        q_values = self._critics(obs, actions, self.critic_weights, self.critic_biases)
        loss = (q_values - target_q.unsqueeze(1)).square().mean(-1).sum(-1)
        critic_params = self._critic_params()
        self._critic_adam.step_on(loss, critic_params)
        if not actor_step:
            return
        # the actor's step through the critics just updated, their weights as constants
        q_first = self._critics(obs, self._actor(obs), [w.detach() for w in self.critic_weights],
                                [b.detach() for b in self.critic_biases], members=slice(0, 1))
        actor_params = self._actor_params()
        self._actor_adam.step_on(-q_first[:, 0].mean(-1), actor_params)
        with torch.no_grad():
            tau = hyper["tau"]
            for target, online in zip([*self.actor_target_weights, *self.actor_target_biases, *self.target_weights,
                                       *self.target_biases], [*actor_params, *critic_params]):
                target.lerp_(online, tau.view((-1,) + (1,) * (target.dim() - 1)))

    def member_state(self, k: int) -> dict[str, torch.Tensor]:
        """Member k's parameters, named as a solo TD3's checkpoint names them (`actor.net.0.weight`,
        `actor_target.net.0.weight`, `critic.body.weights.0`, `critic_target.body.biases.1`)."""
        rows = self._member_rows(k)
        return {**_linear_state("actor.net", rows["actor_weights"], rows["actor_biases"]),
                **_linear_state("actor_target.net", rows["actor_target_weights"], rows["actor_target_biases"]),
                **self._critic_state(rows)}


class DDPGPopulation(TD3Population):
    """K independent DDPG members trained as one batched model: TD3's population with DDPG's configuration (one
    critic, the actor updated at every critic update, no target policy smoothing: `DDPGConfig`'s defaults).

    >>> from rlspeed import DDPG
    >>> from rlspeed.population import Population
    >>> population = Population(DDPG, "Pendulum-v1", seeds=range(16), learning_rate=[1e-3] * 8 + [3e-4] * 8)

    Hyperparameters: one value for all members, or, for those in `PER_MEMBER_TD3`, a list of K values.
    """

    algo_name = "ddpg"

    @property
    def algo_cls(self) -> type:
        from rlspeed.algos.ddpg import DDPG

        return DDPG


class DQNPopulation(OffPolicyPopulation):
    """K independent DQN members trained as one batched model (see the module docstring): each layer of the K
    Q-networks is one batched matmul; epsilon-greedy's draws for a collection phase come from each member's
    generator as `DQN._prepare_collection` draws them; Double DQN targets, the TD loss (`td_loss`), per-member clipping
    and Adam (autograd of the members' summed losses); target networks copied (or Polyak-averaged) every
    `target_update_interval` env steps.

    >>> from rlspeed import DQN
    >>> from rlspeed.population import Population
    >>> population = Population(DQN, "CartPole-v1", seeds=range(8), learning_rate=[1e-4] * 4 + [6e-4] * 4)

    Hyperparameters: one value for all members, or, for those in `PER_MEMBER_DQN`, a list of K values. Plain or
    dueling Q-networks, on float-vector or one-hot Discrete observations, flattened bool or integer vectors, or images
    through each member's own CNN encoder (`MemberEncoder`, stacked in `q_encoder` / `target_encoder`; the replay
    keeps the images' dtype), with the env's action masks where it gives
    them (`use_masking`: in the exploring and greedy choices and the targets' argmax, as the solo's).
    """

    algo_name = "dqn"
    per_member = PER_MEMBER_DQN
    supports_action_masks = True
    member_encoders = True
    encodes_inside = True
    _member_lists = ("q_weights", "q_biases", "target_weights", "target_biases")
    _actor_lists = ("q_weights", "q_biases")
    #: each member's own encoder parameters (images), online and target: empty without one
    q_encoder: list[torch.Tensor] = []
    target_encoder: list[torch.Tensor] = []

    @property
    def algo_cls(self) -> type:
        from rlspeed.algos.dqn import DQN

        return DQN

    def _build(self, solos: list) -> None:
        # Dueling networks (`QNetwork`: body MLP, its activation, then one head giving V and A) stack as one MLP: the
        # body's layers then the head, an activation between each (the body's last included) and none after.
        self.q_weights, self.q_biases = _stack_linears([self._linears(s.q_network) for s in solos])
        self.target_weights, self.target_biases = _stack_linears([self._linears(s.q_target) for s in solos],
                                                                 trainable=False)
        if has_parameters(solos[0].q_network.encoder):  # (images: each member's own CNN, online and target)
            self._member_encoder = MemberEncoder([s.q_network.encoder for s in solos])
            self.q_encoder = self._member_encoder.stack([s.q_network.encoder for s in solos])
            self.target_encoder = self._member_encoder.stack([s.q_target.encoder for s in solos], trainable=False)
            self._member_lists = (*self._member_lists, "q_encoder", "target_encoder")
            self._actor_lists = (*self._actor_lists, "q_encoder")
        self.hyper.update(config_tensors(solos, ("max_grad_norm",), self.device))
        # the exploration schedules and tau, per member on the host (epsilon is a host float, as `DQN.epsilon`)
        self._schedule = {k: (s.config.exploration_fraction, s.config.exploration_initial_eps,
                              s.config.exploration_final_eps, s.config.tau) for k, s in enumerate(solos)}
        self._adam = _FlatMemberAdam(self._params(), self.hyper["learning_rate"], self.config.adam_eps)
        self._draws: tuple[int, torch.Tensor, torch.Tensor] | None = None

    def _params(self) -> list[torch.Tensor]:
        return [*self.q_weights, *self.q_biases, *self.q_encoder]

    def _after_remove(self, index: torch.Tensor) -> None:
        if index.numel() == 0:
            return
        self._adam = self._kept_adam(self._adam, self._params(), index)
        self._draws = None

    @staticmethod
    def _linears(network: torch.nn.Module) -> list[torch.nn.Module]:
        """A solo `QNetwork`'s linear layers in order (dueling: the body's, then the head)."""
        if network.dueling:
            return [*network.body[0], network.head]
        return list(network.body)

    def _q_values(self, obs: torch.Tensor, weights=None, biases=None, encoder=None) -> torch.Tensor:
        """Q-values `[K, B, n]` under the given stacked parameters (default: the online network's)."""
        features = self._features(obs, self.q_encoder if encoder is None else encoder)
        out = self._mlp(features, weights or self.q_weights, biases or self.q_biases)
        return dueling_q_values(out) if self.config.dueling else out

    def _greedy(self, q_values: torch.Tensor, masks: torch.Tensor | None = None) -> torch.Tensor:
        """The greedy actions `[K, B]` among the allowed ones (`masks` `[K, B, n]`; None: all), as `DQN._greedy`."""
        return masked_logits(q_values, masks).argmax(-1).to(self._index_dtype)

    def _deterministic(self, obs: torch.Tensor, actor: dict[str, list[torch.Tensor]],
                       masks: torch.Tensor | None = None) -> torch.Tensor:
        return self._greedy(self._q_values(obs, actor["q_weights"], actor["q_biases"], actor.get("q_encoder")), masks)

    # --- exploration ------------------------------------------------------------------------------------------
    def _before_collect(self, before: int) -> None:
        cfg, envs = self.config, self.config.num_envs
        self._draws = None
        if before + cfg.train_freq * envs <= cfg.learning_starts:
            return
        explore, actions = [], []
        for generator, member in zip(self.generators, self.alive):
            fraction, initial, final, _ = self._schedule[member]
            epsilons = collection_epsilons(cfg.train_freq, envs, before, self._learn_start, self._schedule_end,
                                           fraction, initial, final, self.device)
            explore.append(torch.rand((cfg.train_freq, envs), device=self.device, generator=generator)
                           < epsilons.unsqueeze(1))
            if self._masking:  # (one uniform number per action: the step takes the allowed one with the largest)
                actions.append(torch.rand((cfg.train_freq, envs, self.action_dim), device=self.device,
                                          generator=generator))
            else:
                actions.append(torch.randint(0, self.action_dim, (cfg.train_freq, envs), device=self.device,
                                             generator=generator, dtype=self._index_dtype))
        self._draws = (before, torch.stack(explore), torch.stack(actions))

    def _explore(self, obs: torch.Tensor, timesteps: int, masks: torch.Tensor | None = None) -> torch.Tensor:
        greedy = self._greedy(self._q_values(obs), masks)  # [K, N]
        start, explore, actions = self._draws  # (drawn for every step past learning_starts: see _before_collect)
        step = (timesteps - start) // self.config.num_envs
        random_actions = actions[:, step]
        if masks is not None:
            random_actions = allowed_uniform(random_actions, masks).to(self._index_dtype)
        return torch.where(explore[:, step], random_actions, greedy)

    def _after_iteration(self, before: int) -> None:
        # Target networks every target_update_interval env steps, by copy (tau=1) or Polyak, as DQN does: k updates
        # due now are one with 1 - (1 - tau)^k.
        cfg = self.config
        interval = cfg.target_update_interval
        due = (before + cfg.train_freq * cfg.num_envs) // interval - before // interval
        if due <= 0:
            return
        taus = [1.0 - (1.0 - self._schedule[member][3]) ** due for member in self.alive]
        with torch.no_grad():
            pairs = list(zip([*self.target_weights, *self.target_biases, *self.target_encoder],
                             [*self.q_weights, *self.q_biases, *self.q_encoder]))
            if all(tau == 1.0 for tau in taus):
                for target, online in pairs:
                    target.copy_(online)
                return
            weight = torch.tensor(taus, device=self.device)
            for target, online in pairs:
                shape = (-1,) + (1,) * (target.dim() - 1)
                target.copy_(torch.where(weight.view(shape) == 1.0, online, target.lerp(online, weight.view(shape))))

    # --- one gradient step ------------------------------------------------------------------------------------
    def _update(self, batch: dict[str, torch.Tensor]) -> None:
        """`DQN._loss` of every member (Double DQN target, `td_loss`; the argmax or max over the actions allowed at the
        next observation where the rows keep masks), summed; each member's gradient clipped to its own global norm
        (`max_grad_norm`); per-member Adam."""
        obs, rewards, next_obs = batch["obs"], batch["rewards"], batch["next_obs"]
        actions = batch["actions"].long()  # [K, B, 1]
        next_masks = batch.get("next_action_masks")
        with torch.no_grad():
            next_q_target = self._q_values(next_obs, self.target_weights, self.target_biases, self.target_encoder)
            if self.config.double_q:
                next_actions = masked_logits(self._q_values(next_obs, [w.detach() for w in self.q_weights],
                                                            [b.detach() for b in self.q_biases],
                                                            [e.detach() for e in self.q_encoder]),
                                             next_masks).argmax(-1, keepdim=True)
                next_q = next_q_target.gather(-1, next_actions).squeeze(-1)
            else:
                next_q = masked_logits(next_q_target, next_masks).max(-1).values
            target_q = rewards + batch["discounts"] * (1 - batch["terminated"]) * next_q
        params = self._params()
        with torch.enable_grad():
            q_values = self._q_values(obs).gather(-1, actions).squeeze(-1)
            loss = TD_LOSSES[self.config.td_loss](q_values, target_q, reduction="none").mean(-1).sum()
            grads = torch.autograd.grad(loss, params)
        adam = self._adam
        with torch.no_grad():
            torch.cat([g.reshape(-1) for g in grads], out=adam.grad)
            scale = (self.hyper["max_grad_norm"] / (member_grad_norms(grads) + 1e-6)).clamp(max=1.0)
            torch._foreach_mul_(adam.grad_views, [scale.view(-1, *(1,) * (v.dim() - 1)) for v in adam.grad_views])
        adam.step()

    def member_state(self, k: int) -> dict[str, torch.Tensor]:
        """Member k's parameters, named as a solo DQN's checkpoint names them (`q_network.body.0.weight`,
        `q_target.body.2.bias`, ...)."""
        rows = self._member_rows(k)
        state = {}
        if self._member_encoder is not None:  # (`QNetwork.encoder`'s names)
            for prefix, encoder in (("q_network", rows["q_encoder"]), ("q_target", rows["target_encoder"])):
                state.update({f"{prefix}.encoder.{name}": value.detach().clone()
                              for name, value in zip(self._member_encoder.names, encoder)})
        for prefix, weights, biases in (("q_network", rows["q_weights"], rows["q_biases"]),
                                        ("q_target", rows["target_weights"], rows["target_biases"])):
            if self.config.dueling:  # (`QNetwork`'s names: body.0.{0,2,...} then head)
                state.update(_linear_state(f"{prefix}.body.0", weights[:-1], biases[:-1]))
                state[f"{prefix}.head.weight"] = weights[-1].detach().T.clone()
                state[f"{prefix}.head.bias"] = biases[-1][0].detach().clone()
            else:
                state.update(_linear_state(f"{prefix}.body", weights, biases))
        return state
