"""MuJoCo (Gymnasium v5 ids): rlspeed SAC against Stable-Baselines3 SAC on HalfCheetah-v5 at RL-Zoo settings, and
learning at fixed budgets (SAC HalfCheetah, TD3 and PPO Hopper).

Three subcommands, so that each measurement runs in a fresh process and the slow learning runs can go in the
background:

- `throughput`: steps/s of training in a steady-state window (after the 10,000 random steps and a warm-up of
  updates), rlspeed fp32 eager, rlspeed `accelerate="auto"` and SB3, each pair of runs in fresh processes one after
  another (the order alternates pair by pair), so that a busy patch of a shared machine hits every side; reports the
  ratio per pair and the median. Both libraries: 1 env (Gymnasium), batch 256, [256, 256], lr 3e-4, one gradient
  step per env step, automatic entropy, learning_starts 10,000 (RL-Zoo's MuJoCo defaults; rlspeed's preset). The
  `accelerate="auto"` side searches at its second update, in the untimed warm-up of updates
  (`common.acceleration_decided_at_once`; the window would not reach the search otherwise, which waits for the
  updates to pay for it), so the window times its choice; it needs `--warmup` >= 2.
- `sb3-learn`: one SB3 learning run at a fixed budget with RL-Zoo's settings, then the evaluation rlspeed's
  `summary.json` holds (deterministic, 10 episodes, a separate env); writes a JSON file. rlspeed's learning runs
  are `rlspeed train ... --out DIR` (summary.json's `final_eval`).
- `publish`: the README section and results/mujoco_offpolicy.json from the throughput JSON and the learning runs.

torch.set_num_threads(--threads, default 1) for every run of both libraries.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from pathlib import Path

import common

ENV_ID = "HalfCheetah-v5"
LEARNING_STARTS = 10_000
EVAL_EPISODES = 10
EVAL_SEED_OFFSET = 100_000  # the SB3 side's final evaluation is seeded seed + this, as its published numbers were;
# rlspeed's final_eval takes rlspeed.evaluation.evaluation_seed(seed, "final", steps): other episodes of the env


# --- throughput --------------------------------------------------------------------------------------------------

def worker(side: str, steps: int, warmup: int, threads: int, seed: int, device: str = "cpu") -> dict:
    """One throughput run in this process: train for LEARNING_STARTS + warmup + steps, time the last `steps`."""
    common.set_threads(threads)
    marks: list[tuple[float, int]] = []
    total = LEARNING_STARTS + warmup + steps
    window = (LEARNING_STARTS + warmup, total)  # marked whatever --warmup and --steps are (not only every 100 steps)
    if side == "sb3":
        from stable_baselines3 import SAC
        from stable_baselines3.common.callbacks import BaseCallback

        class Marks(BaseCallback):
            def _on_step(self) -> bool:
                if self.num_timesteps % 100 == 0 or self.num_timesteps in window:
                    marks.append((time.perf_counter(), self.num_timesteps))
                return True

        model = SAC("MlpPolicy", ENV_ID, learning_starts=LEARNING_STARTS, seed=seed, device=device, verbose=0)
        common.set_threads(threads)
        model.learn(total, callback=Marks())
        record = {"library": "stable-baselines3", "update": "SB3 SAC, fp32 eager"}
    else:
        import rlspeed
        from rlspeed.presets import load_preset, split_run_settings

        def mark(local_vars) -> bool:
            step = local_vars["self"].num_timesteps
            if step % 100 == 0 or step in window:
                marks.append((time.perf_counter(), step))
            return True

        accelerate = "auto" if side == "rlspeed-auto" else "off"
        _run, hyperparameters = split_run_settings(load_preset("sac", ENV_ID))  # RL-Zoo's MuJoCo settings
        model = rlspeed.SAC(ENV_ID, seed=seed, device=device, env_backend="gymnasium", accelerate=accelerate,
                            num_threads=threads, **hyperparameters)
        common.set_threads(threads)
        with common.acceleration_decided_at_once() if accelerate == "auto" else contextlib.nullcontext():
            model.learn(total, callback=mark, progress_bar=False)
        record = {"library": "rlspeed", "accelerate_arg": accelerate,
                  "accelerate": _json_safe(model.acceleration_summary()), "update": _json_safe(model.update_summary()),
                  "report": model.report()}
    return {"side": side, "threads": threads, "device": device, "warmup_steps": warmup, **record,
            **common.window_sps(marks, LEARNING_STARTS + warmup)}


def _json_safe(value):
    return json.loads(json.dumps(value, default=str)) if value is not None else None


def throughput(args) -> dict:
    worker_args = ["--steps", str(args.steps), "--warmup", str(args.warmup), "--threads", str(args.threads),
                   "--device", args.device]
    data = {"steps": args.steps, "warmup": args.warmup, "pairs": args.pairs, "threads": args.threads,
            "device": args.device,
            **common.worker_pairs(__file__, ["rlspeed", "sb3", "rlspeed-auto"], args.pairs, worker_args),
            "machine": common.machine_description(("rlspeed", "torch", "gymnasium", "mujoco", "stable-baselines3"))}
    Path(args.json).write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {args.json}")
    return data


# --- SB3 learning runs -------------------------------------------------------------------------------------------

def sb3_learn(args) -> dict:
    import gymnasium as gym
    import torch
    from stable_baselines3 import PPO, SAC, TD3
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.noise import NormalActionNoise
    from stable_baselines3.common.vec_env import VecNormalize

    common.set_threads(args.threads)
    normalize = None
    if args.algo == "sac":  # RL-Zoo hyperparams/sac.yml, MuJoCo entries: SB3 defaults after 10,000 random steps
        model = SAC("MlpPolicy", args.env, learning_starts=LEARNING_STARTS, seed=args.seed, device="cpu")
    elif args.algo == "td3":  # RL-Zoo hyperparams/td3.yml: normal noise 0.1, 10,000 random steps
        actions = gym.make(args.env).action_space.shape[0]
        model = TD3("MlpPolicy", args.env, learning_starts=LEARNING_STARTS, seed=args.seed, device="cpu",
                    action_noise=NormalActionNoise(mean=[0.0] * actions, sigma=[0.1] * actions))
    else:  # RL-Zoo hyperparams/ppo.yml, Hopper-v4 entry, normalize: true
        env = VecNormalize(make_vec_env(args.env, n_envs=1, seed=args.seed), gamma=0.999)
        normalize = env
        model = PPO("MlpPolicy", env, batch_size=32, n_steps=512, gamma=0.999, learning_rate=9.80828e-05,
                    ent_coef=0.00229519, clip_range=0.2, n_epochs=5, gae_lambda=0.99, max_grad_norm=0.7,
                    vf_coef=0.835671, seed=args.seed, device="cpu",
                    policy_kwargs=dict(log_std_init=-2, ortho_init=False, activation_fn=torch.nn.ReLU,
                                       net_arch=dict(pi=[256, 256], vf=[256, 256])))
    common.set_threads(args.threads)
    started = time.perf_counter()
    model.learn(args.budget)
    train_wall_s = time.perf_counter() - started
    eval_env = make_vec_env(args.env, n_envs=1, seed=args.seed + EVAL_SEED_OFFSET)
    if normalize is not None:
        eval_env = VecNormalize(eval_env, training=False, norm_reward=False)
        eval_env.obs_rms = normalize.obs_rms
    returns, _ = evaluate_policy(model, eval_env, n_eval_episodes=EVAL_EPISODES, deterministic=True,
                                 return_episode_rewards=True)
    result = {"library": "stable-baselines3", "algo": args.algo, "env_id": args.env, "seed": args.seed,
              "total_timesteps": int(model.num_timesteps), "train_wall_s": train_wall_s,
              "sps": model.num_timesteps / train_wall_s,
              "final_eval": {"mean": float(statistics.fmean(returns)), "std": float(statistics.pstdev(returns)),
                             "episodes": len(returns), "returns": [float(r) for r in returns]}}
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return result


# --- publish -----------------------------------------------------------------------------------------------------

def publish(args) -> None:
    data = json.loads(Path(args.throughput).read_text())
    data["machine"]["torch_threads"] = data["threads"]  # what every worker set (the parent process sets none)
    labels = {"rlspeed": "rlspeed SAC, `accelerate=\"off\"` (fp32 eager)",
              "rlspeed-auto": "rlspeed SAC, `accelerate=\"auto\"`",
              "sb3": "Stable-Baselines3 SAC (fp32)"}
    summary: dict = {}
    rows = []
    for side in ("rlspeed", "rlspeed-auto", "sb3"):
        summary[side] = stats = common.pair_throughput(data, side)
        rows.append([labels[side], common.fmt(stats["sps"]["median"], ",.1f"), common.fmt_range(stats["sps"], ",.1f"),
                     ", ".join(f"{r:.2f}" for r in stats["ratio_to_sb3_per_pair"]),
                     common.fmt_ratio(stats["ratio_to_sb3_median"])])
    auto_runs = [r for r in data["runs"] if r["side"] == "rlspeed-auto"]
    learning = common.learning_records(args.rlspeed_runs, args.sb3_runs)
    learn_rows = []
    for run in learning:
        evaluation = run.get("final_eval") or {}
        learn_rows.append([run["library"], run["algo"].upper(), run["env_id"], run.get("seed"),
                           f"{run['total_timesteps']:,}", common.fmt(evaluation.get("mean"), ",.1f"),
                           common.fmt(evaluation.get("std"), ",.1f"), common.fmt(run.get("sps"), ",.0f")])
    load = common.pairs_load(data)
    lines = [
        "## MuJoCo: SAC HalfCheetah-v5 throughput, SAC/TD3/PPO learning at fixed budgets "
        "(`benchmarks/mujoco_offpolicy.py`)",
        "",
        f"### (a) SAC HalfCheetah-v5 steps/s at RL-Zoo settings ({data['pairs']} pairs, fresh processes)",
        "",
        "Both: 1 Gymnasium env, batch 256, [256, 256] ReLU, lr 3e-4, one gradient step per env step, automatic "
        "entropy, learning_starts 10,000 (rlspeed's preset = RL-Zoo's MuJoCo defaults). Timed window: "
        f"{data['steps']:,} env steps after the 10,000 random steps and {data['warmup']:,} steps of updates "
        f"(start-up, random steps and warm-up excluded). torch.set_num_threads({data['threads']}) in every run. "
        "Each pair runs the three sides one after another in fresh processes, order reversed every other pair. "
        f"The 2 cores were shared with other jobs ({load}): compare ratios within a pair.",
        "",
        common.markdown_table(["Library", "Steps/s median", "Range", "Ratio to SB3 per pair", "Median ratio"], rows),
        "",
        "`accelerate=\"auto\"` chose, per process: " + "; ".join(
            f"pair {r['pair']}: {r['accelerate']['precision']} ({r['sps']:.1f} steps/s)" for r in auto_runs)
        + f" (update: `{json.dumps(auto_runs[0].get('update') if auto_runs else None)}`).",
        "",
        "### (b) Learning at fixed budgets (one seed per library)",
        "",
        "Final evaluation: deterministic policy, 10 episodes, on an env separate from training (rlspeed: "
        "`rlspeed train ... --out DIR`, summary.json `final_eval`; SB3: `evaluate_policy` on a fresh env, "
        "with the training normalisation statistics frozen for PPO). Steps/s here are whole runs on a shared "
        "machine, not a speed comparison.",
        "",
        common.markdown_table(["Library", "Algo", "Env", "Seed", "Env steps", "Eval mean", "Eval std",
                               "Steps/s (whole run)"], learn_rows),
    ]
    if not learn_rows:
        lines[-1] = "No learning run finished for this section in this session."
    lines += common.section_notes(args.notes, args.commit)
    common.publish("mujoco_offpolicy", lines, {"throughput": data, "throughput_summary": summary,
                                              "learning": learning},
                   write=not args.no_write, machine=data["machine"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("worker", help="(internal) one throughput run; prints JSON")
    w.add_argument("--side", choices=["rlspeed", "rlspeed-auto", "sb3"], required=True)
    for p in (w, t := sub.add_parser("throughput", help="alternating pairs of throughput runs")):
        p.add_argument("--steps", type=int, default=2000, help="timed env steps per run")
        p.add_argument("--warmup", type=int, default=500, help="update steps after learning_starts, not timed")
        p.add_argument("--threads", type=int, default=1)
        p.add_argument("--device", default="cpu", help="both libraries train on this device (cpu, cuda)")
    w.add_argument("--seed", type=int, default=0)
    t.add_argument("--pairs", type=int, default=3)
    t.add_argument("--json", default=common.default_pairs_json("mujoco_throughput.json"))
    s = sub.add_parser("sb3-learn", help="one SB3 learning run at a fixed budget")
    s.add_argument("--algo", choices=["sac", "td3", "ppo"], required=True)
    s.add_argument("--env", default=ENV_ID)
    s.add_argument("--budget", type=int, default=100_000)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--threads", type=int, default=1)
    s.add_argument("--json", required=True)
    p = common.add_publish_parser(sub, "write the README section and results JSON")
    p.add_argument("--throughput", default=common.default_pairs_json("mujoco_throughput.json"))
    args = parser.parse_args()
    if args.command == "worker":
        print(json.dumps(worker(args.side, args.steps, args.warmup, args.threads, args.seed, args.device)))
    else:
        {"throughput": throughput, "sb3-learn": sb3_learn, "publish": publish}[args.command](args)


if __name__ == "__main__":
    main()
