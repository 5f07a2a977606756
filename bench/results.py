"""Benchmark results as typed files: one dataclass per benchmark, written to and read from
bench/out/NAME.json, so that the benchmark and its renderer agree on one shape.

`load` rebuilds a result from its JSON and refuses a shape it does not know (a missing
field, or an unknown one where the class keeps no `extra`), so that a renderer fails on
a moved field instead of printing a dash.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def _build(kind: Any, value: Any) -> Any:
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        kind = next(a for a in typing.get_args(kind) if a is not type(None))
        return _build(kind, value)
    if origin is list:
        (item,) = typing.get_args(kind)
        return [_build(item, v) for v in value]
    if origin is dict:
        _, item = typing.get_args(kind)
        return {k: _build(item, v) for k, v in value.items()}
    if dataclasses.is_dataclass(kind):
        return load(typing.cast(type[Any], kind), value)
    if kind is float and isinstance(value, int):
        return float(value)
    return value


def load(cls: type[T], data: dict[str, Any]) -> T:
    """A `cls` from its JSON object; raises ValueError on a shape it does not know."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    known = {k: _build(hints[k], v) for k, v in data.items() if k in names and k != "extra"}
    unknown = {k: v for k, v in data.items() if k not in names}
    if unknown and "extra" not in names:
        raise ValueError(f"{cls.__name__}: unknown fields {sorted(unknown)}")
    if "extra" in names:  # what the file kept there before, and what it has on top
        known["extra"] = {**data.get("extra", {}), **unknown}
    try:
        return cls(**known)
    except TypeError as exc:
        raise ValueError(f"{cls.__name__}: {exc}") from exc


def save(result: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dataclasses.asdict(result), indent=2, default=str) + "\n",
                    encoding="utf-8")


def read(cls: type[T], path: Path) -> T:
    return load(cls, json.loads(path.read_text(encoding="utf-8")))


# --- bench/queue.py -----------------------------------------------------------------------


@dataclass
class QueueThroughput:
    """One system in one configuration at one worker count, over its repeats."""

    system: str
    config: str
    workers: int
    jobs: int
    runs_jobs_per_s: list[float]
    # Machine CPU (all processes, PostgreSQL included) per job while the workers ran, and
    # the share of wall time stolen by the hypervisor: on a shared machine the CPU cost
    # of a job moves far less from run to run than the jobs/s do.
    runs_cpu_us_per_job: list[float]
    runs_steal_share: list[float]
    median: float
    cpu_us_per_job: float | None

    @classmethod
    def measured(cls, system: str, config: str, workers: int, jobs: int,
                 jobs_per_s: list[float], cpu_us_per_job: list[float],
                 steal_share: list[float]) -> QueueThroughput:
        """From the runs' own figures: the medians are what the renderer compares."""
        cpu = [c for c in cpu_us_per_job if c > 0]
        return cls(system, config, workers, jobs, jobs_per_s, cpu_us_per_job, steal_share,
                   statistics.median(jobs_per_s), statistics.median(cpu) if cpu else None)


@dataclass
class QueueLatency:
    """Idle enqueue → start of one system; no percentiles when nothing started."""

    n: int
    enqueued: int
    wake_up: str = ""
    p50_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    max_ms: float | None = None


@dataclass
class QueueClaim:
    """Median time of one claim statement on a tiny, a big and a backlog table."""

    system: str
    claim: str
    ms_10_rows: float
    ms_big: float
    ratio: float
    tiny_rows: int
    finished_rows: int
    queued_rows: int
    ms_backlog: float | None
    backlog_rows: int
    extra: dict[str, Any] = field(default_factory=dict)  # what a newer setup records


@dataclass
class QueueResult:
    command: str
    machine: dict[str, Any]
    postgres: dict[str, str]
    server: str
    plan: dict[str, Any]
    throughput: list[QueueThroughput] = field(default_factory=list)
    latency: dict[str, QueueLatency] = field(default_factory=dict)
    claim_time: list[QueueClaim] = field(default_factory=list)
    elapsed_s: float = 0.0
    loadavg_at_end: list[float] = field(default_factory=list)


# --- bench/worker.py ----------------------------------------------------------------------


@dataclass
class WorkerSlots:
    """The same images through p slots: the pipeline alone, and end to end."""

    slots: int
    pipeline_alone_ips: float
    end_to_end_ips: float
    ratio: float


@dataclass
class WorkerLatency:
    """Idle confirm → processing start, database clock, ms."""

    samples: int
    p50: float
    p95: float
    max: float


