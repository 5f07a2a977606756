-- The statements tests run against darkroom's tables where the product has none: to read
-- a card's raw row (its lease, its fair stamp), to count what a test expects, to seed many
-- cards at once, and to move the database's clock for one row (a lease that expired, a
-- card made two days ago) without waiting for it. Loaded by name like the product's own
-- (tests/support/sql.py, darkroom/db/queries.py): a test spells no SQL of its own, and a
-- test that can use a product statement uses that one instead.

-- Cards ------------------------------------------------------------------------------------

-- name: card
SELECT * FROM archive_files WHERE id = %(id)s;

-- name: cards
SELECT * FROM archive_files;

-- name: cards_among
SELECT * FROM archive_files WHERE id = ANY(%(ids)s);

-- name: finished_cards
-- Every card a client has confirmed (a pending one never reached the queue).
SELECT * FROM archive_files WHERE status <> 'pending';

-- name: card_count
SELECT count(*) AS n FROM archive_files;

-- name: cards_with_id
SELECT count(*) AS n FROM archive_files WHERE id = %(id)s;

-- name: cards_of_owner
SELECT count(*) AS n FROM archive_files WHERE owner = %(owner)s;

-- name: card_owners
SELECT id, owner FROM archive_files;

-- name: card_statuses
SELECT id, status FROM archive_files;

-- name: statuses_among
SELECT id, status FROM archive_files WHERE id = ANY(%(ids)s);

-- name: status_counts
SELECT status, count(*) AS n FROM archive_files GROUP BY status;

-- name: status_counts_among
SELECT status, count(*) AS n FROM archive_files WHERE id = ANY(%(ids)s) GROUP BY status;

-- name: finished_count
SELECT count(*) AS n FROM archive_files WHERE status IN ('ready', 'rejected');

-- name: processing_count
SELECT count(*) AS n FROM archive_files WHERE status = 'processing';

-- name: processing_among
SELECT id FROM archive_files WHERE status = 'processing' AND id = ANY(%(ids)s);

-- name: ready_ids
SELECT id FROM archive_files WHERE status = 'ready';

-- name: pending_originals
SELECT original_key FROM archive_files WHERE status = 'pending';

-- name: owner_cards
SELECT id, status FROM archive_files WHERE owner = %(owner)s;

-- name: owner_files
SELECT filename, status FROM archive_files WHERE owner = %(owner)s ORDER BY filename;

-- name: queued_of_owner
SELECT count(*) AS n FROM archive_files WHERE owner = %(owner)s AND status = 'queued';

-- name: due_cards
SELECT id, owner, priority FROM archive_files WHERE status = 'queued' AND available_at <= now();

-- name: expired_lease_count
SELECT count(*) AS n FROM archive_files WHERE status = 'processing' AND lease_until < now();

-- name: live_leases_of_worker
-- The leases a worker named `prefix`... holds that have not expired.
SELECT id, lease_token FROM archive_files
WHERE status = 'processing' AND lease_owner LIKE %(prefix)s || '%%' AND lease_until > now();

-- name: queued_rederives_of_owner
SELECT id FROM archive_files
WHERE owner = %(owner)s AND status = 'queued' AND derived_key IS NOT NULL AND priority = 'bulk';

-- name: rejected_of_owner
SELECT id, error_code FROM archive_files WHERE owner = %(owner)s AND status = 'rejected';

-- name: rejected_owners
SELECT DISTINCT owner FROM archive_files WHERE status = 'rejected' ORDER BY owner;

-- name: originals_by_size
SELECT id, owner, status, original_key, original_version, size_bytes
FROM archive_files ORDER BY size_bytes;

-- name: original_of
SELECT original_key, original_version FROM archive_files WHERE id = %(id)s;

-- name: attempts_and_deferrals
SELECT attempts, deferrals FROM archive_files;

-- name: deferrals_but
SELECT sum(deferrals) AS n FROM archive_files WHERE id <> %(id)s;

-- name: attempts_histogram
SELECT attempts, count(*) AS n FROM archive_files GROUP BY attempts;

-- name: backoff_seconds
-- How long after its hand-back a card is due again.
SELECT extract(epoch FROM available_at - updated_at) AS s FROM archive_files WHERE id = %(id)s;

