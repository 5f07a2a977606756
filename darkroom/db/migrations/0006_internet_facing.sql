-- Pending cards expire (DARKROOM_PENDING_TTL_SECONDS): the transition pending -> deleting
-- records an 'expired' event. The kinds' CHECK is extended, not restated, so kinds other
-- migrations add are kept whatever order they were applied in.
DO $$
DECLARE
    name text;
    def  text;
BEGIN
    SELECT conname, pg_get_constraintdef(oid) INTO name, def
    FROM pg_constraint
    WHERE conrelid = 'archive_events'::regclass AND contype = 'c'
      AND pg_get_constraintdef(oid) LIKE '%kind%';
    IF def IS NOT NULL AND def NOT LIKE '%''expired''%' THEN
        EXECUTE format('ALTER TABLE archive_events DROP CONSTRAINT %I', name);
        -- NOT VALID, then VALIDATE: the check of existing rows does not block writers.
        EXECUTE format('ALTER TABLE archive_events ADD CONSTRAINT %I %s NOT VALID', name,
                       replace(def, 'ARRAY[', 'ARRAY[''expired''::text, '));
        EXECUTE format('ALTER TABLE archive_events VALIDATE CONSTRAINT %I', name);
    END IF;
END $$;
-- The expiry reads pending cards by age.
CREATE INDEX archive_files_pending ON archive_files (created_at) WHERE status = 'pending';

-- `darkroom keys list` shows, and `darkroom keys revoke` takes, the first characters of
-- a key (dk_ and 9 more: 54 of its 256 random bits), never enough to use it. Keys made
-- before this have none and are named by their hash's first characters instead.
ALTER TABLE api_keys ADD COLUMN key_prefix text CHECK (key_prefix ~ '^dk_[A-Za-z0-9_-]{9}$');
