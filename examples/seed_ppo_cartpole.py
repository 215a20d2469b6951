"""PPO on CartPole-v1: the example of the seed material (seeds/000), with its bugs fixed and one line of rlspeed.

The seed's example, kept in its shape (one gymnasium env, the same Actor-Critic network, `torch.distributions`),
with what made it not learn fixed:
* old log-probs and values are recorded without a graph (`torch.no_grad()`), so the PPO ratio has a gradient;
* advantages come from GAE(lambda) over a fixed-length rollout, with bootstrapping at truncation;
* each rollout is used for several epochs of shuffled minibatch updates (with advantage normalisation and
  gradient clipping), instead of one full-batch step per episode.

The one added line is `model = auto_accelerate(model)`. It runs on whatever device exists (npu > cuda > xpu > mps
> cpu). Run it twice to compare the learning result with and without acceleration:

    python examples/seed_ppo_cartpole.py            # accelerated
    python examples/seed_ppo_cartpole.py --plain    # the same script without the auto_accelerate line
    RLSPEED_ACCELERATE=off python examples/seed_ppo_cartpole.py   # the line runs, but forces fp32 eager

It prints the final mean return of 10 greedy evaluation episodes (500 is the maximum).
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim

from rlspeed import auto_accelerate, resolve_device


class ActorCritic(nn.Module):
    """Policy-value network with a shared body (the seed's network)."""

    def __init__(self, input_dim: int, output_dim: int):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(input_dim, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU())
        self.actor = nn.Linear(128, output_dim)  # action logits
        self.critic = nn.Linear(128, 1)  # state value

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        feat = self.backbone(x)
        return self.actor(feat), self.critic(feat)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plain", action="store_true", help="skip the auto_accelerate line")
    parser.add_argument("--total-steps", type=int, default=100_000, help="environment steps to train for")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    device = resolve_device(args.device)

    env = gym.make("CartPole-v1")
    state_dim = env.observation_space.shape[0]  # 4
    action_dim = env.action_space.n  # 2

    model = ActorCritic(state_dim, action_dim).to(device)
    if not args.plain:
        model = auto_accelerate(model)  # the one added line
    optimizer = optim.Adam(model.parameters(), lr=3e-4)

    # PPO hyperparameters
    gamma = 0.99  # discount
    gae_lambda = 0.95  # GAE(lambda)
    clip = 0.2  # clipping range of the ratio
    rollout_steps = 1024  # steps collected per update
    epochs = 10  # passes over each rollout
    minibatch_size = 64
    value_coef = 0.5
    max_grad_norm = 0.5
    num_updates = max(1, args.total_steps // rollout_steps)

    started = time.perf_counter()
    state, _ = env.reset(seed=args.seed)
    episode_return, finished_returns = 0.0, []
    for update in range(num_updates):
        # 1. Rollout: interact with the environment. Recorded without a graph: these are the "old" policy's numbers.
        states, actions, log_probs, values, rewards, terminals, next_values = [], [], [], [], [], [], []
        with torch.no_grad():
            for _ in range(rollout_steps):
                state_t = torch.tensor(state, dtype=torch.float32).to(device)
                logits, value = model(state_t)
                dist = torch.distributions.Categorical(logits=logits)
                action = dist.sample()
                next_state, r, terminated, truncated, _ = env.step(action.item())
                states.append(state_t)
                actions.append(action)
                log_probs.append(dist.log_prob(action))
                values.append(value.squeeze(-1))
                rewards.append(float(r))
                terminals.append(float(terminated))
                episode_return += r
                if terminated or truncated:
                    # bootstrap a truncated episode from its last state; a terminated one has no future value
                    last = torch.tensor(next_state, dtype=torch.float32).to(device)
                    next_values.append(model(last)[1].squeeze(-1) if truncated else torch.zeros((), device=device))
                    finished_returns.append(episode_return)
                    episode_return = 0.0
                    next_state, _ = env.reset()
                else:
                    next_values.append(None)  # filled in below: V of the next state in the rollout
                state = next_state
            final_value = model(torch.tensor(state, dtype=torch.float32).to(device))[1].squeeze(-1)

        # 2. Advantages with GAE(lambda), computed backwards over the rollout.
        values_t = torch.stack(values)
        next_values_t = torch.stack([nv if nv is not None else (values_t[i + 1] if i + 1 < rollout_steps
                                                                 else final_value)
                                     for i, nv in enumerate(next_values)])
        episode_ends = torch.tensor([nv is not None for nv in next_values], dtype=torch.float32, device=device)
        rewards_t = torch.tensor(rewards, dtype=torch.float32, device=device)
        not_terminal = 1.0 - torch.tensor(terminals, dtype=torch.float32, device=device)
        deltas = rewards_t + gamma * next_values_t * not_terminal - values_t
        advantages = torch.zeros_like(rewards_t)
        running = torch.zeros((), device=device)
        for t in reversed(range(rollout_steps)):
            running = deltas[t] + gamma * gae_lambda * (1.0 - episode_ends[t]) * running
            advantages[t] = running
        returns = advantages + values_t

        # 3. PPO update: several epochs of clipped-objective minibatch steps over the rollout.
        states_t, actions_t, old_log_probs = torch.stack(states), torch.stack(actions), torch.stack(log_probs)
        for _ in range(epochs):
            order = torch.randperm(rollout_steps, device=device)
            for start in range(0, rollout_steps, minibatch_size):
                index = order[start:start + minibatch_size]
                new_logits, new_values = model(states_t[index])
                new_dist = torch.distributions.Categorical(logits=new_logits)
                new_log_probs = new_dist.log_prob(actions_t[index])
                mb_advantages = advantages[index]
                mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
                ratio = torch.exp(new_log_probs - old_log_probs[index])
                surr1 = ratio * mb_advantages
                surr2 = torch.clamp(ratio, 1 - clip, 1 + clip) * mb_advantages
                policy_loss = -torch.min(surr1, surr2).mean()
                value_loss = nn.functional.mse_loss(new_values.squeeze(-1), returns[index])
                loss = policy_loss + value_coef * value_loss
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
                optimizer.step()

        if update % 10 == 0 or update == num_updates - 1:
            recent = np.mean(finished_returns[-20:]) if finished_returns else float("nan")
            print(f"Update {update:3d} | steps {(update + 1) * rollout_steps:7d} | mean return (last 20 episodes) "
                  f"{recent:6.1f} | loss {loss.item():.3f}")
    train_s = time.perf_counter() - started

    # 4. Evaluate the greedy policy.
    model.eval()
    eval_env = gym.make("CartPole-v1")
    eval_returns = []
    for episode in range(10):
        state, _ = eval_env.reset(seed=10_000 + episode)
        done, total = False, 0.0
        while not done:
            with torch.no_grad():
                logits, _ = model(torch.tensor(state, dtype=torch.float32).to(device))
            state, r, terminated, truncated, _ = eval_env.step(torch.argmax(logits).item())
            total += r
            done = terminated or truncated
        eval_returns.append(total)
    mode = "plain" if args.plain else "auto_accelerate"
    print(f"\n[{mode}, {device}] trained {num_updates * rollout_steps} steps in {train_s:.1f} s")
    if not args.plain:
        print(model.accel_report)
    print(f"Final mean return (10 greedy episodes): {np.mean(eval_returns):.1f}")


if __name__ == "__main__":
    main()
