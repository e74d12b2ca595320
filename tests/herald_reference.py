"""A plain NumPy model of Herald's planner (docs/design.md section 7), written independently of the
C++ one (hetu._C.Planner) so tests can compare the two plan by plan. Slow, clear, test-only."""
import numpy as np

from hetu import _C


class ReferencePlanner:
    def __init__(self, workers, rank, per_worker, policy, capacity, pin_threshold=8, allocator="colocate"):
        self.W, self.rank, self.b, self.allocator = workers, rank, per_worker, allocator
        self.policies = [_C.CachePolicy(policy, capacity, pin_threshold) for _ in range(workers)]
        self.valid = [np.zeros(capacity, bool) for _ in range(workers)]
        self.dirty = [np.zeros(capacity, bool) for _ in range(workers)]
        self.slot_key = [np.full(capacity, -1, np.int64) for _ in range(workers)]
        self.pending = None

    def _valid_mask(self, w, keys):
        slots = self.policies[w].slots(np.ascontiguousarray(keys.reshape(-1))).reshape(keys.shape)
        out = np.zeros(keys.shape, bool)
        out[slots >= 0] = self.valid[w][slots[slots >= 0]]
        return out

    def advance(self, ids, t):
        """ids: [samples, slots] of global batch t; -1 is an empty slot (a bag's padding), and a row
        that a sample names several times is one of its rows once."""
        counted = ids >= 0
        for j in range(1, ids.shape[1]):
            counted[:, j] &= ~(ids[:, :j] == ids[:, j:j + 1]).any(axis=1)
        if self.allocator == "greedy":
            scores = np.stack([(self._valid_mask(w, ids) & counted).sum(axis=1, dtype=np.int32)
                               for w in range(self.W)], axis=1)
            assign = _C.greedy_allocate(np.ascontiguousarray(scores), self.b, t)
        elif self.allocator == "colocate":
            distinct, rows = np.unique(ids[ids >= 0], return_inverse=True)
            slots = np.full(ids.shape, -1, np.int32)
            slots[ids >= 0] = rows
            valid = sum(self._valid_mask(w, distinct).astype(np.uint64) << np.uint64(w) for w in range(self.W))
            assign = _C.colocate_allocate(slots, np.asarray(valid, np.uint64), self.W, self.b, t)
        else:
            assign = np.repeat(np.arange(self.W, dtype=np.int32), self.b)
        keys = [np.unique(ids[(assign == w)[:, None] & (ids >= 0)]) for w in range(self.W)]
        union, users = np.unique(np.concatenate(keys), return_counts=True)
        shared = union[users > 1]
        read_elsewhere = [union[(users - np.isin(union, k, assume_unique=True)) > 0] for k in keys]

        finished = None
        if self.pending is not None:
            for w in range(self.W):
                dirty = self.slot_key[w][self.dirty[w]]
                due = dirty[np.isin(dirty, read_elsewhere[w])]
                slots = self.policies[w].slots(due)
                self.dirty[w][slots[slots >= 0]] = False
                if w == self.rank:
                    self.pending["writeback"].append(due)
            p = self.pending
            p["writeback"] = np.unique(np.concatenate(p["writeback"])).astype(np.int64)
            finished = p

        for w in range(self.W):
            k, valid, dirty, slot_key = keys[w], self.valid[w], self.dirty[w], self.slot_key[w]
            slots, hit, ev_keys, ev_slots = self.policies[w].access(k)
            evicted_dirty = ev_keys[dirty[ev_slots]]
            valid[ev_slots] = dirty[ev_slots] = False
            slot_key[ev_slots] = -1
            cached = slots >= 0
            valid_before = np.zeros(len(k), bool)
            valid_before[cached & hit] = valid[slots[cached & hit]]
            owner = ~np.isin(k, shared, assume_unique=True)
            slot_key[slots[cached]] = k[cached]
            valid[slots[cached]] = dirty[slots[cached]] = owner[cached]
            others = union[~np.isin(union, k, assume_unique=True)]
            o_slots = self.policies[w].slots(others)
            o_slots_in = o_slots[o_slots >= 0]
            assert not dirty[o_slots_in].any(), f"iteration {t}: worker {w} holds dirty rows updated elsewhere"
            stale = others[o_slots >= 0][valid[o_slots_in]]
            valid[o_slots_in] = False
            if w == self.rank:
                self.pending = {"iteration": t, "samples": np.flatnonzero(assign == w), "keys": k, "hit": hit,
                                "pull": ~valid_before, "owner": owner, "invalidate": stale,
                                "writeback": [evicted_dirty, k[~cached & owner]]}
        return self.pending["samples"], finished
