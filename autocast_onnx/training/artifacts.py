"""Converting an onnxruntime-training artifacts folder (what
`onnxruntime.training.artifacts.generate_artifacts` writes) as one unit:

  training_model.onnx   converted: fp16 compute, fp32 master weights, loss scaling
  eval_model.onnx       converted like an inference graph (its loss stays fp32)
  optimizer_model.onnx  copied unchanged: the optimizer works on the fp32 parameters and moments
  checkpoint            copied unchanged: the parameters stay fp32, with the same names
  anything else         copied unchanged

and a manifest (autocast-manifest.json) of what changed, which lists every entry it wrote: each
top-level name in "files", and for a folder, every path inside it in its entry's "contents". The
output folder appears whole or not at all: everything is written into a temporary folder beside
it, then renamed into place. Nothing outside the input folder is read (a symlink out of it is
refused), no FIFO or device is opened, and an existing output folder is replaced only when it is
this command's earlier output: nothing in it, at any depth, that its manifest does not list.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import AutocastError

TRAINING_MODEL = "training_model.onnx"
EVAL_MODEL = "eval_model.onnx"
MANIFEST = "autocast-manifest.json"


def is_artifacts_dir(path) -> bool:
    path = Path(path)
    return path.is_dir() and (path / TRAINING_MODEL).is_file()


@dataclass
class ArtifactsResult:
    out_dir: Path
    results: dict = field(default_factory=dict)  # file name -> ConversionResult
    copied: list = field(default_factory=list)
    manifest: dict = field(default_factory=dict)
    pending: _Swap | None = None  # a run with hold=True: the swap that `settle` finishes

    def settle(self, keep: bool) -> None:
        """Finish a run made with hold=True, whose earlier output is still renamed aside: keep the
        new folder (the earlier output is deleted), or undo the run (the new folder is removed
        whole and the earlier output renamed back). A caller that fails after the run, while
        reporting it, undoes it: either way the folder is complete, with its manifest."""
        swap, self.pending = self.pending, None
        if swap is None:
            return
        if keep:
            swap.keep()
        else:
            swap.undo()


@dataclass
class _Swap:
    """A new output folder renamed into place at `out_dir`, with the earlier output renamed
    `aside` (None: there was none) and `spare`, the staging folder's name, free again."""

    out_dir: Path
    spare: Path
    aside: Path | None

    def keep(self) -> None:
        if self.aside is not None:
            shutil.rmtree(self.aside, ignore_errors=True)

    def undo(self) -> None:
        """Remove the new folder whole and put the earlier output back. Where a rename fails,
        the new folder stays complete instead (all or nothing, never a folder half removed)."""
        try:
            os.rename(self.out_dir, self.spare)
        except OSError:
            self.keep()
            return
        if self.aside is not None:
            try:
                os.rename(self.aside, self.out_dir)
            except OSError:
                os.rename(self.spare, self.out_dir)
                self.keep()
                return
        shutil.rmtree(self.spare, ignore_errors=True)


def default_output_dir(in_dir: Path, precision: str) -> Path:
    return in_dir.with_name(f"{in_dir.name}.{precision}")


def _check_out_dir(in_dir: Path, out_dir: Path) -> None:
    """Refuse an output folder that would overwrite the input or someone else's files. A folder
    already there (an earlier output of this command, or an empty one) is replaced. Paths are
    compared resolved, symlinks included, in both directions."""
    _refuse_overlap(in_dir, out_dir)
    if out_dir.is_symlink():
        raise AutocastError(
            "is a symbolic link",
            str(out_dir),
            "pass the folder itself or a new name; autocast-onnx replaces a folder, never writes through a link",
        )
    if out_dir.exists() and not out_dir.is_dir():
        raise AutocastError("exists and is not a folder", str(out_dir), "choose a new -o folder")
    if out_dir.is_dir():
        _check_earlier_output(in_dir, out_dir)
    elif not out_dir.parent.is_dir():
        raise AutocastError("the folder it would be created in does not exist", str(out_dir), "create it first")


