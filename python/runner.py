#!/usr/bin/env python3
"""Launcher CLI: `python python/runner.py -c CLUSTER.yml COMMAND...` (see hetu.runner)."""
import sys

from hetu.runner import main

if __name__ == "__main__":
    sys.exit(main())
