"""rlspeed.population: members are solo runs (initial weights, first updates), per-member hyperparameters apply,
bad inputs are one sentence, and learn's summary holds per-member results and aggregates."""

import json
import math
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import (
    assert_a_diverging_member_is_dropped,
    assert_member_is_its_solo_run,
    assert_pruned_member_matches_reruns,
    binary_vector_env_id,
    endless_pendulum_id,
    masked_vector_env_id,
    members_collection_epsilons,
    needs_atari,
    needs_envpool,
    needs_minatar,
    needs_minigrid,
    random_population_batch,
)
from gymnasium.envs.classic_control import CartPoleEnv

from rlspeed import PPO, SAC
from rlspeed.algos import ALGORITHMS
from rlspeed.envs.cartpole import CartPole
from rlspeed.errors import EnvStepError, UserError
from rlspeed.evaluation import evaluation_seed
from rlspeed.population import PER_MEMBER, Population, PPOPopulation

# small and quick: 8 envs x 16 steps, minibatches of 64 (so minibatch order is drawn), 2 epochs
SMALL = {"num_envs": 8, "num_steps": 16, "batch_size": 64, "n_epochs": 2, "learning_rate": 1e-3}


def _solo_state(seed: int, iterations: int, env_id: str = "CartPole-v1", env_backend: str = "torch",
                evaluation_seed: int | None = None, episodes: int = 2, **hyper) -> tuple[dict, dict]:
    """(initial policy state, state after `iterations` iterations with the normalisation statistics); with
    `evaluation_seed`, also the trained solo's mean return over `episodes` deterministic episodes from that seed."""
    config = {**SMALL, **hyper}
    solo = PPO(env_id, seed=seed, env_backend=env_backend, **config)
    initial = {name: value.detach().clone() for name, value in solo.policy.state_dict().items()}
    if iterations:
        solo.learn(iterations * config["num_envs"] * config["num_steps"], progress_bar=False)
    trained = {**solo.policy.state_dict(), **_solo_statistics(solo)}
    if evaluation_seed is None:
        return initial, trained
    return initial, trained, solo.evaluate(episodes=episodes, seed=evaluation_seed)["mean"]


def _solo_statistics(solo) -> dict[str, torch.Tensor]:
    """The solo run's normalisation statistics as its checkpoint names them (`obs_rms.mean`, ...)."""
    return {f"{name}.{key}": value for name in ("obs_rms", "return_rms") if getattr(solo, name, None) is not None
            for key, value in getattr(solo, name).state_dict().items()}


NORMALIZE = {"normalize_obs": True, "normalize_reward": True}
ATARI_SMALL = {"num_envs": 2, "batch_size": 32}


