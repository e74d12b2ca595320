#!/usr/bin/env bash
# The main job: installs what the project needs, builds hetu, then trains WDL on the embedded
# synthetic Criteo-shaped data as local multi-process clusters (1 server, 2 workers) with plain PS,
# HET (--cache lru --bound 0 --bsp 0) and Herald, and prints the comparison table.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
python3 -m pip install -q --no-build-isolation .
python3 bench/compare_modes.py --quick "$@"
