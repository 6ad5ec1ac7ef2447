"""What operators run through jobctl: queue health and alerts, dead letters, queue migration, job status."""
