"""The launcher's stall watch: reads the workers' progress reports (progress.py) and says when
the job as a whole stopped making progress.

A job stalls when none of its watched workers completed a step for the timeout: one worker
idle while others train is no stall (it may wait at a barrier for them), nor is a worker
waiting for data. A worker is watched from its first report until it says "end". A worker
whose reports stop (stopped by a signal, or holding Python's interpreter lock) counts as idle
since its last report. The stall is named by the worker idle longest, with what it waits on.
"""
import threading
import time
from dataclasses import dataclass
from typing import Dict, Optional

from .progress import REPORT_TAG, report_interval


@dataclass
class WorkerProgress:
    steps: int
    idle_since: float     # the launcher's clock: when the worker last completed a step
    reported: float       # when its last report came
    what: str             # what it is blocked in, once idle


class StallWatch:
    def __init__(self, timeout: float, clock=time.monotonic):
        self.timeout = timeout
        self.clock = clock
        self.workers: Dict[int, WorkerProgress] = {}
        self.lock = threading.Lock()   # reports come on the output threads, checks on the main one
        # Reports come every report_interval: a worker that missed a few has gone silent.
        self.silence = 3 * report_interval(timeout)

    @staticmethod
    def is_report(line: str) -> bool:
        return line.startswith(REPORT_TAG + " ")

    def read(self, rank: int, line: str):
        """A worker's report line (is_report)."""
        fields = line[len(REPORT_TAG) + 1:].split(" ", 2)
        if fields[0] == "end":
            with self.lock:
                self.workers.pop(rank, None)
            return
        try:
            steps, idle = int(fields[0]), float(fields[1])
        except (IndexError, ValueError):
            return   # not a report of ours: a worker's own line that happens to start alike
        now = self.clock()
        with self.lock:
            self.workers[rank] = WorkerProgress(steps, now - idle, now, fields[2] if len(fields) > 2 else "")

    def stalled(self, hosts: Dict[int, str]) -> Optional[str]:
        """Why the job is stalled (the worker idle longest, on its host from `hosts`, and what it
        waits on), or None."""
        with self.lock:
            workers = dict(self.workers)
        if self.timeout <= 0 or not workers:
            return None
        now = self.clock()
        # A worker waiting for data reports no idle time: it holds the job's clock.
        if any(now - w.idle_since < self.timeout for w in workers.values()):
            return None
        rank, w = min(workers.items(), key=lambda item: item[1].idle_since)
        node = f"worker {rank} on {hosts.get(rank, '?')}"
        if now - w.reported >= self.silence:
            return (f"{node} sent no progress report for {now - w.reported:.0f} s (after step {w.steps}): "
                    "it is stopped, or its Python interpreter is held")
        return f"{node} made no step for {now - w.idle_since:.0f} s (after step {w.steps}); blocked in {w.what or '?'}"
