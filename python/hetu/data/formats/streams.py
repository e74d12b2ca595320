"""The formats of a stream (stream.py): each turns a chunk of complete lines into samples with
hashed keys (keys.py), exactly as ``prepare <fmt> --ids hashed`` encodes the same lines.

A format has ``fields`` (hetu.data.Fields, num_embeddings 0: the keys are hashed),
``begin_file(first_line, path)`` (the header lines to skip; a file's first line may also tell
its layout) and ``parse(text, path, first_line_number)`` -> (ParsedLines, bad lines in line
order). Plainly clean chunks are parsed natively with the GIL released; any other chunk by the
format's Python definition, which words the errors.

Schema files (``schema:FILE``), YAML:

    delimiter: "\\t"            # one or more characters (default tab)
    header: 0                  # lines skipped at the start of each file (default 0)
    columns:                   # every column of a line, in order
      - {name: click, role: label, threshold: 0.5}   # label 1 when the number >= threshold
      - {name: price, role: dense, transform: log1p} # log1p of max(x, 0), or none; empty -> 0
      - {name: user, role: categorical}              # the column's text hashed
      - {name: tags, role: bag, separator: "|", slots: 8}   # up to `slots` values, -1 padded
      - {role: ignore}

A categorical or bag column is field k of the samples, k counting those columns in order; its
key is key_hash(k, the value's UTF-8 bytes); an empty categorical column is the empty value, an
empty bag column no value.
"""
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..keys import hash_values
from ..schema import Fields
from ..store import BAG_PADDING
from . import criteo, movielens
from .movielens_side import BAG_FIELDS, encode_side_features, read_items, read_users
from .tabular import click_log_encoder, dense_transform, parse_chunk
from .textio import BadLine, BadLineTracker, DataFormatError, column_count_problem

MOVIELENS_THRESHOLD = 4.0   # label 1 when rating >= 4, as prepare movielens


@dataclass
class ParsedLines:
    """A chunk's samples; for each, the index of its line (from the chunk's first) and the byte
    offset just after that line in the text."""
    dense: np.ndarray       # float32 [n, num_dense]
    sparse: np.ndarray      # int64 [n, slots]
    labels: np.ndarray      # float32 [n]
    line_index: np.ndarray  # int64 [n]
    ends: np.ndarray        # int64 [n]

    def select(self, rows):
        return ParsedLines(self.dense[rows], self.sparse[rows], self.labels[rows],
                           self.line_index[rows], self.ends[rows])

    @classmethod
    def concatenate(cls, parts):
        if len(parts) == 1:
            return parts[0]
        return cls(*(np.concatenate([getattr(p, name) for p in parts])
                     for name in ("dense", "sparse", "labels", "line_index", "ends")))


class BadLineRecorder(BadLineTracker):
    """A tracker that keeps every bad line a Python parser reports, for the reader to act on."""

    def __init__(self):
        super().__init__(skip_bad_lines=True, max_reported=0)
        self.bad = []

    def report(self, bad):
        self.bad.append(bad)


def python_parse(text, path, first_line, parse_lines):
    """Lines by a format's Python definition: ``parse_lines(lines, recorder)`` gets the lines of
    ``text`` decoded as prepare's Python parser reads them (each keeping its newline) and returns
    the (dense, sparse, labels) of the good ones, reporting the others to ``recorder``. A
    stream's lines end at "\\n" (or "\\r\\n"): a line with a carriage return inside is bad."""
    raw = text.split(b"\n")
    ended = raw[-1] == b""
    if ended:
        raw.pop()
    lines, inner_cr = [], set()
    for i, line in enumerate(raw):
        decoded = line.decode("utf-8", errors="replace")
        body = decoded[:-1] if decoded.endswith("\r") else decoded
        if "\r" in body:
            inner_cr.add(i)
            body = body.replace("\r", " ")
        lines.append(body + ("\n" if ended or i + 1 < len(raw) else ""))
    recorder = BadLineRecorder()
    dense, sparse, labels = parse_lines(lines, recorder)
    bad = {}
    for b in recorder.bad:
        bad.setdefault(b.line_number - first_line, b)
    good = np.array([i for i in range(len(lines)) if i not in bad], dtype=np.int64)
    for i in inner_cr:
        bad.setdefault(i, BadLine(path, first_line + i, 0, "a carriage return inside the line"))
    ends = np.cumsum([len(line) + 1 for line in raw], dtype=np.int64)
    ends[-1:] = np.minimum(ends[-1:], len(text))
    parsed = ParsedLines(dense, sparse, np.asarray(labels, np.float32), good, ends[good])
    return parsed.select(~np.isin(good, list(inner_cr))), [bad[i] for i in sorted(bad)]


