"""The hand-derived DQN gradient step against autograd + torch.optim.Adam, step by step, and its checkpoints."""

import pytest
import torch
from conftest import assert_gradient_matches_autograd, plain_and_fused

from rlspeed import DQN
from rlspeed.algos.off_policy import BATCH_FIELDS
from rlspeed.fused.dqn import FusedDQNUpdate


def _pair(**config):
    return plain_and_fused(DQN, "CartPole-v1", FusedDQNUpdate, learning_rate=1e-3, **config)


def _batch(seed, batch=64):
    generator = torch.Generator().manual_seed(seed)
    obs, next_obs = torch.randn(batch, 4, generator=generator), torch.randn(batch, 4, generator=generator)
    actions = torch.randint(0, 2, (batch,), generator=generator)
    rewards = 3 * torch.randn(batch, generator=generator)  # large TD errors: both branches of the Huber loss
    terminated = (torch.rand(batch, generator=generator) < 0.2).float()
    discounts = torch.full((batch,), 0.99**3)
    return obs, actions, rewards, next_obs, terminated, discounts


@pytest.mark.parametrize("config", [
    {},
    {"double_q": False, "activation": "tanh", "net_arch": (32,), "max_grad_norm": 0.5},
    {"net_arch": (16, 16, 16), "max_grad_norm": 1000.0},
    {"td_loss": "mse", "max_grad_norm": 1000.0},  # (CleanRL's squared error)
    {"td_loss": "mse", "double_q": False},
])
def test_fused_step_matches_autograd_and_adam(config):
    plain, fused = _pair(**config)
    start = [p.clone() for p in fused.q_network.parameters()]
    for step in range(5):
        batch = _batch(step)
        loss_a, metrics_a = plain._update_step(*batch)
        loss_b, metrics_b = fused._update_step(*batch)
        torch.testing.assert_close(loss_b, loss_a, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(metrics_b["q_values"], metrics_a["q_values"], rtol=1e-5, atol=1e-6)
        for (name, a), b in zip(plain.q_network.named_parameters(), fused.q_network.parameters()):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=f"{name} after step {step}")
    assert all(not torch.equal(a, b) for a, b in zip(start, fused.q_network.parameters())), "nothing was learned"


@pytest.mark.parametrize("double_q", [True, False])
def test_batches_prepared_together_match_autograd_steps(double_q):
    """learn() computes the target network's part of all of an iteration's batches in one pass (`_prepare_batches`)
    and then steps through them: each step equals autograd's on its batch, the target network held fixed."""
    plain, fused = _pair(double_q=double_q)
    with torch.no_grad():  # a target network apart from the online one, so that mixing them up shows
        for model in (plain, fused):
            for p in model.q_target.parameters():
                p.mul_(0.5)
    batches, size = 4, 32
    rows = dict(zip(BATCH_FIELDS, _batch(11, batch=batches * size)))
    prepared = fused._prepare_batches(rows)
    assert "prepared" in prepared
    for i in range(batches):
        rows_i = slice(i * size, (i + 1) * size)
        batch = {key: tuple(v[rows_i] for v in value) if isinstance(value, tuple) else value[rows_i]
                 for key, value in prepared.items()}
        metrics = fused._update(batch)
        _, expected = plain._update_step(*(rows[field][rows_i] for field in BATCH_FIELDS))
        torch.testing.assert_close(metrics["loss"], expected["loss"], rtol=1e-5, atol=1e-6)
        for (name, a), b in zip(plain.q_network.named_parameters(), fused.q_network.parameters()):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=f"{name} after batch {i}")


def test_fused_gradient_matches_autograd():
    plain, fused = _pair()
    assert_gradient_matches_autograd(plain, fused, "q_network", _batch(7))


def test_fused_dqn_save_load_continues_identically(tmp_path):
    model = DQN("CartPole-v1", device="cpu", seed=0, learning_starts=64, train_freq=16, gradient_steps=4,
                batch_size=32, net_arch=(32, 32))
    model.learn(512, progress_bar=False)
    loaded = DQN.load(model.save(tmp_path / "dqn"), device="cpu")
    batch = _batch(3, batch=32)
    model._update_step(*batch)
    loaded._update_step(*batch)
    for a, b in zip(model.q_network.parameters(), loaded.q_network.parameters()):
        torch.testing.assert_close(b, a)


def test_dueling_uses_autograd():
    model = DQN("CartPole-v1", device="cpu", seed=0, dueling=True, learning_starts=32, train_freq=8, batch_size=16)
    assert model._update_step.hand_derived is None
    choice = model.update_summary()
    assert choice["implementation"] == "autograd" and "dueling=true" in choice["reason"]
    before = [p.detach().clone() for p in model.q_network.parameters()]
    model.learn(128, progress_bar=False)
    assert any(not torch.equal(p, b) for p, b in zip(model.q_network.parameters(), before)), "nothing was learned"


def test_td_loss_mse_is_the_mean_squared_td_error_and_huber_the_smooth_l1():
    """`td_loss` picks the loss both updates take (CleanRL's DQN: squared error; SB3's: Huber): with TD errors above
    1 the two differ, and each is its formula of Q(s, a) and the Double DQN target."""
    batch = _batch(3)
    obs, actions, rewards, next_obs, terminated, discounts = batch
    losses = {}
    for name in ("mse", "huber"):
        model = DQN("CartPole-v1", device="cpu", seed=0, td_loss=name)
        with torch.no_grad():
            next_actions = model.q_network(next_obs).argmax(1, keepdim=True)
            next_q = model.q_target(next_obs).gather(1, next_actions).squeeze(1)
            target = rewards + discounts * (1 - terminated) * next_q
            error = model.q_network(obs).gather(1, actions.unsqueeze(1)).squeeze(1) - target
        losses[name] = model._update_step(*batch)[0]
        expected = error.pow(2).mean() if name == "mse" else torch.where(
            error.abs() < 1, 0.5 * error.pow(2), error.abs() - 0.5).mean()
        torch.testing.assert_close(losses[name], expected, rtol=1e-5, atol=1e-6)
    assert losses["mse"] > 1.5 * losses["huber"]
