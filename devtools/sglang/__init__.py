"""`make sglang`: SGLang's radix caches and token allocators under the safety harness."""
