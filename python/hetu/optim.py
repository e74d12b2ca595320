"""Optimizers. The update rules are the C++ ones in src/common/optim_rules.h, shared with the
parameter server; dense tensors are stepped whole, embedding tables row by row (rows not in the
batch are untouched, duplicate ids summed first)."""
import numpy as np

from . import _C
from .autodiff import gradients
from .graph import Op, Variable, topo_sort
from .lr import as_scheduler
from .ops.embedding import IndexedSlices

SGD, MOMENTUM, NESTEROV, ADAGRAD, ADAM, ADAMW = range(6)
KIND_NAMES = {SGD: "sgd", MOMENTUM: "momentum", NESTEROV: "nesterov", ADAGRAD: "adagrad", ADAM: "adam",
              ADAMW: "adamw"}


class Optimizer:
    kind = SGD

    def __init__(self, learning_rate=0.01, l2reg=0.0, **rule):
        self.lr = as_scheduler(learning_rate)
        self.config = _C.OptimConfig()
        self.config.kind = self.kind
        self.config.l2reg = l2reg
        for key, value in rule.items():
            setattr(self.config, key, value)
        self.l2reg = l2reg

    @property
    def slots(self):
        return _C.optim_slots(self.kind)

    def rule(self):
        """The update rule as plain values: what a parameter server needs to apply it."""
        c = self.config
        return {"kind": KIND_NAMES[self.kind], "momentum": c.momentum, "beta1": c.beta1, "beta2": c.beta2,
                "eps": c.eps, "l2reg": c.l2reg, "weight_decay": c.weight_decay}

    def minimize(self, loss, var_list=None):
        """The train op: computes gradients of `loss` and steps every trainable parameter."""
        params = var_list or [n for n in topo_sort([loss]) if isinstance(n, Variable) and n.trainable]
        grads = gradients(loss, params)
        pairs = [(p, g) for p, g in zip(params, grads) if g is not None]
        return OptimizerOp(loss, pairs, self)

    def step_dense(self, lr, value, state, steps, grad):
        _C.apply_dense(self.config, lr, value.reshape(-1), state, steps, np.ascontiguousarray(grad, np.float32).reshape(-1))

    def step_rows(self, lr, table, state, steps, grad):
        """One step for the rows of `table` named by a sparse gradient (ids may repeat)."""
        uniq, summed = _C.unique_sum(np.ascontiguousarray(grad.indices, np.int64),
                                     np.ascontiguousarray(grad.values, np.float32))
        _C.apply_rows(self.config, lr, table, state, steps, uniq, summed)


class SGDOptimizer(Optimizer):
    kind = SGD

    def __init__(self, learning_rate=0.01, l2reg=0.0):
        super().__init__(learning_rate, l2reg)


class MomentumOptimizer(Optimizer):
    def __init__(self, learning_rate=0.01, momentum=0.9, nesterov=False, l2reg=0.0):
        self.kind = NESTEROV if nesterov else MOMENTUM
        super().__init__(learning_rate, l2reg, momentum=momentum)


class AdaGradOptimizer(Optimizer):
    kind = ADAGRAD

    def __init__(self, learning_rate=0.01, eps=1e-7, l2reg=0.0):
        super().__init__(learning_rate, l2reg, eps=eps)


class AdamOptimizer(Optimizer):
    kind = ADAM

    def __init__(self, learning_rate=0.01, beta1=0.9, beta2=0.999, epsilon=1e-7, l2reg=0.0):
        super().__init__(learning_rate, l2reg, beta1=beta1, beta2=beta2, eps=epsilon)


class AdamWOptimizer(Optimizer):
    kind = ADAMW

    def __init__(self, learning_rate=0.01, beta1=0.9, beta2=0.999, epsilon=1e-7, weight_decay=0.01):
        super().__init__(learning_rate, 0.0, beta1=beta1, beta2=beta2, eps=epsilon, weight_decay=weight_decay)


class OptimizerOp(Op):
    """Steps every (parameter, gradient) pair; stops on a non-finite loss before any update.
    Inputs: the loss, then the gradients."""
    has_side_effect = True

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
        if not np.all(np.isfinite(loss)):
            raise FloatingPointError(f"loss {self.loss.name} is {float(np.asarray(loss).reshape(-1)[0])} "
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
        optimizer.step_rows(lr, value, opt_state, steps, grad)
    else:
        optimizer.step_dense(lr, value, opt_state, steps, grad)


__all__ = ["Optimizer", "SGDOptimizer", "MomentumOptimizer", "AdaGradOptimizer", "AdamOptimizer",
           "AdamWOptimizer", "OptimizerOp"]
