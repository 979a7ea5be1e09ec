"""The contraction's 32 x 32 block micro-kernels as TensorIntrins, one file per instruction family
(AMX, AVX512-BF16, VNNI, AVX2, AArch64 bf16 and int8 dot products), registered through one
builder (:mod:`.register`)."""
