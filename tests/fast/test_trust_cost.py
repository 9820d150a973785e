"""What the input checks of issue 26 cost, and the checks that stay when that cost is cut.

Each initializer the loader leaves in the model's file is checked once, against protobuf's parse
(io._left_in_file), and neither the input checks (graph/sanity.py) nor the weight screen's
cross-check (plan/screen.py) reads it again; so that check must hold everything theirs did: the
external data's keys as well as its values, a payload inside the file, dims that are not negative.
The other fast paths here: the rule-file line mapper's one-regex path for the common line (it must
map every line as the general scanner does), the input checks' shortcut for plain tensors (it
never accepts what check_tensor refuses), and the `regex` package, imported only when a command
is given a regex."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import helpers
import onnx
import pytest
from helpers import parse, randn
from onnx import TensorProto, helper

from autocast_onnx import io as io_module
from autocast_onnx.catalog import toml_lines
from autocast_onnx.catalog.toml_lines import TomlLines
from autocast_onnx.errors import AutocastError
from autocast_onnx.fast import in_file, screen_work
from autocast_onnx.fast.screen import WeightScreen
from autocast_onnx.graph import sanity
from autocast_onnx.io import load_model
from autocast_onnx.pipeline import convert_file

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the worker and payloads left in the file are Linux-only"
)
ROOT = Path(__file__).resolve().parents[2]
SHAPE = [32, 32]  # 4 KiB of fp32 each: left in the file


def chain() -> onnx.ModelProto:
    return parse(
        """
        chain (float[2,32] x) => (float[2,32] y) {
            [fc1] h1 = MatMul(x, w1)
            [fc2] h2 = MatMul(h1, w2)
            [fc3] y = MatMul(h2, w3)
        }
        """,
        **{f"w{k}": randn(SHAPE, seed=k, scale=0.2) for k in range(1, 4)},
    )


worker_for_small_files = pytest.fixture(name="worker_for_small_files")(helpers.worker_for_small_files)


def saved(tmp_path: Path, model: onnx.ModelProto) -> Path:
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    return path


def prepared_by_worker(path: Path):
    """The worker's walk of `path` (encoding, rows, identity), read once."""
    screen = WeightScreen.start(path, min_bytes=0)
    assert screen is not None
    ready = screen.encoding()
    screen.close()
    assert ready is not None
    return ready


# ---- the loader's check holds what the later checks held --------------------------------------------


@linux_only
def test_external_data_keys_the_walk_did_not_write_are_not_taken(tmp_path, worker_for_small_files):
    """An encoding whose external_data entry has another key than "location" (same length, so
    every length prefix still fits) is not the walk's: the file is parsed whole. Taken, the input
    checks would have refused the model for a location it never had."""
    path = saved(tmp_path, chain())
    truth = onnx.load(path)
    encoding, rows, seen = prepared_by_worker(path)
    assert bytes(encoding).count(b"\x08location") == 3
    tampered = bytes(encoding).replace(b"\x08location", b"\x08locatiom", 1)
    loaded = load_model(path, load_external=False, parse=in_file.parser(lambda: (tampered, rows, seen)))
    assert loaded.left_in_file is None and loaded.model == truth
    sanity.check_input(loaded.model, str(path), path.parent, left_in_file=loaded.left_in_file)


@linux_only
def test_a_tensor_with_more_than_the_walk_wrote_is_judged_field_by_field(tmp_path, worker_for_small_files):
    """A doc_string (or metadata) is not a payload: such a tensor, which the byte comparison does
    not recognise, is still left in the file, and its weights are its own."""
    model = chain()
    model.graph.initializer[0].doc_string = "the first layer"
    path = saved(tmp_path, model)
    truth = onnx.load(path)
    ready = prepared_by_worker(path)
    loaded = load_model(path, load_external=False, parse=in_file.parser(lambda: ready))
    assert loaded.left_in_file is not None and loaded.left_in_file.ordinals == {0, 1, 2}
    loaded.left_in_file.inline()
    assert loaded.model == truth


