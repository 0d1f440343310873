"""The documentation's links: a relative link in a Markdown file names a file of the checkout,
resolved from the file that holds it (as GitHub and Galaxy render it)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
MARKDOWN = subprocess.run(
    ["git", "ls-files", "--", "*.md"], cwd=REPO, text=True, capture_output=True, check=True
).stdout.split()
# [text](target) and ![alt](target); a target with a scheme (https:, mailto:) or only an anchor
# points outside the checkout.
LINK = re.compile(r"\]\((?!#)(?![a-z][a-z0-9+.-]*:)([^)\s#]+)(?:#[^)\s]*)?\)")


def relative_links(text: str) -> list[str]:
    return LINK.findall(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "see [the lab](docs/lab.md) and ![figure](bench-lab/bench.png)",
            ["docs/lab.md", "bench-lab/bench.png"],
        ),
        ("[a section](failure-handling.md#a-hang) of it", ["failure-handling.md"]),
        ("[vLLM](https://docs.vllm.ai/) and [here](#quick-start) and [mail](mailto:x@example.org)", []),
    ],
)
def test_relative_links_are_found_and_others_left_alone(text, expected):
    assert relative_links(text) == expected


def test_the_checkout_has_markdown_to_check():
    assert {"README.md", "docs/lab.md"} <= set(MARKDOWN)


@pytest.mark.parametrize("document", MARKDOWN)
def test_every_relative_link_names_a_file_of_the_checkout(document):
    source = REPO / document
    missing = [
        target for target in relative_links(source.read_text()) if not (source.parent / target).exists()
    ]
    assert missing == [], f"{document} links to files that do not exist next to it: {missing}"
