"""Grid results (results.py: results.json from the trace) and their rendering (render.py, templates/)."""
