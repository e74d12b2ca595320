"""Optimizers. The kinds, their hyperparameters and defaults are the registry of
src/common/optim_rules.h (read through hetu._C); the update rules are the C++ ones of
src/common/optim_step.h, shared with the parameter server and compiled for the GPU too. Dense
tensors are stepped whole, embedding tables row by row (rows not in the batch are untouched,
duplicate ids summed first)."""
import os

import numpy as np

from . import _C, cuda
from .autodiff import gradients
from .graph import Op, Variable, topo_sort
from .lr import FixedScheduler, as_scheduler
from .ops.embedding import BagGradient, IndexedSlices, LookupGradient, unique_sum

# The kinds as src/common/optim_rules.h declares them: name -> {name, kind, dense_kind, rowwise,
# catches_up, hyperparameters: {name: this kind's default}}.
KINDS = {k["name"]: k for k in _C.optimizer_kinds()}
KIND_NAMES = {k["kind"]: name for name, k in KINDS.items()}
# The types embedding rows may be stored in (src/common/storage.h): each step computes in float32
# and rounds the row to its type; optimizer state stays float32.
EMBEDDING_DTYPES = {name: code for code, name in enumerate(_C.STORAGE_TYPES)}   # "fp32": 0, "bf16": 1, "fp16": 2


def config(kind, **hyperparameters):
    """The OptimConfig of kind `kind` (a name of KINDS or its number): the kind's defaults, then
    `hyperparameters`, which must be ones the kind reads."""
    info = _info(kind)
    unknown = set(hyperparameters) - set(info["hyperparameters"])
    if unknown:
        raise ValueError(f"optimizer {info['name']!r} has no settings {sorted(unknown)}: it reads "
                         f"{sorted(info['hyperparameters'])}")
    c = _C.OptimConfig()
    c.kind = info["kind"]
    for key, value in dict(info["hyperparameters"], **hyperparameters).items():
        setattr(c, key, value)
    return c


def _info(kind):
    """KINDS' entry of a kind given by name or number."""
    return KINDS[KIND_NAMES[kind] if isinstance(kind, int) else kind]


def _defaults(kind):
    return KINDS[kind]["hyperparameters"]


