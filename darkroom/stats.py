"""Queue health for operators: `darkroom stats` and the API's `/v1/queue`."""

from __future__ import annotations

from typing import Any

from darkroom.config import Settings
from darkroom.db.connection import database_url
from darkroom.db.database import Database, opened
from darkroom.queue import Queue


async def worker_demand(db: Database) -> int:
    """Slots the queue could use now: the figure a worker autoscaler divides by the slots
    of one worker (the `worker_demand` statement; KEDA runs the same text)."""
    row = await db.row("worker_demand")
    assert row is not None  # an aggregate always answers one row
    return int(row["demand"])


async def fetch(settings: Settings) -> dict[str, Any]:
    async with opened(database_url(settings), name="stats") as db:
        stats = await Queue.from_settings(db, settings).stats()
        stats["worker_demand"] = await worker_demand(db)
        return stats


async def set_weight(settings: Settings, owner: str, weight: float) -> None:
    async with opened(database_url(settings), name="owners") as db:
        await Queue.from_settings(db, settings).set_owner_weight(owner, weight)


def _age(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds:.1f} s"


def _share(value: float | None) -> str:
    return "—" if value is None else f"{value:.1%}"


def _scope(p: dict[str, Any]) -> str:
    return ", ".join(x for x in (p["owner"] and f"owner {p['owner']}",
                                 p["priority"] and f"{p['priority']} cards") if x) or "every card"


def _pauses(pauses: list[dict[str, Any]]) -> list[str]:
    """An operator's pauses of claiming (`darkroom pause`), one line each."""
    if not pauses:
        return ["claiming paused        no"]
    return [("claiming paused        " if i == 0 else " " * 23)
            + f"{_scope(p)} (by {p['paused_by']} since {p['since']})"
            for i, p in enumerate(pauses)]


def render(stats: dict[str, Any]) -> str:
    age = stats["oldest_claimable_age_seconds"]
    lines = ["status       cards"]
    lines += [f"{status:<12} {n:>6}" for status, n in stats["counts"].items()]
    lines += [
        "",
        f"oldest claimable job   {'—' if age is None else f'{age:.1f} s'}",
        f"expired leases         {stats['expired_leases']}",
        f"rejected share 1h/24h  {_share(stats['rejected_share_1h'])} / "
        f"{_share(stats['rejected_share_24h'])}",
        f"completed last minute  {stats['completed_last_minute']}",
        f"worker demand (slots)  {stats['worker_demand']}",
        f"lease lost (total)     {stats['lease_lost_total']}",
        "paused workers         " + (", ".join(stats["paused_workers"]) or "none")
        + ("  (object store failing)" if stats["paused_workers"] else ""),
        f"re-derives pending     {stats['rederive_pending']}",
        *_pauses(stats["claim_pauses"]),
        *[f"last {e['kind']:<17} {_scope(e)} by {e['actor']} at {e['at']}"
          for e in stats["claim_pause_log"][:1]],
        *(["rejected by code       " + ", ".join(
            f"{code} {n}" for code, n in stats["rejected_by_code"].items())]
          if stats["rejected_by_code"] else []),
        "",
        "priority     waiting  oldest wait",
    ]
    backlog = stats["backlog"]
    lines += [f"{p:<12} {b['waiting']:>7}  {_age(b['oldest_wait_seconds'])}"
              for p, b in backlog["by_priority"].items()]
    top = backlog["top_owners"]
    lines += ["", f"owners waiting         {backlog['owners_waiting']}"]
    if top:
        lines += [f"{'owner':<24} {'waiting':>7} {'inter.':>7} {'bulk':>7}  oldest wait"]
        lines += [f"{o['owner'][:24]:<24} {o['waiting']:>7} {o['interactive']:>7} "
                  f"{o['bulk']:>7}  {_age(o['oldest_wait_seconds'])}" for o in top]
    return "\n".join(lines)
