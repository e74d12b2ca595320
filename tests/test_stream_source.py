"""hetu.data.stream.StreamSource: the samples of `prepare <fmt> --ids hashed` of the same files, bit
for bit (Criteo, MovieLens with side files, schema files); a directory followed while files land;
the rules on names, incomplete lines and bad lines; seek; a bounded queue; standard input."""
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from conftest import REPO
from hetu.data import DataFormatError, prepare_criteo, prepare_movielens, store
from hetu.data.stream import StreamSource
from test_data_movielens_side import U_ITEM, U_USER
from test_data_readers import criteo_line, messy_criteo
from test_hashed_ids import key

WAIT = 10.0   # seconds a test waits for samples it knows are coming


def read_all(source, expected, n=64):
    """Blocks read until `expected` samples came (fails after WAIT seconds without one)."""
    blocks, count = [], 0
    while count < expected:
        want = min(n, expected - count)
        block = source.read(want, timeout=WAIT)
        assert block is not None, f"only {count} of {expected} samples arrived"
        assert 1 <= len(block) <= want
        blocks.append(block)
        count += len(block)
    assert count == expected
    return blocks


def joined(blocks):
    return (np.concatenate([b.dense for b in blocks]), np.concatenate([b.sparse for b in blocks]),
            np.concatenate([b.labels for b in blocks]))


def assert_same_as_prepared(blocks, out):
    dense, sparse, labels = joined(blocks)
    for name, got in (("dense", dense), ("sparse", sparse), ("labels", labels)):
        want = np.load(out / f"{name}.npy")
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert got.tobytes() == want.tobytes(), name   # bit for bit


def clean_criteo(rng, lines):
    out = []
    for _ in range(lines):
        cats = {c: "%x" % int(rng.integers(0, 1 << 20)) for c in range(1, 27) if rng.random() < 0.9}
        ints = {k: int(rng.integers(-3, 100000)) for k in range(1, 14) if rng.random() < 0.8}
        out.append(criteo_line(int(rng.integers(0, 2)), ints, cats))
    return "".join(out).encode()


def lines_of(data):
    """The lines of `data`, each with its "\\n" (a lone "\\r" does not end a line)."""
    return [line + b"\n" for line in data.split(b"\n")[:-1]] + ([data.rsplit(b"\n", 1)[-1]] if not data.endswith(b"\n") else [])


def split_lines_into(directory, data, parts, prefix="part-"):
    """Writes `data`'s lines as `parts` files named in order."""
    lines = lines_of(data)
    bounds = np.linspace(0, len(lines), parts + 1).astype(int)
    directory.mkdir(exist_ok=True)
    for p in range(parts):
        (directory / f"{prefix}{p:03d}").write_bytes(b"".join(lines[bounds[p]:bounds[p + 1]]))


def test_criteo_stream_equals_prepare_hashed(tmp_path):
    rng = np.random.default_rng(0)
    # clean files (the native parser) and messy ones (the Python definition takes those chunks)
    data = clean_criteo(rng, 700) + messy_criteo(rng, 300) + b"\n" + clean_criteo(rng, 200)
    (tmp_path / "all.txt").write_bytes(data)
    out = prepare_criteo(tmp_path / "all.txt", tmp_path / "out", ids="hashed", val_fraction=0.0,
                         skip_bad_lines=True, progress=False, log=open(tmp_path / "log", "w"))
    split_lines_into(tmp_path / "logs", data, 5)
    (tmp_path / "logs/part-002-empty").write_bytes(b"")   # passed over
    rows = len(np.load(out / "labels.npy"))
    with StreamSource(tmp_path / "logs", "criteo", skip_bad_lines=True) as source:
        assert source.fields.names[0] == "C1" and source.fields.num_dense == 13
        assert source.fields.slots == (1,) * 26 and source.fields.num_embeddings == 0
        blocks = read_all(source, rows, n=97)
        assert source.read(10, timeout=0.3) is None
        assert source.bad_lines == 2 * 8   # every 37th line has 2 columns, and one a '\r' inside
        position = source.position()
    assert_same_as_prepared(blocks, out)
    assert position == {"file": "part-004", "offset": (tmp_path / "logs/part-004").stat().st_size,
                        "line": len(lines_of((tmp_path / "logs/part-004").read_bytes())),
                        "samples": rows}
    assert json.loads(json.dumps(position)) == position


