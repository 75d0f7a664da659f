# `vitlab serve` in a container (docs/serving.md):
#   docker build -t vitlab-serve .
#   docker run --rm -p 127.0.0.1:8000:8000 -v "$PWD/runs/cifar10/checkpoints:/models:ro" vitlab-serve /models/last.safetensors
# Inside the container the server listens on all interfaces (the container's own network);
# who can reach it is decided by `-p`: 127.0.0.1:8000:8000 keeps it to this machine.
FROM python:3.11-slim

# Not root: the server needs no privileges, only to read the mounted checkpoint.
RUN useradd --create-home --uid 1000 vitlab
WORKDIR /home/vitlab/src
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install --no-cache-dir ".[serve]"

USER vitlab
EXPOSE 8000
# /health answers 200 once the model is loaded and warmed up.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s \
    CMD python -c "import urllib.request, sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4).status != 200)"
# SIGTERM (docker stop) lets the requests in flight finish; the process then exits 0.
ENTRYPOINT ["vitlab", "serve", "--host", "0.0.0.0", "--port", "8000"]
CMD ["/models/model.safetensors"]
