"""Action spaces beyond Discrete and 1-D Box: MultiDiscrete (factorised categorical), MultiBinary (Bernoulli), Box of
any shape, for PPO, A2C and RecurrentPPO; save/load of each policy kind gives identical actions."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

import rlspeed
from rlspeed.errors import UserError
from rlspeed.nn import ActorCritic


def test_multi_categorical_and_bernoulli_match_torch_distributions():
    torch.manual_seed(0)
    obs = torch.randn(64, 5)
    multi = ActorCritic(5, 0, False, (16,), action_space=gym.spaces.MultiDiscrete([3, 2, 4]))
    actions, log_probs, _ = multi.act(obs)
    assert actions.shape == (64, 3) and (actions < torch.tensor([3, 2, 4])).all()
    logits, _ = multi(obs)
    parts = [torch.distributions.Categorical(logits=part) for part in logits.split((3, 2, 4), -1)]
    log_prob, entropy, _ = multi.evaluate(obs, actions)
    torch.testing.assert_close(log_prob, sum(d.log_prob(actions[:, i]) for i, d in enumerate(parts)))
    torch.testing.assert_close(log_probs, log_prob)
    torch.testing.assert_close(entropy, sum(d.entropy() for d in parts))

    binary = ActorCritic(5, 0, False, (16,), action_space=gym.spaces.MultiBinary(6))
    actions, log_probs, _ = binary.act(obs)
    assert actions.shape == (64, 6) and set(actions.unique().tolist()) <= {0.0, 1.0}
    logits, _ = binary(obs)
    reference = torch.distributions.Bernoulli(logits=logits)
    log_prob, entropy, _ = binary.evaluate(obs, actions)
    torch.testing.assert_close(log_prob, reference.log_prob(actions).sum(-1))
    torch.testing.assert_close(log_probs, log_prob)
    torch.testing.assert_close(entropy, reference.entropy().sum(-1))
    deterministic, _, _ = binary.act(obs, deterministic=True)
    torch.testing.assert_close(deterministic, (logits > 0).float())


class MatrixActions(gym.Env):
    """Reward 1 - mean |a - target| for a 2x2 Box action (one-step episodes): a Box action that is not a vector."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,))
    action_space = gym.spaces.Box(-1.0, 1.0, (2, 2))

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        assert action.shape == (2, 2)
        target = np.array([[0.5, -0.5], [0.0, 0.25]])
        return self.observation_space.sample(), float(1 - np.abs(action - target).mean()), True, False, {}


