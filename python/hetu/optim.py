"""Optimizers. The update rules are the C++ ones in src/common/optim_rules.h, shared with the
parameter server; dense tensors are stepped whole, embedding tables row by row (rows not in the
batch are untouched, duplicate ids summed first)."""
import numpy as np

from . import _C, cuda
from .autodiff import gradients
from .graph import Op, Variable, topo_sort
from .lr import as_scheduler
from .ops.embedding import IndexedSlices, unique_sum

SGD, MOMENTUM, NESTEROV, ADAGRAD, ADAM, ADAMW, ROWWISE_ADAGRAD = range(7)
# The types embedding rows may be stored in (src/common/storage.h): each step computes in float32
# and rounds the row to its type; optimizer state stays float32.
EMBEDDING_DTYPES = {name: code for code, name in enumerate(_C.STORAGE_TYPES)}   # "fp32": 0, "bf16": 1, "fp16": 2
KIND_NAMES = {SGD: "sgd", MOMENTUM: "momentum", NESTEROV: "nesterov", ADAGRAD: "adagrad", ADAM: "adam",
              ADAMW: "adamw", ROWWISE_ADAGRAD: "rowwise_adagrad"}


def _config(kind, l2reg, rule):
    config = _C.OptimConfig()
    config.kind = kind
    config.l2reg = l2reg
    for key, value in rule.items():
        setattr(config, key, value)
    return config


class Optimizer:
    kind = SGD
    # A row-wise kind keeps state per embedding row, which a dense tensor does not have: dense
    # tensors are stepped by this element-wise kind instead, with the same settings.
    dense_kind = None

    def __init__(self, learning_rate=0.01, l2reg=0.0, embedding_dtype="fp32", **rule):
        if embedding_dtype not in EMBEDDING_DTYPES:
            raise ValueError(f"embedding_dtype {embedding_dtype!r}: expected one of {sorted(EMBEDDING_DTYPES)}")
        self.lr = as_scheduler(learning_rate)
        self.embedding_dtype = embedding_dtype
        self.config = _config(self.kind, l2reg, rule)   # embedding rows
        self.config.storage = EMBEDDING_DTYPES[embedding_dtype]
        self.dense_config = _config(self.kind if self.dense_kind is None else self.dense_kind, l2reg, rule)
        self.l2reg = l2reg

    def state_width(self, width, dense=False):
        """Floats of optimizer state beside an embedding row of `width` floats, or with `dense`
        beside a dense tensor of `width` elements."""
        return _C.optim_state_width((self.dense_config if dense else self.config).kind, width)

    def rule(self, dense=False):
        """The update rule of embedding rows (with `dense`: of dense tensors) as plain values:
        what a parameter server needs to apply it."""
        c = self.dense_config if dense else self.config
        return {"kind": KIND_NAMES[c.kind], "momentum": c.momentum, "beta1": c.beta1, "beta2": c.beta2,
                "eps": c.eps, "l2reg": c.l2reg, "weight_decay": c.weight_decay}

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

    def step_rows(self, lr, table, state, steps, grad, guard=None):
        """One step for the rows of `table` named by a sparse gradient (ids may repeat)."""
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


class SGDOptimizer(Optimizer):
    kind = SGD

    def __init__(self, learning_rate=0.01, l2reg=0.0, embedding_dtype="fp32"):
        super().__init__(learning_rate, l2reg, embedding_dtype)


class MomentumOptimizer(Optimizer):
    def __init__(self, learning_rate=0.01, momentum=0.9, nesterov=False, l2reg=0.0, embedding_dtype="fp32"):
        self.kind = NESTEROV if nesterov else MOMENTUM
        super().__init__(learning_rate, l2reg, embedding_dtype, momentum=momentum)


class AdaGradOptimizer(Optimizer):
    kind = ADAGRAD

    def __init__(self, learning_rate=0.01, eps=1e-7, l2reg=0.0, embedding_dtype="fp32"):
        super().__init__(learning_rate, l2reg, embedding_dtype, eps=eps)


