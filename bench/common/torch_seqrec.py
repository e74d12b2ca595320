"""hetu.models.sequential's SASRec and HSTU written in PyTorch, for bench/seqrec.py and
the model tests to compare hetu with.

Built from a dict of hetu's parameters (name -> array: the same initial weights) and reading the
same ids rows [inputs | targets | distinct negatives] and negatives' index
(hetu.data.sequences.draw_negatives and distinct_candidates: the same negatives), so that with dropout 0 the two compute the same losses and gradients up to float
rounding. With `dropout_masks` set (hetu_dropout_masks), each dropout draws hetu's mask for the
same op, step and samples instead of PyTorch's own: then with dropout too. hetu's Linear weights
are [in, out]; here they stay so (x @ W + b)."""
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

NORM_EPS = 1e-6


def _allowed(mask, length, causal=True):
    """[batch, 1, L, L] bool: key j is read by query i (filled, and j <= i)."""
    allowed = mask[:, None, None, :].bool().expand(-1, 1, length, -1)
    if causal:
        allowed = allowed & torch.ones(length, length, dtype=torch.bool).tril()
    return allowed


def time_buckets(times, num_buckets):
    """|t_i - t_j| bucketed by floor(log(max(|dt|, 1)) / 0.301), clipped to the buckets."""
    dt = (times[:, :, None] - times[:, None, :]).abs().clamp(min=1).double()
    return (torch.log(dt) / 0.301).floor().long().clamp(0, num_buckets - 1)


