"""The `rlspeed` command: train, eval, profile, doctor.

Errors the user can cause print one sentence and exit with code 2 (`--debug` shows the traceback).
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
import time
from pathlib import Path

import yaml

from rlspeed.errors import UserError


def _parse_set(pairs: list[str]) -> dict:
    """`key=value` pairs, values read as YAML scalars/lists (`lr=1e-3`, `net_arch=[64,64]`, `x=null`)."""
    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise UserError(f"--set expects key=value, got '{pair}'.")
        key, value = pair.split("=", 1)
        try:
            out[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError:
            raise UserError(f"--set {key}: cannot read value '{value}'.") from None
    return out


# Constructor arguments that have a flag of their own: `--set` cannot give them (they would arrive twice).
_FLAG_KEYS = {"seed": "--seed", "device": "--device", "num_threads": "--threads", "env_backend": "--env-backend",
              "accelerate": "--accelerate", "env": "the ENV_ID argument", "strategy": "--nproc (or torchrun)"}


def _check_set_keys(overrides: dict) -> None:
    for key in overrides:
        if key in _FLAG_KEYS:
            raise UserError(f"--set {key}=... is not a hyperparameter: use {_FLAG_KEYS[key]}.")


def _coerce_run_settings(run_settings: dict) -> dict:
    """total_timesteps and eval_freq as positive ints (also 1e5, which YAML reads as a string), target_return as a
    float or None; UserError naming the key otherwise."""
    from rlspeed.algos.base import coerce  # (here: the CLI imports torch only for the commands that need it)

    out = dict(run_settings)
    for key in ("total_timesteps", "eval_freq"):
        if out.get(key) is not None:
            out[key] = coerce(key, out[key], int)
            if out[key] < 1:
                raise UserError(f"{key} must be a positive whole number of steps, got {out[key]}.")
    if out.get("target_return") is not None:
        out["target_return"] = _target(str(out["target_return"]), None, "target_return")
    return out


def _algorithm(name: str):
    from rlspeed.algos import ALGORITHMS

    key = name.lower()
    if key not in ALGORITHMS:
        close = difflib.get_close_matches(key, list(ALGORITHMS), n=2)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise UserError(f"Unknown algorithm '{name}': available are {', '.join(ALGORITHMS)}.{hint}")
    return ALGORITHMS[key]


def _target(arg: str | None, spec, name: str = "--target-return") -> float | None:
    """A target return as given (`name`: the flag or setting, for the error): a number, or none/off/null for no
    target; None given means the env's reward_threshold."""
    if arg is None:
        return spec.reward_threshold
    if arg.lower() in ("none", "off", "null"):
        return None
    try:
        return float(arg)
    except ValueError:
        raise UserError(f"{name} must be a number or 'none', got '{arg}'.") from None


def cmd_train(args: argparse.Namespace) -> int:
    """`rlspeed train`: train ALGO on ENV_ID from its preset, `--set` overrides and flags; returns the exit code.

    Writes the run directory (config.yaml, metrics.csv, model.safetensors, summary.json, ...); under torchrun every rank
    trains and only rank 0 writes. With `--nproc N` it starts torchrun with N processes running this same command
    instead, and returns torchrun's exit code.
    """
    if args.nproc is not None:
        return _launch_torchrun(args)
    from rlspeed.distributed import DistributedStrategy

    algo_cls, run_settings, hyper = _settings(args)
    total = args.total_timesteps or run_settings.get("total_timesteps") or 1_000_000
    strategy = DistributedStrategy(device=args.device)  # a no-op unless started by torchrun
    try:
        # leave together (the other ranks wait while rank 0 saves and evaluates), see DistributedStrategy.leave
        return strategy.leave(_train(args, algo_cls, strategy, run_settings, hyper, total))
    finally:
        strategy.shutdown(wait=False)  # after an error; a no-op once the group is gone


def _settings(args: argparse.Namespace) -> tuple[type, dict, dict]:
    """(algorithm class, run settings, hyperparameters) from the preset of (ALGO, ENV_ID), `--set` and
    `--num-envs`."""
    from rlspeed.presets import load_preset, split_run_settings

    algo_cls = _algorithm(args.algo)
    run_settings, hyper = split_run_settings(load_preset(algo_cls.name, args.env_id))
    overrides = _parse_set(args.set or [])
    _check_set_keys(overrides)
    run_overrides, hyper_overrides = split_run_settings(overrides)
    run_settings.update(run_overrides)
    hyper.update(hyper_overrides)
    if args.num_envs is not None:
        hyper["num_envs"] = args.num_envs
    return algo_cls, _coerce_run_settings(run_settings), hyper


