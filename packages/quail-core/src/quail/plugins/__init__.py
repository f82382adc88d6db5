"""Extension points: the hook specifications, the registry, and entry-point loading."""
