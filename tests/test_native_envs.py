"""Device-native envs against Gymnasium's own: one-step parity from the same states and actions, whole episodes
with autoreset and time limits, reset distributions, and the batched contract (shapes, dtypes, devices).

Every test runs for every env in the native registry (`rlspeed.envs.registry.NATIVE_ENVS`): a new native env gets
them all. The reference tables below are keyed by the env's dynamics (`_dynamics_id`: CartPoleNoVel-v1 has
CartPole-v1's); `test_every_native_env_has_reference_tables` says which entries a new one must add."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlspeed.device import ACCELERATOR_ORDER, is_available
from rlspeed.envs import NATIVE_ENVS, resolve_backend
from rlspeed.envs.cartpole import THETA_THRESHOLD, X_THRESHOLD
from rlspeed.envs.mountain_car import MAX_SPEED

ENV_IDS = list(NATIVE_ENVS)
DEVICES = ["cpu"] + [kind for kind in ACCELERATOR_ORDER if is_available(kind)]  # (each accelerator present)

#: Documented reset distributions: each state component uniform in [low, high] (low == high: constant).
RESET_BOUNDS = {
    "CartPole-v1": ([-0.05] * 4, [0.05] * 4),
    "Pendulum-v1": ([-math.pi, -1.0], [math.pi, 1.0]),
    "Acrobot-v1": ([-0.1] * 4, [0.1] * 4),
    "MountainCar-v0": ([-0.6, 0.0], [-0.4, 0.0]),
    "MountainCarContinuous-v0": ([-0.6, 0.0], [-0.4, 0.0]),
}

#: Native envs that are another env's dynamics seen through a different observation
SAME_DYNAMICS = {"CartPoleNoVel-v1": "CartPole-v1", "PendulumNoVel-v1": "Pendulum-v1"}


def _dynamics_id(env_id: str) -> str:
    return SAME_DYNAMICS.get(env_id, env_id)


NUM_PARITY = 2000
#: NumPy 2 keeps float32 * Python float in float32 (NEP 50), and the native envs copy that for Pendulum's and
#: MountainCarContinuous's float32 actions; NumPy 1 computed those terms in float64, up to ~1e-8 apart.
PARITY_ATOL = 1e-9 if np.lib.NumpyVersion(np.__version__) >= "2.0.0" else 1e-7
#: ... and so their float32 observations: the same value within float32 rounding with NumPy 2, a few float32 ulps
#: apart (up to ~5e-7 in Pendulum's angular velocity) with NumPy 1
OBS_ATOL = 1e-12 if np.lib.NumpyVersion(np.__version__) >= "2.0.0" else 1e-6


# --- one-step parity ------------------------------------------------------------------------------------------

def _near(rng: np.random.Generator, value: float, spread: float, num: int) -> np.ndarray:
    """`num` values within `spread` of +value or -value (random sign)."""
    return rng.choice([-1.0, 1.0], num) * value + rng.uniform(-spread, spread, num)


def _lands_on(goal: float, speed: float) -> float:
    """The position p with p + speed == goal exactly in float64."""
    position = goal - speed
    while position + speed < goal:
        position = math.nextafter(position, math.inf)
    while position + speed > goal:
        position = math.nextafter(position, -math.inf)
    return position


def _acrobot_near_bar(states: torch.Tensor, actions: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
    """Move each state along dtheta1 (secant steps) until its next tip height is 1 +- 1e-10..1e-3."""
    env = NATIVE_ENVS["Acrobot-v1"](num_envs=1, state_dtype=torch.float64)
    offset = torch.from_numpy(rng.choice([-1.0, 1.0], len(states)) * 10 ** rng.uniform(-10, -3, len(states)))

    def excess(state):
        theta1, theta2 = env.dynamics(state, actions)[0].T[:2]
        return -torch.cos(theta1) - torch.cos(theta1 + theta2) - 1.0 - offset

    previous, current = states, states.clone()
    current[:, 2] += 1e-4
    f_previous, f_current = excess(previous), excess(current)
    for _ in range(8):
        step = torch.nan_to_num(f_current * (current[:, 2] - previous[:, 2]) / (f_current - f_previous))
        previous, f_previous = current, f_current
        current = current.clone()
        current[:, 2] -= step.clamp(-0.1, 0.1)
        f_current = excess(current)
    # The few rows where the secant wandered off keep their starting state.
    return torch.where((f_current.abs() < 1e-3).unsqueeze(-1), current, states)


def _parity_batch(env_id: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, slice]:
    """(states float64 [n, k], actions, rows that sit at a termination boundary)."""
    env_id = _dynamics_id(env_id)
    n, quarter = NUM_PARITY, NUM_PARITY // 4
    edge = slice(0, 2 * quarter)
    if env_id == "CartPole-v1":
        states = rng.uniform([-2.6, -3, -0.25, -3], [2.6, 3, 0.25, 3], (n, 4))
        # x or theta within ~1e-3 of its threshold, moving slowly: the next state lands on either side.
        states[:quarter, 0] = _near(rng, X_THRESHOLD, 2e-3, quarter)
        states[:quarter, 1] = rng.uniform(-0.05, 0.05, quarter)
        states[quarter:edge.stop, 2] = _near(rng, THETA_THRESHOLD, 2e-3, quarter)
        states[quarter:edge.stop, 3] = rng.uniform(-0.05, 0.05, quarter)
        # At rest exactly on a threshold (not terminal) and one ulp past it (terminal).
        for row, sign in enumerate((1.0, -1.0)):
            on_x, on_theta = sign * X_THRESHOLD, sign * THETA_THRESHOLD
            states[4 * row: 4 * row + 4] = [[on_x, 0, 0, 0], [math.nextafter(on_x, sign * math.inf), 0, 0, 0],
                                            [0, 0, on_theta, 0], [0, 0, math.nextafter(on_theta, sign * math.inf), 0]]
        actions = rng.integers(0, 2, n)
    elif env_id == "Pendulum-v1":
        # Unwrapped angles, speeds past the clip, torques past the clip and exactly on it.
        states = rng.uniform([-3 * math.pi, -9.0], [3 * math.pi, 9.0], (n, 2))
        actions = rng.uniform(-3.0, 3.0, (n, 1)).astype(np.float32)
        actions[:quarter] = rng.choice([-2.0, 0.0, 2.0], (quarter, 1))
        edge = slice(0, 0)
    elif env_id == "Acrobot-v1":
        states = rng.uniform(-1, 1, (n, 4)) * np.array([math.pi, math.pi, 4 * math.pi, 9 * math.pi])
        actions = rng.integers(0, 3, n)
        # The chaotic step gives no recipe for the bar: keep the candidates whose next tip height
        # -cos(t1) - cos(t1 + t2) lands nearest 1, then pull each onto 1 +- a tiny offset.
        candidates = torch.from_numpy(
            rng.uniform(-1, 1, (50 * n, 4)) * np.array([math.pi, math.pi, 4 * math.pi, 9 * math.pi]))
        candidate_actions = torch.from_numpy(rng.integers(0, 3, 50 * n))
        env = NATIVE_ENVS[env_id](num_envs=1, state_dtype=torch.float64)
        theta1, theta2 = env.dynamics(candidates, candidate_actions)[0].T[:2]
        nearest = torch.argsort((-torch.cos(theta1) - torch.cos(theta1 + theta2) - 1.0).abs())[:edge.stop]
        actions[edge] = candidate_actions[nearest].numpy()
        states[edge] = _acrobot_near_bar(candidates[nearest], candidate_actions[nearest], rng).numpy()
    elif env_id in ("MountainCar-v0", "MountainCarContinuous-v0"):
        goal = 0.5 if env_id == "MountainCar-v0" else 0.45
        states = rng.uniform([-1.2, -0.07], [0.6, 0.07], (n, 2))
        # Around the goal with speeds of both signs (and exactly zero), and at the left wall moving left.
        states[:quarter] = np.stack([goal + rng.uniform(-2e-3, 2e-3, quarter), rng.uniform(-3e-3, 3e-3, quarter)], 1)
        states[: quarter // 8, 1] = 0.0
        states[quarter:edge.stop] = np.stack([rng.uniform(-1.2, -1.15, quarter), rng.uniform(-0.07, 0.0, quarter)], 1)
        states[quarter: quarter + 20] = [-1.2, 0.0]
        states[quarter + 20: quarter + 40] = [-1.2, -0.07]
        states[-50:, 1] = rng.choice([-1.0, 1.0], 50) * rng.uniform(0.0695, 0.075, 50)  # at and past the speed clip
        if env_id == "MountainCar-v0":
            actions = rng.integers(0, 3, n)
        else:
            actions = rng.uniform(-1.5, 1.5, (n, 1)).astype(np.float32)
            actions[-100:] = rng.choice([-1.0, 0.0, 1.0], (100, 1))
        # Pushed right at full speed, the speed clips to exactly 0.07: the car lands exactly on the goal
        # (terminal) or one ulp short of it (not).
        on_goal = _lands_on(goal, MAX_SPEED)
        states[quarter // 8: quarter // 8 + 2] = [[on_goal, MAX_SPEED], [math.nextafter(on_goal, -1.0), MAX_SPEED]]
        actions[quarter // 8: quarter // 8 + 2] = 2 if env_id == "MountainCar-v0" else 1.0
    else:
        raise KeyError(f"no parity batch for {env_id}: add one to _parity_batch")
    return states, actions, edge


def _gymnasium_steps(env_id: str, states: np.ndarray, actions: np.ndarray):
    """Gymnasium's step from each (state, action): next states, rewards, terminated, observations."""
    # stepped through its observation wrappers (CartPoleNoVel's), with the state set on the unwrapped env
    wrapped = gym.make(env_id, max_episode_steps=10 * len(states), disable_env_checker=True)
    wrapped.reset(seed=0)
    env = wrapped.unwrapped
    next_states, rewards, terminated, observations = [], [], [], []
    for state, action in zip(states, actions):
        env.state = state.copy()
        if _dynamics_id(env_id) == "CartPole-v1":
            env.steps_beyond_terminated = None  # else a second terminal step pays 0 and warns
        # Pendulum keeps `last_u` only for rendering: the state alone determines the step.
        obs, reward, term, _, _ = wrapped.step(int(action) if action.ndim == 0 else action)
        next_states.append(np.asarray(env.state, dtype=np.float64))
        rewards.append(reward)
        terminated.append(term)
        observations.append(obs)
    wrapped.close()
    return np.array(next_states), np.array(rewards, dtype=np.float64), np.array(terminated), np.array(observations)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_one_step_parity_with_gymnasium(env_id):
    states, actions, edge = _parity_batch(env_id, np.random.default_rng(ENV_IDS.index(env_id)))
    env = NATIVE_ENVS[env_id](num_envs=len(states), state_dtype=torch.float64)
    state = torch.from_numpy(states)
    state_before = state.clone()
    next_state, reward, terminated = env.dynamics(state, torch.from_numpy(actions))
    obs = env.observe(next_state)
    assert torch.equal(state, state_before), "dynamics must not modify its input"
    assert next_state.dtype == reward.dtype == torch.float64 and terminated.dtype == torch.bool

    gym_next, gym_reward, gym_terminated, gym_obs = _gymnasium_steps(env_id, states, actions)
    np.testing.assert_allclose(next_state.numpy(), gym_next, rtol=0, atol=PARITY_ATOL)
    np.testing.assert_allclose(reward.numpy(), gym_reward, rtol=0, atol=PARITY_ATOL)
    np.testing.assert_array_equal(terminated.numpy(), gym_terminated)
    assert obs.dtype == torch.float32
    # Float64 states agree to ~1e-14; their float32 observations may round one ulp apart.
    np.testing.assert_allclose(obs.numpy(), gym_obs, rtol=2**-23, atol=OBS_ATOL)
    if _dynamics_id(env_id) != "Pendulum-v1":
        # The boundary rows must really straddle the termination rule, or they test nothing.
        assert 0 < gym_terminated[edge].mean() < 1