def test_member_encoders_run_the_nature_cnn_per_member_on_a_cpu_with_the_grouped_calls_result():
    """Nature CNNs (Atari-size images) and strided ones (28x28) run member by member in the solo's channels-last
    layout, small CNNs as one grouped call (`MemberEncoder.mode`); both ways give the same features and parameter
    gradients."""
    import gymnasium as gym
    import numpy as np

    from rlspeed.nn import CNNEncoder, to_device
    from rlspeed.population.base import MemberEncoder

    generator = torch.Generator().manual_seed(0)
    for shape, dtype, mode, kind in (((4, 84, 84), np.uint8, "per-member", "Nature CNN encoder"),
                                     ((28, 28, 3), np.uint8, "per-member", "strided CNN encoder"),
                                     ((10, 10, 4), bool, "grouped", "small CNN encoder")):
        space = gym.spaces.Box(0, 255 if dtype == np.uint8 else 1, shape, dtype=dtype)
        torch.manual_seed(0)
        encoders = [to_device(CNNEncoder(space, features_dim=32), torch.device("cpu")) for _ in range(3)]
        chosen = MemberEncoder(encoders)
        assert (chosen.mode, chosen.kind) == (mode, kind)
        other = MemberEncoder(encoders, mode="grouped" if mode == "per-member" else "per-member")
        obs = torch.randint(0, 256 if dtype == np.uint8 else 2, (3, 5, *shape), generator=generator)
        obs = obs.to(torch.uint8 if dtype == np.uint8 else torch.bool)
        results = []
        for encoder in (chosen, other):
            params = encoder.stack(encoders)
            features = encoder(params, obs)
            grads = torch.autograd.grad(features.square().sum(), params)
            results.append((features, grads))
        torch.testing.assert_close(results[0][0], results[1][0], atol=1e-5, rtol=1e-5)
        for a, b in zip(results[0][1], results[1][1]):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
        solo = encoders[1](obs[1])  # (member 1's features are its own encoder's)
        torch.testing.assert_close(results[0][0][1], solo, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("env_id, backend, hyper", [
    ("CartPole-v1", "torch", {}),
    ("Pendulum-v1", "torch", {"normalize_obs": False, "normalize_reward": False}),
    ("CartPole-v1", "gymnasium", {}),
    pytest.param("CartPole-v1", "envpool", {}, marks=needs_envpool),  # (one EnvPool pool per member)
    ("CartPole-v1", "torch", {"fused_update": False}),
    # (SB3's activations beyond tanh and relu: autograd, saying why)
    ("Pendulum-v1", "torch", {"activation": "gelu", "normalize_obs": False, "normalize_reward": False}),
    ("Pendulum-v1", "torch", {**NORMALIZE, "gamma": [0.99, 0.9]}),
    ("Pendulum-v1", "gymnasium", NORMALIZE),
    ("CartPole-v1", "torch", {"normalize_obs": True}),
    ("FrozenLake-v1", "gymnasium", {}),  # (Discrete observations, one-hot encoded)
    ("Pendulum-v1", "gymnasium-async", {}),  # (one subprocess vector env per member, all stepping at once)
    ("Taxi-v4", "gymnasium", {"use_masking": False}),
    ("Taxi-v4", "gymnasium", {}),  # (info["action_mask"]: sampling, loss and evaluations masked)
    ("masked", "gymnasium", {}),  # (masks on float vectors: the masks alone make the update autograd)
    # (bool images: each member's own CNN encoder)
    pytest.param("MinAtar/Breakout-v1", "gymnasium", {}, marks=needs_minatar),
    ("bits", "gymnasium", {}),  # (MultiBinary observations: the flatten encoder, no parameters)
    # (a Dict of a uint8 image and a Discrete direction, packed into flat rows; each member's own multi-input encoder)
    pytest.param("MiniGrid-DoorKey-5x5-v0", "gymnasium", {"cnn_features_dim": 16}, marks=needs_minigrid),
    ("Blackjack-v1", "gymnasium", {}),  # (a Tuple of Discretes: a multi-input encoder of one-hot parts, no parameters)
    # (an Atari game: the solo's preprocessing, lost lives ending the learner's episodes, clipped rewards; evaluation
    # on whole games with FIRE pressed at every start and lost life; each member's own Nature CNN, on fewer envs)
    pytest.param("BreakoutNoFrameskip-v4", "gymnasium", ATARI_SMALL, marks=needs_atari),
    # (one EnvPool pool per member, seeded as the solo run's)
    pytest.param("BreakoutNoFrameskip-v4", "envpool", ATARI_SMALL, marks=[needs_atari, needs_envpool]),
])
def test_members_start_and_update_as_solo_runs(env_id, backend, hyper):
    """Categorical and Gaussian (clipped to the Box) policies, native and Gymnasium envs alike; `fused_update=False`
    chooses autograd for the population as for the solo run; with normalisation, each member's statistics (its own
    gamma for the returns) and the data they normalise are its solo run's."""
    seeds = [3, 7]
    masked = env_id == "masked"
    env_id = masked_vector_env_id() if masked else binary_vector_env_id() if env_id == "bits" else env_id
    config = {**SMALL, **hyper}
    population = Population(PPO, env_id, seeds=seeds, env_backend=backend, **config)
    population._total_timesteps = 2 * config["num_envs"] * config["num_steps"]
    initial = [population.member_state(k) for k in range(2)]
    # Atari: the first update only. The Nature CNN has ~2M ReLUs per minibatch, and from the second update one whose
    # input is within rounding of zero in one computation and not the other (seed 3, conv 2 channel 43) can move
    # that channel's weights by 5e-5
    iterations = 1 if env_id == "BreakoutNoFrameskip-v4" else 2
    for _ in range(iterations):
        population.train_iteration()
    # (autograd where the solo run takes it: fused_update=False, an encoder (the one-hot one here) or action masks)
    expected = "autograd" if hyper.get("fused_update") is False or masked or "activation" in hyper \
        or env_id in ("FrozenLake-v1", "Taxi-v4", "MinAtar/Breakout-v1", "MiniGrid-DoorKey-5x5-v0", "Blackjack-v1",
                      "BreakoutNoFrameskip-v4", binary_vector_env_id()) else "hand-derived"
    assert population.update_path == expected
    if "activation" in hyper:
        assert population.update_reason == f"activation={hyper['activation']} (the hand-derived update covers tanh " \
                                           "and relu)"
    for k, seed in enumerate(seeds):
        own = {key: value[k] if isinstance(value, list) else value for key, value in hyper.items()}
        episodes = 1 if env_id == "BreakoutNoFrameskip-v4" else 2  # (a whole Breakout game is hundreds of steps)
        solo_initial, solo_trained, solo_eval = _solo_state(seed, iterations=iterations, env_id=env_id,
                                                            env_backend=backend, evaluation_seed=100 + k,
                                                            episodes=episodes, **own)
        trained = {**population.member_state(k), **population.member_statistics(k)}
        # (evaluated on the solo's evaluation episodes, observations normalised by the member's own statistics)
        assert population.evaluate([100 + k], episodes=episodes, members=[k]).item() == pytest.approx(solo_eval,
                                                                                                      abs=1e-3)
        assert_member_is_its_solo_run(initial[k], trained, solo_initial, solo_trained, rtol=1e-5)


class _GridObservationEnv:
    """A Gymnasium env whose observations are float (2, 3) arrays (populations flatten them for their networks)."""

    @staticmethod
    def register() -> str:
        import gymnasium as gym
        import numpy as np

        class Env(gym.Env):
            observation_space = gym.spaces.Box(-5.0, 5.0, (2, 3))
            action_space = gym.spaces.Discrete(2)

            def reset(self, *, seed=None, options=None):
                super().reset(seed=seed)
                self.t = 0
                return self.np_random.normal(1.0, 2.0, (2, 3)).astype(np.float32), {}

            def step(self, action):
                self.t += 1
                obs = self.np_random.normal(1.0, 2.0, (2, 3)).astype(np.float32)
                return obs, float(action) * 3.0, False, self.t >= 20, {}

        if "GridObservation-v0" not in gym.registry:
            gym.register("GridObservation-v0", entry_point=Env, max_episode_steps=20)
        return "GridObservation-v0"


def test_multi_dimensional_observations_are_normalised_per_member_as_the_solo_runs():
    env_id = _GridObservationEnv.register()
    population = Population(PPO, env_id, seeds=[3, 7], env_backend="gymnasium", **SMALL, **NORMALIZE)
    population._total_timesteps = 2 * SMALL["num_envs"] * SMALL["num_steps"]
    population.train_iteration()
    population.train_iteration()
    for k, seed in enumerate([3, 7]):
        _, solo_trained = _solo_state(seed, iterations=2, env_id=env_id, env_backend="gymnasium", **NORMALIZE)
        trained = {**population.member_state(k), **population.member_statistics(k)}
        assert trained["obs_rms.mean"].shape == (2, 3)
        for name, value in solo_trained.items():
            torch.testing.assert_close(trained[name], value, atol=1e-5, rtol=1e-5, msg=name)


@pytest.mark.parametrize("algo_name, env_id, hyper", [
    ("PPO", "Pendulum-v1", {**SMALL, **NORMALIZE}),
    ("SAC", "Pendulum-v1", {"learning_starts": 64, "batch_size": 32, "net_arch": [32, 32]}),
    ("DQN", "CartPole-v1", {"learning_starts": 64, "batch_size": 32, "net_arch": [32, 32], "dueling": True}),
    # (the member's own CNN encoder, channels-last in the solo model)
    pytest.param("PPO", "MinAtar/Breakout-v1", SMALL, marks=needs_minatar),
])
def test_member_model_is_a_solo_model_that_acts_as_the_member(tmp_path, algo_name, env_id, hyper):
    """`member_model(k)`: a solo model with member k's parameters (member 1 as it left when pruned) and statistics:
    its evaluation equals the population's of that member, it saves and loads as any model, and building it leaves
    torch's global generator alone."""
    import rlspeed

    algo = getattr(rlspeed, algo_name)
    population = Population(algo, env_id, seeds=[1, 2], **hyper)
    population.learn(512, eval_freq=256, eval_episodes=2, on_eval=lambda steps, means: [1] if steps == 256 else [])
    assert population.alive == [0]
    state = torch.get_rng_state()
    for k in (0, 1):
        model = population.member_model(k)
        assert isinstance(model, algo) and model.seed == [1, 2][k]
        mean = model.evaluate(episodes=3, seed=500)["mean"]
        assert mean == pytest.approx(population.evaluate([500], episodes=3, members=[k]).item(), abs=1e-3)
        loaded = algo.load(model.save(tmp_path / f"member_{k}"))
        assert loaded.evaluate(episodes=3, seed=500)["mean"] == pytest.approx(mean, abs=1e-3)
    assert torch.equal(torch.get_rng_state(), state)
    with pytest.raises(UserError, match="outside 0..1"):
        population.member_model(2)


@pytest.mark.parametrize("algo_name,env_id,hyper", [
    ("PPO", "CartPole-v1", {"num_envs": 2, "num_steps": 16, "net_arch": [16, 16]}),
    ("SAC", "Pendulum-v1", {"learning_starts": 32, "batch_size": 16, "net_arch": [16, 16]}),
])
def test_another_default_device_of_the_caller_leaves_a_cpu_population_as_without_it(tmp_path, algo_name, env_id,
                                                                                  hyper):
    """A program that made another device torch's default (`torch.set_default_device("cuda")`; "meta" stands in for
    it here) got a CPU population's batched networks built on that device (on "meta" they trained on nothing, no
    error), and its checkpoints failed writing a native env's stream position made there. Built, trained with
    checkpoints and resumed as without it."""
    import rlspeed

    algo = getattr(rlspeed, algo_name)
    expected = Population(algo, env_id, seeds=[0, 1], device="cpu", **hyper)
    expected.learn(128, run_dir=tmp_path / "expected", checkpoint_freq=64)
    with torch.device("meta"):
        population = Population(algo, env_id, seeds=[0, 1], device="cpu", **hyper)
        assert all(tensor.device.type == "cpu" for tensor in population._state()[0].values())
        population.learn(128, run_dir=tmp_path / "run", checkpoint_freq=64)
        resumed = Population(algo, env_id, seeds=[0, 1], device="cpu", **hyper)
        resumed.resume(tmp_path / "run" / "checkpoint.safetensors")
    expected_resumed = Population(algo, env_id, seeds=[0, 1], device="cpu", **hyper)
    expected_resumed.resume(tmp_path / "expected" / "checkpoint.safetensors")
    for got, want in ((population, expected), (resumed, expected_resumed)):
        assert got.num_timesteps == want.num_timesteps
        for key, tensor in want._state()[0].items():
            assert torch.equal(got._state()[0][key], tensor), key


def test_native_row_blocks_reproduce_separate_envs():
    together = CartPole(num_envs=6)
    together.seed_row_blocks([4, 9])
    first, second = CartPole(num_envs=3, seed=4), CartPole(num_envs=3, seed=9)
    obs, _ = together.reset()
    assert torch.equal(obs, torch.cat((first.reset()[0], second.reset()[0])))
    for _ in range(50):
        actions = torch.randint(0, 2, (6,))
        step = together.step(actions)
        parts = first.step(actions[:3]), second.step(actions[3:])
        assert torch.equal(step[0], torch.cat((parts[0][0], parts[1][0])))
    with pytest.raises(ValueError):
        together.seed_row_blocks([1, 2, 3, 4])


def test_every_per_member_hyperparameter_reaches_its_member():
    """Member k with its own value of every per-member hyperparameter equals the solo run with those values."""
    per_member = {"learning_rate": [1e-3, 3e-3, 5e-4], "gamma": [0.99, 0.9, 0.95], "gae_lambda": [0.95, 0.8, 0.9],
                  "ent_coef": [0.0, 0.01, 0.05], "vf_coef": [0.5, 1.0, 0.25], "clip_range": [0.2, 0.1, 0.3],
                  "max_grad_norm": [0.5, 0.1, 2.0]}
    assert set(per_member) == set(PER_MEMBER)
    seeds = [3, 7, 11]
    population = Population(PPO, "CartPole-v1", seeds=seeds, **{**SMALL, **per_member})
    population._total_timesteps = 2 * SMALL["num_envs"] * SMALL["num_steps"]
    population.train_iteration()
    population.train_iteration()
    for k, seed in enumerate(seeds):
        _, solo_trained = _solo_state(seed, iterations=2, **{key: values[k] for key, values in per_member.items()})
        trained = population.member_state(k)
        for name, value in solo_trained.items():
            torch.testing.assert_close(trained[name], value, atol=1e-5, rtol=0)


def test_stable_baselines3s_name_of_a_hyperparameter_follows_the_per_member_rule_of_ours():
    """Population(PPO, ..., n_steps=[...]) (SB3's name of num_steps) is refused as num_steps=[...] is, naming the
    per-member rule, not as a list that is no valid int."""
    with pytest.raises(UserError, match=r"'num_steps' cannot differ across members"):
        Population(PPO, "CartPole-v1", seeds=[0, 1], n_steps=[64, 128])
    # (SB3's HerReplayBuffer is her=True, as for the solo model: refused by the population's rule, not passed to
    # the members' models, which the population's loop does not consult for HER)
    with pytest.raises(UserError, match="Populations do not support Hindsight Experience Replay"):
        Population(SAC, "Pendulum-v1", seeds=[0, 1], replay_buffer_class="HerReplayBuffer")


def test_per_member_learning_rate_applies():
    # (the config refuses learning_rate=0): Adam moves a weight by about the learning rate per step, 4 steps here
    population = Population(PPO, "CartPole-v1", seeds=[0, 1, 2], **{**SMALL, "learning_rate": [1e-3, 1e-7, 1e-3]})
    population._total_timesteps = SMALL["num_envs"] * SMALL["num_steps"]
    before = [population.member_state(k) for k in range(3)]
    population.train_iteration()
    after = [population.member_state(k) for k in range(3)]
    moved = [max((after[k][name] - before[k][name]).abs().max().item() for name in before[k]) for k in range(3)]
    assert moved[1] < 1e-6 and moved[0] > 1e-3 and moved[2] > 1e-3


@pytest.mark.parametrize("algo", ["ppo", "a2c"])
def test_a_further_learn_call_starts_the_schedules_afresh_as_a_solo_runs_does(algo, monkeypatch):
    """The second learn() of a PPO or A2C population went on with the first call's schedule (progress 0.5, 0.375,
    ...) while a solo run's starts again at 1, as population.md says the members' do."""
    population = Population(ALGORITHMS[algo], "CartPole-v1", seeds=[0, 1], anneal_lr=True,
                            **({**SMALL, "n_epochs": 1} if algo == "ppo" else {"num_envs": 4, "num_steps": 8}))
    seen = []
    own = population._progress_remaining
    monkeypatch.setattr(population, "_progress_remaining", lambda: seen.append(own()) or seen[-1])
    steps = 4 * population.config.num_envs * population.config.num_steps
    for _ in range(2):
        population.learn(steps, progress_bar=False)
    assert seen[0] == seen[len(seen) // 2] == 1.0 and seen[1] < 1.0


def test_reset_num_timesteps_false_runs_a_populations_schedules_over_the_whole_step_count(monkeypatch):
    """SB3's way to continue, `learn(N, reset_num_timesteps=False)`, which a model's learn takes, was refused by a
    population's learn: it is taken, and the members' schedules (PPO's annealing, DQN's exploration) then span the
    whole step count from 0, as a solo model's do."""
    population = Population(PPO, "CartPole-v1", seeds=[0, 1], anneal_lr=True, **{**SMALL, "n_epochs": 1})
    seen = []
    own = population._progress_remaining
    monkeypatch.setattr(population, "_progress_remaining", lambda: seen.append(own()) or seen[-1])
    steps = population.config.num_envs * population.config.num_steps  # (one iteration a call)
    population.learn(steps, progress_bar=False)
    seen.clear()
    population.learn(steps, progress_bar=False, reset_num_timesteps=False)
    assert seen[0] == pytest.approx(0.5)  # (1 - steps / (2 * steps)), where each call starts at 1 by default
    dqn = Population(ALGORITHMS["dqn"], "CartPole-v1", seeds=[0, 1], num_envs=4, learning_starts=8, batch_size=8,
                     exploration_fraction=0.5, exploration_initial_eps=1.0, exploration_final_eps=0.0)
    dqn.learn(16, progress_bar=False)
    dqn.learn(16, progress_bar=False, reset_num_timesteps=False)
    # (at step 16, half of 32 steps, the exploration has ended, as a solo's: epsilon is the final 0 at every step)
    assert members_collection_epsilons(dqn, 16, monkeypatch) == [[0.0] * dqn.config.train_freq] * 2


def test_learn_of_zero_steps_trains_and_evaluates_nothing_as_a_models(monkeypatch, tmp_path):
    """`learn(0)` (a loop's call whose budget is spent), which a model's learn takes since SB3 does, was refused by a
    population's ('total_timesteps must be positive'): nothing trains or is evaluated, the step count and the run
    directory stay, and its summary has no final evaluation; a negative budget is still refused, and a run_dir
    holding another run's metrics.csv too, as a model's learn(0) refuses it (it returned)."""
    population = Population(PPO, "CartPole-v1", seeds=[0, 1], **{**SMALL, "n_epochs": 1})
    steps = SMALL["num_envs"] * SMALL["num_steps"]
    population.learn(steps, progress_bar=False)
    parameters = [p.clone() for p in population.params]
    monkeypatch.setattr(population, "evaluate", lambda *args: pytest.fail("learn(0) evaluated"))
    summary = population.learn(0, target_return=500, run_dir=tmp_path / "run", progress_bar=False,
                               reset_num_timesteps=False)
    assert population.num_timesteps == steps and not (tmp_path / "run").exists()
    assert all(torch.equal(p, q) for p, q in zip(parameters, population.params))
    assert [member["final_eval"] for member in summary["members"]] == [None, None]
    with pytest.raises(UserError, match="total_timesteps must be 0 or more, got -8"):
        population.learn(-8)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "metrics.csv").write_text("timesteps,train_wall_s\n64,0.5\n")  # (another run's row)
    with pytest.raises(UserError, match=r"^'.*other' holds the metrics.csv of another run, which this population "
                                        r"\(trained in another run\) would replace: give another run_dir"):
        population.learn(0, run_dir=tmp_path / "other", progress_bar=False)


def test_values_a_population_refuses_are_read_as_the_solo_model_reads_them():
    """use_sde='no' and target_kl='none' (a YAML file's or a caller's strings) were refused as gSDE and target_kl by
    their truth value, where the solo model reads them as False and None: a population takes them as its members do;
    so is save_replay_buffer='no' (refused as True, by the keyword and the attribute, by a population without a
    replay buffer)."""
    population = Population(PPO, "CartPole-v1", seeds=[0, 1], use_sde="no", target_kl="none",
                            save_replay_buffer="no", **SMALL)
    assert population.config.use_sde is False and population.config.target_kl is None
    population.save_replay_buffer = "off"
    assert population.save_replay_buffer is False
    with pytest.raises(UserError, match="applies to populations with a replay buffer"):
        population.save_replay_buffer = "yes"
    with pytest.raises(UserError, match="do not support gSDE"):
        Population(PPO, "CartPole-v1", seeds=[0, 1], use_sde="yes", **SMALL)
    # per member, and in member_overrides, likewise (both were refused, as the features or as no per-member value)
    population = Population(PPO, "CartPole-v1", seeds=[0, 1], target_kl=["none", "none"], use_sde=["no", "off"],
                            member_overrides=[{"use_sde": "no"}, {"target_kl": "none", "gamma": 0.9}], **SMALL)
    assert population.config.use_sde is False and population.config.target_kl is None
    assert population.hyper["gamma"].tolist() == pytest.approx([0.99, 0.9])
    with pytest.raises(UserError, match="do not support gSDE"):
        Population(PPO, "CartPole-v1", seeds=[0, 1], member_overrides=[{}, {"use_sde": "yes"}], **SMALL)
    with pytest.raises(UserError, match="do not support target_kl"):
        Population(PPO, "CartPole-v1", seeds=[0, 1], target_kl=["none", 0.01], **SMALL)


def test_member_overrides_set_one_member():
    population = Population(PPO, "CartPole-v1", seeds=[0, 1], member_overrides=[{}, {"gamma": 0.9}], **SMALL)
    assert population.hyper["gamma"].tolist() == pytest.approx([0.99, 0.9])


@pytest.mark.parametrize("seeds, hyper, words", [
    ([], {}, "at least one member"),
    ([1, 2, 1], {}, "more than once"),
    (3, {}, r"a list or range of ints \(e.g. seeds=range\(4\)"),  # (a count, not the seeds)
    ([0, -1], {}, "A seed is a whole number"),
    ([0, 1], {"learning_rate": [1e-3, 2e-3, 3e-3]}, "3 per-member values"),
    ([0, 1], {"net_arch": [[64, 64], [32, 32]]}, "net_arch"),
    ([0, 1], {"num_envs": [8, 16]}, "cannot differ"),
    ([0, 1], {"member_overrides": [{}]}, "member_overrides has 1"),
    ([0, 1], {"member_overrides": [{}, {"net_arch": (32,)}]}, "'net_arch', which is no per-member hyperparameter"),
    ([0, 1], {"member_overrides": [{}, {"foo": 1}]}, "'foo', which is no per-member hyperparameter"),
    ([0, 1], {"numerics_guard": [True, False]}, "'numerics_guard' cannot differ"),  # (not a config field: was taken)
    ([0, 1], {"accelerate": "auto"}, "do not support accelerate"),  # (the solos took it, the population did not)
    ([0, 1], {"nan_policy": "mask"}, "do not support nan_policy"),
    ([0, 1], {"member_overrides": [["gamma", 0.9], {}]}, "member_overrides is a list of 2 dicts"),
    ([0, 1], {"seed": 0}, "take their seeds from seeds="),
])
def test_bad_inputs_are_one_sentence(seeds, hyper, words):
    with pytest.raises(UserError, match=words):
        Population(PPO, "CartPole-v1", seeds=seeds, **{**SMALL, **hyper})
    with pytest.raises(UserError, match=r"takes the algorithm's class \(rlspeed.PPO\), not 'PPO'"):
        Population("PPO", "CartPole-v1", seeds=[0, 1])


def test_a_population_of_shared_seeds_is_refused_a_run_dir(tmp_path):
    """`shared_seeds()` lets members repeat a seed (tune's), but such a population wrote metrics.csv columns and files
    named by seed, two members into one: learn(run_dir=...) is one sentence, and nothing is written."""
    from rlspeed.population.base import shared_seeds

    with shared_seeds():
        population = Population(PPO, "CartPole-v1", seeds=[3, 3], **SMALL)
    with pytest.raises(UserError, match=r"seeds repeat \(3, 3\) learns without a run_dir"):
        population.learn(128, run_dir=tmp_path / "run", eval_freq=128, eval_episodes=2)
    assert not (tmp_path / "run").exists()


def test_more_evaluation_episodes_than_their_results_fit_are_refused_up_front():
    """`population.evaluate(episodes=2**62)` failed with torch's RuntimeError ("cannot be represented as a SymInt")
    and learn's eval_episodes only at the first evaluation: one sentence each, counting every member's episodes."""
    population = Population(PPO, "CartPole-v1", seeds=[0, 1], **SMALL)
    fits = r"episodes of each of 2 members at once \(eval_episodes=N; --eval-episodes N"
    with pytest.raises(UserError, match=rf"^An evaluation of 4,611,686,018,427,387,904 episodes of each of 2 .*{fits}"):
        population.learn(64, eval_episodes=2**62, progress_bar=False)
    with pytest.raises(UserError, match=r"episodes of each of 2 members at once \(episodes=N"):
        population.evaluate(episodes=2**62)
    assert population.num_timesteps == 0


def test_an_evaluation_plan_is_checked_against_memory_once(monkeypatch):
    """Every evaluation of a population read the host's free memory again (~0.4 ms) to check what its results keep,
    fixed by the episodes and the members evaluated: checked where those change, and refused as before."""
    from rlspeed.population import base

    checked = []
    monkeypatch.setattr(base, "refuse_unless_results_fit", lambda *plan: checked.append(plan))
    population = Population(PPO, "CartPole-v1", seeds=[0, 1], **SMALL)
    for episodes in (2, 2, 3, 3):
        population.evaluate(episodes=episodes)
    population.evaluate(episodes=3, members=[1])
    assert checked == [(2, 2), (3, 2), (3, 1)]


def test_save_replay_buffer_is_refused_for_a_population_without_a_replay_buffer_as_keyword_and_attribute():
    """A PPO population refused the keyword save_replay_buffer=True but took `population.save_replay_buffer = True`
    later as a plain attribute, which no checkpoint read (a solo PPO's attribute refuses it): one rule for both, and
    an off-policy population's attribute still sets what its checkpoints write."""
    from rlspeed import DQN

    no_replay = r"^save_replay_buffer applies to populations with a replay buffer \(DQN, SAC, TD3, DDPG\); this one"
    with pytest.raises(UserError, match=no_replay):
        Population(PPO, "CartPole-v1", seeds=[0, 1], save_replay_buffer=True, **SMALL)
    population = Population(PPO, "CartPole-v1", seeds=[0, 1], **SMALL)
    with pytest.raises(UserError, match=no_replay):
        population.save_replay_buffer = True
    population.save_replay_buffer = False
    assert population.save_replay_buffer is False
    dqn = Population(DQN, "CartPole-v1", seeds=[0, 1], buffer_size=64, learning_starts=16)
    assert dqn.save_replay_buffer is False
    dqn.save_replay_buffer = True
    assert dqn.save_replay_buffer is True


@pytest.mark.parametrize("options, words", [
    ({"total_timesteps": 40.5}, "total_timesteps is a whole number"),  # (trained 64 steps per member)
    ({"total_timesteps": float("nan")}, "total_timesteps is a whole number"),
    ({"total_timesteps": "100"}, "total_timesteps is a whole number"),
    ({"total_timesteps": 64, "eval_freq": 1.5}, "eval_freq must be a whole number"),  # (evaluated every iteration)
    ({"total_timesteps": 64, "eval_episodes": 0}, "eval_episodes must be a whole number"),
    ({"total_timesteps": 64, "target_return": float("nan")}, "target_return must be a finite number"),
    ({"total_timesteps": 64, "confirm_target": "no"}, r"learn\(confirm_target=...\) is True or False, got 'no'"),
])
def test_learn_checks_its_values_as_a_solo_learn_does(options, words):
    population = Population(PPO, "CartPole-v1", seeds=[0, 1], **SMALL)
    with pytest.raises(UserError, match=words):
        population.learn(progress_bar=False, **options)
    assert population.num_timesteps == 0


def test_learn_shows_a_progress_bar_over_each_members_steps(monkeypatch):
    from rlspeed.population import base

    bars = []

    class Recording(base.ProgressBar):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.enabled = kwargs["enabled"]
            bars.append(self)

    monkeypatch.setattr(base, "ProgressBar", Recording)
    population = Population(PPO, "CartPole-v1", seeds=[3, 4], **SMALL)
    population.learn(3 * SMALL["num_envs"] * SMALL["num_steps"])
    assert bars[0].enabled and bars[0].bar.n == bars[0].bar.total == population.num_timesteps
    population.learn(SMALL["num_envs"] * SMALL["num_steps"], progress_bar=False)
    assert not bars[1].enabled


def test_a_population_takes_verbose_as_a_solo_model_does(monkeypatch, capsys):
    """Population(PPO, ..., verbose=0) went to the members' solo models and did nothing: learn still showed its bar,
    verbose=2 printed no rows, member_model(k) had verbose 1. The population's verbose decides what learn prints as a
    solo model's does (0 nothing, 1 the bar, 2 the bar and each metrics row); learn(verbose=...) says where it goes."""
    from rlspeed.population import base

    enabled = []

    class Recording(base.ProgressBar):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            enabled.append(kwargs["enabled"])

    monkeypatch.setattr(base, "ProgressBar", Recording)
    steps = SMALL["num_envs"] * SMALL["num_steps"]
    population = Population(PPO, "CartPole-v1", seeds=[3, 4], verbose=0, **SMALL)
    population.learn(steps)
    assert enabled == [False] and population.member_model(1).verbose == 0
    population.verbose = 2
    population.learn(steps, eval_freq=steps, eval_episodes=1)
    assert enabled == [False, True]
    rows = [line for line in capsys.readouterr().err.splitlines() if line.startswith("ppo x2 ")]
    assert len(rows) == 1 and rows[0].startswith(f"ppo x2 timesteps={2 * steps} ") and "eval_mean/seed_4=" in rows[0]
    population.learn(steps, eval_freq=steps, eval_episodes=1, progress_bar=False)  # (silences the call, rows too)
    assert not [line for line in capsys.readouterr().err.splitlines() if line.startswith("ppo x2 ")]
    with pytest.raises(UserError, match=r"^A population's learn takes no verbose: give it when the population is "
                                        r"made \(Population\(PPO, env_id, seeds, verbose=0\)"):
        population.learn(steps, verbose=1)
    with pytest.raises(UserError, match=r"^verbose is 0 \(learn prints nothing\), 1 .*not 'x'"):
        Population(PPO, "CartPole-v1", seeds=[3, 4], verbose="x", **SMALL)


def test_a_population_shows_as_a_solo_model_does():
    """A notebook showed a population as `<rlspeed.population.ppo.PPOPopulation at 0x7f...>` where a solo model shows
    its env, envs, device and steps: now it shows those, its members' seeds (a long list shortened) and, once some
    have left, how many still train."""
    population = Population(PPO, "CartPole-v1", seeds=[3, 4], **SMALL)
    assert repr(population) == (f"PPOPopulation('CartPole-v1', members=2, seeds=[3, 4], num_envs={SMALL['num_envs']}, "
                                "device='cpu', num_timesteps=0)")
    population.remove([0])
    assert "members=2, seeds=[3, 4], training=1," in repr(population)
    assert "members=12, seeds=[0, 1, 2, ..., 11], num_envs" in repr(Population(PPO, "CartPole-v1", seeds=range(12),
                                                                               **SMALL))


def test_evaluate_seeds_each_member_from_its_own_seed_by_default():
    from rlspeed.evaluation import evaluation_seed

    population = Population(PPO, "CartPole-v1", seeds=[3, 4], **SMALL)
    finals = [evaluation_seed(seed, "final", 0) for seed in (3, 4)]  # (as a solo run's final evaluation)
    assert torch.equal(population.evaluate(episodes=2), population.evaluate(finals, episodes=2))
    with pytest.raises(UserError, match="one seed per member evaluated: 2 members, 1 seeds"):
        population.evaluate([5], episodes=2)


@pytest.mark.parametrize("algo, env_id", [(PPO, "CartPole-v1"), (SAC, "Pendulum-v1")], ids=["PPO", "SAC"])
@pytest.mark.parametrize("backend", ["torch", "gymnasium"])
def test_an_evaluation_of_more_episodes_than_the_cap_runs_in_waves_of_the_same_episodes(algo, env_id, backend,
                                                                                        monkeypatch):
    """population.evaluate made one env of members x episodes rows whatever their count (10**7 episodes of 2 members
    did not finish in 200 s). It runs in waves of at most `evaluation_env_cap` rows now, as rlspeed.evaluate does,
    each member's episodes seeded as in one env of them all: the same means."""
    from rlspeed import evaluation

    settings = SMALL if algo is PPO else {"learning_starts": 10}
    population = Population(algo, env_id, seeds=[0, 1], device="cpu", env_backend=backend, **settings)
    whole = population.evaluate(episodes=5)
    made, make = [], population._make_env
    monkeypatch.setattr(population, "_make_env", lambda rows, seeds, *args, **kwargs: (
        made.append(rows * len(seeds)), make(rows, seeds, *args, **kwargs))[1])
    monkeypatch.setattr(evaluation, "NATIVE_EVALUATION_ENVS" if backend == "torch" else "GYMNASIUM_EVALUATION_ENVS", 4)
    # (the same episodes; SAC's batched actor may round in float32's last bit by the rows it acts on)
    torch.testing.assert_close(population.evaluate(episodes=5), whole, rtol=1e-9, atol=0)
    assert made == [4, 4, 2]


def test_other_algorithms_and_envs_are_refused():
    from rlspeed import RecurrentPPO  # (DQN, SAC, TD3 and DDPG have populations: rlspeed.population.offpolicy)

    # (rlspeed's own RecurrentPPO is no user's subclass of PPO with overrides of its own)
    with pytest.raises(UserError, match=r"^Populations cover A2C, DDPG, DQN, PPO, SAC, TD3 so far, not RecurrentPPO"):
        Population(RecurrentPPO, "CartPole-v1", seeds=[0])
    with pytest.raises(UserError, match="normalize_obs applies to float vector observations"):
        Population(PPO, "FrozenLake-v1", seeds=[0], normalize_obs=True)
    with pytest.raises(UserError, match="no native env"):
        Population(PPO, "LunarLander-v3", seeds=[0], env_backend="torch")
    import gymnasium as gym

    with pytest.raises(UserError, match="takes an env id.*not a CartPoleVectorEnv"):
        Population(PPO, gym.make_vec("CartPole-v1", num_envs=2), seeds=[0])
    with pytest.raises(UserError, match="env_backend 'torch' .* not 'bogus'"):
        Population(PPO, "CartPole-v1", seeds=[0], env_backend="bogus")


def test_an_env_of_ones_own_is_refused_saying_what_gives_a_population_on_it():
    """A batched env of the user's own (docs/envs.md's), its class or a function making one has no id a population
    makes K members' envs from: the refusal says so and what to do (a Gymnasium id, or one run per seed)."""
    for env, what in [(CartPole(num_envs=2), "a CartPole"), (CartPole, "the class CartPole"),
                      (lambda: CartPole(num_envs=2), "the function <lambda>")]:
        with pytest.raises(UserError, match=rf"takes an env id .*not {what}: an env of your own .*gymnasium.register"
                                            r".* or train each seed as its own run\.$"):
            Population(PPO, env, seeds=[0])
    # (the population classes themselves, which Population() calls: a TypeError from inside them before)
    with pytest.raises(UserError, match=r"takes an env id .*not a CartPole: an env of your own"):
        PPOPopulation(PPO, CartPole(num_envs=2), seeds=[0])


@pytest.mark.parametrize("space", [gym.spaces.MultiDiscrete([2, 3]), gym.spaces.MultiBinary(2)])
def test_multi_discrete_and_multi_binary_actions_are_refused_naming_the_space(space):
    """The refusal names the env's action space, which the user knows (it said "needs a multi_categorical policy",
    rlspeed's internal name for it)."""
    name = type(space).__name__
    env_id = f"CartPoleWith{name}Actions-v0"
    if env_id not in gym.registry:
        gym.register(env_id, max_episode_steps=50, entry_point=lambda: gym.wrappers.TransformAction(
            gym.make("CartPole-v1").unwrapped, lambda action: int(action[0]), space))
    with pytest.raises(UserError, match=rf"^Populations cover policies with Discrete or Box actions so far; {env_id} "
                                        rf"has {name} actions: train them with solo runs, one seed each\.$"):
        Population(PPO, env_id, seeds=[0, 1], device="cpu", **SMALL)


@needs_atari
@pytest.mark.parametrize("backend", ["gymnasium", pytest.param("envpool", marks=needs_envpool)])
def test_atari_members_step_their_solo_runs_training_envs(backend):
    """An Atari population's training env is its members' solo training envs, block by block: the same frames, a
    lost life ending the learner's episode while the game goes on, clipped rewards; also after a member leaves just
    before the kept member loses a life (the kept games' lives are carried over), up to a game the kept member
    finishes after it (its last life lost: the game starts anew)."""
    from rlspeed.envs import make_env

    env_id, seeds, envs = "BreakoutNoFrameskip-v4", [3, 7], 2

    def solo_envs(seeds=seeds):
        return [make_env(env_id, num_envs=envs, seed=seed, backend=backend, device="cpu") for seed in seeds]

    def actions(generator):  # (the same draws whoever is left)
        return torch.randint(0, 4, (len(seeds) * envs,), generator=generator)

    # where member 1's solo envs lose a life from step 100 on: the population is cut down to it just before that
    # step, and compared up to the next lost life after it and the first game it finishes after it
    (solo,), generator = solo_envs(seeds[1:]), torch.Generator().manual_seed(0)
    solo.reset()
    losses, finished = [], None
    for step in range(600):
        _, _, terminated, _, info = solo.step(actions(generator)[envs:])
        if step >= 100 and bool((terminated & ~info["done"]).any()):
            losses.append(step)
        if losses and finished is None and bool(info["done"].any()):
            finished = step
        if len(losses) >= 2 and finished is not None:
            break
    assert len(losses) >= 2 and finished is not None, f"member 1's lost lives from step 100 on: {losses}"
    cut, steps = losses[0], max(losses[1], finished) + 1
    population = Population(PPO, env_id, seeds=seeds, num_envs=envs, num_steps=16, batch_size=32, n_epochs=1,
                            env_backend=backend)
    assert population.env_backend == backend
    env = population._make_env(envs, seeds)
    obs, _ = population._reset(env, envs, seeds)
    solos, generator = solo_envs(), torch.Generator().manual_seed(0)
    assert torch.equal(obs, torch.cat([solo.reset()[0] for solo in solos]))
    lost, ended = [0, 0], [0, 0]
    for step in range(steps):
        if step == cut:  # member 0 leaves
            population._env, population._obs = env, obs
            population._keep_members([1])
            env, solos = population._env, solos[1:]
        drawn = actions(generator)[-len(solos) * envs:]
        obs, *got, info = env.step(drawn)
        expected = [solo.step(part) for solo, part in zip(solos, drawn.split(envs))]
        assert torch.equal(obs, torch.cat([e[0] for e in expected])), f"observations at step {step}"
        for i, name in enumerate(("reward", "terminated", "truncated")):
            assert torch.equal(got[i], torch.cat([e[i + 1] for e in expected])), f"{name} at step {step}"
        lost[step >= cut] += int((got[1] & ~info["done"]).sum())
        ended[step >= cut] += int(info["done"].sum())
    env.close()
    # (the episodic-life path was compared, after the cut on two lost lives and a finished game)
    assert lost[0] > 0 and lost[1] >= 2, f"lives lost before and after the cut: {lost}"
    assert ended[1] > 0, f"games finished before and after the cut: {ended}"


def test_learn_summary(tmp_path):
    population = Population(PPO, "CartPole-v1", seeds=[0, 1], **SMALL)
    with pytest.raises(UserError, match="stop"):
        population.learn(256, stop="some")
    # a target every member reaches at the first evaluation: each stops and freezes
    seen = []

    def prune_everyone(steps, means):  # members that reached the target at this evaluation are not pruned
        seen.append(sorted(means))
        return list(means)

    summary = population.learn(1024, target_return=1.0, eval_freq=128, eval_episodes=2, on_eval=prune_everyone)
    assert seen == [[0, 1]] and summary["pruned"] == 0
    assert summary["reached"] == 2 and population.num_timesteps == 128
    assert [m["steps_to_target"] for m in summary["members"]] == [128, 128]
    assert population.alive == []  # (both left the computation)
    assert [len(m["curve"]) for m in summary["members"]] == [1, 1]
    assert set(summary["aggregate"]["final_eval"]) == {"runs", "median", "median_ci", "iqm", "iqm_ci"}
    assert summary["members"][0]["hyperparameters"]["learning_rate"] == SMALL["learning_rate"]  # (not float32's)
    assert summary["train_cpu_s"] >= 0 and summary["algo"] == "ppo"
    path = population.write_summary(tmp_path / "summary.json")
    assert json.loads(path.read_text())["members"][1]["seed"] == 1
    # members of neighbouring seeds evaluate on episodes of their own (seed + an offset + i shared all but one)
    evaluated = [range(m["final_eval"]["seed"], m["final_eval"]["seed"] + 2) for m in summary["members"]]
    assert not set(evaluated[0]) & set(evaluated[1]), evaluated


@pytest.mark.parametrize("env_id, backend, hyper", [
    ("CartPole-v1", "torch", {}),
    ("CartPole-v1", "gymnasium", {}),
    ("Pendulum-v1", "torch", {"normalize_obs": False, "normalize_reward": False}),  # (log_std rows too)
    ("Pendulum-v1", "torch", NORMALIZE),  # (the statistics' rows, the running returns' env rows)
    ("Pendulum-v1", "gymnasium", NORMALIZE),
    ("Taxi-v4", "gymnasium", {}),  # (the kept rows' action masks)
    # (the kept rows of the members' CNN encoders)
    pytest.param("MinAtar/Breakout-v1", "gymnasium", {}, marks=needs_minatar),
])
def test_on_eval_prunes_members_out_of_the_computation(env_id, backend, hyper):
    calls = []

    def on_eval(steps, means):
        calls.append((steps, sorted(means)))
        assert all(isinstance(mean, float) for mean in means.values())
        return [1] if steps == 128 else None

    population = Population(PPO, env_id, seeds=[0, 1, 2], env_backend=backend, **SMALL, **hyper)
    summary = population.learn(384, eval_freq=128, eval_episodes=2, on_eval=on_eval)
    assert summary["env_backend"] == backend
    assert calls == [(128, [0, 1, 2]), (256, [0, 2]), (384, [0, 2])]
    members = summary["members"]
    assert members[1]["pruned_at"] == 128 and "pruned_at" not in members[0] and summary["pruned"] == 1
    assert [steps for steps, _ in members[0]["curve"]] == [128, 256, 384]
    assert [steps for steps, _ in members[1]["curve"]] == [128]
    assert population.alive == [0, 2] and population.weights[0].shape[0] == 2
    assert_pruned_member_matches_reruns(population, PPO, env_id, 384, 128, env_backend=backend, **SMALL, **hyper)
    # (its final evaluation is seeded as its solo run stopped at 128 steps would be, the others' at 384)
    assert [member["final_eval"]["seed"] for member in members] == [
        evaluation_seed(0, "final", 384), evaluation_seed(1, "final", 128), evaluation_seed(2, "final", 384)]


def test_a_member_that_stops_at_its_target_is_finally_evaluated_on_its_solo_runs_seed(monkeypatch):
    """With stop="each" a member that reached its target at step S is finally evaluated on
    `evaluation_seed(seed, "final", S)`, as its solo run, which stops there, is; it took the population's last count."""
    population = Population(PPO, "CartPole-v1", seeds=[0, 1], **SMALL)
    evaluate = population.evaluate

    def during_learn(seeds, episodes, members):  # (member 0 reaches the target at the first evaluation, 128 steps)
        return torch.tensor([100.0 if k == 0 else 0.0 for k in members], dtype=torch.float64)

    monkeypatch.setattr(population, "_evaluate_during_learn", during_learn)
    summary = population.learn(256, eval_freq=128, eval_episodes=2, target_return=50, stop="each")
    assert [member["steps_to_target"] for member in summary["members"]] == [128, None]
    seeds = [member["final_eval"]["seed"] for member in summary["members"]]
    assert seeds == [evaluation_seed(0, "final", 128), evaluation_seed(1, "final", 256)]
    assert summary["members"][0]["final_eval"]["mean"] == evaluate([seeds[0]], 2, [0]).item()


def test_on_eval_naming_no_member_is_one_sentence():
    population = Population(PPO, "CartPole-v1", seeds=[0, 1], **SMALL)
    with pytest.raises(UserError, match=r"member\(s\) 5, outside 0..1"):
        population.learn(256, eval_freq=128, eval_episodes=2, on_eval=lambda steps, means: [5])
    with pytest.raises(UserError, match="list of indices"):  # (a bare index was a TypeError traceback)
        population.learn(256, eval_freq=128, eval_episodes=2, on_eval=lambda steps, means: 1)


def test_diverging_member_is_dropped_and_the_others_are_untouched():
    assert_a_diverging_member_is_dropped(PPO, SMALL, learning_rate=1e-3, steps=384, eval_freq=128)


@pytest.mark.parametrize("env_id, hyper", [
    ("CartPole-v1", {"ent_coef": [0.0, 0.01], "vf_coef": [0.5, 1.0], "clip_range": [0.2, 0.1]}),
    ("CartPole-v1", {"clip_range_vf": 0.1, "ent_coef": 0.01}),
    ("Pendulum-v1", {"normalize_obs": False, "normalize_reward": False, "ent_coef": [0.0, 0.01]}),
])
def test_hand_derived_gradient_equals_autograd(env_id, hyper):
    """The hand-derived update's gradient is autograd's of the members' PPO loss, per-member coefficients included,
    on a minibatch where the ratio has moved (some rows clipped)."""
    population = Population(PPO, env_id, seeds=[0, 1], **{**SMALL, **hyper})
    assert population.update_path == "hand-derived"
    generator = torch.Generator().manual_seed(0)
    size, batch = 2, 64
    obs, out, values, actions = random_population_batch(population, batch, generator)
    with torch.no_grad():
        log_probs = population._log_prob_entropy(out, actions)[0]
    minibatch = (obs, actions, log_probs + 0.3 * torch.randn(size, batch, generator=generator),
                 values + torch.randn(size, batch, generator=generator), torch.randn(size, batch, generator=generator),
                 values + torch.randn(size, batch, generator=generator), population.hyper["clip_range"])
    reference = torch.autograd.grad(population._loss(*minibatch).sum(), population.params)
    for hand, auto in zip(population._hand_gradients(*minibatch), reference):
        assert auto.abs().max() > 0
        torch.testing.assert_close(hand, auto, atol=1e-6, rtol=1e-5)


def test_building_a_population_leaves_the_global_cpu_generator_as_it_was():
    torch.manual_seed(1234)
    expected = torch.get_rng_state()
    Population(PPO, "CartPole-v1", seeds=[0, 1], **SMALL)
    assert torch.equal(torch.get_rng_state(), expected)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_building_a_population_leaves_every_cuda_generator_as_it_was(device):
    """The members' `torch.manual_seed` reseeds every CUDA device's generator, whatever device the population is on."""
    torch.manual_seed(1234)
    expected = [torch.cuda.get_rng_state(index) for index in range(torch.cuda.device_count())]
    Population(PPO, "CartPole-v1", seeds=[0, 1], device=device, **SMALL)
    for index, state in enumerate(expected):
        assert torch.equal(torch.cuda.get_rng_state(index), state), f"cuda:{index}"


def test_subprocess_env_members_step_together_and_continue_as_solo_runs_after_one_leaves():
    """`env_backend="gymnasium-async"`: one subprocess vector env per member, their steps sent before any result is
    awaited; a member that leaves closes its processes and the others' envs go on mid-episode, so member 1 after two
    iterations, one of them without member 0, equals its solo run."""
    from rlspeed.population.base import MemberEnvs

    population = Population(PPO, "Pendulum-v1", seeds=[3, 7], env_backend="gymnasium-async", **SMALL)
    population._total_timesteps = 2 * SMALL["num_envs"] * SMALL["num_steps"]
    population.train_iteration()
    members = population._env.unwrapped
    assert isinstance(members, MemberEnvs) and all(env.splits_steps for env in members.envs)
    leaving = members.envs[0]
    population.remove([0])
    assert leaving.vector_env.closed and not members.envs[1].vector_env.closed
    population.train_iteration()
    _, solo_trained = _solo_state(7, iterations=2, env_id="Pendulum-v1", env_backend="gymnasium-async")
    trained = {**population.member_state(1), **population.member_statistics(1)}
    assert trained.keys() == solo_trained.keys()
    for name, value in solo_trained.items():
        torch.testing.assert_close(trained[name], value, atol=1e-5, rtol=1e-5, msg=name)
    population.remove([1])


def test_members_training_in_subprocess_envs_evaluate_in_this_process():
    """A solo model that trained in subprocess envs evaluates in them (a slow env's episodes side by side); a
    population's evaluation would be one subprocess per member per episode (320 for 32 members' 10 episodes), so it
    runs in this process, on what `auto` picks for that many envs."""
    from rlspeed.envs import find_wrapper
    from rlspeed.envs.gymnasium_env import GymnasiumEnv

    population = Population(PPO, "CartPole-v1", seeds=[0, 1], env_backend="gymnasium-async", **SMALL)
    env = population._make_env(3, [5, 6], [0, 1])
    try:
        inner = find_wrapper(env, GymnasiumEnv)
        assert isinstance(inner.vector_env, gym.vector.SyncVectorEnv)  # (auto: Gymnasium for 6 envs on a CPU)
        assert env.num_envs == 6
    finally:
        env.close()
    # with env options, on Gymnasium's envs, which take them (auto's native CartPole for 20 envs did not: the
    # evaluation ran the default env)
    population = Population(PPO, "CartPole-v1", seeds=[0, 1], env_backend="gymnasium-async",
                            env_kwargs={"sutton_barto_reward": True}, **SMALL)
    env = population._make_env(10, [5, 6], [0, 1])
    try:
        env.reset()
        _, reward, terminated, *_ = env.step(torch.zeros(20, dtype=torch.int64))
        assert env.spec.env_kwargs == {"sutton_barto_reward": True}
        assert bool((reward[~terminated] == 0).all())  # (Sutton and Barto's reward: 0 until the pole falls)
    finally:
        env.close()


def test_the_last_member_leaving_closes_the_training_env():
    """Once every member has left, the training env (here Gymnasium's vector env) is closed, not left open."""
    population = Population(PPO, "CartPole-v1", seeds=[0, 1], env_backend="gymnasium", num_envs=2, num_steps=8,
                            batch_size=16, n_epochs=1)
    population.learn(16)
    env = population._env
    population.remove([0, 1])
    assert population._env is None and env.env.vector_env.closed


@pytest.mark.parametrize("env_backend", ["torch", "gymnasium"])
def test_a_learn_cut_short_mid_rollout_is_followed_by_fresh_episodes(monkeypatch, env_backend):
    """A KeyboardInterrupt inside a rollout (a notebook's stop button) left the population holding observations
    from before the steps its envs had taken: the next learn paired them with the envs' later states (and subprocess
    envs cut short mid-step failed every later step). It starts from fresh episodes now, as a single model does: the
    seeds' first observations again."""
    population = Population(PPO, "CartPole-v1", seeds=[0, 1], env_backend=env_backend, **SMALL)
    firsts, forward = [], population.forward

    def recording(obs, params=None):
        firsts.append(obs.clone())
        return forward(obs, params)

    monkeypatch.setattr(population, "forward", recording)
    population.learn(128, progress_bar=False)
    env, steps = population._env, [0]
    real_step = env.step

    def interrupted(actions):
        steps[0] += 1
        if steps[0] == 3:
            raise KeyboardInterrupt
        return real_step(actions)

    monkeypatch.setattr(env, "step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        population.learn(128, progress_bar=False)
    firsts.clear()
    population.learn(128, progress_bar=False)
    assert population._env is not env
    assert torch.equal(firsts[0], _first_observations(population))  # (the next learn's first rollout step)


class _FailingCartPole(CartPoleEnv):
    """CartPole whose 5th step raises (the env's own error), in each new env."""

    steps = 0

    def step(self, action):
        self.steps += 1
        if self.steps == 5:
            raise ValueError("sensor glitch (the env's own)")
        return super().step(action)


gym.register("PopulationFailingCartPole-v0", entry_point=_FailingCartPole, max_episode_steps=50)


def test_subprocess_envs_closed_after_a_failed_step_are_made_again_by_the_next_learn():
    """Subprocess envs whose step failed are closed with the error (their worker has stopped): the population's next
    learn stepped them again and failed with Gymnasium's "Trying to operate on `AsyncVectorEnv`, after a call to
    `close()`" where a single model makes its envs again; the population does too (here: the env's error again,
    named as a single model's is)."""
    population = Population(PPO, "PopulationFailingCartPole-v0", seeds=[0, 1], env_backend="gymnasium-async",
                            num_envs=2, num_steps=8, batch_size=16)
    try:
        for _ in range(2):
            # (the worker's traceback is chained to the error, not said again as a warning of Gymnasium's log)
            with warnings.catch_warnings(record=True) as caught, pytest.raises(EnvStepError, match="sensor glitch"):
                warnings.simplefilter("always")
                population.learn(64, progress_bar=False)
            assert not [w for w in caught if "Worker" in str(w.message)]
    finally:
        population.close()


def _first_observations(population) -> torch.Tensor:
    """The observations a fresh population of the same seeds and settings acts on first."""
    fresh = Population(PPO, population.env_id, seeds=population.seeds, env_backend=population.env_backend, **SMALL)
    seen = []
    forward = fresh.forward
    fresh.forward = lambda obs, params=None: (seen.append(obs.clone()), forward(obs, params))[1]
    fresh.learn(SMALL["num_envs"] * SMALL["num_steps"], progress_bar=False)
    return seen[0]


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_fused_adam_steps_equal_the_flat_formula(env_id):
    """Adam through torch's fused kernel per member (CPU and CUDA) and the flat `[K, P]` formula (other devices) give
    the same parameters and moments over several steps, with per-member learning rates, clipping and a member
    leaving on the way."""
    hyper = {**SMALL, "learning_rate": [1e-3, 3e-3, 5e-4], "max_grad_norm": [0.5, 0.05, 1.0]}
    fused, flat = (Population(PPO, env_id, seeds=[0, 1, 2], **hyper) for _ in range(2))
    assert fused._fused_adam
    flat._fused_adam = False
    initial = fused.params[0].detach()[[0, 2]].clone()
    generator = torch.Generator().manual_seed(0)
    for step in range(6):
        if step == 3:
            fused.remove([1])
            flat.remove([1])
        grads = [torch.randn(p.shape, generator=generator) for p in fused.params]
        for population in (fused, flat):
            population._optimizer_step([g.clone() for g in grads], population.hyper["learning_rate"])
    assert not torch.allclose(fused.params[0], initial)  # (the steps moved the parameters)
    for a, b in zip([*fused.params, fused._exp_avg, fused._exp_avg_sq],
                    [*flat.params, flat._exp_avg, flat._exp_avg_sq]):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_dict_keys_beyond_float32s_integers_are_refused():
    """A Dict key whose integers float32 would round (the packed rows are float32) is refused in one sentence."""
    import gymnasium as gym
    import numpy as np

    from rlspeed.population.base import check_packable

    check_packable(gym.spaces.Dict({"image": gym.spaces.Box(0, 255, (3, 3), np.uint8), "turn": gym.spaces.Discrete(4),
                                    "cell": gym.spaces.MultiDiscrete([7, 7])}), "ok-v0")
    with pytest.raises(UserError, match="'count' .* beyond 2\\*\\*24"):
        check_packable(gym.spaces.Dict({"count": gym.spaces.Box(0, 2**30, (1,), np.int64)}), "big-v0")
    with pytest.raises(UserError, match="'cell'"):
        check_packable(gym.spaces.Dict({"cell": gym.spaces.Discrete(2**24 + 2)}), "big-v0")
    check_packable(gym.spaces.Dict({"cell": gym.spaces.Discrete(2**24 + 1)}), "ok-v0")  # (its largest is 2**24)


def test_an_eval_freq_without_a_target_evaluates_the_members():
    """Population.learn(eval_freq=N) with neither a target nor on_eval evaluates every N steps (the curves and the
    plot were empty), with the final evaluation's seed in each member's entry."""
    from rlspeed import PPO
    from rlspeed.evaluation import evaluation_seed
    from rlspeed.population import Population

    population = Population(PPO, "CartPole-v1", seeds=[0, 1], num_envs=4, num_steps=16, batch_size=64, n_epochs=1)
    summary = population.learn(256, eval_freq=128, eval_episodes=2, progress_bar=False)
    assert all(len(member["curve"]) == 2 for member in summary["members"])
    assert all(member["final_eval"]["seed"] == evaluation_seed(member["seed"], "final", 256)
               for member in summary["members"])
    assert all(member["final_eval"]["deterministic"] is True for member in summary["members"])  # (the mode named)


@pytest.mark.parametrize("budget", [100_000, 40_000])  # (a 40th of the budget; the floor of 2,048)
def test_a_population_evaluates_as_often_as_a_solo_run_of_its_budget_by_default(budget):
    """Without eval_freq a population's first evaluation comes at the step a solo run of the same budget and
    iteration size has its first (a 40th of the budget, at least 2,048; populations evaluated every 10,000)."""
    from rlspeed.algos.base import default_eval_freq

    quick = {"num_envs": 16, "num_steps": 32, "batch_size": 512, "n_epochs": 1}  # (few iterations to the first)
    solo = PPO("CartPole-v1", seed=0, **quick)
    solo.learn(budget, target_return=1e9, eval_episodes=1, progress_bar=False,
               callback=lambda _: not solo.result.evaluations)  # (stops after the first evaluation)
    population = Population(PPO, "CartPole-v1", seeds=[0, 1], **quick)
    summary = population.learn(budget, target_return=1e9, eval_episodes=1, progress_bar=False,
                               on_eval=lambda steps, means: list(means), evaluate_pruned=False)  # (all pruned at it)
    iteration = quick["num_envs"] * quick["num_steps"]
    first = -(-default_eval_freq(budget) // iteration) * iteration  # (the iteration that reaches the interval)
    assert solo.result.evaluations[0][0] == first
    assert [member["curve"][0][0] for member in summary["members"]] == [first, first]


def test_each_members_confirming_evaluations_are_in_its_entry():
    """An evaluation that reaches the target is confirmed on fresh episodes; the member's entry lists each
    confirmation ([steps, mean]), so a curve that touched the target without a steps_to_target is explained, and a
    steps_to_target is the first confirmation at or above the target."""
    from rlspeed import PPO
    from rlspeed.population import Population

    population = Population(PPO, "CartPole-v1", seeds=[0, 1, 2], num_envs=4, num_steps=16, batch_size=64,
                            n_epochs=2, learning_rate=1e-3)
    target = 80.0  # (within reach of a few evaluations of these short runs, not of every confirmation)
    summary = population.learn(2048, target_return=target, eval_freq=128, eval_episodes=2, stop="all",
                               progress_bar=False)
    assert any(member["confirmations"] for member in summary["members"])  # (the rule below is exercised)
    for member in summary["members"]:
        confirmed = [steps for steps, mean in member["confirmations"] if mean >= target]
        assert member["steps_to_target"] == (confirmed[0] if confirmed else None)
        until = member["steps_to_target"] or math.inf  # (a member that reached it is not confirmed again)
        reaching = [steps for steps, mean in member["curve"] if mean >= target and steps <= until]
        assert [steps for steps, _ in member["confirmations"]] == reaching


def test_evaluate_refuses_a_member_outside_the_population():
    from rlspeed import PPO, UserError
    from rlspeed.population import Population

    population = Population(PPO, "CartPole-v1", seeds=[0, 1, 2], num_envs=4, num_steps=16, batch_size=64, n_epochs=1)
    with pytest.raises(UserError, match="members takes indices 0-2 of this population of 3, got 7"):
        population.evaluate(members=[7])


class _NanRewardAfter(gym.Env):
    """CartPole-like spaces whose reward turns NaN at the 40th step of an env first reset with a seed >= 10 (the
    reliability pass's env, for the second member of seeds [0, 10] only)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        self.steps, self.seed_given = 0, None

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        if self.seed_given is None:
            self.seed_given = seed
        return np.zeros(4, np.float32), {}

    def step(self, action):
        self.steps += 1
        reward = math.nan if self.steps == 40 and (self.seed_given or 0) >= 10 else 1.0
        return np.zeros(4, np.float32), reward, self.steps % 20 == 0, False, {}


@pytest.mark.parametrize("algo", ["PPO", "DQN"])
def test_a_nan_reward_stops_a_population_in_one_sentence_naming_the_member(algo):
    """A NaN or infinite reward or observation stops a population as it stops a single run (NonFiniteEnvError, exit
    2 from the CLI), naming the member whose env gave it; members trained on it were only reported as diverged, and
    a population of them exited 0."""
    from rlspeed.numerics import NonFiniteEnvError

    gym.register("rlspeed-test/NanReward-v0", entry_point=_NanRewardAfter)
    try:
        hyper = SMALL if algo == "PPO" else {"num_envs": 2, "learning_starts": 16, "batch_size": 16}
        population = Population(ALGORITHMS[algo.lower()], "rlspeed-test/NanReward-v0", seeds=[0, 10], device="cpu",
                                env_backend="gymnasium", **hyper)
        with pytest.raises(NonFiniteEnvError, match=r"to population member 1 \(seed 10\) by step \d"):
            population.learn(512, eval_freq=64, progress_bar=False)
    finally:
        del gym.registry["rlspeed-test/NanReward-v0"]


def test_env_options_reach_every_members_env_its_evaluation_and_its_model():
    """`env_kwargs` (Pendulum-v1 with g=2.0) make every member's env, as a solo run's: a member's evaluation equals
    its model's (which records the options) on the same seed, and differs from the default env's."""
    import rlspeed

    population = Population(PPO, "Pendulum-v1", seeds=[0, 1], device="cpu", env_kwargs={"g": 2.0}, **SMALL)
    assert population.env_backend == "gymnasium" and population.env_kwargs == {"g": 2.0}
    means = population.evaluate([5, 6], episodes=2).tolist()
    member = population.member_model(1)
    assert member.spec.env_kwargs == {"g": 2.0}
    assert rlspeed.evaluate(member, episodes=2, seed=6)["mean"] == pytest.approx(means[1], rel=1e-5)
    default = rlspeed.evaluate(member, rlspeed.make_env("Pendulum-v1", num_envs=2, device="cpu",
                                                        backend="gymnasium"), episodes=2, seed=6)
    assert default["mean"] != pytest.approx(means[1], rel=1e-3)
    with pytest.raises(UserError, match="env_backend='gymnasium'"):
        Population(PPO, "Pendulum-v1", seeds=[0, 1], env_kwargs={"g": 2.0}, env_backend="torch", **SMALL)


def test_an_evaluation_of_episodes_without_end_warns_and_the_summary_counts_them(monkeypatch):
    """A population's evaluations on an env whose episodes never end stop at the step limit, as `rlspeed.evaluate`'s
    do, and say so as it does: a warning, and each member's final evaluation counts its episodes cut short (they
    counted silently, with the return collected so far)."""
    import rlspeed.evaluation

    env_id = endless_pendulum_id()
    monkeypatch.setattr(rlspeed.evaluation, "UNLIMITED_EPISODE_STEPS", 40)  # (10,000 steps: the same, slower)
    population = Population(PPO, env_id, seeds=[0, 1], device="cpu", **SMALL)
    with pytest.warns(UserWarning, match="4 of 4 episodes were still running after 40 steps; they count with the "
                                         "return collected so far .*max_episode_steps"):
        # (a target on such an env is compared with those returns: learn says so before training)
        with pytest.warns(UserWarning, match="has no time limit: .* target_return 1e\\+09 is compared with such"):
            summary = population.learn(128, eval_episodes=2, target_return=1e9, progress_bar=False)
    finals = [member["final_eval"] for member in summary["members"]]
    assert [final["unfinished"] for final in finals] == [2, 2] and all(final["mean"] < 0 for final in finals)


@pytest.mark.parametrize("algo", [PPO, SAC])
def test_a_population_evaluation_runs_episodes_max_steps_long_as_rlspeed_evaluate_does(algo):
    """`evaluate(max_steps=N)` cuts the members' episodes at N steps (a never-ending env's ran 10,000 steps each, with
    no way to say fewer), counts them unfinished and says so; a bad value is one sentence."""
    settings = SMALL if algo is PPO else {"learning_starts": 10}
    population = Population(algo, endless_pendulum_id(), seeds=[0, 1], device="cpu", **settings)
    with pytest.warns(UserWarning, match=r"4 of 4 episodes were still running after 25 steps.*evaluate\(max_steps=N\)"):
        means = population.evaluate(episodes=2, max_steps=25)
    assert population.last_unfinished == [2, 2]
    assert all(-16.3 * 25 <= float(mean) <= 0 for mean in means)  # (Pendulum's reward: -16.3 to 0 per step)
    with pytest.raises(UserError, match="max_steps"):
        population.evaluate(episodes=2, max_steps=0)


def test_an_env_id_naming_its_module_trains_a_population_as_it_trains_a_solo_run(tmp_path, monkeypatch):
    """`module:EnvId` (the module registers the env), which solo runs take, makes the members' training and evaluation
    envs too (it once reached Gymnasium's registry whole: learn stopped with "Unknown env id" and suggested the
    `MODULE:EnvId` form it had been given)."""
    (tmp_path / "my_population_envs.py").write_text(
        "import gymnasium\n"
        "gymnasium.register('MyPopulationCartPole-v0', "
        "entry_point='gymnasium.envs.classic_control.cartpole:CartPoleEnv', max_episode_steps=50)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    population = Population(PPO, "my_population_envs:MyPopulationCartPole-v0", seeds=[0, 1], device="cpu", **SMALL)
    summary = population.learn(256, eval_freq=128, eval_episodes=2)
    assert population.num_timesteps == 256 and [len(m["curve"]) for m in summary["members"]] == [2, 2]
    assert all(0 < m["final_eval"]["mean"] <= 50 for m in summary["members"])  # (the registered 50-step episodes)


def test_population_mistakes_are_one_sentence_each():
    """A name for the class said populations do not cover PPO; a bad device, episodes=0, an unknown learn keyword and
    a non-path save raised torch's RuntimeError, a reshape error or Python's TypeError."""
    from rlspeed import PPO, UserError
    from rlspeed.population import Population

    with pytest.raises(UserError, match=r"takes the algorithm's class \(rlspeed\.PPO\), not 'ppo'"):
        Population("ppo", "CartPole-v1", seeds=[0, 1])
    with pytest.raises(UserError, match="Unknown device 'gpu'"):
        Population(PPO, "CartPole-v1", seeds=[0, 1], device="gpu")
    population = Population(PPO, "CartPole-v1", seeds=[0, 1], num_envs=2, num_steps=16, batch_size=32)
    with pytest.raises(UserError, match="episodes must be a whole number >= 1, got 0"):
        population.evaluate(episodes=0)
    with pytest.raises(UserError, match="needs episodes, a whole number >= 1, not None"):
        population.evaluate(episodes=None)
    with pytest.raises(UserError, match=r"a setting of the model.*Population\(PPO, env_id, seeds, gamma=\.\.\.\)"):
        population.learn(32, gamma=0.9)
    with pytest.raises(UserError, match="learn takes no 'totl_timesteps'; did you mean total_timesteps"):
        population.learn(32, totl_timesteps=64)
    with pytest.raises(UserError, match=r"population's learn takes no callback .*on_eval=fn\(num_timesteps, means\)"):
        population.learn(32, callback=lambda local_vars: True)  # (a model's learn takes one)
    assert population.learn(32, callback=None, progress_bar=False)["members"]  # (no callback: as a model's learn)
    with pytest.raises(UserError, match="save takes a file's path"):
        population.save(5)


def test_a_stop_request_during_the_final_evaluation_ends_it_without_waiting_for_its_episodes():
    """A signal that came while a population's final evaluation ran (Atari games: minutes) waited for every game to
    end, where a solo run's stops at once: the request is asked during the evaluation too, which is then skipped,
    as one that came as the last iteration ended."""
    population = Population(PPO, "Pendulum-v1", seeds=[0, 1], **SMALL)
    stepped = []
    asked = {"final": False}

    def stop_requested():
        # (False through training and the check after it; the evaluation that follows asks again: stop there)
        if asked["final"]:
            return True
        asked["final"] = population.num_timesteps >= 256
        return False

    make = population._make_env

    def counting_env(*args, **kwargs):  # (the env's steps, training's and the evaluation's)
        env = make(*args, **kwargs)
        step = env.step

        def counted(actions):
            stepped.append(1)
            return step(actions)

        env.step = counted
        return env

    population._make_env = counting_env
    summary = population.learn(256, progress_bar=False, stop_requested=stop_requested)
    assert summary["aggregate"]["final_eval"] is None and all(m["final_eval"] is None for m in summary["members"])
    # (32 training steps of 8 envs, then the evaluation's, stopped at its first check: not after Pendulum's 200)
    assert len(stepped) <= 32 + 64


def test_normalisation_clips_apply_to_every_member_as_to_its_solo_run():
    """`normalize_obs_clip` and `normalize_reward_clip`: one value for the population, each member normalising as
    its solo run with those clips does."""
    clips = {**NORMALIZE, "normalize_obs_clip": 0.5, "normalize_reward_clip": 0.25}
    population = Population(PPO, "Pendulum-v1", seeds=[3], **SMALL, **clips)
    population._total_timesteps = SMALL["num_envs"] * SMALL["num_steps"]
    population.train_iteration()
    _, solo_trained = _solo_state(3, iterations=1, env_id="Pendulum-v1", **clips)
    trained = {**population.member_state(0), **population.member_statistics(0)}
    for name, value in solo_trained.items():
        torch.testing.assert_close(trained[name], value, atol=1e-5, rtol=1e-5, msg=name)


def test_a_population_given_its_members_takes_their_settings_and_refuses_others():
    """`members=` (solo models to start from, as `rlspeed eval RUN_DIR` gives its loaded member files) takes the
    models' settings and parameters: hyperparameters given beside them, or models of other seeds, are refused in one
    sentence rather than built into members the models are not."""
    models = [PPO("CartPole-v1", seed=seed, device="cpu", num_envs=2, num_steps=8, batch_size=16, verbose=0)
              for seed in (0, 1)]
    population = Population(PPO, "CartPole-v1", seeds=[0, 1], members=models)
    assert population.config.num_envs == 2
    for k, model in enumerate(models):
        held, saved = population._member_checkpoint(k), model._state_tensors()
        assert held and all(torch.equal(value, saved[name]) for name, value in held.items())
    with pytest.raises(UserError, match=r"give no hyperparameters or member_overrides \(got learning_rate\)"):
        Population(PPO, "CartPole-v1", seeds=[0, 1], members=models, learning_rate=1e-3)
    with pytest.raises(UserError, match=r"members takes one PPO model per seed of seeds, each made with that seed"):
        Population(PPO, "CartPole-v1", seeds=[1, 0], members=models)


def test_given_members_are_checked_as_built_ones():
    """Members given as models pass the checks built ones pass: a model with a schedule function is refused (the
    stacked update would train at its start value), as are models on another env backend than the one the population
    is given (`env_backend="auto"` takes theirs) and models of different num_threads (the first one's would run)."""
    small = dict(device="cpu", num_envs=2, num_steps=8, batch_size=16, verbose=0)
    with pytest.raises(UserError, match=r"learning_rate=.*a population trains its members in one stacked update"):
        Population(PPO, "CartPole-v1", seeds=[0, 1], members=[
            PPO("CartPole-v1", seed=seed, learning_rate=lambda progress: 3e-4 * progress, **small) for seed in (0, 1)])
    models = [PPO("CartPole-v1", seed=seed, env_backend="gymnasium", **small) for seed in (0, 1)]
    assert Population(PPO, "CartPole-v1", seeds=[0, 1], members=models).env_backend == "gymnasium"
    with pytest.raises(UserError, match=r"members run on env_backend='gymnasium', the population on 'torch'"):
        Population(PPO, "CartPole-v1", seeds=[0, 1], members=models, env_backend="torch")
    with pytest.raises(UserError, match=r"seed 1's env, backend, device, num_threads or shared settings differ"):
        Population(PPO, "CartPole-v1", seeds=[0, 1], members=[
            PPO("CartPole-v1", seed=seed, num_threads=threads, **small) for seed, threads in ((0, 1), (1, 2))])


def test_given_members_take_their_env_options_and_other_options_are_refused_naming_them():
    """Members made with env_kwargs were refused where the population was not given them again (their backend, and
    every other setting, it takes from them), as "The members' env or device (CartPole-v1 on cpu) is not the
    population's (CartPole-v1 on cpu)". It takes their options; other options given are refused, the sentence naming
    both."""
    small = dict(device="cpu", num_envs=2, num_steps=8, batch_size=16, verbose=0)
    models = [PPO("CartPole-v1", seed=seed, env_kwargs={"sutton_barto_reward": True}, **small) for seed in (0, 1)]
    assert Population(PPO, "CartPole-v1", seeds=[0, 1], members=models).env_kwargs == {"sutton_barto_reward": True}
    with pytest.raises(UserError, match=r"\(CartPole-v1 with env_kwargs \{'sutton_barto_reward': True\} on cpu\) is "
                                        r"not the population's \(CartPole-v1 with env_kwargs "
                                        r"\{'sutton_barto_reward': False\} on cpu\)"):
        Population(PPO, "CartPole-v1", seeds=[0, 1], members=models, env_kwargs={"sutton_barto_reward": False})
