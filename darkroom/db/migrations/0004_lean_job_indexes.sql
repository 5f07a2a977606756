-- What a job costs PostgreSQL. Neither card update of a job (claim, complete) can be HOT,
-- since status is in the claim's partial-index predicates, so each one inserts an entry
-- into every index whose predicate the new row version matches; each job also appends two
-- events. Index inserts were about a third of PostgreSQL's time per job. Two of them
-- per job bought nothing a reader needs:

-- An owner's listing finds processing cards through archive_files_leased instead: there
-- are never more of them than worker slots, so the claim no longer inserts here.
DROP INDEX archive_files_owner_created;
CREATE INDEX archive_files_owner_created ON archive_files (owner, created_at DESC, id DESC)
    WHERE status <> 'processing';

-- The routine events of every job (claimed, ready) are not indexed by file: a file's
-- history reads them through the BRIN time index, between the card's created_at and
-- updated_at (see file_events in queries.sql). The rare ones stay one B-tree probe away.
DROP INDEX archive_events_file;
CREATE INDEX archive_events_file ON archive_events (file_id, id)
    WHERE kind NOT IN ('claimed', 'ready');
