"""One run on a GPU machine: build (CUDA+NCCL, and CPU for reference), GPU tests, logits checks and the
bench matrix side by side with upstream's llama-bench. Logs and JSON go to OUT; a short table last
(scripts/gpu-summary).

    scripts/gpu-check                                   # the default stages
    scripts/gpu-check --stages build,tests              # or GPU_CHECK_STAGES=build,tests scripts/gpu-check
    scripts/gpu-check --model qwen3-8b --reps 5         # or GPU_CHECK_MODEL=qwen3-8b GPU_CHECK_REPS=5 ...
    scripts/gpu-check --stages build,arbench,tpbench --tp-runs "nccl ce ce_c512k ce_best" --tp-ubatch 256,512
    scripts/gpu-check --list-stages                     # what each stage does; * marks the default ones
    scripts/gpu-check --dry-run                         # the commands, printed, none run

Every flag has an environment variable (GPU_CHECK_*, shown in --help) as its default, so command lines of
the form `GPU_CHECK_STAGES=... GPU_CHECK_MIXED_CONFIGS="..." scripts/gpu-check` work as well; a variable set
to the empty string counts as unset. A flag whose value starts with '-' takes it after '='
(`--ar-args=--ce-sweep`). The stages run in a fixed order, whatever order --stages names them in.

Every process gets NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1: nothing
uses NVLink multicast on these shared machines. Exit status 1 when any step failed (a build, a probe,
smoke, a test set, a benchmark process, memcheck, a logits dump or the summary), 2 on a usage error.
"""
