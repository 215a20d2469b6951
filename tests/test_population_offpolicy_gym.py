"""rlspeed.population for SAC, TD3 and DQN on Gymnasium envs: member k starts and updates as the solo run with its
seed on the same Gymnasium envs (env seeds, random streams), a member that leaves takes its replay and env rows with
it, and `rlspeed train --seeds --env-backend gymnasium` trains on Gymnasium's envs. (Native envs:
tests/test_population_offpolicy.py.)"""

import json

import pytest
import torch
from conftest import (
    assert_member_is_its_solo_run,
    binary_vector_env_id,
    masked_vector_env_id,
    needs_atari,
    needs_box2d,
    needs_envpool,
    needs_minatar,
    needs_minigrid,
)
from test_population_offpolicy import SMALL, _state

from rlspeed import DQN, SAC, TD3, cli
from rlspeed.errors import UserError
from rlspeed.population import Population

STEPS = 80  # per member: 40 random steps, then about 40 updates
SMALL_DQN = {"num_envs": 2, "train_freq": 4, "gradient_steps": 4, "batch_size": 32, "learning_starts": 40,
             "target_update_interval": 16, "net_arch": [32, 32], "exploration_fraction": 0.5}


def _check_members_equal_solo_runs(algo, env_id: str, backend: str, small: dict, per_member: dict, steps: int):
    seeds = [3, 7]
    population = Population(algo, env_id, seeds=seeds, env_backend=backend, **{**small, **per_member})
    assert population.env_backend == "gymnasium"
    initial = [population.member_state(k) for k in range(2)]
    population._start(steps)
    while population.num_timesteps < steps:
        population.train_iteration()
    for k, seed in enumerate(seeds):
        solo = algo(env_id, seed=seed, env_backend="gymnasium",
                    **{**small, **{key: values[k] for key, values in per_member.items()}})
        solo_initial = _state(solo)
        solo.learn(steps, progress_bar=False)
        assert solo.env_backend == "gymnasium"
        assert_member_is_its_solo_run(initial[k], population.member_state(k), solo_initial, _state(solo))


@pytest.mark.parametrize("env_id, backend, envs, steps", [
    ("Pendulum-v1", "gymnasium", 2, STEPS),
    pytest.param("LunarLanderContinuous-v3", "auto", 2, STEPS, marks=needs_box2d),
    pytest.param("LunarLanderContinuous-v3", "auto", 64, 192, marks=needs_box2d)])
def test_sac_members_start_and_update_as_solo_runs_on_gymnasium_envs(env_id, backend, envs, steps):
    """Pendulum-v1 asked for with env_backend="gymnasium"; LunarLanderContinuous-v3 has no native env, so "auto" takes
    Gymnasium's. Its two action dimensions make the solo's actor head column-major on a CPU (its update's 2 x 32 rows;
    with 64 envs its exploration's too), which changes the solo's normal draws. Member 1 has its own learning rate and
    gamma."""
    _check_members_equal_solo_runs(SAC, env_id, backend, {**SMALL, "num_envs": envs},
                                   {"learning_rate": [2e-3, 5e-4], "gamma": [0.99, 0.9]}, steps)


def _box_action_env_id(observation: str) -> str:
    """A registered env with Box(2) actions and `observation`s that go through an encoder without parameters:
    "discrete" (Discrete(5), one-hot), "bits" (MultiBinary(4), flattened) or "dict" (a Dict of a MultiBinary(3) and a
    Box(2)); the reward depends on the observation, so the networks' input matters."""
    import gymnasium as gym
    import numpy as np

    spaces = {"discrete": gym.spaces.Discrete(5), "bits": gym.spaces.MultiBinary(4),
              "dict": gym.spaces.Dict({"bits": gym.spaces.MultiBinary(3), "pos": gym.spaces.Box(-1.0, 1.0, (2,))})}

    class Target(gym.Env):
        observation_space = spaces[observation]
        action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

        def _draw(self):  # (from the env's own generator: the solo's envs and the members' draw the same)
            bits = self.np_random.integers(0, 2, 4).astype(np.int8)
            pos = self.np_random.uniform(-1.0, 1.0, 2).astype(np.float32)
            self.obs = {"discrete": int(bits[:3] @ [1, 2, 1]), "bits": bits,
                        "dict": {"bits": bits[:3], "pos": pos}}[observation]
            flat = gym.spaces.flatten(self.observation_space, self.obs).astype(np.float32)
            self.goal = np.tanh(flat[:2] * 2 - 0.5)
            return self.obs

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.t = 0
            return self._draw(), {}

        def step(self, action):
            self.t += 1
            reward = -float(np.square(np.asarray(action) - self.goal).sum())
            return self._draw(), reward, False, self.t >= 10, {}

    env_id = f"RlspeedTest/BoxActionFrom{observation.capitalize()}-v0"
    if env_id not in gym.registry:
        gym.register(env_id, entry_point=Target, max_episode_steps=10)
    return env_id


