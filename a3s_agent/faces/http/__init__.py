"""The HTTP face: /healthz, the A3S REST adapter with server-sent events, and the WebSocket JSON form."""

from .app import build_app
from .listener import HttpBindError, HttpListener, start_http

__all__ = ["HttpBindError", "HttpListener", "build_app", "start_http"]
