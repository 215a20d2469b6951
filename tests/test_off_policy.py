"""Off-policy algorithms (DQN, SAC, TD3, DDPG): learning, target updates, bootstrapping, checkpoints, CLI."""

from __future__ import annotations

import contextlib
import copy
import json

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import first_ou_noise, needs_box2d, network_layers

from rlspeed import DDPG, DQN, SAC, TD3
from rlspeed.algos.off_policy import polyak_update
from rlspeed.cli import main
from rlspeed.envs.base import BatchedEnv, EnvSpec, EpisodeStatistics, find_wrapper, registered_variant
from rlspeed.envs.wrappers import NormalizeReward
from rlspeed.errors import UserError
from rlspeed.presets import load_preset, split_run_settings

CONTINUOUS = [SAC, TD3, DDPG]
ALL = [DQN, *CONTINUOUS]
TINY = {"net_arch": (32, 32), "learning_starts": 64, "batch_size": 32}


def env_for(algo) -> str:
    return "CartPole-v1" if algo is DQN else "Pendulum-v1"


# --- target networks -------------------------------------------------------------------------------------------
def test_polyak_update_is_tau_online_plus_one_minus_tau_target():
    generator = torch.Generator().manual_seed(0)
    online = [torch.randn(3, 4, generator=generator), torch.randn(5, generator=generator)]
    target = [torch.randn(3, 4, generator=generator), torch.randn(5, generator=generator)]
    expected = [0.05 * o + 0.95 * t for o, t in zip(online, target)]
    polyak_update(target, online, 0.05)
    for got, want in zip(target, expected):
        torch.testing.assert_close(got, want)
    polyak_update(target, [o * 1e8 for o in online], 1.0)  # tau = 1 is an exact copy
    for got, source in zip(target, online):
        assert torch.equal(got, source * 1e8)


def test_target_networks_follow_the_online_networks():
    model = SAC("Pendulum-v1", seed=0, tau=0.5, **TINY)
    model.learn(128, progress_bar=False)
    online, target = list(model.critic.parameters()), list(model.critic_target.parameters())
    assert all(not t.requires_grad for t in target)
    assert any(not torch.equal(o, t) for o, t in zip(online, target))  # updated, but lagging
    before = [t.clone() for t in target]
    model._update(model.buffer.sample(32))
    online = list(model.critic.parameters())
    for t_new, t_old, o in zip(target, before, online):
        torch.testing.assert_close(t_new, 0.5 * o.detach() + 0.5 * t_old)

    dqn = DQN("CartPole-v1", seed=0, target_update_interval=100, train_freq=10, **TINY)
    dqn.learn(150, progress_bar=False)  # copied at 100 steps, then 50 steps of updates since
    assert any(not torch.equal(o, t) for o, t in zip(dqn.q_network.parameters(), dqn.q_target.parameters()))
    dqn.learn(50, progress_bar=False)  # crosses 200: hard copy
    assert all(torch.equal(o, t) for o, t in zip(dqn.q_network.parameters(), dqn.q_target.parameters()))


def test_weights_loaded_into_a_network_reach_its_target_and_a_checkpoint_keeps_its_own(tmp_path):
    """Starting from pretrained weights (`model.policy.load_state_dict`): the TD target bootstraps from them at once,
    as Stable-Baselines3's policy (which holds both networks) loads both."""
    pretrained = DQN("CartPole-v1", seed=1, **TINY)
    dqn = DQN("CartPole-v1", seed=0, **TINY)
    dqn.policy.load_state_dict(pretrained.policy.state_dict())
    assert all(torch.equal(t, p) for t, p in zip(dqn.q_target.parameters(), pretrained.q_network.parameters()))
    td3, other = TD3("Pendulum-v1", seed=0, **TINY), TD3("Pendulum-v1", seed=1, **TINY)
    td3.policy.load_state_dict(other.policy.state_dict())
    td3.critic.load_state_dict(other.critic.state_dict())
    for target, source in ((td3.actor_target, other.actor), (td3.critic_target, other.critic)):
        assert all(torch.equal(t, p) for t, p in zip(target.parameters(), source.parameters()))
    copied = copy.deepcopy(dqn)  # (a copy of the model follows its own loads; the original's target stays)
    copied.policy.load_state_dict(other_dqn := DQN("CartPole-v1", seed=2, **TINY).policy.state_dict())
    assert all(torch.equal(t, other_dqn[k]) for k, t in copied.q_target.state_dict().items())
    assert all(torch.equal(t, p) for t, p in zip(dqn.q_target.parameters(), pretrained.q_network.parameters()))

    dqn.learn(150, progress_bar=False)  # updates since, target not refreshed yet (interval 10,000)
    assert any(not torch.equal(o, t) for o, t in zip(dqn.q_network.parameters(), dqn.q_target.parameters()))
    dqn.save(tmp_path / "dqn")
    loaded = DQN.load(tmp_path / "dqn")
    assert all(torch.equal(a, b) for a, b in zip(loaded.q_target.parameters(), dqn.q_target.parameters()))


# --- the collection loop stores what the TD target needs ------------------------------------------------------
class ScriptedEnv(BatchedEnv):
    """Two envs whose observation is (steps into the episode, env index): env 0 is truncated after 4 steps,
    env 1 terminates after 3 steps. `final_obs` holds the true last observation, `obs` the reset one."""

    backend = "torch"

    def __init__(self, action_space: gym.Space):
        self.spec = EnvSpec("Scripted-v0", (2,), action_space, max_episode_steps=4, reward_threshold=None)
        self.num_envs, self.device = 2, torch.device("cpu")
        self.t = torch.zeros(2)

    def _obs(self, t):
        return torch.stack((t, torch.arange(2.0)), dim=1)

    def reset(self, seed=None):
        self.t = torch.zeros(2)
        return self._obs(self.t), {}

    def step(self, actions):
        self.t = self.t + 1
        final_obs = self._obs(self.t)
        terminated = torch.tensor([False, bool(self.t[1] >= 3)])
        truncated = torch.tensor([bool(self.t[0] >= 4), False])
        self.t = torch.where(terminated | truncated, 0.0, self.t)
        return self._obs(self.t), torch.ones(2), terminated, truncated, {"final_obs": final_obs}


@pytest.mark.parametrize("algo", [DQN, SAC])
def test_collection_stores_final_obs_and_keeps_truncation_bootstrapped(algo):
    space = gym.spaces.Discrete(2) if algo is DQN else gym.spaces.Box(-1.0, 1.0, (1,))
    model = algo(EpisodeStatistics(ScriptedEnv(space)), seed=0, learning_starts=10**6, buffer_size=100)
    model.learn(48, progress_bar=False)  # 24 steps of 2 envs, random actions, no updates
    buffer = model.buffer
    assert len(buffer) == 48
    t, env = buffer.obs[:48, 0], buffer.obs[:48, 1]
    next_t = buffer.next_obs[:48, 0]
    assert torch.equal(next_t, t + 1)  # the true successor, also where the env was reset
    assert torch.equal(buffer.next_obs[:48, 1], env)
    # terminated only where env 1 ended; env 0's time-limit ends keep terminated = 0 (they bootstrap)
    assert torch.equal(buffer.terminated[:48], ((env == 1) & (next_t == 3)).float())
    assert ((env == 0) & (next_t == 4)).sum() == 6  # the truncations did happen


# --- learning --------------------------------------------------------------------------------------------------
# The shipped presets with small budgets and thresholds, fixed seed; what seed 0 reached is noted per case.
LEARNING_CASES = [
    pytest.param(DQN, "CartPole-v1", 150.0, 10_000, id="dqn-cartpole"),
    pytest.param(SAC, "Pendulum-v1", -400.0, 4000, id="sac-pendulum"),
    pytest.param(TD3, "Pendulum-v1", -400.0, 4000, id="td3-pendulum"),
    pytest.param(DDPG, "Pendulum-v1", -400.0, 4000, id="ddpg-pendulum"),
]


