"""Inference latency of a trained policy: `model.predict` on one observation per call, as a robot loop, a game server
or a trading bot calls it, rlspeed beside Stable-Baselines3 / sb3-contrib at the same network sizes, in one process.

    python benchmarks/predict_latency.py [--calls 2000] [--rounds 10] [--threads 1] [--quick] [--no-write]

Cases (each library's defaults, which agree: 64x64 tanh actor-critics, 256x256 ReLU SAC, 64x64 ReLU Q-network, a
256-unit LSTM then 64x64 tanh heads):
  - PPO CartPole-v1, SAC Pendulum-v1, DQN CartPole-v1: `predict(obs, deterministic=True)`;
  - RecurrentPPO CartPole-v1 (sb3-contrib's RecurrentPPO): `predict(obs, state=state, episode_start=start)`, the state
    fed back from the previous call, `episode_start` set at each episode start;
  - masked PPO Taxi-v4 (sb3-contrib's MaskablePPO): `predict(obs, action_masks=info["action_mask"])`;
  - PPO on Dict observations (SB3's MultiInputPolicy): CartPole's observation as {"position": (x, angle),
    "velocity": (their velocities)};
  - PPO CartPole-v1 on a batch of --batch observations per call.
The observations are a rollout of 256 real steps (random actions, seed 0), taken in turn. Both libraries' models are
untrained (the weights do not change the time). Calls alternate between the libraries in --rounds rounds of
calls / rounds calls each, after a warm-up, each call timed on its own: median and p99 per library, and the ratio
of the medians (rlspeed / reference: below 1, rlspeed is faster). Then the time to load a saved PPO CartPole model
(`PPO.load`, rlspeed's checkpoint against SB3's zip) in this process, and in fresh interpreters: import and load
together, as a service starts (--cold-starts each, alternating; rlspeed imports its modules on first use, so its
import alone says little: the JSON keeps both parts).
"""

from __future__ import annotations

import gc
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import common
import gymnasium as gym
import numpy as np

import rlspeed

ROLLOUT = 256


