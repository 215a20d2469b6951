"""A2C populations (rlspeed.population.a2c): members are solo A2C runs (initial weights, first updates, native and
Gymnasium envs, RMSprop and Adam), per-member hyperparameters apply, the hand-derived update equals autograd of the
members' A2C loss, a diverging member is dropped, members leave on target or pruning, and the CLI trains one."""

import json

import pytest
import torch
from conftest import (
    assert_a_diverging_member_is_dropped,
    assert_member_is_its_solo_run,
    assert_pruned_member_matches_reruns,
    masked_vector_env_id,
    needs_atari,
    needs_minatar,
    random_population_batch,
)

from rlspeed import A2C, cli
from rlspeed.errors import UserError
from rlspeed.population import PER_MEMBER_A2C, A2CPopulation, Population

# small and quick: 4 envs x 5 steps (A2C's default rollout), RMSprop at SB3's default learning rate
SMALL = {"num_envs": 4, "num_steps": 5}
ROLLOUT = SMALL["num_envs"] * SMALL["num_steps"]
PENDULUM = ("Pendulum-v1", "torch", {})


def _solo_states(seed: int, iterations: int, env_id: str = "CartPole-v1", env_backend: str = "torch",
                 **hyper) -> tuple[dict, dict]:
    config = {**SMALL, **hyper}
    solo = A2C(env_id, seed=seed, env_backend=env_backend, **config)
    initial = {name: value.detach().clone() for name, value in solo.policy.state_dict().items()}
    solo.learn(iterations * config["num_envs"] * config["num_steps"], progress_bar=False)
    return initial, solo.policy.state_dict()


def _train(population, iterations: int) -> None:
    # (as learn sets it: the end of an annealed schedule)
    population._total_timesteps = iterations * population.config.num_envs * population.config.num_steps
    for _ in range(iterations):
        population.train_iteration()


@pytest.mark.parametrize("env_id, backend, hyper", [
    ("CartPole-v1", "torch", {}),
    PENDULUM,  # (Gaussian: log_std, actions clipped to the Box for the env, stored as sampled)
    ("CartPole-v1", "gymnasium", {}),
    ("CartPole-v1", "torch", {"use_rms_prop": False, "anneal_lr": True}),  # (Adam, learning rate annealed)
    ("CartPole-v1", "torch", {"fused_update": False}),  # (the solo samples step by step through its policy module)
    ("Taxi-v4", "gymnasium", {}),  # (one-hot observations, action masks: step-by-step masked draws, autograd)
    ("masked", "gymnasium", {}),  # (masks on float vectors: the masks alone switch draws and update)
    # (each member's own CNN: step-by-step draws, autograd)
    pytest.param("MinAtar/Breakout-v1", "gymnasium", {}, marks=needs_minatar),
    # (an Atari game: the solo's preprocessed envs and training transforms, each member's own Nature CNN; one env
    # per member, as each Atari env is a ROM load)
    pytest.param("BreakoutNoFrameskip-v4", "gymnasium", {"num_envs": 1}, marks=needs_atari),
])
def test_members_start_and_update_as_solo_runs(env_id, backend, hyper):
    seeds = [3, 7]
    masked = env_id == "masked"
    env_id = masked_vector_env_id() if masked else env_id
    population = Population(A2C, env_id, seeds=seeds, env_backend=backend, **{**SMALL, **hyper})
    assert isinstance(population, A2CPopulation)
    initial = [population.member_state(k) for k in range(2)]
    # (the members' convolutions are one grouped convolution, summing in another order than the solo's: after a few
    # updates a ReLU whose input is within rounding of zero can fall on the other side in one of them, which moves
    # that unit's weights by about 1e-4 (seed 7's third iteration here): the CNN case checks two iterations; the Nature
    # CNN's ~2M ReLUs per batch, the first update)
    iterations = 2 if env_id.startswith("MinAtar") else 1 if env_id == "BreakoutNoFrameskip-v4" else 3
    _train(population, iterations)
    # (autograd where the solo run takes it: fused_update=False, or an encoder and masks, Taxi's)
    expected = "autograd" if hyper.get("fused_update") is False or masked \
        or env_id in ("Taxi-v4", "MinAtar/Breakout-v1", "BreakoutNoFrameskip-v4") else "hand-derived"
    assert population.update_path == expected
    for k, seed in enumerate(seeds):
        solo_initial, solo_trained = _solo_states(seed, iterations, env_id=env_id, env_backend=backend, **hyper)
        assert_member_is_its_solo_run(initial[k], population.member_state(k), solo_initial, solo_trained)


