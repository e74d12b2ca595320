"""One GPU, one process: hetu vs PyTorch eager and compiled on WDL, DCN and NCF, side by side in one run.

For every configuration (model x batch x embedding size x optimizer) the bench trains
hetu.models' wdl_criteo / dcn_criteo / ncf_movielens in hetu, built as
hetu.run.training builds them (dataloader ops over in-memory arrays, MODELS[...], an
ht.optim optimizer, ht.Executor({"train": [loss, train_op]}, ctx=..., seed=...), one process,
no --comm: the tables live on the device), and the same architecture in PyTorch eager, and
prints the median samples/s of each and their ratio.

Same model and init scale (tables N(0, 0.01); linear weights Xavier-normal, biases 0; DCN's
cross weights N(0, 0.01)), float32 everywhere (TF32 off in PyTorch; CuPy does not use it), mean
BCE-with-logits loss, same optimizer and learning rate (SGD lr 0.01: torch.optim.SGD on all
parameters, the table's gradient sparse; Adam lr 0.001, eps 1e-7: torch.optim.SparseAdam for
the nn.Embedding(sparse=True) tables, torch.optim.Adam(fused=True on the GPU) for the rest;
hetu's Adam counts bias-correction steps per table row, SparseAdam per table: the same work).

Both take every batch from the same host NumPy arrays (synthetic, seed 0: Criteo-shaped for
WDL and DCN, 26 fields sharing one id space of 337,754 ids with per-field offsets, Zipf-skewed
ids, 13 dense floats, labels 0/1; MovieLens-1M-shaped for NCF, user and item ids, 6,040 + 3,706)
and copy it to the device every step: hetu through its dataloader ops (as train.py, with their
prefetch thread), PyTorch from pinned-memory tensors sliced per step and .to(device,
non_blocking=True). Each step of either fetches the loss to the host, as a training loop that
logs it does (hetu: convert_to_numpy_ret_vals=True; PyTorch: loss.item()).

Timing: after warm-up, the frameworks of a configuration take turns, one window of N steps each
(hetu, hetu+graph, torch, hetu, ...), the device synchronized before each clock reading; the
figure is the median over --windows windows. N is --steps, or by default calibrated on 3 steps
timed after the warm-up so that the slowest framework's window takes about --window-seconds
(at least 3 steps). A configuration
that does not fit on the device with all frameworks at once is measured one framework at a
time; a framework that runs out of device memory alone is reported as OOM, not an abort.

tc:MODE: PyTorch with the model (but for its embedding lookups, whose sparse gradients Inductor
cannot make) and its loss under torch.compile(mode=MODE, dynamic=False), one
column per --compile-modes value (default: default and reduce-overhead, which adds CUDA graphs),
the optimizers eager as in the torch column; compiled (and its CUDA graphs recorded) in the
warm-up, afresh for every configuration. A mode that fails to compile or run is that cell's
error, with the reason, and the run goes on; the note says where Dynamo broke the graph or
Inductor skipped CUDA graphs. Each torch.compile column gets its ratio to hetu's best column.

hetu+graph: hetu's executor with cuda_graph=True (the step captured as a CUDA graph), its own
column when hetu has that option (--cuda-graph auto: on the GPU when the installed hetu
mentions it; the plain hetu column then passes cuda_graph=False). Where hetu has no such
option the column is left out.

The run first checks that the two compute the same model (--check alone does only that): one
small configuration per model, SGD, hetu's initial parameters (executor.parameters()) copied
into the PyTorch model, a few steps on the same batches; it prints the largest relative
difference of the losses (expect ~1e-5 or less; printed, never asserted).

Progress goes to stderr, the table to stdout (rows as they finish); --out FILE writes the
results as JSON (rewritten after every configuration, so a cut-off run keeps what it measured).

Duration: the default grid (3 models x 4 batches x 2 embeddings x 2 optimizers = 48
configurations, 5 windows of ~0.2 s per framework) takes about 4-6 minutes on an H100 with the
hetu+graph column (PyTorch alone measured the grid in under a minute there), start-up and CuPy's
first kernel compilations included; --budget (default 400 s from the start) skips the
configurations not yet started when it is spent (the torch.compile columns add their compile
time, some seconds per configuration and mode), with a note, so that the run ends in time.

    python bench/gpu_single.py --out gpu_single.json                 # the default grid on GPU 0
    python bench/gpu_single.py --check                                # the equivalence check only
    python bench/gpu_single.py --device cpu --models wdl ncf --batch 256 --embedding 16 \\
        --optimizers sgd adam --windows 2 --steps 5                   # a tiny run on the CPU
"""
import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
try:
    import hetu as ht                 # noqa: E402
    from hetu.models import MODELS    # noqa: E402
    HETU_ERROR = None