def test_a_row_beyond_the_file_is_not_taken(tmp_path):
    """A payload place past the end of the file, even one the tensor's own external data repeats,
    is a walk the parse does not bear out: nothing is left in the file."""
    model = onnx.ModelProto()
    tensor = model.graph.initializer.add()
    tensor.name, tensor.data_type = "w", TensorProto.FLOAT
    tensor.dims.extend(SHAPE)
    io_module._set_external(tensor, "m.onnx", 1 << 20, 4096)
    view = memoryview(bytes(8192))
    rows = [(0, 1 << 20, 4096, b"w")]
    assert in_file._left_in_file(view, tmp_path / "m.onnx", model, tmp_path.stat(), rows) is None
    assert len(model.graph.initializer) == 0  # cleared: the caller parses the file whole


@linux_only
def test_a_payload_with_negative_dims_is_put_back_and_refused(tmp_path, worker_for_small_files):
    """dims [-32, -32] give 4 KiB as [32, 32] do: the loader puts the payload back instead of
    leaving it in the file, and the input checks refuse the dims."""
    model = chain()
    bad = model.graph.initializer[1]
    del bad.dims[:]
    bad.dims.extend([-32, -32])
    path = saved(tmp_path, model)
    loaded = load_model(path, load_external=False, parse=in_file.parser(None))
    assert loaded.left_in_file is not None and loaded.left_in_file.ordinals == {0, 2}
    assert loaded.model.graph.initializer[1].HasField("raw_data")
    with pytest.raises(AutocastError) as err:
        convert_file(path, tmp_path / "out.onnx")
    assert "initializer 'w2' has a negative dimension in dims [-32, -32]" in err.value.line()
    assert not (tmp_path / "out.onnx").exists()


@linux_only
def test_the_input_checks_take_what_the_loader_left_as_checked(tmp_path, worker_for_small_files, monkeypatch):
    """check_input(left_in_file=...) looks at none of the tensors the loader left in the file
    (each was checked against the parse there), and at every other one."""
    model = chain()
    model.graph.initializer.append(helper.make_tensor("small", TensorProto.FLOAT, [4], [1.0, 2.0, 3.0, 4.0]))
    path = saved(tmp_path, model)
    ready = prepared_by_worker(path)
    loaded = load_model(path, load_external=False, parse=in_file.parser(lambda: ready))
    assert loaded.left_in_file is not None and loaded.left_in_file.ordinals == {0, 1, 2}
    seen = []
    real = sanity._plainly_sound
    monkeypatch.setattr(sanity, "_plainly_sound", lambda tensor: seen.append(tensor.name) or real(tensor))
    sanity.check_input(loaded.model, str(path), path.parent, left_in_file=loaded.left_in_file)
    assert seen == ["small"]


@linux_only
def test_the_screen_takes_what_the_loader_checked_and_checks_the_rest(tmp_path, worker_for_small_files, monkeypatch):
    """With the loader's PayloadsInFile the screen's results are the same; a screen that converted
    another tensor's bytes is still refused, for the places the loader did not check."""
    path = saved(tmp_path, chain())
    for swap in (False, True):
        real = screen_work._fp32_payloads

        def swapped(data, inits=None, real=real):
            found = list(real(data, inits))
            (a, name_a, start_a, n), (b, name_b, start_b, _) = found[:2]
            return [(a, name_a, start_b, n), (b, name_b, start_a, n), *found[2:]]

        if swap:
            monkeypatch.setattr(screen_work, "_fp32_payloads", swapped)
        screen = WeightScreen.start(path, min_bytes=0)
        monkeypatch.setattr(screen_work, "_fp32_payloads", real)
        loaded = load_model(path, load_external=False, parse=in_file.parser(screen.encoding))
        assert loaded.left_in_file is not None and len(loaded.left_in_file) == 3
        screened = screen.results(loaded.model, left_in_file=loaded.left_in_file)
        if swap:
            assert screened is None
        else:
            assert screened is not None and sorted(screened) == ["w1", "w2", "w3"]


