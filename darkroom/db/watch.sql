-- The pages' watch on card changes (watch.py, migration 0024): card notifications are
-- sent only while it is on.

-- name: extend_card_watch
-- Moves the watch's end `seconds` past now, never back (several API processes extend
-- it). Repeating it changes nothing but the end: an answer lost is simply asked again.
UPDATE card_watch SET until = greatest(until, now() + make_interval(secs => %(seconds)s::float8))
RETURNING until;

-- name: card_writers
-- Every other transaction holding a lock on archive_files that a write takes (each of
-- the statements that change a card's status takes one from its start to its
-- transaction's end); readers hold only ACCESS SHARE and are not waited for.
SELECT DISTINCT l.virtualtransaction AS writer
FROM pg_locks l
WHERE l.locktype = 'relation'
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.relation = 'archive_files'::regclass
  AND l.mode <> 'AccessShareLock'
  AND l.pid IS DISTINCT FROM pg_backend_pid();