@pytest.mark.parametrize(("algo", "env_id", "threshold", "budget"), LEARNING_CASES)
def test_shipped_preset_learns_its_easy_task(algo, env_id, threshold, budget):
    _run, hyperparameters = split_run_settings(load_preset(algo.name, env_id))
    model = algo(env_id, seed=0, **hyperparameters)
    model.learn(budget, progress_bar=False, target_return=threshold, eval_freq=500)
    print(f"{algo.name} {env_id}: evaluations (steps, mean) {[(s, round(m)) for s, _, m in model.result.evaluations]}")
    best = max(mean for _, _, mean in model.result.evaluations)
    assert model.result.steps_to_target is not None, f"best evaluation {best:.1f} < {threshold}"


# --- hot paths stay on the device ------------------------------------------------------------------------------
@contextlib.contextmanager
def forbid_host_reads():
    """Make every Python-level read of a tensor's value back to the host raise."""
    names = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__")
    saved = {name: getattr(torch.Tensor, name) for name in names}

    def forbidden(name):
        def fail(self, *args, **kwargs):
            raise AssertionError(f"host read of a tensor: Tensor.{name}")
        return fail

    try:
        for name in names:
            setattr(torch.Tensor, name, forbidden(name))
        yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)


@pytest.mark.parametrize("algo", ALL)
def test_train_iteration_reads_nothing_back_to_the_host(algo):
    extra = {"action_noise": "ornstein-uhlenbeck"} if algo is DDPG else {}
    # the native env (auto would take Gymnasium's for 2 envs on a CPU, which steps on the host by nature)
    model = algo(env_for(algo), seed=0, num_envs=2, env_backend="torch", train_freq=4, gradient_steps=3, **TINY,
                 **extra)
    model.learn(128, progress_bar=False)  # past learning_starts
    with forbid_host_reads():
        for _ in range(3):
            model._train_iteration()


@pytest.mark.parametrize("algo", ALL)
@pytest.mark.parametrize("anneal", [True, False])
def test_anneal_lr_decays_the_learning_rate_linearly_as_sb3_s_schedule(algo, anneal, monkeypatch):
    """anneal_lr (RL-Zoo's lin_X): each iteration's gradient steps run at learning_rate * (1 - steps after its
    collection / total_timesteps), SB3's progress_remaining at train time; off: the rate stays put."""
    model = algo(env_for(algo), seed=0, num_envs=2, env_backend="torch", train_freq=2, **TINY,
                 learning_rate=1e-3, anneal_lr=anneal)
    seen = []  # (steps before the collection, the optimizer's learning rates) at each iteration's updates
    gradient_steps = type(model)._gradient_steps

    def recording(self, steps):
        seen.append((self.num_timesteps, {float(g["lr"]) for o in self._optimizers().values()  # ok-sync
                                          for g in o.param_groups}))
        return gradient_steps(self, steps)

    monkeypatch.setattr(type(model), "_gradient_steps", recording)
    model.learn(200, progress_bar=False)
    assert len(seen) > 10
    for before, rates in seen:
        expected = 1e-3 * (1 - (before + 4) / 200) if anneal else 1e-3
        assert len(rates) == 1 and rates.pop() == pytest.approx(expected, abs=1e-12), before


@pytest.mark.parametrize("algo", ALL)
def test_ortho_init_false_and_adam_eps_give_sb3s_off_policy_networks_and_optimizer(algo):
    """What RL-Zoo's translation sets for SAC, TD3, DDPG and DQN (SB3's networks keep PyTorch's initialisation and
    its Adam epsilon 1e-8): every online layer initialised as a new one (weights and biases uniform within
    1/sqrt(fan_in), biases not all zero), the target networks copies of them, the optimizer's eps the given one;
    rlspeed's default is orthogonal with zero biases."""
    default = algo(env_for(algo), seed=0, **TINY)
    plain = algo(env_for(algo), seed=0, ortho_init=False, adam_eps=1e-8, **TINY)
    online = {name: module for name, module in plain._modules().items()
              if isinstance(module, torch.nn.Module) and not name.endswith("target")}
    assert online and all(group["eps"] == 1e-8 for group in plain.optimizer.param_groups)
    assert all(group["eps"] == 1e-5 for group in default.optimizer.param_groups)
    for name, module in online.items():
        layers = network_layers(module)
        assert len(layers) >= 3, name
        for weight, bias in layers:
            bound = 1 / weight.shape[1] ** 0.5
            assert weight.abs().max() <= bound and bias.abs().max() <= bound and bias.abs().max() > 0, name
        target = plain._modules().get("q_target" if name == "q_network" else f"{name}_target")
        for (weight, bias), (target_weight, target_bias) in zip(layers, network_layers(target) if target else []):
            assert torch.equal(weight, target_weight) and torch.equal(bias, target_bias), name
        assert not any(bias.any() for _, bias in network_layers(default._modules()[name])), name


def test_dqn_collection_explores_at_each_steps_epsilon_and_acts_greedily_otherwise():
    model = DQN("CartPole-v1", seed=0, num_envs=1024, train_freq=16, learning_starts=0, exploration_fraction=0.5,
                net_arch=(32, 32), batch_size=32)
    model.make_training_env()
    model._schedule_end, model._learn_start = 40 * 1024, 0
    start = 4 * 1024
    model._prepare_collection(start)
    _, explore, actions = model._draws
    for step in range(16):  # the share exploring is that step's epsilon (binomial, 1024 draws: 5 sigma < 0.08)
        assert abs(explore[step].float().mean().item() - model.epsilon(start + step * 1024)) < 0.08
    assert 0.3 < actions.float().mean().item() < 0.7  # random actions uniform over {0, 1}
    obs = torch.randn(1024, 4, device=model.device)
    with torch.no_grad():
        greedy = model.q_network(obs).argmax(dim=1)
        assert torch.equal(model._greedy(obs), greedy)  # the collection path computes the same network
        chosen = model._explore(obs, start + 3 * 1024)
    assert torch.equal(chosen, torch.where(explore[3], actions[3], greedy))


@pytest.mark.parametrize("activation, env_id", [("relu", "Pendulum-v1"), ("tanh", "Pendulum-v1"),
                                                pytest.param("relu", "LunarLanderContinuous-v3", marks=needs_box2d)])
def test_sac_collection_samples_the_actor_s_squashed_gaussian(activation, env_id):
    """(With 2 actions the kernel-by-kernel head comes out column-major on a CPU; its noise is still drawn in the
    module path's row-major order.)"""
    model = SAC(env_id, seed=0, activation=activation, **TINY)
    assert model._actor_linears is not None  # the kernel-by-kernel path
    obs = torch.randn(512, model.spec.obs_dim, device=model.device)
    with torch.no_grad():
        torch.manual_seed(1)
        fast = model._explore(obs, 0)
        model._actor_linears = None  # the module path: same network, same noise
        torch.manual_seed(1)
        torch.testing.assert_close(fast, model._explore(obs, 0))
        mean, log_std = model.actor(obs)
        torch.manual_seed(1)
        torch.testing.assert_close(fast, torch.tanh(mean + log_std.exp() * torch.randn_like(mean)))
    assert fast.std() > 0.1  # a sample, not the mean


