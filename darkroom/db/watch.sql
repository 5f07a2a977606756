-- The pages' watch on card changes (watch.py, migration 0024): card notifications are
-- sent only while it is on.

-- name: extend_card_watch
-- Moves the watch's end `seconds` past now, never back (several API processes extend
-- it), and answers whether it was still `margin` seconds ahead by the database's clock
-- (the one every change compares it with): if not, a change may have read it as off.
-- The row is read locked, so the end compared is the latest committed. Repeating it
-- changes nothing but the end: an answer lost is simply asked again.
WITH before AS (
    SELECT until FROM card_watch FOR UPDATE
)
UPDATE card_watch w
SET until = greatest(w.until, now() + make_interval(secs => %(seconds)s::float8))
FROM before b
RETURNING b.until > clock_timestamp() + make_interval(secs => %(margin)s::float8) AS ahead;

-- name: card_writers
-- Every other transaction that may be changing a card's status: each of those statements
-- holds ROW EXCLUSIVE on archive_files from its start to its transaction's end. Not the
-- other modes, which nothing that reads the watch holds alone (readers, VACUUM, ANALYZE,
-- an index built concurrently), nor a lock still waited for (its holder reads the watch
-- after it is granted).
SELECT DISTINCT l.virtualtransaction AS writer
FROM pg_locks l
WHERE l.locktype = 'relation'
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.relation = 'archive_files'::regclass
  AND l.mode = 'RowExclusiveLock'
  AND l.granted
  AND l.pid IS DISTINCT FROM pg_backend_pid();
