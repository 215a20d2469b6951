"""Presets: rlspeed's own, RL-Zoo's translated (`rlspeed.presets.zoo`), and a user's file (`--preset FILE`)."""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import inspect
import os
import re
import subprocess
import sys

import pytest
import yaml

from rlspeed.algos import ALGORITHMS
from rlspeed.algos.base import build_config
from rlspeed.errors import UserError
from rlspeed.presets import load_preset, load_preset_file, split_run_settings, zoo

requires_zoo = pytest.mark.skipif(importlib.util.find_spec("rl_zoo3") is None, reason="rl_zoo3 is not installed")


def translated(algo: str, entry: dict, **kwargs) -> zoo.Translation:
    return zoo.translate_entry(algo, entry, "test", **kwargs)


def refused(translation: zoo.Translation) -> set[str]:
    """The keys a translation names as not honoured."""
    return {line.split(":")[0] for line in translation.unsupported}


# --- the safe parser of policy_kwargs / normalize strings -------------------------------------------------------------
def test_parser_reads_rl_zoo_policy_kwargs_without_running_them():
    value = zoo.parse_python_literal("dict(log_std_init=-2, ortho_init=False, activation_fn=th.nn.ReLU, "
                                     "net_arch=dict(pi=[256, 256], vf=[256, 256]), )")
    assert value == {"log_std_init": -2, "ortho_init": False, "activation_fn": "th.nn.ReLU",
                     "net_arch": {"pi": [256, 256], "vf": [256, 256]}}
    assert isinstance(value["activation_fn"], zoo.Symbol)
    assert zoo.parse_python_literal("{'norm_obs': True, 'norm_reward': False}") == {"norm_obs": True,
                                                                                   "norm_reward": False}


@pytest.mark.parametrize("text", [
    "__import__('os')", "__import__('os').system('true')", "os.system('true')", "dict(a=open('/etc/passwd'))",
    "().__class__.__bases__", "nn.__dict__", "__builtins__", "lambda: 0", "[x for x in range(3)]", "2 ** 1000000",
    "dict(**{'a': 1})", "dict([('a', 1)])", "getattr(nn, 'ReLU')", "f'{1}'", "{1: 2}", "nn.ReLU()", "a[0]",
    "(" * 5000 + ")" * 5000, "dict(a=1" + ", a=1" * 5000 + ")",
])
def test_parser_refuses_anything_but_literals_dicts_and_names(text):
    with pytest.raises(UserError):
        zoo.parse_python_literal(text, "policy_kwargs")


def test_a_policy_kwargs_string_that_would_run_code_is_refused_not_run():
    translation = translated("ppo", {"policy_kwargs": "dict(net_arch=__import__('os').getcwd())"})
    assert refused(translation) == {"policy_kwargs"}
    assert "net_arch" not in translation.hyperparameters


# --- the translation, key by key --------------------------------------------------------------------------------------
def test_names_and_run_settings():
    translation = translated("ppo", {"n_envs": 4, "n_steps": 32, "n_timesteps": 1e5, "batch_size": 64,
                                     "gamma": 0.98, "policy": "MlpPolicy"})
    assert translation.run == {"total_timesteps": 100_000}
    assert translation.hyperparameters["num_envs"] == 4 and translation.hyperparameters["num_steps"] == 32
    assert translation.status == "full" and not translation.unsupported
    dqn = translated("dqn", {"n_steps": 3})  # SB3's off-policy n_steps: n-step returns
    assert dqn.hyperparameters["n_step"] == 3


def test_sb3_defaults_are_set_where_rlspeed_differs():
    ppo = translated("ppo", {}).hyperparameters
    assert (ppo["num_envs"], ppo["num_steps"], ppo["batch_size"], ppo["anneal_lr"]) == (1, 2048, 64, False)
    assert translated("dqn", {}).hyperparameters["double_q"] is False
    assert translated("td3", {}).hyperparameters["action_noise"] == "none"


@pytest.mark.parametrize("algo", sorted(zoo.ZOO_NAMES))
def test_an_empty_entry_builds_sb3s_defaults(algo):
    """The SB3_DEFAULTS table against the installed Stable-Baselines3: every argument rlspeed has means the same."""
    sb3 = pytest.importorskip("sb3_contrib" if algo == "recurrent_ppo" else "stable_baselines3")
    sb3_cls = {"recurrent_ppo": "RecurrentPPO"}.get(algo, algo.upper())
    defaults = {name: p.default for name, p in inspect.signature(getattr(sb3, sb3_cls)).parameters.items()}
    config = build_config(ALGORITHMS[algo].config_cls, translated(algo, {}).hyperparameters)
    fields = {field.name for field in dataclasses.fields(config)}
    renames = {"n_steps": "num_steps" if algo in zoo.ON_POLICY else "n_step"}
    checked = 0
    for name, value in defaults.items():
        field = renames.get(name, name)
        if field not in fields or value is inspect.Parameter.empty:
            continue
        if name == "vf_coef" and algo in zoo.HALF_VALUE_LOSS:
            value = 2 * value
        if value == "auto":  # SAC's ent_coef and target_entropy
            value = None
        if name == "action_noise":
            value = "none" if value is None else value
        assert getattr(config, field) == value, f"{algo} {name}: SB3 {value!r}, translated {getattr(config, field)!r}"
        checked += 1
    assert checked >= 8
    assert config.num_envs == 1  # RL-Zoo's default n_envs
    if algo in zoo.ON_POLICY:
        assert config.anneal_lr is False  # SB3's learning rate is constant unless given a schedule


def test_normalize_bool_and_dict_string():
    both = translated("ppo", {"normalize": True}).hyperparameters
    assert both["normalize_obs"] is True and both["normalize_reward"] is True
    obs_only = translated("ppo", {"normalize": "{'norm_obs': True, 'norm_reward': False}"}).hyperparameters
    assert obs_only["normalize_obs"] is True and obs_only["normalize_reward"] is False
    reward_only = translated("a2c", {"normalize": "dict(norm_obs=False, norm_reward=True)"}).hyperparameters
    assert reward_only["normalize_obs"] is False and reward_only["normalize_reward"] is True
    assert refused(translated("ppo", {"normalize": "dict(norm_obs=True, epsilon=1e-4)"})) == {"normalize.epsilon"}
    # off-policy algorithms normalise observations and rewards too (normalize_reward was refused: "partly")
    for algo in ("dqn", "sac", "td3", "ddpg"):
        obs_only = translated(algo, {"normalize": "{'norm_obs': True, 'norm_reward': False}"})
        assert obs_only.status == "full" and obs_only.hyperparameters["normalize_obs"] is True, algo
        assert obs_only.hyperparameters["normalize_reward"] is False, algo
        both = translated(algo, {"normalize": True})
        assert both.hyperparameters["normalize_obs"] is True and both.hyperparameters["normalize_reward"] is True
        assert both.status == "full", algo
    if zoo.zoo_version() and "FetchReach-v1" in zoo.zoo_entries("sac"):  # (normalize True, with HerReplayBuffer)
        fetch = zoo.translate("sac", "FetchReach-v1")
        assert fetch.hyperparameters["normalize_obs"] is True and fetch.hyperparameters["her"] is True
        assert fetch.hyperparameters["normalize_reward"] is True and fetch.status == "full"