# --- checkpoints -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("algo", ALL)
def test_save_load_round_trip(tmp_path, algo):
    model = algo(env_for(algo), seed=0, **TINY)
    model.learn(200, progress_bar=False)
    path = model.save(tmp_path / "model.safetensors")
    loaded = algo.load(path, device=model.device)  # the same device: bitwise-equal actions

    obs = torch.randn(64, *model.spec.observation_shape)
    assert torch.equal(model.act(obs, deterministic=True), loaded.act(obs, deterministic=True))
    for name, module in model._modules().items():  # every network, target networks and log_alpha included
        other = loaded._modules()[name]
        if isinstance(module, torch.Tensor):
            assert torch.equal(module, other), name
        else:
            for (key, a), (_, b) in zip(module.state_dict().items(), other.state_dict().items()):
                assert torch.equal(a, b), f"{name}.{key}"
    for name, optimizer in model._optimizers().items():
        state, other = optimizer.state_dict()["state"], loaded._optimizers()[name].state_dict()["state"]
        assert state.keys() == other.keys() and len(state) > 0
        for index in state:
            for key in state[index]:
                assert torch.equal(torch.as_tensor(state[index][key]), torch.as_tensor(other[index][key]))
    loaded.learn(100, progress_bar=False)  # and training continues from it


def test_sac_checkpoint_keeps_the_learnt_temperature(tmp_path):
    model = SAC("Pendulum-v1", seed=0, **TINY)
    model.learn(200, progress_bar=False)
    assert model.log_alpha.item() != 0.0  # tuned away from log(1)
    loaded = SAC.load(model.save(tmp_path / "sac"), device="cpu")
    assert loaded.log_alpha.item() == model.log_alpha.item() and loaded.log_alpha.requires_grad


def test_predict_gives_env_actions():
    sac = SAC("Pendulum-v1", seed=0, **TINY)
    actions, _ = sac.predict(torch.randn(100, 3).numpy() * 10)
    assert actions.shape == (100, 1) and abs(actions).max() <= 2.0  # tanh squashed, rescaled to the Box
    dqn = DQN("CartPole-v1", seed=0, **TINY)
    action, _ = dqn.predict([0.0, 0.1, 0.0, -0.1])
    assert action.shape == () and int(action) in (0, 1)


# --- configuration and CLI -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("algo", "key", "value", "message"), [
    (SAC, "tau", 1.5, "tau must be in (0, 1]"),
    (SAC, "gradient_steps", 0, "gradient_steps must be from 1 to 1,000,000 (updates per iteration), or -1"),
    (DQN, "exploration_final_eps", 2.0, "exploration epsilons"),
    (TD3, "action_noise", "pink", "action_noise must be one of"),
    (DDPG, "buffer_size", 0, "buffer_size (0) must be at least num_envs"),
])
def test_bad_hyperparameters_get_one_clear_sentence(algo, key, value, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        algo(env_for(algo), **{key: value})


def test_cli_trains_sac_end_to_end(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["train", "sac", "Pendulum-v1", "--total-timesteps", "600", "--target-return", "none",
                 "--set", "learning_starts=200", "--set", "net_arch=[32,32]", "--set", "batch_size=32", "--out",
                 str(out), "--no-progress"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["algo"] == "sac" and summary["total_timesteps"] == 600 and summary["time_to_target_s"] is None
    assert (out / "model.safetensors").exists() and (out / "metrics.csv").exists()
    assert main(["eval", str(out / "model.safetensors"), "--episodes", "2"]) == 0
    assert "SAC on Pendulum-v1" in capsys.readouterr().out


@pytest.mark.parametrize(("algo", "env_id", "hint"), [
    ("sac", "CartPole-v1", "use a2c, dqn, ppo or recurrent_ppo."),
    ("dqn", "Pendulum-v1", "use a2c, ddpg, ppo, recurrent_ppo, sac or td3.")])
def test_cli_rejects_the_wrong_action_space(tmp_path, capsys, algo, env_id, hint):
    assert main(["train", algo, env_id, "--out", str(tmp_path / "run"), "--no-progress"]) == 2
    assert hint in capsys.readouterr().err


class _Switch(gym.Env):
    """An env whose option `continuous` picks its actions, as Gymnasium's LunarLander and CarRacing take it."""

    def __init__(self, continuous: bool = False):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32) if continuous else gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, True, False, {}


class _Racing(_Switch):
    """Continuous unless told otherwise, as CarRacing is (and one id only)."""

    def __init__(self, continuous: bool = True):
        super().__init__(continuous)


def test_the_wrong_action_space_names_the_envs_option_for_the_other_one():
    """SAC on LunarLander-v3 said "use ppo or dqn", DQN on CarRacing-v3 "use ppo, sac, td3 or ddpg": both envs give
    the other kind of actions with their option `continuous`, which the error now names (or the id Gymnasium
    registers with it: LunarLanderContinuous-v3)."""
    for env_id, kwargs in (("rlspeed-test/Switch-v0", {}), ("rlspeed-test/SwitchContinuous-v0", {"continuous": True}),
                           ("rlspeed-test/Racing-v0", {})):
        if env_id not in gym.registry:
            gym.register(env_id, entry_point=_Racing if "Racing" in env_id else _Switch, max_episode_steps=10,
                         kwargs=kwargs)
    with pytest.raises(UserError, match=r"use a2c, dqn, ppo or recurrent_ppo, or rlspeed-test/SwitchContinuous-v0, "
                                        r"the same env with continuous actions\.$"):
        SAC("rlspeed-test/Switch-v0")
    with pytest.raises(UserError, match=r"use a2c, ddpg, ppo, recurrent_ppo, sac or td3, or rlspeed-test/Switch-v0, "
                                        r"the same env with discrete actions\.$"):
        DQN("rlspeed-test/SwitchContinuous-v0")
    with pytest.raises(UserError, match=r"or rlspeed-test/Switch-v0 without the option continuous=True\.$"):
        DQN("rlspeed-test/Switch-v0", env_kwargs={"continuous": True})
    with pytest.raises(UserError, match=r"or rlspeed-test/Racing-v0 without the option continuous=False\.$"):
        SAC("rlspeed-test/Racing-v0", env_kwargs={"continuous": False})
    with pytest.raises(UserError, match=r"or the env's option continuous=False \(--env-kwargs continuous=false; "
                                        r"env_kwargs=\{'continuous': False\} in Python\)\.$"):
        DQN("rlspeed-test/Racing-v0")
    # (an option at its constructor's default is none: SwitchContinuous-v0 with continuous=False is Switch-v0)
    assert registered_variant("rlspeed-test/SwitchContinuous-v0", {"continuous": False}) == "rlspeed-test/Switch-v0"
    assert registered_variant("rlspeed-test/Switch-v0", {"continuous": False}) is None  # (itself)
    with pytest.raises(UserError, match=r"needs continuous \(Box\) actions, but CartPole-v1 has discrete actions; "
                                        r"use a2c, dqn, ppo or recurrent_ppo\.$"):  # (no such option)
        SAC("CartPole-v1")


class _MatrixActions(_Switch):
    """Actions of a 2x2 Box, which PPO, A2C and RecurrentPPO take and SAC, TD3 and DDPG refuse."""

    def __init__(self):
        super().__init__(True)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2, 2), np.float32)


def test_dqn_on_matrix_actions_names_only_the_algorithms_that_take_them():
    """DQN on a (2, 2) Box said "use a2c, ddpg, ppo, recurrent_ppo, sac or td3", three of which refuse that shape in
    turn ("supports 1-D Box actions"): it names those that train on it."""
    if "rlspeed-test/MatrixActions-v0" not in gym.registry:
        gym.register("rlspeed-test/MatrixActions-v0", entry_point=_MatrixActions, max_episode_steps=10)
    with pytest.raises(UserError, match=r"has continuous actions; use a2c, ppo or recurrent_ppo\.$"):
        DQN("rlspeed-test/MatrixActions-v0")
    with pytest.raises(UserError, match=r"SAC supports 1-D Box actions"):  # (why it is not named)
        SAC("rlspeed-test/MatrixActions-v0")


