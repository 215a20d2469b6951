"""A2C on CartPole-v1: rlspeed against Stable-Baselines3, every run in a fresh process, the sides alternating.

Both libraries run RL-Zoo's A2C CartPole-v1 settings (rl-baselines3-zoo hyperparams/a2c.yml: 8 envs, ent_coef 0.0)
with SB3's A2C defaults for the rest: n_steps 5, RMSprop (alpha 0.99, eps 1e-5) at a constant learning rate of 7e-4,
gamma 0.99, gae_lambda 1.0, vf_coef 0.5, max_grad_norm 0.5, no advantage normalisation, MlpPolicy (separate [64, 64]
tanh actor and critic, orthogonal init). rlspeed's shipped `a2c` CartPole-v1 preset is the same settings.

(a) Throughput: env steps per second of `learn` for a fixed budget without evaluation. Gymnasium envs for both
    (rlspeed env_backend="gymnasium", SB3 DummyVecEnv), plus rlspeed on its device-native torch CartPole. Each run
    also records the CPU time of its process during `learn` (`time.process_time`): on a machine shared with other
    jobs the wall clock counts the time a run waited for a core, the CPU time does not.
(b) Time to target: training seconds until a deterministic 10-episode evaluation on a separate env reaches a mean
    return of 475, both evaluated every `eval_freq` env steps, evaluation time excluded from the training clock of
    both, both stopping at the first evaluation that reaches it (rlspeed's confirming second evaluation is off);
    rlspeed on its shipped preset with env backend auto (as the CLI runs it).

Every run is a fresh Python process (`--child`), with a short untimed warm-up `learn` of its own first; per seed the
runs alternate in order (rlspeed first on even seeds, SB3 first on odd ones). torch.set_num_threads(--threads,
default 1) holds for every run of both libraries. Only `learn` is timed (model and env construction are not). The
1-minute load average is recorded before and after every run (the machine may be shared).
Usage: python benchmarks/a2c_cartpole.py [--quick] [--seeds N] [--skip-sb3] ...
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import common

import rlspeed
from rlspeed.presets import load_preset, split_run_settings

ENV_ID = "CartPole-v1"
TARGET_RETURN = 475.0
EVAL_EPISODES = 10
EVAL_SEED_OFFSET = 100_000  # the SB3 side's evaluation env is made with seed + this; each evaluation then reseeds it
# with the seed rlspeed's learn evaluates on at that step (common.sb3_target_callback): both sides' episodes have
# the same seeds (the same episodes where rlspeed's side runs Gymnasium's envs)
ZOO_NUM_ENVS = 8
# Both libraries reach the target within a few tens of thousands of steps, so the preset's eval_freq (10,000) would
# round every time to target up to a multiple of it; evaluation time is off the clock, so evaluate more often.
EVAL_FREQ = 2000

# RL-Zoo's A2C CartPole-v1 hyperparameters with SB3's A2C defaults spelled out, in each library's names.
ZOO_RLSPEED = dict(num_envs=ZOO_NUM_ENVS, num_steps=5, learning_rate=7e-4, anneal_lr=False, gamma=0.99,
                   gae_lambda=1.0, ent_coef=0.0, vf_coef=0.5, max_grad_norm=0.5, normalize_advantage=False,
                   use_rms_prop=True, rms_prop_eps=1e-5, net_arch=(64, 64), activation="tanh")
ZOO_SB3 = dict(n_steps=5, learning_rate=7e-4, gamma=0.99, gae_lambda=1.0, ent_coef=0.0, vf_coef=0.5,
               max_grad_norm=0.5, normalize_advantage=False, use_rms_prop=True, rms_prop_eps=1e-5)
# (MlpPolicy default: pi [64, 64], vf [64, 64], tanh, orthogonal init; RMSprop alpha 0.99 in both libraries)


def load_1m() -> float:
    return os.getloadavg()[0]


def with_load(run):
    """`run(seed)` with the 1-minute load average before and after it added to its result."""

    def wrapped(seed: int) -> dict:
        before = load_1m()
        result = run(seed)
        return {**result, "load_before": before, "load_after": load_1m()}

    return wrapped


def sb3_model(seed: int):
    from stable_baselines3 import A2C
    from stable_baselines3.common.env_util import make_vec_env

    env = make_vec_env(ENV_ID, n_envs=ZOO_NUM_ENVS, seed=seed)  # DummyVecEnv
    return A2C("MlpPolicy", env, device="cpu", seed=seed, **ZOO_SB3), env


# --- (a) throughput ----------------------------------------------------------------------------------------------
WARMUP_STEPS = 1000  # an untimed learn in the same process first: first-call costs are not throughput


def rlspeed_throughput(seed: int, steps: int, backend: str, args) -> dict:
    def build():
        model = rlspeed.A2C(ENV_ID, env_backend=backend, device=args.device, seed=seed, num_threads=args.threads,
                            **ZOO_RLSPEED)
        model.make_training_env()  # built outside the timed region, like SB3's env (built by make_vec_env)
        return model

    build().learn(WARMUP_STEPS, progress_bar=False)
    model = build()
    started, cpu_started = time.perf_counter(), time.process_time()
    model.learn(steps, progress_bar=False)
    learn_wall_s, learn_cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
    return {**common.rlspeed_throughput_record(model, learn_wall_s, update=model.report()),
            "learn_cpu_s": learn_cpu_s, "cpu_sps": model.result.total_timesteps / learn_cpu_s}


def sb3_throughput(seed: int, steps: int, args) -> dict:
    model, env = sb3_model(seed)
    model.learn(WARMUP_STEPS)
    model, env = sb3_model(seed)
    cpu_started = time.process_time()
    record = common.sb3_throughput_record(model, env, steps, args.threads)
    learn_cpu_s = time.process_time() - cpu_started  # (includes closing the env: negligible for DummyVecEnv)
    return {**record, "learn_cpu_s": learn_cpu_s, "cpu_sps": record["steps"] / learn_cpu_s}


# --- (c) where rlspeed's time goes -------------------------------------------------------------------------------
def rlspeed_phases(seed: int, steps: int, backend: str, args) -> dict:
    """CPU time (`time.thread_time`) per iteration of each phase of the on-policy loop (`rlspeed.diagnostics.phases`:
    act, env, buffer, gae, update) and of the whole `learn`, for a throughput run. The loop's `phase` contexts are
    replaced by CPU-time accumulators for this run (two clock reads per phase: well under a microsecond each)."""
    import rlspeed.algos.on_policy as on_policy

    totals: dict[str, float] = {}

    class Timed:
        def __init__(self, name: str):
            self.name = name

        def __enter__(self):
            self.started = time.thread_time()

        def __exit__(self, *_):
            totals[self.name] = totals.get(self.name, 0.0) + time.thread_time() - self.started

    def build():
        model = rlspeed.A2C(ENV_ID, env_backend=backend, device=args.device, seed=seed, num_threads=args.threads,
                            **ZOO_RLSPEED)
        model.make_training_env()
        return model

    build().learn(WARMUP_STEPS, progress_bar=False)
    model = build()
    on_policy.phase = Timed
    cpu_started = time.thread_time()
    model.learn(steps, progress_bar=False)
    learn_cpu_s = time.thread_time() - cpu_started
    iterations = model.result.total_timesteps / (ZOO_NUM_ENVS * ZOO_RLSPEED["num_steps"])
    per_iteration = {name: 1e6 * seconds / iterations for name, seconds in totals.items()}
    per_iteration["other"] = 1e6 * learn_cpu_s / iterations - sum(per_iteration.values())
    return {"env_backend": backend, "steps": model.result.total_timesteps, "learn_cpu_s": learn_cpu_s,
            "sps": model.result.sps,
            "cpu_us_per_iteration": 1e6 * learn_cpu_s / iterations, "phase_cpu_us_per_iteration": per_iteration}


# --- (b) time to target ------------------------------------------------------------------------------------------
def rlspeed_time_to_target(seed: int, budget: int, eval_freq: int, args) -> dict:
    _run, hyperparameters = split_run_settings(load_preset("a2c", ENV_ID))
    model = rlspeed.A2C(ENV_ID, env_backend="auto", device=args.device, seed=seed, num_threads=args.threads,
                        **hyperparameters)
    # confirm_target=False: stop at the first evaluation that reaches the target, as the SB3 callback does
    model.learn(budget, target_return=TARGET_RETURN, eval_freq=eval_freq, eval_episodes=EVAL_EPISODES,
                progress_bar=False, confirm_target=False)
    return common.rlspeed_target_record(model)


def sb3_time_to_target(seed: int, budget: int, eval_freq: int, args) -> dict:
    from stable_baselines3.common.env_util import make_vec_env

    model, env = sb3_model(seed)
    eval_env = make_vec_env(ENV_ID, n_envs=EVAL_EPISODES, seed=seed + EVAL_SEED_OFFSET)  # one episode per env
    return common.sb3_time_to_target(model, env, eval_env, budget, eval_freq, seed, TARGET_RETURN,
                                     EVAL_EPISODES, args.threads)


# --- report ------------------------------------------------------------------------------------------------------
THROUGHPUT_ROWS = {  # run name -> (library, env column)
    "rlspeed-gymnasium": ("rlspeed", "Gymnasium SyncVectorEnv (env_backend=\"gymnasium\")"),
    "rlspeed-torch": ("rlspeed", "native torch CartPole (env_backend=\"torch\")"),
    "sb3": ("Stable-Baselines3", "Gymnasium DummyVecEnv"),
}


def paired_ratios(throughput: list[dict], key: str = "sps") -> dict[str, dict]:
    """Per seed, each rlspeed row's `key` (steps/s of wall or CPU time) over SB3's of the same seed (runs next to
    each other in time)."""
    sb3 = {r["seed"]: r[key] for r in throughput if r["name"] == "sb3"}
    paired: dict[str, list[float]] = {}
    for r in throughput:
        if r["name"] != "sb3" and r["seed"] in sb3:
            paired.setdefault(r["name"], []).append(r[key] / sb3[r["seed"]])
    return {name: common.spread(values) for name, values in paired.items()}


PHASE_ROWS = ("act", "env", "buffer", "gae", "update", "other")


def phase_summary(phases: list[dict]) -> dict:
    """Per env backend: the median over seeds of each phase's CPU microseconds per iteration, and of the total."""
    summary = {}
    for name in sorted({r["name"] for r in phases}):
        runs = [r for r in phases if r["name"] == name]
        summary[name] = {phase: statistics.median(r["phase_cpu_us_per_iteration"].get(phase, 0.0) for r in runs)
                         for phase in PHASE_ROWS}
        summary[name]["total"] = statistics.median(r["cpu_us_per_iteration"] for r in runs)
    return summary


