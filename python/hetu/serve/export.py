"""Export: a checkpoint (a full one with its deltas, as one version) -> a bundle folder that
answers predictions with no training code, no servers and no data folder (docs/design.md section 15):

    model.onnx         the dense part (hetu.serve.onnx_graph): inputs "dense" [batch, dense width]
                       (absent without dense features) and one per embedding lookup of the graph,
                       its rows per field [batch, fields, width] (a bag lookup: pooled per bag);
                       output "probability" [batch]
    tables/NAME.npy    each table's rows in their storage type (fp32, fp16, or bf16 kept as its
                       16 bits, uint16), memory-mapped when opened
    tables/NAME.keys.npy, tables/NAME.slots.npy
                       a dynamic table's key index: its resident keys ascending and their rows
    vocabulary.npz     indexed data: each field's value texts -> ids (hetu.serve.encode)
    schema.json        model, version, raw columns, fields, hashing, bags, dense transforms,
                       the ONNX inputs and the tables

The graph is rebuilt from the checkpoint's run record (hetu.models' registry, the data's fields)
and its parameters read from the checkpoint's files (hetu.serve.checkpoint_rows). The bundle is
written beside `output_dir` and renamed into place: a reader sees the old bundle or the new one,
never a part."""
import json
import os
import shutil

import numpy as np

from .. import checkpoint
from ..data.keys import HASH_NAME
from ..models import MODELS
from ..run import flat_record
from . import onnx_graph
from .checkpoint_rows import STORED_AS, CheckpointChanged, CheckpointRows
from .raw_columns import raw_columns

BUNDLE_FORMAT = "hetu-bundle/1"
SCHEMA = "schema.json"
MODEL = "model.onnx"
VOCABULARY = "vocabulary.npz"
TABLES = "tables"


class ExportError(ValueError):
    """A checkpoint that cannot be exported; the message names it and what is wrong."""


def checkpoint_version(checkpoint_dir):
    """The version of the checkpoint at `checkpoint_dir`: the training step its last save (full
    or delta) holds, which rises with every save of a job. Reads meta.json files only."""
    return int(checkpoint.info(checkpoint_dir)["iteration"])


def consistent_version(checkpoint_dir):
    """(version, broken): the version of the checkpoint's full save and the deltas that follow it
    without a break, and None or the line that says where its chain of deltas breaks."""
    folder, _ = checkpoint.locate(checkpoint_dir)
    full = checkpoint.read_meta(folder)
    chain, broken = checkpoint.consistent_chain(folder)
    return int((chain[-1][1] if chain else full)["iteration"]), broken


# What a run record says of the model itself: a checkpoint that differs in one of them is another
# model, whatever its name; the rest (where the data lies and how much of it, the batch, the
# optimizer, the storage type) is how a model of the same shape and data was trained: a new version.
MODEL_IDENTITY = ("model", "embedding_size", "dataset", "stream_format", "architecture", "blocks", "heads")


def another_model(run, served_run):
    """None, or what in `run` (a checkpoint's run record) makes it another model than the one of
    `served_run`, in a few words."""
    differ = [f"{key} {run.get(key)} (served: {served_run.get(key)})" for key in MODEL_IDENTITY
              if run.get(key) != served_run.get(key)]
    return ", ".join(differ) or None


def data_of(run, where):
    """(fields of the data, its meta.json dict or None for a stream, the stream's format or None)."""
    from ..data import load_dataset
    if run.get("stream"):
        from ..data.stream import make_format
        try:
            fmt = make_format(run.get("stream_format") or "criteo", run.get("users"), run.get("items"))
        except (OSError, ValueError) as e:
            raise ExportError(f"{where}: the stream's format {run.get('stream_format')}: {e}") from None
        return fmt.fields, None, fmt
    source = run.get("data_dir") or run.get("dataset") or "synthetic"
    if run.get("data_dir") is None and source.startswith("synthetic"):
        shape = MODELS[run["model"]].dataset
        name = f"synthetic-{shape}" if source == "synthetic" and shape else source
        params = {k: run[k] for k in ("rows", "scale") if run.get(k) is not None}
        data = load_dataset(name, **params)
    else:
        try:
            data = load_dataset(source)
        except (FileNotFoundError, ValueError) as e:
            raise ExportError(f"{where}: its data {source}: {e}") from None
    return data.meta, {**data.meta.info, "folder": str(data.path)}, None


