"""Synthetic click logs shaped like Criteo, Avazu or MovieLens: the default data of every example,
generated with numpy in seconds and needing no download. Shape ``criteo-multihot`` is MLPerf's
DLRM-DCNv2 Criteo 1TB: its per-field rows, and every field a fixed-size multi-hot bag (MLPerf's
sizes, 214 ids a sample, times ``hotness_scale``: max(1, round(size x hotness_scale))).

* Field sizes: the real per-field sizes times ``scale``, rounded, but never below
  ``min(real size, min_field_size)`` so small fields keep a meaningful number of values.
* Ids: per field, a Zipf-like law over ranks (p(rank r) ~ r^-zipf_exponent) mapped through a
  seeded permutation of the field's ids, so hot ids are scattered over the id space the way
  dictionary-encoded ids are. A bag's ids are independent draws from its field's law, so an
  id may repeat within a bag (as in MLPerf's data).
* Law versions (``law``): by default law 1 for tables of at most ``LAW1_MAX_TABLE_ROWS`` rows
  (the bytes written before law 2 existed) and law 2 beyond. Law 2 holds O(1) state per field,
  so memory is bounded by the chunk whatever the table's rows: ranks up to ``HEAD_RANKS`` have p ~ r^-a exactly, a
  rank r beyond them the mass of x^-a over [r - 1/2, r + 1/2] (equal to r^-a within 1e-10
  there), drawn by inverting that CDF in closed form; the permutation is a keyed Feistel
  network with cycle walking; an id's weight and factors are normals hashed from the id.
  Law 1 (the data written before law 2 existed, byte for byte) draws the permutation and
  the per-id weights from the seed's stream, so it holds about 64 bytes per table row.
* Drift (optional), indexed ids: the rank -> id mapping rotates by ``drift * field_size``
  positions over the stream, so the hot set slides slowly (ids climb one rank at a time, the
  hottest drop out and come back as the coldest); the set of ids stays the field's.
* Open-world drift (``drift`` D > 0 with ``ids="hashed"``): values are born and fade, so the
  distinct keys grow without bound with the rows. D is the share of a field's values replaced
  per ``DRIFT_ROWS`` (a million) rows, the same at any ``rows``. Each field numbers its values in
  order of birth from a seeded start s; by row i, b(i) = floor(i x D x size / ``DRIFT_ROWS``)
  values have been born, and rank r is the value s + b(i) + size - 1 - r: the ``size`` latest
  born, the newest the hottest. So a value is born at rank 0, cools by one rank with every birth
  after it (its reads decay like a power of its age) and is never drawn again after 1/D million
  rows. Drawn by law 2: a value's weight and factors are hashed from (field, value), so the
  generator's memory is law 2's, with no per-value state, whatever the rows.
* Labels: Bernoulli(sigmoid(logit)) of a hidden model: a bias (set for ``positive_rate``), a
  weight per id, weights on the standardised dense features (the linear part, std
  ``linear_signal``), plus a factorisation-machine style pairwise term over field embeddings
  (std ``interaction_signal``) that linear models cannot capture. A bag contributes the mean of
  its ids' weights and embeddings, so a field's share of the signal does not grow with its bag.
* Dense (Criteo shape only): log(x + 1) of log-normal counts, with a per-feature share of missing
  values written as 0, as the Criteo reader produces them.
* Sessions (optional, ``sessions=True``): the shape's user-like fields (MovieLens: user; Avazu:
  device id, IP and model; Criteo: the five fields with over a million real values) come from a
  few open sessions instead of independent draws. Each sample stays on the previous sample's
  session or, with probability ``session_switch``, moves to one of ``concurrent_sessions`` open
  sessions chosen uniformly; a session ends after a geometric number of its samples (mean
  ``session_length``) and its slot opens a new one, whose ids are drawn from the fields' laws.
  So consecutive samples reuse ids the way a time-ordered log does (Herald's scheduler exploits
  that); the other fields stay independent. Defaults fitted by ``bench/session_fit.py``.
* Hashed ids (``ids="hashed"``): without drift the same draws, labels and dense features, each
  id written as its key (keys.py): the hash of (field, its field-local id as 8 little-endian
  bytes); with drift the values of the open world above, each written the same way.
* Rows are i.i.d. (or drift, or sessions, in stream order), so the split is simply the last
  ``val_fraction`` of rows. Everything is a function of the spec, seed included: same spec, same
  bytes.
"""
import math
import sys
import time
from dataclasses import asdict, dataclass, fields, replace

import numpy as np

from . import store
from .formats import avazu, criteo
from .keys import check_ids, hash_ids
from .schema import Fields
from .stats import rank_auc, top_rows_lookup_share

