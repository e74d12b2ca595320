"""The launcher's stall watch (runner.py --stall-timeout): a job whose workers stop completing
steps ends with one line naming the worker and what it waits on; a worker waiting for data, or
one idle while another trains, is no stall."""
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import jobs
from ps_helpers import needs_mpirun
from hetu.launch import progress
from hetu.launch.processes import descendants
from hetu.launch.watchdog import StallWatch

ROOT = Path(__file__).resolve().parents[1]
RUNNER = ROOT / "python" / "runner.py"



# --------------------------------------------------------------------------- the rule, in-process

class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_a_job_stalls_only_when_no_worker_steps_and_the_idlest_is_named():
    clock = Clock()
    watch = StallWatch(10, clock)
    hosts = {0: "a", 1: "b"}
    watch.read(0, "hetu-progress 5 0.0 ")
    watch.read(1, "hetu-progress 7 0.0 ")
    clock.now += 8
    watch.read(0, "hetu-progress 5 8.0 barrier (dist/comm.py:134) <- main (x/train.py:9)")
    watch.read(1, "hetu-progress 9 1.0 ")
    assert watch.stalled(hosts) is None
    clock.now += 9   # worker 1 stepped 10 s ago: still training, so worker 0 may wait for it
    watch.read(0, "hetu-progress 5 17.0 barrier (dist/comm.py:134) <- main (x/train.py:9)")
    watch.read(1, "hetu-progress 9 10.0 pull of table 'emb' from server 0 (node 8 at h:1), unanswered for 9.9 s")
    assert watch.stalled(hosts) == ("worker 0 on a made no step for 17 s (after step 5); blocked in "
                                    "barrier (dist/comm.py:134) <- main (x/train.py:9)")
    watch.read(0, "hetu-progress end")   # a finished worker is no longer watched
    assert watch.stalled(hosts).startswith("worker 1 on b made no step for 10 s (after step 9); blocked in pull "
                                           "of table 'emb' from server 0")


def test_waiting_for_data_holds_the_clock_and_silence_does_not():
    clock = Clock()
    watch = StallWatch(10, clock)
    watch.read(0, "hetu-progress 3 0 waiting for data")
    clock.now += 9
    watch.read(0, "hetu-progress 3 0 waiting for data")
    clock.now += 9
    assert watch.stalled({0: "a"}) is None
    clock.now += 1   # the reports stopped 10 s ago: stopped by a signal, or the interpreter held
    assert watch.stalled({0: "a"}) == ("worker 0 on a sent no progress report for 10 s "
                                       "(after step 3): it is stopped, or its Python interpreter is held")
    assert StallWatch(0, clock).stalled({}) is None


def test_a_pause_of_the_launcher_itself_re_arms_the_watch():
    clock = Clock()
    watch = StallWatch(4, clock)
    watch.read(0, "hetu-progress 3 0 ")
    assert watch.paused() is None and watch.stalled({0: "a"}) is None
    clock.now += 0.05
    assert watch.paused() is None
    clock.now += 30   # the launcher was stopped: no report was read meanwhile
    assert watch.paused() == pytest.approx(30) and watch.stalled({0: "a"}) is None
    watch.read(0, "hetu-progress 3 30.0 write (x/train.py:9)")   # its idleness while the launcher slept
    assert watch.stalled({0: "a"}) is None
    for _ in range(9):   # a stall after the pause is one, counted from the pause's end
        clock.now += 0.5
        assert watch.paused() is None
    assert watch.stalled({0: "a"}).startswith("worker 0 on a sent no progress report for 4 s (after step 3)")


def test_a_worker_names_the_python_frames_it_waits_in():
    event = threading.Event()

    def wait_for_the_go():
        event.wait()
    t = threading.Thread(target=wait_for_the_go)
    t.start()
    try:
        time.sleep(0.2)
        where = progress.blocked_in(t)
    finally:
        event.set()
        t.join()
    assert re.fullmatch(r"wait \(.*threading\.py:\d+\) <- wait \(.*threading\.py:\d+\) <- "
                        r"wait_for_the_go \(tests/test_watchdog\.py:\d+\)", where), where


def test_the_executor_counts_its_steps():
    import numpy as np
    import hetu as ht
    x = ht.placeholder_op("x")
    w = ht.Variable("w", value=np.ones((3, 1), np.float32))
    loss = ht.reduce_mean_op(ht.matmul_op(x, w), [0, 1])
    ex = ht.Executor([loss, ht.optim.SGDOptimizer(0.1).minimize(loss)])
    before = progress._state.steps
    for _ in range(3):
        ex.run(feed_dict={x: np.ones((4, 3), np.float32)})
    assert progress._state.steps == before + 3


