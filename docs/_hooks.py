"""mkdocs hooks (mkdocs.yml ``hooks:``): fence options the docs tests read are not Markdown.

``tests/test_docs.py`` marks a code block that needs a real checkpoint as ```` ```python no-run ````; Markdown
renderers take the whole info string as the language and would not highlight it, so the site drops the
option before rendering.
"""

from __future__ import annotations

import re
from typing import Any

FENCE_OPTION = re.compile(r"^(?P<head>[ \t]*(?:`{3,}|~{3,})python)[ \t]+no-run[ \t]*$", re.MULTILINE)


def on_page_markdown(markdown: str, **_: Any) -> str:
    return FENCE_OPTION.sub(r"\g<head>", markdown)
