"""The command line of run_hetu.py (HET baseline) and run_laia.py (Herald): a run spec parsed
from flags and --config (hetu.run), trained by the library's loop (hetu.run.training)."""
import sys

import hetu as ht  # noqa: F401  (the optimizer registry, which --help lists)
from hetu.run.training import build_parser, job_rates, main, rates_text  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