except Exception as e:                # noqa: BLE001 - the PyTorch columns still run; hetu's show this
    ht = MODELS = None
    HETU_ERROR = f"hetu is not importable: {type(e).__name__}: {e}"

SEED = 123
LR = {"sgd": 0.01, "adam": 0.001}
ADAM_EPS = 1e-7                       # hetu's AdamOptimizer default
HETU_MODEL = {"wdl": "wdl_criteo", "dcn": "dcn_criteo", "ncf": "ncf_movielens"}
CRITEO_REAL_SIZES = (1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
                     27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572)
CRITEO_DENSE = 13
MOVIELENS_SIZES = (6040, 3706)
PROBE_STEPS = 3
T0 = time.perf_counter()


def log(msg):
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


# --- data ----------------------------------------------------------------------------------------
def zipf_ids(rng, size, n, exponent=1.05):
    """n ids in [0, size) with P(k) ~ 1 / (k + 1)^exponent."""
    cdf = np.cumsum(1.0 / np.arange(1, size + 1, dtype=np.float64) ** exponent)
    cdf /= cdf[-1]
    return np.minimum(np.searchsorted(cdf, rng.random(n)), size - 1)


def make_data(model, rows, seed=0):
    """(dense or None, sparse int64 [rows, fields] with per-field offsets, labels float32 [rows, 1],
    number of ids): NumPy arrays, deterministic in `seed`."""
    rng = np.random.default_rng(seed)
    if model == "ncf":
        sizes, dense = MOVIELENS_SIZES, None
    else:
        real = np.asarray(CRITEO_REAL_SIZES, dtype=np.int64)
        # Criteo's field sizes scaled by 0.01, small fields kept (as hetu's synthetic-criteo)
        sizes = np.maximum(np.rint(real * 0.01).astype(np.int64), np.minimum(real, 16))
        dense = np.log1p(rng.exponential(4.0, size=(rows, CRITEO_DENSE))).astype(np.float32)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    sparse = np.empty((rows, len(sizes)), dtype=np.int64)
    for f, (size, off) in enumerate(zip(sizes, offsets)):
        sparse[:, f] = zipf_ids(rng, int(size), rows) + off
    labels = (rng.random((rows, 1)) < 0.25).astype(np.float32)
    return dense, sparse, labels, int(np.sum(sizes))


# --- device helpers ------------------------------------------------------------------------------
def is_oom(exc):
    text = f"{type(exc).__name__} {exc}"
    return any(s in text for s in ("OutOfMemory", "out of memory", "ALLOC_FAILED", "cudaErrorMemoryAllocation"))


class Device:
    """The device both frameworks use, and the synchronisation and freeing that timing needs."""

    def __init__(self, kind):
        import torch
        self.kind = kind
        self.torch = torch
        self.cupy = None
        if kind == "gpu":
            if not torch.cuda.is_available():
                raise SystemExit("--device gpu: PyTorch sees no CUDA device (use --device cpu)")
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
            torch.set_float32_matmul_precision("highest")
            self.torch_device = torch.device("cuda", 0)
            self.hetu_ctx = ht.gpu(0) if ht is not None else None
            try:
                import cupy
                self.cupy = cupy
                cupy.cuda.Device(0).use()
            except ImportError:
                log("CuPy is not importable: hetu cannot run on the GPU, its columns will show the error")
        else:
            self.torch_device = torch.device("cpu")
            self.hetu_ctx = ht.cpu(0) if ht is not None else None

    def sync(self):
        if self.kind != "gpu":
            return
        self.torch.cuda.synchronize()
        if self.cupy is not None:
            self.cupy.cuda.runtime.deviceSynchronize()

    def free(self):
        gc.collect()
        if self.kind != "gpu":
            return
        self.torch.cuda.synchronize()
        self.torch.cuda.empty_cache()
        if self.cupy is not None:
            self.cupy.cuda.runtime.deviceSynchronize()
            self.cupy.get_default_memory_pool().free_all_blocks()
            self.cupy.get_default_pinned_memory_pool().free_all_blocks()

    def describe(self):
        torch = self.torch
        info = {"device": self.kind, "python": platform.python_version(), "numpy": np.__version__,
                "torch": torch.__version__, "hetu_commit": git_commit()}
        try:
            import cupy
            info["cupy"] = cupy.__version__
        except ImportError:
            info["cupy"] = None
        if self.kind == "gpu":
            info["device_name"] = torch.cuda.get_device_name(0)
            info["torch_cuda"] = torch.version.cuda
            info["tf32"] = {"matmul": torch.backends.cuda.matmul.allow_tf32, "cudnn": torch.backends.cudnn.allow_tf32}
        else:
            info["device_name"] = platform.processor() or platform.machine()
            info["torch_threads"] = torch.get_num_threads()
        return info


