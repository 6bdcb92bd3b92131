"""nvcf-server."""

import os

# Before anything imports grpc (its C core reads this once): the server never uses gRPC in a
# forked child (uvloop forks only to exec a subprocess), and with fork support on, the core's
# fork handler writes "Other threads are currently calling into gRPC, skipping fork()
# handlers" to stderr in its own format — a line outside the log's format (JSON too).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
