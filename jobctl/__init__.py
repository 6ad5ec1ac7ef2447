"""``jobctl``: the operators' command line (worker launcher, health checks, dead letters, job status)."""
