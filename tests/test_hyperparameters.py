"""Hyperparameters as users bring them: Stable-Baselines3's spellings, misspellings and other algorithms' options
(one sentence each), and settings that change nothing on the env they are given for (one warning each)."""

from __future__ import annotations

import re
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import needs_minatar

import rlspeed
from rlspeed import cli
from rlspeed.algos import ALGORITHMS
from rlspeed.algos.base import build_config, unused_settings
from rlspeed.envs.base import EnvSpec
from rlspeed.errors import UserError


def test_sb3_1x_net_arch_and_torch_activation_names_are_taken():
    """SB3 1.x's `net_arch=[dict(pi=..., vf=...)]` is taken where SB3 2.x's dict form is (equal widths), and an
    activation may be written as torch's class path (`nn.ReLU`, `torch.nn.Tanh`), as in `--set activation=nn.ReLU`."""
    ppo = rlspeed.PPO("CartPole-v1", device="cpu", net_arch=[dict(pi=[32], vf=[32])], activation="nn.ReLU")
    assert (ppo.config.net_arch, ppo.config.activation) == ((32,), "relu")
    sac = rlspeed.SAC("Pendulum-v1", device="cpu", net_arch=[{"pi": [64, 64], "qf": [64, 64]}],
                      activation="torch.nn.Tanh")
    assert (sac.config.net_arch, sac.config.activation) == ((64, 64), "tanh")
    # SB3's policy_kwargs=dict(activation_fn=nn.LeakyReLU): the class, or its name written as code, is rlspeed's name
    # (the class was taken as 'leakyrelu' and refused); PReLU, which learns a parameter, is refused saying why
    for given in (torch.nn.LeakyReLU, "nn.LeakyReLU", "LeakyReLU", "leaky_relu"):
        assert rlspeed.PPO("CartPole-v1", device="cpu", activation=given).config.activation == "leaky_relu"
    for given, name, layer in ((torch.nn.GELU, "gelu", torch.nn.GELU), ("th.nn.Hardswish", "hardswish",
                                                                         torch.nn.Hardswish)):
        model = rlspeed.DQN("CartPole-v1", device="cpu", activation=given)
        assert model.config.activation == name and type(model.q_network.body[1]) is layer
    for given in (torch.nn.PReLU, "nn.PReLU", torch.nn.PReLU()):
        with pytest.raises(UserError, match=r"PReLU learns its slope, .*: use leaky_relu, PReLU with its slope fixed"):
            rlspeed.SAC("Pendulum-v1", device="cpu", activation=given)
    for net_arch, message in [([dict(pi=[32], vf=[64])], "one list of layer widths.*in a subclass .*_build_policy"),
                              ([64, dict(pi=[32], vf=[32])], "share no layers.*in a subclass .*_build_policy")]:
        with pytest.raises(UserError, match=message):
            rlspeed.PPO("CartPole-v1", device="cpu", net_arch=net_arch)


def test_an_activation_is_torchs_only_under_torch_nns_names():
    """Any dotted prefix was dropped ('F.relu', torch's function, which SB3 does not take, read as relu; 'mymod.Tanh'
    as torch.nn's Tanh), and `activation=` took a class of torch's quantized layers (`torch.ao.nn`) as torch.nn's:
    each is refused naming the table now (by RL-Zoo's translation too: not honoured); torch.nn's spellings are taken.
    The keyword says of the quantized class what it says of a class of one's own (one rule for "torch.nn's class")."""
    from torch.ao.nn import quantized

    from rlspeed.activations import activation_name
    from rlspeed.policy_kwargs import Collected, translate_policy_kwargs

    for given in ("F.relu", "mymod.Tanh", "torch.nn.functional.relu", quantized.LeakyReLU):
        with pytest.raises(UserError, match=r"^activation must be one of tanh, relu, .*, got '"):
            activation_name(given)
        read = Collected()
        translate_policy_kwargs("ppo", {"activation_fn": given}, read)
        assert not read.hyper and [key for key, *_ in read.refused] == ["policy_kwargs.activation_fn"]
        # (by its module's name: the quantized LeakyReLU was shown as "LeakyReLU", refused beside nn.LeakyReLU)
        assert read.refused[0][1] == (given if isinstance(given, str) else f"{given.__module__}.{given.__qualname__}")
    assert [activation_name(given) for given in ("nn.ReLU", "torch.nn.Tanh", "th.nn.ELU", "SiLU", torch.nn.GELU)] == [
        "relu", "tanh", "elu", "silu", "gelu"]
    with pytest.raises(UserError, match=r"'activation' takes a name, or torch's own class for it, not torch\.ao\.nn\."):
        build_config(rlspeed.PPO.config_cls, {"activation": quantized.LeakyReLU})