def rebuild(run, meta, where):
    """(prediction, dense placeholder or None, fields, the data's meta.json dict or None, the
stream's format or None) of the run's model, built as training built it."""
    import hetu as ht
    model = run.get("model")
    if model not in MODELS:
        raise ExportError(f"{where}: unknown model {model!r} (the models are {', '.join(sorted(MODELS))})")
    data_meta, data_info, fmt = data_of(run, where)
    dynamic = dynamic_of(meta, where)
    if fmt is not None:
        fields = fmt.fields.with_dynamic(dynamic)
    else:
        fields = data_meta.fields_for(dynamic)
    dense = ht.placeholder_op("dense") if fields.num_dense else None
    sparse = ht.placeholder_op("sparse", dtype=np.int64)
    label = ht.placeholder_op("label")
    size = {"embedding_size": run["embedding_size"]} if run.get("embedding_size") else {}
    _, prediction, _, _ = MODELS[model](dense, sparse, label, fields, **size)
    return prediction, dense, fields, data_info, fmt


def dynamic_of(meta, where):
    """The dynamic table rule of a checkpoint's meta.json, or None."""
    from ..dynamic import DynamicTable
    saved = meta.get("dynamic", [])
    if len(saved) > 1:
        raise ExportError(f"{where}: {len(saved)} key directories; export reads one")
    return DynamicTable(**{k: v for k, v in saved[0].items() if k != "name"}) if saved else None


READ_TRIES = 3   # reads of a checkpoint that a job keeps replacing, before giving up


def read_checkpoint(checkpoint_dir, consistent=False):
    """The checkpoint's rows, all from one save: a read that a newer full save's swap overtook (a
    file gone, or the save in place no longer the one read) is read again. `consistent`: up to a
    break in its chain of deltas, if it has one."""
    for attempt in range(READ_TRIES):
        try:
            return CheckpointRows(checkpoint_dir, consistent)
        except (FileNotFoundError, CheckpointChanged) as e:
            if attempt + 1 == READ_TRIES:
                raise ExportError(str(e).strip("'")) from None
        except KeyError as e:
            raise ExportError(str(e).strip("'")) from None


