from .db import Store, StoreFull

__all__ = ["Store", "StoreFull"]
