"""The `heturun` console script and python/runner.py: see hetu.launch."""
import sys

from hetu.launch.cli import main

if __name__ == "__main__":
    sys.exit(main())
