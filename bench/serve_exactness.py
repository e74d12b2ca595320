"""An exported bundle against the graph it came from, on MovieLens 100K with side features.

The ratings are prepared in file order (the validation split: the last tenth), a model trains
one epoch with run_hetu.py --val --save-predictions (the graph's validation probabilities), the
checkpoint is exported, and the bundle predicts the same ratings twice: from the prepared folder's
encoded samples, and from raw instances built from u.data, u.user and u.item (user_id, movie_id,
gender, age, occupation, zip_code, title, release_date, genres). One JSON line per case: the
largest absolute difference of each from the graph, and raw instances predicted per second.

    python bench/serve_exactness.py --movielens DIR [--models dlrm dcnv2] [--ids indexed hashed]

DIR holds u.data, u.user, u.item (scripts/get_movielens100k.py)."""
import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from hetu.data import load_dataset
from hetu.data.movielens import prepare_movielens
from hetu.data.movielens_side import GENRES_100K, SIDE_FILE_ENCODING
from hetu.serve.bundle import Bundle
from hetu.serve.export import export

REPO = Path(__file__).resolve().parent.parent


def side_rows(path):
    with open(path, encoding=SIDE_FILE_ENCODING) as f:
        return {int(line.split("|")[0]): line.rstrip("\n").split("|") for line in f if line.strip()}


def raw_instances(src, count):
    """The last `count` ratings of u.data as raw instances."""
    users, items = side_rows(src / "u.user"), side_rows(src / "u.item")
    lines = (src / "u.data").read_text().splitlines()[-count:]
    instances = []
    for line in lines:
        u, i = (int(x) for x in line.split("\t")[:2])
        _, age, gender, occupation, zip_code = users[u]
        item = items[i]
        instances.append({"user_id": u, "movie_id": i, "gender": gender, "age": int(age), "occupation": occupation,
                          "zip_code": zip_code, "title": item[1], "release_date": item[2],
                          "genres": "|".join(g for g, flag in zip(GENRES_100K, item[5:]) if flag == "1")})
    return instances


def case(src, work, ids, model, capacity):
    data = work / f"ml-{ids}"
    if not data.exists():
        prepare_movielens(src / "u.data", data, users_path=src / "u.user", items_path=src / "u.item",
                          shuffle_seed=None, progress=False, ids=ids)
    out = work / f"{model}-{ids}"
    cmd = [sys.executable, str(REPO / "examples/ctr/run_hetu.py"), "--model", model, "--data-dir", str(data),
           "--embedding-size", "16", "--batch-size", "256", "--nepoch", "1", "--val", "--no-progress",
           "--checkpoint", str(out / "ckpt"), "--save-predictions", str(out / "graph.npy")]
    if ids == "hashed":
        cmd += ["--table-capacity", str(capacity)]
    out.mkdir()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    bundle = Bundle.open(export(str(out / "ckpt"), str(out / "bundle")))
    graph = np.load(out / "graph.npy")
    instances = raw_instances(src, len(graph))
    started = time.perf_counter()
    raw = np.concatenate([bundle.predict(instances[k:k + 1024]) for k in range(0, len(instances), 1024)])
    seconds = time.perf_counter() - started
    val = load_dataset(str(data)).val
    encoded = bundle.predict_arrays(val.dense, val.sparse)
    return {"model": model, "ids": ids, "validation_samples": int(len(graph)),
            "max_abs_diff_raw_instances": float(np.abs(raw - graph).max()),
            "max_abs_diff_encoded": float(np.abs(encoded - graph).max()),
            "raw_instances_per_second": round(len(instances) / seconds)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--movielens", required=True, type=Path, help="folder of u.data, u.user, u.item")
    parser.add_argument("--models", nargs="+", default=["dlrm", "dcnv2"])
    parser.add_argument("--ids", nargs="+", default=["indexed", "hashed"], choices=["indexed", "hashed"])
    parser.add_argument("--table-capacity", type=int, default=4096, help="hashed ids: the dynamic table's rows")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for ids in args.ids:
            for model in args.models:
                print(json.dumps(case(args.movielens, Path(tmp), ids, model, args.table_capacity)), flush=True)


if __name__ == "__main__":
    main()
