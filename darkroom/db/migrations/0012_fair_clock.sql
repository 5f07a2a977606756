-- Start-time fair queueing by the book (Goyal, Vin, Cheng 1996), and a share for bulk work.
--
-- Each class has a virtual time that only moves forward: the sort key (stamp, owner) of
-- the card claimed last, advanced by the claim statement itself. A card is stamped where
-- it becomes claimable (confirm, retry, deferral, hand-back, re-derive) with its start
-- tag max(v, its owner's previous stamp + 1/weight); it never sorts at or before the
-- card claimed last, so a newly waiting owner takes its turn in the round under way if
-- its turn is still ahead, else in the next. Claims take due cards in (stamp, owner)
-- order: at equal weights every owner with due work gets one claim per round, and is
-- passed over by at most one claim of each other owner between two of its own. Cards in
-- retry backoff no longer hold the head back (the head is stored, not the smallest
-- waiting stamp), and a card queued again is stamped by the same rule.

CREATE TABLE fair_clock (
    one                 boolean PRIMARY KEY DEFAULT true CHECK (one),
    interactive_vtime   float8  NOT NULL DEFAULT 0,
    interactive_vowner  text    NOT NULL DEFAULT '',
    bulk_vtime          float8  NOT NULL DEFAULT 0,
    bulk_vowner         text    NOT NULL DEFAULT '',
    -- Claims bulk work is owed (DARKROOM_BULK_SHARE per claim while both classes have
    -- work due, less one per bulk claim), exact in numeric so that a share of 0.1 gives
    -- exactly one claim in ten. Between 0 and 1 after every claim.
    bulk_credit         numeric NOT NULL DEFAULT 0 CHECK (bulk_credit >= 0 AND bulk_credit <= 1)
);

-- Cards already waiting keep their stamps; the head starts just before the first of them.
INSERT INTO fair_clock (interactive_vtime, bulk_vtime)
SELECT coalesce((SELECT min(fair_stamp) FROM archive_files
                  WHERE status = 'queued' AND priority = 'interactive'),
                (SELECT max(stamp) FROM owner_clocks WHERE priority = 'interactive'), 0),
       coalesce((SELECT min(fair_stamp) FROM archive_files
                  WHERE status = 'queued' AND priority = 'bulk'),
                (SELECT max(stamp) FROM owner_clocks WHERE priority = 'bulk'), 0);

-- The owner's line no longer depends on whether its last card still waits.
ALTER TABLE owner_clocks ALTER COLUMN last_file DROP NOT NULL;

-- The claim's order is (stamp, owner): ties go round the owners in one fixed order, which
-- is what bounds the passes (an arrival order would let one owner pass another twice).
DROP INDEX archive_files_due;
CREATE INDEX archive_files_due ON archive_files (priority, fair_stamp, owner, available_at)
    WHERE status = 'queued';

-- Where a card's start tag comes from: the owner's previous stamp, the class's head
-- (v, v_owner) and the owner's weight. -infinity as `prev`: the owner's first card.
CREATE FUNCTION darkroom_fair_start(prev float8, v float8, v_owner text, card_owner text,
                                    w float8) RETURNS float8
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN (greatest(v, prev + 1 / w), card_owner) <= (v, v_owner)
                THEN v + 1 / w
                ELSE greatest(v, prev + 1 / w) END
$$;

-- The one place cards are stamped: `n` consecutive stamps of `card_owner`'s line in the
-- class, in the order they are to be claimed. Every statement that makes a card
-- claimable calls it once per card (or once per batch with n), in the same transaction
-- as the status change: the owner's clock row is locked until COMMIT, so concurrent
-- stamps of one owner are distinct, and a statement that moves nothing stamps nothing.
CREATE FUNCTION darkroom_fair_stamps(card_owner text, card_priority text, n integer DEFAULT 1)
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
    SELECT CASE WHEN card_priority = 'bulk' THEN bulk_vtime ELSE interactive_vtime END,
           CASE WHEN card_priority = 'bulk' THEN bulk_vowner ELSE interactive_vowner END
      INTO v, v_owner FROM fair_clock;
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

CREATE FUNCTION darkroom_fair_stamp(card_owner text, card_priority text) RETURNS float8
LANGUAGE sql VOLATILE AS $$
    SELECT (darkroom_fair_stamps(card_owner, card_priority, 1))[1]
$$;