-- name: progress
-- A fleet's progress at a glance: finished cards, running ones, leases lost so far.
SELECT count(*) FILTER (WHERE status IN ('ready', 'rejected')) AS finished,
       count(*) FILTER (WHERE status = 'processing') AS running,
       (SELECT count(*) FROM archive_events WHERE kind = 'lease_lost') AS lost
FROM archive_files;

-- Fair share ------------------------------------------------------------------------------

-- name: fair_stamps_of_owner
SELECT fair_stamp FROM archive_files WHERE owner = %(owner)s;

-- name: fair_stamps
SELECT id, fair_stamp FROM archive_files;

-- name: fair_places_among
SELECT fair_stamp, owner FROM archive_files WHERE id = ANY(%(ids)s)
ORDER BY fair_stamp DESC, owner DESC;

-- name: stamp_by_the_function
-- The stamp darkroom_fair_stamps would give the owner's next card (in a transaction the
-- caller rolls back: it moves the owner's clock).
SELECT darkroom_fair_stamp(%(owner)s, %(priority)s);

-- name: stamp_after
-- A card's stamp by the rule (darkroom_fair_start) from `prev`, the owner's clock before
-- it, against the class's head as it stands now and the given weight.
SELECT darkroom_fair_start(%(prev)s::float8, h.vtime, h.vowner, %(owner)s, %(weight)s::float8)
FROM (SELECT vtime, vowner FROM fair_heads WHERE priority = %(priority)s
      ORDER BY vtime DESC, vowner DESC LIMIT 1) h;

-- name: owner_clock
SELECT stamp FROM owner_clocks WHERE owner = %(owner)s AND priority = %(priority)s;

-- name: set_owner_clock
INSERT INTO owner_clocks (owner, priority, stamp) VALUES (%(owner)s, %(priority)s, %(stamp)s);

-- name: hold_clock_function
-- A test's hold on every update of an owner's clock while it holds advisory lock 4242
-- (with hold_clock_trigger).
CREATE FUNCTION test_hold_clock() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(4242);
    RETURN NEW;
END $$;

-- name: hold_clock_trigger
CREATE TRIGGER test_hold_clock BEFORE UPDATE ON owner_clocks
    FOR EACH ROW EXECUTE FUNCTION test_hold_clock();

-- name: take_clock_hold
SELECT pg_advisory_lock(4242);

-- name: release_clock_hold
SELECT pg_advisory_unlock(4242);

-- name: stamps_by_the_function
SELECT darkroom_fair_stamps(%(owner)s, %(priority)s, %(n)s);

-- name: interactive_head
SELECT vtime AS interactive_vtime, vowner AS interactive_vowner FROM fair_heads
WHERE priority = 'interactive' ORDER BY vtime DESC, vowner DESC LIMIT 1;

-- name: first_waiting_stamp
SELECT min(fair_stamp) AS stamp FROM archive_files WHERE status = 'queued';

-- name: previous_release_moves_the_head
-- What a claim of the release before migration 0021 wrote.
UPDATE fair_clock SET interactive_vtime = %(vtime)s, interactive_vowner = %(vowner)s;

-- name: bulk_credit
SELECT bulk_credit FROM fair_clock;

-- Events ----------------------------------------------------------------------------------

-- name: events
-- A card's history (or everyone's), of one kind or all.
SELECT * FROM archive_events
WHERE (%(id)s::uuid IS NULL OR file_id = %(id)s::uuid)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
ORDER BY id;

-- name: event_kinds
SELECT kind FROM archive_events WHERE file_id = %(id)s ORDER BY id;

-- name: event_log
SELECT kind, worker, error_code FROM archive_events WHERE file_id = %(id)s ORDER BY id;

-- name: last_event
SELECT coalesce(max(id), 0) AS m FROM archive_events;

-- name: claims_after
SELECT file_id FROM archive_events WHERE kind = 'claimed' AND id > %(after)s ORDER BY id;

-- name: moves_after
SELECT count(*) AS n FROM archive_events WHERE kind IN ('claimed', 'ready') AND id > %(after)s;

-- name: claimed_among
SELECT DISTINCT file_id FROM archive_events WHERE kind = 'claimed' AND file_id = ANY(%(ids)s);

-- name: claim_counts
-- Claims made, and distinct cards claimed.
SELECT count(*) AS claims, count(DISTINCT file_id) AS cards FROM archive_events
WHERE kind = 'claimed';

