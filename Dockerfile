# One image for every role; the command picks it: `calve api`, `calve writer`, `calve committer`
# (`calve migrate` once before the api starts: the chart's init container). The Spark Connect
# server, Redis, the catalog and the object store run elsewhere (README, "Production").
# No Docker engine runs on the machines Calve is built on: this file is reviewed, not built, there.
FROM python:3.11-slim-bookworm

# Java: pyspark's Connect client needs none, but `calve up` (embedded Spark) does.
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/calve
COPY pyproject.toml README.md ./
COPY service ./service
COPY spark_jobs ./spark_jobs
COPY alembic ./alembic
COPY web ./web
# Editable: the migrations (alembic/) and the console (web/) are read from beside the code.
RUN pip install --no-cache-dir -e . \
 && useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin calve \
 && mkdir -p /var/lib/calve && chown calve /var/lib/calve

USER 10001
ENV CALVE_DATA_DIR=/var/lib/calve CALVE_HOST=0.0.0.0
EXPOSE 8000
CMD ["calve", "api"]
