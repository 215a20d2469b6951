"""DQN on Atari Breakout (BreakoutNoFrameskip-v4) at a fixed budget: rlspeed's final evaluation return beside
Stable-Baselines3's `CnnPolicy` at the same budget and settings (RL-Zoo's DQN `atari` entry, which rlspeed's preset
translates: presets/dqn.yaml).

Three subcommands, so that each learning run is a fresh process that can go in the background:

- `rlspeed-learn`: runs `rlspeed train dqn BreakoutNoFrameskip-v4 --total-timesteps N --seed S --threads 1 --out DIR`
  as a child process and writes DIR/benchmark.json beside rlspeed's summary.json (`final_eval`): the command, its
  wall time, the child's CPU time and peak memory, and `uptime` before and after.
- `sb3-learn`: one SB3 DQN learning run (`make_atari_env` + `VecFrameStack(4)`, 1 env, DummyVecEnv) at the same
  settings, then a deterministic 10-episode evaluation on separate envs with full games and raw scores; writes a JSON
  file with the same timings.
- `publish`: the README section and results/atari_dqn.json.

Settings both sides share (SB3's DQN defaults where RL-Zoo's entry names none): 1 env, replay of 100,000 transitions,
learning_starts 100,000 (uniform random actions, no updates, until then), one gradient step on a batch of 32 every 4
env steps, target network copied every 1,000 env steps, Adam lr 1e-4, Huber loss, global grad norm clipped at 10,
gamma 0.99, 1-step targets, no double Q, epsilon 1 -> 0.01 linearly over the first 10% of the learn call's
total_timesteps (both libraries compute it from the call's budget), Nature CNN with a linear Q head on its 512
features, images scaled to [0, 1]. Adam's epsilon: rlspeed's DQN uses 1e-5 (not a hyperparameter), SB3's DQN torch's
1e-8; `sb3-learn --adam-eps` (default 1e-5) sets SB3's to rlspeed's.

Evaluation: 10 full games (no episodic life, no reward clipping), deterministic (greedy) policy, on envs separate
from training, FIRE pressed for the policy at the start of each game and after each lost life: rlspeed's evaluation
env does this (`rlspeed.envs.atari.FireToStart`); for SB3 this script adds the after-a-lost-life part to SB3's
`FireResetEnv` (which fires after a reset only), so that a greedy policy that never chooses FIRE is not left standing
until ALE ends the game. Training differs in one wrapper, as in atari_ppo: SB3's training envs press FIRE after every
reset (`FireResetEnv`; with episodic life that is after every lost life), rlspeed's do not.

torch.set_num_threads(1) in every run (`--threads`).
"""

from __future__ import annotations

import argparse
import json
import resource
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import common

ENV_ID = "BreakoutNoFrameskip-v4"
EVAL_EPISODES = 10
EVAL_SEED_OFFSET = 100_000  # the SB3 side's final evaluation is seeded seed + this, as its published numbers were;
# rlspeed's final_eval takes rlspeed.evaluation.evaluation_seed(seed, "final", steps): other episodes of the env
# the budget measured (README section): 50,000 learning steps after RL-Zoo's 100,000 random ones; on the shared
# 2-core machine a 250,000-step SB3 run would take about an hour
DEFAULT_STEPS = 150_000
ADAM_EPS_RLSPEED = 1e-5  # rlspeed.nn.make_adam's default, which DQN uses

# RL-Zoo's DQN `atari` entry (rl_zoo3 hyperparams/dqn.yml) as presets/dqn.yaml states it; SB3's defaults for the rest
SETTINGS = {"buffer_size": 100_000, "learning_rate": 1e-4, "batch_size": 32, "learning_starts": 100_000,
            "target_update_interval": 1_000, "train_freq": 4, "gradient_steps": 1, "exploration_fraction": 0.1,
            "exploration_initial_eps": 1.0, "exploration_final_eps": 0.01, "max_grad_norm": 10.0, "tau": 1.0,
            "gamma": 0.99}


def child_usage() -> resource.struct_rusage:
    return resource.getrusage(resource.RUSAGE_CHILDREN)


