FROM python:3.11-slim
RUN useradd --create-home --uid 10001 nvcf
WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY service ./service
COPY migrations ./migrations
RUN pip install --no-cache-dir . && mkdir -p /data && chown nvcf /data
USER nvcf
ENV NVCF_DATA_DIR=/data
EXPOSE 8080
ENTRYPOINT ["nvcf-server"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8080"]
