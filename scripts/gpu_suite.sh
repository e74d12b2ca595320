#!/usr/bin/env bash
# Everything a lent GPU machine can measure, in parts that each end within their time budget.
#
#   bash scripts/gpu_suite.sh OUTDIR [--part install|check|single|cluster|cores|all] [--bundle DIR]
#                                    [--minutes M] [--quick]
#
# install  hetu from the offline bundle (--bundle, default ./bundle or $HETU_BUNDLE) unless it is
#          installed already (a lent machine starts bare)
# check    what the machine has (scripts/machine_check.py: GPU, driver, cores, CuPy, MPI, and
#          network namespaces, veth, tbf and a starting sshd, each tried for real), printed
#          first and written to OUTDIR/machine.txt and machine.json
# single   the GPU tests, then bench/gpu_single.py (hetu vs PyTorch eager and torch.compile)
# cluster  bench/gpu_cluster.py: PS vs HET vs Herald, GPU workers on shaped namespace hosts, or,
#          where the check found them impossible, over loopback on pinned cores (labelled so)
# cores    bench/planner_offline.py at 1-16 threads, plain and pipelined (with the stage split) and
#          bench/ps_throughput.py on the spare cores
# all      install, check, single, cluster, cores (the default). A lent machine's time is short:
#          `--part install --part check --part cores` took 68 s on an H200 machine's 16 cores
#          (install 24 s), then `--part single` and `--part cluster` in calls of their own
# The bundle's ip, tc, sshd, ssh and ssh-keygen (BUNDLE/prefix/usr/sbin) go on PATH after the
# system's own, for what the machine lacks. Without a GPU the suite says so and the cluster and
# core parts run on CPU workers.
#
# Every part writes OUTDIR/PART.txt (the machine's description on top, then the tables) and,
# where the bench has one, OUTDIR/PART.json; a part cut by its budget keeps the rows it finished.
# --minutes scales every part's budget (1 = the budgets below); --quick runs each part's smallest
# grid, to try the suite on a CPU machine.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

die() { echo "gpu_suite.sh: error: $*" >&2; exit 2; }
usage() { sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

OUT="" PARTS=() BUNDLE="${HETU_BUNDLE:-$ROOT/bundle}" SCALE=1 QUICK=0
while [ $# -gt 0 ]; do
  case "$1" in
    --part) [ $# -ge 2 ] || die "--part needs a value"; PARTS+=("$2"); shift 2 ;;
    --bundle) [ $# -ge 2 ] || die "--bundle needs a folder"; BUNDLE="$2"; shift 2 ;;
    --minutes) [ $# -ge 2 ] || die "--minutes needs a number"; SCALE="$2"; shift 2 ;;
    --quick) QUICK=1; shift ;;
    -h|--help) usage 0 ;;
    -*) die "unknown option $1" ;;
    *) [ -z "$OUT" ] || die "only one OUTDIR, got '$OUT' and '$1'"; OUT="$1"; shift ;;
  esac
done
[ -n "$OUT" ] || usage 2
[ ${#PARTS[@]} -gt 0 ] || PARTS=(all)
[[ "$SCALE" =~ ^[0-9]+([.][0-9]+)?$ ]] || die "--minutes must be a positive number, got '$SCALE'"
for p in "${PARTS[@]}"; do
  case "$p" in install|check|single|cluster|cores|all) ;; *) die "unknown part '$p' (install, check, single, cluster, cores, all)" ;; esac
done
[ "${PARTS[*]}" = all ] && PARTS=(install check single cluster cores)
mkdir -p "$OUT" || die "cannot create $OUT"
OUT=$(cd "$OUT" && pwd)
# Absolute: the bundle's programs go on PATH, and mpirun looks its ssh up from other folders.
[ ! -d "$BUNDLE" ] || BUNDLE=$(cd "$BUNDLE" && pwd)
PY=${PYTHON:-python3}

# Seconds a part may take (scaled by --minutes): each part stops there and keeps what it has.
budget() { awk -v s="$1" -v k="$SCALE" 'BEGIN { printf "%d", s * k }'; }
# Install (skipped when installed) and check take under a minute on 16 cores; each part's budget
# fits a call of its own.
declare -A BUDGET=([install]=$(budget 180) [single]=$(budget 330) [cluster]=$(budget 210) [cores]=$(budget 120))

say() { echo "== $*" | tee -a "$OUT/suite.log"; }

