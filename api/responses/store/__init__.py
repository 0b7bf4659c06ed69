"""The Responses store: one interface (`interface.py`), two backends (SQLite, the default, and
PostgreSQL, shared by several servers), and `open_store` choosing one from `--responses-db`."""

from api.responses.store.errors import StoreUnavailable
from api.responses.store.interface import ResponsesStore, ServerIdentity, StoreSettings
from api.responses.store.open import open_store
from api.responses.store.record import TERMINAL_STATUSES, UNFINISHED_STATUSES, StoredResponse

__all__ = [
    "ResponsesStore", "ServerIdentity", "StoreSettings", "StoredResponse", "StoreUnavailable",
    "TERMINAL_STATUSES", "UNFINISHED_STATUSES", "open_store",
]
