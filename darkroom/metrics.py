"""Prometheus instruments of the worker. (The API adds its own request metrics.)"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

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
    ["stage"],  # fetch | derive | put | commit
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
)
CLAIMED = Counter("darkroom_claimed_total", "Leases taken")
LEASE_LOST = Counter("darkroom_lease_lost_total", "Attempts that lost their lease")
HEARTBEATS = Counter("darkroom_heartbeats_total", "Heartbeat statements sent")
RETRIES = Counter("darkroom_retries_total", "Attempts that ended in a scheduled retry",
                  ["error_code"])
DB_ERRORS = Counter("darkroom_database_errors_total", "Database calls that failed")