@pytest.mark.parametrize("algo", [SAC, TD3])
@pytest.mark.parametrize("observation", ["discrete", "bits", "dict"])
def test_box_action_members_take_observations_through_an_encoder_without_parameters(algo, observation):
    """SAC (its hand-derived update) and TD3 members on one-hot Discrete, flattened MultiBinary and packed Dict
    observations, through the solo's encoder: member k equals the solo run with its seed. (One-hot inputs with ReLU:
    SAC's member 1 drifts from its solo run by about 1e-4 from the third update, in the population's autograd update
    as in its hand-derived one, and not with tanh: a unit at the ReLU's kink in one computation and not the other.
    So that case runs with tanh.)"""
    small = {**SMALL, "activation": "tanh"} if observation == "discrete" else SMALL
    _check_members_equal_solo_runs(algo, _box_action_env_id(observation), "gymnasium", small,
                                   {"learning_rate": [2e-3, 5e-4]}, STEPS)


def test_dqn_members_start_and_update_as_solo_runs_on_gymnasium_envs():
    """Epsilon-greedy draws, Double DQN targets and target copies on Gymnasium's Acrobot-v1, each member with its own
    learning rate and final epsilon."""
    _check_members_equal_solo_runs(DQN, "Acrobot-v1", "gymnasium", SMALL_DQN,
                                   {"learning_rate": [5e-3, 1e-3], "exploration_final_eps": [0.05, 0.2]}, 120)


@pytest.mark.parametrize("algo", [SAC, TD3])
def test_a_member_that_leaves_takes_its_replay_and_env_rows_with_it(algo):
    """Member 1 of 3 is pruned at the first evaluation: its rows of the replay buffer and of the Gymnasium vector env
    are cut out (the kept env objects continue mid-episode), and members 0 and 2 end as in a population that never had
    member 1."""
    seeds = [0, 1, 2]
    population = Population(algo, "Pendulum-v1", seeds=seeds, env_backend="gymnasium", **SMALL)
    summary = population.learn(STEPS, eval_freq=50, eval_episodes=2,
                               on_eval=lambda at, means: [1] if at == 50 else None)
    assert summary["pruned"] == 1 and summary["members"][1]["pruned_at"] == 50
    assert summary["env_backend"] == "gymnasium"
    assert population.alive == [0, 2]
    assert population._env.num_envs == 2 * SMALL["num_envs"] and population._obs.shape[0] == 2 * SMALL["num_envs"]
    without = Population(algo, "Pendulum-v1", seeds=[0, 2], env_backend="gymnasium", **SMALL)
    without.learn(STEPS, eval_freq=50, eval_episodes=2)
    for name in ("obs", "next_obs", "actions", "rewards", "terminated", "discounts"):
        kept, theirs = getattr(population.buffer, name), getattr(without.buffer, name)
        assert kept.shape[1] == 2, name  # [steps, members, envs, ...]: member 1's rows are gone
        torch.testing.assert_close(kept, theirs, atol=1e-5, rtol=0)
    torch.testing.assert_close(population._obs, without._obs, atol=1e-5, rtol=0)
    for k, j in ((0, 0), (2, 1)):
        theirs = without.member_state(j)
        for name, value in population.member_state(k).items():
            torch.testing.assert_close(value, theirs[name], atol=1e-5, rtol=0)


