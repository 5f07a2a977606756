-- The statements benches run where the product has none and the tests' (tests/support/
-- queries.sql) are not exactly what is needed: to empty and fill darkroom's tables in
-- bulk, to read what a run did, to speak to the server itself (a fresh database, its
-- settings, its backends' work), and to drive the systems darkroom is compared with.
-- Loaded by name like the product's own (bench/sql.py, darkroom/db/queries.py), together
-- with bench/fair_previous.sql: a bench spells no SQL of its own (tests/test_docs.py).
-- Object keys are darkroom.layout's: a statement that makes keys in bulk takes the
-- layout's prefix as a parameter (`originals`, `derived`), so the layout is defined once.

-- Emptying and filling darkroom's tables ---------------------------------------------------

-- name: empty_queue
-- Every table a card's rows live in (cascading to those that reference cards), emptied
-- between runs so that each starts from the same state.
TRUNCATE archive_files, archive_events, orphan_objects, owner_clocks CASCADE;

-- name: delete_every_card
DELETE FROM archive_files;

-- name: fill_queued
-- `n` queued cards of one owner, due now (bench.queue's drains).
INSERT INTO archive_files (owner, filename, content_type, size_bytes, original_key,
                           original_version, status)
SELECT 'bench', 'f' || i || '.jpg', 'image/jpeg', 1, %(originals)s::text || i, 'v1',
       'queued'
FROM generate_series(1, %(n)s) AS i;

-- name: fill_pending
-- `n` pending cards of one owner, confirmed later one by one (bench.queue's latency).
INSERT INTO archive_files (owner, filename, content_type, size_bytes, original_key)
SELECT 'bench', 'f' || i, 'image/jpeg', 1, %(originals)s::text || i
FROM generate_series(1, %(n)s) i
RETURNING id;

-- name: fill_ready
-- `n` ready cards of 1,000 owners, made over the last 30 days (the finished rows a claim
-- must not be slowed by).
INSERT INTO archive_files (owner, filename, content_type, size_bytes, original_key,
                           original_version, status, attempts, derived_key, derived_version,
                           sha256, width, height, derived_bytes, created_at, available_at,
                           finished_at)
SELECT 'u' || (i %% 1000), 'f' || i, 'image/jpeg', 1, %(originals)s::text || i, 'v1',
       'ready', 1, %(derived)s::text || i, 'v', repeat('0', 64), 1, 1, 1,
       now() - interval '30 days' + i * interval '1 millisecond',
       now() - interval '30 days' + i * interval '1 millisecond', now()
FROM generate_series(1, %(n)s) AS i;

-- name: fill_fair_backlog
-- darkroom's backlog as fair share leaves it: `owners` owners, each with its own line of
-- stamps (owner i mod owners gets stamp i / owners, so the lines interleave), one card in
-- `bulk` bulk, all due for a day.
INSERT INTO archive_files (owner, filename, content_type, size_bytes, original_key,
                           original_version, status, created_at, available_at, priority,
                           fair_stamp)
SELECT 'u' || (i %% %(owners)s), 'q' || i, 'image/jpeg', 1, %(originals)s::text || 'q' || i,
       'v1', 'queued', now() - interval '1 day' + i * interval '1 millisecond',
       now() - interval '1 day' + i * interval '1 millisecond',
       CASE WHEN i %% %(bulk)s = 0 THEN 'bulk' ELSE 'interactive' END, i / %(owners)s
FROM generate_series(1, %(n)s) AS i;

-- name: fill_ahead
-- `n` due cards of `owner` stamped ahead of every waiting card (bench.pause).
INSERT INTO archive_files (owner, filename, content_type, size_bytes, original_key,
                           original_version, status, fair_stamp, available_at)
SELECT %(owner)s, 'a' || i, 'image/jpeg', 1, %(originals)s::text || 'a' || i, 'v1',
       'queued', -1 - i, now() - interval '1 hour'
FROM generate_series(1, %(n)s) AS i;

-- name: fill_backlog
-- `n` queued cards of 1,000 owners, due for a day, with no fair stamp: the same backlog on
-- darkroom's table and on the seed's (their queued columns are alike).
INSERT INTO archive_files (owner, filename, content_type, size_bytes, original_key,
                           original_version, status, created_at, available_at)
SELECT 'u' || (i %% 1000), 'q' || i, 'image/jpeg', 1, %(originals)s::text || 'q' || i, 'v1',
       'queued', now() - interval '1 day' + i * interval '1 millisecond',
       now() - interval '1 day' + i * interval '1 millisecond'
FROM generate_series(1, %(n)s) AS i;

-- name: vacuum_analyze_cards
-- After a bulk fill (darkroom's table or the seed's): fresh statistics, a visibility map.
VACUUM ANALYZE archive_files;

-- name: vacuum_cards
-- The row versions rolled-back claims leave (darkroom's table or the seed's).
VACUUM archive_files;

-- name: clear_bulk_credit
-- Bulk's share starts from nothing in each claim-throughput run (bench.fair).
UPDATE fair_clock SET bulk_credit = 0;

-- name: add_bench_pause
-- A pause of `owner`'s cards (every card's, when NULL), as `darkroom pause` leaves it but
-- without its event: only the claim's cost is measured (bench.pause).
INSERT INTO claim_pauses (owner, priority, paused_by) VALUES (%(owner)s, NULL, 'bench');

-- name: silence_card_notify
-- The cards' NOTIFY (migration 0009) made a no-op, to measure what it costs (bench.page);
-- the migration's own text puts it back.
CREATE OR REPLACE FUNCTION darkroom_notify_cards(changed json) RETURNS void
LANGUAGE plpgsql AS $$ BEGIN RETURN; END; $$;

-- Reading what a run did --------------------------------------------------------------------

-- name: ready_count
-- Cards ready (darkroom's table or the seed's: both mark a finished job `ready`).
SELECT count(*) FROM archive_files WHERE status = 'ready';

-- name: unready_count
SELECT count(*) FROM archive_files WHERE status <> 'ready';

-- name: queued_count_among
SELECT count(*) FROM archive_files WHERE status = 'queued' AND id = ANY(%(ids)s);

-- name: ready_and_rejected_among
SELECT count(*) FILTER (WHERE status = 'ready'), count(*) FILTER (WHERE status = 'rejected')
FROM archive_files WHERE id = ANY(%(ids)s);

-- name: status_counts_of_owner
SELECT status, count(*) FROM archive_files WHERE owner = %(owner)s GROUP BY status;

-- name: claimed_and_ready
-- Each card's confirm (available_at), claim and publication, on the database's clock.
SELECT f.id, f.available_at, c.created_at AS claimed, r.created_at AS ready
FROM archive_files f
JOIN archive_events c ON c.file_id = f.id AND c.kind = 'claimed'
JOIN archive_events r ON r.file_id = f.id AND r.kind = 'ready';

-- name: claimed_and_maybe_ready
-- The same, with the cards claimed but not (yet) published when the run stopped.
SELECT f.id, f.available_at, c.created_at, r.created_at FROM archive_files f
JOIN archive_events c ON c.file_id = f.id AND c.kind = 'claimed'
LEFT JOIN archive_events r ON r.file_id = f.id AND r.kind = 'ready';

-- name: confirm_to_claim_ms
-- Milliseconds from each card's confirm to its claim, both on the database's clock.
SELECT extract(epoch FROM e.created_at - f.available_at) * 1000
FROM archive_events e JOIN archive_files f ON f.id = e.file_id
WHERE e.kind = 'claimed';

-- The server itself -------------------------------------------------------------------------
-- A {name} in braces is an identifier (a database's, a channel's), which these statements
-- take in place of a parameter: bench/sql.py `composed` quotes it in.

-- name: drop_database
DROP DATABASE IF EXISTS {name};

-- name: drop_database_forced
-- Even with sessions still connected to it (a run cut short).
DROP DATABASE IF EXISTS {name} WITH (FORCE);

-- name: create_database
CREATE DATABASE {name};

-- name: listen
LISTEN {channel};

-- name: server_setting
-- One setting as SHOW prints it (units and all).
SELECT current_setting(%(name)s);

-- name: backend_pid
SELECT pg_backend_pid() AS pid;

-- name: backend_names
SELECT pid, coalesce(application_name, '') FROM pg_stat_activity;

-- name: checkpoints_before_17
-- Checkpoints so far, on PostgreSQL 16 and older.
SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter;

-- name: checkpoints
-- Checkpoints so far, on PostgreSQL 17 and later.
SELECT num_timed + num_requested FROM pg_stat_checkpointer;

-- name: autovacuum_runs
SELECT coalesce(sum(autovacuum_count + autoanalyze_count), 0) FROM pg_stat_all_tables;

-- name: relation_sizes
-- Every table's and index's size in bytes.
SELECT c.relname AS name, pg_relation_size(c.oid) AS bytes FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind IN ('r', 'i');

-- name: table_activity
-- Each table's live and dead rows and its autovacuum runs.
SELECT relname, n_live_tup, n_dead_tup, autovacuum_count FROM pg_stat_user_tables;

-- The seed (the worker.mjs darkroom started from), on a table of its own ------------------

-- name: seed_schema
-- The seed's archive_files, reduced to the columns its worker touches plus the card's own,
-- and with only the primary key: the seed declares no index for its claim.
CREATE TABLE IF NOT EXISTS archive_files (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    owner text NOT NULL, filename text NOT NULL, content_type text NOT NULL,
    size_bytes bigint NOT NULL, original_key text NOT NULL, original_version text,
    status text NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending','queued','processing','ready','rejected','deleting')),
    attempts integer NOT NULL DEFAULT 0, available_at timestamptz NOT NULL DEFAULT now(),
    lease_token uuid, lease_until timestamptz, error_code text,
    derived_key text, derived_version text, sha256 text,
    created_at timestamptz NOT NULL DEFAULT now(), updated_at timestamptz NOT NULL DEFAULT now()
);

-- name: seed_empty
TRUNCATE archive_files CASCADE;

-- name: seed_select_due
-- Verbatim from the seed's worker.mjs (placeholders adapted to psycopg), as are
-- seed_lease and seed_complete: its claim is this SELECT and then seed_lease, in one
-- transaction.
SELECT * FROM archive_files WHERE
      (status='queued' AND available_at<=now()) OR
      (status='processing' AND lease_until<now())
      ORDER BY created_at FOR UPDATE SKIP LOCKED LIMIT 1;

-- name: seed_lease
UPDATE archive_files SET status='processing',lease_token=%(token)s,
      lease_until=now()+interval '2 minutes',attempts=attempts+1 WHERE id=%(id)s RETURNING *;

-- name: seed_complete
UPDATE archive_files SET status='ready',derived_key=%(key)s,
      derived_version=%(version)s, sha256=%(sha)s,lease_token=NULL,lease_until=NULL
      WHERE id=%(id)s AND lease_token=%(token)s AND status='processing';

-- name: seed_fill_queued
-- `n` queued cards, created a microsecond apart (the seed claims in created_at order).
INSERT INTO archive_files (owner, filename, content_type, size_bytes, original_key,
                           original_version, status, created_at)
SELECT 'bench', 'f' || i || '.jpg', 'image/jpeg', 1, %(originals)s::text || i, 'v1',
       'queued', now() + i * interval '1 microsecond'
FROM generate_series(1, %(n)s) AS i;

-- name: seed_enqueue
-- One queued card, as the seed's API writes it on confirm (no NOTIFY).
INSERT INTO archive_files (id, owner, filename, content_type, size_bytes, original_key,
                           original_version, status)
VALUES (%(id)s, 'bench', %(filename)s, 'image/jpeg', 1, %(key)s, 'v1', 'queued');

-- name: seed_fill_ready
-- fill_ready on the seed's table (it has no size, stamp or finish columns).
INSERT INTO archive_files (owner, filename, content_type, size_bytes, original_key,
                           original_version, status, attempts, derived_key, derived_version,
                           sha256, created_at, available_at)
SELECT 'u' || (i %% 1000), 'f' || i, 'image/jpeg', 1, %(originals)s::text || i, 'v1',
       'ready', 1, %(derived)s::text || i, 'v', repeat('0', 64),
       now() - interval '30 days' + i * interval '1 millisecond',
       now() - interval '30 days' + i * interval '1 millisecond'
FROM generate_series(1, %(n)s) AS i;

-- PgQueuer's and Procrastinate's tables (their own statements run through their APIs) -----

-- name: pgqueuer_vacuum
VACUUM ANALYZE pgqueuer;

-- name: pgqueuer_left
-- Jobs not finished: a finished job leaves the pgqueuer table.
SELECT count(*) FROM pgqueuer;

-- name: pgqueuer_successful
-- Jobs finished, as its log records them.
SELECT count(*) FROM pgqueuer_log WHERE status = 'successful';

-- name: procrastinate_installed
SELECT to_regclass('procrastinate_jobs') IS NOT NULL;

-- name: procrastinate_empty
TRUNCATE procrastinate_jobs CASCADE;

-- name: procrastinate_vacuum
VACUUM ANALYZE procrastinate_jobs;

-- name: procrastinate_succeeded
SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded';
