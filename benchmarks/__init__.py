"""Benchmarks of a3s-agent: `python -m benchmarks`, from the repository's root. What each section
measures and how: README.md beside this file."""
