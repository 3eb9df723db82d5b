# One image for the API, the workers and the one-shot migration (docker-compose.yml picks the command).
#
# PYTHON_IMAGE: any image with Python 3.11 and its venv module. The default is the public
# python:3.11-slim; a host that cannot pull it names one it built itself (docker/base-image.sh
# builds one from Debian's packages). docker/extra/ may hold what the build needs from the host:
# ca.crt, a CA bundle pip must trust (a proxy's), and wheels/, wheels pip takes before the index
# (PyPI's torch on linux/x86_64 is the CUDA build the GPU workers need; a CPU-only host may put
# the CPU build there instead, as docker/base-image.sh does).
ARG PYTHON_IMAGE=python:3.11-slim
FROM ${PYTHON_IMAGE}

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    RELAY_HOME=/data \
    PATH=/opt/relay/bin:$PATH

WORKDIR /app
COPY docker/extra /tmp/extra
RUN python3 -m venv /opt/relay \
    && if [ -f /tmp/extra/ca.crt ]; then cp /tmp/extra/ca.crt /etc/relay-pip-ca.crt; fi
COPY pyproject.toml README.md alembic.ini ./
COPY sdk sdk
COPY engine engine
COPY api api
COPY worker worker
COPY migrations migrations
# Editable, so the service finds alembic.ini and migrations/ beside its packages. With the server, the
# engine (video decoding with PyAV, the serving worker's websocket), the simulators a job's
# `eval` block offers (pusht, aloha) and the experiment trackers its `integrations` name (W&B,
# TensorBoard; MLflow needs no package).
RUN if [ -f /etc/relay-pip-ca.crt ]; then export PIP_CERT=/etc/relay-pip-ca.crt; fi \
    && pip install --find-links /tmp/extra/wheels -e ".[server,pusht,aloha,trackers]" \
    && rm -rf /tmp/extra

RUN useradd --create-home --uid 1000 relay && mkdir -p /data && chown relay /data
USER relay
EXPOSE 8000
# The source revision the image was built from (an upgrade's build names its own).
ARG RELAY_REVISION=unknown
LABEL org.opencontainers.image.revision=$RELAY_REVISION
CMD ["uvicorn", "--factory", "relay_api.app:create_app", "--host", "0.0.0.0", "--port", "8000"]
