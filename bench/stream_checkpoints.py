"""bench/stream.py --parts checkpoints: incremental against full checkpoints on a dynamic table
of a few million rows (--ckpt-capacity) on the parameter server. One job saves a full checkpoint
every --ckpt-every steps, another a full one every --ckpt-full-every saves and deltas between.
Per kind of save: the bytes it writes (the files its meta.json lists), the seconds to write it
(the trainer's own "checkpoint at step" line, flush and barriers included), its share of the
time of the steps between two saves, and the seconds to restore the last checkpoint (full, or
full and deltas) in a job that resumes from it."""
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

from common.summaries import last_summary

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _train(args, folder, extra, label):
    """Runs run_hetu.py on --ckpt-workers and --ckpt-servers; its output."""
    cmd = [sys.executable, os.path.join(REPO, "python/runner.py"), "-w", str(args.ckpt_workers),
           "-s", str(args.ckpt_servers), sys.executable, os.path.join(REPO, "examples/ctr/run_hetu.py"),
           "--no-progress", "--comm", "PS", "--model", "wdl_criteo", "--embedding-size", str(args.ckpt_width),
           "--optimizer", args.ckpt_optimizer, "--learning-rate", "0.001",
           "--table-capacity", str(args.ckpt_capacity), "--batch-size", str(args.ckpt_batch),
           "--rows", str(args.ckpt_samples), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, HETU_DATA_HOME=folder))
    if proc.returncode != 0:
        sys.exit(f"bench/stream.py: the {label} job failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return proc.stdout


def _meta_bytes(folder):
    with open(os.path.join(folder, "meta.json")) as f:
        meta = json.load(f)
    return sum(entry["bytes"] for entry in meta["files"].values()) + os.path.getsize(os.path.join(folder, "meta.json"))


def checkpoints_table(args):
    """Rows: full and delta saves of the incremental job, and the saves of the all-full job."""
    iters = args.ckpt_steps
    nepoch = 1
    # Enough samples for the steps and the resumed job's (a tenth is the validation split).
    global_batch = args.ckpt_batch * args.ckpt_workers
    args.ckpt_samples = max(args.ckpt_samples, (iters + args.ckpt_every) * global_batch * 10 // 9 + global_batch)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-") as work:
        restore = {}
        for name, full_every in (("full only", 1), (f"full every {args.ckpt_full_every}", args.ckpt_full_every)):
            ckpt = os.path.join(work, f"ckpt-{full_every}")
            out = _train(args, work, ["--iters-per-epoch", str(iters), "--nepoch", str(nepoch),
                                      "--checkpoint", ckpt, "--checkpoint-every", str(args.ckpt_every),
                                      "--checkpoint-full-every", str(full_every)], name)
            saves = [(int(s), float(t), kind) for s, t, kind in
                     re.findall(r"\[worker 0\] checkpoint at step (\d+) written to \S+ in ([\d.]+) s \(([^)]+)\)", out)]
            seconds = last_summary(out)["seconds"]
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
                rows.append((name, kind, len(times), size, mean, mean / (args.ckpt_every * step_seconds)))
            resumed = _train(args, work, ["--iters-per-epoch", str(iters + args.ckpt_every), "--nepoch", "1",
                                          "--resume", ckpt], f"{name} resumed")
            restore[name] = (float(re.search(r"resumed .* in ([\d.]+) s", resumed)[1]), len(deltas))
    print(f"checkpoints: dynamic table of {args.ckpt_capacity} rows x {args.ckpt_width} ({args.ckpt_optimizer}), "
          f"{args.ckpt_workers} worker(s), {args.ckpt_servers} server(s), a save every {args.ckpt_every} steps of "
          f"{args.ckpt_workers} x {args.ckpt_batch} samples")
    print(f"{'job':<16} {'save':<6} {'count':>5} {'MB each':>10} {'s each':>8} {'of steps':>9}")
    for name, kind, count, size, mean, share in rows:
        print(f"{name:<16} {kind:<6} {count:>5} {size / 1e6:>10.2f} {mean:>8.3f} {share:>8.1%}")
    for name, (seconds, deltas) in restore.items():
        print(f"restore ({name}): {seconds:.3f} s, a full checkpoint and {deltas} delta(s)")


def add_arguments(p):
    p.add_argument("--ckpt-capacity", type=int, default=2 ** 22, help="checkpoints: the dynamic table's rows")
    p.add_argument("--ckpt-width", type=int, default=16, help="checkpoints: the embedding width")
    p.add_argument("--ckpt-optimizer", default="adam", choices=["sgd", "adam"], help="checkpoints: the optimizer")
    p.add_argument("--ckpt-steps", type=int, default=300, help="checkpoints: steps of each job")
    p.add_argument("--ckpt-every", type=int, default=100, help="checkpoints: steps between two saves")
    p.add_argument("--ckpt-full-every", type=int, default=3, help="checkpoints: every K-th save is full")
    p.add_argument("--ckpt-batch", type=int, default=1024, help="checkpoints: per-worker batch")
    p.add_argument("--ckpt-samples", type=int, default=200000, help="checkpoints: synthetic samples, at least")
    p.add_argument("--ckpt-workers", type=int, default=1, help="checkpoints: workers")
    p.add_argument("--ckpt-servers", type=int, default=1, help="checkpoints: servers")
