-- A class's fair-share head, read in one place (`fair_head`): the greatest (stamp, owner)
-- of its lanes (fair_heads, migration 0021) and of fair_clock's head columns, which a
-- worker of a release before 0021 still moves in a rolling deploy.
--
-- A confirm stamps its card by the rule of darkroom_fair_stamps in its own statement
-- (queries.sql `confirm`): an owner's clock row moved by a plain UPDATE joined to this
-- view, the rule (darkroom_fair_start) inlined. A call of the PL/pgSQL function costs
-- four statements of its own on top (weight, head, upsert, array), about a third of an
-- idle confirm's time on the server (bench.queue, idle latency). The function stays the
-- one way to stamp an owner's first card (its clock row made) and a batch of cards.
CREATE VIEW fair_head AS
SELECT DISTINCT ON (priority) priority, vtime, vowner
FROM (SELECT priority, vtime, vowner FROM fair_heads
      UNION ALL
      SELECT 'interactive', interactive_vtime, interactive_vowner FROM fair_clock
      UNION ALL
      SELECT 'bulk', bulk_vtime, bulk_vowner FROM fair_clock) h
ORDER BY priority, vtime DESC, vowner DESC;

-- The same stamps as before (migration 0021), in two statements instead of four: the
-- weight and the head in one read, and no array query for a single card.
CREATE OR REPLACE FUNCTION darkroom_fair_stamps(card_owner text, card_priority text,
                                                n integer DEFAULT 1)
RETURNS float8[] LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    w       float8;
    v       float8;
    v_owner text;
    last    float8;
BEGIN
    IF n < 1 THEN
        RETURN ARRAY[]::float8[];
    END IF;
    SELECT coalesce((SELECT weight FROM owner_weights WHERE owner = card_owner), 1),
           coalesce(h.vtime, 0), coalesce(h.vowner, '')
    INTO w, v, v_owner
    FROM (SELECT) one LEFT JOIN fair_head h ON h.priority = card_priority;
    INSERT INTO owner_clocks AS c (owner, priority, stamp)
    VALUES (card_owner, card_priority,
            darkroom_fair_start('-infinity', v, v_owner, card_owner, w) + (n - 1) / w)
    ON CONFLICT (owner, priority) DO UPDATE
        SET stamp = darkroom_fair_start(c.stamp, v, v_owner, card_owner, w) + (n - 1) / w,
            last_file = NULL
    RETURNING c.stamp INTO last;
    IF n = 1 THEN
        RETURN ARRAY[last];
    END IF;
    RETURN ARRAY(SELECT last - (n - 1 - k) / w FROM generate_series(0, n - 1) AS k
                 ORDER BY k);
END $$;
