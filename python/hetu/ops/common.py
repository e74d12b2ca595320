"""Plumbing shared by the op families."""
import numpy as np


class ShapeError(ValueError):
    """A graph whose shapes do not fit; the message names the ops and shapes involved."""


def broadcast_shape(op, a_shape, b_shape):
    try:
        return tuple(np.broadcast_shapes(a_shape, b_shape))
    except ValueError:
        a, b = op.inputs[0], op.inputs[1]
        raise ShapeError(
            f"{op.name}: cannot broadcast {a.name} of shape {a_shape} with {b.name} of shape {b_shape}") from None


def sum_to_shape(xp, x, shape):
    """Sums a broadcast gradient back down to `shape`."""
    if x.shape == tuple(shape):
        return x
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(i + lead for i, s in enumerate(shape) if s == 1 and x.shape[i + lead] != 1)
    out = x.sum(axis=axes, keepdims=True) if axes else x
    return out.reshape(shape)


def normalize_axes(axes, ndim):
    if axes is None:
        return tuple(range(ndim))
    if isinstance(axes, int):
        axes = (axes,)
    return tuple(sorted(a % ndim for a in axes))
