"""rlspeed.population for SAC, TD3 and DQN: members are solo runs (initial weights, updates, per-member
hyperparameters), members that leave (pruned, diverged) leave the others as they were, bad inputs are one sentence,
and learn's summary holds per-member results and aggregates."""

import json
import math

import pytest
import torch
from conftest import assert_member_is_its_solo_run, members_collection_epsilons

from rlspeed import DDPG, DQN, PPO, SAC, TD3, RecurrentPPO
from rlspeed.errors import UserError
from rlspeed.population import DQNPopulation, Population

# small and quick: 2 envs, 40 random steps, then 2 updates per step on batches of 32 (a multiple of 16: see the
# module docstring), 3-step returns
SMALL = {"num_envs": 2, "batch_size": 32, "learning_starts": 40, "net_arch": [32, 32], "gradient_steps": 2,
         "n_step": 3, "learning_rate": 2e-3}
STEPS = 80  # per member: 40 iterations, about 40 updates
#: member 1's own values of every per-member hyperparameter (member 0 keeps the defaults)
MEMBER_VALUES = {
    SAC: {"learning_rate": 5e-4, "gamma": 0.9, "tau": 0.02, "ent_coef": 0.1},
    TD3: {"learning_rate": 5e-4, "gamma": 0.9, "tau": 0.02, "target_policy_noise": 0.0, "action_noise_std": 0.3},
    DDPG: {"learning_rate": 5e-4, "gamma": 0.9, "tau": 0.02, "action_noise_std": 0.3},
}
DEFAULTS = {SAC: {"learning_rate": 2e-3, "gamma": 0.99, "tau": 0.005, "ent_coef": None},
            TD3: {"learning_rate": 2e-3, "gamma": 0.99, "tau": 0.005, "target_policy_noise": 0.2,
                  "action_noise_std": 0.1},
            DDPG: {"learning_rate": 2e-3, "gamma": 0.99, "tau": 0.005, "action_noise_std": 0.1}}


def _state(model) -> dict[str, torch.Tensor]:
    """A solo model's parameters named as `member_state` names them."""
    state = {}
    for name, module in model._modules().items():
        if isinstance(module, torch.Tensor):
            state[name] = module.detach().clone()
        else:
            state.update({f"{name}.{key}": value.detach().clone() for key, value in module.state_dict().items()})
    return state


def _solo(algo, seed: int, steps: int, **hyper) -> tuple[dict, dict]:
    solo = algo("Pendulum-v1", seed=seed, env_backend="torch", **{**SMALL, **hyper})
    initial = _state(solo)
    solo.learn(steps, progress_bar=False)
    return initial, _state(solo)


@pytest.mark.parametrize("algo, update", [(SAC, {}), (SAC, {"fused_update": False}), (TD3, {}), (DDPG, {}),
                                          (SAC, {"anneal_lr": True}), (TD3, {"anneal_lr": True}),
                                          (SAC, {"ortho_init": False, "adam_eps": 1e-8}),
                                          (TD3, {"ortho_init": False, "adam_eps": 1e-8}),
                                          (SAC, {"activation": "gelu"})])
def test_members_start_and_update_as_solo_runs_with_their_own_hyperparameters(algo, update):
    """SAC's members by the hand-derived gradient (fused_update, the default) and by autograd alike (the solo runs
    use their default update); TD3's and DDPG's (one critic, no delay or smoothing) by autograd; with anneal_lr,
    every member's learning rate decays as its solo run's; SB3's initialisation and Adam epsilon (RL-Zoo's
    translation) reach the members."""
    seeds = [3, 7]
    per_member = {key: [DEFAULTS[algo][key], value] for key, value in MEMBER_VALUES[algo].items()}
    population = Population(algo, "Pendulum-v1", seeds=seeds, **{**SMALL, **per_member, **update})
    hand = algo is SAC and update.get("fused_update", True) and "activation" not in update
    assert population.update_path == ("hand-derived" if hand else "autograd")
    assert population.update_reason == ("fused_update=False" if "fused_update" in update else "default (an MLP with "
                                        "ReLU or tanh)" if hand else "activation=gelu (the hand-derived update "
                                        "covers tanh and relu)" if algo is SAC else "populations have a "
                                        "hand-derived update for SAC only")
    initial = [population.member_state(k) for k in range(2)]
    population._start(STEPS)
    while population.num_timesteps < STEPS:
        population.train_iteration()
    for k, seed in enumerate(seeds):
        own = {key: values[k] for key, values in per_member.items()}
        solo_initial, solo_trained = _solo(algo, seed, STEPS, **own,
                                           **{key: value for key, value in update.items() if key != "fused_update"})
        fixed = ("log_alpha",) if own.get("ent_coef") is not None else ()  # (a fixed temperature does not move)
        assert_member_is_its_solo_run(initial[k], population.member_state(k), solo_initial, solo_trained,
                                      unmoved=fixed)


