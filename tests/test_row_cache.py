"""The worker cache's row store (hetu._C.RowCache) against a NumPy model of the HET protocol's
bookkeeping, on random traces with a simulated versioned server that steps rows by the same
optimizer rule (and another worker updating some rows); and under two threads."""
import threading

import numpy as np
import pytest

from hetu import _C
from hetu.ps import OPTIMIZERS

NEVER = _C.NEVER_VERSION
WIDTH = 4


def optimizer(kind):
    cfg = _C.OptimConfig()
    cfg.kind = OPTIMIZERS[kind]
    return cfg


class ModelRowCache:
    """Residency from a CachePolicy (tested against Python models in test_cache.py); the
    values, versions, pending updates and optimizer state in NumPy arrays indexed by slot."""

    def __init__(self, policy, capacity, bound, opt):
        self.policy = _C.CachePolicy(policy, capacity, 3)
        self.bound, self.opt = bound, opt
        self.values = np.zeros((capacity, WIDTH), np.float32)
        self.versions = np.full(capacity, NEVER, np.int64)
        self.pending = np.zeros(capacity, np.int64)
        self.pending_grad = np.zeros((capacity, WIDTH), np.float32)
        self.state = np.zeros((capacity, _C.optim_state_width(opt.kind, WIDTH)), np.float32)
        self.steps = np.zeros(capacity, np.int64)

    def _take(self, keys, slots):
        dirty = self.pending[slots] > 0
        out = (keys[dirty], self.pending_grad[slots[dirty]].copy(), self.pending[slots[dirty]].copy())
        self.versions[slots[dirty]] += self.pending[slots[dirty]]
        self.pending[slots] = 0
        self.pending_grad[slots] = 0
        return out

    def prepare(self, keys):
        slots, hit, ev_keys, ev_slots = self.policy.access(keys)
        evicted = self._take(ev_keys, ev_slots)
        self.versions[ev_slots] = NEVER
        self.state[ev_slots] = 0
        self.steps[ev_slots] = 0
        resident = (slots >= 0) & hit
        local = np.full(len(keys), NEVER, np.int64)
        local[resident] = self.versions[slots[resident]]
        return hit, local, evicted, len(ev_keys)

    def fill(self, keys, pos, rows, versions, state, steps):
        slots = self.policy.slots(keys)
        out = np.empty((len(keys), WIDTH), np.float32)
        out[slots >= 0] = self.values[slots[slots >= 0]]
        into = slots[pos] >= 0
        self.values[slots[pos[into]]] = rows[into]
        self.versions[slots[pos[into]]] = versions[into]
        self.state[slots[pos[into]]] = state[into]
        self.steps[slots[pos[into]]] = steps[into]
        out[pos] = rows
        return out

    def step(self, keys, summed, lr):
        slots = self.policy.slots(keys)
        cached = slots >= 0
        s = slots[cached]
        _C.apply_rows(self.opt, lr, self.values, self.state, self.steps, s, np.ascontiguousarray(summed[cached]))
        if self.bound == 0:   # every row pushed at once by the caller, one contribution each
            self.versions[s] += 1
            return keys[:0], np.zeros((0, WIDTH), np.float32), keys[:0]
        self.pending_grad[s] += summed[cached]
        self.pending[s] += 1
        due = self.pending[s] > self.bound
        k, g, c = self._take(keys[cached][due], s[due])
        n = int((~cached).sum())
        return (np.concatenate([k, keys[~cached]]), np.concatenate([g, summed[~cached]]),
                np.concatenate([c, np.ones(n, np.int64)]))

    def drain(self):
        keys = np.sort(self.policy.keys())
        return self._take(keys, self.policy.slots(keys))


def assert_push_equal(got, want):
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, np.asarray(w).reshape(g.shape))


class ModelServer:
    """The servers' side of the protocol: per row values, optimizer state, steps and version;
    an iteration's pushes summed per row in push order, each row stepped once by the rule."""

    def __init__(self, rng, rows, opt):
        self.opt = opt
        self.values = rng.standard_normal((rows, WIDTH)).astype(np.float32)
        self.state = np.zeros((rows, _C.optim_state_width(opt.kind, WIDTH)), np.float32)
        self.steps = np.zeros(rows, np.int64)
        self.versions = np.zeros(rows, np.int64)

    def pull_stale(self, keys, local, bound):
        pos = np.flatnonzero((local == NEVER) | (self.versions[keys] - local > bound))
        k = keys[pos]
        return pos, self.values[k].copy(), self.versions[k].copy(), self.state[k].copy(), self.steps[k].copy()

    def apply(self, pushes, lr):
        summed, counts = {}, {}
        for keys, grads, c in pushes:
            for key, g, n in zip(keys.tolist(), grads, c.tolist()):
                summed[key] = summed[key] + g if key in summed else g.astype(np.float32).copy()
                counts[key] = counts.get(key, 0) + n
        if not summed:
            return
        rows = np.array(sorted(summed), np.int64)
        _C.apply_rows(self.opt, lr, self.values, self.state, self.steps, rows,
                      np.ascontiguousarray([summed[r] for r in rows.tolist()], np.float32))
        self.versions[rows] += [counts[r] for r in rows.tolist()]