-- name: lease_lost_count
SELECT count(*) AS n FROM archive_events WHERE kind = 'lease_lost';

-- name: retries_of
SELECT kind, worker, error_code FROM archive_events WHERE file_id = %(id)s AND kind = 'retried';

-- name: retried_by
SELECT worker FROM archive_events WHERE file_id = %(id)s AND kind = 'retried';

-- name: retries
SELECT file_id::text, worker, error_code FROM archive_events WHERE kind = 'retried'
ORDER BY file_id;

-- name: retried_files_by
SELECT file_id::text, worker FROM archive_events WHERE kind = 'retried' ORDER BY file_id;

-- name: retried_cards
SELECT f.status, f.attempts, f.priority, e.worker
FROM archive_files f JOIN archive_events e ON e.file_id = f.id
WHERE e.kind = 'retried';

-- Orphans ---------------------------------------------------------------------------------

-- name: orphans
SELECT object_key, reason FROM orphan_objects;

-- name: orphans_by_key
SELECT object_key, reason FROM orphan_objects ORDER BY object_key;

-- name: orphan_tokens
SELECT object_key, token FROM orphan_objects;

-- name: orphan_failures
SELECT object_key, failures FROM orphan_objects;

-- name: orphan_reason
SELECT reason FROM orphan_objects WHERE object_key = %(key)s;

-- name: unpublished_attempts
SELECT token FROM unpublished_attempts;

-- name: orphan_count
SELECT count(*) AS n FROM orphan_objects;

-- name: superseded_orphans
SELECT object_key FROM orphan_objects WHERE reason = 'superseded';

-- name: quiet_for
-- True once nothing has changed for `g` seconds and nothing waits for the sweeper: no new
-- orphan, no deleted or pending card, no card touched.
SELECT NOT EXISTS (SELECT 1 FROM orphan_objects
                   WHERE created_at >= now() - make_interval(secs => %(g)s))
   AND NOT EXISTS (SELECT 1 FROM unpublished_attempts
                   WHERE ended_at >= now() - make_interval(secs => %(g)s))
   AND NOT EXISTS (SELECT 1 FROM archive_files WHERE status IN ('deleting', 'pending'))
   AND (SELECT coalesce(max(updated_at), '-infinity') FROM archive_files)
       < now() - make_interval(secs => %(g)s) AS past;

-- name: past_guard
-- True once every orphan and every deleted card is older than the guard interval `g`.
SELECT NOT EXISTS (SELECT 1 FROM orphan_objects
                   WHERE created_at >= now() - make_interval(secs => %(g)s))
   AND NOT EXISTS (SELECT 1 FROM unpublished_attempts
                   WHERE ended_at >= now() - make_interval(secs => %(g)s))
   AND NOT EXISTS (SELECT 1 FROM archive_files WHERE status = 'deleting'
                   AND deleted_at >= now() - make_interval(secs => %(g)s)) AS past;

-- Keys, idempotency, pauses, the sweeper's schedule -------------------------------------

-- name: api_key_rows
SELECT key_hash, owner, admin FROM api_keys;

-- name: idempotency_key_count
SELECT count(*) AS n FROM idempotency_keys;

-- name: claim_pause_log
SELECT kind, owner, actor FROM claim_pause_events ORDER BY id;

-- name: claim_pause_event_count
SELECT count(*) AS n FROM claim_pause_events;

-- name: pause_claims_unlogged
-- A pause another writer took, without the product's event (a racing writer's row).
INSERT INTO claim_pauses (owner, paused_by) VALUES (%(owner)s, %(actor)s);

-- name: worker_pause_count
SELECT count(*) AS n FROM worker_pauses;

-- name: worker_paused
SELECT count(*) AS n FROM worker_pauses WHERE worker = %(worker)s;

-- name: worker_paused_long
SELECT seen_at - since >= make_interval(secs => %(seconds)s) AS long FROM worker_pauses
WHERE worker = %(worker)s;

-- name: worker_pause_seconds
SELECT extract(epoch FROM seen_at - since)::float8 AS s FROM worker_pauses
WHERE worker = %(worker)s;

-- name: schedule
-- The sweeper's turns: how many, and whether the next is in the future.
SELECT count(*) AS n, min(next_run_at) > now() AS later FROM maintenance_schedule;

