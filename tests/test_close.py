"""`model.close()` and `with ... as model:`: a model or population gives back its env subprocesses and goes on."""

import gc
import multiprocessing

import numpy as np
import pytest

from rlspeed import DQN, PPO, UserError, make_env
from rlspeed.population import Population


def env_processes() -> list:
    """The subprocesses of Gymnasium's AsyncVectorEnv (multiprocessing's children) alive now."""
    return [child for child in multiprocessing.active_children() if child.is_alive()]


def env_processes_before() -> int:
    """How many env subprocesses are alive as a test starts, once the collector has run: a model of an earlier test
    that only the collector frees (held by a reference cycle: a learn call's callbacks and their `locals`, the frames
    a first import keeps) ends its envs' workers when collected, which would otherwise be in the middle of the
    test's counts."""
    gc.collect()
    return len(env_processes())


def test_close_ends_the_env_subprocesses_and_a_further_learn_makes_new_ones():
    before = env_processes_before()
    model = PPO("CartPole-v1", env_backend="gymnasium-async", num_envs=2, num_steps=16, batch_size=32, seed=0,
                device="cpu")
    model.learn(64, progress_bar=False)
    assert len(env_processes()) == before + 2
    model.close()
    assert len(env_processes()) == before
    model.close()  # (twice: nothing more to do)
    obs = np.zeros((1, 4), dtype=np.float32)
    action, _ = model.predict(obs)  # (the model itself goes on)
    model.learn(64, progress_bar=False)  # (new envs, episodes afresh)
    assert model.num_timesteps == 128 and len(env_processes()) == before + 2
    model.close()
    assert len(env_processes()) == before


def test_a_with_block_closes_the_model_at_its_end_also_after_an_error():
    before = env_processes_before()
    with pytest.raises(RuntimeError, match="stop here"):
        with PPO("CartPole-v1", env_backend="gymnasium-async", num_envs=2, num_steps=16, batch_size=32,
                 device="cpu") as model:
            model.learn(32, progress_bar=False)
            assert len(env_processes()) == before + 2
            raise RuntimeError("stop here")
    assert len(env_processes()) == before


def test_an_off_policy_model_keeps_its_replay_data_across_close():
    model = DQN("CartPole-v1", num_envs=2, learning_starts=32, buffer_size=1000, seed=0, device="cpu")
    model.learn(64, progress_bar=False)
    stored = len(model.buffer)
    model.close()
    model.learn(64, progress_bar=False)
    assert model.num_timesteps == 128 and len(model.buffer) == stored + 64


def test_a_closed_env_the_caller_passed_is_not_made_again():
    env = make_env("CartPole-v1", num_envs=2, backend="gymnasium")
    model = PPO(env, num_steps=16, batch_size=32, device="cpu")
    model.learn(32, progress_bar=False)
    model.close()
    with pytest.raises(UserError, match=r"env was closed .*load\(path, env=\.\.\.\)"):
        model.learn(32, progress_bar=False)


def test_a_population_closes_its_members_envs_and_trains_on():
    before = env_processes_before()
    with Population(PPO, "CartPole-v1", seeds=[0, 1], env_backend="gymnasium-async", num_envs=2, num_steps=16,
                    batch_size=32, device="cpu") as population:
        population.learn(32, progress_bar=False)
        assert len(env_processes()) > before
        population.close()
        assert len(env_processes()) == before
        population.learn(32, progress_bar=False)
        assert population.num_timesteps == 64
    assert len(env_processes()) == before


def test_an_env_or_model_dropped_without_close_ends_its_subprocesses_at_once():
    """A notebook user drops envs and models without close: `del` ends their subprocesses then, as for Gymnasium's
    own env, not at a later garbage collection (whose order closed the workers' pipes first: "Bad file descriptor"
    from the env's own close, its workers left unreaped)."""
    import torch._dynamo  # noqa: F401 (torch imports it at a first optimizer and keeps that caller's frames)

    before = env_processes_before()
    gc.disable()
    try:
        for _ in range(2):
            env = make_env("CartPole-v1", num_envs=2, backend="gymnasium-async", seed=0)
            env.reset()
            assert len(env_processes()) == before + 2
            del env
            assert len(env_processes()) == before
        model = PPO("CartPole-v1", env_backend="gymnasium-async", num_envs=2, num_steps=16, batch_size=32, seed=0,
                    device="cpu")
        model.learn(32, progress_bar=False)
        assert len(env_processes()) == before + 2
        del model  # (a model holds no cycle either: test_del_frees_a_trained_model_without_the_garbage_collector)
        assert len(env_processes()) == before
    finally:
        gc.enable()


@pytest.mark.parametrize("algo,env_id,settings", [
    ("PPO", "CartPole-v1", {"fused_update": False}), ("A2C", "CartPole-v1", {}), ("DQN", "CartPole-v1", {}),
    ("SAC", "Pendulum-v1", {}), ("SAC", "Pendulum-v1", {"fused_update": False}), ("TD3", "Pendulum-v1", {}),
    ("DDPG", "Pendulum-v1", {}), ("RecurrentPPO", "CartPole-v1", {})])
def test_del_frees_a_trained_model_without_the_garbage_collector(algo, env_id, settings):
    """A model must not refer to itself (through its update step's loss, say): `del model` then frees its tensors,
    envs and device memory at once, not at some later full collection."""
    import weakref

    import torch._dynamo  # noqa: F401 (torch imports it at a first optimizer and keeps that caller's frames)

    import rlspeed

    off_policy = algo in ("DQN", "SAC", "TD3", "DDPG")
    model = getattr(rlspeed, algo)(env_id, seed=0, device="cpu", num_envs=2, **settings,
                                   **({"learning_starts": 32, "batch_size": 16} if off_policy else
                                      {"num_steps": 16, **({} if algo == "A2C" else {"batch_size": 32})}))
    gc.collect()
    gc.disable()
    try:
        model.learn(96 if off_policy else 64, progress_bar=False)
        alive = weakref.ref(model)
        del model
        assert alive() is None
    finally:
        gc.enable()
