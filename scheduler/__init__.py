"""The scheduler process: periodic messages sent by APScheduler (``python -m scheduler``)."""