def test_policy_kwargs_for_a_config_without_network_keywords_names_none():
    """The policy_kwargs sentence names the network keywords the config has: a config of one's own with none of them
    gets no list (not "()"), and its refusal of each option."""
    import dataclasses

    @dataclasses.dataclass
    class Config:
        width: int = 1

    with pytest.raises(UserError) as refused:
        build_config(Config, {"policy_kwargs": {"net_arch": [3]}})
    assert str(refused.value).endswith("plain keywords; policy_kwargs.net_arch=[3]: Config has no net_arch.")


def test_unknown_hyperparameter_suggests_misspellings_and_names_the_algorithms_that_have_it():
    """A name that shares only its first word or letters with a hyperparameter is no misspelling of it; one that
    other algorithms have says which, and misspellings still get their "Did you mean"."""
    cases = [(rlspeed.DQN, {"ent_coef": 0.1}, r"ent_coef is a setting of A2C, PPO, RecurrentPPO and SAC; DQN has "),
             (rlspeed.PPO, {"buffer_size": 100}, r"buffer_size is a setting of DDPG, DQN, SAC and TD3; PPO has none"),
             (rlspeed.PPO, {"lerning_rate": 1e-3}, r"Did you mean learning_rate\?"),
             (rlspeed.PPO, {"activation_fn": "relu"}, r"Did you mean activation\?"),
             (rlspeed.DQN, {"exploration_eps": 0.1}, r"Did you mean exploration_final_eps, exploration_initial_eps\?"),
             (rlspeed.PPO, {"update_epochs": 4}, r"Did you mean n_epochs\?$"),  # (named otherwise: the last word)
             (rlspeed.DQN, {"exploration_final_epsilon": 0.1}, r"Did you mean exploration_final_eps\?$"),
             (rlspeed.SAC, {"vf_coef": 0.5}, r"vf_coef is a setting of A2C, PPO and RecurrentPPO; SAC has none")]
    for algo, options, message in cases:
        with pytest.raises(UserError, match=message) as raised:
            algo("Pendulum-v1" if algo is rlspeed.SAC else "CartPole-v1", device="cpu", **options)
        if "setting of" in message:
            assert "Did you mean" not in str(raised.value), str(raised.value)


def _spec(observation_space: gym.Space, action_space: gym.Space) -> EnvSpec:
    return EnvSpec.from_spaces("TestEnv-v0", observation_space, action_space, None, None)


VECTOR = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
BOX_ACTIONS = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
UINT8_IMAGE = gym.spaces.Box(0, 255, (3, 40, 40), np.uint8)
BOOL_IMAGE = gym.spaces.Box(0, 1, (10, 10, 4), np.bool_)
FLOAT_IMAGE = gym.spaces.Box(0.0, 1.0, (3, 40, 40), np.float32)  # (a CNN's only with encoder=cnn)


