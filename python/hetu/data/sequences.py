"""User histories for sequential recommenders (SASRec, HSTU): a sequences folder, its readers
(MovieLens ratings, a synthetic long-tail catalog) and the counter-based negatives a sampled
softmax trains with.

Histories: per user, the items in time order (a stable sort by timestamp: equal timestamps keep
their input order). Leave-one-out: each user's last item is the evaluation target; training reads
the history before it, every position predicting the next item. Users with fewer than
``MIN_ITEMS`` (3) items are dropped. Items are indexed 0..I-1 over the kept users' interactions,
most frequent first, ties the smaller raw id first (the project's numbering); users are rows
0..U-1 in ascending raw id (the synthetic generator: its user order).

Folder (every array a .npy of int64, written under a temporary name and renamed into place,
store.atomic_directory, so a folder with a readable meta.json is complete):

* ``meta.json``: ``{"kind": "sequences", "max_length": L, "num_items": I, "num_users": U,
  "ids": "indexed", "timestamps": true, "source": ..., ...}``;
* ``train_items.npy`` [U, L+1]: the last L+1 items of each user's training history (the history
  without its last item), left-aligned (valid items first, in time order) and padded with -1 on
  the right. A model reads columns 0..L-1 and predicts columns 1..L (a target -1: no target
  there). ``train_times.npy`` [U, L+1]: their timestamps (0 in the padding);
* ``val_items.npy`` [U, L]: the L items before each user's last item (left-aligned, -1 padded),
  ``val_times.npy`` [U, L] (0 in the padding), ``val_target.npy`` [U] (the last item),
  ``val_target_time.npy`` [U];
* ``user_ids.npy`` [U] and ``item_ids.npy`` [I]: the raw id of each user row and of each item
  index (the synthetic generator's: its own item numbers, by drawn popularity).

Negatives (``draw_negatives``, ``shared_negatives``): uniform items drawn by a counter-based
hash, so a sample's negatives are the same in every training mode, batch and worker count
(hetu._C.draw_negatives, src/kernels/sample_ids.h gives the exact key).
"""
import contextlib
import inspect
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import store
from .keys import HASH_NAME, ID_KINDS, check_ids, find_keys, hash_ids, hash_values
from .formats.movielens import iter_ratings
from .formats.textio import BadLineTracker, DataFormatError

KIND = "sequences"
MIN_ITEMS = 3
PADDING = -1
DEFAULT_MAX_LENGTH = 200
MOVIELENS_NAME = "movielens-sequences"
SYNTHETIC_NAME = "synthetic-sequences"
RATINGS_FILES = ("u.data", "ratings.dat", "ratings.csv")   # looked for in a folder, in this order
USER_ROWS = 1 << 16        # users written per block
MASK64 = (1 << 64) - 1
# the chain's `sample` of shared negatives: no dataset row has it (draw_negatives refuses < 0)
SHARED_SAMPLE = -1


def _files(max_length):
    """file -> (shape in users U, description) of a sequences folder."""
    L = max_length
    return {
        "train_items.npy": ((L + 1,), "last L+1 items of the history without its last item, left-aligned, -1 padded"),
        "train_times.npy": ((L + 1,), "their timestamps, 0 in the padding"),
        "val_items.npy": ((L,), "the L items before the last one, left-aligned, -1 padded"),
        "val_times.npy": ((L,), "their timestamps, 0 in the padding"),
        "val_target.npy": ((), "each user's last item"),
        "val_target_time.npy": ((), "its timestamp"),
        "user_ids.npy": ((), "raw id of each user row"),
    }


ITEM_IDS_FILE = "item_ids.npy"   # [I]: raw id of each item index
ITEM_KEYS_FILE = "item_keys.npy"  # [I], hashed ids only: the key of each item index (hetu.data.keys, field 0)


# --- reading a folder -----------------------------------------------------------------------------

