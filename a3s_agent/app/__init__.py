"""The application layer: one method per operation, in domain types, for every face to call.

application.py builds the services over one Runtime, a module per group of operations (sessions,
generation, control, events, permissions, tools, skills, ...). Faces convert their wire format to
these calls and map the domain errors (base/errors.py) back; no face reaches past this layer into
the runtime's parts."""

from .application import Application

__all__ = ["Application"]
