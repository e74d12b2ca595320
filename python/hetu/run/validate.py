"""The one place a run spec is checked: each field (its type, its check, its choices), then the
fields together (what a flag needs of another). Every wrong field is one line naming it,
`spec error: tables.cache_mb: must be a positive finite number, got -3`, and all of them are
reported at once (SpecError)."""
from .spec import BY_PATH, FIELDS

TYPE_WANTED = {int: "must be an integer", float: "must be a number", str: "must be a string",
               bool: "must be true or false"}


class Origin:
    """Where a field's value came from, for its error line: a flag's text, a file, a checkpoint."""

    def __init__(self, flag=None, text=None, source=None):
        self.flag, self.text, self.source = flag, text, source


class SpecError(SystemExit):
    """Exit code 2 (a usage error); str() is the error lines, which main() prints before exiting."""

    def __init__(self, lines):
        super().__init__(2)
        self.lines = list(lines)

    def __str__(self):
        return "\n".join(self.lines)


def has_type(field, value):
    if value is None:
        return field.optional
    if field.kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if field.kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, field.kind)


def _got(field, value, origin):
    """The end of a field's error line: the value as given, and where."""
    if origin is not None and origin.flag is not None:
        return f"argument {origin.flag}: ", f", got {origin.text!r}" if origin.text is not None else ""
    return "", f", got {value!r}" + (f" ({origin.source})" if origin is not None and origin.source else "")


def field_error(field, value, catalog, herald, origin=None):
    """What is wrong with one field's value, or None."""
    choices = field.choices_of(catalog)
    if not has_type(field, value):
        wanted = field.check.wanted if field.check is not None else TYPE_WANTED[field.kind]
    elif choices is not None and value is not None and value not in choices:
        wanted = "must be one of " + ", ".join(str(c) for c in choices)
    elif value is not None and field.check is not None and not field.check.test(value):
        wanted = field.check.wanted
    elif field.herald and not herald and value != field.default:
        wanted = "is for run_laia.py (the Herald scheduler)"
    else:
        return None
    where, got = _got(field, value, origin)
    return f"{field.path}: {where}{wanted}{got}"


def flag_given(spec, path):
    """Whether a flag-like field differs from its default (a flag that was given)."""
    return spec.get(path) != BY_PATH[path].default


def flag_text(path):
    return BY_PATH[path].flag


# Fields of a prepared folder that a stream does not take, and fields only a stream takes.
NOT_ON_A_STREAM = ("validation.val", "data.data_dir", "data.rows", "data.scale", "iters_per_epoch")
STREAM_ONLY = ("data.users", "data.items", "data.skip_bad_lines", "data.stream_idle_exit", "validation.tensorboard")
DYNAMIC_ONLY = ("tables.admit_after", "tables.evict_ttl", "tables.buckets")
# What the sequential models do not take yet: refused, never dropped.
NOT_FOR_SEQUENCES = ("validation.save_predictions", "data.rows", "data.scale", "validation.tensorboard")


