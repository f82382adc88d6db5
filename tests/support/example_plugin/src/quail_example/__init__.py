"""A third-party Quail backend used by the test-suite."""