def test_policy_kwargs_net_arch_and_activation():
    same = translated("ppo", {"policy_kwargs": "dict(net_arch=dict(pi=[256, 256], vf=[256, 256]), "
                                               "activation_fn=nn.ReLU, log_std_init=-2)"})
    assert same.hyperparameters["net_arch"] == [256, 256]
    assert same.hyperparameters["activation"] == "relu" and same.hyperparameters["log_std_init"] == -2
    assert same.status == "full"
    assert translated("sac", {"policy_kwargs": "dict(net_arch=[400, 300])"}).hyperparameters["net_arch"] == [400, 300]
    assert translated("td3", {"policy_kwargs": "dict(net_arch=dict(pi=[64], qf=[64]))"}).hyperparameters[
        "net_arch"] == [64]
    split = translated("ppo", {"policy_kwargs": "dict(net_arch=dict(pi=[64], vf=[256]))"})
    assert refused(split) == {"policy_kwargs.net_arch"} and "net_arch" not in split.hyperparameters
    for name, expected in [("th.nn.Tanh", "tanh"), ("torch.nn.ELU", "elu"), ("nn.SiLU", "silu"),
                           ("nn.LeakyReLU", "leaky_relu"), ("th.nn.Mish", "mish"), ("nn.Sigmoid", "sigmoid")]:
        assert translated("a2c", {"policy_kwargs": f"dict(activation_fn={name})"}).hyperparameters[
            "activation"] == expected
    # policy_kwargs written as a YAML mapping: its activation_fn is text (it read "nn.ReLU: rlspeed's activations are
    # nn.Tanh, nn.ReLU, ...")
    assert translated("ppo", {"policy_kwargs": {"activation_fn": "nn.ReLU", "net_arch": [32]}},
                      strict=True).hyperparameters["activation"] == "relu"
    # (by the `activation` keyword's rule, one for both: the translation refused rlspeed's own name as text, and
    # torch's module path, which the keyword takes)
    for text in ("leaky_relu", "torch.nn.modules.activation.LeakyReLU"):
        assert build_config(ALGORITHMS["ppo"].config_cls, {"activation": text}).activation == "leaky_relu"
        assert translated("ppo", {"policy_kwargs": {"activation_fn": text}},
                          strict=True).hyperparameters["activation"] == "leaky_relu"
    for given in ("nn.Hardtanh", "[nn.ReLU]"):
        assert refused(translated("ppo", {"policy_kwargs": f"dict(activation_fn={given})"})) == {
            "policy_kwargs.activation_fn"}
    # RL-Zoo's PPO CarRacing-v3 entry's policy_kwargs (its nn.GELU was refused: "rlspeed's activations are nn.Tanh,
    # nn.ReLU, nn.ELU, nn.SiLU")
    car = translated("ppo", {"policy_kwargs": "dict(log_std_init=-2, ortho_init=False, activation_fn=nn.GELU, "
                                              "net_arch=dict(pi=[256], vf=[256]), )"})
    assert car.status == "full" and car.hyperparameters["activation"] == "gelu"
    for given in ("dict(activation_fn=nn.PReLU)", {"activation_fn": "prelu"}):  # (as activation="prelu" is told)
        prelu = translated("ppo", {"policy_kwargs": given})
        assert refused(prelu) == {"policy_kwargs.activation_fn"} and "learns its slope" in prelu.unsupported[0]
    for algo in ("ppo", "a2c", "recurrent_ppo", "sac", "td3", "ddpg", "dqn"):  # (every rlspeed algorithm has it)
        plain = translated(algo, {"policy_kwargs": "dict(ortho_init=False)"})
        assert plain.status == "full" and plain.hyperparameters["ortho_init"] is False
    assert translated("ppo", {"policy_kwargs": "dict(ortho_init=True)"}).status == "full"
    assert refused(translated("sac", {"policy_kwargs": "dict(ortho_init=1)"})) == {"policy_kwargs.ortho_init"}
    for algo in ("sac", "td3", "ddpg", "dqn"):  # SB3's off-policy networks: PyTorch's initialisation, Adam eps 1e-8
        defaults = translated(algo, {}).hyperparameters
        assert (defaults["ortho_init"], defaults["adam_eps"]) == (False, 1e-8), algo
        assert translated(algo, {"policy_kwargs": "dict(ortho_init=True)"}).hyperparameters["ortho_init"] is True
    # gSDE's squashing and mean clipping: SB3's defaults are what rlspeed does; other values are refused
    assert translated("ppo", {"policy_kwargs": "dict(squash_output=False)"}).status == "full"
    assert translated("sac", {"policy_kwargs": "dict(clip_mean=2.0, squash_output=True)"}).status == "full"
    assert refused(translated("ppo", {"policy_kwargs": "dict(squash_output=True)"})) == {"policy_kwargs.squash_output"}
    assert refused(translated("sac", {"policy_kwargs": "dict(clip_mean=1.0)"})) == {"policy_kwargs.clip_mean"}
    gsde = translated("sac", {"policy_kwargs": "dict(log_std_init=-3, use_expln=True)"})  # gSDE's options
    assert gsde.status == "full" and (gsde.hyperparameters["log_std_init"], gsde.hyperparameters["use_expln"]) == (
        -3, True)
    assert refused(translated("td3", {"policy_kwargs": "dict(log_std_init=-3, use_expln=True)"})) == {
        "policy_kwargs.log_std_init", "policy_kwargs.use_expln"}


def test_policy_kwargs_features_extractor_options_become_the_cnn_encoders_options():
    """SB3's `features_extractor_kwargs=dict(features_dim=N)` (CombinedExtractor's `cnn_output_dim` too) is
    `cnn_features_dim` and `normalize_images` is `normalize_images`, for every algorithm (each has both); the
    extractor's other options and `features_extractor_class` are not honoured, with the reason."""
    cnn = "dict(features_extractor_kwargs=dict(features_dim=64), normalize_images=False, net_arch=[32])"
    for algo in ALGORITHMS:
        translation = translated(algo, {"policy": "CnnLstmPolicy" if algo == "recurrent_ppo" else "CnnPolicy",
                                        "policy_kwargs": cnn})
        assert translation.status == "full", (algo, translation.unsupported)
        hyper = translation.hyperparameters
        assert (hyper["cnn_features_dim"], hyper["normalize_images"], hyper["encoder"]) == (64, False, "cnn"), algo
    multi = translated("ppo", {"policy": "MultiInputPolicy",
                               "policy_kwargs": "dict(features_extractor_kwargs=dict(cnn_output_dim=128))"})
    assert multi.status == "full" and multi.hyperparameters["cnn_features_dim"] == 128
    extractor = "dict(features_extractor_class=NatureCNN, features_extractor_kwargs=dict(features_dim=256, " \
                "normalized_image=True))"
    other = translated("dqn", {"policy_kwargs": extractor})
    assert refused(other) == {"policy_kwargs.features_extractor_class",
                              "policy_kwargs.features_extractor_kwargs.normalized_image"}
    assert other.hyperparameters["cnn_features_dim"] == 256 and other.status == "partial"
    assert all("no such option" not in line for line in other.unsupported)
    assert refused(translated("ppo", {"policy_kwargs": "dict(features_extractor_kwargs=64)"})) == {
        "policy_kwargs.features_extractor_kwargs"}


def test_schedules():
    ppo = translated("ppo", {"learning_rate": "lin_3e-4", "clip_range": "lin_0.2"}).hyperparameters
    assert (ppo["learning_rate"], ppo["anneal_lr"], ppo["clip_range"], ppo["anneal_clip"]) == (3e-4, True, 0.2, True)
    constant = translated("ppo", {"learning_rate": 1e-3, "clip_range": 0.1}).hyperparameters
    assert (constant["anneal_lr"], constant["anneal_clip"]) == (False, False)
    assert translated("a2c", {"learning_rate": "lin_7e-4"}).hyperparameters["anneal_lr"] is True
    for algo in ("sac", "td3", "ddpg", "dqn"):  # (off-policy: SB3 keeps a constant rate unless given a schedule)
        annealed = translated(algo, {"learning_rate": "lin_7.3e-4"})
        assert annealed.status == "full", algo
        assert (annealed.hyperparameters["learning_rate"], annealed.hyperparameters["anneal_lr"]) == (7.3e-4, True)
        assert translated(algo, {"learning_rate": 1e-3}).hyperparameters.get("anneal_lr", False) is False
    assert refused(translated("sac", {"clip_range": "lin_0.2"})) == {"clip_range"}  # (SAC has no clip range)
    assert refused(translated("ppo", {"learning_rate": "exp_1e-3"})) == {"learning_rate"}
    # RL-Zoo's other spelling, and a number YAML 1.1 read as text (`3e-4`): RL-Zoo's values, not rlspeed's defaults
    linear = translated("ppo", {"learning_rate": "linear_1e-3", "clip_range": "3e-4"})
    assert linear.status == "full"
    assert (linear.hyperparameters["learning_rate"], linear.hyperparameters["anneal_lr"]) == (1e-3, True)
    assert (linear.hyperparameters["clip_range"], linear.hyperparameters["anneal_clip"]) == (3e-4, False)
    # RL-Zoo anneals clip_range_vf too; rlspeed holds it at the start, and says so
    vf = translated("ppo", {"clip_range_vf": "lin_0.2"})
    assert refused(vf) == {"clip_range_vf"} and vf.hyperparameters["clip_range_vf"] == 0.2


def test_on_policy_schedules_say_where_their_progress_is_taken():
    """rlspeed's on-policy updates take the annealed value at the step count before the rollout, SB3's after it: a
    translated lin_X says so among the differences (off-policy algorithms take SB3's)."""
    ppo = translated("ppo", {"learning_rate": "lin_3e-4", "clip_range": "lin_0.2"})
    assert [line.split(" ")[0] for line in ppo.differences] == ["learning_rate", "clip_range"]
    assert all("before its rollout" in line for line in ppo.differences)
    assert not translated("sac", {"learning_rate": "lin_7.3e-4"}).differences
    assert not translated("ppo", {"learning_rate": 3e-4}).differences


