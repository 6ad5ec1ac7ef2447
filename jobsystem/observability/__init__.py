"""Logs, error reports and metrics: set up once per process, scrubbed everywhere."""