def phase_lines(summary: dict, settings: dict) -> list[str]:
    """(c): where an rlspeed iteration's CPU time goes, against SB3's whole iteration."""
    phases = summary["phases"]
    if not phases:
        return []
    iteration_steps = ZOO_NUM_ENVS * ZOO_RLSPEED["num_steps"]
    sb3_cpu = summary.get("cpu_throughput", {}).get("sb3", {}).get("median")
    sb3_us = 1e6 * iteration_steps / sb3_cpu if sb3_cpu else None
    names = list(phases)
    rows = [[phase, *(f"{phases[name][phase]:,.0f} ({phases[name][phase] / phases[name]['total']:.0%})"
                      for name in names)] for phase in PHASE_ROWS]
    rows.append(["**one iteration**", *(f"**{phases[name]['total']:,.0f}**" for name in names)])
    lines = [f"### (c) Where an rlspeed iteration's CPU time goes ({settings['phase_seeds']} seeds per env backend)",
             "", f"One iteration is {ZOO_RLSPEED['num_steps']} steps of {ZOO_NUM_ENVS} envs ({iteration_steps} env "
             "steps) and one update; CPU microseconds per iteration of each phase of the on-policy loop "
             "(`time.thread_time` around the loop's `rlspeed.diagnostics.phases`; act: the policy's forward pass and "
             "sampling, env: `env.step` with the adapter's conversions, buffer: rollout writes and episode statistics, "
             "gae: bootstrap values and GAE, update: the gradient step, other: the learn loop), median over seeds, "
             f"{settings['steps']:,}-step runs in fresh processes."]
    if sb3_us:
        lines[-1] += (f" SB3's whole iteration (from (a)'s CPU-time median): {sb3_us:,.0f} us; 3x SB3 is "
                      f"{sb3_us / 3:,.0f} us.")
    lines += ["", common.markdown_table(["Phase", *(f"{name} (us, share)" for name in names)], rows), ""]
    return lines


