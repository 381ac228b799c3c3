"""The system prompt: system.py puts it together from the built-in one (or the session's own),
workspace_facts.py (the root, the git branch, the layout), instructions.py (the project's
AGENTS.md, CLAUDE.md and .a3s/instructions.md) and the instructions of the session's skills.
"""
