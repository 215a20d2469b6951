"""Twin Delayed DDPG (Fujimoto et al., 2018), all on the device.

A deterministic tanh actor explored with Gaussian or Ornstein-Uhlenbeck noise; twin critics held as one batched
ensemble with clipped double-Q targets; target policy smoothing (clipped noise on the target action); the actor and
the target networks updated every `policy_delay` critic updates. As in the original implementation (and
Stable-Baselines3), the actor's step follows the critics' step of the same batch: its gradient goes through the
critics as they have just been updated. DDPG is this algorithm with one critic, no delay and no smoothing (see
`ddpg.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from rlspeed.algos.base import require
from rlspeed.algos.off_policy import (
    BATCH_FIELDS,
    OffPolicyAlgorithm,
    OffPolicyConfig,
    copy_statistics,
    frozen_copy,
    polyak_update,
    statistics_pairs,
)
from rlspeed.algos.update import select_update
from rlspeed.envs import BatchedEnv
from rlspeed.nn import DeterministicActor, QEnsemble, make_adam

ACTION_NOISES = ("normal", "ornstein-uhlenbeck", "none")


@dataclass
class TD3Config(OffPolicyConfig):
    """TD3 hyperparameters (names follow Stable-Baselines3; defaults as docs/algorithms.md's tables give them, with
    SB3's where they differ: normal action noise, orthogonal initialisation, Adam's epsilon)."""

    learning_rate: float = 1e-3
    net_arch: tuple[int, ...] = (400, 300)
    n_critics: int = 2
    policy_delay: int = 2  # critic updates per actor (and target) update
    target_policy_noise: float = 0.2  # std of the smoothing noise on target actions (policy space, [-1, 1])
    target_noise_clip: float = 0.5
    action_noise: str = "normal"  # exploration noise: normal, ornstein-uhlenbeck or none
    action_noise_std: float = 0.1  # its std (sigma), in policy space
    ou_theta: float = 0.15  # Ornstein-Uhlenbeck mean reversion rate
    ou_dt: float = 1e-2  # Ornstein-Uhlenbeck time step

    def validate(self) -> None:
        """The `OffPolicyConfig` checks, plus TD3's own: critics, policy delay, target and exploration noise."""
        super().validate()
        require(self.n_critics >= 1, f"n_critics must be >= 1, got {self.n_critics}.")
        require(self.policy_delay >= 1, f"policy_delay must be >= 1, got {self.policy_delay}.")
        require(self.target_policy_noise >= 0, f"target_policy_noise must be >= 0, got {self.target_policy_noise}.")
        require(self.target_noise_clip >= 0, f"target_noise_clip must be >= 0, got {self.target_noise_clip}.")
        noise = str(self.action_noise).partition("(")[0]  # (a Stable-Baselines3 noise object, as its repr)
        vectorized = noise == "VecNoise"  # (VectorizedActionNoise's repr)
        require(not (vectorized or noise.endswith("ActionNoise")),
                f"action_noise takes a name, or Stable-Baselines3's NormalActionNoise or "
                f"OrnsteinUhlenbeckActionNoise of mean 0 with one sigma for every action dimension (and no "
                f"initial_noise), not this {'VectorizedActionNoise' if vectorized else noise} object: "
                f"action_noise='normal' (or 'ornstein-uhlenbeck') with action_noise_std=its sigma (one value for "
                f"every action dimension)" + ("; every env draws its own noise." if vectorized else "."))
        require(self.action_noise in ACTION_NOISES,
                f"action_noise must be one of {', '.join(ACTION_NOISES)}, got '{self.action_noise}'.")
        require(self.action_noise_std >= 0, f"action_noise_std must be >= 0, got {self.action_noise_std}.")
        require(self.ou_theta >= 0 and self.ou_dt > 0, "ou_theta must be >= 0 and ou_dt > 0.")


