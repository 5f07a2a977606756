-- An operator's pause of claiming (migration 0014): the claim (queries.sql) passes over
-- every card a pause covers (darkroom_paused_owners, migration 0018). Each change writes
-- its event, naming who asked, in the same statement; a repeat changes nothing and writes
-- nothing, so a pause or resume whose answer was lost is simply sent again.

-- name: pause_claims
-- Tells the workers (NOTIFY at COMMIT, payload queue.PAUSED_NOTICE): each hands back the
-- leases it keeps ahead of its slots, so that no attempt starts on a paused card from them;
-- the claim passes over the paused cards from then on.
WITH taken AS (
    INSERT INTO claim_pauses (owner, priority, paused_by)
    VALUES (%(owner)s::text, %(priority)s::text, %(actor)s)
    ON CONFLICT ON CONSTRAINT claim_pauses_scope DO NOTHING
    RETURNING owner, priority, paused_by, since
), logged AS (
    INSERT INTO claim_pause_events (kind, owner, priority, actor)
    SELECT 'paused', owner, priority, paused_by FROM taken
)
SELECT true AS changed, owner, priority, paused_by, since,
       pg_notify('darkroom_jobs', 'paused') IS NULL AS notified
FROM taken
UNION ALL
-- Already paused: who paused it, and since when.
SELECT false, owner, priority, paused_by, since, false FROM claim_pauses
WHERE owner IS NOT DISTINCT FROM %(owner)s::text
  AND priority IS NOT DISTINCT FROM %(priority)s::text
  AND NOT EXISTS (SELECT 1 FROM taken);

-- name: resume_claims
-- Lifts the pause of exactly this scope, or (every) all of them; wakes the workers.
WITH lifted AS (
    DELETE FROM claim_pauses
    WHERE %(every)s
       OR (owner IS NOT DISTINCT FROM %(owner)s::text
           AND priority IS NOT DISTINCT FROM %(priority)s::text)
    RETURNING owner, priority, paused_by, since
), logged AS (
    INSERT INTO claim_pause_events (kind, owner, priority, actor)
    SELECT 'resumed', owner, priority, %(actor)s FROM lifted
)
SELECT owner, priority, paused_by, since,
       pg_notify('darkroom_jobs', '') IS NULL AS notified
FROM lifted;

-- name: claim_pauses
SELECT owner, priority, paused_by, since FROM claim_pauses
ORDER BY since, owner NULLS FIRST, priority NULLS FIRST;

-- name: claim_pause_events
-- The latest pauses and resumes, newest first.
SELECT id, kind, owner, priority, actor, created_at FROM claim_pause_events
ORDER BY id DESC LIMIT %(limit)s;
