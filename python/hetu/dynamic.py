"""Dynamic tables (docs/design.md section 13): embedding tables keyed by any
int64 key (hashed ids, hetu.data.keys) that hold at most `capacity` rows.

Which key holds which row ("slot") is decided by one rule, hetu._C.KeyDirectory, as a function of
the sequence of global training batches alone. Every process keeps its own replica of the
directory and steps it on each global batch as that batch is trained (each worker reads the whole
global batch's ids from the data, as Herald's planners do), so every worker, Herald's planner and
the single process agree on every decision without exchanging a message, whatever the number of
workers and servers. Below the directory a dynamic table is a plain table of `capacity` rows
addressed by slot: the servers, the HET cache and Herald move slots as they move rows today.

The data path: the sparse DataloaderOp that feeds a dynamic table's lookups holds its TableKeys
(the bind_dynamic pass attaches it) and turns each batch's keys into slots (-1: no row: it reads
zeros and its gradient is dropped; bag padding stays -1). The step's admissions (a key's slot
starts from the key's own initial row, zero optimizer state) and evictions reach the row sources
through `TableKeys.current`: the single process resets its rows in the lookup (LocalRows), the PS
row sources send their servers an admit (hetu.rows), caches drop evicted slots."""
import concurrent.futures
import os
from dataclasses import dataclass

import numpy as np

from . import _C, env

# A key directory's bytes a slot when full: its arrays (key, count and last read of each slot and
# of as many probation slots: 48 bytes) and its two hash maps, resident keys and keys on
# probation, at one entry a slot in 16-byte cells at least half full.
DIRECTORY_BYTES_PER_SLOT = 48 + 2 * 32
# Ways per bucket tried by default, largest first: the first that divides the capacity.
DEFAULT_WAYS = (16, 8, 4, 2, 1)
PADDING = -1   # an empty bag slot; also the slot of a key without a row
# Whether a training step's decisions are taken ahead, while the step before trains
# (TableKeys.step_ahead); HETU_DYNAMIC_AHEAD=0 takes each in its turn (the same decisions).
STEP_AHEAD = env.raw("HETU_DYNAMIC_AHEAD") != "0"


@dataclass(frozen=True)
class DynamicTable:
    """A dynamic table's rule: `capacity` rows in `buckets` buckets (0: capacity / w for the
    largest w of DEFAULT_WAYS dividing it), a key admitted when `admit_after` global batches have
    read it, evicted when its bucket overflows (oldest last read first) or, with `ttl` > 0, after
    `ttl` steps unread."""
    capacity: int
    admit_after: int = 1
    ttl: int = 0
    buckets: int = 0

    def __post_init__(self):
        def bad(what):
            raise ValueError(f"dynamic table: {what}")
        if self.capacity < 1:
            bad(f"capacity {self.capacity}: it must hold at least one row")
        if self.admit_after < 1:
            bad(f"admit_after {self.admit_after}: a key is admitted after at least 1 read")
        if self.ttl < 0:
            bad(f"ttl {self.ttl}: 0 turns it off, else a number of steps")
        if self.buckets < 0 or (self.buckets and self.capacity % self.buckets):
            bad(f"{self.buckets} buckets: the capacity {self.capacity} must be a multiple of the bucket count")

    @property
    def num_buckets(self):
        if self.buckets:
            return self.buckets
        ways = next(w for w in DEFAULT_WAYS if self.capacity % w == 0)
        return self.capacity // ways

    @property
    def ways(self):
        return self.capacity // self.num_buckets

    def directory(self):
        return _C.KeyDirectory(self.capacity, self.num_buckets, self.admit_after, self.ttl)

    def describe(self):
        return (f"dynamic, {self.capacity} rows in {self.num_buckets} buckets of {self.ways}, admitted after "
                f"{self.admit_after} read{'s' * (self.admit_after != 1)}" +
                (f", evicted after {self.ttl} steps unread" if self.ttl else ""))


