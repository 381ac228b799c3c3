"""The ways in: each face converts its wire format to calls of the application layer (app/) and
maps the domain errors back. The domain types come from app/types.py: a face imports nothing below
the application layer but base/ (a contract in pyproject.toml).

One package per face (grpc, http, coven, mcp, acp, relay); the modules here are what several faces
share: status.py (a domain error as a status, one table), agent_service.py (what CodeAgentService
says in every encoding), call_metadata.py, auth.py, readiness.py, refusals.py, open_files.py.
"""
