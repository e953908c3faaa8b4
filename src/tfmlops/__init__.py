"""tfmlops: from a folder of images to a fast, small, reproducible TensorFlow model in production."""

__version__ = "0.1.0"
