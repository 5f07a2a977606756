-- Which cards an operator's pause (claim_pauses, migration 0014) holds back, said once:
-- the owners whose cards of one priority class no claim may start, or NULL when a pause
-- covers every owner's cards of that class. A pause row covers the class when its
-- priority is NULL or the class, and the owner when its owner is NULL or that owner.
--
-- The claim (queries.sql) tests a card with `owner <> ALL (darkroom_paused_owners(p))`,
-- which is false for a listed owner and NULL (so not taken) for a NULL answer. Its scans
-- call it inside a scalar subquery, so it runs once per statement (an uncorrelated
-- InitPlan) rather than once per row scanned: a paused owner's backlog at the head of the
-- line is passed over at the cost of an array check per row, where a call per row would
-- query claim_pauses per row (20 times slower past 50,000 cards of a paused owner). A NULL
-- answer tested on its own is a one-time filter: a pause of the whole class reads no row
-- of the scan at all. Rescues of expired leases, a handful at most, call it per row.
CREATE FUNCTION darkroom_paused_owners(card_priority text) RETURNS text[]
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN bool_or(owner IS NULL) THEN NULL
                ELSE coalesce(array_agg(owner), '{}') END
    FROM claim_pauses
    WHERE coalesce(priority, card_priority) = card_priority
$$;