# rows generated per random stream (fewer for multi-hot shapes, see HiddenModel.chunk_rows);
# fixed so output does not depend on anything but the spec
CHUNK_ROWS = 1 << 17
INTERACTION_DIM = 4
MOVIELENS_1M_SIZES = (6040, 3706)
# MLPerf DLRM-DCNv2 on Criteo 1TB (docs/design.md section 9): rows and multi-hot size of each field
MLPERF_FIELD_SIZES = (40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956,
                      405282, 10, 2209, 11938, 155, 4, 976, 14, 40000000, 40000000, 40000000,
                      590152, 12973, 108, 36)
MLPERF_HOTNESS = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1)


@dataclass(frozen=True)
class Shape:
    real_sizes: tuple
    field_names: tuple
    num_dense: int
    default_scale: float
    session_fields: tuple   # fields that describe the user, constant within a session
    hotness: tuple = None   # ids per sample of each field, all fields bags; None: one id each


def user_like_fields(sizes):
    """Criteo's fields are anonymous; the ones with millions of values are the per-user ones."""
    return tuple(f for f, size in enumerate(sizes) if size > 1_000_000)


SHAPES = {
    "criteo": Shape(criteo.FIELD_SIZES, criteo.FIELD_NAMES, criteo.NUM_DENSE, 0.01,
                    user_like_fields(criteo.FIELD_SIZES)),
    # about 200M rows at full size: 0.002 gives about 400K, near the criteo shape's default
    "criteo-multihot": Shape(MLPERF_FIELD_SIZES, criteo.FIELD_NAMES, criteo.NUM_DENSE, 0.002,
                             user_like_fields(MLPERF_FIELD_SIZES), MLPERF_HOTNESS),
    "avazu": Shape(avazu.FIELD_SIZES, avazu.FIELD_NAMES, 0, 0.03,
                   tuple(avazu.FIELD_NAMES.index(name)
                         for name in ("device_id", "device_ip", "device_model"))),
    "movielens": Shape(MOVIELENS_1M_SIZES, ("user", "item"), 0, 1.0, (0,)),
}
SESSIONS_SUFFIX = "-sessions"
SESSION_PARAMETERS = ("session_length", "concurrent_sessions", "session_switch")
# fitted by bench/session_fit.py to the user reuse distances of MovieLens 100K in time order
# (grid search, L1 distance of the histograms on power-of-two bins: 0.056); docs/session_fit.png
FIT_SESSION_LENGTH = 100.0
FIT_CONCURRENT_SESSIONS = 2
FIT_SESSION_SWITCH = 0.2
LAWS = (1, 2)
LATEST_LAW = 2
# law 0 asks for the default: law 1 (today's bytes) for tables it holds in at most 1 GiB, law 2
# beyond, so every dataset that could be generated before law 2 keeps its bytes
LAW1_MAX_TABLE_ROWS = 1 << 24
# law 2: ranks drawn from an exact table up to here, from the closed-form tail beyond
HEAD_RANKS = 1 << 16
AUC_ROWS = 1 << 23       # meta's hidden_logit_auc: over the first rows only, to bound memory
COUNT_RANGE = 1 << 24    # ids counted per pass over sparse.npy for top1pct_lookup_share
PROGRESS_SECONDS = 10.0
# open-world drift: ``drift`` is the share of a field's values replaced per this many rows
DRIFT_ROWS = 1_000_000
# open-world drift: field f's values are global ids [f << OPEN_FIELD_BITS, (f + 1) << ...), each
# field's birth numbering starting at a seeded value below 1 << FIRST_VALUE_BITS
OPEN_FIELD_BITS = 58
FIRST_VALUE_BITS = 40


