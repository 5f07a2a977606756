-- The event hub's statements (darkroom/api/events.py; migration 0022).

-- name: listen_until
-- The hub's announce, held for `seconds` (never shortened: another API process may hold
-- a longer one); `lapsed` when statements may have stopped notifying before it.
WITH before AS (SELECT last_value AS until FROM darkroom_cards_listened_until)
SELECT b.until < extract(epoch FROM now()) AS lapsed,
       setval('darkroom_cards_listened_until',
              greatest(b.until, ceil(extract(epoch FROM now()) + %(seconds)s)::bigint))
           AS until
FROM before b;

-- name: running_transactions
-- The transactions running now, to wait on (taken after listen_until answered).
SELECT pg_current_snapshot()::text AS snapshot;

-- name: still_running
-- How many of those are still running.
SELECT count(*) AS n
FROM pg_snapshot_xip(%(snapshot)s::pg_snapshot) AS x
WHERE pg_xact_status(x) = 'in progress';
