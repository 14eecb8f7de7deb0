"""How pffs logs: one line per event, and never a credential.

`LineFormatter` writes `time LEVEL logger: message` on one line (a message's own line breaks
become " | "; a traceback, shown only with --debug or for unexpected errors, keeps its lines) and
scrubs secrets from everything it writes: the values of the AWS secret environment variables of
this process, the secret keys and tokens this process was handed as values (`hide`, called for
every `pffs.credentials.Credentials`), passwords in URLs
(`http://user:secret@host`), and `key=value` pairs whose key names a secret or a signature.
"""

from __future__ import annotations

import logging
import os
import re

# Environment variables whose values must never reach a log.
SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")
MASK = "***"
# Secret values handed to this process as values (pffs.credentials), masked like the above.
_HIDDEN: set[str] = set()
_URL_PASSWORD = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@]*):[^/\s@]+@")
_SECRET_PAIR = re.compile(
    r"(?i)\b(secret[_-]?access[_-]?key|secretaccesskey|session[_-]?token|sessiontoken|"
    r"security[_-]?token|x-amz-signature|x-amz-security-token|signature|password|passwd|"
    r"authorization|credential)(\"?'?\s*[:=]\s*\"?'?)([^\s\"',&;]+)"
)


def redact(text: str, secrets: tuple[str, ...] = ()) -> str:
    """`text` with credentials replaced by ***."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, MASK)
    text = _URL_PASSWORD.sub(rf"\1:{MASK}@", text)
    return _SECRET_PAIR.sub(rf"\1\2{MASK}", text)


def hide(*values: str | None) -> None:
    """Mask these values in every line logged from now on."""
    _HIDDEN.update(v for v in values if v and len(v) >= 8)


def _env_secrets() -> tuple[str, ...]:
    # Short values would mask ordinary words; real keys and tokens are long.
    return tuple(v for k in SECRET_ENV if len(v := os.environ.get(k, "")) >= 8)


class LineFormatter(logging.Formatter):
    """`2024-01-01 12:00:00,000 WARNING pffs.metrics: message`, one line, credentials masked."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.secrets = _env_secrets()

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        return line.replace("\r", "").replace("\n", " | ")

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record), (*self.secrets, *_HIDDEN))


def level_of(name: str) -> int:
    """logging's level for 'debug', 'info', 'warning' or 'error'."""
    level = logging.getLevelName(name.upper())
    if not isinstance(level, int):
        raise ValueError(f"unknown log level {name!r}")
    return level
