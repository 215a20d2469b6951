"""Action masking as sb3-contrib's MaskablePPO defines it: masks from the env (info["action_mask"] or action_masks()),
applied in sampling, log-probs and entropy, stored with the rollout, used by predict and evaluate; bad masks refused
with one sentence."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

import rlspeed
from rlspeed.envs.gymnasium_env import check_action_masks
from rlspeed.errors import UserError
from rlspeed.nn import ActorCritic

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _policy(space: gym.Space, seed: int = 0) -> ActorCritic:
    torch.manual_seed(seed)
    policy = ActorCritic(4, 0, False, (16,), action_space=space)
    with torch.no_grad():  # a large last layer: the unmasked policy would strongly prefer some actions
        policy.body.weights[-1].mul_(300.0)
    return policy


def test_masked_categorical_never_samples_a_masked_action_and_gives_it_probability_zero():
    policy = _policy(gym.spaces.Discrete(6))
    obs = torch.randn(512, 4)
    masks = torch.rand(512, 6) < 0.4
    masks[torch.arange(512), torch.randint(0, 6, (512,))] = True  # at least one allowed action per row
    logits, _ = policy(obs)
    favourite = logits.argmax(-1)
    assert not masks[torch.arange(512), favourite].all()  # the unmasked favourite is often masked
    for deterministic in (False, True):
        actions, log_probs, _ = policy.act(obs, deterministic=deterministic, action_masks=masks)
        assert masks[torch.arange(512), actions].all()
        expected = torch.log_softmax(logits.masked_fill(~masks, -torch.inf), -1).gather(1, actions[:, None])[:, 0]
        torch.testing.assert_close(log_probs, expected)
    actions = torch.randint(0, 6, (512,))
    log_probs, entropy, _ = policy.evaluate(obs, actions, masks)
    # a masked action has probability exactly 0; allowed ones match the softmax over the allowed logits alone
    probs = log_probs.exp()
    assert (probs[~masks[torch.arange(512), actions]] == 0).all()
    reference = torch.distributions.Categorical(logits=logits.masked_fill(~masks, -torch.inf))
    allowed = masks[torch.arange(512), actions]
    torch.testing.assert_close(log_probs[allowed], reference.log_prob(actions)[allowed])
    ref_entropy = -(reference.probs * torch.where(masks, reference.logits, 0.0)).sum(-1)
    torch.testing.assert_close(entropy, ref_entropy)
    # gradients stay finite (no -inf anywhere)
    (log_probs[allowed].sum() + entropy.sum()).backward()
    assert all(torch.isfinite(p.grad).all() for p in policy.parameters() if p.grad is not None)


def test_multi_discrete_masks_apply_per_component():
    space = gym.spaces.MultiDiscrete([3, 4])
    policy = _policy(space)
    obs = torch.randn(256, 4)
    masks = torch.rand(256, 7) < 0.5
    masks[:, 0] = True  # component 0 keeps action 0
    masks[:, 3] = True  # component 1 keeps action 0
    actions, log_probs, _ = policy.act(obs, action_masks=masks)
    assert masks[torch.arange(256), actions[:, 0]].all()
    assert masks[torch.arange(256), 3 + actions[:, 1]].all()
    logits, _ = policy(obs)
    parts = [torch.distributions.Categorical(logits=part.masked_fill(~mask, -torch.inf))
             for part, mask in zip(logits.split((3, 4), -1), masks.split((3, 4), -1))]
    log_prob, entropy, _ = policy.evaluate(obs, actions, masks)
    torch.testing.assert_close(log_prob, parts[0].log_prob(actions[:, 0]) + parts[1].log_prob(actions[:, 1]))
    torch.testing.assert_close(log_probs, log_prob)
    ref_entropy = sum(-(dist.probs * torch.where(mask, dist.logits, 0.0)).sum(-1)
                      for dist, mask in zip(parts, masks.split((3, 4), -1)))
    torch.testing.assert_close(entropy, ref_entropy)


def test_check_action_masks_refuses_wrong_shapes_and_rows_without_an_allowed_action():
    space = gym.spaces.Discrete(4)
    assert check_action_masks([[1, 0, 0, 1]], space, 1, "test").dtype == bool
    with pytest.raises(UserError, match=r"action mask from test has shape \[1, 3\].*\[1, 4\]"):
        check_action_masks([[1, 0, 1]], space, 1, "test")
    with pytest.raises(UserError, match=r"allows no action in row \[1\]"):
        check_action_masks([[1, 0, 0, 0], [0, 0, 0, 0]], space, 2, "test")
    with pytest.raises(UserError, match="in some component"):
        check_action_masks([[1, 1, 0, 0, 0]], gym.spaces.MultiDiscrete([2, 3]), 1, "test")
    with pytest.raises(UserError, match="Discrete and MultiDiscrete actions only"):
        check_action_masks([[1, 1]], gym.spaces.Box(-1, 1, (2,)), 1, "test")


def test_taxi_masks_follow_every_observation_including_after_autoreset():
    env = rlspeed.make_env("Taxi-v4", num_envs=4, seed=0, backend="gymnasium")
    reference = gym.make("Taxi-v4").unwrapped
    obs, info = env.reset()
    generator = torch.Generator().manual_seed(0)
    finished = 0
    for _ in range(300):
        masks = info["action_mask"]
        assert masks.dtype == torch.bool and masks.shape == (4, 6)
        expected = np.stack([reference.action_mask(int(state)) for state in obs])
        np.testing.assert_array_equal(masks.numpy(), expected.astype(bool))
        # random allowed actions (a mostly masked env would rarely finish an episode otherwise)
        choice = torch.multinomial(masks.float(), 1, generator=generator)[:, 0]
        obs, _, terminated, truncated, info = env.step(choice)
        finished += int((terminated | truncated).sum())
    env.close()
    assert finished > 0  # the loop crossed autoresets


class _BadMask(gym.Wrapper):
    """Taxi with a broken info["action_mask"]: `kind` "short" (one flag missing) or "empty" (nothing allowed after
    a few steps)."""

    def __init__(self, env, kind: str):
        super().__init__(env)
        self.kind, self.steps = kind, 0

    def _fix(self, info):
        mask = np.asarray(info["action_mask"])
        if self.kind == "short":
            mask = mask[:-1]
        elif self.steps >= 3:
            mask = np.zeros_like(mask)
        return {**info, "action_mask": mask}

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return obs, self._fix(info)

    def step(self, action):
        self.steps += 1
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, self._fix(info)


def _bad_env(kind: str):
    vector = gym.vector.SyncVectorEnv([lambda: _BadMask(gym.make("Taxi-v4"), kind)] * 2,
                                      autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    return rlspeed.make_env(vector)


@pytest.mark.parametrize("kind, message", [("short", r"has shape \[2, 5\].*needs \[2, 6\]"),
                                           ("empty", "allows no action")])
def test_training_on_a_broken_mask_stops_with_one_sentence(kind, message):
    model = rlspeed.PPO(_bad_env(kind), seed=0, num_envs=2, num_steps=8, batch_size=16)
    with pytest.raises(UserError, match=message):
        model.learn(64, progress_bar=False)


def test_ppo_rollout_stores_the_mask_of_each_observation_and_masking_off_ignores_masks():
    model = rlspeed.PPO("Taxi-v4", seed=0, num_envs=4, num_steps=32, batch_size=64, n_epochs=1)
    model.learn(128, progress_bar=False)
    buf = model.buffer
    reference = gym.make("Taxi-v4").unwrapped
    expected = np.stack([[reference.action_mask(int(s)) for s in row] for row in buf.obs.numpy()]).astype(bool)
    np.testing.assert_array_equal(buf.action_masks.numpy(), expected)
    taken = buf.action_masks.gather(-1, buf.actions.long().unsqueeze(-1))
    assert taken.all()  # no stored action was masked
    assert "action masks" in model.update_summary()["reason"]

    unmasked = rlspeed.PPO("Taxi-v4", seed=0, num_envs=4, num_steps=32, batch_size=64, n_epochs=1, use_masking=False)
    unmasked.learn(128, progress_bar=False)
    assert unmasked.buffer.action_masks is None


def test_predict_and_evaluate_use_masks():
    model = rlspeed.PPO("Taxi-v4", seed=0, num_envs=2, num_steps=8, batch_size=16)
    obs = np.array([0, 1, 2])
    masks = np.zeros((3, 6), dtype=bool)
    masks[:, 4] = True  # only "pickup" allowed
    actions, _ = model.predict(obs, action_masks=masks)
    assert (actions == 4).all()
    action, _ = model.predict(0, action_masks=masks[0])  # one observation, one mask
    assert action == 4
    with pytest.raises(UserError, match=r"predict\(action_masks=...\) has shape"):
        model.predict(obs, action_masks=masks[:, :5])
    with pytest.raises(UserError, match="allows no action"):
        model.predict(obs, action_masks=np.zeros((3, 6), dtype=bool))
    # deterministic evaluation on Taxi never takes an illegal move: no -10 penalty in any episode
    returns = model.evaluate(episodes=4, seed=0)["returns"]
    assert all(r == -200.0 or r > -200 for r in returns)