@dataclass
class WorkerResult:
    machine: dict[str, Any]
    slots: list[WorkerSlots] = field(default_factory=list)
    latency_ms: WorkerLatency | None = None
    command: str | None = None

    @classmethod
    def of(cls, data: dict[str, Any]) -> WorkerResult:
        """From its JSON, including the shape written before the typed result (one
        `slots_N` object per slot count)."""
        legacy = sorted((k for k in data if k.startswith("slots_")),
                        key=lambda k: int(k.split("_")[1]))
        if legacy:
            rest = {k: v for k, v in data.items() if k not in legacy}
            data = rest | {"slots": [{"slots": int(k.split("_")[1]), **data[k]}
                                     for k in legacy]}
        return load(cls, data)


# --- bench/soak.py ------------------------------------------------------------------------


@dataclass
class SoakVerdict:
    """What must stay flat over the soak; first/last = median of the first/last fifth of
    the windows."""

    processed: int
    throughput_per_s: float
    claim_ms_first: float
    claim_ms_last: float
    claim_drift: float
    queue_index_bytes_max: int
    queue_index_bytes_last: int
    files_table_bytes_last: int
    events_live_max: int
    files_dead_max: int
    autovacuums_files: int
    confirm_p99_ms_max: float | None
    queued_max: int


@dataclass
class SoakResult:
    target: int
    rate: float
    seconds: float
    # One sample of the database per window: counts, sizes, per-table dead/live rows,
    # claim time and the window's confirm latency (bench/soak.py `sample`).
    windows: list[dict[str, Any]]
    verdict: SoakVerdict | None = None
    command: str | None = None


# --- bench/api.py -------------------------------------------------------------------------


@dataclass
class ApiPhase:
    """One load phase: latencies from the scheduled send time, answers, CPU by process."""

    requests: int
    seconds: float
    rps: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float | None
    statuses: dict[str, int]
    unexpected: int
    cpu_cores: dict[str, float]  # cores busy per process group, and "steal"
    server: dict[str, Any]  # the API's own histogram: count, mean_ms, within_25ms
    api_cpu_ms_per_request: float | None
    loadavg_1m_before: float | None = None
    wall_seconds: float | None = None  # open loop only
    send_lag_p99_ms: float | None = None
    send_lag_max_ms: float | None = None
    postgres_during_phase: dict[str, Any] | None = None
    worker: dict[str, Any] | None = None  # busy phase: what the worker did meanwhile
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class ApiResult:
    machine: dict[str, Any]
    plan: dict[str, Any]
    results: dict[str, ApiPhase]  # confirm_busy, confirm_idle, ceiling_{confirm,get}_N
    gc_full_pass_ms: dict[str, float] | None = None
    command: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # older files' "targets"


# --- bench/derive.py ----------------------------------------------------------------------


@dataclass
class DeriveJail:
    """The decoder jail (issue 12) against the same child without it, same run."""

    start_up_ms: dict[str, float]  # {jailed,unjailed}{,_cpu}_{best,median}
    cpu_per_image_ms: dict[str, float]  # jailed, unjailed
    jailed_vs_unjailed: float


@dataclass
class DeriveOwnerSwitch:
    """A fresh decoder child whenever the owner changes (issue 22): the same jobs through
    one `DecoderProcess`, all of one owner and with the owner changing at every job (the
    worst case: fair share may interleave owners at every claim). CPU of every child, the
    spawns included, from the reaped children's rusage."""

    jobs: int
    # same_owner, owner_every_job, two_owners_two_slots, owner_every_job_no_zygote; best
    # of rounds
    cpu_per_job_ms: dict[str, float]
    # Extra CPU per owner change, and owner_every_job rate / same_owner rate: medians of
    # the rounds' own figures (the two modes run back to back in each round).
    switch_cpu_ms: float
    throughput_ratio: float
    # The jail's share of a change alone: a 64×64 JPEG, whose job costs next to nothing,
    # 30 jobs of one owner against 30 of a new owner each; median of rounds' differences.
    tiny_switch_cpu_ms: float | None = None