def rlspeed_learn(args) -> dict:
    """`rlspeed train dqn ...` in a child process, timed; writes OUT/benchmark.json."""
    out = Path(args.out)
    command = ["rlspeed", "train", "dqn", ENV_ID, "--total-timesteps", str(args.steps), "--seed", str(args.seed),
               "--threads", str(args.threads), "--env-backend", args.env_backend, "--out", str(out), "--no-progress",
               "--overwrite"]
    if args.learning_starts is not None:
        command += ["--set", f"learning_starts={args.learning_starts}"]
    print(shlex.join(command), flush=True)
    uptime_before = common.uptime()
    usage_before = child_usage()
    started = time.perf_counter()
    # (this interpreter's rlspeed, as `rlspeed` on PATH may be another environment's or missing)
    completed = subprocess.run([sys.executable, "-m", "rlspeed", *command[1:]])
    wall_s = time.perf_counter() - started
    usage = child_usage()
    if completed.returncode != 0:
        sys.exit(f"rlspeed train exited with code {completed.returncode}: {shlex.join(command)}")
    record = {"command": shlex.join(command), "process_wall_s": wall_s,
              "process_cpu_s": (usage.ru_utime - usage_before.ru_utime) + (usage.ru_stime - usage_before.ru_stime),
              "peak_rss_mib": usage.ru_maxrss / 1024, "threads": args.threads,
              "learning_starts": args.learning_starts or SETTINGS["learning_starts"],
              "uptime_before": uptime_before, "uptime_after": common.uptime()}
    (out / "benchmark.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps({**common.rlspeed_run_record(str(out)), **record}, default=str))
    return record


def fire_after_life_loss(env):
    """SB3's Atari wrapper for evaluation (full games, raw scores) with FIRE pressed after every lost life too."""
    import gymnasium as gym
    from stable_baselines3.common.atari_wrappers import AtariWrapper

    class FireAfterLifeLoss(gym.Wrapper):
        def __init__(self, inner):
            super().__init__(inner)
            self.lives = 0
            self.waiting = False

        def reset(self, **kwargs):
            obs, info = self.env.reset(**kwargs)  # FireResetEnv has fired already
            self.lives, self.waiting = self.env.unwrapped.ale.lives(), False
            return obs, info

        def step(self, action):
            obs, reward, terminated, truncated, info = self.env.step(1 if self.waiting else action)
            lives = self.env.unwrapped.ale.lives()
            self.waiting, self.lives = lives < self.lives, lives
            return obs, reward, terminated, truncated, info

    return FireAfterLifeLoss(AtariWrapper(env, terminal_on_life_loss=False, clip_reward=False))


def sb3_learn(args) -> dict:
    """One SB3 DQN run at the shared settings (module docstring), then its evaluation; writes `--out`."""
    import ale_py
    import gymnasium as gym
    from stable_baselines3 import DQN
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_atari_env, make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import DummyVecEnv, VecFrameStack

    marks: list[tuple[float, int]] = []

    class LearningStartsMark(BaseCallback):  # when the first gradient step is due: the learning phase starts
        def __init__(self, learning_starts: int):
            super().__init__()
            self.learning_starts = learning_starts

        def _on_step(self) -> bool:
            if not marks and self.num_timesteps >= self.learning_starts:
                marks.append((time.perf_counter(), self.num_timesteps))
            return True

    gym.register_envs(ale_py)
    common.set_threads(args.threads)
    settings = dict(SETTINGS)
    if args.learning_starts is not None:
        settings["learning_starts"] = args.learning_starts
    uptime_before = common.uptime()
    cpu_started, started = time.process_time(), time.perf_counter()
    env = VecFrameStack(make_atari_env(ENV_ID, n_envs=1, seed=args.seed), n_stack=4)
    model = DQN("CnnPolicy", env, optimize_memory_usage=False, policy_kwargs=dict(optimizer_kwargs=dict(
        eps=args.adam_eps)), seed=args.seed, device="cpu", verbose=0, **settings)
    common.set_threads(args.threads)
    learn_started = time.perf_counter()
    model.learn(args.steps, callback=LearningStartsMark(settings["learning_starts"]))
    train_wall_s = time.perf_counter() - learn_started
    learning_phase = (model.num_timesteps - marks[0][1], time.perf_counter() - marks[0][0]) if marks else None
    env.close()
    # make_atari_env is make_vec_env with AtariWrapper as the wrapper class
    eval_env = VecFrameStack(make_vec_env(ENV_ID, n_envs=EVAL_EPISODES, seed=args.seed + EVAL_SEED_OFFSET,
                                          wrapper_class=fire_after_life_loss, vec_env_cls=DummyVecEnv), n_stack=4)
    eval_started = time.perf_counter()
    returns, lengths = evaluate_policy(model, eval_env, n_eval_episodes=EVAL_EPISODES, deterministic=True,
                                       return_episode_rewards=True)
    eval_wall_s = time.perf_counter() - eval_started
    eval_env.close()
    result = {"library": "stable-baselines3", "algo": "dqn", "env_id": ENV_ID, "seed": args.seed,
              "env_backend": "gymnasium (SB3 make_atari_env)", "total_timesteps": int(model.num_timesteps),
              "train_wall_s": train_wall_s, "sps": model.num_timesteps / train_wall_s, "eval_wall_s": eval_wall_s,
              "learning_phase_sps": learning_phase and learning_phase[0] / learning_phase[1],
              # whole games with raw scores (SB3's Monitor sits inside the Atari wrapper), the last 100 at most
              "train_last_games_mean": (float(statistics.fmean(info["r"] for info in model.ep_info_buffer))
                                        if model.ep_info_buffer else None),
              "process_wall_s": time.perf_counter() - started, "process_cpu_s": time.process_time() - cpu_started,
              "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "threads": args.threads,
              "settings": {**settings, "optimize_memory_usage": False, "adam_eps": args.adam_eps},
              "learning_starts": settings["learning_starts"],  # (where publish reads it, as from rlspeed's runs)
              "uptime_before": uptime_before, "uptime_after": common.uptime(),
              "final_eval": {"mean": float(statistics.fmean(returns)), "std": float(statistics.pstdev(returns)),
                             "episodes": len(returns), "seed": args.seed + EVAL_SEED_OFFSET,
                             "returns": [float(r) for r in returns],
                             "lengths_in_frames": [int(n) for n in lengths]}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return result


def rlspeed_record(directory: str) -> dict:
    """An rlspeed run directory's summary fields, this script's timings (OUT/benchmark.json) and, from
    metrics.csv, the steps/s after learning_starts and the mean of the last logged training-game returns."""
    import csv

    record = common.rlspeed_run_record(directory)
    timings = Path(directory) / "benchmark.json"
    if timings.exists():
        record.update(json.loads(timings.read_text()))
    with open(Path(directory) / "metrics.csv") as file:
        rows = list(csv.DictReader(file))
    learning_starts = record.get("learning_starts", SETTINGS["learning_starts"])
    learning = [row for row in rows if int(row["timesteps"]) >= learning_starts]
    if len(learning) >= 2 and record.get("train_wall_s"):
        first = learning[0]
        record["learning_phase_sps"] = ((record["total_timesteps"] - int(first["timesteps"]))
                                        / (record["train_wall_s"] - float(first["train_wall_s"])))
    returns = [float(row["episode_return"]) for row in rows if row.get("episode_return")]
    record["train_last_logged_returns_mean"] = statistics.fmean(returns[-20:]) if returns else None
    return record


def publish(args) -> None:
    runs = [rlspeed_record(d) for d in args.rlspeed_runs] + [json.loads(Path(f).read_text()) for f in args.sb3_runs]
    runs.sort(key=lambda run: (run["seed"], run["library"] != "rlspeed"))
    rows = []
    for run in runs:
        evaluation = run.get("final_eval") or {}
        cpu = run.get("process_cpu_s")
        rows.append([run["library"], run.get("env_backend"), run["seed"], f"{run['total_timesteps']:,}",
                     common.fmt(evaluation.get("mean"), ",.1f"), common.fmt(evaluation.get("std"), ",.1f"),
                     common.fmt(run.get("train_wall_s") and run["train_wall_s"] / 60, ",.1f"),
                     common.fmt(run.get("sps"), ",.0f"), common.fmt(run.get("learning_phase_sps"), ",.0f"),
                     common.fmt(run.get("process_wall_s") and
                                                                   run["process_wall_s"] / 60, ",.1f"),
                     common.fmt(cpu and cpu / 60, ",.1f"), common.fmt(run.get("peak_rss_mib"), ",.0f"),
                     f"{run.get('uptime_before', '').split('load average:')[-1].strip()} / "
                     f"{run.get('uptime_after', '').split('load average:')[-1].strip()}"])
    budgets = sorted({run["total_timesteps"] for run in runs})
    seeds = sorted({run["seed"] for run in runs})
    per_library = {library: [run["seed"] for run in runs if run["library"] == library]
                   for library in ("rlspeed", "stable-baselines3")}
    budget = budgets[0] if len(budgets) == 1 else None
    starts = sorted({run.get("learning_starts", SETTINGS["learning_starts"]) for run in runs})
    learning_starts = starts[0] if len(starts) == 1 else None
    if budget is not None and learning_starts is not None:
        learning_steps = budget - learning_starts
        schedule = (f"so a {budget:,}-step run has {learning_steps:,} learning steps, "
                    f"{learning_steps // SETTINGS['train_freq']:,} gradient steps")
        epsilon = (f"here the first {int(SETTINGS['exploration_fraction'] * budget):,} steps, inside the random "
                   "phase, so every learning step acts with epsilon 0.01; RL-Zoo's 10M-step run anneals over 1M")
    else:
        schedule, epsilon = "budgets or learning_starts differ between runs", "the runs differ"
    lines = [
        "## DQN on Atari Breakout (`benchmarks/atari_dqn.py`)",
        "",
        f"Learning at a fixed budget: {', '.join(f'{b:,}' for b in budgets)} env steps per run, seeds "
        f"{', '.join(map(str, seeds))} ({len(per_library['rlspeed'])} run(s) of rlspeed, "
        f"{len(per_library['stable-baselines3'])} of SB3). RL-Zoo's DQN `atari` settings for both (rlspeed: its "
        f"preset, presets/dqn.yaml): 1 env, replay 100,000, learning_starts {common.fmt(learning_starts, ',')} "
        f"(uniform random actions and no updates until then, {schedule}), batch 32 "
        "every 4 env steps, target copied every 1,000 env steps, Adam lr 1e-4 (eps 1e-5 on both: rlspeed's fixed "
        "value, set on SB3 whose own is 1e-8), Huber loss, grad norm 10, gamma 0.99, no double Q, epsilon "
        f"1 -> 0.01 over the first 10% of the learn call's budget (both libraries; {epsilon}). "
        "BreakoutNoFrameskip-v4, 84x84 grey, 4 stacked frames, frame skip 4, episodic life and clipped "
        "rewards in training. rlspeed: `rlspeed train dqn BreakoutNoFrameskip-v4 --total-timesteps N --seed S "
        "--threads 1 --env-backend gymnasium --out DIR` (summary.json `final_eval`; replay stores each frame once); "
        "SB3: `DQN(\"CnnPolicy\")` on `make_atari_env` + `VecFrameStack(4)`, `optimize_memory_usage=False` (RL-Zoo's "
        "value). torch.set_num_threads(1) in every run; the runs went one after another, one core each, with other "
        "jobs on the machine's other core. Train min and steps/s: the learn call (rlspeed's `train_wall_s`, which "
        "excludes evaluation; SB3's `learn`), and the steps/s from learning_starts to the end (the learning phase: "
        "one gradient step per 4 env steps); process min and CPU min: the whole process, start-up and final "
        "evaluation included; peak RSS: the process's (rlspeed: `rlspeed train`'s).",
        "",
        "Final evaluation: deterministic (greedy) policy, 10 full games with raw scores (no episodic life, no "
        "reward clipping) on envs separate from training, FIRE pressed for the policy at each game's start and "
        "after each lost life on both sides (rlspeed's `FireToStart`; for SB3 the script adds the after-a-lost-life "
        "press to SB3's `FireResetEnv`). Training differs in one wrapper: SB3's presses FIRE after every reset "
        "(with episodic life, after every lost life), rlspeed's does not.",
        "",
        common.markdown_table(["Library", "Envs", "Seed", "Env steps", "Eval mean", "Eval std", "Train min",
                               "Steps/s (train)", "Steps/s after learning_starts", "Process min", "Process CPU min",
                               "Peak RSS MiB", "Load 1/5/15 min before / after"], rows),
    ]
    lines += common.section_notes(args.notes, args.commit)
    machine = common.machine_description(("rlspeed", "torch", "gymnasium", "ale-py", "stable-baselines3"))
    machine["torch_threads"] = 1  # what every run set (this publishing process sets none)
    common.publish("atari_dqn", lines, {"runs": runs}, write=not args.no_write, machine=machine)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("rlspeed-learn", help="one `rlspeed train dqn` run, timed (writes OUT/benchmark.json)")
    r.add_argument("--out", required=True, help="rlspeed's run directory")
    r.add_argument("--env-backend", default="gymnasium", help="rlspeed's --env-backend (SB3 steps Gymnasium envs)")
    s = sub.add_parser("sb3-learn", help="one SB3 DQN run and its evaluation (writes the JSON file OUT)")
    s.add_argument("--out", required=True, help="the result JSON file")
    s.add_argument("--adam-eps", type=float, default=ADAM_EPS_RLSPEED, help="SB3's Adam eps (its own default 1e-8)")
    for p in (r, s):
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="env steps of the learn call")
        p.add_argument("--threads", type=int, default=1)
        p.add_argument("--learning-starts", type=int, default=None,
                       help="override learning_starts (smoke runs only; default the preset's 100,000)")
    common.add_publish_parser(sub, "write the README section and results/atari_dqn.json")
    args = parser.parse_args()
    {"rlspeed-learn": rlspeed_learn, "sb3-learn": sb3_learn, "publish": publish}[args.command](args)


if __name__ == "__main__":
    main()
