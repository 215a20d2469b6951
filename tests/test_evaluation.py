"""`rlspeed.evaluate` as careful evaluation needs it: a seed repeats a stochastic evaluation exactly, an evaluation
leaves the caller's random generators (and so the training after it) alone, a seed without one is drawn and
returned, seeds of any integer type work on every backend, and rewards a wrapper changed are said to be changed."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import pathlib
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import endless_pendulum_id

import rlspeed
from rlspeed import DQN, PPO, SAC
from rlspeed.callbacks import BaseCallback
from rlspeed.errors import warn_at_caller
from rlspeed.logging import ProgressBar


@pytest.fixture(scope="module")
def ppo():
    model = PPO("CartPole-v1", device="cpu", seed=0, num_envs=4, num_steps=32, env_backend="gymnasium")
    return model.learn(1024, progress_bar=False)


@pytest.mark.parametrize("algo, env_id", [(PPO, "CartPole-v1"), (SAC, "Pendulum-v1")])
def test_a_seed_repeats_a_stochastic_evaluation_and_leaves_the_global_generators(algo, env_id):
    model = algo(env_id, device="cpu", seed=0, **({"learning_starts": 50} if algo is SAC else {}))
    model.learn(200 if algo is SAC else 256, progress_bar=False)
    state = torch.get_rng_state()
    first = rlspeed.evaluate(model, env_id, episodes=3, seed=3, deterministic=False)
    assert torch.equal(torch.get_rng_state(), state)  # (the samples came from the evaluation's own stream)
    again = rlspeed.evaluate(model, env_id, episodes=3, seed=3, deterministic=False)
    assert again["returns"] == first["returns"]
    other = rlspeed.evaluate(model, env_id, episodes=3, seed=4, deterministic=False)
    assert other["returns"] != first["returns"]
    # (the same episodes, seed 3, acted greedily: the samples are what changed them)
    assert rlspeed.evaluate(model, env_id, episodes=3, seed=3)["returns"] != first["returns"]


def test_a_stochastic_evaluation_between_learn_calls_does_not_change_training():
    def trained(evaluate_between: bool) -> torch.Tensor:
        model = PPO("CartPole-v1", device="cpu", seed=0, num_envs=4, num_steps=32)
        model.learn(256, progress_bar=False)
        if evaluate_between:
            rlspeed.evaluate(model, episodes=2, seed=1, deterministic=False)
        model.learn(256, progress_bar=False)
        return torch.cat([p.detach().flatten() for p in model.policy.parameters()])

    assert torch.equal(trained(False), trained(True))


def test_without_a_seed_one_is_drawn_and_returned_to_repeat_it(ppo):
    result = rlspeed.evaluate(ppo, "CartPole-v1", episodes=2, deterministic=False)
    assert isinstance(result["seed"], int)
    again = rlspeed.evaluate(ppo, "CartPole-v1", episodes=2, seed=result["seed"], deterministic=False)
    assert again["returns"] == result["returns"]


def test_stable_baselines3_evaluate_policy_keywords_say_what_to_write_instead(ppo):
    """`evaluate_policy`'s n_eval_episodes, return_episode_rewards, render and warn (and sb3-contrib's use_masking), to
    rlspeed.evaluate or model.evaluate: one sentence naming rlspeed's way (a TypeError before; warn: a typo's
    sentence; use_masking: "evaluate takes no 'use_masking'."); deterministic is taken as SB3's."""
    for evaluate in (lambda **options: rlspeed.evaluate(ppo, "CartPole-v1", **options), ppo.evaluate):
        for key, advice in (("n_eval_episodes", "rlspeed's is episodes=N"), ("return_episode_rewards", "'returns'"),
                            ("render", r"rlspeed.record_video\(model, path\)"), ("warn", "leave it out"),
                            ("use_masking", r"masks as the model does .*load\(path, use_masking=False\)")):
            with pytest.raises(rlspeed.UserError, match=f"^evaluate's '{key}' is Stable-Baselines3's; .*{advice}"):
                evaluate(**{key: 2})
        with pytest.raises(rlspeed.UserError, match="evaluate takes no 'episode'; did you mean episodes"):
            evaluate(episode=2)
        assert evaluate(episodes=1, deterministic=True, seed=0)["episodes"] == 1
    # (the method's own parameters, not rlspeed.evaluate's: it takes no backend, and suggests none)
    with pytest.raises(rlspeed.UserError, match="^evaluate takes no 'backend'.$"):
        ppo.evaluate(backend="gymnasium")
    with pytest.raises(rlspeed.UserError, match="evaluate takes no 'devic'; did you mean device"):
        rlspeed.evaluate(ppo, "CartPole-v1", devic="cpu")
    # (an env given first, as rlspeed.evaluate and SB3's evaluate_policy take one: "episodes must be a whole number")
    for env in ("CartPole-v1", gym.make_vec("CartPole-v1", 2)):
        with pytest.raises(rlspeed.UserError, match=r"rlspeed.evaluate\(model, env, episodes=N\) on an env of your"):
            ppo.evaluate(env)


@pytest.mark.parametrize("seed", [np.int64(5), np.uint32(5), torch.tensor(5)])
def test_a_seed_of_any_integer_type_works_on_every_backend(ppo, seed):
    expected = rlspeed.evaluate(ppo, episodes=2, seed=5)["returns"]
    assert rlspeed.evaluate(ppo, episodes=2, seed=seed)["returns"] == expected
    with pytest.raises(rlspeed.UserError, match="A seed is a whole number"):
        rlspeed.evaluate(ppo, episodes=2, seed=-1)
    with pytest.raises(rlspeed.UserError, match="max_steps must be a whole number >= 1, got 2.5"):
        rlspeed.evaluate(ppo, episodes=2, max_steps=2.5)  # (a TypeError deep in the loop)


def test_a_count_past_2_63_is_refused_in_one_sentence(ppo):
    """`episodes=1e300` raised OverflowError ("cannot fit 'int' into an index-sized integer") from inside evaluate;
    learn's `eval_freq=1e300` was taken as a 301-digit count, and `checkpoint_freq=1e300` refused with all 301 digits.
    Counts (`errors.positive_whole`) stop at `errors.MAX_COUNT`, as hyperparameters do."""
    from rlspeed.errors import MAX_COUNT, positive_whole

    too_big = r"takes a whole number of at most 2\*\*63 - 1 \(9.22e\+18\) in size, got "
    with pytest.raises(rlspeed.UserError, match=rf"^episodes {too_big}1e\+300\.$"):
        rlspeed.evaluate(ppo, episodes=1e300)
    with pytest.raises(rlspeed.UserError, match=rf"^eval_freq {too_big}a 41-digit number\.$"):
        ppo.learn(64, eval_freq=10**40)
    assert positive_whole("eval_freq", MAX_COUNT) == MAX_COUNT and positive_whole("eval_freq", 1e18) == 10**18


def test_more_episodes_than_their_results_fit_in_memory_are_refused_up_front(ppo, tmp_path, capsys):
    """`evaluate(episodes=2**62)` (a count within int64, which `positive_whole` takes) failed with a bare MemoryError
    from its per-episode lists, `rlspeed eval --episodes` likewise, and learn's eval_episodes only at the first
    evaluation after training; all three now say in one sentence how many episodes fit (the memory rule,
    `refuse_unless_fits`)."""
    from rlspeed import cli

    fits = r"evaluate at most [\d,]+ episodes at once \(episodes=N; --episodes N on the command line\)\.$"
    with pytest.raises(rlspeed.UserError, match=rf"^An evaluation of 4,611,686,018,427,387,904 episodes .*{fits}"):
        rlspeed.evaluate(ppo, episodes=2**62, seed=0)
    with pytest.raises(rlspeed.UserError, match=r"episodes at once \(eval_episodes=N; --eval-episodes N on the "):
        PPO("CartPole-v1", device="cpu", seed=0, num_steps=8).learn(16, eval_episodes=2**62, progress_bar=False)
    path = ppo.save(tmp_path / "model")
    capsys.readouterr()
    assert cli.main(["eval", str(path), "--episodes", str(2**62), "--no-progress"]) == 2
    assert "episodes at once" in capsys.readouterr().err


def _same_step_cartpoles(wrappers=(), mode="sync"):
    return gym.make_vec("CartPole-v1", 2, vectorization_mode=mode, wrappers=wrappers,
                        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})


def _clip_reward(env):  # (module level: an AsyncVectorEnv's subprocesses take it by pickle)
    return gym.wrappers.ClipReward(env, -0.5, 0.5)


def _unlike_cartpoles():  # (the second env alone changes its rewards)
    return gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1"), lambda: _clip_reward(gym.make("CartPole-v1"))],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


@pytest.mark.parametrize("make, name", [
    (lambda: gym.wrappers.vector.NormalizeReward(_same_step_cartpoles()), "NormalizeReward"),
    (lambda: gym.wrappers.vector.VectorizeTransformReward(_same_step_cartpoles(), gym.wrappers.TransformReward,
                                                          func=lambda r: 2 * r), "VectorizeTransformReward"),
    # (wrappers of the envs inside the vector env)
    (lambda: _same_step_cartpoles([lambda e: gym.wrappers.TransformReward(e, lambda r: 2 * r)]), "TransformReward"),
    # (inside an AsyncVectorEnv's subprocesses, and in a SyncVectorEnv's envs other than the first: not seen before)
    (lambda: _same_step_cartpoles([_clip_reward], mode="async"), "ClipReward"),
    (_unlike_cartpoles, "ClipReward"),
])
def test_rewards_a_vector_wrapper_changes_are_said_to_be_changed(ppo, make, name):
    env = make()
    with pytest.warns(UserWarning, match=name):
        rlspeed.evaluate(ppo, env, episodes=2, seed=0)
    env.close()


def test_a_models_own_evaluate_takes_deterministic_as_rlspeed_evaluate_does(ppo):
    sampled = ppo.evaluate(episodes=3, seed=2, deterministic=False)
    assert sampled["returns"] == rlspeed.evaluate(ppo, episodes=3, seed=2, deterministic=False)["returns"]
    assert ppo.evaluate(episodes=3, seed=2)["returns"] == rlspeed.evaluate(ppo, episodes=3, seed=2)["returns"]


def test_rlspeed_eval_stochastic_samples_and_its_seed_repeats_them(ppo, tmp_path, capsys):
    from rlspeed import cli

    path = ppo.save(tmp_path / "model")
    results = []
    for flags in (["--stochastic"], ["--stochastic"], []):
        capsys.readouterr()
        assert cli.main(["eval", str(path), "--episodes", "4", "--seed", "3", "--json", *flags]) == 0
        results.append(json.loads(capsys.readouterr().out)["returns"])
    assert results[0] == results[1] == rlspeed.evaluate(ppo, episodes=4, seed=3, deterministic=False)["returns"]
    assert results[2] == rlspeed.evaluate(ppo, episodes=4, seed=3)["returns"]


