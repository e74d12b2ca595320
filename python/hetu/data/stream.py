"""Samples of a growing log (docs/design.md section 14): a directory of log files read in name
order and followed for new ones, or standard input, parsed and hashed into the samples that
``python -m hetu.data.prepare <fmt> ... --ids hashed`` writes for the same lines.

    source = StreamSource("logs/", "criteo")          # or "movielens", "schema:FILE", and "-" for stdin
    block = source.read(4096, timeout=1.0)           # a StreamBlock of 1..4096 samples, or None
    saved = block.position                           # JSON-able; StreamSource(...).seek(saved) resumes

Directory rules: regular files in name order, each read once from start to end. A file counts
once it is complete: names starting with "." or ending ".tmp"/".part" are ignored (writers write
there and rename). The reader follows the newest file while it grows, reading its lines as their
"\\n" lands (a last line without it waits), and moves on once a later file exists: a later file
ends the one before it, whose last line is then read as a line even without its "\\n". A new
file whose name sorts before one already read is an error naming both. A reader that has waited
``notice_seconds`` for the same thing (a file's last line, a new file, standard input) prints
one line on stderr saying what, again after twice as long, and so on; ``waiting_for`` says it
while it waits.

A background thread reads the files, parses and hashes them natively (``hetu._C``, the GIL
released) and puts blocks of samples in a queue of at most ``max_buffered`` samples: it waits
while the queue is full, so memory is bounded whatever the log. The native encoder
(``_C.StreamLineEncoder``) takes the plainly clean lines; any other line is parsed by the
format's Python definition (formats/streams.py: tabular.parse_chunk, movielens.parse_ratings_chunk,
or the schema's), which words the errors, as prepare does. A bad line stops the reader with an error naming file and line
(read() raises it after the samples before it), or, with ``skip_bad_lines``, is skipped and
counted in ``bad_lines`` (``bad_lines_by_file``): the first few are printed, and each file's
count once the reader leaves it. Messages quote a line printably (other characters escaped, at
most 100 of them); ``report=False`` (every training worker but the first) prints none.

Formats: ``criteo`` (Kaggle train.txt), ``movielens`` (ratings ``user::item::rating::timestamp``,
tab separated, or ratings.csv with its header; label rating >= 4; side features from ``users``
and ``items`` files read at start), ``schema:FILE`` (any delimited log; formats/streams.py),
``parquet:FILE`` (Parquet files by the same schema file; formats/parquet.py), each looked up in
hetu.data.formats. A Parquet file is read whole, once complete (a file without its footer yet is
waited for, named in the notices); its position's offset and line count rows.
"""
import bisect
import dataclasses
import os
import select
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import formats
from .formats.samples import ignored_name
from .formats.textio import DataFormatError

STDIN = "-"
STDIN_NAME = "<stdin>"   # in messages
CHUNK_BYTES = 1 << 20
MAX_REPORTED_BAD_LINES = 5
QUOTED_CHARACTERS = 100    # of a bad line's reason, in messages
NOTICE_SECONDS = 5.0       # a reader waiting this long for the same thing says so (then at 2x, 4x, ...)


@dataclass
class StreamBlock:
    """Samples in stream order, one row each: ``dense`` float32 [n, num_dense], ``sparse`` int64
    [n, slots] (keys; -1 pads a bag), ``labels`` float32 [n, 1], ``arrival`` float64 [n] (the
    time.time() at which the sample's bytes were found in a complete file), and ``position``,
    the stream position after the block's last sample."""
    dense: np.ndarray
    sparse: np.ndarray
    labels: np.ndarray
    arrival: np.ndarray
    position: dict

    def __len__(self):
        return len(self.labels)


def make_format(fmt, users=None, items=None):
    """The parser of a stream format, looked up in the registry (hetu.data.formats): ``criteo``,
    ``movielens``, ``schema:FILE`` or ``parquet:FILE``."""
    entry, argument = formats.lookup(fmt, "stream")
    if not entry.side_files and (users is not None or items is not None):
        raise ValueError(f"users and items files are side features of the movielens format, not {fmt!r}")
    return entry.stream(argument, users, items)


