-- Uploads that are safe to retry: idempotency keys per owner, and the digests
-- of confirmed originals so a create can tell the client the archive already has them.

-- The sha256 a client claimed at create. It is trusted for nothing until confirm has
-- hashed the stored bytes and found the same digest; a card whose bytes differ is never
-- queued (see confirm in queries.sql). Not indexed here: archive_files is the queue, and
-- every index on it costs every job's claim and commit an entry.
ALTER TABLE archive_files ADD COLUMN original_sha256 text
    CHECK (original_sha256 ~ '^[0-9a-f]{64}$');

-- Verified digests of confirmed originals, written by confirm once the stored bytes were
-- hashed. A separate table, so the lookup's index is written once per file (at confirm)
-- and never by the queue's transitions. Rows go with their card.
CREATE TABLE known_originals (
    file_id    uuid PRIMARY KEY REFERENCES archive_files (id) ON DELETE CASCADE,
    owner      text NOT NULL,
    sha256     text NOT NULL
);
CREATE INDEX known_originals_owner_sha256 ON known_originals (owner, sha256);

-- One row per (owner, key) for at least 24 hours; the sweeper removes older ones. The key
-- and the request are stored as sha256 digests: 32 bytes each whatever the client sent.
CREATE TABLE idempotency_keys (
    owner        text        NOT NULL,
    key_hash     bytea       NOT NULL,
    request_hash bytea       NOT NULL,
    file_id      uuid        NOT NULL REFERENCES archive_files (id) ON DELETE CASCADE,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (owner, key_hash)
);
CREATE INDEX idempotency_keys_file ON idempotency_keys (file_id);
CREATE INDEX idempotency_keys_created ON idempotency_keys (created_at);
