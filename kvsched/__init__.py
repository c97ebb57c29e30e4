"""kvsched: a certified request scheduler and KV-page manager for LLM inference engines.

`kvsched.spec` is the executable reference model, `kvsched.impl` the optimized refinement,
`kvsched.kernels` the decode path, `kvsched.testing` the stateful model-checking harness and
`kvsched.proofs` the machine-checked proofs.
"""

__version__ = "0.1.0"
