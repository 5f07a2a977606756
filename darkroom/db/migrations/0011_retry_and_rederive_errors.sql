-- A way back from `rejected` (`darkroom retry`, POST /v1/files/{id}/retry), and re-derives
-- whose failure keeps the photo `ready`.

-- Why the last re-derive of a ready card failed (a public error code), until a re-derive
-- publishes. The card stays ready with its previous derivative and fingerprint, so the
-- next `darkroom rederive` takes it again.
ALTER TABLE archive_files ADD COLUMN rederive_error text;
-- The retry run that re-queued the card last: a run repeated after its answer was lost
-- (same id) passes over the cards it already re-queued, even if one is rejected again.
ALTER TABLE archive_files ADD COLUMN retried_by uuid;

-- 'retried': rejected -> queued, its `worker` naming who asked; 'rederive_failed': a
-- re-derive that failed for good, back to ready. The kinds' CHECK is extended, not
-- restated (as in 0006), so kinds other migrations add are kept.
DO $$
DECLARE
    name text;
    def  text;
    kind text;
BEGIN
    FOREACH kind IN ARRAY ARRAY['retried', 'rederive_failed'] LOOP
        SELECT conname, pg_get_constraintdef(oid) INTO name, def
        FROM pg_constraint
        WHERE conrelid = 'archive_events'::regclass AND contype = 'c'
          AND pg_get_constraintdef(oid) LIKE '%kind%';
        IF def IS NOT NULL AND def NOT LIKE '%''' || kind || '''%' THEN
            EXECUTE format('ALTER TABLE archive_events DROP CONSTRAINT %I', name);
            EXECUTE format('ALTER TABLE archive_events ADD CONSTRAINT %I %s NOT VALID', name,
                           replace(def, 'ARRAY[', 'ARRAY[' || quote_literal(kind) || '::text, '));
            EXECUTE format('ALTER TABLE archive_events VALIDATE CONSTRAINT %I', name);
        END IF;
    END LOOP;
END $$;

-- `darkroom retry` reads rejected cards (by owner, code and time): the few there are, by
-- this partial index, not a scan of the archive.
CREATE INDEX archive_files_rejected_by_owner ON archive_files (owner, finished_at)
    WHERE status = 'rejected';
