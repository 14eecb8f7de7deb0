"""S3 credentials as values: the one type a mount carries them in, and the check of each value.

Every front end that hands a mount its keys (`pffs mount --credentials-file`, mount(8)'s
`credentials_file=`, `pffs fluid`, the CSI driver) puts them in a `Credentials` of the source's
config, and the S3 backend gives them to its boto3 session as arguments. No front end writes
a credentials file for botocore or sets an AWS_* variable: a value is never parsed as config
text, so a newline in a key cannot add a profile, and no `credential_process` is ever read
from what a front end was given.

The credentials file (`credentials_text`, `parse_credentials`) is the subset of an AWS
credentials file that holds values: a section's `aws_access_key_id`, `aws_secret_access_key`
and `aws_session_token`. Anything else in it (a `credential_process`, a role to assume) is
never read, let alone run.
"""

from __future__ import annotations

import configparser
import unicodedata
from dataclasses import dataclass, field

from pffs.errors import UsageError
from pffs.logs import hide

# The keys of a credentials file section, by Credentials field.
FILE_KEYS = {
    "access_key_id": "aws_access_key_id",
    "secret_access_key": "aws_secret_access_key",
    "session_token": "aws_session_token",
}
# A session token is a few KiB at most; anything far larger is not a credential.
MAX_VALUE = 16 << 10


def value_problem(value: str) -> str | None:
    """Why `value` cannot be a credential (empty, too long, a control character such as a
    newline), or None when it can."""
    if not value:
        return "is empty"
    if len(value) > MAX_VALUE:
        return f"is longer than {MAX_VALUE} characters"
    for char in value:
        if unicodedata.category(char) == "Cc":  # \n, \r, \t, NUL, DEL, C1 controls
            return f"holds a control character ({char!r}); a credential is one line of text"
    return None


def checked(value: str, where: str) -> str:
    """`value` when it can be a credential; UsageError naming `where` otherwise."""
    problem = value_problem(value)
    if problem is not None:
        raise UsageError(f"{where} {problem}")
    return value


@dataclass(frozen=True)
class Credentials:
    """An access key, its secret and maybe a session token. The secret parts never show in a
    repr, so a logged config or a traceback cannot carry them."""

    access_key_id: str
    secret_access_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        # Front ends check each value first, naming their own field; this is the last guard.
        for name in FILE_KEYS:
            value = getattr(self, name)
            if value is not None:
                checked(value, name)
        hide(self.secret_access_key, self.session_token)


def credentials_text(credentials: Credentials) -> str:
    """`credentials` as a credentials file of one [default] section (values already checked:
    none holds a line break, so none can start another line)."""
    lines = ["[default]"]
    for name, key in FILE_KEYS.items():
        value = getattr(credentials, name)
        if value is not None:
            lines.append(f"{key} = {value}")
    return "\n".join(lines) + "\n"


def parse_credentials(text: str, where: str, section: str | None = None) -> Credentials:
    """The keys of a credentials file's `section` (else [default], else its only section), as
    values; UsageError naming `where` for a file that does not hold them."""
    parser = configparser.ConfigParser(interpolation=None, default_section="\0none")
    try:
        parser.read_string(text, where)
    except configparser.Error as exc:
        first = str(exc).splitlines()[0]
        raise UsageError(f"{where} is not a credentials file: {first}") from None
    sections = parser.sections()
    if section is None:
        if "default" in sections:
            section = "default"
        elif len(sections) == 1:
            section = sections[0]
        else:
            raise UsageError(f"{where}: no [default] section (name one with --profile)")
    if section not in sections:
        raise UsageError(f"{where}: no section [{section}]")
    found = parser[section]
    values: dict[str, str | None] = {}
    for name, key in FILE_KEYS.items():
        value = found.get(key)
        values[name] = None if value is None else checked(value, f"{where} [{section}] {key}")
    access_key_id, secret_access_key = values["access_key_id"], values["secret_access_key"]
    if access_key_id is None or secret_access_key is None:
        raise UsageError(
            f"{where} [{section}]: aws_access_key_id and aws_secret_access_key are required "
            "(only keys are read from the file, never a credential_process or a role)"
        )
    return Credentials(access_key_id, secret_access_key, values["session_token"])
