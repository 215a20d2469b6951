"""What an acceleration strategy is, which ones a device can run, and how a request becomes a list of candidates.

A `Strategy` is a point in (precision, compile backend, graph capture). `candidates(...)` turns a
request (`precision="auto"`, `compile="auto"`, ... or the `RLSPEED_ACCELERATE` environment variable) into the
strategies worth measuring on a device. Nothing here measures anything: see `search.py`.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import platform
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from rlspeed.device import autocast_device_type, rules
from rlspeed.errors import UserError

ENV_VAR = "RLSPEED_ACCELERATE"
# fp32: plain. bf16-matmul (CPU) / tf32 (CUDA): every tensor stays fp32, only matrix multiplications and
# convolutions compute internally in bf16 (oneDNN, AMX/AVX512-BF16) or TF32 (tensor cores), via PyTorch's
# fp32_precision setting; elementwise maths (log-probs, tanh squashing, losses) keep full precision.
# bf16 / fp16: torch.autocast (fp16 with a GradScaler).
PRECISIONS = ("fp32", "bf16-matmul", "tf32", "bf16", "fp16")
_PRECISION_ALIASES = {"fp32": "fp32", "float32": "fp32", "float": "fp32", "bf16": "bf16", "bfloat16": "bf16",
                      "fp16": "fp16", "float16": "fp16", "half": "fp16", "bf16-matmul": "bf16-matmul",
                      "bf16_matmul": "bf16-matmul", "tf32": "tf32"}
AUTOCAST_DTYPES = {"fp32": None, "bf16-matmul": None, "tf32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
# the fp32_precision value each reduced-matmul precision sets, per device type
_MATMUL_PRECISION = {("cpu", "bf16-matmul"): "bf16", ("cuda", "tf32"): "tf32"}
# Devices where compile="auto" puts torch.compile candidates into the search: on CPUs inductor's compile time (seconds
# to minutes per function) is rarely earned back by RL-sized steps, so there it is asked for with compile=True
# (benchmarks/accel_update_step.py measures both). MPS has no supported backend.
COMPILE_IN_AUTO = ("cuda", "npu")


@dataclass(frozen=True)
class Strategy:
    """One way to run a model or an update step.

    precision: ``fp32`` (plain); ``bf16-matmul`` (CPU) / ``tf32`` (CUDA): fp32 tensors, matmuls computed in bf16 /
        TF32; ``bf16`` (autocast, fp32 master weights); ``fp16`` (autocast and a GradScaler).
    compile: ``off`` or a torch.compile backend name (``inductor``, ``torchair``, ``eager``, ...).
    graphs: CUDA graph capture. Compiled: inductor's cudagraph trees for the compiled function (one graph per
        input shape). Eager, for an update step: the whole step (forward, backward, optimizer step) captured and
        replayed as one graph (`rlspeed.accel.graphs`).
    """

    precision: str = "fp32"
    compile: str = "off"
    graphs: bool = False

    @property
    def label(self) -> str:
        parts = [self.precision]
        if self.compile != "off":
            parts.append(f"compile:{self.compile}")
        if self.graphs:
            parts.append("graphs")
        return "+".join(parts)

    @property
    def is_plain(self) -> bool:
        """True for eager fp32: the strategy that changes nothing."""
        return self.precision == "fp32" and self.compile == "off" and not self.graphs

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return AUTOCAST_DTYPES[self.precision]

    def to_dict(self) -> dict[str, Any]:
        """The four fields as a JSON-ready dict; `from_dict` reads it back (decision cache, reports)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Strategy:
        return cls(precision=str(data["precision"]), compile=str(data["compile"]), graphs=bool(data["graphs"]))


EAGER_FP32 = Strategy()


