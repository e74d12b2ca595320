"""MovieLens ratings -> (user, item) fields with a click-style label, optionally followed by the
side features of the users and items files (gender, age, occupation, zip; year, and the genres
as one bag field: see movielens_side.py).

Accepted files (format picked from the first line):
  * ``u.data`` (ml-100k): ``user<TAB>item<TAB>rating<TAB>timestamp``, no header;
  * ``ratings.dat`` (ml-1m, ml-10m): ``user::item::rating::timestamp``, no header;
  * ``ratings.csv`` (ml-20m, ml-25m, ml-latest): header ``userId,movieId,rating,timestamp``.

Users and items are re-numbered densely from 0 in ascending order of their raw ids (user field
first, items offset by the number of users). Side fields follow in the order gender, age,
occupation, zip, year, genres, each numbered the same way over the values of the rated users and
items, with its field offset; the genres bag takes as many columns as the most genres an item has. Rows are shuffled by default; with
``time_order=True`` they are sorted by timestamp instead (ties in file order), the order in
which the ratings were given, so that training reads them the way a click log is read, and the
validation split is the latest ratings. Label: by default binary, 1.0 when
rating >= ``threshold`` (4.0), the usual implicit-feedback reading of explicit ratings; with
``label="rating"`` the raw rating itself (float32). The raw ratings are kept in ``ratings.npy``
either way, so the other label can be derived without re-reading the source.
"""
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

from .. import store, vocabulary
from ..keys import check_ids, hash_values
from .movielens_side import (BAG_FIELDS, UNKNOWN_YEAR, ZIP_PREFIX_LENGTH, check_described,
                             encode_side_features, read_items, read_users)
from .tabular import permute_into_place, shuffle_into_place
from .textio import (BadLine, BadLineTracker, DataFormatError, column_count_problem,
                     count_lines, iter_line_chunks, parse_float_column, parse_int_column,
                     require_input_file, split_lines)

CSV_HEADER = ("userId", "movieId", "rating", "timestamp")
FIELD_NAMES = ("user", "item")
NUM_COLUMNS = 4
LABEL_KINDS = ("binary", "rating")
RATINGS_FILE = "ratings.npy"


def detect_format(path):
    """(delimiter, header lines) of a ratings file, from its first line."""
    with open(path, "r", encoding="utf-8", errors="replace") as f:
        return detect_line_format(f.readline(), path)


def detect_line_format(first, path):
    """(delimiter, header lines) of a ratings file whose first line is ``first``."""
    first = first.rstrip("\r\n")
    if first.split(",")[:2] == list(CSV_HEADER[:2]):
        return ",", 1
    if "::" in first:
        return "::", 0
    if "\t" in first:
        return "\t", 0
    if "," in first:
        return ",", 0
    raise DataFormatError(f"{path}:1: not a MovieLens ratings line (expected tab, '::' or "
                          f"comma separated user, item, rating, timestamp): {first[:200]!r}")


def parse_ratings_chunk(path, first_line_number, lines, delimiter, tracker):
    """(users int64, items int64, ratings float64, timestamps int64, line numbers int64) of the
    good lines of one chunk."""
    rows = split_lines(lines, delimiter)
    problems = {}
    for i, fields in enumerate(rows):
        problem = column_count_problem(fields, NUM_COLUMNS, lines[i])
        if problem:
            problems[i] = BadLine(str(path), first_line_number + i, 0, problem)
    while True:
        candidates = [i for i in range(len(rows)) if i not in problems]
        columns = list(zip(*(rows[i] for i in candidates))) if candidates else [()] * NUM_COLUMNS
        found = {}
        users, bad_users = parse_int_column(columns[0], allow_empty=False)
        items, bad_items = parse_int_column(columns[1], allow_empty=False)
        ratings, bad_ratings = parse_float_column(columns[2])
        timestamps, bad_timestamps = parse_int_column(columns[3], allow_empty=False)
        for column, bad in ((1, bad_users), (2, bad_items), (3, bad_ratings), (4, bad_timestamps)):
            for j in bad:
                found.setdefault(candidates[j], BadLine(
                    str(path), first_line_number + candidates[j], column,
                    f"expected a number, found {columns[column - 1][j]!r}"))
        if ratings is not None:
            for j in np.flatnonzero(~((ratings > 0) & (ratings <= 10))):
                found.setdefault(candidates[j], BadLine(
                    str(path), first_line_number + candidates[j], 3,
                    f"rating out of range (0, 10]: {columns[2][j]!r}"))
        if not found:
            break
        problems.update(found)
    for i in sorted(problems):
        tracker.report(problems[i])
    line_numbers = first_line_number + np.asarray(candidates, dtype=np.int64)
    return users, items, ratings, timestamps, line_numbers


