"""Test doubles that the tests and the benchmarks share: scripted OpenAI-compatible and Anthropic
servers speaking the real wire formats (each also runnable as `python -m a3s_agent.testing.<fake>`),
free ports, connection floods, and a store of many sessions written straight into SQLite.

Nothing in the agent imports this package; it ships with it so that a program driving the agent
can run it against a scripted model too."""
