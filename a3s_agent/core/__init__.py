"""The agent's core: sessions and their store, knowing nothing of protobuf or HTTP."""