@dataclass(frozen=True)
class SyntheticSpec:
    shape: str = "criteo"
    rows: int = 500_000
    scale: float = 0.01
    min_field_size: int = 16
    zipf_exponent: float = 1.05
    drift: float = 0.0
    positive_rate: float = 0.25
    linear_signal: float = 1.6
    interaction_signal: float = 0.6
    val_fraction: float = 0.1
    seed: int = 0
    sessions: bool = False
    session_length: float = FIT_SESSION_LENGTH
    concurrent_sessions: int = FIT_CONCURRENT_SESSIONS
    session_switch: float = FIT_SESSION_SWITCH
    hotness_scale: float = 1.0   # multi-hot shapes: bag sizes times this (at least 1)
    law: int = 0                 # how ids and the hidden model are drawn (module docstring); 0: by size
    ids: str = "indexed"         # or "hashed": each id written as its key (keys.py)

    def __post_init__(self):
        if self.shape not in SHAPES:
            raise ValueError(f"unknown shape {self.shape!r}; one of {sorted(SHAPES)}")
        if self.rows < 1 or self.scale <= 0 or self.min_field_size < 1:
            raise ValueError(f"rows, scale and min_field_size must be positive: {self}")
        if self.zipf_exponent < 0 or not 0 < self.positive_rate < 1 or self.drift < 0:
            raise ValueError(f"bad zipf_exponent, positive_rate or drift: {self}")
        if self.session_length < 1 or self.concurrent_sessions < 1 or \
                not 0 <= self.session_switch <= 1:
            raise ValueError(f"bad session_length, concurrent_sessions or session_switch: {self}")
        if self.hotness_scale <= 0:
            raise ValueError(f"hotness_scale must be positive: {self}")
        if self.law not in (0,) + LAWS:
            raise ValueError(f"law must be one of {LAWS} (or 0: by the table's size): {self}")
        check_ids(self.ids)
        if self.open_world and self.law == 1:
            raise ValueError(f"drift with ids='hashed' (open-world) is drawn by law 2, as law 1 "
                             f"holds a weight per value: law 1 asked for in {self}")

    @property
    def open_world(self):
        """Whether values are born and fade (drift with hashed ids), not drawn from fixed fields."""
        return self.drift > 0 and self.ids == "hashed"

    @property
    def drawn_law(self):
        """The law the data is drawn by: ``law``, or with law 0 the one the table's size picks
        (law 2 for an open world, whose values no table holds)."""
        if self.law:
            return self.law
        if self.open_world:
            return LATEST_LAW
        rows = scaled_field_sizes(SHAPES[self.shape].real_sizes, self.scale, self.min_field_size).sum()
        return 1 if rows <= LAW1_MAX_TABLE_ROWS else LATEST_LAW

    @property
    def name(self):
        return f"synthetic-{self.shape}{SESSIONS_SUFFIX if self.sessions else ''}"

    def as_dict(self):
        """The parameters that make the data. Session parameters only count with sessions on,
        and hotness_scale only for multi-hot shapes, so other datasets keep the identity (cache
        folder, meta) they had without them."""
        params = asdict(self)
        if not self.sessions:
            for name in ("sessions",) + SESSION_PARAMETERS:
                del params[name]
        if SHAPES[self.shape].hotness is None:
            del params["hotness_scale"]
        params["law"] = self.drawn_law
        if params["law"] == 1:
            del params["law"]   # law 1's datasets keep their cache folder and meta
        if self.ids == "indexed":
            del params["ids"]   # so do indexed datasets
        return params


def synthetic_spec(shape="criteo", **overrides):
    """A full spec for ``shape`` with its default scale; unknown keyword names are an error."""
    known = {f.name for f in fields(SyntheticSpec)}
    unknown = set(overrides) - known
    if unknown:
        raise TypeError(f"unknown synthetic parameter(s) {sorted(unknown)}; known: "
                        f"{sorted(known)}")
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; one of {sorted(SHAPES)}")
    overrides.setdefault("scale", SHAPES[shape].default_scale)
    return replace(SyntheticSpec(shape=shape), **overrides)


def shape_fields(shape):
    """The fields of a shape at its real size (the table's rows summed over its real fields), as a
    model named for the dataset takes them when it is given no data."""
    s = SHAPES[shape]
    slots = (1,) * len(s.field_names) if s.hotness is None else tuple(s.hotness)
    return Fields(tuple(s.field_names), slots, sum(s.real_sizes), s.num_dense,
                  () if s.hotness is None else tuple(s.field_names))


def parse_synthetic_name(name):
    """(shape, sessions) of ``synthetic``, ``synthetic-<shape>`` or ``synthetic-<shape>-sessions``."""
    shape = "criteo" if name == "synthetic" else name[len("synthetic-"):]
    sessions = shape.endswith(SESSIONS_SUFFIX)
    if sessions:
        shape = shape[:-len(SESSIONS_SUFFIX)]
    if shape not in SHAPES:
        raise ValueError(f"unknown synthetic dataset {name!r}; shapes: {sorted(SHAPES)}, "
                         f"each optionally with {SESSIONS_SUFFIX!r}")
    return shape, sessions


def scaled_field_sizes(real_sizes, scale, min_field_size):
    real = np.asarray(real_sizes, dtype=np.int64)
    scaled = np.rint(real * scale).astype(np.int64)
    return np.maximum(scaled, np.minimum(real, min_field_size))


def scaled_hotness(hotness, hotness_scale):
    """Bag sizes times ``hotness_scale``, rounded, at least one id."""
    return np.maximum(1, np.rint(np.asarray(hotness, dtype=np.float64) * hotness_scale)) \
        .astype(np.int64)


def zipf_cdf(size, exponent):
    weights = np.arange(1, size + 1, dtype=np.float64) ** -exponent
    cdf = np.cumsum(weights)
    return cdf / cdf[-1]