-- Moving the clock: the state a test would otherwise wait for --------------------------

-- name: expire_lease
UPDATE archive_files SET lease_until = now() - interval '1 second' WHERE id = %(id)s;

-- name: expire_processing_lease
UPDATE archive_files SET lease_until = now() - interval '1 second'
WHERE id = %(id)s AND status = 'processing';

-- name: expire_every_lease
UPDATE archive_files SET lease_until = now() - interval '1 second';

-- name: make_due
UPDATE archive_files SET available_at = now();

-- name: age_cards
UPDATE archive_files SET created_at = now() - interval '2 days' WHERE id = ANY(%(ids)s);

-- name: age_cards_but
UPDATE archive_files SET created_at = now() - interval '2 days' WHERE id <> %(id)s;

-- name: age_every_card
UPDATE archive_files SET created_at = now() - interval '2 days';

-- name: age_rejection
UPDATE archive_files SET finished_at = now() - interval '2 hours' WHERE id = %(id)s;

-- name: an_hour_ago
SELECT now() - interval '1 hour' AS t;

-- name: age_idempotency_key
UPDATE idempotency_keys SET created_at = now() - interval '25 hours' WHERE file_id = %(id)s;

-- name: age_orphans
-- Orphan rows made an hour ago.
UPDATE orphan_objects SET created_at = now() - interval '1 hour',
                          next_try_at = now() - interval '1 hour';

-- name: retry_orphans_now
UPDATE orphan_objects SET next_try_at = now();

-- Poking state the product never writes so -----------------------------------------------

-- name: drop_cards
-- Cards lost without the product's delete (a restore from an older backup).
DELETE FROM archive_files WHERE id = ANY(%(ids)s);

-- name: set_original_key
-- A card made before owners were in the key.
UPDATE archive_files SET original_key = %(key)s WHERE id = %(id)s;

-- name: set_deferrals
UPDATE archive_files SET deferrals = %(deferrals)s WHERE id = %(id)s;

-- name: truncate_queue
TRUNCATE archive_files, archive_events, orphan_objects, unpublished_attempts,
         maintenance_schedule, owner_clocks
CASCADE;

-- name: reset_fair_clock
WITH heads AS (DELETE FROM fair_heads)
UPDATE fair_clock SET interactive_vtime = 0, bulk_vtime = 0, interactive_vowner = '',
                      bulk_vowner = '', bulk_credit = 0;

-- Seeding many cards at once (their keys from darkroom.layout, passed in) -----------------

-- name: seed_queued
INSERT INTO archive_files (id, owner, filename, content_type, size_bytes, original_key,
                           original_version, status)
SELECT id, %(owner)s, 'f' || i || '.jpg', 'image/jpeg', 1, k, 'v1', 'queued'
FROM unnest(%(ids)s::uuid[], %(keys)s::text[]) WITH ORDINALITY AS t(id, k, i);

-- name: seed_ready
-- Ready cards made with other settings (derive fingerprint 'old').
INSERT INTO archive_files (id, owner, filename, content_type, size_bytes, original_key,
                           original_version, status, attempts, derived_key, sha256,
                           derive_fingerprint)
SELECT id, o, 'f.jpg', 'image/jpeg', 1, k, 'v1', 'ready', 1, d, repeat('0', 64), 'old'
FROM unnest(%(ids)s::uuid[], %(owners)s::text[], %(keys)s::text[], %(derived)s::text[])
     AS t(id, o, k, d);

-- name: seed_rejected
-- Cards rejected for `codes`, `days` ago.
INSERT INTO archive_files (id, owner, filename, content_type, size_bytes, original_key,
                           original_version, status, attempts, error_code, finished_at)
SELECT id, o, 'f.jpg', 'image/jpeg', 1, k, 'v1', 'rejected', 3, c,
       now() - make_interval(days => d)
FROM unnest(%(ids)s::uuid[], %(owners)s::text[], %(keys)s::text[], %(codes)s::text[],
            %(days)s::int[]) AS t(id, o, k, c, d);

-- name: seed_later_bulk
-- One bulk card not due for an hour (no worker takes it).
INSERT INTO archive_files (id, owner, filename, content_type, size_bytes, original_key,
                           original_version, status, available_at, priority)
