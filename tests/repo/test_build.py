"""The build: version/info output, the upstream pin, patches, and no upstream file in the repo."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import fetch_upstream  # scripts/fetch_upstream.py (tests/conftest.py puts scripts/ on the path)
import pyllama_so
from helpers.paths import REPO

PIN = json.loads((REPO / "cmake" / "upstream-pin.json").read_text())


def test_info_names_the_pin_and_backends() -> None:
    out = subprocess.run([sys.executable, "-m", "pyllama_so", "--json"], check=True, capture_output=True,
                         text=True).stdout
    info = json.loads(out)
    assert info["upstream_commit"] == PIN["commit"]
    assert "CPU" in info["compiled_backends"]
    assert any(d["type"] == "cpu" for d in info["devices"])
    version = subprocess.run([sys.executable, "-m", "pyllama_so", "--version"], check=True, capture_output=True,
                             text=True).stdout
    assert PIN["commit"][:9] in version


def test_no_upstream_file_is_tracked() -> None:
    tree = REPO / ".upstream" / "llama.cpp"
    if not tree.is_dir():
        pytest.skip("no extracted upstream tree (built from PYLLAMA_SO_UPSTREAM_DIR?)")
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout")
    def digest(path: Path) -> str:
        return hashlib.sha256(path.read_bytes()).hexdigest()

    # compare contents: our files may share a name (CMakeLists.txt) but never the text
    upstream = {digest(p) for p in tree.rglob("*") if p.is_file() and p.stat().st_size > 64}
    copies = [p for p in tracked.stdout.split() if (REPO / p).is_file() and digest(REPO / p) in upstream]
    assert not copies, f"upstream files are tracked: {copies}"


def test_fetch_selects_only_the_needed_parts() -> None:
    pats = PIN["include"]
    assert fetch_upstream.wanted("ggml/src/ggml-cuda/allreduce.cu", pats)
    assert fetch_upstream.wanted("ggml/src/ggml.c", pats)
    assert fetch_upstream.wanted("ggml/src/ggml-rpc/ggml-rpc.cpp", pats)
    assert fetch_upstream.wanted("tools/rpc/rpc-server.cpp", pats)
    assert not fetch_upstream.wanted("ggml/src/ggml-vulkan/ggml-vulkan.cpp", pats)
    assert not fetch_upstream.wanted("ggml/src/ggml-sycl/foo.c", pats)
    # llama-server (-DPYLLAMA_SO_UPSTREAM_SERVER=ON): its sources, mtmd's, the UI's CMake glue; common/ whole
    for rel in ("tools/server/server.cpp", "tools/server/server-http.h", "tools/mtmd/clip.cpp",
                "tools/mtmd/models/qwen3vl.cpp", "tools/mtmd/debug/mtmd-debug.h", "tools/ui/CMakeLists.txt",
                "tools/ui/ui.cpp.in", "scripts/ui-assets.cmake", "common/json-schema-to-grammar.cpp",
                "common/jinja/runtime.cpp", "vendor/cpp-httplib/httplib.cpp"):
        assert fetch_upstream.wanted(rel, pats), rel
    # ... but not the web UI's sources, the tools' tests, docs and media
    for rel in ("tools/ui/src/app.html", "tools/ui/package-lock.json", "tools/server/README.md",
                "tools/server/tests/unit/test_basic.py", "tools/server/bench/bench.py", "tools/mtmd/test-1.jpeg",
                "tools/mtmd/legacy-models/llava_surgery.py", "tools/mtmd/debug/mtmd-debug.cpp"):
        assert not fetch_upstream.wanted(rel, pats), rel


def test_the_extracted_tree_stays_small() -> None:
    """It travels with the working tree to the GPU machines (64 MiB in all): no web UI, media or tests."""
    tree = REPO / ".upstream" / "llama.cpp"
    if not tree.is_dir():
        pytest.skip("no extracted upstream tree (built from PYLLAMA_SO_UPSTREAM_DIR?)")
    size = sum(p.stat().st_size for p in tree.rglob("*") if p.is_file())
    assert size < 32 * 2**20, f"{tree} holds {size / 2**20:.1f} MiB"


def test_fetch_extracts_again_for_another_parts_list(tmp_path: Path) -> None:
    pin = fetch_upstream.load_pin()
    tree = tmp_path / "llama.cpp"
    tree.mkdir()
    assert not fetch_upstream.is_current(tree, pin)
    # a tree without the parts list
    (tree / fetch_upstream.STAMP).write_text(f"{pin['sdist_sha256']} {pin['commit']}\n")
    assert not fetch_upstream.is_current(tree, pin)
    (tree / fetch_upstream.STAMP).write_text(fetch_upstream.stamp_text(pin))
    assert fetch_upstream.is_current(tree, pin)
    assert not fetch_upstream.is_current(tree, {**pin, "include": pin["include"] + ["tools/server"]})


def test_fetch_rejects_a_wrong_checksum(tmp_path: Path) -> None:
    fake = tmp_path / "fake.tar.gz"
    fake.write_bytes(b"not the sdist")
    res = subprocess.run([sys.executable, str(REPO / "scripts" / "fetch-upstream"), "--sdist", str(fake), "--dest",
                          str(tmp_path / "tree")], capture_output=True, text=True)
    assert res.returncode != 0
    assert "sha256 mismatch" in res.stderr
    assert not (tmp_path / "tree").exists()


def test_a_local_tree_is_copied_and_never_modified(tmp_path: Path) -> None:
    src = tmp_path / "checkout"
    for rel, text in {"include/llama.h": "h", "src/a.cpp": "int a;", "tools/server/README.md": "s",
                      ".git/HEAD": "ref"}.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    dest = tmp_path / "build" / "llama.cpp"
    cmd = [sys.executable, str(REPO / "scripts" / "fetch-upstream"), "--from-tree", str(src), "--dest", str(dest)]

    def copy() -> None:
        subprocess.run(cmd, check=True, capture_output=True, text=True)

    copy()
    assert (dest / "src" / "a.cpp").read_text() == "int a;"
    assert not (dest / "tools" / "server").exists() and not (dest / ".git").exists()
    (dest / "src" / "a.cpp").write_text("int a; // patched")  # what the patch applier does to the copy
    copy()
    assert (dest / "src" / "a.cpp").read_text() == "int a; // patched"  # unchanged source: copy kept
    (src / "src" / "a.cpp").write_text("int a2;")  # the user edits the checkout
    (src / "src" / "b.cpp").write_text("int b;")
    (src / "include" / "llama.h").unlink()
    (src / "include" / "llama.h").write_text("h")
    copy()
    assert (dest / "src" / "a.cpp").read_text() == "int a2;"
    assert (dest / "src" / "b.cpp").read_text() == "int b;"
    (src / "src" / "b.cpp").unlink()
    copy()
    assert not (dest / "src" / "b.cpp").exists()
    assert sorted(p.relative_to(src).as_posix() for p in src.rglob("*") if p.is_file()) == \
        [".git/HEAD", "include/llama.h", "src/a.cpp", "tools/server/README.md"]
    inside = subprocess.run(cmd[:-1] + [str(src / "build")], capture_output=True, text=True)
    assert inside.returncode != 0 and "outside the checkout" in inside.stderr


APPLY = """
include("{repo}/cmake/apply-patches.cmake")
pyllama_so_apply_patches("{tree}" "{patches}")
"""


def _apply(tmp_path: Path, tree: Path, patches: Path) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "apply.cmake"
    script.write_text(APPLY.format(repo=REPO, tree=tree, patches=patches))
    return subprocess.run(["cmake", "-P", str(script)], capture_output=True, text=True)


def test_patch_applier_is_idempotent_and_loud(tmp_path: Path) -> None:
    tree = tmp_path / "up" / "tree"
    tree.mkdir(parents=True)
    (tree / "a.c").write_text("int a;\n")
    patches = tmp_path / "patches"
    patches.mkdir()
    (patches / "0001-add-b.patch").write_text(
        "--- a/a.c\n+++ b/a.c\n@@ -1 +1,2 @@\n int a;\n+int b;\n")
    first = _apply(tmp_path, tree, patches)
    assert first.returncode == 0, first.stderr
    assert "0001-add-b.patch: applied" in first.stdout + first.stderr
    second = _apply(tmp_path, tree, patches)
    assert second.returncode == 0
    assert "already applied" in second.stdout + second.stderr
    assert (tree / "a.c").read_text() == "int a;\nint b;\n"
    (patches / "0002-stale.patch").write_text("--- a/a.c\n+++ b/a.c\n@@ -1 +1 @@\n-int zzz;\n+int y;\n")
    third = _apply(tmp_path, tree, patches)
    assert third.returncode != 0
    assert "0002-stale.patch" in third.stderr


def test_patch_applier_skips_a_patch_whose_context_a_later_one_changed(tmp_path: Path) -> None:
    """A patched tree configures again even where a later patch edited the lines around an earlier one (its
    reverse no longer applies on its own); a tree patched with another version of a patch is refused by name."""
    tree = tmp_path / "up" / "tree"
    tree.mkdir(parents=True)
    (tree / "a.c").write_text("int a;\nint z;\n")
    patches = tmp_path / "patches"
    patches.mkdir()
    (patches / "0001-add-b.patch").write_text("--- a/a.c\n+++ b/a.c\n@@ -1,2 +1,3 @@\n int a;\n+int b;\n int z;\n")
    (patches / "0002-add-c.patch").write_text(
        "--- a/a.c\n+++ b/a.c\n@@ -1,3 +1,4 @@\n int a;\n int b;\n+int c;\n int z;\n")
    assert _apply(tmp_path, tree, patches).returncode == 0
    again = _apply(tmp_path, tree, patches)
    assert again.returncode == 0, again.stderr
    assert (again.stdout + again.stderr).count("already applied") == 2
    assert (tree / "a.c").read_text() == "int a;\nint b;\nint c;\nint z;\n"
    (patches / "0002-add-c.patch").write_text(
        "--- a/a.c\n+++ b/a.c\n@@ -1,3 +1,4 @@\n int a;\n int b;\n+int d;\n int z;\n")
    changed = _apply(tmp_path, tree, patches)
    assert changed.returncode != 0
    assert "0002-add-c.patch" in changed.stderr and "fetch-upstream --force" in changed.stderr


def test_version_attribute() -> None:
    """The version is pyproject's, or the marker of a source tree that was never installed."""
    declared = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M).group(1)
    assert pyllama_so.__version__ in (declared, "0+unknown")


