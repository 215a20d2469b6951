"""Atari through ale-py: the standard preprocessing frame for frame, the training-only transforms (episodic life,
reward clipping) against the evaluation variant, and the one-sentence errors. Skipped without ale-py or OpenCV."""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np
import pytest
import torch

pytest.importorskip("ale_py")
pytest.importorskip("cv2")

from rlspeed.envs import atari, env_spec, make_env, resolve_backend  # noqa: E402
from rlspeed.errors import UserError  # noqa: E402

atari.register_atari()


def reference_env(env_id: str) -> gym.Env:
    """The preprocessing spelt out with Gymnasium's own wrappers, as a user would write it."""
    kwargs = {"frameskip": 1} if gym.spec(env_id).kwargs.get("frameskip", 1) != 1 else {}
    env = gym.make(env_id, **kwargs)
    env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84, terminal_on_life_loss=False,
                                          grayscale_obs=True, scale_obs=False)
    return gym.wrappers.FrameStackObservation(env, 4)


@pytest.mark.parametrize("env_id", ["BreakoutNoFrameskip-v4", "ALE/Breakout-v5"])
def test_observations_match_gymnasiums_wrappers_frame_for_frame(env_id):
    num_envs, seed, steps = 2, 7, 250
    env = make_env(env_id, num_envs=num_envs, seed=seed, backend="gymnasium", evaluation=True, device="cpu")
    references = [reference_env(env_id) for _ in range(num_envs)]
    obs, info = env.reset()
    assert obs.dtype == torch.uint8 and obs.shape == (num_envs, 4, 84, 84)
    assert info["lives"].tolist() == [5, 5]
    for i, reference in enumerate(references):
        expected, _ = reference.reset(seed=seed + i)
        assert np.array_equal(obs[i].numpy(), expected), f"env {i} differs at reset"
    generator = torch.Generator().manual_seed(0)
    finished = 0
    for step in range(steps):
        actions = torch.randint(0, 4, (num_envs,), generator=generator)
        obs, reward, terminated, truncated, info = env.step(actions)
        for i, reference in enumerate(references):
            expected, expected_reward, done, cut, _ = reference.step(int(actions[i]))
            assert np.array_equal(info["final_obs"][i].numpy(), expected), f"env {i} differs at step {step}"
            assert float(reward[i]) == expected_reward and bool(terminated[i]) == done and bool(truncated[i]) == cut
            if done or cut:
                finished += 1
                expected, _ = reference.reset()
            assert np.array_equal(obs[i].numpy(), expected), f"env {i} differs after step {step}"
    assert finished >= 1, "no game ended: the reset path was not compared"
    env.close()


def test_v5_ids_skip_frames_in_the_wrapper_and_keep_sticky_actions():
    env = atari.make_atari_env("ALE/Breakout-v5")
    try:
        assert env.unwrapped._frameskip == 1
        assert env.unwrapped.ale.getFloat("repeat_action_probability") == pytest.approx(0.25)
    finally:
        env.close()
    spec = env_spec("ALE/Breakout-v5")
    assert spec.observation_shape == (4, 84, 84) and spec.observation_space.dtype == np.uint8
    assert spec.action_space == gym.spaces.Discrete(4) and spec.max_episode_steps == 108_000 // 4
    # the id's own frameskip given as an option: one sentence (it was Gymnasium's ValueError from the wrapper)
    with pytest.raises(UserError, match="skips 4 frames itself .* leave frameskip out"):
        atari.make_atari_env("ALE/Breakout-v5", frameskip=4)


def test_an_atari_id_registered_with_its_own_preprocessing_is_one_sentence():
    """An ALE id registered as Gymnasium's docs teach, with AtariPreprocessing in its additional_wrappers: rlspeed's
    own AtariPreprocessing went on top of the 84x84 frames, and the first reset raised ALE's "Invalid shape (84, 84),
    expecting shape (210, 160)" as a failure of the env."""
    preprocessing = gym.wrappers.AtariPreprocessing.wrapper_spec(noop_max=30, frame_skip=4, screen_size=84,
                                                                 terminal_on_life_loss=False, grayscale_obs=True,
                                                                 grayscale_newaxis=False, scale_obs=False)
    gym.register("PreprocessedBreakout-v0", entry_point="ale_py.env:AtariEnv",
                 kwargs={"game": "breakout", "frameskip": 1}, additional_wrappers=(preprocessing,))
    try:
        with pytest.raises(UserError, match="PreprocessedBreakout-v0 is registered with wrappers that change ALE's "
                                            r"frames \(AtariPreprocessing\).*register the id without them"):
            make_env("PreprocessedBreakout-v0", num_envs=1, backend="gymnasium", device="cpu")
    finally:
        del gym.registry["PreprocessedBreakout-v0"]