# --- whole episodes through `step` ----------------------------------------------------------------------------

def _constant(action):
    def policy(obs):
        if isinstance(action, float):
            return torch.full((obs.shape[0], 1), action)
        return torch.full((obs.shape[0],), action, dtype=torch.int64)
    return policy


#: Per env: deterministic policies of the observation (one row each), and start-state overrides by row.
EPISODES = {
    "CartPole-v1": ([_constant(0), _constant(1),
                     lambda o: (0.1 * o[:, 0] + 0.5 * o[:, 1] + 10 * o[:, 2] + 2 * o[:, 3] > 0).long()], {}),
    "Pendulum-v1": ([_constant(0.0), _constant(2.0), _constant(-3.0)], {}),
    "Acrobot-v1": ([_constant(1), _constant(2), lambda o: torch.where(o[:, 5] > 0, 2, 0)], {}),
    "MountainCar-v0": ([_constant(2), lambda o: torch.where(o[:, 1] >= 0, 2, 0), _constant(2)],
                       {2: [0.45, 0.04]}),
    "MountainCarContinuous-v0": ([_constant(0.0), lambda o: torch.where(o[:, 1:] >= 0, 1.0, -1.0),
                                  _constant(1.5)], {2: [0.40, 0.04]}),
}


def _gymnasium_episode(env_id: str, start: np.ndarray, first_obs: np.ndarray, policy):
    """(length, terminated, truncated, last observation, return) of one Gymnasium episode from `start`."""
    env = gym.make(env_id)
    env.reset(seed=0)
    env.unwrapped.state = start.copy()
    obs, episode_return, length = first_obs, 0.0, 0
    while True:
        action = policy(torch.from_numpy(obs)[None])[0].numpy()
        obs, reward, terminated, truncated, _ = env.step(int(action) if action.ndim == 0 else action)
        episode_return += float(reward)
        length += 1
        if terminated or truncated:
            env.close()
            return length, terminated, truncated, obs, episode_return


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_episodes_match_gymnasium_with_autoreset_and_time_limit(env_id):
    if _dynamics_id(env_id) == "CartPole-v1" and np.lib.NumpyVersion(np.__version__) < "1.25.0":
        pytest.skip("NumPy before 1.25 computes float64 sin and cos with SVML where the CPU has AVX-512, an ulp or so "
                    "from libm's; a 500-step balanced CartPole episode grows that to ~3e-3 in its last observation")
    policies, overrides = EPISODES[_dynamics_id(env_id)]
    env_class = NATIVE_ENVS[env_id]
    max_steps = env_class.spec.max_episode_steps
    num = len(policies)
    env = env_class(num_envs=num, seed=0, state_dtype=torch.float64)
    env.reset(seed=0)
    for row, start in overrides.items():
        env.state[row] = torch.tensor(start, dtype=torch.float64)
    start_states = env.state.clone()
    obs = env.observe(start_states)
    low, high = (torch.tensor(b, dtype=torch.float64) for b in RESET_BOUNDS[_dynamics_id(env_id)])

    first_done: list[tuple | None] = [None] * num
    returns = torch.zeros(num, dtype=torch.float64)
    for t in range(1, max_steps + 1):
        actions = torch.cat([policy(obs[row:row + 1]) for row, policy in enumerate(policies)])
        obs, reward, terminated, truncated, info = env.step(actions)
        final_obs = info["final_obs"]
        # Truncation comes exactly at the limit, and only to rows still in their first episode.
        expect_truncated = torch.tensor([t == max_steps and first_done[row] is None for row in range(num)])
        assert torch.equal(truncated, expect_truncated)
        done = terminated | truncated
        assert torch.equal(final_obs[~done], obs[~done])
        # Finished rows are already reset: a fresh start state, step count zero.
        assert torch.equal(obs[done], env.observe(env.state)[done])
        assert torch.all(env.elapsed_steps[done] == 0)
        assert torch.all((env.state[done] >= low) & (env.state[done] <= high))
        for row in range(num):
            if first_done[row] is None:
                returns[row] += reward[row].double()
                if done[row]:
                    first_done[row] = (t, bool(terminated[row]), bool(truncated[row]), final_obs[row].numpy(),
                                       float(returns[row]))
        if all(record is not None for record in first_done):
            break

    first_obs = env.observe(start_states).numpy()
    for row, policy in enumerate(policies):
        assert first_done[row] is not None
        length, terminated, truncated, last_obs, episode_return = first_done[row]
        gym_length, gym_terminated, gym_truncated, gym_last_obs, gym_return = _gymnasium_episode(
            env_id, start_states[row].numpy(), first_obs[row], policy)
        assert (length, terminated, truncated) == (gym_length, gym_terminated, gym_truncated), f"row {row}"
        np.testing.assert_allclose(last_obs, gym_last_obs, rtol=1e-5, atol=1e-6)
        # Native rewards pass through float32; Gymnasium's are Python floats.
        assert episode_return == pytest.approx(gym_return, rel=1e-6, abs=1e-4)
    lengths = [record[0] for record in first_done]
    if _dynamics_id(env_id) != "Pendulum-v1":
        assert min(lengths) < max_steps, "some row should terminate before the limit"
    if env_id not in SAME_DYNAMICS:  # (the policies balance with velocities; the env they share this step with
        # checks the time limit)
        assert max(lengths) == max_steps, "some row should be truncated at the limit"


