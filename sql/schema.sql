-- slurm-horus ledger schema, version 11: the one definition of the ledger's tables (the code
-- reflects its tables from this file; slurm_horus/ledger/schema.py SCHEMA_VERSION, migrate.py).
-- Portable DDL: the same file runs on SQLite (>= 3.25) and MariaDB/MySQL. `usage` is quoted with
-- backticks because USAGE is a reserved word in MariaDB (SQLite accepts backticks too).
-- Times are Unix epoch seconds (UTC); memory in MiB; utilization in percent of one GPU.

CREATE TABLE IF NOT EXISTS schema_version (
    version INTEGER NOT NULL PRIMARY KEY,
    applied BIGINT NOT NULL
);

-- One row per job with a claim, built by `horus-admin sync` from what sacct returns: the hint
-- and workload token of the job's comment are the user's claims; features are recomputed by sync.
CREATE TABLE IF NOT EXISTS submissions (
    cluster VARCHAR(64) NOT NULL,
    job_id BIGINT NOT NULL,
    user_name VARCHAR(64),
    account VARCHAR(64),
    submit_time BIGINT,
    model_path TEXT,
    model_sha256 VARCHAR(64),
    model_family VARCHAR(64),
    feature_version INTEGER,
    features TEXT,            -- JSON {feature name: value}
    workload TEXT,            -- JSON {batch_size, task, optimizer, precision, cpus, gpus, dims}
    gpu_types TEXT,           -- JSON [gres type, ...] the job may run on
    predictions TEXT,         -- JSON {gres type: {util_pct, mem_mib, mem_mib_p90, predictor, cold: {...}}}
    hint TEXT,
    policy_decision TEXT,
    predictor VARCHAR(64),
    uid BIGINT,               -- the job owner's uid (sacct / getpwnam), for the hook's record file
    PRIMARY KEY (cluster, job_id)
);

