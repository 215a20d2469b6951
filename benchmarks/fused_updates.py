"""What the hand-derived updates buy: one gradient step of rlspeed's PPO, DQN and SAC, autograd against fused.

For each algorithm, three models with the same initial weights take update steps on the same fixed batch, in
interleaved blocks (autograd block, fused block, accelerated block, autograd block, ...), and the median time per
step of each is reported with its ratio to autograd:
  autograd     `fused_update=False`: loss + autograd backward + clipping + `torch.optim.Adam(fused=True)`, fp32
               eager (the algorithm's plain PyTorch form);
  fused        `fused_update=True`: the hand-derived update (`rlspeed/fused/*.py`), fp32;
  accelerate   `fused_update=True, accelerate="auto"`, as `rlspeed train ... --accelerate auto` runs it: the
               hand-derived update in the matmul precision the acceleration layer measures fastest within its
               tolerances (chosen in the untimed warm-up block, at its second step:
               `common.acceleration_decided_at_once`; a block of this length would not reach the search, which
               waits for the updates to pay for it).
Shapes are those of the RL-Zoo settings the other benchmarks use: PPO CartPole (64x64 tanh actor and critic,
minibatch 256), DQN CartPole ([256, 256] ReLU Q-network, batch 64), SAC Pendulum ([256, 256] ReLU actor and twin
critics, batch 256).

Usage: python benchmarks/fused_updates.py [--quick] [--blocks N] [--steps N] [--threads N] [--no-write]
"""

from __future__ import annotations

import argparse
import statistics
import time

import common
import torch

import rlspeed


def ppo_case():
    def build(fused, accelerate):
        return rlspeed.PPO("CartPole-v1", device="cpu", seed=0, fused_update=fused, env_backend="torch",
                           accelerate=accelerate)

    generator = torch.Generator().manual_seed(0)
    batch = 256
    obs = torch.randn(batch, 4, generator=generator)
    actions = torch.randint(0, 2, (batch,), generator=generator)
    args = (obs, actions, torch.full((batch,), -0.69), torch.randn(batch, generator=generator),
            torch.randn(batch, generator=generator), torch.randn(batch, generator=generator), torch.tensor(0.2))
    return build, lambda model: model._update_step(*args)


def dqn_case():
    def build(fused, accelerate):
        return rlspeed.DQN("CartPole-v1", device="cpu", seed=0, fused_update=fused, net_arch=(256, 256),
                           learning_rate=2.3e-3, max_grad_norm=10.0, accelerate=accelerate)

    generator = torch.Generator().manual_seed(0)
    batch = 64
    args = (torch.randn(batch, 4, generator=generator), torch.randint(0, 2, (batch,), generator=generator),
            torch.randn(batch, generator=generator), torch.randn(batch, 4, generator=generator),
            torch.zeros(batch), torch.full((batch,), 0.99))
    return build, lambda model: model._update_step(*args)


def sac_case():
    def build(fused, accelerate):
        return rlspeed.SAC("Pendulum-v1", device="cpu", seed=0, fused_update=fused, net_arch=(256, 256),
                           learning_rate=1e-3, accelerate=accelerate)

    generator = torch.Generator().manual_seed(0)
    batch = 256
    data = {"obs": torch.randn(batch, 3, generator=generator),
            "actions": torch.rand(batch, 1, generator=generator) * 2 - 1,
            "rewards": torch.randn(batch, generator=generator), "next_obs": torch.randn(batch, 3, generator=generator),
            "terminated": torch.zeros(batch), "discounts": torch.full((batch,), 0.99)}
    return build, lambda model: model._update(data)  # the gradient step and the Polyak update


CASES = {"ppo": ("PPO CartPole-v1: 64x64 tanh, minibatch 256", ppo_case),
         "dqn": ("DQN CartPole-v1: [256, 256] ReLU, batch 64", dqn_case),
         "sac": ("SAC Pendulum-v1: [256, 256] ReLU, twin critics, batch 256", sac_case)}


def time_block(step, model, steps: int) -> float:
    started = time.perf_counter()
    for _ in range(steps):
        step(model)
    return (time.perf_counter() - started) / steps


def warm_up(models: dict, step, steps: int) -> None:
    """One untimed block of `steps` of each model; the accelerate="auto" one searches its precision in it, at its
    second step, and keeps that choice for the timed blocks."""
    with common.acceleration_decided_at_once():
        for model in models.values():
            time_block(step, model, steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--blocks", type=int, default=None, help="timed blocks per variant; default 15, quick 3")
    parser.add_argument("--steps", type=int, default=None, help="update steps per block; default 40, quick 5")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--quick", action="store_true", help="smoke-run settings")
    parser.add_argument("--no-write", action="store_true", help="print only; do not write the JSON or README")
    args = parser.parse_args()
    blocks = args.blocks or (3 if args.quick else 15)
    steps = args.steps or (5 if args.quick else 40)
    common.set_threads(args.threads)
    machine = common.machine_description(packages=("rlspeed", "torch"))

    results, rows = {}, []
    for key, (label, make) in CASES.items():
        build, step = make()
        models = {"autograd": build(False, "off"), "fused": build(True, "off"), "accelerate": build(True, "auto")}
        warm_up(models, step, steps)
        choice = models["accelerate"].acceleration_summary() or {}
        times = common.alternate({name: (lambda model=model, step=step: time_block(step, model, steps))
                                  for name, model in models.items()}, blocks)
        medians = {name: statistics.median(values) for name, values in times.items()}
        speedup = medians["autograd"] / medians["fused"]
        accelerate_speedup = medians["autograd"] / medians["accelerate"]
        precision = choice.get("precision", "unknown")  # nothing recorded: say so rather than fp32
        results[key] = {"label": label, "seconds_per_step": times, "median_s": medians, "speedup": speedup,
                        "accelerate_speedup": accelerate_speedup, "accelerate_choice": choice}
        rows.append([label, f"{medians['autograd'] * 1e6:,.0f}", f"{medians['fused'] * 1e6:,.0f}",
                     f"{speedup:.2f}x", f"{medians['accelerate'] * 1e6:,.0f} ({precision})",
                     f"{accelerate_speedup:.2f}x"])
        print(f"{label}: autograd {medians['autograd'] * 1e6:,.0f} us, fused {medians['fused'] * 1e6:,.0f} us, "
              f"{speedup:.2f}x; accelerate {medians['accelerate'] * 1e6:,.0f} us ({precision}), "
              f"{accelerate_speedup:.2f}x", flush=True)

    common.publish("fused_updates", [
        "## Hand-derived updates against autograd (`benchmarks/fused_updates.py`)", "",
        *(["**Smoke run (`--quick`): settings far too small for the numbers to mean anything.**", ""]
          if args.quick else []),
        f"One gradient step of rlspeed's own algorithms on a fixed batch, `fused_update=False` (autograd, fp32 "
        f"eager, `torch.optim.Adam(fused=True)`) against `fused_update=True` (hand-derived, fp32), and against the "
        f"hand-derived update with `accelerate=\"auto\"` (as `--accelerate auto` runs it: the matmul precision "
        f"it measured, in brackets); median of {blocks} interleaved blocks of {steps} steps each, "
        f"torch.set_num_threads({args.threads}). Speedups are against autograd.", "",
        common.markdown_table(["Update", "autograd (us/step)", "fused (us/step)", "speedup",
                               "accelerate auto (us/step)", "speedup"], rows)],
        {"blocks": blocks, "steps": steps, "results": results}, not args.no_write, machine=machine)


if __name__ == "__main__":
    main()
