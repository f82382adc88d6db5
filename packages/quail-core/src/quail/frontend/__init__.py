"""Front ends: SQL (sqlglot) and the Python builder both produce a QuerySpec, compiled once."""
