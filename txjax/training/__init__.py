"""The training wing."""
