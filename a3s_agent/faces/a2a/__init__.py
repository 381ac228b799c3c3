"""The A2A server face (Agent2Agent 1.0, through the official `a2a-sdk`): the agent card at the
well-known path and JSON-RPC at /a2a on the HTTP listener. A context is a session, a task is a
generation of it (app/asking.py: the run with the questions it waits on, and the files it
changed); the SDK keeps the tasks and streams them."""

from .http import A2aHttp

__all__ = ["A2aHttp"]
