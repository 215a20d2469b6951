"""The EnvPool backend against the Gymnasium backend's contract: spaces, dtypes, same-step autoreset with
`final_obs` at termination and truncation, episode statistics, seeds, Atari lives, and the one-sentence errors.

What differs from Gymnasium by design: EnvPool draws from its own random streams, so the same seed gives other
initial states (and, for Atari, other no-op counts) than Gymnasium's; the tests compare the contract, not the values.
"""

from __future__ import annotations

import warnings

import gymnasium as gym
import pytest
import torch

from rlspeed.envs import envpool_env, make_env, resolve_backend
from rlspeed.errors import UserError

needs_envpool = pytest.mark.skipif(not envpool_env.envpool_installed(), reason="envpool is not installed")


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


IDS = ["CartPole-v1", "Pendulum-v1", "FrozenLake-v1",  # (a Discrete observation: int64 indices, EnvPool's int32)
       "CliffWalking-v1",  # (no time limit: EnvPool's 2**31 - 1 was reported as the env's time limit)
       pytest.param("BreakoutNoFrameskip-v4", marks=pytest.mark.skipif(not (_has("ale_py") and _has("cv2")),
                                                                        reason="ale-py or OpenCV is not installed"))]


def random_actions(env, generator):
    if env.spec.discrete:
        return torch.randint(0, env.spec.action_dim, (env.num_envs,), generator=generator)
    return torch.rand((env.num_envs, env.spec.action_dim), generator=generator) * 2 - 1


@needs_envpool
@pytest.mark.parametrize("env_id", IDS)
def test_contract_matches_the_gymnasium_backend(env_id):
    pool = make_env(env_id, num_envs=3, seed=0, backend="envpool", device="cpu")
    gym_env = make_env(env_id, num_envs=3, seed=0, backend="gymnasium", device="cpu")
    try:
        assert pool.backend == "envpool"
        assert pool.spec.observation_space == gym_env.spec.observation_space
        assert pool.spec.action_space == gym_env.spec.action_space
        assert pool.spec.max_episode_steps == gym_env.spec.max_episode_steps
        assert pool.spec.reward_threshold == gym_env.spec.reward_threshold
        obs_pool, info_pool = pool.reset()
        obs_gym, info_gym = gym_env.reset()
        assert obs_pool.shape == obs_gym.shape and obs_pool.dtype == obs_gym.dtype
        assert set(info_pool) == set(info_gym)
        generator = torch.Generator().manual_seed(0)
        actions = random_actions(pool, generator)
        out_pool, out_gym = pool.step(actions), gym_env.step(actions)
        for got, want in zip(out_pool[:4], out_gym[:4]):
            assert got.shape == want.shape and got.dtype == want.dtype and got.device == want.device
        assert set(out_pool[4]) == set(out_gym[4])
        for key, value in out_gym[4].items():
            assert out_pool[4][key].shape == value.shape and out_pool[4][key].dtype == value.dtype, key
    finally:
        pool.close()
        gym_env.close()


@needs_envpool
@pytest.mark.parametrize("backend", ["envpool", "gymnasium"])
def test_termination_resets_in_the_same_step_with_the_true_last_observation(backend):
    """CartPole pushed right falls within a few dozen steps: the finished row's final_obs is past the failure
    threshold (pole angle beyond 12 degrees or cart out), its obs a fresh start; returns and lengths are counted."""
    env = make_env("CartPole-v1", num_envs=2, seed=1, backend=backend, device="cpu")
    try:
        env.reset()
        steps, total = 0, torch.zeros(2)
        while True:
            obs, reward, terminated, truncated, info = env.step(torch.ones(2, dtype=torch.int64))
            steps, total = steps + 1, total + reward
            if bool(terminated.any()):
                break
            assert steps < 100
        row = int(terminated.nonzero()[0])
        final = info["final_obs"][row]
        assert bool(final[2].abs() > 0.2094) or bool(final[0].abs() > 2.4)
        assert bool((obs[row].abs() <= 0.05).all())  # a new episode's first observation
        assert not bool(truncated[row]) and bool(info["done"][row])
        assert float(info["episode_length"][row]) == steps and float(info["episode_return"][row]) == total[row]
        others = ~(terminated | truncated)
        assert torch.equal(info["final_obs"][others], obs[others])
        # the row goes on from its new start: the next step moves it by one step, not by another reset
        next_obs = env.step(torch.ones(2, dtype=torch.int64))[0]
        assert float((next_obs[row] - obs[row]).abs().max()) < 0.5 and bool(next_obs[row, 1] > obs[row, 1])
    finally:
        env.close()


