-- API keys (darkroom/keys.py, darkroom/api/auth.py). Keys are looked up by their hash.

-- name: create_api_key
INSERT INTO api_keys (key_hash, owner, admin, key_prefix)
VALUES (%(key_hash)s, %(owner)s, %(admin)s, %(key_prefix)s);

-- name: find_api_key
SELECT owner, admin FROM api_keys
WHERE key_hash = %(key_hash)s AND revoked_at IS NULL;

-- name: revoke_api_key
UPDATE api_keys SET revoked_at = now()
WHERE key_hash = %(key_hash)s AND revoked_at IS NULL
RETURNING owner;

-- name: list_api_keys
SELECT coalesce(key_prefix, 'sha256:' || left(key_hash, 12)) AS name, owner, admin,
       created_at, revoked_at
FROM api_keys
WHERE (%(owner)s::text IS NULL OR owner = %(owner)s::text)
  AND (%(all)s OR revoked_at IS NULL)
ORDER BY owner, created_at;

-- name: revoke_api_keys
-- By a key's shown name (its prefix, or sha256:<hash prefix>), or every key of an owner.
-- Revoking again changes nothing and answers nothing.
UPDATE api_keys SET revoked_at = now()
WHERE revoked_at IS NULL
  AND ((%(owner)s::text IS NOT NULL AND owner = %(owner)s::text)
       OR (%(name)s::text IS NOT NULL
           AND (starts_with(key_prefix, %(name)s::text)
                OR starts_with('sha256:' || key_hash, %(name)s::text))))
RETURNING coalesce(key_prefix, 'sha256:' || left(key_hash, 12)) AS name, owner;

-- name: match_api_keys
SELECT coalesce(key_prefix, 'sha256:' || left(key_hash, 12)) AS name, owner
FROM api_keys
WHERE revoked_at IS NULL
  AND (starts_with(key_prefix, %(name)s::text)
       OR starts_with('sha256:' || key_hash, %(name)s::text));

-- name: ping
SELECT 1 AS ok;
