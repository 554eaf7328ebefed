"""The server's HTTP routes, one module per feature."""