def test_meaning_differences():
    ppo = translated("ppo", {"vf_coef": 0.5})
    assert ppo.hyperparameters["vf_coef"] == 1.0 and any("vf_coef" in note for note in ppo.notes)
    assert translated("a2c", {"vf_coef": 0.25}).hyperparameters["vf_coef"] == 0.25  # A2C: SB3's full MSE
    sac = translated("sac", {"ent_coef": "auto_0.1", "target_entropy": "auto"}).hyperparameters
    assert (sac["ent_coef"], sac["ent_coef_init"], sac["target_entropy"]) == (None, 0.1, None)
    assert translated("sac", {"ent_coef": 0.05}).hyperparameters["ent_coef"] == 0.05
    assert translated("ddpg", {"train_freq": [4, "step"]}).hyperparameters["train_freq"] == 4
    episode = translated("ddpg", {"train_freq": [1, "episode"], "gradient_steps": -1})
    assert refused(episode) == {"train_freq"} and episode.hyperparameters["gradient_steps"] == -1
    # a fixed gradient_steps per episode would become that many per env step (200x as many updates on Pendulum)
    per_episode = translated("sac", {"train_freq": [1, "episode"], "gradient_steps": 8})
    assert per_episode.status == "none" and "8 updates per episode" in "; ".join(per_episode.blocking)
    td3 = translated("td3", {"noise_type": "ornstein-uhlenbeck", "noise_std": 0.5}).hyperparameters
    assert (td3["action_noise"], td3["action_noise_std"]) == ("ornstein-uhlenbeck", 0.5)
    assert translated("td3", {"use_sde": False}).status == "full"  # SB3's default: nothing to honour
    assert refused(translated("td3", {"use_sde": True})) == {"use_sde"}  # (TD3 has no gSDE, in SB3 either)
    sac = translated("sac", {"use_sde": True, "use_sde_at_warmup": True, "sde_sample_freq": 64,
                             "policy_kwargs": "dict(log_std_init=-3.67, use_expln=True)"})
    assert sac.status == "full" and sac.hyperparameters["use_sde_at_warmup"] is True
    sde = translated("a2c", {"use_sde": True, "sde_sample_freq": 16,
                             "policy_kwargs": "dict(log_std_init=-2, full_std=False, use_expln=True)"})
    assert sde.status == "full"
    assert {k: sde.hyperparameters[k] for k in ("use_sde", "sde_sample_freq", "log_std_init", "full_std",
                                                 "use_expln")} == {"use_sde": True, "sde_sample_freq": 16,
                                                                   "log_std_init": -2, "full_std": False,
                                                                   "use_expln": True}
    lstm = translated("recurrent_ppo", {"use_sde": True, "sde_sample_freq": 4,
                                        "policy_kwargs": "dict(full_std=False, use_expln=True)"})
    assert lstm.status == "full"  # (sb3-contrib's RecurrentPPO has gSDE, and rlspeed's since)
    assert {k: lstm.hyperparameters[k] for k in ("use_sde", "sde_sample_freq", "full_std", "use_expln")} == {
        "use_sde": True, "sde_sample_freq": 4, "full_std": False, "use_expln": True}


def test_what_changes_the_problem_makes_the_entry_unusable():
    atari = translated("ppo", {"policy": "CnnPolicy", "frame_stack": 4,
                               "env_wrapper": ["stable_baselines3.common.atari_wrappers.AtariWrapper"]})
    assert atari.status == "none" and refused(atari) == {"frame_stack", "env_wrapper"}
    assert "AtariWrapper" in " ".join(atari.blocking)


def test_sb3_policy_classes_become_rlspeeds_encoders():
    cnn = translated("ppo", {"policy": "CnnPolicy"})  # SB3's CnnPolicy: linear heads on the CNN's features
    assert cnn.status == "full" and (cnn.hyperparameters["encoder"], cnn.hyperparameters["net_arch"]) == ("cnn", [])
    sized = translated("dqn", {"policy_kwargs": "dict(net_arch=[256])", "policy": "CnnPolicy"})
    assert sized.hyperparameters["net_arch"] == [256]
    assert translated("a2c", {"policy": "CnnPolicy", "policy_kwargs": "dict(net_arch=[64])"}).hyperparameters[
        "net_arch"] == [64]
    sac = translated("sac", {"policy": "CnnPolicy"})  # (SAC's CnnPolicy keeps SAC's MLP heads)
    assert sac.hyperparameters["encoder"] == "cnn" and "net_arch" not in sac.hyperparameters
    assert translated("recurrent_ppo", {"policy": "CnnLstmPolicy"}).hyperparameters["encoder"] == "cnn"
    assert translated("sac", {"policy": "MultiInputPolicy"}).hyperparameters["encoder"] == "auto"
    assert translated("ppo", {"policy": "MlpPolicy"}).status == "full"
    assert refused(translated("ppo", {"policy": "LinearPolicy"})) == {"policy"}
    assert refused(translated("ppo", {"policy": "MlpLstmPolicy"})) == {"policy"}


def test_values_that_fail_together_refuse_the_entry():
    translation = translated("ppo", {"n_envs": 1, "n_steps": 100, "batch_size": 64})  # 64 does not divide 100
    assert translation.status == "none" and "batch_size" in translation.blocking[0]


def test_recurrent_batch_size_is_honoured_as_sb3_contrib_takes_it():
    """RL-Zoo's PendulumNoVel-v1 (n_steps 1024, sb3-contrib's default batch_size 128) had its batch_size rounded up to
    whole env columns of 1024 steps (8x fewer gradient steps) and said under not_honoured: RecurrentPPO's minibatches
    are now batch_size steps of sequences, as sb3-contrib's."""
    for entry, batch_size in (({"n_envs": 4, "n_steps": 1024}, 128),
                              ({"n_envs": 8, "n_steps": 32, "batch_size": 64}, 64)):
        translation = translated("recurrent_ppo", entry)
        assert translation.unsupported == [] and translation.status == "full"
        config = build_config(ALGORITHMS["recurrent_ppo"].config_cls, translation.hyperparameters)
        assert config.batch_size == batch_size and config.num_steps == entry["n_steps"]


def test_unknown_keys_are_named_and_blocking_only_in_a_users_file():
    assert refused(translated("ppo", {"n_stepz": 8})) == {"n_stepz"}
    assert translated("ppo", {"n_stepz": 8}).status == "partial"
    assert translated("ppo", {"n_stepz": 8}, strict=True).status == "none"


# --- every entry of the installed RL-Zoo YAMLs ------------------------------------------------------------------------
@requires_zoo
@pytest.mark.parametrize("algo", sorted(zoo.ZOO_NAMES))
def test_every_installed_zoo_entry_translates_or_says_why_not(algo):
    config_cls = ALGORITHMS[algo].config_cls
    entries = zoo.zoo_entries(algo)
    assert entries
    for env_id, entry in entries.items():
        translation = zoo.translate_entry(algo, entry, env_id)
        if translation.status != "none":  # what it gives builds
            build_config(config_cls, translation.hyperparameters)
        assert "total_timesteps" in translation.run, env_id
        for line in translation.unsupported:
            key, _, why = line.partition(": ")
            assert key and len(why) > 10, f"{env_id}: {line!r}"
        # nothing silently dropped: every key (and policy_kwargs key) translated, refused or noted as needing nothing
        said = {line.split(":")[0].split(" ")[0] for line in translation.unsupported + translation.notes}
        keys = set(entry)
        if isinstance(entry.get("policy_kwargs"), str) and "policy_kwargs" not in said:
            keys = (keys - {"policy_kwargs"}) | {f"policy_kwargs.{k}"
                                                 for k in zoo.parse_python_literal(entry["policy_kwargs"])}
        for key in keys:
            assert key in translation.translated or key in said, f"{algo} {env_id}: {key}"


@requires_zoo
def test_translate_reads_the_installed_yaml():
    translation = zoo.translate("ppo", "CartPole-v1")
    entry = zoo.zoo_entries("ppo")["CartPole-v1"]
    assert translation.hyperparameters["num_steps"] == entry["n_steps"]
    assert translation.run["total_timesteps"] == int(entry["n_timesteps"])
    assert "rl_zoo3" in translation.source and "ppo CartPole-v1" in translation.source
    with pytest.raises(UserError, match="no dqn preset for Pendulum-v1"):
        zoo.translate("dqn", "Pendulum-v1")


# --- load_preset: sources ---------------------------------------------------------------------------------------------
def test_the_existing_call_gives_rlspeeds_own_presets():
    preset = load_preset("ppo", "CartPole-v1")
    assert preset.source == "rlspeed" and preset["num_steps"] == 8
    assert preset.message() == "rlspeed: using rlspeed's preset for ppo CartPole-v1."
    assert load_preset("ppo", "rlspeed/CartPole-v1") == preset
    default = load_preset("ppo", "NoSuchEnv-v0")
    assert default.source == "rlspeed-default" and default == load_preset("ppo", "default")


def test_auto_prefers_rlspeeds_own_preset():
    assert load_preset("ppo", "CartPole-v1", "auto") == load_preset("ppo", "CartPole-v1", "rlspeed")
    assert load_preset("ppo", "CartPole-v1", "auto").source == "rlspeed"


