"""What every registered algorithm (`rlspeed.algos.ALGORITHMS`) must do, run for each: a new algorithm gets these
tests by being registered. It trains a few hundred steps to finite weights, saves and loads (built as a constructed
model is, same actions), refuses an unknown hyperparameter with one sentence, and says which update runs."""

from __future__ import annotations

import copy
import csv
import dataclasses
import pickle
import re
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlspeed.algos import ALGORITHMS
from rlspeed.algos.base import build_config
from rlspeed.errors import UserError
from rlspeed.policy_kwargs import ON_POLICY

#: short runs that update at least once (off-policy algorithms start learning after learning_starts)
QUICK = {"num_envs": 4}
OFF_POLICY_QUICK = {"learning_starts": 64, "batch_size": 32}


def _env_and_config(algo):
    config_fields = set(algo.config_cls.__dataclass_fields__)
    config = {k: v for k, v in {**QUICK, **OFF_POLICY_QUICK}.items() if k in config_fields}
    if "num_steps" in config_fields:
        config["num_steps"] = 32
        if "batch_size" in config_fields:
            config["batch_size"] = 64
    env_id = "CartPole-v1" if algo.supports_discrete else "Pendulum-v1"
    return env_id, config


@pytest.fixture(scope="module", params=sorted(ALGORITHMS))
def trained(request, tmp_path_factory):
    algo = ALGORITHMS[request.param]
    env_id, config = _env_and_config(algo)
    folder = tmp_path_factory.mktemp(request.param)
    model = algo(env_id, device="cpu", seed=0, **config).learn(512, progress_bar=False, run_dir=folder / "run")
    path = model.save(folder / "model.safetensors")
    return algo, env_id, config, model, path


def documented_metrics() -> dict[str, list[str]]:
    """docs/cli.md's table of metrics.csv's columns: each column name -> the "algorithms" cells of its rows."""
    page = (Path(__file__).resolve().parent.parent / "docs" / "cli.md").read_text(encoding="utf-8")
    table = page[page.index("`metrics.csv`'s columns"):].split("\n\n")[1]
    columns: dict[str, list[str]] = {}
    for line in table.splitlines()[2:]:
        names, algorithms = line.split(" | ")[:2]
        for name in re.findall(r"`([^`]+)`", names):
            columns.setdefault(name, []).append(algorithms)
    return columns


def test_every_metrics_column_is_documented_for_its_algorithm(trained):
    """Each column an algorithm's metrics.csv has is a row of docs/cli.md's table whose algorithms are all, or name
    this one (a script comparing algorithms reads the table to know which columns mean the same)."""
    algo, _, _, model, path = trained
    with open(path.parent / "run" / "metrics.csv", newline="", encoding="utf-8") as handle:
        header = next(csv.reader(handle))
    documented = documented_metrics()
    undocumented = [column for column in header if column not in documented]
    assert undocumented == [], f"{algo.__name__} writes columns docs/cli.md's table lacks"
    elsewhere = [column for column in header
                 if not any(cell.startswith("all") or re.search(rf"\b{algo.__name__}\b", cell)
                            for cell in documented[column])]
    assert elsewhere == [], f"docs/cli.md gives these {algo.__name__} columns to other algorithms only"


def test_trains_to_finite_weights(trained):
    algo, _, _, model, _ = trained
    assert model.num_timesteps >= 512
    for name, module in model._modules().items():
        tensors = [module] if isinstance(module, torch.Tensor) else list(module.state_dict().values())
        assert all(torch.isfinite(t).all() for t in tensors if t.is_floating_point()), name


def test_load_is_construction_plus_saved_state(trained):
    algo, env_id, config, model, path = trained
    loaded = algo.load(path, device="cpu")
    fresh = algo(env_id, device="cpu", **config)
    assert set(vars(loaded)) == set(vars(fresh))  # no attribute missing or extra: load builds through __init__
    assert loaded.update_summary() == fresh.update_summary()
    assert loaded.seed == 0 and loaded.num_timesteps == model.num_timesteps
    obs = np.random.default_rng(0).standard_normal((5, *model.spec.observation_shape)).astype(np.float32)
    np.testing.assert_array_equal(loaded.predict(obs)[0], model.predict(obs)[0])
    space = model.action_space  # (Stable-Baselines3's attributes: the spec's spaces)
    assert space == loaded.action_space == model.spec.action_space
    assert model.observation_space == loaded.observation_space == model.spec.observation_space
    actions = model.predict(obs)[0]
    assert all(space.contains(np.asarray(a, dtype=space.dtype)) for a in actions)


def test_unknown_hyperparameter_is_one_sentence(trained):
    algo, env_id, _, _, _ = trained
    with pytest.raises(UserError, match="Unknown hyperparameter 'learning_rat'.*learning_rate"):
        algo(env_id, device="cpu", learning_rat=1e-3)
    # (Stable-Baselines3's keywords say what to write instead)
    with pytest.raises(UserError, match="'policy_kwargs' is Stable-Baselines3's keyword; .*plain keywords") as told:
        algo(env_id, device="cpu", policy_kwargs={"net_arch": [64, 64], "optimizer_class": torch.optim.SGD})
    # (the algorithm's own network keywords: PPO was told to write n_critics=... and lstm_hidden_size=...)
    assert ("n_critics=..." in str(told.value)) == (algo.name in ("sac", "td3", "ddpg"))
    assert ("lstm_hidden_size=..." in str(told.value)) == (algo.name == "recurrent_ppo")
    assert ("log_std_init=..." in str(told.value)) == ("log_std_init" in algo.config_cls.__dataclass_fields__)
    # (and which, where an option is refused: SB3's activation_fn class by rlspeed's name)
    with pytest.raises(UserError, match=r"plain keywords .*: here activation='leaky_relu', net_arch=\[32\]; "):
        algo(env_id, device="cpu", policy_kwargs={"activation_fn": torch.nn.LeakyReLU, "net_arch": [32],
                                                  "features_extractor_class": torch.nn.Flatten})
    # (options that are all rlspeed's settings are taken as them, saved under rlspeed's names; by RL-Zoo's
    # translation's rule, per algorithm: PPO was told to write n_critics=3)
    given = {"n_critics": 3, "features_extractor_kwargs": {"features_dim": 64}}
    if algo.name in ("sac", "td3"):
        assert build_config(algo.config_cls, {"policy_kwargs": given}) == build_config(
            algo.config_cls, {"n_critics": 3, "cnn_features_dim": 64})
    elif algo.name == "ddpg":  # (as the keyword: DDPG has one critic)
        with pytest.raises(UserError, match=r"DDPG has n_critics=1 \(got 3\)"):
            build_config(algo.config_cls, {"policy_kwargs": given})
    else:
        with pytest.raises(UserError) as refusal:
            algo(env_id, device="cpu", policy_kwargs=given)
        assert str(refusal.value).endswith(f": here cnn_features_dim=64; policy_kwargs.n_critics=3: rlspeed's "
                                           f"{algo.name} has no such option.")
    # (each rule once, after the options it refuses: "builds its own optimizer" was said once per option)
    with pytest.raises(UserError) as refusal:
        build_config(algo.config_cls, {"policy_kwargs": {"optimizer_class": torch.optim.SGD, "optimizer_kwargs": {}}})
    assert f"; policy_kwargs.optimizer_class={torch.optim.SGD!r}, policy_kwargs.optimizer_kwargs={{}}: rlspeed's " \
           f"{algo.name} builds its own optimizer" in str(refusal.value)
    assert str(refusal.value).count("builds its own optimizer") == 1
    # (a subclass's config of its own is read by its algorithm's rule: MyPPOConfig was taken for an off-policy
    # "my_ppo", whose dict net_arch is pi/qf, and refused PPO's pi/vf)
    mine = dataclasses.make_dataclass(f"My{algo.config_cls.__name__}", [("extra", int, 1)], bases=(algo.config_cls,))
    if algo.name in ON_POLICY:
        assert build_config(mine, {"policy_kwargs": {"net_arch": {"pi": [32], "vf": [32]}}}).net_arch == (32,)
    # (SB3's tensorboard_log="tb" (nearly every SB3 tutorial) is the model's: learn writes its runs there; a
    # hyperparameter's place, a preset's or --set's, says where it goes)
    assert algo(env_id, device="cpu", tensorboard_log=Path("tb")).tensorboard_log == "tb"
    with pytest.raises(UserError, match=r"'tensorboard_log' is Stable-Baselines3's keyword; it is a model's argument, "
                                        r"not a hyperparameter \(Algo\(env, tensorboard_log=DIR\).*learn\(run_dir="):
        build_config(algo.config_cls, {"tensorboard_log": "tb"})
    # (SB3's keywords at its defaults, which ask for nothing, as a script writes them out: they were refused too;
    # stats_window_size=100, and SAC's action_noise=None and target_update_interval=1 (TD3's and DDPG's
    # action_noise=None is their "none", as SB3's))
    nothing = {"tensorboard_log": None, "policy_kwargs": {}, "_init_setup_model": True, "stats_window_size": 100,
               **({"rollout_buffer_kwargs": None} if algo.name in ON_POLICY else
                  {"replay_buffer_class": None, "optimize_memory_usage": False}),
               **({"target_update_interval": 1, "action_noise": None} if algo.name == "sac" else {})}
    assert build_config(algo.config_cls, nothing) == build_config(algo.config_cls, {})
    with pytest.raises(UserError, match="'stats_window_size' is Stable-Baselines3's keyword; .*each log interval"):
        build_config(algo.config_cls, {"stats_window_size": 10})
    if algo.name == "sac":  # (a noise object: SAC adds none, TD3's and DDPG's settings named)
        with pytest.raises(UserError, match="'action_noise' is Stable-Baselines3's keyword; .*SAC explores by "
                                            "sampling its own policy"):
            build_config(algo.config_cls, {"action_noise": object()})
    if algo.name in ("sac", "td3", "ddpg"):  # (SAC's do-nothing target_update_interval is SAC's alone)
        with pytest.raises(UserError, match="'target_update_interval' is Stable-Baselines3's keyword"):
            build_config(algo.config_cls, {"target_update_interval": 1 if algo.name != "sac" else 2})
    with pytest.raises(UserError, match="'rollout_buffer_class' is Stable-Baselines3's keyword; rlspeed's on-policy "
                                        "algorithms have one rollout buffer of their own"):
        build_config(algo.config_cls, {"rollout_buffer_class": dict})
    # (SB3's policy options given as keywords: rlspeed's setting, or the override that does their work)
    for key, advice in (("features_extractor_class", "_build_policy override"),
                        ("features_extractor_kwargs", "features_dim is cnn_features_dim=N"),
                        ("share_features_extractor", "actor and critic share one encoder"),
                        ("optimizer_class", "_make_optimizer override"), ("optimizer_kwargs", "adam_eps")):
        with pytest.raises(UserError, match=f"'{key}' is Stable-Baselines3's keyword; .*{advice}"):
            algo(env_id, device="cpu", **{key: None})
    # (several agents at once, `PPO(..., population=K)`: the Population class, named)
    with pytest.raises(UserError, match=rf"'population' is not a hyperparameter of {algo.__name__}: .*"
                                        rf"rlspeed.population.Population\({algo.__name__}, env_id, seeds=range\(K\)"):
        algo(env_id, device="cpu", population=4)


