# ghost read: request 1 writes position 2 into page 2, which its cache still serves under key 11686867670160024578, first seen over the KV of context (0, 0, 1, 1, 2): a key that outlives its content
# Found by: kvsched check kvsched.testing.adapters.nanovllm:upstream_manager --seed 0
from kvsched.testing import SafetyMachine
from kvsched.testing.adapters.nanovllm import upstream_manager

machine = SafetyMachine(upstream_manager, pages=4, page_size=2)
machine.submit(3, (0, 0, 1, 1, 2, 2))
machine.finish(3)
machine.submit(1, (2, 2, 0))