# --------------------------------------------------------------------------- real jobs

# Trains a BSP table step by step; MODE picks how the job stops making progress.
TRAINER = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    import hetu.ps as ps
    from hetu.launch import progress
    mode, out = sys.argv[1], os.environ["OUT"]
    ps.start()
    rank = ps.rank()
    progress.watch()
    table = ps.client().init_table("emb", 64, 4, init=("constant", 0.0))
    keys = np.arange(64, dtype=np.int64)
    for step in range({"server_stopped": 400, "steady": 100}.get(mode, 40)):
        if mode == "data" and step == 2:
            with progress.waiting("data"):
                time.sleep(6)
        if mode == "reload" and step == 6 and rank == 1:
            time.sleep(1.5)   # the slower worker: its push of step 6 comes after the load
        table.push(keys, np.ones((64, 4)), iteration=step, lr=0.1).wait()
        if mode == "reload" and rank == 0 and step == 3:
            table.save(os.path.join(out, "ckpt")).wait()
        if mode == "reload" and rank == 0 and step == 6:
            # A load at the wrong time: it drops the buffered pushes of step 6, whose pull
            # then waits for a push that never comes.
            table.load(os.path.join(out, "ckpt")).wait()
        table.pull(keys, iteration=step + 1).wait()
        progress.step_done()
        open(os.path.join(out, f"step.{rank}"), "w").write(str(step))
        time.sleep(0.1 if mode in ("server_stopped", "steady") else 0.02)
    ps.finalize()
    print("finished")
""")

STALL_TIMEOUT = 4


def run_trainer(tmp_path, mode, workers=1, **kw):
    env = {**os.environ, "OUT": str(tmp_path)}
    return jobs.Job([sys.executable, str(RUNNER), "-w", str(workers), "-s", "1", "--timeout", "120",
                     "--stall-timeout", str(STALL_TIMEOUT), sys.executable, "-c", TRAINER, mode],
                    env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def stall_line(err):
    lines = [line for line in err.splitlines() if "(--stall-timeout)" in line]
    assert len(lines) == 1, err[-4000:]
    return lines[0]


# Stops threads of a process (PTRACE_SEIZE + PTRACE_INTERRUPT: its other threads run on, unlike
# with SIGSTOP), and reaps them when the process dies, so that its parent sees it end.
THREAD_STOPPER = textwrap.dedent("""
    import ctypes, os, sys
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    PTRACE_SEIZE, PTRACE_INTERRUPT, WALL = 0x4206, 0x4207, 0x40000000
    tids = [int(t) for t in sys.argv[1:]]
    for tid in tids:
        for request in (PTRACE_SEIZE, PTRACE_INTERRUPT):
            if libc.ptrace(request, tid, None, None) != 0:
                sys.exit(f"ptrace {tid}: {os.strerror(ctypes.get_errno())}")
    print("stopped", flush=True)
    while tids:   # leave every stop as it is; end once the threads are gone
        tid, status = os.waitpid(-1, WALL)
        if os.WIFEXITED(status) or os.WIFSIGNALED(status):
            tids.remove(tid)
