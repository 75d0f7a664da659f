"""Evaluation: classification accuracy (accuracy.py: top-1/top-5, per class, confusion matrix)
and the paper's few-shot linear evaluation. Never imports vitlab.train."""
