"""Bring a database to the newest schema (or back): `python -m relay_api.migrate [upgrade|downgrade REV]`.

docker-compose's one-shot `migrate` service and the embedded server run this; tests call
`upgrade`/`downgrade` with their own database URL.
"""

from __future__ import annotations

import sys
from pathlib import Path

from alembic import command
from alembic.config import Config

from relay_api.settings import get_settings

# alembic.ini sits at the repository root, beside migrations/ (the service runs from a checkout).
ALEMBIC_INI = Path(__file__).resolve().parents[2] / "alembic.ini"


def alembic_config(database_url: str, quiet: bool = True) -> Config:
    if not ALEMBIC_INI.is_file():
        raise RuntimeError(f"{ALEMBIC_INI} is missing: run the service from a Relay source checkout")
    config = Config(str(ALEMBIC_INI))
    config.attributes["database_url"] = database_url
    config.attributes["quiet"] = quiet
    return config


def upgrade(database_url: str, revision: str = "head", quiet: bool = True) -> None:
    command.upgrade(alembic_config(database_url, quiet), revision)


def downgrade(database_url: str, revision: str = "base", quiet: bool = True) -> None:
    command.downgrade(alembic_config(database_url, quiet), revision)


def main(argv: list[str]) -> None:
    settings = get_settings()
    if settings.uses_sqlite:
        settings.home.mkdir(parents=True, exist_ok=True)
    action = argv[0] if argv else "upgrade"
    if action == "upgrade":
        upgrade(settings.database_url, argv[1] if len(argv) > 1 else "head", quiet=False)
    elif action == "downgrade":
        downgrade(settings.database_url, argv[1] if len(argv) > 1 else "base", quiet=False)
    else:
        sys.exit("usage: python -m relay_api.migrate [upgrade [REV] | downgrade [REV]]")


if __name__ == "__main__":
    main(sys.argv[1:])
