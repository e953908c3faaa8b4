"""The architecture as data and the one builder for both Keras worlds."""
