"""PPO's minibatch update with hand-derived gradients on flat buffers: about a third of the kernels of autograd.

For RL-sized networks (two 64-wide layers, minibatches of a few hundred rows) an update's cost is the number of
kernels and the per-kernel overhead of the framework, not FLOPs: the autograd version of PPO's update runs over a
hundred small ops plus the autograd engine's bookkeeping, and Adam and gradient clipping loop over every parameter
tensor.
This module computes the same update with the gradient of the clipped PPO loss written out by hand for the
`ActorCritic` network (a two-member `EnsembleMLP` with tanh or ReLU), every parameter, gradient and Adam moment held
in one flat buffer (the module's parameters are views into it), gradient clipping as one norm, and Adam as one
fused call. `tests/test_fused_ppo.py` checks it against autograd and `torch.optim.Adam` step by step.

The maths, for minibatch size B, ratio r = exp(log pi(a|s) - log pi_old(a|s)) and normalised advantage A:

    L = mean(max(-A r, -A clip(r, 1-e, 1+e))) - c_ent mean(H) + c_vf 0.5 mean((V - R)^2)
    dL/dlog pi = r * (-A / B) where the unclipped term is the max (else 0; the clipped term has no gradient there)
    dlog pi/dlogits = onehot(a) - p,   dH/dlogits = -p (log p + H)
    Gaussian: dlog pi/dmean = (a - mean) / std^2,   dlog pi/dlog_std = z^2 - 1,   dH/dlog_std = 1
    dL/dV = c_vf (V - R) / B, with value clipping only where V is inside the clip range or the unclipped term is
            the max (else 0)

and the usual backward pass of an MLP: dW = h^T g, db = sum g, g_prev = (g W^T) * act'(z).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from rlspeed.accel.introspect import made_as
from rlspeed.fused.flat import (
    FlatAdam,
    activation_reason,
    ensemble_backward,
    ensemble_forward,
    uncovered_parameters_reason,
)
from rlspeed.nn import ActorCritic


def unsupported_reason(policy: nn.Module, masked: bool = False) -> str | None:
    """Why `FusedPPOUpdate` cannot update this policy, or None when it can (an `ActorCritic` with a tanh or ReLU
    body, Discrete or Box actions, no action masks: `masked` says the run uses them)."""
    cls = made_as(policy)
    if cls is not ActorCritic:
        return f"the policy is a {cls.__name__}, not rlspeed's ActorCritic MLP"
    kind = getattr(policy, "kind", "categorical" if policy.discrete else "gaussian")
    if kind not in ("categorical", "gaussian"):
        names = {"multi_categorical": "MultiDiscrete", "bernoulli": "MultiBinary"}
        return f"{names.get(kind, kind)} actions (the hand-derived update covers Discrete and Box actions)"
    if masked:
        return "action masks (the hand-derived update covers unmasked policies)"
    if policy.encoder is not None:
        return f"a {policy.encoder.kind} (the hand-derived update covers MLPs on float vectors)"
    hidden = len(policy.body.weights) > 1  # (net_arch=[]: no activation runs, whichever is named)
    return (activation_reason(policy.body.activation) if hidden else None) or uncovered_parameters_reason(
        policy, [*policy.body.parameters(), *([policy.log_std] if kind == "gaussian" else [])], "policy")


class FusedPPOUpdate:
    """One PPO minibatch update (loss, gradient, all-reduce, clipping, Adam) without autograd.

    Parameters, gradients and Adam moments live in a `rlspeed.fused.flat.FlatAdam` (checkpoints are the same as with
    autograd and `torch.optim.Adam`).
    Call as `update(obs, actions, old_log_probs, old_values, advantages, returns, clip_range) -> (loss, stats)`.
    """

    def __init__(self, policy: ActorCritic, optimizer: torch.optim.Optimizer, *, max_grad_norm: float,
                 vf_coef: float, ent_coef: float, clip_range_vf: float | None, normalize_advantage: bool,
                 strategy=None):
        if unsupported_reason(policy) is not None:
            raise ValueError("FusedPPOUpdate needs an ActorCritic with a tanh or ReLU body.")
        self.policy = policy
        self.vf_coef, self.ent_coef = float(vf_coef), float(ent_coef)
        self.clip_range_vf, self.normalize_advantage = clip_range_vf, normalize_advantage
        self.tanh = isinstance(policy.body.activation, nn.Tanh)
        body = policy.body
        params = [*body.weights, *body.biases] + ([] if policy.discrete else [policy.log_std])
        self.adam = FlatAdam(params, optimizer, max_grad_norm=max_grad_norm, strategy=strategy)
        layers = len(body.weights)
        self.weights = self.adam.param_views[:layers]
        self.biases = self.adam.param_views[layers:2 * layers]
        self.weight_grads = self.adam.grad_views[:layers]
        self.bias_grads = self.adam.grad_views[layers:2 * layers]
        self.log_std = None if policy.discrete else self.adam.param_views[-1]
        self.log_std_grad = None if policy.discrete else self.adam.grad_views[-1]

    # --- the update ------------------------------------------------------------------------------------------------

    def follow(self, config) -> None:
        """Take `config`'s loss coefficients as they are now: the autograd loss reads them at every step, so a
        callback that changes them between iterations changes either update alike."""
        self.vf_coef, self.ent_coef = float(config.vf_coef), float(config.ent_coef)
        self.clip_range_vf, self.normalize_advantage = config.clip_range_vf, config.normalize_advantage
    def __call__(self, obs, actions, old_log_probs, old_values, advantages, returns, clip_range, *,
                 normalized: bool = False, with_stats: bool = True):
        self.adam.check()
        loss, stats = self.gradient(obs, actions, old_log_probs, old_values, advantages, returns, clip_range,
                                    normalized=normalized, with_stats=with_stats)
        self.adam.step()  # all-reduce, clip, Adam
        return loss, stats

    @torch.inference_mode()  # no autograd here: its tensors skip view tracking and version counters
    def gradient(self, obs, actions, old_log_probs, old_values, advantages, returns, clip_range, *,
                 normalized: bool = False, with_stats: bool = True):
        """Write dL/dparameters into the flat gradient buffer; returns (loss, [pg, vf loss, entropy, kl, clipfrac]).

        `normalized=True`: the advantages are already normalised (skip it). `with_stats=False` skips the loss
        and the statistics (about ten kernels) and returns (None, None); the gradient is the same.
        """
        policy, batch = self.policy, obs.shape[0]
        # Forward through the two-member ensemble (member 0 actor, member 1 critic), keeping activations.
        hidden = ensemble_forward(obs.unsqueeze(0).expand(2, -1, -1), self.weights, self.biases, self.tanh)
        out = hidden[-1]
        head, values = out[0], out[1, :, 0]

        if self.normalize_advantage and batch > 1 and not normalized:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        new_log_probs, entropy, saved = head_log_prob_entropy(policy.discrete, head, actions, self.log_std)
        log_ratio = new_log_probs - old_log_probs
        ratio = log_ratio.exp()
        # the two surrogate terms with the sign flipped: the loss term is -min(A r, A clip(r))
        unclipped = advantages * ratio
        clipped = advantages * ratio.clamp(1 - clip_range, 1 + clip_range)
        value_error = values - returns
        if self.clip_range_vf is None:
            value_grad = value_error
            value_sq = value_error.square() if with_stats else None
        else:
            change = values - old_values
            clipped_values = old_values + change.clamp(-self.clip_range_vf, self.clip_range_vf)
            unclipped_sq, clipped_sq = value_error.square(), (clipped_values - returns).square()
            # Inside the clip range both terms are V (up to rounding of old + (V - old)) and pass the gradient.
            value_grad = torch.where((unclipped_sq >= clipped_sq) | (change.abs() <= self.clip_range_vf),
                                     value_error, 0.0)
            value_sq = torch.maximum(unclipped_sq, clipped_sq) if with_stats else None
        loss = stats = None
        if with_stats:
            ratio_change = ratio - 1.0
            stats = torch.stack((torch.minimum(unclipped, clipped).neg_(), value_sq.mul_(0.5), entropy,
                                 ratio_change - log_ratio, (ratio_change.abs() > clip_range).to(ratio.dtype))).mean(1)
            loss = stats[0] - self.ent_coef * stats[2] + self.vf_coef * stats[1]

        # Output gradient [2, B, out]: actor head in member 0, value in member 1 column 0.
        grad_out = torch.zeros_like(out)
        # the unclipped term is the minimum (ties: inside the clip range, where both are A r): it passes -A r / B
        grad_log_prob = torch.where(unclipped <= clipped, advantages, 0.0).mul_(ratio).mul_(-1.0 / batch)
        head_grad(policy.discrete, saved, grad_log_prob, entropy, self.ent_coef, grad_out[0], self.log_std_grad)
        grad_out[1, :, 0] = value_grad * (self.vf_coef / batch)

        # Backward through the ensemble MLP, writing straight into the flat gradient buffer.
        ensemble_backward(grad_out, hidden, self.weights, self.weight_grads, self.bias_grads, self.tanh)
        return loss, stats


def head_log_prob_entropy(discrete: bool, head: torch.Tensor, actions: torch.Tensor,
                          log_std: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, tuple]:
    """(log-probabilities `[B]`, entropies `[B]`, saved) of the actions under the policy head `[B, A]`: categorical
    logits, or a Gaussian's mean with the state-independent `log_std`. `saved` is what `head_grad` reads."""
    if discrete:
        log_p = torch.log_softmax(head, dim=-1)
        probs = log_p.exp()
        index = actions.long().unsqueeze(-1)
        return log_p.gather(-1, index).squeeze(-1), -(probs * log_p).sum(-1), (log_p, probs, index)
    inv_std = torch.exp(-log_std)
    z_score = (actions - head) * inv_std
    log_probs = (-0.5 * z_score.square() - log_std).sum(-1) - 0.5 * math.log(2 * math.pi) * head.shape[-1]
    entropy = (0.5 + 0.5 * math.log(2 * math.pi) + log_std).sum().expand(head.shape[0])
    return log_probs, entropy, (z_score, inv_std)


def head_grad(discrete: bool, saved: tuple, grad_log_prob: torch.Tensor, entropy: torch.Tensor, ent_coef: float,
              out: torch.Tensor, log_std_grad: torch.Tensor | None) -> None:
    """The gradient of `sum(grad_log_prob * log_prob) - ent_coef * mean(entropy)` (the batch of `B` rows) with
    respect to the policy head, written into `out` `[B, A]`, and, for a Gaussian, with respect to `log_std`, written
    into `log_std_grad` `[A]`; `saved` from `head_log_prob_entropy`."""
    batch = grad_log_prob.shape[0]
    if discrete:
        log_p, probs, index = saved
        torch.mul(probs, grad_log_prob.unsqueeze(-1).neg(), out=out)
        if ent_coef:
            out += (ent_coef / batch) * probs * (log_p + entropy.unsqueeze(-1))
        out.scatter_add_(-1, index, grad_log_prob.unsqueeze(-1))
    else:
        z_score, inv_std = saved
        torch.mul(grad_log_prob.unsqueeze(-1) * z_score, inv_std, out=out)
        torch.sub((grad_log_prob.unsqueeze(-1) * (z_score.square() - 1)).sum(0), ent_coef, out=log_std_grad)
