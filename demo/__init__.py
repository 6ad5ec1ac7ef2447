"""``make demo`` / ``python -m demo``: a realistic mixed workload through the whole system, watched live.

It runs against the configured RabbitMQ and state store, under a queue prefix of its own
(``demo-<random>-``) that keeps its queues, exchanges and state keys apart from everything else,
and deletes them when it ends, Ctrl-C included.
"""
