-- Nothing stored is deleted because its record was lost (a failover that lost
-- acknowledged commits, a restore from an older backup). Two events record it:
-- 'upload_found': an expired pending card whose upload is in the store was confirmed by
--   the sweeper instead of being purged with its bytes;
-- 'restored': `darkroom reconcile --restore` made a card for an original no card held.
-- The kinds' CHECK is extended, not restated (as in 0006), so kinds other migrations add
-- are kept whatever order they were applied in.
DO $$
DECLARE
    name text;
    def  text;
BEGIN
    SELECT conname, pg_get_constraintdef(oid) INTO name, def
    FROM pg_constraint
    WHERE conrelid = 'archive_events'::regclass AND contype = 'c'
      AND pg_get_constraintdef(oid) LIKE '%kind%';
    IF def IS NOT NULL AND def NOT LIKE '%''upload_found''%' THEN
        EXECUTE format('ALTER TABLE archive_events DROP CONSTRAINT %I', name);
        EXECUTE format('ALTER TABLE archive_events ADD CONSTRAINT %I %s NOT VALID', name,
                       replace(def, 'ARRAY[',
                               'ARRAY[''upload_found''::text, ''restored''::text, '));
        EXECUTE format('ALTER TABLE archive_events VALIDATE CONSTRAINT %I', name);
    END IF;
END $$;