class DictCartPole(gym.ObservationWrapper):
    """CartPole-v1 with Dict observations: {"position": (cart position, pole angle), "velocity": (their velocities)}."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        low, high = env.observation_space.low, env.observation_space.high
        self.observation_space = gym.spaces.Dict({
            "position": gym.spaces.Box(low[[0, 2]], high[[0, 2]], dtype=np.float32),
            "velocity": gym.spaces.Box(low[[1, 3]], high[[1, 3]], dtype=np.float32)})

    def observation(self, observation):
        return {"position": observation[[0, 2]], "velocity": observation[[1, 3]]}


DICT_ENV_ID = "PredictLatencyDictCartPole-v0"
if DICT_ENV_ID not in gym.registry:
    gym.register(DICT_ENV_ID, entry_point=lambda **kwargs: DictCartPole(gym.make("CartPole-v1", **kwargs)),
                 max_episode_steps=500)


def rollout(env_id: str) -> tuple[list, list, list]:
    """ROLLOUT observations of random actions (seed 0): (observations, action masks or None, episode starts)."""
    env = gym.make(env_id)
    env.action_space.seed(0)
    obs, info = env.reset(seed=0)
    observations, masks, starts, start = [], [], [], True
    for _ in range(ROLLOUT):
        observations.append(obs)
        masks.append(info.get("action_mask"))
        starts.append(np.array([start]))
        obs, _, terminated, truncated, info = env.step(env.action_space.sample())
        start = terminated or truncated
        if start:
            obs, info = env.reset()
    env.close()
    return observations, [None if m is None else m.astype(bool) for m in masks], starts


def feed_forward_calls(model, observations, masks):
    """A function of the call index: one predict on the observation (and mask) of that step."""
    count = len(observations)
    if masks[0] is not None:
        return lambda i: model.predict(observations[i % count], deterministic=True, action_masks=masks[i % count])
    return lambda i: model.predict(observations[i % count], deterministic=True)


def recurrent_calls(model, observations, starts):
    """A function of the call index: one predict with the state the previous call returned."""
    count, state = len(observations), [None]

    def call(i):
        actions, state[0] = model.predict(observations[i % count], state=state[0], episode_start=starts[i % count],
                                          deterministic=True)
        return actions
    return call


def models(case: str, observations_env: str):
    """(rlspeed model, reference model, reference library name) for a case, both untrained on CPU."""
    from stable_baselines3 import DQN, PPO, SAC

    env = gym.make(observations_env)
    if case == "sac-pendulum":
        return rlspeed.SAC("Pendulum-v1", seed=0), SAC("MlpPolicy", env, seed=0, device="cpu"), "stable-baselines3"
    if case == "dqn-cartpole":
        return rlspeed.DQN("CartPole-v1", seed=0), DQN("MlpPolicy", env, seed=0, device="cpu"), "stable-baselines3"
    if case == "recurrent_ppo-cartpole":
        from sb3_contrib import RecurrentPPO

        return (rlspeed.RecurrentPPO("CartPole-v1", seed=0), RecurrentPPO("MlpLstmPolicy", env, seed=0, device="cpu"),
                "sb3-contrib")
    if case == "ppo-taxi-masked":
        from sb3_contrib import MaskablePPO

        return rlspeed.PPO("Taxi-v4", seed=0), MaskablePPO("MlpPolicy", env, seed=0, device="cpu"), "sb3-contrib"
    if case == "ppo-dict":
        return (rlspeed.PPO(DICT_ENV_ID, seed=0), PPO("MultiInputPolicy", env, seed=0, device="cpu"),
                "stable-baselines3")
    return rlspeed.PPO("CartPole-v1", seed=0), PPO("MlpPolicy", env, seed=0, device="cpu"), "stable-baselines3"


# name -> (env the observations come from, label)
CASES = {
    "ppo-cartpole": ("CartPole-v1", "PPO CartPole-v1"),
    "sac-pendulum": ("Pendulum-v1", "SAC Pendulum-v1"),
    "dqn-cartpole": ("CartPole-v1", "DQN CartPole-v1"),
    "recurrent_ppo-cartpole": ("CartPole-v1", "RecurrentPPO CartPole-v1 (state fed back)"),
    "ppo-taxi-masked": ("Taxi-v4", "PPO Taxi-v4 with action_masks (MaskablePPO)"),
    "ppo-dict": (DICT_ENV_ID, "PPO Dict observations (MultiInputPolicy)"),
    "ppo-cartpole-batch": ("CartPole-v1", "PPO CartPole-v1, batch of {batch}"),
}


def calls_of(case: str, model, observations, masks, starts, batch: int):
    if case == "recurrent_ppo-cartpole":
        return recurrent_calls(model, observations, starts)
    if case == "ppo-cartpole-batch":
        batches = [np.stack([observations[(i + j) % len(observations)] for j in range(batch)]) for i in range(16)]
        return lambda i: model.predict(batches[i % len(batches)], deterministic=True)
    return feed_forward_calls(model, observations, masks)


def timed_calls(calls: dict, count: int, rounds: int, warmup: int) -> dict[str, list[float]]:
    """Seconds per call of each of `calls` (name -> function of the call index): `rounds` rounds of count // rounds
    calls of each in turn, after `warmup` untimed calls of each; garbage collection off while a round is timed."""
    for call in calls.values():
        for i in range(warmup):
            call(i)
    times: dict[str, list[float]] = {name: [] for name in calls}
    per_round = max(1, count // rounds)
    clock = time.perf_counter
    for r in range(rounds):
        for name, call in calls.items():
            gc.collect()
            gc.disable()
            try:
                seconds = times[name]
                for i in range(r * per_round, (r + 1) * per_round):
                    begin = clock()
                    call(i)
                    seconds.append(clock() - begin)
            finally:
                gc.enable()
    return times


def summary(seconds: list[float]) -> dict:
    return {"median_us": statistics.median(seconds) * 1e6, "p99_us": float(np.percentile(seconds, 99)) * 1e6,
            "calls": len(seconds)}


def run_case(case: str, args) -> dict:
    env_id, _ = CASES[case]
    observations, masks, starts = rollout(env_id)
    ours, theirs, reference = models(case, env_id)
    calls = {"rlspeed": calls_of(case, ours, observations, masks, starts, args.batch),
             reference: calls_of(case, theirs, observations, masks, starts, args.batch)}
    times = timed_calls(calls, args.calls, args.rounds, args.warmup)
    result = {"reference": reference, **{name: summary(seconds) for name, seconds in times.items()}}
    result["ratio"] = result["rlspeed"]["median_us"] / result[reference]["median_us"]
    return result


COLD_START = {  # library -> (import, load) statements of a fresh interpreter
    "rlspeed": ("import rlspeed", "rlspeed.PPO.load(PATH, device='cpu')"),
    "stable-baselines3": ("from stable_baselines3 import PPO", "PPO.load(PATH, device='cpu')"),
}


def cold_start(library: str, path: str) -> dict:
    """Seconds to import the library and to load the model at `path`, in a fresh interpreter."""
    imports, load = COLD_START[library]
    script = (f"import time\nPATH = {path!r}\nstarted = time.perf_counter()\n{imports}\n"
              f"imported = time.perf_counter()\n{load}\nprint(imported - started, time.perf_counter() - imported)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                          cwd=str(common.BENCHMARKS_DIR))
    import_s, load_s = map(float, done.stdout.split()[-2:])
    return {"import_s": import_s, "load_s": load_s}


def load_times(args) -> dict:
    """`PPO.load` of a saved CartPole model in this process (median of --load-repeats, alternating), and import plus
    load in --cold-starts fresh interpreters each."""
    from stable_baselines3 import PPO

    folder = Path(common.temporary_directory("rlspeed-predict-latency-"))
    ours = str(rlspeed.PPO("CartPole-v1", seed=0).save(folder / "ppo"))
    PPO("MlpPolicy", "CartPole-v1", seed=0, device="cpu").save(folder / "ppo_sb3.zip")
    theirs = str(folder / "ppo_sb3.zip")
    warm = common.alternate({"rlspeed": lambda: _seconds(lambda: rlspeed.PPO.load(ours, device="cpu")),
                             "stable-baselines3": lambda: _seconds(lambda: PPO.load(theirs, device="cpu"))},
                            args.load_repeats)
    cold: dict[str, list[dict]] = {"rlspeed": [], "stable-baselines3": []}
    for _ in range(args.cold_starts):
        cold["rlspeed"].append(cold_start("rlspeed", ours))
        cold["stable-baselines3"].append(cold_start("stable-baselines3", theirs))
    return {"warm_load_s": {name: statistics.median(values) for name, values in warm.items()},
            "cold": {name: {key: statistics.median(run[key] for run in runs) for key in ("import_s", "load_s")}
                     for name, runs in cold.items()}}


def _seconds(call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def parse_args():
    parser = common.script_arguments(__doc__)
    parser.add_argument("--calls", type=int, default=2_000, help="timed calls per library and case")
    parser.add_argument("--rounds", type=int, default=10, help="alternating rounds the calls are split into")
    parser.add_argument("--warmup", type=int, default=200, help="untimed calls per library first")
    parser.add_argument("--batch", type=int, default=256, help="observations per call of the batch case")
    parser.add_argument("--load-repeats", type=int, default=20, help="in-process loads per library")
    parser.add_argument("--cold-starts", type=int, default=3, help="fresh interpreters per library")
    parser.add_argument("--only", default="", help="comma-separated case names (" + ", ".join(CASES) + ")")
    args = parser.parse_args()
    if args.quick:
        common.quick_settings(args, calls=100, rounds=2, warmup=10, load_repeats=2, cold_starts=1)
    return args


def main() -> None:
    args = parse_args()
    warnings.simplefilter("ignore")
    args.threads = common.set_threads(args.threads)
    names = [name for name in args.only.split(",") if name] or list(CASES)
    unknown = [name for name in names if name not in CASES]
    if unknown:
        raise SystemExit(f"unknown case {unknown[0]!r}: use one of {', '.join(CASES)}")
    load = {"before": common.uptime()}
    results = {}
    for name in names:
        results[name] = run_case(name, args)
        r = results[name]
        print(f"  {name}: rlspeed {r['rlspeed']['median_us']:.0f} us, {r['reference']} "
              f"{r[r['reference']]['median_us']:.0f} us ({common.fmt_ratio(r['ratio'])})", flush=True)
    loading = load_times(args)
    load["after"] = common.uptime()
    rows = []
    for name, r in results.items():
        ours, theirs = r["rlspeed"], r[r["reference"]]
        rows.append([CASES[name][1].format(batch=args.batch), r["reference"], f"{ours['median_us']:.0f}",
                     f"{ours['p99_us']:.0f}", f"{theirs['median_us']:.0f}", f"{theirs['p99_us']:.0f}",
                     common.fmt_ratio(r["ratio"])])
    table = common.markdown_table(["call", "reference", "rlspeed median us", "rlspeed p99 us", "reference median us",
                                   "reference p99 us", "rlspeed / reference"], rows)
    warm, cold = loading["warm_load_s"], loading["cold"]
    started = {library: cold[library]["import_s"] + cold[library]["load_s"] for library in cold}
    load_rows = [[library, f"{warm[library] * 1e3:.1f}", f"{started[library]:.2f}"]
                 for library in ("rlspeed", "stable-baselines3")]
    load_rows.append(["rlspeed / stable-baselines3", common.fmt_ratio(warm["rlspeed"] / warm["stable-baselines3"]),
                      common.fmt_ratio(started["rlspeed"] / started["stable-baselines3"])])
    lines = ["## Inference latency: `predict` on one observation (`benchmarks/predict_latency.py`)", ""]
    if args.quick:
        lines += ["**Smoke run (`--quick`): settings far too small for the numbers to mean anything.**", ""]
    lines += [f"One `predict` per call, {args.calls:,} timed calls per library and case in {args.rounds} alternating "
              f"rounds after {args.warmup} untimed ones, torch.set_num_threads({args.threads}), CPU, untrained models "
              "at both libraries' default network sizes, observations from a random rollout of the env; the last "
              "column is the ratio of the medians (below 1: rlspeed is faster). Load: `PPO.load` of a CartPole model "
              f"in a warm process (median of {args.load_repeats}), and import and load in fresh interpreters "
              f"(median of {args.cold_starts}).", "", table, "",
              common.markdown_table(["library", "PPO.load in a warm process (ms)",
                                     "import and PPO.load in a fresh interpreter (s)"], load_rows), "",
              f"Load (`uptime`): before: `{load['before']}`; after: `{load['after']}`."]
    machine = common.machine_description(("rlspeed", "torch", "gymnasium", "numpy", "stable-baselines3",
                                          "sb3-contrib"))
    common.publish("predict_latency", lines, {"settings": vars(args), "cases": results, "loading": loading,
                                              "load": load}, write=not args.no_write, machine=machine)


if __name__ == "__main__":
    main()
