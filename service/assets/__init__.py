"""Assets (NVCF's `/v2/nvcf/assets`), the object store behind them, and the pieces the
invocation engine uses for large inputs and outputs: resolving asset references, per-request
asset and output directories, large results and progress reports (docs/assets.md)."""
