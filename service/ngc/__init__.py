"""The NGC endpoints `ngcsdk` calls besides NVCF's: key caller info and the org list."""
