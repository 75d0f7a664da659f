"""`vitlab serve` under load: dynamic batching against one request at a time; a leak check.

    python benchmarks/serving.py                                   # about 20 minutes on 2 shared cores
    python benchmarks/serving.py --quick                           # about 3 minutes
    python benchmarks/serving.py --screenshot docs/figures/serve_page.png

For each model (ViT-B/16 at 224 px with random weights, whose speed does not depend on them,
and the CIFAR-10 model of configs/cifar10.yaml: runs/cifar10/checkpoints/last.safetensors
when trained, else the same shape at random), each precision (fp32, bf16) and each way of
serving (batched: --max-batch 16 --max-wait-ms 5; one at a time: --max-batch 1), it starts
`vitlab serve` as its own process, and for 1, 4, 16 and 64 concurrent clients (each on a
keep-alive connection, sending the next request when the last is answered) measures
images/s and the p50/p99 latency over a fixed time, after a short warm-up. The clients send
a real CIFAR-10 test image (JPEG), enlarged to 224x224 for ViT-B/16. Then a load test:
3000 requests at concurrency 32 to the small model, counting answers and reading the
server's resident memory before and after.

Writes benchmarks/results/serving-http.csv and .md. Server and clients share the machine's
cores; the table says how much CPU other processes took while each row was measured.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from PIL import Image

import vitlab
from loadgen import LoadResult, run_load  # noqa: E402  (this folder's module: the script's folder is on sys.path)
from vitlab.bench.machine import busy_jiffies, machine_info, wait_quiet
from vitlab.data.tar_shards import iter_shard

ROOT = Path(__file__).resolve().parents[1]
HZ = os.sysconf("SC_CLK_TCK")  # the unit of /proc's CPU times

CIFAR = ROOT.parent / "shared" / "data" / "cifar10"
TRAINED = ROOT / "runs" / "cifar10" / "checkpoints" / "last.safetensors"
VITLAB = [sys.executable, "-m", "vitlab"]
MODES = {"batched (max 16, 5 ms)": ["--max-batch", "16", "--max-wait-ms", "5"], "one at a time": ["--max-batch", "1"]}
COLUMNS = [
    "model",
    "precision",
    "serving",
    "clients",
    "images/s",
    "p50 ms",
    "p99 ms",
    "mean batch",
    "× one at a time",
    "requests",
    "others' CPU (cores)",
]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def cifar_images(count: int) -> list[tuple[str, bytes]]:
    """The first `count` (name, JPEG bytes) of the real CIFAR-10 test set."""
    found = []
    for key, parts in iter_shard(sorted(CIFAR.glob("test-*.tar*"))[0]):
        found.append((Path(key).name + ".jpg", parts["jpg"]))
        if len(found) == count:
            return found
    return found


class Served:
    """`vitlab serve` in a subprocess, with its /metrics and its CPU time."""

    def __init__(self, checkpoint: Path, *args: str):
        self.proc = subprocess.Popen(
            [*VITLAB, "serve", str(checkpoint), "--port", "0", *args], stderr=subprocess.PIPE, text=True
        )
        for line in self.proc.stderr:
            found = re.search(r" at http://127\.0\.0\.1:(\d+) ", line)
            if found:
                self.port = int(found.group(1))
            if "ready" in line:  # from here on, drain what it says so that its pipe never fills
                threading.Thread(
                    target=lambda: [log(f"server: {x.rstrip()}") for x in self.proc.stderr], daemon=True
                ).start()
                return
        raise RuntimeError(f"vitlab serve {checkpoint} did not start")

    def metrics(self) -> str:
        return urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=30).read().decode()

    def value(self, name: str, text: str | None = None) -> float:
        found = re.search(rf"^{re.escape(name)} (\S+)$", text or self.metrics(), re.M)
        return float(found.group(1)) if found else 0.0

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / HZ  # utime + stime

    def stop(self) -> int:
        self.proc.terminate()
        return self.proc.wait(120)


def measure(server: Served, body: bytes, clients: int, seconds: float) -> tuple[LoadResult, float, float]:
    """(load result, mean batch size, other processes' CPU in cores) for one row."""
    run_load(server.port, body, concurrency=clients, requests=clients)  # open and warm the connections
    wait_quiet(0.25, max_wait=10)  # the machine is shared: give others' bursts a moment to pass
    text = server.metrics()
    batches0, images0 = (
        server.value('vitlab_batch_size_count{kind="classify"}', text),
        server.value("vitlab_images_total", text),
    )
    busy0, server0, wall0 = busy_jiffies(), server.cpu_seconds(), time.perf_counter()
    own0 = time.process_time()
    result = run_load(server.port, body, concurrency=clients, duration=seconds)
    wall = time.perf_counter() - wall0
    ours = (time.process_time() - own0) + (server.cpu_seconds() - server0)
    others = max(0.0, (busy_jiffies() - busy0) / HZ - ours) / wall
    text = server.metrics()
    batches = server.value('vitlab_batch_size_count{kind="classify"}', text) - batches0
    images = server.value("vitlab_images_total", text) - images0
    return result, images / max(batches, 1), others


def jpeg(data: bytes, size: int) -> bytes:
    buf = io.BytesIO()
    Image.open(io.BytesIO(data)).convert("RGB").resize((size, size), Image.BICUBIC).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def checkpoints(tmp: Path) -> list[tuple[str, Path, int]]:
    """(label, checkpoint, image side to send) for the two models."""
    import torch

    torch.manual_seed(0)
    big = vitlab.create_model("ViT-B/16").eval()
    vitlab.save(big, tmp / "vit_b16.safetensors")
    small = vitlab.load(TRAINED) if TRAINED.exists() else vitlab.create_model("ViT-C/4")
    vitlab.save(small.eval(), tmp / "small.safetensors")
    return [
        (model_label(m), tmp / name, m.config.image_size[0])
        for m, name in ((big, "vit_b16.safetensors"), (small, "small.safetensors"))
    ]


def model_label(model) -> str:
    cfg = model.config
    return f"{cfg.name} ({cfg.image_size[0]} px, {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M)"


def sweep(models, image: bytes, precisions, clients, seconds) -> list[dict]:
    rows = []
    for label, ckpt, side in models:
        body = jpeg(image, side) if side != 32 else image
        for precision in precisions:
            per_mode = {}
            for mode, args in MODES.items():
                server = Served(ckpt, "--precision", precision, *args)
                try:
                    measured = [(c, *measure(server, body, c, seconds[label])) for c in clients]
                finally:
                    server.stop()
                for c, result, batch, others in measured:
                    assert set(result.statuses) == {200} and not result.errors, (result.statuses, result.errors[:3])
                    rate = result.throughput_within(seconds[label])
                    per_mode[(mode, c)] = rate
                    rows.append(
                        {
                            "model": label,
                            "precision": precision,
                            "serving": mode,
                            "clients": c,
                            "images/s": f"{rate:.1f}",
                            "p50 ms": f"{result.percentile_ms(50):.0f}",
                            "p99 ms": f"{result.percentile_ms(99):.0f}",
                            "mean batch": f"{batch:.1f}",
                            "requests": result.answered,
                            "others' CPU (cores)": f"{others:.2f}",
                        }
                    )
                    log(" | ".join(str(rows[-1][k]) for k in COLUMNS if k in rows[-1]))
            for row in rows[-2 * len(clients) :]:
                base = per_mode[("one at a time", row["clients"])]
                rate = per_mode[(row["serving"], row["clients"])]  # unrounded, so one at a time reads 1.00
                row["× one at a time"] = f"{rate / base:.2f}" if base else ""
    return rows


def leak_check(checkpoint: Path, image: bytes, requests: int) -> dict:
    server = Served(checkpoint)
    run_load(server.port, image, concurrency=32, requests=300)
    before = server.value("process_resident_memory_bytes")
    result = run_load(
        server.port,
        image,
        concurrency=32,
        requests=requests,
        check=lambda b: len(json.loads(b)["results"][0]["predictions"]) == 5,
    )
    after = server.value("process_resident_memory_bytes")
    served = server.value('vitlab_requests_total{endpoint="/predict",status="200"}')
    code = server.stop()
    return {
        "requests": requests,
        "concurrency": 32,
        "answered 200": result.statuses.get(200, 0),
        "errors": len(result.errors),
        "bad answers": result.bad_bodies,
        "server counted": int(served) - 300,
        "RSS before MiB": f"{before / 2**20:.1f}",
        "RSS after MiB": f"{after / 2**20:.1f}",
        "growth MiB": f"{(after - before) / 2**20:+.1f}",
        "images/s": f"{result.throughput:.0f}",
        "p99 ms": f"{result.percentile_ms(99):.0f}",
        "exit code after SIGTERM": code,
    }


def table(rows: list[dict], columns: list[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(str(r.get(c, "")) for c in columns) + " |" for r in rows]) + "\n"


def write(out: Path, rows: list[dict], leak: dict, info: dict, command: str) -> None:
    import csv

    out.mkdir(parents=True, exist_ok=True)
    with open(out / "serving-http.csv", "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS)
        w.writeheader()
        w.writerows(rows)
    text = (
        "# `vitlab serve`: dynamic batching against one request at a time\n\n"
        f"Measured {info['date']} with `{command}` on a shared machine: {info['cpu']}, {info['cores']} cores "
        f"({info['isa']}), torch {info['torch']}. Server and clients ran on the same 2 cores, and other "
        "processes were running too (the last column: cores they used during the row). Rows were measured "
        "one after another, not interleaved: compare neighbours, and expect a few percent of noise.\n\n"
        + table(rows, COLUMNS)
        + "\n## Load test (small model, fp32, batched)\n\n"
        + table([leak], list(leak))
    )
    (out / "serving-http.md").write_text(text)
    log(f"wrote {out / 'serving-http.md'} and .csv")


def screenshot(path: Path, checkpoint: Path, images: list[tuple[str, bytes]]) -> None:
    """The page at `/` after picking the images, in headless Chromium."""
    from playwright.sync_api import sync_playwright

    server = Served(checkpoint)
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        files = [Path(tmp) / name for name, _ in images]
        for f, (_, data) in zip(files, images, strict=True):
            f.write_bytes(data)
        context = p.chromium.launch_persistent_context(
            str(Path(tmp) / "profile"),
            executable_path="/usr/bin/chromium",
            headless=True,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"],
            viewport={"width": 1000, "height": 700},
        )
        page = context.new_page()
        page.goto(f"http://127.0.0.1:{server.port}/")
        page.wait_for_selector("body[data-ready=true]")
        page.set_input_files("#picker", [str(f) for f in files])
        while page.locator(".card[data-state=done]").count() < len(files):
            time.sleep(0.1)
        page.screenshot(path=str(path), full_page=True)
        context.close()
    server.stop()
    log(f"wrote {path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fp32 only, shorter rows, a smaller load test")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    p.add_argument("--screenshot", type=Path, help="only write the page's screenshot here (the trained CIFAR model)")
    args = p.parse_args()
    images = cifar_images(3)
    if args.screenshot:
        return screenshot(args.screenshot, TRAINED, images)
    info = machine_info()
    with tempfile.TemporaryDirectory() as tmp:
        models = checkpoints(Path(tmp))
        seconds = {models[0][0]: 8.0 if args.quick else 15.0, models[1][0]: 4.0 if args.quick else 8.0}
        precisions = ["fp32"] if args.quick else ["fp32", "bf16"]
        rows = sweep(models, images[0][1], precisions, [1, 4, 16, 64], seconds)
        leak = leak_check(models[1][1], images[0][1], 1000 if args.quick else 3000)
    write(args.out, rows, leak, info, "python benchmarks/serving.py" + (" --quick" if args.quick else ""))


if __name__ == "__main__":
    main()
