"""SAC's gradient step with the gradients written out by hand: no autograd, flat-buffer Adam.

The same update as `SAC`'s autograd steps (`_critic_loss`, its Adam step, then `_actor_loss`, its Adam step) and
the Polyak step (checked in `tests/test_fused_sac.py`), for the default networks: a `SquashedGaussianActor` whose
body is an MLP of `nn.Linear` layers and a `QEnsemble` of K critics, both with ReLU or tanh.

- The actor runs once on [next_obs; obs] (2B rows): the first half gives a' for the soft Bellman target, the second
  the reparameterised a~ of the actor loss (the critics' step does not change the actor).
- The critics run on (obs, a): Q_k(s, a) of the critic loss, whose gradient gives the critics' weight gradients;
  the critics' part of the flat Adam steps; then they run again, updated, on (obs, a~): Q_k(s, a~) of the actor
  loss, whose gradient reaches only a~ (the critics held constant); then the actor's and temperature's part steps.
- The actor's chain, with u = mean + std * noise, a = tanh(u), d log pi / du = 2 tanh(u) = 2a (from the stable
  form of log(1 - tanh(u)^2)) and d log pi / d log_std = -1 beyond u's own dependence:
      dJ/du = dJ/da (1 - a^2) + (alpha / B) 2a,   dJ/dmean = dJ/du,   dJ/dlog_std = dJ/du std noise - alpha / B
  (zero where log_std was clamped).
- Temperature: dJ/dlog_alpha = -mean(log pi + target_entropy).
"""

from __future__ import annotations

import copy
import weakref

import torch
from torch import nn

from rlspeed.accel.introspect import made_as
from rlspeed.fused.flat import (
    FlatAdam,
    Workspace,
    activation_reason,
    copy_attributes,
    ensemble_backward,
    ensemble_forward,
    ensemble_input_grad,
    ensemble_rows_input_grad,
    hold_in,
    linear_backward,
    linear_forward,
    reduced_matmuls,
    sequential_linears,
    uncovered_parameters_reason,
)
from rlspeed.nn import LOG_2, LOG_2PI, LOG_STD_MAX, LOG_STD_MIN, QEnsemble, SquashedGaussianActor


def unsupported_reason(actor: nn.Module, critic: nn.Module) -> str | None:
    """Why `FusedSACUpdate` cannot update these networks, or None when it can (an MLP actor body with ReLU or tanh,
    critics with ReLU or tanh), rlspeed's own classes (a subclass's forward is not what it computes)."""
    for network, base in ((actor, SquashedGaussianActor), (critic, QEnsemble)):
        cls = made_as(network)
        if cls is not base:
            return f"the {'actor' if base is SquashedGaussianActor else 'critic'} is a {cls.__name__}, not rlspeed's " \
                   f"{base.__name__} MLP"
    for network in (actor, critic):
        encoder = getattr(network, "encoder", None)
        if encoder is not None:
            return f"a {encoder.kind} (the hand-derived update covers MLPs on float vectors)"
    body = sequential_linears(getattr(actor, "net", None))
    if body is not None and len(body[0]) < 2:
        return "net_arch=[] (the hand-derived update covers MLPs with hidden layers)"
    reason = activation_reason(critic.body.activation)  # (the actor's is the same: one config's activation)
    if reason or body is None:
        return reason or "an actor that is not a plain MLP (the hand-derived update covers tanh and relu MLPs)"
    return (uncovered_parameters_reason(actor, [p for layer in body[0] for p in (layer.weight, layer.bias)], "actor")
            or uncovered_parameters_reason(critic, [*critic.body.parameters()], "critic"))