@dataclass(frozen=True)
class Request:
    """What the caller asked for, after normalisation: each field is ``"auto"`` or a fixed choice."""

    precision: str = "auto"  # auto | fp32 | bf16 | fp16
    compile: str = "auto"  # auto | off | on | <backend name>
    graphs: str = "auto"  # auto | off | on
    forced_by_env: str | None = None  # the RLSPEED_ACCELERATE value that forced this request, if any
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        """The request as a JSON-ready dict (`env`: the forcing `RLSPEED_ACCELERATE` value or None; notes left out).

        It is the report's `requested` and part of the decision-cache key.
        """
        return {"precision": self.precision, "compile": self.compile, "graphs": self.graphs,
                "env": self.forced_by_env}


def normalise_request(precision: str | torch.dtype = "auto", compile: bool | str = "auto",
                      graphs: bool | str = "auto") -> Request:
    """Check and normalise the user's arguments, then apply ``RLSPEED_ACCELERATE`` on top (it wins)."""
    request = Request(_norm_precision(precision), _norm_compile(compile), _norm_switch(graphs, "graphs"))
    forced = os.environ.get(ENV_VAR, "").strip().lower()
    if forced and forced != "auto":
        request = _apply_env(forced)
    return request


def _norm_precision(value: str | torch.dtype) -> str:
    if isinstance(value, torch.dtype):
        value = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(value, str(value))
    text = str(value).strip().lower()
    if text == "auto":
        return "auto"
    if text not in _PRECISION_ALIASES:
        raise UserError(f"Unknown precision '{value}': use auto, fp32, bf16-matmul (CPU), tf32 (CUDA), bf16 or "
                        "fp16.")
    return _PRECISION_ALIASES[text]


def _norm_compile(value: bool | str) -> str:
    if value is True:
        return "on"
    if value is False or value is None:
        return "off"
    text = str(value).strip().lower()
    if text in ("auto", "off", "on"):
        return text
    if text in ("true", "yes", "1"):
        return "on"
    if text in ("false", "no", "0", "none"):
        return "off"
    return _check_backend(str(value).strip())  # a backend name


def _check_backend(name: str) -> str:
    """`name` if torch.compile knows a backend of that name (`torch._dynamo.list_backends`), else UserError naming
    the close ones."""
    import difflib

    import torch._dynamo

    known = [*torch._dynamo.list_backends(exclude_tags=()), "torchair"]  # (torchair: Ascend's, `accel.compile`)
    if name in known:
        return name
    known = [backend for backend in known if "TESTING" not in backend and "minifier" not in backend]
    close = difflib.get_close_matches(name, known, n=2)
    raise UserError(f"compile={name!r} is not a torch.compile backend" + (f"; did you mean {' or '.join(close)}?"
                    if close else f" (known: {', '.join(known)}); or pass True, False or 'auto'."))


def _norm_switch(value: bool | str, name: str) -> str:
    if value is True:
        return "on"
    if value is False or value is None:
        return "off"
    text = str(value).strip().lower()
    mapping = {"auto": "auto", "on": "on", "true": "on", "1": "on", "off": "off", "false": "off", "0": "off"}
    if text not in mapping:
        raise UserError(f"Unknown {name} setting '{value}': use auto, True or False.")
    return mapping[text]


def _apply_env(value: str) -> Request:
    """``RLSPEED_ACCELERATE``: ``off``/``eager``/``fp32``, ``bf16-matmul``, ``tf32``, ``bf16``, ``fp16``, ``compile``
    (or ``compile:<backend>``), ``graphs``, or a ``+``-joined combination such as ``bf16+compile``. Each forces
    exactly that strategy (no search)."""
    precision, compile_, graphs = "fp32", "off", "off"
    for token in value.replace(",", "+").split("+"):
        token = token.strip()
        if token in ("off", "eager", "none", ""):
            continue
        if token in _PRECISION_ALIASES:
            precision = _PRECISION_ALIASES[token]
        elif token in ("compile", "inductor"):
            compile_ = "on"
        elif token.startswith("compile:"):
            compile_ = token.split(":", 1)[1]
        elif token in ("graphs", "cudagraphs"):
            compile_, graphs = (compile_ if compile_ != "off" else "on"), "on"
        else:
            raise UserError(f"{ENV_VAR}='{value}' is not understood: use off, fp32, bf16-matmul, tf32, bf16, fp16, "
                            "compile, graphs, auto or a combination such as bf16+compile.")
    return Request(precision, compile_, graphs, forced_by_env=value)


