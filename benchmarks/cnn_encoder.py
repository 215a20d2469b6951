"""The CNN encoder against Stable-Baselines3 with the same CNN: training steps/s at identical hyperparameters, and the
bytes one transition of image observations takes in rollout and replay storage.

(a) Throughput on MinAtar/Breakout-v1 (package `minatar`; a 10x10x4 bool grid, 3 actions), 8 in-process envs each
    (rlspeed env_backend="gymnasium", SB3 DummyVecEnv), torch.set_num_threads(--threads, default 1), runs of the two
    libraries alternating, only `learn` timed:
    - PPO: 8 envs x 128 steps, batch 256, 4 epochs, lr 2.5e-4 constant, clip 0.1, ent_coef 0.01, gae 0.95, gamma
      0.99, grad norm 0.5, value coefficient SB3 0.5 (= rlspeed 1.0), linear actor and critic heads (SB3 CnnPolicy's
      net_arch=[]) on one shared encoder;
    - DQN: buffer 100,000, learning_starts 1,000, train_freq 4, batch 32, target update every 1,000 steps, lr 1e-4,
      epsilon 1 -> 0.05 over 10% of the run, grad norm 10, no double Q (SB3's DQN has none), linear Q head.
    rlspeed runs twice: fp32 eager (`accelerate="off"`, the like-for-like comparison) and `accelerate="auto"` (the
    update's precision chosen by measuring, within its accuracy check; what it chose is in the table), which searches
    in its untimed warm-up run (`common.acceleration_decided_at_once`: a run of this length would not reach its
    search), its timed runs taking that choice from the cache.
    The encoder of both: rlspeed's small CNN (`rlspeed.nn.CNNEncoder`, Nature-DQN's 8x8 kernel does not fit 10x10):
    16 then 32 3x3 convolutions, a ReLU linear layer of 256; for SB3 the same layers as a features extractor
    (`SmallCNN` below), which takes SB3's float32 observations (SB3 treats a bool Box as a vector, not an image).
(b) Bytes per transition of image observations in rollout and replay storage, from the storage each library
    allocates (its arrays' sizes): MinAtar's 10x10x4 bool grid and an Atari frame stack (4x84x84 uint8).
(c) What bounds the update: fp32 and bf16 GFLOP/s of the CNN's largest product on one thread.

Usage: python benchmarks/cnn_encoder.py [--quick] [--repeats N] [--ppo-steps N] [--dqn-steps N] [--no-write]
The machine's load (`uptime`) before and after the runs is part of the results: on a shared machine it says how far
to trust them.
"""

from __future__ import annotations

import argparse
import contextlib
import time
import warnings

import common
import gymnasium as gym
import numpy as np
import torch
from torch import nn

import rlspeed
from rlspeed.buffers import ReplayBuffer, RolloutBuffer

ENV_ID = "MinAtar/Breakout-v1"
NUM_ENVS = 8
FEATURES = 256
PPO_SETTINGS = dict(num_steps=128, batch_size=256, n_epochs=4, learning_rate=2.5e-4, clip_range=0.1, ent_coef=0.01,
                    gae_lambda=0.95, gamma=0.99, max_grad_norm=0.5)
DQN_SETTINGS = dict(buffer_size=100_000, learning_starts=1_000, train_freq=4, batch_size=32,
                    target_update_interval=1_000, learning_rate=1e-4, exploration_fraction=0.1,
                    exploration_final_eps=0.05, gamma=0.99, max_grad_norm=10.0)


def register_minatar() -> None:
    import minatar.gym

    minatar.gym.register_envs()


def sb3_extractor() -> type:
    """rlspeed's small CNN encoder as an SB3 features extractor: channels-last grid -> 16, 32 3x3 convolutions -> a
    ReLU linear layer of `features_dim`."""
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor

    class SmallCNN(BaseFeaturesExtractor):
        def __init__(self, observation_space: gym.spaces.Box, features_dim: int = FEATURES):
            super().__init__(observation_space, features_dim)
            height, width, channels = observation_space.shape
            self.cnn = nn.Sequential(nn.Conv2d(channels, 16, 3), nn.ReLU(), nn.Conv2d(16, 32, 3), nn.ReLU(),
                                     nn.Flatten())
            with torch.no_grad():
                flat = self.cnn(torch.zeros(1, channels, height, width)).shape[1]
            self.linear = nn.Sequential(nn.Linear(flat, features_dim), nn.ReLU())

        def forward(self, observations: torch.Tensor) -> torch.Tensor:
            return self.linear(self.cnn(observations.permute(0, 3, 1, 2)))

    return SmallCNN


