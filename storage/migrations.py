"""The schema, as an ordered list of migrations (``sqlite_utils.Migrations``).

A migration, once released, never changes: a database records which ones it has applied by
name, and a changed migration would not run again. Schema changes are new migrations appended
at the end. Each migration spells out its SQL instead of importing constants from the rest of
the package, so that it keeps meaning what it meant when it was written.

Tables are ``STRICT`` so that a wrong type is an error rather than a silently stored string.
Timestamps are ISO-8601 UTC text (see ``storage._codec``); ``*_json`` columns hold JSON text.

Why it is long: a migration, once released, never changes and spells out its own SQL, so the
schema's history only grows here.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlite_utils import Database, Migrations

MIGRATION_SET = "kvpilot"
MIGRATIONS = Migrations(MIGRATION_SET)
_NAMES: list[str] = []


def migration_names() -> list[str]:
    """Names of the migrations this code knows, oldest first."""
    return list(_NAMES)


def _migration(fn: Callable[[Database], None]) -> Callable[[Database], None]:
    _NAMES.append(fn.__name__)
    return MIGRATIONS()(fn)


def _run(db: Database, *statements: str) -> None:
    # One statement per execute(): executescript() would commit the enclosing transaction,
    # which would let a half-applied migration be recorded as applied.
    for statement in statements:
        db.execute(statement)


@_migration
def m001_servers_configs_audit(db: Database) -> None:
    """Servers, their launch configuration history, and the append-only audit log."""
    _run(
        db,
        """
        CREATE TABLE servers (
            name TEXT PRIMARY KEY,
            url TEXT NOT NULL,
            launcher_kind TEXT NOT NULL,
            created_at TEXT NOT NULL
        ) STRICT
        """,
        """
        CREATE TABLE launch_configs (
            id INTEGER PRIMARY KEY,
            server TEXT NOT NULL,
            args_json TEXT NOT NULL,
            kind TEXT NOT NULL CHECK (kind IN ('applied', 'last_known_good', 'proposed')),
            created_at TEXT NOT NULL,
            note TEXT
        ) STRICT
        """,
        # current and last-known-good are "the newest row of a kind for a server"
        "CREATE INDEX launch_configs_server_kind ON launch_configs (server, kind, id)",
        """
        CREATE TABLE audit_log (
            id INTEGER PRIMARY KEY,
            name TEXT NOT NULL,
            actor TEXT NOT NULL,
            created_at TEXT NOT NULL,
            server TEXT,
            experiment_id INTEGER,
            properties_json TEXT NOT NULL
        ) STRICT
        """,
        "CREATE INDEX audit_log_server ON audit_log (server, id)",
        "CREATE INDEX audit_log_experiment ON audit_log (experiment_id, id)",
        "CREATE INDEX audit_log_name ON audit_log (name, id)",
        # The audit log is evidence: SQLite itself refuses to rewrite or delete it.
        """
        CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log
        BEGIN
            SELECT RAISE(ABORT, 'audit_log is append-only: rows cannot be updated');
        END
        """,
        """
        CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log
        BEGIN
            SELECT RAISE(ABORT, 'audit_log is append-only: rows cannot be deleted');
        END
        """,
    )


@_migration
def m002_proposals_approvals(db: Database) -> None:
    """Proposals bound to a plan hash, and the decisions people made on them."""
    _run(
        db,
        """
        CREATE TABLE proposals (
            id INTEGER PRIMARY KEY,
            server TEXT NOT NULL,
            change_json TEXT NOT NULL,
            plan_json TEXT NOT NULL,
            plan_hash TEXT NOT NULL,
            snapshot_json TEXT NOT NULL,
            created_by TEXT NOT NULL,
            created_at TEXT NOT NULL,
            expires_at TEXT NOT NULL
        ) STRICT
        """,
        "CREATE INDEX proposals_server ON proposals (server, id)",
        """
        CREATE TABLE approvals (
            id INTEGER PRIMARY KEY,
            proposal_id INTEGER NOT NULL REFERENCES proposals (id),
            decision TEXT NOT NULL CHECK (decision IN ('approved', 'rejected')),
            actor TEXT NOT NULL,
            created_at TEXT NOT NULL,
            plan_hash TEXT NOT NULL
        ) STRICT
        """,
        "CREATE INDEX approvals_proposal ON approvals (proposal_id, id)",
    )


@_migration
def m003_experiments_samples(db: Database) -> None:
    """Experiments, their transition history, and the samples measured for them."""
    _run(
        db,
        """
        CREATE TABLE experiments (
            id INTEGER PRIMARY KEY,
            server TEXT NOT NULL,
            proposal_id INTEGER REFERENCES proposals (id),
            state TEXT NOT NULL,
            change_json TEXT NOT NULL,
            baseline_config_json TEXT NOT NULL,
            trial_config_json TEXT NOT NULL,
            settings_json TEXT NOT NULL,
            result_json TEXT,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            step_started_at TEXT NOT NULL,
            deadline_at TEXT,
            lease_owner TEXT,
            lease_expires_at TEXT
        ) STRICT
        """,
        "CREATE INDEX experiments_server ON experiments (server, id)",
        "CREATE INDEX experiments_state ON experiments (state)",
        # One active experiment per server, enforced by SQLite even against a writer that
        # skips the check in storage.experiments. The list is the active states of this
        # release; a migration that adds a state recreates this index.
        """
        CREATE UNIQUE INDEX experiments_one_active_per_server ON experiments (server)
        WHERE state IN (
            'proposed', 'approved', 'baseline', 'restarting', 'warming_up', 'trial',
            'deciding', 'reverting'
        )
        """,
        """
        CREATE TABLE experiment_transitions (
            id INTEGER PRIMARY KEY,
            experiment_id INTEGER NOT NULL REFERENCES experiments (id),
            from_state TEXT,
            to_state TEXT NOT NULL,
            actor TEXT NOT NULL,
            reason TEXT NOT NULL,
            details_json TEXT NOT NULL,
            created_at TEXT NOT NULL
        ) STRICT
        """,
        "CREATE INDEX experiment_transitions_experiment"
        " ON experiment_transitions (experiment_id, id)",
        """
        CREATE TABLE samples (
            id INTEGER PRIMARY KEY,
            experiment_id INTEGER REFERENCES experiments (id),
            server TEXT NOT NULL,
            phase TEXT NOT NULL CHECK (phase IN ('baseline', 'warmup', 'trial', 'monitor')),
            t REAL NOT NULL,
            wall_time TEXT NOT NULL,
            metrics_json TEXT NOT NULL
        ) STRICT
        """,
        "CREATE INDEX samples_experiment ON samples (experiment_id, phase, t)",
        "CREATE INDEX samples_server ON samples (server, t)",
    )


@_migration
def m004_diagnoses_messages(db: Database) -> None:
    """Diagnoses the chat front ends posted, and where their messages are.

    A diagnosis is stored so that a button under it can name one of its proposals by an
    opaque id; a message reference lets a restarted bot edit the message it posted before.
    """
    _run(
        db,
        """
        CREATE TABLE diagnoses (
            id INTEGER PRIMARY KEY,
            server TEXT NOT NULL,
            finding_json TEXT NOT NULL,
            created_by TEXT NOT NULL,
            created_at TEXT NOT NULL
        ) STRICT
        """,
        """
        CREATE TABLE message_refs (
            id INTEGER PRIMARY KEY,
            subject TEXT NOT NULL CHECK (subject IN ('proposal', 'experiment', 'diagnosis')),
            subject_id INTEGER NOT NULL,
            role TEXT NOT NULL,
            channel TEXT NOT NULL,
            ts TEXT NOT NULL,
            thread_ts TEXT,
            created_at TEXT NOT NULL,
            UNIQUE (subject, subject_id, role)
        ) STRICT
        """,
    )


@_migration
def m006_restart_slots(db: Database) -> None:
    """Restart slots: how many servers of a group are being restarted right now.

    A row is one experiment holding one of its group's slots while it restarts or reverts a
    server; the group's limit comes from the configuration, so it is not stored. One slot per
    experiment at most (an experiment restarts one server at a time).
    """
    _run(
        db,
        """
        CREATE TABLE restart_slots (
            experiment_id INTEGER PRIMARY KEY REFERENCES experiments (id),
            group_name TEXT NOT NULL,
            server TEXT NOT NULL,
            purpose TEXT NOT NULL CHECK (purpose IN ('restart', 'revert')),
            acquired_at TEXT NOT NULL
        ) STRICT
        """,
        "CREATE INDEX restart_slots_group ON restart_slots (group_name, acquired_at)",
    )


# Over 80 lines, and it stays so: a released migration never changes (databases record which
# ones they ran), so it is not split after the fact.
@_migration
def m005_metric_samples(db: Database) -> None:
    """Metric samples of every server, their gaps and roll-ups, and observed server settings.

    Time here is REAL seconds since the Unix epoch (UTC), not ISO text: these tables are read
    as ranges of tens of thousands of rows and a number compares and subtracts cheaply.
    ``metric_samples`` holds raw scrapes (counters, their increases since the previous scrape,
    and gauges); ``metric_rollups`` holds them summed into 5-minute and 1-hour buckets so that
    raw rows can be deleted after a few days; ``metric_gaps`` records time without data
    (server down, restarted, sampler not running), so that a gap is never read as zeros.
    """
    _run(
        db,
        """
        CREATE TABLE metric_samples (
            server TEXT NOT NULL,
            ts REAL NOT NULL,
            span_s REAL NOT NULL,
            dt REAL,
            gen_total REAL,
            prompt_total REAL,
            requests_total REAL,
            retractions_total REAL,
            gen_tokens REAL,
            prompt_tokens REAL,
            requests REAL,
            retractions REAL,
            gen_throughput REAL,
            running REAL,
            queued REAL,
            token_usage REAL,
            retracted REAL,
            max_total_tokens INTEGER,
            PRIMARY KEY (server, ts)
        ) STRICT, WITHOUT ROWID
        """,
        """
        CREATE TABLE metric_rollups (
            server TEXT NOT NULL,
            bucket_s INTEGER NOT NULL,
            start_ts REAL NOT NULL,
            samples INTEGER NOT NULL,
            span_s REAL NOT NULL,
            timed_s REAL NOT NULL,
            gen_tokens REAL,
            gen_tokens_timed REAL,
            prompt_tokens REAL,
            requests REAL,
            retractions REAL,
            gen_tp_sum REAL NOT NULL,
            gen_tp_span REAL NOT NULL,
            gen_tp_max REAL,
            running_sum REAL NOT NULL,
            running_max REAL,
            queue_sum REAL NOT NULL,
            queue_max REAL,
            saturated_s REAL NOT NULL,
            usage_sum REAL NOT NULL,
            usage_span REAL NOT NULL,
            usage_max REAL,
            usage_hist_json TEXT NOT NULL,
            retract_seen INTEGER NOT NULL,
            eff_peak REAL,
            max_total_tokens INTEGER,
            PRIMARY KEY (server, bucket_s, start_ts)
        ) STRICT, WITHOUT ROWID
        """,
        """
        CREATE TABLE metric_gaps (
            id INTEGER PRIMARY KEY,
            server TEXT NOT NULL,
            kind TEXT NOT NULL CHECK (kind IN ('down', 'restart', 'no_data')),
            start_ts REAL NOT NULL,
            end_ts REAL NOT NULL,
            open INTEGER NOT NULL CHECK (open IN (0, 1)),
            restarted INTEGER NOT NULL CHECK (restarted IN (0, 1)),
            detail TEXT NOT NULL
        ) STRICT
        """,
        "CREATE INDEX metric_gaps_server ON metric_gaps (server, end_ts)",
        """
        CREATE TABLE server_snapshots (
            id INTEGER PRIMARY KEY,
            server TEXT NOT NULL,
            ts REAL NOT NULL,
            info_json TEXT NOT NULL,
            info_hash TEXT NOT NULL
        ) STRICT
        """,
        "CREATE INDEX server_snapshots_server ON server_snapshots (server, ts)",
    )


@_migration
def m005b_report_runs(db: Database) -> None:
    """Scheduled report runs, one row per (report, scheduled time): a report is never sent twice.

    A run is claimed by inserting its row before anything is posted; the unique key makes a
    second claim (a second bot process, or a catch-up after a restart) fail instead of posting
    again.
    """
    _run(
        db,
        """
        CREATE TABLE report_runs (
            id INTEGER PRIMARY KEY,
            report TEXT NOT NULL,
            channel TEXT NOT NULL,
            scheduled_for TEXT NOT NULL,
            started_at TEXT NOT NULL,
            finished_at TEXT,
            status TEXT NOT NULL CHECK (status IN ('running', 'sent', 'failed')),
            late INTEGER NOT NULL CHECK (late IN (0, 1)),
            detail TEXT NOT NULL,
            UNIQUE (report, scheduled_for)
        ) STRICT
        """,
        "CREATE INDEX report_runs_report ON report_runs (report, scheduled_for)",
    )


@_migration
def m007_monitor_samples(db: Database) -> None:
    """The time range a diagnosis measured, so an experiment can reuse it as its baseline.

    The diagnosis's scrapes are stored as ``monitor`` samples (experiment_id NULL, ``t`` in epoch
    seconds, as the sampler's); these columns say which range of them the diagnosis read. NULL
    for diagnoses stored before, and for ones whose measurement was not kept.
    """
    _run(
        db,
        "ALTER TABLE diagnoses ADD COLUMN measured_from REAL",
        "ALTER TABLE diagnoses ADD COLUMN measured_until REAL",
        "CREATE INDEX diagnoses_server ON diagnoses (server, measured_until)",
    )


@_migration
def m008_experiment_progress(db: Database) -> None:
    """Where an experiment is inside its state, and the clock's time line across processes.

    ``progress_json`` is what a bounded step has learnt within the current state (when the
    restart was issued, which server instance is being measured, how many gate looks were
    taken), so a restarted bot continues the step instead of starting the state again; a move
    to a new state replaces it. ``clock_anchors`` holds, per time scale, one moment of the
    scaled clock (its calendar time and the wall time then), so every process against an
    accelerated twin continues the same time line rather than restarting it.
    """
    _run(
        db,
        "ALTER TABLE experiments ADD COLUMN progress_json TEXT NOT NULL DEFAULT '{}'",
        """
        CREATE TABLE clock_anchors (
            scale REAL PRIMARY KEY,
            wall_ts REAL NOT NULL,
            calendar_ts REAL NOT NULL
        ) STRICT
        """,
    )


@_migration
def m009_campaigns(db: Database) -> None:
    """Campaigns (one gated experiment after another on a server) and the bounds they learnt.

    A campaign's plan is what its approval names (arguments, ranges, restarts, when to stop),
    hashed as proposals are; ``approved_by`` is NULL when each step is approved on its own.
    ``campaign_steps`` ties each of its experiments to it. ``learned_bounds`` holds, per server,
    a value that did not run (a failed start or a death under load) and the side refused, so it
    is never proposed again without force.
    """
    _run(
        db,
        """
        CREATE TABLE campaigns (
            id INTEGER PRIMARY KEY,
            server TEXT NOT NULL,
            plan_json TEXT NOT NULL,
            plan_hash TEXT NOT NULL,
            approved_by TEXT,
            created_by TEXT NOT NULL,
            created_at TEXT NOT NULL,
            ended_at TEXT,
            stop_reason TEXT
        ) STRICT
        """,
        "CREATE INDEX campaigns_server ON campaigns (server, ended_at)",
        """
        CREATE TABLE campaign_steps (
            campaign_id INTEGER NOT NULL REFERENCES campaigns (id),
            experiment_id INTEGER NOT NULL UNIQUE,
            created_at TEXT NOT NULL,
            PRIMARY KEY (campaign_id, experiment_id)
        ) STRICT
        """,
        """
        CREATE TABLE learned_bounds (
            id INTEGER PRIMARY KEY,
            server TEXT NOT NULL,
            arg TEXT NOT NULL,
            limit_value REAL NOT NULL,
            above INTEGER NOT NULL,
            reason TEXT NOT NULL,
            experiment_id INTEGER,
            created_at TEXT NOT NULL
        ) STRICT
        """,
        "CREATE INDEX learned_bounds_server ON learned_bounds (server)",
    )


@_migration
def m010_quality_check(db: Database) -> None:
    """The answer quality check: the `checking_quality` state and the golden answers.

    An experiment whose change can alter answers is kept only once its check passes, in the new
    active state ``checking_quality``, so the one-active-experiment index is recreated with it.
    ``quality_answers`` holds the golden answers per experiment, phase and prompt, recorded
    batch by batch (the baseline's before the restart, the trial's after the gate's keep).
    """
    _run(
        db,
        "DROP INDEX experiments_one_active_per_server",
        """
        CREATE UNIQUE INDEX experiments_one_active_per_server ON experiments (server)
        WHERE state IN (
            'proposed', 'approved', 'baseline', 'restarting', 'warming_up', 'trial',
            'deciding', 'checking_quality', 'reverting'
        )
        """,
        """
        CREATE TABLE quality_answers (
            experiment_id INTEGER NOT NULL REFERENCES experiments (id),
            phase TEXT NOT NULL CHECK (phase IN ('baseline', 'trial')),
            prompt_index INTEGER NOT NULL CHECK (prompt_index >= 0),
            answer TEXT NOT NULL,
            created_at TEXT NOT NULL,
            PRIMARY KEY (experiment_id, phase, prompt_index)
        ) STRICT
        """,
    )


@_migration
def m011_router_rotation_and_rollouts(db: Database) -> None:
    """Servers kvpilot took out of their router's rotation, and fleet rollouts.

    ``router_rotation`` has one row per time kvpilot took a server out of its group's router
    (``back_at`` NULL while it is out; at most one such row per server), with what the router
    needs to add it back (``entry_json``), so a restarted bot puts back what it took out.
    ``rollouts`` is one approved change rolled out to a group's other servers (at most one open
    per group); ``rollout_steps`` its steps: an experiment per server, then, after a failure,
    the revert of each server the rollout had changed (its progress in ``progress_json``).
    """
    _run(
        db,
        """
        CREATE TABLE router_rotation (
            id INTEGER PRIMARY KEY,
            server TEXT NOT NULL,
            group_name TEXT NOT NULL,
            worker TEXT NOT NULL,
            router TEXT NOT NULL,
            experiment_id INTEGER,
            entry_json TEXT NOT NULL,
            out_at TEXT NOT NULL,
            back_at TEXT,
            note TEXT
        ) STRICT
        """,
        "CREATE UNIQUE INDEX router_rotation_open ON router_rotation (server)"
        " WHERE back_at IS NULL",
        "CREATE INDEX router_rotation_group ON router_rotation (group_name, out_at)",
        """
        CREATE TABLE rollouts (
            id INTEGER PRIMARY KEY,
            group_name TEXT NOT NULL,
            source_experiment_id INTEGER NOT NULL,
            plan_json TEXT NOT NULL,
            plan_hash TEXT NOT NULL,
            approved_by TEXT NOT NULL,
            created_at TEXT NOT NULL,
            ended_at TEXT,
            outcome TEXT,
            reason TEXT,
            lease_owner TEXT,
            lease_expires_at TEXT
        ) STRICT
        """,
        "CREATE UNIQUE INDEX rollouts_open ON rollouts (group_name) WHERE ended_at IS NULL",
        """
        CREATE TABLE rollout_steps (
            id INTEGER PRIMARY KEY,
            rollout_id INTEGER NOT NULL REFERENCES rollouts (id),
            server TEXT NOT NULL,
            kind TEXT NOT NULL CHECK (kind IN ('apply', 'revert')),
            proposal_id INTEGER,
            experiment_id INTEGER,
            status TEXT NOT NULL,
            progress_json TEXT NOT NULL DEFAULT '{}',
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            UNIQUE (rollout_id, server, kind)
        ) STRICT
        """,
    )


@_migration
def m012_freezes_reminders_alerts(db: Database) -> None:
    """Change freezes, the reminders sent for pending proposals, and alerts' states.

    A freeze holds every restart of its scope (``all``, one ``server`` or one ``group``) until
    ``until`` (NULL: until lifted); lifting it sets ``lifted_at``. An alert is posted once when
    its condition starts and is not posted again until it has cleared (``active`` 0).
    """
    _run(
        db,
        """
        CREATE TABLE freezes (
            id INTEGER PRIMARY KEY,
            scope TEXT NOT NULL CHECK (scope IN ('all', 'server', 'group')),
            target TEXT NOT NULL,
            reason TEXT NOT NULL,
            created_by TEXT NOT NULL,
            created_at TEXT NOT NULL,
            until TEXT,
            lifted_at TEXT,
            lifted_by TEXT
        ) STRICT
        """,
        "CREATE INDEX freezes_open ON freezes (lifted_at, until)",
        """
        CREATE TABLE proposal_reminders (
            proposal_id INTEGER PRIMARY KEY REFERENCES proposals (id),
            reminded_at TEXT NOT NULL
        ) STRICT
        """,
        """
        CREATE TABLE alerts (
            server TEXT NOT NULL,
            kind TEXT NOT NULL,
            active INTEGER NOT NULL CHECK (active IN (0, 1)),
            since TEXT NOT NULL,
            posted_at TEXT,
            evidence_json TEXT NOT NULL DEFAULT '{}',
            PRIMARY KEY (server, kind)
        ) STRICT
        """,
    )


@_migration
def m013_engine_neutral_decode_rate(db: Database) -> None:
    """The decode rate stored under an engine-neutral name: it was stored under SGLang's
    metric's (`gen_throughput`) though vLLM servers fill it too. Values are unchanged."""
    _run(
        db,
        "ALTER TABLE metric_samples RENAME COLUMN gen_throughput TO decode_rate",
        "ALTER TABLE metric_rollups RENAME COLUMN gen_tp_sum TO decode_rate_sum",
        "ALTER TABLE metric_rollups RENAME COLUMN gen_tp_span TO decode_rate_span",
        "ALTER TABLE metric_rollups RENAME COLUMN gen_tp_max TO decode_rate_max",
    )
