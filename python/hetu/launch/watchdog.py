"""The launcher's stall watch: reads the workers' progress reports (progress.py) and says when
the job as a whole stopped making progress.

A job stalls when none of its watched workers completed a step for the timeout: one worker
idle while others train is no stall (it may wait at a barrier for them), nor is a worker
waiting for data. A worker is watched from its first report until it says "end". A worker
whose reports stop (stopped by a signal, or holding Python's interpreter lock) counts as idle
since its last report. The stall is named by the worker idle longest, with what it waits on.

The launcher itself may be paused (SIGSTOP, a suspended terminal or machine): its clock then jumps
between two looks, and the workers' reports wait in their pipes (their output blocks once a pipe
is full). Their silence and idleness meanwhile were the launcher's doing, not theirs: a look that
finds the clock jumped by more than a pause limit re-arms the watch (no idleness or silence before
that moment counts) and says so, rather than naming a worker.
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
        # The launcher looks every few tens of ms: a gap between two looks of half the silence
        # (at least a second) is this process paused, not a slow look.
        self.pause_limit = max(1.0, self.silence / 2)
        self.armed_at = float("-inf")   # idleness and silence before this moment do not count
        self.last_look = None

    def paused(self) -> Optional[float]:
        """Seconds this process was paused since the last look (its clock jumped by more than
        pause_limit), after which the watch is re-armed; None if it was not."""
        now = self.clock()
        last, self.last_look = self.last_look, now
        if last is None or now - last < self.pause_limit:
            return None
        self.armed_at = now
        return now - last

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
        now, armed = self.clock(), self.armed_at
        # A worker waiting for data reports no idle time: it holds the job's clock.
        if any(now - max(w.idle_since, armed) < self.timeout for w in workers.values()):
            return None
        rank, w = min(workers.items(), key=lambda item: item[1].idle_since)
        node = f"worker {rank} on {hosts.get(rank, '?')}"
        if now - max(w.reported, armed) >= self.silence:
            return (f"{node} sent no progress report for {now - w.reported:.0f} s (after step {w.steps}): "
                    "it is stopped, or its Python interpreter is held")
        return f"{node} made no step for {now - w.idle_since:.0f} s (after step {w.steps}); blocked in {w.what or '?'}"
