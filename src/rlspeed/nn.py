"""Networks and action distributions shared by the algorithms.

The distributions are written as plain tensor maths (no `torch.distributions` objects): that keeps the hot path
to a few kernels, free of argument validation and Python objects, and compilable.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from rlspeed.errors import UserError

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0  # SAC's actor: log std clamped to this range
LOG_2PI = math.log(2 * math.pi)
LOG_2 = math.log(2.0)

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


class EnsembleMLP(nn.Module):
    """K MLPs of the same shape evaluated together: each layer is one batched matmul (`baddbmm`) for all K.

    For small RL networks the cost is per kernel launch, not per FLOP, so K networks cost about as much as one.
    Input `[B, in]` (shared by all members) or `[K, B, in]`; output `[K, B, out]`. Member k is initialised like
    `mlp(...)` with `out_gains[k]` on its last layer.
    """

    def __init__(self, num_members: int, in_dim: int, hidden: Sequence[int], out_dim: int, activation: str = "tanh",
                 out_gains: Sequence[float] | None = None):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise UserError(f"Unknown activation '{activation}': use one of {', '.join(ACTIVATIONS)}.")
        self.num_members = num_members
        self.activation = ACTIVATIONS[activation]()
        out_gains = list(out_gains) if out_gains is not None else [1.0] * num_members
        dims = [in_dim, *[int(w) for w in hidden], out_dim]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for layer, (fan_in, fan_out) in enumerate(zip(dims[:-1], dims[1:])):
            last = layer == len(dims) - 2
            weight = torch.empty(num_members, fan_in, fan_out)
            for k in range(num_members):
                # orthogonal_ on the [out, in] view, as nn.Linear would be initialised
                nn.init.orthogonal_(weight[k].T, out_gains[k] if last else math.sqrt(2))
            self.weights.append(nn.Parameter(weight))
            self.biases.append(nn.Parameter(torch.zeros(num_members, 1, fan_out)))

    def forward(self, x: torch.Tensor, members: slice | None = None, detached: bool = False) -> torch.Tensor:
        """Outputs `[K, B, out]`. `members` (a slice) evaluates only those members, e.g. `slice(0, 1)`;
        `detached` uses the weights as constants: gradients flow to `x` only (e.g. an actor's loss through a critic).
        """
        num_members = self.num_members if members is None else len(range(self.num_members)[members])
        if x.dim() == 2:
            x = x.unsqueeze(0).expand(num_members, -1, -1)
        last = len(self.weights) - 1
        for layer, (weight, bias) in enumerate(zip(self.weights, self.biases)):
            if members is not None:
                weight, bias = weight[members], bias[members]
            if detached:
                weight, bias = weight.detach(), bias.detach()
            x = torch.baddbmm(bias, x, weight)
            if layer < last:
                x = self.activation(x)
        return x


class QEnsemble(nn.Module):
    """K state-action value networks Q_k(s, a) held as one `EnsembleMLP`: all K evaluated in one batched pass.

    Used for the twin critics of SAC and TD3 (K=2) and DDPG's single critic (K=1). `forward(obs, actions)`
    takes `[B, obs_dim]` and `[B, action_dim]` and returns Q-values `[K, B]`.
    """

    def __init__(self, num_members: int, obs_dim: int, action_dim: int, hidden: Sequence[int] = (256, 256),
                 activation: str = "relu"):
        super().__init__()
        self.num_members = num_members
        self.body = EnsembleMLP(num_members, obs_dim + action_dim, hidden, 1, activation)

    def forward(self, obs: torch.Tensor, actions: torch.Tensor, members: slice | None = None,
                detached: bool = False) -> torch.Tensor:
        """Q-values `[K, B]` (or `[len(members), B]` for a slice of the members); see `EnsembleMLP.forward`."""
        return self.body(torch.cat((obs, actions), dim=-1), members, detached).squeeze(-1)


class ActorCritic(nn.Module):
    """Actor and critic MLPs (same hidden sizes, separate weights) evaluated as one two-member ensemble.

    Discrete actions: the actor gives logits. Box actions: the actor gives the Gaussian mean and `log_std` is
    a state-independent parameter. `act` samples; `evaluate` gives log-prob, entropy and value of stored actions.
    """

    def __init__(self, obs_dim: int, action_dim: int, discrete: bool, hidden: Sequence[int] = (64, 64),
                 activation: str = "tanh", log_std_init: float = 0.0):
        super().__init__()
        self.discrete = discrete
        self.action_dim = action_dim
        # member 0 = actor (small last-layer gain: near-uniform initial policy), member 1 = critic
        self.body = EnsembleMLP(2, obs_dim, hidden, action_dim, activation, out_gains=(0.01, 1.0))
        if not discrete:
            self.log_std = nn.Parameter(torch.full((action_dim,), float(log_std_init)))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """V(obs) `[B]` for flat observations `[B, obs_dim]`: the critic output of `forward`."""
        return self(obs)[1]

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(actor output, value): logits or Gaussian mean `[B, A]`, and V(obs) `[B]`."""
        out = self.body(obs)
        return out[0], out[1, :, 0]

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample actions. Returns (actions, log_probs, values)."""
        out, value = self(obs)
        if self.discrete:
            log_p = torch.log_softmax(out, dim=-1)
            if deterministic:
                actions = out.argmax(-1)
            else:  # Gumbel-max with -log(E), E ~ Exp(1), as the Gumbel noise: four kernels, no distribution object
                actions = (log_p - torch.empty_like(out).exponential_().log_()).argmax(-1)
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


def clip_grad_norm(params: Sequence[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale gradients so their global L2 norm is at most `max_norm`; returns the norm before clipping.

    The same maths as `torch.nn.utils.clip_grad_norm_` in a handful of foreach kernels and no host sync
    (the library version spends dozens of small ops grouping tensors by device and dtype).
    """
    grads = [p.grad for p in params if p.grad is not None]
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    torch._foreach_mul_(grads, (max_norm / (total + 1e-6)).clamp(max=1.0))
    return total


class SquashedGaussianActor(nn.Module):
    """pi(a|s): a = tanh(u), u ~ N(mu(s), sigma(s)); actions in [-1, 1] (the algorithm rescales them to the Box)."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: Sequence[int], activation: str = "relu"):
        super().__init__()
        self.net = mlp(obs_dim, hidden, 2 * action_dim, activation, out_gain=0.01)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, log_std) of the Gaussian before the tanh squashing."""
        mean, log_std = self.net(obs).chunk(2, dim=-1)
        return mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)

    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterised sample: (actions in [-1, 1], log_pi) with the tanh change-of-variables correction."""
        mean, log_std = self(obs)
        noise = torch.randn_like(mean)
        u = mean + log_std.exp() * noise
        actions = torch.tanh(u)
        # log pi(a|s) = log N(u; mu, sigma) - sum log(1 - tanh(u)^2)   (SAC paper, appendix C), with
        # log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)) written in its numerically stable form.
        log_prob_u = -0.5 * noise.square() - log_std - 0.5 * LOG_2PI
        log_pi = (log_prob_u - 2 * (LOG_2 - u - F.softplus(-2 * u))).sum(-1)
        return actions, log_pi

    def deterministic(self, obs: torch.Tensor) -> torch.Tensor:
        """The mode's squashed mean, tanh(mu(s)): the action used for evaluation."""
        return torch.tanh(self(obs)[0])


