"""SASRec and HSTU in every mode equal the single process with the global batch (docs/design.md
sections 4 and 17), parameter by parameter: the item table on the servers (PS, HET's cache at bound
0) or summed with the dense parameters (AllReduce), dropout on (its masks keyed by each sample,
not by the worker that trains it) and the negatives drawn by (seed, step, sample, position) (in-batch: from the global
batch's targets), so that no mode or worker count draws others. Herald plans every row a sample reads: its history,
its targets and its negatives (each global batch submitted with the ids its loader computes)."""
import pytest

from dist_harness import assert_same_parameters, run_cluster, run_single
from hetu.data.sequences import generate_synthetic_sequences

pytestmark = pytest.mark.timeout(600)

COMMON = ["--no-progress", "--embedding-size", "16", "--num-negatives", "8", "--iters-per-epoch", "8",
          "--heads", "2", "--dropout", "0.2"]
HET = ["--comm", "Hybrid", "--cache", "lru", "--bound", "0", "--cache-limit-ratio", "0.2"]
HERALD = ["--comm", "Hybrid", "--cache", "lru", "--cache-limit-ratio", "0.2"]
# (model, mode flags, workers, servers[, script])
# Shared negatives train under lazy Adam (`adam`: a row steps when it is read). Each is read by
# every position of the global batch, so its gradient sums thousands of terms that nearly
# cancel; the catch-up optimizers (dense AdamW's result) then take every skipped step in the sign
# of what is left of that sum, so the float rounding of the sum, which the workers' split changes,
# moves such a row by up to 3.4 times the comparison's bound (on one BLAS kernel or another),
# where lazy Adam stays under a tenth of it.
SHARED = "--negatives shared --optimizer adam"
CASES = {"sasrec-Herald-w2s1": ("sasrec_synthetic", HERALD, 2, 1, "run_laia.py"),
         "sasrec-shared-Herald-w2s2": (f"sasrec_synthetic {SHARED}", HERALD, 2, 2, "run_laia.py"),
         "hstu-shared-HET-w2s1": (f"hstu_synthetic {SHARED}", HET, 2, 1),
         "hstu-Herald-w4s2": ("hstu_synthetic", HERALD, 4, 2, "run_laia.py"),
         "sasrec-PS-w2s2": ("sasrec_synthetic", ["--comm", "PS"], 2, 2),
         "sasrec-HET-w2s1": ("sasrec_synthetic", HET, 2, 1),
         "sasrec-AllReduce-w2": ("sasrec_synthetic", ["--comm", "AllReduce"], 2, 0),
         "sasrec-PS-w4s2": ("sasrec_synthetic", ["--comm", "PS"], 4, 2),
         "hstu-PS-w2s1": ("hstu_synthetic", ["--comm", "PS"], 2, 1),
         "hstu-HET-w2s2": ("hstu_synthetic", HET, 2, 2),
         "sasrec-inbatch-Herald-w2s2": ("sasrec_synthetic --negatives in-batch", HERALD, 2, 2, "run_laia.py"),
         "sasrec-inbatch-PS-w4s1": ("sasrec_synthetic --negatives in-batch", ["--comm", "PS"], 4, 1)}
GLOBAL_BATCH = 64


@pytest.fixture(scope="module")
def hashed_histories(tmp_path_factory):
    """A synthetic sequences folder whose histories hold the items' hashed keys."""
    return generate_synthetic_sequences(tmp_path_factory.mktemp("hashed") / "seq", users=400, items=1500, ids="hashed")


# Hashed item ids on a dynamic table (keys admitted at their second read): (model, mode flags,
# workers, servers[, script]). SASRec under SGD, each row within its bounds: under Adam a row
# first read at its admission steps by the sign of a few terms, and the rounding of their sum
# moved such a row by up to twice the adaptive bound on one BLAS kernel.
DYNAMIC = ["--table-capacity", "3000", "--admit-after", "2"]
SGD = "--optimizer sgd --learning-rate 0.05"
HASHED_CASES = {"sasrec-hashed-Herald-w2s2": (f"sasrec {SGD}", HERALD, 2, 2, "run_laia.py"),
                "hstu-hashed-inbatch-PS-w2s1": ("hstu --negatives in-batch --optimizer adam", ["--comm", "PS"], 2, 1),
                "sasrec-hashed-HET-w4s2": (f"sasrec {SGD}", HET, 4, 2)}


@pytest.mark.parametrize("case", sorted(HASHED_CASES))
def test_hashed_items_on_a_dynamic_table_equal_the_single_process(tmp_path, data_home, hashed_histories, case):
    model, flags, workers, servers, *script = HASHED_CASES[case]
    args = ["--model", *model.split(), "--data-dir", str(hashed_histories), *DYNAMIC]
    reference, single = run_single(tmp_path, data_home, "run_hetu.py", args, GLOBAL_BATCH, common=COMMON)
    got, log = run_cluster(tmp_path, data_home, *(script or ["run_hetu.py"]), [*flags, "--bsp", "0", *args], workers,
                           servers, GLOBAL_BATCH // workers, common=COMMON)
    keys = reference["item_embedding:keys"]
    assert len(keys) > 100 and (keys < 0).any(), "a hashed table holds negative keys too"
    assert_same_parameters(reference, got, exact_rows="sgd" in model)


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_mode_equals_the_single_process(tmp_path, data_home, case):
    model, flags, workers, servers, *script = CASES[case]
    args = ["--model", *model.split()]
    reference, single = run_single(tmp_path, data_home, "run_hetu.py", args, GLOBAL_BATCH, common=COMMON)
    got, log = run_cluster(tmp_path, data_home, *(script or ["run_hetu.py"]), [*flags, "--bsp", "0", *args], workers,
                           servers, GLOBAL_BATCH // workers, common=COMMON)
    assert len(reference) > 10 and "item_embedding" in reference
    assert_same_parameters(reference, got, exact_rows=False)
    if "--cache" in flags:
        assert "hit rate 0.000" not in log, "the HET cache served no row from its copies"