class KeyStep:
    """The directory's decisions at one training step: the global batch's distinct keys
    (ascending) with their slots, the admitted and the evicted (key, slot) pairs."""
    __slots__ = ("step", "keys", "slots", "admitted_keys", "admitted_slots", "evicted_keys", "evicted_slots",
                 "_by_slot", "_reassigned")

    def __init__(self, step, result):
        self.step = step
        for name in self.__slots__[1:-2]:
            setattr(self, name, result[name])
        self._by_slot = self._reassigned = None

    def reassigned_slots(self):
        """The slots (ascending) whose key changed at this step, evicted or admitted: the rows
        their old keys left are discarded (a cached copy is dropped, never written back). Every
        cache of the step asks: computed once, by a sort (a slot evicted and re-admitted at the
        step is in both lists)."""
        if self._reassigned is None:
            both = np.sort(np.concatenate([self.evicted_slots, self.admitted_slots]))
            self._reassigned = both[np.concatenate([[True], both[1:] != both[:-1]])] if len(both) else both
        return self._reassigned

    def admitted_among(self, slots):
        """(slots, keys) of this step's admissions whose slot is in `slots` (ascending), in slot
        order."""
        if self._by_slot is None:   # every row source of the step asks: sort once
            order = np.argsort(self.admitted_slots)
            self._by_slot = self.admitted_slots[order], self.admitted_keys[order]
        admitted, keys = self._by_slot
        if not len(admitted) or not len(slots):
            return admitted[:0], keys[:0]
        at = np.minimum(np.searchsorted(slots, admitted), len(slots) - 1)
        mask = slots[at] == admitted
        return admitted[mask], keys[mask]


