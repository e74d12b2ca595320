"""Parquet files (hetu.data.formats.parquet) against the same rows as text described by the same
schema file: `prepare parquet` writes the arrays `prepare schema` writes, a stream of Parquet files
landing while it is followed gives the text stream's samples, a file without its footer yet is not
read until complete, and a missing column or a column of the wrong type is one error line naming
the file and the column. The format registry's one error for an unknown name."""
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hetu.data import DataFormatError, formats
from hetu.data.formats.parquet import ParquetFormat
from hetu.data.prepare import main as prepare_main
from hetu.data.stream import StreamSource
from test_stream_source import WAIT, joined, read_all

SCHEMA = """\
delimiter: ","
columns:
  - {name: clicked, role: label, threshold: 0.5}
  - {name: price, role: dense, transform: log1p}
  - {name: score, role: dense}
  - {name: user, role: categorical}
  - {name: item, role: categorical}
  - {name: tags, role: bag, separator: "|", slots: 3}
  - {name: genres, role: bag, separator: "|", slots: 2}
  - {name: note, role: ignore}
"""
ARRAYS = ("dense", "sparse", "labels")


def rows_of(rng, n):
    """Columns of `n` random rows: int labels, floats with nulls, string and int64 ids (nulls too),
    a bag as a list of strings and one as a list of int64 ids."""
    some = lambda values, p=0.1: [None if rng.random() < p else v for v in values]  # noqa: E731
    return {
        "clicked": rng.integers(0, 2, n).tolist(),
        "price": some([float(x) for x in rng.normal(10, 20, n)]),
        "score": some([float(x) for x in rng.normal(0, 1, n)]),
        "user": some([f"u{int(x)}" for x in rng.integers(0, 50, n)]),
        "item": some([int(x) for x in rng.integers(-5, 1 << 40, n)]),
        "tags": [[f"t{int(x)}" for x in rng.integers(0, 9, rng.integers(0, 4))] for _ in range(n)],
        "genres": [[int(x) for x in rng.integers(0, 30, rng.integers(0, 3))] for _ in range(n)],
        "note": ["x"] * n,
    }


def text_of(columns, start, stop):
    """The same rows as lines of the schema's text (a null is an empty column)."""
    def cell(value):
        if value is None:
            return ""
        if isinstance(value, list):
            return "|".join(str(v) for v in value)
        return repr(value) if isinstance(value, float) else str(value)
    names = list(columns)
    return "".join(",".join(cell(columns[c][i]) for c in names) + "\n" for i in range(start, stop))


def parquet_of(columns, start, stop):
    return pa.table({"clicked": pa.array(columns["clicked"][start:stop], pa.int64()),
                     "price": pa.array(columns["price"][start:stop], pa.float64()),
                     "score": pa.array(columns["score"][start:stop], pa.float64()),
                     "user": pa.array(columns["user"][start:stop], pa.string()),
                     "item": pa.array(columns["item"][start:stop], pa.int64()),
                     "tags": pa.array(columns["tags"][start:stop], pa.list_(pa.string())),
                     "genres": pa.array(columns["genres"][start:stop], pa.list_(pa.int64())),
                     "note": pa.array(columns["note"][start:stop], pa.string())})


def write_parquet(table, path):
    """As a feature pipeline writes: under a temporary name, renamed once complete."""
    pq.write_table(table, str(path) + ".tmp", row_group_size=64)
    os.replace(str(path) + ".tmp", path)


@pytest.fixture
def data(tmp_path):
    (tmp_path / "s.yaml").write_text(SCHEMA)
    return tmp_path, rows_of(np.random.default_rng(7), 300)


def test_parquet_prepares_the_arrays_of_the_same_text(data):
    tmp_path, columns = data
    for kind in ("text", "parquet"):
        (tmp_path / kind).mkdir()
    for part, (start, stop) in enumerate(((0, 120), (120, 300))):
        (tmp_path / "text" / f"{part}.csv").write_text(text_of(columns, start, stop))
        write_parquet(parquet_of(columns, start, stop), tmp_path / "parquet" / f"{part}.parquet")
    for kind, fmt in (("text", "schema"), ("parquet", "parquet")):
        assert prepare_main([fmt, "--schema", str(tmp_path / "s.yaml"), "--input", str(tmp_path / kind),
                             "--output", str(tmp_path / f"out-{kind}"), "--shuffle-seed", "3", "--quiet"]) == 0
    for name in ARRAYS:
        text = np.load(tmp_path / "out-text" / f"{name}.npy")
        parquet = np.load(tmp_path / "out-parquet" / f"{name}.npy")
        assert text.shape[0] == 300 and text.dtype == parquet.dtype and text.shape == parquet.shape, name
        assert text.tobytes() == parquet.tobytes(), name
    sparse = np.load(tmp_path / "out-parquet" / "sparse.npy")
    assert sparse.dtype == np.int64 and len(np.unique(sparse[:, 1])) > 100   # the int64 ids, hashed


