-- The thumb (≤ 400 px WebP) and the thumbhash placeholder, published by the same fenced
-- commit as the preview (derived_key and its columns). Cards made before this have none:
-- their thumb answers the preview until they are derived again.
-- Nullable columns without a default: adding them rewrites nothing.
ALTER TABLE archive_files
    ADD COLUMN thumb_key     text,
    ADD COLUMN thumb_version text,
    ADD COLUMN thumb_sha256  text,
    ADD COLUMN thumb_width   integer,
    ADD COLUMN thumb_height  integer,
    ADD COLUMN thumb_bytes   bigint,
    ADD COLUMN thumbhash     text;
