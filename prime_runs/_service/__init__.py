"""The run on the service: who owns it, and its config, summary and status as sent."""
