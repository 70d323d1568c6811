"""--device and --dtype: the resolve rules, one-line refusals, and a bfloat16 base with float32 LoRA gradients."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gradian.errors import DeviceError, GradianError
from gradian.model.placement import Accelerators, Placement, detect_accelerators, resolve_placement

CPU_ONLY = Accelerators()
A100 = Accelerators(("NVIDIA A100, compute capability 8.0",), (True,))
TWO_A100 = Accelerators(A100.cuda_names * 2, (True, True))
T4 = Accelerators(("Tesla T4, compute capability 7.5",), (False,))
MAC = Accelerators(mps=True)
HAS_CUDA = torch.cuda.is_available()


@pytest.fixture(autouse=True)
def _no_rank(monkeypatch):
    """Resolve as a plain process, not a torchrun rank, unless a test sets LOCAL_RANK."""
    monkeypatch.delenv("LOCAL_RANK", raising=False)


# --- the rules ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("device", "dtype", "machine", "expected"), [
    ("auto", "auto", CPU_ONLY, Placement("cpu", "float32")),
    ("auto", "auto", A100, Placement("cuda:0", "bfloat16")),
    ("auto", "auto", T4, Placement("cuda:0", "float16")),
    ("auto", "auto", MAC, Placement("mps", "float16")),
    ("cuda", "auto", TWO_A100, Placement("cuda:0", "bfloat16")),
    ("cuda:1", "float32", TWO_A100, Placement("cuda:1", "float32")),
    ("cpu", "auto", A100, Placement("cpu", "float32")),
    ("cpu", "bfloat16", CPU_ONLY, Placement("cpu", "bfloat16")),
    ("auto", "float16", T4, Placement("cuda:0", "float16")),
    ("mps", "bfloat16", MAC, Placement("mps", "bfloat16")),
    (" cpu ", "float32", CPU_ONLY, Placement("cpu", "float32")),
])
def test_resolve_rules(device, dtype, machine, expected):
    assert resolve_placement(device, dtype, accelerators=machine) == expected


def test_auto_and_cuda_pick_this_ranks_gpu(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert resolve_placement(accelerators=TWO_A100).device == "cuda:1"
    assert resolve_placement("cuda", accelerators=TWO_A100).device == "cuda:1"
    # A launcher that shows each rank only its own GPU: that GPU is cuda:0 whatever the rank.
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert resolve_placement(accelerators=A100).device == "cuda:0"


def test_auto_on_this_machine_keeps_cpu_float32_without_an_accelerator():
    machine = detect_accelerators()
    if machine.cuda_count or machine.mps:
        pytest.skip("this machine has an accelerator")
    assert resolve_placement() == Placement("cpu", "float32")
    assert resolve_placement().torch_device == torch.device("cpu")
    assert resolve_placement().torch_dtype is torch.float32


def test_placement_parts():
    placement = Placement("cuda:1", "bfloat16")
    assert placement.device_type == "cuda" and placement.torch_device == torch.device("cuda", 1)
    assert placement.torch_dtype is torch.bfloat16
    assert placement.to_dict() == {"device_type": "cuda", "base_dtype": "bfloat16", "lora_dtype": "float32"}


@pytest.mark.parametrize(("device", "dtype", "machine", "needles"), [
    ("gpu0", "auto", CPU_ONLY, ["unknown device 'gpu0'", "cuda:N"]),
    ("cuda:-1", "auto", A100, ["unknown device 'cuda:-1'"]),
    ("cuda", "auto", CPU_ONLY, ["device 'cuda' was asked for but no CUDA GPU is visible", "--device cpu"]),
    ("cuda:2", "auto", TWO_A100, ["device 'cuda:2' does not exist: 2 CUDA device(s) visible (cuda:0..cuda:1)"]),
    ("mps", "auto", CPU_ONLY, ["MPS is not available", "--device cpu"]),
    ("cpu", "fp8", CPU_ONLY, ["unknown dtype 'fp8'", "bfloat16"]),
    ("cpu", "float16", CPU_ONLY, ["float16 is refused on the CPU", "--dtype bfloat16", "float32"]),
    ("auto", "float16", CPU_ONLY, ["float16 is refused on the CPU"]),
    ("cuda", "bfloat16", T4, ["bfloat16 is not supported on cuda:0 (Tesla T4, compute capability 7.5)",
                              "--dtype float16"]),
])
def test_bad_placements_are_one_line_errors_with_a_hint(device, dtype, machine, needles):
    with pytest.raises(DeviceError) as raised:
        resolve_placement(device, dtype, accelerators=machine)
    assert isinstance(raised.value, GradianError) and raised.value.exit_code == 2
    line = raised.value.one_line()
    assert "\n" not in line and "(hint: " in line
    for needle in needles:
        assert needle in line, line


def test_a_rank_past_the_gpus_is_refused(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "5")
    with pytest.raises(DeviceError, match="LOCAL_RANK=5 but only 2 CUDA devices are visible"):
        resolve_placement(accelerators=TWO_A100)


# --- a bfloat16 base: float32 LoRA, float32 gradients close to the float32 base's -----------------


@pytest.fixture(scope="module")
def loaded_pair(tiny_base_dir, tiny_adapter_dir):
    from gradian.model.loaded import LoadedModel

    return (LoadedModel.load(tiny_base_dir, tiny_adapter_dir, device="cpu", dtype="float32"),
            LoadedModel.load(tiny_base_dir, tiny_adapter_dir, device="cpu", dtype="bfloat16"))


def _examples(count: int = 6):
    from gradian.data import Message, make_example

    rows = [(f"What is {i} plus {i}? Explain why.", f"Two times {i} is {2 * i}. The capital of France is Paris.")
            for i in range(count)]
    return [make_example(position, messages=[Message("user", q), Message("assistant", a)])
            for position, (q, a) in enumerate(rows)]


def test_a_bfloat16_base_keeps_lora_in_float32(loaded_pair):
    from gradian.model.lora_blocks import hookable_lora_parameters

    _, half = loaded_pair
    assert half.causal_lm.get_input_embeddings().weight.dtype is torch.bfloat16
    lora = hookable_lora_parameters(half.model, half.adapter_name)
    assert lora and {p.dtype for p in lora} == {torch.float32}
    assert all(p.requires_grad for p in lora)
    assert half.compute() == {"device_type": "cpu", "base_dtype": "bfloat16", "lora_dtype": "float32"}


def test_lora_a_sees_float32_inputs_under_a_bfloat16_base(loaded_pair):
    from gradian.model.lora_blocks import block_modules

    _, half = loaded_pair
    lora_a, _ = block_modules(half.model, half.blocks()[0], half.adapter_name)
    seen = []
    handle = lora_a.register_forward_hook(lambda module, args, output: seen.append(args[0].dtype))
    try:
        with torch.no_grad():
            half.model(input_ids=torch.tensor([[1, 2, 3, 4]]))
    finally:
        handle.remove()
    assert seen == [torch.float32]


def test_bfloat16_gradients_agree_with_float32_and_are_float32(loaded_pair):
    from gradian.config import GradsConfig
    from gradian.data import encode
    from gradian.grads.batch import collate
    from gradian.grads.capture import GradientCapture

    full, half = loaded_pair
    examples = _examples()
    batch = collate([encode(example, full.tokenizer, 128) for example in examples], full.tokenizer.pad_token_id)
    rows32 = GradientCapture.from_config(full, GradsConfig()).capture(batch)
    rows16 = GradientCapture.from_config(half, GradsConfig()).capture(batch)
    assert rows16.dtype is torch.float32 and rows16.shape == rows32.shape
    assert not torch.equal(rows16, rows32)  # the base dtype does change the numbers...
    cosine = torch.nn.functional.cosine_similarity(rows16.double(), rows32.double(), dim=1)
    assert cosine.min().item() > 0.99, cosine  # ...but not the direction


def test_a_bfloat16_index_has_its_own_id_and_records_the_dtype(loaded_pair, tmp_path):
    from gradian.config import load_config
    from gradian.index.build import build_index

    full, half = loaded_pair
    config = load_config(None, ["grads.shard_size=4", "grads.batch_size=3"])
    index32 = build_index(full, _examples(), config, tmp_path / "fp32")
    index16 = build_index(half, _examples(), config, tmp_path / "bf16")
    assert index16.index_id != index32.index_id
    spec32 = json.loads((tmp_path / "fp32" / "manifest.json").read_text())["spec"]
    spec16 = json.loads((tmp_path / "bf16" / "manifest.json").read_text())["spec"]
    assert spec32["compute"] == {"device_type": "cpu", "base_dtype": "float32", "lora_dtype": "float32"}
    assert spec16["compute"] == {"device_type": "cpu", "base_dtype": "bfloat16", "lora_dtype": "float32"}
    rows32, rows16 = index32.rows_between(0, 6), index16.rows_between(0, 6)
    cosine = np.sum(rows32 * rows16, axis=1) / (np.linalg.norm(rows32, axis=1) * np.linalg.norm(rows16, axis=1))
    assert cosine.min() > 0.99


def test_an_index_of_another_dtype_is_refused_naming_the_dtype(loaded_pair, tmp_path):
    from gradian.config import load_config
    from gradian.errors import GradientIndexError
    from gradian.index.build import build_index
    from gradian.pipelines.attribute import check_index_dir_matches

    full, half = loaded_pair
    config = load_config(None, ["grads.shard_size=4", "grads.batch_size=3"])
    build_index(full, _examples(), config, tmp_path / "fp32")
    with pytest.raises(GradientIndexError, match="another device or base dtype"):
        check_index_dir_matches(tmp_path / "fp32", half, _examples(), config)


def test_lora_weights_of_another_dtype_are_made_float32(chatml_tokenizer):
    from gradian.model.loaded import lora_to_float32
    from gradian.model.lora_blocks import hookable_lora_parameters
    from tests.support.tiny import tiny_llama, tiny_lora

    model = tiny_lora(tiny_llama(chatml_tokenizer), r=2)
    for name, module in model.named_modules():
        if name.endswith((".lora_A.default", ".lora_B.default")):
            module.to(torch.bfloat16)  # as an adapter loaded without peft's autocast would be
    assert {p.dtype for p in hookable_lora_parameters(model, "default")} == {torch.bfloat16}
    lora_to_float32(model, "default")
    assert {p.dtype for p in hookable_lora_parameters(model, "default")} == {torch.float32}


# --- on a CUDA GPU ----------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_auto_on_a_gpu_gives_half_precision_base_and_float32_gradients(loaded_pair, tiny_base_dir, tiny_adapter_dir):
    from gradian.config import GradsConfig
    from gradian.data import encode
    from gradian.grads.batch import collate
    from gradian.grads.capture import GradientCapture
    from gradian.model.loaded import LoadedModel

    placement = resolve_placement()
    assert placement.device_type == "cuda"
    assert placement.dtype == ("bfloat16" if torch.cuda.is_bf16_supported(including_emulation=False) else "float16")
    gpu = LoadedModel.load(tiny_base_dir, tiny_adapter_dir)
    assert gpu.compute() == {"device_type": "cuda", "base_dtype": placement.dtype, "lora_dtype": "float32"}
    full = loaded_pair[0]
    batch = collate([encode(example, full.tokenizer, 128) for example in _examples()], full.tokenizer.pad_token_id)
    rows_gpu = GradientCapture.from_config(gpu, GradsConfig()).capture(batch)
    rows_cpu = GradientCapture.from_config(full, GradsConfig()).capture(batch)
    assert rows_gpu.dtype is torch.float32
    assert torch.nn.functional.cosine_similarity(rows_gpu.double(), rows_cpu.double(), dim=1).min().item() > 0.99

