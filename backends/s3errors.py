"""What an S3 failure means, for every S3 call (boto3's and the GET engine's alike): which S3
error codes are a missing object, a refusal or the store's passing trouble, whether a failure
is worth a retry, and the pffs error it becomes. S3Backend is its only user; keeping the
mapping here keeps it one code path.
"""

from __future__ import annotations

import botocore.exceptions

from pffs.errors import (
    BackendError,
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
# The store asks for fewer requests: prefetch backs off (pffs.routing.health never marks them down).
THROTTLE_CODES = {"SlowDown", "Throttling", "ThrottlingException", "TooManyRequests", "429"}
DENIED_CODES = {
    "403",
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
}


def is_transient(exc: BaseException) -> bool:
    """Whether a failure may pass on its own (pffs.retry's question)."""
    if isinstance(exc, Transient):
        return True
    if isinstance(exc, botocore.exceptions.ClientError):
        return error_code(exc) in TRANSIENT_CODES
    return isinstance(
        exc,
        (
            botocore.exceptions.ConnectionError,  # refused, unreachable, connect timeouts
            # Resets and closes mid-request (ConnectionClosedError), read timeouts and
            # bodies cut short (ResponseStreamingError) are all HTTPClientErrors.
            botocore.exceptions.HTTPClientError,
            botocore.exceptions.IncompleteReadError,
        ),
    )


def translate(exc: BaseException, where: str) -> PffsError:
    """The pffs error for a failure of a request about `where` (an s3:// URL)."""
    if isinstance(exc, PffsError):
        return exc
    if isinstance(exc, botocore.exceptions.NoCredentialsError):
        return PermissionDenied(
            "no AWS credentials found: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
            "AWS_PROFILE or ~/.aws/credentials"
        )
    if isinstance(exc, botocore.exceptions.ClientError):
        code = error_code(exc)
        if code in NOT_FOUND_CODES:
            return NotFound(f"{where} does not exist")
        if code in DENIED_CODES:
            return PermissionDenied(f"{where}: access denied ({code})")
        if code in THROTTLE_CODES:
            return Throttled(f"{where}: throttled ({code}) after retries")
        if code in TRANSIENT_CODES:
            return Transient(f"{where}: store unavailable ({code}) after retries")
        return BackendError(f"{where}: {code}: {_message(exc)}")
    if isinstance(exc, botocore.exceptions.EndpointConnectionError):
        return Transient(f"cannot reach the S3 endpoint {exc.kwargs.get('endpoint_url')}")
    if is_transient(exc):
        return Transient(f"{where}: {type(exc).__name__} after retries")
    return BackendError(f"{where}: {type(exc).__name__}: {exc}")


def error_code(exc: botocore.exceptions.ClientError) -> str:
    """The S3 error code of an answer, else its HTTP status."""
    error = exc.response.get("Error", {})
    code = str(error.get("Code", ""))
    if not code or code.isdigit():
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return str(status or code)
    return code


def _message(exc: botocore.exceptions.ClientError) -> str:
    text = str(exc.response.get("Error", {}).get("Message", "") or "")
    return text.splitlines()[0] if text else ""