@requires_zoo
@pytest.mark.parametrize("algo, env_id", [("a2c", "Acrobot-v1"), ("dqn", "LunarLander-v3")])
def test_auto_takes_rl_zoos_preset_where_rlspeed_has_none_and_says_so(algo, env_id):
    assert load_preset(algo, env_id, "rlspeed").source == "rlspeed-default"
    preset = load_preset(algo, env_id, "auto")
    translation = zoo.translate(algo, env_id)
    assert preset.source == "zoo" and dict(preset) == {**translation.run, **translation.hyperparameters}
    assert preset.message().startswith(f"rlspeed: using RL-Zoo's preset for {algo} {env_id} (rl_zoo3 ")
    assert preset.unsupported == translation.unsupported
    if translation.unsupported:
        assert "not honoured: " + translation.unsupported[0] in preset.message()
    build_config(ALGORITHMS[algo].config_cls, split_run_settings(preset)[1])


@requires_zoo
def test_auto_falls_back_to_the_default_when_rl_zoos_entry_needs_what_rlspeed_has_not():
    preset = load_preset("ppo", "CarRacing-v3", "auto")  # no rlspeed entry; RL-Zoo's needs a wrapper, 2 frames
    assert preset.source == "rlspeed-default" and "frame_stack" in preset.message()
    with pytest.raises(UserError, match="frame_stack"):
        load_preset("ppo", "CarRacing-v3", "zoo")


@pytest.mark.skipif(importlib.util.find_spec("ale_py") is None, reason="Atari needs ale-py")
@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_every_atari_game_takes_the_atari_preset_and_rl_zoos_atari_entry_translates(algo):
    """A game without an entry of its own gets the `atari` entry (it got the MLP-tuned default: 10 epochs, reward
    normalisation over clipped rewards, a 1M replay); RL-Zoo's `atari` entry, whose AtariWrapper and 4 stacked frames
    rlspeed's Atari envs apply, translates instead of being refused, into the same values where both set one."""
    own = load_preset(algo, "AsterixNoFrameskip-v4", "auto")
    assert own.source == "rlspeed" and dict(own) == dict(load_preset(algo, "BreakoutNoFrameskip-v4", "rlspeed"))
    assert dict(load_preset(algo, "ALE/Alien-v5")) == dict(own)
    if zoo.zoo_version() is None:
        return
    translated = load_preset(algo, "PongNoFrameskip-v4", "zoo")
    assert translated.unsupported == [] and any("AtariWrapper" in note for note in translated.notes)
    shared = set(translated) & set(own) - {"ortho_init", "adam_eps", "anneal_lr"}  # (the DQN preset's comment)
    assert shared and {key: translated[key] for key in shared} == {key: own[key] for key in shared}


@pytest.mark.skipif(importlib.util.find_spec("ale_py") is None, reason="Atari needs ale-py")
@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_an_atari_game_s_ram_variant_is_not_given_the_image_preset(algo):
    """`--env-kwargs obs_type=ram` makes a game of 128 bytes: the Atari preset's CNN encoder was refused for it (and
    with encoder=auto, its linear heads on raw bytes were kept); it takes the default preset, saying why."""
    for env_id, source in (("ALE/Pong-v5", "auto"), ("PongNoFrameskip-v4", "rlspeed"), ("ALE/Alien-v5", "auto")):
        ram = load_preset(algo, env_id, source, {"obs_type": "ram"})
        assert ram.source == "rlspeed-default" and "not obs_type=ram" in ram.origin
        assert dict(ram) == dict(load_preset(algo, "NoSuchGame-v0", "rlspeed"))
        assert load_preset(algo, env_id, source, {"obs_type": "grayscale"}).source == "rlspeed"
    with pytest.raises(UserError, match="RL-Zoo's Atari entry for ALE/Pong-v5 is for its images, not obs_type=ram"):
        load_preset(algo, "ALE/Pong-v5", "zoo", {"obs_type": "ram"})


@requires_zoo
@pytest.mark.skipif(importlib.util.find_spec("ale_py") is None, reason="Atari needs ale-py")
@pytest.mark.parametrize("algo", ["ppo", "dqn", "a2c"])
def test_rl_zoos_atari_entry_copied_into_a_users_file_serves_every_game_as_preset_zoo_does(tmp_path, algo):
    """RL-Zoo's file layout with its `atari` entry (AtariWrapper, frame_stack 4) copied into one's own file: the
    values `--preset zoo` takes, for every Atari image id (the entry was not looked up, and under the game's own id
    its AtariWrapper and frame stack were refused as for a non-Atari env); not for a game's RAM."""
    entry = zoo.zoo_entries(algo)["atari"]
    entry = {key: value for key, value in entry.items() if key != "policy_kwargs" or algo != "a2c"}  # (RMSpropTFLike)
    for env_id in ("PongNoFrameskip-v4", "ALE/Breakout-v5"):
        for key in ("atari", env_id):
            path = tmp_path / f"{algo}.yml"
            path.write_text(yaml.safe_dump({key: entry, "CartPole-v1": {"n_envs": 2}}))
            mine = load_preset(algo, env_id, str(path))
            assert dict(mine) == {**zoo.translate_entry(algo, entry, "RL-Zoo", atari=True).run,
                                  **zoo.translate_entry(algo, entry, "RL-Zoo", atari=True).hyperparameters}
            assert mine["encoder"] == "cnn"
    if algo != "a2c":
        assert dict(mine) == dict(load_preset(algo, "ALE/Breakout-v5", "zoo"))
    with pytest.raises(UserError, match="no entry for ALE/Pong-v5"):  # (RAM: 128 bytes, not the images it is for)
        path.write_text(yaml.safe_dump({"atari": entry}))
        load_preset(algo, "ALE/Pong-v5", str(path), {"obs_type": "ram"})


@requires_zoo
def test_rl_zoos_atari_entry_serves_every_game_id_and_a_mujoco_v5_id_its_v4_entry_said():
    """RL-Zoo gives every id ale-py makes its `atari` entry (Pong-v4 too, not only NoFrameskip and ALE/ ids: those
    got rlspeed's default with "RL-Zoo has none either"); a MuJoCo v5 id RL-Zoo lacks takes its v4 entry (DDPG
    HalfCheetah-v5 had learning_starts 100 where RL-Zoo's has 10,000), and the run says so; where rlspeed behaves
    otherwise than SB3 with an entry (Atari's FIRE), the run's line says it too."""
    pytest.importorskip("ale_py")
    pong = load_preset("a2c", "Pong-v4", "auto")
    assert pong.source == "zoo" and "differs from SB3: AtariWrapper" in pong.message()
    assert pong.differences and set(pong.differences) <= set(pong.notes)
    pytest.importorskip("mujoco")
    cheetah = load_preset("ddpg", "HalfCheetah-v5", "auto")
    assert cheetah.source == "zoo" and "its HalfCheetah-v4 entry: RL-Zoo has none for v5" in cheetah.message()
    assert dict(cheetah) == dict(load_preset("ddpg", "HalfCheetah-v4", "zoo"))
    with pytest.raises(UserError, match="RL-Zoo .* has no ddpg preset for CartPole-v5"):
        zoo.translate("ddpg", "CartPole-v5")  # (not a MuJoCo id: no older entry taken)


@requires_zoo
def test_a_mujoco_v5_id_whose_newest_rl_zoo_entry_is_v2_takes_it_and_says_so():
    """RL-Zoo's tuned PPO entries for InvertedPendulum, InvertedDoublePendulum and Reacher are for the v2 ids: `rlspeed
    train ppo InvertedPendulum-v5` said "RL-Zoo has none either" and trained with rlspeed's default; it takes the v2
    entry (and the v4 one where there is one: Humanoid), as the run's line says."""
    pytest.importorskip("mujoco")
    pendulum = load_preset("ppo", "InvertedPendulum-v5", "auto")
    assert pendulum.source == "zoo" and "its InvertedPendulum-v2 entry: RL-Zoo has none for v5, v4 or v3, whose " \
        "envs revise v2's" in pendulum.message()
    entry = zoo.zoo_entries("ppo")["InvertedPendulum-v2"]
    assert pendulum["num_steps"] == entry["n_steps"] and pendulum["learning_rate"] == entry["learning_rate"]
    assert "its Humanoid-v4 entry: RL-Zoo has none for v5, whose" in load_preset("ppo", "Humanoid-v5", "auto").message()


