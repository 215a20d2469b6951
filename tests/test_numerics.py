"""The numerics guard: NaN/inf from an env raise (naming the env and step) or are masked; non-finite weights are
rolled back, and training never ends normally with them."""

from __future__ import annotations

import math
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlspeed import A2C, DQN, PPO, SAC, TD3, make_env
from rlspeed.errors import UserError
from rlspeed.numerics import MAX_CONSECUTIVE_ROLLBACKS, DivergedError, NonFiniteEnvError

SMALL = {PPO: dict(num_steps=16, batch_size=32, n_epochs=2, net_arch=(16,)),
         A2C: dict(net_arch=(16,)),
         DQN: dict(learning_starts=32, batch_size=16, net_arch=(16,), buffer_size=1000, train_freq=1),
         SAC: dict(learning_starts=32, batch_size=16, net_arch=(16,), buffer_size=1000),
         TD3: dict(learning_starts=32, batch_size=16, net_arch=(16,), buffer_size=1000)}
ENV_OF = {PPO: "CartPole-v1", A2C: "Pendulum-v1", DQN: "CartPole-v1", SAC: "Pendulum-v1", TD3: "Pendulum-v1"}


class InjectNonFinite(gym.Wrapper):
    """Replaces an observation element or the reward by NaN, +inf or -inf: with `probability` per step, or exactly at
    step `at_step` (counting this env's steps over all its episodes)."""

    def __init__(self, env: gym.Env, probability: float = 0.0, at_step: int | None = None, seed: int = 0):
        super().__init__(env)
        self.probability, self.at_step, self.steps = probability, at_step, 0
        self.rng = np.random.default_rng(seed)
        self.injected = 0

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.steps += 1
        if self.steps == self.at_step or (self.at_step is None and self.rng.random() < self.probability):
            value = (math.nan, math.inf, -math.inf)[self.rng.integers(3)]
            self.injected += 1
            if self.rng.random() < 0.5:
                obs = np.array(obs, copy=True)
                obs[self.rng.integers(obs.size)] = value
            else:
                reward = value
        return obs, reward, terminated, truncated, info


