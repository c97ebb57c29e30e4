"""Status codes the kernels return, and the spec errors they stand for.

A kernel cannot raise a `KvschedError`, so it stops at the first failing step, undoes every
earlier step of the same call, and returns `(code, index, detail)`: what failed, at which input
position, and the page, logical page or count the spec's message names. The Python caller turns
that into exactly the exception, and the message, the spec raises for the same input.
"""

from __future__ import annotations

from typing import Final

from kvsched.spec import refusals
from kvsched.spec.errors import KvschedError

OK: Final = 0
EXHAUSTED: Final = 1  # the free stack is empty
OUT_OF_POOL: Final = 2  # detail: a page id outside the pool
FREE_RETAIN: Final = 3  # detail: a free page someone tried to retain
FREE_WRITE: Final = 4  # detail: a free page a table tried to write
OVERFLOW: Final = 5  # detail: the reference count already at the maximum (the page is the input)
DOUBLE_RELEASE: Final = 6  # detail: a page released at count zero
OUT_OF_TABLE: Final = 7  # detail: a logical page outside the table


def get_error(code: int, detail: int, *, physical_pages: int, logical_pages: int = 0, page: int = 0) -> KvschedError:
    """The spec's exception for a kernel status (`page` names the page of an `OVERFLOW`)."""
    if code == EXHAUSTED:
        return refusals.no_free_page(physical_pages)
    if code == OUT_OF_POOL:
        return refusals.page_out_of_range(detail, physical_pages)
    if code == FREE_RETAIN:
        return refusals.retain_free_page(detail)
    if code == FREE_WRITE:
        return refusals.write_free_page(detail)
    if code == OVERFLOW:
        return refusals.reference_overflow(page, detail)
    if code == DOUBLE_RELEASE:
        return refusals.double_release(detail)
    if code == OUT_OF_TABLE:
        return refusals.logical_page_out_of_range(detail, logical_pages)
    raise AssertionError(f"unknown kernel status {code}")
