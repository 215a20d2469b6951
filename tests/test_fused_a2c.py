"""The hand-derived A2C update against autograd + torch.optim.RMSprop (and Adam), step by step; its checkpoints; the
rollout's forward passes on its flat parameters against the policy module's."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import (
    assert_gradient_matches_autograd,
    assert_loaded_update_continues,
    assert_updates_match,
    plain_and_fused,
    update_summaries,
)

from rlspeed import A2C
from rlspeed.fused.a2c import FlatRMSprop, FusedA2CUpdate


def _pair(env_id, **config):
    return plain_and_fused(A2C, env_id, FusedA2CUpdate, env_backend="torch", **config)


def _rollout_batch(model, batch=40, seed=1):
    """What `A2C._update_rollout` passes: observations, actions, advantages, returns."""
    generator = torch.Generator().manual_seed(seed)
    obs = torch.randn(batch, model.spec.obs_dim, generator=generator)
    if model.spec.discrete:
        actions = torch.randint(0, model.spec.action_dim, (batch,), generator=generator)
    else:
        actions = torch.randn(batch, model.spec.action_dim, generator=generator)
    advantages = torch.randn(batch, generator=generator)
    returns = 3 * torch.randn(batch, generator=generator)
    return obs, actions, advantages, returns


@pytest.mark.parametrize("env_id,config", [
    ("CartPole-v1", {}),
    ("CartPole-v1", {"ent_coef": 0.01, "normalize_advantage": True, "activation": "relu"}),
    ("CartPole-v1", {"max_grad_norm": 100.0, "net_arch": (32,), "rms_prop_eps": 1e-3}),
    ("CartPole-v1", {"use_rms_prop": False, "ent_coef": 0.02}),
    ("Pendulum-v1", {"ent_coef": 0.02, "log_std_init": -0.5}),
    ("MountainCarContinuous-v0", {"net_arch": (16, 16, 16), "normalize_advantage": True}),
])
def test_fused_update_matches_autograd_and_the_optimizer(env_id, config):
    plain, fused = _pair(env_id, **config)
    expected = torch.optim.RMSprop if config.get("use_rms_prop", True) else torch.optim.Adam
    assert isinstance(plain.optimizer, expected) and isinstance(fused.optimizer, expected)
    # several steps: the running averages must agree too
    assert_updates_match(plain, fused, 5, lambda step: _rollout_batch(plain, seed=step))
    if expected is torch.optim.RMSprop:
        for a_param, b_param in zip(plain.policy.parameters(), fused.policy.parameters()):
            a_state, b_state = plain.optimizer.state[a_param], fused.optimizer.state[b_param]
            torch.testing.assert_close(b_state["square_avg"], a_state["square_avg"], rtol=1e-5, atol=1e-9)
            assert int(b_state["step"]) == int(a_state["step"]) == 5


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_fused_gradient_matches_autograd(env_id):
    plain, fused = _pair(env_id, ent_coef=0.05)
    assert_gradient_matches_autograd(plain, fused, "policy", _rollout_batch(plain, batch=64))


def test_clipping_bites_and_still_matches():
    """A tiny max_grad_norm: the clipped gradient (not the raw one) feeds RMSprop, in both implementations."""
    plain, fused = _pair("CartPole-v1", max_grad_norm=1e-3)
    for step in range(3):
        batch = _rollout_batch(plain, seed=10 + step)
        plain._update_step(*batch)
        fused._update_step(*batch)
    norm = torch.linalg.vector_norm(fused._update_step.hand_derived.adam.grad)
    assert norm <= 1e-3 * (1 + 1e-4)
    for a, b in zip(plain.policy.parameters(), fused.policy.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_rollout_forward_passes_follow_the_policy_module(env_id):
    """The rollout's values are the module's; its actions are the policy's samples for the rollout's noise."""
    model = A2C(env_id, device="cpu", seed=0)
    update = model._update_step.hand_derived
    obs = torch.randn(8, model.spec.obs_dim)
    with torch.no_grad():
        torch.manual_seed(3)
        noise = update.rollout_noise(5, 8)
        assert noise.shape == (5, 8, model.policy.action_dim)
        actions, values = update.act(obs, noise[2])
        logits_or_mean, expected_values = model.policy(obs)
        assert torch.equal(values, expected_values) and torch.equal(update.value(obs), expected_values)
        if model.spec.discrete:  # Gumbel-max: argmax(logits + G) with G = -log(E), E ~ Exp(1)
            torch.manual_seed(3)
            gumbel = -torch.empty(5, 8, model.policy.action_dim).exponential_().log_()
            assert torch.equal(actions, (logits_or_mean + gumbel[2]).argmax(-1))
        else:  # mean + std * N(0, 1)
            torch.manual_seed(3)
            normal = torch.randn(5, 8, model.policy.action_dim)
            torch.testing.assert_close(actions, logits_or_mean + model.policy.log_std.exp() * normal[2])


def test_rollout_actions_follow_the_policy_distribution():
    """Gumbel-max over the rollout's noise samples actions with the policy's probabilities."""
    model = A2C("CartPole-v1", device="cpu", seed=0)
    update = model._update_step.hand_derived
    with torch.no_grad():
        update.weights[-1][0].normal_()  # a policy far from uniform
        obs = torch.randn(4, model.spec.obs_dim)
        probs = torch.softmax(model.policy(obs)[0], -1)
        counts = torch.zeros_like(probs)
        torch.manual_seed(0)
        draws = 4000
        noise = update.rollout_noise(draws, 4)
        for step in range(draws):
            actions, _ = update.act(obs, noise[step])
            counts[torch.arange(4), actions] += 1
    torch.testing.assert_close(counts / draws, probs, atol=0.03, rtol=0)


def test_fused_checkpoint_round_trip_and_resume(tmp_path):
    model = A2C("CartPole-v1", device="cpu", seed=0, num_envs=4)
    assert isinstance(model._update_step.hand_derived.adam, FlatRMSprop)
    model.learn(400, progress_bar=False)
    path = model.save(tmp_path / "a2c")
    loaded = A2C.load(path, device="cpu")
    # the checkpoint holds torch.optim.RMSprop's state, and the next fused step continues from it
    steps = assert_loaded_update_continues(model, loaded, "square_avg", _rollout_batch(model, seed=5))
    assert steps[0] == steps[1] == 400 // 20 + 1


def test_unsupported_networks_fall_back_to_autograd_and_still_learn():
    model = A2C("CartPole-v1", device="cpu", seed=0, activation="elu", num_envs=4)
    choice = model.update_summary()
    assert choice["implementation"] == "autograd" and "activation=elu" in choice["reason"]
    assert choice["rollout"] == "policy module" and "a2c rollout: policy module" in model.report()
    before = [p.detach().clone() for p in model.policy.parameters()]
    model.learn(200, progress_bar=False)
    assert any(not torch.equal(p, b) for p, b in zip(model.policy.parameters(), before))


def test_flat_rmsprop_refuses_what_it_does_not_implement():
    model = A2C("CartPole-v1", device="cpu", seed=0)
    params = list(model.policy.parameters())
    with pytest.raises(ValueError, match="momentum"):
        FlatRMSprop(params, torch.optim.RMSprop(params, lr=1e-3, momentum=0.9))
    with pytest.raises(ValueError, match="centering"):
        FlatRMSprop(params, torch.optim.RMSprop(params, lr=1e-3, centered=True))


def test_summary_json_names_the_a2c_update(tmp_path, monkeypatch):
    updates = update_summaries(tmp_path, monkeypatch, "a2c", 400, {"hand": [], "off": ["--set", "fused_update=false"]})
    hand, off = updates["hand"], updates["off"]
    assert hand == {"implementation": "hand-derived", "reason": "default on this device",
                    "rollout": "hand-derived (the update's flat parameters, Gumbel-max or scaled-normal draws)"}
    assert off == {"implementation": "autograd", "reason": "fused_update=false", "rollout": "policy module"}


class _MaskedVectorPick(gym.Env):
    """One-step episodes on a float vector: the observation one-hot encodes a target t in 1..4, the action t earns 1;
    action 0 is always masked (`info["action_mask"]`) but earns 2. `taken` counts the actions chosen."""

    taken = np.zeros(5, dtype=np.int64)

    def __init__(self):
        self.observation_space = gym.spaces.Box(0.0, 1.0, (5,), np.float32)
        self.action_space = gym.spaces.Discrete(5)
        self.target = 1

    def _obs(self):
        return np.eye(5, dtype=np.float32)[self.target]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.target = int(self.np_random.integers(1, 5))
        return self._obs(), {"action_mask": np.arange(5) != 0}

    def step(self, action):
        _MaskedVectorPick.taken[int(action)] += 1
        reward = 2.0 if int(action) == 0 else float(int(action) == self.target)
        return self._obs(), reward, True, False, {"action_mask": np.arange(5) != 0}


def test_masked_runs_leave_the_flat_rollout_for_the_masked_policy():
    """With action masks the hand-derived update gives way to autograd when learn starts, and the rollout samples
    from the masked policy module, never the flat parameters' unmasked Gumbel-max: no masked action is taken."""
    env_id = "RlspeedTest/MaskedVectorPick-v0"
    if env_id not in gym.registry:
        gym.register(env_id, entry_point=_MaskedVectorPick)
    _MaskedVectorPick.taken[:] = 0
    model = A2C(env_id, device="cpu", seed=0, num_envs=4, env_backend="gymnasium")
    assert model.update_summary()["implementation"] == "hand-derived"  # (before learn: masks not known yet)
    model.learn(400, progress_bar=False)
    summary = model.update_summary()
    assert summary["implementation"] == "autograd" and "action masks" in summary["reason"]
    assert summary["rollout"] == "policy module"
    assert _MaskedVectorPick.taken[0] == 0 and _MaskedVectorPick.taken.sum() == model.num_timesteps


def test_accelerate_auto_on_a_cpu_rolls_out_as_off_does(monkeypatch):
    """On a CPU, `accelerate="auto"` keeps the rollout on the hand-derived update's flat parameters, as `off` does
    (the policy module's measured forms ran its rollouts slower, with other random draws): while its search keeps
    fp32, an auto run trains exactly as an off run of the same seed."""
    monkeypatch.delenv("RLSPEED_ACCELERATE", raising=False)
    trained = {}
    for accelerate in ("off", "auto"):  # (one after the other: each model seeds torch's global stream when built)
        model = A2C("CartPole-v1", device="cpu", seed=0, num_envs=8, accelerate=accelerate)
        model.learn(800, progress_bar=False)
        assert model.update_summary()["rollout"].startswith("hand-derived")
        trained[accelerate] = [p.detach().clone() for p in model.policy.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(trained["off"], trained["auto"]))
