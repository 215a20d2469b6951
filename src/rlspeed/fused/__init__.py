"""Hand-derived update steps: the same updates as the algorithms' autograd `_loss`, with the gradients written out
for rlspeed's default MLP networks and Adam on one flat buffer (`flat.py`). They are alternatives to the autograd
reference, chosen in one place (`rlspeed.algos.update.select_update`) and tested equal to it step by step."""
