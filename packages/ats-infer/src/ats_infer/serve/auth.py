"""API keys: read once at startup (--api-key-file, one key per line, or env ATS_API_KEY), checked
as a bearer token in constant time on every route except /health. A server on a non-loopback
address refuses to start without a key unless --insecure-no-auth is given."""

import hmac
import ipaddress
import os
from pathlib import Path

from ats_infer.serve.errors import APIError

ENV_KEY = "ATS_API_KEY"
LOOPBACK_NAMES = ("localhost",)


def load_keys(key_file: str | None) -> list[str]:
    """Keys from key_file (blank lines and # comments skipped), else from $ATS_API_KEY, else []."""
    if key_file is not None:
        path = Path(key_file)
        if not path.is_file():
            raise FileNotFoundError(f"--api-key-file {path}: no such file")
        lines = path.read_text(encoding="utf-8").splitlines()
        keys = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
        if not keys:
            raise ValueError(f"--api-key-file {path}: holds no key")
        return keys
    env = os.environ.get(ENV_KEY, "").strip()
    return [env] if env else []


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, keys: list[str], insecure_no_auth: bool) -> None:
    if not keys and not is_loopback(host) and not insecure_no_auth:
        raise ValueError(
            f"--host {host} is not a loopback address and no API key is set "
            f"(--api-key-file or ${ENV_KEY}); pass --insecure-no-auth to serve without one"
        )


class KeyChecker:
    """authenticate(authorization header) -> the key's identity for rate limiting."""

    def __init__(self, keys: list[str]) -> None:
        self._keys = [k.encode("utf-8") for k in keys]

    @property
    def required(self) -> bool:
        return bool(self._keys)

    def authenticate(self, authorization: str | None) -> str:
        if not self._keys:
            return "anonymous"
        if not authorization or not authorization.startswith("Bearer "):
            raise APIError(
                401,
                "missing API key: send the header 'Authorization: Bearer KEY'",
                code="invalid_api_key",
            )
        given = authorization[len("Bearer ") :].strip().encode("utf-8")
        match = None
        for i, key in enumerate(self._keys):  # every key compared, in constant time each
            if hmac.compare_digest(given, key) and match is None:
                match = i
        if match is None:
            raise APIError(401, "incorrect API key provided", code="invalid_api_key")
        return f"key-{match}"
