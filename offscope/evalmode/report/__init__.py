"""Grid results (results.py: results.json from the trace) and their rendering
(render.py with the view model in view_model.py and its helpers, templates/)."""
