-- API keys: only the sha256 of each key is kept, so a leaked table grants nothing.

CREATE TABLE api_keys (
    key_hash    text PRIMARY KEY CHECK (key_hash ~ '^[0-9a-f]{64}$'),
    owner       text        NOT NULL CHECK (length(owner) BETWEEN 1 AND 200),
    admin       boolean     NOT NULL DEFAULT false,
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);
CREATE INDEX api_keys_owner ON api_keys (owner);
