"""Must-show runs of the action half of issue 20: PPO with action masking on Gymnasium's Taxi-v4 (and the same run
with masking off), and PPO on MultiDiscrete and MultiBinary tasks.

    python benchmarks/action_spaces.py [taxi|multi|all] [--seeds 0 1 2]

Taxi-v4 gives `info["action_mask"]` (Gymnasium 1.4); the target is a deterministic evaluation mean >= 7.0 over 10
episodes on a separate env. The MultiDiscrete and MultiBinary tasks are Stable-Baselines3's own test envs
(`stable_baselines3.common.envs.IdentityEnvMultiDiscrete` / `IdentityEnvMultiBinary`: reward 1 per step when the
action equals the observation, 100 steps) and sb3-contrib's `InvalidActionEnvMultiDiscrete` (the same with masked
actions, read from its `action_masks()`): Gymnasium registers no env with MultiDiscrete or MultiBinary actions.
Prints one JSON line per run.
"""

from __future__ import annotations

import argparse
import json
import warnings

import gymnasium as gym

import rlspeed

TAXI = dict(num_envs=16, num_steps=256, batch_size=1024, n_epochs=4, learning_rate=1e-3, ent_coef=0.01,
            gamma=0.99, anneal_lr=False)


def taxi(seed: int, use_masking: bool, budget: int) -> dict:
    model = rlspeed.PPO("Taxi-v4", seed=seed, use_masking=use_masking, **TAXI)
    model.learn(budget, target_return=7.0, eval_freq=16_384, progress_bar=False)
    result = model.result
    final = model.evaluate(episodes=10, seed=10_000 + seed)
    return {"task": "Taxi-v4", "use_masking": use_masking, "seed": seed, "steps_to_target": result.steps_to_target,
            "time_to_target_s": result.time_to_target_s, "steps_run": model.num_timesteps,
            "sps": round(result.sps), "final_eval_mean": final["mean"], "update": model.update_summary()}


def _sb3_vec_env(make, num_envs: int):
    from stable_baselines3.common.vec_env import DummyVecEnv

    return DummyVecEnv([make] * num_envs)


def multi(seed: int, budget: int) -> list[dict]:
    from sb3_contrib.common.envs import InvalidActionEnvMultiDiscrete
    from stable_baselines3.common.envs import IdentityEnvMultiBinary, IdentityEnvMultiDiscrete

    tasks = {
        "IdentityEnvMultiDiscrete(dim=4) [MultiDiscrete([4 4])]": lambda: IdentityEnvMultiDiscrete(dim=4),
        "IdentityEnvMultiBinary(dim=4) [MultiBinary(4)]": lambda: IdentityEnvMultiBinary(dim=4),
        "InvalidActionEnvMultiDiscrete(dims=[4, 4], n_invalid_actions=3) [masked]":
            lambda: InvalidActionEnvMultiDiscrete(dims=[4, 4], n_invalid_actions=3),
    }
    rows = []
    for name, make in tasks.items():
        vec = _sb3_vec_env(make, 8)
        model = rlspeed.PPO(vec, seed=seed, num_envs=8, num_steps=128, batch_size=256, n_epochs=4)
        model.learn(budget, progress_bar=False)
        # evaluation: 10 episodes of 100 steps on separate envs, deterministic actions (masked where the env masks)
        eval_env = rlspeed.make_env(_sb3_vec_env(make, 10))
        obs, info = eval_env.reset(seed=10_000 + seed)
        total = 0.0
        for _ in range(100):
            masks = info.get("action_mask")
            actions = model.act(obs, deterministic=True, action_masks=masks)
            obs, reward, _, _, info = eval_env.step(actions)
            total += float(reward.sum())
        eval_env.close()
        rows.append({"task": name, "seed": seed, "steps": budget, "eval_mean": total / 10, "max_return": 100.0,
                     "masking": model._masking, "update": model.update_summary()["implementation"]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("which", nargs="?", default="all", choices=("taxi", "multi", "all"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--taxi-budget", type=int, default=600_000)
    parser.add_argument("--multi-budget", type=int, default=100_000)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    gym.logger.min_level = 40
    for seed in args.seeds:
        if args.which in ("taxi", "all"):
            for use_masking in (True, False):
                print(json.dumps(taxi(seed, use_masking, args.taxi_budget)), flush=True)
        if args.which in ("multi", "all"):
            for row in multi(seed, args.multi_budget):
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