@pytest.mark.parametrize(("algo", "options", "observations", "actions", "message"), [
    (rlspeed.PPO, {"cnn_features_dim": 64}, VECTOR, gym.spaces.Discrete(2), "no image observations, so no CNN"),
    (rlspeed.DQN, {"cnn_features_dim": 64, "encoder": "mlp"}, UINT8_IMAGE, gym.spaces.Discrete(2),
     "encoder=mlp flattens the images"),
    (rlspeed.SAC, {"normalize_images": False}, VECTOR, BOX_ACTIONS, "normalize_images=False has no effect"),
    (rlspeed.PPO, {"normalize_images": False}, BOOL_IMAGE, gym.spaces.Discrete(2), "has bool images"),
    (rlspeed.PPO, {"normalize_images": False, "encoder": "cnn"}, FLOAT_IMAGE, gym.spaces.Discrete(2),
     "has no uint8 images in \\[0, 255\\]"),
    (rlspeed.PPO, {"cnn_features_dim": 64}, FLOAT_IMAGE, gym.spaces.Discrete(2), "no image observations, so no CNN"),
    (rlspeed.PPO, {"log_std_init": -1.0}, VECTOR, gym.spaces.Discrete(3), "has Discrete actions"),
    (rlspeed.A2C, {"log_std_init": -1.0}, VECTOR, gym.spaces.MultiDiscrete([2, 3]), "has MultiDiscrete actions"),
    (rlspeed.PPO, {"log_std_init": -1.0}, VECTOR, gym.spaces.MultiBinary(3), "has MultiBinary actions"),
    (rlspeed.PPO, {"sde_sample_freq": 4}, VECTOR, BOX_ACTIONS, "sde_sample_freq=4 has no effect: .*use_sde=False"),
    (rlspeed.A2C, {"full_std": False}, VECTOR, BOX_ACTIONS, "full_std=False has no effect"),
    (rlspeed.SAC, {"use_expln": True}, VECTOR, BOX_ACTIONS, "use_expln=True has no effect"),
    (rlspeed.SAC, {"log_std_init": -2.0}, VECTOR, BOX_ACTIONS, "log_std_init=-2.0 has no effect: .*gSDE"),
    (rlspeed.DQN, {"batch_size": 64, "buffer_size": 16}, VECTOR, gym.spaces.Discrete(2),
     r"batch_size \(64\) is above buffer_size \(16\)"),
    (rlspeed.SAC, {"ent_coef": 0.2, "ent_coef_init": 0.5}, VECTOR, BOX_ACTIONS,
     "ent_coef_init=0.5 has no effect: .*ent_coef=0.2 holds it fixed .*ent_coef=auto_0.5"),
    (rlspeed.PPO, {"num_envs": 4, "num_steps": 16, "batch_size": 128}, VECTOR, gym.spaces.Discrete(2),
     r"batch_size 128 is larger than a rollout \(num_envs 4 x num_steps 16 = 64 steps\): .*; set batch_size to 64 "
     r"or less, or raise num_envs x num_steps to 128\.$"),
])
def test_a_setting_that_changes_nothing_on_the_env_is_named(algo, options, observations, actions, message):
    """A hyperparameter set away from its default that does nothing for this env's spaces (image options without
    the images they apply to, log_std_init without Gaussian actions, gSDE's options without use_sde, a batch larger
    than the replay buffer or the rollout, ent_coef_init beside a fixed ent_coef) gets one sentence."""
    config = algo.config_cls(**options)
    found = unused_settings(config, _spec(observations, actions))
    assert len(found) == 1 and re.search(message, found[0]), found


