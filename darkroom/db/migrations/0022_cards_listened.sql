-- Card notifications (migration 0009) are sent only while a page may be listening. Every
-- transaction that NOTIFYs takes one cluster-wide lock from its COMMIT's start to its end,
-- WAL flush included, so every status change waited on every other one's flush
-- (bench/fleet.py, bench/queue.py at 4 workers: about a tenth of PostgreSQL's CPU per job
-- with nobody listening).
--
-- The API's event hub announces that it listens: it sets this sequence to the epoch second
-- its announce holds until, and renews it while pages are open. A sequence, because its
-- value is read as it is now, not as a statement's snapshot saw it. A statement that reads
-- an announce gone by sends nothing; the hub, when it announces after a lapse, waits for
-- every transaction that was running to end before its pages read (api/events.py), so
-- what such a statement changed is in what they read.
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

-- A database that held a previous release may still have API processes of it serving
-- pages, whose hubs never announce: for an hour after this migration every statement
-- notifies, as before, while a rolling deploy replaces them. A new database has none.
SELECT setval('darkroom_cards_listened_until', ceil(extract(epoch FROM now()) + 3600)::bigint)
WHERE EXISTS (SELECT 1 FROM darkroom_migrations WHERE applied_at < now() - interval '1 minute');
