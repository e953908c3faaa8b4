"""Images in, TFRecords out, tf.data pipelines for every later stage."""
