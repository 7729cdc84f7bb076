"""CLI command modules; each defines ``register(cli: click.Group) -> None``."""