def write_side_files(tmp_path):
    users = tmp_path / "u.user"
    items = tmp_path / "u.item"
    users.write_bytes(U_USER.encode("latin-1"))
    items.write_bytes(U_ITEM.encode("latin-1"))
    return users, items


def test_movielens_stream_with_side_files_equals_prepare_hashed(tmp_path):
    users, items = write_side_files(tmp_path)
    rng = np.random.default_rng(1)
    # ratings in time order (a log), every item rated, so prepare's bag is as wide as the stream's
    pairs = [(int(rng.choice([22, 186, 196])), int(rng.choice([242, 302, 377, 9])), int(rng.integers(1, 6)))
             for _ in range(400)]
    lines = [f"{u}\t{i}\t{r}\t{880000000 + t}\n" for t, (u, i, r) in enumerate(pairs)]
    lines[7] = "022\t0377\t4.5\t880000007\n"     # ids as int() reads them, a half star
    lines[8] = "186\t302\t3.99\t880000008\r\n"
    data = "".join(lines).encode()
    (tmp_path / "u.data").write_bytes(data)
    out = prepare_movielens(tmp_path / "u.data", tmp_path / "out", users_path=users, items_path=items,
                            time_order=True, shuffle_seed=None, val_fraction=0.0, ids="hashed",
                            progress=False)
    logs = tmp_path / "logs"
    split_lines_into(logs, data, 3)
    # one file in the 1M layout: the same ratings with '::'; one a ratings.csv with its header
    (logs / "part-001").write_bytes((logs / "part-001").read_bytes().replace(b"\t", b"::"))
    (logs / "part-002").write_bytes(b"userId,movieId,rating,timestamp\n" +
                                    (logs / "part-002").read_bytes().replace(b"\t", b","))
    with StreamSource(logs, "movielens", users=users, items=items) as source:
        fields = source.fields
        assert fields.names == ("user", "item", "gender", "age", "occupation", "zip", "year", "genres")
        assert fields.slots == (1,) * 7 + (4,) and fields.bags == ("genres",) and fields.num_dense == 0
        blocks = read_all(source, len(pairs), n=50)
    assert_same_as_prepared(blocks, out)
    assert blocks[0].sparse[0, 0] == key(0, str(pairs[0][0]))


def test_movielens_rating_of_an_undescribed_user_is_a_bad_line(tmp_path):
    users, items = write_side_files(tmp_path)
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "a").write_text("22\t242\t5\t1\n7\t242\t5\t2\n196\t9\t1\t3\n")
    with StreamSource(logs, "movielens", users=users, items=items) as source:
        assert len(source.read(10, timeout=WAIT)) == 1
        with pytest.raises(DataFormatError, match=r"logs/a:2: column 1: user 7 is not in .*u\.user"):
            source.read(10, timeout=WAIT)
    with StreamSource(logs, "movielens", users=users, items=items, skip_bad_lines=True) as source:
        block = source.read(10, timeout=WAIT)
        assert len(block) == 2 and source.bad_lines == 1
        assert block.labels[:, 0].tolist() == [1.0, 0.0]


SCHEMA = """
delimiter: ","
header: 1
columns:
  - {role: ignore}
  - {name: clicked, role: label, threshold: 1}
  - {name: price, role: dense, transform: log1p}
  - {name: score, role: dense}
  - {name: user, role: categorical}
  - {name: tags, role: bag, separator: "|", slots: 3}
  - {name: city, role: categorical}
"""


def test_schema_file_every_role(tmp_path):
    (tmp_path / "s.yaml").write_text(SCHEMA)
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "a.csv").write_text("id,clicked,price,score,user,tags,city\n"
                                "1,1,3.5,-0.25,u1,a|b,paris\n"
                                "2,0,-2,,u2,,\n"
                                "3,2.5,,1e3,u1,c|a|b,rome\n")
    with StreamSource(logs, "schema:" + str(tmp_path / "s.yaml")) as source:
        fields = source.fields
        assert fields.names == ("user", "tags", "city") and fields.slots == (1, 3, 1)
        assert fields.bags == ("tags",) and fields.num_dense == 2 and fields.num_embeddings == 0
        block = source.read(10, timeout=WAIT)
    assert block.labels[:, 0].tolist() == [1.0, 0.0, 1.0]
    log1p = lambda x: np.float32(np.log1p(np.float64(max(x, 0.0))))  # noqa: E731
    np.testing.assert_array_equal(block.dense, np.array(
        [[log1p(3.5), -0.25], [log1p(-2), 0.0], [log1p(0), 1000.0]], dtype=np.float32))
    pad = store.BAG_PADDING
    np.testing.assert_array_equal(block.sparse, [
        [key(0, "u1"), key(1, "a"), key(1, "b"), pad, key(2, "paris")],
        [key(0, "u2"), pad, pad, pad, key(2, "")],
        [key(0, "u1"), key(1, "c"), key(1, "a"), key(1, "b"), key(2, "rome")]])
    assert block.position["line"] == 4


