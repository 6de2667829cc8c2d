"""Bad input raises a ValueError/TypeError naming the argument, what was expected and what came.
These run on CPU tensors: every check except the device one comes before any GPU is touched."""

import numpy as np
import pytest
import torch

import tileattn
from tileattn import flash_attn_func, scaled_dot_product_attention


def qkv(B=2, N=16, H=4, D=64, dtype=torch.float32, Nk=None, H_kv=None):
    q = torch.randn(B, N, H, D, dtype=dtype)
    k = torch.randn(B, Nk or N, H_kv or H, D, dtype=dtype)
    return q, k, torch.randn_like(k)


@pytest.mark.parametrize("fn", [flash_attn_func, scaled_dot_product_attention])
def test_cpu_tensor_names_device(fn):
    with pytest.raises(ValueError, match=r"q must be a CUDA tensor, got device 'cpu'"):
        fn(*qkv())


def test_not_a_tensor():
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"k must be a torch.Tensor, got ndarray"):
        flash_attn_func(q, k.numpy(), v)


def test_rank():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"v must have 4 dims, got 3 \(shape \(2, 16, 64\)\)"):
        flash_attn_func(q, k, v[:, :, 0])


def test_dtype_unsupported_and_mixed():
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"q has dtype torch.float64; supported: torch.float32, torch.float16"):
        flash_attn_func(q.double(), k.double(), v.double())
    with pytest.raises(TypeError, match=r"k must have q's dtype torch.float32, got torch.float16"):
        flash_attn_func(q, k.half(), v)


def test_head_dim_lists_supported():
    with pytest.raises(ValueError, match=r"head dim 48 is not supported for torch.float32; supported: \[32, 64, 128\]"):
        flash_attn_func(*qkv(D=48))


def test_mismatched_shapes_in_the_callers_layout():
    q, k, v = qkv(B=1, N=16, H=2)
    # flash_attn_func's (B, N, H, D): v with 17 keys against k's 16.
    with pytest.raises(
        ValueError, match=r"v must have k's shape \(1, 16, 2, 64\), got \(1, 17, 2, 64\) \(B, N, H, D\)"
    ):
        flash_attn_func(q, k, torch.randn(1, 17, 2, 64))
    # SDPA's (B, H, N, D): the same mistake, shown in that layout.
    qt, kt = q.transpose(1, 2), k.transpose(1, 2)
    with pytest.raises(
        ValueError, match=r"v must have k's shape \(1, 2, 16, 64\), got \(1, 2, 17, 64\) \(B, H, N, D\)"
    ):
        scaled_dot_product_attention(qt, kt, torch.randn(1, 2, 17, 64))
    q, k, v = qkv()
    with pytest.raises(
        ValueError, match=r"k must have q's batch size B=2, got 1: q \(2, 16, 4, 64\), k \(1, 16, 4, 64\)"
    ):
        flash_attn_func(q, k[:1], v[:1])
    with pytest.raises(ValueError, match=r"number of heads H=4 must be a multiple of k/v's, got 3"):
        flash_attn_func(*qkv(H=4, H_kv=3))


def test_head_dim_mismatch_names_q_and_k():
    q, k, v = qkv()
    # k's head dim differs from q's (v agrees with q): the message is about q and k, not k and v.
    with pytest.raises(
        ValueError, match=r"k must have q's head dim D=64, got 32: q \(2, 16, 4, 64\), k \(2, 16, 4, 32\)"
    ):
        flash_attn_func(q, k[..., :32], v)
    with pytest.raises(ValueError, match=r"v must have q's head dim D=64, got 32"):
        flash_attn_func(q, k, v[..., :32])


def test_strided_last_dim():
    q = torch.randn(2, 16, 4, 128)[..., ::2]
    _, k, v = qkv()
    with pytest.raises(ValueError, match=r"q must have a contiguous last \(head\) dim, stride 1; got stride 2"):
        flash_attn_func(q, k, v)


def test_unknown_version_lists_known():
    with pytest.raises(ValueError, match=r"unknown version 'v9'; known: \['v1', "):
        flash_attn_func(*qkv(), version="v9")