def test_an_atari_id_registered_with_normalize_reward_says_the_returns_are_not_the_games(monkeypatch):
    """An ALE id registered with Gymnasium's NormalizeReward in its additional_wrappers: every return reported sums
    normalised rewards, which other ids' envs warn of and an ALE id's did not (its envs were taken as a vector env
    passed in, whose reward wrappers the model warns of; an id's the model does not see)."""
    import rlspeed.envs.gymnasium_env as gymnasium_env

    monkeypatch.setattr(gymnasium_env, "_WARNED_STATISTICS", gymnasium_env._WarnedOnce())
    gym.register("NormalisedBreakout-v0", entry_point="ale_py.env:AtariEnv",
                 kwargs={"game": "breakout", "frameskip": 1},
                 additional_wrappers=(gym.wrappers.NormalizeReward.wrapper_spec(),))
    try:
        with pytest.warns(UserWarning, match="NormalisedBreakout-v0's rewards pass through Gymnasium's "
                                             "NormalizeReward, so every episode return reported"):
            make_env("NormalisedBreakout-v0", num_envs=1, backend="gymnasium", device="cpu").close()
    finally:
        del gym.registry["NormalisedBreakout-v0"]


def test_an_atari_id_registered_with_a_time_limit_counts_agent_steps():
    """`gymnasium.register(..., max_episode_steps=40)` for an ALE game: gym.make's TimeLimit wrapped the emulator,
    which rlspeed makes with frameskip=1, so a game ended after 40 frames (10 agent steps, the reset's no-ops among
    them) while the spec, and so evaluation, said 27,000 agent steps. Now it counts agent steps, as the option does."""
    gym.register("LimitedBreakout-v0", entry_point="ale_py.env:AtariEnv", kwargs={"game": "breakout", "frameskip": 4},
                 max_episode_steps=40)
    try:
        env = make_env("LimitedBreakout-v0", num_envs=1, seed=0, backend="gymnasium", evaluation=True, device="cpu")
        assert env.spec.max_episode_steps == 40
        env.reset()
        steps = 0
        while steps < 41:  # NOOP: Breakout waits for FIRE, so only the time limit ends the game
            _, _, terminated, truncated, info = env.step(torch.tensor([0]))
            steps += 1
            if info["done"].any():
                break
        assert (steps, bool(terminated), bool(truncated)) == (40, False, True)
        env.close()
    finally:
        del gym.registry["LimitedBreakout-v0"]


@pytest.mark.parametrize("env_id", ["BreakoutNoFrameskip-v4", "ALE/Breakout-v5"])
def test_a_max_episode_steps_option_counts_agent_steps(env_id):
    """`max_episode_steps=N` ends a game after N agent steps, as the spec (and so evaluation) says; gym.make's time
    limit sat on the emulator, which steps single frames under the preprocessing: games ended after about N / 4."""
    env = make_env(env_id, num_envs=1, seed=0, backend="gymnasium", evaluation=True, device="cpu",
                   max_episode_steps=40)
    assert env.spec.max_episode_steps == 40
    env.reset()
    for step in range(1, 41):
        _, _, terminated, truncated, info = env.step(torch.tensor([0]))  # NOOP: Breakout waits, no life is lost
        assert bool(truncated[0]) == (step == 40) and not bool(terminated[0]), step
    assert int(info["episode_length"][0]) == 40
    env.close()
    # ALE's own limit in frames, as an option: its agent steps (a quarter) are the spec's
    assert env_spec(env_id, {"max_num_frames_per_episode": 4000}).max_episode_steps == 1000


