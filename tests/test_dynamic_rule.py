"""The dynamic tables' rule (docs/design.md section 13) as _C.KeyDirectory builds it, against a plain
Python model of the same text, on random batch sequences and on one case per sentence of the rule."""
import numpy as np
import pytest

from hetu import _C

MASK = (1 << 64) - 1


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


class Rule:
    """Section 13 read literally: buckets of ways, counts, last reads, probation per bucket."""

    def __init__(self, capacity, buckets, admit_after=1, ttl=0, probation_ways=None):
        self.buckets, self.ways = buckets, capacity // buckets
        self.admit_after, self.ttl = admit_after, ttl
        self.pways = self.ways if probation_ways is None else probation_ways
        self.slot = {}  # resident key -> [slot, count, last read]
        self.probation = {}  # key -> [index, count, last read]
        self.admitted = self.evicted = self.missed = 0

    def bucket(self, key):
        return splitmix64(key & MASK) % self.buckets

    def _give(self, held, first, n, t):
        """Ways first..first+n-1 in the order a bucket gives them up: free, then oldest read, smaller key."""
        taken = {v[0]: (v[2], k) for k, v in held.items() if first <= v[0] < first + n}
        free = [first + w for w in range(n) if first + w not in taken]
        old = sorted((rk, s) for s, rk in taken.items() if rk[0] < t)
        return free + [s for _, s in old]

    def _evict(self, key, out):
        out["evicted"].append((key, self.slot.pop(key)[0]))
        self.evicted += 1

    def step(self, t, keys):
        read = sorted(set(int(k) for k in keys))
        out = {"admitted": [], "evicted": []}
        newcomers, waiting = {}, {}
        # A key's count rises by one for each global batch that reads it.
        for k in read:
            if k in self.slot:
                self.slot[k][1] += 1
                self.slot[k][2] = t
                continue
            count = self.probation.pop(k)[1] + 1 if k in self.probation else 1
            group = newcomers if count >= self.admit_after else waiting
            group.setdefault(self.bucket(k), []).append((k, count))
        # Keys not read for more than ttl steps leave.
        if self.ttl:
            for k in sorted(k for k, v in self.slot.items() if t - v[2] > self.ttl):
                self._evict(k, out)
        # Admissions: free ways, then the oldest-read keys not read at t leave; larger newcomers wait.
        for b, group in sorted(newcomers.items()):
            places = self._give(self.slot, b * self.ways, self.ways, t)[: len(group)]
            for s in places:
                holder = [k for k, v in self.slot.items() if v[0] == s]
                if holder:
                    self._evict(holder[0], out)
            for (k, count), s in zip(group, sorted(places)):
                self.slot[k] = [s, count, t]
                out["admitted"].append((k, s))
                self.admitted += 1
            waiting.setdefault(b, []).extend(group[len(places):])
        # Counts of keys not admitted: probation, evicted the same way.
        for b, group in sorted(waiting.items()):
            group.sort()
            places = self._give(self.probation, b * self.pways, self.pways, t) if self.pways else []
            for (k, count), j in zip(group, places):
                for old in [q for q, v in self.probation.items() if v[0] == j]:
                    del self.probation[old]
                self.probation[k] = [j, count, t]
        slots = [self.slot[k][0] if k in self.slot else -1 for k in read]
        self.missed += slots.count(-1)
        out["admitted"].sort()
        out["evicted"].sort()
        return read, slots, out

    def state(self):
        res = sorted((v[0], k, v[1], v[2]) for k, v in self.slot.items())
        pro = sorted((v[0], k, v[1], v[2]) for k, v in self.probation.items())
        return ([r[1] for r in res], [r[0] for r in res], [r[2] for r in res], [r[3] for r in res],
                [p[1] for p in pro], [p[0] for p in pro], [p[2] for p in pro], [p[3] for p in pro])


STATE_COLUMNS = ("keys", "slots", "counts", "last_read", "probation_keys", "probation_index",
                 "probation_counts", "probation_last_read")


def assert_same_step(got, want, rule):
    read, slots, out = want
    assert got["keys"].tolist() == read
    assert got["slots"].tolist() == slots
    assert list(zip(got["admitted_keys"].tolist(), got["admitted_slots"].tolist())) == out["admitted"]
    assert list(zip(got["evicted_keys"].tolist(), got["evicted_slots"].tolist())) == out["evicted"]
    assert (got["admitted"], got["evicted"], got["missed"]) == (rule.admitted, rule.evicted, rule.missed)
    assert got["resident"] == len(rule.slot) <= got["capacity"]


