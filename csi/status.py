"""gRPC status for the CSI services: one error type, one decorator, requests logged without secrets.

Handlers raise `CsiError(code, message)`; the `rpc` decorator turns it into the call's status
(one line, as the spec wants a human-readable message) and turns anything unexpected into
INTERNAL with the traceback in the driver's log, never in the answer. Every call is logged with
its request, from which every `secrets` map is removed first (the spec marks them csi_secret).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import TypeVar

import grpc
from google.protobuf import text_format
from google.protobuf.message import Message

log = logging.getLogger("pffs.csi")

Request = TypeVar("Request", bound=Message)
Response = TypeVar("Response", bound=Message)
Servicer = TypeVar("Servicer")
# A CSI method: (the service, its request, the call) -> its response.
Handler = Callable[[Servicer, Request, grpc.ServicerContext], Response]


class CsiError(Exception):
    """A failure with the gRPC status code the CSI spec asks for."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def invalid(message: str) -> CsiError:
    return CsiError(grpc.StatusCode.INVALID_ARGUMENT, message)


def redacted(request: Message) -> str:
    """The request on one line, without any field the spec marks as secret."""
    copy = type(request)()
    copy.CopyFrom(request)
    for field in copy.DESCRIPTOR.fields:
        if field.name == "secrets":
            copy.ClearField("secrets")
    text: str = text_format.MessageToString(copy, as_one_line=True)
    return text


def rpc(handler: Handler[Servicer, Request, Response]) -> Handler[Servicer, Request, Response]:
    """Log the call and map its errors to a gRPC status."""
    name = handler.__name__

    @functools.wraps(handler)
    def wrapper(self: Servicer, request: Request, context: grpc.ServicerContext) -> Response:
        log.info("%s %s", name, redacted(request))
        try:
            response = handler(self, request, context)
        except CsiError as exc:
            log.info("%s -> %s: %s", name, exc.code.name, exc.message)
            context.abort(exc.code, exc.message)
        except Exception as exc:
            log.exception("%s failed", name)
            context.abort(grpc.StatusCode.INTERNAL, f"{name}: {type(exc).__name__}: {exc}")
        log.debug("%s -> OK", name)
        return response

    return wrapper
