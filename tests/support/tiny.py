"""Tiny models and tokenizers built in code, so no test downloads anything."""

from __future__ import annotations

from pathlib import Path

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

LLAMA3_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

CORPUS = [
    "The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is Madrid.",
    "What is two plus two? Two plus two is four. Seven times six is forty-two. 0 1 2 3 4 5 6 7 8 9",
    "Rewrite this sentence politely, please. Explain why the sky is blue in one short sentence.",
    "user assistant system Hello! How are you? I am fine, thank you. Yes. No. Maybe.",
    "Berlin Germany London England Tokyo Japan Ottawa Canada Lisbon Portugal Vienna Austria",
    "### Instruction: ### Response: [INST] [/INST] <s> </s> the a an of in on to and or is are was",
]

TEMPLATES = {"chatml": CHATML_TEMPLATE, "llama3": LLAMA3_TEMPLATE, None: None}


def tiny_tokenizer(template: str | None = "chatml", vocab_size: int = 384):
    """A byte-level BPE tokenizer trained on a fixed corpus, with one of three chat templates."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if template == "chatml":
        specials = {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
        extra = ["<|im_start|>"]
    elif template == "llama3":
        specials = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "pad_token": "<|finetune_pad|>"}
        extra = ["<|start_header_id|>", "<|end_header_id|>", "<|end_of_text|>"]
    elif template is None:
        specials = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}
        extra = []
    else:
        raise ValueError(f"unknown template {template!r}")
    special_tokens = [t for t in specials.values() if t] + extra
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    kwargs = {k: v for k, v in specials.items() if v}
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, additional_special_tokens=extra, **kwargs)
    if TEMPLATES[template] is not None:
        fast.chat_template = TEMPLATES[template]
    return fast


def tiny_llama(tokenizer, *, seed: int = 0, hidden: int = 32, layers: int = 2, heads: int = 4, kv_heads: int = 2):
    """A randomly initialised LlamaForCausalLM sized for the tokenizer, in fp32 eval mode."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    model.eval()
    return model


def tiny_lora(model, *, r: int = 4, alpha: float = 8.0, targets=("q_proj", "v_proj", "down_proj"),
              use_rslora: bool = False, dropout: float = 0.0, seed: int = 0):
    """Wrap a model in a peft LoRA adapter whose B matrices are random (so gradients of A are non-zero)."""
    import torch
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=r, lora_alpha=alpha, target_modules=list(targets), lora_dropout=dropout,
                        use_rslora=use_rslora, task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
    peft_model.eval()
    return peft_model


def save_tiny_base(directory: Path, template: str | None = "chatml", seed: int = 0) -> Path:
    """Write a tiny Llama base model and its tokenizer to a directory usable as --base-model."""
    tokenizer = tiny_tokenizer(template)
    model = tiny_llama(tokenizer, seed=seed)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    return directory


def save_tiny_adapter(base_dir: Path, adapter_dir: Path, **lora_kwargs) -> Path:
    """Write a LoRA adapter (random B) for a tiny base model saved with save_tiny_base."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_dir)
    peft_model = tiny_lora(model, **lora_kwargs)
    peft_model.save_pretrained(adapter_dir, safe_serialization=True)
    return adapter_dir


def save_tiny_base_in_hub_cache(cache: Path, repo_id: str = "tiny-org/tiny-base") -> Path:
    """A tiny base laid out as the Hugging Face cache holds a downloaded repo (a snapshot and refs/main)."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    save_tiny_base(repo / "snapshots" / "0123abcd")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    return repo


def write_four_chat_rows(path: Path) -> Path:
    """Four one-turn chat rows: enough for a training job of one step."""
    import json

    rows = [{"messages": [{"role": "user", "content": f"What is {n}?"}, {"role": "assistant", "content": f"It is {n}."}]}
            for n in ("one", "two", "three", "four")]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path
