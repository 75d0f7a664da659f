"""Reliability: nothing is ever run from a file. Crafted pickles of every protocol, in CIFAR
batches and in checkpoints, each trying to create a marker folder; the marker must never
appear, and each file must be refused with one clear line (vitlab.data.cifar, checkpoints)."""

from __future__ import annotations

import copyreg
import os
import pickle

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import vitlab
from conftest import assert_one_line_error, tree_state, unchanged
from vitlab.checkpoints.io import CheckpointError
from vitlab.cli import main
from vitlab.data import DataError, open_dataset
from vitlab.data.cifar import SafeUnpickler, UnsafePickleError, read_batch, read_names
from vitlab.data.transforms import eval_transform

PROTOCOLS = range(pickle.HIGHEST_PROTOCOL + 1)
NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


class MakeDir:
    """Unpickling this calls os.mkdir(marker): the sign that code from the file ran."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


class Evaluates:
    """The same through builtins.eval of a string, the other usual payload."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (eval, (f"__import__('os').mkdir({self.marker!r})",))


def hand_written(marker: str) -> dict[str, bytes]:
    """Opcode sequences pickle.dumps never writes for these objects: INST, OBJ, a persistent
    id, a global inside a numpy dtype, and an extension code (EXT1)."""
    m = marker.encode()
    return {
        "INST": b"(S'" + m + b"'\nios\nmkdir\n.",
        "OBJ": b"(cos\nmkdir\nS'" + m + b"'\no.",
        "REDUCE builtins.exec": b"cbuiltins\nexec\n(S'__import__(\"os\").mkdir(\"" + m + b"\")'\ntR.",
        "STACK_GLOBAL": b"\x80\x04\x8c\x02os\x8c\x05mkdir\x93\x8c" + bytes([len(m)]) + m + b"\x85R.",
        "persistent id": b"(S'" + m + b"'\nP0\n.",
        "numpy subtype": b"cnumpy.core.multiarray\n_reconstruct\n(cos\nmkdir\n(S'" + m + b"'\ntRK\x00\x85S'b'\ntR.",
        "EXT1": b"\x80\x02\x82\xf0(S'" + m + b"'\ntR.",
    }


def batch(n: int, seed: int) -> tuple[np.ndarray, list[int]]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 3072), dtype=np.uint8), [int(y) for y in rng.integers(0, 10, n)]


