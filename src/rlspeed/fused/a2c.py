"""A2C's whole-rollout update with hand-derived gradients on flat buffers, RMSprop as one handful of kernels.

An A2C update sees num_envs * num_steps rows (40 at SB3's CartPole settings), so its cost is the number of kernels
and the framework's per-call overhead: the autograd engine, `torch.optim.RMSprop`'s loop over parameter tensors,
gradient clipping per tensor. This module computes the same step for the `ActorCritic` MLP (the networks
`rlspeed.fused.ppo.unsupported_reason` accepts) with the gradient written out, every parameter, gradient and
optimizer state in one flat buffer (`FlatRMSprop`, or `FlatAdam` when A2C runs with `use_rms_prop=False`), clipping
as one norm. `tests/test_fused_a2c.py` checks it against autograd and `torch.optim.RMSprop` step by step.

A2C's loss is PPO's at ratio 1 without clipping, with SB3's full mean squared value error; for B rows:

    L = -mean(A log pi(a|s)) - c_ent mean(H) + c_vf mean((V - R)^2)
    dL/dlog pi = -A / B,   dL/dV = 2 c_vf (V - R) / B
    dlog pi/dlogits = onehot(a) - p,   dH/dlogits = -p (log p + H)
    Gaussian: dlog pi/dmean = (a - mean) / std^2,   dlog pi/dlog_std = z^2 - 1,   dH/dlog_std = 1

and the backward pass of the ensemble MLP (`rlspeed.fused.flat.ensemble_backward`).

The same flat views also give the rollout its forward passes (`act`, `value`) without `nn.Module` calls: for
A2C's few rows per call, the module machinery costs as much as the three matrix products. The parameters do not change
during a rollout, so its random draws are made once per rollout (`rollout_noise`), and the log-probabilities of the
sampled actions, which A2C's loss recomputes and never reads from the rollout, are not computed.
"""

from __future__ import annotations

import torch
from torch import nn

from rlspeed.fused.flat import FlatAdam, ensemble_backward, ensemble_forward
from rlspeed.fused.ppo import head_grad, head_log_prob_entropy, unsupported_reason
from rlspeed.nn import ActorCritic, ensemble_linear


class FlatRMSprop(FlatAdam):
    """RMSprop over `params` on flat buffers, with `torch.optim.RMSprop`'s arithmetic for what SB3 configures
    (no momentum, not centered, no weight decay):

        v = alpha v + (1 - alpha) g^2,   theta -= lr g / (sqrt(v) + eps)

    The flat buffers, views, all-reduce and clipping are `FlatAdam`'s; the running mean of squared gradients lives
    in its second-moment buffer (`square_avg`), and the optimizer's per-parameter state (`step`, `square_avg`) is
    views of it, so checkpoints are those of `torch.optim.RMSprop`. lr, alpha and eps are read from the optimizer's
    param group on every step. `max_grad_norm` and `strategy`: as for `FlatAdam`.
    """

    def __init__(self, params, optimizer: torch.optim.Optimizer, *, max_grad_norm: float | None = None,
                 strategy=None):
        group = optimizer.param_groups[0]
        if group.get("momentum") or group.get("centered") or group.get("weight_decay") or group.get("maximize"):
            raise ValueError("FlatRMSprop implements plain RMSprop: no momentum, centering, weight decay or maximize.")
        super().__init__(params, optimizer, max_grad_norm=max_grad_norm, strategy=strategy)

    @property
    def square_avg(self) -> torch.Tensor:
        return self.exp_avg_sq

    def _state_views(self) -> dict[str, list[torch.Tensor]]:
        return {"square_avg": self._exp_avg_sq_views}

    def step(self) -> None:
        """All-reduce (several processes), clip the global gradient norm, then one RMSprop step."""
        self._reduce_and_clip()
        grad = self.grad
        group = self.optimizer.param_groups[0]
        lr, alpha, eps = group["lr"], group["alpha"], group["eps"]
        self.count_step()
        self.exp_avg_sq.mul_(alpha).addcmul_(grad, grad, value=1 - alpha)
        avg = self.exp_avg_sq.sqrt().add_(eps)
        if isinstance(lr, torch.Tensor):  # (a learning rate held as a tensor: no host read)
            self.flat.sub_(grad.div(avg).mul_(lr))
        else:
            self.flat.addcdiv_(grad, avg, value=-lr)


