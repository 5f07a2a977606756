-- The cards (one row per file), their bounded event log, and objects awaiting clean-up.

CREATE TABLE archive_files (
    id               uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    owner            text        NOT NULL,
    filename         text        NOT NULL,
    content_type     text        NOT NULL,
    size_bytes       bigint      NOT NULL CHECK (size_bytes >= 0),
    original_key     text        NOT NULL,
    original_version text,
    status           text        NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'queued', 'processing', 'ready', 'rejected', 'deleting')),
    attempts         integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    available_at     timestamptz NOT NULL DEFAULT now(),
    lease_token      uuid,
    lease_until      timestamptz,
    lease_owner      text,
    error_code       text,
    derived_key      text,
    derived_version  text,
    sha256           text,
    width            integer,
    height           integer,
    derived_bytes    bigint,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz,
    deleted_at       timestamptz,
    -- A lease exists exactly while a card is processing: no state can hold a stale token.
    CONSTRAINT lease_iff_processing CHECK (
        (status = 'processing') = (lease_token IS NOT NULL AND lease_until IS NOT NULL)),
    CONSTRAINT ready_has_derivative CHECK (
        status <> 'ready' OR (derived_key IS NOT NULL AND sha256 IS NOT NULL)),
    CONSTRAINT rejected_has_code CHECK (status <> 'rejected' OR error_code IS NOT NULL)
);

-- The claim reads only these two partial indexes, so its cost does not grow with the
-- number of finished (ready/rejected) rows.
CREATE INDEX archive_files_due ON archive_files (available_at, id) WHERE status = 'queued';
CREATE INDEX archive_files_leased ON archive_files (lease_until) WHERE status = 'processing';
-- An owner's listing, newest first, cursor-paginated.
CREATE INDEX archive_files_owner_created ON archive_files (owner, created_at DESC, id DESC);
-- The sweeper's purge of deleted cards.
CREATE INDEX archive_files_deleting ON archive_files (deleted_at) WHERE status = 'deleting';

-- Append-only and never looked up by id: the id only orders events, so it carries no
-- index of its own (each index costs every job two more inserts).
CREATE TABLE archive_events (
    id          bigint GENERATED ALWAYS AS IDENTITY,
    file_id     uuid        NOT NULL,
    kind        text        NOT NULL CHECK (kind IN ('claimed', 'lease_lost', 'retry_scheduled',
                    'rejected', 'ready', 'exhausted', 'released', 'revoked')),
    attempt     integer,
    token       uuid,
    worker      text,
    error_code  text,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX archive_events_file ON archive_events (file_id, id);
-- Events are appended in time order, so a BRIN index answers the health figures' time
-- windows at a fraction of a B-tree's cost on every insert (two inserts per job).
CREATE INDEX archive_events_created ON archive_events USING brin (created_at);
CREATE INDEX archive_events_lease_lost ON archive_events (created_at) WHERE kind = 'lease_lost';

-- Objects written by an attempt that may never be published: registered before the PUT,
-- removed when the attempt publishes, swept after a guard interval otherwise.
CREATE TABLE orphan_objects (
    object_key  text PRIMARY KEY,
    file_id     uuid        NOT NULL,
    token       uuid        NOT NULL,
    reason      text        NOT NULL CHECK (reason IN ('attempt', 'lease_lost', 'superseded')),
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX orphan_objects_created ON orphan_objects (created_at);
