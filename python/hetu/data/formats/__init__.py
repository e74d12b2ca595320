"""The formats of raw data hetu reads, in one registry (docs/design.md section 9).

Each entry of ``FORMATS`` names how ``python -m hetu.data.prepare NAME`` prepares the format into
a dataset folder (its command's flags and the call that writes the folder) and how a stream
(``StreamSource(DIR, SPEC)``, ``--stream-format SPEC``) parses it; ``lookup`` is the one place a
name is resolved, for both. A format described by a schema file is named ``NAME:FILE`` as a
stream (``schema:FILE``, ``parquet:FILE``) and takes ``--schema FILE`` as a prepare command.

    criteo     Criteo Kaggle train.txt                  prepare, stream
    avazu      Avazu train CSV                          prepare
    movielens  MovieLens ratings (+ users, items files) prepare, stream
    schema     any delimited text log, by a schema file prepare, stream
    parquet    Parquet files, by the same schema file   prepare, stream

Adding a format: a module here that reads it (for prepare, a function writing the dataset folder;
for a stream, a parser as in streams.py, or one reading whole files as parquet.py's), and an entry
below: its flags (``add_arguments``), ``prepare(args, progress)`` and ``stream(argument, users,
items)``.
"""
from dataclasses import dataclass
from typing import Callable

from ..keys import HASH_NAME, ID_KINDS
from . import samples
from .avazu import prepare_avazu
from .criteo import prepare_criteo
from .movielens import prepare_movielens

MOVIELENS_SHUFFLE_SEED = 0   # ratings files are sorted by user or time: shuffled unless asked
USES = ("prepare", "stream")


@dataclass(frozen=True)
class Format:
    """A format: ``add_arguments(parser)`` and ``prepare(args, progress)`` -> the folder written,
    for ``python -m hetu.data.prepare NAME``; ``stream(argument, users, items)`` -> a stream's
    parser. ``argument``: what the stream name takes after a colon (``schema:FILE``), if anything.
    ``side_files``: whether a stream takes MovieLens's users and items files."""
    name: str
    help: str
    add_arguments: Callable = None
    prepare: Callable = None
    stream: Callable = None
    argument: str = None
    side_files: bool = False

    def spelled(self):
        return f"{self.name}:{self.argument}" if self.argument else self.name


def add_common(parser, shuffle_default, ids=ID_KINDS, input_help="raw file to read", lines=True):
    """The flags every format's prepare takes (``lines``: --skip-bad-lines, for text)."""
    parser.add_argument("--input", required=True, help=input_help)
    parser.add_argument("--output", required=True, help="dataset folder to create")
    if lines:
        parser.add_argument("--skip-bad-lines", action="store_true",
                            help="skip malformed lines (counted at the end) instead of stopping")
    parser.add_argument("--val-fraction", type=float, default=0.1,
                        help="last fraction of rows used for validation (default 0.1)")
    # The default is applied in run_movielens(), so that a seed given next to --time-order is seen.
    parser.add_argument("--shuffle-seed", type=int, default=None,
                        help="shuffle rows with this seed before the split "
                             f"(default {shuffle_default}: "
                             f"{'keep file order' if shuffle_default is None else 'shuffled'})")
    parser.add_argument("--force", action="store_true", help="replace an existing output")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_ids(parser, ids)


def add_ids(parser, kinds=ID_KINDS):
    if kinds == ("hashed",):
        parser.add_argument("--ids", choices=kinds, default="hashed",
                            help=f"each value's 64-bit key, {HASH_NAME} (hetu.data.keys), as the "
                                 "format's stream gives; no vocabulary, for dynamic tables")
        return
    parser.add_argument("--ids", choices=kinds, default="indexed",
                        help="indexed: each field's values numbered by a vocabulary pass, with "
                             "field offsets (default); hashed: each value's 64-bit key, "
                             f"{HASH_NAME} (hetu.data.keys), no vocabulary, for dynamic tables")


def add_click_log(parser):
    add_common(parser, shuffle_default=None)
    parser.add_argument("--rows", type=int, default=None, help="use only the first N good rows")
    parser.add_argument("--min-count", type=int, default=1,
                        help="values seen fewer times share the field's rare/missing id 0")


def click_log(prepare):
    def run(args, progress):
        return prepare(args.input, args.output, rows=args.rows, min_count=args.min_count,
                       skip_bad_lines=args.skip_bad_lines, val_fraction=args.val_fraction,
                       shuffle_seed=args.shuffle_seed, overwrite=args.force, progress=progress,
                       ids=args.ids)
    return run


