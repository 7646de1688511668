"""Where records go: the Traces service (outages included) and a run directory."""
