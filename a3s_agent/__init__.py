"""a3s-agent: a coding agent that other programs drive over gRPC."""

# The one place the version is written (pyproject.toml reads it from here): looking it up with
# importlib.metadata instead cost a fifth of a second at every start.
__version__ = "0.1.0"

NAME = "a3s-agent"
DESCRIPTION = "A coding agent served over gRPC: an LLM tool loop over built-in tools, with durable sessions."
HOMEPAGE = "https://github.com/a3s-lab/a3s-agent"
LICENSE = "MIT"
