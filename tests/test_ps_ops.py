"""Parameter-server operations against a NumPy model of the server (hetu._C kernels), with
real scheduler/server/worker processes on loopback."""
import numpy as np
import pytest

from hetu import _C
from ps_helpers import BATCH_CODE, VANS, cluster_fixture, optim_config

cluster = pytest.fixture(cluster_fixture)

ROWS, WIDTH, ITERS = 40, 6, 6
DENSE_SHAPE = (3, 5)
OPT_KW = {"sgd": {}, "momentum": dict(momentum=0.8), "adagrad": dict(eps=1e-6), "adam": dict(beta1=0.8, beta2=0.99),
          "adamw": dict(weight_decay=0.01), "nesterov": dict(l2reg=0.01), "rowwise_adagrad": dict(eps=1e-6, l2reg=0.01)}
# A row-wise rule steps embedding rows only; the dense tensor takes its element-wise rule.
DENSE_RULE = {"rowwise_adagrad": "adagrad"}

TRAIN = BATCH_CODE + """
r, W = ps.rank(), ps.num_workers()
assert W == ARGS["workers"]
c = ps.client()
opt = (ARGS["opt"], ARGS["kw"])
emb = c.init_table("emb", ARGS["rows"], ARGS["width"], init=("normal", 0.0, 0.1), seed=7, optimizer=opt,
                   storage=ARGS["storage"])
dense = c.init_dense("dense", (3, 5), init=("uniform", -1.0, 1.0), seed=7, optimizer=(ARGS["dense_opt"], ARGS["kw"]))
everything = np.arange(ARGS["rows"])
delay = np.random.default_rng(r + 99)
pulled, dpulled = [], []
for t in range(ARGS["iters"]):
    keys, grads, dgrad = batch(r, t, ARGS["rows"], ARGS["width"])
    lr = 0.1 / (1 + t)  # a schedule: lr travels with each push
    time.sleep(delay.uniform(0, 0.03))  # vary the order in which workers' pushes arrive
    # odd iterations use push_pull: the rows come back once iteration t is applied
    pp = t % 2 == 1
    pushes = [lambda: (emb.push_pull if pp else emb.push)(keys, grads, iteration=t, lr=lr),
              lambda: (dense.dense_push_pull if pp else dense.dense_push)(dgrad, iteration=t, lr=lr)]
    if delay.random() < 0.5:
        pushes.reverse()
    got = [h.wait() for h in [p() for p in pushes]]
    pulled.append(emb.pull(everything[::-1].copy(), iteration=t + 1).wait()[::-1])
    dpulled.append(dense.dense_pull(iteration=t + 1).wait())
    if pp:
        rows_pp, dense_pp = got if got[0].ndim == 2 and got[0].shape[1] == ARGS["width"] else got[::-1]
        assert np.array_equal(rows_pp, pulled[-1][keys]), t
        assert np.array_equal(dense_pp, dpulled[-1]), t
rows, state, steps, versions = emb.pull_with_state(everything).wait()
np.savez(OUT + ".npz", pulled=np.stack(pulled), dpulled=np.stack(dpulled), rows=rows, state=state, steps=steps,
         versions=versions)
ps.finalize()
"""


STORAGE = {"fp32": 0, "bf16": 1, "fp16": 2}


def model(workers, opt, kw, storage="fp32"):
    """The server's computation, in NumPy + hetu._C: per iteration, sum each row's gradients in
    worker-rank order, one optimizer step per touched row. A 16-bit table is a float32 one whose
    values are rounded to its type: at the start, and by every step."""
    cfg = optim_config(opt, storage=STORAGE[storage], **kw)
    dense_cfg = optim_config(DENSE_RULE.get(opt, opt), **kw)
    ns = {"np": np}
    exec(BATCH_CODE, ns)
    table = np.empty((ROWS, WIDTH), np.float32)
    _C.init_fill(2, 0.0, 0.1, 7, _C.name_stream("emb"), 0, table)
    _C.round_to_storage(table, STORAGE[storage])
    state = np.zeros((ROWS, _C.optim_state_width(cfg.kind, WIDTH)), np.float32)
    steps = np.zeros(ROWS, np.int64)
    versions = np.zeros(ROWS, np.int64)
    dense = np.empty(DENSE_SHAPE, np.float32)
    _C.init_fill(1, -1.0, 1.0, 7, _C.name_stream("dense"), 0, dense.reshape(-1, 1))
    dstate = np.zeros(_C.optim_state_width(dense_cfg.kind, dense.size), np.float32)
    dstep = np.zeros(1, np.int64)
    history, dhistory = [], []
    for t in range(ITERS):
        acc, dsum = {}, None
        for w in range(workers):
            keys, grads, dgrad = ns["batch"](w, t, ROWS, WIDTH)
            for i, k in enumerate(keys):
                acc[k] = acc[k] + grads[i] if k in acc else grads[i].copy()
            for k in set(keys.tolist()):
                versions[k] += 1
            dsum = dgrad.copy() if dsum is None else dsum + dgrad
        lr = np.float32(0.1 / (1 + t))
        if acc:
            rows = np.array(sorted(acc), np.int64)
            _C.apply_rows(cfg, lr, table, state, steps, rows, np.stack([acc[k] for k in rows]))
        _C.apply_dense(dense_cfg, lr, dense, dstate, dstep, dsum)
        history.append(table.copy())
        dhistory.append(dense.copy())
    return np.stack(history), np.stack(dhistory), table, state, steps, versions


