"""Sequences (user histories, docs/design.md section 17): the padding mask, the user vector a
history ends with, and the sampled softmax loss over one lookup of a sample's rows.

A sequence sample's ids are one int64 row (so that one lookup, and every row source behind it,
sees every row the sample reads): [inputs (L) | targets (L) | the sample's distinct negatives
(C)], -1 where there is nothing (padding; no target; any other int64, a negative hashed key
included, is an id); which candidate is each position's j-th negative is a second int64 input,
index [L, N] (hetu.data.sequences.distinct_candidates)."""
import numpy as np

from .. import _C
from ..context import array_module_of
from ..graph import Op
from .common import ShapeError
from .norm import l2_divisor, l2_normalize_backward

__all__ = ["sequence_mask_op", "last_valid_op", "sampled_softmax_loss_op", "int_constant_op"]

_NORM_EPS = np.float32(1e-6)
PADDING = -1   # no item (hetu.data.sequences.PADDING); every other int64 is an id (hashed ids included)


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
    """ids [batch, >= length] int64 -> float32 [batch, length]: 1 where ids[:, :length] is not
    the padding (-1; a hashed id may be any other int64)."""

    def __init__(self, ids, length, ctx=None):
        super().__init__(ids, ctx=ctx)
        self.length = int(length)

    def infer_shape(self, s):
        if len(s[0]) != 2 or s[0][1] < self.length:
            raise ShapeError(f"{self.name}: ids {self.inputs[0].name} {s[0]} hold no {self.length} positions")
        return (s[0][0], self.length)

    def compute(self, vals, state):
        return (vals[0][:, :self.length] != PADDING).astype(np.float32)

    def to_onnx(self, b, x):
        return b.node("Cast", [_filled_onnx(b, x[0], self.length)], to=1)

    def gradient(self, g):
        return [None]


def _filled_onnx(b, ids, length):
    """ONNX: ids[:, :length] != -1 (bool)."""
    head = b.node("Slice", [ids, b.const(np.array([0], np.int64)), b.const(np.array([length], np.int64)),
                            b.const(np.array([1], np.int64))])
    return b.node("Not", [b.node("Equal", [head, b.const(np.array(PADDING, np.int64))])])


def _last_positions(xp, ids, length):
    """The last filled input position of each sample (0 for an empty history)."""
    filled = (ids[:, :length] != PADDING).sum(axis=1)
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

    def to_onnx(self, b, x):
        filled = b.node("ReduceSum", [b.node("Cast", [_filled_onnx(b, x[1], self.length)], to=7),
                                      b.const(np.array([1], np.int64))], keepdims=1)
        last = b.node("Max", [b.node("Sub", [filled, b.const(np.array(1, np.int64))]), b.const(np.array(0, np.int64))])
        return b.node("GatherND", [x[0], last], batch_dims=1)   # x[s, last[s]]: [batch, d]

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
    """rows / max(||rows||, eps) over the last axis, and the divisor (l2_normalize_op's rule)."""
    divisor = l2_divisor(xp, rows, _NORM_EPS)
    return rows / divisor, divisor


def _normalize_backward(g, normalized, divisor):
    return l2_normalize_backward(array_module_of(g), g, normalized, divisor, _NORM_EPS)


def candidate_logits(user, rows, first, index):
    """[b, L, N]: user[s, p] . normalised(rows[s, first + index[s, p, j]]) (0 where index is -1)."""
    xp = array_module_of(user)
    if xp is np:
        out = np.empty(index.shape, np.float32)
        _C.candidate_logits(user, np.ascontiguousarray(rows, np.float32), first, np.ascontiguousarray(index, np.int64),
                            out)
        return out
    candidates, _ = _normalize_rows(xp, rows[:, first:])
    picked = candidates[xp.arange(index.shape[0])[:, None, None], xp.maximum(index, 0)]
    return xp.where(index >= 0, xp.einsum("bpd,bpjd->bpj", user, picked), 0).astype(np.float32)


def candidate_logits_grad(dlogits, user, rows, first, index, drows):
    """candidate_logits' d user, and its d rows written into drows' columns from `first` on."""
    xp = array_module_of(user)
    if xp is np:
        duser = np.empty(user.shape, np.float32)
        _C.candidate_logits_grad(np.ascontiguousarray(dlogits), user, np.ascontiguousarray(rows, np.float32), first,
                                 np.ascontiguousarray(index, np.int64), duser, drows)
        return duser
    b = index.shape[0]
    candidates, norm = _normalize_rows(xp, rows[:, first:])
    d = xp.where(index >= 0, dlogits, 0)
    picked = candidates[xp.arange(b)[:, None, None], xp.maximum(index, 0)]
    duser = xp.einsum("bpj,bpjd->bpd", d, picked)
    dcandidates = xp.zeros_like(candidates)
    xp.add.at(dcandidates, (xp.arange(b)[:, None, None], xp.maximum(index, 0)), d[..., None] * user[:, :, None, :])
    drows[:, first:] = _normalize_backward(dcandidates, candidates, norm)
    return duser


