"""Datasets for CTR models: readers for Criteo, Avazu, MovieLens, schema-described text and Parquet
(``hetu.data.formats``, the one registry of formats, for prepare and for streams), the synthetic
default data, and memory-mapped loading (``load_dataset``). Depends only on numpy, the standard
library, PyYAML and tqdm (pyarrow for Parquet alone), so it can be imported on its own.

Folder format (written by every reader and by the generator): ``dense.npy`` float32 [N, D]
(D = 0 when there are no dense features), ``sparse.npy`` int64 [N, S] holding global ids
(field offset + local id, all fields in one id space), ``labels.npy`` float32 [N, 1], and
``meta.json`` (field sizes and offsets, num_embeddings, split, source). The first
``split.train_rows`` rows train, the rest validate. A field takes ``field_slots[f]``
consecutive columns of sparse.npy (one when meta.json has no ``field_slots``); a field listed in
``bag_fields`` is multi-hot, its ids left-aligned and padded with -1 (``DatasetPart.bag`` gives
the jagged values and offsets). What a model reads of it (fields, slots, rows, dense width) is
``DatasetMeta.fields``, a ``Fields``. Prepared with ``--ids hashed`` (``meta.ids``), sparse.npy
holds each value's 64-bit key instead (keys.py), with no vocabulary and no field offsets.

User histories for sequential models (SASRec, HSTU) have a folder format of their own
(sequences.py: ``train_items.npy`` [U, L+1] and the held-out last items); ``load_dataset`` returns
a ``SequenceData`` for such a folder, or for the names ``movielens-sequences`` and
``synthetic-sequences``.

The Criteo and Avazu readers count and encode with ``hetu._C.ClickLogEncoder``, and
``draw_negatives`` draws with ``hetu._C``; the rest needs no compiled code.
"""
import sys

from .cache import data_home, ensure_synthetic, ensure_synthetic_sequences, synthetic_dataset_dir
from .dataset import BadBatch, Dataset, DatasetMeta, DatasetPart, load_dataset
from .schema import Fields
from .sequences import (SequenceData, draw_negatives, generate_synthetic_sequences, load_sequences,
                        prepare_movielens_sequences, shared_negatives)
from .stats import rank_auc, reuse_distances, reuse_share_within, top_rows_lookup_share
from .store import is_complete_dataset
from .synthetic import SyntheticSpec, generate_synthetic, shape_fields, synthetic_spec
from .formats import avazu, criteo, movielens, movielens_side, streams, tabular, textio
from .formats.avazu import prepare_avazu
from .formats.criteo import prepare_criteo
from .formats.movielens import prepare_movielens
from .formats.textio import DataFormatError

# The format modules live in hetu.data.formats; their names under hetu.data stay importable (the
# same modules, so that what is set on one is seen through the other).
for _name, _module in {"avazu": avazu, "criteo": criteo, "movielens": movielens, "movielens_side": movielens_side,
                       "stream_formats": streams, "tabular": tabular, "textio": textio}.items():
    sys.modules[f"{__name__}.{_name}"] = _module
del _name, _module

__all__ = [
    "BadBatch", "Dataset", "DatasetMeta", "DatasetPart", "DataFormatError", "Fields", "SequenceData",
    "SyntheticSpec", "data_home", "draw_negatives", "ensure_synthetic", "ensure_synthetic_sequences",
    "generate_synthetic", "generate_synthetic_sequences", "is_complete_dataset", "load_dataset", "load_sequences",
    "prepare_avazu", "prepare_criteo", "prepare_movielens", "prepare_movielens_sequences", "rank_auc",
    "reuse_distances", "reuse_share_within", "shape_fields", "shared_negatives", "synthetic_dataset_dir",
    "synthetic_spec", "top_rows_lookup_share",
]