@requires_zoo
def test_a_gymnasium_robotics_id_takes_rl_zoos_entry_of_its_older_version_and_says_so(monkeypatch):
    """RL-Zoo's SAC entry for FetchReach (HER, [64, 64], lr 1e-3, gamma 0.95) is for FetchReach-v1, while
    Gymnasium-Robotics registers FetchReach-v4: `rlspeed train sac gymnasium_robotics:FetchReach-v4` said "RL-Zoo has
    none either" and trained rlspeed's default SAC without HER, which does not learn the sparse task in RL-Zoo's
    20,000 steps. It takes the v1 entry, as the run's line says; an id of that name from another package does not."""
    import gymnasium as gym

    monkeypatch.setitem(gym.registry, "FetchReach-v4", gym.envs.registration.EnvSpec(
        "FetchReach-v4", entry_point="gymnasium_robotics.envs.fetch.reach:MujocoFetchReachEnv"))
    fetch = load_preset("sac", "FetchReach-v4", "auto")
    assert fetch.source == "zoo" and fetch["her"] is True and fetch["net_arch"] == [64, 64]
    assert "its FetchReach-v1 entry: RL-Zoo has none for v4, v3 or v2, Gymnasium-Robotics'" in fetch.message()
    assert dict(fetch) == dict(load_preset("sac", "FetchReach-v4", "zoo"))
    monkeypatch.setitem(gym.registry, "FetchReach-v4", gym.envs.registration.EnvSpec(
        "FetchReach-v4", entry_point="my_robots:Reach"))
    assert load_preset("sac", "FetchReach-v4", "auto").source == "rlspeed-default"


def test_zoo_without_rl_zoo3_is_one_sentence_with_the_pip_command(monkeypatch):
    monkeypatch.setattr(zoo, "_package_dir", lambda: None)
    with pytest.raises(UserError, match="pip install rl_zoo3"):
        load_preset("a2c", "Acrobot-v1", "zoo")
    preset = load_preset("a2c", "Acrobot-v1", "auto")
    assert preset.source == "rlspeed-default" and "pip install rl_zoo3" in preset.message()


# --- a user's file (--preset FILE) ------------------------------------------------------------------------------------
def test_a_users_file_round_trip(tmp_path):
    shipped = {env_id: dict(load_preset("ppo", env_id)) for env_id in ("CartPole-v1", "Pendulum-v1")}
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump({**shipped, "default": {"num_envs": 4, "total_timesteps": 1000}}))
    for env_id, values in shipped.items():
        preset = load_preset("ppo", env_id, str(path))
        assert dict(preset) == values and preset.source == "file"
        assert f"{path} ({env_id} entry), rlspeed's format" in preset.message()
    assert load_preset("ppo", "Acrobot-v1", str(path)) == {"num_envs": 4, "total_timesteps": 1000}
    flat = tmp_path / "flat.yaml"
    flat.write_text("num_envs: 2\nlearning_rate: 1.0e-3\n")
    assert load_preset("ppo", "Anything-v0", str(flat)) == {"num_envs": 2, "learning_rate": 1e-3}
    # a hyperparameter that holds a mapping (SB3's net_arch form) belongs to the flat entry, not an env id
    flat.write_text("net_arch: {pi: [32], vf: [32]}\n")
    assert load_preset("ppo", "CartPole-v1", str(flat)) == {"net_arch": {"pi": [32], "vf": [32]}}
    flat.write_text("net_arch: {pi: [32], vf: [32]}\nlearning_rate: 1.0e-3\n")
    assert load_preset("ppo", "CartPole-v1", str(flat))["learning_rate"] == 1e-3


def test_a_users_file_in_rl_zoos_format_is_detected_and_translated(tmp_path):
    path = tmp_path / "zoo.yml"
    path.write_text("CartPole-v1:\n  n_envs: 8\n  n_timesteps: !!float 1e5\n  policy: 'MlpPolicy'\n"
                    "  n_steps: 32\n  learning_rate: lin_0.001\n  policy_kwargs: 'dict(net_arch=[32])'\n")
    preset = load_preset("ppo", "CartPole-v1", str(path))
    assert "RL-Zoo's format" in preset.message()
    assert (preset["num_envs"], preset["num_steps"], preset["total_timesteps"]) == (8, 32, 100_000)
    assert (preset["learning_rate"], preset["anneal_lr"], preset["net_arch"]) == (1e-3, True, [32])
    path.write_text("CartPole-v1:\n  n_timesteps: 1000\n  policy: MlpPolicy\n  learning_rate: linear_1e-3\n")
    preset = load_preset("ppo", "CartPole-v1", str(path))
    assert (preset["learning_rate"], preset["anneal_lr"]) == (1e-3, True)
    path.write_text("CartPole-v1:\n  n_timesteps: 1000\n  policy: MlpPolicy\n  frame_stack: 4\n")
    with pytest.raises(UserError, match="frame_stack"):
        load_preset("ppo", "CartPole-v1", str(path))
    # keys about SB3's own logging change nothing rlspeed trains: noted, not refused as values it cannot honour are
    path.write_text("CartPole-v1:\n  n_envs: 2\n  stats_window_size: 10\n  monitor_kwargs: {}\n")
    preset = load_preset("ppo", "CartPole-v1", str(path))
    assert preset["num_envs"] == 2 and "stats_window_size" in preset.message()


@pytest.mark.parametrize("text, match", [
    ("CartPole-v1:\n  num_envz: 4\n", "num_envz"),  # rlspeed's format: unknown key named
    ("CartPole-v1:\n  n_timesteps: 1000\n  policy: MlpPolicy\n  n_stepz: 4\n", "n_stepz"),  # RL-Zoo's format
    # a schedule or value rlspeed cannot follow in RL-Zoo's format: refused, not trained with another value
    ("CartPole-v1:\n  n_timesteps: 1000\n  policy: MlpPolicy\n  learning_rate: exp_1e-3\n", "learning_rate"),
    ("CartPole-v1:\n  n_timesteps: 1000\n  policy: MlpPolicy\n  clip_range_vf: lin_0.2\n", "clip_range_vf"),
    ("CartPole-v1:\n  n_timesteps: 1000\n  policy: MlpPolicy\n  gamma: 2.0\n", "gamma"),
    ("CartPole-v1:\n  gamma: 2.0\n", "gamma"),
    ("CartPole-v1:\n  total_timesteps: abc\n", "total_timesteps"),  # (a run setting)
    # RL-Zoo's run setting and vf_coef (doubled for PPO): checked as rlspeed's, never truncated or a traceback
    ("CartPole-v1:\n  n_envs: 2\n  n_timesteps: abc\n", "n_timesteps: .*'abc'"),
    ("CartPole-v1:\n  n_envs: 2\n  n_timesteps: 2048.7\n", "n_timesteps: .*2048.7"),
    ("CartPole-v1:\n  n_envs: 2\n  n_timesteps: 0\n", "n_timesteps: .*positive"),
    ("CartPole-v1:\n  n_envs: 2\n  vf_coef: abc\n", "vf_coef: .*'abc'"),
    ("CartPole-v1:\n  n_envs: 2\n  vf_coef: null\n", "vf_coef: .*None"),
    # what rlspeed cannot honour in a user's own file: refused, not trained without it (rlspeed's format refuses
    # another algorithm's key too)
    ("CartPole-v1:\n  n_envs: 2\n  buffer_size: 100000\n", "buffer_size: rlspeed's ppo has no buffer_size"),
    ("CartPole-v1:\n  n_envs: 2\n  policy_kwargs: 'dict(activation_fn=nn.Hardtanh)'\n", "activation_fn: nn.Hardtanh"),
    ("CartPole-v1:\n  normalize: \"{'norm_obs': True, 'epsilon': 1e-4}\"\n", "normalize.epsilon"),
    ("Pendulum-v1:\n  num_envs: 4\n", "no entry for CartPole-v1"),
    ("CartPole-v0:\n  num_envs: 4\n", "no entry for CartPole-v1 .*: CartPole-v0 is another version of the env"),
    # the model's arguments, not hyperparameters: the flag to give (it read "Unknown hyperparameter 'seed' ... Valid:
    # ...", and a mapping of env options "mixes env entries and hyperparameters")
    ("num_envs: 4\nseed: 42\n", "'seed' is an argument of the model, .*--seed N on rlspeed train's command line"),
    ("num_envs: 4\nenv_kwargs: {sutton_barto_reward: true}\n", "'env_kwargs' is an argument .*--env-kwargs KEY="),
    ("CartPole-v1:\n  device: cuda\n", "'device' is an argument of the model, .*--device"),
    ("ppo:\n  CartPole-v1:\n    num_envs: 4\n", "no entry for CartPole-v1 .*: ppo names an algorithm; a preset file"),
    ("CartPole-v1:\n  num_envs: 4\nnum_steps: 8\n", "mixes"),
    ("CartPole-v1: 5\n", "entry CartPole-v1 holds 5, not hyperparameters"),  # an env's entry must be a mapping
    ("default: lin_3e-4\n", "entry default holds"),
    # an env's entry left empty (its lines commented out) beside others: named (it read "mixes env entries and
    # hyperparameters at the top level")
    ("CartPole-v1:\n#  num_envs: 4\ndefault:\n  num_envs: 8\n", "entry CartPole-v1 holds nothing, not hyper"),
    ("Pendulum-v1:\n  num_envs: 4\nAcrobot-v1: 8\n", "entry Acrobot-v1 holds 8, not hyper"),
    ("- 1\n- 2\n", "must map env ids"),
    ("CartPole-v1: [\n", "not valid YAML"),
    # what is wrong, not what PyYAML was doing ("while scanning for the next token")
    ("CartPole-v1:\n\tnum_envs: 4\n", "line 2, column 1\\): found character .* not a tab"),
    ("num_envs: 4\n---\nnum_envs: 8\n", "line 2, column 1\\): expected a single document .* found another"),
    # YAML reads these as something else than what was written: refused, not used
    ("CartPole-v1:\n  num_envs: 4\n  num_envs: 8\n", "num_envs twice \\(lines 2 and 3\\)"),
    ("num_steps: 4\nnum_steps: 8\n", "num_steps twice"),
    ("CartPole-v1:\n  num_steps: 010\n", "010 with a leading zero.*octal number 8"),
    ("CartPole-v1:\n  num_steps: 1:30\n", "base-60 number 90"),
    ("CartPole-v1:\n  n_envs: 4\n  n_steps: 010\n", "010 with a leading zero.*octal number 8"),  # RL-Zoo's format
])
def test_a_bad_users_file_is_one_sentence_naming_the_file_and_key(tmp_path, text, match):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(UserError, match=match) as error:
        load_preset("ppo", "CartPole-v1", str(path))
    assert str(path) in str(error.value)
    # (one sentence: the reasons joined, a reason's own full stop dropped: "got 2.0.." was printed)
    assert not re.search(r"\.[.;]", str(error.value).replace(str(path), "FILE")), str(error.value)


