"""Faults that must end cleanly, with real processes: a launcher killed with kill -9, a
checkpoint save killed at each step of its swap, damaged checkpoint and data files, a report
that cannot be written, a cluster file of binary garbage, an oversized frame to a server."""
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import jobs
from conftest import REPO
from dist_harness import COMMON
from ps_helpers import alive, cluster_fixture, needs_mpirun, zmq_job_dealer

from hetu.checkpoint import STOP_POINTS
from hetu.data import generate_synthetic, load_dataset
from hetu.launch.processes import descendants

RUNNER = REPO / "python" / "runner.py"
RUN_HETU = REPO / "examples" / "ctr" / "run_hetu.py"
SMALL = [*COMMON, "--iters-per-epoch", "20", "--batch-size", "64"]




@pytest.fixture
def cluster(tmp_path):
    yield from cluster_fixture(tmp_path)


def run_hetu(data_home, *args, launcher=(), env=None, timeout=200):
    env = dict(os.environ, HETU_DATA_HOME=data_home, PS_HEARTBEAT_TIMEOUT="20", **(env or {}))
    return jobs.run([*launcher, sys.executable, str(RUN_HETU), *SMALL, *args],
                    capture_output=True, text=True, env=env, timeout=timeout)


def one_line_error(proc, message):
    """`message` is in the output, on one line, and no traceback came with it."""
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert any(message in line for line in out.splitlines()), out[-3000:]
    assert "Traceback" not in out, out[-3000:]


def local_cluster(workers, servers=1):
    return (sys.executable, str(RUNNER), "-w", str(workers), "-s", str(servers), "--timeout", "150")


# --------------------------------------------------------------------------- the launcher

WORKER_THAT_TRAINS_ON = textwrap.dedent("""
    import os, subprocess, time
    import hetu.ps as ps
    from mpi4py import MPI
    MPI.COMM_WORLD.allreduce(1)   # Open MPI's shared-memory segments exist from here on
    ps.start()
    if os.environ["DMLC_WORKER_ID"] == "0":   # a daemon outside the process tree (its parent exits)
        subprocess.run(["sh", "-c", "sleep 300 > /dev/null 2>&1 & echo $! > daemon.pid"], check=True)
    with open(os.path.join(os.environ["OUT"], "started." + os.environ["DMLC_WORKER_ID"]), "w") as f:
        f.write(str(os.getpid()))
    while True:
        time.sleep(0.1)
""")


@needs_mpirun
@pytest.mark.timeout(120)
def test_killed_launcher_takes_every_process_of_its_job_with_it(tmp_path):
    log = open(tmp_path / "launcher.log", "w")
    tmp = tmp_path / "tmp"   # the job's work folder and Open MPI's session folder go here
    tmp.mkdir()
    env = dict(os.environ, OUT=str(tmp_path), TMPDIR=str(tmp))
    launcher = jobs.Job([sys.executable, str(RUNNER), "-w", "2", "-s", "1", "--kill-grace", "3",
                         sys.executable, "-c", WORKER_THAT_TRAINS_ON],
                        stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    log.close()
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("started.*"))) < 2:
            assert launcher.poll() is None and time.monotonic() < deadline, (tmp_path / "launcher.log").read_text()
            time.sleep(0.1)
        daemon = int((tmp_path / "daemon.pid").read_text())
        assert daemon not in descendants(launcher.pid) and alive(daemon)
        job = descendants(launcher.pid) + [daemon]
        worker_pids = [int(p.read_text()) for p in tmp_path.glob("started.*")]
        assert set(worker_pids) <= set(job) and len(job) >= 5, job   # guard, scheduler, server, mpirun, workers
        segments = {line.split()[5] for pid in worker_pids for line in open(f"/proc/{pid}/maps")
                    if len(line.split()) == 6 and line.split()[5].startswith("/dev/shm/vader_segment.")}
        sessions = list(tmp.glob("ompi.*/pid.*"))
        assert segments and sessions and list(tmp.glob("heturun-*")), (segments, list(tmp.rglob("*"))[:20])
        launcher.kill()
        killed = time.monotonic()
        launcher.wait()
        while any(alive(p) for p in job) and time.monotonic() - killed < 10:
            time.sleep(0.1)
        left = [p for p in job if alive(p)]
        assert not left, f"still running 10 s after the launcher died: {left}"
        guard_deadline = time.monotonic() + 15
        while (list(tmp.glob("heturun-*")) or any(map(os.path.exists, segments)) or any(s.exists() for s in sessions)) \
                and time.monotonic() < guard_deadline:
            time.sleep(0.1)
        assert not list(tmp.glob("heturun-*")), "the launcher's work folder is left"
        assert not [s for s in segments if os.path.exists(s)], "Open MPI's shared-memory segments are left"
        assert not [s for s in sessions if s.exists()], "Open MPI's session folder is left"
        print(f"job ended {time.monotonic() - killed:.1f} s after the launcher was killed")
        text = (tmp_path / "launcher.log").read_text()
        assert f"the launcher (pid {launcher.pid} on " in text and "is gone; stopping its job: scheduler, " \
            "server 0, mpirun (workers)" in text, text[-3000:]
    finally:
        for pid in descendants(launcher.pid) if launcher.poll() is None else []:
            os.kill(pid, signal.SIGKILL)
        if launcher.poll() is None:
            launcher.kill()