def load_summary(runs: list[dict]) -> dict:
    loads = [r[key] for r in runs for key in ("load_before", "load_after")]
    return {"median": statistics.median(loads), "min": min(loads), "max": max(loads)} if loads else {}


def final_eval(run: dict) -> float | None:
    return run["evaluations"][-1][2] if run.get("evaluations") else None


def per_seed_table(to_target: list[dict]) -> str:
    rows = []
    for seed in sorted({r["seed"] for r in to_target}):
        row = [str(seed)]
        for name in ("rlspeed", "sb3"):
            run = next((r for r in to_target if r["seed"] == seed and r["name"] == name), None)
            if run is None:
                row += ["—", "—", "—"]
                continue
            row += [common.fmt(run["time_to_target_s"], ".2f"), common.fmt(run["steps_to_target"]),
                    common.fmt(final_eval(run), ".1f")]
        rows.append(row)
    return common.markdown_table(["Seed", "rlspeed s", "rlspeed steps", "rlspeed last eval", "SB3 s", "SB3 steps",
                                  "SB3 last eval"], rows)


def report(summary: dict, settings: dict, throughput: list[dict], to_target: list[dict]) -> list[str]:
    """The README section's lines (without its heading and machine block)."""
    seeds, threads = settings["seeds"], settings["threads"]
    lines = []
    if settings["quick"]:
        lines += ["**Smoke run (`--quick`): settings far too small for the numbers to mean anything.**", ""]
    load_a, load_b = summary["load"]["throughput"], summary["load"]["time_to_target"]
    lines += [f"### (a) Throughput at identical hyperparameters ({settings['steps']:,} env steps, no evaluation)", "",
              f"RL-Zoo A2C CartPole-v1 settings for both (8 envs, n_steps 5, RMSprop lr 7e-4, gae_lambda 1.0, "
              f"ent_coef 0, [64, 64] tanh), {seeds} seeds, each run a fresh process, the sides alternating, "
              f"torch.set_num_threads({threads}), rlspeed on device `{settings['device']}` ({settings['update']}), "
              "SB3 on `cpu`. Env steps per second of `learn`, by the wall clock and by the process's CPU time (the "
              "latter leaves out the time a run waited for a core on a loaded machine). Paired: per seed, rlspeed "
              "over the SB3 run next to it, median over seeds (range in brackets). 1-minute load average during these "
              f"runs: {load_a.get('median', 0):.2f} median ({load_a.get('min', 0):.2f} – {load_a.get('max', 0):.2f}) "
              f"on {settings['usable_cores']} cores.", ""]
    rows = []
    paired, paired_cpu = summary["paired_ratio_to_sb3"], summary["paired_cpu_ratio_to_sb3"]

    def paired_cell(table: dict, name: str) -> str:
        if name not in table:
            return "1.00x"
        stats = table[name]
        return f"{common.fmt_ratio(stats['median'])} ({stats['min']:.2f} – {stats['max']:.2f})"

    for name, stats in summary["throughput"].items():
        library, env = THROUGHPUT_ROWS[name]
        rows.append([library, env, common.fmt(stats["median"]), common.fmt_range(stats),
                     paired_cell(paired, name), common.fmt(summary["cpu_throughput"][name]["median"]),
                     paired_cell(paired_cpu, name)])
    lines += [common.markdown_table(["Library", "Envs (8)", "Steps/s median (wall)", f"Range ({seeds} seeds)",
                                     "rlspeed / SB3 (paired, wall)", "Steps/s median (CPU time)",
                                     "rlspeed / SB3 (paired, CPU time)"], rows), ""]

    lines += phase_lines(summary, settings)
    lines += [f"### (b) Time to mean eval return >= {TARGET_RETURN:g} (budget {settings['budget']:,} steps)", "",
              f"The settings above for both (rlspeed: its shipped preset `a2c` / `CartPole-v1`, the same values); "
              f"deterministic {EVAL_EPISODES}-episode evaluation on a separate env every {settings['eval_freq']:,} "
              "env steps, evaluation time excluded from the training clock; a run stops at the first evaluation "
              "that reaches the target (both sides: rlspeed's second, confirming evaluation is off here). Medians "
              "count a seed that missed the target as never reaching it (no median when most seeds miss); ranges "
              "are over the seeds that reached it. 1-minute load average during these runs: "
              f"{load_b.get('median', 0):.2f} median ({load_b.get('min', 0):.2f} – {load_b.get('max', 0):.2f}).", ""]
    lines += [common.time_to_target_table(summary["time_to_target"], {
        "rlspeed": ("rlspeed", "shipped preset `a2c` / `CartPole-v1`"),
        "sb3": ("Stable-Baselines3", "RL-Zoo CartPole-v1")}), ""]
    lines += ["Per seed (last eval: the mean return of the run's last evaluation, the one that reached the target "
              "when it was reached):", "", per_seed_table(to_target)]
    return lines


