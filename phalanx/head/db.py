"""The head's schema (SQLAlchemy Core tables) and engine set-up for SQLite and PostgreSQL.

The schema is owned by Alembic (migrations/); these table objects are what the code queries
with, and a test checks that they match what the migrations create.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Engine,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    event,
)

metadata = MetaData()

users = Table(
    "users",
    metadata,
    Column("name", String(128), primary_key=True),
    Column("admin", Boolean, nullable=False, default=False),
    Column("default_team", String(128), nullable=True),
    Column("created", Float, nullable=False),
    Column("unix_uid", Integer, nullable=True),  # None: the Unix account named like the user
    Column("unix_gid", Integer, nullable=True),  # None: that account's primary group
    Column("qos", String(500), nullable=True),  # allowed QOS, comma-separated (None: default)
    Column("disabled", Boolean, nullable=True),  # True: its tokens are refused (None: enabled)
)

teams = Table(
    "teams",
    metadata,
    Column("name", String(128), primary_key=True),
    Column("quota_gpus", Integer, nullable=True),
    Column("cohort", String(128), nullable=True),
    Column("borrowing_limit", Integer, nullable=True),
    Column("weight", Float, nullable=True),
    Column("created", Float, nullable=False),
    Column("qos", String(500), nullable=True),  # QOS its members may use (None: default)
)

memberships = Table(
    "memberships",
    metadata,
    Column("user", String(128), ForeignKey("users.name"), primary_key=True),
    Column("team", String(128), ForeignKey("teams.name"), primary_key=True),
    Column("team_admin", Boolean, nullable=False, default=False),
)

tokens = Table(
    "tokens",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("hash", String(64), nullable=False, unique=True),  # sha256 hex of the token
    Column("kind", String(8), nullable=False),  # api | join | node
    Column("user", String(128), nullable=True),
    Column("node", String(128), nullable=True),
    Column("description", String(200), nullable=False, default=""),
    Column("created", Float, nullable=False),
    Column("last_used", Float, nullable=True),
    Column("revoked", Boolean, nullable=False, default=False),
    Column("expires", Float, nullable=True),  # unix seconds; None: never
    Column("parent_id", Integer, nullable=True),  # the token that minted it (dies with it)
    Column("single_use", Boolean, nullable=True),  # join tokens: revoked on first use
    Column("bind_nodes", String(1000), nullable=True),  # join: node-name globs, comma-sep.
    Column("bind_addresses", String(1000), nullable=True),  # join: CIDRs, comma-separated
)

nodes = Table(
    "nodes",
    metadata,
    Column("name", String(128), primary_key=True),
    Column("address", String(255), nullable=False),
    Column("agent_url", String(512), nullable=False),
    Column("agent_secret", String(256), nullable=False),  # lets the head call the agent's API
    Column("cpus", Integer, nullable=False),
    Column("memory_mb", Integer, nullable=False),
    Column("gpus_json", Text, nullable=False),
    Column("labels_json", Text, nullable=False),
    Column("state", String(8), nullable=False),  # up | down | drain
    Column("reason", Text, nullable=True),
    Column("registered", Float, nullable=False),
    Column("confinement", String(200), nullable=True),  # cgroup-v1 | cgroup-v2 (…) | none: …
    Column("drain_cause", String(16), nullable=True),  # admin | health_check | gpu_fault
    Column("drain_reason", Text, nullable=True),  # kept while the node is down, too
)

jobs = Table(
    "jobs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("name", String(200), nullable=False),
    Column("user", String(128), nullable=False),
    Column("team", String(128), nullable=False),
    Column("account", String(128), nullable=True),
    Column("qos", String(128), nullable=False),
    Column("priority", Integer, nullable=False),
    Column("state", String(3), nullable=False),  # PD … OOM
    Column("reason", String(64), nullable=True),
    Column("reason_message", Text, nullable=True),
    Column("spec_json", Text, nullable=False),
    Column("submit_time", Float, nullable=False),
    Column("start_time", Float, nullable=True),
    Column("end_time", Float, nullable=True),
    Column("exit_code", String(32), nullable=True),
    Column("restart_count", Integer, nullable=False, default=0),
    Column("epoch", Integer, nullable=False, default=0),
    Column("array_job_id", Integer, nullable=True),
    Column("array_task_id", Integer, nullable=True),
    Column("placement_json", Text, nullable=True),
    Column("master_port", Integer, nullable=True),
    Column("step_token", String(128), nullable=True),  # job-scoped, valid while it runs
    Column("stopping", String(16), nullable=True),  # cancel | timeout | fail | complete | preempt
    Column("pending_exit", String(32), nullable=True),  # exit code decided while stopping
    Column("avoid_json", Text, nullable=True),  # nodes that failed this job: placed elsewhere
    Column("notices_json", Text, nullable=True),  # signals to deliver (preemption, --signal)
    Column("notice_deadline", Float, nullable=True),  # a preemption notice's kill time
    Column("client_token", String(128), nullable=True),  # idempotent submit, per user
    Column("hold", String(8), nullable=True),  # user | admin: held (`phalanx hold`), by whom
)
Index("ix_jobs_state", jobs.c.state)
Index("ix_jobs_user", jobs.c.user)
Index("ix_jobs_end_time", jobs.c.end_time)
Index("ix_jobs_client_token", jobs.c.user, jobs.c.client_token, unique=True)
Index("ix_jobs_array", jobs.c.array_job_id, jobs.c.array_task_id)  # `123_4` names a task

events = Table(
    "events",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("time", Float, nullable=False),
    Column("job_id", Integer, nullable=True),
    Column("node", String(128), nullable=True),
    Column("kind", String(32), nullable=False),
    Column("message", Text, nullable=False),
    # A state move's typed record (core.lifecycle): from → to in allocation `epoch`.
    Column("from_state", String(8), nullable=True),
    Column("to_state", String(8), nullable=True),
    Column("epoch", Integer, nullable=True),
)
Index("ix_events_job", events.c.job_id)
Index("ix_events_node", events.c.node)

# Telemetry (head/tsdb.py): chunks of packed samples per node and time range (level 0 raw,
# 1 minute rollups, 2 hour rollups), which job ran on which node when, the training
# progress history, and each ended job's efficiency summary (kept forever).
telemetry_chunks = Table(
    "telemetry_chunks",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("node", String(128), nullable=False),
    Column("level", Integer, nullable=False),
    Column("start", Float, nullable=False),
    Column("end", Float, nullable=False),
    Column("samples", Integer, nullable=False),
    Column("data", LargeBinary, nullable=False),
)
Index("ix_telemetry_chunks_node", telemetry_chunks.c.level, telemetry_chunks.c.node,
      telemetry_chunks.c.start)  # fmt: skip
Index("ix_telemetry_chunks_end", telemetry_chunks.c.level, telemetry_chunks.c.end)

job_nodes = Table(
    "job_nodes",
    metadata,
    Column("job_id", Integer, primary_key=True, autoincrement=False),
    Column("epoch", Integer, primary_key=True, autoincrement=False),
    Column("node", String(128), primary_key=True),
    Column("first", Float, nullable=False),
    Column("last", Float, nullable=False),
)
Index("ix_job_nodes_last", job_nodes.c.last)

job_progress = Table(
    "job_progress",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", Integer, nullable=False),
    Column("time", Float, nullable=False),
    Column("step", BigInteger, nullable=False),
    Column("loss", Float, nullable=True),
    Column("tokens_per_s", Float, nullable=True),
    Column("mfu", Float, nullable=True),
)
Index("ix_job_progress_job", job_progress.c.job_id, job_progress.c.time)
Index("ix_job_progress_time", job_progress.c.time)

job_stats = Table(
    "job_stats",
    metadata,
    Column("job_id", Integer, primary_key=True, autoincrement=False),
    Column("time", Float, nullable=False),  # when it was made final
    Column("summary_json", Text, nullable=False),
)


# Usage accounting and idle-GPU policy (head/usage.py, migration 0010): one row per UTC day,
# user, team and QOS, kept up to date as jobs run and GPUs report; reports read only these.
usage_daily = Table(
    "usage_daily",
    metadata,
    Column("day", String(10), primary_key=True),  # YYYY-MM-DD, UTC
    Column("user", String(128), primary_key=True),
    Column("team", String(128), primary_key=True),
    Column("qos", String(128), primary_key=True),
    Column("alloc_gpu_s", Float, nullable=False, default=0.0),  # GPUs × seconds held
    Column("util_gpu_s", Float, nullable=False, default=0.0),  # ∑ utilisation/100 × seconds
    Column("idle_gpu_s", Float, nullable=False, default=0.0),  # seconds flagged idle
    Column("jobs", Integer, nullable=False, default=0),  # jobs that ended that day
    Column("failures", Integer, nullable=False, default=0),  # … as F, NF, OOM or TO
    Column("preemptions", Integer, nullable=False, default=0),
)
Index("ix_usage_daily_team", usage_daily.c.team, usage_daily.c.day)
Index("ix_usage_daily_user", usage_daily.c.user, usage_daily.c.day)

# The same sums per day and one dimension (dim: user, team or qos; key: its value): what an
# admin's report reads, a row per day and key however many users, teams and QOS combine.
usage_groups = Table(
    "usage_groups",
    metadata,
    Column("dim", String(8), primary_key=True),
    Column("day", String(10), primary_key=True),
    Column("key", String(128), primary_key=True),
    Column("alloc_gpu_s", Float, nullable=False, default=0.0),
    Column("util_gpu_s", Float, nullable=False, default=0.0),
    Column("idle_gpu_s", Float, nullable=False, default=0.0),
    Column("jobs", Integer, nullable=False, default=0),
    Column("failures", Integer, nullable=False, default=0),
    Column("preemptions", Integer, nullable=False, default=0),
)

# Allocations the rollup has counted up to `usage_cursor.accounted_to` and that still run.
usage_open = Table(
    "usage_open",
    metadata,
    Column("job_id", Integer, primary_key=True, autoincrement=False),
    Column("epoch", Integer, nullable=False),
    Column("gpus", Integer, nullable=False),
    Column("user", String(128), nullable=False),
    Column("team", String(128), nullable=False),
    Column("qos", String(128), nullable=False),
)

# One row (id 1): the last job event the rollup applied and the time it counted up to.
usage_cursor = Table(
    "usage_cursor",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("last_event_id", Integer, nullable=False),
    Column("accounted_to", Float, nullable=False),
)

# A team's idle-GPU policy (none: the default, notify after 30 minutes).
idle_policies = Table(
    "idle_policies",
    metadata,
    Column("team", String(128), primary_key=True),
    Column("action", String(8), nullable=False),  # notify | preempt | cancel
    Column("window_s", Float, nullable=False),
    Column("grace_s", Float, nullable=False),
    Column("threshold_pct", Float, nullable=False),
    Column("updated", Float, nullable=False),
)


# Serving deployments (head/serving.py, migration 0011): each deployment's spec, owner and
# generation, and its replica jobs (which pool and generation each runs, where its engine
# listens and whether it is ready, whether the controller is retiring it).
serve_deployments = Table(
    "serve_deployments",
    metadata,
    Column("name", String(63), primary_key=True),
    Column("owner", String(128), nullable=False),
    Column("team", String(128), nullable=False),
    Column("spec_json", Text, nullable=False),
    Column("generation", Integer, nullable=False),
    Column("created", Float, nullable=False),
    Column("updated", Float, nullable=False),
    Column("engine_key", String(256), nullable=False),
    Column("status_json", Text, nullable=True),  # per pool: failures, last one, backoff
)

serve_replicas = Table(
    "serve_replicas",
    metadata,
    Column("job_id", Integer, primary_key=True, autoincrement=False),
    Column("deployment", String(63), nullable=False),
    Column("pool", String(16), nullable=False),
    Column("generation", Integer, nullable=False),
    Column("slots", Integer, nullable=False),
    Column("url", String(512), nullable=True),
    Column("ready", Boolean, nullable=False, default=False),
    Column("retiring", Boolean, nullable=False, default=False),
)
Index("ix_serve_replicas_deployment", serve_replicas.c.deployment)


def default_url(state_dir: Path) -> str:
    return f"sqlite:///{state_dir / 'phalanx.db'}"


def make_engine(url: str) -> Engine:
    """An engine with the settings the head relies on (WAL + full fsync on SQLite)."""
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=FULL")  # a commit is on disk before we answer
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    if url.startswith("postgresql"):
        return create_engine(url, pool_size=10, max_overflow=10, pool_pre_ping=True)
    raise ValueError(
        f"unsupported database URL {url!r}: use sqlite:///PATH or postgresql+psycopg://…"
    )
