"""A store that costs its machine almost no CPU: s3rver's objects served read-only by sendfile.

Not part of the bench: a stand-in, for one question of `bench.probes.client_reads
--lean-store`. On this machine the store shares the two cores with the mount, the client and
the proxies, and s3rver (Node, one thread, its bodies copied through streams) or RGW takes
1.4-2.8 CPU-s per GiB it sends; a far store costs its client's machine nothing. Served from
here, the same objects cost a request's parsing and a sendfile(2) from the page cache, so
what is left on the two cores is the client's, the proxies' and the mount's.

It reads s3rver 3's directory as s3rver wrote it (`<root>/<bucket>/<key>._S3rver_object`,
the MD5 beside it in `.md5`) and answers what a reading client asks: ListObjects v1 and v2
(prefix, delimiter, markers and tokens, max-keys), HEAD and GET of an object (one Range),
HEAD of a bucket, a bucket's location, the bucket list. Anything else is 501; credentials
and signatures are not checked (loopback only). A thread per connection, keep-alive.

    python -m bench.probes.lean_store --root DIR     # prints its port, serves until SIGTERM

`launch` starts it over a bench s3rver's directory (client_reads and path_ceiling use it).
"""

from __future__ import annotations

import argparse
import email.utils
import glob
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, replace
from xml.sax.saxutils import escape

from bench.leftovers import stop_process, track_process
from bench.servers import Server, Unavailable

OBJECT_SUFFIX = "._S3rver_object"
_MAX_KEYS = 1000
_NS = 'xmlns="http://s3.amazonaws.com/doc/2006-03-01/"'
_HEAD_LIMIT = 64 * 1024


@dataclass(frozen=True)
class _Object:
    key: str
    path: str
    size: int
    mtime: float
    etag: str


class _Objects:
    """The objects of s3rver's directory, read when asked (the probe writes none meanwhile)."""

    def __init__(self, root: str) -> None:
        self.root = root

    def buckets(self) -> list[str]:
        return sorted(e.name for e in os.scandir(self.root) if e.is_dir())

    def find(self, bucket: str, key: str) -> _Object | None:
        path = os.path.join(self.root, bucket, key + OBJECT_SUFFIX)
        if ".." in key.split("/") or not os.path.isfile(path):
            return None
        return self._object(key, path)

    def _object(self, key: str, path: str) -> _Object:
        stat = os.stat(path)
        try:
            with open(path + ".md5") as f:
                etag = f.read().strip()
        except OSError:
            etag = f"{stat.st_size:x}-{int(stat.st_mtime):x}"
        return _Object(key, path, stat.st_size, stat.st_mtime, etag)

    def listing(self, bucket: str) -> list[_Object] | None:
        top = os.path.join(self.root, bucket)
        if not os.path.isdir(top):
            return None
        found = []
        for directory, _, files in os.walk(top):
            for name in files:
                if name.endswith(OBJECT_SUFFIX):
                    path = os.path.join(directory, name)
                    key = os.path.relpath(path, top)[: -len(OBJECT_SUFFIX)]
                    found.append(self._object(key, path))
        return sorted(found, key=lambda o: o.key)


def _iso(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(seconds))