""")


def thread_named(pid, name):
    for tid in os.listdir(f"/proc/{pid}/task"):
        if Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip() == name:
            return int(tid)
    return None


def server_pid(launcher_pid):
    for pid in descendants(launcher_pid):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"DMLC_ROLE=server" in environ and b"hetu.launcher" in Path(f"/proc/{pid}/cmdline").read_bytes():
            return pid
    return None


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@needs_mpirun
@pytest.mark.timeout(120)
def test_a_server_whose_request_handling_stopped_while_its_heartbeats_flow_ends_the_job(tmp_path):
    # The server's receive thread (which serves small requests itself) and data thread stop; its
    # heartbeat thread runs on, so the scheduler sees nothing wrong (the silent hang).
    with run_trainer(tmp_path, "server_stopped") as job:
        wait_for(lambda: (tmp_path / "step.0").exists(), 60, "the first step")
        server = wait_for(lambda: server_pid(job.pid), 10, "the server")
        threads = [thread_named(server, name) for name in ("ps-receive", "ps-data")]
        assert all(threads) and thread_named(server, "ps-heartbeat"), os.listdir(f"/proc/{server}/task")
        with jobs.Job([sys.executable, "-c", THREAD_STOPPER, *map(str, threads)], stdout=subprocess.PIPE,
                      text=True) as stopper:
            assert stopper.stdout.readline().strip() == "stopped"
            stopped = time.monotonic()
            out, err = job.communicate(timeout=STALL_TIMEOUT + 30)
            ended = time.monotonic() - stopped
    assert job.returncode == 1, err[-4000:]
    line = stall_line(err)
    assert re.search(rf"error: no training progress for {STALL_TIMEOUT} s \(--stall-timeout\): worker 0 on \S+ "
                     r"made no step for \d+ s \(after step \d+\); blocked in (push|pull) of table 'emb' from "
                     r"server 0 \(node \d+ at [\d.]+:\d+\), unanswered for [\d.]+ s$", line), line
    assert ended < STALL_TIMEOUT + 10, f"the job ended {ended:.1f} s after the server stopped answering"
    assert "finished" not in out


@needs_mpirun
@pytest.mark.timeout(120)
def test_a_load_at_the_wrong_time_ends_the_job_it_would_hang(tmp_path):
    with run_trainer(tmp_path, "reload", workers=2) as job:
        _, err = job.communicate(timeout=90)
    assert job.returncode == 1, err[-4000:]
    line = stall_line(err)
    # The worker named is the one idle longest: worker 1 (stuck after step 6's push) or worker 0
    # (stuck in step 7's pull after its load), as the two race.
    assert re.search(r"worker [01] on \S+ made no step for \d+ s \(after step [67]\); blocked in pull of table "
                     r"'emb' from server 0 \(node \d+ at [\d.]+:\d+\), unanswered for [\d.]+ s$", line), line


@needs_mpirun
@pytest.mark.timeout(120)
def test_a_worker_waiting_for_data_longer_than_the_timeout_is_no_stall(tmp_path):
    with run_trainer(tmp_path, "data") as job:
        out, err = job.communicate(timeout=90)
    assert job.returncode == 0, err[-4000:]
    assert "[worker 0] waiting for data (not a stall)" in err, err[-4000:]
    assert "[worker 0] finished" in out
    assert "hetu-progress" not in out + err   # the reports are the launcher's, not the log's


@needs_mpirun
@pytest.mark.timeout(120)
def test_a_launcher_stopped_and_continued_says_so_and_the_job_goes_on(tmp_path):
    with run_trainer(tmp_path, "steady") as job:
        wait_for(lambda: (tmp_path / "step.0").exists(), 60, "the first step")
        time.sleep(1)
        job.send_signal(signal.SIGSTOP)
        time.sleep(STALL_TIMEOUT + 1)   # past the timeout and the reports' silence
        job.send_signal(signal.SIGCONT)
        out, err = job.communicate(timeout=60)
    assert job.returncode == 0, err[-4000:]
    assert "error: no training progress" not in err
    # While it is stopped its guard says so; once continued, it says it was paused and blames no one.
    stopped = [line for line in err.splitlines() if "has been stopped for" in line]
    assert len(stopped) == 1 and re.search(rf"warning: the launcher \(pid {job.pid} on \S+\) has been stopped for "
                                           r"[\d.]+ s \(SIGSTOP, Ctrl-Z\): its job waits on it", stopped[0]), err[-4000:]
    paused = [line for line in err.splitlines() if "this launcher was paused" in line]
    assert len(paused) == 1 and re.search(r"paused for \d+ s \(SIGSTOP, or its terminal or machine suspended\)",
                                          paused[0]), err[-4000:]
    assert "[worker 0] finished" in out


@needs_mpirun
@pytest.mark.timeout(120)
def test_a_stopped_worker_whose_reports_stop_ends_the_job(tmp_path):
    with run_trainer(tmp_path, "server_stopped") as job:   # a long run: it is stopped midway
        wait_for(lambda: (tmp_path / "step.0").exists(), 60, "the first step")
        worker = int(wait_for(lambda: [p for p in descendants(job.pid) if Path(f"/proc/{p}/cmdline").read_bytes()
                                       .endswith(b"\0server_stopped\0") and b"env\0" not in
                                       Path(f"/proc/{p}/cmdline").read_bytes()], 10, "the worker")[0])
        time.sleep(progress.report_interval(STALL_TIMEOUT) * 2)   # watched from its first report on
        os.kill(worker, signal.SIGSTOP)
        stopped = time.monotonic()
        out, err = job.communicate(timeout=STALL_TIMEOUT + 30)
        ended = time.monotonic() - stopped
    assert job.returncode == 1, err[-4000:]
    assert re.search(r"\(--stall-timeout\): worker 0 on \S+ sent no progress report for \d+ s \(after step \d+\): "
                     "it is stopped, or its Python interpreter is held$", stall_line(err)), err[-3000:]
    assert ended < STALL_TIMEOUT + 12, f"the job ended {ended:.1f} s after the worker stopped"
