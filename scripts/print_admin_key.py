"""Print the URL and the admin API key `make run` users should use."""

from __future__ import annotations

from pathlib import Path

from service.app import ADMIN_KEY_FILE
from service.core.settings import Settings

settings = Settings()
print("nvcf-server: API at http://127.0.0.1:8080 (docs at /docs)")
if settings.bootstrap_api_key is not None:
    print("nvcf-server: admin API key: the value of NVCF_BOOTSTRAP_API_KEY")
else:
    path = Path(settings.data_dir) / ADMIN_KEY_FILE
    if path.exists():
        print(f"nvcf-server: admin API key: {path.read_text().strip()}")
    else:
        print("nvcf-server: an admin API key will be generated and printed at start-up")
