"""Bearer-token authentication for both faces (--auth-token-file, A3S_AUTH_TOKEN_FILE or A3S_AUTH_TOKEN).

When a token is set, every gRPC call except grpc.health and reflection (grpc/auth.py), and every
HTTP route except the probes (http/auth.py), needs `authorization: Bearer <token>`; others get
UNAUTHENTICATED / 401 and a line in the shared RefusalLog (peer, method, why). The comparison
takes constant time.
"""

from __future__ import annotations

import hmac

MISSING = "missing or wrong bearer token: send the header 'authorization: Bearer <token>'"


def token_matches(expected: str, header: str | None) -> bool:
    scheme, _, given = (header or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), expected.encode())


def why_refused(header: str | None) -> str:
    """Why a request was refused; never the header's value."""
    return "no bearer token" if not header else "wrong bearer token"
