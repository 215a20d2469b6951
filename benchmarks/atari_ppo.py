"""PPO on Atari Breakout (BreakoutNoFrameskip-v4): rlspeed against Stable-Baselines3 `CnnPolicy`, 8 envs, RL-Zoo's
PPO `atari` settings (rlspeed's preset translates them: presets/ppo.yaml).

Three subcommands, so that each measurement runs in a fresh process and the slow learning runs can go in the
background:

- `throughput`: env steps/s of training in a steady-state window: `--iterations` rollouts of 8 x 128 steps, each
  with its update (4 epochs of minibatches of 256), after `--warmup` untimed ones (start-up, first rollout and
  update excluded). Sides: rlspeed on Gymnasium envs (`env_backend="gymnasium"`: one process, envs stepped in turn,
  as SB3's DummyVecEnv), rlspeed on EnvPool (`env_backend="envpool"`), and SB3 PPO `CnnPolicy` on its standard
  Atari wrappers (`make_atari_env` + `VecFrameStack(4)`, DummyVecEnv). The sides of a pair run one after another
  in fresh processes (order reversed every other pair); reports ratios per pair and their medians. The `-auto`
  sides (`accelerate="auto"`) search at their second update and rollout calls, in the untimed warm-up
  (`common.acceleration_decided_at_once`; the window would not reach the search otherwise), so they need
  `--warmup` >= 1.
- `sb3-learn`: one SB3 learning run at a fixed budget, then a deterministic 10-episode evaluation on separate envs
  with full games and raw scores (SB3's Atari wrappers without episodic life or reward clipping); writes a JSON file.
  rlspeed's learning runs are `rlspeed train ppo BreakoutNoFrameskip-v4 ... --out DIR` (summary.json `final_eval`).
- `rlspeed-eval-fire-once`: an rlspeed run's model evaluated as the SB3 side is (FIRE pressed only at a game's
  start, not after a lost life: SB3's `FireResetEnv` without its episodic-life wrapper), written into the run
  directory (`eval_fire_once.json`), which `publish` shows beside rlspeed's own evaluation (FIRE after every lost
  life too: `rlspeed.envs.atari.FireToStart`).
- `publish`: the README section and results/atari_ppo.json.
- `publish-fire-reset`: the section of rlspeed runs trained with `--env-kwargs fire_reset=true` (FIRE pressed for
  the agent as SB3's and CleanRL's training envs do), beside the runs `publish` tabled at the same budget.

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

from rlspeed.yamlfile import load_run_file

ENV_ID = "BreakoutNoFrameskip-v4"
NUM_ENVS = 8
NUM_STEPS = 128
ROLLOUT = NUM_ENVS * NUM_STEPS
EVAL_EPISODES = 10
EVAL_SEED_OFFSET = 100_000  # the SB3 side's final evaluation is seeded seed + this, as its published numbers were;
# rlspeed's final_eval takes rlspeed.evaluation.evaluation_seed(seed, "final", steps): other episodes of the env
SIDES = ("rlspeed-gym", "rlspeed-gym-auto", "rlspeed-envpool", "rlspeed-envpool-auto", "sb3")


def sb3_model(seed: int, total_steps: int):
    """SB3 PPO CnnPolicy at RL-Zoo's `atari` settings (rl_zoo3 hyperparams/ppo.yml), and its training env."""
    import ale_py
    import gymnasium as gym
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    gym.register_envs(ale_py)
    env = VecFrameStack(make_atari_env(ENV_ID, n_envs=NUM_ENVS, seed=seed), n_stack=4)
    model = PPO("CnnPolicy", env, n_steps=NUM_STEPS, n_epochs=4, batch_size=256,
                learning_rate=lambda progress: 2.5e-4 * progress, clip_range=lambda progress: 0.1 * progress,
                vf_coef=0.5, ent_coef=0.01, gamma=0.99, gae_lambda=0.95, max_grad_norm=0.5, seed=seed,
                device="cpu", verbose=0)
    return model, env


