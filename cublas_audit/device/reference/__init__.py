"""The bundled reference FP32 SGEMM (reference_kernels/*.cu): its configuration (`config`, pure),
its build and launch on the GPU (`build`), and its comparison with cuBLAS and tuning (`bench`)."""
