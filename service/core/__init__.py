"""Cross-cutting pieces: settings, database, errors, pagination."""