def _matrix_env(num_envs: int = 4):
    return gym.vector.SyncVectorEnv([MatrixActions] * num_envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def _sb3_env(kind: str, num_envs: int = 4):
    from sb3_contrib.common.envs import InvalidActionEnvMultiDiscrete
    from stable_baselines3.common.envs import IdentityEnvMultiBinary, IdentityEnvMultiDiscrete
    from stable_baselines3.common.vec_env import DummyVecEnv

    make = {"multi_discrete": lambda: IdentityEnvMultiDiscrete(dim=3, ep_length=20),
            "multi_binary": lambda: IdentityEnvMultiBinary(dim=4, ep_length=20),
            "masked_multi_discrete": lambda: InvalidActionEnvMultiDiscrete(dims=[3, 3], ep_length=20,
                                                                           n_invalid_actions=2)}[kind]
    return DummyVecEnv([make] * num_envs)


def test_box_actions_of_any_shape_reach_the_env_in_their_shape():
    model = rlspeed.PPO(_matrix_env(), seed=0, num_envs=4, num_steps=16, batch_size=64)
    model.learn(128, progress_bar=False)  # MatrixActions asserts the shape it gets
    assert model.buffer.actions.shape == (16, 4, 4)  # stored flat
    action, _ = model.predict(np.zeros(3, dtype=np.float32))
    assert action.shape == (2, 2) and np.all(np.abs(action) <= 1)


@pytest.mark.parametrize("algo", [rlspeed.PPO, rlspeed.A2C, rlspeed.RecurrentPPO])
@pytest.mark.parametrize("kind", ["multi_discrete", "multi_binary"])
def test_on_policy_algorithms_train_on_multi_discrete_and_multi_binary_actions(algo, kind):
    pytest.importorskip("stable_baselines3")
    extra = {"batch_size": 64} if algo is not rlspeed.A2C else {}
    model = algo(_sb3_env(kind), seed=0, num_envs=4, num_steps=16, **extra)
    model.learn(128, progress_bar=False)
    stored = model.buffer.actions
    if kind == "multi_discrete":
        assert stored.shape == (16, 4, 2) and not stored.is_floating_point() and (stored < 3).all()
    else:
        assert stored.shape == (16, 4, 4) and set(stored.unique().tolist()) <= {0.0, 1.0}
    assert model.update_summary()["implementation"] != "hand-derived"


def test_off_policy_algorithms_refuse_multi_discrete_actions_in_one_sentence():
    pytest.importorskip("stable_baselines3")
    with pytest.raises(UserError, match=r"does not take MultiDiscrete actions.*use a2c, ppo or recurrent_ppo\.$"):
        rlspeed.DQN(_sb3_env("multi_discrete"), seed=0)


def test_sb3_contrib_action_masks_method_is_read_and_respected():
    pytest.importorskip("sb3_contrib")
    env = _sb3_env("masked_multi_discrete")
    model = rlspeed.PPO(env, seed=0, num_envs=4, num_steps=16, batch_size=64)
    model.learn(128, progress_bar=False)
    buf = model.buffer
    assert buf.action_masks is not None and buf.action_masks.shape == (16, 4, 6)
    first = buf.action_masks[..., :3].gather(-1, buf.actions[..., :1].long())
    second = buf.action_masks[..., 3:].gather(-1, buf.actions[..., 1:].long())
    assert first.all() and second.all()


def _policy_kinds():
    kinds = [("ppo", "CartPole-v1", {}), ("ppo", "Pendulum-v1", {}), ("ppo", "taxi", {}), ("ppo", "matrix", {}),
             ("a2c", "taxi", {})]
    kinds += [("ppo", "multi_discrete", {}), ("ppo", "multi_binary", {}), ("a2c", "multi_binary", {}),
              ("recurrent_ppo", "masked_multi_discrete", {}), ("ppo", "masked_multi_discrete", {})]
    return kinds


@pytest.mark.parametrize("algo, task, extra", _policy_kinds())
def test_save_and_load_give_identical_actions_for_every_policy_kind(tmp_path, algo, task, extra):
    cls = {"ppo": rlspeed.PPO, "a2c": rlspeed.A2C, "recurrent_ppo": rlspeed.RecurrentPPO}[algo]
    if task == "taxi":
        env = "Taxi-v4"
    elif task == "matrix":
        env = _matrix_env()
    elif task in ("CartPole-v1", "Pendulum-v1"):
        env = task
    else:
        pytest.importorskip("sb3_contrib")
        env = _sb3_env(task)
    options = {"num_envs": 4, "num_steps": 16} | ({"batch_size": 64} if algo != "a2c" else {})
    model = cls(env, seed=0, **options, **extra)
    model.learn(64, progress_bar=False)
    path = model.save(tmp_path / "model")
    loaded = cls.load(path)
    assert loaded.spec.action_space == model.spec.action_space
    space = model.spec.observation_space
    obs = np.stack([space.sample() for _ in range(5)])
    masks = None
    if task == "taxi":
        masks = np.stack([gym.make("Taxi-v4").unwrapped.action_mask(int(s)) for s in obs]).astype(bool)
    elif task == "masked_multi_discrete":
        masks = np.ones((5, 6), dtype=bool)
        masks[:, 0] = masks[:, 4] = False
    original, _ = model.predict(obs, action_masks=masks)
    again, _ = loaded.predict(obs, action_masks=masks)
    np.testing.assert_array_equal(original, again)
    assert original.shape == (5, *model.spec.action_space.shape)
    if masks is not None and task == "taxi":
        assert masks[np.arange(5), original].all()


class _CheckedBox(gym.Env):
    """An env with the given Box actions that counts the actions it receives outside its space (as an env that
    asserts `action_space.contains(action)` would fail on them)."""

    def __init__(self, low, high, dtype=np.float32):
        self.observation_space = gym.spaces.Box(-1, 1, (3,), np.float32)
        self.action_space = gym.spaces.Box(np.array(low, dtype), np.array(high, dtype), dtype=dtype)
        self.outside, self.steps = 0, 0

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.steps += 1
        self.outside += not self.action_space.contains(action)
        return np.zeros(3, np.float32), 0.0, False, self.steps % 20 == 0, {}


FLOAT32_MAX = float(np.finfo(np.float32).max)


@pytest.mark.parametrize("algo", [rlspeed.PPO, rlspeed.SAC, rlspeed.TD3])
@pytest.mark.parametrize("bounds", [
    ([-0.1], [0.3], np.float64),  # (float64 bounds float32 cannot hold: a float32 action just past them)
    ([0.1], [0.3], np.float32),  # (asymmetric: center + half_range * 1 rounds past high)
    ([-9.1805296], [-3.6176543], np.float32),
    ([-FLOAT32_MAX] * 2, [FLOAT32_MAX] * 2, np.float32),  # (float32's widest: (high - low) / 2 overflowed to inf)
])
def test_every_box_action_the_env_receives_is_in_its_space(algo, bounds):
    vector = gym.vector.SyncVectorEnv([lambda: _CheckedBox(*bounds)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    # (small networks and batches: the ~110 updates of SAC and TD3 only have to move the actor, not learn)
    options = {"num_steps": 16, "batch_size": 16} if algo is rlspeed.PPO else {"learning_starts": 10,
                                                                                 "batch_size": 16, "net_arch": (16,)}
    model = algo(vector, seed=0, device="cpu", **options)
    model.learn(120, progress_bar=False)
    env = vector.envs[0]
    assert env.steps >= 120 and env.outside == 0
    if algo is not rlspeed.PPO:  # (the actor's extreme outputs, as a saturated tanh gives them, stay in the bounds)
        extremes = model._to_env(torch.tensor([[1.0] * len(bounds[0]), [-1.0] * len(bounds[0])]))
        low, high = np.asarray(bounds[0], np.float32), np.asarray(bounds[1], np.float32)
        assert (extremes.numpy() <= high).all() and (extremes.numpy() >= low).all()


@pytest.mark.parametrize("algo", [rlspeed.PPO, rlspeed.SAC, rlspeed.TD3, rlspeed.RecurrentPPO])
def test_predict_gives_members_of_a_float64_box_at_its_bounds(algo):
    """predict's actions go to the env as they are (`env.step(model.predict(obs)[0])`): a float32 action clipped to
    float32 bounds was past float64 ones (0.1 as float32 is above 0.1), outside the space."""
    vector = gym.vector.SyncVectorEnv([lambda: _CheckedBox([-0.1], [0.1], np.float64)],
                                      autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    options = {} if algo in (rlspeed.SAC, rlspeed.TD3) else {"num_steps": 16, "batch_size": 16}
    model = algo(vector, seed=0, device="cpu", **options)
    with torch.no_grad():  # (the policy at its upper bound: every output is its bias, 50)
        for name, parameter in model.policy.named_parameters():
            parameter.fill_(50.0 if "bias" in name else 0.0)
    obs = np.zeros((2, 3), np.float32)
    for deterministic in (True, False):
        actions = model.predict(obs, deterministic=deterministic)[0]
        assert actions.dtype == np.float64 and all(model.action_space.contains(action) for action in actions)
    assert model.action_space.contains(model.predict(obs[0])[0])


def test_box_actions_beyond_float32_or_of_integers_are_refused_in_one_sentence():
    wide = gym.vector.SyncVectorEnv([lambda: _CheckedBox([-1e300], [1e300], np.float64)],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    with pytest.raises(UserError, match="action bounds .* are beyond float32's numbers"):
        rlspeed.SAC(wide, device="cpu")
    integers = gym.vector.SyncVectorEnv([lambda: _CheckedBox([0], [10], np.int64)],
                                        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    for algo in (rlspeed.PPO, rlspeed.SAC, rlspeed.DQN):  # (DQN advised a2c or ppo, which refuse the dtype)
        with pytest.raises(UserError, match=r"Box actions of dtype int64; .*Discrete\(high - low \+ 1\).* low \+ a"
                                            r" .*\(a2c, dqn, ppo or recurrent_ppo train on it\)"):
            algo(integers, device="cpu")
    scalar = gym.vector.SyncVectorEnv([lambda: _CheckedBox(0, 10, np.int64)],  # (a 0-dim Box: one integer too; it
                                      autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)  # was told MultiDiscrete)
    with pytest.raises(UserError, match=r"action_space is Discrete\(high - low \+ 1\).*\(a2c, dqn, ppo or recurrent"):
        rlspeed.DQN(scalar, device="cpu")
    pairs = gym.vector.SyncVectorEnv([lambda: _CheckedBox([0, 0], [10, 10], np.int64)],
                                     autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    with pytest.raises(UserError, match=r"MultiDiscrete\(high - low \+ 1\).*\(a2c, ppo or recurrent_ppo train on it"):
        rlspeed.DQN(pairs, device="cpu")


class _AsIndices(gym.ActionWrapper):
    """The wrapper the integer Box's refusal describes: Discrete (one integer) or MultiDiscrete(high - low + 1), whose
    action(a) returns low + a in the Box's shape and dtype."""

    def __init__(self, env):
        super().__init__(env)
        box = env.action_space
        self.action_space = (gym.spaces.Discrete(int(box.high[0] - box.low[0] + 1)) if box.shape == (1,)
                             else gym.spaces.MultiDiscrete(box.high - box.low + 1))

    def action(self, action):
        box = self.env.action_space
        return (box.low + np.reshape(action, box.shape)).astype(box.dtype)


@pytest.mark.parametrize(("algo", "low", "high"), [(rlspeed.DQN, [-3], [4]), (rlspeed.PPO, [-3, 1], [4, 2])])
def test_the_wrapper_an_integer_box_is_advised_trains_on_its_members(algo, low, high):
    vector = gym.vector.SyncVectorEnv([lambda: _AsIndices(_CheckedBox(low, high, np.int64))],
                                      autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    options = {"learning_starts": 10, "batch_size": 16} if algo is rlspeed.DQN else {"num_steps": 16, "batch_size": 16}
    algo(vector, seed=0, device="cpu", **options).learn(40, progress_bar=False)
    env = vector.envs[0].unwrapped
    assert env.steps >= 40 and env.outside == 0


class OffCenterActions(gym.Env):
    """Box actions in [0, 10] x [5, 6] (a throttle and a gear's range, say)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def __init__(self, low=(0.0, 5.0), high=(10.0, 6.0)):
        self.action_space = gym.spaces.Box(np.array(low, np.float32), np.array(high, np.float32))

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, False, {}


def test_box_bounds_off_center_are_said_with_the_rescaling_wrapper():
    """A Gaussian policy starts around 0 and its samples are clipped to the bounds: a component whose range lies off
    0 ([5, 6]) stood at its bound and learnt nothing, without a word (Stable-Baselines3's env checker warns)."""
    def vector_env(**bounds):
        return gym.vector.SyncVectorEnv([lambda: gym.wrappers.TimeLimit(OffCenterActions(**bounds), 8)] * 2,
                                        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)

    with pytest.warns(UserWarning, match=r"bounds are not centred on 0 \(component 0: \[0, 10\]\).*RescaleAction"):
        rlspeed.PPO(vector_env(), device="cpu", num_steps=8, batch_size=16).learn(16, progress_bar=False)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # (centred bounds, [-2, 2] x [-1, 1]: no warning)
        rlspeed.PPO(vector_env(low=(-2.0, -1.0), high=(2.0, 1.0)), device="cpu", num_steps=8,
                    batch_size=16).learn(16, progress_bar=False)
