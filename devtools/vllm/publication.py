"""Lookahead publication through vLLM's pool API: a page is published only once the tokens its
key covers past it exist (`kvsched.spec.reserve.publishable`).

vLLM 0.33 and 0.34 hash each block together with the `num_hash_lookahead_tokens` (L) tokens after
it, so a block's key exists, and the manager publishes it, one token later than without. A pool
handed a publication its tokens do not yet cover (a hasher or manager that ignores L) would put
a key in the cache that names content nobody has seen; kvsched's pool refuses it with a typed
error and changes nothing, and publishes the same page once the token exists. vLLM's own pool
accepts the early publication, which is what this script shows beside it. 0.32 has no lookahead:
the check runs with L = 0 there (publication as soon as the page is full).

    python publication.py [--json OUT]      (vLLM's venv; from outside the checkout)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

BLOCK = 16


def pool_and_request(pool_class: Any, lookahead: int, hashed_lookahead: int) -> tuple[Any, Any, list[Any]]:
    """A pool with lookahead `lookahead`, a 32-token request whose block hasher covers
    `hashed_lookahead` tokens past each block, and two blocks allocated for it."""
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.request import Request

    hash_fn = get_hash_fn_by_name("sha256")
    kv_cache_utils.init_none_hash(hash_fn)
    extra = {"num_hash_lookahead_tokens": hashed_lookahead} if hashed_lookahead else {}
    hasher = kv_cache_utils.get_request_block_hasher(BLOCK, hash_fn, **extra)
    pool_extra = {"num_hash_lookahead_tokens": lookahead} if lookahead else {}
    pool = pool_class(8, enable_caching=True, hash_block_size=BLOCK, **pool_extra)
    request = Request("r", list(range(1, 2 * BLOCK + 1)), SamplingParams(max_tokens=4), None, block_hasher=hasher)
    return pool, request, pool.get_new_blocks(2)


def check(lookahead: int) -> dict[str, Any]:
    """Raise unless kvsched's pool refuses publishing two full blocks of 32 tokens when their keys
    cover `lookahead` tokens more, publishes them once those exist, and vLLM's pool accepts."""
    from kvsched.integrations.vllm.block_pool import VLLM_BLOCK_POOL, KvschedBlockPool
    from kvsched.spec.errors import InvalidArgument

    result: dict[str, Any] = {"lookahead": lookahead}
    # A hasher that ignores the lookahead: both blocks have keys at 32 tokens.
    pool, request, blocks = pool_and_request(KvschedBlockPool, lookahead, 0)
    before = pool.reserve.to_spec()
    try:
        pool.cache_full_blocks(request, blocks, 0, 2, BLOCK, 0)
    except InvalidArgument as error:
        if lookahead == 0:
            raise AssertionError(f"with no lookahead, two full blocks must publish: {error}") from error
        if pool.reserve.to_spec() != before:
            raise AssertionError("a refused publication changed the reserve") from error
        result["refused_early"] = str(error)
    else:
        if lookahead:
            raise AssertionError("kvsched's pool published a block before the token its key covers existed")
        result["published_full"] = 2
    if lookahead:
        pool.cache_full_blocks(request, blocks, 0, 1, BLOCK, 0)  # the first block's lookahead exists
        request.append_output_token_ids(7)  # the second's now does too
        pool.cache_full_blocks(request, blocks, 1, 2, BLOCK, 0)
        if not all(pool.reserve.is_cached(block.block_id) for block in blocks):
            raise AssertionError("kvsched's pool did not publish the blocks once their lookahead tokens existed")
        result["published_once_covered"] = 2
        stock, stock_request, stock_blocks = pool_and_request(VLLM_BLOCK_POOL, lookahead, 0)
        stock.cache_full_blocks(stock_request, stock_blocks, 0, 2, BLOCK, 0)
        result["vllm_pool_published_early"] = sum(block.block_hash is not None for block in stock_blocks)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    from kvsched.integrations.vllm.names import require_names

    release = require_names()
    lookahead = 0 if release.version == "0.32.0" else 1
    result = {"release": release.version, **check(lookahead)}
    print(f"publication: {result}", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
