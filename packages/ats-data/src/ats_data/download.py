"""Downloads of the published dumps: resumable (HTTP Range on a `NAME.part` file beside the
target), retried with exponential backoff on connection errors, timeouts and 5xx/408/429
answers, verified against the checksums the publisher lists, and renamed to the final name only
once verified: a final name never holds a partial or unverified file.

Wikipedia (`{lang}wiki-{date}-pages-articles-multistream.xml.bz2` and its index, sha1 from the
dump's sha1sums.txt), PubMed (baseline or update files, md5 from each file's .md5), Gutenberg
(plain-text books; Gutenberg publishes no checksums, so only the length is checked), or any URL
with a given sha256. arXiv metadata (Kaggle, behind a login) and StackExchange (7z archives) are
not fetched here.
"""

import hashlib
import http.client
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from ats_data.errors import DataError

WIKIMEDIA = "https://dumps.wikimedia.org"
PUBMED = "https://ftp.ncbi.nlm.nih.gov/pubmed"
GUTENBERG = "https://www.gutenberg.org"
_CHUNK = 1 << 20
_RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_USER_AGENT = "ats-data/0.1 (dataset downloader)"


class _Retry(Exception):
    """A transient failure: try again from where the .part file ends."""


def file_digest(path: Path, algo: str) -> str:
    h = hashlib.new(algo)
    with path.open("rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


def _request(url: str, start: int, timeout: float):
    headers = {"User-Agent": _USER_AGENT}
    if start:
        headers["Range"] = f"bytes={start}-"
    try:
        return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416 and start:
            return None  # the .part already holds the whole file
        if e.code in _RETRY_STATUS:
            raise _Retry(f"HTTP {e.code}") from None
        raise DataError(f"{url}: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException) as e:
        raise _Retry(str(getattr(e, "reason", e))) from None


def _fetch_into(url: str, part: Path, timeout: float) -> None:
    """Append the rest of `url` to `part` (or restart it when the server ignores Range)."""
    start = part.stat().st_size if part.exists() else 0
    response = _request(url, start, timeout)
    if response is None:
        return
    with response:
        if start and response.status == 206:
            content_range = response.headers.get("Content-Range", "")
            if not content_range.startswith(f"bytes {start}-"):
                raise DataError(f"{url}: asked for bytes {start}- and got {content_range!r}")
            mode = "ab"
        else:
            mode = "wb"  # 200: the whole file from byte 0
        length = response.headers.get("Content-Length")
        expected = int(length) if length is not None and length.isdigit() else None
        got = 0
        with part.open(mode) as f:
            try:
                while block := response.read(_CHUNK):
                    f.write(block)
                    got += len(block)
            except (TimeoutError, ConnectionError, http.client.HTTPException, OSError) as e:
                raise _Retry(f"connection lost after {got} bytes: {e}") from None
            f.flush()
            os.fsync(f.fileno())
        if expected is not None and got < expected:
            raise _Retry(f"connection closed after {got} of {expected} bytes")


def download_file(
    url: str,
    dest: str | Path,
    *,
    checksum: tuple[str, str] | None = None,
    retries: int = 5,
    backoff_s: float = 1.0,
    timeout_s: float = 60.0,
    sleep: Callable[[float], None] = time.sleep,
) -> Path:
    """Download `url` to `dest`; checksum is (algorithm, hex digest), e.g. ("sha1", "ab12...").

    An existing `dest` that matches the checksum is kept as is; one that does not is an error
    (it is not ours to replace). A mismatch after download removes the .part file."""
    if retries < 0:
        raise DataError(f"retries must be >= 0, got {retries}")
    dest = Path(dest)
    part = dest.with_name(dest.name + ".part")
    if dest.exists():
        if checksum is not None and file_digest(dest, checksum[0]) == checksum[1].lower():
            return dest
        raise DataError(
            f"{dest} exists"
            + (" and does not match its checksum" if checksum else "")
            + "; remove it or choose another folder"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    for attempt in range(retries + 1):
        try:
            _fetch_into(url, part, timeout_s)
            break
        except _Retry as e:
            if attempt == retries:
                size = part.stat().st_size if part.exists() else 0
                raise DataError(
                    f"{url}: gave up after {retries + 1} attempts ({e}); {size} bytes kept in "
                    f"{part}, run again to resume"
                ) from None
            sleep(backoff_s * 2**attempt)
    if checksum is not None:
        algo, want = checksum
        got = file_digest(part, algo)
        if got != want.lower():
            part.unlink()
            raise DataError(
                f"{url}: {algo} checksum mismatch (expected {want}, got {got}); the download "
                "was removed, run again to fetch it anew"
            )
    os.replace(part, dest)
    return dest


def _read_small(url: str, timeout_s: float = 60.0, attempts: int = 4) -> str:
    """A checksum list or folder listing (a few kB), with the same retry rules as a file."""
    for attempt in range(attempts):
        try:
            with _request(url, 0, timeout_s) as response:
                return response.read().decode("utf-8", errors="replace")
        except _Retry as e:
            failure = e
        if attempt + 1 < attempts:
            time.sleep(2**attempt)
    raise DataError(f"{url}: gave up after {attempts} attempts ({failure})")


def wikipedia(lang: str, date: str, out_dir: Path, mirror: str = WIKIMEDIA, **kw) -> list[Path]:
    """The multistream articles dump and its index, sha1-verified."""
    if not re.fullmatch(r"[a-z][a-z0-9_-]*", lang) or not re.fullmatch(r"\d{8}|latest", date):
        raise DataError(f"expected --lang like 'en' and --date YYYYMMDD, got {lang!r} {date!r}")
    base = f"{mirror.rstrip('/')}/{lang}wiki/{date}"
    sums = {}
    for line in _read_small(f"{base}/{lang}wiki-{date}-sha1sums.txt").splitlines():
        parts = line.split()
        if len(parts) == 2:
            sums[parts[1]] = parts[0]
    out = []
    for name in (
        f"{lang}wiki-{date}-pages-articles-multistream.xml.bz2",
        f"{lang}wiki-{date}-pages-articles-multistream-index.txt.bz2",
    ):
        if name not in sums:
            raise DataError(f"{base}: {name} is not in the dump's sha1sums.txt")
        out.append(
            download_file(f"{base}/{name}", out_dir / name, checksum=("sha1", sums[name]), **kw)
        )
    return out


def pubmed(
    kind: str, out_dir: Path, limit: int | None = None, mirror: str = PUBMED, **kw
) -> list[Path]:
    """Baseline or update files (`kind` "baseline" or "updatefiles"), md5-verified."""
    if kind not in ("baseline", "updatefiles"):
        raise DataError(f"PubMed set must be baseline or updatefiles, got {kind!r}")
    base = f"{mirror.rstrip('/')}/{kind}"
    names = sorted(set(re.findall(r"pubmed\d+n\d+\.xml\.gz(?![.\w])", _read_small(base + "/"))))
    if not names:
        raise DataError(f"{base}/: no pubmedNNnNNNN.xml.gz files listed")
    out = []
    for name in names[:limit]:
        md5 = re.search(r"=\s*([0-9a-fA-F]{32})", _read_small(f"{base}/{name}.md5"))
        if md5 is None:
            raise DataError(f"{base}/{name}.md5: no md5 digest in it")
        out.append(
            download_file(f"{base}/{name}", out_dir / name, checksum=("md5", md5.group(1)), **kw)
        )
    return out


def gutenberg(ids: list[int], out_dir: Path, mirror: str = GUTENBERG, **kw) -> list[Path]:
    """Plain-text books by ebook number (no published checksums: length-checked only)."""
    base = mirror.rstrip("/")
    return [
        download_file(f"{base}/cache/epub/{i}/pg{i}.txt", out_dir / f"pg{i}.txt", **kw) for i in ids
    ]