def test_shipped_libraries_carry_no_test_fixtures() -> None:
    from pyllama_so import _llama, testing

    pkg = Path(_llama.__file__).parent
    libs = sorted(pkg.glob("lib*.so"))
    assert any(lib.name == "libllama.so" for lib in libs)
    for lib in libs:
        assert b"pyllama_so_arch_" not in lib.read_bytes(), f"{lib.name} carries the arch fixtures"
    fixtures = Path(testing._fixtures.__file__).parent / "libpyllama-so-testing.so"
    assert b"pyllama_so_arch_count" in fixtures.read_bytes()


# what ships is the package's own libraries; beside them, in their own folders, the test harness
# (pyllama_so/testing) and, in CUDA builds, the AllReduce rig of the benchmark (pyllama_so/bench)
HARNESS_BINARIES = ("testing/", "bench/libpyllama-so-allreduce-rig", "bench/_allreduce_rig")
RIG_ENTRIES = (b"pyllama_so_allreduce_run", b"pyllama_so_allreduce_bench")


def _product_binaries() -> list[Path]:
    """Every ELF file (library, extension, executable) the installed package holds outside the harness."""
    from pyllama_so import _llama

    pkg = Path(_llama.__file__).parent
    found = []
    for path in sorted(pkg.rglob("*")):
        rel = path.relative_to(pkg).as_posix()
        if path.is_file() and not rel.startswith(HARNESS_BINARIES) and path.read_bytes()[:4] == b"\x7fELF":
            found.append(path)
    return found


