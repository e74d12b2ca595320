"""Sequences (user histories, docs/design.md section 17): the padding mask, the user vector a
history ends with, and the sampled softmax loss over one lookup of a sample's rows.

A sequence sample's ids are one int64 row (so that one lookup, and every row source behind it,
sees every row the sample reads): [inputs (L) | targets (L) | negatives (L x N, position by
position)], -1 where there is nothing (padding; no target; no negatives where no target)."""
import numpy as np

from .. import _C
from ..context import array_module_of
from ..graph import Op
from .common import ShapeError

__all__ = ["sequence_mask_op", "last_valid_op", "sampled_softmax_loss_op", "int_constant_op"]

_NORM_EPS = np.float32(1e-6)


class IntConstantOp(Op):
    """A fixed int64 array (e.g. relative positions' buckets), not a parameter: never trained,
    saved or sent to the servers."""

    def __init__(self, value, name=None, ctx=None):
        super().__init__(ctx=ctx, name=name)
        self.value = np.array(value, np.int64)
        self.value.flags.writeable = False
        self._on = {}

    def infer_shape(self, s):
        return self.value.shape

    def infer_dtype(self, d):
        return np.int64

    def compute(self, vals, state):
        xp = state.xp
        if xp is np:
            return self.value
        if "device" not in self._on:
            self._on["device"] = xp.asarray(self.value)
        return self._on["device"]

    def to_onnx(self, b, x):
        return b.const(self.value)

    def gradient(self, g):
        return []


class SequenceMaskOp(Op):
    """ids [batch, >= length] int64 -> float32 [batch, length]: 1 where ids[:, :length] >= 0."""

    def __init__(self, ids, length, ctx=None):
        super().__init__(ids, ctx=ctx)
        self.length = int(length)

    def infer_shape(self, s):
        if len(s[0]) != 2 or s[0][1] < self.length:
            raise ShapeError(f"{self.name}: ids {self.inputs[0].name} {s[0]} hold no {self.length} positions")
        return (s[0][0], self.length)

    def compute(self, vals, state):
        xp = array_module_of(vals[0])
        return (vals[0][:, :self.length] >= 0).astype(np.float32)

    def to_onnx(self, b, x):
        head = b.node("Slice", [x[0], b.const(np.array([0], np.int64)), b.const(np.array([self.length], np.int64)),
                                b.const(np.array([1], np.int64))])
        return b.node("Cast", [b.node("GreaterOrEqual", [head, b.const(np.array(0, np.int64))])], to=1)

    def gradient(self, g):
        return [None]


def _last_positions(xp, ids, length):
    """The last filled input position of each sample (0 for an empty history)."""
    filled = (ids[:, :length] >= 0).sum(axis=1)
    return xp.maximum(filled - 1, 0)


class LastValidOp(Op):
    """x [batch, length, d] and the ids -> [batch, d]: x at each sample's last filled input
    position (histories are left-aligned), the user vector that predicts the next item."""

    def __init__(self, x, ids, length, ctx=None):
        super().__init__(x, ids, ctx=ctx)
        self.length = int(length)

    def infer_shape(self, s):
        return (s[0][0], s[0][2])

    def compute(self, vals, state):
        x, ids = vals
        xp = array_module_of(x)
        last = _last_positions(xp, ids, self.length)
        return xp.ascontiguousarray(x[xp.arange(x.shape[0]), last])

    def gradient(self, g):
        return [LastValidGradOp(g, self), None]


class LastValidGradOp(Op):
    def __init__(self, g, fwd):
        super().__init__(g, fwd.inputs[0], fwd.inputs[1], ctx=fwd.ctx)
        self.length = fwd.length

    def infer_shape(self, s):
        return s[1]

    def compute(self, vals, state):
        g, x, ids = vals
        xp = array_module_of(g)
        out = state.buffer(self, x.shape, np.float32)
        out.fill(0)
        out[xp.arange(x.shape[0]), _last_positions(xp, ids, self.length)] = g
        return out


def _normalize_rows(xp, rows):
    """rows / max(||rows||, eps) over the last axis, and the divisor."""
    norm = xp.maximum(xp.sqrt((rows * rows).sum(axis=-1, keepdims=True)), _NORM_EPS)
    return rows / norm, norm


def _normalize_backward(g, normalized, norm):
    return (g - normalized * (g * normalized).sum(axis=-1, keepdims=True)) / norm


def _bmm(a, b, trans_b):
    """a [P, m, k] @ b [P, k, n] (or b^T): hetu's batched kernel on the host."""
    xp = array_module_of(a)
    if xp is not np:
        return xp.matmul(a, b.swapaxes(1, 2) if trans_b else b)
    n = b.shape[1] if trans_b else b.shape[2]
    out = np.empty((a.shape[0], a.shape[1], n), np.float32)
    _C.batched_matmul(np.ascontiguousarray(a, np.float32), np.ascontiguousarray(b, np.float32), False, trans_b, out)
    return out


