"""darkroom: originals in, WebP derivatives out, coordinated by a PostgreSQL lease queue."""

__version__ = "0.1.0"
