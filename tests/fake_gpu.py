"""A CPU process that looks like a machine with one or more CUDA GPUs to vitlab, so that
vitlab's CUDA branches run in CI on machines without one (tests/README.md, "The fake GPU").

    with fake_gpu.installed(2) as gpu:        # in this process, undone on leaving
        ...                                    # gpu.seen["set_device"], gpu.counts["to cuda"], ...
    env = fake_gpu.child_env(2, log)           # for `vitlab train`, torchrun and its workers,
    subprocess.run([...], env=env)             # benchmarks/gpu.sh: each records into `log`
    fake_gpu.read_log(log)                     # one record per process that played the GPU

The seam, and why it is this one. Three were weighed:

- PyTorch's PrivateUse1 backend renamed: a device of its own with kernels registered for it.
  The name "cuda" is taken (rename_privateuse1_backend refuses it), so vitlab's
  `device.type == "cuda"` branches would never run, and every operator would need a kernel.
- One device-move function in vitlab that tests replace: vitlab's own code would then not
  run as it does on a GPU, which is the point of the exercise, and the seam would be a piece
  of test machinery living in the library.
- Patching torch where it meets the device, process-wide (chosen). vitlab's code runs
  unchanged, with `torch.device("cuda", i)` objects: every branch that tests the device it
  resolved (`pick_device`, `Context.device`, `--device`) takes its CUDA arm. What is patched
  is what has no CPU answer: torch.cuda's queries (is_available, device_count, set_device,
  current_device, names and properties, synchronize, memory statistics, the RNG states,
  is_bf16_supported) and torch.accelerator's; moving a tensor or module to "cuda" (Tensor.to,
  .cuda, the factories' device=), which makes a copy in CPU memory, as a move to another
  device makes a copy; pin_memory (a copy); autocast("cuda"), which becomes autocast("cpu")
  at the same dtype, so bf16 and fp16 really compute in reduced precision and GradScaler
  really finds fp16 overflows; the process group (NCCL becomes gloo, device_id dropped) and
  DDP's device_ids; torchvision.io.decode_jpeg(device="cuda"), which decodes on the CPU what
  nvjpeg decodes and refuses what it refuses (arithmetic-coded and lossless JPEGs), so that
  vitlab's fallback runs too; the profiler's activities (CPU only). Patches are attributes
  set on torch's modules and classes, so they hold in every thread (the DataLoader's pinning
  thread too) and, through tests/fake_gpu_site/sitecustomize.py on PYTHONPATH, in every
  Python process a test starts: `vitlab train`, torchrun and its workers, DataLoader workers.

What stays real: every kernel (on the CPU), autocast's reduced precision, GradScaler, DDP and
gloo collectives, the DataLoader's pinning path, JPEG decoding, vitlab's code. What it cannot
show: tensors live in CPU memory and say `device(type='cpu')`, so a tensor left on the host
beside device tensors, or a device tensor handed to numpy, passes here and fails on a GPU;
code that branches on a tensor's own device (the CPU serving copies' `_packable`) takes its
CPU arm; speed, memory and kernel choices (flash attention, nvjpeg's, CUDA graphs) are the
CPU's. Those are what benchmarks/gpu.sh checks on a real GPU.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import sys
from collections import Counter, defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import torch

GPUS_VARIABLE = "VITLAB_FAKE_GPUS"  # how many GPUs a child process plays
LOG_VARIABLE = "VITLAB_FAKE_GPU_LOG"  # the JSON-lines file each child appends its record to
COVERAGE_VARIABLE = "VITLAB_CUDA_COVERAGE"  # a folder: children and fake-GPU tests record coverage there
SITE = Path(__file__).resolve().parent / "fake_gpu_site"  # holds the sitecustomize.py that installs it
ROOT = Path(__file__).resolve().parents[1]
# The name matches "H100" in vitlab.bench.machine.GPU_PEAKS, so MFU columns are computed (from
# the CPU's speed: meaningless as a figure, which the name says).
NAME = "NVIDIA H100 80GB HBM3 (fake: a CPU playing it, tests/fake_gpu.py)"
TOTAL_MEMORY = 80 * 2**30
# Functions of torch that take device=: a CUDA device there becomes the CPU.
FACTORIES = ("tensor", "as_tensor", "zeros", "ones", "full", "empty", "arange", "linspace", "eye", "rand", "randn",
             "randint", "randperm", "zeros_like", "ones_like", "full_like", "empty_like", "rand_like", "randn_like")
# JPEG frame types nvjpeg decodes (baseline, extended and progressive Huffman); it refuses the
# others (lossless, arithmetic-coded), and torchvision raises a RuntimeError.
NVJPEG_FRAMES = frozenset((0xC0, 0xC1, 0xC2))


def _is_cuda(device: Any) -> bool:
    """Whether a device argument (a torch.device or its name) names a CUDA device."""
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return isinstance(device, str) and device.split(":")[0] == "cuda"


def _frame(data: bytes) -> int | None:
    """The start-of-frame marker of a JPEG (None where none is found before the first scan)."""
    i = 2
    while i + 4 <= len(data) and data[i] == 0xFF:
        marker = data[i + 1]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            return marker
        if marker == 0xDA:
            return None
        i += 2 + int.from_bytes(data[i + 2:i + 4], "big")
    return None


class FakeGpu:
    """`count` GPUs played by this process's CPU: install() patches torch (and torchvision),
    uninstall() puts everything back. What vitlab asked of the GPU is kept in `seen` (kind ->
    the distinct details, e.g. "set_device" -> {"cuda:1"}) and `counts` (kind -> calls)."""

    def __init__(self, count: int = 1):
        if count < 1:
            raise ValueError("a fake GPU machine has at least one GPU")
        self.count = count
        self.current = 0
        self.initialised = False
        self.seen: dict[str, set[str]] = defaultdict(set)
        self.counts: Counter = Counter()
        self.rng = [self._rng_state(0) for _ in range(count)]
        self._undo: list[tuple[Any, str, Any]] = []

    # What was asked ------------------------------------------------------------------------
    def record(self, kind: str, detail: str = "") -> None:
        self.counts[kind] += 1
        if detail:
            self.seen[kind].add(detail)

    def summary(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "argv": sys.argv, "rank": os.environ.get("RANK"), "gpus": self.count,
                "seen": {k: sorted(v) for k, v in self.seen.items()}, "counts": dict(self.counts)}

    # The device ----------------------------------------------------------------------------
    def _index(self, device: Any = None) -> int:
        """The GPU a torch.cuda call or a device argument means (None, or "cuda" without an
        index: the current one); the error a GPU machine gives for one it does not have."""
        if device is None:
            index = self.current
        elif isinstance(device, int):
            index = device
        else:
            d = torch.device(device) if isinstance(device, str) else device
            if not isinstance(d, torch.device) or d.type != "cuda":
                raise ValueError(f"Expected a cuda device, but got: {device}")
            index = self.current if d.index is None else d.index
        if not 0 <= index < self.count:
            raise RuntimeError(f"CUDA error: invalid device ordinal (device {index} of a fake {self.count}-GPU machine)")
        self.initialised = True
        return index

    def _to_cpu(self, value: Any) -> tuple[Any, bool]:
        """A device argument with CUDA replaced by the CPU, and whether it was CUDA."""
        if not _is_cuda(value):
            return value, False
        self._index(value)
        return torch.device("cpu"), True

    @staticmethod
    def _rng_state(seed: int) -> torch.Tensor:
        """A CUDA generator's state as torch gives it: the seed and the Philox offset, 8 bytes each."""
        return torch.tensor([seed, 0], dtype=torch.int64).view(torch.uint8).clone()

    # Installing ----------------------------------------------------------------------------
    def _set(self, owner: Any, name: str, value: Any) -> None:
        self._undo.append((owner, name, owner.__dict__.get(name, _MISSING) if isinstance(owner, type) else
                           getattr(owner, name, _MISSING)))
        setattr(owner, name, value)

    def install(self) -> "FakeGpu":
        if self._undo:
            raise RuntimeError("this fake GPU is installed already")
        self._queries()
        self._moves()
        self._amp()
        self._distributed()
        self._decoder()
        return self

    def uninstall(self) -> None:
        for owner, name, old in reversed(self._undo):
            if old is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, old)
        self._undo.clear()

    def _queries(self) -> None:
        cuda, fake = torch.cuda, self

        def set_device(device: Any) -> None:
            fake.current = fake._index(device)
            fake.record("set_device", f"cuda:{fake.current}")

        def properties(device: Any = None) -> SimpleNamespace:
            fake._index(device)
            return SimpleNamespace(name=NAME, total_memory=TOTAL_MEMORY, major=9, minor=0, multi_processor_count=132,
                                   is_integrated=False)

        def synchronize(device: Any = None) -> None:
            fake.record("synchronize", f"cuda:{fake._index(device)}")

        def memory(kind: str):
            def read(device: Any = None) -> int:
                fake._index(device)
                fake.record(kind)
                return 0  # the CPU's memory is not the device's: no figure rather than a wrong one
            return read

        def get_state(device: Any = "cuda") -> torch.Tensor:
            index = fake._index(device)
            fake.record("get_rng_state", f"cuda:{index}")
            return fake.rng[index].clone()

        def set_state(state: torch.Tensor, device: Any = "cuda") -> None:
            index = fake._index(device)
            fake.record("set_rng_state", f"cuda:{index}")
            fake.rng[index] = state.clone()

        def get_states() -> list[torch.Tensor]:
            return [get_state(i) for i in range(fake.count)]

        def set_states(states: list[torch.Tensor]) -> None:
            for i, state in enumerate(states):  # as torch does: a state for a GPU not there is an error
                set_state(state, i)

        def seed_all(seed: int) -> None:
            fake.rng = [fake._rng_state(int(seed)) for _ in range(fake.count)]

        def seed_one(seed: int) -> None:
            fake.rng[fake.current] = fake._rng_state(int(seed))

        for name, value in {
            "is_available": lambda: True,
            "device_count": lambda: fake.count,
            "current_device": lambda: fake.current,
            "set_device": set_device,
            "is_initialized": lambda: fake.initialised,
            "get_device_name": lambda device=None: properties(device).name,
            "get_device_properties": properties,
            "get_device_capability": lambda device=None: (properties(device).major, properties(device).minor),
            "is_bf16_supported": lambda including_emulation=True: True,
            "synchronize": synchronize,
            "empty_cache": lambda: None,
            "memory_allocated": memory("memory_allocated"),
            "max_memory_allocated": memory("max_memory_allocated"),
            "memory_reserved": memory("memory_reserved"),
            "max_memory_reserved": memory("max_memory_reserved"),
            "reset_peak_memory_stats": memory("reset_peak_memory_stats"),
            "mem_get_info": lambda device=None: (TOTAL_MEMORY, TOTAL_MEMORY),
            "get_rng_state_all": get_states,
            "set_rng_state_all": set_states,
            "get_rng_state": get_state,
            "set_rng_state": set_state,
            "manual_seed": seed_one,
            "manual_seed_all": seed_all,
        }.items():
            self._set(cuda, name, value)
        stream = SimpleNamespace(is_capturing=lambda: False, synchronize=lambda: None, query=lambda: True,
                                 wait_stream=lambda other: None)  # the CPU runs each op as it is called
        self._set(cuda, "current_stream", lambda device=None: stream)
        self._set(cuda, "default_stream", lambda device=None: stream)
        self._set(cuda, "is_current_stream_capturing", lambda: False)
        accelerator = torch.accelerator
        self._set(accelerator, "current_stream", lambda device=None: stream)
        self._set(accelerator, "current_accelerator", lambda check_available=False: torch.device("cuda"))
        self._set(accelerator, "device_count", lambda: fake.count)
        self._set(accelerator, "current_device_index", lambda: fake.current)
        self._set(accelerator, "set_device_index", lambda device: setattr(fake, "current", fake._index(device)))
        self._set(accelerator, "synchronize", lambda device=None: synchronize(device))
        from torch import profiler

        supported = profiler.supported_activities
        self._set(profiler, "supported_activities",
                  lambda: {a for a in supported() if a == profiler.ProfilerActivity.CPU})

    def _moves(self) -> None:
        fake, tensor_to = self, torch.Tensor.to

        def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            moved = False
            args = list(args)
            for i, a in enumerate(args):
                args[i], m = fake._to_cpu(a)
                moved = moved or m
            if "device" in kwargs:
                kwargs["device"], m = fake._to_cpu(kwargs["device"])
                moved = moved or m
            out = tensor_to(self, *args, **kwargs)
            if moved:
                fake.record("to cuda non_blocking" if kwargs.get("non_blocking") else "to cuda")
                if out is self:  # a move to another device is a copy
                    out = out.clone()
            return out

        def cuda(self: torch.Tensor, device: Any = None, non_blocking: bool = False,
                 memory_format: torch.memory_format = torch.preserve_format) -> torch.Tensor:
            index = fake._index(device)
            return to(self, torch.device("cuda", index), non_blocking=non_blocking, memory_format=memory_format)

        def pin_memory(self: torch.Tensor, device: Any = None) -> torch.Tensor:
            fake.record("pin_memory")
            fake.initialised = True
            return self.clone()

        self._set(torch.Tensor, "to", to)
        self._set(torch.Tensor, "cuda", cuda)
        self._set(torch.Tensor, "pin_memory", pin_memory)
        for name in FACTORIES:
            self._set(torch, name, self._factory(getattr(torch, name), name))

    def _factory(self, make: Any, name: str) -> Any:
        fake = self

        def factory(*args: Any, **kwargs: Any) -> torch.Tensor:
            if "device" in kwargs:
                kwargs["device"], moved = fake._to_cpu(kwargs["device"])
                if moved:
                    fake.record("created on cuda", name)
            return make(*args, **kwargs)

        return factory

    def _amp(self) -> None:
        fake = self
        autocast = torch.amp.autocast_mode.autocast
        autocast_init = autocast.__init__

        def init(self: Any, device_type: str, dtype: Any = None, enabled: bool = True, cache_enabled: Any = None) -> None:
            if device_type == "cuda":  # the same dtype on the CPU: reduced precision computes for real
                dtype = dtype or torch.float16  # CUDA autocast's default
                fake.record("autocast", f"{str(dtype).removeprefix('torch.')}{'' if enabled else ' (disabled)'}")
                device_type = "cpu"
            autocast_init(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

        self._set(autocast, "__init__", init)
        scaler = torch.amp.GradScaler
        scaler_init = scaler.__init__

        def scaler_init_recorded(self: Any, device: str = "cuda", *args: Any, **kwargs: Any) -> None:
            scaler_init(self, device, *args, **kwargs)
            if device == "cuda":
                fake.record("GradScaler", "enabled" if self._enabled else "disabled")

        self._set(scaler, "__init__", scaler_init_recorded)
        step = scaler.step

        def step_recorded(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            out = step(self, optimizer, *args, **kwargs)
            if self._enabled and self._device == "cuda":  # the scaler skips the step where it found inf/NaN
                found = self._per_optimizer_states[id(optimizer)]["found_inf_per_device"]
                fake.record("GradScaler.step", "skipped (inf/NaN)" if sum(v.item() for v in found.values()) else "applied")
            return out

        self._set(scaler, "step", step_recorded)

    def _distributed(self) -> None:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        fake, init_group = self, dist.init_process_group

        def init_process_group(backend: Any = None, *args: Any, device_id: Any = None, **kwargs: Any) -> Any:
            fake.record("init_process_group", f"{backend} device_id={device_id}")
            if device_id is not None:
                fake._index(device_id)
            return init_group("gloo" if backend == "nccl" else backend, *args, **kwargs)

        self._set(dist, "init_process_group", init_process_group)
        ddp_init = DistributedDataParallel.__init__

        def ddp(self: Any, module: Any, device_ids: Any = None, output_device: Any = None, *args: Any, **kwargs: Any) -> None:
            fake.record("DistributedDataParallel", f"device_ids={device_ids}")
            if device_ids:  # the module's tensors are in CPU memory, where DDP takes no device_ids
                for i in device_ids:
                    fake._index(i)
                device_ids, output_device = None, None
            ddp_init(self, module, device_ids, output_device, *args, **kwargs)

        self._set(DistributedDataParallel, "__init__", ddp)

    def _decoder(self) -> None:
        import torchvision.io

        fake, decode = self, torchvision.io.decode_jpeg

        def decode_jpeg(input: Any, *args: Any, device: Any = "cpu", **kwargs: Any) -> Any:
            if not _is_cuda(device):
                return decode(input, *args, device=device, **kwargs)
            fake._index(device)
            many = isinstance(input, (list, tuple))
            for data in (input if many else [input]):
                if _frame(data.numpy().tobytes()) not in NVJPEG_FRAMES:
                    fake.record("decode_jpeg cuda", "refused")
                    raise RuntimeError("nvjpegDecode failed: unsupported JPEG (what nvjpeg refuses, refused by the fake GPU)")
            fake.record("decode_jpeg cuda", "decoded")
            out = [decode(d, *args, **kwargs) for d in (input if many else [input])]
            return out if many else out[0]

        self._set(torchvision.io, "decode_jpeg", decode_jpeg)


_MISSING = object()


@contextlib.contextmanager
def installed(count: int = 1) -> Iterator[FakeGpu]:
    """This process plays a machine of `count` GPUs inside the block (its coverage recorded
    when VITLAB_CUDA_COVERAGE names a folder: see tools/cuda_coverage.py)."""
    gpu = FakeGpu(count).install()
    with _coverage():
        try:
            yield gpu
        finally:
            gpu.uninstall()


@contextlib.contextmanager
def _coverage() -> Iterator[None]:
    folder = os.environ.get(COVERAGE_VARIABLE)
    if not folder:
        yield
        return
    import coverage

    cov = coverage.Coverage(data_file=str(Path(folder) / ".coverage"), data_suffix=True,
                            config_file=str(ROOT / "pyproject.toml"))
    cov.start()
    try:
        yield
    finally:
        cov.stop()
        cov.save()


def child_env(count: int, log: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a child process (and of every Python process it starts) that plays a
    machine of `count` GPUs and appends its record to `log`; coverage recorded as `installed`'s."""
    env = dict(os.environ if env is None else env)
    env[GPUS_VARIABLE] = str(count)
    env[LOG_VARIABLE] = str(log)
    env["PYTHONPATH"] = os.pathsep.join([str(SITE), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("OMP_NUM_THREADS", "1")
    folder = env.get(COVERAGE_VARIABLE)
    if folder:  # coverage's own .pth starts it in every child that has COVERAGE_PROCESS_START
        env["COVERAGE_PROCESS_START"] = str(ROOT / "pyproject.toml")
        env["COVERAGE_FILE"] = str(Path(folder) / ".coverage")
    return env


def read_log(log: Path) -> list[dict[str, Any]]:
    """The records of the processes that played the GPU, in the order they ended."""
    return [json.loads(line) for line in Path(log).read_text().splitlines()] if Path(log).exists() else []


def install_from_environment() -> None:
    """For sitecustomize.py: play VITLAB_FAKE_GPUS GPUs, and append this process's record to
    VITLAB_FAKE_GPU_LOG when it ends."""
    gpu = FakeGpu(int(os.environ[GPUS_VARIABLE])).install()
    log = os.environ.get(LOG_VARIABLE)
    if log:
        def write() -> None:
            line = json.dumps(gpu.summary()) + "\n"
            fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line.encode())  # one write of one line: processes ending together do not interleave
            finally:
                os.close(fd)

        atexit.register(write)
