"""`rlspeed train --nproc` where torchrun itself is killed with SIGKILL: its workers stop (SIGTERM, which saves them)
and the launcher waits for them before it unlocks the run directory (Linux: `rlspeed.lifetime`)."""

import _signal
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rlspeed.cli import main
from rlspeed.lifetime import STOPS

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="prctl: Linux only (docs/checkpoints.md)")
SRC = str(Path(__file__).resolve().parents[1] / "src")


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def _env(**extra: str) -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]), **extra}


def _wait_for(path: Path, timeout_s: float = 60.0) -> str:
    deadline = time.monotonic() + timeout_s
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return path.read_text() if path.exists() else ""


# a torchrun worker's start: the `rlspeed` command's main, then what its Ctrl-C/SIGTERM handling does once a stop
# signal comes (`_sigterm_raises`), each followed by the parent-death signal then asked for (PR_GET_PDEATHSIG)
_WORKER = """
    import ctypes, os, signal, sys
    from rlspeed.cli import Terminated, _sigterm_raises, main

    def death_signal():
        value = ctypes.c_int()
        ctypes.CDLL(None).prctl(2, ctypes.byref(value), 0, 0, 0)  # (PR_GET_PDEATHSIG)
        return value.value

    sys.argv = ["rlspeed", "--version"]
    try:
        main()
    except SystemExit:
        pass
    armed = death_signal()
    try:
        with _sigterm_raises():
            os.kill(os.getpid(), signal.SIGTERM)
    except Terminated:
        pass
    print(armed, death_signal())
"""


def test_a_torchrun_worker_asks_for_sigterm_when_torchrun_ends_until_it_stops(tmp_path):
    """The `rlspeed` command under torchrun (TORCHELASTIC_RUN_ID) asks the kernel for SIGTERM when its parent
    (torchrun) ends, which stops and saves it as a scheduler's SIGTERM does; a stop signal undoes that, since the
    kernel sends it again for each thread of a dying torchrun and a repeat would cut the save short. Elsewhere nothing
    is asked."""
    worker = subprocess.run(_python(_WORKER), env=_env(TORCHELASTIC_RUN_ID="test"), capture_output=True, text=True,
                            timeout=120)
    assert worker.stdout.split()[-2:] == [str(int(signal.SIGTERM)), "0"], worker.stderr[-2000:]
    plain = subprocess.run(_python(_WORKER), env={key: value for key, value in _env().items()
                                                  if key != "TORCHELASTIC_RUN_ID"},
                           capture_output=True, text=True, timeout=120)
    assert plain.stdout.split()[-2:] == ["0", "0"], plain.stderr[-2000:]


@pytest.mark.parametrize("parent_gone", ["after the request", "before the request"])
def test_a_worker_gets_sigterm_when_its_parent_is_killed(tmp_path, parent_gone):
    """`end_with_parent`: the worker gets SIGTERM once its parent dies of SIGKILL, also where the parent died before
    the worker asked (it names its parent in RLSPEED_TORCHRUN_PID, as `python -m rlspeed._torchrun` does)."""
    told = tmp_path / "told"
    worker = f"""
        import os, signal, sys, time
        from rlspeed.lifetime import end_with_parent

        def say_and_exit(*_):  # (written whole, then renamed: the test never reads a file still being written)
            with open({str(told) + ".part"!r}, "w") as file:
                file.write("SIGTERM")
            os.replace({str(told) + ".part"!r}, {str(told)!r})
            sys.exit(0)

        signal.signal(signal.SIGTERM, say_and_exit)
        open({str(tmp_path / "started")!r}, "w").close()
        while not os.path.exists({str(tmp_path / "go")!r}):
            time.sleep(0.02)
        end_with_parent()
        open({str(tmp_path / "asked")!r}, "w").close()
        time.sleep(60)
    """
    parent = subprocess.Popen(_python(f"""
        import os, subprocess, sys
        os.environ["RLSPEED_TORCHRUN_PID"] = str(os.getpid())
        subprocess.Popen({_python(worker)!r}, start_new_session=True)
        sys.stdin.read()  # (until the test kills it)
    """), env=_env(), stdin=subprocess.PIPE)
    try:
        assert _wait_for(tmp_path / "started") == ""
        if parent_gone == "before the request":
            parent.kill()
            parent.wait()
        (tmp_path / "go").touch()
        if parent_gone == "after the request":
            assert _wait_for(tmp_path / "asked") == ""  # (killed once the worker has asked: no guessed wait)
            parent.kill()
        assert _wait_for(told) == "SIGTERM"
    finally:
        parent.kill()
        parent.wait()


