"""Synthetic click logs shaped like Criteo, Avazu or MovieLens: the default data of every example,
generated with numpy in seconds and needing no download.

* Field sizes: the real per-field sizes times ``scale``, rounded, but never below
  ``min(real size, min_field_size)`` so small fields keep a meaningful number of values.
* Ids: per field, a Zipf-like law over ranks (p(rank r) ~ r^-zipf_exponent) mapped through a
  seeded random permutation of the field's ids, so hot ids are scattered over the id space the
  way dictionary-encoded ids are.
* Drift (optional): the rank -> id mapping rotates by ``drift * field_size`` positions over the
  stream, so the hot set slides slowly (ids climb one rank at a time, the hottest drop out).
* Labels: Bernoulli(sigmoid(logit)) of a hidden model: a bias (set for ``positive_rate``), a
  weight per id, weights on the standardised dense features (the linear part, std
  ``linear_signal``), plus a factorisation-machine style pairwise term over field embeddings
  (std ``interaction_signal``) that linear models cannot capture.
* Dense (Criteo shape only): log(x + 1) of log-normal counts, with a per-feature share of missing
  values written as 0, as the Criteo reader produces them.
* Rows are i.i.d. (or drift in stream order), so the split is simply the last ``val_fraction`` of
  rows. Everything is a function of the spec, seed included: same spec, same bytes.
"""
import math
import sys
import time
from dataclasses import asdict, dataclass, fields, replace

import numpy as np
from tqdm import tqdm

from . import avazu, criteo, store
from .stats import rank_auc, top_rows_lookup_share

# rows generated per random stream; fixed so output does not depend on anything but the spec
CHUNK_ROWS = 1 << 17
INTERACTION_DIM = 4
MOVIELENS_1M_SIZES = (6040, 3706)


@dataclass(frozen=True)
class Shape:
    real_sizes: tuple
    field_names: tuple
    num_dense: int
    default_scale: float


SHAPES = {
    "criteo": Shape(criteo.FIELD_SIZES, criteo.FIELD_NAMES, criteo.NUM_DENSE, 0.01),
    "avazu": Shape(avazu.FIELD_SIZES, avazu.FIELD_NAMES, 0, 0.03),
    "movielens": Shape(MOVIELENS_1M_SIZES, ("user", "item"), 0, 1.0),
}


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

    def __post_init__(self):
        if self.shape not in SHAPES:
            raise ValueError(f"unknown shape {self.shape!r}; one of {sorted(SHAPES)}")
        if self.rows < 1 or self.scale <= 0 or self.min_field_size < 1:
            raise ValueError(f"rows, scale and min_field_size must be positive: {self}")
        if self.zipf_exponent < 0 or not 0 < self.positive_rate < 1 or self.drift < 0:
            raise ValueError(f"bad zipf_exponent, positive_rate or drift: {self}")

    def as_dict(self):
        return asdict(self)


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


def scaled_field_sizes(real_sizes, scale, min_field_size):
    real = np.asarray(real_sizes, dtype=np.int64)
    scaled = np.rint(real * scale).astype(np.int64)
    return np.maximum(scaled, np.minimum(real, min_field_size))


def zipf_cdf(size, exponent):
    weights = np.arange(1, size + 1, dtype=np.float64) ** -exponent
    cdf = np.cumsum(weights)
    return cdf / cdf[-1]


