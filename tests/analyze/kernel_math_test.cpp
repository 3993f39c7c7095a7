// ClassifyKernelMath on real kernel names: each as a trace, an issue or a
// public profile named it, with the class its naming rules give
// (docs/analyze.md, "Matmul math"), and the committed traces' kernels.
#include <gtest/gtest.h>

#include "fullburn/analyze.h"

namespace fullburn {
namespace {

TEST(KernelMath, RealNamesGetTheirMath) {
  struct Case {
    const char* name;
    const char* key;
  };
  const Case cases[] = {
      {"volta_sgemm_64x64_nt", "fp32_simt"},  // trace resnet50_v100 (both)
      {"volta_sgemm_64x32_sliced1x4_tn", "fp32_simt"},  // trace resnet50_v100 (both)
      {"volta_fp16_sgemm_fp16_32x32_sliced1x4_nn", "fp32_simt"},  // github.com/NVIDIA/OpenSeq2Seq/issues/270
      {"volta_cgemm_32x64_tn", "fp32_simt"},  // github.com/NVIDIA/apex/issues/666
      {"volta_h884gemm_256x128_ldg8_nn", "fp16_tc"},  // public file, index id 3448138538
      {"volta_h884gemm_64x64_nt", "fp16_tc"},  // public file, index id 3448138538
      {"volta_s884gemm_fp16_128x64_ldg8_tn", "fp16_tc"},  // public file, index id 70138557547
      {"volta_fp16_s884gemm_fp16_128x128_ldg8_f2f_nn", "fp16_tc"},  // public file, index id 1641045501; TF kernel_stats_utils.cc example
      {"turing_fp16_s1688gemm_fp16_256x128_ldg8_f2f_tn", "fp16_tc"},  // public file, index id 21139146218
      {"ampere_sgemm_128x64_tn", "fp32_simt"},  // public file, index id 71088497146
      {"ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_tn", "fp16_tc"},  // public file, index id 140868591
      {"ampere_h16816gemm_128x128", "fp16_tc"},  // public file, index id 44138696307 (abridged name)
      {"ampere_s1688gemm_fp16_128x128_ldg8_stages_32x1_nn", "fp16_tc"},  // public file, index id 54237726294
      {"ampere_bf16_s16816gemm_bf16_128x256_ldg8_f2f_stages_64x3_nn", "bf16_tc"},  // public file, index id 2759864496
      {"ampere_bf16_s1688gemm_bf16_128x128_ldg8_f2f_stages_32x1_nn", "bf16_tc"},  // github.com/pytorch/pytorch/issues/181718
      {"sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4_execute_kernel__5x_cublas", "fp32_simt"},  // public file, index id 53205803497
      {"sm80_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize32x32x64_stage3_warpsize2x1x2_tensor16x8x8", "tf32_tc"},  // public file, index id 4247711887 (TensorRT tactic list)
      {"sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas", "tf32_tc"},  // public file, index id 23271960271
      {"sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas", "fp16_tc"},  // github.com/NVIDIA/TensorRT-LLM/issues/1541
      {"sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "bf16_tc"},  // public file, index id 57382873687
      {"sm89_xmma_gemm_e4m3e4m3_e4m3f32_f32_tn_n_tilesize64x64x64_stage4_warpsize2x2x1_tensor16x8x32", "fp8_tc"},  // public file, index id 54896317660
      {"sm89_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_", "fp8_tc"},  // public file, index id 71146902206 (truncated there)
      {"void gemv2T_kernel_val<int, int, float, float, float, 128, 16, 2, 2, false, false, cublasGemvParams<cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, float> >(cublasGemvParams<cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, float>)", "fp32_simt"},  // public file, index id 6924892121 (TF trace)
      {"void gemv2T_kernel_val<int, int, __half, float, float, float, ", "fp32_simt"},  // public file, index id 70588474776 (truncated; fp16 storage, fp32 FMA)
      {"void splitKreduce_kernel<float, float, float, float>(cublasSplitKParams<float>, float const*, float const*, float*, float const*, float const*, float const*)", "not_gemm"},  // trace resnet50_v100 (both)
      {"nvjet_tst_128x256_64x6_2x1_2cta_v_bz_TNT", "bf16_tc"},  // public file, index id 56700362944 (torch.mm bf16 on B200)
      {"nvjet_sm90_tst_192x192_64x3_2x1_v_bz_coopB_NTN", "bf16_tc"},  // public file, index id 56710343561
      {"nvjet_tss_64x8_64x16_2x1_v_bz_splitK_TNT", "bf16_tc"},  // public file, index id 53521591623
      {"nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_TNN", "fp16_tc"},  // public file, index id 54573161734
      {"nvjet_sm90_hss_64x8_64x16_1x1_h_bz_splitK_NNT", "fp16_tc"},  // public file, index id 59488037838 (fp16 A/B, fp32 out)
      {"nvjet_qqtst_128x256_128x6_2x1_2cta_v_bz_TNT", "fp8_tc"},  // public file, index id 56700362944 (fp8 cublas on B200)
      {"nvjet_qqtst_128x256_128x6_2x2_2cta_h_bz_Avec32UE8M0_Bvec32UE8M0_TNT", "fp8_tc"},  // public file, index id 66754941630 (MXFP8)
      {"nvjet_ootst_FP4", "fp4_tc"},  // public file, index id 53213367815 (abridged by its author)
      {"nvjet_sss_tf32_128x256_TNT", "tf32_tc"},  // public file, index id 66279159927 (abridged by its author)
      {"cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_nn_align8>", "bf16_tc"},  // github.com/pytorch/pytorch/issues/181718
      {"cutlass::Kernel2<cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128_nn_align1>", "bf16_tc"},  // github.com/pytorch/pytorch/issues/181718
      {"_ZN7cutlass7Kernel2I66cutlass_80_tensorop_f16_s16816gemm_relu_f16_256x128_32x3_tn_align8EEvNT_6ParamsE", "fp16_tc"},  // public file, index id 54573161734 (mangled)
      {"void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_256x128_16x3_nn_align4>(cutlass_80_tensorop_s1688gemm_256x128_16x3_nn_align4::Params)", "tf32_tc"},  // public file, index id 54716978226
      {"void cutlass::Kernel2<cutlass_80_simt_sgemm_64x64_8x5_tn_align1>(cutlass_80_simt_sgemm_64x64_8x5_tn_align1::Params)", "fp32_simt"},  // public file, index id 61825272447
      {"cutlass_80_wmma_tensorop_s161616gemm_f16_32x32_64x2_nn_align2", "fp16_tc"},  // public file, index id 59488037838
      {"cutlass::Kernel2<cutlass_80_tensorop_i16832gemm_s8_128x64_128x3_tn_align4>(...)", "int8_tc"},  // public file, index id 36892422436
      {"cutlass_75_tensorop_i8816gemm_s8_128x128_tn_align16", "int8_tc"},  // public file, index id 69882191021
      {"cutlass_tensorop_s1688tf32gemm_256x128_16x3_nn_align4", "tf32_tc"},  // github.com/NVIDIA/cutlass/issues/999
      {"cutlass_tensorop_tf32_s1688gemm_tf32_256x128_16x3_nn_align4", "tf32_tc"},  // github.com/NVIDIA/cutlass/issues/999
      {"ampere_dgemm_64x64_nn", "fp64"},  // public file, index id 71106400807
      {"ampere_dgemm_64x64_lower_nt", "fp64"},  // public file, index id 66148063910
      {"cutlass3x_sm90_tensorop_s64x128x16gemm_bf16_bf16_f32_void_bf16_128x128x64_1x1x1_0_tnn_align8_warpspecialized_pingpong_epi_tma", "bf16_tc"},  // public file, index id 12556940530
      {"cutlass3x_sm90_tensorop_gemm_bf16_bf16_f32_bf16_bf16_128x128x64_2x1x1_0_tnt_align8_warpspecialized_cooperative_epi_tma", "bf16_tc"},  // public file, index id 71535199632 (Inductor CUTLASS backend)
      {"cutlass3x_sm90_tensorop_s64x256x16gemm_f16_f16_f32_void_f16_128x256x64_2x1x1_0_tnn_align8_warpspecialized_cooperative_epi_tma", "fp16_tc"},  // public file, index id 57547253882
      {"cutlass3x_sm100_tensorop_i256x256x32gemm_s8_s8_s32_s32_s32_256x256x128_0_tnn_align16_2sm_bias_s32_r", "int8_tc"},  // public file, index id 56700362944 (int8 cublas on B200, truncated)
      {"cutlass3x_sm100_bstensorop_s256x256x64gemm_block_scaled_ue4m3xf4_ue4m3xf4_f32_bf16_bf16_256x256x256", "fp4_tc"},  // public file, index id 56700362944 (nvfp4 cublas, truncated)
      {"void deep_gemm::sm100_fp8_gemm_1d1d_impl<(cute::UMMA::Major)0, (cute::UMMA::Major)0, (unsigned int)", "fp8_tc"},  // public file, index id 56700362944
      {"void implicit_convolve_sgemm<float, float, 1024, 6, 7, 3, 3, 5, 1, false, true, true>(int, int, int, float const*, int, float*, float const*, kernel_conv_params, unsigned long long, int, float, float, int, float const*, float const*, bool, int, int)", "fp32_simt"},  // trace resnet50_v100 (both)
      {"void explicit_convolve_sgemm<float, int, 1024, 5, 5, 3, 3, 3, 0, false>(int, int, int, float const*, int, float const*, int, float*, kernel_conv_params, unsigned long long, int, unsigned long long, int, float, float, int, float const*, float const*)", "fp32_simt"},  // trace resnet50_v100_num_workers_0
      {"void cudnn::cnn::wgrad_alg0_engine<float, 128, 6, 7, 3, 3, 5, false, 512>(int, int, int, float const*, int, float*, float const*, kernel_grad_params, unsigned long long, int, float, int, int, int, int)", "fp32_simt"},  // trace resnet50_v100 (both)
      {"void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>(int, int, int, float const*, int, float const*, int, float*, kernel_grad_params, unsigned long long, int, unsigned long long, int, float, int, int, int)", "fp32_simt"},  // trace resnet50_v100 (both)
      {"volta_scudnn_128x64_relu_interior_nn_v1", "fp32_simt"},  // trace resnet50_v100 (both)
      {"volta_scudnn_winograd_128x128_ldg1_ldg4_relu_tile148t_nt_v1", "fp32_simt"},  // trace resnet50_v100 (both); github.com/ryujaehun/pytorch-gpu-benchmark/issues/6
      {"volta_fp16_scudnn_fp16_128x128_stridedB_splitK_interior_nn_v1", "fp32_simt"},  // github.com/apache/mxnet/issues/9774
      {"volta_fp16_s884cudnn_fp16_256x128_ldg8_relu_f2f_exp_small_nhwc2nchw_tn_v1", "fp16_tc"},  // github.com/NVIDIA/apex/issues/666
      {"volta_h884cudnn_256x128_ldg8_relu_exp_small_nhwc_tn_v1", "fp16_tc"},  // public file, index id 6964510976 (TensorRT log)
      {"turing_fp16_s1688cudnn_fp16_256x64_sliced1x2_ldg8_relu_f2f_exp_small_nhwc_tn_v1", "fp16_tc"},  // github.com/pytorch/pytorch/issues/54324
      {"turing_s1688cudnn_fp16_128x128_ldg8_wgrad_idx_exp_interior_nhwc_nt_v1", "fp16_tc"},  // github.com/apache/mxnet/issues/17665
      {"sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_stage4", "tf32_tc"},  // public file, index id 51901894187
      {"sm80_xmma_dgrad_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x16_stage4_warpsize2x2x1_g1_tensor16x8x8_execute_kernel_cudnn", "tf32_tc"},  // public file, index id 15459696840 (TF profile)
      {"sm80_xmma_fprop_implicit_gemm_f32f32_f32f32_f32_nchwkcrs_nchw_tilesize128x16x8_stage3_warpsize4x1x1_g1_ffma_aligna4_alignc4", "fp32_simt"},  // public file, index id 65836157399 (TensorRT tactic)
      {"sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64_warpgroupsize1x1x1_g1_execute_segment_k_off_kernel__5x_cudnn", "bf16_tc"},  // public file, index id 61928873188 (quoted from an H100 trace)
      {"sm80_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_ti", "bf16_tc"},  // public file, index id 63392576317 (truncated there)
      {"void cutlass__5x_cudnn::Kernel<cutlass_tensorop_s1688fprop_optimized_tf32_64x64_16x10_nhwc_align4>(cutlass_tensorop_s1688fprop_optimized_tf32_64x64_16x10_nhwc_align4::Params)", "tf32_tc"},  // public file, index id 51888671385
      {"void cutlass__5x_cudnn::Kernel<cutlass_tensorop_bf16_s16816fprop_optimized_bf16_64x64_32x10_nhwc_align8>(T1::Params)", "bf16_tc"},  // public file, index id 69477003918
      {"void cutlass__5x_cudnn::Kernel<cutlass_tensorop_f16_s16816fprop_optimize", "fp16_tc"},  // public file, index id 57750724084 (truncated)
      {"void cudnn::winograd_nonfused::winogradForwardData4x4<float, float>(cudnn::winograd_nonfused::WinogradDataParams<float, float>)", "fp32_simt"},  // trace resnet50_v100 (both) [conv-aux]
      {"void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, 512, true, 1>(cudnnTensorStruct, float const*, cudnnTensorStruct, float*, float const*, float const*, float, float, float*, float*, float*, float*, float, float)", "not_gemm"},  // trace resnet50_v100 (both)
      {"cask_cudnn::computeOffsetsKernel(cask_cudnn::ComputeOffsetsParams)", "not_gemm"},  // trace resnet50_v100 (both)
      {"void nchwToNhwcKernel<float, float, float, true, false, (cudnnKernelDataType_t)0>(int, int, int, int, float const*, float*, float, float)", "not_gemm"},  // trace resnet50_v100 (both)
      {"triton_tem_fused__to_copy_addmm_gelu_t_view_9", "unknown"},  // public file, index id 70093536919
      {"triton_tem_fused_bmm_7", "unknown"},  // public file, index id 62131115103
      {"triton_poi_fused_convolution_5", "not_gemm"},  // public file, index id 69477003918
      {"triton_red_fused_native_layer_norm_7", "not_gemm"},  // public file, index id 57382873687
      {"void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<(int)128, (int)128, (int)32, (int)4, (bool)0, (bool)0, cutlass::bfloat16_t, Flash_kernel_traits<(int)128, (int)128, (int)32, (int)4, cutlass::bfloat16_t>>, (bool)0, (bool)0, (bool)0, (bool)0, (bool)0, (bool)1, (bool)0, (bool)0>(pytorch_flash::Flash_fwd_params)", "bf16_tc"},  // public file, index id 71274317567
      {"flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64, 64, 4, half_t, ...>>", "fp16_tc"},  // public file, index id 53831844218 (abridged)
      {"fmha_cutlassF_bf16_aligned_64x128_rf_sm80", "bf16_tc"},  // pytorch/pytorch aten/src/ATen/native/transformers/cuda/mem_eff_attention/kernels/cutlassF.h
      {"fmha_cutlassF_f16_aligned_64x64_rf_sm80", "fp16_tc"},  // public file, index id 14759525656
      {"fmha_cutlassF_f32_aligned_64x64_rf_sm80", "tf32_tc"},  // public file, index id 55571759370; gemm_kernel_utils.h (3xTF32)
      {"cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_kernel0_0", "unknown"},  // public file, index id 70370850597 (bf16 run, name says f16)
      {"cudnn_generated_fort_native_sdpa_sm80_flash_fprop_wmma_f16_knob_3_64x64x128_4x1x1_kernel0_0", "unknown"},  // public file, index id 70510272982
      {"ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "not_gemm"},  // public file, index id 60242728150
      {"void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>, at::detail::Array<char*, 3> >(int, at::native::AddFunctor<float>, at::detail::Array<char*, 3>)", "not_gemm"},  // trace resnet50_v100 (both)
      {"convert_dq_to_16bits", "not_gemm"},  // public file, index id 58666707282
  };
  for (const Case& c : cases)
    EXPECT_STREQ(KernelMathKey(ClassifyKernelMath(c.name)), c.key) << c.name;
}

}  // namespace
}  // namespace fullburn
