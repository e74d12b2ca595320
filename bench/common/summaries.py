"""The `summary {...}` line a training run prints at its end (one per worker under the launcher,
tagged `[worker R]`)."""
import json
import re
import sys

WORKER_SUMMARY = re.compile(r"\[worker (\d+)\] summary (\{.*\})")


def last_summary(stdout):
    """The last summary line's content (a single process's, or the last worker's); None if none."""
    lines = [line.split("summary ", 1)[1] for line in stdout.splitlines() if "summary {" in line]
    return json.loads(lines[-1]) if lines else None


def worker_summaries(what, workers, returncode, stdout, stderr=""):
    """The workers' summaries of a finished run, in rank order; exits naming `what` if the run
    failed or a worker's summary is missing."""
    if returncode != 0:
        sys.exit(f"{what} (W={workers}) failed:\n{stdout[-3000:]}\n{stderr[-3000:]}")
    found = {int(r): json.loads(s) for r, s in WORKER_SUMMARY.findall(stdout)}
    if len(found) != workers:
        sys.exit(f"{what}: expected {workers} worker summaries, got {len(found)}:\n{stdout[-2000:]}")
    return [found[r] for r in sorted(found)]
