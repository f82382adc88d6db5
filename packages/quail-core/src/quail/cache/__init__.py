"""The answer store: every model readout stored under (model identity, readout kind, prompt tokens)."""

from quail.cache.access import STORE_ENVIRONMENT, AnswerStoreWarning, store_location
from quail.cache.store import AnswerStore, StoreError, StoreStats

__all__ = ["STORE_ENVIRONMENT", "AnswerStore", "AnswerStoreWarning", "StoreError", "StoreStats", "store_location"]
