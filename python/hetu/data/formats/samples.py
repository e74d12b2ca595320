"""``python -m hetu.data.prepare schema|parquet``: a dataset folder of the samples a stream parser
gives for a file or a folder of files (read once each, in name order), so that the folder holds
exactly the samples a stream of the same files would give (hashed ids: keys, as streams have).

Two passes over the input, as the click-log readers make: the first counts the good rows (and
reports the bad lines), the second writes them, so memory holds one block of samples."""
import os
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

from .. import store
from .tabular import shuffle_into_place
from .textio import BadLineTracker, DataFormatError

CHUNK_BYTES = 1 << 20
IGNORED_SUFFIXES = (".tmp", ".part")   # names of files being written (the stream's rule too)


def ignored_name(name):
    """Whether a file of a data folder is not (yet) data: a hidden name or one being written."""
    return name.startswith(".") or name.endswith(IGNORED_SUFFIXES)


def input_files(path):
    """The file `path`, or the files of folder `path` in name order (those ``ignored_name`` left out)."""
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"input not found: {path}")
    files = sorted(p for p in path.iterdir() if p.is_file() and not ignored_name(p.name))
    if not files:
        raise FileNotFoundError(f"no input files in {path}")
    return files


def text_samples(fmt, path, tracker):
    """ParsedLines of a text file by a stream parser (streams.NativeFormat), its bad lines
    reported to ``tracker`` (which raises unless skipping)."""
    with open(path, "rb") as f:
        first = f.readline()
        if not first:
            return
        line = int(fmt.begin_file(first.decode("utf-8", errors="replace"), str(path)))   # header lines
        f.seek(0)
        for _ in range(line):
            f.readline()
        carry, final = b"", False
        while not final:
            block = f.read(CHUNK_BYTES)
            final = not block
            text = carry + block
            if not final:
                cut = text.rfind(b"\n")
                text, carry = text[:cut + 1], text[cut + 1:]
            start = 0
            while start < len(text):
                parsed, bad, used, start = fmt.parse(text, start, str(path), line + 1, 1 << 16, final)
                for b in bad:
                    tracker.report(b)
                line += used
                yield parsed


def file_samples(fmt, path, tracker):
    """The samples of one file: a whole-file format's own reader, else the text one."""
    if getattr(fmt, "whole_files", False):
        return fmt.file_samples(path)
    return text_samples(fmt, path, tracker)


def prepare_samples(name, fmt, schema, input_path, output_dir, *, skip_bad_lines=False, val_fraction=0.1,
                    shuffle_seed=None, overwrite=False, progress=True, log=None):
    """Writes the dataset folder of the samples ``fmt`` (a stream parser of format ``name``,
    described by the schema file ``schema``) gives for the file or folder ``input_path``."""
    log = log if log is not None else sys.stderr
    files = input_files(input_path)
    fields = fmt.fields

    def blocks(tracker, description):
        for path in tqdm(files, desc=description, unit="file", disable=not progress, file=sys.stderr):
            yield from file_samples(fmt, path, tracker)

    tracker = BadLineTracker(skip_bad_lines, stream=log)
    num_rows = sum(len(parsed.labels) for parsed in blocks(tracker, f"{name} pass 1/2 (count)"))
    if num_rows == 0:
        raise DataFormatError(f"{input_path}: no usable rows")
    train_rows, val_rows = store.contiguous_split(num_rows, val_fraction)
    suffix = ".unshuffled.npy" if shuffle_seed is not None else ".npy"
    names = ["dense" + suffix, "sparse" + suffix, "labels" + suffix]
    shapes = [(num_rows, fields.num_dense), (num_rows, sum(fields.slots)), (num_rows, 1)]
    with store.atomic_directory(output_dir, overwrite=overwrite) as tmp_dir:
        writers = [store.NpyWriter(tmp_dir, n, dtype, shape)
                   for n, dtype, shape in zip(names, (np.float32, np.int64, np.float32), shapes)]
        written, quiet = 0, BadLineTracker(skip_bad_lines=True, max_reported=0)  # pass 1 reported
        for parsed in blocks(quiet, f"{name} pass 2/2 (write)"):
            if written + len(parsed.labels) > num_rows:
                break
            for writer, array in zip(writers, (parsed.dense, parsed.sparse, parsed.labels.reshape(-1, 1))):
                writer.write(array)
            written += len(parsed.labels)
        if written != num_rows:
            raise DataFormatError(f"{input_path}: changed while being read ({num_rows} rows in pass 1, "
                                  f"{written} in pass 2)")
        for writer in writers:
            writer.close()
        if shuffle_seed is not None:
            arrays = [np.load(os.path.join(tmp_dir, n), mmap_mode="r") for n in names]
            shuffle_into_place(tmp_dir, arrays, names, shuffle_seed)
        source = {"kind": name, "path": str(Path(input_path).resolve()), "schema": str(Path(schema).resolve()),
                  "files": [p.name for p in files], "skip_bad_lines": bool(skip_bad_lines),
                  "bad_lines_skipped": tracker.skipped}
        store.write_meta(tmp_dir, store.dataset_meta(
            name, num_rows, fields.num_dense, fields.names, None, train_rows, val_rows, val_fraction,
            shuffle_seed, source, label={"kind": "click", "values": [0.0, 1.0]}, field_slots=fields.slots,
            bag_fields=fields.bags, ids="hashed",
            dense_names=[c.name for c in fmt.columns if c.role == "dense"],
            encoding={"categorical": "key of the value's UTF-8 text (an integer's decimal text)",
                      "bag": "keys of its values, -1 padded", "dense": "the schema's transform, missing -> 0"}))
    summary = tracker.summary(input_path)
    if summary:
        print(summary, file=log)
    return Path(output_dir)
