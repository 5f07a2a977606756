-- The event hub's statements (darkroom/api/events.py; migration 0022).

-- name: announce_listener
-- The hub's announce (darkroom_cards_announce): until when it holds, and when it was set.
SELECT until, at FROM darkroom_cards_announce(%(seconds)s);

-- name: running_transactions
-- The transactions running now, to wait on (taken after an announce committed).
SELECT pg_current_snapshot()::text AS snapshot;

-- name: still_running
-- How many of those are still running.
SELECT count(*) AS n
FROM pg_snapshot_xip(%(snapshot)s::pg_snapshot) AS x
WHERE pg_xact_status(x) = 'in progress';
