"""Fast tests: in-process, with the real Redis and SQLite store backends (``make test-fast``)."""
