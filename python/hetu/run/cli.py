"""The command line of run_hetu.py / run_laia.py, generated from the run spec: one flag per
field (its help, choices and metavar), --config RUN.yml (a spec file; the flags given override
it) and --print-config (the resolved spec as YAML). parse() is what the driver calls."""
import argparse
import sys

from .defaults import catalog as model_catalog, inherit, resolve, resume_conflicts, saved_values
from .files import coerced, read_file, to_yaml
from .spec import BY_PATH, FIELDS, GROUPS, RunSpec
from .validate import Origin, SpecError, has_type, validate

GROUP_TITLES = {"data": "data", "model": "model", "sequence": "sequential models (sasrec, hstu)",
                "optimizer": "optimizer", "tables": "embedding tables", "mode": "distribution and caches",
                "checkpoint": "checkpoints", "validation": "validation and metrics", "cluster": "threads and devices",
                "output": "output"}


def takes(field, herald):
    return herald or not field.herald


def build_parser(catalog=None, herald=False, description=None):
    """The flags of every spec field this driver takes (run_laia.py's: Herald's too). Every flag
    defaults to absent, so that the given ones are known and override --config. `catalog`: the
    model names' defaults (hetu.run.defaults.catalog(), hetu.models')."""
    catalog = model_catalog() if catalog is None else catalog
    p = argparse.ArgumentParser(description=description, argument_default=argparse.SUPPRESS)
    p.add_argument("--config", metavar="RUN.yml", help="read the run spec from this YAML file (its sections: "
                   + ", ".join(GROUPS) + "; docs/usage.md, Configuration); flags given as well override it")
    p.add_argument("--print-config", action="store_true",
                   help="write the resolved run spec (defaults, --config, the flags and the model's defaults) as "
                        "YAML to standard output and exit")
    groups = {"": p}
    for field in FIELDS:
        if not takes(field, herald):
            continue
        group = field.path.rpartition(".")[0]
        if group not in groups:
            groups[group] = p.add_argument_group(GROUP_TITLES[group])
        kwargs = {"dest": field.path, "help": field.help}
        if field.kind is bool:
            kwargs["action"] = "store_true"
        else:
            choices = field.choices_of(catalog)
            kwargs["metavar"] = field.metavar or (
                "{" + ",".join(map(str, choices)) + "}" if choices is not None else field.dest.upper())
        groups[group].add_argument(field.flag, **kwargs)
    return p


def converted(field, text):
    """A flag's text as the field's type; the text itself where it is not one (validate() says so)."""
    if field.kind in (int, float):
        try:
            return coerced(field, field.kind(text))
        except ValueError:
            return text
    return text


def parse(argv, catalog=None, herald=False, description=None, read_checkpoint=None):
    """The run spec of a command line: the defaults, then --config's file, then the flags given;
    with --resume, the checkpoint's model where they leave it unset (`read_checkpoint(folder)`:
    its run record); then the model's defaults (resolve) and the checks (validate). Raises
    SpecError with every error line; --print-config writes the spec and exits 0."""
    catalog = model_catalog() if catalog is None else catalog
    parser = build_parser(catalog, herald, description)
    given = vars(parser.parse_args(argv))
    config, print_config = given.pop("config", None), given.pop("print_config", False)
    spec, origins, errors = RunSpec(), {}, []
    if config is not None:
        errors += read_file(config, spec, origins)
    for path, text in given.items():
        field = BY_PATH[path]
        spec.set(path, True if field.kind is bool else converted(field, text))
        origins[path] = Origin(flag=field.flag, text=None if field.kind is bool else text)
    errors += resume_spec(spec, origins, catalog, read_checkpoint)
    resolve(spec, catalog)
    lines = ["spec error: " + line for line in errors] + validate(spec, catalog, herald, origins)
    if lines:
        raise SpecError(lines)
    if print_config:
        sys.stdout.write(to_yaml(spec))
        sys.stdout.flush()
        raise SystemExit(0)
    return spec


def resume_spec(spec, origins, catalog, read_checkpoint):
    """--resume: the checkpoint's model and sizes where the run leaves them unset, and a line for
    each field the run must share with it but changes."""
    folder = spec.checkpoint.resume
    if not folder or read_checkpoint is None or not isinstance(folder, str):
        return []
    try:
        saved = saved_values(read_checkpoint(folder))
    except (FileNotFoundError, ValueError) as e:
        return [f"checkpoint.resume: --resume {folder}: {e}"]
    for path in inherit(spec, saved, origins):
        origins[path] = Origin(source=f"the checkpoint {folder}")
    resolve(spec, catalog)
    defaults = catalog.get(spec.model.name)
    if defaults is None or not all(has_type(f, spec.get(f.path)) for f in FIELDS):
        return []   # validate() reports the field
    return resume_conflicts(spec, saved, defaults.sequential, folder)
