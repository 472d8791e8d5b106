"""State that must survive a restart of the proxy (offscope/state/runs.py: registered runs)."""
