"""What Adam with catch-up costs a training step: `run_hetu.py --optimizer adam` (lazy) against
`--optimizer adam_catchup` (every row takes every step, its skipped ones applied when it is next
read; docs/design.md section 4), one process, the same model, data and settings.

The two run in turn, one run of each per round (adam, catch-up, adam, ...), so that a loaded
machine's noise falls on both alike; each run's rate is its summary's samples/s (the steps' time,
data set-up excluded). Columns: each one's median samples/s over the rounds, and the paired ratio
catch-up / adam (median of the rounds' ratios, with its range).

A cold row costs up to 213 zero-gradient Adam steps at its read (a hot row none), so the cost
depends on how often rows come back: the synthetic Criteo shapes draw most ids from a long tail.

    python bench/catch_up_cost.py                   # WDL on synthetic Criteo, DLRM on multi-hot Criteo
    python bench/catch_up_cost.py --rounds 5 --steps 400
    python bench/catch_up_cost.py --data-dir $HETU_DATA_HOME/ml100k-side-time --model dlrm
"""
import argparse
import os
import statistics
import subprocess
import sys

from common.launch import ROOT
from common.summaries import last_summary
RUN_HETU = os.path.join(ROOT, "examples/ctr/run_hetu.py")
CASES = {"wdl synthetic Criteo": ["--model", "wdl_criteo", "--rows", "500000"],
         "dlrm synthetic multi-hot Criteo": ["--model", "dlrm_criteo_multihot", "--dataset", "synthetic-criteo-multihot",
                                             "--rows", "200000"]}
OPTIMIZERS = ("adam", "adam_catchup")


def samples_per_second(flags, optimizer, args):
    command = [sys.executable, RUN_HETU, *flags, "--optimizer", optimizer, "--learning-rate", str(args.lr),
               "--batch-size", str(args.batch), "--embedding-size", str(args.emb), "--iters-per-epoch",
               str(args.steps), "--nepoch", "1", "--no-progress"]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                         env=dict(os.environ, HETU_NUM_THREADS=str(args.threads)))
    summary = last_summary(run.stdout)
    if run.returncode != 0 or summary is None:
        raise SystemExit(f"run_hetu.py failed ({run.returncode}): {' '.join(command)}\n{run.stdout[-2000:]}"
                         f"{run.stderr[-2000:]}")
    return summary["samples_per_second"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=300, help="training steps a run")
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--emb", type=int, default=16)
    ap.add_argument("--lr", type=float, default=0.001)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--data-dir", default=None, help="a prepared folder instead of the synthetic cases")
    ap.add_argument("--model", default="dlrm", help="with --data-dir: the model to train")
    args = ap.parse_args()
    cases = ({os.path.basename(args.data_dir.rstrip("/")): ["--model", args.model, "--data-dir", args.data_dir]}
             if args.data_dir else CASES)
    print(f"batch {args.batch}, embedding {args.emb}, lr {args.lr}, {args.steps} steps a run, {args.rounds} rounds, "
          f"{args.threads} threads", flush=True)
    header = f"{'case':<34} {'adam samples/s':>15} {'catch-up samples/s':>19} {'catch-up/adam':>14} {'range':>16}"
    print(header + "\n" + "-" * len(header), flush=True)
    for label, flags in cases.items():
        rates = {o: [] for o in OPTIMIZERS}
        for _ in range(args.rounds):
            for optimizer in OPTIMIZERS:
                rates[optimizer].append(samples_per_second(flags, optimizer, args))
        ratios = [c / a for a, c in zip(rates["adam"], rates["adam_catchup"])]
        print(f"{label:<34} {statistics.median(rates['adam']):>15.0f} {statistics.median(rates['adam_catchup']):>19.0f} "
              f"{statistics.median(ratios):>14.3f} {f'[{min(ratios):.3f}, {max(ratios):.3f}]':>16}", flush=True)


if __name__ == "__main__":
    main()
