"""The embedded PostgreSQL: the `pgserver` wheel's server in `$DARKROOM_DATA_DIR/pg`.

Every darkroom process with the same data dir joins the same server (pgserver keeps a
postmaster.pid and a handle list there), so `darkroom up`, `darkroom stats` and
`darkroom migrate` all see one database without any configuration.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

from darkroom.config import ConfigError
from darkroom.storage.local import private_dir


def start(pgdata: Path, *, stop_on_exit: bool = False) -> Any:
    """Start (or join) the server in `pgdata`; answers the pgserver handle."""
    # pgserver logs every step at INFO and warns about XDG_RUNTIME_DIR; neither helps
    # an operator, and its own errors still surface as exceptions.
    logging.getLogger("pgserver").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    import pgserver

    try:
        private_dir(pgdata.parent)  # the data dir: 0700
        return pgserver.get_server(  # type: ignore[attr-defined]
            pgdata, cleanup_mode="stop" if stop_on_exit else None)
    except Exception as exc:  # pgserver raises bare subprocess/assert errors
        raise ConfigError(
            f"embedded PostgreSQL in {pgdata} did not start ({type(exc).__name__}); "
            f"see {pgdata / 'log'}"
        ) from exc


def url(pgdata: Path, *, stop_on_exit: bool = False) -> str:
    return str(start(pgdata, stop_on_exit=stop_on_exit).get_uri())
