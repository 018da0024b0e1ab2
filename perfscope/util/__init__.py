"""Small shared helpers: atomic files, hashes, progress. Nothing LLM-specific lives here."""
