"""Run reports: taking them in (ingest/), the job views (jobs/), and the record files on storage (records/)."""
