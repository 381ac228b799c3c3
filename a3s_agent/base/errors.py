"""Domain errors. Faces map each kind to their own status codes (gRPC, HTTP)."""

from __future__ import annotations


class AgentError(Exception):
    """Base of every error the core reports to a caller; the message names what is wrong."""


class NotFound(AgentError):
    """A session, tool, skill, task or other named thing does not exist."""


class NotWaiting(NotFound):
    """No confirmation or external task with that id waits for an answer. A3S answers this one in
    the reply (`success=false` and the message), not with an error status: faces that follow A3S
    map it so, the others as any NotFound."""


class InvalidArgument(AgentError):
    """Malformed input; the message names the field at fault."""


class AlreadyExists(AgentError):
    """Something with that name or id exists already."""


class FailedPrecondition(AgentError):
    """The request is well formed but the system is not in a state to serve it."""


class ResourceExhausted(AgentError):
    """A limit (sessions, generations, sizes) would be exceeded."""


class Unavailable(AgentError):
    """A dependency (the LLM provider, a backend) cannot be reached or keeps failing."""


class Internal(AgentError):
    """The server failed in a way the caller did not cause (a defect, a broken disk); the message
    says what failed."""


class Cancelled(AgentError):
    """The operation was cancelled on request (Cancel), not by the caller going away."""


class ContextOverflow(FailedPrecondition):
    """The LLM provider refused the prompt as longer than the model's context window."""
