"""The run spec: everything a training run of run_hetu.py / run_laia.py is given, as dataclasses
grouped by concern (docs/design.md, The run spec). Each field carries its type, default, help,
the command-line flag it answers to and its check; validate() is the one place a spec is checked,
each field and then the fields together, every wrong field reported at once."""
import dataclasses
import math
import typing

from ..herald.options import ALLOCATORS, PLANNERS, PROTOCOLS, HeraldOptions
from ..optim import EMBEDDING_DTYPES, KINDS as OPTIMIZER_KINDS


class Check:
    """A field's test beyond its type, and what it wants in the words of an error."""

    def __init__(self, test, wanted):
        self.test, self.wanted = test, wanted


POSITIVE_INT = Check(lambda v: v > 0, "must be a positive integer")
NONNEGATIVE_INT = Check(lambda v: v >= 0, "must be an integer >= 0")
AT_LEAST_ONE = Check(lambda v: v >= 1, "must be at least 1")
POSITIVE_FLOAT = Check(lambda v: 0 < v < math.inf, "must be a positive finite number")
RATIO = Check(lambda v: 0 < v <= 1, "must be in (0, 1]")
PROBABILITY = Check(lambda v: 0 <= v < 1, "must be in [0, 1)")
BSP = Check(lambda v: v >= -1, "must be 0 (BSP), -1 (ASP) or k > 0 (SSP)")

NEGATIVES = ("uniform", "shared", "in-batch")


def option(default, flag, help, check=None, choices=None, metavar=None, herald=False):
    """A spec field: `flag` is its command-line flag (a bool field: a store_true flag); `herald`:
    only run_laia.py takes it; `choices`: a tuple, or a callable of the model catalog."""
    return dataclasses.field(default=default, metadata={
        "flag": flag, "help": help, "check": check, "choices": choices, "metavar": metavar, "herald": herald})


@dataclasses.dataclass
class DataSpec:
    """What the run trains on: a prepared folder (or the synthetic data), or a stream."""
    dataset: str = option("synthetic", "--dataset", "dataset name or prepared folder (default: synthetic)")
    data_dir: typing.Optional[str] = option(None, "--data-dir", "a prepared dataset folder (overrides --dataset)")
    rows: typing.Optional[int] = option(None, "--rows", "synthetic data: number of samples", POSITIVE_INT)
    scale: typing.Optional[float] = option(None, "--scale", "synthetic data: table-size scale of real Criteo",
                                           POSITIVE_FLOAT)
    stream: typing.Optional[str] = option(
        None, "--stream", "train on a growing log instead of a prepared folder: the files of DIR in name order, "
        "each taken once complete (names starting '.' or ending .tmp/.part are ignored), new ones followed as they "
        "land, or standard input (-); its ids are hashed keys: needs --table-capacity (docs/usage.md, Streams)",
        metavar="DIR|-")
    stream_format: str = option(
        "criteo", "--stream-format", "the stream's line format: criteo (the Kaggle train.txt layout), movielens "
        "(ratings user item rating timestamp, '::' or tab separated; --users / --items side files), schema:FILE "
        "(a YAML schema of any delimited log) or parquet:FILE (Parquet files, columns named by the same schema)",
        metavar="criteo|movielens|schema:FILE|parquet:FILE")
    users: typing.Optional[str] = option(None, "--users", "--stream-format movielens: u.user / users.dat",
                                         metavar="FILE")
    items: typing.Optional[str] = option(None, "--items", "--stream-format movielens: u.item / movies.dat",
                                         metavar="FILE")
    skip_bad_lines: bool = option(False, "--skip-bad-lines", "--stream: skip malformed lines (counted at the end) "
                                  "instead of stopping at the first")
    stream_idle_exit: typing.Optional[float] = option(
        None, "--stream-idle-exit", "--stream: end the job cleanly once SECONDS pass with no new sample (default: "
        "follow the stream until it ends); the samples of an incomplete last global batch are not trained",
        POSITIVE_FLOAT, metavar="SECONDS")


@dataclasses.dataclass
class ModelSpec:
    name: str = option(
        "wdl_criteo", "--model", "<arch>_<dataset>: the architecture on the dataset it is named for (its synthetic "
        "shape by default); a bare architecture: on --dataset / --data-dir. sasrec and hstu are sequential models "
        "over user histories (a sequences dataset)", choices=lambda catalog: sorted(catalog))
    embedding_size: typing.Optional[int] = option(None, "--embedding-size", "default 128; the sequential models' 50",
                                                  POSITIVE_INT)