# --- reset distributions --------------------------------------------------------------------------------------

def _assert_uniform(samples: np.ndarray, low: list[float], high: list[float], check_moments: bool) -> None:
    num = samples.shape[0]
    for column, (lo, hi) in enumerate(zip(low, high)):
        values = samples[:, column]
        if lo == hi:
            assert np.all(values == lo), f"component {column} should be constant {lo}"
            continue
        width = hi - lo
        slack = 1e-6 * width  # float32 states round the bounds themselves
        assert values.min() >= lo - slack and values.max() <= hi + slack, f"component {column} outside [{lo}, {hi}]"
        # Both ends reached: a narrower range would leave a gap this wide with probability < 1e-8.
        assert values.min() < lo + 0.01 * width and values.max() > hi - 0.01 * width
        if check_moments:
            std = width / math.sqrt(12)
            assert abs(values.mean() - (lo + hi) / 2) < 4 * std / math.sqrt(num)
            assert abs(values.std() - std) < 0.03 * std


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_reset_distribution(env_id):
    low, high = RESET_BOUNDS[_dynamics_id(env_id)]
    env = NATIVE_ENVS[env_id](num_envs=10_000, seed=0)
    obs, _ = env.reset()
    _assert_uniform(env.state.double().numpy(), low, high, check_moments=True)
    assert torch.equal(obs, env.observe(env.state))

    # The table above is Gymnasium's: its own resets fall in the same box and reach both ends.
    gym_env = gym.make(env_id).unwrapped
    gym_env.reset(seed=0)
    gym_states = []
    for _ in range(2000):
        gym_env.reset()
        gym_states.append(np.asarray(gym_env.state, dtype=np.float64))
    _assert_uniform(np.array(gym_states), low, high, check_moments=False)