class Optimizer:
    """Steps parameters by the rule of kind `kind` (a name of KINDS). The classes below name the
    kinds and their settings; `optimizer(name, ...)` makes any kind by name."""
    kind = "sgd"

    def __init__(self, learning_rate=0.01, l2reg=None, embedding_dtype="fp32", *, kind=None, **rule):
        if embedding_dtype not in EMBEDDING_DTYPES:
            raise ValueError(f"embedding_dtype {embedding_dtype!r}: expected one of {sorted(EMBEDDING_DTYPES)}")
        if kind is not None:
            self.kind = kind
        if l2reg is not None:
            rule["l2reg"] = l2reg
        self.lr = as_scheduler(learning_rate)
        if _info(self.kind)["catches_up"]:
            # The servers apply a row's skipped steps when it is next read, knowing no past rate.
            if "catch_up_lr" in rule:
                raise ValueError(f"optimizer {self.kind!r}: catch_up_lr is the learning rate; do not set it")
            if type(self.lr) is not FixedScheduler:
                raise ValueError(f"optimizer {self.kind!r} steps the rows a step did not read at one constant rate: "
                                 f"learning_rate must be a number, not a schedule ({type(self.lr).__name__})")
            rule["catch_up_lr"] = self.lr.learning_rate
        self.embedding_dtype = embedding_dtype
        self.config = config(self.kind, **rule)   # embedding rows
        self.config.storage = EMBEDDING_DTYPES[embedding_dtype]
        # A row-wise kind keeps state per embedding row, which a dense tensor does not have: dense
        # tensors are stepped by the kind's element-wise dense kind instead, with the same settings.
        self.dense_config = _C.OptimConfig()
        self.dense_config.kind = _info(self.kind)["dense_kind"]
        for key in _C.optimizer_hyperparameters():
            setattr(self.dense_config, key, getattr(self.config, key))
        self.l2reg = self.config.l2reg

    @property
    def catches_up(self):
        """Whether table rows take every step (the steps a row was not read at applied, with zero
        gradient, before it is next read or stepped: dense Adam's result), not lazy steps."""
        return _info(self.config.kind)["catches_up"]

    def catch_up(self, table, state, steps, rows, target):
        """A catch-up kind's rows (ids of a table this process holds: any order, repeats allowed,
        ids outside the table skipped) brought to step `target`, the number of steps taken so
        far, so that a read sees dense Adam's value."""
        if cuda.is_device_array(table):
            raise NotImplementedError(f"optimizer {self.kind!r}: a table on the GPU does not catch up its rows; "
                                      f"put the tables on the parameter server (--comm PS or Hybrid) or use 'adam'")
        _C.catch_up_rows(self.config, table, state, steps, np.ascontiguousarray(rows, np.int64), int(target))

    def state_width(self, width, dense=False):
        """Floats of optimizer state beside an embedding row of `width` floats, or with `dense`
        beside a dense tensor of `width` elements."""
        return _C.optim_state_width((self.dense_config if dense else self.config).kind, width)

    def rule(self, dense=False):
        """The update rule of embedding rows (with `dense`: of dense tensors) as plain values:
        what a parameter server needs to apply it. {"kind": name, hyperparameter: value}."""
        c = self.dense_config if dense else self.config
        return dict(kind=KIND_NAMES[c.kind], **{key: getattr(c, key) for key in _C.optimizer_hyperparameters()})

    def round_rows(self, table):
        """An embedding table's values rounded, in place, to the type its rows are stored in (what
        a table starts as: its initializer's values, rounded)."""
        _C.round_to_storage(table, self.config.storage)

    def minimize(self, loss, var_list=None):
        """The train op: computes gradients of `loss` and steps every trainable parameter."""
        params = var_list or [n for n in topo_sort([loss]) if isinstance(n, Variable) and n.trainable]
        grads = gradients(loss, params)
        pairs = [(p, g) for p, g in zip(params, grads) if g is not None]
        return OptimizerOp(loss, pairs, self)

    def step_dense(self, lr, value, state, steps, grad, guard=None):
        """One step of a whole tensor. `guard` (device only): a device int64 that is -1 when the
        step may go ahead (hetu.cuda.DeviceChecks), so a non-finite loss skips it without the
        host waiting for the device."""
        if cuda.is_device_array(value):
            _gpu_step(self.dense_config, lr, value.reshape(-1), state, steps, grad.reshape(-1), None, None, 1,
                      value.size, guard)
            return
        _C.apply_dense(self.dense_config, lr, value.reshape(-1), state, steps,
                       np.ascontiguousarray(grad, np.float32).reshape(-1))

    def step_rows(self, lr, table, state, steps, grad, guard=None, name="optimizer", step=None):
        """One step for the rows of `table` named by a sparse gradient (ids may repeat). A bag's
        or a lookup's gradient on the host steps the rows as it sums them (step_into). `step`:
        this step's number (1 for the first), which a catch-up kind brings a row to the step
        before first. A bag's or a lookup's gradient names rows the lookup read, which caught
        them up already; another gradient (an AllReduce's gathered rows) may name rows this
        process did not read."""
        if self.catches_up and not isinstance(grad, (BagGradient, LookupGradient)):
            if step is None:
                raise ValueError(f"{name}: optimizer {self.kind!r} needs the step's number to catch rows up")
            self.catch_up(table, state, steps, grad.indices, step - 1)
        if isinstance(grad, (BagGradient, LookupGradient)) and not cuda.is_device_array(table):
            grad.step_into(name, self.config, lr, table, state, steps)
            return
        summed = unique_sum(grad.indices, grad.values)
        if cuda.is_device_array(table):
            if self.config.storage:
                raise NotImplementedError(f"embedding_dtype {self.embedding_dtype!r}: a table on the GPU is stepped "
                                          f"in fp32 only; keep --embedding-dtype fp32, or put the tables on the "
                                          f"parameter server (--comm PS or Hybrid), where they may be 16-bit")
            _gpu_step(self.config, lr, table, state, steps, summed.summed, summed.uniq, summed.count,
                      summed.summed.shape[0], table.shape[1], guard)
            return
        _C.apply_rows(self.config, lr, table, state, steps, *summed)


