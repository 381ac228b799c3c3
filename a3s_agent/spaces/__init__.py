"""Agent Spaces (specs/agent-spaces-*.md): JSON operations messages run as events in a workspace
under a policy, paused for approval and resumed.

service.py is the service (spaces and runs), runner.py runs one batch, storage.py is what a store
keeps and does, store.py keeps spaces, runs and events in SQLite and postgres_store.py in a
PostgreSQL database replicas share, validation.py checks messages, policies.py and paths.py decide
what a policy allows (with core/policy/shell_commands.py, what a shell line runs, and
core/policy/shell_rules.py, how a `Bash(...)` rule matches it, which the session permission rules
use too). The runtime builds the service; faces reach it through the application layer
(app/spaces.py).
"""