class NativeFormat:
    """A format whose plainly clean lines hetu._C.StreamLineEncoder encodes (``native``), each
    other line going to the Python definition ``parse_lines(lines, path, first_line, recorder)``.
    ``log1p_dense``: the dense columns that dense_transform takes (the others are cast)."""
    native = None
    log1p_dense = ()

    def begin_file(self, first_line, path):
        return 0

    def parse(self, text, start, path, first_line, max_lines, final):
        """(ParsedLines, bad lines, lines used, the byte after them) of up to ``max_lines``
        lines of text[start:] (all complete but the last, when ``final``)."""
        parts, bad, used, pos = [], [], 0, start
        while pos < len(text) and used < max_lines:
            n, labels, dense, sparse, ends = self.native.encode(text, pos, max_lines - used, final)
            if n:
                parts.append(ParsedLines(self.finish_dense(dense[:n]), sparse[:n], labels[:n],
                                         used + np.arange(n, dtype=np.int64), ends[:n]))
                used, pos = used + n, int(ends[n - 1])
            if n == len(labels):   # every line it could see (a cut last line waits)
                break
            end = text.find(b"\n", pos)
            end = len(text) if end < 0 else end + 1
            parsed, line_bad = python_parse(text[pos:end], path, first_line + used, lambda lines, recorder:
                                            self.parse_lines(lines, path, first_line + used, recorder))
            parsed.line_index += used
            parsed.ends += pos
            parts.append(parsed)
            bad += line_bad
            used, pos = used + 1, end
        empty = ParsedLines(np.zeros((0, self.fields.num_dense), np.float32),
                            np.zeros((0, sum(self.fields.slots)), np.int64), np.zeros(0, np.float32),
                            np.zeros(0, np.int64), np.zeros(0, np.int64))
        return ParsedLines.concatenate(parts or [empty]), bad, used, pos

    def finish_dense(self, raw):
        """float32 dense features from the native doubles, exactly as the Python definition."""
        dense = raw.astype(np.float32)
        for k in self.log1p_dense:
            dense[:, k] = dense_transform(raw[:, k])
        return dense


def native_encoder(delimiter, columns, fields):
    from ... import _C  # imported here so that hetu.data stays importable without the build
    return _C.StreamLineEncoder(delimiter, columns, fields.num_dense, sum(fields.slots))


class CriteoFormat(NativeFormat):
    """Criteo's train.txt (criteo.LAYOUT): the label, 13 integers (log1p of max(x, 0)), 26 keys."""

    def __init__(self):
        self.layout = criteo.LAYOUT
        self.fields = Fields(criteo.FIELD_NAMES, (1,) * criteo.NUM_FIELDS, 0, criteo.NUM_DENSE)
        self.log1p_dense = range(criteo.NUM_DENSE)
        columns = [{"kind": "click_label"}]
        columns += [{"kind": "integer", "output": k} for k in range(criteo.NUM_DENSE)]
        columns += [{"kind": "categorical", "field": f, "output": f} for f in range(criteo.NUM_FIELDS)]
        self.native = native_encoder(self.layout.delimiter, columns, self.fields)

    def parse_lines(self, lines, path, first_line, recorder):
        chunk = parse_chunk(self.layout, path, first_line, lines, recorder)
        sparse = np.empty((len(chunk), criteo.NUM_FIELDS), dtype=np.int64)
        for f, values in enumerate(chunk.categorical):
            sparse[:, f] = hash_values(f, values)
        return chunk.dense, sparse, chunk.labels


class SideKeys:
    """The keys of one side file's fields for each raw id it describes (prepare's hashed side
    fields), a bag padded to the most values any id has."""

    def __init__(self, table, first_field):
        self.table = table
        self.raw_ids = np.sort(table.raw_ids())
        fields, self.keys = encode_side_features(table, self.raw_ids, first_field)
        self.fields = fields

    def lookup(self, raw_ids):
        """(keys [n, slots], mask of the ids described)."""
        at = np.minimum(np.searchsorted(self.raw_ids, raw_ids), len(self.raw_ids) - 1)
        found = self.raw_ids[at] == raw_ids if len(self.raw_ids) else np.zeros(len(raw_ids), bool)
        return self.keys[at], found


