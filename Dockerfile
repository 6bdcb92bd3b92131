# The control plane's image. The base is pinned to an exact Python patch release on an exact
# Debian release (bump it on purpose, with the release notes read); add `@sha256:<digest>`
# after the tag to pin the bytes too.
FROM python:3.11.13-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# A numeric, non-root user: Kubernetes' runAsNonRoot can only verify a numeric USER.
RUN groupadd --gid 10001 nvcf \
    && useradd --uid 10001 --gid 10001 --home-dir /data --no-create-home \
       --shell /usr/sbin/nologin nvcf

WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY service ./service
COPY migrations ./migrations
# Editable install: Alembic finds migrations/ and alembic.ini next to the package. Bytecode is
# compiled now, as root, because the root filesystem may be read-only at run time.
RUN pip install -e . \
    && python -m compileall -q service migrations \
    && mkdir -p /data && chown 10001:10001 /data && chmod 0700 /data

USER 10001:10001
# Data directory: the SQLite file (without NVCF_DATABASE_URL), the generated secrets key and
# admin key, the chart cache. Back it up (docs/operations.md).
ENV NVCF_DATA_DIR=/data
EXPOSE 8080
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/health', timeout=4)"]
ENTRYPOINT ["nvcf-server"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8080"]
