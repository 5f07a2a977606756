-- The fair-share statements before migration 0012, kept only as the "previous" baseline
-- of bench/fair.py: the head is the smallest waiting stamp, an owner whose last card was
-- claimed joins there, and bulk work runs only on slots no interactive card wants.
-- Loaded by name with bench/queries.sql (bench/sql.py, as darkroom/db/queries.py loads
-- the product's).

-- name: previous_confirm
-- pending -> queued for exactly this version; the NOTIFY is delivered at COMMIT.
-- A card created with a claimed sha256 moves only when the caller passes the digest it
-- computed from the stored bytes and it is the claimed one: an unverified or lying
-- digest never reaches the queue, and only verified ones enter known_originals.
-- With a stored size, only an upload of exactly the declared size moves the card.
-- The card is stamped with its place in its owner's line (fair share, migration 0008):
-- the owner's clock row is locked, so an owner's concurrent confirms get distinct stamps.
-- A repeated (or refused) confirm moves nothing and stamps nothing.
WITH target AS (
    SELECT id, owner, priority, status, original_version, original_sha256, size_bytes,
           status = 'pending'
           AND (original_sha256 IS NULL OR original_sha256 = %(sha256)s::text)
           AND (%(size)s::bigint IS NULL OR size_bytes = %(size)s::bigint) AS moves
    FROM archive_files
    WHERE id = %(id)s AND owner = %(owner)s AND status <> 'deleting'
    FOR UPDATE
), head AS (
    -- The class's virtual time: the smallest waiting stamp (one probe of the claim index).
    SELECT (SELECT h.fair_stamp FROM archive_files h
             WHERE h.status = 'queued' AND h.priority = t.priority
             ORDER BY h.fair_stamp LIMIT 1) AS v,
           coalesce((SELECT w.weight FROM owner_weights w WHERE w.owner = t.owner), 1) AS w
    FROM target t WHERE t.moves
), stamped AS (
    INSERT INTO owner_clocks AS c (owner, priority, stamp, last_file)
    SELECT t.owner, t.priority, coalesce(h.v, 0), t.id
    FROM target t, head h WHERE t.moves
    ON CONFLICT (owner, priority) DO UPDATE SET
        stamp = coalesce(
            -- The owner's previous card still waits: continue the owner's line. (Pending
            -- here means it was confirmed by a transaction this statement cannot see yet;
            -- a confirmed card never returns to pending.)
            CASE WHEN EXISTS (SELECT 1 FROM archive_files l WHERE l.id = c.last_file
                                AND l.status IN ('pending', 'queued'))
                 THEN c.stamp + 1 / (SELECT w FROM head) END,
            -- Otherwise join the class at its head: past work is neither credit nor debt.
            (SELECT v FROM head),
            -- Nothing waits in the class at all.
            c.stamp + 1 / (SELECT w FROM head)),
        last_file = excluded.last_file
    RETURNING c.stamp
), moved AS (
    UPDATE archive_files f
    SET status = 'queued', original_version = %(version)s, available_at = now(),
        fair_stamp = (SELECT stamp FROM stamped), updated_at = now()
    FROM target t
    WHERE f.id = t.id AND t.moves
    RETURNING f.*
), known AS (
    INSERT INTO known_originals (file_id, owner, sha256)
    SELECT id, owner, original_sha256 FROM moved WHERE original_sha256 IS NOT NULL
    ON CONFLICT (file_id) DO NOTHING
)
-- The card as it is now (when it moved), so the API answers without reading it again.
SELECT m.id, m.owner, m.filename, m.content_type, m.size_bytes, m.original_key,
       m.original_version, m.original_sha256, m.status, m.priority, m.attempts,
       m.error_code, m.derived_key, m.derived_version, m.sha256, m.width, m.height,
       m.derived_bytes, m.thumb_key, m.thumb_version, m.thumb_sha256, m.thumb_width,
       m.thumb_height, m.thumb_bytes, m.thumbhash, m.created_at, m.updated_at,
       t.status AS previous_status, t.original_version AS previous_version,
       t.original_sha256 AS claimed_sha256, t.size_bytes AS declared_size,
       m.id IS NOT NULL AS moved,
       CASE WHEN m.id IS NOT NULL THEN pg_notify('darkroom_jobs', '') END AS notified
FROM target t LEFT JOIN moved m ON m.id = t.id;

-- name: previous_claim
-- Expired leases first (rescue), then due queued rows (interactive, then bulk). A row that has already been
-- started max_attempts times is not started again: it ends rejected/attempts_exhausted.
WITH expired AS (
    SELECT id FROM archive_files
    WHERE status = 'processing' AND lease_until < now()
    ORDER BY lease_until
    LIMIT %(n)s
    FOR UPDATE SKIP LOCKED
), interactive AS (
    -- Then due interactive cards in fair-share stamp order (migration 0008), then bulk
    -- cards with the slots left over. Each is one range of archive_files_due; a LIMIT of
    -- 0 reads nothing.
    SELECT id FROM archive_files
    WHERE status = 'queued' AND priority = 'interactive' AND available_at <= now()
    ORDER BY fair_stamp, available_at
    LIMIT greatest(%(n)s - (SELECT count(*) FROM expired), 0)
    FOR UPDATE SKIP LOCKED
), bulk AS (
    SELECT id FROM archive_files
    WHERE status = 'queued' AND priority = 'bulk' AND available_at <= now()
    ORDER BY fair_stamp, available_at
    LIMIT greatest(%(n)s - (SELECT count(*) FROM expired)
                        - (SELECT count(*) FROM interactive), 0)
    FOR UPDATE SKIP LOCKED
), picked AS (
    SELECT id FROM expired UNION ALL SELECT id FROM interactive UNION ALL SELECT id FROM bulk
), claimed AS (
    UPDATE archive_files f
    SET status       = CASE WHEN f.attempts >= %(max_attempts)s THEN 'rejected' ELSE 'processing' END,
        error_code   = CASE WHEN f.attempts >= %(max_attempts)s THEN 'attempts_exhausted' END,
        attempts     = CASE WHEN f.attempts >= %(max_attempts)s THEN f.attempts ELSE f.attempts + 1 END,
        -- One strong random draw per claim, not per row: the worker draws the claim id,
        -- and a token is that id hashed with the card's id, so it is as unguessable and as
        -- unique (per row and per claim). Since the worker knows the claim id, it can find
        -- what this claim leased when the answer was lost (adopt_claim).
        lease_token  = CASE WHEN f.attempts >= %(max_attempts)s THEN NULL
                            ELSE md5(%(claim)s::text || f.id::text)::uuid END,
        lease_until  = CASE WHEN f.attempts >= %(max_attempts)s THEN NULL
                            ELSE now() + make_interval(secs => %(lease_seconds)s::float8) END,
        lease_owner  = %(worker)s,
        finished_at  = CASE WHEN f.attempts >= %(max_attempts)s THEN now() END,
        updated_at   = now()
    -- An array, not a join: the LIMIT above is an expression, so a join would be planned
    -- from a guess and could scan the whole table when the backlog is large.
    WHERE f.id = ANY (ARRAY(SELECT id FROM picked))
    RETURNING f.id, f.owner, f.status, f.attempts, f.lease_token, f.lease_until,
              f.original_key, f.original_version, f.error_code
), notified AS (
    -- Open pages see the change (GET /v1/events): one notification per statement.
    SELECT darkroom_notify_cards(json_agg(json_build_array(owner, id, status))) AS n
    FROM claimed
), logged AS (
    INSERT INTO archive_events (file_id, kind, attempt, token, worker, error_code)
    SELECT id, CASE WHEN status = 'rejected' THEN 'exhausted' ELSE 'claimed' END,
           attempts, lease_token, %(worker)s, error_code
    -- Joined in a data-modifying CTE, which always runs to completion, so that the
    -- notification is sent whatever the main query reads.
    FROM claimed LEFT JOIN notified ON true
)
-- A Lease, by column name.
SELECT id AS file_id, lease_token AS token, attempts AS attempt, lease_until, owner,
       original_key, original_version
FROM claimed
WHERE status = 'processing';