def git_commit():
    try:
        return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def hetu_has_cuda_graph():
    """Whether the installed hetu knows the executor option cuda_graph (Executor takes unknown
    options silently, so its source is asked)."""
    import inspect
    if ht is None:
        return False
    from hetu import executor
    for fn in (ht.Executor.__init__, executor.ExecutorConfig.__init__):
        if "cuda_graph" in inspect.signature(fn).parameters:
            return True
    pkg = os.path.dirname(os.path.abspath(ht.__file__))
    for folder, _, files in os.walk(pkg):
        for name in files:
            if name.endswith(".py"):
                try:
                    with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as f:
                        if "cuda_graph" in f.read():
                            return True
                except OSError:
                    pass
    return False


# --- hetu ----------------------------------------------------------------------------------------
class HetuRunner:
    """The model as hetu.run.training builds it; step() runs one training step and returns
    the loss (fetched to the host)."""

    def __init__(self, model, data, batch, emb, opt, device, prefetch, cuda_graph=None):
        if HETU_ERROR:
            raise RuntimeError(HETU_ERROR)
        dense, sparse, labels, num_ids = data
        self.loaders = []

        def op(array):
            if array is None:
                return None
            d = ht.Dataloader(array, batch, "train", seed=SEED, prefetch=prefetch)
            self.loaders.append(d)
            return ht.dataloader_op([d])

        optimizer = (ht.optim.SGDOptimizer(learning_rate=LR["sgd"]) if opt == "sgd"
                     else ht.optim.AdamOptimizer(learning_rate=LR["adam"], epsilon=ADAM_EPS))
        loss, _, _, train_op = MODELS[HETU_MODEL[model]](op(dense), op(sparse), op(labels), num_embeddings=num_ids,
                                                         embedding_size=emb, optimizer=optimizer)
        options = {} if cuda_graph is None else {"cuda_graph": cuda_graph}
        self.executor = ht.Executor({"train": [loss, train_op]}, ctx=device.hetu_ctx, seed=SEED, **options)

    def step(self):
        out = self.executor.run("train", convert_to_numpy_ret_vals=True)
        return float(np.asarray(out[0]).reshape(-1)[0])

    def parameters(self):
        return self.executor.parameters()

    def note(self):
        """Why the executor gave up capturing CUDA graphs, if it did (then its steps ran eagerly)."""
        error = getattr(getattr(self.executor, "device_step", None), "capture_error", None)
        return f"CUDA graph capture given up: {str(error)[:200]}" if error else None

    def close(self):
        for d in self.loaders:
            pool = getattr(d, "_pool", None)
            if pool is not None:
                pool.shutdown(wait=True)
        self.executor = None
        self.loaders = []