@pytest.mark.timeout(120)
@pytest.mark.parametrize("servers,workers,opt", [(1, 1, "sgd"), (3, 1, "adagrad"), (1, 4, "momentum"),
                                                 (3, 4, "adam"), (2, 4, "adamw"), (3, 2, "nesterov"),
                                                 (2, 3, "rowwise_adagrad")])
def test_bsp_training_matches_numpy_bit_for_bit(cluster, tmp_path, servers, workers, opt):
    check_bsp_training(cluster(servers, workers), tmp_path, workers, opt)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("storage,servers,workers,opt", [
    ("bf16", 1, 1, "sgd"), ("bf16", 3, 1, "adagrad"), ("bf16", 1, 4, "momentum"), ("bf16", 3, 4, "adam"),
    ("bf16", 2, 4, "adamw"), ("bf16", 3, 2, "nesterov"), ("bf16", 2, 3, "rowwise_adagrad"),
    ("fp16", 2, 3, "sgd"), ("fp16", 3, 2, "adam"), ("fp16", 2, 2, "rowwise_adagrad")])
def test_16bit_tables_train_as_rounded_float32_bit_for_bit(cluster, tmp_path, storage, servers, workers, opt):
    """Rows stored and moved in 16 bits: every pull equals a float32 model whose rows are rounded
    to the type after each step. Tiny chunks send every pull's answer in many messages."""
    check_bsp_training(cluster(servers, workers, env={"PS_CHUNK_BYTES": "40"}), tmp_path, workers, opt, storage)
    history = model(workers, opt, OPT_KW[opt], storage)[0]
    unrounded = model(workers, opt, OPT_KW[opt])[0]
    assert not np.array_equal(history, unrounded)   # the type changes what training computes


@pytest.mark.timeout(120)
@pytest.mark.parametrize("van", VANS)
def test_bsp_training_over_each_van(cluster, tmp_path, van):
    check_bsp_training(cluster(3, 4, env={"DMLC_PS_VAN_TYPE": van}), tmp_path, 4, "adam")


def check_bsp_training(c, tmp_path, workers, opt, storage="fp32"):
    c.run(TRAIN, dict(rows=ROWS, width=WIDTH, iters=ITERS, opt=opt, dense_opt=DENSE_RULE.get(opt, opt), kw=OPT_KW[opt],
                      workers=workers, storage=storage), timeout=90)
    history, dhistory, table, state, steps, versions = model(workers, opt, OPT_KW[opt], storage)
    for w in range(workers):
        got = np.load(tmp_path / f"worker{w}.npz")
        for t in range(ITERS):
            assert np.array_equal(got["pulled"][t], history[t]), f"worker {w}, rows after iteration {t}"
            assert np.array_equal(got["dpulled"][t], dhistory[t]), f"worker {w}, dense after iteration {t}"
        assert np.array_equal(got["rows"], table)
        assert np.array_equal(got["state"], state)
        assert np.array_equal(got["steps"], steps)
        assert np.array_equal(got["versions"], versions)


