"""LunarLander-v3 with PPO and DQN at RL-Zoo's settings: training time and env steps to a mean evaluation return of
200, rlspeed beside Stable-Baselines3, every run in a fresh process, the sides alternating.

Both sides take RL-Zoo's entry for the pair from the installed rl_zoo3's hyperparams YAML (PPO: 16 envs x 1,024
steps, batch 64, 4 epochs, gamma 0.999, GAE 0.98, ent_coef 0.01; DQN: lr 6.3e-4, batch 128, buffer 50,000, target
update every 250 steps, train_freq 4 with as many gradient steps as env steps, epsilon to 0.1 over 12%, net_arch
[256, 256]) and SB3's defaults for the rest: rlspeed through its translation (`load_preset(algo, env_id, "zoo")`,
what `rlspeed train ALGO LunarLander-v3 --preset zoo` runs), SB3 from the same entry in its own names
(`policy_kwargs` read with rlspeed's literal parser, never evaluated). The budget is the entry's n_timesteps.

Deterministic 10-episode evaluations on a separate env every `eval_freq` env steps (PPO: every rollout of 16,384
steps; DQN: 2,500), evaluation time excluded from the training clock of both; a run stops at the first evaluation
that reaches 200 (rlspeed's confirming second evaluation is off, as SB3 has none). torch.set_num_threads(--threads,
default 1) for every run. The 1-minute load average is recorded before and after every run (the machine may be
shared); each run also records its process's CPU time, which leaves out the time it waited for a core.

Usage: python benchmarks/lunar_lander.py [--seeds N] [--algos ppo,dqn] [--threads 1] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import common

ENV_ID = "LunarLander-v3"
TARGET_RETURN = 200.0
EVAL_EPISODES = 10
EVAL_SEED_OFFSET = 100_000  # evaluation envs are seeded apart from the training envs (as rlspeed does)
EVAL_FREQ = {"ppo": 16_384, "dqn": 2_500}


def zoo_entry(algo: str) -> dict:
    """RL-Zoo's entry for (algo, LunarLander-v3), as its YAML holds it."""
    from rlspeed.presets import zoo

    return dict(zoo.zoo_entries(algo)[ENV_ID])


BUDGET_OVERRIDE: list[int] = []  # --budget (a quick check of the script), else RL-Zoo's n_timesteps


def budget(algo: str) -> int:
    return BUDGET_OVERRIDE[0] if BUDGET_OVERRIDE else int(float(zoo_entry(algo)["n_timesteps"]))


def rlspeed_run(algo: str, seed: int, args) -> dict:
    import rlspeed
    from rlspeed.presets import load_preset, split_run_settings

    _run, hyperparameters = split_run_settings(load_preset(algo, ENV_ID, "zoo"))
    model = getattr(rlspeed, algo.upper())(ENV_ID, seed=seed, num_threads=args.threads, **hyperparameters)
    model.make_training_env()  # built outside the timed region, like SB3's env
    cpu_started = time.process_time()
    model.learn(budget(algo), target_return=TARGET_RETURN, eval_freq=EVAL_FREQ[algo], eval_episodes=EVAL_EPISODES,
                progress_bar=False, confirm_target=False)
    return {**common.rlspeed_target_record(model, update=model.report().splitlines()[0]),
            "cpu_s": time.process_time() - cpu_started}


def sb3_run(algo: str, seed: int, args) -> dict:
    import stable_baselines3
    from stable_baselines3.common.env_util import make_vec_env

    from rlspeed.presets.zoo import parse_python_literal

    entry = zoo_entry(algo)
    for key in ("n_timesteps", "normalize"):
        if entry.pop(key, False) and key == "normalize":
            raise SystemExit(f"RL-Zoo's {algo} {ENV_ID} entry normalises; this script does not wrap SB3's env.")
    n_envs, policy = int(entry.pop("n_envs", 1)), entry.pop("policy")
    policy_kwargs = parse_python_literal(entry.pop("policy_kwargs"), "policy_kwargs") if "policy_kwargs" in entry \
        else None
    env = make_vec_env(ENV_ID, n_envs=n_envs, seed=seed)
    model = getattr(stable_baselines3, algo.upper())(policy, env, seed=seed, device="cpu",
                                                     policy_kwargs=policy_kwargs, **entry)
    eval_env = make_vec_env(ENV_ID, n_envs=EVAL_EPISODES, seed=seed + EVAL_SEED_OFFSET)  # one episode per env
    cpu_started = time.process_time()
    record = common.sb3_time_to_target(model, env, eval_env, budget(algo), EVAL_FREQ[algo], seed + EVAL_SEED_OFFSET,
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=1)
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
    runs = []
    for algo in args.algos.split(","):
        for seed in range(args.seeds):
            order = ("rlspeed", "sb3") if seed % 2 == 0 else ("sb3", "rlspeed")
            for side in order:
                runs.append(fresh_process(algo, side, seed, args))
                r = runs[-1]
                print(f"  {algo} {side} seed {seed}: "
                      + (f"200 after {r['steps_to_target']:,} steps, {r['time_to_target_s']:.1f} s" if r["reached"]
                         else f"not reached in {r['steps']:,} steps"), flush=True)
    lines = ["## LunarLander-v3: PPO and DQN to 200 beside SB3 (`benchmarks/lunar_lander.py`)", "",
             f"RL-Zoo's settings for both (see the script's docstring), {args.seeds} seed(s) per algorithm, each run a "
             "fresh process, the sides alternating; training seconds exclude evaluations; a run stops at the first "
             f"deterministic 10-episode evaluation with mean >= {TARGET_RETURN:g} (PPO evaluated every "
             f"{EVAL_FREQ['ppo']:,} env steps, DQN every {EVAL_FREQ['dqn']:,}); the budget is RL-Zoo's n_timesteps "
             f"(PPO {budget('ppo'):,}, DQN {budget('dqn'):,}). The process CPU time counts training and evaluations "
             "and leaves out waiting for a core.", "", table(runs)]
    machine = common.machine_description(("rlspeed", "torch", "gymnasium", "numpy", "stable-baselines3", "rl_zoo3"))
    machine["torch_threads"] = args.threads
    common.publish("lunar_lander", lines, {"settings": {"seeds": args.seeds, "eval_freq": EVAL_FREQ,
                                                        "threads": args.threads}, "runs": runs},
                   not args.no_write, machine=machine)


if __name__ == "__main__":
    main()
