"""Security suite: attacks through the real interfaces (marker `security`)."""