@pytest.mark.parametrize(("algo", "options", "observations", "actions"), [
    (rlspeed.PPO, {}, VECTOR, gym.spaces.Discrete(2)),
    (rlspeed.PPO, {"encoder": "mlp"}, VECTOR, gym.spaces.Discrete(2)),  # (what auto picks there anyway)
    (rlspeed.PPO, {"cnn_features_dim": 64, "normalize_images": False}, UINT8_IMAGE, gym.spaces.Discrete(2)),
    (rlspeed.DQN, {"cnn_features_dim": 64}, gym.spaces.Dict({"image": BOOL_IMAGE, "vector": VECTOR}),
     gym.spaces.Discrete(2)),
    (rlspeed.PPO, {"normalize_images": False, "encoder": "mlp"}, UINT8_IMAGE, gym.spaces.Discrete(2)),
    (rlspeed.SAC, {"cnn_features_dim": 64, "encoder": "cnn"}, FLOAT_IMAGE, BOX_ACTIONS),
    (rlspeed.PPO, {"log_std_init": -1.0}, VECTOR, BOX_ACTIONS),
    (rlspeed.PPO, {"use_sde": True, "sde_sample_freq": 4, "full_std": False, "use_expln": True, "log_std_init": -2.0},
     VECTOR, BOX_ACTIONS),
    (rlspeed.SAC, {"use_sde": True, "use_sde_at_warmup": True, "log_std_init": -2.0}, VECTOR, BOX_ACTIONS),
    (rlspeed.DQN, {"batch_size": 16, "buffer_size": 16}, VECTOR, gym.spaces.Discrete(2)),
    (rlspeed.SAC, {"ent_coef_init": 0.5}, VECTOR, BOX_ACTIONS),  # (the start of the tuned coefficient)
    (rlspeed.PPO, {"num_envs": 4, "num_steps": 16, "batch_size": 64}, VECTOR, gym.spaces.Discrete(2)),
])
def test_a_setting_that_acts_on_the_env_is_not_named(algo, options, observations, actions):
    """Settings at their defaults, and settings the env's spaces use, get no sentence."""
    assert unused_settings(algo.config_cls(**options), _spec(observations, actions)) == []


