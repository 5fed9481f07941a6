"""Replicas behind a router: `tpserve serve --data-parallel-size N` (docs/replicas.md)."""
