#!/usr/bin/env bash
# The test command: installs what the project needs, builds and installs hetu, runs the suites.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
python3 -m pip install -q --no-build-isolation .
# Run from a folder outside the source tree so `import hetu` is the installed package.
cd tests
python3 -m pytest -q -rs -p no:cacheprovider "$@" .
