"""Uploads: batches, their bodies and coding, the in-flight window, the ordered uploader."""