def test_env_backend_is_checked():
    with pytest.raises(UserError, match="no native env"):
        Population(SAC, "LunarLanderContinuous-v3", seeds=[0], env_backend="torch")
    with pytest.raises(UserError, match="env_backend"):
        Population(DQN, "CartPole-v1", seeds=[0], env_backend="sb3")
    assert Population(SAC, "Pendulum-v1", seeds=[0], **SMALL).env_backend == "torch"  # (native where there is one)


def test_cli_seeds_with_env_backend_gymnasium(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "sac", "Pendulum-v1", "--seeds", "0-1", "--env-backend", "gymnasium", "--total-timesteps", "80",
            "--eval-freq", "40", "--target-return", "1000", "--set", "learning_starts=40", "--set", "batch_size=32",
            "--set", "net_arch=[32,32]", "--threads", "1", "--out", str(out)]
    assert cli.main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["env_backend"] == "gymnasium" and summary["population"] == 2
    assert [[step for step, _ in member["curve"]] for member in summary["members"]] == [[40, 80], [40, 80]]
    # rlspeed eval RUN_DIR plays the SAC members as one population (off-policy members' files as the population's
    # tensors: where they were not, it fell back to one model at a time without a word), each with its own numbers
    from rlspeed.population import base

    batches, played = [], base.PopulationBase._mean_returns

    def counted(self, seeds, *args, **kwargs):
        batches.append(len(seeds))
        return played(self, seeds, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(base.PopulationBase, "_mean_returns", counted)
        capsys.readouterr()
        assert cli.main(["eval", str(out), "--episodes", "1", "--seed", "7", "--no-progress", "--json"]) == 0
        member = json.loads(capsys.readouterr().out)["members"][1]
    assert batches == [2]
    assert cli.main(["eval", member["model"], "--seed", str(member["seed"]), "--episodes", "1", "--no-progress",
                     "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["returns"] == member["returns"]


@pytest.mark.parametrize("env", ["masked-vector", "Taxi-v4"])
def test_dqn_members_apply_action_masks_as_solo_runs(env):
    """Action masks (`info["action_mask"]`) in the uniform warm-up, the epsilon-greedy draws, the replay rows' next
    masks and the targets' argmax: member k trains as the solo DQN with its seed (on a float-vector env whose masks
    change every step, and on Taxi-v4, one-hot observations), and its masked evaluation equals the solo's."""
    env_id = masked_vector_env_id() if env == "masked-vector" else env
    per_member = {"learning_rate": [5e-3, 1e-3], "exploration_final_eps": [0.05, 0.2]}
    _check_members_equal_solo_runs(DQN, env_id, "gymnasium", SMALL_DQN, per_member, 120)
    population = Population(DQN, env_id, seeds=[3, 7], **SMALL_DQN, **per_member)
    population.learn(120, eval_freq=120, eval_episodes=2)
    assert population._masking and population.buffer.next_action_masks.shape == (61, 2, 2, population.action_dim)
    for k in range(2):
        solo = population.member_model(k)
        assert solo._masking is False  # (a fresh model: it learns of the masks from the env, as evaluate does)
        assert solo.trained_with_action_masks  # (its file says so: `export` adds the mask input, as for a solo's)
        assert population.evaluate([500], episodes=2, members=[k]).item() == pytest.approx(
            solo.evaluate(episodes=2, seed=500)["mean"], abs=1e-3)


def test_dqn_members_choose_among_all_actions_with_use_masking_off():
    population = Population(DQN, masked_vector_env_id(), seeds=[0, 1], use_masking=False, **SMALL_DQN)
    assert population.learn(80)["total_timesteps"] == 80
    assert not population._masking and population.buffer.next_action_masks is None
    assert not population.member_model(0).trained_with_action_masks


def test_dqn_members_train_as_solo_runs_on_binary_vectors():
    """MultiBinary observations go through the solo's flatten encoder (bool to float, no parameters)."""
    _check_members_equal_solo_runs(DQN, binary_vector_env_id(), "gymnasium", SMALL_DQN,
                                   {"learning_rate": [5e-3, 1e-3]}, STEPS)


@pytest.mark.parametrize("env_id, extra", [
    pytest.param("MinAtar/Breakout-v1", {}, marks=needs_minatar),  # (bool images, kept bool in the replay)
    # (a Dict of a uint8 image and a Discrete direction: packed float rows, each member's own multi-input encoder)
    pytest.param("MiniGrid-DoorKey-5x5-v0", {"cnn_features_dim": 16}, marks=needs_minigrid),
])
def test_dqn_members_with_their_own_encoders_train_as_solo_runs(env_id, extra):
    """Each member's own CNN (online and target, one vmapped call for all): member k equals the solo DQN with its
    seed, a member pruned on the way is evaluated with the parameters it left with, and `member_model(k)` acts as
    the member."""
    small = {**SMALL_DQN, **extra}
    per_member = {"learning_rate": [5e-3, 1e-3], "exploration_final_eps": [0.05, 0.2]}
    _check_members_equal_solo_runs(DQN, env_id, "gymnasium", small, per_member, STEPS)
    population = Population(DQN, env_id, seeds=[3, 7], **small, **per_member)
    population.learn(STEPS, eval_freq=40, eval_episodes=2, on_eval=lambda steps, means: [1] if steps == 40 else None)
    assert population.alive == [0] and population.q_encoder[0].shape[0] == 1  # (member 1's encoder rows left)
    assert population.buffer.obs.dtype == (torch.bool if env_id.startswith("MinAtar") else torch.float32)
    # (the dtype the memory check counts before training starts is the one the replay then stores)
    assert Population(DQN, env_id, seeds=[3], **small)._replay_obs_dtype() == population.buffer.obs.dtype
    for k in range(2):
        solo = population.member_model(k)
        assert population.evaluate([500], episodes=2, members=[k]).item() == pytest.approx(
            solo.evaluate(episodes=2, seed=500)["mean"], abs=1e-3)


@needs_atari
def test_dqn_members_train_as_solo_runs_on_an_atari_game():
    """The solo's preprocessed envs and training transforms, each member's own Nature CNN (online and target), and
    each member's replay storing each frame once as the solo's does. A few updates only: the Nature CNN's millions of
    ReLUs per batch make a unit within rounding of zero likely after more (see the PPO case)."""
    small = {**SMALL_DQN, "learning_starts": 64, "gradient_steps": 1, "buffer_size": 1000}
    _check_members_equal_solo_runs(DQN, "BreakoutNoFrameskip-v4", "gymnasium", small, {"learning_rate": [5e-3, 1e-3]},
                                   96)


@needs_atari
@pytest.mark.parametrize("backend", ["gymnasium", pytest.param("envpool", marks=needs_envpool)])
def test_dqn_members_on_an_atari_game_store_each_frame_once_as_their_solo_runs(tmp_path, backend):
    """Each member's replay is its solo run's frame layout, row for row: the same stacks rebuilt from frames stored
    once, across lost lives, finished games (random play loses Breakout's five lives in about 200 steps),
    3-step returns and the buffer wrapping around (600 env steps per member into 500 rows), in the solo's bytes per
    transition; summary.json's `replay` says so; and a checkpoint with `save_replay_buffer` brings the rows back."""
    from rlspeed.population.offpolicy import MemberFrameReplay, MemberReplay

    env_id, seeds, steps = "BreakoutNoFrameskip-v4", [3, 7], 600
    small = {**SMALL_DQN, "learning_starts": 10_000, "buffer_size": 500, "n_step": 3, "gamma": [0.99, 0.9]}
    population = Population(DQN, env_id, seeds=seeds, env_backend=backend, save_replay_buffer=True, **small)
    population._start(steps)
    while population.num_timesteps < steps:
        population.train_iteration()
    buffer = population.buffer
    assert isinstance(buffer, MemberFrameReplay)
    for k, seed in enumerate(seeds):
        solo = DQN(env_id, seed=seed, env_backend=backend, **{**small, "gamma": small["gamma"][k]})
        solo.learn(steps, progress_bar=False)
        mine, theirs = buffer.buffers[k], solo.buffer
        assert theirs.layout == "frames" and (mine.pos, mine.size, mine.evicted) == (theirs.pos, theirs.size, 0)
        assert theirs.size == theirs.capacity and theirs.pos > 0  # (wrapped)
        assert mine._frames_written == theirs._frames_written  # (frames stored anew for the same restarted rows)
        rows = torch.arange(theirs.capacity)
        expected, actual = theirs.gather(rows), mine.gather(rows)
        for name, value in expected.items():
            assert torch.equal(actual[name], value), name
        # (lost lives ended episodes, which cut 3-step returns short: discounts of 1, 2 and 3 steps)
        assert expected["terminated"].sum() > 10 and expected["discounts"].unique().numel() == 3
        assert buffer.row_bytes == pytest.approx(theirs.bytes_per_transition)
    replay = population.replay_summary()
    assert replay["layout"] == "frames" and replay["nbytes"] == 2 * solo.buffer.nbytes
    whole_stacks = MemberReplay.bytes_per_row(4 * 84 * 84, 1, None, torch.uint8)  # (56,468 bytes)
    assert replay["bytes_per_transition"] < whole_stacks / 6
    index = torch.randint(0, 500, (2, 64), generator=torch.Generator().manual_seed(0))
    sample = buffer.sample(index)
    assert sample["obs"].shape == (2, 64, 4 * 84 * 84) and sample["obs"].dtype == torch.uint8
    assert torch.equal(sample["obs"][1], buffer.buffers[1].gather(index[1])["obs"].flatten(1))
    checkpoint = population.save(tmp_path / "checkpoint.safetensors")
    resumed = Population(DQN, env_id, seeds=seeds, env_backend=backend, save_replay_buffer=True, **small)
    with pytest.warns(UserWarning):  # (Gymnasium's envs restart their episodes; EnvPool's too)
        resumed.resume(checkpoint)
    restored = resumed.buffer.sample(index)
    for name, value in sample.items():
        assert torch.equal(restored[name], value), name


@needs_atari
def test_frame_member_replays_too_big_for_memory_are_refused_with_the_buffer_size_that_fits(monkeypatch):
    """Each member's buffer holds buffer_size transitions (as the solo's, at its bytes per transition: about 7,500
    for Breakout, where whole stacks take 56,468); the check names the largest buffer_size that fits, and it fits."""
    from rlspeed.buffers import replay

    budget = 2 * 2**30  # a fake 2 GiB of available host memory
    monkeypatch.setattr(replay, "available_memory", lambda device, needed=None: (budget, replay.HOST))
    population = Population(DQN, "BreakoutNoFrameskip-v4", seeds=[0, 1, 2, 3], buffer_size=100_000, num_envs=2)
    with pytest.raises(UserError, match=r"4 members \(100,000 transitions each, 7,[0-9]{3} bytes per transition\) "
                                        r".* the largest buffer_size that fits is ([\d,]+)") as info:
        population.check_fits(1_000_000)
    fits = int(info.value.args[0].split("fits is ")[1].split(" ")[0].replace(",", ""))
    assert 50_000 < fits < 100_000 and fits % 2 == 0
    Population(DQN, "BreakoutNoFrameskip-v4", seeds=[0, 1, 2, 3], buffer_size=fits, num_envs=2).check_fits(1)
    with pytest.raises(UserError):
        Population(DQN, "BreakoutNoFrameskip-v4", seeds=[0, 1, 2, 3], buffer_size=fits + 2, num_envs=2).check_fits(1)


@needs_atari
def test_the_buffer_size_the_estimate_of_frame_members_names_is_not_refused(monkeypatch):
    """The estimate after the first member (`rlspeed train --seeds`, which plans the steps) spread the frame pool's
    reserve over buffer_size's transitions: the smaller buffer_size it named was refused by the same estimate."""
    from rlspeed.buffers import replay
    from rlspeed.population import base

    monkeypatch.setattr(replay, "available_memory", lambda device, needed=None: (2**30, replay.HOST))  # (a fake 1 GiB)
    with base.planned_timesteps(10**6, progress_bar=False):
        with pytest.raises(UserError, match=r"^A population of 2 members .* or give buffer_size [\d,]+ or less "
                                            r"\(buffer_size=(\d+)\)\.$") as info:
            Population(DQN, "BreakoutNoFrameskip-v4", seeds=[0, 1], buffer_size=100_000, num_envs=2)
        fits = int(info.value.args[0].rsplit("buffer_size=", 1)[1].rstrip(").").strip())
        Population(DQN, "BreakoutNoFrameskip-v4", seeds=[0, 1], buffer_size=fits, num_envs=2).check_fits(10**6)


def test_cli_refuses_a_member_replay_too_big_before_making_the_run_directory(tmp_path, monkeypatch, capsys):
    from rlspeed.buffers import replay

    # (a fake 256 KiB: the networks' weights fit, checked before anything is built; the members' replay does not)
    monkeypatch.setattr(replay, "available_memory", lambda device, needed=None: (2**18, replay.HOST))
    out = tmp_path / "run"
    argv = ["train", "dqn", "CartPole-v1", "--seeds", "0-1", "--total-timesteps", "5000", "--no-progress",
            "--out", str(out)]
    assert cli.main(argv) == 2
    assert "the largest buffer_size that fits is" in capsys.readouterr().err
    assert not out.exists()  # (nothing left behind that a rerun would have to --overwrite)


def test_member_replay_too_big_for_memory_is_refused_with_the_buffer_size_that_fits(monkeypatch):
    """The members' replay buffers are checked against the available memory before they are allocated (as a solo
    buffer is), in one sentence that names the buffer_size that fits; that size then allocates."""
    from rlspeed.buffers import replay
    from rlspeed.population import offpolicy

    budget = 64 * 2**20  # a fake 64 MiB of available host memory
    monkeypatch.setattr(replay, "available_memory", lambda device, needed=None: (budget, replay.HOST))
    gammas = torch.tensor([0.99, 0.99, 0.99])
    image = 4 * 84 * 84  # (a uint8 stack of four Atari frames, stored whole)
    with pytest.raises(UserError, match=r"3 members .* the largest buffer_size that fits is ([\d,]+)") as info:
        offpolicy.MemberReplay(10_000, 3, 2, image, 1, gammas, 1, torch.device("cpu"), obs_dtype=torch.uint8)
    fits = int(info.value.args[0].split("fits is ")[1].split(" ")[0].replace(",", ""))
    buffer = offpolicy.MemberReplay(fits // 2, 3, 2, image, 1, gammas, 1, torch.device("cpu"), obs_dtype=torch.uint8)
    assert 0 < buffer.step_bytes * buffer.capacity_steps <= 0.8 * budget and fits % 2 == 0
    assert buffer.obs.element_size() == 1
    with pytest.raises(UserError, match="need"):
        buffer.grow(fits // 2 + 1)
    buffer.keep(torch.tensor([0]))  # (two members leave: the one left's rows take a third of the bytes)
    buffer.grow(fits // 2 + 1)  # (room for one member's; refused for three above)
    assert buffer.capacity_steps == fits // 2 + 1


def test_fused_member_adam_steps_equal_the_flat_formula():
    """`_FlatMemberAdam` through torch's fused kernel member by member (members of `FUSED_ADAM_MIN_PARAMS` or more
    parameters, on CPU and CUDA) and through the flat formula give the same parameters and moments, with per-member
    learning rates, an annealed scale, and steps taken in parts (SAC's critics, then the rest)."""
    from rlspeed.population.offpolicy import FUSED_ADAM_MIN_PARAMS, _FlatMemberAdam

    generator = torch.Generator().manual_seed(0)
    shapes = [(3, 64, FUSED_ADAM_MIN_PARAMS // 64), (3, 1, 7), (3, 5, 5)]
    start = [torch.randn(shape, generator=generator) for shape in shapes]
    rates = torch.tensor([1e-3, 3e-4, 2e-3])
    adams, params = [], []
    for fused in (True, False):
        own = [p.clone() for p in start]
        adam = _FlatMemberAdam(own, rates, 1e-5)
        assert adam.fused
        adam.fused = fused
        adams.append(adam)
        params.append(own)
    critics = [slice(adams[0].offsets[1], adams[0].offsets[2])]
    rest = [slice(0, adams[0].offsets[1]), slice(adams[0].offsets[2], None)]
    for step in range(4):
        grad = torch.randn(adams[0].grad.shape, generator=generator)
        for adam in adams:
            adam.lr_scale = 1.0 - 0.2 * step
            adam.grad.copy_(grad)
            if step % 2:
                adam.step(critics)
                adam.step(rest, advance=False)
            else:
                adam.step()
    for a, b in zip([*params[0], adams[0].exp_avg, adams[0].exp_avg_sq],
                    [*params[1], adams[1].exp_avg, adams[1].exp_avg_sq]):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    assert not torch.allclose(params[0][0], start[0])


def _chain_env_id() -> str:
    """An env whose observation is (steps into the episode, episode number) and whose reward is the step's number
    (1, 2, ...); episodes end at step `end` (terminated; None: never) and at the 4-step time limit (truncated)."""
    import gymnasium as gym
    import numpy as np

    class Chain(gym.Env):
        observation_space = gym.spaces.Box(-1e3, 1e3, (2,), np.float32)
        action_space = gym.spaces.Discrete(2)

        def __init__(self, end=None):
            self.end, self.episode, self.t = end, -1, 0

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.episode, self.t = self.episode + 1, 0
            return np.array([0, self.episode], np.float32), {}

        def step(self, action):
            self.t += 1
            return np.array([self.t, self.episode], np.float32), float(self.t), self.t == self.end, False, {}

    if "RlspeedTest/Chain-v0" not in gym.registry:
        gym.register("RlspeedTest/Chain-v0", entry_point=Chain, max_episode_steps=4)
    return "RlspeedTest/Chain-v0"


@pytest.mark.parametrize("end", [None, 3])
def test_member_n_step_returns_stop_at_episode_ends_with_each_members_gamma(end):
    """3-step returns by hand, each member's with its own gamma: a time limit (step 4) cuts the sum and keeps the
    bootstrap from the true last observation, (4, episode); a termination (step 3) cuts both."""
    population = Population(DQN, _chain_env_id(), seeds=[0, 1], num_envs=1, n_step=3, learning_starts=10**6,
                            buffer_size=100, gamma=[0.5, 0.25], env_kwargs={"end": end}, env_backend="gymnasium")
    population.learn(12, progress_bar=False)
    buffer, length = population.buffer, end or 4
    assert buffer.written == 10  # (the last 2 steps wait for their third)
    for k, gamma in enumerate((0.5, 0.25)):
        for row in range(10):
            episode, t = divmod(row, length)
            steps = min(3, length - t)  # (the steps summed: up to the episode's end)
            assert buffer.obs[row, k, 0].tolist() == [t, episode]
            assert buffer.next_obs[row, k, 0].tolist() == [t + steps, episode]
            assert buffer.rewards[row, k, 0].item() == sum(gamma ** i * (t + 1 + i) for i in range(steps))
            assert buffer.discounts[row, k, 0].item() == gamma ** steps
            assert buffer.terminated[row, k, 0].item() == float(end is not None and t + steps == end)


def test_a_first_learn_refuses_member_replays_that_do_not_fit_before_it_builds_envs_or_writes(monkeypatch, tmp_path):
    """`Population(...)` from Python has no planned budget, so its replays were counted only as learn allocated them:
    after the members' envs were built and metrics.csv written. The first learn now refuses first, in the sentence
    `check_fits` gives the CLI."""
    from rlspeed.buffers import replay
    from rlspeed.population.base import PopulationBase

    population = Population(DQN, "CartPole-v1", seeds=[0, 1], env_backend="torch", buffer_size=100_000, **SMALL)

    def built(self):
        raise AssertionError("the envs were built")

    monkeypatch.setattr(PopulationBase, "_start_env", built)
    monkeypatch.setattr(replay, "available_memory", lambda device, needed=None: (2**20, replay.HOST))  # (a fake 1 MiB)
    with pytest.raises(UserError) as refused:
        population.learn(1_000_000, run_dir=tmp_path / "run")
    with pytest.raises(UserError) as said:
        population.check_fits(1_000_000)
    assert str(refused.value) == str(said.value) and "the largest buffer_size that fits is" in str(said.value)
    assert not (tmp_path / "run" / "metrics.csv").exists()
