"""Proximal Policy Optimization (Schulman et al., 2017) with the rollout, GAE and update on the device.

Readable top to bottom: collect `num_steps` steps from `num_envs` envs into preallocated storage, compute GAE in
one vectorised pass (truncated episodes bootstrapped from `final_obs`), then `n_epochs` passes of clipped-objective
minibatch updates. No host sync inside; metrics are device tensors read once per log interval.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlspeed.accel import accelerate_step, auto_accelerate
from rlspeed.algos.base import Algorithm, require
from rlspeed.buffers import RolloutBuffer, gae
from rlspeed.device import rules
from rlspeed.diagnostics.phases import phase
from rlspeed.envs import BatchedEnv
from rlspeed.fused import precision as fused_precision
from rlspeed.fused.ppo import FusedPPOUpdate
from rlspeed.fused.ppo import supports as supports_fused
from rlspeed.nn import ActorCritic, clip_grad_norm, make_adam


@dataclass
class PPOConfig:
    """PPO hyperparameters (names follow Stable-Baselines3 where it has one).

    The value loss follows CleanRL and the original implementation, not SB3: it is 0.5 * MSE, so `vf_coef` weighs
    it half as much as SB3's `vf_coef` does (vf_coef=1.0 here is SB3's 0.5), and with `clip_range_vf` it takes the
    larger of the clipped and unclipped errors (SB3 takes the clipped one).
    """

    num_envs: int = 8
    num_steps: int = 128  # rollout length per env (SB3: n_steps)
    batch_size: int = 256  # minibatch size
    n_epochs: int = 10
    learning_rate: float = 3e-4
    anneal_lr: bool = True  # linear decay of the learning rate to 0 over total_timesteps
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_range: float = 0.2
    anneal_clip: bool = False  # linear decay of clip_range to 0
    clip_range_vf: float | None = None  # value clipping (off by default)
    normalize_advantage: bool = True
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    net_arch: tuple[int, ...] = (64, 64)
    activation: str = "tanh"
    log_std_init: float = 0.0
    normalize_obs: bool = False
    normalize_reward: bool = False
    fused_update: bool = True  # hand-derived gradient + flat Adam (fused/ppo.py) where the network allows

    def validate(self) -> None:
        """Raise UserError, naming the hyperparameter, for a value out of range (`build_config` calls it).

        `batch_size` must divide `num_envs * num_steps` or be at least that (then one minibatch is the whole rollout).
        """
        require(self.num_envs >= 1, f"num_envs must be >= 1, got {self.num_envs}.")
        require(self.num_steps >= 1, f"num_steps must be >= 1, got {self.num_steps}.")
        require(self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}.")
        require(self.n_epochs >= 1, f"n_epochs must be >= 1, got {self.n_epochs}.")
        require(self.learning_rate > 0, f"learning_rate must be > 0, got {self.learning_rate}.")
        require(0 < self.gamma <= 1, f"gamma must be in (0, 1], got {self.gamma}.")
        require(0 <= self.gae_lambda <= 1, f"gae_lambda must be in [0, 1], got {self.gae_lambda}.")
        require(self.clip_range > 0, f"clip_range must be > 0, got {self.clip_range}.")
        require(self.clip_range_vf is None or self.clip_range_vf > 0, "clip_range_vf must be > 0 or null.")
        require(self.max_grad_norm > 0, f"max_grad_norm must be > 0, got {self.max_grad_norm}.")
        require(all(w > 0 for w in self.net_arch), f"net_arch widths must be positive, got {self.net_arch}.")
        rollout = self.num_envs * self.num_steps
        require(rollout % self.batch_size == 0 or self.batch_size >= rollout,
                f"batch_size ({self.batch_size}) must divide num_envs * num_steps ({rollout}).")


class PPO(Algorithm):
    """PPO for Discrete and Box action spaces.

    >>> model = PPO("CartPole-v1", seed=0).learn(100_000)
    >>> action, _ = model.predict(obs, deterministic=True)
    """

    name = "ppo"
    config_cls = PPOConfig
    config: PPOConfig

    def _setup(self) -> None:
        cfg, spec = self.config, self.spec
        world = self.strategy.world_size
        # each rank takes minibatches of batch_size / world rows from its share of the rollout
        require(world == 1 or cfg.batch_size >= cfg.num_envs * cfg.num_steps or cfg.batch_size % world == 0,
                f"batch_size ({cfg.batch_size}) must be a multiple of the number of processes ({world}): each process "
                "takes an equal share of every minibatch.")
        obs_dim = spec.obs_dim
        self.policy = ActorCritic(obs_dim, spec.action_dim, spec.discrete, cfg.net_arch, cfg.activation,
                                  cfg.log_std_init).to(self.device)
        self._params = list(self.policy.parameters())
        self.optimizer = make_adam(self._params, cfg.learning_rate, self.device)
        self._update_step = self._plain_step
        fused = fused_precision.use_fused(cfg.fused_update, supports_fused(self.policy), self.accelerate)
        if fused:
            self._update_step = FusedPPOUpdate(self.policy, self.optimizer, max_grad_norm=cfg.max_grad_norm,
                                               vf_coef=cfg.vf_coef, ent_coef=cfg.ent_coef,
                                               clip_range_vf=cfg.clip_range_vf,
                                               normalize_advantage=cfg.normalize_advantage, strategy=self.strategy)
        if self.accelerate == "auto":  # measured: keeps fp32 eager unless another strategy is faster and accurate
            self.policy = auto_accelerate(self.policy, device=self.device)
            self._update_step = (fused_precision.for_accelerate(self._update_step, "auto", self.device, "ppo")
                                 if fused else accelerate_step(self._loss, self.optimizer, params=self._params,
                                                               max_grad_norm=cfg.max_grad_norm, device=self.device,
                                                               name="ppo"))
        if not spec.discrete:
            box = spec.action_space
            self._action_low = torch.as_tensor(box.low, device=self.device, dtype=torch.float32)
            self._action_high = torch.as_tensor(box.high, device=self.device, dtype=torch.float32)

    def _optimizers(self):
        return {"optimizer": self.optimizer}

    def _policy_actions(self, obs: torch.Tensor, deterministic: bool) -> torch.Tensor:
        actions, _, _ = self.policy.act(obs.flatten(1), deterministic=deterministic)
        return self._to_env(actions)

    def _to_env(self, actions: torch.Tensor) -> torch.Tensor:
        if self.spec.discrete:
            return actions
        return torch.maximum(torch.minimum(actions, self._action_high), self._action_low)

    def _start(self, env: BatchedEnv, total_timesteps: int) -> None:
        cfg = self.config
        action_shape = () if self.spec.discrete else tuple(self.spec.action_space.shape)
        action_dtype = rules(self.device).index_dtype if self.spec.discrete else torch.float32
        self.buffer = RolloutBuffer(cfg.num_steps, env.num_envs, self.spec.observation_shape, action_shape,
                                    action_dtype, self.device)
        self._obs, _ = env.reset()

    def _progress_remaining(self) -> float:
        span = max(self._schedule_end - self._learn_start, 1)
        return max(1.0 - (self.num_timesteps - self._learn_start) / span, 0.0)

    def _train_iteration(self):
        cfg, env, buf, policy = self.config, self._env, self.buffer, self.policy
        remaining = self._progress_remaining()
        if cfg.anneal_lr:
            for group in self.optimizer.param_groups:
                group["lr"] = cfg.learning_rate * remaining
        clip_range = cfg.clip_range * remaining if cfg.anneal_clip else cfg.clip_range

        # 1. Rollout: everything stays on the device.
        episode_return_sum = torch.zeros((), device=self.device)
        episode_count = torch.zeros((), device=self.device)
        obs = self._obs
        with torch.no_grad():
            for step in range(cfg.num_steps):
                with phase("act"):
                    actions, log_probs, values = policy.act(obs.flatten(1))
                    env_actions = self._to_env(actions)
                with phase("env"):
                    next_obs, rewards, terminated, truncated, info = env.step(env_actions)
                with phase("buffer"):
                    dones = terminated | truncated
                    buf.add(step, obs, info["final_obs"], actions, log_probs, values, rewards, terminated, dones)
                    episode_return_sum += torch.where(dones, info["episode_return"], 0.0).sum()
                    episode_count += dones.sum()
                obs = next_obs
            self._obs = obs
            # 2. GAE, bootstrapping every step from V(final_obs); termination cuts the bootstrap, truncation not.
            with phase("gae"):
                next_values = policy.value(buf.next_obs.flatten(2).flatten(0, 1)).view_as(buf.values)
                advantages, returns = gae(buf.rewards, buf.values, next_values, buf.terminated, buf.dones,
                                          cfg.gamma, cfg.gae_lambda)

        # 3. Clipped-objective updates over shuffled minibatches.
        with phase("update"):
            stats = self._update_epochs(buf, advantages, returns, clip_range)
        metrics = {"episode_return_sum": episode_return_sum, "episode_count": episode_count,
                   "policy_loss": stats[0], "value_loss": stats[1], "entropy": stats[2], "approx_kl": stats[3],
                   "clipfrac": stats[4]}
        return cfg.num_steps * env.num_envs, metrics

    def _update_epochs(self, buf: RolloutBuffer, advantages: torch.Tensor, returns: torch.Tensor,
                       clip_range: float) -> torch.Tensor:
        """n_epochs of clipped-objective updates over shuffled minibatches of the rollout; returns the mean
        [policy loss, value loss, entropy, approx_kl, clipfrac] of the updates that reported them."""
        cfg = self.config
        batch_obs = buf.obs.flatten(2).flatten(0, 1)
        batch_actions = buf.actions.flatten(0, 1)
        batch_log_probs = buf.log_probs.flatten()
        batch_values = buf.values.flatten()
        batch_advantages = advantages.flatten()
        batch_returns = returns.flatten()
        batch_size = batch_obs.shape[0]
        # Data-parallel: each rank holds 1/world of the batch, so its minibatches are 1/world as large.
        minibatch = min(max(cfg.batch_size // self.strategy.world_size, 1), batch_size)
        stats = torch.zeros(5, device=self.device)  # policy loss, value loss, entropy, approx_kl, clipfrac
        updates = 0
        clip = torch.tensor(clip_range, device=self.device)  # a tensor: a compiled step must not specialise on it
        fused = isinstance(fused_precision.unwrap(self._update_step), FusedPPOUpdate)
        # One minibatch covering the whole batch: normalise its advantages once, not in every epoch.
        normalized = cfg.normalize_advantage and minibatch == batch_size > 1
        if normalized:
            batch_advantages = (batch_advantages - batch_advantages.mean()) / (batch_advantages.std() + 1e-8)
        for epoch in range(cfg.n_epochs):
            # One minibatch covering the whole batch needs no shuffle: its gradient does not depend on order.
            order = torch.randperm(batch_size, device=self.device) if minibatch < batch_size else None
            # The hand-derived update reports statistics of the last epoch only (fewer kernels in the others).
            options = {"normalized": normalized, "with_stats": epoch == cfg.n_epochs - 1} if fused else {}
            for start in range(0, batch_size - minibatch + 1, minibatch):
                index = order[start:start + minibatch] if order is not None else slice(None)
                _, minibatch_stats = self._update_step(batch_obs[index], batch_actions[index], batch_log_probs[index],
                                                       batch_values[index], batch_advantages[index],
                                                       batch_returns[index], clip, **options)
                if minibatch_stats is not None:
                    stats += minibatch_stats
                    updates += 1
        return stats / max(updates, 1)

    def _loss(self, obs, actions, old_log_probs, old_values, advantages, returns, clip_range):
        """The PPO loss of one minibatch: (loss, [policy loss, value loss, entropy, approx_kl, clipfrac])."""
        cfg = self.config
        new_log_probs, entropy, new_values = self.policy.evaluate(obs, actions)
        log_ratio = new_log_probs - old_log_probs
        ratio = log_ratio.exp()
        if cfg.normalize_advantage and advantages.shape[0] > 1:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        # L^CLIP = E[min(r A, clip(r, 1 - eps, 1 + eps) A)], minimised as its negative
        policy_loss = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - clip_range, 1 + clip_range)).mean()
        if cfg.clip_range_vf is None:
            value_loss = 0.5 * (new_values - returns).square().mean()
        else:
            clipped = old_values + (new_values - old_values).clamp(-cfg.clip_range_vf, cfg.clip_range_vf)
            value_loss = 0.5 * torch.max((new_values - returns).square(), (clipped - returns).square()).mean()
        entropy_loss = entropy.mean()
        loss = policy_loss - cfg.ent_coef * entropy_loss + cfg.vf_coef * value_loss
        with torch.no_grad():
            approx_kl = ((ratio - 1) - log_ratio).mean()
            clipfrac = ((ratio - 1.0).abs() > clip_range).float().mean()
            stats = torch.stack((policy_loss, value_loss, entropy_loss, approx_kl, clipfrac)).detach()
        return loss, stats

    def _plain_step(self, *minibatch):
        """zero_grad, loss, backward, (all-reduce), clip, Adam step: one update in fp32 eager."""
        loss, stats = self._loss(*minibatch)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.strategy.all_reduce_gradients(self._params)  # no-op in a single process
        clip_grad_norm(self._params, self.config.max_grad_norm)
        self.optimizer.step()
        return loss.detach(), stats

