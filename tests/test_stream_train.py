"""Training on a stream (docs/design.md section 14): a directory of Criteo-format files trains the model
the folder prepared from the same files trains; every mode equals the single process on the same
stream, parameter by parameter, with the same progressive validation windows; a job follows files
landing while it runs and ends after --stream-idle-exit."""
import re
import subprocess
import sys
import time

import numpy as np
import pytest

import jobs
from conftest import REPO
from dist_harness import assert_same_parameters, run_cluster, run_single, _summary

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

SAMPLES, PER_FILE, GLOBAL_BATCH, WINDOW = 2430, 600, 60, 500
TRAINED = SAMPLES // GLOBAL_BATCH * GLOBAL_BATCH
# A table far smaller than the keys the stream reads, with a TTL: keys are admitted, evicted and
# come back during the run.
MODEL = ["--model", "wdl_criteo", "--embedding-size", "8", "--optimizer", "sgd", "--learning-rate", "0.02",
         "--table-capacity", "1024", "--admit-after", "1", "--evict-ttl", "5"]
COMMON = ["--no-progress"]
MODES = {"PS": ["--comm", "PS", "--bsp", "0"],
         "HET": ["--comm", "Hybrid", "--cache", "lru", "--bound", "0", "--bsp", "0"],
         "Herald": ["--comm", "Hybrid", "--cache", "lru", "--bound", "0", "--bsp", "0"]}


def prepare(*args):
    proc = jobs.run([sys.executable, "-m", "hetu.data.prepare", *args, "--quiet"], timeout=120)
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()


