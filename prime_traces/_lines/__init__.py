"""Records to JSONL lines: the encoder, chunker and sizing, and the line rules the service shares."""
