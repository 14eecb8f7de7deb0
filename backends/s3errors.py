"""What an S3 failure means, for every S3 call, boto3's and the GET engine's alike.

The two HTTP stacks fail in their own types: boto3 raises botocore's exceptions, the lean GET
engine (s3get.py) raises `S3RequestFailed`. `classify` is the one place that reads either and
decides what the failure is (a missing object, a refusal, the store's or the network's passing
trouble, ...); whether a failure is worth a retry (`is_transient`, pffs.retry's question) and the
pffs error it becomes (`translate`) both follow from it.
"""

from __future__ import annotations

import enum

import botocore.exceptions

from pffs.errors import (
    BackendError,
    Changed,
    NotFound,
    PermissionDenied,
    PffsError,
    Throttled,
    Transient,
)

TRANSIENT_CODES = {
    "InternalError",
    "ServiceUnavailable",
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestTimeout",
    "RequestTimeTooSkewed",
    "TooManyRequests",
    "429",
    "500",
    "502",
    "503",
    "504",
}
NOT_FOUND_CODES = {"404", "NoSuchKey", "NoSuchBucket", "NotFound"}
# The store asks for fewer requests: loading ahead backs off (pffs.routing.health never marks
# them down).
THROTTLE_CODES = {"SlowDown", "Throttling", "ThrottlingException", "TooManyRequests", "429"}
DENIED_CODES = {
    "403",
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
}
BAD_RANGE_CODES = {"InvalidRange", "416"}
CHANGED_CODES = {"PreconditionFailed", "412"}
NO_CREDENTIALS = (
    "no AWS credentials found: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
    "AWS_PROFILE or ~/.aws/credentials"
)


class Unanswered(enum.Enum):
    """Why a request of the GET engine got no answer, or none whole."""

    NO_CREDENTIALS = "no credentials to sign it with"
    UNREACHABLE = "cannot connect"
    CONNECT_TIMEOUT = "connect timed out"
    TLS = "TLS failed"
    READ_TIMEOUT = "read timed out"
    CUT_SHORT = "connection closed mid-request"


class S3RequestFailed(Exception):
    """A request of the GET engine that failed: either the store answered an error (`status`,
    its S3 error `code`, or the status as text where the body names none, and `message`), or
    there was no whole answer (`unanswered` says why)."""

    def __init__(
        self,
        url: str,
        *,
        status: int = 0,
        code: str = "",
        message: str = "",
        unanswered: Unanswered | None = None,
    ) -> None:
        self.url = url
        self.status = status
        self.code = code or (str(status) if status else "")
        self.message = message
        self.unanswered = unanswered
        what = unanswered.value if unanswered is not None else f"{self.code}: {message}"
        super().__init__(f"{url}: {what}")


class Kind(enum.Enum):
    """What a failed S3 call means."""

    NOT_FOUND = enum.auto()
    DENIED = enum.auto()
    NO_CREDENTIALS = enum.auto()
    TRANSIENT = enum.auto()  # the store's or the network's passing trouble: worth a retry
    BAD_RANGE = enum.auto()  # a range that starts past the object's end
    CHANGED = enum.auto()  # a precondition (If-Match) the object no longer meets
    OTHER = enum.auto()


# boto3's failures without an answer that may pass on their own.
_BOTO_TRANSIENT = (
    botocore.exceptions.ConnectionError,  # refused, unreachable, connect timeouts
    # Resets and closes mid-request (ConnectionClosedError), read timeouts and bodies cut
    # short (ResponseStreamingError) are all HTTPClientErrors.
    botocore.exceptions.HTTPClientError,
    botocore.exceptions.IncompleteReadError,
)


# Credentials the chain could not get (none at all, or a refresh that failed: a
# credential_process, a role to assume, the instance's metadata) when a request was signed.
_CREDENTIAL_FAILURES = (
    botocore.exceptions.NoCredentialsError,
    botocore.exceptions.CredentialRetrievalError,
    botocore.exceptions.PartialCredentialsError,
    botocore.exceptions.RefreshWithMFAUnsupportedError,
)