def _refuse_overlap(in_dir: Path, out_dir: Path) -> None:
    """Refuse an -o that is the input, lies inside it or holds it (replacing it would delete the input)."""
    source, target = in_dir.resolve(), out_dir.resolve()
    if target == source or target.is_relative_to(source):
        raise AutocastError(
            "the output folder is the artifacts folder or inside it",
            str(out_dir),
            "choose an -o folder outside the input; autocast-onnx never modifies its input",
        )
    if source.is_relative_to(target):
        raise AutocastError(
            f"the output folder holds the artifacts folder {in_dir} (replacing it would delete the input)",
            str(out_dir),
            "choose an -o folder outside the input; autocast-onnx never modifies its input",
        )


def _check_earlier_output(in_dir: Path, out_dir: Path) -> None:
    """An existing -o folder is replaced only when it is empty or holds nothing but an earlier
    output: a manifest this command wrote and the entries it lists, at any depth (_unlisted)."""
    names = _listing(out_dir)
    if not names:
        return
    listed = _manifest_files(out_dir)
    foreign = []
    for name in names:
        if name == MANIFEST:
            continue
        if name not in listed:
            foreign.append(name)
        elif _kind(out_dir / name) == "dir":
            foreign += _unlisted(in_dir, out_dir, name, listed[name].get("contents"))
    if foreign:
        shown = ", ".join(f"'{name}'" for name in foreign[:3]) + (
            f" and {len(foreign) - 3} more" if foreign[3:] else ""
        )
        raise AutocastError(
            f"the output folder holds {shown}, which its {MANIFEST} does not list",
            str(out_dir),
            "move it away or choose a new -o folder; autocast-onnx replaces only its own earlier output",
        )


def _unlisted(in_dir: Path, out_dir: Path, top: str, contents: list | None) -> list[str]:
    """The entries inside the earlier output's folder `top` that its manifest entry does not
    list, as paths in the output folder; a folder not listed is named, not walked. `contents`
    lists every path inside `top`. A manifest written before it was recorded (no "contents")
    lists only the name `top`: an entry inside is then taken as the earlier run's copy when the
    input's folder `top` has an entry of that path and kind (file, folder, link), and anything
    else is foreign (a file the user added, or one the input no longer has)."""
    if contents is not None:
        allowed = set(contents)

        def known(rel: str, kind: str) -> bool:
            return rel in allowed
    else:
        source = in_dir / top
        source_is_dir = _kind(source) == "dir"

        def known(rel: str, kind: str) -> bool:
            return source_is_dir and _kind(source / rel) == kind

    return [f"{top}/{rel}" for rel in _walk(out_dir / top, known)[1]]


def _walk(folder: Path, known=None) -> tuple[list[str], list[str]]:
    """The paths inside `folder` ('/'-separated, sorted, symlinks not followed), split by `known`
    (rel, kind) -> bool into those it accepts and those it does not (every path is accepted
    without it); a folder it does not accept is not walked into."""
    accepted: list[str] = []
    refused: list[str] = []

    def visit(rel: str) -> bool:
        kind = _kind(folder / rel)
        if known is not None and not known(rel, kind):
            refused.append(rel)
            return False
        accepted.append(rel)
        return kind == "dir"

    _tree(folder, visit)
    return sorted(accepted), sorted(refused)


def _tree(folder: Path, visit) -> None:
    """Call `visit(rel)` for every path inside `folder` ('/'-separated, each folder's names in
    order); it walks into `rel` when `visit` returns True (the callers never say so for a link)."""
    pending = [""]
    while pending:
        at = pending.pop()
        for name in _listing(folder / at):
            rel = f"{at}/{name}" if at else name
            if visit(rel):
                pending.append(rel)


