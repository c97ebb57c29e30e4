"""Every kernel signature compiles to sm_90 PTX and assembles without spilling registers."""

from __future__ import annotations

import pytest

from kvsched.kernels import ptx

SAMPLE = """ptxas info    : Compiling entry function 'kernel' for 'sm_90'
ptxas info    : Function properties for kernel
    24 bytes stack frame, 16 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers
"""


@pytest.fixture(scope="module")
def reports() -> list[ptx.KernelReport]:
    return ptx.report()


def test_every_kernel_and_cache_dtype_is_compiled(reports: list[ptx.KernelReport]) -> None:
    compiled = {(r.kernel, r.cache_dtype) for r in reports}
    kernels = {"paged_attention_kernel", "append_kv_kernel", "copy_pages_kernel", "copy_tier_kernel"}
    assert compiled == {(kernel, dtype) for kernel in kernels for dtype in ("float16", "float32")}


def test_no_kernel_spills(reports: list[ptx.KernelReport]) -> None:
    spilled = [r for r in reports if r.spill_stores or r.spill_loads]
    assert not spilled, "register spills:\n" + ptx.format_table(spilled)


def test_attention_fits_its_occupancy_budget(reports: list[ptx.KernelReport]) -> None:
    """The launch bounds promise MIN_BLOCKS_PER_SM resident blocks: registers and shared memory
    of that many blocks must fit one SM (64 Ki registers, 228 KiB shared on sm_90)."""
    from kvsched.kernels.cuda_attention import MIN_BLOCKS_PER_SM, THREADS

    for r in reports:
        if r.kernel == "paged_attention_kernel":
            assert r.registers * THREADS * MIN_BLOCKS_PER_SM <= 65536, ptx.format_table([r])
            assert (r.shared_bytes + 1024) * MIN_BLOCKS_PER_SM <= 228 * 1024, ptx.format_table([r])
            assert r.stack_frame == 0, "local arrays left in local memory:\n" + ptx.format_table([r])


def test_ptxas_output_parsing_reports_spills() -> None:
    assert ptx.parse_ptxas(SAMPLE) == (255, 16, 12, 24)
    with pytest.raises(ValueError, match="unrecognised ptxas output"):
        ptx.parse_ptxas("ptxas fatal: something else")


def test_shared_memory_is_summed_from_the_ptx() -> None:
    text = ".visible .shared .align 4 .b8 _cudapy_smem_1[4096];\n.visible .shared .align 8 .b8 x[96];\n"
    assert ptx.shared_bytes(text) == 4192
