-- Every statement that reads or changes the queue, by name. darkroom/queue.py is the only
-- caller of the status-changing ones; a card's status is written nowhere else.
-- Lease times are always the database's now(), never a worker's clock.

-- name: create_file
-- Statements that answer cards name the columns of darkroom.card.Card, never `*`.
-- A new card that may carry a claimed sha256 and an idempotency key. The key's row is
-- inserted first: when the owner already used the key (or a concurrent create with it
-- commits first), no card is made and the caller reads the key's card instead.
WITH keyed AS (
    INSERT INTO idempotency_keys (owner, key_hash, request_hash, file_id)
    SELECT %(owner)s, %(key_hash)s::bytea, %(request_hash)s::bytea, %(id)s
    WHERE %(key_hash)s::bytea IS NOT NULL
    ON CONFLICT (owner, key_hash) DO NOTHING
    RETURNING file_id
)
INSERT INTO archive_files (id, owner, filename, content_type, size_bytes, original_key,
                           original_sha256, priority)
SELECT %(id)s, %(owner)s, %(filename)s, %(content_type)s, %(size)s, %(original_key)s,
       %(sha256)s, %(priority)s
WHERE %(key_hash)s::bytea IS NULL OR EXISTS (SELECT 1 FROM keyed)
RETURNING id, owner, filename, content_type, size_bytes, original_key, original_version,
          original_sha256, status, priority, attempts, error_code, derived_key,
          derived_version, sha256, width, height, derived_bytes, thumb_key,
          thumb_version, thumb_sha256, thumb_width, thumb_height, thumb_bytes,
          thumbhash, rederive_error, created_at, updated_at;