def cross_errors(spec, herald, sequential):
    """(path, message) of what one field needs of another; every field's own value is valid."""
    errors = []
    mode, tables, stream = spec.mode, spec.tables, spec.data.stream

    def refuse(path, message):
        errors.append((path, message))
    if spec.cluster.cuda_graph and not spec.cluster.gpu:
        refuse("cluster.cuda_graph", "--cuda-graph needs --gpu")
    if spec.cluster.gpu and spec.optimizer.embedding_dtype != "fp32" and mode.comm in (None, "AllReduce"):
        refuse("optimizer.embedding_dtype", f"--embedding-dtype {spec.optimizer.embedding_dtype} with --gpu needs "
               f"the tables on the parameter server (--comm PS or Hybrid): a table on the GPU is stepped in fp32 only")
    if spec.checkpoint.every and not spec.checkpoint.dir:
        refuse("checkpoint.every", "--checkpoint-every needs --checkpoint DIR")
    if spec.checkpoint.full_every > 1 and not spec.checkpoint.dir:
        refuse("checkpoint.full_every", "--checkpoint-full-every needs --checkpoint DIR")
    if spec.validation.save_predictions and not spec.validation.val:
        refuse("validation.save_predictions", "--save-predictions needs --val")
    if sequential:
        name = spec.model.name
        if stream:
            refuse("data.stream", f"--model {name} trains on a prepared sequences folder; --stream is for CTR logs")
        for path in NOT_FOR_SEQUENCES:
            if flag_given(spec, path):
                refuse(path, f"--model {name}: {flag_text(path)} is not supported for the sequential models yet")
        if spec.model.embedding_size and spec.model.embedding_size % spec.sequence.heads:
            refuse("sequence.heads", f"--embedding-size {spec.model.embedding_size} is not a multiple of --heads "
                   f"{spec.sequence.heads}")
    elif stream:
        for path in NOT_ON_A_STREAM:
            if flag_given(spec, path):
                refuse(path, f"--stream: {flag_text(path)} is for a prepared folder (a stream is validated "
                       f"progressively, every --window samples, and trained until it ends)")
        if tables.capacity is None:
            refuse("tables.capacity", "--stream: a stream's ids are hashed keys, which need dynamic tables: give "
                   "--table-capacity ROWS")
    else:
        for path in STREAM_ONLY:
            if flag_given(spec, path):
                refuse(path, f"{flag_text(path)} needs --stream DIR|-")
    if tables.capacity is None:
        for path in DYNAMIC_ONLY:
            if flag_given(spec, path):
                refuse(path, f"{flag_text(path)} sets a dynamic table: give --table-capacity ROWS")
    if mode.comm is None:
        if herald:
            refuse("mode.comm", "the Herald scheduler needs --comm PS or Hybrid (run_laia.py trains with parameter "
                   "servers; one process: run_hetu.py)")
        if mode.cache is not None:
            refuse("mode.cache", f"--cache {mode.cache} needs --comm PS or Hybrid: it caches rows of the parameter "
                   "server's tables")
        if tables.storage == "disk":
            refuse("tables.storage", "--table-storage disk keeps the tables on the parameter servers' disks: it "
                   "needs --comm PS or Hybrid")
    elif herald and mode.comm == "AllReduce":
        refuse("mode.comm", "the Herald scheduler needs the embedding tables on the parameter server: --comm PS or "
               "Hybrid, not AllReduce")
    if herald and mode.comm is not None and mode.protocol == "herald" and (mode.bsp != 0 or mode.bound != 0):
        refuse("mode.bsp" if mode.bsp else "mode.bound",
               f"Herald trains exactly synchronously: it needs --bsp 0 and --bound 0 (got --bsp {mode.bsp} --bound "
               f"{mode.bound}); staleness is the HET cache's (run_hetu.py), or Herald's allocation with the HET "
               "protocol (--protocol het)")
    if tables.storage == "disk":
        if tables.dir is None:
            refuse("tables.dir", "--table-storage disk: give --table-dir DIR, a folder on each server's own disk")
    else:
        for path in ("tables.dir", "tables.cache_mb"):
            if spec.get(path) is not None:
                refuse(path, f"{flag_text(path)} is for --table-storage disk")
    return errors


def validate(spec, catalog, herald=False, origins=None):
    """Every error line of `spec` (empty: valid). `catalog`: the model names' defaults
    (hetu.run.ModelDefaults by name); `origins`: path -> Origin of the values given."""
    origins = origins or {}
    lines = []
    for field in FIELDS:
        error = field_error(field, spec.get(field.path), catalog, herald, origins.get(field.path))
        if error is not None:
            lines.append(error)
    if not lines:   # the fields together, once each is valid on its own
        sequential = catalog[spec.model.name].sequential
        lines += [f"{path}: {message}" for path, message in cross_errors(spec, herald, sequential)]
    return ["spec error: " + line for line in lines]


def check(spec, catalog, herald=False, origins=None):
    """validate(), raising SpecError with its lines."""
    lines = validate(spec, catalog, herald, origins)
    if lines:
        raise SpecError(lines)
    return spec
