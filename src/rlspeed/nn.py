"""Networks and action distributions shared by the algorithms.

The distributions are written as plain tensor maths (no `torch.distributions` objects): that keeps the hot path
to a few kernels, free of argument validation and Python objects, and compilable.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from rlspeed.errors import UserError

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU, "silu": nn.SiLU}


def mlp(in_dim: int, hidden: Sequence[int], out_dim: int, activation: str = "tanh",
        out_gain: float = 1.0) -> nn.Sequential:
    """An MLP with orthogonal initialisation (gain sqrt(2) on hidden layers, `out_gain` on the last)."""
    if activation not in ACTIVATIONS:
        raise UserError(f"Unknown activation '{activation}': use one of {', '.join(ACTIVATIONS)}.")
    layers: list[nn.Module] = []
    last = in_dim
    for width in hidden:
        layers += [_init(nn.Linear(last, int(width)), math.sqrt(2)), ACTIVATIONS[activation]()]
        last = int(width)
    layers.append(_init(nn.Linear(last, out_dim), out_gain))
    return nn.Sequential(*layers)


def _init(layer: nn.Linear, gain: float) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


class ActorCritic(nn.Module):
    """Separate actor and critic MLPs over a flat observation.

    Discrete actions: the actor gives logits. Box actions: the actor gives the Gaussian mean and `log_std` is a
    state-independent parameter. `act` samples; `evaluate` gives log-prob, entropy and value of stored actions.
    """

    def __init__(self, obs_dim: int, action_dim: int, discrete: bool, hidden: Sequence[int] = (64, 64),
                 activation: str = "tanh", log_std_init: float = 0.0):
        super().__init__()
        self.discrete = discrete
        self.actor = mlp(obs_dim, hidden, action_dim, activation, out_gain=0.01)
        self.critic = mlp(obs_dim, hidden, 1, activation, out_gain=1.0)
        if not discrete:
            self.log_std = nn.Parameter(torch.full((action_dim,), float(log_std_init)))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(actor output, value): logits or Gaussian mean, and V(obs)."""
        return self.actor(obs), self.value(obs)

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample actions. Returns (actions, log_probs, values)."""
        out, value = self(obs)
        if self.discrete:
            log_p = torch.log_softmax(out, dim=-1)
            if deterministic:
                actions = out.argmax(-1)
            else:  # Gumbel-max: one fused sample, no torch.distributions object
                gumbel = -torch.log(-torch.log(torch.rand_like(out).clamp_(1e-20, 1.0)))
                actions = (log_p + gumbel).argmax(-1)
            return actions, log_p.gather(-1, actions.unsqueeze(-1)).squeeze(-1), value
        std = self.log_std.exp()
        actions = out if deterministic else out + std * torch.randn_like(out)
        return actions, gaussian_log_prob(actions, out, self.log_std), value

    def evaluate(self, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(log_probs, entropy, values) of given actions under the current policy."""
        out, value = self(obs)
        if self.discrete:
            log_p = torch.log_softmax(out, dim=-1)
            log_prob = log_p.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
            entropy = -(log_p.exp() * log_p).sum(-1)
            return log_prob, entropy, value
        entropy = (0.5 + 0.5 * math.log(2 * math.pi) + self.log_std).sum().expand(out.shape[0])
        return gaussian_log_prob(actions, out, self.log_std), entropy, value


def gaussian_log_prob(actions: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """Log-density of a diagonal Gaussian, summed over the action dimension."""
    z = (actions - mean) * torch.exp(-log_std)
    return (-0.5 * z.square() - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)


def make_adam(params, lr: float, device: torch.device, eps: float = 1e-5) -> torch.optim.Optimizer:
    """Adam with the fused kernel where the backend has one (CPU and CUDA), else the foreach version."""
    params = list(params)
    if device.type in ("cpu", "cuda"):
        try:
            return torch.optim.Adam(params, lr=lr, eps=eps, fused=True)
        except (RuntimeError, TypeError):
            pass
    return torch.optim.Adam(params, lr=lr, eps=eps, foreach=True)