def test_a_models_largest_seed_still_evaluates_with_its_offsets():
    """A model's seed may be up to 2**32 - 1; its evaluations add offsets (learn's, the final one's) beyond it."""
    model = PPO("CartPole-v1", device="cpu", seed=2**32 - 1, num_envs=4, num_steps=16)
    model.learn(128, progress_bar=False, target_return=1e9, eval_freq=64, eval_episodes=2)
    assert len(model.result.evaluations) == 2
    assert rlspeed.evaluate(model, episodes=2, seed=2**32 - 1 + 1_000_000)["seed"] == 2**32 - 1 + 1_000_000


def test_neighbouring_seeds_and_kinds_evaluate_on_unrelated_episodes():
    """`evaluation_seed`: runs of seeds s and s + 1 (and one run's kinds of evaluation) play no episode seed in
    common over 10 episodes, where a seed plus an offset shared nine of ten; the same arguments give the same seed,
    and every episode seed of an evaluation of up to 2**30 episodes stays below 2**31 (EnvPool's limit)."""
    from rlspeed.evaluation import EVALUATION_KINDS, EVALUATION_SEED_RANGE, evaluation_seed

    def episodes(seed, kind="learn", steps=4096):
        return set(range(evaluation_seed(seed, kind, steps), evaluation_seed(seed, kind, steps) + 10))

    for seed in (0, 1, 41, 2**32 - 2):
        assert not episodes(seed) & episodes(seed + 1)
    assert all(not episodes(7, a) & episodes(7, b) for a in EVALUATION_KINDS for b in EVALUATION_KINDS if a != b)
    assert not episodes(7, steps=4096) & episodes(7, steps=4097)
    assert evaluation_seed(7, "final", 512) == evaluation_seed(7, "final", 512)
    assert evaluation_seed(None, "final", 512) == evaluation_seed(0, "final", 512)
    assert all(0 <= evaluation_seed(seed, "confirm", 10**12) < EVALUATION_SEED_RANGE <= 2**30
               for seed in (0, 2**32 - 1, 2**63 - 1))


def test_a_vector_envs_time_limit_and_recording_wrappers_are_its_envs(ppo):
    """gym.make_vec's own spec keeps the registered time limit: the envs' (max_episode_steps=N, a TimeLimit wrapper)
    is the one evaluation runs to; RecordEpisodeStatistics passed as `wrappers=` keeps the registered id."""
    from rlspeed import make_env

    def vec(**options):
        return gym.make_vec("Pendulum-v1", 2, vectorization_mode="sync",
                            vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}, **options)

    for options in ({"max_episode_steps": 40}, {"wrappers": [lambda env: gym.wrappers.TimeLimit(env, 40)]}):
        env = make_env(vec(**options))
        assert env.spec.env_id == "user-vector-env" and env.spec.max_episode_steps == 40
        model = rlspeed.PPO(env, seed=0, num_steps=16, batch_size=32)
        assert rlspeed.evaluate(model, vec(**options), episodes=2)["lengths"] == [40, 40]
    recorded = make_env(vec(wrappers=[gym.wrappers.RecordEpisodeStatistics]))
    assert recorded.spec.env_id == "Pendulum-v1" and recorded.spec.max_episode_steps == 200
    # (max_episode_steps=-1 makes envs without a time limit, whose specs say None: not the registered 200 of
    # make_vec's own spec, which cut evaluation episodes at 200 steps)
    unlimited = make_env(vec(max_episode_steps=-1))
    assert unlimited.spec.max_episode_steps is None
    assert rlspeed.evaluation.episode_step_limit(unlimited, None) == rlspeed.evaluation.UNLIMITED_EPISODE_STEPS


def test_a_single_env_is_evaluated_as_a_vector_env_of_one_as_stable_baselines3_does(ppo):
    """evaluate(model, gym.make(id)) (Stable-Baselines3's evaluate_policy takes one env) runs its episodes in turn on
    that env, as on a vector env of it, and leaves it open; it was refused with a sentence naming make_env."""
    single, wrapped = gym.make("CartPole-v1"), gym.make("CartPole-v1")
    single.reset(seed=3), wrapped.reset(seed=3)
    closed = []
    single.close = lambda: closed.append(single)  # (a CartPole resets after a close: the call itself is watched)
    alone = rlspeed.evaluate(ppo, single, episodes=3)
    in_vector = rlspeed.evaluate(ppo, gym.vector.SyncVectorEnv(
        [lambda: wrapped], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP), episodes=3)
    assert alone["returns"] == in_vector["returns"] and alone["episodes"] == 3
    assert not closed  # (still open: the caller's)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_wrapped_vector_envs_time_limit_is_its_envs(mode):
    """Gymnasium's vector wrappers (RecordEpisodeStatistics here) have no `get_attr`: around envs made with
    max_episode_steps=40 the model took the registered limit (500) for one process, or none for a vector env built
    without gym.make_vec (evaluation episodes of 10,000 steps), and subprocess envs failed with AttributeError
    ('RecordEpisodeStatistics' object has no attribute 'get_attr')."""
    from rlspeed import make_env

    same_step = gym.vector.AutoresetMode.SAME_STEP
    built = (gym.vector.SyncVectorEnv if mode == "sync" else
             functools.partial(gym.vector.AsyncVectorEnv, context="fork"))(
        [lambda: gym.make("CartPole-v1", max_episode_steps=40)] * 2, autoreset_mode=same_step)
    made = gym.make_vec("CartPole-v1", 2, vectorization_mode=mode, max_episode_steps=40,
                        vector_kwargs={"autoreset_mode": same_step})
    for vector_env in (made, built):
        env = make_env(gym.wrappers.vector.RecordEpisodeStatistics(vector_env))
        assert env.spec.max_episode_steps == 40
        env.close()


def test_nested_time_limits_give_the_soonest_cut_or_say_that_they_cannot():
    """TimeLimit(gym.make("CartPole-v1"), 1000) ends its episodes at the registered 500 steps: the model took the
    outer 1000 (its spec's) as the envs' time limit, which evaluation's step cap and the report name. In-process envs
    give the soonest; subprocess envs, whose inner limits no call reaches, are warned of."""
    from rlspeed import make_env

    sb3 = pytest.importorskip("stable_baselines3.common.vec_env")
    same_step = gym.vector.AutoresetMode.SAME_STEP
    for outer, inner, soonest in ((1000, None, 500), (30, None, 30), (1000, 40, 40)):
        def made(outer=outer, inner=inner):
            return gym.wrappers.TimeLimit(gym.make("CartPole-v1", max_episode_steps=inner), outer)

        for vector_env in (gym.vector.SyncVectorEnv([made], autoreset_mode=same_step), sb3.DummyVecEnv([made])):
            env = make_env(vector_env)
            assert env.spec.max_episode_steps == soonest, (type(vector_env).__name__, outer, inner)
            env.close()
    # subprocess envs: their workers answer from the outermost TimeLimit alone (get_attr, call, spec), which the model
    # took for the limit without a word; now it says so (and where an env has one TimeLimit, nothing)
    def nested():
        return gym.wrappers.TimeLimit(gym.make("CartPole-v1"), 1000)

    for built in (lambda fn: gym.vector.AsyncVectorEnv([fn], context="fork", autoreset_mode=same_step),
                  lambda fn: sb3.SubprocVecEnv([fn], start_method="fork")):
        # (\w*: with rl_zoo3 imported, as another test of the suite does, Gymnasium's TimeLimit is its PatchedTimeLimit)
        with pytest.warns(UserWarning, match=r"2 time limits each \(\w*TimeLimit, \w*TimeLimit\), and only the "
                                             r"outermost's \(1000 steps\) can be read"):
            env = make_env(built(nested))
        env.close()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            env = make_env(built(functools.partial(gym.make, "CartPole-v1")))
        assert env.spec.max_episode_steps == 500
        env.close()


def test_other_action_bounds_or_reward_wrappers_in_training_are_said():
    """SAC trained on RescaleAction(-1, 1) scales its actions to [-1, 1]: evaluated on the stock Pendulum they are half
    the torques (evaluate warns); a reward wrapper around the training env changes the logged returns (the model
    warns)."""
    rescaled = gym.make_vec("Pendulum-v1", 2, vectorization_mode="sync",
                            wrappers=[lambda env: gym.wrappers.RescaleAction(env, -1.0, 1.0)],
                            vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
    model = rlspeed.SAC(rescaled, seed=0, device="cpu", learning_starts=10)
    with pytest.warns(UserWarning, match="action bounds .* differ from those this model trained with"):
        rlspeed.evaluate(model, "Pendulum-v1", episodes=1, max_steps=5)
    normalized = gym.wrappers.vector.NormalizeReward(_same_step_cartpoles())
    with pytest.warns(UserWarning, match="rewards pass through NormalizeReward, so the episode returns in the metrics"):
        rlspeed.PPO(normalized, seed=0, num_steps=16, batch_size=32)


def test_a_reward_wrapper_of_the_users_own_is_said_as_gymnasiums_are():
    """A gymnasium.RewardWrapper subclass of one's own (around each env or the vector env) changes the logged and
    evaluated returns as TransformReward does: the model and evaluate warn, naming it."""
    class Bonus(gym.RewardWrapper):
        def reward(self, reward):
            return reward + 1.0

    class VectorBonus(gym.vector.VectorRewardWrapper):
        def rewards(self, rewards):
            return rewards + 1.0

    for name, built in (("Bonus", lambda: _same_step_cartpoles(wrappers=[Bonus])),
                        ("VectorBonus", lambda: VectorBonus(_same_step_cartpoles()))):
        with pytest.warns(UserWarning, match=f"rewards pass through {name}, so the episode returns in the metrics"):
            model = rlspeed.PPO(built(), seed=0, num_steps=16, batch_size=32)
        with pytest.warns(UserWarning, match=f"rewards pass through {name}, so the returns reported"):
            rlspeed.evaluate(model, built(), episodes=2)


def _recorded_then_normalised(env):  # (CleanRL's order; module level: subprocess envs take it by pickle)
    return gym.wrappers.ClipReward(gym.wrappers.NormalizeReward(gym.wrappers.RecordEpisodeStatistics(env)), -10, 10)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_returns_recorded_under_reward_wrappers_are_the_envs_own(mode):
    """CleanRL's envs: Gymnasium's RecordEpisodeStatistics around each env, NormalizeReward and a clip over it. The
    episode returns in training's metrics and evaluate's were the sums of the normalised rewards, with a warning;
    they are the returns RecordEpisodeStatistics recorded (the env's own, as CleanRL logs them), and none warns.
    A CartPole episode's own return is its length."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        env = rlspeed.make_env(_same_step_cartpoles([_recorded_then_normalised], mode=mode), device="cpu")
        model = PPO(_same_step_cartpoles([_recorded_then_normalised]), seed=0, num_steps=16, batch_size=32)
        result = rlspeed.evaluate(model, env, episodes=2, seed=0)
    assert result["returns"] == [float(length) for length in result["lengths"]]
    assert not [w for w in caught if "rewards pass through" in str(w.message)]
    env.reset(seed=0)
    finished = 0
    while finished < 3:
        _, _, _, _, info = env.step(torch.randint(0, 2, (2,)))
        done = info["done"]
        assert info["episode_return"][done].tolist() == info["episode_length"][done].double().tolist()
        finished += int(done.sum())
    env.close()
    model.close()


def test_returns_the_vector_record_episode_statistics_records_under_reward_wrappers_are_the_envs_own():
    """Gymnasium's vector RecordEpisodeStatistics under its vector NormalizeReward: the returns reported were the
    normalised rewards' sums, with a warning; they are the recorded ones (a CartPole episode's is its length)."""
    def recorded():
        return gym.wrappers.vector.NormalizeReward(gym.wrappers.vector.RecordEpisodeStatistics(_same_step_cartpoles()))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = PPO(recorded(), seed=0, num_steps=16, batch_size=32)
        result = rlspeed.evaluate(model, recorded(), episodes=2, seed=0)
    assert result["returns"] == [float(length) for length in result["lengths"]]
    assert not [w for w in caught if "rewards pass through" in str(w.message)]


def test_recorded_returns_of_a_populations_member_envs_join():
    """A population's members step envs of their own whose infos are joined key by key: recorded returns given as one
    tuple failed to concatenate where two members' episodes ended in the same step."""
    from rlspeed.envs.base import EpisodeStatistics
    from rlspeed.envs.gymnasium_env import GymnasiumEnv
    from rlspeed.population.base import MemberEnvs

    class Steady(gym.Env):  # (episodes of 3 steps, reward 1 each: every member's end in the same step)
        observation_space, action_space = gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(2)

        def reset(self, seed=None, options=None):
            super().reset(seed=seed)
            return np.zeros(2, dtype=np.float32), {}

        def step(self, action):
            return np.zeros(2, dtype=np.float32), 1.0, False, False, {}

    def member():
        made = [lambda: _recorded_then_normalised(gym.wrappers.TimeLimit(Steady(), 3))] * 2
        same_step = gym.vector.AutoresetMode.SAME_STEP
        return GymnasiumEnv(vector_env=gym.vector.SyncVectorEnv(made, autoreset_mode=same_step))

    env = EpisodeStatistics(MemberEnvs([member(), member()]))
    env.reset()
    for _ in range(3):
        _, _, _, _, info = env.step(torch.zeros(4, dtype=torch.int64))
    assert info["done"].all() and info["episode_return"].tolist() == [3.0] * 4
    env.close()


