"""OpInfos of torch's op_db that the sweep (sweep.py) expects to raise a clear error, with the reason.

The list may only shrink: op_db_test.py fails when a listed OpInfo passes (remove its entry) and
when an unlisted one fails. Wrong answers and hangs are never listed: they always fail the test.
Generated from a sweep run, then kept by hand; each reason names what stops the OpInfo.
"""

EXPECTED_FAILURES = {
    "diagonal_scatter":
        "a formula inside the op (composite or backward) makes a plain tensor and passes it to aten::diagonal_scatter as 'src' [10] with distributed tensors; plain tensors that are not scalars are refused (PyTorch's DTensor refuses them too)",
    "stft":
        "uses aten::as_strided, refused on distributed tensors (no single storage to address)",
    "sparse.sampled_addmm":
        "Sparse CSR tensors do not have strides",
    "matrix_exp":
        "a formula inside the op (composite or backward) makes a plain tensor and passes it to aten::copy_ as 'self' [5, 5] with distributed tensors; plain tensors that are not scalars are refused (PyTorch's DTensor refuses them too)",
    "as_strided":
        "uses aten::as_strided, refused on distributed tensors (no single storage to address)",
    "as_strided_scatter":
        "uses aten::as_strided_scatter, refused on distributed tensors (no single storage to address)",
    "nn.functional.pad.circular":
        "uses aten::as_strided, refused on distributed tensors (no single storage to address)",
    "nn.functional.fractional_max_pool2d":
        "a formula inside the op (composite or backward) makes a plain tensor and passes it to aten::fractional_max_pool2d as 'random_samples' [1, 3, 2] with distributed tensors; plain tensors that are not scalars are refused (PyTorch's DTensor refuses them too)",
    "nn.functional.fractional_max_pool3d":
        "a formula inside the op (composite or backward) makes a plain tensor and passes it to aten::fractional_max_pool3d as 'random_samples' [2, 3, 3] with distributed tensors; plain tensors that are not scalars are refused (PyTorch's DTensor refuses them too)",
    "mvlgamma.mvlgamma_p_1":
        "a formula inside the op (composite or backward) makes a plain tensor and passes it to aten::add.Tensor as 'self' [2] with distributed tensors; plain tensors that are not scalars are refused (PyTorch's DTensor refuses them too)",
    "mvlgamma.mvlgamma_p_3":
        "a formula inside the op (composite or backward) makes a plain tensor and passes it to aten::add.Tensor as 'self' [2] with distributed tensors; plain tensors that are not scalars are refused (PyTorch's DTensor refuses them too)",
    "mvlgamma.mvlgamma_p_5":
        "a formula inside the op (composite or backward) makes a plain tensor and passes it to aten::add.Tensor as 'self' [2] with distributed tensors; plain tensors that are not scalars are refused (PyTorch's DTensor refuses them too)",
    "select_scatter":
        "a formula inside the op (composite or backward) makes a plain tensor and passes it to aten::select_scatter as 'src' [5, 5] with distributed tensors; plain tensors that are not scalars are refused (PyTorch's DTensor refuses them too)",
    "slice_scatter":
        "a formula inside the op (composite or backward) makes a plain tensor and passes it to aten::slice_scatter as 'src' [20, 20, 20] with distributed tensors; plain tensors that are not scalars are refused (PyTorch's DTensor refuses them too)",
    "tensor_split":
        "reads a distributed tensor's data on the host (data_ptr of a DTensor): Cannot access data pointer of Tensor that doesn't have storage",
    "svd_lowrank":
        "a formula inside the op (composite or backward) makes a plain tensor and passes it to aten::mm as 'mat2' [1, 0] with distributed tensors; plain tensors that are not scalars are refused (PyTorch's DTensor refuses them too)",
    "pca_lowrank":
        "a formula inside the op (composite or backward) makes a plain tensor and passes it to aten::mm as 'mat2' [1, 0] with distributed tensors; plain tensors that are not scalars are refused (PyTorch's DTensor refuses them too)",
    "index_put":
        "a formula inside the op (composite or backward) makes a plain tensor and passes it to aten::index_put as 'self' [5, 5] with distributed tensors; plain tensors that are not scalars are refused (PyTorch's DTensor refuses them too)",
    "put":
        "a formula inside the op (composite or backward) makes a plain tensor and passes it to aten::put as 'source' [3] with distributed tensors; plain tensors that are not scalars are refused (PyTorch's DTensor refuses them too)",
    "nn.functional.ctc_loss":
        "reads a distributed tensor's data on the host (data_ptr of a DTensor): Cannot access data pointer of Tensor that doesn't have storage",
    "fft.hfft":
        "view_as_real doesn't work on unresolved conjugated tensors.  To resolve the conjugate tensor so you can view it as real, use self.resolve_conj(); however, be warned that the resulting tensor will NOT alias the original.",
    "linalg.householder_product":
        "its backward writes (aten::copy_) into a view (aten::select.int) of a gathered copy; refused so the write is not lost",
    "linalg.matrix_rank":
        "aten::sum.IntList_out: out= argument 'out' is a plain tensor but the inputs are distributed; pass a distributed out tensor (e.g. api::empty on the same mesh)",
    "linalg.matrix_rank.hermitian":
        "aten::sum.IntList_out: out= argument 'out' is a plain tensor but the inputs are distributed; pass a distributed out tensor (e.g. api::empty on the same mesh)",
    "sparse.mm.reduce":
        "a sparse CSR input: distributed tensors are strided (Sparse CSR tensors do not have strides)",
    "to_sparse":
        "its result is a sparse tensor: distributed tensors are strided (Cannot access storage of SparseTensorImpl)",
    "as_strided.partial_views":
        "uses aten::as_strided, refused on distributed tensors (no single storage to address)",
    "as_strided_copy":
        "uses aten::as_strided, refused on distributed tensors (no single storage to address)",
    "ormqr":
        "its formula writes (aten::copy_) into a view (aten::select.int) of a gathered copy; refused so the write is not lost",
}


