"""How every S3 call is made, reads and writes alike: with pffs's retries (pffs.retry, botocore's
own are off), counted and timed by pffs.metrics, and its failure translated into a pffs error by
pffs.backends.s3errors. S3Backend owns one and shares it with its writes (s3writes.py), so a
write fails, retries and shows in the metrics the way a read does.

A request's terms say how many times its source has come back up (`RetryTerms.recovered`);
the first request to bring a higher count calls `renew` before it goes out, which lets go of the
connections opened before (S3Backend: the GET engine's and boto3's).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from pffs import metrics
from pffs.backends.s3errors import Kind, classify, is_transient, translate
from pffs.config import RetryConfig
from pffs.errors import PffsError
from pffs.retry import RetryTerms, stream_with_retry

T = TypeVar("T")

# The mount's preflight check must answer within seconds, not after a minute of retries.
QUICK = RetryConfig(attempts=2, base_delay=0.1, max_delay=0.5, total_timeout=5.0)


class S3Calls:
    """Calls to one bucket and prefix (`source_id` names them in metrics and logs)."""

    def __init__(
        self,
        source_id: str,
        url_prefix: str,
        policy: RetryConfig,
        renew: Callable[[], None] | None = None,
    ) -> None:
        """`url_prefix`: the s3:// URL a path is appended to in error messages; `renew`: lets
        go of the connections open now (called once per return of the source)."""
        self.source_id = source_id
        self.url_prefix = url_prefix
        self.policy = policy
        self.retries = 0  # transient failures retried, for stats
        self._renew = renew
        self._recovered = 0  # the source's returns seen so far
        self._renew_lock = threading.Lock()

    def run(
        self,
        fn: Callable[[], T],
        what: str,
        path: str = "",
        quick: bool = False,
        terms: RetryTerms | None = None,
    ) -> T:
        """`fn()` retried while it fails transiently, under the request's `terms`; its last
        failure raised as it is."""
        (result,) = self.stream(lambda: iter((fn(),)), what, path, quick, terms)
        return result

    def stream(
        self,
        start: Callable[[], Iterator[T]],
        what: str,
        path: str = "",
        quick: bool = False,
        terms: RetryTerms | None = None,
    ) -> Iterator[T]:
        """`run` of a streamed answer: what `start()` yields, as it comes (its bytes counted as
        they do), started again where it failed transiently (pffs.retry.stream_with_retry)."""
        if terms is not None and terms.recovered > self._recovered:
            self._renew_after(terms.recovered)
        # Counted, timed and logged when slow by pffs.metrics (one request, retries included).
        with metrics.BackendRequest(self.source_id, what, path, self._count_retry) as request:
            for item in stream_with_retry(
                start,
                is_transient=is_transient,
                policy=QUICK if quick else self.policy,
                what=f"{what} {self.source_id}",
                on_retry=request.retried,
                terms=terms,
            ):
                yield request.received(item)

    def do(self, fn: Callable[[], T], what: str, path: str, terms: RetryTerms | None = None) -> T:
        """`run`, its failure translated into a pffs error about `path`."""
        try:
            return self.run(fn, what, path, terms=terms)
        except Exception as exc:
            raise self.translate(exc, path) from exc

    def head(
        self, client: Any, bucket: str, key: str, path: str, terms: RetryTerms | None = None
    ) -> dict[str, Any] | None:
        """The HEAD answer of the object at `key` (`path` in the source), or None where there
        is none."""
        try:
            answer: dict[str, Any] = self.run(
                lambda: client.head_object(Bucket=bucket, Key=key), "HEAD", path, terms=terms
            )
        except Exception as exc:
            if classify(exc) is Kind.NOT_FOUND:
                return None
            raise self.translate(exc, path) from exc
        return answer

    def _renew_after(self, recovered: int) -> None:
        """The source came back up since the last request: once, let go of the connections."""
        with self._renew_lock:
            if recovered <= self._recovered:
                return  # another thread did it
            self._recovered = recovered
            if self._renew is not None:
                self._renew()

    def translate(self, exc: BaseException, path: str) -> PffsError:
        return translate(exc, self.url(path))

    def url(self, path: str) -> str:
        return self.url_prefix + path

    def _count_retry(self, _exc: BaseException) -> None:
        self.retries += 1
