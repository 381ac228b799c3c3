"""The agent's tools: the registry, the sandbox every tool runs in, and the built-in tools by family."""
