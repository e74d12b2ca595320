"""Normalisation and regularisation: batch_norm, layer_norm, l2_normalize, dropout.

Backward passes that yield several gradients compute them together once; the parameter
gradients are read back by small ops that depend on the combined one."""
import numpy as np

from .. import _C
from ..context import array_module_of
from ..graph import Op
from ..init import UNIFORM as _UNIFORM

__all__ = ["batch_normalization_op", "layer_normalization_op", "l2_normalize_op", "dropout_op"]


def _norm_backward(xp, g, xhat, rstd, gamma, axes, fixed_stats):
    """dx, dgamma, dbeta of y = gamma * xhat + beta, xhat normalised over `axes` with statistics
    of the batch itself, or with fixed (running) statistics in inference."""
    m = np.float32(np.prod([g.shape[a] for a in axes]))
    # gamma and beta are shared along every axis where their view has size 1.
    param_axes = tuple(i for i, d in enumerate(gamma.shape) if d == 1)
    dbeta = g.sum(axis=param_axes)
    dgamma = (g * xhat).sum(axis=param_axes)
    dxhat = g * gamma
    if fixed_stats:
        return dxhat * rstd, dgamma, dbeta
    dx = rstd / m * (m * dxhat - dxhat.sum(axis=axes, keepdims=True) - xhat * (dxhat * xhat).sum(axis=axes, keepdims=True))
    return dx, dgamma, dbeta


class _Normalize(Op):
    """Shared by batch and layer norm: y = scale * xhat + bias."""

    def __init__(self, x, scale, bias, eps, ctx=None):
        super().__init__(x, scale, bias, ctx=ctx)
        self.eps = np.float32(eps)

    def infer_shape(self, s):
        return s[0]

    def gradient(self, g):
        dx = NormGradOp(g, self)
        return [dx, NormParamGradOp(dx, self.inputs[1], "dgamma"), NormParamGradOp(dx, self.inputs[2], "dbeta")]


class NormGradOp(Op):
    """dx of a normalisation; keeps dgamma and dbeta for the NormParamGradOps that follow it."""

    def __init__(self, g, fwd):
        super().__init__(g, *fwd.inputs, ctx=fwd.ctx)
        self.fwd = fwd

    def infer_shape(self, s):
        return s[1]

    def compute(self, vals, state):
        g, x, gamma, _ = vals
        saved = state.scratch[self.fwd.id]
        xp = array_module_of(g)
        gamma_b = gamma.reshape(self.fwd.param_view_shape(x.ndim))
        dx, dgamma, dbeta = _norm_backward(xp, g, saved["xhat"], saved["rstd"], gamma_b, self.fwd.reduce_axes(x.ndim),
                                           saved["fixed_stats"])
        state.scratch[self.id] = {"dgamma": dgamma.reshape(gamma.shape), "dbeta": dbeta.reshape(gamma.shape)}
        return dx


class NormParamGradOp(Op):
    def __init__(self, norm_grad, param, which):
        super().__init__(norm_grad, param, ctx=norm_grad.ctx)
        self.norm_grad, self.which = norm_grad, which

    def infer_shape(self, s):
        return s[1]

    def compute(self, vals, state):
        return state.scratch[self.norm_grad.id][self.which]


