"""Ascend kernel choices (CANN through torch_npu). torch_npu is imported only when a kernel runs."""