AUTO_CHOICE: dict[str, str] = {}  # algorithm -> what `accelerate="auto"` chose for its update (last run)


def auto_choice(model) -> str:
    """The decision line(s) of `model.report()` for the update step ("[all calls] -> bf16 ...")."""
    decisions = [line.strip() for line in model.report().splitlines() if "->" in line]
    return "; ".join(decisions) or "fp32 (no decision reported)"


# --- (a) throughput ----------------------------------------------------------------------------------------------
def timed_learn(model, steps: int) -> float:
    """Env steps per second of an rlspeed model's whole `learn(steps)` call, its envs built before (as SB3's are by
    `make_vec_env`): the same clock as the SB3 runs below, whose count includes the start of `learn`."""
    model.make_training_env()
    started = time.perf_counter()
    model.learn(steps, progress_bar=False)
    return model.result.total_timesteps / (time.perf_counter() - started)


def rlspeed_ppo(steps: int, seed: int, accelerate: str = "off") -> float:
    model = rlspeed.PPO(ENV_ID, seed=seed, num_envs=NUM_ENVS, env_backend="gymnasium", anneal_lr=False, vf_coef=1.0,
                        net_arch=(), cnn_features_dim=FEATURES, accelerate=accelerate, **PPO_SETTINGS)
    sps = timed_learn(model, steps)
    if accelerate == "auto":
        AUTO_CHOICE["ppo"] = auto_choice(model)
    return sps


def sb3_ppo(steps: int, seed: int) -> float:
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    settings = {**PPO_SETTINGS, "n_steps": PPO_SETTINGS["num_steps"]}
    del settings["num_steps"]
    model = PPO("MlpPolicy", make_vec_env(ENV_ID, n_envs=NUM_ENVS, seed=seed), seed=seed, vf_coef=0.5, device="cpu",
                policy_kwargs={"features_extractor_class": sb3_extractor(), "net_arch": []}, **settings)
    start = time.perf_counter()
    model.learn(steps)
    return steps / (time.perf_counter() - start)


def rlspeed_dqn(steps: int, seed: int, accelerate: str = "off") -> float:
    model = rlspeed.DQN(ENV_ID, seed=seed, num_envs=1, env_backend="gymnasium", double_q=False, net_arch=(),
                        cnn_features_dim=FEATURES, accelerate=accelerate, **DQN_SETTINGS)
    sps = timed_learn(model, steps)
    if accelerate == "auto":
        AUTO_CHOICE["dqn"] = auto_choice(model)
    return sps


def sb3_dqn(steps: int, seed: int) -> float:
    from stable_baselines3 import DQN
    from stable_baselines3.common.env_util import make_vec_env

    model = DQN("MlpPolicy", make_vec_env(ENV_ID, n_envs=1, seed=seed), seed=seed, device="cpu",
                policy_kwargs={"features_extractor_class": sb3_extractor(), "net_arch": []}, **DQN_SETTINGS)
    start = time.perf_counter()
    model.learn(steps)
    return steps / (time.perf_counter() - start)


# --- (c) what bounds the update ------------------------------------------------------------------------------
def matmul_rates(repeats: int = 200) -> dict[str, float]:
    """GFLOP/s of the CNN's largest product in training (a PPO minibatch of 256 through the 1,152 -> 256 linear
    layer) in fp32 and in bf16, on one thread: how far the fp32 kernels both libraries call are from what a reduced
    precision offers on this CPU."""
    rows, inner, cols = PPO_SETTINGS["batch_size"], 32 * 6 * 6, FEATURES
    rates = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        a, b = torch.randn(rows, inner, dtype=dtype), torch.randn(inner, cols, dtype=dtype)
        for _ in range(10):
            a @ b
        started = time.perf_counter()
        for _ in range(repeats):
            a @ b
        rates[name] = 2 * rows * inner * cols * repeats / (time.perf_counter() - started) / 1e9
    return rates


