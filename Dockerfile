# A CPU image of `attnmt serve`: the HTTP API and the attention page on port 8000.
#   docker build -t attnmt .
#   docker run --rm -p 8000:8000 -v "$PWD/runs/de-en:/model:ro" attnmt
# The model directory (written by `attnmt train`) is mounted at /model, read-only.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN useradd --create-home --uid 10001 attnmt
WORKDIR /opt/attnmt

# The installs CI runs (.ci/run): pip, the CPU torch wheel first, then the package; here with
# the `serve` extra instead of `test`, and torch's CPU wheel from PyTorch's CPU index.
RUN pip install -q --upgrade pip
RUN pip install -q torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install -q '.[serve]'

USER attnmt
VOLUME ["/model"]
EXPOSE 8000
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4)"
ENTRYPOINT ["attnmt", "serve", "--model", "/model", "--host", "0.0.0.0", "--port", "8000"]
