"""Initializers. Every value is a pure function of (executor seed, parameter name, element index),
drawn by the same C++ code the parameter server uses, so a table initialised on the servers equals
one initialised in a single process."""
import math

import numpy as np

from . import _C
from .graph import Variable

CONSTANT, UNIFORM, NORMAL, TRUNCATED_NORMAL = 0, 1, 2, 3
KIND_NAMES = {CONSTANT: "constant", UNIFORM: "uniform", NORMAL: "normal", TRUNCATED_NORMAL: "truncated_normal"}


class Initializer:
    """kind and (a, b): constant -> (value, -); uniform -> (low, high); normal kinds -> (mean, stddev)."""

    def __init__(self, kind, a, b, shape):
        self.kind, self.a, self.b = kind, float(a), float(b)
        self.shape = tuple(int(s) for s in shape)

    def fill(self, seed, stream, row_begin=0, row_end=None, out=None):
        rows = self.shape[0] if self.shape else 1
        row_end = rows if row_end is None else row_end
        width = int(np.prod(self.shape[1:])) if len(self.shape) > 1 else 1
        if out is None:
            out = np.empty((row_end - row_begin, width), dtype=np.float32)
        _C.init_fill(self.kind, self.a, self.b, seed & (2**64 - 1), stream, row_begin, out.reshape(row_end - row_begin, width))
        return out

    def value(self, seed, stream):
        return self.fill(seed, stream).reshape(self.shape)

    def spec(self):
        return (KIND_NAMES[self.kind], self.a, self.b)


def _fans(shape):
    if len(shape) < 2:
        n = shape[0] if shape else 1
        return n, n
    receptive = int(np.prod(shape[2:])) if len(shape) > 2 else 1
    return shape[0] * receptive, shape[1] * receptive


def _make(shape, kind, a, b, name, trainable, ctx):
    return Variable(name=name, initializer=Initializer(kind, a, b, shape), trainable=trainable, ctx=ctx)


def constant(shape, fill_value=0.0, name=None, trainable=True, ctx=None):
    return _make(shape, CONSTANT, fill_value, 0.0, name, trainable, ctx)


def zeros(shape, name=None, trainable=True, ctx=None):
    return constant(shape, 0.0, name, trainable, ctx)


def ones(shape, name=None, trainable=True, ctx=None):
    return constant(shape, 1.0, name, trainable, ctx)


def random_uniform(shape, minval=-1.0, maxval=1.0, name=None, trainable=True, ctx=None):
    return _make(shape, UNIFORM, minval, maxval, name, trainable, ctx)


def random_normal(shape, mean=0.0, stddev=1.0, name=None, trainable=True, ctx=None):
    return _make(shape, NORMAL, mean, stddev, name, trainable, ctx)


def truncated_normal(shape, mean=0.0, stddev=1.0, name=None, trainable=True, ctx=None):
    """Normal restricted to mean +- 2 stddev."""
    return _make(shape, TRUNCATED_NORMAL, mean, stddev, name, trainable, ctx)


def xavier_uniform(shape, gain=1.0, name=None, trainable=True, ctx=None):
    fan_in, fan_out = _fans(shape)
    limit = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return random_uniform(shape, -limit, limit, name, trainable, ctx)


def xavier_normal(shape, gain=1.0, name=None, trainable=True, ctx=None):
    fan_in, fan_out = _fans(shape)
    return random_normal(shape, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)), name, trainable, ctx)


def he_uniform(shape, gain=1.0, name=None, trainable=True, ctx=None):
    fan_in, _ = _fans(shape)
    limit = gain * math.sqrt(6.0 / fan_in)
    return random_uniform(shape, -limit, limit, name, trainable, ctx)


def he_normal(shape, gain=1.0, name=None, trainable=True, ctx=None):
    fan_in, _ = _fans(shape)
    return random_normal(shape, 0.0, gain * math.sqrt(2.0 / fan_in), name, trainable, ctx)
