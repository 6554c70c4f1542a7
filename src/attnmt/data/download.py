"""Fetching one file of a registered dataset over HTTP(S), checked before it is kept.

:func:`fetch` writes the response into a ``.part`` file beside the destination and renames it
to the destination only once its SHA-256 equals the registry's, so that nothing but a checked
file ever has the destination's name. Whatever stops the transfer (a network error, a 404, an
HTML page sent in place of a gzip file, a checksum mismatch, the deadline, SIGINT or SIGTERM)
removes the ``.part`` file.

The deadline bounds the whole file, not each read: a server that trickles a byte now and then
never trips a per-read socket timeout, so a watchdog thread shuts the connection's socket down
when ``ATTNMT_DOWNLOAD_TIMEOUT`` seconds (default :data:`DEFAULT_TIMEOUT`) have passed since the
request began, which ends any read waiting on it at once.

Library: urllib.request (standard library: proxies from ``https_proxy``), tqdm for the
progress bar (shown on a terminal only).
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import socket
import tempfile
import threading
import urllib.error
from pathlib import Path

from attnmt import environment
from attnmt.atomic import publish
from attnmt.config.language_codes import canonical_pair, known_as, one_spelling_each
from attnmt.errors import ENVIRONMENT_ERRNOS, DataError, NetworkFailure, write_error
from attnmt.signals import StopSignals, put_off, stop_point

log = logging.getLogger(__name__)

TIMEOUT_ENV = environment.DOWNLOAD_TIMEOUT.name
# Seconds a whole file may take: Multi30k's largest file (640 KB) at 2 KB/s; a stalled or trickling
# server is given up after it.
DEFAULT_TIMEOUT = 300.0
OFFLINE_HINT = "offline? point --data-dir or ATTNMT_DATA at a local copy"
MIRROR_HINT = "a mirror's base URL is set by ATTNMT_MULTI30K_URL"
GZIP_MAGIC = b"\x1f\x8b"
CHUNK = 1 << 16


def download_timeout() -> float:
    """The whole-file deadline in seconds: ``$ATTNMT_DOWNLOAD_TIMEOUT``, else :data:`DEFAULT_TIMEOUT`.

    Raises:
        ConfigError: the variable is not a number of :data:`attnmt.ranges.DOWNLOAD_SECONDS`.
    """
    return environment.number(environment.DOWNLOAD_TIMEOUT, DEFAULT_TIMEOUT)


class _Sockets:
    """The sockets of the connections one download opens, for the watchdog to shut down."""

    def __init__(self) -> None:
        self.open: list[socket.socket] = []
        self.expired = False
        self._lock = threading.Lock()

    def add(self, sock: socket.socket) -> None:
        with self._lock:
            self.open.append(sock)
            if self.expired:
                _shutdown(sock)

    def expire(self) -> None:
        with self._lock:
            self.expired = True
            for sock in self.open:
                _shutdown(sock)


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # already closed
        pass


def _opener(sockets: _Sockets):
    """A urllib opener (proxies and redirects as ``urlopen``'s) whose connections record their
    sockets in ``sockets``."""
    import urllib.request

    def recording(base):
        class Connection(base):
            def connect(self) -> None:
                super().connect()
                sockets.add(self.sock)
        return Connection

    http_conn = recording(http.client.HTTPConnection)
    https_conn = recording(http.client.HTTPSConnection)

    class HTTPHandler(urllib.request.HTTPHandler):
        def http_open(self, req):
            return self.do_open(http_conn, req)

    class HTTPSHandler(urllib.request.HTTPSHandler):
        def https_open(self, req):
            return self.do_open(https_conn, req, context=self._context)

    return urllib.request.build_opener(HTTPHandler, HTTPSHandler)


def _check_start(url: str, first: bytes, content_type: str) -> None:
    """Refuse a response that is not a gzip file where one is expected (a proxy's or a host's
    HTML page, an error text)."""
    if not url.endswith(".gz") or first.startswith(GZIP_MAGIC):
        return
    if "html" in content_type.lower() or first.lstrip()[:1] == b"<":
        raise DataError(f"{url}: the server sent an HTML page ({content_type or 'no content type'}), not the "
                        f"gzip file: a proxy's or a login page? {OFFLINE_HINT}; {MIRROR_HINT}")
    raise DataError(f"{url}: the server sent something that is not a gzip file (it starts {first[:8]!r})")


def fetch(url: str, dest: Path, sha256: str, *, progress: bool | None = None) -> None:
    """Download ``url`` into ``dest``, kept only if its SHA-256 is ``sha256`` (module docstring).

    Args:
        url: an http(s) URL (a ``.gz`` URL must answer a gzip file).
        dest: the file to create (its folder is created); replaced atomically.
        sha256: the expected hex digest.
        progress: a tqdm bar on stderr: True, False, or None (on a terminal only).
    Raises:
        DataError: one line naming the URL and the reason: an HTTP error (404: the mirror has no
            such file), an HTML page, a checksum mismatch (both digests).
        NetworkFailure: the server unreachable, the connection refused or cut, the deadline passed.
        WriteError: ``dest``'s folder cannot be written (``DiskFull`` for a full disk).
        Interrupted: SIGINT or SIGTERM arrived (the ``.part`` file is removed first).
    """
    seconds = download_timeout()
    dest.parent.mkdir(parents=True, exist_ok=True)
    log.info("downloading %s", url)
    sockets = _Sockets()
    watchdog = threading.Timer(seconds, sockets.expire)
    watchdog.daemon = True
    tmp = None
    with StopSignals(raising=True):
        try:
            with put_off():  # the .part file is created and its name kept before a stop can raise
                fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=dest.name + ".", suffix=".part")
            with os.fdopen(fd, "wb") as out:
                stop_point()
                watchdog.start()
                digest = _receive(_opener(sockets).open(url, timeout=seconds), url, out, dest.name, progress)
            if sockets.expired:
                raise TimeoutError
            if digest != sha256:
                raise DataError(f"{url}: SHA-256 mismatch (got {digest}, expected {sha256}); the file was not kept")
            publish(tmp, dest)  # fsynced, renamed, the directory fsynced
            tmp = None
        except urllib.error.HTTPError as e:
            raise DataError(f"cannot download {url} (HTTP {e.code} {e.reason}: the server has no such file; "
                            f"{MIRROR_HINT})") from None
        except (OSError, http.client.HTTPException) as e:
            if isinstance(e, OSError) and (e.filename or e.errno in ENVIRONMENT_ERRNOS):  # the disk, not the network
                raise write_error(f"{e.filename or dest}: cannot write: {e.strerror or e}", e) from None
            reason = getattr(e, "reason", None) or e
            if sockets.expired or isinstance(e, TimeoutError):
                reason = f"no complete file within {seconds:g} seconds; {TIMEOUT_ENV} sets the limit"
            raise NetworkFailure(f"cannot download {url} ({reason}); {OFFLINE_HINT}") from None
        finally:
            watchdog.cancel()
            if tmp is not None and os.path.exists(tmp):
                os.unlink(tmp)


def _receive(resp, url: str, out, name: str, progress: bool | None) -> str:
    """Copy the body of ``resp`` into ``out`` (a progress bar named ``name``); its hex SHA-256.

    Raises:
        DataError: not a gzip file where one is expected (:func:`_check_start`).
        ConnectionError: fewer bytes than the Content-Length header announced (a connection cut
            mid-file, or shut down by the watchdog).
    """
    from tqdm import tqdm

    with resp:
        length = resp.headers.get("Content-Length", "")
        expected = int(length) if length.isdigit() else None
        content_type = resp.headers.get("Content-Type", "")
        digest = hashlib.sha256()
        received = 0
        head = b""  # the first bytes, for _check_start
        with tqdm(total=expected, unit="B", unit_scale=True, desc=name, leave=False,
                  disable=None if progress is None else not progress) as bar:
            while chunk := resp.read1(CHUNK):
                if len(head) < 2:
                    head += chunk[:64]
                    if len(head) >= 2:
                        _check_start(url, head, content_type)
                out.write(chunk)
                digest.update(chunk)
                received += len(chunk)
                bar.update(len(chunk))
    if expected is not None and received < expected:
        raise ConnectionError(f"the connection closed after {received} of {expected} bytes")
    return digest.hexdigest()


def download_dataset(name: str, pairs: list[str] | None = None, data_dir: str | Path | None = None, *,
                     progress: bool | None = None) -> tuple[Path, list[Path]]:
    """Fetch every file of a registered dataset's ``pairs`` (all of them where None): every split
    (train, validation, each test set) of their languages, into ``data_dir/<name>/`` (the layout
    ``ATTNMT_DATA=data_dir`` reads) or the cache (``attnmt.data.corpus.cache_dir``). A file
    already there is kept if its SHA-256 is the registry's and fetched again otherwise.

    Returns:
        (the folder, the files in it), in the registry's split order.
    Raises:
        DataError: an unknown dataset or pair (the message names those it has), or see :func:`fetch`.
        Interrupted: SIGINT or SIGTERM (no ``.part`` file is left).
    """
    from attnmt.data.corpus import base_url, cache_dir, dataset_spec, sha256_file

    spec = dataset_spec(name)
    try:
        one_spelling_each(pairs or [], "--pairs", canonical_pair)
    except ValueError as e:
        raise DataError(str(e)) from None
    chosen = []
    for pair in pairs or []:
        known = known_as(pair, spec.pairs, canonical_pair)
        if known is None:
            raise DataError(f"dataset {spec.name} has no pair {pair!r}; it has {', '.join(spec.pairs)}")
        if known in chosen:
            raise DataError(f"--pairs names {pair!r} twice: give it once")
        chosen.append(known)
    languages = dict.fromkeys(lang for pair in (chosen or spec.pairs) for lang in pair.split("-"))
    download_timeout(), base_url(spec)  # the environment's settings checked before any file is touched
    folder = Path(data_dir) / spec.name if data_dir is not None else cache_dir(spec.name)
    files = []
    for split in spec.splits:
        for lang in languages:
            filename = spec.filename(split, lang)
            dest = folder / filename
            if dest.is_file() and sha256_file(dest) == spec.sha256[filename]:
                log.info("%s: already there, SHA-256 checked", dest)
            else:
                if dest.exists():
                    log.warning("%s: its SHA-256 is not the registry's; fetching it again", dest)
                fetch(base_url(spec) + filename, dest, spec.sha256[filename], progress=progress)
            files.append(dest)
    return folder, files
