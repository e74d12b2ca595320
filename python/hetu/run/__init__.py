"""hetu.run: the run spec of a training run (docs/design.md, The run spec). RunSpec holds every
setting of run_hetu.py / run_laia.py grouped by concern; its command-line flags are generated
from it (build_parser, parse), a YAML file holds the same (--config, to_yaml), and validate() is
the one place it is checked."""
from .cli import build_parser, parse
from .defaults import ModelDefaults, flat_record, recommended, resolve, resume_fields, saved_values
from .files import from_dict, read_file, to_dict, to_yaml
from .spec import (BY_DEST, BY_PATH, FIELDS, GROUPS, CheckpointSpec, ClusterSpec, DataSpec, ModelSpec, ModeSpec,
                   OptimizerSpec, OutputSpec, RunSpec, SequenceSpec, TablesSpec, ValidationSpec)
from .validate import SpecError, check, validate


def namespace(spec):
    """The spec as the flat namespace of the flags' names (args.table_cache_mb), for code written
    against the parsed command line; `spec` itself is args.spec."""
    import argparse
    args = argparse.Namespace(**{f.dest: spec.get(f.path) for f in FIELDS})
    args.spec = spec
    return args


def to_flags(spec, herald=False):
    """A command line that parses to `spec` (its fields that differ from the defaults)."""
    flags = []
    for f in FIELDS:
        value = spec.get(f.path)
        if value == f.default or (f.herald and not herald):
            continue
        if f.kind is bool:
            flags.append(f.flag)
        elif value is not None:
            flags += [f.flag, repr(value) if f.kind is float else str(value)]
    return flags