@needs_envpool
def test_truncation_at_the_time_limit_keeps_final_obs_and_counts_the_episode():
    env = make_env("Pendulum-v1", num_envs=2, seed=0, backend="envpool", device="cpu")
    try:
        env.reset()
        generator = torch.Generator().manual_seed(0)
        previous = None
        for step in range(1, 201):
            obs, reward, terminated, truncated, info = env.step(random_actions(env, generator))
            assert not bool(terminated.any())
            if step < 200:
                assert not bool(truncated.any())
                previous = obs
        assert bool(truncated.all()) and bool(info["done"].all())
        assert info["episode_length"].tolist() == [200.0, 200.0]
        final = info["final_obs"]
        # final_obs continues the episode (cos, sin of the angle stay on the unit circle, one step from the last)
        torch.testing.assert_close(final[:, 0] ** 2 + final[:, 1] ** 2, torch.ones(2))
        assert float((final[:, :2] - previous[:, :2]).abs().max()) < 0.5
        assert not torch.equal(final, obs)
    finally:
        env.close()


@needs_envpool
def test_seeds_make_runs_repeatable_and_reset_seed_restarts_the_streams():
    def first_obs(seed, reset_seed=None):
        env = make_env("CartPole-v1", num_envs=4, seed=seed, backend="envpool", device="cpu")
        try:
            obs, _ = env.reset(seed=reset_seed)
            for _ in range(3):
                obs = env.step(torch.zeros(4, dtype=torch.int64))[0]
            return obs
        finally:
            env.close()

    assert torch.equal(first_obs(5), first_obs(5))
    assert not torch.equal(first_obs(5), first_obs(6))
    assert torch.equal(first_obs(0, reset_seed=6), first_obs(6))
    one = first_obs(5)
    assert len({tuple(row.tolist()) for row in one}) == 4  # each env its own stream
    # EnvPool's seeds are C++ ints: a model's seed from 2**31 (below 2**32) or an evaluation's stopped it on an
    # AssertionError, and env seeds past 2**31 wrapped round; now one sentence
    for seed, room in ((2**31, 0), (2**31 - 3, 3)):
        with pytest.raises(UserError, match=rf"^EnvPool seeds .* a seed of {seed} leaves room for {room} envs, not 4;"):
            first_obs(seed)
    first_obs(2**31 - 4)


@needs_envpool
def test_an_evaluation_without_a_seed_draws_one_its_envpool_envs_take(monkeypatch):
    """evaluate draws a seed where none is given; drawn below 2**31, episode i's seed + i could pass EnvPool's limit,
    and an evaluation the user gave no seed was refused by chance."""
    import secrets

    import rlspeed

    model = rlspeed.PPO("CartPole-v1", device="cpu", seed=0, num_envs=2, num_steps=8, batch_size=16,
                        env_backend="envpool")
    monkeypatch.setattr(secrets, "randbelow", lambda bound: bound - 1)  # (the largest draw)
    result = rlspeed.evaluate(model, "CartPole-v1", episodes=3, backend="envpool", max_steps=5)
    assert len(result["returns"]) == 3 and result["seed"] + 3 <= 2**31


