"""A prompt's token ids from every form an engine has at hand, and one typed error for the rest."""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np
import pytest

from kvsched.spec import EngineRequest, InvalidArgument
from kvsched.spec.tokens import read_tokens

TOKENS = (0, 7, 2**32 - 1, 65_536)
PACKED = np.array(TOKENS, dtype="<u4").tobytes()


@pytest.mark.parametrize(
    "prompt",
    [
        TOKENS,
        list(TOKENS),
        array("I", TOKENS),
        array("q", TOKENS),
        np.array(TOKENS, dtype=np.uint32),
        np.array(TOKENS, dtype=np.int64),
        np.repeat(np.array(TOKENS, dtype=np.uint32), 2)[::2],  # strided
        PACKED,
        bytearray(PACKED),
        [np.uint32(token) for token in TOKENS],  # not plain ints: the checked loop
    ],
    ids=["tuple", "list", "array-I", "array-q", "u32", "i64", "strided", "bytes", "bytearray", "numpy-scalars"],
)
def test_every_form_reads_as_the_same_tokens(prompt: Any) -> None:
    assert read_tokens(prompt) == (TOKENS, PACKED)
    request = EngineRequest(1, prompt, 1)
    assert request.prompt == TOKENS and request.prompt_bytes == PACKED
    assert all(type(token) is int for token in request.prompt)


def test_a_tuple_of_plain_ints_is_kept_as_it_is() -> None:
    assert read_tokens(TOKENS)[0] is TOKENS  # no second tuple built
    scalars = tuple(np.uint32(token) for token in TOKENS)
    assert read_tokens(scalars)[0] is not scalars  # numpy scalars become plain ints


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ((), "at least one token"),
        (b"", "at least one token"),
        (np.array([], dtype=np.uint32), "at least one token"),
        ((1, -1), "prompt token -1 is outside"),
        ([1, 2**32], "prompt token 4294967296 is outside"),
        (np.array([1, 2**32]), "prompt token 4294967296 is outside"),
        (np.array([-3]), "prompt token -3 is outside"),
        ((1, True), "prompt token"),
        ((1, 2.0), "prompt token"),
        (b"\x00\x01\x02", "not a multiple of 4"),
        (np.zeros((2, 2), dtype=np.uint32), "one-dimensional"),
        (np.array([1.0, 2.0]), "one-dimensional integers"),
        (np.array([1, 2], dtype=">u4"), "native byte order"),
        (np.array([True]), "one-dimensional integers"),
        ("abc", "not str"),
        ({1, 2}, "not set"),
        (None, "not NoneType"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_a_bad_prompt_is_one_typed_error(prompt: Any, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        EngineRequest(1, prompt, 1)
