"""The CTR models' registry (hetu.models): every name the command lines use builds, and a
model's field and dense widths follow the data's metadata (hetu.data.Fields), not its name."""
import numpy as np
import pytest

import hetu as ht
from hetu.data import DatasetMeta, Fields, shape_fields, synthetic
from hetu.models import ARCHITECTURES, MODELS, NAMED, RECOMMENDED, REGISTRY, SEQUENTIAL, UNMEASURED

ROWS = 1000


def build(model, fields, batch=8, embedding_size=4):
    rng = np.random.default_rng(0)
    dense = rng.standard_normal((batch, fields.num_dense)).astype(np.float32) if fields.num_dense else None
    sparse = rng.integers(0, ROWS, size=(batch, sum(fields.slots))).astype(np.int64)
    labels = np.zeros((batch, 1), np.float32)
    ops = [None if a is None else ht.dataloader_op([ht.Dataloader(a, batch, "train")]) for a in (dense, sparse, labels)]
    loss, _, _, train_op = model(*ops, fields.with_rows(ROWS), embedding_size=embedding_size)
    executor = ht.Executor({"train": [loss, train_op]}, ctx=ht.cpu(0), seed=1)
    executor.run("train")
    return {name: value.shape for name, value in executor.parameters().items()}


@pytest.mark.parametrize("name", NAMED)
def test_every_named_model_builds_on_its_dataset(name):
    model = MODELS[name]
    assert model.architecture is ARCHITECTURES[name.split("_")[0]]
    assert model.dataset in synthetic.SHAPES
    assert build(model, shape_fields(model.dataset))


def test_every_name_recommends_a_known_optimizer():
    """Every name --model takes has one registry entry, whose optimizer is a kind of hetu's
    optimizer registry (a misspelt one would fail only when a run starts) at a usable rate; a
    recommendation names a registered model; a name without one keeps the unmeasured default."""
    assert set(REGISTRY) == set(MODELS) | set(SEQUENTIAL) and not set(MODELS) & set(SEQUENTIAL)
    assert set(RECOMMENDED) <= set(MODELS)
    for name, entry in REGISTRY.items():
        assert entry.optimizer in ht.optim.KINDS, f"{name}: {entry.optimizer}"
        assert 0 < entry.learning_rate < 1, f"{name}: {entry.learning_rate}"
        assert ht.optim.optimizer(entry.optimizer, learning_rate=entry.learning_rate).lr.get(0) == entry.learning_rate
        if name in MODELS:
            assert (entry.optimizer, entry.learning_rate) == RECOMMENDED.get(name, UNMEASURED), name


def test_widths_follow_the_metadata():
    """WDL on 3 fields and 2 dense columns: the deep tower's input is 3 x width + 2, the wide part 2."""
    meta = DatasetMeta.from_dict({"name": "toy", "num_rows": 8, "num_dense": 2, "num_fields": 3,
                                  "field_names": ["a", "b", "c"], "field_sizes": [10, 10, 10],
                                  "field_offsets": [0, 10, 20], "num_embeddings": 30,
                                  "split": {"train_rows": 8, "val_rows": 0}})
    assert meta.fields == Fields(("a", "b", "c"), (1, 1, 1), 30, 2)
    shapes = build(MODELS["wdl"], meta.fields, embedding_size=4)
    assert shapes["embedding"] == (ROWS, 4)
    assert shapes["wdl_deep_fc0_weight"] == (3 * 4 + 2, 256)
    assert shapes["wdl_wide_weight"] == (2, 1)


def test_bags_follow_the_metadata():
    fields = Fields(("a", "b"), (3, 1), ROWS, 0, bags=("a",))
    assert MODELS["wdl"].refusal(fields) is not None
    with pytest.raises(ValueError, match="one id per field"):
        MODELS["wdl"](None, None, None, fields)
    assert MODELS["dlrm"].refusal(fields) is None
    assert build(MODELS["dlrm"], fields)["dlrm_top_fc0_weight"][0] == 1   # one pair of two fields


