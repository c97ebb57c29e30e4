"""The registered components, one module each: its events' entries, its own checks, its value."""