def test_every_native_env_has_reference_tables():
    """A new native env needs its reset bounds, episode policies and parity batch here (or a SAME_DYNAMICS entry)."""
    rng = np.random.default_rng(0)
    for env_id in NATIVE_ENVS:
        dynamics = _dynamics_id(env_id)
        assert dynamics in RESET_BOUNDS and dynamics in EPISODES, f"add {dynamics} to RESET_BOUNDS and EPISODES"
        _parity_batch(env_id, rng)  # raises for an env without one


def test_reset_is_seeded_and_acrobot_starts_float32_like_gymnasium():
    env = NATIVE_ENVS["Acrobot-v1"](num_envs=64, state_dtype=torch.float64)
    first = env.reset(seed=3)[0], env.state.clone()
    second = env.reset(seed=3)[0], env.state.clone()
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    assert not torch.equal(env.reset(seed=4)[0], first[0])
    # Gymnasium stores Acrobot's initial state as float32.
    assert torch.equal(env.state, env.state.float().double())


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.float64])
def test_each_env_has_its_own_stream_whatever_num_envs(state_dtype):
    """Env i's resets depend only on (seed, i): the same with 3 envs or 20,000 (whose draws come in other blocks)."""
    small = NATIVE_ENVS["Pendulum-v1"](num_envs=3, seed=11, state_dtype=state_dtype)
    large = NATIVE_ENVS["Pendulum-v1"](num_envs=20_000, seed=11, state_dtype=state_dtype)
    assert small._block_steps != large._block_steps
    for _ in range(3):  # reset(seed) restarts the streams
        small.reset(seed=5)
        large.reset(seed=5)
        assert torch.equal(small.state, large.state[:3])
        for _ in range(70):  # past the end of the first block of either
            actions = torch.zeros(3, 1)
            small.step(actions)
            large.step(torch.zeros(20_000, 1))
            assert torch.equal(small.state, large.state[:3])
    assert not torch.equal(large.state[0], large.state[1])