def test_a_parquet_stream_gives_the_text_stream_samples(data):
    tmp_path, columns = data
    text, logs = tmp_path / "text", tmp_path / "logs"
    text.mkdir()
    logs.mkdir()
    (text / "a.csv").write_text(text_of(columns, 0, 300))
    with StreamSource(text, "schema:" + str(tmp_path / "s.yaml")) as source:
        want = joined(read_all(source, 300))
    with StreamSource(logs, "parquet", schema=tmp_path / "s.yaml", poll_seconds=0.02) as source:
        assert source.read(10, timeout=0.2) is None   # nothing yet: the reader follows the folder
        write_parquet(parquet_of(columns, 0, 100), logs / "0.parquet")
        first = read_all(source, 40)
        saved = first[-1].position
        assert saved == {"file": "0.parquet", "offset": 40, "line": 40, "samples": 40}
        write_parquet(parquet_of(columns, 100, 300), logs / "1.parquet")
        got = joined(first + read_all(source, 260))
    for name, a, b in zip(ARRAYS, got, want):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), name
    with StreamSource(logs, "parquet:" + str(tmp_path / "s.yaml")) as resumed:   # from a saved position
        resumed.seek(saved)
        rest = joined(read_all(resumed, 260))
    for name, a, b in zip(ARRAYS, rest, want):
        assert a.tobytes() == b[40:].tobytes(), name


def test_a_parquet_file_without_its_footer_is_read_once_complete(data):
    tmp_path, columns = data
    logs = tmp_path / "logs"
    logs.mkdir()
    pq.write_table(parquet_of(columns, 0, 50), str(tmp_path / "whole.parquet"))
    whole = (tmp_path / "whole.parquet").read_bytes()
    (logs / "0.parquet").write_bytes(whole[:len(whole) * 2 // 3])   # written in place, cut short
    with StreamSource(logs, "parquet:" + str(tmp_path / "s.yaml"), poll_seconds=0.02) as source:
        assert source.read(50, timeout=0.5) is None
        assert "0.parquet to be complete" in source.waiting_for
        (tmp_path / "done.tmp").write_bytes(whole)
        os.replace(tmp_path / "done.tmp", logs / "0.parquet")
        block = source.read(50, timeout=WAIT)
    prepared = ParquetFormat.from_file(tmp_path / "s.yaml")
    want = next(prepared.file_samples(tmp_path / "whole.parquet"))
    assert len(block) == 50 and block.sparse.tobytes() == want.sparse.tobytes()


@pytest.mark.parametrize("change, message", [
    (lambda t: t.drop_columns(["user"]), "no column 'user' (categorical); its columns: clicked, price"),
    (lambda t: t.set_column(1, "price", pa.array(["1.5"] * len(t))),
     "column 'price' (dense) is string, expected a number"),
    (lambda t: t.set_column(5, "tags", pa.array([1.5] * len(t))),
     "column 'tags' (bag) is double, expected a list of integers or strings, or a string"),
])
def test_a_missing_column_or_a_wrong_type_is_one_line_naming_file_and_column(data, capsys, change, message):
    tmp_path, columns = data
    bad = tmp_path / "logs" / "bad.parquet"
    bad.parent.mkdir()
    pq.write_table(change(parquet_of(columns, 0, 20)), str(bad))
    assert prepare_main(["parquet", "--schema", str(tmp_path / "s.yaml"), "--input", str(bad),
                         "--output", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{bad}: {message}" in err
    with StreamSource(bad.parent, "parquet:" + str(tmp_path / "s.yaml")) as source:
        with pytest.raises(DataFormatError) as raised:
            source.read(10, timeout=WAIT)
    assert str(raised.value).startswith(f"{bad}: {message}")


def test_one_lookup_names_every_format():
    with pytest.raises(ValueError, match="unknown stream format 'avazu'; known: criteo, movielens, "
                                         "schema:FILE, parquet:FILE"):
        formats.lookup("avazu", "stream")
    with pytest.raises(ValueError, match="unknown format 'orc'; known: criteo, avazu, movielens, schema, parquet"):
        formats.lookup("orc", "prepare")
    with pytest.raises(ValueError, match="expected parquet:FILE"):
        StreamSource(".", "parquet")
    assert formats.lookup("parquet:s.yaml", "stream")[1] == "s.yaml"


def test_a_text_header_of_two_lines_and_a_bad_line_without_dense_columns(tmp_path):
    """Every header line is skipped (a stream of a folder or of stdin, and prepare alike), and a bad
    line of a schema without dense columns is skipped and counted like any other."""
    (tmp_path / "s.yaml").write_text('delimiter: ","\nheader: 2\ncolumns:\n'
                                     '  - {name: clicked, role: label}\n  - {name: user, role: categorical}\n')
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "a.csv").write_text("clicked,user\n# the second header line\n1,u1\n1,u2,extra\n0,u3\n")
    with StreamSource(logs, "schema:" + str(tmp_path / "s.yaml"), skip_bad_lines=True, report=False) as source:
        blocks = read_all(source, 2)
        assert source.bad_lines == 1 and blocks[-1].position["line"] == 5
    _, sparse, labels = joined(blocks)
    assert labels[:, 0].tolist() == [1.0, 0.0]
    assert prepare_main(["schema", "--schema", str(tmp_path / "s.yaml"), "--input", str(logs),
                         "--output", str(tmp_path / "out"), "--skip-bad-lines", "--quiet"]) == 0
    assert np.load(tmp_path / "out" / "sparse.npy").tobytes() == sparse.tobytes()