def list_objects(objects: list[_Object], query: dict[str, str]) -> str:
    """ListObjects (v1) or ListObjectsV2 (`list-type=2`) of a bucket's sorted objects."""
    v2 = query.get("list-type") == "2"
    prefix, delimiter = query.get("prefix", ""), query.get("delimiter", "")
    if v2:
        after = query.get("continuation-token") or query.get("start-after", "")
    else:
        after = query.get("marker", "")
    max_keys = min(int(query.get("max-keys", _MAX_KEYS) or _MAX_KEYS), _MAX_KEYS)
    entries: list[tuple[str, _Object | None]] = []  # (key or common prefix, object or None)
    for obj in objects:
        if not obj.key.startswith(prefix):
            continue
        rest = obj.key[len(prefix) :]
        if delimiter and delimiter in rest:
            common = prefix + rest[: rest.index(delimiter) + len(delimiter)]
            if not entries or entries[-1][0] != common:
                entries.append((common, None))
        else:
            entries.append((obj.key, obj))
    entries = [entry for entry in entries if entry[0] > after]
    page, truncated = entries[:max_keys], len(entries) > max_keys
    body = [f"<Name>{escape(query['bucket'])}</Name><Prefix>{escape(prefix)}</Prefix>"]
    body.append(f"<MaxKeys>{max_keys}</MaxKeys><IsTruncated>{str(truncated).lower()}</IsTruncated>")
    if delimiter:
        body.append(f"<Delimiter>{escape(delimiter)}</Delimiter>")
    if v2:
        body.append(f"<KeyCount>{len(page)}</KeyCount>")
        if truncated:
            body.append(f"<NextContinuationToken>{escape(page[-1][0])}</NextContinuationToken>")
    elif truncated:
        body.append(f"<NextMarker>{escape(page[-1][0])}</NextMarker>")
    for name, listed in page:
        if listed is None:
            body.append(f"<CommonPrefixes><Prefix>{escape(name)}</Prefix></CommonPrefixes>")
        else:
            body.append(
                f"<Contents><Key>{escape(listed.key)}</Key><LastModified>{_iso(listed.mtime)}"
                f"</LastModified><ETag>&quot;{listed.etag}&quot;</ETag><Size>{listed.size}</Size>"
                "<StorageClass>STANDARD</StorageClass></Contents>"
            )
    return f"<ListBucketResult {_NS}>{''.join(body)}</ListBucketResult>"


def byte_range(header: str, size: int) -> tuple[int, int] | None:
    """(first, last) of a `bytes=` Range within `size`, or None when it cannot be served."""
    unit, _, spec = header.partition("=")
    first_text, dash, last_text = spec.strip().partition("-")
    if unit.strip() != "bytes" or not dash or "," in spec:
        return None
    try:
        if not first_text:  # the last N bytes
            first, last = max(0, size - int(last_text)), size - 1
        else:
            first = int(first_text)
            last = min(int(last_text), size - 1) if last_text else size - 1
    except ValueError:
        return None
    return (first, last) if first <= last and first < size else None


