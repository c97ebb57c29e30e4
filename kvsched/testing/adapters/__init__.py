"""Shipped adapters for the safety harness (`kvsched.testing.adapter`): kvsched's own parts
(`kvsched_parts`), nano-vllm's `BlockManager` (`nanovllm`, needs the `nano-vllm-fork`
distribution). Each module's `manager(pages, page_size)` is a `ManagerFactory`."""
