"""Make this checkout importable as ``ansible_collections.sparkserve.dsv41``.

``collections/ansible_collections/sparkserve/dsv41`` is a link to the repository root, so
the modules are imported exactly as Ansible imports them from an installed collection.
"""

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
COLLECTIONS = REPO_ROOT / "collections"
if str(COLLECTIONS) not in sys.path:
    sys.path.insert(0, str(COLLECTIONS))


import pytest  # noqa: E402 - after the path set-up above


@pytest.fixture
def proxy_that_answers_nothing(monkeypatch):
    """A proxy in the environment, as on a host behind one, that takes no connection: a client that
    honoured it would fail (and would have sent it the API key)."""
    proxy = "http://127.0.0.1:9"  # discard port: nothing listens
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, proxy)
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    return proxy
