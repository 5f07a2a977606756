-- Card notifications only while a page watches (darkroom/watch.py). A transaction that
-- NOTIFYs holds one cluster-wide lock from its commit's start to its end, WAL flush
-- included, so every status change paid for the pages' notices in commits taken one at a
-- time, whether or not any page was open (docs/BENCHMARKS.md, Fleet). Now the API moves
-- `until` forward while it has a page open, and a status change notifies only before it.

-- One row: the end of the pages' watch, by the database's clock. Every API process moves
-- it forward (never back) while it has a page open; nobody deletes it.
CREATE TABLE card_watch (
    one   boolean PRIMARY KEY DEFAULT true CHECK (one),
    until timestamptz NOT NULL
);
INSERT INTO card_watch (until) VALUES ('epoch');

-- As migration 0009's, silent unless the watch is on, and naming the owners of a list
-- too long for one notification rather than every owner. VOLATILE (the default) on
-- purpose: each statement in it reads with a snapshot of its own, taken after the
-- calling statement wrote its cards. A change that reads the watch as off is therefore
-- either committed before the watch was turned on, or still running then with its write
-- lock on archive_files held; the API waits for every such transaction before it trusts
-- the notices (watch.py `Watch.turn_on`). Every writer runs at READ COMMITTED.
CREATE OR REPLACE FUNCTION darkroom_notify_cards(changed json) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    payload text;
BEGIN
    IF changed IS NULL THEN
        RETURN;
    END IF;
    -- now() is the transaction's start: a watch that ends while it runs still counts.
    IF NOT EXISTS (SELECT 1 FROM card_watch WHERE until > now()) THEN
        RETURN;
    END IF;
    payload := json_build_object('c', changed)::text;
    -- Too long for a notification's 8000 bytes: the owners alone re-read (a re-derive
    -- of one owner's thousands of cards need not send every page back to the server),
    -- and if even those are too many, every page.
    IF octet_length(payload) > 7900 THEN
        payload := json_build_object('o', (SELECT json_agg(DISTINCT c ->> 0)
                                           FROM json_array_elements(changed) c))::text;
    END IF;
    IF octet_length(payload) > 7900 THEN
        payload := '{"o": "*"}';
    END IF;
    PERFORM pg_notify('darkroom_cards', payload);
END;
$$;
