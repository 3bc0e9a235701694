"""PII scrubbing: e-mails, public IPv4/IPv6 and phone numbers become placeholders, counted by
kind; private addresses and look-alikes (versions, times, plain numbers) stay."""

from collections import Counter

from ats_data.pii import EMAIL, IP, PHONE, scrub_pii


def test_replaces_pii_and_keeps_look_alikes():
    text = (
        "mail bob.smith+x@example.co.uk or call (415) 555-0132, server 8.8.8.8 and "
        "192.168.1.1, v6 2001:4860:4860::8888 and ::1, +44 20 7946 0958; version 1.2.3.4.5, "
        "time 12:30:45, year 2024, order 5551234567"
    )
    counts: Counter = Counter()
    assert scrub_pii(text, counts) == (
        f"mail {EMAIL} or call {PHONE}, server {IP} and 192.168.1.1, v6 {IP} and ::1, {PHONE}; "
        "version 1.2.3.4.5, time 12:30:45, year 2024, order 5551234567"
    )
    assert counts == {"email": 1, "ip": 2, "phone": 2}


def test_text_without_pii_is_unchanged():
    counts: Counter = Counter()
    text = "No addresses here: 3.14159, 10:45, v2.0.1, user@localhost"
    assert scrub_pii(text, counts) == text
    assert counts == {}