def _model(args: argparse.Namespace, algo_cls: type, hyper: dict, strategy=None):
    """The algorithm built from the model flags train and profile share (`build_parser`'s `model` parent)."""
    return algo_cls(args.env_id, device=args.device, seed=args.seed, env_backend=args.env_backend,
                    accelerate=args.accelerate, num_threads=args.threads, strategy=strategy, **hyper)


def _train(args, algo_cls, strategy, run_settings: dict, hyper: dict, total: int) -> int:
    main = strategy.is_main
    model = _model(args, algo_cls, hyper, strategy)
    if args.target_return is not None:
        target = _target(args.target_return, model.spec)
    else:
        target = run_settings.get("target_return", model.spec.reward_threshold)
    eval_freq = args.eval_freq or run_settings.get("eval_freq")
    if args.out is None and strategy.enabled:
        raise UserError("Under torchrun, give --out DIR so that every rank (and a restarted group) uses one run "
                        "directory; `rlspeed train --nproc N` does this for you.")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = Path(args.out or f"runs/{algo_cls.name}-{args.env_id.replace('/', '_')}-{args.seed}-{stamp}")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(f"Cannot create the run directory '{run_dir}': {error.strerror or error}.") from None
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    checkpoint_freq = args.checkpoint_freq
    if checkpoint_freq is None and (args.resume or int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) > 0):
        checkpoint_freq = max(total // 20, 1)  # restarts resume from here: at most this many steps are lost
    checkpoint = run_dir / "checkpoint.safetensors"
    resumed_from = None
    if main and not args.resume and restarts == 0 and checkpoint.exists():
        # A fresh run in a reused --out: a restart before this run's first checkpoint must not resume from the
        # checkpoint of an earlier run.
        checkpoint.unlink()
    if args.resume and restarts == 0 and not checkpoint.exists() and main:
        print(f"rlspeed: --resume: no {checkpoint} yet, so training starts from scratch (it is written every "
              "--checkpoint-freq steps, by default 1/20 of the budget with --resume or --max-restarts)", flush=True)
    if (args.resume or restarts > 0) and checkpoint.exists():
        model.make_training_env()
        model.resume(checkpoint)
        resumed_from = model.num_timesteps
        total = max(total - resumed_from, 0)
    config = {"algo": algo_cls.name, "env_id": args.env_id, "seed": args.seed, "device": str(model.device),
              "env_backend": model.env_backend, "total_timesteps": total, "target_return": target,
              "eval_freq": eval_freq, "accelerate": args.accelerate, "hyperparameters": _plain(model.config)}
    if main:
        (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    say = print if main else (lambda *a, **k: None)
    if strategy.enabled:
        say(f"rlspeed: {strategy.world_size} processes ({strategy.backend}), "
            f"{model.config.num_envs // strategy.world_size} envs each")
    if resumed_from is not None:
        say(f"rlspeed: restart {restarts}: resumed from {checkpoint} at {resumed_from:,} steps")
    if total <= 0:
        say("rlspeed: nothing left to train")
        return 0
    say(f"rlspeed: training {algo_cls.name.upper()} on {args.env_id} ({model.env_backend} envs, "
          f"device {model.device}), up to {total:,} steps"
          + (f", stopping at eval return >= {target:g}" if target is not None else ""), flush=True)
    model.learn(total, progress_bar=not args.no_progress, target_return=target, eval_freq=eval_freq,
                run_dir=run_dir, checkpoint_freq=checkpoint_freq)
    if not main:
        return 0
    model.save(run_dir / "model.safetensors")
    final = model.evaluate(episodes=10, seed=args.seed + 1_000_000)
    result = model.result
    summary = {"algo": algo_cls.name, "env_id": args.env_id, "seed": args.seed, "device": str(model.device),
               "env_backend": model.env_backend, "total_timesteps": result.total_timesteps,
               "train_wall_s": round(result.train_wall_s, 4), "sps": round(result.sps, 1),
               "target_return": target,
               "time_to_target_s": None if result.time_to_target_s is None else round(result.time_to_target_s, 4),
               "steps_to_target": result.steps_to_target,
               "final_eval": {"mean": final["mean"], "std": final["std"], "episodes": final["episodes"]},
               "accelerate": model.acceleration_summary()}
    if strategy.enabled or resumed_from is not None:
        summary["distributed"] = {"world_size": strategy.world_size, "backend": strategy.backend,
                                  "restarts": restarts, "resumed_from_timesteps": resumed_from,
                                  "max_lost_timesteps": checkpoint_freq if resumed_from is not None else 0}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    reached = ""
    if target is not None:
        reached = (f"; target {target:g} reached after {result.steps_to_target:,} steps in "
                   f"{result.time_to_target_s:.2f} s" if result.time_to_target_s is not None
                   else f"; target {target:g} not reached")
    say(f"rlspeed: {result.total_timesteps:,} steps in {result.train_wall_s:.2f} s ({result.sps:,.0f} steps/s)"
          f"{reached}")
    say(f"rlspeed: final evaluation (deterministic, 10 episodes): {final['mean']:.1f} +/- {final['std']:.1f}")
    say(f"rlspeed: run directory {run_dir}")
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    """`rlspeed profile`: train ALGO on ENV_ID (preset, `--set`, flags as for train) for a while under the profiler
    and print where the time goes, per phase of the loop and per operation, with advice; returns the exit code."""
    from rlspeed.diagnostics.profiler import profile_run

    if args.steps is not None and args.steps <= 0:
        raise UserError(f"--steps must be positive, got {args.steps}.")
    trace = Path(args.trace) if args.trace else None
    if trace is not None and (trace.is_dir() or not trace.parent.is_dir()):
        raise UserError(f"--trace {args.trace}: give a file in an existing directory.")
    algo_cls, _run_settings, hyper = _settings(args)
    model = _model(args, algo_cls, hyper)
    print(f"rlspeed: profiling {algo_cls.name.upper()} on {args.env_id} ({model.env_backend} envs, device "
          f"{model.device}): warm-up, an unprofiled run, then a profiled run", file=sys.stderr, flush=True)
    result = profile_run(model, steps=args.steps, trace=trace)
    print(result)
    if trace is not None:
        if not trace.is_file():
            raise UserError(f"the profiler could not write the trace to {trace}.")
        print(f"rlspeed: trace written to {trace} (open it in https://ui.perfetto.dev or chrome://tracing)",
              file=sys.stderr)
    if args.json:
        print(json.dumps(result.to_dict()))
    return 0


def _launch_torchrun(args: argparse.Namespace) -> int:
    """`rlspeed train --nproc N ...`: start torchrun with N local processes running the same command."""
    import subprocess

    if args.nproc < 1:
        raise UserError(f"--nproc must be >= 1, got {args.nproc}.")
    rest: list[str] = []
    skip = False
    for item in args.argv:  # drop --nproc N / --nproc=N / --max-restarts R from what each worker runs
        if skip:
            skip = False
            continue
        if item in ("--nproc", "--max-restarts"):
            skip = True
            continue
        if item.startswith(("--nproc=", "--max-restarts=")):
            continue
        rest.append(item)
    if args.out is None:
        out = f"runs/{args.algo}-{args.env_id.replace('/', '_')}-{args.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
        rest += ["--out", out]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
               f"--max-restarts={args.max_restarts}", "-m", "rlspeed", *rest]
    print("rlspeed: " + " ".join(command[2:]), flush=True)
    return subprocess.call(command)


def _plain(config) -> dict:
    import dataclasses

    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(config).items()}


