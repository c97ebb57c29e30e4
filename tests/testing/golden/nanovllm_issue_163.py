# ghost read: request 1 reads position 2 (context (0, 0, 2)) from page 4, which holds the KV of context (0, 0, 1, 1, 2)
# Found by: kvsched check kvsched.testing.adapters.nanovllm:upstream_manager --seed 2 --examples 1000
from kvsched.testing import SafetyMachine
from kvsched.testing.adapters.nanovllm import upstream_manager

machine = SafetyMachine(upstream_manager, pages=8, page_size=2)
machine.submit(1, (0, 0))
machine.submit(3, (2, 2, 1, 1, 0, 0))
machine.decode(1)
machine.decode(3)
machine.decode(1)
machine.decode(3)
machine.decode(1)
machine.decode(3)
machine.preempt(1)
machine.finish(3)
machine.submit(2, (0, 0, 1, 1, 2, 2))
machine.resume(1)
