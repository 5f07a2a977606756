"""A way back from `rejected`: `darkroom retry` and `POST /v1/files/{id}/retry`.

After an incident (the store down past every card's attempts, a decoder that timed out on
a slow host) rejected cards are re-queued with a fresh attempt budget. By default only
the codes that say nothing about the file itself (`RETRYABLE_CODES`); `--code` names
others, `--all` takes every rejected card. Only cards still `rejected` are taken, and
each run is fenced by an id of its own, so a run repeated (or repeated after its answer
was lost) queues nothing twice. The command's cards are bulk work; an owner's retry of
one card from the page is interactive, since someone is watching it. An admin's retry of
cards picked in the console (`POST /v1/queue/retry`, any owner's) is bulk work too.
"""

from __future__ import annotations

import asyncio
import functools
import getpass
import sys
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import IO

from darkroom.card import Card, Priority, Status
from darkroom.config import ConfigError, Settings
from darkroom.db.connection import database_url
from darkroom.db.database import CONNECTION_ERRORS, opened
from darkroom.errors import RETRYABLE_CODES, ErrorCode
from darkroom.progress import Bar
from darkroom.queue import Queue
from darkroom.reads import Reads

BATCH = 500  # cards per statement: short transactions, a few row locks at a time
MAX_PICKED = 500  # cards one console retry may name: one page of answers, bounded work
POLL_SECONDS = 1.0


class RetryOutcome(StrEnum):
    QUEUED = "queued"
    NOT_RETRYABLE = "not_retryable"  # not rejected, or rejected for the file's own fault
    NOT_FOUND = "not_found"
    NOT_REJECTED = "not_rejected"  # queued again already (a repeat), processing or ready


@dataclass(frozen=True, slots=True)
class Retried:
    outcome: RetryOutcome
    card: Card | None = None  # QUEUED: the card as it is now


async def retry_card(queue: Queue, file_id: uuid.UUID, owner: str, actor: str) -> Retried:
    """An owner's retry of one of their cards, if it is rejected with a retryable code."""
    moved = await queue.retry(owner, run=uuid.uuid4(), actor=actor, file_id=file_id,
                              codes=sorted(RETRYABLE_CODES), priority=Priority.INTERACTIVE,
                              limit=1)
    card = await Reads(queue.db).get_file(file_id, owner)
    if card is None:  # another owner's, missing, or deleted in between
        return Retried(RetryOutcome.NOT_FOUND)
    if not moved:
        return Retried(RetryOutcome.NOT_RETRYABLE, card)
    return Retried(RetryOutcome.QUEUED, card)


@dataclass(frozen=True, slots=True)
class Picked:
    """What a console retry did with one card it named, and where the card stands now."""

    id: uuid.UUID
    outcome: RetryOutcome
    status: str | None = None  # None: not found


async def retry_picked(queue: Queue, ids: Sequence[uuid.UUID], actor: str) -> list[Picked]:
    """An admin's retry of cards picked in the console, whoever owns them: each rejected
    with a retryable code is queued again as bulk work; the answer says, per id in the
    order given (each once), what became of it. A repeat of the same request (its answer
    lost) finds the cards it queued no longer rejected and answers `not_rejected` with
    their status, queueing nothing twice.

    The picked cards are read once, before the retry: a card it queued is answered as
    queued, any other as it was read. Only a card read as retryable that the retry did not
    take (another request retried or held it in between) is read again, to say where it
    went."""
    if len(ids) > MAX_PICKED:
        raise ValueError(f"at most {MAX_PICKED} cards per retry")
    named = list(dict.fromkeys(ids))
    retryable = {str(c) for c in RETRYABLE_CODES}
    reads = Reads(queue.db)
    read = {t.id: t for t in await reads.retry_targets(named)}
    mine: dict[str, list[uuid.UUID]] = {}
    for t in read.values():
        if t.status == "rejected" and t.error_code in retryable:
            mine.setdefault(t.owner, []).append(t.id)
    run_id = uuid.uuid4()
    moved: set[uuid.UUID] = set()
    # One statement per owner: each card takes its place in its owner's line.
    for owner in sorted(mine):
        moved.update(await queue.retry(owner, run=run_id, actor=actor, ids=mine[owner],
                                       codes=sorted(retryable), limit=len(mine[owner])))
    raced = [i for cards in mine.values() for i in cards if i not in moved]
    if raced:
        again = {t.id: t for t in await reads.retry_targets(raced)}
        for file_id in raced:
            if file_id in again:
                read[file_id] = again[file_id]
            else:
                del read[file_id]  # deleted in between
    answers: list[Picked] = []
    for file_id in named:
        card = read.get(file_id)
        if card is None:
            answers.append(Picked(file_id, RetryOutcome.NOT_FOUND))
        elif file_id in moved:
            answers.append(Picked(file_id, RetryOutcome.QUEUED, str(Status.QUEUED)))
        elif card.status == "rejected":
            answers.append(Picked(file_id, RetryOutcome.NOT_RETRYABLE, card.status))
        else:
            answers.append(Picked(file_id, RetryOutcome.NOT_REJECTED, card.status))
    return answers