def _kind(path: Path) -> str | None:
    """What `path` is by os.lstat (no link followed): "dir", "file", "link", "special", or None
    when it is missing."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None
    if stat.S_ISLNK(mode):
        return "link"
    return "dir" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else "special"


def _manifest_files(out_dir: Path) -> dict:
    """The "files" table of the manifest of an earlier output (name -> entry); refuses a folder
    without one, or whose manifest this command did not write."""
    manifest = out_dir / MANIFEST
    if not manifest.is_file() or manifest.is_symlink():
        raise AutocastError(
            f"the output folder exists and holds files autocast-onnx did not write (no {MANIFEST})",
            str(out_dir),
            "choose a new or empty -o folder",
        )
    try:
        files = json.loads(manifest.read_text(encoding="utf-8")).get("files")
    except (OSError, ValueError, AttributeError):
        files = None
    if not isinstance(files, dict) or not all(_manifest_entry(entry) for entry in files.values()):
        raise AutocastError(
            f'the output folder\'s {MANIFEST} is not one autocast-onnx wrote (no "files" table)',
            str(out_dir),
            "choose a new or empty -o folder",
        )
    return files


def _manifest_entry(entry) -> bool:
    """Whether `entry` is a "files" entry as this command writes them: an object whose
    "contents", where present, is a list of paths."""
    if not isinstance(entry, dict):
        return False
    contents = entry.get("contents", [])
    return isinstance(contents, list) and all(isinstance(rel, str) for rel in contents)


def convert_artifacts(
    in_dir, out_dir=None, *, check: str = "basic", loss_scale=None, hold: bool = False, **options
) -> ArtifactsResult:
    """Convert an artifacts folder into `out_dir` (default: IN_DIR.<precision> beside it). The
    options are those of pipeline.convert: the planning options as keywords (precision, rules,
    exclude_ops, ...) or one PlanOptions as options=, made into one PlanOptions here for both
    models; `loss_scale` applies to training_model.onnx. `hold`: the earlier output stays renamed
    aside until the caller calls `result.settle(keep)` (see process_folder)."""
    from ..pipeline import convert_file
    from ..plan.options import plan_options_in

    in_dir = Path(in_dir)
    for name in ("plan", "plan_out", "calibration", "force_fp32"):
        if options.get(name) is not None:
            raise AutocastError(
                f"{name} is not supported for an artifacts folder",
                str(in_dir),
                "convert training_model.onnx on its own to use it",
            )
    planning, rest = plan_options_in(options, "convert_artifacts")
    precision = planning.target.value
    out_dir = Path(out_dir) if out_dir is not None else default_output_dir(in_dir, precision)

    def convert_one(source: Path, target: Path) -> dict:
        extra = {"loss_scale": loss_scale} if source.name == TRAINING_MODEL else {}
        converted = convert_file(source, target, check=check, options=planning, **rest, **extra)
        result.results[source.name] = converted
        return _converted_entry(converted)

    result = ArtifactsResult(out_dir=out_dir)

    def head(results) -> dict:
        scaling = results[TRAINING_MODEL].loss_scaling
        return {
            "precision": precision,
            "loss_scale": scaling.to_dict() if scaling else {"mode": "none"},
            "master_weights": "fp32 (parameters stay fp32 graph inputs; checkpoint and optimizer unchanged)",
        }

    process_folder(in_dir, out_dir, convert_one, result, head, hold=hold)
    return result


def process_folder(in_dir: Path, out_dir: Path, handle, result: ArtifactsResult, head, hold: bool = False) -> None:
    """Write `out_dir` from the artifacts folder `in_dir`: `handle(source, target)` writes each
    of the two models and returns its manifest entry; every other file is copied. All or
    nothing: the input is checked whole first (symlinks, special files), then everything is
    staged in a temporary folder beside `out_dir` and renamed into place at the end. With
    `hold`, an earlier output renamed aside is kept until `result.settle(keep)`: a caller that
    fails after this returns (while it reports the run) can still undo the run whole."""
    from .._version import __version__
    from ..io import _umask

    in_dir = Path(in_dir)
    if not is_artifacts_dir(in_dir):
        raise AutocastError(
            f"not an onnxruntime-training artifacts folder (no {TRAINING_MODEL})",
            str(in_dir),
            "pass the folder generate_artifacts wrote, or a model file",
        )
    _check_out_dir(in_dir, out_dir)
    entries = scan_folder(in_dir)
    out_dir = _out_path(out_dir)
    staging = None
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
        os.chmod(staging, 0o777 & ~_umask())  # a plain mkdir's permissions (mkdtemp's are owner-only)
        files = _stage(in_dir, staging, entries, handle, result)
        result.manifest = {
            "tool": f"autocast-onnx {__version__}",
            "source": str(in_dir),
            **head(result.results),
            "files": files,
        }
        (staging / MANIFEST).write_text(json.dumps(result.manifest, indent=1) + "\n", encoding="utf-8")
        swap = _Swap(out_dir, staging, _swap_in(staging, out_dir))
        staging = None
        if hold:
            result.pending = swap
        else:
            swap.keep()
    except OSError as exc:
        raise AutocastError(
            f"cannot write output: {exc.strerror or exc}", str(out_dir), "check free space and permissions"
        ) from None
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


def _stage(in_dir: Path, staging: Path, entries: list, handle, result: ArtifactsResult) -> dict:
    """Write the scanned entries into `staging`: the models first (by `handle`, with what it
    writes beside them: their external data), then a copy of the rest, except what a model's
    conversion wrote (the input's external data of that model is replaced, never copied over
    it) and the input's own manifest. Returns the manifest's "files" table: top-level names,
    each folder's entry with the "contents" written into it (every path inside, at any depth)."""
    files: dict[str, dict] = {}
    for entry in entries:
        if entry.kind == "model":
            before = set(os.listdir(staging))
            files[entry.rel] = handle(in_dir / entry.rel, staging / entry.rel)
            for name in sorted(set(os.listdir(staging)) - before - {entry.rel}):
                files[name] = {"action": f"written with {entry.rel} (its external data)"}
    written = set(files) | {MANIFEST}
    for entry in entries:
        top = entry.rel.split("/", 1)[0]
        if top in written:
            continue
        _copy_entry(in_dir, staging, entry)
        if top == entry.rel:
            result.copied.append(entry.rel)
            files[entry.rel] = {"action": "copied unchanged"}
    for name, listed in files.items():
        if _kind(staging / name) == "dir":
            listed["contents"] = _walk(staging / name)[0]
    return dict(sorted(files.items()))