def _names_compile(value: str) -> bool:
    """Whether an ``RLSPEED_ACCELERATE`` value names torch.compile itself (``compile``, ``compile:<backend>``,
    ``inductor``), not only through ``graphs``, which implies it."""
    tokens = [token.strip() for token in value.replace(",", "+").split("+")]
    return any(token in ("compile", "inductor") or token.startswith("compile:") for token in tokens)


# --- what a device can run ------------------------------------------------------------------------------------
def _x86_cpu_flags() -> set[str] | None:
    """The CPU's feature flags from /proc/cpuinfo (Linux), or None where they cannot be read."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        pass
    return None


@functools.cache
def _cpu_native_bf16() -> bool:
    """Whether this CPU computes bf16 in hardware. oneDNN's own check also accepts x86 CPUs with AVX-512 but no
    AVX512_BF16 or AMX: there bf16 is emulated (slower than fp32) and its bf16 matmul mode computes in fp32, so on x86
    the CPU's flags decide where they can be read."""
    if not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()):
        return False
    if platform.machine().lower() in ("x86_64", "amd64", "i386", "i686"):
        flags = _x86_cpu_flags()
        if flags is not None:
            return bool(flags & {"avx512_bf16", "amx_bf16"})
    return True


def _cpu_bf16_matmul_mode() -> bool:
    """Whether oneDNN's bf16 math mode for fp32 matmuls (`fp32_precision = "bf16"`) computes in bf16 on this CPU: on
    x86 only with AMX, where the CPU's flags can be read (with AVX512_BF16 alone it runs its fp32 kernels: the same
    results, so there is nothing to gain, and a search of it would time fp32 twice)."""
    if platform.machine().lower() in ("x86_64", "amd64", "i386", "i686"):
        flags = _x86_cpu_flags()
        if flags is not None:
            return "amx_bf16" in flags
    return True


def bf16_supported(device: torch.device) -> bool:
    """Whether bf16 autocast has native kernels here (emulated bf16 is never faster, so it is not tried)."""
    try:
        if device.type == "cpu":
            return _cpu_native_bf16()
        if device.type == "cuda":
            return bool(torch.cuda.is_bf16_supported())
        module = getattr(torch, device.type, None)
        if module is not None and hasattr(module, "is_bf16_supported"):
            return bool(module.is_bf16_supported())
        return device.type in ("npu", "mps")
    except Exception:
        return False


def compile_backend(device: torch.device, name: str = "on") -> str | None:
    """The torch.compile backend to use on a device (``on`` means the device's default), or None when none works.

    inductor on CPU, CUDA and XPU; torchair's NPU backend on Ascend when torchair is installed; none on MPS.
    Any other registered dynamo backend name (``eager``, ``aot_eager``, ...) is passed through as asked.
    """
    if not rules(device).supports_compile:
        return None
    if name not in ("on", "auto"):
        return name
    if device.type == "npu":
        return "torchair" if importlib.util.find_spec("torchair") is not None else None
    if device.type in ("cpu", "cuda", "xpu"):
        return "inductor"
    return None


def reduced_matmul_supported(device: torch.device, precision: str) -> bool:
    """Whether a reduced-internal-precision fp32 matmul mode (``bf16-matmul``, ``tf32``) exists on the device (and
    in this torch: the ``fp32_precision`` settings it is set through came with torch 2.9)."""
    if (device.type, precision) not in _MATMUL_PRECISION or not _matmul_precision_backends(device):
        return False
    if device.type == "cpu":
        return bf16_supported(device) and _cpu_bf16_matmul_mode()
    try:
        return bool(torch.cuda.get_device_capability(device)[0] >= 8)  # TF32 tensor cores: Ampere and later
    except Exception:
        return False


