"""Populations on images: K PPO or DQN agents with their own CNN encoders (MinAtar/Breakout-v1, 10x10x4 bool
images, the small CNN; or an Atari game, 84x84x4 uint8 frame stacks, the Nature CNN) trained in one process as a
`rlspeed.Population`, against one solo run of the same settings: total env steps/s of the population over one solo
run's, which is its speed-up over K solo runs one after another.

    python benchmarks/population_cnn.py [--algo ppo|dqn] [--env ID] [--env-backend B] [--members 4] [--pairs 3]
                                        [--steps N] [--no-write]

Settings: rlspeed's preset for the algorithm and env (MinAtar has no shipped preset: the default one; Atari ids: the
Atari preset), the same env backend on both sides (default: Gymnasium's for MinAtar, rlspeed's `auto` choice for
Atari: EnvPool where installed); PPO without normalize_obs (the CLI's choice for images), DQN with learning_starts
1,000, so most of a run's steps train (one gradient step per 4 env steps), and each member's replay in the solo's
layout (Atari: each frame stored once). Each pair runs the solo run (seed i) and the population (seeds 0..K-1),
each in a fresh process, one after the other, the order reversed every other pair; both train a fixed number of env
steps per agent with no evaluation inside the timed training (the population's final evaluation comes after it), and
the ratio of their steps/s (and of their training CPU time per env step) is taken within the pair.
torch.set_num_threads(--threads, default 1) in every run; the machine's load (`uptime`) before and after is
recorded. Where the time goes: the members' small CNNs run as one grouped convolution of K groups per layer
(`torch.func.vmap`), which saves the per-call overhead of K small calls (rollout steps of a few observations) but
not the arithmetic of the update's minibatches; Nature CNNs on a CPU run member by member (`MemberEncoder.mode`),
since there the grouped convolution is slower than K ordinary ones.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine_description, publish, run_child, set_threads, uptime  # noqa: E402

ENV_ID = "MinAtar/Breakout-v1"
ATARI_STEPS = {"ppo": 8_192, "dqn": 4_000}  # (the Nature CNN costs about 30x the small CNN per observation)
# (the default PPO preset's normalize_obs is for float vectors: the CLI turns it off for images, as here)
OVERRIDES = {"ppo": {"normalize_obs": False}, "dqn": {"learning_starts": 1000}}
DEFAULT_STEPS = {"ppo": 16_384, "dqn": 6_000}
SHOWN = ("num_envs", "num_steps", "batch_size", "n_epochs", "train_freq", "gradient_steps", "buffer_size")


def _settings(algo: str, env_id: str) -> dict:
    from rlspeed.presets import load_preset, split_run_settings

    _run, hyper = split_run_settings(dict(load_preset(algo, env_id)))
    return {**hyper, **OVERRIDES[algo]}


def _atari(env_id: str) -> bool:
    from rlspeed.envs import atari

    return atari.register_atari() and atari.is_atari(env_id)


def worker(args: argparse.Namespace) -> dict:
    """One measurement in this process (called with --worker): a solo run or the population."""
    import rlspeed
    from rlspeed.population import Population

    os.environ["RLSPEED_NUM_THREADS"] = str(args.threads)  # (each model builds and trains with it)
    set_threads(args.threads)
    algo = getattr(rlspeed, args.algo.upper())
    hyper = _settings(args.algo, args.env)
    if args.worker == "solo":
        model = algo(args.env, seed=args.seed, env_backend=args.env_backend, **hyper)
        cpu_start = time.process_time()
        model.learn(args.steps, progress_bar=False)
        result = model.result
        return {"side": "solo", "seed": args.seed, "sps": result.sps, "train_wall_s": result.train_wall_s,
                "train_cpu_s": time.process_time() - cpu_start, "update": model.update_summary(),
                "env_backend": model.env_backend, "replay": getattr(model, "replay_summary", lambda: None)(),
                "config": {key: getattr(model.config, key) for key in SHOWN if hasattr(model.config, key)}}
    population = Population(algo, args.env, seeds=range(args.members), env_backend=args.env_backend, **hyper)
    summary = population.learn(args.steps, eval_episodes=1)  # (its final evaluation: outside the training clock)
    return {"side": "population", "members": args.members, "sps": summary["sps"],
            "train_wall_s": summary["train_wall_s"], "train_cpu_s": summary["train_cpu_s"],
            "update": population.update_path, "env_backend": population.env_backend,
            "replay": summary.get("replay"), "member_encoder": summary.get("member_encoder")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", choices=("ppo", "dqn"), default="ppo")
    parser.add_argument("--env", default=ENV_ID, help=f"an image env id (default {ENV_ID}; or an Atari id)")
    parser.add_argument("--env-backend", help="both sides' env backend (default: gymnasium; Atari ids: auto)")
    parser.add_argument("--members", type=int, default=4)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, help="env steps per agent (default: ppo 16,384, dqn 6,000)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of every run (rlspeed's default: 1)")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--worker", choices=("solo", "population"), help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    atari = _atari(args.env)
    args.steps = args.steps or (ATARI_STEPS if atari else DEFAULT_STEPS)[args.algo]
    args.env_backend = args.env_backend or ("auto" if atari else "gymnasium")
    if args.worker:
        print(json.dumps(worker(args)))
        return
    common_flags = ["--algo", args.algo, "--env", args.env, "--env-backend", args.env_backend, "--members",
                    str(args.members), "--steps", str(args.steps), "--threads", str(args.threads)]
    load_before = uptime()
    pairs = []
    for pair in range(args.pairs):
        order = ("solo", "population") if pair % 2 == 0 else ("population", "solo")
        runs = {}
        for side in order:
            runs[side] = run_child(__file__, *common_flags, "--worker", side, "--seed", str(pair),
                                   what=f"{args.algo} {side} (pair {pair})")
        ratio = runs["population"]["sps"] / runs["solo"]["sps"]
        cpu_ratio = ((args.members * args.steps / runs["population"]["train_cpu_s"])
                     / (args.steps / runs["solo"]["train_cpu_s"]))
        pairs.append({**runs, "ratio": ratio, "cpu_ratio": cpu_ratio})
        print(f"pair {pair}: solo {runs['solo']['sps']:.0f} steps/s, population of {args.members} "
              f"{runs['population']['sps']:.0f} (total) -> {ratio:.2f}x (by training CPU time {cpu_ratio:.2f}x)",
              flush=True)
    load_after = uptime()
    ratios = [p["ratio"] for p in pairs]
    cpu_ratios = [p["cpu_ratio"] for p in pairs]
    solo_sps = [p["solo"]["sps"] for p in pairs]
    population_sps = [p["population"]["sps"] for p in pairs]
    settings = _settings(args.algo, args.env)
    shown = ", ".join(f"{key}={value}" for key, value in pairs[0]["solo"]["config"].items())
    backend = pairs[0]["solo"]["env_backend"]
    flags = f"--algo {args.algo}" + (f" --env {args.env}" if args.env != ENV_ID else "")
    images = ("84x84x4 uint8 frame stacks; each member's own Nature CNN" if atari
              else "10x10x4 bool images; each member's own small CNN")
    per_member = pairs[0]["population"].get("member_encoder") == "per-member"
    calls = ("its members' convolutions one call per member, in the solo's layout" if per_member
             else "its members' convolutions one grouped call")
    replay = ""
    if args.algo == "dqn":
        solo_replay, member_replay = pairs[0]["solo"]["replay"], pairs[0]["population"]["replay"]
        replay = (f" Replay: the solo's {solo_replay['layout']} layout, {solo_replay['bytes_per_transition']:,.0f} "
                  f"bytes per transition; each member's {member_replay['layout']}, "
                  f"{member_replay['bytes_per_transition']:,.0f}.")
    lines = [
        f"## {args.algo.upper()} populations on images (`benchmarks/population_cnn.py {flags}`)",
        "",
        f"{args.members} {args.algo.upper()} agents on {args.env} ({images}, "
        f"{calls}) in one process, against one solo run of the same settings, "
        f"{backend} envs on both sides; rlspeed's {args.algo} preset for the id"
        + (" with learning_starts 1,000" if args.algo == "dqn" else "")
        + f" ({shown}). "
        f"{args.steps:,} env steps per agent without evaluation; {args.pairs} pairs of fresh processes, the order "
        f"reversed every other pair; torch.set_num_threads({args.threads}). Load before: `{load_before}`; after: "
        f"`{load_after}`.",
        "",
        "| Run | Env steps/s (median, all agents) | Range |",
        "|---|---|---|",
        f"| solo (1 agent) | {statistics.median(solo_sps):,.0f} | {min(solo_sps):,.0f} - {max(solo_sps):,.0f} |",
        f"| population ({args.members} agents) | {statistics.median(population_sps):,.0f} | "
        f"{min(population_sps):,.0f} - {max(population_sps):,.0f} |",
        "",
        f"Population over solo per pair: {', '.join(f'{r:.2f}' for r in ratios)} (median "
        f"**{statistics.median(ratios):.2f}x**; by training CPU time {statistics.median(cpu_ratios):.2f}x): the "
        f"population's speed-up over {args.members} solo runs one after another on one core. Update: "
        f"{pairs[0]['population']['update']} (the hand-derived update covers MLPs on float vectors).{replay}",
    ]
    machine = machine_description()
    machine["torch_threads"] = args.threads  # what every run set (this publishing process sets none)
    key = f"population_cnn_{args.algo}" + ("_atari" if atari else "")
    publish(key, lines, {"pairs": pairs, "settings": settings, "members": args.members, "env_id": args.env,
                         "steps": args.steps, "load": [load_before, load_after]},
            write=not args.no_write, machine=machine)


if __name__ == "__main__":
    main()
