-- Fair sharing between owners, interactive before bulk, and re-deriving.
--
-- Start-time fair queueing: every card is stamped when it becomes claimable (confirm,
-- re-derive) with a virtual start time from its owner's clock in its priority class, and
-- the claim takes due cards in stamp order through one index. Nothing per owner is read
-- by the claim; the per-owner work is one row lock and two index probes at confirm.

ALTER TABLE archive_files
    ADD COLUMN priority text NOT NULL DEFAULT 'interactive'
        CONSTRAINT archive_files_priority CHECK (priority IN ('interactive', 'bulk')),
    -- The card's virtual start time in its class (see owner_clocks); kept on retry and
    -- hand-back, so a card never loses its place in its owner's line.
    ADD COLUMN fair_stamp float8 NOT NULL DEFAULT 0,
    -- Which derivative settings made derived_key (darkroom.derive.settings_fingerprint).
    ADD COLUMN derive_fingerprint text;

-- Cards already waiting keep their first-in, first-out order.
UPDATE archive_files f SET fair_stamp = w.n
FROM (SELECT id, row_number() OVER (ORDER BY available_at, id) AS n
      FROM archive_files WHERE status = 'queued') w
WHERE f.id = w.id;

-- The claim's index: per class, in stamp order; available_at rides along so that a card
-- in retry backoff is passed over inside the index, without a heap visit.
DROP INDEX archive_files_due;
CREATE INDEX archive_files_due ON archive_files (priority, fair_stamp, available_at)
    WHERE status = 'queued';

-- One virtual clock per owner and class: the stamp given to the owner's latest card and
-- that card's id. While that card still waits, the owner's next card continues the line
-- (stamp + 1/weight); once it has been claimed, the owner's line is empty and the next
-- card joins at the head of the class (the smallest waiting stamp), so past work is
-- neither a credit nor a debt.
CREATE TABLE owner_clocks (
    owner      text   NOT NULL,
    priority   text   NOT NULL CHECK (priority IN ('interactive', 'bulk')),
    stamp      float8 NOT NULL,
    last_file  uuid   NOT NULL,
    PRIMARY KEY (owner, priority)
);

-- An admin's per-owner share (default 1): an owner of weight 2 gets twice the slots of an
-- owner of weight 1 while both have work waiting.
CREATE TABLE owner_weights (
    owner   text   PRIMARY KEY CHECK (length(owner) BETWEEN 1 AND 200),
    weight  float8 NOT NULL CHECK (weight > 0 AND weight <= 1000)
);

-- A re-derive moves a ready card back to queued; its event says so. The kinds' CHECK is
-- extended, not restated (as in 0006), so kinds other migrations add are kept.
DO $$
DECLARE
    name text;
    def  text;
BEGIN
    SELECT conname, pg_get_constraintdef(oid) INTO name, def
    FROM pg_constraint
    WHERE conrelid = 'archive_events'::regclass AND contype = 'c'
      AND pg_get_constraintdef(oid) LIKE '%kind%';
    IF def IS NOT NULL AND def NOT LIKE '%''rederive''%' THEN
        EXECUTE format('ALTER TABLE archive_events DROP CONSTRAINT %I', name);
        EXECUTE format('ALTER TABLE archive_events ADD CONSTRAINT %I %s NOT VALID', name,
                       replace(def, 'ARRAY[', 'ARRAY[''rederive''::text, '));
        EXECUTE format('ALTER TABLE archive_events VALIDATE CONSTRAINT %I', name);
    END IF;
END $$;
