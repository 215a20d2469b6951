"""One update-step interface: which implementation trains a model is decided in one place
(`rlspeed.algos.update.select_update`), shown in `summary.json` and `model.report()`, and a subclass that overrides
`_loss` trains with its own loss. (That a loaded model is built as a constructed one is: test_algorithm_contract.)"""

from __future__ import annotations

import sys

import pytest
import torch
from conftest import needs_torch_2_9, update_summaries

from rlspeed import A2C, DQN, PPO, SAC, TD3
from rlspeed.errors import UserError

CASES = [(PPO, "CartPole-v1", {}), (A2C, "CartPole-v1", {}), (DQN, "CartPole-v1", {"learning_starts": 64}),
         (SAC, "Pendulum-v1", {"learning_starts": 64})]


@pytest.mark.parametrize(("algo", "env_id", "config"), CASES, ids=lambda c: getattr(c, "__name__", None))
def test_default_cpu_update_is_hand_derived_and_falls_back_visibly(algo, env_id, config):
    def choice(summary):  # (A2C adds which forward passes its rollout runs: tests/test_fused_a2c.py)
        return {key: summary[key] for key in ("implementation", "reason")}

    model = algo(env_id, device="cpu", seed=0, **config)
    assert choice(model.update_summary()) == {"implementation": "hand-derived", "reason": "default on this device"}
    off = algo(env_id, device="cpu", seed=0, fused_update=False, **config)
    assert choice(off.update_summary()) == {"implementation": "autograd", "reason": "fused_update=false"}
    assert "autograd (fused_update=false)" in off.report()


@pytest.mark.parametrize(("algo", "env_id", "activation"), [
    (PPO, "CartPole-v1", "elu"), (PPO, "Pendulum-v1", "sigmoid"), (A2C, "CartPole-v1", "gelu"),
    (DQN, "CartPole-v1", "leaky_relu"), (SAC, "Pendulum-v1", "mish"), (SAC, "Pendulum-v1", "softplus")])
def test_a_network_the_hand_derived_update_does_not_cover_falls_back_to_autograd(algo, env_id, activation):
    """Every activation but tanh and relu trains by autograd, and update_summary (summary.json's `update`) names it
    in rlspeed's words (DQN's said "a Q-network that is not a tanh or relu MLP", SAC's "activation=...or a non-MLP
    network"); the names beyond elu and silu (SB3's LeakyReLU, GELU, Mish, ...) were refused."""
    choice = algo(env_id, device="cpu", activation=activation).update_summary()
    assert choice["implementation"] == "autograd"
    assert choice["reason"] == f"activation={activation} (the hand-derived update covers tanh and relu)"
    choice = DQN("CartPole-v1", device="cpu", dueling=True).update_summary()
    assert choice["implementation"] == "autograd" and "dueling" in choice["reason"]


@pytest.mark.parametrize(("algo", "env_id", "config"), CASES, ids=lambda c: getattr(c, "__name__", None))
def test_an_overridden_loss_trains_with_the_override(algo, env_id, config):
    """A subclass whose `_loss` is zero leaves the weights where they were (Adam and RMSprop on zero gradients do not
    move them), while the algorithm's own loss moves them: so the override, not the hand-derived update, ran. (SAC's
    losses are `_critic_loss` and `_actor_loss`: the subclass overrides both.)"""
    calls = []
    methods = ("_critic_loss", "_actor_loss") if algo is SAC else ("_loss",)

    def zero(method):
        def loss_fn(self, *batch):
            loss, metrics = getattr(super(ZeroLoss, self), method)(*batch)
            calls.append(1)
            return loss * 0.0, metrics
        return loss_fn

    ZeroLoss = type("ZeroLoss", (algo,), {method: zero(method) for method in methods})

    results = []
    steps = 128 if "learning_starts" in config else 1024  # off-policy: 64 steps of updates after learning_starts
    for cls in (algo, ZeroLoss):
        model = cls(env_id, device="cpu", seed=0, **config, **_small(config))
        before = [p.detach().clone() for p in model.policy.parameters()]
        model.learn(steps, progress_bar=False)
        results.append(max((p - b).abs().max().item() for p, b in zip(model.policy.parameters(), before)))
    override = ZeroLoss(env_id, device="cpu", seed=0, **config, **_small(config)).update_summary()
    assert override["implementation"] == "autograd"
    assert f"ZeroLoss.{methods[0]} overrides {algo.__name__}.{methods[0]}" in override["reason"]
    assert calls, "the overriding _loss was never called"
    assert results[0] > 0 and results[1] == 0.0, results


