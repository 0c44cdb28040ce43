"""Hostile: crashes while being imported."""
raise RuntimeError("hostile crash at import")