# --- (b) bytes per transition ------------------------------------------------------------------------------------
def _nbytes(arrays) -> int:
    return sum(array.nbytes for array in arrays if isinstance(array, np.ndarray))


def storage_bytes(space: gym.spaces.Box) -> dict:
    """Bytes per transition of each library's storage for observations of `space` (Discrete(4) actions)."""
    from stable_baselines3.common.buffers import ReplayBuffer as SB3Replay
    from stable_baselines3.common.buffers import RolloutBuffer as SB3Rollout

    actions = gym.spaces.Discrete(4)
    steps, envs, capacity = 128, NUM_ENVS, 10_000
    # as PPO and A2C allocate it for encoded observations (`OnPolicyAlgorithm._start`): images stored once
    rollout = RolloutBuffer(steps, envs, space, (), torch.int64, torch.device("cpu"), store_next_obs=False)
    replay = ReplayBuffer(capacity, 1, space, (), torch.int64, "cpu")
    sb3_rollout = SB3Rollout(steps, space, actions, device="cpu", n_envs=envs)
    sb3_rollout.reset()
    sb3_replay = SB3Replay(capacity, space, actions, device="cpu", n_envs=1)
    sb3_memory = SB3Replay(capacity, space, actions, device="cpu", n_envs=1, optimize_memory_usage=True,
                           handle_timeout_termination=False)
    return {"observation": f"{space.shape} {np.dtype(space.dtype).name}",
            "rollout_rlspeed": rollout.bytes_per_step(),
            "rollout_sb3": _nbytes(vars(sb3_rollout).values()) // (steps * envs),
            "replay_rlspeed": replay.bytes_per_transition,
            "replay_sb3": _nbytes(vars(sb3_replay).values()) // capacity,
            "replay_sb3_optimize_memory_usage": _nbytes(vars(sb3_memory).values()) // capacity}


def parse_args() -> argparse.Namespace:
    parser = common.script_arguments(__doc__)
    parser.add_argument("--repeats", type=int, default=3, help="alternating runs of each library")
    parser.add_argument("--ppo-steps", type=int, default=16_384)
    parser.add_argument("--dqn-steps", type=int, default=12_000)
    args = parser.parse_args()
    if args.quick:
        common.quick_settings(args, repeats=1, ppo_steps=2_048, dqn_steps=1_500)
    return args


def main() -> None:
    args = parse_args()
    warnings.simplefilter("ignore")  # (SB3's and MinAtar's deprecation notes)
    register_minatar()
    args.threads = common.set_threads(args.threads)
    load_before = common.load_average()
    print(f"CNN encoder on {ENV_ID}: {args.repeats} alternating runs, torch.set_num_threads({args.threads}); "
          f"load {load_before}", flush=True)
    def auto(run):  # rlspeed with `accelerate="auto"`: precision chosen by measuring (recorded in REPORTS)
        return lambda steps, seed: run(steps, seed, accelerate="auto")

    runners = {"ppo rlspeed": (rlspeed_ppo, args.ppo_steps, 1024),
               "ppo rlspeed auto": (auto(rlspeed_ppo), args.ppo_steps, 1024),
               "ppo sb3": (sb3_ppo, args.ppo_steps, 1024),
               "dqn rlspeed": (rlspeed_dqn, args.dqn_steps, 1200),
               "dqn rlspeed auto": (auto(rlspeed_dqn), args.dqn_steps, 1200),
               "dqn sb3": (sb3_dqn, args.dqn_steps, 1200)}
    for name, (run, _, warmup) in runners.items():  # imports and first allocations, not recorded
        # (the auto sides' searches run here, and the timed runs take their choices from the cache)
        with common.acceleration_decided_at_once() if name.endswith("auto") else contextlib.nullcontext():
            run(warmup, 0)
    results: dict[str, list[float]] = {name: [] for name in runners}
    for repeat in range(args.repeats):
        for name, (run, steps, _) in runners.items():
            sps = run(steps, repeat)
            results[name].append(sps)
            print(f"  {repeat} {name}: {sps:,.0f} steps/s", flush=True)
    load_after = common.load_average()
    rates = matmul_rates()
    spreads = {name: common.spread(values) for name, values in results.items()}
    bytes_rows = [storage_bytes(gym.spaces.Box(np.zeros((10, 10, 4), bool), np.ones((10, 10, 4), bool), dtype=bool)),
                  storage_bytes(gym.spaces.Box(0, 255, (4, 84, 84), np.uint8))]
    def cell(name: str) -> str:
        return f"{common.fmt(spreads[name]['median'])} ({common.fmt_range(spreads[name])})"

    def versus_sb3(name: str, algo: str) -> str:
        return common.fmt_ratio(common.ratio(spreads[name]["median"], spreads[f"{algo} sb3"]["median"]))

    throughput = common.markdown_table(
        ["algorithm", "rlspeed fp32 steps/s (median, range)", "rlspeed `accelerate=auto` steps/s",
         "SB3 steps/s (median, range)", "rlspeed fp32 / SB3", "rlspeed auto / SB3", "what auto ran"],
        [[algo.upper(), cell(f"{algo} rlspeed"), cell(f"{algo} rlspeed auto"), cell(f"{algo} sb3"),
          versus_sb3(f"{algo} rlspeed", algo), versus_sb3(f"{algo} rlspeed auto", algo), AUTO_CHOICE.get(algo, "?")]
         for algo in ("ppo", "dqn")])
    memory = common.markdown_table(
        ["observation", "rollout rlspeed", "rollout SB3", "replay rlspeed", "replay SB3",
         "replay SB3 optimize_memory_usage"],
        [[row["observation"], row["rollout_rlspeed"], row["rollout_sb3"], row["replay_rlspeed"], row["replay_sb3"],
          row["replay_sb3_optimize_memory_usage"]] for row in bytes_rows])
    lines = ["## CNN encoder vs SB3 with the same CNN (`benchmarks/cnn_encoder.py`)", "",
             f"(a) Training steps/s on {ENV_ID}, PPO with {NUM_ENVS} envs and DQN with one, the same small CNN and "
             f"hyperparameters for both (see the script's docstring); {args.repeats} alternating runs of "
             f"{args.ppo_steps:,} (PPO) and {args.dqn_steps:,} (DQN) steps. Load average (1, 5, 15 min): "
             f"{load_before} before, {load_after} after.", "", throughput, "",
             "(b) Bytes per transition of storage, from the arrays each library allocates (both keep observations in "
             "their dtype; both take truncation bootstraps during collection instead of storing next observations in "
             "the rollout; SB3's rollout also stores returns and advantages):", "",
             memory, "",
             f"(c) What bounds the update: the CNN's fp32 products and convolutions, the same kernels in both "
             f"libraries (`rlspeed profile ppo MinAtar/Breakout-v1` puts the gradient update at about half of a "
             f"PPO run). The CNN's largest product (256 x 1,152 @ 1,152 x 256) runs at "
             f"{rates['fp32']:,.0f} GFLOP/s in fp32 and {rates['bf16']:,.0f} GFLOP/s in bf16 on one thread here: "
             f"beyond fp32, speed comes from a reduced precision, which `accelerate=auto` takes only where its "
             f"accuracy check passes (the choice is in the last column)."]
    machine = common.machine_description(("rlspeed", "torch", "gymnasium", "numpy", "stable-baselines3", "minatar"))
    data = {"settings": {"env_id": ENV_ID, "num_envs": NUM_ENVS, "features": FEATURES, "ppo": PPO_SETTINGS,
                         "dqn": DQN_SETTINGS, "repeats": args.repeats, "ppo_steps": args.ppo_steps,
                         "dqn_steps": args.dqn_steps, "threads": args.threads, "quick": args.quick},
            "load_before": load_before, "load_after": load_after, "throughput": results, "summary": spreads,
            "auto_choice": AUTO_CHOICE, "matmul_gflops": rates,
            "bytes_per_transition": bytes_rows}
    common.publish("cnn_encoder", lines, data, not args.no_write, machine=machine)


if __name__ == "__main__":
    main()
