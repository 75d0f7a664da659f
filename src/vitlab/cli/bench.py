"""Time vitlab beside the peer libraries (the same model sizes, built by each library) in one
interleaved run: images per second (median over rounds, with the spread), the matrix-product
ceiling of the model's own shapes measured in the same run and each figure as a percentage of
it, the ratio to the fastest fp32 peer taken within each round, working memory and compile
time. Each sample records other processes' CPU use; contended samples are dropped while clean
ones exist (see docs/performance.md).

Precisions: fp32 (the model as it is: PyTorch's F.linear); fp32-packed (every Dense layer
packed for oneDNN, GELU fused); fp32-auto (vitlab's CPU inference path,
vitlab.deploy.inference_copy: each Dense shape and the attention on the kernel timed fastest on
this machine, cached per machine; the table's foot lists the choices and timings); bf16-autocast (fp32 weights, bf16 matrix products); bf16
(weights and activations in bf16; vitlab's copy is also packed); fp16-autocast and fp16 (the
same in fp16, for GPUs); int8 (vitlab only: int8 Dense layers, calibrated for oneDNN's
kernels on x86). A training step is fp32 or an autocast precision, AdamW, cross-entropy.

--suite quick or --suite full run the standard settings (on 2 quiet cores: about 10 and 15
minutes), --suite scaling the resolution, batch and memory table of docs/performance.md,
--suite gpu (with --device cuda) a few minutes on a GPU with MFU against its peak (ViT-B/16 at
batch 1 and 256; --model and --batch-size change them, as benchmarks/gpu.sh --smoke does); otherwise
--model/--batch-size/--task/--precision pick a subset. On a busy machine, --clock cpu times
one thread by its own CPU time: single-core figures, but other processes cannot distort the
comparisons.

examples:
  vitlab bench --model ViT-B/16 --batch-size 8
  vitlab bench --model ViT-Ti/16 --batch-size 1 16 --precision fp32 bf16 int8 --peers timm
  vitlab bench --model ViT-C/4 --batch-size 128 --task train --compile bf16-autocast
  vitlab bench --suite full --out benchmarks/results
  vitlab bench --suite full --clock cpu --out benchmarks/results --name throughput-cpu-clock
  vitlab bench --suite gpu --device cuda --out benchmarks/results --name gpu
"""

from __future__ import annotations

from vitlab.cli.common import COUNT, FOLDER, flag_number

WRITES = {"out": FOLDER}  # checked writable before any work (vitlab.cli.check_arguments)
HELP = "measure inference and training throughput against timm, Hugging Face and torchvision"


def add_arguments(p) -> None:
    from vitlab.bench import COMPILE_MODES, PRECISIONS, SUITES, TASKS

    p.add_argument("--suite", choices=SUITES, help="run a standard suite instead of a subset")
    p.add_argument("--model", nargs="+", help="variant name(s) (default ViT-B/16; with --suite gpu, the one model it times)")
    p.add_argument("--batch-size", nargs="+", type=COUNT, help="batch size(s) (default 1; --suite gpu: 1 256, training at the largest)")
    p.add_argument("--task", nargs="+", choices=TASKS, default=["infer"], help="infer and/or train")
    p.add_argument("--precision", nargs="+", choices=PRECISIONS, help="precisions to time (default: fp32 fp32-packed fp32-auto bf16 int8 for inference, "
                   "fp32 bf16-autocast for a training step)")
    p.add_argument("--peers", nargs="*", default=["timm", "hf", "torchvision"],
                   help="peer libraries to time beside vitlab (none: --peers with no names)")
    p.add_argument("--compile", nargs="*", choices=PRECISIONS, default=[],
                   help="also time torch.compile'd vitlab at these precisions (compile time reported)")
    p.add_argument("--compile-mode", choices=COMPILE_MODES, default="default",
                   help="torch.compile's mode for --compile (reduce-overhead replays CUDA graphs)")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]: where the models and ceilings run")
    p.add_argument("--gelu", choices=("tanh", "exact"),
                   help="override the variant's GELU for every library (torchvision's is always exact)")
    p.add_argument("--rounds", type=COUNT, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--min-time", type=flag_number(at_least=0), default=1.0, help="seconds per sample (default 1)")
    p.add_argument("--max-wait", type=float, default=3.0, help="seconds to wait for a quiet machine per sample")
    p.add_argument("--wait-budget", type=float, default=120.0,
                   help="total seconds to spend waiting for quiet in the run (default 120)")
    p.add_argument("--contended", type=float, default=0.1,
                   help="others' CPU use (cores) above which a sample is dropped (default 0.1)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="wall: real time with all threads (default; needs a quiet machine); cpu: one "
                   "thread timed by its own CPU time, comparable on a busy machine")
    p.add_argument("--out", help="folder for NAME.csv and NAME.md (default: print only)")
    p.add_argument("--name", help="result file name (default: the suite name, or 'bench')")


def _plan(args) -> list:
    """(setting, systems) for each --model, --task and --batch-size."""
    from vitlab.api import get_config
    from vitlab.bench import suites, systems

    plan = []
    for name in args.model or ["ViT-B/16"]:
        cfg = get_config(name, **({"gelu": args.gelu} if args.gelu else {}))  # ConfigError names the known models
        for task in args.task:
            # the packed and int8 copies are built from a ViT's blocks: a BiT ResNet has fp32 and autocast
            default = suites.FAST if task == "infer" and cfg.kind != "bit" else ["fp32", "bf16-autocast"]
            chosen = systems.standard_systems(task, args.peers, args.compile, args.precision or default,
                                              compile_mode=args.compile_mode)
            plan += [(systems.Setting(cfg, b, task), chosen) for b in args.batch_size or [1]]
    return plan


def run(args) -> int:
    import sys

    from vitlab.bench import machine, runner, suites, tables
    from vitlab.bench.peers import PEERS
    from vitlab.cli import UsageError
    from vitlab.deploy import kernels
    from vitlab.files import check_name

    unknown = sorted(set(args.peers) - set(PEERS))
    if unknown:
        raise UsageError(f"unknown peer(s) {unknown}; choose from {', '.join(PEERS)}")
    try:
        device = machine.check_device(args.device)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.suite == "gpu" and not device.startswith("cuda"):
        raise UsageError("--suite gpu times GPU kernels (fp16, CUDA graphs): add --device cuda")
    plan = suites.suite(args.suite, args.model, args.batch_size) if args.suite else _plan(args)
    config = runner.BenchConfig(rounds=args.rounds, min_time=args.min_time, max_wait=args.max_wait,
                                wait_budget=args.wait_budget, contended_cores=args.contended,
                                clock=args.clock, device=device)
    info = machine.machine_info(device)
    name = args.name or args.suite or "bench"
    check_name(name, "--name")  # refused before the benchmark, not after it

    def save(rows):  # after every setting, so an interrupted run keeps what it measured
        info["kernels"] = "\n".join(map(str, kernels.choices()))  # what the inference copies chose here, and why
        return tables.write_results(rows, args.out, name, info, config) if args.out else None

    rows = runner.run(plan, config, log=lambda s: print(s, file=sys.stderr, flush=True), progress=save)
    written = save(rows)
    print(tables.markdown(rows, info, config))
    if written:
        print(f"wrote {written[0]} and {written[1]}")
    return 0
