"""A run spec as a mapping and as YAML: the groups are sections, the scalars top-level keys
(examples/config/run.yml). Reading a mapping names each unknown key by its path and the file."""
import dataclasses

import yaml

from .spec import BY_PATH, FIELDS, GROUPS, RunSpec
from .validate import Origin


def to_dict(spec):
    """The spec as plain data: its scalars, then its groups as sections."""
    out = {f.path: spec.get(f.path) for f in FIELDS if "." not in f.path}
    for group in GROUPS:
        out[group] = dataclasses.asdict(getattr(spec, group))
    return out


def to_yaml(spec):
    return yaml.safe_dump(to_dict(spec), sort_keys=False, default_flow_style=False)


def coerced(field, value):
    """A number for a float field arrives as an int where it is whole (YAML's 1, JSON's 1); an
    on/off choice unquoted is YAML's true/false."""
    if field.kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if field.kind is str and isinstance(value, bool) and field.choices == ("on", "off"):
        return "on" if value else "off"
    return value


def apply_mapping(spec, data, source, origins):
    """Sets the fields `data` gives on `spec` (their origin: `source`); returns the error lines of
    keys that are not fields and sections that are not mappings (the values' own errors are
    validate()'s)."""
    if not isinstance(data, dict):
        return [f"{source}: must be a mapping of the spec's sections and keys, got {type(data).__name__}"]
    errors = []
    for key, value in data.items():
        if key in GROUPS:
            if not isinstance(value, dict):
                errors.append(f"{key}: must be a section (a mapping of its keys), got {value!r} ({source})")
                continue
            entries = [(f"{key}.{name}", v) for name, v in value.items()]
        else:
            entries = [(str(key), value)]
        for path, v in entries:
            field = BY_PATH.get(path)
            if field is None:
                group = path.rpartition(".")[0]
                takes = [f.path.rpartition(".")[2] for f in FIELDS if f.path.rpartition(".")[0] == group]
                errors.append(f"{path}: unknown key in {source} ({group or 'the top level'} takes "
                              f"{', '.join(takes + (list(GROUPS) if not group else []))})")
                continue
            spec.set(path, coerced(field, v))
            origins[path] = Origin(source=source)
    return errors


def read_file(path, spec, origins):
    """Applies the YAML file at `path` to `spec`; its error lines."""
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except OSError as e:
        return [f"--config {path}: cannot read it ({e.strerror or e})"]
    except yaml.YAMLError as e:
        return [f"--config {path}: not YAML: {' '.join(str(e).split())}"]
    return apply_mapping(spec, {} if data is None else data, path, origins)


def from_dict(data, source="the spec"):
    """A RunSpec of `data` (to_dict's form) over the defaults, with the error lines of its keys."""
    spec, origins = RunSpec(), {}
    return spec, apply_mapping(spec, data, source, origins), origins