class MovieLensFormat(NativeFormat):
    """MovieLens ratings, each file's layout told by its first line (movielens.detect_line_format):
    fields user, item and the side files' fields, label rating >= 4."""

    def __init__(self, users=None, items=None):
        names, slots = list(movielens.FIELD_NAMES), [1, 1]
        self.side = []
        for path, read in ((users, read_users), (items, read_items)):
            if path is None:
                continue
            side = SideKeys(read(path), len(names))
            side.output = sum(slots)
            names += [field.name for field in side.fields]
            slots += [field.slots for field in side.fields]
            self.side.append(side)
        self.fields = Fields(tuple(names), tuple(slots), 0, 0,
                             tuple(name for name in names if name in BAG_FIELDS))
        self.delimiter = None
        self.encoders = {}   # delimiter -> native encoder

    def begin_file(self, first_line, path):
        self.delimiter, header = movielens.detect_line_format(first_line, path)
        if self.delimiter not in self.encoders:
            sides = {side.table.kind: k for k, side in enumerate(self.side)}
            columns = [{"kind": "id", "field": f, "output": f, "side": sides.get(kind, -1)}
                       for f, kind in enumerate(("user", "item"))]
            columns += [{"kind": "threshold_label", "threshold": MOVIELENS_THRESHOLD, "low": 0.0, "high": 10.0},
                        {"kind": "integer", "allow_empty": False}]
            encoder = native_encoder(self.delimiter, columns, self.fields)
            for k, side in enumerate(self.side):
                encoder.set_side(k, side.raw_ids, side.keys, side.output)
            self.encoders[self.delimiter] = encoder
        self.native = self.encoders[self.delimiter]
        return header

    def parse_lines(self, lines, path, first_line, recorder):
        users, items, ratings, _, line_numbers = movielens.parse_ratings_chunk(
            path, first_line, lines, self.delimiter, recorder)
        blocks = [hash_values(0, [str(u) for u in users])[:, None],
                  hash_values(1, [str(i) for i in items])[:, None]]
        described = np.ones(len(users), dtype=bool)
        for side in self.side:
            raw = users if side.table.kind == "user" else items
            keys, found = side.lookup(raw)
            for j in np.flatnonzero(~found):
                column = 1 if side.table.kind == "user" else 2
                recorder.report(BadLine(path, int(line_numbers[j]), column,
                                        f"{side.table.kind} {raw[j]} is not in {side.table.path}"))
            described &= found
            blocks.append(keys)
        sparse = np.hstack(blocks)[described]
        labels = (ratings >= MOVIELENS_THRESHOLD).astype(np.float32)[described]
        return np.zeros((len(sparse), 0), np.float32), sparse, labels


SCHEMA_ROLES = ("label", "dense", "categorical", "bag", "ignore")
DENSE_TRANSFORMS = ("log1p", "none")
ROLE_KEYS = {"label": {"threshold"}, "dense": {"transform"}, "bag": {"separator", "slots"}}


@dataclass(frozen=True)
class SchemaColumn:
    role: str
    name: str = None
    threshold: float = 0.5      # label
    transform: str = "none"     # dense
    separator: str = None       # bag
    slots: int = 1              # bag
    field: int = None           # categorical and bag: the field index