-- Measured use, one row per (cluster, job, source): a re-sync replaces, never adds.
CREATE TABLE IF NOT EXISTS `usage` (
    cluster VARCHAR(64) NOT NULL,
    job_id BIGINT NOT NULL,
    source VARCHAR(16) NOT NULL,      -- 'sacct' | 'probe' | 'import'
    util_mean DOUBLE PRECISION,
    util_max DOUBLE PRECISION,
    mem_peak_mib DOUBLE PRECISION,
    elapsed_s BIGINT,
    state VARCHAR(32),
    node VARCHAR(128),
    gpu_type VARCHAR(64),
    gpu_index INTEGER,
    shards INTEGER,                   -- gres/shard allocated (NULL for whole-GPU jobs)
    colocated TEXT,                   -- comma-separated job ids sharing the GPU in time
    start_time BIGINT,
    end_time BIGINT,
    recorded BIGINT,
    gpus INTEGER,                     -- whole GPUs allocated (gres/gpu)
    array_job_id BIGINT,              -- v9: an array task's ArrayJobId, from accounting (sacct -j takes it)
    array_task_id BIGINT,             -- v10: and its ArrayTaskId (sacct's JobID ARRAY_TASK)
    het_job_id BIGINT,                -- v11: a heterogeneous job component's HetJobId (its leader's id), from accounting
    het_job_offset BIGINT,            -- v11: and its HetJobOffset (sacct's JobID HETJOB+OFFSET)
    PRIMARY KEY (cluster, job_id, source)
);

CREATE TABLE IF NOT EXISTS predictor_versions (
    version VARCHAR(32) NOT NULL PRIMARY KEY,
    created BIGINT NOT NULL,
    metrics TEXT,                     -- JSON: cross-validated metrics, baseline, promoted or not
    n_rows INTEGER,
    promoted INTEGER NOT NULL DEFAULT 0
);

-- One row per job: submission and the best measurement merged (probe > sacct > import for
-- utilization and memory). Maintained by the ledger on every write; what hacct and the views read.
-- under_claim: 1 when a trusted measurement (probe or sacct) exceeds the claim
-- (memory > p90 * 1.10 + 256 MiB or utilization > util * 1.25 + 10), 0 when not, NULL when there
-- is no claim or no trusted measurement; claim_flags says which: 'mem', 'util' or 'mem,util'.
CREATE TABLE IF NOT EXISTS jobs (
    cluster VARCHAR(64) NOT NULL,
    job_id BIGINT NOT NULL,
    has_submission INTEGER NOT NULL DEFAULT 0,
    user_name VARCHAR(64),
    account VARCHAR(64),
    submit_time BIGINT,
    model_family VARCHAR(64),
    predictor VARCHAR(64),
    gpu_type VARCHAR(64),
    gpu_index INTEGER,
    node VARCHAR(128),
    shards INTEGER,
    state VARCHAR(32),
    elapsed_s BIGINT,
    start_time BIGINT,
    end_time BIGINT,
    pred_util_pct DOUBLE PRECISION,
    pred_mem_mib DOUBLE PRECISION,
    act_util_pct DOUBLE PRECISION,
    act_util_max DOUBLE PRECISION,
    act_mem_mib DOUBLE PRECISION,
    colocated TEXT,
    sources VARCHAR(64),
    mem_err_bucket INTEGER,  -- histogram bin of |pred - actual| / actual memory (ledger/jobs.py)
    gpus INTEGER,
    pred_mem_p90_mib DOUBLE PRECISION,
    under_claim INTEGER,
    claim_flags VARCHAR(16),
    failed_measurement INTEGER,  -- 1: the job never used its GPU (ledger/jobs.py)
    -- v6: the terms hacct --summary adds up, stored when the row is written (jobs.accuracy_terms).
    -- NULL where the job does not count in that figure (nothing to compare, failed measurement).
    predictor_source VARCHAR(64),     -- 'cold-start', 'learned', 'history', ... (no version)
    measured INTEGER,                 -- 1: actual utilization or memory known
    util_abs_err_pp DOUBLE PRECISION, -- |pred - actual| utilization, percentage points
    util_sq_log_err DOUBLE PRECISION, -- (ln(1 + pred) - ln(1 + actual))^2, utilization
    mem_sq_log_err DOUBLE PRECISION,  -- the same for memory (both > 0)
    within_p90 INTEGER,               -- 1: actual memory <= predicted p90, 0: above it
    far INTEGER,                      -- 1: actual use far above the prediction (jobs.FAR_*)
    -- v7: what the scheduler layer did to the job, from its AdminComment as sacct returns it
    -- (submissions.policy_decision; slurm.accounting.scheduler_actions), never the user's comment.
    hook_action VARCHAR(16),          -- the hook's decision: 'shared', 'exclusive', 'unchanged'
    hook_reason VARCHAR(16),          -- its reason code ('util', 'memory', ...; shared: NULL, 'pressure', 'pack_heavy')
    queue_actions VARCHAR(255),       -- horus-admin queue's, in order: 'pack,spread', 'oom-requeue'
    array_job_id BIGINT,              -- v9: an array task's ArrayJobId (hacct -j names the array)
    array_task_id BIGINT,             -- v10: and its ArrayTaskId (hacct's ArrayTaskID)
    het_job_id BIGINT,                -- v11: a heterogeneous job component's HetJobId (hacct -j names the whole job)
    het_job_offset BIGINT,            -- v11: and its HetJobOffset (hacct's JobID HETJOB+OFFSET, as sacct's)
    PRIMARY KEY (cluster, job_id)
);

CREATE TABLE IF NOT EXISTS ledger_state (
    name VARCHAR(64) NOT NULL PRIMARY KEY,
    value TEXT
);

CREATE INDEX IF NOT EXISTS ix_jobs_submit ON jobs (submit_time);
CREATE INDEX IF NOT EXISTS ix_jobs_user ON jobs (user_name);
CREATE INDEX IF NOT EXISTS ix_jobs_end ON jobs (end_time);
CREATE INDEX IF NOT EXISTS ix_jobs_array ON jobs (array_job_id);
CREATE INDEX IF NOT EXISTS ix_jobs_het ON jobs (het_job_id);
-- Covering index for hacct --summary: groups stream out in index order, no sort of all jobs,
-- and every term it adds up is in the index.
CREATE INDEX IF NOT EXISTS ix_jobs_summary ON jobs (has_submission, model_family, gpu_type,
    user_name, predictor_source, mem_err_bucket, measured, failed_measurement, within_p90,
    util_abs_err_pp, util_sq_log_err, mem_sq_log_err, far, under_claim);
-- The summary's list of jobs far above their prediction reads only those.
CREATE INDEX IF NOT EXISTS ix_jobs_far ON jobs (has_submission, far);
-- hacct --summary's count of the queue loop's actions reads only the jobs it touched.
CREATE INDEX IF NOT EXISTS ix_jobs_queue ON jobs (has_submission, queue_actions, state);
CREATE INDEX IF NOT EXISTS ix_usage_node ON `usage` (node, end_time);
