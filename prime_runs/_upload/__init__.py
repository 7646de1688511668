"""The queue and the upload worker: the threads between ``log_episodes()`` and the sinks."""