def test_every_per_member_hyperparameter_reaches_its_member():
    """Member k with its own value of every per-member hyperparameter equals the solo run with those values."""
    per_member = {"learning_rate": [7e-4, 3e-3, 1e-4], "gamma": [0.99, 0.9, 0.95], "gae_lambda": [1.0, 0.8, 0.9],
                  "ent_coef": [0.0, 0.01, 0.05], "vf_coef": [0.5, 1.0, 0.25], "max_grad_norm": [0.5, 0.1, 2.0],
                  "rms_prop_eps": [1e-5, 1e-2, 1e-8]}
    assert set(per_member) == set(PER_MEMBER_A2C)
    seeds = [3, 7, 11]
    population = Population(A2C, "CartPole-v1", seeds=seeds, normalize_advantage=True, **SMALL, **per_member)
    _train(population, 3)
    for k, seed in enumerate(seeds):
        _, solo_trained = _solo_states(seed, 3, normalize_advantage=True,
                                       **{key: values[k] for key, values in per_member.items()})
        trained = population.member_state(k)
        for name, value in solo_trained.items():
            torch.testing.assert_close(trained[name], value, atol=1e-5, rtol=0)


def test_per_member_learning_rate_applies():
    # (the config refuses learning_rate=0): RMSprop moves a weight by up to ~10x the learning rate per step
    population = Population(A2C, "CartPole-v1", seeds=[0, 1, 2], learning_rate=[1e-3, 1e-9, 1e-3], **SMALL)
    before = [population.member_state(k) for k in range(3)]
    _train(population, 2)
    after = [population.member_state(k) for k in range(3)]
    moved = [max((after[k][name] - before[k][name]).abs().max().item() for name in before[k]) for k in range(3)]
    assert moved[1] < 1e-6 and moved[0] > 1e-3 and moved[2] > 1e-3