class HiddenModel:
    """The structure of one synthetic dataset: id laws and the label model, all from the seed."""

    def __init__(self, spec):
        self.spec = spec
        shape = SHAPES[spec.shape]
        rng = np.random.default_rng([spec.seed, 0])
        self.field_sizes = scaled_field_sizes(shape.real_sizes, spec.scale, spec.min_field_size)
        self.offsets = store.field_offsets(self.field_sizes)
        self.num_embeddings = int(self.field_sizes.sum())
        self.num_dense = shape.num_dense
        self.cdfs = [zipf_cdf(int(n), spec.zipf_exponent) for n in self.field_sizes]
        self.permutations = [rng.permutation(int(n)).astype(np.int64) for n in self.field_sizes]
        self._init_linear(rng, len(self.field_sizes))
        self._init_interactions(rng, len(self.field_sizes))
        self.bias = 0.0
        self.bias = self._bias_for_rate(rng, spec.positive_rate)

    def _init_linear(self, rng, num_fields):
        spec = self.spec
        dense_share = 0.2 if self.num_dense else 0.0
        importance = rng.uniform(0.3, 1.0, size=num_fields)
        field_std = spec.linear_signal * math.sqrt(1 - dense_share) * importance / \
            np.sqrt((importance ** 2).sum())
        self.id_weights = rng.standard_normal(self.num_embeddings) * \
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
            self.factors = None
            return
        # sum over field pairs of <e_f, e_g> with entries N(0, t^2) has variance pairs*k*t^4
        t = (self.spec.interaction_signal ** 2 / (pairs * INTERACTION_DIM)) ** 0.25
        self.factors = (rng.standard_normal((self.num_embeddings, INTERACTION_DIM)) * t) \
            .astype(np.float32)

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
        ids = np.empty((n, len(self.field_sizes)), dtype=np.int64)
        position = (first_row + np.arange(n, dtype=np.int64)) / self.spec.rows
        for f, (size, cdf, perm) in enumerate(zip(self.field_sizes, self.cdfs,
                                                  self.permutations)):
            ranks = np.minimum(np.searchsorted(cdf, rng.random(n), side="right"), size - 1)
            if self.spec.drift:
                ranks = (ranks + np.floor(self.spec.drift * size * position).astype(np.int64)) \
                    % size
            ids[:, f] = perm[ranks] + self.offsets[f]
        return ids

    def logits(self, ids, dense):
        logit = self.bias + self.id_weights[ids].sum(axis=1)
        if self.num_dense:
            logit += ((dense - self.dense_mean) / self.dense_std) @ self.dense_weights
        if self.factors is not None:
            embedded = self.factors[ids]                      # [n, F, k]
            total = embedded.sum(axis=1)
            logit += 0.5 * ((total ** 2).sum(axis=1) - (embedded ** 2).sum(axis=(1, 2)))
        return logit

    def generate_chunk(self, chunk_index, first_row, n):
        rng = np.random.default_rng([self.spec.seed, 1, chunk_index])
        ids = self.sample_ids(rng, first_row, n)
        dense = self._dense_features(rng, n)
        logit = self.logits(ids, dense)
        labels = (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
        return dense, ids, labels, logit


def generate_synthetic(output_dir, spec=None, *, overwrite=False, progress=True, **overrides):
    """Write a synthetic dataset folder; ``spec`` or keyword overrides of the shape's defaults
    (e.g. ``generate_synthetic(d, shape="avazu", rows=10**6)``). Returns the folder path."""
    if spec is None:
        spec = synthetic_spec(**overrides)
    elif overrides:
        spec = replace(spec, **overrides)
    started = time.perf_counter()
    model = HiddenModel(spec)
    shape = SHAPES[spec.shape]
    n = spec.rows
    logits = np.empty(n, dtype=np.float32)
    with store.atomic_directory(output_dir, overwrite=overwrite) as tmp_dir:
        dense = store.create_array(tmp_dir, store.DENSE_FILE, np.float32, (n, model.num_dense))
        sparse = store.create_array(tmp_dir, store.SPARSE_FILE, np.int64,
                                    (n, len(model.field_sizes)))
        labels = store.create_array(tmp_dir, store.LABELS_FILE, np.float32, (n, 1))
        chunks = range(0, n, CHUNK_ROWS)
        for index, start in enumerate(tqdm(chunks, desc=f"synthetic {spec.shape}", unit="chunk",
                                           disable=not progress, file=sys.stderr)):
            stop = min(start + CHUNK_ROWS, n)
            chunk_dense, chunk_ids, chunk_labels, chunk_logits = \
                model.generate_chunk(index, start, stop - start)
            dense[start:stop] = chunk_dense
            sparse[start:stop] = chunk_ids
            labels[start:stop, 0] = chunk_labels
            logits[start:stop] = chunk_logits
        store.flush_arrays(dense, sparse, labels)
        measured = measure(sparse, labels, logits, model.num_embeddings)
        measured["seconds"] = round(time.perf_counter() - started, 3)
        train_rows, val_rows = store.contiguous_split(n, spec.val_fraction)
        source = {"kind": "synthetic", "spec": spec.as_dict(),
                  "real_field_sizes": list(shape.real_sizes), "measured": measured}
        store.write_meta(tmp_dir, store.dataset_meta(
            f"synthetic-{spec.shape}", n, model.num_dense, shape.field_names, model.field_sizes,
            train_rows, val_rows, spec.val_fraction, None, source,
            label={"kind": "click", "values": [0.0, 1.0]},
            dense_names=[f"I{i}" for i in range(1, model.num_dense + 1)]))
    return output_dir


def measure(sparse, labels, logits, num_embeddings):
    labels = np.asarray(labels).reshape(-1)
    measured = {
        "positive_rate": round(float(labels.mean()), 4),
        "top1pct_lookup_share": round(top_rows_lookup_share(sparse, num_embeddings, 0.01), 4),
    }
    if 0 < labels.sum() < len(labels):
        measured["hidden_logit_auc"] = round(rank_auc(labels, logits), 4)
    return measured