@pytest.mark.parametrize("line, where", [
    ("1,x,1,1,u,a,c", "column 2: expected a number, found 'x'"),
    ("1,1,1,1,u,a|b|c|d,c", "column 6: 4 values in the bag, more than its 3 slots"),
    ("1,1,1,1,u,a||c,c", "column 6: an empty value in the bag"),
    ("1,1,1,u,a,c", "expected 7 columns, found 6"),
    ("1,1,nan,1,u,a,c", "column 3: expected a number, found 'nan'"),
])
def test_schema_bad_lines(tmp_path, line, where):
    (tmp_path / "s.yaml").write_text(SCHEMA.replace("header: 1", "header: 0"))
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "a").write_text("1,1,1,1,u,a,c\n" + line + "\n")
    with StreamSource(logs, "schema", schema=tmp_path / "s.yaml") as source:
        assert len(source.read(10, timeout=WAIT)) == 1
        with pytest.raises(DataFormatError, match=f"logs/a:2: {where}"):
            source.read(10, timeout=WAIT)


@pytest.mark.parametrize("spec, message", [
    ("columns: [{role: dense, name: x}]", "exactly one label column"),
    ("columns: [{role: label}, {role: bag, name: t, separator: '|'}]", "a bag needs slots"),
    ("columns: [{role: label}, {role: dense, name: x, transform: sqrt}]", "transform must be one of"),
    ("columns: [{role: label}, {role: categorical}]", "a categorical column needs a name"),
    ("columns: [{role: label, separator: ','}]", r"keys \['separator'\] do not go with role label"),
])
def test_schema_file_errors(tmp_path, spec, message):
    (tmp_path / "s.yaml").write_text(spec)
    with pytest.raises(ValueError, match=message):
        StreamSource(tmp_path, "schema:" + str(tmp_path / "s.yaml"))


def test_files_landing_while_the_reader_follows(tmp_path):
    """A writer thread writes x.tmp and renames it; a file's incomplete last line waits."""
    logs = tmp_path / "logs"
    logs.mkdir()
    rng = np.random.default_rng(2)
    files = [clean_criteo(rng, 30) for _ in range(4)]

    def writer():
        for k, data in enumerate(files):
            time.sleep(0.15)
            tmp = logs / f"{k:02d}.tmp"
            tmp.write_bytes(data)
            time.sleep(0.1)        # seen under its .tmp name: ignored
            os.rename(tmp, logs / f"{k:02d}.log")
        # a file whose last line is written in two parts
        with open(logs / "99.log", "wb") as f:
            f.write(files[0] + files[1][:50])
            f.flush()
            time.sleep(0.6)
            f.write(files[1][50:])

    source = StreamSource(logs, "criteo", poll_seconds=0.02)
    thread = threading.Thread(target=writer)
    thread.start()
    blocks = read_all(source, 180, n=1000)
    thread.join()
    arrival = np.concatenate([b.arrival for b in blocks])
    assert arrival[119] - arrival[0] > 0.5         # four files, a quarter second apart
    assert arrival[150] - arrival[149] > 0.4       # the cut line waited for its end
    rest = []
    got = joined(blocks + rest)[1]
    source.close()
    with StreamSource(logs, "criteo") as again:    # the same files read at once
        np.testing.assert_array_equal(joined(read_all(again, 180, n=1000))[1], got)