@dataclasses.dataclass
class SequenceSpec:
    """The sequential models' own settings (sasrec, hstu; docs/design.md section 17)."""
    num_negatives: int = option(128, "--num-negatives", "uniform negatives per position of the sampled softmax "
                                "(default 128)", AT_LEAST_ONE, metavar="N")
    negatives: str = option(
        "uniform", "--negatives", "uniform: N drawn from the catalog for each position; shared: N drawn once per "
        "global batch, read by every position (fewer rows a step); in-batch: N drawn for each position from the "
        "global batch's targets", choices=NEGATIVES)
    blocks: int = option(2, "--blocks", "attention blocks (default 2)", AT_LEAST_ONE)
    heads: int = option(1, "--heads", "attention heads (default 1)", AT_LEAST_ONE)
    dropout: float = option(0.2, "--dropout", "dropout probability (default 0.2)", PROBABILITY)
    temperature: float = option(0.05, "--temperature", "sampled softmax temperature (default 0.05)", POSITIVE_FLOAT)


@dataclasses.dataclass
class OptimizerSpec:
    name: typing.Optional[str] = option(
        None, "--optimizer", "a kind of the optimizer registry (default: the model's recommended optimizer, sgd "
        "where none was measured; the sequential models': adamw_catchup, betas (0.9, 0.98), no weight decay). "
        "Embedding tables are stepped row by row, only the rows a step reads: adam and adamw take lazy row-wise "
        "steps, as FBGEMM's and TF's LazyAdam (rows not read in a step are not stepped, their moments do not decay; "
        "each row keeps its own step count for the bias correction); dense parameters take ordinary Adam steps. "
        "adam_catchup and adamw_catchup give dense Adam's result instead: a row's skipped steps are applied when it "
        "is next read (a constant --learning-rate; docs/design.md section 4)", choices=tuple(sorted(OPTIMIZER_KINDS)))
    learning_rate: typing.Optional[float] = option(
        None, "--learning-rate", "default: the model's recommended rate with its recommended optimizer, else 0.01; "
        "the sequential models' 0.001", POSITIVE_FLOAT)
    embedding_dtype: str = option(
        "fp32", "--embedding-dtype", "type embedding rows are stored and moved in; steps compute in fp32 and round "
        "to it, optimizer state stays fp32", choices=tuple(sorted(EMBEDDING_DTYPES)))


@dataclasses.dataclass
class TablesSpec:
    capacity: typing.Optional[int] = option(
        None, "--table-capacity", "dynamic embedding tables of ROWS rows keyed by the data's ids (any int64 keys: "
        "data prepared with --ids hashed needs it): keys are admitted and evicted by the batch sequence alone "
        "(docs/design.md section 13)", POSITIVE_INT, metavar="ROWS")
    storage: str = option(
        "memory", "--table-storage", "where the servers keep the embedding tables' rows: in memory (default), or on "
        "disk under --table-dir with --table-cache-mb of them cached in memory; training is the same bit for bit "
        "(docs/usage.md, Tables on disk)", choices=("memory", "disk"))
    dir: typing.Optional[str] = option(None, "--table-dir", "--table-storage disk: the folder on each server's own "
                                       "disk its row files go in", metavar="DIR")
    prefetch: str = option(
        "on", "--table-prefetch", "--table-storage disk: where the next step's rows are known (Herald's plans; the "
        "HET cache with --prefetch), the servers read them into their caches ahead (default on)", choices=("on", "off"))
    cache_mb: typing.Optional[float] = option(
        None, "--table-cache-mb", "--table-storage disk: MiB of rows (with their optimizer state) each server keeps "
        "in memory per table (default 256)", POSITIVE_FLOAT, metavar="MB")
    admit_after: int = option(1, "--admit-after", "dynamic tables: a key gets a row once K global batches have read "
                              "it (default 1)", POSITIVE_INT, metavar="K")
    evict_ttl: int = option(0, "--evict-ttl", "dynamic tables: a key unread for STEPS steps leaves its row (default "
                            "0: off)", NONNEGATIVE_INT, metavar="STEPS")
    buckets: int = option(0, "--table-buckets", "dynamic tables: B buckets, a divisor of the capacity (default: "
                          "capacity / w for the largest w of 16, 8, 4, 2, 1 that divides it)", NONNEGATIVE_INT,
                          metavar="B")


