"""Context parallelism: refused on CPU with torch's reason and the fix; allowed on CUDA meshes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from accelerando.backends.strategies.context_parallel import (
    check_context_parallel_device,
    context_parallel_context,
)


def test_cp_on_cpu_is_refused_with_reason_and_fix():
    with pytest.raises(ValueError) as info:
        check_context_parallel_device(2, "cpu")
    message = str(info.value)
    assert "cp_size=2" in message
    assert "_scaled_dot_product_flash_attention_for_cpu has no sharding strategy" in message
    assert "Fix: run on CUDA GPUs, or use cp_size=1" in message


def test_cp_size_one_and_cuda_pass_the_check():
    check_context_parallel_device(1, "cpu")
    check_context_parallel_device(4, "cuda")


class _Mesh(SimpleNamespace):
    def __getitem__(self, name: str) -> _Mesh:
        return _Mesh(mesh_dim_names=(name,), device_type=self.device_type, cp=self.cp)

    def size(self) -> int:
        return self.cp


def test_context_manager_refuses_a_cpu_mesh_before_touching_buffers():
    mesh = _Mesh(mesh_dim_names=("dp_shard", "cp"), device_type="cpu", cp=2)
    with pytest.raises(ValueError, match="context parallelism on 'cpu'"):
        with context_parallel_context(mesh, buffers=[], buffer_seq_dims=[]):
            pass


def test_context_manager_needs_a_cp_axis():
    with pytest.raises(ValueError, match="'cp' axis"):
        with context_parallel_context(_Mesh(mesh_dim_names=("tp",), device_type="cuda", cp=2)):
            pass