def test_a_new_file_sorting_before_one_read_is_an_error(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    rng = np.random.default_rng(3)
    (logs / "b.log").write_bytes(clean_criteo(rng, 5))
    with StreamSource(logs, "criteo", poll_seconds=0.02) as source:
        assert len(source.read(100, timeout=WAIT)) == 5
        (logs / ".hidden").write_bytes(b"x\n")       # ignored
        (logs / "a.log.part").write_bytes(b"x\n")    # ignored
        (logs / "a.log").write_bytes(clean_criteo(rng, 5))
        with pytest.raises(DataFormatError, match=r"new file 'a.log' sorts before 'b.log', already read"):
            source.read(100, timeout=WAIT)


def test_a_bad_line_names_file_and_line_or_is_skipped_and_counted(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    rng = np.random.default_rng(4)
    lines = lines_of(clean_criteo(rng, 10))
    lines[6] = b"1\t2\n"
    lines[8] = lines[8].replace(b"\t", b"\tx", 1)   # I1 = "x..."
    (logs / "a").write_bytes(b"".join(lines[:4]))
    (logs / "b").write_bytes(b"".join(lines[4:]))
    with StreamSource(logs, "criteo") as source:
        blocks = read_all(source, 6, n=100)
        assert blocks[-1].position == {"file": "b", "offset": len(b"".join(lines[4:6])), "line": 2, "samples": 6}
        with pytest.raises(DataFormatError, match=r"logs/b:3: expected 40 columns, found 2"):
            source.read(100, timeout=WAIT)
        with pytest.raises(DataFormatError):   # the reader stopped: it stays an error
            source.read(100, timeout=0.1)
    with StreamSource(logs, "criteo", skip_bad_lines=True) as source:
        assert len(joined(read_all(source, 8, n=100))[0]) == 8
        assert source.bad_lines == 2


def test_a_later_file_ends_a_last_line_without_its_newline(tmp_path):
    """A file's last line without its "\\n" waits until a later file exists, then is read as a
    line: the samples of the same lines with their newlines, and a position after it resumes at
    the next file."""
    rng = np.random.default_rng(8)
    parts = [clean_criteo(rng, 20), clean_criteo(rng, 1), clean_criteo(rng, 20)]
    with_newlines = tmp_path / "with"
    with_newlines.mkdir()
    for k, data in enumerate(parts):
        (with_newlines / f"{k}.log").write_bytes(data)
    with StreamSource(with_newlines, "criteo") as source:
        want = joined(read_all(source, 41))
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "0.log").write_bytes(parts[0][:-1])
    with StreamSource(logs, "criteo", poll_seconds=0.02) as source:
        head = read_all(source, 19)
        assert source.read(1, timeout=0.3) is None   # the last line waits for its end
        (logs / "1.log").write_bytes(parts[1][:-1])  # a file of one line, without its newline too
        head += read_all(source, 1)
        assert head[-1].position == {"file": "0.log", "offset": len(parts[0]) - 1, "line": 20, "samples": 20}
        (logs / "2.log").write_bytes(parts[2])
        blocks = head + read_all(source, 21)
        assert source.read(1, timeout=0.2) is None
    for got, expected in zip(joined(blocks), want):
        assert got.tobytes() == expected.tobytes()
    with StreamSource(logs, "criteo") as resumed:   # after the first file's unended line: the next file
        resumed.seek(head[-1].position)
        assert joined(read_all(resumed, 21))[1].tobytes() == want[1][20:].tobytes()


def test_a_waiting_reader_says_what_it_waits_for(tmp_path, capfd):
    """Once after notice_seconds of waiting for the same thing, then after twice as long; only a
    source that reports prints."""
    logs = tmp_path / "logs"
    logs.mkdir()
    data = clean_criteo(np.random.default_rng(9), 4)
    (logs / "a.log").write_bytes(lines_of(data)[0] + lines_of(data)[1] + lines_of(data)[2][:-1])
    sources = [StreamSource(logs, "criteo", poll_seconds=0.02, notice_seconds=0.3, report=r) for r in (True, False)]
    for source in sources:
        read_all(source, 2)
    time.sleep(1.4)
    unended = f"the \\n ending the last line of {logs / 'a.log'} (or a file after it, which ends it)"
    assert all(source.waiting_for == unended for source in sources)
    err = capfd.readouterr().err
    assert err.splitlines() == [f"stream: waiting 0.3 s for {unended}", f"stream: waiting 0.6 s for {unended}",
                                f"stream: waiting 1.2 s for {unended}"], err
    (logs / "b.log").write_bytes(lines_of(data)[3])
    for source in sources:
        read_all(source, 2)
        deadline = time.monotonic() + WAIT
        while source.waiting_for != f"{logs / 'b.log'} to grow, or a file after it in {logs}":
            assert time.monotonic() < deadline, source.waiting_for
            time.sleep(0.02)
        source.close()


def test_skipped_lines_are_counted_per_file_and_quoted_printably(tmp_path, capfd):
    """The first few skipped lines are printed, their reason printable and cut; each file's count
    when the reader leaves it; a source that does not report prints nothing."""
    logs = tmp_path / "logs"
    logs.mkdir()
    lines = lines_of(clean_criteo(np.random.default_rng(10), 30))
    binary = b"1\t\x00\x1b[31m\xff" + b"z" * 300 + b"\n"
    for i in (2, 4, 6, 8, 10, 12):
        lines[i] = binary if i != 4 else lines[i].replace(b"\t", b"\t\x07" + b"y" * 200, 2)
    (logs / "a").write_bytes(b"".join(lines[:20]))
    (logs / "b").write_bytes(b"".join(lines[20:]) + binary)
    for report in (True, False):
        with StreamSource(logs, "criteo", skip_bad_lines=True, report=report) as source:
            read_all(source, 24)
            assert source.read(1, timeout=0.3) is None
            assert source.bad_lines == 7 and source.bad_lines_by_file == {"a": 6, "b": 1}
        err = capfd.readouterr().err
        if not report:
            assert err == ""
            continue
        lines_out = err.splitlines()
        skipped = [line for line in lines_out if line.startswith("stream: skipping bad line: ")]
        assert len(skipped) == 5 and skipped[-1].endswith("(the next are counted, not printed)"), err
        assert f"stream: skipping bad line: {logs / 'a'}:5: column 2: expected an integer or empty, found '\\x07yyy" in skipped[1], err
        assert all(line.isprintable() and len(line) < 100 + len(str(logs)) + 80 for line in lines_out), err
        assert f"stream: {logs / 'a'}: 6 bad lines skipped" in lines_out, err
        assert not any(line.startswith(f"stream: {logs / 'b'}: ") for line in lines_out), err   # still read


def test_seek_continues_exactly_after_a_position(tmp_path):
    logs = tmp_path / "logs"
    rng = np.random.default_rng(5)
    split_lines_into(logs, clean_criteo(rng, 300), 3)
    with StreamSource(logs, "criteo") as source:
        everything = joined(read_all(source, 300, n=300))[1]
    for cut in (1, 99, 100, 101, 250, 300):
        with StreamSource(logs, "criteo") as first:
            head = read_all(first, cut, n=cut)
            position = json.loads(json.dumps(head[-1].position))
            assert position == first.position() and position["samples"] == cut
        with StreamSource(logs, "criteo") as resumed:
            resumed.seek(position)
            tail = read_all(resumed, 300 - cut, n=300) if cut < 300 else []
            assert resumed.read(1, timeout=0.2) is None
            assert resumed.position()["samples"] == 300
        got = np.concatenate([b.sparse for b in head + tail])
        np.testing.assert_array_equal(got, everything)
    with StreamSource(logs, "criteo") as source:
        source.read(1, timeout=WAIT)
        with pytest.raises(RuntimeError, match="only before the first read"):
            source.seek(position)


def test_the_queue_is_bounded_when_nothing_reads(tmp_path):
    logs = tmp_path / "logs"
    split_lines_into(logs, clean_criteo(np.random.default_rng(6), 2000), 4)
    with StreamSource(logs, "criteo", max_buffered=64) as source:
        first = source.read(1, timeout=WAIT)
        time.sleep(0.5)
        assert source.buffered <= 64
        blocks = [first] + read_all(source, 1999, n=1000)
        assert max(len(b) for b in blocks) <= 64
        assert source.buffered == 0


@pytest.mark.parametrize("seek", [False, True])
def test_standard_input(tmp_path, seek):
    data = clean_criteo(np.random.default_rng(7), 50)
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs/a").write_bytes(data)
    with StreamSource(tmp_path / "logs", "criteo") as source:
        want = joined(read_all(source, 50))[1]
        position = source.position()
    position = {"file": "-", "offset": len(b"".join(lines_of(data)[:20])), "line": 20, "samples": 20}
    code = (
        "import json, sys\n"
        "import numpy as np\n"
        "from hetu.data.stream import StreamSource\n"
        "s = StreamSource('-', 'criteo')\n"
        f"if {seek}: s.seek({position!r})\n"
        "rows = []\n"
        "while not s.ended:\n"
        "    b = s.read(7, timeout=5)\n"
        "    if b is not None: rows.append(b.sparse)\n"
        "np.save(sys.argv[1], np.concatenate(rows))\n"
        "print(json.dumps(s.position()))\n")
    out = tmp_path / "got.npy"
    run = subprocess.run([sys.executable, "-c", code, str(out)], input=data[:-1],  # no last newline
                         capture_output=True, timeout=60, cwd=REPO)
    assert run.returncode == 0, run.stderr.decode()
    got = np.load(out)
    np.testing.assert_array_equal(got, want[20:] if seek else want)
    assert json.loads(run.stdout) == {"file": "-", "offset": len(data) - 1, "line": 50, "samples": 50}


class _Native:
    """The native encoder, counting the lines it encodes; with ``refuse``, taking none, so that the
    formats' Python definitions parse every line."""

    def __init__(self, encoder, refuse):
        self.encoder, self.refuse, self.encoded = encoder, refuse, 0

    def set_side(self, *args):
        self.encoder.set_side(*args)

    def encode(self, text, start, max_lines, final):
        n, *arrays = self.encoder.encode(text, start, max_lines, final)
        n = 0 if self.refuse else n
        self.encoded += n
        return (n, *arrays)


SCHEMA_LINES = ("1,1,3.5,-0.25,u1,a|b,paris\n"
                "2,0,+7,1_000,u2,,z\u00fcrich\n"       # numbers only Python's float() reads
                "3,0.5,1e-3,.5,u\u00e9,c,\n"
                "4,1,,5.,u3,a|a,rome\r\n"
                "5,1,2,3,u\xff,b,x\n")                 # not UTF-8: Python's replacement character


@pytest.mark.parametrize("fmt", ["criteo", "movielens", "schema"])
def test_native_and_python_definitions_give_the_same_samples(tmp_path, monkeypatch, fmt):
    from hetu.data import stream_formats
    logs = tmp_path / "logs"
    logs.mkdir()
    options = {}
    if fmt == "criteo":
        data = clean_criteo(np.random.default_rng(8), 50) + messy_criteo(np.random.default_rng(9), 300) + b"\n"
    elif fmt == "movielens":
        options["users"], options["items"] = write_side_files(tmp_path)
        data = b"22\t242\t5\t1\n0196\t9\t1\t2\n186\t302\t4.0\t3\r\n22::377::2::4\n186\t1_5\t2\t5\n"
    else:
        (tmp_path / "s.yaml").write_text(SCHEMA.replace("header: 1", "header: 0"))
        options["schema"] = tmp_path / "s.yaml"
        data = SCHEMA_LINES.encode("utf-8").replace("\xff".encode("utf-8"), b"\xff")
    (logs / "a").write_bytes(data)
    samples, encoders, native = [], [], stream_formats.native_encoder
    for python_only in (False, True):
        monkeypatch.setattr(stream_formats, "native_encoder",
                            lambda *a: encoders.append(_Native(native(*a), python_only)) or encoders[-1])
        with StreamSource(logs, fmt, skip_bad_lines=True, **options) as source:
            block = source.read(10000, timeout=WAIT)
            assert source.read(1, timeout=0.2) is None
            samples.append((block, source.bad_lines))
    (native_block, native_bad), (python_block, python_bad) = samples
    assert encoders[0].encoded >= 2 and encoders[-1].encoded == 0
    assert native_bad == python_bad
    for name in ("dense", "sparse", "labels"):
        assert getattr(native_block, name).tobytes() == getattr(python_block, name).tobytes(), name
    assert native_block.position == python_block.position
    if fmt == "movielens":
        # "22::377::2::4" is one column of a tab separated file; int("1_5") is 15, not in u.item
        assert len(native_block) == 3 and native_bad == 2
    if fmt == "schema":
        assert len(native_block) == 5
        assert native_block.sparse[2, 0] == key(0, "u\u00e9") and native_block.sparse[4, 0] == key(0, "u\ufffd")
        assert native_block.dense[1].tolist() == [np.float32(np.log1p(7.0)), 1000.0]