def test_causal_values():
    with pytest.raises(ValueError, match=r"causal must be a bool or one of \('top_left', 'bottom_right'\), got 'diag'"):
        flash_attn_func(*qkv(), causal="diag")
    with pytest.raises(ValueError, match=r"is_causal must be a bool"):
        scaled_dot_product_attention(*qkv(), is_causal="lower")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), 1e300, -1e39])
def test_softmax_scale_must_be_finite_in_float32(bad):
    with pytest.raises(ValueError, match=r"softmax_scale must be finite as a float32"):
        flash_attn_func(*qkv(), softmax_scale=bad)
    with pytest.raises(ValueError, match=r"scale must be finite as a float32"):
        scaled_dot_product_attention(*qkv(), scale=bad)


@pytest.mark.parametrize("bad", [True, False, "0.5", torch.tensor(0.5), 1j])
def test_softmax_scale_type(bad):
    with pytest.raises(TypeError, match=r"softmax_scale must be a real number or None, got"):
        flash_attn_func(*qkv(), softmax_scale=bad)


def test_scale_edge_values_pass_validation():
    # Large but finite in float32, zero, negative: validation passes and reaches the device check.
    for ok in (3e38, 0, -2.5, np.float32(0.1), 7):
        with pytest.raises(ValueError, match=r"q must be a CUDA tensor"):
            flash_attn_func(*qkv(), softmax_scale=ok)


def test_lengths_of_2_to_the_31_are_rejected():
    # Meta tensors: the shapes exist, no memory does; the length check comes before the device check.
    q = torch.empty(1, 2**31, 1, 64, device="meta")
    small = torch.empty(1, 16, 1, 64, device="meta")
    with pytest.raises(ValueError, match=r"q's sequence length must be below 2\^31, got 2147483648"):
        flash_attn_func(q, small, small)
    with pytest.raises(
        ValueError, match=r"k's sequence length must be below 2\^31, got 2147483648: k \(1, 2147483648, 1, 64\)"
    ):
        flash_attn_func(small, q, q)


def test_requires_grad_without_a_backward_rung_raises_and_says_how_to_call():
    # bf16 at head dim 88: the forward takes it, no backward rung does (backward_head_dims).
    q, k, v = qkv(D=88, dtype=torch.bfloat16)
    q.requires_grad_(True)
    with pytest.raises(
        RuntimeError,
        match=r"no backward pass for bfloat16 at head dim 88 \(it has one at head dims 16, 32, 48, 64, 80, 96, "
        r"112, 128, 160, 192, 224, 256\), "
        r"but q requires grad.*torch.no_grad\(\)",
    ):
        flash_attn_func(q, k, v)
    k.requires_grad_(True)
    with pytest.raises(RuntimeError, match=r"but q, k require grad"):
        scaled_dot_product_attention(q, k, v)
    # At a head dim with a backward rung, the call goes on: here to the device check.
    with pytest.raises(ValueError, match=r"q must be a CUDA tensor"):
        flash_attn_func(*(t.requires_grad_(True) for t in qkv()))
    # Under no_grad (or with detached inputs) the call goes on: here to the device check.
    with torch.no_grad(), pytest.raises(ValueError, match=r"q must be a CUDA tensor"):
        flash_attn_func(q, k, v)
    with torch.inference_mode(), pytest.raises(ValueError, match=r"q must be a CUDA tensor"):
        flash_attn_func(q, k, v)
    with pytest.raises(ValueError, match=r"q must be a CUDA tensor"):
        flash_attn_func(q.detach(), k.detach(), v)


def test_registry_is_public_and_consistent():
    assert list(tileattn.VERSIONS)[:4] == ["v1", "v1_br48", "v1.1", "v2"]
    for v in tileattn.VERSIONS.values():
        assert (tileattn.api._nvrtc.CSRC / v.file).exists()
        for over in v.arch_tiles.values():
            assert set(over) <= set(v.tiles), "an arch tile for a head dim the rung does not take"


