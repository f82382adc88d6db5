"""`quail bench`: QUAIL-B-shaped workloads on bundled data, every backend beside a naive baseline."""
