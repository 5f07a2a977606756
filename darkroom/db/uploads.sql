-- Idempotent creates and known content. No statement here changes a card's
-- status: cards are created and confirmed by the protocol's statements in queries.sql.

-- name: idempotency_lookup
-- The card an owner's key made, with the request that made it. The card columns are
-- NULL when the card was purged in between.
SELECT k.request_hash AS key_request_hash, k.file_id AS key_file_id,
       f.id, f.owner, f.filename, f.content_type, f.size_bytes, f.original_key,
       f.original_version, f.original_sha256, f.status, f.priority, f.attempts,
       f.error_code, f.derived_key, f.derived_version, f.sha256, f.width, f.height,
       f.derived_bytes, f.thumb_key, f.thumb_version, f.thumb_sha256, f.thumb_width,
       f.thumb_height, f.thumb_bytes, f.thumbhash, f.rederive_error, f.created_at,
       f.updated_at
FROM idempotency_keys k
LEFT JOIN archive_files f ON f.id = k.file_id
WHERE k.owner = %(owner)s AND k.key_hash = %(key_hash)s;

-- name: idempotency_release
-- A key whose card was deleted names nothing any more: the next create with it makes a
-- new card. Only that card's row goes, so a concurrent new use of the key is kept.
DELETE FROM idempotency_keys
WHERE owner = %(owner)s AND key_hash = %(key_hash)s AND file_id = %(file_id)s;

-- name: find_known_original
-- The owner's live card whose confirmed original has this digest; a ready one first.
SELECT f.id, f.owner, f.filename, f.content_type, f.size_bytes, f.original_key,
       f.original_version, f.original_sha256, f.status, f.priority, f.attempts,
       f.error_code, f.derived_key, f.derived_version, f.sha256, f.width, f.height,
       f.derived_bytes, f.thumb_key, f.thumb_version, f.thumb_sha256, f.thumb_width,
       f.thumb_height, f.thumb_bytes, f.thumbhash, f.rederive_error, f.created_at,
       f.updated_at
FROM known_originals k
JOIN archive_files f ON f.id = k.file_id
WHERE k.owner = %(owner)s AND k.sha256 = %(sha256)s
  AND f.status IN ('queued', 'processing', 'ready')
ORDER BY f.status = 'ready' DESC, f.created_at, f.id
LIMIT 1;

-- name: sweep_idempotency_keys
-- Keys are kept at least the retention, then pruned in batches.
DELETE FROM idempotency_keys
WHERE (owner, key_hash) IN (
    SELECT owner, key_hash FROM idempotency_keys
    WHERE created_at < now() - make_interval(secs => %(retention_seconds)s::float8)
    ORDER BY created_at
    LIMIT %(limit)s);