def test_rlspeeds_own_preset_files_are_read_by_the_rules_of_a_persons_file(tmp_path, monkeypatch):
    """A shipped preset file is written by a person too: a key given twice is refused (it was read as its last
    value), and every shipped file reads so."""
    from rlspeed import presets

    for algo in ALGORITHMS:
        load_preset(algo, "CartPole-v1", "rlspeed")
    (tmp_path / "ppo.yaml").write_text("CartPole-v1:\n  num_envs: 4\n  num_envs: 8\n")
    monkeypatch.setattr(presets.resources, "files", lambda package: tmp_path)
    with pytest.raises(UserError, match="rlspeed's ppo.yaml gives num_envs twice"):
        load_preset("ppo", "CartPole-v1", "rlspeed")


def test_a_shipped_preset_changed_by_its_caller_leaves_the_next_load_as_shipped():
    """The shipped files are parsed once per process (each command and run loads its algorithm's): a load hands out
    its own copy, and a caller that changes it (a nested net_arch too) changes no later load."""
    first = load_preset("ddpg", "Pendulum-v1", "rlspeed")
    shipped = copy.deepcopy(dict(first))
    first["net_arch"].append(8)
    first["learning_rate"] = 0.5
    assert dict(load_preset("ddpg", "Pendulum-v1", "rlspeed")) == shipped and shipped["net_arch"] == [64, 64]


def test_a_users_rl_zoo_file_takes_yaml_11_numbers_and_refuses_a_minibatch_it_would_change(tmp_path):
    """`1e6` (text to YAML 1.1), `!!float 1e6` and `1e2` are those numbers; a batch_size that does not divide the
    rollout (100 of 8 x 32 steps) is refused in a user's own file, naming the sizes to give."""
    path = tmp_path / "zoo.yml"
    path.write_text("n_envs: 8\nn_steps: 32\nn_timesteps: !!float 1e6\nbatch_size: 1e2\n")
    with pytest.raises(UserError, match=rf"{path} .*batch_size \(100\) must divide num_envs \* num_steps \(256\) into "
                                        "sequences .*: batch_size=64 or 128 would do"):
        load_preset("recurrent_ppo", "CartPole-v1", str(path))
    path.write_text("n_envs: 8\nn_steps: 32\nn_timesteps: 1e6\nbatch_size: 1.28e2\nvf_coef: 2.5e-1\n")
    preset = load_preset("recurrent_ppo", "CartPole-v1", str(path))
    assert preset["total_timesteps"] == 1_000_000 and type(preset["total_timesteps"]) is int
    assert preset["vf_coef"] == 0.5
    assert build_config(ALGORITHMS["recurrent_ppo"].config_cls, split_run_settings(preset)[1]).batch_size == 128


@pytest.mark.parametrize("text, match", [
    ("n_envs: 4\nnum_steps: 32\n", "num_steps: rlspeed's name, .*RL-Zoo's format: write n_steps there"),
    ("n_timesteps: 1e4\nlearning_rate: 1e-3\nanneal_lr: true\n", "anneal_lr: .*write learning_rate: lin_X there"),
    ("policy: MlpPolicy\nnet_arch: [64, 64]\n", "net_arch: .*policy_kwargs: \"dict\\(net_arch"),
    ("n_envs: 4\nent_coeff: 0.01\n", "ent_coeff: not a key .*did you mean ent_coef\\?"),
])
def test_a_users_entry_mixing_the_two_formats_is_told_rl_zoos_name(tmp_path, text, match):
    """rlspeed's names in an entry that RL-Zoo's keys make RL-Zoo's format (copied from two places): the sentence
    names what RL-Zoo writes instead (it said only "not a key of RL-Zoo's format that rlspeed knows")."""
    path = tmp_path / "mixed.yml"
    path.write_text(text)
    with pytest.raises(UserError, match=match):
        load_preset("ppo", "CartPole-v1", str(path))


def test_a_users_rl_zoo_file_takes_rlspeeds_run_settings_which_rl_zoo_has_not(tmp_path):
    """eval_freq and target_return beside RL-Zoo's keys (its format has none): the run's (they were refused as keys
    RL-Zoo's format has not, leaving only the command line's flags)."""
    path = tmp_path / "zoo.yml"
    path.write_text("CartPole-v1:\n  n_envs: 4\n  n_timesteps: 1e4\n  eval_freq: 2e3\n  target_return: 200\n")
    preset = load_preset("ppo", "CartPole-v1", str(path))
    assert split_run_settings(preset)[0] == {"total_timesteps": 10_000, "eval_freq": 2000, "target_return": 200.0}
    path.write_text("CartPole-v1:\n  n_envs: 4\n  target_return: high\n")
    with pytest.raises(UserError, match=f"{path} .*target_return: target_return must be a number"):
        load_preset("ppo", "CartPole-v1", str(path))


def test_a_users_train_freq_in_episodes_is_refused_saying_what_to_write_not_what_would_be_used(tmp_path):
    path = tmp_path / "sac.yml"
    path.write_text("n_envs: 1\ntrain_freq: [1, episode]\ngradient_steps: -1\n")
    with pytest.raises(UserError, match="train_freq: .*give train_freq in steps") as error:
        load_preset("sac", "Pendulum-v1", str(path))
    assert "is used" not in str(error.value)


def test_a_missing_preset_file_names_the_choices(tmp_path):
    """The sentence names the file as a preset file, which a Python caller (`load_preset`'s source) and the command
    line (`--preset`) both gave: it named `--preset` to a Python caller."""
    with pytest.raises(UserError, match=r"^The preset file .*missing\.yaml: no such file.*auto, rlspeed") as refused:
        load_preset("ppo", "CartPole-v1", str(tmp_path / "missing.yaml"))
    assert "--preset" not in str(refused.value)
    if os.path.exists(os.devnull) and not os.path.isfile(os.devnull):  # (a device: it said "no such file")
        with pytest.raises(UserError, match=r"is a device or a pipe, not a regular file: give a YAML file"):
            load_preset("ppo", "CartPole-v1", os.devnull)
    with pytest.raises(UserError, match=r"is a directory, not a regular file: give a YAML file, or one of auto"):
        load_preset("ppo", "CartPole-v1", str(tmp_path))


@requires_zoo
def test_auto_leaves_a_preset_tuned_with_gsde_to_an_explicit_zoo_request(monkeypatch):
    """Values tuned around gSDE's exploration do not suit an algorithm without gSDE (RecurrentPPO's before it had
    it, made so here): auto keeps rlspeed's default and says why; --preset zoo still takes them."""
    monkeypatch.setattr(zoo, "SDE_ALGORITHMS", ("ppo", "a2c", "sac"))
    assert any(line.startswith("use_sde") for line in zoo.translate("recurrent_ppo", "PendulumNoVel-v1").unsupported)
    auto = load_preset("recurrent_ppo", "PendulumNoVel-v1", "auto")
    assert auto.source == "rlspeed-default" and "tuned with gSDE" in auto.message()
    assert load_preset("recurrent_ppo", "PendulumNoVel-v1", "zoo").source == "zoo"


@requires_zoo
def test_rl_zoos_recurrent_ppo_pendulum_novel_entry_honours_use_sde():
    """RL-Zoo's ppo_lstm PendulumNoVel-v1 (use_sde, sde_sample_freq 4) was partly translated, gSDE refused, and auto
    kept rlspeed's default: the entry is now used as it is, and builds RecurrentPPO's gSDE policy."""
    translation = zoo.translate("recurrent_ppo", "PendulumNoVel-v1")
    assert translation.status == "full" and translation.hyperparameters["use_sde"] is True
    auto = load_preset("recurrent_ppo", "PendulumNoVel-v1", "auto")
    assert auto.source == "zoo" and auto["use_sde"] is True and auto["sde_sample_freq"] == 4


