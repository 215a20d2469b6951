r"""SAC with Hindsight Experience Replay on Gymnasium-Robotics' FetchReach: rlspeed (`her=True`) against
Stable-Baselines3 (`replay_buffer_class=HerReplayBuffer`) at RL-Zoo's settings for FetchReach, in one process.

Both train SAC on one `FetchReach-v4` (Dict observations; reward -1 until the gripper is within 5 cm of the goal,
50-step episodes) for the same number of env steps with RL-Zoo's FetchReach entry (rl_zoo3's hyperparams/sac.yml,
written for FetchReach-v1; what `rlspeed train sac gymnasium_robotics:FetchReach-v4` takes): relabelled goals
(future strategy, 4 sampled goals per real one), networks of [64, 64], Adam at 1e-3, batches of 256, gamma 0.95,
automatic entropy, one gradient step per env step after 1,000 random steps, observations and rewards normalised
(SB3: `VecNormalize`, gamma 0.95; rlspeed: `normalize_obs`, `normalize_reward`); rlspeed with PyTorch's default
initialisation and Adam epsilon, as SB3 has them. Runs alternate between the libraries, seed by seed. Each trained
model is then evaluated on a separate env: 10 deterministic episodes, success rate (the env's `is_success` at the
episode's end) and mean return. Steps per second are env steps over `learn`'s wall time, and CPU seconds `learn`'s
process time (construction and evaluation excluded): on a shared machine the CPU time is the steadier of the two.

Needs `gymnasium-robotics` (and MuJoCo, and `pettingzoo`, which it imports) and `stable-baselines3`.
gymnasium-robotics 1.4.2 (the newest release) makes no Fetch env with mujoco 4.0.1 and NumPy 2.4: its
`utils/mujoco_utils.py` tests `model.jnt_type[joint_id] in (mjJNT_HINGE, mjJNT_SLIDE)`, False for the NumPy integer
MuJoCo's arrays hold (MuJoCo's enum compares unequal to it), and asserts it. The published runs had it installed
outside the project's environment with that line patched, reproducible with:

    pip install --target DIR --no-deps gymnasium-robotics==1.4.2 pettingzoo==1.27.0
    sed -i 's/joint_type = model.jnt_type\[joint_id\]/joint_type = int(model.jnt_type[joint_id])/' \
        DIR/gymnasium_robotics/utils/mujoco_utils.py
    PYTHONPATH=DIR python benchmarks/her_fetch.py

(gymnasium-robotics also requires jinja2, which torch brings, and imageio, which the `video` extra brings; `pip install
jinja2 imageio` where they are missing.) Run from the repository root (about 7 minutes of CPU time at the default
6,000 steps and 3 seeds, more on a loaded machine); `--quick` for a smoke run.
"""

from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path

import gymnasium as gym

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

import rlspeed  # noqa: E402

ENV_ID = "FetchReach-v4"
EPISODES = 10


def _settings() -> dict:
    return {"learning_starts": 1000, "buffer_size": 1_000_000, "batch_size": 256, "gamma": 0.95,
            "learning_rate": 1e-3, "train_freq": 1, "gradient_steps": 1}


#: why gymnasium-robotics 1.4.2 cannot make its Fetch envs (mujoco 4.0.1, NumPy 2.4), and the one-line change the
#: published runs had (the docstring's set-up applies it)
PATCH_NOTE = ("gymnasium-robotics 1.4.2's `utils/mujoco_utils.py` asserts `joint_type in (mjJNT_HINGE, mjJNT_SLIDE)`, "
              "which is False for the NumPy integer MuJoCo's `model.jnt_type` holds (mujoco 4.0.1, NumPy 2.4), so no "
              "Fetch env can be made: these runs had it patched to `joint_type = int(model.jnt_type[joint_id])` "
              "(`python benchmarks/her_fetch.py --help` gives the set-up)")


def _register() -> None:
    """Registers Gymnasium-Robotics' envs, or exits with one sentence naming what is missing (before any run)."""
    try:
        import gymnasium_robotics
        import stable_baselines3  # noqa: F401  (the reference side: missing, it stopped after rlspeed's first run)
    except ImportError as error:
        sys.exit(f"her_fetch.py needs gymnasium-robotics (with MuJoCo and pettingzoo, which it imports) and "
                 f"stable-baselines3: pip install gymnasium-robotics pettingzoo stable-baselines3 ({error}).")
    gym.register_envs(gymnasium_robotics)
    try:
        gym.make(ENV_ID).close()
    except AssertionError:
        sys.exit(f"{ENV_ID} cannot be made here: {PATCH_NOTE}.")


def _evaluate(predict, seed: int) -> dict:
    """Deterministic episodes on a fresh env: success rate (is_success at the end) and mean return."""
    return common.goal_episodes(gym.make(ENV_ID), predict, EPISODES, seed)


