"""The servers' admit (dynamic tables, docs/design.md section 13): a slot's row becomes its key's
initial row (hetu._C.key_rows) with zero optimizer state and steps and a newer version, between
the pushes of the iteration before and those of its own, once however many workers send it.
Real scheduler, 2 servers and 2 workers on loopback."""
import json

import numpy as np
import pytest

from hetu import _C
from ps_helpers import cluster_fixture, optim_config

cluster = pytest.fixture(cluster_fixture)

ROWS, WIDTH, LR = 64, 8, 0.1
STORAGE = {"fp32": 0, "bf16": 1}
# Unsorted, on both servers (strided placement: even slots on server 0, odd ones on server 1).
SLOTS = [40, 3, 11, 10]
KEYS = [123456789, -5, 2 ** 40 + 7, 99]
LATER_SLOTS, LATER_KEYS = [5, 20], [7, 8]
CONTROL = 7  # stepped with the slots at iteration 0, never admitted

ADMIT = """
from hetu import _C
r = ps.rank()
c = ps.client()
emb = c.init_table("emb", ARGS["rows"], ARGS["width"], init=("normal", 0.0, 0.1), seed=7, optimizer="adam",
                   storage=ARGS["storage"])
slots, keys = np.array(ARGS["slots"], np.int64), np.array(ARGS["keys"], np.int64)
later_slots, later_keys = np.array(ARGS["later_slots"], np.int64), np.array(ARGS["later_keys"], np.int64)
stepped = np.append(slots, ARGS["control"])
lr = ARGS["lr"]

def grads(t, n):
    return np.random.default_rng([r, t]).standard_normal((n, ARGS["width"])).astype(np.float32)

def error_of(call):
    try:
        call()
    except RuntimeError as e:
        return str(e)
    return None

# Iteration 0 steps the slots' rows under their old keys. Worker 1 pushes late: worker 0's admit
# of iteration 1, sent at once, must still land after that push is applied.
if r == 1:
    time.sleep(0.5)
emb.push(stepped, grads(0, len(stepped)), iteration=0, lr=lr).wait()
emb.admit(slots, keys, iteration=1).wait()
emb.admit(slots, keys, iteration=1).wait()  # the same admit again (and the other worker's): one reset
admitted = emb.pull_with_state(stepped, iteration=1).wait()
stale = emb.pull_stale(slots, np.full(len(slots), 2, np.int64), bound=0, iteration=1).wait()
current = emb.pull_stale(slots, admitted[3][:len(slots)], bound=0, iteration=1).wait()
emb.push(slots, grads(1, len(slots)), iteration=1, lr=lr).wait()
# The later keys' rows drawn by the worker, as hetu.rows sends them: the server only copies them.
drawn = np.empty((len(later_keys), ARGS["width"]), np.float32)
_C.key_rows(2, 0.0, 0.1, 7, _C.name_stream("emb"), later_keys, drawn)
try:
    emb.admit(later_slots, later_keys, rows=drawn[:, :-1], iteration=2)
    wrong_width = None
except ValueError as e:
    wrong_width = str(e)
emb.admit(later_slots, later_keys, rows=drawn, iteration=2).wait()
errors = {"two keys at one iteration": error_of(
    lambda: emb.admit(later_slots[:1], later_keys[:1] + 1000, iteration=2).wait())}
after = emb.pull_with_state(np.concatenate([slots, later_slots]), iteration=2).wait()
errors["late"] = error_of(lambda: emb.admit(slots, keys, iteration=1).wait())
errors["rows of another width"] = wrong_width
errors["slot past the rows"] = error_of(lambda: emb.admit([ARGS["rows"]], [1]).wait())
errors["negative slot"] = error_of(lambda: emb.admit([-1], [1]).wait())
errors["two keys in one request"] = error_of(lambda: emb.admit([9, 9], [1, 2]).wait())
# ASP: an untagged admit applies on arrival.
asp = c.init_table("asp", ARGS["rows"], ARGS["width"], init=("normal", 0.0, 0.1), seed=7, optimizer="adam",
                   bsp=False, storage=ARGS["storage"])
if r == 0:
    asp.admit(slots, keys).wait()
ps.barrier()
asp_rows = asp.pull(slots).wait()
stats = ps.server_stats()
np.savez(OUT + ".npz", rows=admitted[0], state=admitted[1], steps=admitted[2], versions=admitted[3],
         stale_positions=stale[0], stale_rows=stale[1], stale_versions=stale[2], current_positions=current[0],
         after_rows=after[0], after_state=after[1], after_steps=after[2], after_versions=after[3],
         asp_rows=asp_rows)
with open(OUT + ".json", "w") as f:
    json.dump(dict(errors=errors, admitted=[s["admitted"] for s in stats]), f)
ps.finalize()
"""


