"""llama-bench for pyllama_so: `python -m pyllama_so.bench` (see __main__.py)."""

from pyllama_so.bench.runner import BenchParams, TestResult, run_benchmarks

__all__ = ["BenchParams", "TestResult", "run_benchmarks"]
