"""The fault and load suite: crash safety, load, hostile input, disconnects (marker `fault`)."""
