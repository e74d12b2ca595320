"""The serving watcher (hetu.serve.watch, docs/design.md "Live updates"), in process over real
checkpoints: a chain of deltas with a hole is said in one line and served up to the hole, never
past it; a checkpoint whose run record makes it another model (here another embedding size) is
refused in one line; a checkpoint of the same model's configuration is a new version."""
import asyncio
import shutil

import pytest

pytest.importorskip("onnxruntime")

from hetu.serve.batching import ServedBundle  # noqa: E402
from hetu.serve.bundle import Bundle  # noqa: E402
from hetu.serve.export import checkpoint_version, export  # noqa: E402
from hetu.serve.watch import CheckpointWatcher  # noqa: E402
from test_serve_http import train  # noqa: E402

SAVES = ["--nepoch", "1", "--checkpoint-every", "7", "--checkpoint-full-every", "10"]   # full at 7, deltas after


def look(watcher, times=1):
    async def looks():
        for _ in range(times):
            await watcher.look()
    asyncio.run(looks())


def watching(tmp_path, folder, served):
    lines = []
    watcher = CheckpointWatcher(str(folder), served, str(tmp_path / "work"), lines.append)
    return watcher, lines


def test_a_hole_in_the_deltas_is_said_and_another_model_refused(tmp_path, data_home):
    job = tmp_path / "job"
    train(data_home, [*SAVES, "--checkpoint", str(job)])
    assert sorted(p.name for p in (job / "deltas").iterdir()) == ["000001", "000002", "000003", "000004"]
    first = tmp_path / "first"   # the job's full save alone: version 7
    shutil.copytree(job, first)
    shutil.rmtree(first / "deltas")
    (tmp_path / "work").mkdir()
    served = ServedBundle(Bundle.open(export(str(first), str(tmp_path / "bundle"))))
    assert served.bundle.version == 7

    holed = tmp_path / "holed"
    shutil.copytree(job, holed)
    shutil.rmtree(holed / "deltas" / "000002")
    watcher, lines = watching(tmp_path, holed, served)
    look(watcher, 3)
    assert served.bundle.version == 14, lines   # the full save and delta 1: not past the hole
    assert len(lines) == 2, lines
    assert "000003 is number 3 of the chain, where number 2 belongs (a delta is missing)" in lines[0], lines
    assert lines[0].endswith("serving no version past it (the last before it: 14)"), lines
    assert lines[1].startswith("serving version 14"), lines
    watcher.close()

    other = tmp_path / "other"
    train(data_home, ["--nepoch", "2", "--embedding-size", "16", "--checkpoint", str(other)])
    assert checkpoint_version(str(other)) > served.bundle.version
    watcher, lines = watching(tmp_path, other, served)
    look(watcher, 3)
    assert served.bundle.version == 14 and len(lines) == 1, lines
    assert lines[0].endswith("not served: it is another model than the one served, trained with embedding_size 16 "
                             "(served: 8)"), lines
    watcher.close()

    watcher, lines = watching(tmp_path, job, served)   # the same configuration: a new version
    look(watcher)
    assert served.bundle.version == 30 and len(lines) == 1 and lines[0].startswith("serving version 30"), lines
    watcher.close()
    served.close()