def test_check_cases_take_each_rungs_own_head_dims_and_dtypes():
    """`python -m tileattn check`'s cases stay within what each rung takes: its fixed awkward cases
    once ran D=64 on v3.6_wide (D=128 only), which refused them with its ValueError on the GPU."""
    from tileattn.testing import check_cases

    for case in check_cases(tileattn.VERSIONS):
        entry = tileattn.VERSIONS[case.version]
        assert case.D in entry.head_dims and case.dtype in entry.dtypes, case


def test_precision_values():
    with pytest.raises(ValueError, match=r"precision must be None, 'fp32' or 'tf32', got 'fp16'"):
        flash_attn_func(*qkv(), precision="fp16")
    with pytest.raises(ValueError, match=r"version 'v2.2_tf32' computes with TF32 products .* pass precision='tf32'"):
        flash_attn_func(*qkv(), version="v2.2_tf32")
    with pytest.raises(ValueError, match=r"version 'v2' computes at FP32 precision"):
        flash_attn_func(*qkv(), version="v2", precision="tf32")


def test_default_dispatch_never_picks_tf32():
    from tileattn.versions import select

    for D in (32, 64, 128):
        assert select("float32", D, 90).precision == "fp32"
        assert select("float32", D, 90, "tf32").precision == "tf32"


def test_fp32_dispatch_by_arch():
    from tileattn.versions import select

    for D in (32, 64, 128):  # wgmma (sm_90a) where there is one, mma.sync elsewhere
        # 3xFP16 (v2.5, Q split in the CTA) at the head dims it has, 3xTF32 (v2.3) at D=32; TF32
        # alone is v2.3_tf32.
        assert select("float32", D, 90).name == ("v2.3" if D == 32 else "v2.5")
        assert select("float32", D, 90, "tf32").name == "v2.3_tf32"
        assert select("float32", D, 80).name == "v2.2" and select("float32", D, 89, "tf32").name == "v2.2_tf32"
        # wgmma is sm_90a only: a newer arch (sm_100) takes the mma.sync rung instead.
        assert select("float32", D, 100).name == "v2.2" and select("float32", D, 100, "tf32").name == "v2.2_tf32"


def test_half_dispatch_on_hopper():
    """v3.7 (three consumer warpgroups) at D=64 but for short causal calls, which take v3.6
    (persistent; v3.4's ping-pong at D=64), as D=128 and 256 do (v3.6_wide, slower since the
    speculative softmax, never); v3.3 at 192; off Hopper the mma.sync rungs."""
    from tileattn.versions import select

    for dtype in ("bfloat16", "float16"):
        assert select(dtype, 64, 90).name == "v3.7"
        assert select(dtype, 64, 90, short_causal=True).name == "v3.6"
        assert select(dtype, 128, 90).name == select(dtype, 128, 90, short_causal=True).name == "v3.6"
        assert select(dtype, 256, 90).name == "v3.6" and select(dtype, 192, 90).name == "v3.3"
        assert select(dtype, 64, 80).name == "v3.1"


def test_wrong_arch_for_an_explicit_version(monkeypatch):
    monkeypatch.setattr(tileattn.api._nvrtc, "device_arch", lambda index: (10, 0))
    with pytest.raises(ValueError, match=r"version 'v2.3' runs on sm_90, this GPU is sm_100"):
        tileattn.api._dispatch("v2.3", "float32", 64, 0, None)
    monkeypatch.setattr(tileattn.api._nvrtc, "device_arch", lambda index: (8, 0))
    with pytest.raises(ValueError, match=r"version 'v3.2' runs on sm_90\+, this GPU is sm_80"):
        tileattn.api._dispatch("v3.2", "bfloat16", 64, 0, None)


def test_arch_tiles_pick_by_arch():
    v = tileattn.VERSIONS["v3.1"]
    assert v.tile(64) == v.tiles[64] == v.tile(64, 80)  # the spill-free default below sm_90
    assert v.tile(64, 90) == (128, 128) and v.is_arch_tile(64, 90) and not v.is_arch_tile(256, 90)
    assert "128, 128, true" in v.name_expression("bfloat16", 64, True, 90)


