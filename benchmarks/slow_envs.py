"""Envs that wait: steps/s of training on an env whose step sleeps 5 ms (`sleeping_env.py`: a simulator over a
socket, a robot), with its envs in this process and in subprocesses, rlspeed beside Stable-Baselines3.

rlspeed's `env_backend="gymnasium"` (what `auto` picks for such an env) steps its envs one after another, as SB3's
DummyVecEnv does: the waits add up, and more envs give no more steps/s. `env_backend="gymnasium-async"` (SB3:
SubprocVecEnv) waits for them side by side, on any number of cores, as long as the env waits rather than computes.
The cases: PPO and DQN on Discrete(2) actions, SAC on a Box action, at identical small hyperparameters on both sides
(below); each run trains a fixed number of env steps, `learn` timed (model and env construction not), fresh models
and envs per run, the libraries interleaved run by run.

    python benchmarks/slow_envs.py              # full run (about 15 minutes)
    python benchmarks/slow_envs.py --quick      # smoke run
"""

from __future__ import annotations

import time

import common
import sleeping_env

import rlspeed

#: per algorithm: (env id, rlspeed hyperparameters, SB3 hyperparameters, SB3 policy_kwargs); the same settings in each
#: library's names (rlspeed's PPO value loss is 0.5 * MSE: its vf_coef 1.0 is SB3's 0.5)
CASES = {
    "ppo": ("SleepingDiscrete-v0",
            dict(num_steps=64, batch_size=64, n_epochs=4, net_arch=(64, 64), activation="tanh", vf_coef=1.0),
            dict(n_steps=64, batch_size=64, n_epochs=4), {}),
    "dqn": ("SleepingDiscrete-v0",
            dict(learning_starts=100, train_freq=4, gradient_steps=1, batch_size=32, buffer_size=10_000,
                 net_arch=(64, 64)),
            dict(learning_starts=100, train_freq=4, gradient_steps=1, batch_size=32, buffer_size=10_000),
            dict(net_arch=[64, 64])),
    "sac": ("SleepingBox-v0",
            dict(learning_starts=100, train_freq=1, gradient_steps=1, batch_size=64, buffer_size=10_000,
                 net_arch=(64, 64)),
            dict(learning_starts=100, train_freq=1, gradient_steps=1, batch_size=64, buffer_size=10_000),
            dict(net_arch=[64, 64])),
}
#: the two ways to hold the envs: (rlspeed env_backend, SB3 vector env class)
LAYOUTS = {"in this process": ("gymnasium", "DummyVecEnv"), "subprocesses": ("gymnasium-async", "SubprocVecEnv")}


def rlspeed_run(algo: str, num_envs: int, layout: str, steps: int, seed: int, threads: int) -> dict:
    env_id, hyperparameters, _, _ = CASES[algo]
    model = getattr(rlspeed, algo.upper())(f"sleeping_env:{env_id}", env_backend=LAYOUTS[layout][0], device="cpu",
                                           seed=seed, num_threads=threads, num_envs=num_envs, **hyperparameters)
    model.make_training_env()  # built outside the timed region, like SB3's env
    try:
        started = time.perf_counter()
        model.learn(steps, progress_bar=False)
        return common.rlspeed_throughput_record(model, time.perf_counter() - started)
    finally:
        model.close()


def sb3_run(algo: str, num_envs: int, layout: str, steps: int, seed: int, threads: int) -> dict:
    import stable_baselines3
    from stable_baselines3.common import vec_env
    from stable_baselines3.common.env_util import make_vec_env

    env_id, _, hyperparameters, policy_kwargs = CASES[algo]
    vec_env_cls = getattr(vec_env, LAYOUTS[layout][1])
    env = make_vec_env(f"sleeping_env:{env_id}", n_envs=num_envs, seed=seed, vec_env_cls=vec_env_cls)
    model = getattr(stable_baselines3, algo.upper())("MlpPolicy", env, device="cpu", seed=seed,
                                                     policy_kwargs=policy_kwargs, **hyperparameters)
    return {**common.sb3_throughput_record(model, env, steps, threads), "env_backend": LAYOUTS[layout][1]}


def main() -> None:
    parser = common.script_arguments(__doc__)
    parser.add_argument("--algos", default="ppo,dqn,sac")
    parser.add_argument("--sizes", default="1,8", help="numbers of envs")
    parser.add_argument("--steps", type=int, default=2048, help="env steps per run (all envs together)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.quick:
        common.quick_settings(args, algos="ppo", sizes="2", steps=256, repeats=1)
    threads = common.set_threads(args.threads)
    load_before = common.load_average()
    raw, rows = [], []
    for algo in args.algos.split(","):
        for num_envs in (int(size) for size in args.sizes.split(",")):
            for layout in LAYOUTS:
                runs = {"rlspeed": [], "sb3": []}
                for seed in range(args.repeats):
                    for library, run in (("rlspeed", rlspeed_run), ("sb3", sb3_run)):
                        runs[library].append(run(algo, num_envs, layout, args.steps, seed, threads))
                sps = {library: common.spread([r["sps"] for r in results])["median"]
                       for library, results in runs.items()}
                raw.append({"algo": algo, "num_envs": num_envs, "layout": layout, "runs": runs})
                rows.append([algo.upper(), str(num_envs), layout, common.fmt(sps["rlspeed"]), common.fmt(sps["sb3"]),
                             common.fmt_ratio(common.ratio(sps["rlspeed"], sps["sb3"]))])
                print(" | ".join(rows[-1]), flush=True)
    table = common.markdown_table(["algorithm", "envs", "envs held", "rlspeed steps/s", "SB3 steps/s",
                                   "rlspeed / SB3"], rows)
    common.publish("slow_envs", [
        "## Envs that wait (`benchmarks/slow_envs.py`)",
        "",
        f"An env whose step sleeps {sleeping_env.STEP_S * 1000:g} ms (`benchmarks/sleeping_env.py`), trained for "
        f"{args.steps:,} env steps per run with its envs in this process (rlspeed `env_backend=\"gymnasium\"`, SB3 "
        "DummyVecEnv) and in subprocesses (rlspeed `gymnasium-async`, SB3 SubprocVecEnv); median of "
        f"{args.repeats} runs per cell, the libraries interleaved; {threads} torch thread. Hyperparameters, the same "
        "on both sides: PPO 64 steps per env, batch 64, 4 epochs, [64, 64] tanh; DQN and SAC learning_starts 100, "
        "batch 32 (DQN) or 64 (SAC), train_freq 4 (DQN) or 1 (SAC), one gradient step, [64, 64]. In this process the "
        "steps/s stay near 1 / 5 ms whatever the number of envs; in subprocesses they grow with it, on any number of "
        f"cores. Load average (1, 5, 15 min): {load_before} before, {common.load_average()} after.",
        "",
        table,
    ], {"results": raw, "settings": vars(args)}, write=not args.no_write,
        machine=common.machine_description(("rlspeed", "torch", "gymnasium", "numpy", "stable-baselines3")))


if __name__ == "__main__":
    main()
