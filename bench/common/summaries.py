"""The `summary {...}` line a training run prints at its end (one per worker under the launcher,
tagged `[worker R]`), and the per-iteration counters `--cache-perf` writes."""
import csv
import glob
import json
import os
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


def cache_perf_rows(csv_dir, pattern="*"):
    """Rows moved (pulled + pushed), summed over the workers, from the `--cache-perf` CSVs in
    `csv_dir` whose names match `pattern`-worker*.csv: (a list, one entry per iteration in order;
    the final flush, the CSVs' `end` row, which no iteration owns)."""
    per, flush = {}, 0
    for path in glob.glob(os.path.join(csv_dir, f"{pattern}-worker*.csv")):
        with open(path) as f:
            for r in csv.DictReader(f):
                moved = int(float(r["rows_pulled"])) + int(float(r["rows_pushed"]))
                if r["iteration"] == "end":
                    flush += moved
                else:
                    per[int(r["iteration"])] = per.get(int(r["iteration"]), 0) + moved
    return [per[k] for k in sorted(per)], flush
