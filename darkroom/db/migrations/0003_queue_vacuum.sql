-- A queue table churns: every card is updated several times in minutes, and every
-- transition leaves a dead tuple in the partial indexes the claim reads. The default
-- autovacuum trigger (20% of the table dead) would let a large archive accumulate
-- millions of dead queue entries before a vacuum, so vacuum these tables early.
ALTER TABLE archive_files SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02
);
-- Events are appended and pruned by age (DARKROOM_EVENT_RETENTION_DAYS).
ALTER TABLE archive_events SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_insert_scale_factor = 0.05
);