@requires_zoo
def test_auto_takes_a_gsde_preset_where_the_algorithm_has_gsde():
    """RL-Zoo's ppo MountainCarContinuous-v0 (use_sde, log_std_init -3.29) is used by auto as it is."""
    auto = load_preset("ppo", "MountainCarContinuous-v0", "auto")
    assert auto.source == "zoo"
    assert auto["use_sde"] is True and auto["log_std_init"] == -3.29


def test_set_over_a_shipped_preset_names_what_it_keeps_and_preset_none_trains_on_the_defaults(tmp_path, monkeypatch,
                                                                                            capsys):
    """`--set` over rlspeed's preset keeps the preset's other values and says which (gSDE on Pendulum's PPO preset
    is not what someone giving CleanRL's settings expects); `--preset none` trains with the algorithm's defaults and
    the --set values alone, and says so."""
    from rlspeed import PPO, cli

    monkeypatch.chdir(tmp_path)
    base = ["train", "ppo", "Pendulum-v1", "--set", "num_envs=1", "--no-progress", "--total-timesteps", "256",
            "--target-return", "none"]
    assert cli.main([*base, "--out", "shipped"]) == 0
    err = capsys.readouterr().err
    assert "note: rlspeed's preset for ppo Pendulum-v1 also sets " in err and "use_sde=True" in err
    assert "num_envs=" not in err.split("also sets")[1].split("(--preset none")[0]
    assert cli.main([*base, "--preset", "none", "--out", "none"]) == 0
    captured = capsys.readouterr()
    assert "also sets" not in captured.err and "using ppo's own defaults (--preset none" in captured.out
    recorded = yaml.safe_load((tmp_path / "none" / "config.yaml").read_text())
    assert recorded["preset"]["source"] == "none"
    assert build_config(PPO.config_cls, recorded["hyperparameters"]) == build_config(PPO.config_cls, {"num_envs": 1})


def test_a_runs_config_yaml_is_a_preset_of_its_hyperparameters_and_run_settings(tmp_path, monkeypatch, capsys):
    """Re-running an experiment from its config.yaml (`--preset RUN/config.yaml`): the same hyperparameters and run
    settings (eval_freq null included), the seed and backend named as flags'; a population's or another algorithm's
    config.yaml is one sentence."""
    from rlspeed import cli

    monkeypatch.chdir(tmp_path)
    base = ["train", "ppo", "CartPole-v1", "--no-progress", "--total-timesteps", "512", "--target-return", "none"]
    assert cli.main([*base, "--set", "n_epochs=3", "--set", "learning_rate=1e-3", "--out", "first"]) == 0
    capsys.readouterr()
    assert cli.main(["train", "ppo", "CartPole-v1", "--no-progress", "--preset", "first/config.yaml",
                     "--out", "again"]) == 0
    assert "a run's config.yaml (CartPole-v1); not taken from it: seed 0" in capsys.readouterr().out
    first, again = (yaml.safe_load((tmp_path / name / "config.yaml").read_text()) for name in ("first", "again"))
    assert again["hyperparameters"] == first["hyperparameters"]
    assert (again["total_timesteps"], again["target_return"]) == (512, None)
    other = load_preset_file(tmp_path / "first" / "config.yaml", "ppo", "Acrobot-v1")  # (another env's target: not)
    assert "target_return" not in other and other["n_epochs"] == 3 and "target_return is CartPole-v1's" in other.origin
    with pytest.raises(UserError, match="is the config.yaml of a ppo run: train ppo with it"):
        load_preset_file(tmp_path / "first" / "config.yaml", "a2c", "CartPole-v1")
    assert cli.main([*base, "--seeds", "0,1", "--set", "learning_rate=1e-3,2e-3", "--out", "pop"]) == 0
    with pytest.raises(UserError, match="is a population's config.yaml"):
        load_preset_file(tmp_path / "pop" / "config.yaml", "ppo", "CartPole-v1")


@pytest.mark.parametrize("line, message", [("target_return: high", "target_return must be a number or 'none'"),
                                           ("target_return: .inf", "target_return must be a number or 'none'"),
                                           ("total_timesteps: -5", "total_timesteps must be a positive whole"),
                                           ("eval_freq: 0", "eval_freq must be a positive whole")])
def test_a_bad_run_setting_in_a_preset_file_names_the_file(tmp_path, line, message):
    path = tmp_path / "mine.yaml"
    path.write_text(f"CartPole-v1:\n  {line}\n")
    with pytest.raises(UserError, match=f"mine.yaml \\(CartPole-v1 entry\\): {message}"):
        load_preset_file(path, "ppo", "CartPole-v1")


@requires_zoo
def test_the_coverage_table_in_the_presets_doc_is_the_installed_rl_zoos():
    """docs/presets.md's table (entries fully, partly or not translated per algorithm) counts what `translate_entry`
    does with the rl_zoo3 version it names (it had gone stale: Atari entries translate since)."""
    import pathlib
    import re

    doc = (pathlib.Path(__file__).parents[1] / "docs" / "presets.md").read_text()
    version = re.search(r"Coverage with rl_zoo3 ([\d.]+)", doc).group(1)
    if zoo.zoo_version() != version:
        pytest.skip(f"the table counts rl_zoo3 {version}'s entries; {zoo.zoo_version()} is installed")
    rows = {name.split(" ")[0]: tuple(int(n) for n in numbers)
            for name, *numbers in re.findall(r"^\| (\w[\w ()]*?) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \|$", doc, re.M)}
    for algo in zoo.ZOO_NAMES:
        entries = zoo.zoo_entries(algo)
        statuses = [zoo.translate_entry(algo, entry, "", atari=key == "atari").status for key, entry in entries.items()]
        assert rows[algo] == (len(entries), statuses.count("full"), statuses.count("partial"),
                              statuses.count("none")), algo


def test_replay_buffer_entries_translate_for_off_policy_and_sb3s_default_is_nothing_to_set():
    """HerReplayBuffer and its kwargs become her, n_sampled_goal and goal_selection_strategy; the class None (SB3's
    default) sets nothing for any algorithm (an on-policy entry with it was refused as a whole); another class is
    refused."""
    her = zoo.translate_entry("sac", {"replay_buffer_class": "HerReplayBuffer", "replay_buffer_kwargs":
                                      "dict(n_sampled_goal=2, goal_selection_strategy='final')"}, "")
    assert her.status == "full" and her.hyperparameters["her"] is True
    assert (her.hyperparameters["n_sampled_goal"], her.hyperparameters["goal_selection_strategy"]) == (2, "final")
    assert zoo.translate_entry("ppo", {"replay_buffer_class": None}, "").status == "full"
    assert zoo.translate_entry("td3", {"replay_buffer_class": "PrioritizedReplayBuffer"}, "").status == "none"