def optimizer(name, learning_rate=0.01, embedding_dtype="fp32", **hyperparameters):
    """An Optimizer of the kind `name` (a name of KINDS): its defaults, then `hyperparameters`."""
    if name not in KINDS:
        raise ValueError(f"optimizer {name!r}: expected one of {sorted(KINDS)}")
    return Optimizer(learning_rate, embedding_dtype=embedding_dtype, kind=name, **hyperparameters)


class SGDOptimizer(Optimizer):
    kind = "sgd"

    def __init__(self, learning_rate=0.01, l2reg=_defaults("sgd")["l2reg"], embedding_dtype="fp32"):
        super().__init__(learning_rate, l2reg, embedding_dtype)


class MomentumOptimizer(Optimizer):
    def __init__(self, learning_rate=0.01, momentum=_defaults("momentum")["momentum"], nesterov=False,
                 l2reg=_defaults("momentum")["l2reg"], embedding_dtype="fp32"):
        self.kind = "nesterov" if nesterov else "momentum"
        super().__init__(learning_rate, l2reg, embedding_dtype, momentum=momentum)


class AdaGradOptimizer(Optimizer):
    kind = "adagrad"

    def __init__(self, learning_rate=0.01, eps=_defaults("adagrad")["eps"], l2reg=_defaults("adagrad")["l2reg"],
                 embedding_dtype="fp32"):
        super().__init__(learning_rate, l2reg, embedding_dtype, eps=eps)


class RowwiseAdaGradOptimizer(Optimizer):
    """FBGEMM's exact row-wise AdaGrad for embedding tables: one accumulator per row, grown by the
    mean of the row's squared gradient. Dense tensors take element-wise AdaGrad (as TorchRec's
    DLRM trains them)."""
    kind = "rowwise_adagrad"

    def __init__(self, learning_rate=0.01, eps=_defaults("rowwise_adagrad")["eps"],
                 l2reg=_defaults("rowwise_adagrad")["l2reg"], embedding_dtype="fp32"):
        super().__init__(learning_rate, l2reg, embedding_dtype, eps=eps)


class AdamOptimizer(Optimizer):
    """Adam. Embedding tables take lazy row-wise steps, as FBGEMM's and TF's LazyAdam: a row not
    read in a step is not stepped (its moments do not decay, it does not move), and each row keeps
    its own step count for the bias correction. Dense parameters take ordinary Adam steps (the
    step count is the global step). In PyTorch terms: torch.optim.SparseAdam with per-row step
    counts on the tables, not torch.optim.Adam; docs/results/quality.md measures the two apart."""
    kind = "adam"

    def __init__(self, learning_rate=0.01, beta1=_defaults("adam")["beta1"], beta2=_defaults("adam")["beta2"],
                 epsilon=_defaults("adam")["eps"], l2reg=_defaults("adam")["l2reg"], embedding_dtype="fp32"):
        super().__init__(learning_rate, l2reg, embedding_dtype, beta1=beta1, beta2=beta2, eps=epsilon)


class AdamWOptimizer(Optimizer):
    """AdamW (decoupled weight decay), stepped as AdamOptimizer: lazy row-wise on tables, a row's
    decay applied only at the steps that read it."""
    kind = "adamw"

    def __init__(self, learning_rate=0.01, beta1=_defaults("adamw")["beta1"], beta2=_defaults("adamw")["beta2"],
                 epsilon=_defaults("adamw")["eps"], weight_decay=_defaults("adamw")["weight_decay"],
                 embedding_dtype="fp32"):
        super().__init__(learning_rate, None, embedding_dtype, beta1=beta1, beta2=beta2, eps=epsilon,
                         weight_decay=weight_decay)


