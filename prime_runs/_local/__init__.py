"""The run directory: segment files, ``run.json``, the spool, and ``prime-runs sync``'s upload of it."""