@pytest.mark.parametrize("env_id, hyper", [
    ("CartPole-v1", {"ent_coef": [0.0, 0.05], "vf_coef": [0.5, 1.0]}),
    ("Pendulum-v1", {"ent_coef": [0.0, 0.01], "vf_coef": [0.25, 0.5]}),
])
def test_hand_derived_gradient_equals_autograd(env_id, hyper):
    """The hand-derived gradient is autograd's of the sum of the members' A2C loss, per-member coefficients
    included (categorical and Gaussian policies)."""
    population = Population(A2C, env_id, seeds=[0, 1], **SMALL, **hyper)
    generator = torch.Generator().manual_seed(0)
    size, batch = 2, 20
    obs, out, values, actions = random_population_batch(population, batch, generator)
    rollout = (obs, actions, torch.randn(size, batch, generator=generator),
               values + torch.randn(size, batch, generator=generator))
    reference = torch.autograd.grad(population._loss(*rollout).sum(), population.params)
    for hand, auto in zip(population._hand_gradients(*rollout), reference):
        assert auto.abs().max() > 0
        torch.testing.assert_close(hand, auto, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_hand_derived_updates_follow_autograd_step_by_step(env_id):
    """The same population trained with the hand-derived update and with autograd of `_loss` (RMSprop, per-member
    rates) holds the same parameters after each of several iterations."""
    hyper = {**SMALL, "learning_rate": [7e-4, 2e-3], "ent_coef": [0.0, 0.01]}
    hand = Population(A2C, env_id, seeds=[4, 5], **hyper)
    auto = Population(A2C, env_id, seeds=[4, 5], **hyper)
    auto.update_path = "autograd"
    for population in (hand, auto):
        population._total_timesteps = 4 * ROLLOUT
    for _ in range(4):
        hand.train_iteration()
        auto.train_iteration()
        for k in range(2):
            mine, theirs = hand.member_state(k), auto.member_state(k)
            for name, value in theirs.items():
                torch.testing.assert_close(mine[name], value, atol=1e-5, rtol=0)


def test_diverging_member_is_dropped_and_the_others_are_untouched():
    assert_a_diverging_member_is_dropped(A2C, SMALL, learning_rate=7e-4, steps=120, eval_freq=40)


@pytest.mark.parametrize("env_id, backend, hyper", [("CartPole-v1", "torch", {}), ("CartPole-v1", "gymnasium", {}),
                                                    PENDULUM])
def test_pruned_member_leaves_and_the_others_train_on(env_id, backend, hyper):
    def on_eval(steps, means):
        return [1] if steps == 40 else None

    population = Population(A2C, env_id, seeds=[0, 1, 2], env_backend=backend, **SMALL, **hyper)
    summary = population.learn(120, eval_freq=40, eval_episodes=2, on_eval=on_eval)
    assert summary["members"][1]["pruned_at"] == 40 and summary["pruned"] == 1 and summary["algo"] == "a2c"
    assert population.alive == [0, 2] and population.weights[0].shape[0] == 2
    assert_pruned_member_matches_reruns(population, A2C, env_id, 120, 40, env_backend=backend, **SMALL, **hyper)


def test_members_reaching_the_target_leave():
    population = Population(A2C, "CartPole-v1", seeds=[0, 1], **SMALL)
    summary = population.learn(400, target_return=1.0, eval_freq=40, eval_episodes=2)
    assert summary["reached"] == 2 and population.alive == [] and population.num_timesteps == 40
    assert [m["steps_to_target"] for m in summary["members"]] == [40, 40]


@pytest.mark.parametrize("hyper, words", [
    ({"clip_range": 0.2}, "no ratio clipping"),
    ({"num_steps": [5, 10]}, "'num_steps' cannot differ"),
    ({"use_rms_prop": [True, False]}, "'use_rms_prop' cannot differ"),
    ({"rms_prop_eps": [1e-5]}, "1 per-member values"),
])
def test_bad_inputs_are_one_sentence(hyper, words):
    with pytest.raises(UserError, match=words):
        Population(A2C, "CartPole-v1", seeds=[0, 1], **{**SMALL, **hyper})


def test_cli_trains_an_a2c_population(tmp_path):
    out = tmp_path / "run"
    argv = ["train", "a2c", "CartPole-v1", "--seeds", "0-2", "--set", "num_envs=4",
            "--set", "rms_prop_eps=1e-5,1e-3,1e-2", "--total-timesteps", "80", "--eval-freq", "40",
            "--target-return", "1000", "--out", str(out)]
    assert cli.main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["algo"] == "a2c" and summary["population"] == 3
    # (the shape of a single run's `update`: the implementation and the rule that chose it)
    assert set(summary["update"]) == {"implementation", "reason"}
    assert summary["update"]["implementation"] == "hand-derived" and "default" in summary["update"]["reason"]
    assert [m["hyperparameters"]["rms_prop_eps"] for m in summary["members"]] == pytest.approx([1e-5, 1e-3, 1e-2])
    assert [[step for step, _ in m["curve"]] for m in summary["members"]] == [[40, 80]] * 3


def test_a_population_rollout_that_would_not_fit_is_refused_naming_the_num_steps_that_fits(monkeypatch):
    """A population's rollout went to the allocator whatever its size (num_steps=1e6 x num_envs 1,024 for 4 members:
    a RuntimeError from torch's allocator, or the kernel's OOM killer where each tensor alone fitted), where a solo
    rollout is refused in one sentence: the members' rollout is too, naming the num_steps that fits."""
    import re

    from rlspeed.buffers import replay
    from rlspeed.population import base

    # (0.8 MiB may go)
    monkeypatch.setattr(replay, "available_memory", lambda device, needed=None: (2**20, replay.HOST))
    monkeypatch.setattr(base, "check_members_fit", lambda *args: None)  # (the members' own estimate, with networks)
    population = Population(A2C, "CartPole-v1", seeds=[0, 1], num_envs=4, num_steps=10**9, env_backend="torch")
    with pytest.raises(UserError, match=r"^The rollout of 2 members of num_steps 1,000,000,000 x num_envs 4 steps "
                                        r"needs about .* GiB, more than the 0\.8 MiB it may take \(80% of the "
                                        r"1\.0 MiB of available host memory\); lower num_steps or "
                                        r"num_envs, or train fewer members at once; with num_envs 4 and 2 members, "
                                        r"num_steps up to [\d,]+ fits \(num_steps=(\d+), on the command line --set "
                                        r"num_steps=\1\)\.$") as refused:
        population.learn(10**9, progress_bar=False)
    steps = int(re.search(r"num_steps=(\d+)", str(refused.value)).group(1))
    with pytest.raises(UserError, match="lower num_steps or num_envs"):
        Population(A2C, "CartPole-v1", seeds=[0, 1], num_envs=4, num_steps=steps + 1,
                   env_backend="torch").learn(4 * (steps + 1), progress_bar=False)
    fitting = Population(A2C, "CartPole-v1", seeds=[0, 1], num_envs=4, num_steps=steps, env_backend="torch")
    assert fitting.learn(4 * steps, eval_episodes=1, progress_bar=False)["total_timesteps"] == 4 * steps


def test_a_population_rollout_that_would_not_fit_is_refused_before_the_run_directory(monkeypatch, tmp_path, capsys):
    """rlspeed train --seeds checks what a population allocates when it starts before it makes the run directory
    (`check_fits`): a rollout refused for its memory left config.yaml behind, and the next try was told --overwrite."""
    from rlspeed import cli
    from rlspeed.buffers import replay

    # (0.8 MiB may go)
    monkeypatch.setattr(replay, "available_memory", lambda device, needed=None: (2**20, replay.HOST))
    out = tmp_path / "run"
    for algo in ("ppo", "a2c"):
        assert cli.main(["train", algo, "CartPole-v1", "--seeds", "0-1", "--env-backend", "torch", "--num-envs", "4",
                         "--set", "num_steps=102400", "--out", str(out), "--no-progress"]) == 2
        assert "num_steps up to" in capsys.readouterr().err and not out.exists()