def rlspeed_model(backend: str, seed: int, threads: int, accelerate: str = "off"):
    import rlspeed
    from rlspeed.presets import load_preset, split_run_settings

    _run, hyperparameters = split_run_settings(load_preset("ppo", ENV_ID))
    return rlspeed.PPO(ENV_ID, env_backend=backend, seed=seed, device="cpu", num_threads=threads,
                       accelerate=accelerate, **hyperparameters)


def worker(side: str, iterations: int, warmup: int, threads: int, seed: int) -> dict:
    """One throughput run in this process (see the module docstring)."""
    common.set_threads(threads)
    marks: list[tuple[float, int]] = []
    if side == "sb3":
        from stable_baselines3.common.callbacks import BaseCallback

        class Marks(BaseCallback):  # rollout ends: each interval is one update plus one rollout, as rlspeed's
            def _on_step(self) -> bool:
                return True

            def _on_rollout_end(self) -> None:
                marks.append((time.perf_counter(), self.num_timesteps))

        model, env = sb3_model(seed, (warmup + 1 + iterations) * ROLLOUT)
        common.set_threads(threads)
        model.learn((warmup + 1 + iterations) * ROLLOUT, callback=Marks())
        env.close()
        window = common.window_sps(marks, (warmup + 1) * ROLLOUT)
        record = {"library": "stable-baselines3", "env_backend": "gymnasium (SB3 make_atari_env, DummyVecEnv)"}
    else:
        def mark(local_vars) -> bool:  # after each iteration: one rollout and its update
            marks.append((time.perf_counter(), local_vars["self"].num_timesteps))
            return True

        backend = "envpool" if side.startswith("rlspeed-envpool") else "gymnasium"
        auto = side.endswith("-auto")
        model = rlspeed_model(backend, seed, threads, "auto" if auto else "off")
        common.set_threads(threads)
        # (the auto sides search in the untimed warm-up iterations, at the second call of each kind)
        with common.acceleration_decided_at_once() if auto else contextlib.nullcontext():
            model.learn((warmup + iterations) * ROLLOUT, callback=mark, progress_bar=False)
        window = common.window_sps(marks, warmup * ROLLOUT)
        record = {"library": "rlspeed", "env_backend": model.env_backend, "update": model.update_summary(),
                  "accelerate": json.loads(json.dumps(model.acceleration_summary(), default=str)),
                  "report": model.report()}
    return {"side": side, "threads": threads, "iterations": iterations, "warmup": warmup, **record, **window}


def throughput(args) -> dict:
    worker_args = ["--iterations", str(args.iterations), "--warmup", str(args.warmup), "--threads", str(args.threads)]
    data = {"iterations": args.iterations, "warmup": args.warmup, "pairs": args.pairs, "threads": args.threads,
            **common.worker_pairs(__file__, list(args.sides), args.pairs, worker_args),
            "machine": common.machine_description(
                ("rlspeed", "torch", "gymnasium", "ale-py", "envpool", "stable-baselines3"))}
    Path(args.json).write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {args.json}")
    return data


def sb3_learn(args) -> dict:
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import VecFrameStack

    common.set_threads(args.threads)
    model, env = sb3_model(args.seed, args.budget)
    common.set_threads(args.threads)
    started = time.perf_counter()
    model.learn(args.budget)
    train_wall_s = time.perf_counter() - started
    training_returns = [float(info["r"]) for info in model.ep_info_buffer]  # (Monitor's: whole games, raw scores)
    env.close()
    model.save(Path(args.json).with_suffix(".zip"))
    # full games, raw scores: no episodic life, no reward clipping (FireReset at a game's start stays, as SB3 has it)
    eval_env = VecFrameStack(make_atari_env(ENV_ID, n_envs=EVAL_EPISODES, seed=args.seed + EVAL_SEED_OFFSET,
                                            wrapper_kwargs=dict(terminal_on_life_loss=False, clip_reward=False)),
                             n_stack=4)
    eval_started = time.perf_counter()
    returns, lengths = evaluate_policy(model, eval_env, n_eval_episodes=EVAL_EPISODES, deterministic=True,
                                       return_episode_rewards=True)
    eval_wall_s = time.perf_counter() - eval_started
    every_life = sb3_eval_fire_every_life(model, args.seed + EVAL_SEED_OFFSET)
    result = {"library": "stable-baselines3", "algo": "ppo", "env_id": ENV_ID, "seed": args.seed,
              "total_timesteps": int(model.num_timesteps), "train_wall_s": train_wall_s,
              "sps": model.num_timesteps / train_wall_s, "eval_wall_s": eval_wall_s,
              "training_returns_last_100": training_returns,
              "final_eval": {"mean": float(statistics.fmean(returns)), "std": float(statistics.pstdev(returns)),
                             "episodes": len(returns), "returns": [float(r) for r in returns],
                             "lengths": [int(n) for n in lengths]},
              "eval_fire_every_life": every_life}
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return result


