"""Base types every layer shares: errors, models, JSON helpers, SQLite plumbing, backoff, secrets."""
