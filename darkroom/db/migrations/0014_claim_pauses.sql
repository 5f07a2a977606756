-- An operator's pause of claiming (`darkroom pause`, POST /v1/queue/pause): while a row
-- here covers a card, no worker starts an attempt on it. Running attempts are not
-- touched. A row's scope is an owner, a priority, both, or neither (every card); NULL
-- means "any". Not to be confused with worker_pauses, which only reports the workers
-- whose own store breaker is open.
CREATE TABLE claim_pauses (
    owner      text CHECK (length(owner) BETWEEN 1 AND 200),
    priority   text CHECK (priority IN ('interactive', 'bulk')),
    paused_by  text        NOT NULL CHECK (length(paused_by) BETWEEN 1 AND 200),
    since      timestamptz NOT NULL DEFAULT now(),
    -- One row per scope, the scope "every card" included: a repeated pause is a no-op.
    CONSTRAINT claim_pauses_scope UNIQUE NULLS NOT DISTINCT (owner, priority)
);

-- Every pause and resume that changed something, and who asked for it. Kept apart from
-- archive_events, whose rows each belong to one card.
CREATE TABLE claim_pause_events (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind       text        NOT NULL CHECK (kind IN ('paused', 'resumed')),
    owner      text,
    priority   text,
    actor      text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- The console's rejected cards by code, across owners (newest first), and the counts per
-- code in the queue's health. Only rejected rows are in it, so no step of a job that
-- succeeds writes an entry.
CREATE INDEX archive_files_rejected ON archive_files (error_code, created_at DESC, id DESC)
    WHERE status = 'rejected';