# --- PyTorch -------------------------------------------------------------------------------------
def torch_models():
    """The three models in PyTorch; submodules keyed by hetu's parameter names (a Linear `x` holds
    hetu's x_weight, transposed, and x_bias), so hetu's parameters load by name."""
    import torch
    from torch import nn
    import torch.nn.functional as F

    class Base(nn.Module):
        def __init__(self):
            super().__init__()
            self.tables = nn.ModuleDict()
            self.linears = nn.ModuleDict()
            self.extra = nn.ParameterDict()

        def table(self, name, num, dim):
            t = self.tables[name] = nn.Embedding(num, dim, sparse=True)
            nn.init.normal_(t.weight, std=0.01)
            return t

        def linear(self, name, fan_in, fan_out):
            lin = self.linears[name] = nn.Linear(fan_in, fan_out)
            nn.init.xavier_normal_(lin.weight)
            nn.init.zeros_(lin.bias)
            return lin

        def forward(self, dense, ids):
            return self.top(dense, self.embed(ids))

        def first_order(self, ids):
            """The models' first-order term over the ids (hetu.models.common.first_order):
            a weight per id, summed over the fields."""
            return self.first(ids).sum(dim=1)

        def load_hetu(self, params):
            """Copies hetu's parameters (name -> NumPy array) into this model."""
            loaded = set()
            with torch.no_grad():
                for name, value in params.items():
                    value = torch.from_numpy(np.ascontiguousarray(value, dtype=np.float32))
                    if name in self.tables:
                        target, value = self.tables[name].weight, value
                    elif name.endswith("_weight") and name[:-len("_weight")] in self.linears:
                        target, value = self.linears[name[:-len("_weight")]].weight, value.t()
                    elif name.endswith("_bias") and name[:-len("_bias")] in self.linears:
                        target = self.linears[name[:-len("_bias")]].bias
                    elif name in self.extra:
                        target = self.extra[name]
                    else:
                        raise KeyError(f"hetu parameter {name} has no counterpart in the PyTorch model")
                    if target.numel() != value.numel():
                        raise ValueError(f"{name}: hetu {tuple(value.shape)}, torch {tuple(target.shape)}")
                    target.copy_(value.reshape(target.shape))
                    loaded.add(id(target))
            missing = [n for n, p in self.named_parameters() if id(p) not in loaded]
            if missing:
                raise KeyError(f"PyTorch parameters not in hetu's: {missing}")

    class WDL(Base):
        def __init__(self, num_ids, emb, fields=26, num_dense=CRITEO_DENSE, hidden=(256, 256, 256)):
            super().__init__()
            self.emb = self.table("embedding", num_ids, emb)
            width, self.deep = fields * emb + num_dense, []
            for i, h in enumerate(hidden):
                self.deep.append(self.linear(f"wdl_deep_fc{i}", width, h))
                width = h
            self.out = self.linear("wdl_deep_out", width, 1)
            self.first = self.table("wdl_wide_ids", num_ids, 1)
            self.wide = self.linear("wdl_wide", num_dense, 1)

        def embed(self, ids):
            return self.emb(ids), self.first_order(ids)

        def top(self, dense, e):
            e, first = e
            x = torch.cat([e.reshape(e.shape[0], -1), dense], dim=1)
            for lin in self.deep:
                x = F.relu(lin(x))
            return self.out(x) + (first + self.wide(dense))

    class DCN(Base):
        def __init__(self, num_ids, emb, fields=26, num_dense=CRITEO_DENSE, num_cross=3, hidden=(256, 256)):
            super().__init__()
            self.emb = self.table("embedding", num_ids, emb)
            width = fields * emb + num_dense
            self.cross = []
            for i in range(num_cross):
                w = self.extra[f"dcn_cross{i}_w"] = nn.Parameter(torch.empty(width, 1))
                b = self.extra[f"dcn_cross{i}_b"] = nn.Parameter(torch.zeros(width))
                nn.init.normal_(w, std=0.01)
                self.cross.append((w, b))
            self.deep, w_in = [], width
            for i, h in enumerate(hidden):
                self.deep.append(self.linear(f"dcn_deep{i}", w_in, h))
                w_in = h
            self.out = self.linear("dcn_out", width + hidden[-1], 1)
            self.first = self.table("dcn_first_order", num_ids, 1)
            self.dense_linear = self.linear("dcn_dense_linear", num_dense, 1)

        def embed(self, ids):
            return self.emb(ids), self.first_order(ids)

        def top(self, dense, e):
            e, first = e
            x0 = torch.cat([e.reshape(e.shape[0], -1), dense], dim=1)
            x = x0
            for w, b in self.cross:
                x = x0 * (x @ w) + b + x
            d = x0
            for lin in self.deep:
                d = F.relu(lin(d))
            return self.out(torch.cat([x, d], dim=1)) + (first + self.dense_linear(dense))

    class NCF(Base):
        def __init__(self, num_ids, emb, hidden=(128, 64)):
            super().__init__()
            self.gmf = self.table("ncf_gmf_embedding", num_ids, emb)
            self.mlp = self.table("ncf_mlp_embedding", num_ids, emb)
            self.deep, width = [], 2 * emb
            for i, h in enumerate(hidden):
                self.deep.append(self.linear(f"ncf_mlp_fc{i}", width, h))
                width = h
            self.out = self.linear("ncf_out", emb + hidden[-1], 1)
            self.first = self.table("ncf_first_order", num_ids, 1)

        def embed(self, ids):
            return self.gmf(ids), self.mlp(ids), self.first_order(ids)

        def top(self, dense, e):
            g, m, first = e
            d = m.reshape(m.shape[0], -1)
            for lin in self.deep:
                d = F.relu(lin(d))
            return self.out(torch.cat([g[:, 0] * g[:, 1], d], dim=1)) + first

    return {"wdl": WDL, "dcn": DCN, "ncf": NCF}


class HostBatches:
    """The bench's NumPy arrays as PyTorch host tensors (pinned when the device is a GPU), made
    once per model and shared by its configurations."""

    def __init__(self, data, device):
        import torch
        dense, sparse, labels, self.num_ids = data
        pin = device.kind == "gpu"

        def host(a):
            if a is None:
                return None
            t = torch.from_numpy(a)
            return t.pin_memory() if pin else t
        self.dense, self.sparse, self.labels = host(dense), host(sparse), host(labels)
        self.rows = len(sparse)


def compile_key(mode):
    """The results' key of the torch.compile column of `mode`."""
    return "compile_" + mode.replace("-", "_")


def compile_counters():
    """Dynamo's graph breaks and Inductor's skipped CUDA graphs so far (process-wide counts)."""
    from torch._dynamo.utils import counters
    return sum(counters["graph_break"].values()), counters["inductor"]["cudagraph_skips"]


