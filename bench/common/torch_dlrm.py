"""hetu.models.dlrm's DLRM written in PyTorch, for bench/quality.py and
bench/single_worker.py to compare hetu with.

One shared table (the dataset's fields share one id space) as nn.EmbeddingBag(mode="sum") with a
bag per (sample, field), -1 slots left out of the bags (an empty bag pools to zeros, as in hetu);
a bottom MLP (dense -> 64 -> 32 -> embedding, ReLU after each layer) where the data has dense
features; the dot product of every pair of the field vectors (and the bottom output), the strict
lower triangle in row order; a top MLP (-> 128 -> 64 -> 1) over concat(bottom output, dots);
plus the first-order term: a second table of width 1 (one weight per id, pooled alike and summed
over the fields) and, with dense features, a linear layer over them. Initialised with hetu's distributions: table N(0, 0.01), weights xavier-normal, biases zero."""
import numpy as np
import torch
from torch import nn

ADAM_EPS = 1e-7   # hetu's AdamOptimizer and AdaGradOptimizer default (PyTorch's are 1e-8 and 1e-10)
BOTTOM, TOP = (64, 32), (128, 64)   # hetu.models.dlrm's defaults


def bags_of(sparse, slot_offsets):
    """ids [samples, slots] (-1: empty slot) and each field's first column (plus the end) ->
    nn.EmbeddingBag's (values, offsets) tensors, one bag per (sample, field), sample-major."""
    present = sparse != -1
    counts = np.add.reduceat(present, np.asarray(slot_offsets[:-1]), axis=1, dtype=np.int64).reshape(-1)
    offsets = np.zeros(len(counts), dtype=np.int64)
    np.cumsum(counts[:-1], out=offsets[1:])
    return torch.from_numpy(np.ascontiguousarray(sparse[present], dtype=np.int64)), torch.from_numpy(offsets)


def tower(width, hidden, relu_last):
    """Linear layers of widths `hidden`, ReLU between them (and after the last with `relu_last`)."""
    layers = []
    for i, h in enumerate(hidden):
        linear = nn.Linear(width, h)
        nn.init.xavier_normal_(linear.weight)
        nn.init.zeros_(linear.bias)
        layers.append(linear)
        if relu_last or i < len(hidden) - 1:
            layers.append(nn.ReLU())
        width = h
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    def __init__(self, num_embeddings, embedding_size, num_fields, num_dense, sparse_table=True):
        super().__init__()
        self.num_fields, self.emb = num_fields, embedding_size
        self.table = nn.EmbeddingBag(num_embeddings, embedding_size, mode="sum", sparse=sparse_table)
        nn.init.normal_(self.table.weight, std=0.01)
        self.first_order = nn.EmbeddingBag(num_embeddings, 1, mode="sum", sparse=sparse_table)
        nn.init.normal_(self.first_order.weight, std=0.01)
        self.dense_linear = tower(num_dense, (1,), relu_last=False) if num_dense else None
        self.bottom = tower(num_dense, BOTTOM + (embedding_size,), relu_last=True) if num_dense else None
        count = num_fields + (1 if num_dense else 0)
        # pairs (i, j), i > j, row by row: torch.tril_indices' order, as hetu's pairwise_dots
        self.register_buffer("pairs", torch.tril_indices(count, count, offset=-1))
        width = self.pairs.shape[1] + (embedding_size if num_dense else 0)
        self.top = tower(width, TOP + (1,), relu_last=False)

    def forward(self, dense, values, offsets):
        pooled = self.table(values, offsets).view(-1, self.num_fields, self.emb)
        vectors = pooled
        if self.bottom is not None:
            bottom = self.bottom(dense)
            vectors = torch.cat([bottom.unsqueeze(1), pooled], dim=1)
        gram = torch.bmm(vectors, vectors.transpose(1, 2))
        dots = gram[:, self.pairs[0], self.pairs[1]]
        logit = self.top(dots if self.bottom is None else torch.cat([bottom, dots], dim=1))
        logit = logit + self.first_order(values, offsets).view(-1, self.num_fields).sum(dim=1, keepdim=True)
        return logit if self.dense_linear is None else logit + self.dense_linear(dense)

    def load_hetu(self, params):
        """hetu's trained parameters (run_hetu.py --save-params, named by dlrm.py's layers); its
        Linear weights are [in, out], PyTorch's [out, in]."""
        with torch.no_grad():
            self.table.weight.copy_(torch.from_numpy(params["embedding"]))
            self.first_order.weight.copy_(torch.from_numpy(params["dlrm_first_order"]))
            for prefix, layers in (("dlrm_bottom", self.bottom), ("dlrm_top", self.top),
                                   ("dlrm_dense_linear", self.dense_linear)):
                linears = [m for m in layers or () if isinstance(m, nn.Linear)]
                names = [f"{prefix}_fc{i}" for i in range(len(linears))]
                if prefix == "dlrm_top":
                    names[-1] = f"{prefix}_out"
                if prefix == "dlrm_dense_linear":
                    names = [prefix]
                for linear, name in zip(linears, names):
                    linear.weight.copy_(torch.from_numpy(params[name + "_weight"]).T)
                    linear.bias.copy_(torch.from_numpy(params[name + "_bias"]))