def _out_path(out_dir: Path) -> Path:
    """`out_dir` with its parent folders resolved (symlinks, '..') and its last name kept, so
    that the staging folder and the renames happen beside the real folder."""
    if out_dir.name in ("", ".", ".."):
        return out_dir.resolve()
    return out_dir.parent.resolve() / out_dir.name


def _swap_in(staging: Path, out_dir: Path) -> Path | None:
    """Rename the staged folder to `out_dir`. A folder already there is renamed aside first and
    returned, to be deleted once the run is settled (_Swap); if the rename in fails, it is
    renamed back."""
    aside = None
    if os.path.lexists(out_dir):
        aside = staging.with_name(staging.name + ".old")  # unique: the staging name is
        os.rename(out_dir, aside)
    try:
        os.rename(staging, out_dir)
    except BaseException:
        if aside is not None:
            os.rename(aside, out_dir)
        raise
    return aside


@dataclass(frozen=True)
class FolderEntry:
    """One entry of an artifacts folder: `rel` its '/'-separated path in the folder, `kind`
    "model" (converted), "file", "dir" or "link"; `link` a link's target, relative to the link."""

    rel: str
    kind: str
    link: str = ""


def scan_folder(in_dir: Path) -> list[FolderEntry]:
    """Every entry of the artifacts folder, folders before what they hold, after refusing what
    cannot be copied safely: a symlink whose target is outside the folder (the rule of external
    data: nothing outside the input is read), a dangling symlink or a loop, and a FIFO, socket
    or device (never opened: opening a FIFO waits for a writer). A symlink inside the folder is
    kept as a symlink (to the same entry of the output, as a relative link); symlinked folders
    are not walked into."""
    root = in_dir.resolve()
    entries: list[FolderEntry] = []

    def visit(rel: str) -> bool:
        entries.append(_classify(in_dir, root, rel))
        return entries[-1].kind == "dir"

    _tree(in_dir, visit)
    return entries


