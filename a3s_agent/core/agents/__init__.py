"""Agents: what a subagent the `task` tool starts is (its prompt, tools and model), the built-in
ones and those of the operator's and the workspace's agent files."""