def _vector_env(env_id: str, faulty_env: int, **inject) -> gym.vector.SyncVectorEnv:
    """Two envs with SAME_STEP autoreset; only env `faulty_env` returns non-finite values."""
    def make(index):
        return lambda: InjectNonFinite(gym.make(env_id), **inject) if index == faulty_env else gym.make(env_id)
    return gym.vector.SyncVectorEnv([make(0), make(1)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def _weights_finite(model) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in model._guarded_tensors().values() if t.is_floating_point())


@pytest.mark.parametrize("algo", [PPO, A2C, DQN, SAC, TD3], ids=lambda a: a.__name__)
def test_nan_and_inf_from_the_env_raise_by_default_naming_the_env(algo):
    model = algo(_vector_env(ENV_OF[algo], faulty_env=1, probability=0.01), seed=0, device="cpu", **SMALL[algo])
    with pytest.raises(NonFiniteEnvError, match=r"in env 1 at its step [\d,]+.*nan_policy='mask'") as caught:
        model.learn(1500, progress_bar=False)
    assert caught.value.env_index == 1 and caught.value.step >= 1
    assert isinstance(caught.value, UserError)  # the CLI prints it as one sentence (exit 2)


def test_the_error_names_the_exact_step():
    model = PPO(_vector_env("CartPole-v1", faulty_env=1, at_step=37), seed=0, device="cpu", **SMALL[PPO])
    with pytest.raises(NonFiniteEnvError) as caught:
        model.learn(256, progress_bar=False)
    assert (caught.value.env_index, caught.value.step, caught.value.rows) == (1, 37, 1)


class Scaled(gym.Wrapper):
    """CartPole with observations (made positive) and rewards times 1e36: finite float32 values whose sum over a run
    is not."""

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return (np.abs(obs) * 1e36).astype(np.float32), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return (np.abs(obs) * 1e36).astype(np.float32), reward * 1e36, terminated, truncated, info


class Float64Beyond32(gym.Env):
    """A float64 Box whose values (1e300) are finite in float64 and past float32's range."""

    observation_space = gym.spaces.Box(-1e301, 1e301, (2,), np.float64)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return np.full(2, 1e300), {}

    def step(self, action):
        return np.full(2, 1e300), 0.0, False, False, {}


def test_a_float64_observation_past_float32s_range_is_named_as_such():
    """The adapters store a float64 Box as float32, where 1e300 is infinite: the refusal said the env 'returned a NaN
    or infinite observation' of an env that returned none, with nothing about float32."""
    env = gym.vector.SyncVectorEnv([Float64Beyond32] * 2, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (numpy's "overflow encountered in cast")
        with pytest.raises(NonFiniteEnvError, match=r"float64 observations past float32's range"):
            PPO(env, seed=0, device="cpu", **SMALL[PPO]).learn(64, progress_bar=False)
    with pytest.raises(NonFiniteEnvError) as caught:  # (an env of float32 observations is told nothing about float64)
        PPO(_vector_env("CartPole-v1", faulty_env=1, at_step=3), seed=0, device="cpu",
            **SMALL[PPO]).learn(64, progress_bar=False)
    assert "float64" not in str(caught.value)


class RewardBeyond32(gym.Env):
    """float32 observations and a reward (1e39) finite in float64 and past float32's range, from step 3 on."""

    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.steps += 1
        return np.zeros(2, np.float32), 1e39 if self.steps >= 3 else 1.0, False, False, {}


def test_a_finite_reward_past_float32s_range_is_named_as_such():
    """rlspeed keeps rewards in float32, where 1e39 from a float64 env is infinite: the refusal said the env 'returned
    a NaN or infinite observation or reward' of an env that returned none, with nothing about float32 (as observations
    were before)."""
    env = gym.vector.SyncVectorEnv([RewardBeyond32] * 2, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    with pytest.raises(NonFiniteEnvError, match=r"\(a finite reward past float32's range, about 3\.4e38, became "
                                                r"infinite: rlspeed keeps rewards in float32; scale them down in the "
                                                r"env\) in env 0 at its step 3"):
        PPO(env, seed=0, device="cpu", **SMALL[PPO]).learn(64, progress_bar=False)


class RewardBeyond32ThenNaNObservation(RewardBeyond32):
    """RewardBeyond32 while `overflow` (a class switch), then rewards of 1 and a NaN observation from step 3 on."""

    overflow = True

    def step(self, action):
        if self.overflow:
            return super().step(action)
        self.steps += 1
        return np.full(2, np.nan if self.steps >= 3 else 0.0, np.float32), 1.0, False, False, {}


def test_a_reward_past_float32s_range_is_not_named_for_a_later_nan_observation(monkeypatch):
    """The env's mark of a reward past float32's range stayed set: a model trained later on the same env object,
    whose env then returned a NaN observation (and finite rewards), was told a finite reward had become infinite. A
    guard names only what happened in the steps it counted."""
    monkeypatch.setattr(RewardBeyond32ThenNaNObservation, "overflow", True)
    env = make_env(gym.vector.SyncVectorEnv([RewardBeyond32ThenNaNObservation] * 2,
                                            autoreset_mode=gym.vector.AutoresetMode.SAME_STEP))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (numpy's overflow in the cast, the masked rows: tested elsewhere)
        PPO(env, seed=0, device="cpu", nan_policy="mask", **SMALL[PPO]).learn(64, progress_bar=False)
    monkeypatch.setattr(RewardBeyond32ThenNaNObservation, "overflow", False)
    with pytest.raises(NonFiniteEnvError, match="in env 0 at its step") as caught:
        PPO(env, seed=1, device="cpu", **SMALL[PPO]).learn(64, progress_bar=False)
    assert "past float32's range" not in str(caught.value), caught.value


def test_clearing_the_reward_marks_of_a_wrapped_env_clears_its_adapters():
    """The marks live on the adapter at the bottom of the wrappers: given the env a model trains on (its wrappers),
    `clear_reward_flags` set fresh attributes on the outermost wrapper and left the adapter's marks set (its callers
    each unwrapped the env in their own way to avoid it)."""
    from rlspeed.envs.base import clear_reward_flags

    env = make_env("CartPole-v1", num_envs=2, device="cpu")
    assert env.unwrapped is not env
    env.unwrapped.rewards_overflowed = env.unwrapped.rewards_nan = True
    clear_reward_flags(env)
    assert not env.unwrapped.rewards_overflowed and not env.unwrapped.rewards_nan
    clear_reward_flags(None)  # (no env yet)


def test_float32_rewards_marks_only_a_finite_reward_past_float32s_range():
    """The adapters' rule for rewards: float32 copies, and the env marked where a reward finite as the env gave it
    became infinite (not for the env's own inf or NaN), in any batch shape (a vector env's rewards of shape [N, 1]
    are refused after it, by shape)."""
    from types import SimpleNamespace

    from rlspeed.envs.gymnasium_env import float32_rewards

    for rewards, overflowed in [([1.0, -2.5], False), ([1.0, np.inf], False), ([np.nan, 0.0], False),
                                ([1.0, 1e39], True), ([[1.0], [-1e39]], True), ([[np.inf], [1.0]], False),
                                ([0.0] * 4095 + [1e39], True), ([0.0] * 4095 + [np.nan], False)]:  # (EnvPool's)
        env = SimpleNamespace(rewards_overflowed=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (numpy's "overflow encountered in cast")
            stored = float32_rewards(np.array(rewards, dtype=np.float64), env)
        assert stored.dtype == np.float32 and stored.shape == np.shape(rewards)
        assert env.rewards_overflowed is overflowed, rewards


@pytest.mark.parametrize("algo", [PPO, DQN], ids=lambda a: a.__name__)
def test_large_finite_values_are_no_nan(algo):
    """The guard folded every value into one float32 running sum over the run, which overflowed after a few hundred
    steps of 1e36 and stopped training with 'returned a NaN or infinite observation' for values that were finite."""
    env = gym.vector.SyncVectorEnv([lambda: Scaled(gym.make("CartPole-v1"))] * 2,
                                   autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    model = algo(env, seed=0, device="cpu", **SMALL[algo])
    model.learn(1024, progress_bar=False)
    assert model.numerics_report()["first_nonfinite_env"] is None and model.num_timesteps >= 1024


@pytest.mark.parametrize("algo", [PPO, A2C, DQN, SAC, TD3], ids=lambda a: a.__name__)
def test_masked_nan_and_inf_are_counted_and_the_weights_stay_finite(algo):
    vector_env = _vector_env(ENV_OF[algo], faulty_env=0, probability=0.01, seed=1)
    model = algo(vector_env, seed=0, device="cpu", nan_policy="mask", **SMALL[algo])
    # (250 steps of the faulty env, two injections: without the mask each algorithm rolls back or diverges)
    model.learn(500, progress_bar=False)
    injected = vector_env.envs[0].injected
    report = model.numerics_report()
    assert injected > 0
    assert report["nonfinite_env_rows_masked"] == injected and report["first_nonfinite_env"] == 0
    assert report["rollbacks"] == 0
    assert _weights_finite(model)


def test_models_sharing_an_env_object_count_its_non_finite_values_each_in_its_own_guard():
    """The NaN guard's counters sat on the env object (its EpisodeStatistics): a second model given the same env
    counted the rows masked in the first one's learn as its own (13 after 64 steps, one of them its own), and a model
    with another nan_policy replaced the counters, so the first one's count fell (15 to 2) at its next learn. Each
    model's steps are counted in its own."""
    env = make_env(_vector_env("CartPole-v1", faulty_env=1, probability=0.05))
    faulty = env.unwrapped.vector_env.envs[1]
    first = PPO(env, seed=0, device="cpu", nan_policy="mask", **SMALL[PPO])
    first.learn(256, progress_bar=False)
    counted = first._numerics.masked_env_rows
    assert counted == faulty.injected > 0
    injected = faulty.injected
    second = PPO(env, seed=1, device="cpu", nan_policy="mask", **SMALL[PPO])
    second.learn(256, progress_bar=False)
    assert second._numerics.masked_env_rows == faulty.injected - injected
    with pytest.raises(NonFiniteEnvError):  # (another policy, on the same env object)
        PPO(env, seed=2, device="cpu", **SMALL[PPO]).learn(256, progress_bar=False)
    injected = faulty.injected
    first.learn(256, progress_bar=False, reset_num_timesteps=False)
    assert first._numerics.masked_env_rows == counted + faulty.injected - injected


def test_a_model_whose_envs_are_made_anew_keeps_counting_the_rows_masked_so_far():
    """Envs a later learn makes anew (after `close`) get a guard of their own: the model's count goes on from the
    rows masked on the envs before, which it does not lose."""
    made = []

    def faulty_cartpole(**kwargs):
        made.append(InjectNonFinite(gym.make("CartPole-v1", **kwargs), probability=0.05, seed=len(made)))
        return made[-1]

    gym.register("rlspeed-test/FaultyCartPole-v0", entry_point=faulty_cartpole, max_episode_steps=500)
    try:
        model = PPO("rlspeed-test/FaultyCartPole-v0", seed=0, device="cpu", nan_policy="mask", num_envs=2,
                    **SMALL[PPO])
        model.learn(256, progress_bar=False)
        counted = model._numerics.masked_env_rows
        assert counted == sum(env.injected for env in made) > 0
        model.close()
        first_envs = len(made)
        model.learn(256, progress_bar=False, reset_num_timesteps=False)
        assert len(made) > first_envs and sum(env.injected for env in made[first_envs:]) > 0
        assert model._numerics.masked_env_rows == sum(env.injected for env in made)
    finally:
        gym.registry.pop("rlspeed-test/FaultyCartPole-v0")


def test_masked_nan_and_inf_in_dict_observations_are_counted_and_replaced_by_zero():
    """Dict observations (a float key beside an integer one): the float key's non-finite values are masked as a Box
    observation's are (counted, replaced by 0: none reaches the replay buffer, the weights stay finite); under the
    default policy they raise."""
    space = gym.spaces.Dict({"state": gym.spaces.Box(-np.inf, np.inf, (3,), np.float32),
                             "sign": gym.spaces.Discrete(2)})

    def dict_env(probability: float) -> gym.vector.SyncVectorEnv:
        def make(index):
            def env():
                inner = gym.make("Pendulum-v1")
                inner = InjectNonFinite(inner, probability=probability, seed=1) if index == 0 else inner
                return gym.wrappers.TransformObservation(inner, lambda o: {"state": o, "sign": int(o[0] > 0)}, space)
            return env
        return gym.vector.SyncVectorEnv([make(0), make(1)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)

    vector_env = dict_env(0.01)
    model = SAC(vector_env, seed=0, device="cpu", nan_policy="mask", **SMALL[SAC])
    model.learn(500, progress_bar=False)
    injected = vector_env.envs[0].env.injected
    report = model.numerics_report()
    assert injected > 0 and report["nonfinite_env_rows_masked"] == injected and report["rollbacks"] == 0
    stored = len(model.buffer)  # (every step's observations: the replay buffer holds them all)
    assert stored == 500 and _weights_finite(model)
    for obs in (model.buffer.obs, model.buffer.next_obs):
        assert bool(torch.isfinite(obs["state"][:stored]).all()) and obs["sign"].dtype != torch.float32
    with pytest.raises(NonFiniteEnvError, match="in env 0 at its step"):
        PPO(dict_env(0.05), seed=0, device="cpu", **SMALL[PPO]).learn(512, progress_bar=False)


def test_normalisation_statistics_never_see_masked_values():
    """The guard sits inside the normalising wrappers: masked values are replaced before the running statistics
    fold them in."""
    from rlspeed import make_env

    env = make_env(_vector_env("Pendulum-v1", faulty_env=1, probability=0.05), normalize_obs=True,
                   normalize_reward=True)
    model = PPO(env, seed=0, device="cpu", nan_policy="mask", **SMALL[PPO]).learn(512, progress_bar=False)
    assert model.numerics_report()["nonfinite_env_rows_masked"] > 0
    assert all(bool(torch.isfinite(t).all()) for t in (*model.obs_rms.state_dict().values(),
                                                       *model.return_rms.state_dict().values()))


def test_an_unknown_nan_policy_is_one_sentence():
    with pytest.raises(UserError, match="nan_policy must be one of raise, mask"):
        PPO("CartPole-v1", device="cpu", nan_policy="ignore")


@pytest.mark.parametrize("fused_update", [True, False], ids=["hand-derived", "autograd"])
def test_non_finite_weights_are_rolled_back_to_the_last_finite_ones(fused_update):
    """Whichever update implementation runs, weights made NaN during training are restored from the last log
    interval's (optimizer moments included) and the rollback is counted."""
    model = PPO("CartPole-v1", seed=0, device="cpu", env_backend="torch", num_envs=4, fused_update=fused_update,
                **SMALL[PPO])
    assert model.update_summary()["implementation"] == ("hand-derived" if fused_update else "autograd")
    poisoned = []

    def poison_once(local):
        if model.num_timesteps >= 256 and not poisoned:
            with torch.no_grad():
                next(model.policy.parameters()).view(-1)[0] = math.nan
            poisoned.append(model.num_timesteps)

    with pytest.warns(RuntimeWarning, match="restored those of step"):
        model.learn(640, progress_bar=False, log_interval_s=0.0, callback=poison_once)
    report = model.numerics_report()
    assert report["rollbacks"] == 1 and report["rolled_back_timesteps"] > 0
    assert _weights_finite(model) and model.num_timesteps == 640


def test_a_recurrent_policys_rollback_starts_its_lstm_state_afresh():
    """RecurrentPPO's LSTM state, computed by NaN weights before the guard saw them, is NaN too: the rollback restarts
    the episodes and zeroes the state, so one rollback suffices (a NaN state kept would make every later update
    NaN: six rollbacks in this run, and a NaN state at its end)."""
    from rlspeed import RecurrentPPO

    model = RecurrentPPO("CartPole-v1", seed=0, device="cpu", env_backend="torch", num_envs=4, lstm_hidden_size=8,
                         **SMALL[PPO])
    poisoned = []

    def poison_once(local):
        if model.num_timesteps >= 256 and not poisoned:
            with torch.no_grad():
                for param in model.policy.parameters():
                    param.fill_(math.nan)
            poisoned.append(model.num_timesteps)

    with pytest.warns(RuntimeWarning, match="restored those of step"):
        model.learn(640, progress_bar=False, log_interval_s=0.0, callback=poison_once)
    assert model.numerics_report()["rollbacks"] == 1 and model.num_timesteps == 640
    assert _weights_finite(model) and bool(torch.isfinite(model._state).all())


def test_training_that_keeps_diverging_stops_with_a_clear_error():
    """... naming the run's settings that differ from the defaults beside the advice (a huge ent_coef or vf_coef
    diverges too)."""
    model = PPO("CartPole-v1", seed=0, device="cpu", env_backend="torch", num_envs=4, ent_coef=0.5, **SMALL[PPO])

    def poison(local):
        with torch.no_grad():
            next(model.policy.parameters()).view(-1)[0] = math.inf

    stops = pytest.raises(DivergedError, match=f"{MAX_CONSECUTIVE_ROLLBACKS} times in a row.*this run's settings "
                                               r"other than the defaults: .*ent_coef=0\.5")
    with pytest.warns(RuntimeWarning) as caught, stops:
        model.learn(10_000, progress_bar=False, log_interval_s=0.0, callback=poison)
    assert _weights_finite(model)  # the last finite weights are what a caller saving the model gets
    rollbacks = [str(w.message) for w in caught if "restored those of step" in str(w.message)]
    # (what to do, said by the first rollback's warning only)
    advice = ("lower learning_rate, check the observations' and rewards' scales (normalize_obs, normalize_reward), or "
              "clip gradients (max_grad_norm)")
    assert len(rollbacks) > 1 and rollbacks[0].endswith(f"; if it recurs, {advice}.")
    assert not any(advice in message for message in rollbacks[1:])


@pytest.mark.parametrize("backend", ["torch", "gymnasium"])
def test_sac_with_a_huge_learning_rate_never_ends_normally_with_nan_weights(backend):
    """learning_rate=1e3: the run either stays finite through rollbacks or stops with DivergedError; it never
    returns with NaN weights. The NaN observations that the diverged policy's NaN actions cause are not blamed on
    the env."""
    model = SAC("Pendulum-v1", seed=0, device="cpu", env_backend=backend, learning_rate=1e3, **SMALL[SAC])
    try:
        with pytest.warns(RuntimeWarning, match="restored"):
            model.learn(2000, progress_bar=False, log_interval_s=0.0)
    except DivergedError:
        pass
    assert model.numerics_report()["rollbacks"] > 0
    assert _weights_finite(model)


def test_the_guard_can_be_switched_off():
    """numerics_guard=False: no checks at all (for measuring what the guard costs); NaN flows through."""
    model = PPO(_vector_env("CartPole-v1", faulty_env=1, at_step=5), seed=0, device="cpu", numerics_guard=False,
                **SMALL[PPO])
    model.learn(128, progress_bar=False)
    assert model.numerics_report()["guard"] is False


def test_rolled_back_steps_count_each_discarded_step_once_and_an_all_rolled_back_learn_raises():
    """Rollbacks at 100, 200 and 300 steps to one snapshot at 0 discard 300 steps (it counted 100 + 200 + 300); a
    `learn` whose last check rolled back to where it started kept no update: DivergedError, not a silent return."""
    from rlspeed.numerics import NumericsGuard

    guard = NumericsGuard(max_rollbacks=10)
    weights = {"w": torch.ones(3)}
    guard.snapshot(weights, 0)
    with pytest.warns(RuntimeWarning, match="non-finite parameters"):
        for steps in (100, 200, 300):
            weights["w"].fill_(math.nan)
            assert guard.after_read([0.0], weights, "Env-v0", steps)
    assert guard.rolled_back_timesteps == 300 and torch.equal(weights["w"], torch.ones(3))
    with pytest.raises(DivergedError, match="Every update of this training was NaN or infinite"):
        guard.check_kept(0, 300)
    assert not guard.after_read([1.0], weights, "Env-v0", 400)  # (a kept update: the learn call kept something)
    guard.check_kept(0, 400)


def test_an_infinite_loss_with_finite_weights_is_reported():
    """Returns of ~1e21 make PPO's value loss overflow float32 to inf while its gradient stays finite: clipped to
    max_grad_norm it left the policy's gradient almost nothing, so the policy stopped changing with no word (the
    parameters were finite, so nothing rolled back) and `rlspeed train` ended normally."""
    def huge_rewards():
        return gym.wrappers.TransformReward(gym.make("CartPole-v1"), lambda r: r * 1e20)

    env = gym.vector.SyncVectorEnv([huge_rewards] * 2, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    model = PPO(env, seed=0, device="cpu", num_steps=64, batch_size=64, n_epochs=1, normalize_reward=False)
    with pytest.warns(RuntimeWarning, match=r"value_loss is inf at .*scale the rewards down"):
        model.learn(256, progress_bar=False)
    first = model.numerics_report()["nonfinite_losses"]
    assert list(first) == ["value_loss"] and 0 < first["value_loss"] <= model.num_timesteps
    assert all(torch.isfinite(p).all() for p in model.policy.parameters())


def test_an_infinite_loss_is_reported_at_the_first_row_that_logged_it(tmp_path, monkeypatch):
    """Rows are logged more often than the parameters are checked (with a run directory, each 1/50 of the budget;
    checks once a second): a loss infinite from the first row was reported at the step of the next check
    (summary.json's "value_loss from 3,072 steps" where metrics.csv showed inf from 1,024). It is now the first row's
    step, once a check finds the parameters finite."""
    import csv
    import types

    import rlspeed.algos.base

    # (a clock that stands still: a row per iteration, and the parameters checked once, at the end)
    monkeypatch.setattr(rlspeed.algos.base, "time", types.SimpleNamespace(perf_counter=lambda: 0.0))

    def huge_rewards():
        return gym.wrappers.TransformReward(gym.make("CartPole-v1"), lambda r: r * 1e20)

    env = gym.vector.SyncVectorEnv([huge_rewards] * 2, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    model = PPO(env, seed=0, device="cpu", num_steps=64, batch_size=64, n_epochs=1, normalize_reward=False)
    with pytest.warns(RuntimeWarning, match=r"value_loss is inf at 128 steps"):
        model.learn(512, progress_bar=False, run_dir=tmp_path)
    with open(tmp_path / "metrics.csv") as file:
        rows = list(csv.DictReader(file))
    first = next(int(row["timesteps"]) for row in rows if not math.isfinite(float(row["value_loss"])))
    assert len(rows) == 4 and model.numerics_report()["nonfinite_losses"] == {"value_loss": first} and first == 128


def test_losses_of_a_rolled_back_update_are_not_called_finite_weights():
    """Rewards of 1e38 make the parameters non-finite (rolled back): the loss warning said "while the parameters are
    finite" beside the rollback, and summary.json listed both."""
    def huge_rewards():
        return gym.wrappers.TransformReward(gym.make("CartPole-v1"), lambda r: r * 1e38)

    env = gym.vector.SyncVectorEnv([huge_rewards] * 4, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    model = PPO(env, seed=0, device="cpu", num_steps=32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(DivergedError):
            model.learn(1024, progress_bar=False)
    assert model.numerics_report()["rollbacks"] >= 1 and model.numerics_report()["nonfinite_losses"] == {}
    assert not [w for w in caught if "while the parameters are finite" in str(w.message)]


def _scale_warnings(model, steps: int = 256) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.learn(steps, progress_bar=False)
    return [str(w.message) for w in caught if "first steps" in str(w.message)]


class Times(gym.Wrapper):
    """An env's rewards and observations times a factor each (a badly scaled task: money, energy)."""

    def __init__(self, env: gym.Env, reward_scale: float, obs_scale: float):
        super().__init__(env)
        self.reward_scale, self.obs_scale = reward_scale, obs_scale
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, env.observation_space.shape, np.float32)

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return (obs * self.obs_scale).astype(np.float32), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return ((obs * self.obs_scale).astype(np.float32), reward * self.reward_scale, terminated, truncated, info)


def _cartpole_times(reward_scale: float = 1.0, obs_scale: float = 1.0) -> gym.vector.SyncVectorEnv:
    return gym.vector.SyncVectorEnv([lambda: Times(gym.make("CartPole-v1"), reward_scale, obs_scale)] * 2,
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


@pytest.mark.parametrize("algo", [PPO, DQN], ids=lambda a: a.__name__)
def test_rewards_far_from_1_get_one_hint_to_normalise_them(algo):
    """Rewards of 1e5 per step (money, energy) trained with no word: DQN reached a fifth of the unit-scale return in
    20k steps, and PPO less than it does with normalize_reward, while the run ended normally."""
    model = algo(_cartpole_times(reward_scale=1e5), seed=0, device="cpu", **SMALL[algo])
    hints = _scale_warnings(model) + _scale_warnings(model)  # (a second learn: said once per model)
    assert len(hints) == 1 and "rewards up to 1e+05" in hints[0] and "normalize_reward=True" in hints[0]
    assert "observation" not in hints[0]
    tiny = algo(_cartpole_times(reward_scale=1e-6), seed=0, device="cpu", **SMALL[algo])
    assert "rewards of at most 1e-06" in "".join(_scale_warnings(tiny))
    masked = algo(_cartpole_times(reward_scale=1e5), seed=0, device="cpu", nan_policy="mask", **SMALL[algo])
    assert len(_scale_warnings(masked)) == 1  # (the mask policy checks each step at once: measured there too)


@pytest.mark.parametrize("algo", [PPO, DQN], ids=lambda a: a.__name__)
def test_observations_far_from_1_get_a_hint_and_well_scaled_or_normalised_envs_none(algo):
    model = algo(_cartpole_times(obs_scale=1e6), seed=0, device="cpu", **SMALL[algo])
    hints = _scale_warnings(model)
    assert len(hints) == 1 and "observation values up to" in hints[0] and "normalize_obs=True" in hints[0]
    assert "reward" not in hints[0].split(":")[1]
    assert _scale_warnings(algo(_cartpole_times(), seed=0, device="cpu", **SMALL[algo])) == []
    normalised = algo(_cartpole_times(reward_scale=1e5, obs_scale=1e6), seed=0, device="cpu", normalize_obs=True,
                      normalize_reward=True, **SMALL[algo])
    assert _scale_warnings(normalised) == []