def iter_ratings(path, tracker, chunk_lines, progress, description):
    delimiter, skip = detect_format(path)
    total = count_lines(path) - skip if progress else None
    with tqdm(total=total, unit="line", desc=description, disable=not progress,
              file=sys.stderr, mininterval=1.0) as bar:
        for first_line, lines in iter_line_chunks(path, chunk_lines, skip_lines=skip):
            parsed = parse_ratings_chunk(path, first_line, lines, delimiter, tracker)
            bar.update(len(lines))
            if len(parsed[0]):
                yield parsed


class FieldLayout:
    """The fields of the output (user, item, then the side tables' fields) and the encoding of
    a chunk of ratings into their sparse.npy columns."""

    def __init__(self, user_ids, item_ids, side_tables, hashed=False):
        self.user_ids, self.item_ids, self.hashed = user_ids, item_ids, hashed
        self.field_names = list(FIELD_NAMES)
        self.field_sizes = [len(user_ids), len(item_ids)]
        self.field_slots = [1, 1]
        self.field_values = {}
        # each raw user's and item's id: its global id, or its key (the decimal text hashed)
        if hashed:
            self.user_column = hash_values(0, [str(u) for u in user_ids])
            self.item_column = hash_values(1, [str(i) for i in item_ids])
        else:
            self.user_column = np.arange(len(user_ids), dtype=np.int64)
            self.item_column = np.arange(len(item_ids), dtype=np.int64) + len(user_ids)
        self.side_blocks = []   # (table kind, local ids [raw ids, slots]), in column order
        for table in side_tables:
            first_field = len(self.field_names) if hashed else None
            fields, local = encode_side_features(table, user_ids if table.kind == "user"
                                                 else item_ids, first_field)
            for field in fields:
                self.field_names.append(field.name)
                self.field_sizes.append(len(field.values))
                self.field_slots.append(field.slots)
                self.field_values[field.name] = field.values
            self.side_blocks.append((table.kind, local))
        self.bag_fields = [name for name in self.field_names if name in BAG_FIELDS]
        self.num_slots = sum(self.field_slots)
        if hashed:
            return
        # global ids: local id + its field's offset, in every column but a bag's padding
        column_offsets = np.repeat(store.field_offsets(self.field_sizes), self.field_slots)
        column = 2
        for _, local in self.side_blocks:
            width = local.shape[1]
            local += np.where(local != store.BAG_PADDING, column_offsets[column:column + width], 0)
            column += width

    def encode(self, users, items):
        """[n, num_slots] global ids of n ratings."""
        rows = {"user": np.searchsorted(self.user_ids, users),
                "item": np.searchsorted(self.item_ids, items)}
        blocks = [self.user_column[rows["user"]][:, None], self.item_column[rows["item"]][:, None]]
        blocks += [block[rows[kind]] for kind, block in self.side_blocks]
        return np.hstack(blocks)

    def vocabulary(self):
        """Indexed ids: each field's values (users and items by their decimal text) and their
        global ids (vocabulary.py); MovieLens numbers every value, so no field has a bucket."""
        offsets = store.field_offsets(self.field_sizes)
        texts = [[str(u) for u in self.user_ids], [str(i) for i in self.item_ids]]
        texts += [list(self.field_values[name]) for name in self.field_names[2:]]
        arrays = {}
        for f, values in enumerate(texts):
            arrays.update(vocabulary.field_arrays(f, values, offsets[f] + np.arange(len(values))))
        return arrays

    def side_meta(self):
        """meta.json keys describing the side fields (none without side files)."""
        if not self.side_blocks:
            return {}
        order = {} if self.hashed else {
            "local_id_order": "ascending raw value: numbers by value, then text"}
        return {"side_features": {
            "field_values": self.field_values, **order,
            "zip": f"the zip code's first {ZIP_PREFIX_LENGTH} character(s)",
            "year": f"100K: release date's year; 1M: the title's (YYYY); else {UNKNOWN_YEAR!r}",
        }}


def make_labels(ratings, label, threshold):
    if label == "binary":
        return (ratings >= threshold).astype(np.float32)
    return ratings.astype(np.float32)


