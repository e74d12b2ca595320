"""Streams (docs/design.md section 14): what a stream costs, part by part.

Parts (each prints its own table; --parts picks them):

- ingest: lines/s of hetu.data.stream.StreamSource alone, on one core (HETU_NUM_THREADS=1 and the
  process pinned to one CPU), reading a directory of generated text files from the start to the
  last sample: Criteo-like lines (label, 13 integers, 26 hex values, as train.txt) and MovieLens
  ratings (user::item::rating::timestamp, with and without generated users and items side files).
  The reader thread parses and hashes; the reading thread only takes blocks, as a trainer would.

    python bench/stream.py --parts ingest                # --ingest-mb 256 of each format

- modes: PS vs HET vs Herald training on a stream of MovieLens 100K in time order, its files
  landing while the job runs, W = 2, one server, on loopback: rows moved, samples/s, the windows'
  AUC and lag (bench/stream_modes.py).

    python bench/stream.py --parts modes                 # --movielens DIR with u.data, u.user, u.item

- checkpoints: incremental against full checkpoints (--checkpoint-full-every) on a dynamic table
  of a few million rows on the parameter server: bytes, seconds to write, share of the steps'
  time, restore time (bench/stream_checkpoints.py).

    python bench/stream.py --parts checkpoints           # --ckpt-capacity 4194304 --ckpt-every 100
"""
import argparse
import os
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stream_checkpoints  # noqa: E402  (the checkpoints part)
import stream_modes  # noqa: E402  (the modes part)
DISTINCT_LINES = 100_000   # generated once per format, then written again until the size is reached


def criteo_lines(rng, n):
    """n Criteo-like lines: a 0/1 label, 13 integers (20% missing), 26 hex values (5% missing)."""
    labels = rng.integers(0, 2, n)
    ints = rng.zipf(1.3, (n, 13)).clip(max=1 << 30) - 1
    missing_int = rng.random((n, 13)) < 0.2
    cats = rng.integers(0, 1 << 32, (n, 26), dtype=np.uint64)
    missing_cat = rng.random((n, 26)) < 0.05
    out = []
    for r in range(n):
        columns = [str(labels[r])]
        columns += ["" if missing_int[r, k] else str(ints[r, k]) for k in range(13)]
        columns += ["" if missing_cat[r, k] else "%08x" % cats[r, k] for k in range(26)]
        out.append("\t".join(columns))
    return ("\n".join(out) + "\n").encode()


def movielens_lines(rng, n, users, items):
    u = rng.integers(1, users + 1, n)
    i = rng.integers(1, items + 1, n)
    r = rng.integers(1, 6, n)
    t = 978300760 + np.arange(n)
    return "".join(f"{a}::{b}::{c}::{d}\n" for a, b, c, d in zip(u, i, r, t)).encode()


def side_files(rng, folder, users, items):
    genres = ["Action", "Adventure", "Comedy", "Drama", "Horror", "Romance", "Sci-Fi", "Thriller"]
    with open(os.path.join(folder, "users.dat"), "w") as f:
        for u in range(1, users + 1):
            f.write(f"{u}::{'FM'[u % 2]}::{[1, 18, 25, 35, 45, 50, 56][u % 7]}::{u % 21}::{10000 + u}\n")
    with open(os.path.join(folder, "movies.dat"), "w") as f:
        for i in range(1, items + 1):
            picked = rng.choice(genres, size=int(rng.integers(1, 4)), replace=False)
            f.write(f"{i}::Movie {i} ({1950 + i % 60})::{'|'.join(picked)}\n")
    return os.path.join(folder, "users.dat"), os.path.join(folder, "movies.dat")


def write_files(folder, distinct, megabytes, files):
    """Files of `distinct` written again and again, about `megabytes` MB in all; the line count."""
    os.makedirs(folder, exist_ok=True)
    repeats = max(1, int(megabytes * 1e6 / len(distinct) / files))
    for k in range(files):
        with open(os.path.join(folder, f"part-{k:04d}"), "wb") as f:
            for _ in range(repeats):
                f.write(distinct)
    return distinct.count(b"\n") * repeats * files, len(distinct) * repeats * files


def drain(folder, fmt, lines, **options):
    """Seconds from the source's start to its last sample."""
    from hetu.data.stream import StreamSource
    start = time.perf_counter()
    with StreamSource(folder, fmt, **options) as source:
        read = 0
        while read < lines:
            block = source.read(1 << 16, timeout=30.0)
            if block is None:
                raise RuntimeError(f"{folder}: only {read} of {lines} lines arrived")
            read += len(block)
    return time.perf_counter() - start


def ingest_table(args):
    """The ingest part: lines/s of each format through StreamSource alone, on one core."""
    os.environ["HETU_NUM_THREADS"] = "1"   # before hetu._C's pool is made
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    rng = np.random.default_rng(0)
    work = args.work or tempfile.mkdtemp(prefix="hetu-stream-")
    os.makedirs(work, exist_ok=True)
    users, items = 6040, 3706   # MovieLens 1M's
    users_file, items_file = side_files(rng, work, users, items)
    cases = [
        ("criteo", "criteo", criteo_lines(rng, DISTINCT_LINES), {}),
        ("movielens", "movielens", movielens_lines(rng, DISTINCT_LINES, users, items), {}),
        ("movielens + side files", "movielens", None, {"users": users_file, "items": items_file}),
    ]
    print(f"# ingest: StreamSource alone, HETU_NUM_THREADS=1, one CPU, {args.ingest_mb} MB a format, "
          f"data in {work}")
    print(f"{'format':<24} {'lines':>11} {'MB':>7} {'seconds':>8} {'lines/s':>11} {'MB/s':>7}")
    folders = {}
    for name, fmt, distinct, options in cases:
        if distinct is not None:
            folders[fmt] = os.path.join(work, fmt)
            folders[fmt, "size"] = write_files(folders[fmt], distinct, args.ingest_mb, args.files)
        lines, size = folders[fmt, "size"]
        seconds = min(drain(folders[fmt], fmt, lines, **options) for _ in range(args.repeats))
        print(f"{name:<24} {lines:>11,} {size / 1e6:>7.0f} {seconds:>8.2f} {lines / seconds:>11,.0f} "
              f"{size / 1e6 / seconds:>7.1f}")
        sys.stdout.flush()


def modes_table(args):
    """PS vs HET vs Herald on a stream (bench/stream_modes.py)."""
    stream_modes.modes_table(args)


def checkpoints_table(args):
    """Incremental against full checkpoints (bench/stream_checkpoints.py)."""
    stream_checkpoints.checkpoints_table(args)


PARTS = {"ingest": ingest_table, "modes": modes_table, "checkpoints": checkpoints_table}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", nargs="+", default=list(PARTS), choices=list(PARTS))
    p.add_argument("--ingest", action="store_true", help="the ingest part alone (as --parts ingest)")
    p.add_argument("--ingest-mb", type=float, default=256, help="ingest: MB of text of each format")
    p.add_argument("--files", type=int, default=8, help="ingest: files of each format")
    p.add_argument("--repeats", type=int, default=1, help="ingest: runs of each format (the fastest counts)")
    p.add_argument("--work", default=None, help="folder for the generated files (default: a temporary one)")
    stream_modes.add_arguments(p)
    stream_checkpoints.add_arguments(p)
    args = p.parse_args()
    parts = ["ingest"] if args.ingest else args.parts
    print(f"# bench/stream.py, {os.cpu_count()} cores")
    for part in parts:
        PARTS[part](args)


if __name__ == "__main__":
    main()
