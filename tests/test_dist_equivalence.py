"""A W-worker run equals the single-process run with batch W*b (DESIGN.md section 4), parameter
by parameter, in every aggregation mode."""
import pytest

from dist_harness import assert_same_parameters, run_cluster, run_single

pytestmark = pytest.mark.timeout(600)

OPTIMIZERS = {"sgd": ["--optimizer", "sgd", "--learning-rate", "0.02"],
              "adam": ["--optimizer", "adam", "--learning-rate", "0.001"]}


@pytest.mark.parametrize("model", ["wdl_criteo", "dcn_criteo"])
@pytest.mark.parametrize("workers", [2, 4])
@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
def test_allreduce_equals_single_process(tmp_path, data_home, model, workers, opt):
    args = ["--model", model, *OPTIMIZERS[opt]]
    b = 64 // workers
    reference, _ = run_single(tmp_path, data_home, "run_hetu.py", args, global_batch=64)
    got, _ = run_cluster(tmp_path, data_home, "run_hetu.py", ["--comm", "AllReduce", *args], workers, 0, b)
    assert_same_parameters(reference, got, exact_rows=(opt == "sgd"))


@pytest.mark.parametrize("mode", ["PS", "Hybrid"])
@pytest.mark.parametrize("model", ["wdl_criteo", "dcn_criteo"])
@pytest.mark.parametrize("workers,servers", [(2, 1), (4, 2)])
@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
def test_parameter_server_modes_equal_single_process(tmp_path, data_home, mode, model, workers, servers, opt):
    args = ["--model", model, *OPTIMIZERS[opt]]
    reference, _ = run_single(tmp_path, data_home, "run_hetu.py", args, global_batch=64)
    got, _ = run_cluster(tmp_path, data_home, "run_hetu.py", ["--comm", mode, "--bsp", "0", *args],
                         workers, servers, 64 // workers)
    assert_same_parameters(reference, got, exact_rows=(opt == "sgd"))