class TorchRunner:
    """PyTorch's step: eager, or with the model and its loss under torch.compile(mode=...)
    (`compile_mode`; "default" is torch.compile's default mode). The optimizers run eagerly in
    both, as they do in hetu's plain executor."""

    def __init__(self, model, host, batch, emb, opt, device, compile_mode=None):
        import torch
        import torch.nn.functional as F
        torch.manual_seed(SEED)
        self.torch, self.F = torch, F
        self.compile_mode, self.steps, self.compile_note = compile_mode, 0, None
        self.dev = device.torch_device
        self.host, self.batch = host, batch
        self.nb = host.rows // batch          # as hetu's dataloader: drop_last, batches cycle
        self.i = 0
        self.model = torch_models()[model](host.num_ids, emb).to(self.dev)
        tables = [t.weight for t in self.model.tables.values()]
        table_ids = {id(p) for p in tables}
        dense_params = [p for p in self.model.parameters() if id(p) not in table_ids]
        if opt == "sgd":
            self.optimizers = [torch.optim.SGD(self.model.parameters(), lr=LR["sgd"])]
        else:
            self.optimizers = [torch.optim.SparseAdam(tables, lr=LR["adam"], eps=ADAM_EPS)]
            fast = {"fused": True} if device.kind == "gpu" else {"foreach": True}
            try:
                dense_opt = torch.optim.Adam(dense_params, lr=LR["adam"], eps=ADAM_EPS, **fast)
            except (RuntimeError, ValueError, TypeError):
                dense_opt = torch.optim.Adam(dense_params, lr=LR["adam"], eps=ADAM_EPS)
            self.optimizers.append(dense_opt)
        self.top_loss = self._top_loss
        if compile_mode is not None:
            # Static shapes: one batch size per configuration, so the kernels are specialised
            # to it, as a tuned deployment would have them. The lookups stay outside: Inductor
            # cannot make the tables' sparse gradients (it fails on SparseTensorImpl's storage).
            self.top_loss = torch.compile(self._top_loss, mode=None if compile_mode == "default" else compile_mode,
                                          dynamic=False)
            self.counters0 = compile_counters()

    def _top_loss(self, dense, embedded, y):
        return self.F.binary_cross_entropy_with_logits(self.model.top(dense, embedded), y)

    def step(self):
        b, h = self.batch, self.host
        s = slice(self.i * b, (self.i + 1) * b)
        self.i = (self.i + 1) % self.nb
        dense = None if h.dense is None else h.dense[s].to(self.dev, non_blocking=True)
        ids = h.sparse[s].to(self.dev, non_blocking=True)
        y = h.labels[s].to(self.dev, non_blocking=True)
        for o in self.optimizers:
            o.zero_grad(set_to_none=True)
        loss = self.top_loss(dense, self.model.embed(ids), y)
        loss.backward()
        for o in self.optimizers:
            o.step()
        self.steps += 1
        if self.compile_mode is not None and self.steps == 1:
            # the first step compiles forward and backward: what it left out shows here
            breaks, skips = (a - b for a, b in zip(compile_counters(), self.counters0))
            parts = ([f"{breaks} graph break(s)"] if breaks else []) + \
                ([f"CUDA graphs skipped {skips} time(s)"] if skips else [])
            self.compile_note = ", ".join(parts) or None
        return loss.item()

    def note(self):
        return self.compile_note

    def close(self):
        self.model = self.optimizers = self.top_loss = None


# --- measuring -----------------------------------------------------------------------------------
class OOM(Exception):
    pass


def describe(exc):
    """A failure's type and first lines: a torch.compile error's first line often only names
    the backend, its reason follows."""
    lines = [x.strip() for x in str(exc).splitlines() if x.strip()]
    return f"{type(exc).__name__}: {' | '.join(lines[:3])[:300]}"


def build(key, cfg, ctx):
    model, batch, emb, opt = cfg["model"], cfg["batch"], cfg["emb"], cfg["opt"]
    if key == "torch":
        return TorchRunner(model, ctx["host"], batch, emb, opt, ctx["device"])
    if key in ctx["compile_modes"]:
        return TorchRunner(model, ctx["host"], batch, emb, opt, ctx["device"], compile_mode=ctx["compile_modes"][key])
    graph = None if not ctx["graph_option"] else key == "hetu_graph"
    return HetuRunner(model, ctx["data"], batch, emb, opt, ctx["device"], ctx["prefetch"], cuda_graph=graph)