@pytest.fixture(scope="module")
def stream_files(tmp_path_factory):
    """Criteo-format files of a drifting synthetic stream (prepare synthetic --ids hashed --drift,
    written by hetu.data.stream_writer), SAMPLES lines in files of PER_FILE."""
    root = tmp_path_factory.mktemp("stream")
    prepare("synthetic", "--output", str(root / "synthetic"), "--rows", str(SAMPLES), "--val-fraction", "0",
            "--ids", "hashed", "--drift", "1")
    proc = jobs.run([sys.executable, "-m", "hetu.data.stream_writer", "--input", str(root / "synthetic"),
                     "--output", str(root / "files"), "--lines-per-file", str(PER_FILE), "--quiet"], timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    return root / "files"


def stream_args(files, tmp_path, *extra):
    return [*MODEL, "--stream", str(files), "--stream-idle-exit", "1", "--window", str(WINDOW),
            "--csv-dir", str(tmp_path / "csv"), *extra]


@pytest.fixture(scope="module")
def single(stream_files, tmp_path_factory, data_home):
    """The single process on the stream: (parameters, summary)."""
    tmp = tmp_path_factory.mktemp("single")
    return run_single(tmp, data_home, "run_hetu.py", stream_args(stream_files, tmp), GLOBAL_BATCH, common=COMMON)


def test_a_stream_trains_what_its_prepared_folder_trains(tmp_path, data_home, stream_files, single):
    """The same files, concatenated and prepared with --ids hashed (no validation split), train the
    same model; the stream reports its incomplete last global batch as not trained."""
    text = tmp_path / "train.txt"
    text.write_bytes(b"".join(f.read_bytes() for f in sorted(stream_files.iterdir())))
    prepare("criteo", "--input", str(text), "--output", str(tmp_path / "prepared"), "--ids", "hashed",
            "--val-fraction", "0")
    folder, _ = run_single(tmp_path, data_home, "run_hetu.py",
                           [*MODEL, "--data-dir", str(tmp_path / "prepared"), "--nepoch", "1"], GLOBAL_BATCH,
                           common=COMMON)
    stream, summary = single
    assert summary["iterations"] == TRAINED // GLOBAL_BATCH
    assert summary["final"]["not_trained"] == SAMPLES - TRAINED
    assert_same_parameters(folder, stream, exact_rows=True)


def test_windows_of_the_single_process(single, tmp_path):
    _, summary = single
    windows = summary["final"]["windows"]
    # Full windows, then the partial last one of the samples trained.
    assert [(w["first_sample"], w["last_sample"]) for w in windows] == \
        [(a, min(a + WINDOW, TRAINED) - 1) for a in range(0, TRAINED, WINDOW)]
    assert all(0.4 < w["auc"] < 1 and 0 < w["logloss"] < 1.5 and w["lag_seconds"] >= 0 for w in windows)


@pytest.mark.parametrize("mode,workers,servers", [("PS", 2, 1), ("HET", 3, 2), ("Herald", 2, 2), ("Herald", 3, 1)])
def test_every_mode_equals_the_single_process(tmp_path, data_home, stream_files, single, mode, workers, servers):
    """Parameters, and the windows' AUC and logloss, over every worker's predictions."""
    reference, summary = single
    script = "run_laia.py" if mode == "Herald" else "run_hetu.py"
    got, stdout = run_cluster(tmp_path, data_home, script, [*MODES[mode], *stream_args(stream_files, tmp_path)],
                              workers, servers, GLOBAL_BATCH // workers, common=COMMON)
    evicted = sum(int(m) for m in re.findall(r"table embedding server \d+: .*?(\d+) evicted", stdout))
    assert evicted > 0, stdout[-3000:]
    assert_same_parameters(reference, got, exact_rows=True)
    windows = _summary(stdout)["final"]["windows"]
    expected = summary["final"]["windows"]
    assert [(w["first_sample"], w["last_sample"]) for w in windows] == \
        [(w["first_sample"], w["last_sample"]) for w in expected]
    for w, e in zip(windows, expected):
        assert abs(w["auc"] - e["auc"]) < 1e-6 and abs(w["logloss"] - e["logloss"]) < 1e-6, (w, e)
    lines = [line for line in stdout.splitlines() if re.match(r"\[worker 0\] window \d+: samples", line)]
    assert len(lines) == len(expected), stdout[-3000:]


def test_a_job_follows_files_landing_and_ends_when_idle(tmp_path, stream_files):
    """Files land while the job runs (written under a dot name and renamed); it trains every
    complete global batch, writes the windows to CSV and TensorBoard, and ends after
    --stream-idle-exit seconds without a new sample."""
    follow = tmp_path / "follow"
    follow.mkdir()
    board = tmp_path / "board"
    cmd = [sys.executable, str(REPO / "examples/ctr/run_hetu.py"), *COMMON, *MODEL, "--stream", str(follow),
           "--stream-idle-exit", "3", "--window", str(WINDOW), "--csv-dir", str(tmp_path / "csv"),
           "--tensorboard", str(board), "--batch-size", str(GLOBAL_BATCH)]
    with jobs.Job(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as job:
        for f in sorted(stream_files.iterdir()):
            (follow / f".{f.name}.tmp").write_bytes(f.read_bytes())
            (follow / f".{f.name}.tmp").rename(follow / f.name)
            time.sleep(0.5)
        out, err = job.communicate(timeout=120)
    assert job.returncode == 0, out + err
    summary = _summary(out)
    assert summary["iterations"] == TRAINED // GLOBAL_BATCH and summary["final"]["not_trained"] == SAMPLES - TRAINED
    assert f"samples 0-{TRAINED - 1}; {SAMPLES - TRAINED} samples read after them not trained" in out
    rows = (tmp_path / "csv" / "wdl_criteo-single-windows.csv").read_text().splitlines()
    assert rows[0].startswith("window,first_sample,last_sample") and len(rows) == 1 + len(summary["final"]["windows"])
    assert list(board.glob("events.out.tfevents.*"))


def test_standard_input_ends_the_stream(tmp_path, stream_files):
    """`--stream -` trains until standard input ends (no idle limit needed)."""
    text = b"".join(f.read_bytes() for f in sorted(stream_files.iterdir()))
    cmd = [sys.executable, str(REPO / "examples/ctr/run_hetu.py"), *COMMON, *MODEL, "--stream", "-",
           "--window", str(WINDOW), "--csv-dir", str(tmp_path), "--batch-size", str(GLOBAL_BATCH)]
    proc = jobs.run(cmd, input=text, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    assert _summary(proc.stdout.decode())["iterations"] == TRAINED // GLOBAL_BATCH


def test_a_bad_line_stops_the_job_naming_file_and_line(tmp_path, stream_files):
    """Without --skip-bad-lines a bad line ends the job in one line naming it; with it, it is
    skipped and counted."""
    folder = tmp_path / "bad"
    folder.mkdir()
    first = sorted(stream_files.iterdir())[0]
    (folder / first.name).write_bytes(first.read_bytes())
    (folder / "part-99999.txt").write_text("1\tnot a line of criteo\n")
    cmd = [sys.executable, str(REPO / "examples/ctr/run_hetu.py"), *COMMON, *MODEL, "--stream", str(folder),
           "--stream-idle-exit", "1", "--csv-dir", str(tmp_path), "--batch-size", str(GLOBAL_BATCH)]
    proc = jobs.run(cmd, timeout=120)
    err = proc.stderr.decode()
    assert proc.returncode != 0 and "part-99999.txt:1: " in err and "Traceback" not in err, err
    proc = jobs.run([*cmd, "--skip-bad-lines"], timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    assert "; 1 bad lines skipped" in proc.stdout.decode()
    assert _summary(proc.stdout.decode())["iterations"] == PER_FILE // GLOBAL_BATCH


def test_a_file_without_its_last_newline_is_ended_by_the_next(tmp_path, data_home, stream_files, single):
    """Every file's last "\\n" missing: each file's last line is read once the next file is there
    (the last file's waits, and the end line says so): the model of the files with their newlines."""
    cut = tmp_path / "cut"
    cut.mkdir()
    for f in sorted(stream_files.iterdir()):
        (cut / f.name).write_bytes(f.read_bytes()[:-1])
    got, summary = run_single(tmp_path, data_home, "run_hetu.py", stream_args(cut, tmp_path), GLOBAL_BATCH,
                              common=COMMON)
    reference, expected = single
    assert summary["iterations"] == expected["iterations"] == TRAINED // GLOBAL_BATCH
    assert summary["final"]["not_trained"] == SAMPLES - TRAINED - 1   # the last file's last line waits
    assert sorted(got) == sorted(reference)
    for name, value in reference.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_skipped_lines_are_printed_once_per_job_and_counted(tmp_path, data_home, stream_files):
    """--skip-bad-lines on two workers: worker 0 alone prints the first bad lines (printable) and
    each file's count; the summary counts them."""
    folder = tmp_path / "bad"
    folder.mkdir()
    binary = b"1\t\x00\x1b[2J\xff" + b"z" * 500 + b"\n"
    first, second = sorted(stream_files.iterdir())[:2]
    lines = first.read_bytes().splitlines(keepends=True)
    for i in range(10, 80, 10):
        lines.insert(i, binary)
    (folder / first.name).write_bytes(b"".join(lines))
    (folder / second.name).write_bytes(binary + second.read_bytes())
    _, out = run_cluster(tmp_path, data_home, "run_hetu.py",
                         [*MODES["PS"], *stream_args(folder, tmp_path), "--skip-bad-lines"], 2, 1,
                         GLOBAL_BATCH // 2, common=COMMON, stderr=True)
    skipped = [line for line in out.splitlines() if "stream: skipping bad line: " in line]
    assert len(skipped) == 5 and all(line.startswith("[worker 0] ") for line in skipped), out[-3000:]
    assert all(line.isprintable() and len(line) < 250 + len(str(folder)) for line in skipped), skipped
    assert f"[worker 0] stream: {folder / first.name}: 7 bad lines skipped" in out, out[-3000:]
    assert "[worker 1] stream:" not in out, out[-3000:]
    final = _summary(out)["final"]
    assert final["bad_lines"] == 8 and final["bad_lines_by_file"] == {first.name: 7, second.name: 1}
    assert final["samples"] + final["not_trained"] == 2 * PER_FILE
    assert "; 8 bad lines skipped" in out


@pytest.mark.parametrize("flags,message", [
    (["--stream", "DIR"], "--stream: a stream's ids are hashed keys, which need dynamic tables: give --table-capacity"),
    (["--stream", "DIR", "--table-capacity", "64", "--val"], "--stream: --val is for a prepared folder"),
    (["--stream-idle-exit", "3"], "--stream-idle-exit needs --stream DIR|-"),
])
def test_flags_a_stream_refuses(flags, message):
    proc = jobs.run([sys.executable, str(REPO / "examples/ctr/run_hetu.py"), *flags], timeout=60)
    assert proc.returncode == 2 and message in proc.stderr.decode(), proc.stderr.decode()
