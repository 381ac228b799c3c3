"""The OS sandbox every process a tool starts runs in (the policy: policy.py; bubblewrap: bwrap.py)."""
