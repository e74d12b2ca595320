"""A training step's time split by op family, for hetu and for PyTorch alike
(`bench/single_worker.py --profile`).

hetu: every node's compute is timed (the executor's _compute) and put in the family of its op
class, less the time of calls inside it that belong to another family: the sparse gradients'
unique-and-sum (hetu.optim.unique_sum) and a bag's gradient where it is summed or, fused, stepped
(Bags.gradient, BagGradient.step_into: bag gradient, the optimizer's work on those rows
included). PyTorch: torch.profiler's events,
each op's self time put in the family of its outermost event that names one (an event inside
Optimizer.step is the optimizer's; coalesce, wherever it runs, is unique-and-sum). In both, a
step's wall time less its ops' time is the framework's overhead (Python, autograd's and the
executor's bookkeeping, the profiler's own cost).

Beside hetu's GEMMs, the same products as bare np.matmul calls ("GEMMs as bare np.matmul"): each
product's shapes and transpositions are recorded during the profiled steps, and arrays of those
shapes multiplied alone afterwards (fastest of a few calls each), a matrix on the BLAS threads
hetu takes for it, a stack as NumPy's matmul of the stack (a BLAS call per product). hetu's
GEMM time over it says whether its products run at the BLAS's speed; a LinearOp's time also
holds its bias and ReLU, which the bare call does not."""
import re
import time

FAMILIES = ("bag pooling", "bag gradient", "unique-and-sum", "optimizer step", "GEMMs", "elementwise", "loss",
            "data feed", "framework overhead")

# hetu's op classes by family; any other op is elementwise (activations, broadcasts, reshapes,
# concat, the pairwise dots' gather).
HETU_FAMILIES = {
    "bag pooling": ("EmbeddingBagOp", "EmbeddingLookupOp", "PSEmbeddingLookupOp"),
    "bag gradient": ("EmbeddingBagGradOp", "EmbeddingLookupGradOp", "SparseSumOp"),
    "GEMMs": ("MatMulOp", "LinearOp"),
    "loss": ("BinaryCrossEntropyWithLogitsOp", "BinaryCrossEntropyOp", "LossGradOp"),
    "data feed": ("DataloaderOp",),
}

# PyTorch's op names, tried in this order on the outermost event of an op first; unique-and-sum
# wins wherever it sits (SGD's sparse add and SparseAdam coalesce inside Optimizer.step).
TORCH_RULES = (
    ("unique-and-sum", re.compile(r"coalesce")),
    ("optimizer step", re.compile(r"^Optimizer\.(step|zero_grad)")),
    ("bag gradient", re.compile(r"EmbeddingBagBackward|embedding_bag.*backward|EmbeddingBackward|embedding.*backward"
                                r"|embedding_sparse")),
    ("bag pooling", re.compile(r"embedding_bag|aten::embedding$")),
    ("GEMMs", re.compile(r"addmm|aten::mm$|aten::bmm$|aten::matmul$|aten::linear$|AddmmBackward|MmBackward|BmmBackward"
                         r"|LinearBackward")),
    ("loss", re.compile(r"binary_cross_entropy|BinaryCrossEntropy")),
)


BARE_GEMMS = "GEMMs as bare np.matmul"


def quietest(rounds, profile_round):
    """The round with the shortest step of `rounds` calls of profile_round(): on a shared
    machine, the one least disturbed by other jobs."""
    return min((profile_round() for _ in range(rounds)), key=lambda p: p["step_ms"])


def hetu_profile(executor, steps, warmup):
    """ms per step by family over `steps` steps of executor.run("train"), after `warmup` steps."""
    from hetu import optim
    from hetu.ops import embedding
    family_of = {name: fam for fam, names in HETU_FAMILIES.items() for name in names}
    spent = dict.fromkeys(FAMILIES, 0.0)
    nested = [0.0]   # time of the calls below, taken out of the op that made them

    def timed(fn, family):
        def call(*args, **kwargs):
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                took = time.perf_counter() - started
                nested[0] += took
                spent[family] += took
        return call

    # Work done inside another op's compute, by family: the sums of sparse gradients in the
    # optimizer, and a bag's gradient summed where it is read (fused with the step: its one pass
    # counts as the bag gradient).
    calls = [(optim, "unique_sum", "unique-and-sum"), (embedding.Bags, "gradient", "bag gradient")]
    if hasattr(embedding, "BagGradient"):
        calls.append((embedding.BagGradient, "step_into", "bag gradient"))
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in calls]
    compute = executor._compute
    products = []   # (a's shape, b's shape, trans_A, trans_B) of every GEMM computed

    def timed_compute(node, vals, host_vals):
        if type(node).__name__ in HETU_FAMILIES["GEMMs"]:
            a, b = (vals[x.id] for x in node.inputs[:2])
            products.append((a.shape, b.shape, getattr(node, "trans_A", False), getattr(node, "trans_B", False)))
        started, before = time.perf_counter(), nested[0]
        try:
            return compute(node, vals, host_vals)
        finally:
            took = time.perf_counter() - started - (nested[0] - before)
            kind = type(node).__name__
            spent["optimizer step" if kind == "OptimizerOp" else family_of.get(kind, "elementwise")] += took

    for _ in range(warmup):
        executor.run("train")
    executor._compute = timed_compute
    for owner, name, family in calls:
        setattr(owner, name, timed(getattr(owner, name), family))
    try:
        started = time.perf_counter()
        for _ in range(steps):
            executor.run("train")
        wall = time.perf_counter() - started
    finally:
        executor._compute = compute
        for owner, name, fn in originals:
            setattr(owner, name, fn)
    return {**_per_step(spent, wall, steps), BARE_GEMMS: bare_gemm_ms(products, steps)}


