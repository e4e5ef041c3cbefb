"""The agent loop and the tool framework below it (SPEC 5.2)."""
