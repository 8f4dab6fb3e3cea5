"""TensorBoard event files read back, as TensorBoard reads them."""


def read_events(folder):
    """{tag: [(step, value), ...]} from every events file in `folder`."""
    import tensorflow as tf

    out = {}
    files = sorted(folder.glob("events.out.tfevents.*"))
    for path in files:
        for raw in tf.data.TFRecordDataset(str(path)):
            event = tf.compat.v1.Event.FromString(raw.numpy())
            for v in event.summary.value:
                assert v.metadata.plugin_data.plugin_name == "scalars", v.tag  # TensorBoard's kind
                out.setdefault(v.tag, []).append((event.step, float(tf.make_ndarray(v.tensor))))
    return files, out