@dataclass(frozen=True)
class SequenceMeta:
    name: str
    num_items: int
    max_length: int
    num_users: int
    num_interactions: int
    source: dict
    info: dict          # the whole meta.json
    kind: str = KIND
    ids: str = "indexed"


@dataclass(frozen=True)
class SequenceTrain:
    """Training histories: ``items`` [U, L+1] (inputs columns 0..L-1, targets 1..L), ``times``."""
    items: np.ndarray
    times: np.ndarray

    def __len__(self):
        return len(self.items)


@dataclass(frozen=True)
class SequenceVal:
    """Evaluation: ``items`` [U, L] before each user's ``target`` [U]; ``times``, ``target_time``."""
    items: np.ndarray
    times: np.ndarray
    target: np.ndarray
    target_time: np.ndarray

    def __len__(self):
        return len(self.target)


class SequenceData:
    """A sequences folder, its arrays memory-mapped read-only (``mmap=False``: read into memory)."""

    def __init__(self, path, mmap=True):
        self.path = Path(path)
        self.meta = read_sequence_meta(self.path)
        arrays = {}
        expected = _files(self.meta.max_length)
        catalog_files = (ITEM_IDS_FILE,) + ((ITEM_KEYS_FILE,) if self.meta.ids == "hashed" else ())
        for name in catalog_files:
            expected[name] = ((), None)
        for name, (shape, _) in expected.items():
            rows = self.meta.num_items if name in catalog_files else self.meta.num_users
            arrays[name] = _load_checked(self.path / name, (rows,) + shape, mmap)
        self.user_ids, self.item_ids = arrays["user_ids.npy"], arrays[ITEM_IDS_FILE]
        # The items' keys in index order (hashed ids), or None: the histories hold the indices.
        self.item_keys = np.asarray(arrays[ITEM_KEYS_FILE]) if self.meta.ids == "hashed" else None
        self._key_order = None if self.item_keys is None else np.argsort(self.item_keys, kind="stable")
        self.train = SequenceTrain(arrays["train_items.npy"], arrays["train_times.npy"])
        self.val = SequenceVal(arrays["val_items.npy"], arrays["val_times.npy"], arrays["val_target.npy"],
                               arrays["val_target_time.npy"])
        target = np.asarray(self.val.target)
        bad = np.flatnonzero(target == PADDING if self.item_keys is not None else
                             (target < 0) | (target >= self.meta.num_items))
        if len(bad):
            raise ValueError(f"{self.path}/val_target.npy, row {bad[0]}: {target[bad[0]]} is not an item "
                             f"(meta.json: num_items {self.meta.num_items})")

    def catalog_index(self, items):
        """The catalog index (item_ids.npy's order) of each history entry (a key or an index); -1
        stays -1."""
        items = np.asarray(items, np.int64)
        if self.item_keys is None:
            return items
        at, _ = find_keys(self.item_keys, items, self._key_order)
        return np.where(items == PADDING, PADDING, at)

    def __repr__(self):
        m = self.meta
        return (f"SequenceData({m.name!r}, path={str(self.path)!r}, users={m.num_users}, items={m.num_items}, "
                f"max_length={m.max_length})")


def load_sequences(folder, mmap=True):
    """The sequences folder ``folder`` (SequenceData); a missing file, a bad shape or meta.json
    is a ValueError naming the file and what is wrong."""
    return SequenceData(folder, mmap=mmap)


def is_sequences_folder(folder):
    """Whether ``folder``'s meta.json says it holds sequences (False where it cannot be read)."""
    try:
        return store.read_meta(folder).get("kind") == KIND
    except (OSError, ValueError, AttributeError):
        return False


