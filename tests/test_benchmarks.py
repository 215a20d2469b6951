"""The benchmark scripts' shared helpers (benchmarks/common.py): what a benchmark run leaves behind."""

import importlib.util
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _benchmarks_common():
    """benchmarks/common.py, imported as a module of its own."""
    spec = importlib.util.spec_from_file_location("benchmarks_common", BENCHMARKS / "common.py")
    common = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(common)
    return common


def test_a_benchmarks_reference_runs_leave_nothing_in_the_temp_directory(tmp_path):
    """Stable-Baselines3's learn() makes <temp dir>/SB3-<date and time> at each call where SB3_LOGDIR is unset: the
    benchmarks, which train SB3 models seed after seed, left one per run (a hundred after a day of benchmarks); they
    share one now, removed as the script ends, as is the strategy cache `temporary_directory` makes."""
    pytest.importorskip("stable_baselines3")
    temp = tmp_path / "temp"
    temp.mkdir()
    script = ("import common\n"
              "from stable_baselines3 import PPO\n"
              "common.temporary_directory('rlspeed-accel-bench-')\n"
              "for seed in (0, 1):\n"
              "    PPO('MlpPolicy', 'CartPole-v1', n_steps=16, batch_size=16, n_epochs=1, seed=seed).learn(16)\n")
    env = {key: value for key, value in os.environ.items() if key != "SB3_LOGDIR"}
    done = subprocess.run([sys.executable, "-c", script], cwd=BENCHMARKS, env={**env, "TMPDIR": str(temp)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(path.name for path in temp.iterdir() if not path.name.startswith("torchinductor_")) == []


def test_a_benchmarks_readme_made_afresh_starts_with_the_published_introduction():
    """`publish` writes benchmarks/README.md from `common.README_INTRO` where the file is missing (a fork that
    deleted it, a new results directory): that text is the published README's introduction, not an older one (it
    had fallen behind by a paragraph on the scripts' extras and the CUDA check)."""
    common = _benchmarks_common()
    published = (BENCHMARKS / "README.md").read_text().split("<!-- ", 1)[0]
    assert common.README_INTRO.rstrip() == published.rstrip()


def test_a_benchmarks_auto_side_decides_in_its_warm_up_and_its_timed_runs_take_the_choice(monkeypatch, tmp_path):
    """`accelerate="auto"` runs fp32 until its calls pay for a search, which a benchmark's short runs never reach (a
    MinAtar PPO update searches after about 140,000 env steps): cnn_encoder.py's and atari_ppo.py's auto sides timed
    fp32, or a choice some earlier run had left in the machine's cache. Their warm-up runs inside
    `common.acceleration_decided_at_once()`, which searches at once into a cache of the script's own, and the timed
    runs after it take that choice."""
    from rlspeed import DQN
    from rlspeed.fused import precision as fused_precision

    monkeypatch.setattr(fused_precision, "reduced_matmul_supported", lambda device, p: p == "bf16-matmul")  # (any CPU)
    monkeypatch.setenv("RLSPEED_CACHE_DIR", str(tmp_path / "machine-cache"))
    common = _benchmarks_common()

    def chosen_by() -> str:
        model = DQN("CartPole-v1", device="cpu", seed=0, accelerate="auto", learning_starts=32, train_freq=8,
                    batch_size=16)
        model.learn(64, progress_bar=False)
        return model.acceleration_summary()["chosen_by"]

    assert chosen_by() == "waiting"  # (a short run, as a benchmark's)
    with common.acceleration_decided_at_once():
        assert chosen_by() == "search"
    assert chosen_by() == "cache"
    assert not (tmp_path / "machine-cache").exists()  # (the machine's cache is left as it was)


def _benchmark_script(name: str, monkeypatch):
    """benchmarks/<name>.py, imported as a module (its `import common` finds benchmarks/common.py)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", BENCHMARKS / f"{name}.py")
    script = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, script)  # (its dataclasses look their module up there)
    spec.loader.exec_module(script)
    return script


def test_offpolicys_auto_side_decides_in_its_warm_up_and_its_timed_runs_take_the_choice(monkeypatch, tmp_path):
    """offpolicy.py's docstring said `accelerate="auto"` searched in its untimed warm-up run; it waited for the
    updates to pay for a search, which the warm-up never reached, so the auto row timed fp32 (or a choice an earlier
    run had left in the machine's cache). Its warm-up decides now, into the script's cache, which its timed runs
    take the choice from."""
    from rlspeed import DQN
    from rlspeed.fused import precision as fused_precision

    monkeypatch.setattr(fused_precision, "reduced_matmul_supported", lambda device, p: p == "bf16-matmul")  # (any CPU)
    monkeypatch.setenv("RLSPEED_CACHE_DIR", str(tmp_path / "machine-cache"))
    chosen_by = []

    def run(seed: int, steps: int) -> None:
        model = DQN("CartPole-v1", device="cpu", seed=seed, accelerate="auto", learning_starts=32, train_freq=8,
                    batch_size=16)
        model.learn(steps, progress_bar=False)
        chosen_by.append(model.acceleration_summary()["chosen_by"])

    _benchmark_script("offpolicy", monkeypatch).warm_up({"rlspeed-accelerate": run}, 64)
    run(1, 64)  # (a timed run)
    assert chosen_by == ["search", "cache"]
    assert not (tmp_path / "machine-cache").exists()  # (the machine's cache is left as it was)


def test_fused_updates_auto_side_decides_in_its_warm_up(monkeypatch):
    """fused_updates.py said its accelerate="auto" model chose its precision at the first, untimed call; it waited
    for the updates to pay for a search, which the warm-up block never reached, so the timed blocks ran fp32."""
    from rlspeed.fused import precision as fused_precision

    monkeypatch.setattr(fused_precision, "reduced_matmul_supported", lambda device, p: p == "bf16-matmul")  # (any CPU)
    monkeypatch.setenv("RLSPEED_CACHE_DIR", "off")
    fused_updates = _benchmark_script("fused_updates", monkeypatch)
    build, step = fused_updates.dqn_case()
    models = {"fused": build(True, "off"), "accelerate": build(True, "auto")}
    fused_updates.warm_up(models, step, 3)
    assert models["accelerate"].acceleration_summary()["chosen_by"] == "search"


def _assert_sides_agree(script, env_id: str, hyperparameters: dict) -> None:
    """recurrent_ppo.py's rlspeed `hyperparameters` for `env_id` and its sb3-contrib arguments agree on every setting
    both have (a `lin_` schedule: the rate it starts from and its halving at mid-training)."""
    from rlspeed.algos.recurrent_ppo import RecurrentPPOConfig

    config = RecurrentPPOConfig(**hyperparameters)
    sb3 = script.sb3_arguments(env_id)
    names = {"n_steps": "num_steps", "batch_size": "batch_size", "n_epochs": "n_epochs", "gamma": "gamma",
             "gae_lambda": "gae_lambda", "learning_rate": "learning_rate", "clip_range": "clip_range",
             "ent_coef": "ent_coef", "use_sde": "use_sde", "sde_sample_freq": "sde_sample_freq"}
    for key in ("learning_rate", "clip_range"):  # (a lin_ schedule where rlspeed anneals)
        annealed = getattr(config, "anneal_lr" if key == "learning_rate" else "anneal_clip")
        value = sb3[key]
        assert callable(value) == annealed
        if callable(value):
            assert value(0.5) == 0.5 * value(1.0)
            sb3 = {**sb3, key: value(1.0)}
    sb3.setdefault("use_sde", False)  # (sb3-contrib's defaults where the entry sets none)
    sb3.setdefault("sde_sample_freq", -1)
    assert {key: getattr(config, name) for key, name in names.items()} == {key: sb3[key] for key in names}
    assert config.num_envs == script.NUM_ENVS_OF[env_id]
    policy = sb3["policy_kwargs"]
    assert (config.ortho_init, config.lstm_hidden_size, list(config.net_arch), config.activation) == (
        policy["ortho_init"], policy["lstm_hidden_size"], policy["net_arch"]["pi"], "relu")
    assert policy["net_arch"]["vf"] == policy["net_arch"]["pi"]
    assert policy["activation_fn"].__name__ == "ReLU" and policy["enable_critic_lstm"]
    assert config.normalize_obs and config.normalize_reward


def _recurrent_ppo_script(monkeypatch):
    """benchmarks/recurrent_ppo.py, where sb3-contrib and rl_zoo3 (whose entries it compares with) are installed."""
    pytest.importorskip("sb3_contrib")
    from rlspeed.presets import zoo

    if zoo.zoo_version() is None:
        pytest.skip("rl_zoo3 is not installed")
    return _benchmark_script("recurrent_ppo", monkeypatch)


def test_recurrent_ppo_benchmarks_pendulum_sides_run_rl_zoos_settings_into_their_own_section(monkeypatch):
    """recurrent_ppo.py --env PendulumNoVel-v1 times both libraries at RL-Zoo's ppo_lstm entry: rlspeed's side
    (`--preset zoo`'s translation) and sb3-contrib's agree on every setting both have, and the run writes its own
    README section and results file, not the published CartPoleNoVel-v1 one (its --learning run another again)."""
    script = _recurrent_ppo_script(monkeypatch)
    env_id = script.PENDULUM_ID
    hyperparameters, _ = script.rlspeed_hyperparameters(env_id)
    _assert_sides_agree(script, env_id, hyperparameters)
    assert not hyperparameters["anneal_lr"] and not hyperparameters["anneal_clip"]
    sections = [script.SECTION_OF[env_id], script.SECTION_OF[script.ENV_ID], script.LEARNING_SECTION]
    assert len(set(sections)) == 3 and sections[1] == "recurrent_ppo"


def test_recurrent_ppo_benchmarks_cartpole_sides_are_rl_zoos_entry(monkeypatch):
    """recurrent_ppo.py's CartPoleNoVel-v1 settings were written by hand (ZOO_RLSPEED, and sb3-contrib's arguments
    beside them), with nothing tying them to RL-Zoo's entry: they are `--preset zoo`'s translation of it, both
    sides agree on every setting, and part (b)'s shipped preset is the same but for RL-Zoo's ortho_init=False (which
    the preset leaves at rlspeed's orthogonal initialisation, as its comment says)."""
    from rlspeed.presets import load_preset, split_run_settings, zoo

    script = _recurrent_ppo_script(monkeypatch)
    env_id = script.ENV_ID
    translation = zoo.translate("recurrent_ppo", env_id)
    assert translation.status == "full"
    assert {**script.ZOO_RLSPEED, "net_arch": list(script.ZOO_RLSPEED["net_arch"])} == translation.hyperparameters
    assert script.rlspeed_hyperparameters(env_id)[0] == script.ZOO_RLSPEED
    _assert_sides_agree(script, env_id, script.ZOO_RLSPEED)
    _run, preset = split_run_settings(load_preset("recurrent_ppo", env_id))
    assert preset == {key: value for key, value in translation.hyperparameters.items() if key != "ortho_init"}


def test_recurrent_ppo_learning_section_gives_each_seed_the_means_and_says_which_side_is_behind(monkeypatch):
    """recurrent_ppo.py --learning's section: one row per seed with both evaluations of each side, a row of their
    means, and a sentence that says, per evaluation, which side's mean is behind and on how many seeds rlspeed leads
    (a reader choosing between the two reads the sentence, not only the table)."""
    script = _benchmark_script("recurrent_ppo", monkeypatch)

    def run(name: str, seed: int, half: float, end: float) -> dict:
        return {"name": name, "seed": seed, "env_backend": "gymnasium", "train_wall_s": 10.0,
                "evaluations": [[53_248, 1.0, half], [102_400, 2.0, end]]}

    runs = [run("sb3", 0, -600.0, -200.0), run("sb3", 1, -700.0, -300.0),
            run("rlspeed", 0, -650.0, -150.0), run("rlspeed", 1, -750.0, -400.0)]
    summary = script.learning_summary(runs)
    assert summary["rlspeed"]["mean"] == [-700.0, -275.0] and summary["sb3"]["mean"] == [-650.0, -250.0]
    assert summary["rlspeed_ahead_seeds"] == [[], [0]]
    settings = {"env_id": script.PENDULUM_ID, "budget": 102_400, "quick": False, "rlspeed_env_backend": "gymnasium",
                "device": "cpu", "threads": 1, "jobs": 2, "uptime_before": "before", "uptime_after": "after"}
    text = "\n".join(script.learning_report(runs, summary, settings))
    assert "| 1 | -750.0 | -700.0 | -400.0 | -300.0 |" in text
    assert "| mean of 2 | -700.0 | -650.0 | -275.0 | -250.0 |" in text
    assert "after 102,400 steps rlspeed's mean return is -275.0, sb3-contrib's -250.0 (rlspeed behind on the mean " \
           "by 25.0, ahead on 1 of 2 seeds)" in text
    level = [run("sb3", 0, -600.0, -200.0), run("rlspeed", 0, -600.0, -150.0)]  # (equal means are neither side's)
    assert "(rlspeed level on the mean by 0.0, ahead on 0 of 1 seeds)" in "\n".join(
        script.learning_report(level, script.learning_summary(level), settings))


def test_sb3s_time_to_target_evaluates_on_the_seeds_rlspeeds_learn_evaluates_on(monkeypatch):
    """The scripts' SB3 side reseeded each evaluation with seed + 100,000 + steps ("as rlspeed does"), while rlspeed's
    learn evaluates on `evaluation_seed(seed, "learn", steps)`: the two sides played other episodes. Each evaluation
    now takes the seed rlspeed's learn takes after as many steps."""
    evaluation = pytest.importorskip("stable_baselines3.common.evaluation")
    from rlspeed.evaluation import evaluation_seed

    common = _benchmarks_common()

    class EvalEnv:
        def __init__(self):
            self.seeds = []

        def seed(self, seed):
            self.seeds.append(seed)

    monkeypatch.setattr(evaluation, "evaluate_policy", lambda *args, **kwargs: (0.0, 0.0))
    eval_env = EvalEnv()
    callback = common.sb3_target_callback(eval_env, 100, 7, 475.0, episodes=10)
    callback.model = types.SimpleNamespace(num_timesteps=256)  # (SB3's BaseCallback reads the model's steps)
    callback._on_rollout_start()
    assert eval_env.seeds == [evaluation_seed(7, "learn", 256)]


def test_her_fetch_without_gymnasium_robotics_exits_with_one_sentence_before_any_run(monkeypatch):
    """Without gymnasium-robotics her_fetch.py ended in a ModuleNotFoundError traceback; it says what to install."""
    script = _benchmark_script("her_fetch", monkeypatch)
    monkeypatch.setitem(sys.modules, "gymnasium_robotics", None)  # (its import raises ImportError, as where missing)
    with pytest.raises(SystemExit, match="needs gymnasium-robotics .*: pip install gymnasium-robotics pettingzoo"):
        script._register()


class _GoalEnv:
    """Two-step episodes whose last info is `infos[episode]` (episode by reset seed - 100), reward -1 per step."""

    spec = types.SimpleNamespace(id="Goal-v0")

    def __init__(self, infos):
        self.infos, self.episode, self.steps = infos, 0, 0

    def reset(self, seed):
        self.episode, self.steps = seed - 100, 0
        return 0, {}

    def step(self, action):
        self.steps += 1
        done = self.steps == 2
        return 0, -1.0, done, False, self.infos[self.episode] if done else {}

    def close(self):
        pass


def test_goal_episodes_reads_the_success_flag_as_rlspeed_does():
    """`goal_episodes` read `info["is_success"]` only: a benchmark on PointMaze or AntMaze (which give
    `info["success"]`, as rlspeed's `success_key` reads) said 0% success whatever the model did. It reads rlspeed's
    keys now, a 0/1 number as Fetch gives it counts, and an env with no flag stops it with one sentence."""
    common = _benchmarks_common()
    infos = [{"success": True}, {"success": False}, {"is_success": np.float32(1.0)}, {"is_success": False}]
    result = common.goal_episodes(_GoalEnv(infos), lambda obs: 0, 4, seed=100)
    assert result == {"success_rate": 0.5, "mean_return": -2.0}
    with pytest.raises(SystemExit, match="Goal-v0's last step info .* gives no success flag"):
        common.goal_episodes(_GoalEnv([{"success": True}, {}]), lambda obs: 0, 2, seed=100)