# Runs "$@" for at most $1 seconds, output to $OUT/$2.txt under the machine's description.
run_part() {
  local seconds=$1 name=$2; shift 2
  local started=$SECONDS
  { cat "$OUT/machine.txt" 2>/dev/null; echo; echo "\$ $*"; echo; } > "$OUT/$name.txt"
  timeout --signal=INT --kill-after=20 "$seconds" "$@" >> "$OUT/$name.txt" 2>> "$OUT/$name.err"
  local rc=$?
  [ $rc -eq 124 ] && echo "(stopped by its budget of $seconds s: the rows above are those finished)" >> "$OUT/$name.txt"
  say "$name: exit $rc after $((SECONDS - started)) s (budget $seconds s) -> $OUT/$name.txt"
  return 0
}

part_install() {
  if "$PY" -c "import hetu._ps, hetu._C" 2>/dev/null; then
    say "install: hetu is installed ($("$PY" -c 'import hetu; print(hetu.__file__)'))"
    return 0
  fi
  [ -f "$BUNDLE/install.sh" ] || die "hetu is not installed and there is no offline bundle at $BUNDLE (make one with scripts/offline_bundle.sh BUNDLE --python-version $("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])'), carry it, or pass --bundle DIR)"
  local started=$SECONDS
  timeout "${BUDGET[install]}" bash "$BUNDLE/install.sh" > "$OUT/install.log" 2>&1 || die "the bundle's install failed: see $OUT/install.log"
  say "install: from $BUNDLE in $((SECONDS - started)) s"
}

part_check() {
  "$PY" scripts/machine_check.py "$OUT"
}

# How the cluster part runs: netns where the check made namespaces, veth, tbf and sshd work.
network() { "$PY" -c "import json,sys; print(json.load(open(sys.argv[1])).get('network', 'loopback'))" "$OUT/machine.json" 2>/dev/null || echo loopback; }

has_gpu() { "$PY" -c "import cupy, sys; sys.exit(cupy.cuda.runtime.getDeviceCount() == 0)" 2>/dev/null; }

part_single() {
  local b=${BUDGET[single]}
  run_part $((b / 4)) single_tests "$PY" -m pytest -q -rs -p no:cacheprovider tests/test_gpu_ops.py tests/test_gpu_train.py tests/test_gpu_assignment.py
  has_gpu || { say "single: no GPU here (CuPy sees none): bench/gpu_single.py not run"; return 0; }
  if [ $QUICK -eq 1 ]; then
    run_part $((b * 3 / 4)) single "$PY" bench/gpu_single.py --models wdl --batch 1024 --embedding 16 --optimizers sgd --windows 3 --budget $((b / 2)) --out "$OUT/single.json"
  else
    run_part $((b * 3 / 4)) single "$PY" bench/gpu_single.py --models wdl dcn ncf --batch 1024 16384 --embedding 128 --optimizers sgd adam --windows 3 --budget $((b * 3 / 4 - 30)) --out "$OUT/single.json"
  fi
}

part_cluster() {
  local b=${BUDGET[cluster]}
  if [ $QUICK -eq 1 ]; then
    run_part "$b" cluster "$PY" bench/gpu_cluster.py --network "$(network)" --quick --repeats 1
  else
    run_part "$b" cluster "$PY" bench/gpu_cluster.py --network "$(network)" --workloads ncf wdl --workers 2 4 --servers 1 --rates 10gbit 25gbit --embedding 128 512 --batch 1024 --ratios 0.1 0.2 --repeats 1 --iterations 30
  fi
}

part_cores() {
  local b=${BUDGET[cores]} threads="1 2 4 8 16"
  [ $QUICK -eq 1 ] && threads="1 2"
  run_part $((b * 2 / 3)) cores_planner "$PY" bench/planner_offline.py --workers 8 16 --batch 1024 --ratios 0.1 --allocators colocate --iterations 3 --rows 320000 --threads $threads --pipeline --profile
  run_part $((b / 3)) cores_ps "$PY" bench/ps_throughput.py --shapes 1x1 4x2 --batches 16384 --optimizers sgd --repeat 3
}

[ ! -d "$BUNDLE/prefix/usr/sbin" ] || export PATH="$PATH:$BUNDLE/prefix/usr/sbin"
say "gpu_suite: parts ${PARTS[*]} into $OUT, $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
for p in "${PARTS[@]}"; do
  # The bundle's mpirun and libraries, once installed from it.
  [ "$p" = install ] || [ ! -f "$BUNDLE/env.sh" ] || . "$BUNDLE/env.sh"
  [ "$p" = install ] || [ "$p" = check ] || [ -f "$OUT/machine.txt" ] || part_check > /dev/null
  started=$SECONDS
  "part_$p"
  if [ "$p" = check ]; then
    has_gpu || say "check: no GPU found (CuPy sees none): the GPU tests skip, bench/gpu_single.py is not run, the cluster and core parts run on CPU workers"
    say "check: cluster network $(network) in $((SECONDS - started)) s"
  fi
  say "part $p: $((SECONDS - started)) s"
done
say "done: $(ls "$OUT" | tr '\n' ' ')"