def parse_args() -> argparse.Namespace:
    run_settings, _ = split_run_settings(load_preset("a2c", ENV_ID))
    parser = common.peer_arguments(__doc__.split("\n\n")[0], peer="SB3", seeds=(5, 2), steps=(50_000, 4000),
                                   budget=(int(run_settings.get("total_timesteps", 500_000)), 20_000),
                                   eval_freq=EVAL_FREQ)
    parser.add_argument("--skip-throughput", action="store_true", help="skip (a)")
    parser.add_argument("--skip-target", action="store_true", help="skip (b)")
    parser.add_argument("--phase-seeds", type=int, default=3, help="seeds of (c), per env backend (0: skip (c))")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one run in this process: "kind:name:seed"
    return common.peer_defaults(parser.parse_args())


def child_run(args) -> dict:
    """The one run `--child kind:name:seed` names, in this (fresh) process."""
    kind, name, seed = args.child.split(":")
    seed = int(seed)
    if kind == "phases":
        return rlspeed_phases(seed, args.steps, name.removeprefix("rlspeed-"), args)
    if kind == "throughput":
        if name == "sb3":
            return sb3_throughput(seed, args.steps, args)
        return rlspeed_throughput(seed, args.steps, name.removeprefix("rlspeed-"), args)
    if name == "sb3":
        return sb3_time_to_target(seed, args.budget, args.eval_freq, args)
    return rlspeed_time_to_target(seed, args.budget, args.eval_freq, args)


