"""mkdocs hooks (mkdocs.yml ``hooks:``): fence options the docs tests read are not Markdown, and the notebooks'
links to the docs are written for Jupyter.

``tests/test_docs.py`` marks a code block that needs a real checkpoint as ```` ```python no-run ````; Markdown
renderers take the whole info string as the language and would not highlight it, so the site drops the
option before rendering.

A notebook links a page as ``../docs/results/toy-a.md``: right where it is opened (``notebooks/``), wrong on the
site, which renders it from ``docs/notebooks/`` and serves pages, not ``.md`` files. ``on_page_content`` rewrites
each such link of a notebook page to the site URL of that page; a link to a page the site lacks is a warning, so
``mkdocs build --strict`` fails on it (tests/test_docs.py checks the links on disk).
"""

from __future__ import annotations

import logging
import re
from typing import Any, Callable

FENCE_OPTION = re.compile(r"^(?P<head>[ \t]*(?:`{3,}|~{3,})python)[ \t]+no-run[ \t]*$", re.MULTILINE)
NOTEBOOK_DOC_LINK = re.compile(r'href="\.\./docs/(?P<page>[^"#]+\.md)(?P<anchor>#[^"]*)?"')
log = logging.getLogger("mkdocs.hooks")


def on_page_markdown(markdown: str, **_: Any) -> str:
    return FENCE_OPTION.sub(r"\g<head>", markdown)


def rewrite_notebook_links(html: str, url_of: Callable[[str], str | None]) -> tuple[str, list[str]]:
    """``html`` with each ``../docs/PAGE.md[#anchor]`` link replaced by ``url_of(PAGE.md)`` (None: the site has no
    such page; the link is left as it is and named in the returned list)."""
    missing: list[str] = []

    def replace(match: re.Match[str]) -> str:
        url = url_of(match.group("page"))
        if url is None:
            missing.append(match.group("page"))
            return match.group(0)
        return f'href="{url}{match.group("anchor") or ""}"'

    return NOTEBOOK_DOC_LINK.sub(replace, html), missing


def on_page_content(html: str, page: Any, files: Any, **_: Any) -> str:
    if not page.file.src_uri.endswith(".ipynb"):
        return html
    from mkdocs.utils import get_relative_url

    def url_of(src: str) -> str | None:
        target = files.get_file_from_path(src)
        return None if target is None else get_relative_url(target.url, page.url)

    html, missing = rewrite_notebook_links(html, url_of)
    for src in missing:
        log.warning(f"notebook {page.file.src_uri} links ../docs/{src}, which is not a page of the site")
    return html
