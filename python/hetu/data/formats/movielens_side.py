"""MovieLens side features: the users file and the items file, in either format (told apart by
the first line; both read as latin-1, the encoding of GroupLens' titles):

  * 100K ``u.user``: ``user id|age|gender|occupation|zip code``;
    ``u.item``: ``movie id|title|release date|video release date|IMDb URL|`` then 19 genre
    flags (0/1) in the order of ``u.genre`` (``GENRES_100K``);
  * 1M ``users.dat``: ``UserID::Gender::Age::Occupation::Zip-code`` (age and occupation are
    codes); ``movies.dat``: ``MovieID::Title (Year)::Genre1|Genre2|...``.

Fields: from the users file gender, age (the value as given: 100K's age in years, 1M's age
bucket), occupation (100K's name, 1M's code) and zip (the zip code's first character: the US
national area 0-9, or a non-US code's first letter); from the items file year (100K: the release
date's year, 1M: the title's "(YYYY)"; ``UNKNOWN_YEAR`` where there is none) and genres, a bag
of the item's genres (both formats use the same genre names).
"""
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..keys import hash_values
from ..store import BAG_PADDING
from .textio import BadLine, DataFormatError, require_input_file

GENRES_100K = ("unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime",
               "Documentary", "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery",
               "Romance", "Sci-Fi", "Thriller", "War", "Western")
USER_FIELDS = ("gender", "age", "occupation", "zip")
ITEM_FIELDS = ("year", "genres")
BAG_FIELDS = ("genres",)
GENDERS = ("F", "M")
ZIP_PREFIX_LENGTH = 1
UNKNOWN_YEAR = "unknown"
RELEASE_DATE = re.compile(r"\d{1,2}-[A-Za-z]{3}-(\d{4})")   # 100K: 01-Jan-1995
TITLE_YEAR = re.compile(r"\((\d{4})\)\s*$")                  # 1M: Toy Story (1995)
SIDE_FILE_ENCODING = "latin-1"


@dataclass
class SideTable:
    """The side features of one file: per raw id, one value per field (a tuple for a bag)."""
    path: Path
    kind: str             # "user" or "item"
    field_names: tuple
    records: dict         # raw id -> tuple of values, in field_names order

    def raw_ids(self):
        return np.fromiter(self.records, dtype=np.int64, count=len(self.records))


def side_lines(path):
    """(line number, fields, delimiter) of each non-empty line, the delimiter ('|' for 100K,
    '::' for 1M) taken from the first line."""
    delimiter = None
    with open(path, "r", encoding=SIDE_FILE_ENCODING, newline=None) as f:
        for number, line in enumerate(f, start=1):
            line = line.rstrip("\n")
            if not line:
                continue
            if delimiter is None:
                delimiter = "::" if "::" in line else "|" if "|" in line else None
                if delimiter is None:
                    raise DataFormatError(f"{path}:{number}: neither a 100K ('|' separated) nor "
                                          f"a 1M ('::' separated) MovieLens line: {line[:200]!r}")
            yield number, line.split(delimiter), delimiter


def bad_line(path, number, column, reason):
    return DataFormatError(BadLine(str(path), number, column, reason).describe())


def parse_raw_id(path, number, text, kind, records, first_line):
    try:
        raw_id = int(text)
    except ValueError:
        raise bad_line(path, number, 1, f"expected a {kind} id, found {text!r}") from None
    if raw_id in records:
        raise bad_line(path, number, 1,
                       f"{kind} {raw_id} is already described on line {first_line[raw_id]}")
    first_line[raw_id] = number
    return raw_id


def read_users(path):
    """The users file (u.user or users.dat) as a SideTable of gender, age, occupation, zip."""
    path = require_input_file(path)
    records, first_line = {}, {}
    for number, columns, delimiter in side_lines(path):
        if len(columns) != 5:
            raise bad_line(path, number, 0, f"expected 5 {delimiter!r}-separated columns "
                                             f"(a user's id, gender, age, occupation and zip), "
                                             f"found {len(columns)}")
        if delimiter == "|":
            raw, age, gender, occupation, zip_code = columns
            age_column, gender_column = 2, 3
        else:
            raw, gender, age, occupation, zip_code = columns
            age_column, gender_column = 3, 2
        raw_id = parse_raw_id(path, number, raw, "user", records, first_line)
        if gender not in GENDERS:
            raise bad_line(path, number, gender_column, f"gender must be F or M, found {gender!r}")
        if not age.isdigit():
            raise bad_line(path, number, age_column, f"expected an age, found {age!r}")
        for column, what, value in ((4, "occupation", occupation), (5, "zip code", zip_code)):
            if not value:
                raise bad_line(path, number, column, f"empty {what}")
        records[raw_id] = (gender, str(int(age)), occupation, zip_code[:ZIP_PREFIX_LENGTH].upper())
    return SideTable(path, "user", USER_FIELDS, records)


