"""Serving a trained model (docs/design.md section 15): ``export`` turns a checkpoint into a bundle
(hetu.serve.export), ``Bundle.open(path).predict(instances)`` answers from raw instances
(hetu.serve.bundle); the command line is ``python -m hetu.serve export | predict | run``."""