def test_a_model_warns_once_per_setting_without_effect():
    """Making a model with settings that change nothing warns once for each (a model of several networks too), and
    a model whose settings all act warns nothing."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rlspeed.SAC("Pendulum-v1", device="cpu", cnn_features_dim=64, full_std=False)
        rlspeed.PPO("CartPole-v1", device="cpu", log_std_init=-0.5)
    named = [warning for warning in caught if "has no effect" in str(warning.message)]
    assert sorted(str(warning.message).split(" ")[0] for warning in named) == [
        "cnn_features_dim=64", "full_std=False", "log_std_init=-0.5"], [str(warning.message) for warning in caught]
    assert all(warning.filename == __file__ for warning in named)  # (shown where the model is made)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rlspeed.PPO("Pendulum-v1", device="cpu", use_sde=True, sde_sample_freq=4, log_std_init=-1.0)


@needs_minatar
def test_an_image_model_warns_nothing_for_its_cnn_setting():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rlspeed.PPO("MinAtar/Breakout-v1", device="cpu", cnn_features_dim=64)


def test_an_on_off_setting_takes_only_on_off_values():
    """`--set anneal_lr=[false]` (a list) or `normalize_obs=2.5` were taken as bool(value): true, silently."""
    from rlspeed.algos import PPOConfig
    from rlspeed.algos.base import build_config

    for value in ([False], 2.5, {}, 2, "maybe"):
        with pytest.raises(UserError, match="not a valid bool"):
            build_config(PPOConfig, {"anneal_lr": value})
    for value, expected in ((True, True), (0, False), (1, True), ("no", False), (np.True_, True)):
        assert build_config(PPOConfig, {"anneal_lr": value}).anneal_lr is expected


def test_an_on_off_setting_takes_as_text_what_yaml_reads_as_on_or_off():
    """`--set anneal_lr=off` (YAML reads it as false) trained, while `anneal_lr="off"` in Python or a quoted 'off'
    in a file was "not a valid bool"; the refusal of other text names the words taken."""
    from rlspeed.algos import PPOConfig
    from rlspeed.algos.base import build_config

    for text, expected in (("off", False), ("On", True), ("OFF", False), (" true ", True), ("No", False)):
        assert build_config(PPOConfig, {"anneal_lr": text}).anneal_lr is expected
    with pytest.raises(UserError, match=r"got 'maybe', which is not a valid bool\. Give true or false \(yes or no, "
                                        r"on or off, 1 or 0\)\.$"):
        build_config(PPOConfig, {"anneal_lr": "maybe"})


@pytest.mark.parametrize("value", [[[64], [64]], "64,64", [64.5], None])
def test_a_net_arch_that_is_no_list_of_widths_says_how_to_write_one(value):
    """Said only "which is not a valid tuple" (a Python type name, not what to give)."""
    from rlspeed.algos import DQNConfig
    from rlspeed.algos.base import build_config

    with pytest.raises(UserError, match=r"^Hyperparameter 'net_arch' got .*, which is not a valid tuple\. Give the "
                                        r"hidden layers' widths as one list of whole numbers, e.g\. \[64, 64\]\.$"):
        build_config(DQNConfig, {"net_arch": value})


def test_a_rollout_that_would_not_fit_in_memory_is_refused_before_it_is_allocated():
    """num_steps=1e9 failed inside the allocator, 1e30 inside torch: one sentence naming the settings instead."""
    model = rlspeed.PPO("CartPole-v1", device="cpu", num_envs=1, num_steps=10**12, batch_size=64)
    with pytest.raises(rlspeed.UserError, match=r"A rollout of num_steps 1,000,000,000,000 x num_envs 1 .* lower "
                                                r"num_steps or num_envs"):
        model.learn(100, progress_bar=False)


def test_a_rollout_refused_for_its_memory_names_the_size_that_fits(monkeypatch):
    """The refusal said "lower num_steps or num_envs" without a number, where the replay buffer's names the largest
    buffer_size that fits: it names the num_steps that fits at the given num_envs, else the num_envs one step fits."""
    from rlspeed.buffers import replay, rollout

    # (13.4 MB may go)
    monkeypatch.setattr(replay, "available_memory", lambda device, needed=None: (2**24, replay.HOST))
    space, cpu = gym.make("CartPole-v1").observation_space, torch.device("cpu")
    with pytest.raises(UserError, match=r"lower num_steps or num_envs; with num_envs 4, num_steps up to [\d,]+ fits "
                                        r"\(num_steps=(\d+), on the command line --set num_steps=\1\)\.$") as refused:
        rollout.RolloutBuffer(10**9, 4, space, (), torch.int64, cpu)
    steps = int(re.search(r"num_steps=(\d+)", str(refused.value)).group(1))
    rollout.RolloutBuffer(steps, 4, space, (), torch.int64, cpu)
    with pytest.raises(UserError, match="lower num_steps or num_envs"):
        rollout.RolloutBuffer(steps + 1, 4, space, (), torch.int64, cpu)
    with pytest.raises(UserError, match=r"lower num_envs: one step each of at most [\d,]+ envs fits \(num_envs=(\d+), "
                                        r"on the command line --num-envs \1\)\.$") as refused:
        rollout.RolloutBuffer(1, 10**9, space, (), torch.int64, cpu)
    envs = int(re.search(r"num_envs=(\d+)", str(refused.value)).group(1))
    rollout.RolloutBuffer(1, envs, space, (), torch.int64, cpu)
    with pytest.raises(UserError, match="lower num_envs"):
        rollout.RolloutBuffer(1, envs + 1, space, (), torch.int64, cpu)
    # (num_envs too large for one step at a rollout of several: the num_envs named fits at its num_steps, where it
    # named the one that fits at one step, refused again at 5)
    with pytest.raises(UserError, match=r"lower num_envs: 5 steps each of at most [\d,]+ envs fits \(num_envs=(\d+), "
                                        r"on the command line --num-envs \1\)\.$") as refused:
        rollout.RolloutBuffer(5, 10**9, space, (), torch.int64, cpu)
    envs = int(re.search(r"num_envs=(\d+)", str(refused.value)).group(1))
    rollout.RolloutBuffer(5, envs, space, (), torch.int64, cpu)


@pytest.mark.parametrize("algo", ["PPO", "DQN"])
def test_gamma_zero_is_a_bandit_and_outside_zero_to_one_is_refused(algo):
    """gamma=0 (each action judged by its own reward, as Stable-Baselines3 accepts) was refused; the n-step buffer's
    returns are then the first reward alone."""
    import rlspeed

    options = {"n_step": 3, "learning_starts": 8, "batch_size": 8} if algo == "DQN" else {"num_envs": 2,
                                                                                          "num_steps": 16}
    model = getattr(rlspeed, algo)("CartPole-v1", device="cpu", env_backend="torch", gamma=0.0, **options)
    model.learn(64, progress_bar=False)
    if algo == "DQN":
        stored = len(model.buffer)
        assert bool((model.buffer.rewards[:stored] == 1).all()) and bool((model.buffer.discounts[:stored] == 0).all())
    for gamma in (-0.1, 1.5):
        with pytest.raises(rlspeed.UserError, match=r"gamma must be in \[0, 1\]"):
            getattr(rlspeed, algo)("CartPole-v1", device="cpu", gamma=gamma)


def test_sb3s_n_steps_is_taken_as_rlspeeds_name_and_saved_under_it(tmp_path):
    """SB3's `n_steps` (every SB3 PPO script has it) was refused with "Did you mean num_steps?": it is the rollout
    length of PPO, A2C and RecurrentPPO (num_steps) and the n-step return of DQN, SAC, TD3 and DDPG (n_step), as in
    SB3, in the constructor, load's overrides and --set, and the model holds and saves rlspeed's name alone."""
    for algo, ours in (("ppo", "num_steps"), ("a2c", "num_steps"), ("recurrent_ppo", "num_steps"),
                       ("dqn", "n_step"), ("sac", "n_step"), ("td3", "n_step"), ("ddpg", "n_step")):
        config_cls = ALGORITHMS[algo].config_cls
        assert build_config(config_cls, {"n_steps": 3}) == build_config(config_cls, {ours: 3})
        with pytest.raises(UserError, match=f"n_steps=3 and {ours}=4 both set {ours} .*: give one of them"):
            build_config(config_cls, {"n_steps": 3, ours: 4})
    model = rlspeed.PPO("CartPole-v1", device="cpu", num_envs=2, n_steps=32, batch_size=32, seed=0)
    assert model.config.num_steps == 32 and not hasattr(model.config, "n_steps")
    model.save(tmp_path / "ppo")
    assert rlspeed.PPO.load(tmp_path / "ppo", device="cpu", n_steps=16).config.num_steps == 16
    model.config.n_steps = 16  # (the config has rlspeed's name alone: set there, SB3's would change nothing)
    with pytest.raises(UserError, match=r"model.config.n_steps = \.\.\. changes nothing: .*model.config.num_steps"):
        model.learn(0)
    args = cli.build_parser().parse_args(["train", "ppo", "CartPole-v1", "--set", "n_steps=16"])
    assert cli._settings(args)[3].num_steps == 16  # (over the preset's num_steps)


def test_sb3s_policy_kwargs_in_set_sets_the_network_over_a_presets():
    """`--set policy_kwargs=...` (SB3's dict, the activation's class name as code writes it) sets the network over a
    preset's net_arch, as --set net_arch=... does: it was refused as net_arch given twice."""
    args = cli.build_parser().parse_args(["train", "dqn", "CartPole-v1", "--set",
                                          "policy_kwargs={net_arch: [32], activation_fn: nn.Tanh}"])
    config = cli._settings(args)[3]
    assert (config.net_arch, config.activation) == ((32,), "tanh")  # (the preset's: [128, 128], relu)