def prepare_movielens(input_path, output_dir, *, label="binary", threshold=4.0,
                      skip_bad_lines=False, val_fraction=0.1, shuffle_seed=0, time_order=False,
                      users_path=None, items_path=None, overwrite=False, progress=True,
                      chunk_lines=500_000, log=None, ids="indexed"):
    """Encode a MovieLens ratings file into a dataset folder (two passes: distinct ids, encode).

    Ratings files are sorted by user (or time), so rows are shuffled with ``shuffle_seed`` by
    default before the contiguous train/validation split; pass ``shuffle_seed=None`` to keep
    file order, or ``time_order=True`` (with ``shuffle_seed=None``) to sort them by timestamp.
    ``users_path`` (u.user, users.dat) and ``items_path`` (u.item, movies.dat) add their side
    fields; every rated user or item must be in them (else an error names the rating's line).
    ``ids="hashed"``: each value's key (keys.py): users and items by their decimal text, the side
    fields' values by their text, each genre of the bag by its name."""
    log = log if log is not None else sys.stderr
    if label not in LABEL_KINDS:
        raise ValueError(f"label must be one of {LABEL_KINDS}, got {label!r}")
    hashed = check_ids(ids) == "hashed"
    if time_order and shuffle_seed is not None:
        raise ValueError(f"time order and a shuffle (seed {shuffle_seed}) exclude each other")
    order = "time" if time_order else "file" if shuffle_seed is None else "shuffled"
    path = require_input_file(input_path)
    side_tables = ([read_users(users_path)] if users_path is not None else []) + \
        ([read_items(items_path)] if items_path is not None else [])
    tracker = BadLineTracker(skip_bad_lines, stream=log)
    user_ids = np.empty(0, dtype=np.int64)
    item_ids = np.empty(0, dtype=np.int64)
    num_rows = 0
    for users, items, _, _, line_numbers in iter_ratings(path, tracker, chunk_lines, progress,
                                                         "movielens pass 1/2 (ids)"):
        for table in side_tables:
            check_described(table, path, users if table.kind == "user" else items, line_numbers)
        user_ids = np.union1d(user_ids, users)
        item_ids = np.union1d(item_ids, items)
        num_rows += len(users)
    if num_rows == 0:
        raise DataFormatError(f"{path}: no usable rows")
    layout = FieldLayout(user_ids, item_ids, side_tables, hashed)
    train_rows, val_rows = store.contiguous_split(num_rows, val_fraction)

    with store.atomic_directory(output_dir, overwrite=overwrite) as tmp_dir:
        names = ("dense", "sparse", "labels", "ratings")
        suffix = ".npy" if order == "file" else ".unshuffled.npy"
        files = [name + suffix for name in names]
        dense = store.create_array(tmp_dir, files[0], np.float32, (num_rows, 0))
        sparse = store.create_array(tmp_dir, files[1], np.int64, (num_rows, layout.num_slots))
        labels = store.create_array(tmp_dir, files[2], np.float32, (num_rows, 1))
        raw_ratings = store.create_array(tmp_dir, files[3], np.float32, (num_rows, 1))
        timestamps = np.empty(num_rows, dtype=np.int64) if order == "time" else None
        start = 0
        quiet = BadLineTracker(skip_bad_lines=True, max_reported=0)
        for users, items, ratings, times, _ in iter_ratings(path, quiet, chunk_lines, progress,
                                                            "movielens pass 2/2 (encode)"):
            stop = start + len(users)
            if timestamps is not None:
                timestamps[start:stop] = times
            sparse[start:stop] = layout.encode(users, items)
            labels[start:stop, 0] = make_labels(ratings, label, threshold)
            raw_ratings[start:stop, 0] = ratings
            start = stop
        store.flush_arrays(dense, sparse, labels, raw_ratings)
        if not hashed:
            vocabulary.write(tmp_dir, layout.vocabulary())
        if order == "shuffled":
            shuffle_into_place(tmp_dir, [dense, sparse, labels, raw_ratings], files,
                               shuffle_seed)
        elif order == "time":
            permute_into_place(tmp_dir, [dense, sparse, labels, raw_ratings], files,
                               np.argsort(timestamps, kind="stable"))
        source = {"kind": "movielens", "path": str(path.resolve()), "order": order,
                  "skip_bad_lines": bool(skip_bad_lines), "bad_lines_skipped": tracker.skipped,
                  "truncated": tracker.truncated}
        source.update({f"{table.kind}s_path": str(table.path.resolve()) for table in side_tables})
        label_meta = ({"kind": "binary", "rule": "rating >= threshold", "threshold": threshold, "values": [0.0, 1.0]}
                      if label == "binary" else {"kind": "rating"})
        store.write_meta(tmp_dir, store.dataset_meta(
            "movielens", num_rows, 0, layout.field_names, layout.field_sizes, train_rows,
            val_rows, val_fraction, shuffle_seed, source, label=label_meta,
            field_slots=layout.field_slots, bag_fields=layout.bag_fields,
            extra_files={RATINGS_FILE: "raw rating, float32 [N, 1]",
                         **({} if hashed else {vocabulary.VOCABULARY_FILE: "each field's values' keys -> ids"})},
            raw_id_ranges={"user": [int(user_ids[0]), int(user_ids[-1])],
                           "item": [int(item_ids[0]), int(item_ids[-1])]},
            ids=ids, **layout.side_meta()))
    summary = tracker.summary(path)
    if summary:
        print(summary, file=log)
    return Path(output_dir)