def read_sequence_meta(path):
    where = Path(path) / store.META_FILE
    if not where.is_file():
        raise ValueError(f"{where} is missing: {path} is not a sequences folder")
    try:
        raw = store.read_meta(path)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{where} is not valid JSON ({e})") from None
    if not isinstance(raw, dict) or raw.get("kind") != KIND:
        kind = raw.get("kind") if isinstance(raw, dict) else None
        raise ValueError(f"{where}: kind is {kind!r}, not {KIND!r}")
    numbers = {}
    for key, least in (("max_length", 1), ("num_items", 1), ("num_users", 0)):
        value = raw.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise ValueError(f"{where}: {key} must be an integer of at least {least}, found {value!r}")
        numbers[key] = value
    ids = raw.get("ids", "indexed")
    if ids not in ID_KINDS:
        raise ValueError(f"{where}: ids {ids!r}, not one of {', '.join(ID_KINDS)}")
    return SequenceMeta(name=raw.get("name", KIND), num_interactions=int(raw.get("num_interactions", 0)),
                        source=raw.get("source", {}), info=raw, ids=ids, **numbers)


def _load_checked(path, shape, mmap):
    if not path.is_file():
        raise ValueError(f"{path} is missing: a sequences folder holds {', '.join(sorted(_files(1)))} and "
                         f"{ITEM_IDS_FILE}")
    array = store.load_npy(path, "r" if mmap else None)
    if array.dtype != np.int64 or array.shape != tuple(shape):
        raise ValueError(f"{path} is {array.dtype}{list(array.shape)}, meta.json says int64{list(shape)}")
    return array


# --- writing a folder -----------------------------------------------------------------------------

def index_items(raw_items):
    """(indexes int64 of ``raw_items``, the raw id of each index): most frequent first, ties the
    smaller raw id first."""
    raw, inverse, counts = np.unique(raw_items, return_inverse=True, return_counts=True)
    order = np.lexsort((raw, -counts))
    rank = np.empty(len(raw), np.int64)
    rank[order] = np.arange(len(raw), dtype=np.int64)
    return rank[inverse.reshape(-1)], raw[order]


def histories(users, items, times):
    """Interactions -> (user raw ids [U], offsets [U+1], raw items, times), each user's items in
    time order (stable: ties in input order), users ascending, users under MIN_ITEMS dropped."""
    users, items, times = (np.asarray(a, np.int64).reshape(-1) for a in (users, items, times))
    order = np.lexsort((times, users))   # stable, last key first
    users, items, times = users[order], items[order], times[order]
    user_ids, starts, counts = np.unique(users, return_index=True, return_counts=True)
    keep = counts >= MIN_ITEMS
    rows = np.repeat(keep, counts)
    counts = counts[keep]
    offsets = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    return user_ids[keep], offsets, items[rows], times[rows]


def _windows(values, starts, stops, width, padding):
    """[users, width]: the last ``width`` values of each values[starts[u]:stops[u]], left-aligned."""
    lengths = np.minimum(stops - starts, width)
    columns = np.arange(width)
    index = (stops - lengths)[:, None] + columns
    valid = columns < lengths[:, None]
    return np.where(valid, values[np.where(valid, index, 0)], padding)