def test_a_network_subclass_with_its_own_forward_trains_with_autograd():
    """A subclass's _setup may put a network of its own class in place (CONTRIBUTING.md): DQN's and SAC's hand-derived
    updates compute rlspeed's networks, not its forward, and trained on reporting "hand-derived". Autograd trains it,
    and SAC's exploration calls the actor as a module (it read the original actor's layers)."""
    from rlspeed.nn import QNetwork, SquashedGaussianActor

    class HalfQ(QNetwork):
        def forward(self, obs):
            return 0.5 * super().forward(obs)

    class HalfQDQN(DQN):
        def _setup(self):
            super()._setup()
            self.q_network.__class__ = HalfQ
            self._update_step = self._make_update_step()

    choice = HalfQDQN("CartPole-v1", device="cpu", seed=0).update_summary()
    assert choice["implementation"] == "autograd" and "the Q-network is a HalfQ" in choice["reason"]

    calls = []

    class Counted(SquashedGaussianActor):
        def forward(self, obs):
            calls.append(1)
            return super().forward(obs)

    class CountedSAC(SAC):
        def _setup(self):
            super()._setup()
            self.actor = self.policy = Counted(self.spec.obs_dim, self.spec.action_dim, self.config.net_arch,
                                               self.config.activation).to(self.device)
            self._params = [*self.actor.parameters(), *self._critic_params, self.log_alpha]
            self.optimizer = torch.optim.Adam(self._params, lr=self.config.learning_rate)
            self._update_step = self._make_update_step()

    model = CountedSAC("Pendulum-v1", device="cpu", seed=0, learning_starts=16, batch_size=16, num_envs=1)
    assert model.update_summary()["implementation"] == "autograd"
    assert "the actor is a Counted" in model.update_summary()["reason"]
    model.learn(32, progress_bar=False)
    calls.clear()
    model._explore(torch.zeros(1, 3), model.num_timesteps)  # (an exploring step: the module's forward, once)
    assert len(calls) == 1


def test_optimizer_and_activation_overrides_that_would_be_ignored_are_refused():
    """An off-policy subclass's _make_optimizer was never called (they make their optimizer in _setup), and a class of
    one's own for `activation` was replaced by torch's of the same name: both silently trained something else."""
    with pytest.raises(TypeError, match="AdamWDQN._make_optimizer would never be called"):
        type("AdamWDQN", (DQN,), {"_make_optimizer": lambda self, params: torch.optim.AdamW(params)})

    class SGDDQN(DQN):  # (a _setup of its own that calls it, as the message says to do: taken)
        def _make_optimizer(self, params):
            return torch.optim.SGD(params, lr=1e-3)

        def _setup(self):
            super()._setup()
            self.optimizer = self._make_optimizer(self._params)
            self._update_step = self._make_update_step()

    assert type(SGDDQN("CartPole-v1", device="cpu").optimizer) is torch.optim.SGD

    class Tanh(torch.nn.Module):  # (LeCun's scaled tanh, named as torch's)
        def forward(self, x):
            return 1.7159 * torch.tanh(2 / 3 * x)

    with pytest.raises(UserError, match=r"'activation' takes a name, or torch's own class for it, not .*\.Tanh"):
        PPO("CartPole-v1", device="cpu", activation=Tanh)
    assert PPO("CartPole-v1", device="cpu", activation=torch.nn.Tanh).config.activation == "tanh"
    # (an instance, SB3's activation_fn written as a call: its class's name, not "Unknown activation 'ELU(...)'")
    with pytest.raises(UserError, match=r"not a module \(ELU\(alpha=2\.0\)\): give activation='elu' or torch\.nn\.ELU"):
        PPO("CartPole-v1", device="cpu", activation=torch.nn.ELU(alpha=2.0))
    with pytest.raises(UserError, match=r"give activation='leaky_relu' or torch\.nn\.LeakyReLU;"):
        PPO("CartPole-v1", device="cpu", activation=torch.nn.LeakyReLU(0.2))

    class NormalActionNoise:  # (SB3's class for TD3's action_noise: the choice's own message, not activation's)
        pass

    with pytest.raises(UserError, match="action_noise.* normal, ornstein-uhlenbeck, none"):
        TD3("Pendulum-v1", device="cpu", action_noise=NormalActionNoise)
    # an optimizer over some of the parameters: not the hand-derived update (its flat Adam failed to build)
    Partial = type("Partial", (PPO,), {"_make_optimizer": lambda self, params: torch.optim.Adam(params[2:])})
    choice = Partial("CartPole-v1", device="cpu").update_summary()
    assert choice["implementation"] == "autograd" and "the optimizer steps 4 of the model's 6" in choice["reason"]


def test_algorithms_without_a_hand_derived_update_say_so():
    assert TD3("Pendulum-v1", device="cpu").update_summary()["reason"] == "TD3 has no hand-derived update"
    assert TD3("Pendulum-v1", device="cpu").update_summary()["implementation"] == "autograd"


def test_summary_json_names_the_update_that_ran(tmp_path, monkeypatch):
    updates = update_summaries(tmp_path, monkeypatch, "ppo", 1024, {"hand": [], "gelu": ["--set", "activation=gelu"]})
    hand, gelu = updates["hand"], updates["gelu"]
    assert hand["implementation"] == "hand-derived"
    assert gelu["implementation"] == "autograd" and "activation=gelu" in gelu["reason"]


def test_load_leaves_the_global_random_state_alone(tmp_path):
    path = PPO("CartPole-v1", device="cpu", seed=3).save(tmp_path / "m.safetensors")
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    PPO.load(path, device="cpu")
    assert torch.equal(torch.rand(3), expected)


