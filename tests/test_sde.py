"""gSDE (rlspeed.sde): the distribution's maths against a float64 reference, when the exploration matrices are drawn,
the update choice it forces, checkpoints and export, bad input, and a short run that learns."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import cli_error, needs_torch_export

from rlspeed.algos.a2c import A2C
from rlspeed.algos.ppo import PPO
from rlspeed.sde import SDE_EPSILON, SDENoise, sde_log_prob_entropy, sde_std


def reference_log_prob_entropy(actions, mean, latent, log_std, use_expln):
    """SB3's formulas in float64 numpy: sigma from log_std (exp or expln), var = latent^2 @ sigma^2 + eps."""
    actions, mean, latent, log_std = (np.asarray(x, dtype=np.float64) for x in (actions, mean, latent, log_std))
    if use_expln:
        sigma = np.where(log_std <= 0, np.exp(log_std), np.log1p(np.maximum(log_std, 0) + SDE_EPSILON) + 1.0)
    else:
        sigma = np.exp(log_std)
    sigma = np.broadcast_to(sigma, (latent.shape[1], mean.shape[1]))
    variance = latent ** 2 @ sigma ** 2 + SDE_EPSILON
    log_prob = (-(actions - mean) ** 2 / (2 * variance) - 0.5 * np.log(2 * math.pi * variance)).sum(-1)
    entropy = (0.5 * np.log(2 * math.pi * math.e * variance)).sum(-1)
    return log_prob, entropy