def test_stable_baselines3_calls_and_bad_seeds_are_one_sentence(trained):
    """`PPO("MlpPolicy", env)` (Stable-Baselines3's first line), extra positional arguments and seeds Gymnasium
    cannot take are refused when the model is made, not with a TypeError or at the first env reset."""
    algo, env_id, _, _, _ = trained
    with pytest.raises(UserError, match=rf"no policy name.*write {algo.__name__}\('{env_id}', \.\.\.\)"):
        algo("MlpPolicy", env_id, device="cpu")
    # (the env by name after it, as SB3's examples write it too: Python's "got multiple values for argument 'env'")
    with pytest.raises(UserError, match=rf"no policy name.*write {algo.__name__}\('{env_id}', \.\.\.\)"):
        algo("CnnPolicy", env=env_id, device="cpu")
    with pytest.raises(UserError, match="takes one positional argument, the env"):
        algo(env_id, "cpu")
    # (an env object after the policy name: the example writes it as it is, or a single env by its id)
    single = gym.make(env_id)
    vector = gym.vector.SyncVectorEnv([lambda: gym.make(env_id)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    for env, written in ((single, f"'{env_id}'"), (vector, "env")):
        with pytest.raises(UserError, match=rf"no policy name.*write {algo.__name__}\({written}, \.\.\.\)\.$"):
            algo("MultiInputPolicy", env, device="cpu")
    single.close()
    vector.close()

    class ActorCriticPolicy(torch.nn.Module):  # (Stable-Baselines3's policy class, passed first)
        pass

    with pytest.raises(UserError, match=rf"no policy class \(ActorCriticPolicy, .*net_arch=, activation=.*override "
                                        rf"_build_policy.*write {algo.__name__}\('{env_id}', \.\.\.\)"):
        algo(ActorCriticPolicy, env_id, device="cpu")
    for seed in (-1, "a", 1.5, 2**32):
        with pytest.raises(UserError, match="A seed is a whole number from 0 to 2\\*\\*32 - 1"):
            algo(env_id, device="cpu", seed=seed)
    assert algo(env_id, device="cpu", seed=np.int64(3)).seed == 3
    model = trained[3]
    size = model.spec.observation_shape[0]
    for wrong in (np.zeros(size + 1), np.zeros((2, 1, size))):  # (another length; an extra axis)
        with pytest.raises(UserError, match=rf"takes observations of shape \({size},\) \(one\) or \(N, {size}\)"):
            model.predict(wrong)
    with pytest.raises(UserError, match="episodes must be a whole number >= 1, got 0"):
        model.evaluate(episodes=0)
    assert model.evaluate(episodes=2.0, seed=0)["episodes"] == 2  # (a whole number written as a float, as the CLI)
    for keyword, value, words in (("reset_num_timesteps", True, "always continues the model's step count"),
                                  ("log_interval", 10, "log_interval_s"),
                                  ("progres_bar", False, "did you mean progress_bar")):
        with pytest.raises(UserError, match=words):
            model.learn(64, **{keyword: value})
    # (SB3's positional log_interval, third: its 1 was taken as progress_bar=True, its 4 refused without the name)
    for count in (1, np.int64(4)):
        with pytest.raises(UserError, match=rf"^learn's progress_bar is True or False, not {count} \(given third by "
                                            r"position, it is Stable-Baselines3's log_interval, a count: "
                                            r"learn\(log_interval_s=...\)"):
            model.learn(64, None, count)
    # (a run's name as the target, SB3's tb_log_name: refused naming it; a number as text: the number to write, no
    # argument positions for a keyword)
    with pytest.raises(UserError, match=r"^learn's target_return is a number \(or None for no target\), not 'run' "
                                        r"\(a run's name, Stable-Baselines3's tb_log_name, is given by name: "
                                        r"learn\(total_timesteps, tb_log_name=...\)"):
        model.learn(64, None, True, "run")
    with pytest.raises(UserError, match=r"^learn's target_return is a number \(or None for no target\), not '195' "
                                        r"written as text: write target_return=195 without quotes\.$"):
        model.learn(64, target_return="195")
    with pytest.raises(UserError, match="total_timesteps is a whole number of env steps, got 1.5"):
        model.learn(1.5)
    with pytest.raises(UserError, match="total_timesteps must be 0 or more, got -64"):
        model.learn(-64)
    # (a string was taken as True: progress_bar="no" showed the bar)
    for keyword in ("progress_bar", "confirm_target"):
        with pytest.raises(UserError, match=rf"learn\({keyword}=...\) is True or False, got 'no'"):
            model.learn(64, **{keyword: "no"})
    with pytest.raises(UserError, match=r"evaluate\(progress_bar=...\) is True or False, got 'no'"):
        model.evaluate(episodes=1, progress_bar="no")


def test_learn_of_zero_steps_returns_the_model_as_it_was_as_sb3s(trained):
    """SB3's `learn(0, reset_num_timesteps=False)` (a loop of learn calls whose budget is spent) returns the model
    untrained; it was refused with a UserError. Nothing trains, no callback runs, the step count stays."""
    model = trained[3]
    steps_before, parameters = model.num_timesteps, [p.clone() for p in model.policy.parameters()]
    calls = []
    assert model.learn(0, callback=calls.append, reset_num_timesteps=False) is model
    assert model.num_timesteps == steps_before and model.result.total_timesteps == 0 and calls == []
    assert all(torch.equal(p, q) for p, q in zip(parameters, model.policy.parameters()))


@pytest.mark.parametrize("algo, options, counted", [
    ("ppo", {"num_steps": 100, "batch_size": 50, "n_epochs": 1}, 200),  # (iterations of 100 env steps: two finished)
    ("dqn", {"learning_starts": 10, "train_freq": 4}, 272),  # (iterations of 4)
])
def test_a_learn_interrupted_inside_an_iteration_counts_its_finished_iterations(monkeypatch, algo, options, counted):
    """As docs/checkpoints.md says (Stable-Baselines3 counts every env step): a learn interrupted at its 276th env
    step counts the steps of its finished iterations, as its result does; the next learn goes on from that count
    with fresh episodes (the steps of the iteration cut short were neither trained on nor kept)."""
    from rlspeed.envs.cartpole import CartPole

    step, reset, calls = CartPole.step, CartPole.reset, {"step": 0, "reset": 0}

    def interrupted(self, actions):
        calls["step"] += 1
        if calls["step"] == 276:
            raise KeyboardInterrupt
        return step(self, actions)

    def counted_reset(self, *args, **kwargs):
        calls["reset"] += 1
        return reset(self, *args, **kwargs)

    monkeypatch.setattr(CartPole, "step", interrupted)
    monkeypatch.setattr(CartPole, "reset", counted_reset)
    model = ALGORITHMS[algo]("CartPole-v1", seed=0, device="cpu", env_backend="torch", num_envs=1, net_arch=(8,),
                             **options)
    with pytest.raises(KeyboardInterrupt):
        model.learn(1_000, progress_bar=False)
    assert model.num_timesteps == model.result.total_timesteps == counted
    resets = calls["reset"]
    model.learn(100, progress_bar=False)
    assert model.num_timesteps == counted + 100 and calls["reset"] == resets + 1


def test_reset_num_timesteps_false_runs_the_schedules_over_the_whole_step_count_as_sb3():
    """SB3's way to continue a model (`learn(N, reset_num_timesteps=False)`, its docs' example) was refused: it is
    taken, and the schedules then span the model's whole step count from 0, as SB3's `progress_remaining` does
    (PPO's annealed learning rate starts the second call of N steps halfway, DQN's exploration goes on where it
    was); without it each call's schedules start again."""
    import rlspeed

    ppo = rlspeed.PPO("CartPole-v1", seed=0, device="cpu", env_backend="torch", num_envs=4, num_steps=32,
                      batch_size=128, n_epochs=1, learning_rate=1e-3)
    ppo.learn(256, progress_bar=False)
    progress = []
    ppo.learn(256, progress_bar=False, reset_num_timesteps=False,
              callback=lambda local: progress.append(ppo._progress_remaining()))
    # (SB3: 1 - num_timesteps / (256 + 256) after each iteration of 128 steps)
    assert progress == pytest.approx([1 - 384 / 512, 1 - 512 / 512])
    again = []
    ppo.learn(256, progress_bar=False, callback=lambda local: again.append(ppo._progress_remaining()))
    assert again == pytest.approx([0.5, 0.0])  # (rlspeed's own default: over the call's steps)
    dqn = rlspeed.DQN("CartPole-v1", seed=0, device="cpu", env_backend="torch", num_envs=4, learning_starts=64,
                      exploration_fraction=0.5, exploration_initial_eps=1.0, exploration_final_eps=0.0)
    dqn.learn(256, progress_bar=False)
    rates = []
    dqn.learn(256, progress_bar=False, reset_num_timesteps=False,
              callback=lambda local: rates.append(dqn.epsilon(dqn.num_timesteps)))
    assert rates[0] == pytest.approx(0.0)  # (past half of 512 steps: SB3's epsilon has reached its end)
    again = []
    dqn.learn(256, progress_bar=False, callback=lambda local: again.append(dqn.epsilon(dqn.num_timesteps)))
    assert again[0] > 0.5  # (rlspeed's own default: explores again from the start of the call)


def test_stable_baselines3_hyperparameter_spellings_are_taken_or_explained():
    """SB3's "auto" (SAC's entropy coefficient), None for a choice and an activation class are taken as rlspeed's
    spellings; RL-Zoo's lin_X string is refused with the way rlspeed anneals (a schedule function is taken:
    tests/test_schedule_functions.py); True or NaN for a float refused."""
    import rlspeed

    assert rlspeed.SAC("Pendulum-v1", device="cpu", ent_coef="auto").config.ent_coef is None
    sac = rlspeed.SAC("Pendulum-v1", device="cpu", ent_coef="auto_0.1", target_entropy="auto")
    assert (sac.config.ent_coef, sac.config.ent_coef_init, sac.config.target_entropy) == (None, 0.1, None)
    # auto_X sets the starting value whatever the keywords' order, and over a saved config's (load, a run's preset)
    for given in ({"ent_coef": "auto_0.1", "ent_coef_init": 0.5}, {"ent_coef_init": 0.5, "ent_coef": "auto_0.1"}):
        assert rlspeed.SAC("Pendulum-v1", device="cpu", **given).config.ent_coef_init == 0.1
    for algo, env_id, key in ((rlspeed.PPO, "CartPole-v1", "ent_coef"), (rlspeed.PPO, "CartPole-v1", "clip_range_vf")):
        with pytest.raises(UserError, match="not a valid float"):  # (no "auto" there: None would mean another thing)
            algo(env_id, device="cpu", **{key: "auto"})
    td3 = rlspeed.TD3("Pendulum-v1", device="cpu", action_noise=None, activation=torch.nn.ReLU)
    assert (td3.config.action_noise, td3.config.activation) == ("none", "relu")
    with pytest.raises(UserError, match="give the starting value, and anneal_lr=True"):
        rlspeed.PPO("CartPole-v1", device="cpu", learning_rate="lin_3e-4")
    with pytest.raises(UserError, match="not a valid float"):
        rlspeed.PPO("CartPole-v1", device="cpu", gamma=True)


@pytest.mark.parametrize(("algo", "key", "value"), [
    ("PPO", "gamma", float("nan")), ("PPO", "log_std_init", "nan"), ("PPO", "clip_range", float("inf")),
    ("PPO", "clip_range", 1e39), ("TD3", "action_noise_std", float("inf")), ("DQN", "adam_eps", "inf"),
    ("A2C", "rms_prop_eps", float("-inf")), ("SAC", "ent_coef_init", "1e300")])
def test_a_float_hyperparameter_out_of_float32s_finite_range_is_refused_from_any_source(algo, key, value, tmp_path,
                                                                                       capsys):
    """NaN, infinities and values no float32 tensor holds are refused, whether they come as floats, as strings or
    from a preset file (YAML's .inf): nothing trains on them."""
    import yaml

    import rlspeed
    from rlspeed import cli

    env_id = "CartPole-v1" if algo in ("DQN",) or (algo in ("PPO", "A2C") and key != "log_std_init") else "Pendulum-v1"
    with pytest.raises(UserError, match=f"'{key}' got .*finite number within float32's range"):
        getattr(rlspeed, algo)(env_id, device="cpu", **{key: value})
    preset = tmp_path / "preset.yaml"
    preset.write_text(f"{key}: {value if isinstance(value, str) else yaml.safe_dump(value).splitlines()[0]}\n")
    code = cli.main(["train", algo.lower(), env_id, "--preset", str(preset), "--total-timesteps", "64",
                     "--out", str(tmp_path / "run"), "--no-progress"])
    assert code == 2 and "finite number" in capsys.readouterr().err and not (tmp_path / "run").exists()


def test_ddpg_refuses_td3s_settings():
    """DDPG with twin critics, a policy delay or target smoothing is TD3 recorded as DDPG: refused, naming td3."""
    import rlspeed

    for key, value in (("n_critics", 2), ("policy_delay", 2), ("target_policy_noise", 0.2)):
        with pytest.raises(UserError, match=f"DDPG has {key}=.*train td3"):
            rlspeed.DDPG("Pendulum-v1", device="cpu", **{key: value})


@pytest.mark.parametrize(("setting", "value"), [("eval_freq", 0), ("eval_freq", -5), ("checkpoint_freq", 0),
                                                ("eval_episodes", 0), ("eval_freq", "abc"),
                                                ("target_return", float("nan")), ("target_return", "abc")])
def test_learns_run_settings_are_checked_before_training(setting, value, tmp_path):
    """learn's run settings (eval_freq, checkpoint_freq, eval_episodes: whole numbers >= 1; target_return: a finite
    number) are checked before any step: one sentence naming the setting."""
    import rlspeed

    model = rlspeed.PPO("CartPole-v1", device="cpu", num_envs=2, num_steps=16, batch_size=32)
    with pytest.raises(UserError, match=setting):
        model.learn(64, run_dir=tmp_path / "run", progress_bar=False, **{setting: value})
    assert model.num_timesteps == 0


def test_says_which_update_runs_and_why(trained):
    model = trained[3]
    choice = model.update_summary()
    assert choice["implementation"] in ("hand-derived", "autograd", "autograd+graphs") and choice["reason"]
    assert choice["implementation"] in model.report()


def test_refuses_an_action_space_it_cannot_act_in(trained):
    algo = trained[0]
    other = "Pendulum-v1" if algo.supports_discrete and not algo.supports_continuous else None
    other = other or ("CartPole-v1" if not algo.supports_discrete else None)
    if other is None:
        pytest.skip(f"{algo.__name__} supports Discrete and Box actions")
    with pytest.raises(UserError, match="needs"):
        algo(other, device="cpu")


def test_stable_baselines3_option_spellings_port_or_say_what_to_do():
    """SB3 2.x's `net_arch=dict(pi=..., vf=...)` with equal widths, `train_freq=(4, "step")` and torch's class names
    for activations are taken; unequal widths, per-episode training, HER and SB3-only options are one sentence each."""
    import rlspeed

    ppo = rlspeed.PPO("CartPole-v1", device="cpu", net_arch=dict(pi=[32, 32], vf=[32, 32]), activation="ReLU")
    assert (ppo.config.net_arch, ppo.config.activation) == ((32, 32), "relu")
    assert rlspeed.DQN("CartPole-v1", device="cpu", train_freq=(4, "step")).config.train_freq == 4
    # the tuple written as text (`--set "train_freq=(1, episode)"`, a YAML file): read as the tuple, not as an int
    assert rlspeed.DQN("CartPole-v1", device="cpu", train_freq="(4, 'step')").config.train_freq == 4
    with pytest.raises(UserError, match="no per-episode training frequency"):
        rlspeed.DQN("CartPole-v1", device="cpu", train_freq="(1, episode)")
    assert rlspeed.SAC("Pendulum-v1", device="cpu", net_arch={"pi": [64], "qf": [64]}).config.net_arch == (64,)
    refusals = [(rlspeed.PPO, "CartPole-v1", {"net_arch": dict(pi=[64], vf=[32])}, "one list of layer widths"),
                (rlspeed.DQN, "CartPole-v1", {"train_freq": (1, "episode")}, "no per-episode training frequency"),
                (rlspeed.DQN, "CartPole-v1", {"train_freq": (4, "steps")}, r"its unit is .step."),
                (rlspeed.SAC, "Pendulum-v1", {"replay_buffer_class": object}, "HerReplayBuffer"),
                (rlspeed.A2C, "CartPole-v1", {"target_kl": 0.01}, "target_kl is a setting of PPO and RecurrentPPO"),
                (rlspeed.SAC, "Pendulum-v1", {"target_update_interval": 2}, "after every gradient step"),  # (1: taken)
                (rlspeed.SAC, "Pendulum-v1", {"ent_coef": "autox"}, "got 'autox': expected auto, auto_X"),
                (rlspeed.PPO, "CartPole-v1", {"clip_range": "lin_0.2"}, "anneal_clip=True"),
                # (a partial dict: SB3 gives the network left out no hidden layers, or refuses; never both these widths)
                (rlspeed.PPO, "CartPole-v1", {"net_arch": dict(pi=[32])}, r"dict\(pi=\[...\], vf=\[...\]\)"),
                (rlspeed.PPO, "CartPole-v1", {"net_arch": dict(qf=[32])}, r"dict\(pi=\[...\], vf=\[...\]\)"),
                (rlspeed.SAC, "Pendulum-v1", {"net_arch": dict(pi=[32], vf=[32])}, r"dict\(pi=\[...\], qf="),
                (rlspeed.DQN, "CartPole-v1", {"net_arch": dict(pi=[32], vf=[32])}, "DQN's Q-network takes one list"),
                # (whole-number settings: NumPy and torch scalars are never truncated)
                (rlspeed.PPO, "CartPole-v1", {"num_steps": np.float32(16.5)}, "'num_steps' got .*16.5"),
                (rlspeed.DQN, "CartPole-v1", {"batch_size": torch.tensor(16.7)}, "'batch_size' got .*16.7")]
    for algo, env_id, options, message in refusals:
        with pytest.raises(UserError, match=message):
            algo(env_id, device="cpu", **options)


def _parameter_count(model) -> int:
    """The parameters of the networks a model acts and learns with (no target copies), as SB3's policy has them."""
    names = ("q_network",) if hasattr(model, "q_network") else ("actor", "critic") if hasattr(model, "actor") else (
        "policy",)
    return sum(parameter.numel() for name in names for parameter in getattr(model, name).parameters())


@pytest.mark.parametrize("algo_name, env_id, policy_kwargs, keywords", [
    # (SB3 2.x's dict form, its class for the activation; SB3's net_arch list is separate actor and critic of those
    # widths, as rlspeed's; the activation left out is SB3's default, Tanh on-policy and ReLU off-policy, as rlspeed's)
    ("PPO", "Pendulum-v1", {"net_arch": {"pi": [32, 32], "vf": [32, 32]}, "activation_fn": torch.nn.ReLU,
                            "ortho_init": False, "log_std_init": -2.0},
     {"net_arch": [32, 32], "activation": "relu", "ortho_init": False, "log_std_init": -2.0}),
    ("A2C", "Pendulum-v1", {"net_arch": [16]}, {"net_arch": [16]}),
    ("SAC", "Pendulum-v1", {"net_arch": [32, 32], "n_critics": 3, "share_features_extractor": False},
     {"net_arch": [32, 32], "n_critics": 3}),
    ("TD3", "Pendulum-v1", {"net_arch": [24], "activation_fn": torch.nn.Tanh},
     {"net_arch": [24], "activation": "tanh"}),
    ("DQN", "CartPole-v1", {"net_arch": [32]}, {"net_arch": [32]}),
])
def test_stable_baselines3_policy_kwargs_build_the_networks_sb3_builds(algo_name, env_id, policy_kwargs, keywords):
    """SB3's policy_kwargs whose options are all rlspeed's network settings are taken as them (they were refused,
    naming them): the model is the one rlspeed's own keywords make, saved under rlspeed's names, and has as many
    parameters as SB3's policy made of the same policy_kwargs."""
    sb3 = pytest.importorskip("stable_baselines3")
    import rlspeed

    algo = getattr(rlspeed, algo_name)
    mapped = algo(env_id, device="cpu", seed=0, policy_kwargs=policy_kwargs)
    assert mapped.config == algo(env_id, device="cpu", seed=0, **keywords).config
    theirs = getattr(sb3, algo_name)("MlpPolicy", env_id, device="cpu", policy_kwargs=policy_kwargs)
    networks = [theirs.policy.actor, theirs.policy.critic] if hasattr(theirs.policy, "actor") else [
        theirs.policy.q_net if algo_name == "DQN" else theirs.policy]
    assert _parameter_count(mapped) == sum(p.numel() for network in networks for p in network.parameters())
    activation = type(next(layer for layer in theirs.policy.modules() if layer.__class__.__module__ ==
                           "torch.nn.modules.activation"))
    assert mapped.config.activation == activation.__name__.lower()


def test_stable_baselines3_policy_kwargs_given_twice_or_beyond_rlspeeds_networks_are_one_sentence():
    """A setting given both in policy_kwargs and as its keyword is refused naming both; an option rlspeed's networks
    have not leaves the whole dict refused, naming the keywords of those it has."""
    import rlspeed

    with pytest.raises(UserError, match=r"policy_kwargs sets net_arch, and net_arch=\[8\] is given too"):
        build_config(rlspeed.PPO.config_cls, {"policy_kwargs": {"net_arch": [8]}, "net_arch": [8]})
    with pytest.raises(UserError, match=r"here net_arch=\[8\]; policy_kwargs.share_features_extractor=False: rlspeed's "
                                        "PPO, A2C and RecurrentPPO share one encoder"):
        build_config(rlspeed.PPO.config_cls, {"policy_kwargs": {"net_arch": [8], "share_features_extractor": False}})
    with pytest.raises(UserError, match="rlspeed picks its encoder from the observation space"):
        build_config(rlspeed.SAC.config_cls, {"policy_kwargs": {"features_extractor_class": torch.nn.Flatten}})


@pytest.mark.parametrize("buffer_class", ["stable_baselines3", "rlspeed", "name"])
def test_stable_baselines3_her_replay_buffer_is_rlspeeds_her(buffer_class):
    """SB3's HER example, replay_buffer_class=HerReplayBuffer with replay_buffer_kwargs=dict(n_sampled_goal=4,
    goal_selection_strategy="future"), is her=True with those settings, saved under rlspeed's names (it was refused,
    naming them); an option or a strategy rlspeed's HER has not is one sentence naming what it has."""
    import rlspeed

    if buffer_class == "stable_baselines3":
        buffer_class = pytest.importorskip("stable_baselines3.her").HerReplayBuffer
    elif buffer_class == "rlspeed":
        from rlspeed.buffers import HerReplayBuffer as buffer_class
    else:
        buffer_class = "HerReplayBuffer"
    for algo in (rlspeed.SAC, rlspeed.DQN, rlspeed.TD3):
        config = build_config(algo.config_cls, {"replay_buffer_class": buffer_class, "replay_buffer_kwargs": dict(
            n_sampled_goal=2, goal_selection_strategy="FINAL", handle_timeout_termination=True)})
        assert config == build_config(algo.config_cls, {"her": True, "n_sampled_goal": 2,
                                                        "goal_selection_strategy": "final"})
    assert build_config(rlspeed.SAC.config_cls, {"replay_buffer_class": buffer_class}).her
    refusals = [({"goal_selection_strategy": "random"}, "one of future, final, episode"),
                ({"copy_info_dict": True}, "copy_info_dict=True: rlspeed's Hindsight Experience Replay takes "
                                           "n_sampled_goal and goal_selection_strategy"),
                ("n_sampled_goal=4", "expected a dict of HerReplayBuffer's options")]
    for options, message in refusals:
        with pytest.raises(UserError, match=message):
            build_config(rlspeed.SAC.config_cls, {"replay_buffer_class": buffer_class,
                                                        "replay_buffer_kwargs": options})
    with pytest.raises(UserError, match="replay_buffer_class=HerReplayBuffer sets n_sampled_goal, and "):
        build_config(rlspeed.SAC.config_cls, {"replay_buffer_class": buffer_class, "n_sampled_goal": 3,
                                                    "replay_buffer_kwargs": {"n_sampled_goal": 2}})


def test_stable_baselines3_model_attributes_say_what_to_use_instead(trained):
    """`model.get_env()` (SB3's first README example), `get_parameters`, `q_net`, ...: an AttributeError that names
    rlspeed's way; other missing attributes stay plain AttributeErrors (hasattr and getattr defaults work)."""
    model = trained[3]
    with pytest.raises(AttributeError, match=r"get_env is Stable-Baselines3's; .*make_training_env"):
        model.get_env()
    with pytest.raises(AttributeError, match=r"get_parameters is Stable-Baselines3's; .*state_dict"):
        model.get_parameters()
    name = type(model).__name__
    for attribute, advice in (("set_logger", r"learn\(run_dir=DIR\) writes the metrics .*self.logger.record"),
                              ("logger", ".*metrics.csv"), ("n_steps", r"model.config.num_steps"),
                              ("n_envs", r"model.config.num_envs"),
                              ("policy_kwargs", r"model.config.net_arch"), ("ent_coef_optimizer", "model.log_alpha"),
                              ("log_ent_coef", r"model.log_alpha.exp\(\)"), ("ep_info_buffer", "'episode_return'"),
                              ("replay_buffer", r"len\(model.buffer\) transitions .*sample\(n\) a dict"),
                              ("rollout_buffer", r"\[num_steps, num_envs\] tensors obs, .*advantages and returns"),
                              ("set_random_seed", r"Algo\(env, seed=S\), Algo.load\(path, seed=S\)")):
        with pytest.raises(AttributeError, match=rf"^{name}.{attribute} is Stable-Baselines3's; .*{advice}"):
            getattr(model, attribute)
    with pytest.raises(AttributeError, match=r"model.config.gamma"):  # (a hyperparameter, also where SB3's is named)
        _ = model.gamma
    if name != "DQN":
        with pytest.raises(AttributeError, match="target_update_interval is Stable-Baselines3's; only DQN takes it"):
            _ = model.target_update_interval
    assert not hasattr(model, "no_such_attribute") and getattr(model, "replay_buffer", None) is None


#: per algorithm, an attribute of Stable-Baselines3's `model.policy` that rlspeed's lacks, the advice its error gives
#: and that advice run (it must work as the message says)
_SB3_POLICY_NAMES = {
    "ppo": ("predict_values", r"model.policy.value\(obs\), of shape \[B\]", lambda m, obs: m.policy.value(obs)),
    "a2c": ("evaluate_actions", r"model.policy.evaluate\(obs, actions\) returns \(log_probs, entropy, values\)",
            lambda m, obs: m.policy.evaluate(obs, torch.zeros(len(obs)))[2]),
    "recurrent_ppo": ("predict_values", r"model.policy.value_step\(obs, state\)",
                      lambda m, obs: m.policy.value_step(obs, m.policy.initial_state(len(obs)))),
    "dqn": ("q_net", r"model.q_network.*Q-values \[B, n\]", lambda m, obs: m.policy(obs).amax(-1)),
    "sac": ("action_log_prob", r"model.actor.sample\(obs\) returns \(actions in \[-1, 1\], log_probs\)",
            lambda m, obs: m.actor.sample(obs)[1]),
    "td3": ("actor_target", "model.actor_target", lambda m, obs: m.actor_target(obs)[:, 0]),
    "ddpg": ("critic_target", "model.critic_target", lambda m, obs: m.critic_target(obs, m.actor(obs))[0]),
}


def test_stable_baselines3_policy_attributes_say_what_to_use_instead(trained):
    """`model.policy.predict_values(obs)`, `model.policy.optimizer`, `model.actor.action_log_prob(obs)`, ...: an
    attribute of Stable-Baselines3's policies that rlspeed's networks lack raises an AttributeError naming rlspeed's
    way, which works as it says (torch's error said only "object has no attribute"); other missing attributes stay
    plain AttributeErrors (hasattr and getattr defaults work)."""
    algo, env_id, _, model, _ = trained
    networks = [model.policy, *(getattr(model, name) for name in ("critic", "critic_target") if hasattr(model, name))]
    for network in networks:
        for attribute, advice in (("optimizer", "model.optimizer"), ("set_training_mode", r"train\(mode\)"),
                                  ("obs_to_tensor", "model.device"), ("features_extractor", "encoder"),
                                  ("predict", r"model.predict\(obs\)"), ("save", r"model.save\(path\) saves the "
                                  r"whole model"), ("load", r"Algo.load\(path\) \(or rlspeed.load\(path\)\)")):
            with pytest.raises(AttributeError, match=rf"^{type(network).__name__}.{attribute} is Stable-Baselines3's; "
                                                     rf".*{advice}"):
                getattr(network, attribute)
        assert not hasattr(network, "no_such_attribute") and getattr(network, "no_such_attribute", None) is None
    attribute, advice, advised = _SB3_POLICY_NAMES[algo.name]
    with pytest.raises(AttributeError, match=rf"^{type(model.policy).__name__}.{attribute} is Stable-Baselines3's; "
                                             rf".*{advice}"):
        getattr(model.policy, attribute)
    obs = torch.zeros((3, *model.observation_space.shape))
    with torch.no_grad():
        assert advised(model, obs).shape == (3,)

def test_the_buffer_before_the_first_learn_says_learn_makes_it(tmp_path):
    """`model.buffer` (where the `replay_buffer` hint sends people) before any learn: learn makes it, and the
    transitions `load_replay_buffer` read wait for it."""
    from rlspeed import DQN, PPO

    with pytest.raises(AttributeError, match=r"^PPO.buffer is made by learn, .* no learn has made it yet\.$"):
        _ = PPO("CartPole-v1", device="cpu").buffer
    # (SB3 users pre-fill `model.replay_buffer.add(...)` before learning: both names say how it is done here)
    for name in ("buffer", "replay_buffer"):
        with pytest.raises(AttributeError, match=r"demonstrations.* rlspeed.buffers.ReplayBuffer you fill and give to "
                                                 r"model.load_replay_buffer\(buffer\)"):
            getattr(DQN("CartPole-v1", device="cpu"), name)
    model = DQN("CartPole-v1", device="cpu", num_envs=2, learning_starts=0, batch_size=8).learn(32, progress_bar=False)
    path = model.save_replay_buffer(tmp_path / "replay")
    fresh = DQN("CartPole-v1", device="cpu", num_envs=2)
    fresh.load_replay_buffer(path)
    with pytest.raises(AttributeError, match=r"no learn has made it yet \(the transitions load_replay_buffer read go "
                                             r"into it then\)"):
        _ = fresh.buffer
    assert getattr(fresh, "buffer", None) is None
    fresh.learn(8, progress_bar=False)
    assert len(fresh.buffer) >= len(model.buffer)


def test_an_off_policy_run_that_cannot_update_says_so():
    """learning_starts at or beyond the steps a learn call stores (whole iterations): a warning says no update will
    run."""
    import rlspeed

    model = rlspeed.DQN("CartPole-v1", device="cpu", learning_starts=5000)
    with pytest.warns(UserWarning, match=r"learning_starts \(5,000\).*no gradient update will run"):
        model.learn(1000, progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rlspeed.DQN("CartPole-v1", device="cpu", learning_starts=100).learn(256, progress_bar=False)
        # (learn trains whole iterations: 100 steps of 8 envs are 104, past learning_starts=100)
        rlspeed.DQN("CartPole-v1", device="cpu", num_envs=8, learning_starts=100).learn(100, progress_bar=False)


def test_an_n_step_window_longer_than_the_run_says_no_update_will_run():
    """n_step=1000 on a 256-step learn stored no transition (each waits for the n_step steps after it) and trained
    nothing, without a word; an n_step that each env's steps reach stores and trains, and warns nothing."""
    import rlspeed

    model = rlspeed.DQN("CartPole-v1", device="cpu", n_step=1000, learning_starts=10, batch_size=8)
    with pytest.warns(UserWarning, match=r"n_step \(1,000\) is above the steps each env takes .*\(256\).*no gradient "
                                         r"update will run"):
        model.learn(256, progress_bar=False)
    assert len(model.buffer) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = rlspeed.DQN("CartPole-v1", device="cpu", num_envs=4, n_step=64, learning_starts=0, batch_size=8)
        model.learn(256, progress_bar=False)  # (64 steps of each of the 4 envs: one transition each)
        assert len(model.buffer) == 4


def test_an_off_policy_batch_too_big_for_memory_is_refused_before_training(monkeypatch):
    """A sampled batch's bytes are checked against the memory available, as the replay buffer's are: a batch_size
    that does not fit is one sentence before training."""
    import rlspeed
    from rlspeed.buffers import replay

    monkeypatch.setattr(replay, "available_memory", lambda device, needed=None: (2**20, replay.HOST))
    model = rlspeed.DQN("CartPole-v1", device="cpu", buffer_size=1000, batch_size=100_000)
    with pytest.raises(UserError, match=r"^A sampled batch of batch_size=100,000 needs about .*, more than .* it may "
                                        r"take .*; lower batch_size\.$"):
        model.learn(256, progress_bar=False)
    assert model.num_timesteps == 0
    rlspeed.DQN("CartPole-v1", device="cpu", buffer_size=1000, batch_size=64).learn(256, progress_bar=False)


def test_stable_baselines3_save_and_load_keywords_are_one_sentence(trained, tmp_path):
    """`model.save(io.BytesIO())`, `save(path, exclude=[...])`, `load(path, custom_objects=...)` and
    `PPO(policy="MlpPolicy", env=...)` are each one sentence saying what rlspeed does instead."""
    import io

    import rlspeed

    algo, env_id, _, model, path = trained
    with pytest.raises(UserError, match="save writes a file: give a path"):
        model.save(io.BytesIO())
    with pytest.raises(UserError, match="exclude: Stable-Baselines3's keywords"):
        model.save(tmp_path / "model", exclude=["env"])
    with pytest.raises(UserError, match="custom_objects: Stable-Baselines3's keywords"):
        algo.load(path, custom_objects={"learning_rate": 0.0})
    # (SB3's positional load(path, env) and evaluate_policy(model, env, n, deterministic): the argument named, not
    # "Unknown device 'cartpole-v1'" or "a seed ..., not False")
    for load, name in ((algo.load, f"{algo.__name__}.load"), (rlspeed.load, "rlspeed.load")):
        with pytest.raises(UserError, match=rf"^{name}'s second argument is the device \(Stable-Baselines3's is the "
                                            rf"env\): write {name}\(path, env=\.\.\.\)\.$"):
            load(path, env_id)
    with pytest.raises(UserError, match=r"evaluate_policy's fourth argument is deterministic, evaluate's is seed\): "
                                        r"write deterministic=False\.$"):
        rlspeed.evaluate(model, env_id, 2, False)
    with pytest.raises(UserError, match="'policy' is Stable-Baselines3's keyword; .*without a policy"):
        algo(env=env_id, policy="MlpPolicy", device="cpu")
    with pytest.raises(UserError, match="predict takes observations of shape .* as numbers, got 'abc'"):
        model.predict("abc")


def test_sb3_contrib_names_say_what_rlspeed_offers_in_their_place(capsys):
    """sb3-contrib's and RL-Zoo's algorithm names (MaskablePPO, ppo_lstm, QR-DQN, ...), its LSTM policy names and
    MaskablePPO.learn's use_masking: one sentence naming rlspeed's counterpart, not a bare list or a TypeError."""
    import rlspeed
    from rlspeed import cli

    with pytest.raises(ImportError, match="rlspeed has no MaskablePPO: rlspeed's ppo masks actions"):
        from rlspeed import MaskablePPO  # noqa: F401
    with pytest.raises(ImportError, match="rlspeed has no TQC \\(sb3-contrib's\\); sac"):
        from rlspeed import TQC  # noqa: F401
    with pytest.raises(ImportError, match="rlspeed has no top-level HerReplayBuffer: Hindsight Experience Replay is "
                                          "a setting of its DQN, SAC, TD3 and DDPG, her=True"):
        from rlspeed import HerReplayBuffer  # noqa: F401
    with pytest.raises(ImportError, match="action_noise='normal' or 'ornstein-uhlenbeck' with action_noise_std"):
        from rlspeed import NormalActionNoise  # noqa: F401
    with pytest.raises(ImportError, match="action_noise='normal' or 'ornstein-uhlenbeck' with action_noise_std"):
        from rlspeed import VectorizedActionNoise  # noqa: F401
    noise = pytest.importorskip("stable_baselines3.common.noise")  # (SB3's object passed in: the setting named)
    # (SB3's object of mean 0 and one sigma for every action dimension, as its TD3 example writes it, is the setting
    # that makes that noise here: it was refused; saved as the setting, not the object)
    td3, ddpg = rlspeed.TD3.config_cls, rlspeed.DDPG.config_cls
    assert build_config(td3, {"action_noise": noise.NormalActionNoise(np.zeros(2), 0.2 * np.ones(2))}) == \
        build_config(td3, {"action_noise": "normal", "action_noise_std": 0.2})
    assert build_config(ddpg, {"action_noise": noise.OrnsteinUhlenbeckActionNoise(
        np.zeros(2), 0.3 * np.ones(2), theta=0.2, dt=0.05)}) == build_config(ddpg, {
            "action_noise": "ornstein-uhlenbeck", "action_noise_std": 0.3, "ou_theta": 0.2, "ou_dt": 0.05})
    with pytest.raises(UserError, match=r"sets action_noise_std=0\.2, and action_noise_std=0\.1 is given too"):
        build_config(td3, {"action_noise": noise.NormalActionNoise(np.zeros(2), 0.2 * np.ones(2)),
                           "action_noise_std": 0.1})
    # (the refusal says which objects are taken: it said a name only, though these are taken)
    with pytest.raises(UserError, match="takes a name, or Stable-Baselines3's NormalActionNoise or OrnsteinUhlenbeck"
                                        "ActionNoise of mean 0 with one sigma .*, not this NormalActionNoise object: "
                                        "action_noise='normal'"):
        rlspeed.TD3("Pendulum-v1", action_noise=noise.NormalActionNoise(np.ones(1), 0.1 * np.ones(1)))  # (mean 1)
    with pytest.raises(UserError, match="not this VectorizedActionNoise object: action_noise='normal'"
                                        ".*every env draws its own noise"):  # (SB3's way to give n_envs > 1 noise)
        rlspeed.DDPG("Pendulum-v1", action_noise=noise.VectorizedActionNoise(
            noise.OrnsteinUhlenbeckActionNoise(np.zeros(1), 0.1 * np.ones(1)), n_envs=2))
    with pytest.raises(AttributeError, match="use rlspeed.EvalCallback"):
        rlspeed.MaskableEvalCallback  # noqa: B018
    # (attribute lookups keep their AttributeError: hasattr and getattr with a default work as for any name)
    assert not hasattr(rlspeed, "MaskablePPO") and getattr(rlspeed, "TQC", None) is None
    assert not hasattr(rlspeed, "NoSuchName")
    for name, words in (("maskable_ppo", "use ppo"), ("ppo_lstm", "is recurrent_ppo"), ("qrdqn", "dqn .* closest"),
                        ("TQC", "sac .* closest"), ("trpo", "ppo is the closest")):
        assert cli.main(["train", name, "CartPole-v1"]) == 2
        assert re.search(f"Unknown algorithm '{name}': .*{words}", capsys.readouterr().err)
    with pytest.raises(UserError, match=r"sb3-contrib's RecurrentPPO policy: .*rlspeed.RecurrentPPO\('CartPole-v1'"):
        rlspeed.PPO("MlpLstmPolicy", "CartPole-v1")
    with pytest.raises(UserError, match=r"learn takes no 'use_masking': it is a setting of the model.*PPO\(env, "):
        rlspeed.PPO("CartPole-v1", num_envs=2, num_steps=16, batch_size=32).learn(32, use_masking=False)


def test_load_takes_sb3_action_noise_over_the_saved_noise(tmp_path):
    # (load's overrides read SB3's noise object as the constructor does: TD3.load(path, action_noise=NormalActionNoise
    # (sigma=0.3)) was refused as 'action_noise_std=0.2 is given too', the 0.2 being the file's own setting)
    from rlspeed import TD3
    noise = pytest.importorskip("stable_baselines3.common.noise")
    path = tmp_path / "td3"
    TD3("Pendulum-v1", action_noise_std=0.2, verbose=0).save(path)
    loaded = TD3.load(path, action_noise=noise.NormalActionNoise(np.zeros(1), 0.3 * np.ones(1)))
    assert (loaded.config.action_noise, loaded.config.action_noise_std) == ("normal", 0.3)


def test_tensorboard_log_runs_are_numbered_as_stable_baselines3_numbers_them(tmp_path, monkeypatch):
    """SB3's `tensorboard_log=DIR` was refused: learn writes each run in DIR/<tb_log_name>_N, N as SB3's
    get_latest_run_id gives it (one past the largest; reset_num_timesteps=False: the largest, continued)."""
    from rlspeed.algos.base import tensorboard_run_dir
    utils = pytest.importorskip("stable_baselines3.common.utils")

    for name in ("PPO_1", "PPO_3", "PPO_x", "PPO_2_1", "first_run_7", "first_run_a_9"):
        (tmp_path / name).mkdir()
    (tmp_path / "PPO_12").write_text("")  # (a file counts as SB3 globs it)
    for name in ("PPO", "first_run", "first_run_a", "PPO_2", "A2C", "[x]"):
        latest = utils.get_latest_run_id(str(tmp_path), name)
        assert tensorboard_run_dir(str(tmp_path), name) == tmp_path / f"{name}_{latest + 1}"
        assert tensorboard_run_dir(str(tmp_path), name, new_run=False) == tmp_path / f"{name}_{latest}"
    assert tensorboard_run_dir(str(tmp_path), "PPO") == tmp_path / "PPO_13"
    # (learn writes under the home directory a "~" names: its runs are counted there, not in a folder named "~",
    # where none is, so every call made PPO_1 again)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert tensorboard_run_dir("~", "PPO") == tmp_path / "PPO_13"
    assert tensorboard_run_dir("~", "PPO", new_run=False) == tmp_path / "PPO_12"


def test_tensorboard_log_is_where_learn_writes_its_runs(tmp_path):
    """A model made with tensorboard_log=DIR writes each learn call's run (metrics.csv; TensorBoard events where
    tensorboard is installed) in DIR/NAME_N, as SB3's TensorBoard runs; reset_num_timesteps=False continues the
    last; an explicit run_dir wins; the directory is saved with the model; a callback's self.locals["tb_log_name"] is
    the run's name (it was None by default); tb_log_name that names nothing is one sentence; a population, whose
    members' would write nothing, refuses it."""
    from rlspeed import PPO
    from rlspeed.population import Population

    model = PPO("CartPole-v1", device="cpu", num_envs=2, num_steps=16, batch_size=32, n_epochs=1, verbose=0,
                tensorboard_log=tmp_path / "tb")
    names = []  # (a callback's self.locals["tb_log_name"]: the run's name, by default the algorithm's, as SB3's)
    model.learn(32, tb_log_name="first_run", callback=lambda local: names.append(local["tb_log_name"]))
    model.learn(32, tb_log_name="first_run", reset_num_timesteps=False)
    model.learn(32, callback=lambda local: names.append(local["tb_log_name"]))
    assert names == ["first_run", "PPO"]
    with open(tmp_path / "tb" / "first_run_1" / "metrics.csv", newline="") as file:
        assert [row["timesteps"] for row in csv.DictReader(file)][-1] == "64"
    assert sorted(path.name for path in (tmp_path / "tb").iterdir()) == ["PPO_1", "first_run_1"]
    model.learn(32, run_dir=tmp_path / "mine")
    assert (tmp_path / "mine" / "metrics.csv").is_file() and len(list((tmp_path / "tb").iterdir())) == 2
    assert PPO.load(model.save(tmp_path / "model")).tensorboard_log == str(tmp_path / "tb")
    with pytest.raises(UserError, match="tb_log_name names a run under the model's tensorboard_log, and run_dir is "
                                        "the run's directory itself: give one of them"):
        model.learn(32, run_dir=tmp_path / "other", tb_log_name="x")
    del model.__dict__["tensorboard_log"]  # (as a model pickled before the attribute: it trains, writing no run)
    assert model.learn(32).num_timesteps == 160
    model.tensorboard_log = None
    with pytest.raises(UserError, match=r"learn's tb_log_name='x' names a run under the model's tensorboard_log, and "
                                        r"this model has none: make it with PPO\(env, tensorboard_log=DIR\)"):
        model.learn(32, tb_log_name="x")
    with pytest.raises(UserError, match=r"tensorboard_log is a directory's path \(a str or pathlib.Path\) or None, "
                                        "not 5"):
        PPO("CartPole-v1", device="cpu", tensorboard_log=5)
    with pytest.raises(UserError, match=r"A population takes no tensorboard_log .*: its learn\(run_dir=DIR\)"):
        Population(PPO, "CartPole-v1", seeds=range(2), tensorboard_log=tmp_path / "tb")  # (its members' was unused)


def test_a_loaded_model_continues_the_tensorboard_log_run_it_wrote(tmp_path):
    """SB3's way to go on training, load then learn(reset_num_timesteps=False), was refused: the loaded model's run
    was its file's folder, so the last DIR/PPO_N, which the saved model wrote, was "the metrics.csv of another run".
    The file records the run the model last trained in: a loaded copy continues it; a model that did not write it
    is still refused (nothing replaces another run's rows)."""
    from rlspeed import PPO

    settings = dict(device="cpu", num_envs=2, num_steps=16, batch_size=32, n_epochs=1, verbose=0,
                    tensorboard_log=tmp_path / "tb")
    model = PPO("CartPole-v1", **settings)
    model.learn(32)
    loaded = PPO.load(model.save(tmp_path / "model"), device="cpu")
    loaded.learn(32, reset_num_timesteps=False)
    with open(tmp_path / "tb" / "PPO_1" / "metrics.csv", newline="") as file:
        assert [row["timesteps"] for row in csv.DictReader(file)][-1] == "64"
    assert [path.name for path in (tmp_path / "tb").iterdir()] == ["PPO_1"]
    rows = (tmp_path / "tb" / "PPO_1" / "metrics.csv").read_text()
    other = PPO("CartPole-v1", **settings)
    other.learn(32, run_dir=tmp_path / "other")
    with pytest.raises(UserError, match=r"PPO_1', the last run under tensorboard_log, which learn\(\.\.\., "
                                        r"reset_num_timesteps=False\) continues, holds the metrics.csv of another run, "
                                        r"which this model did not train in .*: learn without "
                                        r"reset_num_timesteps=False writes the next run '.*PPO_2'\.$"):
        PPO.load(other.save(tmp_path / "other_model"), device="cpu").learn(32, reset_num_timesteps=False)
    assert (tmp_path / "tb" / "PPO_1" / "metrics.csv").read_text() == rows


def test_stable_baselines3_noise_objects_without_their_arguments_are_one_sentence():
    # (the arguments of SB3's noise objects are private attributes: one of another SB3 version without them was
    # taken as mean 1 and refused as such, or, OU's theta or dt, an AttributeError)
    noise = pytest.importorskip("stable_baselines3.common.noise")
    from rlspeed import DDPG, TD3

    normal, ou = noise.NormalActionNoise(np.zeros(1), 0.1 * np.ones(1)), noise.OrnsteinUhlenbeckActionNoise(
        np.zeros(1), 0.1 * np.ones(1))
    del normal._mu, ou._dt
    with pytest.raises(UserError, match=r"action_noise=NormalActionNoise\(...\): .*\(no _mu\); give the settings "
                                        "instead: action_noise='normal', action_noise_std=SIGMA"):
        build_config(TD3.config_cls, {"action_noise": normal})
    with pytest.raises(UserError, match=r"\(no _dt\); give .*ou_theta=THETA, ou_dt=DT"):
        build_config(DDPG.config_cls, {"action_noise": ou})


def test_stable_baselines3_schedule_objects_with_a_setting_here_are_taken():
    """SB3's constant schedules (ConstantSchedule, FloatSchedule of a number, the deprecated constant_fn) are their
    value, held (anneal_lr=False: PPO's default anneals); off-policy, a learning rate's linear schedule to 0 over the
    whole run (LinearSchedule(start, 0, 1.0), get_linear_fn) is its start with anneal_lr, which decays it at SB3's
    progress; on-policy anneal_lr/anneal_clip decay at CleanRL's progress, so that schedule is one sentence saying
    so in a config (a model calls it as a schedule function, as any other: tests/test_schedule_functions.py);
    others, and functions of one's own, are no value of a config."""
    utils = pytest.importorskip("stable_baselines3.common.utils")
    from rlspeed import DQN, PPO, SAC

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (SB3's deprecation warnings of its functions)
        constant, linear = utils.constant_fn(5e-4), utils.get_linear_fn(1e-3, 0.0, 1.0)
    config = build_config(PPO.config_cls, {"learning_rate": utils.ConstantSchedule(1e-3), "clip_range": constant,
                                           "clip_range_vf": utils.FloatSchedule(0.3)})
    assert (config.learning_rate, config.anneal_lr, config.clip_range, config.anneal_clip, config.clip_range_vf) == \
        (1e-3, False, 5e-4, False, 0.3)
    for algo, schedule in ((DQN, utils.FloatSchedule(utils.LinearSchedule(3e-4, 0, 1.0))), (SAC, linear)):
        config = build_config(algo.config_cls, {"learning_rate": schedule})
        assert config.anneal_lr is True
        for progress in (1.0, 0.7, 0.25, 0.0):  # (rlspeed's decay: the value times the progress remaining)
            assert config.learning_rate * progress == pytest.approx(schedule(progress), rel=1e-12)
    for key in ("learning_rate", "clip_range"):
        with pytest.raises(UserError, match=f"{key}=LinearSchedule.*: PPO's anneal_.*=True decays {key} linearly to "
                                            "0 at CleanRL's progress .*; give .*=0.2, anneal_.*=True"):
            build_config(PPO.config_cls, {key: utils.LinearSchedule(0.2, 0, 1.0)})
    with pytest.raises(UserError, match=r"learning_rate=ConstantSchedule\(val=0.001\) holds learning_rate "
                                        r"\(anneal_lr=False\), and anneal_lr='on' is given too: give one of them"):
        build_config(PPO.config_cls, {"learning_rate": utils.ConstantSchedule(1e-3), "anneal_lr": "on"})
    for key, schedule in (("learning_rate", utils.LinearSchedule(1e-3, 1e-4, 1.0)),
                          ("learning_rate", utils.LinearSchedule(1e-3, 0, 0.5)), ("learning_rate", lambda _: 1e-3)):
        with pytest.raises(UserError, match=f"Hyperparameter '{key}' got .*A schedule function is given to a model"):
            build_config(DQN.config_cls, {key: schedule})
    with pytest.raises(UserError, match="Hyperparameter 'clip_range_vf' got .*A schedule function is given to"):
        build_config(PPO.config_cls, {"clip_range_vf": utils.LinearSchedule(0.2, 0, 1.0)})


def test_stable_baselines3_defaults_are_taken_in_numpys_types_and_bools_stay_bools():
    # (SB3's do-nothing defaults matched their exact Python type only: np.int64(100) from a config file or a sweep
    # was refused; True, which equals 1, must not pass for a count, nor 1 or 0 for a flag)
    from rlspeed import PPO, SAC

    taken = {"stats_window_size": np.int64(100), "_init_setup_model": np.True_, "optimize_memory_usage": np.False_}
    assert build_config(PPO.config_cls, taken) == build_config(PPO.config_cls, {})
    assert build_config(SAC.config_cls, {"target_update_interval": np.int32(1), "stats_window_size": 100.0}) == \
        build_config(SAC.config_cls, {})
    for config_cls, key, value in ((PPO.config_cls, "_init_setup_model", 1), (PPO.config_cls, "create_eval_env", 0),
                                   (SAC.config_cls, "target_update_interval", True),
                                   (PPO.config_cls, "stats_window_size", np.int64(10))):
        with pytest.raises(UserError, match=f"'{key}' is Stable-Baselines3's keyword"):
            build_config(config_cls, {key: value})


def test_stable_baselines3_settings_read_each_config_class_once(monkeypatch):
    # (a population builds a config per member, reading SB3's settings key by key: dataclasses.fields and the walk
    # over every algorithm class ran on each call)
    import rlspeed.algos.base as base
    from rlspeed import PPO

    values = {"n_steps": 64, "policy_kwargs": {"net_arch": [32]}, "stats_window_size": 100}
    base.build_config(PPO.config_cls, values)
    read, fields = [], dataclasses.fields
    monkeypatch.setattr(base.dataclasses, "fields", lambda *args: read.append("fields") or fields(*args))
    monkeypatch.setattr(base, "_algorithm_classes", lambda: read.append("classes") or {})
    assert base.sb3_settings(PPO.config_cls, values) == {"num_steps": 64, "net_arch": [32], "stats_window_size": 100}
    assert read == []


def test_stable_baselines3_helpers_imported_from_rlspeed_say_what_to_use_instead():
    """A script ported by swapping `stable_baselines3` for `rlspeed` in its imports (`from rlspeed import
    make_vec_env`, `from rlspeed.evaluation import evaluate_policy`, ...) got a bare "cannot import name": now one
    sentence naming rlspeed's way; attribute lookups keep their AttributeError, as for any name."""
    import rlspeed
    import rlspeed.evaluation

    with pytest.raises(ImportError, match=r"rlspeed has no evaluate_policy \(Stable-Baselines3's\): "
                                          r"rlspeed.evaluate\(model, env, episodes=N\)"):
        from rlspeed.evaluation import evaluate_policy  # noqa: F401
    with pytest.raises(ImportError, match=r"rlspeed has no make_vec_env .*num_envs=N"):
        from rlspeed import make_vec_env  # noqa: F401
    with pytest.raises(ImportError, match=r"rlspeed has no set_random_seed .*seed=S"):
        from rlspeed import set_random_seed  # noqa: F401
    with pytest.raises(AttributeError, match=r"rlspeed has no VecNormalize .*normalize_obs=True"):
        rlspeed.VecNormalize  # noqa: B018
    with pytest.raises(AttributeError, match=r"rlspeed.evaluate\(model, env"):
        rlspeed.evaluate_policy  # noqa: B018
    assert getattr(rlspeed.evaluation, "evaluate_policy", None) is None and not hasattr(rlspeed, "Monitor")
    with pytest.raises(AttributeError, match="module 'rlspeed.evaluation' has no attribute 'no_such_name'"):
        rlspeed.evaluation.no_such_name  # noqa: B018


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_save_replay_buffer_is_refused_where_there_is_no_replay_buffer(name):
    """As `--save-replay-buffer` on the command line: an on-policy model refuses it in one sentence (it was taken and
    did nothing), by the keyword and by assigning `model.save_replay_buffer = True` later (which was taken while the
    keyword refused); False is taken. Text reads as a bool hyperparameter's: 'no' is False (its truth value turned
    replay saving on, or was refused as True by an on-policy model), 'maybe' is refused."""
    algo = ALGORITHMS[name]
    env_id = "CartPole-v1" if algo.supports_discrete else "Pendulum-v1"
    if algo.keeps_replay_buffer:
        assert algo(env_id, device="cpu", save_replay_buffer=True).save_replay_buffer
        model = algo(env_id, device="cpu", save_replay_buffer="no")
        assert model.save_replay_buffer == False  # noqa: E712  (a ReplayBufferSaving: compares as its bool)
        model.save_replay_buffer = "On"
        assert model.save_replay_buffer == True  # noqa: E712
        with pytest.raises(UserError, match=r"^save_replay_buffer is True or False .*, not 'maybe'\.$"):
            model.save_replay_buffer = "maybe"
    else:
        refusal = f"save_replay_buffer applies to off-policy algorithms .*{algo.__name__} keeps no replay buffer"
        with pytest.raises(UserError, match=refusal):
            algo(env_id, device="cpu", save_replay_buffer=True)
        model = algo(env_id, device="cpu", save_replay_buffer="no")
        with pytest.raises(UserError, match=refusal):
            model.save_replay_buffer = True
        model.save_replay_buffer = "off"
        assert model.save_replay_buffer == False  # noqa: E712  (a ReplayBufferSaving: compares as its bool)


def _assert_a_deep_copy_trains_apart(model, steps: int) -> None:
    """`copy.deepcopy(model)` trains `steps` steps, and neither it nor the original moves the other's weights."""
    import copy

    snapshot = copy.deepcopy(model)
    before = {k: v.clone() for k, v in model._state_tensors().items()}
    snapshot.learn(steps, progress_bar=False)
    assert all(torch.equal(v, before[k]) for k, v in model._state_tensors().items())
    assert any(not torch.equal(v, before[k]) for k, v in snapshot._state_tensors().items())


@pytest.mark.parametrize("algo, env_id, options", [
    ("PPO", "CartPole-v1", {"num_envs": 4, "num_steps": 16, "batch_size": 32, "n_epochs": 1}),
    ("A2C", "CartPole-v1", {"num_envs": 2, "num_steps": 8}),
    ("SAC", "Pendulum-v1", {"learning_starts": 16, "batch_size": 16}),
    ("DQN", "CartPole-v1", {"learning_starts": 16, "batch_size": 16}),
])
def test_a_deep_copy_of_a_trained_model_trains_on_its_own(algo, env_id, options, tmp_path):
    """A snapshot (`copy.deepcopy(model)`) predicted but failed its first update: a Parameter's deepcopy clones its
    data, and the hand-derived updates' flat buffers no longer held the copy's parameters. The copy trains now, and
    neither it nor the original moves the other's weights."""

    import rlspeed

    model = getattr(rlspeed, algo)(env_id, seed=0, device="cpu", **options)
    model.learn(64, progress_bar=False)
    _assert_a_deep_copy_trains_apart(model, 64)
    model.learn(64, progress_bar=False)


def test_a_deep_copy_of_a_model_on_a_vector_env_made_from_a_generator_trains_on_its_own():
    """Gymnasium 1.1 to 1.3 (rlspeed's floor is 1.1) give SyncVectorEnv its env constructors as a generator
    (`make_vec`), which it keeps, used up: `copy.deepcopy(model)` of a model on Gymnasium envs raised "cannot pickle
    'generator' object". A vector env made so by hand shows it on any Gymnasium."""

    import rlspeed

    envs = gym.vector.SyncVectorEnv((lambda: gym.make("CartPole-v1") for _ in range(2)),
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    model = rlspeed.PPO(envs, seed=0, device="cpu", num_steps=16, batch_size=32, n_epochs=1)
    model.learn(32, progress_bar=False)
    _assert_a_deep_copy_trains_apart(model, 32)


@pytest.mark.parametrize("algo, env_id, options", [
    ("PPO", "CartPole-v1", {"num_envs": 4, "num_steps": 16, "batch_size": 32, "n_epochs": 2}),
    ("A2C", "CartPole-v1", {"num_envs": 2, "num_steps": 8}),
    ("SAC", "Pendulum-v1", {"learning_starts": 16, "batch_size": 16}),
    ("TD3", "Pendulum-v1", {"learning_starts": 16, "batch_size": 16}),
    ("DQN", "CartPole-v1", {"learning_starts": 16, "batch_size": 16}),
])
def test_a_pickled_model_trains_as_the_original_would(algo, env_id, options):
    """A model sent to another process (pickled) trains on: plain pickle copied each view of the hand-derived
    updates' flat buffers on its own, so the copy's parameters left its optimizer's buffer (PPO, A2C, DQN: trained on
    gradients nothing read; SAC: refused). From the same random state, the copy's next updates equal the original's;
    DQN's target network follows a state loaded into the copy's online one."""
    import copy as copying
    import pickle

    import rlspeed

    model = getattr(rlspeed, algo)(env_id, seed=0, device="cpu", env_backend="torch", **options)
    model.learn(64, progress_bar=False)
    assert copying.copy(model).policy is model.policy  # (a shallow copy stays shallow)
    copy = pickle.loads(pickle.dumps(model))
    for each in (copy, model):
        torch.manual_seed(1)
        each.learn(64, progress_bar=False)
    assert all(torch.equal(a, b) for a, b in zip(copy._state_tensors().values(), model._state_tensors().values()))
    assert any(not torch.equal(a, b) for a, b in zip(copy._state_tensors().values(),
                                                      getattr(rlspeed, algo)(env_id, seed=0, device="cpu",
                                                                             **options)._state_tensors().values()))
    if algo == "DQN":
        copy.q_network.load_state_dict({k: torch.zeros_like(v) for k, v in copy.q_network.state_dict().items()})
        assert all(bool((v == 0).all()) for v in copy.q_target.state_dict().values())
        assert any(bool((v != 0).any()) for v in model.q_target.state_dict().values())


@pytest.mark.parametrize("algo, env_id, options", [
    ("PPO", "CartPole-v1", {"num_envs": 2, "num_steps": 16, "batch_size": 32, "n_epochs": 1}),
    ("DQN", "CartPole-v1", {"learning_starts": 16, "batch_size": 16, "save_replay_buffer": True}),
])
def test_a_seeded_models_run_is_its_own_whatever_draws_between_its_learn_calls(algo, env_id, options, tmp_path):
    """Self-play and A/B comparisons train several models in one process: model B's learn drew from torch's global
    generator, so another model made or trained between B's construction and its learn calls (or a sampled action,
    the caller's own draws) changed B's weights from those B trained alone reaches with the same seed. A seeded
    model's learn draws from its own streams and gives the caller's generator back as it found it; a checkpoint saved
    between learn calls resumes those streams."""
    import rlspeed

    def made(seed: int):
        return getattr(rlspeed, algo)(env_id, seed=seed, device="cpu", env_backend="torch", **options)

    def weights(model) -> list[torch.Tensor]:
        return [value.clone() for value in model._state_tensors().values()]

    alone = made(1)
    alone.learn(64, progress_bar=False)
    alone.learn(64, progress_bar=False)
    alone_twice = weights(alone)
    alone.learn(64, progress_bar=False)
    other, model = made(0), made(1)
    for _ in range(2):
        other.learn(64, progress_bar=False)  # (the other player's turn)
        torch.rand(7)  # (the caller's own draw)
        model.predict(np.zeros(model.spec.observation_space.shape, dtype=np.float32), deterministic=False)
        caller = torch.get_rng_state()
        model.learn(64, progress_bar=False)
        assert torch.equal(torch.get_rng_state(), caller)  # (the caller's stream as learn found it)
        if _ == 0:
            path = model.save(tmp_path / "model")
    assert all(torch.equal(a, b) for a, b in zip(weights(model), alone_twice))
    # (resumed from the checkpoint of a seeded run: the run's streams are its own from there, also across learn calls)
    resumed = getattr(rlspeed, algo).load(path, device="cpu", env_backend="torch")
    resumed.resume(path)
    torch.rand(3)
    caller = torch.get_rng_state()
    resumed.learn(64, progress_bar=False)
    assert torch.equal(torch.get_rng_state(), caller)
    assert all(torch.equal(a, b) for a, b in zip(weights(resumed), alone_twice))
    other.learn(64, progress_bar=False)
    resumed.learn(64, progress_bar=False)
    assert all(torch.equal(a, b) for a, b in zip(weights(resumed), weights(alone)))


def test_a_copy_of_a_seeded_model_made_inside_its_learn_draws_from_its_own_streams_and_gives_the_callers_back():
    """A callback's snapshot of the model (copy.deepcopy, pickle, copy.copy) made while learn had the model's streams
    in place held the caller's generator that learn would give back: the copy's own learn then trained on the caller's
    generator and, on its way out, set the caller's back to where it stood when the original's learn began. The copy
    holds the model's streams as they stood, and its learn gives the caller's generator back as it found it."""
    from rlspeed import PPO

    model = PPO("CartPole-v1", seed=3, device="cpu", env_backend="torch", num_envs=2, num_steps=16, batch_size=16,
                n_epochs=1)
    copies: list = []

    def snapshot(locals_) -> None:
        if not copies:
            taken = locals_["self"]
            copies.extend([copy.deepcopy(taken), pickle.loads(pickle.dumps(taken)), copy.copy(taken)])

    model.learn(64, progress_bar=False, callback=snapshot)
    for seed, each in enumerate(copies):  # (the shallow copy trains the model's own networks)
        torch.manual_seed(seed)
        caller = torch.get_rng_state()
        each.learn(32, progress_bar=False)
        assert torch.equal(torch.get_rng_state(), caller)
    deep, pickled = ([value.clone() for value in each._state_tensors().values()] for each in copies[:2])
    assert all(torch.equal(a, b) for a, b in zip(deep, pickled))  # (the same streams, whatever the caller's: one run)


def test_a_model_whose_env_another_model_stepped_since_its_last_learn_starts_its_episodes_afresh():
    """Two models given one env object (self-play, a teacher and its student) take turns: the first one's next learn
    went on from the observation it kept while the env was where the other left it, so its first transitions paired
    an observation with the step of another state. It now starts from a reset (said once): each observation of its
    rollout is followed by the one the env's dynamics give for it and the action taken."""
    from rlspeed import PPO, make_env

    options = {"device": "cpu", "num_steps": 8, "batch_size": 16, "n_epochs": 1}
    env = make_env("CartPole-v1", num_envs=2, device="cpu", seed=0, backend="torch")
    first, second = PPO(env, seed=0, **options), PPO(env, seed=1, **options)
    first.learn(16, progress_bar=False)
    second.learn(16, progress_bar=False)
    with pytest.warns(UserWarning, match="stepped or reset by something else .* start afresh from a reset"):
        first.learn(16, progress_bar=False)
    dynamics = make_env("CartPole-v1", num_envs=2, device="cpu", seed=0, backend="torch")
    dynamics.reset()
    buffer = first.buffer
    for step in range(buffer.obs.shape[0] - 1):  # (no episode of CartPole ends within 8 steps of a reset)
        dynamics.unwrapped.state = buffer.obs[step].clone()
        assert torch.allclose(dynamics.step(buffer.actions[step])[0], buffer.obs[step + 1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first.learn(16, progress_bar=False)  # (its own env's episodes, as it left them: they go on)
    # (a Gymnasium vector env given to two models, which each wrap it on their own)
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(2)],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    first, second = PPO(envs, seed=0, **options), PPO(envs, seed=1, **options)
    first.learn(16, progress_bar=False)
    second.learn(16, progress_bar=False)
    with pytest.warns(UserWarning, match="stepped or reset by something else"):
        first.learn(16, progress_bar=False)


def test_a_hyperparameter_set_on_the_model_is_refused_and_one_set_on_its_config_reaches_the_next_learn():
    """Stable-Baselines3 users set `model.ent_coef = ...` between stages: it made a new attribute nothing read, so
    training went on unchanged. It is refused, naming model.config; reading it says where it is. A learning rate set
    on model.config between learn calls reaches the optimisers (it was read once, at construction), while one set in
    their param_groups by hand holds until config.learning_rate changes."""
    from rlspeed import DQN, PPO, SAC

    for model in (PPO("CartPole-v1", device="cpu", num_envs=2, num_steps=16, anneal_lr=False),
                  DQN("CartPole-v1", device="cpu", learning_starts=0, batch_size=8)):
        with pytest.raises(UserError, match=r"model.learning_rate = \.\.\. changes nothing: .* set "
                                            r"model.config.learning_rate"):
            model.learning_rate = 0.5
        with pytest.raises(AttributeError, match="keeps its hyperparameters in model.config: model.config.gamma"):
            _ = model.gamma
        model.config.learning_rate = 3e-3  # (before the first learn too)
        model.learn(32, progress_bar=False)
        assert model.optimizer.param_groups[0]["lr"] == 3e-3
        model.optimizer.param_groups[0]["lr"] = 2e-3
        model.learn(32, progress_bar=False)
        assert model.optimizer.param_groups[0]["lr"] == 2e-3
        model.config.learning_rate = 1e-2
        model.learn(32, progress_bar=False)
        assert [group["lr"] for group in model.optimizer.param_groups] == [1e-2]
    sac = SAC("Pendulum-v1", device="cpu")
    sac.target_entropy = -2.0  # (an attribute of SAC's own, as of Stable-Baselines3's)
    assert sac.target_entropy == -2.0


def test_stable_baselines3_schedule_attributes_set_on_a_model_are_refused():
    """SB3's recipes change a loaded model's schedules by setting `model.lr_schedule`, `model.exploration_schedule`
    or `model.exploration_rate`: on an rlspeed model each was a new attribute nothing read (training and
    predict went on with the config's values). Setting one is refused, naming model.config; reading one says where it
    is."""
    from rlspeed import DQN, PPO

    ppo = PPO("CartPole-v1", device="cpu", num_envs=2, num_steps=16)
    with pytest.raises(UserError, match=r"model.lr_schedule = \.\.\. changes nothing: .*model.config.anneal_lr"):
        ppo.lr_schedule = lambda progress_remaining: 1e-4
    with pytest.raises(AttributeError, match=r"PPO.lr_schedule is Stable-Baselines3's; .*model.config.learning_rate"):
        _ = ppo.lr_schedule
    dqn = DQN("CartPole-v1", device="cpu")
    for name in ("exploration_rate", "exploration_schedule"):
        with pytest.raises(UserError, match=rf"model.{name} = \.\.\. changes nothing: .*exploration_final_eps"):
            setattr(dqn, name, 0.0)
        with pytest.raises(AttributeError, match=rf"DQN.{name} is Stable-Baselines3's; .*model.epsilon"):
            getattr(dqn, name)


@pytest.mark.parametrize("algo, env_id, options", [
    ("PPO", "CartPole-v1", {"num_envs": 4, "num_steps": 16, "batch_size": 32, "n_epochs": 2}),
    ("A2C", "CartPole-v1", {"num_envs": 2, "num_steps": 8}),
    ("SAC", "Pendulum-v1", {"learning_starts": 16, "batch_size": 16}),
    ("DQN", "CartPole-v1", {"learning_starts": 16, "batch_size": 16}),
])
def test_pretrained_values_given_as_new_parameter_data_are_what_trains(algo, env_id, options):
    """Behaviour cloning's transfer `param.data = pretrained` on a parameter other than the first left the
    hand-derived update training the old values in its flat buffer (while predict used the new ones), and
    `vector_to_parameters` failed with advice to rebuild the model: both train now as values copied in place do. A
    network put in place of the model's (`model.policy = other.policy`: acting, not training) is refused."""
    import rlspeed

    def made():
        return getattr(rlspeed, algo)(env_id, seed=0, device="cpu", env_backend="torch", **options)

    assigned, copied = made(), made()
    new = [torch.randn_like(p) for p in assigned.policy.parameters()]
    parameters = list(assigned.policy.parameters())
    parameters[-1].data = new[-1].clone()
    with torch.no_grad():
        list(copied.policy.parameters())[-1].copy_(new[-1])
    for model in (assigned, copied):
        assert model.update_summary()["implementation"] == "hand-derived"
        torch.manual_seed(1)
        model.learn(64, progress_bar=False)
    assert all(torch.equal(a, b) for a, b in zip(assigned._state_tensors().values(), copied._state_tensors().values()))
    torch.nn.utils.vector_to_parameters(torch.cat([value.flatten() for value in new]), assigned.policy.parameters())
    with torch.no_grad():
        for parameter, value in zip(copied.policy.parameters(), new):
            parameter.copy_(value)
    for model in (assigned, copied):
        torch.manual_seed(2)
        model.learn(64, progress_bar=False)
    assert all(torch.equal(a, b) for a, b in zip(assigned._state_tensors().values(), copied._state_tensors().values()))
    with pytest.raises(UserError, match=r"model.policy = \.\.\. would not be what trains: .*load_state_dict"):
        assigned.policy = made().policy

    class Wrapper(torch.nn.Module):  # (as torch.compile's: the same parameters, taken)
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, *args):
            return self.inner(*args)

    assigned.policy = Wrapper(assigned.policy)
    assigned.teacher = torch.nn.Linear(2, 2)  # (a network of the user's own, which no optimiser holds)
    assigned.teacher = torch.nn.Linear(2, 2)


@pytest.mark.parametrize(("algo", "env_id", "network"), [
    ("PPO", "CartPole-v1", "policy"), ("SAC", "Pendulum-v1", "actor"), ("DQN", "CartPole-v1", "q_network")])
def test_replaced_parameters_are_refused_not_left_untrained(algo, env_id, network):
    """`model.policy.load_state_dict(state, assign=True)` (or a layer put in place of one) gave the network new
    parameter tensors that no optimizer holds: learn trained the old ones and the policy never changed, silently.
    learn refuses it in one sentence; the in-place `load_state_dict` trains."""
    import rlspeed

    def made(seed):
        return getattr(rlspeed, algo)(env_id, seed=seed, device="cpu", env_backend="torch", learning_starts=0) \
            if algo != "PPO" else rlspeed.PPO(env_id, seed=seed, device="cpu", env_backend="torch")

    model = made(0)
    getattr(model, network).load_state_dict(getattr(made(1), network).state_dict(), assign=True)
    with pytest.raises(UserError, match=rf"{algo}.{network}'s parameter '.+' is not the tensor this model trains: "
                                        rf".*assign=True.*model.{network}.load_state_dict\(state\)"):
        model.learn(64, progress_bar=False)
    model = made(0)
    layer = next((name for name, child in getattr(model, network).named_modules()
                  if isinstance(child, torch.nn.Linear)), None)  # (PPO's policy holds its weights as tensors)
    if layer:  # (a layer swapped in: the same refusal)
        parent, _, leaf = layer.rpartition(".")
        owner = getattr(model, network).get_submodule(parent) if parent else getattr(model, network)
        old = getattr(owner, leaf)
        setattr(owner, leaf, torch.nn.Linear(old.in_features, old.out_features))
        with pytest.raises(UserError, match="is not the tensor this model trains"):
            model.learn(64, progress_bar=False)
    model = made(0)
    getattr(model, network).load_state_dict(getattr(made(1), network).state_dict())
    before = [p.detach().clone() for p in getattr(model, network).parameters()]
    model.learn(32, progress_bar=False)  # (a few updates move the weights)
    assert any(not torch.equal(a, b) for a, b in zip(before, getattr(model, network).parameters()))


def test_a_model_holding_a_gymnasium_env_that_cannot_pickle_says_to_send_a_file():
    """Gymnasium's vector env holds a local function: a model that had trained on one failed to pickle with
    "Can't pickle local object 'make_vec.<locals>.create_single_env'" from deep in torch.save, which under the spawn
    start method (macOS, Windows) is every `mp.Process(args=(model,))` of a model trained with the defaults."""
    import pickle

    import rlspeed

    vector = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    constructors = list(vector.env_fns)  # (Gymnasium 1.1 to 1.3: a used-up generator; the model's env holds [])
    vector.close()
    if not constructors:
        pytest.skip("Gymnasium before 1.4 keeps no env constructor in make_vec's sync vector env: its envs pickle")
    model = rlspeed.PPO("CartPole-v1", seed=0, device="cpu", env_backend="gymnasium", num_envs=2, num_steps=16)
    pickle.loads(pickle.dumps(model))  # (no env yet: it pickles)
    model.learn(32, progress_bar=False)
    with pytest.raises(UserError, match=r"This PPO holds the gymnasium env it trained on, which cannot be pickled "
                                        r"\(.*\): send the model as a file instead \(model.save\(path\) here, "
                                        r"PPO.load\(path\) in the other process\), close\(\) it first"):
        pickle.dumps(model)
    model.close()  # (a sweep's worker returning its trained model: the env goes, and learn makes it again)
    copy = pickle.loads(pickle.dumps(model))
    assert torch.equal(next(copy.policy.parameters()), next(model.policy.parameters()))
    assert copy.learn(32, progress_bar=False).num_timesteps == 64


def test_a_loaded_recurrent_model_pickles_for_multiprocessing(tmp_path):
    """Its update step was a closure ("Can't pickle local object 'autograd_step.<locals>.step'")."""
    import pickle

    import rlspeed

    model = rlspeed.RecurrentPPO("CartPole-v1", seed=0, device="cpu", num_envs=2, num_steps=8, batch_size=16)
    model.learn(32, progress_bar=False)
    loaded = rlspeed.RecurrentPPO.load(model.save(tmp_path / "model"))
    copy = pickle.loads(pickle.dumps(loaded))
    obs = np.zeros((1, 4), dtype=np.float32)
    assert np.array_equal(copy.predict(obs)[0], loaded.predict(obs)[0])


@pytest.mark.parametrize("where", ["in a no_grad block", "before training began"])
def test_an_interrupted_learn_gives_back_grad_mode_threads_and_denormals(monkeypatch, where):
    """A notebook's stop button (KeyboardInterrupt) landing inside the rollout's `torch.no_grad()` left grad mode off
    for the whole kernel, and one between setting the training threads and the loop's `try` left the model's thread
    count and denormal flushing: the caller's are given back wherever the interrupt lands (a population's learn too)."""
    import rlspeed.algos.base as base
    from rlspeed import PPO
    from rlspeed.device import flush_denormal_enabled
    from rlspeed.population import Population

    def interrupted(*args, **kwargs):
        if where == "in a no_grad block":
            torch.set_grad_enabled(False)  # (entered, and the interrupt came before its exit)
        raise KeyboardInterrupt

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    torch.set_flush_denormal(False)
    try:
        model = PPO("CartPole-v1", device="cpu", seed=0, num_envs=2, num_steps=16, batch_size=32, num_threads=1)
        population = Population(PPO, "CartPole-v1", seeds=[0, 1], env_backend="torch", num_envs=2, num_steps=16,
                                batch_size=32)
        if where == "in a no_grad block":
            monkeypatch.setattr(model, "_train_iteration", interrupted)
            monkeypatch.setattr(population, "train_iteration", interrupted)
        else:  # (right after the model's own settings were made, before the loop's try)
            import rlspeed.population.base as population_base

            monkeypatch.setattr(base, "set_flush_denormal", lambda enabled: torch.set_flush_denormal(enabled) and
                                enabled and interrupted())  # (set to True, then the interrupt)
            monkeypatch.setattr(population_base, "set_training_threads",
                                lambda count=None: torch.set_num_threads(1) or interrupted())
        for learner in (model, population):
            with pytest.raises(KeyboardInterrupt):
                learner.learn(64, progress_bar=False)
            assert torch.is_grad_enabled() and torch.get_num_threads() == 2 and not flush_denormal_enabled()
    finally:
        torch.set_grad_enabled(True)
        torch.set_num_threads(threads)


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_the_class_shows_its_constructors_arguments(name):
    """`help(PPO)`, a notebook's signature tip and `inspect.signature(PPO)` showed `(*args, **kwargs)` (the
    recording `__new__`'s) for every algorithm: they show its `__init__`'s, a subclass's own included."""
    import inspect

    algo = ALGORITHMS[name]
    parameters = inspect.signature(algo).parameters
    assert list(parameters)[0] == "env" and {"device", "seed", "env_kwargs"} <= set(parameters)

    class Own(algo):
        def __init__(self, env, width: int = 3, **kwargs):
            super().__init__(env, **kwargs)

    assert list(inspect.signature(Own).parameters) == ["env", "width", "kwargs"]


def test_a_setting_taken_only_when_the_model_is_built_and_changed_on_its_config_is_refused_by_learn():
    """The way to change a hyperparameter between stages is `model.config.<name> = ...` (the model's own attribute
    is refused, pointing there), but the settings the model takes only when it is built were then ignored in
    silence: SAC's `ent_coef` (fine-tuning with less entropy trained with the learnt one), `max_grad_norm`, the
    networks' shape, and, once an earlier learn made the replay buffer, `gamma` (its rows' discounts). learn refuses
    them in one sentence with the way that works; SAC takes a fixed temperature and the target entropy in place."""
    import math

    from rlspeed import DQN, PPO, SAC

    tiny = {"device": "cpu", "seed": 0, "net_arch": (8,)}
    sac = SAC("Pendulum-v1", learning_starts=8, batch_size=8, **tiny)
    sac.config.gamma = 0.5  # (before the learn that makes the buffer: taken)
    sac.learn(16, progress_bar=False)
    assert sac.buffer.discounts[:16].unique().tolist() == [0.5]
    log_alpha = sac.log_alpha.clone()
    sac.config.ent_coef = 0.1
    with pytest.raises(UserError, match=r"model.config.ent_coef is 0.1, but SAC takes ent_coef only when the model is "
                                        r"built, with 'auto', .* SAC.load\(path, ent_coef=0.1\)"):
        sac.learn(16, progress_bar=False)
    assert torch.equal(sac.log_alpha, log_alpha)
    sac.config.ent_coef, sac.config.gamma = None, 0.9
    with pytest.raises(UserError, match=r"model.config.gamma is 0.9, but the replay buffer an earlier learn made holds "
                                        r"transitions for 0.5, .* SAC.load\(path, gamma=0.9\)"):
        sac.learn(16, progress_bar=False)
    sac.config.gamma, sac.config.net_arch = 0.5, (16,)
    with pytest.raises(UserError, match=r"net_arch is \(16,\), but SAC takes net_arch only when the model is built, "
                                        r"with \(8,\), .* a new model takes another"):
        sac.learn(16, progress_bar=False)
    sac.config.net_arch = (8,)
    sac.learn(16, progress_bar=False)
    fixed = SAC("Pendulum-v1", learning_starts=8, batch_size=8, ent_coef=0.2, **tiny)
    fixed.learn(16, progress_bar=False)
    fixed.config.ent_coef, fixed.config.target_entropy = 0.05, -3.0
    fixed.learn(16, progress_bar=False)
    assert math.isclose(float(fixed.log_alpha.exp()), 0.05, rel_tol=1e-6) and fixed.target_entropy == -3.0
    fixed.config.ent_coef = "auto"  # (the learnt temperature, as the user writes it: not Python's None)
    with pytest.raises(UserError, match=r"^model.config.ent_coef is 'auto', but SAC takes ent_coef only when the model "
                                        r"is built, with 0.05, .* SAC.load\(path, ent_coef='auto'\)\.$"):
        fixed.learn(16, progress_bar=False)
    for model in (DQN("CartPole-v1", learning_starts=8, batch_size=8, **tiny),
                  PPO("CartPole-v1", num_envs=2, num_steps=8, batch_size=16, **tiny)):
        model.learn(16, progress_bar=False)
        model.config.max_grad_norm = 0.123
        with pytest.raises(UserError, match=rf"model.config.max_grad_norm is 0.123, but {type(model).__name__} takes "
                                            "max_grad_norm only when the model is built"):
            model.learn(16, progress_bar=False)


def test_setting_the_env_on_a_model_is_refused_naming_load_with_env():
    """Fine-tuning on a changed env the Stable-Baselines3 way, `model.env = venv`, made an attribute nothing read;
    `model.env_id = other` was taken by a learn that made new envs but ignored by one that kept the last learn's,
    and saved either way as the env the weights trained on. Both are refused, naming load(path, env=...)."""
    from rlspeed import DQN

    model = DQN("CartPole-v1", device="cpu", learning_starts=8, batch_size=8, net_arch=(8,))
    model.learn(16, progress_bar=False)
    for name in ("env", "env_id"):
        with pytest.raises(UserError, match=rf"model.{name} = \.\.\. does not change the env DQN trains on: .* "
                                            r"Algo.load\(path, env=\.\.\.\)"):
            setattr(model, name, "Acrobot-v1")
    model.env_id = "CartPole-v1"  # (its own id: nothing changes)
    assert model.env_id == "CartPole-v1"


def test_learn_refuses_a_misspelt_name_set_on_the_config_and_takes_sacs_auto_there():
    """`model.config.learnig_rate = 1e-5` between stages made an attribute nothing read (training went on at the old
    rate), and SAC's `model.config.ent_coef = "auto"`, which the constructor takes, was refused as no float."""
    from rlspeed import DQN, SAC

    dqn = DQN("CartPole-v1", device="cpu", learning_starts=4, batch_size=4, net_arch=(8,))
    dqn.config.learnig_rate = 1e-5
    with pytest.raises(UserError, match=r"^model.config.learnig_rate = \.\.\. changes nothing: Unknown hyperparameter "
                                        r"'learnig_rate' for DQN. Did you mean learning_rate\?$"):
        dqn.learn(8, progress_bar=False)
    sac = SAC("Pendulum-v1", device="cpu", learning_starts=4, batch_size=4, net_arch=(8,))
    sac.config.ent_coef = "auto"
    sac.learn(8, progress_bar=False)
    assert sac.config.ent_coef is None and sac.config.ent_coef_init == 1.0


@pytest.mark.parametrize("block", ["no_grad", "inference_mode"])
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_learn_trains_inside_a_callers_no_grad_or_inference_mode(name, block):
    """A learn called from a helper wrapped in `torch.no_grad()` or `torch.inference_mode()` failed with torch's
    "element 0 of tensors does not require grad" where the update takes its gradients with autograd (TD3, DDPG,
    RecurrentPPO on a CPU; every algorithm's graphed step on CUDA), and one inside inference_mode left inference
    tensors that a later learn outside it could not update: learn trains as outside the block, and the block's mode
    holds again when it returns."""
    algo = ALGORITHMS[name]
    env_id, config = _env_and_config(algo)
    model = algo(env_id, device="cpu", seed=0, **config)
    before = [p.detach().clone() for p in model.policy.parameters()]
    with getattr(torch, block)():
        model.learn(256, progress_bar=False)
        assert not torch.is_grad_enabled()
        assert torch.is_inference_mode_enabled() == (block == "inference_mode")
    assert any(not torch.equal(a, b) for a, b in zip(before, model.policy.parameters()))
    model.learn(128, progress_bar=False)  # (outside the block: what the first learn made trains on)
    assert model.num_timesteps >= 384 and torch.is_grad_enabled()


def test_a_model_built_or_loaded_inside_inference_mode_trains_outside_it(trained):
    """A model built, or loaded, inside a caller's `torch.inference_mode()` (an evaluation notebook's cell) held
    inference tensors (its parameters, a loaded optimizer's moments) that its learn outside the block then failed on:
    torch's "Inplace update to inference tensor outside InferenceMode" or "Inference tensors cannot be saved for
    backward". Both train as one made outside it."""
    algo, env_id, config, _, path = trained
    with torch.inference_mode():
        built = algo(env_id, device="cpu", seed=0, **config)
        loaded = algo.load(path, device="cpu")
    for model in (built, loaded):
        before = [p.detach().clone() for p in model.policy.parameters()]
        model.learn(256, progress_bar=False)
        assert any(not torch.equal(a, b) for a, b in zip(before, model.policy.parameters()))


def test_act_takes_a_float64_observation_tensor(trained):
    """`act` on a float64 tensor (one made under `torch.set_default_dtype(torch.float64)`, or from an env's float64
    array) failed in the first layer with torch's "mat1 and mat2 must have the same dtype": it acts as on the float32
    tensor, as `predict` does on float64 input."""
    _, _, _, model, _ = trained
    obs = torch.randn(5, *model.spec.observation_shape, dtype=torch.float64)
    if hasattr(model, "act_with_state"):  # (RecurrentPPO's act: from its LSTM state)
        assert torch.equal(model.act_with_state(obs, None, None)[0], model.act_with_state(obs.float(), None, None)[0])
    else:
        assert torch.equal(model.act(obs), model.act(obs.float()))


def test_a_copy_made_inside_inference_mode_trains_outside_it(trained):
    """`copy.deepcopy(model)` (or unpickling it) inside a caller's `torch.inference_mode()` (an evaluation helper
    keeping the best model so far) made inference tensors of the copy's parameters and optimizer state, and its learn
    outside the block failed with torch's "Inplace update to inference tensor outside InferenceMode"."""
    import copy
    import pickle

    algo, env_id, config, _, path = trained
    model = algo.load(path, device="cpu")  # (holding no env yet: it pickles)
    with torch.inference_mode():
        copies = [copy.deepcopy(model), pickle.loads(pickle.dumps(model))]
    for twin in copies:
        before = [p.detach().clone() for p in twin.policy.parameters()]
        twin.learn(256, progress_bar=False)
        assert any(not torch.equal(a, b) for a, b in zip(before, twin.policy.parameters()))


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_another_default_device_of_the_caller_leaves_a_cpu_model_as_without_it(name, monkeypatch, tmp_path):
    """A program that made another device torch's default (`torch.set_default_device("cuda")`; "meta" stands in for
    it here) got a CPU model built on that device (its initial weights drawn by that device's generator), `predict`
    failed converting a probe tensor made there to numpy, and `learn` read that device's denormal flushing (never
    on), then turned off the caller's CPU flushing as it ended; `save` moved the optimizer state there (torch.as_tensor
    follows the default device), a loaded model's first update copied its step count from there, and `export` made
    its example inputs there. Built, trained, saved, loaded, trained again, acting and exported as without it."""
    import rlspeed.envs.base as env_base
    from rlspeed.device import flush_denormal_enabled
    from rlspeed.export import export

    algo = ALGORITHMS[name]
    env_id, config = _env_and_config(algo)
    expected = algo(env_id, device="cpu", seed=0, **config)
    monkeypatch.setattr(env_base, "_NUMPY_DTYPES", {})  # (as in a fresh process: none looked up yet)
    flushing = flush_denormal_enabled()
    torch.set_flush_denormal(True)
    try:
        with torch.device("meta"):
            model = algo(env_id, device="cpu", seed=0, **config)
            for a, b in zip(model.policy.state_dict().values(), expected.policy.state_dict().values()):
                assert a.device.type == "cpu" and torch.equal(a, b)
            model.learn(128, progress_bar=False)
            obs = np.zeros(model.spec.observation_shape, dtype=np.float32)
            model.predict(obs)
            assert flush_denormal_enabled()
            model.save(tmp_path / "model.safetensors")
            loaded = algo.load(tmp_path / "model.safetensors")
            loaded.learn(128, progress_bar=False)
            export(loaded, tmp_path / "policy.pt", format="torchscript")
        policy = torch.jit.load(tmp_path / "policy.pt")
        batch = np.zeros((2, *model.spec.observation_shape), dtype=np.float32)
        if name != "recurrent_ppo":  # (whose graph also takes and gives the recurrent state: test_export's)
            actions = policy(torch.from_numpy(batch))
            np.testing.assert_allclose(actions.numpy(), loaded.predict(batch, deterministic=True)[0], atol=1e-5)
    finally:
        torch.set_flush_denormal(flushing)


def test_another_default_device_of_the_caller_leaves_recurrent_states_and_a_smaller_replay_on_the_cpu(tmp_path):
    """Under a caller's other default device ("meta" standing in for "cuda"), RecurrentPPO's `predict` made the state
    and episode_start passed back to it there (torch.as_tensor follows the default device), and a replay buffer
    loaded into a model of a smaller buffer_size took its rows in an order made there. Both act and load as
    without it."""
    from rlspeed import DQN, RecurrentPPO

    recurrent = RecurrentPPO("CartPole-v1", device="cpu", seed=0, num_envs=2, num_steps=16)
    obs = np.random.default_rng(0).normal(size=(2, 4)).astype(np.float32)
    first, state = recurrent.predict(obs)
    expected = recurrent.predict(obs, state=state, episode_start=np.array([True, False]))
    with torch.device("meta"):
        for given in (state, tuple(torch.from_numpy(part) for part in state)):  # (numpy back, or tensors)
            actions, (h, c) = recurrent.predict(obs, state=given, episode_start=np.array([True, False]))
            np.testing.assert_array_equal(actions, expected[0])
            np.testing.assert_array_equal(h, expected[1][0])
    dqn = DQN("CartPole-v1", device="cpu", seed=0, learning_starts=32, batch_size=16, buffer_size=300,
              net_arch=[16]).learn(400, progress_bar=False)
    dqn.save_replay_buffer(tmp_path / "replay.pkl")
    smaller = {"device": "cpu", "seed": 0, "learning_starts": 32, "batch_size": 16, "buffer_size": 100,
               "net_arch": [16]}
    without = DQN("CartPole-v1", **smaller)
    without.load_replay_buffer(tmp_path / "replay.pkl")
    without.learn(16, progress_bar=False)  # (the file's rows are taken at learn's start)
    with torch.device("meta"):
        model = DQN("CartPole-v1", **smaller)
        model.load_replay_buffer(tmp_path / "replay.pkl")
        model.learn(16, progress_bar=False)
    got, want = model.buffer.state_dict()[0], without.buffer.state_dict()[0]
    assert got.keys() == want.keys() and all(torch.equal(got[name], want[name]) for name in want)
    # (a device model's host replay moves its samples through host staging tensors, made on the host also there)
    from rlspeed.buffers.replay import _HostStaging

    storage = torch.arange(12.0).reshape(6, 2)
    with torch.device("meta"):
        taken = _HostStaging(torch.device("cpu"), pin=False).take("obs", storage, torch.tensor([4, 1], device="cpu"))
    assert torch.equal(taken, storage[[4, 1]])
