"""benchmarks/train_profile.py: kernel names fall into the right groups, and a profile of a tiny model's
training step runs end to end on the CPU (aten ops' own time in place of kernels). benchmarks/train_tables.py:
a stored run's cells as text, errors under the cells that did not run."""

from __future__ import annotations

import json

import pytest

from script_helpers import load_script

prof = load_script("train_profile")
tables = load_script("train_tables")


@pytest.mark.parametrize("name,group", [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1", "GEMM"),
    ("nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NTN", "GEMM"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_align8>", "GEMM"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4>>", "attention"),
    ("fmha_cutlassB_bf16_aligned_64x64_k64_sm80", "attention"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, LogSoftMaxForwardEpilogue>", "cross-entropy"),
    ("void at::native::(anonymous namespace)::softmax_warp_forward<c10::BFloat16, c10::BFloat16, float, 7>", "attention"),
    ("void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>", "cross-entropy"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>", "norm"),
    ("triton_per_fused_native_layer_norm_0", "norm"),
    ("void at::native::fused_adamw_kernel_cuda<float>", "optimizer"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>", "elementwise"),
    ("triton_poi_fused_add_mul_tanh_3", "elementwise"),
    ("triton_per_fused__safe_softmax_add_exp_expand_native_dropout_prepare_softmax_online_scalar_tensor_2", "attention"),
    ("triton_per_fused__softmax_backward_data__to_copy_native_dropout_native_dropout_backward_threshold_1", "attention"),
    ("triton_red_fused__log_softmax__log_softmax_backward_data__to_copy_arange_clone_eq_expand_1", "cross-entropy"),
    ("aten::addmm", "GEMM"),
])
def test_kernels_are_grouped(name, group):
    assert prof.group_of(name) == group


def test_grouped_sums_per_step_and_ranks_the_top():
    out = prof.grouped([("sm90_xmma_gemm_x", 30.0), ("flash_fwd_kernel", 6.0), ("triton_poi_fused_add_1", 3.0),
                        ("fused_adamw_kernel_cuda", 1.5)], steps=3)
    assert out["groups"] == pytest.approx({"GEMM": 10.0, "attention": 2.0, "elementwise": 1.0, "optimizer": 0.5})
    assert list(out["groups"]) == ["GEMM", "attention", "elementwise", "optimizer"]  # largest first
    assert out["busy_ms"] == pytest.approx(13.5) and out["top"][0] == ("sm90_xmma_gemm_x", "GEMM", 10.0)


def test_profile_of_a_tiny_model_on_the_cpu(tmp_path, capsys):
    assert prof.main(["--model", "gpt2-tiny", "--seq", "32", "--batch", "2", "--dtype", "fp32", "--device", "cpu",
                      "--warmup", "1", "--steps", "2", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "profile.json").read_text())
    assert data["cell"]["task"] == "causal-lm" and data["step_ms"] > 0 and data["busy_ms"] > 0
    assert {"GEMM", "optimizer"} <= set(data["groups"])
    assert sum(data["groups"].values()) == pytest.approx(data["busy_ms"])
    assert set(data["phases_ms"]) == {"forward_ms", "backward_ms", "optimizer_ms"}
    assert data["flops_per_step"] > 0 and (tmp_path / "trace.json").stat().st_size > 0
    assert "top kernels" in capsys.readouterr().out


def test_tables_show_each_cell_its_options_and_errors():
    cells = [{"scenario": "training", "status": "ok", "cell": {"dtype": "bf16", "optim": "adamw-fused", "batch": 256,
                                                                "compile": True, "head": "masked", "grad_accum": 1},
              "record": {"samples_per_s": 1300.0, "mfu": 0.41, "hfu": 0.42}},
             {"scenario": "max-batch", "status": "oom", "cell": {"precision": "fp32", "optim": "adamw", "batch": 0,
                                                                  "zero_stage": 3, "grad_accum": 4},
              "record": {"error": "CUDA out of memory", "samples_per_s": 5.0}}]
    lines = tables.cell_rows(cells)
    assert "compile masked-head" in lines[1] and "1300.0" in lines[1] and "41.0%" in lines[1]
    assert "x4 ZeRO-3" in lines[2] and "max:oom" in lines[2] and "5.0" not in lines[2]  # no speed for a failure
    assert lines[3].strip() == "CUDA out of memory"