class SampledSoftmaxLossOp(Op):
    """Sampled softmax (docs/design.md section 17) at every position of a batch of histories.
    Inputs: user [batch, L, d] (L2-normalised by the model); rows [batch, 2L + C, d] and ids
    [batch, 2L + C] of one lookup of [inputs | targets | the sample's distinct candidates];
    index [batch, L, N]: position p's negative j is candidate index[s, p, j] (-1: none;
    hetu.data.sequences.distinct_candidates). Output: the loss at each position, [batch, L] (0
    where there is no target). The target's and the candidates' rows are L2-normalised here; a
    logit is an inner product over `temperature`; a negative equal to the target is left out of
    the softmax (as generative-recommenders masks it). The rows' gradient is zero over the
    inputs' columns; the candidates' logits and their gradients are hetu's kernels
    (_C.candidate_logits, which normalise them too), which read each candidate row once per sample."""

    def __init__(self, user, rows, ids, index, length, temperature, ctx=None):
        super().__init__(user, rows, ids, index, ctx=ctx)
        self.length = int(length)
        self.inv_temperature = np.float32(1.0 / temperature)

    def infer_shape(self, s):
        user, rows, ids, index = s
        L = self.length
        if len(user) != 3 or user[1] != L or tuple(rows[:2]) != tuple(ids) or ids[1] <= 2 * L or \
                rows[2] != user[2] or rows[0] != user[0] or len(index) != 3 or index[:2] != user[:2]:
            raise ShapeError(f"{self.name}: takes user [batch, {L}, d], rows [batch, 2 x {L} + C, d], ids "
                             f"[batch, 2 x {L} + C] and index [batch, {L}, N], got {user}, {rows}, {ids}, {index}")
        return (user[0], L)

    def _parts(self, xp, user, rows, ids, index):
        """Everything forward and backward share."""
        L = self.length
        user = xp.ascontiguousarray(user, dtype=np.float32)
        target_ids = ids[:, L:2 * L]
        target, target_norm = _normalize_rows(xp, rows[:, L:2 * L])
        b, N = index.shape[0], index.shape[2]
        logits = xp.empty((b, L, 1 + N), np.float32)
        logits[..., 0] = (user * target).sum(axis=-1)
        logits[..., 1:] = candidate_logits(user, rows, 2 * L, index)
        logits *= self.inv_temperature
        negative_ids = xp.take_along_axis(ids[:, 2 * L:], xp.maximum(index, 0).reshape(b, -1), axis=1).reshape(
            index.shape)
        left_out = (index < 0) | (negative_ids == target_ids[..., None])
        logits[..., 1:][left_out] = -np.inf
        valid = target_ids != PADDING
        logits[~valid] = 0   # no target: a row of zeros, whose loss is then dropped
        top = logits.max(axis=-1, keepdims=True)
        probs = xp.exp(logits - top)
        total = probs.sum(axis=-1, keepdims=True)
        probs /= total
        loss = (xp.log(total[..., 0]) + top[..., 0] - logits[..., 0]) * valid
        return dict(user=user, target=target, target_norm=target_norm, probs=probs, valid=valid,
                    loss=loss.astype(np.float32))

    def compute(self, vals, state):
        parts = self._parts(array_module_of(vals[0]), *vals)
        state.scratch[self.id] = parts
        return parts["loss"]

    def gradient(self, g):
        grad = SampledSoftmaxGradOp(g, self)
        return [SampledSoftmaxPartOp(grad, self.inputs[0], 0), SampledSoftmaxPartOp(grad, self.inputs[1], 1), None,
                None]


class SampledSoftmaxGradOp(Op):
    """The user's and the rows' gradients, computed together (read by SampledSoftmaxPartOp)."""

    def __init__(self, g, fwd):
        super().__init__(g, *fwd.inputs, ctx=fwd.ctx)
        self.fwd = fwd

    def infer_shape(self, s):
        return s[0]

    def compute(self, vals, state):
        g, user, rows, ids, index = vals
        fwd, L = self.fwd, self.fwd.length
        xp = array_module_of(user)
        parts = state.scratch.get(fwd.id)
        if parts is None:   # the forward ran in another step (a gradient asked for alone)
            parts = fwd._parts(xp, user, rows, ids, index)
        # d loss / d logit, times the upstream gradient over the temperature: softmax minus one-hot.
        scale = (g * parts["valid"] * fwd.inv_temperature).astype(np.float32)
        dlogits = parts["probs"] * scale[..., None]
        dlogits[..., 0] -= scale
        dpos = dlogits[..., :1]
        drows = state.buffer(self, rows.shape, np.float32)
        duser = candidate_logits_grad(xp.ascontiguousarray(dlogits[..., 1:]), parts["user"], rows, 2 * L, index, drows)
        duser += dpos * parts["target"]
        drows[:, :L] = 0
        drows[:, L:2 * L] = _normalize_backward(dpos * parts["user"], parts["target"], parts["target_norm"])
        return duser, drows


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


def sampled_softmax_loss_op(user, rows, ids, index, length, temperature=0.05, ctx=None):
    return SampledSoftmaxLossOp(user, rows, ids, index, length, temperature, ctx=ctx)