def fresh_process_runner(kind: str, name: str, args):
    """`run(seed)` that runs `--child kind:name:seed` in a new Python process and returns its record."""
    forwarded = ["--steps", str(args.steps), "--budget", str(args.budget), "--eval-freq", str(args.eval_freq),
                 "--threads", str(args.threads), "--device", args.device]

    def run(seed: int) -> dict:
        return common.run_child(__file__, "--child", f"{kind}:{name}:{seed}", *forwarded,
                                what=f"{kind} run {name} seed {seed}")

    return run


def alternating(seeds: list[int], runners: dict) -> list[dict]:
    """`common.interleave`, with the order of the runners reversed on odd seeds (neither side always goes first)."""
    results = []
    for seed in seeds:
        order = runners if seed % 2 == 0 else dict(reversed(list(runners.items())))
        results += common.interleave([seed], order)
    return results


def main() -> None:
    args = parse_args()
    args.threads = common.set_threads(args.threads)
    if args.child:
        print(json.dumps(child_run(args)))
        return
    seeds = list(range(args.seeds))
    machine = common.machine_description()
    machine["torch_threads"] = args.threads
    settings = {"env_id": ENV_ID, "seeds": args.seeds, "steps": args.steps, "budget": args.budget,
                "eval_freq": args.eval_freq, "eval_episodes": EVAL_EPISODES, "target_return": TARGET_RETURN,
                "threads": args.threads, "device": args.device, "quick": args.quick, "skip_sb3": args.skip_sb3,
                "fresh_processes": True, "warmup_steps": WARMUP_STEPS, "phase_seeds": args.phase_seeds,
                "usable_cores": machine["usable_cores"], "zoo_hyperparameters_rlspeed": ZOO_RLSPEED,
                "zoo_hyperparameters_sb3": ZOO_SB3, "rlspeed_preset": load_preset("a2c", ENV_ID), "update": "?"}
    print(f"A2C {ENV_ID}: {args.seeds} seeds, torch.set_num_threads({args.threads}), rlspeed device {args.device}, "
          f"load {load_1m():.2f}")

    throughput: list[dict] = []
    if not args.skip_throughput:
        names = ["rlspeed-gymnasium", "sb3", "rlspeed-torch"]
        if args.skip_sb3:
            names.remove("sb3")
        print(f"(a) throughput, {args.steps:,} steps per run, each in a fresh process", flush=True)
        throughput = alternating(seeds, {name: with_load(fresh_process_runner("throughput", name, args))
                                         for name in names})
        settings["update"] = next(r["update"] for r in throughput if "update" in r)

    phases: list[dict] = []
    if args.phase_seeds:
        print(f"(c) CPU time per phase, {args.steps:,} steps per run, each in a fresh process", flush=True)
        phases = common.interleave(list(range(args.phase_seeds)), {
            name: fresh_process_runner("phases", name, args) for name in ("rlspeed-gymnasium", "rlspeed-torch")})

    to_target: list[dict] = []
    if not args.skip_target:
        print(f"(b) time to {TARGET_RETURN:g}, budget {args.budget:,} steps, eval every {args.eval_freq:,}",
              flush=True)
        names = ["rlspeed"] + ([] if args.skip_sb3 else ["sb3"])
        to_target = alternating(seeds, {name: with_load(fresh_process_runner("target", name, args))
                                        for name in names})

    summary = common.summarize(throughput, to_target, THROUGHPUT_ROWS)
    summary["paired_ratio_to_sb3"] = paired_ratios(throughput)
    summary["paired_cpu_ratio_to_sb3"] = paired_ratios(throughput, "cpu_sps")
    summary["cpu_throughput"] = {name: common.spread([r["cpu_sps"] for r in throughput if r["name"] == name])
                                 for name in summary["throughput"]}
    summary["phases"] = phase_summary(phases)
    summary["load"] = {"throughput": load_summary(throughput), "time_to_target": load_summary(to_target)}
    summary["final_eval"] = {f"{r['name']}-{r['seed']}": final_eval(r) for r in to_target}
    common.publish("a2c_cartpole", ["## A2C on CartPole-v1 (`benchmarks/a2c_cartpole.py`)", "",
                                    *report(summary, settings, throughput, to_target)],
                   {"settings": settings, "summary": summary, "throughput": throughput, "time_to_target": to_target,
                    "phases": phases},
                   not args.no_write, machine=machine)


if __name__ == "__main__":
    main()