class RowwiseAdam(torch.optim.Optimizer):
    """Adam on the rows a sparse gradient names, each row counting its own steps for the bias
    correction (t = the steps that row has taken); rows not in the batch are untouched. This is
    the rule hetu documents for its tables (python/hetu/optim.py: "embedding tables row by row";
    src/common/optim_rules.h), written out in PyTorch. torch.optim.SparseAdam differs only in t,
    the optimizer's global step."""

    def __init__(self, params, lr, betas=(0.9, 0.999), eps=ADAM_EPS):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps})

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad.coalesce()   # duplicate ids summed
                rows, g = grad.indices()[0], grad.values()
                state = self.state[p]
                if not state:
                    state["m"], state["v"] = torch.zeros_like(p), torch.zeros_like(p)
                    state["steps"] = torch.zeros(p.shape[0], dtype=torch.float64)
                state["steps"][rows] += 1
                t = state["steps"][rows].unsqueeze(1)
                m = state["m"][rows].mul_(beta1).add_(g, alpha=1 - beta1)
                v = state["v"][rows].mul_(beta2).addcmul_(g, g, value=1 - beta2)
                state["m"][rows], state["v"][rows] = m, v
                bias1 = (1 - beta1 ** t).float()
                bias2 = (1 - beta2 ** t).float()
                p[rows] -= group["lr"] * (m / bias1) / ((v / bias2).sqrt() + group["eps"])


TABLE_OPTIMIZERS = ("rowwise", "sparse", "dense")


def make_optimizers(model, optimizer, lr, table="rowwise"):
    """SGD (it takes the sparse table's gradient as it is); AdaGrad with hetu's eps on every
    parameter (a row a batch does not read keeps its accumulator and value, so hetu's steps on the
    rows read are AdaGrad's over the whole table); or Adam with hetu's eps: on the table
    RowwiseAdam (`table` "rowwise", hetu's rule) or torch.optim.SparseAdam ("sparse"), and
    torch.optim.Adam on the rest; "dense" (a table with dense gradients): Adam on every row."""
    if optimizer == "sgd":
        return [torch.optim.SGD(model.parameters(), lr=lr)]
    if optimizer == "adagrad":
        return [torch.optim.Adagrad(model.parameters(), lr=lr, eps=ADAM_EPS)]
    if table == "dense":
        return [torch.optim.Adam(model.parameters(), lr=lr, eps=ADAM_EPS)]
    table_adam = RowwiseAdam if table == "rowwise" else torch.optim.SparseAdam
    tables = [model.table.weight, model.first_order.weight]
    others = [p for name, p in model.named_parameters() if not name.startswith(("table.", "first_order."))]
    return [table_adam(tables, lr=lr, eps=ADAM_EPS), torch.optim.Adam(others, lr=lr, eps=ADAM_EPS)]