def write_sequences(out_dir, offsets, items, times, num_items, max_length, *, user_ids, item_ids, name, source,
                    overwrite=False, item_keys=None, **extra):
    """Write a sequences folder from histories: user u's items (indexed) and timestamps are
    items[offsets[u]:offsets[u + 1]] and times[...], in time order, at least MIN_ITEMS each.
    With `item_keys` (each index's key: hashed ids) the histories hold the keys instead."""
    L = int(max_length)
    if item_keys is not None:
        item_keys = np.asarray(item_keys, np.int64)
        items = item_keys[np.asarray(items, np.int64)]
    if L < 1:
        raise ValueError(f"max_length must be at least 1, got {max_length}")
    offsets = np.asarray(offsets, np.int64)
    num_users = len(offsets) - 1
    lengths = np.diff(offsets)
    if num_users and lengths.min() < MIN_ITEMS:
        raise ValueError(f"every history needs at least {MIN_ITEMS} items, user row {int(lengths.argmin())} has "
                         f"{int(lengths.min())}")
    files = _files(L)
    with store.atomic_directory(out_dir, overwrite=overwrite) as tmp:
        with contextlib.ExitStack() as stack:
            writers = {f: stack.enter_context(store.NpyWriter(tmp, f, np.int64, (num_users,) + shape))
                       for f, (shape, _) in files.items()}
            for first in range(0, num_users, USER_ROWS):
                stop = min(first + USER_ROWS, num_users)
                begin, last = offsets[first:stop], offsets[first + 1:stop + 1] - 1    # last: each user's last item
                block = {
                    "train_items.npy": _windows(items, begin, last, L + 1, PADDING),
                    "train_times.npy": _windows(times, begin, last, L + 1, 0),
                    "val_items.npy": _windows(items, begin, last, L, PADDING),
                    "val_times.npy": _windows(times, begin, last, L, 0),
                    "val_target.npy": items[last], "val_target_time.npy": times[last],
                    "user_ids.npy": np.asarray(user_ids[first:stop], np.int64),
                }
                for f, writer in writers.items():
                    writer.write(block[f])
        np.save(tmp / ITEM_IDS_FILE, np.asarray(item_ids, np.int64))
        described = {f: f"int64 [U{', ' + str(shape[0]) if shape else ''}]: {text}"
                     for f, (shape, text) in files.items()}
        described[ITEM_IDS_FILE] = "int64 [I]: raw id of each item index"
        hashed = {}
        if item_keys is not None:
            np.save(tmp / ITEM_KEYS_FILE, item_keys)
            described[ITEM_KEYS_FILE] = "int64 [I]: key of each item index; the histories hold these keys"
            hashed = {"hashing": HASH_NAME, "field_names": ["item"]}
        store.write_meta(tmp, {
            "kind": KIND, "name": name, "format_version": store.FORMAT_VERSION, "max_length": L,
            "num_items": int(num_items), "num_users": int(num_users), "num_interactions": int(offsets[-1]),
            "ids": "indexed" if item_keys is None else "hashed", **hashed, "timestamps": True, "padding": PADDING,
            "min_items_per_user": MIN_ITEMS,
            "split": "leave-one-out: each user's last item is val_target; training reads the history before it",
            "item_order": "most frequent first, ties the smaller raw id first",
            "files": described, "source": source, **extra})
    return Path(out_dir)


# --- MovieLens ------------------------------------------------------------------------------------

def ratings_file(source):
    """The ratings file ``source`` names: the file itself, or the first of RATINGS_FILES in a folder."""
    path = Path(source)
    if path.is_dir():
        for name in RATINGS_FILES:
            if (path / name).is_file():
                return path / name
        raise FileNotFoundError(f"{path} holds no MovieLens ratings file ({', '.join(RATINGS_FILES)})")
    if not path.is_file():
        raise FileNotFoundError(f"input file not found: {path}")
    return path


def prepare_movielens_sequences(source, out_dir, max_length=DEFAULT_MAX_LENGTH, *, skip_bad_lines=False,
                                overwrite=False, progress=True, chunk_lines=500_000, log=None, ids="indexed"):
    """A sequences folder (module docstring) from MovieLens ratings: 100K's ``u.data``
    (tab-separated user, item, rating, timestamp), 1M/10M's ``ratings.dat`` (``::``-separated)
    or 20M's ``ratings.csv``; ``source`` is the file or a folder holding one. Every rating is an
    interaction, whatever its value. ``ids="hashed"``: the histories hold each item's key, the
    hash of field 0 and the raw id's decimal text (hetu.data.keys). Returns the folder."""
    check_ids(ids)
    log = log if log is not None else sys.stderr
    path = ratings_file(source)
    tracker = BadLineTracker(skip_bad_lines, stream=log)
    parts = [(u, i, t) for u, i, _, t, _ in iter_ratings(path, tracker, chunk_lines, progress, "movielens sequences")]
    if not parts:
        raise DataFormatError(f"{path}: no usable rows")
    users, items, times = (np.concatenate(column) for column in zip(*parts))
    user_ids, offsets, raw_items, times = histories(users, items, times)
    if len(user_ids) == 0:
        raise DataFormatError(f"{path}: no user has {MIN_ITEMS} or more ratings")
    indexed, item_ids = index_items(raw_items)
    source_meta = {"kind": "movielens", "path": str(path.resolve()), "skip_bad_lines": bool(skip_bad_lines),
                   "bad_lines_skipped": tracker.skipped, "ratings": int(len(users)),
                   "users_dropped": int(len(np.unique(users)) - len(user_ids))}
    out = write_sequences(out_dir, offsets, indexed, times, len(item_ids), max_length, user_ids=user_ids,
                          item_ids=item_ids, name=MOVIELENS_NAME, source=source_meta, overwrite=overwrite,
                          user_order="ascending raw user id",
                          item_keys=hash_values(0, [str(int(i)) for i in item_ids]) if ids == "hashed" else None)
    summary = tracker.summary(path)
    if summary:
        print(summary, file=log)
    return out