def test_a_preset_file_in_another_encoding_or_broken_says_where_and_what_to_do(tmp_path):
    """A preset saved in GBK was "'utf-8' codec can't decode byte 0xce" (and under a C locale a UTF-8 one failed to
    read); invalid YAML named no line."""
    gbk = tmp_path / "gbk.yaml"
    gbk.write_bytes("CartPole-v1:\n  # 中文注释\n  n_steps: 32\n".encode("gbk"))
    with pytest.raises(UserError, match=r"is not UTF-8 text \(byte 0x.. at offset 17\): save it as UTF-8"):
        load_preset_file(gbk, "ppo", "CartPole-v1")
    broken = tmp_path / "broken.yaml"
    broken.write_text("CartPole-v1:\n  net_arch: [64, 64\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"is not valid YAML \(line \d+, column \d+\)"):
        load_preset_file(broken, "ppo", "CartPole-v1")
    utf8 = tmp_path / "utf8.yaml"
    utf8.write_text("CartPole-v1:\n  # 中文注释\n  learning_rate: 0.001\n", encoding="utf-8")
    assert load_preset_file(utf8, "ppo", "CartPole-v1")


def test_a_presets_run_settings_go_to_learn_as_the_command_line_reads_them():
    """A preset file's run settings came back as YAML read them ('2e3', 'none'): learn(**run) refused each, while
    the CLI converted them; and PPO(env, **preset) named none of them as learn's ("Unknown hyperparameter")."""
    from rlspeed import PPO
    from rlspeed.presets import split_run_settings

    run, hyper = split_run_settings({"total_timesteps": "2e2", "eval_freq": "1e2", "target_return": "none",
                                     "num_envs": 2, "num_steps": 16, "batch_size": 32})
    assert run == {"total_timesteps": 200, "eval_freq": 100, "target_return": None}
    model = PPO("CartPole-v1", device="cpu", seed=0, **hyper)
    model.learn(**run, progress_bar=False)
    assert model.num_timesteps >= 200 and len(model.result.evaluations) == 2
    with pytest.raises(UserError, match=r"'eval_freq' is a setting of the run.*model\.learn\(total_timesteps, "
                                        r"eval_freq=\.\.\.\)"):
        PPO("CartPole-v1", eval_freq=100)


def test_a_named_preset_loads_without_torch():
    """Presets load without torch (its import takes a second or two): asking whether an id is an Atari game imports
    it, so that is asked only where the answer matters (an Atari id's RAM variant, an id without an entry)."""
    script = ("import sys\nfrom rlspeed.presets import load_preset\n"
              "assert load_preset('ppo', 'CartPole-v1', 'rlspeed').source == 'rlspeed'\n"
              "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


@requires_zoo
def test_set_over_rl_zoo_v4_entry_for_a_mujoco_v5_id_names_the_preset_whole():
    """The note on what a preset keeps named RL-Zoo's v4 entry for Humanoid-v5 cut at the ';' inside its parentheses
    ('RL-Zoo's preset for sac Humanoid-v5 (rl_zoo3 2.9.2 also sets ...'); it keeps them whole."""
    from rlspeed import SAC, cli

    preset = load_preset("sac", "Humanoid-v5", "zoo")
    hyper = split_run_settings(preset)[1] | {"learning_starts": 500}
    (note,) = cli._preset_values_kept(preset, SAC, {"learning_starts": 500}, hyper)
    assert note.startswith(f"rlspeed: note: {preset.origin} also sets ")
    assert "its Humanoid-v4 entry" in note and note.count("(") == note.count(")")


def test_env_options_that_make_another_registered_id_train_its_task(tmp_path, capsys):
    """`--env-kwargs` options with which Gymnasium registers another id (LunarLander-v3 with continuous=True is
    LunarLanderContinuous-v3) train that id's task: its preset, where it has one, and its reward threshold as the
    target. Before, the preset was the id's as registered (A2C's for discrete LunarLander on continuous actions; SAC,
    without one, rlspeed's default where RL-Zoo has LunarLanderContinuous-v3's) and the run had no target."""
    import gymnasium as gym
    import numpy as np

    from rlspeed import cli
    from rlspeed.envs.base import registered_variant

    # (the registry only: no Box2D needed)
    assert registered_variant("LunarLander-v3", {"continuous": True}) == "LunarLanderContinuous-v3"
    # BipedalWalkerHardcore-v3 is hardcore=True with a time limit of 2,000 steps, not the 1,600 the options keep
    assert registered_variant("BipedalWalker-v3", {"hardcore": True}) is None
    assert registered_variant("BipedalWalker-v3", {"hardcore": True, "max_episode_steps": 2000}) == (
        "BipedalWalkerHardcore-v3")
    assert registered_variant("LunarLander-v3", {"enable_wind": True}) is None
    assert registered_variant("LunarLander-v3", {"continuous": np.array([1, 1])}) is None  # (no bool to compare)
    assert registered_variant("LunarLander-v3", None) is None

    short = "rlspeed-test/ShortCartPole-v0"  # (CartPole-v1 with 50 steps: CartPole-v1 again with 500)
    if short not in gym.registry:
        gym.register(short, entry_point=gym.spec("CartPole-v1").entry_point, max_episode_steps=50)
    assert registered_variant(short, {"max_episode_steps": 500}) == "CartPole-v1"
    argv = ["train", "ppo", short, "--env-kwargs", "max_episode_steps=500", "--total-timesteps", "64",
            "--no-progress", "--out", str(tmp_path / "run")]
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    assert (f"rlspeed: note: {short} with max_episode_steps=500 is CartPole-v1 as Gymnasium registers it: the preset "
            "and reward threshold are CartPole-v1's") in err
    assert "may not fit" not in err
    config = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert config["preset"]["origin"] == "rlspeed's preset for ppo CartPole-v1"
    assert config["hyperparameters"]["num_steps"] == load_preset("ppo", "CartPole-v1")["num_steps"]
    assert config["target_return"] == 475 and config["env_kwargs"] == {"max_episode_steps": 500}


def test_env_options_that_make_another_registered_id_but_for_its_time_limit_say_so():
    """`--env-kwargs hardcore=true` on BipedalWalker-v3 keeps its 1,600-step episodes, where
    BipedalWalkerHardcore-v3 has 2,000: not that id's task (its preset and threshold do not apply), which the run
    now says with the option that makes it; an id that differs in its time limit alone (CartPole-v0) is not named."""
    import argparse

    from rlspeed import cli
    from rlspeed.envs.base import registered_variant

    assert registered_variant("BipedalWalker-v3", {"hardcore": True}, time_limit=False) == "BipedalWalkerHardcore-v3"
    assert registered_variant("CartPole-v1", {"render_mode": None}, time_limit=False) is None
    args = argparse.Namespace(env_id="BipedalWalker-v3", env_kwargs=["hardcore=true"])
    assert cli._variant_preset(args, "ppo", "auto") == (None, None)
    assert args.variant_note == (
        "rlspeed: note: BipedalWalker-v3 with hardcore=True is BipedalWalkerHardcore-v3 but for its time limit (1,600 "
        "steps here, 2,000 there): BipedalWalkerHardcore-v3's preset and reward threshold do not apply; --env-kwargs "
        "max_episode_steps=2000 (or BipedalWalkerHardcore-v3) trains its task")
    for given in (["hardcore=true", "max_episode_steps=1600"], ["render_mode=null"]):  # (a limit the user set)
        args = argparse.Namespace(env_id="BipedalWalker-v3" if "hardcore=true" in given else "CartPole-v1",
                                  env_kwargs=given)
        assert cli._variant_preset(args, "ppo", "auto") == (None, None) and not hasattr(args, "variant_note")


def test_atari_wrapper_options_become_episodic_life_and_clip_rewards_and_others_are_refused():
    """RL-Zoo's `AtariWrapper` with `terminal_on_life_loss: False` (its ppo_lstm Atari entry) or `clip_reward: False`:
    the rlspeed hyperparameters episodic_life / clip_rewards, said among the notes; an option of the fixed
    preprocessing at another value makes the entry unusable."""
    wrapper = zoo.ATARI_WRAPPER
    kept = zoo.translate_entry("recurrent_ppo", {"env_wrapper": [{wrapper: {"terminal_on_life_loss": False}}],
                                                 "frame_stack": 4}, "", atari=True)
    assert kept.status == "full" and kept.hyperparameters["episodic_life"] is False
    assert "clip_rewards" not in kept.hyperparameters
    assert any("terminal_on_life_loss False -> episodic_life false" in note for note in kept.notes)
    raw = zoo.translate_entry("ppo", {"env_wrapper": {wrapper: {"clip_reward": False, "noop_max": 30}}}, "", atari=True)
    assert raw.status == "full" and raw.hyperparameters["clip_rewards"] is False
    other = zoo.translate_entry("ppo", {"env_wrapper": [{wrapper: {"frame_skip": 2}}]}, "", atari=True)
    assert other.status == "none" and "frame_skip=2" in " ".join(other.blocking)


@requires_zoo
def test_rl_zoos_recurrent_ppo_atari_entry_is_used_with_whole_games():
    """`rlspeed train recurrent_ppo BreakoutNoFrameskip-v4 --preset zoo` was refused (its AtariWrapper option
    terminal_on_life_loss: False)."""
    pytest.importorskip("ale_py")
    preset = load_preset("recurrent_ppo", "BreakoutNoFrameskip-v4", "zoo")
    assert preset.source == "zoo" and preset["episodic_life"] is False


def test_normalize_clips_and_gamma_translate_as_rl_zoo_runs_them():
    """VecNormalize's clip_obs and clip_reward set normalize_obs_clip and normalize_reward_clip (ignored, as SB3's,
    without their normalisation); its gamma, which RL-Zoo replaces by the entry's gamma, is refused only where the
    run would discount otherwise than RL-Zoo's."""
    for algo in ("ppo", "sac"):
        clips = translated(algo, {"normalize": "dict(norm_obs=True, norm_reward=True, clip_obs=5.0, clip_reward=2)"})
        assert clips.status == "full", (algo, clips.unsupported)
        assert (clips.hyperparameters["normalize_obs_clip"], clips.hyperparameters["normalize_reward_clip"]) == (5, 2)
    unused = translated("ppo", {"normalize": "dict(norm_obs=True, norm_reward=False, clip_reward=2)"})
    assert "normalize_reward_clip" not in unused.hyperparameters and unused.status == "full"
    negative = translated("ppo", {"normalize": "dict(norm_obs=True, clip_obs=-1.0)"})
    assert negative.status == "none" and "normalize_obs_clip must be a positive" in negative.unsupported[0]
    assert translated("ppo", {"normalize": "dict(gamma=0.9)", "gamma": 0.95}).status == "full"
    assert translated("ppo", {"normalize": "dict(gamma=0.99)"}).status == "full"
    assert refused(translated("ppo", {"normalize": "dict(gamma=0.9)"})) == {"normalize.gamma"}