def test_max_episode_steps_minus_one_leaves_the_games_own_limit():
    """`max_episode_steps=-1`, Gymnasium's value for no time limit (which other envs take: a continuing run), was
    refused by Gymnasium's TimeLimit ("Expect the `max_episode_steps` to be positive"): a game then has no limit of
    rlspeed's, and ends at ALE's own truncation (`max_num_frames_per_episode`, 108,000 frames by default), which its
    spec (and so evaluation) says in agent steps. Another value below 1 is one sentence."""
    from rlspeed import PPO

    env = make_env("ALE/Breakout-v5", num_envs=1, seed=0, backend="gymnasium", evaluation=True, device="cpu",
                   max_episode_steps=-1, max_num_frames_per_episode=80)
    assert env.spec.max_episode_steps == 20
    env.reset()
    for _ in range(20):  # NOOP: Breakout waits (the reset's no-ops count among ALE's frames: it ends by step 20)
        _, _, terminated, truncated, _ = env.step(torch.tensor([0]))
        if bool(truncated[0]):
            break
    assert bool(truncated[0]) and not bool(terminated[0])
    env.close()
    model = PPO("ALE/Breakout-v5", env_kwargs={"max_episode_steps": -1}, num_envs=1, num_steps=8, batch_size=8,
                device="cpu")
    assert model.spec.max_episode_steps == 108_000 // 4
    with pytest.raises(UserError, match="max_episode_steps is the agent steps per game, a whole number above 0 "):
        make_env("ALE/Breakout-v5", num_envs=1, seed=0, backend="gymnasium", device="cpu", max_episode_steps=0)


def test_training_variant_ends_episodes_at_lost_lives_and_clips_rewards_but_reports_whole_games():
    """Same seed and actions: the training env sees the evaluation env's frames, rewards clipped to their sign,
    `terminated` also where a life was lost, and the same whole-game raw episode returns."""
    env_id, num_envs, seed = "SpaceInvadersNoFrameskip-v4", 2, 3
    train = make_env(env_id, num_envs=num_envs, seed=seed, backend="gymnasium", device="cpu")
    evaluation = make_env(env_id, num_envs=num_envs, seed=seed, backend="gymnasium", evaluation=True, device="cpu")
    obs_train, _ = train.reset()
    obs_eval, info = evaluation.reset()
    assert torch.equal(obs_train, obs_eval)
    lives = info["lives"]
    generator = torch.Generator().manual_seed(1)
    lost_lives = games = big_rewards = 0
    for _ in range(1500):
        actions = torch.randint(0, train.spec.action_dim, (num_envs,), generator=generator)
        obs_train, reward_train, term_train, trunc_train, info_train = train.step(actions)
        obs_eval, reward_eval, term_eval, trunc_eval, info_eval = evaluation.step(actions)
        assert torch.equal(obs_train, obs_eval) and torch.equal(info_train["final_obs"], info_eval["final_obs"])
        assert torch.equal(reward_train, torch.sign(reward_eval))
        big_rewards += int((reward_eval.abs() > 1).sum())
        lost = (info_eval["lives"] < lives) & ~(term_eval | trunc_eval)
        lost_lives += int(lost.sum())
        assert torch.equal(term_train, term_eval | lost) and torch.equal(trunc_train, trunc_eval)
        assert torch.equal(info_train["done"], info_eval["done"])  # whole games
        done = info_eval["done"]
        games += int(done.sum())
        assert torch.equal(info_train["episode_return"][done], info_eval["episode_return"][done])
        lives = info_eval["lives"]
        if lost_lives >= 2 and games >= 1 and big_rewards >= 1:  # each rule was exercised (by step 372 of 1500)
            break
    assert lost_lives >= 2 and games >= 1 and big_rewards >= 1  # each rule was exercised
    train.close()
    evaluation.close()