def test_a_sac_population_without_hidden_layers_says_so_whatever_its_activation():
    """With net_arch=[] no activation runs: a SAC population with activation=gelu said "activation=gelu (...)" as why
    it trained by autograd, where relu's said the networks have no hidden layers."""
    for activation in ("relu", "gelu"):
        population = Population(SAC, "Pendulum-v1", seeds=[0, 1], **{**SMALL, "net_arch": []}, activation=activation)
        assert (population.update_path, population.update_reason) == ("autograd", "networks without hidden layers")


def test_a_dqn_members_collection_explores_at_its_solo_runs_epsilon_at_every_step(monkeypatch):
    """The epsilon of each member's epsilon-greedy draws at each collection step is `DQN.epsilon` of its solo run
    over the same learn call (in float32, which the draws compare with), the final value itself once the schedule
    ends; a member keeps its own schedule after another left."""
    hyper = {"num_envs": 2, "train_freq": 4, "learning_starts": 0, "batch_size": 8, "buffer_size": 64,
             "exploration_fraction": 0.25, "net_arch": [8]}
    seeds, finals, steps = [3, 7, 11], [0.05, 0.2, 0.1], 40
    population = DQNPopulation(DQN, "CartPole-v1", seeds=seeds, exploration_final_eps=finals, **hyper)
    population.remove([0])
    population._start(steps)
    solos = [DQN("CartPole-v1", seed=seeds[k], env_backend="torch", exploration_final_eps=finals[k], **hyper)
             for k in population.alive]
    for solo in solos:
        solo.learn(steps, progress_bar=False)
    for before in range(0, steps, 8):  # (a collection: 4 steps of 2 envs)
        expected = [[solo.epsilon(before + 2 * step) for step in range(4)] for solo in solos]
        torch.testing.assert_close(torch.tensor(members_collection_epsilons(population, before, monkeypatch)),
                                   torch.tensor(expected), rtol=1e-6, atol=0)  # (float32: 1 ulp)
    assert members_collection_epsilons(population, 32, monkeypatch) == torch.tensor([[0.2] * 4, [0.1] * 4]).tolist()


@pytest.mark.parametrize(("dueling", "td_loss", "double_q", "activation"), [
    (False, "huber", True, {}), (True, "huber", True, {}), (False, "mse", True, {}), (False, "huber", False, {}),
    (False, "huber", True, {"activation": "mish"})])
def test_dqn_members_start_and_update_as_solo_runs_with_their_own_hyperparameters(dueling, td_loss, double_q,
                                                                                  activation):
    """Epsilon-greedy draws, Double DQN targets or the target network's own maximum (double_q=False, RL-Zoo's DQN
    presets), per-member gradient clipping (member 1 clips at 0.5) and target copies every 16 steps, plain or dueling
    Q-networks, Huber or squared TD loss, an activation beyond relu and tanh (SB3's mish): member k equals the solo
    DQN with its seed and values."""
    small = {"num_envs": 2, "train_freq": 4, "gradient_steps": 4, "batch_size": 32, "learning_starts": 40,
             "target_update_interval": 16, "net_arch": [32, 32], "exploration_fraction": 0.5, "dueling": dueling,
             "td_loss": td_loss, "double_q": double_q, **activation}
    per_member = {"learning_rate": [5e-3, 1e-3], "gamma": [0.99, 0.9], "exploration_final_eps": [0.05, 0.2],
                  "max_grad_norm": [10.0, 0.5]}
    seeds, steps = [3, 7], 120
    population = DQNPopulation(DQN, "CartPole-v1", seeds=seeds, **small, **per_member)
    initial = [population.member_state(k) for k in range(2)]
    population._start(steps)
    while population.num_timesteps < steps:
        population.train_iteration()
    for k, seed in enumerate(seeds):
        solo = DQN("CartPole-v1", seed=seed, env_backend="torch", **small,
                   **{key: values[k] for key, values in per_member.items()})
        solo_initial = _state(solo)
        solo.learn(steps, progress_bar=False)
        solo_trained, trained = _state(solo), population.member_state(k)
        assert trained.keys() == solo_trained.keys()
        for name, value in solo_initial.items():
            assert torch.equal(initial[k][name], value), name
            assert not torch.allclose(solo_trained[name], value), name
            torch.testing.assert_close(trained[name], solo_trained[name], atol=1e-5, rtol=0)


@pytest.mark.parametrize(("algo", "env_id", "hyper"), [
    (SAC, "Pendulum-v1", SMALL), (TD3, "Pendulum-v1", SMALL), (DDPG, "Pendulum-v1", SMALL),
    (DQN, "CartPole-v1", {"num_envs": 2, "train_freq": 4, "gradient_steps": 4, "batch_size": 32, "learning_starts": 40,
                          "target_update_interval": 16, "net_arch": [32, 32], "n_step": 3})])
