"""The worker side: engines booted and kept, the answer store in front of them, the node runner."""