def test_nproc_waits_for_the_workers_a_killed_torchrun_left_and_says_so(tmp_path, monkeypatch, capsys):
    """torchrun killed with SIGKILL (by an out-of-memory killer, a `kill -9`) leaves its workers saving: the launcher
    says so in one line, waits for them (it adopts them) before it unlocks the run directory, and ends with 137, as a
    shell reports a kill. The stand-in torchrun here starts one worker (its command line `... -m rlspeed`, in a session
    of its own, as torchrun's) that writes a file a moment after torchrun's death, and kills itself at once: it is
    dead before the launcher's start of it returns, the earliest a torchrun can die (the launcher adopts orphans from
    before it starts torchrun)."""
    out = tmp_path / "run"
    saves = textwrap.dedent(f"""
        import os, sys, time
        deadline = time.monotonic() + 120
        while os.getppid() == int(sys.argv[1]) and time.monotonic() < deadline:  # (until torchrun is gone)
            time.sleep(0.02)
        time.sleep(0.5)
        open({str(out / 'saved')!r}, 'w').close()
    """)
    fake_torchrun = _python(f"""
        import os, signal, subprocess, sys
        subprocess.Popen([sys.executable, "-c", {saves!r}, str(os.getpid()), "-m", "rlspeed"], start_new_session=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    popen = subprocess.Popen

    def dead_on_return(command, **kwargs):
        if "rlspeed._torchrun" not in command:
            return popen(command, **kwargs)
        started = popen(fake_torchrun, **kwargs)
        started.wait()  # (its worker started: the stand-in's own Popen returned before its kill)
        return started

    monkeypatch.setattr(subprocess, "Popen", dead_on_return)
    code = main(["train", "ppo", "CartPole-v1", "--nproc", "1", "--device", "cpu", "--no-progress", "--out", str(out)])
    stderr = capsys.readouterr().err
    assert code == 137, stderr
    assert "torchrun ended by SIGKILL: waiting up to 30 s for the 1 process(es) it left" in stderr
    assert (out / "saved").exists()  # (waited for before the launcher returned)


def test_a_torchrun_worker_stopped_while_torch_loads_ends_in_one_line_and_tells_the_launcher(tmp_path):
    """A torchrun worker stopped while torch loaded (torchrun's SIGTERM as it ends, or the kernel's as torchrun dies,
    within a worker's first seconds) printed its line, then a traceback: leaving its exit code for the launcher
    imported torch again, which the stop had cut short. It ends in its one line, its code left for the launcher."""
    script = textwrap.dedent("""
        import sys
        from rlspeed.cli import main
        class Interrupt:  # (Ctrl-C the moment torch starts to load, and at each later try)
            def find_spec(self, name, path=None, target=None):
                if name == 'torch':
                    raise KeyboardInterrupt
        sys.meta_path.insert(0, Interrupt())
        sys.argv = ['rlspeed', 'train', 'ppo', 'CartPole-v1', '--out', 'run']
        raise SystemExit(main())
    """)
    said = tmp_path / "said"
    said.mkdir()
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env=_env(TORCHELASTIC_RUN_ID="test", RLSPEED_WORKERS_SAID=str(said), RANK="1"))
    assert done.returncode == 130 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("rlspeed: interrupted (Ctrl-C) while loading torch")
    assert [path.read_text() for path in said.iterdir() if path.is_file()] == ["0 1 130"]  # (`lines`: its claim)


@pytest.mark.parametrize("stops, when", [(1, "while it starts"), (2, "while it starts"), (1, "once it started")])
def test_nproc_passes_a_stop_that_comes_while_torchrun_starts_on_to_it(monkeypatch, tmp_path, capsys, stops, when):
    """A SIGTERM (or Ctrl-C) that came while the launcher started torchrun stopped the launcher ("interrupted") and
    left torchrun and its workers training, the run directory locked by them: it now reaches torchrun once started,
    as a later one does, and the launcher waits for it to stop its workers. Each stop reaches it once: of two that
    came while it started only the first did, and one that came as the launcher went on after torchrun started went
    twice (a second Ctrl-C then became torchrun's third, which makes it give up its workers)."""
    from rlspeed import cli

    sent = []

    class Torchrun:  # (the stops come before its start returns, or as the launcher goes on after it)
        def __init__(self, command, env, start_new_session, pass_fds):
            for _ in range(stops if when == "while it starts" else 0):
                os.kill(os.getpid(), signal.SIGTERM)

        def send_signal(self, signum):
            sent.append(signum)

        def wait(self):
            return -sent[0] if sent else 0

    def stop_once_started(frame, event, arg):  # (at the launcher's first line after `process` holds torchrun)
        if frame.f_code is cli._launch_torchrun.__code__:
            if event == "line" and frame.f_locals.get("process") is not None and not sent:
                sys.settrace(None)
                os.kill(os.getpid(), signal.SIGTERM)
            return stop_once_started
        return None

    monkeypatch.setattr(subprocess, "Popen", Torchrun)
    trace = sys.gettrace()
    if when == "once it started":
        sys.settrace(stop_once_started)
    try:
        code = main(["train", "ppo", "CartPole-v1", "--nproc", "1", "--device", "cpu", "--no-progress", "--out",
                     str(tmp_path / "run")])
    finally:
        sys.settrace(trace)
    stderr = capsys.readouterr().err
    assert sent == [signal.SIGTERM] * stops, stderr
    assert code == 143 and "rlspeed: stopping the process (it saves where it is)" in stderr


@pytest.mark.parametrize("name, when", [("SIGINT", "as it ends"), ("SIGTERM", "as it ends"),
                                        ("SIGTERM", "as it begins"), ("SIGINT", "as the command ends")])
def test_nproc_waits_for_the_workers_whatever_stop_comes_as_torchrun_ends(monkeypatch, tmp_path, capsys, name, when):
    """A Ctrl-C or SIGTERM that came as the launcher left the block that passes stops on to torchrun (torchrun ended),
    before the block in which it waits for the workers a killed torchrun left, raised out of the launcher: it
    unlocked the run directory without waiting for them, ended with 130 or 143 and said that the run was interrupted
    "while starting torchrun, before training began". It waits now, as a stop during that wait does, and ends with the
    stop's code, saying that nothing was cut short (held, it was dropped: exit 0, no word). (A stop that comes as that
    block begins, where the stops wait already, still reaches torchrun; one after the block, as the command ends, said
    "while starting torchrun" too.)"""
    from rlspeed import cli

    adopting, waited, sent = cli.adopting_orphans, [], []
    record_close_error = cli._record_close_error

    def stop_as_the_command_ends(*args):  # (after the launcher's block: as `main` settles an env's close() error)
        signal.raise_signal(getattr(signal, name))
        record_close_error(*args)

    if when == "as the command ends":
        monkeypatch.setattr(cli, "_record_close_error", stop_as_the_command_ends)

    class Torchrun:  # (its run finished, or stopped by the stop passed on)
        def __init__(self, command, env, start_new_session, pass_fds):
            pass

        def send_signal(self, signum):
            sent.append(signum)

        def wait(self):
            return -sent[0] if sent else 0

    @contextlib.contextmanager
    def stop_comes(words):  # (the outer of the block's two: it begins first and ends last)
        if when == "as it begins":
            signal.raise_signal(getattr(signal, name))
        with adopting(words) as orphans:
            yield orphans
        if when == "as it ends":
            signal.raise_signal(getattr(signal, name))

    def wait_for_adopted(adopted, timeout_s, meanwhile=None):
        waited.append(adopted)
        return []

    monkeypatch.setattr(subprocess, "Popen", Torchrun)
    monkeypatch.setattr(cli, "adopting_orphans", stop_comes)
    monkeypatch.setattr(cli, "wait_for_adopted", wait_for_adopted)
    run = tmp_path / "run"
    code = main(["train", "ppo", "CartPole-v1", "--nproc", "1", "--device", "cpu", "--no-progress", "--out", str(run)])
    stderr = capsys.readouterr().err
    assert waited == [[]], stderr
    if when == "as it begins":
        assert code == 143 and sent == [signal.SIGTERM] and "rlspeed: stopping the process" in stderr, stderr
        assert "interrupted" not in stderr
    elif when == "as the command ends":
        assert code == 130 and [line for line in stderr.splitlines() if "interrupted" in line] == [
            f"rlspeed: interrupted (Ctrl-C) while ending the command: torchrun has ended, and '{run}' holds what its "
            "processes wrote."], stderr
    else:  # (torchrun finished the run: the stop cut nothing short, and the command ends with its code, said once)
        stop = "Ctrl-C" if name == "SIGINT" else name
        assert code == (130 if name == "SIGINT" else 143) and sent == [], stderr
        assert [line for line in stderr.splitlines() if "interrupted" in line] == [
            f"rlspeed: interrupted ({stop}) as torchrun ended: nothing was cut short; the run is saved in {run}"]


def test_a_stop_as_nproc_cleans_up_after_workers_that_wrote_nothing_waits_for_the_clean_up(monkeypatch, tmp_path,
                                                                                            capsys):
    """torchrun failed (exit code 1) before its workers wrote anything: the launcher removes the run directory it made
    (its lock file) and the parents it made, so that a rerun is not refused. A Ctrl-C as it removed them raised out of
    the launcher (after its block where stops wait) and left the folders behind: the clean-up is finished now, the
    stop said in one line, and the command ends with torchrun's code."""
    from rlspeed import cli

    remove_empty = cli._remove_empty

    class Torchrun:  # (its workers failed before writing anything)
        def __init__(self, command, env, start_new_session, pass_fds):
            pass

        def wait(self):
            return 1

    def stop_as_it_cleans_up(directories):
        signal.raise_signal(signal.SIGINT)
        remove_empty(directories)

    monkeypatch.setattr(subprocess, "Popen", Torchrun)
    monkeypatch.setattr(cli, "adopting_orphans", lambda words: contextlib.nullcontext([]))
    monkeypatch.setattr(cli, "_remove_empty", stop_as_it_cleans_up)
    made = tmp_path / "made"
    run = made / "run"
    code = main(["train", "ppo", "CartPole-v1", "--nproc", "1", "--device", "cpu", "--no-progress", "--out", str(run)])
    stderr = capsys.readouterr().err
    assert code == 1 and not made.exists(), stderr
    assert [line for line in stderr.splitlines() if "interrupted" in line] == [
        "rlspeed: interrupted (Ctrl-C) as torchrun ended: nothing was cut short; the command ends with torchrun's "
        "code, 1"], stderr


def test_a_stop_while_nproc_waits_for_the_processes_torchrun_left_is_said_at_once(monkeypatch, tmp_path, capsys):
    """torchrun that ended by itself (exit code 0) leaving a process running: the launcher waited up to 30 s for it
    without a word, and a Ctrl-C then did nothing, the command ending with 0. The wait is said as it begins, a stop
    during it as it comes (the process still running), and the command ends with the stop's code."""
    from rlspeed import cli

    popen, adopting, wait = subprocess.Popen, cli.adopting_orphans, cli.wait_for_adopted
    left: list[subprocess.Popen] = []
    said_while_running = []

    class Torchrun:  # (its run finished)
        def __init__(self, command, env, start_new_session, pass_fds):
            pass

        def wait(self):
            return 0

    @contextlib.contextmanager
    def one_left(words):  # (a process torchrun left: it runs until its input closes)
        with adopting(words) as orphans:
            yield orphans
        left.append(popen(_python("import sys; sys.stdin.read()"), stdin=subprocess.PIPE))
        orphans.append(left[0].pid)

    def wait_for_adopted(adopted, timeout_s, meanwhile=None):
        signal.raise_signal(signal.SIGINT)  # (held: the launcher passes on no stop once torchrun has ended)

        def then_it_ends(running):
            if meanwhile is not None:
                meanwhile(running)
            said = capsys.readouterr().err
            said_while_running.append(left[0].poll() is None and "Ctrl-C: still waiting for the 1 process(es)" in said
                                      and "torchrun ended (exit code 0): waiting up to 30 s for the 1" in said)
            left[0].stdin.close()

        if meanwhile is None:  # (an rlspeed that says nothing meanwhile: the process ends at once)
            left[0].stdin.close()
        return wait(adopted, timeout_s, then_it_ends) if meanwhile is not None else wait(adopted, timeout_s)

    monkeypatch.setattr(subprocess, "Popen", Torchrun)
    monkeypatch.setattr(cli, "adopting_orphans", one_left)
    monkeypatch.setattr(cli, "wait_for_adopted", wait_for_adopted)
    code = main(["train", "ppo", "CartPole-v1", "--nproc", "1", "--device", "cpu", "--no-progress", "--out",
                 str(tmp_path / "run")])
    left[0].wait(timeout=60)
    assert said_while_running[:1] == [True]
    assert code == 130


@pytest.mark.parametrize("stops", ["a stop, then torchrun's as it shuts down", "a stop to each as torch loads"])
def test_a_stop_under_nproc_is_said_once(monkeypatch, tmp_path, capsys, stops):
    """`rlspeed train --nproc 2` stopped by a double Ctrl-C: after rank 0's line of the saved run, rank 1 printed
    "rlspeed: interrupted (SIGTERM)" (torchrun's signal as it shuts the workers down, which came once rank 1's run had
    stopped for the first), and each worker stopped alike before training (torch loading) printed the same line. A
    worker whose run stopped for a stop says nothing of torchrun's later signal, ending with the first stop's code;
    a line every worker has alike is said once (`first_to_say`). The workers here run one after the other in this
    process, as torchrun's ranks 0 and 1 with the launcher's folder."""
    from rlspeed import cli

    def train(args):  # (as a worker's `rlspeed train` stops, under the command's own SIGTERM handler)
        with cli._sigterm_raises():
            if stops == "a stop to each as torch loads":
                cli._stage("loading torch")
                raise KeyboardInterrupt
            with cli._stop_after_iteration():
                signal.raise_signal(signal.SIGINT)  # (taken in: the run stops at its iteration's end, saved)
            signal.raise_signal(signal.SIGTERM)  # (torchrun's, as it shuts the workers down)
        return 130

    monkeypatch.setattr(cli, "cmd_train", train)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")
    monkeypatch.setenv("RLSPEED_WORKERS_SAID", str(tmp_path))
    codes = []
    for rank in ("0", "1") if stops == "a stop to each as torch loads" else ("1",):
        monkeypatch.setenv("RANK", rank)
        codes.append(main(["train", "ppo", "CartPole-v1"]))
    lines = [line for line in capsys.readouterr().err.splitlines() if "interrupted" in line]
    if stops == "a stop to each as torch loads":
        assert codes == [130, 130] and lines == ["rlspeed: interrupted (Ctrl-C) while loading torch, before training "
                                                 "began: nothing was trained or written."]
    else:
        assert codes == [130] and lines == []


def test_a_torchrun_worker_stopped_as_it_waits_for_rank_0s_save_says_nothing(monkeypatch, capsys):
    """`rlspeed train --nproc 2` stopped as rank 0 evaluated its finished run: rank 1, whose run had returned and
    which waited for rank 0 as it left (`DistributedStrategy.leave`), printed "rlspeed: interrupted" below rank 0's
    line of the saved run (torchrun passes the stop to every worker). Such a worker says nothing and ends with the
    stop's code: rank 0 says what its run saved."""
    from rlspeed import cli, distributed

    class Strategy:  # (rank 1 of two: its run returned, it waits for rank 0 as it leaves)
        enabled, is_main = True, False

        def __init__(self, device=None):
            pass

        def leave(self, code):
            signal.raise_signal(signal.SIGINT)  # (torchrun's, passing on the user's Ctrl-C)
            return code

        def shutdown(self, wait=True):
            pass

    monkeypatch.setattr(distributed, "DistributedStrategy", Strategy)
    monkeypatch.setattr(cli, "_train", lambda *args: cli._stage(None) or 0)  # (its run said and saved)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert main(["train", "ppo", "CartPole-v1", "--out", "unused"]) == 130
    assert "interrupted" not in capsys.readouterr().err


def test_a_workers_word_for_the_launcher_appears_whole_and_its_first_stands(tmp_path, monkeypatch):
    """`tell_launcher`'s file (a worker's exit code, which its peers read once as a stop comes: `peers_said`) is
    never there empty: it created the file, then wrote it, and a peer reading in between found no word. Checked at
    each file the call opens, as it opens it. A process's first word stands; where the file system has no hard
    links the word still arrives."""
    import rlspeed.lifetime
    from rlspeed.lifetime import SAID_FOLDER_VARIABLE, peers_said, tell_launcher

    said = tmp_path / str(os.getpid())
    seen = []

    class Watched(type(Path())):
        def open(self, *args, **kwargs):
            file = super().open(*args, **kwargs)
            seen.append(said.read_text() if said.exists() else None)  # (what a peer reading now finds)
            return file

    monkeypatch.setattr(rlspeed.lifetime, "Path", Watched)
    monkeypatch.setenv(SAID_FOLDER_VARIABLE, str(tmp_path))
    monkeypatch.setenv("RANK", "2")
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    tell_launcher(3)
    assert seen and set(seen) <= {None, "0 2 3"}
    tell_launcher(1, follows=True)  # (it ended because a peer did: said after its own word, which stands)
    assert [path.name for path in tmp_path.iterdir()] == [said.name] and said.read_text() == "0 2 3"
    assert peers_said() == {2: 3}
    said.unlink()

    def no_hard_links(*args):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_hard_links)
    tell_launcher(3)
    assert [path.name for path in tmp_path.iterdir()] == [said.name] and said.read_text() == "0 2 3"


_CTRL_C_AT_NEXT_FORK: list[bool] = []  # (armed by the test below; the hook, registered once, is inert otherwise)
_HOOKED: list[bool] = []


def _ctrl_c_at_fork() -> None:
    if _CTRL_C_AT_NEXT_FORK:
        _CTRL_C_AT_NEXT_FORK.clear()
        os.kill(os.getpid(), signal.SIGINT)  # (Ctrl-C as a worker is forked: its handler runs in an at-fork hook)


def test_ctrl_c_while_subprocess_envs_are_forked_stops_and_leaves_no_worker():
    """A Ctrl-C (or SIGTERM under the CLI) that came while `gymnasium-async` forked its env workers ran its handler in
    an at-fork hook, where Python ignores the KeyboardInterrupt ("Exception ignored in: _releaseLock"): a population
    stopped in its first second trained on to its end. The stop now raises once the env is made, and its workers go."""
    import multiprocessing

    from rlspeed.envs.gymnasium_env import GymnasiumEnv

    if multiprocessing.get_start_method(allow_none=True) not in (None, "fork"):
        pytest.skip("the workers are forked only under the fork start method")
    if not _HOOKED:  # (os.register_at_fork has no undo)
        os.register_at_fork(before=_ctrl_c_at_fork)
        _HOOKED.append(True)
    before = set(multiprocessing.active_children())
    _CTRL_C_AT_NEXT_FORK.append(True)
    try:
        with pytest.raises(KeyboardInterrupt):
            GymnasiumEnv("CartPole-v1", num_envs=2, vectorization="async")
    finally:
        _CTRL_C_AT_NEXT_FORK.clear()
    deadline = time.monotonic() + 60  # (a loaded machine: the workers end as soon as they are scheduled)
    while set(multiprocessing.active_children()) - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not set(multiprocessing.active_children()) - before



def test_a_stop_during_the_final_save_stops_the_command_once_the_save_is_written():
    """`_learn_and_save`'s block holding the stops (`lifetime.stops_held`): a SIGTERM while the finished training is
    saved waits for the save, then stops the final evaluation as it begins (`_sigterm_raises(STOPS, held)`), with
    `Terminated`, taken from the list once; the handler from before is back after the block."""
    from rlspeed.cli import STOPS, Terminated, _sigterm_raises
    from rlspeed.lifetime import stops_held

    written = []
    with _sigterm_raises():
        outer = signal.getsignal(signal.SIGTERM)
        with stops_held() as held:
            signal.raise_signal(signal.SIGTERM)
            written.append("model.safetensors")
            with pytest.raises(Terminated, match="SIGTERM"), _sigterm_raises(STOPS, held):
                written.append("evaluated")
            assert held == []
        assert signal.getsignal(signal.SIGTERM) is outer
    assert written == ["model.safetensors"]


def test_a_stop_during_the_final_save_is_taken_in_once(monkeypatch):
    """A SIGTERM held while the final save is written goes through `_signal_arrived` (a forked child's default
    action, a closed terminal's output dropped, no more of torchrun's signal) once, as it came, not again as it stops
    the evaluation."""
    from rlspeed import cli
    from rlspeed.lifetime import stops_held

    arrived, signal_arrived = [], cli._signal_arrived

    def counted(owner, signum):
        arrived.append(signum)
        signal_arrived(owner, signum)

    monkeypatch.setattr(cli, "_signal_arrived", counted)
    with cli._sigterm_raises(), stops_held(lambda signum: cli._signal_arrived(os.getpid(), signum)) as held:
        signal.raise_signal(signal.SIGTERM)
        with pytest.raises(cli.Terminated, match="SIGTERM"), cli._sigterm_raises(cli.STOPS, held):
            pass
    assert arrived == [signal.SIGTERM]


def test_stops_held_leaves_an_ignored_stop_ignored_and_the_handlers_as_they_were_when_the_block_raises():
    """`lifetime.stops_held`: a stop the process ignores (SIGHUP under nohup) stays ignored in the block, not held to
    stop it after; a block that raises (a full disk in a video's write) leaves each handler as it was, with the stop
    that came in the list for the caller to act on."""
    from rlspeed.lifetime import stops_held

    def handler(signum, frame):
        raise AssertionError("the stop came inside the block")

    arrived = []
    previous = signal.signal(signal.SIGUSR1, handler), signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    try:
        with pytest.raises(OSError), stops_held(arrived.append) as came:
            signal.raise_signal(signal.SIGUSR2)
            signal.raise_signal(signal.SIGUSR1)
            raise OSError("no space left on device")
        assert signal.getsignal(signal.SIGUSR1) is handler
        assert signal.getsignal(signal.SIGUSR2) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGUSR1, previous[0])
        signal.signal(signal.SIGUSR2, previous[1])
    assert came == arrived == [signal.SIGUSR1]


class _StopComesBefore:
    """`_signal` as `rlspeed.lifetime` calls it, where the stop `stop` comes once, just before the handler of `signum`
    is set to one `when(handler)` accepts: a stop between two of a block's settings of its handlers."""

    getsignal = staticmethod(_signal.getsignal)

    def __init__(self, signum, stop, when=lambda handler: True):
        self.signum, self.stop, self.when, self.came = signum, stop, when, False

    def __getattr__(self, name):  # (the rest as `_signal` has it)
        return getattr(_signal, name)

    def signal(self, signum, handler):
        if signum == self.signum and self.when(handler) and not self.came:
            self.came = True
            signal.raise_signal(self.stop)
        return _signal.signal(signum, handler)


class _Stop(Exception):
    pass


def _stop(signum, frame):
    raise _Stop


@pytest.fixture(params=["pthread_sigmask", "no pthread_sigmask"])
def sigmask(request, monkeypatch) -> bool:
    """Each test with `signal.pthread_sigmask` (Linux, macOS) and without it (Windows, whose `signal` has none)."""
    if request.param != "pthread_sigmask":
        monkeypatch.delattr(_signal, "pthread_sigmask")
    return request.param == "pthread_sigmask"


def _handlers() -> list:
    return [signal.getsignal(signum) for signum in STOPS]


def test_stops_held_puts_the_handlers_back_when_a_stop_comes_while_it_sets_them(monkeypatch, sigmask):
    """`lifetime.stops_held`: a SIGTERM whose handler raises (the `rlspeed` command's `Terminated`) that came after
    Ctrl-C's handler was set to hold, before SIGTERM's was, left Ctrl-C held for good: each later Ctrl-C went into a
    list nobody read. With `pthread_sigmask` the stop waits until all are set, and is held as any other in the block;
    without it, the handlers set so far are put back as the stop is raised."""
    import rlspeed.lifetime
    from rlspeed.lifetime import stops_held

    monkeypatch.setattr(rlspeed.lifetime, "_signal", _StopComesBefore(signal.SIGTERM, signal.SIGTERM))
    previous = signal.signal(signal.SIGTERM, _stop)
    before = _handlers()
    try:
        with contextlib.nullcontext() if sigmask else pytest.raises(_Stop), stops_held() as came:
            assert sigmask, "the stop came before the block"
            assert came == [signal.SIGTERM]
        assert _handlers() == before
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_stops_held_puts_every_handler_back_when_a_stop_comes_while_it_puts_them_back(monkeypatch, sigmask):
    """`lifetime.stops_held`: a Ctrl-C whose handler raises (Python's KeyboardInterrupt) that came after Ctrl-C's
    handler was put back, before SIGTERM's was, raised out of the loop that puts them back and left SIGTERM, SIGHUP,
    SIGUSR1 and SIGUSR2 held for good: the command no longer stopped on them. Every handler is back now, and the
    Ctrl-C raised then."""
    import rlspeed.lifetime
    from rlspeed.lifetime import stops_held

    previous = signal.signal(signal.SIGINT, _stop), signal.getsignal(signal.SIGTERM)
    before = _handlers()
    monkeypatch.setattr(rlspeed.lifetime, "_signal",
                        _StopComesBefore(signal.SIGTERM, signal.SIGINT, when=lambda handler: handler == previous[1]))
    try:
        with pytest.raises(_Stop), stops_held() as came:
            pass
        assert _handlers() == before
    finally:
        signal.signal(signal.SIGINT, previous[0])
    assert came == []


class _SetOutsidePython(_StopComesBefore):
    """`_signal` as `rlspeed.lifetime` calls it, where the handler of `signum` was set outside Python (a C library's:
    `getsignal` gives None), and each handler set is recorded in `set`."""

    def __init__(self, signum):
        super().__init__(signum, signum, when=lambda handler: False)
        self.set = []

    def getsignal(self, signum):
        return None if signum == self.signum else _signal.getsignal(signum)

    def signal(self, signum, handler):
        self.set.append(signum)
        return super().signal(signum, handler)


def test_the_final_saves_held_stops_leave_a_handler_set_outside_python_as_it_is(monkeypatch):
    """`lifetime.stops_held` (the final save's block, the --nproc launcher's wait for its workers): a stop whose
    handler was set outside Python is left to it, as Python cannot set that handler again: held, it stayed held for
    good (or its handler's return failed the block). The other stops are held in the block and back after it."""
    import rlspeed.lifetime
    from rlspeed.lifetime import stops_held

    outside = _SetOutsidePython(signal.SIGUSR1)
    monkeypatch.setattr(rlspeed.lifetime, "_signal", outside)
    before = _handlers()
    with stops_held():
        hold = signal.getsignal(signal.SIGTERM)
        assert hold is signal.getsignal(signal.SIGINT) and hold not in before
    assert _handlers() == before
    assert signal.SIGUSR1 not in outside.set and signal.SIGTERM in outside.set


class _StopAsItIsSet(_StopComesBefore):
    """`_signal` as `rlspeed.lifetime` calls it, where a stop's handler raises once (`_Stop`) as the call that sets the
    handler of `signum` to one `when(handler)` accepts returns: Python runs a stop that another of the process's
    threads took (the main thread holding the stops back) in the main thread, wherever it is then."""

    def __init__(self, signum, when=lambda handler: True):
        super().__init__(signum, None, when)

    def signal(self, signum, handler):
        previous = _signal.signal(signum, handler)
        if signum == self.signum and self.when(handler) and not self.came:
            self.came = True
            _stop(signum, None)
        return previous


class _StopAsTheyAreHeldBack(_StopComesBefore):
    """`_signal` as `rlspeed.lifetime` calls it, where a stop's handler raises once (`_Stop`) as the call that holds
    the stops back for the `nth` time returns (the first: to set a block's handlers; the second: to put them back)."""

    def __init__(self, nth):
        super().__init__(None, None)
        self.nth, self.blocked = nth, 0

    def pthread_sigmask(self, how, signums):
        mask = _signal.pthread_sigmask(how, signums)
        if how == _signal.SIG_BLOCK and signums:
            self.blocked += 1
            if self.blocked == self.nth:
                _stop(None, None)
        return mask


@contextlib.contextmanager
def _handlers_and_mask_kept():
    """The handlers of `STOPS` and this thread's mask (where `sigmask` left it) as before the block, also where a test
    of them fails."""
    masks = hasattr(_signal, "pthread_sigmask")
    before, mask = _handlers(), signal.pthread_sigmask(signal.SIG_BLOCK, ()) if masks else None
    try:
        yield
    finally:
        if masks:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for signum, handler in zip(STOPS, before):
            signal.signal(signum, handler)


def test_a_stop_as_a_handler_is_set_leaves_none_set(monkeypatch, sigmask):
    """`lifetime.handlers_set`: a stop whose handler raised as the call that set one of a block's handlers returned
    left that handler set for good (it was kept to be put back only once the call returned): under `rlspeed eval
    --video`, a later stop went to the recording's handler after it ended. Every handler is back now."""
    import rlspeed.lifetime
    from rlspeed.lifetime import stops_held

    with _handlers_and_mask_kept():
        before = _handlers()
        monkeypatch.setattr(rlspeed.lifetime, "_signal", _StopAsItIsSet(signal.SIGTERM))
        with pytest.raises(_Stop), stops_held():
            raise AssertionError("the stop came before the block")
        assert _handlers() == before


@pytest.mark.parametrize("nth", [1, 2], ids=["setting them", "putting them back"])
def test_a_stop_as_the_stops_are_held_back_leaves_them_neither_held_back_nor_set(monkeypatch, nth):
    """`lifetime.handlers_set`: a stop whose handler raised as the call that held the stops back (to set a block's
    handlers, or to put them back) returned left them held back in the main thread for good (a later Ctrl-C waited
    for ever where no other thread took it), and, putting them back, left the block's handlers set. The mask and
    every handler are as before now."""
    import rlspeed.lifetime
    from rlspeed.lifetime import stops_held

    with _handlers_and_mask_kept():
        before, mask = _handlers(), signal.pthread_sigmask(signal.SIG_BLOCK, ())
        monkeypatch.setattr(rlspeed.lifetime, "_signal", _StopAsTheyAreHeldBack(nth))
        with pytest.raises(_Stop), stops_held():
            assert nth == 2, "the stop came before the block"
        assert (_handlers(), signal.pthread_sigmask(signal.SIG_BLOCK, ())) == (before, mask)


def test_an_error_of_the_final_save_is_what_the_command_ends_with_after_a_stop_in_it(tmp_path, monkeypatch, capsys):
    """Where the final save fails (a full disk) after a SIGTERM came in it, the command ends with the save's error
    (its line says the model is not saved), not with the stop, whose line would say it is; the handlers from before
    are back."""
    from rlspeed.algos.base import Algorithm
    from rlspeed.errors import UserError

    def full_disk(model, path, *args, **kwargs):
        signal.raise_signal(signal.SIGTERM)
        raise UserError(f"cannot write '{path}' (no space left on device).")

    monkeypatch.setattr(Algorithm, "save", full_disk)
    before = _handlers()
    code = main(["train", "ppo", "CartPole-v1", "--total-timesteps", "32", "--num-envs", "2", "--set", "num_steps=16",
                 "--set", "batch_size=32", "--target-return", "none", "--no-progress", "--device", "cpu", "--out",
                 str(tmp_path / "run")])
    stderr = capsys.readouterr().err
    assert code == 2 and "no space left on device" in stderr and "interrupted" not in stderr, stderr
    assert _handlers() == before


@pytest.mark.parametrize("where", ["__enter__", "__exit__"])
def test_a_stop_in_contextlibs_frames_leaves_no_handler_of_a_block_that_ended(where):
    """A stop whose handler raised in contextlib's frames of a `handlers_set` block (as the block was entered or left,
    where no mask holds a stop back, or where another thread, torch's or W&B's, took the signal) left the block's
    generator suspended, its handlers not put back; collected later, once the block around it had ended, it set that
    block's handler again: a handler of a block that had ended (here a lambda; in the CLI `stops_held`'s, which drops
    every later Ctrl-C). A block closed so puts back only the handlers that are still its own."""
    from rlspeed.lifetime import handlers_set

    def raising(signum, frame):
        raise KeyboardInterrupt

    outer = _signal.getsignal(signal.SIGTERM)
    code = getattr(contextlib._GeneratorContextManager, where).__code__
    inner = [handlers_set(raising)]  # (the block, dropped below: then only the stop's traceback holds it)
    trace = sys.gettrace()

    def stop_in_contextlib(frame, event, arg):
        # (the stop in contextlib's __enter__ of the inner block once its generator has set the handlers, or as its
        # __exit__ begins: the handler raises there, in contextlib's frame)
        if frame.f_code is not code or not inner or frame.f_locals["self"] is not inner[0]:
            return None
        frame.f_trace_opcodes = True
        if event == "call" and where == "__exit__" or event == "opcode" and inner[0].gen.gi_suspended:
            sys.settrace(trace)
            frame.f_trace = None
            signal.raise_signal(signal.SIGTERM)
        return stop_in_contextlib

    caught = []  # (the stop, kept: its traceback holds contextlib's frame, and so the inner block's generator)
    with handlers_set(lambda signum, frame: None):
        try:
            if where == "__enter__":
                sys.settrace(stop_in_contextlib)
            with inner[0]:
                if where == "__exit__":
                    sys.settrace(stop_in_contextlib)
        except KeyboardInterrupt as stop:
            caught.append(stop)
        finally:
            sys.settrace(trace)
        inner.clear()
    assert len(caught) == 1 and _signal.getsignal(signal.SIGTERM) == outer
    caught.clear()  # (the inner block's generator is collected now)
    assert _signal.getsignal(signal.SIGTERM) == outer
