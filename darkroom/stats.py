"""Queue health (DESIGN §6): one typed read, `QueueStats`, and its JSON and text forms.

Read by `darkroom stats`, the API's `GET /v1/queue` (and so the page), and `/metrics`.
Each reader takes the fields by name from `QueueStats`; the JSON form (`to_json`) is the
one the API answers and `darkroom stats --json` prints, its names part of the contract.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from darkroom.card import STATUSES, Priority
from darkroom.config import Settings
from darkroom.db.connection import database_url
from darkroom.db.database import Database, opened
from darkroom.pauses import ClaimPause, PauseEvent, claim_pauses, pause_log

__all__ = ["TOP_OWNERS", "Backlog", "OwnerBacklog", "PriorityBacklog", "QueueStats", "cli_json",
           "fetch", "read", "render", "worker_demand"]

# Owners listed by name in the backlog figures (stats, /v1/queue, /metrics): the rest are
# summed, so no figure grows with the number of owners.
TOP_OWNERS = 10


@dataclass(frozen=True, slots=True)
class PriorityBacklog:
    """The queued cards of one priority."""

    waiting: int
    # Of the oldest due card; None when none is due.
    oldest_wait_seconds: float | None


@dataclass(frozen=True, slots=True)
class OwnerBacklog:
    """One of the owners with the most queued cards."""

    owner: str
    waiting: int
    interactive: int
    bulk: int
    oldest_wait_seconds: float | None


@dataclass(frozen=True, slots=True)
class Backlog:
    """Who is waiting: per priority (every priority, 0 when none), and the top owners."""

    by_priority: Mapping[str, PriorityBacklog]
    owners_waiting: int
    top_owners: tuple[OwnerBacklog, ...]


@dataclass(frozen=True, slots=True)
class _Figures:
    """The columns of the `stats` statement, by name."""

    counts: dict[str, int]
    oldest_claimable_age_seconds: float | None
    expired_leases: int
    rejected_share_1h: float | None
    rejected_share_24h: float | None
    completed_last_minute: int
    lease_lost_total: int
    paused_workers: list[str]


@dataclass(frozen=True, slots=True)
class _BacklogRow:
    """The columns of the `backlog` statement, by name (two of them JSON)."""

    by_priority: dict[str, dict[str, Any]]
    owners_waiting: int
    top_owners: list[dict[str, Any]]
    rederive_pending: int


@dataclass(frozen=True, slots=True)
class _RejectedCount:
    code: str
    n: int


@dataclass(frozen=True, slots=True)
class QueueStats:
    """The queue's health at one moment."""

    # Cards per status, every status (0 when none).
    counts: Mapping[str, int]
    # Of the oldest claimable card (due queued, or an expired lease); None: none.
    oldest_claimable_age_seconds: float | None
    expired_leases: int
    # Of the cards finished in the window, the share rejected; None: none finished.
    rejected_share_1h: float | None
    rejected_share_24h: float | None
    completed_last_minute: int
    # lease_lost events in the retained event log (it is pruned: this can go down).
    lease_lost_total: int
    # Workers that stopped claiming because the object store fails them.
    paused_workers: tuple[str, ...]
    backlog: Backlog
    # Re-derives queued or running (the card still serves its previous derivative).
    rederive_pending: int
    # An operator's pauses of claiming in force, and the latest pauses and resumes.
    claim_pauses: tuple[ClaimPause, ...]
    claim_pause_log: tuple[PauseEvent, ...]
    rejected_by_code: Mapping[str, int]

    def to_json(self) -> dict[str, Any]:
        """The JSON object of `GET /v1/queue` and `darkroom stats --json`."""
        return {
            "counts": dict(self.counts),
            "oldest_claimable_age_seconds": self.oldest_claimable_age_seconds,
            "expired_leases": self.expired_leases,
            "rejected_share_1h": self.rejected_share_1h,
            "rejected_share_24h": self.rejected_share_24h,
            "completed_last_minute": self.completed_last_minute,
            "lease_lost_total": self.lease_lost_total,
            "paused_workers": list(self.paused_workers),
            "backlog": {
                "by_priority": {
                    p: {"waiting": b.waiting, "oldest_wait_seconds": b.oldest_wait_seconds}
                    for p, b in self.backlog.by_priority.items()},
                "owners_waiting": self.backlog.owners_waiting,
                "top_owners": [
                    {"owner": o.owner, "waiting": o.waiting, "interactive": o.interactive,
                     "bulk": o.bulk, "oldest_wait_seconds": o.oldest_wait_seconds}
                    for o in self.backlog.top_owners],
            },
            "rederive_pending": self.rederive_pending,
            "claim_pauses": [
                {"owner": p.owner, "priority": p.priority, "paused_by": p.paused_by,
                 "since": p.since.isoformat()} for p in self.claim_pauses],
            "claim_pause_log": [
                {"kind": e.kind, "owner": e.owner, "priority": e.priority,
                 "actor": e.actor, "at": e.created_at.isoformat()}
                for e in self.claim_pause_log],
            "rejected_by_code": dict(self.rejected_by_code),
        }