def test_stream_draws_are_uniform_and_uncorrelated():
    env = NATIVE_ENVS["CartPole-v1"](num_envs=512, seed=0, state_dtype=torch.float64)
    draws = torch.stack([env._next_uniform() for _ in range(400)])  # [draw, env, component]
    assert 0.0 <= draws.min() and draws.max() < 1.0
    flat = draws.flatten()
    assert abs(flat.mean() - 0.5) < 0.003 and abs(flat.var() - 1 / 12) < 0.002  # 819,200 draws
    # neighbouring envs, consecutive draws and the components of one draw are uncorrelated
    pairs = [(draws[:, :-1], draws[:, 1:]), (draws[:-1], draws[1:]), (draws[..., 0], draws[..., 1])]
    for a, b in pairs:
        correlation = torch.corrcoef(torch.stack((a.flatten(), b.flatten())))[0, 1]
        assert abs(correlation) < 0.01, correlation
    # every bucket of a 100-bin histogram near its expected count (chi-square, 99 dof: 99 +- 14)
    counts = torch.histc(flat, bins=100, min=0.0, max=1.0)
    expected = flat.numel() / 100
    assert ((counts - expected).square() / expected).sum() < 160

# --- the batched contract -------------------------------------------------------------------------------------

def _random_actions(env, generator: torch.Generator) -> torch.Tensor:
    space = env.spec.action_space
    if env.spec.discrete:
        return torch.randint(space.n, (env.num_envs,), generator=generator).to(env.device)
    low, high = float(space.low[0]), float(space.high[0])
    return (low + (high - low) * torch.rand(env.num_envs, 1, generator=generator)).to(env.device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("env_id", ENV_IDS)
def test_shapes_dtypes_devices(env_id, state_dtype, device):
    env_class = NATIVE_ENVS[env_id]
    num = 7
    env = env_class(num_envs=num, device=device, seed=0, state_dtype=state_dtype)
    obs_shape = (num, *env.spec.observation_shape)
    obs, info = env.reset(seed=1)
    assert obs.shape == obs_shape and obs.dtype == torch.float32 and obs.device.type == device
    assert env.state.shape == (num, env_class.state_size) and env.state.dtype == state_dtype
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):
        obs, reward, terminated, truncated, info = env.step(_random_actions(env, generator))
        assert obs.shape == obs_shape and obs.dtype == torch.float32 and obs.device.type == device
        assert info["final_obs"].shape == obs_shape and info["final_obs"].dtype == torch.float32
        assert reward.shape == (num,) and reward.dtype == torch.float32 and reward.device.type == device
        for flag in (terminated, truncated):
            assert flag.shape == (num,) and flag.dtype == torch.bool and flag.device.type == device
        assert env.state.shape == (num, env_class.state_size) and env.state.dtype == state_dtype
        assert env.state.device.type == device
        assert torch.isfinite(obs).all() and torch.isfinite(reward).all()


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_spec_matches_gymnasium(env_id):
    env_class = NATIVE_ENVS[env_id]
    registered = gym.spec(env_id)
    gym_env = gym.make(env_id)
    assert env_class.spec.env_id == env_id
    assert env_class.spec.observation_shape == gym_env.observation_space.shape
    assert env_class.spec.action_space == gym_env.action_space
    assert env_class.spec.max_episode_steps == registered.max_episode_steps
    assert env_class.spec.reward_threshold == registered.reward_threshold
    # (the bounds too: checkpoints and export sidecars record them, whichever backend the model trained on)
    space = env_class.spec.observation_space
    assert space == gym_env.observation_space and space.dtype == gym_env.observation_space.dtype
    np.testing.assert_array_equal(space.low, gym_env.observation_space.low)  # (exactly: Box's == is approximate)
    np.testing.assert_array_equal(space.high, gym_env.observation_space.high)
    assert resolve_backend(env_id) == "torch"
    gym_env.close()


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_action_forms(env_id):
    """Discrete actions as any integer dtype, `[N]` or `[N, 1]`; continuous as `[N, 1]` or `[N]`."""
    env = NATIVE_ENVS[env_id](num_envs=16, seed=0)
    env.reset()
    actions = _random_actions(env, torch.Generator().manual_seed(1))
    expected = env.dynamics(env.state, actions)
    if env.spec.discrete:
        forms = [actions.int(), actions.unsqueeze(-1)]
    else:
        forms = [actions.reshape(-1)]
    for form in forms:
        for got, want in zip(env.dynamics(env.state, form), expected):
            assert torch.equal(got, want)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("env_id", ENV_IDS)
