"""Chat templates: a conversation as the model's template writes it (templates.py), rendered in a process
of its own, bounded in time, memory and output (sandbox.py, run as a script)."""