def test_without_episodic_life_and_clipping_training_envs_keep_whole_games_and_raw_rewards(tmp_path):
    """`episodic_life=False, clip_rewards=False` (RL-Zoo's `terminal_on_life_loss: False`, `clip_reward: False`):
    in the training env a lost life ends no episode and rewards are the game's scores; a model,
    its saved file and a population make their envs so, and an env passed in made otherwise is refused."""
    import rlspeed
    from rlspeed.envs.base import find_wrapper
    from rlspeed.population import Population

    kept = {"episodic_life": False, "clip_rewards": False}
    train = make_env("SpaceInvadersNoFrameskip-v4", num_envs=2, seed=3, backend="gymnasium", device="cpu", **kept)
    _, info = train.reset()
    lives = info["lives"]
    generator = torch.Generator().manual_seed(1)
    lost_lives = big_rewards = 0
    for _ in range(400):
        _, reward, terminated, truncated, info = train.step(torch.randint(0, 6, (2,), generator=generator))
        lost = (info["lives"] < lives) & ~info["done"]
        assert not bool((terminated & ~info["done"]).any())  # (a lost life ends no episode: only whole games do)
        big_rewards += int((reward > 1).sum())  # (raw scores: SpaceInvaders' aliens are worth 5 to 30)
        lost_lives += int(lost.sum())
        lives = info["lives"]
        if lost_lives >= 1 and big_rewards >= 1:  # (by step 167 with these seeds)
            break
    assert lost_lives >= 1 and big_rewards >= 1  # each rule was exercised

    def flags(env):
        wrapper = find_wrapper(env, atari.AtariTraining)
        return wrapper.episodic_life, wrapper.clip_rewards

    model = rlspeed.PPO("BreakoutNoFrameskip-v4", env_backend="gymnasium", num_envs=1, batch_size=128, device="cpu",
                        **kept)
    assert flags(model.make_training_env()) == (False, False)
    model.save(tmp_path / "model")
    loaded = rlspeed.PPO.load(tmp_path / "model", device="cpu")
    assert loaded.config.episodic_life is False and flags(loaded.make_training_env()) == (False, False)
    with pytest.raises(UserError, match="made with episodic_life=False, and the model's episodic_life is True"):
        rlspeed.PPO(train)
    train.close()
    population = Population(rlspeed.PPO, "BreakoutNoFrameskip-v4", seeds=[0, 1], env_backend="gymnasium",
                            num_envs=1, batch_size=128, device="cpu", episodic_life=False)
    made = population._make_env(1, [0, 1])
    assert flags(made) == (False, True)
    for env in (made, model, loaded):
        env.close()


def test_subprocess_envs_report_lives_and_end_episodes_at_lost_lives():
    env = make_env("BreakoutNoFrameskip-v4", num_envs=2, seed=0, backend="gymnasium-async", device="cpu")
    try:
        obs, info = env.reset()
        assert obs.shape == (2, 4, 84, 84) and info["lives"].tolist() == [5, 5]
        generator = torch.Generator().manual_seed(0)
        ends = 0
        for _ in range(120):
            _, _, terminated, _, info = env.step(torch.randint(0, 4, (2,), generator=generator))
            ends += int(terminated.sum())
        assert ends >= 1 and bool((info["lives"] < 5).any())
    finally:
        env.close()


@pytest.mark.parametrize(("import_error", "said"), [
    (ImportError("libGL.so.1: cannot open shared object file", name="cv2"),
     r"'cv2' is installed but cannot be imported: libGL\.so\.1: cannot open shared object file\.$"),
    (ModuleNotFoundError("No module named 'cv2'", name="cv2"),
     r"'cv2' is not installed: pip install \"rlspeed\[atari\]\"\.$")])
def test_opencv_that_fails_to_load_is_not_said_to_be_missing(import_error, said, monkeypatch):
    """OpenCV installed without the libGL it loads (opencv-python in a slim container) was 'not installed: pip
    install "rlspeed[atari]"', which changes nothing; its import's error is said. Missing, it is still the extra."""

    def preprocessing(*args, **kwargs):
        raise gym.error.DependencyNotInstalled("opencv-python package not installed") from import_error

    monkeypatch.setattr(gym.wrappers, "AtariPreprocessing", preprocessing)
    with pytest.raises(UserError, match=rf"^Atari preprocessing needs OpenCV: the Python module {said}"):
        atari.make_atari_env("PongNoFrameskip-v4")


def test_atari_id_without_ale_py_is_one_sentence_with_the_pip_command(monkeypatch):
    monkeypatch.setattr(atari, "register_atari", lambda: False)
    with pytest.raises(UserError, match=r'need ale-py and OpenCV .*: pip install "rlspeed\[atari\]"'):
        make_env("NoSuchGameNoFrameskip-v4")
    with pytest.raises(UserError, match=r'pip install "rlspeed\[atari\]"'):
        resolve_backend("NoSuchGameNoFrameskip-v4")