def _all_finite(x):
    return cuda.cupy().isfinite(x).all() if cuda.is_device_array(x) else np.all(np.isfinite(x))


def _nonfinite_flag(loss, flag):
    """flag = 0 where any element of the loss is not finite (else it stays -1), on the device."""
    cp = cuda.cupy()
    bad = cp.logical_not(cp.isfinite(loss)).any()
    cp.copyto(flag, cp.where(bad, 0, flag[0]))


class OptimizerOp(Op):
    """Steps every (parameter, gradient) pair; stops on a non-finite loss before any update.
    Inputs: the loss, then the gradients."""
    has_side_effect = True
    capturable = False   # sparse gradients are summed by a sort; updaters talk to other processes

    def __init__(self, loss, pairs, optimizer):
        super().__init__(loss, *[g for _, g in pairs])
        self.loss = loss
        self.params = [p for p, _ in pairs]
        self.optimizer = optimizer
        self.step_count = 0
        # param id -> object with update(state, param, grad, lr, step): set by the distribution passes
        # for parameters that are summed across workers or live on the parameter server.
        self.updaters = {}

    def infer_shape(self, s):
        return None

    def compute(self, vals, state):
        loss = vals[0]
        state.update_guard = None
        if cuda.is_device_array(loss) and not self.updaters:
            # Every update is a local device step: they are skipped on the device if the loss is
            # not finite, and the executor raises after the step, so the host never waits here.
            state.update_guard = state.checks.slot(self.name, lambda _: FloatingPointError(
                f"loss {self.loss.name} is not finite at iteration {state.iteration}: training stopped"))
            _nonfinite_flag(loss, state.update_guard)
        elif not bool(_all_finite(loss)):
            raise FloatingPointError(f"loss {self.loss.name} is {float(cuda.to_host(loss).reshape(-1)[0])} "
                                     f"at iteration {state.iteration}: training stopped")
        lr = self.optimizer.lr.get(self.step_count)
        for param, grad in zip(self.params, vals[1:]):
            self.step_param(state, param, grad, lr)
        self.step_count += 1
        return None

    def step_param(self, state, param, grad, lr):
        updater = self.updaters.get(param.id)
        if updater is not None:
            updater.update(state, param, grad, lr, self.step_count + 1)
        else:
            local_update(state, self.optimizer, param, grad, lr, self.step_count + 1)


def local_update(state, optimizer, param, grad, lr, step):
    """Step number `step` (1 for the first) of a parameter held by this process."""
    value = state.param_value(param)
    sparse = isinstance(grad, IndexedSlices)
    opt_state, steps = state.optimizer_state(param, optimizer, rowwise=sparse)
    if sparse:
        optimizer.step_rows(lr, value, opt_state, steps, grad, state.update_guard, name=param.name, step=step)
    else:
        optimizer.step_dense(lr, value, opt_state, steps, grad, state.update_guard)


