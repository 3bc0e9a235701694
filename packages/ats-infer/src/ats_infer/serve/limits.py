"""Admission limits: per-key token buckets over requests and tokens per minute (429 with
Retry-After and x-ratelimit-* headers, as OpenAI sends them), and the request body size cap (413),
an ASGI middleware that counts the bytes as they arrive (Content-Length can lie or be absent)."""

import json
import math
import threading
import time
from dataclasses import dataclass

from ats_infer.serve.errors import APIError, error_body


def parse_rate_limit(text: str) -> tuple[int, int]:
    """'RPM,TPM' -> (requests per minute, tokens per minute), both >= 1."""
    parts = text.split(",")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"--rate-limit {text!r}: expected RPM,TPM (two positive integers)")
    rpm, tpm = int(parts[0]), int(parts[1])
    if rpm < 1 or tpm < 1:
        raise ValueError(f"--rate-limit {text!r}: both limits must be >= 1")
    return rpm, tpm


@dataclass
class Bucket:
    capacity: float
    level: float
    stamp: float

    def refill(self, now: float) -> None:
        rate = self.capacity / 60.0  # per second
        self.level = min(self.capacity, self.level + (now - self.stamp) * rate)
        self.stamp = now

    def wait_for(self, amount: float) -> float:
        """Seconds until `amount` is available (0 when it is now)."""
        missing = amount - self.level
        return 0.0 if missing <= 0 else missing / (self.capacity / 60.0)


class RateLimiter:
    """Per-key buckets of `rpm` requests and `tpm` tokens (prompt + max_tokens) per minute."""

    def __init__(self, rpm: int, tpm: int) -> None:
        self.rpm, self.tpm = rpm, tpm
        self._buckets: dict[str, tuple[Bucket, Bucket]] = {}
        self._lock = threading.Lock()

    def admit(self, key: str, tokens: int) -> dict[str, str]:
        """Takes one request and `tokens` tokens from key's buckets; returns the x-ratelimit-*
        headers, or raises a 429 APIError carrying them and Retry-After."""
        now = time.monotonic()
        with self._lock:
            if key not in self._buckets:
                self._buckets[key] = (
                    Bucket(self.rpm, self.rpm, now),
                    Bucket(self.tpm, self.tpm, now),
                )
            requests, token_bucket = self._buckets[key]
            requests.refill(now)
            token_bucket.refill(now)
            if tokens > self.tpm:
                raise APIError(
                    429,
                    f"this request needs {tokens} tokens (prompt + max_tokens), more than the "
                    f"rate limit of {self.tpm} tokens per minute",
                    code="rate_limit_exceeded",
                    headers=self._headers(requests, token_bucket),
                )
            wait = max(requests.wait_for(1), token_bucket.wait_for(tokens))
            if wait > 0:
                headers = self._headers(requests, token_bucket)
                headers["retry-after"] = str(max(1, math.ceil(wait)))
                raise APIError(
                    429,
                    f"rate limit reached ({self.rpm} requests, {self.tpm} tokens per minute); "
                    f"retry in {wait:.1f} s",
                    code="rate_limit_exceeded",
                    headers=headers,
                )
            requests.level -= 1
            token_bucket.level -= tokens
            return self._headers(requests, token_bucket)

    def _headers(self, requests: Bucket, tokens: Bucket) -> dict[str, str]:
        return {
            "x-ratelimit-limit-requests": str(self.rpm),
            "x-ratelimit-remaining-requests": str(int(requests.level)),
            "x-ratelimit-reset-requests": f"{requests.wait_for(requests.capacity):.3f}s",
            "x-ratelimit-limit-tokens": str(self.tpm),
            "x-ratelimit-remaining-tokens": str(int(tokens.level)),
            "x-ratelimit-reset-tokens": f"{tokens.wait_for(tokens.capacity):.3f}s",
        }


class BodySizeLimit:
    """ASGI middleware: a request body over max_bytes gets a 413 before the app reads it all."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send)
            return
        seen = 0

        async def counted_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge
            return message

        try:
            await self.app(scope, counted_receive, send)
        except _TooLarge:
            await self._refuse(send)

    async def _refuse(self, send) -> None:
        body = json.dumps(
            error_body(413, f"the request body is larger than {self.max_bytes} bytes")
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body})


class _TooLarge(Exception):
    pass