def _names_in(path: Path, names: list[bytes]) -> list[bytes]:
    data = path.read_bytes()
    return [n for n in names if n in data]


def test_shipped_binaries_carry_no_test_switch() -> None:
    """The switches that break product code on purpose are the harness's (testing/test-hooks.cpp): no shipped
    binary names one, nor the AllReduce rig's entries; the product only has its test hooks, which nothing in it
    answers."""
    from pyllama_so import testing

    switches = [name.encode() for name in testing.test_switches()]
    assert set(switches) == {b"GGML_CPU_VIRTUAL_BREAK_EVENT_WAIT", b"GGML_CPU_VIRTUAL_NO_EVENTS",
                             b"GGML_META_LANES_TEST", b"GGML_CUDA_AR_CE_FAIL_ALLOC"}  # as docs/multi-gpu.md lists them
    product = _product_binaries()
    names = {p.name for p in product}
    assert {"libllama.so", "libggml.so", "libggml-base.so"} <= names and any(n.startswith("_llama.") for n in names)
    for path in product:
        assert _names_in(path, switches + list(RIG_ENTRIES)) == [], f"{path.name} carries test-only code"
    # the same scan finds them where they are: a binary naming one would fail above
    harness = Path(testing._fixtures.__file__).parent / "libpyllama-so-testing.so"
    assert _names_in(harness, switches) == switches


