"""Activations. Each is a forward/backward pair of array functions; one generic gradient op
calls the backward with (g, x, y)."""
import numpy as np

from .. import _C
from ..context import array_module_of
from ..graph import Op

__all__ = ["relu_op", "leaky_relu_op", "sigmoid_op", "silu_op", "tanh_op", "gelu_op", "softmax_op"]

_GELU_C = np.float32(np.sqrt(2.0 / np.pi))


class Activation(Op):
    """y = forward(x), elementwise unless stated; dx = backward(g, x, y). `onnx_type`: the ONNX op
computing the same forward (None: to_onnx composes it)."""
    onnx_type = None

    def to_onnx(self, b, x):
        return b.node(self.onnx_type, x)

    def infer_shape(self, s):
        return s[0]

    def forward(self, xp, x, out):
        raise NotImplementedError

    def backward(self, xp, g, x, y, out):
        raise NotImplementedError

    def compute(self, vals, state):
        x = vals[0]
        return self.forward(array_module_of(x), x, state.buffer(self, x.shape, np.float32))

    def gradient(self, g):
        return [ActivationGradOp(g, self.inputs[0], self)]


class ActivationGradOp(Op):
    def __init__(self, g, x, fwd):
        super().__init__(g, x, fwd, ctx=fwd.ctx)
        self.fwd = fwd

    def infer_shape(self, s):
        return s[1]

    def compute(self, vals, state):
        g, x, y = vals
        return self.fwd.backward(array_module_of(g), g, x, y, state.buffer(self, x.shape, np.float32))


def relu(xp, x, out):
    """max(x, 0) into out (which may be x)."""
    return xp.maximum(x, 0, out=out)


def relu_gradient(xp, g, x_or_y, out):
    """g where ReLU's input was positive, else 0 (-0 for a negative g), into out. ReLU's input x
    or its output y alike: y > 0 exactly where x > 0."""
    return xp.multiply(g, x_or_y > 0, out=out)


class ReluOp(Activation):
    onnx_type = "Relu"

    def forward(self, xp, x, out):
        return relu(xp, x, out)

    def backward(self, xp, g, x, y, out):
        return relu_gradient(xp, g, x, out)


class LeakyReluOp(Activation):
    def __init__(self, x, alpha=0.01, ctx=None):
        super().__init__(x, ctx=ctx)
        self.alpha = np.float32(alpha)

    def forward(self, xp, x, out):
        return xp.multiply(x, xp.where(x > 0, np.float32(1), self.alpha), out=out)

    def to_onnx(self, b, x):
        return b.node("LeakyRelu", x, alpha=float(self.alpha))

    def backward(self, xp, g, x, y, out):
        return xp.multiply(g, xp.where(x > 0, np.float32(1), self.alpha), out=out)


class SigmoidOp(Activation):
    onnx_type = "Sigmoid"

    def forward(self, xp, x, out):
        # 1 / (1 + exp(-x)), written to stay finite for large |x|.
        xp.negative(x, out=out)
        xp.exp(xp.minimum(out, 80, out=out), out=out)
        out += 1
        return xp.reciprocal(out, out=out)

    def backward(self, xp, g, x, y, out):
        xp.subtract(1, y, out=out)
        out *= y
        return xp.multiply(out, g, out=out)


def sigmoid(xp, x, out):
    """sigmoid(x) into out (not x) through e = exp(-|x|), which never overflows: 1 / (1 + e) for
    x >= 0, e / (1 + e) below; 0 (not a tiny constant) where x is far below 0, so that x times it
    is 0 however large |x| is (silu)."""
    e = xp.exp(-xp.abs(x))
    return xp.divide(xp.where(x >= 0, np.float32(1), e), e + 1, out=out)


def silu_derivative(xp, x, out):
    """d silu / dx = sigmoid(x) (1 + x (1 - sigmoid(x))) into out (not x), finite for every x."""
    s = sigmoid(xp, x, out)
    t = xp.subtract(1, s)
    t *= x
    t += 1
    return xp.multiply(s, t, out=out)


class SiLUOp(Activation):
    """x * sigmoid(x) (swish; HSTU's pointwise attention and gates), finite for every x. On the
    CPU one threaded pass in C++ (_C.silu), the array code's arithmetic."""

    def forward(self, xp, x, out):
        if xp is np:
            _C.silu(np.ascontiguousarray(x, np.float32), None, out)
            return out
        return xp.multiply(sigmoid(xp, x, out), x, out=out)

    def to_onnx(self, b, x):
        return b.node("Mul", [x[0], b.node("Sigmoid", x)])

    def backward(self, xp, g, x, y, out):
        if xp is np:
            _C.silu(np.ascontiguousarray(x, np.float32), np.ascontiguousarray(g, np.float32), out)
            return out
        return xp.multiply(g, silu_derivative(xp, x, out), out=out)


class TanhOp(Activation):
    onnx_type = "Tanh"

    def forward(self, xp, x, out):
        return xp.tanh(x, out=out)

    def backward(self, xp, g, x, y, out):
        xp.multiply(y, y, out=out)
        xp.subtract(1, out, out=out)
        return xp.multiply(out, g, out=out)


class GeluOp(Activation):
    """The tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""

    def forward(self, xp, x, out):
        t = xp.tanh(_GELU_C * (x + np.float32(0.044715) * x * x * x))
        return xp.multiply(np.float32(0.5) * x, 1 + t, out=out)

    def to_onnx(self, b, x):
        cube = b.node("Mul", [b.node("Mul", [x[0], x[0]]), x[0]])
        inner = b.node("Mul", [b.const(_GELU_C), b.node("Add", [x[0], b.node("Mul", [b.const(np.float32(0.044715)), cube])])])
        half_x = b.node("Mul", [b.const(np.float32(0.5)), x[0]])
        return b.node("Mul", [half_x, b.node("Add", [b.const(np.float32(1)), b.node("Tanh", [inner])])])

    def backward(self, xp, g, x, y, out):
        inner = _GELU_C * (x + np.float32(0.044715) * x * x * x)
        t = xp.tanh(inner)
        dinner = _GELU_C * (1 + np.float32(3 * 0.044715) * x * x)
        d = np.float32(0.5) * (1 + t) + np.float32(0.5) * x * (1 - t * t) * dinner
        return xp.multiply(g, d, out=out)


class SoftmaxOp(Activation):
    """Softmax over the last axis."""

    def to_onnx(self, b, x):
        return b.node("Softmax", x, axis=-1)

    def forward(self, xp, x, out):
        xp.subtract(x, x.max(axis=-1, keepdims=True), out=out)
        xp.exp(out, out=out)
        out /= out.sum(axis=-1, keepdims=True)
        return out

    def backward(self, xp, g, x, y, out):
        s = (g * y).sum(axis=-1, keepdims=True)
        xp.subtract(g, s, out=out)
        return xp.multiply(out, y, out=out)


def relu_op(x, ctx=None):
    return ReluOp(x, ctx=ctx)


def leaky_relu_op(x, alpha=0.01, ctx=None):
    return LeakyReluOp(x, alpha, ctx=ctx)


def sigmoid_op(x, ctx=None):
    return SigmoidOp(x, ctx=ctx)


def silu_op(x, ctx=None):
    return SiLUOp(x, ctx=ctx)


def tanh_op(x, ctx=None):
    return TanhOp(x, ctx=ctx)


def gelu_op(x, ctx=None):
    return GeluOp(x, ctx=ctx)


def softmax_op(x, ctx=None):
    return SoftmaxOp(x, ctx=ctx)