INIT = """
from hetu import _C
c = ps.client()
for i, (kind, a, b) in enumerate([("constant", 0.5, 0.0), ("uniform", -0.2, 0.3), ("normal", 0.0, 0.01),
                                  ("truncated_normal", 1.0, 2.0)]):
    t = c.init_table(f"t{i}", 101, 7, init=(kind, a, b), seed=42 + i)
    got = t.pull(np.arange(101)).wait()
    want = np.empty((101, 7), np.float32)
    _C.init_fill(ps.INITIALIZERS[kind], a, b, 42 + i, _C.name_stream(f"t{i}"), 0, want)
    assert got.dtype == np.float32 and got.shape == (101, 7)
    assert np.array_equal(got, want), kind
    # unsorted keys with repeats come back in the order asked
    keys = np.array([100, 3, 3, 57, 0, 99, 34])
    assert np.array_equal(t.pull(keys).wait(), want[keys])
d = c.init_dense("d", (4, 9), init=("normal", 0.0, 1.0), seed=5, stream=77)
want = np.empty((36, 1), np.float32)
_C.init_fill(2, 0.0, 1.0, 5, 77, 0, want)
assert np.array_equal(d.dense_pull().wait(), want.reshape(4, 9))
ps.finalize()
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("servers", [1, 3])
def test_server_initialised_tables_equal_init_fill(cluster, servers):
    cluster(servers, 1).run(INIT)


STATE = """
from hetu import _C
c = ps.client()
R, Wd = 50, 4
t = c.init_table("emb", R, Wd, init=("uniform", -1, 1), seed=1, optimizer=("adam", {}), bsp=False)
assert t.state_width == 2 * Wd
# ASP pushes (no iteration): applied on arrival, one step per distinct key, duplicates summed
keys = np.array([7, 3, 7, 49, 20])
g = np.arange(5 * Wd, dtype=np.float32).reshape(5, Wd) / 10
t.push(keys, g, lr=0.05).wait()
table = np.empty((R, Wd), np.float32); _C.init_fill(1, -1, 1, 1, _C.name_stream("emb"), 0, table)
state = np.zeros((R, 2 * Wd), np.float32); steps = np.zeros(R, np.int64)
uk = np.array([7, 3, 49, 20])
ug = np.stack([g[0] + g[2], g[1], g[3], g[4]])
cfg = _C.OptimConfig(); cfg.kind = 4
_C.apply_rows(cfg, np.float32(0.05), table, state, steps, uk, ug)
rows, st, sp, ver = t.pull_with_state(np.arange(R)).wait()
assert np.array_equal(rows, table) and np.array_equal(st, state) and np.array_equal(sp, steps)
expect_ver = np.zeros(R, np.int64); expect_ver[uk] = 1
assert np.array_equal(ver, expect_ver)
# explicit contribution counts
t.push(np.array([3, 3, 10]), np.ones((3, Wd)), lr=0.05, counts=np.array([2, 1, 4])).wait()
cfg_rows = np.array([3, 10]); _C.apply_rows(cfg, np.float32(0.05), table, state, steps, cfg_rows,
                                            np.stack([np.full(Wd, 2, np.float32), np.ones(Wd, np.float32)]))
