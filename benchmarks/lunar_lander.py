"""LunarLander-v3 with PPO and DQN, LunarLanderContinuous-v3 with SAC and TD3, at RL-Zoo's settings: training time
and env steps to a mean evaluation return of 200, rlspeed beside Stable-Baselines3, every run in a fresh process, the
sides alternating.

Both sides take RL-Zoo's entry for the pair from the installed rl_zoo3's hyperparams YAML (PPO: 16 envs x 1,024
steps, batch 64, 4 epochs, gamma 0.999, GAE 0.98, ent_coef 0.01; DQN: lr 6.3e-4, batch 128, buffer 50,000, target
update every 250 steps, train_freq 4 with as many gradient steps as env steps, epsilon to 0.1 over 12%, net_arch
[256, 256]; SAC: lr linear from 7.3e-4, batch 256, buffer 1M, tau 0.01, 10,000 random steps, net_arch [400, 300];
TD3: lr 1e-3, gamma 0.98, buffer 200,000, Gaussian action noise 0.1, 10,000 random steps, net_arch [400, 300]) and
SB3's defaults for the rest: rlspeed through its translation (`load_preset(algo, env_id, "zoo")`,
what `rlspeed train ALGO LunarLander-v3 --preset zoo` runs; it sets SB3's defaults where rlspeed's differ, for DQN,
SAC and TD3 PyTorch's layer initialisation and Adam epsilon 1e-8 since commit 80ea7d9), SB3 from the same entry in
its own names
(`policy_kwargs` read with rlspeed's literal parser, never evaluated; `lin_X` learning rates as RL-Zoo's linear
schedule and `noise_type`/`noise_std` as SB3's `NormalActionNoise`, as RL-Zoo builds them). The budget is the entry's
n_timesteps.

Deterministic 10-episode evaluations on a separate env every `eval_freq` env steps (PPO: every rollout of 16,384
steps; DQN: 2,500; SAC and TD3: 10,000), evaluation time excluded from the training clock of both; a run stops at
the first evaluation that reaches 200 (rlspeed's confirming second evaluation is off, as SB3 has none).
torch.set_num_threads(--threads, default 1) for every run. The 1-minute load average is recorded before and after
every run (the machine may be shared); each run also records its process's CPU time, which leaves out the time it
waited for a core.

Usage: python benchmarks/lunar_lander.py [--seeds N] [--first-seed S] [--add] [--sides rlspeed,sb3]
[--algos ppo,dqn | --algos sac,td3] [--threads 1] [--no-write]
(`--add`: the section's stored runs (results/<section>.json) join this call's, so seeds can be run one call at a
time; the discrete pairs publish section `lunar_lander`, the continuous ones `lunar_lander_continuous_<algos>`)
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import common

ENV_IDS = {"ppo": "LunarLander-v3", "dqn": "LunarLander-v3", "sac": "LunarLanderContinuous-v3",
           "td3": "LunarLanderContinuous-v3"}
TARGET_RETURN = 200.0
EVAL_EPISODES = 10
EVAL_SEED_OFFSET = 100_000  # the SB3 side's evaluation env is made with seed + this; each evaluation then reseeds it
# with the seed rlspeed's learn evaluates on at that step (common.sb3_target_callback): both sides' episodes have
# the same seeds (the same episodes where rlspeed's side runs Gymnasium's envs)
EVAL_FREQ = {"ppo": 16_384, "dqn": 2_500, "sac": 10_000, "td3": 10_000}


def zoo_entry(algo: str) -> dict:
    """RL-Zoo's entry for (algo, its LunarLander env), as its YAML holds it."""
    from rlspeed.presets import zoo

    return dict(zoo.zoo_entries(algo)[ENV_IDS[algo]])


BUDGET_OVERRIDE: list[int] = []  # --budget (a quick check of the script), else RL-Zoo's n_timesteps


def budget(algo: str) -> int:
    return BUDGET_OVERRIDE[0] if BUDGET_OVERRIDE else int(float(zoo_entry(algo)["n_timesteps"]))


def rlspeed_run(algo: str, seed: int, args) -> dict:
    import rlspeed
    from rlspeed.presets import load_preset, split_run_settings

    _run, hyperparameters = split_run_settings(load_preset(algo, ENV_IDS[algo], "zoo"))
    model = getattr(rlspeed, algo.upper())(ENV_IDS[algo], seed=seed, num_threads=args.threads, **hyperparameters)
    model.make_training_env()  # built outside the timed region, like SB3's env
    cpu_started = time.process_time()
    model.learn(budget(algo), target_return=TARGET_RETURN, eval_freq=EVAL_FREQ[algo], eval_episodes=EVAL_EPISODES,
                progress_bar=False, confirm_target=False)
    return {**common.rlspeed_target_record(model, update=model.report().splitlines()[0]),
            "cpu_s": time.process_time() - cpu_started}


