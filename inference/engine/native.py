"""Tandem's C kernels, built on the host that runs them: compiled on first use with the host's C compiler (`CC`, or
cc/gcc; ~1 s) into a cache folder keyed by the source's hash and the flags, and loaded with ctypes.

No -march: each kernel names its instruction set in its source (target attributes) and picks one at run time, so one
build runs on every x86-64 host. With OpenMP where the compiler has it (threads > 1 split a kernel's loop), without
where it does not. Workers of one host may build at once: each build goes to a temporary file renamed into place.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

FLAGS = ("-O3", "-shared", "-fPIC")


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "tandem" / "kernels"


def compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


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


def build(source: Path) -> tuple[Path | None, str | None]:
    """(the shared library's path, None), built if not cached, or (None, why it could not be built)."""
    # The headers beside the source (kernels.h) go into the key too: a kernel includes them.
    parts = [source.read_bytes(), *(header.read_bytes() for header in sorted(source.parent.glob("*.h"))),
             " ".join(FLAGS).encode()]
    digest = hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]
    target = cache_dir() / f"{source.stem}-{digest}.so"
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


def load(source: Path) -> tuple[ctypes.CDLL | None, str | None]:
    """(the loaded library, None) or (None, why it cannot run here)."""
    path, reason = build(source)
    if path is None:
        return None, reason
    try:
        return ctypes.CDLL(str(path)), None
    except OSError as exc:
        return None, f"the {source.stem} kernel did not load: {exc}"


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