class TD3(OffPolicyAlgorithm):
    """TD3 for Box action spaces.

    >>> import gymnasium
    >>> from rlspeed import TD3
    >>> model = TD3("Pendulum-v1", seed=0).learn(20_000)
    >>> obs, _ = gymnasium.make("Pendulum-v1").reset(seed=0)
    >>> action, _ = model.predict(obs, deterministic=True)
    """

    name = "td3"
    config_cls = TD3Config
    config: TD3Config
    actor: DeterministicActor
    critic: QEnsemble
    supports_discrete = False

    def _setup(self) -> None:
        cfg, spec = self.config, self.spec
        obs_dim = spec.obs_dim
        # actor and critics each with their own encoder (SB3's share_features_extractor=False for TD3)
        self._place_actor_and_critics(DeterministicActor(obs_dim, spec.action_dim, cfg.net_arch, cfg.activation,
                                                         encoder=self._make_encoder("actor")))
        self.actor_target = frozen_copy(self.actor, self, ("actor", "actor_target"))
        self.policy = self.actor
        self._critic_params = list(self.critic.parameters())
        # Actor and critic targets move together: one fused Polyak update for both.
        self._online_params = [*self.actor.parameters(), *self._critic_params]
        self._target_params = [*self.actor_target.parameters(), *self.critic_target.parameters()]
        self._target_statistics = statistics_pairs((self.actor_target, self.actor), (self.critic_target, self.critic))
        # One Adam for actor and critics: their losses share no parameters (see `_update`); in the critics' step
        # the actor has no gradients and Adam leaves it (and its moment estimates) alone, and the other way round.
        self._critic_updates = 0
        self._ou_noise: torch.Tensor | None = None
        self._setup_action_scaling()

    _optimizer_attributes = ("optimizer", "_update_step", "_actor_step")
    _optimized_parameters = "_online_params"

    def _setup_optimizer(self) -> None:
        self.optimizer = make_adam(self._online_params, self.config.learning_rate, self.device,
                                   eps=self.config.adam_eps)
        self._update_step = self._make_update_step()

    def _make_update_step(self):
        """The critics' step (`select_update`); `_actor_step` is the actor's after it."""
        critic_step = select_update(self, loss_fn=self._critic_loss, optimizer=self.optimizer,
                                    params=self._online_params, max_grad_norm=None, name=self.name)
        self._actor_step = select_update(self, loss_fn=self._actor_loss, optimizer=self.optimizer,
                                         params=self._online_params, max_grad_norm=None, name=f"{self.name}-actor")
        return critic_step

    def _modules(self):
        return {"actor": self.actor, "critic": self.critic, "actor_target": self.actor_target,
                "critic_target": self.critic_target}

    def _optimizers(self):
        return {"optimizer": self.optimizer}

    def _further_update_steps(self):
        return {"actor_step": self._actor_step}

    def _policy_actions(self, obs: torch.Tensor, deterministic: bool) -> torch.Tensor:
        # Not deterministic (predict, evaluate): the actor plus Gaussian noise of action_noise_std, stateless. The
        # Ornstein-Uhlenbeck process belongs to the training envs' episodes; a predict call (from a callback, on
        # another batch size) must not advance or reshape it.
        actions = self.actor(obs)
        if not deterministic and self.config.action_noise != "none":
            actions = self._normal_noise(actions).clamp(-1.0, 1.0)
        return self._to_env(actions)

    # --- exploration ------------------------------------------------------------------------------------------
    def _start(self, env: BatchedEnv, total_timesteps: int) -> None:
        super()._start(env, total_timesteps)
        if self._ou_noise is None or self._ou_noise.shape[0] != env.num_envs:
            self._ou_noise = torch.zeros(env.num_envs, self.spec.action_dim, device=self.device)

    def _on_env_reset(self) -> None:
        super()._on_env_reset()
        if self._ou_noise is not None:  # each episode starts its noise process afresh
            self._ou_noise.zero_()

    def _algorithm_state(self):
        tensors, values = super()._algorithm_state()
        values["critic_updates"] = self._critic_updates  # where the policy delay stands
        if self._ou_noise is not None:
            tensors["ou_noise"] = self._ou_noise
        return tensors, values

    def _load_algorithm_state(self, tensors: dict[str, torch.Tensor], values: dict) -> None:
        super()._load_algorithm_state(tensors, values)
        self._critic_updates = int(values.get("critic_updates", self._critic_updates))
        # The Ornstein-Uhlenbeck noise is per episode in progress: it carries over only with the episodes
        # (`_episodes_restored`); fresh episodes (a reset after resume) start it from 0, as a reset does.
        noise = tensors.get("ou_noise")
        if (noise is not None and self._ou_noise is not None and noise.shape == self._ou_noise.shape
                and self._episodes_restored):
            self._ou_noise.copy_(noise)

    def _explore(self, obs: torch.Tensor, timesteps: int) -> torch.Tensor:
        cfg = self.config
        actions = self.actor(obs)
        if cfg.action_noise == "normal":
            actions = self._normal_noise(actions)
        elif cfg.action_noise == "ornstein-uhlenbeck":
            if self._ou_noise is None or self._ou_noise.shape != actions.shape:
                self._ou_noise = torch.zeros_like(actions)
            # dx = -theta x dt + sigma sqrt(dt) dW: temporally correlated noise around 0
            self._ou_noise += (-cfg.ou_theta * cfg.ou_dt * self._ou_noise
                               + cfg.action_noise_std * math.sqrt(cfg.ou_dt) * torch.randn_like(actions))
            actions = actions + self._ou_noise
        return actions.clamp(-1.0, 1.0)

    def _normal_noise(self, actions: torch.Tensor) -> torch.Tensor:
        """`actions` plus independent Gaussian noise of `action_noise_std` (not clamped)."""
        return actions + self.config.action_noise_std * torch.randn_like(actions)

    def _on_dones(self, dones: torch.Tensor) -> None:
        if self.config.action_noise == "ornstein-uhlenbeck":  # each episode starts its noise process afresh
            self._ou_noise.masked_fill_(dones.unsqueeze(-1), 0.0)

    # --- one gradient step ------------------------------------------------------------------------------------
    def _update(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        # Delayed policy updates: the critics learn on every step; every policy_delay steps the actor then learns on
        # the same batch through the updated critics, and the targets move.
        obs = batch["obs"]
        _, metrics = self._update_step(*(batch[field] for field in BATCH_FIELDS))
        self._critic_updates += 1
        if self._critic_updates % self.config.policy_delay == 0:
            actor_metrics = self._actor_step(obs)[1]
            polyak_update(self._target_params, self._online_params, self.config.tau)
            copy_statistics(self._target_statistics)
            return {**metrics, "actor_loss": actor_metrics["actor_loss"]}
        return metrics  # (actor_loss only from the updates that moved the actor: averaged over those)

    def _critic_loss(self, obs: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor, next_obs: torch.Tensor,
                     terminated: torch.Tensor, discounts: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The critics' TD loss of one replay batch."""
        cfg = self.config
        with torch.no_grad():
            # Target policy smoothing: a' = clip(mu_target(s') + clip(eps, -c, c), -1, 1), eps ~ N(0, sigma)
            next_actions = self.actor_target(next_obs)
            if cfg.target_policy_noise > 0:
                noise = (torch.randn_like(next_actions) * cfg.target_policy_noise).clamp(-cfg.target_noise_clip,
                                                                                         cfg.target_noise_clip)
                next_actions = (next_actions + noise).clamp(-1.0, 1.0)
            # Clipped double Q: y = r + gamma^m (1 - d) min_k Q_target_k(s', a')
            next_q = self.critic_target(next_obs, next_actions).amin(0)
            target_q = rewards + discounts * (1 - terminated) * next_q

        # J_Q = sum_k E[(Q_k(s, a) - y)^2], all K critics in one batched pass.
        q_values = self.critic(obs, actions)  # [K, B]
        critic_loss = (q_values - target_q).square().mean(1).sum()
        return critic_loss, {"critic_loss": critic_loss.detach(), "q_values": q_values.detach().mean()}

    def _actor_loss(self, obs: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The deterministic policy gradient's loss through the first critic, J = -E[Q_1(s, mu(s))], with the
        critic's weights (and encoder) as constants: it reaches only the actor."""
        with torch.no_grad():
            features = self.critic.features(obs)
        actor_loss = -self.critic.head(features, self.actor(obs), members=slice(0, 1), detached=True).mean()
        return actor_loss, {"actor_loss": actor_loss.detach()}
