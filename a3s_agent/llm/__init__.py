"""LLM providers: one small streaming interface, implementations behind it."""
