"""Cloud tasks (NVCT): GPU jobs that run to completion (docs/tasks.md)."""
