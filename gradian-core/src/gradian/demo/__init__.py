"""`gradian demo`: planted-regression scenarios and the end-to-end run on the embedded model.

``gradian.demo.scenarios.make_scenario(kind, seed)`` builds the data (pure Python, no model);
``gradian.demo.run.run_demo(...)`` trains, diagnoses and attributes on it.
"""
