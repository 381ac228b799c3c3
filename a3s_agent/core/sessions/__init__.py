"""Sessions and their control: manager.py keeps the sessions (validated, in memory for fast
reads, written through to the store), control.py is the control plane of running generations
(cancel, pause and resume, confirmation, lanes, external tasks; lane_counts.py counts the lanes'
work), todos.py keeps the todo lists, plans.py the plans (their steps in the todo lists) and
client_tools.py the tools a client lends.
"""
