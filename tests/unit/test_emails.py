"""``send_email`` in-process against a scripted SMTP server: attachments confined to ``REPORTS_DIR``."""

from __future__ import annotations

import pytest

from actors import emails
from tests.servers import scripted_smtp


def fails_at_once(exc: BaseException) -> bool:
    """Whether ``exc`` is one of ``send_email``'s ``throws``: dead-lettered without a retry."""
    return isinstance(exc, emails.send_email.options["throws"])


def test_an_attachment_outside_reports_dir_is_refused_unread(actor_settings, tmp_path):
    secret = tmp_path / "secret-environ"
    secret.write_text("API_KEY=hunter2\n")
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "link.csv").symlink_to(secret)
    with scripted_smtp() as (port, received):
        actor_settings(smtp_url=f"smtp://127.0.0.1:{port}")
        for attachment in (str(secret), "../secret-environ", "link.csv", "/proc/self/environ", "a\x00b"):
            with pytest.raises(Exception) as caught:
                emails.send_email("ana@example.com", "report", {"kind": "sales"}, attachment=attachment)
            assert fails_at_once(caught.value), repr(caught.value)
            assert "REPORTS_DIR" in str(caught.value)
            assert "secret" not in str(caught.value) and "environ" not in str(caught.value)
    assert received == []


def test_an_attachment_inside_reports_dir_is_mailed(actor_settings, tmp_path):
    report = tmp_path / "reports" / "sales-2026-11-02-local.csv"
    report.parent.mkdir()
    report.write_text("region\nnorth\n")
    with scripted_smtp() as (port, received):
        actor_settings(smtp_url=f"smtp://127.0.0.1:{port}")
        emails.send_email("ana@example.com", "report", {"kind": "sales"}, attachment=report.name)
    (mail,) = received
    assert b'filename="sales-2026-11-02-local.csv"' in mail