def bare_gemm_ms(products, steps, calls=5):
    """ms a step that `products` (recorded over `steps` steps) take as bare np.matmul calls on
    arrays of their shapes: a matrix on the BLAS threads hetu takes for that product, a stack
    as NumPy's matmul of it. Each distinct product is timed alone, fastest of `calls` calls."""
    import collections

    import numpy as np
    from hetu.ops import math
    blas_threads = getattr(math, "BLAS_THREADS", None) or math._BLAS_THREADS   # (its name in older builds)
    rng = np.random.default_rng(0)
    total = 0.0
    for (a_shape, b_shape, trans_a, trans_b), count in collections.Counter(products).items():
        a = rng.standard_normal(a_shape).astype(np.float32)
        b = rng.standard_normal(b_shape).astype(np.float32)
        a, b = (a.swapaxes(-1, -2) if trans_a else a), (b.swapaxes(-1, -2) if trans_b else b)
        out = np.empty(a.shape[:-1] + b.shape[-1:], np.float32)
        blas_threads.for_product(out[0].size * a.shape[-1] if a.ndim == 3 else out.size * a.shape[-1])
        fastest = float("inf")
        for _ in range(calls):
            started = time.perf_counter()
            np.matmul(a, b, out=out)
            fastest = min(fastest, time.perf_counter() - started)
        total += count * fastest
    return 1e3 * total / steps


def torch_profile(step, steps, warmup):
    """ms per step by family over `steps` calls of `step` under torch.profiler, after `warmup`."""
    import torch
    for _ in range(warmup):
        step()
    spent = dict.fromkeys(FAMILIES, 0.0)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        started = time.perf_counter()
        for _ in range(steps):
            step()
        wall = time.perf_counter() - started
    for event in prof.events():
        chain = []
        e = event
        while e is not None:
            chain.append(e.name)
            e = e.cpu_parent
        spent[_torch_family(chain)] += event.self_cpu_time_total / 1e6
    return _per_step(spent, wall, steps)


def _torch_family(chain):
    """The family of an op given its event and its ancestors' names (innermost first)."""
    if any(TORCH_RULES[0][1].search(name) for name in chain):
        return TORCH_RULES[0][0]
    for name in reversed(chain):   # the outermost event that names a family
        for family, rule in TORCH_RULES[1:]:
            if rule.search(name):
                return family
    return "elementwise"


def _per_step(spent, wall, steps):
    ops = sum(v for k, v in spent.items() if k != "framework overhead")
    spent["framework overhead"] = max(0.0, wall - ops)
    return {"step_ms": 1e3 * wall / steps, **{k: 1e3 * v / steps for k, v in spent.items()}}


def table(title, columns):
    """A markdown table: a row per family, for each column (name, profile) ms and share of the step."""
    head = "| " + title + " | " + " | ".join(f"{name} ms | {name} %" for name, _ in columns) + " |"
    lines = [head, "|---" * (1 + 2 * len(columns)) + "|"]
    rows = FAMILIES[:FAMILIES.index("GEMMs") + 1] + (BARE_GEMMS,) + FAMILIES[FAMILIES.index("GEMMs") + 1:]
    for family in rows + ("step",):
        if family == BARE_GEMMS and not any(BARE_GEMMS in prof for _, prof in columns):
            continue
        cells = []
        for _, prof in columns:
            ms = prof["step_ms"] if family == "step" else prof.get(family)
            cells += ["-", "-"] if ms is None else [f"{ms:.2f}", f"{100 * ms / prof['step_ms']:.0f}"]
        lines.append(f"| {family} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
