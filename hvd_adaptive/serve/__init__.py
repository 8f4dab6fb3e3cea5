"""Using a trained run: its folder and checkpoints read back (runmodel.py), predictions and
evaluation on new data (predict.py), and the model exported as a SavedModel (export.py)."""
