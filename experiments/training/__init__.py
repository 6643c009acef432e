"""What a model trains on and how: the training loop (train.py), the curriculum's stages
(curriculum.py), what `dtype` means for training (precision.py), the bar over a job's steps
(progress.py) and the tasks (tasks/)."""
