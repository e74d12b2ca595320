"""How evenly the servers share the embedding traffic: rows served per server (the line each
server prints at the end of a job), max / mean, at several server counts, under each row
placement (PS_ROW_PLACEMENT).

Ids are numbered most frequent first within each field. With contiguous ranges of ids the load
depends on which fields' hot heads fall in a server's range; strided placement (row r on server
r mod S) deals every run of ids out over all servers. This bench measures both side by side:
plain PS (every worker pulls and pushes every distinct row of its batch), W workers, for
synthetic Criteo-shaped data (shuffled) and synthetic MovieLens-shaped ratings with sessions,
read in stored (time) order.

    python bench/server_load.py --servers 2 4 8 --iterations 40
"""
import argparse
import os
import pathlib
import re
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parent.parent
LINE = re.compile(r"\] server (\d+): (\d+) requests, (\d+) rows, (\d+) bytes served, ([\d.]+) s busy$")


def prepare_sessions(folder, rows):
    subprocess.run([sys.executable, "-m", "hetu.data.prepare", "synthetic", "--shape", "movielens", "--sessions",
                    "--rows", str(rows), "--output", str(folder)], check=True, capture_output=True, text=True)
    return folder


def served(args, servers, placement, data_flags):
    cmd = [sys.executable, str(REPO / "python/runner.py"), "-w", str(args.workers), "-s", str(servers),
           "--timeout", "600", sys.executable, str(REPO / "examples/ctr/run_hetu.py"), "--no-progress",
           "--comm", "PS", "--bsp", "0", "--batch-size", str(args.batch), "--iters-per-epoch", str(args.iterations),
           "--nepoch", "1", *data_flags]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, PS_ROW_PLACEMENT=placement))
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    per = {}
    for line in proc.stdout.splitlines():
        m = LINE.search(line)
        if m:
            per[int(m.group(1))] = (int(m.group(3)), int(m.group(4)))
    if sorted(per) != list(range(servers)):
        raise SystemExit(f"expected a line from each of {servers} servers:\n{proc.stdout[-2000:]}")
    return [per[s] for s in range(servers)]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--servers", nargs="+", type=int, default=[2, 4, 8])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--iterations", type=int, default=40)
    p.add_argument("--criteo-rows", type=int, default=200000, help="samples of the synthetic Criteo-shaped data")
    p.add_argument("--sessions-rows", type=int, default=100000, help="ratings of the synthetic MovieLens sessions")
    p.add_argument("--placements", nargs="+", choices=["contiguous", "strided"], default=["contiguous", "strided"])
    args = p.parse_args()
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="server-load-"))
    os.environ.setdefault("HETU_DATA_HOME", str(tmp / "data"))
    datasets = [
        ("synthetic Criteo, shuffled", ["--model", "wdl_criteo", "--rows", str(args.criteo_rows)]),
        ("synthetic MovieLens sessions, time order",
         ["--model", "ncf_movielens", "--data-dir", str(prepare_sessions(tmp / "sessions", args.sessions_rows))]),
    ]
    print(f"W = {args.workers}, b = {args.batch}, {args.iterations} iterations, plain PS\n")
    print("| data | servers | placement | rows served per server | max / mean rows | max / mean bytes |")
    print("|---|---|---|---|---|---|")
    for name, flags in datasets:
        for servers in args.servers:
            for placement in args.placements:
                per = served(args, servers, placement, flags)
                rows, nbytes = [r for r, _ in per], [b for _, b in per]
                print(f"| {name} | {servers} | {placement} | {' '.join(map(str, rows))} | "
                      f"{max(rows) / (sum(rows) / servers):.2f} | {max(nbytes) / (sum(nbytes) / servers):.2f} |",
                      flush=True)


if __name__ == "__main__":
    main()
