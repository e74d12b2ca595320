"""The formats of raw data that hetu reads: Criteo, Avazu and MovieLens text, schema-described logs."""
