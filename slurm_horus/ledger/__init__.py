"""Stage 4, the ledger: what was predicted, what Slurm says happened, what was measured.

The store's public API is re-exported here so its modules can be split without every caller
knowing which file holds what."""

from slurm_horus.ledger.store import (SCHEMA_VERSION, Ledger, Spool, current_user, default_url,
                                      failed_measurement, family_of, job_filters, mem_err_bucket,
                                      mem_err_bucket_bounds, open_reader, record_usage_safely,
                                      refresh_jobs, tables, under_claim, usage_record,
                                      write_user_extracts)

__all__ = ["SCHEMA_VERSION", "Ledger", "Spool", "current_user", "default_url",
           "failed_measurement", "family_of", "job_filters", "mem_err_bucket",
           "mem_err_bucket_bounds", "open_reader", "record_usage_safely", "refresh_jobs",
           "tables", "under_claim", "usage_record", "write_user_extracts"]