@needs_envpool
@pytest.mark.skipif(not (_has("ale_py") and _has("cv2")), reason="ale-py or OpenCV is not installed")
def test_atari_lost_lives_end_training_episodes_and_games_are_reported_whole():
    env = make_env("BreakoutNoFrameskip-v4", num_envs=2, seed=0, backend="envpool", device="cpu")
    evaluation = make_env("BreakoutNoFrameskip-v4", num_envs=2, seed=0, backend="envpool", evaluation=True,
                          device="cpu")
    try:
        obs, info = env.reset()
        obs_eval, _ = evaluation.reset()
        assert torch.equal(obs, obs_eval) and info["lives"].tolist() == [5, 5]
        generator = torch.Generator().manual_seed(0)
        ends = games = 0
        for _ in range(400):
            actions = torch.randint(0, 4, (2,), generator=generator)
            obs, reward, terminated, truncated, info = env.step(actions)
            obs_eval, reward_eval, terminated_eval, _, info_eval = evaluation.step(actions)
            assert torch.equal(obs, obs_eval) and torch.equal(reward, torch.sign(reward_eval))
            assert bool((terminated | ~terminated_eval).all())
            ends += int(terminated.sum())
            done = info["done"]
            games += int(done.sum())
            assert torch.equal(done, info_eval["done"])
            assert torch.equal(info["episode_return"][done], info_eval["episode_return"][done])
        assert ends > games >= 1
    finally:
        env.close()
        evaluation.close()


@needs_envpool
def test_atari_evaluation_on_envpool_plays_whole_games_with_raw_scores_and_fire_under_sticky_actions():
    """The evaluation env of an Atari id on EnvPool (what `rlspeed.evaluate` and `rlspeed eval --env-backend envpool`
    build): EnvPool's own training transforms off (no episodic life, no reward clipping, no fire reset of its own),
    the id's sticky actions kept, no `AtariTraining`, and FIRE pressed for the policy as on the Gymnasium backend
    (two steps where actions are sticky: ALE/Breakout-v5's 0.25)."""
    from rlspeed.envs import atari
    from rlspeed.envs.base import EnvWrapper

    env = atari.for_evaluation(make_env("ALE/Breakout-v5", num_envs=1, seed=0, backend="envpool", evaluation=True,
                                        device="cpu"))
    try:
        assert isinstance(env, atari.FireToStart) and env.steps == atari.STICKY_FIRE_STEPS
        layers, inner = [], env
        while isinstance(inner, EnvWrapper):
            layers.append(type(inner))
            inner = inner.env
        assert atari.AtariTraining not in layers and isinstance(inner, envpool_env.EnvPoolEnv)
        config = inner.pool.spec.config
        assert (config.episodic_life, config.reward_clip, config.use_fire_reset) == (False, False, False)
        assert config.repeat_action_probability == pytest.approx(0.25)
        assert (config.frame_skip, config.noop_max, config.stack_num) == (atari.FRAME_SKIP, atari.NOOP_MAX,
                                                                          atari.FRAME_STACK)
    finally:
        env.close()


@needs_envpool
def test_auto_takes_envpool_for_atari_only():
    assert resolve_backend("CartPole-v1", "auto", 8, "cpu") == "gymnasium"
    assert resolve_backend("CartPole-v1", "auto", 64, "cpu") == "torch"
    if _has("ale_py"):
        assert resolve_backend("BreakoutNoFrameskip-v4", "auto", 8, "cpu") == "envpool"
        # (ale-py's TicTacToe3D is EnvPool's TicTacToe3d: it was "EnvPool has no env" and Gymnasium's for auto)
        assert resolve_backend("ALE/TicTacToe3D-v5", "auto", 8, "cpu") == "envpool"
        assert envpool_env.envpool_task("ALE/TicTacToe3D-v5") == "TicTacToe3d-v5"
    if _has("mujoco"):
        assert resolve_backend("HalfCheetah-v5", "auto", 1, "cpu") == "gymnasium"


@needs_envpool
def test_envpool_backend_for_an_id_it_lacks_is_one_sentence():
    with pytest.raises(UserError, match="EnvPool has no env for 'rlspeed/CartPole-v1'"):
        resolve_backend("rlspeed/CartPole-v1", "envpool")
    with pytest.raises(UserError, match="takes env options only for MuJoCo ids, not for 'CartPole-v1'"):
        make_env("CartPole-v1", backend="envpool", sutton_barto_reward=True)