def test_step_does_not_sync_on_cuda(env_id):
    env = NATIVE_ENVS[env_id](num_envs=64, device="cuda", seed=0)
    env.reset()
    generator = torch.Generator().manual_seed(0)
    actions = [_random_actions(env, generator) for _ in range(3)]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for action in actions:
            env.step(action)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_compiled_stream_hash_draws_the_same_numbers():
    """make_env(..., compile=True) fuses the random-number hash with torch.compile: integer maths, same bits."""
    from rlspeed.envs.native import _uniform_block

    keys = torch.arange(64, dtype=torch.int32) * 7919
    counters = torch.arange(3 * 4, dtype=torch.int32).mul_(-2048144789).view(3, 1, 4)
    dtypes = (torch.float32, torch.float64)

    def both(counters, keys, keys_low):  # (both dtypes' draws in one graph: one compilation, not two)
        return [_uniform_block(counters, keys, keys_low, dtype) for dtype in dtypes]

    for dtype, draws in zip(dtypes, torch.compile(both, dynamic=False)(counters, keys, keys ^ 5), strict=True):
        assert draws.dtype == dtype
        torch.testing.assert_close(draws, _uniform_block(counters, keys, keys ^ 5, dtype), rtol=0, atol=0)


def test_an_unseeded_env_leaves_torchs_global_generator_alone():
    """seed=None draws the env's seed from the OS; reseeding torch's generator would undo a user's manual_seed."""
    import rlspeed

    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    first = NATIVE_ENVS["CartPole-v1"](num_envs=8, seed=None)
    second = rlspeed.make_env("CartPole-v1", num_envs=8, device="cpu", seed=None, backend="torch")
    assert torch.equal(torch.rand(3), expected)
    assert not torch.equal(first.reset()[0], second.reset()[0])  # still a fresh seed each time


# float32 states of the envs that use NativeEnv.observe: where an observation could alias the state (a float64 state
# and Pendulum's / Acrobot's own observe always make a new tensor)
@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("env_id", ["CartPole-v1", "MountainCar-v0", "MountainCarContinuous-v0"])
def test_editing_observations_in_place_leaves_the_state_alone(env_id, compile):
    if compile and env_id != "CartPole-v1":
        pytest.skip("compiling takes seconds: one env covers the compiled transition")
    env = NATIVE_ENVS[env_id](num_envs=4, seed=0, state_dtype=torch.float32, compile=compile)
    generator = torch.Generator().manual_seed(0)
    obs, _ = env.reset()
    state = env.state.clone()
    obs.add_(1.0)
    assert torch.equal(env.state, state)
    for _ in range(3):
        obs, _, _, _, info = env.step(_random_actions(env, generator))
        state = env.state.clone()
        obs.add_(1.0)
        info["final_obs"].add_(1.0)
        assert torch.equal(env.state, state)
