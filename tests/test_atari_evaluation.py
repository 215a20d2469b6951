"""Atari evaluation: games that wait for FIRE get it at every start and lost life (`FireToStart`), so a
deterministic policy that never presses FIRE still ends its games; training envs are left as Gymnasium makes them.
Skipped without ale-py or OpenCV."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("ale_py")
pytest.importorskip("cv2")

import rlspeed  # noqa: E402
from rlspeed.envs import atari, make_env  # noqa: E402

atari.register_atari()


def test_fire_is_the_second_action_of_the_games_that_wait_for_it():
    assert atari.fire_action("BreakoutNoFrameskip-v4") == 1 and atari.fire_action("ALE/Pong-v5") == 1
    assert atari.fire_action("MsPacmanNoFrameskip-v4") is None  # (no FIRE: nothing is pressed for it)


def test_a_policy_that_never_fires_ends_breakout_games_only_with_fire_to_start():
    """NOOP and LEFT forever: without FIRE the ball is never served and no game ends in 1,500 steps; with FIRE at
    each start and lost life, every game is lost within 1,500 steps, its first action and the one after each lost
    life FIRE and the others the policy's."""
    actions = torch.tensor([0, 3])
    plain = make_env("BreakoutNoFrameskip-v4", num_envs=2, seed=0, backend="gymnasium", device="cpu")
    wrapped = atari.for_evaluation(make_env("BreakoutNoFrameskip-v4", num_envs=2, seed=0, backend="gymnasium",
                                            device="cpu"))
    assert isinstance(wrapped, atari.FireToStart)
    plain.reset()
    _, info = wrapped.reset()
    pressed, lives_lost, ended = [], 0, torch.zeros(2, dtype=torch.bool)
    inner_step = wrapped.env.step

    def record(taken):
        pressed.append(taken.clone())
        return inner_step(taken)

    wrapped.env.step = record
    for _ in range(1500):
        assert not bool(plain.step(actions)[4]["done"].any())
        lives = info["lives"]
        _, _, _, _, info = wrapped.step(actions)
        lives_lost += int((info["lives"] < lives).sum())
        ended |= info["done"]
        if bool(ended.all()):
            break
    plain.close()
    wrapped.close()
    assert bool(ended.all()) and lives_lost >= 8
    fires = torch.stack(pressed) == 1
    assert fires[0].all() and int(fires.sum()) <= lives_lost + 2 + 2  # FIRE at each start and after each lost life
    assert (torch.stack(pressed)[~fires] == actions.expand(len(pressed), 2)[~fires]).all()


def test_under_sticky_actions_fire_is_pressed_long_enough_to_serve():
    """ALE/Breakout-v5 repeats the previous action in a frame with probability 0.25: one FIRE step then left the
    ball unserved in about 1 game in 7, and a policy that never fires stood still in them until ALE ended the game
    after 27,000 steps (an untrained model's `rlspeed eval`: minutes per game). Two steps serve it."""
    assert atari.fire_steps("ALE/Breakout-v5") == 2 and atari.fire_steps("BreakoutNoFrameskip-v4") == 1
    assert atari.fire_steps("ALE/Breakout-v5", {"repeat_action_probability": 0.0}) == 1
    # (Gymnasium seeds env i with seed + i: env 3, seed 16, is a game one FIRE step left unserved)
    rows = 4
    env = atari.for_evaluation(make_env("ALE/Breakout-v5", num_envs=rows, seed=13, backend="gymnasium",
                                        evaluation=True, device="cpu"))
    env.reset()
    ended = torch.zeros(rows, dtype=torch.bool)
    right = torch.full((rows,), 2)
    for _ in range(1500):  # (RIGHT alone loses a served ball at once: a whole game takes a few hundred steps)
        ended |= env.step(right)[4]["done"]
        if bool(ended.all()):
            break
    env.close()
    assert bool(ended.all()), f"{int((~ended).sum())} of {rows} games stood still, the ball never served"


def test_a_deterministic_untrained_breakout_evaluation_ends_its_games():
    model = rlspeed.DQN("BreakoutNoFrameskip-v4", seed=0, device="cpu", env_backend="gymnasium", encoder="cnn",
                        net_arch=(), buffer_size=64)
    # (ALE caps a game at 27,000 steps; without FIRE this policy plays all 3,000 of both games: the ball is never
    # served. One evaluation: model.evaluate is rlspeed.evaluate, and uncapped it played the same two games again.)
    result = model.evaluate(episodes=2, seed=0, max_steps=3000)
    assert result["unfinished"] == 0 and result["episodes"] == 2


def test_training_envs_are_not_given_fire():
    env = make_env("BreakoutNoFrameskip-v4", num_envs=1, seed=0, backend="gymnasium", device="cpu")
    assert not isinstance(env, atari.FireToStart)  # (tests/test_atari.py checks its frames against Gymnasium's)
    env.close()


def test_evaluation_plays_whole_games_with_raw_rewards(monkeypatch):
    """`evaluate` builds its env without the training transforms (no `AtariTraining`: a lost life does not end the
    episode, rewards are not clipped)."""
    import rlspeed.evaluation as evaluation
    from rlspeed.envs.base import EnvWrapper

    built, wrap = [], atari.for_evaluation

    def record(env):
        built.append(env)
        return wrap(env)

    monkeypatch.setattr(evaluation.atari, "for_evaluation", record)
    model = rlspeed.DQN("BreakoutNoFrameskip-v4", seed=0, device="cpu", env_backend="gymnasium", encoder="cnn",
                        net_arch=(), buffer_size=64)
    rlspeed.evaluate(model, episodes=1, seed=0, max_steps=2)
    layers, inner = [], built[0]
    while isinstance(inner, EnvWrapper):
        layers.append(type(inner))
        inner = inner.env
    assert atari.AtariTraining not in layers and isinstance(inner, atari.AtariGymnasiumEnv)


