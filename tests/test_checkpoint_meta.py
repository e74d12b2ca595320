"""A checkpoint's meta.json records the sha256 of its own content (docs/design.md section 4): a
changed byte in it (a step, a mark, a file's checksum) is refused in one line naming the file,
as a changed byte in any other file of the checkpoint is."""
import json
import os
import sys

import pytest

import jobs
from conftest import REPO
from dist_harness import COMMON, THREADS
from hetu import checkpoint


def sealed(folder, **meta):
    folder.mkdir()
    (folder / "arrays.npz").write_bytes(b"rows")
    checkpoint.seal(str(folder), {"iteration": 70, "mark": 5, "clocks": {"7": 1}, **meta})
    return folder / "meta.json"


def test_a_changed_byte_of_meta_json_is_refused_naming_it(tmp_path):
    path = sealed(tmp_path / "c")
    meta = checkpoint.read_meta(str(tmp_path / "c"))
    assert meta["iteration"] == 70 and meta["format"] == checkpoint.FORMAT
    text = path.read_text()
    for old, new in [('"iteration": 70', '"iteration": 60'), ('"mark": 5', '"mark": 6'),
                     ('"format": 2', '"format": 3'), ('"bytes": 4', '"bytes": 5')]:
        assert old in text
        path.write_text(text.replace(old, new, 1))
        with pytest.raises(ValueError, match=f"checkpoint file {path} is corrupt: .* sha256 it records of itself"):
            checkpoint.read_meta(str(tmp_path / "c"))
    # The digest's own key or the format's renamed by one byte: damage, not an older format.
    for old, new in [('"meta_sha256"', '"meta_sha257"'), ('"format"', '"formaT"')]:
        path.write_text(text.replace(old, new, 1))
        with pytest.raises(ValueError, match=f"checkpoint file {path} is corrupt"):
            checkpoint.read_meta(str(tmp_path / "c"))
    path.write_text(text)
    assert checkpoint.read_meta(str(tmp_path / "c")) == meta


def test_a_meta_json_written_before_the_format_is_read_unchecked(tmp_path):
    path = sealed(tmp_path / "c")
    meta = json.loads(path.read_text())
    del meta["format"], meta["meta_sha256"]
    path.write_text(json.dumps(meta))
    assert checkpoint.read_meta(str(tmp_path / "c")) == meta


@pytest.mark.timeout(300)
def test_a_resume_from_a_delta_whose_step_was_edited_is_refused(tmp_path, data_home):
    ckpt = tmp_path / "ckpt"
    env = dict(os.environ, HETU_DATA_HOME=data_home, **THREADS)
    base = [sys.executable, str(REPO / "examples/ctr/run_hetu.py"), *COMMON, "--optimizer", "sgd",
            "--batch-size", "64", "--checkpoint", str(ckpt), "--checkpoint-every", "4", "--checkpoint-full-every", "3"]
    proc = jobs.run([*base, "--nepoch", "0.3"], capture_output=True, text=True, timeout=250, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    path = ckpt / "deltas" / "000001" / "meta.json"
    text = path.read_text()
    assert '"iteration": 8' in text
    path.write_text(text.replace('"iteration": 8', '"iteration": 6', 1))
    proc = jobs.run([*base, "--nepoch", "1", "--resume", str(ckpt)], capture_output=True, text=True, timeout=250,
                    env=env)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert f"--resume {ckpt}: " in last and last.endswith(
        f"checkpoint file {path} is corrupt: its content differs from the sha256 it records of itself (meta_sha256))"), \
        proc.stderr
