"""Two-pass streaming encoder for click logs made of a label, integer columns and categorical
columns (Criteo, Avazu).

Pass 1 counts every categorical value per field; the per-field dictionaries are then built
(values seen at least ``min_count`` times, most frequent first, local ids from 1; local id 0 is
the field's bucket for missing and rare values). Pass 2 re-reads the file and writes encoded rows
into memory-mapped outputs. Memory is bounded by the chunk size plus the dictionaries, never by
the row count: the 45M-row Criteo file streams through the same way as a 40-line test file.

The counting, the dictionaries and the encoding of clean chunks are native
(``hetu._C.ClickLogEncoder``, src/data/click_log.cpp). A chunk with anything unusual in it (a bad
line, non-ASCII bytes, an integer written as "+5") is parsed here by ``parse_chunk``, which
defines the format and words the errors; its values go to the same dictionaries.

With hashed ids (``ids="hashed"``, keys.py) pass 1 only checks the lines and counts the rows,
and pass 2 writes each value's key (``hash_chunk``, or ``keys.hash_values`` for the Python
parser's chunks).
"""
import io
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from .. import store, vocabulary
from ..keys import check_ids, hash_values
from .textio import (BadLine, BadLineTracker, DataFormatError, column_count_problem,
                     parse_int_column, require_input_file, split_lines)

MISSING_OR_RARE_ID = 0
CLICK_LABELS = ("0", "1")


@dataclass(frozen=True)
class TableLayout:
    name: str
    delimiter: str
    num_columns: int
    label_column: int
    dense_columns: tuple
    categorical_columns: tuple
    field_names: tuple
    dense_names: tuple = ()
    header: tuple = None  # expected header row, for files that have one


@dataclass
class ParsedChunk:
    labels: np.ndarray       # float32 [n]
    dense: np.ndarray        # float32 [n, num_dense]
    categorical: list        # one list of n raw strings per field ('' = missing)

    def __len__(self):
        return len(self.labels)


def dense_transform(raw):
    """log(x + 1) of the integer counts. Criteo has a few negative values (column I2 goes down to
    -3); they are clipped to 0 first, since log of a negative count has no meaning."""
    return np.log1p(np.maximum(raw, 0).astype(np.float64)).astype(np.float32)


def _find_value_problems(layout, columns, path, first_line_number, candidates):
    """Bad lines found by checking label and integer columns of the candidate rows."""
    problems = {}
    labels = np.array(columns[layout.label_column], dtype=str)
    for j in np.flatnonzero(~np.isin(labels, CLICK_LABELS)):
        row = candidates[j]
        problems.setdefault(row, BadLine(
            str(path), first_line_number + row, layout.label_column + 1,
            f"label must be 0 or 1, found {labels[j]!r}"))
    for column in layout.dense_columns:
        _, bad = parse_int_column(columns[column])
        for j in bad:
            row = candidates[j]
            problems.setdefault(row, BadLine(
                str(path), first_line_number + row, column + 1,
                f"expected an integer or empty, found {columns[column][j]!r}"))
    return problems


def parse_chunk(layout, path, first_line_number, lines, tracker, row_limit=None):
    """Parse one chunk of lines; bad lines go to ``tracker`` (which raises unless skipping).
    With ``row_limit``, stop after that many good rows and ignore the lines past them."""
    rows = split_lines(lines, layout.delimiter)
    problems = {}
    for i, fields in enumerate(rows):
        problem = column_count_problem(fields, layout.num_columns, lines[i])
        if problem:
            problems[i] = BadLine(str(path), first_line_number + i, 0, problem)
    while True:
        candidates = [i for i in range(len(rows)) if i not in problems]
        columns = list(zip(*(rows[i] for i in candidates))) if candidates else \
            [()] * layout.num_columns
        found = _find_value_problems(layout, columns, path, first_line_number, candidates)
        if not found:
            break
        problems.update(found)

    last_line = len(rows) - 1
    if row_limit is not None and len(candidates) >= row_limit:
        last_line = candidates[row_limit - 1] if row_limit > 0 else -1
        candidates = candidates[:row_limit]
        columns = [column[:row_limit] for column in columns]
    for i in sorted(problems):
        if i <= last_line:
            tracker.report(problems[i])

    labels = np.array(columns[layout.label_column], dtype=str).astype(np.float32)
    dense = np.empty((len(candidates), len(layout.dense_columns)), dtype=np.float32)
    for k, column in enumerate(layout.dense_columns):
        raw, _ = parse_int_column(columns[column])
        dense[:, k] = dense_transform(raw)
    categorical = [list(columns[column]) for column in layout.categorical_columns]
    return ParsedChunk(labels, dense, categorical)


def check_header(layout, path):
    if layout.header is None:
        return 0
    with open(path, "r", encoding="utf-8", errors="replace") as f:
        first = f.readline().rstrip("\r\n")
    found = tuple(first.split(layout.delimiter))
    if found != tuple(layout.header):
        raise DataFormatError(
            f"{path}:1: expected the {layout.name} header "
            f"{layout.delimiter.join(layout.header)!r}, found {first[:200]!r}")
    return 1


