"""Data-parallel training on torch.distributed, launched by torchrun: one strategy object owns it all.

`DistributedStrategy()` reads torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, ...), starts the
process group (nccl on CUDA, hccl on NPU, gloo on CPU), gives each local rank its own device, offsets seeds per
rank, splits envs across ranks, broadcasts initial parameters, all-reduces gradients as one flat buffer and the
running normalisation statistics, aggregates metrics, and lets only rank 0 write. In a single process it is a
no-op and the algorithms run exactly the same code path.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import os
import sys
import time
from collections.abc import Iterable, Iterator

import torch
import torch.distributed as dist

from rlspeed.device import device_count, resolve_device
from rlspeed.errors import PeerEnded, UserError, in_words, warn_at_caller
from rlspeed.lifetime import SAID_FOLDER_VARIABLE, peers_said, tell_launcher

BACKEND_FOR_DEVICE = {"cuda": "nccl", "npu": "hccl", "cpu": "gloo", "xpu": "xccl"}
#: what a broken collective's error says where a peer process ended or stopped answering (gloo, NCCL, the store)
_PEER_GONE = ("closed by peer", "reset by peer", "broken pipe", "connection refused", "timed out",
              "communicator was aborted")
#: what the backend's error says where a peer that was connected ended (`_PEER_GONE` also holds the errors of a peer
#: never reached, which a wrong address gives too)
_PEER_ENDED = ("closed by peer", "reset by peer", "broken pipe")


class DistributedStrategy:
    """How a run is spread over processes. Single process (no WORLD_SIZE in the environment): a no-op.

    `backend`: torch.distributed's backend ("auto": nccl on CUDA, hccl on NPU, xccl on XPU, else gloo); `device`:
    as `resolve_device` takes it, each process taking the accelerator of its LOCAL_RANK where "auto" or a bare type
    is given; `timeout_s`: the process group's `timeout` in seconds (how long its collectives wait for the other
    processes).
    """

    def __init__(self, backend: str = "auto", device: str = "auto", timeout_s: float = 300.0):
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.device = self._device_for_rank(device)
        self.backend = None
        if self.world_size > 1:
            if not dist.is_available():
                raise UserError("This torch build has no torch.distributed; install a build with it.")
            self.backend = BACKEND_FOR_DEVICE.get(self.device.type, "gloo") if backend == "auto" else backend
            if not dist.is_initialized():
                kwargs = {"device_id": self.device} if self.device.type in ("cuda", "npu") else {}
                timeout = datetime.timedelta(seconds=timeout_s)
                store = _restart_scoped_store(timeout)
                if store is not None:
                    kwargs.update(store=store, rank=self.rank, world_size=self.world_size)
                # (a peer that ended while the group forms: one line, not gloo's; an address nobody answers at, a
                # launch without torchrun's rendezvous, keeps its own error)
                with self._peers_answer(_PEER_ENDED):
                    dist.init_process_group(self.backend, timeout=timeout, **kwargs)

    @property
    def enabled(self) -> bool:
        """True when more than one process takes part."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the only process that logs, evaluates for the target, and writes files."""
        return self.rank == 0

    def _device_for_rank(self, device: str) -> torch.device:
        chosen = resolve_device(device)
        if self.world_size > 1 and chosen.type not in ("cpu", "mps"):
            index = self.local_rank if device in ("auto", chosen.type) else chosen.index or 0
            available = device_count(chosen.type)
            if index >= available:
                raise UserError(f"Process {self.local_rank} of {self.world_size} on this machine wants {chosen.type}:"
                                f"{index}, but {available} {chosen.type} device(s) are visible: one process per "
                                f"device. Start at most {available} (--nproc), or use --device cpu (gloo).")
            chosen = resolve_device(f"{chosen.type}:{index}")
            getattr(torch, chosen.type).set_device(chosen)
        return chosen

    def seed_for_rank(self, seed: int | None) -> int | None:
        """Each rank draws different env and action randomness: seed + 10_007 * rank."""
        return None if seed is None else seed + 10_007 * self.rank

    def split_envs(self, num_envs: int) -> int:
        """This rank's share of `num_envs` (an equal share: ranks must run identical update schedules); UserError where
        it does not split (`refuse_uneven_num_envs`)."""
        refuse_uneven_num_envs(num_envs, self.world_size)
        return num_envs // self.world_size

    def broadcast_module(self, module: torch.nn.Module) -> None:
        """Make every rank start from rank 0's parameters and buffers."""
        if not self.enabled:
            return
        with self._peers_answer():
            for tensor in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(tensor.data, src=0)

    def all_reduce_gradients(self, params: Iterable[torch.Tensor]) -> None:
        """Average gradients over ranks in one collective on one flat buffer (call after backward)."""
        if not self.enabled:
            return
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        with self._peers_answer():
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat /= self.world_size
        torch._foreach_copy_(grads, [chunk.view_as(g) for chunk, g in
                                     zip(flat.split([g.numel() for g in grads]), grads)])

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum a tensor over ranks (in place; returned for convenience). No-op in a single process."""
        if self.enabled:
            with self._peers_answer():
                dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def broadcast_flag(self, flag: bool) -> bool:
        """Rank 0's decision (e.g. 'target reached, stop'), known to every rank."""
        if not self.enabled:
            return flag
        tensor = torch.tensor([1.0 if flag else 0.0], device=self.device)
        with self._peers_answer():
            dist.broadcast(tensor, src=0)
            return bool(tensor.item())  # ok-sync: once per log interval

    def broadcast_text(self, text: str | None) -> str | None:
        """Rank 0's `text` (None for none; e.g. why it refused the run), known to every rank (the others' argument is
        unused). The text goes as UTF-8 bytes in tensors, never pickled (a file name's undecodable bytes as they are:
        surrogate escapes)."""
        if not self.enabled:
            return text
        sent = text.encode("utf-8", "surrogateescape") if text is not None and self.is_main else b""
        data = torch.tensor(list(sent), dtype=torch.uint8)
        length = torch.tensor([-1 if self.is_main and text is None else data.numel()], device=self.device)
        with self._peers_answer():
            dist.broadcast(length, src=0)
            size = int(length.item())  # ok-sync: once per decision, before training
            if size < 0:
                return None
            buffer = data.to(self.device) if self.is_main else torch.empty(size, dtype=torch.uint8, device=self.device)
            if size:
                dist.broadcast(buffer, src=0)
        return bytes(buffer.cpu().tolist()).decode("utf-8", "surrogateescape")

    def max_over_ranks(self, value: int) -> int:
        """The largest of the ranks' `value`s (e.g. 'a signal came: stop'), known to every rank."""
        if not self.enabled:
            return value
        tensor = torch.tensor([float(value)], device=self.device)
        with self._peers_answer():
            dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
            return int(tensor.item())  # ok-sync: once per iteration, with callbacks

    def barrier(self) -> None:
        """Wait until every rank reaches this point (no-op in a single process)."""
        if self.enabled:
            with self._peers_answer():
                dist.barrier()

    def shutdown(self, wait: bool = True) -> None:
        """Leave the process group cleanly: by default after every rank has reached this point (`barrier`), since a
        rank tearing its group down while a peer still works was seen to abort ("terminate called without an active
        exception", about one run in 25 of a two-rank gloo job). `wait=False` skips the barrier (after an error, when
        a peer may never arrive)."""
        if self.enabled and dist.is_initialized():
            if wait:
                with self._peers_answer():
                    dist.barrier()
            dist.destroy_process_group()

    def leave(self, code: int = 0) -> int:
        """The end of a worker whose work is done and written: `shutdown`, then, under torchrun, exit at once with
        `code` (without the interpreter's teardown, where a gloo rank was seen to abort now and then after
        `destroy_process_group`: about one run in 10-25 of the two-rank tests, reported by torchrun as a failure).
        The exit handlers run first, as at a normal exit (the libraries' temporary directories, W&B's among them, are
        removed by them: each --nproc --track run left two in the temp directory). In a single process it only
        returns `code`. Every rank leaves with rank 0's `code`, the run's (its line said by rank 0: a stop that came
        as rank 0 evaluated ends every rank with the stop's code, not rank 0 alone), agreed in place of the barrier."""
        if self.enabled and dist.is_initialized():
            agreed = torch.tensor([float(code) if self.is_main else 0.0], device=self.device)
            with self._peers_answer():
                dist.all_reduce(agreed, op=dist.ReduceOp.SUM)  # (every rank here, as `shutdown`'s barrier)
            code = int(agreed.item())
        self.shutdown(wait=False)
        if self.enabled:
            tell_launcher(code)
            # (it reports a handler's error itself and goes on with the others; Python 3.10 re-raises the last one,
            # a SIGTERM's SystemExit included: the worker still leaves here, with its code)
            with contextlib.suppress(BaseException):
                atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        return code

    @contextlib.contextmanager
    def _peers_answer(self, gone: tuple[str, ...] = _PEER_GONE) -> Iterator[None]:
        """Within the block, a collective that fails because another process of the run ended or stopped answering
        (its error says one of `gone`) raises `PeerEnded`, one line naming that process where it said why
        (`peers_said`), instead of the backend's traceback under that process's own error."""
        try:
            yield
        except RuntimeError as error:
            if isinstance(error, PeerEnded) or not any(said in str(error).lower() for said in gone):
                raise
            said = _said_by_peers(self.rank)
            here = f"Process {self.rank} of {self.world_size}"
            if said:
                rank = min(said)
                raise PeerEnded(f"{here} stopped: process {rank} ended with exit code {said[rank]} (its message is "
                                "above).") from error
            raise PeerEnded(f"{here} stopped: another process of the run ended or stopped answering (its message, "
                            "if it left one, is above; --debug shows where this one stopped).") from error