class ZipfRanks:
    """Law 1's 0-based ranks of a field: the whole normalised CDF in memory (8 bytes a row)."""

    def __init__(self, size, exponent):
        self.size = size
        self.cdf = zipf_cdf(size, exponent)

    def __call__(self, u):
        return np.minimum(np.searchsorted(self.cdf, u, side="right"), self.size - 1)


class PowerLawRanks:
    """Law 2's 0-based ranks of a field: an exact CDF table for the first ``HEAD_RANKS`` ranks,
    beyond them the CDF of the density x^-a (rank k covering [k - 1/2, k + 1/2)), inverted in
    closed form; so O(HEAD_RANKS) memory whatever the field's size."""

    def __init__(self, size, exponent):
        head = min(size, HEAD_RANKS)
        self.size, self.head, self.exponent = size, head, exponent
        self.head_cdf = np.cumsum(np.arange(1, head + 1, dtype=np.float64) ** -exponent)
        self.head_mass = self.head_cdf[-1]
        self.origin = self._integral(head + 0.5)
        self.total = self.head_mass + (self._integral(size + 0.5) - self.origin)

    def _integral(self, x):
        """(x^(1-a) - 1) / (1-a), the antiderivative of x^-a; log x at a = 1 (its limit)."""
        b = 1.0 - self.exponent
        return np.log(x) if b == 0 else np.expm1(b * np.log(x)) / b

    def _inverse_integral(self, y):
        b = 1.0 - self.exponent
        return np.exp(y) if b == 0 else np.exp(np.log1p(b * y) / b)

    def __call__(self, u):
        mass = u * self.total
        ranks = np.searchsorted(self.head_cdf, mass, side="right")
        tail = np.flatnonzero(ranks >= self.head)
        if len(tail):
            x = self._inverse_integral(mass[tail] - self.head_mass + self.origin)
            ranks[tail] = np.clip(np.floor(x - 0.5), self.head, self.size - 1)
        return np.minimum(ranks, self.size - 1)


GOLDEN_GAMMA = np.uint64(0x9E3779B97F4A7C15)