def _listing(folder: Path) -> list[str]:
    try:
        return sorted(entry.name for entry in os.scandir(folder))
    except OSError as exc:
        raise AutocastError(f"cannot read: {exc.strerror or exc}", str(folder), "check its permissions") from None


def _classify(in_dir: Path, root: Path, rel: str) -> FolderEntry:
    """What the entry `rel` is, refusing a link out of the folder, a dangling one and a special file."""
    path = in_dir / rel
    try:
        mode = os.lstat(path).st_mode
    except OSError as exc:
        raise AutocastError(f"cannot read: {exc.strerror or exc}", str(path), "check its permissions") from None
    if stat.S_ISLNK(mode):
        kind, link = "link", _link_target(root, rel, str(path))
    elif stat.S_ISDIR(mode) or stat.S_ISREG(mode):
        kind, link = "dir" if stat.S_ISDIR(mode) else "file", ""
    else:
        raise _special_file(mode, str(path))
    return FolderEntry(rel, "model" if rel in (TRAINING_MODEL, EVAL_MODEL) else kind, link)


def _link_target(root: Path, rel: str, where: str) -> str:
    """The target of the symlink `rel` (under the resolved folder `root`) as a path relative to
    the link's folder, after refusing one that leads nowhere or out of the folder."""
    link = root / rel  # the folders above it are real folders: links are not walked into
    try:
        target = link.resolve(strict=True)
    except (OSError, RuntimeError):  # missing, or a loop (RuntimeError before Python 3.13)
        raise AutocastError(
            "symbolic link that leads nowhere (its target is missing, or the links form a loop)",
            where,
            "remove it, or point it at a file in the folder",
        ) from None
    if not target.is_relative_to(root):
        raise AutocastError(
            f"symbolic link to '{target}', outside the artifacts folder",
            where,
            "copy the file into the folder instead; refusing to read it",
        )
    return os.path.relpath(target, link.parent)


def _special_file(mode: int, where: str) -> AutocastError:
    kind = (
        "a named pipe (FIFO)"
        if stat.S_ISFIFO(mode)
        else "a socket"
        if stat.S_ISSOCK(mode)
        else "a device"
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
        else "a special file"
    )
    return AutocastError(
        f"is {kind}, not a file or folder",
        where,
        "remove it from the artifacts folder; only files, folders and symlinks inside it are copied",
    )


def _copy_entry(in_dir: Path, staging: Path, entry: FolderEntry) -> None:
    """Copy one scanned entry into the staging folder (a link as a link, a folder as a new folder)."""
    target = staging / entry.rel
    if entry.kind == "link":
        os.symlink(entry.link, target)
    elif entry.kind == "dir":
        os.mkdir(target)
    else:
        _copy_file(in_dir / entry.rel, target)


def _copy_file(source: Path, target: Path) -> None:
    """Copy a regular file with its permissions and times. Opened without following a symlink
    and without blocking, then checked to be a regular file: an entry swapped for a link or a
    FIFO since the scan is refused, never read through or waited on."""
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise AutocastError(f"cannot read: {exc.strerror or exc}", str(source), "check its permissions") from None
    with open(fd, "rb") as src:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _special_file(st.st_mode, str(source))
        with open(target, "xb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    os.chmod(target, stat.S_IMODE(st.st_mode))
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))


def _converted_entry(result) -> dict:
    counts = result.plan.counts()
    entry = {
        "action": "converted",
        "nodes": len(result.plan.precisions),
        "precision": {k: v for k, v in counts.items() if v},
        "casts_added": result.stats.casts_added,
    }
    if result.plan.training is not None:
        entry["training"] = result.plan.training
    return entry
