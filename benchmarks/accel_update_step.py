"""What `rlspeed.accelerate_step` / `auto_accelerate` buy: plain fp32 eager against accelerated, in one process.

(a) A SAC update step (Haarnoja et al., 2018) as a user would write it: batch 256, actor and twin critics with
    [256, 256] ReLU MLPs, target critics, learned temperature, Adam (PyTorch defaults) for each, Polyak averaging.
    Variants, timed in interleaved repetitions (plain, accelerated, ... then again):
      plain        the update written with zero_grad / backward / step, fp32 eager;
      step-fp32    the same losses through accelerate_step(precision="fp32", compile=False): only what the step
                   wrapper does without changing precision (fused Adam, gradients only for the optimizer's params);
      accelerated  the same losses through accelerate_step(...) with precision/compile "auto": the strategy search
                   picks (bf16 matmuls or bf16 autocast on a CPU with AVX512-BF16/AMX, if it measures faster and
                   stays accurate); on CUDA each step is also captured and replayed as a whole-step CUDA graph;
      no-graphs    (CUDA only) as accelerated, with graphs=False: what the graph capture adds.
    On a CPU a profiled pass then measures each variant's time inside matrix products, and the README table
    gives the speed-up over plain each variant would reach if those products cost nothing.
(b) A tiny model where nothing should help: the [64, 64] tanh actor-critic of PPO on CartPole. `auto` must keep
    eager fp32 and cost < 5%: a PPO minibatch update (64 rows) through accelerate_step, and a rollout forward
    (8 rows, no_grad) through auto_accelerate, each against the plain version.

The minimal SAC update here is this benchmark's own (rlspeed's SAC lives in src/rlspeed/algos/sac.py). The
strategy cache is pointed at a fresh temporary directory, so the search runs (and is timed) in every run.
Usage: python benchmarks/accel_update_step.py [--quick] [--reps N] [--threads N] [--device D] [--no-write]
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import statistics
import time
from collections.abc import Callable

import common
import torch
from torch import nn

from rlspeed.accel import accelerate_step, auto_accelerate
from rlspeed.device import resolve_device, synchronize

TARGET_SPEEDUP = 2.5
TINY_OVERHEAD_LIMIT = 0.05


# --- (a) SAC --------------------------------------------------------------------------------------------------------
def mlp(in_dim: int, hidden: int, out_dim: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, out_dim))


class Actor(nn.Module):
    """Squashed Gaussian policy: a = tanh(mean + std * eps)."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: int):
        super().__init__()
        self.net = mlp(obs_dim, hidden, 2 * action_dim)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, log_std = self.net(obs).chunk(2, dim=-1)
        log_std = log_std.clamp(-5.0, 2.0)
        std = log_std.exp()
        pre_tanh = mean + std * torch.randn_like(mean)
        action = torch.tanh(pre_tanh)
        log_prob = (-0.5 * ((pre_tanh - mean) / std).square() - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        log_prob = log_prob - torch.log(1 - action.square() + 1e-6).sum(-1)
        return action, log_prob


class QNet(nn.Module):
    def __init__(self, obs_dim: int, action_dim: int, hidden: int):
        super().__init__()
        self.net = mlp(obs_dim + action_dim, hidden, 1)

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat((obs, action), dim=-1)).squeeze(-1)