class _Connection:
    """One client's requests, answered in order until it closes."""

    def __init__(self, sock: socket.socket, objects: _Objects) -> None:
        self.sock = sock
        self.objects = objects
        self.reader = sock.makefile("rb")

    def serve(self) -> None:
        try:
            while self._one():
                pass
        except (OSError, ValueError):
            pass
        finally:
            self.reader.close()
            self.sock.close()

    def _one(self) -> bool:
        line = self.reader.readline(_HEAD_LIMIT)
        if not line:
            return False
        method, target, _ = line.decode("latin-1").split(" ", 2)
        headers: dict[str, str] = {}
        while (header := self.reader.readline(_HEAD_LIMIT)) not in (b"\r\n", b"\n", b""):
            name, _, value = header.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0") or "0")
        if length:
            self.reader.read(length)  # a body is never needed here
        parts = urllib.parse.urlsplit(target)
        path = urllib.parse.unquote(parts.path).lstrip("/")
        query = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
        bucket, _, key = path.partition("/")
        self._answer(method, bucket, key, query, headers)
        return headers.get("connection", "").lower() != "close"

    def _answer(
        self, method: str, bucket: str, key: str, query: dict[str, str], headers: dict[str, str]
    ) -> None:
        if method not in ("GET", "HEAD"):
            self._xml(501, f"<Error><Code>NotImplemented</Code><Message>{method}</Message></Error>")
        elif not bucket:
            names = "".join(
                f"<Bucket><Name>{escape(b)}</Name></Bucket>" for b in self.objects.buckets()
            )
            listed = f"<Buckets>{names}</Buckets>"
            self._xml(200, f"<ListAllMyBucketsResult {_NS}>{listed}</ListAllMyBucketsResult>")
        elif not key:
            self._bucket(method, bucket, query)
        else:
            self._object(method, bucket, key, headers)

    def _bucket(self, method: str, bucket: str, query: dict[str, str]) -> None:
        listed = self.objects.listing(bucket)
        if listed is None:
            self._xml(404, "<Error><Code>NoSuchBucket</Code></Error>", method == "HEAD")
        elif method == "HEAD":
            self._head(200, {"Content-Length": "0"})
        elif "location" in query:
            self._xml(200, f"<LocationConstraint {_NS}></LocationConstraint>")
        else:
            self._xml(200, list_objects(listed, {**query, "bucket": bucket}))

    def _object(self, method: str, bucket: str, key: str, headers: dict[str, str]) -> None:
        obj = self.objects.find(bucket, key)
        if obj is None:
            self._xml(404, "<Error><Code>NoSuchKey</Code></Error>", method == "HEAD")
            return
        first, last, status = 0, obj.size - 1, 200
        fields = {
            "ETag": f'"{obj.etag}"',
            "Last-Modified": email.utils.formatdate(obj.mtime, usegmt=True),
            "Content-Type": "application/octet-stream",
            "Accept-Ranges": "bytes",
        }
        if "range" in headers:
            wanted = byte_range(headers["range"], obj.size)
            if wanted is None:
                self._xml(416, "<Error><Code>InvalidRange</Code></Error>", method == "HEAD")
                return
            (first, last), status = wanted, 206
            fields["Content-Range"] = f"bytes {first}-{last}/{obj.size}"
        fields["Content-Length"] = str(last - first + 1 if obj.size else 0)
        self._head(status, fields)
        if method == "GET" and obj.size:
            with open(obj.path, "rb") as f:
                offset, left = first, last - first + 1
                while left:
                    sent = os.sendfile(self.sock.fileno(), f.fileno(), offset, left)
                    if not sent:
                        raise OSError("the object ended early")
                    offset, left = offset + sent, left - sent

    def _xml(self, status: int, body: str, head_only: bool = False) -> None:
        data = ('<?xml version="1.0" encoding="UTF-8"?>' + body).encode()
        self._head(status, {"Content-Type": "application/xml", "Content-Length": str(len(data))})
        if not head_only:
            self.sock.sendall(data)

    def _head(self, status: int, fields: dict[str, str]) -> None:
        lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}"]
        lines += [f"{name}: {value}" for name, value in fields.items()]
        lines.append(f"x-amz-request-id: {threading.get_ident():x}")
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))


_REASONS = {200: "OK", 206: "Partial Content", 404: "Not Found", 416: "Range Not Satisfiable",
            501: "Not Implemented"}  # fmt: skip


def launch(workdir: str, s3rver: Server) -> Server:
    """s3rver's objects served by this module, a process of its own (its CPU is the
    store's); stopping it stops s3rver too."""
    (root,) = glob.glob(os.path.join(workdir, "s3rver-*"))  # Launcher.s3rver's directory
    argv = [sys.executable, "-m", "bench.probes.lean_store", "--root", root]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True)
    track_process(proc)
    assert proc.stdout is not None
    port = proc.stdout.readline().strip()
    if not port.isdigit():
        proc.kill()
        raise Unavailable("bench.probes.lean_store did not start")

    def stop() -> None:
        stop_process(proc)
        s3rver.stop()

    url = f"http://127.0.0.1:{port}"
    return replace(s3rver, name="lean store", endpoint_url=url, stop=stop, pid=proc.pid,
                   store_pids=(proc.pid,))  # fmt: skip


def serve(listener: socket.socket, objects: _Objects) -> None:
    """Accept until the listener closes; a thread per connection."""
    while True:
        try:
            sock, _ = listener.accept()
        except OSError:
            return
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=_Connection(sock, objects).serve, daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.probes.lean_store", description=__doc__)
    parser.add_argument("--root", required=True, help="s3rver's directory (its -d)")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.root):
        parser.error(f"--root: {args.root} is not a directory")
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    listener = socket.create_server(("127.0.0.1", 0), backlog=512)
    threading.Thread(target=serve, args=(listener, _Objects(args.root)), daemon=True).start()
    print(listener.getsockname()[1], flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    listener.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