def _matmul_precision_backends(device: torch.device) -> list[Any]:
    """The torch backends whose ``fp32_precision`` a reduced matmul precision sets on the device (none in a torch
    without that setting)."""
    if device.type == "cpu":
        backends = [getattr(torch.backends.mkldnn, "matmul", None), getattr(torch.backends.mkldnn, "conv", None)]
    elif device.type == "cuda":
        backends = [torch.backends.cuda.matmul, getattr(torch.backends.cudnn, "conv", None)]
    else:
        return []
    backends = [b for b in backends if b is not None]
    return backends if all(hasattr(b, "fp32_precision") for b in backends) else []


#: MatmulPrecision blocks open in the process (any thread), and the settings before the first of them opened
_OPEN_PRECISIONS = {"count": 0, "saved": {}}
_OPEN_PRECISIONS_LOCK = threading.Lock()


class MatmulPrecision(contextlib.ContextDecorator):
    """fp32 matmuls/convolutions computed internally in bf16 or TF32 inside the block. The setting is process-wide,
    so it is held only while accelerated code runs, and the settings from before the first block that opened are
    restored when the last one closes: blocks that overlap in several threads (two accelerated models called at
    once) cannot leave a reduced precision on for the process, as each restoring what it found would."""

    def __init__(self, device: torch.device, precision: str):
        self.value = _MATMUL_PRECISION[(device.type, precision)]
        self.backends = _matmul_precision_backends(device)

    def __enter__(self) -> MatmulPrecision:
        with _OPEN_PRECISIONS_LOCK:
            if _OPEN_PRECISIONS["count"] == 0:
                _OPEN_PRECISIONS["saved"] = {}
            _OPEN_PRECISIONS["count"] += 1
            saved = _OPEN_PRECISIONS["saved"]
            for backend in self.backends:
                saved.setdefault(id(backend), (backend, backend.fp32_precision))
                backend.fp32_precision = self.value
        return self

    def __exit__(self, *exc: object) -> None:
        with _OPEN_PRECISIONS_LOCK:
            _OPEN_PRECISIONS["count"] -= 1
            if _OPEN_PRECISIONS["count"] == 0:
                for backend, value in _OPEN_PRECISIONS["saved"].values():
                    backend.fp32_precision = value
                _OPEN_PRECISIONS["saved"] = {}


