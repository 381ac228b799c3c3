"""The application layer: one method per operation, in domain types, for every face to call.

Faces convert their wire format to these calls and map the domain errors (core/errors.py) back;
no face reaches past this layer into the runtime's parts."""

from .application import Application

__all__ = ["Application"]