def test_ratio_table_divides_by_peers_of_the_same_shape():
    from tileattn.bench import ratio_table

    base = dict(B=4, H=16, Nq=8192, Nk=8192, D=64, dtype="bfloat16", causal=False)
    rows = [
        dict(base, impl="v3.1", tflops=300.0),
        dict(base, impl="v3.7", tflops=462.0),
        dict(base, impl="sdpa_flash", tflops=300.0),
        dict(base, impl="sdpa_cudnn", tflops=440.0),
        dict(base, impl="sdpa_flash", tflops=1.0, Nq=1024),
    ]  # another shape: must not be used
    table = ratio_table({"rows": rows}).splitlines()  # no GPU named: no default-dispatch columns
    assert table[0].split(" | ")[-2:] == ["v3.1 / sdpa_flash", "v3.7 / sdpa_flash |"]
    assert next(x for x in table if "| 8192 |" in x).endswith("| 1.00x | 1.54x |")
    # On Hopper: the rung versions.select picks for the shape (v3.7 at D=64, N=8192) against cuDNN.
    table = ratio_table({"rows": rows, "gpu": "NVIDIA H200"}).splitlines()
    assert table[0].split(" | ")[-2:] == ["default", "default / sdpa_cudnn |"]
    assert next(x for x in table if "| 8192 |" in x).endswith("| 1.00x | 1.54x | v3.7 | 1.05x |")


def test_default_column_names_the_dispatch_rung_not_the_fastest():
    """The default column is versions.select's rung (v3.6 at D=128), even where a rung the
    dispatch passes over (v3.6_wide) measured faster in that run; without the dispatch's rung
    among the run's rows it stays empty."""
    from tileattn.bench import ratio_table

    base = dict(B=4, H=16, Nq=8192, Nk=8192, D=128, dtype="bfloat16", causal=False)
    rows = [dict(base, impl="v3.6_wide", tflops=660.0), dict(base, impl="sdpa_cudnn", tflops=600.0)]
    table = ratio_table({"rows": rows, "gpu": "NVIDIA H200"}).splitlines()
    assert table[-1].endswith("| 1.10x |  |"), table[-1]  # (no second peer: no default / peer column)
    rows.append(dict(base, impl="v3.6", tflops=630.0))
    table = ratio_table({"rows": rows, "gpu": "NVIDIA H200"}).splitlines()
    assert table[-1].endswith("| v3.6 |"), table[-1]


def test_hf_table_reads_runs_with_and_without_the_attention_free_run():
    """The attention columns of `bench --suite hf` (from its run with no attention) read "-" for
    results recorded before that run existed."""
    from tileattn.bench import hf_table

    old = [dict(impl="sdpa", B=2, N=8192, ms=88.5), dict(impl="tileattn", B=2, N=8192, ms=85.1,
           vs_sdpa=88.5 / 85.1, max_abs_logit_diff_vs_sdpa=0.125)]  # fmt: skip
    assert hf_table({"rows": old}).splitlines()[-1] == "| 2 | 8192 | 88.50 | 85.10 | 1.040x | - | - | - | 0.125 |"
    new = [dict(r, attn_ms=a) for r, a in zip(old, (20.5, 17.1))]
    new[1].update(attn_vs_sdpa=20.5 / 17.1, attn_needed_for_1_05x=20.5 / (88.5 / 1.05 - 68.0))
    assert hf_table({"rows": new}).splitlines()[-1] == (
        "| 2 | 8192 | 88.50 | 85.10 | 1.040x | 20.50 / 17.10 | 1.20x | 1.26x | 0.125 |"
    )
    new[1]["attn_needed_for_1_05x"] = None  # not even attention in no time would reach 1.05x
    assert "| 1.20x | - | 0.125 |" in hf_table({"rows": new})


