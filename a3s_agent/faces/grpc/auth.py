"""The gRPC face's bearer-token check (see faces/auth.py)."""

from __future__ import annotations

import grpc

from ..auth import MISSING, token_matches, why_refused
from ..refusals import RefusalLog
from .handlers import ServiceInterceptor, refusing


class BearerTokenInterceptor(ServiceInterceptor):
    def __init__(self, token: str, refusals: RefusalLog) -> None:
        self._token = token
        self._refusals = refusals

    def guard(
        self, handler: grpc.RpcMethodHandler, details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler:
        header = dict(details.invocation_metadata or ()).get("authorization")
        if token_matches(self._token, header):
            return handler
        # The peer is known only inside the call, so the refusing handler logs it.
        why = why_refused(header)
        return refusing(
            handler,
            grpc.StatusCode.UNAUTHENTICATED,
            MISSING,
            before=lambda context: self._refusals.refused(context.peer(), details.method, why),
        )