def cmd_eval(args: argparse.Namespace) -> int:
    """`rlspeed eval`: load a checkpoint and print its deterministic evaluation (mean +/- std); returns 0.

    The env is `--env` or the one the model was trained on; `--json` also prints the result dict as JSON.
    """
    from rlspeed.algos import ALGORITHMS
    from rlspeed.checkpoint import load_checkpoint

    path = Path(args.checkpoint)
    if path.is_dir():  # a run directory, as `rlspeed train` prints it
        if not (path / "model.safetensors").is_file():
            raise UserError(f"'{path}' is a directory without a model.safetensors (a run directory gets one when "
                            "training finishes); give the model file.")
        path = path / "model.safetensors"
    _, meta = load_checkpoint(path)
    algo_cls = _algorithm(meta.get("algo", "?")) if meta.get("algo") in ALGORITHMS else None
    if algo_cls is None:
        raise UserError(f"'{path}' holds an unknown algorithm '{meta.get('algo')}'.")
    model = algo_cls.load(path, device=args.device)
    env_id = args.env or model.env_id
    from rlspeed.evaluation import evaluate

    result = evaluate(model, env_id, episodes=args.episodes, seed=args.seed, backend=args.env_backend)
    print(f"rlspeed: {model.name.upper()} on {env_id}, deterministic, {args.episodes} episodes: "
          f"{result['mean']:.1f} +/- {result['std']:.1f}")
    if args.json:
        print(json.dumps(result))
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    """`rlspeed doctor`: check the device stack and print what runs here; returns 1 if a check failed, else 0."""
    from rlspeed.diagnostics.doctor import run_doctor

    return run_doctor(device=args.device)


