"""PII scrubbing: e-mail addresses, public IPv4/IPv6 addresses and phone numbers are replaced by
placeholders (Dolma's `|||EMAIL_ADDRESS|||` style), as datatrove's PIIFormatter does for
e-mails and IPs. IP candidates are checked with `ipaddress`: private, loopback and reserved
addresses (192.168.x.x, 127.0.0.1, ::1, documentation ranges, ...) are no one's PII and stay.
Phone numbers: North American numbers with separators (555-123-4567, (555) 123 4567,
+1 555.123.4567) and international numbers written with a leading + and 8 to 15 digits
(E.164); bare digit runs are left alone (too many of them are not phone numbers).
"""

import ipaddress
import re
from collections import Counter

EMAIL = "|||EMAIL_ADDRESS|||"
IP = "|||IP_ADDRESS|||"
PHONE = "|||PHONE_NUMBER|||"

_EMAIL = re.compile(
    r"(?<![\w.+-])[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*"
    r"@(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?\.)+[A-Za-z]{2,}\b"
)
_IPV4 = re.compile(r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?![\w.]*\w)")
_IPV6 = re.compile(r"(?<![\w:])(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?![\w:])")
_PHONE = re.compile(
    r"(?<![\w+])(?:\+1[ .-]?)?(?:\([2-9]\d\d\)|[2-9]\d\d)[ .-]?\d{3}[ .-]\d{4}(?!\w)"
    r"|(?<![\w+])\+\d{1,3}(?:[ .-]?\(?\d{1,4}\)?){2,5}(?!\w)"
)


def _public_ip(candidate: str) -> bool:
    try:
        return ipaddress.ip_address(candidate).is_global
    except ValueError:
        return False


def scrub_pii(text: str, counts: Counter) -> str:
    """`text` with PII replaced; adds the number of each kind replaced to counts."""

    def sub(pattern: re.Pattern, placeholder: str, kind: str, valid=None):
        def repl(m: re.Match) -> str:
            if valid is not None and not valid(m.group(0)):
                return m.group(0)
            counts[kind] += 1
            return placeholder

        return pattern.sub(repl, text)

    text = sub(_EMAIL, EMAIL, "email")
    text = sub(_IPV6, IP, "ip", _public_ip)
    text = sub(_IPV4, IP, "ip", _public_ip)
    text = sub(_PHONE, PHONE, "phone", lambda s: 8 <= sum(c.isdigit() for c in s) <= 15)
    return text
