"""Soft Actor-Critic (Haarnoja et al., 2018) with automatic temperature tuning, all on the device.

A squashed Gaussian actor, twin critics held as one batched ensemble (one pass evaluates both), a Polyak-averaged
target ensemble, and the temperature alpha learnt towards a target entropy (-action_dim by default). Each gradient
step on a batch is the critics' step, then the actor's and the temperature's, the actor's gradient going through
the updated critics, as Stable-Baselines3 and CleanRL order them (the original implementation took one step of the
summed losses). Each is pure tensor work: nothing read back to the host, no host branching on tensor values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from rlspeed.accel.introspect import made_as
from rlspeed.algos.base import require
from rlspeed.algos.off_policy import (
    BATCH_FIELDS,
    OffPolicyAlgorithm,
    OffPolicyConfig,
    copy_statistics,
    polyak_update,
    statistics_pairs,
)
from rlspeed.algos.update import loss_owner, select_update
from rlspeed.errors import UserError
from rlspeed.fused.flat import linear_forward, sequential_linears
from rlspeed.fused.sac import FusedSACUpdate, unsupported_reason
from rlspeed.nn import (
    LOG_STD_MAX,
    LOG_STD_MIN,
    QEnsemble,
    SquashedGaussianActor,
    make_adam,
)
from rlspeed.sde import SDEConfig, SDESquashedGaussianActor, resample_due


@dataclass
class SACConfig(OffPolicyConfig, SDEConfig):
    """SAC hyperparameters (names follow Stable-Baselines3; defaults as docs/algorithms.md's tables give them, with
    SB3's where they differ; gSDE's: `SDEConfig`)."""

    learning_rate: float = 3e-4
    ent_coef: float | None = None  # the temperature alpha; None: tuned automatically towards target_entropy
    ent_coef_init: float = 1.0  # starting alpha when it is tuned
    target_entropy: float | None = None  # None: -action_dim
    n_critics: int = 2
    # hand-derived gradients + flat Adam (fused/) where the network allows; `rlspeed.algos.update.select_update`
    # decides (on CUDA: the autograd update as a whole-step graph instead; benchmarks/cuda_check.sh measures both)
    fused_update: bool = True
    use_sde_at_warmup: bool = False  # with use_sde: gSDE's actions instead of uniform ones before learning_starts
    log_std_init: float = -3.0  # gSDE's initial log sigma (SB3's SAC default; used only with use_sde)
    needs_sde: ClassVar[tuple[str, ...]] = (*SDEConfig.needs_sde, "use_sde_at_warmup", "log_std_init")

    def validate(self) -> None:
        """The `OffPolicyConfig` checks, plus SAC's own: entropy coefficient, its initial value, number of critics,
        gSDE's options."""
        super().validate()
        self.validate_sde()
        require(self.ent_coef is None or self.ent_coef >= 0,
                f"ent_coef must be >= 0, or null to tune it automatically, got {self.ent_coef}.")
        require(self.ent_coef_init > 0, f"ent_coef_init must be > 0, got {self.ent_coef_init}.")
        require(self.n_critics >= 1, f"n_critics must be >= 1, got {self.n_critics}.")


def _log(alpha: float) -> float:
    """log of an entropy coefficient; -inf for 0 (no entropy term)."""
    return math.log(alpha) if alpha > 0 else -math.inf


