"""Train a CTR model with the Herald embedding scheduler: the same flags as run_hetu.py plus
--lookahead and --allocator. Launch through python/runner.py with --comm PS or Hybrid."""
from train import main

if __name__ == "__main__":
    main(herald=True)
