"""The application layer: one method per operation, in domain types, for every face to call.

application.py builds the services over one Runtime, a module per group of operations (sessions,
generation, control, events, permissions, tools, skills, ...). Faces convert their wire format to
these calls and map the domain errors (base/errors.py) back; the domain types they convert are
types.py's, tool_kit.py is what a face needs to make tools of its own, relay.py runs the relay.
No face imports anything below this layer but base/ (a contract in pyproject.toml)."""

from .application import Application

__all__ = ["Application"]
