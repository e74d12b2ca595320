"""Command line: turn raw click logs into dataset folders, or generate synthetic ones.

    python -m hetu.data.prepare criteo    --input train.txt  --output DIR [--rows N] [--min-count K]
    python -m hetu.data.prepare avazu     --input train      --output DIR [--rows N] [--min-count K]
    python -m hetu.data.prepare movielens --input u.data     --output DIR [--label binary|rating]
                                          [--time-order] [--users u.user --items u.item]
    python -m hetu.data.prepare movielens --sequences --input u.data|ratings.dat|FOLDER
                                          --output DIR [--max-length L]
    python -m hetu.data.prepare schema    --schema FILE --input FILE|DIR --output DIR
    python -m hetu.data.prepare parquet   --schema FILE --input FILE|DIR --output DIR
    python -m hetu.data.prepare synthetic-sequences --output DIR [--users U] [--items I]
                                          [--mean-length M] [--max-length L] [--zipf A] [--seed S]
    python -m hetu.data.prepare synthetic --output DIR [--rows N]
                                          [--shape criteo|criteo-multihot|avazu|movielens]
                                          [--scale S] [--zipf-exponent A] [--drift D] [--seed S]
                                          [--hotness-scale K] [--sessions [--session-length L] ...]
                                          [--law 1|2]

The formats (criteo, avazu, movielens, schema, parquet) are those of hetu.data.formats; schema
and parquet take the schema file of a stream's schema:FILE and write the keys (--ids hashed) its
stream gives for the same files.

Every command takes --ids indexed|hashed: hashed writes each categorical value as its 64-bit key
(hetu.data.keys) instead of an index, for dynamic tables: no vocabulary pass, no field offsets.
synthetic --ids hashed --drift D is an open world: new values keep being born, old ones fade,
so the distinct keys grow without bound with the rows.

movielens --sequences writes user histories for sequential models (hetu.data.sequences: each
user's items in time order, the last one held out) instead of rating rows; it takes no side
files or shuffle (--label, --threshold and --val-fraction do not apply); with --ids hashed the
histories hold the items' keys (for a sequential model on a dynamic table), as
synthetic-sequences --ids hashed does.

Exit status: 0 on success, 2 for bad input (malformed line, missing file, existing output).
"""
import argparse
import json
import sys

from . import formats
from .formats import add_ids
from .formats.textio import DataFormatError
from .sequences import KIND as SEQUENCES_KIND, SYNTHETIC_DEFAULTS as SEQUENCE_DEFAULTS, generate_synthetic_sequences
from .store import read_meta
from .synthetic import (DRIFT_ROWS, LAW1_MAX_TABLE_ROWS, LAWS, SHAPES, SyntheticSpec,
                        generate_synthetic, synthetic_spec)

DEFAULTS = SyntheticSpec()


