"""Downloads against an HTTP server on 127.0.0.1 (never the internet): Range resume after a
dropped connection, retries on 503, checksum mismatch, the publishers' checksum files and
layouts (Wikimedia sha1sums.txt, PubMed .md5, Gutenberg), and no file under the final name until
it is verified."""

import bz2
import gzip
import hashlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from ats_data import download
from ats_data.cli import main
from ats_data.errors import DataError


class _Server:
    """Serves `files` (path -> bytes) with Range support. `cut[path] = n` drops the connection
    after n bytes on the next request; `fail[path] = k` answers 503 to the next k requests."""

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.cut: dict[str, int] = {}
        self.fail: dict[str, int] = {}
        self.ranges: list[tuple[str, str | None]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                server.ranges.append((self.path, self.headers.get("Range")))
                if server.fail.get(self.path, 0) > 0:
                    server.fail[self.path] -= 1
                    self.send_error(503)
                    return
                data = server.files.get(self.path)
                if data is None:
                    self.send_error(404)
                    return
                start = 0
                if rng := self.headers.get("Range"):
                    start = int(rng.removeprefix("bytes=").rstrip("-"))
                    if start >= len(data):
                        self.send_error(416)
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(data) - start))
                self.end_headers()
                body = data[start:]
                if (n := server.cut.pop(self.path, None)) is not None:
                    self.wfile.write(body[:n])
                    self.wfile.flush()
                    self.connection.shutdown(2)  # the connection drops mid-file
                    return
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture
def server():
    s = _Server()
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()


def _no_sleep(_seconds):
    pass


def test_resumes_after_a_dropped_connection(server, tmp_path):
    data = bytes(range(256)) * 4000
    server.files["/f.bin"] = data
    server.cut["/f.bin"] = 300_000
    server.fail["/f.bin"] = 0
    sha = hashlib.sha256(data).hexdigest()
    out = download.download_file(
        server.url + "/f.bin", tmp_path / "f.bin", checksum=("sha256", sha), sleep=_no_sleep
    )
    assert out.read_bytes() == data
    assert server.ranges == [("/f.bin", None), ("/f.bin", "bytes=300000-")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.bin"]


def test_gives_up_keeps_the_part_and_a_second_run_resumes(server, tmp_path):
    data = b"x" * 100_000
    server.files["/f"] = data
    server.cut["/f"] = 40_000
    server.fail["/f"] = 0
    sleeps = []
    with pytest.raises(
        DataError, match=r"gave up after 1 attempts .*40000 bytes kept in .*f\.part"
    ):
        download.download_file(server.url + "/f", tmp_path / "f", retries=0, sleep=sleeps.append)
    assert not (tmp_path / "f").exists() and (tmp_path / "f.part").stat().st_size == 40_000
    server.fail["/f"] = 2  # two 503s, then the rest: backoff 1 s, 2 s
    download.download_file(server.url + "/f", tmp_path / "f", retries=3, sleep=sleeps.append)
    assert (tmp_path / "f").read_bytes() == data and sleeps == [1.0, 2.0]
    assert server.ranges[-1] == ("/f", "bytes=40000-")


def test_checksum_mismatch_removes_the_download(server, tmp_path):
    server.files["/f"] = b"tampered"
    with pytest.raises(
        DataError, match=r"sha256 checksum mismatch \(expected 00+, got [0-9a-f]+\)"
    ):
        download.download_file(server.url + "/f", tmp_path / "f", checksum=("sha256", "0" * 64))
    assert list(tmp_path.iterdir()) == []


def test_existing_files(server, tmp_path):
    server.files["/f"] = b"abc"
    (tmp_path / "f").write_bytes(b"abc")
    md5 = hashlib.md5(b"abc").hexdigest()
    download.download_file(server.url + "/f", tmp_path / "f", checksum=("md5", md5))
    assert server.ranges == []  # verified in place, nothing fetched
    (tmp_path / "g").write_bytes(b"mine")
    with pytest.raises(DataError, match="exists; remove it or choose another folder"):
        download.download_file(server.url + "/f", tmp_path / "g")
    assert (tmp_path / "g").read_bytes() == b"mine"


def test_http_errors(server, tmp_path):
    with pytest.raises(DataError, match=r"/missing: HTTP 404"):
        download.download_file(server.url + "/missing", tmp_path / "m")
    server.fail["/busy"] = 10
    with pytest.raises(DataError, match=r"gave up after 3 attempts \(HTTP 503\)"):
        download.download_file(server.url + "/busy", tmp_path / "b", retries=2, sleep=_no_sleep)


def test_wikipedia_pubmed_and_gutenberg_layouts(server, tmp_path, capsys):
    dump, index = bz2.compress(b"<mediawiki/>"), bz2.compress(b"1:2:A\n")
    names = [
        "enwiki-20240601-pages-articles-multistream.xml.bz2",
        "enwiki-20240601-pages-articles-multistream-index.txt.bz2",
    ]
    for name, data in zip(names, (dump, index), strict=True):
        server.files[f"/enwiki/20240601/{name}"] = data
    server.files["/enwiki/20240601/enwiki-20240601-sha1sums.txt"] = "".join(
        f"{hashlib.sha1(d).hexdigest()}  {n}\n" for n, d in zip(names, (dump, index), strict=True)
    ).encode()
    got = download.wikipedia("en", "20240601", tmp_path / "wiki", mirror=server.url)
    assert [p.name for p in got] == names and got[0].read_bytes() == dump

    gz = gzip.compress(b"<PubmedArticleSet/>")
    server.files["/baseline/"] = (
        b'<a href="pubmed25n0001.xml.gz">x</a> <a href="pubmed25n0001.xml.gz.md5">'
    )
    server.files["/baseline/pubmed25n0001.xml.gz"] = gz
    server.files["/baseline/pubmed25n0001.xml.gz.md5"] = (
        f"MD5(pubmed25n0001.xml.gz)= {hashlib.md5(gz).hexdigest()}\n".encode()
    )
    assert main(["download", "pubmed", "--out", str(tmp_path / "pm"), "--mirror", server.url]) == 0
    assert (tmp_path / "pm" / "pubmed25n0001.xml.gz").read_bytes() == gz

    server.files["/cache/epub/1342/pg1342.txt"] = b"book"
    args = ["download", "gutenberg", "--ids", "1342", "--out", str(tmp_path / "g"), "--mirror"]
    assert main([*args, server.url]) == 0
    assert (tmp_path / "g" / "pg1342.txt").read_bytes() == b"book"
    assert main(["download", "gutenberg", "--ids", "x", "--out", str(tmp_path / "g")]) == 1
    assert "needs --ids with ebook numbers" in capsys.readouterr().err