class DeterministicActor(nn.Module):
    """mu(s) = tanh(MLP(s)): actions in [-1, 1] (the algorithm rescales them to the Box)."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: Sequence[int], activation: str = "relu"):
        super().__init__()
        self.net = mlp(obs_dim, hidden, action_dim, activation, out_gain=0.01)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.net(obs))


class QNetwork(nn.Module):
    """Q(s, .) for all actions. Dueling (Wang et al., 2016): Q(s, a) = V(s) + A(s, a) - mean_a' A(s, a')."""

    def __init__(self, obs_dim: int, num_actions: int, hidden: Sequence[int], activation: str = "relu",
                 dueling: bool = False):
        super().__init__()
        self.dueling = dueling
        if dueling:
            # shared body, then one linear layer giving V (column 0) and A (the other columns) together
            self.body = nn.Sequential(mlp(obs_dim, hidden[:-1], hidden[-1], activation), ACTIVATIONS[activation]())
            self.head = nn.Linear(hidden[-1], 1 + num_actions)
        else:
            self.body = mlp(obs_dim, hidden, num_actions, activation)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if not self.dueling:
            return self.body(obs)
        out = self.head(self.body(obs))
        value, advantages = out[:, :1], out[:, 1:]
        return value + advantages - advantages.mean(dim=1, keepdim=True)


class SequenceLayout:
    """Where each step of a `[T, B]` block of sequences sits when the block is cut into episode segments.

    An LSTM cannot reset its state in the middle of one fused call, so `RecurrentActorCritic.sequence_features`
    runs each segment (a stretch of one column between episode starts) as its own sequence: `rows` `[L, S]` picks
    segment s's step l from the `T * B` steps (padding repeats a valid step; its output is never read), `columns`
    and `continues` give each segment's column and whether it continues the column's stored initial state (it
    starts at t = 0) rather than a fresh episode, and `inverse` `[T * B]` puts the `L * S` outputs back in step
    order. Built on the host from the episode starts (one transfer per layout, not per step).
    """

    def __init__(self, episode_starts: torch.Tensor, device: torch.device):
        starts = episode_starts.to("cpu", torch.bool)  # ok-sync: once per layout (per rollout or minibatch)
        steps, columns = starts.shape
        begins = starts.clone()
        begins[0] = True
        column, first = begins.T.nonzero(as_tuple=True)  # segments sorted by column, then by start
        same_column = torch.cat((column[1:] == column[:-1], torch.tensor([False])))
        end = torch.where(same_column, torch.cat((first[1:], first.new_tensor([steps]))), steps)
        length = end - first
        self.num_segments, self.max_length = int(column.numel()), int(length.max())
        offset = torch.arange(self.max_length).view(-1, 1)
        valid = offset < length.view(1, -1)
        rows = (first.view(1, -1) + torch.minimum(offset, length.view(1, -1) - 1)) * columns + column.view(1, -1)
        inverse = torch.empty(steps * columns, dtype=torch.long)
        inverse[rows[valid]] = torch.arange(rows.numel()).view_as(rows)[valid]
        self.rows = rows.to(device)
        self.inverse = inverse.to(device)
        self.columns = column.to(device)
        self.continues = (first == 0).to(device)


class RecurrentActorCritic(ActorCritic):
    """sb3-contrib's `MlpLstmPolicy` with `enable_critic_lstm`: an LSTM actor and an LSTM critic over the flat
    observation, each followed by an MLP head (`ActorCritic`'s two-member ensemble, fed the LSTM outputs).

    The recurrent state of N envs is one tensor `[4, N, H]`: (h, c) of the actor, then (h, c) of the critic.
    `act_step`/`value_step` advance it one step (the rollout, bootstrapping); `sequence_features` re-runs both LSTMs
    over stored sequences for the update, zeroing the state where an episode starts.
    """

    def __init__(self, obs_dim: int, action_dim: int, discrete: bool, lstm_hidden_size: int = 64,
                 hidden: Sequence[int] = (64,), activation: str = "relu", log_std_init: float = 0.0):
        if lstm_hidden_size < 1:
            raise UserError(f"lstm_hidden_size must be >= 1, got {lstm_hidden_size}: the LSTM needs a state.")
        super().__init__(lstm_hidden_size, action_dim, discrete, hidden, activation, log_std_init)
        self.hidden_size = int(lstm_hidden_size)
        # PyTorch's default LSTM initialisation, as sb3-contrib keeps it (its orthogonal init skips the LSTMs)
        self.lstm_actor = nn.LSTM(obs_dim, self.hidden_size)
        self.lstm_critic = nn.LSTM(obs_dim, self.hidden_size)

    def initial_state(self, num_envs: int) -> torch.Tensor:
        """The state at an episode start: zeros `[4, num_envs, H]`."""
        weight = self.lstm_actor.weight_hh_l0
        return torch.zeros(4, num_envs, self.hidden_size, device=weight.device, dtype=weight.dtype)

    @staticmethod
    def _cell(lstm: nn.LSTM, obs: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One step of a one-layer `nn.LSTM` with its own weights (no sequence-call overhead)."""
        return torch.lstm_cell(obs, (h, c), lstm.weight_ih_l0, lstm.weight_hh_l0, lstm.bias_ih_l0, lstm.bias_hh_l0)

    def step(self, obs: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Both LSTMs one step from `state` (already zeroed where an episode starts): (features `[2, N, H]` for the
        heads, next state `[4, N, H]`)."""
        h_actor, c_actor = self._cell(self.lstm_actor, obs, state[0], state[1])
        h_critic, c_critic = self._cell(self.lstm_critic, obs, state[2], state[3])
        return torch.stack((h_actor, h_critic)), torch.stack((h_actor, c_actor, h_critic, c_critic))

    def act_step(self, obs: torch.Tensor, state: torch.Tensor, deterministic: bool = False):
        """One rollout step: (actions, log_probs, values, next state)."""
        features, next_state = self.step(obs, state)
        actions, log_probs, values = self.act(features, deterministic)
        return actions, log_probs, values, next_state

    def actor_step(self, obs: torch.Tensor, h: torch.Tensor, c: torch.Tensor, deterministic: bool = True):
        """The actor alone (inference, `predict`): (actions, h, c) from the actor's state `[N, H]` each."""
        h, c = self._cell(self.lstm_actor, obs, h, c)
        actions, _, _ = self.act(torch.stack((h, torch.zeros_like(h))), deterministic)  # critic head on zeros: unused
        return actions, h, c

    def value_step(self, obs: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """V `[N]` of observations reached from `state` (the critic LSTM one step, then its head)."""
        h, _ = self._cell(self.lstm_critic, obs, state[2], state[3])
        return self.body(h.unsqueeze(0), members=slice(1, 2))[0, :, 0]

    def sequence_features(self, obs: torch.Tensor, state: torch.Tensor, episode_starts: torch.Tensor,
                          layout: SequenceLayout | None = None) -> torch.Tensor:
        """Both LSTMs over sequences: obs `[T, B, D]` from `state` `[4, B, H]` (the state stored at t = 0, already
        reset where it starts an episode), zeroing the state where `episode_starts` `[T, B]` is set at t > 0.
        Returns features `[2, T * B, H]` in step order (t-major).

        Without a `layout`, a loop over the T steps (the reference, fixed shapes); with one (built from the same
        episode starts), one fused `nn.LSTM` call per LSTM over the episode segments, padded to the longest.
        """
        steps, batch = obs.shape[:2]
        if layout is None:
            keep = (~episode_starts).to(state.dtype).view(steps, 1, batch, 1)
            outputs = []
            for t in range(steps):
                if t > 0:
                    state = state * keep[t]
                features, state = self.step(obs[t], state)
                outputs.append(features)
            return torch.stack(outputs, dim=1).flatten(1, 2)
        segments = obs.flatten(0, 1)[layout.rows]  # [L, S, D]
        initial = state[:, layout.columns] * layout.continues.to(state.dtype).view(1, -1, 1)  # [4, S, H]
        actor, _ = self.lstm_actor(segments, (initial[0:1].contiguous(), initial[1:2].contiguous()))
        critic, _ = self.lstm_critic(segments, (initial[2:3].contiguous(), initial[3:4].contiguous()))
        return torch.stack((actor, critic)).flatten(1, 2)[:, layout.inverse]
