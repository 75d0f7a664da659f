"""`vitlab serve`: a classifier behind HTTP, with dynamic batching and attention maps.

    from vitlab.serve import Engine, create_app
    engine = Engine(model, precision="bf16")          # one inference copy (vitlab.deploy)
    app = create_app(engine, ServeConfig())           # FastAPI; run it with uvicorn

- `engine.py`: uploads -> tensors (bounded decoding); the batches go through `vitlab.Predictor`,
  the library's one inference path (probabilities, attention);
- `batcher.py`: concurrent requests share one forward pass (max batch, max wait);
- `app.py`: the routes, the upload limit, the API key, JSON errors;
- `metrics.py`: the Prometheus series of `/metrics`;
- `static/`: the page at `/`, bundled (no CDN).

FastAPI, uvicorn and prometheus_client are the `serve` extra, imported where they are used.
Only the command line imports this package.
"""

from vitlab.serve.app import create_app
from vitlab.serve.batcher import Batcher
from vitlab.serve.engine import Engine, UploadError, decode

__all__ = ["Batcher", "Engine", "UploadError", "create_app", "decode"]
