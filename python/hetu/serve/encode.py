"""Raw instances -> samples, exactly as training encoded them (docs/design.md, "Export").

An instance is a dict of raw columns (Criteo ``I1``..``I13``, ``C1``..``C26``; MovieLens
``user_id``, ``movie_id``, ``gender``, ``age``, ``occupation``, ``zip_code``, ``title``,
``genres``; a schema file's own names; a synthetic dataset's field names, whose values are the
field-local ids). The bundle's schema.json lists them as ``columns``, each with:

  kind       dense (a number; ``transform`` log1p of max(x, 0), or none; null or "" is 0),
             categorical (one value), bag (``separator``-joined text or a JSON list, at most
             ``slots`` values)
  field      the categorical field it fills (its position in ``fields``)
  value      text (a string; an integer is taken as its decimal text; null is the empty
             value), integer (dense: an integer or its text) or id (synthetic: a field-local id)
  derive     what training derived from the raw text: zip_prefix (the zip code's first
             character, upper case), title_year (the title's "(YYYY)", else "unknown"; an
             instance's ``release_date`` like 01-Jan-1995, MovieLens 100K's, takes precedence),
             integer_text (the number's decimal text)

and the ids are the hashed keys (hetu.data.keys: xxh64 of the field index and the value's bytes)
or, for indexed data, the ids prepare numbered the values by (its vocabulary.npz,
hetu.data.vocabulary; a value not in it takes the field's bucket 0 for missing and rare values,
or is an error where the field has none)."""
import math

import numpy as np

from ..data.keys import hash_ids, hash_values
from ..data.movielens_side import RELEASE_DATE, TITLE_YEAR, UNKNOWN_YEAR, ZIP_PREFIX_LENGTH
from ..data.store import BAG_PADDING
from ..data.tabular import dense_transform

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1   # plain ints: np.iinfo's are properties
UNSEEN = "vocabulary"   # where an unknown id was found: a value outside the vocabulary (else a dynamic table's name)


class InstanceError(ValueError):
    """A raw instance the model cannot read; the message is one line naming the instance's
    index, the column and what is wrong."""


def _bad(i, column, what):
    return InstanceError(f"instance {i}: column {column!r}: {what}")


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _integer(value):
    """A large integer's text for a message (one of thousands of digits by its size)."""
    return str(value) if value.bit_length() <= 256 else f"an integer of {value.bit_length()} bits"


def dense_value(i, column, value, integer):
    """The raw number of a dense column (null or "" is 0)."""
    if value is None or value == "":
        return 0.0
    if isinstance(value, str):
        try:
            value = int(value) if integer else float(value)
        except ValueError:
            raise _bad(i, column, f"expected {'an integer' if integer else 'a number'}, found {value!r}") from None
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(i, column, f"expected a number, found {type(value).__name__} {value!r}")
    elif integer and not _is_int(value):
        raise _bad(i, column, f"expected an integer, found {value!r}")
    try:
        value = float(value)
    except OverflowError:   # an integer beyond a double's range
        raise _bad(i, column, f"expected a finite number, found {_integer(value)}") from None
    if not math.isfinite(value):
        raise _bad(i, column, f"expected a finite number, found {value!r}")
    return value


def dense_values(column, values, integer):
    """float64 [n]: dense_value of each of a column's `values`. A column of plain numbers (the
    usual request) is converted at once; anything else, or a number a double cannot hold, goes
    value by value, which names the first bad one."""
    if set(map(type, values)) <= ({int} if integer else {int, float}):   # bool is not int here
        try:
            converted = np.array(values, np.float64)
        except OverflowError:
            converted = None
        if converted is not None and np.isfinite(converted).all():
            return converted
    return np.array([dense_value(i, column, v, integer) for i, v in enumerate(values)], np.float64)


