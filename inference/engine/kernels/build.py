"""Tandem's C kernels: built when the project is installed, loaded with ctypes.

`pip install .` (and `make setup`) compiles every kernel into `_built/` beside these sources (setup.py runs
`build_all`, this module, with only the standard library imported). A worker loads the library of the source it has:
the file name carries a hash of the source, its headers and the flags, so a stale build is never loaded. Where no
installed build matches (a development checkout whose sources changed, a copy that skipped the install step), the
worker compiles the kernel on first use into a cache folder and says so loudly: a warning in the log, `origin:
"first_use"` under `kernels` on /info and `tandem_worker_kernel_first_use_builds` on /metrics. Where that fails too
(no compiler), the kernel is missing and the engine keeps torch's path for what it would have run, saying why.

No -march: each kernel names its instruction set in its source (target attributes) and picks one at run time, so one
build runs on every x86-64 host. With OpenMP where the compiler has it (threads > 1 split a kernel's loop), without
where it does not. Processes of one host may build at once: each build goes to a temporary file renamed into place.

`python -m inference.engine.kernels.build [DIR]` builds them all (into DIR, default `_built/`) and says what failed.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

log = logging.getLogger(__name__)

FLAGS = ("-O3", "-shared", "-fPIC")
HERE = Path(__file__).resolve().parent
INSTALLED = HERE / "_built"
# Every kernel's source; the wrappers beside them (matvec.py, ...) each load one.
SOURCES = tuple(HERE / f"{name}.c" for name in
                ("matvec", "int8_matvec", "paged_attention", "prefill_attention", "decode_layers"))

# kernel name -> {"origin": installed | cached | first_use | missing, "path" or "reason"}: what this process loaded.
_status: dict[str, dict] = {}
_status_lock = threading.Lock()


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "tandem" / "kernels"


def compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def library_name(source: Path) -> str:
    """`<kernel>-<hash>.so`: the hash covers the source, the headers beside it (a kernel includes them) and FLAGS."""
    parts = [source.read_bytes(), *(header.read_bytes() for header in sorted(source.parent.glob("*.h"))),
             " ".join(FLAGS).encode()]
    digest = hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]
    return f"{source.stem}-{digest}.so"


def _build(cc: str, source: Path, target: Path) -> None:
    """Compile `source` into `target`, atomically."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        out = Path(tmp) / target.name
        base = [cc, *FLAGS, str(source), "-o", str(out), "-lm"]
        result = subprocess.run([*base[:1], "-fopenmp", *base[1:]], capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            result = subprocess.run(base, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise RuntimeError(f"{cc} failed to build {source.name}: {result.stderr.strip()[-500:]}")
        os.replace(out, target)


def compile_into(source: Path, folder: Path) -> tuple[Path | None, str | None]:
    """(the shared library built from `source` in `folder`, None), reusing one already there, or (None, why not)."""
    target = folder / library_name(source)
    if target.exists():
        return target, None
    cc = compiler()
    if cc is None:
        return None, f"no C compiler found to build the {source.stem} kernel (install gcc or set CC)"
    try:
        _build(cc, source, target)
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        return None, f"the {source.stem} kernel did not build: {exc}"
    return target, None


def build_all(folder: Path = INSTALLED) -> dict[str, str | None]:
    """Build every kernel into `folder` (the install step); kernel name -> None, or why it did not build. Builds of
    older sources in `folder` are removed."""
    errors = {}
    for source in SOURCES:
        path, errors[source.stem] = compile_into(source, folder)
        if path is not None:
            for old in folder.glob(f"{source.stem}-*.so"):
                if old != path:
                    old.unlink(missing_ok=True)
    return errors


def _locate(source: Path) -> tuple[Path | None, str, str | None]:
    """(the library's path, its origin, None) or (None, "missing", why)."""
    name = library_name(source)
    if (INSTALLED / name).exists():
        return INSTALLED / name, "installed", None
    if (cache_dir() / name).exists():
        origin = "cached"  # compiled on first use by an earlier process: not installed either
    else:
        origin = "first_use"
    path, reason = compile_into(source, cache_dir())
    if path is None:
        log.warning("kernel %s: missing (%s); the engine keeps torch's path for it", source.stem, reason)
        return None, "missing", reason
    log.warning("kernel %s: not built at install (pip install . or make setup builds it); %s %s", source.stem,
                "compiled it on first use into" if origin == "first_use" else "using an earlier first-use build,",
                path)
    return path, origin, None


def load(source: Path) -> tuple[ctypes.CDLL | None, str | None]:
    """(the loaded library, None) or (None, why it cannot run here); recorded for `status()`."""
    path, origin, reason = _locate(source)
    lib = None
    if path is not None:
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as exc:
            origin, reason = "missing", f"the {source.stem} kernel did not load: {exc}"
    with _status_lock:
        _status[source.stem] = {"origin": origin, **({"path": str(path)} if lib is not None else {"reason": reason})}
    return lib, reason


def status() -> dict[str, dict]:
    """Each kernel: what this process loaded (origin installed, cached, first_use or missing, with the path or the
    reason), or {"origin": "not loaded", "installed": bool} for one it has not needed."""
    with _status_lock:
        loaded = dict(_status)
    return {source.stem: loaded.get(source.stem) or {"origin": "not loaded",
                                                      "installed": (INSTALLED / library_name(source)).exists()}
            for source in SOURCES}


ISA_NAMES = {1: "avx2+fma", 2: "avx512f"}  # kernels.h's codes


class KernelLibrary:
    """A loaded kernel library with kernels.h's instruction-set functions (TANDEM_ISA_FUNCTIONS(name)): `isa` is the
    set it runs on this CPU (avx512f, avx2+fma), None for neither."""

    def __init__(self, lib: ctypes.CDLL, name: str):
        self.lib = lib
        self._isa, self._cap_isa = getattr(lib, f"{name}_isa"), getattr(lib, f"{name}_cap_isa")
        self._isa.restype = self._cap_isa.restype = ctypes.c_int
        self._cap_isa.argtypes = [ctypes.c_int]
        self.isa = ISA_NAMES.get(self._isa())

    def cap_isa(self, name: str) -> str | None:
        """Run no wider set than `name` (avx2+fma, avx512f) from now on, in this process; returns the set used."""
        codes = {v: k for k, v in ISA_NAMES.items()}
        self.isa = ISA_NAMES.get(self._cap_isa(codes[name]))
        return self.isa


def load_library(source: Path, library_type: type[KernelLibrary], what: str):
    """(library_type over the loaded library, None), or (None, why it cannot run here: no build, no load, or a CPU
    with neither instruction set the kernels have)."""
    lib, reason = load(source)
    if lib is None:
        return None, reason
    library = library_type(lib)
    if library.isa is None:
        return None, f"this CPU has neither AVX-512F nor AVX2 with FMA, which the {what} needs"
    return library, None


def main(argv: list[str]) -> int:
    folder = Path(argv[0]) if argv else INSTALLED
    errors = build_all(folder)
    for name, error in errors.items():
        print(f"kernel {name}: {'built' if error is None else error}", file=sys.stderr if error else sys.stdout)
    return 1 if any(errors.values()) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
