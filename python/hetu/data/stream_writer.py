"""Writes a prepared dataset folder as a stream of Criteo-format text files, one file at a time,
for a job that follows the folder (`run_hetu.py --stream DIR`; README, "Train on a stream"):

    python -m hetu.data.stream_writer --input PREPARED --output DIR [--lines-per-file N]
                                      [--interval SECONDS] [--rows N]

Each line is Criteo's train.txt layout: the label, 13 counts and 26 categorical values, tab
separated. A count is the folder's dense feature d written as round(expm1(d)) (the folder holds
log1p of counts, which the stream's parser takes again); a categorical value is the folder's id
(an index, or a hashed key) written in hexadecimal, which the stream hashes as a string (its keys
are not the folder's ids: the samples are the same, their ids renamed). A file is written under a
name starting with "." and renamed when complete, so a reader never takes half a file."""
import argparse
import os
import sys
import time

import numpy as np

from .dataset import load_dataset

CRITEO_DENSE, CRITEO_FIELDS = 13, 26


def criteo_lines(dense, sparse, labels):
    """Criteo text of the rows (a str of whole lines)."""
    counts = np.rint(np.expm1(np.maximum(dense.astype(np.float64), 0))).astype(np.int64)
    keys = sparse.astype(np.int64).view(np.uint64)
    out = []
    for label, row_counts, row_keys, row_ids in zip(labels.reshape(-1), counts, keys, sparse):
        cats = ["" if i == -1 else format(int(k), "x") for k, i in zip(row_keys, row_ids)]
        out.append("\t".join([str(int(label > 0.5)), *map(str, row_counts.tolist()), *cats]) + "\n")
    return "".join(out)


def write_stream(input_dir, output_dir, lines_per_file, interval=0.0, rows=None, quiet=False):
    """Writes the folder's samples (training then validation rows, in stored order; the first
    `rows` of them if given) into `output_dir` as part-00000.txt, part-00001.txt, ...; `interval`
    seconds between files. Returns the files written."""
    data = load_dataset(input_dir)
    meta = data.meta
    if meta.num_dense != CRITEO_DENSE or list(meta.field_slots) != [1] * CRITEO_FIELDS:
        raise ValueError(f"{input_dir}: Criteo's layout needs {CRITEO_DENSE} dense features and {CRITEO_FIELDS} "
                         f"single-id fields, the folder has {meta.num_dense} and slots {list(meta.field_slots)} "
                         f"(prepare synthetic --shape criteo)")
    parts = [data.train, data.val]
    total = sum(len(p) for p in parts)
    total = total if rows is None else min(rows, total)
    os.makedirs(output_dir, exist_ok=True)
    written, begin = [], 0
    while begin < total:
        end = min(begin + lines_per_file, total)
        spans = _spans(parts, begin, end)
        dense, sparse, labels = (np.concatenate([np.asarray(getattr(part, kind)[lo:hi]) for part, lo, hi in spans])
                                 for kind in ("dense", "sparse", "labels"))
        name = f"part-{len(written):05d}.txt"
        tmp = os.path.join(output_dir, f".{name}.tmp")
        with open(tmp, "w") as f:
            f.write(criteo_lines(dense, sparse, labels))
        os.replace(tmp, os.path.join(output_dir, name))
        written.append(name)
        if not quiet:
            print(f"{name}: samples {begin}-{end - 1}", flush=True)
        begin = end
        if begin < total and interval > 0:
            time.sleep(interval)
    return written


def _spans(parts, begin, end):
    """(part, first, last) of the parts' rows [begin, end) counted across the parts."""
    offset, spans = 0, []
    for part in parts:
        lo, hi = max(begin, offset), min(end, offset + len(part))
        if lo < hi:
            spans.append((part, lo - offset, hi - offset))
        offset += len(part)
    return spans


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m hetu.data.stream_writer",
                                description="Write a prepared folder as Criteo-format files, one at a time")
    p.add_argument("--input", required=True, help="a prepared folder of Criteo's shape (prepare synthetic)")
    p.add_argument("--output", required=True, help="the folder the stream's files land in")
    p.add_argument("--lines-per-file", type=int, default=10000)
    p.add_argument("--interval", type=float, default=0.0, help="seconds between two files (default 0)")
    p.add_argument("--rows", type=int, default=None, help="only the first N samples")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    if args.lines_per_file < 1:
        p.error(f"--lines-per-file must be positive, got {args.lines_per_file}")
    try:
        write_stream(args.input, args.output, args.lines_per_file, args.interval, args.rows, args.quiet)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