def finite_number(text):
    """float(text), or None when it is not a finite number."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


class SchemaFormat(NativeFormat):
    """Any delimited log described by a schema file (the module's docstring)."""

    def __init__(self, columns, delimiter="\t", header=0, where="schema"):
        self.columns, self.delimiter, self.header = tuple(columns), delimiter, int(header)
        labels = [c for c in self.columns if c.role == "label"]
        if len(labels) != 1:
            raise ValueError(f"{where}: needs exactly one label column, found {len(labels)}")
        keyed = [c for c in self.columns if c.role in ("categorical", "bag")]
        self.fields = Fields(tuple(c.name for c in keyed), tuple(c.slots for c in keyed), 0,
                             sum(c.role == "dense" for c in self.columns),
                             tuple(c.name for c in keyed if c.role == "bag"))
        dense = [c for c in self.columns if c.role == "dense"]
        self.log1p_dense = [k for k, c in enumerate(dense) if c.transform == "log1p"]
        native, outputs = [], {"dense": 0, "sparse": 0}
        for c in self.columns:
            if c.role == "label":
                native.append({"kind": "threshold_label", "threshold": c.threshold})
            elif c.role == "dense":
                native.append({"kind": "number", "output": outputs["dense"]})
                outputs["dense"] += 1
            elif c.role in ("categorical", "bag"):
                native.append({"kind": c.role, "field": c.field, "output": outputs["sparse"],
                               "separator": c.separator or "", "slots": c.slots})
                outputs["sparse"] += c.slots
            else:
                native.append({"kind": "ignore"})
        self.native = native_encoder(self.delimiter, native, self.fields)

    @classmethod
    def from_file(cls, path):
        import yaml   # a dependency of the launcher too; only schema streams need it here
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"schema file not found: {path}")
        try:
            spec = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as error:
            raise ValueError(f"{path}: not YAML: {error}") from None
        return cls.from_dict(spec, str(path))

    @classmethod
    def from_dict(cls, spec, where="schema"):
        if not isinstance(spec, dict) or not isinstance(spec.get("columns"), list) or not spec["columns"]:
            raise ValueError(f"{where}: expected a mapping with a non-empty list 'columns'")
        unknown = set(spec) - {"delimiter", "header", "columns"}
        if unknown:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)} (delimiter, header, columns)")
        delimiter = spec.get("delimiter", "\t")
        if not isinstance(delimiter, str) or not delimiter or "\n" in delimiter:
            raise ValueError(f"{where}: delimiter must be a non-empty string without a newline")
        header = spec.get("header", 0)
        if not isinstance(header, int) or header < 0:
            raise ValueError(f"{where}: header must be a number of lines >= 0, got {header!r}")
        columns, names, field = [], set(), 0
        for number, column in enumerate(spec["columns"], start=1):
            at = f"{where}: column {number}"
            if not isinstance(column, dict) or column.get("role") not in SCHEMA_ROLES:
                raise ValueError(f"{at}: expected a mapping with a role among {SCHEMA_ROLES}")
            role = column["role"]
            allowed = {"role", "name"} | ROLE_KEYS.get(role, set())
            unknown = set(column) - allowed
            if unknown:
                raise ValueError(f"{at}: keys {sorted(unknown)} do not go with role {role}")
            name = column.get("name")
            if role in ("dense", "categorical", "bag"):
                if not isinstance(name, str) or not name:
                    raise ValueError(f"{at}: a {role} column needs a name")
                if name in names:
                    raise ValueError(f"{at}: name {name!r} used twice")
                names.add(name)
            kwargs = {"role": role, "name": name}
            if role == "label":
                threshold = column.get("threshold", 0.5)
                if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) \
                        or not math.isfinite(threshold):
                    raise ValueError(f"{at}: threshold must be a number, got {threshold!r}")
                kwargs["threshold"] = float(threshold)
            elif role == "dense":
                transform = column.get("transform", "none")
                if transform not in DENSE_TRANSFORMS:
                    raise ValueError(f"{at}: transform must be one of {DENSE_TRANSFORMS}, got {transform!r}")
                kwargs["transform"] = transform
            elif role == "bag":
                separator, slots = column.get("separator"), column.get("slots")
                if not isinstance(separator, str) or not separator or separator in delimiter or \
                        delimiter in separator:
                    raise ValueError(f"{at}: a bag needs a separator, other than the delimiter")
                if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
                    raise ValueError(f"{at}: a bag needs slots, its most values (>= 1), got {slots!r}")
                kwargs.update(separator=separator, slots=slots)
            if role in ("categorical", "bag"):
                kwargs["field"] = field
                field += 1
            columns.append(SchemaColumn(**kwargs))
        return cls(columns, delimiter, header, where)

    def begin_file(self, first_line, path):
        return self.header

    def parse_lines(self, lines, path, first_line, recorder):
        """The schema's definition, line by line."""
        dense_rows, sparse_rows, labels = [], [], []
        num_dense, slots = self.fields.num_dense, sum(self.fields.slots)
        for i, line in enumerate(lines):
            parsed = self.parse_line(line, path, first_line + i)
            if isinstance(parsed, BadLine):
                recorder.report(parsed)
                continue
            dense_rows.append(parsed[0])
            sparse_rows.append(parsed[1])
            labels.append(parsed[2])
        dense = np.array(dense_rows, dtype=np.float64).reshape(len(dense_rows), num_dense)
        for k, column in enumerate(c for c in self.columns if c.role == "dense"):
            if column.transform == "log1p":
                dense[:, k] = dense_transform(dense[:, k])
        return (dense.astype(np.float32), np.array(sparse_rows, dtype=np.int64).reshape(len(sparse_rows), slots),
                np.array(labels, dtype=np.float32))

    def parse_line(self, line, path, number):
        """(dense floats, keys, label) of one line, or its BadLine."""
        values = line.rstrip("\r\n").split(self.delimiter)
        problem = column_count_problem(values, len(self.columns), line)
        if problem:
            return BadLine(path, number, 0, problem)
        dense, keys, label = [], [], None
        for c, (column, value) in enumerate(zip(self.columns, values), start=1):
            if column.role == "label" or column.role == "dense" and value:
                number_value = finite_number(value)
                if number_value is None:
                    return BadLine(path, number, c, f"expected a number, found {value!r}")
                if column.role == "label":
                    label = 1.0 if number_value >= column.threshold else 0.0
                else:
                    dense.append(number_value)
            elif column.role == "dense":
                dense.append(0.0)
            elif column.role == "categorical":
                keys.append(int(hash_values(column.field, [value])[0]))
            elif column.role == "bag":
                bag = value.split(column.separator) if value else []
                if "" in bag:
                    return BadLine(path, number, c, f"an empty value in the bag {value!r}")
                if len(bag) > column.slots:
                    return BadLine(path, number, c, f"{len(bag)} values in the bag, more than its "
                                                    f"{column.slots} slots")
                keys.extend(hash_values(column.field, bag).tolist())
                keys.extend([BAG_PADDING] * (column.slots - len(bag)))
        return dense, keys, label