class FusedSACUpdate:
    """One SAC gradient step plus the Polyak update of the target critics.

    `update(obs, actions, rewards, next_obs, terminated, discounts) -> (loss, metrics)`: the losses' sum and the
    metrics of `SAC._critic_loss` and `SAC._actor_loss`, on every `metrics_every`-th call (the first included); the
    other calls return `(None, {})`. The gradient needs neither the loss nor the metrics, so most steps skip
    computing them.
    `params` is the order of the optimizer's parameters: actor, critics, then log_alpha when it is learnt.
    """

    def __init__(self, sac, *, strategy=None, metrics_every: int = 8):
        self.metrics_every, self._calls = metrics_every, 0
        actor, critic = sac.actor, sac.critic
        if unsupported_reason(actor, critic) is not None:
            raise ValueError("FusedSACUpdate needs an MLP actor and critics with ReLU or tanh.")

        # (a weak reference: SAC holds this update, which would otherwise hold SAC in a reference cycle)
        self._sac, self.log_std_min, self.log_std_max = weakref.ref(sac), LOG_STD_MIN, LOG_STD_MAX
        linears, self.actor_tanh = sequential_linears(actor.net)
        self.critic_tanh = isinstance(critic.body.activation, nn.Tanh)
        actor_params = [p for layer in linears for p in (layer.weight, layer.bias)]
        critic_params = [*critic.body.weights, *critic.body.biases]
        params = [*actor_params, *critic_params, *([sac.log_alpha] if sac.autotune else [])]
        self.adam = FlatAdam(params, sac.optimizer, strategy=strategy)
        views, grads = self.adam.param_views, self.adam.grad_views
        n_actor, n_layers = len(actor_params), len(critic.body.weights)
        self.actor_weights, self.actor_biases = views[0:n_actor:2], views[1:n_actor:2]
        self.actor_weight_grads, self.actor_bias_grads = grads[0:n_actor:2], grads[1:n_actor:2]
        critic_views, critic_grads = views[n_actor:n_actor + 2 * n_layers], grads[n_actor:n_actor + 2 * n_layers]
        self.critic_weights, self.critic_biases = critic_views[:n_layers], critic_views[n_layers:]
        self.critic_weight_grads, self.critic_bias_grads = critic_grads[:n_layers], critic_grads[n_layers:]
        self.log_alpha_grad = grads[-1] if sac.autotune else None
        # The target critics as views of one flat buffer laid out like the critics' slice of the flat parameters:
        # the Polyak update is one lerp.
        start = sum(p.numel() for p in actor_params)
        self._critic_flat = self.adam.flat[start:start + sum(p.numel() for p in critic_params)]
        target_params = [*sac.critic_target.body.weights, *sac.critic_target.body.biases]
        with torch.no_grad():
            self._target_flat = torch.cat([p.detach().reshape(-1) for p in target_params])
        hold_in(self._target_flat, target_params)
        self.target_weights = [p.detach() for p in sac.critic_target.body.weights]
        self.target_biases = [p.detach() for p in sac.critic_target.body.biases]
        self.workspace = Workspace()  # activations and gradients, reused from step to step
        # dJ/da~ through each critic only at the rows where it is the minimum: on a CPU, where choosing those rows
        # (`nonzero`) costs no device synchronisation, for critics wide enough (>= 256) that the products saved
        # outweigh the few dozen extra kernels; narrower critics lose. Not in a bf16-matmul region, where a half-height
        # product costs nearly what the full one does, so the selection only adds work. Re-measure with
        # tests/test_fused_sac.py's select_rows switch and benchmarks/fused_updates.py.
        self.select_rows = sac.device.type == "cpu" and max(w.shape[-1] for w in self.critic_weights[:-1]) >= 256
        # each critic's weights transposed, the first layer's only at the action inputs (views of the flat buffer)
        obs_dim = sac.spec.obs_dim
        self._member_weights_t = [[self.critic_weights[0][k][obs_dim:].t(),
                                   *(weight[k].t() for weight in self.critic_weights[1:])]
                                  for k in range(self.critic_weights[0].shape[0])]
        self._log_pi_constant = sac.spec.action_dim * (2 * LOG_2 + 0.5 * LOG_2PI)  # see gradient's log pi
        # the flat buffers' parts: the critics', then the actor's and the temperature's (each steps in its turn)
        actor_end = sum(p.numel() for p in actor_params)
        critic_end = actor_end + sum(p.numel() for p in critic_params)
        self._critic_parts = [slice(actor_end, critic_end)]
        self._actor_parts = [slice(0, actor_end)] + ([slice(critic_end, None)] if sac.autotune else [])


    @property
    def sac(self):
        """The SAC model this update steps."""
        sac = self._sac()
        if sac is None:
            raise ReferenceError("This update step's model has been deleted.")
        return sac

    def __getstate__(self) -> dict:  # (pickled with its model: the reference is made strong for the pickle)
        return {**self.__dict__, "_sac": self.sac}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _sac=weakref.ref(state["_sac"]))
    def __deepcopy__(self, memo: dict):
        """A copy whose target critics become views of its own flat buffer again at its first update (a Parameter's
        deepcopy clones its data, and the copied model is not whole yet while this is copied; `FlatAdam.__deepcopy__`
        re-points the online parameters)."""
        new = copy_attributes(self, memo)
        new._sac = weakref.ref(copy.deepcopy(self.sac, memo))  # (a weak reference copies as itself: the copy's model)
        new._copied = True
        return new

    def _repoint_targets(self) -> None:
        """After a deepcopy: the copied target critics' parameters as views of the copied flat buffer."""
        body = self.sac.critic_target.body
        hold_in(self._target_flat, [*body.weights, *body.biases])
        self.target_weights = [p.detach() for p in body.weights]
        self.target_biases = [p.detach() for p in body.biases]
        self._copied = False

    def _critic_step(self) -> None:
        """The critics' part of the Adam step (between the critics' gradient and the actor's)."""
        self.adam.step(self._critic_parts)

    def __call__(self, obs, actions, rewards, next_obs, terminated, discounts):
        if getattr(self, "_copied", False):
            self._repoint_targets()
        self.adam.check()
        if self.sac.critic_target.body.weights[0].data_ptr() != self._target_flat.data_ptr():
            raise RuntimeError("The target critics were replaced after FusedSACUpdate was built.")
        with_metrics = self._calls % self.metrics_every == 0
        self._calls += 1
        loss, metrics = self.gradient(obs, actions, rewards, next_obs, terminated, discounts, with_metrics,
                                      between=self._critic_step)
        self.adam.step(self._actor_parts, advance=False)
        with torch.no_grad():
            self._target_flat.lerp_(self._critic_flat, self.sac.config.tau)  # Polyak
        return loss, metrics

    @torch.inference_mode()
    def gradient(self, obs, actions, rewards, next_obs, terminated, discounts, with_metrics: bool = True,
                 between=None):
        """Write dJ/dparameters into the flat gradient buffer; returns (loss, metrics), or (None, {}) without
        `with_metrics`. `between()` runs after the critics' gradient is written and before the actor's, which goes
        through the critics as they are then (the update passes the critics' Adam step; without it, as the
        matmul-precision search calls it, both gradients are at the current parameters).

        Runs in inference mode (nothing here is for autograd): its own tensors skip view tracking and version
        counters, which autograd-free code does not need. The loss and metrics are inference tensors: read them,
        or compute with them, but do not modify them in place.
        """
        sac = self.sac
        obs, next_obs = obs.flatten(1), next_obs.flatten(1)
        batch = obs.shape[0]
        log_alpha = self.adam.param_views[-1] if sac.autotune else sac.log_alpha
        alpha = log_alpha.exp()

        # Actor on [next_obs; obs]: a' and a~ with their log-probabilities.
        ws = self.workspace
        actor_out = linear_forward(torch.cat((next_obs, obs)), self.actor_weights, self.actor_biases,
                                   self.actor_tanh, ws, "actor")
        mean, raw_log_std = actor_out[-1].chunk(2, dim=-1)
        log_std = raw_log_std.clamp(self.log_std_min, self.log_std_max)
        std = log_std.exp()
        # (drawn row-major whatever the head's layout: the numbers the reference's randn_like gives its rows)
        noise = torch.randn(mean.shape, dtype=mean.dtype, device=mean.device)
        u = torch.addcmul(mean, std, noise)
        squashed = torch.tanh(u)
        # log pi = sum(-noise^2 / 2 - log_std - log(2 pi) / 2 - 2 (log 2 - u - softplus(-2u)))
        #        = sum(2 (softplus(-2u) + u) - log_std - noise^2 / 2) - A (2 log 2 + log(2 pi) / 2), A action dims
        log_pi = (torch.nn.functional.softplus(u.mul(-2.0)).add_(u).mul_(2.0).sub_(log_std)
                  .addcmul_(noise, noise, value=-0.5).sum(-1).sub_(self._log_pi_constant))
        next_actions, pi_actions = squashed[:batch], squashed[batch:]
        next_log_pi, pi_log_pi = log_pi[:batch], log_pi[batch:]

        # Soft Bellman target from the target critics.
        members = self.critic_weights[0].shape[0]
        next_q = ensemble_forward(torch.cat((next_obs, next_actions), -1).expand(members, -1, -1),
                                  self.target_weights, self.target_biases, self.critic_tanh, ws, "target")[-1]
        next_q = next_q.squeeze(-1).amin(0).sub_(alpha * next_log_pi)
        target_q = torch.addcmul(rewards, discounts * torch.rsub(terminated, 1.0), next_q)

        # Critics on (obs, a): the critic loss's gradient, then (`between`) their step.
        obs_dim = obs.shape[1]
        critic_out = ensemble_forward(torch.cat((obs, actions), -1).expand(members, -1, -1), self.critic_weights,
                                      self.critic_biases, self.critic_tanh, ws, "critic")
        q_values = critic_out[-1].squeeze(-1)  # [K, B]
        td_error = q_values - target_q
        ensemble_backward(td_error.mul(1.0 / batch).unsqueeze(-1), critic_out, self.critic_weights,
                          self.critic_weight_grads, self.critic_bias_grads, self.critic_tanh, workspace=ws,
                          tag="critic")
        if between is not None:
            between()

        # Critics (as they are now) on (obs, a~): dJ/da~ of the actor loss, -1/B through the minimum member (shared
        # on ties), the critics' weights held constant.
        pi_out = ensemble_forward(torch.cat((obs, pi_actions), -1).expand(members, -1, -1), self.critic_weights,
                                  self.critic_biases, self.critic_tanh, ws, "critic pi")
        q_pi_all = pi_out[-1].squeeze(-1)  # [K, B]
        q_pi = q_pi_all.amin(0)
        at_min = (q_pi_all == q_pi).to(q_pi_all.dtype)
        grad_pi_q = at_min.div_(at_min.sum(0).mul_(-batch))  # [K, B]
        if self.select_rows and not reduced_matmuls():
            # through each member only at the rows where it is the minimum (B rows of products in all, not K * B)
            grad_pi_actions = ws.get("grad_pi_actions", pi_actions.shape, pi_actions).zero_()  # dJ/da~ [B, A]
            for member in range(members):
                index = grad_pi_q[member].nonzero().squeeze(1)
                grad = ensemble_rows_input_grad(grad_pi_q[member, index].unsqueeze(1), pi_out, member,
                                                self._member_weights_t[member], self.critic_tanh, index, ws,
                                                "critic rows")
                grad_pi_actions.index_add_(0, index, grad)
        else:  # without choosing rows on the host (a device synchronisation): all members, all rows
            grad_pi_actions = ensemble_input_grad(grad_pi_q.unsqueeze(-1), pi_out, self.critic_weights,
                                                  self.critic_tanh, slice(obs_dim, None), ws, "critic pi").sum(0)

        # Actor chain (the obs half only; a' of the target carries no gradient).
        a, eps, sd = pi_actions, noise[batch:], std[batch:]
        alpha_over_batch = alpha.mul(1.0 / batch)
        grad_u = torch.addcmul(grad_pi_actions.addcmul(grad_pi_actions, a.square(), value=-1.0), a,
                               alpha_over_batch, value=2.0)
        grad_log_std = torch.addcmul(alpha_over_batch.neg().expand_as(a), grad_u, sd * eps)
        # clamp's gradient: zero where log_std was clamped, i.e. where it differs from the raw output
        grad_log_std = grad_log_std * (log_std[batch:] == raw_log_std[batch:])
        linear_backward(torch.cat((grad_u, grad_log_std), dim=-1), [o[batch:] for o in actor_out], self.actor_weights,
                        self.actor_weight_grads, self.actor_bias_grads, self.actor_tanh, ws, "actor")

        if sac.autotune:
            alpha_terms = pi_log_pi + sac.target_entropy
            torch.mean(alpha_terms, dim=0, keepdim=True, out=self.log_alpha_grad).neg_()
        if not with_metrics:
            return None, {}
        critic_loss = td_error.square().sum().mul_(0.5 / batch)  # 1/2 sum_k mean_B (Q_k - y)^2
        actor_loss = (alpha * pi_log_pi - q_pi).mean()
        loss = critic_loss + actor_loss
        if sac.autotune:
            loss = loss - (log_alpha * alpha_terms).mean()
        metrics = {"critic_loss": critic_loss, "actor_loss": actor_loss, "alpha": alpha[0],
                   "entropy": -pi_log_pi.mean(), "q_values": q_values.mean()}
        return loss, metrics
