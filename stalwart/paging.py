"""Page tokens for List calls (AIP-158): opaque to clients, stable under inserts.

A token holds the sort key of the last item returned; the next page starts
after it, so items added meanwhile neither shift nor repeat the pages.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Sequence
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
    except (ValueError, TypeError):
        raise StalwartError(ErrorKind.INVALID_ARGUMENT, "bad page_token") from None


def page(
    items: Sequence[T], key: Callable[[T], list[Any]], size: int, token: str
) -> tuple[list[T], str]:
    """One page of ``items`` sorted by ``key``; returns (page, next token or "")."""
    if size < 0:
        raise StalwartError(ErrorKind.INVALID_ARGUMENT, "page_size must be >= 0")
    size = min(size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
    ordered = sorted(items, key=key)
    if token:
        after = decode(token)
        try:
            ordered = [i for i in ordered if key(i) > after]
        except TypeError:
            raise StalwartError(ErrorKind.INVALID_ARGUMENT, "bad page_token") from None
    chunk = ordered[:size]
    more = len(ordered) > size
    return chunk, encode(key(chunk[-1])) if more else ""