def refuse_uneven_num_envs(num_envs: int, processes: int, what: str = "the number of processes",
                           flag: str | None = None) -> None:
    """The rule that `num_envs` (the total over the processes) splits over `processes` (named as `what`: "--nproc"),
    each stepping as many envs: UserError where it does not, naming the nearest num_envs that does as `flag` gives it
    ("--set num_envs="; by default `num_envs=` in Python, `--num-envs ` on the command line). The command line asks it
    before the settings' other rules (batch_size's advice follows from num_envs), a model as it splits its envs."""
    if processes > 1 and num_envs % processes:
        flag = flag or in_words("--num-envs ", "num_envs=")
        raise UserError(f"num_envs ({num_envs}) must be a multiple of {what} ({processes}) so that every process steps "
                        f"as many envs: use {flag}{max(num_envs // processes, 1) * processes}.")


#: how long a process whose peer ended waits for that peer's word (`tell_launcher`) before saying it does not know
#: why: the peer's connection can close as its error unwinds (its objects freed), before it has said why
PEER_WORD_WAIT_S = 5.0


def _said_by_peers(rank: int) -> dict[int, int]:
    """`peers_said` of the processes other than `rank`, waiting up to `PEER_WORD_WAIT_S` for one to have said why it
    ended (at once where none can: a process not started by rlspeed's launcher)."""
    deadline = time.monotonic() + PEER_WORD_WAIT_S
    while True:
        said = {other: code for other, code in peers_said().items() if other != rank}
        if said or not os.environ.get(SAID_FOLDER_VARIABLE) or time.monotonic() >= deadline:
            return said
        time.sleep(0.05)