def measure_together(keys, cfg, ctx, args):
    """Builds and warms up the frameworks `keys`, then times their windows in turn. Returns
    key -> {"rates": [...], "steps": N} or {"error": text}; raises OOM when one runs out of
    device memory (the caller frees everything and decides)."""
    device = ctx["device"]
    runners, out, step_time = {}, {}, {}
    if any(k in ctx["compile_modes"] for k in keys):
        # Each configuration compiles afresh: guards from earlier ones would pile up against
        # Dynamo's recompile limit, past which it silently runs eagerly.
        import torch._dynamo
        torch._dynamo.reset()
    try:
        for key in keys:
            phase = "set-up"
            try:
                log(f"  {key}: set-up, {args.warmup} warm-up steps and {PROBE_STEPS} timed ones")
                runners[key] = build(key, cfg, ctx)
                phase = "warm-up"
                for _ in range(args.warmup):
                    runners[key].step()
                # a few steps timed after the warm-up (whose first steps include one-off set-up):
                # the step time that calibrates the window length
                device.sync()
                t = time.perf_counter()
                for _ in range(PROBE_STEPS):
                    runners[key].step()
                device.sync()
                step_time[key] = (time.perf_counter() - t) / PROBE_STEPS
            except Exception as e:          # noqa: BLE001 - one framework's failure is a table note
                if is_oom(e):
                    raise OOM(f"{key} {phase}: {type(e).__name__}") from None
                out[key] = {"error": f"{phase}: {describe(e)}"}
                log(f"  {key} failed at {phase}: {out[key]['error']}")
                runners.pop(key, None)
        if not runners:
            return out
        steps = args.steps or int(min(args.max_steps, max(3, round(args.window_seconds / max(step_time.values())))))
        log(f"  {len(runners)} framework(s), {args.windows} windows of {steps} steps each "
            f"(step after warm-up: {', '.join(f'{k} {1e3 * t:.2f} ms' for k, t in step_time.items())})")
        rates = {key: [] for key in runners}
        for _ in range(args.windows):
            for key in list(runners):
                try:
                    device.sync()
                    t = time.perf_counter()
                    for _ in range(steps):
                        runners[key].step()
                    device.sync()
                    rates[key].append(cfg["batch"] * steps / (time.perf_counter() - t))
                except Exception as e:      # noqa: BLE001
                    if is_oom(e):
                        raise OOM(f"{key} timed step: {type(e).__name__}") from None
                    out[key] = {"error": f"step: {describe(e)}"}
                    log(f"  {key} failed: {out[key]['error']}")
                    runners.pop(key).close()
                    rates.pop(key)
        for key, r in rates.items():
            out[key] = {"rates": r, "steps": steps, "probe_step_s": step_time[key]}
            note = getattr(runners[key], "note", lambda: None)()
            if note:
                out[key]["note"] = note
        return out
    finally:
        for r in runners.values():
            r.close()
        runners.clear()
        device.free()


def measure(keys, cfg, ctx, args):
    """All frameworks at once (windows interleaved); on running out of device memory, each alone."""
    try:
        return measure_together(keys, cfg, ctx, args), None
    except OOM as e:
        note = f"out of memory with all at once ({e}): measured one at a time"
        log(f"  {note}")
    ctx["device"].free()
    out = {}
    for key in keys:
        try:
            out.update(measure_together([key], cfg, ctx, args))
        except OOM as e:
            out[key] = {"error": "OOM", "detail": str(e)}
            log(f"  {key}: out of device memory, skipped")
        ctx["device"].free()
    return out, note


# --- the equivalence check -----------------------------------------------------------------------
def check(model, data, host, batch, emb, steps, ctx, args):
    """hetu's and PyTorch's losses over `steps` SGD steps from the same initial parameters."""
    device = ctx["device"]
    cfg = {"model": model, "batch": batch, "emb": emb, "opt": "sgd"}
    result = {"model": model, "batch": batch, "emb": emb, "opt": "sgd", "steps": steps}
    runners = {}
    try:
        torch_runner = TorchRunner(model, host, batch, emb, "sgd", device)
        for key in ctx["hetu_keys"]:
            try:
                runners[key] = build(key, cfg, ctx)
            except Exception as e:          # noqa: BLE001
                result[key] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}
        if not runners:
            return result
        torch_runner.model.load_hetu(next(iter(runners.values())).parameters())
        torch_losses = [torch_runner.step() for _ in range(steps)]
        result["torch_losses"] = torch_losses
        for key, r in runners.items():
            try:
                losses = [r.step() for _ in range(steps)]
            except Exception as e:          # noqa: BLE001
                result[key] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}
                continue
            rel = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, torch_losses))
            result[key] = {"losses": losses, "max_rel_diff": rel}
            if r.note():
                result[key]["note"] = r.note()
        return result
    finally:
        for r in runners.values():
            r.close()
        torch_runner = None
        device.free()


def print_check(result):
    for key in (k for k in ("hetu", "hetu_graph") if k in result):
        r = result[key]
        what = (f"max relative loss difference {r['max_rel_diff']:.2e} over {result['steps']} SGD steps "
                f"(hetu {r['losses'][0]:.6f} .. {r['losses'][-1]:.6f}, torch {result['torch_losses'][0]:.6f} .. "
                f"{result['torch_losses'][-1]:.6f})" + (f"; {r['note']}" if r.get("note") else "")
                if "losses" in r else f"failed: {r['error']}")
        print(f"# check {result['model']} b={result['batch']} emb={result['emb']} {key} vs torch: {what}", flush=True)