def key_rows(keys, storage, table="emb"):
    """The keys' initial rows as the table stores them."""
    out = np.empty((len(keys), WIDTH), np.float32)
    _C.key_rows(2, 0.0, 0.1, 7, _C.name_stream(table), np.array(keys, np.int64), out)
    _C.round_to_storage(out, STORAGE[storage])
    return out


def worker_grads(t, n, workers=2):
    """The gradients the workers push at iteration t, summed in rank order as the servers do."""
    total = None
    for r in range(workers):
        g = np.random.default_rng([r, t]).standard_normal((n, WIDTH)).astype(np.float32)
        total = g if total is None else total + g
    return total


@pytest.mark.timeout(120)
@pytest.mark.parametrize("storage", ["fp32", "bf16"])
def test_admit_resets_rows_once_between_iterations(cluster, tmp_path, storage):
    cluster(2, 2).run(ADMIT, dict(rows=ROWS, width=WIDTH, storage=storage, slots=SLOTS, keys=KEYS, lr=LR,
                                  later_slots=LATER_SLOTS, later_keys=LATER_KEYS, control=CONTROL), timeout=90)
    n = len(SLOTS)
    want = key_rows(KEYS, storage)
    # What the admitted rows are after the push of iteration 1: one Adam step from the key's row.
    cfg = optim_config("adam", storage=STORAGE[storage])
    stepped, state = want.copy(), np.zeros((n, _C.optim_state_width(cfg.kind, WIDTH)), np.float32)
    steps = np.zeros(n, np.int64)
    _C.apply_rows(cfg, np.float32(LR), stepped, state, steps, np.arange(n, dtype=np.int64), worker_grads(1, n))
    for w in range(2):
        got = np.load(tmp_path / f"worker{w}.npz")
        out = json.loads((tmp_path / f"worker{w}.json").read_text())
        # After the admit of iteration 1: the keys' rows, no state or steps, versions one past the
        # two pushes of iteration 0 (however many times the admit came); the control row keeps its step.
        assert np.array_equal(got["rows"][:n], want), w
        assert not got["state"][:n].any() and not got["steps"][:n].any(), w
        assert np.array_equal(got["versions"][:n], np.full(n, 3)), w
        assert got["steps"][n] == 1 and got["state"][n].any() and got["versions"][n] == 2, w
        assert not np.array_equal(got["rows"][n], key_rows([CONTROL], storage)[0]), w
        # A worker holding a row at its version before the admit gets the admitted row.
        assert np.array_equal(got["stale_positions"], np.arange(n)), w
        assert np.array_equal(got["stale_rows"], want) and np.array_equal(got["stale_versions"], np.full(n, 3)), w
        assert len(got["current_positions"]) == 0, w
        # The push of iteration 1 stepped the admitted rows once; the admit of iteration 2 (other
        # slots) left them alone.
        assert np.array_equal(got["after_rows"][:n], stepped), w
        assert np.array_equal(got["after_state"][:n], state), w
        assert np.array_equal(got["after_steps"][:n], np.ones(n)), w
        assert np.array_equal(got["after_versions"][:n], np.full(n, 5)), w
        assert np.array_equal(got["after_rows"][n:], key_rows(LATER_KEYS, storage)), w
        assert not got["after_state"][n:].any() and not got["after_steps"][n:].any(), w
        assert np.array_equal(got["after_versions"][n:], np.ones(len(LATER_SLOTS))), w
        assert np.array_equal(got["asp_rows"], key_rows(KEYS, storage, "asp")), w
        errors = out["errors"]
        assert "table 'emb'" in errors["slot past the rows"] and f"slot {ROWS}" in errors["slot past the rows"], errors
        assert "table 'emb'" in errors["negative slot"] and "slot -1" in errors["negative slot"], errors
        assert "disagree" in errors["two keys in one request"], errors
        assert "initial rows has 14 elements, expected 16" in errors["rows of another width"], errors
        assert "disagree" in errors["two keys at one iteration"] and "iteration 2" in errors["two keys at one iteration"]
        assert "after that iteration's pushes were applied" in errors["late"], errors
        # Each server counts the rows it reset: every slot once (the BSP admits, however many were
        # sent), and the ASP table's slots once more.
        admitted = out["admitted"]
        assert len(admitted) == 2 and all(a > 0 for a in admitted), admitted
        assert sum(admitted) == 2 * n + len(LATER_SLOTS), admitted
