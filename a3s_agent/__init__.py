"""a3s-agent: a coding agent that other programs drive over gRPC."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("a3s-agent")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

NAME = "a3s-agent"
DESCRIPTION = "A coding agent served over gRPC: an LLM tool loop over built-in tools, with durable sessions."
HOMEPAGE = "https://github.com/a3s-lab/a3s-agent"
LICENSE = "MIT"