# In-place variants (sweep.sweep_inplace_one): the written self must hold one device's values.
# Same rules: wrong answers and hangs are never listed; the list may only shrink.
_AS_STRIDED = (
    "uses aten::as_strided_, refused on distributed tensors (no single storage to address)"
)

INPLACE_EXPECTED_FAILURES = {
    "as_strided": _AS_STRIDED,
    "as_strided.partial_views": _AS_STRIDED,
}


# The full sweep's own entries (op_db_full_test.py; every sample, every argument sharded): OpInfos
# whose first three samples pass (so the default tier must not list them) but a later sample
# raises a clear error. Found by the first full sweep (seed 619871440, 2026-11-26); each reason
# names the class; the list may only shrink.
FULL_EXPECTED_FAILURES = {
    'combinations':
        "a formula inside the op (composite or backward) makes a plain tensor and mixes it with distributed tensors in a later sample of op_db (the full sweep's samples beyond the first three); plain tensors that are not scalars are refused",
    'cumprod':
        "a formula inside the op (composite or backward) makes a plain tensor and mixes it with distributed tensors in a later sample of op_db (the full sweep's samples beyond the first three); plain tensors that are not scalars are refused",
    'quantile':
        "a formula inside the op (composite or backward) makes a plain tensor and mixes it with distributed tensors in a later sample of op_db (the full sweep's samples beyond the first three); plain tensors that are not scalars are refused",
    '__getitem__':
        "a formula inside the op (composite or backward) makes a plain tensor and mixes it with distributed tensors in a later sample of op_db (the full sweep's samples beyond the first three); plain tensors that are not scalars are refused",
    'prod':
        "a formula inside the op (composite or backward) makes a plain tensor and mixes it with distributed tensors in a later sample of op_db (the full sweep's samples beyond the first three); plain tensors that are not scalars are refused",
    'linalg.matrix_power':
        "a formula inside the op (composite or backward) makes a plain tensor and mixes it with distributed tensors in a later sample of op_db (the full sweep's samples beyond the first three); plain tensors that are not scalars are refused",
    'masked.mean':
        "a formula inside the op (composite or backward) makes a plain tensor and mixes it with distributed tensors in a later sample of op_db (the full sweep's samples beyond the first three); plain tensors that are not scalars are refused",
    'masked.var':
        "a formula inside the op (composite or backward) makes a plain tensor and mixes it with distributed tensors in a later sample of op_db (the full sweep's samples beyond the first three); plain tensors that are not scalars are refused",
    'masked.std':
        "a formula inside the op (composite or backward) makes a plain tensor and mixes it with distributed tensors in a later sample of op_db (the full sweep's samples beyond the first three); plain tensors that are not scalars are refused",
    'nn.functional.embedding_bag':
        "a formula inside the op (composite or backward) makes a plain tensor and mixes it with distributed tensors in a later sample of op_db (the full sweep's samples beyond the first three); plain tensors that are not scalars are refused",
    'aminmax':
        "a later sample gives the rule an input (0-dim or size-1 dims) for which the rule's output shape or dtype differs from ATen's; the dispatcher's check catches it before any result is returned (a clear error, not a wrong answer); the rule is to be fixed",
    'new_empty_strided':
        "a later sample gives the rule an input (0-dim or size-1 dims) for which the rule's output shape or dtype differs from ATen's; the dispatcher's check catches it before any result is returned (a clear error, not a wrong answer); the rule is to be fixed",
    'nn.functional.interpolate.nearest':
        "a later sample gives the rule an input (0-dim or size-1 dims) for which the rule's output shape or dtype differs from ATen's; the dispatcher's check catches it before any result is returned (a clear error, not a wrong answer); the rule is to be fixed",
    'nn.functional.interpolate.linear':
        "a later sample gives the rule an input (0-dim or size-1 dims) for which the rule's output shape or dtype differs from ATen's; the dispatcher's check catches it before any result is returned (a clear error, not a wrong answer); the rule is to be fixed",
    'nn.functional.interpolate.bilinear':
        "a later sample gives the rule an input (0-dim or size-1 dims) for which the rule's output shape or dtype differs from ATen's; the dispatcher's check catches it before any result is returned (a clear error, not a wrong answer); the rule is to be fixed",
    'nn.functional.interpolate.bicubic':
        "a later sample gives the rule an input (0-dim or size-1 dims) for which the rule's output shape or dtype differs from ATen's; the dispatcher's check catches it before any result is returned (a clear error, not a wrong answer); the rule is to be fixed",
    'nn.functional.interpolate.trilinear':
        "a later sample gives the rule an input (0-dim or size-1 dims) for which the rule's output shape or dtype differs from ATen's; the dispatcher's check catches it before any result is returned (a clear error, not a wrong answer); the rule is to be fixed",
    'nn.functional.upsample_bilinear':
        "a later sample gives the rule an input (0-dim or size-1 dims) for which the rule's output shape or dtype differs from ATen's; the dispatcher's check catches it before any result is returned (a clear error, not a wrong answer); the rule is to be fixed",
    'nn.functional.upsample_nearest':
        "a later sample gives the rule an input (0-dim or size-1 dims) for which the rule's output shape or dtype differs from ATen's; the dispatcher's check catches it before any result is returned (a clear error, not a wrong answer); the rule is to be fixed",
    'native_layer_norm':
        "ATen's meta run of the op (NOTE [output metadata from ATen]) reads a value (_local_scalar_dense) for this sample, which meta tensors cannot give",
    'nn.functional.layer_norm':
        "ATen's meta run of the op (NOTE [output metadata from ATen]) reads a value (_local_scalar_dense) for this sample, which meta tensors cannot give",
    'fft.hfft2':
        "a lazily conjugated local piece reaches view_as_real inside the op: the distributed tensor does not carry its local piece's conjugate bit, so the composite does not resolve it first (NOTE [lazy conjugate and negative views])",
    'fft.hfftn':
        "a lazily conjugated local piece reaches view_as_real inside the op: the distributed tensor does not carry its local piece's conjugate bit, so the composite does not resolve it first (NOTE [lazy conjugate and negative views])",
}
