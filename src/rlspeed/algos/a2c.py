"""Advantage Actor-Critic (Mnih et al., 2016, synchronous form) as Stable-Baselines3 defines it, on the device.

Short rollouts (`num_steps=5` per env), advantages from GAE (lambda 1 by default: n-step returns), then one
gradient step on the whole rollout: no epochs, no minibatches, no ratio clipping. RMSprop by default, as SB3.

    L = -mean(A log pi(a|s)) - c_ent mean(H(pi(.|s))) + c_vf mean((V(s) - R)^2)

The value loss is SB3's full mean squared error (PPO's here is CleanRL's 0.5 * MSE), so SB3's `vf_coef` carries over
unchanged. The rollout, GAE, schedules and normalisation are `OnPolicyAlgorithm`'s. Where the hand-derived update
runs (`rlspeed.fused.a2c`, chosen by `select_update`), the rollout's forward passes use its flat parameters too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from rlspeed.algos.base import require
from rlspeed.algos.on_policy import OnPolicyAlgorithm, OnPolicyConfig
from rlspeed.algos.update import select_update
from rlspeed.buffers import RolloutBuffer
from rlspeed.envs.base import map_obs
from rlspeed.fused.a2c import FusedA2CUpdate
from rlspeed.fused.ppo import unsupported_reason


@dataclass
class A2CConfig(OnPolicyConfig):
    """A2C hyperparameters; names follow Stable-Baselines3's A2C (the shared ones: `OnPolicyConfig`), defaults as
    docs/algorithms.md's tables give them, with SB3's where they differ."""

    num_steps: int = 5
    learning_rate: float = 7e-4
    anneal_lr: bool = False  # SB3's A2C keeps its learning rate constant unless given a schedule
    gae_lambda: float = 1.0
    normalize_advantage: bool = False
    use_rms_prop: bool = True  # RMSprop (alpha 0.99, eps rms_prop_eps) as SB3; False: Adam
    rms_prop_eps: float = 1e-5
    fused_update: bool = True  # hand-derived gradient + flat RMSprop (rlspeed/fused/a2c.py) where the network allows

    #: options of other algorithms a user may bring along, with what to do instead
    refused: ClassVar[dict[str, str]] = {
        "batch_size": "A2C updates once on the whole rollout (num_envs * num_steps rows), without minibatches: drop "
                      "batch_size, or use ppo",
        "n_epochs": "A2C makes one update per rollout: drop n_epochs, or use ppo",
        "clip_range": "A2C has no ratio clipping: drop clip_range, or use ppo",
    }

    def validate(self) -> None:
        """The `OnPolicyConfig` checks (gSDE's included), plus RMSprop's epsilon."""
        super().validate()
        require(self.rms_prop_eps > 0, f"rms_prop_eps must be > 0, got {self.rms_prop_eps}.")


class A2C(OnPolicyAlgorithm):
    """A2C for Discrete, MultiDiscrete, MultiBinary and Box action spaces, with the env's action masks where it has
    them (unless `use_masking=False`).

    >>> import gymnasium
    >>> from rlspeed import A2C
    >>> model = A2C("CartPole-v1", seed=0).learn(100_000)
    >>> obs, _ = gymnasium.make("CartPole-v1").reset(seed=0)
    >>> action, _ = model.predict(obs, deterministic=True)
    """

    name = "a2c"
    config_cls = A2CConfig
    config: A2CConfig

    def _make_optimizer(self, params: list[torch.Tensor]) -> torch.optim.Optimizer:
        cfg = self.config
        if cfg.use_rms_prop:
            return torch.optim.RMSprop(params, lr=cfg.learning_rate, alpha=0.99, eps=cfg.rms_prop_eps)
        return super()._make_optimizer(params)

    def _make_update_step(self):
        cfg = self.config
        return select_update(
            self, loss_fn=self._loss, optimizer=self.optimizer, params=self._params, max_grad_norm=cfg.max_grad_norm,
            name=self.name, reference_cls=A2C, unsupported=unsupported_reason(self.policy, self._masking),
            hand_derived=lambda: FusedA2CUpdate(self.policy, self.optimizer, max_grad_norm=cfg.max_grad_norm,
                                                vf_coef=cfg.vf_coef, ent_coef=cfg.ent_coef,
                                                normalize_advantage=cfg.normalize_advantage, strategy=self.strategy),
            optimizers=(torch.optim.RMSprop, torch.optim.Adam))

    def _flat_forward(self) -> FusedA2CUpdate | None:
        """The hand-derived update whose flat parameters the rollout's forward passes may use: when it runs, with
        `--accelerate off`, and on a CPU with `auto` too (the flat forward is the fastest form there: the policy
        module's measured forms, eager fp32 at best for these small networks, ran its rollouts 1.1-1.4x slower than
        `off`'s, and with other random draws). Elsewhere `auto` measures the policy module's forward instead."""
        update = self._update_step.hand_derived
        return update if self.accelerate == "off" or self.device.type == "cpu" else None

    def _rollout_forward(self) -> str:
        return ("hand-derived (the update's flat parameters, Gumbel-max or scaled-normal draws)"
                if self._flat_forward() is not None else "policy module")

    def update_summary(self) -> dict[str, str]:
        """`Algorithm.update_summary`, plus `rollout`: which forward passes the rollout samples its actions and values
        with (they follow from the update's choice: the hand-derived update's flat parameters where it runs with
        `--accelerate off`, else the policy module)."""
        return {**super().update_summary(), "rollout": self._rollout_forward()}

    def report(self) -> str:
        """`Algorithm.report`, plus the rollout's forward passes (`update_summary`'s `rollout`)."""
        return f"{super().report()}\n{self.name} rollout: {self._rollout_forward()}"

    def _act(self, obs, step, action_masks=None):
        update = self._flat_forward()
        if update is None:  # (gSDE among others: the flat forward never runs with it)
            return super()._act(obs, step, action_masks)
        # (unmasked: the hand-derived update gives way to autograd under masks)
        if step == 0:  # the rollout's random draws at once; A2C stores no log-probabilities (its loss recomputes them)
            # (one view per step, made once: indexing a tuple costs no dispatch)
            self._rollout_noise = update.rollout_noise(self.config.num_steps, obs.shape[0]).unbind(0)
            self._no_log_probs = torch.zeros(obs.shape[0], device=self.device)
        actions, values = update.act(obs if obs.dim() == 2 else obs.flatten(1), self._rollout_noise[step])
        return actions, self._no_log_probs, values

    def _next_values(self, buf: RolloutBuffer) -> torch.Tensor:
        update = self._flat_forward()
        if update is not None and buf.next_obs is not None:
            return update.value(buf.next_obs.flatten(2).flatten(0, 1)).view_as(buf.values)
        return super()._next_values(buf)

    def _update_rollout(self, buf: RolloutBuffer, advantages: torch.Tensor,
                        returns: torch.Tensor) -> dict[str, torch.Tensor]:
        obs = (buf.obs.flatten(2).flatten(0, 1) if self.policy.encoder is None
               else map_obs(lambda v: v.flatten(0, 1), buf.obs))
        masks = () if buf.action_masks is None else (buf.action_masks.flatten(0, 1),)
        hand_derived = getattr(self._update_step, "hand_derived", None)  # (None also where a caller wrapped the step)
        if hand_derived is not None:
            hand_derived.follow(self.config)  # (coefficients a callback may have changed)
        _, stats = self._update_step(obs, buf.actions.flatten(0, 1),
                                     advantages.flatten(), returns.flatten(), *masks)
        self._n_updates += 1
        return {"policy_loss": stats[0], "value_loss": stats[1], "entropy": stats[2]}

    def _loss(self, obs, actions, advantages, returns, action_masks=None):
        """The A2C loss of the whole rollout: (loss, [policy loss, value loss, entropy]); `action_masks` as in the
        rollout."""
        cfg = self.config
        log_probs, entropy, values = self.policy.evaluate(obs, actions, action_masks)
        if cfg.normalize_advantage and advantages.shape[0] > 1:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        policy_loss = -(advantages * log_probs).mean()
        value_loss = (returns - values).square().mean()
        entropy_mean = entropy.mean()
        loss = policy_loss - cfg.ent_coef * entropy_mean + cfg.vf_coef * value_loss
        return loss, torch.stack((policy_loss, value_loss, entropy_mean)).detach()
