FROM python:3.11-slim
RUN useradd --create-home --uid 10001 nvcf
WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY service ./service
COPY migrations ./migrations
# Editable install: Alembic finds migrations/ and alembic.ini next to the package.
RUN pip install --no-cache-dir -e . && mkdir -p /data && chown nvcf /data
USER nvcf
ENV NVCF_DATA_DIR=/data
EXPOSE 8080
ENTRYPOINT ["nvcf-server"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8080"]