class BatchNormOp(_Normalize):
    """Normalises over every axis but axis 1 (channels); running statistics for inference."""

    def __init__(self, x, scale, bias, momentum=0.99, eps=0.01, ctx=None):
        super().__init__(x, scale, bias, eps, ctx=ctx)
        self.momentum = np.float32(momentum)

    def reduce_axes(self, ndim):
        return (0,) + tuple(range(2, ndim))

    def param_view_shape(self, ndim):
        return (1, -1) + (1,) * (ndim - 2)

    def compute(self, vals, state):
        x, gamma, beta = vals
        xp = array_module_of(x)
        axes = self.reduce_axes(x.ndim)
        view = self.param_view_shape(x.ndim)
        channels = x.shape[1]
        running_mean = state.persistent(self, "running_mean", (channels,), 0.0)
        running_var = state.persistent(self, "running_var", (channels,), 1.0)
        if state.training:
            mean = x.mean(axis=axes, keepdims=True)
            var = x.var(axis=axes, keepdims=True)
            running_mean *= self.momentum
            running_mean += (1 - self.momentum) * mean.reshape(-1)
            running_var *= self.momentum
            running_var += (1 - self.momentum) * var.reshape(-1)
        else:
            mean, var = running_mean.reshape(view), running_var.reshape(view)
        rstd = 1 / xp.sqrt(var + self.eps)
        xhat = (x - mean) * rstd
        state.scratch[self.id] = {"xhat": xhat, "rstd": rstd, "fixed_stats": not state.training}
        return (xhat * gamma.reshape(view) + beta.reshape(view)).astype(np.float32, copy=False)

    def to_onnx(self, b, x):
        """Inference: the running statistics the checkpoint holds (persistent/<op>/running_*)."""
        ndim = len(b.shape_of(self.inputs[0]))
        view = np.array(self.param_view_shape(ndim), np.int64)
        mean, var = (b.const(b.persistent(f"{self.name}/{key}").reshape(tuple(view)))
                     for key in ("running_mean", "running_var"))
        rstd = b.node("Div", [b.const(np.float32(1)), b.node("Sqrt", [b.node("Add", [var, b.const(self.eps)])])])
        xhat = b.node("Mul", [b.node("Sub", [x[0], mean]), rstd])
        gamma, beta = (b.node("Reshape", [name, b.const(view)]) for name in x[1:])
        return b.node("Add", [b.node("Mul", [xhat, gamma]), beta])


class LayerNormOp(_Normalize):
    """Normalises over the last axis; scale and bias have the last axis' size."""

    def reduce_axes(self, ndim):
        return (ndim - 1,)

    def param_view_shape(self, ndim):
        return (1,) * (ndim - 1) + (-1,)

    def compute(self, vals, state):
        x, gamma, beta = vals
        xp = array_module_of(x)
        mean = x.mean(axis=-1, keepdims=True)
        rstd = 1 / xp.sqrt(x.var(axis=-1, keepdims=True) + self.eps)
        xhat = (x - mean) * rstd
        state.scratch[self.id] = {"xhat": xhat, "rstd": rstd, "fixed_stats": False}
        return (xhat * gamma + beta).astype(np.float32, copy=False)

    def to_onnx(self, b, x):
        mean = b.node("ReduceMean", [x[0]], axes=[-1], keepdims=1)
        centered = b.node("Sub", [x[0], mean])
        var = b.node("ReduceMean", [b.node("Mul", [centered, centered])], axes=[-1], keepdims=1)
        rstd = b.node("Div", [b.const(np.float32(1)), b.node("Sqrt", [b.node("Add", [var, b.const(self.eps)])])])
        return b.node("Add", [b.node("Mul", [b.node("Mul", [centered, rstd]), x[1]]), x[2]])


def l2_divisor(xp, x, eps):
    """max(||x||_2, eps) over the last axis, kept as an axis of 1."""
    return xp.maximum(xp.sqrt((x * x).sum(axis=-1, keepdims=True)), eps)


def l2_normalize_backward(xp, g, y, divisor, eps, out=None):
    """The gradient of y = x / divisor (l2_divisor): (g - y <g, y>) / ||x|| where ||x|| > eps, else
    g / eps (there y = x / eps: a constant's multiple)."""
    along = (g * y).sum(axis=-1, keepdims=True)
    along *= divisor > eps
    out = xp.multiply(y, along, out=out)
    xp.subtract(g, out, out=out)
    return xp.divide(out, divisor, out=out)


class L2NormalizeOp(Op):
    """x / max(||x||_2, eps) over the last axis (a user vector or an item row on the unit sphere)."""

    def __init__(self, x, eps=1e-6, ctx=None):
        super().__init__(x, ctx=ctx)
        self.eps = np.float32(eps)

    def infer_shape(self, s):
        return s[0]

    def compute(self, vals, state):
        x = vals[0]
        xp = array_module_of(x)
        return xp.divide(x, l2_divisor(xp, x, self.eps), out=state.buffer(self, x.shape, np.float32))

    def to_onnx(self, b, x):
        norm = b.node("ReduceL2", x, axes=[-1], keepdims=1)   # opset 17: axes an attribute
        return b.node("Div", [x[0], b.node("Max", [norm, b.const(self.eps)])])

    def gradient(self, g):
        return [L2NormalizeGradOp(g, self)]


