"""The reference actors against a real SMTP server (aiosmtpd) and a real worker."""

from __future__ import annotations

from actors import reports


def test_sample_rows_are_deterministic():
    from datetime import date

    assert reports.sample_rows("sales", date(2026, 1, 1)) == reports.sample_rows("sales", date(2026, 1, 1))
    assert reports.sample_rows("sales", date(2026, 1, 1)) != reports.sample_rows("sales", date(2026, 1, 2))
