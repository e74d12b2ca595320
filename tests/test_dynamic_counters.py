"""Per-server counters of a dynamic table (docs/design.md section 13): an admission, an eviction
and a read of a key without a row count on the server that holds the slot concerned."""
import numpy as np
import pytest

from hetu import _C
from hetu.dynamic import DynamicTable, TableKeys


def run(monkeypatch, placement, steps=30, seed=0):
    monkeypatch.setenv("PS_ROW_PLACEMENT", placement)
    table = DynamicTable(64, admit_after=2)   # 4 buckets of 16 ways
    keys = TableKeys(table, "t", servers=2)
    rng = np.random.default_rng(seed)
    for step in range(steps):
        batch = rng.integers(0, 5000, 96)
        keys.train(step, batch, batch)
    return table, keys


@pytest.mark.parametrize("placement", ["strided", "contiguous"])
def test_misses_count_on_the_server_of_the_keys_home_slot(monkeypatch, placement):
    table, keys = run(monkeypatch, placement)
    counts = keys._server_counts
    total = keys.counters()
    assert counts[:, 2].sum() == total["missed"] and counts[:, 0].sum() == total["admitted"]
    assert (counts[:, 2] > total["missed"] // 4).all(), counts   # both servers take a share of the misses
    # Each miss on the server of its key's home slot: the way of its bucket the hash's quotient picks.
    k = np.arange(1000, dtype=np.int64)
    h = _C.bucket_hash(k)
    home = (h % np.uint64(table.num_buckets)) * np.uint64(table.ways) + (h // np.uint64(table.num_buckets)) % np.uint64(table.ways)
    assert keys.home_slots(k).tolist() == home.astype(np.int64).tolist()
    bucket = keys.home_slots(k) // table.ways
    assert (bucket == (h % np.uint64(table.num_buckets)).astype(np.int64)).all()   # a slot of the key's bucket
    lines = keys.counter_lines("t")
    assert [int(line.split(", ")[-1].split()[0]) for line in lines] == counts[:, 2].tolist()
