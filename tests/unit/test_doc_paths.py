"""Every file the docs name exists: README.md and docs/**/*.md, their links (relative to the page) and the paths
they mention in the text (relative to the repository root, like `cupy_dash/core/api.py`). CPU only."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
EXTENSIONS = ("py", "pyx", "pxd", "pxi", "c", "h", "cu", "cuh", "md", "json", "png", "csv", "txt", "sh", "toml",
              "cfg", "in", "patch", "gz")
# a path with at least one folder: name/name.ext; a trailing slash names a folder
MENTION = re.compile(r"(?<![\w./-])((?:\.\.?/)*[\w.-]+(?:/[\w.-]+)*/(?:[\w.-]+\.(?:%s)|[\w.-]+/))(?![\w/{*])"
                     % "|".join(EXTENSIONS))
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")


def _mentions(text: str) -> set:
    found = set(MENTION.findall(re.sub(r"\]\([^)]*\)", "]", text)))      # link targets are checked as links
    return {m for m in found if not m.startswith("/")}


def _links(text: str) -> set:
    return {t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)}


def _inside(path: Path) -> bool:
    return path.resolve().is_relative_to(ROOT)


def _missing(page: Path) -> list:
    text = page.read_text()
    missing = []
    for target in _links(text):
        if not (page.parent / target).exists():
            missing.append(f"link {target}")
    for mention in _mentions(text):
        candidates = [ROOT / mention, page.parent / mention]
        if not any(_inside(c) for c in candidates):
            continue                                    # outside the repository (the project's shared notes)
        if not any(c.exists() for c in candidates):
            missing.append(mention)
    return sorted(missing)


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_named_files_exist(page):
    assert not _missing(page), f"{page.relative_to(ROOT)} names files that do not exist: {_missing(page)}"


def test_the_scan_finds_paths_and_links(tmp_path):
    text = ("See `cupy_dash/core/api.py`, kernels_src/bwd/fold.cuh and benchmarks/results/ (a folder), "
            "[a page](docs/schedules.md#what-auto-means), [web](https://example.com/a/b.md), "
            "`cupy_dash/_compact*.pyx`, bench_20261201-042619.{md,json} and /root/out/x.json.")
    assert _mentions(text) == {"cupy_dash/core/api.py", "kernels_src/bwd/fold.cuh", "benchmarks/results/"}
    assert _links(text) == {"docs/schedules.md"}
    page = tmp_path / "page.md"
    page.write_text("`cupy_dash/no_such_module.py` and [gone](no_such_page.md)")
    assert _missing(page) == ["cupy_dash/no_such_module.py", "link no_such_page.md"]
