"""What lasts: session.py is a session's record, protocol.py the Store protocol (sessions, messages,
Initialize, each session's log, run leases, the channel between replicas), events.py the durable
event log and its subscribers; sqlite_store.py keeps it all in SQLite, postgres_store.py in a
PostgreSQL database replicas share (postgres_schema.py its migrations, postgres_channel.py
LISTEN/NOTIFY between replicas, sealed by channel_seal.py, postgres_bounds.py the bounds on its
waits).
"""
