"""Page tokens for List calls (AIP-158): opaque to clients, stable under inserts.

A token holds the sort key of the last item returned; the next page starts
after it, so items added meanwhile neither shift nor repeat the pages.
"""

from __future__ import annotations

import base64
import heapq
import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from stalwart.errors import ErrorKind, StalwartError

T = TypeVar("T")
DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000


def encode(key: Sequence[Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(key)).encode()).decode()


def decode(token: str) -> list[Any]:
    try:
        key = json.loads(base64.urlsafe_b64decode(token.encode()))
        if not isinstance(key, list):
            raise ValueError
        return key
    except (ValueError, TypeError, RecursionError):  # a forged token nested 5,000 deep
        raise StalwartError(ErrorKind.INVALID_ARGUMENT, "bad page_token") from None


def page(
    items: Iterable[T], key: Callable[[T], list[Any]], size: int, token: str
) -> tuple[list[T], str]:
    """One page of ``items`` sorted by ``key``; returns (page, next token or "").

    Only the page (and one item more, to know whether another follows) is ordered:
    sorting every item for each page made listing 10,000 jobs page by page sort them
    a hundred times."""
    if size < 0:
        raise StalwartError(ErrorKind.INVALID_ARGUMENT, "page_size must be >= 0")
    size = min(size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
    keyed: Iterable[tuple[list[Any], int, T]] = ((key(i), n, i) for n, i in enumerate(items))
    if token:
        after = decode(token)
        keyed = (k for k in keyed if k[0] > after)
    try:
        first = heapq.nsmallest(size + 1, keyed)  # (key, position) never ties: T not compared
    except TypeError:
        raise StalwartError(ErrorKind.INVALID_ARGUMENT, "bad page_token") from None
    chunk = [item for _, _, item in first[:size]]
    more = len(first) > size
    return chunk, encode(first[size - 1][0]) if more else ""
