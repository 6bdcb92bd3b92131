#!/usr/bin/env bash
# Installs the real servers the test suite starts (operations.md §4): PostgreSQL, the CNCF
# distribution registry with htpasswd support, and Redis. The suite starts and stops them.
# Also Debian's headless browser and its WebDriver, which drive the web console's tests
# (tests/console/; docs/console.md). And curl, the asset tests' plain HTTP client.
set -euo pipefail

need=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
command -v docker-registry >/dev/null 2>&1 || need+=(docker-registry)
command -v htpasswd >/dev/null 2>&1 || need+=(apache2-utils)
command -v runuser >/dev/null 2>&1 || need+=(util-linux)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
# the asset tests upload and download as a user would, with plain curl (tests/assets/)
command -v curl >/dev/null 2>&1 || need+=(curl)
# the telemetry export writes to them and reads its series back with PromQL
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
command -v victoria-metrics >/dev/null 2>&1 || need+=(victoria-metrics)

if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "missing test services: ${need[*]} (run as root or install them: apt-get install ${need[*]})" >&2
  exit 1
fi
echo "installing test services: ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
# Debian starts packaged daemons on install; the suite runs its own instances.
systemctl disable --now docker-registry >/dev/null 2>&1 || true
service postgresql stop >/dev/null 2>&1 || true
service redis-server stop >/dev/null 2>&1 || true
service prometheus stop >/dev/null 2>&1 || true
service victoria-metrics stop >/dev/null 2>&1 || true