def export(checkpoint_dir, output_dir, consistent=False):
    """Writes the bundle of the checkpoint at `checkpoint_dir` (with its deltas; `consistent`: up
    to a break in their chain) to `output_dir`; returns the bundle's path. A sequential model's
    (its run records an "architecture") is hetu.serve.sequences'."""
    where = f"checkpoint {checkpoint_dir}"
    saved = read_checkpoint(checkpoint_dir, consistent)
    run = flat_record(saved.meta.get("run") or {})   # the run spec's fields, where it records one
    if not run.get("model"):
        raise ExportError(f"{where} records no run (model, data): it was not written by examples/ctr's training")
    if run.get("architecture"):
        from .sequences import sequence_bundle
        model, fill = sequence_bundle(saved, run, where)
    else:
        model, fill = ctr_bundle(saved, run, where)
    final = os.path.abspath(output_dir)
    tmp = checkpoint.new_folder(final)
    try:
        os.chmod(tmp, 0o755)   # mkdtemp's folder is private; a bundle is read by servers of other users too
        os.makedirs(os.path.join(tmp, TABLES))
        with open(os.path.join(tmp, MODEL), "wb") as f:
            f.write(model.SerializeToString())
        schema = {
            # The version of the saves read (a save landing meanwhile is the next export's).
            "format": BUNDLE_FORMAT, "model": run["model"], "version": int(saved.meta["iteration"]),
            "checkpoint": saved.folder, "deltas": saved.deltas, "run": run,
            "embedding_dtype": run.get("embedding_dtype") or "fp32", **fill(tmp)}
        with open(os.path.join(tmp, SCHEMA), "w") as f:
            json.dump(schema, f, indent=1)
        checkpoint.swap_in(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def ctr_bundle(saved, run, where):
    """(the ONNX model, fill(folder) -> the rest of schema.json, writing the tables and the
    vocabulary into the folder) of a CTR model's checkpoint."""
    prediction, dense, fields, data_info, fmt = rebuild(run, saved.meta, where)
    columns, vocabulary = raw_columns(data_info, fmt, fields, where)

    lookups = onnx_graph.lookups_of(prediction)
    inputs, tables = [], {}
    for i, op in enumerate(lookups):
        table = op.inputs[0]
        if op.inputs[1].name != "sparse":
            raise ExportError(f"{where}: lookup {op.name} reads {op.inputs[1].name}, not the sample's ids")
        inputs.append({"name": f"rows_{i}", "table": table.name,
                       "bags": None if op.bags is None else {"slots": list(op.bags.slots) if op.bags.slots else None,
                                                             "mode": op.bags.mode}})
        tables[table.name] = table
    try:
        model = onnx_graph.build(prediction, dense, saved.values, saved.persistent, [x["name"] for x in inputs],
                                 fields.num_dense, int(sum(fields.slots)))
    except onnx_graph.ExportError as e:
        raise ExportError(f"{where}: {e}") from None

    def fill(folder):
        table_info = {name: write_table(folder, name, var, saved, run, where) for name, var in tables.items()}
        if vocabulary is not None:
            np.savez(os.path.join(folder, VOCABULARY), **vocabulary)
        return {
            "ids": "indexed" if fmt is None and data_info.get("ids", "indexed") == "indexed" else "hashed",
            "hashing": {"name": HASH_NAME, "field": "the field's position in fields",
                        "value_bytes": "the value's UTF-8 text; synthetic data: the field-local id's 8 "
                                       "little-endian bytes"},
            "fields": [{"name": n, "slots": int(k), "bag": n in fields.bags,
                        **({} if data_info is None or data_info.get("ids") == "hashed" else
                           {"size": int(data_info["field_sizes"][f]), "offset": int(data_info["field_offsets"][f])})}
                       for f, (n, k) in enumerate(zip(fields.names, fields.slots))],
            "num_dense": int(fields.num_dense),
            "columns": columns,
            "onnx": {"file": MODEL, "opset": onnx_graph.OPSET, "output": onnx_graph.PROBABILITY,
                     "dense_input": "dense" if fields.num_dense else None,
                     "inputs": inputs,
                     "embedding_inputs": "one per embedding lookup: its table's rows of each field of the sample "
                                         "[batch, fields, width], pooled per bag (bags: slots, mode) for a bag lookup"},
            "tables": table_info,
        }
    return model, fill


def write_table(folder, name, var, saved, run, where):
    """tables/NAME.npy (and a dynamic table's key index); its schema.json entry."""
    if name not in saved.values:
        raise ExportError(f"{where} holds no rows of table {name}")
    rows = saved.values[name]
    storage = saved.storage.get(name, "fp32")
    wanted = run.get("embedding_dtype") or "fp32"
    if storage == "fp32" and wanted in ("bf16", "fp16"):
        # A local table keeps its rows in fp32, rounded to the storage type: stored as that type
        # when that loses nothing.
        narrow = (rows.view(np.uint32) >> 16).astype(np.uint16) if wanted == "bf16" else rows.astype(np.float16)
        back = (narrow.astype(np.uint32) << 16).view(np.float32) if wanted == "bf16" else narrow.astype(np.float32)
        if np.array_equal(back, rows):
            rows, storage = narrow, wanted
    rows = np.ascontiguousarray(rows, STORED_AS[storage])
    file = f"{TABLES}/{name}.npy"
    np.save(os.path.join(folder, file), rows)
    info = {"file": file, "storage": storage, "shape": list(rows.shape)}
    if var.dynamic is not None:
        if not saved.dynamic:
            raise ExportError(f"{where}: table {name} is dynamic and the checkpoint holds no key directory")
        keys, slots = saved.dynamic[0]
        info["keys"], info["slots"] = f"{TABLES}/{name}.keys.npy", f"{TABLES}/{name}.slots.npy"
        np.save(os.path.join(folder, info["keys"]), keys)
        np.save(os.path.join(folder, info["slots"]), slots)
        info["resident"] = int(len(keys))
    return info
