"""Test-only harness that runs the real Megatron-Core / Megatron-Bridge code paths on CPU (never imported by the
package). See docs/megatron_cpu.md for what each shim and stub exists for."""
