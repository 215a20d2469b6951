"""DQN's gradient step with the gradient written out by hand: one batched forward, no autograd, flat-buffer Adam.

The same update as `DQN._loss` + backward + clipping + `torch.optim.Adam` (checked step by step in
`tests/test_fused_dqn.py`), for the plain (non-dueling) Q-network, an MLP of `nn.Linear` layers with ReLU or
tanh. The online network evaluates `obs` and `next_obs` (for Double DQN's argmax) as one batch of 2B rows; the
target network evaluates `next_obs` in `prepare`, which DQN calls once for all the batches of an iteration's
gradient steps (the target network changes only after them), so that each step runs only the online network.
With d = Q(s, a) - y, the Huber loss mean(huber(d)) has gradient clamp(d, -1, 1) / B at Q(s, a) (the squared error
mean(d^2), `td_loss="mse"`: 2 d / B) and zero at the other actions; the backward pass of a linear layer
y = x W^T + b is dW = g^T x, db = sum g, dx = g W.
"""

from __future__ import annotations

import torch
from torch import nn

from rlspeed.accel.introspect import made_as
from rlspeed.fused.flat import (
    FlatAdam,
    activation_reason,
    linear_backward,
    linear_forward,
    sequential_linears,
    uncovered_parameters_reason,
)
from rlspeed.nn import QNetwork


def unsupported_reason(q_network: nn.Module, masking: bool = False) -> str | None:
    """Why `FusedDQNUpdate` cannot update this Q-network, or None when it can (non-dueling, an MLP with ReLU or
    tanh, trained without action masks)."""
    if masking:
        return "action masks (the hand-derived update's target maximises over all actions)"
    cls = made_as(q_network)
    if cls is not QNetwork:  # (a subclass's own forward, which the hand-derived update would not run)
        return f"the Q-network is a {cls.__name__}, not rlspeed's QNetwork MLP"
    encoder = getattr(q_network, "encoder", None)
    if encoder is not None:
        return f"a {encoder.kind} (the hand-derived update covers MLPs on float vectors)"
    if getattr(q_network, "dueling", True):
        return "dueling=true (the hand-derived update covers plain Q-network MLPs)"
    found = sequential_linears(q_network.body)
    if found is None:
        layers = list(q_network.body)  # (Linear, activation, ...: the first activation names the kind)
        return ((len(layers) > 1 and activation_reason(layers[1]))
                or "a Q-network that is not a plain MLP (the hand-derived update covers tanh and relu MLPs)")
    if len(found[0]) < 2:
        return "net_arch=[] (the hand-derived update covers MLPs with hidden layers)"
    return uncovered_parameters_reason(q_network, [p for layer in found[0] for p in (layer.weight, layer.bias)],
                                       "Q-network")


class FusedDQNUpdate:
    """One DQN gradient step: `update(obs, actions, rewards, next_obs, terminated, discounts) -> (loss, metrics)`."""

    def __init__(self, q_network: nn.Module, q_target: nn.Module, optimizer: torch.optim.Optimizer, *,
                 max_grad_norm: float | None, double_q: bool, td_loss: str = "huber", strategy=None):
        if unsupported_reason(q_network) is not None:
            raise ValueError("FusedDQNUpdate needs a non-dueling Q-network whose body is an MLP with ReLU or tanh.")
        self.double_q, self.mse = double_q, td_loss == "mse"
        linears, self.tanh = sequential_linears(q_network.body)
        params = [p for layer in linears for p in (layer.weight, layer.bias)]
        self.adam = FlatAdam(params, optimizer, max_grad_norm=max_grad_norm, strategy=strategy)
        self.weights, self.biases = self.adam.param_views[0::2], self.adam.param_views[1::2]
        self.weight_grads, self.bias_grads = self.adam.grad_views[0::2], self.adam.grad_views[1::2]
        self.target_linears = sequential_linears(q_target.body)[0]

    def follow(self, config) -> None:
        """Take `config.double_q` and `td_loss` as they are now (a callback may change them between iterations; the
        autograd loss reads them at every step)."""
        self.double_q, self.mse = bool(config.double_q), config.td_loss == "mse"

    def __call__(self, obs, actions, rewards, next_obs, terminated, discounts):
        return self.step_prepared(obs, next_obs, self.prepare(actions, rewards, next_obs, terminated, discounts))

    def step_prepared(self, obs, next_obs, prepared):
        """The gradient step on a batch whose target-network part `prepare` computed (maybe for many batches at
        once, while the target network stays fixed): `prepared` is the batch's rows of its result."""
        self.adam.check()
        loss, metrics = self._gradient(obs, next_obs, *prepared)
        self.adam.step()  # all-reduce, clip, Adam
        return loss, metrics

    def prepare(self, actions, rewards, next_obs, terminated, discounts) -> tuple[torch.Tensor, ...]:
        """What the gradient needs that the online network does not change, per row: the taken actions as a gather
        index `[R, 1]`, then the TD target y = r + gamma^m (1 - d) max_a Q_target(s', a) `[R]`, or for Double DQN
        (whose a' = argmax_a Q(s', a) comes from the online network) the rewards `[R]`, gamma^m (1 - d) `[R]` and
        Q_target(s', .) `[R, A]`. One target-network pass for all rows given (in inference mode, as the gradient)."""
        with torch.inference_mode():
            target_linears = self.target_linears
            next_q_target = linear_forward(next_obs.flatten(1), [layer.weight for layer in target_linears],
                                           [layer.bias for layer in target_linears], self.tanh)[-1]
            bootstrap = discounts * (1 - terminated)
            index = actions.long().unsqueeze(1)
            if self.double_q:
                return index, rewards, bootstrap, next_q_target
            return index, torch.addcmul(rewards, bootstrap, next_q_target.max(dim=1).values)

    def gradient(self, obs, actions, rewards, next_obs, terminated, discounts):
        """Write dL/dparameters into the flat gradient buffer; returns (loss, {"loss", "q_values"})."""
        return self._gradient(obs, next_obs, *self.prepare(actions, rewards, next_obs, terminated, discounts))

    @torch.inference_mode()  # no autograd here: its tensors skip view tracking and version counters
    def _gradient(self, obs, next_obs, index, *target):
        obs = obs.flatten(1)
        batch = obs.shape[0]
        if self.double_q:  # the online network on obs and next_obs together: one pass of 2B rows
            rewards, bootstrap, next_q_target = target
            outputs = linear_forward(torch.cat((obs, next_obs.flatten(1))), self.weights, self.biases, self.tanh)
            next_actions = outputs[-1][batch:].argmax(dim=1, keepdim=True)
            target_q = torch.addcmul(rewards, bootstrap, next_q_target.gather(1, next_actions).squeeze(1))
            outputs = [o[:batch] for o in outputs]
        else:
            (target_q,) = target
            outputs = linear_forward(obs, self.weights, self.biases, self.tanh)

        q_values = outputs[-1].gather(1, index).squeeze(1)
        if self.mse:
            loss = torch.nn.functional.mse_loss(q_values, target_q)
            grad_q = (q_values - target_q).mul_(2.0 / batch)  # its gradient at Q(s, a)
        else:
            loss = torch.nn.functional.smooth_l1_loss(q_values, target_q)  # Huber
            grad_q = (q_values - target_q).clamp_(-1.0, 1.0).div_(batch)
        grad = torch.zeros_like(outputs[-1]).scatter_(1, index, grad_q.unsqueeze(1))

        linear_backward(grad, outputs, self.weights, self.weight_grads, self.bias_grads, self.tanh)
        return loss, {"loss": loss, "q_values": q_values.mean()}
