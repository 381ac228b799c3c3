"""Scheduled jobs (A3S's cron group): their schedules, the scheduler that fires them once across
replicas, and what a firing does. The jobs and their history are the store's (core/store/cron.py)."""
