"""The store's own error: the location named by `--responses-db` cannot be opened."""

from __future__ import annotations

import re


class StoreUnavailable(RuntimeError):
    """Opening the Responses store failed (unreachable or refusing PostgreSQL server, unwritable
    SQLite file). The message names the location, with any password in a URI masked."""

    def __init__(self, location: str, cause: BaseException) -> None:
        super().__init__(f"cannot open the Responses store at {masked(location)}: {cause}")


def masked(location: str) -> str:
    """`location` with the password of a `scheme://user:password@host` URI replaced by ***."""
    return re.sub(r"^([a-z]+://[^:/@]*:)[^@]*@", r"\1***@", location)
