"""The database: where it is (embedded or configured), its schema, its named queries, and
`Database`, the one way every statement is sent."""

from darkroom.db.connection import database_url
from darkroom.db.database import Database
from darkroom.db.queries import QUERIES

__all__ = ["QUERIES", "Database", "database_url"]