class SAC(OffPolicyAlgorithm):
    """Soft Actor-Critic for Box action spaces.

    >>> import gymnasium
    >>> from rlspeed import SAC
    >>> model = SAC("Pendulum-v1", seed=0).learn(20_000)
    >>> obs, _ = gymnasium.make("Pendulum-v1").reset(seed=0)
    >>> action, _ = model.predict(obs, deterministic=True)
    """

    name = "sac"
    config_cls = SACConfig
    config: SACConfig
    actor: SquashedGaussianActor | SDESquashedGaussianActor
    critic: QEnsemble
    #: (`_setup` makes the temperature from them: learnt or fixed, its start and its target)
    _built_settings = ("ent_coef", "ent_coef_init", "target_entropy")
    supports_discrete = False

    def _setup(self) -> None:
        if loss_owner(self, "_loss") is not None:  # (a subclass written for rlspeed before the two steps)
            raise UserError(f"{type(self).__name__} defines _loss, which SAC no longer calls: its update is two "
                            "steps, _critic_loss and then _actor_loss (through the updated critics); override those.")
        cfg, spec = self.config, self.spec
        obs_dim = spec.obs_dim
        # actor and critics each with their own encoder (SB3's share_features_extractor=False for SAC)
        if cfg.use_sde:
            actor = SDESquashedGaussianActor(obs_dim, spec.action_dim, cfg.net_arch, cfg.activation,
                                             encoder=self._make_encoder("actor"),
                                             log_std_init=cfg.log_std_init, full_std=cfg.full_std,
                                             use_expln=cfg.use_expln)
        else:
            actor = SquashedGaussianActor(obs_dim, spec.action_dim, cfg.net_arch, cfg.activation,
                                          encoder=self._make_encoder("actor"))
        self._place_actor_and_critics(actor)
        self.policy = self.actor
        self.autotune = cfg.ent_coef is None
        alpha = cfg.ent_coef_init if self.autotune else cfg.ent_coef
        self.log_alpha = torch.full((1,), _log(alpha), device=self.device)
        self.log_alpha.requires_grad_(self.autotune)
        self.target_entropy = -float(spec.action_dim) if cfg.target_entropy is None else cfg.target_entropy
        self._critic_params = list(self.critic.parameters())
        self._target_params = list(self.critic_target.parameters())
        self._target_statistics = statistics_pairs((self.critic_target, self.critic))
        # One Adam for actor, critics and temperature: their losses share no parameters (see `_update`); in each
        # step, the parameters without a gradient are left alone.
        self._params = [*self.actor.parameters(), *self._critic_params, *([self.log_alpha] if self.autotune else [])]
        self._setup_action_scaling()
        # (weights, biases, tanh?) of rlspeed's MLP actor for `_explore`'s kernel-by-kernel pass, while it is the
        # actor (a subclass's forward, or an actor a subclass's _setup puts in its place, is called as a module)
        own = made_as(self.actor) is SquashedGaussianActor and self.actor.encoder is None and not cfg.use_sde
        found = sequential_linears(self.actor.net) if own else None
        self._actor_linears = None if found is None else (
            [layer.weight for layer in found[0]], [layer.bias for layer in found[0]], found[1])
        self._actor_linears_of = self.actor

    def _take_built_setting(self, name: str, built, now) -> bool:
        # A fixed temperature set to another fixed value, and the target entropy, are taken in place (the update reads
        # log_alpha's memory and target_entropy at each step); a learnt temperature's start, or a switch between
        # learnt and fixed (another optimiser), only by a new or loaded model.
        if name == "ent_coef" and built is not None and now is not None:
            with torch.no_grad():
                self.log_alpha.fill_(_log(now))
            return True
        if name == "target_entropy":
            self.target_entropy = -float(self.spec.action_dim) if now is None else now
            return True
        return False

    _optimizer_attributes = ("optimizer", "_update_step", "_actor_step")

    def _setup_optimizer(self) -> None:
        self.optimizer = make_adam(self._params, self.config.learning_rate, self.device, eps=self.config.adam_eps)
        self._update_step = self._make_update_step()

    def _make_update_step(self):
        """The critics' step (the hand-derived update: the whole update, both steps and the Polyak step); with
        autograd, `_actor_step` is the actor's and temperature's step after it (else None)."""
        step = select_update(self, loss_fn=self._critic_loss, optimizer=self.optimizer, params=self._params,
                             max_grad_norm=None, name="sac", reference_cls=SAC,
                             reference_methods=("_critic_loss", "_actor_loss"),
                             unsupported=unsupported_reason(self.actor, self.critic),
                             hand_derived=lambda: FusedSACUpdate(self, strategy=self.strategy), updates_targets=True)
        self._actor_step = None if step.hand_derived is not None else select_update(
            self, loss_fn=self._actor_loss, optimizer=self.optimizer, params=self._params, max_grad_norm=None,
            name="sac-actor")
        return step

    def _modules(self):
        # A fixed entropy coefficient is the config's (one given to `load` included): `_setup` sets log_alpha from
        # it, so only a learnt temperature is saved and restored (a fixed 0 would be log 0 = -inf in the file).
        modules = {"actor": self.actor, "critic": self.critic, "critic_target": self.critic_target}
        return {**modules, "log_alpha": self.log_alpha} if self.autotune else modules

    def _optimizers(self):
        return {"optimizer": self.optimizer}

    def _further_update_steps(self):
        return {} if self._actor_step is None else {"actor_step": self._actor_step}

    def _policy_actions(self, obs: torch.Tensor, deterministic: bool) -> torch.Tensor:
        actions = self.actor.deterministic(obs) if deterministic else self.actor.sample(obs)[0]
        return self._to_env(actions)

    @property
    def _policy_at_warmup(self) -> bool:
        return self.config.use_sde and self.config.use_sde_at_warmup

    def _explore(self, obs: torch.Tensor, timesteps: int) -> torch.Tensor:
        # A sample without its log-probability. It runs once per env step, right after an update has pushed the
        # policy out of the caches: an MLP actor runs as its addmm/activation kernels, without module calls.
        if self.config.use_sde:
            # gSDE: new matrices at the start of each collection (train_freq steps) and every sde_sample_freq steps,
            # and where exploring starts after uniform warm-up steps of this collection (SB3 drew them at its start)
            cfg, global_envs = self.config, self._envs_all_ranks
            step = (timesteps - self.num_timesteps) // global_envs
            after_uniform = timesteps - global_envs < self._uniform_until and not self._policy_at_warmup
            if resample_due(step, cfg.sde_sample_freq) or after_uniform:
                self.actor.sde.resample(self._env.num_envs)
            mean, latent = self.actor(obs)
            return torch.tanh(mean + self.actor.sde.noise(latent))
        if self._actor_linears is None or self._actor_linears_of is not self.actor:
            mean, log_std = self.actor(obs)
            return torch.tanh(mean + log_std.exp() * torch.randn_like(mean))
        mean, log_std = linear_forward(obs.flatten(1), *self._actor_linears)[-1].chunk(2, dim=-1)
        std = log_std.clamp_(LOG_STD_MIN, LOG_STD_MAX).exp_()
        # (noise drawn row-major whatever the head's layout: the numbers the module path's randn_like draws)
        noise = torch.randn(mean.shape, dtype=mean.dtype, device=mean.device)
        return torch.addcmul(mean, std, noise).tanh_()

    def _update(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        fields = [batch[field] for field in BATCH_FIELDS]
        # gSDE: one exploration matrix for this batch, drawn anew each update (SB3), for a' and a~ alike: its N(0, 1)
        # numbers go to both steps, each making sigma * numbers (the actor's step with its gradient to log_std)
        standard = [self.actor.sde.standard_draw()] if self.config.use_sde else []
        _, metrics = self._update_step(*fields, *standard)
        if self._actor_step is not None:
            metrics = {**metrics, **self._actor_step(fields[0], *standard)[1]}
        if not self._update_step.updates_targets:
            polyak_update(self._target_params, self._critic_params, self.config.tau)
        copy_statistics(self._target_statistics)
        return metrics

    def _critic_loss(self, obs: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor, next_obs: torch.Tensor,
                     terminated: torch.Tensor, discounts: torch.Tensor, *standard: torch.Tensor
                     ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The critics' loss of one replay batch (`standard`: gSDE's N(0, 1) numbers of the batch, if any)."""
        alpha = self.log_alpha.detach().exp()
        # Soft Bellman target with clipped double Q, a' ~ pi(.|s'):
        #   y = r + gamma^m (1 - d) (min_k Q_target_k(s', a') - alpha log pi(a'|s'))
        with torch.no_grad():
            noise = [self.actor.sde.draw(*standard)] if standard else []
            next_actions, next_log_pi = self.actor.sample(next_obs, *noise)
            next_q = self.critic_target(next_obs, next_actions).amin(0)
            target_q = rewards + discounts * (1 - terminated) * (next_q - alpha * next_log_pi)

        # J_Q = 1/2 sum_k E[(Q_k(s, a) - y)^2], all K critics in one batched pass.
        q_values = self.critic(obs, actions)  # [K, B]
        critic_loss = 0.5 * (q_values - target_q).square().mean(1).sum()
        return critic_loss, {"critic_loss": critic_loss.detach(), "q_values": q_values.detach().mean()}

    def _actor_loss(self, obs: torch.Tensor, *standard: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The actor's loss and the temperature's, summed (they share no parameter), after the critics' step:
        J_pi = E[alpha log pi(a~|s) - min_k Q_k(s, a~)], a~ reparameterised from pi(.|s), the critics' weights (and
        encoder) constants, so it reaches only the actor; J(alpha) = E[-log alpha (log pi(a~|s) + target_entropy)].
        `standard`: as `_critic_loss`'s (gSDE's matrix from them, with its gradient to log_std)."""
        alpha = self.log_alpha.detach().exp()
        noise = [self.actor.sde.draw(*standard)] if standard else []
        pi_actions, log_pi = self.actor.sample(obs, *noise)
        with torch.no_grad():
            features = self.critic.features(obs)
        q_pi = self.critic.head(features, pi_actions, detached=True).amin(0)
        actor_loss = (alpha * log_pi - q_pi).mean()
        loss = actor_loss
        if self.autotune:
            loss = loss - (self.log_alpha * (log_pi.detach() + self.target_entropy)).mean()
        return loss, {"actor_loss": actor_loss.detach(), "alpha": alpha[0], "entropy": -log_pi.detach().mean()}
