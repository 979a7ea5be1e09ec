"""Data made here for judging trained models: :mod:`.synthetic`, a deterministic detection dataset
with exact boxes, masks and keypoints (nothing can be downloaded, so the accuracy of reduced
precision is measured on a detector trained on it, :mod:`.reference`)."""
