"""Child processes of the launcher: start them with tagged output, follow them, stop them."""
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

_print_lock = threading.Lock()


def emit(stream, tag: str, line: str):
    with _print_lock:
        stream.write(f"[{tag}] {line}\n")
        stream.flush()


def pump(pipe, stream, tag: str, on_line=None):
    """Copy a child's output line by line with a tag; runs in its own thread."""
    for raw in iter(pipe.readline, b""):
        line = raw.decode(errors="replace").rstrip("\r\n")
        emit(stream, tag, line)
        if on_line is not None and line.strip():
            on_line(line)
    pipe.close()


def proc_starttime(pid: int) -> Optional[str]:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def is_running(pid: int, start: Optional[str]) -> bool:
    """Whether pid is still the process that started at `start`, and not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return start is not None and fields[19] == start and fields[0] != "Z"


def _children_map() -> Dict[int, List[int]]:
    tree: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            tree.setdefault(ppid, []).append(int(entry))
    return tree


def descendants(pid: int) -> List[int]:
    """All processes below pid. mpirun puts each worker in its own process group, so killing
    mpirun's group is not enough when mpirun itself is stuck."""
    tree, out, todo = _children_map(), [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def snapshot_tree(pids: List[int]) -> Dict[int, Optional[str]]:
    """pid -> start time of every process below `pids`: what to kill later, and only while the
    pid still names the same process (pids are reused)."""
    tree = {}
    for pid in pids:
        tree.update({d: proc_starttime(d) for d in descendants(pid)})
    return tree


def kill_snapshot(tree: Dict[int, Optional[str]], sig=signal.SIGKILL):
    for pid, start in tree.items():
        if start is not None and proc_starttime(pid) == start:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def processes_with_env(assignment: str) -> List[int]:
    """Pids of the processes whose environment holds `assignment` ("NAME=value"): what a job
    started, even where a process left the tree (a daemon whose parent exited)."""
    wanted, found = assignment.encode(), []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if wanted in f.read().split(b"\0"):
                        found.append(int(entry))
            except OSError:
                continue
    return found


def signal_group(pid: int, sig):
    """Children start in sessions of their own, so their group id is their pid."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass
class Proc:
    role: str                       # scheduler | server | workers (the mpirun of all workers)
    rank: Optional[int]
    host: str
    popen: subprocess.Popen
    started: float = field(default_factory=time.monotonic)
    ended: Optional[float] = None
    returncode: Optional[int] = None
    threads: List[threading.Thread] = field(default_factory=list)
    # The summary repeats it: a long log's tail may no longer show why this process failed.
    last_stderr: str = ""
    ended_early: bool = False   # a scheduler or server that ended while the workers ran

    @property
    def label(self) -> str:
        return self.role if self.rank is None else f"{self.role} {self.rank}"

    def poll(self) -> Optional[int]:
        if self.returncode is None and self.popen.poll() is not None:
            self.returncode, self.ended = self.popen.returncode, time.monotonic()
        return self.returncode

    def signal_group(self, sig):
        signal_group(self.popen.pid, sig)


def start_process(role, rank, host, argv, env, out_tag) -> Proc:
    popen = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, start_new_session=True)
    proc = Proc(role=role, rank=rank, host=host, popen=popen)

    def remember(line):
        proc.last_stderr = line
    for pipe, stream, on_line in ((popen.stdout, sys.stdout, None), (popen.stderr, sys.stderr, remember)):
        t = threading.Thread(target=pump, args=(pipe, stream, out_tag, on_line), daemon=True)
        t.start()
        proc.threads.append(t)
    return proc


def describe_status(rc: Optional[int]) -> str:
    if rc is None:
        return "running"
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit {rc}"