def test_ncf_reads_two_fields():
    assert "reads 2 fields" in MODELS["ncf"].refusal(shape_fields("criteo"))
    assert MODELS["ncf_movielens"].refusal(shape_fields("movielens")) is None


def test_a_bare_architecture_needs_data():
    with pytest.raises(ValueError, match="named for no dataset"):
        MODELS["wdl"](None, None, None)


# each architecture's first-order term: its table of one weight per id, and its dense linear layer's
# weight (None: the architecture reads no dense features)
FIRST_ORDER = {"lr": ("lr_weights", "lr_dense_weight"), "wdl": ("wdl_wide_ids", "wdl_wide_weight"),
               "dfm": ("fm_first_order", "dfm_dense_linear_weight"), "dcn": ("dcn_first_order", "dcn_dense_linear_weight"),
               "dlrm": ("dlrm_first_order", "dlrm_dense_linear_weight"),
               "dcnv2": ("dcnv2_first_order", "dcnv2_dense_linear_weight"), "ncf": ("ncf_first_order", None)}


def train(model, fields, steps, learning_rate=0.1, batch=32, seed=0):
    """`steps` SGD steps on one fixed batch whose label is 1 where the first field's id is
    even: (initial parameters, trained parameters, the losses)."""
    rng = np.random.default_rng(seed)
    dense = rng.standard_normal((batch, fields.num_dense)).astype(np.float32) if fields.num_dense else None
    sparse = rng.integers(0, ROWS, size=(batch, sum(fields.slots))).astype(np.int64)
    labels = (sparse[:, :1] % 2 == 0).astype(np.float32)
    ops = [None if a is None else ht.dataloader_op([ht.Dataloader(a, batch, "train")]) for a in (dense, sparse, labels)]
    loss, _, _, train_op = model(*ops, fields.with_rows(ROWS), embedding_size=4,
                                 optimizer=ht.optim.SGDOptimizer(learning_rate=learning_rate))
    executor = ht.Executor({"train": [loss, train_op]}, ctx=ht.cpu(0), seed=1)
    initial = {name: np.array(value) for name, value in executor.parameters().items()}
    losses = [float(executor.run("train")[0].asnumpy().reshape(-1)[0]) for _ in range(steps)]
    return sparse, initial, {name: np.array(value) for name, value in executor.parameters().items()}, losses


def test_the_logistic_regression_is_a_model():
    assert ARCHITECTURES["lr"].name == "lr" and MODELS["lr_criteo"].architecture is ARCHITECTURES["lr"]
    fields = Fields(("a", "b", "c"), (1, 2, 1), ROWS, 3, bags=("b",))
    _, initial, trained, losses = train(MODELS["lr"], fields, steps=30, learning_rate=5.0)
    assert {name: value.shape for name, value in trained.items()} == {
        "lr_weights": (ROWS, 1), "lr_dense_weight": (3, 1), "lr_dense_bias": (1,)}
    assert losses[-1] < 0.5 * losses[0]   # one batch, labelled by an id: a linear model fits it


@pytest.mark.parametrize("arch", sorted(FIRST_ORDER))
def test_every_architecture_has_a_first_order_term_that_trains(arch):
    """The per-id weights (a width-1 table) and the dense linear term exist, and a step moves the
    rows the batch names and no others."""
    fields = Fields(("user", "item"), (1, 1), ROWS, 0) if arch == "ncf" else Fields(("a", "b", "c"), (1, 1, 1), ROWS, 2)
    sparse, initial, trained, losses = train(MODELS[arch], fields, steps=3)
    table, dense = FIRST_ORDER[arch]
    assert trained[table].shape == (ROWS, 1)
    named = np.zeros(ROWS, bool)
    named[sparse.reshape(-1)] = True
    moved = np.any(trained[table] != initial[table], axis=1)
    assert moved[named].all() and not moved[~named].any()
    if dense is not None:
        assert trained[dense].shape == (2, 1) and np.any(trained[dense] != initial[dense])
    assert np.isfinite(losses).all() and losses[-1] < losses[0]
