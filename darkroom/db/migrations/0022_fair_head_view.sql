-- A class's fair-share head, read in one place (`fair_head`): the greatest (stamp, owner)
-- of its lanes (fair_heads, migration 0021) and of fair_clock's head columns, which a
-- worker of a release before 0021 still moves in a rolling deploy.
CREATE VIEW fair_head AS
SELECT DISTINCT ON (priority) priority, vtime, vowner
FROM (SELECT priority, vtime, vowner FROM fair_heads
      UNION ALL
      SELECT 'interactive', interactive_vtime, interactive_vowner FROM fair_clock
      UNION ALL
      SELECT 'bulk', bulk_vtime, bulk_vowner FROM fair_clock) h
ORDER BY priority, vtime DESC, vowner DESC;

-- The owner's clock moved on from `prev` by `n` cards (the last one's stamp), by the rule
-- of migration 0012, against the head and the owner's weight as they stand when it is
-- called. It is called in the SET of the statement that moves the clock row, so it runs
-- once that row is locked (again, if the statement waited for the lock): a stamp never
-- comes from a head that claims moved past while it waited. VOLATILE, so its read sees
-- what committed meanwhile.
CREATE FUNCTION darkroom_fair_next(prev float8, card_owner text, card_priority text,
                                   n integer DEFAULT 1)
RETURNS float8 LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    w       float8;
    v       float8;
    v_owner text;
BEGIN
    SELECT coalesce((SELECT weight FROM owner_weights WHERE owner = card_owner), 1),
           coalesce(h.vtime, 0), coalesce(h.vowner, '')
    INTO w, v, v_owner
    FROM (SELECT) one LEFT JOIN fair_head h ON h.priority = card_priority;
    RETURN darkroom_fair_start(prev, v, v_owner, card_owner, w) + (n - 1) / w;
END $$;

-- The same stamps as before (migration 0021), worked out once the owner's clock row is
-- locked: the row is made if missing (at -infinity, the clock of an owner with no card
-- yet, never committed as such), locked, and only then are the head and the weight read,
-- once, for the clock and for the spacing of a batch alike. A confirm moves the clock row
-- itself (queries.sql `confirm`), and calls this only for an owner's first card.
CREATE OR REPLACE FUNCTION darkroom_fair_stamps(card_owner text, card_priority text,
                                                n integer DEFAULT 1)
RETURNS float8[] LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    prev    float8;
    w       float8;
    v       float8;
    v_owner text;
    last    float8;
BEGIN
    IF n < 1 THEN
        RETURN ARRAY[]::float8[];
    END IF;
    INSERT INTO owner_clocks (owner, priority, stamp)
    VALUES (card_owner, card_priority, '-infinity')
    ON CONFLICT (owner, priority) DO NOTHING;
    SELECT stamp INTO prev FROM owner_clocks
    WHERE owner = card_owner AND priority = card_priority
    FOR UPDATE;
    SELECT coalesce((SELECT weight FROM owner_weights WHERE owner = card_owner), 1),
           coalesce(h.vtime, 0), coalesce(h.vowner, '')
    INTO w, v, v_owner
    FROM (SELECT) one LEFT JOIN fair_head h ON h.priority = card_priority;
    last := darkroom_fair_start(prev, v, v_owner, card_owner, w) + (n - 1) / w;
    UPDATE owner_clocks SET stamp = last, last_file = NULL
    WHERE owner = card_owner AND priority = card_priority;
    IF n = 1 THEN
        RETURN ARRAY[last];
    END IF;
    RETURN ARRAY(SELECT last - (n - 1 - k) / w FROM generate_series(0, n - 1) AS k
                 ORDER BY k);
END $$;