def test_a_games_spec_is_made_once_per_process_and_options(monkeypatch):
    """Each Atari game made is a ROM load, and a population asked for its spec once per member and solo run: a spec
    this process made already is given again without making the game, for the same options only, and made anew where
    the id is registered again or its registration was changed in place (it gave the old game's action space and
    reward threshold)."""
    made = []
    real = atari.make_atari_env
    monkeypatch.setattr(atari, "make_atari_env", lambda *a, **k: made.append(a) or real(*a, **k))
    monkeypatch.setattr(atari, "_specs", type(atari._specs)())
    first = env_spec("PongNoFrameskip-v4")
    assert env_spec("PongNoFrameskip-v4") == first and len(made) == 1
    env = make_env("PongNoFrameskip-v4", num_envs=2, backend="gymnasium")  # (its games only: no probe)
    env.close()
    assert len(made) == 3
    full = env_spec("PongNoFrameskip-v4", {"full_action_space": True})
    assert full.action_space.n == 18 and first.action_space.n == 6 and len(made) == 4
    monkeypatch.setitem(gym.registry, "PongNoFrameskip-v4", dataclasses.replace(gym.spec("PongNoFrameskip-v4")))
    assert env_spec("PongNoFrameskip-v4") == first and len(made) == 5
    # (a registration changed in place, Gymnasium's EnvSpec not being frozen: another game, not the kept spec)
    monkeypatch.setitem(gym.spec("PongNoFrameskip-v4").kwargs, "full_action_space", True)
    monkeypatch.setattr(gym.spec("PongNoFrameskip-v4"), "reward_threshold", 18.0)
    changed = env_spec("PongNoFrameskip-v4")
    assert (changed.action_space.n, changed.reward_threshold) == (18, 18.0) and len(made) == 6


def test_ram_observations_are_not_preprocessed_as_images():
    env = make_env("BreakoutNoFrameskip-v4", num_envs=1, device="cpu", obs_type="ram")
    try:
        assert env.backend == "gymnasium"  # env options go to Gymnasium's envs
        obs, _ = env.reset()
        assert obs.shape == (1, 128) and obs.dtype == torch.uint8
    finally:
        env.close()
    # a model asked for the RAM (its spec as its envs: it was built for 84x84 frame stacks) and the -ram id hint
    from rlspeed import PPO

    model = PPO("ALE/Pong-v5", env_kwargs={"obs_type": "ram"}, device="cpu", num_envs=2, num_steps=8, batch_size=16)
    assert model.spec.observation_shape == (128,) and model.spec.observation_space.dtype == np.uint8
    model.learn(16, progress_bar=False)
    with pytest.raises(UserError, match='with the env option obs_type="ram"'):
        make_env("ALE/Pong-ram-v5")


def test_a_vector_env_of_raw_atari_frames_is_not_taken_for_its_id():
    """A vector env of the registered game unchanged gives its raw RGB frames, where the id names rlspeed's
    preprocessed frame stacks: the model kept the id, and its evaluation made the id's env and refused it as another
    env of the same id ("BreakoutNoFrameskip-v4 (observations (4, 84, 84)) does not fit this model, trained on
    BreakoutNoFrameskip-v4 (observations (210, 160, 3))"). It is the user's env, evaluated on one built the same way."""
    from rlspeed import PPO
    from rlspeed.envs.gymnasium_env import USER_VECTOR_ENV

    def raw_frames():
        return gym.make_vec("BreakoutNoFrameskip-v4", num_envs=1, vectorization_mode="sync",
                            vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})

    model = PPO(raw_frames(), device="cpu", seed=0, num_envs=1, num_steps=8, batch_size=8, encoder="mlp")
    assert model.spec.observation_shape == (210, 160, 3) and model.env_id == USER_VECTOR_ENV
    with pytest.raises(UserError, match="vector env you built"):
        model.evaluate(episodes=1, max_steps=5)
    model.close()