def test_none_written_as_text_switches_an_optional_setting_off():
    """`--set target_kl=None` (Python's spelling) or `none` (the CLI's, as --target-return none) was refused as "not a
    valid float"; it is the setting off, as None. SAC's ent_coef, whose None is the tuned value, still takes auto."""
    from rlspeed.algos import PPOConfig, SACConfig
    from rlspeed.algos.base import build_config

    for text in ("None", "none", "null", " NULL "):
        config = build_config(PPOConfig, {"target_kl": text, "clip_range_vf": text})
        assert (config.target_kl, config.clip_range_vf) == (None, None)
    with pytest.raises(UserError, match="Give auto for the automatically tuned value, or a number"):
        build_config(SACConfig, {"ent_coef": "none"})
    with pytest.raises(UserError, match="not a valid float"):
        build_config(PPOConfig, {"target_kl": "nope"})


def test_exploration_fraction_zero_and_above_one_follow_stable_baselines3s_schedule():
    """exploration_fraction=0 (SB3: epsilon at exploration_final_eps from the start) and above 1 (SB3: a decay longer
    than the run, which ends before epsilon reaches its final value) were refused; they train, with SB3's epsilons."""
    from rlspeed.algos.dqn import collection_epsilons, scheduled_epsilon

    utils = pytest.importorskip("stable_baselines3.common.utils")
    total = 1000
    # (SB3 reads it at progress left: 1 - steps / total; LinearSchedule replaced the deprecated get_linear_fn)
    linear_schedule = getattr(utils, "LinearSchedule", None) or utils.get_linear_fn
    for fraction in (0.0, 1e-300, 0.1, 1.0, 1.5, 4.0):  # (1e-300: a decay within the first step)
        sb3 = linear_schedule(1.0, 0.05, fraction)
        for step in (1, 50, 100, 500, 999, 1000):
            assert scheduled_epsilon(step, 0, total, fraction, 1.0, 0.05) == pytest.approx(sb3(1 - step / total))
        drawn = collection_epsilons(4, 1, 500, 0, total, fraction, 1.0, 0.05, "cpu")
        assert drawn.tolist() == pytest.approx([sb3(1 - step / total) for step in range(500, 504)], abs=1e-6)
        drawn = collection_epsilons(3, 1, 1, 0, total, fraction, 1.0, 0.05, "cpu")  # (SB3 asks from step 1)
        assert drawn.tolist() == pytest.approx([sb3(1 - step / total) for step in range(1, 4)], abs=1e-6)
    model = rlspeed.DQN("CartPole-v1", device="cpu", exploration_fraction=0, learning_starts=0, batch_size=8)
    model.learn(64, progress_bar=False)
    assert model.epsilon(0) == model.epsilon(63) == 0.05
    with pytest.raises(UserError, match=r"^exploration_fraction must be >= 0 .*, got -0\.1\.$"):
        rlspeed.DQN("CartPole-v1", device="cpu", exploration_fraction=-0.1)


