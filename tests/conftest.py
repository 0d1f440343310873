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
