"""hetu: define-then-run dataflow graphs for recommendation models."""
