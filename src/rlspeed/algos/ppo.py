"""Proximal Policy Optimization (Schulman et al., 2017) with the rollout, GAE and update on the device.

Readable top to bottom: collect `num_steps` steps from `num_envs` envs into preallocated storage, compute GAE in
one vectorised pass (truncated episodes bootstrapped from `final_obs`), then `n_epochs` passes of clipped-objective
minibatch updates. No host sync inside; metrics are device tensors read once per log interval.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlspeed.algos.base import require
from rlspeed.algos.on_policy import OnPolicyAlgorithm, OnPolicyConfig
from rlspeed.algos.update import select_update
from rlspeed.buffers import RolloutBuffer
from rlspeed.envs.base import map_obs
from rlspeed.errors import UserError, in_words
from rlspeed.fused.ppo import FusedPPOUpdate, unsupported_reason

#: The most passes over a rollout per iteration that PPO's config accepts (`PPOConfig.validate`): a thousand times
#: Stable-Baselines3's default of 10; a count no iteration could finish is refused in one sentence, not run silently
MAX_EPOCHS = 10_000


@dataclass
class PPOConfig(OnPolicyConfig):
    """PPO hyperparameters (names follow Stable-Baselines3 where it has one; the shared ones: `OnPolicyConfig`).

    The value loss follows CleanRL and the original implementation, not SB3: it is 0.5 * MSE, so `vf_coef` weighs
    it half as much as SB3's `vf_coef` does (vf_coef=1.0 here is SB3's 0.5), and with `clip_range_vf` it takes the
    larger of the clipped and unclipped errors (SB3 takes the clipped one).
    """

    batch_size: int = 256  # minibatch size
    n_epochs: int = 10
    clip_range: float = 0.2
    anneal_clip: bool = False  # linear decay of clip_range to 0
    clip_range_vf: float | None = None  # value clipping (off by default)
    # early stop: an update's epochs end once a minibatch's approx_kl exceeds 1.5 * target_kl (SB3's rule)
    target_kl: float | None = None
    fused_update: bool = True  # hand-derived gradient + flat Adam (rlspeed/fused/ppo.py) where the network allows

    def validate(self) -> None:
        """The `OnPolicyConfig` checks, plus PPO's own.

        `batch_size` must divide `num_envs * num_steps` or be at least that (then one minibatch is the whole rollout).
        """
        super().validate()
        require(self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}.")
        require(self.n_epochs >= 1, f"n_epochs must be >= 1, got {self.n_epochs}.")
        require(self.n_epochs <= MAX_EPOCHS, f"n_epochs must be at most {MAX_EPOCHS:,} (passes over each rollout "
                f"per iteration; Stable-Baselines3's default is 10), got {self.n_epochs:,}.")
        require(self.clip_range > 0, f"clip_range must be > 0, got {self.clip_range}.")
        require(self.clip_range_vf is None or self.clip_range_vf > 0,
                f"clip_range_vf must be > 0, or null for no value clipping, got {self.clip_range_vf}.")
        require(self.target_kl is None or self.target_kl > 0,
                f"target_kl must be > 0, or null for no early stop, got {self.target_kl}.")
        self._check_batch_size(self.num_envs * self.num_steps)

    def check_processes(self, processes: int) -> None:
        """The `batch_size` rules for `processes` processes that share every minibatch (torchrun, `--nproc`), checked
        before `validate` by `build_config` and again by the model: a size that does not split over them is refused
        naming the nearest sizes valid under every rule (one process's and the processes')."""
        if self.batch_size >= 1 and self.num_envs >= 1 and self.num_steps >= 1:
            self._check_batch_size(self.num_envs * self.num_steps, processes)

    def _check_batch_size(self, rollout: int, processes: int = 1) -> None:
        """Refuse a `batch_size` that does not divide the rollout of `rollout` steps, or (below the rollout) is no
        multiple of the number of `processes`, naming the nearest sizes that pass both (a subclass with a stricter
        rule overrides it, so that one sentence names the sizes valid under every rule)."""
        def works(size: int) -> bool:  # (the whole rollout, one minibatch, each process taking its own share)
            return size >= rollout or (rollout % size == 0 and size % processes == 0)

        if works(self.batch_size):
            return
        # (the default 256 with a vector env of 3, 5 or 7 envs: the sentence names the sizes that fit)
        would = _nearest_sizes(self.batch_size, rollout, works)
        split = (f"be a multiple of the number of processes ({processes}), each process taking an equal share of "
                 "every minibatch")
        if rollout % self.batch_size == 0:
            raise UserError(f"batch_size ({self.batch_size}) must {split}: {would} would do.")
        raise UserError(f"batch_size ({self.batch_size}) must divide num_envs * num_steps ({rollout})"
                        f"{' and ' + split if processes > 1 else ''}: {would} would do.")


def _nearest_sizes(batch_size: int, rollout: int, works: Callable[[int], bool]) -> str:
    """"batch_size=B or A" ("--set batch_size=B or A" where the command line runs, `in_words`): the nearest sizes
    below and above `batch_size` for which `works` holds (the whole rollout, which always does, at the most), as the
    sentences refusing a batch_size name them."""
    below = next((size for size in range(batch_size - 1, 0, -1) if works(size)), None)
    above = next(size for size in range(batch_size + 1, rollout + 1) if works(size))
    sizes = f"batch_size={above}" if below is None else f"batch_size={below} or {above}"
    return in_words(f"--set {sizes}", sizes)


class PPO(OnPolicyAlgorithm):
    """PPO for Discrete, MultiDiscrete, MultiBinary and Box action spaces (action masks as sb3-contrib's
    `MaskablePPO`: used when the env gives them, unless `use_masking=False`), with any observation space an encoder
    takes (`rlspeed.nn.make_encoder`: vectors, images, Dict, Discrete).

    >>> import gymnasium
    >>> from rlspeed import PPO
    >>> model = PPO("CartPole-v1", seed=0).learn(100_000)
    >>> obs, _ = gymnasium.make("CartPole-v1").reset(seed=0)
    >>> action, _ = model.predict(obs, deterministic=True)
    """

    name = "ppo"
    config_cls = PPOConfig
    config: PPOConfig

    def _setup(self) -> None:
        # each rank takes minibatches of batch_size / world rows from its share of the rollout (a config changed since
        # it was built is checked here too)
        self.config.check_processes(self.strategy.world_size)
        super()._setup()

    def _make_update_step(self):
        cfg = self.config
        return select_update(
            self, loss_fn=self._loss, optimizer=self.optimizer, params=self._params, max_grad_norm=cfg.max_grad_norm,
            name=self.name, reference_cls=PPO, unsupported=unsupported_reason(self.policy, self._masking),
            hand_derived=lambda: FusedPPOUpdate(self.policy, self.optimizer, max_grad_norm=cfg.max_grad_norm,
                                                vf_coef=cfg.vf_coef, ent_coef=cfg.ent_coef,
                                                clip_range_vf=cfg.clip_range_vf,
                                                normalize_advantage=cfg.normalize_advantage, strategy=self.strategy))

    def _update_rollout(self, buf: RolloutBuffer, advantages: torch.Tensor,
                        returns: torch.Tensor) -> dict[str, torch.Tensor]:
        cfg, scheduled = self.config, self._schedule_values  # (schedule functions' values: `_call_schedules`)
        clip_range = cfg.clip_range * self._progress_remaining() if cfg.anneal_clip else cfg.clip_range
        clip_range = scheduled.get("clip_range", clip_range)
        # a scheduled clip_range_vf is the config's during these updates (which read it there, as a callback's
        # change), its start value again after them; held as one device tensor filled in place, as a scheduled
        # learning rate is: a captured whole-step graph reads it from its memory (a float would stay the value at
        # capture) and a compiled step does not specialise on it
        held_clip_range_vf = cfg.clip_range_vf
        if "clip_range_vf" in scheduled:
            device, held = self.__dict__.get("_clip_range_vf_held", (None, None))
            if device != self.device:  # (made once per device: "cuda" and its tensors' "cuda:0" compare unequal)
                held = torch.zeros((), device=self.device)
                self._clip_range_vf_held = (self.device, held)
            cfg.clip_range_vf = held.fill_(scheduled["clip_range_vf"])
        try:
            hand_derived = getattr(self._update_step, "hand_derived", None)  # (None also where a caller wrapped it)
            if hand_derived is not None:
                hand_derived.follow(cfg)  # (coefficients a callback may have changed)
            stats = self._update_epochs(buf, advantages, returns, clip_range)
        finally:
            cfg.clip_range_vf = held_clip_range_vf
        return {"policy_loss": stats[0], "value_loss": stats[1], "entropy": stats[2], "approx_kl": stats[3],
                "clipfrac": stats[4]}

    def _update_epochs(self, buf: RolloutBuffer, advantages: torch.Tensor, returns: torch.Tensor,
                       clip_range: float) -> torch.Tensor:
        """n_epochs of clipped-objective updates over shuffled minibatches of the rollout; returns the mean
        [policy loss, value loss, entropy, approx_kl, clipfrac] of the updates that reported them."""
        cfg = self.config
        # float vectors flattened whole (what the hand-derived update takes); other observations keep their shape and
        # dtype (uint8 images stay uint8: minibatches gather bytes, the encoder converts them)
        batch_obs = (buf.obs.flatten(2).flatten(0, 1) if self.policy.encoder is None
                     else map_obs(lambda v: v.flatten(0, 1), buf.obs))
        batch_actions = buf.actions.flatten(0, 1)
        batch_log_probs = buf.log_probs.flatten()
        batch_values = buf.values.flatten()
        batch_advantages = advantages.flatten()
        batch_returns = returns.flatten()
        batch_masks = buf.action_masks.flatten(0, 1) if buf.action_masks is not None else None
        batch_size = batch_log_probs.shape[0]
        # Data-parallel: each rank holds 1/world of the batch, so its minibatches are 1/world as large.
        minibatch = min(max(cfg.batch_size // self.strategy.world_size, 1), batch_size)
        stats = torch.zeros(5, device=self.device)  # policy loss, value loss, entropy, approx_kl, clipfrac
        updates = 0
        clip = torch.full((), clip_range, device=self.device)  # a tensor: a compiled step must not specialise on it
        # One minibatch covering the whole batch: the hand-derived update takes its advantages normalised once, not in
        # every epoch (the autograd loss, rlspeed's or a subclass's `_loss`, always gets them as GAE made them)
        normalized = (cfg.normalize_advantage and minibatch == batch_size > 1
                      and getattr(self._update_step, "hand_derived", None) is not None)
        if normalized:
            batch_advantages = (batch_advantages - batch_advantages.mean()) / (batch_advantages.std() + 1e-8)
        stopped = False
        for epoch in range(cfg.n_epochs):
            # One minibatch covering the whole batch needs no shuffle: its gradient does not depend on order.
            order = torch.randperm(batch_size, device=self.device) if minibatch < batch_size else None
            # The logged statistics are the last epoch's (with target_kl: the last that ran), whichever implementation
            # runs; hints it may use (the hand-derived one does): advantages already normalised, statistics wanted
            # (fewer kernels without).
            last_epoch = epoch == cfg.n_epochs - 1 or cfg.target_kl is not None
            if cfg.target_kl is not None:
                stats.zero_()
                updates = 0
            hints = {"normalized": normalized, "with_stats": last_epoch}
            for start in range(0, batch_size - minibatch + 1, minibatch):
                index = order[start:start + minibatch] if order is not None else slice(None)
                minibatch_obs = batch_obs[index] if isinstance(batch_obs, torch.Tensor) else {
                    key: value[index] for key, value in batch_obs.items()}
                # (the masks, when the run has them, go last: only the autograd reference takes them)
                masks = () if batch_masks is None else (batch_masks[index],)
                _, minibatch_stats = self._update_step(minibatch_obs, batch_actions[index], batch_log_probs[index],
                                                       batch_values[index], batch_advantages[index],
                                                       batch_returns[index], clip, *masks, **hints)
                self._n_updates += 1
                if minibatch_stats is not None and last_epoch:
                    stats += minibatch_stats
                    updates += 1
                if cfg.target_kl is not None and minibatch_stats is not None and self._kl_exceeded(minibatch_stats):
                    stopped = True
                    break
            if stopped:
                break
        return stats / max(updates, 1)

    def _kl_exceeded(self, minibatch_stats: torch.Tensor) -> bool:
        """`target_kl`'s early stop, SB3's rule: the minibatch's approx_kl (measured before its step) above 1.5 *
        target_kl ends the update's epochs. SB3 leaves that minibatch's step out; here it has been taken. One host
        read per minibatch; several processes decide on their mean, so all stop at the same minibatch."""
        kl = minibatch_stats[3]
        if self.strategy.world_size > 1:
            kl = self.strategy.all_reduce_sum(kl.clone()) / self.strategy.world_size
        return bool(kl > 1.5 * self.config.target_kl)  # ok-sync: only with target_kl set

    def _loss(self, obs, actions, old_log_probs, old_values, advantages, returns, clip_range, action_masks=None):
        """The PPO loss of one minibatch: (loss, [policy loss, value loss, entropy, approx_kl, clipfrac]).
        `action_masks`: the masks the actions were sampled under (log-probs and entropy over the allowed actions)."""
        cfg = self.config
        new_log_probs, entropy, new_values = self.policy.evaluate(obs, actions, action_masks)
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
