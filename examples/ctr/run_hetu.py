"""Train a CTR model with hetu: single process, or distributed (PS / AllReduce / Hybrid) with the
HET embedding cache. Launch distributed runs through python/runner.py."""
from train import main

if __name__ == "__main__":
    main(herald=False)
