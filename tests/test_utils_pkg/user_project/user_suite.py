# A test module in the style of a project tested with the reference library's helpers.
# It is not collected by accelerando's suite (its name does not start with test_): test_user_project.py
# copies it, switches the package name, and runs it with pytest in a subprocess.
import os
import unittest
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.test_utils import (
    RegressionModel,
    execute_subprocess_async,
    get_launch_command,
    path_in_accelerate_package,
    require_cpu,
    require_cuda,
    require_multi_gpu,
    slow,
    torch_device,
)
from accelerate.test_utils.testing import (
    AccelerateTestCase,
    TempDirTestCase,
    assert_exception,
    capture_call_output,
    require_non_cpu,
)

SCRIPT = Path(__file__).with_name("distributed_script.py")


class PackageTests(AccelerateTestCase):
    def test_bundled_test_script_is_shipped(self):
        self.assertTrue(path_in_accelerate_package("test_utils", "scripts", "test_script.py").is_file())

    @require_cpu
    def test_single_process_accelerator(self):
        accelerator = Accelerator(cpu=True)
        self.assertEqual(accelerator.num_processes, 1)
        self.assertEqual(torch_device, "cpu")
        model = accelerator.prepare(RegressionModel(a=1, b=2))
        self.assertEqual(model(torch.tensor([1.0])).item(), 3.0)

    def test_helpers(self):
        with assert_exception(ValueError, "mixed"):
            raise ValueError("mixed precision is wrong")
        self.assertEqual(capture_call_output(print, "hello"), "hello\n")

    @require_cuda
    def test_cuda_only(self):
        self.fail("a CUDA test ran on a machine without CUDA")

    @require_multi_gpu
    def test_multi_gpu_only(self):
        self.fail("a multi-GPU test ran on a machine without GPUs")

    @require_non_cpu
    def test_accelerator_only(self):
        self.fail("an accelerator test ran on a CPU machine")

    @slow
    def test_slow_only(self):
        self.fail("a slow test ran without RUN_SLOW")


class LaunchTests(TempDirTestCase):
    def test_two_process_launch(self):
        cmd = get_launch_command(num_processes=2, monitor_interval=0.1) + [str(SCRIPT)]
        result = execute_subprocess_async(cmd, env=os.environ.copy())
        output = "\n".join(result.stdout)
        for rank in (0, 1):
            self.assertIn(f"USER SCRIPT OK rank {rank}", output)

    def test_failing_launch_reports_the_error(self):
        broken = self.tmpdir / "broken.py"
        broken.write_text("raise SystemExit('user script is broken')\n")
        with assert_exception(RuntimeError, "user script is broken"):
            execute_subprocess_async(
                [*get_launch_command(num_processes=1), str(broken)], env=os.environ.copy()
            )


if __name__ == "__main__":
    unittest.main()