@needs_mpirun
def test_a_finished_job_leaves_its_guard_quiet(tmp_path):
    proc = jobs.run([sys.executable, str(RUNNER), "-w", "1", "-s", "0", sys.executable, "-c", "pass"],
                    capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "is gone" not in proc.stderr


def test_cluster_file_of_binary_garbage_is_one_line(tmp_path):
    garbage = tmp_path / "cluster.yml"
    garbage.write_bytes(bytes(np.random.default_rng(0).integers(0, 256, 300, dtype=np.uint8)))
    proc = jobs.run([sys.executable, str(RUNNER), "-c", str(garbage), "true"],
                    capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"heturun: error: {garbage}: not a text file") and \
        len(proc.stderr.strip().splitlines()) == 1, proc.stderr


# --------------------------------------------------------------------------- checkpoints

def checkpoint_step(folder):
    return json.loads((folder / "meta.json").read_text())["iteration"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("point", STOP_POINTS)
def test_save_killed_at_each_step_of_the_swap_leaves_a_checkpoint(tmp_path, data_home, point):
    ckpt = tmp_path / "ckpt"
    previous = tmp_path / "ckpt.previous"
    proc = run_hetu(data_home, "--checkpoint", str(ckpt))
    assert proc.returncode == 0 and checkpoint_step(ckpt) == 20, proc.stderr
    proc = run_hetu(data_home, "--nepoch", "2", "--resume", str(ckpt), "--checkpoint", str(ckpt),
                    env={"HETU_CHECKPOINT_STOP_AT": point})
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    temporaries = [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-ckpt.")]
    if point == "written":        # the new one is complete but not yet in place
        assert checkpoint_step(ckpt) == 20 and not previous.exists() and len(temporaries) == 1
    elif point == "old-set-aside":
        assert not ckpt.exists() and checkpoint_step(previous) == 20 and len(temporaries) == 1
    else:
        assert checkpoint_step(ckpt) == 40 and checkpoint_step(previous) == 20 and not temporaries

    proc = run_hetu(data_home, "--nepoch", "3", "--resume", str(ckpt), "--checkpoint", str(ckpt))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    used = previous if point == "old-set-aside" else ckpt
    first = 40 if point == "new-in-place" else 20
    assert f"resumed at step {first} from {used}" in proc.stdout, proc.stdout
    if point == "old-set-aside":
        assert f"--resume {ckpt}: {ckpt} is missing (a save was interrupted while replacing it): using the " \
               f"checkpoint before it, {previous}" in proc.stdout, proc.stdout
    # The next save cleaned up after the interrupted one.
    assert checkpoint_step(ckpt) == 60 and not previous.exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("ckpt", ".tmp"))) == ["ckpt"]


def flip_byte(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x10]))


