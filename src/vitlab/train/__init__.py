"""Training: one loop (loop.py) for every objective (objectives.py), the paper's optimisers and
schedules (optim.py), checkpoints of the training state without pickle (state.py), the
fine-tuning protocol of Table 4 (finetune.py), all distribution knowledge (distributed.py)
and what a run reports (report.py).

    from vitlab.config import load_recipe
    from vitlab.train.inputs import Inputs
    from vitlab.train.loop import Trainer
    summary = Trainer(load_recipe("digits"), "runs/digits", Inputs()).run()
"""
