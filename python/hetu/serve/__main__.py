"""Command line:

    python -m hetu.serve export --checkpoint DIR --output BUNDLE
    python -m hetu.serve predict BUNDLE (--instances FILE.jsonl | --data-dir DIR --split validate)
                                 --output FILE.npy [--batch-size N]
    python -m hetu.serve run BUNDLE ...            (the HTTP server: hetu.serve.server)

Exit status 0 on success, 2 with one line on standard error for a missing checkpoint, an
unknown model, an op without an ONNX mapping, a bad instance or any other bad input."""
import argparse
import json
import os
import sys

import numpy as np


class UsageError(Exception):
    """One line for standard error, exit status 2."""


def export_command(argv):
    parser = argparse.ArgumentParser(prog="python -m hetu.serve export",
                                     description="Export a checkpoint (with its deltas) to a bundle")
    parser.add_argument("--checkpoint", required=True, metavar="DIR", help="the checkpoint folder (--checkpoint of "
                        "training)")
    parser.add_argument("--output", required=True, metavar="BUNDLE", help="the bundle folder to write (replaced "
                        "whole if it exists)")
    args = parser.parse_args(argv)
    from .export import SCHEMA, export
    try:
        path = export(args.checkpoint, args.output)
    except (FileNotFoundError, ValueError, KeyError) as e:
        raise UsageError(f"export: {str(e).strip(chr(39))}") from None
    with open(os.path.join(path, SCHEMA)) as f:
        version = json.load(f)["version"]
    print(f"exported {args.checkpoint} (version {version}) to {path}")


def read_instances(path):
    instances = []
    try:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    instances.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise UsageError(f"predict: {path}:{number}: not JSON ({e.msg})") from None
    except OSError as e:
        raise UsageError(f"predict: --instances {path}: {e.strerror}") from None
    return instances


def predict_command(argv):
    parser = argparse.ArgumentParser(prog="python -m hetu.serve predict",
                                     description="Probabilities of raw instances or of a dataset's split")
    parser.add_argument("bundle", metavar="BUNDLE", help="a bundle folder (python -m hetu.serve export)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--instances", metavar="FILE.jsonl", help="raw instances, one JSON object a line")
    source.add_argument("--data-dir", metavar="DIR", help="a prepared dataset folder (its samples as encoded)")
    parser.add_argument("--split", choices=("train", "validate"), default="validate")
    parser.add_argument("--output", required=True, metavar="FILE.npy")
    parser.add_argument("--batch-size", type=int, default=4096)
    args = parser.parse_args(argv)
    from .bundle import Bundle, BundleError, InstanceError
    try:
        bundle = Bundle.open(args.bundle)
    except (BundleError, OSError, KeyError) as e:
        raise UsageError(f"predict: {e}") from None
    if not isinstance(bundle, Bundle):
        raise UsageError(f"predict: {args.bundle} is a sequential model's bundle, whose answers are top items, not "
                         f"probabilities: ask it through python -m hetu.serve run")
    try:
        if args.instances:
            instances = read_instances(args.instances)
            parts = [bundle.predict(instances[i:i + args.batch_size])
                     for i in range(0, len(instances), args.batch_size)]
        else:
            from ..data import load_dataset
            try:
                part = getattr(load_dataset(args.data_dir), "val" if args.split == "validate" else "train")
            except (FileNotFoundError, ValueError) as e:
                raise UsageError(f"predict: --data-dir {args.data_dir}: {e}") from None
            parts = [bundle.predict_arrays(None if part.dense is None else part.dense[i:i + args.batch_size],
                                           part.sparse[i:i + args.batch_size])
                     for i in range(0, len(part), args.batch_size)]
    except InstanceError as e:
        raise UsageError(f"predict: {e}") from None
    except (ValueError, IndexError) as e:
        raise UsageError(f"predict: {e}") from None
    predictions = np.concatenate(parts) if parts else np.zeros(0, np.float32)
    tmp = args.output + ".tmp.npy"
    np.save(tmp, predictions.astype(np.float32))
    os.replace(tmp, args.output)
    print(f"{len(predictions)} predictions of {bundle.name} version {bundle.version} written to {args.output}")


def run_command(argv):
    import importlib.util
    if importlib.util.find_spec("hetu.serve.server") is None:
        raise UsageError("run: the HTTP server (hetu.serve.server) is not part of this installation")
    from . import server
    return server.main(argv)


COMMANDS = {"export": export_command, "predict": predict_command, "run": run_command}
HELP = f"""usage: python -m hetu.serve {{{','.join(COMMANDS)}}} ...

Export a checkpoint to a bundle, predict from it offline, or serve it over HTTP (docs/usage.md, "Serving").

verbs:
  export   a checkpoint (with its deltas) -> a bundle folder
  predict  a bundle's probabilities of raw instances or of a dataset's split, to a .npy file
  run      the HTTP server: TensorFlow Serving's REST API over a bundle, or over a training job's checkpoints

python -m hetu.serve VERB --help: the verb's options."""


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(HELP)
        return 0
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m hetu.serve {{{','.join(COMMANDS)}}} ... (--help: the verbs)", file=sys.stderr)
        return 2
    try:
        result = COMMANDS[argv[0]](argv[1:])
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