# --- load / resume ---------------------------------------------------------------------------------------------
def test_resume_continues_the_epsilon_schedule_of_the_interrupted_run(tmp_path):
    """A restart (`resume`, then `learn` of what was left, as the CLI does it) explores at the epsilon the
    uninterrupted run would have reached, not from exploration_initial_eps again."""
    settings = dict(seed=0, learning_starts=64, train_freq=16, gradient_steps=1, batch_size=32, net_arch=(16,),
                    exploration_fraction=1.0)
    first = DQN("CartPole-v1", **settings)
    # a 1,024-step run that stops (as if killed) after its checkpoint at 256 steps
    first.learn(1024, progress_bar=False, run_dir=tmp_path / "run", checkpoint_freq=256,
                callback=lambda local: first.num_timesteps < 256)
    checkpoint = tmp_path / "run" / "checkpoint.safetensors"
    assert checkpoint.exists()
    restarted = DQN("CartPole-v1", **settings)
    restarted.resume(checkpoint)
    resumed_at = restarted.num_timesteps
    assert 0 < resumed_at < 1024
    seen = []
    restarted.learn(1024 - resumed_at, progress_bar=False,
                    callback=lambda local: seen.append(restarted.epsilon(restarted.num_timesteps)) or True)
    # the interrupted run's schedule: from 1.0 at step 0 to exploration_final_eps at 1024 (exploration_fraction 1)
    expected = first.config.exploration_initial_eps + (resumed_at + 16) / 1024 * (
        first.config.exploration_final_eps - first.config.exploration_initial_eps)
    assert seen[0] == pytest.approx(expected, abs=1e-6)


def test_a_loaded_dqn_tells_the_exploration_rate_its_run_had(tmp_path):
    """`DQN.epsilon(t)` (where SB3's `exploration_rate` points) of a loaded model gave exploration_initial_eps."""
    model = DQN("CartPole-v1", seed=0, learning_starts=32, train_freq=8, batch_size=16, net_arch=(16,),
                exploration_initial_eps=0.8, exploration_final_eps=0.02, exploration_fraction=0.5)
    model.learn(256, progress_bar=False).save(tmp_path / "dqn")
    loaded = DQN.load(tmp_path / "dqn")
    for step in (0, 64, 200):
        assert loaded.epsilon(step) == model.epsilon(step)
    assert loaded.epsilon(200) == pytest.approx(0.02)


def test_resume_continues_the_learning_rate_schedule_of_the_interrupted_run(tmp_path):
    """anneal_lr after a restart: the learning rate the uninterrupted run would have, not learning_rate again."""
    settings = dict(seed=0, learning_starts=64, train_freq=16, batch_size=32, net_arch=(16,), learning_rate=1e-3,
                    anneal_lr=True)
    first = SAC("Pendulum-v1", **settings)
    first.learn(1024, progress_bar=False, run_dir=tmp_path / "run", checkpoint_freq=256,
                callback=lambda local: first.num_timesteps < 256)
    restarted = SAC("Pendulum-v1", **settings)
    restarted.resume(tmp_path / "run" / "checkpoint.safetensors")
    resumed_at = restarted.num_timesteps
    assert 0 < resumed_at < 1024
    # (updates wait for learning_starts new transitions: the replay buffer was not saved)
    restarted.learn(96, progress_bar=False)
    rates = [float(group["lr"]) for group in restarted.optimizer.param_groups]
    assert rates == [pytest.approx(1e-3 * (1 - (resumed_at + 96) / 1024), abs=1e-12)] * len(rates)


@pytest.mark.parametrize("resume", [False, True])
def test_updates_wait_for_learning_starts_transitions_after_load_or_resume(tmp_path, resume):
    """The replay buffer is not saved: after load/resume, updates start once the new buffer holds learning_starts
    transitions, instead of sampling batches of copies of the first few rows."""
    model = SAC("Pendulum-v1", seed=0, **TINY)
    model.learn(128, progress_bar=False)
    path = model.save(tmp_path / "model")
    if resume:
        loaded = SAC("Pendulum-v1", seed=0, **TINY)
        loaded.resume(path)
    else:
        loaded = SAC.load(path, device="cpu")
    buffer_sizes = []
    update = loaded._update
    loaded._update = lambda batch: buffer_sizes.append(len(loaded.buffer)) or update(batch)
    loaded.learn(TINY["learning_starts"] + 16, progress_bar=False)
    assert buffer_sizes and min(buffer_sizes) > TINY["learning_starts"]


def test_sac_load_with_a_fixed_ent_coef_uses_it(tmp_path):
    model = SAC("Pendulum-v1", seed=0, **TINY)
    model.learn(128, progress_bar=False)
    with pytest.warns(UserWarning, match="optimizer starts afresh"):  # log_alpha is no longer trained
        loaded = SAC.load(model.save(tmp_path / "model"), device="cpu", ent_coef=0.5)
    assert not loaded.autotune and loaded.log_alpha.exp().item() == pytest.approx(0.5)
    loaded.learn(64, progress_bar=False)
    assert loaded.log_alpha.exp().item() == pytest.approx(0.5)


class UnboundedActions(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,))
    action_space = gym.spaces.Box(-float("inf"), float("inf"), (1,))

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}


