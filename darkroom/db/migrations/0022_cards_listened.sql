-- Card notifications (migration 0009) are sent only while a page may be listening. Every
-- transaction that NOTIFYs takes one cluster-wide lock from its COMMIT's start to its end,
-- WAL flush included, so every status change waited on every other one's flush
-- (bench/fleet.py: at 2,000 slots the claim p50 went from 19-665 ms to 3-4 ms without it).
--
-- The API's event hubs announce that they listen (darkroom_cards_announce): the sequence
-- holds the epoch second the announces hold until, renewed while pages are open. A
-- sequence, because its value is read as it is now, not as a statement's snapshot saw it.
-- A statement that reads an announce gone by sends nothing. A hub that cannot tell its
-- announce held all along waits, before its pages read or re-read, for every transaction
-- that was running (api/events.py), so what such a statement changed is in what they read.
CREATE SEQUENCE darkroom_cards_listened_until MINVALUE 0 START 0;

CREATE OR REPLACE FUNCTION darkroom_notify_cards(changed json) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    payload text;
BEGIN
    -- Called after the statement's rows changed, so its transaction already has the id
    -- the hub waits on.
    IF changed IS NULL
       OR (SELECT last_value FROM darkroom_cards_listened_until) < extract(epoch FROM now())
    THEN
        RETURN;
    END IF;
    payload := json_build_object('c', changed)::text;
    IF octet_length(payload) > 7900 THEN
        payload := '{"o": "*"}';
    END IF;
    PERFORM pg_notify('darkroom_cards', payload);
END;
$$;

-- One hub's announce, held for `seconds`: answers the second it now holds until and the
-- clock read after it was set. Announces take turns (the advisory lock), so the value only
-- grows. The announce takes a transaction id of its own: a snapshot taken after it commits
-- lists every transaction that read the value before it (each had its id by then: it
-- reads the value after its rows changed), even one whose id is the newest.
CREATE FUNCTION darkroom_cards_announce(seconds integer, OUT until bigint, OUT at float8)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(7237954466152445234);  -- 'darkroom cards' announces
    PERFORM pg_current_xact_id();
    until := greatest((SELECT last_value FROM darkroom_cards_listened_until),
                      ceil(extract(epoch FROM clock_timestamp()) + seconds)::bigint);
    PERFORM setval('darkroom_cards_listened_until', until);
    at := extract(epoch FROM clock_timestamp());
END $$;

-- A database that held a previous release may still have API processes of it serving
-- pages, whose hubs never announce: for an hour after this migration every statement
-- notifies, as before, while a rolling deploy replaces them. A new database has none.
SELECT setval('darkroom_cards_listened_until', ceil(extract(epoch FROM now()) + 3600)::bigint)
WHERE EXISTS (SELECT 1 FROM darkroom_migrations WHERE applied_at < now() - interval '1 minute');