@dataclasses.dataclass
class ModeSpec:
    """The distribution, the HET cache and Herald's scheduler (run_laia.py only)."""
    comm: typing.Optional[str] = option(None, "--comm", "distribution: PS, AllReduce or Hybrid (default: one "
                                        "process, no communication)", choices=(None, "PS", "AllReduce", "Hybrid"))
    cache: typing.Optional[str] = option(None, "--cache", "embedding cache policy",
                                         choices=(None, "lru", "lfu", "lfuopt"))
    bound: int = option(0, "--bound", "cache staleness bound (0: exact)", NONNEGATIVE_INT)
    bsp: int = option(0, "--bsp", "0: BSP, -1: ASP, k>0: SSP with staleness k", BSP)
    cache_limit_ratio: float = option(0.1, "--cache-limit-ratio", "cache rows / table rows", RATIO)
    prefetch: bool = option(False, "--prefetch", "caches send a step's pull during the step before (faster on "
                            "loopback, slower on shaped 1 Gbit/s links: see the README)")
    lookahead: int = option(HeraldOptions.lookahead, "--lookahead", "iterations the scheduler plans ahead",
                            POSITIVE_INT, herald=True)
    planners: str = option(HeraldOptions.planners, "--planners", "host: one planner per host, run by its first "
                           "worker, which sends the host's other workers their plans; worker: every worker plans for "
                           "itself. The plans are the same", choices=PLANNERS, herald=True)
    planner_threads: typing.Optional[int] = option(
        None, "--planner-threads", "threads of a planner (default: HETU_PLANNER_THREADS, else one per worker it "
        "plans for, at most the cores); the plans are the same whatever the count", POSITIVE_INT, herald=True)
    allocator: str = option(HeraldOptions.allocator, "--allocator", "colocate: fewest rows moved (cache and "
                            "co-location); greedy: the cache score alone; none: plain data-parallel slices (the "
                            "'plan only' ablation)", choices=ALLOCATORS, herald=True)
    protocol: str = option(HeraldOptions.protocol, "--protocol", "het: Herald's allocation with the HET cache "
                           "protocol (the 'allocator only' ablation)", choices=PROTOCOLS, herald=True)


@dataclasses.dataclass
class CheckpointSpec:
    dir: typing.Optional[str] = option(None, "--checkpoint", "save a checkpoint to this folder after every epoch "
                                       "(the last one replaces the others)", metavar="DIR")
    every: typing.Optional[int] = option(None, "--checkpoint-every", "with --checkpoint: also save every N steps "
                                         "within an epoch", POSITIVE_INT, metavar="N")
    full_every: int = option(1, "--checkpoint-full-every", "with --checkpoint: every K-th save is a full "
                             "checkpoint, the ones between are deltas (the rows and state changed since the save "
                             "before, the dense parameters, the position)", POSITIVE_INT, metavar="K")
    resume: typing.Optional[str] = option(None, "--resume", "continue the run of the checkpoint in this folder up "
                                          "to --nepoch epochs in all; the model and its sizes the command line and "
                                          "--config leave unset are the checkpoint's", metavar="DIR")


@dataclasses.dataclass
class ValidationSpec:
    val: bool = option(False, "--val", "validate after every epoch")
    save_predictions: typing.Optional[str] = option(None, "--save-predictions", "with --val: write the last "
                                                    "validation's probabilities, in the split's order, to this .npy",
                                                    metavar="FILE.npy")
    window: int = option(10000, "--window", "--stream: progressive validation every N samples: the AUC and logloss "
                         "of the predictions the samples got before they were trained, and the lag (default 10000)",
                         POSITIVE_INT, metavar="N")
    tensorboard: typing.Optional[str] = option(None, "--tensorboard", "--stream: write the windows' AUC, logloss "
                                               "and lag to DIR as TensorBoard scalars", metavar="DIR")


