"""Readers on tiny hand-written files: expected arrays are worked out by hand in the comments."""
import json
import math
import os
import sys

import numpy as np
import pytest

import jobs
from hetu.data import (DataFormatError, load_dataset, prepare_avazu, prepare_criteo,
                       prepare_movielens)
from hetu.data import store

NUM_INTS, NUM_CATS = 13, 26


def criteo_line(label, ints=None, cats=None, other_cat="f0"):
    ints = ints or {}
    cats = cats or {}
    columns = [str(label)]
    columns += [str(ints.get(i, "")) for i in range(1, NUM_INTS + 1)]
    columns += [cats.get(c, other_cat) for c in range(1, NUM_CATS + 1)]
    return "\t".join(columns) + "\n"


# C1 counts: a 3, b 2, missing 1 -> a=1, b=2 (size 3).
# C2 counts: y 2, z 2 (tie broken by value), x 1, missing 1 -> y=1, z=2, x=3 (size 4).
# C3..C26 are 'f0' everywhere -> local id 1, size 2 each.
CRITEO_ROWS = [
    criteo_line(1, {1: 0, 2: -1}, {1: "a", 2: "z"}),
    criteo_line(0, {1: 3, 2: 7}, {1: "a", 2: "y"}),
    criteo_line(0, {2: 0}, {1: "b", 2: ""}),
    criteo_line(1, {1: 1}, {1: "a", 2: "z"}),
    criteo_line(0, {}, {1: "b", 2: "y"}),
    criteo_line(1, {13: 20}, {1: "", 2: "x"}),
]
CRITEO_LOCAL = [(1, 2), (1, 1), (2, 0), (1, 2), (2, 1), (0, 3)]
CRITEO_LABELS = [1, 0, 0, 1, 0, 1]


def criteo_expected_sparse(c2_local, c2_size):
    offsets = [0, 3] + [3 + c2_size + 2 * k for k in range(24)]
    rows = []
    for c1, c2 in CRITEO_LOCAL:
        rows.append([offsets[0] + c1, offsets[1] + c2_local(c2)] + offsets[2:])
    return np.array(rows, dtype=np.int64) + np.array([0, 0] + [1] * 24)


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_criteo_parses_to_hand_computed_arrays(tmp_path):
    src = write(tmp_path, "train.txt", "".join(CRITEO_ROWS * 5))  # 30 lines
    out = prepare_criteo(src, tmp_path / "out", progress=False)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["num_rows"] == 30 and meta["num_fields"] == 26 and meta["num_dense"] == 13
    assert meta["field_sizes"][:3] == [3, 4, 2] and meta["field_sizes"][3:] == [2] * 23
    assert meta["field_offsets"][:4] == [0, 3, 7, 9]
    assert meta["num_embeddings"] == 3 + 4 + 2 * 24
    assert meta["split"]["train_rows"] == 27 and meta["split"]["val_rows"] == 3

    sparse = np.load(out / "sparse.npy")
    assert sparse.dtype == np.int64 and sparse.shape == (30, 26)
    expected = criteo_expected_sparse(lambda c2: c2, 4)
    np.testing.assert_array_equal(sparse, np.tile(expected, (5, 1)))

    dense = np.load(out / "dense.npy")
    assert dense.dtype == np.float32 and dense.shape == (30, 13)
    expected_dense = np.zeros((6, 13), dtype=np.float32)
    expected_dense[1, 0] = math.log(4)    # I1 = 3
    expected_dense[1, 1] = math.log(8)    # I2 = 7
    expected_dense[3, 0] = math.log(2)    # I1 = 1
    expected_dense[5, 12] = math.log(21)  # I13 = 20; I2 = -1 in row 0 is clipped to 0
    np.testing.assert_allclose(dense, np.tile(expected_dense, (5, 1)), rtol=1e-6)

    labels = np.load(out / "labels.npy")
    assert labels.dtype == np.float32 and labels.shape == (30, 1)
    np.testing.assert_array_equal(labels[:, 0], np.tile(CRITEO_LABELS, 5))


def test_criteo_min_count_and_row_limit(tmp_path):
    src = write(tmp_path, "train.txt", "".join(CRITEO_ROWS))
    out = prepare_criteo(src, tmp_path / "out", min_count=2, progress=False)
    # C2: x seen once -> rare bucket 0; y=1, z=2 (size 3)
    sparse = np.load(out / "sparse.npy")
    expected = criteo_expected_sparse(lambda c2: 0 if c2 == 3 else c2, 3)
    np.testing.assert_array_equal(sparse, expected)
    limited = prepare_criteo(src, tmp_path / "first4", rows=4, progress=False)
    assert np.load(limited / "sparse.npy").shape == (4, 26)
    assert json.loads((limited / "meta.json").read_text())["num_rows"] == 4


