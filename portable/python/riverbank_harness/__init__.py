"""Riverbank's start of Beam's Python SDK harness: Beam's own `sdk_worker_main`, with lean
chains (see `chains`) installed first. The job server runs it in place of
`python -m apache_beam.runners.worker.sdk_worker_main` for PROCESS environments."""