def precision_context(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """The region a precision runs in: autocast (bf16/fp16), a matmul-precision setting (bf16-matmul/tf32), or
    nothing (fp32)."""
    dtype = AUTOCAST_DTYPES[precision]
    if dtype is not None:
        return torch.autocast(autocast_device_type(device), dtype=dtype)
    if (device.type, precision) in _MATMUL_PRECISION:
        return MatmulPrecision(device, precision)
    return contextlib.nullcontext()


def backward_precision(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """The region a backward pass runs in: the matmul-precision setting for bf16-matmul/tf32 (their backward
    matmuls are the other two thirds of the work), nothing otherwise (autocast must not wrap backward)."""
    if (device.type, precision) in _MATMUL_PRECISION:
        return MatmulPrecision(device, precision)
    return contextlib.nullcontext()


def uses_matmul_precision(device: torch.device, precision: str) -> bool:
    """Whether `precision` runs on this device as a matmul-precision setting (bf16-matmul on CPU, tf32 on CUDA).

    Such a precision must also be switched on for the backward pass (`backward_precision`, `BackwardPrecisionHook`).
    """
    return (device.type, precision) in _MATMUL_PRECISION


class BackwardPrecisionHook:
    """Holds a matmul-precision setting for the backward passes that flow into an accelerated module's outputs.

    A module does not own the backward pass (the user calls ``loss.backward()``), so the setting is switched on by a
    gradient hook on the outputs (the first thing backward reaches) and switched off by an engine callback queued
    at that moment, which runs when that backward pass ends. A backward pass that raises runs no callback: the
    setting it left on is switched off by the next backward pass that reaches the hook (another graph task) or the
    module's next call outside backward (`settle`), so that it does not stay on for the process.
    """

    def __init__(self, device: torch.device, precision: str):
        self.context = MatmulPrecision(device, precision)
        self.active = False
        self.task: int | None = None  # (the backward pass, autograd's graph task, that switched it on)

    def __call__(self, grad: torch.Tensor) -> None:
        task = _graph_task()
        if self.active and task != self.task:  # (left on by a backward pass that raised, or one nested in it)
            self._finish()
        if not self.active:
            self.active, self.task = True, task
            self.context.__enter__()
            torch.autograd.Variable._execution_engine.queue_callback(self._finish)

    def settle(self) -> None:
        """Outside backward: switch off what a backward pass that raised left on."""
        if self.active and _graph_task() == -1:
            self._finish()

    def _finish(self) -> None:
        if self.active:
            self.active = False
            self.context.__exit__(None, None, None)


def _graph_task() -> int | None:
    """The backward pass running in this thread (autograd's graph task id; -1 outside backward), None where torch does
    not say."""
    current = getattr(torch._C, "_current_graph_task_id", None)
    return current() if current is not None else None


def with_precision(fn: Callable, device: torch.device, precision: str) -> Callable:
    """`fn` run inside the precision's region (`fn` itself for fp32)."""
    if precision == "fp32":
        return fn

    def precision_region(*args, **kwargs):
        with precision_context(device, precision):
            return fn(*args, **kwargs)

    return precision_region


def candidates(request: Request, device: torch.device, *, allow_fp16: bool, whole_step_graphs: bool = False,
               float_dtype: torch.dtype = torch.float32) -> tuple[list[Strategy], list[str]]:
    """The strategies to consider for a request on a device, simplest first, and notes on what was left out.

    The first entry is the one a search falls back to. With ``auto`` fields the list has several entries and is
    searched; with every field fixed (or forced by ``RLSPEED_ACCELERATE``) it has one.

    `whole_step_graphs`: the caller (an update step) captures the whole eager step as a CUDA graph itself
    (`rlspeed.accel.graphs`), so on CUDA graphs do not need torch.compile, and compile="auto" leaves compiled
    candidates out there (their graphs would cover the forward and backward passes only, after tens of seconds of
    compilation per candidate).

    `float_dtype`: the parameters' floating dtype. The reduced precisions change float32 arithmetic only (autocast
    and the fp32 matmul settings leave float64 and half tensors as they are), so `auto` tries them for float32
    parameters only: for others they would time the same kernels as fp32 and could be chosen on noise.
    """
    notes: list[str] = []
    graph_support = rules(device).supports_graphs
    step_graphs = whole_step_graphs and graph_support and device.type == "cuda" and request.graphs in ("auto", "on")
    # precision
    if request.precision == "auto" and float_dtype != torch.float32:
        notes.append(f"reduced precisions not tried: the parameters are {str(float_dtype).removeprefix('torch.')}, "
                     "which autocast and the matmul precision settings (changing float32 arithmetic only) leave as "
                     "they are.")
        precisions = ["fp32"]
    elif request.precision == "auto":
        precisions = ["fp32"]
        for reduced in ("bf16-matmul", "tf32"):
            if reduced_matmul_supported(device, reduced):
                precisions.append(reduced)
        if bf16_supported(device):
            precisions.append("bf16")
        else:
            notes.append(f"bf16 not tried: no native bf16 kernels on {device.type}.")
    elif request.precision == "fp16" and not allow_fp16:
        if request.forced_by_env is None:
            raise UserError("fp16 training needs a GradScaler: use rlspeed.accelerate_step(loss_fn, optimizer, "
                            "precision='fp16'), or precision='bf16' for a module.")
        notes.append("fp16 forced but a module alone has no optimizer for a GradScaler: running it in fp32.")
        precisions = ["fp32"]
    elif request.precision == "bf16" and request.forced_by_env is not None and not bf16_supported(device):
        notes.append(f"bf16 forced but {device.type} has no native bf16 kernels: running in fp32.")
        precisions = ["fp32"]
    elif request.precision in ("bf16-matmul", "tf32") and not reduced_matmul_supported(device, request.precision):
        if request.forced_by_env is None:
            raise UserError(f"precision '{request.precision}' is not available on {device.type}: bf16-matmul needs "
                            "a CPU whose oneDNN computes it in bf16 (AMX on x86), tf32 a CUDA GPU of compute "
                            "capability 8.0 or newer, both torch 2.9 or newer.")
        notes.append(f"{request.precision} forced but not available on {device.type}: running in fp32.")
        precisions = ["fp32"]
    else:
        precisions = [request.precision]

    # compile
    backend = None
    if request.compile == "auto" and step_graphs:
        notes.append("compile candidates not tried: the whole step is captured as a CUDA graph instead; pass "
                     "compile=True to include them (compiled candidates get graphs of their forward and backward).")
        compiles = ["off"]
    elif request.compile == "auto":
        if device.type in COMPILE_IN_AUTO:
            backend = compile_backend(device)
        if backend is None:
            why = ("no supported backend" if compile_backend(device) is None else
                   "compile='auto' tries torch.compile only on " + "/".join(COMPILE_IN_AUTO)
                   + " (inductor takes 10-75 s per function on a CPU); pass compile=True to include it")
            notes.append(f"compile candidates not tried on {device.type}: {why}.")
        compiles = ["off"] + ([backend] if backend else [])
    elif request.compile == "off":
        compiles = ["off"]
    else:
        backend = compile_backend(device, request.compile)
        if backend is None:
            if request.forced_by_env is None:
                raise UserError(f"torch.compile has no working backend on {device.type} here; use compile=False "
                                "(or install torchair on Ascend).")
            notes.append(f"compile forced but {device.type} has no supported backend: running eagerly.")
            compiles = ["off"]
        elif request.forced_by_env is not None:
            compiles = [backend]  # forced: exactly this
        else:
            compiles = ["off", backend]  # asked for: compiled candidates join the search (eager stays the fallback)

    # graphs (for a module, CUDA graph capture rides on inductor's cudagraph trees)
    if request.graphs == "on" and not graph_support:
        if request.forced_by_env is None:
            raise UserError(f"CUDA graph capture is only available on CUDA devices, not {device.type}; "
                            "use graphs='auto' or False.")
        if _names_compile(request.forced_by_env):
            notes.append(f"graphs forced but {device.type} has no graph capture: ignored.")
        else:  # (the torch.compile that graphs ride on was not asked for by itself: not run either)
            notes.append(f"graphs forced but {device.type} has no graph capture: ignored, and the torch.compile "
                         "they ride on with them.")
            compiles = ["off"]
    want_graphs = graph_support and request.graphs in ("auto", "on")
    if want_graphs and request.graphs == "on" and compiles == ["off"] and not step_graphs:
        if request.forced_by_env is None:
            raise UserError("CUDA graph capture here rides on torch.compile: use graphs=True with compile left "
                            "at 'auto' or True.")
        compiles = [compile_backend(device) or "off"]

    strategies = [Strategy(precision) for precision in precisions if "off" in compiles]
    for compile_ in (c for c in compiles if c != "off"):
        graphs = want_graphs and compile_ == "inductor" and device.type == "cuda"
        strategies += [Strategy(precision, compile_, graphs) for precision in precisions]
    return strategies, notes