def sb3_arguments(algo: str, n_actions: int | None = None) -> dict:
    """RL-Zoo's entry in SB3's constructor arguments, built as RL-Zoo builds them: `policy_kwargs` parsed (never
    evaluated), `lin_X` as a linear schedule from X, `noise_type: normal` + `noise_std` as `NormalActionNoise`."""
    import numpy as np

    from rlspeed.presets.zoo import parse_python_literal

    entry = zoo_entry(algo)
    for key in ("n_timesteps", "normalize"):
        if entry.pop(key, False) and key == "normalize":
            raise SystemExit(f"RL-Zoo's {algo} {ENV_IDS[algo]} entry normalises; this script does not wrap SB3's env.")
    if "policy_kwargs" in entry:
        entry["policy_kwargs"] = parse_python_literal(entry["policy_kwargs"], "policy_kwargs")
    rate = entry.get("learning_rate")
    if isinstance(rate, str) and rate.startswith("lin_"):
        initial = float(rate[len("lin_"):])
        entry["learning_rate"] = lambda progress_remaining: progress_remaining * initial
    if "noise_type" in entry:
        from stable_baselines3.common.noise import NormalActionNoise

        kind, std = entry.pop("noise_type"), float(entry.pop("noise_std"))
        if kind != "normal":
            raise SystemExit(f"RL-Zoo's {algo} {ENV_IDS[algo]} entry asks for {kind!r} noise; this script builds "
                             f"only 'normal'.")
        entry["action_noise"] = NormalActionNoise(np.zeros(n_actions), std * np.ones(n_actions))
    return entry


def sb3_run(algo: str, seed: int, args) -> dict:
    import stable_baselines3
    from stable_baselines3.common.env_util import make_vec_env

    env_id = ENV_IDS[algo]
    env = make_vec_env(env_id, n_envs=int(zoo_entry(algo).get("n_envs", 1)), seed=seed)
    entry = sb3_arguments(algo, env.action_space.shape[0] if env.action_space.shape else None)
    entry.pop("n_envs", None)
    model = getattr(stable_baselines3, algo.upper())(entry.pop("policy"), env, seed=seed, device="cpu", **entry)
    eval_env = make_vec_env(env_id, n_envs=EVAL_EPISODES, seed=seed + EVAL_SEED_OFFSET)  # one episode per env
    cpu_started = time.process_time()
    record = common.sb3_time_to_target(model, env, eval_env, budget(algo), EVAL_FREQ[algo], seed,
                                       TARGET_RETURN, EVAL_EPISODES, args.threads)
    return {**record, "cpu_s": time.process_time() - cpu_started}


def child(args) -> dict:
    algo, side, seed = args.child.split(":")
    warnings.simplefilter("ignore")  # (SB3's and Gymnasium's deprecation notes)
    common.set_threads(args.threads)
    run = rlspeed_run if side == "rlspeed" else sb3_run
    return {"algo": algo, "name": side, "seed": int(seed), **run(algo, int(seed), args)}


def fresh_process(algo: str, side: str, seed: int, args) -> dict:
    load_before = common.load_average()
    record = common.run_child(__file__, "--child", f"{algo}:{side}:{seed}", "--threads", str(args.threads),
                              *(["--budget", str(args.budget)] if args.budget else []),
                              what=f"{algo} {side} seed {seed}")
    record.update(load_before=load_before, load_after=common.load_average())
    return record


def table(runs: list[dict]) -> str:
    rows = []
    for algo in dict.fromkeys(r["algo"] for r in runs):
        times = {}
        for side, library in (("rlspeed", "rlspeed"), ("sb3", "Stable-Baselines3")):
            mine = [r for r in runs if r["algo"] == algo and r["name"] == side]
            seconds = common.spread([r["time_to_target_s"] for r in mine])
            steps = common.spread([r["steps_to_target"] for r in mine])
            times[side] = seconds["median"]
            cpu = common.spread([r["cpu_s"] for r in mine])
            rows.append([algo.upper(), library, f"{seconds['count']}/{seconds['of']}",
                         common.fmt(seconds["median"], ",.1f"), common.fmt_range(seconds, ",.1f"),
                         common.fmt(steps["median"]), common.fmt_range(steps), common.fmt(cpu["median"], ",.0f"),
                         ", ".join(f"{r['load_before']} / {r['load_after']}" for r in mine)])
        rows[-2].append(common.fmt_ratio(common.ratio(times["sb3"], times["rlspeed"])))
        rows[-1].append("1.00x")
    return common.markdown_table(["algo", "library", "reached", "train s to 200 (median)", "range", "steps to 200",
                                  "range", "process CPU s (training + evaluations)",
                                  "1-min load before / after each run", "SB3 / rlspeed (time)"], rows)