def test_a_nan_or_infinity_inside_a_set_value_is_one_sentence_naming_where(capsys):
    """`--set` and `--env-kwargs` refuse NaN and infinity at any depth of a value's lists and dicts (they refused
    them one level deep, and a value inside a dict at none), naming the key path."""
    from rlspeed import cli

    for flag, pair, where in [("--set", 'net_arch={"pi": [64, .nan], "vf": [64]}', "net_arch.pi[1] is nan"),
                              ("--set", "policy_kwargs={arch: {pi: [.inf]}}", "policy_kwargs.arch.pi[0] is inf"),
                              ("--env-kwargs", "layout=[[1, -.inf]]", "layout[0][1] is -inf"),
                              ("--env-kwargs", "goal={x: 1e999}", "goal.x is inf"),
                              ("--set", "net_arch=[64, .nan]", "net_arch[1] is nan")]:
        assert cli.main(["train", "ppo", "CartPole-v1", flag, pair, "--dry-run"]) == 2
        error = capsys.readouterr().err.strip()
        assert error.startswith(f"rlspeed: error: {flag} ") and error.endswith(
            f": values must be finite numbers ({where})."), error
    assert cli._parse_set(["net_arch={pi: [64, 64]}", "cycle=&a [1, *a]"])["net_arch"] == {"pi": [64, 64]}


def test_an_infinite_max_grad_norm_says_how_to_not_clip(tmp_path, capsys):
    """max_grad_norm=inf (Stable-Baselines3's way to not clip gradients) was refused as not finite, with no way on:
    the sentence names a large value, in Python and from --set; a large value trains."""
    from rlspeed import cli

    advice = r"no gradient clipping \(Stable-Baselines3's inf\) is a large value here, such as 1e9\.$"
    with pytest.raises(UserError, match=r"it must be a finite number .*; " + advice):
        rlspeed.PPO("CartPole-v1", device="cpu", max_grad_norm=float("inf"))
    assert cli.main(["train", "dqn", "CartPole-v1", "--preset", "none", "--set", "max_grad_norm=.inf", "--out",
                     str(tmp_path / "run"), "--no-progress"]) == 2
    assert re.search(r"max_grad_norm=inf: values must be finite numbers; " + advice, capsys.readouterr().err.strip())
    model = rlspeed.PPO("CartPole-v1", device="cpu", num_envs=1, num_steps=64, batch_size=64, max_grad_norm=1e9)
    before = [p.detach().clone() for p in model.policy.parameters()]
    model.learn(64, progress_bar=False)
    assert all(bool(torch.isfinite(p).all()) for p in model.policy.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, model.policy.parameters()))


