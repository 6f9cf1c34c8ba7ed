"""The error a bad user-supplied value raises, shared by the config, the method registry and every front end.
Its own module so that both `config` and `methods` can raise it without importing each other."""
from __future__ import annotations


class ConfigError(ValueError):
    """A bad user-supplied value; its message is one line naming the value and what is accepted."""
