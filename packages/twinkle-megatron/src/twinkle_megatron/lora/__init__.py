"""LoRA on megatron-core's parallel linear layers, saved as PEFT adapters."""