def add_movielens(parser):
    from ..sequences import DEFAULT_MAX_LENGTH   # here: hetu.data.sequences reads MovieLens through this package
    add_common(parser, shuffle_default=MOVIELENS_SHUFFLE_SEED)
    parser.add_argument("--label", choices=("binary", "rating"), default="binary",
                        help="binary: 1 when rating >= --threshold (default); rating: raw")
    parser.add_argument("--threshold", type=float, default=4.0)
    parser.add_argument("--time-order", action="store_true",
                        help="sort the ratings by timestamp instead of shuffling them: "
                             "training reads them in the order they were given, and the "
                             "validation split is the latest")
    parser.add_argument("--users", default=None,
                        help="users file (u.user or users.dat): adds gender, age, "
                             "occupation and zip fields")
    parser.add_argument("--items", default=None,
                        help="items file (u.item or movies.dat): adds the year field and "
                             "the genres bag field")
    parser.add_argument("--sequences", action="store_true",
                        help="write user histories for sequential models (hetu.data.sequences): "
                             "each user's items in time order, the last one held out; --input may "
                             "be a folder holding u.data or ratings.dat")
    parser.add_argument("--max-length", type=int, default=None, metavar="L",
                        help=f"with --sequences: the longest history kept (default {DEFAULT_MAX_LENGTH})")


def run_movielens(args, progress):
    if args.sequences or args.max_length is not None:
        return movielens_sequences(args, progress)
    # prepare_movielens refuses a seed given with --time-order
    shuffle_seed = args.shuffle_seed if args.shuffle_seed is not None \
        else None if args.time_order else MOVIELENS_SHUFFLE_SEED
    return prepare_movielens(args.input, args.output, label=args.label,
                             threshold=args.threshold, skip_bad_lines=args.skip_bad_lines,
                             val_fraction=args.val_fraction, shuffle_seed=shuffle_seed,
                             time_order=args.time_order, users_path=args.users,
                             items_path=args.items, overwrite=args.force, progress=progress,
                             ids=args.ids)


def movielens_sequences(args, progress):
    from ..sequences import DEFAULT_MAX_LENGTH, prepare_movielens_sequences
    if not args.sequences:
        raise ValueError("--max-length is the length of the histories of --sequences")
    given = [flag for flag, value in (("--users", args.users), ("--items", args.items),
                                      ("--shuffle-seed", args.shuffle_seed)) if value is not None]
    if given:
        raise ValueError(f"{', '.join(given)} do not apply to --sequences (histories in time order)")
    max_length = DEFAULT_MAX_LENGTH if args.max_length is None else args.max_length
    return prepare_movielens_sequences(args.input, args.output, max_length, skip_bad_lines=args.skip_bad_lines,
                                       overwrite=args.force, progress=progress, ids=args.ids)


def add_described(lines):
    def add(parser):
        parser.add_argument("--schema", required=True, metavar="FILE",
                            help="the schema file (YAML) naming each column's role (hetu.data.formats.streams)")
        add_common(parser, shuffle_default=None, ids=("hashed",), lines=lines,
                   input_help="a file, or a folder of files read in name order")
    return add


def described(name, read):
    """prepare of a format described by a schema file: ``read(schema path)`` -> its parser."""
    def run(args, progress):
        return samples.prepare_samples(name, read(args.schema), args.schema, args.input, args.output,
                                       skip_bad_lines=getattr(args, "skip_bad_lines", False),
                                       val_fraction=args.val_fraction,
                                       shuffle_seed=args.shuffle_seed, overwrite=args.force, progress=progress)
    return run


def criteo_stream(argument, users, items):
    from .streams import CriteoFormat
    return CriteoFormat()


def movielens_stream(argument, users, items):
    from .streams import MovieLensFormat
    return MovieLensFormat(users, items)


def schema_format(path):
    from .streams import SchemaFormat
    return SchemaFormat.from_file(path)


def parquet_format(path):
    from .parquet import ParquetFormat
    return ParquetFormat.from_file(path)


FORMATS = {f.name: f for f in (
    Format("criteo", "Criteo Kaggle train.txt", add_click_log, click_log(prepare_criteo), criteo_stream),
    Format("avazu", "Avazu train CSV", add_click_log, click_log(prepare_avazu)),
    Format("movielens", "MovieLens u.data / ratings.dat / .csv", add_movielens, run_movielens, movielens_stream,
           side_files=True),
    Format("schema", "any delimited text log, its columns described by a schema file", add_described(lines=True),
           described("schema", schema_format), lambda argument, users, items: schema_format(argument), argument="FILE"),
    Format("parquet", "Parquet files, their columns described by a schema file", add_described(lines=False),
           described("parquet", parquet_format), lambda argument, users, items: parquet_format(argument), argument="FILE"),
)}


def known(use):
    """The names of the formats of ``use``, as they are spelled there (a stream's ``schema:FILE``)."""
    return ", ".join(f.spelled() if use == "stream" else f.name for f in FORMATS.values()
                     if getattr(f, use) is not None)


def lookup(spec, use):
    """(the Format named by ``spec``, the argument after its colon or None), for ``use``
    ("prepare" or "stream"); a ValueError naming the formats there are otherwise."""
    if use not in USES:
        raise ValueError(f"lookup: use must be one of {USES}, got {use!r}")
    name, colon, argument = spec.partition(":") if isinstance(spec, str) else (spec, "", "")
    fmt = FORMATS.get(name)
    what = "stream format" if use == "stream" else "format"
    if fmt is None or getattr(fmt, use) is None:
        raise ValueError(f"unknown {what} {spec!r}; known: {known(use)}")
    if use == "stream" and (bool(fmt.argument) != bool(colon) or (colon and not argument)):
        raise ValueError(f"{what} {spec!r}: expected {fmt.spelled()}")
    return fmt, argument if colon else None