def separate_calls(runs: list[dict]) -> list[str]:
    """A note naming the seeds whose two sides came from separate calls of the script (`--add`), so were not run
    one after the other; runs stored before calls were recorded count as one earlier call."""
    pairs = []
    for algo in dict.fromkeys(r["algo"] for r in runs):
        for seed in sorted({r["seed"] for r in runs if r["algo"] == algo}):
            calls = {r["name"]: r.get("call", "an earlier call") for r in runs
                     if r["algo"] == algo and r["seed"] == seed}
            if len(calls) == 2 and calls["rlspeed"] != calls["sb3"]:
                pairs.append(f"{algo.upper()} seed {seed} (rlspeed: {calls['rlspeed']}; SB3: {calls['sb3']})")
    if not pairs:
        return []
    return ["", "Not side by side: the two sides of " + ", ".join(pairs) + " came from separate calls of this script "
            "(`--add`), so the machine's load may have differed between them (see the load column)."]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=1, help="seeds per algorithm: first-seed .. first-seed + N - 1")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--add", action="store_true", help="keep the section's stored runs and add this call's")
    parser.add_argument("--sides", default="rlspeed,sb3", help="which libraries to run (with --add: replace theirs)")
    parser.add_argument("--algos", default="ppo,dqn")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--budget", type=int, help="env steps per run instead of RL-Zoo's (a quick check)")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.budget:
        BUDGET_OVERRIDE.append(args.budget)
    if args.child:
        print(json.dumps(child(args)))
        return
    algos = args.algos.split(",")
    if not set(algos) <= ENV_IDS.keys():
        raise SystemExit(f"--algos takes some of {', '.join(ENV_IDS)}, not {args.algos!r}.")
    env_ids = sorted({ENV_IDS[algo] for algo in algos})
    if len(env_ids) != 1:
        raise SystemExit("--algos takes the discrete pairs (ppo, dqn) or the continuous ones (sac, td3), not both: "
                         "each env has its own section.")
    runs = []
    call = common.machine_description()["date_utc"]  # (which call of the script made a run: --add merges calls)
    for algo in algos:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            order = ("rlspeed", "sb3") if seed % 2 == 0 else ("sb3", "rlspeed")
            for side in (side for side in order if side in args.sides.split(",")):
                runs.append({**fresh_process(algo, side, seed, args), "call": call})
                r = runs[-1]
                print(f"  {algo} {side} seed {seed}: "
                      + (f"200 after {r['steps_to_target']:,} steps, {r['time_to_target_s']:.1f} s" if r["reached"]
                         else f"not reached in {r['steps']:,} steps"), flush=True)
    name = "lunar_lander"  # the discrete pairs; each continuous run has its own section, so they can run in parallel
    if env_ids[0].startswith("LunarLanderContinuous"):
        name = "_".join(["lunar_lander_continuous", *algos])
    if args.add:  # the runs stored before, of other seeds (a rerun seed replaces its stored runs)
        stored = json.loads((common.RESULTS_DIR / f"{name}.json").read_text())["runs"]
        ran = {(run["algo"], run["name"], run["seed"]) for run in runs}
        runs = [run for run in stored if (run["algo"], run["name"], run["seed"]) not in ran] + runs
    seeds = sorted({run["seed"] for run in runs})
    names = " and ".join(algo.upper() for algo in algos)
    every = ", ".join(f"{algo.upper()} evaluated every {EVAL_FREQ[algo]:,} env steps" for algo in algos)
    budgets = ", ".join(f"{algo.upper()} {budget(algo):,}" for algo in algos)
    lines = [f"## {env_ids[0]}: {names} to 200 beside SB3 (`benchmarks/lunar_lander.py`)", "",
             f"RL-Zoo's settings for both (see the script's docstring), seed(s) {', '.join(map(str, seeds))} per "
             "algorithm, each run a "
             "fresh process, the sides alternating; training seconds exclude evaluations; a run stops at the first "
             f"deterministic 10-episode evaluation with mean >= {TARGET_RETURN:g} ({every}); the budget is "
             + ("--budget's, not RL-Zoo's" if BUDGET_OVERRIDE else "RL-Zoo's n_timesteps")
             + f" ({budgets}). The process CPU time counts training and evaluations and leaves out waiting "
             "for a core.", "", table(runs), *separate_calls(runs)]
    machine = common.machine_description(("rlspeed", "torch", "gymnasium", "numpy", "stable-baselines3", "rl_zoo3"))
    machine["torch_threads"] = args.threads
    common.publish(name, lines, {"settings": {"seeds": seeds, "eval_freq": {a: EVAL_FREQ[a] for a in algos},
                                              "threads": args.threads}, "runs": runs},
                   not args.no_write, machine=machine)


if __name__ == "__main__":
    main()
