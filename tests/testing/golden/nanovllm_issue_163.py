# ghost read: request 1 reads position 2 (context (0, 1, 0)) from page 2, which holds the KV of context (1, 0, 0, 1, 0)
# Found by: kvsched check kvsched.testing.adapters.nanovllm:upstream_manager --seed 0
from kvsched.testing import SafetyMachine
from kvsched.testing.adapters.nanovllm import upstream_manager

machine = SafetyMachine(upstream_manager, pages=4, page_size=2)
machine.submit(1, (0,))
machine.submit(2, (1, 0))
machine.decode(1)
machine.decode(1)
machine.decode(1)
machine.decode(1)
machine.preempt(1)
machine.decode(2)
machine.decode(2)
machine.decode(2)
machine.decode(2)
machine.finish(2)
machine.resume(1)
