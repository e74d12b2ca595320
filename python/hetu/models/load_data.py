"""The datasets the models are named for (``<arch>_criteo``, ``_avazu``, ``_movielens``), by name.

With no ``data_dir`` each loader returns synthetic data shaped like the real dataset, generated
on first use into ``$HETU_DATA_HOME`` (default ``~/.cache/hetu/datasets``) and memory-mapped from
there afterwards; worker processes started together generate it once (file lock) and share the
pages. With ``data_dir``, the folder written by ``python -m hetu.data.prepare``.

Default synthetic sizes (small enough to train in well under a minute on 2 CPU cores):
  criteo:    500,000 rows, 26 fields scaled by 0.01 -> 337,754 ids, 13 dense features
  avazu:     500,000 rows, 22 fields scaled by 0.03 -> 283,608 ids
  movielens: 500,000 rows, user/item at MovieLens-1M size (6,040 + 3,706 ids)
Any ``hetu.data.SyntheticSpec`` field can be overridden by keyword (rows=, scale=, seed=,
zipf_exponent=, drift=, sessions=True for time-ordered reuse of the user-like fields, ...).
"""
from hetu.data import load_dataset


def _load(shape, data_dir, synthetic_kwargs):
    if data_dir is not None:
        if synthetic_kwargs:
            raise TypeError(f"synthetic parameters {sorted(synthetic_kwargs)} given together "
                            f"with data_dir={data_dir!r}")
        return load_dataset(data_dir)
    return load_dataset(f"synthetic-{shape}", **synthetic_kwargs)


def load_criteo(data_dir=None, **synthetic_kwargs):
    return _load("criteo", data_dir, synthetic_kwargs)


def load_avazu(data_dir=None, **synthetic_kwargs):
    return _load("avazu", data_dir, synthetic_kwargs)


def load_movielens(data_dir=None, **synthetic_kwargs):
    return _load("movielens", data_dir, synthetic_kwargs)


LOADERS = {"criteo": load_criteo, "avazu": load_avazu, "movielens": load_movielens}


def load(name, data_dir=None, **synthetic_kwargs):
    """Loader by dataset name, for command lines (``--dataset criteo --data-dir DIR``)."""
    if name not in LOADERS:
        raise ValueError(f"unknown dataset {name!r}; one of {sorted(LOADERS)}")
    return LOADERS[name](data_dir, **synthetic_kwargs)