class SAC:
    """Networks, optimizers and the three SAC losses; `plain_update` is the update as usually written."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: int, device: torch.device, seed: int = 0,
                 gamma: float = 0.99, tau: float = 0.005, lr: float = 3e-4):
        torch.manual_seed(seed)
        self.actor = Actor(obs_dim, action_dim, hidden).to(device)
        self.q1, self.q2 = QNet(obs_dim, action_dim, hidden).to(device), QNet(obs_dim, action_dim, hidden).to(device)
        self.q1_target, self.q2_target = copy.deepcopy(self.q1), copy.deepcopy(self.q2)
        self.log_alpha = torch.zeros((), device=device, requires_grad=True)
        self.target_entropy = -float(action_dim)
        self.gamma, self.tau = gamma, tau
        self.critic_params = [*self.q1.parameters(), *self.q2.parameters()]
        self.target_params = [*self.q1_target.parameters(), *self.q2_target.parameters()]
        self.critic_optimizer = torch.optim.Adam(self.critic_params, lr=lr)
        self.actor_optimizer = torch.optim.Adam(self.actor.parameters(), lr=lr)
        self.alpha_optimizer = torch.optim.Adam([self.log_alpha], lr=lr)

    def critic_loss(self, obs, actions, rewards, next_obs, dones):
        with torch.no_grad():
            next_actions, next_log_prob = self.actor(next_obs)
            next_q = torch.min(self.q1_target(next_obs, next_actions), self.q2_target(next_obs, next_actions))
            next_q = next_q - self.log_alpha.exp() * next_log_prob
            target_q = rewards + self.gamma * (1.0 - dones) * next_q
        return (self.q1(obs, actions) - target_q).square().mean() + (self.q2(obs, actions) - target_q).square().mean()

    def actor_loss(self, obs):
        actions, log_prob = self.actor(obs)
        q = torch.min(self.q1(obs, actions), self.q2(obs, actions))
        return (self.log_alpha.exp().detach() * log_prob - q).mean(), log_prob.detach()

    def alpha_loss(self, log_prob):
        return -(self.log_alpha * (log_prob.float() + self.target_entropy)).mean()

    def update_targets(self) -> None:
        with torch.no_grad():
            torch._foreach_lerp_(self.target_params, self.critic_params, self.tau)

    def plain_update(self, batch: tuple) -> None:
        obs = batch[0]
        critic_loss = self.critic_loss(*batch)
        self.critic_optimizer.zero_grad()
        critic_loss.backward()
        self.critic_optimizer.step()
        actor_loss, log_prob = self.actor_loss(obs)
        self.actor_optimizer.zero_grad()
        actor_loss.backward()
        self.actor_optimizer.step()
        alpha_loss = self.alpha_loss(log_prob)
        self.alpha_optimizer.zero_grad()
        alpha_loss.backward()
        self.alpha_optimizer.step()
        self.update_targets()

    def accelerated_update_fn(self, example: tuple, **options):
        """The same update through three accelerated steps (one per optimizer), decided on `example` now."""
        critic_step = accelerate_step(self.critic_loss, self.critic_optimizer, example_inputs=example, **options)
        actor_step = accelerate_step(self.actor_loss, self.actor_optimizer, example_inputs=(example[0],), **options)
        _, example_log_prob = self.actor_loss(example[0])
        alpha_step = accelerate_step(self.alpha_loss, self.alpha_optimizer, example_inputs=(example_log_prob,),
                                     **options)

        def update(batch: tuple) -> None:
            critic_step(*batch)
            _, log_prob = actor_step(batch[0])
            alpha_step(log_prob)
            self.update_targets()

        return update, (critic_step, actor_step, alpha_step)


def make_batches(count: int, batch: int, obs_dim: int, action_dim: int, device: torch.device) -> list[tuple]:
    """A few fixed replay-sample stand-ins on the device, cycled through (the same for every variant)."""
    generator = torch.Generator().manual_seed(123)
    batches = []
    for _ in range(count):
        obs = torch.randn(batch, obs_dim, generator=generator)
        actions = torch.rand(batch, action_dim, generator=generator) * 2 - 1
        rewards = torch.randn(batch, generator=generator)
        next_obs = obs + 0.1 * torch.randn(batch, obs_dim, generator=generator)
        dones = (torch.rand(batch, generator=generator) < 0.02).float()
        batches.append(tuple(t.to(device) for t in (obs, actions, rewards, next_obs, dones)))
    return batches


def time_interleaved(variants: dict, reps: int, calls: int, device: torch.device) -> dict[str, list[float]]:
    """Milliseconds per call of each variant, one value per repetition; variants alternate within a repetition."""
    def runner(fn: Callable[[int], None]) -> Callable[[], float]:
        def run() -> float:
            synchronize(device)
            started = time.perf_counter()
            for index in range(calls):
                fn(index)
            synchronize(device)
            return (time.perf_counter() - started) / calls * 1e3
        return run

    return common.alternate({name: runner(fn) for name, fn in variants.items()}, reps)


PRODUCT_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_addmm_activation")


def product_ms(variants: dict, calls: int) -> dict[str, float]:
    """CPU: milliseconds per update spent inside matrix products (self time of the product kernels under
    torch.profiler, `calls` updates of each variant). What is left of a variant's time without them is what no
    matmul precision can remove: plain / (variant - products) is the speed-up over plain that variant would reach
    with free products (its other gains, such as accelerate_step's fused Adam, included). The products come from a
    separate, profiled pass, so the bound is approximate."""
    from torch.profiler import ProfilerActivity, profile

    spent = {}
    for name, fn in variants.items():
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for index in range(calls):
                fn(index)
        spent[name] = sum(e.self_cpu_time_total for e in prof.key_averages() if e.key in PRODUCT_OPS) / 1e3 / calls
    return spent


def bench_sac(args, device: torch.device) -> dict:
    batches = make_batches(8, args.batch, args.obs_dim, args.action_dim, device)
    plain = SAC(args.obs_dim, args.action_dim, args.hidden, device)
    step_fp32 = SAC(args.obs_dim, args.action_dim, args.hidden, device)
    accelerated = SAC(args.obs_dim, args.action_dim, args.hidden, device)
    started = time.perf_counter()
    fp32_update, _ = step_fp32.accelerated_update_fn(batches[0], precision="fp32", compile=False, graphs=False)
    auto_update, steps = accelerated.accelerated_update_fn(batches[0], compile=args.compile)
    search_s = time.perf_counter() - started
    variants = {"plain": lambda i: plain.plain_update(batches[i % len(batches)]),
                "step-fp32": lambda i: fp32_update(batches[i % len(batches)]),
                "accelerated": lambda i: auto_update(batches[i % len(batches)])}
    no_graph_steps: tuple = ()
    if device.type == "cuda":  # its search (with compile="auto" it includes torch.compile candidates) is not timed
        no_graphs = SAC(args.obs_dim, args.action_dim, args.hidden, device)
        no_graphs_update, no_graph_steps = no_graphs.accelerated_update_fn(batches[0], compile=args.compile,
                                                                           graphs=False)
        variants["no-graphs"] = lambda i: no_graphs_update(batches[i % len(batches)])
    for fn in variants.values():  # warm-up
        for i in range(args.warmup):
            fn(i)
    times = time_interleaved(variants, args.reps, args.calls, device)
    products = product_ms(variants, 2 * args.calls) if device.type == "cpu" else {}
    reports = {step.name: step.report for step in steps}
    return {"times_ms": times, "product_ms": products, "search_s": search_s,
            "reports": {k: str(v) for k, v in reports.items()},
            "chosen": {k: v.chosen.label for k, v in reports.items()},
            "chosen_no_graphs": {step.name: step.report.chosen.label for step in no_graph_steps},
            "graph_replays": {step.name: step.graph_replays for step in steps}}


# --- (b) tiny model -------------------------------------------------------------------------------------------
class TinyActorCritic(nn.Module):
    """PPO's CartPole network: separate [64, 64] tanh actor and critic."""

    def __init__(self, obs_dim: int = 4, action_dim: int = 2):
        super().__init__()
        self.actor = nn.Sequential(nn.Linear(obs_dim, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                                   nn.Linear(64, action_dim))
        self.critic = nn.Sequential(nn.Linear(obs_dim, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.actor(obs), self.critic(obs).squeeze(-1)


def ppo_loss_fn(model: nn.Module):
    def ppo_loss(obs, actions, old_log_probs, advantages, returns):
        logits, values = model(obs)
        log_probs = torch.log_softmax(logits, -1)
        new_log_probs = log_probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        ratio = (new_log_probs - old_log_probs).exp()
        policy_loss = torch.max(-advantages * ratio, -advantages * ratio.clamp(0.8, 1.2)).mean()
        entropy = -(log_probs.exp() * log_probs).sum(-1).mean()
        return policy_loss + 0.5 * (values - returns).square().mean() - 0.0 * entropy

    return ppo_loss


def bench_tiny(args, device: torch.device) -> dict:
    generator = torch.Generator().manual_seed(7)
    minibatches = []
    for _ in range(8):
        obs = torch.randn(64, 4, generator=generator)
        minibatches.append(tuple(t.to(device) for t in (
            obs, torch.randint(0, 2, (64,), generator=generator), -0.69 + 0.01 * torch.randn(64, generator=generator),
            torch.randn(64, generator=generator), torch.randn(64, generator=generator))))
    torch.manual_seed(0)
    plain_model = TinyActorCritic().to(device)
    accel_model = copy.deepcopy(plain_model)
    plain_loss, plain_opt = ppo_loss_fn(plain_model), torch.optim.Adam(plain_model.parameters(), lr=3e-4)
    accel_opt = torch.optim.Adam(accel_model.parameters(), lr=3e-4)
    accel_step = accelerate_step(ppo_loss_fn(accel_model), accel_opt, example_inputs=minibatches[0], name="ppo_loss")

    def plain_update(i: int) -> None:
        loss = plain_loss(*minibatches[i % 8])
        plain_opt.zero_grad()
        loss.backward()
        plain_opt.step()

    rollout_obs = [torch.randn(8, 4, generator=generator).to(device) for _ in range(8)]
    forward_plain = copy.deepcopy(plain_model)
    forward_accel = auto_accelerate(copy.deepcopy(plain_model), device=device)
    with torch.no_grad():
        forward_accel(rollout_obs[0])  # the first call decides (no_grad, batch 8)

    def rollout(model):
        def call(i: int) -> None:
            with torch.no_grad():
                model(rollout_obs[i % 8])
        return call

    variants = {"update-plain": plain_update, "update-accelerated": lambda i: accel_step(*minibatches[i % 8]),
                "forward-plain": rollout(forward_plain), "forward-accelerated": rollout(forward_accel)}
    for fn in variants.values():
        for i in range(args.warmup):
            fn(i)
    times = time_interleaved(variants, args.reps, args.calls * 10, device)
    return {"times_ms": times, "chosen_update": accel_step.report.chosen.label,
            "chosen_forward": forward_accel.accel_report.chosen.label,
            "reports": {"update": str(accel_step.report), "forward": str(forward_accel.accel_report)}}


# --- report ---------------------------------------------------------------------------------------------------
def summarize(times: dict[str, list[float]], baseline: str) -> dict:
    summary = {}
    for name, values in times.items():
        paired = [b / v for b, v in zip(times[baseline], values)]
        summary[name] = {"median_ms": statistics.median(values), "min_ms": min(values), "max_ms": max(values),
                         "speedup_median": statistics.median(times[baseline]) / statistics.median(values),
                         "speedup_paired": statistics.median(paired)}
    return summary


def report(sac: dict, tiny: dict | None, settings: dict) -> list[str]:
    """The README section's lines (without its heading and machine block)."""
    lines = []
    if settings["quick"]:
        lines += ["**Smoke run (`--quick`): too few repetitions for the numbers to mean anything.**", ""]
    s = sac["summary"]
    lines += [f"### (a) SAC update step: batch {settings['batch']}, [{settings['hidden']}, {settings['hidden']}] "
              f"MLPs, obs {settings['obs_dim']}, action {settings['action_dim']}", "",
              f"{settings['reps']} interleaved repetitions of {settings['calls']} updates each; milliseconds per "
              f"update (critic, actor and temperature steps plus the Polyak update). Device `{settings['device']}`."
              f" Target: accelerated >= {TARGET_SPEEDUP}x plain.", ""]
    names = {"plain": "plain fp32 eager (zero_grad/backward/step)",
             "step-fp32": "accelerate_step, precision fp32 (fused Adam, optimizer-only grads)",
             "accelerated": "accelerate_step, auto (" + ", ".join(f"{k}: {v}" for k, v in sac["chosen"].items())
             + ")", "no-graphs": "accelerate_step, auto with graphs=False (" + ", ".join(
                 f"{k}: {v}" for k, v in sac.get("chosen_no_graphs", {}).items()) + ")"}
    rows = [[names[n], f"{v['median_ms']:.2f}", f"{v['min_ms']:.2f} – {v['max_ms']:.2f}",
             f"{v['speedup_median']:.2f}x", f"{v['speedup_paired']:.2f}x"] for n, v in s.items()]
    lines.append(common.markdown_table(["Variant", "ms median", "ms range", "Speed-up (medians)",
                                        "Speed-up (paired median)"], rows))
    lines += ["", f"Strategy search and setup for step-fp32 and accelerated: {sac['search_s']:.1f} s (once; cached "
              "afterwards" + ("; the graphs=False variant's is not timed)." if "no-graphs" in s else ").")]
    if sac.get("product_ms"):
        plain = s["plain"]["median_ms"]
        rows = [[names[n], f"{ms:.2f}", f"{s[n]['median_ms'] - ms:.2f}",
                 f"{plain / (s[n]['median_ms'] - ms):.2f}x" if s[n]["median_ms"] > ms else "n/a"]
                for n, ms in sac["product_ms"].items()]
        lines += ["", "Where an eager step's time goes: milliseconds per update inside matrix products (self time of "
                  f"{', '.join(PRODUCT_OPS)} under torch.profiler, {2 * settings['calls']} profiled updates of each "
                  "variant), the rest of the median above, and the speed-up over plain if those products cost "
                  "nothing: the most any matmul precision could give that variant.", ""]
        lines.append(common.markdown_table(["Variant", "in products (ms)", "rest (ms)",
                                            "bound: plain / rest"], rows))
    if tiny is not None:
        t = tiny["summary"]
        update = t["update-accelerated"]["median_ms"] / t["update-plain"]["median_ms"] - 1
        forward = t["forward-accelerated"]["median_ms"] / t["forward-plain"]["median_ms"] - 1
        lines += ["", "### (b) Tiny model: [64, 64] tanh actor-critic (PPO on CartPole)", "",
                  f"`auto` must keep eager fp32 here and cost < {TINY_OVERHEAD_LIMIT:.0%}. Chosen: update step "
                  f"`{tiny['chosen_update']}`, rollout forward `{tiny['chosen_forward']}`.", ""]
        rows = [["PPO minibatch update (64 rows)", f"{t['update-plain']['median_ms']:.3f}",
                 f"{t['update-accelerated']['median_ms']:.3f}", f"{update:+.1%}"],
                ["rollout forward (8 rows, no_grad)", f"{t['forward-plain']['median_ms']:.3f}",
                 f"{t['forward-accelerated']['median_ms']:.3f}", f"{forward:+.1%}"]]
        lines.append(common.markdown_table(["Call", "plain ms (median)", "accelerated ms (median)", "Overhead"], rows))
    lines += ["", "Strategy reports (what the search tried):", "", "```"]
    lines += [text for text in sac["reports"].values()]
    if tiny is not None:
        lines += [text for text in tiny["reports"].values()]
    lines += ["```"]
    return lines


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--reps", type=int, default=None, help="interleaved repetitions (default 15, quick 3)")
    parser.add_argument("--calls", type=int, default=None, help="updates per repetition (default 20, quick 3)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed calls of each variant first")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--obs-dim", type=int, default=17, help="observation size (17: HalfCheetah)")
    parser.add_argument("--action-dim", type=int, default=6, help="action size (6: HalfCheetah)")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads for every variant")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--compile", default="auto", help="compile setting of the accelerated variant "
                        "(auto: not on CPU; true: include torch.compile candidates, tens of seconds each)")
    parser.add_argument("--skip-tiny", action="store_true", help="skip (b)")
    parser.add_argument("--quick", action="store_true", help="smoke-run settings")
    parser.add_argument("--no-write", action="store_true", help="print only; do not write the JSON or README")
    args = parser.parse_args()
    args.reps = args.reps or (3 if args.quick else 15)
    args.calls = args.calls or (3 if args.quick else 20)
    return args


def main() -> None:
    args = parse_args()
    args.threads = common.set_threads(args.threads)
    os.environ["RLSPEED_CACHE_DIR"] = common.temporary_directory("rlspeed-accel-bench-")  # search every run
    os.environ.pop("RLSPEED_ACCELERATE", None)
    device = resolve_device(args.device)
    settings = {"batch": args.batch, "hidden": args.hidden, "obs_dim": args.obs_dim, "action_dim": args.action_dim,
                "reps": args.reps, "calls": args.calls, "warmup": args.warmup, "threads": args.threads,
                "device": str(device), "compile": args.compile, "quick": args.quick}
    print(f"accelerate benchmark on {device}, torch.set_num_threads({args.threads})", flush=True)
    sac = bench_sac(args, device)
    sac["summary"] = summarize(sac["times_ms"], "plain")
    for name, value in sac["summary"].items():
        print(f"  SAC {name}: {value['median_ms']:.2f} ms/update, {value['speedup_median']:.2f}x", flush=True)
    tiny = None
    if not args.skip_tiny:
        tiny = bench_tiny(args, device)
        times = tiny["times_ms"]  # each accelerated call against its own plain version
        tiny["summary"] = {}
        for call in ("update", "forward"):
            pair = {f"{call}-plain": times[f"{call}-plain"], f"{call}-accelerated": times[f"{call}-accelerated"]}
            tiny["summary"].update(summarize(pair, f"{call}-plain"))
    machine = common.machine_description(("rlspeed", "torch", "numpy"))
    machine["torch_threads"] = args.threads
    # one README section and results file per device type: a CUDA run does not replace the CPU numbers
    suffix = "" if device.type == "cpu" else f"_{device.type}"
    title = "## Acceleration of an update step (`benchmarks/accel_update_step.py`)" + (
        f" on {device.type.upper()}" if suffix else "")
    common.publish(f"accel{suffix}", [title, "", *report(sac, tiny, settings)],
                   {"settings": settings, "sac": sac, "tiny": tiny}, not args.no_write, machine=machine,
                   results_name=f"accel_update_step{suffix}")


if __name__ == "__main__":
    main()