def test_the_allreduce_rig_is_its_own_library() -> None:
    """In a CUDA build the benchmark's and tests' AllReduce entries live in libpyllama-so-allreduce-rig, beside
    their bindings, and nowhere else (see the test above); without CUDA there is no rig and it says so."""
    from pyllama_so.bench import allreduce_rig

    cuda = "CUDA" in pyllama_so.build_info()["compiled_backends"]
    assert allreduce_rig.available() == cuda
    if not cuda:
        with pytest.raises(pyllama_so.LlamaError, match="needs the CUDA backend"):
            allreduce_rig.allreduce_bench([1024])
        return
    from pyllama_so.bench import _allreduce_rig

    rig = Path(_allreduce_rig.__file__).parent / "libpyllama-so-allreduce-rig.so"
    assert _names_in(rig, list(RIG_ENTRIES)) == list(RIG_ENTRIES)


def test_the_installed_package_runs_from_the_repository_root() -> None:
    # no source folder in the root may hide the installed package (and its compiled modules)
    out = subprocess.run([sys.executable, "-c", "import pyllama_so._llama, pyllama_so.testing; print('ok')"],
                         cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    assert not (REPO / "pyllama_so").exists()


def test_ci_runs_both_readme_commands_literally() -> None:
    readme = (REPO / "README.md").read_text()
    setup = readme[readme.index("## Set up"):]
    setup = setup[:setup.index("\n## ", 1)]
    commands = re.findall(r"```sh\n(.+?)\n```", setup)
    assert len(commands) == 2, commands  # one installs and runs the main job, one installs and runs the tests
    assert "pyllama_so.bench" in commands[0] and "pytest" in commands[1]
    ci_lines = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    for command in commands:
        assert command in ci_lines, f"{command!r} is not run by .ci/run"


def test_no_negative_index_where_wraparound_is_off() -> None:
    # with wraparound=False a negative index is undefined in Cython: ends[-1] on a one-element numpy
    # array raised "index -2 is out of bounds" under Cython 3.3.0 and numpy 2.5.2, not under 3.3.1 and 2.4.6
    sources = sorted((REPO / "python").rglob("*.pyx")) + sorted((REPO / "python").rglob("*.pxi"))
    assert sources
    for src in sources:
        text = src.read_text()
        if src.suffix == ".pyx" and "wraparound=False" not in text.splitlines()[0] and "wraparound(False)" not in text:
            continue  # .pxi files are always scanned: they hold functions that turn wraparound off
        for n, line in enumerate(text.splitlines(), 1):
            code = line.split("#", 1)[0]
            assert not re.search(r"\[\s*-\s*\d", code), f"{src.name}:{n}: negative index: {line.strip()}"


def test_the_stub_names_every_public_binding() -> None:
    """_llama.pyi (for editors and mypy) declares every name of _llama.__all__ it does not leave to its
    module __getattr__ (embeddings, state, LoRA), and every method of Sampler."""
    import ast

    from pyllama_so import _llama

    tree = ast.parse((REPO / "python" / "pyllama_so" / "_llama.pyi").read_text())
    declared = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    declared |= {t.id for n in tree.body if isinstance(n, ast.AnnAssign) for t in [n.target] if isinstance(t, ast.Name)}
    left_to_getattr = {"embed_sequences", "context_state", "set_context_state", "LoraAdapter", "set_lora_adapters",
                       "max_parallel_sequences", "pooling_type_name", "check_kv_overrides"}
    assert set(_llama.__all__) - declared - left_to_getattr == set()
    sampler = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Sampler")
    methods = {n.name for n in sampler.body if isinstance(n, ast.FunctionDef)}
    public = {m for m in dir(_llama.Sampler) if not m.startswith("_")} - {"model", "params", "seed"}
    assert public <= methods
