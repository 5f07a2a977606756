-- The functions a claim or a stamp calls on every statement, in PL/pgSQL: a LANGUAGE sql
-- function that the planner cannot inline (an aggregate, a VOLATILE body) is parsed,
-- analysed and planned again at every call, and a claim calls darkroom_paused_owners six
-- times; PL/pgSQL keeps its plans for the session. Same arguments, same answers.
CREATE OR REPLACE FUNCTION darkroom_paused_owners(card_priority text) RETURNS text[]
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT CASE WHEN bool_or(owner IS NULL) THEN NULL
                        ELSE coalesce(array_agg(owner), '{}') END
            FROM claim_pauses
            WHERE coalesce(priority, card_priority) = card_priority);
END $$;

CREATE OR REPLACE FUNCTION darkroom_fair_stamp(card_owner text, card_priority text)
RETURNS float8 LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN (darkroom_fair_stamps(card_owner, card_priority, 1))[1];
END $$;
