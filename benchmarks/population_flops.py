"""How close the MLP populations run to this CPU's arithmetic: the update's floating-point operations per member env
step, counted, over the CPU time they take, beside the machine's batched matrix product at its best and a solo run of
the same preset.

    python benchmarks/population_flops.py [--members-ppo 32] [--members-sac 16] [--repeats 3] [--quick] [--no-write]

For the shipped presets of PPO CartPole-v1 and SAC Pendulum-v1 (native envs, one torch thread): a population of K
members and one solo run each train a warm-up, then `--steps` env steps per member under
`torch.utils.flop_counter.FlopCounterMode` (the matrix products' operations; elementwise work is not counted), then
the same steps `--repeats` times timed by the process's CPU time (no evaluation). Achieved GFLOP/s = counted operations
over that CPU time. The peak is the best of `--repeats` timings of `torch.bmm` at the population's widest hidden layer
product (its members' actor and critic stacked, at the update's batch size): what one core does at that shape.

A population's env steps/s over a solo run's can exceed the solo run's share of the peak only as far as the peak
allows: peak GFLOP/s / solo GFLOP/s bounds it (both take the same operations per member step), which is what this
script prints beside the measured ratio.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
import torch  # noqa: E402
from common import publish  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from rlspeed import PPO, SAC  # noqa: E402
from rlspeed.population import Population  # noqa: E402
from rlspeed.presets import load_preset, split_run_settings  # noqa: E402


def _train(model, steps: int, population: bool) -> None:
    # (no target, evaluation interval or callback: no evaluation runs)
    if population:
        model.learn(steps)
    else:
        model.learn(steps, progress_bar=False)


def measure(algo, env_id: str, members: int, steps: int, warmup: int, repeats: int) -> dict:
    """Counted operations per member env step and the CPU seconds of `steps` member steps, `repeats` times."""
    _, hyper = split_run_settings(dict(load_preset(algo.name, env_id)))
    population = members > 1
    if population:
        model = Population(algo, env_id, seeds=range(members), env_backend="torch", **hyper)
    else:
        model = algo(env_id, seed=0, env_backend="torch", **hyper)
    _train(model, warmup, population)
    counter = FlopCounterMode(display=False)
    with counter:
        _train(model, steps, population)
    flops = counter.get_total_flops() / (steps * members)
    seconds = []
    for _ in range(repeats):
        started = time.process_time()
        _train(model, steps, population)
        seconds.append(time.process_time() - started)
    if population:
        model.close()
    best = min(seconds)
    return {"members": members, "steps_per_member": steps, "flops_per_member_step": flops, "cpu_s": seconds,
            "member_steps_per_s": steps * members / best, "gflops": flops * steps * members / best / 1e9}


def peak_gflops(batch: int, members: int, width: int, repeats: int) -> float:
    """The best GFLOP/s of `torch.bmm` of `[members, batch, width] @ [members, width, width]` here."""
    a, b = torch.randn(members, batch, width), torch.randn(members, width, width)
    out = torch.empty(members, batch, width)
    calls = max(1, int(2e9 // (2 * members * batch * width * width)))  # about 2 GFLOP a timing
    per_call = common.best_seconds_per_call(lambda: torch.bmm(a, b, out=out), repeats, calls, warmup=calls)
    return 2 * members * batch * width * width / per_call / 1e9


def main() -> None:
    parser = common.script_arguments(__doc__.splitlines()[0])
    parser.add_argument("--members-ppo", type=int, default=32)
    parser.add_argument("--members-sac", type=int, default=16)
    parser.add_argument("--steps-ppo", type=int, default=4096, help="env steps per member of each timing (PPO)")
    parser.add_argument("--steps-sac", type=int, default=400, help="env steps per member of each timing (SAC)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.quick:
        common.quick_settings(args, members_ppo=4, members_sac=2, steps_ppo=512, steps_sac=200, repeats=1)
    common.set_threads(args.threads)
    load = {"before": common.uptime()}
    cases = [(PPO, "CartPole-v1", args.members_ppo, args.steps_ppo), (SAC, "Pendulum-v1", args.members_sac,
                                                                      args.steps_sac)]
    results = {}
    for algo, env_id, members, steps in cases:
        _, hyper = split_run_settings(dict(load_preset(algo.name, env_id)))
        width = max(hyper.get("net_arch") or [64])
        # the widest product of an update: PPO's actor and critic, SAC's two critics, per member, stacked
        stacked = 2 * members
        batch = hyper.get("batch_size", 256)
        warmup = max(steps, hyper.get("learning_starts", 0) + steps // 2)
        row = {"solo": measure(algo, env_id, 1, steps, warmup, args.repeats),
               "population": measure(algo, env_id, members, steps, warmup, args.repeats),
               "peak_gflops": peak_gflops(batch, stacked, width, args.repeats),
               "peak_shape": [stacked, batch, width, width]}
        row["ratio"] = row["population"]["member_steps_per_s"] / row["solo"]["member_steps_per_s"]
        row["bound"] = row["peak_gflops"] / row["solo"]["gflops"]
        results[f"{algo.name}:{env_id}"] = row
        print(f"{algo.name} {env_id}: {row}", flush=True)
    load["after"] = common.uptime()

    lines = [
        "## The MLP populations' arithmetic against this CPU's (`benchmarks/population_flops.py`)",
        "",
        "The MLP populations' update arithmetic against this CPU's (`benchmarks/population_flops.py`): shipped "
        "presets, native envs, torch.set_num_threads(1), matrix-product operations counted by torch's "
        "FlopCounterMode, CPU time of the best of "
        f"{args.repeats} timings without evaluation; the peak is `torch.bmm` at the widest update product "
        "(members' two networks stacked).",
        "",
        "| | PPO CartPole-v1 | SAC Pendulum-v1 |",
        "|---|---|---|",
    ]
    ppo, sac = results["ppo:CartPole-v1"], results["sac:Pendulum-v1"]

    def row(label: str, get) -> str:
        return f"| {label} | {get(ppo)} | {get(sac)} |"

    lines += [
        row("members", lambda r: str(r["population"]["members"])),
        row("matrix-product FLOP per member env step", lambda r: f"{r['population']['flops_per_member_step']:,.0f}"),
        row("solo run: env steps/s, GFLOP/s", lambda r: f"{r['solo']['member_steps_per_s']:,.0f}, "
            f"{r['solo']['gflops']:.1f}"),
        row("population: member env steps/s in all, GFLOP/s",
            lambda r: f"{r['population']['member_steps_per_s']:,.0f}, {r['population']['gflops']:.1f}"),
        row("`torch.bmm` peak at the widest product (shape), GFLOP/s",
            lambda r: f"{r['peak_gflops']:.1f} ({' x '.join(map(str, r['peak_shape'][:3]))} @ "
            f"{r['peak_shape'][3]})"),
        row("population / solo env steps/s", lambda r: common.fmt_ratio(r["ratio"])),
        row("bound on that ratio: peak / solo GFLOP/s", lambda r: common.fmt_ratio(r["bound"])),
        "",
        f"Load (`uptime`): before: `{load['before']}`; after: `{load['after']}`.",
    ]
    publish("population_flops", lines, {"results": results, "load": load,
                                         "settings": vars(args)}, write=not args.no_write)


if __name__ == "__main__":
    main()
