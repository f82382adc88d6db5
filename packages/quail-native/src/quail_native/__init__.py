"""quail-native: Quail's own executor."""
