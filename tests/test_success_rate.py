"""Goal envs' `info["is_success"]` (SB3's `success_rate`): passed on by every Gymnasium-facing adapter for the rows
that finished, logged as `success_rate` while training, and reported by `evaluate`, `rlspeed train` and `rlspeed
eval`."""

from __future__ import annotations

import csv
import json

import gymnasium as gym
import numpy as np
import pytest
import torch

import rlspeed
from rlspeed import cli

GOAL_ID = "RlspeedTestLineGoal-v0"


class LineGoal(gym.Env):
    """Walk from 0 (action 1: right, 0: left); reaching +3 within 8 steps succeeds (reward 1, terminated), else the
    episode is truncated at 8 steps with reward 0. The last info says `is_success`, so success == return."""

    observation_space = gym.spaces.Box(-10, 10, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.x, self.t = 0, 0
        return np.array([self.x], np.float32), {}

    def step(self, action):
        self.x += 1 if int(action) == 1 else -1
        self.t += 1
        success = self.x >= 3
        done = success or self.t >= 8
        info = {"is_success": success} if done else {}
        return np.array([self.x], np.float32), float(success), success, done and not success, info


gym.register(GOAL_ID, entry_point=LineGoal, max_episode_steps=8)


def _walk(env, steps: int, seed: int = 0):
    """(done, is_success) per step for seeded random actions."""
    generator = torch.Generator().manual_seed(seed)
    env.reset(seed=seed)
    seen = []
    for _ in range(steps):
        actions = torch.randint(0, 2, (env.num_envs,), generator=generator)
        *_, info = env.step(actions)
        seen.append((info["done"].clone(), info.get("is_success")))
    return seen


@pytest.mark.parametrize("backend", ["gymnasium", "gymnasium-async"])
def test_finished_rows_carry_their_envs_is_success(backend):
    """Each finished row's `is_success` is what its env said; before the first finished episode the key is absent,
    after it present on every step (False where no episode ended)."""
    env = rlspeed.make_env(GOAL_ID, num_envs=3, seed=0, backend=backend)
    try:
        seen = _walk(env, 24)
    finally:
        env.close()
    first = next(i for i, (done, _) in enumerate(seen) if done.any())
    assert all(flags is None for _, flags in seen[:first])
    assert all(flags is not None and flags.dtype == torch.bool and flags.shape == (3,) for _, flags in seen[first:])
    assert not any((flags & ~done).any() for done, flags in seen[first:])
    # the same walk in single Gymnasium envs: row i is env i, seeded seed + i, taking row i's actions
    generator = torch.Generator().manual_seed(0)
    envs = [gym.make(GOAL_ID) for _ in range(3)]
    for i, single in enumerate(envs):
        single.reset(seed=i)
    expected = []
    for _ in range(24):
        actions = torch.randint(0, 2, (3,), generator=generator)
        row = []
        for i, single in enumerate(envs):
            _, _, terminated, truncated, info = single.step(int(actions[i]))
            row.append(bool(info.get("is_success", False)))
            if terminated or truncated:
                single.reset()
        expected.append(row)
    assert [flags.tolist() if flags is not None else [False] * 3 for _, flags in seen] == expected
    assert any(any(row) for row in expected) and not all(all(row) for row in expected)  # both kinds happen


class MazeGoal(LineGoal):
    """LineGoal reporting its success as Gymnasium-Robotics' PointMaze and AntMaze do: `info["success"]`, on every
    step; with `both`, a contrary `info["is_success"]` beside it, which wins."""

    def __init__(self, both: bool = False):
        self.both = both

    def step(self, action):
        obs, reward, terminated, truncated, _ = super().step(action)
        info = {"success": reward == 1.0}
        if self.both:
            info["is_success"] = reward != 1.0
        return obs, reward, terminated, truncated, info


gym.register("RlspeedTestMazeGoal-v0", entry_point=MazeGoal, max_episode_steps=8)


@pytest.mark.parametrize("backend", ["gymnasium", "gymnasium-async", "sb3"])
def test_an_envs_success_key_is_its_success_where_it_gives_no_is_success(backend):
    """`info["success"]` (PointMaze's, AntMaze's) is the success of an env that gives no `is_success`, in every
    adapter: each finished row's flag is its return here; where an env gives both, `is_success` is read."""
    for both in (False, True):
        if backend == "sb3":
            env_util = pytest.importorskip("stable_baselines3.common.env_util")
            env = rlspeed.make_env(env_util.make_vec_env("RlspeedTestMazeGoal-v0", n_envs=2, seed=0,
                                                         env_kwargs={"both": both}))
        else:
            env = rlspeed.make_env("RlspeedTestMazeGoal-v0", num_envs=2, seed=0, backend=backend,
                                   env_kwargs={"both": both})
        generator = torch.Generator().manual_seed(0)
        finished, succeeded, paid = 0, 0, 0
        try:
            env.reset(seed=0)
            for _ in range(24):
                *_, info = env.step(torch.randint(0, 2, (2,), generator=generator))
                done = info["done"]
                finished += int(done.sum())
                if done.any():
                    succeeded += int(info["is_success"][done].sum())
                    paid += int((info["episode_return"][done] == 1.0).sum())
        finally:
            env.close()
        assert 0 < paid < finished  # (both kinds)
        assert succeeded == (finished - paid if both else paid)


def test_a_success_flag_that_is_not_a_bool_is_refused_naming_its_key():
    from rlspeed.envs.gymnasium_env import success_flag

    with pytest.raises(rlspeed.UserError, match=r"info\['success'\] is 'yes'.*reads 'success' where"):
        success_flag("yes", "success")


def test_a_stable_baselines3_vec_env_passes_is_success_on():
    env_util = pytest.importorskip("stable_baselines3.common.env_util")
    env = rlspeed.make_env(env_util.make_vec_env(GOAL_ID, n_envs=2, seed=0))
    try:
        seen = _walk(env, 20)
    finally:
        env.close()
    ended = [(done, flags) for done, flags in seen if done.any()]
    assert ended and all(flags is not None for _, flags in ended)
    assert not any((flags & ~done).any() for done, flags in seen if flags is not None)


@pytest.mark.parametrize("algorithm", [rlspeed.PPO, rlspeed.DQN])
def test_training_logs_the_success_rate_and_evaluate_reports_it(algorithm, tmp_path):
    """On LineGoal success == return, so the logged `success_rate` equals the logged mean episode return, the
    evaluations' `eval_success_rate` their `eval_mean`, and `evaluate`'s success rate equals its mean return; an env
    without `is_success` logs and reports none."""
    settings = {"num_steps": 32, "batch_size": 32} if algorithm is rlspeed.PPO else {"learning_starts": 64}
    model = algorithm(GOAL_ID, num_envs=2, seed=0, device="cpu", **settings)
    model.learn(512, progress_bar=False, run_dir=tmp_path, log_interval_s=0.0, eval_freq=256, eval_episodes=4)
    with open(tmp_path / "metrics.csv") as stream:
        logged = list(csv.DictReader(stream))
    rows = [row for row in logged if row["success_rate"] not in ("", "nan")]
    assert rows and all(float(row["success_rate"]) == pytest.approx(float(row["episode_return"])) for row in rows)
    evaluated = [row for row in logged if row["eval_mean"] not in ("", "nan")]
    assert len(evaluated) == 2
    assert all(float(row["eval_success_rate"]) == pytest.approx(float(row["eval_mean"])) for row in evaluated)
    result = model.evaluate(episodes=6, seed=5)
    assert result["success_rate"] == pytest.approx(result["mean"])
    plain = algorithm("CartPole-v1", num_envs=2, seed=0, device="cpu", **settings)
    assert "success_rate" not in plain.evaluate(episodes=2, seed=0)


def test_the_command_reports_the_success_rate(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = cli.main(["train", "ppo", f"{__name__}:{GOAL_ID}", "--total-timesteps", "2048", "--out", "run",
                     "--no-progress"])
    assert code == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["final_eval"]["success_rate"] == pytest.approx(summary["final_eval"]["mean"])
    assert f"success rate {summary['final_eval']['success_rate']:.0%}" in capsys.readouterr().out
    assert cli.main(["eval", "run", "--seed", "3", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["success_rate"] == pytest.approx(printed["mean"])


def test_eval_callback_keeps_each_evaluations_successes(tmp_path):
    """EvalCallback keeps SB3's `successes` in evaluations.npz (one flag per episode per evaluation), matching the
    returns (success == return on LineGoal), and its last success rate."""
    from rlspeed.callbacks import EvalCallback

    callback = EvalCallback(n_eval_episodes=4, eval_freq=128, log_path=tmp_path)
    model = rlspeed.PPO(GOAL_ID, num_envs=2, seed=0, device="cpu", num_steps=32, batch_size=32)
    model.learn(512, callback=callback, progress_bar=False)
    saved = np.load(tmp_path / "evaluations.npz")
    assert saved["successes"].shape == saved["results"].shape == (len(callback.evaluations_timesteps), 4)
    assert (saved["successes"] == (saved["results"] == 1.0)).all()
    assert callback.last_success_rate == pytest.approx(saved["successes"][-1].mean())


def test_evaluate_on_a_callers_env_reports_each_episodes_success():
    """An env of the caller's whose rows share the episodes (7 on 2 rows: 4 and 3, as SB3's evaluate_policy spreads
    them) reports each counted episode's own `is_success`, in the order of its returns (success == return here), and
    their share."""
    model = rlspeed.PPO(GOAL_ID, num_envs=2, seed=0, device="cpu")  # (untrained: a stochastic policy's mixed results)
    env = rlspeed.make_env(GOAL_ID, num_envs=2, seed=0)
    try:
        result = rlspeed.evaluate(model, env, episodes=7, seed=0, deterministic=False)
    finally:
        env.close()
    assert result["episodes"] == 7 and result["successes"] == [ret == 1.0 for ret in result["returns"]]
    assert 0 < sum(result["successes"]) < 7  # (both kinds)
    assert result["success_rate"] == pytest.approx(result["mean"])


class SeededLength(LineGoal):
    """LineGoal whose episodes last 2 + (its reset seed mod 5) steps: envs seeded differently finish (and first
    report `is_success`) at different steps."""

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.length = 2 + seed % 5
        return super().reset(seed=seed, options=options)

    def step(self, action):
        obs, _, _, _, _ = super().step(action)
        done = self.t >= self.length
        return obs, float(int(action) == 1), False, done, ({"is_success": int(action) == 1} if done else {})


gym.register("RlspeedTestSeededLength-v0", entry_point=SeededLength)


def test_a_population_on_subprocess_goal_envs_trains(tmp_path):
    """Members' subprocess envs start to report `is_success` at different steps (each at its own first finished
    episode): the population joins their infos without the key and trains."""
    from rlspeed.population import Population

    population = Population(rlspeed.PPO, "RlspeedTestSeededLength-v0", seeds=[0, 1, 2], env_backend="gymnasium-async",
                            num_envs=1, num_steps=16, batch_size=16, device="cpu")
    population.learn(256, progress_bar=False)
    assert population.num_timesteps >= 256


def test_the_success_rate_is_the_flags_share_not_the_returns(tmp_path):
    """On SeededLength the return counts right moves and success is the last move alone: the logged success rate is
    a share in [0, 1] that differs from the mean return, and evaluate's equals its own per-episode flags."""
    model = rlspeed.PPO("RlspeedTestSeededLength-v0", num_envs=2, seed=0, device="cpu", num_steps=32, batch_size=32)
    model.learn(512, progress_bar=False, run_dir=tmp_path, log_interval_s=0.0)
    with open(tmp_path / "metrics.csv") as stream:
        rows = [row for row in csv.DictReader(stream) if row["success_rate"] not in ("", "nan")]
    rates = [float(row["success_rate"]) for row in rows]
    returns = [float(row["episode_return"]) for row in rows]
    assert rates and all(0.0 <= rate <= 1.0 for rate in rates)
    assert any(abs(rate - ret) > 1e-6 for rate, ret in zip(rates, returns))
    result = model.evaluate(episodes=6, seed=3)
    assert result["success_rate"] == pytest.approx(sum(result["successes"]) / 6)


def test_a_population_reports_each_members_final_success_rate():
    """Populations report goal envs' success too (they dropped the key): each member's `final_eval` has its
    `success_rate`, equal to its return here (success pays 1, else 0), and the aggregate has `final_success_rate`."""
    from rlspeed.population import Population

    population = Population(rlspeed.PPO, GOAL_ID, seeds=[0, 1, 2], device="cpu", env_backend="gymnasium",
                            num_envs=4, num_steps=16, batch_size=32)
    summary = population.learn(256, progress_bar=False)
    for member in summary["members"]:
        assert member["final_eval"]["success_rate"] == pytest.approx(member["final_eval"]["mean"])
    rates = [member["final_eval"]["success_rate"] for member in summary["members"]]
    assert summary["aggregate"]["final_success_rate"]["median"] == pytest.approx(float(np.median(rates)))


def test_population_evaluation_keeps_each_members_successes_apart():
    """Member 0 walks right (succeeds), member 1 left (fails): the success rates follow the members, although member
    1's envs never report a success before member 0's do (their blocks read False until they report)."""
    from rlspeed.population import Population

    population = Population(rlspeed.PPO, GOAL_ID, seeds=[0, 1], device="cpu", env_backend="gymnasium", num_envs=2,
                            num_steps=16, batch_size=32)
    episodes = 3

    def right_then_left(obs: torch.Tensor) -> torch.Tensor:
        return torch.tensor([1] * episodes + [0] * episodes)

    means = population._mean_returns([5, 6], episodes, right_then_left, [0, 1])
    assert means.tolist() == [1.0, 0.0] and population.last_success_rates == [1.0, 0.0]


def test_an_is_success_that_is_not_a_bool_is_refused():
    """`info["is_success"]` is read as a bool (or a 0/1 number): a text or another number would count as a success
    under `bool()`, so it is one sentence instead."""
    from rlspeed.envs.gymnasium_env import success_flag

    assert [success_flag(value) for value in (np.True_, 0, 1.0)] == [True, False, True]
    for value in ("no", 0.7, [True, False]):
        with pytest.raises(rlspeed.UserError, match=r"info\['is_success'\] is .*must be a bool"):
            success_flag(value)


def test_an_sb3_vec_env_without_terminal_observations_or_with_extra_rewards_is_one_sentence():
    """A VecEnv of one's own must give SB3's `terminal_observation` for finished envs and one reward per env (it was
    reported as the env raising KeyError, or a shape error deep inside)."""
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.vec_env import DummyVecEnv, VecEnvWrapper

    class Broken(VecEnvWrapper):
        def __init__(self, venv, mode):
            super().__init__(venv)
            self.mode = mode

        def reset(self):
            return self.venv.reset()

        def step_wait(self):
            obs, rewards, dones, infos = self.venv.step_wait()
            if self.mode == "rewards":
                return obs, np.repeat(rewards, 2), dones, infos
            dones = np.ones_like(dones)
            return obs, rewards, dones, [{} for _ in infos]

    for mode, message in (("rewards", "returned 4 rewards and 2 dones"), ("final", "terminal_observation")):
        env = rlspeed.make_env(Broken(DummyVecEnv([lambda: gym.make("CartPole-v1")] * 2), mode))
        env.reset(seed=0)
        with pytest.raises(rlspeed.UserError, match=message):
            env.step(torch.zeros(2, dtype=torch.int64))