def _timed(learn) -> dict:
    wall, cpu = time.perf_counter(), time.process_time()
    learn()
    return {"learn_wall_s": time.perf_counter() - wall, "learn_cpu_s": time.process_time() - cpu}


def run_rlspeed(steps: int, seed: int) -> dict:
    model = rlspeed.SAC(ENV_ID, seed=seed, device="cpu", her=True, n_sampled_goal=4, goal_selection_strategy="future",
                        net_arch=[64, 64], normalize_obs=True, normalize_reward=True, ortho_init=False,
                        adam_eps=1e-8, **_settings())
    times = _timed(lambda: model.learn(steps, progress_bar=False))
    result = _evaluate(lambda obs: model.predict(obs, deterministic=True)[0], 10_000 + seed)
    return {"library": "rlspeed", "steps": model.num_timesteps, **times,
            "sps": model.num_timesteps / times["learn_wall_s"], **result}


def run_sb3(steps: int, seed: int) -> dict:
    from stable_baselines3 import SAC, HerReplayBuffer
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    env = VecNormalize(DummyVecEnv([lambda: gym.make(ENV_ID)]), gamma=0.95)
    model = SAC("MultiInputPolicy", env, seed=seed, device="cpu", policy_kwargs={"net_arch": [64, 64]},
                replay_buffer_class=HerReplayBuffer,
                replay_buffer_kwargs={"n_sampled_goal": 4, "goal_selection_strategy": "future"}, **_settings())
    times = _timed(lambda: model.learn(steps))
    env.training = False

    def predict(obs):
        return model.predict(env.normalize_obs(obs), deterministic=True)[0]

    result = _evaluate(predict, 10_000 + seed)
    return {"library": "stable-baselines3", "steps": model.num_timesteps, **times,
            "sps": model.num_timesteps / times["learn_wall_s"], **result}


def parse_args():
    parser = common.script_arguments(__doc__)
    parser.add_argument("--steps", type=int, default=6_000, help="env steps per run")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per library")
    args = parser.parse_args()
    if args.quick:
        common.quick_settings(args, steps=1_100, seeds=1)
    return args


def main() -> None:
    args = parse_args()
    warnings.simplefilter("ignore")
    _register()
    args.threads = common.set_threads(args.threads)
    load_before = common.load_average()
    runners = {"rlspeed": lambda seed: run_rlspeed(args.steps, seed),
               "stable-baselines3": lambda seed: run_sb3(args.steps, seed)}
    results = common.interleave(range(args.seeds), runners)
    load_after = common.load_average()
    by_name = {name: [r for r in results if r["name"] == name] for name in runners}
    sps = {name: common.spread([r["sps"] for r in rows]) for name, rows in by_name.items()}
    cpu = {name: common.spread([r["learn_cpu_s"] for r in rows]) for name, rows in by_name.items()}
    rows = []
    for name, runs in by_name.items():
        rows.append([name, *common.goal_columns(runs),
                     f"{common.fmt(sps[name]['median'])} ({common.fmt_range(sps[name])})",
                     f"{common.fmt(cpu[name]['median'], ',.1f')} ({common.fmt_range(cpu[name], ',.1f')})",
                     common.fmt_ratio(common.ratio(cpu["stable-baselines3"]["median"], cpu[name]["median"]))])
    table = common.markdown_table(["run", "success rate per seed", "mean return per seed", "env steps/s (median, "
                                   "range)", "learn CPU s (median, range)", "CPU time: SB3's / this"], rows)
    lines = ["## SAC with Hindsight Experience Replay on FetchReach (`benchmarks/her_fetch.py`)", "",
             f"Gymnasium-Robotics' `{ENV_ID}` (one env), {args.steps:,} env steps per run, seeds 0-{args.seeds - 1}, "
             "RL-Zoo's FetchReach settings for both (the script's docstring lists them), runs alternating seed by "
             f"seed, torch.set_num_threads({args.threads}); each model evaluated on a separate env, {EPISODES} "
             f"deterministic episodes. Load average (1, 5, 15 min) {load_before} before, {load_after} after. "
             f"{PATCH_NOTE}.", "",
             table]
    machine = common.machine_description(("rlspeed", "torch", "gymnasium", "gymnasium-robotics", "mujoco", "numpy",
                                          "stable-baselines3"))
    data = {"settings": {"env": ENV_ID, "steps": args.steps, "seeds": args.seeds, "threads": args.threads,
                         "episodes": EPISODES, "quick": args.quick, "net_arch": [64, 64], "n_sampled_goal": 4,
                         "goal_selection_strategy": "future", "normalize": True, **_settings()},
            "load_before": load_before, "load_after": load_after, "runs": results, "sps": sps, "learn_cpu_s": cpu}
    common.publish("her_fetch", lines, data, write=not args.no_write, machine=machine)


if __name__ == "__main__":
    main()
