"""SASRec and HSTU (hetu.models.sequential) against their PyTorch twins
(bench/common/torch_seqrec.py): from the same weights, on the same ids rows and timestamps, with dropout
0 (or with the twin drawing hetu's dropout masks), the loss, the user vectors and every
parameter's gradient agree up to float rounding."""
import sys
from pathlib import Path

import numpy as np
import pytest

import hetu as ht
from hetu.autodiff import SparseToDenseOp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from hetu.data.sequences import distinct_candidates  # noqa: E402
from hetu.models.sequential import SequenceConfig, build  # noqa: E402

torch = pytest.importorskip("torch")
from common.torch_seqrec import TorchSequential, hetu_dropout_masks  # noqa: E402


def ids_rows(rng, batch, length, negatives, items):
    """[inputs | targets | distinct negatives] rows of histories of 1 to L + 1 items (some full,
    some short), and the negatives' index."""
    sizes = rng.integers(2, length + 2, batch)
    sizes[0] = 1   # one input and no target: a position that reads no rows but its input
    stored = np.full((batch, length + 1), -1, np.int64)
    for s, n in enumerate(sizes):
        stored[s, :n] = rng.integers(0, items, n)
    targets = stored[:, 1:]
    neg = rng.integers(0, items, (batch, length, negatives))
    neg[targets < 0] = -1
    neg[1, 0, 0] = targets[1, 0]   # a negative equal to the target
    candidates, index = distinct_candidates(neg, items)
    return np.concatenate([stored[:, :length], targets, candidates], axis=1), index.reshape(batch, -1)


def hetu_and_twin(kind, dropout=0.0, twin_masks=None):
    """One step of hetu's model, in training (dropout on) where dropout > 0, and of its twin from
    the same weights on the same rows: (hetu's loss, user vectors, parameters and gradients; the
    twin's loss, the twin). `twin_masks`: the twin's dropout_masks."""
    rng = np.random.default_rng(0)
    config = SequenceConfig(num_items=30, max_length=6, num_negatives=4, embedding_size=8, blocks=2, heads=2,
                            dropout=dropout, temperature=0.1, time_buckets=8)
    ids, index = ids_rows(rng, 5, config.max_length, config.num_negatives, config.num_items)
    times = np.sort(rng.integers(0, 10**6, (5, config.max_length)), axis=1)
    ids_node, index_node = ht.Variable("ids", dtype=np.int64), ht.Variable("index", dtype=np.int64)
    times_node = ht.Variable("times", dtype=np.int64) if kind == "hstu" else None
    graph = build(kind, ids_node, index_node, times_node, config, ht.optim.optimizer("sgd", learning_rate=0.0))
    params = [p for p in ht.topo_sort([graph.loss]) if isinstance(p, ht.Variable) and p.trainable]
    grads = [SparseToDenseOp(g) if getattr(g, "produces_sparse", False) else g
             for g in ht.gradients(graph.loss, params)]
    executor = ht.Executor([graph.loss, graph.user] + grads, seed=1)
    feed = {ids_node: ids, index_node: index}
    if times_node is not None:
        feed[times_node] = times
    loss, user, *got = executor.run(feed_dict=feed, convert_to_numpy_ret_vals=True, training=dropout > 0)

    twin = TorchSequential(kind, config, executor.parameters())
    twin.dropout_masks = twin_masks
    t_ids, t_times = torch.tensor(ids), (torch.tensor(times) if times_node is not None else None)
    reference = twin.loss(t_ids, torch.tensor(index), t_times)
    reference.backward()
    twin.eval()
    return float(loss), user, list(zip(params, got)), reference.item(), twin, (t_ids, t_times)


def assert_same_gradients(pairs, twin):
    assert len(pairs) > 10
    for p, g in pairs:
        want = twin.p[p.name].grad
        want = np.zeros(p.shape, np.float32) if want is None else want.numpy()
        np.testing.assert_allclose(g, want, rtol=1e-3, atol=2e-5, err_msg=p.name)


@pytest.mark.parametrize("kind", ["sasrec", "hstu"])
def test_same_loss_user_vectors_and_gradients_as_pytorch(kind):
    loss, user, pairs, reference, twin, (t_ids, t_times) = hetu_and_twin(kind)
    assert abs(loss - reference) < 1e-5 * max(1.0, abs(reference))
    np.testing.assert_allclose(user, twin.user_vectors(t_ids, t_times).detach().numpy(), atol=2e-6)
    assert_same_gradients(pairs, twin)


@pytest.mark.parametrize("kind", ["sasrec", "hstu"])
def test_twin_drawing_hetus_dropout_masks_computes_the_same_step(kind):
    """With dropout on, the twin that draws hetu's masks (hetu_dropout_masks: the op, the step, the
    samples) has hetu's loss and gradients; with PyTorch's own masks it has another loss."""
    masks = hetu_dropout_masks(1, 0, np.arange(5, dtype=np.int64), 0.7)
    loss, _, pairs, reference, twin, _ = hetu_and_twin(kind, dropout=0.3, twin_masks=masks)
    assert abs(loss - reference) < 1e-5 * max(1.0, abs(reference))
    assert_same_gradients(pairs, twin)
    torch.manual_seed(0)
    other, _, _, own, _, _ = hetu_and_twin(kind, dropout=0.3)
    assert other == loss and abs(own - loss) > 1e-3