@pytest.mark.parametrize("full_std, use_expln", [(True, False), (False, False), (True, True)])
def test_log_prob_and_entropy_match_a_float64_reference(full_std, use_expln):
    generator = torch.Generator().manual_seed(0)
    latent = torch.randn(6, 5, generator=generator)
    mean = torch.randn(6, 2, generator=generator)
    actions = mean + 0.3 * torch.randn(6, 2, generator=generator)
    log_std = torch.randn(5, 2 if full_std else 1, generator=generator)  # values on both sides of 0 (expln)
    std = sde_std(log_std, use_expln, 2)
    log_prob, entropy = sde_log_prob_entropy(actions, mean, latent, std)
    ref_log_prob, ref_entropy = reference_log_prob_entropy(actions, mean, latent, log_std, use_expln)
    np.testing.assert_allclose(log_prob.numpy(), ref_log_prob, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(entropy.numpy(), ref_entropy, rtol=1e-5, atol=1e-5)


def test_noise_is_latent_times_each_envs_matrix():
    torch.manual_seed(0)
    noise = SDENoise(latent_dim=4, action_dim=3, log_std_init=-1.0)
    noise.resample(5)
    assert noise.exploration.shape == (5, 4, 3)
    for i in range(1, 5):  # per-env matrices differ
        assert not torch.equal(noise.exploration[0], noise.exploration[i])
    latent = torch.randn(5, 4)
    expected = torch.stack([latent[i] @ noise.exploration[i] for i in range(5)])
    torch.testing.assert_close(noise.noise(latent), expected)
    # the matrices' spread follows sigma = exp(log_std)
    noise.resample(4000)
    assert abs(noise.exploration.std().item() - math.exp(-1.0)) < 0.01


def _exploration_per_step(model, rollouts: int) -> list[torch.Tensor]:
    """The exploration matrices in use at every rollout step of `rollouts` rollouts."""
    seen = []
    act = model._act

    def recording_act(obs, step, *masks):
        out = act(obs, step, *masks)
        seen.append(model.policy.sde.exploration.clone())
        return out

    model._act = recording_act
    cfg = model.config
    model.learn(rollouts * cfg.num_envs * cfg.num_steps)
    return seen


@pytest.mark.parametrize("algo", [PPO, A2C])
def test_noise_is_fixed_between_resamples_and_redrawn_at_the_boundaries(algo):
    model = algo("Pendulum-v1", seed=0, use_sde=True, sde_sample_freq=3, num_envs=2, num_steps=8,
                 **({"n_epochs": 1, "batch_size": 16} if algo is PPO else {}))
    seen = _exploration_per_step(model, rollouts=2)
    assert len(seen) == 16
    for rollout in (0, 8):
        blocks = [seen[rollout + i:rollout + min(i + 3, 8)] for i in range(0, 8, 3)]  # steps 0-2, 3-5, 6-7
        for block in blocks:
            assert all(torch.equal(block[0], m) for m in block)
        for a, b in zip(blocks, blocks[1:]):
            assert not torch.equal(a[0], b[0])
    assert not torch.equal(seen[7], seen[8])  # a new rollout starts with new matrices
    assert not torch.equal(seen[0][0], seen[0][1])  # one matrix per env


def test_once_per_rollout_by_default():
    model = PPO("Pendulum-v1", seed=0, use_sde=True, num_envs=2, num_steps=8, batch_size=16, n_epochs=1)
    seen = _exploration_per_step(model, rollouts=2)
    assert all(torch.equal(seen[0], m) for m in seen[:8]) and all(torch.equal(seen[8], m) for m in seen[8:])
    assert not torch.equal(seen[0], seen[8])


@pytest.mark.parametrize("algo", [PPO, A2C])
def test_rollout_actions_are_mean_plus_state_dependent_noise(algo):
    model = algo("Pendulum-v1", seed=0, use_sde=True, log_std_init=-1.0, full_std=False, num_envs=4, device="cpu")
    policy = model.policy
    assert policy.sde.log_std.shape == (64, 1)  # [latent_dim, 1] without full_std
    policy.resample(4)
    obs = torch.randn(4, 3)
    actions, log_probs, _ = policy.act(obs)
    mean, _, latent = policy.forward_latent(obs)
    torch.testing.assert_close(actions, mean + torch.bmm(latent.unsqueeze(1), policy.sde.exploration).squeeze(1))
    evaluated, _, _ = policy.evaluate(obs, actions)
    torch.testing.assert_close(log_probs, evaluated)
    deterministic, _, _ = policy.act(obs, deterministic=True)
    torch.testing.assert_close(deterministic, mean)


@pytest.mark.parametrize("algo", [PPO, A2C])
def test_gsde_picks_autograd_and_says_why(algo):
    model = algo("Pendulum-v1", seed=0, use_sde=True, device="cpu")  # (the CPU's choices; CUDA captures graphs)
    summary = model.update_summary()
    assert summary["implementation"] == "autograd" and "use_sde" in summary["reason"]
    assert "use_sde=true" in model.report()
    plain = algo("Pendulum-v1", seed=0, device="cpu")
    assert plain.update_summary()["implementation"] == "hand-derived"  # the choice is gSDE's, not the env's


def test_checkpoint_keeps_the_sde_parameter_and_deterministic_actions(tmp_path):
    model = PPO("Pendulum-v1", seed=0, use_sde=True, log_std_init=-2.0, use_expln=True, num_envs=2, num_steps=64,
                batch_size=64, n_epochs=2)
    model.learn(256)
    model.save(tmp_path / "model")
    loaded = PPO.load(tmp_path / "model")
    assert loaded.config.use_sde and loaded.config.use_expln
    torch.testing.assert_close(loaded.policy.sde.log_std, model.policy.sde.log_std)
    obs = np.random.default_rng(0).standard_normal((7, 3)).astype(np.float32)
    np.testing.assert_array_equal(loaded.predict(obs, deterministic=True)[0], model.predict(obs, deterministic=True)[0])


@pytest.mark.parametrize("algo", ["ppo", "sac"])
def test_a_loaded_model_explores_with_its_saved_sigma(tmp_path, algo):
    """`predict(deterministic=False)` after `load` draws its noise with the checkpoint's sigma (SB3's load redraws
    the matrices), not with log_std_init's."""
    model = PPO("Pendulum-v1", seed=0, use_sde=True, log_std_init=-3.0) if algo == "ppo" else _sac()
    with torch.no_grad():
        model.policy.sde.log_std.fill_(1.0)  # sigma e, where log_std_init gives exp(-3) = 0.05
    model.save(tmp_path / "model")
    loaded = type(model).load(tmp_path / "model")
    spread = loaded.policy.sde.exploration.std().item()
    assert 2.0 < spread < 3.5  # (64 or 256 draws of N(0, e))


@needs_torch_export
def test_export_gives_the_mean(tmp_path):
    from rlspeed.export import export

    model = A2C("Pendulum-v1", seed=0, use_sde=True, log_std_init=-2.0)
    model.learn(400)
    path = export(model, tmp_path / "policy.pt2", format="exported_program")
    exported = torch.export.load(str(path)).module()
    obs = torch.randn(5, 3)
    np.testing.assert_allclose(exported(obs).numpy(), model.predict(obs.numpy(), deterministic=True)[0],
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("argv, message", [
    (["train", "ppo", "CartPole-v1", "--set", "use_sde=true"], "needs a Box action space"),
    (["train", "a2c", "Pendulum-v1", "--set", "use_sde=true", "--set", "sde_sample_freq=0"],
     "sde_sample_freq must be -1"),
    (["train", "recurrent_ppo", "CartPoleNoVel-v1", "--set", "use_sde=true"], "needs a Box action space"),
    (["train", "ppo", "Pendulum-v1", "--seeds", "0,1", "--set", "use_sde=true"], "Populations do not support gSDE"),
    (["train", "sac", "Pendulum-v1", "--seeds", "0,1", "--set", "use_sde=true"], "Populations do not support gSDE"),
    (["train", "td3", "Pendulum-v1", "--set", "use_sde=true"], "Unknown hyperparameter 'use_sde'"),
])
def test_bad_gsde_input_is_one_sentence(capsys, tmp_path, argv, message):
    error = cli_error(capsys, [*argv, "--total-timesteps", "64", "--out", str(tmp_path / "run")])
    assert message in error


def test_a_short_gsde_run_improves_the_return():
    """PPO with gSDE on Pendulum (RL-Zoo's settings, shorter rollouts): the mean training return rises."""
    torch.manual_seed(0)
    model = PPO("Pendulum-v1", seed=0, use_sde=True, sde_sample_freq=4, num_envs=4, num_steps=256, batch_size=64,
                gamma=0.9, learning_rate=1e-3, anneal_lr=False, n_epochs=10)
    # (the same seeded episodes before and after: the training is deterministic, the episodes' starting states would
    # not be; 10 episodes from seed 1000: -1298 before, -306 after 16 rollouts of 1,024 steps; -491 after 20)
    first = model.evaluate(episodes=10, seed=1000)["mean"]
    model.learn(16 * 1024, progress_bar=False)
    assert model.evaluate(episodes=10, seed=1000)["mean"] > first + 500


# --- SAC ------------------------------------------------------------------------------------------------------------
def test_sac_squashed_log_prob_matches_a_float64_reference():
    from rlspeed.sde import SDESquashedGaussianActor

    torch.manual_seed(0)
    actor = SDESquashedGaussianActor(3, 2, (16, 8), "relu", log_std_init=-1.0, use_expln=True)
    obs = torch.randn(6, 3)
    matrix = actor.sde.draw()
    actions, log_pi = actor.sample(obs, matrix)
    mean, latent = actor(obs)
    u = (mean + latent @ matrix).detach().double().numpy()
    ref, _ = reference_log_prob_entropy(u, mean.detach(), latent.detach(), actor.sde.log_std.detach(), True)
    ref -= np.log(1.0 - np.tanh(u) ** 2 + SDE_EPSILON).sum(-1)
    np.testing.assert_allclose(log_pi.detach().numpy(), ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(actions.detach().numpy(), np.tanh(u), atol=1e-6)
    assert float(mean.detach().abs().max()) <= 2.0  # SB3's clip_mean
    (-log_pi.sum()).backward()  # SAC's features and sigma learn through the noise
    assert actor.sde.log_std.grad.abs().sum() > 0 and actor.latent[0].weight.grad.abs().sum() > 0


def _sac(**config):
    from rlspeed.algos.sac import SAC

    return SAC("Pendulum-v1", seed=0, use_sde=True, batch_size=32, **config)


def _explored_matrices(model, steps: int) -> list[torch.Tensor]:
    """The exploration matrices of each step `model.learn(steps)` explored with (after the step's draw)."""
    seen = []
    explore = model._explore

    def recording_explore(obs, timesteps):
        out = explore(obs, timesteps)
        seen.append(model.actor.sde.exploration.clone())
        return out

    model._explore = recording_explore
    model.learn(steps)
    return seen


def test_sac_resamples_per_collection_and_every_sde_sample_freq_steps():
    # collections of 3 steps, resampled at steps 0 and 2 of each: matrices change at global steps 2, 3, 5, 6, 8
    model = _sac(train_freq=3, gradient_steps=1, sde_sample_freq=2, learning_starts=0, device="cpu")
    seen = _explored_matrices(model, 9)
    assert len(seen) == 9
    changes = [step for step in range(1, 9) if not torch.equal(seen[step - 1], seen[step])]
    assert changes == [2, 3, 5, 6, 8]
    assert model.update_summary()["implementation"] == "autograd"


def test_sac_draws_each_envs_matrix_where_exploration_starts_mid_collection():
    """learning_starts inside a collection: its first explored step has new matrices, one per env (SB3 drew them at
    the collection's start), kept to the collection's end (sde_sample_freq -1)."""
    model = _sac(num_envs=2, train_freq=4, learning_starts=4, device="cpu")
    seen = _explored_matrices(model, 8)  # steps 0-1 uniform, 2-3 explored
    assert len(seen) == 2 and seen[0].shape[0] == 2 and not torch.equal(seen[0][0], seen[0][1])
    assert torch.equal(seen[0], seen[1])


@pytest.mark.parametrize("at_warmup", [False, True])
def test_sac_explores_with_gsde_at_warmup_only_when_asked(at_warmup):
    model = _sac(learning_starts=1000, use_sde_at_warmup=at_warmup)
    calls = []
    explore = model._explore
    model._explore = lambda obs, timesteps: calls.append(timesteps) or explore(obs, timesteps)
    model.learn(20)
    assert len(calls) == (20 if at_warmup else 0)


@needs_torch_export
def test_sac_gsde_trains_log_std_and_exports_the_squashed_mean(tmp_path):
    from rlspeed.export import export

    model = _sac(learning_starts=32, log_std_init=-2.0)
    before = model.actor.sde.log_std.detach().clone()
    model.learn(96)
    assert not torch.equal(before, model.actor.sde.log_std.detach())
    model.save(tmp_path / "model")
    loaded = type(model).load(tmp_path / "model")
    obs = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    expected = model.predict(obs, deterministic=True)[0]
    np.testing.assert_array_equal(loaded.predict(obs, deterministic=True)[0], expected)
    path = export(model, tmp_path / "policy.pt2", format="exported_program")
    exported = torch.export.load(str(path)).module()
    np.testing.assert_allclose(exported(torch.as_tensor(obs)).numpy(), expected, rtol=1e-5, atol=1e-5)


def test_sac_gsde_trains_with_accelerate_auto():
    """The acceleration layer runs each update step several times on the same inputs while it measures: gSDE's
    numbers reach the steps as a plain tensor, and each step makes its matrix from them, so every run of a step has
    its own graph to log_std (a matrix drawn once outside the steps could be backpropagated through only once)."""
    model = _sac(learning_starts=32, log_std_init=-2.0, accelerate="auto")
    before = model.actor.sde.log_std.detach().clone()
    model.learn(96)
    assert not torch.equal(before, model.actor.sde.log_std.detach())
    summary = model.acceleration_summary()  # (each step's search ran on the first update)
    assert summary["precision"] and summary["actor_step"]["precision"]


def test_the_algorithms_named_as_having_gsde_are_those_whose_config_takes_use_sde():
    """`SDE_ALGORITHMS` (read without torch by RL-Zoo's translation and the policy_kwargs rule) is kept beside the
    configs: an algorithm given or stripped of `use_sde` must be named there too, or RL-Zoo's gSDE entries for it would
    be refused (or translated into a setting its config refuses)."""
    import dataclasses

    from rlspeed.algos import ALGORITHMS
    from rlspeed.policy_kwargs import SDE_ALGORITHMS

    takes_use_sde = {name for name, cls in ALGORITHMS.items()
                     if "use_sde" in {field.name for field in dataclasses.fields(cls.config_cls)}}
    assert takes_use_sde == set(SDE_ALGORITHMS)
