"""``python -m deploy`` runs the ``fedstream`` CLI."""

from deploy.cli import main

main()