def test_members_normalise_observations_and_rewards_as_their_solo_runs(algo, env_id, hyper):
    """normalize_obs and normalize_reward: each member keeps its own running statistics (its own gamma for the
    discounted return), its replay stores the env's own observations and rewards and normalises each sampled batch,
    as the solo run with its seed does: member k's parameters and statistics are the solo run's, and evaluated on the
    solo run's evaluation episodes (observations normalised by its statistics, frozen) it scores the solo's. Clips
    tighter than the default 10 (`normalize_obs_clip`, `normalize_reward_clip`) apply to members as to solo runs."""
    normalise = {"normalize_obs": True, "normalize_reward": True, "normalize_obs_clip": 1.5,
                 "normalize_reward_clip": 0.5}
    seeds, steps, gammas = [3, 7], 64, [0.99, 0.9]
    population = Population(algo, env_id, seeds=seeds, env_backend="torch", gamma=gammas, **hyper, **normalise)
    initial = [population.member_state(k) for k in range(2)]
    population._start(steps)
    while population.num_timesteps < steps:
        population.train_iteration()
    if env_id == "Pendulum-v1":  # (the replay holds Pendulum's own rewards, down to -16.3, not scaled ones)
        assert float(population.buffer.sample(torch.arange(64).expand(2, 64))["rewards"].min()) < -1
    for k, seed in enumerate(seeds):
        solo = algo(env_id, seed=seed, env_backend="torch", gamma=gammas[k], **hyper, **normalise)
        solo_initial = _state(solo)
        solo.learn(steps, progress_bar=False)
        solo_trained = {**_state(solo), **{f"{name}.{key}": value for name in ("obs_rms", "return_rms")
                                           for key, value in getattr(solo, name).state_dict().items()}}
        trained = {**population.member_state(k), **population.member_statistics(k)}
        assert_member_is_its_solo_run(initial[k], trained, solo_initial, solo_trained, rtol=1e-5)
        solo_eval = solo.evaluate(episodes=1, seed=100 + k)["mean"]
        assert population.evaluate([100 + k], episodes=1, members=[k]).item() == pytest.approx(solo_eval, abs=1e-3)


def test_a_members_evaluation_is_its_solo_models_digit_for_digit():
    """Each member's mean return (Pendulum's fractional returns) is `rlspeed.evaluate`'s of its solo model with the
    same episode seeds, exactly, for a member in the computation and one that left, and in learn's final evaluation:
    the batched actor rounded its actions differently from the solo's `nn.Linear` (a 64 x 2 layer on 3 rows), and
    means differed in the 8th digit, so `rlspeed eval MEMBER --seed S` did not repeat a member's final_eval."""
    population = Population(SAC, "Pendulum-v1", seeds=[0, 1], env_backend="torch", net_arch=[64, 64],
                            learning_starts=0, batch_size=2)
    population.remove([1])
    means = population.evaluate([5, 6], episodes=3, members=[0, 1]).tolist()
    assert means == [population.member_model(k).evaluate(episodes=3, seed=seed)["mean"]
                     for k, seed in ((0, 5), (1, 6))]
    # (learn's final evaluation too, which `rlspeed eval MEMBER --seed S` repeats; its curves' take the batched path)
    final = population.learn(2, eval_freq=100, eval_episodes=2)["members"][0]["final_eval"]
    assert final["mean"] == population.member_model(0).evaluate(episodes=2, seed=final["seed"])["mean"]


def test_pruned_member_leaves_and_the_others_train_on_as_solo_runs(tmp_path):
    """on_eval prunes member 0 at the first evaluation: it leaves the computation (its stacks shrink), member 1
    trains on exactly as the solo run, member 0 keeps the parameters it left with, and the summary says when it
    left."""
    seeds = [3, 7]
    population = Population(SAC, "Pendulum-v1", seeds=seeds, **SMALL)
    calls = []

    def on_eval(num_timesteps, means):
        calls.append((num_timesteps, sorted(means)))
        return [0] if 0 in means else []

    summary = population.learn(STEPS, eval_freq=50, eval_episodes=2, on_eval=on_eval)
    assert calls[0] == (50, [0, 1]) and calls[-1] == (STEPS, [1])
    assert population.alive == [1] and population.actor_weights[0].shape[0] == 1
    _, solo_trained = _solo(SAC, 7, STEPS)
    for name, value in population.member_state(1).items():
        torch.testing.assert_close(value, solo_trained[name], atol=1e-5, rtol=0)
    first, second = summary["members"]
    assert first["pruned_at"] == 50 and "pruned_at" not in second and summary["pruned"] == 1
    assert [point[0] for point in first["curve"]] == [50] and [point[0] for point in second["curve"]] == [50, STEPS]
    assert first["final_eval"]["episodes"] == 2 and math.isfinite(first["final_eval"]["mean"])
    written = json.loads(population.write_summary(tmp_path / "summary.json").read_text())
    assert written["members"][0]["pruned_at"] == 50 and written["population"] == 2
    assert set(written["aggregate"]["final_eval"]) >= {"median", "iqm"}
    assert written["train_cpu_s"] >= 0 and written["env_backend"] == "torch"  # (PPO's summary fields)
    # the pruned member's parameters (critics included) are those it left with: the solo run's after 50 steps
    _, solo_at_prune = _solo(SAC, 3, 50)
    for name, value in population.member_state(0).items():
        torch.testing.assert_close(value, solo_at_prune[name], atol=1e-5, rtol=0)
    with pytest.raises(UserError, match="not in this population of 2"):
        population.member_state(2)


