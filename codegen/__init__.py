"""derivc codegen: lowering to kernel plans, jinja2 CUDA templates, NVRTC, runtime, benchmarks."""