class TorchSequential(nn.Module):
    def __init__(self, kind, config, params):
        super().__init__()
        self.kind, self.config = kind, config
        self.p = nn.ParameterDict({name.replace(".", "_"): nn.Parameter(torch.tensor(np.asarray(v, np.float32)))
                                   for name, v in params.items()})
        self.training_dropout = config.dropout
        self.dropout_masks = None   # (hetu's dropout op name, shape) -> its scaled mask; None: F.dropout

    def _w(self, name):
        return self.p[name]

    def _linear(self, x, name):
        y = x @ self._w(f"{name}_weight")
        return y + self._w(f"{name}_bias") if f"{name}_bias" in self.p else y

    def _norm(self, x, name, eps):
        return F.layer_norm(x, (x.shape[-1],), self._w(f"{name}_scale"), self._w(f"{name}_bias"), eps)

    def _drop(self, x, name):
        """Dropout where hetu's model has its op `name` (hetu.models.sequential, hetu.layers)."""
        if not self.training_dropout or not self.training:
            return x
        if self.dropout_masks is None:
            return F.dropout(x, self.training_dropout, True)
        return x * torch.from_numpy(self.dropout_masks(name, tuple(x.shape)))

    def encode(self, ids, times=None):
        c = self.config
        L, d = c.max_length, c.embedding_size
        inputs = ids[:, :L]
        mask = (inputs >= 0).float()
        table = self._w("item_embedding")
        x = table[inputs.clamp(min=0)] * mask[..., None] * math.sqrt(d) + self._w("position_embedding")
        x = self._drop(x, "input_dropout") * mask[..., None]
        allowed = _allowed(mask, L)
        for i in range(c.blocks):
            x = (self._sasrec_block if self.kind == "sasrec" else self._hstu_block)(x, mask, allowed, i, times)
        if self.kind == "sasrec":
            x = self._norm(x, "sasrec_last_norm", 1e-8)
        return F.normalize(x, dim=-1, eps=NORM_EPS)

    def _heads(self, x, h):
        b, L, w = x.shape
        return x.reshape(b, L, h, w // h).transpose(1, 2)

    def _merge(self, x):
        b, h, L, w = x.shape
        return x.transpose(1, 2).reshape(b, L, h * w)

    def _sasrec_block(self, x, mask, allowed, i, times):
        h = self.config.heads
        q = self._norm(x, f"sasrec{i}_attention_norm", 1e-8)
        name = f"sasrec{i}_attention"
        qh, kh, vh = (self._heads(self._linear(src, f"{name}_{part}"), h)
                      for part, src in (("q", q), ("k", x), ("v", x)))
        scores = (qh @ kh.transpose(-1, -2)) * (qh.shape[-1] ** -0.5)
        weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1).nan_to_num(0.0)
        x = q + self._linear(self._merge(self._drop(weights, f"{name}_dropout") @ vh), f"{name}_out")
        x = self._norm(x, f"sasrec{i}_ffn_norm", 1e-8)
        hidden = self._drop(torch.relu(self._linear(x, f"sasrec{i}_ffn1")), f"sasrec{i}_ffn_dropout1")
        return (x + self._drop(self._linear(hidden, f"sasrec{i}_ffn2"), f"sasrec{i}_ffn_dropout2")) * mask[..., None]

    def _hstu_block(self, x, mask, allowed, i, times):
        c = self.config
        h, L, d = c.heads, c.max_length, c.embedding_size
        lin = att = d // h
        name = f"hstu{i}"
        normed = F.layer_norm(x, (d,), eps=1e-6)
        uvqk = F.silu(self._linear(normed, f"{name}_uvqk"))
        u, v, q, k = torch.split(uvqk, [h * lin, h * lin, h * att, h * att], dim=-1)
        scores = self._heads(q, h) @ self._heads(k, h).transpose(-1, -2)
        rel = torch.arange(L)[None, :] - torch.arange(L)[:, None] + L - 1
        bias = self._w(f"{name}_position_bias")[rel]
        if times is not None:
            bias = bias + self._w(f"{name}_time_bias")[time_buckets(times, c.time_buckets)][:, None]
        weights = torch.where(allowed, F.silu(scores + bias) / L, torch.zeros(()))
        attended = self._merge(weights @ self._heads(v, h))
        gated = u * F.layer_norm(attended, (h * lin,), eps=1e-6)
        return (x + self._linear(self._drop(gated, f"{name}_dropout"), f"{name}_out")) * mask[..., None]

    def loss(self, ids, index, times=None):
        """The mean over batch x L of the positions' sampled softmax losses (hetu's loss), computed
        as generative-recommenders computes it: over the positions that have a target only, the
        table L2-normalised once, each position's negatives gathered from it."""
        c = self.config
        L, N = c.max_length, c.num_negatives
        user = self.encode(ids, times)
        b = ids.shape[0]
        target_ids = ids[:, L:2 * L]
        valid = target_ids >= 0
        user, target_ids = user[valid], target_ids[valid]                       # [P, d], [P]
        index = index.reshape(b, L, N)
        picked = torch.gather(ids[:, 2 * L:], 1, index.clamp(min=0).reshape(b, -1)).reshape(b, L, N)
        neg_ids = torch.where(index >= 0, picked, -1)[valid]                    # [P, N]
        table = self.normalized_items()
        pos = (user * table[target_ids]).sum(-1, keepdim=True)
        neg = torch.bmm(table[neg_ids.clamp(min=0)], user[:, :, None])[..., 0]
        neg = neg.masked_fill((neg_ids < 0) | (neg_ids == target_ids[:, None]), float("-inf"))
        per_position = -torch.log_softmax(torch.cat([pos, neg], dim=-1) / c.temperature, dim=-1)[:, 0]
        return per_position.sum() / (b * L)

    def user_vectors(self, ids, times=None):
        """The user vector at each history's last filled position."""
        L = self.config.max_length
        user = self.encode(ids, times)
        last = ((ids[:, :L] >= 0).sum(1) - 1).clamp(min=0)
        return user[torch.arange(ids.shape[0]), last]

    def normalized_items(self):
        return F.normalize(self._w("item_embedding"), dim=-1, eps=NORM_EPS)

    def parameters_by_name(self):
        return {k: v.detach().numpy() for k, v in self.p.items()}


def hetu_dropout_masks(seed, step, rows, keep_prob):
    """A TorchSequential.dropout_masks drawing hetu's per-sample masks (hetu.ops.norm.DropoutOp)
    of a run seeded `seed` at `step` for the global samples `rows`: 1 / keep_prob where kept."""
    from hetu.ops.norm import per_sample_uniforms
    keep = np.float32(keep_prob)

    def masks(name, shape):
        return (per_sample_uniforms(seed, step, name, rows, shape) < keep).astype(np.float32) / keep
    return masks
