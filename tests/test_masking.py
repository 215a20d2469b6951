"""Action masking as sb3-contrib's MaskablePPO defines it: masks from the env (info["action_mask"] or action_masks()),
applied in sampling, log-probs and entropy, stored with the rollout, used by predict and evaluate; bad masks refused
with one sentence."""

from __future__ import annotations

import warnings
from functools import partial

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import masked_vector_env_id

import rlspeed
from rlspeed.envs.gymnasium_env import check_action_masks
from rlspeed.errors import UserError
from rlspeed.nn import ActorCritic


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
    with pytest.raises(UserError, match=r"in rows \[0, 1, 2, 3, 4\] and 3 more"):  # (all 8 rows empty)
        check_action_masks([[0, 0, 0, 0]] * 8, space, 8, "test")
    with pytest.raises(UserError, match="in some component"):
        check_action_masks([[1, 1, 0, 0, 0]], gym.spaces.MultiDiscrete([2, 3]), 1, "test")
    with pytest.raises(UserError, match="Discrete and MultiDiscrete actions only"):
        check_action_masks([[1, 1]], gym.spaces.Box(-1, 1, (2,)), 1, "test")


def test_a_transposed_mask_is_refused_not_reshaped_into_other_rows_flags():
    """A mask [n, N] holds the N * n flags of [N, n]: reshaped, each row took flags of other rows, and predict chose
    actions the caller's mask forbade. Masks of the rows' flags in order ([1, N, n], a flat [N * n], a
    MultiDiscrete's [N, k, m]) are still taken."""
    space = gym.spaces.Discrete(6)
    mask = np.zeros((2, 6), bool)
    mask[0, 4] = mask[1, 1] = True
    with pytest.raises(UserError, match=r"has shape \[6, 2\], but Discrete\(6\) needs \[2, 6\]"):
        check_action_masks(mask.T, space, 2, "test")
    for same in (mask[None], mask.ravel(), mask.T.T):
        assert np.array_equal(check_action_masks(same, space, 2, "test"), mask)
    components = np.ones((3, 2, 3), bool)  # MultiDiscrete([3, 3]): 3 rows of 2 components of 3 flags
    assert check_action_masks(components, gym.spaces.MultiDiscrete([3, 3]), 3, "test").shape == (3, 6)
    taxi = rlspeed.PPO("Taxi-v4", seed=0, num_envs=2, num_steps=8, device="cpu")
    assert taxi.predict(np.array([0, 1]), action_masks=mask)[0].tolist() == [4, 1]
    with pytest.raises(UserError, match=r"has shape \[6, 2\]"):
        taxi.predict(np.array([0, 1]), action_masks=mask.T)


@pytest.mark.parametrize("backend", ["gymnasium", "gymnasium-async"])
def test_taxi_masks_follow_every_observation_including_after_autoreset(backend):
    """In-process envs (stepped env by env) and subprocess envs (stepped through the vector env) alike."""
    env = rlspeed.make_env("Taxi-v4", num_envs=4, seed=0, backend=backend)
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
        # (the masks of the finished episodes' last observations, before the reset: a DQN target's next actions)
        expected = np.stack([reference.action_mask(int(state)) for state in info["final_obs"]])
        np.testing.assert_array_equal(info["final_action_mask"].numpy(), expected.astype(bool))
    env.close()
    assert finished > 0  # the loop crossed autoresets


