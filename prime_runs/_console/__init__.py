"""What a run says on stderr: the ``prime-runs:`` lines, progress, the finish summary."""
