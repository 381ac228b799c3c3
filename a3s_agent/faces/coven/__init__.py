"""The coven face: a3s-agent as an agent of a coven gateway (`coven.CovenControl/AgentStream`).

agent.py connects and reconnects, register.py and git.py say who the agent is, stream.py serves
one stream, request.py one SendMessage, tools.py its tool events, threads.py maps gateway threads
to sessions. See protos/coven/coven.proto and the coven agent protocol spec.
"""

from .agent import CovenAgent, CovenConfig, default_name, run_coven_agent

__all__ = ["CovenAgent", "CovenConfig", "default_name", "run_coven_agent"]
