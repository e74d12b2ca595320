"""A worker's progress, for the launcher's stall watch (runner.py --stall-timeout).

The launcher sets HETU_STALL_TIMEOUT in the workers' environment. A worker that builds an
Executor then runs a monitor thread, which writes one line to stderr every few seconds:

    hetu-progress STEPS IDLE WHAT

STEPS: the executor steps completed so far; IDLE: seconds since the last one (0 while the
worker waits for data, which is no stall); WHAT: once idle, what the main thread is blocked in: its oldest parameter-server request still
unanswered (op, table and the servers that owe an answer), else its innermost Python frames
(an MPI barrier, a checkpoint save, the model's own code). The lines travel with the worker's
output, through mpirun from every host; the launcher reads them and does not print them
(watchdog.py). A worker that finishes writes "hetu-progress end".

Cheap by design: a step costs an integer increment and a clock read; the monitor wakes a few
times per timeout.
"""
import atexit
import os
import sys
import threading
import time
from contextlib import contextmanager

from .. import env

STALL_TIMEOUT_VAR = "HETU_STALL_TIMEOUT"
REPORT_TAG = "hetu-progress"


def report_interval(timeout: float) -> float:
    """Seconds between a worker's reports: several per timeout, at most one per 10 s."""
    return min(10.0, max(0.2, timeout / 5))


class _Progress:
    def __init__(self):
        self.steps = 0
        self.last_step = time.monotonic()
        self.waiting_for = []   # what the worker waits for, innermost last (nested waits)
        self.lock = threading.Lock()
        self.monitor = None


_state = _Progress()


def step_done():
    """One executor step completed (Executor.run calls it)."""
    _state.steps += 1
    _state.last_step = time.monotonic()


@contextmanager
def waiting(what="data"):
    """The worker waits for `what` (a stream's next batch): the time inside is not a stall;
    the worker says what it waits for once per timeout instead."""
    with _state.lock:
        _state.waiting_for.append(what)
    try:
        yield
    finally:
        with _state.lock:
            _state.waiting_for.remove(what)
            _state.last_step = time.monotonic()   # the wait ended: the stall clock restarts


def watch():
    """Starts this worker's monitor when the launcher asked for one (HETU_STALL_TIMEOUT > 0);
    once per process. The Executor calls it."""
    if _state.monitor is not None:
        return
    try:
        timeout = float(env.raw(STALL_TIMEOUT_VAR) or "0")
    except ValueError:
        return
    if timeout <= 0:
        return
    _state.last_step = time.monotonic()
    _state.monitor = threading.Thread(target=_monitor, args=(timeout, threading.main_thread()),
                                      name="hetu-progress", daemon=True)
    _state.monitor.start()
    atexit.register(_report, "end")


def _report(text: str):
    try:
        sys.stderr.write(f"{REPORT_TAG} {text}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass   # stderr closed at exit


def _monitor(timeout: float, main: threading.Thread):
    interval = report_interval(timeout)
    said_waiting = 0.0
    while True:
        time.sleep(interval)
        now = time.monotonic()
        with _state.lock:
            waiting_for = list(_state.waiting_for)
        if waiting_for:
            if now - said_waiting >= timeout:   # "says it is waiting", once per timeout
                print(f"waiting for {waiting_for[-1]} (not a stall)", file=sys.stderr, flush=True)
                said_waiting = now
            _report(f"{_state.steps} 0 waiting for {waiting_for[-1]}")
            continue
        idle = now - _state.last_step
        what = blocked_in(main) if idle >= interval else ""
        _report(f"{_state.steps} {idle:.1f} {what}")


def blocked_in(main: threading.Thread) -> str:
    """What `main` waits in: its oldest unanswered parameter-server request, else where its
    Python code is."""
    requests = _requests_in_flight()
    if requests:
        what, seconds, owed_by = max(requests, key=lambda r: r[1])
        return f"{what} from {', '.join(owed_by)}, unanswered for {seconds:.1f} s"
    frame = sys._current_frames().get(main.ident)
    if frame is None:
        return "nothing (the main thread has ended)"
    return python_frames(frame)


def _requests_in_flight():
    ps = sys.modules.get("hetu._ps")   # only a worker that started a node has any
    if ps is None or not hasattr(ps, "requests_in_flight"):
        return []
    try:
        return ps.requests_in_flight()
    except RuntimeError:
        return []


def python_frames(frame, depth=3) -> str:
    """The innermost `depth` frames, innermost first: "barrier (hetu/dist/comm.py:134) <- ..."."""
    out = []
    while frame is not None and len(out) < depth:
        code = frame.f_code
        where = "/".join(code.co_filename.split(os.sep)[-2:])
        out.append(f"{code.co_name} ({where}:{frame.f_lineno})")
        frame = frame.f_back
    return " <- ".join(out)
