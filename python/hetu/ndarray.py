"""NDArray: a value on a device context, as the executor hands it back to the user."""
import numpy as np

from .context import cpu


class NDArray:
    __slots__ = ("data", "ctx")

    def __init__(self, data, ctx=None):
        self.data = data
        self.ctx = ctx or cpu(0)

    @property
    def shape(self):
        return self.data.shape

    @property
    def dtype(self):
        return self.data.dtype

    def asnumpy(self):
        if self.ctx.is_gpu:
            return self.data.get()
        return np.array(self.data, copy=True)

    def __repr__(self):
        return f"NDArray(shape={self.shape}, dtype={self.dtype}, ctx={self.ctx})"


def array(values, ctx=None, dtype=np.float32):
    """Copies values onto ctx."""
    ctx = ctx or cpu(0)
    xp = ctx.array_module()
    return NDArray(xp.asarray(np.asarray(values, dtype=dtype)), ctx)


def empty(shape, ctx=None, dtype=np.float32):
    ctx = ctx or cpu(0)
    return NDArray(ctx.array_module().empty(shape, dtype=dtype), ctx)