expect_ver[3] += 3; expect_ver[10] += 4
rows, st, sp, ver = t.pull_with_state(np.arange(R)).wait()
assert np.array_equal(rows, table) and np.array_equal(st, state) and np.array_equal(ver, expect_ver)
# versioned pull: only rows whose server version is more than `bound` ahead of ours
local = np.array([0, 0, 1, 5, 0])
keys = np.array([3, 10, 7, 49, 1])   # server versions 4, 4, 1, 1, 0
pos, prow, pver = t.pull_stale(keys, local, bound=0).wait()
assert pos.tolist() == [0, 1], pos
assert np.array_equal(prow, table[[3, 10]]) and pver.tolist() == [4, 4]
pos, prow, pver = t.pull_stale(keys, local, bound=3).wait()
assert pos.tolist() == [0, 1]
pos, prow, pver = t.pull_stale(keys, local, bound=4).wait()
assert len(pos) == 0 and prow.shape == (0, Wd)
# assign: write rows + state + steps, add to versions
ak = np.array([45, 2, 30])
av = np.random.default_rng(0).standard_normal((3, Wd)).astype(np.float32)
ast = np.abs(np.random.default_rng(1).standard_normal((3, 2 * Wd))).astype(np.float32)  # Adam v >= 0
t.assign(ak, av, ast, np.array([5, 6, 7]), version_add=np.array([1, 2, 3])).wait()
rows, st, sp, ver = t.pull_with_state(ak).wait()
assert np.array_equal(rows, av) and np.array_equal(st, ast) and sp.tolist() == [5, 6, 7]
assert ver.tolist() == [expect_ver[45] + 1, expect_ver[2] + 2, expect_ver[30] + 3]
table[ak] = av; state[ak] = ast; steps[ak] = [5, 6, 7]; expect_ver[ak] += [1, 2, 3]
# an ASP step after assign continues from the assigned state
t.push(np.array([2]), np.ones((1, Wd)), lr=0.01).wait()
_C.apply_rows(cfg, np.float32(0.01), table, state, steps, np.array([2]), np.ones((1, Wd), np.float32))
expect_ver[2] += 1
# save / clear / load round trip
before = t.pull_with_state(np.arange(R)).wait()
assert np.array_equal(before[0], table), np.argwhere(before[0] != table)
assert np.array_equal(before[1], state), np.argwhere(before[1] != state)
assert np.array_equal(before[3], expect_ver), (before[3], expect_ver)
t.save(ARGS["dir"]).wait()
files = sorted(os.listdir(ARGS["dir"]))
assert files == [f"emb.shard{s}-of-{ps.num_servers()}.bin" for s in range(ps.num_servers())], files
t.clear().wait()
init = np.empty((R, Wd), np.float32); _C.init_fill(1, -1, 1, 1, _C.name_stream("emb"), 0, init)
cleared = t.pull_with_state(np.arange(R)).wait()
assert np.array_equal(cleared[0], init) and not cleared[1].any() and not cleared[2].any() and not cleared[3].any()
t.load(ARGS["dir"]).wait()
after = t.pull_with_state(np.arange(R)).wait()
for a, b in zip(before, after):
    assert np.array_equal(a, b)
# loading into a table of another shape is refused
other = c.init_table("other", R + 1, Wd, optimizer="adam")
try:
    other.load(ARGS["dir"]).wait()
    raise AssertionError("load of a missing/mismatched shard succeeded")
except RuntimeError as e:
    assert "'other'" in str(e), e
ps.finalize()
"""


ROWWISE_STATE = """
from hetu import _C
c = ps.client()
R, Wd = 30, 5
t = c.init_table("emb", R, Wd, init=("uniform", -1, 1), seed=2, optimizer=("rowwise_adagrad", dict(l2reg=0.01)),
                 bsp=False)
assert t.state_width == 1   # one accumulator per row
cfg = _C.OptimConfig(); cfg.kind = 6; cfg.l2reg = 0.01
table = np.empty((R, Wd), np.float32); _C.init_fill(1, -1, 1, 2, _C.name_stream("emb"), 0, table)
state = np.zeros((R, 1), np.float32); steps = np.zeros(R, np.int64)
rng = np.random.default_rng(4)
for it in range(3):
    keys = np.unique(rng.integers(0, R, 12))
    g = rng.standard_normal((len(keys), Wd)).astype(np.float32)
    t.push(keys, g, lr=0.1).wait()
    _C.apply_rows(cfg, np.float32(0.1), table, state, steps, keys, g)
rows, st, sp, ver = t.pull_with_state(np.arange(R)).wait()
assert st.shape == (R, 1) and (st[steps > 0] > 0).all()
assert np.array_equal(rows, table) and np.array_equal(st, state) and np.array_equal(sp, steps)
# the state of marked keys only, and of stale rows
mask = np.arange(R) % 3 == 0
rows, st, sp, ver = t.pull_with_state(np.arange(R), with_state=mask).wait()
assert np.array_equal(st, state[mask]) and np.array_equal(sp, steps[mask])
pos, prow, pver, pst, psp = t.pull_stale(np.arange(R), np.zeros(R, np.int64), bound=0, with_state=True).wait()
assert len(pos) and np.array_equal(pst, state[pos]) and np.array_equal(psp, steps[pos])
# assign writes one accumulator per row; a step continues from it
ak = np.array([17, 4])
av = rng.standard_normal((2, Wd)).astype(np.float32)
ast = np.array([[0.5], [2.0]], np.float32)
t.assign(ak, av, ast, np.array([3, 9])).wait()
table[ak] = av; state[ak] = ast; steps[ak] = [3, 9]
ones = np.ones((2, Wd), np.float32)
t.push(np.sort(ak), ones, lr=0.1).wait()
_C.apply_rows(cfg, np.float32(0.1), table, state, steps, np.sort(ak), ones)
before = t.pull_with_state(np.arange(R)).wait()
assert np.array_equal(before[0], table) and np.array_equal(before[1], state) and np.array_equal(before[2], steps)
t.save(ARGS["dir"]).wait()
t.clear().wait()
t.load(ARGS["dir"]).wait()
after = t.pull_with_state(np.arange(R)).wait()
for a, b in zip(before, after):
    assert np.array_equal(a, b)
