"""One job saves into a --checkpoint folder at a time (docs/design.md section 5): worker 0 holds
an exclusive lock beside the folder for the job's life, and a second job is refused in one line
naming the folder and the holder (after waiting checkpoint.HOLD_WAIT_S for a holder that may be
ending); the lock goes with its process, however it ends."""
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

import jobs
from conftest import REPO
from dist_harness import COMMON, THREADS
from hetu import checkpoint


def wait_for_holder(lock, job, timeout=120):
    """The pid the lock file names once `job` holds it."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert job.poll() is None, job.communicate()
        if os.path.exists(lock) and open(lock).read().strip():
            return int(open(lock).read().split()[0])
        time.sleep(0.1)
    raise AssertionError(f"{lock}: no holder after {timeout} s")


def test_a_lock_held_by_another_process_is_refused_and_goes_with_it(tmp_path):
    ckpt = tmp_path / "ckpt"
    code = f"from hetu import checkpoint; checkpoint.hold({str(ckpt)!r}); print('held', flush=True); input()"
    with jobs.Job([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as holder:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(checkpoint.FolderHeld, match=f"another job is saving checkpoints into this folder "
                                                        f"\\(pid {holder.pid} on {socket.gethostname()}, since "):
            checkpoint.hold(str(ckpt), wait=0.5)
        holder.stop(signal.SIGKILL)
        holder.wait()
    checkpoint.hold(str(ckpt), wait=0)   # the kernel released the killed holder's lock
    try:
        assert open(checkpoint.lock_path(str(ckpt))).read().split()[:2] == [str(os.getpid()), socket.gethostname()]
        checkpoint.hold(str(ckpt))   # this process holds it already
    finally:
        checkpoint.release(str(ckpt))


def test_a_holder_that_ends_within_the_wait_hands_the_lock_over(tmp_path):
    ckpt = tmp_path / "ckpt"
    code = f"from hetu import checkpoint; import time; checkpoint.hold({str(ckpt)!r}); print('held', flush=True); " \
           f"time.sleep(1)"
    with jobs.Job([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) as holder:
        assert holder.stdout.readline() == "held\n"
        started = time.monotonic()
        checkpoint.hold(str(ckpt), wait=30)
        assert holder.poll() is not None and time.monotonic() - started < 10
    checkpoint.release(str(ckpt))


@pytest.mark.timeout(300)
def test_a_second_job_saving_into_the_same_folder_is_refused(tmp_path, data_home):
    ckpt = tmp_path / "ckpt"
    env = dict(os.environ, HETU_DATA_HOME=data_home, **THREADS)
    cmd = [sys.executable, str(REPO / "examples/ctr/run_hetu.py"), *COMMON, "--optimizer", "sgd", "--batch-size", "64",
           "--checkpoint", str(ckpt), "--checkpoint-every", "5"]
    lock = checkpoint.lock_path(str(ckpt))
    with jobs.Job([*cmd, "--nepoch", "1000"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env) as first:
        assert wait_for_holder(lock, first) == first.pid
        second = jobs.run([*cmd, "--nepoch", "1"], capture_output=True, text=True, timeout=200, env=env)
        assert second.returncode != 0 and "Traceback" not in second.stderr, second.stderr
        assert second.stderr.strip().splitlines()[-1] == (
            f"--checkpoint {ckpt}: another job is saving checkpoints into this folder (pid {first.pid} on "
            f"{socket.gethostname()}, since {open(lock).read().split()[2]}; lock {lock}): wait for it to end or "
            f"give this job another folder"), second.stderr
        first.stop(signal.SIGKILL)
        first.wait()
    # Killed mid-run, the first job left its lock to the next one.
    third = jobs.run([*cmd, "--nepoch", "0.2"], capture_output=True, text=True, timeout=200, env=env)
    assert third.returncode == 0, third.stdout + third.stderr
    assert f"checkpoint at step 6 written to {ckpt}" in third.stdout, third.stdout