def test_grouped_bars_label_no_bar_that_was_not_measured():
    """A peer missing from a group (FlexAttention at D=64 in the variants chart) gets no "0" label."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tileattn.bench import _grouped_bars

    fig, ax = plt.subplots()
    values = {("a", "ours"): 449.0, ("b", "ours"): 607.0, ("b", "peer"): 374.0}
    _grouped_bars(ax, ["a", "b"], ["ours", "peer"], lambda g, name: values.get((g, name), 0), labels=True)
    assert sorted(t.get_text() for t in ax.texts if t.get_text()) == ["374", "449", "607"]
    plt.close(fig)


def test_speedup_vs_previous_rung_of_the_same_precision():
    from tileattn.bench import add_ratios

    base = dict(B=4, H=8, Nq=8192, Nk=8192, D=128, dtype="float32", causal=False, kind="tensor_fp32")
    rows = [
        dict(base, impl=n, ms=ms) for n, ms in [("v2.2", 18.0), ("v2.2_tf32", 11.0), ("v2.3", 12.0), ("v2.3_tf32", 6.0)]
    ]
    rows.append(dict({k: v for k, v in base.items() if k != "kind"}, impl="sdpa_efficient", ms=24.0))
    add_ratios(rows)
    speedup = {r["impl"]: r.get("speedup_vs_prev") for r in rows}
    assert speedup == {"v2.2": None, "v2.2_tf32": None, "v2.3": 1.5, "v2.3_tf32": 11.0 / 6.0, "sdpa_efficient": None}
    assert rows[2]["vs_sdpa_efficient"] == 2.0


def test_tma_panel_widths_follow_the_swizzled_tile():
    from tileattn.api import panel_widths

    assert panel_widths(16) == [16] and panel_widths(24) == [32] and panel_widths(32) == [32]
    assert panel_widths(40) == [64] and panel_widths(64) == [64]  # 48 columns are stored as 64
    assert panel_widths(72) == [64, 16] and panel_widths(96) == [64, 32] and panel_widths(128) == [64]


def test_transformers_mask_is_skipped_only_for_a_plain_sliding_window(monkeypatch):
    """window_aware_mask: None for a sliding-window causal mask with no padding over a whole
    sequence, where tileattn's window kernel runs; transformers' SDPA mask otherwise (padding,
    fewer queries than keys, or no variants kernel for the model)."""
    import torch

    pytest.importorskip("transformers")
    from transformers import Gemma2Config
    from transformers.masking_utils import sliding_window_causal_mask_function

    from tileattn.integrations import transformers as hf

    config = Gemma2Config(hidden_size=256, num_attention_heads=4, head_dim=64, sliding_window=8)
    kw = dict(
        batch_size=2, q_length=20, kv_length=20, mask_function=sliding_window_causal_mask_function(8),
        local_size=8, allow_is_causal_skip=True, config=config, dtype=torch.bfloat16, device="cpu",
    )  # fmt: skip
    assert hf.window_aware_mask(**kw) is not None  # on the CPU no kernel runs: the mask is built
    monkeypatch.setattr(hf, "_variants_run", lambda *a: True)
    assert hf.window_aware_mask(**kw) is None
    padded = torch.ones(2, 20, dtype=torch.bool)
    padded[0, :3] = False
    assert hf.window_aware_mask(**{**kw, "attention_mask": padded}) is not None
    assert hf.window_aware_mask(**{**kw, "q_length": 1, "q_offset": 19}) is not None
    assert hf.window_aware_mask(**{**kw, "allow_is_causal_skip": False}) is not None


@pytest.mark.parametrize("mask_skipped", [False, True], ids=["mask_built", "mask_skipped"])
def test_transformers_fallback_keeps_softcap_and_window(monkeypatch, mask_skipped):
    """A call that falls back (here: on the CPU) keeps Gemma 2's softcap (plain PyTorch instead of
    transformers' SDPA, which drops it) and its sliding window, also where window_aware_mask left
    the window's mask out: the logits match transformers' eager path.  The softcap and the window
    both change eager's logits by far more than the tolerance."""
    import warnings

    pytest.importorskip("transformers")
    from transformers import Gemma2Config, Gemma2ForCausalLM

    import tileattn.integrations.transformers as tileattn_hf

    tileattn_hf.register()
    if mask_skipped:
        monkeypatch.setattr(tileattn_hf, "_variants_run", lambda *a: True)
    config = Gemma2Config(
        hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, vocab_size=100, sliding_window=8, attn_logit_softcapping=0.5, final_logit_softcapping=None,
        query_pre_attn_scalar=32, layer_types=["sliding_attention", "full_attention"],
    )  # fmt: skip
    torch.manual_seed(0)
    model = Gemma2ForCausalLM(config).eval()
    for layer in model.model.layers:  # scores large enough for the softcap to bind
        layer.self_attn.q_proj.weight.data *= 8
        layer.self_attn.k_proj.weight.data *= 8
    ids = torch.randint(0, 100, (2, 40))
    logits = {}
    for impl in ("eager", "tileattn"):
        model.set_attn_implementation(impl)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            logits[impl] = model(input_ids=ids).logits
    torch.testing.assert_close(logits["tileattn"], logits["eager"], rtol=0, atol=1e-5)
    model.set_attn_implementation("eager")
    for layer in model.model.layers:  # sensitivity: eager without the softcap, without the window
        layer.self_attn.attn_logit_softcapping = None
    with torch.no_grad():
        assert (model(input_ids=ids).logits - logits["eager"]).abs().max() > 1e-3
    model.model.layers[0].self_attn.attn_logit_softcapping = 0.5
    model.model.layers[1].self_attn.attn_logit_softcapping = 0.5
    model.model.layers[0].self_attn.sliding_window = None
    model.config.layer_types = ["full_attention", "full_attention"]
    with torch.no_grad():
        assert (model(input_ids=ids).logits - logits["eager"]).abs().max() > 1e-3


