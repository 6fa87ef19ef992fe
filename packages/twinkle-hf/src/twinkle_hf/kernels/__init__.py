"""twinkle-hf kernels: liger-kernel choices (cuda) and the fused linear cross-entropy loss.

Nothing here imports liger-kernel at import time; it is imported when a liger choice is applied.
"""