def mix64(x):
    """splitmix64's finaliser: a bijection of uint64 whose outputs of nearby inputs look
    independent."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def hashed_normals(ids, key, width=1):
    """[..., width] standard normals, a function of (id, key) alone, so a per-id value needs no
    per-id storage: Box-Muller on the two 32-bit halves of a splitmix64 hash of (id, pair),
    each hash giving a pair of normals."""
    pairs = (width + 1) // 2
    counters = np.asarray(ids, dtype=np.int64).astype(np.uint64)[..., None] * np.uint64(pairs) \
        + np.arange(pairs, dtype=np.uint64)
    with np.errstate(over="ignore"):
        bits = mix64(counters * GOLDEN_GAMMA + np.uint64(key))
    radius = np.sqrt(-2.0 * np.log(((bits >> np.uint64(32)).astype(np.float64) + 0.5) * 2.0 ** -32))
    angle = (2.0 * np.pi * 2.0 ** -32) * (bits & np.uint64(0xFFFFFFFF)).astype(np.float64)
    normals = np.stack([radius * np.cos(angle), radius * np.sin(angle)], axis=-1)
    return normals.reshape(normals.shape[:-2] + (2 * pairs,))[..., :width]


class FeistelPermutation:
    """A seeded bijection of [0, size) computed per element: a 4-round Feistel network on the
    smallest even number of bits that covers size, cycle-walked back into range (fewer than 4
    steps on average, as the network's domain is under 4 x size)."""

    def __init__(self, size, keys):
        half = (max(2, int(size - 1).bit_length()) + 1) // 2
        self.size, self.keys = size, [np.uint64(k) for k in keys]
        self.half, self.mask = np.uint64(half), np.uint64((1 << half) - 1)

    def _encrypt(self, x):
        left, right = x >> self.half, x & self.mask
        for key in self.keys:
            left, right = right, left ^ (mix64(right ^ key) & self.mask)
        return (left << self.half) | right

    def __getitem__(self, ranks):
        # hot ranks repeat a lot: each distinct one is encrypted once
        distinct, inverse = np.unique(np.asarray(ranks), return_inverse=True)
        x = self._encrypt(distinct.astype(np.uint64))
        pending = np.flatnonzero(x >= self.size)
        while len(pending):
            x[pending] = self._encrypt(x[pending])
            pending = pending[x[pending] >= self.size]
        return x.astype(np.int64)[inverse].reshape(np.shape(ranks))


class OpenSessions:
    """The ids of the user-like fields, sample by sample: ``concurrent_sessions`` open sessions
    (slots); each sample stays on the previous sample's slot or, with probability
    ``session_switch``, moves to a uniformly chosen slot (possibly the same), and with
    probability 1 / ``session_length`` opens a new session in its slot (so sessions last a
    geometric number of their slot's samples, mean ``session_length``), with ids from
    ``draw_ids(rng, rows)`` ([len(rows), S] ids of sessions opening at stream positions rows).
    Vectorised per chunk; the current slot and the open sessions' ids carry over to the next."""

    def __init__(self, spec, draw_ids, rng):
        self.opening = 1.0 / spec.session_length
        self.concurrent = spec.concurrent_sessions
        self.switch = spec.session_switch
        self.draw_ids = draw_ids
        self.slot = 0
        self.open_ids = draw_ids(rng, np.zeros(self.concurrent, dtype=np.int64))

    def next_ids(self, rng, first_row, n):
        positions = np.arange(n, dtype=np.int64)
        # slot of each sample: the one chosen at the latest switch, or the carried slot
        switches = rng.random(n) < self.switch
        chosen = rng.integers(0, self.concurrent, n)
        latest_switch = np.maximum.accumulate(np.where(switches, positions, -1))
        slots = np.where(latest_switch >= 0, chosen[np.maximum(latest_switch, 0)], self.slot)
        opens = rng.random(n) < self.opening
        new_rows = np.flatnonzero(opens)
        new_ids = self.draw_ids(rng, first_row + new_rows)
        # per slot, the latest opening so far (-1: the session carried into the chunk); rows
        # sorted by slot, offset by slot so that one running maximum serves every slot
        order = np.argsort(slots, kind="stable")
        ordered_slots = slots[order]
        stride = n + 1
        marks = ordered_slots * stride + np.where(opens[order], order + 1, 0)
        opened_at = np.maximum.accumulate(marks) - ordered_slots * stride - 1
        new_index = np.cumsum(opens) - 1            # row -> its session's index in new_ids
        carried = opened_at < 0
        ids = np.empty((n, self.open_ids.shape[1]), dtype=np.int64)
        ids[order[carried]] = self.open_ids[ordered_slots[carried]]
        ids[order[~carried]] = new_ids[new_index[opened_at[~carried]]]
        # each slot's last sample holds the session still open at the chunk's end
        last = np.flatnonzero(np.r_[ordered_slots[1:] != ordered_slots[:-1], True])
        self.open_ids[ordered_slots[last]] = ids[order[last]]
        self.slot = int(slots[-1])
        return ids


class HiddenModel:
    """The structure of one synthetic dataset: id laws and the label model, all from the seed."""

    def __init__(self, spec):
        self.spec = spec
        shape = SHAPES[spec.shape]
        rng = np.random.default_rng([spec.seed, 0])
        self.field_sizes = scaled_field_sizes(shape.real_sizes, spec.scale, spec.min_field_size)
        self.offsets = store.field_offsets(self.field_sizes)
        if spec.open_world:
            self._init_open_world(len(self.field_sizes))
        self.bags = shape.hotness is not None
        self.field_slots = scaled_hotness(shape.hotness, spec.hotness_scale) if self.bags \
            else np.ones(len(self.field_sizes), dtype=np.int64)
        self.slot_offsets = np.asarray(store.slot_offsets(self.field_slots))
        self.num_slots = int(self.slot_offsets[-1])
        # about as many ids per chunk as a one-id-per-field chunk: halved per doubling of slots
        self.chunk_rows = CHUNK_ROWS >> math.ceil(math.log2(self.num_slots / len(self.field_sizes)))
        self.num_embeddings = int(self.field_sizes.sum())
        self.num_dense = shape.num_dense
        if spec.drawn_law == 1:
            self.ranks = [ZipfRanks(int(n), spec.zipf_exponent) for n in self.field_sizes]
            self.permutations = [rng.permutation(int(n)).astype(np.int64)
                                 for n in self.field_sizes]
        else:
            self.ranks = [PowerLawRanks(int(n), spec.zipf_exponent) for n in self.field_sizes]
            # its own stream, so the draws from rng below stay those of law 1
            keys = np.random.default_rng([spec.seed, 3]).integers(
                0, 1 << 63, size=(len(self.field_sizes) + 1, 4), dtype=np.int64)
            self.permutations = [FeistelPermutation(int(n), k)
                                 for n, k in zip(self.field_sizes, keys)]
            self.weight_key, self.factor_key = (int(k) for k in keys[-1, :2])
        self._init_linear(rng, len(self.field_sizes))
        self._init_interactions(rng, len(self.field_sizes))
        self.bias = 0.0
        self.bias = self._bias_for_rate(rng, spec.positive_rate)

    def _init_open_world(self, num_fields):
        """Global ids of unbounded fields: field f's values from f << OPEN_FIELD_BITS on, and
        each field's first value (its birth numbering's seeded start)."""
        spec = self.spec
        self.offsets = np.arange(num_fields, dtype=np.int64) << OPEN_FIELD_BITS
        # a stream of its own, so the other draws stay those of the closed-world dataset
        self.first_values = np.random.default_rng([spec.seed, 4]).integers(
            0, 1 << FIRST_VALUE_BITS, size=num_fields, dtype=np.int64)
        last_values = self.first_values + self.field_sizes + \
            np.floor(spec.rows * (spec.drift * self.field_sizes / DRIFT_ROWS))
        if last_values.max() >= 1 << OPEN_FIELD_BITS:
            raise ValueError(f"drift {spec.drift} over {spec.rows} rows gives a field more than "
                             f"2^{OPEN_FIELD_BITS} values: ask for a smaller drift or fewer rows")

    def _init_linear(self, rng, num_fields):
        spec = self.spec
        dense_share = 0.2 if self.num_dense else 0.0
        importance = rng.uniform(0.3, 1.0, size=num_fields)
        field_std = spec.linear_signal * math.sqrt(1 - dense_share) * importance / \
            np.sqrt((importance ** 2).sum())
        # law 2: a column's weights are hashed normals times its field's std (id_values)
        self.slot_std = np.repeat(field_std, self.field_slots)
        if spec.drawn_law == 1:
            self.weight_table = rng.standard_normal(self.num_embeddings) * \
                np.repeat(field_std, self.field_sizes)
        self.dense_log_mean = rng.uniform(0.0, 4.0, size=self.num_dense)
        self.dense_missing = rng.uniform(0.0, 0.4, size=self.num_dense)
        pilot = self._dense_features(rng, 8192)
        self.dense_mean = pilot.mean(axis=0)
        self.dense_std = pilot.std(axis=0) + 1e-6
        self.dense_weights = rng.standard_normal(self.num_dense) * \
            spec.linear_signal * math.sqrt(dense_share / max(self.num_dense, 1))

    def _init_interactions(self, rng, num_fields):
        pairs = num_fields * (num_fields - 1) / 2
        if self.spec.interaction_signal <= 0 or pairs == 0:
            self.factor_std = None
            return
        # sum over field pairs of <e_f, e_g> with entries N(0, t^2) has variance pairs*k*t^4
        t = (self.spec.interaction_signal ** 2 / (pairs * INTERACTION_DIM)) ** 0.25
        self.factor_std = t
        if self.spec.drawn_law == 1:
            self.factor_table = (rng.standard_normal((self.num_embeddings, INTERACTION_DIM)) *
                                 t).astype(np.float32)

    def id_values(self, ids):
        """[n, S] ids (every slot) -> their linear weights [n, S] and interaction factors
        [n, S, k] (None without interactions)."""
        if self.spec.drawn_law == 1:
            return self.weight_table[ids], \
                None if self.factor_std is None else self.factor_table[ids]
        # hot ids repeat a lot: each distinct one is hashed once
        distinct, inverse = np.unique(ids, return_inverse=True)
        inverse = inverse.reshape(ids.shape)
        weights = hashed_normals(distinct, self.weight_key)[:, 0][inverse] * self.slot_std
        if self.factor_std is None:
            return weights, None
        factors = (hashed_normals(distinct, self.factor_key, INTERACTION_DIM) *
                   self.factor_std).astype(np.float32)
        return weights, factors[inverse]

    def _bias_for_rate(self, rng, rate, pilot_rows=32768):
        """Bias that gives ``rate`` positives on a pilot sample. Solved numerically because the
        few hottest ids carry most of the mass, so their (random) weights shift the mean logit
        far from what a Gaussian approximation predicts."""
        pilot_ids = self.sample_ids(rng, 0, pilot_rows)
        offsets = self.logits(pilot_ids, self._dense_features(rng, pilot_rows))
        low, high = -30.0, 30.0
        for _ in range(60):
            middle = (low + high) / 2
            if np.mean(1.0 / (1.0 + np.exp(-(offsets + middle)))) < rate:
                low = middle
            else:
                high = middle
        return (low + high) / 2

    def _dense_features(self, rng, n):
        if not self.num_dense:
            return np.zeros((n, 0), dtype=np.float32)
        counts = np.floor(np.exp(self.dense_log_mean + rng.standard_normal((n, self.num_dense))))
        counts[rng.random((n, self.num_dense)) < self.dense_missing] = 0
        return np.log1p(counts).astype(np.float32)

    def sample_ids(self, rng, first_row, n):
        return self.field_ids(rng, range(len(self.field_sizes)),
                              first_row + np.arange(n, dtype=np.int64))

    def slot_columns(self, field_indices):
        """The sparse columns (slots) of the given fields, in order."""
        return np.concatenate([np.arange(self.slot_offsets[f], self.slot_offsets[f + 1])
                               for f in field_indices])

    def field_ids(self, rng, field_indices, rows):
        """Independent draws of the given fields' global ids (every slot of each) for samples
        at stream positions ``rows`` (the position sets the drift)."""
        n = len(rows)
        ids = np.empty((n, len(self.slot_columns(field_indices))), dtype=np.int64)
        rows = np.asarray(rows)[:, None]
        column = 0
        for f in field_indices:
            slots = int(self.field_slots[f])
            ranks = self.ranks[f](rng.random(n * slots)).reshape(n, slots)
            ids[:, column:column + slots] = self.rank_values(f, ranks, rows) + self.offsets[f]
            column += slots
        return ids

    def rank_values(self, f, ranks, rows):
        """Field f's local values of ``ranks`` [n, slots] drawn at stream positions ``rows``
        [n, 1] (the module docstring's drift and open-world drift)."""
        size, drift = self.field_sizes[f], self.spec.drift
        if self.spec.open_world:
            born = np.floor(rows * (drift * size / DRIFT_ROWS)).astype(np.int64)
            return self.first_values[f] + born + (size - 1 - ranks)
        if drift:
            ranks = (ranks + np.floor(drift * size * (rows / self.spec.rows)).astype(np.int64)) \
                % size
        return self.permutations[f][ranks]

    def keys(self, ids):
        """[n, S] global ids -> their keys: the hash of (field, field-local id)."""
        keys = np.empty_like(ids)
        for f, offset in enumerate(self.offsets):
            start, stop = self.slot_offsets[f], self.slot_offsets[f + 1]
            keys[:, start:stop] = hash_ids(f, ids[:, start:stop] - offset)
        return keys

    def pool(self, values):
        """[n, S, ...] values of the slots -> [n, F, ...] mean over each field's bag."""
        if not self.bags:
            return values
        sizes = self.field_slots.astype(values.dtype).reshape((-1,) + (1,) * (values.ndim - 2))
        return np.add.reduceat(values, self.slot_offsets[:-1], axis=1) / sizes

    def logits(self, ids, dense):
        weights, factors = self.id_values(ids)
        logit = self.bias + self.pool(weights).sum(axis=1)
        if self.num_dense:
            logit += ((dense - self.dense_mean) / self.dense_std) @ self.dense_weights
        if factors is not None:
            embedded = self.pool(factors)                     # [n, F, k]
            total = embedded.sum(axis=1)
            logit += 0.5 * ((total ** 2).sum(axis=1) - (embedded ** 2).sum(axis=(1, 2)))
        return logit

    def sessions(self):
        """The open sessions at the start of the stream (None without sessions)."""
        if not self.spec.sessions:
            return None
        fields = SHAPES[self.spec.shape].session_fields
        return OpenSessions(self.spec, lambda rng, rows: self.field_ids(rng, fields, rows),
                            np.random.default_rng([self.spec.seed, 2]))

    def generate_chunk(self, chunk_index, first_row, n, sessions=None):
        """One chunk of the stream; ``sessions`` (from ``self.sessions()``) is carried from
        chunk to chunk, so chunks must come in order."""
        rng = np.random.default_rng([self.spec.seed, 1, chunk_index])
        ids = self.sample_ids(rng, first_row, n)
        if sessions is not None:
            # a stream of its own, so the other fields, dense and draws stay as without sessions
            ids[:, self.slot_columns(SHAPES[self.spec.shape].session_fields)] = sessions.next_ids(
                np.random.default_rng([self.spec.seed, 2, chunk_index]), first_row, n)
        dense = self._dense_features(rng, n)
        logit = self.logits(ids, dense)
        labels = (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
        return dense, ids, labels, logit


def generate_synthetic(output_dir, spec=None, *, overwrite=False, progress=True, **overrides):
    """Write a synthetic dataset folder; ``spec`` or keyword overrides of the shape's defaults
    (e.g. ``generate_synthetic(d, shape="avazu", rows=10**6)``). Returns the folder path.
    Files are written chunk by chunk; with law 2 memory is bounded by the chunk, not by the
    rows of the table or of the dataset. ``progress``: lines on stderr, and the rate at the end."""
    if spec is None:
        spec = synthetic_spec(**overrides)
    elif overrides:
        spec = replace(spec, **overrides)
    started = time.perf_counter()
    model = HiddenModel(spec)
    sessions = model.sessions()
    shape = SHAPES[spec.shape]
    n = spec.rows
    auc_rows = min(n, AUC_ROWS)
    logits = np.empty(auc_rows, dtype=np.float32)
    auc_labels = np.empty(auc_rows, dtype=np.float32)
    positives = 0
    report = Progress(spec.name, n, 4 * model.num_dense + 8 * model.num_slots + 4, progress)
    with store.atomic_directory(output_dir, overwrite=overwrite) as tmp_dir:
        with store.NpyWriter(tmp_dir, store.DENSE_FILE, np.float32, (n, model.num_dense)) as dense, \
                store.NpyWriter(tmp_dir, store.SPARSE_FILE, np.int64, (n, model.num_slots)) as sparse, \
                store.NpyWriter(tmp_dir, store.LABELS_FILE, np.float32, (n, 1)) as labels:
            for index, start in enumerate(range(0, n, model.chunk_rows)):
                stop = min(start + model.chunk_rows, n)
                chunk_dense, chunk_ids, chunk_labels, chunk_logits = \
                    model.generate_chunk(index, start, stop - start, sessions)
                dense.write(chunk_dense)
                sparse.write(model.keys(chunk_ids) if spec.ids == "hashed" else chunk_ids)
                labels.write(chunk_labels[:, None])
                positives += int(np.count_nonzero(chunk_labels))
                kept = max(0, min(stop, auc_rows) - start)
                logits[start:start + kept] = chunk_logits[:kept]
                auc_labels[start:start + kept] = chunk_labels[:kept]
                report.update(stop)
        generated = time.perf_counter()
        read_rows = max(1, (1 << 23) // model.num_slots)
        # keys are no row indices: their lookup share is the indexed dataset's (same draws)
        measured = measure(lambda: store.npy_row_chunks(tmp_dir / store.SPARSE_FILE, read_rows),
                           positives / n, auc_labels, logits,
                           None if spec.ids == "hashed" else model.num_embeddings)
        if auc_rows < n:
            measured["hidden_logit_auc_rows"] = auc_rows
        measured["seconds"] = round(time.perf_counter() - started, 3)
        train_rows, val_rows = store.contiguous_split(n, spec.val_fraction)
        source = {"kind": "synthetic", "spec": spec.as_dict(),
                  "real_field_sizes": list(shape.real_sizes), "measured": measured}
        store.write_meta(tmp_dir, store.dataset_meta(
            spec.name, n, model.num_dense, shape.field_names, model.field_sizes,
            train_rows, val_rows, spec.val_fraction, None, source,
            label={"kind": "click", "values": [0.0, 1.0]},
            field_slots=model.field_slots, bag_fields=shape.field_names if model.bags else (),
            dense_names=[f"I{i}" for i in range(1, model.num_dense + 1)], ids=spec.ids))
    report.finish(generated - started, time.perf_counter() - generated)
    return output_dir


class Progress:
    """Progress lines on stderr every ``PROGRESS_SECONDS`` and the rate at the end (samples/s
    and MB/s of the files written)."""

    def __init__(self, name, rows, row_bytes, enabled):
        self.name, self.rows, self.row_bytes, self.enabled = name, rows, row_bytes, enabled
        self.started = self.last = time.perf_counter()

    def update(self, done):
        now = time.perf_counter()
        if not self.enabled or now - self.last < PROGRESS_SECONDS or done >= self.rows:
            return
        self.last = now
        rate = done / (now - self.started)
        print(f"{self.name}: {done:,}/{self.rows:,} samples ({100 * done / self.rows:.0f}%), "
              f"{rate:,.0f} samples/s, {rate * self.row_bytes / 1e6:.1f} MB/s, "
              f"{(self.rows - done) / rate:.0f} s left", file=sys.stderr, flush=True)

    def finish(self, generating, measuring):
        if not self.enabled:
            return
        megabytes = self.rows * self.row_bytes / 1e6
        print(f"{self.name}: {self.rows:,} samples, {megabytes:,.1f} MB in {generating:.1f} s "
              f"(model, draws and writes): {self.rows / generating:,.0f} samples/s, "
              f"{megabytes / generating:.1f} MB/s; meta's measurements {measuring:.1f} s",
              file=sys.stderr, flush=True)


def measure(sparse_chunks, positive_rate, labels, logits, num_embeddings):
    """meta's figures: ``sparse_chunks()`` yields the ids afresh for each pass; the AUC is over
    the rows of ``labels`` and ``logits`` (the first ``AUC_ROWS``). ``num_embeddings`` None
    (hashed ids): no lookup share."""
    measured = {"positive_rate": round(float(positive_rate), 4)}
    if num_embeddings is not None:
        measured["top1pct_lookup_share"] = round(top_rows_lookup_share(
            sparse_chunks, num_embeddings, 0.01, id_range=COUNT_RANGE), 4)
    if 0 < labels.sum() < len(labels):
        measured["hidden_logit_auc"] = round(rank_auc(labels, logits), 4)
    return measured