def test_a_left_members_rows_round_trip_and_an_actor_only_checkpoint_is_refused_for_them():
    """A member that left keeps every row (critics and targets too) through `_state`/`_load_state`; a checkpoint that
    kept only its actor (written before rlspeed kept them all) still evaluates it, but `member_state` says in one
    sentence that the rest is not stored."""
    population = Population(TD3, "Pendulum-v1", seeds=[0, 1], **SMALL)
    population.learn(STEPS, eval_freq=50, eval_episodes=2, on_eval=lambda steps, means: [0] if 0 in means else [])
    tensors, values = population._state()
    kept = population.member_state(0)
    restored = Population(TD3, "Pendulum-v1", seeds=[0, 1], **SMALL)
    restored.remove([0])
    restored._load_state(dict(tensors), values)
    assert all(torch.equal(restored.member_state(0)[name], value) for name, value in kept.items())
    actor_only = {name: value for name, value in tensors.items()
                  if not name.startswith("left.0.") or name.startswith("left.0.actor_weights")
                  or name.startswith("left.0.actor_biases")}
    older = Population(TD3, "Pendulum-v1", seeds=[0, 1], **SMALL)
    older.remove([0])
    older._load_state(actor_only, values)
    assert math.isfinite(float(older.evaluate([5], episodes=1, members=[0])[0]))
    with pytest.raises(UserError, match="kept only its actor"):
        older.member_state(0)


def test_member_with_non_finite_parameters_is_dropped_and_reported():
    population = Population(TD3, "Pendulum-v1", seeds=[0, 1, 2], **SMALL)
    with torch.no_grad():
        population.critic_weights[1][1].fill_(float("nan"))  # member 1 diverged
    dropped = (r"member\(s\) 1 \(seed\(s\) 1\) diverged .* dropped \(the others continue\): to keep such members, "
               r"lower learning_rate, check the observations' and rewards' scales \(normalize_obs, "
               r"normalize_reward\), or clip gradients")
    with pytest.warns(UserWarning, match=dropped):
        summary = population.learn(STEPS, target_return=-1e9, eval_freq=50, eval_episodes=2, stop="all")
    assert summary["diverged"] == 1 and summary["pruned"] == 0
    entries = summary["members"]
    assert entries[1]["diverged_at"] == 50 and entries[1]["final_eval"] is None
    assert [e["steps_to_target"] for e in entries] == [50, None, 50]
    assert all("diverged_at" not in entries[k] and math.isfinite(entries[k]["final_eval"]["mean"]) for k in (0, 2))
    assert population.alive == [0, 2]
    # the others end exactly as in a population that never had member 1 (its rows cut from every stack)
    without = Population(TD3, "Pendulum-v1", seeds=[0, 2], **SMALL)
    without.learn(STEPS, target_return=-1e9, eval_freq=50, eval_episodes=2, stop="all")
    for k, j in ((0, 0), (2, 1)):
        theirs = without.member_state(j)
        for name, value in population.member_state(k).items():
            assert torch.equal(value, theirs[name]), name


def test_members_after_a_pruned_middle_member_keep_their_own_hyperparameters():
    """DQN members 0 and 2, each with its own values, train on as their solo runs after member 1 is pruned (rows of
    every stack, the schedules kept by original index)."""
    small = {"num_envs": 2, "train_freq": 4, "gradient_steps": 4, "batch_size": 32, "learning_starts": 40,
             "target_update_interval": 16, "net_arch": [32, 32], "exploration_fraction": 0.5}
    per_member = {"learning_rate": [5e-3, 1e-3, 2e-3], "gamma": [0.99, 0.9, 0.95],
                  "exploration_final_eps": [0.05, 0.2, 0.1], "tau": [1.0, 0.5, 0.8]}
    seeds, steps = [3, 7, 9], 200
    population = Population(DQN, "CartPole-v1", seeds=seeds, **small, **per_member)
    population.learn(steps, eval_freq=80, eval_episodes=2, on_eval=lambda at, means: [1] if at == 80 else None)
    assert population.alive == [0, 2]
    for k in (0, 2):
        solo = DQN("CartPole-v1", seed=seeds[k], env_backend="torch", **small,
                   **{key: values[k] for key, values in per_member.items()})
        solo.learn(steps, progress_bar=False)
        trained = population.member_state(k)
        for name, value in _state(solo).items():
            torch.testing.assert_close(trained[name], value, atol=1e-5, rtol=0)