def sb3_eval_fire_every_life(model, seed: int) -> dict:
    """SB3's model, deterministic, 10 full games with raw scores (the same envs as its `evaluate_policy`), FIRE
    pressed after every lost life too, as `rlspeed evaluate` presses it (`FireToStart`): each env's first game."""
    import numpy as np
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    env = VecFrameStack(make_atari_env(ENV_ID, n_envs=EVAL_EPISODES, seed=seed,
                                       wrapper_kwargs=dict(terminal_on_life_loss=False, clip_reward=False)), n_stack=4)
    obs = env.reset()
    lives = np.array([env.venv.envs[i].unwrapped.ale.lives() for i in range(EVAL_EPISODES)])
    fire = np.zeros(EVAL_EPISODES, dtype=bool)  # (FireResetEnv pressed it at the reset)
    returns: list[float | None] = [None] * EVAL_EPISODES
    lengths = [0] * EVAL_EPISODES
    started = time.perf_counter()
    while any(r is None for r in returns):
        actions, _ = model.predict(obs, deterministic=True)
        actions = np.where(fire, 1, actions)
        obs, _rewards, dones, infos = env.step(actions)
        now = np.array([info.get("lives", 0) for info in infos])
        fire = (now < lives) & ~dones
        lives = now
        for i, (done, info) in enumerate(zip(dones, infos)):
            if returns[i] is None:
                lengths[i] += 1
                if done and "episode" in info:
                    returns[i] = float(info["episode"]["r"])
    env.close()
    return {"protocol": "FIRE after every lost life too", "mean": float(statistics.fmean(returns)),
            "std": float(statistics.pstdev(returns)), "returns": returns, "lengths": lengths,
            "eval_wall_s": time.perf_counter() - started}