@pytest.mark.parametrize("algo", CONTINUOUS)
def test_unbounded_box_actions_are_a_user_error(algo):
    vector_env = gym.vector.SyncVectorEnv([UnboundedActions], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    with pytest.raises(UserError, match=r"unbounded actions .*gymnasium.wrappers.TransformAction\(env, lambda a: a, "
                                        r"gymnasium.spaces.Box\(low, high\)\)"):
        algo(vector_env, device="cpu")
    # the advice, followed, trains (RescaleAction, named before, raises a ValueError on unbounded actions)
    bounded = gym.vector.SyncVectorEnv([lambda: gym.wrappers.TransformAction(
        UnboundedActions(), lambda a: a, gym.spaces.Box(-2.0, 2.0, (1,)))],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    algo(bounded, device="cpu", **TINY).learn(128, progress_bar=False)


def test_learn_checks_a_setting_changed_on_model_config():
    """`model.action_noise = ...` (SB3's way to change a model's noise) points to model.config.action_noise; a value
    there that the constructor refuses (SB3's noise object, a misspelt name) trained with no noise at all."""
    model = TD3("Pendulum-v1", seed=0, num_envs=1, **TINY)
    model.config.action_noise = "gaussian"
    with pytest.raises(UserError, match="action_noise must be one of normal, ornstein-uhlenbeck, none, got 'gaussian'"):
        model.learn(64, progress_bar=False)
    assert model.num_timesteps == 0
    model.config.action_noise = "ornstein-uhlenbeck"
    model.learn(128, progress_bar=False)
    assert model.num_timesteps == 128


def test_learn_takes_a_setting_changed_on_model_config_as_the_constructor_does():
    """learn's check of model.config compared the values as set: action_noise=None, which the constructor takes as
    "none" (SB3's default), was refused ("got 'None'"), and a number given as text ("3e-4", a YAML value) raised
    TypeError; both are taken as the constructor takes them."""
    model = TD3("Pendulum-v1", seed=0, num_envs=1, **TINY)
    model.config.action_noise, model.config.learning_rate = None, "3e-4"
    model.learn(128, progress_bar=False)
    assert model.num_timesteps == 128
    assert (model.config.action_noise, model.config.learning_rate) == ("none", 3e-4)
    model.config.learning_rate = "fast"
    with pytest.raises(UserError, match="^Hyperparameter 'learning_rate' got 'fast'"):
        model.learn(64, progress_bar=False)


def test_exploring_predict_leaves_the_training_noise_process_alone():
    """predict(deterministic=False) from a callback, on another batch size, neither advances nor reshapes the
    Ornstein-Uhlenbeck noise of the training envs."""
    model = DDPG("Pendulum-v1", seed=0, num_envs=2, action_noise="ornstein-uhlenbeck", **TINY)
    model.learn(96, progress_bar=False)
    noise = model._ou_noise.clone()
    actions, _ = model.predict(torch.zeros(5, 3), deterministic=False)
    assert actions.shape == (5, 1) and bool(((actions >= -2.0) & (actions <= 2.0)).all())
    assert torch.equal(model._ou_noise, noise)
    model.learn(32, progress_bar=False, callback=lambda local: model.predict(torch.zeros(5, 3), False) and True)
    assert model._ou_noise.shape == noise.shape  # predicting on 5 rows in between did not reshape it for training


def test_exploring_predict_without_action_noise_is_the_actor():
    model = TD3("Pendulum-v1", seed=0, action_noise="none", **TINY)
    obs = torch.randn(5, 3)
    assert torch.equal(model.predict(obs, deterministic=False)[0], model.predict(obs, deterministic=True)[0])


def test_dqns_exploring_predict_is_epsilon_greedy_at_the_final_epsilon():
    """DQN's predict(deterministic=False) explores as a trained model's schedule ends (SB3: its exploration_rate):
    with exploration_final_eps 0 it is the greedy action, with 1 a uniform random one, masked actions never."""
    obs = np.random.default_rng(0).normal(size=(512, 4)).astype(np.float32)
    greedy = DQN("CartPole-v1", seed=0, exploration_final_eps=0.0).predict(obs, deterministic=True)[0]
    assert np.array_equal(DQN("CartPole-v1", seed=0, exploration_final_eps=0.0).predict(obs, deterministic=False)[0],
                          greedy)
    model = DQN("CartPole-v1", seed=0, exploration_final_eps=1.0)
    explored = model.predict(obs, deterministic=False)[0]
    assert np.array_equal(model.predict(obs, deterministic=True)[0], greedy)
    assert 0.3 < float(np.mean(explored != greedy)) < 0.7  # (half the uniform draws are the greedy action)
    masks = np.zeros((512, 2), dtype=bool)
    masks[np.arange(512), 1 - greedy] = True  # (only the other action allowed)
    assert np.array_equal(model.predict(obs, deterministic=False, action_masks=masks)[0], 1 - greedy)


@pytest.mark.parametrize(("backend", "continues"), [("torch", True), ("gymnasium", False)])
def test_a_resume_continues_the_ou_noise_only_with_its_episodes(tmp_path, backend, continues):
    """The Ornstein-Uhlenbeck noise belongs to the episodes in progress: a resume that restores them (native envs)
    carries it on; one that starts fresh episodes (Gymnasium envs reset) starts it from 0, as any reset does."""
    run = tmp_path / "run"
    model = TD3("Pendulum-v1", seed=0, num_envs=2, env_backend="torch", action_noise="ornstein-uhlenbeck", **TINY)
    model.learn(128, progress_bar=False, run_dir=run, checkpoint_freq=128)
    saved = model._ou_noise.clone()
    assert saved.abs().sum() > 0

    resumed = TD3("Pendulum-v1", seed=0, num_envs=2, env_backend=backend, action_noise="ornstein-uhlenbeck", **TINY)
    resumed.resume(run / "checkpoint.safetensors")
    first = first_ou_noise(resumed, lambda: resumed.learn(8, progress_bar=False))
    assert torch.equal(first, saved if continues else torch.zeros_like(saved))


@pytest.mark.parametrize("algo", [TD3, DDPG])
def test_td3_and_ddpg_updates_equal_stable_baselines3s_train_step(algo, monkeypatch):
    """The same weights and replay batches give the same weights after SB3's `train` (critic step, then every
    `policy_delay` steps the actor's step through the updated critic and the Polyak step) as after rlspeed's
    updates, to float tolerance: an RL-Zoo entry trains as it does in SB3 (target smoothing noise off on both sides,
    the one random draw in the step)."""
    sb3 = pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.logger import configure
    from stable_baselines3.common.type_aliases import ReplayBufferSamples

    settings = {"learning_rate": 1e-3, "gamma": 0.98, "tau": 0.05, "batch_size": 16}
    if algo is TD3:
        settings["target_policy_noise"] = 0.0  # (DDPG has none)
    ours = algo("Pendulum-v1", seed=0, net_arch=(16, 16), ortho_init=False, adam_eps=1e-8, **settings)
    theirs = getattr(sb3, algo.__name__)("MlpPolicy", "Pendulum-v1", seed=0, policy_kwargs={"net_arch": [16, 16]},
                                         **settings)
    with torch.no_grad():  # SB3's networks take rlspeed's weights
        for ours_net, mu in ((ours.actor.net, theirs.actor.mu), (ours.actor_target.net, theirs.actor_target.mu)):
            mu.load_state_dict(ours_net.state_dict(), strict=False)
        for ours_critic, critic in ((ours.critic, theirs.critic), (ours.critic_target, theirs.critic_target)):
            body = ours_critic.body
            for k, q_net in enumerate(critic.q_networks):
                linears = [layer for layer in q_net if isinstance(layer, torch.nn.Linear)]
                for layer, weight, bias in zip(linears, body.weights, body.biases):
                    layer.weight.copy_(weight[k].T)
                    layer.bias.copy_(bias[k, 0])
    generator = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(4):
        obs, next_obs = torch.randn(2, 16, 3, generator=generator)
        actions = torch.rand(16, 1, generator=generator) * 2 - 1
        rewards, dones = -torch.rand(16, generator=generator) * 5, (torch.rand(16, generator=generator) < 0.2).float()
        batches.append((obs, actions, rewards, next_obs, dones))
    samples = iter([ReplayBufferSamples(obs, actions, next_obs, dones[:, None], rewards[:, None])
                    for obs, actions, rewards, next_obs, dones in batches])
    monkeypatch.setattr(theirs.replay_buffer, "sample", lambda *args, **kwargs: next(samples))
    theirs.set_logger(configure(None, []))
    theirs.train(gradient_steps=len(batches), batch_size=16)
    for obs, actions, rewards, next_obs, dones in batches:
        ours._update({"obs": obs, "actions": actions, "rewards": rewards, "next_obs": next_obs, "terminated": dones,
                      "discounts": torch.full((16,), 0.98)})
    pairs = [(ours.actor.net, theirs.actor.mu), (ours.actor_target.net, theirs.actor_target.mu)]
    for ours_net, mu in pairs:
        for name, value in ours_net.state_dict().items():
            torch.testing.assert_close(value, mu.state_dict()[name], rtol=1e-5, atol=1e-6)
    for ours_critic, critic in ((ours.critic, theirs.critic), (ours.critic_target, theirs.critic_target)):
        for k, q_net in enumerate(critic.q_networks):
            linears = [layer for layer in q_net if isinstance(layer, torch.nn.Linear)]
            for layer, weight, bias in zip(linears, ours_critic.body.weights, ours_critic.body.biases):
                torch.testing.assert_close(weight[k].T, layer.weight, rtol=1e-5, atol=1e-6)
                torch.testing.assert_close(bias[k, 0], layer.bias, rtol=1e-5, atol=1e-6)


def test_sac_update_equals_stable_baselines3s_train_step(monkeypatch):
    """As for TD3: SAC's autograd update (the hand-derived one equals it: tests/test_fused_sac.py) and SB3's `train`
    take the same steps from the same weights and batches: the temperature, critic and actor steps in SB3's order,
    the actor's gradient through the updated critics. The policy's noise is the one random draw: both sides take the
    same numbers (SB3 samples a~ for the batch's observations, then a' for the next ones; rlspeed the other way
    round). SB3's squashing correction adds 1e-6 inside its logarithm, rlspeed's is exact: the two agree to about 3e-7
    of each tensor's largest value, while an actor step through the critics before their step is 1.6e-4 off."""
    sb3 = pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.logger import configure
    from stable_baselines3.common.type_aliases import ReplayBufferSamples

    settings = {"learning_rate": 1e-3, "gamma": 0.98, "tau": 0.05, "batch_size": 16}
    ours = SAC("Pendulum-v1", seed=0, net_arch=(16, 16), ortho_init=False, adam_eps=1e-8, fused_update=False,
               **settings)
    theirs = sb3.SAC("MlpPolicy", "Pendulum-v1", seed=0, policy_kwargs={"net_arch": [16, 16]}, **settings)
    with torch.no_grad():  # SB3's networks take rlspeed's weights (rlspeed's last actor layer: mean rows, log_std rows)
        linears = [layer for layer in ours.actor.net if isinstance(layer, torch.nn.Linear)]
        for layer, theirs_layer in zip(linears[:-1], [m for m in theirs.actor.latent_pi
                                                      if isinstance(m, torch.nn.Linear)]):
            theirs_layer.load_state_dict(layer.state_dict())
        theirs.actor.mu.weight.copy_(linears[-1].weight[:1])
        theirs.actor.mu.bias.copy_(linears[-1].bias[:1])
        theirs.actor.log_std.weight.copy_(linears[-1].weight[1:])
        theirs.actor.log_std.bias.copy_(linears[-1].bias[1:])
        for ours_critic, critic in ((ours.critic, theirs.critic), (ours.critic_target, theirs.critic_target)):
            for k, q_net in enumerate(critic.q_networks):
                for layer, weight, bias in zip([m for m in q_net if isinstance(m, torch.nn.Linear)],
                                               ours_critic.body.weights, ours_critic.body.biases):
                    layer.weight.copy_(weight[k].T)
                    layer.bias.copy_(bias[k, 0])
    generator = torch.Generator().manual_seed(1)
    batches, draws = [], []
    for _ in range(3):
        obs, next_obs = torch.randn(2, 16, 3, generator=generator)
        actions = torch.rand(16, 1, generator=generator) * 2 - 1
        rewards, dones = -torch.rand(16, generator=generator) * 5, (torch.rand(16, generator=generator) < 0.2).float()
        batches.append((obs, actions, rewards, next_obs, dones))
        draws.append(torch.randn(2, 16, 1, generator=generator))  # (for obs, for next_obs)
    samples = iter([ReplayBufferSamples(obs, actions, next_obs, dones[:, None], rewards[:, None])
                    for obs, actions, rewards, next_obs, dones in batches])
    monkeypatch.setattr(theirs.replay_buffer, "sample", lambda *args, **kwargs: next(samples))
    theirs_noise = iter([noise for pair in draws for noise in pair])
    monkeypatch.setattr(torch.distributions.Normal, "rsample",
                        lambda self, *shape: self.loc + next(theirs_noise) * self.scale)
    theirs.set_logger(configure(None, []))
    theirs.train(gradient_steps=len(batches), batch_size=16)
    ours_noise = iter([noise for pair in draws for noise in reversed(pair)])
    monkeypatch.setattr(torch, "randn_like", lambda like, **kwargs: next(ours_noise).to(like.dtype))
    for obs, actions, rewards, next_obs, dones in batches:
        ours._update({"obs": obs, "actions": actions, "rewards": rewards, "next_obs": next_obs, "terminated": dones,
                      "discounts": torch.full((16,), 0.98)})
    with torch.no_grad():
        tolerance = {"rtol": 1e-5, "atol": 1e-6}
        torch.testing.assert_close(ours.log_alpha, theirs.log_ent_coef, **tolerance)
        got = [p for layer in linears for p in (layer.weight, layer.bias)]
        want = [p for m in theirs.actor.latent_pi if isinstance(m, torch.nn.Linear) for p in (m.weight, m.bias)]
        want += [torch.cat((theirs.actor.mu.weight, theirs.actor.log_std.weight)),
                 torch.cat((theirs.actor.mu.bias, theirs.actor.log_std.bias))]
        for value, expected in zip(got, want, strict=True):
            torch.testing.assert_close(value, expected, **tolerance)
        for ours_critic, critic in ((ours.critic, theirs.critic), (ours.critic_target, theirs.critic_target)):
            for k, q_net in enumerate(critic.q_networks):
                for layer, weight, bias in zip([m for m in q_net if isinstance(m, torch.nn.Linear)],
                                               ours_critic.body.weights, ours_critic.body.biases):
                    torch.testing.assert_close(weight[k].T, layer.weight, **tolerance)
                    torch.testing.assert_close(bias[k, 0], layer.bias, **tolerance)


def test_td3_reports_actor_loss_only_from_actor_updates(tmp_path):
    """Delayed policy updates: a metrics row before the first actor update has no actor_loss (it showed 0.0), and a
    row without one repeats no older value."""
    import csv

    TD3("Pendulum-v1", num_envs=1, learning_starts=4, batch_size=4, policy_delay=3, seed=0, device="cpu").learn(
        8, run_dir=tmp_path, log_interval_s=0, progress_bar=False)
    with open(tmp_path / "metrics.csv", newline="") as handle:
        rows = {int(row["timesteps"]): row for row in csv.DictReader(handle)}
    # critic updates from step 5 on (past learning_starts); the third moves the actor
    assert [step for step, row in rows.items() if row["critic_loss"]] == [5, 6, 7, 8]
    assert [step for step, row in rows.items() if row["actor_loss"]] == [7]


def test_dqn_metrics_epsilon_is_the_schedules_value(tmp_path):
    """metrics.csv's epsilon is the schedule's value, and past the decay exploration_final_eps itself, as SB3's
    exploration_rate is (it read 0.009999999776482582 for 0.01, a float32's, and the schedule's end was
    0.010000000000000009: `metrics.epsilon == 0.01` found no row)."""
    import csv

    model = DQN("CartPole-v1", num_envs=1, learning_starts=4, batch_size=4, exploration_fraction=0.25, seed=0,
                device="cpu").learn(8, run_dir=tmp_path, log_interval_s=0, progress_bar=False)
    with open(tmp_path / "metrics.csv", newline="") as handle:
        epsilons = {int(row["timesteps"]): float(row["epsilon"]) for row in csv.DictReader(handle)}
    assert epsilons == {4: 0.05, 8: 0.05}  # (a row per iteration of train_freq 4 steps; the decay ends at step 2)
    assert model.epsilon(1) == pytest.approx(0.525)


def test_a_loaded_model_of_a_normalising_env_trains_on_normalised_observations(tmp_path):
    """An off-policy model trained on `make_env(..., normalize_obs=True)` keeps the statistics (predict uses them):
    loaded and trained further from its env id, it trained on raw observations while predict normalised them."""
    from rlspeed import make_env

    model = SAC(make_env("Pendulum-v1", num_envs=2, normalize_obs=True), seed=0, device="cpu", learning_starts=32)
    model.learn(128, progress_bar=False)
    model.save(tmp_path / "model")
    loaded = SAC.load(tmp_path / "model")
    count = float(loaded.obs_rms.count)
    loaded.learn(128, progress_bar=False)
    assert float(loaded.obs_rms.count) >= count + 128  # (its training env normalised, and updated them)
    assert loaded._env.obs_rms is loaded.obs_rms


def test_a_model_saved_before_off_policy_normalize_obs_keeps_normalising(tmp_path):
    """A file written before DQN, SAC, TD3 and DDPG had normalize_obs (its config lacks the key) by a model trained on
    a normalising env: loaded without an env, its statistics stay (predict normalises) and its learn normalises; the
    default normalize_obs=False dropped them, as a load override turning normalisation off does."""
    from rlspeed import make_env
    from rlspeed.checkpoint import load_checkpoint, save_checkpoint

    model = SAC(make_env("Pendulum-v1", normalize_obs=True), seed=0, device="cpu", learning_starts=16, batch_size=16)
    model.learn(64, progress_bar=False)
    path = model.save(tmp_path / "model")
    tensors, meta = load_checkpoint(path)
    del meta["config"]["normalize_obs"], meta["digest"]
    save_checkpoint(tmp_path / "old", tensors, meta)
    loaded = SAC.load(tmp_path / "old")
    assert loaded.config.normalize_obs and float(loaded.obs_rms.count) == float(model.obs_rms.count)
    obs = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32) * 3
    np.testing.assert_array_equal(model.predict(obs, deterministic=True)[0], loaded.predict(obs, deterministic=True)[0])


def test_sac_tunes_its_temperature_towards_minus_the_action_dimension_by_default():
    """SB3's `target_entropy="auto"`: -dim(A) (the population copies the solo model's value, so no parity test can
    see a wrong one)."""
    assert SAC("Pendulum-v1", seed=0).target_entropy == -1.0
    assert SAC("MountainCarContinuous-v0", seed=0, target_entropy=-0.5).target_entropy == -0.5
    wide = gym.vector.SyncVectorEnv([_ThreeActions], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    assert SAC(wide, seed=0).target_entropy == -3.0
    wide.close()


class _ThreeActions(gym.Env):
    """A Box action of 3 dimensions."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), dtype=np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (3,), dtype=np.float32)

    def reset(self, seed=None, options=None):
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, False, {}


def test_dqn_metrics_row_gives_the_exploration_rate_at_its_step(tmp_path):
    """A metrics row's epsilon is the exploration rate at the row's step, as SB3's rollout/exploration_rate: it was
    the mean over the row's iterations (a row over the whole decay, from 1 to 0.05, gave 0.29)."""
    import csv

    model = DQN("CartPole-v1", device="cpu", seed=0, learning_starts=100, exploration_fraction=0.5,
                net_arch=(16,), batch_size=16)
    model.learn(400, progress_bar=False, run_dir=tmp_path, log_interval_s=3600.0)  # (one row, at the end)
    with open(tmp_path / "metrics.csv", newline="") as handle:
        (row,) = list(csv.DictReader(handle))
    assert float(row["epsilon"]) == pytest.approx(model.epsilon(int(row["timesteps"])), abs=1e-6)
    assert float(row["epsilon"]) == pytest.approx(model.config.exploration_final_eps)


def test_td3_target_actions_are_the_target_actors_with_noise_clipped_to_target_noise_clip():
    """TD3's target actions are a' = clip(mu_target(s') + clip(eps, -c, c), -1, 1): from the target actor (not the
    online one, moved away from it here), and with a noise std (5) far above its clip c (0.1), every a' lies within
    c of mu_target(s') and the noise reaches that bound; without noise, a' is mu_target(s')."""
    model = TD3("Pendulum-v1", device="cpu", seed=0, target_policy_noise=5.0, target_noise_clip=0.1)
    with torch.no_grad():
        for parameter in model.actor.parameters():
            parameter.add_(0.5)
    generator = torch.Generator().manual_seed(0)
    obs, next_obs = torch.randn(2, 64, 3, generator=generator)
    actions = torch.rand(64, 1, generator=generator) * 2 - 1
    target_actions = []
    critic_target = model.critic_target.forward

    def record(observations, actions):
        target_actions.append(actions.clone())
        return critic_target(observations, actions)

    model.critic_target.forward = record
    batch = (obs, actions, torch.zeros(64), next_obs, torch.zeros(64), torch.full((64,), 0.99))
    model._critic_loss(*batch)
    model.config.target_policy_noise = 0.0
    model._critic_loss(*batch)
    with torch.no_grad():
        mean = model.actor_target(next_obs)
        assert not torch.allclose(model.actor(next_obs), mean, atol=0.1)
    smoothed, plain = target_actions
    assert (smoothed - mean).abs().max() <= 0.1 + 1e-6
    assert (smoothed - mean).abs().max() >= 0.1 - 1e-6
    torch.testing.assert_close(plain, mean)


def test_dueling_q_values_are_the_value_plus_each_advantage_less_their_mean():
    """dueling=True (Wang et al., 2016, the mean form): Q(s, a) = V(s) + A(s, a) - mean_a' A(s, a'), V and A the
    head's columns over the shared body's features."""
    model = DQN("CartPole-v1", device="cpu", seed=0, dueling=True, net_arch=(16, 16))
    q_network = model.q_network
    with torch.no_grad():
        q_network.head.bias.copy_(torch.tensor([0.5, 3.0, -1.0]))  # (advantages far apart: mean and max differ)
        obs = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
        out = q_network.head(q_network.body(obs))
        value, advantages = out[:, 0], out[:, 1:]
        expected = value.unsqueeze(1) + advantages - (advantages[:, :1] + advantages[:, 1:]) / 2
        torch.testing.assert_close(q_network(obs), expected)


# --- normalize_obs ---------------------------------------------------------------------------------------------------
def test_sac_normalize_obs_stores_raw_observations_normalises_batches_and_saves_its_statistics(tmp_path):
    """normalize_obs=True (RL-Zoo's `normalize` for SAC; it was an unknown hyperparameter): the statistics grow with
    training, the replay holds the env's own observations (Pendulum's cos and sin on the unit circle) and each batch
    is normalised with the statistics of sampling time, as SB3's VecNormalize; save/load keeps the statistics, so
    predict is the same, and the loaded model's learn goes on normalising."""
    model = SAC("Pendulum-v1", normalize_obs=True, seed=0, **TINY)
    model.learn(300, progress_bar=False)
    assert model.obs_rms is not None and float(model.obs_rms.count) > 300
    stored = model.buffer.obs[:len(model.buffer)]
    torch.testing.assert_close(stored[:, 0] ** 2 + stored[:, 1] ** 2, torch.ones(len(stored)))  # (raw)
    rows = model.buffer.sample(64, generator=torch.Generator().manual_seed(0))
    batch = model._prepare_normalised(dict(rows))
    for name in ("obs", "next_obs"):
        torch.testing.assert_close(batch[name], model.obs_rms.normalize(rows[name], 10.0))
    model.save(tmp_path / "model")
    loaded = SAC.load(tmp_path / "model")
    obs = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32) * 3
    np.testing.assert_array_equal(model.predict(obs, deterministic=True)[0], loaded.predict(obs, deterministic=True)[0])
    assert loaded.config.normalize_obs and float(loaded.obs_rms.count) == float(model.obs_rms.count)
    loaded.learn(100, progress_bar=False)
    assert float(loaded.obs_rms.count) > float(model.obs_rms.count)


def test_off_policy_normalize_obs_from_the_cli_and_one_value_for_a_population(tmp_path, capsys):
    """`--set normalize_obs=true` trains and records it in config.yaml; an off-policy population takes it for all its
    members (each with its own statistics), and refuses one member's own value in one sentence."""
    out = tmp_path / "run"
    assert main(["train", "sac", "Pendulum-v1", "--preset", "none", "--set", "normalize_obs=true", "--set",
                 "learning_starts=32", "--set", "batch_size=16", "--set", "net_arch=[16]", "--total-timesteps",
                 "64", "--out", str(out), "--eval-episodes", "1", "--target-return", "none",
                 "--no-progress", "--quiet"]) == 0
    assert "normalize_obs: true" in (out / "config.yaml").read_text()
    assert SAC.load(out / "model").obs_rms is not None
    from rlspeed.population import Population

    assert Population(SAC, "Pendulum-v1", seeds=range(2), normalize_obs=True).member_statistics(1).keys() == {
        "obs_rms.mean", "obs_rms.var", "obs_rms.count"}
    with pytest.raises(UserError, match="member_overrides sets 'normalize_reward'"):
        Population(TD3, "Pendulum-v1", seeds=range(2), member_overrides=[{}, {"normalize_reward": True}])


@pytest.mark.parametrize(("flag", "rows"), [("normalize_obs", "observations"), ("normalize_reward", "rewards")])
def test_resuming_a_run_saved_before_normalize_obs_does_not_normalise_its_replay_twice(tmp_path, flag, rows):
    """A run on a normalising env passed in, saved by an rlspeed before off-policy normalize_obs (normalize_reward;
    config without the key), kept normalised observations (scaled rewards) in its replay; resumed now, the flag
    stores raw ones and normalises each batch: its rows would be normalised twice, so the buffer refills from empty,
    with a warning saying why."""
    from rlspeed import make_env
    from rlspeed.checkpoint import load_checkpoint, save_checkpoint

    options = {"seed": 0, "device": "cpu", "learning_starts": 16, "batch_size": 16, "save_replay_buffer": True,
               "net_arch": (8,)}
    model = SAC(make_env("Pendulum-v1", **{flag: True}), **options)
    model.learn(32, progress_bar=False)
    tensors, meta = load_checkpoint(model.save(tmp_path / "model"))
    del meta["config"][flag], meta["digest"]
    save_checkpoint(tmp_path / "old", tensors, meta)
    resumed = SAC(make_env("Pendulum-v1", **{flag: True}), **options)
    resumed.resume(tmp_path / "old")
    with pytest.warns(UserWarning, match=f"{rows} normalised as they were collected, and {flag}.*refills from empty"):
        resumed.learn(40, progress_bar=False)
    assert len(resumed.buffer) == 40  # (its own steps only)
    again = SAC(make_env("Pendulum-v1", **{flag: True}), **options)  # (today's files: raw, restored)
    again.resume(tmp_path / "model")
    again.learn(40, progress_bar=False)
    assert len(again.buffer) == 72


# --- normalize_reward ------------------------------------------------------------------------------------------------
class _FixedRewards(gym.Env):
    """Rewards from a fixed sequence (large, of both signs), episodes of 7 steps that end terminated."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    REWARDS = np.random.default_rng(0).normal(5.0, 40.0, size=200).astype(np.float32)

    def __init__(self):
        self.t = self.episode_t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode_t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        reward = float(self.REWARDS[self.t % len(self.REWARDS)])
        self.t, self.episode_t = self.t + 1, self.episode_t + 1
        return np.zeros(1, np.float32), reward, self.episode_t == 7, False, {}


def test_normalize_reward_stores_raw_rewards_and_scales_batches_as_sb3s_vec_normalize():
    """normalize_reward=True for the off-policy algorithms (RL-Zoo's `normalize: True`; it was an unknown
    hyperparameter): the replay holds the env's own rewards, the running return statistics are updated from them as
    they come, and each batch's rewards are raw / sqrt(var + 1e-8) clipped at 10, which are SB3's VecNormalize's
    numbers (`normalize_reward`, as its ReplayBuffer applies it) on the same rewards."""
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    steps = 150
    model = SAC(gym.vector.SyncVectorEnv([_FixedRewards], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP),
                normalize_reward=True, gamma=0.9, seed=0, device="cpu", net_arch=(8,), batch_size=16,
                learning_starts=steps - 2)
    model.learn(steps, progress_bar=False)
    stored = model.buffer.rewards[:len(model.buffer)]
    np.testing.assert_array_equal(stored.numpy(), _FixedRewards.REWARDS[:steps])  # (raw)
    reference = VecNormalize(DummyVecEnv([_FixedRewards]), norm_obs=False, gamma=0.9)
    reference.reset()
    for _ in range(steps):
        reference.step(np.zeros((1, 1), np.float32))
    np.testing.assert_allclose(float(model.return_rms.var), reference.ret_rms.var, rtol=1e-6)
    rows = model.buffer.sample(64, generator=torch.Generator().manual_seed(0))
    batch = model._prepare_normalised(dict(rows))
    np.testing.assert_allclose(batch["rewards"].numpy(), reference.normalize_reward(rows["rewards"].numpy()),
                               rtol=1e-5)
    assert float(batch["rewards"].abs().max()) <= 10 < float(rows["rewards"].abs().max())
    assert not find_wrapper(model._env, NormalizeReward).hand_out_raw  # (its env scales again once learn returns)


def test_normalize_reward_statistics_are_saved_loaded_and_resumed(tmp_path):
    """The return statistics of normalize_reward go with the model: load gives them back (predict is unchanged, and
    its learn goes on updating them), resume goes on from them with its replay of raw rewards (save_replay_buffer).
    (tests/test_resume.py checks that a resumed SAC run with it is bitwise the uninterrupted one.)"""
    options = {"seed": 0, "device": "cpu", "normalize_reward": True, "learning_starts": 16, "batch_size": 16,
               "net_arch": (8,), "save_replay_buffer": True}
    model = SAC("Pendulum-v1", **options)
    model.learn(48, progress_bar=False)
    path = model.save(tmp_path / "model")
    loaded = SAC.load(path)
    assert loaded.config.normalize_reward and float(loaded.return_rms.var) == float(model.return_rms.var)
    loaded.learn(32, progress_bar=False)
    assert float(loaded.return_rms.count) == float(model.return_rms.count) + 32
    resumed = SAC("Pendulum-v1", **options)
    resumed.resume(path)
    resumed.learn(16, progress_bar=False)
    assert float(resumed.return_rms.count) == float(model.return_rms.count) + 16
    assert torch.equal(resumed.buffer.rewards[:48], model.buffer.rewards[:48])
    assert float(resumed.buffer.rewards[:64].min()) < -1  # (Pendulum's own rewards, down to -16.3: raw)


def test_a_replay_file_records_raw_rows_and_an_unmarked_one_is_not_normalised_twice(tmp_path):
    """A replay file says what its rows hold (the env's own observations and rewards); one written before it did, by
    a run that may have stored normalised observations, was loaded into a normalize_obs model, which normalised them
    again, silently: it is refused in one sentence unless assume_raw=True says its rows are raw (a model that
    normalises nothing takes it as before), and a file whose rows are recorded as normalised is refused."""
    from rlspeed.checkpoint import load_checkpoint, save_checkpoint

    options = {"seed": 0, "device": "cpu", "learning_starts": 16, "batch_size": 16, "net_arch": (8,)}
    model = SAC("Pendulum-v1", normalize_obs=True, **options)
    model.learn(32, progress_bar=False)
    path = model.save_replay_buffer(tmp_path / "replay")
    tensors, meta = load_checkpoint(path)
    assert meta["replay_buffer"]["contents"] == {"observations": "raw", "rewards": "raw"}
    SAC("Pendulum-v1", normalize_obs=True, **options).load_replay_buffer(path)
    del meta["replay_buffer"]["contents"], meta["digest"]
    save_checkpoint(tmp_path / "old", tensors, meta)
    normalising = SAC("Pendulum-v1", normalize_reward=True, **options)
    with pytest.raises(UserError, match=r"^'.*old.safetensors' cannot fill this model's replay buffer: it was written "
                                        r"before replay files recorded what their rows hold, and this model normalises "
                                        r"each batch's rewards \(normalize_reward\).*assume_raw=True"):
        normalising.load_replay_buffer(tmp_path / "old.safetensors")
    normalising.load_replay_buffer(tmp_path / "old.safetensors", assume_raw=True)
    normalising.learn(16, progress_bar=False)
    assert len(normalising.buffer) == 48
    SAC("Pendulum-v1", **options).load_replay_buffer(tmp_path / "old.safetensors")  # (nothing normalised)
    meta["replay_buffer"]["contents"] = {"observations": "normalised", "rewards": "raw"}
    save_checkpoint(tmp_path / "normalised", tensors, meta)
    with pytest.raises(UserError, match="its rows hold observations 'normalised', and the buffer holds the env's own"):
        SAC("Pendulum-v1", **options).load_replay_buffer(tmp_path / "normalised.safetensors")