-- name: confirm
-- pending -> queued for exactly this version; the NOTIFY is delivered at COMMIT.
-- A card created with a claimed sha256 moves only when the caller passes the digest it
-- computed from the stored bytes and it is the claimed one: an unverified or lying
-- digest never reaches the queue, and only verified ones enter known_originals.
-- With a stored size, only an upload of exactly the declared size moves the card.
-- The card is stamped with its place in its owner's line (fair share, migration 0012).
-- A repeated (or refused) confirm moves nothing and stamps nothing.
WITH target AS (
    SELECT id, owner, priority, status, original_version, original_sha256, size_bytes,
           status = 'pending'
           AND (original_sha256 IS NULL OR original_sha256 = %(sha256)s::text)
           AND (%(size)s::bigint IS NULL OR size_bytes = %(size)s::bigint) AS moves
    FROM archive_files
    WHERE id = %(id)s AND owner = %(owner)s AND status <> 'deleting'
    FOR UPDATE
), clock AS (
    -- The owner's clock, locked before its next value is worked out: PostgreSQL works an
    -- UPDATE's new values out again after a wait for the row only when the other writer
    -- committed a change to it, so one that rolled back (or only locked it) would leave
    -- a stamp from the head seen before the wait. The lock keeps an owner's concurrent
    -- confirms' stamps distinct.
    SELECT c.owner, c.priority FROM owner_clocks c JOIN target t
        ON c.owner = t.owner AND c.priority = t.priority
    WHERE t.moves
    FOR UPDATE OF c
), bumped AS (
    -- Its place in its owner's line: the owner's clock moved on (darkroom_fair_next,
    -- migration 0022, from the head as it stands now that the row is locked).
    UPDATE owner_clocks c
    SET stamp = darkroom_fair_next(c.stamp, c.owner, c.priority), last_file = NULL
    FROM clock k
    WHERE c.owner = k.owner AND c.priority = k.priority
    RETURNING c.stamp
), stamped AS (
    -- An owner's first card in the class makes its clock (darkroom_fair_stamp).
    SELECT coalesce((SELECT stamp FROM bumped), darkroom_fair_stamp(t.owner, t.priority))
               AS stamp
    FROM target t WHERE t.moves
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
       m.thumb_height, m.thumb_bytes, m.thumbhash, m.rederive_error, m.created_at,
       m.updated_at,
       t.status AS previous_status, t.original_version AS previous_version,
       t.original_sha256 AS claimed_sha256, t.size_bytes AS declared_size,
       m.id IS NOT NULL AS moved,
       CASE WHEN m.id IS NOT NULL THEN pg_notify('darkroom_jobs', '') END AS notified
FROM target t LEFT JOIN moved m ON m.id = t.id;

-- name: claim
-- Expired leases first (rescue), then due queued rows: bulk's owed share, interactive, and
-- bulk on the slots left over. A row that has already been started max_attempts times is
-- not started again: it ends rejected/attempts_exhausted, or, a re-derive of a ready
-- photo, ready again with its previous derivative (see fail).
WITH expired AS (
    SELECT id FROM archive_files
    WHERE status = 'processing' AND lease_until < now()
      -- An operator's pause (darkroom_paused_owners, migration 0018) holds rescues back
      -- too: a handful of rows at most, so checked row by row.
      AND owner <> ALL (darkroom_paused_owners(priority))
      -- Nor the leases of the results this claim is sent with (`complete_and_claim`): a
      -- row `publish` left, a re-derive whose lease ran out unclaimed, is `complete`'s.
      AND id <> ALL (%(committing)s::uuid[])
    ORDER BY lease_until
    LIMIT %(n)s
    FOR UPDATE SKIP LOCKED
), clock AS (
    SELECT bulk_credit FROM fair_clock
), slots AS (
    SELECT greatest(%(n)s - (SELECT count(*) FROM expired), 0) AS k
), owed AS (
    -- The whole claims bulk work is owed (DARKROOM_BULK_SHARE of the slots, counted in
    -- fair_clock.bulk_credit): deterministic, so one claim in 1/share goes to bulk while
    -- both classes have work due.
    SELECT least(floor(coalesce((SELECT bulk_credit FROM clock), 0)
                       + s.k * %(bulk_share)s::numeric), s.k)::bigint AS m
    FROM slots s
), bulk_owed AS (
    -- Each part is one range of archive_files_due in fair-share order (migration 0012);
    -- a LIMIT of 0 reads nothing.
    SELECT id, owner, fair_stamp FROM archive_files
    WHERE status = 'queued' AND priority = 'bulk' AND available_at <= now()
      -- Not while paused (darkroom_paused_owners, migration 0018: the whole class, then
      -- an owner's cards; each a scalar subquery, so called once per statement). The
      -- owner is compared as an expression, not as the column: the column's statistics
      -- price `<> ALL` of a list unknown at planning at nearly no rows when a few owners
      -- hold the backlog (one, on a personal server), and the planner would then sort
      -- the whole backlog at every claim instead of reading the index in order.
      AND (SELECT darkroom_paused_owners('bulk')) IS NOT NULL
      AND (owner || '') <> ALL ((SELECT darkroom_paused_owners('bulk'))::text[])
    ORDER BY fair_stamp, owner
    LIMIT (SELECT m FROM owed)
    FOR UPDATE SKIP LOCKED
), interactive AS (
    SELECT id, owner, fair_stamp FROM archive_files
    WHERE status = 'queued' AND priority = 'interactive' AND available_at <= now()
      -- Not while paused (as in bulk_owed).
      AND (SELECT darkroom_paused_owners('interactive')) IS NOT NULL
      AND (owner || '') <> ALL ((SELECT darkroom_paused_owners('interactive'))::text[])
    ORDER BY fair_stamp, owner
    LIMIT greatest((SELECT k FROM slots) - (SELECT count(*) FROM bulk_owed), 0)
    FOR UPDATE SKIP LOCKED
), bulk AS (
    SELECT id, owner, fair_stamp FROM archive_files
    WHERE status = 'queued' AND priority = 'bulk' AND available_at <= now()
      -- Not while paused (as in bulk_owed).
      AND (SELECT darkroom_paused_owners('bulk')) IS NOT NULL
      AND (owner || '') <> ALL ((SELECT darkroom_paused_owners('bulk'))::text[])
      AND id <> ALL (ARRAY(SELECT id FROM bulk_owed))
    ORDER BY fair_stamp, owner
    LIMIT greatest((SELECT k FROM slots) - (SELECT count(*) FROM bulk_owed)
                   - (SELECT count(*) FROM interactive), 0)
    FOR UPDATE SKIP LOCKED
), bulk_all AS (
    SELECT * FROM bulk_owed UNION ALL SELECT * FROM bulk
), picked AS (
    SELECT id FROM expired UNION ALL SELECT id FROM bulk_all UNION ALL SELECT id FROM interactive
), headed AS (
    -- In the same statement as the claim, so a claim that commits with its answer lost
    -- has moved the heads exactly once, and one that never arrived not at all. Each
    -- class's head moves to the last card claimed in it, never back, in this claim's
    -- lane, drawn from its id (migration 0021): claims in other lanes do not wait for
    -- it, and the head is the greatest of the lanes.
    INSERT INTO fair_heads AS h (priority, lane, vtime, vowner)
    SELECT 'interactive', get_byte(uuid_send(%(claim)s::uuid), 15) %% 32, i.fair_stamp, i.owner
    FROM (SELECT fair_stamp, owner FROM interactive
          ORDER BY fair_stamp DESC, owner DESC LIMIT 1) i
    UNION ALL
    SELECT 'bulk', get_byte(uuid_send(%(claim)s::uuid), 15) %% 32, b.fair_stamp, b.owner
    FROM (SELECT fair_stamp, owner FROM bulk_all
          ORDER BY fair_stamp DESC, owner DESC LIMIT 1) b
    ON CONFLICT (priority, lane) DO UPDATE SET vtime = EXCLUDED.vtime, vowner = EXCLUDED.vowner
    WHERE (EXCLUDED.vtime, EXCLUDED.vowner) > (h.vtime, h.vowner)
), credited AS (
    -- Bulk's credit grows by its share of the slots claimed and shrinks by its claims,
    -- while both classes have work due; when bulk runs on idle slots it is owed nothing
    -- more. Written only when it changes, so claims of one class alone never wait for
    -- each other here; while both classes are due it changes at nearly every claim, and
    -- a claim that writes it waits for a concurrent one's commit and adds to what that
    -- left. (Each claim decides what bulk is owed from the credit its snapshot saw, as
    -- before; a claim that finds nothing to change neither waits nor re-reads.)
    UPDATE fair_clock c
    SET bulk_credit = greatest(least(c.bulk_credit + (n.bulk + n.inter) * %(bulk_share)s::numeric
                                     - n.bulk, 1), 0)
    FROM (SELECT (SELECT count(*) FROM bulk_all) AS bulk,
                 (SELECT count(*) FROM interactive) AS inter) n
    WHERE n.bulk + n.inter > 0
      AND (n.bulk > 0 OR EXISTS (SELECT 1 FROM archive_files
                                 WHERE status = 'queued' AND priority = 'bulk'
                                   AND available_at <= now()))
      AND greatest(least(c.bulk_credit + (n.bulk + n.inter) * %(bulk_share)s::numeric
                         - n.bulk, 1), 0) <> c.bulk_credit
), claimed AS (
    UPDATE archive_files f
    SET status       = CASE WHEN f.attempts < %(max_attempts)s THEN 'processing'
                            WHEN f.derived_key IS NOT NULL THEN 'ready' ELSE 'rejected' END,
        error_code   = CASE WHEN f.attempts >= %(max_attempts)s AND f.derived_key IS NULL
                            THEN 'attempts_exhausted' END,
        rederive_error = CASE WHEN f.attempts >= %(max_attempts)s AND f.derived_key IS NOT NULL
                              THEN 'attempts_exhausted' ELSE f.rederive_error END,
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
              f.original_key, f.original_version,
              coalesce(f.error_code, CASE WHEN f.status = 'ready' THEN f.rederive_error END)
                  AS error_code
), notified AS (
    -- Open pages see the change (GET /v1/events): one notification per statement, its
    -- list built only while a page watches (migration 0025).
    SELECT CASE WHEN darkroom_cards_watched() THEN (
        SELECT darkroom_notify_cards(json_agg(json_build_array(owner, id, status)))
        FROM claimed) END AS n
), logged AS (
    INSERT INTO archive_events (file_id, kind, attempt, token, worker, error_code)
    SELECT id, CASE status WHEN 'rejected' THEN 'exhausted' WHEN 'ready' THEN 'rederive_failed'
                           ELSE 'claimed' END,
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

-- name: adopt_claim
-- What a claim leased, for a worker that never heard its answer: the rows whose token is
-- this claim's and which no one has taken over since. Reads only live leases (there are
-- never more than worker slots), through archive_files_leased.
SELECT id AS file_id, lease_token AS token, attempts AS attempt, lease_until, owner,
       original_key, original_version
FROM archive_files
WHERE status = 'processing' AND lease_owner = %(worker)s
  AND lease_token = md5(%(claim)s::text || id::text)::uuid;

-- name: heartbeat
-- Extends every lease still held by its token; answers the ids whose lease is lost.
WITH held AS (
    SELECT * FROM unnest(%(ids)b::uuid[], %(tokens)b::uuid[]) AS h(id, token)
), extended AS (
    UPDATE archive_files f
    SET lease_until = now() + make_interval(secs => %(lease_seconds)s::float8)
    FROM held h
    -- The token is the fence (see complete).
    WHERE f.id = ANY (%(ids)b::uuid[]) AND f.id = h.id AND f.lease_token = h.token
    RETURNING f.id, f.lease_token
), settled AS (
    -- An attempt that already ended by its own statement (a heartbeat racing its
    -- completion) has lost nothing. Read locked, so a completion committing while this
    -- statement runs is seen (the statement's snapshot may predate it); the rows just
    -- extended are left out first (the ARRAY runs `extended` to the end).
    SELECT f.id, f.settled_token FROM archive_files f
    WHERE f.id = ANY (%(ids)b::uuid[]) AND f.id <> ALL (ARRAY(SELECT id FROM extended))
    FOR UPDATE
), lost AS (
    INSERT INTO archive_events (file_id, kind, token, worker)
    SELECT h.id, 'lease_lost', h.token, %(worker)s
    FROM held h
    WHERE NOT EXISTS (SELECT 1 FROM extended e WHERE e.id = h.id AND e.lease_token = h.token)
      AND NOT EXISTS (SELECT 1 FROM settled f WHERE f.id = h.id AND f.settled_token = h.token)
    RETURNING file_id, token
)
SELECT file_id AS id, token FROM lost;

-- name: track_attempt_objects
-- After an attempt that did not publish, once its PUTs returned (or failed: a store may
-- finish a request its client gave up on): its objects are tracked anew, the guard
-- counted from now. A stalled or half-down store can land a write long after the attempt
-- ended, after the sweeper took and dropped its first row; this row finds that object.
INSERT INTO orphan_objects (object_key, file_id, token, reason)
SELECT k, %(id)s, %(token)s, 'attempt' FROM unnest(%(keys)b::text[]) AS k
ON CONFLICT (object_key) DO UPDATE
SET created_at = now(), next_try_at = now(), failures = 0;

-- name: publish
-- The fenced commit's common case, batched: a row publishes only if its own token still
-- holds the lease and its card shows no derivative yet (a first derivation). Every other
-- row (a lost lease, a repeat of a commit that went through, a re-derive replacing a
-- derivative) is left as it is, and the caller sends `complete` for the rows this did
-- not publish, which settles each of those cases. Kept apart because a statement's
-- every part is set up at each execution whether it finds rows or not: on a fleet's
-- cold connections `complete`'s parts for the rare cases cost about a tenth of the
-- database's CPU per image (docs/BENCHMARKS.md, Fleet).
WITH done AS (
    SELECT * FROM unnest(%(ids)b::uuid[], %(tokens)b::uuid[], %(keys)b::text[],
                         %(versions)b::text[], %(sha256s)b::text[], %(widths)b::int[],
                         %(heights)b::int[], %(sizes)b::bigint[],
                         %(thumb_keys)b::text[], %(thumb_versions)b::text[],
                         %(thumb_sha256s)b::text[], %(thumb_widths)b::int[],
                         %(thumb_heights)b::int[], %(thumb_sizes)b::bigint[],
                         %(thumbhashes)b::text[])
        AS d(id, token, derived_key, derived_version, sha256, width, height, derived_bytes,
             thumb_key, thumb_version, thumb_sha256, thumb_width, thumb_height, thumb_bytes,
             thumbhash)
), published AS (
    -- As `complete` publishes (its SET, its fence).
    UPDATE archive_files f
    SET status = 'ready', derived_key = d.derived_key, derived_version = d.derived_version,
        sha256 = d.sha256, width = d.width, height = d.height,
        derived_bytes = d.derived_bytes, error_code = NULL, settled_token = d.token,
        thumb_key = d.thumb_key, thumb_version = d.thumb_version,
        thumb_sha256 = d.thumb_sha256, thumb_width = d.thumb_width,
        thumb_height = d.thumb_height, thumb_bytes = d.thumb_bytes, thumbhash = d.thumbhash,
        derive_fingerprint = %(fingerprint)s::text, rederive_error = NULL,
        lease_token = NULL, lease_until = NULL, finished_at = now(), updated_at = now()
    FROM done d
    -- Nothing to supersede: the previous derivative of a re-derive is `complete`'s to
    -- hand to the sweeper.
    WHERE f.id = ANY (%(ids)b::uuid[]) AND f.id = d.id AND f.lease_token = d.token
      AND f.derived_key IS NULL AND f.thumb_key IS NULL
    RETURNING f.id, f.attempts, d.token, f.owner
), notified AS (
    SELECT CASE WHEN darkroom_cards_watched() THEN (
        SELECT darkroom_notify_cards(json_agg(json_build_array(owner, id, 'ready')))
        FROM published) END AS n
), ready_events AS (
    INSERT INTO archive_events (file_id, kind, attempt, token, worker)
    SELECT id, 'ready', attempts, token, %(worker)s
    FROM published LEFT JOIN notified ON true  -- see claim
)
SELECT token FROM published;

-- name: complete
-- The fenced commit, batched, whole: each row publishes only if its own token still
-- holds the lease. The others record lease_lost and leave their object to the sweeper.
-- Sent for the rows `publish` did not publish.
WITH done AS (
    SELECT * FROM unnest(%(ids)b::uuid[], %(tokens)b::uuid[], %(keys)b::text[],
                         %(versions)b::text[], %(sha256s)b::text[], %(widths)b::int[],
                         %(heights)b::int[], %(sizes)b::bigint[],
                         -- The thumb and the thumbhash: published with the preview.
                         %(thumb_keys)b::text[], %(thumb_versions)b::text[],
                         %(thumb_sha256s)b::text[], %(thumb_widths)b::int[],
                         %(thumb_heights)b::int[], %(thumb_sizes)b::bigint[],
                         %(thumbhashes)b::text[])
        AS d(id, token, derived_key, derived_version, sha256, width, height, derived_bytes,
             thumb_key, thumb_version, thumb_sha256, thumb_width, thumb_height, thumb_bytes,
             thumbhash)
), published AS (
    UPDATE archive_files f
    SET status = 'ready', derived_key = d.derived_key, derived_version = d.derived_version,
        sha256 = d.sha256, width = d.width, height = d.height,
        derived_bytes = d.derived_bytes, error_code = NULL, settled_token = d.token,
        thumb_key = d.thumb_key, thumb_version = d.thumb_version,
        thumb_sha256 = d.thumb_sha256, thumb_width = d.thumb_width,
        thumb_height = d.thumb_height, thumb_bytes = d.thumb_bytes, thumbhash = d.thumbhash,
        derive_fingerprint = %(fingerprint)s::text, rederive_error = NULL,
        lease_token = NULL, lease_until = NULL, finished_at = now(), updated_at = now()
    FROM done d
    -- The token is the fence: CHECK card_states (migration 0023) makes a matching token imply
    -- status = 'processing'. Saying so again here would steer the planner to the partial
    -- index of every live lease instead of the primary key.
    WHERE f.id = ANY (%(ids)b::uuid[]) AND f.id = d.id AND f.lease_token = d.token
    -- A re-derive replaces a derivative: the statement's snapshot still holds the
    -- card's previous keys, which stayed readable until this very commit.
    RETURNING f.id, f.attempts, d.token, d.derived_key, d.thumb_key, f.owner,
              (SELECT o.derived_key FROM archive_files o WHERE o.id = f.id) AS previous_key,
              (SELECT o.thumb_key FROM archive_files o WHERE o.id = f.id) AS previous_thumb
), notified AS (
    SELECT CASE WHEN darkroom_cards_watched() THEN (
        SELECT darkroom_notify_cards(json_agg(json_build_array(owner, id, 'ready')))
        FROM published) END AS n
), ready_events AS (
    INSERT INTO archive_events (file_id, kind, attempt, token, worker)
    SELECT id, 'ready', attempts, token, %(worker)s
    FROM published LEFT JOIN notified ON true  -- see claim
), superseded AS (
    -- The replaced derivative is left to the sweeper (after its guard interval, so a
    -- reader who just got its URL is not cut off). Not on a repeat of this commit. A row
    -- the key already has (its attempt tracked it anew after a commit it never heard
    -- back from) is made new: its guard counts from now, and a sweeper pass that took
    -- the old row, and kept the object a card referenced, does not drop this one.
    INSERT INTO orphan_objects (object_key, file_id, token, reason)
    SELECT previous_key, id, token, 'superseded' FROM published
    WHERE previous_key IS NOT NULL AND previous_key <> derived_key
    UNION ALL
    SELECT previous_thumb, id, token, 'superseded' FROM published
    WHERE previous_thumb IS NOT NULL AND previous_thumb IS DISTINCT FROM thumb_key
    ON CONFLICT (object_key) DO UPDATE
    SET reason = 'superseded', token = EXCLUDED.token, created_at = now(),
        next_try_at = now(), failures = 0
), unpublished AS (
    -- The rows not published just above, read locked: so a commit of the same attempt
    -- that is still finishing (its sender already saw an error) is waited for and seen,
    -- though this statement's snapshot predates it. The ARRAY runs `published` to the
    -- end first, so the rows it changed are left out, and nothing is locked when every
    -- row was published.
    SELECT f.id, f.derived_key FROM archive_files f
    WHERE f.id = ANY (%(ids)b::uuid[]) AND f.id <> ALL (ARRAY(SELECT id FROM published))
    FOR UPDATE
), lost AS (
    SELECT d.* FROM done d
    WHERE NOT EXISTS (SELECT 1 FROM published p WHERE p.id = d.id AND p.token = d.token)
      -- A repeat of a commit that went through (its answer was lost): the card already
      -- shows this attempt's key, which no other attempt can write. That is success, and
      -- its object is the card's, never an orphan.
      AND NOT EXISTS (SELECT 1 FROM unpublished f
                      WHERE f.id = d.id AND f.derived_key = d.derived_key)
), lost_events AS (
    INSERT INTO archive_events (file_id, kind, token, worker)
    SELECT id, 'lease_lost', token, %(worker)s FROM lost
), orphaned AS (
    INSERT INTO orphan_objects (object_key, file_id, token, reason)
    SELECT derived_key, id, token, 'lease_lost' FROM lost
    UNION ALL
    SELECT thumb_key, id, token, 'lease_lost' FROM lost WHERE thumb_key IS NOT NULL
    ON CONFLICT (object_key) DO UPDATE SET reason = 'lease_lost', created_at = now()
)
SELECT id, token FROM lost;

-- name: fail
-- Transient errors requeue with a backoff until max_attempts; anything else, or the last
-- attempt, ends rejected. A re-derive of a ready photo that fails for good does not reject
-- it: the photo goes back to ready with its previous derivative and fingerprint (so the
-- next `darkroom rederive` takes it again), the code kept in rederive_error.
-- Zero rows: the lease was already lost.
WITH target AS (
    -- The card, locked first: the token is the fence (see complete), checked again on the
    -- row as it is once locked.
    SELECT f.id, f.owner, f.priority, f.attempts FROM archive_files f
    WHERE f.id = %(id)s AND f.lease_token = %(token)s AND f.status = 'processing'
    FOR UPDATE
), stamped AS (
    -- Queued again: a new place in its owner's line, by the rule of every stamp, taken
    -- once the card is locked (so by the head as it is then, and only if it moves).
    SELECT t.id, CASE WHEN %(transient)s AND t.attempts < %(max_attempts)s
                      THEN darkroom_fair_stamp(t.owner, t.priority) END AS stamp
    FROM target t
), failed AS (
    UPDATE archive_files f
    SET status = CASE WHEN %(transient)s AND f.attempts < %(max_attempts)s THEN 'queued'
                      WHEN f.derived_key IS NOT NULL THEN 'ready' ELSE 'rejected' END,
        error_code = CASE WHEN (%(transient)s AND f.attempts < %(max_attempts)s)
                               OR f.derived_key IS NOT NULL
                          THEN NULL ELSE %(error_code)s END,
        rederive_error = CASE WHEN (%(transient)s AND f.attempts < %(max_attempts)s)
                                   OR f.derived_key IS NULL
                              THEN f.rederive_error ELSE %(error_code)s END,
        available_at = now() + make_interval(secs => %(delay)s::float8),
        finished_at = CASE WHEN %(transient)s AND f.attempts < %(max_attempts)s
                           THEN NULL ELSE now() END,
        fair_stamp = coalesce(s.stamp, f.fair_stamp),
        lease_token = NULL, lease_until = NULL, settled_token = %(token)s, updated_at = now()
    FROM stamped s
    WHERE f.id = %(id)s AND f.id = s.id
    RETURNING f.id, f.status, f.attempts, f.owner
), notified AS (
    SELECT CASE WHEN darkroom_cards_watched() THEN (
        SELECT darkroom_notify_cards(json_agg(json_build_array(owner, id, status)))
        FROM failed) END AS n
), current AS (
    -- Read locked, only when the update above changed nothing (see complete).
    SELECT f.status, f.settled_token FROM archive_files f
    WHERE f.id = %(id)s AND NOT EXISTS (SELECT 1 FROM failed)
    FOR UPDATE
), recorded AS (
    -- This same failure recorded before, whose answer was lost: the event it wrote (each
    -- carries its token) says what it did, whatever happened to the card since (another
    -- attempt settled it, an operator's retry re-queued it).
    SELECT CASE e.kind WHEN 'retry_scheduled' THEN 'queued' WHEN 'rederive_failed'
                       THEN 'ready' ELSE 'rejected' END AS status
    FROM archive_events e
    WHERE EXISTS (SELECT 1 FROM current) AND e.file_id = %(id)s AND e.token = %(token)s
      AND e.kind IN ('retry_scheduled', 'rederive_failed', 'exhausted', 'rejected')
      AND e.kind NOT IN ('claimed', 'ready')  -- archive_events_file's predicate
    ORDER BY e.id DESC LIMIT 1
), repeated AS (
    -- The attempt already ended by its own statement: this same failure (above), or its
    -- own commit, which a timeout raced. Answer what it did; nothing was lost.
    SELECT status FROM recorded
    UNION ALL
    SELECT CASE WHEN f.status IN ('rejected', 'ready') THEN f.status ELSE 'queued' END
    FROM current f
    WHERE f.settled_token = %(token)s AND NOT EXISTS (SELECT 1 FROM recorded)
), logged AS (
    INSERT INTO archive_events (file_id, kind, attempt, token, worker, error_code)
    SELECT id,
           CASE WHEN status = 'queued' THEN 'retry_scheduled'
                WHEN status = 'ready' THEN 'rederive_failed'
                WHEN %(transient)s THEN 'exhausted' ELSE 'rejected' END,
           attempts, %(token)s, %(worker)s, %(error_code)s
    FROM failed LEFT JOIN notified ON true  -- see claim
    UNION ALL
    SELECT %(id)s, 'lease_lost', NULL, %(token)s, %(worker)s, %(error_code)s
    WHERE NOT EXISTS (SELECT 1 FROM failed) AND NOT EXISTS (SELECT 1 FROM repeated)
)
SELECT status FROM failed
UNION ALL
SELECT status FROM repeated;

-- name: defer
-- The object store failed, not the file: back to queued after a delay, and the attempt is
-- given back, so an outage of the store spends no file's attempts. Repeats are recognized
-- by the settled token, like fail's.
WITH target AS (
    -- The card, locked first, fenced and stamped as in fail.
    SELECT f.id, f.owner, f.priority FROM archive_files f
    WHERE f.id = %(id)s AND f.lease_token = %(token)s
    FOR UPDATE
), stamped AS (
    SELECT t.id, darkroom_fair_stamp(t.owner, t.priority) AS stamp FROM target t
), deferred AS (
    UPDATE archive_files f
    SET status = 'queued', attempts = f.attempts - 1,
        available_at = now() + make_interval(secs => %(delay)s::float8),
        fair_stamp = s.stamp,
        lease_token = NULL, lease_until = NULL, settled_token = %(token)s, updated_at = now()
    FROM stamped s
    WHERE f.id = %(id)s AND f.id = s.id
    RETURNING f.id, f.attempts, f.owner
), notified AS (
    SELECT CASE WHEN darkroom_cards_watched() THEN (
        SELECT darkroom_notify_cards(json_agg(json_build_array(owner, id, 'queued')))
        FROM deferred) END AS n
), current AS (
    -- Read locked, only when the update above changed nothing (see complete).
    SELECT f.id, f.status, f.settled_token FROM archive_files f
    WHERE f.id = %(id)s AND NOT EXISTS (SELECT 1 FROM deferred)
    FOR UPDATE
), repeated AS (
    SELECT f.id FROM current f
    WHERE (f.settled_token = %(token)s AND f.status NOT IN ('ready', 'rejected'))
       -- Another attempt settled the card since (see fail): this deferral's event.
       OR (f.settled_token IS DISTINCT FROM %(token)s AND EXISTS (
               SELECT 1 FROM archive_events e
               WHERE e.file_id = %(id)s AND e.token = %(token)s AND e.kind = 'deferred'
                 AND e.kind NOT IN ('claimed', 'ready')))
), logged AS (
    INSERT INTO archive_events (file_id, kind, attempt, token, worker, error_code)
    SELECT id, 'deferred', attempts, %(token)s, %(worker)s, %(error_code)s
    FROM deferred LEFT JOIN notified ON true  -- see claim
    UNION ALL
    SELECT %(id)s, 'lease_lost', NULL, %(token)s, %(worker)s, %(error_code)s
    WHERE NOT EXISTS (SELECT 1 FROM deferred) AND NOT EXISTS (SELECT 1 FROM repeated)
)
SELECT id FROM deferred
UNION ALL
SELECT id FROM repeated;

-- name: defer_counted
-- A store error while the store served other files between this file's tries: handed
-- back like defer, its attempt given back, but the deferral is counted on the card, and
-- the max_deferrals-th ends it rejected with the store's code (event 'exhausted'), or a
-- re-derive of a ready photo ready again, as fail does (event 'rederive_failed'). Its
-- backoff doubles with the count (jittered by %(jitter)s in [0, 1]). Repeats are
-- recognized by the settled token, like fail's.
WITH target AS (
    -- The card, locked first, fenced and stamped as in fail.
    SELECT f.id, f.owner, f.priority, f.deferrals FROM archive_files f
    WHERE f.id = %(id)s AND f.lease_token = %(token)s AND f.status = 'processing'
    FOR UPDATE
), stamped AS (
    -- Queued again: stamped like any card that becomes claimable (fair share).
    SELECT t.id, CASE WHEN t.deferrals + 1 < %(max_deferrals)s
                      THEN darkroom_fair_stamp(t.owner, t.priority) END AS stamp
    FROM target t
), deferred AS (
    UPDATE archive_files f
    SET deferrals = f.deferrals + 1,
        status = CASE WHEN f.deferrals + 1 < %(max_deferrals)s THEN 'queued'
                      WHEN f.derived_key IS NOT NULL THEN 'ready' ELSE 'rejected' END,
        error_code = CASE WHEN f.deferrals + 1 < %(max_deferrals)s OR f.derived_key IS NOT NULL
                          THEN NULL ELSE %(error_code)s END,
        rederive_error = CASE WHEN f.deferrals + 1 >= %(max_deferrals)s
                                   AND f.derived_key IS NOT NULL
                              THEN %(error_code)s ELSE f.rederive_error END,
        attempts = CASE WHEN f.deferrals + 1 < %(max_deferrals)s THEN f.attempts - 1
                        ELSE f.attempts END,
        available_at = now() + make_interval(secs => %(jitter)s::float8 * least(
            %(cap)s::float8, %(base)s::float8 * power(2, least(f.deferrals, 60)))),
        finished_at = CASE WHEN f.deferrals + 1 < %(max_deferrals)s THEN NULL ELSE now() END,
        fair_stamp = coalesce(s.stamp, f.fair_stamp),
        lease_token = NULL, lease_until = NULL, settled_token = %(token)s, updated_at = now()
    FROM stamped s
    WHERE f.id = %(id)s AND f.id = s.id
    RETURNING f.id, f.status, f.attempts, f.deferrals, f.owner
), notified AS (
    SELECT CASE WHEN darkroom_cards_watched() THEN (
        SELECT darkroom_notify_cards(json_agg(json_build_array(owner, id, status)))
        FROM deferred) END AS n
), current AS (
    -- Read locked, only when the update above changed nothing (see complete).
    SELECT f.status, f.deferrals, f.settled_token FROM archive_files f
    WHERE f.id = %(id)s AND NOT EXISTS (SELECT 1 FROM deferred)
    FOR UPDATE
), recorded AS (
    -- The same deferral recorded before, whose answer was lost: its event (see fail).
    SELECT CASE e.kind WHEN 'deferred_counted' THEN 'queued' WHEN 'rederive_failed'
                       THEN 'ready' ELSE 'rejected' END AS status
    FROM archive_events e
    WHERE EXISTS (SELECT 1 FROM current) AND e.file_id = %(id)s AND e.token = %(token)s
      AND e.kind IN ('deferred_counted', 'rederive_failed', 'exhausted')
      AND e.kind NOT IN ('claimed', 'ready')
    ORDER BY e.id DESC LIMIT 1
), repeated AS (
    -- Answer what it did (the count of deferrals as the card has it now).
    SELECT r.status, f.deferrals FROM recorded r, current f
    UNION ALL
    SELECT CASE WHEN f.status IN ('rejected', 'ready') THEN f.status ELSE 'queued' END,
           f.deferrals
    FROM current f
    WHERE f.settled_token = %(token)s AND NOT EXISTS (SELECT 1 FROM recorded)
), logged AS (
    INSERT INTO archive_events (file_id, kind, attempt, token, worker, error_code)
    SELECT id, CASE status WHEN 'queued' THEN 'deferred_counted'
                           WHEN 'ready' THEN 'rederive_failed' ELSE 'exhausted' END,
           attempts, %(token)s, %(worker)s, %(error_code)s
    FROM deferred LEFT JOIN notified ON true  -- see claim
    UNION ALL
    SELECT %(id)s, 'lease_lost', NULL, %(token)s, %(worker)s, %(error_code)s
    WHERE NOT EXISTS (SELECT 1 FROM deferred) AND NOT EXISTS (SELECT 1 FROM repeated)
)
SELECT status, deferrals FROM deferred
UNION ALL
SELECT status, deferrals FROM repeated;

-- name: release
-- Graceful hand-back: queued and due now, so no one waits for the lease to run out.
-- The attempt still counts (a file is never started more than max_attempts times), but for
-- the leases the worker never started (`unstarted`: kept ahead of a slot): a card handed
-- back unstarted at every stop of a rolling deploy must not run out of attempts.
WITH held AS (
    -- A lease named twice is one card, stamped once.
    SELECT DISTINCT * FROM unnest(%(ids)b::uuid[], %(tokens)b::uuid[]) AS h(id, token)
), target AS (
    -- The cards it moves, locked first: the token is the fence (see complete), checked
    -- again on the row as it is once locked.
    SELECT f.id, f.owner, f.priority, h.token FROM archive_files f JOIN held h ON f.id = h.id
    WHERE f.id = ANY (%(ids)b::uuid[]) AND f.lease_token = h.token
    ORDER BY f.id
    FOR UPDATE OF f
), stamped AS (
    -- Their places in their owners' lines (darkroom_fair_stamp), once they are locked,
    -- one stamp per card, the owners' clocks taken in one order: a hand-back that waited
    -- stamps by the head it finds then, and two workers' hand-backs of cards of the same
    -- owners never wait for each other's clocks in a circle.
    SELECT t.id, t.token, darkroom_fair_stamp(t.owner, t.priority) AS stamp
    FROM (SELECT * FROM target ORDER BY owner, priority, id) t
), released AS (
    UPDATE archive_files f
    SET status = 'queued', available_at = now(), lease_token = NULL, lease_until = NULL,
        fair_stamp = s.stamp,
        attempts = f.attempts - (s.token = ANY (%(unstarted)b::uuid[]))::int,
        settled_token = s.token, updated_at = now()
    FROM stamped s
    WHERE f.id = ANY (ARRAY(SELECT id FROM stamped)) AND f.id = s.id
    RETURNING f.id, f.attempts, s.token, f.owner
), shown AS (
    SELECT CASE WHEN darkroom_cards_watched() THEN (
        SELECT darkroom_notify_cards(json_agg(json_build_array(owner, id, 'queued')))
        FROM released) END AS n
), logged AS (
    INSERT INTO archive_events (file_id, kind, attempt, token, worker)
    SELECT id, 'released', attempts, token, %(worker)s
    FROM released LEFT JOIN shown ON true  -- see claim
), current AS (
    -- Read locked, only the rows not released just above (see complete).
    SELECT f.id, f.status, f.settled_token FROM archive_files f
    WHERE f.id = ANY (%(ids)b::uuid[]) AND f.id <> ALL (ARRAY(SELECT id FROM released))
    FOR UPDATE
)
SELECT r.id, pg_notify('darkroom_jobs', '') IS NULL AS notified FROM released r
UNION ALL
-- A hand-back repeated after it went through.
SELECT f.id, false FROM current f JOIN held h ON f.id = h.id
WHERE (f.settled_token = h.token AND f.status NOT IN ('ready', 'rejected'))
   -- Another attempt settled the card since (see fail): this hand-back's event.
   OR (f.settled_token IS DISTINCT FROM h.token AND EXISTS (
           SELECT 1 FROM archive_events e
           WHERE e.file_id = f.id AND e.token = h.token AND e.kind = 'released'
             AND e.kind NOT IN ('claimed', 'ready')));

-- name: revoke
-- Delete: the card goes to deleting and its lease is revoked, so no attempt can publish.
WITH revoked AS (
    UPDATE archive_files f
    SET status = 'deleting', lease_token = NULL, lease_until = NULL,
        deleted_at = now(), updated_at = now()
    WHERE f.id = %(id)s AND f.owner = %(owner)s AND f.status <> 'deleting'
    RETURNING f.id, f.attempts, f.owner
), notified AS (
    SELECT CASE WHEN darkroom_cards_watched() THEN (
        SELECT darkroom_notify_cards(json_agg(json_build_array(owner, id, 'deleting')))
        FROM revoked) END AS n
), logged AS (
    INSERT INTO archive_events (file_id, kind, attempt)
    SELECT id, 'revoked', attempts
    FROM revoked LEFT JOIN notified ON true  -- see claim
)
SELECT id FROM revoked;

-- name: rederive_owners
-- Owners with ready cards whose derivative was made with other settings, and how many.
-- A scan of the cards: an admin's command, not a hot path.
SELECT owner, count(*) AS n FROM archive_files
WHERE status = 'ready' AND derive_fingerprint IS DISTINCT FROM %(fingerprint)s::text
  AND (%(owner)s::text IS NULL OR owner = %(owner)s::text)
GROUP BY owner
ORDER BY owner;

-- name: rederive
-- ready -> queued as bulk work, for up to `limit` of one owner's ready cards whose
-- derivative was made with other settings. The card keeps its derivative (readable) until
-- the fenced commit publishes the new one and leaves the old one to the sweeper. A repeat
-- takes only what is still ready and stale, so nothing is queued twice. Stamps continue
-- the owner's bulk line by the rule of every stamp (darkroom_fair_stamps), one per card.
WITH picked AS (
    SELECT id, created_at FROM archive_files
    WHERE owner = %(owner)s AND status = 'ready'
      AND derive_fingerprint IS DISTINCT FROM %(fingerprint)s::text
    ORDER BY created_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), ranked AS (
    -- Stamped oldest first, as picked.
    SELECT id, row_number() OVER (ORDER BY created_at, id) - 1 AS k FROM picked
), stamped AS (
    -- The batch's places in the owner's bulk line, one stamp per card, in one call.
    SELECT darkroom_fair_stamps(%(owner)s, 'bulk', (SELECT count(*)::int FROM picked))
           AS stamps
), moved AS (
    UPDATE archive_files f
    SET status = 'queued', priority = 'bulk', attempts = 0, deferrals = 0, error_code = NULL,
        finished_at = NULL, available_at = now(), updated_at = now(),
        fair_stamp = (SELECT stamps FROM stamped)[r.k + 1]
    FROM ranked r
    WHERE f.id = r.id
    RETURNING f.id, f.owner
), notified AS (
    -- Open pages see the change (GET /v1/events), as for every status change.
    SELECT CASE WHEN darkroom_cards_watched() THEN (
        SELECT darkroom_notify_cards(json_agg(json_build_array(owner, id, 'queued')))
        FROM moved) END AS n
), logged AS (
    INSERT INTO archive_events (file_id, kind)
    SELECT id, 'rederive' FROM moved LEFT JOIN notified ON true  -- see claim
)
SELECT count(*) AS n,
       CASE WHEN count(*) > 0 THEN pg_notify('darkroom_jobs', '') END AS notified
FROM moved;

-- name: rederive_pending
-- Re-derives not yet published: cards waiting or running that already have a derivative.
SELECT count(*) AS n FROM archive_files
WHERE status IN ('queued', 'processing') AND derived_key IS NOT NULL
  AND (%(owner)s::text IS NULL OR owner = %(owner)s::text);

-- name: retry_candidates
-- Rejected cards a retry would take, per owner and code (through the partial index of
-- rejected cards). `codes` NULL: any code.
SELECT owner, error_code, count(*) AS n FROM archive_files
WHERE status = 'rejected'
  AND (%(owner)s::text IS NULL OR owner = %(owner)s::text)
  AND (%(codes)s::text[] IS NULL OR error_code = ANY (%(codes)s::text[]))
  AND (%(since)s::timestamptz IS NULL OR finished_at >= %(since)s::timestamptz)
GROUP BY owner, error_code
ORDER BY owner, error_code;

-- name: retry
-- rejected -> queued with a fresh attempt budget, for up to `limit` of one owner's
-- rejected cards (or the one card `id`, or those of `ids`) whose code is in `codes` (NULL:
-- any). Only cards
-- still rejected are taken, so nothing that is not rejected is touched. Each card records
-- the run that re-queued it (`run`): the same run repeated after its answer was lost
-- passes over what it re-queued, even a card that was rejected again since, so a run
-- queues nothing twice. Stamped in the owner's line of `priority` by the rule of every
-- stamp (darkroom_fair_stamps), as re-derives are. The event names who asked (`actor`)
-- and the code the card had.
WITH picked AS (
    SELECT id, error_code, finished_at FROM archive_files
    WHERE owner = %(owner)s AND status = 'rejected'
      AND (%(id)s::uuid IS NULL OR id = %(id)s::uuid)
      AND (%(ids)s::uuid[] IS NULL OR id = ANY (%(ids)s::uuid[]))
      AND (%(codes)s::text[] IS NULL OR error_code = ANY (%(codes)s::text[]))
      AND (%(since)s::timestamptz IS NULL OR finished_at >= %(since)s::timestamptz)
      AND retried_by IS DISTINCT FROM %(run)s::uuid
    ORDER BY finished_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), ranked AS (
    -- Stamped in the order they were rejected.
    SELECT id, error_code, row_number() OVER (ORDER BY finished_at, id) - 1 AS k
    FROM picked
), stamped AS (
    -- The batch's places in the owner's line, one stamp per card, in one call.
    SELECT darkroom_fair_stamps(%(owner)s, %(priority)s::text,
                                (SELECT count(*)::int FROM picked)) AS stamps
), moved AS (
    UPDATE archive_files f
    SET status = 'queued', priority = %(priority)s::text, attempts = 0, deferrals = 0,
        error_code = NULL, finished_at = NULL, available_at = now(), updated_at = now(),
        retried_by = %(run)s::uuid,
        fair_stamp = (SELECT stamps FROM stamped)[r.k + 1]
    FROM ranked r
    WHERE f.id = r.id
    RETURNING f.id, f.owner, r.error_code AS previous_code
), shown AS (
    SELECT CASE WHEN darkroom_cards_watched() THEN (
        SELECT darkroom_notify_cards(json_agg(json_build_array(owner, id, 'queued')))
        FROM moved) END AS n
), logged AS (
    INSERT INTO archive_events (file_id, kind, attempt, worker, error_code)
    SELECT id, 'retried', 0, %(actor)s::text, previous_code
    FROM moved LEFT JOIN shown ON true  -- see claim
)
SELECT coalesce(array_agg(id), '{}') AS ids,
       CASE WHEN count(*) > 0 THEN pg_notify('darkroom_jobs', '') END AS notified
FROM moved;

-- name: retry_targets
-- Where the cards a console retry names stand, and whose they are (a deleted card is gone).
SELECT id, owner, status, error_code FROM archive_files
WHERE id = ANY (%(ids)s::uuid[]) AND status <> 'deleting';

-- name: retried_by_run
-- The cards one retry run re-queued, whatever answers it heard: read once at its end when
-- a statement of the run was sent again (the first may have committed unheard). Rare, so
-- a scan of one owner's cards rather than an index kept for it.
SELECT id FROM archive_files WHERE owner = %(owner)s AND retried_by = %(run)s::uuid;

-- name: retry_waiting
-- Of the cards a retry re-queued, those not yet final.
SELECT count(*) AS n FROM archive_files
WHERE id = ANY (%(ids)b::uuid[]) AND status IN ('queued', 'processing');

-- name: set_owner_weight
INSERT INTO owner_weights (owner, weight) VALUES (%(owner)s, %(weight)s)
ON CONFLICT (owner) DO UPDATE SET weight = excluded.weight;

-- name: take_deleted
-- A batch of deleted cards for one sweeper: taking them moves their next try (available_at,
-- unused once a card is deleting) forward and commits, so no row lock or snapshot is held
-- while their bytes are deleted, other sweepers take other cards, and a card whose bytes
-- could not be deleted is tried again later without holding up the rest.
UPDATE archive_files f
SET available_at = now() + make_interval(secs => %(retry_seconds)s::float8)
WHERE f.id = ANY (ARRAY(
    SELECT id FROM archive_files
    WHERE status = 'deleting'
      AND deleted_at < now() - make_interval(secs => %(guard_seconds)s::float8)
      AND available_at <= now()
    ORDER BY deleted_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED))
RETURNING f.id, f.original_key;

-- name: purge_card
-- The last step of a delete, after every byte is gone. Its events stay (until retention
-- prunes them): they are the history of what happened to the file.
WITH card AS (
    DELETE FROM archive_files WHERE id = %(id)s AND status = 'deleting' RETURNING id
), attempts AS (
    DELETE FROM unpublished_attempts WHERE file_id IN (SELECT id FROM card)
)
DELETE FROM orphan_objects WHERE file_id IN (SELECT id FROM card);

-- name: get_file
SELECT id, owner, filename, content_type, size_bytes, original_key, original_version,
       original_sha256, status, priority, attempts, error_code, derived_key,
       derived_version, sha256, width, height, derived_bytes, thumb_key, thumb_version,
       thumb_sha256, thumb_width, thumb_height, thumb_bytes, thumbhash, rederive_error,
       created_at, updated_at
FROM archive_files WHERE id = %(id)s AND owner = %(owner)s AND status <> 'deleting';

-- name: list_files
-- Newest first; the cursor is the (created_at, id) of the last card of the previous page.
-- Processing cards are not in the owner index (see migration 0004): they come from the
-- index of live leases, which holds no more rows than there are worker slots.
WITH page AS (
    (SELECT * FROM archive_files
     WHERE owner = %(owner)s AND status NOT IN ('deleting', 'processing')
       AND %(status)s::text IS DISTINCT FROM 'processing'
       AND (%(status)s::text IS NULL OR status = %(status)s::text)
       AND (%(code)s::text IS NULL OR error_code = %(code)s::text)
       AND (%(after_created)s::timestamptz IS NULL
            OR (created_at, id) < (%(after_created)s::timestamptz, %(after_id)s::uuid))
     ORDER BY created_at DESC, id DESC
     LIMIT %(limit)s)
    UNION ALL
    (SELECT * FROM archive_files
     WHERE status = 'processing' AND owner = %(owner)s
       AND (%(status)s::text IS NULL OR %(status)s::text = 'processing')
       AND %(code)s::text IS NULL
       AND (%(after_created)s::timestamptz IS NULL
            OR (created_at, id) < (%(after_created)s::timestamptz, %(after_id)s::uuid)))
)
SELECT id, owner, filename, content_type, size_bytes, original_key, original_version,
       original_sha256, status, priority, attempts, error_code, derived_key,
       derived_version, sha256, width, height, derived_bytes, thumb_key, thumb_version,
       thumb_sha256, thumb_width, thumb_height, thumb_bytes, thumbhash, rederive_error,
       created_at, updated_at
FROM page
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s;

-- name: file_events
-- A file's history, oldest first. The routine events (claimed, ready) have no index by
-- file: they are read through the BRIN time index within the card's lifetime, since each
-- is written with the card's updated_at. After a purge only the indexed kinds remain
-- findable this way (the rest until retention only by a scan).
SELECT id, file_id, kind, attempt, token, worker, error_code, created_at FROM archive_events
WHERE file_id = %(id)s AND kind NOT IN ('claimed', 'ready')
UNION ALL
SELECT e.id, e.file_id, e.kind, e.attempt, e.token, e.worker, e.error_code, e.created_at
FROM archive_files f
JOIN archive_events e
  ON e.file_id = f.id AND e.kind IN ('claimed', 'ready')
 AND e.created_at >= f.created_at AND e.created_at <= f.updated_at
WHERE f.id = %(id)s
ORDER BY id;

-- name: stats
SELECT
    (SELECT coalesce(jsonb_object_agg(status, n), '{}'::jsonb)
       FROM (SELECT status, count(*) AS n FROM archive_files GROUP BY status) s) AS counts,
    (SELECT extract(epoch FROM now() - min(since))::float8 FROM (
        SELECT min(available_at) AS since FROM archive_files
         WHERE status = 'queued' AND available_at <= now()
        UNION ALL
        SELECT min(lease_until) FROM archive_files
         WHERE status = 'processing' AND lease_until < now()) c) AS oldest_claimable_age_seconds,
    (SELECT count(*) FROM archive_files
      WHERE status = 'processing' AND lease_until < now()) AS expired_leases,
    (SELECT count(*) FILTER (WHERE kind IN ('rejected', 'exhausted'))::float8
            / nullif(count(*), 0)
       FROM archive_events
      WHERE created_at > now() - interval '1 hour'
        AND kind IN ('ready', 'rejected', 'exhausted')) AS rejected_share_1h,
    (SELECT count(*) FILTER (WHERE kind IN ('rejected', 'exhausted'))::float8
            / nullif(count(*), 0)
       FROM archive_events
      WHERE created_at > now() - interval '24 hours'
        AND kind IN ('ready', 'rejected', 'exhausted')) AS rejected_share_24h,
    (SELECT count(*) FROM archive_events
      WHERE created_at > now() - interval '1 minute' AND kind = 'ready') AS completed_last_minute,
    (SELECT count(*) FROM archive_events WHERE kind = 'lease_lost') AS lease_lost_total,
    (SELECT coalesce(jsonb_agg(worker ORDER BY worker), '[]'::jsonb) FROM worker_pauses
      WHERE seen_at > now() - interval '5 minutes') AS paused_workers;

-- name: pause_worker
-- The store breaker opened (or is still open): upserted, so a repeat changes nothing.
INSERT INTO worker_pauses (worker, reason) VALUES (%(worker)s, %(reason)s)
ON CONFLICT (worker) DO UPDATE SET reason = EXCLUDED.reason, seen_at = now();

-- name: resume_worker
DELETE FROM worker_pauses WHERE worker = %(worker)s;

-- name: backlog
-- Who is waiting: per priority, and the top owners by waiting cards (with their oldest
-- due card). One pass over the waiting cards, through the claim's partial index.
WITH waiting AS (
    SELECT owner, priority, available_at FROM archive_files WHERE status = 'queued'
), owners AS (
    SELECT owner, count(*) AS waiting,
           count(*) FILTER (WHERE priority = 'interactive') AS interactive,
           count(*) FILTER (WHERE priority = 'bulk') AS bulk,
           extract(epoch FROM now() - min(available_at)
                   FILTER (WHERE available_at <= now()))::float8 AS oldest_wait_seconds
    FROM waiting GROUP BY owner
    ORDER BY waiting DESC, oldest_wait_seconds DESC NULLS LAST, owner
    LIMIT %(top)s
)
SELECT
    (SELECT coalesce(jsonb_object_agg(priority, jsonb_build_object(
                'waiting', n, 'oldest_wait_seconds', age)), '{}'::jsonb)
       FROM (SELECT priority, count(*) AS n,
                    extract(epoch FROM now() - min(available_at)
                            FILTER (WHERE available_at <= now()))::float8 AS age
               FROM waiting GROUP BY priority) p) AS by_priority,
    (SELECT count(DISTINCT owner) FROM waiting) AS owners_waiting,
    (SELECT coalesce(jsonb_agg(to_jsonb(o) ORDER BY o.waiting DESC,
                                 o.oldest_wait_seconds DESC NULLS LAST, o.owner), '[]'::jsonb)
       FROM owners o) AS top_owners,
    (SELECT count(*) FROM archive_files
      WHERE status IN ('queued', 'processing') AND derived_key IS NOT NULL) AS rederive_pending;

-- name: lock_owner_quota
-- Serializes the creations of one owner while quotas are on, so two concurrent creations
-- cannot both fit under a quota that only one of them fits under. Held until COMMIT.
SELECT pg_advisory_xact_lock(hashtextextended('darkroom.quota:' || %(owner)s, 0));

-- name: owner_within_quota
-- Whether one more card of `size` declared bytes keeps the owner within the quotas (0:
-- none). Live cards count, pending ones included: their bytes are stored or about to be.
-- Run after lock_owner_quota, in the same transaction as the creation. A create whose
-- idempotency key the owner already holds needs no room: it makes no card, and answers
-- the key's card (a replay of a create that committed while this one waited for the lock).
SELECT ((%(quota_files)s::bigint = 0 OR count(*) + 1 <= %(quota_files)s::bigint)
        AND (%(quota_bytes)s::bigint = 0
             OR coalesce(sum(size_bytes), 0) + %(size)s::bigint <= %(quota_bytes)s::bigint))
       OR EXISTS (SELECT 1 FROM idempotency_keys k
                  WHERE k.owner = %(owner)s AND k.key_hash = %(key_hash)s::bytea) AS fits
FROM archive_files
WHERE owner = %(owner)s AND status <> 'deleting';

-- name: pending_due
-- Pending cards past the TTL, oldest first: the sweeper looks in the store for each one's
-- upload before it decides (pending_found_upload or expire_pending). Reads only.
SELECT id, owner, original_key, size_bytes, original_sha256 FROM archive_files
WHERE status = 'pending'
  AND created_at < now() - make_interval(secs => %(ttl_seconds)s::float8)
ORDER BY created_at
LIMIT %(limit)s;

-- name: pending_found_upload
-- pending -> queued, by the sweeper, for a card past the TTL whose upload is in the store
-- with the declared size (and the claimed digest, if one was claimed): its confirm was
-- never made or was lost (a failover that lost acknowledged commits), and purging it
-- would delete a stored upload. The card is stamped by the rule of every stamp (fair
-- share: its place in its owner's line, as its confirm would have), so cards found in
-- bulk after a failover wait behind other owners' work instead of jumping it. A confirm
-- that commits first wins, and a repeat finds the card no longer pending: both change
-- nothing.
WITH target AS (
    SELECT id, owner, priority FROM archive_files
    WHERE id = %(id)s AND status = 'pending'
      AND created_at < now() - make_interval(secs => %(ttl_seconds)s::float8)
      AND size_bytes = %(size)s::bigint
      AND (original_sha256 IS NULL OR original_sha256 = %(sha256)s::text)
    FOR UPDATE
), moved AS (
    UPDATE archive_files f
    SET status = 'queued', original_version = %(version)s, available_at = now(),
        fair_stamp = darkroom_fair_stamp(t.owner, t.priority),
        updated_at = now()
    FROM target t
    WHERE f.id = t.id
    RETURNING f.id, f.owner, f.attempts, f.original_sha256
), known AS (
    INSERT INTO known_originals (file_id, owner, sha256)
    SELECT id, owner, original_sha256 FROM moved WHERE original_sha256 IS NOT NULL
    ON CONFLICT (file_id) DO NOTHING
), notified AS (
    SELECT CASE WHEN darkroom_cards_watched() THEN (
        SELECT darkroom_notify_cards(json_agg(json_build_array(owner, id, 'queued')))
        FROM moved) END AS n
), logged AS (
    INSERT INTO archive_events (file_id, kind, attempt, worker)
    SELECT id, 'upload_found', attempts, %(worker)s
    FROM moved LEFT JOIN notified ON true  -- see claim
)
SELECT id, pg_notify('darkroom_jobs', '') IS NULL AS notified FROM moved;

-- name: expire_pending
-- pending -> deleting for cards left unconfirmed past the TTL whose upload the sweeper
-- did not find in the store; the purge of deleted cards then removes their bytes and
-- rows. A confirm that commits first wins: the re-checked status no longer matches, and
-- the card is not touched.
WITH due AS (
    SELECT id FROM archive_files
    WHERE id = ANY (%(ids)s::uuid[]) AND status = 'pending'
      AND created_at < now() - make_interval(secs => %(ttl_seconds)s::float8)
    FOR UPDATE SKIP LOCKED
), expired AS (
    UPDATE archive_files f
    SET status = 'deleting', deleted_at = now(), updated_at = now()
    FROM due d
    WHERE f.id = d.id AND f.status = 'pending'
    RETURNING f.id, f.attempts, f.owner
), notified AS (
    -- Open pages see the change (GET /v1/events), as for every status change.
    SELECT CASE WHEN darkroom_cards_watched() THEN (
        SELECT darkroom_notify_cards(json_agg(json_build_array(owner, id, 'deleting')))
        FROM expired) END AS n
), logged AS (
    INSERT INTO archive_events (file_id, kind, attempt, worker)
    SELECT id, 'expired', attempts, %(worker)s FROM expired LEFT JOIN notified ON true
)
SELECT id FROM expired;

-- name: restored_card
-- `darkroom reconcile --restore` made this card (create_file, then confirm, as the API
-- does) for an original no card held: its history says so.
INSERT INTO archive_events (file_id, kind, attempt)
SELECT id, 'restored', attempts FROM archive_files WHERE id = %(id)s;

-- name: worker_demand
-- Worker slots the queue could use right now: cards being processed plus cards claimable
-- now (due queued rows and expired leases are both in these two sets). An autoscaler
-- divides it by the slots of one worker to get the workers wanted (KEDA's postgresql
-- trigger with targetQueryValue = slots per worker; deploy/kubernetes/worker.yaml runs
-- this exact text). In-flight cards count, so the fleet does not shrink under running
-- jobs. Counted through the two partial indexes and capped: past 100,000 every fleet is
-- at its maximum anyway, and the count stays cheap under any backlog.
SELECT count(*)::float8 AS demand FROM (
    (SELECT 1 FROM archive_files WHERE status = 'processing' LIMIT 100000)
    UNION ALL
    (SELECT 1 FROM archive_files WHERE status = 'queued' AND available_at <= now()
     LIMIT 100000)
    LIMIT 100000) d;