@dataclass
class DeriveResult:
    """Rates are images per CPU-second of one core (`_wall`: per wall-clock second), by
    measure: decode_resize, encode, pipeline_child, pipeline_child_unjailed,
    pipeline_in_process, pillow, pillow_encode."""

    corpus: list[str]
    rounds: int
    machine: dict[str, Any]
    images_per_second_per_core: dict[str, float]
    images_per_second_wall: dict[str, float]
    component_limit: float  # 1 / (t_decode+resize + t_encode), per core
    pipeline_to_limit_ratio: float
    pipeline_to_limit_ratio_wall: float
    pipeline_in_process_to_limit_ratio: float
    pyvips_vs_pillow: float
    one_process_ips: float
    two_processes_ips: float
    two_vs_one: float
    # Equal CPU per image in both modes means no contention inside the pipeline: any
    # shortfall of two_vs_one is then the machine's cores being busy elsewhere.
    child_cpu_seconds_per_image: dict[str, float]
    child_peak_rss_mb: float
    pillow_peak_rss_mb: float
    big_image: str
    bomb_rejection_ms: float
    header_100k_rejection_ms: float
    pipeline_unjailed_to_limit_ratio: float | None = None  # since issue 12
    jail: DeriveJail | None = None  # since issue 12
    owner_switch: DeriveOwnerSwitch | None = None  # since issue 22
    command: str | None = None
    loadavg_at_end: list[float] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)  # older files' "targets"


@dataclass
class DeriveFormatsResult:
    """`bench/formats.py`: decode cost per format, and what the thumb
    and thumbhash add to the preview-only pipeline, CPU of one process, best of rounds."""

    photo: str
    rounds: int
    bytes: dict[str, int]  # by format
    derive_cpu_ms: dict[str, float]  # by format
    corpus_today_cpu_s: float  # preview only
    corpus_with_thumbs_cpu_s: float
    corpus_images: int
    thumb_extra_cpu_share: float
    sample_bytes: dict[str, int]  # preview, thumb, thumbhash_chars
    command: str | None = None


# --- bench/page.py ------------------------------------------------------------------------


@dataclass
class PageRound:
    """One fresh browser context loading the page of the 2,000-card archive."""

    first_contentful_paint_ms: float | None
    first_screen_ms: float  # until every ready card near the viewport shows its thumb
    cards_rendered: int
    requests: int
    thumb_requests: int
    bytes_received: int


@dataclass
class PageDrain:
    """The same no-op drain with the status notifications on and off, best of rounds."""

    jobs: int
    drain_s: dict[str, float]  # "on", "off"
    jobs_per_s: dict[str, float]
    notify_cost_share: float  # on / off - 1, of the drain's wall time


@dataclass
class PageResult:
    """`bench/page.py`: the page in Chromium against a real archive, and what pushing
    status to it costs the queue."""

    cards: int
    rounds: list[PageRound]
    drain: PageDrain
    machine: dict[str, Any]
    loadavg_at_end: list[float] | None = None
    command: str | None = None

    @property
    def best(self) -> PageRound:
        return min(self.rounds, key=lambda r: r.first_screen_ms)


# --- bench/fair.py ------------------------------------------------------------------------


@dataclass
class FairSummary:
    """B's waits (s, database clock) and the throughputs: of one drain, or of a policy
    over its runs (B's waits pooled, throughputs as medians)."""

    b_cards: int
    b_wait_p50_s: float | None
    b_wait_p95_s: float | None
    b_wait_max_s: float | None
    a_jobs_per_s: float
    all_jobs_per_s: float
    mean_job_s: float


@dataclass
class FairRun(FairSummary):
    """One drain under one policy, with every wait of B's."""

    policy: str
    b_wait_s: list[float]


@dataclass
class FairConfirmRate:
    owners: int
    clients: int
    confirms: int
    rep: int
    per_s: float


@dataclass
class FairClaim:
    """darkroom's claim on a tiny table and on finished rows plus a backlog of many
    owners (bench/queue.py's fill)."""

    claim: str
    ms_10_rows: float
    ms_backlog: float
    tiny_rows: int
    finished_rows: int
    backlog_rows: int
    owners_waiting: int


@dataclass
class MixedRun:
    """One run of the mixed scenario under one policy: steady single uploaders, a backlog
    owner and a bulk import on one slot. Claims are counted per owner (the bulk import is
    one owner) over the run; `single_wait_s` are the single uploaders' confirm → claimed
    waits (database clock)."""

    policy: str
    seconds: float
    claims: int
    by_owner: dict[str, int]
    bulk_claims: int
    mean_job_s: float
    single_wait_s: list[float]
    # The run's length over its claims: one turn of the slot (job, commit, next claim).
    claim_interval_s: float = 0.0


@dataclass
class MixedSummary:
    """A policy's runs pooled: each owner's share of the claims beside its ideal under
    start-time fair queueing with the bulk share, and the single uploaders' waits."""

    claims: int
    share: dict[str, float]
    ideal: dict[str, float]
    bulk_share: float
    single_wait_p50_s: float | None
    single_wait_p95_s: float | None
    single_wait_max_s: float | None
    mean_job_s: float
    claim_interval_s: float = 0.0