def test_envpool_backend_without_envpool_names_the_pip_command(monkeypatch):
    monkeypatch.setattr(envpool_env, "envpool_installed", lambda: False)
    import rlspeed.envs as envs

    monkeypatch.setattr(envs, "envpool_installed", lambda: False)
    with pytest.raises(UserError, match=r'pip install "rlspeed\[envpool\]"'):
        resolve_backend("CartPole-v1", "envpool")
    with pytest.raises(UserError, match=r'pip install "rlspeed\[envpool\]"'):
        make_env("CartPole-v1", backend="envpool")
    assert resolve_backend("CartPole-v1", "auto", 8, "cpu") == "gymnasium"
    # an Atari id with neither EnvPool nor ale-py: EnvPool named first, with what the id needs besides
    from rlspeed.envs import atari

    monkeypatch.setattr(atari, "register_atari", lambda: False)
    with pytest.raises(UserError, match="needs EnvPool: pip install \"rlspeed\\[envpool\\]\"; 'BreakoutNoFrameskip-v4' "
                                        "also needs ale-py and OpenCV: pip install \"rlspeed\\[atari\\]\""):
        resolve_backend("BreakoutNoFrameskip-v4", "envpool")


@needs_envpool
def test_reset_with_the_same_seed_gives_the_same_episodes():
    """Gymnasium's contract: reset(seed=s) twice starts the same episodes, even when s is the pool's seed."""
    env = make_env("CartPole-v1", num_envs=3, device="cpu", seed=0, backend="envpool")
    first = env.reset(seed=3)[0]
    for _ in range(5):
        env.step(torch.zeros(3, dtype=torch.int64))
    assert torch.equal(env.reset(seed=3)[0], first)
    env.close()


@needs_envpool
def test_an_envpool_env_with_dict_observations_is_refused_in_one_sentence():
    """EnvPool's MiniGrid ids give a dict of arrays (its mission as bytes): the first reset failed with "Could not
    infer dtype of dict" (exit 1)."""
    with pytest.raises(UserError, match=r"EnvPool's 'MiniGrid-Empty-5x5-v0' gives Dict observations.*"
                                        r"--env-backend gymnasium"):
        make_env("MiniGrid-Empty-5x5-v0", num_envs=2, backend="envpool", device="cpu")


@needs_envpool
def test_an_envpool_env_whose_task_differs_from_gymnasiums_is_refused_when_the_backend_is_chosen():
    """EnvPool's Blackjack-v1 gives a Box(0, 31, (3,), int32) where Gymnasium's gives a Tuple, and plays sab=True where
    Gymnasium's plays sab=False: `make_env(..., backend="envpool")` gave it without a word, and a model was refused
    only once it had made the pool. `auto` keeps Gymnasium's."""
    with pytest.raises(UserError, match=r"EnvPool's Blackjack-v1 gives its observations as Box.*Tuple.*sab=True.*"
                                        r"--env-backend gymnasium\.$"):
        resolve_backend("Blackjack-v1", "envpool")
    with pytest.raises(UserError, match="sab=True"):
        envpool_env.EnvPoolEnv("Blackjack-v1", num_envs=2)
    assert resolve_backend("Blackjack-v1", "auto", 2, "cpu") == "gymnasium"


