"""The operators' web dashboard (`jobctl dashboard`): queues, jobs, dead letters, schedules, limits."""
