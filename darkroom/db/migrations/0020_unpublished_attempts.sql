-- An attempt's objects are accounted for when its lease ends without publishing them, by
-- the database itself, whatever statement ends it: a failure, a deferral, a hand-back, a
-- revoke, a rescue of an expired lease, a run out of attempts, a row deleted. Claims and
-- publications, the path every job takes, write nothing for it (they used to register
-- both keys of every attempt at the claim and take them back at publication: four writes
-- per job for the rare attempt that never publishes).
--
-- The row names the attempt, not its objects: the keys are layout.py's ATTEMPT_KEYS,
-- which the sweeper fills in when it moves these rows to orphan_objects
-- (sweep_unpublished_attempts), so the key layout is spelled in one place.
CREATE TABLE unpublished_attempts (
    token     uuid        PRIMARY KEY,
    file_id   uuid        NOT NULL,
    ended_at  timestamptz NOT NULL DEFAULT now()
);

CREATE FUNCTION darkroom_attempt_unpublished() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO unpublished_attempts (token, file_id) VALUES (OLD.lease_token, OLD.id)
    ON CONFLICT (token) DO NOTHING;
    RETURN NULL;
END $$;

-- A lease ends when its token leaves the row (CHECK lease_iff_processing: every status
-- change out of processing sets lease_token). It published when the card now shows a
-- derivative whose key carries that token: every attempt's keys do, and no other
-- attempt's can.
CREATE TRIGGER archive_files_lease_ended
AFTER UPDATE OF lease_token ON archive_files
FOR EACH ROW
WHEN (OLD.lease_token IS NOT NULL
      AND NEW.lease_token IS DISTINCT FROM OLD.lease_token
      AND (NEW.derived_key IS NULL OR strpos(NEW.derived_key, OLD.lease_token::text) = 0))
EXECUTE FUNCTION darkroom_attempt_unpublished();

CREATE TRIGGER archive_files_leased_deleted
AFTER DELETE ON archive_files
FOR EACH ROW
WHEN (OLD.lease_token IS NOT NULL)
EXECUTE FUNCTION darkroom_attempt_unpublished();
