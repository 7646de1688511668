"""HTTP for the client: transport, retries, and the API key kept out of every text."""
