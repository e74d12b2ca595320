#!/usr/bin/env python3
"""Launcher CLI: `python python/runner.py -c CLUSTER.yml COMMAND...` (see hetu.launch)."""
import os
import sys

# Python puts this script's folder first on sys.path, and that folder holds the hetu *sources*,
# without the compiled extensions: drop it so `import hetu` is the installed package.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

from hetu.runner import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
