"""What the benches repeat, written once (a bench runs as `python bench/NAME.py`, so `bench/` is
first on its path and `from common import ...` finds this package):

- launch: the repository's paths and the command lines of a training run (one process, or a
  local cluster under python/runner.py), run with the failure named;
- summaries: the `summary {...}` lines a training run prints, per worker or the last one;
- stats: medians and the range of several runs, as docs/results/ quotes them;
- torch_dlrm, torch_seqrec: the PyTorch twins of hetu's DLRM, SASRec and HSTU (same weights, same
  batches), the baselines of the speed and quality benches.
"""