def test_transformers_chunked_attention_mask_is_never_skipped(monkeypatch):
    """Chunked attention (Llama 4) passes local_size too: its mask is built, never left out."""
    pytest.importorskip("transformers")
    from transformers import Gemma2Config
    from transformers.masking_utils import chunked_causal_mask_function

    from tileattn.integrations import transformers as hf

    monkeypatch.setattr(hf, "_variants_run", lambda *a: True)
    config = Gemma2Config(hidden_size=256, num_attention_heads=4, head_dim=64, sliding_window=None)
    config.attention_chunk_size = 8
    kw = dict(
        batch_size=1, q_length=20, kv_length=20, local_size=8, allow_is_causal_skip=True,
        mask_function=chunked_causal_mask_function(8, torch.zeros(1, dtype=int)),
        config=config, dtype=torch.bfloat16, device="cpu",
    )  # fmt: skip
    assert hf.window_aware_mask(**kw) is not None


def _fake_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=None,
                 causal=False, window_size=(-1, -1), softcap=0.0, **kwargs):  # fmt: skip
    """flash_attn_varlen_func's contract, from reference.attention_varlen (float64 NumPy, CPU)."""
    from tileattn import reference

    assert causal in (False, "bottom_right") and max_seqlen_q >= 0 and max_seqlen_k >= 0
    numpy = lambda t: t.double().numpy()
    O, _ = reference.attention_varlen(
        numpy(q), numpy(k), numpy(v), cu_seqlens_q.tolist(), cu_seqlens_k.tolist(), softmax_scale=softmax_scale,
        causal=bool(causal), window=window_size, softcap=softcap,
    )  # fmt: skip
    return torch.from_numpy(O).to(q.dtype)


def _packed_path_on_the_cpu(monkeypatch, varlen):
    """The integration registered, taking its packed path on the CPU, with ``varlen`` playing
    flash_attn_varlen_func; returns the integration's module."""
    import tileattn.integrations.transformers as tileattn_hf
    from tileattn import serving

    tileattn_hf.register()
    monkeypatch.setattr(tileattn_hf, "_variants_run", lambda *a: True)
    monkeypatch.setattr(tileattn_hf, "_unsupported", lambda *a: None)  # (the CPU itself would fall back)
    monkeypatch.setattr(serving, "flash_attn_varlen_func", varlen)
    return tileattn_hf