@dataclasses.dataclass
class ClusterSpec:
    threads: typing.Optional[int] = option(
        None, "--threads", "threads of this process's kernels and BLAS (default: HETU_NUM_THREADS, else the host's "
        "usable cores, cgroup quota and CPU affinity counted, divided by the job's processes on the host)",
        POSITIVE_INT, metavar="N")
    gpu: bool = option(False, "--gpu", "train on a GPU: worker w of a host takes GPU (local rank mod the host's "
                       "GPUs); the cluster file's `gpus:` or --gpus of runner.py says how many a host has, else all "
                       "the GPUs CuPy sees")
    cuda_graph: bool = option(False, "--cuda-graph", "with --gpu: after two eager steps, replay each static run of "
                              "ops (forward, backward) as a captured CUDA graph (1.1-2.5x at batch <= 4096 on one "
                              "H100: see the README)")


@dataclasses.dataclass
class OutputSpec:
    no_progress: bool = option(False, "--no-progress", "no progress bar or progress lines (logs and CI)")
    log_interval: float = option(30.0, "--log-interval", "seconds between progress lines when the output is not a "
                                 "terminal (under the launcher)", POSITIVE_FLOAT)
    csv_dir: str = option("csv", "--csv-dir", "folder for --cache-perf files")
    cache_perf: bool = option(False, "--cache-perf", "write per-iteration counters to --csv-dir")
    save_params: typing.Optional[str] = option(None, "--save-params", "write the trained parameters to this .npz")


@dataclasses.dataclass
class RunSpec:
    """A training run. The groups are the sections of a --config file; the scalars below them are
    its top-level keys."""
    data: DataSpec = dataclasses.field(default_factory=DataSpec)
    model: ModelSpec = dataclasses.field(default_factory=ModelSpec)
    sequence: SequenceSpec = dataclasses.field(default_factory=SequenceSpec)
    optimizer: OptimizerSpec = dataclasses.field(default_factory=OptimizerSpec)
    tables: TablesSpec = dataclasses.field(default_factory=TablesSpec)
    mode: ModeSpec = dataclasses.field(default_factory=ModeSpec)
    checkpoint: CheckpointSpec = dataclasses.field(default_factory=CheckpointSpec)
    validation: ValidationSpec = dataclasses.field(default_factory=ValidationSpec)
    cluster: ClusterSpec = dataclasses.field(default_factory=ClusterSpec)
    output: OutputSpec = dataclasses.field(default_factory=OutputSpec)
    seed: int = option(123, "--seed", None)
    batch_size: int = option(128, "--batch-size", "per-worker batch size", POSITIVE_INT)
    epochs: float = option(1.0, "--nepoch", "epochs to train, each a full pass over the training split (fractions "
                           "allowed)", POSITIVE_FLOAT)
    iters_per_epoch: typing.Optional[int] = option(None, "--iters-per-epoch", "at most K iterations per epoch "
                                                   "(default: no cap, a full pass)", POSITIVE_INT, metavar="K")
    all: bool = option(False, "--all", "train on the whole training split each epoch: the default; accepted for "
                       "older commands, where it overrides --iters-per-epoch")

    def get(self, path):
        group, _, name = path.rpartition(".")
        return getattr(getattr(self, group) if group else self, name)

    def set(self, path, value):
        group, _, name = path.rpartition(".")
        setattr(getattr(self, group) if group else self, name, value)


# ------------------------------------------------------------------------------------------ the fields

@dataclasses.dataclass(frozen=True)
class Field:
    """One leaf of the spec: its path ("tables.cache_mb"), type (int, float, str or bool), whether
    None is allowed, default, flag, help, check and choices."""
    path: str
    kind: type
    optional: bool
    default: object
    flag: str
    help: str
    check: Check
    choices: object
    metavar: str
    herald: bool

    @property
    def dest(self):
        """The flag's name in the namespace view (args.table_cache_mb of --table-cache-mb)."""
        return self.flag[2:].replace("-", "_")

    def choices_of(self, catalog):
        return self.choices(catalog) if callable(self.choices) else self.choices


def _leaves(cls, prefix=""):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            yield from _leaves(hint, prefix + f.name + ".")
            continue
        args = typing.get_args(hint)
        optional = type(None) in args
        kind = next(a for a in args if a is not type(None)) if optional else hint
        m = f.metadata
        yield Field(prefix + f.name, kind, optional, f.default, m["flag"], m["help"], m["check"], m["choices"],
                    m["metavar"], m["herald"])


FIELDS = tuple(_leaves(RunSpec))
BY_PATH = {f.path: f for f in FIELDS}
BY_DEST = {f.dest: f for f in FIELDS}
GROUPS = tuple(f.name for f in dataclasses.fields(RunSpec) if f.default_factory is not dataclasses.MISSING)