@pytest.mark.parametrize("policy", ["lru", "lfu", "lfuopt"])
@pytest.mark.parametrize("bound", [0, 2])
@pytest.mark.parametrize("opt", ["sgd", "adam", "rowwise_adagrad"])
@pytest.mark.parametrize("capacity", [3, 20])
def test_row_cache_matches_model_against_a_versioned_server(policy, bound, opt, capacity):
    rng = np.random.default_rng([capacity, bound])
    rows = 50
    server = ModelServer(rng, rows, optimizer(opt))
    cache, model = _C.RowCache(policy, capacity, WIDTH, bound, optimizer(opt), 3), ModelRowCache(policy, capacity, bound, optimizer(opt))
    lr = 0.05
    hits = 0
    for step in range(150):
        keys = np.unique(rng.zipf(1.3, size=10) % rows).astype(np.int64)
        got, want = cache.prepare(keys), model.prepare(keys)
        for g, w in zip(got[:2], want[:2]):
            np.testing.assert_array_equal(g, w, err_msg=f"step {step}")
        assert_push_equal(got[2], want[2])
        assert got[3] == want[3]
        pushes = [got[2]]
        pos, *pulled = server.pull_stale(keys, got[1], bound)
        hits += int(np.count_nonzero(got[0])) - int(np.count_nonzero(got[0][pos]))
        out = cache.fill(keys, pos, *pulled)
        np.testing.assert_array_equal(out, model.fill(keys, pos, *pulled), err_msg=f"step {step}")
        summed = rng.standard_normal((len(keys), WIDTH)).astype(np.float32)
        got_push = cache.step(keys, summed, lr)
        assert_push_equal(got_push, model.step(keys, summed, lr))
        pushes.append((keys, summed, np.ones(len(keys), np.int64)) if bound == 0 else got_push)
        if bound and step % 37 == 36:
            got_push = cache.drain()
            assert_push_equal(got_push, model.drain())
            pushes.append(got_push)
        other = np.unique(rng.integers(0, rows, 2)).astype(np.int64)   # another worker's updates
        pushes.append((other, rng.standard_normal((len(other), WIDTH)).astype(np.float32), np.ones(len(other), np.int64)))
        server.apply(pushes, lr)
        resident = np.sort(cache.keys())
        np.testing.assert_array_equal(resident, np.sort(model.policy.keys()))
        for k in resident:
            values, version, pending, state, steps = cache.row(int(k))
            s = model.policy.slots(np.array([k]))[0]
            np.testing.assert_array_equal(values, model.values[s])
            np.testing.assert_array_equal(state, model.state[s])
            assert (version, pending, steps) == (model.versions[s], model.pending[s], model.steps[s])
            if bound == 0 and version == server.versions[k]:
                # HET at bound 0: a copy as recent as the servers' is their row, bit for bit.
                np.testing.assert_array_equal(values, server.values[k], err_msg=f"step {step} row {k}")
                np.testing.assert_array_equal(state, server.state[k], err_msg=f"step {step} row {k}")
                assert steps == server.steps[k]
    assert hits > 150, hits   # rows only this worker updated are served from the cache
    assert cache.row(rows + 1) is None


def test_row_cache_is_safe_under_two_threads():
    """A prefetch-like thread prepares and fills while the training thread steps and drains."""
    cache = _C.RowCache("lru", 64, WIDTH, 2, optimizer("adam"))
    errors = []

    def work(seed, stepping):
        rng = np.random.default_rng(seed)
        try:
            for _ in range(400):
                keys = np.unique(rng.integers(0, 200, 40)).astype(np.int64)
                cache.prepare(keys)
                pos = np.arange(len(keys))
                rows = np.repeat(keys[:, None].astype(np.float32), WIDTH, axis=1)
                cache.fill(keys, pos, rows, np.zeros(len(keys), np.int64))
                if stepping:
                    cache.step(keys, np.zeros((len(keys), WIDTH), np.float32), 0.0)
                    cache.drain()
        except Exception as e:   # reported below: an assertion in a thread would be lost
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s, s == 0)) for s in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    keys = cache.keys()
    assert len(keys) == len(set(keys.tolist())) <= 64
    for k in keys:   # every row still holds what was filled for its own key (zero-lr steps)
        values = cache.row(int(k))[0]
        np.testing.assert_array_equal(values, np.full(WIDTH, k, np.float32))


def test_row_cache_rejects_bad_input():
    with pytest.raises(ValueError, match="bound must not be negative"):
        _C.RowCache("lru", 4, WIDTH, -1, optimizer("sgd"))
    with pytest.raises(ValueError, match="width must be at least 1"):
        _C.RowCache("lru", 4, 0, 0, optimizer("sgd"))
    cache = _C.RowCache("lru", 4, WIDTH, 0, optimizer("sgd"))
    keys = np.array([1, 2], np.int64)
    cache.prepare(keys)
    with pytest.raises(ValueError, match="expected 1 rows of 4 floats"):
        cache.fill(keys, np.array([0], np.int64), np.zeros((1, 3), np.float32), np.zeros(1, np.int64))
    with pytest.raises(RuntimeError, match="row 2 was neither returned by the pull nor valid"):
        cache.fill(keys, np.array([0], np.int64), np.zeros((1, WIDTH), np.float32), np.zeros(1, np.int64))
    with pytest.raises(ValueError, match="position 5 out of range"):
        cache.fill(keys, np.array([5], np.int64), np.zeros((1, WIDTH), np.float32), np.zeros(1, np.int64))
    with pytest.raises(ValueError, match="state and steps come together"):
        cache.fill(keys, np.array([0], np.int64), np.zeros((1, WIDTH), np.float32), np.zeros(1, np.int64),
                   np.zeros((1, 0), np.float32))
    adam = _C.RowCache("lru", 4, WIDTH, 0, optimizer("adam"))
    adam.prepare(keys)
    with pytest.raises(ValueError, match="optimizer state"):
        adam.fill(keys, np.arange(2), np.zeros((2, WIDTH), np.float32), np.zeros(2, np.int64),
                  np.zeros((2, WIDTH), np.float32), np.zeros(2, np.int64))
