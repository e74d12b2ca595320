"""A server writes only into the job's checkpoints (HETU_CHECKPOINT_ROOT): NAME, NAME.previous
and NAME's temporary folders, not the rest of the folder holding them; refused saves and loads
and every clear leave a line on the server, rate-limited."""
import json
import re

import pytest

from ps_helpers import cluster_fixture

cluster = pytest.fixture(cluster_fixture)

SAVES = """
t = ps.client().init_table("emb", 40, 4, init=("normal", 0.0, 0.1), seed=7)
results = {}
for name, path in ARGS["paths"].items():
    try:
        (t.load if name.startswith("load") else t.save)(path).wait()
        results[name] = "ok"
    except RuntimeError as e:
        results[name] = str(e)
t.clear().wait()
json.dump(results, open(OUT + ".json", "w"))
ps.finalize()
"""


def test_a_server_writes_only_the_checkpoint_its_previous_and_its_temporaries(cluster, tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    checkpoint = runs / "ckpt"
    allowed = {"itself": checkpoint / "servers", "previous": runs / "ckpt.previous" / "servers",
               "temporary": runs / ".tmp-ckpt.ab_12xyz" / "servers", "load_itself": checkpoint / "servers"}
    refused = {"sibling": runs / "other" / "servers", "parent": runs, "longer_name": runs / "ckpt2" / "servers",
               "not_a_temporary": runs / ".tmp-ckpt.short" / "servers",
               "another_previous": runs / "ckpt.previous2" / "servers", "load_sibling": runs / "other" / "servers"}
    c = cluster(1, 1, env={"HETU_CHECKPOINT_ROOT": str(checkpoint) + "/"})
    c.run(SAVES, args={"paths": {k: str(v) for k, v in {**allowed, **refused}.items()}})
    results = json.loads((tmp_path / "worker0.json").read_text())
    assert all(results[name] == "ok" for name in allowed), results
    for name, path in refused.items():
        verb = "load" if name.startswith("load") else "save"
        assert results[name].endswith(
            f"table 'emb': {verb} of {path} refused: it is outside the job's checkpoint folder (HETU_CHECKPOINT_ROOT: "
            f"{checkpoint}): a server writes only into a checkpoint listed there, its .previous and its saves' "
            ".tmp-* folders"), (name, results[name])
    assert sorted(p.name for p in runs.iterdir()) == [".tmp-ckpt.ab_12xyz", "ckpt", "ckpt.previous"]

    log = c.log("server0")
    # Six refusals within a second: the first is logged, the rest held back (at most a line per 5 s).
    refusals = [line for line in log.splitlines() if "refused" in line]
    assert len(refusals) == 1, log
    assert re.search(r"^\[ps\] server 0: table 'emb': save of \S+/runs/other/servers refused: .* \(asked by worker 0 "
                     r"\(node \d+ at 127\.0\.0\.1:\d+\)\)$", refusals[0]), refusals
    assert re.search(r"^\[ps\] server 0: table 'emb' cleared \(asked by worker 0 \(node \d+ at 127\.0\.0\.1:\d+\)\)$",
                     log, re.M), log