def test_sb3_make_atari_env_reports_whole_games_with_raw_scores_as_sb3_does(tmp_path):
    """SB3's `make_atari_env` ends the learner's episode at a lost life and clips rewards, outside the `Monitor` that
    SB3 reports its episodes from (`ep_rew_mean`, `evaluate_policy`): whole games, raw scores. rlspeed summed the
    VecEnv's own episodes: metrics.csv showed each life's clipped rewards (SpaceInvaders: 2, 4, 5 for games of 55 to
    125 points) and `evaluate` stopped at the first lost life."""
    pytest.importorskip("stable_baselines3")
    import csv
    import warnings

    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    import rlspeed

    def monitored(vec_env):
        return [r for env in vec_env.venv.envs for r in env.get_wrapper_attr("get_episode_rewards")()]

    train_env = VecFrameStack(make_atari_env("SpaceInvadersNoFrameskip-v4", n_envs=2, seed=0), 4)
    model = rlspeed.PPO(train_env, device="cpu", seed=0, num_steps=128, batch_size=128, n_epochs=1)
    # (each env ends its first game within its 512 steps: the logged episodes are compared with those games)
    model.learn(1024, run_dir=tmp_path / "run", log_interval_s=0, progress_bar=False)
    with open(tmp_path / "run" / "metrics.csv") as f:
        logged = [float(row["episode_return"]) for row in csv.DictReader(f) if row["episode_return"]]
    games = monitored(train_env)
    assert games and logged and min(logged) >= min(games) - 1e-3 and max(logged) <= max(games) + 1e-3
    eval_env = VecFrameStack(make_atari_env("SpaceInvadersNoFrameskip-v4", n_envs=1, seed=1), 4)
    with warnings.catch_warnings(record=True) as caught:  # (the ClipRewardEnv over the Monitor changes no return)
        warnings.simplefilter("always")
        result = rlspeed.evaluate(model, eval_env, episodes=1, max_steps=5000)
    assert result["unfinished"] == 0 and result["returns"] == monitored(eval_env)  # the whole game, raw
    assert not [w for w in caught if "ClipRewardEnv" in str(w.message)]
    model.close()
    eval_env.close()


@pytest.mark.parametrize("algo_name", ["ppo", "dqn"])
def test_preset_settings_train_a_cnn_on_uint8_frame_stacks(algo_name):
    """The Atari preset's network (the CNN encoder) on the preprocessed frames, shrunk to a few hundred steps: the
    batch stays uint8 up to the network and every weight stays finite."""
    from rlspeed import DQN, PPO
    from rlspeed.presets import load_preset, split_run_settings

    _, hyper = split_run_settings(load_preset(algo_name, "BreakoutNoFrameskip-v4"))
    assert hyper["encoder"] == "cnn"
    if algo_name == "ppo":
        hyper.update(num_envs=2, num_steps=32, batch_size=32, n_epochs=1)
        model = PPO("BreakoutNoFrameskip-v4", seed=0, device="cpu", env_backend="gymnasium", **hyper)
    else:
        hyper.update(buffer_size=512, learning_starts=64, batch_size=16, target_update_interval=64)
        model = DQN("BreakoutNoFrameskip-v4", seed=0, device="cpu", env_backend="gymnasium", **hyper)
    model.learn(256, progress_bar=False)
    networks = [module for module in vars(model).values() if isinstance(module, torch.nn.Module)]
    assert networks and all(bool(torch.isfinite(p).all()) for module in networks for p in module.parameters())
    action = model.predict(torch.zeros(4, 84, 84, dtype=torch.uint8))[0]
    assert 0 <= int(torch.as_tensor(action).reshape(-1)[0]) < 4


@pytest.fixture(scope="module")
def fresh_process():
    """One fresh interpreter that asks `remakeable` about two ALE ids before anything registered ale-py's envs (its
    first line), then makes an Atari env (its second line, "made"): the finished process."""
    import subprocess
    import sys

    code = ("from rlspeed.envs import make_env, remakeable\n"
            "print(remakeable('ALE/Pong-v5'), remakeable('PongNoFrameskip-v4'))\n"
            "env = make_env('ALE/Pong-v5', num_envs=1, device='cpu', backend='gymnasium')\n"
            "env.reset(seed=0)\nenv.close()\nprint('made')\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def test_an_atari_id_is_one_rlspeed_can_make_again_in_a_fresh_process(fresh_process):
    """`remakeable` (which decides whether evaluate and learn(eval_freq) may make fresh envs of a model's id) said no
    for every ALE id until something had registered ale-py's envs: `rlspeed eval` of a saved Atari model refused."""
    assert fresh_process.stdout.splitlines()[:1] == ["True True"], fresh_process.stderr


def test_making_an_atari_env_prints_no_ale_banner_on_stderr(fresh_process):
    """ALE's emulator printed "A.L.E: Arcade Learning Environment (version ...)" and "[Powered by Stella]" on stderr
    (from its C++ code, past Python's warnings) when a process made its first Atari env: the first lines of every
    Atari run's log and of `rlspeed doctor`."""
    assert fresh_process.returncode == 0 and fresh_process.stdout.splitlines()[1:] == ["made"]
    assert "Arcade Learning Environment" not in fresh_process.stderr and "Stella" not in fresh_process.stderr
