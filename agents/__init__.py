"""agents package."""
