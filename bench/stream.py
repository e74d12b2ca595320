"""Training on a stream: what it costs (DESIGN.md section 14).

--parts checkpoints: incremental against full checkpoints on a dynamic table of a few million
rows (--capacity) on the parameter server: one job saves a full checkpoint every --every steps,
another saves a full one every --full-every saves and deltas between. Per kind of save: the
bytes it writes (the files its meta.json lists), the seconds to write it (the trainer's own
"checkpoint at step" line, flush and barriers included), its share of the time of the steps
between two saves, and the seconds to restore the last checkpoint (full, or full and deltas) in
a job that resumes from it.

    python bench/stream.py --parts checkpoints
    python bench/stream.py --parts checkpoints --capacity 4194304 --steps 120 --every 20
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _train(args, folder, extra, label):
    """Runs run_hetu.py on --workers and --servers; its output."""
    cmd = [sys.executable, os.path.join(REPO, "python/runner.py"), "-w", str(args.workers), "-s", str(args.servers),
           sys.executable, os.path.join(REPO, "examples/ctr/run_hetu.py"), "--no-progress", "--comm", "PS",
           "--model", "wdl_criteo", "--embedding-size", str(args.width), "--optimizer", args.optimizer,
           "--learning-rate", "0.001", "--table-capacity", str(args.capacity), "--batch-size", str(args.batch),
           "--rows", str(args.samples), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, HETU_DATA_HOME=folder))
    if proc.returncode != 0:
        sys.exit(f"bench/stream.py: the {label} job failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return proc.stdout


def _meta_bytes(folder):
    with open(os.path.join(folder, "meta.json")) as f:
        meta = json.load(f)
    return sum(entry["bytes"] for entry in meta["files"].values()) + os.path.getsize(os.path.join(folder, "meta.json"))


def _summary(out):
    return json.loads([line for line in out.splitlines() if "summary {" in line][-1].split("summary ", 1)[1])


def checkpoints_table(args):
    """Rows: full and delta saves of the incremental job, and the saves of the all-full job."""
    iters = args.steps
    nepoch = 1
    # Enough samples for the steps and the resumed job's (a tenth is the validation split).
    args.samples = max(args.samples, (iters + args.every) * args.batch * args.workers * 10 // 9 + args.batch)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-") as work:
        restore = {}
        for name, full_every in (("full only", 1), (f"full every {args.full_every}", args.full_every)):
            ckpt = os.path.join(work, f"ckpt-{full_every}")
            out = _train(args, work, ["--iters-per-epoch", str(iters), "--nepoch", str(nepoch),
                                      "--checkpoint", ckpt, "--checkpoint-every", str(args.every),
                                      "--checkpoint-full-every", str(full_every)], name)
            saves = [(int(s), float(t), kind) for s, t, kind in
                     re.findall(r"\[worker 0\] checkpoint at step (\d+) written to \S+ in ([\d.]+) s \(([^)]+)\)", out)]
            seconds = _summary(out)["seconds"]
            spent = sum(t for _, t, _ in saves)
            step_seconds = (seconds - spent) / iters   # the steps alone
            # What each kind writes: the last chain on disk (a full one and its deltas).
            deltas = sorted(glob.glob(os.path.join(ckpt, "deltas", "[0-9]" * 6)))
            sizes = {"full": _meta_bytes(ckpt), "delta": [_meta_bytes(d) for d in deltas]}
            for kind in ("full", "delta"):
                times = [t for _, t, k in saves if k.split()[0] == kind]
                if not times:
                    continue
                size = sizes["full"] if kind == "full" else (sum(sizes["delta"]) / len(sizes["delta"])
                                                             if sizes["delta"] else float("nan"))
                mean = sum(times) / len(times)
                rows.append((name, kind, len(times), size, mean, mean / (args.every * step_seconds)))
            resumed = _train(args, work, ["--iters-per-epoch", str(iters + args.every), "--nepoch", "1",
                                          "--resume", ckpt], f"{name} resumed")
            restore[name] = (float(re.search(r"resumed .* in ([\d.]+) s", resumed)[1]), len(deltas))
    print(f"checkpoints: dynamic table of {args.capacity} rows x {args.width} ({args.optimizer}), "
          f"{args.workers} worker(s), {args.servers} server(s), a save every {args.every} steps of "
          f"{args.workers} x {args.batch} samples")
    print(f"{'job':<16} {'save':<6} {'count':>5} {'MB each':>10} {'s each':>8} {'of steps':>9}")
    for name, kind, count, size, mean, share in rows:
        print(f"{name:<16} {kind:<6} {count:>5} {size / 1e6:>10.2f} {mean:>8.3f} {share:>8.1%}")
    for name, (seconds, deltas) in restore.items():
        print(f"restore ({name}): {seconds:.3f} s, a full checkpoint and {deltas} delta(s)")


PARTS = {"checkpoints": checkpoints_table}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", nargs="+", choices=sorted(PARTS), default=sorted(PARTS))
    p.add_argument("--capacity", type=int, default=2 ** 22, help="checkpoints: the dynamic table's rows")
    p.add_argument("--width", type=int, default=16, help="checkpoints: the embedding width")
    p.add_argument("--optimizer", default="adam", choices=["sgd", "adam"])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--every", type=int, default=20, help="checkpoints: steps between two saves")
    p.add_argument("--full-every", type=int, default=5, help="checkpoints: every K-th save is full")
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--samples", type=int, default=200000, help="synthetic samples (hashed keys)")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--servers", type=int, default=1)
    args = p.parse_args()
    for part in args.parts:
        PARTS[part](args)


if __name__ == "__main__":
    main()
