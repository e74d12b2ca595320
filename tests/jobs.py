"""How a test starts processes: a job (a command, a training run, the launcher, one process of a
ps-lite cluster) is started, waited for with a timeout, its output collected, and whatever of it
is left killed, the processes it started included. Every test that reaches this module (or
`subprocess`) is marked `cluster` (conftest.py)."""
import os
import signal
import subprocess

from hetu.launch.processes import descendants

# A wait without a timeout of its own; pytest's (pyproject.toml) ends most tests before it.
DEFAULT_TIMEOUT = 600


def alive(pid):
    """Whether process `pid` still runs (a zombie does not count)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class Job(subprocess.Popen):
    """A started process (Popen's arguments): stop() kills it and every process below it, and
    leaving a `with Job(...)` block stops what still runs."""

    def __init__(self, cmd, **kw):
        self.own_session = kw.get("start_new_session", False)
        super().__init__(cmd, **kw)

    def stop(self, sig=signal.SIGKILL):
        """`sig` to the processes below this one, then to this one (its process group where it
        started a session of its own)."""
        for pid in descendants(self.pid):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        if self.poll() is None:
            try:
                if self.own_session:
                    os.killpg(self.pid, sig)
                else:
                    self.send_signal(sig)
            except ProcessLookupError:
                pass

    def __exit__(self, *exc):
        if self.poll() is None:
            self.stop()
        return super().__exit__(*exc)


def run(cmd, timeout=DEFAULT_TIMEOUT, input=None, check=False, **kw):
    """subprocess.run's arguments: runs cmd to its end and returns a CompletedProcess, stdout and
    stderr collected unless given; past `timeout` s the job and what it started are killed and
    subprocess.TimeoutExpired raised."""
    if kw.pop("capture_output", "stdout" not in kw and "stderr" not in kw):
        kw["stdout"] = kw["stderr"] = subprocess.PIPE
    if input is not None:
        kw["stdin"] = subprocess.PIPE
    with Job(cmd, **kw) as job:
        try:
            out, err = job.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            job.stop()
            job.communicate()
            raise
    done = subprocess.CompletedProcess(job.args, job.returncode, out, err)
    if check:
        done.check_returncode()
    return done
