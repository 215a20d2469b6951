"""`rlspeed profile`: where the time of a training run goes, and what to change.

`profile_run(model)` trains an algorithm for a while three times: a warm-up (past ``learning_starts``, through the
acceleration layer's one-off search), an unprofiled run that gives the steps/s to expect, and a run under
``torch.profiler`` that splits the time into the loop's phases (`rlspeed.diagnostics.phases`: choosing actions,
env.step, buffer writes, GAE, gradient steps, reading metrics back) and lists the operations that cost most.
`advise` turns the shares into suggestions (a device-native env, ``--accelerate auto``, the CPU for tiny networks,
...). The profiler itself slows operation-heavy phases down, so the shares are approximate; the unprofiled
steps/s is the number to compare runs by.

Shares are of host (CPU) time. On CUDA the host runs ahead of the device and waits for it where it reads a result
back (the ``metrics`` phase, ``.item()`` calls), so there the profile also reports the device's busy time and the
host syncs; kernels are not attributed to phases (backward kernels are launched from autograd's own thread).
The thresholds of `advise` are rules of thumb; each line of advice states the share that triggered it.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import shutil
import tempfile
import textwrap
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from rlspeed.device import synchronize
from rlspeed.diagnostics.doctor import usable_cores
from rlspeed.diagnostics.phases import PHASES, PREFIX
from rlspeed.envs import resolve_backend
from rlspeed.errors import UserError, WaitingEnvWarning

DEFAULT_ITERATIONS = 10  # iterations profiled by default ...
DEFAULT_MIN_STEPS = 2_000  # ... and at least this many env steps
# The profiler keeps every operation it records in memory, which grows with the env steps recorded (gigabytes for a
# few thousand steps of an env made of many small operations): the profiled run records at most this many env steps
# (whole iterations, at least one)
PROFILED_MAX_STEPS = 2_048
# ... and at most this many off-policy gradient steps (whole iterations, at least one): the record grows with the
# operations run, hundreds per gradient step, and a share of a phase is as well measured over this many
PROFILED_MAX_UPDATES = 256
# CUDA runtime calls that block the host until the device catches up (`.item()` is a copy, then a stream sync)
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")
# Thresholds of `advise` (shares of the profiled wall time, unless said otherwise)
ENV_SHARE = 0.35
UPDATE_SHARE = 0.5
ACT_SHARE = 0.35
# Subprocess envs (Gymnasium's AsyncVectorEnv: one process per env) pay a round trip per env step and need cores of
# their own: they are suggested only for envs slower than SLOW_ENV_MS per 1k env steps (1 ms a step) on a machine
# with at least ASYNC_MIN_CORES usable cores, and then as something to compare, not a sure gain
SLOW_ENV_MS = 1_000.0
ASYNC_MIN_CORES = 4
# An env that waits (a sleep, a socket, a simulator or robot in another process) keeps no core busy: where the
# unprofiled run kept fewer than WAITING_CORES cores busy on average (this process and its subprocesses), the
# subprocesses of gymnasium-async wait side by side, and the core count does not limit them
WAITING_CORES = 0.5
SMALL_NETWORK = 20_000  # parameters; with fewer than SMALL_NETWORK_ENVS envs, launch latency rules on accelerators
SMALL_NETWORK_ENVS = 256
SYNCS_PER_1K = 10.0
REPORT_WIDTH = 116  # the report's widest line: a terminal narrower than that gets its own width (`_report_width`)


@dataclass
class PhaseTime:
    """One phase of the loop: host (CPU) milliseconds per 1,000 env steps and its share of the profiled wall time."""

    name: str
    host_ms: float
    share: float


@dataclass
class OpTime:
    """One operation: calls and self time (host; device on CUDA, else 0) per 1,000 env steps."""

    name: str
    calls: float
    host_ms: float
    device_ms: float


@dataclass
class Profile:
    """What `profile_run` measured; `str()` is the report `rlspeed profile` prints, `to_dict()` its JSON."""

    algo: str  #: rlspeed's algorithm name ("ppo"), or the class name of a model of the user's own class
    env_id: str
    device: str
    env_backend: str
    num_envs: int
    parameters: int
    accelerate: dict
    steps: int
    sps: float  # unprofiled
    profiled_sps: float
    phases: list[PhaseTime] = field(default_factory=list)
    top_ops: list[OpTime] = field(default_factory=list)
    device_busy_ms: float | None = None  # CUDA: kernel and copy time per 1,000 env steps; None elsewhere
    host_syncs: float | None = None  # CUDA: blocking runtime calls per 1,000 env steps; None elsewhere
    #: the settings that set how many gradient steps an env step costs, in words (`update_lever`)
    update_lever: str = "fewer gradient steps per env step"
    advice: list[str] = field(default_factory=list)
    #: what makes the figures less telling (a profiled run shorter than the default's: `too_few_steps`)
    caveats: list[str] = field(default_factory=list)
    #: what `--accelerate auto` would time against fp32 eager for this run's update on its device (strategy labels,
    #: `auto_candidates`); empty where it has nothing else to try; looked up only where the advice names them
    #: (`needs_auto_candidates`), None elsewhere
    auto_candidates: list[str] | None = None
    #: which gradient update ran and why (`Algorithm.update_summary`: summary.json's `update`)
    update: dict = field(default_factory=dict)
    #: the hidden layers' activation (the model's `activation` setting; None for a model without one)
    activation: str | None = None
    #: cores the unprofiled run kept busy on average (CPU time of this process and its subprocesses over the wall
    #: time: `cores_busy`); None where it could not be read
    cores_busy: float | None = None

    def phase(self, name: str) -> PhaseTime:
        """Phase `name` (zero time when it did not run)."""
        return next((p for p in self.phases if p.name == name), PhaseTime(name, 0.0, 0.0))

    def share(self, name: str) -> float:
        """The share of phase `name` (0 when it did not run)."""
        return self.phase(name).share

    def host_ms(self, name: str) -> float:
        """Host milliseconds per 1,000 env steps of phase `name` (0 when it did not run)."""
        return self.phase(name).host_ms

    def to_dict(self) -> dict:
        """The profile as plain JSON-ready data (what `rlspeed profile --json` prints)."""
        return asdict(self)

    def __str__(self) -> str:
        on_device = self.device_busy_ms is not None
        width = _report_width()
        lines = textwrap.wrap(f"rlspeed profile: {self.algo} {self.env_id} on {self.device} ({self.env_backend} envs "
                              f"x {self.num_envs}, {self.parameters:,} parameters, accelerate "
                              f"{_describe(self.accelerate)})", width, subsequent_indent="  ")
        lines += [f"  {self.sps:,.0f} steps/s unprofiled; {self.steps:,} steps profiled at {self.profiled_sps:,.0f} "
                  "steps/s", "  (shares are approximate: the profiler slows operation-heavy phases most)"]
        for line in self.caveats:
            lines += textwrap.wrap(line, width, initial_indent="  caveat: ", subsequent_indent="    ")
        lines += ["", f"  {'phase':<10}{'ms/1k steps':>12}{'share':>8}   what it is"]
        for p in self.phases:
            row = f"  {p.name:<10}{p.host_ms:>12.1f}{p.share:>8.0%}   "
            lines += textwrap.wrap(_PHASE_TEXT.get(p.name, ""), width, initial_indent=row,
                                   subsequent_indent=" " * len(row)) or [row.rstrip()]
        if on_device:
            busy = self.device_busy_ms * self.profiled_sps / 1e6
            lines.append(f"  device busy {self.device_busy_ms:,.1f} ms per 1k steps ({busy:.0%} of the wall time); "
                         f"host syncs {self.host_syncs:,.1f} per 1k steps")
        lines += ["", f"  top operations (self time per 1k steps{', host then device' if on_device else ''}):"]
        for op in self.top_ops:
            lines.append(f"    {op.name:<44}{op.host_ms:>9.1f} ms" + (f"{op.device_ms:>9.1f} ms" if on_device else "")
                         + f" {op.calls:>9,.0f} calls")
        lines += ["", "  advice:"]
        for line in self.advice:
            lines += textwrap.wrap(line, width, initial_indent="  - ", subsequent_indent="    ")
        return "\n".join(lines)


def _report_width() -> int:
    """The width the report's text is wrapped to: `REPORT_WIDTH`, or a narrower terminal's (COLUMNS, else the
    terminal stdout is), less one column, where lines of 116 characters would each wrap mid-word; at least 60."""
    return max(60, min(REPORT_WIDTH, shutil.get_terminal_size((REPORT_WIDTH + 1, 24)).columns - 1))


_PHASE_TEXT = {**PHASES, "other": "the Python loop, schedules and everything not in a phase"}


def _describe(accelerate: dict) -> str:
    """`precision fp32, compile off, rollout_policy (precision fp32, compile off)`: nested choices in parentheses."""
    if not accelerate:
        return "off"
    return ", ".join(f"{key} ({_describe(value)})" if isinstance(value, dict) else f"{key} {value}"
                     for key, value in accelerate.items())


def steps_per_iteration(model) -> int:
    """Env steps one training iteration of `model` takes (a PPO rollout, or an off-policy `train_freq`)."""
    return _iteration_steps(model.config)


def _iteration_steps(cfg) -> int:
    return int(getattr(cfg, "num_steps", None) or getattr(cfg, "train_freq", 1)) * int(cfg.num_envs)


def parameter_count(model) -> int:
    """Parameters the model trains: each one its optimizers step, once (SAC's learnt `log_alpha`, a subclass's own
    head beside its networks; target copies and frozen parameters not counted). A model without an optimizer: its
    networks' parameters, target copies left out."""
    optimizers = model._optimizers().values()
    if optimizers:
        params = (p for optimizer in optimizers for group in optimizer.param_groups for p in group["params"]
                  if p.requires_grad)
    else:
        params = (p for name, module in model._modules().items()
                  if isinstance(module, torch.nn.Module) and "target" not in name for p in module.parameters())
    return sum({id(p): p.numel() for p in params}.values())


