"""Stops a job whose launcher died, however it died.

The launcher starts one guard before anything else, in a session of its own (a signal to the
launcher's process group does not reach it), with the read end of a pipe as its stdin. Only the
launcher holds the write end, so the guard sees end-of-file the instant the launcher ends, even
by kill -9. The launcher tells the guard every process it starts ("start PID LABEL") and that
it finished its own teardown ("end"). End-of-file without "end" means the launcher was lost: the
guard says so, naming it, and stops every process the launcher started, with their descendants,
as the launcher's teardown would, and every local process whose environment carries the job's
HETU_JOB mark (a daemon a worker left behind). Processes on other hosts follow: a remote
scheduler or server ends with its ssh session (see ssh.remote_command), remote workers with
mpirun. Then it removes what the job left on this host: the launcher's work folder ("workdir
PATH"), and Open MPI's session folder of the job's mpirun ($TMPDIR/ompi.HOST.UID/pid.PID) and
its shared-memory segments (/dev/shm/vader_segment.HOST.UID.JOBID.RANK, those of the job id in
the session folder's contact.txt, and any a process of the job had mapped).

While the launcher lives, the guard also says when it stays stopped (SIGSTOP, Ctrl-Z) for
STOPPED_SAY_AFTER_S: its job waits on it then (the workers' output blocks once its pipes fill), and
the guard, in a session of its own, is not stopped with it.

    python -m hetu.launch.guard LAUNCHER_PID LAUNCHER_HOST KILL_GRACE JOB_MARK
"""
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional, Tuple

from .leftovers import OpenMpiFiles
from .processes import (is_running, kill_snapshot, proc_starttime, processes_with_env, signal_group,
                        snapshot_tree)


class LauncherGuard:
    """The launcher's end of the guard: a pipe to a `python -m hetu.launch.guard` process."""

    def __init__(self, kill_grace: float, host: str, job_mark: str):
        read_end, self._write_end = os.pipe()   # both non-inheritable: no child holds the write end
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "hetu.launch.guard", str(os.getpid()), host, f"{kill_grace:g}", job_mark],
            stdin=read_end, start_new_session=True)
        os.close(read_end)
        self.lost = False

    def _send(self, line: str):
        if self.lost:
            return
        try:
            os.write(self._write_end, (line + "\n").encode())
        except OSError:   # the guard died: the job runs on, unguarded; teardown still works
            self.lost = True

    def started(self, pid: int, label: str):
        self._send(f"start {pid} {label}")

    def owns(self, path: str):
        """A folder of the job's, removed if the launcher is lost."""
        self._send(f"workdir {path}")

    def close(self):
        """The launcher has stopped its job itself: the guard exits without touching anything."""
        self._send("end")
        os.close(self._write_end)
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.popen.kill()


def read_launcher(stream, folders=None) -> Tuple[List[Tuple[int, Optional[str], str]], bool]:
    """The processes the launcher reported, until its pipe closes; and whether it said "end".
    The folders it reported ("workdir PATH") are added to `folders`."""
    started = []
    for raw in stream:
        line = raw.decode(errors="replace").rstrip("\n")
        words = line.split(" ", 2)
        if words[0] == "end":
            return started, True
        if words[0] == "start" and len(words) == 3 and words[1].isdigit():
            pid = int(words[1])
            # The start time tells this process from a later one that reuses its pid.
            started.append((pid, proc_starttime(pid), words[2]))
        if words[0] == "workdir" and folders is not None:
            folders.append(line[len("workdir "):])
    return started, False


MPIRUN_LABEL = "mpirun (workers)"
STOPPED_SAY_AFTER_S = 2.0   # a launcher stopped this long is said to be (once a stop)


def is_stopped(pid: int) -> bool:
    """Whether process `pid` is stopped by a signal or a tracer (state T or t)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:][:1] in ("T", "t")


def say_when_stopped(pid: int, host: str, after: float = STOPPED_SAY_AFTER_S, poll: float = 0.25):
    """Says once a stop, when the launcher has stayed stopped for `after` seconds, that its job waits."""
    since, said = None, False
    while True:
        time.sleep(poll)
        if not is_stopped(pid):
            since, said = None, False
            continue
        since = since if since is not None else time.monotonic()
        if not said and time.monotonic() - since >= after:
            said = True
            try:
                print(f"[heturun] warning: the launcher (pid {pid} on {host}) has been stopped for {after:g} s "
                      "(SIGSTOP, Ctrl-Z): its job waits on it; SIGCONT or fg resumes it", file=sys.stderr, flush=True)
            except OSError:
                pass


def stop_job(started, grace: float, job_mark: str):
    """SIGTERM to every process group the launcher started, SIGKILL after `grace` seconds to
    those, to everything that was below them (mpirun's workers have groups of their own) and
    to every process marked with the job's mark."""
    pids = [pid for pid, start, _ in started if is_running(pid, start)]
    marked = [pid for pid in processes_with_env(job_mark) if pid != os.getpid()]
    tree: Dict[int, Optional[str]] = {pid: proc_starttime(pid) for pid in pids + marked}
    tree.update(snapshot_tree(pids + marked))
    mpi_files = OpenMpiFiles(pid for pid, _, label in started if label == MPIRUN_LABEL)
    mpi_files.note(tree)   # read while the job runs: what names its Open MPI files
    for pid in pids:
        signal_group(pid, signal.SIGTERM)
    kill_snapshot({pid: tree[pid] for pid in marked}, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(is_running(p, s) for p, s in tree.items()):
        time.sleep(0.05)
    for pid in pids:
        signal_group(pid, signal.SIGKILL)
    kill_snapshot(tree, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(is_running(p, s) for p, s in tree.items()):
        time.sleep(0.05)   # a file is removed once no process of the job writes it again
    return mpi_files


def main(argv=None):
    launcher_pid, host, grace, job_mark = (argv or sys.argv[1:])[:4]
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C is the launcher's to handle
    folders: List[str] = []
    threading.Thread(target=say_when_stopped, args=(int(launcher_pid), host), daemon=True).start()
    started, finished = read_launcher(sys.stdin.buffer, folders)
    if finished:
        return 0
    labels = [label for _, _, label in started]
    try:
        print(f"[heturun] error: the launcher (pid {launcher_pid} on {host}) is gone; stopping its job: "
              f"{', '.join(labels) or 'nothing was started'}", file=sys.stderr, flush=True)
    except OSError:
        pass   # the launcher's stderr may have gone with it; the job is stopped all the same
    mpi_files = stop_job(started, float(grace), job_mark)
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
    mpi_files.remove()
    return 1


if __name__ == "__main__":
    sys.exit(main())