@pytest.mark.parametrize("algo", ["PPO", "A2C", "RecurrentPPO", "DQN", "SAC", "TD3", "DDPG"])
def test_network_settings_are_refused_with_the_config_in_the_same_words(algo):
    """An activation without a layer (then SB3's activation_fn=nn.GELU) passed the config and was refused only when
    the networks were built, after the envs were made; net_arch=[0] was written as a tuple, (0,), on-policy. One rule
    for every algorithm, at the config."""
    from rlspeed.algos.base import build_config

    config_cls = getattr(rlspeed, algo).config_cls
    with pytest.raises(UserError, match=r"^activation must be one of tanh, relu, elu, silu, leaky_relu, gelu, "
                                        r"softplus, mish, hardswish, selu, celu, sigmoid, got 'hardtanh'\.$"):
        build_config(config_cls, {"activation": "hardtanh"})
    with pytest.raises(UserError, match=r"^net_arch widths must be positive, got \[64, 0\]\.$"):
        build_config(config_cls, {"net_arch": [64, 0]})
    assert build_config(config_cls, {"net_arch": [], "activation": "ReLU"}).activation == "relu"


@pytest.mark.parametrize("algo", ["DQN", "SAC", "TD3", "DDPG"])
def test_an_iteration_of_train_freq_or_gradient_steps_without_end_is_refused(algo):
    """train_freq=1e9 or gradient_steps=1e9 passed the config, and learn(200) then ran its one iteration, a billion
    env steps or updates, for days without a word (learn runs whole iterations, as SB3's); n_epochs has the same
    kind of bound. Up to the bound, and gradient_steps=-1, are taken."""
    from rlspeed.algos.base import build_config

    config_cls = getattr(rlspeed, algo).config_cls
    with pytest.raises(UserError, match=r"^train_freq must be from 1 to 1,000,000 \(env steps of every env between "
                                        r"updates; .*\), got 1,000,000,000\.$"):
        build_config(config_cls, {"train_freq": 1e9})
    with pytest.raises(UserError, match=r"^gradient_steps must be from 1 to 1,000,000 \(updates per iteration\), "
                                        r"or -1 for one per env step, got 1,000,000,000\.$"):
        build_config(config_cls, {"gradient_steps": 1e9})
    config = build_config(config_cls, {"train_freq": 1_000_000, "gradient_steps": 1_000_000})
    assert (config.train_freq, config.gradient_steps) == (1_000_000, 1_000_000)
    assert build_config(config_cls, {"gradient_steps": -1}).gradient_steps == -1


def test_a_refused_value_of_an_optional_or_auto_setting_names_what_is_taken():
    """target_kl=0 and clip_range_vf=0 were refused without the value got or what null does; ent_coef=auto for PPO
    or A2C (SB3's SAC spelling) was "not a valid float" alone."""
    from rlspeed.algos.base import build_config

    with pytest.raises(UserError, match=r"^target_kl must be > 0, or null for no early stop, got 0\.0\.$"):
        build_config(rlspeed.PPO.config_cls, {"target_kl": 0})
    with pytest.raises(UserError, match=r"^clip_range_vf must be > 0, or null for no value clipping, got -0\.1\.$"):
        build_config(rlspeed.RecurrentPPO.config_cls, {"clip_range_vf": -0.1})
    for algo in ("PPO", "A2C"):
        with pytest.raises(UserError, match=r"got 'auto', which is not a valid float\. ent_coef is tuned "
                                            r"automatically \(auto\) by SAC only; give a number\.$"):
            build_config(getattr(rlspeed, algo).config_cls, {"ent_coef": "auto"})