def planned_steps(model, steps: int | None = None) -> tuple[int, int, int]:
    """(the unprofiled run's env steps, the default warm-up's, the profiled run's) of `profile_run` for `model`:
    `steps` (default: the larger of 10 iterations and 2,000 env steps) rounded up to whole iterations;
    learning_starts plus two iterations; at most `PROFILED_MAX_STEPS` of `steps` and, off-policy, the iterations of
    `PROFILED_MAX_UPDATES` gradient steps (whole iterations, at least one)."""
    return _plan(model.config, steps)


def _plan(cfg, steps: int | None) -> tuple[int, int, int]:
    per_iteration = _iteration_steps(cfg)
    if steps is None:
        steps = max(DEFAULT_ITERATIONS * per_iteration, DEFAULT_MIN_STEPS)
    if steps <= 0:
        raise UserError(f"steps must be positive, got {steps}.")
    steps = math.ceil(steps / per_iteration) * per_iteration
    iterations = PROFILED_MAX_STEPS // per_iteration
    updates = getattr(cfg, "gradient_steps", None)  # (off-policy: per iteration; -1 one per env step)
    if updates is not None:
        iterations = min(iterations, PROFILED_MAX_UPDATES // (per_iteration if updates == -1 else int(updates)))
    return (steps, int(getattr(cfg, "learning_starts", 0)) + 2 * per_iteration,
            min(steps, max(1, iterations) * per_iteration))


def profile_buffer_size(config, steps: int | None = None) -> int | None:
    """The replay buffer `rlspeed profile` gives an off-policy `config` (an algorithm's validated config) for a
    profile of `steps` (`planned_steps`' meaning): every env step the default warm-up, the timed and the profiled
    runs take, which it never wraps, so that each step costs what it costs with training's larger buffer; None where
    `config` has no replay buffer or one no larger."""
    buffer_size = getattr(config, "buffer_size", None)
    if buffer_size is None:
        return None
    timed, warmup, profiled = _plan(config, steps)
    needed = timed + warmup + profiled
    return needed if needed < int(buffer_size) else None


def _export_trace(prof, trace: Path) -> None:
    """Write `prof`'s Chrome trace at `trace`. torch takes the path as UTF-8 text: a name whose bytes are not UTF-8
    (os.fsdecode's surrogates: a GBK-named directory, any non-ASCII name where the locale's encoding is ASCII) is
    written in a temporary directory and moved there."""
    try:
        str(trace).encode("utf-8")
    except UnicodeEncodeError:
        with tempfile.TemporaryDirectory() as folder:
            written = os.path.join(folder, "trace.json")
            prof.export_chrome_trace(written)
            shutil.move(written, trace)
        return
    prof.export_chrome_trace(str(trace))


def profile_run(model, steps: int | None = None, warmup_steps: int | None = None, top: int = 8,
                trace: str | Path | None = None, say: Callable[[str], None] | None = None) -> Profile:
    """Warm `model` up, time `steps` env steps of `learn` unprofiled, then up to `PROFILED_MAX_STEPS` more (at least
    one iteration) under torch.profiler, which keeps every operation in memory.

    Defaults: `steps` = the larger of 10 iterations and 2,000 env steps (always rounded up to whole iterations);
    `warmup_steps` = ``learning_starts`` plus two iterations (gradient steps and the acceleration search then run
    before anything is timed). `top`: how many operations to list. `trace`: also write a Chrome/Perfetto trace
    there. `say`: called with a line before the profiler's record is read back, which can take minutes (`rlspeed
    profile` prints it on stderr). The model keeps training throughout: three `learn` calls, each running its
    schedules (PPO's annealing, DQN's epsilon) over its own steps as `learn` does; afterwards `model.result` is the
    profiled (slowed) run's.
    """
    if model.strategy.enabled:
        raise UserError("rlspeed profile runs in one process; profile without torchrun (one rank is what each "
                        "process of a data-parallel run does, plus the gradient all-reduce).")
    steps, default_warmup, profiled = planned_steps(model, steps)
    warmup_steps = default_warmup if warmup_steps is None else warmup_steps

    def learn(steps: int) -> None:  # (this report's advice says what training's note on envs that wait says)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", WaitingEnvWarning)
            model.learn(steps, progress_bar=False)

    if warmup_steps > 0:
        learn(warmup_steps)
    busy = cores_busy(lambda: learn(steps))
    sps = model.result.sps

    on_cuda = model.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    # Kineto, which reads KINETO_LOG_LEVEL at its first use in the process, logs its start and stop on stderr
    # ("USDT: ... profiler_start") at a level above its errors: 6 silences both. Host-only profiles set it (unless
    # the user did); device profiles keep Kineto's errors (a CUPTI permission failure means no device times).
    quiet = not on_cuda and "KINETO_LOG_LEVEL" not in os.environ
    if quiet:
        os.environ["KINETO_LOG_LEVEL"] = "6"
    try:
        with profile(activities=activities) as prof:
            started = time.perf_counter()
            learn(profiled)
            synchronize(model.device)
            wall_s = time.perf_counter() - started
            if say is not None:  # (leaving the block and reading the events back is where the time goes now)
                say(f"rlspeed: {model.result.total_timesteps:,} env steps profiled in {wall_s:.1f} s; reading back "
                    "the profiler's record of every operation they ran, which takes a while (minutes off-policy: "
                    "each of the many small gradient steps is hundreds of operations)")
    finally:
        if quiet:  # (not passed on to processes started later)
            del os.environ["KINETO_LOG_LEVEL"]
    if trace is not None:
        _export_trace(prof, Path(trace))
    steps_done = model.result.total_timesteps
    per_1k = 1000.0 / max(steps_done, 1)

    host_us: dict[str, float] = {}
    syncs = 0
    for event in prof.events():
        if event.device_type != DeviceType.CPU:
            continue
        if event.name in SYNC_CALLS:
            syncs += 1
        elif event.name.startswith(PREFIX):  # phases do not nest: each range is its own slice of the loop
            name = event.name[len(PREFIX):]
            host_us[name] = host_us.get(name, 0.0) + event.cpu_time_total
    wall_us = wall_s * 1e6
    order = [name for name in PHASES if name in host_us] + sorted(set(host_us) - set(PHASES))
    phases = [PhaseTime(name, host_us[name] / 1e3 * per_1k, host_us[name] / wall_us) for name in order]
    other_us = max(wall_us - sum(host_us.values()), 0.0)
    phases.append(PhaseTime("other", other_us / 1e3 * per_1k, other_us / wall_us))

    averages = prof.key_averages()
    # Host-side operations only: a CUDA kernel is also an event of its own (and a GPU-side range is one per
    # annotation), while an operation's self device time already holds the kernels it launched.
    ops = [op for op in averages if op.device_type == DeviceType.CPU and not op.is_user_annotation
           and not op.key.startswith(PREFIX) and not op.key.startswith("ProfilerStep")]
    ops.sort(key=lambda op: op.self_cpu_time_total + _device_us(op), reverse=True)
    top_ops = [OpTime(op.key, op.count * per_1k, op.self_cpu_time_total / 1e3 * per_1k, _device_us(op) / 1e3 * per_1k)
               for op in ops[:top]]

    # (a class of the user's own by its name: it inherits rlspeed's algorithm's `name`, "ppo")
    algo = model.name if type(model).__module__.startswith("rlspeed.") else type(model).__name__
    result = Profile(algo=algo, env_id=model.env_id, device=str(model.device), env_backend=model.env_backend,
                     num_envs=int(model.config.num_envs), parameters=parameter_count(model),
                     accelerate=model.acceleration_summary() if model.accelerate == "auto" else {},
                     steps=steps_done, sps=sps, profiled_sps=steps_done / max(wall_s, 1e-9), phases=phases,
                     top_ops=top_ops, update_lever=update_lever(model.config),
                     device_busy_ms=sum(_device_us(op) for op in ops) / 1e3 * per_1k if on_cuda else None,
                     host_syncs=syncs * per_1k if on_cuda else None, cores_busy=busy, update=model.update_summary(),
                     activation=getattr(model.config, "activation", None))
    if needs_auto_candidates(result):
        result.auto_candidates = auto_candidates(model, result.update)
    result.advice = advise(result)
    result.caveats = too_few_steps(model, steps_done)
    return result


def too_few_steps(model, profiled: int) -> list[str]:
    """A caveat when the profiled run recorded fewer env steps than the default run would (`planned_steps` without
    `steps`: 10 iterations and at least 2,000 env steps, at most `PROFILED_MAX_STEPS`), else none. Each `learn` call
    pays once for its start (the envs' reset, a host sync) and its closing metrics read, which a short run spreads
    over few steps: in one run, 4 steps of DQN CartPole (`--steps 1`) put 45% of the time in `metrics` and
    `other`, 2,000 steps 7%."""
    default = planned_steps(model)[2]
    if profiled >= default:
        return []
    iterations = max(profiled // steps_per_iteration(model), 1)
    return [f"only {profiled:,} env steps ({iterations:,} iteration{'s' if iterations > 1 else ''}) were profiled, "
            f"fewer than the {default:,} of the default run: the learn call's start (env reset, a host sync) and "
            "its closing metrics read weigh on every figure here; profile without --steps, or with "
            f"--steps {default} or more, for figures to compare."]


def auto_candidates(model, update: dict | None = None) -> list[str]:
    """The strategies besides fp32 eager that `--accelerate auto` would time for `model`'s update on its device: the
    reduced matmul precisions of a hand-derived update (`rlspeed.fused.precision.matmul_candidates`), else those of
    `accelerate_step` for the model's optimizers (every one `_optimizers` names, not only `model.optimizer`) and their
    parameters (`rlspeed.accel.step.step_candidates`: an optimizer a CUDA graph cannot capture keeps the compiled
    candidates, parameters other than float32 no reduced precision). Empty where the device offers that update none
    (an x86 CPU without AMX, for the hand-derived one) or the model has no optimizer: auto can only keep fp32 there.
    `update`: `model.update_summary()`, where the caller has it already."""
    from rlspeed.accel.inputs import floating_dtype
    from rlspeed.accel.step import step_candidates
    from rlspeed.accel.strategy import normalise_request
    from rlspeed.algos.update import HAND_DERIVED
    from rlspeed.fused.precision import matmul_candidates

    if (update or model.update_summary())["implementation"] == HAND_DERIVED:
        return [precision for precision in matmul_candidates(model.device) if precision != "fp32"]
    optimizers = list(model._optimizers().values())
    if not optimizers:
        return []
    params = [p for optimizer in optimizers for group in optimizer.param_groups for p in group["params"]
              if p.requires_grad]
    strategies, _, _ = step_candidates(normalise_request(), model.device, optimizers, floating_dtype(params))
    return [strategy.label for strategy in strategies if not strategy.is_plain]


def needs_auto_candidates(result: Profile) -> bool:
    """Whether `advise` names what `--accelerate auto` would time (`Profile.auto_candidates`): for a run without
    acceleration whose gradient steps take most of the time with a network large enough for precision to matter."""
    return (result.share("update") >= UPDATE_SHARE and result.parameters >= SMALL_NETWORK
            and not result.accelerate)


def update_lever(config) -> str:
    """What lowers the gradient steps per env step under `config`, in words for `advise`: fewer epochs where each
    epoch is already one minibatch (larger minibatches cannot help then), fewer and larger minibatches where there
    are several, fewer gradient steps per env step off-policy, longer rollouts for A2C (one step per rollout)."""
    if hasattr(config, "gradient_steps"):  # (off-policy)
        per = (f"{config.gradient_steps} per iteration" if config.gradient_steps >= 1
               else "one per env step collected")
        return f"fewer gradient steps per env step (gradient_steps, now {per}; train_freq {config.train_freq})"
    if not hasattr(config, "n_epochs"):  # (A2C: one gradient step per rollout)
        return f"longer rollouts (num_steps, now {config.num_steps}: one gradient step each)"
    rollout = config.num_envs * config.num_steps
    minibatches = rollout // max(min(config.batch_size, rollout), 1)  # (PPO drops a partial last one)
    if minibatches == 1:
        return (f"fewer epochs (n_epochs, now {config.n_epochs}; each epoch is already one minibatch of the "
                f"{rollout:,}-step rollout)")
    return (f"fewer, larger minibatches (batch_size, now {config.batch_size}: {minibatches} per epoch) or fewer "
            f"epochs (n_epochs, now {config.n_epochs})")


def _cpu_seconds() -> float | None:
    """CPU seconds this process and its live multiprocessing children (gymnasium-async's env workers) have used;
    None where a child's time cannot be read (no /proc: not Linux)."""
    total = time.process_time()
    for child in multiprocessing.active_children():
        try:  # (fields 14 and 15 after the command's closing parenthesis: utime and stime in clock ticks)
            fields = Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return None
    return total


def cores_busy(run: Callable[[], None]) -> float | None:
    """Call `run`; the cores it kept busy on average (`_cpu_seconds` over the wall time), None where unreadable.
    Children that start or end within `run` count from where they are seen, so a run that starts its env
    workers counts less than it used."""
    cpu, started = _cpu_seconds(), time.perf_counter()
    run()
    cpu_after, wall = _cpu_seconds(), time.perf_counter() - started
    if cpu is None or cpu_after is None or wall <= 0:
        return None
    return max(cpu_after - cpu, 0.0) / wall


def _device_us(op) -> float:
    return float(getattr(op, "self_device_time_total", 0.0))


def advise(result: Profile) -> list[str]:
    """Suggestions from a profile's shares and settings, each stating the measurement it comes from."""
    advice = []
    device_type = result.device.split(":")[0]
    env_share, update_share, act_share = result.share("env"), result.share("update"), result.share("act")
    waiting = result.cores_busy is not None and result.cores_busy < WAITING_CORES
    if env_share >= ENV_SHARE:
        # the native env where `--env-backend auto` would pick it (not for few envs on a CPU: Gymnasium wins there)
        native_faster = resolve_backend(result.env_id, "auto", result.num_envs, result.device) == "torch"
        if result.env_backend.startswith("gymnasium") and native_faster:
            advice.append(f"env.step takes {env_share:.0%} of the time and this env has a device-native version: "
                          "--env-backend torch steps all envs with a few tensor operations.")
        elif waiting and result.env_backend.startswith("gymnasium"):
            # (envs that wait overlap in subprocesses whatever the number of cores)
            advice.append(f"env.step takes {env_share:.0%} of the time and the run kept {result.cores_busy:.2f} "
                          "cores busy: the env mostly waits (a sleep, a socket, a simulator in another process), and "
                          + ("more envs in subprocesses of their own wait side by side: --env-backend gymnasium-async "
                             "with --num-envs 8 or more; compare the two runs' steps/s."
                             if result.env_backend == "gymnasium" else
                             "its subprocesses wait side by side: more of them (--num-envs) raise the steps/s."))
        elif result.env_backend == "gymnasium-async" and (result.host_ms("env") < SLOW_ENV_MS
                                                          or usable_cores() < ASYNC_MIN_CORES):
            # (the subprocesses' pipes cost more than a fast env's step, and few cores run them in turn)
            advice.append(f"env.step takes {env_share:.0%} of the time ({result.host_ms('env'):.0f} us per env "
                          f"step) with one subprocess per env on {usable_cores()} cores: --env-backend gymnasium "
                          "steps the envs in this process without the pipes; compare the two runs' steps/s.")
        elif (result.env_backend == "gymnasium" and result.host_ms("env") >= SLOW_ENV_MS
              and usable_cores() >= ASYNC_MIN_CORES):
            more = "" if result.num_envs >= 4 else " with --num-envs 4 or more"
            advice.append(f"env.step takes {env_share:.0%} of the time ({result.host_ms('env'):.0f} us per env "
                          f"step): --env-backend gymnasium-async{more} steps each env in a subprocess of its own, "
                          f"which can pay off for envs this slow on {usable_cores()} cores; compare the two runs' "
                          "steps/s.")
        elif result.env_backend == "gymnasium" and result.host_ms("env") >= SLOW_ENV_MS:
            # (the env's own computation: in one process each env more costs as much again)
            advice.append(f"env.step takes {env_share:.0%} of the time ({result.host_ms('env'):.0f} us per env "
                          "step), the env's own computation: more envs in this process step one after another, "
                          f"and subprocess envs (--env-backend gymnasium-async) pay off from {ASYNC_MIN_CORES} cores "
                          f"({usable_cores()} here); a cheaper setting of the env itself is what speeds this run.")
        else:
            advice.append(f"env.step takes {env_share:.0%} of the time: more envs per step (--num-envs) spread "
                          "its fixed cost over more transitions.")
    if update_share >= UPDATE_SHARE:
        if result.parameters < SMALL_NETWORK:
            advice.append(f"gradient steps take {update_share:.0%} of the time, and with {result.parameters:,} "
                          "parameters they are bound by per-operation overhead, not arithmetic: reduced precision "
                          "seldom helps there (--accelerate auto measures it and keeps fp32 eager when nothing is "
                          f"faster); {result.update_lever} do, at the price of other learning dynamics.")
        elif result.accelerate:
            advice.append(f"gradient steps take {update_share:.0%} of the time with the acceleration layer's choice "
                          f"({_describe(result.accelerate)}): what is left is the update's own arithmetic; fewer "
                          "gradient steps per env step or a smaller network would change it, and the learning too.")
        elif result.auto_candidates is None:  # (`needs_auto_candidates`)
            raise ValueError("advise needs the profile's auto_candidates for an update-bound run without "
                             "acceleration (profile_run looks them up for such a run)")
        elif not result.auto_candidates:
            why = " (bf16 matrix products need AMX on an x86 CPU)" if device_type == "cpu" else ""
            advice.append(f"gradient steps take {update_share:.0%} of the time, in fp32: --accelerate auto has no "
                          f"faster precision to try for this update on {result.device}{why}, so "
                          f"{result.update_lever} or a smaller network would speed it, at the price of other "
                          "learning dynamics.")
        else:
            advice.append(f"gradient steps take {update_share:.0%} of the time: try --accelerate auto (it times "
                          f"{', '.join(result.auto_candidates)} against fp32 eager for the update on this device "
                          "and keeps fp32 eager where nothing is faster).")
        from rlspeed.activations import HAND_DERIVED_ACTIVATIONS
        from rlspeed.algos.update import AUTOGRAD

        if (result.update.get("implementation") == AUTOGRAD and result.activation is not None
                and result.activation not in HAND_DERIVED_ACTIVATIONS):
            advice[-1] += f" They run by autograd, not the hand-derived update: {result.update.get('reason')}."
    if device_type != "cpu" and result.parameters < SMALL_NETWORK and result.num_envs < SMALL_NETWORK_ENVS:
        advice.append(f"a small network ({result.parameters:,} parameters) with {result.num_envs} envs on "
                      f"{result.device}: every step is a chain of tiny kernels, so launch latency rather than "
                      "arithmetic sets the speed. Compare with --device cpu, or raise --num-envs.")
    if act_share >= ACT_SHARE:
        advice.append(f"choosing actions takes {act_share:.0%} of the time (one forward pass per env step): more "
                      "envs per step (--num-envs) amortise it.")
    if result.host_syncs is not None and result.host_syncs > SYNCS_PER_1K:
        advice.append(f"{result.host_syncs:,.0f} host syncs per 1k steps (`.item()`, `float(tensor)`, copies to "
                      "the host): each waits for the device's queue to drain.")
    if not advice:
        advice.append("no phase stands out; the top operations above are where the time goes.")
    return advice