def test_criteo_shuffle_is_a_seeded_permutation(tmp_path):
    src = write(tmp_path, "train.txt", "".join(CRITEO_ROWS * 4))
    plain = prepare_criteo(src, tmp_path / "plain", progress=False)
    shuffled = prepare_criteo(src, tmp_path / "shuffled", shuffle_seed=3, progress=False)
    order = np.random.default_rng(3).permutation(24)
    for name in ("sparse.npy", "dense.npy", "labels.npy"):
        np.testing.assert_array_equal(np.load(shuffled / name), np.load(plain / name)[order])
    assert not list(shuffled.glob("*unshuffled*"))


BAD_CRITEO = (CRITEO_ROWS[0] + CRITEO_ROWS[1]
              + "1\t2\t3\n"                                       # line 3: 3 columns
              + CRITEO_ROWS[2]
              + CRITEO_ROWS[3].replace("\t\t", "\tQ\t", 1)        # line 5: I2 (column 3) = Q
              + "7" + CRITEO_ROWS[4][1:]                          # line 6: label 7
              + CRITEO_ROWS[5]
              + CRITEO_ROWS[0][:25])                              # line 8: cut mid-record


def test_criteo_bad_line_stops_with_file_line_and_column(tmp_path):
    src = write(tmp_path, "train.txt", BAD_CRITEO)
    with pytest.raises(DataFormatError, match=r"train\.txt:3: expected 40 columns, found 3"):
        prepare_criteo(src, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["train.txt"]  # no partial folder left


def test_criteo_skip_bad_lines_counts_and_reports(tmp_path, capsys):
    src = write(tmp_path, "train.txt", BAD_CRITEO)
    out = prepare_criteo(src, tmp_path / "out", skip_bad_lines=True, progress=False)
    err = capsys.readouterr().err
    assert "train.txt:3: expected 40 columns" in err
    assert "train.txt:5: column 3: expected an integer" in err
    assert "train.txt:6: column 1: label must be 0 or 1" in err
    assert "train.txt:8: file truncated" in err
    assert "skipped 4 bad line(s)" in err and "truncated" in err
    meta = json.loads((out / "meta.json").read_text())
    assert meta["num_rows"] == 4
    assert meta["source"]["bad_lines_skipped"] == 4 and meta["source"]["truncated"]
    np.testing.assert_array_equal(np.load(out / "labels.npy")[:, 0], [1, 0, 0, 1])


def messy_criteo(rng, lines):
    """Random Criteo lines (power-law values, so counts tie and differ), a few of them unusual in
    ways only the Python parser takes: '\\r\\n' ends, an integer written '+5', a non-ASCII and an
    invalid UTF-8 value, a lone '\\r' inside a line (two bad lines to the text reader), a line of
    two columns; the last line has no newline."""
    out = []
    for i in range(lines):
        cats = {c: "%x" % min(int(rng.zipf(1.5)), 50) for c in range(1, NUM_CATS + 1)}
        cats[int(rng.integers(1, NUM_CATS + 1))] = ""
        ints = {k: int(rng.integers(-3, 40)) for k in range(1, NUM_INTS + 1) if rng.random() < 0.8}
        columns = criteo_line(int(rng.integers(0, 2)), ints, cats).encode()[:-1].split(b"\t")
        end = b"\n"
        kind = i % 37
        if kind == 5:
            end = b"\r\n"
        elif kind == 11:
            columns[2] = b"+5"
        elif kind == 17:
            columns[14] = "caf\u00e9".encode()            # C1
        elif kind == 23:
            columns[15] = b"\xff\xfe"                     # C2: both bytes become U+FFFD
        elif kind == 29:
            columns = [b"1", b"2"]
        elif kind == 31:
            columns[20] = columns[20] + b"\r"
        out.append(b"\t".join(columns) + end)
    return b"".join(out)[:-1]


class _Counting:
    """The native encoder, recording whether it took each chunk of pass 1."""

    def __init__(self, encoder, taken):
        self.encoder, self.taken = encoder, taken

    def __getattr__(self, name):
        return getattr(self.encoder, name)

    def count_chunk(self, text, max_rows):
        rows = self.encoder.count_chunk(text, max_rows)
        self.taken.append(rows >= 0)
        return rows


class _PythonOnly(_Counting):
    """Refuses every chunk, so that the Python parser reads the whole file."""

    def count_chunk(self, text, max_rows):
        return -1

    def encode_chunk(self, text, max_rows, offsets):
        return None


def prepare_both_ways(tmp_path, monkeypatch, src, **options):
    """prepare_criteo with native and Python chunks mixed, then with the Python parser alone:
    {way: (output folder or the error's message, what was logged)}, and the native flags."""
    from hetu.data import tabular
    native_encoder, taken, results = tabular.click_log_encoder, [], {}
    for way, wrapper in [("mixed", _Counting), ("python", _PythonOnly)]:
        monkeypatch.setattr(tabular, "click_log_encoder",
                            lambda layout, wrapper=wrapper: wrapper(native_encoder(layout), taken))
        log = tmp_path / f"{way}.log"
        with open(log, "w") as stream:
            try:
                result = prepare_criteo(src, tmp_path / way, progress=False, log=stream, **options)
            except DataFormatError as e:
                result = str(e)
        results[way] = (result, log.read_text())
    return results, taken


def assert_same_dataset(a, b):
    for name in ("dense.npy", "sparse.npy", "labels.npy"):
        np.testing.assert_array_equal(np.load(a / name), np.load(b / name))
    meta = [json.loads((out / "meta.json").read_text()) for out in (a, b)]
    assert meta[0] == meta[1]
    return meta[0]


@pytest.mark.parametrize("chunk_bytes", [97, 4096, 1 << 24])
def test_native_and_python_parsers_write_the_same_dataset(tmp_path, monkeypatch, chunk_bytes):
    """The native encoder takes the plainly clean chunks, the Python parser the rest: whichever
    takes a chunk, the dataset and the bad lines reported are the same as with the Python parser
    alone (every chunk refused natively)."""
    src = tmp_path / "train.txt"
    src.write_bytes(messy_criteo(np.random.default_rng(0), 600))
    results, native_chunks = prepare_both_ways(tmp_path, monkeypatch, src, skip_bad_lines=True, min_count=2,
                                               chunk_bytes=chunk_bytes)
    (mixed, mixed_log), (python, python_log) = results["mixed"], results["python"]
    assert any(native_chunks) and (chunk_bytes == 1 << 24 or not all(native_chunks))
    # 16 lines of two columns; 16 lines cut in two by a lone '\\r' (the line numbers after the
    # first of them count both halves)
    assert mixed_log == python_log and "skipped 48 bad line(s)" in python_log
    assert "train.txt:30: expected 40 columns, found 2" in python_log
    assert "train.txt:32: expected 40 columns, found 21" in python_log
    assert "train.txt:33: expected 40 columns, found 20" in python_log
    assert assert_same_dataset(mixed, python)["num_rows"] == 600 - 32
    # each unusual value is a value of its own (seen 17 and 16 times: kept at min_count 2); line
    # 37k + j is row 35k + j for j < 29 (each 37 lines lose two)
    sparse = np.load(python / "sparse.npy")
    for row, field in [(17, 0), (23, 1)]:
        ids = set(sparse[row::35, field])
        assert len(ids) == 1 and ids.isdisjoint(np.delete(sparse[:, field], np.s_[row::35]))


@pytest.mark.parametrize("chunk_bytes,rows,skip", [(97, 100, True), (4096, 251, True), (1 << 20, 30, True),
                                                   (97, None, False), (4096, 29, False)])
def test_native_and_python_parsers_agree_on_row_limits_and_errors(tmp_path, monkeypatch, chunk_bytes, rows, skip):
    src = tmp_path / "train.txt"
    src.write_bytes(messy_criteo(np.random.default_rng(1), 300))
    results, _ = prepare_both_ways(tmp_path, monkeypatch, src, rows=rows, skip_bad_lines=skip,
                                   chunk_bytes=chunk_bytes)
    (mixed, mixed_log), (python, python_log) = results["mixed"], results["python"]
    assert mixed_log == python_log
    if rows == 29 or not skip and rows is None:
        # the first bad line is line 30: within the limit it stops both, before it neither
        if rows == 29:
            assert assert_same_dataset(mixed, python)["num_rows"] == 29
        else:
            assert mixed == python and mixed.startswith(f"{src}:30: expected 40 columns, found 2")
    else:
        assert assert_same_dataset(mixed, python)["num_rows"] == rows


def test_dataset_does_not_depend_on_the_thread_count(tmp_path):
    """Lines are encoded in ranges and fields counted by different threads: one thread and two
    write the same files (20,000 lines: several line ranges per chunk)."""
    rng = np.random.default_rng(2)
    lines = [criteo_line(int(rng.integers(0, 2)), {k: int(rng.integers(0, 9)) for k in range(1, 14)},
                         {c: "%x" % int(rng.zipf(1.3) % 5000) for c in range(1, NUM_CATS + 1)})
             for _ in range(20000)]
    src = write(tmp_path, "train.txt", "".join(lines))
    for threads in (1, 2):
        env = dict(os.environ, HETU_NUM_THREADS=str(threads))
        proc = jobs.run([sys.executable, "-m", "hetu.data.prepare", "criteo", "--input", str(src),
                         "--output", str(tmp_path / f"t{threads}"), "--quiet"], capture_output=True, text=True,
                        env=env, timeout=120)
        assert proc.returncode == 0, proc.stderr
    for name in ("dense.npy", "sparse.npy", "labels.npy", "meta.json"):
        assert (tmp_path / "t1" / name).read_bytes() == (tmp_path / "t2" / name).read_bytes(), name


def test_a_value_too_long_for_the_dictionary_is_an_error_not_a_crash(tmp_path):
    # values are stored with a 24-bit length; the counting threads must not be the ones to find out
    src = write(tmp_path, "train.txt", CRITEO_ROWS[0] + criteo_line(1, {}, {21: "x" * (1 << 24)}))
    with pytest.raises(ValueError, match="a value of 16 MB or more"):
        prepare_criteo(src, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_clean_file_is_encoded_natively(tmp_path, monkeypatch):
    from hetu.data import tabular
    src = write(tmp_path, "train.txt", "".join(CRITEO_ROWS * 50))
    monkeypatch.setattr(tabular, "parse_chunk", lambda *a, **k: pytest.fail("Python parser used"))
    out = prepare_criteo(src, tmp_path / "out", chunk_bytes=1000, progress=False)
    assert json.loads((out / "meta.json").read_text())["num_rows"] == 300


def test_truncated_file_alone_is_reported(tmp_path):
    src = write(tmp_path, "train.txt", "".join(CRITEO_ROWS) + CRITEO_ROWS[0][:30])
    with pytest.raises(DataFormatError, match=r"train\.txt:7: file truncated"):
        prepare_criteo(src, tmp_path / "out", progress=False)


def test_missing_input_names_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        prepare_criteo(tmp_path / "nope.txt", tmp_path / "out", progress=False)


def test_interrupted_write_leaves_nothing_that_looks_valid(tmp_path, monkeypatch):
    src = write(tmp_path, "train.txt", "".join(CRITEO_ROWS))

    def fail(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(store, "write_meta", fail)
    with pytest.raises(KeyboardInterrupt):
        prepare_criteo(src, tmp_path / "out", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.txt"]


def test_existing_output_is_not_overwritten_without_force(tmp_path):
    src = write(tmp_path, "train.txt", "".join(CRITEO_ROWS))
    out = prepare_criteo(src, tmp_path / "out", progress=False)
    with pytest.raises(FileExistsError):
        prepare_criteo(src, out, progress=False)
    prepare_criteo(src, out, rows=2, overwrite=True, progress=False)
    assert json.loads((out / "meta.json").read_text())["num_rows"] == 2


AVAZU_HEADER = ("id,click,hour,C1,banner_pos,site_id,site_domain,site_category,app_id,"
                "app_domain,app_category,device_id,device_ip,device_model,device_type,"
                "device_conn_type,C14,C15,C16,C17,C18,C19,C20,C21\n")


def avazu_line(row_id, click, hour, site_id):
    # the 19 columns after site_id are the same constant in every row
    return ",".join([str(row_id), str(click), hour, "1005", "0", site_id] + ["k"] * 18) + "\n"


def test_avazu_parses_to_hand_computed_arrays(tmp_path):
    rows = [avazu_line(10000000 + i, click, hour, site)
            for i, (click, hour, site) in enumerate([
                (0, "14102100", "s1"), (1, "14102100", "s2"), (0, "14102101", "s1"),
                (1, "14102101", "s1"), (0, "14102100", "")])]
    src = write(tmp_path, "train", AVAZU_HEADER + "".join(rows))
    out = prepare_avazu(src, tmp_path / "out", progress=False)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["num_fields"] == 22 and meta["num_dense"] == 0
    assert meta["field_names"][0] == "hour" and meta["field_names"][3] == "site_id"
    # hour: 14102100 x3 -> 1, 14102101 x2 -> 2 (size 3); C1, banner_pos constant (size 2);
    # site_id: s1 x3 -> 1, s2 -> 2, missing -> 0 (size 3); the 18 others constant (size 2).
    assert meta["field_sizes"] == [3, 2, 2, 3] + [2] * 18
    offsets = [0, 3, 5, 7] + [10 + 2 * k for k in range(18)]
    assert meta["field_offsets"] == offsets
    local = [(1, 1), (1, 2), (2, 1), (2, 1), (1, 0)]
    expected = np.array([[h, 1, 1, s] + [1] * 18 for h, s in local]) + np.array(offsets)
    np.testing.assert_array_equal(np.load(out / "sparse.npy"), expected)
    assert np.load(out / "dense.npy").shape == (5, 0)
    np.testing.assert_array_equal(np.load(out / "labels.npy")[:, 0], [0, 1, 0, 1, 0])
    assert load_dataset(out).train.dense is None


def test_avazu_line_ends(tmp_path):
    """'\\r\\n' line ends (header included) give the same dataset as '\\n'; old Mac '\\r' ends,
    which would hide lines from a reader that splits at '\\n', are refused."""
    rows = [avazu_line(10000000 + i, click, "14102100", site) for i, (click, site) in
            enumerate([(0, "s1"), (1, "s2"), (0, "s1")])]
    text = AVAZU_HEADER + "".join(rows)
    unix = prepare_avazu(write(tmp_path, "unix", text), tmp_path / "unix-out", progress=False)
    (tmp_path / "dos").write_bytes(text.replace("\n", "\r\n").encode())
    dos = prepare_avazu(tmp_path / "dos", tmp_path / "dos-out", progress=False)
    for name in ("sparse.npy", "labels.npy"):
        np.testing.assert_array_equal(np.load(dos / name), np.load(unix / name))
    (tmp_path / "mac").write_bytes(text.replace("\n", "\r").encode())
    with pytest.raises(DataFormatError, match=r"mac:1: the header ends in a lone carriage return"):
        prepare_avazu(tmp_path / "mac", tmp_path / "mac-out", progress=False)
    assert not (tmp_path / "mac-out").exists()


def test_avazu_bad_header_and_bad_label(tmp_path):
    src = write(tmp_path, "train", "id,hour,C1\n" + avazu_line(1, 0, "14102100", "s"))
    with pytest.raises(DataFormatError, match=r"train:1: expected the avazu header"):
        prepare_avazu(src, tmp_path / "out", progress=False)
    src = write(tmp_path, "train2", AVAZU_HEADER + avazu_line(1, 0, "14102100", "s")
                + avazu_line(2, "yes", "14102100", "s"))
    with pytest.raises(DataFormatError, match=r"train2:3: column 2: label must be 0 or 1"):
        prepare_avazu(src, tmp_path / "out", progress=False)


U_DATA = "196\t242\t3\t881250949\n186\t302\t3\t891717742\n22\t377\t1\t878887116\n" \
         "196\t377\t4\t881250950\n22\t242\t5\t878887117\n"
# users 22, 186, 196 -> 0, 1, 2; items 242, 302, 377 -> 0, 1, 2 (+3 offset)
ML_SPARSE = np.array([[2, 3], [1, 4], [0, 5], [2, 5], [0, 3]], dtype=np.int64)


def test_movielens_u_data_binary_and_rating_labels(tmp_path):
    src = write(tmp_path, "u.data", U_DATA)
    out = prepare_movielens(src, tmp_path / "bin", shuffle_seed=None, progress=False)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["field_sizes"] == [3, 3] and meta["num_embeddings"] == 6
    assert meta["label"] == {"kind": "binary", "rule": "rating >= threshold", "threshold": 4.0, "values": [0.0, 1.0]}
    np.testing.assert_array_equal(np.load(out / "sparse.npy"), ML_SPARSE)
    np.testing.assert_array_equal(np.load(out / "labels.npy")[:, 0], [0, 0, 0, 1, 1])
    rated = prepare_movielens(src, tmp_path / "rating", label="rating", shuffle_seed=None,
                              progress=False)
    np.testing.assert_array_equal(np.load(rated / "labels.npy")[:, 0], [3, 3, 1, 4, 5])


def test_movielens_csv_and_dat_formats(tmp_path):
    csv = "userId,movieId,rating,timestamp\n" + U_DATA.replace("\t", ",").replace(",4,", ",4.5,")
    out = prepare_movielens(write(tmp_path, "ratings.csv", csv), tmp_path / "csv",
                            label="rating", shuffle_seed=None, progress=False)
    np.testing.assert_array_equal(np.load(out / "sparse.npy"), ML_SPARSE)
    np.testing.assert_array_equal(np.load(out / "labels.npy")[:, 0], [3, 3, 1, 4.5, 5])
    dat = prepare_movielens(write(tmp_path, "ratings.dat", U_DATA.replace("\t", "::")),
                            tmp_path / "dat", shuffle_seed=None, progress=False)
    np.testing.assert_array_equal(np.load(dat / "sparse.npy"), ML_SPARSE)


def test_movielens_time_order(tmp_path):
    # a sixth rating at the same second as the third: ties keep file order
    src = write(tmp_path, "u.data", U_DATA + "186\t242\t2\t878887116\n")
    out = prepare_movielens(src, tmp_path / "time", shuffle_seed=None, time_order=True, progress=False)
    by_time = [2, 5, 4, 0, 3, 1]
    np.testing.assert_array_equal(np.load(out / "sparse.npy"), np.vstack([ML_SPARSE, [[1, 3]]])[by_time])
    np.testing.assert_array_equal(np.load(out / "ratings.npy")[:, 0], np.array([3, 3, 1, 4, 5, 2])[by_time])
    meta = json.loads((out / "meta.json").read_text())
    assert meta["source"]["order"] == "time" and meta["split"]["val_rows"] == 1
    assert sorted(p.name for p in out.iterdir()) == ["dense.npy", "labels.npy", "meta.json", "ratings.npy",
                                                     "sparse.npy", "vocabulary.npz"]
    with pytest.raises(ValueError, match="exclude each other"):
        prepare_movielens(src, tmp_path / "both", shuffle_seed=1, time_order=True, progress=False)
    cli = run_cli("movielens", "--input", src, "--output", tmp_path / "cli", "--time-order", "--quiet")
    assert cli.returncode == 0, cli.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "cli" / "sparse.npy"), np.load(out / "sparse.npy"))
    refused = run_cli("movielens", "--input", src, "--output", tmp_path / "cli2", "--time-order",
                      "--shuffle-seed", "4", "--quiet")
    assert refused.returncode == 2 and "exclude each other" in refused.stderr
    assert not (tmp_path / "cli2").exists()


def test_movielens_bad_line(tmp_path):
    src = write(tmp_path, "u.data", U_DATA + "7\tabc\t3\t1\n")
    with pytest.raises(DataFormatError, match=r"u\.data:6: column 2: expected a number"):
        prepare_movielens(src, tmp_path / "out", progress=False)
    late = write(tmp_path, "late.data", U_DATA + "7\t242\t3\tyesterday\n")
    with pytest.raises(DataFormatError, match=r"late\.data:6: column 4: expected a number, found 'yesterday'"):
        prepare_movielens(late, tmp_path / "late", progress=False)
    out = prepare_movielens(src, tmp_path / "out", skip_bad_lines=True, progress=False)
    assert json.loads((out / "meta.json").read_text())["num_rows"] == 5


def run_cli(*args):
    return jobs.run([sys.executable, "-m", "hetu.data.prepare", *map(str, args)],
                    capture_output=True, text=True, timeout=60)


def test_cli_exit_status_and_messages(tmp_path):
    src = write(tmp_path, "train.txt", BAD_CRITEO)
    failed = run_cli("criteo", "--input", src, "--output", tmp_path / "a", "--quiet")
    assert failed.returncode == 2 and "train.txt:3: expected 40 columns" in failed.stderr
    assert not (tmp_path / "a").exists()
    skipped = run_cli("criteo", "--input", src, "--output", tmp_path / "a", "--quiet",
                      "--skip-bad-lines")
    assert skipped.returncode == 0, skipped.stderr
    assert "skipped 4 bad line(s)" in skipped.stderr
    missing = run_cli("avazu", "--input", tmp_path / "absent.csv", "--output", tmp_path / "b")
    assert missing.returncode == 2 and "absent.csv" in missing.stderr
