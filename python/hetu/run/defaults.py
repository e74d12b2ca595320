"""What a model name resolves the spec's unset fields to (the embedding size, the optimizer and
its learning rate), and what a resumed run takes from its checkpoint's spec."""
import dataclasses

from .spec import BY_DEST, BY_PATH, FIELDS


@dataclasses.dataclass(frozen=True)
class ModelDefaults:
    """A model's defaults: its recommended optimizer and learning rate (the pair applies where the
    run names neither or that optimizer), the rate of any other optimizer, its embedding size;
    `sequential`: a model over user histories (sasrec, hstu)."""
    optimizer: str = "sgd"
    learning_rate: float = 0.01
    other_learning_rate: float = 0.01
    embedding_size: int = 128
    sequential: bool = False


CTR = ModelDefaults()
# The published MovieLens-1M settings of SASRec and HSTU.
SEQUENCES = ModelDefaults("adamw_catchup", 1e-3, 1e-3, 50, sequential=True)


def recommended(entry, kind):
    """ModelDefaults of a registry entry: its recommended `optimizer`, `learning_rate` (and
    `embedding_size`) where it has them (hetu.models: the measured best), else `kind`'s."""
    return dataclasses.replace(kind, optimizer=getattr(entry, "optimizer", None) or kind.optimizer,
                               learning_rate=getattr(entry, "learning_rate", None) or kind.learning_rate,
                               embedding_size=getattr(entry, "embedding_size", None) or kind.embedding_size)


def catalog():
    """Every name --model takes (hetu.models), with its defaults."""
    from .. import models
    sequential = getattr(models, "SEQUENTIAL", {})
    return {**{name: recommended(entry, CTR) for name, entry in models.MODELS.items()},
            **{name: recommended(entry, SEQUENCES) for name, entry in sequential.items()}}


def resolve(spec, catalog):
    """Fills the model's defaults into the fields the run leaves unset (None); a name not in the
    catalog is left for validate() to report."""
    defaults = catalog.get(spec.model.name)
    if defaults is None:
        return spec
    if spec.model.embedding_size is None:
        spec.model.embedding_size = defaults.embedding_size
    if spec.optimizer.name is None:
        spec.optimizer.name = defaults.optimizer
    if spec.optimizer.learning_rate is None:
        spec.optimizer.learning_rate = defaults.learning_rate if spec.optimizer.name == defaults.optimizer else \
            defaults.other_learning_rate
    return spec


# What a resumed run must share with the run that wrote its checkpoint: the model, the data and
# the global batch (workers x batch size, checked as the checkpoint loads: the cluster may change
# shape). The learning rate and the scheduler's settings may change.
RESUME_FIELDS = ("model.name", "model.embedding_size", "batch_size", "optimizer.name", "optimizer.embedding_dtype",
                 "mode.comm", "data.dataset", "data.data_dir", "data.rows", "data.scale", "data.stream",
                 "data.stream_format")
SEQUENCE_FIELDS = tuple(f.path for f in FIELDS if f.path.startswith("sequence."))
# What a resumed run takes from the checkpoint where the command line and --config leave it unset:
# the model, its sizes and its optimizer (the batch size: a run on another number of workers gives
# the one that keeps the global batch). The rows' type is not taken: a run in another type than
# its checkpoint's is refused unless given (hetu.ps would convert the rows).
INHERITED = ("model.name", "model.embedding_size", "batch_size", "optimizer.name",
             "optimizer.learning_rate") + SEQUENCE_FIELDS


def resume_fields(sequential):
    return RESUME_FIELDS + (SEQUENCE_FIELDS if sequential else ())


def saved_values(run):
    """path -> value of a checkpoint's run record: its "spec" (written since the run spec), else the
    flags it recorded by name (older checkpoints)."""
    spec = run.get("spec")
    if isinstance(spec, dict):
        from .files import from_dict
        saved, _, origins = from_dict(spec)
        return {path: saved.get(path) for path in origins}
    return {BY_DEST[name].path: value for name, value in run.items() if name in BY_DEST}


def flat_record(run):
    """A checkpoint's run record with every field of its spec under its flag's name (model,
    embedding_size, data_dir, ...): the spec, where the record holds one, wins over the flat keys
    written beside it. What export and serving read the model and its data from."""
    return {**run, **{BY_PATH[path].dest: value for path, value in saved_values(run).items()}}


def inherit(spec, saved, given):
    """Sets the INHERITED fields not in `given` to the checkpoint's values; the paths set."""
    taken = [path for path in INHERITED if path not in given and path in saved]
    for path in taken:
        spec.set(path, saved[path])
    return taken


def resume_conflicts(spec, saved, sequential, where):
    """One line per field the run changes that its checkpoint's run must share (the batch size
    aside: workers x batch size is what must stay, checked as it loads)."""
    lines = []
    for path in resume_fields(sequential):
        if path != "batch_size" and path in saved and saved[path] != spec.get(path):
            flag = BY_PATH[path].flag
            lines.append(f"{path}: --resume {where}: the checkpoint was trained with {flag} {saved[path]}, this run "
                         f"has {flag} {spec.get(path)}")
    return lines
