"""Every public name resolves, and the core stays free of torch."""

import subprocess
import sys

import pytest

import lengthwise
import lengthwise.demo
import lengthwise.train


@pytest.mark.parametrize("package", [lengthwise, lengthwise.train, lengthwise.demo])
def test_every_export_resolves(package):
    for name in package._EXPORTS:
        assert getattr(package, name) is not None, name
    assert set(package._EXPORTS) <= set(dir(package))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        package.nope  # noqa: B018


def test_core_plans_without_importing_torch():
    code = ("import sys, lengthwise; "
            "lengthwise.plan_epoch([3, 1, 2], lengthwise.PlanConfig(batch_size=2)); "
            "lengthwise.optimal_edges([3, 1, 2], 2); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_top_level_holds_every_public_name_of_the_library_packages():
    """README: every public name of planning, pytorch, hf and train is one of lengthwise's."""
    import importlib

    for name in ("planning", "pytorch", "hf", "train"):
        package = importlib.import_module(f"lengthwise.{name}")
        missing = set(package.__all__) - set(lengthwise.__all__)
        assert not missing, (name, sorted(missing))
        for export in package.__all__:
            assert getattr(lengthwise, export) is getattr(package, export), export


def test_calibrate_is_the_function_whatever_was_imported_first():
    code = ("import lengthwise.pytorch.calibrate, lengthwise; "
            "from lengthwise.pytorch import calibrate; "
            "print(callable(calibrate), lengthwise.calibrate is calibrate)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True"]


def test_the_calibrate_module_has_one_path_and_the_top_level_name_is_the_function():
    code = ("import importlib, lengthwise\n"
            "try:\n    importlib.import_module('lengthwise.calibrate')\n"
            "except ModuleNotFoundError as exc:\n    print(exc)\n"
            "print(callable(lengthwise.calibrate))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["No module named 'lengthwise.calibrate'", "True"]
