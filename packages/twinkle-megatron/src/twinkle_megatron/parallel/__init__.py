"""DeviceMesh -> megatron-core parallel sizes and process groups."""
