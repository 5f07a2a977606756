-- The sweeper's statements: orphaned objects, event retention, reconciliation. (The purge
-- of deleted cards is a status transition, so it lives with the protocol in queries.sql.)
-- No statement here holds a lock while the store is called: a batch is taken by moving
-- its rows' next try forward and committing, so several sweepers share the work, a pass
-- interrupted half-way leaves its rows for a later one, and one object that cannot be
-- deleted is retried with backoff without holding up the others.

-- name: sweep_take_orphans
-- Objects no live attempt accounts for: the attempt that wrote them is over (its token
-- holds no lease, and tokens never hold a lease again) and the guard interval has passed.
-- An object that a card references is not an orphan whatever its row says (a repeated
-- commit that went through): it is answered with referenced = true and never deleted.
-- The live attempts' rows (an attempt that tracked its writes anew and was then rescued and
-- leased again cannot be, but a row is never trusted to say so) are passed over in the
-- batch's own scan, not after it, so that they can never fill every batch and stop the
-- sweep.
WITH taken AS (
    UPDATE orphan_objects o
    SET next_try_at = now() + make_interval(secs => %(retry_seconds)s::float8)
    WHERE o.object_key = ANY (ARRAY(
        SELECT x.object_key FROM orphan_objects x
        WHERE x.next_try_at <= now()
          AND x.created_at < now() - make_interval(secs => %(guard_seconds)s::float8)
          AND NOT EXISTS (SELECT 1 FROM archive_files f
                          WHERE f.id = x.file_id AND f.lease_token = x.token)
        ORDER BY x.next_try_at
        LIMIT %(limit)s
        FOR UPDATE OF x SKIP LOCKED))
    RETURNING o.object_key, o.file_id, o.token, o.reason, o.failures, o.created_at
)
SELECT t.*, EXISTS (SELECT 1 FROM archive_files f
                    WHERE f.id = t.file_id
                      AND t.object_key IN (f.derived_key, f.thumb_key)) AS referenced
FROM taken t;

-- name: sweep_unpublished_attempts
-- Attempts whose lease ended unpublished (migration 0020) become rows for the keys they
-- may have written: layout.py's ATTEMPT_KEYS filled in, guarded from when the lease
-- ended. A key that already has a row (tracked by its attempt once its writes returned,
-- maybe while its lease still held, or recorded by a commit that found its lease lost)
-- keeps its row, guarded from the later of the two: a late write may land until a guard
-- interval after the lease ended. Taken by several sweepers at once, each moves rows of
-- its own.
WITH taken AS (
    DELETE FROM unpublished_attempts u
    WHERE u.token = ANY (ARRAY(SELECT token FROM unpublished_attempts
                               ORDER BY ended_at LIMIT %(limit)s
                               FOR UPDATE SKIP LOCKED))
    RETURNING u.token, u.file_id, u.ended_at
)
INSERT INTO orphan_objects (object_key, file_id, token, reason, created_at, next_try_at)
SELECT replace(replace(t, '{file}', a.file_id::text), '{token}', a.token::text),
       a.file_id, a.token, 'attempt', a.ended_at, a.ended_at
FROM taken a CROSS JOIN unnest(%(attempt_keys)s::text[]) AS t
ON CONFLICT (object_key) DO UPDATE
SET created_at = greatest(orphan_objects.created_at, EXCLUDED.created_at),
    next_try_at = greatest(orphan_objects.next_try_at, EXCLUDED.next_try_at);

-- name: sweep_drop_orphan
-- After every version is gone, or kept because a card references it: only the row that
-- was taken. A row tracked anew meanwhile (a late write landed: track_attempt_objects)
-- has another created_at and stays, for a later pass to delete that write.
DELETE FROM orphan_objects WHERE object_key = %(key)s AND created_at = %(created_at)s;

-- name: sweep_orphan_failed
-- One delete failed: try again after a backoff that grows with the failures.
UPDATE orphan_objects
SET failures = failures + 1,
    next_try_at = now() + make_interval(secs => least(%(cap_seconds)s::float8,
                                                      %(base_seconds)s::float8 * 2 ^ failures))
WHERE object_key = %(key)s
RETURNING failures;

-- name: sweep_stuck_orphans
-- Orphans whose delete keeps failing, for the health figures and the log.
SELECT count(*) AS n FROM orphan_objects WHERE failures > 0;

-- name: sweep_prune_events
-- Retention: events of the past are kept for a while, then pruned in batches.
DELETE FROM archive_events
WHERE id IN (SELECT id FROM archive_events
             WHERE created_at < now() - make_interval(secs => %(retention_seconds)s::float8)
             ORDER BY created_at LIMIT %(limit)s);

-- name: sweep_take_turn
-- One sweeper of many runs a periodic unit per interval: the one whose update moves the
-- unit's next run forward. Repeating it after its answer was lost only skips a turn.
INSERT INTO maintenance_schedule AS m (unit, next_run_at)
VALUES (%(unit)s, now() + make_interval(secs => %(interval_seconds)s::float8))
ON CONFLICT (unit) DO UPDATE
SET next_run_at = EXCLUDED.next_run_at
WHERE m.next_run_at <= now()
RETURNING unit;

-- name: reconcile_unaccounted
-- Of a page of listed object versions, those that nothing accounts for: not a card's
-- original (any version while the card is pending or being deleted, else the confirmed
-- one), not a card's published derivative, not a registered orphan (the orphan sweep owns
-- those), not the object of a live attempt. Keys that do not follow the layout come with
-- a NULL file id and are accounted for by nothing.
SELECT o.object_key, o.version
FROM unnest(%(keys)s::text[], %(versions)s::text[], %(file_ids)s::uuid[], %(kinds)s::text[],
            %(tokens)s::uuid[]) AS o(object_key, version, file_id, kind, token)
WHERE NOT EXISTS (
        SELECT 1 FROM archive_files f
        WHERE f.id = o.file_id AND (
            (o.kind = 'original' AND f.original_key = o.object_key
                                 AND (f.status IN ('pending', 'deleting')
                                      OR f.original_version = o.version))
            OR (o.kind = 'derived' AND (f.status = 'deleting'
                                        OR (f.derived_key = o.object_key
                                            AND f.derived_version = o.version)
                                        OR f.lease_token = o.token))
            OR (o.kind = 'thumb' AND (f.status = 'deleting'
                                      OR (f.thumb_key = o.object_key
                                          AND f.thumb_version = o.version)
                                      OR f.lease_token = o.token))))
  AND NOT EXISTS (SELECT 1 FROM orphan_objects x WHERE x.object_key = o.object_key)
  -- An attempt that ended unpublished: its keys are the orphan sweep's, about to be filled
  -- in (sweep_unpublished_attempts).
  AND NOT EXISTS (SELECT 1 FROM unpublished_attempts u WHERE u.token = o.token);

-- name: reconcile_cardless
-- Of the file ids of unaccounted originals, those no card holds at all, and whether the
-- file was deleted or expired (its history still holds that event): an upload that landed
-- after its card was purged is not brought back by a restore.
SELECT o.id,
       EXISTS (SELECT 1 FROM archive_events e
               WHERE e.file_id = o.id AND e.kind IN ('revoked', 'expired')) AS deleted
FROM unnest(%(ids)s::uuid[]) AS o(id)
WHERE NOT EXISTS (SELECT 1 FROM archive_files f WHERE f.id = o.id);

-- name: reconcile_owners
-- Up to two owners that hold API keys: a restore without --owner gives a card to the
-- owner only when there is exactly one.
SELECT DISTINCT owner FROM api_keys ORDER BY owner LIMIT 2;
