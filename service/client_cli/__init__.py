"""`nvcf`: the operator's command line for an nvcf-server (docs/cli.md).

It speaks only the REST API under /v2/nvcf (with `httpx`) and imports nothing else of the
`service` package, so the server never loads it and it never loads the server
(tests/test_layers.py holds both directions).
"""