async def read(db: Database, top: int = TOP_OWNERS) -> QueueStats:
    """The queue's health, from five reads (none of them locks anything)."""
    backlog = (await db.typed("backlog", {"top": top}, _BacklogRow))[0]
    figures = (await db.typed("stats", {}, _Figures))[0]
    pauses = await claim_pauses(db)
    log = await pause_log(db)
    rejected = await db.typed("rejected_by_code", {}, _RejectedCount)
    counts = {status: 0 for status in STATUSES}
    counts.update({k: int(v) for k, v in figures.counts.items()})
    return QueueStats(
        counts=counts,
        oldest_claimable_age_seconds=figures.oldest_claimable_age_seconds,
        expired_leases=int(figures.expired_leases),
        rejected_share_1h=figures.rejected_share_1h,
        rejected_share_24h=figures.rejected_share_24h,
        completed_last_minute=int(figures.completed_last_minute),
        lease_lost_total=int(figures.lease_lost_total),
        paused_workers=tuple(figures.paused_workers),
        backlog=Backlog(
            by_priority={
                p.value: PriorityBacklog(**({"waiting": 0, "oldest_wait_seconds": None}
                                            | backlog.by_priority.get(p.value, {})))
                for p in Priority},
            owners_waiting=int(backlog.owners_waiting),
            top_owners=tuple(OwnerBacklog(**o) for o in backlog.top_owners),
        ),
        rederive_pending=int(backlog.rederive_pending),
        claim_pauses=tuple(pauses),
        claim_pause_log=tuple(log),
        rejected_by_code={r.code: int(r.n) for r in rejected},
    )


async def worker_demand(db: Database) -> int:
    """Slots the queue could use now: the figure a worker autoscaler divides by the slots
    of one worker (the `worker_demand` statement; KEDA runs the same text)."""
    row = await db.row("worker_demand")
    assert row is not None  # an aggregate always answers one row
    return int(row["demand"])


async def fetch(settings: Settings) -> tuple[QueueStats, int]:
    """`darkroom stats`: the queue's health and the worker demand, read directly."""
    async with opened(database_url(settings), name="stats") as db:
        return await read(db), await worker_demand(db)


def cli_json(stats: QueueStats, demand: int) -> dict[str, Any]:
    """`darkroom stats --json`: the API's object and the worker demand."""
    return {**stats.to_json(), "worker_demand": demand}


def _age(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds:.1f} s"


def _share(value: float | None) -> str:
    return "—" if value is None else f"{value:.1%}"


def _scope(owner: str | None, priority: str | None) -> str:
    return ", ".join(x for x in (owner and f"owner {owner}",
                                 priority and f"{priority} cards") if x) or "every card"


def _pauses(pauses: tuple[ClaimPause, ...]) -> list[str]:
    """An operator's pauses of claiming (`darkroom pause`), one line each."""
    if not pauses:
        return ["claiming paused        no"]
    return [("claiming paused        " if i == 0 else " " * 23)
            + f"{_scope(p.owner, p.priority)} (by {p.paused_by} since {p.since.isoformat()})"
            for i, p in enumerate(pauses)]


def render(stats: QueueStats, demand: int) -> str:
    """`darkroom stats`: the health as text for a person."""
    age = stats.oldest_claimable_age_seconds
    lines = ["status       cards"]
    lines += [f"{status:<12} {n:>6}" for status, n in stats.counts.items()]
    lines += [
        "",
        f"oldest claimable job   {'—' if age is None else f'{age:.1f} s'}",
        f"expired leases         {stats.expired_leases}",
        f"rejected share 1h/24h  {_share(stats.rejected_share_1h)} / "
        f"{_share(stats.rejected_share_24h)}",
        f"completed last minute  {stats.completed_last_minute}",
        f"worker demand (slots)  {demand}",
        f"lease lost (total)     {stats.lease_lost_total}",
        "paused workers         " + (", ".join(stats.paused_workers) or "none")
        + ("  (object store failing)" if stats.paused_workers else ""),
        f"re-derives pending     {stats.rederive_pending}",
        *_pauses(stats.claim_pauses),
        *[f"last {e.kind:<17} {_scope(e.owner, e.priority)} by {e.actor} at "
          f"{e.created_at.isoformat()}" for e in stats.claim_pause_log[:1]],
        *(["rejected by code       " + ", ".join(
            f"{code} {n}" for code, n in stats.rejected_by_code.items())]
          if stats.rejected_by_code else []),
        "",
        "priority     waiting  oldest wait",
    ]
    backlog = stats.backlog
    lines += [f"{p:<12} {b.waiting:>7}  {_age(b.oldest_wait_seconds)}"
              for p, b in backlog.by_priority.items()]
    lines += ["", f"owners waiting         {backlog.owners_waiting}"]
    if backlog.top_owners:
        lines += [f"{'owner':<24} {'waiting':>7} {'inter.':>7} {'bulk':>7}  oldest wait"]
        lines += [f"{o.owner[:24]:<24} {o.waiting:>7} {o.interactive:>7} "
                  f"{o.bulk:>7}  {_age(o.oldest_wait_seconds)}" for o in backlog.top_owners]
    return "\n".join(lines)