def test_stop_each_removes_members_that_reached_the_target():
    population = Population(SAC, "Pendulum-v1", seeds=[0, 1], **SMALL)
    summary = population.learn(10 * STEPS, target_return=-1e9, eval_freq=50, eval_episodes=2, stop="each")
    assert summary["reached"] == 2 and population.alive == [] and population.num_timesteps == 50
    assert summary["aggregate"]["steps_to_target"]["median"] == 50


def test_member_overrides_set_one_member():
    population = Population(SAC, "Pendulum-v1", seeds=[0, 1], member_overrides=[{}, {"gamma": 0.9}], **SMALL)
    assert population.hyper["gamma"].tolist() == pytest.approx([0.99, 0.9])
    assert population.member_hyperparameters[1]["gamma"] == 0.9


def test_sb3_forms_a_solo_run_takes_are_taken_by_a_population():
    """SB3's train_freq=(4, "step") was refused as "cannot differ across members" (its two items taken for two
    members' values), and per-member values in a NumPy array as "not a valid float"."""
    import numpy as np

    population = Population(DQN, "CartPole-v1", seeds=[0, 1], train_freq=(4, "step"),
                            learning_rate=np.array([1e-3, 2e-3]))
    assert population.config.train_freq == 4
    assert [population.member_hyperparameters[k]["learning_rate"] for k in range(2)] == [1e-3, 2e-3]


@pytest.mark.parametrize("algo, seeds, hyper, words", [
    (SAC, [], {}, "at least one member"),
    (SAC, [1, 2, 1], {}, "more than once"),
    (SAC, [0, 1], {"learning_rate": [1e-3, 2e-3, 3e-3]}, "3 per-member values"),
    (SAC, [0, 1], {"net_arch": [[64, 64], [32, 32]]}, "net_arch"),
    (SAC, [0, 1], {"batch_size": [64, 128]}, "'batch_size' cannot differ"),
    (TD3, [0, 1], {"policy_delay": [1, 2]}, "'policy_delay' cannot differ"),
    (TD3, [0, 1], {"member_overrides": [{}, {"n_step": 3}]}, "member_overrides sets 'n_step'"),
    (TD3, [0, 1], {"member_overrides": [{}]}, "1 entries"),
    # (a list for a key that is no hyperparameter: the solo run's sentence, not "cannot differ across members")
    (SAC, [0, 1], {"norm_obs_keys": ["a", "b"]}, "'norm_obs_keys' is Stable-Baselines3's keyword; .*every float key"),
    (TD3, [0, 1], {"net_arc": [64, 64]}, "Unknown hyperparameter 'net_arc' for TD3. Did you mean net_arch"),
])
def test_bad_inputs_are_one_sentence(algo, seeds, hyper, words):
    with pytest.raises(UserError, match=words) as error:
        Population(algo, "Pendulum-v1", seeds=seeds, **hyper)
    assert "\n" not in str(error.value)


def test_normalize_obs_on_indices_is_one_sentence():
    """A population normalises float observations only (as solo runs): one-hot Discrete observations refuse
    normalize_obs in one sentence rather than normalising indices; normalize_reward alone is taken."""
    with pytest.raises(UserError, match="^normalize_obs applies to float vector observations.*Discrete "
                                        "observations.*drop normalize_obs") as error:
        Population(DQN, "FrozenLake-v1", seeds=[0, 1], normalize_obs=True)
    assert "\n" not in str(error.value)
    assert Population(DQN, "FrozenLake-v1", seeds=[0, 1], normalize_reward=True).member_statistics(0).keys() == {
        "return_rms.mean", "return_rms.var", "return_rms.count"}


def _dict_cartpole():
    """CartPole with Dict observations: two float keys (velocities scaled by 100) around an index key."""
    import gymnasium as gym
    import numpy as np

    space = gym.spaces.Dict({"position": gym.spaces.Box(-np.inf, np.inf, (2,), np.float32),
                             "side": gym.spaces.Discrete(2),
                             "velocity": gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)})
    return gym.wrappers.TransformObservation(
        gym.make("CartPole-v1"), lambda o: {"position": o[:2], "side": int(o[0] > 0), "velocity": o[2:] * 100}, space)


@pytest.mark.parametrize(("algo", "hyper"), [
    (PPO, {"num_envs": 2, "num_steps": 16, "batch_size": 32, "n_epochs": 2}),
    (DQN, {"num_envs": 2, "train_freq": 2, "gradient_steps": 2, "batch_size": 32, "learning_starts": 20,
           "net_arch": [32, 32], "target_update_interval": 16})])
