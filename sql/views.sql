-- Reporting views over the ledger, for admins' plain SQL (SQLite and MariaDB alike).
-- The ledger (re)creates them from this file when it is set up or migrated.
-- Errors are predicted minus actual (docs/definitions.md): utilization in percentage points,
-- memory in percent of the actual peak. Failed measurements (failed_measurement = 1: the job
-- never used its GPU) have no error and count in no accuracy figure.
--   SELECT * FROM v_accuracy_by_family;        SELECT * FROM v_gpu_util_daily WHERE gpu_type='a100';

DROP VIEW IF EXISTS v_job_errors;
CREATE VIEW v_job_errors AS
SELECT cluster, job_id, user_name, account, model_family, gpu_type, gpu_index, node, gpus,
       shards, state, submit_time, end_time, predictor,
       pred_util_pct, act_util_pct, pred_mem_mib, pred_mem_p90_mib, act_mem_mib,
       under_claim, claim_flags, failed_measurement,
       CASE WHEN COALESCE(failed_measurement, 0) = 0
            THEN pred_util_pct - act_util_pct END AS util_err_pp,
       CASE WHEN act_mem_mib > 0 AND pred_mem_mib IS NOT NULL
                 AND COALESCE(failed_measurement, 0) = 0
            THEN 100.0 * (pred_mem_mib - act_mem_mib) / act_mem_mib END AS mem_err_pct,
       CASE WHEN act_mem_mib > 0 AND pred_mem_p90_mib IS NOT NULL
                 AND COALESCE(failed_measurement, 0) = 0
            THEN CASE WHEN act_mem_mib <= pred_mem_p90_mib THEN 1 ELSE 0 END END AS within_p90
FROM jobs
WHERE has_submission = 1;

DROP VIEW IF EXISTS v_accuracy_by_family;
CREATE VIEW v_accuracy_by_family AS
SELECT model_family,
       COUNT(*) AS jobs,
       COUNT(act_util_pct) AS util_measured,
       COUNT(act_mem_mib) AS mem_measured,
       SUM(CASE WHEN failed_measurement = 1 THEN 1 ELSE 0 END) AS failed_measurements,
       AVG(ABS(util_err_pp)) AS util_mae_pp,
       AVG(ABS(mem_err_pct)) AS mem_mean_abs_err_pct,
       SUM(CASE WHEN mem_err_pct < -20 THEN 1 ELSE 0 END) AS mem_underpredicted_20pct,
       100.0 * AVG(within_p90) AS p90_coverage_pct
FROM v_job_errors
GROUP BY model_family;

DROP VIEW IF EXISTS v_accuracy_by_gpu_type;
CREATE VIEW v_accuracy_by_gpu_type AS
SELECT gpu_type,
       COUNT(*) AS jobs,
       COUNT(act_util_pct) AS util_measured,
       COUNT(act_mem_mib) AS mem_measured,
       SUM(CASE WHEN failed_measurement = 1 THEN 1 ELSE 0 END) AS failed_measurements,
       AVG(ABS(util_err_pp)) AS util_mae_pp,
       AVG(ABS(mem_err_pct)) AS mem_mean_abs_err_pct,
       SUM(CASE WHEN mem_err_pct < -20 THEN 1 ELSE 0 END) AS mem_underpredicted_20pct,
       100.0 * AVG(within_p90) AS p90_coverage_pct
FROM v_job_errors
GROUP BY gpu_type;

DROP VIEW IF EXISTS v_accuracy_by_user;
CREATE VIEW v_accuracy_by_user AS
SELECT user_name,
       COUNT(*) AS jobs,
       COUNT(act_util_pct) AS util_measured,
       COUNT(act_mem_mib) AS mem_measured,
       SUM(CASE WHEN failed_measurement = 1 THEN 1 ELSE 0 END) AS failed_measurements,
       AVG(ABS(util_err_pp)) AS util_mae_pp,
       AVG(ABS(mem_err_pct)) AS mem_mean_abs_err_pct,
       SUM(CASE WHEN mem_err_pct < -20 THEN 1 ELSE 0 END) AS mem_underpredicted_20pct,
       100.0 * AVG(within_p90) AS p90_coverage_pct
FROM v_job_errors
GROUP BY user_name;

-- The claim audit per user and account: jobs whose claim met a trusted measurement, and how
-- many of them under-claimed (what horus-admin sync counts into the hook's record file).
DROP VIEW IF EXISTS v_under_claims;
CREATE VIEW v_under_claims AS
SELECT user_name, account,
       COUNT(*) AS jobs_audited,
       SUM(under_claim) AS under_claims,
       SUM(CASE WHEN claim_flags LIKE '%mem%' THEN 1 ELSE 0 END) AS mem_under_claims,
       SUM(CASE WHEN claim_flags LIKE '%util%' THEN 1 ELSE 0 END) AS util_under_claims
FROM jobs
WHERE under_claim IS NOT NULL
GROUP BY user_name, account;

-- Utilization per physical GPU (cluster, node, index) and UTC day of the job's end.
DROP VIEW IF EXISTS v_gpu_util_daily;
CREATE VIEW v_gpu_util_daily AS
SELECT cluster, node, gpu_index, gpu_type,
       end_time - (end_time % 86400) AS day_start,
       COUNT(*) AS jobs,
       SUM(gpus) AS gpus_total,
       SUM(shards) AS shards_total,
       AVG(act_util_pct) AS mean_util_pct,
       MAX(act_util_max) AS max_util_pct,
       MAX(act_mem_mib) AS max_mem_mib,
       SUM(elapsed_s) AS busy_s
FROM jobs
WHERE end_time IS NOT NULL AND node IS NOT NULL
GROUP BY cluster, node, gpu_index, gpu_type, end_time - (end_time % 86400);