class _Chunk:
    """Parsed samples of one file, with each sample's end offset and line number."""
    __slots__ = ("file", "dense", "sparse", "labels", "arrival", "offsets", "lines")

    def __init__(self, file, dense, sparse, labels, arrival, offsets, lines):
        self.file, self.dense, self.sparse, self.labels = file, dense, sparse, labels
        self.arrival, self.offsets, self.lines = arrival, offsets, lines

    def __len__(self):
        return len(self.labels)

    def split(self, k):
        """(the first k samples, the rest)."""
        cut = lambda a: (a[:k], a[k:])  # noqa: E731
        head, tail = zip(*(cut(a) for a in (self.dense, self.sparse, self.labels, self.arrival,
                                            self.offsets, self.lines)))
        return _Chunk(self.file, *head), _Chunk(self.file, *tail)


class _BoundedQueue:
    """Chunks between the reader thread and read(): at most ``capacity`` samples; a put waits
    while they would not fit. An error or the end of the input is the last item."""

    def __init__(self, capacity):
        self.capacity = capacity
        self.items = deque()
        self.samples = 0
        self.end = None          # None, or ("error", exception) / ("ended", None)
        self.closed = False
        self.cond = threading.Condition()

    def put(self, chunk):
        with self.cond:
            while not self.closed and self.samples + len(chunk) > self.capacity:
                self.cond.wait()
            if self.closed:
                return False
            self.items.append(chunk)
            self.samples += len(chunk)
            self.cond.notify_all()
            return True

    def finish(self, kind, error=None):
        with self.cond:
            if self.end is None:
                self.end = (kind, error)
            self.cond.notify_all()

    def close(self):
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    def take(self, n, timeout):
        """Up to n samples' chunks (the last one cut to fit): waits up to ``timeout`` seconds for
        the first. [] when none came; raises the reader's error once its samples are taken."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while not self.items and self.end is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                self.cond.wait(left)
            taken, count = [], 0
            while self.items and count < n:
                chunk = self.items.popleft()
                if count + len(chunk) > n:
                    chunk, rest = chunk.split(n - count)
                    self.items.appendleft(rest)
                taken.append(chunk)
                count += len(chunk)
            self.samples -= count
            self.cond.notify_all()
            if not taken and self.end is not None and self.end[0] == "error":
                raise self.end[1]
            return taken


class StreamSource:
    """Samples of a growing log: files of DIR in name order (or stdin for "-"), parsed and hashed in
    C++ on a background thread into a bounded queue."""

    def __init__(self, path, fmt, *, schema=None, users=None, items=None, skip_bad_lines=False,
                 poll_seconds=0.2, max_buffered=1 << 20, notice_seconds=NOTICE_SECONDS, report=True):
        if schema is not None:
            if fmt not in (None, "schema", "parquet"):
                raise ValueError(f"a schema file goes with the schema or parquet format, not {fmt!r}")
            fmt = f"{fmt or 'schema'}:{schema}"
        if max_buffered < 1:
            raise ValueError(f"max_buffered must be >= 1 sample, got {max_buffered}")
        if poll_seconds <= 0:
            raise ValueError(f"poll_seconds must be > 0, got {poll_seconds}")
        if notice_seconds <= 0:
            raise ValueError(f"notice_seconds must be > 0, got {notice_seconds}")
        self.path = path if path == STDIN else Path(path)
        if self.path != STDIN and not self.path.is_dir():
            raise FileNotFoundError(f"stream directory not found: {self.path}")
        self.format = make_format(fmt, users, items)
        if self.path == STDIN and getattr(self.format, "whole_files", False):
            raise ValueError(f"a {fmt} stream reads the files of a directory, not standard input")
        self.fields = self.format.fields
        self.skip_bad_lines = bool(skip_bad_lines)
        self.poll_seconds = float(poll_seconds)
        self.max_buffered = int(max_buffered)
        self.bad_lines = 0
        self.bad_lines_by_file = {}   # name -> lines skipped
        # report: whether this source prints its notices (waits, skipped lines): the first
        # worker's does, where every worker reads the same stream.
        self.report = bool(report)
        self.notice_seconds = float(notice_seconds)
        self.waiting_for = None       # what the reader waits for, while it waits (else None)
        self._queue = _BoundedQueue(self.max_buffered)
        self._start = {"file": None, "offset": 0, "line": 0, "samples": 0}
        self._position = dict(self._start)
        self._thread = None
        self._stop = threading.Event()

    # -- the training thread's side --------------------------------------------------------

    def read(self, n, timeout):
        """A StreamBlock of 1..n samples in stream order, or None if none arrived within
        ``timeout`` seconds (or the input ended: see ``ended``). Raises the reader's error (a bad
        line, a file out of order) once the samples before it are read."""
        if n < 1:
            raise ValueError(f"read: n must be >= 1, got {n}")
        self._ensure_started()
        chunks = self._queue.take(int(n), float(timeout))
        if not chunks:
            return None
        last = chunks[-1]
        count = sum(len(c) for c in chunks)
        self._position = {"file": last.file, "offset": int(last.offsets[-1]),
                          "line": int(last.lines[-1]), "samples": self._position["samples"] + count}
        join = (lambda arrays: arrays[0]) if len(chunks) == 1 else np.concatenate
        return StreamBlock(
            dense=join([c.dense for c in chunks]), sparse=join([c.sparse for c in chunks]),
            labels=join([c.labels for c in chunks]).reshape(-1, 1),
            arrival=join([c.arrival for c in chunks]), position=dict(self._position))

    def position(self):
        """The position after the last sample read: {"file": name in DIR ("-" for stdin; None
        before any sample), "offset": bytes of it consumed, "line": its last line consumed,
        "samples": samples read so far}."""
        return dict(self._position)

    def seek(self, position):
        """Before any read: continue after ``position`` (a position() or a block's): files that
        sort before its file are skipped, its file continues at its offset. On stdin, the offset's
        bytes are read and dropped (the same input replayed)."""
        if self._thread is not None:
            raise RuntimeError("StreamSource.seek: only before the first read")
        missing = {"file", "offset", "line", "samples"} - set(position)
        if missing:
            raise ValueError(f"StreamSource.seek: the position lacks {sorted(missing)}: {position!r}")
        if position["file"] is not None and (self.path == STDIN) != (position["file"] == STDIN):
            raise ValueError(f"StreamSource.seek: position {position!r} is not of {self.path}")
        self._start = {"file": position["file"], "offset": int(position["offset"]),
                       "line": int(position["line"]), "samples": int(position["samples"])}
        self._position = dict(self._start)

    @property
    def buffered(self):
        """Samples parsed and waiting in the queue."""
        return self._queue.samples

    @property
    def idle(self):
        """Whether no data is there to read: the reader waits for some to come (a file to grow, a
        later file, more of stdin) or has stopped. False while it reads what is there (files
        listed and not yet read), so that an idle limit counts only the time without data."""
        return self._thread is None or not self._thread.is_alive() or self.waiting_for is not None

    @property
    def ended(self):
        """True once standard input ended and every sample was read (a directory never ends)."""
        q = self._queue
        return q.end is not None and q.end[0] == "ended" and not q.items

    def close(self):
        self._stop.set()
        self._queue.close()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - nothing to tell at interpreter exit
            pass

    # -- the reader thread ---------------------------------------------------------------------

    def _ensure_started(self):
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="stream-reader", daemon=True)
            self._thread.start()

    def _run(self):
        try:
            if self.path == STDIN:
                _StdinReader(self).run()
            else:
                _DirectoryReader(self).run()
        except _Stopped:
            pass
        except BaseException as error:  # noqa: BLE001 - handed to read()
            self._queue.finish("error", error)

    def _emit(self, name, where, text, offset, line, arrival, final=False):
        """Parses ``text`` (complete lines of file ``name``, ``where`` in messages, starting at
        byte ``offset``, after line ``line``; ``final``: the input's last line may lack its
        newline) into the queue, at most max_buffered lines at a time. Returns the lines
        consumed; raises the first bad line (after queueing the samples before it) unless
        skipping."""
        start, lines = 0, 0
        while start < len(text):
            parsed, bad, used, stop = self.format.parse(text, start, where, line + lines + 1,
                                                        self.max_buffered, final)
            if used == 0:
                raise AssertionError(f"{where}: the parser took no line at byte {offset + start}")
            if bad and not self.skip_bad_lines:
                keep = parsed.line_index < bad[0].line_number - (line + lines + 1)
                self._put(name, parsed, keep, offset, line + lines, arrival)
                raise DataFormatError(quoted(bad[0]) + " (skip and count such lines: skip_bad_lines=True, "
                                      "--skip-bad-lines on the command line)")
            for b in bad:   # counted before the samples after them can be read
                if self.bad_lines < MAX_REPORTED_BAD_LINES:
                    self._say(f"skipping bad line: {quoted(b)}" +
                              (" (the next are counted, not printed)" if self.bad_lines + 1 == MAX_REPORTED_BAD_LINES
                               else ""))
                self.bad_lines += 1
                self.bad_lines_by_file[name] = self.bad_lines_by_file.get(name, 0) + 1
            self._put(name, parsed, None, offset, line + lines, arrival)
            start, lines = stop, lines + used
        return lines

    def _say(self, text):
        if self.report:
            print(f"stream: {text}", file=sys.stderr, flush=True)

    def _file_done(self, name, where):
        """The reader leaves file `name`: its count of bad lines, if any."""
        if self.bad_lines_by_file.get(name):
            self._say(f"{where}: {self.bad_lines_by_file[name]} bad lines skipped")

    def _put(self, name, parsed, keep, offset, line, arrival):
        if keep is not None:
            parsed = parsed.select(keep)
        if len(parsed.labels) == 0:
            return
        offsets = offset + parsed.ends
        chunk = _Chunk(name, parsed.dense, parsed.sparse, parsed.labels, arrival(offsets), offsets,
                       line + 1 + parsed.line_index)
        if not self._queue.put(chunk):
            raise _Stopped()


class _Stopped(Exception):
    """close() was called: the reader thread ends quietly."""


def lines_end(data, lines):
    """The offset just after the first ``lines`` lines of ``data`` (all of it when it holds fewer)."""
    end = 0
    for _ in range(lines):
        cut = data.find(b"\n", end)
        if cut < 0:
            return len(data)
        end = cut + 1
    return end


def printable(text, limit=QUOTED_CHARACTERS):
    """`text` with every character that does not print escaped (\\x00, \\u200b), cut to `limit`."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def quoted(bad):
    """A BadLine's description for a message: its reason printable and cut (the data may be binary)."""
    return dataclasses.replace(bad, reason=printable(bad.reason)).describe()


class _Notice:
    """What a reader waits for: one line after `source.notice_seconds` of waiting for the same
    thing, then after twice as long, and so on; anything read starts afresh."""

    def __init__(self, source):
        self.source, self.what = source, None

    def waiting(self, what):
        now = time.monotonic()
        if what != self.what:
            self.what, self.since, self.due = what, now, now + self.source.notice_seconds
            self.source.waiting_for = what
        elif now >= self.due:
            waited = self.due - self.since
            self.source._say(f"waiting {waited:g} s for {what}")
            self.due = self.since + 2 * waited

    def done(self):
        self.what = self.source.waiting_for = None


class _DirectoryReader:
    """Follows DIR: lists it every poll, reads its complete files in name order."""

    def __init__(self, source):
        self.source, self.dir = source, source.path
        self.found = {}          # name -> time.time() of the listing that first saw it
        self.names = []          # the names found, ascending (new ones sort last, nearly always)
        self.current = None      # the file being read (or last read)
        self.last_listing = 0.0
        start = source._start
        self.skip_before = start["file"]
        self.notice = _Notice(source)

    def eligible(self, entry):
        return not ignored_name(entry.name) and entry.is_file(follow_symlinks=True)

    def list(self):
        """Lists the folder once: each name not seen before is found now. One pass over the
        entries (the seen ones are only looked up), so a folder of N files costs O(N) a listing,
        and the reader lists once per poll, not once per file."""
        now = time.time()
        new = sorted(e.name for e in os.scandir(self.dir) if e.name not in self.found and self.eligible(e))
        # after the first listing, a new file must sort after the one read (or sought to)
        passed = (self.current or self.skip_before) if self.last_listing else None
        for name in new:
            if passed is not None and name < passed:
                raise DataFormatError(
                    f"{self.dir}: new file {name!r} sorts before {passed!r}, already read "
                    "(files are read in name order: name new files so that they sort last)")
            self.found[name] = now
            if not self.names or name > self.names[-1]:
                self.names.append(name)
            else:
                bisect.insort(self.names, name)
        self.last_listing = now

    def next_file(self):
        """The first listed file after the current one (or at the seek position), or None."""
        if self.current is None:
            at = 0 if self.skip_before is None else bisect.bisect_left(self.names, self.skip_before)
        else:
            at = bisect.bisect_right(self.names, self.current)
        return self.names[at] if at < len(self.names) else None

    def later_file_exists(self, name):
        """Whether a file sorting after `name` exists: one listed already, else one a listing
        finds now."""
        if not self.names or self.names[-1] <= name:
            self.list()
        return bool(self.names) and self.names[-1] > name

    def wait(self, what):
        self.notice.waiting(what)
        if self.source._stop.wait(self.source.poll_seconds):
            raise _Stopped()

    def run(self):
        self.list()
        while True:
            name = self.next_file()
            if name is None:
                after = self.current or self.skip_before
                self.wait(f"a file in {self.dir}" + (f" after {after}" if after else ""))
                self.list()
                continue
            if self.source._stop.is_set():
                raise _Stopped()
            start = self.source._start
            resume = start["file"] == name
            self.current = name
            self.notice.done()
            read = self.read_whole_file if getattr(self.source.format, "whole_files", False) else self.read_file
            read(name, start["offset"] if resume else 0, start["line"] if resume else 0)
            self.source._file_done(name, str(self.dir / name))

    def read_file(self, name, offset, line):
        """Reads ``name`` from ``offset`` until a later file exists and every byte of it is read:
        a later file ends this one, whose last line then counts without its "\\n"."""
        source, path = self.source, self.dir / name
        growth = [(os.stat(path).st_size, self.found[name])]  # (size, time it was seen)

        def arrival(offsets):
            sizes = np.array([s for s, _ in growth], dtype=np.int64)
            times = np.array([t for _, t in growth], dtype=np.float64)
            return times[np.minimum(np.searchsorted(sizes, offsets), len(times) - 1)]

        def emit(text, offset, line, final=False):
            if offset + len(text) > growth[-1][0]:
                growth.append((os.fstat(f.fileno()).st_size, time.time()))
            return source._emit(name, str(path), text, offset, line, arrival, final)

        unended = f"the \\n ending the last line of {path} (or a file after it, which ends it)"
        with open(path, "rb") as f:
            first = f.readline()
            while not first.endswith(b"\n"):   # the header or first line decides the layout
                ended = self.later_file_exists(name)
                f.seek(0)
                first = f.readline()
                if ended or first.endswith(b"\n"):
                    break   # a later file ends this one: its first line is all there is
                self.wait(unended if first else f"{path} to get a line (or a file after it)")
            if not first:
                return   # an empty file, ended by a later one
            self.notice.done()
            header = int(source.format.begin_file(first.decode("utf-8", errors="replace"), str(path)))
            if offset == 0 and header:
                offset, line = self.header_end(f, name, header), header
            f.seek(offset)
            carry = b""
            ended = False   # a later file exists: what this one holds now is all it will hold
            while True:
                if time.time() - self.last_listing >= source.poll_seconds:
                    self.list()
                block = f.read(CHUNK_BYTES)
                if block:
                    self.notice.done()
                    data = carry + block
                    cut = data.rfind(b"\n")
                    if cut < 0:
                        carry = data
                        continue
                    text, carry = data[:cut + 1], data[cut + 1:]
                    line += emit(text, offset, line)
                    offset += len(text)
                    continue
                if ended:   # every byte read: the last line without its "\n" is a line
                    if carry:
                        emit(carry, offset, line, final=True)
                    return
                # at the end of what is there: once a later file exists, read what is left once more
                if self.later_file_exists(name):
                    ended = True
                    continue
                self.wait(unended if carry else f"{path} to grow, or a file after it in {self.dir}")
                size = os.fstat(f.fileno()).st_size
                if size > growth[-1][0]:
                    growth.append((size, time.time()))

    def header_end(self, f, name, lines):
        """The offset after the first ``lines`` lines of file ``name`` (open as ``f``), the header
        a format skips: waits for them to land, unless a later file ends this one first."""
        while True:
            f.seek(0)
            data = b"".join(f.readline() for _ in range(lines))
            if data.count(b"\n") >= lines or self.later_file_exists(name):
                return len(data)
            self.wait(f"the {lines} header lines of {self.dir / name} (or a file after it)")

    def read_whole_file(self, name, offset, line):
        """Reads ``name``, a file of a format read whole (parquet.py), from its row ``offset``
        once it is complete: until then (a file written in place, still without its footer) the
        reader waits for it, naming it."""
        source, path = self.source, self.dir / name
        while True:
            opened, why = source.format.open_file(path)
            if opened is not None:
                break
            self.wait(f"{path} to be complete ({why})")
        self.notice.done()
        now = time.time()
        for parsed in source.format.file_samples(path, offset, source.max_buffered):
            source._put(name, parsed, None, 0, offset, lambda rows: np.full(len(rows), now))


class _StdinReader:
    """Reads standard input until it ends; a sample's arrival is when its bytes were read."""

    def __init__(self, source):
        self.source = source
        self.fd = sys.stdin.fileno()
        self.notice = _Notice(source)

    def read(self):
        """The next bytes of stdin (b"" at its end), polling so that close() is seen."""
        while True:
            ready, _, _ = select.select([self.fd], [], [], self.source.poll_seconds)
            if self.source._stop.is_set():
                raise _Stopped()
            if ready:
                self.notice.done()
                return os.read(self.fd, CHUNK_BYTES)
            self.notice.waiting(f"more of {STDIN_NAME}")

    def run(self):
        source = self.source
        start = source._start
        first = b""
        while not first.endswith(b"\n"):
            block = self.read()
            if not block:
                break
            first += block
        cut = first.find(b"\n")
        header = source.format.begin_file(first[:cut + 1].decode("utf-8", errors="replace"), STDIN_NAME)
        carry, offset, line, skip = first, 0, 0, 0
        if start["file"] == STDIN:
            skip, line = start["offset"], start["line"]
        elif header:
            while first.count(b"\n") < header:
                block = self.read()
                if not block:
                    break
                first += block
            carry, skip, line = first, lines_end(first, int(header)), int(header)
        if skip:
            while len(carry) < skip:
                block = self.read()
                if not block:
                    break
                carry += block
            carry, offset = carry[skip:], skip
        while True:
            cut = carry.rfind(b"\n")
            if cut >= 0:
                text, carry = carry[:cut + 1], carry[cut + 1:]
                now = time.time()
                line += source._emit(STDIN, STDIN_NAME, text, offset, line, lambda o: np.full(len(o), now))
                offset += len(text)
            block = self.read()
            if not block:
                break
            carry += block
        if carry:
            now = time.time()
            source._emit(STDIN, STDIN_NAME, carry, offset, line, lambda o: np.full(len(o), now), final=True)
        source._file_done(STDIN, STDIN_NAME)
        source._queue.finish("ended")
