-- The same rules, checked for less. PostgreSQL prepares a table's CHECK constraints anew
-- for every statement that writes a row of it (from their stored form), so the nine on
-- archive_files and the one on archive_events cost every claim and every commit a share
-- of its server time that does not shrink with fewer rows: about a tenth of the database's
-- CPU per job for a worker of a few slots (docs/BENCHMARKS.md, Fleet). A domain's rule is
-- kept prepared by the server, and checked only where a value of it is written; the
-- rules that tie columns together stay a CHECK, as one constraint.

CREATE DOMAIN card_status AS text
    CHECK (VALUE IN ('pending', 'queued', 'processing', 'ready', 'rejected', 'deleting'));
CREATE DOMAIN card_priority AS text CHECK (VALUE IN ('interactive', 'bulk'));
CREATE DOMAIN sha256_hex AS text CHECK (VALUE ~ '^[0-9a-f]{64}$');
CREATE DOMAIN card_count AS integer CHECK (VALUE >= 0);
CREATE DOMAIN byte_count AS bigint CHECK (VALUE >= 0);

ALTER TABLE archive_files
    DROP CONSTRAINT archive_files_status_check,
    DROP CONSTRAINT archive_files_priority,
    DROP CONSTRAINT archive_files_original_sha256_check,
    DROP CONSTRAINT archive_files_attempts_check,
    DROP CONSTRAINT archive_files_deferrals,
    DROP CONSTRAINT archive_files_size_bytes_check,
    DROP CONSTRAINT lease_iff_processing,
    DROP CONSTRAINT ready_has_derivative,
    DROP CONSTRAINT rejected_has_code,
    -- Binary-compatible: the table is not rewritten, its rows are checked once.
    ALTER COLUMN status TYPE card_status,
    ALTER COLUMN priority TYPE card_priority,
    ALTER COLUMN original_sha256 TYPE sha256_hex,
    ALTER COLUMN attempts TYPE card_count,
    ALTER COLUMN deferrals TYPE card_count,
    ALTER COLUMN size_bytes TYPE byte_count,
    -- A lease exists exactly while a card is processing: no state can hold a stale token.
    -- A ready card has its derivative; a rejected one says why.
    ADD CONSTRAINT card_states CHECK (
        (status = 'processing') = (lease_token IS NOT NULL AND lease_until IS NOT NULL)
        AND (status <> 'ready' OR (derived_key IS NOT NULL AND sha256 IS NOT NULL))
        AND (status <> 'rejected' OR error_code IS NOT NULL));

-- The events' kinds, as they stand after the migrations that extended them (each extended
-- the CHECK, not restated it, so the list is read from it, not written here again).
DO $$
DECLARE
    def text;
BEGIN
    SELECT pg_get_constraintdef(oid) INTO STRICT def
    FROM pg_constraint
    WHERE conrelid = 'archive_events'::regclass AND conname = 'archive_events_kind_check';
    EXECUTE format('CREATE DOMAIN event_kind AS text %s',
                   replace(def, '(kind = ANY', '(VALUE = ANY'));
END $$;
ALTER TABLE archive_events
    DROP CONSTRAINT archive_events_kind_check,
    ALTER COLUMN kind TYPE event_kind;
