"""Prometheus instruments of the worker and the sweeper. (The API adds its own.)"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

JOBS = Counter(
    "darkroom_jobs_total", "Attempts finished, by outcome",
    ["outcome"],  # ready | rejected | retry | lease_lost | released | error
)
JOB_SECONDS = Histogram(
    "darkroom_job_duration_seconds", "Wall time of one attempt, claim to commit",
    ["outcome"], buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300),
)
STAGE_SECONDS = Histogram(
    "darkroom_stage_duration_seconds", "Wall time of one stage of an attempt",
    # fetch | derive (and its steps: derive_spawn, derive_send, derive_decode,
    # derive_receive, derive_check) | put | commit
    ["stage"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
)
CLAIMED = Counter("darkroom_claimed_total", "Leases taken")
LEASE_LOST = Counter("darkroom_lease_lost_total", "Attempts that lost their lease")
HEARTBEATS = Counter("darkroom_heartbeats_total", "Heartbeat statements sent")
RETRIES = Counter("darkroom_retries_total", "Attempts that ended in a scheduled retry",
                  ["error_code"])
DB_ERRORS = Counter("darkroom_database_errors_total", "Database calls that failed")
WORKER_PAUSED = Gauge(
    "darkroom_worker_paused",
    "1 while this worker has stopped claiming because the object store is failing")
BREAKER_OPENED = Counter("darkroom_store_breaker_opened_total",
                         "Times this worker stopped claiming because the object store failed")
DEFERRALS = Counter(
    "darkroom_deferrals_total",
    "Cards handed back because the object store failed them, attempt given back, by"
    " whether the deferral counted against the file (the store served others meanwhile)",
    ["counted"])
ATTEMPT_TIMEOUTS = Counter("darkroom_attempt_timeouts_total",
                           "Attempts given up at DARKROOM_ATTEMPT_TIMEOUT_SECONDS")
CLAIMS_ADOPTED = Counter("darkroom_claims_adopted_total",
                         "Leases of a claim whose answer was lost, found and run")
SWEEP_ERRORS = Counter("darkroom_sweep_errors_total",
                       "Sweeper units' failures (database, store), by unit", ["unit"])
SWEEP_DELETE_FAILURES = Counter(
    "darkroom_sweep_delete_failures_total",
    "Objects the sweeper could not delete (retried with backoff), by unit", ["unit"])
SWEEP_DONE = Counter("darkroom_sweep_items_total", "Items a sweeper unit finished, by unit",
                     ["unit"])
