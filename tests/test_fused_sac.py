"""The hand-derived SAC step (critics, actor, temperature, Polyak) against autograd + torch.optim.Adam."""

import pytest
import torch
from conftest import needs_box2d, plain_and_fused

from rlspeed import SAC
from rlspeed.accel.search import TOLERANCES
from rlspeed.accel.strategy import precision_context, reduced_matmul_supported
from rlspeed.fused.sac import FusedSACUpdate


def _pair(**config):
    return plain_and_fused(SAC, "Pendulum-v1", FusedSACUpdate, learning_rate=1e-3, **config)


def _batch(seed, batch=256, obs_dim=3, action_dim=1):
    # batch * action_dim a multiple of 16: one normal draw of 2B numbers equals two draws of B (CPU generator), so
    # both versions see the same noise.
    generator = torch.Generator().manual_seed(seed)
    return {"obs": torch.randn(batch, obs_dim, generator=generator),
            "actions": torch.rand(batch, action_dim, generator=generator) * 2 - 1,
            "rewards": 3 * torch.randn(batch, generator=generator),
            "next_obs": torch.randn(batch, obs_dim, generator=generator),
            "terminated": (torch.rand(batch, generator=generator) < 0.1).float(),
            "discounts": torch.full((batch,), 0.99)}


@pytest.mark.parametrize("config", [
    {},
    {"ent_coef": 0.2, "activation": "tanh", "net_arch": (32, 32), "n_critics": 3, "tau": 0.1},
    {"net_arch": (64,), "target_entropy": -3.0},
])
def test_fused_step_matches_autograd_adam_and_polyak(config):
    _assert_steps_match(*_pair(**config), _batch)


@needs_box2d
def test_fused_step_matches_autograd_with_two_action_dimensions():
    """On a CPU the hand-derived path lays a narrow actor head out column-major; its noise is still drawn in the
    reference's (row-major) order, so both take the same step for any number of action dimensions."""
    plain, fused = plain_and_fused(SAC, "LunarLanderContinuous-v3", FusedSACUpdate, learning_rate=1e-3)
    _assert_steps_match(plain, fused, lambda step: _batch(step, obs_dim=8, action_dim=2))


def _summed_losses(plain, batch, seed):
    """The critics' loss plus the actor's and temperature's at the current parameters (the gradient the hand-derived
    `gradient` writes when nothing steps between its two halves), the policy's noise drawn as the update draws it."""
    torch.manual_seed(seed)
    critic_loss, _ = plain._critic_loss(*batch)
    actor_loss, _ = plain._actor_loss(batch[0])
    return critic_loss + actor_loss


def _assert_steps_match(plain, fused, make_batch):
    fused._update_step.hand_derived.metrics_every = 1  # metrics on every step, to compare them too
    start = [p.clone() for p in fused._params]
    for step in range(4):
        batch = make_batch(step)
        torch.manual_seed(100 + step)
        metrics_a = plain._update(batch)
        torch.manual_seed(100 + step)
        metrics_b = fused._update(batch)
        for key in metrics_a:
            torch.testing.assert_close(metrics_b[key], metrics_a[key], rtol=1e-5, atol=1e-5, msg=key)
        for a, b in zip(plain._params, fused._params):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=f"after step {step}")
        for a, b in zip(plain.critic_target.parameters(), fused.critic_target.parameters()):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=f"target after step {step}")
        # Start the next step from identical weights: over several steps, float rounding differences in the
        # actor's tiny hidden-layer gradients grow through Adam's normalisation (both versions alike).
        with torch.no_grad():
            torch._foreach_copy_(list(fused._params), list(plain._params))
    assert all(not torch.equal(a, b) for a, b in zip(start, fused._params)), "a parameter did not move"


def test_metrics_come_every_kth_update_and_do_not_change_the_step():
    _, every = _pair(net_arch=(32, 32))
    _, third = _pair(net_arch=(32, 32))
    assert every._update_step.hand_derived.metrics_every == 8  # the default
    every._update_step.hand_derived.metrics_every, third._update_step.hand_derived.metrics_every = 1, 3
    for step in range(6):
        batch = _batch(step)
        torch.manual_seed(step)
        expected = every._update(batch)
        torch.manual_seed(step)
        got = third._update(batch)
        if step % 3 == 0:
            assert set(got) == set(expected) == {"critic_loss", "actor_loss", "alpha", "entropy", "q_values"}
            for key in expected:
                torch.testing.assert_close(got[key], expected[key], rtol=0, atol=0)
        else:
            assert got == {}
        for a, b in zip(every._params, third._params):
            torch.testing.assert_close(b, a, rtol=0, atol=0)


