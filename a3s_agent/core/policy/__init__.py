"""Permission policies: permissions.py decides a call (deny, ask or allow), rules.py parses a rule,
matching.py matches its pattern against the call (the path, URL or text the tool declares). For
bash, shell_commands.py finds what a command line runs (bashlex), shell_rules.py matches
`Bash(...)` patterns against it, shell_grants.py proves it by allow rules and finds the files it
writes, shell_split.py splits it as text. Agent Spaces' policies are decided by the same engine.
"""