def assert_same_state(directory, rule):
    state = directory.state()
    assert tuple(state[c].tolist() for c in STATE_COLUMNS) == rule.state()


def drifting_batches(rng, steps, batch, universe, drift):
    """Zipf-like reads over a window of keys that slides by `drift` a step: keys come and go."""
    base = rng.integers(-(1 << 62), 1 << 62, size=universe + steps * drift)
    for t in range(steps):
        window = base[t * drift: t * drift + universe]
        ranks = np.minimum(rng.zipf(1.3, size=batch) - 1, universe - 1)
        yield window[ranks]


CASES = [  # capacity, buckets, admit_after, ttl, probation ways
    (32, 8, 1, 0, None), (32, 8, 3, 0, None), (32, 8, 1, 4, None), (32, 8, 3, 5, None),
    (24, 1, 1, 0, None), (24, 1, 3, 3, None), (64, 64, 2, 0, None), (48, 4, 3, 0, 2),
    (48, 4, 1, 6, 0), (256, 16, 1, 10, None),
]


@pytest.mark.parametrize("capacity,buckets,admit_after,ttl,pways", CASES)
def test_matches_the_rule_on_random_sequences(capacity, buckets, admit_after, ttl, pways):
    rng = np.random.default_rng(capacity * 7 + buckets * 3 + admit_after + ttl)
    kwargs = {} if pways is None else {"probation_ways": pways}
    directory = _C.KeyDirectory(capacity, buckets, admit_after, ttl, **kwargs)
    rule = Rule(capacity, buckets, admit_after, ttl, pways)
    totals = {"admitted": 0, "evicted": 0, "missing": 0}
    for t, keys in enumerate(drifting_batches(rng, 80, 3 * capacity, 6 * capacity, max(1, capacity // 8))):
        got = directory.step(t, keys)
        assert_same_step(got, rule.step(t, keys), rule)
        assert_same_state(directory, rule)
        totals["admitted"] += len(got["admitted_keys"])
        totals["evicted"] += len(got["evicted_keys"])
        totals["missing"] += int((got["slots"] < 0).sum())
    # The sequences do exercise admission, eviction and keys without rows.
    assert min(totals.values()) > 0


def test_independent_of_order_repeats_and_split():
    rng = np.random.default_rng(5)
    batches = list(drifting_batches(rng, 40, 200, 400, 10))
    runs = []
    for variant in range(3):
        d = _C.KeyDirectory(64, 8, 2, 5)
        trace = []
        for t, keys in enumerate(batches):
            if variant == 1:  # another order
                keys = rng.permutation(keys)
            if variant == 2:  # as three workers would send them: each worker's keys, repeated
                keys = np.concatenate([np.unique(part) for part in np.array_split(keys, 3)] * 2)
            r = d.step(t, keys)
            trace.append({k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in r.items()})
        runs.append(trace)
    assert runs[0] == runs[1] == runs[2]


def test_never_evicts_a_key_read_at_the_step_and_larger_newcomers_wait():
    d = _C.KeyDirectory(2, 1)
    d.step(0, np.array([1, 2]))
    r = d.step(1, np.array([1, 2, 3]))
    assert r["slots"].tolist() == [0, 1, -1] and r["evicted_keys"].size == 0 and r["missed"] == 1
    d = _C.KeyDirectory(2, 1)
    d.step(0, np.array([1]))
    r = d.step(1, np.array([20, 1, 10]))
    assert r["keys"].tolist() == [1, 10, 20] and r["slots"].tolist() == [0, 1, -1]
    # The waiting key's count is kept: it is admitted when it is read again.
    assert d.state()["probation_keys"].tolist() == [20] and d.state()["probation_counts"].tolist() == [1]
    r = d.step(2, np.array([20]))
    assert r["admitted_keys"].tolist() == [20]


def test_oldest_read_leaves_and_ties_go_to_the_smaller_key():
    d = _C.KeyDirectory(2, 1)
    d.step(0, np.array([8]))
    d.step(1, np.array([3]))
    r = d.step(2, np.array([9]))  # 8 was read longest ago, though 3 is smaller
    assert r["evicted_keys"].tolist() == [8] and r["admitted_slots"].tolist() == [0]
    d = _C.KeyDirectory(2, 1)
    d.step(0, np.array([7, 5]))
    r = d.step(1, np.array([9]))  # 5 and 7 last read at 0: the smaller leaves
    assert r["evicted_keys"].tolist() == [5] and d.lookup(np.array([5, 7, 9])).tolist() == [-1, 1, 0]


def test_admission_after_k_reads_and_a_returning_key_starts_afresh():
    d = _C.KeyDirectory(1, 1, admit_after=2)
    assert d.step(0, np.array([4]))["slots"].tolist() == [-1]
    assert d.step(1, np.array([4]))["admitted_keys"].tolist() == [4]
    d.step(2, np.array([6]))
    r = d.step(3, np.array([6]))  # 6 reaches 2 reads: 4 leaves, its count forgotten
    assert r["evicted_keys"].tolist() == [4] and r["admitted_keys"].tolist() == [6]
    assert d.step(4, np.array([4]))["slots"].tolist() == [-1]  # counts from zero again
    r = d.step(5, np.array([4]))
    assert r["admitted_keys"].tolist() == [4] and r["evicted_keys"].tolist() == [6]
    assert d.counters() == {"resident": 1, "capacity": 1, "admitted": 3, "evicted": 2, "missed": 3}


def test_ttl_evicts_keys_not_read_for_ttl_steps():
    d = _C.KeyDirectory(4, 1, ttl=2)
    d.step(0, np.array([1, 2]))
    d.step(1, np.array([2]))
    assert d.step(2, np.array([3]))["evicted_keys"].size == 0  # 1: two steps without a read
    r = d.step(3, np.array([3]))
    assert r["evicted_keys"].tolist() == [1] and r["resident"] == 2  # 1: more than two
    r = d.step(6, np.array([2]))  # 3 last read at 3; 2 read at 6 is never evicted
    assert r["evicted_keys"].tolist() == [3] and r["slots"].tolist() == [1]


def test_probation_keeps_the_newest_counts():
    d = _C.KeyDirectory(2, 1, admit_after=3, probation_ways=2)
    d.step(0, np.array([10, 11]))
    d.step(1, np.array([12]))  # probation full: 10 (oldest, smaller) loses its count
    s = d.state()
    assert sorted(s["probation_keys"].tolist()) == [11, 12]
    d.step(2, np.array([12, 11, 10]))  # all read now: the smaller keys keep their counts, as newcomers do
    s = d.state()
    assert dict(zip(s["probation_keys"].tolist(), s["probation_counts"].tolist())) == {10: 1, 11: 2}
    d.step(3, np.array([11]))
    assert d.lookup(np.array([11])).tolist() == [0]


@pytest.mark.parametrize("ttl", [0, 3])
def test_save_and_restore_continue_the_same_decisions(ttl):
    rng = np.random.default_rng(11 + ttl)
    batches = list(drifting_batches(rng, 60, 150, 300, 8))
    whole, first = _C.KeyDirectory(64, 8, 2, ttl), _C.KeyDirectory(64, 8, 2, ttl)
    for t, keys in enumerate(batches[:30]):
        whole.step(t, keys)
        first.step(t, keys)
    saved = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in first.state().items()}
    resumed = _C.KeyDirectory(64, 8, 2, ttl)
    resumed.restore(saved)
    for k, v in whole.state().items():
        assert np.array_equal(resumed.state()[k], v)
    for t, keys in enumerate(batches[30:], start=30):
        a, b = whole.step(t, keys), resumed.step(t, keys)
        for k in a:
            assert np.array_equal(a[k], b[k]), (t, k)


def test_rejects_what_the_rule_cannot_hold():
    with pytest.raises(ValueError):
        _C.KeyDirectory(10, 3)
    d = _C.KeyDirectory(8, 2)
    d.step(3, np.array([1]))
    with pytest.raises(ValueError):
        d.step(3, np.array([1]))
    with pytest.raises(ValueError):
        d.step(4, np.array([np.iinfo(np.int64).min]))
    state = d.state()
    wrong = _C.KeyDirectory(8, 2)
    state["slots"] = (state["slots"] + 4) % 8  # the other bucket
    with pytest.raises(ValueError):
        wrong.restore(state)


def test_bucket_hash_is_splitmix64():
    keys = np.array([0, 1, -1, 123456789, np.iinfo(np.int64).max, np.iinfo(np.int64).min + 1])
    assert _C.bucket_hash(keys).tolist() == [splitmix64(int(k) & MASK) for k in keys]
    d = _C.KeyDirectory(70, 7)
    assert d.bucket_of(keys).tolist() == [splitmix64(int(k) & MASK) % 7 for k in keys]


@pytest.mark.parametrize("kind,a,b", [(1, -0.05, 0.05), (2, 0.0, 0.01), (3, 0.0, 1.0), (0, 0.5, 0.0)])
def test_key_rows_depend_on_the_key_alone(kind, a, b):
    keys = np.array([7, -3, 1 << 60, 7, 42])
    stream = _C.name_stream("emb")
    rows = np.empty((5, 6), np.float32)
    _C.key_rows(kind, a, b, 9, stream, keys, rows)
    assert _C.key_stream(stream, -3) == splitmix64(stream ^ splitmix64(-3 & MASK))
    for k, row in zip(keys, rows):
        want = np.empty((1, 6), np.float32)
        _C.init_fill(kind, a, b, 9, _C.key_stream(stream, int(k)), 0, want)
        assert np.array_equal(row, want[0])
    assert np.array_equal(rows[0], rows[3])
    if kind:
        assert not np.array_equal(rows[0], rows[1])
        other = np.empty((5, 6), np.float32)
        _C.key_rows(kind, a, b, 9, _C.name_stream("other"), keys, other)
        assert not np.array_equal(rows, other)


def test_buckets_decide_alone_so_servers_holding_some_of_them_agree():
    """Servers holding buckets b with b mod S = s, each stepping its own keys only, take the whole
    table's decisions, also when a state saved whole is split over another number of servers."""
    rng = np.random.default_rng(3)
    batches = list(drifting_batches(rng, 60, 200, 400, 8))
    whole = _C.KeyDirectory(64, 16, 2, 4)

    def split(state, servers):
        buckets = state["slots"] // whole.ways
        pbuckets = state["probation_index"] // whole.probation_ways
        parts = []
        for s in range(servers):
            part = dict(state, admitted=0, evicted=0, missed=0)
            for c in STATE_COLUMNS:
                part[c] = state[c][(pbuckets if c.startswith("probation") else buckets) % servers == s]
            d = _C.KeyDirectory(64, 16, 2, 4)
            d.restore(part)
            parts.append(d)
        return parts

    parts = split(whole.state(), 2)
    for t, keys in enumerate(batches):
        if t == 30:
            parts = split(whole.state(), 3)
        want = whole.step(t, keys)
        owner = whole.bucket_of(keys) % len(parts)
        got = [d.step(t, keys[owner == s]) for s, d in enumerate(parts)]
        for name in ("keys", "slots", "admitted_keys", "admitted_slots", "evicted_keys", "evicted_slots"):
            merged = np.concatenate([g[name] for g in got])
            order = np.argsort(np.concatenate([g[name.replace("slots", "keys")] for g in got]), kind="stable")
            assert np.array_equal(merged[order], want[name]), (t, name)
        assert sum(g["resident"] for g in got) == want["resident"]


@pytest.mark.parametrize("capacity,buckets,admit_after,ttl,pways", CASES)
def test_a_step_taken_ahead_is_kept_or_taken_back_exactly(capacity, buckets, admit_after, ttl, pways):
    """A revocable step (taken while the step before trains) taken back leaves the directory as it
    was, its lookups, state and counters; kept, it is the step itself: every later decision equals
    a directory that only ever stepped in turn."""
    rng = np.random.default_rng(capacity + 5 * buckets + 11 * ttl + admit_after)
    kwargs = {} if pways is None else {"probation_ways": pways}
    plain = _C.KeyDirectory(capacity, buckets, admit_after, ttl, **kwargs)
    ahead = _C.KeyDirectory(capacity, buckets, admit_after, ttl, **kwargs)
    probe = np.arange(-5, 6 * capacity, dtype=np.int64)
    taken_back = 0
    for t, keys in enumerate(drifting_batches(rng, 80, 3 * capacity, 6 * capacity, max(1, capacity // 8))):
        if rng.random() < 0.5:   # taken ahead, then taken back (a validation or a checkpoint came first)
            before, slots, counters = ahead.state(), ahead.lookup(probe), ahead.counters()
            other = rng.integers(0, 6 * capacity, size=len(keys) + 3)   # any batch: it is undone whole
            ahead.step(t, other, revocable=True)
            assert ahead.pending
            with pytest.raises(RuntimeError):
                ahead.state()
            ahead.take_back()
            assert not ahead.pending and ahead.counters() == counters
            assert np.array_equal(ahead.lookup(probe), slots)
            for k, v in ahead.state().items():
                assert np.array_equal(v, before[k]), (t, k)
            taken_back += 1
        revocable = bool(rng.random() < 0.7)
        got = ahead.step(t, keys, revocable=revocable)
        if revocable:
            ahead.keep()
        want = plain.step(t, keys)
        for k in want:
            assert np.array_equal(got[k], want[k]), (t, k)
    assert taken_back > 10
    for k, v in plain.state().items():
        assert np.array_equal(ahead.state()[k], v)
