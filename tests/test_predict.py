"""`predict` as a deployed policy calls it: one observation per control step, thousands of times a second. What it
takes (numpy arrays as an env or a user's code makes them) and what one call costs beyond the policy's own kernels
(counted in torch calls: the latency itself is benchmarks/predict_latency.py's, never a timing assert)."""

from __future__ import annotations

import numpy as np
import torch

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
