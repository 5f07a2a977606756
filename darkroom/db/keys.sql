-- API keys (darkroom/keys.py, darkroom/api/auth.py). Keys are looked up by their hash.

-- name: create_api_key
INSERT INTO api_keys (key_hash, owner, admin)
VALUES (%(key_hash)s, %(owner)s, %(admin)s);

-- name: find_api_key
SELECT owner, admin FROM api_keys
WHERE key_hash = %(key_hash)s AND revoked_at IS NULL;

-- name: revoke_api_key
UPDATE api_keys SET revoked_at = now()
WHERE key_hash = %(key_hash)s AND revoked_at IS NULL
RETURNING owner;

-- name: ping
SELECT 1 AS ok;
