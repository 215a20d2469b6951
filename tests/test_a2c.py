"""A2C: Stable-Baselines3's algorithm (whole-rollout update, RMSprop, full-MSE value loss) on the on-policy base."""

from __future__ import annotations

import pytest
import torch

from rlspeed import A2C
from rlspeed.errors import UserError
from rlspeed.presets import load_preset, split_run_settings


def test_a2c_solves_cartpole_with_its_preset():
    run, hyperparameters = split_run_settings(load_preset("a2c", "CartPole-v1"))
    model = A2C("CartPole-v1", seed=0, device="cpu", **hyperparameters)
    model.learn(int(run["total_timesteps"]), progress_bar=False, target_return=475, eval_freq=10_000)
    assert model.result.steps_to_target is not None, model.result.evaluations


@pytest.mark.parametrize("normalize_advantage", [False, True])
def test_a2c_makes_one_rmsprop_step_per_rollout_on_the_loss_it_states(normalize_advantage):
    model = A2C("CartPole-v1", seed=0, device="cpu", num_envs=4, ent_coef=0.01,
                normalize_advantage=normalize_advantage)
    assert isinstance(model.optimizer, torch.optim.RMSprop)
    steps = []
    original = model._update_step.fn
    model._update_step.fn = lambda *batch: steps.append(batch[0].shape[0]) or original(*batch)
    model.learn(4 * 5 * 3, progress_bar=False)
    assert steps == [20, 20, 20]  # one update per rollout, on all num_envs * num_steps rows
    # the loss: -mean(A log pi) - c_ent mean(H) + c_vf mean((V - R)^2)
    obs, actions = torch.randn(6, 4), torch.tensor([0, 1, 1, 0, 1, 0])
    advantages, returns = torch.randn(6), torch.randn(6)
    loss, stats = model._loss(obs, actions, advantages, returns)
    log_probs, entropy, values = model.policy.evaluate(obs, actions)
    if normalize_advantage:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    expected = (-(advantages * log_probs).mean() + 0.5 * (values - returns).square().mean()
                - 0.01 * entropy.mean())
    torch.testing.assert_close(loss, expected)


@pytest.mark.parametrize("option", ["batch_size", "n_epochs", "clip_range"])
def test_ppo_options_are_refused_with_the_fix(option):
    with pytest.raises(UserError, match=f"'{option}' is not an option of A2CConfig.*use ppo"):
        A2C("CartPole-v1", device="cpu", **{option: 64})


def test_cli_refuses_a_minibatch_size_for_a2c(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    from rlspeed import cli

    code = cli.main(["train", "a2c", "CartPole-v1", "--set", "batch_size=64", "--no-progress"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "without minibatches" in err[0]


def test_a2c_steps_with_sb3s_rmsprop_settings():
    """RMSprop with alpha 0.99 and eps rms_prop_eps, as SB3's A2C (only a population parity test noticed otherwise)."""
    defaults = A2C("CartPole-v1", seed=0, rms_prop_eps=1e-4).optimizer.defaults
    assert (defaults["alpha"], defaults["eps"]) == (0.99, 1e-4)