def test_members_normalise_the_float_keys_of_dict_observations_as_their_solo_runs(algo, hyper):
    """A solo run normalises each float key of a Dict observation (its index keys pass through): a population refused
    normalize_obs there ("go through a multi-input encoder"). Member k now keeps the solo run's statistics, key by
    key under the solo's names (`obs_rms.<key>.mean`, ...), and trains to the solo run's parameters."""
    import gymnasium as gym

    gym.register("rlspeed_test/DictCartPole-v0", max_episode_steps=500, entry_point=_dict_cartpole)
    normalise = {"normalize_obs": True, "normalize_reward": True}
    seeds, steps = [3, 7], 64

    def state(model):  # (PPO members are named as the solo's policy names its tensors)
        return ({name: value.detach().clone() for name, value in model.policy.state_dict().items()} if algo is PPO
                else _state(model))

    try:
        population = Population(algo, "rlspeed_test/DictCartPole-v0", seeds=seeds, env_backend="gymnasium", **hyper,
                                **normalise)
        initial = [population.member_state(k) for k in range(2)]
        if algo is PPO:
            population._total_timesteps = steps
        else:
            population._start(steps)
        while population.num_timesteps < steps:
            population.train_iteration()
        for k, seed in enumerate(seeds):
            solo = algo("rlspeed_test/DictCartPole-v0", seed=seed, env_backend="gymnasium", **hyper, **normalise)
            solo_initial = state(solo)
            solo.learn(steps, progress_bar=False)
            solo_trained = {**state(solo), **{f"{name}.{key}": value for name in ("obs_rms", "return_rms")
                                              for key, value in getattr(solo, name).state_dict().items()}}
            assert "obs_rms.velocity.mean" in solo_trained and not any("side" in name for name in solo_trained)
            trained = {**population.member_state(k), **population.member_statistics(k)}
            assert_member_is_its_solo_run(initial[k], trained, solo_initial, solo_trained, rtol=1e-5)
    finally:
        gym.registry.pop("rlspeed_test/DictCartPole-v0", None)


@pytest.mark.parametrize(("env_id", "backend"), [("Taxi-v4", "gymnasium"), ("CartPole-v1", "torch")])
def test_a_populations_replay_takes_masks_exactly_when_it_keeps_them(env_id, backend):
    """As a solo run's replay buffer: a population's replay that keeps the env's action masks (Taxi's) refuses a step
    added without them, and one that keeps none refuses masks (a row without its masks would sample another's)."""
    with Population(DQN, env_id, seeds=[0, 1], env_backend=backend, learning_starts=8, batch_size=8,
                    buffer_size=64) as population:
        population._start(16)
        keeps = population.buffer.next_action_masks is not None
        assert keeps == (env_id == "Taxi-v4")
        rows = torch.zeros(2)
        with pytest.raises(ValueError, match="next_action_masks must be given exactly when the buffer was made with "
                                             "mask_size"):
            population.buffer.add(rows, rows, rows, rows, rows.bool(), rows.bool(),
                                  next_action_masks=None if keeps else torch.ones(2, 2, dtype=torch.bool))

def test_on_eval_returning_an_unknown_member_is_one_sentence():
    population = Population(SAC, "Pendulum-v1", seeds=[0, 1], **SMALL)
    with pytest.raises(UserError, match=r"member\(s\) 5, outside 0..1"):
        population.learn(STEPS, eval_freq=50, eval_episodes=2, on_eval=lambda steps, means: [5])


def test_other_algorithms_and_envs_are_refused():
    with pytest.raises(UserError, match="no native env"):
        Population(SAC, "LunarLanderContinuous-v3", seeds=[0], env_backend="torch")
    with pytest.raises(UserError, match="not RecurrentPPO"):
        Population(RecurrentPPO, "CartPole-v1", seeds=[0])


def test_on_eval_naming_members_that_reached_the_target_prunes_nothing():
    """As for PPO: on_eval sees the members that reached the target at that evaluation; with stop="each" they have
    left with the target, so naming them does not also count them as pruned."""
    population = Population(SAC, "Pendulum-v1", seeds=[0, 1], **SMALL)
    seen = []

    def prune_everyone(steps, means):
        seen.append(sorted(means))
        return list(means)

    summary = population.learn(10 * STEPS, target_return=-1e9, eval_freq=50, eval_episodes=2,
                               on_eval=prune_everyone)
    assert seen == [[0, 1]] and summary["reached"] == 2 and summary["pruned"] == 0
    assert all("pruned_at" not in member for member in summary["members"])