# ---- the input checks' shortcut for plain tensors ---------------------------------------------------


def raw_tensor(dims, size=None, dtype=TensorProto.FLOAT, **fields) -> TensorProto:
    tensor = TensorProto(name="t", data_type=dtype, dims=dims, **fields)
    count = 1
    for d in dims:
        count *= d
    tensor.raw_data = bytes(size if size is not None else 4 * abs(count))
    return tensor


CASES = {
    "plain": (raw_tensor([2, 3]), True),
    "scalar": (raw_tensor([]), True),
    "doc_string": (raw_tensor([4], doc_string="why"), True),
    "raw_and_float_data": (raw_tensor([2], float_data=[1.0, 2.0]), False),
    "raw_and_external": (raw_tensor([2], data_location=TensorProto.EXTERNAL), False),
    "wrong_size": (raw_tensor([2, 3], size=20), False),
    "negative_pair": (raw_tensor([-2, -3]), False),
    "fp16_with_int32_data": (raw_tensor([2], size=4, dtype=TensorProto.FLOAT16, int32_data=[1, 2]), False),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_the_shortcut_never_accepts_what_check_tensor_refuses(case, tmp_path):
    tensor, sound = CASES[case]
    if sound:
        assert sanity._plainly_sound(tensor)
        sanity.check_tensor(tensor, "initializer 't'", "m.onnx", tmp_path, {})
    else:
        assert not sanity._plainly_sound(tensor)
        with pytest.raises(AutocastError):
            sanity.check_tensor(tensor, "initializer 't'", "m.onnx", tmp_path, {})


# ---- the rule-file line mapper's fast path ------------------------------------------------------------

DOCUMENTS = [
    '[ops.low_precision]\nMatMul = "gemm"\n"com.microsoft:Attention" = "attention" # c\n',
    '[a]\r\nk = "v"\r\n"q.r" = "x"\r\n',
    '[a]\nk = "has \\" quote"\n"esc\\u0041" = "v"\n"" = "empty key"\nlast = "no newline"',
    '[[nodes]]\nmatch = \'^enc/\'\nprecision = "fp32"\n[[nodes]]\nname = "x"\nwhy = """\nk = "v"\n"""\n',
    '[t]\n  spaced   =   "v"   \n\tk2="v2"#c\n  # comment\n\n[t . "u"]\nz = "1"\n',
]


@pytest.mark.parametrize(
    "text",
    [(ROOT / "rules" / "default.toml").read_text(), (ROOT / "rules" / "lint.toml").read_text(), *DOCUMENTS],
    ids=["default.toml", "lint.toml", *(f"doc{k}" for k in range(len(DOCUMENTS)))],
)
def test_the_common_line_fast_path_maps_as_the_scanner_does(text, monkeypatch):
    fast = TomlLines(text)
    monkeypatch.setattr(toml_lines, "SIMPLE_LINE", toml_lines.re.compile(r"(?!)"))  # never matches
    slow = TomlLines(text)
    assert fast.tables == slow.tables and fast.arrays == slow.arrays
    assert fast._keys == slow._keys and fast._first == slow._first


# ---- the regex package, only for a regex -----------------------------------------------------------------


@pytest.mark.slow
def test_a_conversion_without_a_regex_does_not_import_the_regex_package(tmp_path):
    path = saved(tmp_path, chain())
    code = (
        "import sys\n"
        "from autocast_onnx.pipeline import convert_file\n"
        f"convert_file({str(path)!r}, {str(tmp_path / 'out.onnx')!r})\n"
        "assert 'regex' not in sys.modules, 'imported'\n"
        f"convert_file({str(path)!r}, {str(tmp_path / 'out2.onnx')!r}, exclude_nodes=['^fc1$'])\n"
        "assert 'regex' in sys.modules, 'not imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
