"""The agent loop and the tool framework below it
(docs/design.md, "The agent loop and models")."""
