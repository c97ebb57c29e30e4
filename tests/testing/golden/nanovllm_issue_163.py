# ghost read: request 1 reads position 0 (context (0,)) from page 0, which holds the KV of context (1, 1, 1, 1, 0)
# Found by: kvsched check kvsched.testing.adapters.nanovllm:upstream_manager --seed 1 --examples 1000
from kvsched.testing import SafetyMachine
from kvsched.testing.adapters.nanovllm import upstream_manager

machine = SafetyMachine(upstream_manager, pages=8, page_size=2)
machine.submit(1, (0, 0))
machine.finish(1)
machine.submit(2, (2, 2, 1, 1, 0, 0, 0))
machine.submit(3, (0,))
machine.submit(1, (1, 1, 1, 1, 0, 0))
machine.finish(1)
machine.submit(1, (0, 0, 1))