def test_a_vector_env_that_ends_episodes_at_each_lost_life_is_said_to_report_lives():
    """A VecEnv of SB3's AtariWrapper without Monitor (or Gymnasium's AtariPreprocessing(terminal_on_life_loss=True))
    ends an episode at each lost life, so evaluate reported lives as if they were games, silently (SB3's
    evaluate_policy warns of an env without Monitor); with SB3's Monitor under the wrapper (make_atari_env) its whole
    games are counted, and nothing is said."""
    pytest.importorskip("stable_baselines3")
    import warnings

    import gymnasium as gym
    from stable_baselines3.common.atari_wrappers import AtariWrapper
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import DummyVecEnv

    def said(env) -> list[str]:
        model = rlspeed.PPO(env, seed=0, device="cpu", num_steps=16, batch_size=16)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            rlspeed.evaluate(model, env, episodes=1, seed=0, max_steps=3)
        env.close()
        return [str(warning.message) for warning in caught if "lost life" in str(warning.message)]

    life = "each episode reported is one life, not a whole game"
    assert life in said(DummyVecEnv([lambda: AtariWrapper(gym.make("BreakoutNoFrameskip-v4"))]))[0]
    assert not said(make_atari_env("BreakoutNoFrameskip-v4", n_envs=1, seed=0))
    preprocessed = gym.vector.SyncVectorEnv(
        [lambda: gym.wrappers.AtariPreprocessing(gym.make("BreakoutNoFrameskip-v4"), terminal_on_life_loss=True,
                                                   grayscale_newaxis=True)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    assert "AtariPreprocessing" in said(preprocessed)[0]


def test_fire_reset_serves_the_ball_in_hidden_steps_as_sb3s_atari_wrapper():
    """`env_kwargs={"fire_reset": True}`: FIRE is pressed for the agent after every reset and lost life in steps it
    never sees (Stable-Baselines3's `AtariWrapper` and CleanRL's ppo_atari train so): a policy that never fires
    loses its lives and ends its training games (episodic life: a lost life ends the learner's episode), each
    counted episode's length counts the agent's own steps only, and evaluation adds no FIRE of its own (the env
    presses it). The option is recorded with the env, so evaluation envs remade from the spec press it too."""
    actions = torch.tensor([0, 3])
    env = make_env("BreakoutNoFrameskip-v4", num_envs=2, seed=0, backend="gymnasium", device="cpu",
                   env_kwargs={"fire_reset": True})
    assert env.spec.env_kwargs == {"fire_reset": True}
    assert atari.for_evaluation(env) is env
    _, info = env.reset()
    assert info["lives"].tolist() == [5, 5]
    terminations, first_games = 0, {}
    for step in range(1, 1501):
        _, _, terminated, _, info = env.step(actions)
        terminations += int(terminated.sum())
        for row in info["done"].nonzero().flatten().tolist():
            first_games.setdefault(row, (step, int(info["episode_length"][row])))
        if len(first_games) == 2:
            break
    env.close()
    assert len(first_games) == 2 and terminations >= 2 * 5 - 1  # games served and lost, a learner's episode a life
    for ended_at, length in first_games.values():  # (hidden FIRE steps are not the agent's: not counted)
        assert length == ended_at


def test_fire_reset_is_refused_where_it_cannot_apply():
    with pytest.raises(rlspeed.UserError, match="MsPacmanNoFrameskip-v4 has no FIRE"):
        make_env("MsPacmanNoFrameskip-v4", backend="gymnasium", device="cpu", env_kwargs={"fire_reset": True})
    for value in ("yes", 0.5):
        with pytest.raises(rlspeed.UserError, match=f"fire_reset is true or false, got {value!r}"):
            make_env("BreakoutNoFrameskip-v4", backend="gymnasium", device="cpu", env_kwargs={"fire_reset": value})
    # (rlspeed's one rule for switches, as its hyperparameters' and other env options': 0 and 1.0 too)
    assert [atari.fire_reset_option("BreakoutNoFrameskip-v4", value) for value in (1.0, 0, True)] == [True, False, True]


def test_fire_reset_under_sticky_actions_still_gets_fire_to_start_in_evaluation():
    """fire_reset presses FIRE once after a reset or a lost life, as the peers' FireResetEnv; under sticky actions
    (the v5 ids) that can leave Breakout's ball unserved, so evaluation adds FireToStart's presses there."""
    sticky = make_env("ALE/Breakout-v5", num_envs=1, seed=0, backend="gymnasium", device="cpu", evaluation=True,
                      env_kwargs={"fire_reset": True})
    plain = make_env("ALE/Breakout-v5", num_envs=1, seed=0, backend="gymnasium", device="cpu", evaluation=True,
                     env_kwargs={"fire_reset": True, "repeat_action_probability": 0.0})
    assert isinstance(atari.for_evaluation(sticky), atari.FireToStart)
    assert atari.for_evaluation(plain) is plain
    sticky.close()
    plain.close()