# The device's step: the kernels below over the rules of src/common/optim_step.h (installed as
# hetu/include/optim_step.h), whose text is prepended to them, so the device runs the host's
# arithmetic (compiled without fused multiply-adds: it rounds as the host does). The
# hyperparameters come as floats, in the registry's order.
_STEP_KERNELS = r"""
__device__ hetu::optim::Config hetu_optim_config(int kind, HYPERPARAMETERS) {
  hetu::optim::Config c;
  c.kind = kind;
  CONFIG
  return c;
}

// Steps rows[i] (or row i where rows is null) of `w` with grads[i, :], for i < *count (or n
// where count is null), unless *guard != -1. A grid-stride loop over the elements; the row's
// step count is read here and advanced by hetu_optim_count afterwards.
extern "C" __global__ void hetu_optim_step(int kind, float lr, HYPERPARAMETERS, float* w, float* state,
                                           const long long* steps, const float* grads, const long long* rows,
                                           const long long* count, long long n, long long width,
                                           const long long* guard) {
  if (guard != nullptr && *guard != -1) return;
  const hetu::optim::Config c = hetu_optim_config(kind, ARGUMENTS);
  const long long sw = hetu::optim::state_width(kind, width);
  long long end = (count != nullptr ? *count : n) * width;
  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < end;
       e += (long long)gridDim.x * blockDim.x) {
    long long i = e / width, j = e - i * width;
    long long r = rows != nullptr ? rows[i] : i;
    hetu::optim::step_element(c, lr, w + r * width + j, state + r * sw + j, width, grads[i * width + j],
                              steps[r] + 1);
  }
}

// The row-wise kinds: a row's state needs the row's whole gradient first, so one thread steps
// one row (a grid-stride loop over rows), summing in index order as the host does.
extern "C" __global__ void hetu_optim_step_rowwise(int kind, float lr, HYPERPARAMETERS, float* w, float* state,
                                                   const float* grads, const long long* rows,
                                                   const long long* count, long long n, long long width,
                                                   const long long* guard) {
  if (guard != nullptr && *guard != -1) return;
  const hetu::optim::Config c = hetu_optim_config(kind, ARGUMENTS);
  const long long sw = hetu::optim::state_width(kind, width);
  long long end = count != nullptr ? *count : n;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < end;
       i += (long long)gridDim.x * blockDim.x) {
    long long r = rows != nullptr ? rows[i] : i;
    hetu::optim::step_rowwise(c, lr, w + r * width, state + r * sw, grads + i * width, width);
  }
}

extern "C" __global__ void hetu_optim_count(long long* steps, const long long* rows, const long long* count,
                                            long long n, const long long* guard) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= n) return;
  if (guard != nullptr && *guard != -1) return;
  if (count != nullptr && i >= *count) return;
  steps[rows != nullptr ? rows[i] : i] += 1;
}
"""
_step_source_text = None


def step_source():
    """The CUDA source of the device's step kernels: optim_step.h, then _STEP_KERNELS."""
    global _step_source_text
    if _step_source_text is None:
        names = list(_C.optimizer_hyperparameters())
        with open(os.path.join(os.path.dirname(__file__), "include", "optim_step.h")) as f:
            rules = f.read()
        _step_source_text = rules + (_STEP_KERNELS.replace("HYPERPARAMETERS", ", ".join(f"float {h}" for h in names))
                                     .replace("ARGUMENTS", ", ".join(names))
                                     .replace("CONFIG", " ".join(f"c.{h} = {h};" for h in names)))
    return _step_source_text


def _gpu_step(c, lr, w, state, steps, grads, rows, count, n, width, guard):
    """One step of n rows of width `width` on the device (see _STEP_KERNELS)."""
    cp = cuda.cupy()
    null = np.intp(0)   # a null pointer argument
    grads = cp.ascontiguousarray(grads, dtype=np.float32)
    rows_arg = rows if rows is not None else null
    count_arg = count if count is not None else null
    guard_arg = guard if guard is not None else null
    head = (np.int32(c.kind), np.float32(lr), *(np.float32(getattr(c, h)) for h in _C.optimizer_hyperparameters()),
            w, state if state.size else w)
    tail = (grads, rows_arg, count_arg, np.int64(n), np.int64(width), guard_arg)
    if KINDS[KIND_NAMES[c.kind]]["rowwise"]:
        cuda.launch(cuda.raw_kernel("hetu_optim_step_rowwise", step_source()), n, head + tail,
                    max_blocks=cuda.STRIDE_BLOCKS)
    else:
        cuda.launch(cuda.raw_kernel("hetu_optim_step", step_source()), n * width, head + (steps,) + tail,
                    max_blocks=cuda.STRIDE_BLOCKS)
    cuda.launch(cuda.raw_kernel("hetu_optim_count", step_source()), n,
                (steps, rows_arg, count_arg, np.int64(n), guard_arg))


__all__ = ["Optimizer", "optimizer", "SGDOptimizer", "MomentumOptimizer", "AdaGradOptimizer", "RowwiseAdaGradOptimizer",
           "AdamOptimizer", "AdamWOptimizer", "OptimizerOp"]
