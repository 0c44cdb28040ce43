"""league package."""
