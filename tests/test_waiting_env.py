"""Training's note on in-process envs that wait (`rlspeed.diagnostics.waiting`): it names subprocess envs, once, and
only where they would change something."""

from __future__ import annotations

import math
import time
import warnings

import pytest

from rlspeed import PPO
from rlspeed.diagnostics import waiting
from rlspeed.errors import WaitingEnvWarning


def _waiting_notes(model, steps: int) -> list[str]:
    """The notes on envs that wait (WaitingEnvWarning) that `model.learn(steps)` gives."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.learn(steps, progress_bar=False)
    return [str(w.message) for w in caught if issubclass(w.category, WaitingEnvWarning)]


def test_training_on_in_process_envs_that_wait_names_subprocess_envs_once(monkeypatch):
    """Training says what only `rlspeed profile` said: envs that sleep (a simulator over a socket) in one process
    wait one after another, and gymnasium-async would wait side by side; decided on the first metrics row here (the
    CPU time of the process only: a loaded machine's waits for a core count as busy)."""
    import helpers.slow_env  # noqa: F401  (registers SlowSleeping-v0)

    monkeypatch.setattr(waiting, "MEASURED_S", 0.0)
    monkeypatch.setattr(waiting, "noted", False)
    # a fast env keeps its core busy: no note (the real busy time, a loaded machine's waits for a core included)
    fast = PPO("CartPole-v1", device="cpu", seed=0, env_backend="gymnasium", num_envs=2, num_steps=16, batch_size=32,
               n_epochs=1, net_arch=(8,))
    assert _waiting_notes(fast, 256) == []
    monkeypatch.setattr(waiting, "busy_seconds", time.process_time)
    model = PPO("SlowSleeping-v0", device="cpu", seed=0, env_backend="gymnasium", num_envs=2, num_steps=16,
                batch_size=32, n_epochs=1, net_arch=(8,), env_kwargs={"step_s": 0.002})
    [note] = _waiting_notes(model, 64)
    assert note.startswith("The env mostly waits: SlowSleeping-v0's steps took ")  # (PYTHONWARNINGS="ignore:...")
    assert "env_backend='gymnasium-async'" in note and "ms of wall time each" in note and "WaitingEnvWarning" in note
    assert _waiting_notes(model, 32) == []  # (once per process)
    other = PPO("SlowSleeping-v0", device="cpu", seed=1, env_backend="gymnasium", num_envs=2, num_steps=16,
                batch_size=32, n_epochs=1, net_arch=(8,), env_kwargs={"step_s": 0.002})
    assert _waiting_notes(other, 32) == []


@pytest.mark.parametrize("backend, num_envs, noted", [("gymnasium", 2, True), ("gymnasium", 1, False),
                                                      ("torch", 2, False), ("gymnasium-async", 2, False)])
def test_the_note_on_envs_that_wait_comes_only_where_subprocess_envs_would_change_something(monkeypatch, backend,
                                                                                             num_envs, noted):
    """Thresholds that any run passes: the note comes for 2 or more in-process Gymnasium envs only (not native
    envs, not subprocess envs already, not one env)."""

    monkeypatch.setattr(waiting, "MEASURED_S", 0.0)
    monkeypatch.setattr(waiting, "noted", False)
    monkeypatch.setattr(waiting, "SLOW_ENV_MS", 0.0)
    monkeypatch.setattr(waiting, "WAITING_CORES", math.inf)
    with PPO("CartPole-v1", device="cpu", seed=0, env_backend=backend, num_envs=num_envs, num_steps=16,
             batch_size=16, n_epochs=1, net_arch=(8,)) as model:
        assert len(_waiting_notes(model, 32)) == int(noted)


def test_the_note_on_envs_that_wait_for_a_vector_env_passed_in_names_asyncvectorenv(monkeypatch):
    import gymnasium as gym

    monkeypatch.setattr(waiting, "MEASURED_S", 0.0)
    monkeypatch.setattr(waiting, "noted", False)
    monkeypatch.setattr(waiting, "SLOW_ENV_MS", 0.0)
    monkeypatch.setattr(waiting, "WAITING_CORES", math.inf)
    vector_env = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2,
                                        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    model = PPO(vector_env, device="cpu", seed=0, num_steps=16, batch_size=16, n_epochs=1, net_arch=(8,))
    [note] = _waiting_notes(model, 32)
    assert "gymnasium.vector.AsyncVectorEnv" in note and "--env-backend" not in note


def test_rlspeed_profile_leaves_the_note_on_envs_that_wait_to_its_own_advice(monkeypatch):
    """The profile's advice names subprocess envs where the env waits: its learn calls give no note besides."""
    import helpers.slow_env  # noqa: F401  (registers SlowSleeping-v0)

    from rlspeed.diagnostics import profiler

    monkeypatch.setattr(waiting, "MEASURED_S", 0.0)
    monkeypatch.setattr(waiting, "noted", False)
    monkeypatch.setattr(waiting, "busy_seconds", time.process_time)
    model = PPO("SlowSleeping-v0", device="cpu", seed=0, env_backend="gymnasium", num_envs=2, num_steps=16,
                batch_size=32, n_epochs=1, net_arch=(8,), env_kwargs={"step_s": 0.002})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        profiler.profile_run(model, steps=32, warmup_steps=32)
    assert not [w for w in caught if issubclass(w.category, WaitingEnvWarning)]


@pytest.mark.parametrize("env_id, backend, noted", [("SlowSleeping-v0", "gymnasium", True),
                                                    ("CartPole-v1", "torch", False)])
def test_a_population_on_in_process_envs_that_wait_gives_the_note_too(monkeypatch, env_id, backend, noted):
    """A population's members step their in-process envs one after another, as a solo run's envs: the same note (2
    members of 1 env each: 2 envs), not on native envs."""
    import helpers.slow_env  # noqa: F401  (registers SlowSleeping-v0)

    from rlspeed.population import Population

    monkeypatch.setattr(waiting, "MEASURED_S", 0.0)
    monkeypatch.setattr(waiting, "noted", False)
    monkeypatch.setattr(waiting, "busy_seconds", time.process_time)
    if backend == "torch":  # (thresholds any run passes: only the backend keeps the note away)
        monkeypatch.setattr(waiting, "SLOW_ENV_MS", 0.0)
        monkeypatch.setattr(waiting, "WAITING_CORES", math.inf)
    env_kwargs = {"env_kwargs": {"step_s": 0.002}} if env_id.startswith("Slow") else {}
    population = Population(PPO, env_id, seeds=[0, 1], env_backend=backend, num_envs=1, num_steps=16, batch_size=16,
                            n_epochs=1, net_arch=(8,), **env_kwargs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        population.learn(32, progress_bar=False)
    notes = [str(w.message) for w in caught if issubclass(w.category, WaitingEnvWarning)]
    assert len(notes) == int(noted)
    assert not notes or ("env_backend='gymnasium-async'" in notes[0] and "its 2 envs" in notes[0])