def _restart_scoped_store(timeout: datetime.timedelta) -> dist.Store | None:
    """After a torchrun restart, a view of the agent's store whose keys are private to this attempt.

    torchrun keeps one store across restarts; without a per-attempt prefix a restarted rank can read the
    address a dead rank published in the previous attempt and fail to connect (seen here with gloo).
    """
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    store = _torchrun_job_store(timeout) if restart else None
    return None if store is None else dist.PrefixStore(f"rlspeed/attempt{restart}", store)


def _torchrun_job_store(timeout: datetime.timedelta = datetime.timedelta(seconds=60)) -> dist.Store | None:
    """A client of the store torchrun's agent keeps for this job (MASTER_ADDR:MASTER_PORT), one per torchrun job
    (a new torchrun starts a new one, whatever its --rdzv-id) and the same across the job's restarts; None where the
    workers do not share the agent's store (TORCHELASTIC_USE_AGENT_STORE not True: TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1,
    a rendezvous without it)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                         int(os.environ["WORLD_SIZE"]), is_master=False, timeout=timeout)


_SINGLE = None
_TOLD_ALONE = False  # (`warn_training_alone` has spoken in this process)


def warn_training_alone(what: str, remedy: str) -> None:
    """Where this process is one of several that torchrun started (WORLD_SIZE above 1) and `what` ("PPO without a
    strategy", a population) is about to train in it alone: warn once per process, on rank 0 only, that every
    process trains the same run on its own, and `remedy`. Nothing in a single process."""
    global _TOLD_ALONE
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    if processes <= 1 or _TOLD_ALONE:
        return
    _TOLD_ALONE = True
    if os.environ.get("RANK", "0") == "0":
        warn_at_caller(f"This is one of {processes} processes torchrun started, and {what} trains in each of them on "
                       f"its own (the same run {processes} times): {remedy} (docs/distributed.md).", UserWarning)


def single_process() -> DistributedStrategy:
    """The shared no-op strategy used when an algorithm is not given one."""
    global _SINGLE
    if _SINGLE is None:
        _SINGLE = DistributedStrategy.__new__(DistributedStrategy)
        _SINGLE.world_size, _SINGLE.rank, _SINGLE.local_rank = 1, 0, 0
        _SINGLE.device, _SINGLE.backend = torch.device("cpu"), None
    return _SINGLE
