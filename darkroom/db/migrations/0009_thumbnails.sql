-- The thumb (≤ 400 px WebP) and the thumbhash placeholder, published by the same fenced
-- commit as the preview (derived_key and its columns). Cards made before this have none:
-- their thumb answers the preview until they are derived again.
-- Nullable columns without a default: adding them rewrites nothing.
ALTER TABLE archive_files
    ADD COLUMN thumb_key     text,
    ADD COLUMN thumb_version text,
    ADD COLUMN thumb_sha256  text,
    ADD COLUMN thumb_width   integer,
    ADD COLUMN thumb_height  integer,
    ADD COLUMN thumb_bytes   bigint,
    ADD COLUMN thumbhash     text;

-- Status changes pushed to the web page (GET /v1/events). One notification per statement,
-- not per row: a claim or a batched complete of many cards sends one, so a busy queue
-- pays one pg_notify per transaction. It names each card whose status changed as
-- [owner, id, status]; when that list would not fit a notification's 8000 bytes it names
-- only the owners ({"o": [...]}) and their pages re-read what they show.
-- It writes no status: every status change is still one of queue.py's statements.
CREATE FUNCTION darkroom_notify_cards() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    changed jsonb;
    payload text;
BEGIN
    SELECT jsonb_agg(jsonb_build_array(n.owner, n.id, n.status))
      INTO changed
      FROM new_rows n JOIN old_rows o ON o.id = n.id
     WHERE n.status IS DISTINCT FROM o.status;
    IF changed IS NULL THEN
        RETURN NULL;
    END IF;
    payload := jsonb_build_object('c', changed)::text;
    IF octet_length(payload) > 7900 THEN
        SELECT jsonb_build_object('o', jsonb_agg(DISTINCT e ->> 0))::text
          INTO payload
          FROM jsonb_array_elements(changed) e;
        IF octet_length(payload) > 7900 THEN
            payload := '{"o": "*"}';
        END IF;
    END IF;
    PERFORM pg_notify('darkroom_cards', payload);
    RETURN NULL;
END;
$$;

CREATE TRIGGER archive_files_status_notify
    AFTER UPDATE ON archive_files
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION darkroom_notify_cards();
