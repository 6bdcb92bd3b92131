"""Where `nvcf` finds the server and its key: the config file `nvcf login` writes, overridden
by `NVCF_URL`, `NVCF_API_KEY` and `NVCF_CA_CERT`.

The file is `<user config dir>/nvcf/config.json` (`$XDG_CONFIG_HOME/nvcf/config.json`, by
default `~/.config/nvcf/config.json`, on Linux), created with mode 0600 in a 0700 directory.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import platformdirs

APP_NAME = "nvcf"
ENV_URL = "NVCF_URL"
ENV_KEY = "NVCF_API_KEY"
ENV_CA = "NVCF_CA_CERT"


class NotConfigured(Exception):
    """No server URL or no API key: neither `nvcf login` nor the environment gave one."""


@dataclass(frozen=True)
class Profile:
    url: str
    api_key: str = ""
    ca_cert: str | None = None


def config_file() -> Path:
    return Path(platformdirs.user_config_dir(APP_NAME, appauthor=False)) / "config.json"


def read_file(path: Path | None = None) -> dict[str, str]:
    """The saved settings (empty when there are none); a file that is not a JSON object is
    an error naming the file."""
    path = path or config_file()
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise NotConfigured(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise NotConfigured(f"{path} is not a JSON object")
    return {str(k): str(v) for k, v in data.items() if isinstance(v, str)}


def resolve(env: Mapping[str, str] | None = None) -> Profile:
    """The profile to use: the config file's values, each replaced by its variable if set."""
    env = os.environ if env is None else env
    saved = read_file()
    url = env.get(ENV_URL) or saved.get("url", "")
    key = env.get(ENV_KEY) or saved.get("apiKey", "")
    ca = env.get(ENV_CA) or saved.get("caCert") or None
    if not url or not key:
        missing = " and ".join(
            name for name, value in ((ENV_URL, url), (ENV_KEY, key)) if not value
        )
        raise NotConfigured(
            f"no {missing}: run `nvcf login --url URL --key KEY` or set {ENV_URL} and {ENV_KEY}"
        )
    return Profile(url=url, api_key=key, ca_cert=ca)


def save(profile: Profile, path: Path | None = None) -> Path:
    """Write the profile, readable by its owner only (0600, directory 0700), atomically: the
    new file is written beside the old one and renamed over it."""
    path = path or config_file()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    data = {"url": profile.url, "apiKey": profile.api_key}
    if profile.ca_cert:
        data["caCert"] = profile.ca_cert
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            os.fchmod(out.fileno(), 0o600)
            json.dump(data, out, indent=2)
            out.write("\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    return path


def remove(path: Path | None = None) -> bool:
    """Forget the saved profile; False when there was none."""
    try:
        (path or config_file()).unlink()
    except FileNotFoundError:
        return False
    return True
