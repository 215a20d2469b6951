"""`predict` as a deployed policy calls it: one observation per control step, thousands of times a second. What it
takes (numpy arrays as an env or a user's code makes them) and what one call costs beyond the policy's own kernels
(counted in torch calls: the latency itself is benchmarks/predict_latency.py's, never a timing assert)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

import rlspeed


def test_the_actor_critic_reads_no_parameter_list_by_index(monkeypatch):
    """A ParameterList's `[i]` costs about 5 us (several Python calls), a small network's layer as much again: the
    ensemble reads the lists' entries directly, at every predict and rollout step."""
    model = rlspeed.PPO("CartPole-v1", seed=0, net_arch=(8,))
    indexed = []
    original = torch.nn.ParameterList.__getitem__
    monkeypatch.setattr(torch.nn.ParameterList, "__getitem__",
                        lambda self, index: indexed.append(index) or original(self, index))
    model.predict(np.zeros(4, np.float32))
    assert indexed == []


def test_the_actor_critic_runs_the_parameters_functional_call_gives_it():
    """The ensemble reads its ParameterLists' own entries, where `torch.func.functional_call` puts its stand-ins."""
    model = rlspeed.PPO("CartPole-v1", seed=0, net_arch=(8,))
    obs = torch.ones(3, 4)
    zeros = {name: torch.zeros_like(p) for name, p in model.policy.named_parameters()}
    logits, value = torch.func.functional_call(model.policy, zeros, (obs,))
    assert not logits.any() and not value.any()
    assert model.policy(obs)[0].any()


def test_predict_takes_an_array_with_negative_strides():
    """A mirrored or reversed observation (`np.flip`, `obs[::-1]`, a camera frame flipped in numpy) is a view with a
    negative stride, which torch cannot view: predict stopped with torch's ValueError ("At least one stride in the
    given numpy array is negative"); SB3's predict takes it. It acts on the values, as on a copy."""
    model = rlspeed.PPO("CartPole-v1", seed=0, net_arch=(8,))
    observations = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    flipped = np.flip(observations)  # (both axes reversed: strides (-16, -4))
    assert np.array_equal(model.predict(flipped)[0], model.predict(flipped.copy())[0])
    assert model.predict(flipped[0])[0] == model.predict(flipped[0].copy())[0]


def test_a_models_observation_space_goes_with_the_model():
    """predict found each space's observation layout once in a cache of the module's, which held up to 64 spaces (an
    env's observation space can be large: a Box's bounds per pixel) past the models they were of. The model's spec
    keeps its layout: a model gone, its space goes too."""
    import gc
    import weakref

    import gymnasium as gym

    from rlspeed.envs.base import EnvSpec

    space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    model = rlspeed.PPO(EnvSpec("Spaced-v0", (3,), gym.spaces.Discrete(2), None, None, space), device="cpu",
                        num_envs=1, num_steps=8, batch_size=8, net_arch=(8,))
    assert model.predict(np.zeros(3, np.float32), deterministic=True)[0] in (0, 1)
    with pytest.raises(rlspeed.UserError, match="shape"):  # (checked against the layout as before)
        model.predict(np.zeros(2, np.float32))
    freed = weakref.ref(space)
    del model, space
    gc.collect()
    assert freed() is None


def test_recurrent_predict_takes_a_state_with_negative_strides():
    """The state given back may be a flipped view too (the observation's rule: acted on as its copy)."""
    recurrent = rlspeed.RecurrentPPO("CartPole-v1", seed=0, lstm_hidden_size=8, net_arch=(8,))
    observations = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    _, state = recurrent.predict(observations)
    flipped = tuple(np.flip(np.flip(s, 2).copy(), 2) for s in state)  # (the same values, a negative stride)
    actions, next_state = recurrent.predict(observations, state=flipped)
    expected, expected_state = recurrent.predict(observations, state=state)
    assert np.array_equal(actions, expected) and np.array_equal(next_state[0], expected_state[0])


class TorchCalls(TorchFunctionMode):
    """The names of the torch functions and tensor methods called inside the block."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


# case -> (make the model, one observation, predict's other arguments, most torch calls one predict may make); the
# counts before the overhead was cut: 31, 42, 49, 22, 20, 67 (a check once in predict and again in act, a
# log-probability and a value nobody asked for, a no_grad block's calls, the state's and flags' conversions and the
# observation's bounds checked in torch)
BUDGETS = {
    "ppo-discrete": (lambda: rlspeed.PPO("CartPole-v1", seed=0), np.zeros(4, np.float32), {}, 22),
    "ppo-box": (lambda: rlspeed.PPO("Pendulum-v1", seed=0), np.zeros(3, np.float32), {}, 26),
    "ppo-masked-discrete-observations": (lambda: rlspeed.PPO("Taxi-v4", seed=0), np.int64(3),
                                         {"action_masks": np.ones(6, dtype=bool)}, 30),
    "sac": (lambda: rlspeed.SAC("Pendulum-v1", seed=0), np.zeros(3, np.float32), {}, 16),
    "dqn": (lambda: rlspeed.DQN("CartPole-v1", seed=0), np.zeros(4, np.float32), {}, 14),
    "recurrent_ppo": (lambda: rlspeed.RecurrentPPO("CartPole-v1", seed=0, lstm_hidden_size=8), np.zeros(4, np.float32),
                      {"episode_start": np.array([False])}, 31),
}


@pytest.mark.parametrize("case", list(BUDGETS))
def test_one_observations_predict_runs_the_policy_and_little_else(case):
    """Each torch call costs a microsecond or more at one observation, as much as a small network's layer: predict
    converts the observation, runs the actor (no log-probability, no value) and gives the action back, checking each
    argument once."""
    make, obs, arguments, budget = BUDGETS[case]
    model = make()
    state = model.predict(obs, **arguments)[1]
    if state is not None:
        arguments["state"] = state
    calls = TorchCalls()
    with calls:
        model.predict(obs, **arguments)
    assert len(calls.names) <= budget, f"{len(calls.names)} torch calls: {calls.names}"


def test_a_raw_rgb_frame_for_a_frame_stack_model_says_what_to_pass():
    """A user who predicts on what `gym.make("ALE/Pong-v5")` returns (210x160x3 RGB) is told the model takes the
    preprocessed frame stacks and where they come from, not only that the shape is wrong."""
    import gymnasium as gym

    from rlspeed.algos.base import as_observation_batch
    from rlspeed.errors import UserError
    stacks = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    with pytest.raises(UserError, match=r"raw RGB frame.*rlspeed\.make_env"):
        as_observation_batch(np.zeros((210, 160, 3), np.uint8), stacks, torch.device("cpu"))
    for wrong_stack in ((2, 84, 84), (84, 84, 4)):  # (a stack of the wrong size or channel-last is no RGB frame)
        with pytest.raises(UserError) as refused:
            as_observation_batch(np.zeros(wrong_stack, np.uint8), stacks, torch.device("cpu"))
        assert "RGB" not in str(refused.value), wrong_stack