VALUES (%(id)s, %(owner)s, 'x.jpg', 'image/jpeg', 1, %(key)s, 'v1', 'queued',
        now() + interval '1 hour', 'bulk');

-- Lock waits: a test waits for a statement to block, never for a clock -----------------

-- name: lock_waiters
SELECT count(*) AS n FROM pg_stat_activity
WHERE wait_event_type = 'Lock' AND datname = current_database();

-- name: lock_waiters_on
-- Sessions waiting on a lock whose statement contains `text`.
SELECT count(*) AS n FROM pg_stat_activity
WHERE wait_event_type = 'Lock' AND query LIKE '%%' || %(text)s || '%%';

-- name: advisory_lock_waiters
SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted;

-- Migrations ------------------------------------------------------------------------------

-- name: applied_migrations
SELECT name FROM darkroom_migrations;

-- name: queue_table_exists
SELECT to_regclass('archive_files') IS NOT NULL AS made;

-- name: lock_card
-- Hold a card's row lock (in the caller's open transaction), as a slow writer would.
SELECT 1 FROM archive_files WHERE id = %(id)s FOR UPDATE;

-- name: add_later_columns
-- What a later migration does (it only adds): a column in each table this release does
-- not know.
ALTER TABLE archive_files ADD COLUMN later text DEFAULT 'x';
ALTER TABLE archive_events ADD COLUMN later text;

-- name: db_now
SELECT now();

-- name: take_over_lease
-- Another attempt's token on a card (left uncommitted by a test, its row stays locked).
UPDATE archive_files SET lease_token = gen_random_uuid() WHERE id = %(id)s;

-- name: takeover_of_lease
-- Whether a card held under `token` was taken over by another attempt, and whether that
-- token settled it.
-- published_before_cut: by a commit whose transaction began before `cut`.
SELECT count(*) FILTER (WHERE kind IN ('claimed', 'expired', 'exhausted')
                        AND token IS DISTINCT FROM %(t)s) AS taken,
       count(*) FILTER (WHERE kind IN ('ready', 'rejected', 'exhausted')
                        AND token = %(t)s) AS published,
       count(*) FILTER (WHERE kind = 'ready' AND token = %(t)s
                        AND created_at <= %(cut)s::timestamptz) > 0 AS published_before_cut
FROM archive_events WHERE file_id = %(id)s;

-- name: lost_answer_card
-- What a write whose answer was lost may have changed on a card.
SELECT status, attempts, deferrals, original_version, error_code
FROM archive_files WHERE id = %(id)s;

-- name: clear_claim_pauses
DELETE FROM claim_pauses;

-- name: add_claim_pause
INSERT INTO claim_pauses (owner, priority, paused_by) VALUES (%(owner)s, %(priority)s, 't');

-- name: held_by_a_pause
-- Whether the claim's test of a card (migration 0018) holds it back.
SELECT %(owner)s::text <> ALL (darkroom_paused_owners(%(priority)s)) IS NOT TRUE AS held;

-- name: seed_stamped_line
-- Queued cards of one owner and class, fair-stamped in the order given (1, 2, ...).
INSERT INTO archive_files (id, owner, filename, content_type, size_bytes, original_key,
                           original_version, status, priority, fair_stamp)
SELECT id, %(owner)s, 'f.jpg', 'image/jpeg', 1, k, 'v1', 'queued', %(priority)s, i
FROM unnest(%(ids)s::uuid[], %(keys)s::text[]) WITH ORDINALITY AS t(id, k, i);

-- name: analyze_cards
ANALYZE archive_files;

-- name: event_kind_counts
-- How many ready, claimed and lease_lost events there are, by kind.
SELECT kind, count(*) FROM archive_events
WHERE kind IN ('ready', 'claimed', 'lease_lost')
GROUP BY kind ORDER BY kind;

-- Plans ------------------------------------------------------------------------------------

-- name: plans_of_prepared
-- How this session has planned each of its prepared statements so far.
SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements;

-- Test databases made new (tests/support/postgres.py) --------------------------------------

-- name: terminate_sessions
-- Every session on a database but this one, each waited for until it has ended.
SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity
WHERE datname = %(name)s AND pid <> pg_backend_pid();

-- name: own_tables
SELECT relname FROM pg_class
WHERE relnamespace = 'public'::regnamespace AND relkind IN ('r', 'p')
ORDER BY relname;

