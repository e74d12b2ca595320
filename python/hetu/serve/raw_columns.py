"""The raw columns of an instance for each kind of data training reads (hetu.serve.encode says
what a column's keys mean), and the vocabulary an indexed dataset's values need."""
import os

import numpy as np

from ..data import criteo
from ..data.vocabulary import VOCABULARY_FILE
from ..data.movielens_side import BAG_FIELDS

# MovieLens: the fields training reads -> the raw column, as ML-1M's README names them.
MOVIELENS_COLUMNS = {"user": ("user_id", None), "item": ("movie_id", None), "gender": ("gender", None),
                     "age": ("age", "integer_text"), "occupation": ("occupation", None),
                     "zip": ("zip_code", "zip_prefix"), "year": ("title", "title_year"), "genres": ("genres", None)}


def categorical(name, field, derive=None, value="text"):
    column = {"name": name, "kind": "categorical", "field": field, "value": value}
    if derive:
        column["derive"] = derive
    return column


def bag(name, field, slots, separator="|", value="text"):
    return {"name": name, "kind": "bag", "field": field, "slots": int(slots), "separator": separator, "value": value}


def dense(name, output, transform, value="number"):
    return {"name": name, "kind": "dense", "output": output, "transform": transform, "value": value}


def criteo_columns():
    return ([dense(n, k, "log1p", "integer") for k, n in enumerate(criteo.DENSE_NAMES)] +
            [categorical(n, f) for f, n in enumerate(criteo.FIELD_NAMES)])


def movielens_columns(fields):
    columns = []
    for f, (name, slots) in enumerate(zip(fields.names, fields.slots)):
        raw, derive = MOVIELENS_COLUMNS[name]
        columns.append(bag(raw, f, slots) if name in BAG_FIELDS else categorical(raw, f, derive))
    return columns


def schema_columns(fmt):
    columns, dense_at = [], 0
    for c in fmt.columns:
        if c.role == "dense":
            columns.append(dense(c.name, dense_at, c.transform))
            dense_at += 1
        elif c.role == "categorical":
            columns.append(categorical(c.name, c.field))
        elif c.role == "bag":
            columns.append(bag(c.name, c.field, c.slots, c.separator))
    return columns


def synthetic_columns(info, fields):
    names = info.get("dense_names") or [f"I{k + 1}" for k in range(fields.num_dense)]
    return ([dense(n, k, "none") for k, n in enumerate(names)] +
            [bag(n, f, k, value="id") if n in fields.bags else categorical(n, f, value="id")
             for f, (n, k) in enumerate(zip(fields.names, fields.slots))])


def raw_columns(info, fmt, fields, where):
    """(columns, vocabulary arrays or None) of the data: `info` a dataset's meta.json, or `fmt`
    a stream's format (hetu.data.stream_formats)."""
    from ..data.stream_formats import CriteoFormat, MovieLensFormat, SchemaFormat
    if fmt is not None:
        if isinstance(fmt, CriteoFormat):
            return criteo_columns(), None
        if isinstance(fmt, MovieLensFormat):
            return movielens_columns(fields), None
        if isinstance(fmt, SchemaFormat):
            return schema_columns(fmt), None
        raise ValueError(f"{where}: a stream of format {type(fmt).__name__} has no raw columns")
    kind = info.get("source", {}).get("kind")
    hashed = info.get("ids") == "hashed"
    if kind == "synthetic":
        return synthetic_columns(info, fields), None
    if kind == "criteo":
        columns = criteo_columns()
    elif kind == "avazu":
        columns = [categorical(n, f) for f, n in enumerate(fields.names)]
    elif kind == "movielens":
        columns = movielens_columns(fields)
    else:
        raise ValueError(f"{where}: its data (source {kind!r}) has no known raw columns")
    if hashed:
        return columns, None
    folder = info.get("folder")
    path = os.path.join(folder, VOCABULARY_FILE) if folder else None
    if path is None or not os.path.exists(path):
        raise ValueError(f"{where}: its dataset folder {folder} keeps no vocabulary ({VOCABULARY_FILE}), which "
                         f"raw instances of indexed ids need: re-run python -m hetu.data.prepare {kind} for it")
    with np.load(path) as data:
        return columns, {k: data[k] for k in data.files}

