"""The model implementations and what loads them: the architectures the engine runs
(registry.py: Llama, Mistral, Qwen2, Qwen3, Gemma 3 and 4, Qwen3-MoE, gpt-oss, Qwen3.5 and
Qwen3.5-MoE, text models), their configs, the layers they share, and the safetensors and GGUF
weight loaders."""