def test_logs_average_each_metric_over_the_updates_that_reported_it(tmp_path):
    # two updates per iteration, a metric on every third update only (always 2.0), one log row at the end: the
    # average is over the updates and iterations that reported it, not over all of them
    model = SAC("Pendulum-v1", device="cpu", seed=0, learning_starts=64, batch_size=32, net_arch=(32, 32),
                train_freq=2, gradient_steps=2)
    calls = []

    def update(batch):
        calls.append(1)
        return {"probe": torch.tensor(2.0)} if len(calls) % 3 == 0 else {}

    model._update = update
    model.learn(400, progress_bar=False, run_dir=tmp_path, log_interval_s=1e9)
    header, *rows = (tmp_path / "metrics.csv").read_text().splitlines()
    assert len(rows) == 1 and len(calls) > 100
    assert float(rows[0].split(",")[header.split(",").index("probe")]) == 2.0


@pytest.mark.parametrize("select_rows", [True, False])
@pytest.mark.parametrize("identical_critics", [False, True])
def test_actor_gradient_through_the_minimum_critic_matches_autograd(select_rows, identical_critics):
    # On a CPU dJ/da~ goes back through each critic only at the rows where it is the minimum (`select_rows`);
    # elsewhere through every critic at every row. With identical critics every row is a tie: autograd's amin
    # shares the gradient between the tied critics, and so must both paths.
    plain, fused = _pair(n_critics=3, net_arch=(32, 32))
    assert not fused._update_step.hand_derived.select_rows  # the default on a CPU for narrow critics
    assert _pair(net_arch=(256, 256))[1]._update_step.hand_derived.select_rows  # ... and for wide ones
    fused._update_step.hand_derived.select_rows = select_rows
    if identical_critics:
        with torch.no_grad():
            for model in (plain, fused):
                for p in model.critic.parameters():
                    p.copy_(p[:1].expand_as(p))
    batch = [_batch(7)[field] for field in ("obs", "actions", "rewards", "next_obs", "terminated", "discounts")]
    params = [*plain.actor.parameters(), *plain.critic.parameters()]
    expected = torch.autograd.grad(_summed_losses(plain, batch, seed=3), params)
    torch.manual_seed(3)
    fused._update_step.hand_derived.gradient(*batch)
    for grad, param in zip(expected, [*fused.actor.parameters(), *fused.critic.parameters()]):
        torch.testing.assert_close(param.grad, grad, rtol=1e-5, atol=1e-7)


@pytest.mark.skipif(not reduced_matmul_supported(torch.device("cpu"), "bf16-matmul"),
                    reason="this CPU has no bf16 matmul")
def test_wide_critics_in_a_bf16_matmul_region_stay_within_the_acceleration_tolerance():
    # RL-Zoo widths: on a CPU the fp32 step chooses rows (select_rows), a bf16-matmul region (--accelerate auto's
    # usual choice there) takes the full backward instead; its gradient must stay as close to autograd's fp32 one
    # as the acceleration layer demands of any candidate. A small fixed temperature, so that the actor's gradient is
    # mostly the critics' (not the entropy term's).
    plain, fused = _pair(net_arch=(256, 256), ent_coef=0.01)
    assert fused._update_step.hand_derived.select_rows
    batch = [_batch(7)[field] for field in ("obs", "actions", "rewards", "next_obs", "terminated", "discounts")]
    expected = torch.cat([g.flatten() for g in torch.autograd.grad(_summed_losses(plain, batch, seed=3),
                                                                    plain._params)])
    torch.manual_seed(3)
    with precision_context(torch.device("cpu"), "bf16-matmul"):
        fused._update_step.hand_derived.gradient(*batch)
    tolerance = TOLERANCES["bf16-matmul"]
    actor_size = sum(p.numel() for p in plain.actor.parameters())
    critic_end = actor_size + sum(p.numel() for p in plain.critic.parameters())
    for part in (slice(0, actor_size), slice(actor_size, critic_end)):  # each network on its own
        got, want = fused._update_step.hand_derived.adam.grad[part], expected[part]
        assert float(got @ want / (got.norm() * want.norm())) >= tolerance.grad_cosine
        assert float((got.norm() - want.norm()).abs() / want.norm()) <= tolerance.grad_norm_rel_err


def test_fused_sac_checkpoint_continues_identically(tmp_path):
    model = SAC("Pendulum-v1", device="cpu", seed=0, learning_starts=64, batch_size=32, net_arch=(32, 32))
    model.learn(160, progress_bar=False)
    loaded = SAC.load(model.save(tmp_path / "sac"), device="cpu")
    batch = _batch(1, batch=32)
    torch.manual_seed(5)
    model._update(batch)
    torch.manual_seed(5)
    loaded._update(batch)
    for a, b in zip(model._params, loaded._params):
        torch.testing.assert_close(b, a)
    for a, b in zip(model.critic_target.parameters(), loaded.critic_target.parameters()):
        torch.testing.assert_close(b, a)