def write_cifar(folder, protocol: int = 2, poison: dict | None = None) -> None:
    """A small cifar-10-batches-py; `poison` = {file name: bytes} replaces files."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate([f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]):
        data, labels = batch(4, i)
        (folder / name).write_bytes(pickle.dumps({b"data": data, b"labels": labels, b"batch_label": b"x"}, protocol))
    (folder / "batches.meta").write_bytes(pickle.dumps({b"label_names": [n.encode() for n in NAMES]}, protocol))
    for name, blob in (poison or {}).items():
        (folder / name).write_bytes(blob)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_cifar_batches_of_every_protocol_read_exactly(tmp_path, protocol):
    folder = tmp_path / "cifar-10-batches-py"
    write_cifar(folder, protocol)
    ds = open_dataset(f"cifar10:{folder}", "test", eval_transform(32))
    data, labels = batch(4, 5)
    assert ds.class_names == NAMES and list(ds.labels) == labels
    x, y = ds[1]
    want = torch.from_numpy(data[1].reshape(3, 32, 32)).float() / 127.5 - 1
    assert y == labels[1] and torch.allclose(x, want, atol=1e-6)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("payload", [MakeDir, Evaluates])
@pytest.mark.parametrize("where", ["data_batch_3", "batches.meta"])
def test_crafted_cifar_pickles_of_every_protocol_run_nothing(tmp_path, protocol, payload, where):
    marker = tmp_path / "pwned"
    data, labels = batch(4, 0)
    blob = pickle.dumps({b"data": data, b"labels": labels, b"x": payload(str(marker))}, protocol)
    write_cifar(tmp_path / "cifar-10-batches-py", poison={where: blob})
    with unchanged(tmp_path), pytest.raises(DataError, match=f"{where}: refused to load"):
        open_dataset(f"cifar10:{tmp_path}", "train", eval_transform(32))
    assert not marker.exists()


@pytest.mark.parametrize("kind", list(hand_written("m")))
def test_hand_written_opcodes_run_nothing(tmp_path, kind):
    marker = tmp_path / "pwned"
    copyreg.add_extension("os", "mkdir", 0xF0)  # so that EXT1 0xf0 would name os.mkdir
    try:
        write_cifar(tmp_path / "cifar-10-batches-py", poison={"test_batch": hand_written(str(marker))[kind]})
        with pytest.raises(DataError, match="test_batch: refused"):
            open_dataset(f"cifar10:{tmp_path}", "test", eval_transform(32))
    finally:
        copyreg.remove_extension("os", "mkdir", 0xF0)
    assert not marker.exists()


def test_the_payloads_are_live(tmp_path):
    """The control: with the standard unpickler each crafted file does create its marker, so
    the refusals above are what keeps it from happening."""
    copyreg.add_extension("os", "mkdir", 0xF0)
    try:
        for i, (kind, _) in enumerate(hand_written("m").items()):
            marker = tmp_path / f"live{i}"
            if kind != "persistent id":  # a plain Unpickler has no persistent_load either
                try:
                    pickle.loads(hand_written(str(marker))[kind])
                except TypeError:
                    pass  # "numpy subtype" runs os.mkdir, then fails in _reconstruct
                assert marker.exists(), kind
    finally:
        copyreg.remove_extension("os", "mkdir", 0xF0)
    for protocol in PROTOCOLS:
        pickle.loads(pickle.dumps(MakeDir(str(tmp_path / f"p{protocol}")), protocol))
        assert (tmp_path / f"p{protocol}").exists()


FUZZ = settings(max_examples=int(os.environ.get("VITLAB_FUZZ_EXAMPLES", "40")), deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(data=st.data())
def test_fuzzed_cifar_pickles_raise_data_errors_only_and_run_nothing(tmp_path, data):
    """A CIFAR batch, benign or carrying a payload, in any protocol, with bytes changed, cut or
    appended: it reads, or raises DataError; the payload's marker never appears, whatever the
    mutation did to the globals it names."""
    marker = tmp_path / "pwned"
    images, labels = batch(3, 0)
    content = {b"data": images, b"labels": labels, **({b"x": MakeDir(str(marker))} if data.draw(st.booleans()) else {})}
    blob = bytearray(pickle.dumps(content, data.draw(st.sampled_from(list(PROTOCOLS)))))
    for _ in range(data.draw(st.integers(1, 6))):
        blob[data.draw(st.integers(0, len(blob) - 1))] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        blob = blob[: data.draw(st.integers(0, len(blob)))] + data.draw(st.binary(max_size=16))
    path = tmp_path / "data_batch_1"
    path.write_bytes(bytes(blob))
    for read in (lambda: read_batch(path, "labels", DataError), lambda: read_names(path, "label_names", DataError)):
        try:
            read()
        except DataError:
            pass
    assert not marker.exists()


def test_the_unpickler_itself_refuses_every_other_global():
    for module, name in (("os", "system"), ("subprocess", "Popen"), ("builtins", "getattr"), ("numpy", "load"),
                         ("numpy.core.multiarray", "scalar"), ("torch", "load"), ("_codecs", "decode")):
        with pytest.raises(UnsafePickleError):
            SafeUnpickler(__import__("io").BytesIO(b"c" + module.encode() + b"\n" + name.encode() + b"\n.")).load()


@pytest.mark.parametrize("damage", ["truncated", "not a dict", "object array", "wrong width", "labels too long",
                                    "label out of range", "no meta names"])
def test_damaged_cifar_files_are_named(tmp_path, damage):
    folder = tmp_path / "cifar-10-batches-py"
    data, labels = batch(4, 0)
    blobs = {
        "truncated": ("data_batch_1", pickle.dumps({b"data": data, b"labels": labels}, 2)[:500]),
        "not a dict": ("data_batch_1", pickle.dumps([1, 2, 3], 2)),
        "object array": ("data_batch_1", pickle.dumps({b"data": np.array([[1] * 3072], dtype=object), b"labels": [1]}, 2)),
        "wrong width": ("data_batch_1", pickle.dumps({b"data": data[:, :100], b"labels": labels}, 2)),
        "labels too long": ("data_batch_1", pickle.dumps({b"data": data, b"labels": labels + [1]}, 2)),
        "label out of range": ("test_batch", pickle.dumps({b"data": data, b"labels": [0, 1, 2, 10]}, 2)),
        "no meta names": ("batches.meta", pickle.dumps({b"names": NAMES}, 2)),
    }
    name, blob = blobs[damage]
    write_cifar(folder, poison={name: blob})
    with pytest.raises(DataError, match=name if damage != "label out of range" else "labels run from 0 to 10"):
        open_dataset(f"cifar10:{folder}", "train", eval_transform(32))


def test_the_cli_refuses_a_crafted_cifar_batch_in_one_line(tmp_path, capsys):
    marker = tmp_path / "pwned"
    write_cifar(tmp_path / "data" / "cifar-10-batches-py", poison={"data_batch_1": pickle.dumps(MakeDir(str(marker)), 2)})
    before = tree_state(tmp_path)
    rc = main(["train", "--data", f"cifar10:{tmp_path / 'data'}", "--steps", "1", "--out", str(tmp_path / "run"), "--quiet"])
    assert_one_line_error(rc, capsys.readouterr().err, "train", mentions=("data_batch_1", "refused"))
    assert not marker.exists()
    assert tree_state(tmp_path, skip=(tmp_path / "run",)) == before


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_crafted_checkpoint_pickles_of_every_protocol_run_nothing(tmp_path, protocol, capsys):
    """.pth/.bin files are read by torch's weights_only unpickler; a payload in any protocol
    is refused by every path that reads them: detection, each format, a Hugging Face folder."""
    marker = tmp_path / "pwned"
    evil = {"patch_embed.proj.weight": torch.zeros(2), "x": MakeDir(str(marker))}
    path = tmp_path / "w.pth"
    torch.save(evil, path, pickle_protocol=max(protocol, 2))  # torch.save writes protocol >= 2
    legacy = tmp_path / "legacy.bin"
    legacy.write_bytes(pickle.dumps(evil, protocol))
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "vit", "hidden_size": 8, "num_hidden_layers": 1, '
                                        '"num_attention_heads": 2, "intermediate_size": 16}')
    (folder / "pytorch_model.bin").write_bytes(legacy.read_bytes())
    for target, fmt in ((path, None), (path, "timm"), (path, "torchvision"), (legacy, "timm"), (folder, None)):
        with pytest.raises(CheckpointError):
            vitlab.load(target, format=fmt)
    assert main(["info", str(legacy), "--format", "torchvision"]) == 2
    assert_one_line_error(2, capsys.readouterr().err, "info", mentions=("refused",))
    assert not marker.exists()
