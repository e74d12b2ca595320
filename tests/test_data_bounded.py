"""The synthetic generator in bounded memory: law 2's memory does not grow with the table's rows,
its documented law (ranks, permutation, hashed normals), and law 1's bytes kept as they were."""
import json
import sys

import numpy as np
import pytest

import jobs
from data_digest import arrays_digest
from hetu.data import generate_synthetic, load_dataset, top_rows_lookup_share
from hetu.data.store import NpyWriter, create_array, npy_row_chunks
from hetu.data.synthetic import (HEAD_RANKS, FeistelPermutation, PowerLawRanks, ZipfRanks,
                                 hashed_normals, synthetic_spec)


# sha256 of dense, sparse and labels .npy written by the generator before law 2 existed
LAW1_DIGESTS = {
    "criteo-chunks": (dict(rows=140_000, scale=0.001),   # two chunks of 131072 rows
                      "1ef4f72c78a9dbbed5866f165782c01ae7e2a5c4b765841ef94737603ec468e0"),
    "multihot": (dict(shape="criteo-multihot", rows=9000, scale=0.0002),   # chunks of 8192
                 "438285e014c3dc7f9125c75b7b54fc58db4cab73a2bd393637a848f3b5b01653"),
    "multihot-sessions-drift": (
        dict(shape="criteo-multihot", rows=3000, scale=0.0001, sessions=True, drift=0.1,
             hotness_scale=0.5),
        "4eb033d015eac416ee9de86447fa4de0b69d9be786d7cbf10e0eac611ed985d9"),
    "avazu-sessions": (dict(shape="avazu", rows=2000, sessions=True, seed=3),
                       "df69a6efc52fe71b174c6c88df5c0028be25309c02b390fb623724049b0fa321"),
}


@pytest.mark.parametrize("case", sorted(LAW1_DIGESTS))
def test_law1_writes_the_bytes_it_always_wrote(tmp_path, case):
    params, expected = LAW1_DIGESTS[case]
    folder = generate_synthetic(tmp_path / case, law=1, progress=False, **params)
    assert arrays_digest(folder) == expected
    assert "law" not in json.loads((folder / "meta.json").read_text())["source"]["spec"]


