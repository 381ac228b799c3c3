"""The agent's engine, knowing nothing of protobuf or HTTP, in rooms by job. A room imports
only the rooms below it (the contract "Core's rooms" in pyproject.toml):

    loop, prompt, skills   the agent loop; the system prompt; skills and which session has which
    sessions               sessions kept in memory and written through; the control plane
    store                  a session's record, the Store protocol, the event log, the two stores
    policy                 permission policies and what a shell command line runs
"""
