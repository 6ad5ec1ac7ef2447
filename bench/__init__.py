"""Benchmarks run by ``make bench``: they print figures and assert nothing."""
