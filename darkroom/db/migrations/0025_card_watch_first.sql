-- The statements that change cards ask whether a page watches before they build the list
-- of changes for the pages (migration 0024): with no page open, a fleet's claims and
-- publications build no JSON at all (a list of a batch's rows, at every statement: about
-- 1 µs of the database's CPU per job on each of the claim and the publication).
--
-- plpgsql, VOLATILE: never inlined, and its read takes a snapshot of its own while the
-- calling statement holds its write lock on archive_files, which is what lets the API
-- wait for every change that read the watch as off (darkroom_notify_cards, 0024).
-- darkroom_notify_cards still reads the watch itself.
CREATE FUNCTION darkroom_cards_watched() RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM card_watch WHERE until > now());
END $$;