def classify(exc: BaseException) -> Kind:
    """What a failure of an S3 call means, whichever stack raised it: the one place that
    decides."""
    if isinstance(exc, Transient):
        return Kind.TRANSIENT
    code = error_code(exc)
    if code is not None:  # the store answered
        if code in NOT_FOUND_CODES:
            return Kind.NOT_FOUND
        if code in DENIED_CODES:
            return Kind.DENIED
        if code in TRANSIENT_CODES:
            return Kind.TRANSIENT
        if code in BAD_RANGE_CODES:
            return Kind.BAD_RANGE
        if code in CHANGED_CODES:
            return Kind.CHANGED
        return Kind.OTHER
    if isinstance(exc, _CREDENTIAL_FAILURES):
        return Kind.NO_CREDENTIALS
    if isinstance(exc, S3RequestFailed):
        if exc.unanswered is Unanswered.NO_CREDENTIALS:
            return Kind.NO_CREDENTIALS
        return Kind.TRANSIENT  # every other request without a whole answer
    if isinstance(exc, _BOTO_TRANSIENT):
        return Kind.TRANSIENT
    return Kind.OTHER


def is_transient(exc: BaseException) -> bool:
    """Whether a failure may pass on its own (pffs.retry's question)."""
    return classify(exc) is Kind.TRANSIENT


def translate(exc: BaseException, where: str) -> PffsError:
    """The pffs error for a failure of a request about `where` (an s3:// URL)."""
    if isinstance(exc, PffsError):
        return exc
    kind = classify(exc)
    code = error_code(exc)
    if kind is Kind.NOT_FOUND:
        return NotFound(f"{where} does not exist")
    if kind is Kind.DENIED:
        return PermissionDenied(f"{where}: access denied ({code})")
    if kind is Kind.NO_CREDENTIALS:
        if isinstance(exc, botocore.exceptions.BotoCoreError) and not isinstance(
            exc, botocore.exceptions.NoCredentialsError
        ):
            first = (str(exc).splitlines() or [type(exc).__name__])[0]
            return PermissionDenied(f"cannot get AWS credentials: {first}")
        return PermissionDenied(NO_CREDENTIALS)
    if kind is Kind.CHANGED:
        return Changed(f"{where} changed at the source while open")
    if kind is Kind.TRANSIENT:
        if code in THROTTLE_CODES:
            return Throttled(f"{where}: throttled ({code}) after retries")
        if code is not None:
            return Transient(f"{where}: store unavailable ({code}) after retries")
        if isinstance(exc, botocore.exceptions.EndpointConnectionError):
            return Transient(f"cannot reach the S3 endpoint {exc.kwargs.get('endpoint_url')}")
        if isinstance(exc, S3RequestFailed) and exc.unanswered is Unanswered.UNREACHABLE:
            return Transient(f"cannot reach the S3 endpoint of {exc.url}")
        return Transient(f"{where}: {_no_answer(exc)} after retries")
    if code is not None:
        return BackendError(f"{where}: {code}: {_message(exc)}")
    return BackendError(f"{where}: {type(exc).__name__}: {exc}")


def error_code(exc: BaseException) -> str | None:
    """The S3 error code of the store's error answer (else its HTTP status), or None where
    the failure is no answer of the store's."""
    if isinstance(exc, S3RequestFailed):
        return exc.code or None
    if not isinstance(exc, botocore.exceptions.ClientError):
        return None
    code = str(exc.response.get("Error", {}).get("Code", ""))
    if not code or code.isdigit():
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return str(status or code)
    return code


def _message(exc: BaseException) -> str:
    if isinstance(exc, S3RequestFailed):
        text = exc.message
    else:
        assert isinstance(exc, botocore.exceptions.ClientError)
        text = str(exc.response.get("Error", {}).get("Message", "") or "")
    return text.splitlines()[0] if text else ""


def _no_answer(exc: BaseException) -> str:
    if isinstance(exc, S3RequestFailed) and exc.unanswered is not None:
        cause = str(exc.__cause__ or "").splitlines()
        return exc.unanswered.value + (f" ({cause[0]})" if cause else "")
    return type(exc).__name__
