-- The sweeper's statements: orphaned objects and event retention. (The purge of deleted
-- cards is a status transition, so it lives with the protocol in queries.sql.) Each
-- pass takes a batch under FOR UPDATE SKIP LOCKED, so several sweepers share the work,
-- and a pass interrupted half-way leaves its rows for the next one.

-- name: sweep_take_orphans
-- Objects no live attempt accounts for: the attempt that wrote them is over (its token
-- holds no lease) and the guard interval has passed.
SELECT o.object_key, o.file_id, o.token, o.reason
FROM orphan_objects o
WHERE o.created_at < now() - make_interval(secs => %(guard_seconds)s::float8)
  AND NOT EXISTS (SELECT 1 FROM archive_files f
                  WHERE f.id = o.file_id AND f.lease_token = o.token)
ORDER BY o.created_at
LIMIT %(limit)s
FOR UPDATE OF o SKIP LOCKED;

-- name: sweep_drop_orphan
DELETE FROM orphan_objects WHERE object_key = %(key)s;

-- name: sweep_prune_events
-- Retention: events of the past are kept for a while, then pruned in batches.
DELETE FROM archive_events
WHERE id IN (SELECT id FROM archive_events
             WHERE created_at < now() - make_interval(secs => %(retention_seconds)s::float8)
             ORDER BY created_at LIMIT %(limit)s);