def test_an_accelerated_policy_still_gets_its_reason():
    """auto_accelerate swaps the policy's class for a subclass: the rule that decides must still see ActorCritic."""
    from rlspeed.accel import auto_accelerate
    from rlspeed.fused.ppo import unsupported_reason

    model = PPO("CartPole-v1", device="cpu")
    assert unsupported_reason(auto_accelerate(model.policy, device="cpu")) is None
    elu = PPO("CartPole-v1", device="cpu", activation="elu")
    assert "activation=elu" in unsupported_reason(auto_accelerate(elu.policy, device="cpu"))


def test_a_sac_subclass_with_its_own_loss_is_told_that_sac_no_longer_calls_it():
    """SAC's update is two steps (`_critic_loss`, then `_actor_loss`): a subclass overriding the `_loss` it had
    would silently train with SAC's own losses, so it is refused in one sentence."""
    class OldStyle(SAC):
        def _loss(self, *batch):
            raise AssertionError("never called")

    with pytest.raises(UserError, match="defines _loss, which SAC no longer calls") as error:
        OldStyle("Pendulum-v1", device="cpu", seed=0)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("algo", [PPO, pytest.param(A2C, marks=needs_torch_2_9)], ids=lambda c: c.__name__)
def test_loss_coefficients_a_callback_changes_apply_whichever_update_runs(algo):
    """ent_coef, vf_coef and normalize_advantage changed on model.config between iterations (a schedule in a
    callback) apply from the next update in the hand-derived update as in the autograd loss, which reads them at
    every step: both end with the same weights, and not with those of a run without the change."""
    def schedule(local):
        model = local["self"]
        if model.num_timesteps >= 256:
            model.config.ent_coef, model.config.vf_coef, model.config.normalize_advantage = 0.5, 0.1, False

    def trained(callback, **settings):
        model = algo("CartPole-v1", device="cpu", seed=0, num_envs=4, num_steps=32, **settings)
        model.learn(768, callback=callback, progress_bar=False)
        return torch.cat([p.detach().flatten() for p in model.policy.parameters()])

    hand_derived, reference = trained(schedule), trained(schedule, fused_update=False)
    torch.testing.assert_close(hand_derived, reference, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(hand_derived, trained(None), rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize(("make", "reason"), [
    (lambda params, lr: torch.optim.AdamW(params, lr=lr), "the optimizer is AdamW"),
    (lambda params, lr: torch.optim.SGD(params, lr=lr), "the optimizer is SGD"),
    (lambda params, lr: torch.optim.Adam(params, lr=lr, amsgrad=True), "amsgrad"),
    (lambda params, lr: type("MyAdam", (torch.optim.Adam,), {})(params, lr=lr), "the optimizer is MyAdam"),
])
def test_an_optimizer_the_hand_derived_update_does_not_step_trains_with_autograd(make, reason):
    """A subclass's `_make_optimizer` returning another optimizer (or Adam configured otherwise) trains with it:
    autograd, saying why; the hand-derived update steps plain torch.optim.Adam only (A2C: RMSprop)."""
    class OwnOptimizer(PPO):
        def _make_optimizer(self, params):
            return make(params, self.config.learning_rate)

    model = OwnOptimizer("CartPole-v1", device="cpu", seed=0, num_envs=4, num_steps=32)
    choice = model.update_summary()
    assert choice["implementation"] == "autograd" and reason in choice["reason"]
    before = [p.detach().clone() for p in model.policy.parameters()]
    steps = []
    original = model.optimizer.step
    model.optimizer.step = lambda *a, **k: steps.append(1) or original(*a, **k)
    model.learn(128, progress_bar=False)
    assert steps and any(not torch.equal(a, b) for a, b in zip(before, model.policy.parameters()))


def test_a_dqn_subclass_overriding_update_gets_the_documented_batch():
    """DQN's `_update(batch)` overridden in a subclass: autograd, whose batch holds every documented field (the
    hand-derived update's prepared batch holds others)."""
    seen = []

    class Logged(DQN):
        def _update(self, batch):
            seen.append(set(batch))
            return super()._update(batch)

    model = Logged("CartPole-v1", device="cpu", seed=0, learning_starts=64)
    assert model.update_summary()["implementation"] == "autograd"
    model.learn(256, progress_bar=False)
    assert seen and {"obs", "actions", "rewards", "next_obs"} <= seen[0]


@pytest.mark.parametrize("batch_size", [64, 128])  # (minibatches of the 128-step rollout, and the whole of it)
def test_an_overridden_ppo_loss_gets_the_advantages_as_gae_made_them(batch_size):
    """A subclass's `_loss` is given the rollout's advantages unnormalised, whether or not one minibatch covers the
    rollout (normalize_advantage is the loss's own step: the reference loss does it, an override may not)."""
    means = []

    class Recorded(PPO):
        def _loss(self, obs, actions, old_log_probs, old_values, advantages, *rest):
            means.append(float(advantages.mean()))
            return super()._loss(obs, actions, old_log_probs, old_values, advantages, *rest)

    Recorded("CartPole-v1", device="cpu", seed=0, num_envs=4, num_steps=32, batch_size=batch_size,
             n_epochs=1).learn(128, progress_bar=False)
    assert means and all(mean > 1.0 for mean in means)  # (untrained values: advantages near the returns, > 0)


def test_a_subclass_checkpoint_loaded_by_the_base_class_says_so(tmp_path):
    """Checkpoints record the class that saved them: loading or resuming a subclass's checkpoint with rlspeed's own
    class (whose loss, network or actions may differ) warns, naming the subclass; the subclass's own load does not,
    nor a subclass loading rlspeed's checkpoint (fine-tuning with its own loss)."""
    import warnings

    class FlipPPO(PPO):
        pass

    model = FlipPPO("CartPole-v1", device="cpu", seed=0, num_envs=4, num_steps=32)
    path = model.save(tmp_path / "flip")
    with pytest.warns(UserWarning, match=r"saved by .*FlipPPO.*use FlipPPO\.load"):
        PPO.load(path)
    with pytest.warns(UserWarning, match=r"saved by .*FlipPPO.*use FlipPPO\.resume"):
        PPO("CartPole-v1", device="cpu", num_envs=4, num_steps=32).resume(path)
    plain = PPO("CartPole-v1", device="cpu", seed=0, num_envs=4, num_steps=32).save(tmp_path / "plain")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        FlipPPO.load(path)
        FlipPPO.load(plain)


def test_a_subclass_gets_its_own_init_arguments_back_from_its_file_or_is_told_they_are_not_saved(tmp_path):
    """A subclass's own `__init__` arguments (`MyPPO(env, bonus=0.9)`) came back from `MyPPO.load` as their defaults,
    silently. They are saved as the class was called (whatever it keeps of them, under whatever name, also a name
    rlspeed's own attributes have, or a value it derives from them) and given back; a value given to load wins; a
    subclass of another signature and rlspeed's own class ignore them. One a file cannot hold (a function) is said
    once, when saved, unless it is the default."""
    import warnings

    class BonusPPO(PPO):
        def __init__(self, env, bonus_pct=50, scales=(1, 2), name="mine", reward_fn=None, clip=abs, **hyperparameters):
            super().__init__(env, **hyperparameters)
            # (derived values, and an argument named as rlspeed's `name` ("ppo") kept elsewhere)
            self.bonus_pct, self.scales, self.tag, self.reward_fn = bonus_pct / 100, list(scales) * 2, name, reward_fn

    model = BonusPPO("CartPole-v1", bonus_pct=90, scales=(3, 4), name="exp1", reward_fn=abs, device="cpu", seed=0,
                     num_envs=4, num_steps=32, batch_size=128)
    unsaved = r"argument reward_fn is not saved .*not a builtin_function_or_method.*load\(path, reward_fn=\.\.\.\)"
    with pytest.warns(UserWarning, match=unsaved) as said:
        path = model.save(tmp_path / "bonus")
    assert len(said) == 1  # (not `clip`: its default)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (said once)
        model.save(tmp_path / "again")
        loaded = BonusPPO.load(path)
    assert (loaded.bonus_pct, loaded.scales, loaded.tag, loaded.reward_fn) == (0.9, [3, 4, 3, 4], "exp1", None)
    assert loaded.name == "ppo" and loaded.config.batch_size == 128
    assert BonusPPO.load(path, bonus_pct=10).bonus_pct == 0.1
    resaved = BonusPPO.load(loaded.save(tmp_path / "resaved"))  # (a loaded model saves what it was loaded with)
    assert (resaved.bonus_pct, resaved.scales, resaved.tag) == (0.9, [3, 4, 3, 4], "exp1")
    with pytest.warns(UserWarning, match="saved by"):
        assert type(PPO.load(path)) is PPO


def test_double_q_a_callback_changes_applies_whichever_dqn_update_runs():
    """DQN's double_q changed on model.config mid-run reaches the hand-derived update as it reaches the autograd loss:
    both end with the same weights."""
    def switch(local):
        if local["self"].num_timesteps >= 256:
            local["self"].config.double_q = False

    def trained(**settings):
        model = DQN("CartPole-v1", device="cpu", seed=0, learning_starts=64, **settings)
        model.learn(768, callback=switch, progress_bar=False)
        return torch.cat([p.detach().flatten() for p in model.q_network.parameters()])

    torch.testing.assert_close(trained(), trained(fused_update=False), rtol=1e-4, atol=1e-5)


def _small(config: dict) -> dict:
    """Smaller networks and batches for the off-policy cases (SAC's default 256x256 critics on batches of 256), where
    the behaviour checked is which update runs and where it leaves the weights, not what they learn."""
    return {"net_arch": (32, 32), "batch_size": 32} if "learning_starts" in config else {}


@pytest.mark.parametrize(("algo", "env_id", "config"), CASES, ids=lambda c: getattr(c, "__name__", None))
def test_parameters_frozen_after_the_model_was_made_stay_where_they_are(algo, env_id, config):
    """A layer frozen with `requires_grad_(False)` (fine-tuning the rest) is left alone: the hand-derived update,
    which steps every parameter, gives way to autograd when learn starts, and update_summary says why."""
    model = algo(env_id, device="cpu", seed=0, **config, **_small(config))
    assert model.update_summary()["implementation"] == "hand-derived"
    frozen = next(model.policy.parameters())
    frozen.requires_grad_(False)
    before, others = frozen.detach().clone(), [p.detach().clone() for p in list(model.policy.parameters())[1:]]
    model.learn(128 if "learning_starts" in config else 1024, progress_bar=False)
    assert torch.equal(frozen, before)
    assert any(not torch.equal(p, b) for p, b in zip(list(model.policy.parameters())[1:], others))
    choice = model.update_summary()
    assert choice["implementation"] == "autograd" and "1 frozen parameter tensor(s)" in choice["reason"]


@pytest.mark.parametrize(("algo", "env_id", "config"), CASES, ids=lambda c: getattr(c, "__name__", None))
def test_a_layer_unfrozen_again_trains_with_the_hand_derived_update_as_autograd_would(algo, env_id, config):
    """Unfrozen again (fine-tuning done), the layer trains and the hand-derived update is chosen anew; the layer's
    optimizer steps lag the others' (Adam's bias correction counts them per parameter), which the hand-derived
    update's flat Adam follows: the weights end where the autograd reference's do."""
    steps = 128 if "learning_starts" in config else 1024

    def trained(**settings):
        model = algo(env_id, device="cpu", seed=0, **config, **_small(config), **settings)
        layer = next(model.policy.parameters())
        layer.requires_grad_(False)
        model.learn(steps, progress_bar=False)
        layer.requires_grad_(True)
        before = layer.detach().clone()
        model.learn(steps, progress_bar=False)
        assert not torch.equal(layer, before)
        return model

    model, reference = trained(), trained(fused_update=False)
    choice = model.update_summary()
    assert (choice["implementation"], choice["reason"]) == ("hand-derived", "default on this device")
    assert any(len({float(state["step"]) for state in optimizer.state.values()}) > 1
               for optimizer in model._optimizers().values())  # (the counts the flat Adam followed differ)
    for p, q in zip(model.policy.parameters(), reference.policy.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)


def test_a_layer_a_callback_freezes_after_a_warm_up_stays_where_it_is():
    """Freezing from a callback (`_on_rollout_end` once warmed up): the next updates leave the layer alone."""
    from rlspeed.callbacks import BaseCallback

    class FreezeAfterWarmUp(BaseCallback):
        frozen = None

        def _on_rollout_end(self) -> None:
            if self.frozen is None and self.model.num_timesteps >= 512:
                self.frozen = next(self.model.policy.parameters()).requires_grad_(False)
                self.before = self.frozen.detach().clone()

    callback = FreezeAfterWarmUp()
    model = PPO("CartPole-v1", device="cpu", seed=0, num_envs=4, num_steps=64, batch_size=128)
    model.learn(2048, progress_bar=False, callback=callback)
    assert callback.frozen is not None and torch.equal(callback.frozen, callback.before)
    assert model.update_summary()["implementation"] == "autograd"


@pytest.mark.parametrize(("algo", "env_id", "config"), [*CASES, (TD3, "Pendulum-v1", {"learning_starts": 64})],
                         ids=lambda c: getattr(c, "__name__", None))
def test_an_optimizer_put_in_place_after_the_update_step_was_made_is_the_one_that_steps(algo, env_id, config):
    """A subclass's `_setup` that replaces `self.optimizer` after `super()._setup()` (SGD with momentum here), and
    `model.optimizer = ...` before a learn, trained with the optimizer the update step was first made for (the
    hand-derived update's flat Adam, or autograd's old optimizer): the new one never stepped. The step is made again
    for it."""
    def sgd(model):
        params = [p for p in model._params if p.requires_grad] if algo is not TD3 else model._online_params
        return torch.optim.SGD(params, lr=1e-3, momentum=0.5)

    class OwnOptimizer(algo):
        def _setup(self):
            super()._setup()
            self.optimizer = sgd(self)

    settings = {"num_envs": 2, "num_steps": 16} if algo in (PPO, A2C) else {}
    settings["batch_size"] = 32 if algo is PPO else 16
    settings = {**settings, **config, "net_arch": [16]}
    if algo is A2C:  # (one step on the whole rollout: no batch_size)
        del settings["batch_size"]
    for model in (OwnOptimizer(env_id, device="cpu", seed=0, **settings),
                  algo(env_id, device="cpu", seed=0, **settings)):
        if type(model) is algo:
            model.optimizer = sgd(model)
        steps: list[int] = []
        original = model.optimizer.step
        model.optimizer.step = lambda *args, _steps=steps, _original=original, **kwargs: (
            _steps.append(1) or _original(*args, **kwargs))
        model.learn(96, progress_bar=False)
        assert steps, f"{type(model).__name__}: the SGD in place never stepped"
        assert algo is TD3 or "the optimizer is SGD" in model.update_summary()["reason"]
        assert model.optimizer.state and all("momentum_buffer" in state for state in model.optimizer.state.values())


@pytest.mark.parametrize("algo", [PPO, A2C], ids=lambda c: c.__name__)
def test_a_policy_with_a_layer_of_its_own_trains_with_autograd(algo):
    """A subclass's `_build_policy` that adds a layer to rlspeed's ActorCritic (an auxiliary head trained by its own
    loss, a callback, ...): the hand-derived update, which trains the actor's and critic's own layers only, failed to
    build (a ValueError from its flat optimizer); autograd trains it, saying why."""
    class WithAux(algo):
        def _build_policy(self):
            policy = super()._build_policy()
            policy.aux = torch.nn.Linear(4, 1)
            return policy

    model = WithAux("CartPole-v1", device="cpu", seed=0, num_envs=2, num_steps=16,
                    **({"batch_size": 32} if algo is PPO else {}))
    choice = model.update_summary()
    assert choice["implementation"] == "autograd" and "aux.weight, aux.bias" in choice["reason"]
    model.learn(32, progress_bar=False)


def test_networks_with_layers_of_their_own_are_outside_the_off_policy_hand_derived_updates():
    from rlspeed.fused import dqn as fused_dqn
    from rlspeed.fused import sac as fused_sac

    dqn, sac = DQN("CartPole-v1", device="cpu"), SAC("Pendulum-v1", device="cpu")
    assert fused_dqn.unsupported_reason(dqn.q_network) is None
    assert fused_sac.unsupported_reason(sac.actor, sac.critic) is None
    dqn.q_network.extra = torch.nn.Linear(2, 2)
    sac.critic.extra = torch.nn.Linear(2, 2)
    assert "Q-network holds parameters" in fused_dqn.unsupported_reason(dqn.q_network)
    assert "critic holds parameters" in fused_sac.unsupported_reason(sac.actor, sac.critic)


def test_a_q_network_a_subclass_puts_in_place_chooses_the_actions_it_collects_with():
    """DQN collects with the Q-network's layers as bare kernels (a plain MLP, once per env step), taken when the
    model was made: a Q-network a subclass's `_setup` put in place after `super()._setup()` (a subclass of QNetwork
    with its own forward, here one that always prefers action 0) never chose an action; the untrained network built
    first did. Collection calls the network in place, through its forward."""
    from rlspeed.algos.off_policy import frozen_copy
    from rlspeed.nn import QNetwork

    class PreferLeft(QNetwork):
        def forward(self, obs):
            return super().forward(obs) + torch.tensor([100.0, 0.0])

    class PreferLeftDQN(DQN):
        def _setup(self):
            super()._setup()
            cfg, spec = self.config, self.spec
            self.q_network = self.policy = PreferLeft(spec.obs_dim, spec.action_dim, cfg.net_arch, cfg.activation)
            self.q_target = frozen_copy(self.q_network, self, ("q_network", "q_target"))
            self._params, self._target_params = list(self.q_network.parameters()), list(self.q_target.parameters())
            self.optimizer = torch.optim.Adam(self._params, lr=cfg.learning_rate)
            self._update_step = self._make_update_step()

    model = PreferLeftDQN("CartPole-v1", device="cpu", seed=0, learning_starts=0, exploration_initial_eps=0.0,
                          exploration_final_eps=0.0, net_arch=[16])
    actions = []
    explore = model._explore
    model._explore = lambda obs, timesteps, *masks: actions.append(explore(obs, timesteps, *masks)) or actions[-1]
    model.learn(64, progress_bar=False)
    assert actions and all(int(action) == 0 for action in torch.cat(actions))


def test_parameter_lists_left_from_a_network_a_subclass_replaced_are_one_sentence():
    """A `_setup` that puts a Q-network, its target and an optimizer in place after `super()._setup()` but leaves
    `_params` and `_target_params` as they were: the update clipped the replaced network's gradients (none) and the
    target update moved the replaced target, so the target in place never followed, silently. learn refuses it."""
    from rlspeed.algos.off_policy import frozen_copy
    from rlspeed.nn import QNetwork

    class Replaced(DQN):
        def _setup(self):
            super()._setup()
            cfg, spec = self.config, self.spec
            self.q_network = self.policy = QNetwork(spec.obs_dim, spec.action_dim, [16], cfg.activation)
            self.q_target = frozen_copy(self.q_network, self, ("q_network", "q_target"))
            self.optimizer = torch.optim.Adam(self.q_network.parameters(), lr=cfg.learning_rate)

    model = Replaced("CartPole-v1", device="cpu", seed=0, learning_starts=16, batch_size=16)
    with pytest.raises(UserError, match=r"Replaced\._params holds parameters of a network the model no longer has.*"
                                        r"set self\._params again") as error:
        model.learn(32, progress_bar=False)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("algo", [PPO, pytest.param(A2C, marks=needs_torch_2_9)], ids=lambda c: c.__name__)
def test_a_step_a_subclass_takes_with_the_optimizer_itself_counts_once(algo):
    """A subclass's update that also steps `self.optimizer` itself (an auxiliary value phase after each rollout, as
    Phasic Policy Gradient's) while the hand-derived update trains: torch's optimizer advanced the step count all
    parameters shared once per parameter (6 per call), so every later bias correction ran ahead and the weights
    drifted from the autograd run's. Each parameter has its count, as in torch's optimizer."""
    class AuxiliaryPhase(algo):
        def _update_rollout(self, buf, advantages, returns):
            metrics = super()._update_rollout(buf, advantages, returns)
            loss = (self.policy.value(buf.obs.flatten(0, 1)) - returns.flatten()).square().mean()
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            return metrics

    def trained(fused_update):
        model = AuxiliaryPhase("CartPole-v1", device="cpu", seed=0, num_envs=4, num_steps=32,
                               fused_update=fused_update, **({"batch_size": 64, "n_epochs": 2} if algo is PPO else {}))
        model.learn(384, progress_bar=False)
        steps = {float(state["step"]) for state in model.optimizer.state.values()}
        return torch.cat([p.detach().flatten() for p in model.policy.parameters()]), steps

    (hand_derived, steps), (reference, reference_steps) = trained(True), trained(False)
    assert steps == reference_steps == {3 * (4 if algo is PPO else 1) + 3}
    torch.testing.assert_close(hand_derived, reference, rtol=1e-4, atol=1e-6)


def test_a_subclass_checkpoint_with_settings_of_its_own_names_the_class_that_loads_it(tmp_path):
    """A subclass whose config adds a hyperparameter (docs/algorithms.md: 'make them hyperparameters of a config
    subclass'): rlspeed's own class loading its file blamed a newer rlspeed or edited metadata. It names the subclass
    that saved it and how to load it, in one sentence (and no warning first); the subclass loads it."""
    import dataclasses

    from rlspeed.algos.ppo import PPOConfig

    @dataclasses.dataclass
    class KLConfig(PPOConfig):
        kl_coef: float = 0.1

    class KLPPO(PPO):
        config_cls = KLConfig

    path = KLPPO("CartPole-v1", device="cpu", seed=0, kl_coef=0.5, num_envs=2, num_steps=16, batch_size=32).save(
        tmp_path / "kl")
    with pytest.raises(UserError, match=r"saved by .*KLPPO, whose settings PPO\.load does not have \(kl_coef\): load "
                                        r"it with KLPPO\.load") as error:
        PPO.load(path)
    assert "\n" not in str(error.value)
    assert KLPPO.load(path).config.kl_coef == 0.5


@pytest.fixture
def dynamo_not_imported(monkeypatch):
    """rlspeed.nn as in a fresh process, where torch._dynamo is not imported (this one's tests import it)."""
    import rlspeed.nn

    monkeypatch.setattr(rlspeed.nn, "_dynamo_imported", lambda: False)
    rlspeed.nn._wrapper_code.cache_clear()
    rlspeed.nn._STEPS_WITHOUT_DYNAMO.clear()  # (each step class's reading of torch's wrappers: as this test's torch)
    yield
    rlspeed.nn._wrapper_code.cache_clear()
    rlspeed.nn._STEPS_WITHOUT_DYNAMO.clear()


def _adam_pair(**options):
    """Two Adams over equal parameters with equal gradients."""
    torch.manual_seed(0)
    weights = [torch.randn(3, 2), torch.randn(2)]
    pairs = []
    for _ in range(2):
        params = [torch.nn.Parameter(weight.clone()) for weight in weights]
        for param in params:
            param.grad = torch.ones_like(param)
        pairs.append((params, torch.optim.Adam(params, lr=0.1, **options)))
    return pairs


@pytest.mark.parametrize("options", [{}, {"fused": True}, {"foreach": True}], ids=["default", "fused", "foreach"])
def test_the_optimizer_step_without_dynamo_is_torchs_step(dynamo_not_imported, options):
    """The autograd update's optimizer step without torch._dynamo's import (a fresh process's TD3, DDPG,
    RecurrentPPO) moves the parameters as torch's step does, runs the optimizer's step hooks, and leaves the grad
    mode as it was."""
    from rlspeed.nn import step_without_dynamo, steps_without_dynamo, zero_grad_without_dynamo

    (reference, torch_adam), (params, adam) = _adam_pair(**options)
    hooks = []
    adam.register_step_pre_hook(lambda *_: hooks.append("pre"))
    adam.register_step_post_hook(lambda *_: hooks.append("post"))
    assert steps_without_dynamo(adam)
    for _ in range(2):
        torch_adam.step()
        step_without_dynamo(adam)
        assert torch.is_grad_enabled()
    assert hooks == ["pre", "post"] * 2
    assert all(torch.equal(a, b) for a, b in zip(reference, params, strict=True))
    zero_grad_without_dynamo(adam)
    assert all(param.grad is None for param in params)


def test_a_torch_that_wraps_optimizer_methods_otherwise_steps_them_as_it_made_them(dynamo_not_imported,
                                                                                   monkeypatch):
    """Where a torch release has none of the private wrappers rlspeed reaches around (`torch._disable_dynamo`,
    `_use_grad_for_differentiable`, the `__dynamo_disable` attribute), optimizers are built and stepped as that torch
    makes them (importing torch._dynamo, as before) and an autograd update says it imports it: the same updates."""
    from rlspeed.nn import (
        optimizers_without_dynamo,
        step_without_dynamo,
        steps_without_dynamo,
        zero_grad_without_dynamo,
    )

    monkeypatch.delattr(sys.modules["torch.optim.optimizer"], "_use_grad_for_differentiable")
    assert not steps_without_dynamo(_adam_pair()[1][1])  # (its step alone wrapped otherwise)
    monkeypatch.delattr(torch, "_disable_dynamo")
    add_param_group = torch.optim.Optimizer.add_param_group
    monkeypatch.setattr(torch.optim.Optimizer, "add_param_group", lambda self, group: add_param_group(self, group))
    (reference, torch_adam), (params, adam) = _adam_pair()
    with optimizers_without_dynamo():
        rebuilt = torch.optim.Adam(params, lr=0.1)
    assert rebuilt.param_groups[0]["params"] == params
    assert not steps_without_dynamo(adam)
    torch_adam.step()
    step_without_dynamo(adam)
    assert all(torch.equal(a, b) for a, b in zip(reference, params, strict=True))
    zero_grad_without_dynamo(adam)
    assert all(param.grad is None for param in params)
    model = TD3("Pendulum-v1", device="cpu", seed=0, net_arch=[8])
    assert model.update_summary()["implementation"] == "autograd" and model._update_step.imports_dynamo


def test_optimizers_without_dynamo_leaves_torchs_wrappers_as_they_were(dynamo_not_imported, monkeypatch):
    """The process-wide window `optimizers_without_dynamo` opens on torch's optimizer methods closes as the block
    ends, also where it raises: a user's own optimizer made after it (and compiled) has torch's wrappers."""
    from rlspeed.nn import _DYNAMO_DISABLED_OPTIMIZER_METHODS, optimizers_without_dynamo

    methods = [getattr(torch.optim.Optimizer, name).__wrapped__ for name in _DYNAMO_DISABLED_OPTIMIZER_METHODS]
    for method in methods:
        monkeypatch.delattr(method, "__dynamo_disable", raising=False)
    with pytest.raises(RuntimeError, match="inside"), optimizers_without_dynamo():
        torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))]).state_dict()
        assert all(vars(method)["__dynamo_disable"] is method for method in methods)
        raise RuntimeError("inside")
    assert not any("__dynamo_disable" in vars(method) for method in methods)


