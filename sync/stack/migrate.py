"""Apply the Alembic migrations in migrations/ to the source database."""

from __future__ import annotations

from alembic import command
from alembic.config import Config

from sync.config import ROOT, Settings, sqlalchemy_url
from sync.errors import StackError


def upgrade(settings: Settings) -> None:
    config = Config()
    config.set_main_option("script_location", str(ROOT / "migrations"))
    config.set_main_option("sqlalchemy.url", sqlalchemy_url(settings.pg_dsn).replace("%", "%%"))
    try:
        command.upgrade(config, "head")
    except RuntimeError as refused:  # a migration's own check, worded for the user
        raise StackError(f"migrations refused: {refused}") from None
