"""`tandem-agent --name NODE [...]` (or `python -m controlplane.agent`): the node agent, as `manage.py tandem_agent`
runs it, for a host where the project is installed rather than checked out."""
from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(["tandem-agent", "tandem_agent", *(sys.argv[1:] if argv is None else argv)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