class FusedA2CUpdate:
    """One A2C update (loss, gradient, all-reduce, clipping, RMSprop or Adam) without autograd, and the rollout's
    forward passes on the same flat parameters.

    Call as `update(obs, actions, advantages, returns) -> (loss, [policy loss, value loss, entropy])`, the
    arguments and results of `A2C._loss`. The flat optimizer is `self.adam` (the name the matmul-precision search
    reads), a `FlatRMSprop` for `torch.optim.RMSprop`, a `FlatAdam` for `torch.optim.Adam`.
    """

    def __init__(self, policy: ActorCritic, optimizer: torch.optim.Optimizer, *, max_grad_norm: float,
                 vf_coef: float, ent_coef: float, normalize_advantage: bool, strategy=None):
        if unsupported_reason(policy) is not None:
            raise ValueError("FusedA2CUpdate needs an ActorCritic with a tanh or ReLU body.")
        self.policy = policy
        self.vf_coef, self.ent_coef = float(vf_coef), float(ent_coef)
        self.normalize_advantage = normalize_advantage
        self.tanh = isinstance(policy.body.activation, nn.Tanh)
        body = policy.body
        params = [*body.weights, *body.biases] + ([] if policy.discrete else [policy.log_std])
        flat_type = FlatRMSprop if isinstance(optimizer, torch.optim.RMSprop) else FlatAdam
        self.adam = flat_type(params, optimizer, max_grad_norm=max_grad_norm, strategy=strategy)
        layers = len(body.weights)
        self.weights = self.adam.param_views[:layers]  # [2, in, out]: member 0 actor, member 1 critic
        self.biases = self.adam.param_views[layers:2 * layers]  # [2, 1, out]
        self.weight_grads = self.adam.grad_views[:layers]
        self.bias_grads = self.adam.grad_views[layers:2 * layers]
        self.log_std = None if policy.discrete else self.adam.param_views[-1]
        self.log_std_grad = None if policy.discrete else self.adam.grad_views[-1]
        device = self.adam.flat.device
        self._signs = torch.tensor([-1.0, 1.0, 1.0], device=device)
        self._loss_weights = torch.tensor([1.0, self.vf_coef, -self.ent_coef], device=device)


    def follow(self, config) -> None:
        """Take `config`'s loss coefficients as they are now: the autograd loss reads them at every step, so a
        callback that changes them between iterations changes either update alike."""
        self.normalize_advantage = config.normalize_advantage
        if (float(config.vf_coef), float(config.ent_coef)) != (self.vf_coef, self.ent_coef):
            self.vf_coef, self.ent_coef = float(config.vf_coef), float(config.ent_coef)
            self._loss_weights = torch.tensor([1.0, self.vf_coef, -self.ent_coef], device=self._loss_weights.device)
    # --- the rollout's forward passes ------------------------------------------------------------------------------
    def _output(self, obs: torch.Tensor) -> torch.Tensor:
        """`EnsembleMLP.forward`'s kernels on float vectors `[B, in]`: the output `[2, B, out]`."""
        x = obs.expand(2, -1, -1)
        last = len(self.weights) - 1
        for layer, (weight, bias) in enumerate(zip(self.weights, self.biases)):
            x = ensemble_linear(x, weight, bias)
            if layer != last:
                x = x.tanh_() if self.tanh else x.relu_()
        return x

    def rollout_noise(self, num_steps: int, num_envs: int) -> torch.Tensor:
        """The random draws of a whole rollout, `[T, N, A]`, made at once (the parameters do not change during a
        rollout): Gumbel noise -log(E), E ~ Exp(1), for a categorical policy; N(0, 1) scaled by the current std for
        a Gaussian one. (First, as before an update: parameters given new data go back into the flat buffer that
        the rollout's forward passes read.)"""
        self.adam.check()
        width = self.weights[-1].shape[-1]
        noise = torch.empty((num_steps, num_envs, width), device=self.adam.flat.device)
        if self.policy.discrete:
            return noise.exponential_().log_().neg_()
        return noise.normal_().mul_(self.log_std.exp())

    def act(self, obs: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(actions, values) for unmasked float vectors `[B, in]` with this step's row of `rollout_noise` `[B, A]`:
        Gumbel-max on the logits (a sample of softmax(logits)), or mean + std * N(0, 1). Called under
        `torch.no_grad()` (the rollout's)."""
        head, critic = self._output(obs).unbind(0)
        values = critic.select(1, 0)
        if self.policy.discrete:
            return (head + noise).argmax(-1), values
        return head + noise, values

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """`ActorCritic.value(obs)`, V `[B]` of float vectors `[B, in]`, with the module's kernels."""
        return self._output(obs)[1, :, 0]

    # --- the update ------------------------------------------------------------------------------------------------
    def __call__(self, obs, actions, advantages, returns):
        self.adam.check()
        loss, stats = self.gradient(obs, actions, advantages, returns)
        self.adam.step()  # all-reduce, clip, RMSprop (or Adam)
        return loss, stats

    @torch.inference_mode()  # no autograd here: its tensors skip view tracking and version counters
    def gradient(self, obs, actions, advantages, returns):
        """Write dL/dparameters into the flat gradient buffer; returns (loss, [policy loss, value loss, entropy])."""
        policy, batch = self.policy, obs.shape[0]
        # Forward through the two-member ensemble (member 0 actor, member 1 critic), keeping activations.
        hidden = ensemble_forward(obs.unsqueeze(0).expand(2, -1, -1), self.weights, self.biases, self.tanh)
        out = hidden[-1]
        head, values = out[0], out[1, :, 0]
        if self.normalize_advantage and batch > 1:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        log_probs, entropy, saved = head_log_prob_entropy(policy.discrete, head, actions, self.log_std)
        value_error = values - returns
        # [policy loss, value loss, entropy] = [-mean(A log pi), mean((V - R)^2), mean(H)]; L = their weighted sum
        stats = torch.stack((advantages * log_probs, value_error.square(), entropy)).mean(1).mul_(self._signs)
        loss = torch.dot(stats, self._loss_weights)

        # Output gradient [2, B, out]: actor head in member 0, value in member 1 column 0.
        grad_out = torch.zeros_like(out)
        grad_log_prob = advantages * (-1.0 / batch)
        head_grad(policy.discrete, saved, grad_log_prob, entropy, self.ent_coef, grad_out[0], self.log_std_grad)
        torch.mul(value_error, 2.0 * self.vf_coef / batch, out=grad_out[1, :, 0])

        # Backward through the ensemble MLP, writing straight into the flat gradient buffer.
        ensemble_backward(grad_out, hidden, self.weights, self.weight_grads, self.bias_grads, self.tanh)
        return loss, stats