class RowwiseAdaGradOptimizer(Optimizer):
    """FBGEMM's exact row-wise AdaGrad for embedding tables: one accumulator per row, grown by the
    mean of the row's squared gradient. Dense tensors take element-wise AdaGrad (as TorchRec's
    DLRM trains them)."""
    kind = ROWWISE_ADAGRAD
    dense_kind = ADAGRAD

    def __init__(self, learning_rate=0.01, eps=1e-7, l2reg=0.0, embedding_dtype="fp32"):
        super().__init__(learning_rate, l2reg, embedding_dtype, eps=eps)


class AdamOptimizer(Optimizer):
    kind = ADAM

    def __init__(self, learning_rate=0.01, beta1=0.9, beta2=0.999, epsilon=1e-7, l2reg=0.0, embedding_dtype="fp32"):
        super().__init__(learning_rate, l2reg, embedding_dtype, beta1=beta1, beta2=beta2, eps=epsilon)


class AdamWOptimizer(Optimizer):
    kind = ADAMW

    def __init__(self, learning_rate=0.01, beta1=0.9, beta2=0.999, epsilon=1e-7, weight_decay=0.01,
                 embedding_dtype="fp32"):
        super().__init__(learning_rate, 0.0, embedding_dtype, beta1=beta1, beta2=beta2, eps=epsilon,
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
        # param id -> object with update(state, param, grad, lr): set by the distribution passes
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
            updater.update(state, param, grad, lr)
        else:
            local_update(state, self.optimizer, param, grad, lr)


def local_update(state, optimizer, param, grad, lr):
    """One optimizer step of a parameter held by this process."""
    value = state.param_value(param)
    sparse = isinstance(grad, IndexedSlices)
    opt_state, steps = state.optimizer_state(param, optimizer, rowwise=sparse)
    if sparse:
        optimizer.step_rows(lr, value, opt_state, steps, grad, state.update_guard)
    else:
        optimizer.step_dense(lr, value, opt_state, steps, grad, state.update_guard)


# The GPU form of src/common/optim_rules.h: the same rules, written the same way element by
# element and compiled without fused multiply-adds, so a device step rounds as the host's does.
_STEP_KERNELS = r"""
// Steps rows[i] (or row i where rows is null) of `w` with grads[i, :], for i < *count (or n
// where count is null), unless *guard != -1. A grid-stride loop over the elements; the row's
// step count is read here and advanced by hetu_optim_count afterwards.
extern "C" __global__ void hetu_optim_step(int kind, float lr, float momentum, float beta1, float beta2,
                                           float eps, float l2reg, float weight_decay, float* w, float* state,
                                           const long long* steps, const float* grads, const long long* rows,
                                           const long long* count, long long n, long long width,
                                           const long long* guard) {
  if (guard != nullptr && *guard != -1) return;
  long long end = (count != nullptr ? *count : n) * width;
  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < end;
       e += (long long)gridDim.x * blockDim.x) {
  long long i = e / width, j = e - i * width;
  long long r = rows != nullptr ? rows[i] : i;
  long long t = steps[r] + 1;
  float* wr = w + r * width;
  float g = grads[i * width + j];
  switch (kind) {
    case 0:  // SGD
      wr[j] -= lr * (g + l2reg * wr[j]);
      break;
    case 1:  // Momentum
    case 2: {  // Nesterov
      float* v = state + r * width;
      float gi = g + l2reg * wr[j];
      v[j] = momentum * v[j] + gi;
      wr[j] -= lr * (kind == 2 ? gi + momentum * v[j] : v[j]);
      break;
    }
    case 3: {  // AdaGrad
      float* acc = state + r * width;
      float gi = g + l2reg * wr[j];
      acc[j] += gi * gi;
      wr[j] -= lr * gi / (sqrtf(acc[j]) + eps);
      break;
    }
    case 4:  // Adam
    case 5: {  // AdamW
      float* m = state + r * 2 * width;
      float* v = m + width;
      float bc1 = (float)(1.0 - pow((double)beta1, (double)t));
      float bc2 = (float)(1.0 - pow((double)beta2, (double)t));
      bool decoupled = kind == 5;
      if (decoupled) wr[j] -= lr * weight_decay * wr[j];
      float gi = decoupled ? g : g + l2reg * wr[j];
      m[j] = beta1 * m[j] + (1.0f - beta1) * gi;
      v[j] = beta2 * v[j] + (1.0f - beta2) * gi * gi;
      float mhat = m[j] / bc1;
      float vhat = v[j] / bc2;
      wr[j] -= lr * mhat / (sqrtf(vhat) + eps);
      break;
    }
  }
  }
}

// Row-wise AdaGrad: a row's accumulator needs the row's whole squared gradient first, so one
// thread steps one row (a grid-stride loop over rows), summing in index order as the host does.
extern "C" __global__ void hetu_rowwise_adagrad_step(float lr, float eps, float l2reg, float* w, float* acc,
                                                     const float* grads, const long long* rows,
                                                     const long long* count, long long n, long long width,
                                                     const long long* guard) {
  if (guard != nullptr && *guard != -1) return;
  long long end = count != nullptr ? *count : n;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < end;
       i += (long long)gridDim.x * blockDim.x) {
    long long r = rows != nullptr ? rows[i] : i;
    float* wr = w + r * width;
    const float* g = grads + i * width;
    float sum_sq = 0.0f;
    for (long long j = 0; j < width; ++j) {
      float gi = g[j] + l2reg * wr[j];
      sum_sq += gi * gi;
    }
    acc[r] += sum_sq / (float)width;
    float denom = sqrtf(acc[r]) + eps;
    for (long long j = 0; j < width; ++j) {
      float gi = g[j] + l2reg * wr[j];
      wr[j] -= lr * gi / denom;
    }
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


def _gpu_step(config, lr, w, state, steps, grads, rows, count, n, width, guard):
    """One step of n rows of width `width` on the device (see _STEP_KERNELS)."""
    cp = cuda.cupy()
    null = np.intp(0)   # a null pointer argument
    grads = cp.ascontiguousarray(grads, dtype=np.float32)
    c = config
    f = np.float32
    rows_arg = rows if rows is not None else null
    count_arg = count if count is not None else null
    guard_arg = guard if guard is not None else null
    if c.kind == ROWWISE_ADAGRAD:
        cuda.launch(cuda.raw_kernel("hetu_rowwise_adagrad_step", _STEP_KERNELS), n,
                    (f(lr), f(c.eps), f(c.l2reg), w, state, grads, rows_arg, count_arg, np.int64(n),
                     np.int64(width), guard_arg), max_blocks=cuda.STRIDE_BLOCKS)
    else:
        cuda.launch(cuda.raw_kernel("hetu_optim_step", _STEP_KERNELS), n * width,
                    (np.int32(c.kind), f(lr), f(c.momentum), f(c.beta1), f(c.beta2), f(c.eps), f(c.l2reg),
                     f(c.weight_decay), w, state if state.size else w, steps, grads, rows_arg, count_arg,
                     np.int64(n), np.int64(width), guard_arg), max_blocks=cuda.STRIDE_BLOCKS)
    cuda.launch(cuda.raw_kernel("hetu_optim_count", _STEP_KERNELS), n,
                (steps, rows_arg, count_arg, np.int64(n), guard_arg))


__all__ = ["Optimizer", "SGDOptimizer", "MomentumOptimizer", "AdaGradOptimizer", "RowwiseAdaGradOptimizer",
           "AdamOptimizer", "AdamWOptimizer", "OptimizerOp"]