class L2NormalizeGradOp(Op):
    """l2_normalize_backward of the op's output."""

    def __init__(self, g, fwd):
        super().__init__(g, fwd.inputs[0], fwd, ctx=fwd.ctx)
        self.fwd = fwd

    def infer_shape(self, s):
        return s[1]

    def compute(self, vals, state):
        g, x, y = vals
        xp = array_module_of(g)
        eps = self.fwd.eps
        return l2_normalize_backward(xp, g, y, l2_divisor(xp, x, eps), eps,
                                     out=state.buffer(self, x.shape, np.float32))


class DropoutOp(Op):
    """Inverted dropout in training, identity in inference. The mask is drawn from the executor's
    seed, the op's name and the step, so runs repeat exactly. With `per_sample`, x's first axis is
    the batch's samples and sample s's mask is a pure function of (seed, op name, global step, s's
    row in the data, element): the same whichever worker trains s and however many there are
    (docs/design.md, sequences), drawn by the counter-based generator of the initializers."""

    capturable = False   # its mask is drawn on the host

    def __init__(self, x, keep_prob, per_sample=False, ctx=None, name=None):
        super().__init__(x, ctx=ctx, name=name)
        if not 0 < keep_prob <= 1:
            raise ValueError(f"{self.name}: keep_prob must be in (0, 1], got {keep_prob}")
        self.keep_prob = np.float32(keep_prob)
        self.per_sample = per_sample

    def infer_shape(self, s):
        return s[0]

    def to_onnx(self, b, x):
        return b.node("Identity", x)   # inference

    def _uniforms(self, shape, state):
        if not self.per_sample:
            return state.rng(self).random(shape, dtype=np.float32)
        step, rows = state.batch_samples() if state.batch_samples is not None else \
            (state.iteration, np.arange(shape[0], dtype=np.int64))   # fed values: rows by position
        if len(rows) != shape[0]:
            raise ValueError(f"{self.name}: per-sample dropout over {shape[0]} rows, but the step has {len(rows)} samples")
        return per_sample_uniforms(state.executor.config.seed, step, self.name, rows, shape)

    def compute(self, vals, state):
        x = vals[0]
        if not state.training or self.keep_prob == 1:
            state.scratch[self.id] = None
            return x
        mask = self._uniforms(x.shape, state) < self.keep_prob
        scaled = array_module_of(x).asarray(mask, dtype=np.float32) / self.keep_prob
        state.scratch[self.id] = scaled
        return x * scaled

    def gradient(self, g):
        return [DropoutGradOp(g, self)]


class DropoutGradOp(Op):
    capturable = False   # reads the mask its forward op drew this step
    def __init__(self, g, fwd):
        super().__init__(g, ctx=fwd.ctx)
        self.fwd = fwd

    def infer_shape(self, s):
        return s[0]

    def compute(self, vals, state):
        scaled = state.scratch[self.fwd.id]
        return vals[0] if scaled is None else vals[0] * scaled


def batch_normalization_op(x, scale, bias, momentum=0.99, eps=0.01, ctx=None):
    return BatchNormOp(x, scale, bias, momentum, eps, ctx=ctx)


def layer_normalization_op(x, scale, bias, eps=0.01, ctx=None):
    return LayerNormOp(x, scale, bias, eps, ctx=ctx)


def l2_normalize_op(x, eps=1e-6, ctx=None):
    return L2NormalizeOp(x, eps, ctx=ctx)


def per_sample_uniforms(seed, step, name, rows, shape):
    """float32 uniforms in [0, 1) of `shape`, row i sample rows[i]'s: a function of the run's
    `seed`, the `step`, the op's `name` and the sample alone (so of no worker count or plan): the
    draws of a per-sample DropoutOp, which keeps where they fall below its keep_prob."""
    seed = int(np.random.SeedSequence([int(seed), int(step)]).generate_state(1, np.uint64)[0])
    out = np.empty((shape[0], int(np.prod(shape[1:], dtype=np.int64))), np.float32)
    _C.init_fill_rows(_UNIFORM, 0.0, 1.0, seed, _C.name_stream(name), np.ascontiguousarray(rows, np.int64), out)
    return out.reshape(shape)


def dropout_op(x, keep_prob, per_sample=False, ctx=None, name=None):
    """`name` keys a per-sample mask: give one where the graph is built in other orders."""
    return DropoutOp(x, keep_prob, per_sample, ctx=ctx, name=name)
