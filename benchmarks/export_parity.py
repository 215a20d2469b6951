"""Exported policies against `predict`: do ONNX (in onnxruntime), TorchScript and torch.export programs give the
model's actions on real observations, and how long does one observation take in onnxruntime vs `predict`?

For each case a model is trained briefly (its settings below: enough that the policy is no longer its
initialisation, not to solve the task), then:

1. 1,000 observations are collected from the real env (Gymnasium's `gym.make`, seed 0) by a deterministic rollout of
   that model (`predict(obs, deterministic=True)` on each observation, resets where an episode ends); the actions that
   drove the env are recorded (with the env's action masks where it gives them, and for RecurrentPPO the state
   carried from step to step, zeroed at episode starts).
2. The model is exported in all three formats (`rlspeed.export.export`); each file is run on the same 1,000
   observations (one at a time, as the rollout ran; RecurrentPPO fed the graph's own next state) and on all 1,000 as
   one batch (feed-forward policies; compared with `predict` on the same batch). Discrete actions must be identical,
   continuous ones within 1e-5 (the issue's bar); the table reports mismatches and the max abs difference.
3. Latency of one observation: `predict(obs)` in Python (numpy in and out) vs onnxruntime's `session.run` (numpy in
   and out, `intra_op_num_threads=1`), and the TorchScript and exported-program modules (tensor in and out); torch
   with one thread; median (and 10-90% range) of `--calls` calls after a warm-up, the formats alternating in rounds.

Cases: PPO CartPole-v1 (Discrete), PPO Pendulum-v1 (Box, normalize_obs), SAC and TD3 Pendulum-v1, DQN CartPole-v1,
RecurrentPPO CartPole-v1, PPO Taxi-v4 with the env's action masks (Discrete observations, one-hot inside the graph,
`action_mask` input), PPO on MinAtar/Breakout-v1 (10x10x4 bool grid, CNN; needs `minatar`) and PPO on
MiniGrid-DoorKey-5x5-v0 (Dict: uint8 image and a Discrete direction; needs `minigrid`). Cases whose package is
missing are listed as skipped.

Usage: python benchmarks/export_parity.py [--quick] [--calls N] [--only CASE,...] [--no-write]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import common
import gymnasium as gym
import numpy as np
import torch

from rlspeed.algos import ALGORITHMS
from rlspeed.export import FORMATS, export

NUM_OBSERVATIONS = 1_000
# name -> (algo, env id, hyperparameters, training steps, package the env needs)
CASES = {
    "ppo-cartpole": ("ppo", "CartPole-v1", {}, 20_000, None),
    "ppo-pendulum-normalized": ("ppo", "Pendulum-v1", {"normalize_obs": True}, 20_000, None),
    "sac-pendulum": ("sac", "Pendulum-v1", {}, 2_000, None),
    "td3-pendulum": ("td3", "Pendulum-v1", {}, 2_000, None),
    "dqn-cartpole": ("dqn", "CartPole-v1", {"learning_starts": 500}, 5_000, None),
    "recurrent_ppo-cartpole": ("recurrent_ppo", "CartPole-v1", {}, 4_096, None),
    "ppo-taxi-masked": ("ppo", "Taxi-v4", {}, 8_192, None),
    "ppo-minatar-cnn": ("ppo", "MinAtar/Breakout-v1", {"cnn_features_dim": 128}, 4_096, "minatar"),
    "ppo-minigrid-dict": ("ppo", "MiniGrid-DoorKey-5x5-v0", {"cnn_features_dim": 64}, 4_096, "minigrid"),
}


def available(package: str | None) -> bool:
    if package is None:
        return True
    try:
        if package == "minatar":
            import minatar.gym

            minatar.gym.register_envs()
        else:
            __import__(package)
    except ImportError:
        return False
    return True


def keep_keys(obs, names: list[str]):
    """The observation as the model takes it (Dict: the keys the model uses, e.g. MiniGrid's mission dropped)."""
    return {key: np.asarray(obs[key]) for key in names} if isinstance(obs, dict) else np.asarray(obs)


def rollout(model, env_id: str, keys: list[str] | None):
    """NUM_OBSERVATIONS observations of a deterministic rollout: (observations, actions predict gave, masks or None,
    episode starts, RecurrentPPO's state (h and c stacked) after each step or None)."""
    env = gym.make(env_id)
    obs, info = env.reset(seed=0)
    observations, actions, masks, starts, states = [], [], [], [], []
    state, start = None, True
    for _ in range(NUM_OBSERVATIONS):
        obs = keep_keys(obs, keys) if keys else np.asarray(obs)
        mask = info.get("action_mask")
        mask = None if mask is None or not model.supports_action_masks else np.asarray(mask, dtype=bool)
        if model.name == "recurrent_ppo":
            action, state = model.predict(obs, state=state, episode_start=np.array([start]), action_masks=mask)
            states.append(np.stack(state))
        else:
            action, _ = model.predict(obs, deterministic=True, action_masks=mask)
        observations.append(obs)
        actions.append(action)
        masks.append(mask)
        starts.append(start)
        obs, _, terminated, truncated, info = env.step(action.item() if action.ndim == 0 else action)
        start = terminated or truncated
        if start:
            obs, info = env.reset()
    env.close()
    return (observations, np.stack(actions), (None if masks[0] is None else np.stack(masks)), np.array(starts),
            np.stack(states) if states else None)


def stack(observations: list):
    if isinstance(observations[0], dict):
        return {key: np.stack([o[key] for o in observations]) for key in observations[0]}
    return np.stack(observations)


def graph_inputs(obs, keys: list[str] | None) -> list[np.ndarray]:
    return [obs[key] for key in keys] if keys else [obs]


def runner(format: str, path: Path):
    """(run(inputs as numpy) -> list of numpy outputs, run_native(inputs as the format's native type), convert)."""
    if format == "onnx":
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        return lambda *inputs: session.run(None, dict(zip(names, inputs)))
    module = torch.jit.load(str(path)) if format == "torchscript" else torch.export.load(str(path)).module()

    def run(*inputs):
        with torch.no_grad():
            out = module(*(torch.from_numpy(np.ascontiguousarray(x)) for x in inputs))
        return [o.numpy() for o in (out if isinstance(out, tuple) else (out,))]
    return run


def compare(got: np.ndarray, expected: np.ndarray) -> dict:
    got, expected = np.asarray(got), np.asarray(expected)
    if got.shape != expected.shape:
        return {"shape_mismatch": [list(got.shape), list(expected.shape)], "passed": False}
    if np.issubdtype(expected.dtype, np.integer):
        mismatches = int(np.sum(np.any(got.reshape(len(got), -1) != expected.reshape(len(expected), -1), axis=1)))
        return {"kind": "discrete", "mismatches": mismatches, "passed": mismatches == 0 and got.dtype == expected.dtype}
    diff = float(np.max(np.abs(got.astype(np.float64) - expected.astype(np.float64))))
    return {"kind": "continuous", "max_abs_diff": diff, "passed": diff <= 1e-5}


def parity(model, format: str, path: Path, data, keys: list[str] | None) -> dict:
    observations, actions, masks, starts, expected_states = data
    run = runner(format, path)
    recurrent = model.name == "recurrent_ppo"
    single, states = [], []
    hidden = model.policy.hidden_size if recurrent else 0
    state = [np.zeros((1, 1, hidden), np.float32)] * 2
    for i, obs in enumerate(observations):
        inputs = graph_inputs(keep_keys(obs, keys) if keys else obs, keys)
        inputs = [x[None] for x in inputs]
        if recurrent:
            inputs += [*state, np.array([starts[i]])]
        if masks is not None:
            inputs.append(masks[i][None])
        out = run(*inputs)
        single.append(out[0][0])
        if recurrent:
            state = out[1:]
            states.append(np.stack(state))
    result = {"single": compare(np.stack(single), actions)}
    if recurrent:
        result["state"] = compare(np.stack(states), expected_states)
    if not recurrent:
        batch = stack(observations)
        expected, _ = model.predict(batch, deterministic=True, action_masks=masks)
        result["batch"] = compare(run(*graph_inputs(batch, keys), *([] if masks is None else [masks]))[0], expected)
    result["passed"] = all(part["passed"] for part in result.values() if isinstance(part, dict))
    return result


def latency(model, paths: dict[str, Path], data, keys: list[str] | None, calls: int) -> dict:
    """Seconds per single-observation call: predict vs each format, alternating in rounds of `calls // 10`."""
    observations, _, masks, _, _ = data
    obs = observations[0]
    mask = None if masks is None else masks[0]
    recurrent = model.name == "recurrent_ppo"
    inputs = [x[None] for x in graph_inputs(obs, keys)]
    if recurrent:
        zeros = np.zeros((1, 1, model.policy.hidden_size), np.float32)
        inputs += [zeros, zeros, np.array([False])]
    if mask is not None:
        inputs.append(mask[None])
    calls_of = {"predict": (lambda: model.predict(obs, state=None, episode_start=None, action_masks=mask)) if recurrent
                else (lambda: model.predict(obs, deterministic=True, action_masks=mask))}
    onnx_run = runner("onnx", paths["onnx"])
    calls_of["onnxruntime"] = lambda: onnx_run(*inputs)
    tensors = [torch.from_numpy(np.ascontiguousarray(x)) for x in inputs]
    for format in ("torchscript", "exported_program"):
        module = torch.jit.load(str(paths[format])) if format == "torchscript" \
            else torch.export.load(str(paths[format])).module()

        def call(module=module):
            with torch.no_grad():
                return module(*tensors)
        calls_of[format] = call
    times: dict[str, list[float]] = {name: [] for name in calls_of}
    for fn in calls_of.values():  # warm-up
        for _ in range(50):
            fn()
    rounds = 10
    for _ in range(rounds):
        for name, fn in calls_of.items():
            for _ in range(max(1, calls // rounds)):
                begin = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - begin)
    return {name: {"median_us": statistics.median(t) * 1e6, "p10_us": float(np.percentile(t, 10)) * 1e6,
                   "p90_us": float(np.percentile(t, 90)) * 1e6, "calls": len(t)} for name, t in times.items()}


def run_case(name: str, args, workdir: Path) -> dict:
    algo, env_id, hyperparameters, steps, _ = CASES[name]
    if args.quick:
        steps = min(steps, 1_024)
    torch.set_num_threads(args.threads)
    begin = time.perf_counter()
    model = ALGORITHMS[algo](env_id, seed=0, num_threads=args.threads, **hyperparameters)
    model.learn(steps, progress_bar=False)
    train_s = time.perf_counter() - begin
    model = model.__class__.load(model.save(workdir / f"{name}.safetensors"), device="cpu")  # as `rlspeed export`
    space = model.spec.observation_space
    keys = list(space.spaces) if isinstance(space, gym.spaces.Dict) else None
    data = rollout(model, env_id, keys)
    masked = data[2] is not None
    paths = {format: export(model, workdir / f"{name}{suffix}", format=format, action_mask=masked)
             for format, suffix in FORMATS.items()}
    result = {"algo": algo, "env_id": env_id, "hyperparameters": hyperparameters, "train_steps": steps,
              "train_s": round(train_s, 1), "observations": len(data[0]), "episodes_started": int(data[3].sum()),
              "action_mask_input": masked, "action_space": str(model.spec.action_space),
              "observation_space": str(space),
              "parity": {format: parity(model, format, path, data, keys) for format, path in paths.items()}}
    torch.set_num_threads(1)
    result["latency"] = latency(model, paths, data, keys, args.calls)
    torch.set_num_threads(args.threads)
    result["passed"] = all(p["passed"] for p in result["parity"].values())
    return result


def describe_parity(result: dict) -> str:
    cells = []
    for format in FORMATS:
        part = result["parity"][format]
        checks = [part["single"]] + [part[key] for key in ("batch", "state") if key in part]
        if checks[0].get("kind") == "discrete":
            cells.append(f"{sum(c['mismatches'] for c in checks if 'mismatches' in c)} mismatches"
                         + (f", state max {part['state']['max_abs_diff']:.1e}" if "state" in part else ""))
        elif "max_abs_diff" in checks[0]:
            cells.append(f"max {max(c['max_abs_diff'] for c in checks):.1e}")
        else:
            cells.append("shape mismatch")
    return cells


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1,024 training steps per case (numbers mean little)")
    parser.add_argument("--calls", type=int, default=2_000, help="timed single-observation calls per runner")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for training (latency: always 1)")
    parser.add_argument("--only", default="", help="comma-separated case names")
    parser.add_argument("--no-write", action="store_true", help="print only: no results JSON, no README section")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    warnings.simplefilter("ignore")  # (TorchScript's deprecation, MinAtar's and MiniGrid's notes)
    names = [n for n in args.only.split(",") if n] or list(CASES)
    load_before = common.load_average()
    print(f"export parity: {', '.join(names)}; load {load_before}", flush=True)
    results, skipped = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            package = CASES[name][4]
            if not available(package):
                skipped[name] = f"needs {package}"
                print(f"  {name}: skipped ({skipped[name]})", flush=True)
                continue
            results[name] = run_case(name, args, Path(tmp))
            r = results[name]
            print(f"  {name}: trained {r['train_steps']} steps in {r['train_s']}s; parity "
                  f"{'passed' if r['passed'] else 'FAILED'} ({'; '.join(describe_parity(r))}); predict "
                  f"{r['latency']['predict']['median_us']:.0f} us, onnxruntime "
                  f"{r['latency']['onnxruntime']['median_us']:.0f} us", flush=True)
    load_after = common.load_average()
    rows = []
    for r in results.values():
        lat = r["latency"]
        rows.append([f"{r['algo']} {r['env_id']}" + (" (masks)" if r["action_mask_input"] else ""),
                     *describe_parity(r),
                     f"{lat['predict']['median_us']:.0f}", f"{lat['onnxruntime']['median_us']:.0f}",
                     f"{lat['torchscript']['median_us']:.0f}", f"{lat['exported_program']['median_us']:.0f}",
                     common.fmt_ratio(lat["predict"]["median_us"] / lat["onnxruntime"]["median_us"])])
    table = common.markdown_table(
        ["policy", "ONNX (onnxruntime) vs predict", "TorchScript vs predict", "exported program vs predict",
         "predict us", "onnxruntime us", "TorchScript us", "exported program us", "predict / onnxruntime"], rows)
    all_passed = all(r["passed"] for r in results.values())
    lines = ["## Exported policies vs predict (`benchmarks/export_parity.py`)", "",
             f"Each policy trained briefly (steps in results/export_parity.json), then {NUM_OBSERVATIONS:,} "
             "observations from a deterministic rollout of it in the real env (Gymnasium, seed 0); every exported file "
             "run on them one at a time (RecurrentPPO: the graph fed its own next state and the episode starts) and, "
             "for feed-forward policies, as one batch of 1,000 against `predict` on that batch. Discrete: actions that "
             "differ from `predict(deterministic=True)` (the bar: 0); continuous: max abs difference (the bar: 1e-5). "
             f"All passed: {'yes' if all_passed else 'NO'}."
             + (f" Skipped: {', '.join(f'{k} ({v})' for k, v in skipped.items())}." if skipped else ""), "",
             "Latency: one observation, median of "
             f"{args.calls:,} calls per runner (alternating rounds, after a warm-up), one torch thread and one "
             "onnxruntime thread; `predict` takes and returns numpy (its conversions included), onnxruntime numpy, "
             "the torch formats tensors. Load average (1, 5, 15 min): "
             f"{load_before} before, {load_after} after (a shared 2-core machine: read ratios, not absolutes).", "",
             table]
    machine = common.machine_description(("rlspeed", "torch", "onnx", "onnxscript", "onnxruntime", "gymnasium",
                                          "minatar", "minigrid"))
    data = {"settings": {"observations": NUM_OBSERVATIONS, "calls": args.calls, "threads": args.threads,
                         "quick": args.quick}, "load_before": load_before, "load_after": load_after,
            "cases": results, "skipped": skipped}
    common.publish("export_parity", lines, data, write=not args.no_write, machine=machine)


if __name__ == "__main__":
    main()
