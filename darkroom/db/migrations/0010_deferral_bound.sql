-- The store's faults are never a file's fault: every store error hands the card back with
-- its attempt given back (defer). Deferrals while the store served other files are the
-- file's own trouble, and are counted here; the DARKROOM_MAX_DEFERRALS-th rejects the card
-- storage_unavailable. A constant default: adding the column rewrites nothing.
ALTER TABLE archive_files
    ADD COLUMN deferrals integer NOT NULL DEFAULT 0
        CONSTRAINT archive_files_deferrals CHECK (deferrals >= 0);

-- A counted deferral's event. The kinds' CHECK is extended, not restated (as in 0006), so
-- kinds other migrations add are kept.
DO $$
DECLARE
    name text;
    def  text;
BEGIN
    SELECT conname, pg_get_constraintdef(oid) INTO name, def
    FROM pg_constraint
    WHERE conrelid = 'archive_events'::regclass AND contype = 'c'
      AND pg_get_constraintdef(oid) LIKE '%kind%';
    IF def IS NOT NULL AND def NOT LIKE '%''deferred_counted''%' THEN
        EXECUTE format('ALTER TABLE archive_events DROP CONSTRAINT %I', name);
        EXECUTE format('ALTER TABLE archive_events ADD CONSTRAINT %I %s NOT VALID', name,
                       replace(def, 'ARRAY[', 'ARRAY[''deferred_counted''::text, '));
        EXECUTE format('ALTER TABLE archive_events VALIDATE CONSTRAINT %I', name);
    END IF;
END $$;
