"""Population checkpoints: a population killed after a checkpoint and resumed ends bitwise as the uninterrupted run
(CPU, native envs), `rlspeed train --seeds ... --resume` finishes a killed run with the uninterrupted run's
summary.json, and a run directory of another run is refused in one sentence."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import cli_error
from safetensors import safe_open

from rlspeed import A2C, PPO, cli
from rlspeed.errors import UserError
from rlspeed.population import Population

TOTAL = 1024
CHECKPOINT_FREQ = 384


class Killed(Exception):
    """Stands for a kill -9 right after a checkpoint was written."""


def _settings(algo) -> dict:
    if algo is A2C:
        return dict(num_envs=4, num_steps=8, net_arch=(16, 16), learning_rate=[7e-4, 1e-3, 2e-3])
    return dict(num_envs=4, num_steps=32, batch_size=64, n_epochs=2, net_arch=(16, 16),
                learning_rate=[1e-3, 3e-4, 2e-3], normalize_obs=False, normalize_reward=False)


def _population(algo, env_id):
    return Population(algo, env_id, seeds=[3, 5, 8], env_backend="torch", **_settings(algo))


def _tensors(path) -> dict[str, torch.Tensor]:
    with safe_open(str(path), "pt") as handle:
        return {name: handle.get_tensor(name) for name in handle.keys()}


def _metadata(path) -> dict:
    with safe_open(str(path), "pt") as handle:
        return json.loads(handle.metadata()["rlspeed"])


def _without_times(summary: dict) -> dict:
    """summary.json less what the clock measures (wall and CPU times, steps per second)."""
    timed = ("train_wall_s", "train_cpu_s", "sps", "time_to_target_s")
    summary = {key: value for key, value in summary.items() if key not in timed}
    summary["members"] = [{key: value for key, value in member.items() if key not in timed}
                          for member in summary["members"]]
    summary["aggregate"] = {key: value for key, value in summary["aggregate"].items() if key != "time_to_target_s"}
    return summary


@pytest.mark.parametrize(("algo", "env_id"), [(PPO, "CartPole-v1"), (PPO, "Pendulum-v1"), (A2C, "CartPole-v1")])
def test_a_resumed_population_is_bitwise_the_uninterrupted_one(tmp_path, algo, env_id):
    """Train to TOTAL with checkpoints, evaluations and a member pruned on the way; train again and kill it right
    after its first checkpoint; resume a new population from that checkpoint and train on to TOTAL: every tensor
    (parameters, optimiser moments, generators, env states and observations) and the summary (curves, pruned,
    final evaluations) equal the uninterrupted run's."""

    def prune_member_1(steps, means):
        return [1] if steps >= 256 else []

    learn = dict(eval_freq=256, on_eval=prune_member_1, checkpoint_freq=CHECKPOINT_FREQ)
    uninterrupted = _population(algo, env_id)
    expected_summary = uninterrupted.learn(TOTAL, run_dir=tmp_path / "a", **learn)
    expected = _tensors(uninterrupted.save(tmp_path / "a" / "final"))
    assert expected_summary["pruned"] == 1

    def kill_after_checkpoint(steps, means):
        if (tmp_path / "b" / "checkpoint.safetensors").exists():
            raise Killed
        return prune_member_1(steps, means)

    killed = _population(algo, env_id)
    with pytest.raises(Killed):
        killed.learn(TOTAL, run_dir=tmp_path / "b", **{**learn, "on_eval": kill_after_checkpoint})
    checkpoint = tmp_path / "b" / "checkpoint.safetensors"
    saved_steps = _metadata(checkpoint)["population"]["num_timesteps"]
    assert 0 < saved_steps < TOTAL
    assert _metadata(checkpoint)["population"]["alive"] == [0, 2]  # (member 1 was pruned before it)

    resumed = _population(algo, env_id)
    resumed.resume(checkpoint)
    assert resumed.num_timesteps == saved_steps
    summary = resumed.learn(TOTAL - saved_steps, run_dir=tmp_path / "b", **learn)
    actual = _tensors(resumed.save(tmp_path / "b" / "final"))
    assert set(actual) == set(expected)
    assert any(name.startswith("env.") for name in actual) and "generator.0" in actual
    for name, value in expected.items():
        assert torch.equal(actual[name], value), name
    assert _without_times(summary) == _without_times(expected_summary)


def test_a_checkpoint_of_another_run_is_refused(tmp_path):
    population = Population(PPO, "CartPole-v1", seeds=[0, 1], num_envs=4, num_steps=16, net_arch=(8,))
    path = population.save(tmp_path / "population")
    for seeds, hyper, names in (([0, 2], {}, "same seeds"),
                                ([0, 1], {"net_arch": (16,)}, "net_arch"),
                                ([0, 1], {"learning_rate": [1e-3, 2e-3]}, "learning_rate")):
        other = Population(PPO, "CartPole-v1", seeds=seeds, **{"num_envs": 4, "num_steps": 16, "net_arch": (8,),
                                                               **hyper})
        with pytest.raises(UserError, match=names):
            other.resume(path)
    with pytest.raises(UserError, match="same algorithm"):
        Population(A2C, "CartPole-v1", seeds=[0, 1], num_envs=4, num_steps=16, net_arch=(8,)).resume(path)
    solo = PPO("CartPole-v1", seed=0, num_envs=4, num_steps=16, net_arch=(8,)).save(tmp_path / "solo")
    with pytest.raises(UserError, match="single ppo run"):
        population.resume(solo)
