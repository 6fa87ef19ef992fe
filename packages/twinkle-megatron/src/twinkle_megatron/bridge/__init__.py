"""HF <-> megatron-core mappings for Qwen2/Qwen2.5, Qwen3, Llama, Mistral and Qwen3-MoE (see docs/megatron.md)."""