def build_parser():
    parser = argparse.ArgumentParser(prog="python -m hetu.data.prepare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    subparsers = parser.add_subparsers(dest="command", required=True)
    for fmt in formats.FORMATS.values():   # every format prepare reads (hetu.data.formats)
        if fmt.prepare is not None:
            fmt.add_arguments(subparsers.add_parser(fmt.name, help=fmt.help))
    histories = subparsers.add_parser("synthetic-sequences",
                                      help="generate synthetic user histories over a long-tail catalog")
    histories.add_argument("--output", required=True)
    for name in ("users", "items", "max_length", "seed"):
        histories.add_argument("--" + name.replace("_", "-"), type=int, default=SEQUENCE_DEFAULTS[name])
    for name in ("mean_length", "zipf"):
        histories.add_argument("--" + name.replace("_", "-"), type=float, default=SEQUENCE_DEFAULTS[name])
    histories.add_argument("--force", action="store_true")
    histories.add_argument("--quiet", action="store_true")
    add_ids(histories)
    synthetic = subparsers.add_parser("synthetic", help="generate a synthetic dataset")
    synthetic.add_argument("--output", required=True)
    synthetic.add_argument("--shape", choices=sorted(SHAPES), default="criteo")
    synthetic.add_argument("--rows", type=int, default=DEFAULTS.rows)
    synthetic.add_argument("--scale", type=float, default=None,
                           help="field sizes = real sizes x scale (default per shape: "
                           + ", ".join(f"{k} {v.default_scale}" for k, v in SHAPES.items()) + ")")
    synthetic.add_argument("--min-field-size", type=int, default=DEFAULTS.min_field_size)
    synthetic.add_argument("--zipf-exponent", type=float, default=DEFAULTS.zipf_exponent)
    synthetic.add_argument("--drift", type=float, default=DEFAULTS.drift, metavar="D",
                           help="0: none (default). Indexed ids: the hot set rotates by D x "
                                "field size ranks over the whole stream, within the field's "
                                "values. With --ids hashed, an open world: every field replaces "
                                f"the share D of its values per {DRIFT_ROWS:,} rows (D x field "
                                "size new values), each born the hottest, one rank cooler with "
                                "every birth after it and never drawn again after 1/D million "
                                "rows, so distinct keys grow without bound with the rows "
                                "(drawn by law 2)")
    synthetic.add_argument("--positive-rate", type=float, default=DEFAULTS.positive_rate)
    synthetic.add_argument("--linear-signal", type=float, default=DEFAULTS.linear_signal)
    synthetic.add_argument("--interaction-signal", type=float,
                           default=DEFAULTS.interaction_signal)
    synthetic.add_argument("--val-fraction", type=float, default=DEFAULTS.val_fraction)
    synthetic.add_argument("--seed", type=int, default=DEFAULTS.seed)
    synthetic.add_argument("--sessions", action="store_true",
                           help="user-like fields from a few open sessions (time-ordered reuse)")
    synthetic.add_argument("--session-length", type=float, default=DEFAULTS.session_length)
    synthetic.add_argument("--concurrent-sessions", type=int,
                           default=DEFAULTS.concurrent_sessions)
    synthetic.add_argument("--session-switch", type=float, default=DEFAULTS.session_switch)
    synthetic.add_argument("--hotness-scale", type=float, default=DEFAULTS.hotness_scale,
                           help="multi-hot shapes: bag sizes x K, at least 1 (default 1)")
    synthetic.add_argument("--law", type=int, choices=(0,) + LAWS, default=0,
                           help="how ids and labels are drawn (default 0: law 1 up to "
                                f"{LAW1_MAX_TABLE_ROWS} table rows, the bytes of earlier versions, "
                                "about 64 bytes of memory a table row; law 2 beyond, memory bounded "
                                "whatever the table's rows)")
    synthetic.add_argument("--force", action="store_true")
    synthetic.add_argument("--quiet", action="store_true")
    add_ids(synthetic)
    return parser


def run(args):
    progress = not args.quiet
    if args.command == "synthetic-sequences":
        return generate_synthetic_sequences(
            args.output, overwrite=args.force, progress=progress,
            **{name: getattr(args, name) for name in ("users", "items", "mean_length", "max_length", "zipf", "seed",
                                                      "ids")})
    if args.command != "synthetic":
        fmt, _ = formats.lookup(args.command, "prepare")
        return fmt.prepare(args, progress)
    params = {name: getattr(args, name) for name in (
        "rows", "min_field_size", "zipf_exponent", "drift", "positive_rate", "linear_signal",
        "interaction_signal", "val_fraction", "seed", "sessions", "session_length",
        "concurrent_sessions", "session_switch", "hotness_scale", "law", "ids")}
    if args.scale is not None:
        params["scale"] = args.scale
    spec = synthetic_spec(args.shape, **params)
    return generate_synthetic(args.output, spec, overwrite=args.force, progress=progress)


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        output = run(args)
    except (DataFormatError, FileNotFoundError, FileExistsError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    meta = read_meta(output)
    if meta.get("kind") == SEQUENCES_KIND:
        summary = {key: meta[key] for key in ("name", "num_users", "num_items", "num_interactions", "max_length")}
        print(f"wrote {output}: {json.dumps(summary)}")
        return 0
    summary = {key: meta[key] for key in ("name", "num_rows", "num_fields", "num_dense",
                                          "num_embeddings")}
    summary["split"] = meta["split"]
    if "ids" in meta:
        summary["ids"] = meta["ids"]
    if "measured" in meta["source"]:
        summary["measured"] = meta["source"]["measured"]
    print(f"wrote {output}: {json.dumps(summary)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