# --- synthetic ------------------------------------------------------------------------------------

SYNTHETIC_VERSION = 1   # changes whenever the same parameters would give other data
FIRST_TIME = 1_000_000_000        # the first user's history starts within two years of this
TIME_SPAN = 2 * 365 * 86400
GAP_SECONDS = 1800.0              # mean gap between two items of a session
SESSION_GAP_SECONDS = 3 * 86400.0  # mean gap before a new session
NEW_SESSION = 0.1                 # chance that an item starts a new session
SUCCESSORS = 2                    # items a history may follow an item with


def synthetic_params(**overrides):
    """generate_synthetic_sequences' defaults (SYNTHETIC_DEFAULTS) with ``overrides`` (unknown
    names are a TypeError), checked."""
    unknown = set(overrides) - set(SYNTHETIC_DEFAULTS)
    if unknown:
        raise TypeError(f"unknown synthetic sequence parameter(s) {sorted(unknown)}; known: "
                        f"{sorted(SYNTHETIC_DEFAULTS)}")
    p = {**SYNTHETIC_DEFAULTS, **overrides}
    if p["topics"] is None:
        p["topics"] = max(1, min(1000, p["items"] // 200))
    p = {k: v if k == "ids" else float(v) if k in ("mean_length", "zipf", "follow", "wander") else int(v)
         for k, v in p.items()}
    check_ids(p["ids"])
    if p["users"] < 1 or p["items"] < 1 or p["max_length"] < 1 or not 1 <= p["topics"] <= p["items"]:
        raise ValueError(f"users, items and max_length must be positive and topics in [1, items]: {p}")
    if p["mean_length"] < MIN_ITEMS or p["zipf"] < 0:
        raise ValueError(f"mean_length must be at least {MIN_ITEMS} and zipf at least 0: {p}")
    if not (0 <= p["follow"] <= 1 and 0 <= p["wander"] <= 1 and p["follow"] + p["wander"] <= 1):
        raise ValueError(f"follow and wander are chances summing to at most 1: {p}")
    return p


class Catalog:
    """Items 0..I-1 by descending popularity weight (rank + 1)^-zipf, each in one topic (a
    seeded, balanced assignment), with SUCCESSORS fixed successors drawn from its topic's law."""

    def __init__(self, rng, items, topics, zipf):
        weight = np.arange(1, items + 1, dtype=np.float64) ** -zipf
        self.cumulative = np.cumsum(weight)
        self.topic = rng.permutation(items) % topics
        self.by_topic = np.argsort(self.topic, kind="stable")    # within a topic, by rank
        self.topic_cumulative = np.cumsum(weight[self.by_topic])
        sizes = np.bincount(self.topic, minlength=topics)
        self.end = np.cumsum(sizes)
        self.begin = self.end - sizes
        below = np.concatenate([[0.0], self.topic_cumulative])
        self.low, self.high = below[self.begin], below[self.end]
        # each item's successors: drawn from its topic's law, another item where the topic has one
        owner = np.repeat(np.arange(items), SUCCESSORS)
        succ = self.in_topics(rng, self.topic[owner])
        position = np.empty(items, np.int64)
        position[self.by_topic] = np.arange(items)
        same = succ == owner
        t = self.topic[owner[same]]
        nxt = position[owner[same]] + 1
        succ[same] = self.by_topic[np.where(nxt < self.end[t], nxt, self.begin[t])]
        self.successors = succ.reshape(items, SUCCESSORS)

    @property
    def topic_mass(self):
        return self.high - self.low

    def global_draws(self, rng, n):
        u = rng.random(n) * self.cumulative[-1]
        return np.minimum(np.searchsorted(self.cumulative, u, side="right"), len(self.cumulative) - 1)

    def in_topics(self, rng, topics):
        u = self.low[topics] + rng.random(len(topics)) * (self.high[topics] - self.low[topics])
        pos = np.searchsorted(self.topic_cumulative, u, side="right")
        return self.by_topic[np.clip(pos, self.begin[topics], self.end[topics] - 1)]


def synthetic_histories(p):
    """(offsets, items by drawn rank, times) of the synthetic histories of parameters ``p``."""
    rng = np.random.Generator(np.random.PCG64(p["seed"]))
    catalog = Catalog(rng, p["items"], p["topics"], p["zipf"])
    U = p["users"]
    lengths = MIN_ITEMS - 1 + rng.geometric(1.0 / (p["mean_length"] - MIN_ITEMS + 1), size=U)
    mass = catalog.topic_mass / catalog.topic_mass.sum()
    user_topics = rng.choice(len(mass), size=(U, 3), p=mass)
    topic_counts = rng.integers(1, 4, size=U)
    start = FIRST_TIME + rng.integers(0, TIME_SPAN, size=U)
    offsets = np.zeros(U + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    items = np.empty(offsets[-1], np.int64)
    times = np.empty(offsets[-1], np.int64)
    by_length = np.argsort(-lengths, kind="stable")     # the users still drawing at step t come first
    descending = lengths[by_length]
    previous = None
    for t in range(int(lengths.max())):
        active = by_length[:np.searchsorted(-descending, -t, side="left")]
        n = len(active)
        u = rng.random(n)
        choice = rng.integers(0, SUCCESSORS, size=n)
        topic = user_topics[active, (rng.random(n) * topic_counts[active]).astype(np.int64)]
        drawn = catalog.in_topics(rng, topic)
        wander = u < p["wander"]
        drawn[wander] = catalog.global_draws(rng, int(wander.sum()))
        if previous is not None:
            follow = (u >= p["wander"]) & (u < p["wander"] + p["follow"])
            drawn[follow] = catalog.successors[previous[:n][follow], choice[follow]]
        new_session = rng.random(n) < NEW_SESSION
        gap = 1 + np.floor(rng.exponential(1.0, n) * np.where(new_session, SESSION_GAP_SECONDS, GAP_SECONDS))
        position = offsets[active] + t
        items[position] = drawn
        times[position] = start[active] if t == 0 else times[position - 1] + gap.astype(np.int64)
        previous = drawn
    return offsets, items, times


def generate_synthetic_sequences(out_dir, users=2000, items=5000, mean_length=30.0, max_length=50, zipf=1.1, seed=0,
                                 topics=None, follow=0.5, wander=0.1, ids="indexed", *, overwrite=False, progress=False):
    """A sequences folder of synthetic histories over a long-tail catalog: ``users`` histories,
    ``items`` in the catalog (num_items), ``mean_length`` items a history on average (at least
    3: 2 + a geometric count), histories kept up to ``max_length`` (L), item popularity ~
    (rank + 1)^-``zipf``, ``topics`` (default items // 200, within 1 to 1000).

    Each item belongs to one topic and has two fixed successors drawn from its topic's
    popularity law. A user has 1-3 topics (drawn by topic popularity); each next item is, with
    chance ``follow``, one of the previous item's successors (a Markov order a sequential model
    can learn), with chance ``wander`` a draw from the whole catalog's law, else a draw from one
    of the user's topics. Timestamps: gaps of about half an hour within a session, days between
    sessions. Items are then numbered most frequent first (ties: the higher drawn popularity
    first), items never drawn last. ``ids="hashed"``: the histories hold each item's key, the hash
    of field 0 and its drawn rank's 8 bytes (hetu.data.keys). Same parameters, same bytes; 10^6
    items x 10^4 users take seconds."""
    p = synthetic_params(**{name: value for name, value in locals().items() if name in SYNTHETIC_DEFAULTS})
    started = time.perf_counter()
    offsets, drawn, times = synthetic_histories(p)
    counts = np.bincount(drawn, minlength=p["items"])
    item_ids = np.lexsort((np.arange(p["items"]), -counts))   # drawn rank of each index
    rank = np.empty(p["items"], np.int64)
    rank[item_ids] = np.arange(p["items"], dtype=np.int64)
    out = write_sequences(out_dir, offsets, rank[drawn], times, p["items"], p["max_length"],
                          user_ids=np.arange(p["users"]), item_ids=item_ids, name=SYNTHETIC_NAME,
                          source={"kind": SYNTHETIC_NAME, "version": SYNTHETIC_VERSION, "params": p},
                          overwrite=overwrite, user_order="generated", top1pct_share=top_share(counts, 0.01),
                          item_keys=hash_ids(0, item_ids) if p["ids"] == "hashed" else None)
    if progress:
        print(f"{SYNTHETIC_NAME}: {p['users']} users, {len(drawn)} items drawn of {p['items']} in "
              f"{time.perf_counter() - started:.1f} s -> {out}", file=sys.stderr)
    return out


SYNTHETIC_DEFAULTS = {name: parameter.default for name, parameter in
                      inspect.signature(generate_synthetic_sequences).parameters.items()
                      if parameter.kind == parameter.POSITIONAL_OR_KEYWORD and name != "out_dir"}


def top_share(counts, fraction):
    """The share of all interactions taken by the most frequent ``fraction`` of the items."""
    top = max(1, int(math.ceil(len(counts) * fraction)))
    total = counts.sum()
    return float(np.sort(counts)[::-1][:top].sum() / total) if total else 0.0


# --- negatives ------------------------------------------------------------------------------------

def _kernels():
    from .. import _C  # imported here so that hetu.data stays importable without the build
    return _C


def draw_negatives(seed, step, sample_index, targets, num_negatives, num_items, threads=0):
    """int64 [n, L, num_negatives]: uniform negative items of a sampled softmax, for the samples
    at dataset rows ``sample_index`` (int64 [n]) whose targets are ``targets`` (int64 [n, L]).

    Entry [k, p, j] is a pure function of (seed, step, sample_index[k], p, j): with each taken as
    an unsigned 64-bit integer (a negative one in two's complement) and splitmix64 the
    initializers' (src/common/rng.h),
    ``h = splitmix64(splitmix64(splitmix64(splitmix64(splitmix64(seed) ^ step) ^ sample) ^ p) ^ j)``,
    mapped to [0, num_items) by Lemire's multiply-shift: the high 64 bits of h x num_items,
    exactly uniform because a product whose low 64 bits fall below 2^64 mod num_items (a chance
    under num_items / 2^64) is rejected and h replaced by splitmix64(h) until one is kept. So a
    sample's negatives do not depend on the batch it is drawn in, the order, the workers or the
    threads. Where targets[k, p] == -1 (no target) every entry is -1: no negatives, no rows read.
    Negatives are drawn from the whole catalog, so one may equal the position's target or repeat
    (uniform sampling as in generative-recommenders). ``threads``: 0 for the process's pool
    (HETU_NUM_THREADS), else that many for this call; the numbers are the same."""
    targets = np.ascontiguousarray(targets, dtype=np.int64)
    if targets.ndim != 2:
        raise ValueError(f"targets must be [samples, positions], got shape {list(targets.shape)}")
    rows = np.ascontiguousarray(sample_index, dtype=np.int64).reshape(-1)
    if len(rows) != len(targets):
        raise ValueError(f"sample_index holds {len(rows)} rows for {len(targets)} samples")
    if len(rows) and rows.min() < 0:
        raise ValueError(f"sample_index holds {int(rows.min())}: dataset rows are at least 0")
    return _kernels().draw_negatives(int(seed) & MASK64, int(step) & MASK64, rows, targets, int(num_negatives),
                                     int(num_items), int(threads))


def shared_negatives(seed, step, num_negatives, num_items):
    """int64 [num_negatives]: negatives shared by a whole global batch at ``step``, a function of
    (seed, step, j) only: draw_negatives' hash with sample 2^64 - 1 (no dataset row has it) and
    position 0."""
    targets = np.zeros((1, 1), np.int64)
    return _kernels().draw_negatives(int(seed) & MASK64, int(step) & MASK64, np.array([SHARED_SAMPLE], np.int64),
                                     targets, int(num_negatives), int(num_items), 0).reshape(-1)


def in_batch_negatives(seed, step, sample_index, targets, batch_targets, num_negatives):
    """In-batch negatives, drawn from the global batch's own targets: (int64 [n, L, num_negatives]
    indices into the pool, -1 where the position has no target; the pool, the distinct ids other
    than -1 of ``batch_targets`` (every target of global batch ``step``, whichever worker trains
    it), ascending). The indices are draw_negatives' numbers over the pool's size, so a negative
    is a function of (seed, step, the sample, p, j) and the global batch: no worker count or plan
    draws others."""
    pool = np.unique(np.asarray(batch_targets, np.int64))
    pool = pool[pool != PADDING]
    return draw_negatives(seed, step, sample_index, targets, num_negatives, max(len(pool), 1)), pool


def distinct_candidates(negatives, num_items, width=None):
    """A batch's negatives [n, L, N] (-1: none) as each sample's distinct candidates and an index
    into them: (candidates int64 [n, C], ascending, -1 after them; index int64 [n, L, N], -1 where
    there is no negative), C = `width`, by default min(L x N, num_items), the most a sample can
    have (shared negatives: N). A sample reads each candidate row once (a catalog of a few
    thousand items is read whole by 200 x 128 uniform draws), and the rows it reads are its own,
    as for any other id of the sample."""
    n = negatives.shape[0]
    flat = negatives.reshape(n, -1)
    width = min(flat.shape[1], int(num_items)) if width is None else int(width)
    valid = flat >= 0
    owner = np.broadcast_to(np.arange(n, dtype=np.int64)[:, None], flat.shape)
    candidates = np.full((n, width), -1, np.int64)
    index = np.full(flat.shape, -1, np.int64)
    if n * num_items <= 1 << 26:   # a mark per (sample, item): ranks by a running count
        present = np.zeros((n, int(num_items)), bool)
        present[owner[valid], flat[valid]] = True
        rank = np.cumsum(present, axis=1, dtype=np.int64) - 1
        index[valid] = rank[owner[valid], flat[valid]]
        sample, item = np.nonzero(present)   # row by row, items ascending
        candidates[sample, rank[sample, item]] = item
    else:                          # a large catalog: sort the (sample, item) keys
        keys, inverse = np.unique(owner[valid] * int(num_items) + flat[valid], return_inverse=True)
        sample = keys // int(num_items)
        rank = np.arange(len(keys), dtype=np.int64) - np.searchsorted(keys, sample * int(num_items))
        candidates[sample, rank] = keys % int(num_items)
        index[valid] = rank[inverse.reshape(-1)]
    return candidates, index.reshape(negatives.shape)
