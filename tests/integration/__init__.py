"""Tests against the real services: RabbitMQ, worker subprocesses, the scheduler, jobctl."""
