"""Reading delimited text files in chunks, with bad lines located by file, line and column."""
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np


class DataFormatError(ValueError):
    """Input that cannot be parsed; the message names file, line and column."""


@dataclass(frozen=True)
class BadLine:
    path: str
    line_number: int  # 1-based, counting a header line if there is one
    column: int       # 1-based; 0 when the line as a whole is wrong (e.g. column count)
    reason: str

    def describe(self):
        where = f"{self.path}:{self.line_number}"
        if self.column:
            where += f": column {self.column}"
        return f"{where}: {self.reason}"


def require_input_file(path):
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"input file not found: {path}")
    if not path.is_file():
        raise FileNotFoundError(f"input is not a regular file: {path}")
    return path


def count_lines(path):
    """Line count by scanning bytes (for the progress bar total; cheap next to parsing)."""
    count = 0
    with open(path, "rb") as f:
        while True:
            block = f.read(1 << 24)
            if not block:
                break
            count += block.count(b"\n")
    return count


def iter_line_chunks(path, chunk_lines, skip_lines=0):
    """Yield (first_line_number, lines) with up to ``chunk_lines`` lines each.

    Lines keep their trailing newline so a caller can tell that the final line was cut off
    (no newline at end of file and the wrong number of columns = truncated file)."""
    with open(path, "r", encoding="utf-8", errors="replace", newline=None) as f:
        for _ in range(skip_lines):
            f.readline()
        line_number = skip_lines + 1
        chunk = []
        for line in f:
            chunk.append(line)
            if len(chunk) == chunk_lines:
                yield line_number, chunk
                line_number += len(chunk)
                chunk = []
        if chunk:
            yield line_number, chunk


def split_lines(lines, delimiter):
    return [line.rstrip("\r\n").split(delimiter) for line in lines]


def _bad_value_indices(values, convert, allow_empty):
    bad = []
    for index, value in enumerate(values):
        if allow_empty and value == "":
            continue
        try:
            convert(value)
        except (ValueError, OverflowError):
            bad.append(index)
    return bad


def parse_int_column(values, allow_empty=True):
    """(int64 array, []) for decimal strings ('' -> 0 when allowed), or (None, bad indices).

    The fast path converts in one C-level pass; only a chunk that fails it is walked value by
    value to find every culprit."""
    try:
        if allow_empty:
            converted = (int(v) if v else 0 for v in values)
        else:
            converted = map(int, values)
        return np.fromiter(converted, dtype=np.int64, count=len(values)), []
    except (ValueError, OverflowError):
        pass
    bad = _bad_value_indices(values, lambda v: np.int64(int(v)), allow_empty)
    return None, bad or [0]


def parse_float_column(values):
    """(float64 array, []) for numeric strings, or (None, bad indices)."""
    try:
        return np.array(values, dtype=str).astype(np.float64), []
    except ValueError:
        pass
    bad = _bad_value_indices(values, float, allow_empty=False)
    return None, bad or [0]


class BadLineTracker:
    """Either raises on the first bad line or counts skipped ones (``--skip-bad-lines``).

    Only the first few skipped lines are printed, so a badly broken file does not flood the log."""

    def __init__(self, skip_bad_lines, max_reported=10, stream=None):
        self.skip_bad_lines = skip_bad_lines
        self.max_reported = max_reported
        self.stream = stream if stream is not None else sys.stderr
        self.skipped = 0
        self.truncated = False

    def report(self, bad):
        if not self.skip_bad_lines:
            raise DataFormatError(bad.describe() + " (use --skip-bad-lines to skip such lines)")
        if "truncated" in bad.reason:
            self.truncated = True
        if self.skipped < self.max_reported:
            print(f"skipping bad line: {bad.describe()}", file=self.stream)
        self.skipped += 1

    def summary(self, path):
        if not self.skipped:
            return None
        text = f"{path}: skipped {self.skipped} bad line(s)"
        if self.truncated:
            text += "; the file looks truncated (its last line is cut mid-record)"
        return text


def column_count_problem(fields, expected_columns, line):
    if len(fields) == expected_columns:
        return None
    # only the last line of a file can lack its newline, so this is the cut-off final record.
    if not line.endswith("\n"):
        return (f"file truncated: last line has {len(fields)} of {expected_columns} columns "
                "and no newline (cut mid-record)")
    return f"expected {expected_columns} columns, found {len(fields)}"