# --- the run -------------------------------------------------------------------------------------
def fmt_rate(r):
    if r is None:
        return "-"
    if "rates" in r:
        return f"{statistics.median(r['rates']):.0f}"
    return "OOM" if r.get("error") == "OOM" else "error"


def median(r):
    return statistics.median(r["rates"]) if r and "rates" in r else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="gpu", choices=["gpu", "cpu"])
    ap.add_argument("--models", nargs="+", default=["wdl", "dcn", "ncf"], choices=sorted(HETU_MODEL))
    ap.add_argument("--batch", type=int, nargs="+", default=[1024, 4096, 16384, 65536])
    ap.add_argument("--embedding", type=int, nargs="+", default=[16, 128])
    ap.add_argument("--optimizers", nargs="+", default=["sgd", "adam"], choices=["sgd", "adam"])
    ap.add_argument("--windows", type=int, default=5, help="timed windows per framework (median reported)")
    ap.add_argument("--steps", type=int, default=None,
                    help="steps per window (default: calibrated to --window-seconds from the warm-up)")
    ap.add_argument("--window-seconds", type=float, default=0.2, help="target window length when --steps is not set")
    ap.add_argument("--max-steps", type=int, default=400, help="cap of the calibrated steps per window")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps per framework and configuration")
    ap.add_argument("--rows", type=int, default=None, help="rows of synthetic data (default: 4 x the largest batch)")
    ap.add_argument("--prefetch", type=int, default=2, help="hetu dataloaders' prefetch depth (train.py: 2)")
    ap.add_argument("--cuda-graph", default="auto", choices=["auto", "on", "off"],
                    help="the hetu+graph column (executor option cuda_graph=True): auto = on the GPU when hetu has "
                         "the option")
    ap.add_argument("--compile-modes", nargs="*", default=["default", "reduce-overhead"],
                    help="a torch.compile column per mode (torch.compile's mode argument; 'default' is its "
                         "default; none: no such column)")
    ap.add_argument("--check", action="store_true", help="only the equivalence check, then exit")
    ap.add_argument("--no-check", action="store_true", help="skip the equivalence check before the grid")
    ap.add_argument("--check-steps", type=int, default=5)
    ap.add_argument("--budget", type=float, default=400.0,
                    help="seconds since the start: configurations not started by then are skipped with a note "
                         "(0: no limit)")
    ap.add_argument("--out", default=None, help="also write the results to this JSON file")
    args = ap.parse_args()
    if min(args.batch) <= 0 or min(args.embedding) <= 0 or args.windows <= 0 or (args.steps or 1) <= 0:
        ap.error("--batch, --embedding, --windows and --steps must be positive")

    device = Device(args.device)
    has_option = hetu_has_cuda_graph()
    graph = args.cuda_graph == "on" or (args.cuda_graph == "auto" and args.device == "gpu" and has_option)
    hetu_keys = ["hetu", "hetu_graph"] if graph else ["hetu"]
    modes = [] if args.compile_modes in ([], ["none"]) else list(dict.fromkeys(args.compile_modes))
    compile_modes = {compile_key(m): m for m in modes}
    torch_keys = ["torch"] + list(compile_modes)
    keys = hetu_keys + torch_keys
    label = {"hetu": "hetu", "hetu_graph": "hetu+graph", "torch": "torch",
             **{k: f"tc:{m}" for k, m in compile_modes.items()}}
    best = hetu_keys[-1]      # the ratio to each torch.compile column is hetu's best column's
    info = device.describe()
    info["hetu_cuda_graph_option"] = has_option
    info["torch_compile_modes"] = modes
    vs = "PyTorch eager" + (f" and torch.compile ({', '.join(modes)})" if modes else "")
    print(f"# hetu vs {vs}, one process on {info['device_name']} ({args.device})", flush=True)
    cuda = f" (CUDA {info.get('torch_cuda')})" if args.device == "gpu" else ""
    print(f"# python {info['python']}, torch {info['torch']}{cuda}, cupy {info['cupy']}, numpy {info['numpy']}, "
          f"hetu {info['hetu_commit']}", flush=True)
    why_not = ("--cuda-graph off" if args.cuda_graph == "off" else
               "hetu has no cuda_graph option" if not has_option else "CPU run")
    window = f"{args.steps} steps" if args.steps else f"~{args.window_seconds} s"
    print(f"# float32 (TF32 off), loss fetched to the host every step, median of {args.windows} windows of "
          f"{window}; hetu+graph column: {'yes' if graph else f'no ({why_not})'}", flush=True)
    if modes:
        print("# tc:MODE = torch.compile(model and loss, mode=MODE, dynamic=False), embedding lookups (sparse "
              "gradients) and optimizers eager; compiled in "
              "the warm-up; a mode that fails is an error cell" +
              ("; on the CPU reduce-overhead has no CUDA graphs to use" if args.device == "cpu" else ""), flush=True)
    if graph and not has_option:
        print("# note: this hetu has no cuda_graph option (Executor ignores unknown options): the hetu+graph "
              "column runs hetu's plain executor", flush=True)
    if HETU_ERROR:
        print(f"# {HETU_ERROR}", flush=True)
        info["hetu_error"] = HETU_ERROR
    results = {"info": info, "args": vars(args), "checks": [], "results": []}

    def save():
        if args.out:
            with open(args.out, "w") as f:
                json.dump(results, f, indent=1)

    rows = args.rows or 4 * max(args.batch)
    configs = [(m, b, e, o) for m in args.models for b in args.batch for e in args.embedding for o in args.optimizers]
    datasets = {}
    ctx = {"device": device, "graph_option": graph, "prefetch": args.prefetch, "hetu_keys": hetu_keys,
           "compile_modes": compile_modes}

    def dataset(model):
        if model not in datasets:
            datasets.clear()
            ctx.pop("host", None)
            gc.collect()
            log(f"{model}: {rows} rows of synthetic data")
            datasets[model] = make_data(model, rows)
        ctx["data"] = datasets[model]
        ctx["host"] = HostBatches(datasets[model], device) if ctx.get("host_of") != model else ctx["host"]
        ctx["host_of"] = model
        return datasets[model]

    if not args.no_check:
        cb, ce = min(min(args.batch), 1024), min(args.embedding)
        for model in args.models:
            log(f"check {model}: batch {cb}, embedding {ce}, {args.check_steps} SGD steps from hetu's initial parameters")
            dataset(model)
            r = check(model, ctx["data"], ctx["host"], cb, ce, args.check_steps, ctx, args)
            results["checks"].append(r)
            print_check(r)
            save()
        if args.check:
            return

    width = {k: max(11, len(label[k]) + 2) for k in keys}
    ratio_cols = [(h, "torch") for h in hetu_keys] + [(best, k) for k in compile_modes]
    ratio_label = {(h, t): f"{'hetu' if h == 'hetu' else 'graph'}/{label[t]}" for h, t in ratio_cols}
    ratio_width = {c: max(11, len(ratio_label[c]) + 2) for c in ratio_cols}
    head = f"{'model':<6}{'batch':>7}{'emb':>5} {'opt':<5}" + "".join(f"{label[k]:>{width[k]}}" for k in keys)
    head += "".join(f"{ratio_label[c]:>{ratio_width[c]}}" for c in ratio_cols) + "  note"
    print("# samples/s\n" + head + "\n" + "-" * len(head), flush=True)
    start = time.perf_counter()
    for n, (model, batch, emb, opt) in enumerate(configs, 1):
        cfg = {"model": model, "batch": batch, "emb": emb, "opt": opt}
        if args.budget and time.perf_counter() - T0 > args.budget:
            note = f"skipped: --budget {args.budget:.0f}s spent"
            out, note2 = {}, None
        else:
            log(f"[{n}/{len(configs)}] {model} batch {batch} emb {emb} {opt}")
            dataset(model)
            out, note2 = measure(keys, cfg, ctx, args)
            note = note2 or ""
        row = dict(cfg)
        for key in keys:
            if key in out:
                row[key] = median(out[key])
                row[key + "_detail"] = out[key]
        row["ratios"] = {f"{h}/{t}": row[h] / row[t] if row.get(h) and row.get(t) else None
                         for h in hetu_keys for t in torch_keys}
        row["ratio"] = row["ratios"]["hetu/torch"]
        if graph:
            row["graph_ratio"] = row["ratios"]["hetu_graph/torch"]
        errors = [f"{k}: {out[k][w]}" for k in keys for w in ("error", "note") if k in out and w in out[k]]
        note = "; ".join(x for x in [note] + errors if x)
        row["note"] = note
        results["results"].append(row)
        line = f"{model:<6}{batch:>7}{emb:>5} {opt:<5}" + "".join(f"{fmt_rate(out.get(k)):>{width[k]}}" for k in keys)
        for c in ratio_cols:
            r = row["ratios"][f"{c[0]}/{c[1]}"]
            line += f"{r:>{ratio_width[c] - 1}.2f}x" if r else f"{'-':>{ratio_width[c]}}"
        print(line + (f"  {note[:160]}" if note else ""), flush=True)   # the whole note is in --out
        save()
    log(f"done: {len(configs)} configurations in {time.perf_counter() - start:.0f}s")
    save()


if __name__ == "__main__":
    main()
