"""Beyond one process: compute providers carry a query's model work across a boundary as data."""
