"""Training on a GPU equals training on the CPU (docs/design.md sections 4 and 12): single-process WDL
and NCF with SGD and Adam; HET and Herald with two workers sharing one GPU against the
single-process reference; AllReduce over NCCL (one worker per GPU) and through host memory
(workers sharing one); no device allocation after warm-up; CUDA graphs replay the eager step bit
for bit. Skipped without CuPy and a GPU."""
import numpy as np
import pytest

import hetu as ht
from dist_harness import assert_same_parameters, run_cluster, run_single
from gpu_harness import assert_device_values, requires_gpu

pytestmark = [requires_gpu, pytest.mark.timeout(600)]

OPTIMIZERS = {"sgd": ["--optimizer", "sgd", "--learning-rate", "0.02"],
              "adam": ["--optimizer", "adam", "--learning-rate", "0.001"]}


@pytest.mark.parametrize("model", ["wdl_criteo", "ncf_movielens"])
@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
def test_single_process_gpu_equals_cpu(tmp_path, data_home, model, opt):
    args = ["--model", model, *OPTIMIZERS[opt]]
    reference, _ = run_single(tmp_path, data_home, "run_hetu.py", args, global_batch=64)
    (tmp_path / "gpu").mkdir()
    got, summary = run_single(tmp_path / "gpu", data_home, "run_hetu.py", [*args, "--gpu"], global_batch=64)
    assert summary["device"] == "gpu(0)", summary
    assert_same_parameters(reference, got, exact_rows=(opt == "sgd"))


@pytest.mark.parametrize("script,mode", [("run_hetu.py", ["--cache", "lru", "--bound", "0"]),
                                         ("run_laia.py", ["--cache", "lru"]),
                                         ("run_hetu.py", [])])
@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
def test_two_gpu_workers_sharing_a_gpu_equal_the_single_process_run(tmp_path, data_home, script, mode, opt):
    """HET (bound 0), Herald and plain PS: each worker moves its rows to the device in one copy
    and its summed gradient back in one; the dense part is summed through host memory."""
    args = ["--model", "wdl_criteo", *OPTIMIZERS[opt]]
    reference, _ = run_single(tmp_path, data_home, "run_hetu.py", args, global_batch=64)
    got, out = run_cluster(tmp_path, data_home, script,
                           ["--comm", "Hybrid", "--bsp", "0", "--cache-limit-ratio", "0.1", "--gpu", *mode, *args],
                           2, 1, 32)
    assert "on gpu(0)" in out, out[-2000:]
    assert_same_parameters(reference, got, exact_rows=(opt == "sgd"))


@pytest.mark.parametrize("workers", [1, 2])
def test_allreduce_on_gpus_equals_the_single_process_run(tmp_path, data_home, workers):
    """One worker on the one GPU: NCCL (a communicator of one rank); two sharing it: host memory."""
    args = ["--model", "dcn_criteo", *OPTIMIZERS["adam"]]
    reference, _ = run_single(tmp_path, data_home, "run_hetu.py", args, global_batch=64)
    got, _ = run_cluster(tmp_path, data_home, "run_hetu.py", ["--comm", "AllReduce", "--gpu", *args], workers, 0,
                         64 // workers)
    assert_same_parameters(reference, got, exact_rows=False)


def _wdl_executor(cuda_graph, batch=256, rows=4096, optimizer=None):
    rng = np.random.default_rng(0)
    dense = rng.standard_normal((rows, 13)).astype(np.float32)
    sparse = rng.integers(0, 5000, size=(rows, 26)).astype(np.int64)
    labels = (rng.random((rows, 1)) < 0.3).astype(np.float32)
    inputs = [ht.dataloader_op([ht.Dataloader(a, batch, "train")]) for a in (dense, sparse, labels)]
    from hetu.models import MODELS
    loss, _, _, train_op = MODELS["wdl_criteo"](*inputs, num_embeddings=5000, embedding_size=16,
                                               optimizer=optimizer or ht.optim.AdamOptimizer(0.001))
    return ht.Executor({"train": [loss, train_op]}, ctx=ht.gpu(0), seed=1, cuda_graph=cuda_graph)


@pytest.mark.parametrize("cuda_graph", [False, True])
def test_no_device_allocation_after_warm_up(cuda_graph):
    import cupy as cp
    ex = assert_device_values(_wdl_executor(cuda_graph))
    for _ in range(4):
        ex.run("train")
    pool = cp.get_default_memory_pool()
    graph_pool = ex.device_step.pool
    before = (pool.total_bytes(), graph_pool.total_bytes() if graph_pool else 0)
    for _ in range(20):
        ex.run("train")
    after = (pool.total_bytes(), graph_pool.total_bytes() if graph_pool else 0)
    assert after[0] == before[0], f"the device pool grew from {before[0]} to {after[0]} bytes after warm-up"
    assert after[1] == before[1], "the captured graphs' pool grew after warm-up"
    if cuda_graph:
        assert ex.device_step.capture_error is None, ex.device_step.capture_error
        assert ex.device_step.plans, "nothing was captured"


def test_cuda_graph_replays_the_eager_steps_bit_for_bit():
    eager, graphed = _wdl_executor(False), _wdl_executor(True)
    for _ in range(12):
        a = eager.run("train", convert_to_numpy_ret_vals=True)[0]
        b = graphed.run("train", convert_to_numpy_ret_vals=True)[0]
        assert a == b
    assert graphed.device_step.capture_error is None, graphed.device_step.capture_error
    from hetu.device_step import CapturedRun
    runs = [item for plan in graphed.device_step.plans.values() for item in plan if isinstance(item, CapturedRun)]
    assert runs and sum(len(r.nodes) for r in runs) > 20, "the forward and backward were not captured"
    pa, pb = eager.parameters(), graphed.parameters()
    for name in pa:
        np.testing.assert_array_equal(pa[name], pb[name], err_msg=name)


def test_non_finite_loss_stops_before_any_update_on_the_device():
    x, y = ht.Variable("x", dtype=np.float32), ht.Variable("y", dtype=np.float32)
    w = ht.init.ones((3, 1), name="w")
    loss = ht.reduce_mean_op(ht.binarycrossentropywithlogits_op(ht.matmul_op(x, w), y))
    ex = ht.Executor([loss, ht.optim.SGDOptimizer(0.1).minimize(loss)], ctx=ht.gpu(0))
    good = np.ones((2, 3), np.float32)
    ex.run(feed_dict={x: good, y: np.ones((2, 1), np.float32)})
    before = ex.parameters()["w"]
    with pytest.raises(FloatingPointError, match="not finite at iteration 1"):
        ex.run(feed_dict={x: np.full((2, 3), np.nan, np.float32), y: np.ones((2, 1), np.float32)})
    np.testing.assert_array_equal(ex.parameters()["w"], before)
