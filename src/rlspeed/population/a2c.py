"""A2C populations: K independent A2C agents trained in one process as one batched model.

A2C is PPO without its epochs, minibatches and clipping, so `A2CPopulation` is `PPOPopulation` (stacked parameters,
one env batch of K x N rows, GAE with per-member gamma and lambda, members leaving the computation, evaluation,
summaries) with A2C's own pieces, each as the solo `rlspeed.A2C` has it:

* one update per rollout on the whole rollout of each member (`num_envs * num_steps` rows, the solo's row order);
* A2C's loss (PPO's at ratio 1 without clipping, with SB3's full mean squared value error):
  `L = -mean(A log pi) - c_ent mean(H) + c_vf mean((V - R)^2)`, differentiated by hand (`_hand_gradients`, shared
  with PPO, with A2C's `_output_gradients`) where `rlspeed.fused` covers the network, else by autograd of `_loss`;
  tests/test_population_a2c.py checks the two agree;
* per-member RMSprop (alpha 0.99, eps `rms_prop_eps`, as `torch.optim.RMSprop` and SB3) with per-member learning
  rates after per-member gradient clipping; `use_rms_prop=False`: the Adam PPO populations use (as the solo's);
* the rollout's random draws as the solo run makes them: where the solo samples with the hand-derived update's flat
  forward (`A2C._flat_forward`: the default on a CPU), one draw of the whole rollout's noise per member at its first
  step (Gumbel noise for Discrete actions, scaled normal noise for Box), else one draw per step as `ActorCritic.act`.

So member k's first updates equal a solo `A2C(env_id, seed=seeds[k], ...)` run's to float tolerance.
"""

from __future__ import annotations

import torch

from rlspeed.algos.a2c import A2C
from rlspeed.population.ppo import PPOPopulation, _normalized

#: Hyperparameters an A2C member may set for itself (none changes a tensor's shape)
PER_MEMBER_A2C = ("learning_rate", "gamma", "gae_lambda", "ent_coef", "vf_coef", "max_grad_norm", "rms_prop_eps")
_RMS_PROP_ALPHA = 0.99  # as `A2C._make_optimizer` (SB3's)


class A2CPopulation(PPOPopulation):
    """K independent A2C members trained as one batched model (see the module docstring).

    >>> from rlspeed import A2C
    >>> from rlspeed.population import Population
    >>> population = Population(A2C, "CartPole-v1", seeds=range(8), learning_rate=[7e-4] * 4 + [1e-3] * 4)
    >>> summary = population.learn(500_000, target_return=475, eval_freq=10_000)

    `seeds`: one per member (distinct). Hyperparameters: one value for all members, or, for those in
    `PER_MEMBER_A2C`, a list of K values. `member_overrides`: a list of K dicts of hyperparameters for single members
    (same rules). `members`: solo A2C models to start from, as `PPOPopulation` takes solo PPO models.
    """

    algo_name = "a2c"
    algo_cls = A2C
    per_member = PER_MEMBER_A2C
    supports_action_masks = True  # (masked runs sample step by step, as the solo A2C's policy module does)
    # an iteration is num_steps (5) env steps: members are checked for divergence at evaluations, not per iteration
    check_divergence_every_iteration = False

    def _adopt_solos(self, solos) -> None:
        # the solo samples its rollout with the flat forward's whole-rollout draws where that runs
        self._whole_rollout_draws = solos[0]._flat_forward() is not None

    def _start_masking(self) -> None:
        super()._start_masking()
        # (the solo's masked update is autograd, so its rollout samples through the policy module, step by step)
        self._whole_rollout_draws = False

    def _sample(self, out: torch.Tensor, step: int,
                masks: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(actions, log-probabilities) `[K, B]` at rollout step `step`: with whole-rollout draws, the step's row of
        each member's noise drawn at step 0 from its generator (as `FusedA2CUpdate.rollout_noise` and `act`); the
        log-probabilities are zeros there, as the solo's (A2C's loss recomputes them and never reads the rollout's).
        With action `masks` (never with whole-rollout draws), PPO's step-by-step masked draws."""
        if not self._whole_rollout_draws:
            return super()._sample(out, step, masks)
        size, envs, width = out.shape
        if step == 0:
            shape = (self.config.num_steps, envs, width)
            if self.kind == "categorical":
                noise = torch.stack([torch.empty(shape, device=self.device).exponential_(generator=g)
                                     for g in self.generators]).log_().neg_()
            else:
                noise = torch.stack([torch.empty(shape, device=self.device).normal_(generator=g)
                                     for g in self.generators]).mul_(self.log_std.detach().exp().view(size, 1, 1, -1))
            self._rollout_noise = noise  # [K, T, N, A]
            self._no_log_probs = torch.zeros(size, envs, device=self.device)
        noisy = out + self._rollout_noise[:, step]
        return (noisy.argmax(-1) if self.kind == "categorical" else noisy), self._no_log_probs

    def _update_rollout(self, obs, actions, old_log_probs, old_values, advantages, returns, masks=None) -> None:
        """One update of every member on its whole rollout `[K, T * N, ...]` (the stored log-probabilities and values
        are not used: A2C has no ratio and no value clipping); `masks`: the action masks of the rollout."""
        cfg = self.config
        learning_rate = self.hyper["learning_rate"] * (self._progress_remaining() if cfg.anneal_lr else 1.0)
        if cfg.normalize_advantage and advantages.shape[1] > 1:
            advantages = _normalized(advantages)
        self._optimizer_step(self._gradients(obs, actions, advantages, returns, masks=masks), learning_rate)

    def _loss(self, obs, actions, advantages, returns, masks: torch.Tensor | None = None) -> torch.Tensor:
        """Each member's A2C loss `[K]` on its rollout rows `[K, B, ...]` (advantages already normalised), as
        `A2C._loss` computes a solo run's: the reference the hand-derived gradient is tested against."""
        hyper = self.hyper
        out, values = self.forward(obs)
        log_probs, entropy = self._log_prob_entropy(out, actions, masks)
        policy_loss = -(advantages * log_probs).mean(1)
        value_loss = (returns - values).square().mean(1)
        return policy_loss - hyper["ent_coef"] * entropy.mean(1) + hyper["vf_coef"] * value_loss

    def _output_gradients(self, new_log_probs, values, advantages, returns) -> tuple[torch.Tensor, torch.Tensor]:
        """(dL/dlog pi, dL/dV) `[K, B]` of A2C's policy and value terms: -A / B and 2 c_vf (V - R) / B."""
        batch = new_log_probs.shape[1]
        return advantages * (-1.0 / batch), (values - returns) * (2.0 * self.hyper["vf_coef"].unsqueeze(1) / batch)

    @torch.no_grad()
    def _optimizer_step(self, grads, learning_rate: torch.Tensor) -> None:
        """Per-member gradient clipping, then per-member RMSprop (as `torch.optim.RMSprop` with SB3's settings: no
        momentum, not centred; the mean square in `_exp_avg_sq`), or with `use_rms_prop=False` PPO's Adam."""
        if not self.config.use_rms_prop:
            return super()._optimizer_step(grads, learning_rate)
        flat = self._clipped_gradient(grads)
        self._exp_avg_sq.mul_(_RMS_PROP_ALPHA).addcmul_(flat, flat, value=1 - _RMS_PROP_ALPHA)
        denom = self._exp_avg_sq.sqrt().add_(self.hyper["rms_prop_eps"].unsqueeze(1))
        self._subtract(flat.div_(denom).mul_(learning_rate.unsqueeze(1)))
        return None