def parse_codes(codes: Sequence[str] | None, everyone: bool) -> list[str] | None:
    """The codes to take: the retryable ones by default, any with `--all` (None)."""
    if everyone:
        if codes:
            raise ConfigError("--all takes every code; give either --all or --code")
        return None
    if not codes:
        return sorted(RETRYABLE_CODES)
    known = {str(c) for c in ErrorCode}
    for code in codes:
        if code not in known:
            raise ConfigError(f"--code {code!r} is not an error code (one of "
                              f"{', '.join(sorted(known))})")
    return sorted(set(codes))


def parse_since(text: str | None) -> datetime | None:
    """An ISO 8601 time; without a zone it is UTC."""
    if text is None:
        return None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(f"--since {text!r} is not a time (e.g. 2026-12-03T10:00)") from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def cli_actor() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        user = "unknown"
    return f"cli:{user}"


async def run(settings: Settings, *, owner: str | None, codes: Sequence[str] | None,
              everyone: bool, since: str | None, dry_run: bool, wait: bool,
              out: IO[str] | None = None, run_id: uuid.UUID | None = None) -> int:
    out = out or sys.stdout
    taken = parse_codes(codes, everyone)
    after = parse_since(since)
    scope = (f"owner {owner}" if owner else "all owners") + (
        f", rejected since {after.isoformat()}" if after else "")
    what = "any code" if taken is None else ", ".join(taken)
    async with opened(database_url(settings), name="retry") as db:
        queue = Queue.from_settings(db, settings)
        found = await Reads(db).retry_candidates(owner=owner, codes=taken, since=after)
        if dry_run:
            for (name, code), n in found.items():
                print(f"{name:<30} {code:<22} {n:>8}", file=out)
            print(f"{sum(found.values())} rejected card(s) of {scope} ({what}); dry run, "
                  "nothing queued", file=out)
            return 0
        # One id for the whole run: every statement of it is fenced by it.
        run_id = run_id or uuid.uuid4()
        actor = cli_actor()
        ids: list[uuid.UUID] = []
        for name in sorted({name for name, _ in found}):
            batch = functools.partial(queue.retry, name, run=run_id, actor=actor,
                                      codes=taken, since=after, limit=BATCH)
            heard: list[uuid.UUID] = []
            sent_again = False
            while True:
                moved, repeated = await _fenced(batch)
                sent_again |= repeated
                if not moved:
                    break
                heard += moved
            # A statement sent again may have committed unheard the first time: its cards
            # are this run's all the same, so they are counted (and waited for) from the
            # cards that name the run.
            ids += await Reads(db).retried_by_run(name, run_id) if sent_again else heard
        print(f"queued {len(ids)} retry(s) of {scope} ({what}) as bulk work", file=out)
        if wait:
            await _wait(Reads(db), ids)
        return 0


async def _fenced(call: Callable[[], Awaitable[list[uuid.UUID]]]
                  ) -> tuple[list[uuid.UUID], bool]:
    """One statement of the run, sent again (same run id) if its answer was lost: the
    repeat takes nothing the first one moved, so whether it committed does not matter.
    Answers what the statement heard moved, and whether it was sent again."""
    repeated = False
    for delay in (0.5, 1.0, 2.0):
        try:
            return await call(), repeated
        except CONNECTION_ERRORS:
            repeated = True
            await asyncio.sleep(delay)
    return await call(), True


async def _wait(reads: Reads, ids: list[uuid.UUID]) -> None:
    """A progress bar until every re-queued card is final again."""
    bar = Bar("retry", len(ids))
    shown = 0
    while True:
        waiting = await reads.retry_waiting(ids)
        for _ in range(max(len(ids) - waiting - shown, 0)):
            bar.advance()
        shown = max(shown, len(ids) - waiting)
        if waiting == 0:
            return
        await asyncio.sleep(POLL_SECONDS)


def main(settings: Settings, *, owner: str | None, codes: Sequence[str] | None,
         everyone: bool, since: str | None, dry_run: bool, wait: bool) -> int:
    return asyncio.run(run(settings, owner=owner, codes=codes, everyone=everyone,
                           since=since, dry_run=dry_run, wait=wait))