def test_sb3_vec_env_masks_in_infos_follow_every_observation_and_train_masked():
    """An SB3 VecEnv of Taxi (`make_vec_env`) gives its masks in the infos (a new episode's in `reset_infos`): they are
    read as Gymnasium's are, and a model trained on it masks (it trained unmasked without a word)."""
    env_util = pytest.importorskip("stable_baselines3.common.env_util")
    env = rlspeed.make_env(env_util.make_vec_env("Taxi-v4", n_envs=3, seed=0))
    reference = gym.make("Taxi-v4").unwrapped
    obs, info = env.reset(seed=0)
    generator = torch.Generator().manual_seed(0)
    finished = 0
    for _ in range(300):
        expected = np.stack([reference.action_mask(int(state)) for state in obs]).astype(bool)
        np.testing.assert_array_equal(info["action_mask"].numpy(), expected)
        obs, _, terminated, truncated, info = env.step(torch.multinomial(info["action_mask"].float(), 1,
                                                                         generator=generator)[:, 0])
        finished += int((terminated | truncated).sum())
    assert finished > 0  # the loop crossed autoresets
    env.close()
    from stable_baselines3.common.vec_env import VecMonitor

    for vec_env in (env_util.make_vec_env("Taxi-v4", n_envs=2, seed=0),
                    VecMonitor(env_util.make_vec_env("Taxi-v4", n_envs=2, seed=0))):  # (a wrapper's own reset_infos)
        model = rlspeed.PPO(vec_env, seed=0, num_envs=2, num_steps=16, batch_size=32)
        model.learn(64, progress_bar=False)
        assert model.trained_with_action_masks


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


def test_use_masking_set_on_model_config_reaches_the_next_learn_or_is_refused():
    """`model.config.use_masking = False` between learn calls was taken without a word and ignored: the further learn
    kept the rollout (or replay) made with masks and went on masking. Now on-policy the next learn makes its rollout
    without them; off-policy, whose replay keeps the masked transitions, it is refused in one sentence, as the replay's
    other settings are; learn(use_masking=...) names load's way for a loaded model."""
    model = rlspeed.PPO("Taxi-v4", seed=0, num_envs=2, num_steps=16, batch_size=32, n_epochs=1, device="cpu")
    model.learn(32, progress_bar=False)
    assert model.buffer.action_masks is not None
    model.config.use_masking = False
    model.learn(32, progress_bar=False)
    assert model.buffer.action_masks is None and "action masks" not in model.update_summary()["reason"]
    with pytest.raises(UserError, match=r"given when it is made \(PPO\(env, use_masking=\.\.\.\)\) or loaded "
                                        r"\(PPO\.load\(path, use_masking=\.\.\.\)\)"):
        model.learn(32, use_masking=True)
    dqn = rlspeed.DQN("Taxi-v4", seed=0, num_envs=2, learning_starts=16, device="cpu")
    dqn.learn(32, progress_bar=False)
    dqn.config.use_masking = False
    with pytest.raises(UserError, match=r"model.config.use_masking is False, but the replay buffer .* "
                                        r"DQN.load\(path, use_masking=False\)"):
        dqn.learn(32, progress_bar=False)


def test_predict_and_evaluate_use_masks():
    model = rlspeed.PPO("Taxi-v4", seed=0, num_envs=2, num_steps=8, batch_size=16)
    obs = np.array([0, 1, 2])
    masks = np.zeros((3, 6), dtype=bool)
    masks[:, 4] = True  # only "pickup" allowed
    actions, _ = model.predict(obs, action_masks=masks)
    assert (actions == 4).all()
    action, _ = model.predict(0, action_masks=masks[0])  # one observation, one mask
    assert action == 4
    with pytest.raises(UserError, match=r"predict\(action_masks=...\) has shape .* give one flag per action for each "
                                        r"observation"):  # (the caller's mask: nothing to fix in the env)
        model.predict(obs, action_masks=masks[:, :5])
    with pytest.raises(UserError, match=r"allows no action in rows \[0, 1, 2\]: .*allow one for each observation\.$"):
        model.predict(obs, action_masks=np.zeros((3, 6), dtype=bool))  # (not "fix the env's mask": the caller's)
    # an algorithm without masks names those that take them, DQN among them
    with pytest.raises(UserError, match="^SAC does not take action masks: drop action_masks, or use a2c, dqn, "
                                        "ppo or recurrent_ppo.$"):
        rlspeed.SAC("Pendulum-v1").act(torch.zeros(2, 3), action_masks=torch.ones(2, 2, dtype=torch.bool))
    assert (rlspeed.DQN("Taxi-v4").act(torch.tensor([0, 1, 2]), action_masks=torch.as_tensor(masks)) == 4).all()
    # deterministic evaluation on Taxi never takes an illegal move: one would leave the state unchanged, so the
    # deterministic policy would repeat it (-10 a step) to the 200-step limit, far below -200
    returns = model.evaluate(episodes=4, seed=0)["returns"]
    assert all(r >= -200 for r in returns)