# a dense tensor takes the optimizer's element-wise rule: a row-wise dense table is refused
try:
    c.init_dense("d", (3, 4), optimizer="rowwise_adagrad")
    raise AssertionError("a dense table stepped by a row-wise rule was created")
except RuntimeError as e:
    assert "a row-wise optimizer steps embedding rows" in str(e), e
ps.finalize()
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("servers", [1, 3])
@pytest.mark.parametrize("script", [STATE, ROWWISE_STATE], ids=["adam", "rowwise_adagrad_one_float_per_row"])
def test_versions_state_assign_save_load(cluster, tmp_path, servers, script):
    cluster(servers, 1).run(script, dict(dir=str(tmp_path / "ckpt")))


MASKED_AND_WRITE_BACK = """
from hetu import _C
c = ps.client()
R, Wd, r = 50, 4, ps.rank()
t = c.init_table("emb", R, Wd, init=("uniform", -1, 1), seed=3, optimizer=("adam", {}), bsp=True)
cfg = _C.OptimConfig(); cfg.kind = 4
table = np.empty((R, Wd), np.float32); _C.init_fill(1, -1, 1, 3, _C.name_stream("emb"), 0, table)
state = np.zeros((R, 2 * Wd), np.float32); steps = np.zeros(R, np.int64); versions = np.zeros(R, np.int64)
def check(iteration):
    rows, st, sp, ver = t.pull_with_state(np.arange(R), iteration=iteration).wait()
    assert np.array_equal(rows, table) and np.array_equal(st, state), np.argwhere(rows != table)
    assert np.array_equal(sp, steps) and np.array_equal(ver, versions), (sp, ver, versions)
    # a masked pull: every key's row, state only for the marked keys (keys out of order, so
    # that with 3 servers a server's keys are not one run of the array)
    keys = np.array([45, 2, 30, 17, 8, 33, 49, 0])
    mask = np.array([1, 0, 1, 0, 0, 1, 1, 0], bool)
    for m in (mask, np.zeros(8, bool), np.ones(8, bool)):
        rows, st, sp, ver = t.pull_with_state(keys, iteration=iteration, with_state=m).wait()
        assert np.array_equal(rows, table[keys])
        assert st.shape == (m.sum(), 2 * Wd) and np.array_equal(st, state[keys[m]])
        assert np.array_equal(sp, steps[keys[m]]) and np.array_equal(ver, versions[keys[m]])
    # A write-back is written on arrival (the rows no other worker reads in that iteration),
    # so the next push waits until both workers have checked.
    ps.barrier("workers", 30)
check(0)
# Iteration 0: both workers push rows 3 and 10 (server 0's with 3 servers); worker 0 writes
# back rows 45 and 2, worker 1 row 47 (server 2's): written first, then the push taken in.
grads = np.stack([np.full(Wd, 1 + r, np.float32), np.full(Wd, -2.0 * r, np.float32)])
wb = {0: np.array([45, 2]), 1: np.array([47])}
rng = np.random.default_rng(5)
wb_vals = {w: rng.standard_normal((len(k), Wd)).astype(np.float32) for w, k in wb.items()}
wb_state = {w: np.abs(rng.standard_normal((len(k), 2 * Wd))).astype(np.float32) for w, k in wb.items()}
wb_steps = {0: np.array([4, 9]), 1: np.array([2])}
t.push(np.array([3, 10]), grads, iteration=0, lr=0.1,
       write_back=(wb[r], wb_vals[r], wb_state[r], wb_steps[r], 1)).wait()
for w in (0, 1):
    table[wb[w]] = wb_vals[w]; state[wb[w]] = wb_state[w]; steps[wb[w]] = wb_steps[w]; versions[wb[w]] += 1
summed = np.stack([np.full(Wd, 3, np.float32), np.full(Wd, -2, np.float32)])
_C.apply_rows(cfg, np.float32(0.1), table, state, steps, np.array([3, 10]), summed)
versions[[3, 10]] += 2
check(1)
# A bad write-back fails the request but its push still counts, so iteration 1 completes.
bad = np.array([99]) if r == 0 else np.array([46])
try:
    t.push(np.array([3]), np.ones((1, Wd)), iteration=1, lr=0.1,
           write_back=(bad, np.zeros((1, Wd)), np.zeros((1, 2 * Wd)), np.zeros(1, np.int64), 1)).wait()
    assert r == 1, "a write-back of key 99 was accepted"
except RuntimeError as e:
    assert r == 0 and "key 99" in str(e), e
table[46] = 0; state[46] = 0; steps[46] = 0; versions[46] += 1
_C.apply_rows(cfg, np.float32(0.1), table, state, steps, np.array([3]), np.full((1, Wd), 2, np.float32))
versions[3] += 2
check(2)
ps.finalize()
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("servers", [1, 3])
def test_masked_state_pull_and_push_with_write_back(cluster, servers):
    cluster(servers, 2).run(MASKED_AND_WRITE_BACK, {}, timeout=40)


BAD = """
c = ps.client()
t = c.init_table("emb", 30, 4, optimizer="sgd")
def fails(h, *words):
    try:
        h.wait() if hasattr(h, "wait") else h()
    except (RuntimeError, ValueError) as e:
        for w in words:
            assert w in str(e), (w, str(e))
        return
    raise AssertionError(f"no error; expected one mentioning {words}")