def _doubled_cartpole():  # (a lambda in its wrapper's spec, which the subprocess cannot send back)
    return gym.wrappers.TransformReward(gym.make("CartPole-v1", max_episode_steps=30), lambda reward: 2 * reward)


def _doubled_subprocess_cartpoles(kind: str):
    """Two forked subprocess CartPoles whose wrappers keep a lambda, with a time limit of 30: Gymnasium's
    AsyncVectorEnv (`kind` "gymnasium") or Stable-Baselines3's SubprocVecEnv ("sb3")."""
    if kind == "sb3":
        vec_env = pytest.importorskip("stable_baselines3.common.vec_env")
        return vec_env.SubprocVecEnv([_doubled_cartpole] * 2, start_method="fork")
    return gym.make_vec("CartPole-v1", 2, vectorization_mode="async", max_episode_steps=30,
                        wrappers=[lambda env: gym.wrappers.TransformReward(env, lambda reward: 2 * reward)],
                        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP, "context": "fork"})


@pytest.mark.parametrize("kind", ["gymnasium", "sb3"])
def test_subprocess_envs_whose_wrappers_keep_a_lambda_stay_up_keep_their_time_limit_and_are_said_to_change_rewards(
        kind):
    """Subprocess envs wrapped as Gymnasium's docs write it, `TransformReward(env, lambda r: ...)`: rlspeed asked them
    for their specs (the time limit), the lambda in those failed to pickle, and the workers went down (Gymnasium's:
    "workers 0, 1 stopped: an interrupt inside a step"; SB3's SubprocVecEnv: a BrokenPipeError). The time limit is
    their TimeLimit's; and evaluate, which read no wrapper inside SB3's subprocesses, says the doubled rewards' sums."""
    env = _doubled_subprocess_cartpoles(kind)
    with pytest.warns(UserWarning, match="rewards pass through TransformReward, so the episode returns in the metrics"):
        model = PPO(env, seed=0, num_steps=16, batch_size=32)
    assert model.spec.max_episode_steps == 30
    with pytest.warns(UserWarning, match="rewards pass through TransformReward"):
        result = rlspeed.evaluate(model, env, episodes=2, seed=0)
    assert result["returns"] == [2.0 * length for length in result["lengths"]]
    model.close()
    env.close()


@pytest.mark.parametrize("kind", ["gymnasium", "gymnasium-lambda", "sb3-lambda"])
def test_subprocess_envs_are_asked_about_their_wrappers_once(kind):
    """A model made on subprocess envs, and evaluated on them, asked every worker for its wrappers (`str()`) five to
    twelve times over, a round trip to each worker every time: once for each question about them (reward wrappers,
    recording, normalisation, filming, the time limit). Their wrappers and their specs are asked once per vector env
    made; their TimeLimit's limit, which `set_attr` changes, once per env made of it (the model's, the evaluation's)."""
    env = (_doubled_subprocess_cartpoles(kind.removesuffix("-lambda")) if kind.endswith("-lambda") else
           gym.make_vec("CartPole-v1", 2, vectorization_mode="async",
                        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP, "context": "fork"}))
    asked = {}

    def counting(method: str):
        ask = getattr(env, method)

        def counted(name, *args, **kwargs):
            asked[method, name] = asked.get((method, name), 0) + 1
            return ask(name, *args, **kwargs)
        return counted

    for method in ("call", "env_method", "get_attr"):
        if hasattr(env, method):
            setattr(env, method, counting(method))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the lambda's doubled rewards: said, as another test checks)
        model = PPO(env, seed=0, num_steps=16, batch_size=32)
        rlspeed.evaluate(model, env, episodes=1, seed=0)
    limits = {key: asked.pop(key) for key in list(asked) if key[1] == "_max_episode_steps"}
    assert asked and set(asked.values()) == {1}, asked
    assert max(limits.values(), default=0) <= 2, limits
    model.close()
    env.close()


@pytest.mark.parametrize("kind", ["sync", "async", "async-lambda"])
def test_a_time_limit_set_on_a_vector_envs_envs_is_the_one_a_model_takes(kind):
    """`set_attr("_max_episode_steps", 50)` on a vector env a model had been made of: the next model took the old
    limit (500, or the lambda-wrapped envs' 30) and, for CartPole's, the registered id (evaluated on 500-step envs
    made of it): Gymnasium's TimeLimit keeps the spec it first gave, and rlspeed kept the workers' first answer."""
    from rlspeed import make_env

    same_step = gym.vector.AutoresetMode.SAME_STEP
    vector_env = (_doubled_subprocess_cartpoles("gymnasium") if kind == "async-lambda" else
                  (gym.vector.SyncVectorEnv if kind == "sync" else
                   functools.partial(gym.vector.AsyncVectorEnv, context="fork"))(
                      [lambda: gym.make("CartPole-v1")] * 2, autoreset_mode=same_step))
    try:
        first = make_env(vector_env).spec
        assert (first.env_id, first.max_episode_steps) == (
            ("user-vector-env", 30) if kind == "async-lambda" else ("CartPole-v1", 500))
        vector_env.set_attr("_max_episode_steps", 50)
        spec = make_env(vector_env).spec
        assert (spec.env_id, spec.max_episode_steps) == ("user-vector-env", 50)
    finally:
        vector_env.close()


@pytest.mark.parametrize("kind", ["gymnasium", "sb3"])
def test_subprocess_envs_that_cannot_say_their_wrappers_are_refused_once_with_their_error(kind):
    """Subprocess envs whose `str()` raises: the ask stopped the workers, rlspeed took them for envs that cannot
    answer and asked them again at each question (8 times), made the model without a time limit, and its learn blamed
    an interrupt (Gymnasium's: "workers 0, 1 stopped: an interrupt inside a step") or raised a BrokenPipeError (SB3's).
    Asked once, the model is refused in one sentence naming the question and the workers' error."""
    env = (gym.vector.AsyncVectorEnv([_unprintable_cartpole] * 2, context="fork",
                                     autoreset_mode=gym.vector.AutoresetMode.SAME_STEP) if kind == "gymnasium" else
           pytest.importorskip("stable_baselines3.common.vec_env").SubprocVecEnv([_unprintable_cartpole] * 2,
                                                                                 start_method="fork"))
    asked = []

    def counting(ask):
        def counted(name, *args, **kwargs):
            asked.append(name)
            return ask(name, *args, **kwargs)
        return counted

    for method in ("call", "env_method", "get_attr"):
        if hasattr(env, method):
            setattr(env, method, counting(getattr(env, method)))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (Gymnasium's log of its workers' error)
            for _ in range(2):
                with pytest.raises(rlspeed.UserError, match=r"stopped when each env was asked for its str\(\).*"
                                                            r"(RuntimeError: no str here|EOFError)"):
                    PPO(env, seed=0, num_steps=16, batch_size=32)
        assert asked == ["__str__"]
    finally:
        with contextlib.suppress(OSError, EOFError):  # (SB3's close asks its stopped workers)
            env.close(**({"terminate": True} if kind == "gymnasium" else {}))


class _Unprintable(gym.Wrapper):
    def __str__(self):
        raise RuntimeError("no str here")


def _unprintable_cartpole():
    return _Unprintable(gym.make("CartPole-v1"))


class _ComparedAsyncVectorEnv(gym.vector.AsyncVectorEnv):  # (__eq__ without __hash__: no dict key)
    def __eq__(self, other):
        return self is other