# --- DQN: greedy and exploring choices, the target's argmax, replay, save/load ------------------------------------
class _MaskedPick(gym.Env):
    """One-step episodes: the observation is a target t in 1..4, an action equal to t earns 1. Action 0 is always
    masked but earns 2 if taken (what an agent that ignores the mask learns to pick); the other non-target actions
    are allowed at random. `taken` counts every action chosen, over all instances."""

    taken = np.zeros(5, dtype=np.int64)

    def __init__(self):
        self.observation_space = gym.spaces.Discrete(5)
        self.action_space = gym.spaces.Discrete(5)
        self.target = 1

    def _info(self):
        mask = self.np_random.random(5) < 0.5
        mask[0], mask[self.target] = False, True
        return {"action_mask": mask}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.target = int(self.np_random.integers(1, 5))
        return self.target, self._info()

    def step(self, action):
        action = int(action)
        _MaskedPick.taken[action] += 1
        reward = 2.0 if action == 0 else float(action == self.target)
        return self.target, reward, True, False, self._info()


_PICK_ID = "RlspeedTest/MaskedPick-v0"
if _PICK_ID not in gym.registry:
    gym.register(_PICK_ID, entry_point=_MaskedPick)

_DQN_SMALL = {"num_envs": 4, "learning_starts": 64, "train_freq": 4, "batch_size": 32, "target_update_interval": 200,
              "learning_rate": 1e-3, "exploration_fraction": 0.5, "net_arch": (32,)}


@pytest.mark.parametrize("use_masking", [True, False])
def test_dqn_never_chooses_a_masked_action_and_learns_the_masked_task(use_masking):
    _MaskedPick.taken[:] = 0
    model = rlspeed.DQN(_PICK_ID, seed=0, use_masking=use_masking, **_DQN_SMALL)
    model.learn(3000, progress_bar=False)  # random, then exploring, then mostly greedy choices
    if not use_masking:  # the forbidden action pays most: without masks DQN takes it (so the check below can fail)
        assert _MaskedPick.taken[0] > 0
        return
    assert _MaskedPick.taken[0] == 0 and _MaskedPick.taken.sum() == model.num_timesteps
    assert model.update_summary()["implementation"] == "autograd"
    assert model.evaluate(episodes=10, seed=1)["mean"] == 1.0  # the target, every time, among the allowed actions
    assert _MaskedPick.taken[0] == 0
    # exploration with epsilon = 1 (the random branch for every row) draws among the allowed actions only
    masks = torch.rand(2048, 5) < 0.5
    masks[:, 0], masks[:, 3] = False, True
    obs = torch.randint(1, 5, (2048,))
    for actions in (model._epsilon_greedy(model._greedy(obs, masks), 1.0, masks), model._random_actions(2048, masks),
                    model.act(obs, deterministic=True, action_masks=masks)):
        assert masks[torch.arange(2048), actions.long()].all()
    uniform = torch.rand(4, 2048, 5)
    model._draws = (0, torch.ones(4, 2048, dtype=torch.bool), uniform)  # a collection phase that explores everywhere
    model._masking = True
    actions = model._explore(obs, 0, masks)
    assert masks[torch.arange(2048), actions.long()].all()
    assert set(actions.tolist()) == set(masks.nonzero()[:, 1].tolist())  # every allowed action occurs


