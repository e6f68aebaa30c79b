"""Stage 4, the ledger: what was predicted, what Slurm says happened, what was measured.

The store's public API is re-exported here, so callers import from ``slurm_horus.ledger`` and
need not know which module holds what: ``db`` (URLs, engines, upserts), ``schema`` (sql/schema.sql,
the one definition of the tables), ``migrate``, ``records`` (the rows the ledger is given),
``jobs`` (the merged per-job rows and their rules), ``spool``, ``store`` (``Ledger``, the
probe's never-raising writer) and ``extracts`` (readers' access)."""

from slurm_horus.ledger.db import default_url, mask_url
from slurm_horus.ledger.extracts import current_user, open_reader, write_user_extracts
from slurm_horus.ledger.jobs import (failed_measurement, job_filters, mem_err_bucket,
                                     mem_err_bucket_bounds, refresh_jobs, under_claim)
from slurm_horus.ledger.records import family_of, usage_record
from slurm_horus.ledger.schema import SCHEMA_VERSION, tables
from slurm_horus.ledger.spool import Spool
from slurm_horus.ledger.store import Ledger, record_usage_safely

__all__ = ["SCHEMA_VERSION", "Ledger", "Spool", "current_user", "default_url",
           "failed_measurement", "family_of", "job_filters", "mask_url", "mem_err_bucket",
           "mem_err_bucket_bounds", "open_reader", "record_usage_safely", "refresh_jobs",
           "tables", "under_claim", "usage_record", "write_user_extracts"]
