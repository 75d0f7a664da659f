"""How `vitlab serve` runs: where it listens, how it batches, what it accepts.

The model and its precision are not here: they come from the checkpoint and the command line
(`vitlab.deploy.PRECISIONS`).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Optional

from vitlab.config.fields import check_fields, setting


def _host(value: str) -> Optional[str]:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return "is not an IP address; use 127.0.0.1 (this machine only) or 0.0.0.0 (all interfaces)"
    return None


@dataclass(frozen=True)
class ServeConfig:
    """The server's settings; every default is the safe one (this machine only, bounded uploads)."""

    host: str = setting("127.0.0.1", check=_host)  # all interfaces only when asked: 0.0.0.0
    port: int = setting(8000, at_least=0, at_most=65535, hint="0 picks a free port")
    max_batch: int = setting(16, at_least=1, at_most=1024)  # images per forward pass
    max_wait_ms: float = setting(5.0, at_least=0, at_most=10_000)  # how long a batch waits to fill
    max_upload_mb: float = setting(20.0, above=0, at_most=4096)  # request body limit, MiB
    max_files: int = setting(64, at_least=1, hint="images in one request")
    max_connections: int = setting(256, at_least=1, hint="more at once are answered 503")
    # Decoded size limit: 50 MP holds a 48 MP phone photo; a decompression bomb of a few KB
    # that claims 100k x 100k pixels is refused from its header, before any decoding.
    max_pixels: int = setting(50_000_000, at_least=1)
    api_key: Optional[str] = setting(None, check=lambda v: None if v.strip() else "must not be empty")
    shutdown_timeout_s: float = setting(30.0, above=0)  # SIGTERM: how long in-flight requests get

    def __post_init__(self) -> None:
        check_fields(self)

    @property
    def max_upload_bytes(self) -> int:
        return int(self.max_upload_mb * 2**20)