def build_parser() -> argparse.ArgumentParser:
    """The `rlspeed` argument parser: subcommands train, eval, profile and doctor, each setting `func` to its command.

    `--debug` is accepted before or after the subcommand.
    """
    parser = argparse.ArgumentParser(prog="rlspeed", description="Fast reinforcement learning in PyTorch.")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    sub = parser.add_subparsers(dest="command", required=True)

    # what builds the model, shared by train and profile
    model = argparse.ArgumentParser(add_help=False)
    model.add_argument("algo", help="ppo, dqn, sac, td3 or ddpg")
    model.add_argument("env_id", help="a Gymnasium id, e.g. CartPole-v1")
    model.add_argument("--num-envs", type=int, default=None, help="parallel envs (default: preset)")
    model.add_argument("--seed", type=int, default=0)
    model.add_argument("--device", default="auto", help="auto|cpu|cuda[:i]|npu[:i]|xpu|mps")
    model.add_argument("--env-backend", default="auto", choices=["auto", "torch", "gymnasium", "gymnasium-async"])
    model.add_argument("--accelerate", default="off", choices=["auto", "off"])
    model.add_argument("--threads", type=int, default=None, help="torch CPU threads (default 1)")
    model.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a hyperparameter")
    model.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)

    train = sub.add_parser("train", parents=[model], help="train an agent (presets per algorithm and env)")
    train.add_argument("--total-timesteps", type=int, default=None, help="env steps (default: preset)")
    train.add_argument("--out", default=None, help="run directory (default runs/<algo>-<env>-<seed>-<time>)")
    train.add_argument("--target-return", default=None,
                       help="stop when evaluation reaches it (default: the preset's target_return, else the env's "
                            "reward_threshold; 'none' = off)")
    train.add_argument("--eval-freq", type=int, default=None, help="env steps between evaluations")
    train.add_argument("--checkpoint-freq", type=int, default=None, help="env steps between checkpoints")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    train.add_argument("--nproc", type=int, default=None,
                       help="data-parallel processes on this machine (starts torchrun for you)")
    train.add_argument("--max-restarts", type=int, default=0,
                       help="with --nproc: restarts torchrun may do after a failure (resuming from the checkpoint)")
    train.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.safetensors if present")
    train.set_defaults(func=cmd_train)

    ev = sub.add_parser("eval", help="evaluate a saved model (deterministic)")
    ev.add_argument("checkpoint")
    ev.add_argument("--env", default=None, help="env id (default: the one it was trained on)")
    ev.add_argument("--episodes", type=int, default=10)
    ev.add_argument("--seed", type=int, default=None)
    ev.add_argument("--device", default="auto")
    ev.add_argument("--env-backend", default="auto", choices=["auto", "torch", "gymnasium"])
    ev.add_argument("--json", action="store_true", help="also print the result as JSON")
    ev.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    ev.set_defaults(func=cmd_eval)

    prof = sub.add_parser("profile", parents=[model], help="where the time of a training run goes, and what to change")
    prof.add_argument("--steps", type=int, default=None, help="env steps per timed run, rounded up to whole "
                      "iterations (default: 10 iterations, at least 2,000)")
    prof.add_argument("--trace", default=None, metavar="FILE", help="also write a Chrome/Perfetto trace")
    prof.add_argument("--json", action="store_true", help="also print the result as JSON")
    prof.set_defaults(func=cmd_profile)

    doctor = sub.add_parser("doctor", help="check the device stack and what runs here")
    doctor.add_argument("--device", default="auto")
    doctor.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    doctor.set_defaults(func=cmd_doctor)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the `rlspeed` command on `argv` (default: `sys.argv[1:]`) and return the exit code.

    A `UserError` prints one line and returns 2 (with `--debug` it is raised with its traceback); Ctrl-C returns 130.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = argv  # what `--nproc` hands each torchrun worker (less its own options)
    try:
        return int(args.func(args) or 0)
    except UserError as error:
        if getattr(args, "debug", False):
            raise
        print(f"rlspeed: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rlspeed: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