@pytest.mark.parametrize("algo", [SAC, TD3])
def test_no_host_to_device_copy_per_iteration_after_a_member_left(algo, monkeypatch):
    """The env rows of the members still training (and TD3's smoothing mask) are made when members leave, not from
    host lists at every iteration or gradient step (DESIGN: no per-step host<->device copies)."""
    population = Population(algo, "Pendulum-v1", seeds=[0, 1, 2], **SMALL)
    population._start(STEPS)
    while population.num_timesteps < SMALL["learning_starts"] + 4:  # (past learning_starts: updates run)
        population.train_iteration()
    population.remove([1])
    made = []
    tensor = torch.tensor
    monkeypatch.setattr(torch, "tensor", lambda *args, **kwargs: made.append(args) or tensor(*args, **kwargs))
    for _ in range(10):
        population.train_iteration()
    assert len(made) <= 1, made  # (the rows, once)


def test_a_replay_growth_interrupted_midway_leaves_the_population_trainable(monkeypatch):
    """A stop (a notebook's button) while learn grew the members' replay for a larger budget left some fields grown
    and others not: every later learn failed with an IndexError. The fields change all at once, or not at all."""
    from rlspeed import DQN
    from rlspeed.population import Population

    population = Population(DQN, "CartPole-v1", seeds=[0, 1], device="cpu", learning_starts=32, batch_size=32)
    population.learn(64, progress_bar=False)
    from rlspeed.population import offpolicy

    replay_type, calls = type(population.buffer), [0]
    real_grow, allocators = replay_type.grow, {torch: torch.zeros, offpolicy: offpolicy.storage_zeros}

    def interrupting(real):  # (host memory's allocator or the device's)
        def zeros(*args, **kwargs):
            calls[0] += 1
            if calls[0] == 2:  # (after the first field was made)
                raise KeyboardInterrupt
            return real(*args, **kwargs)
        return zeros

    def grow(self, capacity):
        for module, real in allocators.items():
            monkeypatch.setattr(module, real.__name__, interrupting(real))
        try:
            return real_grow(self, capacity)
        finally:
            for module, real in allocators.items():
                monkeypatch.setattr(module, real.__name__, real)

    monkeypatch.setattr(replay_type, "grow", grow)
    with pytest.raises(KeyboardInterrupt):
        population.learn(1000, progress_bar=False)
    monkeypatch.setattr(replay_type, "grow", real_grow)
    assert len({getattr(population.buffer, name).shape[0] for name in population.buffer.fields}) == 1
    before = population.num_timesteps
    population.learn(1000, progress_bar=False)
    assert population.num_timesteps >= before + 1000


@pytest.mark.parametrize(("options", "message"), [
    ({"learning_starts": 1000}, r"learning_starts \(1,000\) is not below the env steps this learn call stores \(256\)"),
    ({"n_step": 1000}, r"n_step \(1,000\) is above the steps each env takes in this learn call \(256\)"),
])
def test_a_population_that_cannot_update_says_so_as_a_solo_run_does(options, message):
    """A sweep's learning_starts or n_step beyond a learn call's steps trained no member and said nothing (a solo run
    warns): the same sentence, shown where learn is called."""
    population = Population(DQN, "CartPole-v1", seeds=[0, 1], device="cpu", net_arch=[8], **options)
    with pytest.warns(UserWarning, match=message) as caught:
        population.learn(256, progress_bar=False)
    assert [w.filename for w in caught if "no gradient update" in str(w.message)] == [__file__]


@pytest.mark.parametrize("block", ["no_grad", "inference_mode"])
@pytest.mark.parametrize("algo, env_id, hyper", [
    (PPO, "CartPole-v1", {"num_envs": 2, "num_steps": 16, "batch_size": 32}),
    (TD3, "Pendulum-v1", {"learning_starts": 32, "batch_size": 16}),
    (DQN, "CartPole-v1", {"learning_starts": 32, "batch_size": 16})])
def test_a_population_trains_inside_a_callers_no_grad_or_inference_mode(algo, env_id, hyper, block):
    """A population's learn inside a caller's `torch.no_grad()` failed with torch's "element 0 of tensors does not
    require grad" (TD3's and DQN's autograd updates), and inside `torch.inference_mode()` it left inference tensors
    that its next update could not change in place: it trains as outside the block, whose mode holds again after."""
    population = Population(algo, env_id, seeds=[0, 1], **hyper)
    with getattr(torch, block)():
        population.learn(128, progress_bar=False)
        assert not torch.is_grad_enabled()
        assert torch.is_inference_mode_enabled() == (block == "inference_mode")
    population.learn(64, progress_bar=False)  # (outside the block: what the first learn made trains on)
    assert torch.is_grad_enabled() and population.num_timesteps >= 192


@pytest.mark.parametrize("algo, env_id", [(TD3, "Pendulum-v1"), (SAC, "Pendulum-v1"), (DQN, "CartPole-v1")])
def test_a_population_built_inside_inference_mode_trains_outside_it(algo, env_id):
    """A population built inside a caller's `torch.inference_mode()` held inference tensors as its members'
    parameters, which its learn outside the block then failed on (torch's "element 0 of tensors does not require
    grad" or its in-place update of an inference tensor): it trains as one built outside it."""
    hyper = {"learning_starts": 32, "batch_size": 16}
    with torch.inference_mode():
        population = Population(algo, env_id, seeds=[0, 1], **hyper)
    population.learn(128, progress_bar=False)
    assert population.num_timesteps >= 128