@pytest.mark.parametrize("model_name", ["llama", "gemma2"])
def test_transformers_padded_batches_run_packed(monkeypatch, model_name):
    """A left-padded batch, its prefill and a decode step with the cache, takes tileattn's packed
    path (padding_aware_mask's (B, L) mask, the valid tokens gathered, flash_attn_varlen_func per
    sequence, zeros back on padded rows) with no fallback, and gives transformers' own logits on
    every valid position: SDPA's for Llama, eager's for Gemma 2 (a sliding window shorter than
    the prompt, applied per sequence in prefill and in the decode step, and a softcap).  On the
    CPU: the kernel's contract is played by the float64 reference."""
    pytest.importorskip("transformers")
    from transformers import Gemma2Config, Gemma2ForCausalLM, LlamaConfig, LlamaForCausalLM

    from tileattn.testing import padded_prefill_and_step

    tileattn_hf = _packed_path_on_the_cpu(monkeypatch, _fake_varlen)
    common = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=32, vocab_size=100)  # fmt: skip
    if model_name == "llama":
        config, cls, peer = LlamaConfig(**common), LlamaForCausalLM, "sdpa"
    else:
        config = Gemma2Config(
            **common, sliding_window=6, attn_logit_softcapping=0.5, final_logit_softcapping=None,
            query_pre_attn_scalar=32, layer_types=["sliding_attention", "full_attention"],
        )  # fmt: skip
        cls, peer = Gemma2ForCausalLM, "eager"
    torch.manual_seed(0)
    model = cls(config).to(torch.bfloat16).eval()
    ids = torch.randint(0, 100, (3, 20))
    mask = torch.ones_like(ids)
    mask[0, :7], mask[2, :1] = 0, 0  # left padding
    step = torch.randint(0, 100, (3, 1))
    calls, logits = [], {}
    padded = tileattn_hf._padded_attention
    monkeypatch.setattr(tileattn_hf, "_padded_attention", lambda *a: calls.append(1) or padded(*a))
    for impl in (peer, "tileattn"):  # (a fallback would warn: an error here)
        logits[impl] = padded_prefill_and_step(model, impl, ids, mask, step)
    assert len(calls) == 2 * 2  # both layers, prefill and decode
    keep = mask.bool()
    torch.testing.assert_close(logits["tileattn"][0][keep], logits[peer][0][keep], rtol=0, atol=2e-2)
    torch.testing.assert_close(logits["tileattn"][1], logits[peer][1], rtol=0, atol=2e-2)


def _differentiable_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=None,
                           causal=False, **kwargs):  # fmt: skip
    """flash_attn_varlen_func's contract in differentiable float64 torch (no variants): each
    sequence alone, causal bottom-right, a row without keys 0."""
    from tileattn.testing import _expand_kv, _scores

    assert causal in (False, "bottom_right") and not kwargs.get("softcap")
    out = q.new_zeros(q.shape, dtype=torch.float64)
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(cq) - 1):
        qq, kk, vv = (t[r0:r1].double().transpose(0, 1)[None] for t, (r0, r1) in
                      ((q, cq[b : b + 2]), (k, ck[b : b + 2]), (v, ck[b : b + 2])))  # fmt: skip
        kk, vv = _expand_kv(qq, kk, vv)
        S = _scores(qq, kk, softmax_scale, "bottom_right" if causal else None)
        out = out.index_copy(
            0, torch.arange(cq[b], cq[b + 1]), (torch.softmax(S, -1).nan_to_num(0.0) @ vv)[0].transpose(0, 1)
        )
    return out.to(q.dtype)


def test_transformers_padded_batch_trains_on_the_cpu(monkeypatch):
    """Training on a left-padded batch takes the packed path with gradients (no fallback): the
    gather into packed rows, flash_attn_varlen_func (here a differentiable float64 stand-in; the
    GPU test runs the kernels) and the scatter back give the gradients of transformers' SDPA path
    on the same bf16 model, as close to a float32 SDPA run as bf16 SDPA's own."""
    pytest.importorskip("transformers")
    from transformers import LlamaConfig, LlamaForCausalLM

    from tileattn.testing import assert_grads_as_close_as, attention_weight_grads

    tileattn_hf = _packed_path_on_the_cpu(monkeypatch, _differentiable_varlen)
    config = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=32, vocab_size=100, attention_dropout=0.0)  # fmt: skip
    torch.manual_seed(0)
    base = LlamaForCausalLM(config).train()
    ids = torch.randint(0, 100, (3, 20))
    mask = torch.ones_like(ids)
    mask[0, :7], mask[2, :1] = 0, 0  # left padding
    labels = ids.masked_fill(mask == 0, -100)
    calls, padded = [], tileattn_hf._padded_attention
    monkeypatch.setattr(tileattn_hf, "_padded_attention", lambda q, *a: calls.append(q.requires_grad) or padded(q, *a))
    inputs = dict(input_ids=ids, attention_mask=mask, labels=labels)
    grads = lambda impl, dtype: attention_weight_grads(base, impl, dtype, **inputs)
    reference, sdpa_bf16 = grads("sdpa", torch.float32), grads("sdpa", torch.bfloat16)
    ours = grads("tileattn", torch.bfloat16)
    assert calls == [True, True]
    assert_grads_as_close_as(ours, sdpa_bf16, reference)


