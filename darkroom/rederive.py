"""`darkroom rederive`: re-queue ready cards whose derivative was made with other settings.

Each card stores the fingerprint of the derivative settings that made it
(`recipe.settings_fingerprint`). This command compares it with the fingerprint of the
settings it runs with (the workers' environment) and moves the stale cards back to
`queued` as bulk work, a batch at a time, one owner at a time. A card keeps serving its
previous derivative until the worker's fenced commit publishes the new one; the old one
then goes to the sweeper. Running the command again (or after an interruption) takes
only what is still ready and stale, so nothing is queued twice.
"""

from __future__ import annotations

import asyncio
import sys
from typing import IO

from darkroom.config import ConfigError, Settings
from darkroom.db.connection import database_url
from darkroom.db.database import opened
from darkroom.progress import Bar
from darkroom.queue import Queue
from darkroom.reads import Reads
from darkroom.recipe import settings_fingerprint

BATCH = 500  # cards per statement: short transactions, a few row locks at a time
POLL_SECONDS = 1.0


async def run(settings: Settings, *, owner: str | None, everyone: bool, dry_run: bool,
              wait: bool, out: IO[str] | None = None) -> int:
    out = out or sys.stdout
    if owner is None and not everyone:
        raise ConfigError("rederive needs --owner OWNER or --all")
    fingerprint = settings_fingerprint(settings)
    async with opened(database_url(settings), name="rederive") as db:
        queue, reads = Queue.from_settings(db, settings), Reads(db)
        stale = await reads.rederive_owners(fingerprint, owner)
        total = sum(stale.values())
        scope = f"owner {owner}" if owner else "all owners"
        if dry_run:
            for name, n in stale.items():
                print(f"{name:<30} {n:>8}", file=out)
            print(f"{total} ready card(s) of {scope} made with other settings "
                  f"(fingerprint {fingerprint}); dry run, nothing queued", file=out)
            return 0
        queued = 0
        for name in stale:
            while moved := await queue.rederive(name, fingerprint, BATCH):
                queued += moved
        print(f"queued {queued} re-derive(s) of {scope} as bulk work "
              f"(fingerprint {fingerprint})", file=out)
        if wait:
            await _wait(reads, owner, queued)
        return 0


async def _wait(reads: Reads, owner: str | None, queued: int) -> None:
    """A progress bar until no re-derive of the scope is waiting or running."""
    pending = await reads.rederive_pending(owner)
    # Re-derives queued earlier (by another run) count as well: wait for all of them.
    total = max(queued, pending)
    bar = Bar("rederive", total)
    shown = 0
    while True:
        done = min(total - pending, total)
        for _ in range(max(done - shown, 0)):
            bar.advance()
        shown = max(shown, done)
        if pending == 0:
            return
        await asyncio.sleep(POLL_SECONDS)
        pending = await reads.rederive_pending(owner)


def main(settings: Settings, *, owner: str | None, everyone: bool, dry_run: bool,
         wait: bool) -> int:
    return asyncio.run(run(settings, owner=owner, everyone=everyone, dry_run=dry_run,
                           wait=wait))