def read_items(path):
    """The items file (u.item or movies.dat) as a SideTable of year and genres (a tuple)."""
    path = require_input_file(path)
    records, first_line = {}, {}
    for number, columns, delimiter in side_lines(path):
        expected = 5 + len(GENRES_100K) if delimiter == "|" else 3
        if len(columns) != expected:
            raise bad_line(path, number, 0, f"expected {expected} {delimiter!r}-separated "
                                             f"columns, found {len(columns)}")
        raw_id = parse_raw_id(path, number, columns[0], "item", records, first_line)
        if delimiter == "|":
            year, genres = items_100k_features(path, number, columns)
        else:
            year, genres = items_1m_features(path, number, columns)
        records[raw_id] = (year, genres)
    return SideTable(path, "item", ITEM_FIELDS, records)


def items_100k_features(path, number, columns):
    release_date, flags = columns[2], columns[5:]
    date = RELEASE_DATE.fullmatch(release_date)
    if release_date and not date:
        raise bad_line(path, number, 3, f"expected a release date like 01-Jan-1995, "
                                        f"found {release_date!r}")
    for g, flag in enumerate(flags):
        if flag not in ("0", "1"):
            raise bad_line(path, number, 6 + g, f"genre flag ({GENRES_100K[g]}) must be 0 or 1, "
                                                f"found {flag!r}")
    genres = tuple(name for name, flag in zip(GENRES_100K, flags) if flag == "1")
    return (date.group(1) if date else UNKNOWN_YEAR), genres


def items_1m_features(path, number, columns):
    title, genre_list = columns[1], columns[2]
    year = TITLE_YEAR.search(title)
    genres = tuple(genre_list.split("|")) if genre_list else ()
    if "" in genres:
        raise bad_line(path, number, 3, f"empty genre name in {genre_list!r}")
    return (year.group(1) if year else UNKNOWN_YEAR), genres


def value_order(value):
    """Local ids follow ascending raw values, as users and items do: numbers by value, then text
    (so an unknown year comes after every year)."""
    return (0, int(value), "") if value.isdigit() else (1, 0, value)


@dataclass
class SideField:
    name: str
    values: list      # raw values in local id order
    slots: int        # sparse.npy columns: 1, or the largest bag


def encode_side_features(table, raw_ids, first_field=None):
    """(fields, local ids int64 [len(raw_ids), sum of slots]) of the given raw ids, all of
    which the table describes. A bag's ids are left-aligned in its slots, the rest BAG_PADDING.
    Only the values of these ids are numbered, so every id of a field is used. With
    ``first_field`` (hashed ids), each value's key (keys.py) instead of its local id, the table's
    fields being fields first_field, first_field + 1, ... of the dataset."""
    records = [table.records[int(raw_id)] for raw_id in raw_ids]
    fields, blocks = [], []
    for f, name in enumerate(table.field_names):
        column = [record[f] for record in records]
        bags = column if name in BAG_FIELDS else [(value,) for value in column]
        values = sorted({value for bag in bags for value in bag}, key=value_order)
        ids = range(len(values)) if first_field is None else hash_values(first_field + f, values)
        local_id = dict(zip(values, ids))
        slots = max([1] + [len(bag) for bag in bags])
        local = np.full((len(bags), slots), BAG_PADDING, dtype=np.int64)
        for row, bag in enumerate(bags):
            local[row, :len(bag)] = [local_id[value] for value in bag]
        fields.append(SideField(name, values, slots))
        blocks.append(local)
    return fields, np.hstack(blocks)


def check_described(table, ratings_path, raw_ids, line_numbers):
    """Raises DataFormatError naming the ratings file and line of the first of ``raw_ids``
    (read on ``line_numbers``) that the side file does not describe."""
    missing = np.flatnonzero(~np.isin(raw_ids, table.raw_ids()))
    if len(missing):
        first = missing[0]
        raise DataFormatError(f"{ratings_path}:{line_numbers[first]}: {table.kind} "
                              f"{raw_ids[first]} is not in {table.path}")
