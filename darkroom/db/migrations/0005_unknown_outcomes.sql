-- Statements whose answer was lost. On a real network a statement can commit
-- while its sender sees an error; the sender repeats it, and the repeat must be recognized
-- as the same attempt's success rather than as a lost lease.

-- The token of the last attempt that ended by its own statement (complete, fail, defer or
-- release). A repeat of that statement finds its token here after the lease is cleared.
ALTER TABLE archive_files ADD COLUMN settled_token uuid;

-- A card handed back because the object store was down: the attempt is given back too,
-- so an outage spends no attempts.
ALTER TABLE archive_events DROP CONSTRAINT archive_events_kind_check;
ALTER TABLE archive_events ADD CONSTRAINT archive_events_kind_check CHECK (kind IN (
    'claimed', 'lease_lost', 'retry_scheduled', 'rejected', 'ready', 'exhausted',
    'released', 'revoked', 'deferred'));

-- An orphan whose delete failed (permissions, object lock) is retried with backoff and
-- never blocks the rest; taking a batch moves next_try_at forward, so no row lock is held
-- while the store is called.
ALTER TABLE orphan_objects ADD COLUMN failures integer NOT NULL DEFAULT 0;
ALTER TABLE orphan_objects ADD COLUMN next_try_at timestamptz NOT NULL DEFAULT now();
ALTER TABLE orphan_objects DROP CONSTRAINT orphan_objects_reason_check;
ALTER TABLE orphan_objects ADD CONSTRAINT orphan_objects_reason_check
    CHECK (reason IN ('attempt', 'lease_lost', 'superseded', 'reconcile'));
DROP INDEX orphan_objects_created;
CREATE INDEX orphan_objects_due ON orphan_objects (next_try_at);

-- Workers that stopped claiming because the object store is failing (the store breaker),
-- so that `darkroom stats` can say so. A row is refreshed while the pause lasts; a row
-- not refreshed for a while belongs to a worker that is gone.
CREATE TABLE worker_pauses (
    worker      text PRIMARY KEY,
    reason      text        NOT NULL,
    since       timestamptz NOT NULL DEFAULT now(),
    seen_at     timestamptz NOT NULL DEFAULT now()
);

-- Maintenance that one sweeper of many should run per interval (reconciliation): the
-- sweeper that moves next_run_at forward runs it.
CREATE TABLE maintenance_schedule (
    unit        text PRIMARY KEY,
    next_run_at timestamptz NOT NULL DEFAULT now()
);