@pytest.mark.timeout(300)
def test_damaged_checkpoint_files_are_named(tmp_path, data_home):
    ckpt = tmp_path / "ckpt"
    proc = run_hetu(data_home, "--checkpoint", str(ckpt))
    assert proc.returncode == 0, proc.stderr
    arrays = ckpt / "arrays.npz"
    size = arrays.stat().st_size
    flip_byte(arrays, size // 2)
    one_line_error(run_hetu(data_home, "--nepoch", "2", "--resume", str(ckpt)),
                   f"--resume {ckpt}: checkpoint file {arrays} is corrupt: its content differs from its sha256")
    flip_byte(arrays, size // 2)   # back as saved
    with open(arrays, "ab") as f:
        f.write(b"garbage")
    one_line_error(run_hetu(data_home, "--nepoch", "2", "--resume", str(ckpt)),
                   f"--resume {ckpt}: checkpoint file {arrays} has 7 bytes appended since it was saved")
    os.truncate(arrays, size)
    assert run_hetu(data_home, "--nepoch", "2", "--resume", str(ckpt)).returncode == 0   # intact again
    (ckpt / "meta.json").write_text('{"iteration": 20, ')
    one_line_error(run_hetu(data_home, "--nepoch", "2", "--resume", str(ckpt)),
                   f"--resume {ckpt}: {ckpt}/meta.json is not valid JSON")


@needs_mpirun
@pytest.mark.timeout(400)
def test_damaged_server_shards_are_named(tmp_path, data_home):
    ckpt = tmp_path / "ckpt"
    proc = run_hetu(data_home, "--comm", "PS", "--checkpoint", str(ckpt), launcher=local_cluster(1))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    shard = ckpt / "ps" / "embedding.shard0-of-1.bin"
    files = json.loads((ckpt / "meta.json").read_text())["files"]
    assert "ps/embedding.shard0-of-1.bin" in files, files
    size = shard.stat().st_size
    flip_byte(shard, size // 3)   # within the rows' values
    one_line_error(run_hetu(data_home, "--comm", "PS", "--nepoch", "2", "--resume", str(ckpt),
                            launcher=local_cluster(1)),
                   f"--resume {ckpt}: checkpoint file {shard} is corrupt")
    flip_byte(shard, size // 3)
    with open(shard, "ab") as f:
        f.write(b"\0" * 16)
    one_line_error(run_hetu(data_home, "--comm", "PS", "--nepoch", "2", "--resume", str(ckpt),
                            launcher=local_cluster(1)),
                   f"--resume {ckpt}: checkpoint file {shard} has 16 bytes appended since it was saved")


SHARD_WITH_A_TAIL = """
t = ps.client().init_table("emb", 64, 4, init=("constant", 1.0))
t.save(ARGS["dir"]).wait()
with open(os.path.join(ARGS["dir"], "emb.shard0-of-1.bin"), "ab") as f:
    f.write(b"tail")
try:
    t.load(ARGS["dir"]).wait()
    print("LOADED", flush=True)
except RuntimeError as e:
    print("ERROR:", e, flush=True)
ps.finalize()
"""


@pytest.mark.timeout(60)
def test_server_refuses_a_shard_file_with_bytes_after_its_data(cluster, tmp_path):
    # The check of the servers' own, for shard files that no meta.json lists.
    c = cluster(1, 1).run(SHARD_WITH_A_TAIL, args={"dir": str(tmp_path / "shards")})
    out = c.log("worker0")
    assert f"{tmp_path}/shards/emb.shard0-of-1.bin has bytes after the shard's data" in out and "LOADED" not in out, out


# --------------------------------------------------------------------------- reports

def test_failing_report_keeps_the_trained_parameters(tmp_path, data_home):
    csv_dir, params = tmp_path / "csv", tmp_path / "params.npz"
    csv_dir.mkdir()
    csv = csv_dir / "wdl_criteo-single-worker0.csv"
    # Whatever the report writes goes to /dev/full: a full disk.
    os.symlink("/dev/full", str(csv) + ".tmp")
    proc = run_hetu(data_home, "--cache-perf", "--csv-dir", str(csv_dir), "--save-params", str(params))
    one_line_error(proc, f"--cache-perf: cannot write {csv}: No space left on device")
    assert proc.returncode == 1
    assert sorted(np.load(params).files), "the trained parameters were not written"
    assert os.listdir(csv_dir) == [], "a partial report was left behind"


# --------------------------------------------------------------------------- data files

@pytest.fixture
def dataset(tmp_path):
    return generate_synthetic(tmp_path / "data", rows=2000, progress=False)


def test_truncated_npy_is_named(dataset):
    sparse = dataset / "sparse.npy"
    os.truncate(sparse, sparse.stat().st_size - 100)
    with pytest.raises(ValueError, match=f"{sparse} is truncated: .* its header describes int64\\[2000, 26\\]"):
        load_dataset(dataset)
    proc = jobs.run([sys.executable, str(RUN_HETU), "--data-dir", str(dataset), "--no-progress"],
                    capture_output=True, text=True, timeout=120)
    one_line_error(proc, f"--data-dir {dataset}: {sparse} is truncated")


def test_invalid_meta_json_is_not_reported_missing(dataset):
    (dataset / "meta.json").write_text('{"name": "synthetic", ')
    with pytest.raises(ValueError, match=f"{dataset}/meta.json is not valid JSON"):
        load_dataset(dataset)


def test_num_embeddings_below_the_ids_is_caught_at_load(dataset):
    meta = json.loads((dataset / "meta.json").read_text())
    meta["num_embeddings"] = meta["field_offsets"][-1]   # the last field's ids lie beyond it
    (dataset / "meta.json").write_text(json.dumps(meta))
    proc = jobs.run([sys.executable, str(RUN_HETU), "--data-dir", str(dataset), "--no-progress"],
                    capture_output=True, text=True, timeout=120)
    one_line_error(proc, f"{dataset}/meta.json: field 25 (C26) holds ids [{meta['field_offsets'][-1]}, ")
    assert f"outside num_embeddings {meta['num_embeddings']}" in proc.stderr


# --------------------------------------------------------------------------- frames

def wait_port(port, timeout=20):
    deadline = time.time() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            assert time.time() < deadline, f"nothing listens on {port}"
            time.sleep(0.05)


GOOD = """
t = ps.client().init_table("emb", 64, 4, init=("constant", 1.0))
t.push(np.arange(64), np.ones((64, 4)), iteration=0, lr=0.5).wait()
got = t.pull(np.arange(64), iteration=1).wait()
assert np.all(got == 1.0 - 0.5 * ps.num_workers()), got
ps.finalize()
"""


@pytest.mark.timeout(60)
def test_frame_above_the_limit_is_refused_and_the_job_goes_on(cluster):
    zmq = pytest.importorskip("zmq")
    limit = 1 << 20
    c = cluster(1, 1, env={"PS_VERBOSE": "1", "PS_MAX_FRAME_BYTES": str(limit)})
    c.start_servers(fixed_ports=True)
    port = c.server_ports[0]
    ctx = zmq.Context()
    try:
        wait_port(port)
        # A member of the job (it holds the secret): past the handshake, its frames are read.
        secret = c.base_env["HETU_JOB_SECRET"]
        d = zmq_job_dealer(ctx, port, secret)
        d.send(b"x" * (2 * limit))            # one frame over the limit: refused unread
        d.close()
        d = zmq_job_dealer(ctx, port, secret)
        d.send_multipart([b"y" * 1000] * 3)   # small garbage: read, then dropped (no message tag)
        d.close()
    finally:
        ctx.term()
    c.start_workers(GOOD)
    codes = c.wait(c.worker_names() + c.server_names(), timeout=40)
    assert all(v == 0 for v in codes.values()), (codes, c.logs())
    log = c.log("server0")
    # The ROUTER adds the sender's identity frame: 3 frames arrive as 4, the oversized one as 2.
    assert "dropped a message without this job's authentication tag" in log, log
    assert "dropped a malformed message of 2 frames" not in log, log
