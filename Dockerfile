# One image for the API, the workers and the one-shot migration (docker-compose.yml picks the command).
# PyTorch from PyPI is the CUDA build on linux/x86_64, which the GPU workers need.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    RELAY_HOME=/data

WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY sdk sdk
COPY engine engine
COPY api api
COPY worker worker
COPY migrations migrations
# Editable, so the service finds alembic.ini and migrations/ beside its packages.
RUN pip install -e ".[server]"

RUN useradd --create-home --uid 1000 relay && mkdir -p /data && chown relay /data
USER relay
EXPOSE 8000
CMD ["uvicorn", "--factory", "relay_api.app:create_app", "--host", "0.0.0.0", "--port", "8000"]