@dataclass
class FairThroughput:
    """Claims per second of concurrent claimers (claim(1) and commit, no work) on a
    backlog of many owners: the previous claim against the one that moves the shared
    clock row."""

    claim: str
    clients: int
    rep: int
    per_s: float


@dataclass
class FairResult:
    machine: dict[str, Any]
    postgres: dict[str, str]
    plan: dict[str, Any]
    slots: int
    command: str
    runs: list[FairRun] = field(default_factory=list)
    summary: dict[str, FairSummary] = field(default_factory=dict)  # by policy
    confirm_rate: list[FairConfirmRate] = field(default_factory=list)
    claim_time: list[FairClaim] = field(default_factory=list)
    # The mixed scenario (same run), DARKROOM_BULK_SHARE it ran with, claim throughput.
    bulk_share: float = 0.1
    mixed: list[MixedRun] = field(default_factory=list)
    mixed_summary: dict[str, MixedSummary] = field(default_factory=dict)  # by policy
    throughput: list[FairThroughput] = field(default_factory=list)
    elapsed_s: float = 0.0
    loadavg_at_end: list[float] = field(default_factory=list)


# --- bench/confirm_digest.py --------------------------------------------------------------


@dataclass
class ConfirmTiming:
    median_ms: float
    p90_ms: float | None = None


@dataclass
class ConfirmDigestCase:
    """Confirms of cards without and with a claimed sha256, interleaved, one original."""

    bytes: int
    plain: ConfirmTiming
    digest: ConfirmTiming
    ratio_median: float  # digest / plain


@dataclass
class ConfirmBaseline:
    """Plain confirms sent alternately to this code and to another copy of darkroom."""

    this: ConfirmTiming
    baseline: ConfirmTiming
    ratio_median: float  # this / baseline


@dataclass
class ConfirmDigestStore:
    sizes: dict[str, ConfirmDigestCase]  # tiny, photo
    plain_vs_baseline: ConfirmBaseline | None = None


@dataclass
class ConfirmDigestResult:
    machine: dict[str, Any]
    command: str
    n: int  # confirms per variant and size
    stores: dict[str, ConfirmDigestStore]  # local, s3


# --- bench/queue_split.py -----------------------------------------------------------------


@dataclass
class QueueSplitRun:
    """One drain: jobs/s and its CPU per job, machine-wide and split by who spent it."""

    jobs_per_s: float
    machine_us_per_job: float
    backends_us_per_job: float
    python_us_per_job: float


@dataclass
class QueueSplitResult:
    machine: dict[str, Any]
    command: str
    workers: int
    jobs: int
    repeats: int
    variants: dict[str, str]  # name -> the SQL that altered its schema ("" = as built)
    runs: dict[str, list[QueueSplitRun]]  # by variant


# --- bench/engines.py ---------------------------------------------------------------------


@dataclass
class EnginesRound:
    """One runner's pass over the photos in one round. CPU is the runner's own processes'
    (darkroom's: API, worker, decoders and PostgreSQL, split in `cpu_by_process`, where
    `client` is the uploading bench process, left out of `cpu_seconds`)."""

    runner: str  # pyvips | sharp | darkroom
    round: int
    images: int
    seconds: float
    cpu_seconds: float
    cpu_by_process: dict[str, float] = field(default_factory=dict)


@dataclass
class EnginesQuality:
    """One runner's derivatives of each photo once: bytes, and the mean SSIM of its
    previews against the original resized by libvips, never compressed."""

    runner: str
    preview_bytes: int
    thumb_bytes: int
    ssim: float
    ssim_by_photo: dict[str, float] = field(default_factory=dict)


@dataclass
class EnginesResult:
    photos: list[str]
    images_per_round: int
    rounds: int
    parallel: int
    sharp_missing: str | None
    runs: list[EnginesRound]
    quality: list[EnginesQuality]
    # darkroom's wall ms per image, by "worker STAGE" and "api METHOD ROUTE", all rounds
    stage_ms_per_image: dict[str, float]
    stage_calls: dict[str, int]
    # CPU ms per image of the pipeline's steps, in the bench process, same photos
    pipeline_cpu_ms: dict[str, float]
    versions: dict[str, str]
    machine: dict[str, Any]
    command: str | None = None
    loadavg_at_end: list[float] = field(default_factory=list)
