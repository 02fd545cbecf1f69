"""The dispatch table: schema, validation, run directories, assembling and loading tables."""
