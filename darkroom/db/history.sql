-- A card's history for people (GET /v1/files/{id}/events, `darkroom show`) and the
-- console's rejected cards. Reads only.

-- name: file_history
-- One page of a card's events, oldest first, after the event id `after`; each event that
-- ends an attempt carries the attempt's duration (from its claim, by the lease token).
-- The owner sees a card of theirs that is not being deleted; NULL (an admin) any card
-- still stored. No row at all: no such card. A card with no event (yet) answers one row
-- whose id is NULL. The routine events (claimed, ready) are read as file_events reads
-- them (queries.sql), within the card's lifetime through the BRIN time index.
WITH card AS (
    SELECT id, created_at, updated_at FROM archive_files
    WHERE id = %(id)s
      AND (%(owner)s::text IS NULL OR (owner = %(owner)s::text AND status <> 'deleting'))
), events AS (
    SELECT e.id, e.kind, e.attempt, e.token, e.worker, e.error_code, e.created_at
    FROM archive_events e
    WHERE e.file_id = %(id)s AND e.kind NOT IN ('claimed', 'ready')
      AND EXISTS (SELECT 1 FROM card)
    UNION ALL
    SELECT e.id, e.kind, e.attempt, e.token, e.worker, e.error_code, e.created_at
    FROM card c
    JOIN archive_events e
      ON e.file_id = c.id AND e.kind IN ('claimed', 'ready')
     AND e.created_at >= c.created_at AND e.created_at <= c.updated_at
), timed AS (
    SELECT *, CASE WHEN kind <> 'claimed' AND token IS NOT NULL THEN
                  extract(epoch FROM created_at - min(created_at)
                          FILTER (WHERE kind = 'claimed') OVER (PARTITION BY token))::float8
              END AS duration_seconds
    FROM events
), page AS (
    SELECT * FROM timed
    WHERE %(after)s::bigint IS NULL OR id > %(after)s::bigint
    ORDER BY id
    LIMIT %(limit)s
)
SELECT p.id, p.kind, p.attempt, p.worker, p.error_code, p.created_at, p.duration_seconds
FROM card c LEFT JOIN page p ON true
ORDER BY p.id;

-- name: rejected_by_code
-- Rejected cards per error code, through archive_files_rejected (migration 0014).
SELECT error_code AS code, count(*) AS n FROM archive_files
WHERE status = 'rejected'
GROUP BY error_code
ORDER BY n DESC, error_code;

-- name: list_rejected_any_owner
-- The console's view: every owner's rejected cards with one code (or any), newest first,
-- through archive_files_rejected; the cursor as list_files'.
SELECT id, owner, filename, content_type, size_bytes, original_key, original_version,
       original_sha256, status, priority, attempts, error_code, derived_key,
       derived_version, sha256, width, height, derived_bytes, thumb_key, thumb_version,
       thumb_sha256, thumb_width, thumb_height, thumb_bytes, thumbhash, rederive_error,
       created_at, updated_at
FROM archive_files
WHERE status = 'rejected'
  AND (%(code)s::text IS NULL OR error_code = %(code)s::text)
  AND (%(after_created)s::timestamptz IS NULL
       OR (created_at, id) < (%(after_created)s::timestamptz, %(after_id)s::uuid))
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s;

-- name: get_any_file
-- One card whoever owns it, deleting ones too: an operator's `darkroom show`.
SELECT id, owner, filename, content_type, size_bytes, original_key, original_version,
       original_sha256, status, priority, attempts, error_code, derived_key,
       derived_version, sha256, width, height, derived_bytes, thumb_key, thumb_version,
       thumb_sha256, thumb_width, thumb_height, thumb_bytes, thumbhash, rederive_error,
       created_at, updated_at
FROM archive_files WHERE id = %(id)s;
