"""Pull Helm charts from OCI registries (oras-py) or HTTPS chart archives into the cache.

helm.md §1: SSRF guard, credentials then anonymous, manifest digest recorded, layer size checked
from the manifest before download, blob verified by sha256, archive safety checked before use.

The parts: which hosts a pull may contact (`charts/netguard.py: HostPolicy`), the OCI client
(`oci.py`), what they share (`common.py`) and the fetcher with its HTTPS archives and the cache
(`fetcher.py`).
"""

from service.charts.fetch.common import (
    HELM_CHART_LAYER,
    HELM_CONFIG,
    OCI_INDEX,
    OCI_MANIFEST,
    FetchedChart,
    RegistryCredential,
)
from service.charts.fetch.fetcher import ChartFetcher
from service.charts.fetch.oci import MAX_TAGS_SHOWN

__all__ = [
    "HELM_CHART_LAYER",
    "HELM_CONFIG",
    "MAX_TAGS_SHOWN",
    "OCI_INDEX",
    "OCI_MANIFEST",
    "ChartFetcher",
    "FetchedChart",
    "RegistryCredential",
]