fails(t.pull([1, 2, 30]), "'emb'", "key 30")
fails(t.pull([-5]), "'emb'", "key -5")
fails(t.push([4, 31], np.ones((2, 4)), lr=0.1), "'emb'", "key 31")
fails(lambda: t.push([4, 5], np.ones((2, 3)), lr=0.1), "'emb'", "gradient")
fails(lambda: t.push([4, 5], np.ones(9), lr=0.1).wait(), "'emb'")
fails(t.push([4, 6], np.ones((2, 4)), lr=0.1, counts=[1, -2]), "'emb'", "row 6", "never goes backwards")
fails(t.assign([5], np.ones((1, 4)), version_add=-1), "'emb'", "row 5", "never goes backwards")
ghost = c.table("ghost", 30, 4)
fails(ghost.push([1], np.ones((1, 4)), lr=0.1), "'ghost'", "not initialised")
fails(ghost.pull([1]), "'ghost'", "not initialised")
fails(lambda: c.init_table("emb", 31, 4), "'emb'", "30x4")
fails(lambda: c.init_table("emb", 30, 5), "'emb'", "30x4")
c.init_table("emb", 30, 4)   # same shape again: fine, keeps values
# a rejected BSP push counts as that worker's empty push, so the iteration still completes
fails(t.push([3, 99], np.ones((2, 4)), iteration=0, lr=0.1), "'emb'", "key 99")
fails(t.push([3], np.ones((1, 4)), iteration=0, lr=0.1), "iteration 0", "was applied")
before = t.pull(np.arange(30)).wait()
assert np.array_equal(t.pull(np.arange(30), iteration=1).wait(), before)
t.push([3], np.ones((1, 4)), iteration=1, lr=0.5).wait()
after = t.pull(np.arange(30), iteration=2).wait()
assert np.array_equal(after[3], before[3] - 0.5) and np.array_equal(np.delete(after, 3, 0), np.delete(before, 3, 0))
fails(t.push([3], np.ones((1, 4)), iteration=1, lr=0.5), "was applied")
fails(lambda: t.dense_pull(), "dense")
ps.finalize()
"""


@pytest.mark.timeout(60)
def test_bad_input_is_an_error_naming_table_and_key(cluster):
    cluster(3, 1).run(BAD)


def test_the_bindings_table_takes_keywords_and_checks_input_before_sending():
    """hetu._ps.Table: its arguments are keywords only, and input that cannot be sent is refused
    in the calling process (no node is needed to see it)."""
    from hetu import _ps
    with pytest.raises(TypeError):
        _ps.Table("emb", 10, 4)
    emb = _ps.Table(name="emb", rows=10, width=4, state_width=4)
    with pytest.raises(TypeError):
        emb.pull(np.arange(3))
    with pytest.raises(ValueError, match="keys= is needed"):
        emb.push(grads=np.zeros((1, 4), np.float32), lr=0.1)
    with pytest.raises(ValueError, match="gradient has 4 elements, expected 8"):
        emb.push(keys=np.arange(2), grads=np.zeros(4, np.float32), lr=0.1)
    with pytest.raises(ValueError, match="write-back goes with a sparse push"):
        emb.push(keys=np.arange(1), grads=np.zeros(4, np.float32), lr=0.1, pull=True,
                 write_back=(np.arange(1), np.zeros(4, np.float32), np.zeros(4, np.float32), np.zeros(1, np.int64),
                             np.ones(1, np.int64)))
    with pytest.raises(ValueError, match="optimizer state has 0 elements, expected 4"):
        emb.assign(keys=np.arange(1), values=np.zeros(4, np.float32), state=np.zeros(0, np.float32),
                   steps=np.zeros(1, np.int64), version_add=np.ones(1, np.int64))
    with pytest.raises(RuntimeError, match="has not started a node"):
        emb.pull(keys=np.arange(3))
    with pytest.raises(RuntimeError, match="has not started a node"):
        _ps.Table(name="dense", rows=6, width=1, dense=True).pull()


LARGE = """
from hetu import _C
c = ps.client()
R, Wd = 50000, 8
t = c.init_table("big", R, Wd, init=("uniform", -1, 1), seed=3, optimizer=("adagrad", {}), bsp=False)
table = np.empty((R, Wd), np.float32); _C.init_fill(1, -1, 1, 3, _C.name_stream("big"), 0, table)
state = np.zeros((R, Wd), np.float32); steps = np.zeros(R, np.int64)
cfg = _C.OptimConfig(); cfg.kind = 3
rng = np.random.default_rng(5)
for step in range(3):
    keys = np.sort(rng.choice(R, 20000, replace=False))   # large, sorted: the multi-threaded paths
    g = rng.standard_normal((20000, Wd)).astype(np.float32)
    t.push(keys, g, lr=0.1).wait()
    _C.apply_rows(cfg, np.float32(0.1), table, state, steps, keys, g)
    assert np.array_equal(t.pull(keys).wait(), table[keys])