def test_transformers_padding_mask_as_sdpa_mask():
    """The fallback's 4-D mask from a padding mask (_dense_mask) is transformers' own SDPA mask on
    every valid query row: prefill and a decode step, causal with and without a sliding window."""
    pytest.importorskip("transformers")
    from transformers.masking_utils import causal_mask_function, sdpa_mask, sliding_window_causal_mask_function

    from tileattn.integrations import transformers as hf

    padding = torch.ones(3, 12, dtype=torch.bool)
    padding[0, :5], padding[2, :1] = False, False
    for window in (None, 4):
        fn = causal_mask_function if window is None else sliding_window_causal_mask_function(window)
        for Nq in (12, 1):
            want = sdpa_mask(batch_size=3, q_length=Nq, kv_length=12, q_offset=12 - Nq, mask_function=fn,
                             attention_mask=padding, allow_is_causal_skip=False, local_size=window)  # fmt: skip
            got = hf._dense_mask(padding, Nq, 12, True, {"sliding_window": window})
            rows = padding[:, 12 - Nq :]
            assert torch.equal(got[:, 0][rows], want[:, 0][rows])


def test_outputs_helper_allocates_or_keeps_and_fills_empty_calls():
    """api._outputs (the packed and FP8 paths' O / lse): new buffers of the shapes asked for, lse only
    on request, the caller's buffers kept; with no work, O is 0 and lse -inf."""
    from tileattn import api

    out, lse = api._outputs(None, None, (2, 3, 4), torch.bfloat16, (3, 2), False, "cpu", False)
    assert out.shape == (2, 3, 4) and out.dtype == torch.bfloat16 and lse is None
    given_o, given_l = torch.full((2, 3, 4), float("nan")), torch.full((3, 2), float("nan"))
    out, lse = api._outputs(given_o, given_l, (2, 3, 4), torch.float32, (3, 2), False, "cpu", True)
    assert out is given_o and lse is given_l
    assert (out == 0).all() and (lse == float("-inf")).all()
    _, lse = api._outputs(None, None, (1, 1, 8), torch.float16, (1, 1), True, "cpu", True)
    assert lse.dtype == torch.float32 and (lse == float("-inf")).all()


def test_forward_args_in_field_order():
    """_params.fwd_args, the forward fields of every launch outside the ladder's plans too (FP8,
    the packed serving kernels): one value per FWD_ARGS field, each where its name says."""
    from tileattn import _params

    strides = [(10 * i + 1, 10 * i + 2, 10 * i + 3, 1) for i in range(4)]  # q, k, v, O (a 4th entry ignored)
    args = _params.fwd_args(300, 457, 8, 2, strides, 0.125, 7, ptrs=(1, 2, 3, 4, 5, 6), bh_offset=9)
    got = dict(zip((name for name, _ in _params.FWD_ARGS), args, strict=True))
    assert got == dict(
        q=1, k=2, v=3, o=4, lse=5, workspace=6, Nq=300, Nk=457, H=8, h_per_kv=4,
        q_sb=1, q_sh=2, q_sn=3, k_sb=11, k_sh=12, k_sn=13, v_sb=21, v_sh=22, v_sn=23, o_sb=31, o_sh=32, o_sn=33,
        softmax_scale=0.125, causal_offset=7, bh_offset=9,
    )  # fmt: skip
