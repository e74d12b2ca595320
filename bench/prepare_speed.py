"""`python -m hetu.data.prepare criteo`: the native encoder against the Python parser.

Writes a Criteo-format train.txt (label, 13 integer columns with 20% missing, 26 hex categorical
columns drawn from a power law within each field's size in the full data, 10% missing), then
prepares it with each parser in turn, in separate processes (wall time and peak resident
memory of each): `native` is the default path (hetu._C.ClickLogEncoder takes every clean chunk,
on HETU_NUM_THREADS threads),
`python` sends every chunk to the Python parser (the previous implementation's parsing; the value
dictionaries are the native ones in both). The two outputs are checked to be identical.

    python bench/prepare_speed.py                       # 300,000 lines, 3 repeats
    python bench/prepare_speed.py --lines 2000000 --repeats 1
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

MODES = ("native", "python")


def write_criteo(path, lines, seed=0):
    from hetu.data.criteo import FIELD_SIZES
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for start in range(0, lines, 100_000):
            n = min(100_000, lines - start)
            columns = [rng.integers(0, 2, n).astype(str)]
            for _ in range(13):
                values = (rng.zipf(1.5, n) - 1).astype(str)
                values[rng.random(n) < 0.2] = ""
                columns.append(values)
            for size in FIELD_SIZES:
                ranks = np.minimum(rng.zipf(1.2, n), size).astype(np.uint64)
                values = np.char.mod("%08x", (ranks * np.uint64(2654435761)) % np.uint64(1 << 32))
                values[rng.random(n) < 0.1] = ""
                columns.append(values)
            f.writelines("\t".join(row) + "\n" for row in zip(*columns))


def child(mode, source, output):
    """Runs in its own process: one prepare with the given parser."""
    from hetu.data import prepare_criteo, tabular
    if mode == "python":
        native = tabular.click_log_encoder

        class PythonParser:
            def __init__(self, layout):
                self.encoder = native(layout)

            def __getattr__(self, name):
                return getattr(self.encoder, name)

            def count_chunk(self, text, max_rows):
                return -1

            def encode_chunk(self, text, max_rows, offsets):
                return None

        tabular.click_log_encoder = PythonParser
    prepare_criteo(source, output, overwrite=True, progress=False)


def run_child(mode, source, output):
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, __file__, "--child", mode, "--input", str(source),
                             "--output", str(output)])
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{mode} prepare failed")
    return seconds, usage.ru_maxrss / 1024


def same_dataset(a, b):
    return all(np.array_equal(np.load(a / name), np.load(b / name))
               for name in ("dense.npy", "sparse.npy", "labels.npy"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=300_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--input", help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.input, args.output)
        return
    with tempfile.TemporaryDirectory(prefix="prepare-speed-") as tmp:
        tmp = Path(tmp)
        source = tmp / "train.txt"
        write_criteo(source, args.lines)
        from hetu import _C
        print(f"{source.stat().st_size / 2**20:.0f} MiB, {args.lines:,} lines; the native encoder on "
              f"{_C.num_threads()} threads (HETU_NUM_THREADS, default: every core)", flush=True)
        runs = {mode: [] for mode in MODES}
        for _ in range(args.repeats):
            for mode in MODES:  # in turn, so that the machine's noise falls on both
                runs[mode].append(run_child(mode, source, tmp / mode))
        if not same_dataset(tmp / "native", tmp / "python"):
            raise SystemExit("the two parsers wrote different datasets")
    python_seconds = statistics.median(s for s, _ in runs["python"])
    print(f"{'parser':<8} {'seconds':>8} {'lines/s':>10} {'peak MiB':>9} {'speed-up':>9}   runs (s)")
    for mode in MODES:
        seconds = statistics.median(s for s, _ in runs[mode])
        memory = statistics.median(m for _, m in runs[mode])
        print(f"{mode:<8} {seconds:8.2f} {args.lines / seconds:10,.0f} {memory:9.0f} "
              f"{python_seconds / seconds:8.2f}x   " + " ".join(f"{s:.2f}" for s, _ in runs[mode]))
    print("identical datasets: yes")


if __name__ == "__main__":
    main()