class TableKeys:
    """One dynamic table's key directory in this process. `train(step, global_keys, keys)` applies
    training step `step` (steps come in order, once each) and maps this worker's `keys`;
    `lookup(keys)` maps keys outside training (validation) by the directory as it stands.

    `step_ahead(step, global_keys)` takes the next training step's decisions on a thread while
    the current step trains, so that train() finds them made. Such a step is revocable
    (KeyDirectory.step(revocable=True)): train() of that step keeps it, and anything else that
    reads the directory first (a validation's lookup, a checkpoint, the counters) takes it back,
    so every reader sees the directory as the steps trained so far left it."""

    def __init__(self, table: DynamicTable, name, servers=1):
        self.table, self.name = table, name
        self._directory = table.directory()
        self._ahead = None     # (step, future of its result): a step taken ahead, pending
        self._pool = None
        self.current = None    # the KeyStep of the step being trained
        self.servers = max(1, int(servers))
        self._server_counts = np.zeros((self.servers, 3), np.int64)   # admitted, evicted, missed
        self._resident = np.zeros(self.servers, np.int64)
        self.tables = {}       # param id -> Variable: the tables that read these keys
        self._reset_at = {}    # table param id -> the last step whose admissions it took (admit_locally)
        self.per_step = []     # (step, resident, admitted, evicted, missed per server): --cache-perf

    # --- mapping --------------------------------------------------------------------------------
    def train(self, step, global_keys, keys):
        """Slots of `keys` (any shape) at training step `step`, whose global batch read
        `global_keys` (any shape; -1 padding ignored; a callable returning them, called only when
        the step was not taken ahead)."""
        if self.current is not None and step <= self.current.step:
            raise RuntimeError(f"dynamic table {self.name}: step {step} after step {self.current.step}: "
                               "training steps reach the key directory in order, once each")
        result = self._settle(keep=step)
        if result is None:
            result = self._directory.step(int(step), _keys_of(global_keys() if callable(global_keys) else global_keys))
        self.current = KeyStep(step, result)
        self._count(self.current)
        return self._map(keys)   # the directory as the step left it: the step's slots

    def step_ahead(self, step, global_keys):
        """Takes training step `step`'s decisions now, on a thread, from its global batch's keys
        (-1 padding ignored): the next train() of `step` keeps them."""
        self._settle()
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"keys-{self.name}")
        keys = _keys_of(global_keys)
        self._ahead = step, self._pool.submit(self._directory.step, int(step), keys, True)

    def _settle(self, keep=None):
        """Ends a step taken ahead: kept if it is step `keep` (its result returned), else taken
        back (the directory as the trained steps left it)."""
        if self._ahead is None:
            return None
        (step, future), self._ahead = self._ahead, None
        result = future.result()
        if step == keep:
            self._directory.keep()
            return result
        self._directory.take_back()
        return None

    @property
    def directory(self):
        """The directory as the trained steps left it (a step taken ahead is taken back)."""
        self._settle()
        return self._directory

    def lookup(self, keys):
        self._settle()
        return self._map(keys)

    def _map(self, keys):
        keys = np.asarray(keys, np.int64)
        slots = self._directory.lookup(np.ascontiguousarray(keys.reshape(-1))).reshape(keys.shape)
        slots[keys == PADDING] = PADDING
        return slots

    # --- a table this process holds ------------------------------------------------------------
    def admit_locally(self, state, param):
        """The current step's admissions in `param`, a table held by this process (the executor's
        RunState `state`): each admitted slot's row becomes its key's initial row, rounded to the
        rows' storage type, with zero optimizer state; once per step and table."""
        st = self.current
        if not state.training or st is None or self._reset_at.get(param.id) == st.step:
            return
        self._reset_at[param.id] = st.step
        if not len(st.admitted_slots):
            return
        rows = initial_rows(param, st.admitted_keys, state.executor.config.seed)
        optimizer = state.executor.graph.row_stepped.get(param.id)
        if optimizer is not None:
            optimizer.round_rows(rows)
        state.param_value(param)[st.admitted_slots] = rows
        if optimizer is not None:
            opt_state, steps = state.optimizer_state(param, optimizer, rowwise=True)
            opt_state[st.admitted_slots] = 0
            # A catch-up optimizer's row starts at the steps taken: it has skipped none of them.
            stepping = state.executor.graph.catching_up.get(param.id)
            steps[st.admitted_slots] = stepping.step_count if stepping is not None else 0

    # --- counters: per server, by where the servers keep the slots -------------------------------
    def server_of_slots(self, slots):
        """The server holding each slot: the table's row placement (PS_ROW_PLACEMENT, as
        ps-lite/src/row_placement.h: strided, slot mod S, or contiguous ranges)."""
        slots = np.asarray(slots, np.int64)
        if os.environ.get("PS_ROW_PLACEMENT", "strided") == "contiguous":
            per = -(-self.table.capacity // self.servers)
            return np.minimum(slots // per, self.servers - 1)
        return slots % self.servers

    def home_slots(self, keys):
        """The slot each key's reads are charged to while it holds no row: the way of its bucket
        that the hash's quotient picks, bucket * ways + (h(k) div B) mod ways (docs/design.md
        section 13), so that misses spread over the servers that hold the bucket's ways."""
        h = _C.bucket_hash(np.ascontiguousarray(keys, np.int64))
        B, ways = np.uint64(self.table.num_buckets), np.uint64(self.table.ways)
        return ((h % B) * ways + (h // B) % ways).astype(np.int64)

    def _count(self, st):
        S = self.servers
        admitted = np.bincount(self.server_of_slots(st.admitted_slots), minlength=S)
        evicted = np.bincount(self.server_of_slots(st.evicted_slots), minlength=S)
        missed = np.bincount(self.server_of_slots(self.home_slots(st.keys[st.slots < 0])), minlength=S)
        self._server_counts += np.stack([admitted, evicted, missed], axis=1)
        self._resident += admitted - evicted
        self.per_step.append((st.step, self._resident.copy(), admitted, evicted, missed))

    def write_csv(self, path, name):
        """--cache-perf: per step and server, the resident rows after the step and the step's
        admissions, evictions and reads of keys not resident."""
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write("iteration,table,server,resident,admitted,evicted,missed\n")
            for step, resident, admitted, evicted, missed in self.per_step:
                for i in range(self.servers):
                    f.write(f"{step},{name},{i},{resident[i]},{admitted[i]},{evicted[i]},{missed[i]}\n")
        os.replace(tmp, path)

    def counter_lines(self, name):
        """`table <name> server <i>: <resident> resident of <capacity>, <admitted> admitted,
        <evicted> evicted, <missed> reads of keys not resident`, one per server; its capacity is
        the slots it holds."""
        C, S = self.table.capacity, self.servers
        if os.environ.get("PS_ROW_PLACEMENT", "strided") == "contiguous":
            per = -(-C // S)
            held = [min(C, per * (i + 1)) - min(C, per * i) for i in range(S)]
        else:
            held = [(C - 1 - i) // S + 1 if i < C else 0 for i in range(S)]
        return [f"table {name} server {i}: {self._resident[i]} resident of {held[i]}, "
                f"{a} admitted, {e} evicted, {m} reads of keys not resident"
                for i, (a, e, m) in enumerate(self._server_counts.tolist())]

    def counters(self):
        """The directory's running counters (resident, capacity, admitted, evicted, missed)."""
        return self.directory.counters()

    # --- the table's contents by key -------------------------------------------------------------
    def resident(self):
        """(keys ascending, their slots) of every resident key."""
        state = self.directory.state()
        order = np.argsort(state["keys"], kind="stable")
        return state["keys"][order], state["slots"][order]

    # --- checkpoints ------------------------------------------------------------------------------
    def state(self):
        """Arrays for a checkpoint: the directory's whole state and the per-server counters."""
        state = {f"directory/{k}": np.asarray(v) for k, v in self.directory.state().items()}
        state["server_counts"] = self._server_counts.copy()
        state["resident_per_server"] = self._resident.copy()
        state["servers"] = np.int64(self.servers)
        return state

    def restore(self, arrays, step):
        """Continues from `state()` arrays; `step`: the first step to train."""
        directory = {k[len("directory/"):]: arrays[k] for k in arrays if k.startswith("directory/")}
        for k in ("step", "admitted", "evicted", "missed"):
            directory[k] = int(directory[k])
        directory["stepped"] = bool(directory["stepped"])
        self.directory.restore(directory)
        self.current = None
        if int(arrays["servers"]) == self.servers:
            self._server_counts = np.array(arrays["server_counts"], np.int64)
            self._resident = np.array(arrays["resident_per_server"], np.int64)
        else:   # the buckets moved: count them afresh from the resident slots
            _, slots = self.resident()
            self._resident = np.bincount(self.server_of_slots(slots), minlength=self.servers)
            self._server_counts[:] = 0


def _keys_of(global_keys):
    flat = np.asarray(global_keys, np.int64).reshape(-1)
    return np.ascontiguousarray(flat[flat != PADDING])


class NotEnoughMemory(MemoryError):
    """Dynamic tables this process would hold need more memory than its host has left."""


def check_memory(spaces, tables):
    """Refuses, before anything is allocated, dynamic tables this process could not hold:
    `spaces` the DynamicTable of each key directory it keeps (one replica each), `tables`
    (name, DynamicTable, bytes a row) of the tables whose rows it holds itself (as the executor
    allocates them: the row, its optimizer state and step count). Against the host's available
    memory (_C.available_memory: MemAvailable, or the cgroup's limit where lower)."""
    parts = [(f"a key directory: {t.capacity} slots x {DIRECTORY_BYTES_PER_SLOT} bytes",
              t.capacity * DIRECTORY_BYTES_PER_SLOT) for t in spaces]
    parts += [(f"table {name}: {t.capacity} rows x {row_bytes} bytes", t.capacity * row_bytes)
              for name, t, row_bytes in tables]
    need = sum(n for _, n in parts)
    available, source = _C.available_memory()
    if need > available:
        raise NotEnoughMemory(
            f"dynamic tables: this process needs {_C.byte_text(need)} ({'; '.join(text for text, _ in parts)}"
            f"{'; a row with its optimizer state and step count' if tables else ''}) and its host has "
            f"{_C.byte_text(available)} available ({source}): give a smaller capacity")


def initial_rows(param, keys, seed):
    """float32 [len(keys), width]: the rows `keys` start from in table `param`, drawn from its
    initializer seeded by (executor seed, table name, key) alone, as the servers draw them
    (src/dynamic/key_rows.h)."""
    init = param.initializer
    out = np.empty((len(keys), param.shape[1]), np.float32)
    _C.key_rows(init.kind, init.a, init.b, int(seed) & (2**64 - 1), _C.name_stream(param.name),
                np.ascontiguousarray(keys, np.int64), out)
    return out


def by_key(params, dynamic_keys):
    """`params` (name -> array) with each dynamic table's rows as its keys' rows: `<name>` the
    resident keys' rows and `<name>:keys` the keys, ascending (what --save-params writes: the
    same whichever slots the keys took)."""
    out = dict(params)
    for keys in dynamic_keys:
        resident, slots = keys.resident()
        for table in keys.tables.values():
            out[table.name] = params[table.name][slots]
            out[f"{table.name}:keys"] = resident
    return out