class ChunkReader:
    """The file in chunks of complete lines (bytes, cut after a newline), header skipped, with a
    progress bar over the bytes read. The caller keeps the line numbers (1-based, counting the
    header): a chunk the native encoder takes is one row per line ('\\n' ends), while the Python
    parser's ``python_lines`` also end a line at a lone carriage return."""

    def __init__(self, layout, path, chunk_bytes, progress, description):
        self.path, self.chunk_bytes = path, chunk_bytes
        self.skip = check_header(layout, path)
        self.first_line = 1 + self.skip
        self.bar = tqdm(total=path.stat().st_size, unit="B", unit_scale=True, desc=description,
                        disable=not progress, file=sys.stderr, mininterval=1.0)

    def __iter__(self):
        with self.bar, open(self.path, "rb") as f:
            for _ in range(self.skip):
                header = f.readline()
                if b"\r" in header.rstrip(b"\r\n"):
                    raise DataFormatError(f"{self.path}:1: the header ends in a lone carriage "
                                          "return (old Mac line ends); convert the file to \\n "
                                          "line ends first")
                self.bar.update(len(header))
            carry = b""
            while True:
                block = f.read(self.chunk_bytes)
                if not block:
                    break
                self.bar.update(len(block))
                cut = block.rfind(b"\n")
                if cut < 0:
                    carry += block
                    continue
                text, carry = carry + block[:cut + 1], block[cut + 1:]
                yield text
            if carry:
                yield carry  # the last line, without its newline


def python_lines(text):
    """A chunk's lines as the text reader of the Python path sees them: decoded (invalid bytes
    replaced), universal newlines, each line keeping its newline (the last one may lack it)."""
    return list(io.StringIO(text.decode("utf-8", errors="replace"), newline=None))


def click_log_encoder(layout):
    from ... import _C  # imported here so that hetu.data stays importable without the build
    return _C.ClickLogEncoder(layout.delimiter, layout.num_columns, layout.label_column,
                              list(layout.dense_columns), list(layout.categorical_columns))


def count_values(layout, path, encoder, tracker, rows, chunk_bytes, progress, vocabulary=True):
    """Pass 1: the number of good rows (at most ``rows``), each field's values counted in
    ``encoder`` (with ``vocabulary``; hashed ids only count the rows). Plainly clean chunks are
    counted natively; any other chunk is parsed by ``parse_chunk``, which reports its bad lines."""
    what = "count" if vocabulary else "check"
    reader = ChunkReader(layout, path, chunk_bytes, progress, f"{layout.name} pass 1/2 ({what})")
    count_chunk = encoder.count_chunk if vocabulary else encoder.check_chunk
    num_rows, line_number = 0, reader.first_line
    for text in reader:
        remaining = -1 if rows is None else rows - num_rows
        taken = count_chunk(text, remaining)
        if taken >= 0:
            # every line taken is a row; fewer lines than the chunk's only at the row limit
            line_number += taken
        else:
            lines = python_lines(text)
            chunk = parse_chunk(layout, path, line_number, lines, tracker, None if rows is None else remaining)
            for field, values in enumerate(chunk.categorical if vocabulary else ()):
                encoder.count_values(field, values)
            taken, line_number = len(chunk), line_number + len(lines)
        num_rows += taken
        if rows is not None and num_rows >= rows:
            break
    return num_rows


