"""Generalised State-Dependent Exploration (gSDE; Raffin, Kober and Stulp, 2021) as Stable-Baselines3 defines it.

The exploration noise of a Box action is a function of the state, held fixed between resamples:

    noise(s) = z(s) @ E,    E ~ N(0, sigma) elementwise, shape [latent_dim, action_dim], one E per env

where z(s) is the policy's last hidden features (detached: the noise does not train them; SB3's `learn_features`
off) and E is resampled at the start of every rollout and every `sde_sample_freq` steps within it (-1: once per
rollout). Given s, the action a = mu(s) + noise(s) is Gaussian with per-action variance

    var_k(s) = sum_j z_j(s)^2 sigma_jk^2 + 1e-6        (SB3's epsilon)

which gives its log-probability and entropy; the deterministic action is mu(s). sigma = exp(log_std), or with
`use_expln` SB3's expln (exp(x) for x <= 0, log1p(x) + 1 above: the variance grows slowly), where `log_std` is a
parameter [latent_dim, action_dim] (`full_std`) or [latent_dim, 1] (one sigma per feature, shared by the actions).

`SDEActorCritic` is PPO's and A2C's policy with gSDE (SB3's `use_sde` with an `ActorCriticPolicy`),
`RecurrentSDEActorCritic` RecurrentPPO's (sb3-contrib's `RecurrentActorCriticPolicy` with `use_sde`),
`SDESquashedGaussianActor` SAC's actor with gSDE; `SDENoise` holds the parameter and the matrices. Only autograd
updates these policies (`rlspeed.algos.update.select_update` says so).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import gymnasium as gym
import torch
from torch import nn

from rlspeed.errors import UserError
from rlspeed.nn import (
    SB3_ACTOR_CRITIC_ATTRIBUTES,
    SB3_RECURRENT_ATTRIBUTES,
    SB3_SAC_ACTOR_ATTRIBUTES,
    ActorCritic,
    Encoder,
    RecurrentActorCritic,
    SB3Names,
    _encode,
    mlp,
)

#: SB3's epsilon: added to the variance (and to expln's argument above 0) so that sigma is never 0
SDE_EPSILON = 1e-6
LOG_2PI = math.log(2 * math.pi)


#: Stable-Baselines3 policy attributes gSDE's networks lack, with what to use instead (`rlspeed.nn.SB3Names`)
SB3_SDE_ACTOR_CRITIC_ATTRIBUTES = {
    **SB3_ACTOR_CRITIC_ATTRIBUTES,
    **dict.fromkeys(("get_distribution", "action_dist"),
                    "with gSDE, model.policy.act(obs) returns (actions, log_probs, values) and "
                    "model.policy.forward_latent(obs) the Gaussian mean, values and the latent features the noise "
                    "takes"),
    "reset_noise": "gSDE's exploration matrices are drawn anew by model.policy.resample(num_envs)",
}
SB3_SDE_SAC_ACTOR_ATTRIBUTES = {
    **{name: advice for name, advice in SB3_SAC_ACTOR_ATTRIBUTES.items() if name != "get_action_dist_params"},
    "get_action_dist_params": "with gSDE, model.actor(obs) returns (mean, latent features), the noise being "
                              "model.actor.sde.noise(latent)",
    "reset_noise": "gSDE's exploration matrices are drawn anew by model.actor.sde.resample(num_envs)",
}


@dataclass
class SDEConfig:
    """gSDE's hyperparameters (SB3's names), shared by the algorithms that have it (`validate_sde` checks them)."""

    use_sde: bool = False  # generalised state-dependent exploration instead of independent Gaussian noise
    sde_sample_freq: int = -1  # resample the exploration matrices every this many steps (-1: once per rollout)
    full_std: bool = True  # log_std [latent_dim, action_dim] (False: [latent_dim, 1])
    use_expln: bool = False  # sigma from SB3's expln of log_std instead of exp (bounded growth above 0)
    #: the options that do something only with use_sde (`rlspeed.algos.base.unused_settings` warns about the others)
    needs_sde: ClassVar[tuple[str, ...]] = ("sde_sample_freq", "full_std", "use_expln")

    def validate_sde(self) -> None:
        """UserError naming the hyperparameter for a value out of range."""
        if self.sde_sample_freq == 0 or self.sde_sample_freq < -1:
            raise UserError(f"sde_sample_freq must be -1 (resample the gSDE noise once per rollout) or >= 1 (every "
                            f"that many steps), got {self.sde_sample_freq}.")


def check_sde_action_space(space: gym.Space, algo: str) -> None:
    """UserError unless gSDE applies to these actions (a Box)."""
    if not isinstance(space, gym.spaces.Box):
        raise UserError(f"use_sde=true needs a Box action space (gSDE perturbs continuous actions), and this env's "
                        f"actions are {space}: drop use_sde for {algo} on this env.")


def sde_std(log_std: torch.Tensor, use_expln: bool, action_dim: int) -> torch.Tensor:
    """sigma `[latent_dim, action_dim]` from the parameter `log_std` (`[latent_dim, action_dim]` or
    `[latent_dim, 1]`, broadcast over the actions)."""
    if use_expln:
        positive = log_std.clamp(min=0.0)
        std = torch.where(log_std <= 0, log_std.exp(), torch.log1p(positive + SDE_EPSILON) + 1.0)
    else:
        std = log_std.exp()
    return std.expand(log_std.shape[0], action_dim)


def sde_log_prob(actions: torch.Tensor, mean: torch.Tensor, latent: torch.Tensor,
                 std: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probability `[B]`, log-variance `[B, A]`) of `actions` `[B, A]` under N(mean, var), var = latent^2 @
    std^2 + eps, summed over the actions. `latent` `[B, latent_dim]` as the noise used it (detached by the caller)."""
    variance = latent.square() @ std.square() + SDE_EPSILON
    log_variance = variance.log()
    return (-0.5 * (actions - mean).square() / variance - 0.5 * log_variance - 0.5 * LOG_2PI).sum(-1), log_variance