def test_only_the_updates_that_compile_or_capture_have_torch_dynamo_imported_before_learn(dynamo_not_imported):
    """A fresh process imports torch._dynamo apart, before learn (whose frame the import would keep), for an update
    that compiles or captures (`accelerate_step`'s, as `--accelerate auto` makes for an autograd update); never for
    the hand-derived or fp32 eager autograd ones."""
    from rlspeed.algos.update import AUTOGRAD, UpdateChoice, UpdateStep

    def imports_dynamo(algo):
        model = algo("Pendulum-v1", device="cpu", seed=0, net_arch=[8])
        return {model.update_summary()["implementation"]: model._update_step.imports_dynamo}

    assert imports_dynamo(SAC) == {"hand-derived": False}
    assert imports_dynamo(TD3) == {"autograd": False}
    accelerated = UpdateStep(lambda *batch: None, UpdateChoice(AUTOGRAD, "--accelerate auto"))
    assert accelerated.imports_dynamo


def test_an_optimizer_subclass_with_its_own_step_is_stepped_as_it_made_it(dynamo_not_imported):
    """An optimizer subclass's own `step` (which may call torch's, importing torch._dynamo) is called as it is, and
    the update says it imports torch._dynamo; a subclass that keeps torch's step is stepped without the import."""
    from rlspeed.nn import step_without_dynamo, steps_without_dynamo

    calls = []

    class CountingAdam(torch.optim.Adam):
        @sys.modules["torch.optim.optimizer"]._use_grad_for_differentiable  # (as torch's own steps are wrapped)
        def step(self, closure=None):
            calls.append(1)
            return super().step(closure)

    class PlainAdam(torch.optim.Adam):
        pass

    params = [torch.nn.Parameter(torch.zeros(2))]
    counting = CountingAdam(params, lr=0.1)
    assert not steps_without_dynamo(counting) and steps_without_dynamo(PlainAdam(params, lr=0.1))
    step_without_dynamo(counting)
    assert calls == [1]


def test_an_optimizer_with_a_learning_rate_scheduler_is_stepped_as_the_scheduler_counts_it(dynamo_not_imported):
    """A learning-rate scheduler a user attaches to a model's optimizer replaces its `step` with one that counts the
    steps: the step without torch._dynamo's import calls that one, so the scheduler sees the optimizer stepped (no
    "lr_scheduler.step() before optimizer.step()" warning) and moves the rate as torch's step would."""
    import warnings

    from rlspeed.nn import step_without_dynamo, steps_without_dynamo, zero_grad_without_dynamo

    params, adam = _adam_pair()[1]
    scheduler = torch.optim.lr_scheduler.StepLR(adam, step_size=1, gamma=0.5)
    assert not steps_without_dynamo(adam)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (the scheduler's warning where it saw no step)
        step_without_dynamo(adam)
        scheduler.step()
    assert adam.param_groups[0]["lr"] == 0.05
    zero_grad_without_dynamo(adam)
    assert all(param.grad is None for param in params)
