-- Each class's head (migration 0012) is kept in lanes, not in fair_clock's one row. Every
-- claim moved that row, so claims of different workers waited for each other's COMMIT
-- (bench/queue.py: at 4 workers, 0.71x PgQueuer's throughput with the one row, 0.96x
-- without it). A claim now moves the row of its own lane; the head is the greatest
-- (stamp, owner) of the class's lanes. Each lane only moves forward, so their
-- greatest is the (stamp, owner) of the card claimed last, as before: the head of start-
-- time fair queueing never moves back, whichever lane a claim takes.
--
-- A claim's lane is drawn from its claim id (one of 32): two claims running at once
-- share a lane, and wait for each other as every claim did before, one time in 32.
-- Bounded, so nothing has to clean up after workers that are gone. fair_clock keeps
-- bulk's credit, which a claim writes only when it changes: while both classes have work
-- due it changes at nearly every claim, and those claims still wait on that row.
--
-- fair_clock's head columns stay: a worker of the previous release, still running in a
-- rolling deploy, moves them with its claims, and stamps read them as one lane more.
CREATE TABLE fair_heads (
    priority  text    NOT NULL CHECK (priority IN ('interactive', 'bulk')),
    lane      integer NOT NULL CHECK (lane >= 0 AND lane < 32),
    vtime     float8  NOT NULL,
    vowner    text    NOT NULL,
    PRIMARY KEY (priority, lane)
);

-- The head as it stands, in lane 0 (the greatest of the lanes is the same in any).
INSERT INTO fair_heads (priority, lane, vtime, vowner)
SELECT 'interactive', 0, interactive_vtime, interactive_vowner FROM fair_clock
UNION ALL
SELECT 'bulk', 0, bulk_vtime, bulk_vowner FROM fair_clock;

-- The one place cards are stamped (migration 0012), reading the head from its lanes.
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
    w := coalesce((SELECT weight FROM owner_weights WHERE owner = card_owner), 1);
    SELECT h.vtime, h.vowner INTO v, v_owner
    FROM (SELECT vtime, vowner FROM fair_heads WHERE priority = card_priority
          UNION ALL
          SELECT CASE WHEN card_priority = 'bulk' THEN bulk_vtime ELSE interactive_vtime END,
                 CASE WHEN card_priority = 'bulk' THEN bulk_vowner ELSE interactive_vowner END
          FROM fair_clock) h
    ORDER BY h.vtime DESC, h.vowner DESC
    LIMIT 1;
    v := coalesce(v, 0);
    v_owner := coalesce(v_owner, '');
    INSERT INTO owner_clocks AS c (owner, priority, stamp)
    VALUES (card_owner, card_priority,
            darkroom_fair_start('-infinity', v, v_owner, card_owner, w) + (n - 1) / w)
    ON CONFLICT (owner, priority) DO UPDATE
        SET stamp = darkroom_fair_start(c.stamp, v, v_owner, card_owner, w) + (n - 1) / w,
            last_file = NULL
    RETURNING c.stamp INTO last;
    RETURN ARRAY(SELECT last - (n - 1 - k) / w FROM generate_series(0, n - 1) AS k
                 ORDER BY k);
END $$;