def rlspeed_eval_fire_once(args) -> dict:
    """The run's model, deterministic, 10 full games with raw scores on envs seeded as its final evaluation, FIRE
    pressed at each game's start only (the SB3 side's protocol): a policy that never presses FIRE itself stands still
    after a lost life until ALE ends the game."""
    import torch

    import rlspeed
    from rlspeed.envs import make_env
    from rlspeed.envs.atari import FireToStart, fire_action

    class FireAtGameStart(FireToStart):
        def step(self, actions):  # FireToStart's, without its press after a lost life
            actions = torch.where(self._pending > 0, torch.full_like(actions, self.fire), actions)
            obs, reward, terminated, truncated, info = self.env.step(actions)
            self._pending = torch.where(terminated | truncated, self.steps,
                                        (self._pending - 1).clamp(min=0)).to(torch.int32)
            return obs, reward, terminated, truncated, info

    common.set_threads(args.threads)
    run = Path(args.run)
    summary = json.loads((run / "summary.json").read_text())
    model = rlspeed.PPO.load(run / "model.safetensors", device="cpu")
    seed = summary["final_eval"]["seed"]
    env = FireAtGameStart(make_env(ENV_ID, num_envs=EVAL_EPISODES, device="cpu", seed=seed,
                                   backend=summary["env_backend"], evaluation=True), fire_action(ENV_ID))
    started = time.perf_counter()
    obs, _info = env.reset()
    returns = torch.zeros(EVAL_EPISODES)
    lengths = torch.zeros(EVAL_EPISODES, dtype=torch.long)
    finished = torch.zeros(EVAL_EPISODES, dtype=torch.bool)
    for step in range(1, env.spec.max_episode_steps + 1):
        obs, _reward, _terminated, _truncated, info = env.step(model.act(obs, deterministic=True))
        newly = info["done"] & ~finished
        returns = torch.where(newly, info["episode_return"], returns)
        lengths = torch.where(newly, step, lengths)
        finished |= info["done"]
        if bool(finished.all()):
            break
    env.close()
    returns, lengths = returns.tolist(), lengths.tolist()
    result = {"protocol": "FIRE at a game's start only", "seed": seed, "mean": float(statistics.fmean(returns)),
              "std": float(statistics.pstdev(returns)), "returns": returns, "lengths": lengths,
              "eval_wall_s": time.perf_counter() - started}
    (run / "eval_fire_once.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return result


def publish(args) -> None:
    data = json.loads(Path(args.throughput).read_text())
    data["machine"]["torch_threads"] = data["threads"]  # what every worker set (the parent process sets none)
    labels = {"rlspeed-gym": ("rlspeed", "Gymnasium AtariPreprocessing + FrameStack, 8 envs in one process"),
              "rlspeed-envpool": ("rlspeed", "EnvPool (`--env-backend envpool`), 8 envs stepped in EnvPool's own "
                                  "threads (not limited to one core)"),
              "sb3": ("Stable-Baselines3 `CnnPolicy`", "`make_atari_env` + `VecFrameStack(4)`, DummyVecEnv, 8 envs")}
    targets = {"rlspeed-gym": 2.0, "rlspeed-envpool": 3.0}
    summary: dict = {}
    rows = []
    for side in SIDES:
        stats = common.pair_throughput(data, side)
        if not stats["sps"]["of"]:
            continue
        summary[side] = {**stats, "target": targets.get(side)}
        target = f">= {targets[side]:.0f}x" if side in targets else ""
        rows.append([*labels[side], common.fmt(stats["sps"]["median"]), common.fmt_range(stats["sps"]),
                     ", ".join(f"{r:.2f}" for r in stats["ratio_to_sb3_per_pair"]),
                     common.fmt_ratio(stats["ratio_to_sb3_median"]), target])
    learning = common.learning_records(args.rlspeed_runs, args.sb3_runs)
    learn_rows = []
    for run in learning:
        evaluation = run.get("final_eval") or {}
        if run["library"] == "rlspeed":  # (SB3's evaluation presses FIRE at a game's start only)
            fire_once = Path(run["run_dir"]) / "eval_fire_once.json"
            run["eval_fire_once"] = json.loads(fire_once.read_text()) if fire_once.exists() else None
            once = run["eval_fire_once"]
            every_life = f"{evaluation.get('mean', 0):.1f} +/- {evaluation.get('std', 0):.1f}"
        else:
            once, every = evaluation, run.get("eval_fire_every_life")
            every_life = f"{every['mean']:.1f} +/- {every['std']:.1f}" if every else "not run"
        learn_rows.append([run["library"], run.get("env_backend") or "gymnasium (SB3 make_atari_env)", run.get("seed"),
                           f"{run['total_timesteps']:,}",
                           f"{once['mean']:.1f} +/- {once['std']:.1f}" if once else "not run", every_life,
                           common.fmt(run.get("sps"), ",.0f")])
    load = common.pairs_load(data)
    lines = [
        "## PPO on Atari Breakout (`benchmarks/atari_ppo.py`)",
        "",
        f"### (a) Steps/s, steady state ({data['pairs']} pairs, fresh processes)",
        "",
        "RL-Zoo's PPO `atari` settings for both (rlspeed: its preset, presets/ppo.yaml, which translates them: "
        "Nature CNN with linear heads on the 512 shared features, 8 envs x 128 steps, 4 epochs, minibatch 256, "
        "lr 2.5e-4 and clip 0.1 both annealed, ent 0.01, SB3 vf_coef 0.5 = rlspeed 1.0). BreakoutNoFrameskip-v4, "
        "84x84 grey, 4 stacked frames, frame skip 4. Timed window: "
        f"{data['iterations']} rollouts of 1,024 env steps each with its update, after {data['warmup']} untimed "
        f"one(s) (start-up excluded). torch.set_num_threads({data['threads']}) in every run. The sides of a pair "
        "run one after another in fresh processes, order reversed every other pair. The 2 cores were shared with "
        f"other jobs ({load}): compare ratios within a pair.",
        "",
        common.markdown_table(["Library", "Envs", "Steps/s median", "Range", "Ratio to SB3 per pair",
                               "Median ratio", "Target"], rows),
    ]
    if args.profile:
        lines += ["", "### Where rlspeed's time goes", "", Path(args.profile).read_text().strip()]
    lines += [
        "",
        "### (b) Learning at fixed budgets (the seeds in the table; one run each)",
        "",
        "Final evaluation: deterministic policy, 10 full games with raw scores (no episodic life, no reward "
        "clipping) on envs separate from training, mean +/- std. Two ways of pressing FIRE (Breakout serves the "
        "ball only on FIRE, which a deterministic policy may never choose): at a game's start only, as SB3's "
        "`evaluate_policy` on `make_atari_env(..., wrapper_kwargs=dict(terminal_on_life_loss=False, "
        "clip_reward=False))` + `VecFrameStack(4)` does (`FireResetEnv` acts at resets, and without episodic life "
        "a lost life is no reset: the game then stands still until ALE ends it after 108,000 frames); and after "
        "every lost life too, as `rlspeed evaluate` does (`FireToStart`; summary.json `final_eval`). rlspeed's "
        "runs: `rlspeed train ppo BreakoutNoFrameskip-v4 --total-timesteps N --out DIR`, then `atari_ppo.py "
        "rlspeed-eval-fire-once DIR`. Training differs in one wrapper: SB3's presses FIRE after every reset "
        "(`FireResetEnv`), rlspeed's does not. Steps/s here are whole runs on a shared machine, not a speed "
        "comparison.",
        "",
        common.markdown_table(["Library", "Envs", "Seed", "Env steps", "Eval, FIRE at a game's start only",
                               "Eval, FIRE after every lost life too", "Steps/s (whole run)"], learn_rows),
    ]
    if not learn_rows:
        lines[-1] = "No learning run in this measurement (see below)."
    lines += common.section_notes(args.notes, args.commit)
    common.publish("atari_ppo", lines, {"throughput": data, "throughput_summary": summary, "learning": learning},
                   write=not args.no_write, machine=data["machine"])


def publish_fire_reset(args) -> None:
    """The README section of rlspeed runs trained with `--env-kwargs fire_reset=true` (FIRE pressed in hidden steps
    after every reset and lost life, as SB3's and CleanRL's training envs do), beside the 500k-step runs of
    `publish`'s section read from results/atari_ppo.json (rlspeed without it, and SB3)."""
    earlier = json.loads((Path(__file__).resolve().parent / "results" / "atari_ppo.json").read_text())["learning"]
    runs = [common.rlspeed_run_record(d) for d in args.rlspeed_runs]
    rows, means = [], {}
    for run, fire in ([(r, "yes (`fire_reset`)") for r in runs]
                      + [(r, "no" if r["library"] == "rlspeed" else "yes (`FireResetEnv`)") for r in earlier
                         if r["total_timesteps"] == args.budget]):
        if run in runs and ((load_run_file((Path(run["run_dir"]) / "config.yaml").read_text()).get("env_kwargs")
                             or {}).get("fire_reset") is not True):
            raise SystemExit(f"{run['run_dir']} did not train with fire_reset=true")
        every = run.get("final_eval") if run["library"] == "rlspeed" else run.get("eval_fire_every_life")
        means.setdefault((run["library"], fire), []).append(every["mean"])
        rows.append([run["library"], fire, run.get("env_backend") or "gymnasium (SB3 make_atari_env)",
                     run.get("seed"), f"{run['total_timesteps']:,}", f"{every['mean']:.1f} +/- {every['std']:.1f}"])
    summary = "; ".join(f"{library}, FIRE in training {fire.split(' ')[0]}: {statistics.mean(values):.1f} "
                        f"({len(values)} seed{'s' * (len(values) != 1)})" for (library, fire), values in means.items())
    lines = [
        "## PPO on Atari Breakout with FIRE pressed in training (`benchmarks/atari_ppo.py publish-fire-reset`)",
        "",
        f"rlspeed runs at the shipped preset (the section above's settings) for {args.budget:,} env steps with "
        "`--env-kwargs fire_reset=true`: FIRE, then action 2, after every reset, and no-op, FIRE, action 2 right "
        "after every lost life, in steps hidden from the agent, as SB3's `AtariWrapper` (`EpisodicLifeEnv` + "
        "`FireResetEnv`) and CleanRL's ppo_atari train; beside the runs of the section above at the same budget "
        "(results/atari_ppo.json: rlspeed without it, SB3 with it). Final evaluation: deterministic policy, 10 full "
        "games with raw scores, FIRE pressed after every lost life too (the fire_reset runs' envs press it "
        "themselves; the others' `FireToStart`, or the script's press for SB3). One run per seed.",
        "",
        common.markdown_table(["Library", "FIRE in training", "Envs", "Seed", "Env steps",
                               "Eval, FIRE after every lost life too"], rows),
        "",
        f"Means over seeds: {summary}.",
    ]
    lines += common.section_notes(args.notes, args.commit)
    common.set_threads(1)  # (`rlspeed train`'s default, which the runs trained with: the machine block says so)
    machine = common.machine_description(("rlspeed", "torch", "gymnasium", "ale-py", "stable-baselines3"))
    common.publish("atari_ppo_fire_reset", lines, {"runs": runs, "budget": args.budget}, write=not args.no_write,
                   machine=machine)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("worker", help="(internal) one throughput run; prints JSON")
    w.add_argument("--side", choices=SIDES, required=True)
    w.add_argument("--seed", type=int, default=0)
    t = sub.add_parser("throughput", help="alternating pairs of throughput runs")
    t.add_argument("--pairs", type=int, default=3)
    t.add_argument("--sides", nargs="+", choices=SIDES, default=["rlspeed-gym", "rlspeed-envpool", "sb3"])
    t.add_argument("--json", default=common.default_pairs_json("atari_throughput.json"))
    for p in (w, t):
        p.add_argument("--iterations", type=int, default=3, help="timed rollouts (each with its update)")
        p.add_argument("--warmup", type=int, default=1, choices=range(1, 1000), metavar="N>=1",
                       help="untimed rollouts (each with its update) first (at least 1: the timed window starts at "
                            "the end of one)")
        p.add_argument("--threads", type=int, default=1)
    s = sub.add_parser("sb3-learn", help="one SB3 learning run at a fixed budget")
    s.add_argument("--budget", type=int, default=200_000)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--threads", type=int, default=1)
    s.add_argument("--json", required=True)
    e = sub.add_parser("rlspeed-eval-fire-once", help="an rlspeed run evaluated as the SB3 side is")
    e.add_argument("run", help="an `rlspeed train ppo BreakoutNoFrameskip-v4 --out DIR` run directory")
    e.add_argument("--threads", type=int, default=1)
    p = common.add_publish_parser(sub, "write the README section and results JSON")
    p.add_argument("--throughput", default=common.default_pairs_json("atari_throughput.json"))
    p.add_argument("--profile", default="", help="a Markdown file: where rlspeed's time goes (`rlspeed profile`)")
    f = sub.add_parser("publish-fire-reset", help="the section of rlspeed runs trained with fire_reset=true")
    f.add_argument("--rlspeed-runs", nargs="+", required=True, help="rlspeed run directories (fire_reset=true)")
    f.add_argument("--budget", type=int, default=500_736, help="env steps of the earlier runs to show beside them")
    f.add_argument("--notes", default="")
    f.add_argument("--commit", default="")
    f.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    if args.command == "worker":
        print(json.dumps(worker(args.side, args.iterations, args.warmup, args.threads, args.seed), default=str))
    else:
        {"throughput": throughput, "sb3-learn": sb3_learn, "rlspeed-eval-fire-once": rlspeed_eval_fire_once,
         "publish": publish, "publish-fire-reset": publish_fire_reset}[args.command](args)


if __name__ == "__main__":
    main()