assert np.array_equal(t.pull(np.arange(R)).wait(), table)
ps.finalize()
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("van", VANS)
def test_large_batches_on_multithreaded_servers(cluster, van):
    cluster(2, 1, env={"HETU_NUM_THREADS": "2", "DMLC_PS_VAN_TYPE": van}).run(LARGE)


CHUNKED = """
from hetu import _C
c = ps.client()
R, Wd = 60, 4
t = c.init_table("emb", R, Wd, init=("uniform", -1, 1), seed=9, optimizer=("adam", {}), bsp=False)
table = np.empty((R, Wd), np.float32); _C.init_fill(1, -1, 1, 9, _C.name_stream("emb"), 0, table)
state = np.zeros((R, 2 * Wd), np.float32); steps = np.zeros(R, np.int64); versions = np.zeros(R, np.int64)
cfg = _C.OptimConfig(); cfg.kind = 4
rng = np.random.default_rng(2)
# PS_CHUNK_BYTES is 3 rows: pulls come back, and pushes go, 3 rows a message
assert np.array_equal(t.pull(np.arange(R)).wait(), table)
keys = rng.integers(0, R, 50)                       # unsorted, repeated: parts are not contiguous
assert np.array_equal(t.pull(keys).wait(), table[keys])
for step in range(3):
    keys = np.sort(rng.choice(R, 40, replace=False))  # strictly increasing: a chunked ASP push
    g = rng.standard_normal((40, Wd)).astype(np.float32)
    counts = rng.integers(1, 4, 40)
    t.push(keys, g, lr=0.05, counts=counts).wait()
    _C.apply_rows(cfg, np.float32(0.05), table, state, steps, keys, g)
    versions[keys] += counts
    rows, st, sp, ver = t.pull_with_state(np.arange(R)).wait()
    assert np.array_equal(rows, table) and np.array_equal(st, state), step
    assert np.array_equal(sp, steps) and np.array_equal(ver, versions), step
# repeated keys are summed in one step, as without chunks
keys = np.array([5, 40, 5, 41, 42, 43, 44, 45, 1])
g = rng.standard_normal((9, Wd)).astype(np.float32)
t.push(keys, g, lr=0.05).wait()
uk = np.array([5, 40, 41, 42, 43, 44, 45, 1])
_C.apply_rows(cfg, np.float32(0.05), table, state, steps, uk, np.concatenate([[g[0] + g[2]], g[[1, 3, 4, 5, 6, 7, 8]]]))
versions[uk] += 1
rows, st, sp, ver = t.pull_with_state(np.arange(R)).wait()
assert np.array_equal(rows, table) and np.array_equal(st, state) and np.array_equal(ver, versions)
# a push with a key outside the table is refused whole by its server, as without chunks (the
# keys are all on one server under either row placement: 40..59 and 60 under contiguous ranges,
# multiples of 3 under strided)
keys = np.arange(42, 61, 3)
try:
    t.push(keys, np.ones((7, Wd), np.float32), lr=0.05).wait()
    raise AssertionError("a key outside the table was taken")
except RuntimeError as e:
    assert "key 60" in str(e), e
assert np.array_equal(t.pull(np.arange(40, 60)).wait(), table[40:60])
ps.finalize()
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("van", VANS)
def test_chunked_pulls_and_pushes(cluster, van):
    cluster(3, 1, env={"PS_CHUNK_BYTES": str(3 * 4 * 4), "DMLC_PS_VAN_TYPE": van}).run(CHUNKED)


@pytest.mark.timeout(60)
def test_workers_that_poll_for_answers_get_the_same_results_and_errors(cluster):
    # PS_WAIT_SPIN_US: every wait polls first; the script's answers, chunks and the refused
    # push (an error seen while polling) are checked as above.
    cluster(3, 1, env={"PS_CHUNK_BYTES": str(3 * 4 * 4), "PS_WAIT_SPIN_US": "500"}).run(CHUNKED)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("value", ["-1", "fast", "2e6", "nan"])
def test_a_bad_wait_spin_is_refused_at_start(value):
    import os
    import jobs
    import sys
    from ps_helpers import free_port
    env = dict(os.environ, DMLC_ROLE="worker", DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(free_port()),
               PS_WAIT_SPIN_US=value, PS_START_TIMEOUT="5")
    p = jobs.run([sys.executable, "-c", "import hetu.ps as ps; ps.start()"], env=env, capture_output=True,
                 text=True, timeout=30)
    assert p.returncode != 0
    assert f"PS_WAIT_SPIN_US='{value}': expected microseconds from 0 to 1000000" in p.stderr, p.stderr


ORDER = """
import hetu.ps as ps
c = ps.client()
R, Wd = 400_000, 32  # 51 MB: the save takes far longer than a push of one row
t = c.init_table("big", R, Wd, init=("constant", 0.0), optimizer="sgd", bsp=False)
last = np.array([R - 1])
save = t.save(ARGS["dir"])                         # handled on the server's data thread
push = t.push(last, np.ones((1, Wd), np.float32), lr=1.0)  # a row operation: may be handled at once
save.wait(); push.wait()
assert np.array_equal(t.pull(last).wait(), -np.ones((1, Wd), np.float32))
t.load(ARGS["dir"]).wait()
# The save was taken before the push, whole: the saved last row is the one before the push.
assert np.array_equal(t.pull(last).wait(), np.zeros((1, Wd), np.float32))
ps.finalize()
"""


@pytest.mark.timeout(60)
def test_a_row_operation_waits_for_a_save_before_it(cluster, tmp_path):
    # Row operations are handled on the server's receive thread when nothing is queued or running
    # on its data thread; a save is on the data thread, so the push after it must wait there.
    cluster(1, 1).run(ORDER, {"dir": str(tmp_path / "ckpt")})


@pytest.mark.timeout(120)
def test_throughput_bench_runs_the_ps_raw_and_raw_table_measurements():
    # The bench's own checks: every raw answer has the size of the rows asked for (the raw+table
    # server gathers them from a TableShard and refuses keys of another server's rows).
    import os
    import jobs
    import sys
    bench = os.path.join(os.path.dirname(__file__), "..", "bench", "ps_throughput.py")
    p = jobs.run([sys.executable, bench, "--shapes", "1x2", "--batches", "64", "--seconds", "0.05",
                  "--repeat", "1"], capture_output=True, text=True, timeout=110)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = [ln.split("|") for ln in p.stdout.splitlines() if ln.strip().startswith("1  2")]
    assert [r[0].split()[2:] for r in rows] == [["pull", "64"], ["push", "sgd", "64"], ["push", "adam", "64"]]
    for r in rows:   # zmq, raw and raw+table rates, then the three ratios
        rates = [float(c.split()[0]) for c in r[1:4]]
        ratios = [float(x) for x in r[4].split()]
        assert len(rates) == 3 and all(x > 0 for x in rates) and len(ratios) == 3, r