@needs_envpool
def test_an_envpool_env_whose_values_differ_from_gymnasiums_is_warned_of_once(monkeypatch):
    """EnvPool's Humanoid-v4 gives its contact forces as 0 (Gymnasium's gives the simulated ones), with Gymnasium's
    spaces: `--env-backend envpool` trained on it without a word. Said once per id in a process, for training and
    evaluation alike (it said a model 'learns there' when `rlspeed eval --env-backend envpool` made it)."""
    monkeypatch.setattr(envpool_env, "_WARNED_VALUES", set())
    with pytest.warns(UserWarning, match=r"EnvPool's Humanoid-v4 gives its 84 contact forces \(cfrc_ext\) as 0.*"
                                         r"Humanoid-v5 is the same on both: a model trained there learns from, and one "
                                         r"evaluated there is scored on, other values than --env-backend gymnasium"):
        envpool_env.EnvPoolEnv("Humanoid-v4", num_envs=1).close()
    # (the reward term it lacks, as Gymnasium's HumanoidStandup-v4 computes it: it named "up to 1.3 a step", one run's
    # largest, where Gymnasium caps the term at 10)
    with pytest.warns(UserWarning, match=r"EnvPool's HumanoidStandup-v4 .* lack Gymnasium's impact cost \(0\.5e-6 "
                                         r"times the squared contact forces' sum, at most 10 a step\)"):
        envpool_env.EnvPoolEnv("HumanoidStandup-v4", num_envs=1).close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        envpool_env.EnvPoolEnv("Humanoid-v4", num_envs=1).close()
        envpool_env.EnvPoolEnv("Humanoid-v5", num_envs=1).close()


@needs_envpool
def test_envpool_observations_lie_in_the_space_it_reports():
    """EnvPool bounds LunarLander's (and BipedalWalker's) observations below by float32's smallest positive number:
    the space rlspeed reported held none of the observations the env gave."""
    env = envpool_env.EnvPoolEnv("LunarLander-v3", num_envs=2, seed=0)
    space = env.spec.observation_space
    observations = [env.reset()[0]] + [env.step(torch.tensor([0, 2]))[0] for _ in range(3)]
    env.close()
    assert all(space.contains(row.numpy()) for obs in observations for row in obs)
    assert any(bool((obs < 0).any()) for obs in observations)


@needs_envpool
def test_an_envpool_id_gymnasium_has_in_another_version_is_refused_naming_envpools():
    """Gymnasium 1.3 renamed Taxi-v3 Taxi-v4 (the same task by default, with action masks), and EnvPool has Taxi-v3:
    the refusal named neither."""
    with pytest.raises(UserError, match=r"EnvPool has no env for 'Taxi-v4' .*it has Taxi-v3, another version of it, "
                                        r"the same task by default but without the action masks"):
        resolve_backend("Taxi-v4", "envpool")


@needs_envpool
def test_an_envpool_env_whose_observations_differ_from_gymnasiums_is_refused_in_one_sentence(monkeypatch):
    """A model made from Gymnasium's env refuses an EnvPool env whose observations have another type or shape (as
    Blackjack-v1's did before `OTHER_TASKS` refused it up front): `--env-backend envpool` failed deep in the encoder
    (TypeError: new(): invalid data type 'str')."""
    from rlspeed import PPO

    monkeypatch.setattr(envpool_env, "OTHER_TASKS", {})
    model = PPO("Blackjack-v1", env_backend="envpool", num_envs=2, num_steps=16, batch_size=32, device="cpu")
    with pytest.raises(UserError, match=r"envpool backend's Blackjack-v1 gives its observations as Box.*"
                                        r"--env-backend gymnasium"):
        model.learn(32, progress_bar=False)


