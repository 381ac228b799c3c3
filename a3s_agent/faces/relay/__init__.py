"""The relay face: `a3s-agent relay new|resume`, a session whose LLM is a person relaying a chat
window by copy-paste (the relay provider of text_protocol/relay.py), run in this process over the
application layer (cli.py)."""

from .cli import relay_new, relay_resume

__all__ = ["relay_new", "relay_resume"]
