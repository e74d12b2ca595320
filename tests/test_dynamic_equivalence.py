"""Dynamic tables in every parameter-server mode equal the single process with the same dynamic
table (docs/design.md sections 13 and 4), parameter by parameter: keys are admitted,
evicted and come back during the run, whatever the numbers of workers and servers."""
import re

import pytest

from dist_harness import assert_same_parameters, run_cluster, run_single

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

OPTIMIZERS = {"sgd": ["--optimizer", "sgd", "--learning-rate", "0.02"],
              "adam": ["--optimizer", "adam", "--learning-rate", "0.001"],
              "rowwise_adagrad": ["--optimizer", "rowwise_adagrad", "--learning-rate", "0.001"]}
# (workers, servers, optimizer, admit_after, ttl): the table holds far fewer rows than the keys seen.
CASES = [(2, 1, "sgd", 1, 0), (3, 2, "adam", 3, 5), (4, 3, "rowwise_adagrad", 1, 4)]
MODES = {"PS": ["--comm", "PS"], "HET": ["--comm", "Hybrid", "--cache", "lru", "--bound", "0"]}


def dynamic_args(admit_after, ttl):
    return ["--model", "wdl_criteo", "--table-capacity", "1024", "--admit-after", str(admit_after),
            "--evict-ttl", str(ttl)]


def counters(stdout):
    """(resident, admitted, evicted, missed) summed over the table's counter lines."""
    lines = [line[line.index("table embedding server"):] for line in stdout.splitlines()
             if "table embedding server" in line]
    assert lines, stdout[-2000:]
    values = [list(map(int, re.findall(r"\d+", line.split(":", 1)[1]))) for line in lines]
    return tuple(sum(v[i] for v in values) for i in (0, 2, 3, 4))


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("workers,servers,opt,admit_after,ttl", CASES)
def test_dynamic_tables_equal_single_process(tmp_path, data_home, mode, workers, servers, opt, admit_after, ttl):
    args = [*dynamic_args(admit_after, ttl), *OPTIMIZERS[opt]]
    reference, summary = run_single(tmp_path, data_home, "run_hetu.py", args, global_batch=60)
    got, stdout = run_cluster(tmp_path, data_home, "run_hetu.py", [*MODES[mode], "--bsp", "0", *args],
                              workers, servers, 60 // workers)
    resident, admitted, evicted, missed = counters(stdout)
    assert evicted > 0 and missed > 0 and resident == admitted - evicted <= 1024
    assert_same_parameters(reference, got, exact_rows=(opt == "sgd"))


def test_16bit_rows_equal_single_process(tmp_path, data_home):
    """Admitted rows are rounded to the rows' storage type on the servers as in the single process."""
    args = [*dynamic_args(2, 0), *OPTIMIZERS["adam"], "--embedding-dtype", "bf16"]
    reference, _ = run_single(tmp_path, data_home, "run_hetu.py", args, global_batch=60)
    got, _ = run_cluster(tmp_path, data_home, "run_hetu.py", [*MODES["PS"], "--bsp", "0", *args], 1, 2, 60)
    assert_same_parameters(reference, got, exact_rows=False)


def test_a_checkpoint_resumes_on_other_workers_and_servers(tmp_path, data_home):
    """Keys, rows, state, counts and last reads resume exactly: two epochs straight through in one
    process equal one epoch on 2 workers and 1 server, then one more on 3 workers and 2 servers."""
    args = [*dynamic_args(2, 6), *OPTIMIZERS["sgd"]]
    reference, _ = run_single(tmp_path, data_home, "run_hetu.py", [*args, "--nepoch", "2"], global_batch=60)
    ckpt = tmp_path / "ckpt"
    run_cluster(tmp_path, data_home, "run_hetu.py", [*MODES["HET"], "--bsp", "0", *args, "--nepoch", "1",
                                                     "--checkpoint", str(ckpt)], 2, 1, 30)
    got, stdout = run_cluster(tmp_path, data_home, "run_hetu.py", [*MODES["HET"], "--bsp", "0", *args, "--nepoch", "2",
                                                                   "--resume", str(ckpt)], 3, 2, 20)
    assert "resumed" in stdout
    assert_same_parameters(reference, got, exact_rows=True)


def test_herald_resumes_a_dynamic_table_exactly(tmp_path, data_home):
    """Herald's planner takes its key directory from the checkpoint's: the resumed plans are exact."""
    # 2 epochs of 12 steps: further on, a sample's hidden unit within float rounding of ReLU's kink
    # (where the GEMM row Herald gives the sample decides the side) parts the runs by more than the bound.
    args = [*dynamic_args(1, 6), *OPTIMIZERS["sgd"], "--iters-per-epoch", "12"]
    reference, _ = run_single(tmp_path, data_home, "run_hetu.py", [*args, "--nepoch", "2"], global_batch=60)
    ckpt = tmp_path / "ckpt"
    herald = [*MODES["HET"], "--bsp", "0", *args]
    run_cluster(tmp_path, data_home, "run_laia.py", [*herald, "--nepoch", "1", "--checkpoint", str(ckpt)], 2, 1, 30)
    got, stdout = run_cluster(tmp_path, data_home, "run_laia.py", [*herald, "--nepoch", "2", "--resume", str(ckpt)],
                              3, 2, 20)
    assert "resumed" in stdout
    assert_same_parameters(reference, got, exact_rows=True)