def prepare_table(layout, input_path, output_dir, *, rows=None, min_count=1,
                  skip_bad_lines=False, val_fraction=0.1, shuffle_seed=None,
                  chunk_bytes=1 << 24, overwrite=False, progress=True, log=None, ids="indexed"):
    """Read ``input_path`` and write a dataset folder at ``output_dir``; returns its path.
    ``ids="hashed"``: each categorical value becomes its key (keys.py; the field index is the
    categorical field's, 0 for the first), with no vocabulary, offsets or min-count."""
    log = log if log is not None else sys.stderr
    path = require_input_file(input_path)
    hashed = check_ids(ids) == "hashed"
    if min_count < 1:
        raise ValueError(f"min_count must be >= 1, got {min_count}")
    if hashed and min_count != 1:
        raise ValueError(f"hashed ids keep every value: min_count must be 1, got {min_count}")
    if rows is not None and rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    tracker = BadLineTracker(skip_bad_lines, stream=log)
    encoder = click_log_encoder(layout)
    num_rows = count_values(layout, path, encoder, tracker, rows, chunk_bytes, progress,
                            vocabulary=not hashed)
    if num_rows == 0:
        raise DataFormatError(f"{path}: no usable rows")
    field_sizes = None if hashed else encoder.build(min_count)
    offsets = None if hashed else store.field_offsets(field_sizes)
    train_rows, val_rows = store.contiguous_split(num_rows, val_fraction)

    with store.atomic_directory(output_dir, overwrite=overwrite) as tmp_dir:
        write_encoded(layout, path, tmp_dir, num_rows, encoder, offsets, rows, chunk_bytes,
                      progress, shuffle_seed)
        if not hashed:
            vocabulary.write(tmp_dir, {k: v for f in range(len(layout.field_names)) for k, v in vocabulary.field_arrays(
                f, encoder.values(f), offsets[f] + 1 + np.arange(field_sizes[f] - 1),
                missing=offsets[f] + MISSING_OR_RARE_ID).items()})
        summary = tracker.summary(path)
        source = {
            "kind": layout.name, "path": str(path.resolve()), "row_limit": rows,
            "min_count": int(min_count), "skip_bad_lines": bool(skip_bad_lines),
            "bad_lines_skipped": tracker.skipped, "truncated": tracker.truncated,
        }
        dense_encoding = "log(max(x, 0) + 1), missing -> 0"
        encoding = {"categorical": "key of the column's UTF-8 text (empty: missing)",
                    "dense": dense_encoding} if hashed else {
            "missing_or_rare_local_id": MISSING_OR_RARE_ID,
            "local_id_order": "descending count, ties by value",
            "dense": dense_encoding,
        }
        store.write_meta(tmp_dir, store.dataset_meta(
            layout.name, num_rows, len(layout.dense_columns), layout.field_names, field_sizes,
            train_rows, val_rows, val_fraction, shuffle_seed, source,
            label={"kind": "click", "values": [0.0, 1.0]},
            dense_names=list(layout.dense_names), encoding=encoding, ids=ids,
            **({} if hashed else {"extra_files": {vocabulary.VOCABULARY_FILE: "each field's values' keys -> ids"}})))
    if summary:
        print(summary, file=log)
    return Path(output_dir)


def write_encoded(layout, path, out_dir, num_rows, encoder, offsets, rows, chunk_bytes,
                  progress, shuffle_seed):
    """Pass 2: encode every good row into memmapped arrays (then shuffle them if asked).
    ``offsets`` None: hashed ids, each value's key."""
    suffix = ".unshuffled.npy" if shuffle_seed is not None else ".npy"
    names = ["dense" + suffix, "sparse" + suffix, "labels" + suffix]
    num_dense = len(layout.dense_columns)
    dense = store.create_array(out_dir, names[0], np.float32, (num_rows, num_dense))
    sparse = store.create_array(out_dir, names[1], np.int64, (num_rows, len(layout.field_names)))
    labels = store.create_array(out_dir, names[2], np.float32, (num_rows, 1))
    quiet = BadLineTracker(skip_bad_lines=True, max_reported=0)  # pass 1 already reported
    if offsets is None:
        encode_chunk = encoder.hash_chunk
        encode_values = hash_values
    else:
        offsets = [int(offset) for offset in offsets]

        def encode_chunk(text, remaining):
            return encoder.encode_chunk(text, remaining, offsets)

        def encode_values(f, values):
            return encoder.encode_values(f, values) + offsets[f]
    reader = ChunkReader(layout, path, chunk_bytes, progress, f"{layout.name} pass 2/2 (encode)")
    start, line_number = 0, reader.first_line
    for text in reader:
        remaining = num_rows - start
        encoded = encode_chunk(text, remaining)
        if encoded is not None:
            n, chunk_labels, raw_dense, chunk_sparse = encoded
            stop = start + n
            dense[start:stop] = dense_transform(raw_dense)
            labels[start:stop, 0] = chunk_labels
            sparse[start:stop] = chunk_sparse
            line_number += n
        else:
            lines = python_lines(text)
            chunk = parse_chunk(layout, path, line_number, lines, quiet, remaining)
            stop = start + len(chunk)
            dense[start:stop] = chunk.dense
            labels[start:stop, 0] = chunk.labels
            for f, values in enumerate(chunk.categorical):
                sparse[start:stop, f] = encode_values(f, values)
            line_number += len(lines)
        start = stop
        if start >= num_rows:
            break
    if start != num_rows:
        raise DataFormatError(f"{path}: changed while being read ({num_rows} rows in pass 1, "
                              f"{start} in pass 2)")
    store.flush_arrays(dense, sparse, labels)
    if shuffle_seed is not None:
        shuffle_into_place(out_dir, [dense, sparse, labels], names, shuffle_seed)


def shuffle_into_place(out_dir, arrays, unshuffled_names, shuffle_seed):
    permutation = np.random.default_rng(shuffle_seed).permutation(len(arrays[0]))
    permute_into_place(out_dir, arrays, unshuffled_names, permutation)


def permute_into_place(out_dir, arrays, unshuffled_names, permutation):
    """Writes each array's rows in `permutation` order under its name without ".unshuffled"
    and deletes the unshuffled file."""
    for array, name in zip(arrays, unshuffled_names):
        final = store.create_array(out_dir, name.replace(".unshuffled", ""), array.dtype,
                                   array.shape)
        store.permute_rows(array, final, permutation)
        store.flush_arrays(final)
        del final
        (Path(out_dir) / name).unlink()
