"""Alembic environment: runs the migrations online against the source database.

The URL comes from sync.migrate (built from LAKESYNC_PG_DSN, password from PGPASSFILE).
"""

from alembic import context
from sqlalchemy import create_engine, text

from sync.config import CONTROL_SCHEMA

url = context.config.get_main_option("sqlalchemy.url")
engine = create_engine(url)
with engine.connect() as connection:
    # Alembic's bookkeeping table lives in our control schema, not in the captured one,
    # so it never gets a mirror.
    connection.execute(text(f"CREATE SCHEMA IF NOT EXISTS {CONTROL_SCHEMA}"))
    connection.commit()
    context.configure(connection=connection, transactional_ddl=True, version_table_schema=CONTROL_SCHEMA)
    with context.begin_transaction():
        context.run_migrations()
engine.dispose()
