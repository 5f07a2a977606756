"""The database: where it is (embedded or configured), its schema, its named queries."""

from darkroom.db.connection import database_url, open_pool
from darkroom.db.queries import QUERIES

__all__ = ["QUERIES", "database_url", "open_pool"]