def test_subprocess_envs_that_cannot_key_a_dict_keep_their_time_limit():
    """The workers' answers are kept per vector env in a WeakKeyDictionary: a vector env class defining `__eq__` (so
    unhashable) failed to key it, was taken for envs that cannot answer, and lost its time limit (evaluation
    episodes of 10,000 steps where its envs' are 40)."""
    from rlspeed import make_env

    vector_env = _ComparedAsyncVectorEnv([lambda: gym.make("CartPole-v1", max_episode_steps=40)] * 2, context="fork",
                                         autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    env = make_env(vector_env)
    try:
        assert env.spec.max_episode_steps == 40
    finally:
        env.close()


class _PatchedTimeLimit(gym.wrappers.TimeLimit):  # (rl_zoo3.gym_patches' subclass, put in TimeLimit's place)
    pass


@pytest.mark.parametrize("kind", ["gymnasium", "sb3"])
def test_subprocess_envs_keep_their_time_limit_after_rl_zoo3_replaced_gymnasiums(monkeypatch, kind):
    """Importing rl_zoo3 (its wrappers, its tools) puts its PatchedTimeLimit in the place of Gymnasium's TimeLimit, for
    the rest of the process: subprocess envs whose wrappers keep a lambda then had the registered time limit (500)
    or none in place of their own (30)."""
    monkeypatch.setattr(gym.wrappers, "TimeLimit", _PatchedTimeLimit)  # (what gymnasium.make wraps with)
    env = _doubled_subprocess_cartpoles(kind)
    with pytest.warns(UserWarning, match="rewards pass through TransformReward"):
        model = PPO(env, seed=0, num_steps=16, batch_size=32)
    assert model.spec.max_episode_steps == 30
    model.close()
    env.close()


def test_an_sb3_vec_env_whose_rewards_are_changed_is_said_in_training_unless_its_monitor_counts():
    """An SB3 DummyVecEnv of reward-changed envs without Monitor: the metrics' returns are the changed rewards' sums,
    which training said of Gymnasium's vector envs only (evaluate said it of both); with Monitor under the wrapper its
    episodes are the env's own, and nothing is said."""
    vec_env = pytest.importorskip("stable_baselines3.common.vec_env")
    monitor = pytest.importorskip("stable_baselines3.common.monitor")
    with pytest.warns(UserWarning, match="rewards pass through TransformReward, so the episode returns in the metrics"):
        PPO(vec_env.DummyVecEnv([_doubled_cartpole] * 2), seed=0, num_steps=16, batch_size=32)

    def counted():
        return gym.wrappers.TransformReward(monitor.Monitor(gym.make("CartPole-v1")), lambda reward: 2 * reward)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        PPO(vec_env.DummyVecEnv([counted] * 2), seed=0, num_steps=16, batch_size=32)
    assert not [w for w in caught if "rewards pass through" in str(w.message)]


def test_a_stochastic_evaluation_of_a_gsde_policy_repeats_with_its_seed():
    """gSDE's exploration matrices came from the caller's generator when the model was made (or loaded), so
    `rlspeed eval --stochastic --seed S` gave other returns in another process; the evaluation draws them from its
    own seeded stream now, and puts the model's back."""
    from rlspeed.sde import SDENoise

    model = rlspeed.SAC("Pendulum-v1", device="cpu", seed=0, use_sde=True, learning_starts=10, batch_size=16)
    noise = next(module for module in model.actor.modules() if isinstance(module, SDENoise))
    results = []
    for draw in range(2):
        torch.manual_seed(100 + draw)
        noise.resample(1)  # (the matrices a fresh process would hold: other ones each time)
        held = noise.exploration.clone()
        results.append(rlspeed.evaluate(model, episodes=2, seed=3, deterministic=False, max_steps=50)["returns"])
        assert torch.equal(noise.exploration, held)
    assert results[0] == results[1]


def test_model_evaluate_runs_on_the_models_threads_and_gives_the_callers_back(monkeypatch):
    """model.evaluate() ran on the caller's thread count, learn's evaluations on the model's: the same seed could give
    other returns in their last digits (a CPU's sums depend on the thread count)."""
    import torch

    import rlspeed.evaluation
    from rlspeed import PPO

    seen = []
    real = rlspeed.evaluation.evaluate
    monkeypatch.setattr(rlspeed.evaluation, "evaluate",
                        lambda *args, **kwargs: seen.append(torch.get_num_threads()) or real(*args, **kwargs))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        PPO("CartPole-v1", device="cpu", num_threads=1, num_envs=2, num_steps=16).evaluate(episodes=1, seed=0)
        assert seen == [1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_rlspeed_evaluate_acts_on_the_models_threads_in_float32_and_gives_the_callers_back(monkeypatch):
    """rlspeed.evaluate(model, ...) (SB3's evaluate_policy's place) acted on the caller's thread count, where
    model.evaluate and learn's evaluations act on the model's (the same seed could give other returns in their last
    digits), and in a caller's float64 default dtype."""
    import torch

    import rlspeed.evaluation
    from rlspeed import PPO

    model = PPO("CartPole-v1", device="cpu", num_threads=1, num_envs=2, num_steps=16, batch_size=32)
    seen = []
    real = rlspeed.evaluation._Acting.step
    monkeypatch.setattr(rlspeed.evaluation._Acting, "step", lambda self, *args: seen.append(
        (torch.get_num_threads(), torch.get_default_dtype())) or real(self, *args))
    before, dtype = torch.get_num_threads(), torch.get_default_dtype()
    try:
        torch.set_num_threads(2)
        torch.set_default_dtype(torch.float64)
        rlspeed.evaluate(model, episodes=2, seed=0)
        assert set(seen) == {(1, torch.float32)}
        assert (torch.get_num_threads(), torch.get_default_dtype()) == (2, torch.float64)
    finally:
        torch.set_num_threads(before)
        torch.set_default_dtype(dtype)


def test_an_evaluation_whose_set_up_fails_gives_the_callers_generators_back(ppo, monkeypatch):
    """A context of an evaluation's set-up that raised on entry (its thread count) left the random stream entered
    before it forked: the caller's generator stayed seeded by the evaluation's seed."""
    import rlspeed.evaluation

    def failing(num_threads):
        raise RuntimeError("no threads")

    monkeypatch.setattr(rlspeed.evaluation, "training_threads", failing)
    state = torch.get_rng_state()
    with pytest.raises(RuntimeError, match="no threads"):
        rlspeed.evaluate(ppo, "CartPole-v1", episodes=1, seed=3, deterministic=False)
    assert torch.equal(torch.get_rng_state(), state)


def test_a_model_of_a_vector_env_one_built_says_how_to_evaluate_it_from_the_cli_too(tmp_path, capsys):
    """`rlspeed eval` of a model trained on a vector env of the user's own (no id) answered 'not a registered id
    here: import the module that registers it (--gym-packages)', which no module does, and Python advice only;
    `--env ID` (a registered env of the same spaces) is the CLI's way, and it works."""
    from gymnasium.envs.classic_control import CartPoleEnv

    from rlspeed import cli

    env = gym.vector.SyncVectorEnv([lambda: gym.wrappers.TimeLimit(CartPoleEnv(), 100)] * 2,
                                   autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    model = PPO(env, seed=0, device="cpu", num_steps=16, batch_size=32)
    model.learn(32, progress_bar=False).save(tmp_path / "model.safetensors")
    with pytest.raises(rlspeed.UserError, match=r"a vector env you built, which has no id .*eval MODEL --env ID"):
        PPO.load(tmp_path / "model.safetensors").evaluate(episodes=2)
    assert cli.main(["eval", str(tmp_path / "model.safetensors"), "--env", "CartPole-v1", "--episodes", "2"]) == 0


def test_an_evaluation_leaves_the_statistics_of_a_vec_normalize_as_they_were():
    """An SB3 VecNormalize made with its default training=True (EvalCallback(eval_env) copies the training statistics
    into it) counted the evaluation's observations and returns into its statistics; they are frozen while it runs,
    and its `training` flag is the caller's again after it."""
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    model = PPO("Pendulum-v1", device="cpu", seed=0, num_envs=2, env_backend="gymnasium")
    env = VecNormalize(make_vec_env("Pendulum-v1", n_envs=2, seed=0), norm_obs=True, norm_reward=True)
    counts = env.obs_rms.count, env.ret_rms.count
    result = rlspeed.evaluate(model, env, episodes=2, seed=0, max_steps=20)
    assert result["lengths"] == [20, 20]
    assert (env.obs_rms.count, env.ret_rms.count) == counts and env.training
    env.close()


def _normalised_cartpoles(mode="sync"):  # (CleanRL's order: NormalizeObservation inside, NormalizeReward outside)
    return _same_step_cartpoles([gym.wrappers.NormalizeObservation, gym.wrappers.NormalizeReward], mode=mode)


def _layers(env):  # (a Gymnasium env and the envs its wrappers wrap)
    return [env] + (_layers(env.env) if isinstance(env, gym.Wrapper) else [])


def test_an_evaluation_leaves_gymnasiums_normalisation_statistics_as_they_were():
    """Gymnasium's NormalizeObservation and NormalizeReward, around each env (CleanRL's) or the vector env's: evaluating
    on an env that holds statistics (the training env, or one given its statistics) folded the evaluation's
    observations and returns into them. They are frozen while it runs (`update_running_mean`, as Gymnasium's docs
    suggest for evaluation) and their flags are the caller's again after it; an env whose statistics have seen
    nothing is said to hand the policy raw observations."""
    with pytest.warns(UserWarning, match="NormalizeObservation"):
        model = PPO(_normalised_cartpoles(), seed=0, num_steps=16, batch_size=32)
    # (Gymnasium's vector NormalizeObservation takes no SAME_STEP vector env; its vector NormalizeReward does)
    vector = gym.wrappers.vector.NormalizeReward(_same_step_cartpoles([gym.wrappers.NormalizeObservation]))
    for env in (_normalised_cartpoles(), vector):
        env.reset(seed=0)
        for _ in range(5):  # (statistics of some steps, as a training env holds)
            env.step(env.action_space.sample())
        layers = [env] + [layer for one in env.unwrapped.envs for layer in _layers(one)]
        normalisers = [layer for layer in layers if hasattr(type(layer), "update_running_mean")]
        assert len(normalisers) == (4 if env is not vector else 3)
        held = [(wrapper.obs_rms if hasattr(wrapper, "obs_rms") else wrapper.return_rms) for wrapper in normalisers]
        before = [(rms.count, rms.mean.copy(), rms.var.copy()) for rms in held]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            rlspeed.evaluate(model, env, episodes=2, seed=0, max_steps=20)
        assert not [w for w in caught if "seen no observation" in str(w.message)]
        for rms, (count, mean, var) in zip(held, before):
            assert rms.count == count and np.array_equal(rms.mean, mean) and np.array_equal(rms.var, var)
        assert all(wrapper.update_running_mean for wrapper in normalisers)
        env.close()
    with pytest.warns(UserWarning, match="NormalizeObservation, whose statistics have seen no observation yet"):
        rlspeed.evaluate(model, _normalised_cartpoles(), episodes=2, seed=0, max_steps=20)
    model.close()


def _subprocess_statistics(env, attributes) -> list:
    """(count, mean, var) of the running statistics `attributes` (obs_rms, return_rms) of each subprocess env."""
    return [(rms.count, rms.mean.tolist(), np.asarray(rms.var).tolist())
            for attribute in attributes for rms in env.get_attr(attribute)]


def test_an_evaluation_freezes_gymnasiums_normalisation_inside_subprocess_envs_and_puts_it_back():
    """Gymnasium's NormalizeObservation inside an AsyncVectorEnv's workers: evaluate folded the evaluation's
    observations into its statistics, with a warning that it could not freeze them. It freezes it there now
    (`set_attr("update_running_mean", False)`, which reaches the outermost wrapper that has it) and puts the flag and
    the statistics back after; with two in each env (CleanRL's NormalizeObservation inside NormalizeReward) the inner
    one's statistics, out of `set_attr`'s reach while it runs, are put back after it, with a warning that they moved
    during the evaluation."""
    with pytest.warns(UserWarning, match="NormalizeObservation"):
        model = PPO(_normalised_cartpoles(), seed=0, num_steps=16, batch_size=32)
    for wrappers, attributes in (([gym.wrappers.NormalizeObservation], ["obs_rms"]),
                                 ([gym.wrappers.NormalizeObservation, gym.wrappers.NormalizeReward],
                                  ["obs_rms", "return_rms"])):
        env = _same_step_cartpoles(wrappers, mode="async")
        env.reset(seed=0)
        for _ in range(5):  # (statistics of some steps, as a training env holds)
            env.step(env.action_space.sample())
        before = _subprocess_statistics(env, attributes)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            rlspeed.evaluate(model, env, episodes=2, seed=0, max_steps=20)
        said = [str(w.message) for w in caught if "subprocess envs" in str(w.message)]
        if len(wrappers) == 1:
            assert not said
        else:
            assert len(said) == 1 and "only the outermost in each env can be frozen" in said[0]
        assert _subprocess_statistics(env, attributes) == before and before[0][0] > 5
        assert list(env.get_attr("update_running_mean")) == [True, True]
        env.close()
    model.close()


class _OwnNormalizeObservation(gym.wrappers.NormalizeObservation):  # (a subclass of the caller's: str() names it)
    pass


class _OtherNormalizeObservation(gym.ObservationWrapper):  # (another package's wrapper of the same name: no obs_rms)
    def observation(self, observation):
        return observation


_OtherNormalizeObservation.__name__ = "NormalizeObservation"


@pytest.mark.parametrize("wrapper", [_OwnNormalizeObservation, _OtherNormalizeObservation], ids=["subclass", "other"])
def test_subprocess_envs_normalisers_are_known_by_their_kind_not_their_name(wrapper):
    """Subprocess envs' wrappers are known by their names (their `str()`): a subclass of Gymnasium's
    NormalizeObservation went unrecognised, and the evaluation folded its observations into the workers' statistics
    without a word (count 33 -> 44); another wrapper of that name, without `obs_rms`, would have been asked for it,
    which stops Gymnasium's workers. The subclass is frozen (statistics as they were); the other wrapper is asked
    first whether it has the statistics, and its envs go on."""
    with pytest.warns(UserWarning, match="NormalizeObservation"):
        model = PPO(_normalised_cartpoles(), seed=0, num_steps=16, batch_size=32)
    env = _same_step_cartpoles([wrapper], mode="async")
    try:
        env.reset(seed=0)
        env.step(env.action_space.sample())
        if wrapper is _OwnNormalizeObservation:
            before = _subprocess_statistics(env, ["obs_rms"])
            rlspeed.evaluate(model, env, episodes=2, seed=0, max_steps=20)
            assert _subprocess_statistics(env, ["obs_rms"]) == before
        else:
            with pytest.warns(UserWarning, match="cannot freeze"):
                rlspeed.evaluate(model, env, episodes=2, seed=0, max_steps=20)
            env.step(env.action_space.sample())  # (its workers still up)
    finally:
        env.close()
        model.close()


def _normalised_cartpole():  # (a function at module level: SB3's SubprocVecEnv pickles it for its workers)
    return gym.wrappers.NormalizeObservation(gym.make("CartPole-v1", max_episode_steps=30))


def test_an_evaluation_on_sb3_subprocess_envs_it_cannot_freeze_says_their_statistics_move():
    """docs/envs.md: in an SB3 SubprocVecEnv, whose `set_attr` reaches only the outermost wrapper, Gymnasium's
    normalisers are not frozen; the evaluation says so (their statistics move with it) and leaves their flags alone."""
    vec_env = pytest.importorskip("stable_baselines3.common.vec_env")
    env = vec_env.SubprocVecEnv([_normalised_cartpole] * 2, start_method="fork")
    try:
        with pytest.warns(UserWarning, match=r"subprocess envs pass through Gymnasium's NormalizeObservation, whose "
                                             r"running statistics the evaluation cannot freeze in their processes"):
            rlspeed.evaluate(PPO("CartPole-v1", device="cpu", seed=0), env, episodes=2, seed=0)
        assert list(env.get_attr("update_running_mean")) == [True, True]
    finally:
        env.close()


def test_an_evaluation_that_stops_puts_back_every_normalisation_it_froze(monkeypatch):
    """The flags an evaluation freezes are put back on every way out: a warning raised as an error after the
    subprocess envs' normalisers were frozen left them frozen (every later step of the training env kept its
    statistics as they were), and a Ctrl-C while the subprocess envs stepped raised Gymnasium's
    AlreadyPendingCallError from the first `set_attr` putting them back, in place of the KeyboardInterrupt, leaving the
    vector NormalizeReward around them frozen. Now the others are put back all the same and the Ctrl-C goes on, with
    a warning that the subprocess envs' were not."""
    model = PPO("CartPole-v1", device="cpu", seed=0)
    env = _normalised_cartpoles(mode="async")
    env.reset(seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        warnings.filterwarnings("error", message=".*only the outermost in each env can be frozen")
        with pytest.raises(UserWarning, match="only the outermost"):
            rlspeed.evaluate(model, env, episodes=2, seed=0, max_steps=20)
    assert list(env.get_attr("update_running_mean")) == [True, True]
    env.close()
    env = gym.wrappers.vector.NormalizeReward(_same_step_cartpoles([gym.wrappers.NormalizeObservation], mode="async"))
    env.reset(seed=0)
    step_wait, steps = gym.vector.AsyncVectorEnv.step_wait, []

    def interrupted(self, *args, **kwargs):  # (Ctrl-C at the third step, the workers' answers pending)
        steps.append(1)
        if len(steps) == 3:
            raise KeyboardInterrupt
        return step_wait(self, *args, **kwargs)

    monkeypatch.setattr(gym.vector.AsyncVectorEnv, "step_wait", interrupted)
    with warnings.catch_warnings(record=True) as caught, pytest.raises(KeyboardInterrupt):
        warnings.simplefilter("always")
        rlspeed.evaluate(model, env, episodes=2, seed=0, max_steps=20)
    assert any("could not be put back after the evaluation stopped (KeyboardInterrupt)" in str(w.message)
               for w in caught)
    assert env.update_running_mean is True
    monkeypatch.undo()
    env.close()
    model.close()


def _cannot_say(wrapper):
    raise RuntimeError("this env cannot say")


def _unanswering_cartpole(attribute="update_running_mean"):  # (module level: a forked AsyncVectorEnv's workers run it)
    """A normalised CartPole whose `attribute` cannot be read: `update_running_mean`, which the outermost
    evaluate's `set_attr` reaches, or `obs_rms`, the first statistics evaluate reads."""
    unanswering = type("_Unanswering", (gym.Wrapper,), {attribute: property(_cannot_say)})
    return unanswering(gym.wrappers.NormalizeObservation(gym.make("CartPole-v1", max_episode_steps=30)))


def test_subprocess_envs_that_cannot_answer_the_freezing_stop_the_evaluation_with_their_own_error(monkeypatch):
    """Workers that raised as evaluate froze their normalisers (Gymnasium shuts such a worker down) made putting back
    the statistics already read fail, and that error left evaluate ("'NoneType' object has no attribute 'send'"), in
    place of the workers' own, with its progress bar left open: the workers' error goes on, with a warning of what was
    not put back, and the bar is closed."""
    closed = []
    close = ProgressBar.close
    monkeypatch.setattr(ProgressBar, "close", lambda self: closed.append(self) or close(self))
    env = gym.vector.AsyncVectorEnv([_unanswering_cartpole] * 2, context="fork",
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    try:
        env.reset(seed=0)
        with pytest.warns(UserWarning, match=r"1 of the env's normalisation settings or statistics could not be put "
                                             r"back after the evaluation stopped \(RuntimeError\)"), \
                pytest.raises(RuntimeError, match="^this env cannot say$"):
            rlspeed.evaluate(PPO("CartPole-v1", device="cpu", seed=0), env, episodes=2, seed=0, progress_bar=True)
    finally:
        env.close()
    assert len(closed) == 1


def test_subprocess_envs_that_cannot_give_their_statistics_stop_the_evaluation_with_their_own_error():
    """Workers that raised at the first read of their normalisers' statistics (nothing frozen yet) were taken for
    envs whose statistics cannot be frozen: the evaluation warned so and went on with the workers Gymnasium had shut
    down, failing with another error. The workers' own error now stops it, as where one raises later."""
    env = gym.vector.AsyncVectorEnv([functools.partial(_unanswering_cartpole, "obs_rms")] * 2, context="fork",
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    try:
        env.reset(seed=0)
        with warnings.catch_warnings(record=True) as caught, \
                pytest.raises(RuntimeError, match="^this env cannot say$"):
            warnings.simplefilter("always")
            rlspeed.evaluate(PPO("CartPole-v1", device="cpu", seed=0), env, episodes=2, seed=0)
        assert not [str(w.message) for w in caught if "cannot freeze" in str(w.message)]
    finally:
        env.close()


def test_an_evaluation_on_an_env_with_rlspeeds_reward_normalisation_leaves_its_statistics_as_they_were():
    """A training env made with make_env(..., normalize_reward=True) holds the model's own reward statistics:
    evaluating on it folded the evaluation's returns into them, changing the scale the model trains on. They are
    frozen while it runs, its returns are the env's own, and the env's `training` flags are the caller's again after
    it."""
    env = rlspeed.make_env("Pendulum-v1", num_envs=2, seed=0, normalize_reward=True)
    model = PPO(env, device="cpu", seed=0, num_steps=16, batch_size=32, n_epochs=1)
    model.learn(64, progress_bar=False)
    assert model.return_rms is env.return_rms
    before = {key: value.clone() for key, value in model.return_rms.state_dict().items()}
    result = rlspeed.evaluate(model, env, episodes=2, seed=3)
    for key, value in model.return_rms.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert env.training and env.env.training
    raw = rlspeed.evaluate(model, rlspeed.make_env("Pendulum-v1", num_envs=2, seed=3), episodes=2)
    assert result["returns"] == raw["returns"]
    # a flag the caller set on an inner wrapper stays theirs
    env._training, env.env._training = True, False
    rlspeed.evaluate(model, env, episodes=2, seed=3)
    assert env._training and not env.env._training and "_training" not in env.env.env.__dict__
    env.close()


def test_rlspeeds_reward_normalisation_over_an_envs_episode_counts_is_not_said_to_change_the_returns():
    """make_env(..., normalize_reward=True) counts the episodes under its NormalizeReward, so the returns evaluate
    reports are the env's own: it warned that they were 'the changed rewards' sums' (the wrapper shares Gymnasium's
    name)."""
    model = PPO("Pendulum-v1", device="cpu", seed=0, num_envs=2, env_backend="gymnasium")
    with rlspeed.make_env("Pendulum-v1", num_envs=2, seed=3, normalize_reward=True) as env:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            normalised = rlspeed.evaluate(model, env, episodes=2, max_steps=20)
    assert not [str(warning.message) for warning in caught if "pass through" in str(warning.message)]
    with pytest.warns(UserWarning, match="still running"):
        raw = rlspeed.evaluate(model, rlspeed.make_env("Pendulum-v1", num_envs=2, seed=3), episodes=2, max_steps=20)
    assert normalised["returns"] == raw["returns"]


def test_a_loaded_model_that_trained_on_a_normalising_vec_normalize_refuses_an_env_from_an_id(tmp_path, capsys):
    """The file holds no VecNormalize statistics: evaluating the loaded model on an env made from an id (rlspeed eval
    MODEL --env ID, which the refusal of its own unnamed env suggests) showed the policy raw observations, silently,
    where the model that trained refuses it; one whose VecNormalize normalised only rewards evaluates there."""
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    from rlspeed.cli import main

    for norm_obs in (True, False):
        model = PPO(VecNormalize(make_vec_env("Pendulum-v1", n_envs=2, seed=0), norm_obs=norm_obs), device="cpu",
                    seed=0)
        model.save(tmp_path / f"{norm_obs}.safetensors")
        loaded = PPO.load(tmp_path / f"{norm_obs}.safetensors", device="cpu")
        if norm_obs:
            with pytest.raises(rlspeed.UserError, match="trains on a Stable-Baselines3 VecNormalize that normalises"):
                rlspeed.evaluate(loaded, "Pendulum-v1", episodes=1, max_steps=5)
            assert main(["eval", str(tmp_path / "True.safetensors"), "--env", "Pendulum-v1", "--no-progress"]) == 2
            assert "VecNormalize" in capsys.readouterr().err
        else:
            with pytest.warns(UserWarning, match="still running after 5 steps"):
                assert rlspeed.evaluate(loaded, "Pendulum-v1", episodes=1, max_steps=5)["lengths"] == [5]


def test_a_vector_env_shares_the_episodes_among_its_envs_as_sb3s_evaluate_policy(ppo):
    """`evaluate(model, vec_env, episodes=N)` was refused unless N was the env's size (a ported
    `evaluate_policy(model, DummyVecEnv([...]), n_eval_episodes=5)`, EvalCallback's default of 5 on one env): its
    envs now share the episodes as SB3's evaluate_policy spreads them, each env counting its first ones, so the same
    envs give SB3's episodes."""
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv

    from rlspeed.callbacks import EvalCallback

    def made() -> DummyVecEnv:
        env = DummyVecEnv([lambda: Monitor(gym.make("CartPole-v1", max_episode_steps=60))] * 2)
        env.seed(3)
        return env

    env = made()
    result = rlspeed.evaluate(ppo, env, episodes=5)
    env.close()
    env = made()
    returns, lengths = evaluate_policy(ppo, env, n_eval_episodes=5, return_episode_rewards=True)
    env.close()
    assert result["episodes"] == 5 and result["unfinished"] == 0
    assert sorted(result["returns"]) == sorted(returns) and sorted(result["lengths"]) == sorted(lengths)
    one = DummyVecEnv([lambda: Monitor(gym.make("CartPole-v1", max_episode_steps=60))])
    assert rlspeed.evaluate(ppo, one, episodes=3)["episodes"] == 3  # (one env, episode after episode)
    # (an episode still running at max_steps counts then, as evaluate's others: its env plays it out uncounted)
    with pytest.warns(UserWarning, match="1 of 3 episodes were still running after 5 steps; they count with the "
                                         "return collected so far, and 2 did not start within"):
        cut = rlspeed.evaluate(ppo, one, episodes=3, max_steps=5)
    assert (cut["episodes"], cut["unfinished"], cut["returns"], cut["lengths"]) == (1, 1, [5.0], [5])
    two = DummyVecEnv([lambda: Monitor(gym.make("CartPole-v1", max_episode_steps=60))] * 2)
    with pytest.warns(UserWarning, match="2 of 3 episodes were still running after 5 steps.*1 did not start"):
        assert rlspeed.evaluate(ppo, two, episodes=3, max_steps=5)["lengths"] == [5, 5]  # (none longer than 5)
    two.close()
    callback = EvalCallback(one, n_eval_episodes=3, eval_freq=128, verbose=0)
    PPO(DummyVecEnv([lambda: gym.make("CartPole-v1")] * 4), seed=0, device="cpu", num_steps=32,
        batch_size=128).learn(128, callback=callback, progress_bar=False)
    assert [len(returns) for returns in callback.evaluations_results] == [3]
    one.close()


def test_evaluate_refuses_what_is_no_rlspeed_model_in_one_sentence():
    """A checkpoint's path (what `rlspeed eval` takes), None or Stable-Baselines3's model failed at its first
    attribute, an AttributeError about `env_id`."""
    for wrong, match in (("model.safetensors", r"^evaluate takes a model, not a path \('model.safetensors'\): load it "
                                               r"first"),
                         (pathlib.Path("run/model.safetensors"), "not a path"),
                         (None, r"^evaluate takes an rlspeed model \(PPO\(\.\.\.\), .*not a NoneType\.$")):
        with pytest.raises(rlspeed.UserError, match=match):
            rlspeed.evaluate(wrong, "CartPole-v1", episodes=1)


def test_evaluates_warnings_point_at_the_callers_line_through_the_models_method_too():
    """`model.evaluate(...)` (the method the docs show) warned at rlspeed's own line inside that method, so the
    warning named no line of the caller's, and Python showed it once per process: the same cell of a notebook, run
    again on the same problem, said nothing. Now it names the caller's line, as `rlspeed.evaluate(model, ...)` did."""
    model = PPO("CartPole-v1", device="cpu", seed=0, num_envs=2, num_steps=16)
    for evaluate in (model.evaluate, lambda **options: rlspeed.evaluate(model, "CartPole-v1", **options)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            evaluate(episodes=2, max_steps=5)
        said = [warning for warning in caught if "still running" in str(warning.message)]
        assert said and all(warning.filename == __file__ for warning in said), [w.filename for w in said]


def test_looking_at_a_model_between_making_and_training_it_leaves_its_run_as_it_is(tmp_path):
    """docs/algorithms.md: a seeded run repeats whatever a notebook's cells do between making the model and its
    learn: evaluating it, saving it, loading another model, a deterministic predict, and a sampled action
    (predict(deterministic=False), which draws from torch's global generator: the model's learn draws from streams
    of its own)."""
    PPO("CartPole-v1", device="cpu", seed=1, num_envs=4, num_steps=16).save(tmp_path / "other")
    observation = np.zeros(4, dtype=np.float32)

    def trained(look) -> torch.Tensor:
        model = PPO("CartPole-v1", device="cpu", seed=0, num_envs=4, num_steps=16, batch_size=32)
        look(model)
        model.learn(128, progress_bar=False)
        return torch.cat([p.detach().flatten() for p in model.policy.parameters()])

    alone = trained(lambda model: None)
    looks = (lambda model: model.evaluate(episodes=2), lambda model: model.evaluate(episodes=2, deterministic=False),
             lambda model: model.save(tmp_path / "model"), lambda model: PPO.load(tmp_path / "other.safetensors"),
             lambda model: model.predict(observation), lambda model: model.predict(observation, deterministic=False))
    for look in looks:
        assert torch.equal(trained(look), alone)


class _TenthsEnv(gym.Env):
    """A reward of 0.1 on each of 1,000 steps (a sum float32 accumulates off in the fourth digit)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self._t += 1
        return np.zeros(2, np.float32), 0.1, self._t >= 1000, False, {}


def test_episode_returns_are_summed_in_float64():
    """Evaluation's (and training's) episode returns are the rewards' sum in float64, as Gymnasium's and SB3's
    statistics sum Python floats: 1,000 rewards of 0.1 (float32 in the batched env, as its rewards are) make their
    exact sum, 100.0000015, not a float32 running sum's 99.99905."""
    gym.register("rlspeed_test/Tenths-v0", entry_point=_TenthsEnv)
    try:
        model = PPO("rlspeed_test/Tenths-v0", num_envs=2, num_steps=8, env_backend="gymnasium")
        result = rlspeed.evaluate(model, "rlspeed_test/Tenths-v0", episodes=2)
        assert result["returns"] == pytest.approx([float(np.float32(0.1)) * 1000] * 2, rel=0, abs=1e-9)
        model.close()
    finally:
        gym.registry.pop("rlspeed_test/Tenths-v0", None)


class _LargeRewardEnv(_TenthsEnv):
    """Ten rewards of 123456.7 (float32: 123456.703125), returns of 1234567.03125: float32 keeps 1234567.0."""

    def step(self, action):
        self._t += 1
        return np.zeros(2, np.float32), 123456.7, self._t >= 10, False, {}


@pytest.mark.parametrize("algo", [PPO, DQN], ids=lambda c: c.__name__)
def test_training_rows_average_episode_returns_in_float64(algo):
    """The metrics rows' episode_return (progress bar, metrics.csv, TensorBoard, a callback's `self.metrics`) is the
    mean of the finished episodes' float64 returns, as their own float64 sums are: returns of about 1e6 keep their
    fraction (float32 holds eighths there)."""
    rows = []

    class Rows(BaseCallback):
        def _on_step(self):
            if self.metrics is not None and not math.isnan(self.metrics["episode_return"]):
                rows.append(self.metrics["episode_return"])
            return True

    gym.register("rlspeed_test/LargeReward-v0", entry_point=_LargeRewardEnv)
    try:
        model = algo("rlspeed_test/LargeReward-v0", num_envs=2, device="cpu", seed=0, env_backend="gymnasium",
                     **({"num_steps": 16, "batch_size": 32} if algo is PPO else {"learning_starts": 32}))
        model.learn(128, callback=Rows(), log_interval_s=0, progress_bar=False)
        model.close()
    finally:
        gym.registry.pop("rlspeed_test/LargeReward-v0", None)
    assert rows and all(row == float(np.float32(123456.7)) * 10 == 1234567.03125 for row in rows)


def test_the_advice_for_episodes_without_end_works_in_learns_evaluations(monkeypatch):
    """learn(eval_freq=...) on an env whose episodes never end: its evaluations stop at the step limit with a warning
    whose advice learn can follow (it said "pass max_steps=", which learn and EvalCallback do not take): the time
    limit it names, given as the model's env option, ends the evaluation episodes there."""
    import re

    import rlspeed.evaluation

    env_id = endless_pendulum_id()
    monkeypatch.setattr(rlspeed.evaluation, "UNLIMITED_EPISODE_STEPS", 20)  # (10,000 steps: the same, slower)
    settings = {"device": "cpu", "seed": 0, "num_envs": 2, "num_steps": 16, "batch_size": 32}
    model = PPO(env_id, **settings)
    with pytest.warns(UserWarning, match="2 of 2 episodes were still running after 20 steps") as caught:
        model.learn(32, eval_freq=32, eval_episodes=2, progress_bar=False)
    advice = re.search(r"env_kwargs=\{'(\w+)': N\}", str(caught[0].message))
    assert advice is not None, str(caught[0].message)
    limited = PPO(env_id, env_kwargs={advice.group(1): 7}, **settings)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        limited.learn(32, eval_freq=32, eval_episodes=2, progress_bar=False)
        assert limited.evaluate(episodes=2, seed=0)["lengths"] == [7, 7]


def test_a_model_training_in_subprocess_envs_evaluates_in_them_too(monkeypatch):
    """An env slow enough for gymnasium-async (a simulator, a socket) runs its evaluation episodes side by side in
    subprocesses too; in one process, 10 episodes of a 5 ms env took 10 times as long as in them."""
    import rlspeed.evaluation as evaluation
    from rlspeed import PPO

    made = []
    make_env = evaluation.make_env

    def recording(env_id, **kwargs):
        made.append(kwargs["backend"])
        return make_env(env_id, **{**kwargs, "backend": "gymnasium"})  # (no subprocesses in the test)

    monkeypatch.setattr(evaluation, "make_env", recording)
    model = PPO("CartPole-v1", env_backend="gymnasium-async", device="cpu", seed=0, num_envs=2, num_steps=8)
    model.evaluate(episodes=2, max_steps=5)
    assert made == ["gymnasium-async"]
    assert evaluation.evaluation_backend("CartPole-v1", "gymnasium-async", 10, "cpu") == "gymnasium-async"


def test_gymnasiums_option_for_no_time_limit_evaluates_to_the_step_limit(monkeypatch):
    """env_kwargs={"max_episode_steps": -1} is how gymnasium.make leaves the time limit out: its evaluation episodes
    run to the step limit for envs without one (they ran none, a return of 0, "cut short after -1 steps"), and None
    keeps the registered limit, as gymnasium.make does."""
    import rlspeed.evaluation

    monkeypatch.setattr(rlspeed.evaluation, "UNLIMITED_EPISODE_STEPS", 30)  # (10,000 steps: the same, slower)
    settings = {"device": "cpu", "seed": 0, "num_envs": 1, "num_steps": 8, "batch_size": 8}
    model = PPO("MountainCar-v0", env_kwargs={"max_episode_steps": -1}, **settings)
    assert model.spec.max_episode_steps is None
    with pytest.warns(UserWarning, match="1 of 1 episodes were still running after 30 steps"):
        result = model.evaluate(episodes=1, seed=0)
    assert result["lengths"] == [30] and result["mean"] == -30.0
    assert rlspeed.envs.env_spec("MountainCar-v0", {"max_episode_steps": None}).max_episode_steps == 200


def test_a_target_on_an_env_without_a_time_limit_says_what_it_is_compared_with(monkeypatch):
    """A target on an env without a time limit is compared with returns of evaluation episodes cut at the step limit
    (a continuing task's never end): learn says so before training, once, and not where the env has a time limit."""
    import rlspeed.evaluation

    monkeypatch.setattr(rlspeed.evaluation, "UNLIMITED_EPISODE_STEPS", 5)  # (10,000 steps: the same, slower)
    settings = {"device": "cpu", "seed": 0, "num_envs": 1, "num_steps": 8, "batch_size": 8}
    with pytest.warns(UserWarning) as caught:
        PPO(endless_pendulum_id(), **settings).learn(8, target_return=1e9, eval_episodes=1, progress_bar=False)
    said = [str(w.message) for w in caught if "has no time limit" in str(w.message)]
    assert len(said) == 1 and "after 5 steps" in said[0] and "target_return 1e+09" in said[0], said
    limited = PPO(endless_pendulum_id(), env_kwargs={"max_episode_steps": 4}, **settings)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        limited.learn(8, target_return=1e9, eval_episodes=1, progress_bar=False)


def test_metrics_csv_says_how_many_of_each_evaluations_episodes_were_cut_short(monkeypatch, tmp_path):
    """The warning of evaluation episodes cut at the step limit shows once: metrics.csv's `eval_unfinished` says it of
    every periodic evaluation (0 where none was cut)."""
    import csv

    import rlspeed.evaluation

    monkeypatch.setattr(rlspeed.evaluation, "UNLIMITED_EPISODE_STEPS", 5)  # (10,000 steps: the same, slower)
    settings = {"device": "cpu", "seed": 0, "num_envs": 1, "num_steps": 8, "batch_size": 8}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        PPO(endless_pendulum_id(), **settings).learn(16, eval_freq=8, eval_episodes=2, progress_bar=False,
                                                    run_dir=tmp_path / "endless")
        PPO(endless_pendulum_id(), env_kwargs={"max_episode_steps": 3}, **settings).learn(
            8, eval_freq=8, eval_episodes=1, progress_bar=False, run_dir=tmp_path / "limited")
    for name, cut in (("endless", "2"), ("limited", "0")):
        with open(tmp_path / name / "metrics.csv", newline="", encoding="utf-8") as handle:
            rows = [row for row in csv.DictReader(handle) if row["eval_mean"]]
        assert rows and all(row["eval_unfinished"] == cut for row in rows), rows


def test_the_progress_bars_evaluation_says_how_many_episodes_were_cut_short(monkeypatch, capsys):
    """The progress bar's `eval` is followed by `(K/M cut)` where K of the evaluation's M episodes were still running
    at the step limit (the warning of them shows once)."""
    import rlspeed.evaluation
    from rlspeed.logging import ProgressBar

    monkeypatch.setattr(rlspeed.evaluation, "UNLIMITED_EPISODE_STEPS", 5)  # (10,000 steps: the same, slower)
    monkeypatch.setattr(ProgressBar, "LINE_INTERVAL_S", 0.0)  # (stderr is no terminal here: a line per row)
    model = PPO(endless_pendulum_id(), device="cpu", seed=0, num_envs=1, num_steps=8, batch_size=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.learn(8, eval_freq=8, eval_episodes=2)
    lines = capsys.readouterr().err.splitlines()
    assert any(line.endswith(" (2/2 cut)") and ", eval " in line for line in lines), lines


def test_learns_result_says_how_many_of_each_evaluations_episodes_were_cut_short(monkeypatch):
    """`model.result.unfinished` holds, beside each of `model.result.evaluations`, how many of its episodes were still
    running at the step limit (the warning of them shows once)."""
    import rlspeed.evaluation

    monkeypatch.setattr(rlspeed.evaluation, "UNLIMITED_EPISODE_STEPS", 5)  # (10,000 steps: the same, slower)
    model = PPO(endless_pendulum_id(), device="cpu", seed=0, num_envs=1, num_steps=8, batch_size=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.learn(16, eval_freq=8, eval_episodes=2, progress_bar=False)
    assert len(model.result.evaluations) == 2 and model.result.unfinished == [2, 2]


def _cap_of_3_recording_sizes(monkeypatch) -> list[int]:
    """Evaluations run at most 3 envs at once; returned: the sizes of the envs they make, as they make them."""
    sizes = []
    make_env = rlspeed.evaluation.make_env
    monkeypatch.setattr(rlspeed.evaluation, "make_env", lambda *args, **kwargs: sizes.append(kwargs["num_envs"])
                        or make_env(*args, **kwargs))
    monkeypatch.setattr(rlspeed.evaluation, "evaluation_env_cap", lambda backend: 3)
    return sizes


def test_more_episodes_than_envs_at_once_run_in_waves_seeded_as_one_batch(ppo, monkeypatch):
    """Subprocess envs are capped (one worker process each: 1,000 episodes forked 1,000); episodes over the cap run
    in waves, each episode seeded as in one env of them all, so a deterministic evaluation's returns are unchanged.
    The full waves share one env (each wave made its own: subprocess workers started again per wave), reset with the
    next wave's seed; the last, smaller wave gets one of its size."""
    whole = rlspeed.evaluate(ppo, episodes=7, seed=5, backend="gymnasium")
    sizes = _cap_of_3_recording_sizes(monkeypatch)
    waves = rlspeed.evaluate(ppo, episodes=7, seed=5, backend="gymnasium")
    assert sizes == [3, 1]
    assert {key: waves[key] for key in whole} == whole
    monkeypatch.undo()
    # the cap: subprocess envs by CPU cores, at least a floor (a 1,000-episode evaluation on 2 cores forks that many,
    # not 1,000); Gymnasium's in-process envs many more; none for the other backends
    cap, module = rlspeed.evaluation.evaluation_env_cap, rlspeed.evaluation
    per_cpu, least = module.SUBPROCESS_EVALUATION_ENVS_PER_CPU, module.MIN_SUBPROCESS_EVALUATION_ENVS
    assert 2 * per_cpu <= least < 64 * per_cpu and least < 1000 < cap("gymnasium")  # (the cases below tell them apart)
    for cores, expected in ((None, least), (1, least), (2, least), (64, 64 * per_cpu)):
        monkeypatch.setattr(module.os, "cpu_count", lambda cores=cores: cores)
        assert cap("gymnasium-async") == expected, cores
    assert cap("gymnasium") == module.GYMNASIUM_EVALUATION_ENVS and cap("envpool") == module.ENVPOOL_EVALUATION_ENVS
    assert cap("torch") == module.NATIVE_EVALUATION_ENVS


def test_a_stochastic_policys_waves_draw_as_evaluations_of_their_own_episodes(ppo, monkeypatch):
    """A stochastic policy in waves draws from a stream seeded by each wave's seed, as an evaluation of that wave's
    episodes alone draws (so its returns repeat for a seed, and depend on the cap: documented); the full waves sharing
    one env, reset with each wave's seed, changes none of them."""
    alone = [rlspeed.evaluate(ppo, episodes=count, seed=5 + first, backend="gymnasium", deterministic=False)["returns"]
             for first, count in ((0, 3), (3, 3), (6, 1))]
    sizes = _cap_of_3_recording_sizes(monkeypatch)
    waves = rlspeed.evaluate(ppo, episodes=7, seed=5, backend="gymnasium", deterministic=False)
    assert sizes == [3, 1] and waves["returns"] == alone[0] + alone[1] + alone[2]


def test_each_wave_of_a_stochastic_native_evaluation_draws_from_a_stream_of_its_own(ppo, monkeypatch):
    """A native env's waves are all seeded `seed` (their rows drawing as rows k .. of one env), and so was each wave's
    sampling stream: every wave repeated the first wave's samples. Each wave's stream is now seeded by the seed of
    its first episode, `seed + k`, as Gymnasium's waves' are."""
    seeds = []
    stream = rlspeed.evaluation._own_random_stream
    monkeypatch.setattr(rlspeed.evaluation, "_own_random_stream", lambda model, device, seed, num_envs:
                        seeds.append(seed) or stream(model, device, seed, num_envs))
    monkeypatch.setattr(rlspeed.evaluation, "evaluation_env_cap", lambda backend: 3)
    for backend in ("torch", "gymnasium"):
        rlspeed.evaluate(ppo, episodes=7, seed=5, backend=backend, deterministic=False)
    assert seeds == [5, 8, 11] * 2


@pytest.mark.parametrize("backend", ["torch", "envpool"])
def test_native_and_envpool_episodes_over_the_cap_run_in_waves_as_one_batch(ppo, monkeypatch, backend):
    """Native torch and EnvPool envs were uncapped (1e6 episodes made 1e6 env rows at once; an EnvPool Atari env is
    about a MiB). A native row i draws from (seed, i), not from seed + i: each wave's rows now draw as rows k .. of one
    env of all the episodes; EnvPool seeds env i with seed + i, as Gymnasium. Either way the returns are those of one
    batch, digit for digit."""
    if backend == "envpool":
        pytest.importorskip("envpool")
    whole = rlspeed.evaluate(ppo, episodes=7, seed=5, backend=backend)
    sizes = _cap_of_3_recording_sizes(monkeypatch)
    waves = rlspeed.evaluate(ppo, episodes=7, seed=5, backend=backend)
    assert sizes == [3, 1] and len(set(whole["returns"])) > 1  # (episodes that differ: rows told apart)
    assert {key: waves[key] for key in whole} == whole
    if backend == "envpool":  # (EnvPool's seeds are C++ ints: refused up front, not at the wave that passes 2**31)
        with pytest.raises(rlspeed.UserError, match="leaves room for 5 envs, not 7"):
            rlspeed.evaluate(ppo, episodes=7, seed=2**31 - 5, backend=backend)
        assert sizes == [3, 1]


def test_a_seed_near_the_limit_is_taken_or_refused_alike_in_one_batch_and_in_waves(ppo, monkeypatch):
    """Episode i is seeded seed + i: one batch took a seed whose episodes' seeds passed 2**63 (Gymnasium seeds any
    integer) while waves refused it (a wave's seed over the limit). Both now take seeds whose episodes stay below
    2**63, equal, and refuse the others up front in one sentence."""
    seed = 2**63 - 3
    whole = rlspeed.evaluate(ppo, episodes=3, seed=seed, backend="gymnasium")
    monkeypatch.setattr(rlspeed.evaluation, "evaluation_env_cap", lambda backend: 2)
    waves = rlspeed.evaluate(ppo, episodes=3, seed=seed, backend="gymnasium")
    assert {key: waves[key] for key in whole} == whole
    for cap in (2, math.inf):  # (in waves, its third wave seeded 2**63 + 1; in one batch)
        monkeypatch.setattr(rlspeed.evaluation, "evaluation_env_cap", lambda backend, cap=cap: cap)
        with pytest.raises(rlspeed.UserError, match=r"leaves room for 3 episodes, not 5\.$"):
            rlspeed.evaluate(ppo, episodes=5, seed=seed, backend="gymnasium")


def test_episodes_cut_in_waves_are_told_once_with_the_step_limit_the_waves_ran(ppo, monkeypatch):
    """The waves' one warning of their unfinished episodes names all of them and the step limit: the waves read the
    limit back from the text of each wave's warning (a second rule, gone with a change of its wording); each wave now
    hands it over as data, and only the joined warning is given."""
    said = []
    warn = rlspeed.evaluation.warn_unfinished
    monkeypatch.setattr(rlspeed.evaluation, "warn_unfinished", lambda *args, **kwargs: said.append(args[:3])
                        or warn(*args, **kwargs))
    monkeypatch.setattr(rlspeed.evaluation, "evaluation_env_cap", lambda backend: 3)
    with pytest.warns(UserWarning, match="7 of 7 episodes were still running after 2 steps"):
        assert rlspeed.evaluate(ppo, episodes=7, seed=5, backend="gymnasium", max_steps=2)["unfinished"] == 7
    assert said == [(7, 7, 2)]


def test_a_warning_of_a_wave_goes_through_the_callers_filters_as_it_comes(ppo, monkeypatch):
    """The waves recorded every warning (all shown) and gave each again after the last wave: a caller's
    simplefilter("error") stopped the evaluation only after every wave had run. A wave's warning now meets the
    caller's filters as it comes (an error stops the first wave), and Python's default shows it once."""
    waves = []
    make_env = rlspeed.evaluation.make_env

    def made(*args, **kwargs):  # (a warning a wave gives as it makes its envs: the first, and the last, smaller one)
        waves.append(kwargs["num_envs"])
        warn_at_caller("a wave's warning", UserWarning)
        return make_env(*args, **kwargs)

    monkeypatch.setattr(rlspeed.evaluation, "make_env", made)
    monkeypatch.setattr(rlspeed.evaluation, "evaluation_env_cap", lambda backend: 3)
    with warnings.catch_warnings(), pytest.raises(UserWarning, match="a wave's warning"):
        warnings.simplefilter("error")
        rlspeed.evaluate(ppo, episodes=7, seed=5, backend="gymnasium")
    assert waves == [3]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        rlspeed.evaluate(ppo, episodes=7, seed=5, backend="gymnasium")
    assert waves == [3, 3, 1] and [str(w.message) for w in caught] == ["a wave's warning"]


def test_episodes_on_another_env_id_run_in_waves_of_the_backend_auto_picks(ppo, monkeypatch):
    """evaluate(model, other_id) with backend "auto" made all its episodes' envs at once: the cap was looked up for
    "auto" (none), not for the Gymnasium envs auto then picked."""
    sizes = []
    make_env = rlspeed.evaluation.make_env
    monkeypatch.setattr(rlspeed.evaluation, "make_env", lambda *args, **kwargs: sizes.append(kwargs["num_envs"])
                        or make_env(*args, **kwargs))
    monkeypatch.setattr(rlspeed.evaluation, "evaluation_env_cap",
                        lambda backend: 3 if backend == "gymnasium" else math.inf)
    assert rlspeed.evaluate(ppo, "CartPole-v0", episodes=7, seed=5)["episodes"] == 7
    assert sizes == [3, 1]


@pytest.mark.parametrize("inside_the_command", [False, True])
def test_unfinished_episodes_advice_is_built_for_each_caller_as_before(inside_the_command):
    """The advice of `warn_unfinished` was made by cutting Python's sentence apart inside the `rlspeed` command; built
    from its parts, each caller's warning (an env made from an id, one passed in, a population's) reads as before."""
    from rlspeed.errors import command_advice

    python_limit = ("evaluate(max_steps=N) runs them longer; env_kwargs={'max_episode_steps': N}, or --env-kwargs "
                    "max_episode_steps=N on the command line, gives the env a time limit of N steps")
    cli_limit = "--env-kwargs max_episode_steps=N gives the env a time limit of N steps"
    limit = cli_limit if inside_the_command else python_limit
    expected = {(True, False): limit, (False, False): "evaluate(max_steps=N) runs them longer",
                (True, True): f"{limit}, in training too"}
    for (time_limit, in_training), advice in expected.items():
        with (command_advice("rlspeed") if inside_the_command else contextlib.nullcontext()), \
                pytest.warns(UserWarning) as caught:
            rlspeed.evaluation.warn_unfinished(3, 10, 500, time_limit=time_limit, in_training=in_training)
        assert str(caught[0].message) == ("evaluate: 3 of 10 episodes were still running after 500 steps; they count "
                                          f"with the return collected so far ({advice}).")


def test_a_target_on_an_env_without_a_time_limit_is_warned_in_the_command_lines_terms():
    """Inside the `rlspeed` command the warning named Python's `target_return` and `env_kwargs={...}` first; it now
    names the target and the command line's --env-kwargs, and Python's caller still reads Python's terms."""
    from types import SimpleNamespace

    from rlspeed.errors import command_advice

    spec = SimpleNamespace(env_id="Endless-v0", max_episode_steps=None)
    with command_advice("rlspeed"), pytest.warns(UserWarning) as caught:
        rlspeed.evaluation.warn_target_without_time_limit(spec, 90.0)
    assert str(caught[0].message) == (
        "Endless-v0 has no time limit: an evaluation episode still running after 10,000 steps counts with the return "
        "collected by then, so the target 90 is compared with such returns where episodes do not end (--env-kwargs "
        "max_episode_steps=N gives the env a time limit of N steps).")
    with pytest.warns(UserWarning, match=r"so target_return 90 is compared .* \(env_kwargs=\{'max_episode_steps'"):
        rlspeed.evaluation.warn_target_without_time_limit(spec, 90.0)


@pytest.mark.parametrize("loop", ["evaluate", "population"])
def test_gymnasium_rows_whose_first_episode_ended_are_not_stepped_and_the_episodes_are_the_same(loop, monkeypatch):
    """An evaluation keeps each env row's first episode, and on Gymnasium's in-process envs (stepped row by row in
    Python) stepped every row until the longest first episode ended: most of its env steps were thrown away where
    lengths vary (untrained CartPole). Each row's env is now stepped exactly its first episode's steps, in
    `rlspeed.evaluate` and in a population's evaluations (`first_episode_returns`), and each episode (return, length;
    a stochastic policy's samples too) is the one every row stepping plays."""
    from gymnasium.envs.classic_control.cartpole import CartPoleEnv

    from rlspeed.envs import gymnasium_env, make_env
    from rlspeed.population.base import first_episode_returns

    model = PPO("CartPole-v1", device="cpu", seed=0, num_envs=2, env_backend="gymnasium")
    steps: dict[int, int] = {}
    real_step = CartPoleEnv.step

    def counted(env, action):
        steps[id(env)] = steps.get(id(env), 0) + 1
        return real_step(env, action)

    def play(deterministic: bool) -> tuple[list[float], list[int]]:
        steps.clear()
        if loop == "evaluate":
            result = rlspeed.evaluate(model, episodes=12, seed=3, deterministic=deterministic, backend="gymnasium")
            return result["returns"], result["lengths"]
        env = make_env("CartPole-v1", num_envs=12, seed=3, backend="gymnasium", device="cpu", evaluation=True)
        with torch.no_grad(), torch.random.fork_rng():
            torch.manual_seed(5)  # (a stochastic policy's samples: drawn for every row at each step)
            returns, finished, _, lengths = first_episode_returns(
                env, env.reset()[0], functools.partial(model.act, deterministic=deterministic))
        assert getattr(env.env, "_resting", None) is None  # (its GymnasiumEnv: after the evaluation, all rows step)
        env.close()
        assert bool(finished.all())
        return returns.tolist(), lengths.tolist()

    monkeypatch.setattr(CartPoleEnv, "step", counted)
    for deterministic in (True, False):
        returns, lengths = play(deterministic)
        assert sorted(steps.values()) == sorted(lengths) and len(set(lengths)) > 3  # (each env: its first episode)
        with monkeypatch.context() as every_row:
            every_row.setattr(gymnasium_env, "resting_rows_env", lambda env: None)
            assert play(deterministic) == (returns, lengths)
            assert min(steps.values()) >= max(lengths)  # (every row stepped until the longest first episode ended)


def test_rows_rest_only_after_a_step_since_the_reset():
    """`GymnasiumEnv.rest_rows` keeps a resting row's observation as the last step returned it, and refuses before a
    step: after a reset it took the observations of the step before that reset (of other episodes) as the ones the
    rows keep. It refuses there too."""
    from rlspeed.envs import make_env
    from rlspeed.envs.gymnasium_env import resting_rows_env

    env = make_env("CartPole-v1", num_envs=2, seed=0, backend="gymnasium", device="cpu", evaluation=True)
    adapter = resting_rows_env(env)
    try:
        env.reset()
        env.step(torch.zeros(2, dtype=torch.int64))
        adapter.rest_rows(torch.tensor([True, False]))
        env.reset()
        with pytest.raises(ValueError, match="rows rest after a step"):
            adapter.rest_rows(torch.tensor([True, False]))
    finally:
        env.close()