@pytest.mark.parametrize("double_q", [True, False])
def test_dqn_target_maximises_over_the_next_observations_allowed_actions(double_q):
    model = rlspeed.DQN(_PICK_ID, seed=0, double_q=double_q, net_arch=(16,))
    with torch.no_grad():
        for param in model.q_target.parameters():  # a target network unlike the online one
            param.add_(torch.randn_like(param))
    obs, next_obs = torch.randint(0, 5, (64,)), torch.randint(0, 5, (64,))
    actions, rewards = torch.randint(0, 5, (64,)), torch.randn(64)
    terminated, discounts = (torch.rand(64) < 0.2).float(), torch.full((64,), 0.99)
    online, target = model.q_network(next_obs).detach(), model.q_target(next_obs).detach()
    chooser = online if double_q else target
    masks = torch.rand(64, 5) < 0.6
    masks[torch.arange(64), chooser.argmin(1)] = True  # at least one allowed action
    masks[torch.arange(64), chooser.argmax(1)] = False  # the unmasked argmax is always forbidden
    best = chooser.masked_fill(~masks, -torch.inf).argmax(1)
    assert masks[torch.arange(64), best].all()
    expected_y = rewards + discounts * (1 - terminated) * target.gather(1, best[:, None])[:, 0]
    q_taken = model.q_network(obs).gather(1, actions[:, None])[:, 0]
    loss, _ = model._loss(obs, actions, rewards, next_obs, terminated, discounts, masks)
    torch.testing.assert_close(loss, torch.nn.functional.smooth_l1_loss(q_taken, expected_y))
    unmasked, _ = model._loss(obs, actions, rewards, next_obs, terminated, discounts)
    assert not torch.isclose(loss, unmasked)  # the mask changed the target


@pytest.mark.parametrize("n_step", [1, 3])
def test_dqn_replay_stores_the_next_observations_mask_and_survives_resume(n_step, tmp_path):
    options = {"num_envs": 4, "learning_starts": 100, "train_freq": 4, "buffer_size": 1024, "n_step": n_step}
    model = rlspeed.DQN("Taxi-v4", seed=0, save_replay_buffer=True, **options)
    model.learn(800, progress_bar=False)
    buffer, size = model.buffer, model.buffer.size
    reference = gym.make("Taxi-v4").unwrapped

    def env_masks(states):
        return torch.as_tensor(np.stack([reference.action_mask(int(s)) for s in states]).astype(bool))

    taken = env_masks(buffer.obs[:size]).gather(1, buffer.actions[:size].long()[:, None])
    assert taken.all()  # random and exploring actions were all allowed
    stored, expected = buffer.next_action_masks[:size], env_masks(buffer.next_obs[:size])
    # the mask at next_obs, also where the episode ended (the adapter's info["final_action_mask"])
    assert (stored == expected).all()
    model.save(tmp_path / "model")
    resumed = rlspeed.DQN("Taxi-v4", seed=0, **options)
    resumed.resume(tmp_path / "model")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (Gymnasium envs restart their episodes on resume, with a warning)
        resumed.learn(16, progress_bar=False)
    assert torch.equal(resumed.buffer.next_action_masks[:size], stored)


def test_dqn_save_load_keeps_masked_actions_and_use_masking_off_ignores_masks(tmp_path):
    model = rlspeed.DQN(_PICK_ID, seed=0, **_DQN_SMALL)
    model.learn(256, progress_bar=False)
    model.save(tmp_path / "dqn")
    loaded = rlspeed.DQN.load(tmp_path / "dqn")
    assert loaded.config.use_masking
    obs = np.arange(5)
    masks = np.zeros((5, 5), dtype=bool)
    masks[:, 2] = True
    masks[[0, 3], 4] = True
    actions, _ = loaded.predict(obs, action_masks=masks)
    assert masks[np.arange(5), actions].all()
    np.testing.assert_array_equal(actions, model.predict(obs, action_masks=masks)[0])
    np.testing.assert_array_equal(loaded.predict(obs)[0], model.predict(obs)[0])

    unmasked = rlspeed.DQN(_PICK_ID, seed=0, use_masking=False, **_DQN_SMALL)
    unmasked.learn(64, progress_bar=False)
    assert unmasked.buffer.next_action_masks is None
    assert "action masks" not in unmasked.update_summary()["reason"]


