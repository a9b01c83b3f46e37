"""Hostile inputs for planc: checkpoints and specs that must end in a named, typed error."""
