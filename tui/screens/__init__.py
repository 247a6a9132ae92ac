"""Dashboard screens: the main dashboard, a request's trace, the plan, and help."""