-- name: own_tables_written
-- The tables with anything on disk (rows, or the pages of rows deleted since).
SELECT relname FROM pg_class
WHERE relnamespace = 'public'::regnamespace AND relkind IN ('r', 'p')
  AND pg_relation_size(oid) > 0
ORDER BY relname;

-- name: own_sequences
SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace AND relkind = 'S'
ORDER BY relname;

-- name: forget_statistics
-- A clone of the template has never been analysed; a test that analysed its rows must not
-- hand its statistics to the next test's planner.
DELETE FROM pg_statistic
WHERE starelid IN (SELECT oid FROM pg_class WHERE relnamespace = 'public'::regnamespace);

-- name: set_sequence
SELECT setval(%(seq)s::regclass, %(last)s, %(called)s);

-- name: schema_fingerprint
-- Everything a test could change in a database besides its rows, by definition: its
-- schemas, relations (with their options and grants), columns, defaults, constraints,
-- indexes, functions, triggers, rules, policies, types, extensions and the database's own
-- settings. A database made new must match its template's.
SELECT md5(string_agg(d, E'\n' ORDER BY d)) AS fingerprint FROM (
    SELECT 'schema ' || nspname || ' ' || coalesce(nspacl::text, '') FROM pg_namespace
    UNION ALL
    SELECT 'rel ' || c.oid::regclass::text || ' ' || c.relkind::text || ' '
           || coalesce(c.reloptions::text, '') || ' ' || coalesce(c.relacl::text, '')
           || ' ' || c.relrowsecurity::text || ' ' || c.relpersistence::text
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')
    UNION ALL
    SELECT 'col ' || a.attrelid::regclass::text || ' ' || a.attname || ' '
           || format_type(a.atttypid, a.atttypmod) || ' ' || a.attnotnull::text || ' '
           || a.attidentity::text || a.attgenerated::text || ' '
           || coalesce(pg_get_expr(ad.adbin, ad.adrelid), '')
    FROM pg_attribute a
    JOIN pg_class c ON c.oid = a.attrelid
    JOIN pg_namespace n ON n.oid = c.relnamespace
    LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
    WHERE a.attnum > 0 AND NOT a.attisdropped
      AND n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')
    UNION ALL
    SELECT 'con ' || conrelid::regclass::text || ' ' || contypid::regtype::text || ' '
           || conname || ' ' || pg_get_constraintdef(oid)
    FROM pg_constraint
    WHERE connamespace NOT IN ('pg_catalog'::regnamespace, 'information_schema'::regnamespace)
    UNION ALL
    SELECT 'index ' || pg_get_indexdef(i.indexrelid)
    FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
    WHERE c.relnamespace NOT IN ('pg_catalog'::regnamespace, 'pg_toast'::regnamespace,
                                 'information_schema'::regnamespace)
    UNION ALL
    SELECT 'function ' || p.oid::regprocedure::text || ' ' || p.prokind::text || ' '
           || md5(p.prosrc) || ' ' || coalesce(p.proconfig::text, '') || ' '
           || p.provolatile::text || p.prosecdef::text || ' ' || coalesce(p.proacl::text, '')
    FROM pg_proc p
    WHERE p.pronamespace NOT IN ('pg_catalog'::regnamespace, 'information_schema'::regnamespace)
    UNION ALL
    SELECT 'trigger ' || pg_get_triggerdef(oid) || ' ' || tgenabled::text FROM pg_trigger
    WHERE NOT tgisinternal
    UNION ALL
    SELECT 'event trigger ' || evtname || ' ' || evtevent || ' ' || evtenabled::text
    FROM pg_event_trigger
    UNION ALL
    SELECT 'rule ' || ev_class::regclass::text || ' ' || rulename || ' ' || pg_get_ruledef(oid)
    FROM pg_rewrite
    WHERE ev_class IN (SELECT c.oid FROM pg_class c
                       WHERE c.relnamespace NOT IN ('pg_catalog'::regnamespace,
                                                    'information_schema'::regnamespace))
    UNION ALL
    SELECT 'policy ' || polrelid::regclass::text || ' ' || polname || ' ' || polcmd::text || ' '
           || coalesce(pg_get_expr(polqual, polrelid), '') || ' '
           || coalesce(pg_get_expr(polwithcheck, polrelid), '')
    FROM pg_policy
    UNION ALL
    SELECT 'type ' || t.oid::regtype::text || ' ' || t.typtype::text FROM pg_type t
    WHERE t.typnamespace NOT IN ('pg_catalog'::regnamespace,
                                 'information_schema'::regnamespace, 'pg_toast'::regnamespace)
      AND t.typrelid = 0
    UNION ALL
    SELECT 'extension ' || extname || ' ' || extversion FROM pg_extension
    UNION ALL
    SELECT 'setting ' || coalesce(setrole::regrole::text, '') || ' ' || setconfig::text
    FROM pg_db_role_setting
    WHERE setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())
    UNION ALL
    SELECT 'database ' || datallowconn::text || ' ' || datconnlimit::text || ' ' || coalesce(datacl::text, '')
    FROM pg_database WHERE datname = current_database()
) AS s(d);