def test_an_envpool_that_cannot_write_as_it_loads_is_one_sentence(tmp_path, monkeypatch):
    """envpool makes matplotlib's config directory under /tmp as it is imported, whatever TMPDIR says: in a container
    of a read-only /tmp, --env-backend envpool was an OSError traceback, and doctor advised installing envpool."""
    import sys

    from rlspeed.diagnostics import doctor

    fake = tmp_path / "envpool"
    fake.mkdir()
    (fake / "__init__.py").write_text("import errno\nraise OSError(errno.EROFS, 'Read-only file system', "
                                      "'/tmp/envpool-jumanji-matplotlib')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [name for name in sys.modules if name == "envpool" or name.startswith("envpool.")]:
        monkeypatch.delitem(sys.modules, name)
    expected = ("envpool cannot be imported: it writes '/tmp/envpool-jumanji-matplotlib' as it loads (Read-only file "
                "system): set MPLCONFIGDIR (matplotlib's config directory, which envpool makes there otherwise) to a "
                "directory you can write to.")
    with pytest.raises(UserError) as refused:
        make_env("CartPole-v1", num_envs=2, backend="envpool")
    assert str(refused.value) == expected
    check = {check.name: check for check in doctor.check_env_families()}["env envpool"]
    assert "/tmp/envpool-jumanji-matplotlib" in check.detail and "MPLCONFIGDIR" in check.advice
    assert "pip install" not in check.advice


@needs_envpool
def test_an_id_only_envpool_has_names_every_version_gymnasium_registers(monkeypatch):
    """The sentence refusing EnvPool's id named only the first three of Gymnasium's versions of it (sorted), without
    saying others were left out: it names each, in the order of their numbers (Taxi-v10 came before Taxi-v4)."""
    for version in (5, 6, 7, 10):
        monkeypatch.setitem(gym.registry, f"Taxi-v{version}",
                            gym.envs.registration.EnvSpec(f"Taxi-v{version}", entry_point="no_such_module:Taxi"))
    refusal = envpool_env.envpool_only("Taxi-v3")
    assert ("Gymnasium has Taxi-v4, Taxi-v5, Taxi-v6, Taxi-v7, Taxi-v10 (--env-backend gymnasium: EnvPool has no env "
            "for them)") in refusal, refusal


@needs_envpool
def test_envpools_port_of_a_gymnasium_robotics_id_names_the_module_that_registers_it(monkeypatch):
    """`rlspeed train sac FetchReach-v4` said only that Gymnasium registers no version of EnvPool's id:
    Gymnasium-Robotics registers it, as `gymnasium_robotics:FetchReach-v4` imports it."""
    if "FetchReach-v4" not in envpool_env._all_envpool_ids():
        pytest.skip("this EnvPool has no FetchReach-v4")
    # (as before Gymnasium-Robotics is imported, whether or not a test before this one imported it)
    for registered in [other for other in gym.registry if other.rsplit("-v", 1)[0] == "FetchReach"]:
        monkeypatch.delitem(gym.registry, registered)
    refusal = envpool_env.envpool_only("FetchReach-v4")
    assert "Gymnasium-Robotics registers FetchReach-v4 (pip install gymnasium-robotics; name its module before the " \
           "id: gymnasium_robotics:FetchReach-v4)" in refusal, refusal
    assert "Gymnasium-Robotics" not in envpool_env.envpool_only("Taxi-v3")


@needs_envpool
def test_an_id_only_envpool_has_is_refused_naming_gymnasiums_versions_and_how_to_train_on_it():
    """`rlspeed train ppo Taxi-v3 --env-backend envpool` (EnvPool's id, which make_env takes) said 'Unknown env id',
    suggesting Taxi-v4 without saying that EnvPool has Taxi-v3 or which backend runs Taxi-v4; a model trained on an
    env make_env('Taxi-v3', backend='envpool') made was told to import the module that registers it to evaluate. (The
    CLI's train and eval reach these sentences through the same `gym_spec` and `evaluate`.)"""
    import rlspeed
    from rlspeed import PPO
    from rlspeed.errors import command_advice

    envpools = r"^'Taxi-v3' is EnvPool's id, which Gymnasium does not register, and rlspeed's models take Gymnasium ids"
    with pytest.raises(UserError, match=rf"{envpools}.*: Gymnasium has Taxi-v4 \(--env-backend gymnasium: EnvPool has "
                                        r"no env for it\); in Python .*make_env\('Taxi-v3', backend='envpool'\)"):
        PPO("Taxi-v3", env_backend="envpool")
    with pytest.raises(UserError, match=r"Gymnasium has LunarLander-v3 \(EnvPool runs it too: --env-backend envpool\)"):
        PPO("LunarLander-v2", env_backend="envpool")
    # (EnvPool spells ale-py's TicTacToe3D TicTacToe3d, and runs ALE/TicTacToe3D-v5: it said Gymnasium had none)
    with pytest.raises(UserError, match=r"Gymnasium has ALE/TicTacToe3D-v5 \(EnvPool runs it too"):
        PPO("TicTacToe3d-v5", env_backend="envpool")
    model = PPO(make_env("Taxi-v3", num_envs=2, backend="envpool", seed=0), num_steps=8, batch_size=16)
    with pytest.raises(UserError, match=r"^This model trained on EnvPool's 'Taxi-v3', .*rlspeed.evaluate\(model, "
                                        r"make_env\('Taxi-v3', num_envs=N, backend='envpool', seed=S\), episodes=N\)"):
        rlspeed.evaluate(model, episodes=2)
    # (`rlspeed eval` of such a model gave its user the Python form, which a command line cannot follow)
    with command_advice("rlspeed eval"), pytest.raises(UserError) as refused:
        rlspeed.evaluate(model, episodes=2)
    # (it named no id: Gymnasium's versions of EnvPool's, as training's refusal names them)
    assert str(refused.value).endswith("evaluate it on the Gymnasium id of an env with the same spaces: rlspeed eval "
                                       "MODEL --env ID (Gymnasium has Taxi-v4 (--env-backend gymnasium: EnvPool has "
                                       "no env for it))."), refused.value


@needs_envpool
def test_an_envpool_env_whose_close_raises_is_named_and_kept_as_a_gymnasium_envs():
    """EnvPool's pool whose close() raised came out raw from rlspeed's env, never kept for the end of the work (the
    CLI's command, learn, evaluate): an EnvStepError naming the env and close() now, kept as a Gymnasium env's is."""
    import types

    from rlspeed.errors import CloseErrors

    env = envpool_env.EnvPoolEnv("CartPole-v1", num_envs=1)
    pool = env.pool

    def failing_close() -> None:
        pool.close()
        raise RuntimeError("the pool's threads did not stop")

    env.pool = types.SimpleNamespace(close=failing_close)
    with CloseErrors() as closing:
        env.close()
    assert [str(error) for error in closing.errors] == [
        "The env 'CartPole-v1' (envpool backend) raised RuntimeError in close(): the pool's threads did not stop"]


needs_mujoco = pytest.mark.skipif(not (envpool_env.envpool_installed() and _has("mujoco")),
                                  reason="envpool or mujoco is not installed")

INF = float("inf")


def _fixed_action_rollout(env_id: str, backend: str, options: dict, steps: int, seed: int = 0):
    """Rewards and terminations of `steps` steps of one env (no initial noise in `options`: the same start on both
    backends) under a fixed action, after `reset(seed=seed)` (on EnvPool: a pool made afresh)."""
    env = make_env(env_id, backend=backend, env_kwargs=options, seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # (Gymnasium's v4 ids: out of date)
        env.reset(seed=seed)
        action = torch.full((1, env.spec.action_dim), 0.5)
        rewards, terminations = [], []
        for _ in range(steps):
            _, reward, terminated, _, _ = env.step(action)
            rewards.append(float(reward[0]))
            terminations.append(bool(terminated[0]))
    spec = env.spec
    env.close()
    return torch.tensor(rewards, dtype=torch.float64), terminations, spec


@needs_mujoco
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize(("env_id", "options"), [
    ("Hopper-v4", {"ctrl_cost_weight": 0.5, "forward_reward_weight": 0.0, "healthy_reward": 0.0}),
    ("Hopper-v4", {"terminate_when_unhealthy": False}),
    ("Hopper-v4", {"healthy_z_range": (1.0, INF), "healthy_angle_range": (-0.1, 0.1),
                   "healthy_state_range": (-50, 50)}),
    ("Walker2d-v4", {"healthy_z_range": (0.9, 1.9), "healthy_angle_range": (-0.5, 0.5)}),
    ("HalfCheetah-v4", {"exclude_current_positions_from_observation": False, "forward_reward_weight": 2.0}),
    ("Hopper-v5", {"ctrl_cost_weight": 0.5, "healthy_reward": 2.0})])
def test_mujoco_options_give_gymnasiums_rewards_and_terminations_on_envpool(env_id, options):
    """`--env-backend envpool --env-kwargs ...` on a MuJoCo id was refused; EnvPool's env of the id now takes the
    options it has under Gymnasium's names (its `*_min` / `*_max` for a range), in the pool `reset(seed)` makes too:
    from the same start, a fixed action gives Gymnasium's rewards and terminations, and the options are recorded."""
    options = {"reset_noise_scale": 0.0, **options}
    expected, expected_ends, gym_spec = _fixed_action_rollout(env_id, "gymnasium", options, 100)
    rewards, ends, spec = _fixed_action_rollout(env_id, "envpool", options, 100)
    torch.testing.assert_close(rewards, expected, rtol=0, atol=1e-5)
    assert ends == expected_ends
    assert spec.env_kwargs == options and spec.observation_space.shape == gym_spec.observation_space.shape


@needs_mujoco
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_envpool_refuses_mujoco_options_it_does_not_take_alike_naming_the_gymnasium_backend():
    """Options EnvPool's env lacks, or has with another meaning, and ranges its keys cannot give exactly are one
    sentence naming the backend that takes them, not an env silently made without them."""
    with pytest.raises(UserError, match=r"Hopper-v5 does not take the env option frame_skip .*--env-backend gymnasium"):
        make_env("Hopper-v5", backend="envpool", env_kwargs={"frame_skip": 2})
    with pytest.raises(UserError, match=r"bounds healthy_z only below .*healthy_z_range=\(0.7, 2.0\).*gymnasium"):
        make_env("Hopper-v4", backend="envpool", env_kwargs={"healthy_z_range": (0.7, 2.0)})
    with pytest.raises(UserError, match="Gymnasium's HalfCheetah-v4 takes no env option healthy_reward"):
        make_env("HalfCheetah-v4", backend="envpool", env_kwargs={"healthy_reward": 1.0})


@needs_mujoco
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_model_on_envpool_records_its_mujoco_options_and_evaluates_with_them(tmp_path):
    """A model trained on EnvPool with env options keeps them in its spec and checkpoint, and its evaluation on
    EnvPool makes the env with them (no termination where the unhealthy hopper ends one), as on Gymnasium."""
    import rlspeed

    options = {"terminate_when_unhealthy": False}
    with pytest.raises(UserError, match="does not take the env option frame_skip"):  # (up front, at construction)
        rlspeed.SAC("Hopper-v5", device="cpu", env_backend="envpool", env_kwargs={"frame_skip": 2})
    model = rlspeed.SAC("Hopper-v5", device="cpu", env_backend="envpool", env_kwargs=options)
    assert model.env_backend == "envpool" and model.spec.env_kwargs == options
    path = model.save(tmp_path / "model")
    loaded = rlspeed.SAC.load(path, device="cpu")
    assert loaded.env_backend == "envpool" and loaded.spec.env_kwargs == options
    # (the untrained policy falls within 300 steps: terminated where unhealthy ends an episode)
    with pytest.warns(UserWarning, match="1 of 1 episodes were still running after 300 steps"):
        assert rlspeed.evaluate(loaded, episodes=1, seed=3, backend="envpool", max_steps=300)["unfinished"] == 1


@needs_mujoco
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_population_on_envpool_makes_its_members_envs_with_its_mujoco_options(monkeypatch):
    """A population on EnvPool passes its env options to every member's pool, as a solo model does, and refuses
    one EnvPool does not take up front: they were dropped without a word (members trained on the default env)."""
    from rlspeed import SAC
    from rlspeed.population import Population

    with pytest.raises(UserError, match="does not take the env option frame_skip"):
        Population(SAC, "Hopper-v5", seeds=[0, 1], device="cpu", env_backend="envpool", env_kwargs={"frame_skip": 2})
    made = []

    class Recorded(envpool_env.EnvPoolEnv):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(envpool_env, "EnvPoolEnv", Recorded)
    population = Population(SAC, "Hopper-v5", seeds=[0, 1], device="cpu", env_backend="envpool",
                            env_kwargs={"terminate_when_unhealthy": False})
    population._make_env(1, [0, 1]).close()
    assert len(made) == 2 and all(pool._options["terminate_when_unhealthy"] is False for pool in made)