def text_value(i, column, value):
    """A categorical value's text: a string as it is, an integer as its decimal text, null as ""."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if _is_int(value):
        return str(value)
    raise _bad(i, column, f"expected a string or an integer, found {type(value).__name__} {value!r}")


def id_value(i, column, value):
    """A field-local id (an integer or its text), within int64."""
    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            value = None
    if _is_int(value):
        if not INT64_MIN <= value <= INT64_MAX:
            raise _bad(i, column, f"id {_integer(value)} is outside int64")
        return value
    raise _bad(i, column, f"expected a field-local id (an integer), found {value!r}")


def id_values(column, values, owners):
    """int64 [n]: id_value of each of a column's `values` (each from instance owners[k]). Plain
    integers (the usual request) are converted at once; anything else, or one outside int64, goes
    value by value, which names the first bad one."""
    if set(map(type, values)) <= {int}:
        try:
            return np.array(values, np.int64)
        except OverflowError:
            pass
    return np.array([id_value(i, column, v) for i, v in zip(owners, values)], np.int64)


def derived(i, column, derive, text, instance):
    if derive is None:
        return text
    if derive == "zip_prefix":
        return text[:ZIP_PREFIX_LENGTH].upper()
    if derive == "integer_text":
        if not text.strip().isdigit():
            raise _bad(i, column, f"expected a whole number, found {text!r}")
        return str(int(text))
    if derive == "title_year":
        release = instance.get("release_date")
        if release:
            date = RELEASE_DATE.fullmatch(str(release))
            if not date:
                raise _bad(i, "release_date", f"expected a date like 01-Jan-1995, found {release!r}")
            return date.group(1)
        year = TITLE_YEAR.search(text)
        return year.group(1) if year else UNKNOWN_YEAR
    raise ValueError(f"column {column}: unknown derivation {derive!r}")


class Vocabulary:
    """Indexed data's value -> id maps, per field (hetu.data.vocabulary: vocabulary.npz)."""

    def __init__(self, arrays):
        def per_field(kind):
            return {int(k.split("/")[1]): arrays[k] for k in arrays if k.startswith(kind + "/")}
        self.keys, self.ids = per_field("keys"), per_field("ids")
        self.missing = {f: int(v) for f, v in per_field("missing").items()}

    def lookup(self, field, values, column, indices, unknown=None):
        """Global ids of `values` (texts) of `field`; `indices` the instances they come from; the
        values not in the vocabulary (bucket 0's) counted into `unknown` (a Counter) under
        (column, "vocabulary")."""
        known = self.keys[field]   # ascending
        wanted = hash_values(field, values)
        at = np.minimum(np.searchsorted(known, wanted), max(len(known) - 1, 0))
        found = known[at] == wanted if len(known) else np.zeros(len(wanted), bool)
        ids = self.ids[field][at] if len(known) else np.zeros(len(wanted), np.int64)
        if not found.all():
            if field not in self.missing:
                j = int(np.flatnonzero(~found)[0])
                raise _bad(indices[j], column, f"{values[j]!r} is not a value training saw (this field has no bucket "
                                               f"for unseen values)")
            ids = np.where(found, ids, self.missing[field])
            if unknown is not None:
                unknown[column, UNSEEN] += len(found) - int(np.count_nonzero(found))
        return ids.astype(np.int64)


class InstanceEncoder:
    """schema.json's columns and fields -> (dense float32 [n, D] or None, ids int64 [n, slots])."""

    def __init__(self, schema, vocabulary=None):
        self.columns = schema["columns"]
        self.hashed = schema["ids"] == "hashed"
        self.slot_offsets = np.concatenate([[0], np.cumsum([f["slots"] for f in schema["fields"]])]).astype(int)
        self.field_info = schema["fields"]
        self.num_dense = int(schema["num_dense"])
        self.vocabulary = vocabulary

    def encode(self, instances, unknown=None):
        """`unknown`: a Counter that counts the values outside the vocabulary, per (column, "vocabulary")."""
        n = len(instances)
        for i, instance in enumerate(instances):
            if not isinstance(instance, dict):
                raise InstanceError(f"instance {i}: expected an object of columns, found {type(instance).__name__}")
        dense = np.zeros((n, self.num_dense), np.float32) if self.num_dense else None
        sparse = np.full((n, int(self.slot_offsets[-1])), BAG_PADDING, np.int64)
        for column in self.columns:
            name = column["name"]
            try:
                raw = [instance[name] for instance in instances]
            except KeyError:
                raise _bad(next(i for i, x in enumerate(instances) if name not in x), name, "missing") from None
            if column["kind"] == "dense":
                values = dense_values(name, raw, column.get("value") == "integer")
                dense[:, column["output"]] = dense_transform(values) if column.get("transform") == "log1p" \
                    else values.astype(np.float32)
            elif column["kind"] == "categorical":
                sparse[:, self.slot_offsets[column["field"]]] = self.ids(column, raw, list(range(n)), instances,
                                                                               unknown)
            else:
                self.encode_bags(column, raw, instances, sparse, unknown)
        return dense, sparse

    def encode_bags(self, column, raw, instances, sparse, unknown=None):
        name, slots = column["name"], int(column["slots"])
        flat, owners, positions = [], [], []
        for i, value in enumerate(raw):
            if isinstance(value, str):
                bag = value.split(column["separator"]) if value else []
            elif isinstance(value, list):
                bag = value
            elif value is None:
                bag = []
            else:
                raise _bad(i, name, f"expected {column['separator']!r}-separated text or a list, found "
                                    f"{type(value).__name__} {value!r}")
            if len(bag) > slots:
                raise _bad(i, name, f"{len(bag)} values, more than its {slots} slots")
            if any(v == "" for v in bag):
                raise _bad(i, name, f"an empty value in the bag {value!r}")
            flat += bag
            owners += [i] * len(bag)
            positions += range(len(bag))
        if flat:
            ids = self.ids(column, flat, owners, instances, unknown)
            start = self.slot_offsets[column["field"]]
            sparse[np.asarray(owners), start + np.asarray(positions)] = ids

    def ids(self, column, values, owners, instances, unknown=None):
        """The ids of one column's `values` (each from instance owners[k])."""
        name, field = column["name"], int(column["field"])
        if column.get("value") == "id":
            local = id_values(name, values, owners)
            if self.hashed:
                return hash_ids(field, local)
            size = int(self.field_info[field]["size"])
            bad = np.flatnonzero((local < 0) | (local >= size))
            if len(bad):
                raise _bad(owners[bad[0]], name, f"id {local[bad[0]]} outside the field's {size} ids")
            return local + int(self.field_info[field]["offset"])
        texts = [derived(i, name, column.get("derive"), text_value(i, name, v), instances[i])
                 for i, v in zip(owners, values)]
        if self.hashed:
            return hash_values(field, texts)
        return self.vocabulary.lookup(field, texts, name, owners, unknown)