@pytest.mark.parametrize("algo, options", [
    ("PPO", {"num_envs": 8, "num_steps": 16, "batch_size": 64, "n_epochs": 2}),
    ("A2C", {"num_envs": 8, "num_steps": 5}),
    ("DQN", {"learning_starts": 32, "batch_size": 16, "net_arch": [16]}),
])
def test_masks_found_at_the_start_give_the_autograd_update_its_own_optimizer_state(algo, options):
    """On float vectors the hand-derived update is built first and gives way to autograd once the env shows masks;
    the parameters it held in its flat optimizer go back to torch's Adam with a step count each (a shared one ran
    ahead by one per parameter per step): training equals a run on autograd from the start."""
    cls, env_id = getattr(rlspeed, algo), masked_vector_env_id()
    switched = cls(env_id, seed=3, env_backend="gymnasium", **options)
    switched.learn(160, progress_bar=False)
    plain = cls(env_id, seed=3, env_backend="gymnasium", fused_update=False, **options)
    plain.learn(160, progress_bar=False)
    assert switched.update_summary()["implementation"] == plain.update_summary()["implementation"] == "autograd"
    for name, value in plain.policy.state_dict().items():
        torch.testing.assert_close(switched.policy.state_dict()[name], value, atol=1e-6, rtol=0, msg=name)


class _MultiBinaryWithMasks(gym.Env):
    """MultiBinary(3) actions and an info["action_mask"], which rlspeed does not apply to such actions."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.MultiBinary(3)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {"action_mask": np.ones(6, dtype=bool)}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, False, {"action_mask": np.ones(6, dtype=bool)}


def test_masks_of_actions_rlspeed_does_not_mask_are_a_warning_not_silence():
    """MultiBinary actions with masks (sb3-contrib's MaskablePPO applies them; rlspeed masks Discrete and
    MultiDiscrete only): one warning naming the env, on both adapters (training ignored them without a word)."""
    from rlspeed.envs import gymnasium_env

    gym.register("rlspeed-test/MultiBinaryMasks-v0", entry_point=_MultiBinaryWithMasks, max_episode_steps=10)
    gymnasium_env._WARNED_MASKS = gymnasium_env._WarnedOnce()
    try:
        with pytest.warns(UserWarning, match="MultiBinaryMasks-v0 gives action masks for its MultiBinary actions"):
            rlspeed.PPO("rlspeed-test/MultiBinaryMasks-v0", seed=0, device="cpu", num_envs=2, num_steps=8,
                        batch_size=16).learn(16, progress_bar=False)
    finally:
        del gym.registry["rlspeed-test/MultiBinaryMasks-v0"]
    contrib = pytest.importorskip("sb3_contrib.common.envs")
    from stable_baselines3.common.vec_env import DummyVecEnv

    for _ in range(2):  # (each vector env a user passes: they share one placeholder id)
        vec_env = DummyVecEnv([lambda: contrib.InvalidActionEnvMultiBinary(dims=3, n_invalid_actions=1)] * 2)
        with pytest.warns(UserWarning, match="gives action masks for its MultiBinary actions"):
            rlspeed.PPO(vec_env, seed=0, device="cpu", num_steps=8, batch_size=16)


@pytest.mark.parametrize("algo, options", [(rlspeed.PPO, {"num_steps": 16, "batch_size": 32}),
                                           (rlspeed.DQN, {"learning_starts": 8})])
def test_use_masking_asked_for_on_an_env_without_masks_is_said_once(algo, options, tmp_path):
    """A port from sb3-contrib that lost its ActionMasker wrapper trains unmasked: asking for masks says so (the
    saved config's use_masking, on loading or resuming, asks for nothing)."""
    from rlspeed import cli, yamlfile
    from rlspeed.errors import UnusedSettingWarning

    model = algo("CartPole-v1", seed=0, num_envs=2, use_masking=True, **options)
    with pytest.warns(UnusedSettingWarning, match="use_masking=True has no effect: CartPole-v1 gives no action masks"):
        model.learn(32, progress_bar=False)
    model.save(tmp_path / "model")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnusedSettingWarning)
        model.learn(32, progress_bar=False)  # (said once)
        algo("CartPole-v1", seed=0, num_envs=2, **options).learn(32, progress_bar=False)  # (the default: no word)
        algo.load(tmp_path / "model", env="CartPole-v1").learn(32, progress_bar=False)
        run = ["train", algo.name, "CartPole-v1", "--num-envs", "2", "--target-return", "none", "--no-progress",
               "--out", str(tmp_path / "run"), "--checkpoint-freq", "32", *sum((["--set", f"{k}={v}"]
                                                                              for k, v in options.items()), [])]
        assert cli.main([*run, "--total-timesteps", "64"]) == 0
        assert cli.main([*run, "--total-timesteps", "128", "--resume"]) == 0
        # (config.yaml's hyperparameters passed back, as docs/troubleshooting.md's reproducibility paragraph does:
        # they hold the default use_masking=True, which asked for nothing; it warned)
        hyper = yamlfile.read_file(tmp_path / "run" / "config.yaml")[1]["hyperparameters"]
        algo("CartPole-v1", seed=0, **hyper).learn(32, progress_bar=False)


