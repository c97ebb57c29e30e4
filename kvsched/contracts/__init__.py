"""The CrossHair gate: contracts on the spec's transitions and impl's kernels, and spec/impl pairs.

`python -m kvsched.contracts` (`make contracts`) checks every PEP316 contract in the contract
modules with `crosshair check` and every spec/impl diff pair with `crosshair diffbehavior`, each
with an explicit per-condition timeout and a total time bound, prints a table and exits non-zero
on any counterexample or error. See `kvsched.contracts.gate`.
"""