# Peak RSS of a generator run, in a fresh interpreter whose only child is the generator
# (RUSAGE_CHILDREN's ru_maxrss is the largest child reaped so far).
PEAK_RSS_SCRIPT = """
import resource, subprocess, sys
subprocess.run([sys.executable, "-m", "hetu.data.prepare", "synthetic", "--quiet"] + sys.argv[1:],
               check=True, stdout=subprocess.DEVNULL)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


@pytest.mark.parametrize("args", [
    # 33.8M table rows: law 1 holds about 64 bytes a row (over 2 GB)
    ["--shape", "criteo", "--scale", "1", "--rows", "3000"],
    # 40.9M rows, bags of 54 ids
    ["--shape", "criteo-multihot", "--scale", "0.2", "--hotness-scale", "0.25", "--rows", "600"],
], ids=["criteo-scale1", "multihot-scale0.2"])
def test_peak_memory_does_not_grow_with_the_table(tmp_path, args):
    output = tmp_path / "d"
    proc = jobs.run([sys.executable, "-c", PEAK_RSS_SCRIPT, "--output", str(output)] + args,
                    capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    peak_mib = int(proc.stdout.split()[-1]) / 1024
    meta = json.loads((output / "meta.json").read_text())
    assert meta["num_embeddings"] > 33_000_000 and meta["source"]["spec"]["law"] == 2
    # law 1 needs over 2000 MiB for these tables
    assert peak_mib < 700, f"peak RSS {peak_mib:.0f} MiB for {meta['num_embeddings']} table rows"


@pytest.mark.parametrize("size", [1, 2, 3, 5, 16, 1000, 65537])
def test_feistel_permutation_is_a_seeded_bijection(size):
    ranks = np.arange(size)
    ids = FeistelPermutation(size, [1, 2, 3, 4])[ranks]
    assert ids.dtype == np.int64 and np.array_equal(np.sort(ids), ranks)
    assert np.array_equal(FeistelPermutation(size, [1, 2, 3, 4])[ranks[::-1]], ids[::-1])
    if size >= 1000:
        other = FeistelPermutation(size, [5, 6, 7, 8])[ranks]
        assert np.mean(other == ids) < 0.01
        # hot ranks land all over the id space, not in a block
        assert np.ptp(ids[:20]) > size / 2


def test_power_law_ranks_follow_the_documented_law():
    rng = np.random.default_rng(0)
    u = rng.random(400_000)
    # a table within the head: the same law as law 1's whole CDF
    small = PowerLawRanks(5000, 1.05)(u)
    assert np.mean(small == ZipfRanks(5000, 1.05)(u)) > 0.9999
    # beyond the head, rank r has the mass of x^-a over [r - 1/2, r + 1/2]: compare the share
    # of draws in bands of ranks with the exact discrete law's
    size, exponent = 3_000_000, 1.05
    ranks = PowerLawRanks(size, exponent)(u)
    assert ranks.min() >= 0 and ranks.max() < size
    weights = np.arange(1, size + 1, dtype=np.float64) ** -exponent
    cdf = np.concatenate([[0.0], np.cumsum(weights) / weights.sum()])
    for low, high in [(0, 1), (1, 10), (10, HEAD_RANKS), (HEAD_RANKS, 4 * HEAD_RANKS),
                      (4 * HEAD_RANKS, size)]:
        expected = cdf[high] - cdf[low]
        observed = np.mean((ranks >= low) & (ranks < high))
        assert abs(observed - expected) < 5 * np.sqrt(expected * (1 - expected) / len(u)) + 1e-4, \
            (low, high, observed, expected)
    uniform = PowerLawRanks(10 * HEAD_RANKS, 0.0)(u)
    assert abs(np.mean(uniform < HEAD_RANKS) - 0.1) < 0.005


def test_hashed_normals_are_normal_and_depend_on_id_and_key_only():
    ids = np.arange(200_000, dtype=np.int64) * 7919
    values = hashed_normals(ids, 12345, 4)
    assert values.shape == (200_000, 4)
    assert abs(values.mean()) < 0.01 and abs(values.std() - 1) < 0.01
    assert abs(np.corrcoef(values[:, 0], values[:, 1])[0, 1]) < 0.01
    assert np.mean(np.abs(values) > 1.96) == pytest.approx(0.05, abs=0.003)
    assert np.array_equal(hashed_normals(ids[::-1], 12345, 4), values[::-1])
    assert np.array_equal(hashed_normals(ids, 12345, 3), values[:, :3])
    assert np.mean(hashed_normals(ids, 12346, 4) == values) < 1e-3


def test_law2_dataset_is_deterministic_and_recorded(tmp_path):
    a = generate_synthetic(tmp_path / "a", shape="criteo-multihot", rows=3000, scale=0.001,
                           law=2, progress=False)
    b = generate_synthetic(tmp_path / "b", shape="criteo-multihot", rows=3000, scale=0.001,
                           law=2, progress=False)
    c = generate_synthetic(tmp_path / "c", shape="criteo-multihot", rows=3000, scale=0.001,
                           seed=1, law=2, progress=False)
    assert arrays_digest(a) == arrays_digest(b) != arrays_digest(c)
    data = load_dataset(a)
    assert data.meta.info["source"]["spec"]["law"] == 2
    # by default: law 1 (the bytes of earlier versions) where its memory is bounded, law 2 beyond
    assert synthetic_spec().drawn_law == synthetic_spec("criteo-multihot").drawn_law == 1
    assert synthetic_spec("criteo", scale=1).drawn_law == synthetic_spec("criteo-multihot", scale=0.1).drawn_law == 2
    sparse = np.concatenate([data.train.sparse, data.val.sparse])
    ends = np.cumsum(data.meta.field_sizes) + 0
    starts = ends - np.asarray(data.meta.field_sizes)
    columns = np.repeat(np.arange(len(starts)), data.meta.info["field_slots"])
    assert np.all(sparse >= starts[columns]) and np.all(sparse < ends[columns])
    measured = data.meta.info["source"]["measured"]
    assert measured["hidden_logit_auc"] > 0.7 and 0.2 <= measured["positive_rate"] <= 0.3


def test_lookup_share_counted_by_ranges_and_chunks_is_the_same():
    rng = np.random.default_rng(1)
    sparse = np.minimum(rng.zipf(1.3, size=(5000, 7)), 99_999) - 1
    sparse[::7, 3] = -1   # bag padding is not a lookup
    whole = top_rows_lookup_share(sparse, 100_000, 0.01)
    chunks = lambda: (sparse[i:i + 999] for i in range(0, len(sparse), 999))   # noqa: E731
    assert top_rows_lookup_share(chunks, 100_000, 0.01, id_range=3001) == whole
    counts = np.bincount(sparse[sparse >= 0], minlength=100_000)
    assert whole == np.sort(counts)[-1000:].sum() / counts.sum()


def test_npy_writer_writes_what_a_memory_map_would(tmp_path):
    values = np.arange(70 * 3, dtype=np.int64).reshape(70, 3) * 31
    mapped = create_array(tmp_path, "a.npy", np.int64, values.shape)
    mapped[:] = values
    mapped.flush()
    del mapped
    with NpyWriter(tmp_path, "b.npy", np.int64, values.shape) as writer:
        writer.write(values[:50])
        writer.write(values[50:])
    assert (tmp_path / "a.npy").read_bytes() == (tmp_path / "b.npy").read_bytes()
    assert np.array_equal(np.concatenate(list(npy_row_chunks(tmp_path / "b.npy", 32))), values)
    with pytest.raises(ValueError, match="1 rows written of 2"):
        with NpyWriter(tmp_path, "c.npy", np.float32, (2, 1)) as writer:
            writer.write(np.zeros((1, 1)))
