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

-- Status changes pushed to the web page (GET /v1/events): queue.py's statements that
-- change a status (claim, complete, fail, release, revoke) pass the cards they changed,
-- as a JSON array of [owner, id, status], to this function: one notification per
-- statement, whatever the number of cards. A list too long for a notification's 8000
-- bytes is sent as {"o": "*"}, and every open page re-reads what it shows.
-- (A trigger on archive_files did the same without touching the statements, but cost a
-- no-op drain of the queue 25-55 % of its time against 5-7 % for this; bench/page.py.)
CREATE FUNCTION darkroom_notify_cards(changed json) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    payload text;
BEGIN
    IF changed IS NULL THEN
        RETURN;
    END IF;
    payload := json_build_object('c', changed)::text;
    IF octet_length(payload) > 7900 THEN
        payload := '{"o": "*"}';
    END IF;
    PERFORM pg_notify('darkroom_cards', payload);
END;
$$;
