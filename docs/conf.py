"""Sphinx configuration for the splice documentation."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

import splice  # noqa: E402  (from src/, put first on the path above)

project = "splice"
author = "splice developers"
copyright = "2026, splice developers"
release = splice.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "matplotlib.sphinxext.plot_directive",
    "myst_parser",
    "sphinx_gallery.gen_gallery",
]

html_theme = "furo"
html_title = "splice"
html_static_path = ["_static"]
html_css_files = ["custom.css"]
templates_path: list[str] = []
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "tutorials/*.ipynb"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}

autodoc_default_options = {"show-inheritance": True}
autodoc_typehints = "description"
autodoc_member_order = "bysource"
autosummary_generate = True
napoleon_google_docstring = True
napoleon_numpy_docstring = False
myst_heading_anchors = 3

nitpicky = False

plot_include_source = False
plot_html_show_source_link = False
plot_html_show_formats = False
plot_formats = [("png", 110)]

sphinx_gallery_conf = {
    "examples_dirs": str(ROOT / "tutorials"),
    "gallery_dirs": "tutorials",
    "filename_pattern": r"/tutorial_",
    "within_subsection_order": "FileNameSortKey",
    "download_all_examples": False,
    "remove_config_comments": True,
    "abort_on_example_error": True,
    "show_memory": False,
    "matplotlib_animations": False,
    # Always execute: the output depends on the budget and on splice, not only on the script.
    "run_stale_examples": True,
}

# Tutorials run at a small budget in CI (SPLICE_DOCS_BUDGET=small) and at full size otherwise.
os.environ.setdefault("SPLICE_DOCS_BUDGET", "full")