-- name: database_oid
-- Which database this is, whatever it is called now.
SELECT oid FROM pg_database WHERE datname = current_database();

-- name: fair_clock
SELECT c.*, h.priority, h.lane, h.vtime, h.vowner
FROM fair_clock c LEFT JOIN fair_heads h ON true ORDER BY h.priority, h.lane;

-- name: event_count
SELECT count(*) AS n FROM archive_events;

-- name: statistics_count
SELECT count(*) AS n FROM pg_statistic
WHERE starelid IN (SELECT oid FROM pg_class WHERE relnamespace = 'public'::regnamespace);

-- name: notify_cards_channel
-- A notification of the test's own on the cards' channel.
SELECT pg_notify('darkroom_cards', %(payload)s);

-- name: lock_owner_clock
-- Hold an owner's clock row (in the caller's open transaction), as a slow stamping would.
SELECT 1 FROM owner_clocks WHERE owner = %(owner)s AND priority = %(priority)s FOR UPDATE;

-- name: break_status
UPDATE archive_files SET status = 'lost' WHERE id = %(id)s;

-- name: break_priority
UPDATE archive_files SET priority = 'urgent' WHERE id = %(id)s;

-- name: break_original_sha256
UPDATE archive_files SET original_sha256 = 'NOT-A-DIGEST' WHERE id = %(id)s;

-- name: break_attempts
UPDATE archive_files SET attempts = -1 WHERE id = %(id)s;

-- name: break_size_bytes
UPDATE archive_files SET size_bytes = -1 WHERE id = %(id)s;

-- name: break_lease_while_queued
UPDATE archive_files SET lease_token = gen_random_uuid(), lease_until = now() WHERE id = %(id)s;

-- name: break_ready_without_derivative
UPDATE archive_files SET status = 'ready' WHERE id = %(id)s;

-- name: break_rejected_without_code
UPDATE archive_files SET status = 'rejected' WHERE id = %(id)s;

-- name: break_event_kind
INSERT INTO archive_events (file_id, kind) VALUES (%(id)s, 'nonsense');

-- name: card_watch_until
-- The end of the pages' watch (migration 0024).
SELECT until FROM card_watch;

-- name: lock_cards_like_vacuum
-- The lock VACUUM, ANALYZE and CREATE INDEX CONCURRENTLY hold on the cards' table.
LOCK TABLE archive_files IN SHARE UPDATE EXCLUSIVE MODE;

-- name: end_card_watch
-- The pages' watch ended by the database's clock (as if that clock stepped forward).
UPDATE card_watch SET until = now() - interval '1 second';

-- name: delete_card_unnoticed
-- A delete the pages were not told of (as one made while their notices were down).
UPDATE archive_files
SET status = 'deleting', lease_token = NULL, lease_until = NULL, deleted_at = now(),
    updated_at = now()
WHERE id = %(id)s;

-- name: notify_cards
-- The pages' notice of `changed` ([[owner, id, status], ...]) as a status change sends it.
SELECT darkroom_notify_cards(%(changed)s::json);

-- name: set_status_unnoticed
-- A card moved between queued and ready (its derivative kept) without the pages told.
UPDATE archive_files SET status = %(status)s, updated_at = now() WHERE id = %(id)s;

-- name: set_created_at
-- A card's time of creation, to the microsecond (the listing's order).
UPDATE archive_files SET created_at = %(at)s WHERE id = %(id)s;

-- name: first_created_at
-- When the first card was created.
SELECT min(created_at) FROM archive_files;