def test_a_members_noise_restarts_where_its_solo_runs_does_when_a_wrapper_ends_learning_episodes(monkeypatch):
    """A wrapper that ends the learner's episode without ending the game (Atari's episodic life: `terminated`, with
    `info["done"]` still False) restarts no Ornstein-Uhlenbeck noise in a solo run (which restarts it at whole
    episodes' ends); a member's noise restarts where its solo run's does, and it trains as its solo run."""
    from rlspeed.envs.base import EpisodeStatistics

    step = EpisodeStatistics.step

    def lives_lost_every_fifth_step(self, actions):
        obs, reward, terminated, truncated, info = step(self, actions)
        return obs, reward, terminated | (info["episode_length"] % 5 == 0), truncated, info

    monkeypatch.setattr(EpisodeStatistics, "step", lives_lost_every_fifth_step)
    hyper = {**SMALL, "action_noise": "ornstein-uhlenbeck"}
    population = Population(TD3, "Pendulum-v1", seeds=[3], env_backend="torch", **hyper)
    population._start(STEPS)
    while population.num_timesteps < STEPS:
        population.train_iteration()
    _, solo_trained = _solo(TD3, 3, STEPS, action_noise="ornstein-uhlenbeck")
    for name, value in population.member_state(0).items():
        torch.testing.assert_close(value, solo_trained[name], atol=1e-5, rtol=0)


def _scaled_cartpole(reward_scale: float):
    import gymnasium as gym

    return gym.wrappers.TransformReward(gym.make("CartPole-v1"), lambda reward: reward * reward_scale)


@pytest.mark.parametrize(("algo", "hyper"), [
    (PPO, {"num_envs": 2, "num_steps": 16, "batch_size": 32, "n_epochs": 1}),
    (DQN, {"num_envs": 2, "learning_starts": 16, "batch_size": 16})])
def test_rewards_far_from_1_get_one_hint_for_the_whole_population(algo, hyper):
    """The solo runs' scale hint (rewards of 1e4 or more, or all below 1e-4, left unnormalised): a population trained
    on such rewards said nothing. It says so once for the population (every member shares the env and the
    normalisation settings), over two learns, and not where it normalises the rewards."""
    import warnings

    import gymnasium as gym

    gym.register("rlspeed_test/ScaledCartPole-v0", max_episode_steps=500, entry_point=_scaled_cartpole,
                 kwargs={"reward_scale": 1e5})
    try:
        for normalize_reward in (False, True):
            population = Population(algo, "rlspeed_test/ScaledCartPole-v0", seeds=[0, 1], env_backend="gymnasium",
                                    normalize_obs=False, normalize_reward=normalize_reward, **hyper)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                population.learn(64, eval_freq=32, eval_episodes=1)
                population.learn(96, eval_freq=32, eval_episodes=1)
            hints = [str(w.message) for w in caught if "first steps" in str(w.message)]
            if normalize_reward:
                assert hints == []
            else:
                assert len(hints) == 1 and "population's envs (all 2 members') have rewards up to 1e+05" in hints[0]
                assert "normalize_reward=True" in hints[0] and "observation" not in hints[0]
    finally:
        gym.registry.pop("rlspeed_test/ScaledCartPole-v0", None)


def test_an_off_policy_populations_scale_hint_comes_while_it_trains_not_at_its_first_evaluation(monkeypatch):
    """As a solo run's (its guard read once per log interval, 1 s): a DQN population gave the hint only at its first
    divergence check, an evaluation or the end, however long training ran before. Here the interval is 0 s: the hint
    comes within the first iterations, long before the evaluation at 256 steps."""
    import warnings

    import gymnasium as gym

    from rlspeed.population import base

    monkeypatch.setattr(base, "HINT_EVERY_S", 0.0)
    gym.register("rlspeed_test/ScaledCartPole-v0", max_episode_steps=500, entry_point=_scaled_cartpole,
                 kwargs={"reward_scale": 1e5})
    try:
        population = Population(DQN, "rlspeed_test/ScaledCartPole-v0", seeds=[0, 1], env_backend="gymnasium",
                                normalize_obs=False, num_envs=2, learning_starts=16, batch_size=16)
        hinted_at = []  # (the population's step count at each hint)
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            monkeypatch.setattr(warnings, "showwarning", lambda message, *args, **kwargs: hinted_at.append(
                population.num_timesteps) if "first steps" in str(message) else None)
            population.learn(256, eval_freq=256, eval_episodes=1)
        assert len(hinted_at) == 1 and hinted_at[0] < 32
    finally:
        gym.registry.pop("rlspeed_test/ScaledCartPole-v0", None)