class SampledSoftmaxLossOp(Op):
    """Sampled softmax (docs/design.md section 17) at every position of a batch of histories:
    user [batch, L, d] (L2-normalised by the model), rows [batch, M, d] and ids [batch, M] of one
    lookup of the layout above -> the loss at each position, [batch, L] (0 where there is no
    target). The target's and the negatives' rows are L2-normalised here; a logit is an inner
    product over `temperature`; a negative equal to the target, or -1, is left out of the softmax
    (as generative-recommenders masks it). The rows' gradient is zero over the inputs' columns."""

    def __init__(self, user, rows, ids, length, num_negatives, temperature, ctx=None):
        super().__init__(user, rows, ids, ctx=ctx)
        self.length, self.num_negatives = int(length), int(num_negatives)
        self.inv_temperature = np.float32(1.0 / temperature)

    def infer_shape(self, s):
        user, rows, ids = s
        L, N = self.length, self.num_negatives
        if len(user) != 3 or user[1] != L or tuple(rows[:2]) != tuple(ids) or ids[1] != L * (2 + N) or \
                rows[2] != user[2] or rows[0] != user[0]:
            raise ShapeError(f"{self.name}: takes user [batch, {L}, d], rows [batch, {L * (2 + N)}, d] and ids "
                             f"[batch, {L * (2 + N)}] (L {L}, {N} negatives), got {user}, {rows}, {ids}")
        return (user[0], L)

    def _parts(self, xp, user, rows, ids):
        """Everything forward and backward share, per position (P = batch x L)."""
        L, N = self.length, self.num_negatives
        b, d = user.shape[0], user.shape[2]
        u = user.reshape(b * L, 1, d)
        target_ids = ids[:, L:2 * L].reshape(b * L)
        neg_ids = ids[:, 2 * L:].reshape(b * L, N)
        target, target_norm = _normalize_rows(xp, rows[:, L:2 * L].reshape(b * L, 1, d))
        negs, neg_norm = _normalize_rows(xp, rows[:, 2 * L:].reshape(b * L, N, d))
        logits = xp.empty((b * L, 1 + N), np.float32)
        logits[:, 0] = (u[:, 0] * target[:, 0]).sum(axis=-1)
        logits[:, 1:] = _bmm(u, negs, True)[:, 0]
        logits *= self.inv_temperature
        valid = target_ids >= 0
        left_out = (neg_ids < 0) | (neg_ids == target_ids[:, None])
        logits[:, 1:][left_out] = -np.inf
        logits[~valid] = 0   # no target: a row of zeros, whose loss is then dropped
        top = logits.max(axis=1, keepdims=True)
        probs = xp.exp(logits - top)
        total = probs.sum(axis=1, keepdims=True)
        probs /= total
        loss = (xp.log(total[:, 0]) + top[:, 0] - logits[:, 0]) * valid
        return dict(u=u, target=target, target_norm=target_norm, negs=negs, neg_norm=neg_norm, probs=probs,
                    valid=valid, loss=loss.astype(np.float32))

    def compute(self, vals, state):
        user, rows, ids = vals
        parts = self._parts(array_module_of(user), user, rows, ids)
        state.scratch[self.id] = parts
        return parts["loss"].reshape(user.shape[0], self.length)

    def gradient(self, g):
        grad = SampledSoftmaxGradOp(g, self)
        return [SampledSoftmaxPartOp(grad, self.inputs[0], 0), SampledSoftmaxPartOp(grad, self.inputs[1], 1), None]


class SampledSoftmaxGradOp(Op):
    """The user's and the rows' gradients, computed together (read by SampledSoftmaxPartOp)."""

    def __init__(self, g, fwd):
        super().__init__(g, *fwd.inputs, ctx=fwd.ctx)
        self.fwd = fwd

    def infer_shape(self, s):
        return s[0]

    def compute(self, vals, state):
        g, user, rows, ids = vals
        fwd = self.fwd
        xp = array_module_of(user)
        parts = state.scratch.get(fwd.id)
        if parts is None:   # the forward ran in another step (a gradient asked for alone)
            parts = fwd._parts(xp, user, rows, ids)
        L, N = fwd.length, fwd.num_negatives
        b, d = user.shape[0], user.shape[2]
        # d loss / d logit, times the upstream gradient and 1/temperature: softmax minus one-hot.
        dlogits = parts["probs"] * (g.reshape(b * L, 1) * parts["valid"][:, None] * fwd.inv_temperature)
        dlogits[:, 0] -= g.reshape(b * L) * parts["valid"] * fwd.inv_temperature
        dpos, dneg = dlogits[:, :1], dlogits[:, 1:]
        u, target, negs = parts["u"], parts["target"], parts["negs"]
        duser = dpos * target[:, 0] + _bmm(np.ascontiguousarray(dneg[:, None, :]), negs, False)[:, 0]
        drows = state.buffer(self, rows.shape, np.float32)
        drows[:, :L] = 0
        dtarget = _normalize_backward(dpos[:, :, None] * u, target, parts["target_norm"])
        drows[:, L:2 * L] = dtarget.reshape(b, L, d)
        dnegs = _normalize_backward(dneg[:, :, None] * u, negs, parts["neg_norm"])
        drows[:, 2 * L:] = dnegs.reshape(b, L * N, d)
        return duser.reshape(user.shape).astype(np.float32, copy=False), drows


class SampledSoftmaxPartOp(Op):
    def __init__(self, grad, like, which):
        super().__init__(grad, like, ctx=grad.ctx)
        self.which = which

    def infer_shape(self, s):
        return s[1]

    def compute(self, vals, state):
        return vals[0][self.which]


def int_constant_op(value, name=None, ctx=None):
    return IntConstantOp(value, name=name, ctx=ctx)


def sequence_mask_op(ids, length, ctx=None):
    return SequenceMaskOp(ids, length, ctx=ctx)


def last_valid_op(x, ids, length, ctx=None):
    return LastValidOp(x, ids, length, ctx=ctx)


def sampled_softmax_loss_op(user, rows, ids, length, num_negatives, temperature=0.05, ctx=None):
    return SampledSoftmaxLossOp(user, rows, ids, length, num_negatives, temperature, ctx=ctx)