class _MaskInObservation(gym.Env):
    """PettingZoo's classic games' convention: the mask is a key of a Dict observation (no info["action_mask"], no
    action_masks()); only action 2 of 3 is allowed."""

    observation_space = gym.spaces.Dict({"observation": gym.spaces.Box(0, 1, (4,), np.int8),
                                         "action_mask": gym.spaces.Box(0, 1, (3,), np.int8)})
    action_space = gym.spaces.Discrete(3)

    def _obs(self):
        return {"observation": np.zeros(4, np.int8), "action_mask": np.array([0, 0, 1], np.int8)}

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return self._obs(), {}

    def step(self, action):
        return self._obs(), 1.0 if action == 2 else -1.0, True, False, {}


@pytest.mark.parametrize("algo, options", [(rlspeed.PPO, {"num_steps": 8, "batch_size": 16}),
                                           (rlspeed.DQN, {"learning_starts": 8})])
def test_a_mask_held_only_in_the_observation_is_said_to_mask_nothing(algo, options):
    """A PettingZoo classic game's Dict observation with an 'action_mask' key trained with illegal actions allowed
    and no word (the key is one more input): one warning per model; use_masking=False silences it."""
    vector_env = gym.vector.SyncVectorEnv([_MaskInObservation] * 2, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    model = algo(vector_env, seed=0, device="cpu", **options)
    with pytest.warns(UserWarning, match=r"observations hold an 'action_mask' key, which the policy reads as an input "
                                         r"but which masks no action"):
        model.learn(16, progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        model.learn(16, progress_bar=False)  # (said once)
        algo(vector_env, seed=0, device="cpu", use_masking=False, **options).learn(16, progress_bar=False)


def test_a_population_members_model_asks_for_no_masks():
    """member_model builds a solo model from the population's whole config (use_masking's default included): its
    learn says nothing about masks the env lacks."""
    from rlspeed.errors import UnusedSettingWarning
    from rlspeed.population import Population

    population = Population(rlspeed.PPO, "CartPole-v1", seeds=[0, 1], num_envs=2, num_steps=16, batch_size=32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnusedSettingWarning)
        population.member_model(0).learn(32, progress_bar=False)


class _LacksMasks(gym.Env):
    """Masks at reset and on steps, except where `lacks` says: "reset" (none at reset), "step" (none on steps),
    "none-step" (None as the steps' mask), "none-reset" (None as the reset's)."""

    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(3)

    def __init__(self, lacks=""):
        self.lacks = lacks

    def _info(self, call):
        if self.lacks == call:
            return {}
        return {"action_mask": None if self.lacks == f"none-{call}" else np.array([1, 0, 1], bool)}

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), self._info("reset")

    def step(self, action):
        return np.zeros(2, np.float32), 1.0, False, False, self._info("step")


@pytest.mark.parametrize("vector", [gym.vector.SyncVectorEnv, gym.vector.AsyncVectorEnv, "DummyVecEnv"])
def test_masks_given_on_steps_but_not_at_reset_are_said_to_be_unapplied(vector):
    """An env whose steps' infos hold "action_mask" but whose reset's does not trained with every action allowed,
    without a word: the masks are learnt of at reset. It warns now (in Stable-Baselines3's VecEnvs too), for each
    vector env a user passes (they share one placeholder id, which once warned of silenced every later one)."""
    step_only = partial(_LacksMasks, "reset")
    for _ in range(2):  # (a second env of the same kind in the same process is warned of too)
        if vector == "DummyVecEnv":
            venv = pytest.importorskip("stable_baselines3.common.vec_env").DummyVecEnv([step_only, step_only])
        else:
            venv = vector([step_only, step_only], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        with pytest.warns(UserWarning, match=r"info\['action_mask'\] on its steps but not at reset"):
            rlspeed.PPO(venv, num_steps=8, batch_size=16).learn(32, progress_bar=False)


@pytest.mark.parametrize(("first", "second", "call", "rows"), [("", "reset", "reset", r"env \[1\]"),
                                                          ("", "step", "step", r"env \[1\]"),
                                                          ("none-step", "none-step", "step", r"envs \[0, 1\]")])
def test_a_mask_missing_from_one_of_a_vector_envs_infos_is_named_not_read_as_allowing_nothing(first, second, call,
                                                                                             rows):
    """Gymnasium's vector envs merge infos into arrays, filling the rows of envs that gave no mask with zeros: read as
    masks, env 1's row 'allowed no action' (and masks that were all None gave 'has shape [2]'), naming the wrong
    problem."""
    venv = gym.vector.AsyncVectorEnv([partial(_LacksMasks, first), partial(_LacksMasks, second)],
                                     autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    env = rlspeed.make_env(venv, device="cpu")
    try:
        with pytest.raises(UserError, match=rf"gave no info\['action_mask'\] on this {call} for {rows}.*give it on "
                                            "every step and reset"):
            env.reset(seed=0)
            env.step(torch.zeros(2, dtype=torch.int64))
    finally:
        env.close()


class _ComponentMasks(gym.Env):
    """MultiDiscrete([2, 3]) whose `action_masks()` gives one flag array per component (a list), allowing action
    [1, 2] only, and whose episode's last observation allows no action of the second component."""

    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.MultiDiscrete([2, 3])

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def action_masks(self):
        return [np.array([False, True]), np.array([False, False, self.t < 3])]

    def step(self, action):
        assert list(action) == [1, 2], action
        self.t += 1
        return np.zeros(2, np.float32), 1.0, self.t >= 3, False, {}


def test_multi_discrete_masks_given_per_component_are_concatenated():
    """A mask per component ([3 flags], [4 flags]), for one observation or for each, was refused with numpy's
    'inhomogeneous shape' text; an episode's last observation whose mask allowed nothing in one component (a
    terminal state, where nothing is chosen) stopped training, as only fully empty last masks were let through."""
    space = gym.spaces.MultiDiscrete([3, 4])
    flat = np.array([[1, 0, 0, 0, 1, 1, 0], [0, 1, 0, 1, 0, 0, 0]], bool)
    per_component = [[row[:3], row[3:]] for row in flat]
    assert np.array_equal(check_action_masks(per_component[0], space, 1, "test"), flat[:1])
    assert np.array_equal(check_action_masks(tuple(per_component), space, 2, "test"), flat)
    with pytest.raises(UserError, match=r"one sequence per component of sizes \[3, 4\]"):
        check_action_masks([flat[0, :3], flat[0, 3:6]], space, 1, "test")
    from rlspeed.envs.gymnasium_env import final_action_masks

    last = {1: np.array([1, 0, 0, 0, 0, 0, 0], bool)}  # (row 1's last observation: nothing in component 2)
    assert final_action_masks(torch.ones(2, 7, dtype=torch.bool), last, space, "test").all()
    venv = gym.vector.SyncVectorEnv([_ComponentMasks] * 2, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    model = rlspeed.PPO(venv, seed=0, num_steps=8, batch_size=16, device="cpu")
    model.learn(32, progress_bar=False)  # (the env asserts every action is its only allowed one)
    assert model.predict(np.zeros((2, 2), np.float32), action_masks=[[[True, False], [False, True, False]]] * 2
                         )[0].tolist() == [[0, 1], [0, 1]]


def test_a_mask_of_values_other_than_0_and_1_is_refused_not_read_as_truthy():
    """An additive mask (0 allowed, -inf masked) was read as bools: every masked action allowed and every allowed one
    masked, silently. Bools and 0/1 of any dtype (Taxi's int8) are still taken."""
    space = gym.spaces.Discrete(4)
    assert check_action_masks(np.array([[0, 1, 1, 0]], np.int8), space, 1, "test").tolist() == [[False, True, True,
                                                                                                   False]]
    assert check_action_masks([[0.0, 1.0, 0.0, 0.0]], space, 1, "test").tolist() == [[False, True, False, False]]
    with pytest.raises(UserError, match=r"holds -inf, where a mask holds only bools or 0 and 1 .*0 and -inf would "
                                        r"read the other way round"):
        check_action_masks([[0.0, -np.inf, 0.0, 0.0]], space, 1, "test")
    model = rlspeed.PPO("Taxi-v4", seed=0, num_envs=2, num_steps=8, device="cpu")
    with pytest.raises(UserError, match=r"predict\(action_masks=...\) holds 0.5"):
        model.predict(0, action_masks=[0, 0, 0, 0, 0.5, 0])


@pytest.mark.parametrize(("vector", "call"), [(gym.vector.SyncVectorEnv, "reset"),
                                              (gym.vector.AsyncVectorEnv, "step")])
def test_one_envs_none_mask_after_anothers_mask_is_named_missing_not_read_as_allowing_nothing(vector, call):
    """Gymnasium's vector env writes env 1's None mask into the array env 0's mask began: a row of False, refused as
    a mask that 'allows no action in row [1]'. It is named as the missing mask it is."""
    venv = vector([_LacksMasks, partial(_LacksMasks, f"none-{call}")],
                  autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    env = rlspeed.make_env(venv, device="cpu")
    try:
        with pytest.raises(UserError, match=rf"gave no info\['action_mask'\] on this {call} for env \[1\]"):
            env.reset(seed=0)
            env.step(torch.zeros(2, dtype=torch.int64))
    finally:
        env.close()


def test_an_env_without_masks_keeps_gymnasiums_own_info_merging():
    """The note of envs whose mask was None (`_NoneMasks`, in place of the vector env's `_add_info`) is taken out once
    a reset shows no masks: CartPole's steps paid a Python call per env per step for it."""
    from rlspeed.envs.gymnasium_env import _NoneMasks

    venv = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2,
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    env = rlspeed.make_env(venv, device="cpu")
    try:
        env.reset(seed=0)
        env.step(torch.zeros(2, dtype=torch.int64))
        assert not isinstance(venv._add_info, _NoneMasks)
    finally:
        env.close()