def sde_log_prob_entropy(actions: torch.Tensor, mean: torch.Tensor, latent: torch.Tensor,
                         std: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probability, entropy) `[B]` (`sde_log_prob`; the entropy only where the loss needs it, not per step)."""
    log_prob, log_variance = sde_log_prob(actions, mean, latent, std)
    return log_prob, (0.5 + 0.5 * LOG_2PI + 0.5 * log_variance).sum(-1)


class SDENoise(nn.Module):
    """gSDE's parameter `log_std` and the exploration matrices `exploration` `[N, latent_dim, action_dim]` (one per
    env, not saved in checkpoints: SB3 draws them anew too). `resample(N)` draws them; `noise(latent)` is
    latent @ E per row. Loading a `log_std` rescales the matrices to it (as SB3's load redraws them), so a loaded
    model explores with its own sigma before its first resample, without a draw from the caller's generator."""

    def __init__(self, latent_dim: int, action_dim: int, log_std_init: float = 0.0, full_std: bool = True,
                 use_expln: bool = False, learn_features: bool = False):
        super().__init__()
        self.latent_dim, self.action_dim = int(latent_dim), int(action_dim)
        self.full_std, self.use_expln = bool(full_std), bool(use_expln)
        self.learn_features = bool(learn_features)  # gradients reach the features through the noise (SB3's SAC)
        columns = self.action_dim if self.full_std else 1
        self.log_std = nn.Parameter(torch.full((self.latent_dim, columns), float(log_std_init)))
        # E = sigma * N(0, 1): the standard draws are kept for `_follow_loaded_std`
        self.register_buffer("standard_draws", torch.zeros(1, self.latent_dim, self.action_dim), persistent=False)
        self.register_buffer("exploration", torch.zeros(1, self.latent_dim, self.action_dim), persistent=False)
        self.register_load_state_dict_post_hook(_follow_loaded_std)
        self.resample(1)  # (so that a policy samples with noise before its first rollout, as SB3's does)

    def std(self) -> torch.Tensor:
        """sigma `[latent_dim, action_dim]`."""
        return sde_std(self.log_std, self.use_expln, self.action_dim)

    @torch.no_grad()
    def resample(self, num_envs: int) -> None:
        """New exploration matrices for `num_envs` envs, each ~ N(0, sigma) elementwise (drawn into the current
        buffers where they fit: resampling every few rollout steps allocates nothing)."""
        std = self.std()
        draws = self.standard_draws
        if draws.shape != (num_envs, *std.shape) or draws.dtype != std.dtype or draws.device != std.device:
            self.standard_draws = torch.empty(num_envs, *std.shape, device=std.device, dtype=std.dtype)
            self.exploration = torch.empty_like(self.standard_draws)
        torch.mul(self.standard_draws.normal_(), std, out=self.exploration)  # (randn's numbers: randn is normal_)

    def draw(self, standard: torch.Tensor | None = None) -> torch.Tensor:
        """One matrix ~ N(0, sigma) `[latent_dim, action_dim]` as sigma * N(0, 1): gradients reach `log_std` through
        it (SB3's reparameterised draw for SAC's update, one matrix for the whole batch). `standard`: the N(0, 1)
        numbers, drawn ahead (`standard_draw`), else drawn here."""
        std = self.std()
        return std * (torch.randn_like(std) if standard is None else standard)

    @torch.no_grad()
    def standard_draw(self) -> torch.Tensor:
        """The N(0, 1) numbers of a `draw`, as a plain tensor (no autograd history): what an update step takes as an
        input, so that each of its steps makes the matrix, with its gradient, from the same numbers."""
        return torch.randn_like(self.std())

    def _latent(self, latent: torch.Tensor) -> torch.Tensor:
        return latent if self.learn_features else latent.detach()

    def noise(self, latent: torch.Tensor, matrix: torch.Tensor | None = None) -> torch.Tensor:
        """latent @ E `[B, action_dim]`: with `matrix`, every row with it; else row i with env i's matrix when B
        equals the number of matrices, and every row with the first one otherwise (as SB3 for another batch size)."""
        latent = self._latent(latent)
        if matrix is not None:
            return latent @ matrix
        if self.exploration.shape[0] == latent.shape[0]:
            return torch.bmm(latent.unsqueeze(1), self.exploration).squeeze(1)
        return latent @ self.exploration[0]

    def log_prob(self, mean: torch.Tensor, latent: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """log-probability `[B]` of `actions` (see `sde_log_prob`)."""
        return sde_log_prob(actions, mean, self._latent(latent), self.std())[0]

    def log_prob_entropy(self, mean: torch.Tensor, latent: torch.Tensor,
                         actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-probability, entropy) `[B]` of `actions` (see `sde_log_prob_entropy`)."""
        return sde_log_prob_entropy(actions, mean, self._latent(latent), self.std())


@torch.no_grad()
def _follow_loaded_std(noise: SDENoise, incompatible_keys) -> None:
    """After `load_state_dict`: the current matrices' standard draws times the loaded sigma."""
    noise.exploration = noise.standard_draws * noise.std()


class SDEHead:
    """gSDE's action head over an `ActorCritic`'s actor (shared by `SDEActorCritic` and the recurrent
    `RecurrentSDEActorCritic`): the actor's last hidden features (its MLP's last layer input; the head's input without
    hidden layers) drive the noise. `act` samples mean + noise with the current matrices (`resample` draws new ones);
    `evaluate` gives the log-probability and entropy of stored actions under the state-dependent variance; `mode` is
    the mean. `features` and `body` are the `ActorCritic`'s."""

    sde: SDENoise

    def _use_sde(self, log_std_init: float, full_std: bool, use_expln: bool, action_space: gym.Space | None) -> None:
        """Replace the state-independent `log_std` by gSDE's `SDENoise` (UserError unless the actions are a Box)."""
        if self.kind != "gaussian":
            raise UserError(f"gSDE needs Box actions, not {action_space}.")
        del self.log_std  # (the state-independent one: gSDE's lives in `sde`)
        latent_dim = self.body.weights[-1].shape[1]  # (the actor's last layer's input)
        self.sde = SDENoise(latent_dim, self.action_dim, log_std_init, full_std, use_expln)

    def resample(self, num_envs: int) -> None:
        """New exploration matrices, one per env."""
        self.sde.resample(num_envs)

    def forward_latent(self, obs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(mean `[B, A]`, value `[B]`, the actor's latent features `[B, latent_dim]`)."""
        out, hidden = self.body(self.features(obs), with_hidden=True)
        return out[0], out[1, :, 0], hidden[0]

    def act(self, obs, deterministic: bool = False, action_masks: torch.Tensor | None = None):
        """(actions, log_probs, values): mean + latent @ E (the mean when `deterministic`)."""
        mean, value, latent = self.forward_latent(obs)
        actions = mean if deterministic else mean + self.sde.noise(latent)
        return actions, self.sde.log_prob(mean, latent, actions), value

    def evaluate(self, obs, actions: torch.Tensor, action_masks: torch.Tensor | None = None):
        """(log_probs, entropy, values) of stored actions under the current policy."""
        mean, value, latent = self.forward_latent(obs)
        log_prob, entropy = self.sde.log_prob_entropy(mean, latent, actions)
        return log_prob, entropy, value

    def mode(self, out: torch.Tensor, action_masks: torch.Tensor | None = None) -> torch.Tensor:
        """The mean: gSDE's deterministic action."""
        return out

    def sample(self, out: torch.Tensor, deterministic: bool = False, action_masks: torch.Tensor | None = None):
        """Not available from the mean alone: gSDE's noise and log-probabilities need the latent features."""
        raise TypeError(f"{type(self).__name__} samples from observations (act), not from the actor's output alone.")

    def log_prob_entropy(self, out: torch.Tensor, actions: torch.Tensor, action_masks: torch.Tensor | None = None):
        """Not available from the mean alone (see `sample`)."""
        raise TypeError(f"{type(self).__name__} evaluates from observations (evaluate), not from the actor's output "
                        "alone.")


class SDEActorCritic(SDEHead, ActorCritic):
    """`ActorCritic` for Box actions with gSDE (`SDEHead`) instead of the state-independent `log_std`."""

    sb3_names = SB3_SDE_ACTOR_CRITIC_ATTRIBUTES

    def __init__(self, obs_dim: int, action_dim: int, hidden: Sequence[int] = (64, 64), activation: str = "tanh",
                 log_std_init: float = 0.0, encoder: Encoder | None = None, action_space: gym.Space | None = None,
                 full_std: bool = True, use_expln: bool = False):
        super().__init__(obs_dim, action_dim, False, hidden, activation, log_std_init, encoder, action_space)
        self._use_sde(log_std_init, full_std, use_expln, action_space)


class RecurrentSDEActorCritic(SDEHead, RecurrentActorCritic):
    """`RecurrentActorCritic` for Box actions with gSDE (`SDEHead`), as sb3-contrib's RecurrentPPO with `use_sde`:
    the noise takes the actor's LSTM and MLP output (`latent_pi`), detached."""

    sb3_names = {**SB3_RECURRENT_ATTRIBUTES, "reset_noise": SB3_SDE_ACTOR_CRITIC_ATTRIBUTES["reset_noise"]}

    def __init__(self, obs_dim: int, action_dim: int, lstm_hidden_size: int = 64, hidden: Sequence[int] = (64,),
                 activation: str = "relu", log_std_init: float = 0.0, encoder: Encoder | None = None,
                 action_space: gym.Space | None = None, full_std: bool = True, use_expln: bool = False):
        super().__init__(obs_dim, action_dim, False, lstm_hidden_size, hidden, activation, log_std_init, encoder,
                         action_space)
        self._use_sde(log_std_init, full_std, use_expln, action_space)

    def _actor_actions(self, out: torch.Tensor, latent: torch.Tensor, deterministic: bool,
                       action_masks: torch.Tensor | None) -> torch.Tensor:
        """`actor_step`'s actions: the mean `out[0]`, or mean + latent @ E."""
        return out[0] if deterministic else out[0] + self.sde.noise(latent[0])


class SDESquashedGaussianActor(SB3Names, nn.Module):
    """SAC's actor with gSDE (SB3's `Actor` with `use_sde`): an MLP to latent features z(s), the mean
    mu(s) = hardtanh(Linear(z), -2, 2) (SB3's `clip_mean` 2), and a = tanh(mu(s) + z(s) @ E). Unlike PPO's, the
    features learn through the noise (SB3's `learn_features` for SAC). log pi(a|s) = log N(u; mu, var(s)) -
    sum log(1 - tanh(u)^2 + 1e-6) for u = mu + z @ E (SB3 recovers u as atanh(a); the same value, without the round
    trip). Actions in [-1, 1] (the algorithm rescales them to the Box)."""

    sb3_names = SB3_SDE_SAC_ACTOR_ATTRIBUTES

    CLIP_MEAN = 2.0

    def __init__(self, obs_dim: int, action_dim: int, hidden: Sequence[int], activation: str = "relu",
                 encoder: Encoder | None = None, log_std_init: float = -3.0, full_std: bool = True,
                 use_expln: bool = False):
        super().__init__()
        self.encoder = encoder
        in_dim = encoder.features_dim if encoder is not None else obs_dim
        layers = mlp(in_dim, hidden, action_dim, activation, out_gain=0.01)
        # z(s): the hidden layers, each with its activation (none without hidden layers); mu: the last layer
        self.latent, self.mu = layers[:-1], layers[-1]
        self.sde = SDENoise(self.mu.in_features, action_dim, log_std_init, full_std, use_expln, learn_features=True)

    def forward(self, obs) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean `[B, A]` before the squashing, latent features `[B, latent_dim]`)."""
        latent = self.latent(_encode(self.encoder, obs))
        return self.mu(latent).clamp(-self.CLIP_MEAN, self.CLIP_MEAN), latent

    def sample(self, obs, matrix: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(actions in [-1, 1], log pi): with `matrix` (from `sde.draw()`) for every row, else the current
        per-env matrices (`sde.resample`)."""
        mean, latent = self(obs)
        u = mean + self.sde.noise(latent, matrix)
        actions = torch.tanh(u)
        log_prob = self.sde.log_prob(mean, latent, u)
        return actions, log_prob - torch.log(1.0 - actions.square() + SDE_EPSILON).sum(-1)

    def deterministic(self, obs) -> torch.Tensor:
        """tanh of the mean: the action used for evaluation."""
        return torch.tanh(self(obs)[0])


def build_sde_actor_critic(algo, recurrent: bool = False) -> SDEActorCritic | RecurrentSDEActorCritic:
    """The gSDE policy of an on-policy algorithm from its config and env spec: PPO's and A2C's, or with `recurrent`
    RecurrentPPO's (its config's `lstm_hidden_size`). UserError for non-Box actions."""
    cfg, spec = algo.config, algo.spec
    check_sde_action_space(spec.action_space, algo.name)
    policy_class, lstm = ((RecurrentSDEActorCritic, {"lstm_hidden_size": cfg.lstm_hidden_size}) if recurrent
                          else (SDEActorCritic, {}))
    return policy_class(spec.obs_dim, spec.action_dim, hidden=cfg.net_arch, activation=cfg.activation,
                        log_std_init=cfg.log_std_init, encoder=algo._make_encoder("policy"),
                        action_space=spec.action_space, full_std=cfg.full_std, use_expln=cfg.use_expln, **lstm)


def resample_due(step: int, sample_freq: int) -> bool:
    """Whether the exploration matrices are redrawn before rollout step `step` (0-based within the rollout): at its
    start, and every `sample_freq` steps when `sample_freq` > 0 (SB3's rule)."""
    return step == 0 or (sample_freq > 0 and step % sample_freq == 0)
