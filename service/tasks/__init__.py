"""Cloud tasks (NVCT): one-shot GPU jobs that run to completion (docs/tasks.md)."""
